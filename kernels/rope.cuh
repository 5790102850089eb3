// Rotary position embedding fused with the KV-cache write: one kernel rotates q in place,
// stores the rotated k and the unchanged v into the cache row of the current position.
// Qwen3's per-head q/k RMSNorm is applied as each head is read, before its rotation.
#pragma once
#include "common.cuh"
#include "cuda_check.h"
#include "kernels.h"

namespace barellm::cuda {

constexpr int kRopeThreads = 256;
constexpr int kRopeWarps = kRopeThreads / kWarpSize;

// (cos, sin) of pair j's angle pos * rope_table[j], times the pair's magnitude
// rope_table[pairs + j] (barellm::rope_table's layout, pairs = head_dim / 2), computed in
// double as cpu::rope computes it, so that long contexts keep their digits.
__device__ __forceinline__ float2 rope_cos_sin(int pos, const float* rope_table, int j, int pairs) {
    double sin_angle, cos_angle;
    sincos(double(pos) * double(rope_table[j]), &sin_angle, &cos_angle);
    const double magnitude = rope_table[pairs + j];
    return make_float2(float(cos_angle * magnitude), float(sin_angle * magnitude));
}

// The pair (a, b) rotated by the angle whose (cos, sin) is cos_sin.
__device__ __forceinline__ float2 rope_rotate(float a, float b, float2 cos_sin) {
    const float c = cos_sin.x, s = cos_sin.y;
    return make_float2(a * c - b * s, b * c + a * s);
}

// Pair (j, j + half) of the head vector `vec` rotated by the angle pos * rope_table[j] (and
// scaled by its magnitude). half = head_dim / 2.
__device__ __forceinline__ float2 rope_rotated_pair(const float* vec, int j, int half, int pos,
                                                    const float* rope_table) {
    return rope_rotate(vec[j], vec[j + half], rope_cos_sin(pos, rope_table, j, half));
}

// RMSNorm's scale rsqrt(mean(x²) + eps) of one head vector x[head_dim], for the calling warp
// (lane l sums the squares of elements l, l + 32, ...); every lane gets it. All 32 lanes
// must call it. A sum that overflows is summed again rescaled (kRmsRescue).
__device__ __forceinline__ float head_rms_scale(const float* x, int head_dim, float eps) {
    const int lane = threadIdx.x % kWarpSize;
    float squares = 0.0f;
    for (int i = lane; i < head_dim; i += kWarpSize) squares += x[i] * x[i];
    const float sum = warp_sum(squares);
    if (sum != INFINITY) return rms_scale_of_sum(sum, head_dim, eps);  // the same in every lane
    float rescued = 0.0f;
    for (int i = lane; i < head_dim; i += kWarpSize) {
        const float scaled = x[i] * kRmsRescue;
        rescued += scaled * scaled;
    }
    return rms_scale_of_rescued_sum(warp_sum(rescued), head_dim);
}

// Pair (j, j + half) of the head vector x, RMSNormed when norm_weight is given (x * scale *
// weight, in the order of the CPU's rmsnorm; scale from head_rms_scale), as it is otherwise.
__device__ __forceinline__ float2 head_pair(const float* x, int j, int half,
                                            const float* norm_weight, float scale) {
    float a = x[j], b = x[j + half];
    if (norm_weight != nullptr) {
        a = a * scale * norm_weight[j];
        b = b * scale * norm_weight[j + half];
    }
    return make_float2(a, b);
}

// RoPE on q and k for pos = step[1], k and v stored into the cache row of pos:
// - qkv [q_dim + 2 * kv_dim] = q heads, then k heads, then v heads, each head_dim long. The
//   q and k heads are contiguous, so "rotation head" h < heads + kv_heads starts at
//   qkv + h * head_dim.
// - Warp w of the grid takes rotation head w: with q_norm / k_norm, its lanes first reduce
//   the head's sum of squares (head_rms_scale); then lane l rotates pairs (j, j + head_dim/2),
//   j = l, l + 32, ... (normed first): q back in place, k to the key cache. A k head's warp
//   also copies the v head of the same index to the value cache.
// - Every element has exactly one writer; a q head is read whole (its norm) before any of it
//   is rewritten, by the warp that rewrites it.
// Launch: grid ceil((heads + kv_heads) / 8), block 256 (8 warps), no shared memory.
template <typename KvT>
__global__ void __launch_bounds__(kRopeThreads)
    rope_kv_kernel(float* __restrict__ qkv, const float* __restrict__ rope_table,
                   KvT* __restrict__ key_cache, KvT* __restrict__ value_cache,
                   const int* __restrict__ step, int heads, int kv_heads, int head_dim,
                   const float* __restrict__ q_norm, const float* __restrict__ k_norm, float eps) {
    const int head = blockIdx.x * kRopeWarps + threadIdx.x / kWarpSize;
    if (head >= heads + kv_heads) return;  // the whole warp
    const int lane = threadIdx.x % kWarpSize;
    const int pos = step[1];
    const int half = head_dim / 2;
    const int q_dim = heads * head_dim, kv_dim = kv_heads * head_dim;
    const bool is_q = head < heads;
    float* vec = qkv + size_t(head) * head_dim;
    const float* norm_weight = is_q ? q_norm : k_norm;
    const float scale = norm_weight != nullptr ? head_rms_scale(vec, head_dim, eps) : 1.0f;
    __syncwarp();  // the whole head is read before a lane rewrites part of it
    const int kv_head = is_q ? 0 : head - heads;  // for a k head: its slot in the cache row
    const size_t cache_row = size_t(pos) * kv_dim + size_t(kv_head) * head_dim;
    for (int j = lane; j < half; j += kWarpSize) {
        const float2 pair = head_pair(vec, j, half, norm_weight, scale);
        const float2 rotated = rope_rotate(pair.x, pair.y, rope_cos_sin(pos, rope_table, j, half));
        if (is_q) {
            vec[j] = rotated.x;
            vec[j + half] = rotated.y;
        } else {
            kv_store(key_cache + cache_row + j, rotated.x);
            kv_store(key_cache + cache_row + j + half, rotated.y);
        }
    }
    if (!is_q) {
        const float* v = qkv + q_dim + kv_dim + size_t(kv_head) * head_dim;
        for (int d = lane; d < head_dim; d += kWarpSize)
            kv_store(value_cache + cache_row + d, v[d]);
    }
}

// ---- Launch shape

inline dim3 rope_kv_grid(int heads, int kv_heads) {
    return dim3((heads + kv_heads + kRopeWarps - 1) / kRopeWarps);
}

#ifdef BARELLM_LAUNCH_FUNCTIONS

void rope_kv_store(float* qkv, const float* rope_table, void* key_cache, void* value_cache,
                   const int* step, int heads, int kv_heads, int head_dim, const float* q_norm,
                   const float* k_norm, float eps, KvType kv_type, cudaStream_t stream) {
    if ((q_norm == nullptr) != (k_norm == nullptr))
        throw Error("rope_kv_store: q_norm and k_norm are given together or not at all");
    const dim3 grid = rope_kv_grid(heads, kv_heads);
    with_kv_type(kv_type, [&](auto element) {
        using KvT = decltype(element);
        launch_kernel(rope_kv_kernel<KvT>, grid, kRopeThreads, 0, stream, qkv, rope_table,
                      static_cast<KvT*>(key_cache), static_cast<KvT*>(value_cache), step, heads,
                      kv_heads, head_dim, q_norm, k_norm, eps);
    });
    CUDA_CHECK_LAUNCH("rope_kv_kernel");
}

#endif  // BARELLM_LAUNCH_FUNCTIONS

}  // namespace barellm::cuda
