// The batched matvec of a server step with a few rows (kernels/matvec_rows.cuh) on the CUDA
// emulation, launched as matvec_rows launches it, against the scalar dequantization of every
// weight type it reads (f32, f16, bf16 as stored; Q8 and Q4 as integer times f16 scale,
// written here; ggml's block types by src/weights/weight_blocks.cpp's dequantize_row) times
// the inputs in double: every row count from 1 to 16, weight rows not a multiple of the 8
// warps of a block, columns not a multiple of 16-byte vectors, with bias and the residual add.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "emulated_inputs.h"
#include "matvec_rows.cuh"
#include "test_block_matrices.h"
#include "weights/weight_blocks.h"

using namespace barellm;
using namespace barellm::cuda;
using namespace barellm::test;

namespace {

constexpr int kWeightRows = 37;
constexpr double kSumError = 2e-5;  // relative to the sum of |products|: f32 sums

// A weight matrix in the device layout of `dtype` (kernels.h: DeviceMatrix), random, with
// its weights as the scalar dequantization gives them [rows, cols].
struct RowsMatrix {
    DType dtype;
    int rows, cols, pitch;
    AlignedArray<uint8_t> bytes;
    std::vector<uint16_t> scales;  // Q8, Q4: f16 [rows, pitch / 32]
    std::vector<double> weights;

