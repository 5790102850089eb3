// The i-quant types' levels on AVX2 (cpu/iq_levels.h): the 32 unsigned levels u of columns
// 32r..32r + 31 of a super-block (register r, 0..7), for the decode matvec
// (matvec_iq_avx2.cpp) and the prefill GEMM on 256-bit registers (gemm_blocks_panels.h). The 4
// grid points of 8 values of a register are loaded one by one, the 8 points of 4 values
// (IQ3_*) gathered; the signs, a byte per 8 columns, become a byte mask (the 7-bit ones looked
// up in kIqSignMasks), under which u = offset − grid value, elsewhere offset + grid value.
// The multipliers m = 2s + 1 of a super-block come as 16 words, one per 16 columns
// (iq_multiplier_words). The ternary types' levels are their bit pairs or trits, unpacked in
// registers, their m 1.
// Blocks are only 2-byte aligned: every load is unaligned. Include it only from the *_avx2.cpp
// and *_avxvnni.cpp files.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu/avx2/block_levels_avx2.h"
#include "cpu/avx2/intrinsics_avx2.h"
#include "cpu/iq_levels.h"
#include "weights/iq_grids.h"
#include "weights/weight_blocks.h"

namespace barellm::cpu::avx2 {

constexpr int kIqRegisterCols = 32;                          // levels in a register
constexpr int kIqRegisters = kSuperBlock / kIqRegisterCols;  // 8

template <typename T>
inline T iq_load(const uint8_t* p) {
    T value;
    std::memcpy(&value, p, sizeof value);
    return value;
}

// The vpshufb control that repeats byte k of the low 32-bit word over the 8 bytes of 64-bit lane
// k: a byte per group of 8 columns spread over its columns.
inline __m256i spread_group_bytes() {
    return _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202,
                              0x0303030303030303);
}

