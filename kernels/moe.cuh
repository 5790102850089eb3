// The kernels of a sparse layer's feed-forward, a mixture of experts (src/cpu/moe.h says what
// it computes):
//
// - route_tokens_kernel: each token's router logits to its experts_per_token experts and their
//   weights, on the device, as cpu::route_token does: p = softmax(logits), the k largest p
//   best first, an exact tie going to the lower index (torch.topk's order), the weights
//   renormalised to sum 1 with norm_topk_prob. One warp per token; the j-th pick is the best
//   (p, index) after the (j-1)-th in that order, so nothing needs marking.
// - expert_matvec_kernel, expert_quantized_matvec_kernel, expert_block_matvec_kernel: the
//   matvecs of matvec.cuh, matvec_quantized.cuh and matvec_blocks.cuh on the experts the
//   router chose. A layer's experts of one role (w1, w3 or w2) are one stacked device matrix,
//   expert e's rows at e * rows (kernels.h: DeviceExperts); blockIdx.y is a route (a token's
//   j-th expert), whose expert index the kernel reads from device memory: the launch shape
//   does not depend on the routing, so the decode's CUDA graph replays it unchanged.
// - moe_combine_kernel: the weighted sum of each token's k expert outputs into the residual.
#pragma once
#include <cmath>

#include "common.cuh"
#include "cuda_check.h"
#include "kernels.h"
#include "matvec.cuh"
#include "matvec_blocks.cuh"
#include "matvec_quantized.cuh"

namespace barellm::cuda {

constexpr int kRouteThreads = kWarpSize;  // one warp per token
constexpr int kCombineThreads = 256;

// Below every probability: a NaN probability (from weights that are not finite) ranks so, and
// each pick starts from it with no expert, so that a pick always finds one.
constexpr float kBelowEveryProbability = -1.0f;

// Whether (p, i) comes before (q, j) in the routing order: larger first, the lower index first
// among equals.
__device__ __forceinline__ bool routed_before(float p, int i, float q, int j) {
    if (std::isnan(p)) p = kBelowEveryProbability;
    if (std::isnan(q)) q = kBelowEveryProbability;
    return p > q || (p == q && i < j);
}

// chosen[t * k + j], weights[t * k + j] (j < k) = token t's j-th expert and its weight, from its
// logits[t * experts ..] (not modified).
// Launch: grid tokens, block kRouteThreads (one warp a token).
__global__ void __launch_bounds__(kRouteThreads)
    route_tokens_kernel(int* __restrict__ chosen, float* __restrict__ weights,
                        const float* __restrict__ logits, int experts, int k, bool normalize) {
    const int lane = threadIdx.x;
    const float* row = logits + size_t(blockIdx.x) * experts;
    float largest = -INFINITY;
    for (int i = lane; i < experts; i += kWarpSize) largest = fmaxf(largest, row[i]);
    largest = warp_max(largest);
    float sum = 0.0f;
    for (int i = lane; i < experts; i += kWarpSize) sum += expf(row[i] - largest);
    sum = warp_sum(sum);
    // The same p_i for every recomputation: the picks compare values computed alike.
    auto probability = [&](int i) { return expf(row[i] - largest) / sum; };

    float previous_p = INFINITY, picked[kWarpSize];  // k <= kWarpSize (route_tokens checks)
    int previous_i = -1;
    for (int j = 0; j < k; ++j) {
        float best_p = kBelowEveryProbability;
        int best_i = experts;  // after every expert
        for (int i = lane; i < experts; i += kWarpSize) {
            const float p = probability(i);
            if (routed_before(previous_p, previous_i, p, i) &&
                routed_before(p, i, best_p, best_i)) {
                best_p = p;
                best_i = i;
            }
        }
        for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
            const float other_p = __shfl_xor_sync(kFullMask, best_p, offset);
            const int other_i = __shfl_xor_sync(kFullMask, best_i, offset);
            if (routed_before(other_p, other_i, best_p, best_i)) {
                best_p = other_p;
                best_i = other_i;
            }
        }
        picked[j] = best_p;
        previous_p = best_p;
        previous_i = best_i;
        if (lane == 0) chosen[size_t(blockIdx.x) * k + j] = best_i;
    }
    if (lane == 0) {
        float total = 0.0f;  // summed in pick order, as the CPU does
        for (int j = 0; j < k; ++j) total += picked[j];
        for (int j = 0; j < k; ++j)
            weights[size_t(blockIdx.x) * k + j] = normalize ? picked[j] / total : picked[j];
    }
}

