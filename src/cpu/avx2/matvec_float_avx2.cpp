// The decode matvec on AVX2 + FMA + F16C for f32, f16 and bf16 weights: out = W · x for one
// token, the weights converted to f32 in registers.
#include <immintrin.h>

#include <type_traits>

#include "cpu/avx2/avx2.h"
#include "cpu/avx2/helpers_avx2.h"

namespace barellm::cpu::avx2 {

namespace {

// Four rows at a time share each load of x; the tail columns (cols % 8) go scalar.
template <typename Weight>
void rows_kernel(float* out, const Weight* w, DType dtype, int cols, const float* x, int first_row,
                 int row_count) {
    const int vector_cols = cols - cols % kLanes;
    constexpr int kLineWeights = 64 / sizeof(Weight);  // weights per 64-byte cache line
    int r = first_row;
    const int end = first_row + row_count;
    for (; r + 4 <= end; r += 4) {
        const Weight* row0 = w + size_t(r) * cols;
        const Weight* row1 = row0 + cols;
        const Weight* row2 = row1 + cols;
        const Weight* row3 = row2 + cols;
        __m256 sum0 = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps();
        __m256 sum2 = _mm256_setzero_ps(), sum3 = _mm256_setzero_ps();
        for (int i = 0; i < vector_cols; i += kLanes) {
            // The same columns of the next four rows, a cache line per row at a time: rows
            // of 4 KB (2048 f16) each start a new page, where the hardware prefetcher stops.
            if (i % kLineWeights == 0)
                for (const Weight* row : {row0, row1, row2, row3})
                    _mm_prefetch(reinterpret_cast<const char*>(row + 4 * size_t(cols) + i),
                                 _MM_HINT_T0);
            const __m256 xv = _mm256_loadu_ps(x + i);
            if constexpr (std::is_same_v<Weight, float>) {
                sum0 = _mm256_fmadd_ps(load8(row0 + i), xv, sum0);
                sum1 = _mm256_fmadd_ps(load8(row1 + i), xv, sum1);
                sum2 = _mm256_fmadd_ps(load8(row2 + i), xv, sum2);
                sum3 = _mm256_fmadd_ps(load8(row3 + i), xv, sum3);
            } else {
                sum0 = _mm256_fmadd_ps(load8(row0 + i, dtype), xv, sum0);
                sum1 = _mm256_fmadd_ps(load8(row1 + i, dtype), xv, sum1);
                sum2 = _mm256_fmadd_ps(load8(row2 + i, dtype), xv, sum2);
                sum3 = _mm256_fmadd_ps(load8(row3 + i, dtype), xv, sum3);
            }
        }
        float totals[4] = {horizontal_sum(sum0), horizontal_sum(sum1), horizontal_sum(sum2),
                           horizontal_sum(sum3)};
        const Weight* rows[4] = {row0, row1, row2, row3};
        for (int k = 0; k < 4; ++k) {
            for (int i = vector_cols; i < cols; ++i) {
                if constexpr (std::is_same_v<Weight, float>)
                    totals[k] += rows[k][i] * x[i];
                else
                    totals[k] += scalar_weight(rows[k] + i, dtype) * x[i];
            }
            out[r + k] = totals[k];
        }
    }
    for (; r < end; ++r) {  // fewer than four rows left
        const Weight* row = w + size_t(r) * cols;
        __m256 sum = _mm256_setzero_ps();
        for (int i = 0; i < vector_cols; i += kLanes) {
            if constexpr (std::is_same_v<Weight, float>)
                sum = _mm256_fmadd_ps(load8(row + i), _mm256_loadu_ps(x + i), sum);
            else
                sum = _mm256_fmadd_ps(load8(row + i, dtype), _mm256_loadu_ps(x + i), sum);
        }
        float total = horizontal_sum(sum);
        for (int i = vector_cols; i < cols; ++i) {
            if constexpr (std::is_same_v<Weight, float>)
                total += row[i] * x[i];
            else
                total += scalar_weight(row + i, dtype) * x[i];
        }
        out[r] = total;
    }
}

}  // namespace

void matvec_rows(float* out, const Matrix& w, const float* x, int first_row, int row_count) {
    if (w.dtype == DType::F32)
        rows_kernel(out, static_cast<const float*>(w.data), w.dtype, w.cols, x, first_row,
                    row_count);
    else
        rows_kernel(out, static_cast<const uint16_t*>(w.data), w.dtype, w.cols, x, first_row,
                    row_count);
}

}  // namespace barellm::cpu::avx2
