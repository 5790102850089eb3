// SIMDe's AVX-512 (and AVX2, F16C) for the unit tests' second build of the AVX-512 and AVX-VNNI
// kernels (src/cpu/avx512/intrinsics_avx512.h and src/cpu/avx2/intrinsics_avx2.h with
// BARELLM_SIMDE),
// plus the intrinsics those kernels use that Debian's SIMDe (0.7.4) lacks, written here lane
// by lane from Intel's definitions. Each is defined only where SIMDe has no alias of that
// name.
#pragma once
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "weights/half.h"

// The mask types, which SIMDe names simde__mmaskN only.
using __mmask16 = simde__mmask16;
using __mmask32 = simde__mmask32;
using __mmask64 = simde__mmask64;
using __mmask8 = simde__mmask8;

namespace barellm::simde_extra {

template <typename To, typename From>
inline To bits(const From& from) {
    static_assert(sizeof(To) == sizeof(From));
    To to;
    std::memcpy(&to, &from, sizeof(To));
    return to;
}

struct F32x16 {
    float lane[16];
};
struct I32x16 {
    int32_t lane[16];
};
struct U16x16 {
    uint16_t lane[16];
};
struct I8x64 {
    int8_t lane[64];
};
struct I64x8 {
    int64_t lane[8];
};

// Lane i of `count` lanes of `size` bytes: the `size` bytes at base + index(i) × scale
// (memcpy: no alignment needed).
template <typename Result, typename Index>
inline Result gather(const void* base, Index index, int count, int size, int scale) {
    unsigned char bytes[sizeof(Result)] = {};
    for (int i = 0; i < count; ++i)
        std::memcpy(bytes + i * size, static_cast<const char*>(base) + int64_t(index(i)) * scale,
                    size);
    return bits<Result>(bytes);
}

// The `count` values of `From` at the start of `in`, each widened (zero- or sign-extended
// by the types) to `To`, as one register `Result`.
template <typename Result, typename To, typename From, typename In>
inline Result widen(const In& in, int count) {
    From from[sizeof(In) / sizeof(From)];
    std::memcpy(from, &in, sizeof from);
    To to[sizeof(Result) / sizeof(To)] = {};
    for (int i = 0; i < count; ++i) to[i] = To(from[i]);
    return bits<Result>(to);
}

// Lanes of `count` elements of `size` bytes from p where `mask` has a bit, else zero.
template <typename Result>
inline Result masked_load(const void* p, uint64_t mask, int count, int size) {
    unsigned char bytes[sizeof(Result)] = {};
    for (int i = 0; i < count; ++i)
        if (mask >> i & 1)
            std::memcpy(bytes + i * size, static_cast<const char*>(p) + i * size, size);
    return bits<Result>(bytes);
}

}  // namespace barellm::simde_extra

