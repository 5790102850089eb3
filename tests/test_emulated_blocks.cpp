// The block-type kernels (block_units.cuh, matvec_blocks.cuh, the block embedding of
// embedding.cuh and the f16 dequantization of dequantize.cuh), run on the CPU emulation of
// CUDA, against the scalar dequantization of src/weights/weight_blocks.cpp: the embedding and
// the f16 copy exactly, the matvecs times the input quantized by the CPU's quantizer of their
// type (cpu::quantize_q8, cpu::quantize_q8_k), in double. Random blocks whose f16 scales (d,
// dmin, m) are drawn across their range with both signs, rows not a multiple of a block's 16
// warps, rows of more units than a warp takes in one round, the matvecs' grid a block per row
// set and one wave of two blocks each taking several sets. The matvecs run under an
// EarlyLaunchCheck (dependent_launch.cuh): what the kernels ahead wrote reads as NaN until
// their finish_prologue.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/kernels.h"
#include "dequantize.cuh"
#include "embedding.cuh"
#include "emulated_inputs.h"
#include "gated_reference.h"
#include "matvec_blocks.cuh"
#include "test_block_matrices.h"
#include "weights/half.h"
#include "weights/weight_blocks.h"

using namespace barellm;
using namespace barellm::cuda;
using namespace barellm::test;

namespace {

constexpr float kEps = 1e-5f;
constexpr int kRowCounts[] = {1, 37, 70};
// Relative error allowed against the magnitude of a sum: f32 products and sums over a few
// thousand terms.
constexpr double kSumError = 2e-5;
constexpr double kTiny = 1e-6;

// A finite f16 of either sign: mostly of moderate size, some near the top of the range,
// some tiny (subnormal).
uint16_t random_scale(std::mt19937& rng) {
    std::uniform_int_distribution<int> kind(0, 9), sign(0, 1);
    std::uniform_real_distribution<float> moderate(1e-3f, 1.0f), large(1e3f, 6e4f);
    const int k = kind(rng);
    float magnitude = k < 7 ? moderate(rng) : k < 9 ? large(rng) : 6e-8f * float(1 + kind(rng));
    return float_to_half(sign(rng) ? -magnitude : magnitude);
}

// A matrix of block type `dtype` [rows, cols] in the device layout (each row's blocks
// padded to 16 bytes with a byte the kernels must not read into the result), random bytes
// with random f16 scales, and its weights as the scalar reference dequantizes them.
struct BlockMatrix {
    DType dtype;
    int rows, cols;
    size_t row_bytes;     // device row: 16-byte multiple
    size_t blocks_bytes;  // of the blocks in a row
    AlignedArray<uint8_t> bytes;
    std::vector<float> weights;  // [rows, cols]: dequantize_row
    std::vector<float> offsets;  // [rows, cols]: the part of each weight not times its q

    BlockMatrix(DType dtype_, int rows_, int cols_, std::mt19937& rng)
        : dtype(dtype_),
          rows(rows_),
          cols(cols_),
          row_bytes(DeviceMatrix{nullptr, dtype_, rows_, cols_, cols_}.row_bytes()),
          blocks_bytes(size_t(cols_) / block_weights(dtype_) * block_bytes(dtype_)),
          bytes(size_t(rows_) * row_bytes, uint8_t(0xa5)),
          weights(size_t(rows_) * cols_),
          offsets(size_t(rows_) * cols_, 0.0f) {
        std::uniform_int_distribution<int> byte(0, 255);
        const int blocks = cols / block_weights(dtype), n = block_weights(dtype);
        for (int r = 0; r < rows; ++r) {
            uint8_t* row = bytes.data() + r * row_bytes;
            for (size_t i = 0; i < blocks_bytes; ++i) row[i] = uint8_t(byte(rng));
            for (int b = 0; b < blocks; ++b) {
                uint8_t* block = row + size_t(b) * block_bytes(dtype);
                for (const size_t field : block_scale_offsets(dtype))
                    set_block_scale(dtype, block, field, random_scale(rng));
                record_offsets(block, &offsets[size_t(r) * cols + size_t(b) * n]);
            }
            dequantize_row(dtype, row, &weights[size_t(r) * cols], cols);
        }
    }

