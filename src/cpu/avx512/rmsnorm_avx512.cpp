// RMSNorm on AVX-512: out = x / sqrt(mean(x²) + eps) · weight, 16 lanes at a time, the tail
// masked. Each square is rounded to f32 and summed in double in order, as the scalar rmsnorm
// sums them, and the scale is cpu/kernels.h's rms_scale: llama.cpp's RMSNorm, bit for bit.
#include "cpu/avx512/avx512.h"
#include "cpu/avx512/helpers_avx512.h"

namespace barellm::cpu::avx512 {

void rmsnorm(float* out, const float* x, const float* weight, int n, float eps) {
    double sum_of_squares = 0.0;
    alignas(64) float squares[kLanes];
    for (int i = 0; i < n; i += kLanes) {
        const __m512 v = _mm512_maskz_loadu_ps(first_lanes(n - i), x + i);
        _mm512_store_ps(squares, _mm512_mul_ps(v, v));  // 0 past n
        for (const float square : squares) sum_of_squares += square;
    }
    const __m512 scale = _mm512_set1_ps(rms_scale(x, n, sum_of_squares, eps));
    for (int i = 0; i < n; i += kLanes) {
        const __mmask16 mask = first_lanes(n - i);
        const __m512 normalised = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + i), scale);
        _mm512_mask_storeu_ps(out + i, mask,
                              _mm512_mul_ps(normalised, _mm512_maskz_loadu_ps(mask, weight + i)));
    }
}

}  // namespace barellm::cpu::avx512
