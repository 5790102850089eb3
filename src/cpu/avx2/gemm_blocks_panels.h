// The prefill GEMM for the block types (weight_blocks.h: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS,
// Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, the i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S,
// IQ1_M and the ternary types TQ1_0, TQ2_0) on 256-bit registers: out[token][row] = Σ_col
// W[row][col] · x[token][col], x in int8 with a scale per group of 32 columns (QuantizedBatch:
// quantized per 32 by avx2::quantize_token, or per 256 as Q8_K for the super-block types and the
// i-quants), each sub-block an exact int32 dot product. Two builds share it, each computing that
// dot in its own instructions (BlockDot):
// - gemm_blocks_avx2.cpp, plain AVX2: vpmaddubsw and vpmaddwd;
// - gemm_blocks_avxvnni.cpp, AVX2 + AVX-VNNI: the 256-bit vpdpbusd, four u8 × s8 products added
//   straight into int32, one instruction a step where vpmaddubsw takes two to four.
// The arithmetic is that of the AVX-512 VNNI GEMM (gemm_blocks_avx512vnni.cpp): per sub-block s
// of a row, w = A_s · u + B, and
// - "min" types (Q4_K, Q5_K: A = d·sc, B = −dmin·m; Q4_1, Q5_1: A = d, B = m; Q2_K: A = d·sc,
//   B = −dmin·m, sub-blocks of 16): the sub-block's sum is A · sx · Σ u·q + B · sx · Σ q, the
//   second term from x's sums of 16;
// - "offset" types (Q5_0: offset 16; Q6_K: offset 32, Q3_K: offset 4, sub-blocks of 16; the
//   i-quants, cpu/iq_levels.h: their offset, A = d · factor · m per sub-block of 16 or 32; the
//   ternary types: offset 1, A = d): the int32 dot starts from −offset · Σ q, so it is
//   Σ (u − offset)·q exactly, then scaled by A · sx;
// - IQ4_XS and IQ4_NL keep their signed values (−127..113), MXFP4 its (−12..12): vpmaddubsw
//   multiplies |value| by x with the value's sign; for vpdpbusd the panel holds value + 128 (the
//   lookup table's sign bits flipped) as unsigned, an offset type of offset 128.
// Both builds give the same int32 dots and add them to the same f32 sums in the same order:
// the same bits.
//
// vpmaddubsw adds two u8 × s8 products into a saturating int16; |q| ≤ 127, so a pair is at
// most 2 · 127 · (largest level): 3810 for 4-bit levels, 7874 for 5-bit, 16002 for Q6_K's
// 6-bit, 32258 for IQ4_XS's magnitudes and the i-quants' levels (up to 127). The pairs of
// kWidenSteps steps (4 columns each) add up in int16 below 32767 (8 steps for 4 bits, 4 for 5, 2
// for 6, 1 for IQ4_XS and the i-quants, 8 for the ternary types' levels up to 3) before vpmaddwd
// widens them to int32.
//
// The layout: per tile of kBlockRowTile (32) rows, each row's blocks are unpacked once
// (block_levels_avx2.h and iq_levels_avx2.h, the matvecs' unpacking) to 32 levels a group and f32
// A and B; 8 rows'
// groups then go through an 8 × 8 transpose of 32-bit words into a panel laid out for the
// micro-kernel: per group, per step of four columns, the four levels of each row side by
// side, 8 rows a register. Q4_K, Q5_K, Q6_K, IQ4_XS, IQ4_NL and MXFP4 come from their tiles of 16
// rows where they have them (cpu/super_block_tiles.h, cpu/quantized_tiles.h: the decode matvec's),
// already in that order: no transposes, and the rows stay out of memory; Q2_K and Q3_K only from
// their tiles. The micro-kernel (block_tile_kernel) meets kDepthGroups groups of the panel (16 KB,
// in L1) with every token before the next groups, its f32 sums kept per tile and token between the
// calls.
//
// Included by those two files alone (the SIMDe build of the second in the unit tests too, on
// SIMDe's intrinsics: intrinsics_avx2.h): everything here has internal linkage, each file
// compiling it for its own instructions.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

#include "cpu/avx2/avx2.h"
#include "cpu/avx2/block_levels_avx2.h"
#include "cpu/avx2/helpers_avx2.h"
#include "cpu/avx2/intrinsics_avx2.h"
#include "cpu/avx2/iq_levels_avx2.h"
#include "cpu/block_sub_blocks.h"
#include "cpu/iq_levels.h"
#include "cpu/kquant_scales.h"
#include "cpu/panel_prefetcher.h"
#include "cpu/super_block_tiles.h"
#include "weights/weight_blocks.h"

