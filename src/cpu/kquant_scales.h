// The scales of Q4_K and Q5_K super-blocks (weight_blocks.h) unpacked for the K-quant
// matvecs (matvec_super_blocks_*.cpp): scalar code, shared by their AVX2 and AVX-512 versions.
#pragma once
#include <cstdint>
#include <cstring>

namespace barellm::cpu {

// The eight 6-bit scales and the eight 6-bit mins of a Q4_K/Q5_K super-block, byte j of
// each for sub-block j (as k_scale_min gives them one at a time).
struct KScalesMins {
    uint64_t scales, mins;
};

// From the 12 packed bytes read as three little-endian words s0, s1, s2: sub-blocks 0-3
// keep the low 6 bits of s0 (scales) and s1 (mins); sub-blocks 4-7 take their low 4 bits
// from s2 (scale low nibbles, min high nibbles) and their top 2 from the top bits of the
// bytes of s0 and s1, a byte each.
inline KScalesMins unpack_k_scales_mins(const uint8_t* packed) {
    constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
    uint32_t s[3];
    std::memcpy(s, packed, sizeof s);
    const uint32_t scales_high = (s[2] & kLow4) | ((s[0] >> 6) & kLow2) << 4;
    const uint32_t mins_high = ((s[2] >> 4) & kLow4) | ((s[1] >> 6) & kLow2) << 4;
    return {(s[0] & kLow6) | uint64_t(scales_high) << 32, (s[1] & kLow6) | uint64_t(mins_high)
                                                                               << 32};
}

}  // namespace barellm::cpu
