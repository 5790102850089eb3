// Decode attention (one query token) over the KV cache, flash-decoding style, in one kernel
// (attention_split_kernel), RoPE and the KV-cache write folded in.
//
// - Blocks: the attended positions first..pos are cut into `splits` equal ranges; one block
//   per (range, KV head, group of up to kMaxHeadsPerBlock query heads sharing that KV head).
// - Each block rotates its query heads (RoPE) as it loads them, one warp per head, after
//   Qwen3's per-head RMSNorm when the model has one (the warp reduces the head's squares).
//   The block whose range holds pos also normalises and rotates the token's key and stores
//   it, with the value, into row pos of the cache: the q/k norm, RoPE and the cache write
//   need no kernel of their own.
// - A block reads each key and value of its range once for all its query heads, keeps an
//   online softmax (running max and sum) tile by tile, and writes its unnormalised output
//   and (max, sum) per query head.
// - The last block of a (KV head, head group) to finish, known by an arrival counter, merges
//   the partials: it rescales them to a common max and divides by the total sum (no second
//   kernel). A lone non-empty split (pos within the first split's length) divides its own
//   sums and writes the output: no partials, no arrival.
// - Attention sinks (gpt-oss; AttentionShape::sinks): each query head's softmax has one more
//   logit, its sink, whose value is zero. It joins once, where the sums are divided: in the
//   merge, or in a lone split's output; the splits' partials know nothing of it.
// - The grid is fixed for a context (splits does not depend on pos). Blocks whose range is
//   empty at this pos exit at once and do not arrive, so a captured CUDA graph replays for
//   every position; the merging block sets its counter back to zero for the next launch.
// - Decode attention is latency-bound: a block's work is a chain of loads (keys, then
//   values, tile after tile), so each link loads as much at once as registers allow, and L2
//   is asked for a tile's rows before they are needed (the first tile's during the prologue,
//   the next tile's while one is used).
// - Keys: a group of kKeyLanes lanes reads one key row (contiguous, head_dim elements) in
//   16-byte chunks, a lane every kKeyLanes-th chunk; a lane loads the chunks of up to a whole
//   tile's keys before using any. The group's partial dot products meet by shuffles within
//   the group.
// - Values: a whole warp reads one value row, lane l its elements l * head_dim_max / 32..
//   (one load of 4-32 bytes), several rows loaded before use. Each warp keeps its partial
//   output in registers; the warps' partials are summed in shared memory at the end.
// - Rows whose head_dim is not a multiple of a load's elements (the tests' 34, 68 and 130)
//   are read element by element.
// - The only atomic is the arrival count (an integer): no float is ever added atomically.
#pragma once
#include <algorithm>
#include <cmath>
#include <string>

#include "common.cuh"
#include "cuda_check.h"
#include "dependent_launch.cuh"
#include "kernels.h"
#include "rope.cuh"

