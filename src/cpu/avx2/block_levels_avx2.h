// Inline AVX2 helpers that read the block types' weights (weight_blocks.h) as registers of
// 32 unsigned levels (or IQ4_XS's signed values) in column order, and the super-block types'
// tiles (cpu/super_block_tiles.h) as registers of four columns of 8 rows, shared by
// the AVX2 decode matvecs (matvec_super_blocks_avx2.cpp, matvec_small_blocks_avx2.cpp,
// matvec_super_block_tiles_avx2.cpp; the Q8 and Q4 tiles' matvec_quantized_avxvnni.cpp) and the
// prefill GEMM on 256-bit registers (gemm_blocks_panels.h). Include it only from the *_avx2.cpp and
// *_avxvnni.cpp files.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/avx2/intrinsics_avx2.h"
#include "cpu/super_block_tiles.h"
#include "weights/weight_blocks.h"

namespace barellm::cpu::avx2 {

constexpr int kQ5Offset = 16;  // Q5_0's q stands for q − 16
// Byte offsets in a block (weight_blocks.h).
constexpr int kKScalesOffset = 4, kQ4KValuesOffset = 16, kQ5KHighOffset = 16, kQ5KValuesOffset = 48;
constexpr int kQ6HighOffset = 128, kQ6ScalesOffset = 192, kQ6DOffset = 208;
constexpr int kIq4ScalesHighOffset = 2, kIq4ScalesLowOffset = 4, kIq4ValuesOffset = 8;

inline float f16_at(const uint8_t* p) {
    uint16_t bits;
    std::memcpy(&bits, p, sizeof bits);
    return _cvtsh_ss(bits);
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// 16-bit lanes shifted left by `shift` (right where negative): a bit moves within its byte
// as long as it stays inside it, which is all the callers use.
inline __m256i shift_words(__m256i v, int shift) {
    return shift >= 0 ? _mm256_sll_epi16(v, _mm_cvtsi32_si128(shift))
                      : _mm256_srl_epi16(v, _mm_cvtsi32_si128(-shift));
}

// The vpshufb control that repeats 16-bit word `lower` of the low 128-bit lane over that
// lane and word `upper` of the high lane over the high lane.
inline __m256i pick_words(int lower, int upper) {
    return _mm256_setr_m128i(_mm_set1_epi16(int16_t(0x0100 + 0x0202 * lower)),
                             _mm_set1_epi16(int16_t(0x0100 + 0x0202 * upper)));
}

// The 32 nibbles of 16 bytes in column order: low nibbles are columns 0-15, high 16-31 (the
// small blocks' and an IQ4_XS sub-block's arrangement).
inline __m256i nibbles(const uint8_t* qs) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i low_nibble = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), low_nibble),
                            _mm_and_si128(bytes, low_nibble));
}

// 16 in byte j where bit j of the little-endian u32 at qh is set, else 0 (Q5_0/Q5_1's fifth
// bits): byte j takes qh's byte j / 8, then keeps bit j % 8.
inline __m256i fifth_bits(const uint8_t* qh) {
    uint32_t bits;
    std::memcpy(&bits, qh, sizeof bits);
    const __m256i spread =
        _mm256_shuffle_epi8(_mm256_set1_epi32(int32_t(bits)),
                            _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                               0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                            _mm256_set1_epi8(kQ5Offset));
}

// The levels q (0..15, or 0..31 with the fifth bits) of a Q4_1, Q5_0 or Q5_1 block.
template <DType kType>
inline __m256i small_block_levels(const uint8_t* block) {
    constexpr bool kHasMin = kType != DType::Q5_0;
    constexpr int kHighOffset = kHasMin ? 4 : 2;  // qh of Q5_0/Q5_1
    constexpr int kValuesOffset = kType == DType::Q4_1 ? 4 : kHighOffset + 4;
    const __m256i q = nibbles(block + kValuesOffset);
    if constexpr (kType == DType::Q4_1) return q;
    return _mm256_or_si256(q, fifth_bits(block + kHighOffset));
}

