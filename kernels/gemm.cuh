// Matrix products of a batch of tokens with a weight matrix (batched prefill):
// out[t, r] (+)= sum_c in[t, c] * W[r, c] (+ bias[r]). Both operands are stored as rows of
// K = cols contiguous elements (the activations' rows, the weights' rows), so the product is
// activations times weights transposed; each row is padded with zeros to a 16-byte multiple.
//
// - f16 weights (sm_75 and newer) and bf16 weights (sm_80 and newer) run on tensor cores
//   (gemm_tensor_core_kernel, through the wrappers of tensor_core.cuh):
//   - The block computes a tile of kTileTokens tokens x kTileRows weight rows. Its warps
//     split the tile along tokens and rows, and (the small-batch and large tiles) along K:
//     each warp multiplies its part of every K tile, and the K parts meet in shared memory
//     at the end.
//   - A kStages-deep pipeline of cp.async copies brings the K tiles of both operands from
//     global to shared memory while the tensor cores work on earlier ones. Elements past the
//     edges (tokens, rows, columns past the padded row) are zero-filled by the copy, so the
//     products need no bounds checks.
//   - Shared rows are one 16-byte chunk longer than the K tile: the row stride is then an
//     odd number of 16-byte chunks, so the 8 rows an ldmatrix reads fall in 8 different
//     groups of 4 banks (no bank conflicts).
//   - Fragments come from shared memory through ldmatrix; m16n8k16 mma accumulates in f32
//     registers.
//   - Epilogue: the accumulators go to shared memory (f32, K parts summed there), then the
//     block writes consecutive weight rows of each token from consecutive threads
//     (coalesced), adding the bias and the residual.
// - Q8 and Q4 weights (sm_75 and newer) run on the same pipeline and tiles (the small-batch
//   ones twice as deep along K) with f16 activations (gemm_quantized_tensor_core_kernel):
//   the weights' K tiles are copied as raw quantized bytes with their block scales and
//   dequantized to f16 in shared memory before the ldmatrix/mma steps; the section's comment
//   below has the details. Small batches read 1.9x (Q8) or 3.6x (Q4) fewer weight bytes
//   (scales included) than with f16 weights.
// - On sm_90a, f16 and bf16 weights can run on the warpgroup instructions instead
//   (gemm_warpgroup.cuh: TMA copies, wgmma, clusters sharing their operand tiles), where
//   warpgroup_gemm_enabled says so; so can Q8 and Q4 weights, each matrix dequantized to f16
//   in device memory the caller lends (dequantize.cuh, kernels.h: DequantizeScratch) first.
// - The block types (Q2_K, Q3_K, Q4_K, Q6_K, ...: block_units.cuh) are always dequantized
//   whole to f16 in that scratch first, then multiplied on the tiles f16 weights would take.
// - f32 weights, and bf16 weights on sm_75 (no bf16 mma there), run on a SIMT tiled GEMM
//   (gemm_simt_kernel): shared-memory tiles of both operands, each thread a 4 x 4 block of
//   outputs in registers.
// - The tile shapes (GemmTiles) and the rule that picks them from the sizes and the GPU are
//   in choose_gemm_tiles below.
//
// Device code first, then the launch numbers (constexpr, host-callable), then the host
// launchers (not compiled for the CPU emulation of CUDA).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>  // std::getenv

#include "common.cuh"
#include "cuda_check.h"
#include "dequantize.cuh"
#include "gemm_warpgroup.cuh"
#include "kernels.h"
#include "tensor_core.cuh"

namespace barellm::cuda {

// ==== Tensor-core GEMM (f16, bf16)

constexpr int kChunkElements = 8;      // 16-bit elements in a 16-byte chunk (one cp.async)
constexpr int kMmaTokens = 16;         // m of mma.m16n8k16: tokens per fragment
constexpr int kMmaRows = 8;            // n: weight rows per fragment
constexpr int kMmaK = 16;              // k: columns per mma
constexpr int kEpiloguePadFloats = 8;  // shared f32 row padding: conflict-free float2 writes

// The shape of a tensor-core GEMM block: a tile of kTileTokens x kTileRows outputs, warps
// laid out kWarpsTokens x kWarpsRows over it and kWarpsK deep along K, each multiplying
// kWarpK columns of every K tile, kStages K tiles in flight; registers are capped so that
// kMinBlocksPerSm blocks fit an SM's register file.
template <int kTileTokens_, int kTileRows_, int kWarpsTokens_, int kWarpsRows_, int kWarpsK_,
          int kWarpK_, int kStages_, int kMinBlocksPerSm_>
struct TensorCoreTiles {
    static constexpr int kTileTokens = kTileTokens_;
    static constexpr int kTileRows = kTileRows_;
    static constexpr int kWarpsTokens = kWarpsTokens_;
    static constexpr int kWarpsRows = kWarpsRows_;
    static constexpr int kWarpsK = kWarpsK_;
    static constexpr int kWarpK = kWarpK_;
    static constexpr int kStages = kStages_;
    static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;

    static constexpr int kWarps = kWarpsTokens * kWarpsRows * kWarpsK;
    static constexpr int kThreads = kWarps * kWarpSize;
    static constexpr int kTileK = kWarpsK * kWarpK;  // columns per stage
    static constexpr int kWarpTokens = kTileTokens / kWarpsTokens;
    static constexpr int kWarpRows = kTileRows / kWarpsRows;
    static constexpr int kFragmentsTokens = kWarpTokens / kMmaTokens;  // per warp
    static constexpr int kFragmentsRows = kWarpRows / kMmaRows;

    // A stage: the kTileTokens activation rows, then the kTileRows weight rows, each
    // kTileK elements and one chunk of padding (kStageStride elements apart).
    static constexpr int kStageStride = kTileK + kChunkElements;
    static constexpr int kStageElements = (kTileTokens + kTileRows) * kStageStride;
    static constexpr int kChunksPerRow = kTileK / kChunkElements;
    static constexpr int kChunksPerThread = (kTileTokens + kTileRows) * kChunksPerRow / kThreads;

    // The epilogue's f32 tile: the outputs of one row of warps (kWarpTokens tokens x
    // kTileRows rows), once per K part.
    static constexpr int kEpilogueStride = kTileRows + kEpiloguePadFloats;
    static constexpr int kEpilogueFloats = kWarpsK * kWarpTokens * kEpilogueStride;

    static constexpr size_t kSharedBytes =
        std::max(size_t(kStages) * kStageElements * sizeof(uint16_t),
                 size_t(kEpilogueFloats) * sizeof(float));

