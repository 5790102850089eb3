// Causal attention of a prefill batch (kernels.h, attention_prefill): every query token of
// the batch against the KV-cache rows it may see, flash-attention style: the keys and values
// go through shared memory a tile at a time and each query row keeps a running (max, sum)
// of its softmax, so the scores never reach global memory. The products run on CUDA cores
// in f32 (SIMT).
//
// Work split: the query rows of one KV head are its (token, query head) pairs in the order
// row = t * group + g (group = heads / kv_heads; query head kv_head * group + g), so that the
// rows of a block share the key/value tiles they read. A block takes kBlockRows consecutive
// rows of one KV head; each of its warps takes kRowsPerWarp of them.
// - QKᵀ: lane j computes the scores of key j of the tile for the warp's rows (float4 dot
//   products; the key rows are padded in shared memory so that the lanes hit distinct banks).
// - Softmax: per row a warp max and a warp sum over the tile's 32 scores; the running output
//   is rescaled when the row's max grows.
// - PV: lane l accumulates output dimensions l, l + 32, ... (kDimsPerLane of them) of every
//   row of the warp, reading the probabilities from shared memory.
//
// Device code first; the launch shape as host functions outside the CUDA-only part, so that
// the emulated unit tests launch the kernel exactly as attention_prefill does.
#pragma once
#include "common.cuh"
#include "cuda_check.h"
#include "kernels.h"
#include "prefill.cuh"  // store_activation, activation_row

namespace barellm::cuda {

constexpr int kAttentionPrefillWarps = 4;
constexpr int kAttentionPrefillThreads = kAttentionPrefillWarps * kWarpSize;
constexpr int kPrefillKeyTile = kWarpSize;  // keys per staged tile: one per lane in QKᵀ
constexpr int kPrefillKeyPad = 4;           // floats after each staged row (bank spread)

// Query rows per warp: 8 while each lane holds up to 4 output dimensions (head_dim <= 128),
// 4 above that, which keeps the accumulators in registers and the tiles within the shared
// memory of sm_80 and newer.
template <int kDimsPerLane>
constexpr int kPrefillRowsPerWarp = kDimsPerLane <= 4 ? 8 : 4;

// The first cache row a query at pos sees (attention_start in kv_cache.h).
__device__ __forceinline__ int prefill_first_key(int pos, int window) {
    const int first = pos + 1 - window;
    return window > 0 && first > 0 ? first : 0;
}

// Out rows for the (token, query head) pairs of KV head blockIdx.y, rows blockIdx.x *
// kBlockRows .. + kBlockRows - 1 of the row order above (rows past count * group idle).
// - qkv [count, qkv_pitch]: the rotated q of each token at the start of its row (f32).
// - key_cache, value_cache [context, kv_heads * head_dim] of KvT, rows up to first_pos +
//   count - 1 written; the token at pos = first_pos + t attends to rows
//   prefill_first_key(pos, window) .. pos.
// - out [count, out_pitch] of kOut: columns head * head_dim .. + head_dim - 1 of row t; the
//   blocks of KV head 0 also zero columns heads * head_dim .. out_pitch - 1.
// Launch: attention_prefill_launch (below): grid (ceil(count * group / kBlockRows),
// kv_heads), block 128, dynamic shared memory attention_prefill_shared_floats(head_dim)
// floats: q [kBlockRows][stride], keys and values [32][stride] each, probabilities
// [kBlockRows][32], stride = head_dim rounded up to 4, plus 4.
template <typename KvT, DType kOut, int kDimsPerLane>
__global__ void __launch_bounds__(kAttentionPrefillThreads)
    attention_prefill_kernel(void* __restrict__ out, int out_pitch, const float* __restrict__ qkv,
                             int qkv_pitch, const KvT* __restrict__ key_cache,
                             const KvT* __restrict__ value_cache, int first_pos, int count,
                             int heads, int kv_heads, int head_dim, int window) {
    constexpr int kRowsPerWarp = kPrefillRowsPerWarp<kDimsPerLane>;
    constexpr int kBlockRows = kAttentionPrefillWarps * kRowsPerWarp;
    const int group = heads / kv_heads, kv_head = blockIdx.y;
    const int kv_dim = kv_heads * head_dim;
    const int padded = (head_dim + 3) / 4 * 4, stride = padded + kPrefillKeyPad;
    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;

    float* q_tile = dynamic_shared_floats();                       // [kBlockRows][stride]
    float* key_tile = q_tile + kBlockRows * stride;                // [kPrefillKeyTile][stride]
    float* value_tile = key_tile + kPrefillKeyTile * stride;       // [kPrefillKeyTile][stride]
    float* probabilities = value_tile + kPrefillKeyTile * stride;  // [kBlockRows][kPrefillKeyTile]

    const int rows = count * group;
    const int first_row = blockIdx.x * kBlockRows;
    const int last_row = (first_row + kBlockRows < rows ? first_row + kBlockRows : rows) - 1;
    // The cache rows any row of the block sees (positions grow with the row).
    const int key_begin = prefill_first_key(first_pos + first_row / group, window);
    const int key_end = first_pos + last_row / group;

    // The block's queries, zero past head_dim and for rows past the last.
    for (int i = threadIdx.x; i < kBlockRows * padded; i += blockDim.x) {
        const int r = i / padded, d = i % padded, row = first_row + r;
        float q = 0.0f;
        if (row < rows && d < head_dim) {
            const int head = kv_head * group + row % group;
            q = qkv[size_t(row / group) * qkv_pitch + size_t(head) * head_dim + d];
        }
        q_tile[r * stride + d] = q;
    }

    // This warp's rows: positions and first visible keys (idle rows see nothing).
    const int warp_row = first_row + warp * kRowsPerWarp;
    int row_pos[kRowsPerWarp], row_first_key[kRowsPerWarp];
    int warp_key_begin = key_end + 1, warp_key_end = -1;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
        const int row = warp_row + r;
        row_pos[r] = row < rows ? first_pos + row / group : -1;
        row_first_key[r] = row < rows ? prefill_first_key(row_pos[r], window) : 0;
        if (row < rows && row_first_key[r] < warp_key_begin) warp_key_begin = row_first_key[r];
        if (row < rows && row_pos[r] > warp_key_end) warp_key_end = row_pos[r];
    }

