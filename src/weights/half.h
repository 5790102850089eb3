// Scalar conversions between float and the two 16-bit float formats stored in
// weight files: IEEE half (f16) and bfloat16 (bf16). The SIMD paths convert
// with F16C instructions; these are the portable reference.
#pragma once
#include <cstdint>
#include <cstring>

namespace barellm {

inline float bits_to_float(uint32_t bits) {
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

inline uint32_t float_to_bits(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    return bits;
}

// bf16 is the top half of an f32.
inline float bf16_to_float(uint16_t bf16) { return bits_to_float(uint32_t(bf16) << 16); }

inline float half_to_float(uint16_t half) {
    const uint32_t sign = uint32_t(half & 0x8000) << 16;
    const uint32_t exponent = (half >> 10) & 0x1f;
    const uint32_t mantissa = half & 0x3ff;
    if (exponent == 0x1f) return bits_to_float(sign | 0x7f800000 | (mantissa << 13));  // inf, nan
    if (exponent != 0) return bits_to_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
    // Zero or subnormal: mantissa * 2^-24, exact in f32.
    const float magnitude = float(mantissa) * (1.0f / 16777216.0f);
    return sign ? -magnitude : magnitude;
}

// Round to nearest, ties to even, as F16C's _mm256_cvtps_ph does with rounding mode 0.
inline uint16_t float_to_half(float value) {
    const uint32_t bits = float_to_bits(value);
    const uint16_t sign = uint16_t((bits >> 16) & 0x8000);
    const uint32_t magnitude = bits & 0x7fffffff;
    if (magnitude >= 0x7f800000)  // inf or nan (keep nan quiet)
        return sign | 0x7c00 | (magnitude > 0x7f800000 ? 0x200 : 0);
    if (magnitude >= 0x477ff000) return sign | 0x7c00;  // rounds past the largest half
    if (magnitude < 0x38800000) {                       // below the smallest normal half
        // value = m * 2^-24 with m rounded to an integer (ties to even).
        const float scaled = bits_to_float(magnitude) * 16777216.0f;
        const uint32_t whole = uint32_t(scaled);
        const float fraction = scaled - float(whole);
        uint32_t rounded = whole;
        if (fraction > 0.5f || (fraction == 0.5f && (whole & 1))) rounded++;
        return sign | uint16_t(rounded);
    }
    // Normal: rebias the exponent, round the 13 dropped mantissa bits.
    const uint32_t rebased = magnitude - (uint32_t(112) << 23);
    const uint32_t dropped = rebased & 0x1fff;
    uint32_t result = rebased >> 13;
    if (dropped > 0x1000 || (dropped == 0x1000 && (result & 1))) result++;
    return sign | uint16_t(result);
}

}  // namespace barellm
