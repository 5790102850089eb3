// RMSNorm on AVX2: out = x / sqrt(mean(x²) + eps) · weight, 8 lanes at a time, the tail
// scalar. As the AVX-512 rmsnorm: each square rounded to f32 and summed in double in lanes,
// again in order only where mean_of_squares_settled says the lanes' f32 mean could differ
// from the in-order one; the scale is cpu/kernels.h's rms_scale, llama.cpp's RMSNorm bit
// for bit.
#include <immintrin.h>

#include "cpu/avx2/avx2.h"
#include "cpu/avx2/helpers_avx2.h"

namespace barellm::cpu::avx2 {

void rmsnorm(float* out, const float* x, const float* weight, int n, float eps) {
    const int whole = n / kLanes * kLanes;
    __m256d low_sums = _mm256_setzero_pd(), high_sums = _mm256_setzero_pd();
    for (int i = 0; i < whole; i += kLanes) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 squares = _mm256_mul_ps(v, v);
        low_sums = _mm256_add_pd(low_sums, _mm256_cvtps_pd(_mm256_castps256_ps128(squares)));
        high_sums = _mm256_add_pd(high_sums, _mm256_cvtps_pd(_mm256_extractf128_ps(squares, 1)));
    }
    alignas(32) double lanes[4];
    _mm256_store_pd(lanes, _mm256_add_pd(low_sums, high_sums));
    double sum_of_squares = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (int i = whole; i < n; ++i) sum_of_squares += double(x[i] * x[i]);
    if (!mean_of_squares_settled(sum_of_squares, n)) sum_of_squares = sum_of_f32_squares(x, n);
    const float scale = rms_scale(x, n, sum_of_squares, eps);
    const __m256 scales = _mm256_set1_ps(scale);
    for (int i = 0; i < whole; i += kLanes)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), scales),
                                                _mm256_loadu_ps(weight + i)));
    for (int i = whole; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

}  // namespace barellm::cpu::avx2
