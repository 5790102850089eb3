// SwiGLU, the feed-forward block's activation, on AVX2 + FMA: silu(gate) · up with a
// vectorised e^x.
#include <immintrin.h>

#include "cpu/avx2.h"
#include "cpu/helpers_avx2.h"
#include "cpu/scalar.h"

namespace barellm::cpu::avx2 {

// gate[n] = silu(gate) · up, where silu(g) = g · σ(g) and σ(g) = 1 / (1 + e^-g), written
// with e = e^-|g| ≤ 1 as 1 / (1 + e) for g ≥ 0 and e / (1 + e) for g < 0.
void swiglu(float* gate, const float* up, int n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 sign_bit = _mm256_set1_ps(-0.0f);
    int i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = exp_nonpositive(_mm256_or_ps(g, sign_bit));  // e^-|g|
        const __m256 numerator = _mm256_blendv_ps(one, e, g);         // e where g's sign is set
        const __m256 sigmoid = _mm256_div_ps(numerator, _mm256_add_ps(one, e));
        _mm256_storeu_ps(gate + i,
                         _mm256_mul_ps(_mm256_mul_ps(g, sigmoid), _mm256_loadu_ps(up + i)));
    }
    scalar::swiglu(gate + i, up + i, n - i);
}

}  // namespace barellm::cpu::avx2