    RowsMatrix(DType dtype_, int rows_, int cols_, std::mt19937& rng)
        : dtype(dtype_),
          rows(rows_),
          cols(cols_),
          pitch(padded_cols(cols_, dtype_)),
          bytes(size_t(rows_) *
                    DeviceMatrix{nullptr, dtype_, rows_, cols_, padded_cols(cols_, dtype_)}
                        .row_bytes(),
                0),
          weights(size_t(rows_) * cols_) {
        const size_t row_bytes = bytes.size() / rows;
        if (is_block_type(dtype)) {
            std::uniform_int_distribution<int> byte(0, 255);
            std::uniform_real_distribution<float> magnitude(0.01f, 1.0f);
            std::vector<float> row_weights(cols);
            for (int r = 0; r < rows; ++r) {
                uint8_t* row = bytes.data() + r * row_bytes;
                const size_t blocks = cols / block_weights(dtype);
                for (size_t i = 0; i < blocks * block_bytes(dtype); ++i)
                    row[i] = uint8_t(byte(rng));
                for (size_t b = 0; b < blocks; ++b)
                    for (const size_t field : block_scale_offsets(dtype)) {
                        const float scale = (rng() % 2 ? 1.0f : -1.0f) * magnitude(rng);
                        set_block_scale(dtype, row + b * block_bytes(dtype), field,
                                        float_to_half(scale));
                    }
                dequantize_row(dtype, row, row_weights.data(), cols);
                std::copy(row_weights.begin(), row_weights.end(), &weights[size_t(r) * cols]);
            }
        } else if (dtype == DType::Q8_0 || dtype == DType::Q4_0) {
            std::uniform_real_distribution<float> scale(0.002f, 0.03f);
            scales.resize(size_t(rows) * (pitch / kQuantizedBlock));
            for (uint16_t& s : scales) s = float_to_half(scale(rng));
            for (int r = 0; r < rows; ++r) {
                uint8_t* row = bytes.data() + r * row_bytes;
                for (int c = 0; c < cols; ++c) {
                    int q;
                    if (dtype == DType::Q8_0) {
                        do q = int(rng() % 255) - 127;
                        while (q == 0);
                        row[c] = uint8_t(int8_t(q));
                    } else {  // column j of a block of 32: byte j % 16, low nibble below 16
                        const int nibble = int(rng() % 16), within = c % 32;
                        q = nibble - kQ4Offset;
                        row[c / 32 * 16 + within % 16] |=
                            within < 16 ? uint8_t(nibble) : uint8_t(nibble << 4);
                    }
                    weights[size_t(r) * cols + c] =
                        q * double(half_to_float(scales[size_t(r) * (pitch / 32) + c / 32]));
                }
            }
        } else {
            PaddedRows values(rows, cols, dtype, rng);
            std::memcpy(bytes.data(), values.data(), bytes.size());
            std::copy(values.values.begin(), values.values.end(), weights.begin());
        }
    }
    double weight(int r, int c) const { return weights[size_t(r) * cols + c]; }
};

void check_matvec_rows(DType dtype, int cols, std::mt19937& rng) {
    const RowsMatrix w(dtype, kWeightRows, cols, rng);
    const int in_pitch = (cols + kQuantizedBlock - 1) / kQuantizedBlock * kQuantizedBlock;
    const int out_pitch = kWeightRows + 3;
    for (int count = 1; count <= kMatvecRowsMax; ++count) {
        const bool with_bias = count % 2 == 1, accumulate = count % 3 == 0;
        INFO(dtype_name(dtype) << ", " << count << " rows of " << cols << " columns, bias "
                               << with_bias << ", accumulate " << accumulate);
        AlignedArray<float> in(size_t(count) * in_pitch, 0.0f);  // zero padding
        const std::vector<float> drawn = random_floats(size_t(count) * cols, rng, 2.0f);
        for (int t = 0; t < count; ++t)
            std::copy_n(&drawn[size_t(t) * cols], cols, in.data() + size_t(t) * in_pitch);
        const std::vector<float> bias = random_floats(size_t(kWeightRows), rng);
        const std::vector<float> initial = random_floats(size_t(count) * out_pitch, rng);
        std::vector<float> out = initial;
        with_any_weight_dtype(dtype, [&](auto d) {
            emulate_launch(matvec_rows_grid<decltype(d)::value>(kWeightRows),
                           dim3(kMatvecRowsThreads), 0, matvec_rows_kernel<decltype(d)::value>,
                           out.data(), out_pitch, static_cast<const void*>(w.bytes.data()),
                           w.scales.empty() ? nullptr : w.scales.data(), kWeightRows, cols, w.pitch,
                           static_cast<const float*>(in.data()), in_pitch, count,
                           with_bias ? bias.data() : nullptr, accumulate);
        });
        int wrong = 0;
        for (int t = 0; t < count; ++t) {
            const float* x = in.data() + size_t(t) * in_pitch;
            for (int r = 0; r < kWeightRows; ++r) {
                double want = 0, magnitude = 0, largest = 0;
                for (int c = 0; c < cols; ++c)
                    largest = std::max(largest, std::fabs(w.weight(r, c)));
                for (int c = 0; c < cols; ++c) {
                    want += w.weight(r, c) * x[c];
                    // Block types add their offsets apart (scale · Σ q·x + offset · Σ x): an
                    // offset is bounded by the row's largest weight, twice.
                    const double offset_part = is_block_type(dtype) ? 2 * largest : 0.0;
                    magnitude += (std::fabs(w.weight(r, c)) + offset_part) * std::fabs(x[c]);
                }
                if (with_bias) want += bias[r];
                if (accumulate) want += initial[size_t(t) * out_pitch + r];
                const double got = out[size_t(t) * out_pitch + r];
                if (!(std::fabs(got - want) <=
                      kSumError * magnitude + 1e-6 * (1 + std::fabs(want))) &&
                    ++wrong <= 3) {
                    INFO("row " << t << ", weight row " << r << ": got " << got << ", want "
                                << want);
                    CHECK(false);
                }
            }
            for (int r = kWeightRows; r < out_pitch; ++r)  // beyond the rows: untouched
                wrong += out[size_t(t) * out_pitch + r] != initial[size_t(t) * out_pitch + r];
        }
        for (size_t i = size_t(count) * out_pitch; i < out.size(); ++i)
            wrong += out[i] != initial[i];
        CHECK(wrong == 0);
    }
}

}  // namespace

TEST_CASE("emulated matvec_rows of f32, f16, bf16, Q8 and Q4 weights matches double references",
          "[cuda_emulation][paged]") {
    std::mt19937 rng(62);
    for (const DType dtype : {DType::F32, DType::F16, DType::BF16, DType::Q8_0})
        for (const int cols : {43, 300}) check_matvec_rows(dtype, cols, rng);
    for (const int cols : {96, 1120}) check_matvec_rows(DType::Q4_0, cols, rng);
}

TEST_CASE("emulated matvec_rows of ggml's block types matches their scalar dequantization",
          "[cuda_emulation][paged][blocks]") {
    std::mt19937 rng(63);
    for (const DType dtype : cuda_block_types()) {
        const int block = block_weights(dtype);
        // More units than a warp's lanes for the small blocks; several super-blocks.
        for (const int cols : {block * 3, block == 32 ? 32 * 37 : 256 * 5})
            check_matvec_rows(dtype, cols, rng);
    }
}