// Chunk c of a Q4_K (kFifthBit false) or Q5_K super-block: the levels of sub-block 2c (low
// nibbles) and 2c + 1 (high), with bit 2c (or 2c + 1) of qh moved to bit 4 for Q5_K;
// high_bits is the block's qh (Q5_K).
template <bool kFifthBit>
inline void k_chunk_levels(const uint8_t* block, __m256i high_bits, int chunk, __m256i* low,
                           __m256i* high) {
    constexpr int kValuesOffset = kFifthBit ? kQ5KValuesOffset : kQ4KValuesOffset;
    const __m256i nibble = _mm256_set1_epi8(0x0f), fifth_bit = _mm256_set1_epi8(0x10);
    const __m256i bytes = load256(block + kValuesOffset + 32 * chunk);
    *low = _mm256_and_si256(bytes, nibble);
    *high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
    if constexpr (kFifthBit) {
        *low = _mm256_or_si256(*low,
                               _mm256_and_si256(shift_words(high_bits, 4 - 2 * chunk), fifth_bit));
        *high = _mm256_or_si256(*high,
                                _mm256_and_si256(shift_words(high_bits, 3 - 2 * chunk), fifth_bit));
    }
}

// The levels q (0..63) of weights 128·half + 32t .. + 31 of a Q6_K super-block (sub-blocks
// 8·half + 2t and + 1): the low bits in ql[64·half + 32·(t & 1) + l] (low nibble for t < 2),
// the high two in bits 2t, 2t + 1 of qh[32·half + l].
inline __m256i q6_k_levels(const uint8_t* block, int half, int t) {
    const __m256i nibble = _mm256_set1_epi8(0x0f), high_two = _mm256_set1_epi8(0x30);
    const __m256i bytes = load256(block + 64 * half + 32 * (t & 1));
    const __m256i low = _mm256_and_si256(t < 2 ? bytes : _mm256_srli_epi16(bytes, 4), nibble);
    const __m256i high_bits = load256(block + kQ6HighOffset + 32 * half);
    return _mm256_or_si256(low, _mm256_and_si256(shift_words(high_bits, 4 - 2 * t), high_two));
}

// IQ4_XS sub-block j's scale, ls_j − 32 (−32..31).
inline int iq4_xs_scale(const uint8_t* block, int j) {
    uint16_t scales_high;
    std::memcpy(&scales_high, block + kIq4ScalesHighOffset, sizeof scales_high);
    return (((block[kIq4ScalesLowOffset + j / 2] >> (4 * (j % 2))) & 15) |
            ((scales_high >> (2 * j)) & 3) << 4) -
           32;
}

// The table of kIq4Values in both 128-bit lanes, for iq4_xs_values.
inline __m256i iq4_table() {
    return _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Values)));
}
// The table of kMxfp4Values in both 128-bit lanes.
inline __m256i mxfp4_table() {
    return _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Values)));
}

// The signed values kIq4Values[q] of IQ4_XS sub-block j (table: iq4_table()).
inline __m256i iq4_xs_values(const uint8_t* block, int j, __m256i table) {
    return _mm256_shuffle_epi8(table, nibbles(block + kIq4ValuesOffset + 16 * j));
}

// A tile's 64-byte register is two halves of 8 rows, a 256-bit register each.
constexpr int kTileHalves = 2;
constexpr int kTileHalfBytes = kTileRegisterBytes / kTileHalves;  // 32
constexpr int kTileHalfRows = kTileRows / kTileHalves;            // 8

