// Attention of a server step (kernels.h, attention_paged) over the paged KV cache: every row
// of the step is one query token of some sequence at its own position, and reads the keys and
// values of its sequence through its block table (position p is slot p % block_size of pool
// block table[p / block_size]). The rows of a prompt chunk attend causally: each sees the
// positions up to its own, all written before (rope_kv_store_paged).
//
// Flash-decoding over blocks, in two kernels:
// - attention_paged_split_kernel: a row's visible KV blocks are cut into `splits` runs of
//   whole blocks; one CUDA block per (run, up to 4 query heads of one KV head, row) keeps an
//   online softmax (running max and sum) per query head over its positions and writes its
//   unnormalised outputs and (max, sum). A short row leaves its later runs empty: those write
//   (-inf, 0) and zeros.
//   Inside a block, warp w takes positions w, w + 4, ... of the run: its lanes hold each
//   head's query as pairs (lane l: pairs l, l + 32, ...), read the key's pairs once for all
//   the heads, meet in a warp sum per head for the scores, and mix the value's pairs, read
//   once, into each head's output. A warp loads the keys and values of several positions
//   (2-8, as head_dim allows) before using the first, so that it waits on its loads once
//   per several positions, not once per position. The four warps' states are merged in
//   shared memory.
// - attention_paged_merge_kernel: per (query head, row), rescales the runs' partials to a
//   common max, divides by the total sum and stores the head's output in the wo product's
//   input dtype. With attention sinks (gpt-oss; AttentionShape::sinks), the head's sink logit
//   σ, whose value is zero, joins there once: in the common max and as exp(σ - max) in the
//   total; the runs know nothing of it.
//
// Device code first; the launch shapes as host functions outside the CUDA-only part, so that
// the emulated unit tests launch the kernels exactly as attention_paged does.
#pragma once
#include <cmath>
#include <string>

#include "common.cuh"
#include "cuda_check.h"
#include "kernels.h"
#include "prefill.cuh"  // store_activation, activation_row

