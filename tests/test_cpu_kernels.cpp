// CPU kernels against plain double-precision references written here, on random
// non-zero inputs at sizes that are not multiples of the SIMD width.
#include <omp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/avx2/avx2.h"
#include "cpu/kernels.h"
#include "test_block_matrices.h"
#include "test_matrices.h"
#include "weights/config.h"
#include "weights/half.h"

using namespace barellm;
using namespace barellm::test;

namespace {

// Whether the integer GEMMs of Q8 and Q4 weights (AVX-512 VNNI, and at the AVX2 level
// AVX-VNNI's, or for Q4 without it vpmaddubsw's) run at `level`: they multiply x quantized per
// token, and the references then use x quantized the same way.
bool integer_gemm(DType dtype, cpu::SimdLevel level) {
    return (dtype == DType::Q8_0 || dtype == DType::Q4_0) &&
           ((level == cpu::SimdLevel::Avx512 && cpu::cpu_has_avx512_vnni()) ||
            (level == cpu::SimdLevel::Avx2 && (cpu::cpu_has_avx_vnni() || dtype == DType::Q4_0)));
}

// Whether the prefill GEMM of `batch` tokens of weights of one `dtype` at `level` quantizes x
// per token: on the integer GEMMs, or on the AVX2 decode matvecs, which take Q8 and Q4 batches
// of fewer tokens than the f32 GEMM's tile.
bool gemm_quantizes_x(DType dtype, cpu::SimdLevel level, int batch) {
    return integer_gemm(dtype, level) ||
           ((dtype == DType::Q8_0 || dtype == DType::Q4_0) && level >= cpu::SimdLevel::Avx2 &&
            batch < cpu::avx2::kTokenTile);
}

// Whether the prefill GEMM at `level` quantizes x per token for the block types (their
// integer GEMMs, on AVX-512 VNNI and AVX2; the scalar one multiplies x as it is).
bool block_gemm_quantizes_x(cpu::SimdLevel level) { return level >= cpu::SimdLevel::Avx2; }

// x [batch, cols] quantized a token at a time by avx2::quantize_token, as the AVX2 integer
// GEMMs read it.
cpu::QuantizedBatch quantized_on_avx2(const std::vector<float>& x, int batch, int cols) {
    cpu::QuantizedBatch quantized;
    cpu::resize_quantized_batch(&quantized, batch, cols);
    for (int b = 0; b < batch; ++b)
        cpu::avx2::quantize_token(&quantized, x.data() + size_t(b) * cols, cols, b);
    return quantized;
}

}  // namespace

