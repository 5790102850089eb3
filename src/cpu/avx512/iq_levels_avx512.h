// The i-quant types' levels on AVX-512 (cpu/iq_levels.h): the 64 unsigned levels u of columns
// 64r..64r + 63 of a super-block (register r, 0..3), for the decode matvec
// (matvec_iq_avx512vnni.cpp) and the prefill GEMM (gemm_blocks_avx512vnni.cpp). The grid points
// come from gathers (8 points of 8 values, or 16 of 4, a register); the signs, a bit a column,
// become a 64-bit mask, under which u = offset − grid value, elsewhere offset + grid value. The
// ternary types' levels are their bit pairs or trits, unpacked in registers.
// Blocks are only 2-byte aligned: every load is unaligned.
#pragma once
#include <cstdint>
#include <cstring>

#include "cpu/avx512/intrinsics_avx512.h"
#include "cpu/iq_levels.h"
#include "weights/iq_grids.h"
#include "weights/weight_blocks.h"

namespace barellm::cpu::avx512 {

constexpr int kIqRegisters = kSuperBlock / 64;  // registers of 64 levels in a super-block
constexpr int kIqGroupsPerRegister = 64 / kIqGridGroup;

template <typename T>
inline T load_at(const uint8_t* p) {
    T value;
    std::memcpy(&value, p, sizeof value);
    return value;
}

// u = offset ± grid, minus where `negative` has the column's bit.
inline __m512i signed_levels(__m512i grid, __mmask64 negative, int offset) {
    const __m512i offsets = _mm512_set1_epi8(char(offset));
    return _mm512_mask_sub_epi8(_mm512_add_epi8(offsets, grid), negative, offsets, grid);
}

// The sign bytes (iq_signs_of_seven) of 8 groups whose 7 stored sign bits are the low 7 bits of
// the bytes of `sevens`: each byte's parity into its bit 7. The shifts fold each byte onto its
// bit 0 (bit 7 is clear, so a byte's bit 0 takes no bit of its neighbour).
inline uint64_t signs_of_sevens(uint64_t sevens) {
    constexpr uint64_t kBitZeros = 0x0101010101010101ull;
    uint64_t parity = sevens ^ (sevens >> 4);
    parity ^= parity >> 2;
    parity ^= parity >> 1;
    return sevens | (parity & kBitZeros) << 7;
}

// The sign bytes of the four groups of each of two 32-bit words of 7-bit signs (bits
// 7k..7k + 6: IQ2_XXS, IQ3_XXS), the first word's in the low 32 bits.
inline uint64_t signs_of_words(uint32_t first, uint32_t second) {
    const uint64_t words = first | uint64_t(second) << 32;
    constexpr uint64_t kField = 0x0000007f0000007full;  // bits 0..6 of each word
    const uint64_t sevens = (words & kField) | (words << 1 & kField << 8) |
                            (words << 2 & kField << 16) | (words << 3 & kField << 24);
    return signs_of_sevens(sevens);
}

// The 8 points of 8 values whose indices are the 64-bit lanes of `indices`.
inline __m512i gather_points8(__m512i indices, const uint64_t* grid) {
    return _mm512_i64gather_epi64(indices, reinterpret_cast<const long long*>(grid), 8);
}

// IQ2_XXS: sub-blocks 2r and 2r + 1, each its word of four indices then its word of signs.
inline __m512i iq2_xxs_levels(const uint8_t* block, int r) {
    const uint8_t* first = block + offsetof(BlockIQ2_XXS, qs) + 16 * r;
    const uint32_t indices[2] = {load_at<uint32_t>(first), load_at<uint32_t>(first + 8)};
    const uint32_t signs[2] = {load_at<uint32_t>(first + 4), load_at<uint32_t>(first + 12)};
    const __m512i points = gather_points8(
        _mm512_cvtepu8_epi64(_mm_setr_epi32(int(indices[0]), int(indices[1]), 0, 0)), kIq2XxsGrid);
    return signed_levels(points, signs_of_words(signs[0], signs[1]),
                         iq_shape(DType::IQ2_XXS).offset);
}

// IQ2_XS: groups 8r..8r + 7, a u16 each: the 9-bit index, 7-bit signs above it.
inline __m512i iq2_xs_levels(const uint8_t* block, int r) {
    const uint8_t* first = block + offsetof(BlockIQ2_XS, qs) + 16 * r;
    const __m512i words =
        _mm512_cvtepu16_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(first)));
    constexpr int kIndexBits = 9;
    const __m512i points = gather_points8(
        _mm512_and_si512(words, _mm512_set1_epi64((1 << kIndexBits) - 1)), kIq2XsGrid);
    // The 7 bits above each index, a byte each.
    const __m128i sevens = _mm512_cvtepi64_epi8(_mm512_srli_epi64(words, kIndexBits));
    return signed_levels(points, signs_of_sevens(uint64_t(_mm_cvtsi128_si64(sevens))),
                         iq_shape(DType::IQ2_XS).offset);
}

