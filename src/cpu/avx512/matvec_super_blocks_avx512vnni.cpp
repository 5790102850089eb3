// The decode matvecs on AVX-512 + VNNI for the super-block types, Q4_K, Q5_K, Q6_K and IQ4_XS
// (weight_blocks.h):
// out = W · x for one token, x quantized per 256 as Q8_K (quantize_q8_k, byte for byte as
// cpu::quantize_q8_k), each super-block's dot product in integers, a row at a time.
//
// A super-block's weights are unsigned integers q (0..15, 0..31 or 0..63), each sub-block
// under its own small integer scale. vpmaddubsw multiplies q (unsigned bytes) by x (signed
// bytes) and adds pairs into int16 (at most 2 · 63 · 127: no overflow); vpdpwssd multiplies
// those by the sub-block's scale (in each 16-bit lane) and adds pairs into int32 lanes, so
// that Σ scale · q · x is exact in int32. What q stands for then comes in through x's sums
// of 16 (Q8KVector::sums), once per super-block:
// - Q4_K, Q5_K: w = d · sc · q − dmin · m, the second term dmin · Σ_j m_j · Σx(sub-block j);
// - Q6_K: w = d · sc · (q − 32), the offset 32 · Σ_i sc_i · Σx(sub-block i), subtracted in
//   int32.
// Each super-block's int32 lanes are scaled by its d × x's d and added to 16 f32 sums, which
// are reduced once at the end of the row.
//
// Registers of 64 weights: Q6_K's 64 bytes of ql hold weights 0-63 of a half in their low
// nibbles and 64-127 in their high ones, in x's order, the 2 high bits of each rotated into
// place from qh (the same 32 bytes in both halves of a register). Q4_K's 64 bytes of qs
// (two chunks) hold sub-blocks 4k and 4k + 2 in their low nibbles, 4k + 1 and 4k + 3 in their
// high ones: x is read in that order, each 128 values' second and third 32 swapped once per
// call (interleave_for_k_chunks).
//
// IQ4_XS's weights are signed (kIq4Values): a table lookup (vpshufb) turns each nibble into
// its value + 128 (unsigned), which vpdpbusd multiplies by x straight into int32 (a pair of
// those products can exceed int16); the sub-block scales (ls − 32) multiply the int32 lanes
// (vpmulld), and the excess 128 · Σ scale · Σx comes off through x's sums. Its 64 bytes of qs
// hold 4 sub-blocks, one a 128-bit lane, the first 16 weights of each in the low nibbles: x
// is read in that order too (interleave_for_iq4_xs).
#include <algorithm>
#include <vector>

#include "cpu/avx512/avx512.h"
#include "cpu/avx512/helpers_avx512.h"
#include "cpu/kquant_scales.h"
#include "weights/half.h"
#include "weights/weight_blocks.h"