    float running_max[kRowsPerWarp], running_sum[kRowsPerWarp];
    float acc[kRowsPerWarp][kDimsPerLane];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
        running_max[r] = -INFINITY;
        running_sum[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < kDimsPerLane; ++i) acc[r][i] = 0.0f;
    }
    const float scale = 1.0f / sqrtf(float(head_dim));
    const float* warp_queries = q_tile + warp * kRowsPerWarp * stride;
    float* warp_probabilities = probabilities + warp * kRowsPerWarp * kPrefillKeyTile;

    for (int tile = key_begin; tile <= key_end; tile += kPrefillKeyTile) {
        __syncthreads();  // the previous tile is read (and, the first time, the queries written)
        // Stage keys and values tile .. tile + 31 as f32, zero past key_end and past head_dim.
        const int pairs = padded / 2;
        for (int i = threadIdx.x; i < kPrefillKeyTile * pairs; i += blockDim.x) {
            const int j = i / pairs, d = 2 * (i % pairs), key = tile + j;
            float2 k = {0.0f, 0.0f}, v = {0.0f, 0.0f};
            if (key <= key_end && d < head_dim) {
                const size_t offset = size_t(key) * kv_dim + size_t(kv_head) * head_dim;
                k = kv_load_pair(key_cache + offset, d / 2);
                v = kv_load_pair(value_cache + offset, d / 2);
            }
            *reinterpret_cast<float2*>(key_tile + j * stride + d) = k;
            *reinterpret_cast<float2*>(value_tile + j * stride + d) = v;
        }
        __syncthreads();
        if (tile > warp_key_end || tile + kPrefillKeyTile <= warp_key_begin) continue;

        // Scores: lane j against key tile + j.
        float score[kRowsPerWarp];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) score[r] = 0.0f;
        const float* key_row = key_tile + lane * stride;
        for (int d = 0; d < padded; d += 4) {
            const float4 k = *reinterpret_cast<const float4*>(key_row + d);
#pragma unroll
            for (int r = 0; r < kRowsPerWarp; ++r) {
                const float4 q = *reinterpret_cast<const float4*>(warp_queries + r * stride + d);
                score[r] += q.x * k.x + q.y * k.y + q.z * k.z + q.w * k.w;
            }
        }

        // Online softmax: the probabilities of the tile against each row's running max.
        const int key = tile + lane;
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
            const bool visible = key >= row_first_key[r] && key <= row_pos[r];
            const float s = visible ? score[r] * scale : -INFINITY;
            const float new_max = fmaxf(running_max[r], warp_max(s));
            float p = 0.0f, correction = 1.0f;
            if (new_max != -INFINITY) {  // the same for the whole warp
                p = visible ? expf(s - new_max) : 0.0f;
                correction = expf(running_max[r] - new_max);  // 0 while the max was -inf
            }
            running_sum[r] = running_sum[r] * correction + warp_sum(p);
            running_max[r] = new_max;
#pragma unroll
            for (int i = 0; i < kDimsPerLane; ++i) acc[r][i] *= correction;
            warp_probabilities[r * kPrefillKeyTile + lane] = p;
        }
        __syncwarp();

        // acc += P · V over the tile's keys, four at a time.
        for (int j = 0; j < kPrefillKeyTile; j += 4) {
            float p[kRowsPerWarp][4];
#pragma unroll
            for (int r = 0; r < kRowsPerWarp; ++r) {
                const float4 four =
                    *reinterpret_cast<const float4*>(warp_probabilities + r * kPrefillKeyTile + j);
                p[r][0] = four.x;
                p[r][1] = four.y;
                p[r][2] = four.z;
                p[r][3] = four.w;
            }
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                const float* value_row = value_tile + (j + jj) * stride;
#pragma unroll
                for (int i = 0; i < kDimsPerLane; ++i) {
                    const int d = lane + i * kWarpSize;
                    const float v = d < head_dim ? value_row[d] : 0.0f;
#pragma unroll
                    for (int r = 0; r < kRowsPerWarp; ++r) acc[r][i] += p[r][jj] * v;
                }
            }
        }
        __syncwarp();  // the probabilities are read before the next tile overwrites them
    }

    // out = acc / sum, and the padding columns of each token's row (KV head 0's blocks).
    const int q_dim = heads * head_dim;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
        const int row = warp_row + r;
        if (row >= rows) break;  // the same for the whole warp; later rows are past it too
        const int g = row % group, head = kv_head * group + g;
        void* out_row = activation_row<kOut>(out, out_pitch, row / group);
        const float inverse_sum = 1.0f / running_sum[r];
