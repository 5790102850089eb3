// The i-quant types' lattice grids (src/weights/iq_grids.inc: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
// IQ3_S, IQ1_S, IQ1_M) in device memory, under the names the CPU's weights/iq_grids.h gives
// them, for block_units.cuh's unit reads (iq_grid_point).
//
// Global memory, not __constant__: each lane looks up the points of its own weights, so the
// lanes of a warp read different entries, and constant memory serves a warp's different
// addresses one after another (a 32-way replay at worst), where the L1 / read-only cache that
// __ldg reads through serves them at once. The grids are 1 KiB (IQ3_XXS) to 16 KiB (IQ1_S's and
// IQ1_M's), 33 KiB in all, of which a kernel of one type reads one: small enough to stay in L1 /
// L2.
#pragma once
#include <cstdint>

namespace barellm::cuda {

#define IQ_GRID(name, type, count, ...) __device__ const type name[count] = __VA_ARGS__;
#include "weights/iq_grids.inc"
#undef IQ_GRID

}  // namespace barellm::cuda
