// The decode matvecs on AVX2 + FMA + F16C for Q8 and Q4 weights: out = W · x for one token,
// or for a few at once (a server step's decoding sequences, where gemm_many in
// cpu/dispatch.cpp finds them faster than a GEMM), x quantized to Q8 (cpu::quantize_q8) and
// each group's dot product in integers.
#include <immintrin.h>

#include <algorithm>

#include "cpu/avx2/avx2.h"
#include "cpu/avx2/helpers_avx2.h"
#include "cpu/panel_prefetcher.h"

namespace barellm::cpu::avx2 {

namespace {

// The Q8 and Q4 matvecs read each row's values and its scales as two streams, front to back,
// and ask for the cache lines kRowPrefetchBytes ahead of the values (kScalePrefetchBytes ahead
// of the scales) as they go: the hardware prefetcher alone left the loads waiting on memory.
// The distances are the best measured (docs/benchmarks-history.md:
// "CPU: software prefetch distances of the decode matvecs").
constexpr int kScalePrefetchBytes = 256;

// Sum over one group of 32 of w[i] * x[i] as int32 lanes: |w| (unsigned, `magnitudes`) times
// x with w's sign, multiplied in pairs into int16 (at most 2 * 127 * 127, no overflow), then
// pairs of those into int32.
inline __m256 q8_group_dot(__m256i weights, __m256i magnitudes, const int8_t* x) {
    const __m256i values = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    const __m256i products = _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(values, weights));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(products, _mm256_set1_epi16(1)));
}

// One Q4 block's 32 unsigned 4-bit q in column order: the 16 bytes' low nibbles are columns
// 0-15, high nibbles 16-31.
inline __m256i q4_block_levels(const uint8_t* block) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block));
    const __m128i low_nibble = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), low_nibble),
                            _mm_and_si128(bytes, low_nibble));
}

// One Q4 block against x as int32 lanes: Σ q[i] × x[i], the unsigned q as they are (Q4's
// offset of 8 is subtracted per group by q4_row_dots): q × x in pairs into int16 (at most
// 2 × 15 × 127), then pairs of those into int32.
inline __m256 q4_block_dot(__m256i levels, const int8_t* x) {
    const __m256i values = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    const __m256i products = _mm256_maddubs_epi16(levels, values);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(products, _mm256_set1_epi16(1)));
}

// Two consecutive Q4 blocks against x as int32 lanes, lanes 0-3 block one's Σ q × x and lanes
// 4-7 block two's: `low` and `high`, the low and high nibbles of their 32 bytes (one load),
// hold columns 0-15 of each, then columns 16-31 of each; `x` is the pair's 64 values in that
// order (QuantizedVector::q4_pair_values). Both halves' q × x in pairs into int16, added (at
// most 4 × 15 × 127), then pairs of those into int32: per block half the instructions of
// q4_block_levels and q4_block_dot, which bound this matvec on AVX2 (not the memory).
inline __m256 q4_block_pair_dot(__m256i low, __m256i high, const int8_t* x) {
    static_assert(4 * 15 * 127 <= INT16_MAX, "a pair of blocks' int16 sums cannot overflow");
    const __m256i low_x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    const __m256i high_x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + kQ4Block));
    const __m256i products =
        _mm256_add_epi16(_mm256_maddubs_epi16(low, low_x), _mm256_maddubs_epi16(high, high_x));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(products, _mm256_set1_epi16(1)));
}

// One Q8 row · quantized x[t] for TOKENS tokens, totals[t]: whole groups with AVX2, a short
// last group in scalar. Each group's weights are loaded once for all the tokens; each token's
// sums run in the same order whatever TOKENS is, so its bits are the one-token matvec's.
template <int TOKENS>
inline void q8_row_dots(float* totals, const int8_t* row, const uint16_t* row_scales,
                        const QuantizedVector* x, int cols) {
    const int whole_groups = cols / kQ8Group;
    __m256 sums[TOKENS];
    for (int t = 0; t < TOKENS; ++t) sums[t] = _mm256_setzero_ps();
    int g = 0;
    // Eight groups at a time: their eight scales (weight × x) in one register, each
    // broadcast to the lanes of its group's sum.
    for (; g + kLanes <= whole_groups; g += kLanes) {
        prefetch_ahead(row + g * kQ8Group, kRowPrefetchBytes, kLanes * kQ8Group);
        prefetch_ahead(row_scales + g, kScalePrefetchBytes, kLanes * sizeof(uint16_t));
        const __m256 weight_scales =
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row_scales + g)));
        __m256 scales[TOKENS];
        for (int t = 0; t < TOKENS; ++t)
            scales[t] = _mm256_mul_ps(weight_scales, _mm256_loadu_ps(x[t].scales.data() + g));
