// The prefill GEMM on sm_90a (H100, H200) for f16 and bf16 weights, on the warpgroup
// instructions of wgmma.cuh: out[t, r] (+)= sum_c in[t, c] * W[r, c] (+ bias[r]), the
// operands as in gemm.cuh (rows of K contiguous elements). gemm.cuh's rule runs it as
// GemmTiles::kWarpgroup where it is enabled (warpgroup_gemm_enabled).
//
// Why a second kernel beside the mma.sync one: on an H100 that kernel's large tiles are
// bound by L2's bandwidth at about a quarter of the tensor-core peak (Nsight Compute: L2 at
// 72% of its throughput), because every block reads both of its operand tiles from L2 and
// brings them through registers. Here:
// - Block: three warpgroups (384 threads). Warpgroups 0 and 1 multiply a tile of 128 tokens
//   x kRows weight rows (128, 192, 224 or 256: choose_warpgroup_shape), warpgroup g tokens
//   64 g .. 64 g + 63 with all kRows rows, one m64n{kRows}k16 instruction per 16 columns,
//   straight from shared memory.
//   Warpgroup 2 produces: its first thread issues the copies; it gives up registers
//   (setmaxnreg) so that the multiplying warpgroups can hold their kRows / 2 accumulators.
// - Copies by the Tensor Memory Accelerator, one instruction per operand slice and stage,
//   into kStages buffers of 64 columns (the 128 token rows, then the kRows weight rows, each
//   row 128 bytes in the 128-byte swizzle that the TMA writes and wgmma's descriptors read).
//   Columns and rows past the matrices arrive as zeros.
// - Clusters of kClusterTokens x kClusterRows neighbouring blocks (grid x: token tiles, y:
//   weight-row tiles) share their operands: the blocks of a cluster row (the same weight
//   rows) each copy 1/kClusterTokens of the weight tile into all of that row's blocks, the
//   blocks of a cluster column (the same tokens) 1/kClusterRows of the token tile into all
//   of that column's blocks (TMA multicast). Each tile then leaves L2 once per cluster row or
//   column instead of once per block.
// - Hand-over, per stage s: `full[s]` completes when the block's producer has armed it with
//   the stage's byte count and all of the stage's slices have landed; `empty[s]` completes
//   when every multiplying warp of the blocks its copies land in (its cluster row and
//   column, itself included) has finished the products that read the stage. An arrival for
//   the stage's next use cannot come early: that use needs this block's next copies. A
//   stage's n-th use waits for phase parity n % 2 of `full` (consumers) and, from its second
//   use on, for the previous phase of `empty` (producer).
// - Consumers: at K tile kt they wait for full[kt % kStages], issue the tile's four
//   instructions as one group, wait until at most that group is in flight, and then release
//   tile kt - 1's stage: the tensor cores always have a group queued.
// - A cluster starts only when every block's barriers are initialised, and no block leaves
//   while another may still arrive on its barriers (cluster barriers at both ends; at the
//   end a block arrives after its last product and waits after its stores).
// - Epilogue: each thread adds the bias and the residual to its accumulators and stores them
//   (pairs of neighbouring rows of a token). The gated form (gemm_swiglu) takes the same
//   rows of w1 and w3 into the two halves of each tile and stores silu(gate) * up (SwiGLU)
//   or gelu_tanh(gate) * up (GeGLU) instead, as the next GEMM's f16/bf16 input.
//
// The grid is rounded up to whole clusters: blocks past the tokens or rows multiply zeros
// and store nothing. The unit tests run the kernel, its tensor maps included, on the CPU
// emulation of CUDA (tests/emulation/wgmma_emulation.h); the launch functions are CUDA's.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>

#include "common.cuh"
#include "cuda_check.h"
#include "kernels.h"
#include "prefill.cuh"  // store_activation_pair
#include "wgmma.cuh"

