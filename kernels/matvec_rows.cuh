// Matrix products of a few input rows (kernels.h, matvec_rows): the server's step with 2 to
// 15 rows, where a GEMM's tiles would sit mostly empty. Each weight is read and dequantized
// in registers once and dotted with every input row, so a step of n rows reads the weights
// once, as one decode token does.
//
// - One warp per kWarpRows weight rows (4 of f32, f16, bf16; 2 of Q8, Q4 and the block
//   types, whose dequantized weights take more registers), 8 warps a block. Lane l takes the
//   16-byte vectors l, l + 32, ... of each of its rows (f32, f16, bf16: 4 or 8 weights; Q8:
//   16 int8 weights of one block of 32, times its f16 scale; Q4: a whole block of 32, low
//   nibbles columns 0..15, high nibbles 16..31) or, for ggml's block types, units l, l + 32,
//   ... of 32 weights (block_units.cuh: load_unit, decode_unit).
// - The inputs stay f32 in global memory (L1 and L2 serve them to every warp of the block):
//   row t of in [count, in_pitch], zero in its padding columns. A lane reads the columns of
//   its vector (or unit) of each input row once and multiplies them with the same columns of
//   each of its weight rows: count × kWarpRows running sums.
// - Each sum meets across the warp (warp_sum); lane t stores input row t's outputs, with the
//   bias and, for the residual connection, added to what out holds.
//
// Device code first; the launch shape as host functions outside the CUDA-only part, so that
// the emulated unit tests launch the kernel exactly as matvec_rows does.
#pragma once
#include <cstdint>
#include <string>

#include "block_units.cuh"
#include "common.cuh"
#include "cuda_check.h"
#include "kernels.h"