    static_assert(kWarpTokens % kMmaTokens == 0, "a warp's tokens are whole m16 fragments");
    static_assert(kWarpRows % (2 * kMmaRows) == 0, "ldmatrix.x4 loads two n8 fragments");
    static_assert((kTileTokens + kTileRows) * kChunksPerRow % kThreads == 0,
                  "every thread copies the same number of chunks");
    static_assert((kStageStride / kChunkElements) % 2 == 1,
                  "an odd number of chunks per shared row keeps ldmatrix conflict-free");
    static_assert(kStages >= 2, "the pipeline needs two stages at least");
    static_assert(kWarpK % (2 * kMmaK) == 0,
                  "fragments alternate between two buffers over whole K tiles");
};

// Thousands of weight rows, few tokens (1-64: weight-bandwidth-bound, like decode): thin
// tiles so that the grid has many blocks, four warps splitting each 128-column K tile.
// The token tiles of one row tile are neighbours in the grid (blockIdx.x), so their
// weights come from L2 after the first read.
using SmallBatchTiles = TensorCoreTiles<16, 16, 1, 1, 4, 32, 4, 1>;
// Middle sizes, and every size where the large tiles do not fit the GPU's shared memory.
using MediumTiles = TensorCoreTiles<64, 64, 2, 2, 1, 32, 4, 1>;
// Large batches: 128 x 128 tiles, eight warps of 64 tokens x 64 rows, two deep along each
// 64-column K tile. A 64 x 64 warp tile reads 4 KiB of shared memory (8 ldmatrix.x4) per
// 32 mma, a 64 x 32 one 3 KiB per 16: a third less shared-memory traffic per product, the
// resource mma.sync kernels run short of first.
using LargeTiles = TensorCoreTiles<128, 128, 2, 2, 2, 32, 4, 1>;
// Large batches over many weight rows (f16 and bf16 weights): 128 tokens x 256 rows, eight
// warps of 64 x 64 without a K split. Each weight and activation element brought from L2
// serves a third more products than in the large tiles, whose wo GEMM runs at 72% of the
// L2's throughput on an H100 (Nsight Compute); but the grid has half as many blocks.
using WideTiles = TensorCoreTiles<128, 256, 2, 4, 1, 32, 4, 1>;

// Copies columns [k0, k0 + kTileK) of the block's token rows (in) and weight rows (weights)
// into `stage`; chunks past the tokens, the rows or k_extent (the columns rounded up to a
// chunk) are zero-filled.
template <typename Tiles>
__device__ __forceinline__ void load_gemm_stage(uint16_t* stage, const uint16_t* __restrict__ in,
                                                int in_pitch, int first_token, int tokens,
                                                const uint16_t* __restrict__ weights, int w_pitch,
                                                int first_row, int rows, int k0, int k_extent) {
#pragma unroll
    for (int j = 0; j < Tiles::kChunksPerThread; ++j) {
        const int chunk = threadIdx.x + j * Tiles::kThreads;
        const int tile_row = chunk / Tiles::kChunksPerRow;
        const int column = k0 + chunk % Tiles::kChunksPerRow * kChunkElements;
        const bool is_token = tile_row < Tiles::kTileTokens;
        const uint16_t* base = is_token ? in : weights;
        const int row =
            is_token ? first_token + tile_row : first_row + tile_row - Tiles::kTileTokens;
        const int pitch = is_token ? in_pitch : w_pitch;
        const bool valid = row < (is_token ? tokens : rows) && column < k_extent;
        const uint16_t* source = valid ? base + size_t(row) * pitch + column : base;
        copy_async_16(stage + tile_row * Tiles::kStageStride + column - k0, source, valid);
    }
}

// Where this thread's warp works in its block's tile: tokens token0.. (kWarpTokens), weight
// rows row0.. (kWarpRows), columns k0.. (Tiles::kWarpK) of each K tile.
template <typename Tiles>
struct WarpPlace {
    int tokens_index = threadIdx.x / kWarpSize / Tiles::kWarpsRows % Tiles::kWarpsTokens;
    int k_index = threadIdx.x / kWarpSize / (Tiles::kWarpsRows * Tiles::kWarpsTokens);
    int token0 = tokens_index * Tiles::kWarpTokens;
    int row0 = threadIdx.x / kWarpSize % Tiles::kWarpsRows * Tiles::kWarpRows;
    int k0 = k_index * Tiles::kWarpK;
};

// One warp's mma operands for 16 columns of a stage: A fragments of its kFragmentsTokens
// token groups and B fragments of its kFragmentsRows weight-row groups.
template <typename Tiles>
struct GemmFragments {
    uint32_t a[Tiles::kFragmentsTokens][4];
    uint32_t b[Tiles::kFragmentsRows][2];
};

// Loads this warp's fragments of columns k .. k + 15 of a stage (activation rows
// `activations`, kTileTokens of them, and weight rows `weights`, kStageStride apart) from
// shared memory.
template <typename Tiles>
__device__ __forceinline__ void load_gemm_fragments(GemmFragments<Tiles>& f,
                                                    const uint16_t* activations,
                                                    const uint16_t* weights,
                                                    const WarpPlace<Tiles>& place, int k) {
    constexpr int kStride = Tiles::kStageStride;
    const int lane = threadIdx.x % kWarpSize;
    // A (16 tokens x 16 columns): lanes 0-15 address rows 0-15 at column k, lanes 16-31 the
    // same rows at column k + 8; the four 8x8 matrices are a[0..3].
#pragma unroll
    for (int i = 0; i < Tiles::kFragmentsTokens; ++i) {
        ldmatrix_x4(f.a[i], activations + (place.token0 + i * kMmaTokens + lane % 16) * kStride +
                                k + lane / 16 * kChunkElements);
    }
    // B for two n8 fragments (16 weight rows x 16 columns): matrix j = lane / 8 is rows
    // (j / 2) * 8.. at column k + (j % 2) * 8, so r[0], r[1] are fragment 2g's b[0], b[1] and
    // r[2], r[3] fragment 2g + 1's.
#pragma unroll
    for (int g = 0; g < Tiles::kFragmentsRows / 2; ++g) {
        uint32_t r[4];
        ldmatrix_x4(
            r, weights +
                   (place.row0 + g * 2 * kMmaRows + lane % 8 + lane / 16 * kMmaRows) * kStride + k +
                   lane / 8 % 2 * kChunkElements);
        f.b[2 * g][0] = r[0];
        f.b[2 * g][1] = r[1];
        f.b[2 * g + 1][0] = r[2];
        f.b[2 * g + 1][1] = r[3];
    }
}

// acc += the products of one set of fragments (every token group with every row group).
template <DType D, typename Tiles>
__device__ __forceinline__ void multiply_gemm_fragments(
    float (&acc)[Tiles::kFragmentsTokens][Tiles::kFragmentsRows][4],
    const GemmFragments<Tiles>& f) {
#pragma unroll
    for (int i = 0; i < Tiles::kFragmentsTokens; ++i)
#pragma unroll
        for (int j = 0; j < Tiles::kFragmentsRows; ++j) mma_16x8x16<D>(acc[i][j], f.a[i], f.b[j]);
}

// acc += this warp's part of a stage's product: tokens place.token0.., rows place.row0..,
// columns place.k0 .. place.k0 + kWarpK of the stage's activation rows (`activations`,
// kTileTokens rows) and weight rows (`weights`, kTileRows rows), kStageStride apart.
template <DType D, typename Tiles>
__device__ __forceinline__ void multiply_gemm_stage(
    float (&acc)[Tiles::kFragmentsTokens][Tiles::kFragmentsRows][4], const uint16_t* activations,
    const uint16_t* weights, const WarpPlace<Tiles>& place) {
#pragma unroll
    for (int kk = 0; kk < Tiles::kWarpK; kk += kMmaK) {
        GemmFragments<Tiles> f;
        load_gemm_fragments<Tiles>(f, activations, weights, place, place.k0 + kk);
        multiply_gemm_fragments<D, Tiles>(acc, f);
    }
}

// The epilogue of a tensor-core GEMM block, with the pipeline drained and the shared memory
// free: out[t, r] = (accumulate ? out[t, r] : 0) + acc + (bias ? bias[r] : 0) for the block's
// tile (blockIdx), t < tokens, r < rows.
template <typename Tiles>
__device__ __forceinline__ void store_gemm_tile(
    const float (&acc)[Tiles::kFragmentsTokens][Tiles::kFragmentsRows][4], float* __restrict__ out,
    int out_pitch, int rows, int tokens, const float* __restrict__ bias, bool accumulate) {
    const int lane = threadIdx.x % kWarpSize;
    const WarpPlace<Tiles> place;
    const int warp_tokens = place.tokens_index, warp_k = place.k_index, warp_row0 = place.row0;
    const int first_token = blockIdx.x * Tiles::kTileTokens;
    const int first_row = blockIdx.y * Tiles::kTileRows;
    // One row of warps (kWarpTokens tokens) at a time: fragments to shared memory
    // (each K part in its own slice), then consecutive threads sum the slices of consecutive
    // weight rows and store them. Fragment element e of (i, j) is token 16 i + g (+ 8 for
    // e >= 2), row 8 j + 2 t + e % 2, with g = lane / 4, t = lane % 4.
    float* tile = dynamic_shared_floats();
    for (int pass = 0; pass < Tiles::kWarpsTokens; ++pass) {
        if (warp_tokens == pass) {
#pragma unroll
            for (int i = 0; i < Tiles::kFragmentsTokens; ++i)
#pragma unroll
                for (int j = 0; j < Tiles::kFragmentsRows; ++j)
#pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        const int token = warp_k * Tiles::kWarpTokens + i * kMmaTokens + lane / 4 +
                                          half * (kMmaTokens / 2);
                        const int row = warp_row0 + j * kMmaRows + lane % 4 * 2;
                        *reinterpret_cast<float2*>(tile + token * Tiles::kEpilogueStride + row) =
                            float2{acc[i][j][2 * half], acc[i][j][2 * half + 1]};
                    }
        }
        __syncthreads();
        for (int e = threadIdx.x; e < Tiles::kWarpTokens * Tiles::kTileRows; e += Tiles::kThreads) {
            const int local_token = e / Tiles::kTileRows, local_row = e % Tiles::kTileRows;
            const int token = first_token + pass * Tiles::kWarpTokens + local_token;
            const int row = first_row + local_row;
            if (token < tokens && row < rows) {
                float sum = 0.0f;
#pragma unroll
                for (int part = 0; part < Tiles::kWarpsK; ++part)
                    sum += tile[(part * Tiles::kWarpTokens + local_token) * Tiles::kEpilogueStride +
                                local_row];
                if (bias != nullptr) sum += bias[row];
                float* slot = out + size_t(token) * out_pitch + row;
                *slot = accumulate ? *slot + sum : sum;
            }
        }
        __syncthreads();  // the tile is written again by the next pass
    }
}

