// The decode matvecs on AVX-512 for f32, f16 and bf16 weights: out = W · x for one token,
// the weights widened to f32 in registers (vcvtph2ps for f16, a shift for bf16).
#include <algorithm>
#include <type_traits>

#include "cpu/avx512.h"
#include "cpu/helpers_avx512.h"

namespace barellm::cpu::BARELLM_AVX512_NAMESPACE {

namespace {

constexpr int kAccumulators = 2;  // independent FMA chains: one would wait on the FMA's latency
constexpr int kStep = kAccumulators * kLanes;

// One row of `cols` weights · x, read front to back: one sequential stream, which the
// hardware prefetcher follows across pages (several rows at once, each a stream of its own,
// are read more slowly). Columns past the last whole step go through one register at a
// time, the last one masked.
template <DType kType>
float dot_row(const void* row_data, int cols, const float* x) {
    using Weight = std::conditional_t<kType == DType::F32, float, uint16_t>;
    const Weight* row = static_cast<const Weight*>(row_data);
    __m512 sum[kAccumulators];
    for (__m512& s : sum) s = _mm512_setzero_ps();
    int i = 0;
    for (; i + kStep <= cols; i += kStep)
        for (int a = 0; a < kAccumulators; ++a)
            sum[a] = _mm512_fmadd_ps(widen16<kType>(row + i + a * kLanes),
                                     _mm512_loadu_ps(x + i + a * kLanes), sum[a]);
    for (int a = 0; i < cols; i += kLanes, ++a) {
        const __mmask16 mask = first_lanes(cols - i);
        sum[a] = _mm512_fmadd_ps(widen16<kType>(row + i, mask), _mm512_maskz_loadu_ps(mask, x + i),
                                 sum[a]);
    }
    for (int a = 1; a < kAccumulators; ++a) sum[0] = _mm512_add_ps(sum[0], sum[a]);
    return _mm512_reduce_add_ps(sum[0]);
}

template <DType kType>
void rows_kernel(float* out, const Matrix& w, const float* x, int first_row, int row_count) {
    const size_t row_bytes = size_t(w.cols) * (kType == DType::F32 ? 4 : 2);
    const uint8_t* data = static_cast<const uint8_t*>(w.data);
    for (int r = first_row; r < first_row + row_count; ++r)
        out[r] = dot_row<kType>(data + r * row_bytes, w.cols, x);
}

}  // namespace

void matmul_rows(float* out, const Matrix& w, const float* x, int first_row, int row_count) {
    switch (w.dtype) {
        case DType::F32:
            return rows_kernel<DType::F32>(out, w, x, first_row, row_count);
        case DType::F16:
            return rows_kernel<DType::F16>(out, w, x, first_row, row_count);
        case DType::BF16:
            return rows_kernel<DType::BF16>(out, w, x, first_row, row_count);
        default:
            return;  // Q8 and Q4: matmul_rows_q8 / matmul_rows_q4
    }
}

}  // namespace barellm::cpu::BARELLM_AVX512_NAMESPACE
