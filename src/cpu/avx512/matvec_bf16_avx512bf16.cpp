// The decode matvec on AVX512_BF16 for bf16 weights: out = W · bf16(x) for one token, where
// bf16() rounds x to bf16, to nearest even (as the bf16 prefill GEMM of gemm_bf16_avx512bf16.cpp
// does). vdpbf16ps multiplies 32 bf16 weights by 32 bf16 inputs and adds the products in
// pairs to 16 f32 sums: one instruction for 64 bytes of weights, which need neither widening
// nor copying. Widened to f32 instead (matvec_float_avx512.cpp), each 16 weights cost a widening of
// the weights, one of x and an FMA; on Zen 4, whose 512-bit instructions take both halves of
// its 256-bit units, that left one-thread decode compute-bound, under the streaming read.
//
// One row is read front to back, one stream, each step prefetching matvec_prefetch_bytes() ahead
// (into the next row at its end), as the f16 matvec does; the last columns go through masked loads
// of 16-bit elements, so odd widths need no padding and nothing past a row is read.
#include "cpu/avx512/avx512.h"
#include "cpu/avx512/helpers_avx512.h"

namespace barellm::cpu::avx512 {

namespace {

constexpr int kValuesPerRegister = 2 * kLanes;  // bf16 values in a 512-bit register
constexpr int kAccumulators = 2;                // independent vdpbf16ps chains
constexpr int kStep = kAccumulators * kValuesPerRegister;
constexpr int kStepBytes = kStep * int(sizeof(uint16_t));

// The first `count` of 32 bf16 values.
inline __mmask32 first_values(int count) {
    return count >= kValuesPerRegister ? __mmask32(0xffffffffu) : __mmask32((1u << count) - 1);
}

inline __m512bh as_bf16(__m512i v) { return (__m512bh)v; }

float dot_row(const uint16_t* row, int cols, const uint16_t* bf16_x) {
    const int prefetch_bytes = matvec_prefetch_bytes();
    __m512 sum[kAccumulators];
    for (__m512& s : sum) s = _mm512_setzero_ps();
    int i = 0;
    for (; i + kStep <= cols; i += kStep) {
        prefetch_ahead(row + i, prefetch_bytes, kStepBytes);
        for (int a = 0; a < kAccumulators; ++a) {
            const int at = i + a * kValuesPerRegister;
            sum[a] = _mm512_dpbf16_ps(sum[a], as_bf16(_mm512_loadu_si512(row + at)),
                                      as_bf16(_mm512_loadu_si512(bf16_x + at)));
        }
    }
    for (int a = 0; i < cols; i += kValuesPerRegister, ++a) {
        const __mmask32 mask = first_values(cols - i);
        sum[a] = _mm512_dpbf16_ps(sum[a], as_bf16(_mm512_maskz_loadu_epi16(mask, row + i)),
                                  as_bf16(_mm512_maskz_loadu_epi16(mask, bf16_x + i)));
    }
    for (int a = 1; a < kAccumulators; ++a) sum[0] = _mm512_add_ps(sum[0], sum[a]);
    return _mm512_reduce_add_ps(sum[0]);
}

}  // namespace

void round_to_bf16(uint16_t* bf16_x, const float* x, int n) {
    for (int i = 0; i < n; i += kValuesPerRegister) {
        const int left = n - i;
        const __m512 low = _mm512_maskz_loadu_ps(first_lanes(left), x + i);
        const __m512 high = left > kLanes
                                ? _mm512_maskz_loadu_ps(first_lanes(left - kLanes), x + i + kLanes)
                                : _mm512_setzero_ps();
        _mm512_mask_storeu_epi16(bf16_x + i, first_values(left),
                                 (__m512i)_mm512_cvtne2ps_pbh(high, low));
    }
}

void matvec_rows_bf16_x(float* out, const Matrix& w, const uint16_t* bf16_x, int first_row,
                        int row_count) {
    const uint16_t* data = static_cast<const uint16_t*>(w.data);
    for (int r = first_row; r < first_row + row_count; ++r)
        out[r] = dot_row(data + size_t(r) * w.cols, w.cols, bf16_x);
}

}  // namespace barellm::cpu::avx512
