// The AVX-512 kernels called directly, against double-precision references: built on SIMDe
// (namespace avx512_simde, any CPU) and, where the CPU has AVX-512, natively (avx512). Sizes
// cover every tail: columns below, at and past whole registers, steps and groups.
#include <catch2/catch.hpp>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cpu/avx512.h"
// The SIMDe build's declarations: its files were compiled with avx512 defined so.
#define avx512 avx512_simde
#include "cpu/avx512.h"
#undef avx512
#include "test_matrices.h"

using namespace barellm;
using namespace barellm::test;

namespace {

// One build of the AVX-512 kernels.
struct Avx512Build {
    std::string name;
    bool has_vnni;  // whether its Q8/Q4 kernels can run here
    decltype(&cpu::avx512::matmul_rows) matmul_rows;
    decltype(&cpu::avx512::matmul_rows_half_x) matmul_rows_half_x;
    decltype(&cpu::avx512::round_to_half) round_to_half;
    decltype(&cpu::avx512::matmul_rows_q8) matmul_rows_q8;
    decltype(&cpu::avx512::matmul_rows_q4) matmul_rows_q4;
    decltype(&cpu::avx512::swiglu) swiglu;
    decltype(&cpu::avx512::dot_kv) dot_kv;
    decltype(&cpu::avx512::add_scaled_kv) add_scaled_kv;
};

// SIMDe's always; the native one where this CPU has AVX-512 (printed once).
std::vector<Avx512Build> builds() {
    std::vector<Avx512Build> list = {
        {"simde", true, cpu::avx512_simde::matmul_rows, cpu::avx512_simde::matmul_rows_half_x,
         cpu::avx512_simde::round_to_half, cpu::avx512_simde::matmul_rows_q8,
         cpu::avx512_simde::matmul_rows_q4, cpu::avx512_simde::swiglu, cpu::avx512_simde::dot_kv,
         cpu::avx512_simde::add_scaled_kv}};
    const bool native = cpu::detect_simd_level() == cpu::SimdLevel::Avx512;
    static bool said = false;
    if (!said) {
        std::printf(
            "AVX-512 kernel tests: SIMDe build%s\n",
            native ? (cpu::cpu_has_avx512_vnni() ? " and native (with VNNI)"
                                                 : " and native (no VNNI: Q8/Q4 on SIMDe only)")
                   : " only (this CPU has no AVX-512)");
        said = true;
    }
    if (native)
        list.push_back({"native", cpu::cpu_has_avx512_vnni(), cpu::avx512::matmul_rows,
                        cpu::avx512::matmul_rows_half_x, cpu::avx512::round_to_half,
                        cpu::avx512::matmul_rows_q8, cpu::avx512::matmul_rows_q4,
                        cpu::avx512::swiglu, cpu::avx512::dot_kv, cpu::avx512::add_scaled_kv});
    return list;
}

std::vector<double> reference_matvec(const TestMatrix& m, const std::vector<float>& x) {
    std::vector<double> want(m.matrix.rows);
    for (int r = 0; r < m.matrix.rows; ++r)
        for (int c = 0; c < m.matrix.cols; ++c)
            want[r] += double(m.values[size_t(r) * m.matrix.cols + c]) * x[c];
    return want;
}

// The rows [first, first + count) of out, as a vector.
std::vector<float> row_range(const std::vector<float>& out, int first, int count) {
    return {out.begin() + first, out.begin() + first + count};
}
std::vector<double> row_range(const std::vector<double>& out, int first, int count) {
    return {out.begin() + first, out.begin() + first + count};
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
            build.matmul_rows(got.data(), m.matrix, x.data(), first, count);
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
            build.matmul_rows_half_x(got.data(), m.matrix, half_x.data(), 1, rows - 1);
            INFO(build.name << " " << dtype_name(dtype) << " cols " << cols);
            CHECK(relative_error(row_range(got, 1, rows - 1), row_range(want, 1, rows - 1)) < 1e-6);
            CHECK(std::isnan(got[0]));
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
    const auto dtype = GENERATE(DType::I8, DType::U8);
    for (const Avx512Build& build : builds()) {
        if (!build.has_vnni) continue;
        // Q8: any width (a short last group); Q4: whole blocks of 32, odd and even counts,
        // more than 16 blocks (two registers of scales).
        const std::vector<int> widths =
            dtype == DType::I8
                ? std::vector<int>{1, 5, 31, 32, 33, 63, 64, 65, 100, 511, 512, 513, 600, 1100}
                : std::vector<int>{32, 64, 96, 160, 512, 544, 608, 1056};
        for (int cols : widths) {
            const int rows = 7;
            const TestMatrix m = make_matrix(rows, cols, dtype, rng);
            // Large values: the int8 products then reach their extremes (±127 × 127).
            const std::vector<float> x = random_floats(cols, rng, 50.0f);
            cpu::QuantizedVector quantized;
            cpu::quantize_q8(&quantized, x.data(), cols);
            const std::vector<double> want = reference_matvec(m, quantized_like_the_kernel(x));
            std::vector<float> got(rows, NAN);
            (dtype == DType::I8 ? build.matmul_rows_q8 : build.matmul_rows_q4)(
                got.data(), m.matrix, quantized, 1, rows - 1);
            INFO(build.name << " " << dtype_name(dtype) << " cols " << cols);
            CHECK(relative_error(row_range(got, 1, rows - 1), row_range(want, 1, rows - 1)) < 1e-6);
            CHECK(std::isnan(got[0]));
        }
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
