// Inline AVX-512 helpers shared by the *_avx512*.cpp kernels: weights widened to f32 and
// tail masks. Include it only from those files (built with -mavx512f -mavx512bw -mavx512vl
// -mavx512dq, or on SIMDe in the unit tests).
#pragma once
#include <cstdint>

#include "cpu/intrinsics_avx512.h"
#include "model.h"

namespace barellm::cpu::avx512 {

constexpr int kLanes = 16;  // floats per 512-bit register

// The first `count` lanes of 16 (all of them when count ≥ 16).
inline __mmask16 first_lanes(int count) {
    return count >= kLanes ? __mmask16(0xffff) : __mmask16((1u << count) - 1);
}
// The first `count` bytes of 64.
inline __mmask64 first_bytes(int count) {
    return count >= 64 ? ~__mmask64(0) : (__mmask64(1) << count) - 1;
}

// The weights of storage type kType at p[0..15] as f32; lanes outside `mask` are 0 and
// their memory is not read.
template <DType kType>
inline __m512 widen16(const void* p, __mmask16 mask) {
    if constexpr (kType == DType::F32) {
        return _mm512_maskz_loadu_ps(mask, p);
    } else {
        const __m256i raw = _mm256_maskz_loadu_epi16(mask, p);
        if constexpr (kType == DType::F16) return _mm512_cvtph_ps(raw);
        // bf16 -> f32: the 16 bits become the top half of each 32-bit lane.
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    }
}
template <DType kType>
inline __m512 widen16(const void* p) {
    if constexpr (kType == DType::F32) {
        return _mm512_loadu_ps(p);
    } else {
        const __m256i raw = _mm256_loadu_si256(static_cast<const __m256i*>(p));
        if constexpr (kType == DType::F16) return _mm512_cvtph_ps(raw);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    }
}

}  // namespace barellm::cpu::avx512