// IQ2_S: groups 8r..8r + 7: qs[k] and bits 2(k % 4), +1 of qh[k / 4] make the 10-bit index; the
// sign bytes as stored.
inline __m512i iq2_s_levels(const uint8_t* block, int r) {
    const __m512i low = _mm512_cvtepu8_epi64(_mm_loadl_epi64(
        reinterpret_cast<const __m128i*>(block + offsetof(BlockIQ2_S, qs) + 8 * r)));
    const __m512i high_bits =
        _mm512_set1_epi64(load_at<uint16_t>(block + offsetof(BlockIQ2_S, qh) + 2 * r));
    const __m512i high =
        _mm512_and_si512(_mm512_srlv_epi64(high_bits, _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14)),
                         _mm512_set1_epi64(3));
    const __m512i points =
        gather_points8(_mm512_or_si512(low, _mm512_slli_epi64(high, 8)), kIq2SGrid);
    return signed_levels(points, load_at<uint64_t>(block + offsetof(BlockIQ2_S, signs) + 8 * r),
                         iq_shape(DType::IQ2_S).offset);
}

// IQ3_XXS: 16 indices of 4 columns; the signs of sub-blocks 2r and 2r + 1 in their words.
inline __m512i iq3_xxs_levels(const uint8_t* block, int r) {
    const __m512i indices = _mm512_cvtepu8_epi32(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(block + offsetof(BlockIQ3_XXS, qs) + 16 * r)));
    const __m512i points = _mm512_i32gather_epi32(indices, kIq3XxsGrid, 4);
    const uint8_t* words = block + offsetof(BlockIQ3_XXS, scales_signs) + 8 * r;
    return signed_levels(points,
                         signs_of_words(load_at<uint32_t>(words), load_at<uint32_t>(words + 4)),
                         iq_shape(DType::IQ3_XXS).offset);
}

// IQ3_S: 16 indices of 4 columns, the ninth bit of index i bit i of qh's two bytes; the sign
// bytes as stored.
inline __m512i iq3_s_levels(const uint8_t* block, int r) {
    constexpr int kNinthBit = 256;
    __m512i indices = _mm512_cvtepu8_epi32(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(block + offsetof(BlockIQ3_S, qs) + 16 * r)));
    const __mmask16 high = load_at<uint16_t>(block + offsetof(BlockIQ3_S, qh) + 2 * r);
    indices = _mm512_mask_add_epi32(indices, high, indices, _mm512_set1_epi32(kNinthBit));
    const __m512i points = _mm512_i32gather_epi32(indices, kIq3SGrid, 4);
    return signed_levels(points, load_at<uint64_t>(block + offsetof(BlockIQ3_S, signs) + 8 * r),
                         iq_shape(DType::IQ3_S).offset);
}

// IQ1_*: u = 8·level + 1 ± 1 of the levels 0..2 of `points`: + 1 in the groups (64-bit lanes)
// whose shift is +1/8 (`positive`), − 1 in the others.
inline __m512i iq1_levels(__m512i points, __mmask8 positive) {
    constexpr int kEighths = 3;  // u counts eighths of a level: × 8
    const __m512i eighths = _mm512_slli_epi64(points, kEighths);
    return _mm512_mask_add_epi64(eighths, positive, eighths,
                                 _mm512_set1_epi8(2 * kIq1ShiftEighths));
}

