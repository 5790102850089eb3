// The sm_90a (Hopper) instructions behind the warpgroup GEMM (gemm_warpgroup.cuh), each
// wrapped in one small function, as tensor_core.cuh wraps mma.sync and cp.async:
// - wgmma.mma_async: a warpgroup (4 warps, 128 threads) multiplies a 64 x 16 tile of A by a
//   16 x N tile of B into 64 x N f32 accumulators held in its registers, reading A and B
//   straight from shared memory through matrix descriptors; asynchronous, in groups
//   (warpgroup_commit, warpgroup_wait).
// - mbarrier: a barrier in shared memory that completes a phase when its expected arrivals
//   and its expected bytes of copies have come in; waited for by phase parity.
// - cp.async.bulk.tensor (TMA): one thread copies a whole box of a 2-D tensor (a CUtensorMap
//   made on the host) into shared memory, optionally into the same place of several blocks
//   of a cluster (multicast), and counts its bytes on an mbarrier there.
// - Clusters: the block's rank, remote mbarrier arrivals, and a cluster-wide barrier.
//
// Matrix descriptors (PTX ISA, "Matrix Descriptor Format"): bits 0-13 the start address,
// 16-29 the leading (K) byte offset, 32-45 the stride (M/N) byte offset, all in units of 16
// bytes; bits 62-63 the swizzle mode (1: the 128-byte swizzle). Operands here are K-major
// (each row of A or B holds consecutive K elements) in the 128-byte swizzle, as the TMA
// writes them: row r of the operand at byte 128 r, its 16-byte chunk c at chunk c ^ (r % 8)
// of the row, groups of 8 rows 1024 bytes apart (the stride offset). The tensor cores undo
// the XOR from the address bits, so the operand starts on 1024 bytes, and a K step of 16
// columns moves the start 32 bytes within the row (the leading offset is unused).
//
// Accumulators (wgmma m64nNk16 D fragments): warp w of the warpgroup holds rows
// 16 w .. 16 w + 15, lane 4 g + t the elements (g, 8 j + 2 t), (g, 8 j + 2 t + 1),
// (g + 8, 8 j + 2 t), (g + 8, 8 j + 2 t + 1) in d[4 j .. 4 j + 3].
//
// The instructions exist for sm_90a only (__CUDA_ARCH_FEAT_SM90_ALL), and on the CPU
// emulation of the unit tests (BARELLM_CUDA_EMULATION: tests/emulation/wgmma_emulation.h
// supplies the same functions); BARELLM_WARPGROUP_INSTRUCTIONS says where they are. Their
// callers guard their bodies with it and trap elsewhere.
//
// Host side: tensor_map_encoder, the driver's cuTensorMapEncodeTiled that the TMA's maps
// are made with.
#pragma once
#include <cstdint>

#include "weights/safetensors.h"    // DType
#include "tensor_core.cuh"  // shared_address

#ifdef BARELLM_CUDA_EMULATION
#include "wgmma_emulation.h"
#else
#include <cuda.h>          // CUtensorMap
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000

#include "cuda_check.h"
#include "util/error.h"
#endif

