// The AVX-512 kernels called directly, against double-precision references: built on SIMDe
// (namespace avx512_simde, any CPU) and, where the CPU has AVX-512, natively (avx512). Sizes
// cover every tail: columns below, at and past whole registers, steps and groups.
#include <omp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cpu/avx512/avx512.h"
#include "cpu/scalar.h"
#include "kv_cache.h"
// The SIMDe build's declarations: its files were compiled with avx512 defined so.
#define avx512 avx512_simde
#include "cpu/avx512/avx512.h"
#undef avx512
#include "test_block_matrices.h"
#include "test_matrices.h"

using namespace barellm;
using namespace barellm::test;

namespace {

// The kernels under test, each a function of both builds.
#define AVX512_KERNELS(X)        \
    X(matvec_rows)               \
    X(matvec_rows_half_x)        \
    X(matvec_rows_bf16_x)        \
    X(round_to_bf16)             \
    X(round_to_half)             \
    X(matvec_rows_q8)            \
    X(matvec_rows_q4)            \
    X(swiglu)                    \
    X(geglu)                     \
    X(swiglu_oai)                \
    X(rmsnorm)                   \
    X(dot_kv)                    \
    X(add_scaled_kv)             \
    X(softmax)                   \
    X(attention_scratch_floats)  \
    X(attention_rows)            \
    X(quantize_token)            \
    X(quantize_q8)               \
    X(quantize_q8_k)             \
    X(matvec_rows_super_blocks)  \
    X(matvec_rows_iq)            \
    X(matvec_rows_lookup_blocks) \
    X(matvec_rows_block_tiles)   \
    X(gemm_rows_quantized)       \
    X(gemm_rows_blocks)          \
    X(gemm_rows)                 \
    X(pack_token_pair_tile)      \
    X(gemm_rows_bf16)

// One build of the AVX-512 kernels.
struct Avx512Build {
    std::string name;
    bool has_vnni;  // whether its Q8/Q4 kernels can run here
    bool has_bf16;  // whether its bf16 GEMM can run here
#define AVX512_MEMBER(kernel) decltype(&cpu::avx512::kernel) kernel;
    AVX512_KERNELS(AVX512_MEMBER)
};

// The SIMDe build where it was built (BARELLM_SIMDE_AVX512, the Makefile's choice: on every
// CPU without all of AVX-512's features, and under SAN=1) and the native one where this CPU
// has AVX-512 (printed once).
std::vector<Avx512Build> builds() {
#define AVX512_SIMDE(kernel) cpu::avx512_simde::kernel,
#define AVX512_NATIVE(kernel) cpu::avx512::kernel,
    std::vector<Avx512Build> list;
#if BARELLM_SIMDE_AVX512
    list.push_back({"simde", true, true, AVX512_KERNELS(AVX512_SIMDE)});
#endif
    const bool native = cpu::detect_simd_level() == cpu::SimdLevel::Avx512;
    static bool said = false;
    if (!said) {
        const std::string features = std::string(cpu::cpu_has_avx512_vnni() ? " +vnni" : "") +
                                     (cpu::cpu_has_avx512_bf16() ? " +bf16" : "");
        const std::string native_build = "native (avx512" + features + ")";
        std::printf("AVX-512 kernel tests: %s\n",
                    !native        ? "SIMDe build only (this CPU has no AVX-512)"
                    : list.empty() ? (native_build + "; the SIMDe build runs under SAN=1").c_str()
                                   : ("SIMDe build and " + native_build).c_str());
        said = true;
    }
    if (native)
        list.push_back({"native", cpu::cpu_has_avx512_vnni(), cpu::cpu_has_avx512_bf16(),
                        AVX512_KERNELS(AVX512_NATIVE)});
    // A build made where the CPU had AVX-512, run where it has not.
    if (list.empty())
        FAIL(
            "no build of the AVX-512 kernels runs here: this CPU has no AVX-512 and the SIMDe "
            "build was left out (make SIMDE_AVX512=1)");
    return list;
}

std::vector<double> reference_matvec(const TestMatrix& m, const std::vector<float>& x) {
    std::vector<double> want(m.matrix.rows);
    for (int r = 0; r < m.matrix.rows; ++r)
        for (int c = 0; c < m.matrix.cols; ++c)
            want[r] += double(m.values[size_t(r) * m.matrix.cols + c]) * x[c];
    return want;
}

// x [batch, cols] as the f32/f16 GEMM reads it: tiles[tile][c][t] = x[tile · 16 + t][c],
// zero past the last token.
std::vector<float> token_tiles(const std::vector<float>& x, int batch, int cols) {
    const int tile_tokens = cpu::avx512::kGemmTokenTile;
    const int tiles = (batch + tile_tokens - 1) / tile_tokens;
    std::vector<float> tiles_data(size_t(tiles) * cols * tile_tokens);
    for (int b = 0; b < batch; ++b)
        for (int c = 0; c < cols; ++c)
            tiles_data[(size_t(b / tile_tokens) * cols + c) * tile_tokens + b % tile_tokens] =
                x[size_t(b) * cols + c];
    return tiles_data;
}

// Each token's rows [first, first + count) of out [batch, rows], one after another.
template <typename Value>
std::vector<Value> gemm_rows(const std::vector<Value>& out, int rows, int first, int count) {
    std::vector<Value> picked;
    for (size_t b = 0; b < out.size() / rows; ++b)
        picked.insert(picked.end(), out.begin() + b * rows + first,
                      out.begin() + b * rows + first + count);
    return picked;
}

// Whether out [batch, rows] is NaN (never written) outside rows [first, first + count).
bool untouched_outside(const std::vector<float>& out, int rows, int first, int count) {
    for (size_t i = 0; i < out.size(); ++i) {
        const int r = int(i % rows);
        if ((r < first || r >= first + count) && !std::isnan(out[i])) return false;
    }
    return true;
}

}  // namespace

