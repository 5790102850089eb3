// The decode matvecs on AVX2 + FMA + F16C for the super-block types, Q4_K, Q5_K, Q6_K and
// IQ4_XS (weight_blocks.h):
// out = W · x for one token, x quantized per 256 as Q8_K (cpu::quantize_q8_k), each
// super-block's dot product in integers, a row at a time.
//
// The arithmetic of the AVX-512 version (matvec_super_blocks_avx512vnni.cpp) in 256-bit registers
// of 32 weights: vpmaddubsw multiplies the unsigned q by x's signed bytes into int16 pairs,
// vpmaddwd multiplies those by the sub-block's scale into int32 lanes (exact), and what q
// stands for (Q4_K/Q5_K's mins, Q6_K's offset of 32) comes in through x's sums of 16. A
// register of Q4_K/Q5_K nibbles is one chunk's low (sub-block 2c) or high (2c + 1) nibbles,
// one sub-block and one scale; a register of Q6_K holds two sub-blocks of 16, one a lane.
// IQ4_XS's nibbles become their signed values by a table lookup (vpshufb); vpmaddubsw then
// takes |value| and x with the value's sign (at most 2 · 127 · 127 a pair, no overflow).
#include <immintrin.h>

#include <algorithm>

#include "cpu/avx2/avx2.h"
#include "cpu/avx2/block_levels_avx2.h"
#include "cpu/avx2/helpers_avx2.h"
#include "cpu/kquant_scales.h"
#include "weights/weight_blocks.h"

namespace barellm::cpu::avx2 {

namespace {

constexpr int kSumsPerBlock = kSuperBlock / kQ6SubBlock;  // Q8KVector::sums a super-block

// One Q4_K (kFifthBit false) or Q5_K row · x: Σ over super-blocks b of x.d[b] · (d · Σ sc·q·x −
// dmin · Σ m · Σx).
template <bool kFifthBit>
float k_row_dot(const uint8_t* row, int blocks, const Q8KVector& x) {
    constexpr int kBlockBytes = kFifthBit ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
    __m256 sums = _mm256_setzero_ps(), min_sums = _mm256_setzero_ps();
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = row + size_t(b) * kBlockBytes;
        const int8_t* xb = x.values.data() + size_t(b) * kSuperBlock;
        const KScalesMins unpacked = unpack_k_scales_mins(block + kKScalesOffset);
        const __m256i scale_words = _mm256_broadcastsi128_si256(
            _mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(unpacked.scales))));
        const __m256i high_bits = kFifthBit ? load256(block + kQ5KHighOffset) : __m256i{};
        __m256i dots = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int chunk = 0; chunk < 4; ++chunk) {
            __m256i low, high;
            k_chunk_levels<kFifthBit>(block, high_bits, chunk, &low, &high);
            const __m256i low_scale =
                _mm256_shuffle_epi8(scale_words, pick_words(2 * chunk, 2 * chunk));
            const __m256i high_scale =
                _mm256_shuffle_epi8(scale_words, pick_words(2 * chunk + 1, 2 * chunk + 1));
            dots = _mm256_add_epi32(
                dots,
                _mm256_madd_epi16(_mm256_maddubs_epi16(low, load256(xb + 64 * chunk)), low_scale));
            dots = _mm256_add_epi32(
                dots, _mm256_madd_epi16(_mm256_maddubs_epi16(high, load256(xb + 64 * chunk + 32)),
                                        high_scale));
        }
        const float x_d = x.d[b];
        sums = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), _mm256_set1_ps(x_d * f16_at(block)), sums);
        // Σ_j m_j · (sums[2j] + sums[2j + 1]): each min twice, against x's sums of 16.
        const __m128i mins = _mm_cvtsi64_si128(int64_t(unpacked.mins));
        const __m256i min_dots =
            _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins, mins)),
                              load256(x.sums.data() + size_t(b) * kSumsPerBlock));
        min_sums = _mm256_fmadd_ps(_mm256_cvtepi32_ps(min_dots),
                                   _mm256_set1_ps(x_d * f16_at(block + 2)), min_sums);
    }
    return horizontal_sum(_mm256_sub_ps(sums, min_sums));
}

// One Q6_K row · x: Σ over super-blocks of x.d · d · (Σ sc·q·x − 32 · Σ sc · Σx).
float q6_k_row_dot(const uint8_t* row, int blocks, const Q8KVector& x) {
    __m256 sums = _mm256_setzero_ps();
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = row + size_t(b) * sizeof(BlockQ6_K);
        const int8_t* xb = x.values.data() + size_t(b) * kSuperBlock;
        const __m256i scales = _mm256_cvtepi8_epi16(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kQ6ScalesOffset)));
        // Scales 0-7 and 8-15, each repeated in both lanes.
        const __m256i first_scales = _mm256_permute2x128_si256(scales, scales, 0x00);
        const __m256i last_scales = _mm256_permute2x128_si256(scales, scales, 0x11);
        // 32 · Σ_i sc_i · Σx(sub-block i), in pairs.
        __m256i dots = _mm256_sub_epi32(
            _mm256_setzero_si256(),
            _mm256_slli_epi32(
                _mm256_madd_epi16(scales, load256(x.sums.data() + size_t(b) * kSumsPerBlock)), 5));