namespace barellm::cpu::avx2 {

namespace {

constexpr int kGroup = kQ8Group;                        // x's columns per scale: 32
constexpr int kLaneBytes = 4;                           // columns in one int32 lane
constexpr int kGroupSteps = kGroup / kLaneBytes;        // steps per group: 8
constexpr int kRowRegisters = kBlockRowTile / kLanes;   // registers of rows in a tile: 4
constexpr int kRegisterBytes = kLanes * kLaneBytes;     // 32
constexpr int kStepBytes = kBlockRowTile * kLaneBytes;  // panel bytes of one step: 128
constexpr int kGroupBytes = kGroupSteps * kStepBytes;   // panel bytes of one group: 1024
constexpr int kSpanGroups = kSuperBlock / kGroup;       // groups a row unpacks at once: 8
constexpr int kDepthGroups = 16;                        // groups per micro-kernel call
constexpr int kKernelRegisters = 2;                     // row registers per call: 16 rows
constexpr int kBlockTokenTile = 3;                      // tokens per micro-kernel call
constexpr int kInt16Largest = 32767;
// IQ4_XS on vpdpbusd: a value v held in the panel as the unsigned v + 128 (its sign bit flipped).
constexpr int kSignFlip = 128;

// How a build computes a sub-block's int32 dot (see the file comment).
enum class BlockDot { Maddubs, Vnni };

// A vpshufb table of 16 signed values (iq4_table(), mxfp4_table()) as the panel holds them:
// signed for vpmaddubsw, each plus 128 (its sign bit flipped) for vpdpbusd.
template <BlockDot kDot>
__m256i panel_table(__m256i table) {
    if constexpr (kDot == BlockDot::Vnni)
        return _mm256_xor_si256(table, _mm256_set1_epi8(char(kSignFlip)));
    return table;
}
template <BlockDot kDot>
__m256i iq4_panel_table() {
    return panel_table<kDot>(iq4_table());
}

// How the micro-kernel reads a type's levels (see the file comment).
struct LevelShape {
    int sub_cols;       // columns under one A (and B): 32, or 16 (Q6_K, Q3_K, Q2_K)
    bool has_min;       // w = A·u + B; else w = A·(u − offset)
    bool is_signed;     // IQ4_XS, IQ4_NL, MXFP4: signed values, offset 0
    int offset;         // (offset types) u stands for u − offset
    int largest_level;  // of u (of |value| for the signed types)
};
constexpr LevelShape level_shape(DType dtype) {
    switch (dtype) {
        case DType::Q4_K:
        case DType::Q4_1:
            return {kGroup, true, false, 0, 15};
        case DType::Q5_K:
        case DType::Q5_1:
            return {kGroup, true, false, 0, 31};
        case DType::Q5_0:
            return {kGroup, false, false, kQ5Offset, 31};
        case DType::Q6_K:
            return {kQ6SubBlock, false, false, kQ6KLevelOffset, 63};
        case DType::Q3_K:
            return {kQ6SubBlock, false, false, kQ3KLevelOffset, 7};
        case DType::Q2_K:
            return {kQ6SubBlock, true, false, 0, 3};
        case DType::IQ4_XS:
        case DType::IQ4_NL:
            return {kGroup, false, true, 0, 127};
        case DType::MXFP4:
            return {kGroup, false, true, 0, kMxfp4LargestLevel};
        case DType::TQ1_0:
        case DType::TQ2_0:  // levels 0..2 (TQ2_0's bit pairs 0..3), A = d a super-block
            return {kGroup, false, false, kTernaryOffset, 3};
        default:  // the i-quants: levels 0..127, one A per 16 or 32 columns
            return {iq_shape(dtype).scale_cols, false, false, iq_shape(dtype).offset, 127};
    }
}

// Steps whose int16 pairs add up without reaching 32767 (a divisor of the sub-block's steps).
constexpr int widen_steps(const LevelShape& shape) {
    const int sub_steps = shape.sub_cols / kLaneBytes;
    int steps = kInt16Largest / (2 * shape.largest_level * kQ8Largest);  // a pair a step
    steps = std::min(steps, sub_steps);
    while (sub_steps % steps != 0) --steps;
    return steps;
}
static_assert(
    widen_steps(level_shape(DType::Q4_K)) == 8 && widen_steps(level_shape(DType::Q5_0)) == 4 &&
    widen_steps(level_shape(DType::Q6_K)) == 2 && widen_steps(level_shape(DType::IQ4_XS)) == 1 &&
    widen_steps(level_shape(DType::MXFP4)) == 8 && widen_steps(level_shape(DType::IQ2_XXS)) == 1 &&
    widen_steps(level_shape(DType::IQ2_XS)) == 1 && widen_steps(level_shape(DType::TQ2_0)) == 8);

// One row tile unpacked, 32-byte aligned: levels [groups][steps][32 rows][4 bytes], A and B
// (min types) [sub-blocks][32 rows].
struct Panel {
    uint8_t* levels;
    float* scales;
    float* mins;
};

// Where one row's span of kSpanGroups groups goes: its levels and its A and B to staging
// areas that unpack_tile transposes into the panel.
struct RowSpan {
    uint8_t* levels;  // [group][kLanes rows][32]: group g at levels + g · kLanes · kGroup
    float* scales;    // A of the row's sub-blocks: [2 registers][kLanes rows][8]
    float* mins;      // B of the row's groups: [kLanes rows][8]
    void level(int g, __m256i v) const {
        _mm256_store_si256(reinterpret_cast<__m256i*>(levels + g * kLanes * kGroup), v);
    }
    // A of sub-blocks 8·r .. 8·r + 7; B of groups 0..7.
    void scales8(int r, __m256 a) const { _mm256_store_ps(scales + r * kLanes * kLanes, a); }
    void mins8(__m256 b) const { _mm256_store_ps(mins, b); }
};

// Eight unsigned bytes of `bytes` as f32 times `factor`.
inline __m256 bytes_times(uint64_t bytes, float factor) {
    return _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(bytes)))),
        _mm256_set1_ps(factor));
}

// Q4_K and Q5_K: 8 groups, A = d·sc_j, B = −dmin·m_j.
template <bool kFifthBit>
void unpack_k(const RowSpan& out, const uint8_t* block) {
    const KScalesMins unpacked = unpack_k_scales_mins(block + kKScalesOffset);
    out.scales8(0, bytes_times(unpacked.scales, f16_at(block)));
    out.mins8(bytes_times(unpacked.mins, -f16_at(block + 2)));
    const __m256i high_bits = kFifthBit ? load256(block + kQ5KHighOffset) : __m256i{};
    for (int chunk = 0; chunk < kSpanGroups / 2; ++chunk) {
        __m256i low, high;
        k_chunk_levels<kFifthBit>(block, high_bits, chunk, &low, &high);
        out.level(2 * chunk, low);
        out.level(2 * chunk + 1, high);
    }
}

// Q6_K: 16 sub-blocks of 16, A = d·scales[i]; levels 0..63, offset 32.
void unpack_q6_k(const RowSpan& out, const uint8_t* block) {
    const __m256 d = _mm256_set1_ps(f16_at(block + kQ6DOffset));
    for (int r = 0; r < 2; ++r) {
        const __m128i scales =
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + kQ6ScalesOffset + 8 * r));
        out.scales8(r, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(scales))));
    }
    for (int half = 0; half < 2; ++half)
        for (int t = 0; t < kSpanGroups / 2; ++t)
            out.level(kSpanGroups / 2 * half + t, q6_k_levels(block, half, t));
}

// IQ4_XS: 8 groups, A = d·(ls_j − 32); the signed values kIq4Values[q].
template <BlockDot kDot>
void unpack_iq4_xs(const RowSpan& out, const uint8_t* block) {
    alignas(32) float scales[kSpanGroups];
    for (int j = 0; j < kSpanGroups; ++j) scales[j] = float(iq4_xs_scale(block, j));
    out.scales8(0, _mm256_mul_ps(_mm256_load_ps(scales), _mm256_set1_ps(f16_at(block))));
    const __m256i table = iq4_panel_table<kDot>();
    for (int j = 0; j < kSpanGroups; ++j) out.level(j, iq4_xs_values(block, j, table));
}