// What an expert matvec launch multiplies (the fields of a DeviceExperts a kernel reads), and
// where: route r = blockIdx.y (of `routes`) takes expert experts[r]'s rows, the input row
// r / routes_per_input of in (in_pitch floats apart; k per input row: each token's input
// multiplied by its k experts, or 1: each route's own), and writes out + r * out_pitch.
struct ExpertLaunch {
    const void* data;        // the stacked matrix's values
    const uint16_t* scales;  // its scales (Q8/Q4; else null)
    size_t expert_bytes;     // bytes of one expert's values
    size_t expert_scales;    // scales of one expert (Q8/Q4; else 0)
    int rows, cols, pitch;   // one expert's matrix
    const int* experts;      // [routes]  the expert of each route
    const float* biases;     // [experts * rows]  expert e's bias at e * rows, or null
    int routes_per_input;
    int in_pitch, out_pitch;
};

__device__ __forceinline__ int route_expert(const ExpertLaunch& w) { return w.experts[blockIdx.y]; }
__device__ __forceinline__ const void* route_weights(const ExpertLaunch& w) {
    return static_cast<const char*>(w.data) + size_t(route_expert(w)) * w.expert_bytes;
}
__device__ __forceinline__ const float* route_input(const ExpertLaunch& w, const float* in) {
    return in + size_t(blockIdx.y / w.routes_per_input) * w.in_pitch;
}
__device__ __forceinline__ float* route_output(const ExpertLaunch& w, float* out) {
    return out + size_t(blockIdx.y) * w.out_pitch;
}
__device__ __forceinline__ const float* route_bias(const ExpertLaunch& w) {
    return w.biases != nullptr ? w.biases + size_t(route_expert(w)) * w.rows : nullptr;
}

// out_r = W_e · stage(in_r) (+ expert e's bias, where the launch has biases) for each route r
// (ExpertLaunch), W of f32, f16 or bf16.
// Launch: grid (matvec_grid(rows, pitch).x, routes), block matvec_block(pitch), dynamic shared
// memory staged_input_bytes(pitch): matvec_kernel's for one expert, once per route.
template <DType D>
__global__ void __launch_bounds__(kMatvecThreadsMax)
    expert_matvec_kernel(float* __restrict__ out, ExpertLaunch w, const float* __restrict__ in,
                         const float* __restrict__ norm_weight, float eps) {
    matvec_rows_of_block<D, /*kAccumulate=*/false>(route_output(w, out), route_weights(w), w.rows,
                                                   w.pitch, route_input(w, in), w.cols, norm_weight,
                                                   eps, route_bias(w));
}

// The same for Q8/Q4 weights (quantized_matvec_kernel's block per row set, a row per warp).
// Launch: grid (quantized_matvec_grid(rows, 1).x, routes), block kQuantizedMatvecWarps * 32,
// dynamic shared memory quantized_staging_bytes(pitch).
template <DType D>
__global__ void __launch_bounds__(kMatvecThreadsMax)
    expert_quantized_matvec_kernel(float* __restrict__ out, ExpertLaunch w,
                                   const float* __restrict__ in,
                                   const float* __restrict__ norm_weight, float eps) {
    __shared__ float results[kQuantizedMatvecWarps];
    const void* const matrices[1] = {route_weights(w)};
    const uint16_t* const scales[1] = {w.scales + size_t(route_expert(w)) * w.expert_scales};
    float* route_out = route_output(w, out);
    quantized_row_sets_of_block<D, /*kOneWave=*/false, /*kRowsPerWarp=*/1>(
        matrices, scales, w.rows, w.pitch, route_input(w, in), w.cols, norm_weight, eps,
        [&](int set, const float(&sums)[1]) {
            store_warp_rows</*kAccumulate=*/false, 1>(route_out, sums, results, route_bias(w),
                                                      w.rows, set);
        });
}

