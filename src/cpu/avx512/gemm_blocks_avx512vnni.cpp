// The prefill GEMM on AVX-512 + VNNI for the block types (weight_blocks.h: Q2_K, Q3_K, Q4_K, Q5_K,
// Q6_K, IQ4_XS, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, the i-quants, TQ1_0 and TQ2_0): out[token][row] =
// Σ_col W[row][col] · x[token][col], x in int8 with a scale per group of 32 columns
// (QuantizedBatch: quantized per 32 as for the Q8/Q4 GEMM, or per 256 as Q8_K for the super-block
// types), each sub-block an exact int32 dot product by vpdpbusd.
//
// Every block type reads, per sub-block s of a row, w = A_s · u + B (u an unsigned level
// 0..255):
// - "min" types (Q4_K, Q5_K: A = d·sc, B = −dmin·m; Q4_1, Q5_1: A = d, B = m), sub-blocks of
//   32 (Q2_K: A = d·sc, B = −dmin·m, sub-blocks of 16): the sub-block's sum is
//   A · sx · Σ u·q + B · sx · Σ q, the second term from x's sums;
// - "offset" types, B = −offset · A (Q5_0: offset 16; IQ4_XS, IQ4_NL, MXFP4: u = level + 128,
//   offset 128;
//   Q6_K: offset 32, sub-blocks of 16; Q3_K: offset 4, sub-blocks of 16; the i-quants, their
//   offset and A = d · factor · m per sub-block of 16 or 32, cpu/iq_levels.h; the ternary types
//   TQ1_0 and TQ2_0, offset 1 and A = d): the int32 dot starts from −offset · Σ q, so it is
//   Σ (u − offset)·q exactly, then scaled by A · sx.
//
// The layout: per tile of kQuantizedRowTile (32) rows, the blocks are unpacked once into a
// panel laid out as the Q8/Q4 GEMM's (per group of 32 columns, per step of four columns, the
// four levels of each row side by side, 16 rows a register) and the sub-blocks' A and B as
// f32, 16 rows at a time with gathers of one 32-bit word of each row's block (the rows'
// blocks are row_bytes apart; Q4_K, Q5_K, Q6_K, IQ4_XS, IQ4_NL and MXFP4 from their tiles of 16
// rows where they have them, with no gathers; Q2_K and Q3_K only from their tiles; the i-quants and
// the ternary types a row at a time, 16 rows' registers of levels transposed). The panel (33 KB a
// 1024 columns) stays in L2 while every token of the batch meets it in the micro-kernel
// (block_tile_kernel).
#include <algorithm>
#include <cstddef>
#include <vector>

#include "cpu/avx512/avx512.h"
#include "cpu/avx512/helpers_avx512.h"
#include "cpu/avx512/iq_levels_avx512.h"
#include "cpu/block_sub_blocks.h"
#include "cpu/super_block_tiles.h"
#include "weights/weight_blocks.h"

namespace barellm::cpu::avx512 {

namespace {

constexpr int kGroup = kQ8Group;                            // x's columns per scale: 32
constexpr int kLaneBytes = 4;                               // columns in one int32 lane
constexpr int kGroupSteps = kGroup / kLaneBytes;            // vpdpbusd steps per group: 8
constexpr int kHalves = kQuantizedRowTile / kLanes;         // registers of rows: 2
constexpr int kStepBytes = kQuantizedRowTile * kLaneBytes;  // panel bytes of one step: 128
constexpr int kGroupBytes = kGroupSteps * kStepBytes;       // panel bytes of one group
constexpr int kRegisterBytes = kLanes * kLaneBytes;         // 64
constexpr size_t kAlignment = 64;

// How the micro-kernel reads a type's levels (see the file comment).
struct LevelShape {
    int sub_cols;  // columns under one A (and B): 32, or 16 (Q6_K, Q3_K, Q2_K)
    bool has_min;  // w = A·u + B; else w = A·(u − offset)
    int offset;
};
constexpr LevelShape level_shape(DType dtype) {
    if (is_iq_level_type(dtype)) return {iq_shape(dtype).scale_cols, false, iq_shape(dtype).offset};
    switch (dtype) {
        case DType::Q6_K:
            return {kQ6SubBlock, false, kQ6KLevelOffset};
        case DType::Q3_K:
            return {kQ6SubBlock, false, kQ3KLevelOffset};
        case DType::Q2_K:
            return {kQ6SubBlock, true, 0};
        case DType::Q5_0:
            return {kGroup, false, 16};
        case DType::IQ4_XS:
        case DType::IQ4_NL:
        case DType::MXFP4:
            return {kGroup, false, kIq4Excess};
        default:  // Q4_K, Q5_K, Q4_1, Q5_1
            return {kGroup, true, 0};
    }
}

// One row tile unpacked: levels [groups][steps][32 rows][4 bytes], A and B (min types)
// [sub-blocks][32 rows].
struct Panel {
    uint8_t* levels;
    float* scales;
    float* mins;
};

// The 32-bit words at byte `offset` of each of 16 rows' blocks (rows `row_bytes` apart from
// `base`); 0 in the lanes outside `rows`.
struct RowWords {
    const uint8_t* base;
    __m512i row_offsets;
    __mmask16 rows;
    __m512i at(size_t offset) const {
        return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), rows, row_offsets, base + offset,
                                           1);
    }
};

