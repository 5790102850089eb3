// Gemma 2's soft-capping of the logits: each becomes cap * tanh(logit / cap), within (-cap,
// cap), after the output matvec or GEMM (decode: one row; prefill and the server's step: the
// rows with logits). The attention scores are soft-capped inside the attention kernels
// (soft_capped, common.cuh).
#pragma once
#include "common.cuh"
#include "cuda_check.h"
#include "kernels.h"

namespace barellm::cuda {

constexpr int kSoftcapThreads = 256;

// x[i] = cap * tanh(x[i] / cap) for i < n. Launch: grid ceil(n / 256), block 256, no dynamic
// shared memory; a thread per element.
__global__ void __launch_bounds__(kSoftcapThreads)
    softcap_kernel(float* __restrict__ x, size_t n, float cap) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] = soft_capped(x[i], cap);
}

inline dim3 softcap_grid(size_t n) {
    return dim3(unsigned((n + kSoftcapThreads - 1) / kSoftcapThreads));
}

#ifdef BARELLM_LAUNCH_FUNCTIONS

void softcap(float* x, size_t n, float cap, cudaStream_t stream) {
    if (n == 0) return;
    launch_kernel(softcap_kernel, softcap_grid(n), kSoftcapThreads, 0, stream, x, n, cap);
    CUDA_CHECK_LAUNCH("softcap_kernel");
}

#endif  // BARELLM_LAUNCH_FUNCTIONS

}  // namespace barellm::cuda
