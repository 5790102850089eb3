// Causal attention of a prefill batch (kernels.h, attention_prefill): every query token of
// the batch against the KV-cache rows it may see, flash-attention style: the keys and values
// go through shared memory a tile at a time and each query row keeps a running (max, sum)
// of its softmax, so the scores never reach global memory.
//
// Work split: the query rows of one KV head are its (token, query head) pairs in the order
// row = t * group + g (group = heads / kv_heads; query head kv_head * group + g), so that the
// rows of a block share the key/value tiles they read. A block takes consecutive rows of one
// KV head; each of its warps a slice of them.
//
// Two kernels:
// - attention_prefill_mma_kernel (f16 cache, head_dim a multiple of 16 up to 128): QKᵀ and
//   PV on tensor cores (mma m16n8k16, f32 accumulation; the queries rounded to f16, the
//   probabilities too for PV). A warp takes 16 rows, a tile 64 keys; the keys and values
//   arrive by cp.async, the fragments by ldmatrix (tensor_core.cuh).
// - attention_prefill_kernel (any other shape, f32 caches): f32 on CUDA cores. A warp takes
//   kRowsPerWarp rows, a tile 32 keys.
//   - QKᵀ: lane j computes the scores of key j of the tile for the warp's rows (float4 dot
//     products; the key rows are padded in shared memory so that lanes hit distinct banks).
//   - Softmax: per row a warp max and a warp sum over the tile's 32 scores; the running
//     output is rescaled when the row's max grows.
//   - PV: lane l accumulates output dimensions l, l + 32, ... (kDimsPerLane of them) of
//     every row of the warp, reading the probabilities from shared memory.
//
// Attention sinks (gpt-oss; AttentionShape::sinks, [heads] or null): each query head's softmax
// has one more logit, its sink σ, with a zero value. Both kernels start a row's online softmax
// from it: running max σ, running sum exp(σ - σ) = 1, output 0; the keys then rescale it as
// they raise the max. Without sinks the max starts at -inf and the sum at 0.
//
// Device code first; the launch shape as host functions outside the CUDA-only part, so that
// the emulated unit tests launch the kernel exactly as attention_prefill does.
#pragma once
#include <algorithm>

#include "common.cuh"
#include "cuda_check.h"
#include "kernels.h"
#include "prefill.cuh"  // store_activation, activation_row
#include "tensor_core.cuh"

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
// - sinks [heads]: each query head's sink logit, or null.
// - out [count, out_pitch] of kOut: columns head * head_dim .. + head_dim - 1 of row t; the
//   blocks of KV head 0 also zero columns heads * head_dim .. out_pitch - 1.
// Launch: attention_prefill (below; attention_prefill_grid): grid (ceil(count * group /
// kBlockRows), kv_heads), block 128, dynamic shared memory
// attention_prefill_shared_floats(head_dim) floats: q [kBlockRows][stride], keys and values
// [32][stride] each, probabilities [kBlockRows][32], stride = head_dim rounded up to 4,
// plus 4.
template <typename KvT, DType kOut, int kDimsPerLane>
__global__ void __launch_bounds__(kAttentionPrefillThreads)
    attention_prefill_kernel(void* __restrict__ out, int out_pitch, const float* __restrict__ qkv,
                             int qkv_pitch, const KvT* __restrict__ key_cache,
                             const KvT* __restrict__ value_cache, int first_pos, int count,
                             int heads, int kv_heads, int head_dim, int window, float scale,
                             float softcap, const float* __restrict__ sinks) {
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
        const int row = warp_row + r;
        const bool sunk = sinks != nullptr && row < rows;  // the row's softmax starts at its sink
        running_max[r] = sunk ? sinks[kv_head * group + row % group] : -INFINITY;
        running_sum[r] = sunk ? 1.0f : 0.0f;
#pragma unroll
        for (int i = 0; i < kDimsPerLane; ++i) acc[r][i] = 0.0f;
    }
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
            const float s = visible ? soft_capped(score[r] * scale, softcap) : -INFINITY;
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

