// The decode-path kernels (one token) run on the CUDA emulation, launched as their launch
// functions launch them, against double-precision references from the same rounded inputs:
// the embeddings (scaled, as Gemma's), the matvecs of every weight type (Q8/Q4 with int8
// products; RMSNorm fused, bias, residual, SwiGLU and GeGLU), RoPE with the cache write (q/k
// norm), the flash-decoding attention (splits merged by the last block, GQA, windows, q/k
// norm, Gemma 3's heads of 256), and the GPU ladder's simple kernels. Odd sizes throughout:
// rows 1, 37, 70; columns off the 16-byte vector and off the 32-column block; head_dim 8, 34,
// 64, 68, 72, 128, 130, 256. The matvecs and the attention, which may start before the
// kernel ahead of them ends (dependent_launch.cuh), run under an EarlyLaunchCheck: what the
// kernels ahead wrote reads as NaN until their finish_prologue.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "attention.cuh"
#include "attention_simple.cuh"
#include "cpu/kernels.h"  // quantize_q8
#include "elementwise_simple.cuh"
#include "embedding.cuh"
#include "emulated_inputs.h"
#include "gated_reference.h"
#include "matvec.cuh"
#include "matvec_quantized.cuh"
#include "matvec_simple.cuh"
#include "rope.cuh"

using namespace barellm;
using namespace barellm::cuda;
using namespace barellm::test;

namespace {

constexpr float kEps = 1e-5f;
constexpr int kRowCounts[] = {1, 37, 70};
// Relative error allowed against the magnitude of a sum (the sum of its terms' absolute
// values): f32 accumulation over a few hundred terms.
constexpr double kSumError = 1e-5;
constexpr double kTiny = 1e-6;

// `count` random non-zero floats in 16-byte aligned storage (the matvecs read float4s).
AlignedArray<float> aligned_floats(size_t count, std::mt19937& rng, float scale = 1.0f) {
    AlignedArray<float> out(count);
    const std::vector<float> drawn = random_floats(count, rng, scale);
    std::copy(drawn.begin(), drawn.end(), out.data());
    return out;
}

std::vector<float> nan_floats(size_t count) { return std::vector<float>(count, NAN); }

// RMSNorm's scale of x[n] in double.
double rms_scale_of(const float* x, int n) {
    double squares = 0;
    for (int i = 0; i < n; ++i) squares += double(x[i]) * x[i];
    return 1.0 / std::sqrt(squares / n + kEps);
}

// The matvec's input as a kernel stages it: x * scale * norm_weight with norm_weight, in f32
// as the kernels compute it (scale rounded to f32), or x itself.
std::vector<float> staged_input_f32(const float* x, int n, const float* norm_weight) {
    std::vector<float> out(x, x + n);
    if (norm_weight == nullptr) return out;
    const float scale = float(rms_scale_of(x, n));
    for (int i = 0; i < n; ++i) out[i] = x[i] * scale * norm_weight[i];
    return out;
}

// The same in double.
std::vector<double> normed_input(const float* x, int n, const float* norm_weight) {
    std::vector<double> out(x, x + n);
    if (norm_weight == nullptr) return out;
    const double scale = rms_scale_of(x, n);
    for (int i = 0; i < n; ++i) out[i] = x[i] * scale * norm_weight[i];
    return out;
}

// A value and the magnitude its error is measured against.
struct Sum {
    double value = 0, magnitude = 0;
    void add(double term) {
        value += term;
        magnitude += std::fabs(term);
    }
};

bool close_sum(double got, const Sum& want) {
    return std::fabs(got - want.value) <= kSumError * want.magnitude + kTiny;
}

// act(gate) * up against sums with their magnitudes (kActivationSlope bounds act's slope).
bool close_gated(Activation activation, double got, const Sum& gate, const Sum& up) {
    const double act = activation_reference(activation, gate.value);
    const double bound = kSumError * (kActivationSlope * gate.magnitude * std::fabs(up.value) +
                                      std::fabs(act) * up.magnitude);
    return std::fabs(got - act * up.value) <= bound + kTiny;
}

// ---- KV-cache elements

template <typename KvT>
KvT to_kv(float value) {
    if constexpr (std::is_same_v<KvT, float>)
        return value;
    else
        return __float2half_rn(value);
}

template <typename KvT>
double from_kv(KvT value) {
    if constexpr (std::is_same_v<KvT, float>)
        return value;
    else
        return half_to_float(value.bits);
}

// Half an ulp of the cache's element type, relative.
template <typename KvT>
double kv_rounding() {
    return std::is_same_v<KvT, float> ? 0.0 : std::ldexp(1.0, -11);
}

template <typename KvT>
bool close_kv(KvT got, double want, double f32_error) {
    return std::fabs(from_kv(got) - want) <=
           (kv_rounding<KvT>() + f32_error) * std::fabs(want) + f32_error;
}

// ---- RoPE

// Head vector x[head_dim] RMSNormed with norm (when given), then rotated at pos, in double.
std::vector<double> rope_reference(const float* x, int head_dim, const float* norm, int pos,
                                   const std::vector<float>& rope_table) {
    std::vector<double> v = normed_input(x, head_dim, norm);
    const int half = head_dim / 2;
    for (int j = 0; j < half; ++j) {
        const auto [cos_angle, sin_angle] = rope_cos_sin_reference(rope_table, j, pos);
        const double a = v[j], b = v[j + half];
        v[j] = a * cos_angle - b * sin_angle;
        v[j + half] = b * cos_angle + a * sin_angle;
    }
    return v;
}

constexpr double kRopeError = 1e-5;  // f32 rotation (and norm) of values up to ~2

// |got - want| within `error`, relative and absolute.
bool close(double got, double want, double error) {
    return std::fabs(got - want) <= error * std::fabs(want) + error;
}

}  // namespace

// ---- Embedding

TEST_CASE("emulated embedding kernels copy the token's row, scaled", "[cuda_emulation][decode]") {
    std::mt19937 rng(11);
    constexpr int kVocab = 9;
    for (const DType dtype : {DType::F32, DType::F16, DType::BF16})
        for (const int cols : {45, 72, 300})
            for (const float scale : {1.0f, std::sqrt(float(cols))}) {  // Gemma: sqrt(dim)
                PaddedRows table(kVocab, cols, dtype, rng);
                const int step[2] = {int(rng() % kVocab), 3};
                std::vector<float> x = nan_floats(size_t(cols));
                with_weight_dtype(dtype, [&](auto d) {
                    emulate_launch(embedding_grid(cols), dim3(kEmbeddingThreads), 0,
                                   embedding_kernel<decltype(d)::value>, x.data(), table.data(),
                                   cols, table.pitch, scale, step);
                });
                int wrong = 0;
                for (int i = 0; i < cols; ++i)  // one f32 product
                    wrong += x[i] != float(table.at(step[0], i)) * scale;
                INFO(dtype_name(dtype) << ", " << cols << " cols, scale " << scale);
                CHECK(wrong == 0);
            }
}

