// Decode matrix-vector products of matrices stored as ggml's blocks (block_units.cuh: how
// their units of 32 weights are loaded and dequantized in registers): matvec.cuh's kernels
// with the unit in place of the 16-byte vector.
//
// - One warp per row (8 or 16 rows a block: matvec_warps); lane l takes units l, l + 32, ...
//   of its row, kBlockMatvecUnroll units' loads in flight before any math. A warp-wide load
//   covers 32 consecutive units: 32 small blocks, or 4 super-blocks.
// - The input stays f32, staged once per block in shared memory in plain order with RMSNorm
//   fused (matvec.cuh: stage_input); each group of 16 weights adds
//   scale · Σ q·x + offset · Σ x to the lane's sum (unit_dot): 16 FMAs on integers converted
//   to f32, no int8 copy of the input.
// - The row sums meet in shared memory and are stored with the bias and the residual
//   (store_warp_rows); w1 and w3 are read by one warp with SwiGLU applied before the store.
// Not yet timed on a GPU (cuda_kernel_check --bench times them): what it has to decide is
// whether the plain staging order (a super-block's lanes read input columns 16 or 64 apart,
// so their 16-byte shared loads meet in the same banks), the 2-byte loads of Q5_0 and Q6_K
// (blocks of 22 and 210 bytes) and the f32 products keep these kernels at memory speed.
#pragma once
#include <cstdint>

#include "block_units.cuh"
#include "common.cuh"
#include "cuda_check.h"
#include "kernels.h"
#include "matvec.cuh"