TEST_CASE("AVX-512 f32/f16/bf16 matvecs match a double-precision reference at every tail") {
    std::mt19937 rng(512);
    const auto dtype = GENERATE(DType::F32, DType::F16, DType::BF16);
    for (const Avx512Build& build : builds())
        for (int cols : {1, 7, 15, 16, 17, 31, 33, 64, 65, 100, 128, 129, 200, 257}) {
            const int rows = 9;
            const TestMatrix m = make_matrix(rows, cols, dtype, rng);
            const std::vector<float> x = random_floats(cols, rng);
            const std::vector<double> want = reference_matvec(m, x);
            // A run of rows not starting at row 0, as a thread's share is.
            const int first = 2, count = 6;
            std::vector<float> got(rows, NAN);
            build.matvec_rows(got.data(), m.matrix, x.data(), first, count);
            INFO(build.name << " " << dtype_name(dtype) << " cols " << cols);
            CHECK(relative_error(row_range(got, first, count), row_range(want, first, count)) <
                  1e-6);
            CHECK(std::isnan(got[first - 1]));
            CHECK(std::isnan(got[first + count]));
        }
}

TEST_CASE("AVX-512 f16/bf16 matvecs against x rounded to f16 match their reference") {
    std::mt19937 rng(514);
    const auto dtype = GENERATE(DType::F16, DType::BF16);
    for (const Avx512Build& build : builds())
        for (int cols : {1, 15, 16, 17, 33, 100, 129, 257, 5632 + 9}) {
            const int rows = 5;
            const TestMatrix m = make_matrix(rows, cols, dtype, rng);
            const std::vector<float> x = random_floats(cols, rng, 3.0f);
            std::vector<uint16_t> half_x(cols + 1, 0xabcd);
            REQUIRE(build.round_to_half(half_x.data(), x.data(), cols));
            CHECK(half_x[cols] == 0xabcd);  // nothing written past n
            std::vector<float> x_rounded(cols);
            for (int c = 0; c < cols; ++c) {
                INFO(build.name << " column " << c);
                REQUIRE(half_x[c] == float_to_half(x[c]));
                x_rounded[c] = half_to_float(half_x[c]);
            }
            const std::vector<double> want = reference_matvec(m, x_rounded);
            std::vector<float> got(rows, NAN);
            build.matvec_rows_half_x(got.data(), m.matrix, half_x.data(), 1, rows - 1);
            INFO(build.name << " " << dtype_name(dtype) << " cols " << cols);
            CHECK(relative_error(row_range(got, 1, rows - 1), row_range(want, 1, rows - 1)) < 1e-6);
            CHECK(std::isnan(got[0]));
        }
}

TEST_CASE("AVX512_BF16 matvec against x rounded to bf16 matches its reference at every tail") {
    std::mt19937 rng(516);
    for (const Avx512Build& build : builds()) {
        if (!build.has_bf16) continue;
        for (int cols : {1, 15, 31, 32, 33, 63, 64, 65, 100, 129, 257, 5632 + 9}) {
            const int rows = 5;
            const TestMatrix m = make_matrix(rows, cols, DType::BF16, rng);
            const std::vector<float> x = random_floats(cols, rng, 3.0f);
            std::vector<uint16_t> bf16_x(cols + 1, 0xabcd);
            build.round_to_bf16(bf16_x.data(), x.data(), cols);
            CHECK(bf16_x[cols] == 0xabcd);  // nothing written past n
            const std::vector<float> want_x = rounded_to_bf16(x);
            for (int c = 0; c < cols; ++c) {
                INFO(build.name << " column " << c);
                REQUIRE(bf16_to_float(bf16_x[c]) == want_x[c]);
            }
            const std::vector<double> want = reference_matvec(m, want_x);
            std::vector<float> got(rows, NAN);
            build.matvec_rows_bf16_x(got.data(), m.matrix, bf16_x.data(), 1, rows - 1);
            INFO(build.name << " cols " << cols);
            CHECK(relative_error(row_range(got, 1, rows - 1), row_range(want, 1, rows - 1)) < 1e-6);
            CHECK(std::isnan(got[0]));
        }
    }
}

TEST_CASE("AVX-512 rounding of x to f16 refuses values f16 cannot hold") {
    for (const Avx512Build& build : builds())
        for (float bad : {65520.0f, -1e6f, INFINITY, NAN}) {
            std::vector<float> x(37, 1.5f);
            x[33] = bad;
            std::vector<uint16_t> half_x(37);
            INFO(build.name << " " << bad);
            CHECK_FALSE(build.round_to_half(half_x.data(), x.data(), 37));
            x[33] = 65504.0f;  // the largest f16
            CHECK(build.round_to_half(half_x.data(), x.data(), 37));
        }
}

