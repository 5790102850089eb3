// The sm_90 instructions of kernels/wgmma.cuh on the CPU emulation (cuda_emulation.h), with
// the same names and contracts, and the driver's tensor-map encoder (cuTensorMapEncodeTiled)
// that the host makes the copies' maps with. Included by wgmma.cuh instead of the CUDA
// headers when BARELLM_CUDA_EMULATION is defined. Run by hopper_emulation.cpp:
//
// - Shared addresses (shared_address) are offsets in a per-block window holding the block's
//   dynamic shared memory only, from kSharedWindowStart on (not a multiple of 1024, as the
//   start of a GPU's dynamic shared memory need not be).
// - wgmma (mma_64xNx16) is a warpgroup exchange: all 128 lanes issue it with the same
//   descriptors, each giving its accumulators. It is asynchronous: the product is computed,
//   reading the operands from shared memory and adding into each lane's accumulators, only
//   when warpgroup_wait retires its committed group. So a stage overwritten before its
//   products were waited for, or accumulators read too early, give wrong results.
//   Descriptors are decoded as the PTX ISA documents them (start, stride offset, swizzle
//   mode); the 128-byte swizzle is the one mode emulated, XORing address bits 4-6 with bits
//   7-9, and an operand must start in the first 128-byte row of its 1024-byte pattern (base
//   offset 0).
// - mbarriers keep their state in their 8 bytes of shared memory (expected and pending
//   arrivals, the signed transaction count, the phase): a phase completes when its arrivals
//   and its bytes have all come. An mbarrier not initialised, or overwritten, is reported, as
//   is an arrival beyond the count. barrier_wait blocks (the scheduler runs the others) until
//   the phase of the given parity has completed.
// - Tensor copies (TMA) happen when issued: the box is read from global memory (zeros past the
//   tensor), written in the 128-byte swizzle into the destination block(s), and its bytes
//   completed on the barrier at the same place in each of them. Destinations must lie on
//   1024-byte boundaries of the window.
// - Clusters (emulate_cluster_launch): rank_in_cluster is the block's rank (x fastest);
//   barrier_arrive_in_block arrives on the barrier at the same shared address in another
//   block; the cluster barrier (cluster_arrive, cluster_wait) completes once every thread of
//   the cluster still running has arrived.
// - wgmma.fence is a warpgroup exchange that must come before the warpgroup's first wgmma
//   (as the PTX ISA requires). Register reallocation (setmaxnreg), the accumulators' fence
//   and the mbarrier-init fence are no-ops: they order nothing a one-fiber-at-a-time
//   emulation could reorder.
#pragma once
#include <cstdint>

#include "cuda_emulation.h"
#include "weights/safetensors.h"  // DType

// ---- The driver API's tensor maps (cuda.h, cudaTypedefs.h), as far as the kernels use them
using cuuint32_t = uint32_t;
using cuuint64_t = uint64_t;
enum CUresult { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1 };
enum CUtensorMapDataType {
    CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6,
    CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9,
};
enum CUtensorMapInterleave { CU_TENSOR_MAP_INTERLEAVE_NONE = 0 };
enum CUtensorMapSwizzle {
    CU_TENSOR_MAP_SWIZZLE_NONE = 0,
    CU_TENSOR_MAP_SWIZZLE_32B,
    CU_TENSOR_MAP_SWIZZLE_64B,
    CU_TENSOR_MAP_SWIZZLE_128B,
};
enum CUtensorMapL2promotion {
    CU_TENSOR_MAP_L2_PROMOTION_NONE = 0,
    CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
    CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
    CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
};
enum CUtensorMapFloatOOBfill {
    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0,
    CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA,
};
struct alignas(64) CUtensorMap {
    cuuint64_t opaque[16];
};
using PFN_cuTensorMapEncodeTiled_v12000 = CUresult (*)(
    CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
    const cuuint64_t* extents, const cuuint64_t* strides, const cuuint32_t* box,
    const cuuint32_t* element_strides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion promotion, CUtensorMapFloatOOBfill fill);

