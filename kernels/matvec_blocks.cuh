// Decode matrix-vector products of matrices stored as ggml's blocks (block_units.cuh: how
// their units of 32 weights are loaded, and read as int8 words): matvec.cuh's kernels with
// the unit in place of the 16-byte vector, and int8 products as matvec_quantized.cuh's.
//
// - One warp per row, 16 rows (a row set) a block, the Q8/Q4 matvecs' shape with one row per
//   warp: a block per set, or, where that would be more blocks than the GPU holds at once,
//   one wave of blocks each staging the input once for several sets (launch_block_sets, the
//   Q8/Q4 matvecs' measured rule). Lane l takes units l, l + 32, ... of its row,
//   kBlockMatvecUnroll units' loads in flight before any math. A warp-wide load covers 32
//   consecutive units: 32 small blocks, or 4 super-blocks.
// - The input is staged once per block in shared memory with RMSNorm fused (matvec.cuh:
//   stage_input), then quantized to int8 as the CPU's matvecs of the same type quantize it
//   (stage_block_input): per 32 columns by the Q8 rule (cpu::quantize_q8) for Q4_1, Q5_0,
//   Q5_1, IQ4_NL and MXFP4, per super-block of 256 by the Q8_K rule (cpu::quantize_q8_k) for Q2_K,
//   Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, the i-quants and the ternary types. So the GPU's sums follow
//   the CPU's, as the Q8/Q4 matvecs' do.
// - Each group of 16 weights is four dp4a of its stored values (group_words: the nibbles, or
//   Q2_K's and Q3_K's bit pairs, masked four at a time, the high bits spread into them; IQ4_XS's
//   and IQ4_NL's nibbles looked up as their signed levels; the i-quants' grid points looked up
//   and signed, iq_group_words; TQ1_0's trits by multiplies, tq1_group_words) with the 16 int8
//   inputs it multiplies, one 16-byte shared load; the lane's f32 sum gains
//   x_scale · (scale · (dot − midpoint · Σx) + offset · Σx), Σx the group's sum of int8 inputs
//   (Q6_K's midpoint of 32, Q5_0's of 16, Q3_K's of 4 and the ternary types' of 1 subtracted in
//   integers, Q2_K's, Q4_K's and Q5_K's mins and Q4_1's and Q5_1's m as offsets).
// - Why int8 rather than each weight converted to f32 against the f32 input: an integer to
//   f32 conversion runs at a fraction of the FMA rate, and with one per weight, an FMA and 4
//   bytes of shared input per weight, the SM rather than memory sets the pace. The Q8/Q4
//   matvecs measured their f32 form 1.1-1.5x slower than int8 products on an H100
//   (docs/benchmarks-history.md). Here 16 weights cost four dp4a, a few integer operations
//   and one 16-byte shared load.
// - The int8 input is laid out in two planes (group 0 of every unit, then group 1), unit u's
//   16 values of a plane at 16u: a warp's 16-byte shared loads of one group read 512
//   consecutive bytes (no bank conflicts).
// - The row sums meet in shared memory and are stored with the bias and the residual
//   (store_warp_rows); w1 and w3 are read by one warp with SwiGLU applied before the store.
// Not yet timed on a GPU (cuda_kernel_check --bench times them): what it has to decide is
// whether the 2-byte loads of IQ4_NL, Q5_0, Q3_K, Q6_K and most i-quants (blocks of 18, 22, 110,
// 210 and 50 to 110 bytes) and MXFP4's byte loads (blocks of 17), the per-unit headers and the
// i-quants' grid lookups (4 or 8 a unit, through the L1) keep these kernels at memory speed. The
// i-quants have not run on a GPU at all.
#pragma once
#include <cstdint>

#include "block_units.cuh"
#include "common.cuh"
#include "cuda_check.h"
#include "kernels.h"
#include "matvec.cuh"
#include "matvec_quantized.cuh"  // q8_block_rule, kInt8Largest, kLanesPerBlock