// out[t, r] = (accumulate ? out[t, r] : 0) + sum_c in[t, c] * W[r, c] + (bias ? bias[r] : 0)
// for t < tokens, r < rows, with in [tokens, in_pitch] and W [rows, w_pitch] of D (f16 or
// bf16), columns k_extent.. of both zero or absent (k_extent: cols rounded up to 8).
// Launch: grid (ceil(tokens / kTileTokens), ceil(rows / kTileRows)), block Tiles::kThreads,
// dynamic shared memory Tiles::kSharedBytes (gemm_tensor_core_grid, TensorCoreTiles).
template <DType D, typename Tiles>
__global__ void __launch_bounds__(Tiles::kThreads, Tiles::kMinBlocksPerSm)
    gemm_tensor_core_kernel(float* __restrict__ out, int out_pitch,
                            const uint16_t* __restrict__ weights, int rows, int w_pitch,
                            const uint16_t* __restrict__ in, int tokens, int in_pitch, int k_extent,
                            const float* __restrict__ bias, bool accumulate) {
    uint16_t* stages = reinterpret_cast<uint16_t*>(dynamic_shared_floats());
    const WarpPlace<Tiles> place;
    const int first_token = blockIdx.x * Tiles::kTileTokens;
    const int first_row = blockIdx.y * Tiles::kTileRows;

    float acc[Tiles::kFragmentsTokens][Tiles::kFragmentsRows][4] = {};

    // The pipeline: K tile kt lives in stage kt % kStages. Every thread commits one group
    // per K tile (empty past the last), so "K tile kt + 1 has landed" is "at most kStages - 2
    // groups pending" once tile kt + kStages - 1 has been committed.
    const int k_tiles = (k_extent + Tiles::kTileK - 1) / Tiles::kTileK;
    auto stage = [&](int kt) { return stages + kt % Tiles::kStages * Tiles::kStageElements; };
    auto load = [&](int kt) {
        if (kt < k_tiles)
            load_gemm_stage<Tiles>(stage(kt), in, in_pitch, first_token, tokens, weights, w_pitch,
                                   first_row, rows, kt * Tiles::kTileK, k_extent);
        copy_async_commit();
    };
    // The fragments alternate between two buffers: those of the next 16 columns are loaded
    // from shared memory while the tensor cores multiply the current ones, across the end of
    // a K tile too (the next tile's first fragments are read right after the barrier that
    // makes the tile visible, before the current tile's last products).
    constexpr int kSteps = Tiles::kWarpK / kMmaK;  // fragment sets per warp and K tile (even)
    GemmFragments<Tiles> fragments[2];
#pragma unroll
    for (int kt = 0; kt < Tiles::kStages - 1; ++kt) load(kt);
    copy_async_wait<Tiles::kStages - 2>();
    __syncthreads();
    load_gemm_fragments<Tiles>(fragments[0], stage(0),
                               stage(0) + Tiles::kTileTokens * Tiles::kStageStride, place,
                               place.k0);
    for (int kt = 0; kt < k_tiles; ++kt) {
        // Into the stage of tile kt - 1, which every warp finished reading before the last
        // barrier.
        load(kt + Tiles::kStages - 1);
        const uint16_t* current = stage(kt);
#pragma unroll
        for (int step = 0; step < kSteps; ++step) {
            GemmFragments<Tiles>& next = fragments[(step + 1) % 2];
            if (step + 1 < kSteps) {
                load_gemm_fragments<Tiles>(next, current,
                                           current + Tiles::kTileTokens * Tiles::kStageStride,
                                           place, place.k0 + (step + 1) * kMmaK);
            } else {
                copy_async_wait<Tiles::kStages - 2>();  // tile kt + 1 has landed
                __syncthreads();
                if (kt + 1 < k_tiles) {
                    const uint16_t* following = stage(kt + 1);
                    load_gemm_fragments<Tiles>(next, following,
                                               following + Tiles::kTileTokens * Tiles::kStageStride,
                                               place, place.k0);
                }
            }
            multiply_gemm_fragments<D, Tiles>(acc, fragments[step % 2]);
        }
    }
    copy_async_wait<0>();
    __syncthreads();  // the stages are free: the epilogue reuses their memory
    store_gemm_tile<Tiles>(acc, out, out_pitch, rows, tokens, bias, accumulate);
}

// ==== Tensor-core GEMM of Q8 and Q4 weights (f16 activations)
//
// gemm_quantized_tensor_core_kernel runs the pipeline of gemm_tensor_core_kernel with the
// weights' K tiles copied as they lie in memory: a stage holds the activation rows (f16,
// as above), the weight rows' raw bytes (kTileK int8 values a row for Q8, kTileK / 2 bytes
// of nibbles for Q4) and their block scales. The block dequantizes a stage's weights into
// an f16 tile in shared memory (each value scale * q rounded to f16 once, dequantize_four)
// and multiplies that tile with the activations as for f16 weights (multiply_gemm_stage).
// Dequantizing in shared memory rather than straight into the mma fragments dequantizes
// each weight once per block instead of once per row of warps along the tokens, and keeps
// the ldmatrix/mma step of the f16 path unchanged. There are two such tiles: while the
// warps multiply K tile kt from one, they dequantize tile kt + 1 into the other, so that
// one warp's dequantizing overlaps another's products and each K tile costs one
// __syncthreads.
//
// The scales (2 bytes per row and block of 32 columns, the rows blocks_per_row scales
// apart) do not come in 16-byte pieces: each thread reads its share of a stage's scales
// into registers when it issues the stage's copies and stores them into the stage after
// the current product, one K tile before they are needed.
//
// Edges: raw bytes past the rows or the row's blocks are zero-filled and their scales are
// 0 (no scale is read outside the matrix), so those weights dequantize to 0 for Q4 as for
// Q8 (a zero Q4 byte alone would be -8 * scale) and never to inf or NaN. The activations'
// columns run to cols rounded up to 8 (in_extent), the weights' to the padded pitch (whole
// blocks); activation columns past in_extent are zero-filled, and the weights' padding
// values are 0.

constexpr int kChunkBytes = 16;  // one cp.async

// The small-batch tiles of Q8/Q4 weights (GemmTiles::kSmallBatch): as SmallBatchTiles with
// eight warps along K (256-column K tiles). A stage of SmallBatchTiles holds 16 rows x 128
// columns of weights, 4 KiB in f16 but 2 KiB in Q8 and 1 KiB in Q4; doubling the K tile
// keeps twice the weight bytes in flight per block (the weight reads bound small batches),
// and halves the __syncthreads per column.
using QuantizedSmallBatchTiles = TensorCoreTiles<16, 16, 1, 1, 8, 32, 4, 1>;

// The shared-memory layout of a quantized GEMM block with tile shape Tiles and weights W
// (I8 for Q8, U8 for Q4). A stage is, in bytes: the activations [kTileTokens][kStageStride]
// f16, the raw weights [kTileRows][kRowBytes], the scales [kTileRows][kBlocksPerRow] f16,
// rounded up to 16 bytes. After kStages stages come the two dequantized weight tiles
// [kTileRows][kStageStride] f16.
template <DType W, typename Tiles>
struct QuantizedTiles {
    static_assert(W == DType::Q8_0 || W == DType::Q4_0, "Q8 (I8) or Q4 (U8) weights");
    static constexpr int kRowBytes = W == DType::Q8_0 ? Tiles::kTileK : Tiles::kTileK / 2;
    static constexpr int kRawChunksPerRow = kRowBytes / kChunkBytes;
    static constexpr int kBlocksPerRow = Tiles::kTileK / kQuantizedBlock;  // scales per K tile
    static constexpr int kActivationChunks = Tiles::kTileTokens * Tiles::kChunksPerRow;
    static constexpr int kCopyChunks = kActivationChunks + Tiles::kTileRows * kRawChunksPerRow;
    static constexpr int kCopiesPerThread = (kCopyChunks + Tiles::kThreads - 1) / Tiles::kThreads;
    static constexpr int kScales = Tiles::kTileRows * kBlocksPerRow;
    static constexpr int kScalesPerThread = (kScales + Tiles::kThreads - 1) / Tiles::kThreads;
    // Chunks of 8 dequantized f16 values per K tile, and per thread.
    static constexpr int kDequantizedChunks = Tiles::kTileRows * Tiles::kChunksPerRow;
    static constexpr int kDequantizedChunksPerThread = kDequantizedChunks / Tiles::kThreads;

    static constexpr size_t kActivationBytes =
        size_t(Tiles::kTileTokens) * Tiles::kStageStride * sizeof(uint16_t);
    static constexpr size_t kRawBytes = size_t(Tiles::kTileRows) * kRowBytes;
    static constexpr size_t kScaleBytes = size_t(kScales) * sizeof(uint16_t);
    static constexpr size_t kStageBytes =
        (kActivationBytes + kRawBytes + kScaleBytes + kChunkBytes - 1) / kChunkBytes * kChunkBytes;
    static constexpr size_t kWeightTileBytes =
        size_t(Tiles::kTileRows) * Tiles::kStageStride * sizeof(uint16_t);
    static constexpr size_t kSharedBytes =
        std::max(size_t(Tiles::kStages) * kStageBytes + 2 * kWeightTileBytes,
                 size_t(Tiles::kEpilogueFloats) * sizeof(float));