namespace barellm::cuda::emulation {

// cuTensorMapEncodeTiled for what the emulation copies: 2-D f16/bf16 tensors read in boxes of
// 128-byte rows in the 128-byte swizzle, every element (element strides 1), no interleave.
// Checks the arguments as the driver documents them and returns CUDA_ERROR_INVALID_VALUE
// where it would (or where the emulation does not cover the form).
CUresult encode_tensor_map_tiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank,
                                 void* address, const cuuint64_t* extents,
                                 const cuuint64_t* strides, const cuuint32_t* box,
                                 const cuuint32_t* element_strides,
                                 CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                 CUtensorMapL2promotion promotion, CUtensorMapFloatOOBfill fill);

uint32_t shared_window_address(const void* pointer);
void warpgroup_fence();
void warpgroup_mma(DType type, int n, float* accumulators, uint64_t a, uint64_t b);
void warpgroup_commit();
void warpgroup_wait(int pending_groups);
void barrier_init(uint64_t* barrier, int arrivals);
void barrier_arrive(uint64_t* barrier, int expected_bytes);
void barrier_arrive_in_block(uint64_t* barrier, uint32_t rank);
void barrier_wait(uint64_t* barrier, uint32_t parity);
// blocks: a bit per rank of the cluster, or 0 for the calling block alone.
void tensor_copy(void* destination, const CUtensorMap* map, int column, int row, uint64_t* barrier,
                 uint32_t blocks);
uint32_t cluster_rank();
void cluster_arrive();
void cluster_wait();

}  // namespace barellm::cuda::emulation

namespace barellm::cuda {

inline uint32_t shared_address(const void* pointer) {
    return emulation::shared_window_address(pointer);
}

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    return emulation::encode_tensor_map_tiled;
}

template <int kN, DType D>
void mma_64xNx16(float (&d)[kN / 2], uint64_t a, uint64_t b) {
    static_assert(D == DType::F16 || D == DType::BF16, "wgmma multiplies f16 or bf16 here");
    emulation::warpgroup_mma(D, kN, d, a, b);
}
inline void warpgroup_fence() { emulation::warpgroup_fence(); }
inline void warpgroup_commit() { emulation::warpgroup_commit(); }
template <int kPending>
void warpgroup_wait() {
    emulation::warpgroup_wait(kPending);
}
template <int kCount>
void fence_accumulators(float (&)[kCount]) {}
template <int kRegisters>
void warpgroup_decrease_registers() {}
template <int kRegisters>
void warpgroup_increase_registers() {}

inline void barrier_init(uint64_t* barrier, int arrivals) {
    emulation::barrier_init(barrier, arrivals);
}
inline void fence_barrier_init() {}
inline void barrier_arrive_expecting(uint64_t* barrier, int bytes) {
    emulation::barrier_arrive(barrier, bytes);
}
inline void barrier_arrive(uint64_t* barrier) { emulation::barrier_arrive(barrier, 0); }
inline void barrier_arrive_in_block(uint64_t* barrier, uint32_t rank) {
    emulation::barrier_arrive_in_block(barrier, rank);
}
inline void barrier_wait(uint64_t* barrier, uint32_t parity) {
    emulation::barrier_wait(barrier, parity);
}

inline void tensor_copy(void* destination, const CUtensorMap* map, int column, int row,
                        uint64_t* barrier) {
    emulation::tensor_copy(destination, map, column, row, barrier, 0);
}
inline void tensor_copy_to_blocks(void* destination, const CUtensorMap* map, int column, int row,
                                  uint64_t* barrier, uint16_t blocks) {
    emulation::tensor_copy(destination, map, column, row, barrier, blocks);
}

inline uint32_t rank_in_cluster() { return emulation::cluster_rank(); }
inline void cluster_arrive() { emulation::cluster_arrive(); }
inline void cluster_wait() { emulation::cluster_wait(); }

}  // namespace barellm::cuda
