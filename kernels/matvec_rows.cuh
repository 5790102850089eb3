// Matrix products of a few input rows (kernels.h, matvec_rows): the server's step with 2 to
// 15 rows, where a GEMM's tiles would sit mostly empty. Each weight is read and dequantized
// in registers once and dotted with every input row, so a step of n rows reads the weights
// once, as one decode token does.
//
// - One warp per weight row, 8 rows a block. Lane l takes the 16-byte vectors l, l + 32, ...
//   of its row (f32, f16, bf16: 4 or 8 weights; Q8: 16 int8 weights of one block of 32,
//   times its f16 scale; Q4: a whole block of 32, low nibbles columns 0..15, high nibbles
//   16..31) or, for ggml's block types, units l, l + 32, ... of 32 weights (block_units.cuh:
//   load_unit, decode_unit, unit_dot).
// - The inputs stay f32 in global memory (L1 and L2 serve them to every warp of the block):
//   row t of in [count, in_pitch], zero in its padding columns; a lane's weights multiply
//   the same columns of each of the count rows, kept as count running sums.
// - Each sum meets across the warp (warp_sum); lane t stores row t's output, with the bias
//   and, for the residual connection, added to what out holds.
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
#include "matvec_blocks.cuh"  // unit_dot

namespace barellm::cuda {

constexpr int kMatvecRowsWarps = 8;
constexpr int kMatvecRowsThreads = kMatvecRowsWarps * kWarpSize;

// sums[t] += Σ_k w[k] · in[t, column + k] for t < count (kN a multiple of 4; column a
// multiple of 4, so that the input is read as float4).
template <int kN>
__device__ __forceinline__ void dot_input_rows(const float (&w)[kN], const float* in, int in_pitch,
                                               int column, int count,
                                               float (&sums)[kMatvecRowsMax]) {
#pragma unroll
    for (int t = 0; t < kMatvecRowsMax; ++t) {
        if (t < count) {
            const float4* x = reinterpret_cast<const float4*>(in + size_t(t) * in_pitch + column);
            float sum = sums[t];
#pragma unroll
            for (int v = 0; v < kN / 4; ++v) {
                const float4 part = x[v];
                sum = fmaf(w[4 * v], part.x, sum);
                sum = fmaf(w[4 * v + 1], part.y, sum);
                sum = fmaf(w[4 * v + 2], part.z, sum);
                sum = fmaf(w[4 * v + 3], part.w, sum);
            }
            sums[t] = sum;
        }
    }
}

// The calling lane's share of row `row` of W (dtype D; pitch elements a row, Q8/Q4 scales
// after the values) dotted with each input row, added to sums.
template <DType D>
__device__ __forceinline__ void dot_weight_row(const void* weights, const uint16_t* scales, int row,
                                               int cols, int pitch, const float* in, int in_pitch,
                                               int count, float (&sums)[kMatvecRowsMax]) {
    const int lane = threadIdx.x % kWarpSize;
    if constexpr (D == DType::F32 || D == DType::F16 || D == DType::BF16) {
        constexpr int kPer = WeightFormat<D>::kPerVector;
        const uint4* vectors = reinterpret_cast<const uint4*>(
            static_cast<const char*>(weights) + size_t(row) * pitch * dtype_size_v<D>);
        for (int i = lane; i < pitch / kPer; i += kWarpSize) {
            float w[kPer];
            WeightFormat<D>::unpack(vectors[i], w);
            dot_input_rows(w, in, in_pitch, i * kPer, count, sums);
        }
    } else if constexpr (D == DType::Q8_0 || D == DType::Q4_0) {
        constexpr int kPer = QuantizedFormat<D>::kPerVector;
        const size_t row_bytes = QuantizedFormat<D>::row_bytes(pitch);
        const uint4* vectors = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(weights) +
                                                              size_t(row) * row_bytes);
        const uint16_t* row_scales = scales + size_t(row) * (pitch / kQuantizedBlock);
        for (int i = lane; i < pitch / kPer; i += kWarpSize) {
            const uint4 v = vectors[i];
            const uint32_t words[4] = {v.x, v.y, v.z, v.w};
            const float scale = half_bits_to_float(row_scales[i * kPer / kQuantizedBlock]);
            float w[kPer];
#pragma unroll
            for (int j = 0; j < 16; ++j) {
                const uint32_t byte = (words[j / 4] >> (8 * (j % 4))) & 0xffu;
                if constexpr (D == DType::Q8_0) {
                    w[j] = float(int(int8_t(byte))) * scale;
                } else {  // low nibble column j, high nibble column j + 16
                    w[j] = float(int(byte & 0x0fu) - kQ4Offset) * scale;
                    w[j + 16] = float(int(byte >> 4) - kQ4Offset) * scale;
                }
            }
            dot_input_rows(w, in, in_pitch, i * kPer, count, sums);
        }
    } else {  // ggml's block types
        const uint8_t* bytes = block_row<D>(weights, row, cols);
        for (int unit = lane; unit < cols / kUnitWeights; unit += kWarpSize) {
            const WeightUnit w = decode_unit<D>(load_unit<D>(bytes, unit), unit);
#pragma unroll
            for (int t = 0; t < kMatvecRowsMax; ++t)
                if (t < count) sums[t] += unit_dot<D>(w, in + size_t(t) * in_pitch);
        }
    }
}

