// ISA-neutral arithmetic shared by the integer prefill GEMMs of the block types
// (avx2/gemm_blocks_panels.h, gemm_blocks_avx512vnni.cpp).
#pragma once
#include <cstdint>

namespace barellm::cpu {

// Where the int32 dot product of sub-block `sub` (of `subs` in a group of 32 columns) starts
// for a type whose levels u stand for u − offset: −offset · Σ q over the sub-block's columns,
// from the group's two sums of 16 of x (QuantizedBatch::half_sums), so that the dot product
// ends as Σ (u − offset) · q.
inline int32_t sub_block_start(const int32_t* group_half_sums, int sub, int subs, int offset) {
    return -offset * (subs == 2 ? group_half_sums[sub] : group_half_sums[0] + group_half_sums[1]);
}

}  // namespace barellm::cpu