// An i-quant or ternary super-block: A = d · factor · m of each sub-block of 16 or 32
// (cpu/iq_levels.h), m from iq_multiplier_words; the unsigned levels u (iq_levels_avx2.h).
template <DType kType>
void unpack_iq(const RowSpan& out, const uint8_t* block) {
    constexpr IqShape kShape = iq_shape(kType);
    const __m256i m = iq_multiplier_words<kType>(block);  // m of each 16 columns
    const __m256 d_factor = _mm256_set1_ps(iq_d(kType, block) * kShape.factor);
    if constexpr (!has_multipliers(kType)) {  // the ternary types: A = d · factor
        out.scales8(0, d_factor);
    } else if constexpr (kShape.scale_cols == kIqMultiplierCols) {
        for (int r = 0; r < 2; ++r) {
            const __m128i half =
                r == 0 ? _mm256_castsi256_si128(m) : _mm256_extracti128_si256(m, 1);
            out.scales8(r,
                        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(half)), d_factor));
        }
    } else {  // sub-blocks of 32: the low word of each 32-bit lane (each m twice in the words)
        const __m256i sub_block_m = _mm256_and_si256(m, _mm256_set1_epi32(0xffff));
        out.scales8(0, _mm256_mul_ps(_mm256_cvtepi32_ps(sub_block_m), d_factor));
    }
    for (int r = 0; r < kIqRegisters; ++r) out.level(r, iq_levels<kType>(block, r));
}

// `blocks` (≤ 8) Q4_1, Q5_0 or Q5_1 blocks, a group each: A = d, B = m (Q4_1, Q5_1).
template <DType kType>
void unpack_small(const RowSpan& out, const uint8_t* first_block, int blocks) {
    constexpr size_t kBytes = kType == DType::Q4_1   ? sizeof(BlockQ4_1)
                              : kType == DType::Q5_0 ? sizeof(BlockQ5_0)
                                                     : sizeof(BlockQ5_1);
    alignas(16) uint16_t d[kSpanGroups] = {}, m[kSpanGroups] = {};
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = first_block + b * kBytes;
        std::memcpy(&d[b], block, sizeof d[b]);
        if constexpr (kType != DType::Q5_0) std::memcpy(&m[b], block + 2, sizeof m[b]);
        out.level(b, small_block_levels<kType>(block));
    }
    out.scales8(0, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(d))));
    out.mins8(_mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(m))));
}

// `blocks` (≤ 8) IQ4_NL blocks, a group each: A = d; the signed values kIq4Values[q].
template <BlockDot kDot>
void unpack_iq4_nl(const RowSpan& out, const uint8_t* first_block, int blocks) {
    alignas(16) uint16_t d[kSpanGroups] = {};
    const __m256i table = iq4_panel_table<kDot>();
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = first_block + b * sizeof(BlockIQ4_NL);
        std::memcpy(&d[b], block, sizeof d[b]);
        out.level(b, _mm256_shuffle_epi8(table, nibbles(block + offsetof(BlockIQ4_NL, qs))));
    }
    out.scales8(0, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(d))));
}

// `blocks` (≤ 8) MXFP4 blocks, a group each: A = 2^(e − 128); the signed values
// kMxfp4Values[q].
template <BlockDot kDot>
void unpack_mxfp4(const RowSpan& out, const uint8_t* first_block, int blocks) {
    alignas(32) float scales[kSpanGroups] = {};
    const __m256i table = panel_table<kDot>(mxfp4_table());
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = first_block + b * sizeof(BlockMXFP4);
        scales[b] = mxfp4_scale(block[offsetof(BlockMXFP4, e)]);
        out.level(b, _mm256_shuffle_epi8(table, nibbles(block + offsetof(BlockMXFP4, qs))));
    }
    out.scales8(0, _mm256_load_ps(scales));
}

// `groups` (≤ kSpanGroups) groups of one row from `block` (a whole super-block for the K
// types and IQ4_XS).
template <DType kType, BlockDot kDot>
void unpack_row_span(const RowSpan& out, const uint8_t* block, int groups) {
    if constexpr (kType == DType::Q4_K) unpack_k<false>(out, block);
    if constexpr (kType == DType::Q5_K) unpack_k<true>(out, block);
    if constexpr (kType == DType::Q6_K) unpack_q6_k(out, block);
    if constexpr (kType == DType::IQ4_XS) unpack_iq4_xs<kDot>(out, block);
    if constexpr (kType == DType::Q4_1 || kType == DType::Q5_0 || kType == DType::Q5_1)
        unpack_small<kType>(out, block, groups);
    if constexpr (kType == DType::IQ4_NL) unpack_iq4_nl<kDot>(out, block, groups);
    if constexpr (kType == DType::MXFP4) unpack_mxfp4<kDot>(out, block, groups);
    if constexpr (kType == DType::IQ2_XXS || kType == DType::IQ2_XS || kType == DType::IQ2_S ||
                  kType == DType::IQ3_XXS || kType == DType::IQ3_S || kType == DType::IQ1_S ||
                  kType == DType::IQ1_M || kType == DType::TQ1_0 || kType == DType::TQ2_0)
        unpack_iq<kType>(out, block);
}

// Transposes 8 rows of 8 words at `rows` (`row_stride` words apart) and stores the first
// `count` of the results (word j of every row) at `out`, `out_stride` words apart.
template <typename Word>
void transpose_words(Word* out, size_t out_stride, const Word* rows, size_t row_stride, int count) {
    __m256 words[kLanes];
    for (int i = 0; i < kLanes; ++i)
        words[i] = _mm256_load_ps(reinterpret_cast<const float*>(rows + i * row_stride));
    transpose8x8(words);
    for (int j = 0; j < count; ++j)
        _mm256_store_ps(reinterpret_cast<float*>(out + j * out_stride), words[j]);
}