// 0xff in column i of each group of 8 where bit i of its sign byte, in each of its 8 bytes of
// `spread`, is set (that weight negative), else 0: each byte keeps its own bit, compared with it.
inline __m256i negative_of_spread_signs(__m256i spread) {
    const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

// negative_of_spread_signs of group k's sign byte, byte k of `signs`.
inline __m256i negative_columns(uint32_t signs) {
    return negative_of_spread_signs(
        _mm256_shuffle_epi8(_mm256_set1_epi32(int32_t(signs)), spread_group_bytes()));
}

// u = offset + grid value, or offset − grid value where `negative` is 0xff: (g ^ −1) − (−1) is
// −g, (g ^ 0) − 0 is g.
inline __m256i signed_levels(__m256i grid, __m256i negative, int offset) {
    return _mm256_add_epi8(_mm256_set1_epi8(char(offset)),
                           _mm256_sub_epi8(_mm256_xor_si256(grid, negative), negative));
}

// The 8-byte entries i0..i3 of `table` (grid points, or sign masks) in 64-bit lanes 0..3: a
// broadcast load each, then blends, which leave the shuffle port free. A gather (vpgatherdq) was
// no faster on the Intel Xeon of docs/BENCHMARKS.md, and the microcode against Gather Data
// Sampling slows gathers on many other Intel CPUs.
inline __m256i table_entries(const uint64_t* table, unsigned i0, unsigned i1, unsigned i2,
                             unsigned i3) {
    constexpr int kLane1 = 0x0c, kLane3 = 0xc0, kHighLanes = 0xf0;  // vpblendd's 32-bit lanes
    const __m256i low = _mm256_blend_epi32(_mm256_set1_epi64x(int64_t(table[i0])),
                                           _mm256_set1_epi64x(int64_t(table[i1])), kLane1);
    const __m256i high = _mm256_blend_epi32(_mm256_set1_epi64x(int64_t(table[i2])),
                                            _mm256_set1_epi64x(int64_t(table[i3])), kLane3);
    return _mm256_blend_epi32(low, high, kHighLanes);
}

// The 4 points of `grid` whose index k is the byte low[k] with bits kStride·k .. kStride·k +
// kWidth − 1 of `high_bits` above it (IQ2_S, IQ1_S, IQ1_M).
template <int kStride, int kWidth>
inline __m256i points_of_split_indices(const uint64_t* grid, const uint8_t* low,
                                       unsigned high_bits) {
    constexpr int kLowBits = 8;
    constexpr unsigned kHighMask = ((1u << kWidth) - 1) << kLowBits;
    const unsigned high = high_bits << kLowBits;
    const auto index = [&](int k) { return low[k] | (high >> kStride * k & kHighMask); };
    return table_entries(grid, index(0), index(1), index(2), index(3));
}

// The sign masks (kIqSignMasks) of four groups whose 7-bit signs are bits 7k..7k + 6 of `word`
// (IQ2_XXS, IQ3_XXS), group k's in 64-bit lane k.
inline __m256i sign_masks_of_word(uint32_t word) {
    return table_entries(
        kIqSignMasks.of_seven, word & kIqSevenMask, word >> kIqSevenBits & kIqSevenMask,
        word >> 2 * kIqSevenBits & kIqSevenMask, word >> 3 * kIqSevenBits & kIqSevenMask);
}

// The 8 points of 4 values whose indices are the 32-bit lanes of `indices`.
inline __m256i gather_points4(__m256i indices, const uint32_t* grid) {
    return _mm256_i32gather_epi32(reinterpret_cast<const int*>(grid), indices, 4);
}

// IQ2_XXS, sub-block r: at qs + 8r its four 8-bit indices into kIq2XxsGrid, then its word of
// four 7-bit signs (bits 7k..7k + 6, group k) below the scale.
inline __m256i iq2_xxs_levels(const uint8_t* block, int r) {
    const uint8_t* indices = block + offsetof(BlockIQ2_XXS, qs) + 8 * r;
    const __m256i points =
        table_entries(kIq2XxsGrid, indices[0], indices[1], indices[2], indices[3]);
    return signed_levels(points, sign_masks_of_word(iq_load<uint32_t>(indices + 4)),
                         iq_shape(DType::IQ2_XXS).offset);
}

// IQ2_XS, groups 4r..4r + 3: a u16 each at qs + 8r, its 9-bit index into kIq2XsGrid and 7-bit
// signs above it.
inline __m256i iq2_xs_levels(const uint8_t* block, int r) {
    constexpr int kIndexBits = 9, kWordBits = 16;
    constexpr unsigned kIndexMask = (1 << kIndexBits) - 1;
    const uint64_t words = iq_load<uint64_t>(block + offsetof(BlockIQ2_XS, qs) + 8 * r);
    const auto index = [&](int k) { return unsigned(words >> kWordBits * k) & kIndexMask; };
    const auto signs = [&](int k) {
        return unsigned(words >> (kWordBits * k + kIndexBits)) & kIqSevenMask;
    };
    const uint64_t* masks = kIqSignMasks.of_seven;
    return signed_levels(table_entries(kIq2XsGrid, index(0), index(1), index(2), index(3)),
                         table_entries(masks, signs(0), signs(1), signs(2), signs(3)),
                         iq_shape(DType::IQ2_XS).offset);
}

// IQ2_S, groups 4r..4r + 3: group k's 10-bit index into kIq2SGrid is qs[4r + k] with bits 2k,
// 2k + 1 of qh[r] above it; its signs the byte signs[4r + k].
inline __m256i iq2_s_levels(const uint8_t* block, int r) {
    constexpr int kHighBits = 2;
    return signed_levels(
        points_of_split_indices<kHighBits, kHighBits>(kIq2SGrid,
                                                      block + offsetof(BlockIQ2_S, qs) + 4 * r,
                                                      block[offsetof(BlockIQ2_S, qh) + r]),
        negative_columns(iq_load<uint32_t>(block + offsetof(BlockIQ2_S, signs) + 4 * r)),
        iq_shape(DType::IQ2_S).offset);
}

// IQ3_XXS, sub-block r: the 8-bit indices into kIq3XxsGrid of its 8 quads at qs + 8r; its word
// of four 7-bit signs (a group of 8 columns, two quads, each) below the scale at scales_signs + 4r.
inline __m256i iq3_xxs_levels(const uint8_t* block, int r) {
    const __m256i points = gather_points4(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(
            reinterpret_cast<const __m128i*>(block + offsetof(BlockIQ3_XXS, qs) + 8 * r))),
        kIq3XxsGrid);
    const uint32_t signs = iq_load<uint32_t>(block + offsetof(BlockIQ3_XXS, scales_signs) + 4 * r);
    return signed_levels(points, sign_masks_of_word(signs), iq_shape(DType::IQ3_XXS).offset);
}

