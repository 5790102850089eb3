// Device helpers shared by the kernels: warp and block reductions (RMSNorm's scale among
// them), 16-byte weight vectors unpacked to f32 (f32, f16, bf16; Q8 and Q4 values as
// integers), and KV-cache element loads and stores (f32 or f16); and the host's dispatch on
// the weights' dtype and the cache's element type (with_weight_dtype, with_quantized_dtype,
// with_kv_type).
#pragma once
#ifdef BARELLM_CUDA_EMULATION
#include "cuda_emulation.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda_check.h"  // CUDA_CHECK, and the runtime API (host code)
#include "kv_cache.h"
#include "util/error.h"
#include "weights/config.h"       // Activation
#include "weights/model.h"        // kQ4Offset
#include "weights/safetensors.h"  // DType

// The launch functions (the host code beside the kernels of each .cuh file) are compiled in
// kernels.cu by nvcc, and by g++ for the emulated backend (BARELLM_EMULATED_BACKEND: `make
// emulated`, tests/emulation/cuda_runtime_emulation.h); the unit tests that include the
// .cuh files on the emulation launch the kernels themselves.
#if !defined(BARELLM_CUDA_EMULATION) || defined(BARELLM_EMULATED_BACKEND)
#define BARELLM_LAUNCH_FUNCTIONS 1
#endif

namespace barellm::cuda {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Sum over the 32 lanes of a warp; every lane gets the result. All 32 lanes must call it.
__device__ __forceinline__ float warp_sum(float value) {
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
        value += __shfl_xor_sync(kFullMask, value, offset);
    return value;
}

__device__ __forceinline__ float warp_max(float value) {
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
        value = fmaxf(value, __shfl_xor_sync(kFullMask, value, offset));
    return value;
}

// Sum within each aligned group of kLanes lanes (lanes l and l ^ offset, offset < kLanes,
// stay in one group); every lane gets its group's sum. All 32 lanes must call it.
template <int kLanes>
__device__ __forceinline__ float group_sum(float value) {
    static_assert(kLanes >= 1 && kLanes <= kWarpSize && (kLanes & (kLanes - 1)) == 0,
                  "kLanes must be a power of two up to 32");
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2)
        value += __shfl_xor_sync(kFullMask, value, offset);
    return value;
}

// Maximum within each aligned group of kLanes lanes, as group_sum.
template <int kLanes>
__device__ __forceinline__ float group_max(float value) {
    static_assert(kLanes >= 1 && kLanes <= kWarpSize && (kLanes & (kLanes - 1)) == 0,
                  "kLanes must be a power of two up to 32");
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2)
        value = fmaxf(value, __shfl_xor_sync(kFullMask, value, offset));
    return value;
}

// `op` (sum or max) over the whole block, starting from `identity`; every thread gets the
// result. blockDim.x must be a multiple of 32 and every thread of the block must call it.
// `scratch` holds 32 floats of shared memory.
template <typename WarpReduce, typename Op>
__device__ __forceinline__ float block_reduce(float value, float* scratch, WarpReduce warp_reduce,
                                              Op op, float identity) {
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int warps = blockDim.x / kWarpSize;
    value = warp_reduce(value);
    if (lane == 0) scratch[warp] = value;
    __syncthreads();
    float total = identity;
    for (int w = 0; w < warps; ++w) total = op(total, scratch[w]);  // same order everywhere
    __syncthreads();  // scratch may be written again after this returns
    return total;
}

__device__ __forceinline__ float block_sum(float value, float* scratch) {
    return block_reduce(
        value, scratch, [](float v) { return warp_sum(v); }, [](float a, float b) { return a + b; },
        0.0f);
}

__device__ __forceinline__ float block_max(float value, float* scratch) {
    return block_reduce(
        value, scratch, [](float v) { return warp_max(v); },
        [](float a, float b) { return fmaxf(a, b); }, -INFINITY);
}

// Squares past f32's range (|x| above about 1.8e19) make an f32 sum of squares infinite, and
// rsqrt of it 0, which would scale every output to 0 (a model whose finite weights overflow
// would then print an empty continuation instead of failing the non-finite logits check).
// Such a vector is summed again with every element scaled by kRmsRescue, an exact power of
// two: no scaled square overflows, and one that underflows is too small to count beside a
// sum past f32's range. The CPU sums such a vector again in double; both give the true norm.
// Only a sum that is +inf is summed again, so the usual path costs one compare.
constexpr float kRmsRescue = 0x1p-100f;