// AVX-VNNI's 256-bit vpdpbusd (VEX) computes what AVX512_VNNI's 256-bit form (EVEX) does.
#ifndef _mm256_dpbusd_avx_epi32
#define _mm256_dpbusd_avx_epi32(src, a, b) simde_mm256_dpbusd_epi32(src, a, b)
#endif
#ifndef _mm512_maskz_loadu_ps
inline simde__m512 _mm512_maskz_loadu_ps(simde__mmask16 mask, const void* p) {
    return barellm::simde_extra::masked_load<simde__m512>(p, mask, 16, 4);
}
#endif
#ifndef _mm512_maskz_loadu_epi8
inline simde__m512i _mm512_maskz_loadu_epi8(simde__mmask64 mask, const void* p) {
    return barellm::simde_extra::masked_load<simde__m512i>(p, mask, 64, 1);
}
#endif
#ifndef _mm256_maskz_loadu_epi8
inline simde__m256i _mm256_maskz_loadu_epi8(simde__mmask32 mask, const void* p) {
    return barellm::simde_extra::masked_load<simde__m256i>(p, mask, 32, 1);
}
#endif
#ifndef _mm256_maskz_loadu_epi16
inline simde__m256i _mm256_maskz_loadu_epi16(simde__mmask16 mask, const void* p) {
    return barellm::simde_extra::masked_load<simde__m256i>(p, mask, 16, 2);
}
#endif
#ifndef _cvtsh_ss
inline float _cvtsh_ss(unsigned short half) { return barellm::half_to_float(half); }
#endif
#ifndef _mm512_cvtph_ps
inline simde__m512 _mm512_cvtph_ps(simde__m256i halves) {
    using namespace barellm::simde_extra;
    const U16x16 in = bits<U16x16>(halves);
    F32x16 out;
    for (int i = 0; i < 16; ++i) out.lane[i] = barellm::half_to_float(in.lane[i]);
    return bits<simde__m512>(out);
}
#endif
#ifndef _mm512_cvtepu16_epi32
inline simde__m512i _mm512_cvtepu16_epi32(simde__m256i halves) {
    using namespace barellm::simde_extra;
    const U16x16 in = bits<U16x16>(halves);
    I32x16 out;
    for (int i = 0; i < 16; ++i) out.lane[i] = in.lane[i];
    return bits<simde__m512i>(out);
}
#endif
#ifndef _mm512_cvtepu8_epi32
inline simde__m512i _mm512_cvtepu8_epi32(simde__m128i bytes) {
    using namespace barellm::simde_extra;
    uint8_t in[16];
    std::memcpy(in, &bytes, sizeof in);
    I32x16 out;
    for (int i = 0; i < 16; ++i) out.lane[i] = in[i];
    return bits<simde__m512i>(out);
}
#endif
#ifndef _mm512_cvtepi8_epi32
inline simde__m512i _mm512_cvtepi8_epi32(simde__m128i bytes) {
    using namespace barellm::simde_extra;
    int8_t in[16];
    std::memcpy(in, &bytes, sizeof in);
    I32x16 out;
    for (int i = 0; i < 16; ++i) out.lane[i] = in[i];
    return bits<simde__m512i>(out);
}
#endif
#ifndef _mm512_cvtepu8_epi16
inline simde__m512i _mm512_cvtepu8_epi16(simde__m256i bytes) {
    uint8_t in[32];
    std::memcpy(in, &bytes, sizeof in);
    int16_t out[32];
    for (int i = 0; i < 32; ++i) out[i] = in[i];
    return barellm::simde_extra::bits<simde__m512i>(out);
}
#endif
#ifndef _mm512_cvtepi32_ps
inline simde__m512 _mm512_cvtepi32_ps(simde__m512i values) {
    using namespace barellm::simde_extra;
    const I32x16 in = bits<I32x16>(values);
    F32x16 out;
    for (int i = 0; i < 16; ++i) out.lane[i] = float(in.lane[i]);
    return bits<simde__m512>(out);
}
#endif
#ifndef _mm512_reduce_add_ps
// Intel's order: halves added pairwise down to one lane.
inline float _mm512_reduce_add_ps(simde__m512 v) {
    using namespace barellm::simde_extra;
    F32x16 x = bits<F32x16>(v);
    for (int width = 8; width >= 1; width /= 2)
        for (int i = 0; i < width; ++i) x.lane[i] += x.lane[i + width];
    return x.lane[0];
}
#endif
#ifndef _mm512_cvtps_pd
inline simde__m512d _mm512_cvtps_pd(simde__m256 values) {
    using namespace barellm::simde_extra;
    const std::array<float, 8> in = bits<std::array<float, 8>>(values);
    std::array<double, 8> out;
    for (int i = 0; i < 8; ++i) out[i] = in[i];
    return bits<simde__m512d>(out);
}
#endif
#ifndef _mm512_extractf32x8_ps
inline simde__m256 _mm512_extractf32x8_ps(simde__m512 v, int half) {
    using namespace barellm::simde_extra;
    const F32x16 x = bits<F32x16>(v);
    std::array<float, 8> out;
    for (int i = 0; i < 8; ++i) out[i] = x.lane[8 * (half & 1) + i];
    return bits<simde__m256>(out);
}
#endif
#ifndef _mm512_reduce_add_pd
// Intel's order: halves added pairwise down to one lane.
inline double _mm512_reduce_add_pd(simde__m512d v) {
    using namespace barellm::simde_extra;
    std::array<double, 8> x = bits<std::array<double, 8>>(v);
    for (int width = 4; width >= 1; width /= 2)
        for (int i = 0; i < width; ++i) x[i] += x[i + width];
    return x[0];
}
#endif
#ifndef _mm512_cvtps_ph
// Rounding to nearest even only (the only mode the kernels ask for).
inline simde__m256i _mm512_cvtps_ph(simde__m512 values, int /*rounding*/) {
    using namespace barellm::simde_extra;
    const F32x16 in = bits<F32x16>(values);
    U16x16 out;
    for (int i = 0; i < 16; ++i) out.lane[i] = barellm::float_to_half(in.lane[i]);
    return bits<simde__m256i>(out);
}
#endif
#ifndef _mm512_maskz_loadu_epi16
inline simde__m512i _mm512_maskz_loadu_epi16(simde__mmask32 mask, const void* p) {
    return barellm::simde_extra::masked_load<simde__m512i>(p, mask, 32, 2);
}
#endif
#ifndef _mm512_mask_storeu_epi16
inline void _mm512_mask_storeu_epi16(void* p, simde__mmask32 mask, simde__m512i values) {
    uint16_t lanes[32];
    std::memcpy(lanes, &values, sizeof lanes);
    for (int i = 0; i < 32; ++i)
        if (mask >> i & 1) std::memcpy(static_cast<char*>(p) + 2 * i, &lanes[i], 2);
}
#endif
#ifndef _mm256_mask_storeu_epi16
inline void _mm256_mask_storeu_epi16(void* p, simde__mmask16 mask, simde__m256i values) {
    using namespace barellm::simde_extra;
    const U16x16 in = bits<U16x16>(values);
    for (int i = 0; i < 16; ++i)
        if (mask >> i & 1) std::memcpy(static_cast<char*>(p) + 2 * i, &in.lane[i], 2);
}
#endif
#ifndef _MM_FROUND_NO_EXC
#define _MM_FROUND_NO_EXC SIMDE_MM_FROUND_NO_EXC
#endif
#ifndef _mm512_cvtps_epi32
// Rounding to nearest even, the default mode.
inline simde__m512i _mm512_cvtps_epi32(simde__m512 values) {
    using namespace barellm::simde_extra;
    const F32x16 in = bits<F32x16>(values);
    I32x16 out;
    for (int i = 0; i < 16; ++i) out.lane[i] = int32_t(std::nearbyint(in.lane[i]));
    return bits<simde__m512i>(out);
}
#endif
#ifndef _mm512_mask_storeu_ps
inline void _mm512_mask_storeu_ps(void* p, simde__mmask16 mask, simde__m512 values) {
    using namespace barellm::simde_extra;
    const F32x16 in = bits<F32x16>(values);
    for (int i = 0; i < 16; ++i)
        if (mask >> i & 1) std::memcpy(static_cast<char*>(p) + 4 * i, &in.lane[i], 4);
}
#endif
#ifndef _mm512_cvttps_epi32
inline simde__m512i _mm512_cvttps_epi32(simde__m512 values) {
    using namespace barellm::simde_extra;
    const F32x16 in = bits<F32x16>(values);
    I32x16 out;
    for (int i = 0; i < 16; ++i) out.lane[i] = int32_t(in.lane[i]);  // toward zero
    return bits<simde__m512i>(out);
}
#endif
#ifndef _mm512_cvtepi32_epi8
// Each lane's low byte (truncation, no saturation).
inline simde__m128i _mm512_cvtepi32_epi8(simde__m512i values) {
    using namespace barellm::simde_extra;
    const I32x16 in = bits<I32x16>(values);
    int8_t out[16];
    for (int i = 0; i < 16; ++i) out[i] = int8_t(uint8_t(uint32_t(in.lane[i]) & 0xff));
    return bits<simde__m128i>(out);
}
#endif
#ifndef _mm512_reduce_max_ps
inline float _mm512_reduce_max_ps(simde__m512 v) {
    using namespace barellm::simde_extra;
    const F32x16 x = bits<F32x16>(v);
    float largest = x.lane[0];
    for (int i = 1; i < 16; ++i) largest = x.lane[i] > largest ? x.lane[i] : largest;
    return largest;
}
#endif
#ifndef _mm512_reduce_add_epi32
inline int _mm512_reduce_add_epi32(simde__m512i v) {
    using namespace barellm::simde_extra;
    const I32x16 x = bits<I32x16>(v);
    uint32_t sum = 0;  // wraps around like the lanes
    for (int i = 0; i < 16; ++i) sum += uint32_t(x.lane[i]);
    return int(sum);
}
#endif
#ifndef _mm512_cvtne2ps_pbh
// Lanes 0-15 of the result are b rounded to bf16, lanes 16-31 are a; to nearest even (NaN
// stays a quiet NaN).
inline simde__m512bh _mm512_cvtne2ps_pbh(simde__m512 a, simde__m512 b) {
    using namespace barellm::simde_extra;
    const F32x16 halves[2] = {bits<F32x16>(b), bits<F32x16>(a)};
    uint16_t out[32];
    for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 16; ++i) {
            const uint32_t value = bits<uint32_t>(halves[h].lane[i]);
            const bool is_nan = (value & 0x7fffffffu) > 0x7f800000u;
            const uint32_t rounding_bias = 0x7fffu + (value >> 16 & 1);
            out[h * 16 + i] =
                is_nan ? uint16_t(value >> 16 | 0x40) : uint16_t((value + rounding_bias) >> 16);
        }
    return bits<simde__m512bh>(out);
}
#endif
#ifndef _mm512_shuffle_f32x4
// 128-bit lanes 0-1 of the result are lanes of a, 2-3 lanes of b, each picked by two bits
// of select.
inline simde__m512 _mm512_shuffle_f32x4(simde__m512 a, simde__m512 b, int select) {
    using namespace barellm::simde_extra;
    const F32x16 sources[2] = {bits<F32x16>(a), bits<F32x16>(b)};
    F32x16 out;
    for (int lane = 0; lane < 4; ++lane) {
        const int picked = select >> (2 * lane) & 3;
        for (int i = 0; i < 4; ++i) out.lane[lane * 4 + i] = sources[lane / 2].lane[picked * 4 + i];
    }
    return bits<simde__m512>(out);
}
#endif
#ifndef _mm512_mask_i32gather_epi32
// Lane i: the 32-bit word at base + index[i] × scale where mask has bit i, else src's lane
// (read with memcpy: the words need no alignment).
inline simde__m512i _mm512_mask_i32gather_epi32(simde__m512i src, simde__mmask16 mask,
                                                simde__m512i index, const void* base, int scale) {
    using namespace barellm::simde_extra;
    const I32x16 offsets = bits<I32x16>(index);
    I32x16 out = bits<I32x16>(src);
    for (int i = 0; i < 16; ++i)
        if (mask >> i & 1)
            std::memcpy(&out.lane[i],
                        static_cast<const char*>(base) + int64_t(offsets.lane[i]) * scale,
                        sizeof(int32_t));
    return bits<simde__m512i>(out);
}
#endif
#ifndef _mm512_cvtepi32_epi16
// Each lane's low 16 bits (truncation, no saturation).
inline simde__m256i _mm512_cvtepi32_epi16(simde__m512i values) {
    using namespace barellm::simde_extra;
    const I32x16 in = bits<I32x16>(values);
    uint16_t out[16];
    for (int i = 0; i < 16; ++i) out[i] = uint16_t(uint32_t(in.lane[i]) & 0xffff);
    return bits<simde__m256i>(out);
}
#endif
#ifndef _mm512_srai_epi32
// Each lane shifted right by count (0..31), copies of its sign bit shifted in.
inline simde__m512i _mm512_srai_epi32(simde__m512i values, unsigned count) {
    using namespace barellm::simde_extra;
    I32x16 lanes = bits<I32x16>(values);
    for (int& lane : lanes.lane) lane = count > 31 ? (lane < 0 ? -1 : 0) : lane >> count;
    return bits<simde__m512i>(lanes);
}
#endif
#ifndef _mm512_i32gather_epi32
// Lane i: the 32-bit word at base + index[i] × scale.
inline simde__m512i _mm512_i32gather_epi32(simde__m512i index, const void* base, int scale) {
    using namespace barellm::simde_extra;
    const I32x16 offsets = bits<I32x16>(index);
    return gather<simde__m512i>(
        base, [&](int i) { return offsets.lane[i]; }, 16, 4, scale);
}
#endif
#ifndef _mm512_i64gather_epi64
// Lane i: the 64-bit word at base + index[i] × scale.
inline simde__m512i _mm512_i64gather_epi64(simde__m512i index, const void* base, int scale) {
    using namespace barellm::simde_extra;
    const I64x8 offsets = bits<I64x8>(index);
    return gather<simde__m512i>(
        base, [&](int i) { return offsets.lane[i]; }, 8, 8, scale);
}
#endif
#ifndef _mm512_cvtepu8_epi64
inline simde__m512i _mm512_cvtepu8_epi64(simde__m128i bytes) {
    return barellm::simde_extra::widen<simde__m512i, uint64_t, uint8_t>(bytes, 8);
}
#endif
#ifndef _mm512_cvtepu16_epi64
inline simde__m512i _mm512_cvtepu16_epi64(simde__m128i words) {
    return barellm::simde_extra::widen<simde__m512i, uint64_t, uint16_t>(words, 8);
}
#endif
#ifndef _mm512_cvtepi16_epi32
inline simde__m512i _mm512_cvtepi16_epi32(simde__m256i words) {
    return barellm::simde_extra::widen<simde__m512i, int32_t, int16_t>(words, 16);
}
#endif
#ifndef _mm512_cvtepi64_epi8
// Each lane's low 8 bits (truncation), in the low 8 bytes.
inline simde__m128i _mm512_cvtepi64_epi8(simde__m512i values) {
    using namespace barellm::simde_extra;
    const I64x8 in = bits<I64x8>(values);
    uint8_t out[16] = {};
    for (int i = 0; i < 8; ++i) out[i] = uint8_t(uint64_t(in.lane[i]) & 0xff);
    return bits<simde__m128i>(out);
}
#endif
#ifndef _mm512_mulhi_epu16
// The high 16 bits of each unsigned 16-bit lane's 32-bit product.
inline simde__m512i _mm512_mulhi_epu16(simde__m512i a, simde__m512i b) {
    using namespace barellm::simde_extra;
    uint16_t x[32], y[32], out[32];
    std::memcpy(x, &a, sizeof x);
    std::memcpy(y, &b, sizeof y);
    for (int i = 0; i < 32; ++i) out[i] = uint16_t((uint32_t(x[i]) * y[i]) >> 16);
    return bits<simde__m512i>(out);
}
#endif