namespace barellm::cuda {

constexpr int kPagedWarps = 4;
constexpr int kPagedThreads = kPagedWarps * kWarpSize;
constexpr int kPagedHeadsPerBlock = 4;  // query heads of one KV head per block
constexpr int kPagedPairsInFlight = 8;  // key and value pairs a lane loads before using them

struct PagedAttentionArgs {
    const float* qkv;  // [rows, qkv_pitch]: each row's rotated q first
    int qkv_pitch;
    const void* keys;         // [kv_blocks * block_size, kv_dim] of KvT: this layer's pool
    const void* values;       // the same for values
    const int* positions;     // [rows]
    const int* block_tables;  // [rows, table_stride]
    int table_stride, block_size;
    float* partial_out;    // [rows, heads, splits, head_dim]
    float* partial_stats;  // [rows, heads, splits, 2]: (max, sum of exp(score - max))
    int heads, kv_heads, head_dim, window, splits;
    float scale;    // of q·k
    float softcap;  // of the scores, 0 for none
};

// Positions first .. last (inclusive) that run `split` of a row covers: the row sees
// attention_start(pos, window) .. pos; its KV blocks are cut into `splits` runs of
// ceil(blocks / splits) whole blocks. Empty (first > last) for a run past the row's blocks.
__host__ __device__ inline int2 paged_split_positions(int pos, int window, int block_size,
                                                      int split, int splits) {
    int first = 0;
    if (window > 0 && pos + 1 - window > 0) first = pos + 1 - window;
    const int first_block = first / block_size, blocks = pos / block_size - first_block + 1;
    const int per_split = (blocks + splits - 1) / splits;
    const int begin_block = first_block + split * per_split;
    const int begin = begin_block * block_size > first ? begin_block * block_size : first;
    const int end_position = (begin_block + per_split) * block_size - 1;
    const int end = end_position < pos ? end_position : pos;
    return make_int2(begin, end);
}

// The partial outputs of run blockIdx.x of row blockIdx.z for up to kPagedHeadsPerBlock
// query heads of one KV head: blockIdx.y = kv_head * head_groups + g takes query heads
// kv_head * group + 4g .. (see the file's comment). kPairs: the pairs of a head a lane holds
// (head_dim <= 64 * kPairs).
// Launch: grid (splits, kv_heads * ceil(group / 4), rows), block 128, static shared memory
// only (the warps' states: 16 KiB).
template <typename KvT, int kPairs>
__global__ void __launch_bounds__(kPagedThreads)
    attention_paged_split_kernel(PagedAttentionArgs a) {
    constexpr int kHeads = kPagedHeadsPerBlock;
    __shared__ float warp_out[kPagedWarps][kHeads][kMaxHeadDim];
    __shared__ float warp_max_sum[kPagedWarps][kHeads][2];
    const int split = blockIdx.x, row = blockIdx.z;
    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    const int group = a.heads / a.kv_heads;
    const int head_groups = (group + kHeads - 1) / kHeads;
    const int kv_head = blockIdx.y / head_groups;
    const int first_in_group = blockIdx.y % head_groups * kHeads;
    const int first_head = kv_head * group + first_in_group;
    const int heads = min(kHeads, group - first_in_group);  // this block's query heads
    const int kv_dim = a.kv_heads * a.head_dim, half_dim = a.head_dim / 2;
    const int pos = a.positions[row];
    const int2 range = paged_split_positions(pos, a.window, a.block_size, split, a.splits);
    const int* table = a.block_tables + size_t(row) * a.table_stride;
    const KvT* keys = static_cast<const KvT*>(a.keys) + size_t(kv_head) * a.head_dim;
    const KvT* values = static_cast<const KvT*>(a.values) + size_t(kv_head) * a.head_dim;

    // Each warp: every head's query pairs, output pairs and softmax state, in registers.
    float2 q[kHeads][kPairs], acc[kHeads][kPairs];
    float running_max[kHeads], running_sum[kHeads];
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
        const float* query =
            a.qkv + size_t(row) * a.qkv_pitch + size_t(first_head + h) * a.head_dim;
#pragma unroll
        for (int i = 0; i < kPairs; ++i) {
            const int pair = lane + i * kWarpSize;
            q[h][i] = h < heads && pair < half_dim ? reinterpret_cast<const float2*>(query)[pair]
                                                   : make_float2(0.0f, 0.0f);
            acc[h][i] = make_float2(0.0f, 0.0f);
        }
        running_max[h] = -INFINITY;
        running_sum[h] = 0.0f;
    }
    // Positions p0, p0 + 4, ... of this warp, kPositions at a time: their keys and values are
    // all loaded before the first is used.
    constexpr int kPositions = kPagedPairsInFlight / kPairs;
    for (int p0 = range.x + warp; p0 <= range.y; p0 += kPagedWarps * kPositions) {
        float2 k[kPositions][kPairs], v[kPositions][kPairs];  // read once for every head
#pragma unroll
        for (int r = 0; r < kPositions; ++r) {
            const int p = p0 + r * kPagedWarps;
            const bool here = p <= range.y;
            const size_t slot =
                here ? size_t(table[p / a.block_size]) * a.block_size + p % a.block_size : 0;
#pragma unroll
            for (int i = 0; i < kPairs; ++i) {
                const int pair = lane + i * kWarpSize;
                const bool load = here && pair < half_dim;
                k[r][i] = load ? kv_load_pair(keys + slot * kv_dim, pair) : make_float2(0.0f, 0.0f);
                v[r][i] =
                    load ? kv_load_pair(values + slot * kv_dim, pair) : make_float2(0.0f, 0.0f);
            }
        }
#pragma unroll
        for (int r = 0; r < kPositions; ++r) {
            if (p0 + r * kPagedWarps > range.y) break;  // the same for the whole warp
            float rescale[kHeads], weight[kHeads];
#pragma unroll
            for (int h = 0; h < kHeads; ++h) {
                float dot = 0.0f;
#pragma unroll
                for (int i = 0; i < kPairs; ++i)
                    dot += q[h][i].x * k[r][i].x + q[h][i].y * k[r][i].y;
                const float score = soft_capped(warp_sum(dot) * a.scale, a.softcap);
                const float new_max = fmaxf(running_max[h], score);
                rescale[h] = expf(running_max[h] - new_max);  // 0 the first time
                weight[h] = expf(score - new_max);
                running_sum[h] = running_sum[h] * rescale[h] + weight[h];
                running_max[h] = new_max;
            }
#pragma unroll
            for (int i = 0; i < kPairs; ++i) {
#pragma unroll
                for (int h = 0; h < kHeads; ++h) {
                    acc[h][i].x = acc[h][i].x * rescale[h] + weight[h] * v[r][i].x;
                    acc[h][i].y = acc[h][i].y * rescale[h] + weight[h] * v[r][i].y;
                }
            }
        }
    }

