// A CPU emulation of the CUDA execution model, for running the device code of kernels/ in the
// unit tests with g++ (no GPU, and under AddressSanitizer). Included instead of the CUDA
// headers when BARELLM_CUDA_EMULATION is defined (kernels/common.cuh, tensor_core.cuh,
// kernels.h, cuda_check.h); the kernels' host launch functions are compiled then only for the
// emulated backend (BARELLM_EMULATED_BACKEND, `make emulated`), on the CUDA runtime of
// cuda_runtime_emulation.h, included at the end of this file.
//
// - emulate_launch(grid, block, dynamic_shared_bytes, kernel, args...) runs a kernel: the
//   blocks one after another (x fastest, then y, then z), each block's threads as fibers
//   (user-level threads with their own stacks) on the calling thread. A fiber runs until it
//   waits at a barrier or a warp instruction; the scheduler then runs the next ready fiber,
//   going through the threads in increasing order and in decreasing order on alternate
//   __syncthreads phases, so that a read that misses a barrier sees stale data whichever of
//   the two threads comes first. Everything is deterministic.
// - emulate_cluster_launch runs clusters of blocks one after another, the blocks of a
//   cluster at once (their threads in one pass after another, block by block), each with its
//   own dynamic shared memory. wgmma_emulation.h adds the sm_90 instructions that clusters
//   serve (wgmma, mbarriers, tensor copies, the cluster barrier).
// - __syncthreads is a block barrier; a thread that has returned no longer counts. A barrier
//   that can never complete (every thread left waits, at different barriers) is a deadlock:
//   the launch throws barellm::Error naming who waits where (detected when it happens: no
//   timeout is needed). So do misuses the emulation detects: a warp instruction in a partial
//   warp or with a lane exited, lanes of one warp at different warp instructions, a mask
//   other than the full one, misaligned ldmatrix and cp.async addresses, addresses outside
//   shared memory where shared memory is required, and __trap().
// - __shared__ arrays are function-scope statics (one block runs at a time, except in a
//   cluster launch, whose kernels keep to dynamic shared memory), tagged so that
//   the emulation finds them in the program's symbol table. They and the dynamic shared
//   memory (dynamic_shared_floats) are filled with 0xff bytes (NaN as f32, f16 and bf16)
//   before each block, as uninitialised shared memory. ldmatrix and cp.async check that
//   their shared addresses lie in them. (Without a symbol table, a stripped binary, static
//   arrays are not poisoned and any static data counts as shared.)
// - Warp instructions (shuffles, __syncwarp, ldmatrix, mma) are exchanges: each lane deposits
//   its operands, and the last lane to arrive computes every lane's result at once (so
//   ldmatrix reads shared memory at one instant, as the instruction does).
// - cp.async (copy_async_16) is asynchronous as on sm_80+: a copy is queued by its thread and
//   performed only when copy_async_wait retires its group, so a read before the right wait
//   sees the old contents. Copies still pending when the thread returns are dropped.
// - Atomics, loads and math are plain host operations (one fiber runs at a time). A thread
//   that spins on memory another thread writes never lets that thread run: such waits
//   (outside the primitive set kernels/ keeps to) hang.
// - Programmatic dependent launch (kernels/dependent_launch.cuh): finish_prologue is a block
//   barrier; under an EarlyLaunchCheck, what the kernels ahead wrote reads as poison before
//   it (below).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "weights/half.h"
#include "weights/safetensors.h"  // DType

// ---- Qualifiers. A kernel is a static inline function: a header may define it for several
// tests, and the kernel's own name stays inside the test's translation unit (nvcc's objects,
// linked into the same program, define host stubs of the kernels under the same names).
#define __global__ static inline
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__
// The ABI tag marks the arrays' names in the symbol table, where the emulation finds them.
#define __shared__ static __attribute__((abi_tag("barellm_shared")))

// ---- The runtime types kernels.h declares its (host-only) launch functions with
struct CUstream_st;
using cudaStream_t = CUstream_st*;
enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorStreamCaptureUnsupported = 900,
};
using cudaError_t = cudaError;

// ---- Vector types
struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(8) int2 {
    int x, y;
};
struct alignas(8) float2 {
    float x, y;
};

inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline float2 make_float2(float x, float y) { return {x, y}; }