// The panel of rows [tile_row, tile_row + 32) of w; rows past the matrix hold levels 0 and
// A = B = 0.
template <DType kType, BlockDot kDot>
void unpack_tile_typed(const Panel& panel, const Matrix& w, int tile_row) {
    constexpr LevelShape kShape = level_shape(kType);
    constexpr int kSubs = kGroup / kShape.sub_cols;  // sub-blocks a group
    const int groups = w.cols / kGroup;
    // Bytes of a span's blocks: one super-block, or kSpanGroups small blocks.
    const size_t span_bytes = block_bytes(kType) * (kSpanGroups * kGroup / block_weights(kType));
    alignas(32) uint8_t levels[kSpanGroups][kLanes][kGroup];
    alignas(32) float scales[kSubs][kLanes][kLanes], mins[kLanes][kLanes];
    for (int rb = 0; rb < kRowRegisters; ++rb)
        for (int span = 0; span < groups; span += kSpanGroups) {
            const int span_groups = std::min(kSpanGroups, groups - span);
            for (int i = 0; i < kLanes; ++i) {
                const RowSpan out{&levels[0][i][0], &scales[0][i][0], &mins[i][0]};
                const int r = tile_row + rb * kLanes + i;
                if (r < w.rows) {
                    unpack_row_span<kType, kDot>(
                        out, w.row_data(r) + span / kSpanGroups * span_bytes, span_groups);
                    continue;
                }
                for (int g = 0; g < span_groups; ++g) out.level(g, _mm256_setzero_si256());
                for (int s = 0; s < kSubs; ++s) out.scales8(s, _mm256_setzero_ps());
                out.mins8(_mm256_setzero_ps());
            }
            // Word s of row i's group g is its step s: the 8 × 8 transpose puts it in lane i
            // of the panel's register of step s.
            for (int g = 0; g < span_groups; ++g)
                transpose_words(panel.levels + size_t(span + g) * kGroupBytes + rb * kRegisterBytes,
                                kStepBytes, &levels[g][0][0], kGroup, kGroupSteps);
            for (int s = 0; s < kSubs; ++s)
                transpose_words(panel.scales + (size_t(span) * kSubs + kLanes * s) * kBlockRowTile +
                                    rb * kLanes,
                                kBlockRowTile, &scales[s][0][0], kLanes,
                                std::min(kLanes, span_groups * kSubs - kLanes * s));
            if constexpr (kShape.has_min)
                transpose_words(panel.mins + size_t(span) * kBlockRowTile + rb * kLanes,
                                kBlockRowTile, &mins[0][0], kLanes, span_groups);
        }
}

// The 16 rows of one Q2_K, Q3_K, Q4_K, Q5_K, Q6_K or IQ4_XS tile (cpu/super_block_tiles.h) into
// row registers first_register and first_register + 1 of the panel, with no transposes: a half of a
// tile's register is already a step of 8 rows. The same levels, A and B as from the rows, bit for
// bit. No tile (past the matrix): levels 0, A = B = 0.
template <BlockDot kDot>
void unpack_from_tile(const Panel& panel, const Matrix& w, const uint8_t* tile,
                      int first_register) {
    alignas(64) static const uint8_t zeros[kLargestTileBlockBytes] = {};
    const int blocks = w.cols / kSuperBlock;
    const int block_bytes = super_block_tile_bytes(w.dtype);
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = tile ? tile + size_t(b) * block_bytes : zeros;
        for (int h = 0; h < kTileHalves; ++h) {
            const int reg = first_register + h;
            // Where group g's step s and sub-block i's A, B of this register go.
            auto levels_at = [&](int g, int s) {
                return reinterpret_cast<__m256i*>(panel.levels + size_t(g) * kGroupBytes +
                                                  s * kStepBytes + reg * kRegisterBytes);
            };
            auto scales_at = [&](int i) {
                return panel.scales + size_t(i) * kBlockRowTile + reg * kLanes;
            };
            auto widened = [](const uint8_t* p, bool is_signed) {  // 8 bytes as f32
                const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
                return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(bytes)
                                                    : _mm256_cvtepu8_epi32(bytes));
            };
            if (w.dtype == DType::Q4_K || w.dtype == DType::Q5_K) {
                const int first_group = b * kSpanGroups;
                const __m256 d = tile_halves(block + kQ4KTileDOffset + 2 * kTileHalfRows * h);
                const __m256 minus_dmin =
                    _mm256_sub_ps(_mm256_setzero_ps(),
                                  tile_halves(block + kQ4KTileDMinOffset + 2 * kTileHalfRows * h));
                for (int c = 0; c < kQ4KChunks; ++c)
                    for (int k = 0; k < kQ4KChunkRegisters; ++k) {
                        __m256i low, high;
                        (w.dtype == DType::Q5_K
                             ? k_tile_levels<true>
                             : k_tile_levels<false>)(block, c, k, h, &low, &high);
                        _mm256_store_si256(levels_at(first_group + 2 * c, k), low);
                        _mm256_store_si256(levels_at(first_group + 2 * c + 1, k), high);
                    }
                for (int j = 0; j < kKSubBlocks; ++j) {
                    _mm256_store_ps(scales_at(first_group + j),
                                    _mm256_mul_ps(widened(block + kQ4KTileScalesOffset +
                                                              kTileRows * j + kTileHalfRows * h,
                                                          false),
                                                  d));
                    // The mins of a pair of sub-blocks sit side by side: sub-block j's are
                    // every other byte.
                    const __m128i pair = _mm_load_si128(reinterpret_cast<const __m128i*>(
                        block + kQ4KTileMinsOffset + 2 * kTileRows * (j / 2) +
                        2 * kTileHalfRows * h));
                    alignas(16) uint8_t mins[16];
                    _mm_store_si128(
                        reinterpret_cast<__m128i*>(mins),
                        _mm_shuffle_epi8(
                            pair, _mm_setr_epi8(j % 2, j % 2 + 2, j % 2 + 4, j % 2 + 6, j % 2 + 8,
                                                j % 2 + 10, j % 2 + 12, j % 2 + 14, -1, -1, -1, -1,
                                                -1, -1, -1, -1)));
                    _mm256_store_ps(
                        panel.mins + size_t(first_group + j) * kBlockRowTile + reg * kLanes,
                        _mm256_mul_ps(widened(mins, false), minus_dmin));
                }
            } else if (w.dtype == DType::IQ4_XS) {  // register k: steps k and k + 4 of group j
                const int first_group = b * kIq4XSSubBlocks;
                const __m256 d = tile_halves(block + kIq4XSTileDOffset + 2 * kTileHalfRows * h);
                const __m256i table = iq4_panel_table<kDot>();
                for (int j = 0; j < kIq4XSSubBlocks; ++j) {
                    for (int k = 0; k < kIq4XSSubBlockRegisters; ++k) {
                        __m256i low, high;
                        iq4_xs_tile_values(block, j, k, h, table, &low, &high);
                        _mm256_store_si256(levels_at(first_group + j, k), low);
                        _mm256_store_si256(levels_at(first_group + j, k + kIq4XSSubBlockRegisters),
                                           high);
                    }
                    _mm256_store_ps(scales_at(first_group + j),
                                    _mm256_mul_ps(widened(block + kIq4XSTileScalesOffset +
                                                              kTileRows * j + kTileHalfRows * h,
                                                          true),
                                                  d));
                }
            } else if (w.dtype == DType::Q2_K) {  // group g: sub-blocks 2g and 2g + 1, as Q6_K's
                const int first_sub_block = b * kQ2KSubBlocks;
                const __m256 d = tile_halves(block + kQ2KTileDOffset + 2 * kTileHalfRows * h);
                const __m256 minus_dmin =
                    _mm256_sub_ps(_mm256_setzero_ps(),
                                  tile_halves(block + kQ2KTileDMinOffset + 2 * kTileHalfRows * h));
                for (int i = 0; i < kQ2KSubBlocks; ++i) {
                    __m256i q[4];
                    q2_k_tile_levels(block, i, h, q);
                    const int group = (first_sub_block + i) / 2;
                    for (int s = 0; s < 4; ++s)
                        _mm256_store_si256(levels_at(group, i % 2 * 4 + s), q[s]);
                    // The scales bytes of a pair of sub-blocks sit side by side: sub-block i's
                    // are every other byte.
                    const __m128i pair = _mm_load_si128(reinterpret_cast<const __m128i*>(
                        block + kQ2KTileScalesOffset + 2 * kTileRows * (i / 2) +
                        2 * kTileHalfRows * h));
                    const __m256i packed = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(
                        pair,
                        _mm_setr_epi8(i % 2, i % 2 + 2, i % 2 + 4, i % 2 + 6, i % 2 + 8, i % 2 + 10,
                                      i % 2 + 12, i % 2 + 14, -1, -1, -1, -1, -1, -1, -1, -1)));
                    const __m256i four_bits = _mm256_set1_epi32(15);
                    _mm256_store_ps(
                        scales_at(first_sub_block + i),
                        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(packed, four_bits)), d));
                    _mm256_store_ps(
                        panel.mins + size_t(first_sub_block + i) * kBlockRowTile + reg * kLanes,
                        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(packed, kQ2KMinShift)),
                                      minus_dmin));
                }
            } else {  // Q6_K, Q3_K: group g holds sub-blocks 2g and 2g + 1, four steps each
                static_assert(kQ6KTileDOffset == kQ3KTileDOffset &&
                              kQ6KTileScalesOffset == kQ3KTileScalesOffset &&
                              kQ6KSubBlocks == kQ3KSubBlocks);
                const int first_sub_block = b * kQ6KSubBlocks;
                const __m256 d = tile_halves(block + kQ6KTileDOffset + 2 * kTileHalfRows * h);
                for (int i = 0; i < kQ6KSubBlocks; ++i) {
                    __m256i q[4];
                    (w.dtype == DType::Q6_K ? q6_k_tile_levels : q3_k_tile_levels)(block, i, h, q);
                    const int group = (first_sub_block + i) / 2;
                    for (int s = 0; s < 4; ++s)
                        _mm256_store_si256(levels_at(group, i % 2 * 4 + s), q[s]);
                    _mm256_store_ps(scales_at(first_sub_block + i),
                                    _mm256_mul_ps(widened(block + kQ6KTileScalesOffset +
                                                              kTileRows * i + kTileHalfRows * h,
                                                          true),
                                                  d));
                }
            }
        }
    }
}

