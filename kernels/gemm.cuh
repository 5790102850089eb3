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

#include "common.cuh"
#include "kernels.h"
#include "tensor_core.cuh"
#ifndef BARELLM_CUDA_EMULATION
#include "cuda_check.h"
#endif

namespace barellm::cuda {

// ==== Tensor-core GEMM (f16, bf16)

constexpr int kChunkElements = 8;      // 16-bit elements in a 16-byte chunk (one cp.async)
constexpr int kMmaTokens = 16;         // m of mma.m16n8k16: tokens per fragment
constexpr int kMmaRows = 8;            // n: weight rows per fragment
constexpr int kMmaK = 16;              // k: columns per mma
constexpr int kWarpK = 32;             // columns of each K tile one warp multiplies per stage
constexpr int kEpiloguePadFloats = 8;  // shared f32 row padding: conflict-free float2 writes

// The shape of a tensor-core GEMM block: a tile of kTileTokens x kTileRows outputs, warps
// laid out kWarpsTokens x kWarpsRows over it and kWarpsK deep along K, kStages K tiles in
// flight; registers are capped so that kMinBlocksPerSm blocks fit an SM's register file.
template <int kTileTokens_, int kTileRows_, int kWarpsTokens_, int kWarpsRows_, int kWarpsK_,
          int kStages_, int kMinBlocksPerSm_>
struct TensorCoreTiles {
    static constexpr int kTileTokens = kTileTokens_;
    static constexpr int kTileRows = kTileRows_;
    static constexpr int kWarpsTokens = kWarpsTokens_;
    static constexpr int kWarpsRows = kWarpsRows_;
    static constexpr int kWarpsK = kWarpsK_;
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
};

// Thousands of weight rows, few tokens (1-64: weight-bandwidth-bound, like decode): thin
// tiles so that the grid has many blocks, four warps splitting each 128-column K tile.
// The token tiles of one row tile are neighbours in the grid (blockIdx.x), so their
// weights come from L2 after the first read.
using SmallBatchTiles = TensorCoreTiles<16, 16, 1, 1, 4, 4, 1>;
// Middle sizes, and every size where the large tiles do not fit the GPU's shared memory.
using MediumTiles = TensorCoreTiles<64, 64, 2, 2, 1, 4, 1>;
// Large batches: 128 x 128 tiles, eight warps of 64 tokens x 64 rows, two deep along each
// 64-column K tile. A 64 x 64 warp tile reads 4 KiB of shared memory (8 ldmatrix.x4) per
// 32 mma, a 64 x 32 one 3 KiB per 16: a third less shared-memory traffic per product, the
// resource mma.sync kernels run short of first.
using LargeTiles = TensorCoreTiles<128, 128, 2, 2, 2, 4, 1>;

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

// acc += this warp's part of the stage's product: tokens warp_token0.., rows warp_row0..,
// columns warp_k0 .. warp_k0 + kWarpK of the stage.
template <DType D, typename Tiles>
__device__ __forceinline__ void multiply_gemm_stage(
    float (&acc)[Tiles::kFragmentsTokens][Tiles::kFragmentsRows][4], const uint16_t* stage,
    int warp_token0, int warp_row0, int warp_k0) {
    constexpr int kStride = Tiles::kStageStride;
    const int lane = threadIdx.x % kWarpSize;
    const uint16_t* activations = stage;
    const uint16_t* weights = stage + Tiles::kTileTokens * kStride;
#pragma unroll
    for (int kk = 0; kk < kWarpK; kk += kMmaK) {
        const int k = warp_k0 + kk;
        // A (16 tokens x 16 columns): lanes 0-15 address rows 0-15 at column k, lanes
        // 16-31 the same rows at column k + 8; the four 8x8 matrices are a[0..3].
        uint32_t a[Tiles::kFragmentsTokens][4];
#pragma unroll
        for (int i = 0; i < Tiles::kFragmentsTokens; ++i)
            ldmatrix_x4(a[i], activations + (warp_token0 + i * kMmaTokens + lane % 16) * kStride +
                                  k + lane / 16 * kChunkElements);
        // B for two n8 fragments (16 weight rows x 16 columns): matrix j = lane / 8 is rows
        // (j / 2) * 8.. at column k + (j % 2) * 8, so r[0], r[1] are fragment 2f's b[0], b[1]
        // and r[2], r[3] fragment 2f + 1's.
        uint32_t b[Tiles::kFragmentsRows][2];
#pragma unroll
        for (int f = 0; f < Tiles::kFragmentsRows / 2; ++f) {
            uint32_t r[4];
            ldmatrix_x4(
                r, weights +
                       (warp_row0 + f * 2 * kMmaRows + lane % 8 + lane / 16 * kMmaRows) * kStride +
                       k + lane / 8 % 2 * kChunkElements);
            b[2 * f][0] = r[0];
            b[2 * f][1] = r[1];
            b[2 * f + 1][0] = r[2];
            b[2 * f + 1][1] = r[3];
        }
#pragma unroll
        for (int i = 0; i < Tiles::kFragmentsTokens; ++i)
#pragma unroll
            for (int j = 0; j < Tiles::kFragmentsRows; ++j) mma_16x8x16<D>(acc[i][j], a[i], b[j]);
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
    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    const int warp_rows = warp % Tiles::kWarpsRows;
    const int warp_tokens = warp / Tiles::kWarpsRows % Tiles::kWarpsTokens;
    const int warp_k = warp / (Tiles::kWarpsRows * Tiles::kWarpsTokens);
    const int warp_token0 = warp_tokens * Tiles::kWarpTokens;
    const int warp_row0 = warp_rows * Tiles::kWarpRows;
    const int first_token = blockIdx.x * Tiles::kTileTokens;
    const int first_row = blockIdx.y * Tiles::kTileRows;

    float acc[Tiles::kFragmentsTokens][Tiles::kFragmentsRows][4];
#pragma unroll
    for (int i = 0; i < Tiles::kFragmentsTokens; ++i)
#pragma unroll
        for (int j = 0; j < Tiles::kFragmentsRows; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    // The pipeline: K tile kt lives in stage kt % kStages. Every thread commits one group
    // per K tile (empty past the last), so "K tile kt has landed" is "at most kStages - 2
    // groups pending" at iteration kt.
    const int k_tiles = (k_extent + Tiles::kTileK - 1) / Tiles::kTileK;
    auto load = [&](int kt) {
        if (kt < k_tiles)
            load_gemm_stage<Tiles>(stages + kt % Tiles::kStages * Tiles::kStageElements, in,
                                   in_pitch, first_token, tokens, weights, w_pitch, first_row, rows,
                                   kt * Tiles::kTileK, k_extent);
        copy_async_commit();
    };
#pragma unroll
    for (int kt = 0; kt < Tiles::kStages - 1; ++kt) load(kt);
    for (int kt = 0; kt < k_tiles; ++kt) {
        copy_async_wait<Tiles::kStages - 2>();
        // Makes every thread's copies of tile kt visible, and ends every warp's work on tile
        // kt - 1, whose stage the next load overwrites.
        __syncthreads();
        load(kt + Tiles::kStages - 1);
        multiply_gemm_stage<D, Tiles>(acc, stages + kt % Tiles::kStages * Tiles::kStageElements,
                                      warp_token0, warp_row0, warp_k * kWarpK);
    }
    copy_async_wait<0>();
    __syncthreads();  // the stages are free: the epilogue reuses their memory

    // Epilogue, one row of warps (kWarpTokens tokens) at a time: fragments to shared memory
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

// Whether a GPU of compute_capability (10 * major + minor) multiplies `dtype` on tensor
// cores: f16 from sm_75 (m16n8k8), bf16 from sm_80.
inline bool has_tensor_core_product(DType dtype, int compute_capability) {
    constexpr int kF16Mma = 75, kBf16Mma = 80;
    return (dtype == DType::F16 && compute_capability >= kF16Mma) ||
           (dtype == DType::BF16 && compute_capability >= kBf16Mma);
}

constexpr int kSmallBatchMaxTokens = 64;
// The large tiles need at least this many of their blocks per SM on average (3/4 of a
// wave); fewer leave SMs idle, and the medium tiles' grid fills the GPU better.
constexpr int kLargeMinBlocksPerFourSms = 3;

// The rule gemm follows:
// - f32 weights, and bf16 weights below sm_80: SIMT.
// - Up to kSmallBatchMaxTokens tokens: SmallBatchTiles. The product is bound by reading
//   the weights, like decode: the grid has ceil(rows / 16) row tiles to spread that over
//   the SMs, and the (at most 4) token tiles of a row tile run side by side, so each weight
//   byte comes from memory once and from L2 after that.
// - Otherwise LargeTiles where they fit the GPU's shared memory (sm_80, sm_90) and their
//   grid has at least 3 blocks per 4 SMs (one block fits an SM), else MediumTiles (more,
//   smaller blocks: 64 x 64).
// The columns do not enter: they set the length of each block's K loop, not the grid.
inline GemmTiles choose_gemm_tiles(DType dtype, int tokens, int rows, int compute_capability,
                                   int multiprocessors, size_t shared_bytes_per_block) {
    if (!has_tensor_core_product(dtype, compute_capability)) return GemmTiles::kSimt;
    if (tokens <= kSmallBatchMaxTokens) return GemmTiles::kSmallBatch;
    const dim3 large = gemm_tensor_core_grid<LargeTiles>(tokens, rows);
    const size_t large_blocks = size_t(large.x) * large.y;
    if (LargeTiles::kSharedBytes <= shared_bytes_per_block &&
        4 * large_blocks >= size_t(kLargeMinBlocksPerFourSms) * multiprocessors)
        return GemmTiles::kLarge;
    return GemmTiles::kMedium;
}

#ifndef BARELLM_CUDA_EMULATION

namespace {

// The current GPU's figures the rule needs, queried once.
struct GemmDevice {
    int compute_capability = 0;  // 10 * major + minor
    int multiprocessors = 0;
    size_t shared_bytes_per_block = 0;  // with opt-in (cudaFuncSetAttribute)
};

const GemmDevice& gemm_device() {
    static const GemmDevice device = [] {
        int id = 0, major = 0, minor = 0, multiprocessors = 0, shared = 0;
        CUDA_CHECK(cudaGetDevice(&id));
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, id));
        CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, id));
        CUDA_CHECK(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, id));
        CUDA_CHECK(cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, id));
        return GemmDevice{10 * major + minor, multiprocessors, size_t(shared)};
    }();
    return device;
}

