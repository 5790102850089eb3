// An experiment beside the production GEMM (kernels/gemm.cuh): the same product on sm_90a's
// warpgroup tensor-core instruction, wgmma.mma_async, whose operands the tensor cores read
// straight from shared memory (no ldmatrix, no fragments in registers) while the warps
// issue the next copies. dev/gpu/gemm_tiles.cu times it beside the mma.sync tiles.
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
// - Accumulators (PTX ISA, wgmma m64nNk16 D fragments): warp w of the warpgroup holds rows
//   16 w .. 16 w + 15 of the 64, lane 4 g + t the elements (g, 8 j + 2 t), (g, 8 j + 2 t + 1),
//   (g + 8, 8 j + 2 t), (g + 8, 8 j + 2 t + 1) in d[4 j .. 4 j + 3].
#pragma once
#include <cstdint>

#include "tensor_core.cuh"  // shared_address, copy_async_*

namespace barellm::cuda::wgmma_experiment {

constexpr int kTokens = 128;  // tokens per block (two warpgroups of 64)
constexpr int kThreads = 256;
constexpr int kWarpgroupThreads = 128;
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

constexpr int kSwizzleBytes = 128;                            // a row of the 128-byte swizzle
constexpr int kSwizzleAtomBytes = kCoreRows * kSwizzleBytes;  // 1024: where the XOR repeats

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

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The shared-memory matrix descriptor of a K-major operand whose first row is at `start`
// (PTX ISA, "Matrix Descriptor Format"): start address, leading (K) and stride (M/N) byte
// offsets in units of 16 bytes, and the swizzle mode (bits 62-63: 0 none, 1 128-byte).
template <bool kSwizzled>
__device__ __forceinline__ uint64_t descriptor(const void* start) {
    constexpr uint64_t kField = 0x3fff;  // 14 bits
    constexpr uint64_t kSwizzle128 = 1;
    constexpr int kSwizzleShift = 62;
    // With the 128-byte swizzle the K offset of a 16-column step lies inside one swizzled
    // row: LBO is not used (1 by convention).
    constexpr uint64_t kLeading = kSwizzled ? 1 : kCoreBytes >> 4;
    return (uint64_t(shared_address(start) >> 4) & kField) | (kLeading & kField) << 16 |
           (uint64_t(kRowGroupBytes >> 4) & kField) << 32 |
           (kSwizzled ? kSwizzle128 << kSwizzleShift : 0);
}

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

// d (64 x 256 f32, the fragments above) += A (64 x 16, descriptor a) * B (16 x 256, given
// as 256 rows of 16 columns, descriptor b), f16 operands; asynchronous (wgmma_commit,
// wgmma_wait).
__device__ __forceinline__ void mma_64x256x16(float (&d)[128], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n"
        ".reg .pred accumulate;\n"
        "setp.ne.b32 accumulate, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, "
        "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, "
        "%55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, "
        "%73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, "
        "%91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, "
        "%107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, "
        "%122, %123, %124, %125, %126, %127}, %128, %129, accumulate, 1, 1, 0, 0;\n"
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
          "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
          "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
          "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
          "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
          "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
          "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
          "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
          "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),
          "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(a), "l"(b), "r"(1));
}

template <int kCount>
__device__ __forceinline__ void fence_operands(float (&d)[kCount]) {
#pragma unroll
    for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#endif

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
                const int byte = kSwizzled ? tile_row * kSwizzleBytes +
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
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int step = 0; step < kTileK / kMmaK; ++step) {
            // 16 columns on: two core matrices on, or 32 bytes into the swizzled rows.
            const int offset = step * (kSwizzled ? kMmaK * int(sizeof(uint16_t)) : kStepBytes);
            const uint64_t a = descriptor<kSwizzled>(tokens_tile + offset);
            const uint64_t b = descriptor<kSwizzled>(rows_tile + offset);
            if constexpr (kRows == 128)
                mma_64x128x16(acc, a, b);
            else
                mma_64x256x16(acc, a, b);
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // tile kt - 1 done
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    fence_operands(acc);
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