#pragma GCC unroll 8
        for (int k = 0; k < kLanes; ++k) {
            const int8_t* group = row + (g + k) * kQ8Group;
            const __m256i weights = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group));
            const __m256i magnitudes = _mm256_sign_epi8(weights, weights);
            for (int t = 0; t < TOKENS; ++t) {
                const __m256 scale = _mm256_permutevar8x32_ps(scales[t], _mm256_set1_epi32(k));
                sums[t] = _mm256_fmadd_ps(
                    q8_group_dot(weights, magnitudes, x[t].values.data() + (g + k) * kQ8Group),
                    scale, sums[t]);
            }
        }
    }
    for (; g < whole_groups; ++g) {
        const __m256i weights =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + g * kQ8Group));
        const __m256i magnitudes = _mm256_sign_epi8(weights, weights);
        for (int t = 0; t < TOKENS; ++t) {
            const float scale = _cvtsh_ss(row_scales[g]) * x[t].scales[g];
            sums[t] = _mm256_fmadd_ps(
                q8_group_dot(weights, magnitudes, x[t].values.data() + g * kQ8Group),
                _mm256_set1_ps(scale), sums[t]);
        }
    }
    for (int t = 0; t < TOKENS; ++t) {
        totals[t] = horizontal_sum(sums[t]);
        if (whole_groups * kQ8Group < cols) {
            int32_t tail = 0;
            for (int i = whole_groups * kQ8Group; i < cols; ++i) tail += row[i] * x[t].values[i];
            totals[t] += tail * _cvtsh_ss(row_scales[whole_groups]) * x[t].scales[whole_groups];
        }
    }
}

// One Q4 row · quantized x[t] for TOKENS tokens (Q4 rows are whole blocks), totals[t]: Σ
// over blocks b of weight scale × x scale × (Σ q × x − 8 × Σ x), the second sum
// x.group_sums[b], eight blocks at a time, two a load (q4_block_pair_dot; the last blocks
// short of eight one at a time). Each block's levels are unpacked once for all the tokens;
// each token's bits are the one-token matvec's, as q8_row_dots.
template <int TOKENS>
inline void q4_row_dots(float* totals, const uint8_t* row, const uint16_t* row_scales,
                        const QuantizedVector* x, int cols) {
    const int blocks = cols / kQ4Block;
    __m256 sums[TOKENS], offsets[TOKENS];
    for (int t = 0; t < TOKENS; ++t) sums[t] = offsets[t] = _mm256_setzero_ps();
    int b = 0;
    for (; b + kLanes <= blocks; b += kLanes) {
        prefetch_ahead(row + b * kQ4BlockBytes, kRowPrefetchBytes, kLanes * kQ4BlockBytes);
        prefetch_ahead(row_scales + b, kScalePrefetchBytes, kLanes * sizeof(uint16_t));
        const __m256 weight_scales =
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row_scales + b)));
        __m256 scales[TOKENS];
        for (int t = 0; t < TOKENS; ++t) {
            scales[t] = _mm256_mul_ps(weight_scales, _mm256_loadu_ps(x[t].scales.data() + b));
            offsets[t] =
                _mm256_fmadd_ps(scales[t], _mm256_loadu_ps(x[t].group_sums.data() + b), offsets[t]);
        }
        // Two blocks a load; each block's scale broadcast to its four lanes of the pair's dot.
        const __m256i low_nibble = _mm256_set1_epi8(0x0f);