    // The warps' states merged per head: rescaled to the block's max.
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
#pragma unroll
        for (int i = 0; i < kPairs; ++i) {
            const int pair = lane + i * kWarpSize;
            if (pair < half_dim) {
                warp_out[warp][h][2 * pair] = acc[h][i].x;
                warp_out[warp][h][2 * pair + 1] = acc[h][i].y;
            }
        }
        if (lane == 0) {
            warp_max_sum[warp][h][0] = running_max[h];
            warp_max_sum[warp][h][1] = running_sum[h];
        }
    }
    __syncthreads();
    for (int h = 0; h < heads; ++h) {
        float block_max = -INFINITY;
        for (int w = 0; w < kPagedWarps; ++w) block_max = fmaxf(block_max, warp_max_sum[w][h][0]);
        float weights[kPagedWarps];
        float block_sum = 0.0f;
        for (int w = 0; w < kPagedWarps; ++w) {  // a warp without positions weighs 0
            const float warp_max = warp_max_sum[w][h][0];
            weights[w] = warp_max == -INFINITY ? 0.0f : expf(warp_max - block_max);
            block_sum += weights[w] * warp_max_sum[w][h][1];
        }
        const size_t partial = (size_t(row) * a.heads + first_head + h) * a.splits + split;
        for (int d = threadIdx.x; d < a.head_dim; d += blockDim.x) {
            float out = 0.0f;
            for (int w = 0; w < kPagedWarps; ++w) out += weights[w] * warp_out[w][h][d];
            a.partial_out[partial * a.head_dim + d] = out;
        }
        if (threadIdx.x == 0) {
            a.partial_stats[2 * partial] = block_max;
            a.partial_stats[2 * partial + 1] = block_sum;
        }
    }
}

// out[row, head * head_dim + d] for query head blockIdx.x of row blockIdx.y: the runs'
// partials (attention_paged_split_kernel) rescaled to their common max, summed and divided
// by the total sum (with sinks [heads], the head's sink counted in both), stored as D. The
// blocks of head 0 also zero columns heads * head_dim .. out_pitch - 1 (the GEMM input's
// padding).
// Launch: grid (heads, rows), block 128, no dynamic shared memory.
template <DType D>
__global__ void __launch_bounds__(kPagedThreads)
    attention_paged_merge_kernel(void* __restrict__ out, int out_pitch,
                                 const float* __restrict__ partial_out,
                                 const float* __restrict__ partial_stats,
                                 const float* __restrict__ sinks, int heads, int head_dim,
                                 int splits) {
    const int head = blockIdx.x, row = blockIdx.y;
    const size_t first = (size_t(row) * heads + head) * splits;
    float max_of_runs = sinks != nullptr ? sinks[head] : -INFINITY;
    for (int s = 0; s < splits; ++s)
        max_of_runs = fmaxf(max_of_runs, partial_stats[2 * (first + s)]);
    float total = sinks != nullptr ? expf(sinks[head] - max_of_runs) : 0.0f;
    for (int s = 0; s < splits; ++s) {
        const float run_max = partial_stats[2 * (first + s)];
        if (run_max != -INFINITY)
            total += expf(run_max - max_of_runs) * partial_stats[2 * (first + s) + 1];
    }
    void* out_row = activation_row<D>(out, out_pitch, row);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float sum = 0.0f;
        for (int s = 0; s < splits; ++s) {
            const float run_max = partial_stats[2 * (first + s)];
            if (run_max != -INFINITY)
                sum += expf(run_max - max_of_runs) * partial_out[(first + s) * head_dim + d];
        }
        store_activation<D>(out_row, head * head_dim + d, sum / total);
    }
    if (head == 0)
        for (int c = heads * head_dim + threadIdx.x; c < out_pitch; c += blockDim.x)
            store_activation<D>(out_row, c, 0.0f);
}