__m512i bytes_of(uint32_t word) { return _mm512_set1_epi32(int(word)); }
__m512i shift_right(__m512i v, int bits) { return _mm512_srlv_epi32(v, _mm512_set1_epi32(bits)); }
__m512i shift_left(__m512i v, int bits) { return _mm512_sllv_epi32(v, _mm512_set1_epi32(bits)); }
__m512i low_nibbles(__m512i v) { return _mm512_and_si512(v, bytes_of(0x0f0f0f0f)); }
__m512i high_nibbles(__m512i v) { return low_nibbles(shift_right(v, 4)); }
// Byte i of each lane, 0..255.
__m512i byte_at(__m512i v, int i) {
    return _mm512_and_si512(shift_right(v, 8 * i), bytes_of(0xff));
}
// The f16 in the low (or high) half of each lane, as f32.
__m512 low_half(__m512i v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)); }
__m512 high_half(__m512i v) { return low_half(shift_right(v, 16)); }
__m512 to_float(__m512i v) { return _mm512_cvtepi32_ps(v); }
// Bits 0..3 of each lane as bit 4 of its bytes 0..3 (Q5_0/Q5_1's fifth bits of four weights).
__m512i fifth_bits(__m512i bits) {
    const __m512i one = _mm512_set1_epi32(1);
    __m512i spread = _mm512_setzero_si512();
    for (int i = 0; i < kLaneBytes; ++i)
        spread = _mm512_or_si512(
            spread, shift_left(_mm512_and_si512(shift_right(bits, i), one), 8 * i + 4));
    return spread;
}

// Writers of one half (16 rows) of a panel.
struct HalfPanel {
    const Panel& panel;
    int half;
    void levels(int group, int step, __m512i v) const {
        _mm512_store_si512(
            panel.levels + size_t(group) * kGroupBytes + step * kStepBytes + half * kRegisterBytes,
            v);
    }
    void scale(int sub_block, __m512 v) const {
        _mm512_store_ps(panel.scales + size_t(sub_block) * kQuantizedRowTile + half * kLanes, v);
    }
    void min(int sub_block, __m512 v) const {
        _mm512_store_ps(panel.mins + size_t(sub_block) * kQuantizedRowTile + half * kLanes, v);
    }
};

// Q4_K and Q5_K super-block b: 8 groups, A = d·sc_j, B = −dmin·m_j (k_scale_min, 16 rows at
// once); levels nibble (+ 16 × the qh bit for Q5_K).
template <bool kFifthBit>
void unpack_k(const HalfPanel& out, const RowWords& words, int b) {
    const size_t at = size_t(b) * (kFifthBit ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K));
    const __m512i head = words.at(at);
    const __m512i s0 = words.at(at + 4), s1 = words.at(at + 8), s2 = words.at(at + 12);
    const __m512 d = low_half(head),
                 minus_dmin = _mm512_sub_ps(_mm512_setzero_ps(), high_half(head));
    const __m512i six_bits = _mm512_set1_epi32(63), four_bits = _mm512_set1_epi32(15);
    constexpr int kSubBlocks = kSuperBlock / kSubBlock;
    for (int j = 0; j < kSubBlocks; ++j) {
        __m512i scale, min;
        if (j < 4) {
            scale = _mm512_and_si512(byte_at(s0, j), six_bits);
            min = _mm512_and_si512(byte_at(s1, j), six_bits);
        } else {
            const int i = j - 4;
            scale = _mm512_or_si512(_mm512_and_si512(byte_at(s2, i), four_bits),
                                    shift_left(shift_right(byte_at(s0, i), 6), 4));
            min = _mm512_or_si512(shift_right(byte_at(s2, i), 4),
                                  shift_left(shift_right(byte_at(s1, i), 6), 4));
        }
        out.scale(kSubBlocks * b + j, _mm512_mul_ps(d, to_float(scale)));
        out.min(kSubBlocks * b + j, _mm512_mul_ps(minus_dmin, to_float(min)));
    }
    const size_t qh_at = at + 16, qs_at = qh_at + (kFifthBit ? kSuperBlock / 8 : 0);
    const __m512i bit = bytes_of(0x01010101);
    for (int step = 0; step < kGroupSteps; ++step) {
        const __m512i high_bits = kFifthBit ? words.at(qh_at + kLaneBytes * step) : __m512i{};
        for (int chunk = 0; chunk < kSubBlocks / 2; ++chunk) {
            const __m512i q = words.at(qs_at + kSubBlock * chunk + kLaneBytes * step);
            __m512i low = low_nibbles(q), high = high_nibbles(q);
            if constexpr (kFifthBit) {
                low = _mm512_or_si512(
                    low, shift_left(_mm512_and_si512(shift_right(high_bits, 2 * chunk), bit), 4));
                high = _mm512_or_si512(
                    high,
                    shift_left(_mm512_and_si512(shift_right(high_bits, 2 * chunk + 1), bit), 4));
            }
            out.levels(kSubBlocks * b + 2 * chunk, step, low);
            out.levels(kSubBlocks * b + 2 * chunk + 1, step, high);
        }
    }
}

