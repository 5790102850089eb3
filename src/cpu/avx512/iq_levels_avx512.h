// The i-quant types' levels on AVX-512 (cpu/iq_levels.h): the 64 unsigned levels u of columns
// 64r..64r + 63 of a super-block (register r, 0..3), for the decode matvec
// (matvec_iq_avx512vnni.cpp) and the prefill GEMM (gemm_blocks_avx512vnni.cpp). The grid points
// come from gathers (8 points of 8 values, or 16 of 4, a register); the signs, a bit a column,
// become a 64-bit mask, under which u = offset − grid value, elsewhere offset + grid value.
// Blocks are only 2-byte aligned: every load is unaligned.
#pragma once
#include <array>
#include <cstdint>
#include <cstring>

#include "cpu/avx512/intrinsics_avx512.h"
#include "cpu/iq_levels.h"
#include "weights/iq_grids.h"
#include "weights/weight_blocks.h"

namespace barellm::cpu::avx512 {

constexpr int kIqRegisters = kSuperBlock / 64;  // registers of 64 levels in a super-block
constexpr int kIqGroupsPerRegister = 64 / kIqGridGroup;

// iq_signs_of_seven of every 7 bits.
constexpr std::array<uint8_t, 128> kIqSignsOfSeven = [] {
    std::array<uint8_t, 128> table{};
    for (unsigned i = 0; i < table.size(); ++i) table[i] = iq_signs_of_seven(i);
    return table;
}();

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

// The sign bytes of the four groups of one 32-bit word of 7-bit signs (IQ2_XXS, IQ3_XXS), as
// the low 32 bits of a mask.
inline uint64_t signs_of_word(uint32_t word) {
    uint64_t bytes = 0;
    for (int k = 0; k < 4; ++k)
        bytes |= uint64_t(kIqSignsOfSeven[(word >> (7 * k)) & 0x7f]) << (8 * k);
    return bytes;
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
    return signed_levels(points, signs_of_word(signs[0]) | signs_of_word(signs[1]) << 32,
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
    uint64_t signs = 0;
    for (int k = 0; k < kIqGroupsPerRegister; ++k)
        signs |= uint64_t(kIqSignsOfSeven[load_at<uint16_t>(first + 2 * k) >> kIndexBits])
                 << (8 * k);
    return signed_levels(points, signs, iq_shape(DType::IQ2_XS).offset);
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
    return signed_levels(
        points,
        signs_of_word(load_at<uint32_t>(words)) | signs_of_word(load_at<uint32_t>(words + 4)) << 32,
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

// IQ1_*: u = 8·level + 1 ± 1 of the levels 0..2 of `points`, + 1 where the group's shift is
// +1/8 (`positive`, a bit a column), − 1 elsewhere.
inline __m512i iq1_levels(__m512i points, uint64_t positive) {
    constexpr int kEighths = 3;  // u counts eighths of a level: × 8
    const __m512i eighths = _mm512_slli_epi64(points, kEighths);
    return _mm512_mask_add_epi8(eighths, positive, eighths, _mm512_set1_epi8(2 * kIq1ShiftEighths));
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
    constexpr uint64_t kHalf = 0xffffffffull;  // the 32 columns of one sub-block
    const uint64_t positive = (high[0] >> 15 ? 0 : kHalf) | (high[1] >> 15 ? 0 : kHalf << 32);
    return iq1_levels(points, positive);
}

// IQ1_M: groups 8r..8r + 7, group k's nibble k % 2 of qh[k / 2]: 3 index bits, then its shift's
// sign.
inline __m512i iq1_m_levels(const uint8_t* block, int r) {
    const uint32_t nibbles = load_at<uint32_t>(block + offsetof(BlockIQ1_M, qh) + 4 * r);
    const __m512i low = _mm512_cvtepu8_epi64(_mm_loadl_epi64(
        reinterpret_cast<const __m128i*>(block + offsetof(BlockIQ1_M, qs) + 8 * r)));
    const __m512i top =
        _mm512_and_si512(_mm512_srlv_epi64(_mm512_set1_epi64(nibbles),
                                           _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28)),
                         _mm512_set1_epi64(7));
    const __m512i points =
        gather_points8(_mm512_or_si512(low, _mm512_slli_epi64(top, 8)), kIq1Grid);
    constexpr int kShiftSignBit = 3;
    uint64_t positive = 0;
    for (int k = 0; k < kIqGroupsPerRegister; ++k)
        if (!((nibbles >> (4 * k + kShiftSignBit)) & 1)) positive |= uint64_t(0xff) << (8 * k);
    return iq1_levels(points, positive);
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
}

}  // namespace barellm::cpu::avx512