namespace barellm::cuda {

constexpr int kWarpgroupTileTokens = 128;  // tokens per block: two multiplying warpgroups
// The weight rows of a block are one of kWarpgroupRowChoices (kernels.h): the m64nNk16
// shapes of wgmma.cuh.
constexpr int kWarpgroupRowKinds = int(std::size(kWarpgroupRowChoices));
constexpr int kWarpgroupClusterRows = 2;  // row tiles per cluster

// The grid of gemm_warpgroup_kernel for blocks of `tile_rows` weight rows in clusters of
// cluster_tokens x cluster_rows blocks: token tiles along x, row tiles along y, each rounded
// up to whole clusters.
inline dim3 warpgroup_grid(int tokens, int rows, int tile_rows, int cluster_tokens,
                           int cluster_rows) {
    const int token_tiles = (tokens + kWarpgroupTileTokens - 1) / kWarpgroupTileTokens;
    const int row_tiles = (rows + tile_rows - 1) / tile_rows;
    return dim3((token_tiles + cluster_tokens - 1) / cluster_tokens * cluster_tokens,
                (row_tiles + cluster_rows - 1) / cluster_rows * cluster_rows);
}

// The weight rows of the blocks (kWarpgroupRowChoices[i]) for a product of `tokens` x
// `rows` in clusters of cluster_tokens x cluster_rows blocks, where concurrent_blocks[i]
// blocks of choice i run at once (whole clusters on the GPU's SMs, one block an SM): the one
// whose grid takes the least time, a wave of blocks costing its rows (a block's time is
// proportional to them), and that time; ties go to the larger tiles, which read fewer bytes
// per product.
struct WarpgroupRows {
    int tile_rows;
    double time;  // waves x tile rows
};
inline WarpgroupRows fastest_warpgroup_rows(
    int tokens, int rows, int cluster_tokens, int cluster_rows,
    const std::array<int, kWarpgroupRowKinds>& concurrent_blocks) {
    WarpgroupRows best{kWarpgroupRowChoices[0], std::numeric_limits<double>::infinity()};
    for (int i = 0; i < kWarpgroupRowKinds; ++i) {
        const dim3 grid =
            warpgroup_grid(tokens, rows, kWarpgroupRowChoices[i], cluster_tokens, cluster_rows);
        const size_t blocks = size_t(grid.x) * grid.y;
        const size_t at_once = size_t(std::max(concurrent_blocks[i], 1));
        const double time = double((blocks + at_once - 1) / at_once) * kWarpgroupRowChoices[i];
        if (time < best.time) best = {kWarpgroupRowChoices[i], time};
    }
    return best;
}

// The tiles gemm gives a product of `tokens` x `rows`: the fastest rows
// (fastest_warpgroup_rows) in clusters of cluster_tokens x kWarpgroupClusterRows blocks,
// where clustered_blocks[i] of choice i run at once, or in blocks of their own, where
// alone_blocks[i] do, whichever waves take less time (ties: the clusters, which share their
// operand tiles). Clusters of 2 x 2 run only 120 blocks at once on an H200's 132 SMs
// (dev/gpu/gemm_tiles.cu), so a grid of 121-132 blocks (at 512 tokens, wo and w2 in tiles
// of 128 rows) takes one wave alone and two in clusters.
struct WarpgroupShape {
    int tile_rows;
    bool clustered;
};
inline WarpgroupShape choose_warpgroup_shape(
    int tokens, int rows, int cluster_tokens,
    const std::array<int, kWarpgroupRowKinds>& clustered_blocks,
    const std::array<int, kWarpgroupRowKinds>& alone_blocks) {
    const WarpgroupRows clustered = fastest_warpgroup_rows(tokens, rows, cluster_tokens,
                                                           kWarpgroupClusterRows, clustered_blocks);
    const WarpgroupRows alone = fastest_warpgroup_rows(tokens, rows, 1, 1, alone_blocks);
    if (alone.time < clustered.time) return {alone.tile_rows, false};
    return {clustered.tile_rows, true};
}

constexpr int kWarpgroupTokens = 64;  // m of wgmma: tokens per multiplying warpgroup
constexpr int kWarpgroupTileK = 64;   // columns per stage: one 128-byte row of f16/bf16
constexpr int kWarpgroupMmaK = 16;    // k of wgmma
constexpr int kWarpgroupConsumers = kWarpgroupTileTokens / kWarpgroupTokens;
constexpr int kWarpgroupGemmThreads = (kWarpgroupConsumers + 1) * kWarpgroupThreads;  // + producer
constexpr int kWarpgroupConsumerWarps = kWarpgroupConsumers * kWarpgroupThreads / kWarpSize;
constexpr int kProducerRegisters = 40;   // setmaxnreg: the producer only issues copies
constexpr int kConsumerRegisters = 232;  // up to 128 accumulators (kRows 256) and the loop's
constexpr int kRegisterFile = 65536;     // 32-bit registers of an SM
static_assert(kWarpgroupThreads * (kProducerRegisters + kWarpgroupConsumers * kConsumerRegisters) <=
                  kRegisterFile,
              "the register file holds the three warpgroups after setmaxnreg");
static_assert(kWarpgroupTileK * 2 == kSwizzleRowBytes, "a stage's rows are swizzled rows");
constexpr size_t kHopperSharedBytes = 232448;  // opt-in shared memory of an sm_90 block
constexpr int kMaxBoxRows = 256;               // the TMA's largest box dimension

template <int kRows_, int kStages_, int kClusterTokens_, int kClusterRows_>
struct WarpgroupTiles {
    static constexpr int kRows = kRows_;
    static constexpr int kStages = kStages_;
    static constexpr int kClusterTokens = kClusterTokens_;
    static constexpr int kClusterRows = kClusterRows_;
    static constexpr int kClusterBlocks = kClusterTokens * kClusterRows;
    // The blocks a block's copies land in, itself included: its cluster row and column.
    static constexpr int kPeers = kClusterTokens + kClusterRows - 1;