// Q6_K super-block b: 16 sub-blocks of 16, A = d·scales[i]; levels q (0..63), offset 32.
void unpack_q6_k(const HalfPanel& out, const RowWords& words, int b) {
    const size_t at = size_t(b) * sizeof(BlockQ6_K);
    const size_t ql_at = at + offsetof(BlockQ6_K, ql), qh_at = at + offsetof(BlockQ6_K, qh);
    const size_t scales_at = at + offsetof(BlockQ6_K, scales);
    // d is the block's last two bytes: read as the high half of the word ending there.
    const __m512 d = high_half(words.at(at + offsetof(BlockQ6_K, d) - 2));
    constexpr int kSubBlocks = kSuperBlock / kQ6SubBlock;
    for (int word = 0; word < kSubBlocks / kLaneBytes; ++word) {
        const __m512i scales = words.at(scales_at + kLaneBytes * word);
        for (int i = 0; i < kLaneBytes; ++i) {
            // int8 scale: byte i moved to the top, shifted back with its sign.
            const __m512i scale = _mm512_srai_epi32(shift_left(scales, 24 - 8 * i), 24);
            out.scale(kSubBlocks * b + kLaneBytes * word + i, _mm512_mul_ps(d, to_float(scale)));
        }
    }
    const __m512i two_bits = bytes_of(0x30303030);
    constexpr int kGroups = kSuperBlock / kGroup, kHalfGroups = kGroups / 2;
    for (int half = 0; half < 2; ++half)
        for (int step = 0; step < kGroupSteps; ++step) {
            const size_t l = kLaneBytes * step;
            const __m512i first = words.at(ql_at + 64 * half + l);
            const __m512i second = words.at(ql_at + 64 * half + 32 + l);
            const __m512i high = words.at(qh_at + 32 * half + l);
            const int group = kGroups * b + kHalfGroups * half;
            out.levels(group, step,
                       _mm512_or_si512(low_nibbles(first),
                                       _mm512_and_si512(shift_left(high, 4), two_bits)));
            out.levels(group + 1, step,
                       _mm512_or_si512(low_nibbles(second),
                                       _mm512_and_si512(shift_left(high, 2), two_bits)));
            out.levels(group + 2, step,
                       _mm512_or_si512(high_nibbles(first), _mm512_and_si512(high, two_bits)));
            out.levels(group + 3, step,
                       _mm512_or_si512(high_nibbles(second),
                                       _mm512_and_si512(shift_right(high, 2), two_bits)));
        }
}

// IQ4_XS super-block b: 8 groups, A = d·(ls − 32); levels kIq4Values + 128, offset 128.
void unpack_iq4_xs(const HalfPanel& out, const RowWords& words, int b) {
    const size_t at = size_t(b) * sizeof(BlockIQ4_XS);
    const __m512i head = words.at(at), scales_low = words.at(at + 4);
    const __m512 d = low_half(head);
    const __m512i scales_high = shift_right(head, 16);
    const __m512i table = iq4_unsigned_levels();
    constexpr int kGroups = kSuperBlock / kSubBlock, kHalfSteps = kGroupSteps / 2;
    for (int g = 0; g < kGroups; ++g) {
        const __m512i low = _mm512_and_si512(shift_right(byte_at(scales_low, g / 2), 4 * (g % 2)),
                                             _mm512_set1_epi32(15));
        const __m512i high =
            _mm512_and_si512(shift_right(scales_high, 2 * g), _mm512_set1_epi32(3));
        const __m512i ls = _mm512_or_si512(low, shift_left(high, 4));
        out.scale(kGroups * b + g,
                  _mm512_mul_ps(d, to_float(_mm512_sub_epi32(ls, _mm512_set1_epi32(32)))));
        for (int step = 0; step < kHalfSteps; ++step) {
            const __m512i q = words.at(at + 8 + 16 * g + kLaneBytes * step);
            out.levels(kGroups * b + g, step, _mm512_shuffle_epi8(table, low_nibbles(q)));
            out.levels(kGroups * b + g, step + kHalfSteps,
                       _mm512_shuffle_epi8(table, high_nibbles(q)));
        }
    }
}

// Q4_1, Q5_0 and Q5_1 block b (one group): A = d, B = m (Q4_1, Q5_1); levels the nibbles
// (+ 16 × the qh bit for the Q5 types).
template <typename Block, bool kHasMin, bool kFifthBit>
void unpack_small(const HalfPanel& out, const RowWords& words, int b) {
    const size_t at = size_t(b) * sizeof(Block);
    const __m512i head = words.at(at);
    out.scale(b, low_half(head));
    if constexpr (kHasMin) out.min(b, high_half(head));
    __m512i high_bits = _mm512_setzero_si512();
    size_t qs_at = at + (kHasMin ? 4 : 2);
    if constexpr (kFifthBit) {
        high_bits = words.at(qs_at);
        qs_at += 4;
    }
    constexpr int kHalfSteps = kGroupSteps / 2;
    for (int step = 0; step < kHalfSteps; ++step) {
        const __m512i q = words.at(qs_at + kLaneBytes * step);
        __m512i low = low_nibbles(q), high = high_nibbles(q);
        if constexpr (kFifthBit) {
            low = _mm512_or_si512(low, fifth_bits(shift_right(high_bits, kLaneBytes * step)));
            high = _mm512_or_si512(
                high, fifth_bits(shift_right(high_bits, kSmallBlock / 2 + kLaneBytes * step)));
        }
        out.levels(b, step, low);
        out.levels(b, step + kHalfSteps, high);
    }
}