TEST_CASE("half conversion matches hand-checked values") {
    CHECK(float_to_half(1.0f) == 0x3c00);
    CHECK(float_to_half(-2.0f) == 0xc000);
    CHECK(float_to_half(65504.0f) == 0x7bff);
    CHECK(float_to_half(65520.0f) == 0x7c00);  // rounds to infinity
    CHECK(float_to_half(0.1f) == 0x2e66);
    CHECK(float_to_half(std::ldexp(1.0f, -24)) == 0x0001);             // smallest subnormal
    CHECK(float_to_half(std::ldexp(1.0f, -26)) == 0x0000);             // below half of it
    CHECK(float_to_half(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);      // tie to even
    CHECK(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // tie to even, up
    CHECK(half_to_float(0x3555) == Approx(0.333251953125).epsilon(0));
    CHECK(bf16_to_float(0x3f80) == 1.0f);
}

TEST_CASE("every finite half survives a round trip through float") {
    for (uint32_t bits = 0; bits < 0x10000; ++bits) {
        const bool is_nan = (bits & 0x7c00) == 0x7c00 && (bits & 0x3ff);
        if (is_nan) continue;
        REQUIRE(float_to_half(half_to_float(uint16_t(bits))) == bits);
    }
}

TEST_CASE(
    "quantize_q8: llama.cpp's Q8_0 rule: f16 scale, values rounded to even (std::nearbyint)") {
    std::mt19937 rng(31);
    for (int n : {1, 31, 32, 33, 100}) {
        INFO("n " << n);
        std::vector<float> x = random_floats(n, rng, 5.0f);
        if (n >= 40) {  // a group whose largest is 127 (scale 1): ties, and just below one
            const float values[] = {127.0f, 2.5f, -2.5f, 0.5f, -0.5f, 0.49999997f, -1.5f, 126.5f};
            std::copy(std::begin(values), std::end(values), x.begin() + 32);
        }
        cpu::QuantizedVector got;
        cpu::quantize_q8(&got, x.data(), n);
        REQUIRE(got.values.size() == size_t(n));
        for (int first = 0, g = 0; first < n; first += 32, ++g) {
            const int last = std::min(n, first + 32);
            float largest = 0;
            for (int i = first; i < last; ++i) largest = std::max(largest, std::fabs(x[i]));
            const Q8Rule rule = q8_rule(largest);
            CHECK(got.scales[g] == rule.scale);
            int sum = 0;
            for (int i = first; i < last; ++i) {
                const int want = int(std::nearbyint(x[i] * rule.multiplier));
                CHECK(int(got.values[i]) == want);
                sum += want;
            }
            CHECK(got.group_sums[g] == float(sum));
        }
    }
}

TEST_CASE("matvec matches a double-precision reference for every dtype and SIMD level") {
    std::mt19937 rng(1234);
    const auto dtype = GENERATE(DType::F32, DType::F16, DType::BF16, DType::Q8_0);
    const auto level =
        GENERATE(cpu::SimdLevel::Scalar, cpu::SimdLevel::Avx2, cpu::SimdLevel::Avx512);
    if (level > cpu::detect_simd_level()) {
        WARN("skipped: this CPU has no " << cpu::simd_level_name(level));
        return;
    }
    for (auto [rows, cols] :
         {std::pair{1, 1}, {3, 7}, {5, 8}, {13, 67}, {37, 172}, {64, 64}, {101, 257}}) {
        TestMatrix m = make_matrix(rows, cols, dtype, rng);
        const std::vector<float> x = random_floats(cols, rng);
        // The SIMD Q8 kernels quantize x too (integer dot products): so does the reference.
        std::vector<float> x_used = x;
        if (dtype == DType::Q8_0 && level >= cpu::SimdLevel::Avx2)
            x_used = quantized_like_the_kernel(x);
        // The AVX-512 f16 and bf16 matvecs read x rounded to f16, or to bf16 for bf16 weights
        // where they multiply with vdpbf16ps.
        if (dtype == DType::BF16 && level == cpu::SimdLevel::Avx512 &&
            cpu::cpu_prefers_bf16_dot_products())
            x_used = rounded_to_bf16(x);
        else if ((dtype == DType::F16 || dtype == DType::BF16) && level == cpu::SimdLevel::Avx512)
            for (float& value : x_used) value = half_to_float(float_to_half(value));
        std::vector<double> want(rows);
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < cols; ++c)
                want[r] += double(m.values[size_t(r) * cols + c]) * x_used[c];
        std::vector<float> got(rows, NAN);
        cpu::set_simd_level(level);
        cpu::matvec(got.data(), x.data(), m.matrix);
        cpu::set_simd_level(cpu::detect_simd_level());
        INFO(dtype_name(dtype) << " " << cpu::simd_level_name(level) << " " << rows << "x" << cols);
        CHECK(relative_error(got, want) < 1e-5);
    }
}

TEST_CASE(
    "mean_of_squares_settled: a sum in another order settles the mean unless near a boundary") {
    // 1 + 2^-24 lies halfway between the f32 values 1 and 1 + 2^-23: a sum of 64 squares
    // whose mean is that close to it may round either way, as the order of the sum decides.
    const int n = 64;
    const double halfway = 1.0 + 0x1p-24;
    CHECK_FALSE(cpu::mean_of_squares_settled(halfway * n, n));
    CHECK_FALSE(cpu::mean_of_squares_settled((halfway + 0x1p-50) * n, n));
    CHECK(cpu::mean_of_squares_settled((halfway + 0x1p-30) * n, n));
    CHECK(cpu::mean_of_squares_settled(1.0 * n, n));
    CHECK(cpu::mean_of_squares_settled(0.0, n));
    CHECK_FALSE(cpu::mean_of_squares_settled(INFINITY, n));
    CHECK_FALSE(cpu::mean_of_squares_settled(NAN, n));
}

TEST_CASE("rmsnorm gives the scalar rmsnorm's bits at every SIMD level") {
    // Values over twelve orders of magnitude: the SIMD levels sum the squares in lanes, which
    // rounds differently from the scalar sum in order, and must still give its f32 mean.
    std::mt19937 rng(9);
    std::uniform_real_distribution<float> exponent(-6.0f, 6.0f);
    const auto level = GENERATE(cpu::SimdLevel::Avx2, cpu::SimdLevel::Avx512);
    if (level > cpu::detect_simd_level()) return;
    for (int n : {1, 7, 9, 64, 172, 2051}) {
        for (int trial = 0; trial < 10; ++trial) {
            std::vector<float> x = random_floats(n, rng);
            for (float& v : x) v *= std::pow(10.0f, exponent(rng));
            const auto weight = random_floats(n, rng);
            std::vector<float> want(n), got(n);
            cpu::set_simd_level(cpu::SimdLevel::Scalar);
            cpu::rmsnorm(want.data(), x.data(), weight.data(), n, 1e-5f);
            cpu::set_simd_level(level);
            cpu::rmsnorm(got.data(), x.data(), weight.data(), n, 1e-5f);
            cpu::set_simd_level(cpu::detect_simd_level());
            INFO(cpu::simd_level_name(level) << " n " << n << " trial " << trial);
            CHECK(std::memcmp(got.data(), want.data(), sizeof(float) * n) == 0);
        }
    }
}

TEST_CASE("rmsnorm and softmax match their formulas") {
    std::mt19937 rng(7);
    const auto level =
        GENERATE(cpu::SimdLevel::Scalar, cpu::SimdLevel::Avx2, cpu::SimdLevel::Avx512);
    if (level > cpu::detect_simd_level()) return;
    cpu::set_simd_level(level);
    INFO(cpu::simd_level_name(level));
    for (int n : {1, 9, 172}) {
        const auto x = random_floats(n, rng, 3.0f), weight = random_floats(n, rng);
        std::vector<float> out(n);
        cpu::rmsnorm(out.data(), x.data(), weight.data(), n, 1e-5f);
        double mean_square = 0;
        for (float v : x) mean_square += double(v) * v / n;
        std::vector<double> want(n);
        for (int i = 0; i < n; ++i) want[i] = x[i] / std::sqrt(mean_square + 1e-5) * weight[i];
        CHECK(relative_error(out, want) < 1e-6);

        std::vector<float> probabilities = x;
        cpu::softmax(probabilities.data(), n);
        double total = 0;
        for (float v : x) total += std::exp(double(v));
        for (int i = 0; i < n; ++i) want[i] = std::exp(double(x[i])) / total;
        CHECK(relative_error(probabilities, want) < 1e-6);

        // With a sink logit (attention sinks) below, among and above the values (|x| < 3):
        // its exp joins the sum, and the n probabilities sum to less than 1.
        for (float sink : {-5.0f, 0.3f, 6.0f}) {
            std::vector<float> with_sink = x;
            cpu::softmax(with_sink.data(), n, sink);
            for (int i = 0; i < n; ++i)
                want[i] = std::exp(double(x[i])) / (total + std::exp(double(sink)));
            INFO("sink " << sink);
            CHECK(relative_error(with_sink, want) < 1e-6);
        }
    }
    // The sampler's masked tokens: -inf has probability exactly 0 (and 97 below the largest,
    // e^-97 ≈ 7e-43, next to nothing).
    std::vector<float> logits = {1.0f,      -INFINITY, 0.5f, -95.0f,   2.0f,
                                 -INFINITY, 0.0f,      1.5f, -INFINITY};
    cpu::softmax(logits.data(), int(logits.size()));
    CHECK(logits[1] == 0.0f);
    CHECK(logits[3] < 1e-38f);
    CHECK(logits[5] == 0.0f);
    CHECK(logits[8] == 0.0f);
    CHECK(std::abs(logits[4] - std::exp(0.0) / (std::exp(-1.0) + std::exp(-1.5) + 1 +
                                                std::exp(-2.0) + std::exp(-0.5))) < 1e-6);
    cpu::set_simd_level(cpu::detect_simd_level());
}

TEST_CASE("swiglu matches its formula at every SIMD level, far into both tails") {
    std::mt19937 rng(8);
    const auto level =
        GENERATE(cpu::SimdLevel::Scalar, cpu::SimdLevel::Avx2, cpu::SimdLevel::Avx512);
    if (level > cpu::detect_simd_level()) return;
    for (int n : {1, 9, 172}) {
        for (float scale : {3.0f, 120.0f}) {
            const auto gate_in = random_floats(n, rng, scale), up = random_floats(n, rng);
            std::vector<float> gate = gate_in;
            cpu::set_simd_level(level);
            cpu::swiglu(gate.data(), up.data(), n);
            cpu::set_simd_level(cpu::detect_simd_level());
            std::vector<double> want(n);
            for (int i = 0; i < n; ++i)
                want[i] = gate_in[i] / (1 + std::exp(-double(gate_in[i]))) * up[i];
            INFO(cpu::simd_level_name(level) << " n " << n << " scale " << scale);
            CHECK(relative_error(gate, want) < 1e-6);
            for (int i = 0; i < n; ++i)
                CHECK(std::abs(gate[i] - want[i]) <= 1e-6 * std::abs(want[i]) + 1e-30);
        }
    }
}

TEST_CASE("swiglu_oai (gpt-oss) matches its formula at every SIMD level, clamps included") {
    std::mt19937 rng(11);
    const auto level =
        GENERATE(cpu::SimdLevel::Scalar, cpu::SimdLevel::Avx2, cpu::SimdLevel::Avx512);
    if (level > cpu::detect_simd_level()) return;
    const float limit = 7.0f;
    for (int n : {1, 9, 172}) {
        // Scale 12: many gates above the limit and ups beyond ±limit.
        for (float scale : {3.0f, 12.0f}) {
            const auto gate_in = random_floats(n, rng, scale), up = random_floats(n, rng, scale);
            std::vector<float> gate = gate_in;
            cpu::set_simd_level(level);
            cpu::swiglu_oai(gate.data(), up.data(), n, limit);
            cpu::set_simd_level(cpu::detect_simd_level());
            std::vector<double> want(n);
            for (int i = 0; i < n; ++i) {
                const double g = std::min(double(gate_in[i]), double(limit));
                const double u = std::clamp(double(up[i]), -double(limit), double(limit));
                want[i] = g / (1 + std::exp(-1.702 * g)) * (u + 1);
            }
            INFO(cpu::simd_level_name(level) << " n " << n << " scale " << scale);
            for (int i = 0; i < n; ++i)
                CHECK(std::abs(gate[i] - want[i]) <=
                      2e-6 * std::abs(want[i]) + 1e-6 * std::abs(std::min(gate_in[i], limit)));
        }
    }
}

// GELU with the tanh approximation (Hugging Face's gelu_pytorch_tanh) times up, in double.
static double reference_geglu(float gate, float up) {
    const double g = gate;
    return 0.5 * g * (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g))) * up;
}