// IQ3_S, quads 8r..8r + 7: quad i's 9-bit index into kIq3SGrid is qs[8r + i] with bit i of
// qh[r] above it; group k's signs (two quads) the byte signs[4r + k].
inline __m256i iq3_s_levels(const uint8_t* block, int r) {
    constexpr int kIndexHighBit = 1 << 8;
    const __m256i low = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
        reinterpret_cast<const __m128i*>(block + offsetof(BlockIQ3_S, qs) + 8 * r)));
    // qh[r] shifted left by 8 − i in lane i: its bit i lands on bit 8.
    const __m256i high =
        _mm256_and_si256(_mm256_sllv_epi32(_mm256_set1_epi32(block[offsetof(BlockIQ3_S, qh) + r]),
                                           _mm256_setr_epi32(8, 7, 6, 5, 4, 3, 2, 1)),
                         _mm256_set1_epi32(kIndexHighBit));
    const __m256i points = gather_points4(_mm256_or_si256(low, high), kIq3SGrid);
    return signed_levels(
        points, negative_columns(iq_load<uint32_t>(block + offsetof(BlockIQ3_S, signs) + 4 * r)),
        iq_shape(DType::IQ3_S).offset);
}

// IQ1_*: u = 8·level + 1 ± 1 of grid levels 0..2 (`points`), the shift's sign byte k (0xff for
// −1/8) over group k: the levels shifted up by 3 within their bytes, plus 1 + shift.
inline __m256i iq1_levels(__m256i points, uint32_t negative_shifts) {
    constexpr int kEighthsBits = 3;  // 8·level
    const __m256i negative =
        _mm256_shuffle_epi8(_mm256_set1_epi32(int32_t(negative_shifts)), spread_group_bytes());
    const __m256i positive_shift = _mm256_set1_epi8(1 + kIq1ShiftEighths);
    const __m256i shift = _mm256_add_epi8(
        positive_shift, _mm256_and_si256(negative, _mm256_set1_epi8(char(-2 * kIq1ShiftEighths))));
    return _mm256_add_epi8(_mm256_slli_epi64(points, kEighthsBits), shift);
}

// IQ1_S, sub-block r: group k's 11-bit index into kIq1Grid is qs[4r + k] with bits 3k..3k + 2 of
// the u16 qh[r] above it; bit 15 of qh[r] the sign of the sub-block's shift.
inline __m256i iq1_s_levels(const uint8_t* block, int r) {
    constexpr int kHighBits = 3, kShiftSignBit = 15;
    const unsigned high_bits = iq_load<uint16_t>(block + offsetof(BlockIQ1_S, qh) + 2 * r);
    return iq1_levels(points_of_split_indices<kHighBits, kHighBits>(
                          kIq1Grid, block + offsetof(BlockIQ1_S, qs) + 4 * r, high_bits),
                      high_bits >> kShiftSignBit ? ~0u : 0u);
}

// IQ1_M, groups 4r..4r + 3: group k's index into kIq1Grid is qs[4r + k] with bits 0..2 of nibble
// k of the u16 at qh + 2r above it; bit 3 of that nibble the sign of the group's shift.
inline __m256i iq1_m_levels(const uint8_t* block, int r) {
    constexpr int kNibbleBits = 4, kHighBits = 3;
    const unsigned nibbles = iq_load<uint16_t>(block + offsetof(BlockIQ1_M, qh) + 2 * r);
    // The u16 shifted right by 4k in lane k: nibble k's sign bit moved to bit 11.
    const __m128i shifted =
        _mm_srlv_epi32(_mm_set1_epi32(nibbles << 8),
                       _mm_setr_epi32(0, kNibbleBits, 2 * kNibbleBits, 3 * kNibbleBits));
    const __m256i points = points_of_split_indices<kNibbleBits, kHighBits>(
        kIq1Grid, block + offsetof(BlockIQ1_M, qs) + 4 * r, nibbles);
    // Bit 3 of each nibble (bit 11 of its lane) as a byte of 0xff per group.
    const __m128i sign_bit = _mm_set1_epi32(1 << (8 + kHighBits));
    const __m128i negative = _mm_cmpeq_epi32(_mm_and_si128(shifted, sign_bit), sign_bit);
    return iq1_levels(points, uint32_t(_mm_cvtsi128_si32(_mm_packs_epi16(
                                  _mm_packs_epi32(negative, negative), _mm_setzero_si128()))));
}

// TQ2_0: columns 32r..32r + 31 are the bit pairs 2t, t = r % 4, of qs[32(r / 4) ..].
inline __m256i tq2_0_levels(const uint8_t* block, int r) {
    constexpr int kLevelBits = 2, kPairs = 4;  // bit pairs in a byte
    const __m256i bytes = load256(block + offsetof(BlockTQ2_0, qs) + 32 * (r / kPairs));
    return _mm256_and_si256(_mm256_srli_epi16(bytes, kLevelBits * (r % kPairs)),
                            _mm256_set1_epi8(3));
}