TEST_CASE("AVX-512 VNNI Q8 and Q4 matvecs equal the integer dot products of quantized x") {
    std::mt19937 rng(513);
    const auto dtype = GENERATE(DType::Q8_0, DType::Q4_0);
    for (const Avx512Build& build : builds())
        if (build.has_vnni)
            check_tile_matvec(dtype,
                              dtype == DType::Q8_0 ? build.matvec_rows_q8 : build.matvec_rows_q4,
                              build.name, rng);
}

TEST_CASE("AVX-512 geglu matches its formula in double, far into both tails") {
    std::mt19937 rng(516);
    for (const Avx512Build& build : builds())
        for (int n : {1, 15, 16, 17, 172})
            for (float scale : {0.5f, 3.0f, 120.0f}) {
                const std::vector<float> gate_in = random_floats(n, rng, scale);
                const std::vector<float> up = random_floats(n, rng);
                std::vector<float> gate = gate_in;
                gate.push_back(NAN);  // past the end: must stay untouched
                build.geglu(gate.data(), up.data(), n);
                INFO(build.name << " n " << n << " scale " << scale);
                for (int i = 0; i < n; ++i) {
                    // gelu_tanh(g) · up in double; the bound as test_cpu_kernels.cpp's:
                    // relative, and relative to g · up where tanh's argument rounds.
                    const double g = gate_in[i];
                    const double want =
                        0.5 * g *
                        (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g))) * up[i];
                    CHECK(std::abs(gate[i] - want) <=
                          2e-6 * std::abs(want) + 1e-7 * std::abs(g * up[i]));
                }
                CHECK(std::isnan(gate[n]));
            }
}

TEST_CASE("AVX-512 swiglu matches its formula, far into both tails") {
    std::mt19937 rng(515);
    for (const Avx512Build& build : builds())
        for (int n : {1, 15, 16, 17, 172})
            for (float scale : {3.0f, 120.0f}) {
                const std::vector<float> gate_in = random_floats(n, rng, scale);
                const std::vector<float> up = random_floats(n, rng);
                std::vector<float> gate = gate_in;
                gate.push_back(NAN);  // past the end: must stay untouched
                build.swiglu(gate.data(), up.data(), n);
                INFO(build.name << " n " << n << " scale " << scale);
                for (int i = 0; i < n; ++i) {
                    const double want = gate_in[i] / (1 + std::exp(-double(gate_in[i]))) * up[i];
                    CHECK(std::abs(gate[i] - want) <= 1e-6 * std::abs(want) + 1e-30);
                }
                CHECK(std::isnan(gate[n]));
            }
}

TEST_CASE("AVX-512 swiglu_oai matches its formula, the clamps included") {
    std::mt19937 rng(520);
    const float limit = 7.0f;
    for (const Avx512Build& build : builds())
        for (int n : {1, 15, 16, 17, 172})
            for (float scale : {3.0f, 12.0f}) {
                const std::vector<float> gate_in = random_floats(n, rng, scale);
                const std::vector<float> up = random_floats(n, rng, scale);
                std::vector<float> gate = gate_in;
                gate.push_back(NAN);  // past the end: must stay untouched
                build.swiglu_oai(gate.data(), up.data(), n, limit);
                INFO(build.name << " n " << n << " scale " << scale);
                for (int i = 0; i < n; ++i) {
                    const double g = std::min(double(gate_in[i]), double(limit));
                    const double u = std::clamp(double(up[i]), -double(limit), double(limit));
                    const double want = g / (1 + std::exp(-1.702 * g)) * (u + 1);
                    CHECK(std::abs(gate[i] - want) <= 2e-6 * std::abs(want) + 1e-6 * std::abs(g));
                }
                CHECK(std::isnan(gate[n]));
            }
}

TEST_CASE("AVX-512 rmsnorm matches its formula in double, every tail") {
    std::mt19937 rng(519);
    for (const Avx512Build& build : builds())
        for (int n : {1, 7, 8, 9, 16, 17, 31, 33, 64, 100, 2048, 2051}) {
            const std::vector<float> x = random_floats(n, rng, 3.0f);
            const std::vector<float> weight = random_floats(n, rng);
            const float eps = 1e-5f;
            std::vector<float> out(n + 1, NAN);  // out[n], past the end: must stay untouched
            build.rmsnorm(out.data(), x.data(), weight.data(), n, eps);
            double sum_of_squares = 0;
            for (float v : x) sum_of_squares += double(v) * v;
            const double scale = 1 / std::sqrt(sum_of_squares / n + eps);
            INFO(build.name << " n " << n);
            for (int i = 0; i < n; ++i) {
                const double want = x[i] * scale * weight[i];
                CHECK(std::abs(out[i] - want) <= 1e-6 * std::abs(want) + 1e-30);
            }
            CHECK(std::isnan(out[n]));
        }
}

