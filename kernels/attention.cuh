// Decode attention (one query token) over the KV cache, flash-decoding style:
//
//   attention_split_kernel: the attended positions first..pos are cut into `splits` equal
//     ranges, one block per (range, KV head, group of up to kMaxHeadsPerBlock query heads
//     sharing that KV head): the block reads each key and value of its range once for all
//     its query heads and keeps an online softmax (running max and sum), tile by tile;
//     it writes its unnormalised output and (max, sum) per query head.
//   attention_merge_kernel: per query head, rescales the partials to a common max and
//     divides by the total sum.
//
// The grid is fixed for a context (splits does not depend on pos); blocks whose range is
// empty at this pos exit at once, so a captured CUDA graph replays for every position.
// Keys: a group of kKeyLanes lanes reads one key row (contiguous, head_dim elements, as
// half2/float2 pairs), all pairs of a lane loaded before use; the group's partial dot
// products meet by shuffles within the group. Values: a whole warp reads one value row
// (lane l takes pairs l, l + 32, ...), two rows in flight; each warp keeps its partial
// output in registers and the warps' partials are summed in shared memory at the end.
// No atomics anywhere.
#pragma once
#include <algorithm>
#include <cmath>
#include <string>

#include "common.cuh"
#include "cuda_check.h"
#include "kernels.h"

