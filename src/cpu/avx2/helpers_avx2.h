// Inline AVX2 helpers shared by the *_avx2.cpp kernels: loads that widen weights to f32,
// an 8 × 8 transpose, a horizontal sum, e^x, x's Q8 scales. Include it only from *_avx2.cpp files
// (built with -mavx2 -mfma -mf16c).
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu/avx2/intrinsics_avx2.h"
#include "cpu/kernels.h"
#include "weights/half.h"
#include "weights/model.h"

namespace barellm::cpu::avx2 {

constexpr int kLanes = 8;  // floats per 256-bit register

// Eight consecutive weights starting at `p`, converted to f32.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p, DType dtype) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if (dtype == DType::F16) return _mm256_cvtph_ps(raw);
    // bf16 -> f32: the 16 bits become the top half of each 32-bit lane.
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

// One f16 or bf16 weight as f32, for the columns past the last whole register.
inline float scalar_weight(const uint16_t* p, DType dtype) {
    return dtype == DType::F16 ? half_to_float(*p) : bf16_to_float(*p);
}

// Transposes the 8 × 8 block held in rows[0..7] (rows[i] lane j becomes rows[j] lane i).
inline void transpose8x8(__m256 rows[8]) {
    __m256 pairs[8], quads[8];
    for (int i = 0; i < 8; i += 2) {
        pairs[i] = _mm256_unpacklo_ps(rows[i], rows[i + 1]);
        pairs[i + 1] = _mm256_unpackhi_ps(rows[i], rows[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        quads[i] = _mm256_shuffle_ps(pairs[i], pairs[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        quads[i + 1] = _mm256_shuffle_ps(pairs[i], pairs[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        quads[i + 2] = _mm256_shuffle_ps(pairs[i + 1], pairs[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        quads[i + 3] = _mm256_shuffle_ps(pairs[i + 1], pairs[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; ++i) {
        rows[i] = _mm256_permute2f128_ps(quads[i], quads[i + 4], 0x20);
        rows[i + 4] = _mm256_permute2f128_ps(quads[i], quads[i + 4], 0x31);
    }
}

inline float horizontal_sum(__m256 v) {
    const __m128 halves = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 pairs = _mm_add_ps(halves, _mm_movehl_ps(halves, halves));
    return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}

inline float horizontal_max(__m256 v) {
    const __m128 halves = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 pairs = _mm_max_ps(halves, _mm_movehl_ps(halves, halves));
    return _mm_cvtss_f32(_mm_max_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}
inline int horizontal_sum(__m256i v) {
    const __m128i halves = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i pairs = _mm_add_epi32(halves, _mm_unpackhi_epi64(halves, halves));
    return _mm_cvtsi128_si32(_mm_add_epi32(pairs, _mm_shuffle_epi32(pairs, 1)));
}

// x's Q8 rule (cpu/kernels.h, q8_group_scale) for up to 8 groups at once, from the largest |x|
// of each: one division for the scales, one for the multipliers, and f16's rounding by
// vcvtps2ph (to nearest even): the bits of q8_group_scale. Stores `count` of each.
inline void q8_group_scales(const float* largest, int count, float* scales, float* multipliers) {
    alignas(32) float lanes[kLanes] = {};
    std::copy(largest, largest + count, lanes);
    const __m256 q8_largest = _mm256_set1_ps(kQ8Largest);
    const __m256 l = _mm256_load_ps(lanes);
    const __m256 nonzero = _mm256_cmp_ps(l, _mm256_setzero_ps(), _CMP_NEQ_UQ);
    const __m256 scale = _mm256_and_ps(nonzero, _mm256_div_ps(l, q8_largest));
    const __m256 half_normal =
        _mm256_and_ps(_mm256_cmp_ps(scale, _mm256_set1_ps(kHalfSmallestNormal), _CMP_GE_OQ),
                      _mm256_cmp_ps(scale, _mm256_set1_ps(kHalfLargest), _CMP_LE_OQ));
    const __m256 rounded =
        _mm256_cvtph_ps(_mm256_cvtps_ph(scale, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm256_store_ps(lanes, _mm256_blendv_ps(scale, rounded, half_normal));
    std::copy(lanes, lanes + count, scales);
    _mm256_store_ps(lanes, _mm256_and_ps(nonzero, _mm256_div_ps(q8_largest, l)));
    std::copy(lanes, lanes + count, multipliers);
}

// Below this e^x is taken as 0: e^-87 ≈ 1.6e-38 is near the smallest normal float.
constexpr float kExpLowest = -87.0f;

// e^x in each lane, for x ≤ 0 (0 below kExpLowest, so e^-inf is exactly 0):
// - x = n·ln2 + r with |r| ≤ ln2/2;
// - e^r by its Taylor polynomial of degree 6 (relative error below 2e-7);
// - 2^n written into the exponent bits.
inline __m256 exp_nonpositive(__m256 x) {
    const __m256 below = _mm256_cmp_ps(x, _mm256_set1_ps(kExpLowest), _CMP_LT_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(kExpLowest));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    // ln2 in two parts, so that n · (high part) is exact.
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    for (float coefficient : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(coefficient));
    const __m256i two_to_n =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(below, _mm256_mul_ps(p, _mm256_castsi256_ps(two_to_n)));
}

}  // namespace barellm::cpu::avx2