namespace barellm::cuda {

constexpr int kMatvecRowsWarps = 8;
constexpr int kMatvecRowsThreads = kMatvecRowsWarps * kWarpSize;

// Weight rows per warp for dtype D.
template <DType D>
constexpr int kWarpRows = D == DType::F32 || D == DType::F16 || D == DType::BF16 ? 4 : 2;

// sums[r][t] += Σ_k w[r][k] · in[t, column + k] for t < count, r < kRows (kN a multiple of
// 4; column a multiple of 4, so that the input is read as float4, once for all the rows).
template <int kRows, int kN>
__device__ __forceinline__ void dot_input_rows(const float (&w)[kRows][kN], const float* in,
                                               int in_pitch, int column, int count,
                                               float (&sums)[kRows][kMatvecRowsMax]) {
#pragma unroll
    for (int t = 0; t < kMatvecRowsMax; ++t) {
        if (t < count) {
            const float4* x = reinterpret_cast<const float4*>(in + size_t(t) * in_pitch + column);
#pragma unroll
            for (int v = 0; v < kN / 4; ++v) {
                const float4 part = x[v];
#pragma unroll
                for (int r = 0; r < kRows; ++r) {
                    float sum = sums[r][t];
                    sum = fmaf(w[r][4 * v], part.x, sum);
                    sum = fmaf(w[r][4 * v + 1], part.y, sum);
                    sum = fmaf(w[r][4 * v + 2], part.z, sum);
                    sum = fmaf(w[r][4 * v + 3], part.w, sum);
                    sums[r][t] = sum;
                }
            }
        }
    }
}

// sums[r][t] += Σ over the unit's 32 weights of row r · in[t, column] for t < count: each
// group of 16 columns (the same for every row: decode_unit's map depends on the unit alone)
// read once per input row, adding scale · Σ q·x + offset · Σ x per row.
template <DType D, int kRows>
__device__ __forceinline__ void dot_unit_rows(const WeightUnit (&w)[kRows], const float* in,
                                              int in_pitch, int count,
                                              float (&sums)[kRows][kMatvecRowsMax]) {
#pragma unroll
    for (int t = 0; t < kMatvecRowsMax; ++t) {
        if (t < count) {
#pragma unroll
            for (int g = 0; g < 2; ++g) {
                const float4* x =
                    reinterpret_cast<const float4*>(in + size_t(t) * in_pitch + w[0].column[g]);
                float xs[kGroupWeights];
                float x_sum = 0.0f;
#pragma unroll
                for (int v = 0; v < kGroupWeights / 4; ++v) {
                    const float4 part = x[v];
                    xs[4 * v] = part.x;
                    xs[4 * v + 1] = part.y;
                    xs[4 * v + 2] = part.z;
                    xs[4 * v + 3] = part.w;
                    x_sum += (part.x + part.y) + (part.z + part.w);
                }
#pragma unroll
                for (int r = 0; r < kRows; ++r) {
                    float dot = 0.0f;
#pragma unroll
                    for (int i = 0; i < kGroupWeights; ++i)
                        dot = fmaf(float(w[r].q[g][i]), xs[i], dot);
                    float total = fmaf(w[r].scale[g], dot, sums[r][t]);
                    if constexpr (kHasOffset<D>) total = fmaf(w[r].offset[g], x_sum, total);
                    sums[r][t] = total;
                }
            }
        }
    }
}

// The calling lane's share of weight rows rows[0..kRows) of W (dtype D; pitch elements a
// row, Q8/Q4 scales after the values) dotted with each input row, added to sums.
template <DType D, int kRows>
__device__ __forceinline__ void dot_weight_rows(const void* weights, const uint16_t* scales,
                                                const int (&rows)[kRows], int cols, int pitch,
                                                const float* in, int in_pitch, int count,
                                                float (&sums)[kRows][kMatvecRowsMax]) {
    const int lane = threadIdx.x % kWarpSize;
    if constexpr (D == DType::F32 || D == DType::F16 || D == DType::BF16) {
        constexpr int kPer = WeightFormat<D>::kPerVector;
        const char* base = static_cast<const char*>(weights);
        for (int i = lane; i < pitch / kPer; i += kWarpSize) {
            float w[kRows][kPer];
#pragma unroll
            for (int r = 0; r < kRows; ++r) {  // every row's loads before the math
                const uint4* vectors = reinterpret_cast<const uint4*>(
                    base + size_t(rows[r]) * pitch * dtype_size_v<D>);
                WeightFormat<D>::unpack(vectors[i], w[r]);
            }
            dot_input_rows(w, in, in_pitch, i * kPer, count, sums);
        }
    } else if constexpr (D == DType::Q8_0 || D == DType::Q4_0) {
        constexpr int kPer = QuantizedFormat<D>::kPerVector;
        const size_t row_bytes = QuantizedFormat<D>::row_bytes(pitch);
        const int blocks_per_row = pitch / kQuantizedBlock;
        for (int i = lane; i < pitch / kPer; i += kWarpSize) {
            float w[kRows][kPer];
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                const uint4 v = reinterpret_cast<const uint4*>(
                    static_cast<const uint8_t*>(weights) + size_t(rows[r]) * row_bytes)[i];
                const uint32_t words[4] = {v.x, v.y, v.z, v.w};
                const float scale = half_bits_to_float(
                    scales[size_t(rows[r]) * blocks_per_row + i * kPer / kQuantizedBlock]);
#pragma unroll
                for (int j = 0; j < 16; ++j) {
                    const uint32_t byte = (words[j / 4] >> (8 * (j % 4))) & 0xffu;
                    if constexpr (D == DType::Q8_0) {
                        w[r][j] = float(int(int8_t(byte))) * scale;
                    } else {  // low nibble column j, high nibble column j + 16
                        w[r][j] = float(int(byte & 0x0fu) - kQ4Offset) * scale;
                        w[r][j + 16] = float(int(byte >> 4) - kQ4Offset) * scale;
                    }
                }
            }
            dot_input_rows(w, in, in_pitch, i * kPer, count, sums);
        }
    } else {  // ggml's block types
        for (int unit = lane; unit < cols / kUnitWeights; unit += kWarpSize) {
            WeightUnit w[kRows];
#pragma unroll
            for (int r = 0; r < kRows; ++r)
                w[r] =
                    decode_unit<D>(load_unit<D>(block_row<D>(weights, rows[r], cols), unit), unit);
            dot_unit_rows<D>(w, in, in_pitch, count, sums);
        }
    }
}

