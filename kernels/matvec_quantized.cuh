// Matrix-vector products for decode with Q8 (I8) and Q4 (U8) weights: the kernels of
// matvec.cuh (one warp per row, or two: choose_quantized_rows_per_warp; 16-byte loads with
// kMatvecUnroll in flight per lane and row, the input staged in shared memory with RMSNorm
// fused, the bias and the residual added in the store, w1 and w3 read by one warp with SwiGLU
// or GeGLU applied before the store) for weights stored as integers with one f16 scale per block of
// 32 columns (kernels.h: DeviceMatrix). The weights are dequantized in registers only.
//
// A block stages the input once for 16 warps' rows (a row set); with one wave
// (QuantizedGrid::kOneWave) the grid has only as many blocks as the GPU holds at once, and
// each block stages once for several row sets. At 4096 columns a Q4 row set is 37 KB of
// weights, read after the block has staged 16 KB of input (normed and quantized, two
// barriers); one wave stages once per block instead of once per set. matvec takes it where
// a block per set would be more blocks than the GPU holds at once (choose_quantized_launch).
//
// How the products are computed: int8 dot products (dp4a) against the input quantized to
// int8 per block of 32 columns, as the CPU's Q8/Q4 matvec does (cpu::quantize_q8: scale =
// max |x| / 127 rounded to f16, values rounded to even: llama.cpp's Q8_0 rule), so the GPU's
// results follow the CPU's. Why int8 rather than the weights converted to f32 against the
// f32 input: the kernel must stream weights at memory speed (on an H100 ~14 Q8 or ~28 Q4
// weights per SM per clock), and in f32 every weight costs a convert, an FMA and 4 bytes of
// shared memory, close to the SM's limits; with dp4a one instruction multiplies four weights
// and the int8 input costs 1 byte per weight. The f32 form was measured 1.1-1.5x slower
// (docs/benchmarks-history.md).
//
// - Staging (stage_quantized_input): the f32 input is staged (and normed) as matvec.cuh
//   does, then quantized, each 8 lanes taking a block of 32 columns (a float4 each), into
//   int8 values laid out in the order the weight vectors consume them (quantized_index),
//   with each block's scale and, for Q4, the sum of its values (the offset of 8 of Q4's
//   values is subtracted once per block: Σ (q − 8)·x = Σ q·x − 8·Σ x).
// - Per 16-byte weight vector a lane loads the vector and its block's f16 scale together
//   (all loads of a round before any math), computes the vector's integer dot product, and
//   adds it times the weight scale times the input block's scale to its f32 sum.
#pragma once
#include <algorithm>
#include <type_traits>

#include "common.cuh"
#include "cuda_check.h"
#include "kernels.h"
#include "matvec.cuh"
#include "weights/model.h"