// The bound of one GeGLU output: relative to the output, and to g · up where the output is a
// small part of it (float's rounding of √(2/π)(g + 0.044715 g³) moves tanh there).
static bool close_geglu(float got, float gate, float up) {
    const double want = reference_geglu(gate, up);
    return std::abs(got - want) <= 2e-6 * std::abs(want) + 1e-7 * std::abs(double(gate) * up);
}

TEST_CASE("geglu matches its formula in double at every SIMD level, far into both tails") {
    std::mt19937 rng(9);
    const auto level =
        GENERATE(cpu::SimdLevel::Scalar, cpu::SimdLevel::Avx2, cpu::SimdLevel::Avx512);
    if (level > cpu::detect_simd_level()) return;
    for (int n : {1, 9, 17, 172}) {
        for (float scale : {0.5f, 3.0f, 120.0f}) {
            const auto gate_in = random_floats(n, rng, scale), up = random_floats(n, rng);
            std::vector<float> gate = gate_in;
            cpu::set_simd_level(level);
            cpu::geglu(gate.data(), up.data(), n);
            cpu::set_simd_level(cpu::detect_simd_level());
            std::vector<double> want(n);
            for (int i = 0; i < n; ++i) want[i] = reference_geglu(gate_in[i], up[i]);
            INFO(cpu::simd_level_name(level) << " n " << n << " scale " << scale);
            CHECK(relative_error(gate, want) < 1e-6);
            for (int i = 0; i < n; ++i) CHECK(close_geglu(gate[i], gate_in[i], up[i]));
        }
    }
}

TEST_CASE("softcap matches cap · tanh(x / cap) in double at every SIMD level, small to saturated") {
    std::mt19937 rng(10);
    const auto level =
        GENERATE(cpu::SimdLevel::Scalar, cpu::SimdLevel::Avx2, cpu::SimdLevel::Avx512);
    if (level > cpu::detect_simd_level()) return;
    for (int n : {1, 9, 17, 250}) {
        for (float cap : {30.0f, 50.0f}) {
            // Scores from far inside the cap (tanh nearly linear) to far past it (saturated).
            for (float scale : {0.01f * cap, cap, 100.0f * cap}) {
                const auto in = random_floats(n, rng, scale);
                std::vector<float> x = in;
                cpu::set_simd_level(level);
                cpu::softcap(x.data(), n, cap);
                cpu::set_simd_level(cpu::detect_simd_level());
                INFO(cpu::simd_level_name(level)
                     << " n " << n << " cap " << cap << " scale " << scale);
                for (int i = 0; i < n; ++i) {
                    const double want = cap * std::tanh(double(in[i]) / cap);
                    CHECK(std::abs(x[i] - want) <= 1e-6 * std::abs(want) + 4e-7 * cap);
                    CHECK(std::abs(x[i]) <= cap);
                }
            }
        }
    }
}

TEST_CASE("rope rotates pair (i, i + head_dim/2) by pos * theta^(-2i/head_dim)") {
    std::mt19937 rng(99);
    const int heads = 3, head_dim = 10, pos = 17;
    const double theta = 10000;
    Config config;
    config.head_dim = config.rotary_dim = head_dim;
    config.rope_theta = float(theta);
    const std::vector<float> table = rope_table(config, 1);
    const auto vec = random_floats(heads * head_dim, rng);
    std::vector<float> got = vec;
    cpu::rope(got.data(), heads, head_dim, pos, table.data());
    std::vector<double> want(vec.size());
    for (int h = 0; h < heads; ++h)
        for (int i = 0; i < head_dim / 2; ++i) {
            const double angle = pos * std::pow(theta, -2.0 * i / head_dim);
            const double a = vec[h * head_dim + i], b = vec[h * head_dim + i + head_dim / 2];
            want[h * head_dim + i] = a * std::cos(angle) - b * std::sin(angle);
            want[h * head_dim + i + head_dim / 2] = b * std::cos(angle) + a * std::sin(angle);
        }
    CHECK(relative_error(got, want) < 1e-6);
}

TEST_CASE("rope with a partial rotary_dim and LongRoPE: the first pairs rotated and scaled") {
    // Pairs i < rotary_dim / 2 turn by pos / (factor_i * theta^(2i/rotary_dim)), their cos and
    // sin times the attention factor; the other pairs pass unchanged.
    std::mt19937 rng(7);
    const int heads = 2, head_dim = 14, rotary_dim = 8, original = 32;
    const double theta = 500, attention_factor = 1.19;
    Config config;
    config.head_dim = head_dim;
    config.rotary_dim = rotary_dim;
    config.rope_theta = float(theta);
    config.rope_scaling.kind = RopeScaling::Kind::LongRope;
    config.rope_scaling.short_factors = {1.0f, 1.5f, 2.0f, 3.0f};
    config.rope_scaling.long_factors = {1.25f, 4.0f, 9.0f, 20.0f};
    config.rope_scaling.original_context = original;
    config.rope_scaling.attention_factor = float(attention_factor);
    const auto vec = random_floats(heads * head_dim, rng);
    for (const int context : {original, original + 1}) {
        const auto& factors = context > original ? config.rope_scaling.long_factors
                                                 : config.rope_scaling.short_factors;
        for (const int pos : {0, 3, 29}) {
            INFO("context " << context << " pos " << pos);
            const std::vector<float> table = rope_table(config, context);
            std::vector<float> got = vec;
            cpu::rope(got.data(), heads, head_dim, pos, table.data());
            std::vector<double> want(vec.begin(), vec.end());
            for (int h = 0; h < heads; ++h)
                for (int i = 0; i < rotary_dim / 2; ++i) {
                    const double angle = pos / (factors[i] * std::pow(theta, 2.0 * i / rotary_dim));
                    const double c = std::cos(angle) * attention_factor;
                    const double s = std::sin(angle) * attention_factor;
                    const double a = vec[h * head_dim + i],
                                 b = vec[h * head_dim + i + head_dim / 2];
                    want[h * head_dim + i] = a * c - b * s;
                    want[h * head_dim + i + head_dim / 2] = b * c + a * s;
                }
            CHECK(relative_error(got, want) < 1e-6);
        }
    }
}

// Direct double-precision attention of query position `pos` over stored (rounded) keys
// and values [positions, kv_dim], attending to rows first..pos; the scores soft-capped where
// softcap > 0; with sinks [heads], head h's sink logit joins its softmax's denominator.
static std::vector<double> reference_attention(const float* q, int pos, int first,
                                               const std::vector<float>& keys,
                                               const std::vector<float>& values, int heads,
                                               int kv_heads, int head_dim, double scale,
                                               double softcap, const float* sinks) {
    const int kv_dim = kv_heads * head_dim;
    std::vector<double> out(heads * head_dim, 0.0);
    for (int h = 0; h < heads; ++h) {
        const int kv_head = h / (heads / kv_heads);
        std::vector<double> scores(pos + 1, 0.0);
        double max_score = -1e300, total = 0;
        for (int t = first; t <= pos; ++t) {
            for (int i = 0; i < head_dim; ++i)
                scores[t] +=
                    double(q[h * head_dim + i]) * keys[size_t(t) * kv_dim + kv_head * head_dim + i];
            scores[t] *= scale;
            if (softcap > 0) scores[t] = softcap * std::tanh(scores[t] / softcap);
            max_score = std::max(max_score, scores[t]);
        }
        for (int t = first; t <= pos; ++t) total += (scores[t] = std::exp(scores[t] - max_score));
        if (sinks) total += std::exp(sinks[h] - max_score);
        for (int t = first; t <= pos; ++t)
            for (int i = 0; i < head_dim; ++i)
                out[h * head_dim + i] +=
                    scores[t] / total * values[size_t(t) * kv_dim + kv_head * head_dim + i];
    }
    return out;
}