// IQ1_S: groups 8r..8r + 7 of sub-blocks 2r and 2r + 1; sub-block j's qh word holds the top 3
// bits of its four indices, and its shift's sign in bit 15.
inline __m512i iq1_s_levels(const uint8_t* block, int r) {
    const uint8_t* qh = block + offsetof(BlockIQ1_S, qh) + 4 * r;
    const uint16_t high[2] = {load_at<uint16_t>(qh), load_at<uint16_t>(qh + 2)};
    const __m512i low = _mm512_cvtepu8_epi64(_mm_loadl_epi64(
        reinterpret_cast<const __m128i*>(block + offsetof(BlockIQ1_S, qs) + 8 * r)));
    const __m512i words =
        _mm512_setr_epi64(high[0], high[0], high[0], high[0], high[1], high[1], high[1], high[1]);
    const __m512i top = _mm512_and_si512(
        _mm512_srlv_epi64(words, _mm512_setr_epi64(0, 3, 6, 9, 0, 3, 6, 9)), _mm512_set1_epi64(7));
    const __m512i points =
        gather_points8(_mm512_or_si512(low, _mm512_slli_epi64(top, 8)), kIq1Grid);
    constexpr int kShiftSignBit = 15;
    const __mmask8 negative = _mm512_test_epi64_mask(words, _mm512_set1_epi64(1 << kShiftSignBit));
    return iq1_levels(points, __mmask8(~negative));
}

// IQ1_M: groups 8r..8r + 7, group k's nibble k % 2 of qh[k / 2]: 3 index bits, then its shift's
// sign.
inline __m512i iq1_m_levels(const uint8_t* block, int r) {
    const __m512i nibbles =
        _mm512_set1_epi64(load_at<uint32_t>(block + offsetof(BlockIQ1_M, qh) + 4 * r));
    const __m512i low = _mm512_cvtepu8_epi64(_mm_loadl_epi64(
        reinterpret_cast<const __m128i*>(block + offsetof(BlockIQ1_M, qs) + 8 * r)));
    const __m512i nibble =
        _mm512_srlv_epi64(nibbles, _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28));
    const __m512i top = _mm512_and_si512(nibble, _mm512_set1_epi64(7));
    const __m512i points =
        gather_points8(_mm512_or_si512(low, _mm512_slli_epi64(top, 8)), kIq1Grid);
    constexpr int kShiftSignBit = 3;
    const __mmask8 negative = _mm512_test_epi64_mask(nibble, _mm512_set1_epi64(1 << kShiftSignBit));
    return iq1_levels(points, __mmask8(~negative));
}

// TQ2_0: columns 64r..64r + 63 are the bit pairs 2t (the low half) and 2t + 2 (the high half),
// t = 2(r % 2), of the 32 bytes qs[32(r / 2) ..]: the bytes in both halves, each shifted by its
// own count.
inline __m512i tq2_0_levels(const uint8_t* block, int r) {
    constexpr int kLevelBits = 2;
    const __m512i bytes = _mm512_broadcast_i64x4(_mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(block + offsetof(BlockTQ2_0, qs) + 32 * (r / 2))));
    const int low_shift = kLevelBits * 2 * (r % 2);
    const __m512i shifts = _mm512_inserti64x4(_mm512_set1_epi16(short(low_shift)),
                                              _mm256_set1_epi16(short(low_shift + kLevelBits)), 1);
    return _mm512_and_si512(_mm512_srlv_epi16(bytes, shifts), _mm512_set1_epi8(3));
}

// 16-bit words a, a, b, b in a 64-bit lane.
constexpr long long tq1_0_words(int a, int b) {
    return (long long)(0x0000000000010001ull * unsigned(a) + 0x0001000100000000ull * unsigned(b));
}