template <DType D, typename Tiles>
void launch_gemm_tensor_core(float* out, int out_pitch, const DeviceMatrix& w,
                             const DeviceActivations& in, const float* bias, bool accumulate,
                             cudaStream_t stream) {
    auto kernel = gemm_tensor_core_kernel<D, Tiles>;
    // Above 48 KiB of dynamic shared memory a kernel must opt in, once.
    static const bool opted_in = [&] {
        CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(Tiles::kSharedBytes)));
        return true;
    }();
    (void)opted_in;
    kernel<<<gemm_tensor_core_grid<Tiles>(in.tokens, w.rows), Tiles::kThreads, Tiles::kSharedBytes,
             stream>>>(out, out_pitch, static_cast<const uint16_t*>(w.data), w.rows, w.pitch,
                       static_cast<const uint16_t*>(in.data), in.tokens, in.pitch,
                       gemm_k_extent(w.cols, D), bias, accumulate);
}

template <DType D>
void launch_gemm_simt(float* out, int out_pitch, const DeviceMatrix& w, const DeviceActivations& in,
                      const float* bias, bool accumulate, cudaStream_t stream) {
    gemm_simt_kernel<D><<<gemm_simt_grid(in.tokens, w.rows), kSimtThreads, 0, stream>>>(
        out, out_pitch, w.data, w.rows, w.pitch, in.data, in.tokens, in.pitch,
        gemm_k_extent(w.cols, D), bias, accumulate);
}