namespace barellm::cuda {

constexpr int kBlockMatvecUnroll = 2;  // units' loads in flight per lane and row

// Shared memory of a block-type matvec over rows of `pitch` columns (a whole number of
// blocks): the f32 staged input [pitch], its int8 copy [pitch] (two planes), each unit's
// input scale and multiplier (float2) [pitch / 32], each group's Σ int8 inputs [pitch / 16].
inline size_t block_staging_bytes(int pitch) {
    const size_t units = size_t(pitch) / kUnitWeights;
    return size_t(pitch) * (sizeof(float) + sizeof(int8_t)) +
           units * (sizeof(float2) + 2 * sizeof(int));
}

// The staged input of a block-type matvec, in shared memory.
struct BlockInput {
    const int8_t* values;   // [2, units, 16]: group g of unit u at g * 16 * units + 16 * u
    const float2* factors;  // [units]: x ≈ scale · value, value = rint(x · multiplier)
    const int* sums;        // [2, units]: Σ values of group g of unit u at g * units + u
    int units;
};

// Each unit's input scale and multiplier (factors) from the staged f32 input xs (plain
// order), by the CPU's rule for type D: Q8 per 32 columns (q8_block_rule; 8 lanes a unit)
// for the small blocks, Q8_K per super-block (cpu::quantize_q8_k: the first value of
// largest magnitude, sign kept, gives −127 / it; a warp a super-block, 8 values a lane) for
// the others. Every thread of the block calls it.
template <DType D>
__device__ __forceinline__ void block_input_factors(const float* xs, float2* factors, int units) {
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int warps = blockDim.x / kWarpSize;
    if constexpr (BlockLayout<D>::kWeights == kUnitWeights) {
        for (int first = warp * kBlocksPerWarpPass; first < units;
             first += warps * kBlocksPerWarpPass) {
            const int unit = first + lane / kLanesPerBlock;  // the same for 8 lanes
            const float4 x = unit < units ? reinterpret_cast<const float4*>(
                                                xs)[unit * kLanesPerBlock + lane % kLanesPerBlock]
                                          : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            const float2 rule = q8_block_rule(x);  // every lane of the 8 calls it
            if (unit < units && lane % kLanesPerBlock == 0) factors[unit] = rule;
        }
    } else {
        constexpr int kUnitsPerSuperBlock = BlockLayout<D>::kWeights / kUnitWeights;
        constexpr int kValuesPerLane = BlockLayout<D>::kWeights / kWarpSize;
        static_assert(kValuesPerLane == 8, "two float4s a lane");
        for (int block = warp; block < units / kUnitsPerSuperBlock; block += warps) {
            const float4* x = reinterpret_cast<const float4*>(xs) + 2 * (block * kWarpSize + lane);
            const float4 a = x[0], b = x[1];
            const float values[kValuesPerLane] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            float largest = 0.0f;  // the lane's first of largest magnitude, then the warp's
            int at = 0;
#pragma unroll
            for (int i = 0; i < kValuesPerLane; ++i)
                if (fabsf(values[i]) > fabsf(largest)) largest = values[i], at = i;
            at += lane * kValuesPerLane;
#pragma unroll
            for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
                const float other = __shfl_xor_sync(kFullMask, largest, offset);
                const int other_at = __shfl_xor_sync(kFullMask, at, offset);
                if (fabsf(other) > fabsf(largest) ||
                    (fabsf(other) == fabsf(largest) && other_at < at))
                    largest = other, at = other_at;
            }
            if (lane < kUnitsPerSuperBlock) {
                const float inverse = -kInt8Largest / largest;
                factors[block * kUnitsPerSuperBlock + lane] =
                    largest == 0.0f ? make_float2(0.0f, 0.0f)
                                    : make_float2(1.0f / inverse, inverse);
            }
        }
    }
}

