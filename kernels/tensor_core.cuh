// The warp-level instructions behind the tensor-core kernels, each wrapped in one small
// function: ldmatrix (8x8 tiles of 16-bit elements from shared memory into the fragment
// layout of mma), mma (a 16x8x16 product on tensor cores, f32 accumulation) and cp.async
// (16-byte copies from global to shared memory that run while the warp computes).
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), with lane = 4 g + t
// (g = lane / 4 in 0..7, t = lane % 4 in 0..3); each 32-bit register holds two 16-bit
// elements, the lower-indexed one in its low half:
// - A (16 x 16, row-major, M x K): a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1],
//   a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9].
// - B (16 x 8, K x N): b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g]; that is, with B
//   stored as N rows of K contiguous elements (a weight matrix's rows), b[0] = row g,
//   elements 2t, 2t+1 and b[1] = row g, elements 2t+8, 2t+9.
// - C (16 x 8, f32): c[0], c[1] = C[g][2t, 2t+1]; c[2], c[3] = C[g+8][2t, 2t+1].
// - ldmatrix .x4 loads four 8x8 matrices: lanes 8j..8j+7 give the addresses of the 8 rows
//   (16 bytes each) of matrix j, which lands in r[j] with lane l holding row l / 4,
//   elements 2 (l % 4) and 2 (l % 4) + 1. .x2 loads two (addresses from lanes 0-15).
//   .trans delivers each matrix transposed: lane l holds column l / 4, rows 2 (l % 4) and
//   2 (l % 4) + 1.
//
// The unit tests run the kernels built on these on the CPU: with BARELLM_CUDA_EMULATION
// defined, tests/emulation/cuda_emulation.h supplies the same functions, computed lane by
// lane from the layouts above.
#pragma once
#include <cstdint>

#include "weights/safetensors.h"  // DType

#ifdef BARELLM_CUDA_EMULATION
#include "cuda_emulation.h"
#else
#include <cuda_runtime.h>

namespace barellm::cuda {

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// Four 8x8 matrices of 16-bit elements from shared memory; `row` is this lane's row address.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
}

// Two 8x8 matrices (row addresses from lanes 0-15; the other lanes' are ignored).
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(shared_address(row)));
}

// As ldmatrix_x4, each matrix transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
}

// As ldmatrix_x2, each matrix transposed.
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(shared_address(row)));
}

// c += a · b for a 16x8x16 tile: a and b hold pairs of kType (F16 or BF16) elements in the
// layouts above, c is f32. sm_80 and newer run it as one instruction; sm_75 runs f16 as
// two m16n8k8 halves and has no bf16 tensor-core instruction (the GEMM's host side sends
// bf16 work on sm_75 to its SIMT kernel; this traps if reached there).
template <DType kType>
__device__ __forceinline__ void mma_16x8x16(float (&c)[4], const uint32_t (&a)[4],
                                            const uint32_t (&b)[2]) {
    static_assert(kType == DType::F16 || kType == DType::BF16, "mma takes f16 or bf16");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (kType == DType::F16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
#elif defined(__CUDA_ARCH__)
    if constexpr (kType == DType::F16) {
        // k = 0..7: a[0], a[1] and b[0]; k = 8..15: a[2], a[3] and b[1].
        asm volatile(
            "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
            "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(b[0]));
        asm volatile(
            "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
            "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[2]), "r"(a[3]), "r"(b[1]));
    } else {
        __trap();
    }
#endif
}

// Copies 16 bytes from global to shared memory without holding the thread (both 16-byte
// aligned); with valid false it writes 16 zero bytes and reads nothing (`global` must still
// be an address inside the allocation). The copies of a thread are grouped by
// copy_async_commit and waited for by copy_async_wait. sm_75 copies synchronously.
__device__ __forceinline__ void copy_async_16(void* shared, const void* global, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)),
                 "l"(global), "r"(valid ? 16 : 0));
#else
    *static_cast<uint4*>(shared) = valid ? *static_cast<const uint4*>(global) : uint4{0, 0, 0, 0};
#endif
}

// Closes the group of this thread's copies issued since the last commit.
__device__ __forceinline__ void copy_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most kPending of this thread's committed groups are still in flight (the
// most recent ones). Other threads' copies need a __syncthreads after it to be seen.
template <int kPending>
__device__ __forceinline__ void copy_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#endif
}

}  // namespace barellm::cuda
#endif