// Half h of register k of chunk c of a Q4_K (kFifthBit false) or Q5_K tile's super-block
// `block`: the levels of columns 64c + 4k..64c + 4k + 3 (sub-block 2c, `low`) and of the 32
// columns on (sub-block 2c + 1, `high`), four a lane, rows 8h..8h + 7. Q5_K: `low` is a byte's
// bits 0-4, `high` its bits 5-7 below bits 2c and 2c + 1 of the tile's top bits, shifted to
// bits 3 and 4 (c a constant, so that the shifts are immediates).
template <bool kFifthBit>
inline void k_tile_levels(const uint8_t* block, int c, int k, int h, __m256i* low, __m256i* high) {
    const __m256i bytes = _mm256_load_si256(reinterpret_cast<const __m256i*>(
        block + k_tile_values_offset(kFifthBit) + c * kQ4KTileChunkBytes + k * kTileRegisterBytes +
        h * kTileHalfBytes));
    if constexpr (kFifthBit) {
        const __m256i top_bits = _mm256_load_si256(reinterpret_cast<const __m256i*>(
            block + kQ5KTileHighOffset + k * kTileRegisterBytes + h * kTileHalfBytes));
        *low = _mm256_and_si256(bytes, _mm256_set1_epi8(0x1f));
        *high = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(bytes, kQ5KLowBits), _mm256_set1_epi8(0x07)),
            _mm256_and_si256(shift_words(top_bits, 3 - 2 * c), _mm256_set1_epi8(0x18)));
    } else {
        const __m256i nibble = _mm256_set1_epi8(0x0f);
        *low = _mm256_and_si256(bytes, nibble);
        *high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
    }
}

// Half h of sub-block i of a Q6_K tile's super-block `block`: q[s] the levels (0..63) of
// columns 16i + 4s..16i + 4s + 3, four a lane, rows 8h..8h + 7. Registers 0-2 hold levels 0-2
// in their low 6 bits; level 3's pairs of bits, at the top of each byte, shift down into place
// (the word shifts carry the next byte's bits in above them, which the masks drop).
inline void q6_k_tile_levels(const uint8_t* block, int i, int h, __m256i q[4]) {
    const __m256i six_bits = _mm256_set1_epi8(0x3f);
    const uint8_t* values =
        block + kQ6KTileValuesOffset + i * kQ6KTileSubBlockBytes + h * kTileHalfBytes;
    __m256i registers[3];
#pragma GCC unroll 3
    for (int s = 0; s < 3; ++s) {
        registers[s] =
            _mm256_load_si256(reinterpret_cast<const __m256i*>(values + s * kTileRegisterBytes));
        q[s] = _mm256_and_si256(registers[s], six_bits);
    }
    q[3] = _mm256_or_si256(
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(registers[0], 6), _mm256_set1_epi8(0x03)),
            _mm256_and_si256(_mm256_srli_epi16(registers[1], 4), _mm256_set1_epi8(0x0c))),
        _mm256_and_si256(_mm256_srli_epi16(registers[2], 2), _mm256_set1_epi8(0x30)));
}

// Half h of sub-block i of a Q2_K tile's super-block `block`: q[s] the levels (0..3) of columns
// 16i + 4s..16i + 4s + 3, four a lane, rows 8h..8h + 7: bits 2s and 2s + 1 of each byte of the
// sub-block's register (the word shifts carry the next byte's bits in above them, which the mask
// drops).
inline void q2_k_tile_levels(const uint8_t* block, int i, int h, __m256i q[4]) {
    const __m256i levels = _mm256_load_si256(reinterpret_cast<const __m256i*>(
        block + kQ2KTileValuesOffset + i * kTileRegisterBytes + h * kTileHalfBytes));
    const __m256i level = _mm256_set1_epi8(0x03);
    q[0] = _mm256_and_si256(levels, level);
#pragma GCC unroll 3
    for (int s = 1; s < 4; ++s)
        q[s] = _mm256_and_si256(_mm256_srli_epi16(levels, kQ2KLevelBits * s), level);
}

