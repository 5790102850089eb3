// The GPU ladder's simple matrix-vector products (`barellm ladder --device cuda`, rungs 1-3):
// what matvec.cuh computes, written the obvious ways, so that each step to the fast kernels
// can be timed on its own and every fast kernel has a plain reference beside it.
//
// - matvec_thread_per_row_kernel (rung 1): the CPU loop ported as it is, one thread per
//   output row. At each step the 32 lanes of a warp read 32 different rows, a pitch apart:
//   no load is coalesced.
// - matvec_warp_per_row_kernel (rungs 2-3): one warp per row; lane l reads elements l,
//   l + 32, ... so that each warp-wide load is 32 contiguous elements; the lanes' sums meet
//   by shuffles and lane 0 stores (one 4-byte store per warp: not coalesced). Rung 3 fuses
//   RMSNorm into it (the block computes the scale, the lanes apply it as they read the
//   input), the bias (Qwen's projections) and the residual add (out +=).
// - matvec_swiglu_warp_per_row_kernel (rung 3): the same warp reads its row of w1, then of
//   w3, and stores silu(gate) * up.
// The weights are read one element at a time, straight from global memory, and so is the
// input; matvec.cuh adds 16-byte loads, several in flight, the input staged in shared
// memory, and stores coalesced through shared memory.
#pragma once
#include "common.cuh"
#include "cuda_check.h"
#include "kernels.h"
#include "matvec.cuh"

namespace barellm::cuda {

constexpr int kSimpleMatvecThreads = 128;
constexpr int kSimpleMatvecWarps = kSimpleMatvecThreads / kWarpSize;

// out[r] = W[r, :] · in, r in [0, rows); thread r walks its row from left to right.
// Launch: grid ceil(rows / 128), block 128, no shared memory.
template <DType D>
__global__ void __launch_bounds__(kSimpleMatvecThreads)
    matvec_thread_per_row_kernel(float* __restrict__ out, const void* __restrict__ weights,
                                 int rows, int pitch, const float* __restrict__ in, int cols) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const void* weight_row_start = weight_row<D>(weights, row, pitch);
    float sum = 0.0f;
    for (int c = 0; c < cols; ++c)
        sum = fmaf(WeightFormat<D>::element(weight_row_start, c), in[c], sum);
    out[row] = sum;
}

// The calling warp's W_row · in', in' = in * scale * norm_weight when norm_weight is given,
// else in; every lane gets the sum. All 32 lanes must call it.
template <DType D>
__device__ __forceinline__ float warp_row_dot(const void* row, const float* __restrict__ in,
                                              int cols, const float* __restrict__ norm_weight,
                                              float scale) {
    float sum = 0.0f;
    for (int c = threadIdx.x % kWarpSize; c < cols; c += kWarpSize) {
        const float x = norm_weight != nullptr ? in[c] * scale * norm_weight[c] : in[c];
        sum = fmaf(WeightFormat<D>::element(row, c), x, sum);
    }
    return warp_sum(sum);
}

// out[r] = (kAccumulate ? out[r] : 0) + (W[r, :] · in' + bias[r]), in' as for warp_row_dot
// with the RMSNorm scale of `in` (when norm_weight is given), no bias term when bias is null.
// Warp w of block b computes row 4b + w.
// Launch: grid ceil(rows / 4), block 128 (4 warps), no dynamic shared memory.
template <DType D, bool kAccumulate>
__global__ void __launch_bounds__(kSimpleMatvecThreads)
    matvec_warp_per_row_kernel(float* __restrict__ out, const void* __restrict__ weights, int rows,
                               int pitch, const float* __restrict__ in, int cols,
                               const float* __restrict__ norm_weight, float eps,
                               const float* __restrict__ bias) {
    __shared__ float scratch[kWarpSize];
    const float scale = norm_weight != nullptr ? rms_scale(in, cols, eps, scratch) : 1.0f;
    const int row = blockIdx.x * kSimpleMatvecWarps + threadIdx.x / kWarpSize;
    if (row >= rows) return;  // the whole warp
    float sum = warp_row_dot<D>(weight_row<D>(weights, row, pitch), in, cols, norm_weight, scale);
    if (bias != nullptr) sum += bias[row];
    if (threadIdx.x % kWarpSize == 0) out[row] = kAccumulate ? out[row] + sum : sum;
}