#pragma GCC unroll 4
        for (int k = 0; k < kLanes; k += 2) {
            const __m256i bytes =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + (b + k) * kQ4BlockBytes));
            const __m256i low = _mm256_and_si256(bytes, low_nibble);
            const __m256i high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low_nibble);
            const __m256i pair_lanes = _mm256_setr_epi32(k, k, k, k, k + 1, k + 1, k + 1, k + 1);
            for (int t = 0; t < TOKENS; ++t) {
                const __m256 scale = _mm256_permutevar8x32_ps(scales[t], pair_lanes);
                sums[t] = _mm256_fmadd_ps(
                    q4_block_pair_dot(low, high, x[t].q4_pair_values.data() + (b + k) * kQ4Block),
                    scale, sums[t]);
            }
        }
    }
    for (int t = 0; t < TOKENS; ++t)
        totals[t] = horizontal_sum(sums[t]) - kQ4Offset * horizontal_sum(offsets[t]);
    for (; b < blocks; ++b) {
        const __m256i levels = q4_block_levels(row + b * kQ4BlockBytes);
        for (int t = 0; t < TOKENS; ++t) {
            const float scale = _cvtsh_ss(row_scales[b]) * x[t].scales[b];
            const float dot =
                horizontal_sum(q4_block_dot(levels, x[t].values.data() + b * kQ4Block));
            totals[t] += scale * (dot - kQ4Offset * x[t].group_sums[b]);
        }
    }
}

// Tokens a pass over a row takes at most: their sums, scales (and Q4's offsets) stay in the
// 16 registers.
constexpr int kTokensPerPass = 4;

// Row r · x[t] for TOKENS tokens of a Q8 or Q4 matrix into totals[t].
template <DType kType, int TOKENS>
void row_dots(float* totals, const Matrix& w, int r, const QuantizedVector* x) {
    const uint16_t* row_scales = w.scales + size_t(r) * w.scale_count_per_row();
    if constexpr (kType == DType::Q8_0)
        q8_row_dots<TOKENS>(totals, static_cast<const int8_t*>(w.data) + size_t(r) * w.cols,
                            row_scales, x, w.cols);
    else
        q4_row_dots<TOKENS>(totals, static_cast<const uint8_t*>(w.data) + size_t(r) * w.row_bytes(),
                            row_scales, x, w.cols);
}

// out[t * out_stride + r] for the rows of the run and `tokens` tokens, each row read from
// memory once: its passes of up to kTokensPerPass tokens after the first find it in L1.
template <DType kType>
void rows_of_tokens(float* out, size_t out_stride, const Matrix& w, const QuantizedVector* x,
                    int tokens, int first_row, int row_count) {
    static_assert(kTokensPerPass == 4, "a case below for each pass size");
    float totals[kTokensPerPass];
    for (int r = first_row; r < first_row + row_count; ++r)
        for (int t = 0; t < tokens; t += kTokensPerPass) {
            const int pass = std::min(kTokensPerPass, tokens - t);
            switch (pass) {
                case 1:
                    row_dots<kType, 1>(totals, w, r, x + t);
                    break;
                case 2:
                    row_dots<kType, 2>(totals, w, r, x + t);
                    break;
                case 3:
                    row_dots<kType, 3>(totals, w, r, x + t);
                    break;
                default:
                    row_dots<kType, 4>(totals, w, r, x + t);
                    break;
            }
            for (int k = 0; k < pass; ++k) out[(t + k) * out_stride + r] = totals[k];
        }
}

}  // namespace

void matvec_rows_q8(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                    int row_count) {
    matvec_rows_q8_tokens(out, 0, w, &x, 1, first_row, row_count);
}

void matvec_rows_q4(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                    int row_count) {
    matvec_rows_q4_tokens(out, 0, w, &x, 1, first_row, row_count);
}

void matvec_rows_q8_tokens(float* out, size_t out_stride, const Matrix& w, const QuantizedVector* x,
                           int tokens, int first_row, int row_count) {
    rows_of_tokens<DType::Q8_0>(out, out_stride, w, x, tokens, first_row, row_count);
}

void matvec_rows_q4_tokens(float* out, size_t out_stride, const Matrix& w, const QuantizedVector* x,
                           int tokens, int first_row, int row_count) {
    rows_of_tokens<DType::Q4_0>(out, out_stride, w, x, tokens, first_row, row_count);
}

}  // namespace barellm::cpu::avx2
