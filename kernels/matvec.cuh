// Matrix-vector products for decode (one token). Every weight byte is read once per token,
// so these kernels are bound by memory bandwidth and are written to stream weights at it:
//
// - One warp per output row. Lane l reads 16-byte vectors l, l + 32, l + 64, ... of the row,
//   so each warp-wide load is 512 contiguous bytes, kMatvecUnroll loads in flight per lane
//   (per row) before the first is used. Loads bypass L1 with an evict-first hint (__ldcs):
//   weights are touched once.
// - The input vector is staged once per block in shared memory as f32, in the order the
//   weight vectors consume it (staged_index), so that the per-lane shared loads are
//   conflict-free 16-byte accesses.
// - RMSNorm, when the matrix consumes a normed input, is applied while staging: each block
//   computes the sum of squares of the input itself, which costs less than a separate
//   kernel and its round trip through global memory.
// - Staging reads float4s, several in flight per thread, and each warp asks L2 for its
//   first weights before it starts: the block's start-up (staging, the norm's reduction)
//   overlaps the first trip to DRAM instead of preceding it. That request is the kernel's
//   prologue (dependent_launch.cuh): launched early, it overlaps the previous kernel's tail.
// - The row sums meet in shared memory; the block's first warp stores them (adding the bias,
//   for Qwen's q/k/v and o projections, and the residual, for wo and w2) with one coalesced
//   access.
// - w1 and w3 are read by the same warp and the gate's activation (SwiGLU, or Gemma's
//   GeGLU) is applied before the store: the two hidden-size intermediates never reach global
//   memory.
#pragma once
#include "common.cuh"
#include "cuda_check.h"
#include "dependent_launch.cuh"
#include "kernels.h"
#include "weights/model.h"  // is_quantized