#pragma GCC unroll 2
        for (int half = 0; half < 2; ++half) {
#pragma GCC unroll 4
            for (int t = 0; t < 4; ++t) {
                const __m256i q = q6_k_levels(block, half, t);
                // Sub-blocks 2g and 2g + 1 of the super-block, g = 4 half + t.
                const int g = 4 * half + t;
                const __m256i scale = _mm256_shuffle_epi8(g < 4 ? first_scales : last_scales,
                                                          pick_words(2 * g % 8, 2 * g % 8 + 1));
                dots = _mm256_add_epi32(
                    dots, _mm256_madd_epi16(_mm256_maddubs_epi16(q, load256(xb + 32 * g)), scale));
            }
        }
        sums = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots),
                               _mm256_set1_ps(x.d[b] * f16_at(block + kQ6DOffset)), sums);
    }
    return horizontal_sum(sums);
}

// One IQ4_XS row · x: Σ over super-blocks of x.d · d · Σ_j (ls_j − 32) · Σ K[q] · x.
float iq4_xs_row_dot(const uint8_t* row, int blocks, const Q8KVector& x) {
    const __m256i table = iq4_table();
    __m256 sums = _mm256_setzero_ps();
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = row + size_t(b) * sizeof(BlockIQ4_XS);
        const int8_t* xb = x.values.data() + size_t(b) * kSuperBlock;
        __m256i dots = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int j = 0; j < kSuperBlock / kSubBlock; ++j) {
            const __m256i values = iq4_xs_values(block, j, table);
            const __m256i x_values = load256(xb + kSubBlock * j);
            const __m256i products = _mm256_maddubs_epi16(_mm256_sign_epi8(values, values),
                                                          _mm256_sign_epi8(x_values, values));
            dots = _mm256_add_epi32(
                dots,
                _mm256_madd_epi16(products, _mm256_set1_epi16(int16_t(iq4_xs_scale(block, j)))));
        }
        sums =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), _mm256_set1_ps(x.d[b] * f16_at(block)), sums);
    }
    return horizontal_sum(sums);
}

}  // namespace

void matvec_rows_super_blocks(float* out, const Matrix& w, const Q8KVector& x, int first_row,
                              int row_count) {
    const int blocks = w.cols / kSuperBlock;
    for (int r = first_row; r < first_row + row_count; ++r) {
        const uint8_t* row = w.row_data(r);
        out[r] = w.dtype == DType::Q4_K   ? k_row_dot<false>(row, blocks, x)
                 : w.dtype == DType::Q5_K ? k_row_dot<true>(row, blocks, x)
                 : w.dtype == DType::Q6_K ? q6_k_row_dot(row, blocks, x)
                                          : iq4_xs_row_dot(row, blocks, x);
    }
}

void quantize_q8_k(Q8KVector* out, const float* x, int n) {
    constexpr float kQ8KLargest = 127.0f;
    const __m256 sign_bit = _mm256_set1_ps(-0.0f);
    resize_q8_k_vector(out, n);
    for (int b = 0; b < n / kSuperBlock; ++b) {
        const float* block = x + size_t(b) * kSuperBlock;
        int8_t* values = out->values.data() + size_t(b) * kSuperBlock;
        int16_t* sums = out->sums.data() + size_t(b) * kSumsPerBlock;
        __m256 magnitudes = _mm256_setzero_ps();
        for (int i = 0; i < kSuperBlock; i += kLanes)
            magnitudes =
                _mm256_max_ps(magnitudes, _mm256_andnot_ps(sign_bit, _mm256_loadu_ps(block + i)));
        const float magnitude = horizontal_max(magnitudes);
        if (magnitude == 0.0f) {
            out->d[b] = 0.0f;
            std::fill(values, values + kSuperBlock, int8_t(0));
            std::fill(sums, sums + kSumsPerBlock, int16_t(0));
            continue;
        }
        // The first value of that magnitude, sign kept.
        float largest = 0.0f;
        for (int i = 0; i < kSuperBlock; i += kLanes) {
            const int at = _mm256_movemask_ps(
                _mm256_cmp_ps(_mm256_andnot_ps(sign_bit, _mm256_loadu_ps(block + i)),
                              _mm256_set1_ps(magnitude), _CMP_EQ_OQ));
            if (at) {
                largest = block[i + __builtin_ctz(at)];
                break;
            }
        }
        const float inverse = -kQ8KLargest / largest;
        for (int i = 0; i < kSuperBlock; i += kQ6SubBlock) {
            // Rounded to nearest, ties to even (the default rounding mode), 16 values.
            __m256i q[2];
            for (int half = 0; half < 2; ++half)
                q[half] = _mm256_min_epi32(
                    _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_set1_ps(inverse),
                                                     _mm256_loadu_ps(block + i + kLanes * half))),
                    _mm256_set1_epi32(127));
            // packs_epi32 interleaves the halves by 128-bit lanes; the permute restores the order.
            const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xd8);
            _mm_storeu_si128(
                reinterpret_cast<__m128i*>(values + i),
                _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1)));
            sums[i / kQ6SubBlock] = int16_t(horizontal_sum(_mm256_add_epi32(q[0], q[1])));
        }
        out->d[b] = 1.0f / inverse;
    }
}

}  // namespace barellm::cpu::avx2