TEST_CASE("AVX-512 rmsnorm gives the scalar rmsnorm's bits, its squares summed in lanes") {
    // Values spread over twelve orders of magnitude, so that summing the squares in lanes
    // rounds differently from summing them in order; and squares whose mean is exactly halfway
    // between two f32 values, 1 and 1 + 2^-23, where the lanes' sum is not taken.
    std::mt19937 rng(521);
    std::uniform_real_distribution<float> exponent(-6.0f, 6.0f);
    for (const Avx512Build& build : builds())
        for (int n : {1, 2, 15, 17, 64, 100, 2048, 2051, 5632}) {
            for (int trial = 0; trial < 20; ++trial) {
                std::vector<float> x = random_floats(n, rng);
                if (trial % 2)
                    for (float& v : x) v *= std::pow(10.0f, exponent(rng));
                // n - 1 ones and one square of 1 + n · 2^-24: Σ x² = n · (1 + 2^-24), exactly
                // (where f32 holds that square).
                const float square = 1.0f + 0x1p-24f * n;
                const float root = std::sqrt(square);
                if (trial == 2 && root * root == square && square == 1.0 + 0x1p-24 * n) {
                    std::fill(x.begin(), x.end(), 1.0f);
                    x[0] = root;
                }
                const std::vector<float> weight = random_floats(n, rng);
                std::vector<float> want(n), got(n);
                cpu::scalar::rmsnorm(want.data(), x.data(), weight.data(), n, 1e-5f);
                build.rmsnorm(got.data(), x.data(), weight.data(), n, 1e-5f);
                INFO(build.name << " n " << n << " trial " << trial);
                CHECK(std::memcmp(got.data(), want.data(), sizeof(float) * n) == 0);
            }
        }
}

TEST_CASE("AVX-512 rmsnorm of values whose squares overflow f32 is their true norm") {
    // |x| up to 3e38: x² overflows f32 (the sums would be Inf, every output 0), not double.
    std::mt19937 rng(520);
    for (const Avx512Build& build : builds())
        for (int n : {1, 17, 64, 2051}) {
            std::vector<float> x = random_floats(n, rng);
            for (float& v : x) v *= 3e38f;
            const std::vector<float> weight = random_floats(n, rng);
            std::vector<float> out(n);
            build.rmsnorm(out.data(), x.data(), weight.data(), n, 1e-5f);
            double sum_of_squares = 0;
            for (float v : x) sum_of_squares += double(v) * v;
            const double scale = 1 / std::sqrt(sum_of_squares / n);
            INFO(build.name << " n " << n);
            for (int i = 0; i < n; ++i) {
                const double want = x[i] * scale * weight[i];
                CHECK(std::abs(out[i] - want) <= 1e-5 * std::abs(want) + 1e-30);
            }
        }
}

TEST_CASE("AVX-512 decode attention rows: q · key and out += scale · value, f32 and f16") {
    std::mt19937 rng(516);
    const auto type = GENERATE(KvType::F32, KvType::F16);
    for (const Avx512Build& build : builds())
        for (int n : {1, 7, 16, 17, 64, 100, 128, 129}) {
            const std::vector<float> q = random_floats(n, rng), out_in = random_floats(n, rng);
            std::vector<float> row = random_floats(n, rng);
            std::vector<uint16_t> halves(n);
            for (int i = 0; i < n; ++i) {
                halves[i] = float_to_half(row[i]);
                if (type == KvType::F16) row[i] = half_to_float(halves[i]);
            }
            const void* cache_row =
                type == KvType::F32 ? static_cast<const void*>(row.data()) : halves.data();
            double want_dot = 0;
            for (int i = 0; i < n; ++i) want_dot += double(q[i]) * row[i];
            INFO(build.name << " n " << n << (type == KvType::F32 ? " f32" : " f16"));
            CHECK(std::abs(build.dot_kv(q.data(), cache_row, n, type) - want_dot) <=
                  1e-5 * (std::abs(want_dot) + 1));
            const float scale = 0.375f;
            std::vector<float> out = out_in;
            out.push_back(NAN);  // past the end: must stay untouched
            build.add_scaled_kv(out.data(), scale, cache_row, n, type);
            for (int i = 0; i < n; ++i)
                CHECK(std::abs(out[i] - (out_in[i] + double(scale) * row[i])) <= 1e-6);
            CHECK(std::isnan(out[n]));
        }
}

TEST_CASE("AVX-512 softmax matches its formula in double, every tail, with and without a sink") {
    std::mt19937 rng(517);
    for (const Avx512Build& build : builds())
        for (int n : {1, 2, 15, 16, 17, 33, 300})
            for (float scale : {1.0f, 40.0f})
                for (float sink : {-INFINITY, 0.5f * scale}) {
                    const std::vector<float> in = random_floats(n, rng, scale);
                    std::vector<float> x = in;
                    x.push_back(NAN);  // past the end: must stay untouched
                    build.softmax(x.data(), n, sink);
                    const double largest =
                        std::max<double>(sink, *std::max_element(in.begin(), in.end()));
                    double sum = std::exp(double(sink) - largest);
                    for (float v : in) sum += std::exp(double(v) - largest);
                    INFO(build.name << " n " << n << " scale " << scale << " sink " << sink);
                    for (int i = 0; i < n; ++i)
                        CHECK(std::abs(x[i] - std::exp(double(in[i]) - largest) / sum) <= 1e-6);
                    CHECK(std::isnan(x[n]));
                }
}