namespace barellm::cuda {

constexpr int kAttentionWarps = 4;
constexpr int kAttentionThreads = kAttentionWarps * kWarpSize;
constexpr int kAttentionBlocksPerSM = 4;  // attention_splits' aim: registers capped to hold them
constexpr int kAttentionTile = 64;        // positions scored, softmaxed and mixed per round
constexpr int kKeyLanes = 8;              // lanes reading one key row in the scoring phase
constexpr int kKeyChunkBytes = 16;        // what a lane loads of a key row at once
constexpr int kKeyChunksInFlight = 8;     // key chunks a lane loads before using them
constexpr int kValueWordsInFlight = 32;   // registers of value rows a lane loads before use
constexpr int kMaxHeadsPerBlock = 4;      // query heads (of one KV head) per block
constexpr int kMinSplitPositions = 32;    // a split covers at least this many positions
constexpr int kMaxSplits = 256;           // a multiple of 32 (merge_splits)
constexpr int kL2SectorBytes = 32;        // what one L2 prefetch request asks for, at least
constexpr int kMergeLoadsInFlight = 8;    // splits' partials a merging thread loads at once

struct AttentionArgs {
    const float* qkv;         // [heads * head_dim + 2 * kv_dim]: q, k, v before RoPE
    const float* rope_table;  // [head_dim]  RoPE: frequencies, then magnitudes
    const float* q_norm;      // [head_dim]  per-head RMSNorm of q (Qwen3), or null
    const float* k_norm;      // [head_dim]  the same of k, or null
    void* keys;               // [context, kv_dim], this layer's; row pos written
    void* values;             // [context, kv_dim]
    const int* step;          // {token, pos}
    float* partial_out;       // [heads, splits, head_dim]
    float2* partial_stats;    // [heads, splits]: (running max, sum of exp(score - max))
    unsigned* arrivals;       // [kv_heads * head groups]: blocks done; 0 between launches
    float* out;               // [heads * head_dim]
    const float* sinks;       // [heads]  each query head's sink logit, or null
    int heads, kv_heads, head_dim, window, splits;
    float scale;     // of q·k (AttentionShape::scale)
    float softcap;   // of the scores (AttentionShape::softcap), 0 for none
    float norm_eps;  // of q_norm and k_norm
};

// The first attended position (attention_start).
__device__ __forceinline__ int attention_first(int pos, int window) {
    return window > 0 ? max(0, pos + 1 - window) : 0;
}

// Positions per split when `positions` positions are attended (the same in both kernels:
// split s covers first + s * length .. first + (s+1) * length - 1, clipped to pos, and is
// empty when s * length >= positions; at least one split is not).
__device__ __forceinline__ int split_length(int positions, int splits) {
    return max((positions + splits - 1) / splits, kMinSplitPositions);
}

// Row pos of the cache for KV head kv_head (keys and values point at that head's columns of
// row 0): the token's key k[head_dim], RMSNormed with k_norm when given, rotated by rope
// (cos, sin) per pair, and its value v[head_dim]. Every thread of the block calls it (each
// warp reduces the key's squares itself: no barrier); the caller's barrier makes the row
// visible to the whole block.
template <typename KvT>
__device__ __forceinline__ void store_new_kv_row(KvT* keys, KvT* values, size_t row_stride, int pos,
                                                 const float* k, const float* v, const float2* rope,
                                                 int head_dim, const float* k_norm, float eps) {
    const int pairs = head_dim / 2;
    KvT* key_row = keys + size_t(pos) * row_stride;
    KvT* value_row = values + size_t(pos) * row_stride;
    const float scale = k_norm != nullptr ? head_rms_scale(k, head_dim, eps) : 1.0f;
    for (int j = threadIdx.x; j < pairs; j += blockDim.x) {
        const float2 pair = head_pair(k, j, pairs, k_norm, scale);
        const float2 rotated = rope_rotate(pair.x, pair.y, rope[j]);
        kv_store(key_row + j, rotated.x);
        kv_store(key_row + j + pairs, rotated.y);
    }
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) kv_store(value_row + d, v[d]);
}

// What turns a query head's unnormalised output, with running max m and sum l of its scores'
// exp(score - m), into its attention output: 1 / l, or with a sink logit s (sinks given: the
// head's sinks[head]) e^(m - M) / (l e^(m - M) + e^(s - M)), M = max(m, s), so that neither
// exponential overflows whichever of the two is larger.
__device__ __forceinline__ float output_factor(float m, float l, const float* sinks, int head) {
    if (sinks == nullptr) return 1.0f / l;
    const float sink = sinks[head];
    const float largest = fmaxf(m, sink);
    const float kept = expf(m - largest);
    return kept / (l * kept + expf(sink - largest));
}

__device__ __forceinline__ float2 add_scaled(float2 sum, float2 v, float scale) {
    return make_float2(fmaf(v.x, scale, sum.x), fmaf(v.y, scale, sum.y));
}
__device__ __forceinline__ float4 add_scaled(float4 sum, float4 v, float scale) {
    return make_float4(fmaf(v.x, scale, sum.x), fmaf(v.y, scale, sum.y), fmaf(v.z, scale, sum.z),
                       fmaf(v.w, scale, sum.w));
}