    float weight(int r, int c) const { return weights[size_t(r) * cols + c]; }
    // |w| plus its offset part: what the f32 error of a product with w scales with.
    double magnitude(int r, int c) const {
        return std::fabs(weight(r, c)) + 2.0 * std::fabs(offsets[size_t(r) * cols + c]);
    }

private:
    // The offset (min) part of each weight of a block: m (Q4_1, Q5_1), dmin · m_j (Q4_K,
    // Q5_K), dmin · m_i (Q2_K), none for the other types.
    void record_offsets(const uint8_t* block, float* out) const {
        auto half_at = [&](int offset) {
            uint16_t h;
            std::memcpy(&h, block + offset, 2);
            return half_to_float(h);
        };
        if (dtype == DType::Q4_1 || dtype == DType::Q5_1)
            for (int j = 0; j < kSmallBlock; ++j) out[j] = half_at(2);
        if (dtype == DType::Q4_K || dtype == DType::Q5_K)
            for (int j = 0; j < kSuperBlock / kSubBlock; ++j) {
                int scale, min;
                k_scale_min(block + 4, j, &scale, &min);
                for (int l = 0; l < kSubBlock; ++l) out[kSubBlock * j + l] = half_at(2) * min;
            }
        if (dtype == DType::Q2_K)
            for (int i = 0; i < kSuperBlock / kQ6SubBlock; ++i) {
                const int min = block[offsetof(BlockQ2_K, scales) + i] >> 4;
                for (int l = 0; l < kQ6SubBlock; ++l)
                    out[kQ6SubBlock * i + l] = half_at(offsetof(BlockQ2_K, dmin)) * min;
            }
    }
};

// `count` random non-zero floats in 16-byte aligned storage.
AlignedArray<float> aligned_floats(size_t count, std::mt19937& rng, float scale = 1.0f) {
    AlignedArray<float> out(count);
    const std::vector<float> drawn = random_floats(count, rng, scale);
    std::copy(drawn.begin(), drawn.end(), out.data());
    return out;
}

// The input as the kernels stage it: x * rsqrt(mean(x²) + eps) * norm_weight in f32 (the
// scale rounded to f32), or x.
std::vector<double> staged_input(const float* x, int n, const float* norm_weight) {
    std::vector<double> out(x, x + n);
    if (norm_weight == nullptr) return out;
    double squares = 0;
    for (int i = 0; i < n; ++i) squares += double(x[i]) * x[i];
    const float scale = float(1.0 / std::sqrt(squares / n + kEps));
    for (int i = 0; i < n; ++i) out[i] = x[i] * scale * norm_weight[i];
    return out;
}

// The input as a block-type matvec multiplies it: the staged input rounded to f32,
// quantized as the CPU's matvecs of type `dtype` quantize it (Q8 per 32 columns for the small
// blocks, Q8_K per 256 for the others), each value times its scale. With `normed`, slack[c]
// is one step of column c's scale where x · multiplier lies within kRoundingSlack of a
// rounding boundary (else 0): the kernel's f32 norm, a last bit away from the reference's,
// may round it the other way.
struct QuantizedInput {
    std::vector<double> x, slack;
};
constexpr double kRoundingSlack = 1e-3;

QuantizedInput quantized_input(DType dtype, const std::vector<double>& staged, bool normed) {
    const int n = int(staged.size());
    const std::vector<float> x(staged.begin(), staged.end());
    QuantizedInput out{std::vector<double>(n), std::vector<double>(n, 0.0)};
    std::vector<float> multipliers(n);
    if (block_weights(dtype) == kSmallBlock) {
        cpu::QuantizedVector q;
        cpu::quantize_q8(&q, x.data(), n);
        for (int c = 0; c < n; ++c) out.x[c] = double(q.values[c]) * q.scales[c / kQ8Group];
        for (int g = 0; g < n / kQ8Group; ++g) {
            float largest = 0.0f;
            for (int i = 0; i < kQ8Group; ++i)
                largest = std::max(largest, std::fabs(x[g * kQ8Group + i]));
            std::fill_n(&multipliers[g * kQ8Group], kQ8Group,
                        cpu::q8_group_scale(largest).multiplier);
        }
    } else {
        cpu::Q8KVector q;
        cpu::quantize_q8_k(&q, x.data(), n);
        for (int c = 0; c < n; ++c) out.x[c] = double(q.values[c]) * q.d[c / kSuperBlock];
        for (int b = 0; b < n / kSuperBlock; ++b) {
            const float inverse = q.d[b] == 0.0f ? 0.0f : 1.0f / q.d[b];
            std::fill_n(&multipliers[b * kSuperBlock], kSuperBlock, inverse);
        }
    }
    if (normed)
        for (int c = 0; c < n; ++c) {
            const double scaled = double(x[c]) * multipliers[c];
            const double from_half = std::fabs(scaled - std::floor(scaled) - 0.5);
            if (from_half < kRoundingSlack && multipliers[c] != 0.0f)
                out.slack[c] = 1.0 / std::fabs(multipliers[c]);
        }
    return out;
}

struct Sum {
    double value = 0, magnitude = 0, slack = 0;
};

Sum row_sum(const BlockMatrix& w, int r, const QuantizedInput& x) {
    Sum sum;
    for (int c = 0; c < w.cols; ++c) {
        sum.value += double(w.weight(r, c)) * x.x[c];
        sum.magnitude += w.magnitude(r, c) * std::fabs(x.x[c]);
        sum.slack += std::fabs(w.weight(r, c)) * x.slack[c];
    }
    return sum;
}

bool close_sum(double got, const Sum& want) {
    return std::fabs(got - want.value) <= kSumError * want.magnitude + want.slack + kTiny;
}

// act(gate) * up against sums with their magnitudes (kActivationSlope bounds act's slope).
bool close_gated(Activation activation, double got, const Sum& gate, const Sum& up) {
    const double act = activation_reference(activation, gate.value);
    const double want = act * up.value;
    const double bound = kSumError * (kActivationSlope * gate.magnitude * std::fabs(up.value) +
                                      std::fabs(act) * up.magnitude) +
                         kActivationSlope * gate.slack * std::fabs(up.value) +
                         std::fabs(act) * up.slack;
    return std::fabs(got - want) <= bound + kTiny * (1.0 + std::fabs(want));
}

struct Fusion {
    bool norm, bias, accumulate;
};
constexpr Fusion kFusions[] = {{false, false, false},
                               {true, false, false},
                               {false, true, false},
                               {false, false, true},
                               {true, true, true}};

// The grid of a block-type matvec: a block per row set, or (kOneWave) as if the GPU held
// kBlocksAtOnce blocks at once, so that a block takes several sets where there are more.
constexpr int kBlocksAtOnce = 2;
template <bool kOneWave>
dim3 block_matvec_grid(int rows) {
    return kOneWave ? quantized_matvec_grid(rows, 1, kBlocksAtOnce)
                    : quantized_matvec_grid(rows, 1);
}

template <DType D, bool kOneWave>
void check_block_matvec(int rows, int cols, const Fusion& f, std::mt19937& rng) {
    INFO(dtype_name(D) << ", " << rows << " x " << cols << ", one wave " << kOneWave << ", norm "
                       << f.norm << ", bias " << f.bias << ", accumulate " << f.accumulate);
    const BlockMatrix w(D, rows, cols, rng), w3(D, rows, cols, rng);
    AlignedArray<float> in = aligned_floats(size_t(cols), rng, 2.0f);
    const AlignedArray<float> norm = aligned_floats(size_t(cols), rng);
    const std::vector<float> bias = random_floats(size_t(rows), rng);
    const std::vector<float> old = random_floats(size_t(rows), rng);
    const float* norm_weight = f.norm ? norm.data() : nullptr;
    std::vector<float> out = f.accumulate ? old : std::vector<float>(size_t(rows), NAN);
    std::vector<float> swiglu(size_t(rows), NAN), geglu(size_t(rows), NAN);
    const dim3 grid = block_matvec_grid<kOneWave>(rows), block(kQuantizedMatvecThreads);
    const size_t shared = block_staging_bytes(cols);
    const auto kernel = f.accumulate ? block_matvec_kernel<D, kOneWave, true>
                                     : block_matvec_kernel<D, kOneWave, false>;
    {
        // The input and the outputs come from the kernels ahead (dependent_launch.cuh).
        const emulation::EarlyLaunchCheck ahead(
            {region_of(in), region_of(out), region_of(swiglu), region_of(geglu)});
        emulate_launch(grid, block, shared, kernel, out.data(), w.bytes.data(), rows, in.data(),
                       cols, norm_weight, kEps, f.bias ? bias.data() : nullptr);
        emulate_launch(grid, block, shared,
                       block_matvec_swiglu_kernel<D, kOneWave, Activation::Silu>, swiglu.data(),
                       w.bytes.data(), w3.bytes.data(), rows, in.data(), cols, norm.data(), kEps);
        emulate_launch(grid, block, shared,
                       block_matvec_swiglu_kernel<D, kOneWave, Activation::GeluTanh>, geglu.data(),
                       w.bytes.data(), w3.bytes.data(), rows, in.data(), cols, norm.data(), kEps);
    }

    const QuantizedInput x = quantized_input(D, staged_input(in.data(), cols, norm_weight), f.norm);
    const QuantizedInput normed =
        quantized_input(D, staged_input(in.data(), cols, norm.data()), /*normed=*/true);
    int wrong = 0;
    for (int r = 0; r < rows; ++r) {
        Sum want = row_sum(w, r, x);
        if (f.bias) want.value += bias[r], want.magnitude += std::fabs(bias[r]);
        if (f.accumulate) want.value += old[r], want.magnitude += std::fabs(old[r]);
        wrong += !close_sum(out[r], want);
        const Sum gate = row_sum(w, r, normed), up = row_sum(w3, r, normed);
        wrong += !close_gated(Activation::Silu, swiglu[r], gate, up);
        wrong += !close_gated(Activation::GeluTanh, geglu[r], gate, up);
    }
    CHECK(wrong == 0);
}

// Columns for each block type: one block, more units than a warp's lanes, and more than one
// round of kBlockMatvecUnroll units per lane (with a last round only partly filled), and
// rows past 4096 columns.
std::vector<int> columns_for(DType dtype) {
    if (block_weights(dtype) == kSmallBlock) return {32, 96 * 12, 32 * 71, 4160};
    return {256, 256 * 5, 256 * 9, 4352};
}

template <DType D>
void check_block_matvecs(std::mt19937& rng) {
    int n = 0;
    for (const int cols : columns_for(D))
        for (const int rows : kRowCounts) {
            check_block_matvec<D, false>(rows, cols, kFusions[n % 5], rng);
            check_block_matvec<D, true>(rows, cols, kFusions[n++ % 5], rng);
        }
}

template <typename Check>
void for_each_block_type(Check&& check) {
    for (const DType dtype : cuda_block_types()) with_block_dtype(dtype, [&](auto d) { check(d); });
}

}  // namespace

