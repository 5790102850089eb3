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
// The device functions exist for sm_90a only (__CUDA_ARCH_FEAT_SM90_ALL): their callers
// guard their bodies the same way and trap on other GPUs.
#pragma once
#include <cuda.h>  // CUtensorMap

#include <cstdint>

#include "safetensors.h"    // DType
#include "tensor_core.cuh"  // shared_address

namespace barellm::cuda {

constexpr int kWarpgroupThreads = 128;  // 4 warps
// The 128-byte swizzle (above): a row of the operand, and the 8 rows over which the XOR
// pattern repeats (a swizzled operand starts on this many bytes).
constexpr int kSwizzleRowBytes = 128;
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes;

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

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

// d (64 x 128 f32, the fragments above) += A (64 x 16, descriptor a) * B (16 x 128, given
// as 128 rows of 16 columns, descriptor b), D (f16 or bf16) operands; asynchronous.
#define BARELLM_WGMMA_M64N128K16(type)                                                            \
    asm volatile(                                                                                 \
        "{\n"                                                                                     \
        ".reg .pred accumulate;\n"                                                                \
        "setp.ne.b32 accumulate, %66, 0;\n"                                                       \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." type "." type                              \
        " "                                                                                       \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "  \
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "   \
        "%36, "                                                                                   \
        "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, "   \
        "%54, "                                                                                   \
        "%55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, accumulate, 1, 1, 0, 0;\n"       \
        "}\n"                                                                                     \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),     \
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),           \
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),           \
          "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),           \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]),           \
          "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),           \
          "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),           \
          "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),           \
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]),           \
          "+f"(d[62]), "+f"(d[63])                                                                \
        : "l"(a), "l"(b), "r"(1))

template <DType D>
__device__ __forceinline__ void mma_64x128x16(float (&d)[64], uint64_t a, uint64_t b) {
    static_assert(D == DType::F16 || D == DType::BF16, "wgmma multiplies f16 or bf16 here");
    if constexpr (D == DType::F16)
        BARELLM_WGMMA_M64N128K16("f16");
    else
        BARELLM_WGMMA_M64N128K16("bf16");
}
#undef BARELLM_WGMMA_M64N128K16

// As mma_64x128x16 for B of 256 rows: d is 64 x 256.
#define BARELLM_WGMMA_M64N256K16(type)                                                            \
    asm volatile(                                                                                 \
        "{\n"                                                                                     \
        ".reg .pred accumulate;\n"                                                                \
        "setp.ne.b32 accumulate, %130, 0;\n"                                                      \
        "wgmma.mma_async.sync.aligned.m64n256k16.f32." type "." type                              \
        " "                                                                                       \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "  \
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "   \
        "%36, "                                                                                   \
        "%37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, "   \
        "%54, "                                                                                   \
        "%55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, "   \
        "%72, "                                                                                   \
        "%73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, "   \
        "%90, "                                                                                   \
        "%91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, " \
        "%107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, "    \
        "%121, "                                                                                  \
        "%122, %123, %124, %125, %126, %127}, %128, %129, accumulate, 1, 1, 0, 0;\n"              \
        "}\n"                                                                                     \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),     \
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),           \
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),           \
          "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),           \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]),           \
          "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),           \
          "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),           \
          "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),           \
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]),           \
          "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]),           \
          "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]),           \
          "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),           \
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]),           \
          "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),           \
          "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),           \
          "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),       \
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),     \
          "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),     \
          "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),     \
          "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])      \
        : "l"(a), "l"(b), "r"(1))

template <DType D>
__device__ __forceinline__ void mma_64x256x16(float (&d)[128], uint64_t a, uint64_t b) {
    static_assert(D == DType::F16 || D == DType::BF16, "wgmma multiplies f16 or bf16 here");
    if constexpr (D == DType::F16)
        BARELLM_WGMMA_M64N256K16("f16");
    else
        BARELLM_WGMMA_M64N256K16("bf16");
}
#undef BARELLM_WGMMA_M64N256K16

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

}  // namespace barellm::cuda