// The trits of `bytes` (tq1_0_trit), trit n of each byte where the byte's 16-bit word of `powers`
// is 3^n: v·3^n mod 256 of the low byte by vpmullw kept to its byte, of the high byte from the
// word without its low byte (the product's carries fall off the top); then each (t·3) >> 8, the
// high half of the word times 3·256, the high byte's kept to its byte's place.
inline __m512i tq1_0_trits(__m512i bytes, __m512i powers) {
    const __m512i low_byte = _mm512_set1_epi16(0x00ff);
    const __m512i low = _mm512_and_si512(_mm512_mullo_epi16(bytes, powers), low_byte);
    const __m512i high = _mm512_mullo_epi16(_mm512_andnot_si512(low_byte, bytes), powers);
    const __m512i base_shifted = _mm512_set1_epi16(kTritBase << 8);
    return _mm512_or_si512(_mm512_mulhi_epu16(low, base_shifted),
                           _mm512_andnot_si512(low_byte, _mm512_mulhi_epu16(high, base_shifted)));
}

// TQ1_0: columns 64r..64r + 63 (weight_blocks.h's order): r = 0, 1 trits 2r and 2r + 1 of
// qs[0..31], one a half; r = 2 trit 4 of qs[0..31], then trits 0 and 1 of qs[32..47]; r = 3 trits
// 2, 3 and 4 of qs[32..47], then the four trits of qh[0..3], 4 columns each.
inline __m512i tq1_0_levels(const uint8_t* block, int r) {
    const uint8_t* qs = block + offsetof(BlockTQ1_0, qs);
    const __m256i wide = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
    const __m128i narrow = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + kTq1WideRun));
    const __m128i qh = _mm_set1_epi32(load_at<int32_t>(block + offsetof(BlockTQ1_0, qh)));
    // p_n: 3^n in every word of a 64-bit lane.
    constexpr const uint8_t* p = kTq1TritMultipliers;
    constexpr long long p0 = tq1_0_words(p[0], p[0]), p1 = tq1_0_words(p[1], p[1]),
                        p2 = tq1_0_words(p[2], p[2]), p3 = tq1_0_words(p[3], p[3]),
                        p4 = tq1_0_words(p[4], p[4]);
    // qh's 4 bytes repeated: trit n in bytes 4n..4n + 3, words 2n and 2n + 1.
    constexpr long long qh_low = tq1_0_words(p[0], p[1]), qh_high = tq1_0_words(p[2], p[3]);
    switch (r) {
        case 0:
            return tq1_0_trits(_mm512_broadcast_i64x4(wide),
                               _mm512_setr_epi64(p0, p0, p0, p0, p1, p1, p1, p1));
        case 1:
            return tq1_0_trits(_mm512_broadcast_i64x4(wide),
                               _mm512_setr_epi64(p2, p2, p2, p2, p3, p3, p3, p3));
        case 2:
            return tq1_0_trits(_mm512_inserti64x4(_mm512_castsi256_si512(wide),
                                                  _mm256_broadcastsi128_si256(narrow), 1),
                               _mm512_setr_epi64(p4, p4, p4, p4, p0, p0, p1, p1));
        default:
            return tq1_0_trits(_mm512_inserti32x4(_mm512_broadcast_i32x4(narrow), qh, 3),
                               _mm512_setr_epi64(p2, p2, p3, p3, p4, p4, qh_low, qh_high));
    }
}

// m = 2s + 1 of each lane, s the low `bits` bits of the lane of `scales`.
inline __m512i multipliers_of(__m512i scales, int bits) {
    const __m512i s = _mm512_and_si512(scales, _mm512_set1_epi32((1 << bits) - 1));
    return _mm512_add_epi32(_mm512_add_epi32(s, s), _mm512_set1_epi32(1));
}