// Each byte times 3, modulo 256: a TQ1_0 byte's trits moved up one place (tq1_0_trit).
inline __m256i bytes_times_three(__m256i v) { return _mm256_add_epi8(_mm256_add_epi8(v, v), v); }
inline __m128i bytes_times_three(__m128i v) { return _mm_add_epi8(_mm_add_epi8(v, v), v); }

// TQ1_0 bytes v as v − 128 where kCentred, the form in which the trits are read by signed
// compares (times 3 keeps it, as 3(v − 128) = 3v − 128 − 256); as they are otherwise.
template <bool kCentred, typename Vector>
inline Vector tq1_0_bytes(Vector v) {
    if constexpr (!kCentred) return v;
    if constexpr (sizeof(Vector) == sizeof(__m256i))
        return _mm256_xor_si256(v, _mm256_set1_epi8(char(0x80)));
    else
        return _mm_xor_si128(v, _mm_set1_epi8(char(0x80)));
}

// The bytes of TQ1_0's register r (columns 32r..32r + 31, weight_blocks.h's order) times 3^n
// modulo 256, n the trit each column takes from its byte, the trit that the product brings to
// the top (tq1_0_trit); less 128 where kCentred (tq1_0_bytes). r = 0..4 trit r of qs[0..31];
// r = 5, 6 trits 2(r − 5) and 2(r − 5) + 1 of qs[32..47], one a 128-bit lane; r = 7 trit 4 of
// qs[32..47], then the four trits of qh[0..3], 4 columns each. Each power of 3 is reached by
// adds, without a multiply (the decode loops, unrolled, share the repeated adds).
template <bool kCentred>
inline __m256i tq1_0_shifted_bytes(const uint8_t* block, int r) {
    const uint8_t* qs = block + offsetof(BlockTQ1_0, qs);
    __m256i v;
    int n;  // the power of 3 still to apply
    if (r < kTq1QsTrits) {
        v = tq1_0_bytes<kCentred>(load256(qs));
        n = r;
    } else {
        const __m256i narrow = _mm256_broadcastsi128_si256(tq1_0_bytes<kCentred>(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + kTq1WideRun))));
        v = _mm256_blend_epi32(narrow, bytes_times_three(narrow), 0xf0);  // trits 0 | 1
        n = 2 * (r - kTq1QsTrits);
    }
    for (int i = 0; i < n; ++i) v = bytes_times_three(v);
    if (r < kIqRegisters - 1) return v;
    // Register 7's high lane: qh's 4 bytes repeated, bytes 4n..4n + 3 times 3^n.
    const __m128i qh =
        tq1_0_bytes<kCentred>(_mm_set1_epi32(iq_load<int32_t>(block + offsetof(BlockTQ1_0, qh))));
    const __m128i qh_3 = bytes_times_three(qh), qh_9 = bytes_times_three(qh_3);
    const __m128i qh_shifted =
        _mm_blend_epi32(_mm_blend_epi32(_mm_blend_epi32(qh, qh_3, 0b0010), qh_9, 0b0100),
                        bytes_times_three(qh_9), 0b1000);
    return _mm256_inserti128_si256(v, qh_shifted, 1);
}

// TQ1_0 register r's levels, the trits ⌊3v/256⌋ (tq1_0_trit) of its shifted bytes v: 0 where
// v ≤ 85, 2 where v ≥ 171, else 1; each a compare of the centred bytes v − 128 giving −1.
inline __m256i tq1_0_levels(const uint8_t* block, int r) {
    constexpr int kLastOfZero = 85 - 128, kFirstOfTwo = 171 - 128;  // centred
    const __m256i centred = tq1_0_shifted_bytes<true>(block, r);
    const __m256i zero = _mm256_cmpgt_epi8(_mm256_set1_epi8(kLastOfZero + 1), centred);
    const __m256i two = _mm256_cmpgt_epi8(centred, _mm256_set1_epi8(kFirstOfTwo - 1));
    return _mm256_sub_epi8(_mm256_add_epi8(_mm256_set1_epi8(1), zero), two);
}

// The 16-bit word 2s + 1 from each word s (0..15) of `s`.
inline __m256i odd_multipliers(__m256i s) {
    return _mm256_add_epi16(_mm256_add_epi16(s, s), _mm256_set1_epi16(1));
}
// Each 32-bit lane's low 16 bits in both its words: a sub-block of 32's s for its two slots of 16.
inline __m256i both_words(__m256i lanes) {
    return _mm256_or_si256(lanes, _mm256_slli_epi32(lanes, 16));
}

