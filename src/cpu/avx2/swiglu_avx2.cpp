// The feed-forward block's gated activations on AVX2 + FMA, with a vectorised e^x: SwiGLU,
// silu(gate) · up (Llama, Qwen), GeGLU, gelu_tanh(gate) · up (Gemma), and gpt-oss's clamped
// SwiGLU; and Gemma 2's
// soft-capping of scores, cap · tanh(x / cap), on the same e^x.
#include <immintrin.h>

#include "cpu/avx2/avx2.h"
#include "cpu/avx2/helpers_avx2.h"
#include "cpu/scalar.h"

namespace barellm::cpu::avx2 {

namespace {

// σ(x) = 1 / (1 + e^-x), written with e = e^-|x| ≤ 1 (no overflow) as 1 / (1 + e) for
// x ≥ 0 and e / (1 + e) for x < 0.
__m256 sigmoid(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 e = exp_nonpositive(_mm256_or_ps(x, _mm256_set1_ps(-0.0f)));  // e^-|x|
    const __m256 numerator = _mm256_blendv_ps(one, e, x);  // e where x's sign is set
    return _mm256_div_ps(numerator, _mm256_add_ps(one, e));
}

}  // namespace

// gate[n] = silu(gate) · up, where silu(g) = g · σ(g).
void swiglu(float* gate, const float* up, int n) {
    int i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        _mm256_storeu_ps(gate + i,
                         _mm256_mul_ps(_mm256_mul_ps(g, sigmoid(g)), _mm256_loadu_ps(up + i)));
    }
    scalar::swiglu(gate + i, up + i, n - i);
}

// gate[n] = gelu_tanh(gate) · up, where gelu_tanh(g) = g/2 · (1 + tanh(u)) with
// u = √(2/π) (g + 0.044715 g³), written as g · σ(2u) (1 + tanh(u) = 2σ(2u)).
void geglu(float* gate, const float* up, int n) {
    const __m256 cubic = _mm256_set1_ps(0.044715f);
    const __m256 two_sqrt_2_over_pi = _mm256_set1_ps(1.5957691216f);  // 2 √(2/π)
    int i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 g_cubed = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
        const __m256 two_u = _mm256_mul_ps(two_sqrt_2_over_pi, _mm256_fmadd_ps(cubic, g_cubed, g));
        _mm256_storeu_ps(gate + i,
                         _mm256_mul_ps(_mm256_mul_ps(g, sigmoid(two_u)), _mm256_loadu_ps(up + i)));
    }
    scalar::geglu(gate + i, up + i, n - i);
}

// gate[n] = g · σ(α g) · (u + 1) with g = min(gate, limit), u = clamp(up, -limit, limit) and
// α = kSwigluOaiAlpha (gpt-oss).
void swiglu_oai(float* gate, const float* up, int n, float limit) {
    const __m256 alpha = _mm256_set1_ps(kSwigluOaiAlpha);
    const __m256 high = _mm256_set1_ps(limit), low = _mm256_set1_ps(-limit);
    const __m256 one = _mm256_set1_ps(1.0f);
    int i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        const __m256 g = _mm256_min_ps(_mm256_loadu_ps(gate + i), high);
        const __m256 u = _mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(up + i), low), high);
        const __m256 glu = _mm256_mul_ps(g, sigmoid(_mm256_mul_ps(alpha, g)));
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(glu, _mm256_add_ps(u, one)));
    }
    scalar::swiglu_oai(gate + i, up + i, n - i, limit);
}

// x[n] = cap · tanh(x / cap), where tanh(y) = sign(y) · (1 - e) / (1 + e) with e = e^-2|y| ≤ 1
// (no overflow).
void softcap(float* x, int n, float cap) {
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 cap_vector = _mm256_set1_ps(cap);
    const __m256 minus_two_over_cap = _mm256_set1_ps(-2.0f / cap);
    const __m256 sign_bit = _mm256_set1_ps(-0.0f);
    int i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 e =
            exp_nonpositive(_mm256_mul_ps(minus_two_over_cap, _mm256_andnot_ps(sign_bit, v)));
        const __m256 magnitude =
            _mm256_mul_ps(cap_vector, _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e)));
        _mm256_storeu_ps(x + i, _mm256_or_ps(magnitude, _mm256_and_ps(v, sign_bit)));
    }
    scalar::softcap(x + i, n - i, cap);
}

}  // namespace barellm::cpu::avx2