// The multipliers m = 2s + 1 of a super-block of type kType: lane i that of columns
// 16i..16i + 15.
template <DType kType>
inline __m512i iq_multiplier_lanes(const uint8_t* block) {
    constexpr int kScaleBits = 4, kIq1ScaleBits = 3;
    constexpr int kTopNibble = 28;  // of IQ2_XXS's and IQ3_XXS's words of signs and scale
    // Lane i: lane picks[i] of v.
    auto pick = [](__m512i v, __m512i picks) { return _mm512_permutexvar_epi32(picks, v); };
    const __m512i halves = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i quarters = _mm512_srli_epi32(halves, 1);
    if constexpr (kType == DType::IQ2_XXS) {  // sub-block j: word 2j + 1 of qs, top nibble
        const __m512i words = _mm512_loadu_si512(block + offsetof(BlockIQ2_XXS, qs));
        const __m512i odd =
            _mm512_add_epi32(_mm512_add_epi32(halves, halves), _mm512_set1_epi32(1));
        return multipliers_of(_mm512_srli_epi32(pick(words, odd), kTopNibble), kScaleBits);
    } else if constexpr (kType == DType::IQ3_XXS) {  // sub-block j: word j, top nibble
        const __m512i words = _mm512_castsi256_si512(_mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(block + offsetof(BlockIQ3_XXS, scales_signs))));
        return multipliers_of(_mm512_srli_epi32(pick(words, halves), kTopNibble), kScaleBits);
    } else if constexpr (kType == DType::IQ2_XS || kType == DType::IQ2_S) {
        // nibble i % 2 of scales byte i / 2
        const size_t at =
            kType == DType::IQ2_XS ? offsetof(BlockIQ2_XS, scales) : offsetof(BlockIQ2_S, scales);
        const __m512i bytes =
            _mm512_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + at)));
        const __m512i nibble_shifts =
            _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
        return multipliers_of(_mm512_srlv_epi32(pick(bytes, halves), nibble_shifts), kScaleBits);
    } else if constexpr (kType ==
                         DType::IQ3_S) {  // sub-block i / 2: nibble (i / 2) % 2 of byte i / 4
        const __m512i bytes = _mm512_cvtepu8_epi32(
            _mm_cvtsi32_si128(load_at<int32_t>(block + offsetof(BlockIQ3_S, scales))));
        const __m512i nibble_shifts =
            _mm512_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4);
        return multipliers_of(_mm512_srlv_epi32(pick(bytes, quarters), nibble_shifts), kScaleBits);
    } else if constexpr (kType == DType::IQ1_S) {  // sub-block i / 2: bits 12..14 of its qh word
        constexpr int kScaleShift = 12;
        const __m512i words = _mm512_cvtepu16_epi32(_mm256_zextsi128_si256(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + offsetof(BlockIQ1_S, qh)))));
        return multipliers_of(_mm512_srli_epi32(pick(words, halves), kScaleShift), kIq1ScaleBits);
    } else {  // IQ1_M: bits 3(i % 4)..3(i % 4) + 2 of scales word i / 4
        const __m512i words = _mm512_cvtepu16_epi32(_mm256_zextsi128_si256(_mm_loadl_epi64(
            reinterpret_cast<const __m128i*>(block + offsetof(BlockIQ1_M, scales)))));
        const __m512i shifts = _mm512_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9);
        return multipliers_of(_mm512_srlv_epi32(pick(words, quarters), shifts), kIq1ScaleBits);
    }
}

// The levels of register r of a super-block of type kType.
template <DType kType>
inline __m512i iq_levels(const uint8_t* block, int r) {
    if constexpr (kType == DType::IQ2_XXS) return iq2_xxs_levels(block, r);
    if constexpr (kType == DType::IQ2_XS) return iq2_xs_levels(block, r);
    if constexpr (kType == DType::IQ2_S) return iq2_s_levels(block, r);
    if constexpr (kType == DType::IQ3_XXS) return iq3_xxs_levels(block, r);
    if constexpr (kType == DType::IQ3_S) return iq3_s_levels(block, r);
    if constexpr (kType == DType::IQ1_S) return iq1_s_levels(block, r);
    if constexpr (kType == DType::IQ1_M) return iq1_m_levels(block, r);
    if constexpr (kType == DType::TQ1_0) return tq1_0_levels(block, r);
    if constexpr (kType == DType::TQ2_0) return tq2_0_levels(block, r);
}

}  // namespace barellm::cpu::avx512