// Stages in[0, cols) (normed with norm_weight when given, as stage_input) into shared
// memory for a matvec over rows of block type D, quantized to int8 (BlockInput). Every thread
// of the block must call it; it ends with a barrier.
template <DType D>
__device__ __forceinline__ BlockInput stage_block_input(const float* __restrict__ in, int cols,
                                                        const float* __restrict__ norm_weight,
                                                        float eps, float* scratch) {
    const int units = cols / kUnitWeights;
    float* xs = dynamic_shared_floats();
    int8_t* values = reinterpret_cast<int8_t*>(xs + cols);
    float2* factors = reinterpret_cast<float2*>(values + cols);
    int* sums = reinterpret_cast<int*>(factors + units);
    stage_input<4>(xs, in, cols, cols, norm_weight, eps, scratch);
    block_input_factors<D>(xs, factors, units);
    __syncthreads();
    // Each thread quantizes groups of 16 (group g of unit u: i = g * units + u).
    for (int i = threadIdx.x; i < 2 * units; i += blockDim.x) {
        const int g = i / units, unit = i % units;
        const float4* x = reinterpret_cast<const float4*>(xs + group_column<D>(unit, g));
        const float multiplier = factors[unit].y;
        uint32_t words[4];
        int sum = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float4 v = x[j];
            const float parts[4] = {v.x, v.y, v.z, v.w};
            words[j] = 0;
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                // Capped at 127 as cpu::quantize_q8_k caps (the Q8 rule's never pass it).
                const int q = min(int(kInt8Largest), int(rintf(parts[b] * multiplier)));
                sum += q;
                words[j] |= (uint32_t(q) & 0xffu) << (8 * b);
            }
        }
        reinterpret_cast<uint4*>(values)[i] = make_uint4(words[0], words[1], words[2], words[3]);
        sums[i] = sum;
    }
    __syncthreads();
    return {values, factors, sums, units};
}

// The unit's part of a row's dot product with the staged input:
// x_scale · Σ_g (scale_g · (dot_g − midpoint · Σx_g) + offset_g · Σx_g).
template <DType D>
__device__ __forceinline__ float unit_dot(const UnitBytes& raw, int unit, const BlockInput& x) {
    const UnitFactors f = unit_factors<D>(raw, unit);
    float total = 0.0f;
#pragma unroll
    for (int g = 0; g < 2; ++g) {
        uint32_t q[4];
        group_words<D>(raw, unit, g, q);
        const int4 in = reinterpret_cast<const int4*>(x.values)[g * x.units + unit];
        int dot = __dp4a(int(q[0]), in.x, 0);
        dot = __dp4a(int(q[1]), in.y, dot);
        dot = __dp4a(int(q[2]), in.z, dot);
        dot = __dp4a(int(q[3]), in.w, dot);
        const int sum = x.sums[g * x.units + unit];
        total = fmaf(f.scale[g], float(dot - kMidpoint<D> * sum), total);
        if constexpr (kHasOffset<D>) total = fmaf(f.offset[g], float(sum), total);
    }
    return x.factors[unit].x * total;
}

