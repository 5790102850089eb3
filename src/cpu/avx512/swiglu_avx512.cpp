// The feed-forward block's gated activations on AVX-512, with a vectorised e^x, 16 lanes at a
// time, the tail masked: SwiGLU, silu(gate) · up (Llama, Qwen), GeGLU, gelu_tanh(gate) · up
// (Gemma), and gpt-oss's clamped SwiGLU; and Gemma 2's soft-capping of scores, cap · tanh(x / cap),
// on the same e^x.
#include "cpu/avx512/avx512.h"
#include "cpu/avx512/helpers_avx512.h"

namespace barellm::cpu::avx512 {

namespace {

// σ(x) = 1 / (1 + e^-x), written with e = e^-|x| ≤ 1 (no overflow) as 1 / (1 + e) for
// x ≥ 0 and e / (1 + e) for x < 0.
__m512 sigmoid(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x)));
    const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 numerator = _mm512_mask_blend_ps(negative, one, e);
    return _mm512_div_ps(numerator, _mm512_add_ps(one, e));
}

}  // namespace

// gate[n] = silu(gate) · up, where silu(g) = g · σ(g).
void swiglu(float* gate, const float* up, int n) {
    for (int i = 0; i < n; i += kLanes) {
        const __mmask16 mask = first_lanes(n - i);
        const __m512 g = _mm512_maskz_loadu_ps(mask, gate + i);
        _mm512_mask_storeu_ps(
            gate + i, mask,
            _mm512_mul_ps(_mm512_mul_ps(g, sigmoid(g)), _mm512_maskz_loadu_ps(mask, up + i)));
    }
}

// gate[n] = gelu_tanh(gate) · up, where gelu_tanh(g) = g/2 · (1 + tanh(u)) with
// u = √(2/π) (g + 0.044715 g³), written as g · σ(2u) (1 + tanh(u) = 2σ(2u)).
void geglu(float* gate, const float* up, int n) {
    const __m512 cubic = _mm512_set1_ps(0.044715f);
    const __m512 two_sqrt_2_over_pi = _mm512_set1_ps(1.5957691216f);  // 2 √(2/π)
    for (int i = 0; i < n; i += kLanes) {
        const __mmask16 mask = first_lanes(n - i);
        const __m512 g = _mm512_maskz_loadu_ps(mask, gate + i);
        const __m512 g_cubed = _mm512_mul_ps(_mm512_mul_ps(g, g), g);
        const __m512 two_u = _mm512_mul_ps(two_sqrt_2_over_pi, _mm512_fmadd_ps(cubic, g_cubed, g));
        _mm512_mask_storeu_ps(
            gate + i, mask,
            _mm512_mul_ps(_mm512_mul_ps(g, sigmoid(two_u)), _mm512_maskz_loadu_ps(mask, up + i)));
    }
}

// gate[n] = g · σ(α g) · (u + 1) with g = min(gate, limit), u = clamp(up, -limit, limit) and
// α = kSwigluOaiAlpha (gpt-oss).
void swiglu_oai(float* gate, const float* up, int n, float limit) {
    const __m512 alpha = _mm512_set1_ps(kSwigluOaiAlpha);
    const __m512 high = _mm512_set1_ps(limit), low = _mm512_set1_ps(-limit);
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int i = 0; i < n; i += kLanes) {
        const __mmask16 mask = first_lanes(n - i);
        const __m512 g = _mm512_min_ps(_mm512_maskz_loadu_ps(mask, gate + i), high);
        const __m512 u =
            _mm512_min_ps(_mm512_max_ps(_mm512_maskz_loadu_ps(mask, up + i), low), high);
        const __m512 glu = _mm512_mul_ps(g, sigmoid(_mm512_mul_ps(alpha, g)));
        _mm512_mask_storeu_ps(gate + i, mask, _mm512_mul_ps(glu, _mm512_add_ps(u, one)));
    }
}

// x[n] = cap · tanh(x / cap), where tanh(y) = sign(y) · (1 - e) / (1 + e) with e = e^-2|y| ≤ 1
// (no overflow).
void softcap(float* x, int n, float cap) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 cap_vector = _mm512_set1_ps(cap);
    const __m512 minus_two_over_cap = _mm512_set1_ps(-2.0f / cap);
    const __m512 sign_bit = _mm512_set1_ps(-0.0f);
    for (int i = 0; i < n; i += kLanes) {
        const __mmask16 mask = first_lanes(n - i);
        const __m512 v = _mm512_maskz_loadu_ps(mask, x + i);
        const __m512 e = exp_nonpositive(_mm512_mul_ps(minus_two_over_cap, _mm512_abs_ps(v)));
        const __m512 magnitude =
            _mm512_mul_ps(cap_vector, _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e)));
        _mm512_mask_storeu_ps(x + i, mask, _mm512_or_ps(magnitude, _mm512_and_ps(v, sign_bit)));
    }
}

}  // namespace barellm::cpu::avx512