// The RMSNorm scale of n elements whose squares sum to `sum` (f32, +inf when it overflowed),
// or of their rescaled squares `rescued_sum` (the elements times kRmsRescue), where eps no
// longer counts: mean(x²) is past 1e38 / n.
__device__ __forceinline__ float rms_scale_of_sum(float sum, int n, float eps) {
    return 1.0f / sqrtf(sum / float(n) + eps);
}
__device__ __forceinline__ float rms_scale_of_rescued_sum(float rescued_sum, int n) {
    return kRmsRescue / sqrtf(rescued_sum / float(n));
}

// RMSNorm's scale rsqrt(mean(x²) + eps) of in[0, n), from each thread's sum of squares of
// its elements (any share of them); every thread gets it (block_sum's rules apply). When
// the block's sum overflows, the threads sum in[threadIdx.x], in[threadIdx.x + blockDim.x],
// ... again, rescaled (kRmsRescue).
__device__ __forceinline__ float block_rms_scale(float squares, const float* __restrict__ in, int n,
                                                 float eps, float* scratch) {
    const float sum = block_sum(squares, scratch);
    if (sum != INFINITY) return rms_scale_of_sum(sum, n, eps);  // the same in every thread
    float rescued = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float x = in[i] * kRmsRescue;
        rescued += x * x;
    }
    return rms_scale_of_rescued_sum(block_sum(rescued, scratch), n);
}

// block_rms_scale of in[0, n), each thread reading elements threadIdx.x, + blockDim.x, ...
__device__ __forceinline__ float rms_scale(const float* __restrict__ in, int n, float eps,
                                           float* scratch) {
    float squares = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) squares += in[i] * in[i];
    return block_rms_scale(squares, in, n, eps, scratch);
}

// A score soft-capped, cap * tanh(score / cap), where cap > 0 (Gemma 2's attention scores and
// logits); the score itself where cap is 0.
__device__ __forceinline__ float soft_capped(float score, float cap) {
    return cap > 0.0f ? cap * tanhf(score / cap) : score;
}

// The gated feed-forward's value act(gate) * up: SwiGLU, silu(g) = g / (1 + e^-g), or GeGLU
// (Gemma), GELU's tanh approximation gelu(g) = g / 2 * (1 + tanh(sqrt(2 / pi) (g + 0.044715
// g³))). The activation is a template parameter of every kernel that applies it; the fused
// matvec and GEMM kernels take these two (with_activation), the elementwise ones SwigluOai
// too (the three-argument form, with_any_activation).
template <Activation A>
__device__ __forceinline__ float gated_value(float gate, float up) {
    static_assert(A != Activation::SwigluOai, "SwigluOai takes its limit: gated_value(g, u, l)");
    if constexpr (A == Activation::Silu) {
        return gate / (1.0f + expf(-gate)) * up;
    } else {
        constexpr float kSqrt2OverPi = 0.7978845608028654f;
        const float inner = kSqrt2OverPi * (gate + 0.044715f * gate * gate * gate);
        return 0.5f * gate * (1.0f + tanhf(inner)) * up;
    }
}

// gpt-oss's clamped SwiGLU (Activation::SwigluOai): with g = min(gate, limit) and u =
// clamp(up, -limit, limit), g · σ(kSwigluOaiAlpha · g) · (u + 1).
__device__ __forceinline__ float swiglu_oai_value(float gate, float up, float limit) {
    const float g = fminf(gate, limit);
    const float u = fminf(fmaxf(up, -limit), limit);
    return g / (1.0f + expf(-kSwigluOaiAlpha * g)) * (u + 1.0f);
}

// act(gate) * up of any activation; `limit` is SwigluOai's (Config::swiglu_limit), unused by
// the others.
template <Activation A>
__device__ __forceinline__ float gated_value(float gate, float up, float limit) {
    if constexpr (A == Activation::SwigluOai)
        return swiglu_oai_value(gate, up, limit);
    else
        return gated_value<A>(gate, up);
}

// Host side: calls launch(std::integral_constant<Activation, A>{}) for the activation A of a
// fused kernel (SiLU or GeLU; SwigluOai, with its limit, runs as two products and the
// elementwise swiglu or swiglu_rows: refused here, throwing).
template <typename Launch>
void with_activation(Activation activation, Launch launch) {
    if (activation == Activation::SwigluOai)
        throw Error(
            "the fused gate kernels take SiLU and GeLU; SwigluOai runs as two products and "
            "swiglu (or swiglu_rows)");
    if (activation == Activation::GeluTanh)
        return launch(std::integral_constant<Activation, Activation::GeluTanh>{});
    return launch(std::integral_constant<Activation, Activation::Silu>{});
}

