// The i-quant grids' storage (iq_grids.h).
#include "weights/iq_grids.h"

namespace barellm {

#define IQ_GRID(name, type, count, ...) const type name[count] = __VA_ARGS__;
#include "weights/iq_grids.inc"
#undef IQ_GRID

}  // namespace barellm