TEST_CASE("attention with GQA, sliding window and sinks matches a direct softmax-weighted sum") {
    std::mt19937 rng(42);
    const auto type = GENERATE(KvType::F32, KvType::F16);
    const auto level =
        GENERATE(cpu::SimdLevel::Scalar, cpu::SimdLevel::Avx2, cpu::SimdLevel::Avx512);
    if (level > cpu::detect_simd_level()) return;
    // head_dim 20: one whole and one partial tile of 16 value columns in the AVX2 prefill.
    const int head_dim = GENERATE(12, 20);
    // Gemma 2's soft-capped scores: a cap of 0.2 bends most of these (|score| up to about 1).
    const float softcap = GENERATE(0.0f, 0.2f);
    const int heads = 6, kv_heads = 2, kv_dim = kv_heads * head_dim;
    // gpt-oss's attention sinks, below and above the scores (|score| up to about 1): the
    // largest takes most of the probability.
    const std::vector<float> head_sinks = {-3.0f, 0.5f, 2.5f, -0.25f, 1.0f, 4.0f};
    const bool with_sinks = GENERATE(false, true);
    const float* sinks = with_sinks ? head_sinks.data() : nullptr;
    const size_t element = kv_element_bytes(type);
    for (int window : {0, 5, 37}) {
        for (int positions : {1, 7, 45, 300}) {
            const auto keys = random_floats(size_t(positions) * kv_dim, rng);
            const auto values = random_floats(size_t(positions) * kv_dim, rng);
            // Store the cache in `type`; the reference uses the stored (rounded) values.
            std::vector<uint8_t> key_cache(keys.size() * element),
                value_cache(values.size() * element);
            for (int t = 0; t < positions; ++t) {
                cpu::kv_store(&key_cache[t * kv_dim * element], &keys[size_t(t) * kv_dim], kv_dim,
                              type);
                cpu::kv_store(&value_cache[t * kv_dim * element], &values[size_t(t) * kv_dim],
                              kv_dim, type);
            }
            std::vector<float> stored_keys(keys), stored_values(values);
            if (type == KvType::F16)
                for (size_t i = 0; i < keys.size(); ++i) {
                    stored_keys[i] = half_to_float(float_to_half(keys[i]));
                    stored_values[i] = half_to_float(float_to_half(values[i]));
                }
            // A scale other than 1/√head_dim (as Gemma's query_pre_attn_scalar gives), so
            // that a kernel which recomputes it fails.
            const float scale = 1.25f / std::sqrt(float(head_dim));
            const AttentionShape shape{heads, kv_heads, head_dim, window, scale, softcap, sinks};
            const int pos = positions - 1;
            const int first = window ? std::max(0, pos + 1 - window) : 0;
            INFO("positions " << positions << " window " << window << " head_dim " << head_dim
                              << " softcap " << softcap << " sinks " << (sinks != nullptr));
            cpu::set_simd_level(level);

            // Decode: the last position alone.
            const auto q = random_floats(heads * head_dim, rng);
            std::vector<float> out(heads * head_dim, NAN), scores(size_t(heads) * positions);
            cpu::attention(out.data(), q.data(), pos, key_cache.data(), value_cache.data(),
                           scores.data(), shape, type);
            CHECK(relative_error(out, reference_attention(q.data(), pos, first, stored_keys,
                                                          stored_values, heads, kv_heads, head_dim,
                                                          scale, softcap, sinks)) < 1e-5);

            // Prefill: the last `count` positions as one batch, each causal (40 tokens ×
            // 3 heads per KV head: several blocks of query rows and tiles of keys).
            const int count = std::min(positions, 40);
            const int first_pos = positions - count;
            const auto queries = random_floats(size_t(count) * heads * head_dim, rng);
            std::vector<float> batch_out(queries.size(), NAN);
            cpu::attention_batch(batch_out.data(), queries.data(), count, first_pos,
                                 key_cache.data(), value_cache.data(), shape, type);
            for (int i = 0; i < count; ++i) {
                const int p = first_pos + i;
                const std::vector<float> row(batch_out.begin() + i * heads * head_dim,
                                             batch_out.begin() + (i + 1) * heads * head_dim);
                CHECK(relative_error(
                          row, reference_attention(&queries[i * heads * head_dim], p,
                                                   window ? std::max(0, p + 1 - window) : 0,
                                                   stored_keys, stored_values, heads, kv_heads,
                                                   head_dim, scale, softcap, sinks)) < 1e-5);
            }
            cpu::set_simd_level(cpu::detect_simd_level());
        }
    }
}

TEST_CASE("gemm (the prefill product) matches a double-precision reference") {
    std::mt19937 rng(2024);
    const auto dtype = GENERATE(DType::F32, DType::F16, DType::BF16, DType::Q8_0);
    const auto level =
        GENERATE(cpu::SimdLevel::Scalar, cpu::SimdLevel::Avx2, cpu::SimdLevel::Avx512);
    if (level > cpu::detect_simd_level()) return;
    // Sizes cross the AVX2 kernel's tiles (6 rows x 16 tokens, transposed 8 x 8 at a time),
    // the AVX-512 float ones' (12 rows x 2 tiles of 16 tokens, pairs of bf16 columns), the
    // AVX-512 VNNI one's (32 rows x 6 tokens, groups of 32 columns) and blocks (96 rows, 256
    // columns), with partial tiles and blocks of every kind.
    for (auto [batch, rows, cols] : {std::tuple{1, 1, 1},
                                     {5, 7, 13},
                                     {4, 3, 8},
                                     {70, 11, 600},
                                     {9, 40, 1030},
                                     {37, 203, 531},
                                     {16, 96, 256}}) {
        TestMatrix m = make_matrix(rows, cols, dtype, rng);
        const std::vector<float> x = random_floats(size_t(batch) * cols, rng);
        // The VNNI GEMM multiplies x quantized per token, bf16 weights with vdpbf16ps x
        // rounded to bf16.
        const bool rounds_x = dtype == DType::BF16 && level == cpu::SimdLevel::Avx512 &&
                              cpu::cpu_prefers_bf16_dot_products();
        const std::vector<float> x_used = gemm_quantizes_x(dtype, level, batch)
                                              ? rows_quantized_like_the_kernel(x, cols)
                                          : rounds_x ? rounded_to_bf16(x)
                                                     : x;
        const std::vector<double> want = reference_gemm(m, x_used, batch);
        std::vector<float> got(size_t(batch) * rows, NAN);
        cpu::set_simd_level(level);
        cpu::gemm(got.data(), x.data(), batch, m.matrix);
        cpu::set_simd_level(cpu::detect_simd_level());
        INFO(dtype_name(dtype) << " " << cpu::simd_level_name(level) << " batch " << batch << " "
                               << rows << "x" << cols);
        CHECK(relative_error(got, want) < 1e-5);
    }
}