// out[t, r] (=, or += with accumulate) Σ_c W[r, c] · in[t, c] (+ bias[r]) for t < count,
// r < rows; warp w of block b takes weight rows (8b + w) · kWarpRows<D> + 0, 1, ... (a row
// past the last reads the last and stores nothing).
// Launch: grid ceil(rows / (8 · kWarpRows<D>)), block 256, no shared memory.
template <DType D>
__global__ void __launch_bounds__(kMatvecRowsThreads)
    matvec_rows_kernel(float* __restrict__ out, int out_pitch, const void* __restrict__ weights,
                       const uint16_t* __restrict__ scales, int rows, int cols, int pitch,
                       const float* __restrict__ in, int in_pitch, int count,
                       const float* __restrict__ bias, bool accumulate) {
    constexpr int kRows = kWarpRows<D>;
    const int first_row = (blockIdx.x * kMatvecRowsWarps + threadIdx.x / kWarpSize) * kRows;
    if (first_row >= rows) return;  // the whole warp
    const int lane = threadIdx.x % kWarpSize;
    int warp_rows[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) warp_rows[r] = min(first_row + r, rows - 1);
    float sums[kRows][kMatvecRowsMax];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int t = 0; t < kMatvecRowsMax; ++t) sums[r][t] = 0.0f;
    dot_weight_rows<D>(weights, scales, warp_rows, cols, pitch, in, in_pitch, count, sums);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
        const int row = first_row + r;
        const float add = bias != nullptr ? bias[warp_rows[r]] : 0.0f;
#pragma unroll
        for (int t = 0; t < kMatvecRowsMax; ++t) {
            const float sum = warp_sum(sums[r][t]) + add;  // every lane: r and t are uniform
            if (lane == t && t < count && row < rows) {
                float* target = out + size_t(t) * out_pitch + row;
                *target = accumulate ? *target + sum : sum;
            }
        }
    }
}

// ---- Launch shape

template <DType D>
dim3 matvec_rows_grid(int rows) {
    const int per_block = kMatvecRowsWarps * kWarpRows<D>;
    return dim3((rows + per_block - 1) / per_block);
}

// Calls launch(std::integral_constant<DType, D>{}) for any weight dtype D matvec_rows reads.
template <typename Launch>
void with_any_weight_dtype(DType dtype, Launch launch) {
    if (is_block_type(dtype)) return with_block_dtype(dtype, launch);
    if (dtype == DType::Q8_0 || dtype == DType::Q4_0) return with_quantized_dtype(dtype, launch);
    with_weight_dtype(dtype, launch);
}

#ifdef BARELLM_LAUNCH_FUNCTIONS

void matvec_rows(float* out, int out_pitch, const DeviceMatrix& w, const DeviceActivations& in,
                 const float* bias, bool accumulate, cudaStream_t stream) {
    if (in.tokens == 0) return;
    if (in.tokens > kMatvecRowsMax || in.dtype != DType::F32 || in.cols != w.cols ||
        in.pitch % kQuantizedBlock != 0 || in.pitch < w.pitch)
        throw Error("matvec_rows: up to " + std::to_string(kMatvecRowsMax) +
                    " f32 input rows of the matrix's columns, padded to a multiple of " +
                    std::to_string(kQuantizedBlock));
    with_any_weight_dtype(w.dtype, [&](auto dtype) {
        constexpr DType D = decltype(dtype)::value;
        launch_kernel(matvec_rows_kernel<D>, matvec_rows_grid<D>(w.rows), kMatvecRowsThreads, 0,
                      stream, out, out_pitch, w.data, w.scales, w.rows, w.cols, w.pitch,
                      static_cast<const float*>(in.data), in.pitch, in.tokens, bias, accumulate);
    });
    CUDA_CHECK_LAUNCH("matvec_rows_kernel");
}

#endif  // BARELLM_LAUNCH_FUNCTIONS

}  // namespace barellm::cuda