// Dot products of kRows rows of block type D (each 16-byte aligned, `cols` columns) with
// the staged input, for the calling warp; every lane gets the sums. All 32 lanes call it.
template <DType D, int kRows>
__device__ __forceinline__ void dot_block_rows(const uint8_t* const (&rows)[kRows],
                                               const BlockInput& x, float (&sums)[kRows]) {
    const int lane = threadIdx.x % kWarpSize;
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
    for (int first = lane; first < x.units; first += kWarpSize * kBlockMatvecUnroll) {
        UnitBytes raw[kRows][kBlockMatvecUnroll];  // all loads of the round, then the math
#pragma unroll
        for (int u = 0; u < kBlockMatvecUnroll; ++u) {
            const int unit = first + u * kWarpSize;
#pragma unroll
            for (int r = 0; r < kRows; ++r)
                raw[r][u] = unit < x.units ? load_unit<D>(rows[r], unit) : UnitBytes{};
        }
#pragma unroll
        for (int u = 0; u < kBlockMatvecUnroll; ++u) {
            const int unit = first + u * kWarpSize;
            if (unit < x.units) {
#pragma unroll
                for (int r = 0; r < kRows; ++r) acc[r] += unit_dot<D>(raw[r][u], unit, x);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) sums[r] = warp_sum(acc[r]);
}

// The rows of block type D that the calling warp reads in row set `set` (one of each of
// kMatrices matrices; row 0's addresses, never read, for a warp past the last row).
template <DType D, int kMatrices>
struct BlockWarpRows {
    const uint8_t* rows[kMatrices];
    bool has_row;  // the same for the whole warp

    __device__ __forceinline__ BlockWarpRows(const void* const (&matrices)[kMatrices],
                                             int total_rows, int cols, int set) {
        const int row = set * kQuantizedMatvecWarps + threadIdx.x / kWarpSize;
        has_row = row < total_rows;
#pragma unroll
        for (int m = 0; m < kMatrices; ++m)
            rows[m] = block_row<D>(matrices[m], has_row ? row : 0, cols);
    }

    // Asks L2 for the bytes of the rows' first round of units (dot_block_rows: units 0 ..
    // 32 * kBlockMatvecUnroll - 1), without waiting, as the Q8/Q4 matvecs ask for theirs.
    __device__ __forceinline__ void prefetch(int cols) const {
        using Layout = BlockLayout<D>;
        constexpr int kRoundBytes =
            kWarpSize * kBlockMatvecUnroll * Layout::kBytes / (Layout::kWeights / kUnitWeights);
        static_assert(kRoundBytes <= kMatvecUnroll * kWarpSize * 16,
                      "prefetch_first_round reaches the round's bytes");
        if (!has_row) return;
        const uint4* vectors[kMatrices];
#pragma unroll
        for (int m = 0; m < kMatrices; ++m) vectors[m] = reinterpret_cast<const uint4*>(rows[m]);
        const int bytes = min(int(block_row_bytes<D>(cols)), kRoundBytes);
        prefetch_first_round<kMatrices>(vectors, threadIdx.x % kWarpSize, (bytes + 15) / 16);
    }
};

// A block's part of a block-type matvec over kMatrices matrices (w1 and w3 for SwiGLU):
// stages the input (normed with norm_weight when given) once, then for each of its row sets
// of kQuantizedMatvecWarps rows (kOneWave: blockIdx.x, blockIdx.x + gridDim.x, ...; else
// the one set blockIdx.x), one row a warp, computes the calling warp's row sums (zeros for a
// warp past the last row) and hands them to store(set, sums), which every thread of the
// block calls: the Q8/Q4 matvecs' shape with one row per warp (matvec_quantized.cuh). The
// first set's weights are asked for before the staging, each next set's before the current
// set's products.
template <DType D, bool kOneWave, int kMatrices, typename Store>
__device__ __forceinline__ void block_row_sets_of_block(const void* const (&matrices)[kMatrices],
                                                        int rows, const float* __restrict__ in,
                                                        int cols,
                                                        const float* __restrict__ norm_weight,
                                                        float eps, Store&& store) {
    using WarpRows = BlockWarpRows<D, kMatrices>;
    __shared__ float scratch[kWarpSize];
    const int sets = quantized_row_sets(rows, /*rows_per_warp=*/1);
    const int first_set = blockIdx.x, set_step = gridDim.x;
    WarpRows(matrices, rows, cols, first_set).prefetch(cols);
    finish_prologue();  // the input and out: the kernels ahead wrote them

    const BlockInput x = stage_block_input<D>(in, cols, norm_weight, eps, scratch);
    for (int set = first_set; set < sets; set += set_step) {
        const WarpRows warp_rows(matrices, rows, cols, set);
        const bool more = kOneWave && set + set_step < sets;  // the same for the whole block
        if (more) WarpRows(matrices, rows, cols, set + set_step).prefetch(cols);
        float sums[kMatrices] = {};
        if (warp_rows.has_row) dot_block_rows<D, kMatrices>(warp_rows.rows, x, sums);
        store(set, sums);
        if (!more) break;  // without kOneWave: one pass, no loop to keep registers for
        __syncthreads();   // the next set's store reuses store's shared memory
    }
}

// out[r] = (kAccumulate ? out[r] : 0) + (W[r, :] · stage(in) + bias[r]), r in [0, rows), no
// bias term when bias is null; W of block type D [rows, cols].
// Launch: grid quantized_matvec_grid(rows, 1) (kOneWave: with the blocks the GPU holds at
// once), block kQuantizedMatvecThreads (one warp per row), dynamic shared memory
// block_staging_bytes(cols).
template <DType D, bool kOneWave, bool kAccumulate>
__global__ void __launch_bounds__(kMatvecThreadsMax, kOneWave ? kOneWaveBlocksPerMultiprocessor : 0)
    block_matvec_kernel(float* __restrict__ out, const void* __restrict__ weights, int rows,
                        const float* __restrict__ in, int cols,
                        const float* __restrict__ norm_weight, float eps,
                        const float* __restrict__ bias) {
    __shared__ float results[kQuantizedMatvecWarps];
    const void* const matrices[1] = {weights};
    block_row_sets_of_block<D, kOneWave>(
        matrices, rows, in, cols, norm_weight, eps, [&](int set, const float(&sums)[1]) {
            store_warp_rows<kAccumulate, 1>(out, sums, results, bias, rows, set);
        });
}

// out[r] = act(W1[r, :] · stage(in)) * (W3[r, :] · stage(in)), W1 and W3 of block type D,
// act of A (gated_value).
// Launch: as block_matvec_kernel; each warp reads its row of both matrices.
template <DType D, bool kOneWave, Activation A>
__global__ void __launch_bounds__(kMatvecThreadsMax, kOneWave ? kOneWaveBlocksPerMultiprocessor : 0)
    block_matvec_swiglu_kernel(float* __restrict__ out, const void* __restrict__ w1,
                               const void* __restrict__ w3, int rows, const float* __restrict__ in,
                               int cols, const float* __restrict__ norm_weight, float eps) {
    __shared__ float results[kQuantizedMatvecWarps];
    const void* const matrices[2] = {w1, w3};
    block_row_sets_of_block<D, kOneWave>(
        matrices, rows, in, cols, norm_weight, eps, [&](int set, const float(&sums)[2]) {
            const float values[1] = {gated_value<A>(/*gate=*/sums[0], /*up=*/sums[1])};
            store_warp_rows</*kAccumulate=*/false, 1>(out, values, results, /*bias=*/nullptr, rows,
                                                      set);
        });
}

#ifdef BARELLM_LAUNCH_FUNCTIONS

namespace {

template <DType D>
void allow_block_shared_bytes(size_t bytes) {
    for (const bool one_wave : {false, true})
        with_one_wave(one_wave, [&](auto wave) {
            constexpr bool kOneWave = decltype(wave)::value;
            allow_shared_bytes(block_matvec_kernel<D, kOneWave, false>, bytes);
            allow_shared_bytes(block_matvec_kernel<D, kOneWave, true>, bytes);
            allow_shared_bytes(block_matvec_swiglu_kernel<D, kOneWave, Activation::Silu>, bytes);
            allow_shared_bytes(block_matvec_swiglu_kernel<D, kOneWave, Activation::GeluTanh>,
                               bytes);
        });
}

// The grid of `kernel<kOneWave = true>` and `kernel<false>` over `rows` rows, as `grid` says
// (kChosen: one wave where a block per row set would be more blocks than the GPU holds at
// once, as the Q8/Q4 matvecs choose: quantized_takes_one_wave, each block then staging the
// input once for several sets); use(blocks, kernel) launches the one taken.
template <typename OneWaveKernel, typename SetKernel, typename Use>
void launch_block_sets(QuantizedGrid grid, OneWaveKernel one_wave, SetKernel per_set, int rows,
                       size_t shared, Use&& use) {
    const int blocks = blocks_at_once(one_wave, shared);
    if (grid == QuantizedGrid::kChosen)
        grid = quantized_takes_one_wave(rows, /*rows_per_warp=*/1, blocks)
                   ? QuantizedGrid::kOneWave
                   : QuantizedGrid::kBlockPerSet;
    if (grid == QuantizedGrid::kOneWave)
        use(quantized_matvec_grid(rows, 1, blocks), one_wave);
    else
        use(quantized_matvec_grid(rows, 1), per_set);
}

}  // namespace

void launch_block_matvec(float* out, const DeviceMatrix& w, const float* in,
                         const float* norm_weight, float eps, const float* bias, bool accumulate,
                         QuantizedGrid grid, cudaStream_t stream) {
    check_block_matrix(w, "matvec");
    const size_t shared = block_staging_bytes(w.cols);
    with_block_dtype(w.dtype, [&](auto dtype) {
        constexpr DType D = decltype(dtype)::value;
        launch_block_sets(
            grid,
            accumulate ? block_matvec_kernel<D, true, true> : block_matvec_kernel<D, true, false>,
            accumulate ? block_matvec_kernel<D, false, true> : block_matvec_kernel<D, false, false>,
            w.rows, shared, [&](dim3 blocks, auto kernel) {
                launch_after_previous(kernel, blocks, dim3(kQuantizedMatvecThreads), shared, stream,
                                      out, w.data, w.rows, in, w.cols, norm_weight, eps, bias);
            });
    });
    CUDA_CHECK_LAUNCH("block_matvec_kernel");
}

void launch_block_matvec_swiglu(float* out, const DeviceMatrix& w1, const DeviceMatrix& w3,
                                const float* in, const float* norm_weight, float eps,
                                Activation activation, QuantizedGrid grid, cudaStream_t stream) {
    check_block_matrix(w1, "matvec_swiglu");
    check_block_matrix(w3, "matvec_swiglu");
    const size_t shared = block_staging_bytes(w1.cols);
    with_block_dtype(w1.dtype, [&](auto dtype) {
        with_activation(activation, [&](auto act) {
            constexpr DType D = decltype(dtype)::value;
            constexpr Activation A = decltype(act)::value;
            launch_block_sets(grid, block_matvec_swiglu_kernel<D, true, A>,
                              block_matvec_swiglu_kernel<D, false, A>, w1.rows, shared,
                              [&](dim3 blocks, auto kernel) {
                                  launch_after_previous(kernel, blocks,
                                                        dim3(kQuantizedMatvecThreads), shared,
                                                        stream, out, w1.data, w3.data, w1.rows, in,
                                                        w1.cols, norm_weight, eps);
                              });
        });
    });
    CUDA_CHECK_LAUNCH("block_matvec_swiglu_kernel");
}

void prepare_block_matvec(size_t bytes) {
    allow_block_shared_bytes<DType::Q4_1>(bytes);
    allow_block_shared_bytes<DType::Q5_0>(bytes);
    allow_block_shared_bytes<DType::Q5_1>(bytes);
    allow_block_shared_bytes<DType::IQ4_NL>(bytes);
    allow_block_shared_bytes<DType::MXFP4>(bytes);
    allow_block_shared_bytes<DType::Q2_K>(bytes);
    allow_block_shared_bytes<DType::Q3_K>(bytes);
    allow_block_shared_bytes<DType::Q4_K>(bytes);
    allow_block_shared_bytes<DType::Q5_K>(bytes);
    allow_block_shared_bytes<DType::Q6_K>(bytes);
    allow_block_shared_bytes<DType::IQ4_XS>(bytes);
    allow_block_shared_bytes<DType::IQ2_XXS>(bytes);
    allow_block_shared_bytes<DType::IQ2_XS>(bytes);
    allow_block_shared_bytes<DType::IQ2_S>(bytes);
    allow_block_shared_bytes<DType::IQ3_XXS>(bytes);
    allow_block_shared_bytes<DType::IQ3_S>(bytes);
    allow_block_shared_bytes<DType::IQ1_S>(bytes);
    allow_block_shared_bytes<DType::IQ1_M>(bytes);
    allow_block_shared_bytes<DType::TQ1_0>(bytes);
    allow_block_shared_bytes<DType::TQ2_0>(bytes);
}

#endif  // BARELLM_LAUNCH_FUNCTIONS

}  // namespace barellm::cuda