// IQ4_NL block b (one group): A = d; levels kIq4Values + 128, offset 128.
void unpack_iq4_nl(const HalfPanel& out, const RowWords& words, int b) {
    const size_t at = size_t(b) * sizeof(BlockIQ4_NL);
    const __m512i table = iq4_unsigned_levels();
    // d, and the first two bytes of qs: the block is only 2-byte aligned, and d its first field.
    out.scale(b, low_half(words.at(at)));
    constexpr int kHalfSteps = kGroupSteps / 2;
    for (int step = 0; step < kHalfSteps; ++step) {
        const __m512i q = words.at(at + offsetof(BlockIQ4_NL, qs) + kLaneBytes * step);
        out.levels(b, step, _mm512_shuffle_epi8(table, low_nibbles(q)));
        out.levels(b, step + kHalfSteps, _mm512_shuffle_epi8(table, high_nibbles(q)));
    }
}

// MXFP4 block b (one group): A = 2^(e − 128); levels kMxfp4Values + 128, offset 128.
void unpack_mxfp4(const HalfPanel& out, const RowWords& words, int b) {
    const size_t at = size_t(b) * sizeof(BlockMXFP4);
    const __m512i table = unsigned_levels(kMxfp4Values);
    // e, and the first three bytes of qs: the block is only byte-aligned, e its first field.
    out.scale(b, mxfp4_scales(byte_at(words.at(at + offsetof(BlockMXFP4, e)), 0)));
    constexpr int kHalfSteps = kGroupSteps / 2;
    for (int step = 0; step < kHalfSteps; ++step) {
        const __m512i q = words.at(at + offsetof(BlockMXFP4, qs) + kLaneBytes * step);
        out.levels(b, step, _mm512_shuffle_epi8(table, low_nibbles(q)));
        out.levels(b, step + kHalfSteps, _mm512_shuffle_epi8(table, high_nibbles(q)));
    }
}

// Q4_K (kFifthBit false) or Q5_K super-block b of 16 rows from its tile (`block`,
// cpu/super_block_tiles.h), as unpack_k gives it from the rows: the scales and mins are a byte a
// row already, and each register of a chunk holds one step of two groups (sub-blocks 2c, 2c + 1
// in the low and high nibbles; Q5_K's levels as cpu/super_block_tiles.h lays them out).
template <bool kFifthBit>
void unpack_k_tile(const HalfPanel& out, const uint8_t* block, int b) {
    const __m512 d = _mm512_cvtph_ps(
        _mm256_load_si256(reinterpret_cast<const __m256i*>(block + kQ4KTileDOffset)));
    const __m512 minus_dmin = _mm512_sub_ps(
        _mm512_setzero_ps(), _mm512_cvtph_ps(_mm256_load_si256(
                                 reinterpret_cast<const __m256i*>(block + kQ4KTileDMinOffset))));
    for (int j = 0; j < kKSubBlocks; ++j) {
        const __m512i scale = _mm512_cvtepu8_epi32(_mm_load_si128(
            reinterpret_cast<const __m128i*>(block + kQ4KTileScalesOffset + kTileRows * j)));
        // Lane r: the mins of sub-blocks 2p and 2p + 1 of row r, a word each.
        const __m512i min_pair =
            _mm512_cvtepu8_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(
                block + kQ4KTileMinsOffset + 2 * kTileRows * (j / 2))));
        const __m512i min = j % 2 == 0 ? _mm512_and_si512(min_pair, _mm512_set1_epi32(0xffff))
                                       : shift_right(min_pair, 16);
        out.scale(kKSubBlocks * b + j, _mm512_mul_ps(d, to_float(scale)));
        out.min(kKSubBlocks * b + j, _mm512_mul_ps(minus_dmin, to_float(min)));
    }
    const __m512i two_bits = bytes_of(0x03030303);
    for (int c = 0; c < kQ4KChunks; ++c)
        for (int step = 0; step < kGroupSteps; ++step) {
            const __m512i q = _mm512_load_si512(block + k_tile_values_offset(kFifthBit) +
                                                c * kQ4KTileChunkBytes + step * kTileRegisterBytes);
            __m512i low, high;
            if constexpr (kFifthBit) {
                const __m512i top_bits =
                    _mm512_load_si512(block + kQ5KTileHighOffset + step * kTileRegisterBytes);
                low = _mm512_and_si512(q, bytes_of(0x1f1f1f1f));
                high = _mm512_or_si512(
                    _mm512_and_si512(shift_right(q, kQ5KLowBits), bytes_of(0x07070707)),
                    shift_left(_mm512_and_si512(shift_right(top_bits, 2 * c), two_bits),
                               kQ5KSecondLowBits));
            } else {
                low = low_nibbles(q);
                high = high_nibbles(q);
            }
            out.levels(kKSubBlocks * b + 2 * c, step, low);
            out.levels(kKSubBlocks * b + 2 * c + 1, step, high);
        }
}