// out[t, r] (=, or += with accumulate) Σ_c W[r, c] · in[t, c] (+ bias[r]) for t < count,
// r < rows; warp w of block b takes weight row 8b + w.
// Launch: grid ceil(rows / 8), block 256, no shared memory.
template <DType D>
__global__ void __launch_bounds__(kMatvecRowsThreads)
    matvec_rows_kernel(float* __restrict__ out, int out_pitch, const void* __restrict__ weights,
                       const uint16_t* __restrict__ scales, int rows, int cols, int pitch,
                       const float* __restrict__ in, int in_pitch, int count,
                       const float* __restrict__ bias, bool accumulate) {
    const int row = blockIdx.x * kMatvecRowsWarps + threadIdx.x / kWarpSize;
    if (row >= rows) return;  // the whole warp
    const int lane = threadIdx.x % kWarpSize;
    float sums[kMatvecRowsMax];
#pragma unroll
    for (int t = 0; t < kMatvecRowsMax; ++t) sums[t] = 0.0f;
    dot_weight_row<D>(weights, scales, row, cols, pitch, in, in_pitch, count, sums);
    const float add = bias != nullptr ? bias[row] : 0.0f;
#pragma unroll
    for (int t = 0; t < kMatvecRowsMax; ++t) {
        const float sum = warp_sum(sums[t]) + add;  // every lane: t is uniform
        if (lane == t && t < count) {
            float* target = out + size_t(t) * out_pitch + row;
            *target = accumulate ? *target + sum : sum;
        }
    }
}

// ---- Launch shape

inline dim3 matvec_rows_grid(int rows) {
    return dim3((rows + kMatvecRowsWarps - 1) / kMatvecRowsWarps);
}

// Calls launch(std::integral_constant<DType, D>{}) for any weight dtype D matvec_rows reads.
template <typename Launch>
void with_any_weight_dtype(DType dtype, Launch launch) {
    if (is_block_type(dtype)) return with_block_dtype(dtype, launch);
    if (dtype == DType::Q8_0 || dtype == DType::Q4_0) return with_quantized_dtype(dtype, launch);
    with_weight_dtype(dtype, launch);
}

#ifndef BARELLM_CUDA_EMULATION

void matvec_rows(float* out, int out_pitch, const DeviceMatrix& w, const DeviceActivations& in,
                 const float* bias, bool accumulate, cudaStream_t stream) {
    if (in.tokens == 0) return;
    if (in.tokens > kMatvecRowsMax || in.dtype != DType::F32 || in.cols != w.cols ||
        in.pitch % kQuantizedBlock != 0 || in.pitch < w.pitch)
        throw Error("matvec_rows: up to " + std::to_string(kMatvecRowsMax) +
                    " f32 input rows of the matrix's columns, padded to a multiple of " +
                    std::to_string(kQuantizedBlock));
    with_any_weight_dtype(w.dtype, [&](auto dtype) {
        matvec_rows_kernel<decltype(dtype)::value>
            <<<matvec_rows_grid(w.rows), kMatvecRowsThreads, 0, stream>>>(
                out, out_pitch, w.data, w.scales, w.rows, w.cols, w.pitch,
                static_cast<const float*>(in.data), in.pitch, in.tokens, bias, accumulate);
    });
    CUDA_CHECK_LAUNCH("matvec_rows_kernel");
}

#endif  // BARELLM_CUDA_EMULATION

}  // namespace barellm::cuda
