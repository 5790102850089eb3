// The steps the fast kernels fuse, each as its own kernel, as the CPU runs them: RMSNorm,
// the residual add (also the bias add of Qwen's projections), SwiGLU, Qwen3's per-head q/k
// RMSNorm, RoPE and the KV-cache write (the GPU ladder's rungs 1-2; the gate's activation
// also on the fast path, where w1 and w3 differ in type).
// Every value makes a round trip through global memory between two of them; rung 3 fuses
// them into the matvecs (matvec_simple.cuh) and into rope_kv_kernel (rope.cuh).
#pragma once
#include "common.cuh"
#include "cuda_check.h"
#include "kernels.h"
#include "rope.cuh"

namespace barellm::cuda {

constexpr int kElementwiseThreads = 256;
constexpr int kElementwiseWarps = kElementwiseThreads / kWarpSize;

inline dim3 elementwise_grid(int count) {
    return dim3((count + kElementwiseThreads - 1) / kElementwiseThreads);
}

// out[i] = in[i] * rsqrt(mean(in²) + eps) * weight[i], i in [0, n).
// Launch: grid 1, block 256 (one block: the sum of squares needs every element).
__global__ void __launch_bounds__(kElementwiseThreads)
    rmsnorm_kernel(float* __restrict__ out, const float* __restrict__ in,
                   const float* __restrict__ weight, int n, float eps) {
    __shared__ float scratch[kWarpSize];
    const float scale = rms_scale(in, n, eps, scratch);
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = in[i] * scale * weight[i];
}

// x[i] += y[i] (the residual connection). Launch: grid ceil(n / 256), block 256.
__global__ void __launch_bounds__(kElementwiseThreads)
    residual_add_kernel(float* __restrict__ x, const float* __restrict__ y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// gate[i] = act(gate[i]) * up[i], act of A (gated_value; limit: SwigluOai's). Launch: grid
// ceil(n / 256), block 256.
template <Activation A>
__global__ void __launch_bounds__(kElementwiseThreads)
    swiglu_kernel(float* __restrict__ gate, const float* __restrict__ up, int n, float limit) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) gate[i] = gated_value<A>(gate[i], up[i], limit);
}

// Each of the heads + kv_heads vectors of head_dim at the start of qk (q then k) RMSNormed in
// place with q_norm (q heads) or k_norm (k heads): warp w of the grid takes head w
// (head_rms_scale, then x * scale * weight).
// Launch: grid ceil((heads + kv_heads) / 8), block 256 (8 warps), no shared memory.
__global__ void __launch_bounds__(kElementwiseThreads)
    rmsnorm_heads_kernel(float* __restrict__ qk, const float* __restrict__ q_norm,
                         const float* __restrict__ k_norm, int heads, int kv_heads, int head_dim,
                         float eps) {
    const int head = blockIdx.x * kElementwiseWarps + threadIdx.x / kWarpSize;
    if (head >= heads + kv_heads) return;  // the whole warp
    float* x = qk + size_t(head) * head_dim;
    const float* weight = head < heads ? q_norm : k_norm;
    const float scale = head_rms_scale(x, head_dim, eps);
    __syncwarp();  // the whole head is read before a lane rewrites part of it
    for (int i = threadIdx.x % kWarpSize; i < head_dim; i += kWarpSize)
        x[i] = x[i] * scale * weight[i];
}

// Rotates, in place, the heads + kv_heads vectors of head_dim at the start of qkv (q then
// k) for position step[1]: thread t rotates pair (j, j + head_dim/2), j = t mod half, of
// head t / half. Launch: grid ceil((heads + kv_heads) * head_dim/2 / 256), block 256.
__global__ void __launch_bounds__(kElementwiseThreads)
    rope_kernel(float* __restrict__ qk, const float* __restrict__ rope_table,
                const int* __restrict__ step, int rotated_heads, int head_dim) {
    const int half = head_dim / 2;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= rotated_heads * half) return;
    const int j = t % half;
    float* vec = qk + size_t(t / half) * head_dim;
    const float2 rotated = rope_rotated_pair(vec, j, half, step[1], rope_table);
    vec[j] = rotated.x;
    vec[j + half] = rotated.y;
}