// The 16 rows of one IQ4_NL or MXFP4 tile (cpu/quantized_tiles.h) into row registers
// first_register and first_register + 1 of the panel, as unpack_from_tile does for the super-block
// types: half h of register k of a group holds steps k (low nibbles) and k + 4 (high) of 8 rows.
// The same levels and A as from the rows, bit for bit. No tile (past the matrix): levels 0, A = 0.
template <DType kType, BlockDot kDot>
void unpack_from_lookup_tile(const Panel& panel, const Matrix& w, const uint8_t* tile,
                             int first_register) {
    const __m256i table = panel_table<kDot>(kType == DType::MXFP4 ? mxfp4_table() : iq4_table());
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    constexpr int kHalfSteps = kGroupSteps / 2;
    static_assert(tile_registers(kType) == kHalfSteps);
    for (int g = 0; g < w.cols / kGroup; ++g)
        for (int h = 0; h < kTileHalves; ++h) {
            const int reg = first_register + h;
            uint8_t* levels = panel.levels + size_t(g) * kGroupBytes + reg * kRegisterBytes;
            _mm256_store_ps(panel.scales + size_t(g) * kBlockRowTile + reg * kLanes,
                            tile ? group_tile_halves<kType>(tile, g, h) : _mm256_setzero_ps());
            for (int k = 0; k < kHalfSteps; ++k) {
                __m256i low = _mm256_setzero_si256(), high = _mm256_setzero_si256();
                if (tile) {
                    const __m256i bytes = _mm256_load_si256(reinterpret_cast<const __m256i*>(
                        tile_group_values(tile, kType, g) + k * kTileRegisterBytes +
                        h * kTileHalfBytes));
                    low = _mm256_shuffle_epi8(table, _mm256_and_si256(bytes, nibble));
                    high = _mm256_shuffle_epi8(
                        table, _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble));
                }
                _mm256_store_si256(reinterpret_cast<__m256i*>(levels + k * kStepBytes), low);
                _mm256_store_si256(
                    reinterpret_cast<__m256i*>(levels + (k + kHalfSteps) * kStepBytes), high);
            }
        }
}