namespace {

// The KvTiles layout of the cache rows [first_key, first_key + keys) of one KV head:
// keys transposed into tiles of 16 keys, values cut into tiles of 16 columns, zero-padded.
struct TestKvTiles {
    std::vector<float> storage;
    cpu::avx2::KvTiles tiles;
};
TestKvTiles pack_kv_tiles(const std::vector<float>& keys, const std::vector<float>& values,
                          int kv_dim, int kv_head, int head_dim, int first_key, int key_count) {
    const int tile = 16, column_tiles = (head_dim + tile - 1) / tile;
    TestKvTiles t;
    t.tiles.first_key = first_key;
    t.tiles.keys = key_count;
    t.tiles.padded_keys = (key_count + tile - 1) / tile * tile;
    const size_t key_floats = size_t(t.tiles.padded_keys) * head_dim;
    t.storage.assign(key_floats + size_t(column_tiles) * t.tiles.padded_keys * tile + tile, 0.0f);
    float* base = cpu::avx512::align64(t.storage.data());
    t.tiles.key_tiles = base;
    t.tiles.value_tiles = base + key_floats;
    for (int k = 0; k < key_count; ++k)
        for (int d = 0; d < head_dim; ++d) {
            const size_t at = size_t(first_key + k) * kv_dim + size_t(kv_head) * head_dim + d;
            t.tiles.key_tiles[(size_t(k / tile) * head_dim + d) * tile + k % tile] = keys[at];
            t.tiles.value_tiles[(size_t(d / tile) * t.tiles.padded_keys + k) * tile + d % tile] =
                values[at];
        }
    return t;
}

}  // namespace

TEST_CASE("AVX-512 prefill attention rows match softmax(q·k/√d)·v in double, sinks or none") {
    std::mt19937 rng(518);
    const int heads = 6, kv_heads = 2, group = heads / kv_heads;
    const float head_sinks[heads] = {-2.0f, 3.0f, 0.25f, 1.5f, -0.5f, 5.0f};  // gpt-oss's
    for (const Avx512Build& build : builds())
        for (int head_dim : {16, 40, 64, 72})
            for (int window : {0, 5, 37})
                for (auto [first_pos, count] : {std::pair{0, 1}, {0, 9}, {3, 40}, {50, 23}}) {
                    const int kv_dim = kv_heads * head_dim, q_dim = heads * head_dim;
                    const int positions = first_pos + count;
                    const auto keys = random_floats(size_t(positions) * kv_dim, rng);
                    const auto values = random_floats(size_t(positions) * kv_dim, rng);
                    const auto q = random_floats(size_t(count) * q_dim, rng, 2.0f);
                    // Not 1/√head_dim: the kernel must take the shape's scale.
                    const float scale = 1.25f / std::sqrt(float(head_dim));
                    // Sinks on half of the head sizes.
                    const float* sinks = head_dim == 40 || head_dim == 72 ? head_sinks : nullptr;
                    const AttentionShape shape{heads, kv_heads, head_dim, window,
                                               scale, 0.0f,     sinks};
                    const int first_key = attention_start(first_pos, window);
                    const int kv_head = 1, rows = count * group;
                    const TestKvTiles packed = pack_kv_tiles(
                        keys, values, kv_dim, kv_head, head_dim, first_key, positions - first_key);
                    std::vector<float> scratch(
                        build.attention_scratch_floats(positions - first_key, head_dim));
                    std::vector<float> out(size_t(count) * q_dim, NAN);
                    for (int first_row = 0; first_row < rows;
                         first_row += cpu::avx512::kAttentionRowTile)
                        build.attention_rows(
                            out.data(), q.data(), first_row,
                            std::min(cpu::avx512::kAttentionRowTile, rows - first_row), first_pos,
                            kv_head, packed.tiles, shape, scratch.data());
                    INFO(build.name << " head_dim " << head_dim << " window " << window
                                    << " first_pos " << first_pos << " count " << count);
                    for (int token = 0; token < count; ++token)
                        for (int head = 0; head < heads; ++head) {
                            const float* got = &out[size_t(token) * q_dim + head * head_dim];
                            if (head / group != kv_head) {  // another KV head's: untouched
                                CHECK(std::isnan(got[0]));
                                continue;
                            }
                            const int pos = first_pos + token;
                            const float* query = &q[size_t(token) * q_dim + head * head_dim];
                            std::vector<double> scores;
                            for (int k = attention_start(pos, window); k <= pos; ++k) {
                                double dot = 0;
                                for (int d = 0; d < head_dim; ++d)
                                    dot += double(query[d]) *
                                           keys[size_t(k) * kv_dim + kv_head * head_dim + d];
                                scores.push_back(dot * scale);
                            }
                            const double sink = sinks ? sinks[head] : -INFINITY;
                            const double largest =
                                std::max(sink, *std::max_element(scores.begin(), scores.end()));
                            double sum = std::exp(sink - largest);
                            for (double& score : scores) sum += score = std::exp(score - largest);
                            for (int d = 0; d < head_dim; ++d) {
                                double want = 0;
                                for (size_t i = 0; i < scores.size(); ++i)
                                    want += scores[i] / sum *
                                            values[(attention_start(pos, window) + i) * kv_dim +
                                                   kv_head * head_dim + d];
                                CHECK(std::abs(got[d] - want) <= 2e-6 * (1 + std::abs(want)));
                            }
                        }
                }
}