#if defined(BARELLM_CUDA_EMULATION) || \
    (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
#define BARELLM_WARPGROUP_INSTRUCTIONS 1
#endif

namespace barellm::cuda {

constexpr int kWarpgroupThreads = 128;  // 4 warps
// The 128-byte swizzle (above): a row of the operand, and the 8 rows over which the XOR
// pattern repeats (a swizzled operand starts on this many bytes).
constexpr int kSwizzleRowBytes = 128;
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes;

#ifdef BARELLM_WARPGROUP_INSTRUCTIONS

// The descriptor of a K-major operand in the 128-byte swizzle starting at `start` (above).
__device__ __forceinline__ uint64_t swizzled_descriptor(const void* start) {
    constexpr uint64_t kField = 0x3fff;  // 14 bits
    constexpr uint64_t kSwizzle128 = 1;
    constexpr int kLeadingShift = 16, kStrideShift = 32, kSwizzleShift = 62;
    constexpr int kUnit = 16;  // bytes per unit of the address fields
    constexpr uint64_t kUnusedLeading = 1;
    return (uint64_t(shared_address(start) / kUnit) & kField) | kUnusedLeading << kLeadingShift |
           (uint64_t(kSwizzleAtomBytes / kUnit) & kField) << kStrideShift |
           kSwizzle128 << kSwizzleShift;
}

#endif  // BARELLM_WARPGROUP_INSTRUCTIONS

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)  // the instructions

// The accumulators of one instruction as asm operands, for n = 128, 192, 224 and 256 (64,
// 96, 112 and 128 registers): their names in the instruction ("%0, %1, ...") and their
// bindings to d[0], d[1], ... (read and written).
#define BARELLM_WGMMA_NAMES_64                                          \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "           \
    "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, " \
    "%26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, " \
    "%39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, " \
    "%52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define BARELLM_WGMMA_NAMES_96                                            \
    BARELLM_WGMMA_NAMES_64                                                \
    ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, " \
    "%77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, "   \
    "%90, %91, %92, %93, %94, %95"
#define BARELLM_WGMMA_NAMES_112                                                    \
    BARELLM_WGMMA_NAMES_96                                                         \
    ", %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, " \
    "%109, %110, %111"
#define BARELLM_WGMMA_NAMES_128                                                        \
    BARELLM_WGMMA_NAMES_112                                                            \
    ", %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, " \
    "%125, %126, %127"
#define BARELLM_WGMMA_BIND_8(i)                                                                 \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define BARELLM_WGMMA_BIND_16(i) BARELLM_WGMMA_BIND_8(i), BARELLM_WGMMA_BIND_8(i + 8)
#define BARELLM_WGMMA_BIND_64                                                       \
    BARELLM_WGMMA_BIND_16(0), BARELLM_WGMMA_BIND_16(16), BARELLM_WGMMA_BIND_16(32), \
        BARELLM_WGMMA_BIND_16(48)
#define BARELLM_WGMMA_BIND_96 \
    BARELLM_WGMMA_BIND_64, BARELLM_WGMMA_BIND_16(64), BARELLM_WGMMA_BIND_16(80)
#define BARELLM_WGMMA_BIND_112 BARELLM_WGMMA_BIND_96, BARELLM_WGMMA_BIND_16(96)
#define BARELLM_WGMMA_BIND_128 BARELLM_WGMMA_BIND_112, BARELLM_WGMMA_BIND_16(112)

// wgmma m64n{n}k16 of `types` ("f16.f16" or "bf16.bf16") with f32 accumulators `names`
// (bound by the trailing arguments) and `descriptors` naming the two operands after them
// ("%64, %65" for n = 128). scale-d is 1 (d is added to); A and B are neither negated nor
// transposed (K-major).
#define BARELLM_WGMMA(n, types, names, descriptors, ...)                                     \
    asm volatile(                                                                            \
        "{\n.reg .pred scale_d;\nsetp.ne.b32 scale_d, 1, 0;\n"                               \
        "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32." types " {" names "}, " descriptors \
        ", scale_d, 1, 1, 0, 0;\n}\n"                                                        \
        : __VA_ARGS__                                                                        \
        : "l"(a), "l"(b))
// The same for the element type D.
#define BARELLM_WGMMA_OF_D(n, names, descriptors, ...)                \
    if constexpr (D == DType::F16)                                    \
        BARELLM_WGMMA(n, "f16.f16", names, descriptors, __VA_ARGS__); \
    else                                                              \
        BARELLM_WGMMA(n, "bf16.bf16", names, descriptors, __VA_ARGS__)

// d (64 x kN f32, the fragments above) += A (64 x 16, descriptor a) * B (16 x kN, given as
// kN rows of 16 columns, descriptor b), D (f16 or bf16) operands; asynchronous.
template <int kN, DType D>
__device__ __forceinline__ void mma_64xNx16(float (&d)[kN / 2], uint64_t a, uint64_t b) {
    static_assert(D == DType::F16 || D == DType::BF16, "wgmma multiplies f16 or bf16 here");
    static_assert(kN == 128 || kN == 192 || kN == 224 || kN == 256, "a shape listed above");
    if constexpr (kN == 128) {
        BARELLM_WGMMA_OF_D(128, BARELLM_WGMMA_NAMES_64, "%64, %65", BARELLM_WGMMA_BIND_64);
    } else if constexpr (kN == 192) {
        BARELLM_WGMMA_OF_D(192, BARELLM_WGMMA_NAMES_96, "%96, %97", BARELLM_WGMMA_BIND_96);
    } else if constexpr (kN == 224) {
        BARELLM_WGMMA_OF_D(224, BARELLM_WGMMA_NAMES_112, "%112, %113", BARELLM_WGMMA_BIND_112);
    } else {
        BARELLM_WGMMA_OF_D(256, BARELLM_WGMMA_NAMES_128, "%128, %129", BARELLM_WGMMA_BIND_128);
    }
}
#undef BARELLM_WGMMA
#undef BARELLM_WGMMA_OF_D
#undef BARELLM_WGMMA_NAMES_64
#undef BARELLM_WGMMA_NAMES_96
#undef BARELLM_WGMMA_NAMES_112
#undef BARELLM_WGMMA_NAMES_128
#undef BARELLM_WGMMA_BIND_8
#undef BARELLM_WGMMA_BIND_16
#undef BARELLM_WGMMA_BIND_64
#undef BARELLM_WGMMA_BIND_96
#undef BARELLM_WGMMA_BIND_112
#undef BARELLM_WGMMA_BIND_128

// Orders the warpgroup's register accesses before the wgmma instructions that follow.
__device__ __forceinline__ void warpgroup_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

// Closes the group of wgmma instructions issued since the last commit.
__device__ __forceinline__ void warpgroup_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until at most kPending of the warpgroup's committed groups are still running.
template <int kPending>
__device__ __forceinline__ void warpgroup_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from touching the accumulators before the last warpgroup_wait<0>.
template <int kCount>
__device__ __forceinline__ void fence_accumulators(float (&d)[kCount]) {
#pragma unroll
    for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The whole warpgroup gives registers back to the SM's pool (decrease) or takes them from
// it (increase): kRegisters per thread from here on.
template <int kRegisters>
__device__ __forceinline__ void warpgroup_decrease_registers() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void warpgroup_increase_registers() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// ---- mbarriers

__device__ __forceinline__ void barrier_init(uint64_t* barrier, int arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(barrier)),
                 "r"(arrivals)
                 : "memory");
}