// Q6_K or Q3_K super-block b of 16 rows from its tile (`block`, cpu/super_block_tiles.h), as
// unpack_q6_k gives Q6_K's from the rows: step s of a group is step s % 4 of sub-block 2g + s / 4.
template <DType kType>
void unpack_sixteen_column_tile(const HalfPanel& out, const uint8_t* block, int b) {
    static_assert(kQ6KTileDOffset == kQ3KTileDOffset &&
                  kQ6KTileScalesOffset == kQ3KTileScalesOffset && kQ6KSubBlocks == kQ3KSubBlocks);
    const __m512 d = _mm512_cvtph_ps(
        _mm256_load_si256(reinterpret_cast<const __m256i*>(block + kQ6KTileDOffset)));
    for (int i = 0; i < kQ6KSubBlocks; ++i) {
        const __m512i scale = _mm512_cvtepi8_epi32(_mm_load_si128(
            reinterpret_cast<const __m128i*>(block + kQ6KTileScalesOffset + kTileRows * i)));
        out.scale(kQ6KSubBlocks * b + i, _mm512_mul_ps(d, to_float(scale)));
        __m512i q[4];
        if constexpr (kType == DType::Q6_K)
            q6_k_tile_levels(block, i, q);
        else
            q3_k_tile_levels(block, i, q);
        const int group = (kQ6KSubBlocks * b + i) / 2, step = i % 2 * 4;
        for (int s = 0; s < 4; ++s) out.levels(group, step + s, q[s]);
    }
}

// Q2_K super-block b of 16 rows from its tile (`block`, cpu/super_block_tiles.h): 16 sub-blocks
// of 16, A = d·sc_i, B = −dmin·m_i; step s of a group is step s % 4 of sub-block 2g + s / 4.
void unpack_q2_k_tile(const HalfPanel& out, const uint8_t* block, int b) {
    const __m512 d = _mm512_cvtph_ps(
        _mm256_load_si256(reinterpret_cast<const __m256i*>(block + kQ2KTileDOffset)));
    const __m512 minus_dmin = _mm512_sub_ps(
        _mm512_setzero_ps(), _mm512_cvtph_ps(_mm256_load_si256(
                                 reinterpret_cast<const __m256i*>(block + kQ2KTileDMinOffset))));
    const __m512i four_bits = _mm512_set1_epi32(15);
    for (int i = 0; i < kQ2KSubBlocks; ++i) {
        // Lane r: the scales bytes of sub-blocks 2p and 2p + 1 of row r, a word each.
        const __m512i pair =
            _mm512_cvtepu8_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(
                block + kQ2KTileScalesOffset + 2 * kTileRows * (i / 2))));
        const __m512i packed = i % 2 == 0 ? pair : shift_right(pair, 16);
        const __m512i scale = _mm512_and_si512(packed, four_bits);
        const __m512i min = _mm512_and_si512(shift_right(packed, kQ2KMinShift), four_bits);
        out.scale(kQ2KSubBlocks * b + i, _mm512_mul_ps(d, to_float(scale)));
        out.min(kQ2KSubBlocks * b + i, _mm512_mul_ps(minus_dmin, to_float(min)));
        __m512i q[4];
        q2_k_tile_levels(block, i, q);
        const int group = (kQ2KSubBlocks * b + i) / 2, step = i % 2 * 4;
        for (int s = 0; s < 4; ++s) out.levels(group, step + s, q[s]);
    }
}

// IQ4_XS super-block b of 16 rows from its tile (`block`, cpu/super_block_tiles.h), as
// unpack_iq4_xs gives it from the rows: register k of sub-block j holds steps k (low nibbles)
// and k + 4 (high) of group j.
void unpack_iq4_xs_tile(const HalfPanel& out, const uint8_t* block, int b) {
    const __m512 d = _mm512_cvtph_ps(
        _mm256_load_si256(reinterpret_cast<const __m256i*>(block + kIq4XSTileDOffset)));
    const __m512i table = iq4_unsigned_levels();
    for (int j = 0; j < kIq4XSSubBlocks; ++j) {
        const __m512i scale = _mm512_cvtepi8_epi32(_mm_load_si128(
            reinterpret_cast<const __m128i*>(block + kIq4XSTileScalesOffset + kTileRows * j)));
        out.scale(kIq4XSSubBlocks * b + j, _mm512_mul_ps(d, to_float(scale)));
        for (int k = 0; k < kIq4XSSubBlockRegisters; ++k) {
            const __m512i q =
                _mm512_load_si512(block + kIq4XSTileValuesOffset + j * kIq4XSTileSubBlockBytes +
                                  k * kTileRegisterBytes);
            out.levels(kIq4XSSubBlocks * b + j, k, _mm512_shuffle_epi8(table, low_nibbles(q)));
            out.levels(kIq4XSSubBlocks * b + j, k + kIq4XSSubBlockRegisters,
                       _mm512_shuffle_epi8(table, high_nibbles(q)));
        }
    }
}