// ---- 16-bit floats: storage types and exact conversions (round to nearest even)
struct __half {
    unsigned short bits;
};
struct alignas(4) __half2 {
    __half x, y;
};
struct __nv_bfloat16 {
    unsigned short bits;
};
struct alignas(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

inline __half __float2half_rn(float value) { return {barellm::float_to_half(value)}; }
inline __half __float2half(float value) { return __float2half_rn(value); }
inline float __half2float(__half value) { return barellm::half_to_float(value.bits); }
inline __half __ushort_as_half(unsigned short bits) { return {bits}; }
inline unsigned short __half_as_ushort(__half value) { return value.bits; }
inline __half2 __floats2half2_rn(float low, float high) {
    return {__float2half_rn(low), __float2half_rn(high)};
}
inline __half2 __float22half2_rn(float2 value) { return __floats2half2_rn(value.x, value.y); }
inline float2 __half22float2(__half2 value) {
    return {__half2float(value.x), __half2float(value.y)};
}
inline float __low2float(__half2 value) { return __half2float(value.x); }
inline float __high2float(__half2 value) { return __half2float(value.y); }

inline __nv_bfloat16 __float2bfloat16_rn(float value) {
    uint32_t bits = barellm::float_to_bits(value);
    constexpr uint32_t kQuietBit = 0x40;
    if ((bits & 0x7fffffffu) > 0x7f800000u) return {uint16_t((bits >> 16) | kQuietBit)};  // nan
    bits += 0x7fffu + ((bits >> 16) & 1u);  // round the dropped 16 bits, ties to even
    return {uint16_t(bits >> 16)};
}
inline __nv_bfloat16 __float2bfloat16(float value) { return __float2bfloat16_rn(value); }
inline float __bfloat162float(__nv_bfloat16 value) { return barellm::bf16_to_float(value.bits); }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) { return {bits}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 value) { return value.bits; }
inline __nv_bfloat162 __floats2bfloat162_rn(float low, float high) {
    return {__float2bfloat16_rn(low), __float2bfloat16_rn(high)};
}
inline float2 __bfloat1622float2(__nv_bfloat162 value) {
    return {__bfloat162float(value.x), __bfloat162float(value.y)};
}