// ---- The tensor-core kernel

constexpr int kMmaRowsPerWarp = 16;  // the M of mma m16n8k16
constexpr int kMmaBlockRows = kAttentionPrefillWarps * kMmaRowsPerWarp;
constexpr int kMmaKeyTile = 64;                // keys per staged tile
constexpr int kMmaKeyTiles = kMmaKeyTile / 8;  // its n-tiles of 8 keys in QKᵀ
constexpr int kMmaRowPad = 8;                  // halves after each staged row (banks)
constexpr int kMmaHalvesPerCopy = 8;           // 16 bytes: one cp.async

// Two f32 values as the f16 pair of an mma fragment register (lo in the low half).
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    return uint32_t(__half_as_ushort(__float2half_rn(lo))) |
           uint32_t(__half_as_ushort(__float2half_rn(hi))) << 16;
}

// Sum and max over the 4 lanes of a quad (lanes 4g .. 4g + 3: one row of an mma fragment).
__device__ __forceinline__ float quad_sum(float value) {
    value += __shfl_xor_sync(kFullMask, value, 1);
    return value + __shfl_xor_sync(kFullMask, value, 2);
}
__device__ __forceinline__ float quad_max(float value) {
    value = fmaxf(value, __shfl_xor_sync(kFullMask, value, 1));
    return fmaxf(value, __shfl_xor_sync(kFullMask, value, 2));
}

// The rows a lane of attention_prefill_mma_kernel holds (half 0: row g, half 1: row g + 8
// of its warp's 16): each one's position, or -1 past the batch, and its first visible key.
struct MmaLaneRows {
    int pos[2], first_key[2];
};

// One key tile of attention_prefill_mma_kernel for the calling warp: keys tile .. tile + 63
// (key_tile, value_tile: [64][kDims + 8] halves in shared memory) against its 16 query rows
// (q: A fragments, one per 16 dimensions), into the running max, the lane's partial sums
// and the output accumulators acc (rescaled as the max grows).
template <int kDims>
__device__ __forceinline__ void attend_key_tile(const uint32_t (&q)[kDims / 16][4],
                                                const __half* key_tile, const __half* value_tile,
                                                int tile, int head_dim, float scale, float softcap,
                                                const MmaLaneRows& lane_rows,
                                                float (&running_max)[2], float (&partial_sum)[2],
                                                float (&acc)[kDims / 8][4]) {
    constexpr int kStride = kDims + kMmaRowPad;
    constexpr int kDimTiles = kDims / 8;
    const int lane = threadIdx.x % kWarpSize, t = lane % 4;
    const int matrix_row = lane % 8, matrix = lane / 8;  // ldmatrix: row, which of four

    // S = Q Kᵀ for the warp's 16 rows and the tile's 64 keys.
    float score[kMmaKeyTiles][4];
#pragma unroll
    for (int n = 0; n < kMmaKeyTiles; ++n)
        for (int e = 0; e < 4; ++e) score[n][e] = 0.0f;
#pragma unroll
    for (int step = 0; step < kDims / 16; ++step) {
        if (16 * step >= head_dim) break;
        const int k0 = 16 * step;
#pragma unroll
        for (int n = 0; n < kMmaKeyTiles; n += 2) {
            uint32_t b[4];  // matrices: keys of n-tile n / n + 1 (matrix / 2), k0 / k0 + 8
            ldmatrix_x4(b, key_tile + ((n + matrix / 2) * 8 + matrix_row) * kStride + k0 +
                               (matrix % 2) * 8);
            const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
            mma_16x8x16<DType::F16>(score[n], q[step], b0);
            mma_16x8x16<DType::F16>(score[n + 1], q[step], b1);
        }
    }

    // Online softmax: element e of n-tile n is row g + 8 (e / 2), key tile + 8n + 2t + e % 2.
    float correction[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int n = 0; n < kMmaKeyTiles; ++n)
#pragma unroll
            for (int e = 2 * half; e < 2 * half + 2; ++e) {
                const int key = tile + 8 * n + 2 * t + e % 2;
                const bool visible = key >= lane_rows.first_key[half] && key <= lane_rows.pos[half];
                score[n][e] = visible ? soft_capped(score[n][e] * scale, softcap) : -INFINITY;
                tile_max = fmaxf(tile_max, score[n][e]);
            }
        const float new_max = fmaxf(running_max[half], quad_max(tile_max));
        correction[half] = 1.0f;
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < kMmaKeyTiles; ++n)
#pragma unroll
            for (int e = 2 * half; e < 2 * half + 2; ++e) {
                // exp(-inf) = 0 for hidden keys; a row with nothing visible yet keeps 0.
                score[n][e] = new_max == -INFINITY ? 0.0f : expf(score[n][e] - new_max);
                sum += score[n][e];
            }
        if (new_max != -INFINITY) correction[half] = expf(running_max[half] - new_max);
        partial_sum[half] = partial_sum[half] * correction[half] + sum;
        running_max[half] = new_max;
    }
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n) {
        acc[n][0] *= correction[0];
        acc[n][1] *= correction[0];
        acc[n][2] *= correction[1];
        acc[n][3] *= correction[1];
    }

    // acc += P V: k-step j covers keys 16j .. 16j + 15 (n-tiles 2j, 2j + 1 of S).