// The groups of an IQ4_NL or MXFP4 tile (`tile`, cpu/quantized_tiles.h; nullptr past the matrix:
// A = 0, levels 0), as unpack_iq4_nl and unpack_mxfp4 give them from the rows: register k of a
// group holds steps k (low nibbles) and k + 4 (high).
template <DType kType>
void unpack_lookup_tile(const HalfPanel& out, const uint8_t* tile, int groups) {
    const __m512i table = unsigned_levels(kType == DType::MXFP4 ? kMxfp4Values : kIq4Values);
    constexpr int kHalfSteps = kGroupSteps / 2;
    static_assert(tile_registers(kType) == kHalfSteps);
    for (int g = 0; g < groups; ++g) {
        out.scale(g, tile ? group_tile_scales<kType>(tile, g) : _mm512_setzero_ps());
        const uint8_t* values = tile ? tile_group_values(tile, kType, g) : nullptr;
        for (int k = 0; k < kHalfSteps; ++k) {
            const __m512i q =
                tile ? _mm512_load_si512(values + k * kTileRegisterBytes) : _mm512_setzero_si512();
            out.levels(g, k, _mm512_shuffle_epi8(table, low_nibbles(q)));
            out.levels(g, k + kHalfSteps, _mm512_shuffle_epi8(table, high_nibbles(q)));
        }
    }
}

// Super-block b of the i-quant or ternary rows of a half panel (`blocks`: each row's block, a block
// of zeros past the matrix, so A = 0): each row's registers of 64 levels (iq_levels_avx512.h), 16
// rows transposed so that register l holds step l % 8 of the register's group l / 8 for every row;
// and A = d · factor · m per sub-block of 16 or 32 columns, transposed the same way (the ternary
// types: A = d).
template <DType kType>
void unpack_iq_super_block(const HalfPanel& out, const uint8_t* const (&blocks)[kLanes], int b) {
    constexpr IqShape kShape = iq_shape(kType);
    constexpr int kGroupsPerRegister = 64 / kGroup;
    __m512 v[kLanes];
    for (int r = 0; r < kIqRegisters; ++r) {
#pragma GCC unroll 16
        for (int i = 0; i < kLanes; ++i) v[i] = _mm512_castsi512_ps(iq_levels<kType>(blocks[i], r));
        transpose16x16(v);
        const int group = kSuperBlock / kGroup * b + kGroupsPerRegister * r;
#pragma GCC unroll 16
        for (int l = 0; l < kLanes; ++l)
            out.levels(group + l / kGroupSteps, l % kGroupSteps, _mm512_castps_si512(v[l]));
    }
    alignas(64) float d[kLanes];
    constexpr int kSubBlocks = kSuperBlock / kShape.scale_cols;
    if constexpr (!has_multipliers(kType)) {  // the ternary types: A = d · factor throughout
#pragma GCC unroll 16
        for (int i = 0; i < kLanes; ++i) d[i] = iq_d(kType, blocks[i]) * kShape.factor;
        for (int j = 0; j < kSubBlocks; ++j) out.scale(kSubBlocks * b + j, _mm512_load_ps(d));
        return;
    }
#pragma GCC unroll 16
    for (int i = 0; i < kLanes; ++i) {
        d[i] = iq_d(kType, blocks[i]) * kShape.factor;
        v[i] = _mm512_cvtepi32_ps(iq_multiplier_lanes<kType>(blocks[i]));
    }
    transpose16x16(v);  // v[slot]: the slot's m of each row
    constexpr int kSlotsPerSubBlock = kShape.scale_cols / kIqMultiplierCols;
    for (int j = 0; j < kSubBlocks; ++j)
        out.scale(kSubBlocks * b + j, _mm512_mul_ps(_mm512_load_ps(d), v[kSlotsPerSubBlock * j]));
}

// The i-quant or ternary rows first..first + 15 of w into a half panel.
template <DType kType>
void unpack_iq_rows(const HalfPanel& out, const Matrix& w, int first) {
    alignas(64) static const uint8_t zeros[block_bytes(kType)] = {};
    const int blocks = w.cols / kSuperBlock;
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* row_blocks[kLanes];
        for (int i = 0; i < kLanes; ++i)
            row_blocks[i] =
                first + i < w.rows ? w.row_data(first + i) + size_t(b) * block_bytes(kType) : zeros;
        unpack_iq_super_block<kType>(out, row_blocks, b);
    }
}

