// An experiment beside the production GEMM (kernels/gemm.cuh): the same product on sm_90a's
// warpgroup tensor-core instruction, wgmma.mma_async, whose operands the tensor cores read
// straight from shared memory (no ldmatrix, no fragments in registers) while the warps
// issue the next copies. dev/gpu/gemm_tiles.cu times it beside the mma.sync tiles.
//
// out[t, r] = sum_c in[t, c] * W[r, c] for f16 `in` [tokens, in_pitch] and W [rows, w_pitch]
// (columns k_extent.. zero or absent), f32 accumulation; no bias, no residual.
//
// - Block: two warpgroups (256 threads), a tile of 128 tokens x kRows weight rows; warpgroup
//   g multiplies tokens 64 g .. 64 g + 63 with all kRows rows, one m64n128k16 instruction per
//   128 rows and 16 columns. kStages K tiles of 64 columns are in flight (cp.async, every
//   thread a share); each K tile is multiplied once it has landed, the copies of the tile
//   kStages - 1 ahead issued first.
// - Shared memory, per stage: the 128 token rows then the kRows weight rows, each 64 columns,
//   in wgmma's canonical K-major layout without swizzling: "core matrices" of 8 rows x 8
//   columns (16 bytes a row, 128 bytes together), the 8 of a group of 8 rows side by side
//   along K (LBO = 128 bytes apart), the groups of rows 1024 bytes apart (SBO). A thread's
//   copy i lands at byte 16 i: consecutive threads fill consecutive bytes.
// - Accumulators (PTX ISA, wgmma m64nNk16 D fragments): warp w of the warpgroup holds rows
//   16 w .. 16 w + 15 of the 64, lane 4 g + t the elements (g, 8 j + 2 t), (g, 8 j + 2 t + 1),
//   (g + 8, 8 j + 2 t), (g + 8, 8 j + 2 t + 1) in d[4 j .. 4 j + 3].
#pragma once
#include <cstdint>

#include "tensor_core.cuh"  // shared_address, copy_async_*