TEST_CASE("several GEMMs of one input each match their own reference") {
    std::mt19937 rng(77);
    const auto dtype = GENERATE(DType::F16, DType::Q8_0);
    const auto level =
        GENERATE(cpu::SimdLevel::Scalar, cpu::SimdLevel::Avx2, cpu::SimdLevel::Avx512);
    if (level > cpu::detect_simd_level()) return;
    // Like q, k and v: row counts that are not multiples of the 6-row tile or the 96-row
    // block (nor of the VNNI kernel's 32-row tile), so that the chunks the threads claim
    // straddle the boundaries between matrices.
    const int batch = 21, cols = 300;
    const std::vector<int> row_counts = {197, 31, 31};
    std::vector<TestMatrix> matrices;
    for (int rows : row_counts) matrices.push_back(make_matrix(rows, cols, dtype, rng));
    const std::vector<float> x = random_floats(size_t(batch) * cols, rng);
    std::vector<std::vector<float>> got;
    for (int rows : row_counts) got.emplace_back(size_t(batch) * rows, NAN);
    cpu::set_simd_level(level);
    cpu::gemm_many(x.data(), batch,
                   {{got[0].data(), &matrices[0].matrix},
                    {got[1].data(), &matrices[1].matrix},
                    {got[2].data(), &matrices[2].matrix}});
    cpu::set_simd_level(cpu::detect_simd_level());
    const std::vector<float> x_used =
        gemm_quantizes_x(dtype, level, batch) ? rows_quantized_like_the_kernel(x, cols) : x;
    for (size_t m = 0; m < matrices.size(); ++m) {
        const int rows = row_counts[m];
        std::vector<double> want(size_t(batch) * rows);
        for (int b = 0; b < batch; ++b)
            for (int r = 0; r < rows; ++r)
                for (int c = 0; c < cols; ++c)
                    want[size_t(b) * rows + r] += double(matrices[m].values[size_t(r) * cols + c]) *
                                                  x_used[size_t(b) * cols + c];
        INFO(dtype_name(dtype) << " " << cpu::simd_level_name(level) << " matrix " << m);
        CHECK(relative_error(got[m], want) < 1e-5);
    }
    const TestMatrix narrow = make_matrix(4, cols - 1, dtype, rng);
    std::vector<float> narrow_out(size_t(batch) * 4);
    CHECK_THROWS_WITH(
        cpu::gemm_many(x.data(), batch,
                       {{got[0].data(), &matrices[0].matrix}, {narrow_out.data(), &narrow.matrix}}),
        Catch::Contains("different widths"));
}

TEST_CASE("GEMMs of matrices of mixed block types each match their own reference") {
    std::mt19937 rng(57);
    const auto level =
        GENERATE(cpu::SimdLevel::Scalar, cpu::SimdLevel::Avx2, cpu::SimdLevel::Avx512);
    const int threads = GENERATE(1, 3);
    if (level > cpu::detect_simd_level()) return;
    // q, k, v of a Q4_K_M file (Q4_K, Q4_K, Q6_K), of a Q3_K_M file (Q3_K, Q3_K, Q5_K) and of a
    // Q2_K file (Q2_K, Q2_K, Q3_K), a fallback mix (Q5_0 beside Q8_0 and Q5_1), and super-block
    // types beside a type of blocks of 32 (IQ4_XS and Q5_K, on x quantized per 256, beside Q4_1,
    // on x per 32; IQ4_XS beside its fallback IQ4_NL; the experts' MXFP4 beside Q8_0 and Q4_K, as
    // an MXFP4 MoE file mixes them); row counts off every tile, so that the
    // threads' runs straddle the boundaries between matrices; a batch off the 6-token tile.
    const std::vector<std::vector<DType>> mixes = {
        {DType::Q4_K, DType::Q4_K, DType::Q6_K}, {DType::Q3_K, DType::Q3_K, DType::Q5_K},
        {DType::Q2_K, DType::Q2_K, DType::Q3_K}, {DType::IQ4_XS, DType::IQ4_NL, DType::Q6_K},
        {DType::Q5_0, DType::Q8_0, DType::Q5_1}, {DType::IQ4_XS, DType::Q5_K, DType::Q4_1},
        {DType::MXFP4, DType::Q8_0, DType::Q4_K}};
    const std::vector<int> row_counts = {197, 37, 45};
    // 13 tokens on the GEMM; 5 on the matvecs (Q4_K's from its tiles, every token at once).
    const int batch = GENERATE(5, 13), cols = 512;
    const int saved_threads = omp_get_max_threads();
    for (const std::vector<DType>& mix : mixes) {
        std::vector<TestMatrix> matrices;
        for (size_t m = 0; m < mix.size(); ++m)
            matrices.push_back(is_block_type(mix[m])
                                   ? make_block_matrix(row_counts[m], cols, mix[m], rng)
                                   : make_matrix(row_counts[m], cols, mix[m], rng));
        const std::vector<float> x = random_floats(size_t(batch) * cols, rng, 4.0f);
        std::vector<std::vector<float>> got;
        for (int rows : row_counts) got.emplace_back(size_t(batch) * rows, NAN);
        omp_set_num_threads(threads);
        cpu::set_simd_level(level);
        cpu::gemm_many(x.data(), batch,
                       {{got[0].data(), &matrices[0].matrix},
                        {got[1].data(), &matrices[1].matrix},
                        {got[2].data(), &matrices[2].matrix}});
        cpu::set_simd_level(cpu::detect_simd_level());
        omp_set_num_threads(saved_threads);
        // Every output on its own type's path: all of them on quantized x, or none.
        const bool quantized =
            std::all_of(
                mix.begin(), mix.end(),
                [&](DType dtype) { return is_block_type(dtype) || integer_gemm(dtype, level); }) &&
            block_gemm_quantizes_x(level);
        const std::vector<float> x_used = quantized ? rows_quantized_like_the_kernel(x, cols) : x;
        // There the super-block types read x quantized per 256 as Q8_K, on the GEMM as on the
        // matvecs (which a few tokens of block types alone meet), the others per 32.
        std::vector<float> x_q8_k;
        for (int b = 0; b < batch; ++b) {
            const Q8K token = q8_k_by_rule({&x[size_t(b) * cols], &x[size_t(b + 1) * cols]});
            x_q8_k.insert(x_q8_k.end(), token.dequantized.begin(), token.dequantized.end());
        }
        for (size_t m = 0; m < matrices.size(); ++m) {
            INFO(matrix_type_name(mix[m]) << " " << cpu::simd_level_name(level) << " " << threads
                                          << " threads, batch " << batch);
            const bool on_q8_k = quantized && block_weights(mix[m]) == kSuperBlock;
            CHECK(relative_error(got[m], reference_gemm(matrices[m], on_q8_k ? x_q8_k : x_used,
                                                        batch)) < 1e-6);
        }
    }
}