// The merge's sums: out[h] = inverse_total[h] * sum_s weight[h][s] * o_s for the block's
// heads_here query heads (from head0) over the `active` splits, a Vector (float2 or float4,
// head_dim a multiple of its floats) of one head's output per thread and round, the splits'
// loads kMergeLoadsInFlight at a time.
template <typename Vector>
__device__ __forceinline__ void weigh_partials(const AttentionArgs& a, int head0, int heads_here,
                                               int active, const float (*weight)[kMaxSplits],
                                               const float* inverse_total) {
    const int vectors = a.head_dim / int(sizeof(Vector) / sizeof(float));  // per head
    for (int i = threadIdx.x; i < heads_here * vectors; i += blockDim.x) {
        const int h = i / vectors, j = i % vectors;
        const Vector* partial = reinterpret_cast<const Vector*>(
            a.partial_out + size_t(head0 + h) * a.splits * a.head_dim);
        Vector sum{};
#pragma unroll kMergeLoadsInFlight
        for (int s = 0; s < active; ++s)
            sum = add_scaled(sum, __ldcg(partial + size_t(s) * vectors + j), weight[h][s]);
        reinterpret_cast<Vector*>(a.out + size_t(head0 + h) * a.head_dim)[j] =
            add_scaled(Vector{}, sum, inverse_total[h]);
    }
}

// The merge, run by the last block of a (KV head, head group) to finish, for each of its
// heads_here query heads h (from head0), over the `active` non-empty splits s:
//   out[h] = sum_s exp(m_s - M) * o_s / sum_s exp(m_s - M) * l_s,  M = max_s m_s,
// and with sinks, the head's sink logit σ joins the max and the total once:
//   M = max(σ, max_s m_s), the denominator + exp(σ - M).
// - Warp h loads head h's (max, sum) per split once and writes the weights exp(m_s - M) to
//   shared memory.
// - Then each thread sums four (or two) floats of the output over the splits
//   (weigh_partials; reads of one split's row are coalesced).
// - Partials written by other blocks are read through L2 (__ldcg), past this SM's L1.
template <int kHeadDimMax>
__device__ __forceinline__ void merge_splits(const AttentionArgs& a, int head0, int heads_here,
                                             int active) {
    __shared__ float weight_shared[kMaxHeadsPerBlock][kMaxSplits];  // exp(m_s - M)
    __shared__ float inverse_total_shared[kMaxHeadsPerBlock];
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    for (int h = warp; h < heads_here; h += kAttentionWarps) {
        // Lane l holds the (max, sum) of splits l, l + 32, ...: loaded once, all at once.
        constexpr int kSplitsPerLane = kMaxSplits / kWarpSize;
        const float2* stats = a.partial_stats + size_t(head0 + h) * a.splits;
        float2 lane_stats[kSplitsPerLane];
        float max_all = -INFINITY;
#pragma unroll
        for (int i = 0; i < kSplitsPerLane; ++i) {
            const int s = lane + i * kWarpSize;
            lane_stats[i] = s < active ? __ldcg(stats + s) : make_float2(-INFINITY, 0.0f);
            max_all = fmaxf(max_all, lane_stats[i].x);
        }
        max_all = warp_max(max_all);
        if (a.sinks != nullptr) max_all = fmaxf(max_all, a.sinks[head0 + h]);
        float total = 0.0f;
#pragma unroll
        for (int i = 0; i < kSplitsPerLane; ++i) {
            const int s = lane + i * kWarpSize;
            if (s < active) {
                const float weight = expf(lane_stats[i].x - max_all);
                weight_shared[h][s] = weight;
                total += lane_stats[i].y * weight;
            }
        }
        total = warp_sum(total);
        if (a.sinks != nullptr) total += expf(a.sinks[head0 + h] - max_all);
        if (lane == 0) inverse_total_shared[h] = 1.0f / total;
    }
    __syncthreads();
    // Four floats a thread where the rows allow it, else two.
    const size_t addresses =
        reinterpret_cast<size_t>(a.partial_out) | reinterpret_cast<size_t>(a.out);
    if (a.head_dim % 4 == 0 && addresses % sizeof(float4) == 0)
        weigh_partials<float4>(a, head0, heads_here, active, weight_shared, inverse_total_shared);
    else
        weigh_partials<float2>(a, head0, heads_here, active, weight_shared, inverse_total_shared);
}

