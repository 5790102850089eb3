// The decode matvec on AVX2 for the i-quant types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
// IQ1_S, IQ1_M) and the ternary types (TQ1_0, TQ2_0; cpu/iq_levels.h): out = W · x for one
// token, x quantized per 256 as Q8_K (cpu::quantize_q8_k), each super-block's dot product in
// integers, a row at a time.
//
// A register holds the 32 unsigned levels u of columns 32r..32r + 31 (iq_levels_avx2.h):
// vpmaddubsw multiplies them by x's signed bytes into int16 pairs (u ≤ 127 and |q| ≤ 127: at
// most 32258, no saturation), and vpmaddwd multiplies the pairs by their sub-block's m, a 16-bit
// word a 128-bit lane (16 columns), into int32 lanes: m applied for free. The offset comes in
// through x's sums of 16: the super-block's int32 dot starts from −offset · Σ_i m_i · Σx_i, so
// that it ends as Σ m · (u − offset) · q exactly (below 2^24 in each lane), scaled once by
// d · factor · x's d. The ternary types' m is 1: their pairs are summed as int16 over the
// super-block, and one vpmaddwd widens them.
#include <immintrin.h>

#include "cpu/avx2/avx2.h"
#include "cpu/avx2/block_levels_avx2.h"
#include "cpu/avx2/helpers_avx2.h"
#include "cpu/avx2/iq_levels_avx2.h"
#include "cpu/iq_levels.h"
#include "cpu/panel_prefetcher.h"
#include "weights/weight_blocks.h"

namespace barellm::cpu::avx2 {

namespace {

constexpr int kSumsPerBlock = kSuperBlock / kIqMultiplierCols;  // Q8KVector::sums a super-block
constexpr int kWordsPerLane = 8;                                // 16-bit words in a 128-bit lane

// One row of kType · x: Σ over super-blocks b of x.d[b] · d · factor · Σ_i m_i · Σ (u − offset)·q.
template <DType kType>
float iq_row_dot(const uint8_t* row, int blocks, const Q8KVector& x) {
    constexpr size_t kBlockBytes = block_bytes(kType);
    constexpr IqShape kShape = iq_shape(kType);
    __m256 sums = _mm256_setzero_ps();
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = row + size_t(b) * kBlockBytes;
        prefetch_ahead(block, kRowPrefetchBytes, int(kBlockBytes));
        const int8_t* xb = x.values.data() + size_t(b) * kSuperBlock;
        const __m256i m = iq_multiplier_words<kType>(block);
        // −offset · Σ_i m_i · Σx_i, in pairs.
        __m256i dots = _mm256_mullo_epi32(
            _mm256_madd_epi16(m, load256(x.sums.data() + size_t(b) * kSumsPerBlock)),
            _mm256_set1_epi32(-kShape.offset));
        if constexpr (has_multipliers(kType)) {
            // Words 0-7 and 8-15, each repeated in both lanes.
            const __m256i first_m = _mm256_permute2x128_si256(m, m, 0x00);
            const __m256i last_m = _mm256_permute2x128_si256(m, m, 0x11);
#pragma GCC unroll 8
            for (int r = 0; r < kIqRegisters; ++r) {
                // Columns 32r..32r + 15 under m_2r, 32r + 16..32r + 31 under m_2r+1.
                const int i = 2 * r % kWordsPerLane;
                const __m256i register_m = _mm256_shuffle_epi8(
                    2 * r < kWordsPerLane ? first_m : last_m, pick_words(i, i + 1));
                const __m256i products = _mm256_maddubs_epi16(iq_levels<kType>(block, r),
                                                              load256(xb + kIqRegisterCols * r));
                dots = _mm256_add_epi32(dots, _mm256_madd_epi16(products, register_m));
            }
        } else {  // the ternary types, m = 1: the pairs summed as int16 (at most 8 · 2 · 3 · 127)
            __m256i pairs = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int r = 0; r < kIqRegisters; ++r)
                pairs = _mm256_add_epi16(pairs,
                                         _mm256_maddubs_epi16(iq_levels<kType>(block, r),
                                                              load256(xb + kIqRegisterCols * r)));
            dots = _mm256_add_epi32(dots, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
        }
        sums = _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(dots),
            _mm256_set1_ps(x.d[b] * _cvtsh_ss(iq_d_bits(kType, block)) * kShape.factor), sums);
    }
    return horizontal_sum(sums);
}

template <DType kType>
void iq_rows(float* out, const Matrix& w, const Q8KVector& x, int first_row, int row_count) {
    const int blocks = w.cols / kSuperBlock;
    for (int r = first_row; r < first_row + row_count; ++r)
        out[r] = iq_row_dot<kType>(w.row_data(r), blocks, x);
}

}  // namespace

void matvec_rows_iq(float* out, const Matrix& w, const Q8KVector& x, int first_row, int row_count) {
    with_iq_type(w.dtype, [&](auto type) { iq_rows<type()>(out, w, x, first_row, row_count); });
}

}  // namespace barellm::cpu::avx2
