// Decode attention on AVX-512: a query head's dot with a key row, and the weighted sum of
// value rows, 16 elements per instruction, the tail masked (prefill attention runs on AVX2).
#include "cpu/avx512.h"
#include "cpu/helpers_avx512.h"
#include "kv_cache.h"

namespace barellm::cpu::avx512 {

namespace {

// n cache elements at p (f32 or f16) from element i on, widened to f32; lanes outside
// `mask` are 0.
inline __m512 load_kv(const void* p, int i, KvType type, __mmask16 mask) {
    return type == KvType::F32 ? widen16<DType::F32>(static_cast<const float*>(p) + i, mask)
                               : widen16<DType::F16>(static_cast<const uint16_t*>(p) + i, mask);
}

}  // namespace

float dot_kv(const float* q, const void* keys, int n, KvType type) {
    __m512 sum = _mm512_setzero_ps();
    for (int i = 0; i < n; i += kLanes) {
        const __mmask16 mask = first_lanes(n - i);
        sum =
            _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, q + i), load_kv(keys, i, type, mask), sum);
    }
    return _mm512_reduce_add_ps(sum);
}

void add_scaled_kv(float* out, float scale, const void* values, int n, KvType type) {
    const __m512 scale_vector = _mm512_set1_ps(scale);
    for (int i = 0; i < n; i += kLanes) {
        const __mmask16 mask = first_lanes(n - i);
        _mm512_mask_storeu_ps(out + i, mask,
                              _mm512_fmadd_ps(scale_vector, load_kv(values, i, type, mask),
                                              _mm512_maskz_loadu_ps(mask, out + i)));
    }
}

}  // namespace barellm::cpu::avx512