namespace barellm::cuda {

constexpr int kBlockMatvecUnroll = 2;  // units' loads in flight per lane and row

// Σ over the unit's 32 weights of weight · xs[column] (xs: the staged input, plain order).
template <DType D>
__device__ __forceinline__ float unit_dot(const WeightUnit& w, const float* xs) {
    float total = 0.0f;
#pragma unroll
    for (int g = 0; g < 2; ++g) {
        const float4* x = reinterpret_cast<const float4*>(xs + w.column[g]);
        float dot = 0.0f, sum = 0.0f;
#pragma unroll
        for (int v = 0; v < kGroupWeights / 4; ++v) {
            const float4 part = x[v];
            dot = fmaf(float(w.q[g][4 * v]), part.x, dot);
            dot = fmaf(float(w.q[g][4 * v + 1]), part.y, dot);
            dot = fmaf(float(w.q[g][4 * v + 2]), part.z, dot);
            dot = fmaf(float(w.q[g][4 * v + 3]), part.w, dot);
            sum += (part.x + part.y) + (part.z + part.w);
        }
        total = fmaf(w.scale[g], dot, total);
        if constexpr (kHasOffset<D>) total = fmaf(w.offset[g], sum, total);
    }
    return total;
}

// Dot products of kRows rows of block type D (each 16-byte aligned, `cols` columns) with
// the staged input, for the calling warp; every lane gets the sums. All 32 lanes call it.
template <DType D, int kRows>
__device__ __forceinline__ void dot_block_rows(const uint8_t* const (&rows)[kRows], const float* xs,
                                               int cols, float (&sums)[kRows]) {
    const int units = cols / kUnitWeights;
    const int lane = threadIdx.x % kWarpSize;
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
    for (int first = lane; first < units; first += kWarpSize * kBlockMatvecUnroll) {
        UnitBytes raw[kRows][kBlockMatvecUnroll];  // all loads of the round, then the math
#pragma unroll
        for (int u = 0; u < kBlockMatvecUnroll; ++u) {
            const int unit = first + u * kWarpSize;
#pragma unroll
            for (int r = 0; r < kRows; ++r)
                raw[r][u] = unit < units ? load_unit<D>(rows[r], unit) : UnitBytes{};
        }
#pragma unroll
        for (int u = 0; u < kBlockMatvecUnroll; ++u) {
            const int unit = first + u * kWarpSize;
            if (unit < units) {
#pragma unroll
                for (int r = 0; r < kRows; ++r)
                    acc[r] += unit_dot<D>(decode_unit<D>(raw[r][u], unit), xs);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) sums[r] = warp_sum(acc[r]);
}

// The block's part of block_matvec_kernel: out[r] for its row set (rows blockIdx.x * warps
// ..), one warp per row. Every thread of the block calls it.
template <DType D, bool kAccumulate>
__device__ __forceinline__ void block_matvec_rows_of_block(
    float* __restrict__ out, const void* __restrict__ weights, int rows,
    const float* __restrict__ in, int cols, const float* __restrict__ norm_weight, float eps,
    const float* __restrict__ bias) {
    __shared__ float scratch[kWarpSize];
    __shared__ float results[kMatvecMaxWarps];
    const int warps = blockDim.x / kWarpSize, warp = threadIdx.x / kWarpSize;
    const int row = blockIdx.x * warps + warp;
    const bool has_row = row < rows;  // the same for the whole warp
    const uint8_t* const row_pointer[1] = {block_row<D>(weights, has_row ? row : 0, cols)};
    finish_prologue();  // the input and out: the kernels ahead wrote them

    float* xs = dynamic_shared_floats();
    stage_input<4>(xs, in, cols, cols, norm_weight, eps, scratch);

    float sum[1] = {0.0f};
    if (has_row) dot_block_rows<D, 1>(row_pointer, xs, cols, sum);
    store_warp_rows<kAccumulate>(out, sum[0], results, bias, rows);
}

// out[r] = (kAccumulate ? out[r] : 0) + (W[r, :] · stage(in) + bias[r]), r in [0, rows), no
// bias term when bias is null; W of block type D [rows, cols].
// Launch: grid matvec_grid(rows, cols), block matvec_block(cols) (one warp per row), dynamic
// shared memory staged_input_bytes(cols).
template <DType D, bool kAccumulate>
__global__ void __launch_bounds__(kMatvecThreadsMax)
    block_matvec_kernel(float* __restrict__ out, const void* __restrict__ weights, int rows,
                        const float* __restrict__ in, int cols,
                        const float* __restrict__ norm_weight, float eps,
                        const float* __restrict__ bias) {
    block_matvec_rows_of_block<D, kAccumulate>(out, weights, rows, in, cols, norm_weight, eps,
                                               bias);
}

// out[r] = act(W1[r, :] · stage(in)) * (W3[r, :] · stage(in)), W1 and W3 of block type D,
// act of A (gated_value).
// Launch: as block_matvec_kernel; each warp reads its row of both matrices.
template <DType D, Activation A>
__global__ void __launch_bounds__(kMatvecThreadsMax)
    block_matvec_swiglu_kernel(float* __restrict__ out, const void* __restrict__ w1,
                               const void* __restrict__ w3, int rows, const float* __restrict__ in,
                               int cols, const float* __restrict__ norm_weight, float eps) {
    __shared__ float scratch[kWarpSize];
    __shared__ float results[kMatvecMaxWarps];
    const int warps = blockDim.x / kWarpSize, warp = threadIdx.x / kWarpSize;
    const int row = blockIdx.x * warps + warp;
    const bool has_row = row < rows;
    const int safe_row = has_row ? row : 0;
    const uint8_t* const row_pointers[2] = {block_row<D>(w1, safe_row, cols),
                                            block_row<D>(w3, safe_row, cols)};
    finish_prologue();

    float* xs = dynamic_shared_floats();
    stage_input<4>(xs, in, cols, cols, norm_weight, eps, scratch);

    float value = 0.0f;
    if (has_row) {
        float sums[2];
        dot_block_rows<D, 2>(row_pointers, xs, cols, sums);
        value = gated_value<A>(/*gate=*/sums[0], /*up=*/sums[1]);
    }
    store_warp_rows</*kAccumulate=*/false>(out, value, results, /*bias=*/nullptr, rows);
}

#ifdef BARELLM_LAUNCH_FUNCTIONS

namespace {

template <DType D>
void allow_block_shared_bytes(size_t bytes) {
    allow_shared_bytes(block_matvec_kernel<D, false>, bytes);
    allow_shared_bytes(block_matvec_kernel<D, true>, bytes);
    allow_shared_bytes(block_matvec_swiglu_kernel<D, Activation::Silu>, bytes);
    allow_shared_bytes(block_matvec_swiglu_kernel<D, Activation::GeluTanh>, bytes);
}

}  // namespace

void launch_block_matvec(float* out, const DeviceMatrix& w, const float* in,
                         const float* norm_weight, float eps, const float* bias, bool accumulate,
                         cudaStream_t stream) {
    check_block_matrix(w, "matvec");
    const dim3 grid = matvec_grid(w.rows, w.cols), block = matvec_block(w.cols);
    const size_t shared = staged_input_bytes(w.cols);
    with_block_dtype(w.dtype, [&](auto dtype) {
        constexpr DType D = decltype(dtype)::value;
        const auto kernel =
            accumulate ? block_matvec_kernel<D, true> : block_matvec_kernel<D, false>;
        launch_after_previous(kernel, grid, block, shared, stream, out, w.data, w.rows, in, w.cols,
                              norm_weight, eps, bias);
    });
    CUDA_CHECK_LAUNCH("block_matvec_kernel");
}

void launch_block_matvec_swiglu(float* out, const DeviceMatrix& w1, const DeviceMatrix& w3,
                                const float* in, const float* norm_weight, float eps,
                                Activation activation, cudaStream_t stream) {
    check_block_matrix(w1, "matvec_swiglu");
    check_block_matrix(w3, "matvec_swiglu");
    const dim3 grid = matvec_grid(w1.rows, w1.cols), block = matvec_block(w1.cols);
    with_block_dtype(w1.dtype, [&](auto dtype) {
        with_activation(activation, [&](auto act) {
            launch_after_previous(
                block_matvec_swiglu_kernel<decltype(dtype)::value, decltype(act)::value>, grid,
                block, staged_input_bytes(w1.cols), stream, out, w1.data, w3.data, w1.rows, in,
                w1.cols, norm_weight, eps);
        });
    });
    CUDA_CHECK_LAUNCH("block_matvec_swiglu_kernel");
}

void prepare_block_matvec(size_t bytes) {
    allow_block_shared_bytes<DType::Q4_1>(bytes);
    allow_block_shared_bytes<DType::Q5_0>(bytes);
    allow_block_shared_bytes<DType::Q5_1>(bytes);
    allow_block_shared_bytes<DType::Q4_K>(bytes);
    allow_block_shared_bytes<DType::Q5_K>(bytes);
    allow_block_shared_bytes<DType::Q6_K>(bytes);
    allow_block_shared_bytes<DType::IQ4_XS>(bytes);
}

#endif  // BARELLM_LAUNCH_FUNCTIONS

}  // namespace barellm::cuda
