// The decode matvecs on AVX-512 for f32, f16 and bf16 weights: out = W · x for one token,
// the weights converted to f32 in registers (vcvtph2ps for f16, a shift for bf16), x in f32
// or rounded to f16.
#include <algorithm>
#include <type_traits>

#include "cpu/avx512/avx512.h"
#include "cpu/avx512/helpers_avx512.h"

namespace barellm::cpu::avx512 {

namespace {

constexpr int kAccumulators = 2;  // independent FMA chains: one would wait on the FMA's latency
constexpr int kStep = kAccumulators * kLanes;
constexpr float kLargestHalf = 65504.0f;

// The storage type of values of type kType.
template <DType kType>
using Storage = std::conditional_t<kType == DType::F32, float, uint16_t>;

// One row of `cols` weights (type kWeights) · x (type kX: F32 or F16), read front to back:
// one sequential stream (several rows at once, each a stream of its own, are read more
// slowly), each step prefetching the cache lines matvec_prefetch_bytes() ahead, into the next row
// at its end (the rows lie one after another; a prefetch past the matrix is only a hint).
// Columns past the last whole step go through one register at a time, the last one masked.
template <DType kWeights, DType kX>
float dot_row(const void* row_data, int cols, const void* x_data) {
    const Storage<kWeights>* row = static_cast<const Storage<kWeights>*>(row_data);
    const Storage<kX>* x = static_cast<const Storage<kX>*>(x_data);
    constexpr int kStepBytes = kStep * sizeof(Storage<kWeights>);
    const int prefetch_bytes = matvec_prefetch_bytes();
    __m512 sum[kAccumulators];
    for (__m512& s : sum) s = _mm512_setzero_ps();
    int i = 0;
    for (; i + kStep <= cols; i += kStep) {
        prefetch_ahead(row + i, prefetch_bytes, kStepBytes);
        for (int a = 0; a < kAccumulators; ++a)
            sum[a] = _mm512_fmadd_ps(widen16<kWeights>(row + i + a * kLanes),
                                     widen16<kX>(x + i + a * kLanes), sum[a]);
    }
    for (int a = 0; i < cols; i += kLanes, ++a) {
        const __mmask16 mask = first_lanes(cols - i);
        sum[a] =
            _mm512_fmadd_ps(widen16<kWeights>(row + i, mask), widen16<kX>(x + i, mask), sum[a]);
    }
    for (int a = 1; a < kAccumulators; ++a) sum[0] = _mm512_add_ps(sum[0], sum[a]);
    return _mm512_reduce_add_ps(sum[0]);
}

template <DType kWeights, DType kX>
void rows_kernel(float* out, const Matrix& w, const void* x, int first_row, int row_count) {
    const size_t row_bytes = size_t(w.cols) * sizeof(Storage<kWeights>);
    const uint8_t* data = static_cast<const uint8_t*>(w.data);
    for (int r = first_row; r < first_row + row_count; ++r)
        out[r] = dot_row<kWeights, kX>(data + r * row_bytes, w.cols, x);
}

}  // namespace

// Twelve cache lines on Intel, four on AMD: the distances that gave the fastest one-thread
// f16 decode of each (docs/benchmarks-history.md: "CPU: software prefetch distances of the
// decode matvecs").
int matvec_prefetch_bytes() {
    static const int bytes = __builtin_cpu_is("amd") ? 4 * kCacheLine : 12 * kCacheLine;
    return bytes;
}

void matvec_rows(float* out, const Matrix& w, const float* x, int first_row, int row_count) {
    switch (w.dtype) {
        case DType::F32:
            return rows_kernel<DType::F32, DType::F32>(out, w, x, first_row, row_count);
        case DType::F16:
            return rows_kernel<DType::F16, DType::F32>(out, w, x, first_row, row_count);
        case DType::BF16:
            return rows_kernel<DType::BF16, DType::F32>(out, w, x, first_row, row_count);
        default:
            return;  // Q8 and Q4: matvec_rows_q8 / matvec_rows_q4
    }
}

void matvec_rows_half_x(float* out, const Matrix& w, const uint16_t* half_x, int first_row,
                        int row_count) {
    if (w.dtype == DType::F16)
        rows_kernel<DType::F16, DType::F16>(out, w, half_x, first_row, row_count);
    else if (w.dtype == DType::BF16)
        rows_kernel<DType::BF16, DType::F16>(out, w, half_x, first_row, row_count);
}

bool round_to_half(uint16_t* half_x, const float* x, int n) {
    const __m512 largest = _mm512_set1_ps(kLargestHalf);
    __mmask16 in_range = 0xffff;
    for (int i = 0; i < n; i += kLanes) {
        const __mmask16 mask = first_lanes(n - i);
        const __m512 values = _mm512_maskz_loadu_ps(mask, x + i);
        // |x| ≤ largest is false for NaN too.
        in_range &= _mm512_cmp_ps_mask(_mm512_abs_ps(values), largest, _CMP_LE_OQ);
        _mm256_mask_storeu_epi16(half_x + i, mask,
                                 _mm512_cvtps_ph(values, _MM_FROUND_TO_NEAREST_INT));
    }
    return in_range == 0xffff;
}

}  // namespace barellm::cpu::avx512