// The panel of rows [tile_row, tile_row + 32) of w; rows past the matrix hold A = B = 0. Q4_K,
// Q5_K, Q6_K, IQ4_XS, IQ4_NL and MXFP4 are read from their tiles where they have them (the rows may
// then be out of memory), Q2_K and Q3_K always (the CPU backend makes them on every path that
// reaches here).
void unpack_tile(const Panel& panel, const Matrix& w, int tile_row) {
    const int blocks = w.cols / block_weights(w.dtype);
    const int row_bytes = int(w.row_bytes());
    const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int half = 0; half < kHalves; ++half) {
        const int first = tile_row + half * kLanes;
        const HalfPanel out{panel, half};
        if (is_iq_level_type(w.dtype)) {
            with_iq_type(w.dtype, [&](auto type) { unpack_iq_rows<type()>(out, w, first); });
            continue;
        }
        const uint8_t* tile = w.row_tiles && first < w.rows
                                  ? w.row_tiles + size_t(first / kTileRows) * tile_bytes(w)
                                  : nullptr;
        if (w.row_tiles && has_group_tiles(w.dtype)) {  // IQ4_NL, MXFP4
            (w.dtype == DType::MXFP4 ? unpack_lookup_tile<DType::MXFP4>
                                     : unpack_lookup_tile<DType::IQ4_NL>)(out, tile, blocks);
            continue;
        }
        if (w.row_tiles) {  // Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS
            const auto unpack_block =
                w.dtype == DType::Q2_K   ? unpack_q2_k_tile
                : w.dtype == DType::Q3_K ? unpack_sixteen_column_tile<DType::Q3_K>
                : w.dtype == DType::Q4_K ? unpack_k_tile<false>
                : w.dtype == DType::Q5_K ? unpack_k_tile<true>
                : w.dtype == DType::Q6_K ? unpack_sixteen_column_tile<DType::Q6_K>
                                         : unpack_iq4_xs_tile;
            const int block_bytes = super_block_tile_bytes(w.dtype);
            alignas(64) static const uint8_t zeros[kLargestTileBlockBytes] = {};  // past the matrix
            for (int b = 0; b < blocks; ++b)
                unpack_block(out, tile ? tile + size_t(b) * block_bytes : zeros, b);
            continue;
        }
        const RowWords words{
            w.row_data(tile_row),
            _mm512_mullo_epi32(_mm512_add_epi32(lanes, _mm512_set1_epi32(half * kLanes)),
                               _mm512_set1_epi32(row_bytes)),
            first_lanes(std::max(0, w.rows - first))};
        for (int b = 0; b < blocks; ++b) switch (w.dtype) {
                case DType::Q4_K:
                    unpack_k<false>(out, words, b);
                    break;
                case DType::Q5_K:
                    unpack_k<true>(out, words, b);
                    break;
                case DType::Q6_K:
                    unpack_q6_k(out, words, b);
                    break;
                case DType::IQ4_XS:
                    unpack_iq4_xs(out, words, b);
                    break;
                case DType::Q4_1:
                    unpack_small<BlockQ4_1, true, false>(out, words, b);
                    break;
                case DType::Q5_0:
                    unpack_small<BlockQ5_0, false, true>(out, words, b);
                    break;
                case DType::Q5_1:
                    unpack_small<BlockQ5_1, true, true>(out, words, b);
                    break;
                case DType::IQ4_NL:
                    unpack_iq4_nl(out, words, b);
                    break;
                case DType::MXFP4:
                    unpack_mxfp4(out, words, b);
                    break;
                default:
                    break;
            }
    }
}

// out[first_token + k][row] for TOKENS tokens and the tile's 32 rows (store_masks[h]: those
// of rows 16h..16h+15 to store); out has `stride` floats a token.
//
// Register tile: TOKENS ≤ kQuantizedTokenTile = 6 tokens × 32 rows: 12 int32 dot registers
// and 12 f32 sums, the step's two level registers and one broadcast of x (27 of 32). Per
// sub-block: its steps (two loads, 6 broadcasts, 12 vpdpbusd each), then each dot converted
// and added to the sums times A × x's scale; min types then add B × x's scale × x's sum over
// the sub-block.
template <int TOKENS, int kSubCols, bool kHasMin>
void block_tile_kernel(float* out, int stride, const __mmask16 store_masks[kHalves],
                       const Panel& panel, const QuantizedBatch& x, int first_token, int offset) {
    constexpr int kSubs = kGroup / kSubCols, kSubSteps = kSubCols / kLaneBytes;
    const int8_t* values[TOKENS];
    const float* x_scales[TOKENS];
    const int32_t* half_sums[TOKENS];
#pragma GCC unroll 8
    for (int k = 0; k < TOKENS; ++k) {
        values[k] = x.values.data() + size_t(first_token + k) * x.padded_cols;
        x_scales[k] = x.scales.data() + size_t(first_token + k) * x.groups;
        half_sums[k] = x.half_sums.data() + size_t(first_token + k) * x.groups * 2;
    }
    __m512 sums[TOKENS][kHalves];
#pragma GCC unroll 8
    for (int k = 0; k < TOKENS; ++k)
#pragma GCC unroll 8
        for (int h = 0; h < kHalves; ++h) sums[k][h] = _mm512_setzero_ps();
    for (int g = 0; g < x.groups; ++g) {
        const uint8_t* group_levels = panel.levels + size_t(g) * kGroupBytes;
#pragma GCC unroll 2
        for (int sub = 0; sub < kSubs; ++sub) {
            __m512i dots[TOKENS][kHalves];
#pragma GCC unroll 8
            for (int k = 0; k < TOKENS; ++k) {
                const int start =
                    kHasMin ? 0 : sub_block_start(half_sums[k] + 2 * g, sub, kSubs, offset);
#pragma GCC unroll 8
                for (int h = 0; h < kHalves; ++h) dots[k][h] = _mm512_set1_epi32(start);
            }
#pragma GCC unroll 8
            for (int s = sub * kSubSteps; s < (sub + 1) * kSubSteps; ++s) {
                __m512i levels[kHalves];
#pragma GCC unroll 8
                for (int h = 0; h < kHalves; ++h)
                    levels[h] =
                        _mm512_load_si512(group_levels + s * kStepBytes + h * kRegisterBytes);
#pragma GCC unroll 8
                for (int k = 0; k < TOKENS; ++k) {
                    const __m512i x_word = broadcast_word(values[k] + g * kGroup + s * kLaneBytes);
#pragma GCC unroll 8
                    for (int h = 0; h < kHalves; ++h)
                        dots[k][h] = _mm512_dpbusd_epi32(dots[k][h], levels[h], x_word);
                }
            }
            const float* scales = panel.scales + size_t(g * kSubs + sub) * kQuantizedRowTile;
            __m512 row_scales[kHalves];
#pragma GCC unroll 8
            for (int h = 0; h < kHalves; ++h) row_scales[h] = _mm512_load_ps(scales + h * kLanes);
#pragma GCC unroll 8
            for (int k = 0; k < TOKENS; ++k) {
                const __m512 x_scale = _mm512_set1_ps(x_scales[k][g]);
#pragma GCC unroll 8
                for (int h = 0; h < kHalves; ++h)
                    sums[k][h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[k][h]),
                                                 _mm512_mul_ps(row_scales[h], x_scale), sums[k][h]);
            }
            if constexpr (kHasMin) {
                const float* mins = panel.mins + size_t(g * kSubs + sub) * kQuantizedRowTile;
                __m512 row_mins[kHalves];
#pragma GCC unroll 8
                for (int h = 0; h < kHalves; ++h) row_mins[h] = _mm512_load_ps(mins + h * kLanes);
#pragma GCC unroll 8
                for (int k = 0; k < TOKENS; ++k) {
                    // x's sum over the sub-block: the group's two sums of 16, or one of them.
                    const int32_t* sums16 = half_sums[k] + 2 * g;
                    const int x_sum_int = kSubs == 1 ? sums16[0] + sums16[1] : sums16[sub];
                    const __m512 x_sum = _mm512_set1_ps(x_scales[k][g] * float(x_sum_int));
#pragma GCC unroll 8
                    for (int h = 0; h < kHalves; ++h)
                        sums[k][h] = _mm512_fmadd_ps(row_mins[h], x_sum, sums[k][h]);
                }
            }
        }
    }