// The same for the block types (block_matvec_kernel's block per row set).
// Launch: grid (quantized_matvec_grid(rows, 1).x, routes), block kQuantizedMatvecThreads,
// dynamic shared memory block_staging_bytes(cols).
template <DType D>
__global__ void __launch_bounds__(kMatvecThreadsMax)
    expert_block_matvec_kernel(float* __restrict__ out, ExpertLaunch w,
                               const float* __restrict__ in, const float* __restrict__ norm_weight,
                               float eps) {
    __shared__ float results[kQuantizedMatvecWarps];
    const void* const matrices[1] = {route_weights(w)};
    float* route_out = route_output(w, out);
    block_row_sets_of_block<D, /*kOneWave=*/false>(
        matrices, w.rows, route_input(w, in), w.cols, norm_weight, eps,
        [&](int set, const float(&sums)[1]) {
            store_warp_rows</*kAccumulate=*/false, 1>(route_out, sums, results, route_bias(w),
                                                      w.rows, set);
        });
}

// x[t, i] += Σ_j weights[t * k + j] · expert_out[slot(t * k + j), i] for i < dim: the sum
// first, in j order, then the add (as the CPU). slot(r) = slots[r], or r without slots.
// expert_out has pitch dim, x pitch x_pitch.
// Launch: grid (ceil(dim / kCombineThreads), tokens), block kCombineThreads.
__global__ void __launch_bounds__(kCombineThreads)
    moe_combine_kernel(float* __restrict__ x, int x_pitch, const float* __restrict__ expert_out,
                       const int* __restrict__ slots, const float* __restrict__ weights, int k,
                       int dim) {
    const int i = blockIdx.x * kCombineThreads + threadIdx.x, t = blockIdx.y;
    if (i >= dim) return;
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) {
        const int route = t * k + j;
        const int slot = slots != nullptr ? slots[route] : route;
        sum += weights[route] * expert_out[size_t(slot) * dim + i];
    }
    x[size_t(t) * x_pitch + i] += sum;
}

// ---- Launch shapes (the expert matvecs: their matvec's, with a grid row per route)

// Q8/Q4 and the block types: a row per warp, kQuantizedMatvecWarps rows a block.
inline bool expert_takes_quantized_shape(DType dtype) {
    return is_quantized(dtype) || is_block_type(dtype);
}
inline dim3 expert_matvec_grid(DType dtype, int rows, int pitch, int routes) {
    const unsigned sets = expert_takes_quantized_shape(dtype) ? quantized_matvec_grid(rows, 1).x
                                                              : matvec_grid(rows, pitch).x;
    return dim3(sets, routes);
}
inline dim3 expert_matvec_block(DType dtype, int pitch) {
    return expert_takes_quantized_shape(dtype) ? dim3(kQuantizedMatvecThreads)
                                               : matvec_block(pitch);
}
inline size_t expert_matvec_shared_bytes(DType dtype, int pitch) {
    if (is_quantized(dtype)) return quantized_staging_bytes(pitch);
    return is_block_type(dtype) ? block_staging_bytes(pitch) : staged_input_bytes(pitch);
}
inline dim3 moe_combine_grid(int dim, int tokens) {
    return dim3((dim + kCombineThreads - 1) / kCombineThreads, tokens);
}

#ifdef BARELLM_LAUNCH_FUNCTIONS

void route_tokens(int* chosen, float* weights, const float* logits, int tokens, int experts, int k,
                  bool normalize, cudaStream_t stream) {
    if (k < 1 || k > kWarpSize || k > experts)
        throw Error("route_tokens: " + std::to_string(k) + " experts per token of " +
                    std::to_string(experts) + " (at most " + std::to_string(kWarpSize) + ")");
    launch_kernel(route_tokens_kernel, tokens, kRouteThreads, 0, stream, chosen, weights, logits,
                  experts, k, normalize);
    CUDA_CHECK_LAUNCH("route_tokens_kernel");
}