namespace barellm::cpu::avx512 {

namespace {

constexpr int kSumsPerBlock = kSuperBlock / kQ6SubBlock;  // Q8KVector::sums a super-block
constexpr int kQuarter = 32;                              // values: one chunk of nibbles
// Byte offsets in a block (weight_blocks.h).
constexpr int kKScalesOffset = 4, kQ4KValuesOffset = 16, kQ5KHighOffset = 16, kQ5KValuesOffset = 48;
constexpr int kQ6HighOffset = 128, kQ6ScalesOffset = 192, kQ6DOffset = 208;
inline __m512i low_nibbles() { return _mm512_set1_epi8(0x0f); }

inline float f16_at(const uint8_t* p) {
    uint16_t bits;
    std::memcpy(&bits, p, sizeof bits);
#ifdef BARELLM_SIMDE
    return half_to_float(bits);
#else
    return _cvtsh_ss(bits);  // F16C
#endif
}

// x's values with each 128's quarters in the order 0, 2, 1, 3: the order of Q4_K's and
// Q5_K's low nibbles (sub-blocks 4k, 4k + 2) then high nibbles (4k + 1, 4k + 3) of 64 bytes.
const int8_t* interleave_for_k_chunks(const Q8KVector& x) {
    static thread_local std::vector<int8_t> interleaved;
    const size_t n = x.values.size();
    interleaved.resize(n);
    for (size_t first = 0; first < n; first += 4 * kQuarter)
        for (int quarter = 0; quarter < 4; ++quarter) {
            const int from = quarter == 1 ? 2 : quarter == 2 ? 1 : quarter;
            std::copy_n(x.values.data() + first + from * kQuarter, kQuarter,
                        interleaved.data() + first + quarter * kQuarter);
        }
    return interleaved.data();
}

// x's values in IQ4_XS's order: of each 128, the first 16 of each 32, then the last 16 of each.
const int8_t* interleave_for_iq4_xs(const Q8KVector& x) {
    constexpr int kSixteen = kSubBlock / 2;
    static thread_local std::vector<int8_t> interleaved;
    const size_t n = x.values.size();
    interleaved.resize(n);
    for (size_t first = 0; first < n; first += 4 * kSubBlock)
        for (int sub_block = 0; sub_block < 4; ++sub_block)
            for (int part = 0; part < 2; ++part)
                std::copy_n(
                    x.values.data() + first + sub_block * kSubBlock + part * kSixteen, kSixteen,
                    interleaved.data() + first + part * 4 * kSixteen + sub_block * kSixteen);
    return interleaved.data();
}

// The vpshufb control that puts 16-bit word `lower` of each 128-bit lane in every word of
// the register's lower half, word `upper` in its upper half.
inline __m512i pick_words(int lower, int upper) {
    const __m512i low = _mm512_set1_epi16(int16_t(0x0100 + 0x0202 * lower));
    const __m512i high = _mm512_set1_epi16(int16_t(0x0100 + 0x0202 * upper));
    return _mm512_mask_blend_epi64(0xf0, low, high);
}

// The int32 lanes of 256 bits in the low half of a register, 0 in the high half.
inline __m512i widen_low(__m256i v) { return _mm512_inserti64x4(_mm512_setzero_si512(), v, 0); }

inline float horizontal_sum(__m256 v) {
    const __m128 halves = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 pairs = _mm_add_ps(halves, _mm_movehl_ps(halves, halves));
    return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}

// One Q4_K (kFifthBit false) or Q5_K row · x: Σ over super-blocks b of x.d[b] · (d · Σ sc·q·x −
// dmin · Σ m · Σx).
template <bool kFifthBit>
float k_row_dot(const uint8_t* row, int blocks, const int8_t* x_interleaved, const Q8KVector& x) {
    constexpr int kBlockBytes = kFifthBit ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
    constexpr int kValuesOffset = kFifthBit ? kQ5KValuesOffset : kQ4KValuesOffset;
    // Sub-blocks (4k, 4k + 2) of the low nibbles, (4k + 1, 4k + 3) of the high ones.
    const __m512i scale_picks[4] = {pick_words(0, 2), pick_words(1, 3), pick_words(4, 6),
                                    pick_words(5, 7)};
    // Q5_K: rotations (left, in 32-bit lanes) that move bit j of qh, the fifth bit of
    // sub-block j, to bit 4 of its byte, for the same four pairs.
    const __m512i rotations[4] = {
        _mm512_mask_blend_epi64(0xf0, _mm512_set1_epi32(4), _mm512_set1_epi32(2)),
        _mm512_mask_blend_epi64(0xf0, _mm512_set1_epi32(3), _mm512_set1_epi32(1)),
        _mm512_mask_blend_epi64(0xf0, _mm512_set1_epi32(0), _mm512_set1_epi32(30)),
        _mm512_mask_blend_epi64(0xf0, _mm512_set1_epi32(31), _mm512_set1_epi32(29))};
    const __m512i nibble = low_nibbles(), fifth_bit = _mm512_set1_epi8(0x10);
    __m512 sums = _mm512_setzero_ps();
    __m256 min_sums = _mm256_setzero_ps();
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = row + size_t(b) * kBlockBytes;
        const uint8_t* qs = block + kValuesOffset;
        const int8_t* xb = x_interleaved + size_t(b) * kSuperBlock;
        const KScalesMins unpacked = unpack_k_scales_mins(block + kKScalesOffset);
        const __m512i scale_words =
            _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(unpacked.scales))));
        __m512i high_bits = _mm512_setzero_si512();
        if constexpr (kFifthBit)
            high_bits = _mm512_broadcast_i64x4(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kQ5KHighOffset)));
        // Two accumulators halve the chain of dependent vpdpwssd.
        __m512i dots = _mm512_setzero_si512(), more_dots = _mm512_setzero_si512();