#pragma unroll
    for (int j = 0; j < kMmaKeyTiles / 2; ++j) {
        const uint32_t a[4] = {pack_half2(score[2 * j][0], score[2 * j][1]),
                               pack_half2(score[2 * j][2], score[2 * j][3]),
                               pack_half2(score[2 * j + 1][0], score[2 * j + 1][1]),
                               pack_half2(score[2 * j + 1][2], score[2 * j + 1][3])};
#pragma unroll
        for (int n = 0; n < kDimTiles; n += 2) {
            if (n * 8 >= head_dim) break;  // head_dim is a multiple of 16: n + 1 is in too
            uint32_t b[4];  // matrices: keys 16j / 16j + 8 (matrix % 2), dims of n / n + 1
            ldmatrix_x4_trans(b, value_tile + (16 * j + (matrix % 2) * 8 + matrix_row) * kStride +
                                     (n + matrix / 2) * 8);
            const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
            mma_16x8x16<DType::F16>(acc[n], a, b0);
            mma_16x8x16<DType::F16>(acc[n + 1], a, b1);
        }
    }
}

// What attention_prefill_kernel computes, for an f16 cache and head_dim a multiple of 16 up
// to kDims (64 or 128), on tensor cores. Lane = 4 g + t (tensor_core.cuh): in each fragment a
// lane holds rows g and g + 8 of its warp's 16 rows, columns 2t and 2t + 1 of each 8-column
// n-tile.
// - The queries: each lane loads its elements of the A fragments (rows g and g + 8, columns
//   2t, 2t + 1 and 2t + 8, 2t + 9 of each 16 dimensions) once, rounded to f16, into
//   registers.
// - Keys and values arrive 64 rows at a time by cp.async into kBuffers tile buffers: with
//   two, tile i + 1 is copied while the warps compute on tile i (sm_80+; sm_75 copies
//   synchronously and takes one).
// - Per tile (attend_key_tile): scores S [16 rows, 64 keys] per warp on tensor cores, B = the
//   key rows as stored (ldmatrix); an online softmax; PV with the probabilities, in the C
//   layout of S, as the A fragments (n-tiles 2j and 2j + 1 of S form k-step j) and B = the
//   value rows transposed by ldmatrix .trans. Each row's running max is quad-uniform
//   (quad_max); each lane keeps a partial sum of its columns, summed over the quad at the
//   end.
// Launch: attention_prefill (below; attention_prefill_mma_grid): grid (ceil(count * group /
// 64), kv_heads), block 128, dynamic shared memory attention_prefill_mma_shared_bytes:
// kBuffers x (keys, values) of 64 rows of kDims + 8 halves (the padding spreads the banks).
template <DType kOut, int kDims, int kBuffers>
__global__ void __launch_bounds__(kAttentionPrefillThreads)
    attention_prefill_mma_kernel(void* __restrict__ out, int out_pitch,
                                 const float* __restrict__ qkv, int qkv_pitch,
                                 const __half* __restrict__ key_cache,
                                 const __half* __restrict__ value_cache, int first_pos, int count,
                                 int heads, int kv_heads, int head_dim, int window, float scale,
                                 float softcap, const float* __restrict__ sinks) {
    static_assert(kBuffers == 1 || kBuffers == 2, "one tile buffer, or two taking turns");
    constexpr int kStride = kDims + kMmaRowPad;  // halves per staged row
    constexpr int kDimTiles = kDims / 8;         // n-tiles of the output
    constexpr int kTileHalves = kMmaKeyTile * kStride;
    const int group = heads / kv_heads, kv_head = blockIdx.y;
    const int kv_dim = kv_heads * head_dim;
    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    const int g = lane / 4, t = lane % 4;
    // Buffer b: its keys 2 b tiles from the start, its values 2 b + 1. Tile `index` of the
    // loop below takes buffer index % kBuffers.
    __half* tiles = reinterpret_cast<__half*>(dynamic_shared_floats());
    const auto keys_of_tile = [&](int index) {
        return tiles + 2 * (index % kBuffers) * kTileHalves;
    };

    const int rows = count * group;
    const int first_row = blockIdx.x * kMmaBlockRows;
    const int last_row = (first_row + kMmaBlockRows < rows ? first_row + kMmaBlockRows : rows) - 1;
    const int key_begin = prefill_first_key(first_pos + first_row / group, window);
    const int key_end = first_pos + last_row / group;

    // The lane's query elements as A fragments, zero for rows past the last.
    const int warp_row = first_row + warp * kMmaRowsPerWarp;
    uint32_t q[kDims / 16][4];
#pragma unroll
    for (int step = 0; step < kDims / 16; ++step)
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // row g + 8 (i % 2), columns 16 step + 2t + 8 (i / 2)
            const int row = warp_row + g + 8 * (i % 2), d = 16 * step + 2 * t + 8 * (i / 2);
            float pair[2] = {0.0f, 0.0f};
            if (row < rows && d < head_dim) {
                const int head = kv_head * group + row % group;
                const float* source =
                    qkv + size_t(row / group) * qkv_pitch + size_t(head) * head_dim;
                pair[0] = source[d];
                pair[1] = source[d + 1];
            }
            q[step][i] = pack_half2(pair[0], pair[1]);
        }

    MmaLaneRows lane_rows;
    for (int half = 0; half < 2; ++half) {
        const int row = warp_row + g + 8 * half;
        lane_rows.pos[half] = row < rows ? first_pos + row / group : -1;
        lane_rows.first_key[half] = row < rows ? prefill_first_key(lane_rows.pos[half], window) : 0;
    }
    // The warp's key range: its first row sees from the earliest key, its last valid row
    // up to the latest.
    const int warp_last_row =
        warp_row + kMmaRowsPerWarp - 1 < rows ? warp_row + kMmaRowsPerWarp - 1 : rows - 1;
    const int warp_key_begin =
        warp_row < rows ? prefill_first_key(first_pos + warp_row / group, window) : key_end + 1;
    const int warp_key_end = warp_row < rows ? first_pos + warp_last_row / group : -1;

    // Each row's softmax starts at its sink where there are sinks: max σ, and the sum's 1 held
    // by the quad's lane t = 0 (the lanes' partial sums meet at the end).
    float running_max[2] = {-INFINITY, -INFINITY}, partial_sum[2] = {0.0f, 0.0f};
    if (sinks != nullptr)
        for (int half = 0; half < 2; ++half) {
            const int row = warp_row + g + 8 * half;
            if (row >= rows) continue;
            running_max[half] = sinks[kv_head * group + row % group];
            partial_sum[half] = t == 0 ? 1.0f : 0.0f;
        }
    float acc[kDimTiles][4];
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n)
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;

    // The keys and values of tile `index` (keys key_begin + 64 index ..) into its buffer,
    // zero past key_end (16 bytes a copy), as one group of copies.
    const int copies_per_row = head_dim / kMmaHalvesPerCopy;
    const auto copy_tile = [&](int index) {
        __half* key_tile = keys_of_tile(index);
        __half* value_tile = key_tile + kTileHalves;
        const int tile = key_begin + index * kMmaKeyTile;
        for (int i = threadIdx.x; i < kMmaKeyTile * copies_per_row; i += blockDim.x) {
            const int j = i / copies_per_row, d = (i % copies_per_row) * kMmaHalvesPerCopy;
            const int key = tile + j;
            const bool valid = key <= key_end;
            const size_t offset =
                size_t(valid ? key : key_begin) * kv_dim + size_t(kv_head) * head_dim + d;
            copy_async_16(key_tile + j * kStride + d, key_cache + offset, valid);
            copy_async_16(value_tile + j * kStride + d, value_cache + offset, valid);
        }
        copy_async_commit();
    };

    const int key_tiles = (key_end - key_begin) / kMmaKeyTile + 1;  // key_begin <= key_end
    if constexpr (kBuffers == 2) copy_tile(0);
    for (int index = 0; index < key_tiles; ++index) {
        // Tile `index` copied (the next one's copies may still be in flight), for all warps.
        if constexpr (kBuffers == 2) {
            if (index + 1 < key_tiles) {
                copy_tile(index + 1);  // into the buffer every warp finished with last time
                copy_async_wait<1>();
            } else {
                copy_async_wait<0>();
            }
        } else {
            copy_tile(index);
            copy_async_wait<0>();
        }
        __syncthreads();
        const int tile = key_begin + index * kMmaKeyTile;
        if (tile <= warp_key_end && tile + kMmaKeyTile > warp_key_begin) {
            const __half* key_tile = keys_of_tile(index);
            attend_key_tile<kDims>(q, key_tile, key_tile + kTileHalves, tile, head_dim, scale,
                                   softcap, lane_rows, running_max, partial_sum, acc);
        }
        __syncthreads();  // every warp is done with the buffer: the copies may overwrite it
    }

    // out = acc / sum, and the padding columns of each token's row (KV head 0's blocks).
    const int q_dim = heads * head_dim;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const float sum = quad_sum(partial_sum[half]);
        const int row = warp_row + g + 8 * half;
        if (row >= rows) continue;
        const int head = kv_head * group + row % group;
        void* out_row = activation_row<kOut>(out, out_pitch, row / group);
        const float inverse_sum = 1.0f / sum;