// The 16 m = 2s + 1 of a super-block (cpu/iq_levels.h) as 16-bit words, m of columns
// 16i..16i + 15 in word i.
template <DType kType>
inline __m256i iq_multiplier_words(const uint8_t* block) {
    constexpr int kNibble = 15, kThreeBits = 7, kNibbleBits = 4;
    constexpr int kTopNibbleShift = 28;  // the 4-bit s atop IQ2_XXS's and IQ3_XXS's sign words
    __m256i s;
    if constexpr (kType == DType::IQ2_XXS) {
        // The 64-bit word of sub-block j (indices, then signs and scale) at qs + 8j: s_j is its
        // top nibble. packs_epi32 interleaves the two loads by 128-bit lanes (sub-blocks 0, 1,
        // 4, 5 | 2, 3, 6, 7); the permute restores the order.
        const uint8_t* qs = block + offsetof(BlockIQ2_XXS, qs);
        constexpr int kTop = 64 - kNibbleBits;
        s = both_words(
            _mm256_permute4x64_epi64(_mm256_packs_epi32(_mm256_srli_epi64(load256(qs), kTop),
                                                        _mm256_srli_epi64(load256(qs + 32), kTop)),
                                     0xd8));
    } else if constexpr (kType == DType::IQ3_XXS) {  // the top nibbles of 8 words
        s = both_words(_mm256_srli_epi32(load256(block + offsetof(BlockIQ3_XXS, scales_signs)),
                                         kTopNibbleShift));
    } else if constexpr (kType == DType::IQ2_XS || kType == DType::IQ2_S) {
        // s_2j the low nibble of scales[j], s_2j+1 its high nibble.
        const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(
            block + (kType == DType::IQ2_XS ? offsetof(BlockIQ2_XS, scales)
                                            : offsetof(BlockIQ2_S, scales)))));
        s = _mm256_or_si256(_mm256_and_si256(bytes, _mm256_set1_epi32(kNibble)),
                            _mm256_slli_epi32(_mm256_srli_epi32(bytes, kNibbleBits), 16));
    } else if constexpr (kType == DType::IQ3_S) {
        // s_2k the low nibble of scales[k], s_2k+1 its high nibble, each for two slots of 16.
        const __m256i bytes = _mm256_cvtepu8_epi64(
            _mm_cvtsi32_si128(iq_load<int32_t>(block + offsetof(BlockIQ3_S, scales))));
        s = both_words(
            _mm256_or_si256(_mm256_and_si256(bytes, _mm256_set1_epi64x(kNibble)),
                            _mm256_slli_epi64(_mm256_srli_epi64(bytes, kNibbleBits), 32)));
    } else if constexpr (kType == DType::IQ1_S) {  // s_j bits 12..14 of the u16 qh[j]
        constexpr int kScaleShift = 12;
        s = both_words(_mm256_and_si256(
            _mm256_srli_epi32(
                _mm256_cvtepu16_epi32(_mm_loadu_si128(
                    reinterpret_cast<const __m128i*>(block + offsetof(BlockIQ1_S, qh)))),
                kScaleShift),
            _mm256_set1_epi32(kThreeBits)));
    } else if constexpr (!has_multipliers(kType)) {  // the ternary types: m = 1
        return _mm256_set1_epi16(1);
    } else {  // IQ1_M: s_i bits 3(i % 4)..+2 of the u16 scales word i / 4
        // Word i / 4 in word i (the low lane words 0, 1, the high lane 2, 3), its bits
        // 3(i % 4)..+2 moved to the top by a multiply by 2^(13 − 3(i % 4)), then down.
        constexpr int kTopThree = 16 - 3;
        const __m256i words = _mm256_shuffle_epi8(
            _mm256_set1_epi64x(iq_load<int64_t>(block + offsetof(BlockIQ1_M, scales))),
            _mm256_setr_epi64x(0x0100010001000100, 0x0302030203020302, 0x0504050405040504,
                               0x0706070607060706));
        const __m256i to_top =
            _mm256_set1_epi64x(0x0010008004002000);  // words 2^13, 2^10, 2^7, 2^4
        s = _mm256_srli_epi16(_mm256_mullo_epi16(words, to_top), kTopThree);
    }
    return odd_multipliers(s);
}

// Register r of a super-block of kType.
template <DType kType>
inline __m256i iq_levels(const uint8_t* block, int r) {
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

}  // namespace barellm::cpu::avx2
