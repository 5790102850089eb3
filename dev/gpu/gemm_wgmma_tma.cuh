// The wgmma experiment (gemm_wgmma.cuh) with its copies taken off the multiplying warps: the
// tiles come into shared memory by the Tensor Memory Accelerator (cp.async.bulk.tensor, one
// instruction per operand and stage, issued by one thread of a producer warpgroup), and each
// stage is handed between producer and consumers by two mbarriers instead of __syncthreads.
// Optionally neighbouring blocks form a thread-block cluster of kClusterTokens x
// kClusterRows blocks (grid x: token tiles, y: weight-row tiles) and share their operands:
// the blocks of a cluster row (the same weight rows) each copy 1/kClusterTokens of the
// weight tile into all of that row's blocks, and the blocks of a cluster column (the same
// tokens) 1/kClusterRows of the token tile into all of that column's blocks (TMA
// multicast). Each tile then leaves L2 once per cluster row or column instead of once per
// block: L2's bandwidth, not the tensor cores, bounds these tiles on an H100 (a 128 x 256
// tile without sharing needs about 47 bytes per SM and clock at half the tensor-core peak).
// dev/gpu/gemm_tiles.cu times it beside the mma.sync tiles and the cp.async wgmma kernel.
//
// out[t, r] = sum_c in[t, c] * W[r, c] for f16 `in` [tokens, cols] and W [rows, cols], f32
// accumulation; no bias, no residual. sm_90a only.
//
// - Block: three warpgroups (384 threads). Warpgroups 0 and 1 multiply: a tile of 128 tokens
//   x kRows weight rows (128 or 256), warpgroup g tokens 64 g .. 64 g + 63 with all kRows
//   rows, one m64n{kRows}k16 instruction per 16 columns (gemm_wgmma.cuh's wrappers).
//   Warpgroup 2 produces: its first thread issues the copies; it gives up registers
//   (setmaxnreg) so that the multiplying warpgroups can hold their kRows / 2 accumulators.
// - Stages: kStages buffers of 64 columns, the 128 token rows then the kRows weight rows,
//   each row 128 bytes in the 128-byte swizzle that both the TMA (CU_TENSOR_MAP_SWIZZLE_128B)
//   and wgmma's descriptors (gemm_wgmma.cuh: descriptor<true>) use: 16-byte chunk c of row r
//   at chunk c ^ (r % 8), stages on 1024-byte boundaries. Columns or rows past the matrix
//   arrive as zeros (the TMA fills out-of-bounds elements with zeros).
// - Hand-over, per stage s: `full[s]` completes when the block's producer has armed it with
//   the stage's byte count and all of the stage's copies (the slices of token and weight
//   rows from the blocks of its cluster column and row) have landed; `empty[s]` completes
//   when every multiplying warp of every block of the cluster has finished the products
//   that read the stage (the block's copies land in the blocks of its row and column). A
//   stage's n-th use waits for phase parity n % 2 of `full` (consumers) and, from its second
//   use on, for the previous phase of `empty` (producer).
// - Consumers: at K tile kt they wait for full[kt % kStages], issue the tile's four
//   instructions as one group, wait until at most that group is in flight, and then release
//   tile kt - 1's stage: the tensor cores always have a group queued.
// - A cluster starts only when every block's barriers are initialised, and no block leaves
//   while another may still arrive on its barriers (cluster barriers at both ends).
#pragma once
#include <cuda.h>  // CUtensorMap and the cuTensorMapEncodeTiled types (no libcuda link)
#include <cudaTypedefs.h>

#include <cstdint>

#include "cuda_check.h"
#include "gemm_wgmma.cuh"