void check_gemm_operands(float* out, int out_pitch, const DeviceMatrix& w,
                         const DeviceActivations& in) {
    if (in.dtype != w.dtype) throw Error("gemm: the activations' dtype differs from the weights'");
    if (in.cols != w.cols) throw Error("gemm: the activations' columns differ from the weights'");
    const int vector = padded_cols(1, w.dtype);
    if (in.pitch % vector != 0 || w.pitch % vector != 0 || in.pitch < in.cols || w.pitch < w.cols)
        throw Error("gemm: a row pitch is not a whole number of 16-byte vectors covering the row");
    if (out_pitch < w.rows) throw Error("gemm: the output pitch is smaller than the weight rows");
    const auto address = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
    constexpr uintptr_t kVectorBytes = 16;  // rows are read as 16-byte vectors
    if (address(in.data) % kVectorBytes != 0 || address(w.data) % kVectorBytes != 0)
        throw Error("gemm: the activations and the weights must be 16-byte aligned");
    constexpr int kMaxGridY = 65535;  // row tiles run along the grid's y
    if ((w.rows + SmallBatchTiles::kTileRows - 1) / SmallBatchTiles::kTileRows > kMaxGridY)
        throw Error("gemm: too many weight rows for one grid");
    const uintptr_t out_begin = address(out);
    const uintptr_t out_end = out_begin + size_t(in.tokens) * out_pitch * sizeof(float);
    const uintptr_t in_begin = address(in.data), in_end = in_begin + in.bytes();
    if (out_begin < in_end && in_begin < out_end)
        throw Error("gemm: the output overlaps the input");
}

}  // namespace

GemmTiles gemm_tiles(DType dtype, int tokens, int rows) {
    const GemmDevice& device = gemm_device();
    return choose_gemm_tiles(dtype, tokens, rows, device.compute_capability, device.multiprocessors,
                             device.shared_bytes_per_block);
}

void gemm_with_tiles(GemmTiles tiles, float* out, int out_pitch, const DeviceMatrix& w,
                     const DeviceActivations& in, const float* bias, bool accumulate,
                     cudaStream_t stream) {
    check_gemm_operands(out, out_pitch, w, in);
    if (in.tokens == 0 || w.rows == 0) return;
    const GemmDevice& device = gemm_device();
    if (tiles != GemmTiles::kSimt && !has_tensor_core_product(w.dtype, device.compute_capability))
        throw Error("gemm: this GPU has no tensor-core product for these weights");
    if (tiles == GemmTiles::kLarge && LargeTiles::kSharedBytes > device.shared_bytes_per_block)
        throw Error("gemm: the large tiles need more shared memory than this GPU has");
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
                case GemmTiles::kSimt:
                    return;  // launched above
            }
        }
    });
    CUDA_CHECK_LAUNCH("gemm kernel");
}

void gemm(float* out, int out_pitch, const DeviceMatrix& w, const DeviceActivations& in,
          const float* bias, bool accumulate, cudaStream_t stream) {
    gemm_with_tiles(gemm_tiles(w.dtype, in.tokens, w.rows), out, out_pitch, w, in, bias, accumulate,
                    stream);
}

#endif  // BARELLM_CUDA_EMULATION

}  // namespace barellm::cuda