#pragma unroll
        for (int n = 0; n < kDimTiles; ++n) {
            const int d = 8 * n + 2 * t;
            if (d >= head_dim) break;
            store_activation<kOut>(out_row, head * head_dim + d, acc[n][2 * half] * inverse_sum);
            store_activation<kOut>(out_row, head * head_dim + d + 1,
                                   acc[n][2 * half + 1] * inverse_sum);
        }
        if (head == 0)
            for (int c = q_dim + t; c < out_pitch; c += 4) store_activation<kOut>(out_row, c, 0.0f);
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

// The tensor-core kernel's shape (it runs where attention_prefill_uses_mma, kernels.h): its
// kDims for head_dim, its dynamic shared memory and grid.
inline int attention_prefill_mma_dims(int head_dim) { return head_dim <= 64 ? 64 : 128; }
// Tile buffers: two on sm_80 and newer (cp.async), one on sm_75 (copies are synchronous
// there, and two of head_dim 128 would pass its 64 KiB a block).
inline int attention_prefill_mma_buffers(int compute_capability) {
    constexpr int kAsyncCopies = 80;  // sm_80: cp.async
    return compute_capability >= kAsyncCopies ? 2 : 1;
}
inline size_t attention_prefill_mma_shared_bytes(int head_dim, int buffers) {
    const size_t stride = size_t(attention_prefill_mma_dims(head_dim)) + kMmaRowPad;
    return size_t(buffers) * 2 * kMmaKeyTile * stride * sizeof(uint16_t);
}
// The tensor-core kernel for head_dim with `buffers` tile buffers.
template <DType kOut>
auto attention_prefill_mma_kernel_for(int head_dim, int buffers) {
    const bool dims_64 = attention_prefill_mma_dims(head_dim) == 64;
    return buffers == 2 ? dims_64 ? attention_prefill_mma_kernel<kOut, 64, 2>
                                  : attention_prefill_mma_kernel<kOut, 128, 2>
           : dims_64 ? attention_prefill_mma_kernel<kOut, 64, 1>
                        : attention_prefill_mma_kernel<kOut, 128, 1>;
}
inline dim3 attention_prefill_mma_grid(int count, const AttentionShape& shape) {
    const int rows = count * (shape.heads / shape.kv_heads);
    return dim3((rows + kMmaBlockRows - 1) / kMmaBlockRows, shape.kv_heads);
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

#ifdef BARELLM_LAUNCH_FUNCTIONS

size_t attention_prefill_shared_bytes(int head_dim) {
    const size_t simt = attention_prefill_shared_floats(head_dim) * sizeof(float);
    return attention_prefill_uses_mma(KvType::F16, head_dim)
               ? std::max(simt, attention_prefill_mma_shared_bytes(
                                    head_dim, attention_prefill_mma_buffers(
                                                  current_device().compute_capability)))
               : simt;
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
    if (attention_prefill_uses_mma(kv_type, shape.head_dim)) {
        const int buffers = attention_prefill_mma_buffers(current_device().compute_capability);
        const size_t shared = attention_prefill_mma_shared_bytes(shape.head_dim, buffers);
        const dim3 grid = attention_prefill_mma_grid(out.tokens, shape);
        with_weight_dtype(out.dtype, [&](auto dtype) {
            constexpr DType kOut = decltype(dtype)::value;
            const auto kernel = attention_prefill_mma_kernel_for<kOut>(shape.head_dim, buffers);
            allow_shared_bytes(kernel, shared);
            launch_kernel(kernel, grid, kAttentionPrefillThreads, shared, stream, out.data,
                          out.pitch, qkv, qkv_pitch, static_cast<const __half*>(key_cache),
                          static_cast<const __half*>(value_cache), first_pos, out.tokens,
                          shape.heads, shape.kv_heads, shape.head_dim, shape.window, shape.scale,
                          shape.softcap, shape.sinks);
        });
        CUDA_CHECK_LAUNCH("attention_prefill_mma_kernel");
        return;
    }
    const size_t shared = attention_prefill_shared_floats(shape.head_dim) * sizeof(float);
    const dim3 grid = attention_prefill_grid(out.tokens, shape);
    with_kv_type(kv_type, [&](auto element) {
        using KvT = decltype(element);
        with_weight_dtype(out.dtype, [&](auto dtype) {
            with_prefill_dims_per_lane(shape.head_dim, [&](auto dims) {
                const auto kernel =
                    attention_prefill_kernel<KvT, decltype(dtype)::value, decltype(dims)::value>;
                allow_shared_bytes(kernel, shared);
                launch_kernel(kernel, grid, kAttentionPrefillThreads, shared, stream, out.data,
                              out.pitch, qkv, qkv_pitch, static_cast<const KvT*>(key_cache),
                              static_cast<const KvT*>(value_cache), first_pos, out.tokens,
                              shape.heads, shape.kv_heads, shape.head_dim, shape.window,
                              shape.scale, shape.softcap, shape.sinks);
            });
        });
    });
    CUDA_CHECK_LAUNCH("attention_prefill_kernel");
}

#endif  // BARELLM_LAUNCH_FUNCTIONS

}  // namespace barellm::cuda