// The same for the elementwise kernels, which take SwigluOai too.
template <typename Launch>
void with_any_activation(Activation activation, Launch launch) {
    if (activation == Activation::SwigluOai)
        return launch(std::integral_constant<Activation, Activation::SwigluOai>{});
    with_activation(activation, launch);
}

#ifdef BARELLM_LAUNCH_FUNCTIONS
// The current GPU's figures that launch rules need (gemm's tiles, the Q8/Q4 matvecs' rows
// per warp), queried once.
struct DeviceFigures {
    int compute_capability = 0;  // 10 * major + minor
    int multiprocessors = 0;
    size_t shared_bytes_per_block = 0;  // with opt-in (cudaFuncSetAttribute)
};

inline const DeviceFigures& current_device() {
    static const DeviceFigures device = [] {
        int id = 0, major = 0, minor = 0, multiprocessors = 0, shared = 0;
        CUDA_CHECK(cudaGetDevice(&id));
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, id));
        CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, id));
        CUDA_CHECK(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, id));
        CUDA_CHECK(cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, id));
        return DeviceFigures{10 * major + minor, multiprocessors, size_t(shared)};
    }();
    return device;
}

// Lets `kernel` launch with `bytes` of dynamic shared memory: above 48 KiB a kernel must
// opt in.
template <typename Kernel>
void allow_shared_bytes(Kernel kernel, size_t bytes) {
    CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...), the arguments converted to the
// kernel's parameter types (on the emulation: run on its stream, cuda_runtime_emulation.h).
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, Args... args) {
#ifdef BARELLM_CUDA_EMULATION
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream;
    cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
#else
    // (clang-format reads the closing >>> of this launch as three >)
    // clang-format off
    kernel<<<grid, block, shared_bytes, stream>>>(static_cast<Params>(args)...);
    // clang-format on
#endif
}
#endif  // BARELLM_LAUNCH_FUNCTIONS

#ifndef BARELLM_CUDA_EMULATION
// Asks L2 for the line holding `address` without waiting for it and without a register (a
// hint: what later loads read is unchanged). The emulation supplies its own.
__device__ __forceinline__ void prefetch_l2(const void* address) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(address));
}
#endif

// Dynamic shared memory of a kernel as floats, 16-byte aligned (one declaration for all
// kernels, as CUDA requires of extern __shared__ arrays).
__device__ __forceinline__ float* dynamic_shared_floats() {
#ifdef BARELLM_CUDA_EMULATION
    return emulation::dynamic_shared_memory();
#else
    extern __shared__ float4 dynamic_shared_memory[];
    return reinterpret_cast<float*>(dynamic_shared_memory);
#endif
}

__device__ __forceinline__ float half_bits_to_float(uint32_t bits16) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits16)));
}

// bf16 is the top half of an f32: widening is exact.
__device__ __forceinline__ float bf16_bits_to_float(uint32_t bits16) {
    return __uint_as_float(bits16 << 16);
}

// Bytes per element of a weight dtype, at compile time.
template <DType D>
constexpr size_t dtype_size_v = D == DType::F32 ? 4 : 2;

// How a weight dtype is read: kPerVector elements per 16-byte vector, unpacked to f32.
template <DType D>
struct WeightFormat;

template <>
struct WeightFormat<DType::F32> {
    static constexpr int kPerVector = 4;
    __device__ static __forceinline__ void unpack(const uint4& v, float (&out)[4]) {
        out[0] = __uint_as_float(v.x);
        out[1] = __uint_as_float(v.y);
        out[2] = __uint_as_float(v.z);
        out[3] = __uint_as_float(v.w);
    }
    __device__ static __forceinline__ float element(const void* row, int i) {
        return static_cast<const float*>(row)[i];
    }
};

// The 8 16-bit elements of a 16-byte vector as f32, each converted by widen(bits16): element
// 2k is the low half of word k (little-endian storage).
template <typename Widen>
__device__ __forceinline__ void unpack_16bit(const uint4& v, float (&out)[8], Widen widen) {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        out[2 * k] = widen(words[k] & 0xffffu);
        out[2 * k + 1] = widen(words[k] >> 16);
    }
}

template <>
struct WeightFormat<DType::F16> {
    static constexpr int kPerVector = 8;
    __device__ static __forceinline__ void unpack(const uint4& v, float (&out)[8]) {
        unpack_16bit(v, out, half_bits_to_float);
    }
    __device__ static __forceinline__ float element(const void* row, int i) {
        return half_bits_to_float(static_cast<const uint16_t*>(row)[i]);
    }
};

