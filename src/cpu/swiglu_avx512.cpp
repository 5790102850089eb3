// SwiGLU, the feed-forward block's activation, on AVX-512: silu(gate) · up with a
// vectorised e^x, 16 lanes at a time, the tail masked.
#include "cpu/avx512.h"
#include "cpu/helpers_avx512.h"

namespace barellm::cpu::avx512 {

// gate[n] = silu(gate) · up, where silu(g) = g · σ(g) and σ(g) = 1 / (1 + e^-g), written
// with e = e^-|g| ≤ 1 as 1 / (1 + e) for g ≥ 0 and e / (1 + e) for g < 0.
void swiglu(float* gate, const float* up, int n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int i = 0; i < n; i += kLanes) {
        const __mmask16 mask = first_lanes(n - i);
        const __m512 g = _mm512_maskz_loadu_ps(mask, gate + i);
        const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g)));
        const __mmask16 negative = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
        const __m512 numerator = _mm512_mask_blend_ps(negative, one, e);
        const __m512 sigmoid = _mm512_div_ps(numerator, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(
            gate + i, mask,
            _mm512_mul_ps(_mm512_mul_ps(g, sigmoid), _mm512_maskz_loadu_ps(mask, up + i)));
    }
}

}  // namespace barellm::cpu::avx512