    static constexpr int kTokenBytes = kWarpgroupTileTokens * kSwizzleRowBytes;
    static constexpr int kStageBytes = kTokenBytes + kRows * kSwizzleRowBytes;
    static constexpr int kRowSlice = kRows / kClusterTokens;  // weight rows a block copies
    // The gated form (gemm_warpgroup_kernel): a box of a slice within one half of the tile.
    static constexpr int kGateBox = kRowSlice < kRows / 2 ? kRowSlice : kRows / 2;
    static constexpr int kTokenSlice = kWarpgroupTileTokens / kClusterRows;  // token rows
    static constexpr int kAccumulators = kRows / 2;  // per thread: 64 x kRows / 128 threads
    // The stages, the barriers (full and empty per stage), and room to start the stages on
    // a swizzle atom.
    static constexpr size_t kSharedBytes =
        size_t(kStages) * kStageBytes + 2 * kStages * sizeof(uint64_t) + kSwizzleAtomBytes;

    static_assert(kRows == 128 || kRows == 192 || kRows == 224 || kRows == 256,
                  "one m64n{kRows}k16 per step (wgmma.cuh)");
    static_assert(kClusterBlocks <= 8, "a portable cluster size");
    static_assert(kRows % kClusterTokens == 0 && kWarpgroupTileTokens % kClusterRows == 0,
                  "the slices split the tiles evenly");
    static_assert(kRowSlice <= kMaxBoxRows && kTokenSlice <= kMaxBoxRows, "a slice is one box");
    static_assert(kSharedBytes <= kHopperSharedBytes, "the block fits an sm_90 SM");
    static_assert(kRowSlice * kSwizzleRowBytes % kSwizzleAtomBytes == 0 &&
                      kTokenSlice * kSwizzleRowBytes % kSwizzleAtomBytes == 0,
                  "every slice starts on a swizzle atom");
    static_assert(kStages >= 2, "one stage is filled while another is multiplied");
    static_assert(kRowSlice % kGateBox == 0 && kGateBox * kSwizzleRowBytes % kSwizzleAtomBytes == 0,
                  "the gated form's boxes tile the slice on swizzle atoms");
};

// The stages of a tile of `rows` weight rows: as many as an sm_90 block's shared memory
// holds (7 for 128 rows, 5 for 192 and 224, 4 for 256).
constexpr int warpgroup_stages(int rows) {
    const size_t stage = size_t(kWarpgroupTileTokens + rows) * kSwizzleRowBytes;
    return int((kHopperSharedBytes - kSwizzleAtomBytes) / (stage + 2 * sizeof(uint64_t)));
}

// The tiles gemm runs: `kRows` weight rows, in clusters of kClusterTokens x kClusterRows
// blocks (launch_gemm_warpgroup chooses them).
template <int kRows, int kClusterTokens, int kClusterRows = kWarpgroupClusterRows>
using WarpgroupGemmTiles =
    WarpgroupTiles<kRows, warpgroup_stages(kRows), kClusterTokens, kClusterRows>;

// The epilogues of gemm_warpgroup_kernel. Accumulator 4 j + 2 half + e of a multiplying
// thread holds token 16 warp + g + 8 half of its warpgroup's 64 and row 8 j + 2 t + e of the
// tile (wgmma.cuh; lane = 4 g + t), so rows 2 t and 2 t + 1 go out together.

// out[t, first_row + r] (+)= acc (+ bias) for the tile's rows r, t < tokens, first_row + r <
// rows: two rows as one 8-byte store where the rows of `out` keep them 8-byte aligned
// (first_row and 8 j + 2 t are even).
template <typename Tiles>
__device__ __forceinline__ void store_product_tile(const float (&acc)[Tiles::kAccumulators],
                                                   float* out, int out_pitch, int rows, int tokens,
                                                   int first_token, int first_row,
                                                   const float* bias, bool accumulate) {
    const int warp = threadIdx.x / kWarpSize % 4, lane = threadIdx.x % kWarpSize;
    const int g = lane / 4, t = lane % 4;
    const bool paired =
        out_pitch % 2 == 0 && reinterpret_cast<uintptr_t>(out) % sizeof(float2) == 0;
#pragma unroll
    for (int j = 0; j < Tiles::kRows / 8; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int token = first_token + warp * 16 + g + 8 * half;
            const int first = first_row + 8 * j + 2 * t;
            if (token >= tokens || first >= rows) continue;
            float* slot = out + size_t(token) * out_pitch + first;
            float2 sum = make_float2(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
            if (paired && first + 1 < rows) {
                if (bias != nullptr)
                    sum = make_float2(sum.x + bias[first], sum.y + bias[first + 1]);
                if (accumulate) {
                    const float2 before = *reinterpret_cast<const float2*>(slot);
                    sum = make_float2(before.x + sum.x, before.y + sum.y);
                }
                *reinterpret_cast<float2*>(slot) = sum;
            } else {
                for (int e = 0; e < 2 && first + e < rows; ++e) {
                    float value = e == 0 ? sum.x : sum.y;
                    if (bias != nullptr) value += bias[first + e];
                    slot[e] = accumulate ? slot[e] + value : value;
                }
            }
        }
}

// The gated tile: its first kRows / 2 rows are gates, the rest the up projections of the
// same outputs, so that accumulator group j + kRows / 16 is the up of group j's gates, in
// the same thread. out[t, first_row + r] = act(gate) * up as D (act of A: gated_value), for
// r < kRows / 2, t < tokens, first_row + r < cols (out's pitch, a multiple of 8: the pair
// never straddles it).
template <DType D, typename Tiles, Activation A>
__device__ __forceinline__ void store_swiglu_tile(const float (&acc)[Tiles::kAccumulators],
                                                  void* out, int out_pitch, int cols, int tokens,
                                                  int first_token, int first_row) {
    constexpr int kUp = Tiles::kRows / 16;  // accumulator groups of 8 gate rows
    const int warp = threadIdx.x / kWarpSize % 4, lane = threadIdx.x % kWarpSize;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int j = 0; j < kUp; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int token = first_token + warp * 16 + g + 8 * half;
            const int first = first_row + 8 * j + 2 * t;
            if (token >= tokens || first >= cols) continue;
            const int gate = 4 * j + 2 * half, up = 4 * (j + kUp) + 2 * half;
            store_activation_pair<D>(activation_row<D>(out, out_pitch, token), first,
                                     gated_value<A>(acc[gate], acc[up]),
                                     gated_value<A>(acc[gate + 1], acc[up + 1]));
        }
}

// The block's tile (see the header) of the product out[t, r] = (accumulate ? out[t, r] : 0) +
// in[t, :] . W[r, :] + (bias ? bias[r] : 0) into f32 `out`, t < tokens, r < out_cols (W's
// rows); or with kGated, of out[t, r] = act(in[t, :] . W1[r, :]) * (in[t, :] . W3[r, :])
// (act of kGate: SwiGLU or GeGLU) into activations `out` of D, r < out_cols (out's pitch: the
// padding columns get zeros, as the weights' rows past theirs arrive as zeros), each block taking
// kRows / 2 outputs from kRows / 2 rows of W1 (weights_map) and the same of W3 (up_map).
// - `weights_map` (and `up_map`) have boxes of 64 columns x kRowSlice rows (gated:
//   kGateBox), `in_map` 64 columns x kTokenSlice tokens (warpgroup_tensor_map).
// Launch: launch_gemm_warpgroup_kernel (grid gemm_warpgroup_grid for W's rows, gated twice
// W1's, clusters of kClusterTokens x kClusterRows blocks, block kWarpgroupGemmThreads,
// dynamic shared memory kSharedBytes).
template <DType D, typename Tiles, bool kGated, Activation kGate = Activation::Silu>
__global__ void __launch_bounds__(kWarpgroupGemmThreads, 1)
    gemm_warpgroup_kernel(void* __restrict__ out, int out_pitch, int out_cols, int tokens,
                          int k_extent, const float* __restrict__ bias, bool accumulate,
                          const __grid_constant__ CUtensorMap weights_map,
                          const __grid_constant__ CUtensorMap up_map,
                          const __grid_constant__ CUtensorMap in_map) {
#ifdef BARELLM_WARPGROUP_INSTRUCTIONS
    constexpr bool kShared = Tiles::kClusterBlocks > 1;
    uint8_t* dynamic_shared = reinterpret_cast<uint8_t*>(dynamic_shared_floats());
    uint8_t* shared =
        dynamic_shared + (kSwizzleAtomBytes - shared_address(dynamic_shared) % kSwizzleAtomBytes) %
                             kSwizzleAtomBytes;
    uint64_t* full = reinterpret_cast<uint64_t*>(shared + Tiles::kStages * Tiles::kStageBytes);
    uint64_t* empty = full + Tiles::kStages;
    constexpr int kOutputs = kGated ? Tiles::kRows / 2 : Tiles::kRows;  // output columns a block
    const int first_token = blockIdx.x * kWarpgroupTileTokens, first_row = blockIdx.y * kOutputs;
    const int warpgroup = threadIdx.x / kWarpgroupThreads;
    const int k_tiles = (k_extent + kWarpgroupTileK - 1) / kWarpgroupTileK;

    if (threadIdx.x == 0) {
        for (int s = 0; s < Tiles::kStages; ++s) {
            barrier_init(&full[s], 1);
            barrier_init(&empty[s], kWarpgroupConsumerWarps * Tiles::kPeers);
        }
        fence_barrier_init();
    }
    if constexpr (kShared) {
        cluster_arrive();
        cluster_wait();
    } else {
        __syncthreads();
    }
    // The block's place in its cluster, whose ranks run along x first: it copies weight slice
    // `column` for the blocks of its cluster row and token slice `row` for those of its
    // cluster column.
    const int column = blockIdx.x % Tiles::kClusterTokens;
    const int row = blockIdx.y % Tiles::kClusterRows;

    if (warpgroup == kWarpgroupConsumers) {
        warpgroup_decrease_registers<kProducerRegisters>();
        if (threadIdx.x % kWarpgroupThreads == 0) {
            uint16_t row_blocks = 0, column_blocks = 0;
            for (int i = 0; i < Tiles::kClusterTokens; ++i)
                row_blocks |= 1u << (row * Tiles::kClusterTokens + i);
            for (int i = 0; i < Tiles::kClusterRows; ++i)
                column_blocks |= 1u << (i * Tiles::kClusterTokens + column);
            if (kShared && rank_in_cluster() != uint32_t(row * Tiles::kClusterTokens + column))
                __trap();
            const int token_offset = row * Tiles::kTokenSlice * kSwizzleRowBytes;
            const int slice_token = first_token + row * Tiles::kTokenSlice;
            // Rows `map_row`.. of a weight map into the stage's weight tile at `tile_row`, for
            // the blocks of the cluster row.
            const auto copy_weights = [&](uint8_t* stage, int tile_row, const CUtensorMap* map,
                                          int column0, int map_row, uint64_t* barrier) {
                uint8_t* destination = stage + Tiles::kTokenBytes + tile_row * kSwizzleRowBytes;
                if constexpr (Tiles::kClusterTokens > 1)
                    tensor_copy_to_blocks(destination, map, column0, map_row, barrier, row_blocks);
                else
                    tensor_copy(destination, map, column0, map_row, barrier);
            };
            for (int kt = 0; kt < k_tiles; ++kt) {
                const int s = kt % Tiles::kStages;
                barrier_wait(&empty[s], (kt / Tiles::kStages & 1) ^ 1);
                barrier_arrive_expecting(&full[s], Tiles::kStageBytes);
                uint8_t* stage = shared + s * Tiles::kStageBytes;
                const int column0 = kt * kWarpgroupTileK;
                if constexpr (Tiles::kClusterRows > 1)
                    tensor_copy_to_blocks(stage + token_offset, &in_map, column0, slice_token,
                                          &full[s], column_blocks);
                else
                    tensor_copy(stage + token_offset, &in_map, column0, slice_token, &full[s]);
                const int slice = column * Tiles::kRowSlice;  // the slice's first row in the tile
                if constexpr (kGated) {
                    // The gate half of the tile from W1, the up half from W3, a box at a time.
#pragma unroll
                    for (int box = 0; box < Tiles::kRowSlice / Tiles::kGateBox; ++box) {
                        const int tile_row = slice + box * Tiles::kGateBox;
                        const bool up = tile_row >= Tiles::kRows / 2;
                        copy_weights(stage, tile_row, up ? &up_map : &weights_map, column0,
                                     first_row + tile_row - (up ? Tiles::kRows / 2 : 0), &full[s]);
                    }
                } else {
                    copy_weights(stage, slice, &weights_map, column0, first_row + slice, &full[s]);
                }
            }
        }
        __syncwarp();
        if constexpr (kShared) {
            cluster_arrive();
            cluster_wait();
        }
        return;
    }

    warpgroup_increase_registers<kConsumerRegisters>();
    float acc[Tiles::kAccumulators];
#pragma unroll
    for (int i = 0; i < Tiles::kAccumulators; ++i) acc[i] = 0.0f;
    // Each warp releases a stage with one arrival on `empty` in each block whose copies land
    // in this one: lane p on the p-th of them, the blocks of the cluster row first, then the
    // cluster column's other blocks.
    const int lane = threadIdx.x % kWarpSize;
    const bool signals = lane < Tiles::kPeers;
    int peer = row * Tiles::kClusterTokens + lane;
    if (lane >= Tiles::kClusterTokens) {
        const int other = lane - Tiles::kClusterTokens;  // among the column's other rows
        peer = (other + (other >= row)) * Tiles::kClusterTokens + column;
    }
    constexpr int kStepBytes = kWarpgroupMmaK * int(sizeof(uint16_t));  // 32: within a row
    for (int kt = 0; kt < k_tiles; ++kt) {
        const int s = kt % Tiles::kStages;
        barrier_wait(&full[s], kt / Tiles::kStages & 1);
        const uint8_t* stage = shared + s * Tiles::kStageBytes;
        const uint8_t* token_tile = stage + warpgroup * kWarpgroupTokens * kSwizzleRowBytes;
        const uint8_t* row_tile = stage + Tiles::kTokenBytes;
        warpgroup_fence();
#pragma unroll
        for (int step = 0; step < kWarpgroupTileK / kWarpgroupMmaK; ++step) {
            const uint64_t a = swizzled_descriptor(token_tile + step * kStepBytes);
            const uint64_t b = swizzled_descriptor(row_tile + step * kStepBytes);
            mma_64xNx16<Tiles::kRows, D>(acc, a, b);
        }
        warpgroup_commit();
        warpgroup_wait<1>();  // tile kt - 1's products are done: release its stage
        if (kt > 0 && signals) {
            uint64_t* released = &empty[(kt - 1) % Tiles::kStages];
            if constexpr (kShared)
                barrier_arrive_in_block(released, peer);
            else
                barrier_arrive(released);
        }
    }
    warpgroup_wait<0>();
    fence_accumulators(acc);
    // Every remote arrival is out: the cluster may end once every block is here (no block
    // leaves while another may still arrive on its barriers).
    if constexpr (kShared) cluster_arrive();

    const int warpgroup_token = first_token + warpgroup * kWarpgroupTokens;
    if constexpr (kGated)
        store_swiglu_tile<D, Tiles, kGate>(acc, out, out_pitch, out_cols, tokens, warpgroup_token,
                                           first_row);
    else
        store_product_tile<Tiles>(acc, static_cast<float*>(out), out_pitch, out_cols, tokens,
                                  warpgroup_token, first_row, bias, accumulate);
    if constexpr (kShared) {
        __syncwarp();  // the cluster barrier's .aligned form wants the warp converged
        cluster_wait();
    }
#else
    __trap();  // dispatched only where the sm_90a image runs (warpgroup_gemm_enabled)
#endif
}

// A 2-D tensor map over `rows` rows of `extent` 16-bit `dtype` elements (f16 or bf16),
// `pitch` elements apart, read in boxes of kWarpgroupTileK columns x `box_rows` rows with
// the 128-byte swizzle; elements past the extent or the rows read as zeros.
inline CUtensorMap warpgroup_tensor_map(const void* base, DType dtype, int rows, int extent,
                                        int pitch, int box_rows) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    CUtensorMap map;
    const cuuint64_t extents[2] = {cuuint64_t(extent), cuuint64_t(rows)};
    const cuuint64_t row_stride[1] = {cuuint64_t(pitch) * sizeof(uint16_t)};
    const cuuint32_t box[2] = {cuuint32_t(kWarpgroupTileK), cuuint32_t(box_rows)};
    const cuuint32_t element_strides[2] = {1, 1};
    const CUresult result = encode(
        &map,
        dtype == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        2, const_cast<void*>(base), extents, row_stride, box, element_strides,
        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (result != CUDA_SUCCESS)
        throw Error("gemm: cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(result)) +
                    ")");
    return map;
}

// A 16-bit matrix a tensor map reads: `rows` rows, `pitch` elements apart.
struct WarpgroupOperand {
    const void* data;
    int rows, pitch;
};

// The tensor maps gemm_warpgroup_kernel<D, Tiles, kGated> reads, over k_extent columns: the
// input's in boxes of kTokenSlice tokens, and the weights' in boxes of kRowSlice rows (the
// plain product: `up` is the same map) or, where up is given, W1's and W3's in boxes of
// kGateBox rows.
struct WarpgroupMaps {
    CUtensorMap weights, up, in;
};
template <DType D, typename Tiles>
WarpgroupMaps warpgroup_maps(const WarpgroupOperand& w, const WarpgroupOperand* up,
                             const WarpgroupOperand& in, int k_extent) {
    const auto map = [&](const WarpgroupOperand& m, int box_rows) {
        return warpgroup_tensor_map(m.data, D, m.rows, k_extent, m.pitch, box_rows);
    };
    const CUtensorMap in_map = map(in, Tiles::kTokenSlice);
    if (up == nullptr) {
        const CUtensorMap weights = map(w, Tiles::kRowSlice);
        return {weights, weights, in_map};
    }
    return {map(w, Tiles::kGateBox), map(*up, Tiles::kGateBox), in_map};
}

template <typename Tiles>
inline dim3 gemm_warpgroup_grid(int tokens, int rows) {
    return warpgroup_grid(tokens, rows, Tiles::kRows, Tiles::kClusterTokens, Tiles::kClusterRows);
}

#ifdef BARELLM_LAUNCH_FUNCTIONS

// gemm_warpgroup_kernel<D, Tiles, kGated, kGate>, allowed its shared memory (once).
template <DType D, typename Tiles, bool kGated, Activation kGate = Activation::Silu>
auto prepared_warpgroup_kernel() {
    auto kernel = gemm_warpgroup_kernel<D, Tiles, kGated, kGate>;
    static const bool opted_in = (allow_shared_bytes(kernel, Tiles::kSharedBytes), true);
    (void)opted_in;
    return kernel;
}

// The launch shape of gemm_warpgroup_kernel<D, Tiles> for `grid` (clusters as a launch
// attribute: a kernel attribute would not compile for the GPUs before sm_90, whose images
// trap), `cluster` holding the attribute.
template <typename Tiles>
cudaLaunchConfig_t warpgroup_launch_config(dim3 grid, cudaStream_t stream,
                                           cudaLaunchAttribute& cluster) {
    cluster = {};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = Tiles::kClusterTokens;
    cluster.val.clusterDim.y = Tiles::kClusterRows;
    cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = dim3(kWarpgroupGemmThreads);
    config.dynamicSmemBytes = Tiles::kSharedBytes;
    config.stream = stream;
    config.attrs = &cluster;
    config.numAttrs = 1;
    return config;
}

// How many blocks of gemm_warpgroup_kernel<D, Tiles> the GPU runs at once (the gated form
// takes the same resources): whole clusters, as many as fit its SMs
// (cudaOccupancyMaxActiveClusters: an SM's block takes most of its shared memory, and a
// cluster's blocks must share a GPC).
template <DType D, typename Tiles>
int warpgroup_concurrent_blocks() {
    static const int blocks = [] {
        cudaLaunchAttribute cluster;
        const cudaLaunchConfig_t config = warpgroup_launch_config<Tiles>(
            dim3(Tiles::kClusterTokens, Tiles::kClusterRows), 0, cluster);
        int clusters = 0;
        CUDA_CHECK(cudaOccupancyMaxActiveClusters(
            &clusters, prepared_warpgroup_kernel<D, Tiles, false>(), &config));
        return clusters * Tiles::kClusterBlocks;
    }();
    return blocks;
}

// gemm_warpgroup_kernel<D, Tiles, kGated, kGate> on `stream`, for `rows` weight rows (gated:
// of W1 and of W3 each) and out's `cols` columns (not gated: rows).
template <DType D, typename Tiles, bool kGated, Activation kGate = Activation::Silu>
void launch_gemm_warpgroup_kernel(void* out, int out_pitch, int rows, int cols, int tokens,
                                  int k_extent, const float* bias, bool accumulate,
                                  const WarpgroupMaps& maps, cudaStream_t stream) {
    cudaLaunchAttribute cluster;
    const cudaLaunchConfig_t config = warpgroup_launch_config<Tiles>(
        gemm_warpgroup_grid<Tiles>(tokens, kGated ? 2 * rows : rows), stream, cluster);
    CUDA_CHECK(cudaLaunchKernelEx(&config, prepared_warpgroup_kernel<D, Tiles, kGated, kGate>(),
                                  out, out_pitch, cols, tokens, k_extent, bias, accumulate,
                                  maps.weights, maps.up, maps.in));
}

#endif  // BARELLM_LAUNCH_FUNCTIONS

}  // namespace barellm::cuda
