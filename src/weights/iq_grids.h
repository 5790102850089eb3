// The lattice grids of the i-quant types (weight_blocks.h, docs/FORMAT.md): fixed tables of
// points that the format defines, generated into iq_grids.inc by scripts/gen_iq_grids.py. Byte i
// of a point is its value i: IQ2_* magnitudes 8, 25 or 43 (8 values a point), IQ3_XXS magnitudes
// 4..62 and IQ3_S 1..15 (4 values a point), IQ1_* levels 0..2 of the values −1, 0, +1.
#pragma once
#include <cstdint>

namespace barellm {

#define IQ_GRID(name, type, count, ...) extern const type name[count];
#include "weights/iq_grids.inc"
#undef IQ_GRID

// The sign bits of 8 weights of IQ2_XXS, IQ2_XS and IQ3_XXS: 7 bits stored, the eighth the
// parity of the seven (an even count of negative weights). Bit i set: weight i is negative.
constexpr uint8_t iq_signs_of_seven(unsigned seven_bits) {
    unsigned parity = 0;
    for (int i = 0; i < 7; ++i) parity ^= (seven_bits >> i) & 1;
    return uint8_t((seven_bits & 0x7f) | parity << 7);
}

}  // namespace barellm