// `value` clamped to [low, high], for the kernels' compile-time shapes.
__host__ __device__ constexpr int clamp_constant(int value, int low, int high) {
    return value < low ? low : value > high ? high : value;
}

// kCount consecutive elements of a cache row, held as stored (f16 or f32) until used: one
// load of kCount * sizeof(KvT) bytes (4 to 32) where the row's layout allows it.
template <typename KvT, int kCount>
struct alignas(kCount * sizeof(KvT) < 16 ? kCount * sizeof(KvT) : 16) RowSlice {
    KvT element[kCount];
};

// Elements first..first + kCount - 1 of a cache row (first < head_dim). `whole`: the slice is
// aligned and inside the row (head_dim and the cache's start are multiples of kCount
// elements), so it is one load; otherwise element by element, zero past head_dim.
template <int kCount, typename KvT>
__device__ __forceinline__ RowSlice<KvT, kCount> load_row_slice(const KvT* row, int first,
                                                                int head_dim, bool whole) {
    if (whole) return *reinterpret_cast<const RowSlice<KvT, kCount>*>(row + first);
    RowSlice<KvT, kCount> slice;
#pragma unroll
    for (int e = 0; e < kCount; ++e)
        slice.element[e] = first + e < head_dim ? row[first + e] : KvT{};
    return slice;
}

// True when every row of the cache slices into aligned loads of kCount elements: head_dim a
// multiple of kCount and both caches starting at such a boundary (rows are kv_dim apart).
template <int kCount, typename KvT>
__device__ __forceinline__ bool whole_slices(const KvT* keys, const KvT* values, int head_dim) {
    const size_t addresses = reinterpret_cast<size_t>(keys) | reinterpret_cast<size_t>(values);
    return head_dim % kCount == 0 && addresses % alignof(RowSlice<KvT, kCount>) == 0;
}

// Asks L2 for the key and value rows of positions [from, to) of one KV head (keys and values
// at that head's columns of row 0), one request per kL2SectorBytes of a row, spread over the
// block's threads: a hint, issued before the loads that use the rows.
template <typename KvT>
__device__ __forceinline__ void prefetch_kv_rows(const KvT* keys, const KvT* values,
                                                 size_t row_stride, int from, int to,
                                                 int head_dim) {
    const int sectors = (head_dim * int(sizeof(KvT)) + kL2SectorBytes - 1) / kL2SectorBytes;
    for (int i = threadIdx.x; i < (to - from) * sectors; i += blockDim.x) {
        const size_t row = size_t(from + i / sectors) * row_stride;
        const int offset = (i % sectors) * kL2SectorBytes;
        prefetch_l2(reinterpret_cast<const char*>(keys + row) + offset);
        prefetch_l2(reinterpret_cast<const char*>(values + row) + offset);
    }
}