namespace {

// A Q8 (I8) or Q4 (U8) matrix laid out as DeviceMatrix says, with its integer weights and
// scales: values [rows, row_bytes], f16 scales [rows, pitch / 32]; the padding columns of
// a Q8 row are 0. Q8 values are non-zero in -127..127, Q4 nibbles 0..15.
struct QuantizedMatrix {
    DType dtype;
    int rows, cols, pitch;
    AlignedArray<uint8_t> values;
    std::vector<uint16_t> scales;
    std::vector<int> weights;  // [rows, cols] the signed integers (Q4: nibble - 8)

    QuantizedMatrix(DType dtype_, int rows_, int cols_, std::mt19937& rng)
        : dtype(dtype_),
          rows(rows_),
          cols(cols_),
          pitch(padded_cols(cols_, dtype_)),
          values(size_t(rows_) * (dtype_ == DType::Q4_0 ? pitch / 2 : pitch), 0),
          scales(size_t(rows_) * (pitch / kQuantizedBlock)),
          weights(size_t(rows_) * cols_) {
        std::uniform_real_distribution<float> scale_dist(0.002f, 0.03f);
        for (uint16_t& s : scales) s = float_to_half(scale_dist(rng));
        const size_t row_bytes = dtype == DType::Q4_0 ? size_t(pitch) / 2 : size_t(pitch);
        for (int r = 0; r < rows; ++r) {
            uint8_t* row = values.data() + size_t(r) * row_bytes;
            for (int c = 0; c < cols; ++c) {
                int& w = weights[size_t(r) * cols + c];
                if (dtype == DType::Q8_0) {
                    do w = int(rng() % 255) - 127;
                    while (w == 0);
                    row[c] = uint8_t(int8_t(w));
                } else {
                    const int nibble = int(rng() % 16);
                    w = nibble - kQ4Offset;
                    const int block = c / kQ4Block, within = c % kQ4Block;
                    uint8_t& byte = row[block * kQ4BlockBytes + within % kQ4BlockBytes];
                    byte |= within < kQ4BlockBytes ? uint8_t(nibble) : uint8_t(nibble << 4);
                }
            }
        }
    }
    int weight(int r, int c) const { return weights[size_t(r) * cols + c]; }
    double scale(int r, int c) const {
        return half_to_float(scales[size_t(r) * (pitch / kQuantizedBlock) + c / kQuantizedBlock]);
    }
};

}  // namespace

TEST_CASE("emulated quantized embedding is the integer weight times its block's scale",
          "[cuda_emulation][decode]") {
    std::mt19937 rng(12);
    constexpr int kVocab = 7;
    for (const DType dtype : {DType::Q8_0, DType::Q4_0})
        for (const int cols : {45, 96, 172, 64}) {
            if (dtype == DType::Q4_0 && cols % kQ4Block != 0) continue;
            const QuantizedMatrix table(dtype, kVocab, cols, rng);
            const int step[2] = {int(rng() % kVocab), 0};
            const float scale = cols == 64 ? 1.0f : std::sqrt(float(cols));  // Gemma: sqrt(dim)
            std::vector<float> x = nan_floats(size_t(cols));
            with_quantized_dtype(dtype, [&](auto d) {
                emulate_launch(embedding_grid(cols), dim3(kEmbeddingThreads), 0,
                               embedding_quantized_kernel<decltype(d)::value>, x.data(),
                               table.values.data(), table.scales.data(), cols, table.pitch, scale,
                               step);
            });
            int wrong = 0;
            for (int i = 0; i < cols; ++i)  // the f32 weight, then one f32 product
                wrong += x[i] != float(table.weight(step[0], i) * table.scale(step[0], i)) * scale;
            INFO(dtype_name(dtype) << ", " << cols << " cols, scale " << scale);
            CHECK(wrong == 0);
        }
}

// ---- Matvecs of f32, f16 and bf16 weights (matvec.cuh)