#pragma GCC unroll 2
        for (int k = 0; k < 2; ++k) {
            const __m512i bytes = _mm512_loadu_si512(qs + 64 * k);
            __m512i low = _mm512_and_si512(bytes, nibble);
            __m512i high = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble);
            if constexpr (kFifthBit) {
                const __m512i low_fifth =
                    _mm512_and_si512(_mm512_rolv_epi32(high_bits, rotations[2 * k]), fifth_bit);
                const __m512i high_fifth =
                    _mm512_and_si512(_mm512_rolv_epi32(high_bits, rotations[2 * k + 1]), fifth_bit);
                low = _mm512_or_si512(low, low_fifth);
                high = _mm512_or_si512(high, high_fifth);
            }
            dots = _mm512_dpwssd_epi32(dots,
                                       _mm512_maddubs_epi16(low, _mm512_loadu_si512(xb + 128 * k)),
                                       _mm512_shuffle_epi8(scale_words, scale_picks[2 * k]));
            more_dots = _mm512_dpwssd_epi32(
                more_dots, _mm512_maddubs_epi16(high, _mm512_loadu_si512(xb + 128 * k + 64)),
                _mm512_shuffle_epi8(scale_words, scale_picks[2 * k + 1]));
        }
        const float x_d = x.d[b];
        sums = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(dots, more_dots)),
                               _mm512_set1_ps(x_d * f16_at(block)), sums);
        // Σ_j m_j · (sums[2j] + sums[2j + 1]): each min twice, against x's sums of 16.
        const __m128i mins = _mm_cvtsi64_si128(int64_t(unpacked.mins));
        const __m256i min_dots = _mm256_madd_epi16(
            _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins, mins)),
            _mm256_loadu_si256(
                reinterpret_cast<const __m256i*>(x.sums.data() + size_t(b) * kSumsPerBlock)));
        min_sums = _mm256_fmadd_ps(_mm256_cvtepi32_ps(min_dots),
                                   _mm256_set1_ps(x_d * f16_at(block + 2)), min_sums);
    }
    return _mm512_reduce_add_ps(sums) - horizontal_sum(min_sums);
}

// One Q6_K row · x: Σ over super-blocks of x.d · d · (Σ sc·q·x − 32 · Σ sc · Σx).
float q6_k_row_dot(const uint8_t* row, int blocks, const Q8KVector& x) {
    // Register r holds weights 64r..64r + 63, sub-blocks 4r..4r + 3, one a 128-bit lane: the
    // vpermw indices that give each lane its sub-block's scale.
    __m512i scale_picks[4];
    for (int r = 0; r < 4; ++r) {
        alignas(64) int16_t indices[32];
        for (int i = 0; i < 32; ++i) indices[i] = int16_t(4 * r + i / 8);
        scale_picks[r] = _mm512_load_si512(indices);
    }
    // Rotations (left, in 32-bit lanes) that move bits 2t, 2t + 1 of qh, the high bits of
    // the half's weights 32t..32t + 31, to bits 4 and 5: t = 0, 1 for the low nibbles' register,
    // t = 2, 3 for the high ones'.
    const __m512i low_rotation =
        _mm512_mask_blend_epi64(0xf0, _mm512_set1_epi32(4), _mm512_set1_epi32(2));
    const __m512i high_rotation =
        _mm512_mask_blend_epi64(0xf0, _mm512_set1_epi32(0), _mm512_set1_epi32(30));
    const __m512i nibble = low_nibbles(), high_two = _mm512_set1_epi8(0x30);
    __m512 sums = _mm512_setzero_ps();
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = row + size_t(b) * sizeof(BlockQ6_K);
        const int8_t* xb = x.values.data() + size_t(b) * kSuperBlock;
        const __m256i scales = _mm256_cvtepi8_epi16(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kQ6ScalesOffset)));
        const __m512i scale_words = _mm512_castsi256_si512(scales);
        // 32 · Σ_i sc_i · Σx(sub-block i), in pairs.
        const __m256i offsets = _mm256_slli_epi32(
            _mm256_madd_epi16(scales, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                                          x.sums.data() + size_t(b) * kSumsPerBlock))),
            5);
        __m512i dots = _mm512_sub_epi32(_mm512_setzero_si512(), widen_low(offsets));