namespace barellm::cuda::wgmma_tma_experiment {

using wgmma_experiment::kMmaK;
using wgmma_experiment::kSwizzleAtomBytes;
using wgmma_experiment::kSwizzleBytes;
using wgmma_experiment::kTileK;
using wgmma_experiment::kTokens;
using wgmma_experiment::kWarpgroupThreads;
using wgmma_experiment::kWarpgroupTokens;

constexpr int kConsumers = kTokens / kWarpgroupTokens;               // multiplying warpgroups
constexpr int kThreads = (kConsumers + 1) * kWarpgroupThreads;       // and the producer
constexpr int kConsumerWarps = kConsumers * kWarpgroupThreads / 32;  // arrivals on `empty`
constexpr int kProducerRegisters = 40;   // setmaxnreg: the producer issues copies only
constexpr int kConsumerRegisters = 232;  // 128 accumulators (n256) and the loop's own
constexpr int kRegisterFile = 65536;     // 32-bit registers of an SM
static_assert(kWarpgroupThreads * (kProducerRegisters + kConsumers * kConsumerRegisters) <=
                  kRegisterFile,
              "the register file holds the three warpgroups after setmaxnreg");

template <int kRows, int kStages, int kClusterTokens, int kClusterRows>
struct TmaTiles {
    static constexpr int kTokenBytes = kTokens * kSwizzleBytes;  // 64 columns of f16 a row
    static constexpr int kRowBytes = kRows * kSwizzleBytes;
    static constexpr int kStageBytes = kTokenBytes + kRowBytes;
    static constexpr int kBarrierBytes = 2 * kStages * int(sizeof(uint64_t));
    // The stages, the barriers, and room to start the stages on a swizzle atom.
    static constexpr size_t kSharedBytes =
        size_t(kStages) * kStageBytes + kBarrierBytes + kSwizzleAtomBytes;
    static constexpr int kAccumulators = kRows / 2;  // per thread: 64 x kRows / 128 threads
    static constexpr int kClusterBlocks = kClusterTokens * kClusterRows;
    static constexpr int kRowSlice = kRows / kClusterTokens;    // weight rows a block copies
    static constexpr int kTokenSlice = kTokens / kClusterRows;  // token rows a block copies
    static_assert(kRows == 128 || kRows == 256, "one m64n128k16 or m64n256k16 per step");
    static_assert(kClusterBlocks <= 8, "a portable cluster size");
    static_assert(kRowSlice * kSwizzleBytes % kSwizzleAtomBytes == 0 &&
                      kTokenSlice * kSwizzleBytes % kSwizzleAtomBytes == 0,
                  "every slice starts on a swizzle atom");
    static_assert(kTokenBytes % kSwizzleAtomBytes == 0 && kRowBytes % kSwizzleAtomBytes == 0,
                  "every operand tile starts on a swizzle atom");
    static_assert(kStages >= 2, "one stage is filled while another is multiplied");
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ void barrier_init(uint64_t* barrier, int arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(barrier)),
                 "r"(arrivals)
                 : "memory");
}

// One arrival that also announces `bytes` of copies the barrier's phase waits for.
__device__ __forceinline__ void barrier_arrive_expecting(uint64_t* barrier, int bytes) {
    asm volatile(
        "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(barrier)),
        "r"(bytes)
        : "memory");
}

__device__ __forceinline__ void barrier_arrive(uint64_t* barrier) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(barrier))
                 : "memory");
}

// One arrival on the barrier at the same place in block `rank` of the cluster.
__device__ __forceinline__ void barrier_arrive_in_block(uint64_t* barrier, uint32_t rank) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
                 : "=r"(remote)
                 : "r"(shared_address(barrier)), "r"(rank));
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote)
                 : "memory");
}

// The block's rank in its cluster (the bit that names it in a multicast's `blocks`).
__device__ __forceinline__ uint32_t rank_in_cluster() {
    uint32_t rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    return rank;
}

// Every thread of every block of the cluster arrives, then waits for all the others.
__device__ __forceinline__ void cluster_sync() {
    asm volatile(
        "barrier.cluster.arrive.release.aligned;\n"
        "barrier.cluster.wait.acquire.aligned;\n" ::
            : "memory");
}

// Returns once the barrier's phase of parity `parity` has completed (at once for the phase
// before the current one: a fresh barrier has completed "parity 1"). A wait that outlasts
// kPatience tries (seconds, where a stage takes microseconds) is a hand-over bug: it traps,
// so that gemm_tiles fails with an error instead of hanging.
__device__ __forceinline__ void barrier_wait(uint64_t* barrier, uint32_t parity) {
    constexpr uint32_t kPatience = 1u << 24;
    uint32_t done = 0;
    for (uint32_t tries = 0; !done; ++tries) {
        if (tries == kPatience) __trap();
        asm volatile(
            "{\n"
            ".reg .pred complete;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
            "selp.u32 %0, 1, 0, complete;\n"
            "}\n"
            : "=r"(done)
            : "r"(shared_address(barrier)), "r"(parity)
            : "memory");
    }
}