// Launch: grid (splits, kv_heads, ceil(group / kMaxHeadsPerBlock)) with group = heads /
// kv_heads, block kAttentionThreads (4 warps), static shared memory 4 * (kMaxHeadsPerBlock *
// (kHeadDimMax * (1 + kAttentionWarps) + kAttentionTile + kMaxSplits + 4) + kHeadDimMax)
// bytes and a flag (about 15.6 KiB for kHeadDimMax 128). kHeadDimMax is the smallest of 64,
// 128, 256 that holds head_dim; head_dim must be even.
template <typename KvT, int kHeadDimMax>
__global__ void __launch_bounds__(kAttentionThreads, kAttentionBlocksPerSM)
    attention_split_kernel(AttentionArgs a) {
    constexpr int kPairsMax = kHeadDimMax / 2;
    // Keys: a group of kKeyLanes lanes per key row, lane i of the group loading chunks i,
    // i + kKeyLanes, ... of kKeyChunk elements; a block scores kKeysPerPass keys a pass and
    // loads kPassesInFlight passes' chunks before using them.
    constexpr int kKeyChunk = kKeyChunkBytes / int(sizeof(KvT));
    constexpr int kKeyChunksPerLane = kHeadDimMax / kKeyChunk / kKeyLanes;
    constexpr int kKeysPerPass = kAttentionWarps * (kWarpSize / kKeyLanes);
    constexpr int kPassesInFlight =
        clamp_constant(kKeyChunksInFlight / kKeyChunksPerLane, 1, kAttentionTile / kKeysPerPass);
    // Values: a warp per value row, lane l holding elements l * kValueSlice.. of the head (its
    // part of the output too); each warp loads kValueRowsInFlight rows before using them.
    constexpr int kValueSlice = kHeadDimMax / kWarpSize;
    constexpr int kValueRowWords = (kValueSlice * int(sizeof(KvT)) + 3) / 4;
    constexpr int kValueRowsInFlight =
        clamp_constant(kValueWordsInFlight / kValueRowWords, 1, kAttentionTile / kAttentionWarps);
    static_assert(kKeyChunksPerLane * kKeyChunk * kKeyLanes == kHeadDimMax,
                  "the key lanes' chunks cover kHeadDimMax exactly");

    __shared__ __align__(16) float q_shared[kMaxHeadsPerBlock][kHeadDimMax];  // 0 past head_dim
    __shared__ float2 rope_shared[kPairsMax];  // (cos, sin) of pair j's angle at pos
    __shared__ float p_shared[kMaxHeadsPerBlock][kAttentionTile];  // scores, then exp()
    __shared__ float max_shared[kMaxHeadsPerBlock];
    __shared__ float sum_shared[kMaxHeadsPerBlock];
    __shared__ float rescale_shared[kMaxHeadsPerBlock];
    __shared__ float partial_shared[kAttentionWarps][kMaxHeadsPerBlock][kHeadDimMax];
    __shared__ bool last_shared;  // this block merges

    // This block's positions [begin, end): everything below is uniform across the block.
    const int pos = a.step[1];
    const int first = attention_first(pos, a.window);
    const int positions = pos + 1 - first;
    const int length = split_length(positions, a.splits);
    const int split = blockIdx.x;
    const int active = (positions + length - 1) / length;  // non-empty splits, <= splits
    const int begin = first + split * length;
    if (split >= active) return;  // an empty split (begin > pos): it neither arrives nor is merged
    const int end = min(begin + length, pos + 1);

    const int group = a.heads / a.kv_heads;
    const int kv_head = blockIdx.y;
    const int group_offset = blockIdx.z * kMaxHeadsPerBlock;
    const int heads_here = min(kMaxHeadsPerBlock, group - group_offset);
    const int head0 = kv_head * group + group_offset;  // first query head of this block
    const int head_dim = a.head_dim, pairs = head_dim / 2;
    const int q_dim = a.heads * head_dim, kv_dim = a.kv_heads * head_dim;
    const size_t row_stride = size_t(kv_dim);  // cache row, in elements
    KvT* const keys = static_cast<KvT*>(a.keys) + size_t(kv_head) * head_dim;
    KvT* const values = static_cast<KvT*>(a.values) + size_t(kv_head) * head_dim;
    const bool whole_key_chunks = whole_slices<kKeyChunk>(keys, values, head_dim);
    const bool whole_value_slices = whole_slices<kValueSlice>(keys, values, head_dim);

    // The first tile's rows are asked of L2 now, while the query is rotated: a prefetch
    // changes no value read, so it may come before finish_prologue.
    prefetch_kv_rows(keys, values, row_stride, begin, min(begin + kAttentionTile, end), head_dim);
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    for (int j = threadIdx.x; j < pairs; j += blockDim.x)
        rope_shared[j] = rope_cos_sin(pos, a.rope_table, j, pairs);
    if (threadIdx.x < kMaxHeadsPerBlock) {
        max_shared[threadIdx.x] = -INFINITY;
        sum_shared[threadIdx.x] = 0.0f;
        rescale_shared[threadIdx.x] = 0.0f;
    }
    finish_prologue();  // qkv, the cache and the merge's buffers: the kernels ahead wrote them
    __syncthreads();
    // The query heads of this block (consecutive: q starts at qkv + head0 * head_dim), normed
    // (with q_norm) and rotated, warp h taking head h; zero past head_dim, where the key
    // chunks are zero too.
    for (int h = warp; h < heads_here; h += kAttentionWarps) {
        const float* q = a.qkv + size_t(head0 + h) * head_dim;
        const float scale = a.q_norm != nullptr ? head_rms_scale(q, head_dim, a.norm_eps) : 1.0f;
#pragma unroll 1  // 1-4 rounds; unrolled, the f32-cache kernel for head_dim 128 spills
        for (int j = lane; j < pairs; j += kWarpSize) {
            const float2 pair = head_pair(q, j, pairs, a.q_norm, scale);
            const float2 rotated = rope_rotate(pair.x, pair.y, rope_shared[j]);
            q_shared[h][j] = rotated.x;
            q_shared[h][j + pairs] = rotated.y;
        }
        for (int d = head_dim + lane; d < kHeadDimMax; d += kWarpSize) q_shared[h][d] = 0.0f;
    }
    // The token's own key and value, which this block attends to last. With more than one
    // head group per KV head, each group's last block stores the same row (identical values).
    if (end == pos + 1)
        store_new_kv_row(keys, values, row_stride, pos, a.qkv + q_dim + size_t(kv_head) * head_dim,
                         a.qkv + q_dim + kv_dim + size_t(kv_head) * head_dim, rope_shared, head_dim,
                         a.k_norm, a.norm_eps);
    // This warp's unnormalised output: elements lane * kValueSlice.. of each head.
    float acc[kMaxHeadsPerBlock][kValueSlice];
#pragma unroll
    for (int h = 0; h < kMaxHeadsPerBlock; ++h)
#pragma unroll
        for (int e = 0; e < kValueSlice; ++e) acc[h][e] = 0.0f;
    __syncthreads();

    const int key_lane = lane % kKeyLanes;  // which chunks of the key row this lane reads
    const int key_slot = warp * (kWarpSize / kKeyLanes) + lane / kKeyLanes;  // which key
    const int key_chunks = (head_dim + kKeyChunk - 1) / kKeyChunk;           // per row
    const int value_first = lane * kValueSlice;  // this lane's elements of a value row

    for (int tile = begin; tile < end; tile += kAttentionTile) {
        const int count = min(kAttentionTile, end - tile);
        // The next tile's rows, asked of L2 while this one is used.
        if (tile + kAttentionTile < end)
            prefetch_kv_rows(keys, values, row_stride, tile + kAttentionTile,
                             min(tile + 2 * kAttentionTile, end), head_dim);

        // 1. Scores p_shared[h][k] = q_h · key(tile + k) * scale, kPassesInFlight passes
        //    loaded at once. The loop bound is the same for the whole warp (the shuffles need
        //    all 32 lanes); lanes past count load nothing and store nothing.
        for (int pass0 = 0; pass0 < count; pass0 += kKeysPerPass * kPassesInFlight) {
            RowSlice<KvT, kKeyChunk> chunks[kPassesInFlight][kKeyChunksPerLane];
#pragma unroll
            for (int p = 0; p < kPassesInFlight; ++p) {
                const int k = pass0 + p * kKeysPerPass + key_slot;
                const KvT* key = keys + size_t(tile + min(k, count - 1)) * row_stride;
#pragma unroll
                for (int i = 0; i < kKeyChunksPerLane; ++i) {
                    const int c = key_lane + i * kKeyLanes;
                    chunks[p][i] = k < count && c < key_chunks
                                       ? load_row_slice<kKeyChunk>(key, c * kKeyChunk, head_dim,
                                                                   whole_key_chunks)
                                       : RowSlice<KvT, kKeyChunk>{};
                }
            }
#pragma unroll
            for (int p = 0; p < kPassesInFlight; ++p) {
                const int k = pass0 + p * kKeysPerPass + key_slot;
#pragma unroll
                for (int h = 0; h < kMaxHeadsPerBlock; ++h) {
                    if (h < heads_here) {  // uniform across the block
                        float dot = 0.0f;
#pragma unroll
                        for (int i = 0; i < kKeyChunksPerLane; ++i) {
                            const int c = key_lane + i * kKeyLanes;
                            const float* q = &q_shared[h][c * kKeyChunk];
#pragma unroll
                            for (int e = 0; e < kKeyChunk; ++e)
                                dot = fmaf(q[e], kv_float(chunks[p][i].element[e]), dot);
                        }
                        dot = group_sum<kKeyLanes>(dot);
                        if (k < count && key_lane == 0)
                            p_shared[h][k] = soft_capped(dot * a.scale, a.softcap);
                    }
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

        // 3. acc = acc * rescale + sum_k p[k] * value(tile + k); warp w takes keys w, w + 4,
        //    ..., kValueRowsInFlight rows loaded at once.
#pragma unroll
        for (int h = 0; h < kMaxHeadsPerBlock; ++h) {
            if (h < heads_here) {
                const float rescale = rescale_shared[h];
#pragma unroll
                for (int e = 0; e < kValueSlice; ++e) acc[h][e] *= rescale;
            }
        }
        for (int k0 = warp; k0 < count; k0 += kAttentionWarps * kValueRowsInFlight) {
            RowSlice<KvT, kValueSlice> rows[kValueRowsInFlight];
#pragma unroll
            for (int r = 0; r < kValueRowsInFlight; ++r) {
                const int k = k0 + r * kAttentionWarps;
                rows[r] =
                    k < count && value_first < head_dim
                        ? load_row_slice<kValueSlice>(values + size_t(tile + k) * row_stride,
                                                      value_first, head_dim, whole_value_slices)
                        : RowSlice<KvT, kValueSlice>{};
            }
#pragma unroll
            for (int r = 0; r < kValueRowsInFlight; ++r) {
                const int k = k0 + r * kAttentionWarps;
                if (k >= count) continue;
#pragma unroll
                for (int h = 0; h < kMaxHeadsPerBlock; ++h) {
                    if (h < heads_here) {
                        const float p = p_shared[h][k];
#pragma unroll
                        for (int e = 0; e < kValueSlice; ++e)
                            acc[h][e] = fmaf(p, kv_float(rows[r].element[e]), acc[h][e]);
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
            for (int e = 0; e < kValueSlice; ++e)
                if (value_first + e < head_dim)
                    partial_shared[warp][h][value_first + e] = acc[h][e];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < heads_here * head_dim; i += blockDim.x) {
        const int h = i / head_dim, d = i % head_dim;
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kAttentionWarps; ++w) sum += partial_shared[w][h][d];
        if (active == 1)  // a lone split's sums are the output once divided by the total
            a.out[size_t(head0 + h) * head_dim + d] =
                sum * output_factor(max_shared[h], sum_shared[h], a.sinks, head0 + h);
        else
            a.partial_out[(size_t(head0 + h) * a.splits + split) * head_dim + d] = sum;
    }
    if (active == 1) return;  // nothing to merge: no partials, no arrival
    if (int(threadIdx.x) < heads_here)
        a.partial_stats[size_t(head0 + threadIdx.x) * a.splits + split] =
            make_float2(max_shared[threadIdx.x], sum_shared[threadIdx.x]);

    // Arrival: the partials are made visible to the whole GPU, then counted; the block that
    // completes the count merges them all and leaves the counter at zero.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned* arrivals = a.arrivals + blockIdx.y * gridDim.z + blockIdx.z;
        last_shared = atomicAdd(arrivals, 1u) + 1 == unsigned(active);
        if (last_shared) *arrivals = 0;  // every block of this launch has arrived
    }
    __syncthreads();
    if (last_shared) {
        __threadfence();  // the other blocks' partials are read after their arrival
        merge_splits<kHeadDimMax>(a, head0, heads_here, active);
    }
}

// ---- Launch shape

// Blocks per KV head in a split: its query heads in groups of up to kMaxHeadsPerBlock.
inline int attention_head_blocks(int heads, int kv_heads) {
    const int group = heads / kv_heads;
    return (group + kMaxHeadsPerBlock - 1) / kMaxHeadsPerBlock;
}

inline dim3 attention_grid(int splits, int heads, int kv_heads) {
    return dim3(splits, kv_heads, attention_head_blocks(heads, kv_heads));
}

// Calls launch(std::integral_constant<int, kHeadDimMax>{}) with attention_split_kernel's
// kHeadDimMax for head_dim: the smallest of 64, 128 and 256 that holds it.
template <typename Launch>
void with_attention_head_dim_max(int head_dim, Launch launch) {
    if (head_dim <= 64)
        launch(std::integral_constant<int, 64>{});
    else if (head_dim <= 128)
        launch(std::integral_constant<int, 128>{});
    else
        launch(std::integral_constant<int, 256>{});
}

// The kernel's arguments for attention() (kernels.h) with `splits` splits.
inline AttentionArgs attention_args(float* out, const float* qkv, const float* rope_table,
                                    const float* q_norm, const float* k_norm, float eps,
                                    void* key_cache, void* value_cache, const int* step,
                                    float* partial_out, float* partial_stats, unsigned* arrivals,
                                    const AttentionShape& shape, int splits) {
    AttentionArgs args;
    args.qkv = qkv;
    args.rope_table = rope_table;
    args.q_norm = q_norm;
    args.k_norm = k_norm;
    args.keys = key_cache;
    args.values = value_cache;
    args.step = step;
    args.partial_out = partial_out;
    args.partial_stats = reinterpret_cast<float2*>(partial_stats);
    args.arrivals = arrivals;
    args.out = out;
    args.sinks = shape.sinks;
    args.heads = shape.heads;
    args.kv_heads = shape.kv_heads;
    args.head_dim = shape.head_dim;
    args.window = shape.window;
    args.splits = splits;
    args.scale = shape.scale;
    args.softcap = shape.softcap;
    args.norm_eps = eps;
    return args;
}

#ifdef BARELLM_LAUNCH_FUNCTIONS

int attention_splits(const AttentionShape& shape, int context, int multiprocessors) {
    const int head_blocks = attention_head_blocks(shape.heads, shape.kv_heads);
    const int blocks_per_split = shape.kv_heads * head_blocks;
    // About four blocks (16 warps) per multiprocessor when the context is full...
    const int wanted = (4 * multiprocessors + blocks_per_split - 1) / blocks_per_split;
    // ...but no split shorter than kMinSplitPositions of the longest range attended.
    const int attended = shape.window > 0 ? std::min(shape.window, context) : context;
    const int useful = (attended + kMinSplitPositions - 1) / kMinSplitPositions;
    return std::max(1, std::min({wanted, useful, kMaxSplits}));
}

namespace {

template <typename KvT>
void launch_attention(const AttentionArgs& args, cudaStream_t stream) {
    const dim3 grid = attention_grid(args.splits, args.heads, args.kv_heads);
    with_attention_head_dim_max(args.head_dim, [&](auto head_dim_max) {
        launch_after_previous(attention_split_kernel<KvT, decltype(head_dim_max)::value>, grid,
                              dim3(kAttentionThreads), 0, stream, args);
    });
    CUDA_CHECK_LAUNCH("attention_split_kernel");
}

}  // namespace

int attention_arrival_counters(const AttentionShape& shape) {
    return shape.kv_heads * attention_head_blocks(shape.heads, shape.kv_heads);
}

void attention(float* out, const float* qkv, const float* rope_table, const float* q_norm,
               const float* k_norm, float eps, void* key_cache, void* value_cache, const int* step,
               float* partial_out, float* partial_stats, unsigned* arrivals,
               const AttentionShape& shape, int splits, KvType kv_type, cudaStream_t stream) {
    if (shape.head_dim % 2 != 0 || shape.head_dim > kMaxHeadDim || shape.heads % shape.kv_heads)
        throw Error("attention: unsupported shape (head_dim " + std::to_string(shape.head_dim) +
                    ", heads " + std::to_string(shape.heads) + ", kv_heads " +
                    std::to_string(shape.kv_heads) + ")");
    if (splits < 1 || splits > kMaxSplits)
        throw Error("attention: splits must be in [1, " + std::to_string(kMaxSplits) + "]");
    const AttentionArgs args =
        attention_args(out, qkv, rope_table, q_norm, k_norm, eps, key_cache, value_cache, step,
                       partial_out, partial_stats, arrivals, shape, splits);
    with_kv_type(kv_type, [&](auto element) { launch_attention<decltype(element)>(args, stream); });
}

#endif  // BARELLM_LAUNCH_FUNCTIONS

}  // namespace barellm::cuda