TEST_CASE(
    "Q4 matvec and prefill GEMM match a double-precision reference at several thread "
    "counts") {
    std::mt19937 rng(404);
    const auto level =
        GENERATE(cpu::SimdLevel::Scalar, cpu::SimdLevel::Avx2, cpu::SimdLevel::Avx512);
    if (level > cpu::detect_simd_level()) return;
    const int threads = GENERATE(1, 2, 3);
    const int saved_threads = omp_get_max_threads();
    omp_set_num_threads(threads);
    cpu::set_simd_level(level);
    // Columns are whole blocks of 32 (Q4 rows are), but not multiples of 64; the largest
    // matrices are big enough for threads_for to give every thread rows.
    for (auto [batch, rows, cols] : {std::tuple{1, 1, 32},
                                     {3, 7, 96},
                                     {5, 13, 160},
                                     {17, 37, 288},
                                     {70, 101, 608},
                                     {37, 203, 544},
                                     {9, 389, 736}}) {
        TestMatrix m = make_matrix(rows, cols, DType::Q4_0, rng);
        const std::vector<float> x = random_floats(size_t(batch) * cols, rng);
        INFO(cpu::simd_level_name(level)
             << " " << threads << " threads, batch " << batch << " " << rows << "x" << cols);
        // Decode, the first token of x.
        const std::vector<float> x0(x.begin(), x.begin() + cols);
        const std::vector<float> x_used =
            level >= cpu::SimdLevel::Avx2 ? quantized_like_the_kernel(x0) : x0;
        std::vector<double> want(rows);
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < cols; ++c)
                want[r] += double(m.values[size_t(r) * cols + c]) * x_used[c];
        std::vector<float> got(rows, NAN);
        cpu::matvec(got.data(), x0.data(), m.matrix);
        CHECK(relative_error(got, want) < 1e-5);
        // Prefill, the whole batch.
        const std::vector<float> batch_x_used = gemm_quantizes_x(DType::Q4_0, level, batch)
                                                    ? rows_quantized_like_the_kernel(x, cols)
                                                    : x;
        const std::vector<double> batch_want = reference_gemm(m, batch_x_used, batch);
        std::vector<float> batch_got(size_t(batch) * rows, NAN);
        cpu::gemm(batch_got.data(), x.data(), batch, m.matrix);
        CHECK(relative_error(batch_got, batch_want) < 1e-5);
    }
    cpu::set_simd_level(cpu::detect_simd_level());
    omp_set_num_threads(saved_threads);
}

TEST_CASE("AVX2 Q8 and Q4 matvecs of several tokens give each token the one-token matvec's bits") {
    if (cpu::detect_simd_level() < cpu::SimdLevel::Avx2) return;
    std::mt19937 rng(406);
    // Q8: a short last group and groups past the last eight; Q4: blocks past the last eight.
    for (auto [dtype, cols] :
         {std::pair{DType::Q8_0, 600}, {DType::Q8_0, 256}, {DType::Q4_0, 608}, {DType::Q4_0, 96}}) {
        const int rows = 37;
        TestMatrix m = make_matrix(rows, cols, dtype, rng);
        for (int tokens : {1, 3, 4, 5, 9, 15}) {
            const std::vector<float> x = random_floats(size_t(tokens) * cols, rng, 3.0f);
            std::vector<cpu::QuantizedVector> quantized(tokens);
            for (int t = 0; t < tokens; ++t)
                cpu::quantize_q8(&quantized[t], &x[size_t(t) * cols], cols);
            const int first = 2, count = rows - 5;  // a run inside the matrix
            std::vector<float> together(size_t(tokens) * rows, NAN);
            (dtype == DType::Q8_0 ? cpu::avx2::matvec_rows_q8_tokens
                                  : cpu::avx2::matvec_rows_q4_tokens)(
                together.data(), rows, m.matrix, quantized.data(), tokens, first, count);
            INFO(dtype_name(dtype) << " " << cols << " columns, " << tokens << " tokens");
            for (int t = 0; t < tokens; ++t) {
                std::vector<float> alone(rows, NAN);
                (dtype == DType::Q8_0 ? cpu::avx2::matvec_rows_q8 : cpu::avx2::matvec_rows_q4)(
                    alone.data(), m.matrix, quantized[t], first, count);
                for (int r = first; r < first + count; ++r)
                    CHECK(std::memcmp(&together[size_t(t) * rows + r], &alone[r], sizeof(float)) ==
                          0);
                CHECK(std::isnan(together[size_t(t) * rows]));  // outside the run: untouched
            }
        }
    }
}

TEST_CASE(
    "quantize_q8's q4_pair_values: each pair of whole groups as the AVX2 Q4 matvec reads it") {
    std::mt19937 rng(407);
    for (int n : {1, 31, 32, 63, 64, 96, 100, 160, 200}) {
        const std::vector<float> x = random_floats(n, rng, 4.0f);
        cpu::QuantizedVector q;
        cpu::quantize_q8(&q, x.data(), n);
        INFO("n " << n);
        REQUIRE(q.q4_pair_values.size() == size_t(n));
        // Position i of a whole pair of groups [64p, 64p + 64) holds column 64p + 16 ×
        // source_quarter[i % 64 / 16] + i % 16; past the whole pairs, column i.
        const int source_quarter[] = {0, 2, 1, 3};  // g 0-15, g + 1 0-15, g 16-31, g + 1 16-31
        for (int i = 0; i < n; ++i) {
            const int pair_start = i / 64 * 64, within = i % 64;
            const int column = pair_start + 64 <= n
                                   ? pair_start + source_quarter[within / 16] * 16 + within % 16
                                   : i;
            CHECK(q.q4_pair_values[i] == q.values[column]);
        }
    }
}

TEST_CASE("AVX2 Q4 decode matvec (two blocks a load) matches a reference on quantized x") {
    if (cpu::detect_simd_level() < cpu::SimdLevel::Avx2) return;
    std::mt19937 rng(408);
    // 1 to 19 blocks: none, one or two runs of eight (two blocks a load), and a short rest.
    for (int cols : {32, 96, 256, 288, 544, 608})
        for (int tokens : {1, 2, 3, 5}) {
            const int rows = 23;
            TestMatrix m = make_matrix(rows, cols, DType::Q4_0, rng);
            set_extreme_q4_rows(&m);  // int16 sums of a pair of blocks at 4 × 15 × 127
            const std::vector<float> x = one_sign_tokens(tokens, cols, rng);
            const std::vector<double> want =
                reference_gemm(m, rows_quantized_like_the_kernel(x, cols), tokens);
            std::vector<cpu::QuantizedVector> quantized(tokens);
            for (int t = 0; t < tokens; ++t)
                cpu::quantize_q8(&quantized[t], &x[size_t(t) * cols], cols);
            INFO("cols " << cols << " tokens " << tokens);
            const int first = 2, count = rows - 4;
            std::vector<float> got(size_t(tokens) * rows, NAN);
            cpu::avx2::matvec_rows_q4_tokens(got.data(), rows, m.matrix, quantized.data(), tokens,
                                             first, count);
            check_row_run(got, want, tokens, rows, first, count, 1e-6);
        }
}

TEST_CASE("Q4 and Q8 matvecs in one matvec_many call each match their own reference") {
    std::mt19937 rng(405);
    if (cpu::detect_simd_level() < cpu::SimdLevel::Avx2) return;
    const int cols = 224;
    TestMatrix q4 = make_matrix(53, cols, DType::Q4_0, rng);
    TestMatrix q8 = make_matrix(29, cols, DType::Q8_0, rng);
    TestMatrix f16 = make_matrix(31, cols, DType::F16, rng);
    const std::vector<float> x = random_floats(cols, rng);
    const std::vector<float> x_quantized = quantized_like_the_kernel(x);
    // f16 weights: x as it is, or rounded to f16 by the AVX-512 matvec.
    std::vector<float> x_for_f16 = x;
    if (cpu::simd_level() == cpu::SimdLevel::Avx512)
        for (float& value : x_for_f16) value = half_to_float(float_to_half(value));
    std::vector<float> got_q4(53, NAN), got_q8(29, NAN), got_f16(31, NAN);
    cpu::matvec_many({{got_q4.data(), x.data(), &q4.matrix},
                      {got_q8.data(), x.data(), &q8.matrix},
                      {got_f16.data(), x.data(), &f16.matrix}});
    const std::pair<TestMatrix*, std::vector<float>*> cases[] = {
        {&q4, &got_q4}, {&q8, &got_q8}, {&f16, &got_f16}};
    for (auto [m, got] : cases) {
        const bool quantized_input = m->matrix.dtype != DType::F16;
        std::vector<double> want(m->matrix.rows);
        for (int r = 0; r < m->matrix.rows; ++r)
            for (int c = 0; c < cols; ++c)
                want[r] += double(m->values[size_t(r) * cols + c]) *
                           (quantized_input ? x_quantized[c] : x_for_f16[c]);
        INFO(dtype_name(m->matrix.dtype));
        CHECK(relative_error(*got, want) < 1e-5);
    }
}

