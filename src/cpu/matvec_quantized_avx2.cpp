// The decode matvecs on AVX2 + FMA + F16C for Q8 and Q4 weights: out = W · x for one token,
// x quantized to Q8 (cpu::quantize_q8) and each group's dot product in integers.
#include <immintrin.h>

#include "cpu/avx2.h"
#include "cpu/helpers_avx2.h"
#include "cpu/panel_prefetcher.h"

namespace barellm::cpu::avx2 {

namespace {

// The Q8 and Q4 matvecs read each row's values and its scales as two streams, front to back,
// and ask for the cache lines kPrefetchBytes ahead of the values (kScalePrefetchBytes ahead
// of the scales) as they go: the hardware prefetcher alone left the loads waiting on memory.
// The distances are the best measured (docs/benchmarks-history.md:
// "CPU: software prefetch distances of the decode matvecs").
constexpr int kPrefetchBytes = 1536;
constexpr int kScalePrefetchBytes = 256;

// Sum over one group of 32 of w[i] * x[i] as int32 lanes: |w| (unsigned) times x with
// w's sign, multiplied in pairs into int16 (at most 2 * 127 * 127, no overflow), then
// pairs of those into int32.
inline __m256 q8_group_dot(const int8_t* w, const int8_t* x) {
    const __m256i weights = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    const __m256i values = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    const __m256i products =
        _mm256_maddubs_epi16(_mm256_sign_epi8(weights, weights), _mm256_sign_epi8(values, weights));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(products, _mm256_set1_epi16(1)));
}

// One Q4 block against x as int32 lanes: Σ q[i] × x[i], the unsigned 4-bit q as they are
// (Q4's offset of 8 is subtracted per group by q4_row_dot). The 16 bytes widen to the
// 32 q in column order: low nibbles are columns 0-15, high nibbles 16-31.
inline __m256 q4_block_dot(const uint8_t* block, const int8_t* x) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block));
    const __m128i low_nibble = _mm_set1_epi8(0x0f);
    const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), low_nibble),
                                       _mm_and_si128(bytes, low_nibble));
    const __m256i values = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    // q × x in pairs into int16 (at most 2 × 15 × 127), then pairs of those into int32.
    const __m256i products = _mm256_maddubs_epi16(q, values);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(products, _mm256_set1_epi16(1)));
}

// One Q8 row · quantized x: whole groups with AVX2, a short last group in scalar.
inline float q8_row_dot(const int8_t* row, const uint16_t* row_scales, const QuantizedVector& x,
                        int cols) {
    const int whole_groups = cols / kQ8Group;
    __m256 sum = _mm256_setzero_ps();
    int g = 0;
    // Eight groups at a time: their eight scales (weight × x) in one register, each
    // broadcast to the lanes of its group's sum.
    for (; g + kLanes <= whole_groups; g += kLanes) {
        prefetch_ahead(row + g * kQ8Group, kPrefetchBytes, kLanes * kQ8Group);
        prefetch_ahead(row_scales + g, kScalePrefetchBytes, kLanes * sizeof(uint16_t));
        const __m256 scales = _mm256_mul_ps(
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row_scales + g))),
            _mm256_loadu_ps(x.scales.data() + g));
#pragma GCC unroll 8
        for (int k = 0; k < kLanes; ++k) {
            const __m256 scale = _mm256_permutevar8x32_ps(scales, _mm256_set1_epi32(k));
            sum = _mm256_fmadd_ps(
                q8_group_dot(row + (g + k) * kQ8Group, x.values.data() + (g + k) * kQ8Group), scale,
                sum);
        }
    }
    for (; g < whole_groups; ++g) {
        const float scale = _cvtsh_ss(row_scales[g]) * x.scales[g];
        sum = _mm256_fmadd_ps(q8_group_dot(row + g * kQ8Group, x.values.data() + g * kQ8Group),
                              _mm256_set1_ps(scale), sum);
    }
    float total = horizontal_sum(sum);
    if (whole_groups * kQ8Group < cols) {
        int32_t tail = 0;
        for (int i = whole_groups * kQ8Group; i < cols; ++i) tail += row[i] * x.values[i];
        total += tail * _cvtsh_ss(row_scales[whole_groups]) * x.scales[whole_groups];
    }
    return total;
}

// One Q4 row · quantized x (Q4 rows are whole blocks): Σ over blocks b of weight scale ×
// x scale × (Σ q × x − 8 × Σ x), the second sum x.group_sums[b], eight blocks at a time.
inline float q4_row_dot(const uint8_t* row, const uint16_t* row_scales, const QuantizedVector& x,
                        int cols) {
    const int blocks = cols / kQ4Block;
    const int8_t* x_values = x.values.data();
    __m256 sum = _mm256_setzero_ps(), offsets = _mm256_setzero_ps();
    int b = 0;
    for (; b + kLanes <= blocks; b += kLanes) {
        prefetch_ahead(row + b * kQ4BlockBytes, kPrefetchBytes, kLanes * kQ4BlockBytes);
        prefetch_ahead(row_scales + b, kScalePrefetchBytes, kLanes * sizeof(uint16_t));
        const __m256 scales = _mm256_mul_ps(
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row_scales + b))),
            _mm256_loadu_ps(x.scales.data() + b));
        offsets = _mm256_fmadd_ps(scales, _mm256_loadu_ps(x.group_sums.data() + b), offsets);
#pragma GCC unroll 8
        for (int k = 0; k < kLanes; ++k) {
            const __m256 scale = _mm256_permutevar8x32_ps(scales, _mm256_set1_epi32(k));
            sum = _mm256_fmadd_ps(
                q4_block_dot(row + (b + k) * kQ4BlockBytes, x_values + (b + k) * kQ4Block), scale,
                sum);
        }
    }
    float total = horizontal_sum(sum) - kQ4Offset * horizontal_sum(offsets);
    for (; b < blocks; ++b) {
        const float scale = _cvtsh_ss(row_scales[b]) * x.scales[b];
        const float dot =
            horizontal_sum(q4_block_dot(row + b * kQ4BlockBytes, x_values + b * kQ4Block));
        total += scale * (dot - kQ4Offset * x.group_sums[b]);
    }
    return total;
}

}  // namespace

void matvec_rows_q8(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                    int row_count) {
    const int8_t* values = static_cast<const int8_t*>(w.data);
    const int groups = w.q8_groups();
    for (int r = first_row; r < first_row + row_count; ++r)
        out[r] = q8_row_dot(values + size_t(r) * w.cols, w.scales + size_t(r) * groups, x, w.cols);
}

void matvec_rows_q4(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                    int row_count) {
    const uint8_t* values = static_cast<const uint8_t*>(w.data);
    const int blocks = w.q4_blocks();
    for (int r = first_row; r < first_row + row_count; ++r)
        out[r] = q4_row_dot(values + r * w.row_bytes(), w.scales + size_t(r) * blocks, x, w.cols);
}

}  // namespace barellm::cpu::avx2