namespace barellm::cuda::wgmma_experiment {

constexpr int kTokens = 128;  // tokens per block (two warpgroups of 64)
constexpr int kThreads = 256;
constexpr int kTileK = 64;         // columns per stage
constexpr int kChunkElements = 8;  // f16 elements per 16-byte copy and core-matrix row
constexpr int kCoreRows = 8;       // rows of a core matrix
constexpr int kCoreBytes = 128;    // a core matrix: 8 rows x 16 bytes
constexpr int kChunksPerRow = kTileK / kChunkElements;      // 8
constexpr int kRowGroupBytes = kChunksPerRow * kCoreBytes;  // 1024: SBO
constexpr int kStepBytes = 2 * kCoreBytes;                  // 16 columns: two core matrices
constexpr int kInstructionRows = 128;                       // n of m64n128k16
constexpr int kWarpgroupTokens = 64;                        // m

template <int kRows, int kStages>
struct WgmmaTiles {
    static constexpr int kStageBytes = (kTokens + kRows) * kTileK * 2;
    static constexpr size_t kSharedBytes = size_t(kStages) * kStageBytes;
    static constexpr int kChunks = (kTokens + kRows) * kChunksPerRow;
    static_assert(kRows % kInstructionRows == 0, "whole n128 instructions");
    static_assert(kChunks % kThreads == 0, "every thread copies the same number of chunks");
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The shared-memory matrix descriptor of a K-major operand without swizzling whose first
// core matrix is at `start` (PTX ISA, "Matrix Descriptor Format"): start address, leading
// (K) and stride (M/N) byte offsets, each in units of 16 bytes.
__device__ __forceinline__ uint64_t descriptor(const void* start) {
    constexpr uint64_t kField = 0x3fff;  // 14 bits
    return (uint64_t(shared_address(start) >> 4) & kField) |
           (uint64_t(kCoreBytes >> 4) & kField) << 16 |
           (uint64_t(kRowGroupBytes >> 4) & kField) << 32;
}

// d (64 x 128 f32, the fragments above) += A (64 x 16, descriptor a) * B (16 x 128, given
// as 128 rows of 16 columns, descriptor b), f16 operands.
__device__ __forceinline__ void mma_64x128x16(float (&d)[64], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n"
        ".reg .pred accumulate;\n"
        "setp.ne.b32 accumulate, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, "
        "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, "
        "%55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, accumulate, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
          "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
          "+f"(d[63])
        : "l"(a), "l"(b), "r"(1));
}

__device__ __forceinline__ void fence_operands(float (&d)[64]) {
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#endif

// out[t, r] = in[t, :] . W[r, :] for the block's tile (see the header).
// Launch: grid (ceil(tokens / 128), ceil(rows / kRows)), block 256, dynamic shared memory
// WgmmaTiles<kRows, kStages>::kSharedBytes.
template <int kRows, int kStages>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_wgmma_kernel(float* __restrict__ out, int out_pitch, const uint16_t* __restrict__ weights,
                      int rows, int w_pitch, const uint16_t* __restrict__ in, int tokens,
                      int in_pitch, int k_extent) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Tiles = WgmmaTiles<kRows, kStages>;
    extern __shared__ __align__(1024) uint8_t shared[];
    const int first_token = blockIdx.x * kTokens, first_row = blockIdx.y * kRows;
    const int warpgroup = threadIdx.x / 128;
    const int k_tiles = (k_extent + kTileK - 1) / kTileK;

    // Chunk i of a stage: row group i / 64, column chunk i / 8 % 8, row i % 8 of the group
    // (byte 16 i); rows 0..127 are tokens, the rest weight rows.
    auto load = [&](int kt) {
        if (kt < k_tiles) {
            uint8_t* stage = shared + kt % kStages * Tiles::kStageBytes;
#pragma unroll
            for (int i = threadIdx.x; i < Tiles::kChunks; i += kThreads) {
                const int tile_row = i / (kChunksPerRow * kCoreRows) * kCoreRows + i % kCoreRows;
                const int column = kt * kTileK + i / kCoreRows % kChunksPerRow * kChunkElements;
                const bool is_token = tile_row < kTokens;
                const int row = is_token ? first_token + tile_row : first_row + tile_row - kTokens;
                const uint16_t* base = is_token ? in : weights;
                const bool valid = row < (is_token ? tokens : rows) && column < k_extent;
                const uint16_t* source =
                    valid ? base + size_t(row) * (is_token ? in_pitch : w_pitch) + column : base;
                copy_async_16(stage + 16 * i, source, valid);
            }
        }
        copy_async_commit();
    };

    float acc[kRows / kInstructionRows][64];
#pragma unroll
    for (int n = 0; n < kRows / kInstructionRows; ++n)
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[n][i] = 0.0f;

#pragma unroll
    for (int kt = 0; kt < kStages - 1; ++kt) load(kt);
    for (int kt = 0; kt < k_tiles; ++kt) {
        copy_async_wait<kStages - 2>();
        // cp.async wrote through the generic proxy; wgmma reads through the async proxy.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        // Tile kt is visible, and every warpgroup has finished tile kt - 1 (its wgmmas were
        // waited for), whose stage the next copies overwrite.
        __syncthreads();
        load(kt + kStages - 1);
        const uint8_t* stage = shared + kt % kStages * Tiles::kStageBytes;
        const uint8_t* tokens_tile =
            stage + warpgroup * (kWarpgroupTokens / kCoreRows) * kRowGroupBytes;
        const uint8_t* rows_tile = stage + kTokens / kCoreRows * kRowGroupBytes;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int step = 0; step < kTileK / 16; ++step)
#pragma unroll
            for (int n = 0; n < kRows / kInstructionRows; ++n)
                mma_64x128x16(
                    acc[n], descriptor(tokens_tile + step * kStepBytes),
                    descriptor(rows_tile + n * (kInstructionRows / kCoreRows) * kRowGroupBytes +
                               step * kStepBytes));
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
        for (int n = 0; n < kRows / kInstructionRows; ++n) fence_operands(acc[n]);
    }
    copy_async_wait<0>();

    const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int n = 0; n < kRows / kInstructionRows; ++n)
#pragma unroll
        for (int j = 0; j < kInstructionRows / 8; ++j)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int token =
                    first_token + warpgroup * kWarpgroupTokens + warp * 16 + g + 8 * half;
                const int row = first_row + n * kInstructionRows + 8 * j + 2 * t;
                if (token >= tokens) continue;
                float* slot = out + size_t(token) * out_pitch + row;
                if (row < rows) slot[0] = acc[n][4 * j + 2 * half];
                if (row + 1 < rows) slot[1] = acc[n][4 * j + 2 * half + 1];
            }
#endif
}

}  // namespace barellm::cuda::wgmma_experiment