// The box of `map` at (column, row) into shared memory at `destination`, completing
// `barrier`'s transaction count by its bytes.
__device__ __forceinline__ void tensor_copy(void* destination, const CUtensorMap* map, int column,
                                            int row, uint64_t* barrier) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(shared_address(destination)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(column), "r"(row), "r"(shared_address(barrier))
        : "memory");
}

// tensor_copy into the same place of every block of the cluster named in `blocks` (a bit
// per rank), completing the barrier at that place in each of them.
__device__ __forceinline__ void tensor_copy_to_blocks(void* destination, const CUtensorMap* map,
                                                      int column, int row, uint64_t* barrier,
                                                      uint16_t blocks) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(shared_address(destination)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(column), "r"(row), "r"(shared_address(barrier)),
        "h"(blocks)
        : "memory");
}

#endif

// out[t, r] = in[t, :] . W[r, :] for the block's tile (see the header). `weights_map` has
// boxes of 64 columns x kRows / kClusterTokens rows, `in_map` 64 columns x 128 /
// kClusterRows tokens (make_tensor_map). Launch: grid (ceil(tokens / 128), ceil(rows /
// kRows)), each rounded up to a multiple of the cluster's side; clusters of kClusterTokens x
// kClusterRows blocks (the kernel's attribute); block 384; dynamic shared memory
// TmaTiles<...>::kSharedBytes.
template <int kRows, int kStages, int kClusterTokens, int kClusterRows>
__global__ void __cluster_dims__(kClusterTokens, kClusterRows, 1) __launch_bounds__(kThreads, 1)
    gemm_wgmma_tma_kernel(float* __restrict__ out, int out_pitch, int rows, int tokens,
                          int k_extent, const __grid_constant__ CUtensorMap weights_map,
                          const __grid_constant__ CUtensorMap in_map) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Tiles = TmaTiles<kRows, kStages, kClusterTokens, kClusterRows>;
    constexpr bool kShared = Tiles::kClusterBlocks > 1;
    extern __shared__ __align__(1024) uint8_t dynamic_shared[];
    uint8_t* shared =
        dynamic_shared + (kSwizzleAtomBytes - shared_address(dynamic_shared) % kSwizzleAtomBytes) %
                             kSwizzleAtomBytes;
    uint64_t* full = reinterpret_cast<uint64_t*>(shared + kStages * Tiles::kStageBytes);
    uint64_t* empty = full + kStages;
    const int first_token = blockIdx.x * kTokens, first_row = blockIdx.y * kRows;
    const int warpgroup = threadIdx.x / kWarpgroupThreads;
    const int k_tiles = (k_extent + kTileK - 1) / kTileK;

    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; ++s) {
            barrier_init(&full[s], 1);
            barrier_init(&empty[s], kConsumerWarps * Tiles::kClusterBlocks);
        }
        // The initialised barriers visible to the TMA unit (the async proxy) and the cluster.
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if constexpr (kShared)
        cluster_sync();
    else
        __syncthreads();

    if (warpgroup == kConsumers) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
        if (threadIdx.x % kWarpgroupThreads == 0) {
            // The block's place in its cluster, whose ranks run along x first: it copies
            // weight slice `column` for the blocks of its cluster row and token slice `row`
            // for those of its cluster column.
            const int column = blockIdx.x % kClusterTokens, row = blockIdx.y % kClusterRows;
            uint16_t row_blocks = 0, column_blocks = 0;
            for (int i = 0; i < kClusterTokens; ++i) row_blocks |= 1u << (row * kClusterTokens + i);
            for (int i = 0; i < kClusterRows; ++i)
                column_blocks |= 1u << (i * kClusterTokens + column);
            if (kShared && rank_in_cluster() != uint32_t(row * kClusterTokens + column)) __trap();
            const int token_offset = row * Tiles::kTokenSlice * kSwizzleBytes;
            const int row_offset = Tiles::kTokenBytes + column * Tiles::kRowSlice * kSwizzleBytes;
            for (int kt = 0; kt < k_tiles; ++kt) {
                const int s = kt % kStages;
                barrier_wait(&empty[s], (kt / kStages & 1) ^ 1);
                barrier_arrive_expecting(&full[s], Tiles::kStageBytes);
                uint8_t* stage = shared + s * Tiles::kStageBytes;
                const int token = first_token + row * Tiles::kTokenSlice;
                const int weight_row = first_row + column * Tiles::kRowSlice;
                if constexpr (kClusterRows > 1)
                    tensor_copy_to_blocks(stage + token_offset, &in_map, kt * kTileK, token,
                                          &full[s], column_blocks);
                else
                    tensor_copy(stage + token_offset, &in_map, kt * kTileK, token, &full[s]);
                if constexpr (kClusterTokens > 1)
                    tensor_copy_to_blocks(stage + row_offset, &weights_map, kt * kTileK, weight_row,
                                          &full[s], row_blocks);
                else
                    tensor_copy(stage + row_offset, &weights_map, kt * kTileK, weight_row,
                                &full[s]);
            }
        }
        __syncwarp();
        if constexpr (kShared) cluster_sync();
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
    float acc[Tiles::kAccumulators];