template <>
struct WeightFormat<DType::BF16> {
    static constexpr int kPerVector = 8;
    __device__ static __forceinline__ void unpack(const uint4& v, float (&out)[8]) {
        unpack_16bit(v, out, bf16_bits_to_float);
    }
    __device__ static __forceinline__ float element(const void* row, int i) {
        return bf16_bits_to_float(static_cast<const uint16_t*>(row)[i]);
    }
};

// How a quantized weight dtype is read (kernels.h, DeviceMatrix): kPerVector columns per
// 16-byte vector of a row; row_bytes(pitch) bytes of values per row; value(row, c), the
// signed integer weight of column c of a row (times the block's scale it is the weight).
template <DType D>
struct QuantizedFormat;

// Q8: one int8 per column.
template <>
struct QuantizedFormat<DType::Q8_0> {
    static constexpr int kPerVector = 16;
    __host__ __device__ static constexpr size_t row_bytes(int pitch) { return size_t(pitch); }
    __device__ static __forceinline__ int value(const void* row, int c) {
        return static_cast<const int8_t*>(row)[c];
    }
};

// Q4: a 16-byte vector is one block of 32 columns; byte j holds column j (low nibble) and
// column j + 16 (high nibble), each as q + 8 (model.h: kQ4Offset).
template <>
struct QuantizedFormat<DType::Q4_0> {
    static constexpr int kPerVector = 32;
    static constexpr uint32_t kLowNibbles = 0x0f0f0f0fu;
    __host__ __device__ static constexpr size_t row_bytes(int pitch) { return size_t(pitch) / 2; }
    __device__ static __forceinline__ int value(const void* row, int c) {
        const int within = c % kPerVector, half_block = kPerVector / 2;
        const uint8_t byte =
            static_cast<const uint8_t*>(row)[c / kPerVector * half_block + within % half_block];
        return (within < half_block ? byte & 0x0f : byte >> 4) - kQ4Offset;
    }
};

// KV-cache elements: stored as f32 or f16 (round to nearest even, as the CPU's
// float_to_half). The fast kernels read them in pairs (half2 / float2): head_dim and kv_dim
// are even, so a pair never straddles a 4-byte (f16) or 8-byte (f32) boundary; the ladder's
// naive attention reads one element at a time.
__device__ __forceinline__ void kv_store(float* slot, float value) { *slot = value; }
__device__ __forceinline__ void kv_store(__half* slot, float value) {
    *slot = __float2half_rn(value);
}
__device__ __forceinline__ float kv_float(float element) { return element; }
__device__ __forceinline__ float kv_float(__half element) { return __half2float(element); }
template <typename KvT>
__device__ __forceinline__ float kv_load(const KvT* row, int i) {
    return kv_float(row[i]);
}
__device__ __forceinline__ float2 kv_load_pair(const float* row, int pair) {
    return reinterpret_cast<const float2*>(row)[pair];
}
__device__ __forceinline__ float2 kv_load_pair(const __half* row, int pair) {
    return __half22float2(reinterpret_cast<const __half2*>(row)[pair]);
}

// Host side: calls launch(std::integral_constant<DType, D>{}) for the weights' dtype D.
template <typename Launch>
void with_weight_dtype(DType dtype, Launch launch) {
    switch (dtype) {
        case DType::F32:
            return launch(std::integral_constant<DType, DType::F32>{});
        case DType::F16:
            return launch(std::integral_constant<DType, DType::F16>{});
        case DType::BF16:
            return launch(std::integral_constant<DType, DType::BF16>{});
        default:
            throw Error("this CUDA kernel reads f32, f16 and bf16 weights, not quantized ones");
    }
}

// Host side: calls launch(std::integral_constant<DType, D>{}) for a quantized dtype D (I8 or
// U8).
template <typename Launch>
void with_quantized_dtype(DType dtype, Launch launch) {
    if (dtype == DType::Q8_0) return launch(std::integral_constant<DType, DType::Q8_0>{});
    if (dtype == DType::Q4_0) return launch(std::integral_constant<DType, DType::Q4_0>{});
    throw Error("with_quantized_dtype: the weights are not Q8 or Q4");
}

// Host side: calls launch(KvT{}) with KvT the cache's element type (float or __half).
template <typename Launch>
void with_kv_type(KvType kv_type, Launch launch) {
    if (kv_type == KvType::F32)
        launch(float{});
    else
        launch(__half{});
}

}  // namespace barellm::cuda