#pragma GCC unroll 8
    for (int k = 0; k < TOKENS; ++k)
#pragma GCC unroll 8
        for (int h = 0; h < kHalves; ++h)
            _mm512_mask_storeu_ps(out + size_t(first_token + k) * stride + h * kLanes,
                                  store_masks[h], sums[k][h]);
}

using BlockTileKernel = void (*)(float*, int, const __mmask16*, const Panel&, const QuantizedBatch&,
                                 int, int);
template <int kSubCols, bool kHasMin>
constexpr BlockTileKernel kKernels[kQuantizedTokenTile] = {
    block_tile_kernel<1, kSubCols, kHasMin>, block_tile_kernel<2, kSubCols, kHasMin>,
    block_tile_kernel<3, kSubCols, kHasMin>, block_tile_kernel<4, kSubCols, kHasMin>,
    block_tile_kernel<5, kSubCols, kHasMin>, block_tile_kernel<6, kSubCols, kHasMin>};

const BlockTileKernel* kernels_for(const LevelShape& shape) {
    if (shape.sub_cols == kQ6SubBlock)
        return shape.has_min ? kKernels<kQ6SubBlock, true> : kKernels<kQ6SubBlock, false>;
    return shape.has_min ? kKernels<kGroup, true> : kKernels<kGroup, false>;
}

}  // namespace

void gemm_rows_blocks(float* out, const Matrix& w, const QuantizedBatch& x, int first_row,
                      int row_count) {
    const LevelShape shape = level_shape(w.dtype);
    const BlockTileKernel* kernels = kernels_for(shape);
    const int sub_blocks = w.cols / shape.sub_cols;
    // One tile's panel, 64-byte aligned, kept from call to call.
    static thread_local std::vector<uint8_t> level_storage;
    static thread_local std::vector<float> scale_storage, min_storage;
    level_storage.resize(size_t(x.groups) * kGroupBytes + kAlignment);
    scale_storage.resize(size_t(sub_blocks) * kQuantizedRowTile + kAlignment / sizeof(float));
    min_storage.resize(size_t(sub_blocks) * kQuantizedRowTile + kAlignment / sizeof(float));
    const Panel panel{align64(level_storage.data()), align64(scale_storage.data()),
                      align64(min_storage.data())};
    const int end_row = first_row + row_count;
    // Panels of whole tiles; one the run shares with another thread's is unpacked by both,
    // each storing its own rows.
    for (int tile_row = first_row / kQuantizedRowTile * kQuantizedRowTile; tile_row < end_row;
         tile_row += kQuantizedRowTile) {
        unpack_tile(panel, w, tile_row);
        const __mmask16 store_masks[kHalves] = {lanes_in(tile_row, first_row, end_row),
                                                lanes_in(tile_row + kLanes, first_row, end_row)};
        for (int token = 0; token < x.batch; token += kQuantizedTokenTile)
            kernels[std::min(kQuantizedTokenTile, x.batch - token) - 1](
                out + tile_row, w.rows, store_masks, panel, x, token, shape.offset);
    }
}

}  // namespace barellm::cpu::avx512