    static_assert(Tiles::kTileK % kQuantizedBlock == 0, "K tiles hold whole blocks");
    static_assert(kRowBytes % kChunkBytes == 0, "a raw weight row is whole 16-byte chunks");
    static_assert(kDequantizedChunks % Tiles::kThreads == 0,
                  "every thread dequantizes the same number of chunks");
    static_assert(kActivationBytes % kChunkBytes == 0 && kRawBytes % kChunkBytes == 0,
                  "the raw weights start on 16 bytes");
    static_assert(Tiles::kStages >= 3,
                  "tile kt + 1 is dequantized while tile kt is multiplied: one more stage landed");
};

// Issues the copies of K tile k0.. (columns k0 .. k0 + kTileK) into `stage`: the block's
// token rows of `in` (f16, columns past in_extent zero-filled) and its weight rows' raw
// bytes (w_row_bytes a row; bytes past the row zero-filled); rows past tokens or rows are
// zero-filled.
template <DType W, typename Tiles>
__device__ __forceinline__ void load_quantized_stage(uint8_t* stage,
                                                     const uint16_t* __restrict__ in, int in_pitch,
                                                     int first_token, int tokens, int in_extent,
                                                     const uint8_t* __restrict__ weights,
                                                     int w_row_bytes, int first_row, int rows,
                                                     int k0) {
    using Q = QuantizedTiles<W, Tiles>;
    const int k0_bytes = k0 / Tiles::kTileK * Q::kRowBytes;
#pragma unroll
    for (int j = 0; j < Q::kCopiesPerThread; ++j) {
        const int chunk = threadIdx.x + j * Tiles::kThreads;
        if (chunk >= Q::kCopyChunks) break;
        if (chunk < Q::kActivationChunks) {
            const int tile_row = chunk / Tiles::kChunksPerRow;
            const int column = k0 + chunk % Tiles::kChunksPerRow * kChunkElements;
            const int token = first_token + tile_row;
            const bool valid = token < tokens && column < in_extent;
            const uint16_t* source = valid ? in + size_t(token) * in_pitch + column : in;
            copy_async_16(
                reinterpret_cast<uint16_t*>(stage) + tile_row * Tiles::kStageStride + column - k0,
                source, valid);
        } else {
            const int raw_chunk = chunk - Q::kActivationChunks;
            const int tile_row = raw_chunk / Q::kRawChunksPerRow;
            const int byte = k0_bytes + raw_chunk % Q::kRawChunksPerRow * kChunkBytes;
            const int row = first_row + tile_row;
            const bool valid = row < rows && byte < w_row_bytes;
            const uint8_t* source = valid ? weights + size_t(row) * w_row_bytes + byte : weights;
            copy_async_16(stage + Q::kActivationBytes + tile_row * Q::kRowBytes + byte - k0_bytes,
                          source, valid);
        }
    }
}

// This thread's share of the scales of K tile k0.. of the block's weight rows (0 past the
// rows or the row's blocks_per_row blocks), read into registers; store_stage_scales writes
// them into the stage.
template <DType W, typename Tiles>
__device__ __forceinline__ void read_stage_scales(
    uint16_t (&held)[QuantizedTiles<W, Tiles>::kScalesPerThread],
    const uint16_t* __restrict__ scales, int blocks_per_row, int first_row, int rows, int k0) {
    using Q = QuantizedTiles<W, Tiles>;
#pragma unroll
    for (int j = 0; j < Q::kScalesPerThread; ++j) {
        const int index = threadIdx.x + j * Tiles::kThreads;
        const int row = first_row + index / Q::kBlocksPerRow;
        const int block = k0 / kQuantizedBlock + index % Q::kBlocksPerRow;
        const bool valid = index < Q::kScales && row < rows && block < blocks_per_row;
        held[j] = valid ? __ldg(scales + size_t(row) * blocks_per_row + block) : uint16_t(0);
    }
}

template <DType W, typename Tiles>
__device__ __forceinline__ void store_stage_scales(
    uint8_t* stage, const uint16_t (&held)[QuantizedTiles<W, Tiles>::kScalesPerThread]) {
    using Q = QuantizedTiles<W, Tiles>;
    uint16_t* stage_scales =
        reinterpret_cast<uint16_t*>(stage + Q::kActivationBytes + Q::kRawBytes);
#pragma unroll
    for (int j = 0; j < Q::kScalesPerThread; ++j) {
        const int index = threadIdx.x + j * Tiles::kThreads;
        if (index < Q::kScales) stage_scales[index] = held[j];
    }
}

// The stage's weights as f16 into `tile` [kTileRows][kStageStride]: each thread turns
// 8 consecutive weights of a row (one 16-byte chunk of the tile) at a time
// (dequantize.cuh: dequantize_eight).
template <DType W, typename Tiles>
__device__ __forceinline__ void dequantize_stage(uint16_t* tile, const uint8_t* stage) {
    using Q = QuantizedTiles<W, Tiles>;
    const uint8_t* raw = stage + Q::kActivationBytes;
    const uint16_t* stage_scales = reinterpret_cast<const uint16_t*>(raw + Q::kRawBytes);
#pragma unroll
    for (int j = 0; j < Q::kDequantizedChunksPerThread; ++j) {
        const int chunk = threadIdx.x + j * Tiles::kThreads;
        const int tile_row = chunk / Tiles::kChunksPerRow;
        const int column = chunk % Tiles::kChunksPerRow * kChunkElements;  // in the K tile
        const uint16_t scale = stage_scales[tile_row * Q::kBlocksPerRow + column / kQuantizedBlock];
        *reinterpret_cast<uint4*>(tile + tile_row * Tiles::kStageStride + column) =
            dequantize_eight<W>(raw + tile_row * Q::kRowBytes, column, scale);
    }
}

// out[t, r] = (accumulate ? out[t, r] : 0) + sum_c in[t, c] * W[r, c] + (bias ? bias[r] : 0)
// for t < tokens, r < rows: W [rows, w_pitch] Q8 (W = I8: int8 values, w_pitch bytes a row)
// or Q4 (U8: w_pitch / 2 bytes a row) with `scales` [rows, w_pitch / 32] f16, in [tokens,
// in_pitch] f16 with columns in_extent.. zero or absent (in_extent: cols rounded up to 8).
// Launch: grid (ceil(tokens / kTileTokens), ceil(rows / kTileRows)), block Tiles::kThreads,
// dynamic shared memory QuantizedTiles<W, Tiles>::kSharedBytes (gemm_tensor_core_grid).
template <DType W, typename Tiles>
__global__ void __launch_bounds__(Tiles::kThreads, Tiles::kMinBlocksPerSm)
    gemm_quantized_tensor_core_kernel(float* __restrict__ out, int out_pitch,
                                      const uint8_t* __restrict__ weights,
                                      const uint16_t* __restrict__ scales, int rows, int w_pitch,
                                      const uint16_t* __restrict__ in, int tokens, int in_pitch,
                                      int in_extent, const float* __restrict__ bias,
                                      bool accumulate) {
    using Q = QuantizedTiles<W, Tiles>;
    uint8_t* stages = reinterpret_cast<uint8_t*>(dynamic_shared_floats());
    uint16_t* weight_tiles = reinterpret_cast<uint16_t*>(stages + Tiles::kStages * Q::kStageBytes);
    const WarpPlace<Tiles> place;
    const int first_token = blockIdx.x * Tiles::kTileTokens;
    const int first_row = blockIdx.y * Tiles::kTileRows;
    const int blocks_per_row = w_pitch / kQuantizedBlock;
    const int w_row_bytes =
        blocks_per_row * (W == DType::Q8_0 ? kQuantizedBlock : kQuantizedBlock / 2);

    float acc[Tiles::kFragmentsTokens][Tiles::kFragmentsRows][4] = {};
    uint16_t held_scales[Q::kScalesPerThread];

    // The pipeline of gemm_tensor_core_kernel (K tile kt in stage kt % kStages, one commit
    // group per K tile), over the weights' padded columns, and K tile kt dequantized into
    // weight tile kt % 2 one iteration ahead, in iteration kt - 1. The scales of tile kt
    // reach its stage at the end of iteration kt - kStages + 1, after that iteration's
    // __syncthreads (every thread is done with the stage's previous tile); the
    // __syncthreads of iteration kt - 1 makes them visible to its dequantizing.
    const int k_tiles = (w_pitch + Tiles::kTileK - 1) / Tiles::kTileK;
    auto stage = [&](int kt) { return stages + kt % Tiles::kStages * Q::kStageBytes; };
    auto weight_tile = [&](int kt) {
        return weight_tiles + kt % 2 * Tiles::kTileRows * Tiles::kStageStride;
    };
    auto load = [&](int kt) {
        if (kt < k_tiles) {
            load_quantized_stage<W, Tiles>(stage(kt), in, in_pitch, first_token, tokens, in_extent,
                                           weights, w_row_bytes, first_row, rows,
                                           kt * Tiles::kTileK);
            read_stage_scales<W, Tiles>(held_scales, scales, blocks_per_row, first_row, rows,
                                        kt * Tiles::kTileK);
        }
        copy_async_commit();
    };
    auto store_scales = [&](int kt) {
        if (kt < k_tiles) store_stage_scales<W, Tiles>(stage(kt), held_scales);
    };
#pragma unroll
    for (int kt = 0; kt < Tiles::kStages - 1; ++kt) {
        load(kt);
        store_scales(kt);
    }
    copy_async_wait<Tiles::kStages - 2>();  // tile 0 has landed
    __syncthreads();                        // its copies and scales are visible
    dequantize_stage<W, Tiles>(weight_tile(0), stage(0));
    for (int kt = 0; kt < k_tiles; ++kt) {
        copy_async_wait<Tiles::kStages - 3>();  // tile kt + 1 has landed
        // Makes weight tile kt complete and tile kt + 1 visible, and ends every warp's work
        // on iteration kt - 1: the stage of tile kt - 1 and weight tile kt + 1 are written
        // again below.
        __syncthreads();
        load(kt + Tiles::kStages - 1);
        multiply_gemm_stage<DType::F16, Tiles>(acc, reinterpret_cast<const uint16_t*>(stage(kt)),
                                               weight_tile(kt), place);
        if (kt + 1 < k_tiles) dequantize_stage<W, Tiles>(weight_tile(kt + 1), stage(kt + 1));
        store_scales(kt + Tiles::kStages - 1);
    }
    copy_async_wait<0>();
    __syncthreads();  // the stages are free: the epilogue reuses their memory
    store_gemm_tile<Tiles>(acc, out, out_pitch, rows, tokens, bias, accumulate);
}