// Row step[1] of key_cache and value_cache [context, kv_dim] = k and v (as KvT).
// Launch: grid ceil(kv_dim / 256), block 256.
template <typename KvT>
__global__ void __launch_bounds__(kElementwiseThreads)
    store_kv_row_kernel(const float* __restrict__ k, const float* __restrict__ v,
                        KvT* __restrict__ key_cache, KvT* __restrict__ value_cache,
                        const int* __restrict__ step, int kv_dim) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= kv_dim) return;
    const size_t slot = size_t(step[1]) * kv_dim + i;
    kv_store(key_cache + slot, k[i]);
    kv_store(value_cache + slot, v[i]);
}

// ---- Launch shapes (elementwise_grid above for the one-element-a-thread kernels)

inline dim3 rmsnorm_heads_grid(int heads, int kv_heads) {
    return dim3((heads + kv_heads + kElementwiseWarps - 1) / kElementwiseWarps);
}
inline dim3 rope_grid(int heads, int kv_heads, int head_dim) {
    return elementwise_grid((heads + kv_heads) * (head_dim / 2));
}

#ifdef BARELLM_LAUNCH_FUNCTIONS

void rmsnorm(float* out, const float* in, const float* weight, int n, float eps,
             cudaStream_t stream) {
    launch_kernel(rmsnorm_kernel, 1, kElementwiseThreads, 0, stream, out, in, weight, n, eps);
    CUDA_CHECK_LAUNCH("rmsnorm_kernel");
}

void residual_add(float* x, const float* y, int n, cudaStream_t stream) {
    launch_kernel(residual_add_kernel, elementwise_grid(n), kElementwiseThreads, 0, stream, x, y,
                  n);
    CUDA_CHECK_LAUNCH("residual_add_kernel");
}

void swiglu(float* gate, const float* up, int n, Activation activation, float limit,
            cudaStream_t stream) {
    with_any_activation(activation, [&](auto act) {
        launch_kernel(swiglu_kernel<decltype(act)::value>, elementwise_grid(n), kElementwiseThreads,
                      0, stream, gate, up, n, limit);
    });
    CUDA_CHECK_LAUNCH("swiglu_kernel");
}

void rope(float* qk, const float* rope_table, const int* step, int heads, int kv_heads,
          int head_dim, cudaStream_t stream) {
    launch_kernel(rope_kernel, rope_grid(heads, kv_heads, head_dim), kElementwiseThreads, 0, stream,
                  qk, rope_table, step, heads + kv_heads, head_dim);
    CUDA_CHECK_LAUNCH("rope_kernel");
}

void rmsnorm_heads(float* qk, const float* q_norm, const float* k_norm, int heads, int kv_heads,
                   int head_dim, float eps, cudaStream_t stream) {
    if (q_norm == nullptr || k_norm == nullptr)
        throw Error("rmsnorm_heads: q_norm and k_norm must both be given");
    const dim3 grid = rmsnorm_heads_grid(heads, kv_heads);
    launch_kernel(rmsnorm_heads_kernel, grid, kElementwiseThreads, 0, stream, qk, q_norm, k_norm,
                  heads, kv_heads, head_dim, eps);
    CUDA_CHECK_LAUNCH("rmsnorm_heads_kernel");
}

void store_kv_row(const float* k, const float* v, void* key_cache, void* value_cache,
                  const int* step, int kv_dim, KvType kv_type, cudaStream_t stream) {
    with_kv_type(kv_type, [&](auto element) {
        using KvT = decltype(element);
        launch_kernel(store_kv_row_kernel<KvT>, elementwise_grid(kv_dim), kElementwiseThreads, 0,
                      stream, k, v, static_cast<KvT*>(key_cache), static_cast<KvT*>(value_cache),
                      step, kv_dim);
    });
    CUDA_CHECK_LAUNCH("store_kv_row_kernel");
}

#endif  // BARELLM_LAUNCH_FUNCTIONS

}  // namespace barellm::cuda