// The panel of rows [tile_row, tile_row + 32) of w; rows past the matrix hold levels 0 and
// A = B = 0. Q4_K, Q5_K, Q6_K, IQ4_XS, IQ4_NL and MXFP4 are read from their tiles where they have
// them (the rows may then be out of memory), Q2_K and Q3_K always (the CPU backend makes them on
// every path that reaches here).
template <BlockDot kDot>
void unpack_tile(const Panel& panel, const Matrix& w, int tile_row) {
    if (w.row_tiles) {
        const auto unpack = w.dtype == DType::IQ4_NL  ? unpack_from_lookup_tile<DType::IQ4_NL, kDot>
                            : w.dtype == DType::MXFP4 ? unpack_from_lookup_tile<DType::MXFP4, kDot>
                                                      : unpack_from_tile<kDot>;
        for (int t = 0; t < kBlockRowTile / kTileRows; ++t) {
            const int first = tile_row + t * kTileRows;
            unpack(
                panel, w,
                first < w.rows ? w.row_tiles + size_t(first / kTileRows) * tile_bytes(w) : nullptr,
                t * kTileHalves);
        }
        return;
    }
    switch (w.dtype) {
        case DType::Q4_K:
            return unpack_tile_typed<DType::Q4_K, kDot>(panel, w, tile_row);
        case DType::Q5_K:
            return unpack_tile_typed<DType::Q5_K, kDot>(panel, w, tile_row);
        case DType::Q6_K:
            return unpack_tile_typed<DType::Q6_K, kDot>(panel, w, tile_row);
        case DType::IQ4_XS:
            return unpack_tile_typed<DType::IQ4_XS, kDot>(panel, w, tile_row);
        case DType::Q4_1:
            return unpack_tile_typed<DType::Q4_1, kDot>(panel, w, tile_row);
        case DType::Q5_0:
            return unpack_tile_typed<DType::Q5_0, kDot>(panel, w, tile_row);
        case DType::IQ4_NL:
            return unpack_tile_typed<DType::IQ4_NL, kDot>(panel, w, tile_row);
        case DType::MXFP4:
            return unpack_tile_typed<DType::MXFP4, kDot>(panel, w, tile_row);
        case DType::IQ2_XXS:
            return unpack_tile_typed<DType::IQ2_XXS, kDot>(panel, w, tile_row);
        case DType::IQ2_XS:
            return unpack_tile_typed<DType::IQ2_XS, kDot>(panel, w, tile_row);
        case DType::IQ2_S:
            return unpack_tile_typed<DType::IQ2_S, kDot>(panel, w, tile_row);
        case DType::IQ3_XXS:
            return unpack_tile_typed<DType::IQ3_XXS, kDot>(panel, w, tile_row);
        case DType::IQ3_S:
            return unpack_tile_typed<DType::IQ3_S, kDot>(panel, w, tile_row);
        case DType::IQ1_S:
            return unpack_tile_typed<DType::IQ1_S, kDot>(panel, w, tile_row);
        case DType::IQ1_M:
            return unpack_tile_typed<DType::IQ1_M, kDot>(panel, w, tile_row);
        case DType::TQ1_0:
            return unpack_tile_typed<DType::TQ1_0, kDot>(panel, w, tile_row);
        case DType::TQ2_0:
            return unpack_tile_typed<DType::TQ2_0, kDot>(panel, w, tile_row);
        default:  // Q5_1
            return unpack_tile_typed<DType::Q5_1, kDot>(panel, w, tile_row);
    }
}

// dots[k][h] += Σ levels · x over kSubSteps steps of one group of the panel from first_step, for
// TOKENS tokens (x of token k at values[k] + column) and the 16 rows of group_levels' two
// registers: a vpdpbusd a step.
template <int TOKENS, int kSubSteps>
inline void add_steps_vnni(__m256i (&dots)[TOKENS][kKernelRegisters], const uint8_t* group_levels,
                           const int8_t* const (&values)[TOKENS], int column, int first_step) {
#pragma GCC unroll 8
    for (int s = first_step; s < first_step + kSubSteps; ++s) {
        __m256i levels[kKernelRegisters];
#pragma GCC unroll 4
        for (int h = 0; h < kKernelRegisters; ++h)
            levels[h] = _mm256_load_si256(reinterpret_cast<const __m256i*>(
                group_levels + s * kStepBytes + h * kRegisterBytes));
#pragma GCC unroll 4
        for (int k = 0; k < TOKENS; ++k) {
            int32_t word;
            std::memcpy(&word, values[k] + column + s * kLaneBytes, sizeof word);
            const __m256i x_word = _mm256_set1_epi32(word);
#pragma GCC unroll 4
            for (int h = 0; h < kKernelRegisters; ++h)
                dots[k][h] = _mm256_dpbusd_avx_epi32(dots[k][h], levels[h], x_word);
        }
    }
}