// ==== SIMT GEMM (f32 weights; bf16 on sm_75)

constexpr int kSimtTileTokens = 64;
constexpr int kSimtTileRows = 64;
constexpr int kSimtTileK = 16;
constexpr int kSimtThreadsTokens = 16;  // the block's threads: 16 x 16
constexpr int kSimtThreadsRows = 16;
constexpr int kSimtThreads = kSimtThreadsTokens * kSimtThreadsRows;
constexpr int kSimtOutputsTokens = kSimtTileTokens / kSimtThreadsTokens;  // per thread: 4 x 4
constexpr int kSimtOutputsRows = kSimtTileRows / kSimtThreadsRows;
constexpr int kSimtPadFloats = 4;  // shared row padding
static_assert(kSimtTileTokens == kSimtTileRows, "both operand tiles have the same shape");

// As gemm_tensor_core_kernel, on the CUDA cores, for D = f32 or bf16: the K tile of both
// operands is staged in shared memory as f32, transposed (column-major: a k row holds the
// tile's tokens or weight rows), and thread (ty, tx) computes tokens ty + 16 i and rows
// tx + 16 j, i, j < 4. k_extent: cols rounded up to a 16-byte vector.
// Launch: grid (ceil(tokens / 64), ceil(rows / 64)), block 256 (gemm_simt_grid,
// kSimtThreads), no dynamic shared memory.
template <DType D>
__global__ void __launch_bounds__(kSimtThreads)
    gemm_simt_kernel(float* __restrict__ out, int out_pitch, const void* __restrict__ weights,
                     int rows, int w_pitch, const void* __restrict__ in, int tokens, int in_pitch,
                     int k_extent, const float* __restrict__ bias, bool accumulate) {
    __shared__ float token_tile[kSimtTileK][kSimtTileTokens + kSimtPadFloats];
    __shared__ float row_tile[kSimtTileK][kSimtTileRows + kSimtPadFloats];
    using Format = WeightFormat<D>;
    constexpr int kPer = Format::kPerVector;
    constexpr int kVectorsPerRow = kSimtTileK / kPer;
    constexpr int kVectors = (kSimtTileTokens + kSimtTileRows) * kVectorsPerRow;
    constexpr size_t kElementBytes = dtype_size_v<D>;
    const int tx = threadIdx.x % kSimtThreadsRows, ty = threadIdx.x / kSimtThreadsRows;
    const int first_token = blockIdx.x * kSimtTileTokens;
    const int first_row = blockIdx.y * kSimtTileRows;

    float acc[kSimtOutputsTokens][kSimtOutputsRows] = {};
    for (int k0 = 0; k0 < k_extent; k0 += kSimtTileK) {
        for (int v = threadIdx.x; v < kVectors; v += kSimtThreads) {
            const int tile_row = v / kVectorsPerRow;
            const int column = k0 + v % kVectorsPerRow * kPer;
            const bool is_token = tile_row < kSimtTileTokens;
            const int local = is_token ? tile_row : tile_row - kSimtTileTokens;
            const int row = (is_token ? first_token : first_row) + local;
            uint4 raw = make_uint4(0, 0, 0, 0);
            if (row < (is_token ? tokens : rows) && column < k_extent) {
                const char* base = static_cast<const char*>(is_token ? in : weights);
                raw = *reinterpret_cast<const uint4*>(
                    base +
                    (size_t(row) * (is_token ? in_pitch : w_pitch) + column) * kElementBytes);
            }
            float values[kPer];
            Format::unpack(raw, values);
            float(*tile)[kSimtTileRows + kSimtPadFloats] = is_token ? token_tile : row_tile;
#pragma unroll
            for (int e = 0; e < kPer; ++e) tile[column - k0 + e][local] = values[e];
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < kSimtTileK; ++k) {
            float a[kSimtOutputsTokens], b[kSimtOutputsRows];
#pragma unroll
            for (int i = 0; i < kSimtOutputsTokens; ++i)
                a[i] = token_tile[k][ty + i * kSimtThreadsTokens];
#pragma unroll
            for (int j = 0; j < kSimtOutputsRows; ++j)
                b[j] = row_tile[k][tx + j * kSimtThreadsRows];
#pragma unroll
            for (int i = 0; i < kSimtOutputsTokens; ++i)
#pragma unroll
                for (int j = 0; j < kSimtOutputsRows; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();  // the tiles are written again by the next K tile
    }
#pragma unroll
    for (int i = 0; i < kSimtOutputsTokens; ++i) {
        const int token = first_token + ty + i * kSimtThreadsTokens;
#pragma unroll
        for (int j = 0; j < kSimtOutputsRows; ++j) {
            const int row = first_row + tx + j * kSimtThreadsRows;
            if (token < tokens && row < rows) {
                const float sum = bias != nullptr ? acc[i][j] + bias[row] : acc[i][j];
                float* slot = out + size_t(token) * out_pitch + row;
                *slot = accumulate ? *slot + sum : sum;
            }
        }
    }
}

// ==== Launch numbers (host and emulation)

// The grid of a tensor-core GEMM: token tiles along x (neighbouring blocks share weight
// rows), row tiles along y.
template <typename Tiles>
inline dim3 gemm_tensor_core_grid(int tokens, int rows) {
    return dim3((tokens + Tiles::kTileTokens - 1) / Tiles::kTileTokens,
                (rows + Tiles::kTileRows - 1) / Tiles::kTileRows);
}

inline dim3 gemm_simt_grid(int tokens, int rows) {
    return dim3((tokens + kSimtTileTokens - 1) / kSimtTileTokens,
                (rows + kSimtTileRows - 1) / kSimtTileRows);
}

// The columns a GEMM multiplies over: cols rounded up to the 16-byte vector of `dtype`
// (the row padding is zero, so the padded columns add nothing).
inline int gemm_k_extent(int cols, DType dtype) { return padded_cols(cols, dtype); }

// Whether a GPU of compute_capability (10 * major + minor) multiplies weights of `dtype`
// on tensor cores: f16, and Q8/Q4 (dequantized to f16), from sm_75 (m16n8k8), bf16 from
// sm_80.
inline bool has_tensor_core_product(DType dtype, int compute_capability) {
    constexpr int kF16Mma = 75, kBf16Mma = 80;
    const bool f16_product = dtype == DType::F16 || dtype == DType::Q8_0 || dtype == DType::Q4_0;
    return (f16_product && compute_capability >= kF16Mma) ||
           (dtype == DType::BF16 && compute_capability >= kBf16Mma);
}

// Dynamic shared memory of a tensor-core GEMM block with tile shape Tiles for weights of
// `dtype` (f16, bf16, Q8 or Q4).
template <typename Tiles>
inline size_t gemm_tensor_core_shared_bytes(DType dtype) {
    if (dtype == DType::Q8_0) return QuantizedTiles<DType::Q8_0, Tiles>::kSharedBytes;
    if (dtype == DType::Q4_0) return QuantizedTiles<DType::Q4_0, Tiles>::kSharedBytes;
    return Tiles::kSharedBytes;
}

constexpr int kSmallBatchMaxTokens = 64;
// The large tiles need at least this many of their blocks per SM on average (3/4 of a
// wave); fewer leave SMs idle, and the medium tiles' grid fills the GPU better.
constexpr int kLargeMinBlocksPerFourSms = 3;

// The time of a grid of `blocks` blocks of `tile_outputs` outputs each on `multiprocessors`
// SMs, one block per SM at a time, in units of one large tile's time: the waves (the last
// one counts whole) times the tile's size.
inline double tile_waves(size_t blocks, int tile_outputs, int multiprocessors) {
    const size_t waves = (blocks + multiprocessors - 1) / multiprocessors;
    return double(waves) * tile_outputs / (LargeTiles::kTileTokens * LargeTiles::kTileRows);
}

// The rule gemm follows:
// - f32 weights, and bf16 weights below sm_80: SIMT. Q8 and Q4 weights take the tiles of
//   f16 weights (kSmallBatch: QuantizedSmallBatchTiles, the same tokens and rows) but the
//   wide ones.
// - Up to kSmallBatchMaxTokens tokens: SmallBatchTiles. The product is bound by reading
//   the weights, like decode: the grid has ceil(rows / 16) row tiles to spread that over
//   the SMs, and the (at most 4) token tiles of a row tile run side by side, so each weight
//   byte comes from memory once and from L2 after that.
// - Otherwise LargeTiles where they fit the GPU's shared memory (sm_80, sm_90) and their
//   grid has at least 3 blocks per 4 SMs (one block fits an SM), else MediumTiles (more,
//   smaller blocks: 64 x 64).
// - f16 and bf16 weights take WideTiles instead of LargeTiles where they fit and their grid
//   takes no longer by tile_waves (ties go to the wide tiles, which do more per byte): at
//   512 tokens on an H100, Mistral-7B's qkv (6144 rows) and w1/w3 (14336 rows) but not its
//   wo and w2 (4096 rows: 64 wide blocks for 132 SMs).
// - With `warpgroup` (warpgroup_gemm_use: sm_90a), f16 and bf16 weights past the small
//   batches take GemmTiles::kWarpgroup instead of the last two rules: always, or
//   (kWhereItFills) where its grid of the smallest tiles (128 tokens x 128 rows) has at
//   least 3 blocks per 4 SMs as for the large tiles (e.g. not Mistral-7B's qkv below 257
//   tokens: its weights must stream through every SM). Q8 and Q4 weights take it where f16
//   weights would, dequantized to f16 first (gemm: where its scratch holds them).
// The columns do not enter: they set the length of each block's K loop, not the grid.
inline GemmTiles choose_gemm_tiles(DType dtype, int tokens, int rows, int compute_capability,
                                   int multiprocessors, size_t shared_bytes_per_block,
                                   WarpgroupUse warpgroup = WarpgroupUse::kNever) {
    if (!has_tensor_core_product(dtype, compute_capability)) return GemmTiles::kSimt;
    if (tokens <= kSmallBatchMaxTokens) return GemmTiles::kSmallBatch;
    if (warpgroup != WarpgroupUse::kNever && dtype != DType::F32) {
        if (warpgroup == WarpgroupUse::kAlways) return GemmTiles::kWarpgroup;
        constexpr int kSmallestRows = kWarpgroupRowChoices[kWarpgroupRowKinds - 1];
        const dim3 grid = warpgroup_grid(tokens, rows, kSmallestRows, 1, kWarpgroupClusterRows);
        if (4 * size_t(grid.x) * grid.y >= size_t(kLargeMinBlocksPerFourSms) * multiprocessors)
            return GemmTiles::kWarpgroup;
    }
    const dim3 large = gemm_tensor_core_grid<LargeTiles>(tokens, rows);
    const size_t large_blocks = size_t(large.x) * large.y;
    if (gemm_tensor_core_shared_bytes<LargeTiles>(dtype) > shared_bytes_per_block ||
        4 * large_blocks < size_t(kLargeMinBlocksPerFourSms) * multiprocessors)
        return GemmTiles::kMedium;
    const bool wide_runs = (dtype == DType::F16 || dtype == DType::BF16) &&
                           WideTiles::kSharedBytes <= shared_bytes_per_block;
    if (wide_runs) {
        const dim3 wide = gemm_tensor_core_grid<WideTiles>(tokens, rows);
        const double wide_time =
            tile_waves(size_t(wide.x) * wide.y, WideTiles::kTileTokens * WideTiles::kTileRows,
                       multiprocessors);
        const double large_time = tile_waves(
            large_blocks, LargeTiles::kTileTokens * LargeTiles::kTileRows, multiprocessors);
        if (wide_time <= large_time) return GemmTiles::kWide;
    }
    return GemmTiles::kLarge;
}

#ifdef BARELLM_LAUNCH_FUNCTIONS

namespace {

template <DType D, typename Tiles>
void launch_gemm_tensor_core(float* out, int out_pitch, const DeviceMatrix& w,
                             const DeviceActivations& in, const float* bias, bool accumulate,
                             cudaStream_t stream) {
    auto kernel = gemm_tensor_core_kernel<D, Tiles>;
    // Above 48 KiB of dynamic shared memory a kernel must opt in, once.
    static const bool opted_in = (allow_shared_bytes(kernel, Tiles::kSharedBytes), true);
    (void)opted_in;
    launch_kernel(kernel, gemm_tensor_core_grid<Tiles>(in.tokens, w.rows), Tiles::kThreads,
                  Tiles::kSharedBytes, stream, out, out_pitch, static_cast<const uint16_t*>(w.data),
                  w.rows, w.pitch, static_cast<const uint16_t*>(in.data), in.tokens, in.pitch,
                  gemm_k_extent(w.cols, D), bias, accumulate);
}

template <DType W, typename Tiles>
void launch_gemm_quantized(float* out, int out_pitch, const DeviceMatrix& w,
                           const DeviceActivations& in, const float* bias, bool accumulate,
                           cudaStream_t stream) {
    using Q = QuantizedTiles<W, Tiles>;
    auto kernel = gemm_quantized_tensor_core_kernel<W, Tiles>;
    // Once, as launch_gemm_tensor_core.
    static const bool opted_in = (allow_shared_bytes(kernel, Q::kSharedBytes), true);
    (void)opted_in;
    launch_kernel(kernel, gemm_tensor_core_grid<Tiles>(in.tokens, w.rows), Tiles::kThreads,
                  Q::kSharedBytes, stream, out, out_pitch, static_cast<const uint8_t*>(w.data),
                  w.scales, w.rows, w.pitch, static_cast<const uint16_t*>(in.data), in.tokens,
                  in.pitch, gemm_k_extent(in.cols, DType::F16), bias, accumulate);
}

// f(WarpgroupGemmTiles<tile_rows, kClusterTokens, kClusterRows>{}) for tile_rows one of
// kWarpgroupRowChoices.
template <int kClusterTokens, int kClusterRows, typename F>
auto with_warpgroup_tiles(int tile_rows, F f) {
    switch (tile_rows) {
        case kWarpgroupRowChoices[0]:
            return f(WarpgroupGemmTiles<kWarpgroupRowChoices[0], kClusterTokens, kClusterRows>{});
        case kWarpgroupRowChoices[1]:
            return f(WarpgroupGemmTiles<kWarpgroupRowChoices[1], kClusterTokens, kClusterRows>{});
        case kWarpgroupRowChoices[2]:
            return f(WarpgroupGemmTiles<kWarpgroupRowChoices[2], kClusterTokens, kClusterRows>{});
        case kWarpgroupRowChoices[3]:
            return f(WarpgroupGemmTiles<kWarpgroupRowChoices[3], kClusterTokens, kClusterRows>{});
    }
    throw Error("gemm: the warpgroup GEMM's blocks take 128, 192, 224 or 256 weight rows");
}

// The blocks of each of kWarpgroupRowChoices the GPU runs at once in clusters of
// kClusterTokens x kClusterRows (warpgroup_concurrent_blocks asks the driver once a shape).
template <DType D, int kClusterTokens, int kClusterRows>
std::array<int, kWarpgroupRowKinds> warpgroup_blocks_at_once() {
    std::array<int, kWarpgroupRowKinds> blocks{};
    for (int i = 0; i < kWarpgroupRowKinds; ++i)
        blocks[i] = with_warpgroup_tiles<kClusterTokens, kClusterRows>(
            kWarpgroupRowChoices[i],
            [](auto tiles) { return warpgroup_concurrent_blocks<D, decltype(tiles)>(); });
    return blocks;
}

// The warpgroup GEMM: the product out = in · Wᵀ (+ bias) (+ out) into f32 `out`, or where
// `up` is given act(in · Wᵀ) * (in · upᵀ) into activations `out` of D with `out_cols`
// columns, act by `activation` (gemm_warpgroup_kernel's gated form). Clusters pair the token tiles
// where their number is even; an odd number would leave a whole token tile of blocks multiplying
// zeros (half the blocks for 65-128 tokens), so there each cluster is one token tile by two row
// tiles. The blocks take `tile_rows` weight rows (one of kWarpgroupRowChoices), or where
// that is 0 the rows and clusters of choose_warpgroup_shape for the blocks this GPU runs at
// once (the gated form's tiles hold the rows of both matrices).
template <DType D>
void launch_gemm_warpgroup(int tile_rows, void* out, int out_pitch, int out_cols,
                           const DeviceMatrix& w, const DeviceMatrix* up,
                           const DeviceActivations& in, const float* bias, bool accumulate,
                           cudaStream_t stream, Activation activation = Activation::Silu) {
    const int k_extent = gemm_k_extent(w.cols, D);
    const auto launch = [&](auto tiles) {
        using Tiles = decltype(tiles);
        const WarpgroupOperand up_operand =
            up != nullptr ? WarpgroupOperand{up->data, up->rows, up->pitch} : WarpgroupOperand{};
        const WarpgroupMaps maps = warpgroup_maps<D, Tiles>(
            {w.data, w.rows, w.pitch}, up != nullptr ? &up_operand : nullptr,
            {in.data, in.tokens, in.pitch}, k_extent);
        if (up == nullptr)
            launch_gemm_warpgroup_kernel<D, Tiles, false>(out, out_pitch, w.rows, out_cols,
                                                          in.tokens, k_extent, bias, accumulate,
                                                          maps, stream);
        else
            with_activation(activation, [&](auto act) {
                launch_gemm_warpgroup_kernel<D, Tiles, true, decltype(act)::value>(
                    out, out_pitch, w.rows, out_cols, in.tokens, k_extent, nullptr, false, maps,
                    stream);
            });
    };
    const auto run = [&](auto cluster_tokens) {
        constexpr int kClusterTokens = decltype(cluster_tokens)::value;
        if (tile_rows != 0)
            return with_warpgroup_tiles<kClusterTokens, kWarpgroupClusterRows>(tile_rows, launch);
        const int product_rows = up != nullptr ? 2 * w.rows : w.rows;
        const WarpgroupShape shape = choose_warpgroup_shape(
            in.tokens, product_rows, kClusterTokens,
            warpgroup_blocks_at_once<D, kClusterTokens, kWarpgroupClusterRows>(),
            warpgroup_blocks_at_once<D, 1, 1>());
        if (!shape.clustered) return with_warpgroup_tiles<1, 1>(shape.tile_rows, launch);
        with_warpgroup_tiles<kClusterTokens, kWarpgroupClusterRows>(shape.tile_rows, launch);
    };
    const int token_tiles = (in.tokens + kWarpgroupTileTokens - 1) / kWarpgroupTileTokens;
    if (token_tiles % 2 == 0)
        run(std::integral_constant<int, 2>{});
    else
        run(std::integral_constant<int, 1>{});
}

template <DType D>
void launch_gemm_simt(float* out, int out_pitch, const DeviceMatrix& w, const DeviceActivations& in,
                      const float* bias, bool accumulate, cudaStream_t stream) {
    launch_kernel(gemm_simt_kernel<D>, gemm_simt_grid(in.tokens, w.rows), kSimtThreads, 0, stream,
                  out, out_pitch, w.data, w.rows, w.pitch, in.data, in.tokens, in.pitch,
                  gemm_k_extent(w.cols, D), bias, accumulate);
}

constexpr uintptr_t kGemmVectorBytes = 16;  // rows are read as 16-byte vectors

inline uintptr_t address_of(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// The weights and the activations of a product: dtypes, columns, pitches, alignment.
void check_gemm_inputs(const DeviceMatrix& w, const DeviceActivations& in) {
    if (in.dtype != gemm_input_dtype(w.dtype))
        throw Error("gemm: the activations' dtype is not the one these weights take");
    if (in.cols != w.cols) throw Error("gemm: the activations' columns differ from the weights'");
    if (in.pitch % padded_cols(1, in.dtype) != 0 || w.pitch % padded_cols(1, w.dtype) != 0 ||
        in.pitch < in.cols || w.pitch < w.cols)
        throw Error("gemm: a row pitch is not a whole number of vectors (blocks) covering the row");
    const bool quantized = w.dtype == DType::Q8_0 || w.dtype == DType::Q4_0;
    if (quantized && w.scales == nullptr) throw Error("gemm: Q8/Q4 weights without scales");
    if (address_of(in.data) % kGemmVectorBytes != 0 || address_of(w.data) % kGemmVectorBytes != 0)
        throw Error("gemm: the activations and the weights must be 16-byte aligned");
    constexpr int kMaxGridY = 65535;  // row tiles run along the grid's y
    if ((w.rows + SmallBatchTiles::kTileRows - 1) / SmallBatchTiles::kTileRows > kMaxGridY)
        throw Error("gemm: too many weight rows for one grid");
}

// Throws unless the `out_bytes` at `out` lie apart from the activations.
void check_apart_from_input(const void* out, size_t out_bytes, const DeviceActivations& in) {
    const uintptr_t out_begin = address_of(out), out_end = out_begin + out_bytes;
    const uintptr_t in_begin = address_of(in.data), in_end = in_begin + in.bytes();
    if (out_begin < in_end && in_begin < out_end)
        throw Error("gemm: the output overlaps the input");
}

void check_gemm_operands(float* out, int out_pitch, const DeviceMatrix& w,
                         const DeviceActivations& in) {
    check_gemm_inputs(w, in);
    if (out_pitch < w.rows) throw Error("gemm: the output pitch is smaller than the weight rows");
    check_apart_from_input(out, size_t(in.tokens) * out_pitch * sizeof(float), in);
}

}  // namespace

// Where the build has an sm_90a image (the Makefile defines BARELLM_CUDA_SM90A_IMAGE when
// CUDA_ARCHS lists 90a) and the GPU runs it: kWhereItFills, or as BARELLM_CUDA_WGMMA says
// (0, 1 or always); elsewhere kNever.
WarpgroupUse warpgroup_gemm_use() {
    constexpr int kHopper = 90;  // the sm_90a image: H100, H200
#ifdef BARELLM_CUDA_SM90A_IMAGE
    constexpr bool kImageBuilt = true;
#else
    constexpr bool kImageBuilt = false;
#endif
    static const WarpgroupUse use = [] {
        const char* variable = std::getenv("BARELLM_CUDA_WGMMA");
        const std::string setting = variable != nullptr ? variable : "1";
        WarpgroupUse asked = WarpgroupUse::kWhereItFills;
        if (setting == "0")
            asked = WarpgroupUse::kNever;
        else if (setting == "always")
            asked = WarpgroupUse::kAlways;
        else if (setting != "1")
            throw Error("BARELLM_CUDA_WGMMA is '" + setting + "': it takes 0, 1 or always");
        const bool runs = kImageBuilt && current_device().compute_capability == kHopper &&
                          kHopperSharedBytes <= current_device().shared_bytes_per_block;
        return runs ? asked : WarpgroupUse::kNever;
    }();
    return use;
}

bool warpgroup_gemm_enabled() { return warpgroup_gemm_use() != WarpgroupUse::kNever; }

namespace {

// choose_gemm_tiles on this GPU, with or without the warpgroup GEMM.
GemmTiles gemm_tiles_here(DType dtype, int tokens, int rows, WarpgroupUse warpgroup) {
    const DeviceFigures& device = current_device();
    // Block types are multiplied as their f16 copies: they take f16's tiles.
    return choose_gemm_tiles(is_block_type(dtype) ? DType::F16 : dtype, tokens, rows,
                             device.compute_capability, device.multiprocessors,
                             device.shared_bytes_per_block, warpgroup);
}

// Whether `scratch` holds `matrices` Q8/Q4 or block-type matrices of w's shape dequantized
// to f16.
bool scratch_holds(const DequantizeScratch& scratch, const DeviceMatrix& w, int matrices) {
    return scratch.data != nullptr && scratch.bytes >= matrices * dequantized_bytes(w.rows, w.cols);
}

// Whether the scratch lets w reach the warpgroup GEMM: f16 and bf16 weights need none, Q8/Q4
// and block-type weights room for `matrices` of them (gemm_swiglu: w1 and w3) as f16.
bool scratch_admits(const DequantizeScratch& scratch, const DeviceMatrix& w, int matrices) {
    return !(is_quantized(w.dtype) || is_block_type(w.dtype)) ||
           scratch_holds(scratch, w, matrices);
}

// The tiles gemm takes for w: gemm_tiles', but Q8/Q4 weights keep the quantized tiles where
// the scratch does not admit them.
GemmTiles gemm_tiles_for(const DeviceMatrix& w, int tokens, const DequantizeScratch& scratch,
                         int matrices) {
    return gemm_tiles_here(
        w.dtype, tokens, w.rows,
        scratch_admits(scratch, w, matrices) ? warpgroup_gemm_use() : WarpgroupUse::kNever);
}

}  // namespace

GemmTiles gemm_tiles(DType dtype, int tokens, int rows) {
    return gemm_tiles_here(dtype, tokens, rows, warpgroup_gemm_use());
}

void gemm_with_tiles(GemmTiles tiles, float* out, int out_pitch, const DeviceMatrix& w,
                     const DeviceActivations& in, const float* bias, bool accumulate,
                     cudaStream_t stream, const DequantizeScratch& scratch, int warpgroup_rows) {
    check_gemm_operands(out, out_pitch, w, in);
    if (in.tokens == 0 || w.rows == 0) return;
    if (is_block_type(w.dtype)) {  // dequantized to f16 in the scratch, then multiplied as f16
        if (!scratch_holds(scratch, w, 1))
            throw Error("gemm: " + matrix_type_name(w.dtype) +
                        " weights need scratch for their f16 copy");
        const DeviceMatrix f16 = dequantize_to_f16(w, scratch.data, stream);
        return gemm_with_tiles(tiles, out, out_pitch, f16, in, bias, accumulate, stream,
                               /*scratch=*/{}, warpgroup_rows);
    }
    const DeviceFigures& device = current_device();
    if (tiles != GemmTiles::kSimt && !has_tensor_core_product(w.dtype, device.compute_capability))
        throw Error("gemm: this GPU has no tensor-core product for these weights");
    if (tiles == GemmTiles::kLarge &&
        gemm_tensor_core_shared_bytes<LargeTiles>(w.dtype) > device.shared_bytes_per_block)
        throw Error("gemm: the large tiles need more shared memory than this GPU has");
    if (tiles == GemmTiles::kWide && WideTiles::kSharedBytes > device.shared_bytes_per_block)
        throw Error("gemm: the wide tiles need more shared memory than this GPU has");
    if (tiles == GemmTiles::kWarpgroup && !warpgroup_gemm_enabled())
        throw Error("gemm: the warpgroup GEMM runs on sm_90a, unless BARELLM_CUDA_WGMMA=0");
    if (w.dtype == DType::Q8_0 || w.dtype == DType::Q4_0) {
        with_quantized_dtype(w.dtype, [&](auto dtype) {
            constexpr DType W = decltype(dtype)::value;
            switch (tiles) {
                case GemmTiles::kSimt:
                    throw Error("gemm: Q8/Q4 weights run on tensor cores");
                case GemmTiles::kSmallBatch:
                    return launch_gemm_quantized<W, QuantizedSmallBatchTiles>(
                        out, out_pitch, w, in, bias, accumulate, stream);
                case GemmTiles::kMedium:
                    return launch_gemm_quantized<W, MediumTiles>(out, out_pitch, w, in, bias,
                                                                 accumulate, stream);
                case GemmTiles::kLarge:
                    return launch_gemm_quantized<W, LargeTiles>(out, out_pitch, w, in, bias,
                                                                accumulate, stream);
                case GemmTiles::kWide:
                    throw Error("gemm: the wide tiles take f16 and bf16 weights");
                case GemmTiles::kWarpgroup: {
                    if (!scratch_holds(scratch, w, 1))
                        throw Error(
                            "gemm: Q8/Q4 weights on the warpgroup GEMM need scratch "
                            "for their f16 copy");
                    const DeviceMatrix f16 = dequantize_to_f16(w, scratch.data, stream);
                    return launch_gemm_warpgroup<DType::F16>(warpgroup_rows, out, out_pitch,
                                                             f16.rows, f16, nullptr, in, bias,
                                                             accumulate, stream);
                }
            }
        });
        CUDA_CHECK_LAUNCH("gemm kernel");
        return;
    }
    with_weight_dtype(w.dtype, [&](auto dtype) {
        constexpr DType D = decltype(dtype)::value;
        if (tiles == GemmTiles::kSimt) {
            if constexpr (D == DType::F16)
                throw Error("gemm: f16 weights run on tensor cores");
            else
                return launch_gemm_simt<D>(out, out_pitch, w, in, bias, accumulate, stream);
        }
        if constexpr (D == DType::F32) {
            throw Error("gemm: f32 weights run on the SIMT GEMM");
        } else {
            switch (tiles) {
                case GemmTiles::kSmallBatch:
                    return launch_gemm_tensor_core<D, SmallBatchTiles>(out, out_pitch, w, in, bias,
                                                                       accumulate, stream);
                case GemmTiles::kMedium:
                    return launch_gemm_tensor_core<D, MediumTiles>(out, out_pitch, w, in, bias,
                                                                   accumulate, stream);
                case GemmTiles::kLarge:
                    return launch_gemm_tensor_core<D, LargeTiles>(out, out_pitch, w, in, bias,
                                                                  accumulate, stream);
                case GemmTiles::kWide:
                    return launch_gemm_tensor_core<D, WideTiles>(out, out_pitch, w, in, bias,
                                                                 accumulate, stream);
                case GemmTiles::kWarpgroup:
                    return launch_gemm_warpgroup<D>(warpgroup_rows, out, out_pitch, w.rows, w,
                                                    nullptr, in, bias, accumulate, stream);
                case GemmTiles::kSimt:
                    return;  // launched above
            }
        }
    });
    CUDA_CHECK_LAUNCH("gemm kernel");
}

void gemm(float* out, int out_pitch, const DeviceMatrix& w, const DeviceActivations& in,
          const float* bias, bool accumulate, cudaStream_t stream,
          const DequantizeScratch& scratch) {
    gemm_with_tiles(gemm_tiles_for(w, in.tokens, scratch, 1), out, out_pitch, w, in, bias,
                    accumulate, stream, scratch);
}

void gemm_swiglu(const DeviceActivations& out, const DeviceMatrix& w1, const DeviceMatrix& w3,
                 const DeviceActivations& in, float* gate, float* up, int gate_pitch,
                 Activation activation, cudaStream_t stream, const DequantizeScratch& scratch,
                 int warpgroup_rows) {
    if (w1.dtype != w3.dtype || w1.rows != w3.rows || w1.cols != w3.cols)
        throw Error("gemm_swiglu: w1 and w3 differ in dtype or shape");
    if (activation == Activation::SwigluOai)
        throw Error("gemm_swiglu: SwigluOai runs as two GEMMs and swiglu_rows (its limit)");
    if (out.tokens != in.tokens || out.cols != w1.rows)
        throw Error("gemm_swiglu: the output is not tokens x w1's rows");
    // Given rows, the warpgroup GEMM runs wherever it can (tests); else where gemm takes it.
    // Q8/Q4 weights need the scratch to hold both as f16.
    const bool warpgroup =
        warpgroup_rows != 0
            ? warpgroup_gemm_enabled() && w1.dtype != DType::F32 && scratch_admits(scratch, w1, 2)
            : gemm_tiles_for(w1, in.tokens, scratch, 2) == GemmTiles::kWarpgroup;
    const bool fused = warpgroup && out.dtype == gemm_input_dtype(w1.dtype);
    if (!fused) {
        gemm(gate, gate_pitch, w1, in, /*bias=*/nullptr, /*accumulate=*/false, stream, scratch);
        gemm(up, gate_pitch, w3, in, /*bias=*/nullptr, /*accumulate=*/false, stream, scratch);
        swiglu_rows(out, gate, up, gate_pitch, activation, /*limit=*/0.0f, stream);
        return;
    }
    check_gemm_inputs(w1, in);
    check_gemm_inputs(w3, in);
    // The tiles write every column up to the padded pitch, zeros past the weights' rows.
    if (address_of(out.data) % kGemmVectorBytes != 0 ||
        out.pitch != padded_cols(out.cols, out.dtype))
        throw Error("gemm_swiglu: the output rows must be 16-byte aligned and padded as usual");
    check_apart_from_input(out.data, out.bytes(), in);
    if (in.tokens == 0 || w1.rows == 0) return;
    // Q8/Q4 and block-type weights are multiplied as their f16 copies, w3's after w1's in
    // the scratch.
    const bool quantized = is_quantized(w1.dtype) || is_block_type(w1.dtype);
    const DeviceMatrix gate_weights = quantized ? dequantize_to_f16(w1, scratch.data, stream) : w1;
    const DeviceMatrix up_weights =
        quantized ? dequantize_to_f16(
                        w3, static_cast<char*>(scratch.data) + dequantized_bytes(w1.rows, w1.cols),
                        stream)
                  : w3;
    with_weight_dtype(gate_weights.dtype, [&](auto dtype) {
        constexpr DType D = decltype(dtype)::value;
        if constexpr (D == DType::F16 || D == DType::BF16)
            launch_gemm_warpgroup<D>(warpgroup_rows, out.data, out.pitch, out.pitch, gate_weights,
                                     &up_weights, in, nullptr, false, stream, activation);
    });
    CUDA_CHECK_LAUNCH("gemm_swiglu kernel");
}

#endif  // BARELLM_LAUNCH_FUNCTIONS

}  // namespace barellm::cuda