TEST_CASE("AVX-512 quantize_token quantizes each token exactly as quantize_q8") {
    std::mt19937 rng(514);
    for (const Avx512Build& build : builds())
        for (int cols : {1, 16, 17, 31, 32, 33, 100, 600}) {
            INFO(build.name << " cols " << cols);
            CHECK(quantize_token_difference(build.quantize_token, cols, rng) == "");
        }
}

TEST_CASE("AVX-512 quantize_q8 equals the scalar quantize_q8 at every tail") {
    std::mt19937 rng(516);
    for (const Avx512Build& build : builds())
        for (int n : {1, 15, 16, 17, 31, 32, 33, 100, 600}) {
            INFO(build.name << " n " << n);
            std::vector<float> x = random_floats(n, rng, 5.0f);
            if (n >= 40) {  // ties after scaling by 1 (a group whose largest is 127), a zero group
                const float halves[] = {127.0f, 2.5f, -2.5f, 0.5f, -0.5f, 0.49999997f, -1.5f};
                std::copy(std::begin(halves), std::end(halves), x.begin() + 32);
                std::fill(x.begin(), x.begin() + 32, 0.0f);
            }
            if (n >= 600) {  // scales below f16's normal numbers and above its largest: f32
                for (int i = 64; i < 96; ++i) x[i] *= 1e-5f;
                for (int i = 96; i < 128; ++i) x[i] *= 1e7f;
            }
            cpu::QuantizedVector want, got;
            cpu::quantize_q8(&want, x.data(), n);
            got.values.assign(n + 64, 99);  // stale contents, longer than n: resized to n
            build.quantize_q8(&got, x.data(), n);
            CHECK(got.values == want.values);
            CHECK(got.scales == want.scales);
            CHECK(got.group_sums == want.group_sums);
            CHECK(got.q4_pair_values == want.q4_pair_values);
        }
}

TEST_CASE("AVX-512 VNNI Q8 and Q4 prefill GEMM matches a reference on quantized x") {
    std::mt19937 rng(515);
    const auto dtype = GENERATE(DType::Q8_0, DType::Q4_0);
    for (const Avx512Build& build : builds()) {
        if (!build.has_vnni) continue;
        // Q8: short last groups; Q4: whole blocks. Rows are not multiples of the 32-row
        // tile, batches not multiples of the 6-token tile; 8, 12 and 13 tokens go through the
        // 16-row kernel on Q4 (one call of 8, one of 12, calls of 7 and 6).
        const std::vector<int> widths = dtype == DType::Q8_0 ? std::vector<int>{5, 33, 100, 600}
                                                             : std::vector<int>{32, 96, 608};
        for (int batch : {1, 3, 8, 12, 13, 17, 70})
            for (int cols : widths) {
                const int rows = 75;
                const TestMatrix m = make_matrix(rows, cols, dtype, rng);
                // Large values: the int8 products then reach their extremes (±127 × 127).
                const std::vector<float> x = random_floats(size_t(batch) * cols, rng, 50.0f);
                const std::vector<double> want =
                    reference_gemm(m, rows_quantized_like_the_kernel(x, cols), batch);
                cpu::QuantizedBatch quantized;
                cpu::resize_quantized_batch(&quantized, batch, cols);
                for (int b = 0; b < batch; ++b)
                    build.quantize_token(&quantized, x.data() + size_t(b) * cols, cols, b);
                // A run of rows not starting at row 0 (a thread's share), over two tiles.
                const int first = 3, count = rows - 5;
                std::vector<float> got(size_t(batch) * rows, NAN);
                build.gemm_rows_quantized(got.data(), m.matrix, quantized, first, count);
                INFO(build.name << " " << dtype_name(dtype) << " batch " << batch << " cols "
                                << cols);
                for (int b = 0; b < batch; ++b) {
                    const size_t row0 = size_t(b) * rows;
                    CHECK(relative_error(row_range(got, int(row0) + first, count),
                                         row_range(want, int(row0) + first, count)) < 1e-6);
                    CHECK(std::isnan(got[row0 + first - 1]));
                    CHECK(std::isnan(got[row0 + first + count]));
                }
            }
    }
}