void expert_matvec(float* out, int out_pitch, const DeviceExperts& w, const int* experts,
                   int routes, int routes_per_input, const float* in, int in_pitch,
                   const float* norm_weight, float eps, const float* biases, cudaStream_t stream) {
    const DeviceMatrix& m = w.stacked;
    check_input_alignment(in, norm_weight);
    if (in_pitch % 4 != 0)
        throw Error("expert_matvec: input rows must start 16-byte aligned (pitch " +
                    std::to_string(in_pitch) + ")");
    ExpertLaunch launch{};
    launch.data = m.data;
    launch.scales = m.scales;
    launch.expert_bytes = size_t(w.rows) * m.row_bytes();
    launch.expert_scales = m.scales != nullptr ? size_t(w.rows) * m.blocks_per_row() : 0;
    launch.rows = w.rows;
    launch.cols = m.cols;
    launch.pitch = m.pitch;
    launch.experts = experts;
    launch.biases = biases;
    launch.routes_per_input = routes_per_input;
    launch.in_pitch = in_pitch;
    launch.out_pitch = out_pitch;
    const dim3 grid = expert_matvec_grid(m.dtype, w.rows, m.pitch, routes);
    const dim3 block = expert_matvec_block(m.dtype, m.pitch);
    const size_t shared = expert_matvec_shared_bytes(m.dtype, m.pitch);
    if (is_quantized(m.dtype)) {
        with_quantized_dtype(m.dtype, [&](auto dtype) {
            launch_kernel(expert_quantized_matvec_kernel<decltype(dtype)::value>, grid, block,
                          shared, stream, out, launch, in, norm_weight, eps);
        });
    } else if (is_block_type(m.dtype)) {
        check_block_matrix(m, "expert_matvec");
        with_block_dtype(m.dtype, [&](auto dtype) {
            launch_kernel(expert_block_matvec_kernel<decltype(dtype)::value>, grid, block, shared,
                          stream, out, launch, in, norm_weight, eps);
        });
    } else {
        with_weight_dtype(m.dtype, [&](auto dtype) {
            launch_kernel(expert_matvec_kernel<decltype(dtype)::value>, grid, block, shared, stream,
                          out, launch, in, norm_weight, eps);
        });
    }
    CUDA_CHECK_LAUNCH("expert_matvec_kernel");
}

void moe_combine(float* x, int x_pitch, const float* expert_out, const int* slots,
                 const float* weights, int k, int dim, int tokens, cudaStream_t stream) {
    launch_kernel(moe_combine_kernel, moe_combine_grid(dim, tokens), kCombineThreads, 0, stream, x,
                  x_pitch, expert_out, slots, weights, k, dim);
    CUDA_CHECK_LAUNCH("moe_combine_kernel");
}

void prepare_expert_matvec(size_t bytes) {
    allow_shared_bytes(expert_matvec_kernel<DType::F32>, bytes);
    allow_shared_bytes(expert_matvec_kernel<DType::F16>, bytes);
    allow_shared_bytes(expert_matvec_kernel<DType::BF16>, bytes);
    allow_shared_bytes(expert_quantized_matvec_kernel<DType::Q8_0>, bytes);
    allow_shared_bytes(expert_quantized_matvec_kernel<DType::Q4_0>, bytes);
    for (const DType dtype :
         {DType::Q4_1,    DType::Q5_0,   DType::Q5_1,  DType::IQ4_NL,  DType::Q2_K,
          DType::Q3_K,    DType::Q4_K,   DType::Q5_K,  DType::Q6_K,    DType::IQ4_XS,
          DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS, DType::IQ3_S,
          DType::IQ1_S,   DType::IQ1_M,  DType::TQ1_0, DType::TQ2_0,   DType::MXFP4})
        with_block_dtype(dtype, [&](auto d) {
            allow_shared_bytes(expert_block_matvec_kernel<decltype(d)::value>, bytes);
        });
}

#endif  // BARELLM_LAUNCH_FUNCTIONS

}  // namespace barellm::cuda
