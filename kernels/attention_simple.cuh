// The GPU ladder's naive decode attention (`barellm ladder --device cuda`, rungs 1-4): the
// CPU's loop (cpu::attention) ported as it is, one block per query head, in three phases:
//
//   1. scores: thread t owns positions t, t + 128, ... and reads each of their key rows
//      element by element, so the 32 lanes of a warp read 32 rows a kv_dim apart (not
//      coalesced); the scores go to global memory;
//   2. softmax over them, by the whole block (max, exp, sum);
//   3. value mixing: thread d owns output element d and walks all positions, one after the
//      other: a warp reads 32 contiguous elements of a value row per step, but the positions
//      are not spread over threads, and a KV head's rows are read again by every query
//      head that shares it.
//
// attention.cuh replaces all three: a block reads each key and value row once for the
// query heads sharing it, 8 lanes per key row and a warp per value row, and keeps an
// online softmax in shared memory; then it splits the positions across blocks.
#pragma once
#include <cmath>

#include "attention.cuh"
#include "common.cuh"
#include "cuda_check.h"
#include "kernels.h"

namespace barellm::cuda {

constexpr int kNaiveAttentionThreads = 128;

// out[h] = sum_t softmax(softcap(q_h · key(t) * scale))_t * value(t) over the attended positions t
// of pos = step[1], key/value rows of KV head h / (heads / kv_heads). scores [heads,
// context] is scratch (global memory). Launch: grid heads, block 128, no dynamic shared
// memory.
template <typename KvT>
__global__ void __launch_bounds__(kNaiveAttentionThreads)
    attention_naive_kernel(float* __restrict__ out, const float* __restrict__ q,
                           const KvT* __restrict__ keys, const KvT* __restrict__ values,
                           const int* __restrict__ step, float* __restrict__ scores, int context,
                           int heads, int kv_heads, int head_dim, int window, float scale,
                           float softcap) {
    __shared__ float scratch[kWarpSize];
    const int pos = step[1];
    const int first = attention_first(pos, window);
    const int positions = pos + 1 - first;
    const int head = blockIdx.x;
    const size_t row_stride = size_t(kv_heads) * head_dim;  // a cache row, in elements
    const size_t head_offset = size_t(head / (heads / kv_heads)) * head_dim;
    const float* q_head = q + size_t(head) * head_dim;
    float* head_scores = scores + size_t(head) * context;

    // 1. Scores.
    float max_score = -INFINITY;
    for (int t = threadIdx.x; t < positions; t += blockDim.x) {
        const KvT* key = keys + size_t(first + t) * row_stride + head_offset;
        float dot = 0.0f;
        for (int d = 0; d < head_dim; ++d) dot = fmaf(q_head[d], kv_load(key, d), dot);
        head_scores[t] = soft_capped(dot * scale, softcap);
        max_score = fmaxf(max_score, head_scores[t]);
    }

    // 2. Softmax: p = exp(score - max); the division by the sum waits until the end.
    max_score = block_max(max_score, scratch);
    float sum = 0.0f;
    for (int t = threadIdx.x; t < positions; t += blockDim.x) {
        const float p = expf(head_scores[t] - max_score);
        head_scores[t] = p;
        sum += p;
    }
    // block_sum's barrier also makes every thread's head_scores visible to the block.
    sum = block_sum(sum, scratch);

    // 3. Value mixing.
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float mixed = 0.0f;
        for (int t = 0; t < positions; ++t)
            mixed = fmaf(head_scores[t],
                         kv_load(values + size_t(first + t) * row_stride + head_offset, d), mixed);
        out[size_t(head) * head_dim + d] = mixed / sum;
    }
}

#ifdef BARELLM_LAUNCH_FUNCTIONS

void attention_naive(float* out, const float* q, const void* key_cache, const void* value_cache,
                     const int* step, float* scores, int context, const AttentionShape& shape,
                     KvType kv_type, cudaStream_t stream) {
    with_kv_type(kv_type, [&](auto element) {
        using KvT = decltype(element);
        launch_kernel(attention_naive_kernel<KvT>, shape.heads, kNaiveAttentionThreads, 0, stream,
                      out, q, static_cast<const KvT*>(key_cache),
                      static_cast<const KvT*>(value_cache), step, scores, context, shape.heads,
                      shape.kv_heads, shape.head_dim, shape.window, shape.scale, shape.softcap);
    });
    CUDA_CHECK_LAUNCH("attention_naive_kernel");
}

#endif  // BARELLM_LAUNCH_FUNCTIONS

}  // namespace barellm::cuda
