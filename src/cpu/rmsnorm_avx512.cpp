// RMSNorm on AVX-512: out = x / sqrt(mean(x²) + eps) · weight, 16 lanes at a time, the tail
// masked. Each square is rounded to f32 and summed in double, eight lanes a register (the
// double sum of f32 squares rounds to the same f32 mean in any order but for rare ties), and
// the scale is cpu/kernels.h's rms_scale: llama.cpp's RMSNorm, bit for bit.
#include "cpu/avx512.h"
#include "cpu/helpers_avx512.h"

namespace barellm::cpu::avx512 {

void rmsnorm(float* out, const float* x, const float* weight, int n, float eps) {
    __m512d sums[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
    for (int i = 0; i < n; i += kLanes) {
        const __m512 v = _mm512_maskz_loadu_ps(first_lanes(n - i), x + i);
        const __m512 squares = _mm512_mul_ps(v, v);
        sums[0] = _mm512_add_pd(sums[0], _mm512_cvtps_pd(_mm512_castps512_ps256(squares)));
        sums[1] = _mm512_add_pd(sums[1], _mm512_cvtps_pd(_mm512_extractf32x8_ps(squares, 1)));
    }
    const __m512 scale =
        _mm512_set1_ps(rms_scale(x, n, _mm512_reduce_add_pd(_mm512_add_pd(sums[0], sums[1])), eps));
    for (int i = 0; i < n; i += kLanes) {
        const __mmask16 mask = first_lanes(n - i);
        const __m512 normalised = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + i), scale);
        _mm512_mask_storeu_ps(out + i, mask,
                              _mm512_mul_ps(normalised, _mm512_maskz_loadu_ps(mask, weight + i)));
    }
}

}  // namespace barellm::cpu::avx512