// ---- Reinterpretation and math
inline float __uint_as_float(unsigned bits) { return barellm::bits_to_float(bits); }
inline unsigned __float_as_uint(float value) { return barellm::float_to_bits(value); }
inline float __int_as_float(int bits) { return barellm::bits_to_float(uint32_t(bits)); }
inline int __float_as_int(float value) { return int(barellm::float_to_bits(value)); }

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __exp10f(float x) { return std::pow(10.0f, x); }
inline float __logf(float x) { return std::log(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __fmaf_rn(float x, float y, float z) { return std::fma(x, y, z); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }

// CUDA's global min and max of device code, for operands of one type.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }

template <typename T>
inline T __ldg(const T* p) {
    return *p;
}
template <typename T>
inline T __ldcs(const T* p) {
    return *p;
}
template <typename T>
inline T __ldcg(const T* p) {
    return *p;
}

// c + the dot product of a's and b's four bytes, each a signed 8-bit integer (the sum wraps
// as the hardware's 32-bit addition does).
inline int __dp4a(int a, int b, int c) {
    uint32_t sum = uint32_t(c);
    for (int byte = 0; byte < 4; ++byte) {
        const int product =
            int(int8_t(uint32_t(a) >> (8 * byte))) * int(int8_t(uint32_t(b) >> (8 * byte)));
        sum += uint32_t(product);
    }
    return int(sum);
}

// The bytes of x (bytes 0-3) and y (bytes 4-7) that the low 16 bits of s select, a nibble for
// each byte of the result; a nibble with bit 3 set gives its byte's sign bit in all 8 bits.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t bytes = uint64_t(x) | uint64_t(y) << 32;
    unsigned result = 0;
    for (int byte = 0; byte < 4; ++byte) {
        const unsigned selector = s >> (4 * byte) & 0xfu;
        unsigned value = unsigned(bytes >> (8 * (selector & 7u))) & 0xffu;
        if (selector & 8u) value = value & 0x80u ? 0xffu : 0u;
        result |= value << (8 * byte);
    }
    return result;
}

// The number of bits set in x.
inline int __popc(unsigned x) { return __builtin_popcount(x); }

// One fiber runs at a time: atomics are plain read-modify-writes (unsigned arithmetic for
// int, as the hardware wraps).
inline int atomicAdd(int* address, int value) {
    const int old = *address;
    *address = int(unsigned(old) + unsigned(value));
    return old;
}
inline unsigned atomicAdd(unsigned* address, unsigned value) {
    const unsigned old = *address;
    *address = old + value;
    return old;
}
inline float atomicAdd(float* address, float value) {
    const float old = *address;
    *address = old + value;
    return old;
}
inline void __threadfence() {}

// ---- The emulation's runtime (cuda_emulation.cpp)
namespace barellm::cuda::emulation {

// Ends the calling thread's kernel: the launch fails with `message` (where it happened added).
[[noreturn]] void fault(const char* message);

// The block and warp primitives; each must be called from inside emulate_launch.
void block_barrier();
void warp_barrier(unsigned mask);
// The value of lane `source_lane` of this warp's `value` (all 32 lanes call it, each naming its
// own source; a lane outside the warp's range gets its own value back).
uint64_t warp_shuffle(unsigned mask, uint64_t value, int source_lane);
void load_matrices(uint32_t* registers, int matrices, bool transposed, const void* row);
void tensor_core_mma(DType type, float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
void copy_async(void* shared, const void* global, bool valid);
void copy_async_commit();
void copy_async_wait(int pending_groups);
float* dynamic_shared_memory();
// This thread's lane in its warp.
int lane_index();

// Runs `thread_body` for every thread of every block, in clusters of `cluster` blocks.
void run_grid(dim3 grid, dim3 cluster, dim3 block, size_t dynamic_shared_bytes,
              const std::function<void()>& thread_body);

// Whether [address, address + bytes) lies in shared memory (static or dynamic).
bool is_shared(const void* address, size_t bytes);

// kernels/dependent_launch.cuh's finish_prologue: a block barrier, after which the memory an
// EarlyLaunchCheck holds back reads as it is.
void grid_dependency_wait();

// The rule of a programmatic dependent launch (kernels/dependent_launch.cuh), checked: while
// an EarlyLaunchCheck lives, every block of a launch (clusters of one block only) starts with
// its regions (what the kernels ahead of the launch wrote) saved and filled with 0xff bytes
// (NaN as f32, f16 and bf16; -1 as integers), and gets them back once all its threads have
// reached finish_prologue, or at its end if they never do. A kernel that reads a region
// before finish_prologue reads poison; one that writes it there loses the write.
struct MemoryRegion {
    void* begin;
    size_t bytes;
};
class EarlyLaunchCheck {
public:
    explicit EarlyLaunchCheck(std::vector<MemoryRegion> regions);
    ~EarlyLaunchCheck();
    EarlyLaunchCheck(const EarlyLaunchCheck&) = delete;
    EarlyLaunchCheck& operator=(const EarlyLaunchCheck&) = delete;

    void hold_back();  // a block starts: save and poison the regions
    void give_back();  // restore them (once per hold_back)

private:
    std::vector<MemoryRegion> regions_;
    std::vector<std::vector<unsigned char>> saved_;
    bool held_ = false;
};

}  // namespace barellm::cuda::emulation

// ---- Built-in variables (set by the scheduler for the fiber it runs)
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

// ---- Block and warp primitives
inline void __syncthreads() { barellm::cuda::emulation::block_barrier(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    barellm::cuda::emulation::warp_barrier(mask);
}
[[noreturn]] inline void __trap() { barellm::cuda::emulation::fault("__trap()"); }

namespace barellm::cuda::emulation {

constexpr int kWarpLanes = 32;

template <typename T>
T shuffle_from(unsigned mask, T value, int source_lane) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(uint64_t),
                  "shuffles of values up to 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof value);
    bits = warp_shuffle(mask, bits, source_lane);
    T result;
    std::memcpy(&result, &bits, sizeof result);
    return result;
}

}  // namespace barellm::cuda::emulation

// As CUDA: `width` splits the warp into segments of that many lanes; a source past the calling
// lane's segment (or, for up and down, outside it) gives the lane its own value.
template <typename T>
T __shfl_sync(unsigned mask, T value, int source, int width = 32) {
    const int lane = barellm::cuda::emulation::lane_index();
    const int segment_start = lane & ~(width - 1);
    return barellm::cuda::emulation::shuffle_from(mask, value,
                                                  segment_start + (source & (width - 1)));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
    const int lane = barellm::cuda::emulation::lane_index();
    const int source = lane ^ lane_mask;
    const bool later_segment = source >= (lane & ~(width - 1)) + width;
    return barellm::cuda::emulation::shuffle_from(mask, value, later_segment ? lane : source);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = 32) {
    const int lane = barellm::cuda::emulation::lane_index();
    const bool inside = (lane & (width - 1)) + int(delta) < width;
    return barellm::cuda::emulation::shuffle_from(mask, value, inside ? lane + int(delta) : lane);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = 32) {
    const int lane = barellm::cuda::emulation::lane_index();
    const bool inside = (lane & (width - 1)) >= int(delta);
    return barellm::cuda::emulation::shuffle_from(mask, value, inside ? lane - int(delta) : lane);
}

// ---- The wrappers of kernels/tensor_core.cuh (and common.cuh's prefetch_l2), same names and
// contracts
namespace barellm::cuda {

inline void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
    emulation::load_matrices(r, 4, false, row);
}
inline void ldmatrix_x2(uint32_t (&r)[2], const void* row) {
    emulation::load_matrices(r, 2, false, row);
}
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
    emulation::load_matrices(r, 4, true, row);
}
inline void ldmatrix_x2_trans(uint32_t (&r)[2], const void* row) {
    emulation::load_matrices(r, 2, true, row);
}

// c += a · b for a 16x8x16 tile; each c element is c + a[row][0] b[0][col] + ... +
// a[row][15] b[15][col], added in that order in f32 (the products of 16-bit values are exact).
template <DType kType>
void mma_16x8x16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    static_assert(kType == DType::F16 || kType == DType::BF16, "mma takes f16 or bf16");
    emulation::tensor_core_mma(kType, c, a, b);
}