TEST_CASE("emulated block-type matvecs match the scalar dequantization times the CPU's int8 input",
          "[cuda_emulation][decode][blocks]") {
    std::mt19937 rng(57);
    for_each_block_type([&](auto d) { check_block_matvecs<decltype(d)::value>(rng); });
}

TEST_CASE("a unit's groups cover each column of its block once", "[cuda_emulation][blocks]") {
    // group_column's map: every column of a super-block (or block) belongs to exactly one
    // group of one unit.
    for_each_block_type([&](auto d) {
        constexpr DType D = decltype(d)::value;
        INFO(dtype_name(D));
        const int n = block_weights(D), units = n / kUnitWeights;
        std::vector<int> covered(size_t(n) * 2, 0);  // two blocks: the second's base too
        for (int unit = 0; unit < 2 * units; ++unit) {
            for (int g = 0; g < 2; ++g)
                for (int i = 0; i < kGroupWeights; ++i)
                    ++covered.at(size_t(group_column<D>(unit, g) + i));
        }
        CHECK(std::count(covered.begin(), covered.end(), 1) == 2 * n);
    });
}

TEST_CASE("emulated block-type embedding and f16 dequantization match the scalar dequantization",
          "[cuda_emulation][prefill][blocks]") {
    std::mt19937 rng(58);
    for_each_block_type([&](auto d) {
        constexpr DType D = decltype(d)::value;
        for (const int cols : columns_for(D)) {
            const int rows = 37;
            INFO(dtype_name(D) << ", " << rows << " x " << cols);
            const BlockMatrix w(D, rows, cols, rng);
            // The embedding of three tokens, the last row among them, scaled as Gemma's.
            const std::vector<int> tokens = {5, rows - 1, 0};
            const float scale = std::sqrt(float(cols));
            std::vector<float> x(tokens.size() * cols, NAN);
            emulate_launch(block_embedding_grid(cols, int(tokens.size())), dim3(kBlockRowsThreads),
                           0, block_embedding_kernel<D>, x.data(), w.bytes.data(), cols, scale,
                           tokens.data());
            int wrong = 0;
            for (size_t t = 0; t < tokens.size(); ++t)
                for (int c = 0; c < cols; ++c)
                    wrong += x[t * cols + c] != float(w.weight(tokens[t], c)) * scale;
            CHECK(wrong == 0);

            // Every weight rounded to f16 once.
            AlignedArray<uint16_t> f16(size_t(rows) * cols, uint16_t(0x7e00));
            emulate_launch(dequantize_block_rows_grid(rows, cols), dim3(kBlockRowsThreads), 0,
                           dequantize_block_rows_kernel<D>, f16.data(), w.bytes.data(), rows, cols);
            wrong = 0;
            for (int r = 0; r < rows; ++r)
                for (int c = 0; c < cols; ++c)
                    wrong += f16.data()[size_t(r) * cols + c] != float_to_half(w.weight(r, c));
            CHECK(wrong == 0);
        }
    });
}