// out[r] = silu(W1[r, :] · in') * (W3[r, :] · in'), in' = rmsnorm(in) * norm_weight.
// Launch: as matvec_warp_per_row_kernel (grid ceil(rows / 4), block 128).
template <DType D>
__global__ void __launch_bounds__(kSimpleMatvecThreads)
    matvec_swiglu_warp_per_row_kernel(float* __restrict__ out, const void* __restrict__ w1,
                                      const void* __restrict__ w3, int rows, int pitch,
                                      const float* __restrict__ in, int cols,
                                      const float* __restrict__ norm_weight, float eps) {
    __shared__ float scratch[kWarpSize];
    const float scale = rms_scale(in, cols, eps, scratch);
    const int row = blockIdx.x * kSimpleMatvecWarps + threadIdx.x / kWarpSize;
    if (row >= rows) return;
    const float gate = warp_row_dot<D>(weight_row<D>(w1, row, pitch), in, cols, norm_weight, scale);
    const float up = warp_row_dot<D>(weight_row<D>(w3, row, pitch), in, cols, norm_weight, scale);
    if (threadIdx.x % kWarpSize == 0) out[row] = gated_value<Activation::Silu>(gate, up);
}

// ---- Launch shapes

inline dim3 matvec_thread_per_row_grid(int rows) {
    return dim3((rows + kSimpleMatvecThreads - 1) / kSimpleMatvecThreads);
}
// matvec_warp_per_row_kernel and matvec_swiglu_warp_per_row_kernel
inline dim3 matvec_warp_per_row_grid(int rows) {
    return dim3((rows + kSimpleMatvecWarps - 1) / kSimpleMatvecWarps);
}

#ifdef BARELLM_LAUNCH_FUNCTIONS

void matvec_thread_per_row(float* out, const DeviceMatrix& w, const float* in,
                           cudaStream_t stream) {
    const dim3 grid = matvec_thread_per_row_grid(w.rows);
    with_weight_dtype(w.dtype, [&](auto dtype) {
        launch_kernel(matvec_thread_per_row_kernel<decltype(dtype)::value>, grid,
                      kSimpleMatvecThreads, 0, stream, out, w.data, w.rows, w.pitch, in, w.cols);
    });
    CUDA_CHECK_LAUNCH("matvec_thread_per_row_kernel");
}

void matvec_warp_per_row(float* out, const DeviceMatrix& w, const float* in,
                         const float* norm_weight, float eps, const float* bias, bool accumulate,
                         cudaStream_t stream) {
    const dim3 grid = matvec_warp_per_row_grid(w.rows);
    with_weight_dtype(w.dtype, [&](auto dtype) {
        constexpr DType D = decltype(dtype)::value;
        if (accumulate)
            launch_kernel(matvec_warp_per_row_kernel<D, true>, grid, kSimpleMatvecThreads, 0,
                          stream, out, w.data, w.rows, w.pitch, in, w.cols, norm_weight, eps, bias);
        else
            launch_kernel(matvec_warp_per_row_kernel<D, false>, grid, kSimpleMatvecThreads, 0,
                          stream, out, w.data, w.rows, w.pitch, in, w.cols, norm_weight, eps, bias);
    });
    CUDA_CHECK_LAUNCH("matvec_warp_per_row_kernel");
}

void matvec_swiglu_warp_per_row(float* out, const DeviceMatrix& w1, const DeviceMatrix& w3,
                                const float* in, const float* norm_weight, float eps,
                                cudaStream_t stream) {
    check_swiglu_shapes(w1, w3);
    const dim3 grid = matvec_warp_per_row_grid(w1.rows);
    with_weight_dtype(w1.dtype, [&](auto dtype) {
        launch_kernel(matvec_swiglu_warp_per_row_kernel<decltype(dtype)::value>, grid,
                      kSimpleMatvecThreads, 0, stream, out, w1.data, w3.data, w1.rows, w1.pitch, in,
                      w1.cols, norm_weight, eps);
    });
    CUDA_CHECK_LAUNCH("matvec_swiglu_warp_per_row_kernel");
}

#endif  // BARELLM_LAUNCH_FUNCTIONS

}  // namespace barellm::cuda