// kernels/common.cuh's prefetch_l2: a hint that changes no value read, so nothing to do.
inline void prefetch_l2(const void*) {}

inline void copy_async_16(void* shared, const void* global, bool valid) {
    emulation::copy_async(shared, global, valid);
}
inline void copy_async_commit() { emulation::copy_async_commit(); }
template <int kPending>
void copy_async_wait() {
    emulation::copy_async_wait(kPending);
}

// Runs kernel(args...) on a grid of `grid` blocks of `block` threads in clusters of
// `cluster` blocks, with `dynamic_shared_bytes` of dynamic shared memory, as a launch with
// that cluster dimension would (the arguments converted to the kernel's parameter types, one
// copy per thread): the blocks of a cluster run at once, each with its own dynamic shared
// memory (static __shared__ arrays are one per program: a cluster's kernel keeps to dynamic
// shared memory). Throws barellm::Error when the emulation detects a fault.
template <typename... Params, typename... Args>
void emulate_cluster_launch(dim3 grid, dim3 cluster, dim3 block, size_t dynamic_shared_bytes,
                            void (*kernel)(Params...), Args&&... args) {
    static_assert(sizeof...(Params) == sizeof...(Args), "one argument per kernel parameter");
    const std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
    emulation::run_grid(grid, cluster, block, dynamic_shared_bytes,
                        [&] { std::apply(kernel, params); });
}

// The same with the thread's work given as a callable (a lambda calling device code).
template <typename Body>
void emulate_cluster_launch(dim3 grid, dim3 cluster, dim3 block, size_t dynamic_shared_bytes,
                            Body body) {
    emulation::run_grid(grid, cluster, block, dynamic_shared_bytes, std::function<void()>(body));
}

// emulate_cluster_launch without clusters, as kernel<<<grid, block, bytes>>>(args...) runs
// (kernel: a kernel or a callable).
template <typename Kernel, typename... Args>
void emulate_launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes, Kernel&& kernel,
                    Args&&... args) {
    emulate_cluster_launch(grid, dim3(1), block, dynamic_shared_bytes, std::forward<Kernel>(kernel),
                           std::forward<Args>(args)...);
}

}  // namespace barellm::cuda

#include "cuda_runtime_emulation.h"  // the host API, on this emulation