TEST_CASE("AVX-512 VNNI prefill GEMM of the block types matches a reference on quantized x") {
    std::mt19937 rng(517);
    std::vector<DType> types(std::begin(kBlockTypes), std::end(kBlockTypes));
    types.insert(types.end(), std::begin(kIqGridTypes), std::end(kIqGridTypes));
    types.insert(types.end(), std::begin(kTernaryTypes), std::end(kTernaryTypes));
    for (const DType dtype : types)
        for (const Avx512Build& build : builds()) {
            if (!build.has_vnni) continue;
            // Rows not a multiple of the 32-row tile, batches not of the 6-token tile; one and
            // several blocks a row.
            const int block = block_weights(dtype);
            for (int batch : {1, 7, 13})
                for (int cols : {block, 3 * block}) {
                    const int rows = 37;
                    const TestMatrix m = make_block_matrix(rows, cols, dtype, rng);
                    // Large values: the int8 products reach their extremes (±127 × 255).
                    const std::vector<float> x = random_floats(size_t(batch) * cols, rng, 50.0f);
                    const std::vector<double> want =
                        reference_gemm(m, rows_quantized_like_the_kernel(x, cols), batch);
                    cpu::QuantizedBatch quantized;
                    cpu::resize_quantized_batch(&quantized, batch, cols);
                    for (int b = 0; b < batch; ++b)
                        build.quantize_token(&quantized, x.data() + size_t(b) * cols, cols, b);
                    // A run of rows not starting at row 0 (a thread's share), over two tiles.
                    const int first = 3, count = rows - 5;
                    std::vector<float> got(size_t(batch) * rows, NAN);
                    build.gemm_rows_blocks(got.data(), m.matrix, quantized, first, count);
                    INFO(build.name << " " << matrix_type_name(dtype) << " batch " << batch
                                    << " cols " << cols);
                    // The super-block types from their tiles (those of make_block_matrix) and from
                    // their rows: the same panel, the same bits.
                    if (m.matrix.row_tiles && !cpu::read_from_tiles_only(dtype)) {
                        Matrix rows_only = m.matrix;
                        rows_only.row_tiles = nullptr;
                        std::vector<float> from_rows(size_t(batch) * rows, NAN);
                        build.gemm_rows_blocks(from_rows.data(), rows_only, quantized, first,
                                               count);
                        CHECK(std::memcmp(from_rows.data(), got.data(),
                                          got.size() * sizeof(float)) == 0);
                    }
                    // f32 sums of terms scaled from subnormal to 65504, which cancel in
                    // part: rounding reaches some 1e-5 of the result (a wrong level, scale
                    // or min moves it by far more).
                    for (int b = 0; b < batch; ++b) {
                        const size_t row0 = size_t(b) * rows;
                        CHECK(relative_error(row_range(got, int(row0) + first, count),
                                             row_range(want, int(row0) + first, count)) < 3e-5);
                        CHECK(std::isnan(got[row0 + first - 1]));
                        CHECK(std::isnan(got[row0 + first + count]));
                    }
                }
        }
}

TEST_CASE("AVX-512 VNNI prefill GEMM of several Q8 and Q4 matrices on several threads") {
    if (cpu::detect_simd_level() < cpu::SimdLevel::Avx512 || !cpu::cpu_has_avx512_vnni()) return;
    std::mt19937 rng(516);
    const auto dtype = GENERATE(DType::Q8_0, DType::Q4_0);
    const int threads = GENERATE(2, 3);
    const int saved_threads = omp_get_max_threads();
    omp_set_num_threads(threads);
    cpu::set_simd_level(cpu::SimdLevel::Avx512);
    // Enough rows for every thread; row counts off the 32-row tile, so that the runs the
    // threads claim straddle the boundary between the matrices.
    const int batch = 23, cols = dtype == DType::Q8_0 ? 330 : 320;
    const TestMatrix first = make_matrix(301, cols, dtype, rng);
    const TestMatrix second = make_matrix(45, cols, dtype, rng);
    const std::vector<float> x = random_floats(size_t(batch) * cols, rng);
    std::vector<float> got_first(size_t(batch) * 301, NAN), got_second(size_t(batch) * 45, NAN);
    cpu::gemm_many(x.data(), batch,
                   {{got_first.data(), &first.matrix}, {got_second.data(), &second.matrix}});
    cpu::set_simd_level(cpu::detect_simd_level());
    omp_set_num_threads(saved_threads);
    const std::vector<float> x_quantized = rows_quantized_like_the_kernel(x, cols);
    INFO(dtype_name(dtype) << " " << threads << " threads");
    CHECK(relative_error(got_first, reference_gemm(first, x_quantized, batch)) < 1e-6);
    CHECK(relative_error(got_second, reference_gemm(second, x_quantized, batch)) < 1e-6);
}

// Batches of one, part of one, several and an odd number of 16-token tiles; widths below,
// at and past the 256-column block, odd ones (a lone last bf16 column); row runs not
// starting at row 0, past one 12-row tile and the 96-row block, with short last tiles.
constexpr int kGemmBatches[] = {1, 3, 17, 70};
constexpr std::pair<int, int> kGemmShapes[] = {{5, 1}, {7, 7}, {15, 33}, {29, 256}, {101, 517}};

TEST_CASE("AVX-512 f32/f16/bf16 prefill GEMM matches a double-precision reference at every tail") {
    std::mt19937 rng(514);
    const auto dtype = GENERATE(DType::F32, DType::F16, DType::BF16);
    for (const Avx512Build& build : builds())
        for (int batch : kGemmBatches)
            for (auto [rows, cols] : kGemmShapes) {
                const TestMatrix m = make_matrix(rows, cols, dtype, rng);
                const std::vector<float> x = random_floats(size_t(batch) * cols, rng);
                const std::vector<float> tiles = token_tiles(x, batch, cols);
                const int first = 1, count = rows - 2;
                std::vector<float> got(size_t(batch) * rows, NAN);
                build.gemm_rows(got.data(), m.matrix, tiles.data(), batch, first, count);
                INFO(build.name << " " << dtype_name(dtype) << " batch " << batch << " " << rows
                                << "x" << cols);
                CHECK(relative_error(gemm_rows(got, rows, first, count),
                                     gemm_rows(reference_gemm(m, x, batch), rows, first, count)) <
                      1e-6);
                CHECK(untouched_outside(got, rows, first, count));
            }
}