#pragma unroll
        for (int i = 0; i < kDimsPerLane; ++i) {
            const int d = lane + i * kWarpSize;
            if (d < head_dim)
                store_activation<kOut>(out_row, head * head_dim + d, acc[r][i] * inverse_sum);
        }
        if (head == 0)
            for (int c = q_dim + lane; c < out_pitch; c += kWarpSize)
                store_activation<kOut>(out_row, c, 0.0f);
    }
}

// ---- Launch shape

// Output dimensions per lane for head_dim (a template argument of the kernel).
inline int attention_prefill_dims_per_lane(int head_dim) {
    return head_dim <= 2 * kWarpSize ? 2 : head_dim <= 4 * kWarpSize ? 4 : 8;
}

inline int attention_prefill_block_rows(int head_dim) {
    const int dims = attention_prefill_dims_per_lane(head_dim);
    return kAttentionPrefillWarps * (dims == 2   ? kPrefillRowsPerWarp<2>
                                     : dims == 4 ? kPrefillRowsPerWarp<4>
                                                 : kPrefillRowsPerWarp<8>);
}

inline size_t attention_prefill_shared_floats(int head_dim) {
    const size_t rows = attention_prefill_block_rows(head_dim);
    const size_t stride = size_t(head_dim + 3) / 4 * 4 + kPrefillKeyPad;
    return (rows + 2 * kPrefillKeyTile) * stride + rows * kPrefillKeyTile;
}

inline dim3 attention_prefill_grid(int count, const AttentionShape& shape) {
    const int rows = count * (shape.heads / shape.kv_heads);
    const int block_rows = attention_prefill_block_rows(shape.head_dim);
    return dim3((rows + block_rows - 1) / block_rows, shape.kv_heads);
}

// Calls launch(std::integral_constant<int, kDimsPerLane>{}) for head_dim.
template <typename Launch>
void with_prefill_dims_per_lane(int head_dim, Launch launch) {
    switch (attention_prefill_dims_per_lane(head_dim)) {
        case 2:
            return launch(std::integral_constant<int, 2>{});
        case 4:
            return launch(std::integral_constant<int, 4>{});
        default:
            return launch(std::integral_constant<int, 8>{});
    }
}

#ifndef BARELLM_CUDA_EMULATION

size_t attention_prefill_shared_bytes(int head_dim) {
    return attention_prefill_shared_floats(head_dim) * sizeof(float);
}

void attention_prefill(const DeviceActivations& out, const float* qkv, int qkv_pitch,
                       const void* key_cache, const void* value_cache, int first_pos,
                       const AttentionShape& shape, KvType kv_type, cudaStream_t stream) {
    if (shape.head_dim % 2 != 0 || shape.head_dim > kMaxHeadDim || shape.kv_heads < 1 ||
        shape.heads % shape.kv_heads != 0 || out.cols != shape.heads * shape.head_dim)
        throw Error("attention_prefill: unsupported shape (" + std::to_string(shape.heads) + "/" +
                    std::to_string(shape.kv_heads) + " heads of " + std::to_string(shape.head_dim) +
                    ", output of " + std::to_string(out.cols) + " columns)");
    if (out.tokens == 0) return;
    const size_t shared = attention_prefill_shared_bytes(shape.head_dim);
    const dim3 grid = attention_prefill_grid(out.tokens, shape);
    with_kv_type(kv_type, [&](auto element) {
        using KvT = decltype(element);
        with_weight_dtype(out.dtype, [&](auto dtype) {
            with_prefill_dims_per_lane(shape.head_dim, [&](auto dims) {
                const auto kernel =
                    attention_prefill_kernel<KvT, decltype(dtype)::value, decltype(dims)::value>;
                CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                int(shared)));
                kernel<<<grid, kAttentionPrefillThreads, shared, stream>>>(
                    out.data, out.pitch, qkv, qkv_pitch, static_cast<const KvT*>(key_cache),
                    static_cast<const KvT*>(value_cache), first_pos, out.tokens, shape.heads,
                    shape.kv_heads, shape.head_dim, shape.window);
            });
        });
    });
    CUDA_CHECK_LAUNCH("attention_prefill_kernel");
}

#endif  // BARELLM_CUDA_EMULATION

}  // namespace barellm::cuda