// ---- Launch shape

inline dim3 attention_paged_split_grid(int rows, const AttentionShape& shape, int splits) {
    const int group = shape.heads / shape.kv_heads;
    const int head_groups = (group + kPagedHeadsPerBlock - 1) / kPagedHeadsPerBlock;
    return dim3(splits, shape.kv_heads * head_groups, rows);
}
inline dim3 attention_paged_merge_grid(int rows, int heads) { return dim3(heads, rows); }

// Calls launch(std::integral_constant<int, kPairs>{}) for the query pairs per lane that
// head_dim needs.
template <typename Launch>
void with_paged_pairs(int head_dim, Launch launch) {
    if (head_dim <= 2 * kWarpSize) return launch(std::integral_constant<int, 1>{});
    if (head_dim <= 4 * kWarpSize) return launch(std::integral_constant<int, 2>{});
    return launch(std::integral_constant<int, 4>{});
}

#ifdef BARELLM_LAUNCH_FUNCTIONS

void attention_paged(const DeviceActivations& out, const float* qkv, int qkv_pitch,
                     const void* keys, const void* values, const int* positions,
                     const int* block_tables, int table_stride, int block_size, int splits,
                     float* partial_out, float* partial_stats, const AttentionShape& shape,
                     KvType kv_type, cudaStream_t stream) {
    if (out.tokens == 0) return;
    if (shape.head_dim > kMaxHeadDim || shape.head_dim % 2 != 0)
        throw Error("attention_paged: head_dim must be even and at most " +
                    std::to_string(kMaxHeadDim));
    const PagedAttentionArgs args{
        qkv,          qkv_pitch,      keys,           values,       positions,
        block_tables, table_stride,   block_size,     partial_out,  partial_stats,
        shape.heads,  shape.kv_heads, shape.head_dim, shape.window, splits,
        shape.scale,  shape.softcap};
    with_kv_type(kv_type, [&](auto element) {
        with_paged_pairs(shape.head_dim, [&](auto pairs) {
            launch_kernel(attention_paged_split_kernel<decltype(element), decltype(pairs)::value>,
                          attention_paged_split_grid(out.tokens, shape, splits), kPagedThreads, 0,
                          stream, args);
        });
    });
    CUDA_CHECK_LAUNCH("attention_paged_split_kernel");
    with_weight_dtype(out.dtype, [&](auto dtype) {
        launch_kernel(attention_paged_merge_kernel<decltype(dtype)::value>,
                      attention_paged_merge_grid(out.tokens, shape.heads), kPagedThreads, 0, stream,
                      out.data, out.pitch, partial_out, partial_stats, shape.sinks, shape.heads,
                      shape.head_dim, splits);
    });
    CUDA_CHECK_LAUNCH("attention_paged_merge_kernel");
}

#endif  // BARELLM_LAUNCH_FUNCTIONS

}  // namespace barellm::cuda