TEST_CASE("Q4 nibbles: byte j of a block holds column j low and column j + 16 high") {
    // Hand-made block: q = column % 16 in the low half and 15 - column % 16 in the high.
    uint8_t block[16];
    for (int j = 0; j < 16; ++j) block[j] = uint8_t(j | ((15 - j) << 4));
    for (int col = 0; col < 32; ++col)
        CHECK(q4_value(block, col) == (col < 16 ? col : 15 - (col - 16)) - 8);
    // One row of that block with scale 0.5: the matvec against x = 127 (x's Q8 scale exactly 1)
    // sums it, times 127.
    const uint16_t scale = float_to_half(0.5f);
    const Matrix w{block, DType::Q4_0, 1, 32, &scale};
    const std::vector<float> ones(32, 127.0f);
    float out = NAN;
    for (auto level : {cpu::SimdLevel::Scalar, cpu::SimdLevel::Avx2, cpu::SimdLevel::Avx512}) {
        if (level > cpu::detect_simd_level()) continue;
        cpu::set_simd_level(level);
        cpu::matvec(&out, ones.data(), w);
        // 127 × 0.5 × Σ (q - 8) over both halves = 127 × 0.5 × 2 × Σ_{k=0..15} (k - 8).
        const float want = 127.0f * (120 - 128);
        CHECK(out == want);
        float batch_out[2] = {NAN, NAN};
        const std::vector<float> two_tokens(64, 127.0f);
        cpu::gemm(batch_out, two_tokens.data(), 2, w);
        CHECK(batch_out[0] == want);
        CHECK(batch_out[1] == want);
    }
    cpu::set_simd_level(cpu::detect_simd_level());
}

TEST_CASE("matvecs split across threads equal their reference at every level and dtype") {
    // Large enough that threads_for gives each of 3 threads rows (the buffers each call
    // prepares, such as x rounded or quantized, are then read by other threads).
    std::mt19937 rng(611);
    const auto dtype = GENERATE(DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0);
    const auto level =
        GENERATE(cpu::SimdLevel::Scalar, cpu::SimdLevel::Avx2, cpu::SimdLevel::Avx512);
    if (level > cpu::detect_simd_level()) return;
    const int rows = 301, cols = 704;
    const TestMatrix m = make_matrix(rows, cols, dtype, rng);
    const std::vector<float> x = random_floats(cols, rng);
    std::vector<float> x_used = x;
    if ((dtype == DType::Q8_0 || dtype == DType::Q4_0) && level >= cpu::SimdLevel::Avx2)
        x_used = quantized_like_the_kernel(x);
    else if (dtype == DType::BF16 && level == cpu::SimdLevel::Avx512 &&
             cpu::cpu_prefers_bf16_dot_products())
        x_used = rounded_to_bf16(x);
    else if ((dtype == DType::F16 || dtype == DType::BF16) && level == cpu::SimdLevel::Avx512)
        for (float& value : x_used) value = half_to_float(float_to_half(value));
    std::vector<double> want(rows);
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c)
            want[r] += double(m.values[size_t(r) * cols + c]) * x_used[c];
    const int saved_threads = omp_get_max_threads();
    omp_set_num_threads(3);
    REQUIRE(cpu::threads_for(size_t(rows) * cols) == 3);
    cpu::set_simd_level(level);
    std::vector<float> got(rows, NAN);
    cpu::matvec(got.data(), x.data(), m.matrix);
    cpu::set_simd_level(cpu::detect_simd_level());
    omp_set_num_threads(saved_threads);
    INFO(dtype_name(dtype) << " " << cpu::simd_level_name(level));
    CHECK(relative_error(got, want) < 1e-5);
}

TEST_CASE("quantize_q8_k gives the bytes of llama.cpp's Q8_K rule, scalar and AVX2") {
    std::mt19937 rng(701);
    const bool avx2 = GENERATE(false, true);
    if (avx2 && cpu::detect_simd_level() < cpu::SimdLevel::Avx2) return;
    for (int n : {256, 768, 1280}) {
        const std::vector<float> x = q8_k_test_input(n, rng);
        const Q8K want = q8_k_by_rule(x);
        cpu::Q8KVector got;
        got.values.assign(n + 300, 99);  // stale contents, longer than n: resized to n
        got.sums.assign(n, 99);
        (avx2 ? cpu::avx2::quantize_q8_k : cpu::quantize_q8_k)(&got, x.data(), n);
        INFO((avx2 ? "avx2" : "scalar") << " n " << n);
        CHECK(got.values == want.values);
        CHECK(got.d == want.d);
        CHECK(got.sums == want.sums);
    }
}

TEST_CASE(
    "a Q2_K or Q3_K matrix without tiles is multiplied from its dequantized rows at every level") {
    // Q2_K and Q3_K have no row-by-row SIMD kernels: without tiles, decode takes the scalar
    // matvec and a batch the f32 GEMM, each on x itself.
    std::mt19937 rng(731);
    const auto level =
        GENERATE(cpu::SimdLevel::Scalar, cpu::SimdLevel::Avx2, cpu::SimdLevel::Avx512);
    const auto dtype = GENERATE(DType::Q2_K, DType::Q3_K);
    if (level > cpu::detect_simd_level()) return;
    const int rows = 37, cols = 768;
    const TestMatrix m = make_block_matrix(rows, cols, dtype, rng);
    Matrix rows_only = m.matrix;
    rows_only.row_tiles = nullptr;
    for (int batch : {1, 5, 13}) {
        const std::vector<float> x = random_floats(size_t(batch) * cols, rng, 3.0f);
        std::vector<float> got(size_t(batch) * rows, NAN);
        cpu::set_simd_level(level);
        if (batch == 1)
            cpu::matvec(got.data(), x.data(), rows_only);
        else
            cpu::gemm_many(x.data(), batch, {{got.data(), &rows_only}});
        cpu::set_simd_level(cpu::detect_simd_level());
        for (int b = 0; b < batch; ++b) {
            INFO(matrix_type_name(dtype)
                 << " " << cpu::simd_level_name(level) << " batch " << batch << " token " << b);
            const std::vector<float> token(x.begin() + size_t(b) * cols,
                                           x.begin() + size_t(b + 1) * cols);
            const std::vector<float> token_got(got.begin() + size_t(b) * rows,
                                               got.begin() + size_t(b + 1) * rows);
            CHECK(worst_row_error(token_got, block_reference(m, token), m, token, 0, rows) < 1e-5);
        }
    }
}

