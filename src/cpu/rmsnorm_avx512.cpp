// RMSNorm on AVX-512: out = x / sqrt(mean(x²) + eps) · weight, 16 lanes at a time, the tail
// masked. The sum of squares runs in four registers of f32 (64 partial sums, each of at most
// n / 64 squares, so its rounding stays near f32's own; the scalar rmsnorm sums in double)
// and the partial sums are added in double; a vector whose f32 sums overflow is summed again
// in double.
#include <cmath>

#include "cpu/avx512.h"
#include "cpu/helpers_avx512.h"

namespace barellm::cpu::avx512 {

void rmsnorm(float* out, const float* x, const float* weight, int n, float eps) {
    constexpr int kSums = 4;  // independent accumulators, so that the FMAs overlap
    __m512 sums[kSums] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                          _mm512_setzero_ps()};
    for (int i = 0, step = 0; i < n; i += kLanes, step = (step + 1) % kSums) {
        const __m512 v = _mm512_maskz_loadu_ps(first_lanes(n - i), x + i);
        sums[step] = _mm512_fmadd_ps(v, v, sums[step]);
    }
    alignas(64) float partial[kSums][kLanes];
    for (int s = 0; s < kSums; ++s) _mm512_store_ps(partial[s], sums[s]);
    double sum_of_squares = 0.0;
    for (int s = 0; s < kSums; ++s)
        for (int lane = 0; lane < kLanes; ++lane) sum_of_squares += partial[s][lane];
    // Squares past f32's range (|x| above about 1.8e19) made the f32 sums infinite, which
    // would scale every output to 0: such a vector is summed again in double, as the
    // scalar rmsnorm does, and the result is the true norm (or Inf/NaN for x that is).
    if (std::isinf(sum_of_squares)) {
        sum_of_squares = 0.0;
        for (int i = 0; i < n; ++i) sum_of_squares += double(x[i]) * x[i];
    }
    const __m512 scale = _mm512_set1_ps(float(1.0 / std::sqrt(sum_of_squares / n + eps)));
    for (int i = 0; i < n; i += kLanes) {
        const __mmask16 mask = first_lanes(n - i);
        const __m512 normalised = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + i), scale);
        _mm512_mask_storeu_ps(out + i, mask,
                              _mm512_mul_ps(normalised, _mm512_maskz_loadu_ps(mask, weight + i)));
    }
}

}  // namespace barellm::cpu::avx512