namespace barellm::cuda {

constexpr int kAttentionWarps = 4;
constexpr int kAttentionThreads = kAttentionWarps * kWarpSize;
constexpr int kAttentionTile = 64;      // positions scored, softmaxed and mixed per round
constexpr int kKeyLanes = 8;            // lanes reading one key row in the scoring phase
constexpr int kValueKeysInFlight = 2;   // value rows each warp loads before using them
constexpr int kMaxHeadsPerBlock = 4;    // query heads (of one KV head) per block
constexpr int kMinSplitPositions = 32;  // a split covers at least this many positions
constexpr int kMaxSplits = 256;

struct AttentionArgs {
    const float* q;         // [heads * head_dim]
    const void* keys;       // [context, kv_heads * head_dim], this layer's
    const void* values;     // [context, kv_heads * head_dim]
    const int* step;        // {token, pos}
    float* partial_out;     // [heads, splits, head_dim]
    float2* partial_stats;  // [heads, splits]: (running max, sum of exp(score - max))
    float* out;             // [heads * head_dim]
    int heads, kv_heads, head_dim, window, splits;
    float scale;  // 1 / sqrt(head_dim)
};

// The first attended position (cpu::attention_start).
__device__ __forceinline__ int attention_first(int pos, int window) {
    return window > 0 ? max(0, pos + 1 - window) : 0;
}

// Positions per split when `positions` positions are attended (the same in both kernels:
// split s covers first + s * length .. first + (s+1) * length - 1, clipped to pos, and is
// empty when s * length >= positions; at least one split is not).
__device__ __forceinline__ int split_length(int positions, int splits) {
    return max((positions + splits - 1) / splits, kMinSplitPositions);
}

// Launch: grid (splits, kv_heads, ceil(group / kMaxHeadsPerBlock)) with group = heads /
// kv_heads, block kAttentionThreads (4 warps), static shared memory
// 4 * (kMaxHeadsPerBlock * (kHeadDimMax * (1 + kAttentionWarps) + kAttentionTile) + 12) bytes
// (about 10.5 KiB for kHeadDimMax 128). kHeadDimMax is the smallest of 64, 128, 256 that
// holds head_dim; head_dim must be even.
template <typename KvT, int kHeadDimMax>
__global__ void __launch_bounds__(kAttentionThreads) attention_split_kernel(AttentionArgs a) {
    constexpr int kPairsMax = kHeadDimMax / 2;
    constexpr int kKeyPairsPerLane = (kPairsMax + kKeyLanes - 1) / kKeyLanes;
    constexpr int kValuePairsPerLane = (kPairsMax + kWarpSize - 1) / kWarpSize;
    constexpr int kKeysPerPass = kAttentionWarps * (kWarpSize / kKeyLanes);

    __shared__ __align__(16) float q_shared[kMaxHeadsPerBlock][kHeadDimMax];
    __shared__ float p_shared[kMaxHeadsPerBlock][kAttentionTile];  // scores, then exp()
    __shared__ float max_shared[kMaxHeadsPerBlock];
    __shared__ float sum_shared[kMaxHeadsPerBlock];
    __shared__ float rescale_shared[kMaxHeadsPerBlock];
    __shared__ float partial_shared[kAttentionWarps][kMaxHeadsPerBlock][kHeadDimMax];

    // This block's positions [begin, end): everything below is uniform across the block.
    const int pos = a.step[1];
    const int first = attention_first(pos, a.window);
    const int positions = pos + 1 - first;
    const int length = split_length(positions, a.splits);
    const int split = blockIdx.x;
    const int begin = first + split * length;
    if (begin > pos) return;  // an empty split: the merge kernel does not read it
    const int end = min(begin + length, pos + 1);

    const int group = a.heads / a.kv_heads;
    const int kv_head = blockIdx.y;
    const int group_offset = blockIdx.z * kMaxHeadsPerBlock;
    const int heads_here = min(kMaxHeadsPerBlock, group - group_offset);
    const int head0 = kv_head * group + group_offset;  // first query head of this block
    const int head_dim = a.head_dim, pairs = head_dim / 2;
    const size_t row_stride = size_t(a.kv_heads) * head_dim;  // cache row, in elements
    const KvT* keys = static_cast<const KvT*>(a.keys) + size_t(kv_head) * head_dim;
    const KvT* values = static_cast<const KvT*>(a.values) + size_t(kv_head) * head_dim;

    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    // The query heads of this block are consecutive: q[head0 * head_dim + i].
    for (int i = threadIdx.x; i < heads_here * head_dim; i += blockDim.x)
        q_shared[i / head_dim][i % head_dim] = a.q[size_t(head0) * head_dim + i];
    if (threadIdx.x < kMaxHeadsPerBlock) {
        max_shared[threadIdx.x] = -INFINITY;
        sum_shared[threadIdx.x] = 0.0f;
        rescale_shared[threadIdx.x] = 0.0f;
    }
    // This warp's unnormalised output, pair i of lane = pair lane + 32 i of the head.
    float2 acc[kMaxHeadsPerBlock][kValuePairsPerLane];
#pragma unroll
    for (int h = 0; h < kMaxHeadsPerBlock; ++h)
#pragma unroll
        for (int i = 0; i < kValuePairsPerLane; ++i) acc[h][i] = make_float2(0.0f, 0.0f);
    __syncthreads();

    const int key_lane = lane % kKeyLanes;  // which pairs of the key row this lane reads
    const int key_slot = warp * (kWarpSize / kKeyLanes) + lane / kKeyLanes;  // which key

    for (int tile = begin; tile < end; tile += kAttentionTile) {
        const int count = min(kAttentionTile, end - tile);

        // 1. Scores p_shared[h][k] = q_h · key(tile + k) * scale. The loop bound is the same
        //    for the whole warp (the shuffles need all 32 lanes); lanes past count load
        //    nothing and store nothing.
        for (int pass = 0; pass < count; pass += kKeysPerPass) {
            const int k = pass + key_slot;
            const bool valid = k < count;
            const KvT* key = keys + size_t(tile + (valid ? k : 0)) * row_stride;
            float2 key_pairs[kKeyPairsPerLane];
#pragma unroll
            for (int i = 0; i < kKeyPairsPerLane; ++i) {
                const int j = key_lane + i * kKeyLanes;
                key_pairs[i] = valid && j < pairs ? kv_load_pair(key, j) : make_float2(0.0f, 0.0f);
            }
#pragma unroll
            for (int h = 0; h < kMaxHeadsPerBlock; ++h) {
                if (h < heads_here) {  // uniform across the block
                    const float2* q_pairs = reinterpret_cast<const float2*>(q_shared[h]);
                    float dot = 0.0f;
#pragma unroll
                    for (int i = 0; i < kKeyPairsPerLane; ++i) {
                        const int j = key_lane + i * kKeyLanes;
                        if (j < pairs) {
                            const float2 qv = q_pairs[j];
                            dot = fmaf(qv.x, key_pairs[i].x, dot);
                            dot = fmaf(qv.y, key_pairs[i].y, dot);
                        }
                    }
                    dot = group_sum<kKeyLanes>(dot);
                    if (valid && key_lane == 0) p_shared[h][k] = dot * a.scale;
                }
            }
        }
        __syncthreads();

        // 2. Online softmax, one warp per query head: new max, p = exp(score - max), the
        //    running sum, and the factor that rescales what was accumulated before.
        for (int h = warp; h < heads_here; h += kAttentionWarps) {
            float tile_max = -INFINITY;
            for (int k = lane; k < count; k += kWarpSize)
                tile_max = fmaxf(tile_max, p_shared[h][k]);
            tile_max = warp_max(tile_max);
            const float old_max = max_shared[h];
            const float new_max = fmaxf(old_max, tile_max);
            float sum = 0.0f;
            for (int k = lane; k < count; k += kWarpSize) {
                const float p = expf(p_shared[h][k] - new_max);
                p_shared[h][k] = p;
                sum += p;
            }
            sum = warp_sum(sum);
            __syncwarp();  // every lane has read max_shared[h] before lane 0 rewrites it
            if (lane == 0) {
                const float rescale = expf(old_max - new_max);  // 0 on the first tile
                rescale_shared[h] = rescale;
                sum_shared[h] = sum_shared[h] * rescale + sum;
                max_shared[h] = new_max;
            }
        }
        __syncthreads();

        // 3. acc = acc * rescale + sum_k p[k] * value(tile + k); warp w takes keys w, w + 4, ...
#pragma unroll
        for (int h = 0; h < kMaxHeadsPerBlock; ++h) {
            if (h < heads_here) {
                const float rescale = rescale_shared[h];
#pragma unroll
                for (int i = 0; i < kValuePairsPerLane; ++i) {
                    acc[h][i].x *= rescale;
                    acc[h][i].y *= rescale;
                }
            }
        }
        for (int k0 = warp; k0 < count; k0 += kAttentionWarps * kValueKeysInFlight) {
            float2 value_pairs[kValueKeysInFlight][kValuePairsPerLane];
#pragma unroll
            for (int r = 0; r < kValueKeysInFlight; ++r) {
                const int k = k0 + r * kAttentionWarps;
                const KvT* value = values + size_t(tile + (k < count ? k : 0)) * row_stride;
#pragma unroll
                for (int i = 0; i < kValuePairsPerLane; ++i) {
                    const int j = lane + i * kWarpSize;
                    value_pairs[r][i] =
                        k < count && j < pairs ? kv_load_pair(value, j) : make_float2(0.0f, 0.0f);
                }
            }
#pragma unroll
            for (int r = 0; r < kValueKeysInFlight; ++r) {
                const int k = k0 + r * kAttentionWarps;
                if (k >= count) continue;
#pragma unroll
                for (int h = 0; h < kMaxHeadsPerBlock; ++h) {
                    if (h < heads_here) {
                        const float p = p_shared[h][k];
#pragma unroll
                        for (int i = 0; i < kValuePairsPerLane; ++i) {
                            acc[h][i].x = fmaf(p, value_pairs[r][i].x, acc[h][i].x);
                            acc[h][i].y = fmaf(p, value_pairs[r][i].y, acc[h][i].y);
                        }
                    }
                }
            }
        }
        __syncthreads();  // p_shared and rescale_shared are rewritten by the next tile
    }

    // The warps' partial outputs meet in shared memory; one thread per (head, element) sums
    // them in a fixed order and stores the block's partial.
#pragma unroll
    for (int h = 0; h < kMaxHeadsPerBlock; ++h) {
        if (h < heads_here) {
#pragma unroll
            for (int i = 0; i < kValuePairsPerLane; ++i) {
                const int j = lane + i * kWarpSize;
                if (j < pairs) {
                    partial_shared[warp][h][2 * j] = acc[h][i].x;
                    partial_shared[warp][h][2 * j + 1] = acc[h][i].y;
                }
            }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < heads_here * head_dim; i += blockDim.x) {
        const int h = i / head_dim, d = i % head_dim;
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kAttentionWarps; ++w) sum += partial_shared[w][h][d];
        a.partial_out[(size_t(head0 + h) * a.splits + split) * head_dim + d] = sum;
    }
    if (threadIdx.x < heads_here)
        a.partial_stats[size_t(head0 + threadIdx.x) * a.splits + split] =
            make_float2(max_shared[threadIdx.x], sum_shared[threadIdx.x]);
}

// out[h] = sum_s exp(m_s - M) * o_s / sum_s exp(m_s - M) * l_s over the non-empty splits s
// of head h, M = max_s m_s. Launch: grid heads, block 128, no shared memory; thread d
// handles elements d, d + 128, ... of the head (reads of o_s[d] are coalesced).
__global__ void __launch_bounds__(128) attention_merge_kernel(AttentionArgs a) {
    const int pos = a.step[1];
    const int positions = pos + 1 - attention_first(pos, a.window);
    const int length = split_length(positions, a.splits);
    const int active = (positions + length - 1) / length;  // non-empty splits, <= splits
    const int head = blockIdx.x;
    const float2* stats = a.partial_stats + size_t(head) * a.splits;
    const float* partial = a.partial_out + size_t(head) * a.splits * a.head_dim;
    float max_all = -INFINITY;
    for (int s = 0; s < active; ++s) max_all = fmaxf(max_all, stats[s].x);
    float total = 0.0f;
    for (int s = 0; s < active; ++s) total += stats[s].y * expf(stats[s].x - max_all);
    const float inverse_total = 1.0f / total;
    for (int d = threadIdx.x; d < a.head_dim; d += blockDim.x) {
        float out = 0.0f;
        for (int s = 0; s < active; ++s)
            out += partial[size_t(s) * a.head_dim + d] * expf(stats[s].x - max_all);
        a.out[size_t(head) * a.head_dim + d] = out * inverse_total;
    }
}

int attention_splits(const cpu::AttentionShape& shape, int context, int multiprocessors) {
    const int group = shape.heads / shape.kv_heads;
    const int head_blocks = (group + kMaxHeadsPerBlock - 1) / kMaxHeadsPerBlock;
    const int blocks_per_split = shape.kv_heads * head_blocks;
    // About four blocks (16 warps) per multiprocessor when the context is full...
    const int wanted = (4 * multiprocessors + blocks_per_split - 1) / blocks_per_split;
    // ...but no split shorter than kMinSplitPositions of the longest range attended.
    const int attended = shape.window > 0 ? std::min(shape.window, context) : context;
    const int useful = (attended + kMinSplitPositions - 1) / kMinSplitPositions;
    return std::max(1, std::min({wanted, useful, kMaxSplits}));
}

namespace {

template <typename KvT, int kHeadDimMax>
void launch_attention(const AttentionArgs& args, cudaStream_t stream) {
    const int group = args.heads / args.kv_heads;
    const dim3 grid(args.splits, args.kv_heads,
                    (group + kMaxHeadsPerBlock - 1) / kMaxHeadsPerBlock);
    attention_split_kernel<KvT, kHeadDimMax><<<grid, kAttentionThreads, 0, stream>>>(args);
    CUDA_CHECK_LAUNCH("attention_split_kernel");
}

template <typename KvT>
void launch_attention(const AttentionArgs& args, cudaStream_t stream) {
    if (args.head_dim <= 64)
        launch_attention<KvT, 64>(args, stream);
    else if (args.head_dim <= 128)
        launch_attention<KvT, 128>(args, stream);
    else
        launch_attention<KvT, 256>(args, stream);
}

}  // namespace

void attention(float* out, const float* q, const void* key_cache, const void* value_cache,
               const int* step, float* partial_out, float* partial_stats,
               const cpu::AttentionShape& shape, int splits, cpu::KvType kv_type,
               cudaStream_t stream) {
    if (shape.head_dim % 2 != 0 || shape.head_dim > kMaxHeadDim || shape.heads % shape.kv_heads)
        throw Error("attention: unsupported shape (head_dim " + std::to_string(shape.head_dim) +
                    ", heads " + std::to_string(shape.heads) + ", kv_heads " +
                    std::to_string(shape.kv_heads) + ")");
    if (splits < 1 || splits > kMaxSplits)
        throw Error("attention: splits must be in [1, " + std::to_string(kMaxSplits) + "]");
    AttentionArgs args;
    args.q = q;
    args.keys = key_cache;
    args.values = value_cache;
    args.step = step;
    args.partial_out = partial_out;
    args.partial_stats = reinterpret_cast<float2*>(partial_stats);
    args.out = out;
    args.heads = shape.heads;
    args.kv_heads = shape.kv_heads;
    args.head_dim = shape.head_dim;
    args.window = shape.window;
    args.splits = splits;
    args.scale = 1.0f / std::sqrt(float(shape.head_dim));
    if (kv_type == cpu::KvType::F32)
        launch_attention<float>(args, stream);
    else
        launch_attention<__half>(args, stream);
    attention_merge_kernel<<<shape.heads, 128, 0, stream>>>(args);
    CUDA_CHECK_LAUNCH("attention_merge_kernel");
}

}  // namespace barellm::cuda