TEST_CASE("block-type matvecs of mixed types in one matvec_many call, every level and threads") {
    // Each matrix against its dequantized rows: times x itself at the scalar level; where the
    // SIMD levels' integer dot products quantize x, times x quantized as Q8_K (K-quants) or
    // per 32 (the blocks of 32).
    std::mt19937 rng(702);
    const auto level =
        GENERATE(cpu::SimdLevel::Scalar, cpu::SimdLevel::Avx2, cpu::SimdLevel::Avx512);
    const auto threads = GENERATE(1, 3);
    const auto mix = GENERATE(0, 1, 2, 3, 4);
    const std::vector<DType> types =
        mix == 0   ? std::vector<DType>{DType::Q4_K, DType::Q6_K, DType::Q5_K, DType::IQ4_XS}
        : mix == 1 ? std::vector<DType>{DType::Q4_1, DType::Q3_K, DType::Q5_0, DType::Q5_1}
        : mix == 2 ? std::vector<DType>{DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q6_K}
        : mix == 3 ? std::vector<DType>{DType::IQ4_XS, DType::IQ4_NL, DType::Q5_K, DType::Q4_1}
                   : std::vector<DType>{DType::MXFP4, DType::Q6_K, DType::IQ4_NL, DType::MXFP4};
    if (level > cpu::detect_simd_level()) return;
    // Large enough that threads_for gives each of 3 threads rows.
    const int cols = 1280;
    const int rows[] = {101, 67, 45, 23};
    const int count = int(types.size());
    std::vector<TestMatrix> matrices;
    for (int t = 0; t < count; ++t)
        matrices.push_back(make_block_matrix(rows[t], cols, types[t], rng));
    const std::vector<float> x = q8_k_test_input(cols, rng);
    const Q8K quantized = q8_k_by_rule(x);
    const std::vector<float> x_per_32 = quantized_like_the_kernel(x);
    std::vector<std::vector<float>> got(count);
    size_t work = 0;
    for (int t = 0; t < count; ++t) {
        got[t].assign(rows[t], NAN);
        work += size_t(rows[t]) * cols;
    }
    std::vector<cpu::MatvecTask> tasks;
    for (int t = 0; t < count; ++t) tasks.push_back({got[t].data(), x.data(), &matrices[t].matrix});
    const int saved_threads = omp_get_max_threads();
    omp_set_num_threads(threads);
    REQUIRE(cpu::threads_for(work) == threads);
    cpu::set_simd_level(level);
    if (count == 3)
        cpu::matvec_many({tasks[0], tasks[1], tasks[2]});
    else
        cpu::matvec_many({tasks[0], tasks[1], tasks[2], tasks[3]});
    cpu::set_simd_level(cpu::detect_simd_level());
    omp_set_num_threads(saved_threads);
    for (int t = 0; t < count; ++t) {
        const bool per_32 = block_weights(types[t]) == kSmallBlock;
        const std::vector<float>& x_used = level == cpu::SimdLevel::Scalar ? x
                                           : per_32                        ? x_per_32
                                                                           : quantized.dequantized;
        INFO(matrix_type_name(types[t])
             << " " << cpu::simd_level_name(level) << " threads " << threads);
        const std::vector<double> want = block_reference(matrices[t], x_used);
        // The scalar path sums 1280 f32 products in order; the SIMD paths' dot products are
        // integers, with a few f32 operations a super-block.
        const double tolerance = level == cpu::SimdLevel::Scalar ? 1e-5 : 1e-6;
        CHECK(worst_row_error(got[t], want, matrices[t], x_used, 0, rows[t]) < tolerance);
    }
}

TEST_CASE(
    "AVX2 super-block matvecs from tiles (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) equal the "
    "dequantized rows times Q8_K x") {
    if (cpu::detect_simd_level() < cpu::SimdLevel::Avx2) return;
    std::mt19937 rng(703);
    const auto dtype =
        GENERATE(DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS);
    check_block_tile_matvec(cpu::avx2::matvec_rows_block_tiles, "avx2", dtype, rng);
}

TEST_CASE("AVX2 i-quant matvecs equal the dequantized rows times Q8_K x") {
    if (cpu::detect_simd_level() < cpu::SimdLevel::Avx2) return;
    std::mt19937 rng(704);
    for (const DType dtype : kIqGridTypes)
        check_iq_matvec(cpu::avx2::matvec_rows_iq, "avx2", dtype, rng);
}

TEST_CASE("AVX2 ternary matvecs equal the dequantized rows times Q8_K x") {
    if (cpu::detect_simd_level() < cpu::SimdLevel::Avx2) return;
    std::mt19937 rng(705);
    for (const DType dtype : kTernaryTypes)
        check_iq_matvec(cpu::avx2::matvec_rows_iq, "avx2", dtype, rng);
}

TEST_CASE("AVX2 quantize_token quantizes each token exactly as quantize_q8") {
    if (cpu::detect_simd_level() < cpu::SimdLevel::Avx2) return;
    std::mt19937 rng(614);
    for (int cols : {1, 7, 8, 9, 16, 17, 31, 32, 33, 100, 600}) {
        INFO("cols " << cols);
        CHECK(quantize_token_difference(cpu::avx2::quantize_token, cols, rng) == "");
    }
}

TEST_CASE("AVX2 prefill GEMM of the block types matches a reference on quantized x") {
    if (cpu::detect_simd_level() < cpu::SimdLevel::Avx2) return;
    std::mt19937 rng(518);
    check_block_gemm(kBlockTypes, cpu::avx2::gemm_rows_blocks, "avx2", quantized_on_avx2, nullptr,
                     rng);
}

TEST_CASE("AVX2 prefill GEMM of the i-quants matches a reference on quantized x") {
    if (cpu::detect_simd_level() < cpu::SimdLevel::Avx2) return;
    std::mt19937 rng(527);
    check_block_gemm(kIqGridTypes, cpu::avx2::gemm_rows_blocks, "avx2", quantized_on_avx2, nullptr,
                     rng);
}

TEST_CASE("AVX2 prefill GEMM of the ternary types matches a reference on quantized x") {
    if (cpu::detect_simd_level() < cpu::SimdLevel::Avx2) return;
    std::mt19937 rng(528);
    check_block_gemm(kTernaryTypes, cpu::avx2::gemm_rows_blocks, "avx2", quantized_on_avx2, nullptr,
                     rng);
}

TEST_CASE("AVX2 Q4 prefill GEMM (vpmaddubsw) matches a reference on quantized x") {
    if (cpu::detect_simd_level() < cpu::SimdLevel::Avx2) return;
    std::mt19937 rng(626);
    // Rows off the 16-row panel, batches off the 3-token tile, columns of 1 to 19 blocks.
    for (int batch : {1, 2, 4, 17, 70})
        for (int cols : {32, 96, 608}) {
            const int rows = 43;
            TestMatrix m = make_matrix(rows, cols, DType::Q4_0, rng);
            // Each int16 sum of a group's vpmaddubsw pairs reaches its bound (16 × 15 × 127).
            set_extreme_q4_rows(&m);
            const std::vector<float> x = one_sign_tokens(batch, cols, rng);  // 15 × ±127
            const std::vector<double> want =
                reference_gemm(m, rows_quantized_like_the_kernel(x, cols), batch);
            const cpu::QuantizedBatch quantized = quantized_on_avx2(x, batch, cols);
            INFO("batch " << batch << " cols " << cols);
            // A run of rows not starting at row 0 (a thread's share) over three panels, and the
            // whole matrix, whose last panel runs past its rows.
            for (auto [first, count] : {std::pair{3, rows - 8}, {0, rows}}) {
                std::vector<float> got(size_t(batch) * rows, NAN);
                cpu::avx2::gemm_rows_q4(got.data(), m.matrix, quantized, first, count);
                check_row_run(got, want, batch, rows, first, count, 1e-6);
            }
        }
}