namespace barellm::cuda {

static_assert(kQuantizedBlock == kQ8Group && kQuantizedBlock == kQ4Block,
              "Q8 groups and Q4 blocks are the DeviceMatrix blocks");

constexpr int kQuantizedMatvecWarps = 16;  // rows (warps) per block: rows are short in bytes
static_assert(kQuantizedMatvecWarps <= kMatvecMaxWarps, "the results array holds a row per warp");
constexpr float kInt8Largest = 127.0f;  // the quantized input's scale is max |x| / 127
// Quantizing the staged input: each lane takes a float4 of a block, 8 lanes a block.
constexpr int kLanesPerBlock = kQuantizedBlock / 4;
constexpr int kBlocksPerWarpPass = kWarpSize / kLanesPerBlock;
// The int8 input is read in 16-byte shared loads of 16 values ("planes").
constexpr int kPlaneValues = 16;

// Shared memory of a quantized matvec over rows of `pitch` columns: the f32 staged input
// [pitch], its int8 copy [pitch], the scale [blocks] (f32) and value sum [blocks] (int) of
// each of its blocks. Every part starts 16-byte aligned but the sums (4-byte aligned).
inline size_t quantized_staging_bytes(int pitch) {
    const size_t blocks = size_t(pitch) / kQuantizedBlock;
    return size_t(pitch) * (sizeof(float) + sizeof(int8_t)) +
           blocks * (sizeof(float) + sizeof(int));
}

// The staged input of a quantized matvec, in shared memory.
struct QuantizedInput {
    const int8_t* values;  // [pitch] int8, in quantized_index<kPerVector> order
    const float* scales;   // [blocks]
    const int* sums;       // [blocks] Σ values of each block
};

// Where int8 input value c sits: weight vector v (kPerVector columns) multiplies values that
// are cut into kPerVector / 16 planes of 16, plane k holding columns 16k..16k+15 of every
// vector, those of vector v at 16v, the planes pitch / (kPerVector / 16) bytes apart. So a
// lane's 16-byte shared loads have the 32 lanes reading 512 consecutive bytes (no bank
// conflicts). Q8 (16 columns a vector) is one plane: the plain order. Groups of 4 columns
// (c a multiple of 4) stay together.
template <int kPerVector>
__device__ __forceinline__ int quantized_index(int c, int pitch) {
    static_assert(kPerVector % kPlaneValues == 0, "a vector holds whole planes");
    constexpr int kPlanes = kPerVector / kPlaneValues;
    const int vector = c / kPerVector, within = c % kPerVector;
    return within / kPlaneValues * (pitch / kPlanes) + vector * kPlaneValues +
           within % kPlaneValues;
}

// A block of x's Q8 scale and multiplier (cpu/kernels.h's q8_group_scale, llama.cpp's rule):
// {max |x| / 127 rounded to f16 where f16 has a normal number for it, 127 / max |x|}.
__device__ __forceinline__ float2 q8_group_scale(float largest) {
    constexpr float kHalfSmallestNormal = 6.1035156e-5f;  // 2^-14
    constexpr float kHalfLargest = 65504.0f;
    if (largest == 0.0f) return make_float2(0.0f, 0.0f);
    float scale = largest / kInt8Largest;
    if (scale >= kHalfSmallestNormal && scale <= kHalfLargest)
        scale = __half2float(__float2half_rn(scale));
    return make_float2(scale, kInt8Largest / largest);
}

// The Q8 rule (q8_group_scale) of a block of 32 values, each of its 8 lanes holding a
// float4 of them (x): {scale, multiplier}, the same in all 8 lanes.
__device__ __forceinline__ float2 q8_block_rule(float4 x) {
    return q8_group_scale(group_max<kLanesPerBlock>(
        fmaxf(fmaxf(fabsf(x.x), fabsf(x.y)), fmaxf(fabsf(x.z), fabsf(x.w)))));
}

// Quantizes the staged f32 input xs[pitch] (plain order) per block of 32 as cpu::quantize_q8
// does (cpu/kernels.h, q8_group_scale): scale = max |x| / 127 rounded to f16 (f32 where f16
// has no normal number for it), value = x × (127 / max |x|) rounded to even (0 for zeros).
// Each warp takes kBlocksPerWarpPass blocks at a time, 8 lanes a block. Every thread of the
// block must call it; the caller synchronises before reading the result.
template <int kPerVector>
__device__ __forceinline__ void quantize_staged(const float* xs, int8_t* values, float* scales,
                                                int* sums, int pitch) {
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int warps = blockDim.x / kWarpSize, blocks = pitch / kQuantizedBlock;
    for (int first = warp * kBlocksPerWarpPass; first < blocks;
         first += warps * kBlocksPerWarpPass) {
        const int block = first + lane / kLanesPerBlock;  // the same for 8 lanes
        const bool inside = block < blocks;
        const int c = block * kQuantizedBlock + lane % kLanesPerBlock * 4;
        const float4 x =
            inside ? *reinterpret_cast<const float4*>(xs + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float2 rule = q8_block_rule(x);  // scale, multiplier
        const float scale = rule.x, multiplier = rule.y;
        const int q[4] = {int(rintf(x.x * multiplier)), int(rintf(x.y * multiplier)),
                          int(rintf(x.z * multiplier)), int(rintf(x.w * multiplier))};
        // Exact in f32: |sum| <= 32 * 127.
        const float sum = group_sum<kLanesPerBlock>(float(q[0] + q[1] + q[2] + q[3]));
        if (inside) {
            const uint32_t packed = (uint32_t(q[0]) & 0xffu) | (uint32_t(q[1]) & 0xffu) << 8 |
                                    (uint32_t(q[2]) & 0xffu) << 16 | (uint32_t(q[3]) & 0xffu) << 24;
            *reinterpret_cast<uint32_t*>(values + quantized_index<kPerVector>(c, pitch)) = packed;
            if (lane % kLanesPerBlock == 0) {
                scales[block] = scale;
                sums[block] = int(sum);
            }
        }
    }
}

// Stages in[0, cols) (normed with norm_weight when given, as stage_input) into shared
// memory for a matvec over rows of `pitch` columns of D, quantized to int8. Every thread of
// the block must call it; it ends with a barrier.
template <DType D>
__device__ __forceinline__ QuantizedInput
stage_quantized_input(const float* __restrict__ in, int cols, int pitch,
                      const float* __restrict__ norm_weight, float eps, float* scratch) {
    constexpr int kPerVector = QuantizedFormat<D>::kPerVector;
    float* xs = dynamic_shared_floats();
    int8_t* values = reinterpret_cast<int8_t*>(xs + pitch);
    float* scales = reinterpret_cast<float*>(values + pitch);
    int* sums = reinterpret_cast<int*>(scales + pitch / kQuantizedBlock);
    stage_input<4>(xs, in, cols, pitch, norm_weight, eps, scratch);
    quantize_staged<kPerVector>(xs, values, scales, sums, pitch);
    __syncthreads();
    return {values, scales, sums};
}

// The integer dot product of a weight vector (raw) with the int8 input it multiplies:
// Σ weight · input over the vector's columns, weights as signed integers (Q4: q − 8).
template <DType D>
__device__ __forceinline__ int vector_dot(const uint4& raw, const QuantizedInput& input, int vector,
                                          int pitch);

template <>
__device__ __forceinline__ int vector_dot<DType::Q8_0>(const uint4& raw,
                                                       const QuantizedInput& input, int vector,
                                                       int /*pitch: one plane*/) {
    const int4 x = reinterpret_cast<const int4*>(input.values)[vector];
    int dot = __dp4a(int(raw.x), x.x, 0);
    dot = __dp4a(int(raw.y), x.y, dot);
    dot = __dp4a(int(raw.z), x.z, dot);
    return __dp4a(int(raw.w), x.w, dot);
}

template <>
__device__ __forceinline__ int vector_dot<DType::Q4_0>(const uint4& raw,
                                                       const QuantizedInput& input, int vector,
                                                       int pitch) {
    using Format = QuantizedFormat<DType::Q4_0>;
    // Plane 0: columns 0..15 of the block (the low nibbles), plane 1: 16..31 (the high).
    const int4 low = reinterpret_cast<const int4*>(input.values)[vector];
    const int4 high = reinterpret_cast<const int4*>(input.values + pitch / 2)[vector];
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    const int low_x[4] = {low.x, low.y, low.z, low.w}, high_x[4] = {high.x, high.y, high.z, high.w};
    int dot = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // nibbles 0..15 read as int8: dp4a's signed bytes hold them
        dot = __dp4a(int(words[k] & Format::kLowNibbles), low_x[k], dot);
        dot = __dp4a(int((words[k] >> 4) & Format::kLowNibbles), high_x[k], dot);
    }
    return dot - kQ4Offset * input.sums[vector];  // a Q4 vector is one block
}

template <DType D>
__device__ __forceinline__ const uint4* quantized_row(const void* values, int row, int pitch) {
    return reinterpret_cast<const uint4*>(static_cast<const char*>(values) +
                                          size_t(row) * QuantizedFormat<D>::row_bytes(pitch));
}

// Dot products of kRows quantized weight rows (values and scales) with the staged input, for
// the calling warp; every lane gets the sums. All 32 lanes must call it.
template <DType D, int kRows>
__device__ __forceinline__ void dot_quantized_rows(const uint4* const (&rows)[kRows],
                                                   const uint16_t* const (&row_scales)[kRows],
                                                   const QuantizedInput& input, int pitch,
                                                   float (&sums)[kRows]) {
    constexpr int kPerVector = QuantizedFormat<D>::kPerVector;
    constexpr int kVectorsPerBlock = kQuantizedBlock / kPerVector;  // 2 (Q8) or 1 (Q4)
    const int vectors = pitch / kPerVector;
    const int lane = threadIdx.x % kWarpSize;
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
    for (int first = lane; first < vectors; first += kWarpSize * kMatvecUnroll) {
        // All loads of this round first (kRows * kMatvecUnroll vectors and their scales in
        // flight), then the math.
        uint4 raw[kRows][kMatvecUnroll];
        uint16_t scale_bits[kRows][kMatvecUnroll];
#pragma unroll
        for (int u = 0; u < kMatvecUnroll; ++u) {
            const int v = first + u * kWarpSize;
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                raw[r][u] = v < vectors ? __ldcs(rows[r] + v) : make_uint4(0, 0, 0, 0);
                scale_bits[r][u] = v < vectors ? __ldcs(row_scales[r] + v / kVectorsPerBlock) : 0;
            }
        }
#pragma unroll
        for (int u = 0; u < kMatvecUnroll; ++u) {
            const int v = first + u * kWarpSize;
            if (v < vectors) {
                const int block = v / kVectorsPerBlock;
                const float input_scale = input.scales[block];
#pragma unroll
                for (int r = 0; r < kRows; ++r) {
                    const float dot = float(vector_dot<D>(raw[r][u], input, v, pitch));
                    acc[r] = fmaf(dot, half_bits_to_float(scale_bits[r][u]) * input_scale, acc[r]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) sums[r] = warp_sum(acc[r]);
}

// A row set is the kQuantizedMatvecWarps * kRowsPerWarp consecutive rows a block reads after
// one staging of the input. A block takes row sets blockIdx.x, blockIdx.x + gridDim.x, ...:
// with a block per set, one each; with fewer blocks (quantized_matvec_grid), several, so that
// its staging is shared by more rows.
__host__ __device__ inline int quantized_row_sets(int rows, int rows_per_warp) {
    const int set_rows = kQuantizedMatvecWarps * rows_per_warp;
    return (rows + set_rows - 1) / set_rows;
}

// The rows of the calling warp in row set `set` of kMatrices matrices of the same shape
// (matvec: one; SwiGLU: W1 and W3): kRowsPerWarp rows of each, warp w taking rows
// set * warps * kRowsPerWarp + i * warps + w (i < kRowsPerWarp), the order store_warp_rows
// stores them in; values and scales hold the rows of matrix 0, then those of matrix 1. Rows
// past `rows` point at row 0 (read, never stored); has_rows is false for a warp all of whose
// rows are past the end.
template <DType D, int kRowsPerWarp, int kMatrices>
struct QuantizedWarpRows {
    static constexpr int kRows = kMatrices * kRowsPerWarp;
    const uint4* values[kRows];
    const uint16_t* scales[kRows];
    bool has_rows;

    __device__ __forceinline__ QuantizedWarpRows(const void* const (&matrices)[kMatrices],
                                                 const uint16_t* const (&matrix_scales)[kMatrices],
                                                 int rows, int pitch, int set) {
        const int warps = blockDim.x / kWarpSize, warp = threadIdx.x / kWarpSize;
        const int first = set * warps * kRowsPerWarp + warp;
        has_rows = first < rows;  // the same for the whole warp
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) {
            const int row = first + i * warps;
            const int safe_row = row < rows ? row : 0;
#pragma unroll
            for (int m = 0; m < kMatrices; ++m) {
                values[m * kRowsPerWarp + i] = quantized_row<D>(matrices[m], safe_row, pitch);
                scales[m * kRowsPerWarp + i] =
                    matrix_scales[m] + size_t(safe_row) * (pitch / kQuantizedBlock);
            }
        }
    }

    // Asks L2 for the rows' first round of weights (prefetch_first_round).
    __device__ __forceinline__ void prefetch(int pitch) const {
        if (has_rows)
            prefetch_first_round<kRows>(values, threadIdx.x % kWarpSize,
                                        pitch / QuantizedFormat<D>::kPerVector);
    }
};

// A block's part of a quantized matvec over kMatrices matrices: stages the input (normed with
// norm_weight when given) once, then for each of its row sets (kOneWave: blockIdx.x,
// blockIdx.x + gridDim.x, ...; else the one set blockIdx.x) computes the calling warp's row
// sums (QuantizedWarpRows order; zeros for a warp without rows) and hands them to
// store(set, sums), which every thread of the block calls. The first set's weights are
// asked for before the staging, each next set's before the current set's products.
template <DType D, bool kOneWave, int kRowsPerWarp, int kMatrices, typename Store>
__device__ __forceinline__ void quantized_row_sets_of_block(
    const void* const (&matrices)[kMatrices], const uint16_t* const (&scales)[kMatrices], int rows,
    int pitch, const float* __restrict__ in, int cols, const float* __restrict__ norm_weight,
    float eps, Store&& store) {
    using WarpRows = QuantizedWarpRows<D, kRowsPerWarp, kMatrices>;
    __shared__ float scratch[kWarpSize];
    const int sets = quantized_row_sets(rows, kRowsPerWarp);
    const int first_set = blockIdx.x, set_step = gridDim.x;
    WarpRows(matrices, scales, rows, pitch, first_set).prefetch(pitch);
    finish_prologue();  // the input and out: the kernels ahead wrote them

    const QuantizedInput input =
        stage_quantized_input<D>(in, cols, pitch, norm_weight, eps, scratch);
    // A set's row addresses are computed for its prefetch and again for its products: held
    // in registers through the staging (or the set before), they spill in the one-wave kernels.
    for (int set = first_set; set < sets; set += set_step) {
        const WarpRows warp_rows(matrices, scales, rows, pitch, set);
        const bool more = kOneWave && set + set_step < sets;  // the same for the whole block
        if (more) WarpRows(matrices, scales, rows, pitch, set + set_step).prefetch(pitch);
        float sums[WarpRows::kRows] = {};
        if (warp_rows.has_rows)
            dot_quantized_rows<D, WarpRows::kRows>(warp_rows.values, warp_rows.scales, input, pitch,
                                                   sums);
        store(set, sums);
        if (!more) break;  // without kOneWave: one pass, no loop to keep registers for
        __syncthreads();   // the next set's store reuses store's shared memory
    }
}

// Blocks per SM a one-wave kernel is compiled for (__launch_bounds__: at most 64 registers a
// thread): its loop over row sets costs registers, and one block of 512 threads per SM would
// halve the loads in flight. The block-per-set kernels set no minimum (0).
constexpr int kOneWaveBlocksPerMultiprocessor = 2;

// out[r] = (kAccumulate ? out[r] : 0) + (W[r, :] · stage(in) + bias[r]), r in [0, rows), no
// bias term when bias is null; W quantized (values [rows, row_bytes], scales
// [rows, pitch / 32]). Each warp reads kRowsPerWarp rows of a set at a time: the block's
// staging of the input is shared by 16 * kRowsPerWarp rows per set it takes, and each lane
// has kRowsPerWarp * kMatvecUnroll loads in flight.
// Launch: grid quantized_matvec_grid(rows, kRowsPerWarp) (kOneWave: with the blocks the GPU
// holds at once), block 16 * 32 threads, dynamic shared memory quantized_staging_bytes(pitch).
template <DType D, bool kOneWave, bool kAccumulate, int kRowsPerWarp>
__global__ void __launch_bounds__(kMatvecThreadsMax, kOneWave ? kOneWaveBlocksPerMultiprocessor : 0)
    quantized_matvec_kernel(float* __restrict__ out, const void* __restrict__ values,
                            const uint16_t* __restrict__ scales, int rows, int pitch,
                            const float* __restrict__ in, int cols,
                            const float* __restrict__ norm_weight, float eps,
                            const float* __restrict__ bias) {
    __shared__ float results[kQuantizedMatvecWarps * kRowsPerWarp];
    const void* const matrices[1] = {values};
    const uint16_t* const matrix_scales[1] = {scales};
    quantized_row_sets_of_block<D, kOneWave, kRowsPerWarp>(
        matrices, matrix_scales, rows, pitch, in, cols, norm_weight, eps,
        [&](int set, const float(&sums)[kRowsPerWarp]) {
            store_warp_rows<kAccumulate, kRowsPerWarp>(out, sums, results, bias, rows, set);
        });
}

// out[r] = act(W1[r, :] · stage(in)) * (W3[r, :] · stage(in)), W1 and W3 quantized alike,
// act of A (gated_value).
// Launch: as quantized_matvec_kernel; each warp reads kRowsPerWarp rows of both matrices.
template <DType D, bool kOneWave, int kRowsPerWarp, Activation A>
__global__ void __launch_bounds__(kMatvecThreadsMax, kOneWave ? kOneWaveBlocksPerMultiprocessor : 0)
    quantized_matvec_swiglu_kernel(float* __restrict__ out, const void* __restrict__ w1,
                                   const uint16_t* __restrict__ scales1,
                                   const void* __restrict__ w3,
                                   const uint16_t* __restrict__ scales3, int rows, int pitch,
                                   const float* __restrict__ in, int cols,
                                   const float* __restrict__ norm_weight, float eps) {
    __shared__ float results[kQuantizedMatvecWarps * kRowsPerWarp];
    const void* const matrices[2] = {w1, w3};
    const uint16_t* const matrix_scales[2] = {scales1, scales3};
    quantized_row_sets_of_block<D, kOneWave, kRowsPerWarp>(
        matrices, matrix_scales, rows, pitch, in, cols, norm_weight, eps,
        [&](int set, const float(&sums)[2 * kRowsPerWarp]) {
            float values[kRowsPerWarp];
#pragma unroll
            for (int i = 0; i < kRowsPerWarp; ++i)
                values[i] = gated_value<A>(/*gate=*/sums[i], /*up=*/sums[kRowsPerWarp + i]);
            store_warp_rows</*kAccumulate=*/false, kRowsPerWarp>(out, values, results,
                                                                 /*bias=*/nullptr, rows, set);
        });
}

// ---- Launch shapes (quantized_matvec_kernel and quantized_matvec_swiglu_kernel)

constexpr int kQuantizedMatvecThreads = kQuantizedMatvecWarps * kWarpSize;

// The grid of a quantized matvec: a block per row set, or, given the number of blocks the GPU
// holds at once (blocks_at_once > 0; one wave), no more blocks than that, each taking as many
// sets as the others or one fewer.
inline dim3 quantized_matvec_grid(int rows, int rows_per_warp, int blocks_at_once = 0) {
    const int sets = quantized_row_sets(rows, rows_per_warp);
    if (blocks_at_once <= 0 || sets <= blocks_at_once) return dim3(sets);
    const int sets_per_block = (sets + blocks_at_once - 1) / blocks_at_once;
    return dim3((sets + sets_per_block - 1) / sets_per_block);
}

// The rows per warp the int8 matvec takes for a matrix of `rows` rows on a GPU of
// `multiprocessors` SMs: 2 where its grid still has a block for every SM, else 1. Two rows
// share one staging of the input and keep twice the loads in flight, which pays only while
// every SM still has a block; SwiGLU, already reading a row of each of two matrices, takes 1
// (the measurements: docs/BENCHMARKS.md).
constexpr int kQuantizedRowsPerWarp[] = {2, 1};
inline int choose_quantized_rows_per_warp(int rows, int multiprocessors) {
    for (const int rows_per_warp : kQuantizedRowsPerWarp)
        if (int(quantized_matvec_grid(rows, rows_per_warp).x) >= multiprocessors)
            return rows_per_warp;
    return 1;
}

// The grid matvec takes for a matrix of `rows` rows at `rows_per_warp` where the GPU holds
// `blocks_at_once` blocks of the one-wave kernel at once: one wave where a block per row
// set would be more blocks than that, else a block per set: one wave saves stagings where
// the sets outnumber the blocks, and costs its loop where they do not (the measurements:
// docs/BENCHMARKS.md).
inline bool quantized_takes_one_wave(int rows, int rows_per_warp, int blocks_at_once) {
    return quantized_row_sets(rows, rows_per_warp) > blocks_at_once;
}

// Calls use(std::integral_constant<int, R>) for rows_per_warp R (1 or 2).
template <typename Use>
void with_rows_per_warp(int rows_per_warp, Use&& use) {
    switch (rows_per_warp) {
        case 1:
            return use(std::integral_constant<int, 1>{});
        case 2:
            return use(std::integral_constant<int, 2>{});
        default:
            throw Error("quantized matvec: rows per warp must be 1 or 2");
    }
}

#ifdef BARELLM_LAUNCH_FUNCTIONS

namespace {

void check_quantized_matrix(const DeviceMatrix& w, const char* what) {
    if (!is_quantized(w.dtype) || w.scales == nullptr || w.pitch % kQuantizedBlock != 0 ||
        w.pitch < w.cols)
        throw Error(std::string(what) + ": not a Q8/Q4 device matrix with scales and whole blocks");
}

// The blocks of `kernel` the GPU holds at once with `shared` bytes of shared memory each.
template <typename Kernel>
int blocks_at_once(Kernel kernel, size_t shared) {
    int blocks_per_multiprocessor = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_multiprocessor, kernel,
                                                             kQuantizedMatvecThreads, shared));
    return std::max(1, blocks_per_multiprocessor) * current_device().multiprocessors;
}

// The one-wave grid of `kernel` over `rows` rows: no more blocks than the GPU holds of it at
// once (quantized_matvec_grid).
template <typename Kernel>
dim3 one_wave_grid(Kernel kernel, int rows, int rows_per_warp, size_t shared) {
    return quantized_matvec_grid(rows, rows_per_warp, blocks_at_once(kernel, shared));
}

// quantized_takes_one_wave for the int8 kernel over w's rows (swiglu: the SwiGLU kernel,
// whose occupancy stands for the GeGLU one's too: they differ in the activation only) on this
// GPU.
template <DType D, int kRowsPerWarp>
bool takes_one_wave_here(const DeviceMatrix& w, bool swiglu) {
    const size_t shared = quantized_staging_bytes(w.pitch);
    const int blocks =
        swiglu
            ? blocks_at_once(
                  quantized_matvec_swiglu_kernel<D, true, kRowsPerWarp, Activation::Silu>, shared)
            : blocks_at_once(quantized_matvec_kernel<D, true, false, kRowsPerWarp>, shared);
    return quantized_takes_one_wave(w.rows, kRowsPerWarp, blocks);
}

// matvec's choice of launch for the Q8/Q4 matrix w (swiglu: matvec_swiglu's, w being w1),
// filling in what `launch` leaves to it: rows per warp by choose_quantized_rows_per_warp
// (SwiGLU one), the grid by quantized_takes_one_wave.
QuantizedLaunch choose_quantized_launch(QuantizedLaunch launch, const DeviceMatrix& w,
                                        bool swiglu) {
    if (launch.rows_per_warp == 0)
        launch.rows_per_warp =
            swiglu ? 1 : choose_quantized_rows_per_warp(w.rows, current_device().multiprocessors);
    if (launch.grid == QuantizedGrid::kChosen) {
        bool one_wave = false;
        with_quantized_dtype(w.dtype, [&](auto dtype) {
            with_rows_per_warp(launch.rows_per_warp, [&](auto r) {
                one_wave =
                    takes_one_wave_here<decltype(dtype)::value, decltype(r)::value>(w, swiglu);
            });
        });
        launch.grid = one_wave ? QuantizedGrid::kOneWave : QuantizedGrid::kBlockPerSet;
    }
    return launch;
}

template <DType D, bool kOneWave, int kRowsPerWarp>
void launch_quantized_matvec_typed(float* out, const DeviceMatrix& w, const float* in,
                                   const float* norm_weight, float eps, const float* bias,
                                   bool accumulate, cudaStream_t stream) {
    const size_t shared = quantized_staging_bytes(w.pitch);
    const auto kernel = accumulate ? quantized_matvec_kernel<D, kOneWave, true, kRowsPerWarp>
                                   : quantized_matvec_kernel<D, kOneWave, false, kRowsPerWarp>;
    const dim3 grid = kOneWave ? one_wave_grid(kernel, w.rows, kRowsPerWarp, shared)
                               : quantized_matvec_grid(w.rows, kRowsPerWarp);
    launch_after_previous(kernel, grid, dim3(kQuantizedMatvecThreads), shared, stream, out, w.data,
                          w.scales, w.rows, w.pitch, in, w.cols, norm_weight, eps, bias);
}

template <DType D, bool kOneWave, int kRowsPerWarp, Activation A>
void launch_quantized_matvec_swiglu_typed(float* out, const DeviceMatrix& w1,
                                          const DeviceMatrix& w3, const float* in,
                                          const float* norm_weight, float eps,
                                          cudaStream_t stream) {
    const size_t shared = quantized_staging_bytes(w1.pitch);
    const auto kernel = quantized_matvec_swiglu_kernel<D, kOneWave, kRowsPerWarp, A>;
    const dim3 grid = kOneWave ? one_wave_grid(kernel, w1.rows, kRowsPerWarp, shared)
                               : quantized_matvec_grid(w1.rows, kRowsPerWarp);
    launch_after_previous(kernel, grid, dim3(kQuantizedMatvecThreads), shared, stream, out, w1.data,
                          w1.scales, w3.data, w3.scales, w1.rows, w1.pitch, in, w1.cols,
                          norm_weight, eps);
}

// Calls use(std::bool_constant<B>) for one_wave B.
template <typename Use>
void with_one_wave(bool one_wave, Use&& use) {
    if (one_wave) return use(std::true_type{});
    use(std::false_type{});
}

template <DType D, bool kOneWave, int kRowsPerWarp>
void allow_quantized_shared_bytes_rows(size_t bytes) {
    allow_shared_bytes(quantized_matvec_kernel<D, kOneWave, false, kRowsPerWarp>, bytes);
    allow_shared_bytes(quantized_matvec_kernel<D, kOneWave, true, kRowsPerWarp>, bytes);
    allow_shared_bytes(quantized_matvec_swiglu_kernel<D, kOneWave, kRowsPerWarp, Activation::Silu>,
                       bytes);
    allow_shared_bytes(
        quantized_matvec_swiglu_kernel<D, kOneWave, kRowsPerWarp, Activation::GeluTanh>, bytes);
}

template <DType D>
void allow_quantized_shared_bytes(size_t bytes) {
    for (const bool one_wave : {false, true})
        for (const int rows_per_warp : kQuantizedRowsPerWarp)
            with_one_wave(one_wave, [&](auto o) {
                with_rows_per_warp(rows_per_warp, [&](auto r) {
                    allow_quantized_shared_bytes_rows<D, decltype(o)::value, decltype(r)::value>(
                        bytes);
                });
            });
}

}  // namespace

void launch_quantized_matvec(float* out, const DeviceMatrix& w, const float* in,
                             const float* norm_weight, float eps, const float* bias,
                             bool accumulate, QuantizedLaunch launch, cudaStream_t stream) {
    check_quantized_matrix(w, "matvec");
    launch = choose_quantized_launch(launch, w, /*swiglu=*/false);
    with_quantized_dtype(w.dtype, [&](auto dtype) {
        constexpr DType D = decltype(dtype)::value;
        with_one_wave(launch.grid == QuantizedGrid::kOneWave, [&](auto o) {
            with_rows_per_warp(launch.rows_per_warp, [&](auto r) {
                launch_quantized_matvec_typed<D, decltype(o)::value, decltype(r)::value>(
                    out, w, in, norm_weight, eps, bias, accumulate, stream);
            });
        });
    });
    CUDA_CHECK_LAUNCH("quantized_matvec_kernel");
}

void launch_quantized_matvec_swiglu(float* out, const DeviceMatrix& w1, const DeviceMatrix& w3,
                                    const float* in, const float* norm_weight, float eps,
                                    Activation activation, QuantizedLaunch launch,
                                    cudaStream_t stream) {
    check_quantized_matrix(w1, "matvec_swiglu");
    check_quantized_matrix(w3, "matvec_swiglu");
    launch = choose_quantized_launch(launch, w1, /*swiglu=*/true);
    with_quantized_dtype(w1.dtype, [&](auto dtype) {
        constexpr DType D = decltype(dtype)::value;
        with_one_wave(launch.grid == QuantizedGrid::kOneWave, [&](auto o) {
            with_rows_per_warp(launch.rows_per_warp, [&](auto r) {
                with_activation(activation, [&](auto act) {
                    launch_quantized_matvec_swiglu_typed<D, decltype(o)::value, decltype(r)::value,
                                                         decltype(act)::value>(
                        out, w1, w3, in, norm_weight, eps, stream);
                });
            });
        });
    });
    CUDA_CHECK_LAUNCH("quantized_matvec_swiglu_kernel");
}

void prepare_quantized_matvec(size_t bytes) {
    allow_quantized_shared_bytes<DType::Q8_0>(bytes);
    allow_quantized_shared_bytes<DType::Q4_0>(bytes);
}

QuantizedLaunch quantized_launch(const DeviceMatrix& w, bool swiglu) {
    check_quantized_matrix(w, "quantized_launch");
    return choose_quantized_launch(QuantizedLaunch{}, w, swiglu);
}

namespace {

// The block types' int8 kernels take one row per warp (matvec_blocks.cuh).
void check_block_launch(const QuantizedLaunch& launch, const char* what) {
    if (launch.rows_per_warp > 1)
        throw Error(std::string(what) + ": block-type matrices take one row per warp");
}

}  // namespace

void matvec_quantized_launch(QuantizedLaunch launch, float* out, const DeviceMatrix& w,
                             const float* in, const float* norm_weight, float eps,
                             const float* bias, bool accumulate, cudaStream_t stream) {
    check_input_alignment(in, norm_weight);
    if (is_block_type(w.dtype)) {
        check_block_launch(launch, "matvec_quantized_launch");
        return launch_block_matvec(out, w, in, norm_weight, eps, bias, accumulate, launch.grid,
                                   stream);
    }
    launch_quantized_matvec(out, w, in, norm_weight, eps, bias, accumulate, launch, stream);
}

void matvec_swiglu_quantized_launch(QuantizedLaunch launch, float* out, const DeviceMatrix& w1,
                                    const DeviceMatrix& w3, const float* in,
                                    const float* norm_weight, float eps, Activation activation,
                                    cudaStream_t stream) {
    check_swiglu_shapes(w1, w3);
    check_input_alignment(in, norm_weight);
    if (is_block_type(w1.dtype)) {
        check_block_launch(launch, "matvec_swiglu_quantized_launch");
        return launch_block_matvec_swiglu(out, w1, w3, in, norm_weight, eps, activation,
                                          launch.grid, stream);
    }
    launch_quantized_matvec_swiglu(out, w1, w3, in, norm_weight, eps, activation, launch, stream);
}

#endif  // BARELLM_LAUNCH_FUNCTIONS

}  // namespace barellm::cuda
