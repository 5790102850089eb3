// RMSNorm on AVX-512: out = x / sqrt(mean(x²) + eps) · weight, 16 lanes at a time, the tail
// masked. Each square is rounded to f32 and summed in double, in 16 lanes, and the scale is
// cpu/kernels.h's rms_scale: llama.cpp's RMSNorm, bit for bit. llama.cpp (and the scalar
// rmsnorm) sums the squares in order, a chain of n additions; the lanes give the same f32
// mean, which is all rms_scale takes from the sum, except within rounding of an f32 boundary,
// where mean_of_squares_settled says so and the squares are summed again in order.
#include "cpu/avx512/avx512.h"
#include "cpu/avx512/helpers_avx512.h"

namespace barellm::cpu::avx512 {

void rmsnorm(float* out, const float* x, const float* weight, int n, float eps) {
    __m512d low_sums = _mm512_setzero_pd(), high_sums = _mm512_setzero_pd();
    for (int i = 0; i < n; i += kLanes) {
        const __m512 v = _mm512_maskz_loadu_ps(first_lanes(n - i), x + i);
        const __m512 squares = _mm512_mul_ps(v, v);  // 0 past n
        low_sums = _mm512_add_pd(low_sums, _mm512_cvtps_pd(_mm512_castps512_ps256(squares)));
        high_sums = _mm512_add_pd(high_sums, _mm512_cvtps_pd(_mm512_extractf32x8_ps(squares, 1)));
    }
    double sum_of_squares = _mm512_reduce_add_pd(_mm512_add_pd(low_sums, high_sums));
    if (!mean_of_squares_settled(sum_of_squares, n)) sum_of_squares = sum_of_f32_squares(x, n);
    const __m512 scale = _mm512_set1_ps(rms_scale(x, n, sum_of_squares, eps));
    for (int i = 0; i < n; i += kLanes) {
        const __mmask16 mask = first_lanes(n - i);
        const __m512 normalised = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + i), scale);
        _mm512_mask_storeu_ps(out + i, mask,
                              _mm512_mul_ps(normalised, _mm512_maskz_loadu_ps(mask, weight + i)));
    }
}

}  // namespace barellm::cpu::avx512
