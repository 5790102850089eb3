// Token embedding: the residual stream starts as the token's row of the embedding table.
#pragma once
#include "common.cuh"
#include "cuda_check.h"
#include "kernels.h"

namespace barellm::cuda {

constexpr int kEmbeddingThreads = 256;

// x[i] = table[step[0], i] as f32.
// Launch: grid ceil(cols / 256), block 256, no shared memory. Thread i copies element i;
// a warp reads 32 consecutive elements of the row.
template <DType D>
__global__ void __launch_bounds__(kEmbeddingThreads)
    embedding_kernel(float* __restrict__ x, const void* __restrict__ table, int cols, int pitch,
                     const int* __restrict__ step) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    const int token = step[0];
    const char* row = static_cast<const char*>(table) + size_t(token) * pitch * dtype_size_v<D>;
    x[i] = WeightFormat<D>::element(row, i);
}

void embedding(float* x, const DeviceMatrix& table, const int* step, cudaStream_t stream) {
    const dim3 grid((table.cols + kEmbeddingThreads - 1) / kEmbeddingThreads);
    with_weight_dtype(table.dtype, [&](auto dtype) {
        embedding_kernel<decltype(dtype)::value>
            <<<grid, kEmbeddingThreads, 0, stream>>>(x, table.data, table.cols, table.pitch, step);
    });
    CUDA_CHECK_LAUNCH("embedding_kernel");
}

}  // namespace barellm::cuda