TEST_CASE("AVX512_BF16 prefill GEMM matches a double-precision reference on x rounded to bf16") {
    std::mt19937 rng(515);
    for (const Avx512Build& build : builds()) {
        if (!build.has_bf16) continue;
        for (int batch : kGemmBatches)
            for (auto [rows, cols] : kGemmShapes) {
                const TestMatrix m = make_matrix(rows, cols, DType::BF16, rng);
                const std::vector<float> x = random_floats(size_t(batch) * cols, rng);
                std::vector<uint32_t> pair_tiles(cpu::avx512::token_pair_tiles_words(batch, cols));
                const int tiles =
                    (batch + cpu::avx512::kGemmTokenTile - 1) / cpu::avx512::kGemmTokenTile;
                for (int tile = 0; tile < tiles; ++tile)
                    build.pack_token_pair_tile(pair_tiles.data(), x.data(), cols, batch, tile);
                const int first = 1, count = rows - 2;
                std::vector<float> got(size_t(batch) * rows, NAN);
                build.gemm_rows_bf16(got.data(), m.matrix, pair_tiles.data(), batch, first, count);
                INFO(build.name << " batch " << batch << " " << rows << "x" << cols);
                CHECK(relative_error(gemm_rows(got, rows, first, count),
                                     gemm_rows(reference_gemm(m, rounded_to_bf16(x), batch), rows,
                                               first, count)) < 1e-6);
                CHECK(untouched_outside(got, rows, first, count));
            }
    }
}

TEST_CASE("AVX-512 quantize_q8_k gives the bytes of llama.cpp's Q8_K rule") {
    std::mt19937 rng(517);
    for (const Avx512Build& build : builds())
        for (int n : {256, 768, 1280}) {
            INFO(build.name << " n " << n);
            const std::vector<float> x = q8_k_test_input(n, rng);
            const Q8K want = q8_k_by_rule(x);
            cpu::Q8KVector got;
            got.values.assign(n + 300, 99);  // stale contents, longer than n: resized to n
            build.quantize_q8_k(&got, x.data(), n);
            CHECK(got.values == want.values);
            CHECK(got.d == want.d);
            CHECK(got.sums == want.sums);
        }
}

TEST_CASE(
    "AVX-512 VNNI super-block matvecs from tiles (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) equal the "
    "dequantized rows times Q8_K x") {
    std::mt19937 rng(519);
    const auto dtype =
        GENERATE(DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS);
    for (const Avx512Build& build : builds())
        if (build.has_vnni)
            check_block_tile_matvec(build.matvec_rows_block_tiles, build.name, dtype, rng);
}

TEST_CASE("AVX-512 VNNI i-quant matvecs equal the dequantized rows times Q8_K x") {
    std::mt19937 rng(520);
    const DType dtype = GENERATE(from_range(std::begin(kIqGridTypes), std::end(kIqGridTypes)));
    for (const Avx512Build& build : builds())
        if (build.has_vnni) check_iq_matvec(build.matvec_rows_iq, build.name, dtype, rng);
}

TEST_CASE(
    "AVX-512 VNNI matvec of the looked-up blocks of 32 (IQ4_NL, MXFP4) from their tiles equals "
    "the dequantized rows times x quantized per 32") {
    std::mt19937 rng(522);
    const DType dtype = GENERATE(DType::IQ4_NL, DType::MXFP4);
    for (const Avx512Build& build : builds())
        if (build.has_vnni)
            check_lookup_matvec(build.matvec_rows_lookup_blocks, build.name, dtype, rng);
}

TEST_CASE("AVX-512 VNNI ternary matvecs equal the dequantized rows times Q8_K x") {
    std::mt19937 rng(521);
    const DType dtype = GENERATE(from_range(std::begin(kTernaryTypes), std::end(kTernaryTypes)));
    for (const Avx512Build& build : builds())
        if (build.has_vnni) check_iq_matvec(build.matvec_rows_iq, build.name, dtype, rng);
}

TEST_CASE("AVX-512 VNNI super-block matvecs equal the dequantized rows times Q8_K x") {
    std::mt19937 rng(518);
    const auto dtype = GENERATE(DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS);
    for (const Avx512Build& build : builds()) {
        if (!build.has_vnni) continue;
        for (int cols : {256, 768}) {
            // Rows a multiple of no tile; runs of rows as threads are given.
            const int rows = 37;
            const TestMatrix m = make_block_matrix(rows, cols, dtype, rng);
            const std::vector<float> x = q8_k_test_input(cols, rng);
            const Q8K quantized = q8_k_by_rule(x);
            cpu::Q8KVector x_q8_k;
            cpu::quantize_q8_k(&x_q8_k, x.data(), cols);
            const std::vector<double> want = block_reference(m, quantized.dequantized);
            for (auto [first, count] : {std::pair{1, rows - 2}, {17, 3}, {5, 11}}) {
                std::vector<float> got(rows, NAN);
                build.matvec_rows_super_blocks(got.data(), m.matrix, x_q8_k, first, count);
                INFO(build.name << " " << matrix_type_name(dtype) << " cols " << cols << " rows "
                                << first << ".." << first + count - 1);
                CHECK(worst_row_error(got, want, m, quantized.dequantized, first, count) < 1e-6);
                CHECK(std::isnan(got[first - 1]));
                CHECK(std::isnan(got[first + count]));
            }
        }
    }
}