#pragma GCC unroll 2
        for (int half = 0; half < 2; ++half) {
            const __m512i low_bits = _mm512_loadu_si512(block + 64 * half);
            const __m512i high_bits = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                reinterpret_cast<const __m256i*>(block + kQ6HighOffset + 32 * half)));
            const __m512i first = _mm512_ternarylogic_epi32(
                low_bits, nibble,
                _mm512_and_si512(_mm512_rolv_epi32(high_bits, low_rotation), high_two), kAndOr);
            const __m512i second = _mm512_ternarylogic_epi32(
                _mm512_srli_epi16(low_bits, 4), nibble,
                _mm512_and_si512(_mm512_rolv_epi32(high_bits, high_rotation), high_two), kAndOr);
            dots = _mm512_dpwssd_epi32(
                dots, _mm512_maddubs_epi16(first, _mm512_loadu_si512(xb + 128 * half)),
                _mm512_permutexvar_epi16(scale_picks[2 * half], scale_words));
            dots = _mm512_dpwssd_epi32(
                dots, _mm512_maddubs_epi16(second, _mm512_loadu_si512(xb + 128 * half + 64)),
                _mm512_permutexvar_epi16(scale_picks[2 * half + 1], scale_words));
        }
        sums = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots),
                               _mm512_set1_ps(x.d[b] * f16_at(block + kQ6DOffset)), sums);
    }
    return _mm512_reduce_add_ps(sums);
}

// One IQ4_XS row · x: Σ over super-blocks of x.d · d · Σ_j (ls_j − 32) · Σ K[q] · x.
float iq4_xs_row_dot(const uint8_t* row, int blocks, const int8_t* x_interleaved,
                     const Q8KVector& x) {
    constexpr int kScalesHighOffset = 2, kScalesLowOffset = 4, kValuesOffset = 8;
    const __m512i table = iq4_unsigned_levels();
    // Register k holds sub-blocks 4k..4k + 3, four int32 lanes each: the vpermd indices of
    // their scales.
    const __m512i scale_picks[2] = {
        _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
        _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7)};
    const __m512i nibble = low_nibbles();
    __m512 sums = _mm512_setzero_ps();
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = row + size_t(b) * sizeof(BlockIQ4_XS);
        const int8_t* xb = x_interleaved + size_t(b) * kSuperBlock;
        uint16_t scales_high;
        std::memcpy(&scales_high, block + kScalesHighOffset, sizeof scales_high);
        alignas(16) int8_t scales[16] = {};
        for (int j = 0; j < kSuperBlock / kSubBlock; ++j)
            scales[j] = int8_t((((block[kScalesLowOffset + j / 2] >> (4 * (j % 2))) & 15) |
                                ((scales_high >> (2 * j)) & 3) << 4) -
                               32);
        const __m128i scale_bytes = _mm_load_si128(reinterpret_cast<const __m128i*>(scales));
        const __m512i scale_lanes = _mm512_castsi256_si512(_mm256_cvtepi8_epi32(scale_bytes));
        // 128 · Σ_j scale_j · (sums[2j] + sums[2j + 1]): each scale twice.
        const __m256i excess = _mm256_slli_epi32(
            _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_unpacklo_epi8(scale_bytes, scale_bytes)),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                                  x.sums.data() + size_t(b) * kSumsPerBlock))),
            7);
        __m512i dots = _mm512_sub_epi32(_mm512_setzero_si512(), widen_low(excess));
