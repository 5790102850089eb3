// Token embedding: the residual stream starts as the token's row of the embedding table
// (f32, f16, bf16, Q8/Q4 values times their block's scale, or a block type's units
// dequantized: block_embedding_kernel), times the model's embedding scale (Gemma's sqrt(dim);
// 1 elsewhere, which leaves every value as it is).
#pragma once
#include "block_units.cuh"
#include "common.cuh"
#include "cuda_check.h"
#include "kernels.h"

namespace barellm::cuda {

constexpr int kEmbeddingThreads = 256;

// x[i] = table[step[0], i] as f32 times scale.
// Launch: grid ceil(cols / 256), block 256, no shared memory. Thread i copies element i;
// a warp reads 32 consecutive elements of the row.
template <DType D>
__global__ void __launch_bounds__(kEmbeddingThreads)
    embedding_kernel(float* __restrict__ x, const void* __restrict__ table, int cols, int pitch,
                     float scale, const int* __restrict__ step) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    const int token = step[0];
    const char* row = static_cast<const char*>(table) + size_t(token) * pitch * dtype_size_v<D>;
    x[i] = WeightFormat<D>::element(row, i) * scale;
}

// Element i of row `token` of a Q8 (I8) or Q4 (U8) table [rows, pitch] as f32: the integer
// weight times its block's f16 scale, as the CPU's embedding_row computes it.
template <DType D>
__device__ __forceinline__ float quantized_table_element(const void* table, const uint16_t* scales,
                                                         int pitch, size_t token, int i) {
    using Format = QuantizedFormat<D>;
    const char* row = static_cast<const char*>(table) + token * Format::row_bytes(pitch);
    const uint16_t scale = scales[token * (pitch / kQuantizedBlock) + i / kQuantizedBlock];
    return float(Format::value(row, i)) * half_bits_to_float(scale);
}

// x[i] = table[step[0], i] as f32 times scale for a Q8 (I8) or Q4 (U8) table
// (quantized_table_element).
// Launch: as embedding_kernel (grid ceil(cols / 256), block 256, no shared memory).
template <DType D>
__global__ void __launch_bounds__(kEmbeddingThreads)
    embedding_quantized_kernel(float* __restrict__ x, const void* __restrict__ table,
                               const uint16_t* __restrict__ scales, int cols, int pitch,
                               float scale, const int* __restrict__ step) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    x[i] = quantized_table_element<D>(table, scales, pitch, size_t(step[0]), i) * scale;
}

// x[t, :] = table[tokens[t], :] as f32 times scale (t = blockIdx.y), table of block type D
// [.., cols].
// Launch: grid (ceil(cols / 32 / 256), tokens), block 256, no shared memory; each thread
// dequantizes one unit of 32 weights.
template <DType D>
__global__ void __launch_bounds__(kBlockRowsThreads)
    block_embedding_kernel(float* __restrict__ x, const void* __restrict__ table, int cols,
                           float scale, const int* __restrict__ tokens) {
    const int unit = blockIdx.x * blockDim.x + threadIdx.x;
    if (unit >= cols / kUnitWeights) return;
    const int t = blockIdx.y;
    const WeightUnit w =
        decode_unit<D>(load_unit<D>(block_row<D>(table, tokens[t], cols), unit), unit);
    float* out = x + size_t(t) * cols;
#pragma unroll
    for (int g = 0; g < 2; ++g)
#pragma unroll
        for (int i = 0; i < kGroupWeights; ++i)
            out[w.column[g] + i] = unit_weight<D>(w, g, i) * scale;
}

inline dim3 block_embedding_grid(int cols, int tokens) {
    const int units = cols / kUnitWeights;
    return dim3((units + kBlockRowsThreads - 1) / kBlockRowsThreads, tokens);
}

// ---- Launch shape (embedding_kernel and embedding_quantized_kernel)

inline dim3 embedding_grid(int cols) {
    return dim3((cols + kEmbeddingThreads - 1) / kEmbeddingThreads);
}

#ifdef BARELLM_LAUNCH_FUNCTIONS

// x[t, :] = table[tokens[t], :] as f32 times scale for t < count, table of a block type.
void launch_block_embedding_rows(float* x, const DeviceMatrix& table, float scale,
                                 const int* tokens, int count, cudaStream_t stream) {
    check_block_matrix(table, "embedding");
    if (count == 0) return;
    with_block_dtype(table.dtype, [&](auto dtype) {
        launch_kernel(block_embedding_kernel<decltype(dtype)::value>,
                      block_embedding_grid(table.cols, count), kBlockRowsThreads, 0, stream, x,
                      table.data, table.cols, scale, tokens);
    });
    CUDA_CHECK_LAUNCH("block_embedding_kernel");
}

void embedding(float* x, const DeviceMatrix& table, float scale, const int* step,
               cudaStream_t stream) {
    if (is_block_type(table.dtype))
        return launch_block_embedding_rows(x, table, scale, /*tokens=*/step, /*count=*/1, stream);
    const dim3 grid = embedding_grid(table.cols);
    if (is_quantized(table.dtype)) {
        with_quantized_dtype(table.dtype, [&](auto dtype) {
            launch_kernel(embedding_quantized_kernel<decltype(dtype)::value>, grid,
                          kEmbeddingThreads, 0, stream, x, table.data, table.scales, table.cols,
                          table.pitch, scale, step);
        });
        CUDA_CHECK_LAUNCH("embedding_quantized_kernel");
        return;
    }
    with_weight_dtype(table.dtype, [&](auto dtype) {
        launch_kernel(embedding_kernel<decltype(dtype)::value>, grid, kEmbeddingThreads, 0, stream,
                      x, table.data, table.cols, table.pitch, scale, step);
    });
    CUDA_CHECK_LAUNCH("embedding_kernel");
}

#endif  // BARELLM_LAUNCH_FUNCTIONS

}  // namespace barellm::cuda