// sums[k][r] += the dot products of groups [first_group, end_group) for TOKENS tokens from
// first_token and the 16 rows of row registers row_register, row_register + 1 of the panel;
// sums has kBlockRowTile floats a token, from the tile's first row and first_token.
//
// Register tile: TOKENS ≤ kBlockTokenTile = 3 tokens × 16 rows: 6 int16 (then int32) dot
// registers and 6 f32 sums, the step's two level registers and one broadcast of x (15 of
// 16). Per kWidenSteps steps: their vpmaddubsw pairs added in int16, then widened by
// vpmaddwd into the sub-block's int32 dot; on vpdpbusd, each step straight into it (IQ4_XS's
// levels there value + 128, `offset` then 128). Per sub-block each dot converted
// and added to the sums times A × x's scale; min types then add B × x's scale × x's sum over
// the sub-block.
template <int TOKENS, int kSubCols, bool kHasMin, bool kSigned, int kWidenSteps, BlockDot kDot>
void block_tile_kernel(float* sums, const Panel& panel, int row_register, const QuantizedBatch& x,
                       int first_token, int first_group, int end_group, int offset) {
    constexpr int kSubs = kGroup / kSubCols, kSubSteps = kSubCols / kLaneBytes;
    constexpr int R = kKernelRegisters;
    const int8_t* values[TOKENS];
    const float* x_scales[TOKENS];
    const int32_t* half_sums[TOKENS];
#pragma GCC unroll 4
    for (int k = 0; k < TOKENS; ++k) {
        values[k] = x.values.data() + size_t(first_token + k) * x.padded_cols;
        x_scales[k] = x.scales.data() + size_t(first_token + k) * x.groups;
        half_sums[k] = x.half_sums.data() + size_t(first_token + k) * x.groups * 2;
    }
    float* tile_sums = sums + size_t(first_token) * kBlockRowTile + row_register * kLanes;
    __m256 acc[TOKENS][R];
#pragma GCC unroll 4
    for (int k = 0; k < TOKENS; ++k)
#pragma GCC unroll 4
        for (int h = 0; h < R; ++h)
            acc[k][h] = _mm256_load_ps(tile_sums + k * kBlockRowTile + h * kLanes);
    for (int g = first_group; g < end_group; ++g) {
        const uint8_t* group_levels =
            panel.levels + size_t(g) * kGroupBytes + row_register * kRegisterBytes;
#pragma GCC unroll 2
        for (int sub = 0; sub < kSubs; ++sub) {
            __m256i dots[TOKENS][R];
#pragma GCC unroll 4
            for (int k = 0; k < TOKENS; ++k) {
                const int start =
                    kHasMin ? 0 : sub_block_start(half_sums[k] + 2 * g, sub, kSubs, offset);
#pragma GCC unroll 4
                for (int h = 0; h < R; ++h) dots[k][h] = _mm256_set1_epi32(start);
            }
            if constexpr (kDot == BlockDot::Vnni) {
                add_steps_vnni<TOKENS, kSubSteps>(dots, group_levels, values, g * kGroup,
                                                  sub * kSubSteps);
            } else {
                // On vpmaddubsw: the pairs of kWidenSteps steps added in int16, then widened by
                // vpmaddwd (IQ4_XS: |level| times x with the level's sign). Inline rather than a
                // function beside add_steps_vnni: as one, GCC allocated its registers otherwise,
                // and IQ4_XS ran 3% slower.
                const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 8
                for (int first_step = sub * kSubSteps; first_step < (sub + 1) * kSubSteps;
                     first_step += kWidenSteps) {
                    __m256i pairs[TOKENS][R];
#pragma GCC unroll 8
                    for (int s = first_step; s < first_step + kWidenSteps; ++s) {
                        __m256i levels[R], magnitudes[R];
#pragma GCC unroll 4
                        for (int h = 0; h < R; ++h) {
                            levels[h] = _mm256_load_si256(reinterpret_cast<const __m256i*>(
                                group_levels + s * kStepBytes + h * kRegisterBytes));
                            magnitudes[h] =
                                kSigned ? _mm256_sign_epi8(levels[h], levels[h]) : levels[h];
                        }
#pragma GCC unroll 4
                        for (int k = 0; k < TOKENS; ++k) {
                            int32_t word;
                            std::memcpy(&word, values[k] + g * kGroup + s * kLaneBytes,
                                        sizeof word);
                            const __m256i x_word = _mm256_set1_epi32(word);
#pragma GCC unroll 4
                            for (int h = 0; h < R; ++h) {
                                const __m256i product = _mm256_maddubs_epi16(
                                    magnitudes[h],
                                    kSigned ? _mm256_sign_epi8(x_word, levels[h]) : x_word);
                                // A saturating add, which never saturates here: unlike a plain one,
                                // the compiler keeps the sum in step order, one register a pair,
                                // rather than holding every product at once.
                                pairs[k][h] = s == first_step
                                                  ? product
                                                  : _mm256_adds_epi16(pairs[k][h], product);
                            }
                        }
                    }
#pragma GCC unroll 4
                    for (int k = 0; k < TOKENS; ++k)
#pragma GCC unroll 4
                        for (int h = 0; h < R; ++h)
                            dots[k][h] =
                                _mm256_add_epi32(dots[k][h], _mm256_madd_epi16(pairs[k][h], ones));
                }
            }
            const float* scales =
                panel.scales + size_t(g * kSubs + sub) * kBlockRowTile + row_register * kLanes;
#pragma GCC unroll 4
            for (int k = 0; k < TOKENS; ++k) {
                const __m256 x_scale = _mm256_set1_ps(x_scales[k][g]);
#pragma GCC unroll 4
                for (int h = 0; h < R; ++h)
                    acc[k][h] = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(dots[k][h]),
                        _mm256_mul_ps(_mm256_load_ps(scales + h * kLanes), x_scale), acc[k][h]);
            }
            if constexpr (kHasMin) {
                const float* mins =
                    panel.mins + size_t(g * kSubs + sub) * kBlockRowTile + row_register * kLanes;
#pragma GCC unroll 4
                for (int k = 0; k < TOKENS; ++k) {
                    // x's sum over the sub-block: the group's two sums of 16, or one of them.
                    const int32_t* sums16 = half_sums[k] + 2 * g;
                    const int x_sum_int = kSubs == 1 ? sums16[0] + sums16[1] : sums16[sub];
                    const __m256 x_sum = _mm256_set1_ps(x_scales[k][g] * float(x_sum_int));
#pragma GCC unroll 4
                    for (int h = 0; h < R; ++h)
                        acc[k][h] =
                            _mm256_fmadd_ps(_mm256_load_ps(mins + h * kLanes), x_sum, acc[k][h]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int k = 0; k < TOKENS; ++k)
#pragma GCC unroll 4
        for (int h = 0; h < R; ++h)
            _mm256_store_ps(tile_sums + k * kBlockRowTile + h * kLanes, acc[k][h]);
}

using BlockTileKernel = void (*)(float*, const Panel&, int, const QuantizedBatch&, int, int, int,
                                 int);
// The kernels for 1 .. kBlockTokenTile tokens.
template <int kSubCols, bool kHasMin, bool kSigned, int kWidenSteps, BlockDot kDot, int... kTokens>
constexpr std::array<BlockTileKernel, kBlockTokenTile> kernel_table(
    std::integer_sequence<int, kTokens...>) {
    return {block_tile_kernel<kTokens + 1, kSubCols, kHasMin, kSigned, kWidenSteps, kDot>...};
}
template <DType kType, BlockDot kDot>
constexpr BlockTileKernel kernel_of(int tokens) {
    constexpr LevelShape shape = level_shape(kType);
    return kernel_table<shape.sub_cols, shape.has_min, shape.is_signed, widen_steps(shape), kDot>(
        std::make_integer_sequence<int, kBlockTokenTile>())[tokens - 1];
}

// The micro-kernel for `tokens` tokens of a type (types of one LevelShape share theirs).
template <BlockDot kDot>
BlockTileKernel kernel_for(DType dtype, int tokens) {
    switch (dtype) {
        case DType::Q4_K:
        case DType::Q4_1:
            return kernel_of<DType::Q4_K, kDot>(tokens);
        case DType::Q5_K:
        case DType::Q5_1:
            return kernel_of<DType::Q5_K, kDot>(tokens);
        case DType::Q5_0:
            return kernel_of<DType::Q5_0, kDot>(tokens);
        case DType::Q6_K:
        case DType::Q3_K:  // on Q6_K's kernel (its levels 0..7 widen as safely; the offset is
                           // passed)
            return kernel_of<DType::Q6_K, kDot>(tokens);
        case DType::Q2_K:
            return kernel_of<DType::Q2_K, kDot>(tokens);
        case DType::IQ4_XS:
        case DType::IQ4_NL:
            return kernel_of<DType::IQ4_XS, kDot>(tokens);
        case DType::MXFP4:
            return kernel_of<DType::MXFP4, kDot>(tokens);
        case DType::IQ2_XXS:  // the i-quants with sub-blocks of 32 (the offset is passed)
        case DType::IQ3_XXS:
        case DType::IQ3_S:
        case DType::IQ1_S:
            return kernel_of<DType::IQ2_XXS, kDot>(tokens);
        case DType::TQ1_0:  // levels up to 3 (the offset is passed)
        case DType::TQ2_0:
            return kernel_of<DType::TQ2_0, kDot>(tokens);
        default:  // the i-quants with sub-blocks of 16: IQ2_XS, IQ2_S, IQ1_M
            return kernel_of<DType::IQ2_XS, kDot>(tokens);
    }
}

// The int32 dot's start per unit of x's sum: the type's offset, or on vpdpbusd IQ4_XS's 128.
template <BlockDot kDot>
constexpr int kernel_offset(const LevelShape& shape) {
    return kDot == BlockDot::Vnni && shape.is_signed ? kSignFlip : shape.offset;
}

template <typename Element>
Element* aligned32(std::vector<Element>& storage, size_t count) {
    storage.resize(count + 32 / sizeof(Element));
    const uintptr_t misalignment = reinterpret_cast<uintptr_t>(storage.data()) % 32;
    return misalignment ? storage.data() + (32 - misalignment) / sizeof(Element) : storage.data();
}

// out [batch, w.rows] for rows [first_row, first_row + row_count) of w (avx2.h: gemm_rows_blocks),
// the sub-blocks' dots on kDot.
template <BlockDot kDot>
void gemm_rows_blocks_on(float* out, const Matrix& w, const QuantizedBatch& x, int first_row,
                         int row_count) {
    const LevelShape shape = level_shape(w.dtype);
    const int groups = x.groups, sub_blocks = groups * (kGroup / shape.sub_cols);
    // One tile's panel and its sums [batch][32 rows], kept from call to call.
    static thread_local std::vector<uint8_t> level_storage;
    static thread_local std::vector<float> scale_storage, min_storage, sum_storage;
    const Panel panel{aligned32(level_storage, size_t(groups) * kGroupBytes),
                      aligned32(scale_storage, size_t(sub_blocks) * kBlockRowTile),
                      aligned32(min_storage, size_t(sub_blocks) * kBlockRowTile)};
    float* sums = aligned32(sum_storage, size_t(x.batch) * kBlockRowTile);
    const int end_row = first_row + row_count;
    // Panels of whole tiles; one the run shares with another thread's is unpacked by both,
    // each computing and storing only the 16-row halves and rows of its own run.
    for (int tile_row = first_row / kBlockRowTile * kBlockRowTile; tile_row < end_row;
         tile_row += kBlockRowTile) {
        unpack_tile<kDot>(panel, w, tile_row);
        std::fill(sums, sums + size_t(x.batch) * kBlockRowTile, 0.0f);
        const int kernel_rows = kKernelRegisters * kLanes;
        const int first_register =
            std::max(0, first_row - tile_row) / kernel_rows * kKernelRegisters;
        const int end_register = std::min(
            kRowRegisters, (end_row - tile_row + kernel_rows - 1) / kernel_rows * kKernelRegisters);
        // The next tile's blocks (or its tiles of 16 rows), fetched into L2 over this
        // tile's kernel calls: the unpacking then reads them from cache, not from memory.
        const int next_tile = tile_row + kBlockRowTile;
        const int calls = (groups + kDepthGroups - 1) / kDepthGroups *
                          ((x.batch + kBlockTokenTile - 1) / kBlockTokenTile) *
                          ((end_register - first_register) / kKernelRegisters);
        const int next_rows = std::max(0, std::min(next_tile + kBlockRowTile, end_row) - next_tile);
        PanelPrefetcher prefetcher =
            w.row_tiles ? PanelPrefetcher(
                              w.row_tiles + size_t(std::min(next_tile, w.rows - 1) / kTileRows) *
                                                tile_bytes(w),
                              tile_bytes(w), (next_rows + kTileRows - 1) / kTileRows,
                              int(tile_bytes(w)), calls)
                        : PanelPrefetcher(w.row_data(std::min(next_tile, w.rows - 1)),
                                          w.row_bytes(), next_rows, int(w.row_bytes()), calls);
        for (int first_group = 0; first_group < groups; first_group += kDepthGroups) {
            const int end_group = std::min(groups, first_group + kDepthGroups);
            for (int token = 0; token < x.batch; token += kBlockTokenTile) {
                const BlockTileKernel kernel =
                    kernel_for<kDot>(w.dtype, std::min(kBlockTokenTile, x.batch - token));
                for (int reg = first_register; reg < end_register; reg += kKernelRegisters) {
                    prefetcher.before_call();
                    kernel(sums, panel, reg, x, token, first_group, end_group,
                           kernel_offset<kDot>(shape));
                }
            }
        }
        // This run's rows of the tile, to out.
        const int first = std::max(first_row, tile_row) - tile_row;
        const int end = std::min({end_row, tile_row + kBlockRowTile, w.rows}) - tile_row;
        for (int token = 0; token < x.batch; ++token)
            std::copy(sums + size_t(token) * kBlockRowTile + first,
                      sums + size_t(token) * kBlockRowTile + end,
                      out + size_t(token) * w.rows + tile_row + first);
    }
}

}  // namespace

}  // namespace barellm::cpu::avx2
