// Gemma's post norms: the attention's and the feed-forward's output is RMSNormed (with
// post_attn_norm or post_ffn_norm) before the residual add, x += rmsnorm(y) * weight. The norm
// needs the whole output row, which the matvec or GEMM producing it spreads over many blocks:
// they store y plainly (no accumulate) and this kernel, one block per row, adds it to x. Decode
// runs it on one row, prefill on the batch's rows. Llama's layers keep the residual add fused
// into the matvecs' and GEMMs' stores.
#pragma once
#include "common.cuh"
#include "cuda_check.h"
#include "kernels.h"

namespace barellm::cuda {

constexpr int kPostNormThreads = 256;

// x[t, i] += y[t, i] * rsqrt(mean(y[t]²) + eps) * weight[i] for i < cols (the CPU's rmsnorm:
// y * scale * weight, in that order, then the add); x and y are f32 [tokens, cols].
// Launch: grid tokens, block 256, no dynamic shared memory; block t takes row t.
__global__ void __launch_bounds__(kPostNormThreads)
    add_rmsnorm_rows_kernel(float* __restrict__ x, const float* __restrict__ y,
                            const float* __restrict__ weight, int cols, float eps) {
    __shared__ float scratch[kWarpSize];
    const size_t row = size_t(blockIdx.x) * cols;
    const float scale = rms_scale(y + row, cols, eps, scratch);
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
        x[row + i] += y[row + i] * scale * weight[i];
}

inline dim3 add_rmsnorm_rows_grid(int count) { return dim3(count); }

#ifdef BARELLM_LAUNCH_FUNCTIONS

void add_rmsnorm_rows(float* x, const float* y, const float* weight, int cols, int count, float eps,
                      cudaStream_t stream) {
    if (count == 0) return;
    launch_kernel(add_rmsnorm_rows_kernel, add_rmsnorm_rows_grid(count), kPostNormThreads, 0,
                  stream, x, y, weight, cols, eps);
    CUDA_CHECK_LAUNCH("add_rmsnorm_rows_kernel");
}

#endif  // BARELLM_LAUNCH_FUNCTIONS

}  // namespace barellm::cuda
