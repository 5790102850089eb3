// An experiment beside the production GEMMs (kernels/gemm.cuh, kernels/gemm_warpgroup.cuh):
// the product on sm_90a's warpgroup tensor-core instruction, wgmma.mma_async (the wrappers
// of kernels/wgmma.cuh), fed by cp.async copies from every thread instead of the TMA and a
// producer warpgroup. dev/gpu/gemm_tiles.cu times it beside the other kernels.
//
// out[t, r] = sum_c in[t, c] * W[r, c] for f16 `in` [tokens, in_pitch] and W [rows, w_pitch]
// (columns k_extent.. zero or absent), f32 accumulation; no bias, no residual.
//
// - Block: two warpgroups (256 threads), a tile of 128 tokens x kRows weight rows (128 or
//   256); warpgroup g multiplies tokens 64 g .. 64 g + 63 with all kRows rows, one
//   m64n{kRows}k16 instruction per 16 columns.
// - Pipeline: kStages stages of 64 columns, filled by cp.async (every thread a share). At K
//   tile kt, once the tile has landed (and a barrier has made it visible), the copies of
//   tile kt + kStages - 2 go into the stage of tile kt - 2, the tile's four instructions are
//   issued and committed as a group, and the warpgroup waits until at most that group is in
//   flight: the tensor cores multiply tile kt while the warps wait for tile kt + 1, and
//   tile kt - 1's products are complete before the next barrier, after which its stage is
//   overwritten.
// - Shared memory, per stage: the 128 token rows then the kRows weight rows, each 64 columns
//   (128 bytes), in one of wgmma's canonical K-major layouts (kSwizzled):
//   - without swizzling: "core matrices" of 8 rows x 8 columns (16 bytes a row, 128 bytes
//     together), the 8 of a group of 8 rows side by side along K (LBO = 128 bytes apart),
//     the groups of rows 1024 bytes apart (SBO). A thread's copy i lands at byte 16 i:
//     consecutive threads fill consecutive bytes.
//   - 128-byte swizzle: row r at byte 128 r, its 16-byte chunk c at chunk c ^ (r % 8) of the
//     row (the tensor cores undo the XOR from the address bits, so the stages start on 1024
//     bytes); groups of 8 rows 1024 bytes apart (SBO); a K step of 16 columns moves the
//     start 32 bytes. Thread i copies chunk i % 8 of row i / 8: 8 threads fill one row.
// - Accumulators: the wgmma D fragments (kernels/wgmma.cuh).
#pragma once
#include <cstdint>

#include "tensor_core.cuh"  // copy_async_*
#include "wgmma.cuh"        // matrix_descriptor, mma_64x{128,256}x16, warpgroup_*

namespace barellm::cuda::wgmma_experiment {

constexpr int kTokens = 128;  // tokens per block (two warpgroups of 64)
constexpr int kThreads = 256;
constexpr int kTileK = 64;                                  // columns per stage
constexpr int kChunkElements = 8;                           // f16 elements per 16-byte copy
constexpr int kChunkBytes = 16;                             // one cp.async
constexpr int kCoreRows = 8;                                // rows of a core matrix
constexpr int kCoreBytes = 128;                             // a core matrix: 8 rows x 16 bytes
constexpr int kChunksPerRow = kTileK / kChunkElements;      // 8
constexpr int kRowGroupBytes = kChunksPerRow * kCoreBytes;  // 1024: SBO
constexpr int kMmaK = 16;                                   // k of m64nNk16
constexpr int kStepBytes = 2 * kCoreBytes;                  // 16 columns: two core matrices
constexpr int kWarpgroupTokens = 64;                        // m

template <int kRows, int kStages>
struct WgmmaTiles {
    static constexpr int kStageBytes = (kTokens + kRows) * kTileK * 2;
    // The stages, and room to start them on a swizzle atom.
    static constexpr size_t kSharedBytes = size_t(kStages) * kStageBytes + kSwizzleAtomBytes;
    static constexpr int kChunks = (kTokens + kRows) * kChunksPerRow;
    static constexpr int kAccumulators = kRows / 2;  // per thread: 64 x kRows / 128 threads
    static_assert(kRows == 128 || kRows == 256, "one m64n128k16 or m64n256k16 per step");
    static_assert(kChunks % kThreads == 0, "every thread copies the same number of chunks");
    static_assert(kStages >= 3, "two tiles are read while a third is copied");
    static_assert(kStageBytes % kSwizzleAtomBytes == 0, "every stage starts on a swizzle atom");
};

// out[t, r] = in[t, :] . W[r, :] for the block's tile (see the header).
// Launch: grid (ceil(tokens / 128), ceil(rows / kRows)), block 256, dynamic shared memory
// WgmmaTiles<kRows, kStages>::kSharedBytes.
template <int kRows, int kStages, bool kSwizzled>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_wgmma_kernel(float* __restrict__ out, int out_pitch, const uint16_t* __restrict__ weights,
                      int rows, int w_pitch, const uint16_t* __restrict__ in, int tokens,
                      int in_pitch, int k_extent) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Tiles = WgmmaTiles<kRows, kStages>;
    extern __shared__ __align__(1024) uint8_t dynamic_shared[];
    // The stages start on a swizzle atom whatever the dynamic memory's own alignment.
    uint8_t* shared =
        dynamic_shared + (kSwizzleAtomBytes - shared_address(dynamic_shared) % kSwizzleAtomBytes) %
                             kSwizzleAtomBytes;
    const int first_token = blockIdx.x * kTokens, first_row = blockIdx.y * kRows;
    const int warpgroup = threadIdx.x / kWarpgroupThreads;
    const int k_tiles = (k_extent + kTileK - 1) / kTileK;

