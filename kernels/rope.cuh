// Rotary position embedding fused with the KV-cache write: one kernel rotates q in place,
// stores the rotated k and the unchanged v into the cache row of the current position.
#pragma once
#include "common.cuh"
#include "cuda_check.h"
#include "kernels.h"

namespace barellm::cuda {

constexpr int kRopeThreads = 256;

// (cos, sin) of the angle pos * inverse_frequency, computed in double as cpu::rope computes
// it, so that long contexts keep their digits.
__device__ __forceinline__ float2 rope_cos_sin(int pos, float inverse_frequency) {
    double sin_angle, cos_angle;
    sincos(double(pos) * double(inverse_frequency), &sin_angle, &cos_angle);
    return make_float2(float(cos_angle), float(sin_angle));
}

// The pair (a, b) rotated by the angle whose (cos, sin) is cos_sin.
__device__ __forceinline__ float2 rope_rotate(float a, float b, float2 cos_sin) {
    const float c = cos_sin.x, s = cos_sin.y;
    return make_float2(a * c - b * s, b * c + a * s);
}

// Pair (j, j + half) of the head vector `vec` rotated by the angle pos *
// inverse_frequencies[j]. half = head_dim / 2.
__device__ __forceinline__ float2 rope_rotated_pair(const float* vec, int j, int half, int pos,
                                                    const float* inverse_frequencies) {
    return rope_rotate(vec[j], vec[j + half], rope_cos_sin(pos, inverse_frequencies[j]));
}

// RoPE on q and k for pos = step[1], k and v stored into the cache row of pos:
// - qkv [q_dim + 2 * kv_dim] = q heads, then k heads, then v heads, each head_dim long. The
//   q and k heads are contiguous, so "rotation head" h < heads + kv_heads starts at
//   qkv + h * head_dim.
// - Thread t < rotations = (heads + kv_heads) * head_dim/2 rotates pair (j, j + head_dim/2),
//   j = t mod half, of rotation head t / half (rope_rotated_pair): q back in place, k to
//   the key cache.
// - The next kv_dim threads copy v element t - rotations to the value cache.
// - Every element has exactly one writer.
// Launch: grid ceil(((heads + kv_heads) * head_dim/2 + kv_heads * head_dim) / 256),
// block 256, no shared memory.
template <typename KvT>
__global__ void __launch_bounds__(kRopeThreads)
    rope_kv_kernel(float* __restrict__ qkv, const float* __restrict__ inverse_frequencies,
                   KvT* __restrict__ key_cache, KvT* __restrict__ value_cache,
                   const int* __restrict__ step, int heads, int kv_heads, int head_dim) {
    const int pos = step[1];
    const int half = head_dim / 2;
    const int q_dim = heads * head_dim, kv_dim = kv_heads * head_dim;
    const int rotations = (heads + kv_heads) * half;
    const size_t cache_row = size_t(pos) * kv_dim;
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < rotations) {
        const int head = t / half, j = t % half;
        float* vec = qkv + size_t(head) * head_dim;
        const float2 rotated = rope_rotated_pair(vec, j, half, pos, inverse_frequencies);
        if (head < heads) {
            vec[j] = rotated.x;
            vec[j + half] = rotated.y;
        } else {
            KvT* key = key_cache + cache_row + size_t(head - heads) * head_dim;
            kv_store(key + j, rotated.x);
            kv_store(key + j + half, rotated.y);
        }
        return;
    }
    t -= rotations;
    if (t < kv_dim) kv_store(value_cache + cache_row + t, qkv[q_dim + kv_dim + t]);
}

#ifndef BARELLM_CUDA_EMULATION

void rope_kv_store(float* qkv, const float* inverse_frequencies, void* key_cache, void* value_cache,
                   const int* step, int heads, int kv_heads, int head_dim, KvType kv_type,
                   cudaStream_t stream) {
    const int threads = (heads + kv_heads) * (head_dim / 2) + kv_heads * head_dim;
    const dim3 grid((threads + kRopeThreads - 1) / kRopeThreads);
    with_kv_type(kv_type, [&](auto element) {
        using KvT = decltype(element);
        rope_kv_kernel<KvT><<<grid, kRopeThreads, 0, stream>>>(
            qkv, inverse_frequencies, static_cast<KvT*>(key_cache), static_cast<KvT*>(value_cache),
            step, heads, kv_heads, head_dim);
    });
    CUDA_CHECK_LAUNCH("rope_kv_kernel");
}

#endif  // BARELLM_CUDA_EMULATION

}  // namespace barellm::cuda