#pragma GCC unroll 2
        for (int k = 0; k < 2; ++k) {
            const __m512i bytes = _mm512_loadu_si512(block + kValuesOffset + 64 * k);
            const __m512i low = _mm512_shuffle_epi8(table, _mm512_and_si512(bytes, nibble));
            const __m512i high =
                _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble));
            __m512i sub_block_dots =
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), low, _mm512_loadu_si512(xb + 128 * k));
            sub_block_dots =
                _mm512_dpbusd_epi32(sub_block_dots, high, _mm512_loadu_si512(xb + 128 * k + 64));
            dots = _mm512_add_epi32(
                dots, _mm512_mullo_epi32(sub_block_dots,
                                         _mm512_permutexvar_epi32(scale_picks[k], scale_lanes)));
        }
        sums =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), _mm512_set1_ps(x.d[b] * f16_at(block)), sums);
    }
    return _mm512_reduce_add_ps(sums);
}

}  // namespace

void quantize_q8_k(Q8KVector* out, const float* x, int n) {
    constexpr float kQ8KLargest = 127.0f;
    resize_q8_k_vector(out, n);
    for (int b = 0; b < n / kSuperBlock; ++b) {
        const float* block = x + size_t(b) * kSuperBlock;
        int8_t* values = out->values.data() + size_t(b) * kSuperBlock;
        __m512 magnitudes = _mm512_setzero_ps();
        for (int i = 0; i < kSuperBlock; i += kLanes)
            magnitudes = _mm512_max_ps(magnitudes, _mm512_abs_ps(_mm512_loadu_ps(block + i)));
        const float magnitude = _mm512_reduce_max_ps(magnitudes);
        if (magnitude == 0.0f) {
            out->d[b] = 0.0f;
            std::fill(values, values + kSuperBlock, int8_t(0));
            std::fill_n(out->sums.begin() + size_t(b) * kSumsPerBlock, kSumsPerBlock, 0);
            continue;
        }
        // The first value of that magnitude, sign kept.
        float largest = 0.0f;
        for (int i = 0; i < kSuperBlock; i += kLanes) {
            const __mmask16 at = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(block + i)),
                                                    _mm512_set1_ps(magnitude), _CMP_EQ_OQ);
            if (at) {
                largest = block[i + __builtin_ctz(at)];
                break;
            }
        }
        const float inverse = -kQ8KLargest / largest;
        for (int i = 0; i < kSuperBlock; i += kLanes) {
            // Rounded to nearest, ties to even (the default rounding mode).
            const __m512i q =
                _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_set1_ps(inverse),
                                                                  _mm512_loadu_ps(block + i))),
                                 _mm512_set1_epi32(127));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(values + i), _mm512_cvtepi32_epi8(q));
            out->sums[size_t(b) * kSumsPerBlock + i / kQ6SubBlock] =
                int16_t(_mm512_reduce_add_epi32(q));
        }
        out->d[b] = 1.0f / inverse;
    }
}

void matvec_rows_super_blocks(float* out, const Matrix& w, const Q8KVector& x, int first_row,
                              int row_count) {
    const int blocks = w.cols / kSuperBlock;
    const int end_row = first_row + row_count;
    switch (w.dtype) {
        case DType::Q4_K: {
            const int8_t* x_interleaved = interleave_for_k_chunks(x);
            for (int r = first_row; r < end_row; ++r)
                out[r] = k_row_dot<false>(w.row_data(r), blocks, x_interleaved, x);
            return;
        }
        case DType::Q5_K: {
            const int8_t* x_interleaved = interleave_for_k_chunks(x);
            for (int r = first_row; r < end_row; ++r)
                out[r] = k_row_dot<true>(w.row_data(r), blocks, x_interleaved, x);
            return;
        }
        case DType::Q6_K:
            for (int r = first_row; r < end_row; ++r)
                out[r] = q6_k_row_dot(w.row_data(r), blocks, x);
            return;
        case DType::IQ4_XS: {
            const int8_t* x_interleaved = interleave_for_iq4_xs(x);
            for (int r = first_row; r < end_row; ++r)
                out[r] = iq4_xs_row_dot(w.row_data(r), blocks, x_interleaved, x);
            return;
        }
        default:
            return;
    }
}

}  // namespace barellm::cpu::avx512