    // Copy i of a stage: rows 0..127 are tokens, the rest weight rows (see the header).
    // Unswizzled: row group i / 64, column chunk i / 8 % 8, row i % 8 of the group, at byte
    // 16 i. Swizzled: row i / 8, chunk i % 8, at chunk (i % 8) ^ (row % 8) of the row.
    auto load = [&](int kt) {
        if (kt < k_tiles) {
            uint8_t* stage = shared + kt % kStages * Tiles::kStageBytes;
#pragma unroll
            for (int i = threadIdx.x; i < Tiles::kChunks; i += kThreads) {
                const int tile_row =
                    kSwizzled ? i / kChunksPerRow
                              : i / (kChunksPerRow * kCoreRows) * kCoreRows + i % kCoreRows;
                const int chunk = kSwizzled ? i % kChunksPerRow : i / kCoreRows % kChunksPerRow;
                const int column = kt * kTileK + chunk * kChunkElements;
                const int byte = kSwizzled ? tile_row * kSwizzleRowBytes +
                                                 (chunk ^ tile_row % kCoreRows) * kChunkBytes
                                           : kChunkBytes * i;
                const bool is_token = tile_row < kTokens;
                const int row = is_token ? first_token + tile_row : first_row + tile_row - kTokens;
                const uint16_t* base = is_token ? in : weights;
                const bool valid = row < (is_token ? tokens : rows) && column < k_extent;
                const uint16_t* source =
                    valid ? base + size_t(row) * (is_token ? in_pitch : w_pitch) + column : base;
                copy_async_16(stage + byte, source, valid);
            }
        }
        copy_async_commit();
    };

    float acc[Tiles::kAccumulators];
#pragma unroll
    for (int i = 0; i < Tiles::kAccumulators; ++i) {
        acc[i] = 0.0f;
    }

    // One commit group per K tile: tile kt has landed when at most kStages - 3 are pending
    // after the prologue's kStages - 2 and one per earlier iteration.
#pragma unroll
    for (int kt = 0; kt < kStages - 2; ++kt) load(kt);
    for (int kt = 0; kt < k_tiles; ++kt) {
        copy_async_wait<kStages - 3>();
        // cp.async wrote through the generic proxy; wgmma reads through the async proxy.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        // Tile kt is visible, and every warpgroup has waited for its tile kt - 2 products
        // (the wait at the end of iteration kt - 1), whose stage the next copies overwrite.
        __syncthreads();
        load(kt + kStages - 2);
        const uint8_t* stage = shared + kt % kStages * Tiles::kStageBytes;
        const uint8_t* tokens_tile =
            stage + warpgroup * (kWarpgroupTokens / kCoreRows) * kRowGroupBytes;
        const uint8_t* rows_tile = stage + kTokens / kCoreRows * kRowGroupBytes;
        warpgroup_fence();
#pragma unroll
        for (int step = 0; step < kTileK / kMmaK; ++step) {
            // 16 columns on: two core matrices on, or 32 bytes into the swizzled rows.
            const int offset = step * (kSwizzled ? kMmaK * int(sizeof(uint16_t)) : kStepBytes);
            const uint64_t a =
                matrix_descriptor<kSwizzled>(tokens_tile + offset, kCoreBytes, kRowGroupBytes);
            const uint64_t b =
                matrix_descriptor<kSwizzled>(rows_tile + offset, kCoreBytes, kRowGroupBytes);
            if constexpr (kRows == 128)
                mma_64x128x16<DType::F16>(acc, a, b);
            else
                mma_64x256x16<DType::F16>(acc, a, b);
        }
        warpgroup_commit();
        warpgroup_wait<1>();  // tile kt - 1 done
    }
    warpgroup_wait<0>();
    fence_accumulators(acc);
    copy_async_wait<0>();

    const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int j = 0; j < kRows / 8; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int token = first_token + warpgroup * kWarpgroupTokens + warp * 16 + g + 8 * half;
            const int row = first_row + 8 * j + 2 * t;
            if (token >= tokens) continue;
            float* slot = out + size_t(token) * out_pitch + row;
            if (row < rows) slot[0] = acc[4 * j + 2 * half];
            if (row + 1 < rows) slot[1] = acc[4 * j + 2 * half + 1];
        }
#endif
}

}  // namespace barellm::cuda::wgmma_experiment