// Half h of sub-block i of a Q3_K tile's super-block `block`: q[s] the levels (0..7) of columns
// 16i + 4s..16i + 4s + 3, four a lane, rows 8h..8h + 7. Sub-block 2p's four are bits 0-2 and 3-5
// of its pair's R0 and R1; 2p + 1's first two those of R2, its last two gathered from the three
// registers' bits 6-7 (the word shifts carry the next byte's bits in above them, which the masks
// drop).
inline void q3_k_tile_levels(const uint8_t* block, int i, int h, __m256i q[4]) {
    const uint8_t* pair =
        block + kQ3KTileValuesOffset + i / 2 * kQ3KTilePairBytes + h * kTileHalfBytes;
    auto load = [&](int r) {
        return _mm256_load_si256(reinterpret_cast<const __m256i*>(pair + r * kTileRegisterBytes));
    };
    const __m256i r0 = load(0), r1 = load(1), level = _mm256_set1_epi8(0x07);
    if (i % 2 == 0) {
        q[0] = _mm256_and_si256(r0, level);
        q[1] = _mm256_and_si256(_mm256_srli_epi16(r0, 3), level);
        q[2] = _mm256_and_si256(r1, level);
        q[3] = _mm256_and_si256(_mm256_srli_epi16(r1, 3), level);
        return;
    }
    const __m256i r2 = load(2);
    q[0] = _mm256_and_si256(r2, level);
    q[1] = _mm256_and_si256(_mm256_srli_epi16(r2, 3), level);
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(r0, 6), _mm256_set1_epi8(0x03)),
                           _mm256_and_si256(_mm256_srli_epi16(r1, 4), _mm256_set1_epi8(0x04)));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(r1, 7), _mm256_set1_epi8(0x01)),
                           _mm256_and_si256(_mm256_srli_epi16(r2, 5), _mm256_set1_epi8(0x06)));
}

// Half h of register k of sub-block j of an IQ4_XS tile's super-block `block`: the signed
// values (table: iq4_table()) of columns 32j + 4k..32j + 4k + 3 (`low`) and of the 16 columns
// on (`high`), four a lane, rows 8h..8h + 7.
inline void iq4_xs_tile_values(const uint8_t* block, int j, int k, int h, __m256i table,
                               __m256i* low, __m256i* high) {
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    const __m256i bytes = _mm256_load_si256(reinterpret_cast<const __m256i*>(
        block + kIq4XSTileValuesOffset + j * kIq4XSTileSubBlockBytes + k * kTileRegisterBytes +
        h * kTileHalfBytes));
    *low = _mm256_shuffle_epi8(table, _mm256_and_si256(bytes, nibble));
    *high = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble));
}

// The four bytes at p in every 32-bit lane: four columns of x against a tile's register.
inline __m256i broadcast_word(const int8_t* p) {
    int32_t word;
    std::memcpy(&word, p, sizeof word);
    return _mm256_set1_epi32(word);
}

// The 8 f16 at p (a tile's d or dmin of 8 rows, or a Q8/Q4 tile's scales of 8 rows) as f32.
inline __m256 tile_halves(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// The 8 rows' scales of half h of group g of a tile of cpu/quantized_tiles.h, as f32: f16, or
// MXFP4's bf16 (the top half of an f32).
template <DType kType>
inline __m256 group_tile_halves(const uint8_t* tile, int g, int h) {
    const uint8_t* p =
        reinterpret_cast<const uint8_t*>(tile_group_scales(tile, kType, g) + h * kTileHalfRows);
    if constexpr (kType == DType::MXFP4)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(p))), 16));
    return tile_halves(p);
}

// Sums of the 8 rows of a half tile, row_base..row_base + 7, into out[row], those in [first,
// end).
inline void store_rows(float* out, __m256 sums, int row_base, int first, int end) {
    if (row_base >= first && row_base + kTileHalfRows <= end) {
        _mm256_storeu_ps(out + row_base, sums);
        return;
    }
    alignas(32) float lanes[kTileHalfRows];
    _mm256_store_ps(lanes, sums);
    for (int lane = std::max(0, first - row_base); lane < std::min(kTileHalfRows, end - row_base);
         ++lane)
        out[row_base + lane] = lanes[lane];
}

}  // namespace barellm::cpu::avx2