namespace {

// Which of the fused steps a matvec case uses.
struct Fusion {
    bool norm, bias, accumulate;
};
constexpr Fusion kFusions[] = {{false, false, false},
                               {true, false, false},
                               {false, true, false},
                               {false, false, true},
                               {true, true, true}};

// W[r, :] · in' (+ bias[r]) (+ old[r]) in double, in' the normed input.
template <typename Weight>
Sum row_sum(Weight weight, int r, int cols, const std::vector<double>& in, const float* bias,
            const float* old) {
    Sum sum;
    for (int c = 0; c < cols; ++c) sum.add(weight(r, c) * in[c]);
    if (bias != nullptr) sum.add(bias[r]);
    if (old != nullptr) sum.add(old[r]);
    return sum;
}

// The matvecs of the input `in` (random in [-input_scale, input_scale]) against double
// references.
template <DType D>
void check_matvec(int rows, int cols, const Fusion& f, std::mt19937& rng,
                  float input_scale = 2.0f) {
    INFO(dtype_name(D) << ", " << rows << " x " << cols << ", norm " << f.norm << ", bias "
                       << f.bias << ", accumulate " << f.accumulate << ", input up to "
                       << input_scale);
    PaddedRows w(rows, cols, D, rng), w3(rows, cols, D, rng);
    AlignedArray<float> in = aligned_floats(size_t(cols), rng, input_scale);
    const AlignedArray<float> norm = aligned_floats(size_t(cols), rng);
    const std::vector<float> bias = random_floats(size_t(rows), rng);
    const std::vector<float> old = random_floats(size_t(rows), rng);
    const float* norm_weight = f.norm ? norm.data() : nullptr;
    std::vector<float> out = f.accumulate ? old : nan_floats(size_t(rows));
    std::vector<float> swiglu = nan_floats(size_t(rows)), geglu = nan_floats(size_t(rows));
    const dim3 grid = matvec_grid(rows, w.pitch), block = matvec_block(w.pitch);
    const size_t shared = staged_input_bytes(w.pitch);
    {
        // The input and the outputs come from the kernels ahead (dependent_launch.cuh).
        const emulation::EarlyLaunchCheck ahead(
            {region_of(in), region_of(out), region_of(swiglu), region_of(geglu)});
        if (f.accumulate)
            emulate_launch(grid, block, shared, matvec_kernel<D, true>, out.data(), w.data(), rows,
                           w.pitch, in.data(), cols, norm_weight, kEps,
                           f.bias ? bias.data() : nullptr);
        else
            emulate_launch(grid, block, shared, matvec_kernel<D, false>, out.data(), w.data(), rows,
                           w.pitch, in.data(), cols, norm_weight, kEps,
                           f.bias ? bias.data() : nullptr);
        emulate_launch(grid, block, shared, matvec_swiglu_kernel<D, Activation::Silu>,
                       swiglu.data(), w.data(), w3.data(), rows, w.pitch, in.data(), cols,
                       norm.data(), kEps);
        emulate_launch(grid, block, shared, matvec_swiglu_kernel<D, Activation::GeluTanh>,
                       geglu.data(), w.data(), w3.data(), rows, w.pitch, in.data(), cols,
                       norm.data(), kEps);
    }

    const std::vector<double> x = normed_input(in.data(), cols, norm_weight);
    const std::vector<double> x_normed = normed_input(in.data(), cols, norm.data());
    auto w1_at = [&](int r, int c) { return w.at(r, c); };
    auto w3_at = [&](int r, int c) { return w3.at(r, c); };
    int wrong = 0;
    for (int r = 0; r < rows; ++r) {
        wrong += !close_sum(out[r], row_sum(w1_at, r, cols, x, f.bias ? bias.data() : nullptr,
                                            f.accumulate ? old.data() : nullptr));
        const Sum gate = row_sum(w1_at, r, cols, x_normed, nullptr, nullptr);
        const Sum up = row_sum(w3_at, r, cols, x_normed, nullptr, nullptr);
        wrong += !close_gated(Activation::Silu, swiglu[r], gate, up);
        wrong += !close_gated(Activation::GeluTanh, geglu[r], gate, up);
    }
    CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("emulated matvec and matvec_swiglu (SwiGLU, GeGLU) match double references",
          "[cuda_emulation][decode]") {
    std::mt19937 rng(13);
    int n = 0;
    for (const int cols : {45, 72, 136, 4100}) {  // 4100: 16 warps a block
        for (const int rows : kRowCounts) {
            const Fusion& f = kFusions[n++ % std::size(kFusions)];
            check_matvec<DType::F32>(rows, cols, f, rng);
            check_matvec<DType::F16>(rows, cols, f, rng);
            check_matvec<DType::BF16>(rows, cols, f, rng);
        }
    }
}

// ---- Q8 and Q4 matvecs (matvec_quantized.cuh)

namespace {

// W[r, :] · in' as the int8 kernels compute it: in' staged in f32 (staged_input_f32),
// quantized per block of 32 by the CPU's quantize_q8, the integer dot product of each
// block times the two scales.
Sum quantized_row_sum(const QuantizedMatrix& w, int r, const cpu::QuantizedVector& x) {
    Sum sum;
    for (int first = 0; first < w.cols; first += kQuantizedBlock) {
        long long dot = 0;
        for (int c = first; c < std::min(w.cols, first + kQuantizedBlock); ++c)
            dot += w.weight(r, c) * x.values[c];
        sum.add(double(dot) * w.scale(r, first) * x.scales[first / kQuantizedBlock]);
    }
    return sum;
}

// kOneWave: the grid of a GPU that holds kOneWaveBlocks blocks at once
// (quantized_matvec_grid), each block then taking several row sets; else a block per set.
constexpr int kOneWaveBlocks = 2;
template <DType D, bool kOneWave, int kRowsPerWarp>
void check_quantized_matvec(int rows, int cols, const Fusion& f, std::mt19937& rng) {
    INFO(dtype_name(D) << ", " << rows << " x " << cols << ", " << kRowsPerWarp
                       << " rows per warp, one wave " << kOneWave << ", norm " << f.norm
                       << ", bias " << f.bias << ", accumulate " << f.accumulate);
    const QuantizedMatrix w(D, rows, cols, rng), w3(D, rows, cols, rng);
    AlignedArray<float> in = aligned_floats(size_t(cols), rng, 2.0f);
    const AlignedArray<float> norm = aligned_floats(size_t(cols), rng);
    const std::vector<float> bias = random_floats(size_t(rows), rng);
    const std::vector<float> old = random_floats(size_t(rows), rng);
    const float* norm_weight = f.norm ? norm.data() : nullptr;
    const float* bias_or_null = f.bias ? bias.data() : nullptr;
    std::vector<float> out = f.accumulate ? old : nan_floats(size_t(rows));
    std::vector<float> swiglu = nan_floats(size_t(rows)), geglu = nan_floats(size_t(rows));
    const dim3 grid = quantized_matvec_grid(rows, kRowsPerWarp, kOneWave ? kOneWaveBlocks : 0),
               block(kQuantizedMatvecThreads);
    const size_t shared = quantized_staging_bytes(w.pitch);
    // The input and the outputs come from the kernels ahead (dependent_launch.cuh).
    const emulation::EarlyLaunchCheck ahead(
        {region_of(in), region_of(out), region_of(swiglu), region_of(geglu)});
    if (f.accumulate)
        emulate_launch(grid, block, shared,
                       quantized_matvec_kernel<D, kOneWave, true, kRowsPerWarp>, out.data(),
                       w.values.data(), w.scales.data(), rows, w.pitch, in.data(), cols,
                       norm_weight, kEps, bias_or_null);
    else
        emulate_launch(grid, block, shared,
                       quantized_matvec_kernel<D, kOneWave, false, kRowsPerWarp>, out.data(),
                       w.values.data(), w.scales.data(), rows, w.pitch, in.data(), cols,
                       norm_weight, kEps, bias_or_null);
    emulate_launch(grid, block, shared,
                   quantized_matvec_swiglu_kernel<D, kOneWave, kRowsPerWarp, Activation::Silu>,
                   swiglu.data(), w.values.data(), w.scales.data(), w3.values.data(),
                   w3.scales.data(), rows, w.pitch, in.data(), cols, norm.data(), kEps);
    emulate_launch(grid, block, shared,
                   quantized_matvec_swiglu_kernel<D, kOneWave, kRowsPerWarp, Activation::GeluTanh>,
                   geglu.data(), w.values.data(), w.scales.data(), w3.values.data(),
                   w3.scales.data(), rows, w.pitch, in.data(), cols, norm.data(), kEps);

    // The references: the product, then bias and residual in double.
    auto reference = [&](const QuantizedMatrix& m, int r, const float* norm_or_null) {
        const std::vector<float> staged = staged_input_f32(in.data(), cols, norm_or_null);
        cpu::QuantizedVector quantized;
        cpu::quantize_q8(&quantized, staged.data(), cols);
        return quantized_row_sum(m, r, quantized);
    };
    int wrong = 0;
    for (int r = 0; r < rows; ++r) {
        Sum want = reference(w, r, norm_weight);
        if (f.bias) want.add(bias[r]);
        if (f.accumulate) want.add(old[r]);
        wrong += !close_sum(out[r], want);
        const Sum gate = reference(w, r, norm.data()), up = reference(w3, r, norm.data());
        wrong += !close_gated(Activation::Silu, swiglu[r], gate, up);
        wrong += !close_gated(Activation::GeluTanh, geglu[r], gate, up);
    }
    CHECK(wrong == 0);
}

template <DType D>
void check_quantized_matvecs(const std::vector<int>& columns, std::mt19937& rng) {
    int n = 0;
    for (const int cols : columns)
        for (const int rows : kRowCounts) {
            const Fusion& f = kFusions[n++ % std::size(kFusions)];
            check_quantized_matvec<D, false, 1>(rows, cols, f, rng);
            check_quantized_matvec<D, false, 2>(rows, cols, f, rng);
            check_quantized_matvec<D, true, 1>(rows, cols, f, rng);
            check_quantized_matvec<D, true, 2>(rows, cols, f, rng);
        }
}

}  // namespace

TEST_CASE("a one-wave quantized matvec grid gives its blocks equal numbers of row sets",
          "[cuda_emulation][decode]") {
    // Mistral-7B's SwiGLU rows (14336, one row per warp: 896 sets of 16) on 132 SMs holding
    // two blocks each: 4 sets a block, 224 blocks.
    CHECK(quantized_matvec_grid(14336, 1, 264).x == 224);
    CHECK(quantized_matvec_grid(14336, 1).x == 896);
    // qkv (6144 rows, two per warp: 192 sets of 32) fits one wave of 264 as it is.
    CHECK(quantized_matvec_grid(6144, 2, 264).x == 192);
    // 70 rows: sets of 16 rows 5, at most 2 blocks: 3 sets and 2.
    CHECK(quantized_matvec_grid(70, 1, 2).x == 2);
    CHECK(quantized_matvec_grid(70, 1, 4).x == 3);
}

TEST_CASE("matvec takes one wave only where a block per row set would exceed it",
          "[cuda_emulation][decode]") {
    // 132 SMs holding two blocks each: 264 at once. Mistral-7B's SwiGLU (896 sets of 16
    // rows) and its 32000-row output matrix at two rows per warp (1000 sets of 32) exceed it.
    CHECK(quantized_takes_one_wave(14336, 1, 264));
    CHECK(quantized_takes_one_wave(32000, 2, 264));
    // qkv (192 sets of 32), wo and w2 (4096 rows, one per warp: 256 sets) fit as they are.
    CHECK_FALSE(quantized_takes_one_wave(6144, 2, 264));
    CHECK_FALSE(quantized_takes_one_wave(4096, 1, 264));
    // At the edge: 264 sets are one wave, 265 are not (4225 rows make 265 sets of 16).
    CHECK_FALSE(quantized_takes_one_wave(264 * 16, 1, 264));
    CHECK(quantized_takes_one_wave(264 * 16 + 1, 1, 264));
}

TEST_CASE("emulated Q8 matvecs match references", "[cuda_emulation][decode]") {
    std::mt19937 rng(14);
    check_quantized_matvecs<DType::Q8_0>({96, 160, 45, 172}, rng);
}

TEST_CASE("emulated Q4 matvecs match references", "[cuda_emulation][decode]") {
    std::mt19937 rng(15);
    check_quantized_matvecs<DType::Q4_0>({32, 96, 160}, rng);
}

// ---- RoPE with the KV-cache write (rope.cuh)

namespace {

struct HeadsCase {
    int heads, kv_heads, head_dim, pos;
    bool norms;
};
constexpr HeadsCase kHeadsCases[] = {
    {8, 4, 8, 0, false},  {8, 4, 8, 5, true},   {6, 2, 34, 70, true},
    {3, 3, 64, 5, false}, {5, 1, 72, 70, true}, {2, 1, 130, 9, true},
};

template <typename KvT>
void check_rope_kv(const HeadsCase& c, std::mt19937& rng) {
    INFO(c.heads << "/" << c.kv_heads << " heads of " << c.head_dim << ", pos " << c.pos
                 << ", norms " << c.norms << ", kv "
                 << (std::is_same_v<KvT, float> ? "f32" : "f16"));
    const int q_dim = c.heads * c.head_dim, kv_dim = c.kv_heads * c.head_dim;
    const int context = c.pos + 2;
    const std::vector<float> rope_table = test_rope_table(c.head_dim);
    const std::vector<float> qkv_in = random_floats(size_t(q_dim + 2 * kv_dim), rng, 2.0f);
    const std::vector<float> q_norm = random_floats(size_t(c.head_dim), rng);
    const std::vector<float> k_norm = random_floats(size_t(c.head_dim), rng);
    std::vector<float> qkv = qkv_in;
    KvT sentinel;
    std::memset(&sentinel, 0x55, sizeof sentinel);
    std::vector<KvT> keys(size_t(context) * kv_dim, sentinel), values(keys);
    const int step[2] = {1, c.pos};
    emulate_launch(rope_kv_grid(c.heads, c.kv_heads), dim3(kRopeThreads), 0, rope_kv_kernel<KvT>,
                   qkv.data(), rope_table.data(), keys.data(), values.data(), step, c.heads,
                   c.kv_heads, c.head_dim, c.norms ? q_norm.data() : nullptr,
                   c.norms ? k_norm.data() : nullptr, kEps);
    int wrong = 0;
    for (int h = 0; h < c.heads + c.kv_heads; ++h) {
        const bool is_q = h < c.heads;
        const float* norm = c.norms ? (is_q ? q_norm.data() : k_norm.data()) : nullptr;
        const std::vector<double> want =
            rope_reference(&qkv_in[size_t(h) * c.head_dim], c.head_dim, norm, c.pos, rope_table);
        const size_t row = size_t(c.pos) * kv_dim + size_t(h - c.heads) * c.head_dim;
        for (int i = 0; i < c.head_dim; ++i)
            wrong += is_q ? !close(qkv[size_t(h) * c.head_dim + i], want[i], kRopeError)
                          : !close_kv(keys[row + i], want[i], kRopeError);
    }
    for (int i = 0; i < kv_dim; ++i)  // v unchanged
        wrong += !close_kv(values[size_t(c.pos) * kv_dim + i], qkv_in[q_dim + kv_dim + i], 0.0);
    for (int i = q_dim; i < q_dim + 2 * kv_dim; ++i) wrong += qkv[i] != qkv_in[i];  // k, v kept
    wrong += cache_writes_outside(keys, values, sentinel, kv_dim, c.pos, c.pos);    // other rows
    CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("emulated rope_kv_kernel matches a double reference", "[cuda_emulation][decode]") {
    std::mt19937 rng(16);
    for (const HeadsCase& c : kHeadsCases) {
        check_rope_kv<float>(c, rng);
        check_rope_kv<__half>(c, rng);
    }
}

// ---- Flash-decoding attention (attention.cuh)

namespace {

struct AttentionCase {
    int heads, kv_heads, head_dim, pos, window, splits;
    bool norms;
    float magnitude;  // of the token's q, k, v and the cached keys: scores grow with its square
    float softcap = 0.0f;  // of the scores (Gemma 2), 0 for none
};

// The cache: random rows 0..pos-1 (attended ones) and NaN elsewhere, row pos written by the
// kernel; positions before the window are NaN too, so that a read outside the window shows.
template <typename KvT>
std::vector<KvT> attention_cache(int context, int kv_dim, int first, int pos, std::mt19937& rng,
                                 float magnitude) {
    const std::vector<float> drawn = random_floats(size_t(context) * kv_dim, rng, magnitude);
    std::vector<KvT> cache(drawn.size());
    for (int row = 0; row < context; ++row)
        for (int i = 0; i < kv_dim; ++i) {
            const size_t e = size_t(row) * kv_dim + i;
            cache[e] = to_kv<KvT>(row >= first && row < pos ? drawn[e] : NAN);
        }
    return cache;
}

// The attention scale of the cases: not 1/√head_dim, so that a kernel which recomputes that
// instead of taking the shape's scale fails.
double case_scale(int head_dim) { return 1.25 / std::sqrt(double(head_dim)); }

// Σ_t softmax(q · key(t) × case_scale, soft-capped where the case says)_t value(t) over the
// cache rows t = first..pos of query head h's KV head, in double; q [head_dim]. With a sink
// (sinks[h], sinks not empty) the softmax has one more logit, the sink, whose value is zero:
// p_t = e^(s_t) / (Σ_u e^(s_u) + e^(sink)).
template <typename KvT>
std::vector<double> attend(const std::vector<double>& q, int h, const AttentionCase& c,
                           const std::vector<KvT>& keys, const std::vector<KvT>& values, int first,
                           const std::vector<float>& sinks = {}) {
    const int head_dim = c.head_dim, kv_dim = c.kv_heads * head_dim;
    const size_t head_offset = size_t(h / (c.heads / c.kv_heads)) * head_dim;
    std::vector<double> p;
    for (int t = first; t <= c.pos; ++t) {
        double dot = 0;
        for (int d = 0; d < head_dim; ++d)
            dot += q[d] * from_kv(keys[size_t(t) * kv_dim + head_offset + d]);
        const double score = dot * float(case_scale(head_dim));
        p.push_back(c.softcap > 0 ? c.softcap * std::tanh(score / c.softcap) : score);
    }
    double largest = *std::max_element(p.begin(), p.end());
    if (!sinks.empty()) largest = std::max(largest, double(sinks[h]));
    double total = sinks.empty() ? 0.0 : std::exp(sinks[h] - largest);
    for (double& s : p) total += s = std::exp(s - largest);
    std::vector<double> out(head_dim);
    for (int d = 0; d < head_dim; ++d) {
        double mixed = 0;
        for (int t = first; t <= c.pos; ++t)
            mixed += p[t - first] * from_kv(values[size_t(t) * kv_dim + head_offset + d]);
        out[d] = mixed / total;
    }
    return out;
}

constexpr double kAttentionError = 1e-4;  // f32 scores, exp and sums; outputs up to ~2

// With sinks ([heads]; empty: none), shape.sinks points at them.
template <typename KvT>
void check_attention(const AttentionCase& c, std::mt19937& rng,
                     const std::vector<float>& sinks = {}) {
    INFO(c.heads << "/" << c.kv_heads << " heads of " << c.head_dim << ", pos " << c.pos
                 << ", window " << c.window << ", " << c.splits << " splits, norms " << c.norms
                 << ", softcap " << c.softcap << ", sinks " << !sinks.empty() << ", kv "
                 << (std::is_same_v<KvT, float> ? "f32" : "f16"));
    AttentionShape shape{c.heads,  c.kv_heads, c.head_dim, c.window, float(case_scale(c.head_dim)),
                         c.softcap};
    if (!sinks.empty()) shape.sinks = sinks.data();
    const int head_dim = c.head_dim, q_dim = c.heads * head_dim, kv_dim = c.kv_heads * head_dim;
    const int context = c.pos + 3, first = attention_start(c.pos, c.window);
    const std::vector<float> rope_table = test_rope_table(head_dim);
    std::vector<float> qkv = random_floats(size_t(q_dim + 2 * kv_dim), rng, c.magnitude);
    const std::vector<float> q_norm = random_floats(size_t(head_dim), rng);
    const std::vector<float> k_norm = random_floats(size_t(head_dim), rng);
    std::vector<KvT> keys = attention_cache<KvT>(context, kv_dim, first, c.pos, rng, c.magnitude);
    std::vector<KvT> values = attention_cache<KvT>(context, kv_dim, first, c.pos, rng, 2.0f);
    const std::vector<KvT> keys_before = keys, values_before = values;
    std::vector<float> out = nan_floats(size_t(q_dim));
    std::vector<float> partial_out = nan_floats(size_t(c.heads) * c.splits * head_dim);
    std::vector<float> partial_stats = nan_floats(size_t(c.heads) * c.splits * 2);
    std::vector<unsigned> arrivals(size_t(c.kv_heads) * attention_head_blocks(c.heads, c.kv_heads),
                                   0);
    const int step[2] = {1, c.pos};
    const AttentionArgs args =
        attention_args(out.data(), qkv.data(), rope_table.data(), c.norms ? q_norm.data() : nullptr,
                       c.norms ? k_norm.data() : nullptr, kEps, keys.data(), values.data(), step,
                       partial_out.data(), partial_stats.data(), arrivals.data(), shape, c.splits);
    {
        // All but the weights, the RoPE frequencies and the step come from kernels ahead
        // (dependent_launch.cuh).
        const emulation::EarlyLaunchCheck ahead({region_of(qkv), region_of(keys), region_of(values),
                                                 region_of(out), region_of(partial_out),
                                                 region_of(partial_stats), region_of(arrivals)});
        with_attention_head_dim_max(head_dim, [&](auto head_dim_max) {
            emulate_launch(attention_grid(c.splits, c.heads, c.kv_heads), dim3(kAttentionThreads),
                           0, attention_split_kernel<KvT, decltype(head_dim_max)::value>, args);
        });
    }

    int wrong = 0;
    // Row pos: the normed, rotated key and the value; no other row written.
    for (int kv_head = 0; kv_head < c.kv_heads; ++kv_head) {
        const std::vector<double> key =
            rope_reference(&qkv[q_dim + size_t(kv_head) * head_dim], head_dim,
                           c.norms ? k_norm.data() : nullptr, c.pos, rope_table);
        for (int d = 0; d < head_dim; ++d) {
            const size_t e = size_t(c.pos) * kv_dim + size_t(kv_head) * head_dim + d;
            wrong += !close_kv(keys[e], key[d], kRopeError);
            wrong +=
                !close_kv(values[e], qkv[q_dim + kv_dim + size_t(kv_head) * head_dim + d], 0.0);
        }
    }
    for (size_t e = 0; e < keys.size(); ++e) {
        if (e / kv_dim == size_t(c.pos)) continue;
        wrong += std::memcmp(&keys[e], &keys_before[e], sizeof(KvT)) != 0;
        wrong += std::memcmp(&values[e], &values_before[e], sizeof(KvT)) != 0;
    }
    // The output from q normed and rotated in double, over the rows as stored (row pos as the
    // kernel stored it, checked above).
    for (int h = 0; h < c.heads; ++h) {
        const std::vector<double> q =
            rope_reference(&qkv[size_t(h) * head_dim], head_dim, c.norms ? q_norm.data() : nullptr,
                           c.pos, rope_table);
        const std::vector<double> want = attend(q, h, c, keys, values, first, sinks);
        for (int d = 0; d < head_dim; ++d)
            wrong += !close(out[size_t(h) * head_dim + d], want[d], kAttentionError);
    }
    CHECK(wrong == 0);
    // Every counter back at zero, for the next launch.
    CHECK(std::count(arrivals.begin(), arrivals.end(), 0u) == std::ptrdiff_t(arrivals.size()));
}

constexpr AttentionCase kAttentionCases[] = {
    {8, 4, 8, 0, 0, 1, false, 2.0f},       // the first token
    {8, 4, 8, 5, 0, 3, true, 2.0f},        // two empty splits
    {6, 2, 34, 70, 0, 3, false, 2.0f},     // three splits merged
    {12, 2, 64, 70, 0, 4, true, 2.0f},     // head groups of 4 and 2; split 3 empty
    {12, 2, 64, 70, 50, 2, false, 2.0f},   // a window over two splits
    {4, 4, 34, 70, 16, 3, true, 2.0f},     // a window inside one split
    {5, 1, 72, 150, 0, 5, true, 2.0f},     // kHeadDimMax 128, five splits
    {8, 2, 64, 150, 0, 1, false, 2.0f},    // one split of three tiles (the online softmax)
    {2, 1, 130, 40, 0, 2, true, 2.0f},     // kHeadDimMax 256
    {4, 1, 256, 600, 512, 4, true, 2.0f},  // Gemma 3 1B's heads, its window of 512
    {8, 2, 64, 150, 0, 5, false, 12.0f},   // scores past 88: exp overflows without the max
    {16, 4, 128, 200, 0, 3, true, 2.0f},   // Mistral's heads: splits of two tiles
    {4, 2, 68, 90, 0, 1, false, 2.0f},     // f16 keys in pieces (68 not a multiple of 8)
    // Gemma 2's soft-capped scores, a cap below the largest so that it bends them: 2B's heads
    // (8 of 256 over 4), sliding over splits, and a cap small enough to flatten most scores.
    {8, 4, 256, 300, 100, 3, false, 2.0f, 2.5f},
    {6, 2, 34, 70, 0, 3, false, 4.0f, 0.75f},
};

}  // namespace

TEST_CASE("emulated attention_split_kernel matches a double reference",
          "[cuda_emulation][decode]") {
    std::mt19937 rng(17);
    for (const AttentionCase& c : kAttentionCases) {
        check_attention<float>(c, rng);
        check_attention<__half>(c, rng);
    }
}

namespace {

// gpt-oss's attention sinks, one per query head, against scores of about ±`spread`: heads
// in turn far above every score (the sink takes nearly all the probability), far below (it
// takes almost none), and among them.
std::vector<float> test_sinks(int heads, float spread, std::mt19937& rng) {
    std::vector<float> sinks = random_floats(size_t(heads), rng, spread);
    for (int h = 0; h < heads; ++h)
        if (h % 3 == 0)
            sinks[h] += 3 * spread;
        else if (h % 3 == 1)
            sinks[h] -= 3 * spread;
    return sinks;
}

}  // namespace

TEST_CASE("emulated attention_split_kernel with attention sinks matches a double reference",
          "[cuda_emulation][decode]") {
    std::mt19937 rng(23);
    // Splits merged, a lone split, GQA groups of 5 and windows (gpt-oss's sliding layers);
    // heads 5 and head_dim 72 and 80 off every tile; scores past 88 with sinks past them.
    const AttentionCase cases[] = {
        {8, 4, 8, 0, 0, 1, false, 2.0f},        // the first token: a lone split
        {5, 1, 72, 150, 0, 5, false, 2.0f},     // five splits merged
        {10, 2, 80, 130, 128, 3, false, 2.0f},  // gpt-oss's window of 128, head groups of 4 and 1
        {5, 5, 64, 70, 0, 1, false, 2.0f},      // one split of two tiles
        {8, 2, 64, 150, 0, 5, false, 12.0f},    // scores and sinks past 88
        {6, 2, 34, 70, 0, 3, false, 4.0f, 0.75f},  // soft-capped scores; the sinks are not
    };
    for (const AttentionCase& c : cases) {
        const float spread = c.magnitude * c.magnitude;
        const std::vector<float> sinks = test_sinks(c.heads, spread, rng);
        check_attention<float>(c, rng, sinks);
        check_attention<__half>(c, rng, sinks);
    }
}

// ---- The GPU ladder's simple kernels (attention_simple.cuh, matvec_simple.cuh,
// elementwise_simple.cuh)

namespace {

template <typename KvT>
void check_attention_naive(const AttentionCase& c, std::mt19937& rng) {
    INFO(c.heads << "/" << c.kv_heads << " heads of " << c.head_dim << ", pos " << c.pos
                 << ", window " << c.window << ", softcap " << c.softcap << ", kv "
                 << (std::is_same_v<KvT, float> ? "f32" : "f16"));
    const int head_dim = c.head_dim, q_dim = c.heads * head_dim, kv_dim = c.kv_heads * head_dim;
    const int context = c.pos + 3, first = attention_start(c.pos, c.window);
    const std::vector<float> q = random_floats(size_t(q_dim), rng, c.magnitude);
    // Row pos is attended too: here it is already in the cache.
    const std::vector<KvT> keys =
        attention_cache<KvT>(context, kv_dim, first, c.pos + 1, rng, c.magnitude);
    const std::vector<KvT> values =
        attention_cache<KvT>(context, kv_dim, first, c.pos + 1, rng, 2.0f);
    std::vector<float> out = nan_floats(size_t(q_dim));
    std::vector<float> scores = nan_floats(size_t(c.heads) * context);
    const int step[2] = {1, c.pos};
    emulate_launch(dim3(c.heads), dim3(kNaiveAttentionThreads), 0, attention_naive_kernel<KvT>,
                   out.data(), q.data(), keys.data(), values.data(), step, scores.data(), context,
                   c.heads, c.kv_heads, head_dim, c.window, float(case_scale(head_dim)), c.softcap);
    // The reference from q as given (this kernel takes it rotated already).
    int wrong = 0;
    for (int h = 0; h < c.heads; ++h) {
        const std::vector<double> want =
            attend(std::vector<double>(q.begin() + size_t(h) * head_dim,
                                       q.begin() + size_t(h + 1) * head_dim),
                   h, c, keys, values, first);
        for (int d = 0; d < head_dim; ++d)
            wrong += !close(out[size_t(h) * head_dim + d], want[d], kAttentionError);
    }
    CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("emulated attention_naive_kernel matches a double reference",
          "[cuda_emulation][decode]") {
    std::mt19937 rng(18);
    for (const AttentionCase& c : kAttentionCases) {
        check_attention_naive<float>(c, rng);
        check_attention_naive<__half>(c, rng);
    }
}

namespace {

template <DType D>
void check_simple_matvecs(int rows, int cols, const Fusion& f, std::mt19937& rng) {
    INFO(dtype_name(D) << ", " << rows << " x " << cols << ", norm " << f.norm << ", bias "
                       << f.bias << ", accumulate " << f.accumulate);
    PaddedRows w(rows, cols, D, rng), w3(rows, cols, D, rng);
    const std::vector<float> in = random_floats(size_t(cols), rng, 2.0f);
    const std::vector<float> norm = random_floats(size_t(cols), rng);
    const std::vector<float> bias = random_floats(size_t(rows), rng);
    const std::vector<float> old = random_floats(size_t(rows), rng);
    const float* norm_weight = f.norm ? norm.data() : nullptr;
    const float* bias_or_null = f.bias ? bias.data() : nullptr;
    std::vector<float> plain = nan_floats(size_t(rows));
    std::vector<float> fused = f.accumulate ? old : nan_floats(size_t(rows));
    std::vector<float> gated = nan_floats(size_t(rows));
    emulate_launch(matvec_thread_per_row_grid(rows), dim3(kSimpleMatvecThreads), 0,
                   matvec_thread_per_row_kernel<D>, plain.data(), w.data(), rows, w.pitch,
                   in.data(), cols);
    const dim3 grid = matvec_warp_per_row_grid(rows);
    if (f.accumulate)
        emulate_launch(grid, dim3(kSimpleMatvecThreads), 0, matvec_warp_per_row_kernel<D, true>,
                       fused.data(), w.data(), rows, w.pitch, in.data(), cols, norm_weight, kEps,
                       bias_or_null);
    else
        emulate_launch(grid, dim3(kSimpleMatvecThreads), 0, matvec_warp_per_row_kernel<D, false>,
                       fused.data(), w.data(), rows, w.pitch, in.data(), cols, norm_weight, kEps,
                       bias_or_null);
    emulate_launch(grid, dim3(kSimpleMatvecThreads), 0, matvec_swiglu_warp_per_row_kernel<D>,
                   gated.data(), w.data(), w3.data(), rows, w.pitch, in.data(), cols, norm.data(),
                   kEps);

    const std::vector<double> x = normed_input(in.data(), cols, nullptr);
    const std::vector<double> x_fused = normed_input(in.data(), cols, norm_weight);
    const std::vector<double> x_normed = normed_input(in.data(), cols, norm.data());
    auto w1_at = [&](int r, int c) { return w.at(r, c); };
    auto w3_at = [&](int r, int c) { return w3.at(r, c); };
    int wrong = 0;
    for (int r = 0; r < rows; ++r) {
        wrong += !close_sum(plain[r], row_sum(w1_at, r, cols, x, nullptr, nullptr));
        wrong += !close_sum(fused[r], row_sum(w1_at, r, cols, x_fused, bias_or_null,
                                              f.accumulate ? old.data() : nullptr));
        wrong += !close_gated(Activation::Silu, gated[r],
                              row_sum(w1_at, r, cols, x_normed, nullptr, nullptr),
                              row_sum(w3_at, r, cols, x_normed, nullptr, nullptr));
    }
    CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("emulated ladder matvecs match double references", "[cuda_emulation][decode]") {
    std::mt19937 rng(19);
    int n = 0;
    for (const int cols : {45, 72, 136})
        for (const int rows : {1, 37, 70, 130}) {  // 130: two blocks of thread_per_row
            const Fusion& f = kFusions[n++ % std::size(kFusions)];
            check_simple_matvecs<DType::F32>(rows, cols, f, rng);
            check_simple_matvecs<DType::F16>(rows, cols, f, rng);
            check_simple_matvecs<DType::BF16>(rows, cols, f, rng);
        }
}

TEST_CASE(
    "emulated rmsnorm, residual_add and swiglu kernels (SwiGLU, GeGLU, gpt-oss's) match double "
    "references",
    "[cuda_emulation][decode]") {
    std::mt19937 rng(20);
    for (const int n : {45, 300, 1000}) {
        INFO(n << " elements");
        const std::vector<float> x = random_floats(size_t(n), rng, 3.0f);
        const std::vector<float> y = random_floats(size_t(n), rng);
        const std::vector<float> weight = random_floats(size_t(n), rng);
        std::vector<float> normed = nan_floats(size_t(n)), sum = x, swiglu = x, geglu = x,
                           swiglu_oai = x;
        emulate_launch(dim3(1), dim3(kElementwiseThreads), 0, rmsnorm_kernel, normed.data(),
                       x.data(), weight.data(), n, kEps);
        emulate_launch(elementwise_grid(n), dim3(kElementwiseThreads), 0, residual_add_kernel,
                       sum.data(), y.data(), n);
        emulate_launch(elementwise_grid(n), dim3(kElementwiseThreads), 0,
                       swiglu_kernel<Activation::Silu>, swiglu.data(), y.data(), n, 0.0f);
        emulate_launch(elementwise_grid(n), dim3(kElementwiseThreads), 0,
                       swiglu_kernel<Activation::GeluTanh>, geglu.data(), y.data(), n, 0.0f);
        emulate_launch(elementwise_grid(n), dim3(kElementwiseThreads), 0,
                       swiglu_kernel<Activation::SwigluOai>, swiglu_oai.data(), y.data(), n,
                       float(kTestSwigluLimit));
        const std::vector<double> want = normed_input(x.data(), n, weight.data());
        int wrong = 0;
        for (int i = 0; i < n; ++i) {
            wrong += !close(normed[i], want[i], 1e-6);
            wrong += sum[i] != x[i] + y[i];  // one f32 addition
            wrong += !close(swiglu[i], activation_reference(Activation::Silu, x[i]) * y[i], 1e-6);
            wrong +=
                !close(geglu[i], activation_reference(Activation::GeluTanh, x[i]) * y[i], 1e-6);
            wrong +=
                !close(swiglu_oai[i],
                       gated_reference(Activation::SwigluOai, x[i], y[i], kTestSwigluLimit), 1e-6);
        }
        CHECK(wrong == 0);
    }
}

namespace {

// Inputs whose squares overflow f32 (|x| up to 1e38, squares up to 1e76): a sum of them in
// f32 is infinite, and the RMSNorms must sum them again (kRmsRescue) instead of scaling
// everything to 0.
constexpr float kOverflowingInput = 1e38f;

// Whether the f32 sum of the squares of x[n] overflows (the case the tests below are for).
bool squares_overflow_f32(const float* x, int n) {
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) sum += x[i] * x[i];
    return std::isinf(sum);
}

}  // namespace

TEST_CASE("emulated RMSNorms of inputs whose squares overflow f32 match double references",
          "[cuda_emulation][decode]") {
    std::mt19937 rng(22);
    for (const int n : {45, 1000, 4100}) {
        INFO(n << " elements");
        const std::vector<float> x = random_floats(size_t(n), rng, kOverflowingInput);
        REQUIRE(squares_overflow_f32(x.data(), n));
        const std::vector<float> weight = random_floats(size_t(n), rng);
        std::vector<float> normed = nan_floats(size_t(n));
        emulate_launch(dim3(1), dim3(kElementwiseThreads), 0, rmsnorm_kernel, normed.data(),
                       x.data(), weight.data(), n, kEps);
        const std::vector<double> want = normed_input(x.data(), n, weight.data());
        int wrong = 0;
        for (int i = 0; i < n; ++i) wrong += !close(normed[i], want[i], 1e-6);
        CHECK(wrong == 0);
        // The matvecs' fused RMSNorm (stage_input), on the rows of one block and of several.
        for (const int rows : kRowCounts)
            check_matvec<DType::F32>(rows, n, {true, true, false}, rng, kOverflowingInput);
    }
    // The q/k head norms: 3 q heads and 1 k head.
    for (const int head_dim : {34, 72, 130}) {
        INFO("head_dim " << head_dim);
        const int heads = 3, kv_heads = 1, count = (heads + kv_heads) * head_dim;
        const std::vector<float> qk = random_floats(size_t(count), rng, kOverflowingInput);
        const std::vector<float> q_norm = random_floats(size_t(head_dim), rng);
        const std::vector<float> k_norm = random_floats(size_t(head_dim), rng);
        std::vector<float> normed = qk;
        emulate_launch(rmsnorm_heads_grid(heads, kv_heads), dim3(kElementwiseThreads), 0,
                       rmsnorm_heads_kernel, normed.data(), q_norm.data(), k_norm.data(), heads,
                       kv_heads, head_dim, kEps);
        int wrong = 0;
        for (int h = 0; h < heads + kv_heads; ++h) {
            const float* x = &qk[size_t(h) * head_dim];
            REQUIRE(squares_overflow_f32(x, head_dim));
            const std::vector<double> want =
                normed_input(x, head_dim, h < heads ? q_norm.data() : k_norm.data());
            for (int i = 0; i < head_dim; ++i)
                wrong += !close(normed[size_t(h) * head_dim + i], want[i], 1e-6);
        }
        CHECK(wrong == 0);
    }
}

TEST_CASE("emulated rmsnorm_heads, rope and store_kv_row kernels match double references",
          "[cuda_emulation][decode]") {
    std::mt19937 rng(21);
    for (const HeadsCase& c : kHeadsCases) {
        INFO(c.heads << "/" << c.kv_heads << " heads of " << c.head_dim << ", pos " << c.pos);
        const int q_dim = c.heads * c.head_dim, kv_dim = c.kv_heads * c.head_dim;
        const int rotated = q_dim + kv_dim;
        const std::vector<float> rope_table = test_rope_table(c.head_dim);
        const std::vector<float> qkv = random_floats(size_t(rotated + kv_dim), rng, 2.0f);
        const std::vector<float> q_norm = random_floats(size_t(c.head_dim), rng);
        const std::vector<float> k_norm = random_floats(size_t(c.head_dim), rng);
        std::vector<float> normed = qkv, rope = qkv;
        const int step[2] = {1, c.pos};
        emulate_launch(rmsnorm_heads_grid(c.heads, c.kv_heads), dim3(kElementwiseThreads), 0,
                       rmsnorm_heads_kernel, normed.data(), q_norm.data(), k_norm.data(), c.heads,
                       c.kv_heads, c.head_dim, kEps);
        emulate_launch(rope_grid(c.heads, c.kv_heads, c.head_dim), dim3(kElementwiseThreads), 0,
                       rope_kernel, rope.data(), rope_table.data(), step, c.heads + c.kv_heads,
                       c.head_dim);
        int wrong = 0;
        for (int h = 0; h < c.heads + c.kv_heads; ++h) {
            const float* x = &qkv[size_t(h) * c.head_dim];
            const float* norm = h < c.heads ? q_norm.data() : k_norm.data();
            const std::vector<double> want_norm = normed_input(x, c.head_dim, norm);
            const std::vector<double> want_rope =
                rope_reference(x, c.head_dim, nullptr, c.pos, rope_table);
            for (int i = 0; i < c.head_dim; ++i) {
                wrong += !close(normed[size_t(h) * c.head_dim + i], want_norm[i], 1e-6);
                wrong += !close(rope[size_t(h) * c.head_dim + i], want_rope[i], kRopeError);
            }
        }
        for (int i = rotated; i < rotated + kv_dim; ++i)  // v untouched
            wrong += normed[i] != qkv[i] || rope[i] != qkv[i];
        CHECK(wrong == 0);

        // The cache write of k and v (here: the two halves after q).
        const int context = c.pos + 2;
        auto check_store = [&](auto element) {
            using KvT = decltype(element);
            KvT sentinel;
            std::memset(&sentinel, 0x55, sizeof sentinel);
            std::vector<KvT> keys(size_t(context) * kv_dim, sentinel), values(keys);
            emulate_launch(elementwise_grid(kv_dim), dim3(kElementwiseThreads), 0,
                           store_kv_row_kernel<KvT>, &qkv[q_dim], &qkv[rotated], keys.data(),
                           values.data(), step, kv_dim);
            int bad = 0;
            for (size_t e = 0; e < keys.size(); ++e) {
                const int row = int(e / kv_dim), i = int(e % kv_dim);
                if (row == c.pos) {
                    bad += !close_kv(keys[e], qkv[q_dim + i], 0.0);
                    bad += !close_kv(values[e], qkv[rotated + i], 0.0);
                } else {
                    bad += std::memcmp(&keys[e], &sentinel, sizeof sentinel) != 0;
                    bad += std::memcmp(&values[e], &sentinel, sizeof sentinel) != 0;
                }
            }
            CHECK(bad == 0);
        };
        check_store(float{});
        check_store(__half{});
    }
}