namespace barellm::cuda {

constexpr int kMatvecUnroll = 4;     // 16-byte loads in flight per lane and row
constexpr int kMatvecMaxWarps = 16;  // rows (warps) per block, at most
constexpr int kMatvecThreadsMax = kMatvecMaxWarps * kWarpSize;

// Warps (= rows) per block: 8, or 16 for long rows so that staging the input is spread
// over more rows and a block's shared memory does more work.
inline int matvec_warps(int pitch) { return pitch <= 4096 ? 8 : 16; }

// The staged f32 input of a matvec over rows of `pitch` elements.
inline size_t staged_input_bytes(int pitch) { return size_t(pitch) * sizeof(float); }

// Where input element c sits in the staged copy, for weight vectors of kPerVector elements
// (a multiple of 4). With 4 (f32) the order is plain. With more, lane l needs elements
// kPerVector * v .. kPerVector * (v + 1) - 1 of vector v; they are cut into kPerVector / 4
// "planes" of 4: plane k holds elements 4k..4k+3 of every vector, those of vector v at 4v,
// the planes pitch / (kPerVector / 4) floats apart. So each of the lane's 16-byte shared
// loads has the 32 lanes reading 512 consecutive bytes (no bank conflicts). With 8 (f16,
// bf16) that is a "low" half (8v..8v+3) at 4v and a "high" half (8v+4..8v+7) at
// pitch/2 + 4v. pitch is a multiple of kPerVector.
template <int kPerVector>
__device__ __forceinline__ int staged_index(int c, int pitch) {
    static_assert(kPerVector % 4 == 0, "weight vectors hold a multiple of 4 elements");
    constexpr int kPlanes = kPerVector / 4;
    const int vector = c / kPerVector, within = c % kPerVector;
    return within / 4 * (pitch / kPlanes) + vector * 4 + within % 4;
}

// The kPerVector staged input elements that weight vector `vector` multiplies.
template <int kPerVector>
__device__ __forceinline__ void load_staged(const float* xs, int vector, int pitch,
                                            float (&x)[kPerVector]) {
    constexpr int kPlanes = kPerVector / 4;
#pragma unroll
    for (int k = 0; k < kPlanes; ++k) {
        const float4 part = reinterpret_cast<const float4*>(xs + k * (pitch / kPlanes))[vector];
        x[4 * k] = part.x;
        x[4 * k + 1] = part.y;
        x[4 * k + 2] = part.z;
        x[4 * k + 3] = part.w;
    }
}

// 16-byte vectors in a weight row of `pitch` elements.
template <DType D>
__device__ __forceinline__ int row_vectors(int pitch) {
    return pitch / WeightFormat<D>::kPerVector;
}

template <DType D>
__device__ __forceinline__ const uint4* weight_row(const void* weights, int row, int pitch) {
    return reinterpret_cast<const uint4*>(static_cast<const char*>(weights) +
                                          size_t(row) * pitch * dtype_size_v<D>);
}

// Float4s of the input each thread loads before storing any (loads in flight at once).
constexpr int kStageBatch = 4;

// use(i, source[i]) for every i < count, the block's threads taking i = threadIdx.x,
// threadIdx.x + blockDim.x, ...: each thread loads kStageBatch float4s before it uses any,
// so that they travel together.
template <typename Use>
__device__ __forceinline__ void for_each_float4(const float4* __restrict__ source, int count,
                                                Use use) {
    for (int first = threadIdx.x; first < count; first += kStageBatch * blockDim.x) {
        float4 batch[kStageBatch];
#pragma unroll
        for (int b = 0; b < kStageBatch; ++b) {
            const int i = first + b * blockDim.x;
            batch[b] = i < count ? source[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int b = 0; b < kStageBatch; ++b) {
            const int i = first + b * blockDim.x;
            if (i < count) use(i, batch[b]);
        }
    }
}

// Copies in[0, cols) into the shared xs[pitch], zeros in [cols, pitch) (matching the zero
// padding of the weight rows). With norm_weight, element c is multiplied by
// rsqrt(mean(in²) + eps) * norm_weight[c] (the CPU's rmsnorm: x * scale * weight, in that
// order).
// - The input is read as float4s, several in flight per thread (for_each_float4): staging
//   costs one or two round trips to L2 instead of one per element.
// - A float4 of the input (c a multiple of 4) lands as one float4 in xs (staged_index keeps
//   groups of 4 together).
// - in and norm_weight must be 16-byte aligned. Every thread of the block must call it; it
//   ends with a barrier.
template <int kPerVector>
__device__ __forceinline__ void stage_input(float* xs, const float* __restrict__ in, int cols,
                                            int pitch, const float* __restrict__ norm_weight,
                                            float eps, float* scratch) {
    const int whole = cols / 4;  // float4s entirely inside the input
    auto slot = [&](int i) {     // where float4 i of the input is staged
        return reinterpret_cast<float4*>(xs + staged_index<kPerVector>(4 * i, pitch));
    };
    float squares = 0.0f;
    for_each_float4(reinterpret_cast<const float4*>(in), whole, [&](int i, float4 v) {
        *slot(i) = v;
        squares += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    });
    for (int c = 4 * whole + threadIdx.x; c < pitch; c += blockDim.x) {  // the tail, padding
        const float value = c < cols ? in[c] : 0.0f;
        xs[staged_index<kPerVector>(c, pitch)] = value;
        squares += value * value;
    }
    if (norm_weight != nullptr) {  // the same for the whole block
        const float scale = block_rms_scale(squares, in, cols, eps, scratch);
        // Each thread rescales the elements it staged itself: no barrier needed in between.
        for_each_float4(reinterpret_cast<const float4*>(norm_weight), whole, [&](int i, float4 w) {
            const float4 v = *slot(i);
            *slot(i) = make_float4(v.x * scale * w.x, v.y * scale * w.y, v.z * scale * w.z,
                                   v.w * scale * w.w);
        });
        for (int c = 4 * whole + threadIdx.x; c < cols; c += blockDim.x) {
            const int i = staged_index<kPerVector>(c, pitch);
            xs[i] = xs[i] * scale * norm_weight[c];
        }
    }
    __syncthreads();
}

// Asks L2 for the first kMatvecUnroll 16-byte vectors of each of kRows rows that lane
// `lane` will load (vectors lane, lane + 32, ...), without waiting and without registers:
// issued before the input is staged, so that the first weights are on their way from DRAM
// meanwhile.
template <int kRows>
__device__ __forceinline__ void prefetch_first_round(const uint4* const (&rows)[kRows], int lane,
                                                     int vectors) {
#pragma unroll
    for (int u = 0; u < kMatvecUnroll; ++u) {
        const int v = lane + u * kWarpSize;
#pragma unroll
        for (int r = 0; r < kRows; ++r)
            if (v < vectors) prefetch_l2(rows[r] + v);
    }
}

// Dot products of kRows weight rows (16-byte aligned, pitch elements) with the staged
// input, for the calling warp; every lane gets the sums. All 32 lanes must call it.
template <DType D, int kRows>
__device__ __forceinline__ void dot_rows(const uint4* const (&rows)[kRows], const float* xs,
                                         int pitch, float (&sums)[kRows]) {
    using Format = WeightFormat<D>;
    constexpr int kPer = Format::kPerVector;
    const int vectors = row_vectors<D>(pitch);
    const int lane = threadIdx.x % kWarpSize;
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
    for (int first = lane; first < vectors; first += kWarpSize * kMatvecUnroll) {
        // All loads of this round first (kRows * kMatvecUnroll in flight), then the math.
        uint4 raw[kRows][kMatvecUnroll];
#pragma unroll
        for (int u = 0; u < kMatvecUnroll; ++u) {
            const int v = first + u * kWarpSize;
#pragma unroll
            for (int r = 0; r < kRows; ++r)
                raw[r][u] = v < vectors ? __ldcs(rows[r] + v) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kMatvecUnroll; ++u) {
            const int v = first + u * kWarpSize;
            if (v < vectors) {
                float x[kPer];
                load_staged<kPer>(xs, v, pitch, x);
#pragma unroll
                for (int r = 0; r < kRows; ++r) {
                    float w[kPer];
                    Format::unpack(raw[r][u], w);
#pragma unroll
                    for (int e = 0; e < kPer; ++e) acc[r] = fmaf(w[e], x[e], acc[r]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) sums[r] = warp_sum(acc[r]);
}

// The outputs of the block's row set `set`, kRowsPerWarp rows per warp: lane 0 of warp w
// gives values[i] for row set * warps * kRowsPerWarp + i * warps + w (so the set's rows are
// consecutive); the first warps * kRowsPerWarp threads then store them with one coalesced
// access, adding bias[r] when given and, with kAccumulate, the row's previous out[r].
// `results` is warps * kRowsPerWarp floats of shared memory. Every thread of the block calls
// it.
template <bool kAccumulate, int kRowsPerWarp>
__device__ __forceinline__ void store_warp_rows(float* __restrict__ out,
                                                const float (&values)[kRowsPerWarp], float* results,
                                                const float* __restrict__ bias, int rows, int set) {
    const int warps = blockDim.x / kWarpSize, warp = threadIdx.x / kWarpSize;
    if (threadIdx.x % kWarpSize == 0) {
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) results[i * warps + warp] = values[i];
    }
    __syncthreads();
    const int block_rows = warps * kRowsPerWarp;
    if (int(threadIdx.x) < block_rows) {
        const int r = set * block_rows + threadIdx.x;
        if (r < rows) {
            const float sum =
                bias != nullptr ? results[threadIdx.x] + bias[r] : results[threadIdx.x];
            out[r] = kAccumulate ? out[r] + sum : sum;
        }
    }
}

// As above with one row per warp and a row set per block: warp w's `value` is row
// blockIdx.x * warps + w.
template <bool kAccumulate>
__device__ __forceinline__ void store_warp_rows(float* __restrict__ out, float value,
                                                float* results, const float* __restrict__ bias,
                                                int rows) {
    const float values[1] = {value};
    store_warp_rows<kAccumulate, 1>(out, values, results, bias, rows, blockIdx.x);
}

// The block's part of matvec_kernel: out[r] for its row set (rows blockIdx.x * warps ..),
// one warp per row. Every thread of the block calls it.
template <DType D, bool kAccumulate>
__device__ __forceinline__ void matvec_rows_of_block(float* __restrict__ out,
                                                     const void* __restrict__ weights, int rows,
                                                     int pitch, const float* __restrict__ in,
                                                     int cols,
                                                     const float* __restrict__ norm_weight,
                                                     float eps, const float* __restrict__ bias) {
    __shared__ float scratch[kWarpSize];
    __shared__ float results[kMatvecMaxWarps];
    const int warps = blockDim.x / kWarpSize, warp = threadIdx.x / kWarpSize;
    const int row = blockIdx.x * warps + warp;
    const bool has_row = row < rows;  // the same for the whole warp
    // The first weights are requested before the input is staged (row 0's address, never
    // read, for a warp past the last row).
    const uint4* const row_pointer[1] = {weight_row<D>(weights, has_row ? row : 0, pitch)};
    if (has_row)
        prefetch_first_round<1>(row_pointer, threadIdx.x % kWarpSize, row_vectors<D>(pitch));
    finish_prologue();  // the input and out: the kernels ahead wrote them

    float* xs = dynamic_shared_floats();
    stage_input<WeightFormat<D>::kPerVector>(xs, in, cols, pitch, norm_weight, eps, scratch);

    float sum[1] = {0.0f};
    if (has_row) dot_rows<D, 1>(row_pointer, xs, pitch, sum);
    store_warp_rows<kAccumulate>(out, sum[0], results, bias, rows);
}

// out[r] = (kAccumulate ? out[r] : 0) + (W[r, :] · stage(in) + bias[r]), r in [0, rows), no
// bias term when bias is null.
// Launch: grid ceil(rows / warps), block warps * 32 threads (warps = matvec_warps(pitch),
// one warp per row), dynamic shared memory pitch * 4 bytes (the staged input).
template <DType D, bool kAccumulate>
__global__ void __launch_bounds__(kMatvecThreadsMax)
    matvec_kernel(float* __restrict__ out, const void* __restrict__ weights, int rows, int pitch,
                  const float* __restrict__ in, int cols, const float* __restrict__ norm_weight,
                  float eps, const float* __restrict__ bias) {
    matvec_rows_of_block<D, kAccumulate>(out, weights, rows, pitch, in, cols, norm_weight, eps,
                                         bias);
}

// out[r] = act(W1[r, :] · stage(in)) * (W3[r, :] · stage(in)), act of A (gated_value).
// Launch: as matvec_kernel (grid ceil(rows / warps), block warps * 32, shared pitch * 4 B);
// each warp reads its row of both matrices, 2 * kMatvecUnroll loads in flight per lane.
template <DType D, Activation A>
__global__ void __launch_bounds__(kMatvecThreadsMax)
    matvec_swiglu_kernel(float* __restrict__ out, const void* __restrict__ w1,
                         const void* __restrict__ w3, int rows, int pitch,
                         const float* __restrict__ in, int cols,
                         const float* __restrict__ norm_weight, float eps) {
    __shared__ float scratch[kWarpSize];
    __shared__ float results[kMatvecMaxWarps];
    const int warps = blockDim.x / kWarpSize, warp = threadIdx.x / kWarpSize;
    const int row = blockIdx.x * warps + warp;
    const bool has_row = row < rows;         // the same for the whole warp
    const int safe_row = has_row ? row : 0;  // as in matvec_kernel
    const uint4* const row_pointers[2] = {weight_row<D>(w1, safe_row, pitch),
                                          weight_row<D>(w3, safe_row, pitch)};
    if (has_row)
        prefetch_first_round<2>(row_pointers, threadIdx.x % kWarpSize, row_vectors<D>(pitch));
    finish_prologue();

    float* xs = dynamic_shared_floats();
    stage_input<WeightFormat<D>::kPerVector>(xs, in, cols, pitch, norm_weight, eps, scratch);

    float value = 0.0f;
    if (has_row) {
        float sums[2];
        dot_rows<D, 2>(row_pointers, xs, pitch, sums);
        value = gated_value<A>(/*gate=*/sums[0], /*up=*/sums[1]);
    }
    store_warp_rows</*kAccumulate=*/false>(out, value, results, /*bias=*/nullptr, rows);
}

// ---- Launch shapes (matvec_kernel and matvec_swiglu_kernel)

inline dim3 matvec_grid(int rows, int pitch) {
    const int warps = matvec_warps(pitch);
    return dim3((rows + warps - 1) / warps);
}
inline dim3 matvec_block(int pitch) { return dim3(matvec_warps(pitch) * kWarpSize); }

#ifdef BARELLM_LAUNCH_FUNCTIONS

namespace {

template <DType D>
void launch_matvec(float* out, const DeviceMatrix& w, const float* in, const float* norm_weight,
                   float eps, const float* bias, bool accumulate, cudaStream_t stream) {
    const dim3 grid = matvec_grid(w.rows, w.pitch), block = matvec_block(w.pitch);
    const size_t shared = staged_input_bytes(w.pitch);
    const auto kernel = accumulate ? matvec_kernel<D, true> : matvec_kernel<D, false>;
    launch_after_previous(kernel, grid, block, shared, stream, out, w.data, w.rows, w.pitch, in,
                          w.cols, norm_weight, eps, bias);
}

template <DType D, Activation A>
void launch_matvec_swiglu(float* out, const DeviceMatrix& w1, const DeviceMatrix& w3,
                          const float* in, const float* norm_weight, float eps,
                          cudaStream_t stream) {
    const dim3 grid = matvec_grid(w1.rows, w1.pitch), block = matvec_block(w1.pitch);
    launch_after_previous(matvec_swiglu_kernel<D, A>, grid, block, staged_input_bytes(w1.pitch),
                          stream, out, w1.data, w3.data, w1.rows, w1.pitch, in, w1.cols,
                          norm_weight, eps);
}

// stage_input reads the input and the norm weight as float4s.
void check_input_alignment(const float* in, const float* norm_weight) {
    auto aligned = [](const float* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    if (!aligned(in) || !aligned(norm_weight))
        throw Error("matvec: the input and the norm weight must be 16-byte aligned");
}

void check_swiglu_shapes(const DeviceMatrix& w1, const DeviceMatrix& w3) {
    if (w1.rows != w3.rows || w1.pitch != w3.pitch || w1.cols != w3.cols || w1.dtype != w3.dtype)
        throw Error("matvec_swiglu: w1 and w3 differ in shape or dtype");
}

}  // namespace

// Q8 and Q4 weights (matvec_quantized.cuh): the launches matvec and matvec_swiglu hand them to
// (QuantizedLaunch{}: the kernels' own choice of launch), their staging's shared memory, and
// the shared-memory allowance of their kernels.
void launch_quantized_matvec(float* out, const DeviceMatrix& w, const float* in,
                             const float* norm_weight, float eps, const float* bias,
                             bool accumulate, QuantizedLaunch launch, cudaStream_t stream);
void launch_quantized_matvec_swiglu(float* out, const DeviceMatrix& w1, const DeviceMatrix& w3,
                                    const float* in, const float* norm_weight, float eps,
                                    Activation activation, QuantizedLaunch launch,
                                    cudaStream_t stream);
inline size_t quantized_staging_bytes(int pitch);
void prepare_quantized_matvec(size_t bytes);
// The block types (matvec_blocks.cuh): the launches matvec and matvec_swiglu hand them to,
// their staging's shared memory, and the shared-memory allowance of their kernels.
void launch_block_matvec(float* out, const DeviceMatrix& w, const float* in,
                         const float* norm_weight, float eps, const float* bias, bool accumulate,
                         QuantizedGrid grid, cudaStream_t stream);
void launch_block_matvec_swiglu(float* out, const DeviceMatrix& w1, const DeviceMatrix& w3,
                                const float* in, const float* norm_weight, float eps,
                                Activation activation, QuantizedGrid grid, cudaStream_t stream);
inline size_t block_staging_bytes(int pitch);
void prepare_block_matvec(size_t bytes);
// The experts' matvecs (moe.cuh): the shared-memory allowance of their kernels.
void prepare_expert_matvec(size_t bytes);

size_t matvec_shared_bytes(int cols, DType dtype) {
    const int pitch = padded_cols(cols, dtype);
    if (is_quantized(dtype)) return quantized_staging_bytes(pitch);
    return is_block_type(dtype) ? block_staging_bytes(pitch) : staged_input_bytes(pitch);
}

void matvec(float* out, const DeviceMatrix& w, const float* in, const float* norm_weight, float eps,
            const float* bias, bool accumulate, cudaStream_t stream) {
    check_input_alignment(in, norm_weight);
    if (is_quantized(w.dtype))
        return launch_quantized_matvec(out, w, in, norm_weight, eps, bias, accumulate,
                                       QuantizedLaunch{}, stream);
    if (is_block_type(w.dtype))
        return launch_block_matvec(out, w, in, norm_weight, eps, bias, accumulate,
                                   QuantizedGrid::kChosen, stream);
    with_weight_dtype(w.dtype, [&](auto dtype) {
        launch_matvec<decltype(dtype)::value>(out, w, in, norm_weight, eps, bias, accumulate,
                                              stream);
    });
    CUDA_CHECK_LAUNCH("matvec_kernel");
}

void matvec_swiglu(float* out, const DeviceMatrix& w1, const DeviceMatrix& w3, const float* in,
                   const float* norm_weight, float eps, Activation activation,
                   cudaStream_t stream) {
    check_swiglu_shapes(w1, w3);
    check_input_alignment(in, norm_weight);
    if (is_quantized(w1.dtype))
        return launch_quantized_matvec_swiglu(out, w1, w3, in, norm_weight, eps, activation,
                                              QuantizedLaunch{}, stream);
    if (is_block_type(w1.dtype))
        return launch_block_matvec_swiglu(out, w1, w3, in, norm_weight, eps, activation,
                                          QuantizedGrid::kChosen, stream);
    with_weight_dtype(w1.dtype, [&](auto dtype) {
        with_activation(activation, [&](auto act) {
            launch_matvec_swiglu<decltype(dtype)::value, decltype(act)::value>(
                out, w1, w3, in, norm_weight, eps, stream);
        });
    });
    CUDA_CHECK_LAUNCH("matvec_swiglu_kernel");
}

void prepare_matvec(size_t bytes) {
    allow_shared_bytes(matvec_kernel<DType::F32, false>, bytes);
    allow_shared_bytes(matvec_kernel<DType::F32, true>, bytes);
    allow_shared_bytes(matvec_kernel<DType::F16, false>, bytes);
    allow_shared_bytes(matvec_kernel<DType::F16, true>, bytes);
    allow_shared_bytes(matvec_kernel<DType::BF16, false>, bytes);
    allow_shared_bytes(matvec_kernel<DType::BF16, true>, bytes);
    for (const Activation activation : {Activation::Silu, Activation::GeluTanh})
        with_activation(activation, [&](auto act) {
            constexpr Activation A = decltype(act)::value;
            allow_shared_bytes(matvec_swiglu_kernel<DType::F32, A>, bytes);
            allow_shared_bytes(matvec_swiglu_kernel<DType::F16, A>, bytes);
            allow_shared_bytes(matvec_swiglu_kernel<DType::BF16, A>, bytes);
        });
    prepare_quantized_matvec(bytes);
    prepare_block_matvec(bytes);
    prepare_expert_matvec(bytes);
}

#endif  // BARELLM_LAUNCH_FUNCTIONS

}  // namespace barellm::cuda