// Makes the barriers initialised by this thread visible to the copy engine and the cluster.
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
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

// One arrival on the barrier at the same place in block `rank` of the cluster (released at
// the block's scope, as for a local arrival: what it orders, the completed wgmma reads of
// a stage, goes through the copy engine's proxy anyway).
__device__ __forceinline__ void barrier_arrive_in_block(uint64_t* barrier, uint32_t rank) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
                 : "=r"(remote)
                 : "r"(shared_address(barrier)), "r"(rank));
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}

// Whether the barrier's phase of parity `parity` has completed (at once for the phase
// before the current one: a fresh barrier has completed "parity 1"). The copies counted on
// it are visible once it has. The thread may be suspended for a while inside, until the
// phase completes or a time limit passes.
__device__ __forceinline__ bool barrier_try_wait(uint64_t* barrier, uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\n"
        ".reg .pred complete;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
        "selp.u32 %0, 1, 0, complete;\n"
        "}\n"
        : "=r"(done)
        : "r"(shared_address(barrier)), "r"(parity)
        : "memory");
    return done != 0;
}

// The GPU's clock in nanoseconds, the same in every SM.
__device__ __forceinline__ uint64_t global_nanoseconds() {
    uint64_t now;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(now));
    return now;
}

// Returns once barrier_try_wait does. A wait of more than kPatienceNanoseconds (where a stage
// takes microseconds) can only be a hand-over bug: it traps, so that the launch fails at once
// instead of hanging.
__device__ __forceinline__ void barrier_wait(uint64_t* barrier, uint32_t parity) {
    constexpr uint64_t kPatienceNanoseconds = 2'000'000'000;
    uint64_t deadline = 0;
    while (!barrier_try_wait(barrier, parity)) {
        const uint64_t now = global_nanoseconds();
        if (deadline == 0)
            deadline = now + kPatienceNanoseconds;
        else if (now > deadline)
            __trap();
    }
}

// ---- Tensor copies (TMA)

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

// ---- Clusters

// The block's rank in its cluster (its bit in tensor_copy_to_blocks' `blocks`).
__device__ __forceinline__ uint32_t rank_in_cluster() {
    uint32_t rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    return rank;
}

// The cluster barrier in two halves: every thread of every block of the cluster arrives
// (releasing its writes and remote arrivals), and cluster_wait returns once all have; the
// thread may work in between.
__device__ __forceinline__ void cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

#endif  // sm_90a

#ifndef BARELLM_CUDA_EMULATION

// The driver's cuTensorMapEncodeTiled, reached through the runtime (cudaGetDriverEntryPoint):
// nothing links libcuda.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    constexpr unsigned kTensorMapDriverVersion = 12000;  // the function's ABI version
    static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
        void* function = nullptr;
        cudaDriverEntryPointQueryResult found;
#if CUDART_VERSION >= 12050
        CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function,
                                                    kTensorMapDriverVersion, cudaEnableDefault,
                                                    &found));
#else
        CUDA_CHECK(cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &function, cudaEnableDefault,
                                           &found));
#endif
        if (found != cudaDriverEntryPointSuccess || function == nullptr)
            throw Error("gemm: the GPU driver has no cuTensorMapEncodeTiled");
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
    }();
    return encode;
}

#endif  // BARELLM_CUDA_EMULATION

}  // namespace barellm::cuda