#pragma unroll
    for (int i = 0; i < Tiles::kAccumulators; ++i) acc[i] = 0.0f;
    const bool signals = threadIdx.x % 32 == 0;  // one arrival per warp on `empty`
    for (int kt = 0; kt < k_tiles; ++kt) {
        const int s = kt % kStages;
        barrier_wait(&full[s], kt / kStages & 1);
        const uint8_t* stage = shared + s * Tiles::kStageBytes;
        const uint8_t* tokens_tile = stage + warpgroup * kWarpgroupTokens * kSwizzleBytes;
        const uint8_t* rows_tile = stage + Tiles::kTokenBytes;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int step = 0; step < kTileK / kMmaK; ++step) {
            const int offset = step * kMmaK * int(sizeof(uint16_t));  // 32 bytes a step
            const uint64_t a = wgmma_experiment::descriptor<true>(tokens_tile + offset);
            const uint64_t b = wgmma_experiment::descriptor<true>(rows_tile + offset);
            if constexpr (kRows == 128)
                wgmma_experiment::mma_64x128x16(acc, a, b);
            else
                wgmma_experiment::mma_64x256x16(acc, a, b);
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // tile kt - 1 done
        if (kt > 0 && signals) {
            uint64_t* released = &empty[(kt - 1) % kStages];
            if constexpr (kShared) {
#pragma unroll
                for (int block = 0; block < Tiles::kClusterBlocks; ++block)
                    barrier_arrive_in_block(released, block);
            } else {
                barrier_arrive(released);
            }
        }
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    wgmma_experiment::fence_operands(acc);
    if constexpr (kShared) cluster_sync();

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

// A 2-D tensor map over an f16 matrix of `rows` rows of `cols` columns, `pitch` elements
// apart, read in boxes of 64 columns x `box_rows` rows with the 128-byte swizzle. The driver's
// encoder is reached through the runtime (cudaGetDriverEntryPoint), so that nothing links
// libcuda directly.
inline CUtensorMap make_tensor_map(const void* base, int rows, int cols, int pitch, int box_rows) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
        void* function = nullptr;
        cudaDriverEntryPointQueryResult found;
#if CUDART_VERSION >= 12050
        CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                                    cudaEnableDefault, &found));
#else
        CUDA_CHECK(cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &function, cudaEnableDefault,
                                           &found));
#endif
        if (found != cudaDriverEntryPointSuccess || function == nullptr)
            throw Error("the driver has no cuTensorMapEncodeTiled");
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
    }();
    CUtensorMap map;
    const cuuint64_t extent[2] = {cuuint64_t(cols), cuuint64_t(rows)};
    const cuuint64_t row_stride[1] = {cuuint64_t(pitch) * sizeof(uint16_t)};
    const cuuint32_t box[2] = {cuuint32_t(kTileK), cuuint32_t(box_rows)};
    const cuuint32_t element_strides[2] = {1, 1};
    const CUresult result = encode(
        &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<void*>(base), extent, row_stride, box,
        element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (result != CUDA_SUCCESS)
        throw Error("cuTensorMapEncodeTiled failed (" + std::to_string(int(result)) + ")");
    return map;
}

}  // namespace barellm::cuda::wgmma_tma_experiment
