// The decode matvec on AVX2 + FMA + F16C for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS weights read
// from their tiles of 16 rows (cpu/super_block_tiles.h): out[t][r] = W[r] · x_t for one token or a
// few, each x_t quantized per 256 as Q8_K (quantize_q8_k), each super-block's dot products in
// integers.
//
// The tiles are the AVX-512 VNNI kernel's (matvec_super_block_tiles_avx512vnni.cpp); here a
// 64-byte register of a tile is two halves of 8 rows, one 256-bit register each. For one token
// (decode) a super-block's two halves are computed together, each broadcast word of x serving
// both; for more tokens, whose sums would not fit in the registers twice, a half after the
// other (the super-block's 35 to 53 cache lines are in L1 by the second). Each int32 lane is a
// row, so no horizontal sums are needed, as there.
//
// AVX2 has no vpdpbusd: vpmaddubsw multiplies four columns of unsigned levels by x's signed
// bytes (broadcast to every lane) into two int16 sums a lane, and those add up in int16 while
// they cannot overflow, then vpmaddwd multiplies them by the sub-block's scale (the lane's row's,
// in both words) into int32, exactly:
// - Q4_K: a chunk's 8 registers of nibbles add up per sub-block in int16 (at most
//   8 · 2 · 15 · 128 = 30720); the mins meet x's sums of 32 through vpmaddwd, a pair of
//   sub-blocks a register (the tile keeps them side by side), as on AVX-512.
// - Q5_K: as Q4_K, on the levels (0..31) the tile holds; half a chunk's registers add up
//   in int16 (at most 4 · 2 · 31 · 127 = 31496) before each widening.
// - Q6_K: a sub-block's four registers of levels (0..63) in two int16 sums of two (at most
//   2 · 2 · 63 · 128 = 32256); the offset of 32 comes in once a super-block as
//   −32 · Σ_i sc_i · Σ x_i, the int8 scales of two sub-blocks side by side in a lane's words
//   against x's sums of 16 by pairs.
// - Q3_K: as Q6_K, on levels 0..7 (two int16 sums of two at most 2 · 2 · 7 · 128 = 3584), the
//   offset of 4.
// - Q2_K: a sub-block's four registers of levels (0..3) in one int16 sum (at most
//   4 · 2 · 3 · 128 = 3072); the 4-bit scales and mins come a pair of sub-blocks to a lane's
//   words, the mins meeting x's sums of 16 by pairs through vpmaddwd, as Q4_K's.
// - IQ4_XS: its signed values (−127..113, looked up by vpshufb) are multiplied as
//   |value| by x with the value's sign (vpsignb), two products into int16 (at most
//   2 · 127 · 127 = 32258), which vpmaddwd widens at once by the sub-block's ls − 32.
// Per super-block the f32 sums of 8 rows gain x.d · (d · Σ sc · q · x − dmin · Σ m · Σ x), d and
// dmin those of the rows.
//
// A super-block is read front to back: the mins (Q4_K, Q5_K, Q2_K) and the scales' part of the
// offset (Q6_K), which lie before the values, are taken first. Where super_block_prefetch says so,
// each step over a super-block's values asks for its share of the lines of the next super-block
// (prefetch_share), a line or two at a time: on the Zen 3 and on Intel the kernel then reads its
// tiles from memory about as fast as a plain streaming read, where all of a super-block's lines
// asked for at once at its start, or none, left it waiting on memory (docs/BENCHMARKS.md: "CPU:
// the AVX2 super-block tiles asked for a line at a time", "The change: the next super-block
// asked for into L2").
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/avx2/avx2.h"
#include "cpu/avx2/block_levels_avx2.h"
#include "cpu/avx2/helpers_avx2.h"
#include "cpu/panel_prefetcher.h"
#include "cpu/super_block_tiles.h"

namespace barellm::cpu::avx2 {

namespace {

constexpr int kTileTokens = 4;              // tokens a pass over a tile
constexpr int kMinPairs = kKSubBlocks / 2;  // pairs of sub-blocks a super-block
// A token's x (TileTokenX) carries in `sums` its sums by pairs: Q4_K's and Q5_K's of 32
// (pair_sums_of_32), Q6_K's, Q3_K's and Q2_K's of 16 (pair_sums_of_16); none for IQ4_XS.
using TokenX = TileTokenX;

// Eight bytes at p, one a lane, unsigned (Q4_K's scales) or signed (Q6_K's), in both 16-bit
// words of the lane: a vpmaddwd multiplier.
inline __m256i scale_words(const uint8_t* p) {
    const __m256i scales =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_or_si256(scales, _mm256_slli_epi32(scales, 16));
}
inline __m256i signed_scale_words(const uint8_t* p) {
    const __m256i scales =
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_blend_epi16(scales, _mm256_slli_epi32(scales, 16), 0xaa);
}

// x_words[t][m]: x_t's columns 4m..4m + 3 of sub-block s (16 columns) of super-block b,
// broadcast to every lane.
template <int kTokens>
inline void sub_block_x_words(__m256i (*x_words)[4], const TokenX* x, int b, int s) {
#pragma GCC unroll 4
    for (int t = 0; t < kTokens; ++t)
#pragma GCC unroll 4
        for (int m = 0; m < 4; ++m)
            x_words[t][m] =
                broadcast_word(x[t].values + size_t(b) * kSuperBlock + s * kQ6SubBlock + 4 * m);
}

// sums[t] gains −x_t.d[b] · dmin · Σ_p mins[p] · x_t's sums of pair p (a lane's two words, the
// mins of a pair of sub-blocks of its row, against the pair's two sums): the mins' term of
// super-block b for 8 rows, kPairs pairs of sub-blocks (Q4_K, Q5_K, Q2_K).
template <int kTokens, int kPairs>
inline void subtract_mins(__m256* sums, const __m256i* mins, __m256 dmin, const TokenX* x, int b) {
#pragma GCC unroll 4
    for (int t = 0; t < kTokens; ++t) {
        __m256i min_dots = _mm256_setzero_si256();  // Σ m · Σ x
#pragma GCC unroll 8
        for (int p = 0; p < kPairs; ++p)
            min_dots = _mm256_add_epi32(
                min_dots, _mm256_madd_epi16(mins[p], _mm256_set1_epi32(x[t].sums[b * kPairs + p])));
        const __m256 x_d = _mm256_set1_ps(x[t].d[b]);
        sums[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(min_dots), _mm256_mul_ps(dmin, x_d), sums[t]);
    }
}

// Halves h0..h0 + kHalves − 1 of super-block b of a Q4_K (kFifthBit false) or Q5_K tile against
// kTokens tokens: sums[h][t] gains the 8 rows' x.d · (d · Σ sc · q · x − dmin · Σ m · Σ x). Both
// halves at once (kHalves 2, one token) share x's broadcasts.
template <int kTokens, int kHalves, bool kFifthBit>
inline void k_halves_block(__m256 (*sums)[kTokens], const uint8_t* block, int b, int h0,
                           const TokenX* x, LinesAhead ahead) {
    constexpr int kLines =
        super_block_tile_bytes(kFifthBit ? DType::Q5_K : DType::Q4_K) / kCacheLine;
    // Registers whose int16 pairs add up before vpmaddwd widens them: at most 8 · 2 · 15 · 127
    // for 4-bit levels, 4 · 2 · 31 · 127 for 5-bit.
    constexpr int kWidenRegisters = kFifthBit ? kQ4KChunkRegisters / 2 : kQ4KChunkRegisters;
    // − dmin · Σ m · Σ x first: the mins lie before the values.
#pragma GCC unroll 2
    for (int i = 0; i < kHalves; ++i) {
        const int h = h0 + i;
        __m256i mins[kMinPairs];  // a lane's words: the mins of sub-blocks 2p and 2p + 1
#pragma GCC unroll 4
        for (int p = 0; p < kMinPairs; ++p)
            mins[p] = _mm256_cvtepu8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(
                block + kQ4KTileMinsOffset + 2 * kTileRows * p + 2 * kTileHalfRows * h)));
        subtract_mins<kTokens, kMinPairs>(
            sums[h], mins, tile_halves(block + kQ4KTileDMinOffset + 2 * kTileHalfRows * h), x, b);
    }
    __m256i dots[kHalves][kTokens];  // Σ_j sc_j · Σ q · x
#pragma GCC unroll 2
    for (int i = 0; i < kHalves; ++i)
#pragma GCC unroll 4
        for (int t = 0; t < kTokens; ++t) dots[i][t] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int c = 0; c < kQ4KChunks; ++c) {  // unrolled: Q5_K's shifts of its top bits immediate
        for (int first = 0; first < kQ4KChunkRegisters; first += kWidenRegisters) {
            // int16 pairs of sub-blocks 2c and 2c + 1
            __m256i low[kHalves][kTokens], high[kHalves][kTokens];
#pragma GCC unroll 2
            for (int i = 0; i < kHalves; ++i)
#pragma GCC unroll 4
                for (int t = 0; t < kTokens; ++t) low[i][t] = high[i][t] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int k = first; k < first + kWidenRegisters; ++k) {
                prefetch_share<kLines, kQ4KChunks * kQ4KChunkRegisters>(ahead,
                                                                        c * kQ4KChunkRegisters + k);
                __m256i x_low[kTokens], x_high[kTokens];
#pragma GCC unroll 4
                for (int t = 0; t < kTokens; ++t) {
                    const int8_t* xc =
                        x[t].values + size_t(b) * kSuperBlock + c * 2 * kSubBlock + k * 4;
                    x_low[t] = broadcast_word(xc);
                    x_high[t] = broadcast_word(xc + kSubBlock);
                }
#pragma GCC unroll 2
                for (int i = 0; i < kHalves; ++i) {
                    __m256i q_low, q_high;
                    k_tile_levels<kFifthBit>(block, c, k, h0 + i, &q_low, &q_high);
#pragma GCC unroll 4
                    for (int t = 0; t < kTokens; ++t) {
                        low[i][t] =
                            _mm256_add_epi16(low[i][t], _mm256_maddubs_epi16(q_low, x_low[t]));
                        high[i][t] =
                            _mm256_add_epi16(high[i][t], _mm256_maddubs_epi16(q_high, x_high[t]));
                    }
                }
            }
            const uint8_t* scales = block + kQ4KTileScalesOffset + kTileRows * 2 * c;
#pragma GCC unroll 2
            for (int i = 0; i < kHalves; ++i) {
                const __m256i low_scales = scale_words(scales + (h0 + i) * kTileHalfRows);
                const __m256i high_scales =
                    scale_words(scales + kTileRows + (h0 + i) * kTileHalfRows);
#pragma GCC unroll 4
                for (int t = 0; t < kTokens; ++t)
                    dots[i][t] = _mm256_add_epi32(
                        dots[i][t], _mm256_add_epi32(_mm256_madd_epi16(low[i][t], low_scales),
                                                     _mm256_madd_epi16(high[i][t], high_scales)));
            }
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < kHalves; ++i) {
        const int h = h0 + i;
        const __m256 d = tile_halves(block + kQ4KTileDOffset + 2 * kTileHalfRows * h);
#pragma GCC unroll 4
        for (int t = 0; t < kTokens; ++t) {
            const __m256 x_d = _mm256_set1_ps(x[t].d[b]);
            sums[h][t] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[i][t]), _mm256_mul_ps(d, x_d), sums[h][t]);
        }
    }
}

// Halves h0..h0 + kHalves − 1 of super-block b of a Q6_K or Q3_K tile (sub-blocks of 16 columns,
// an int8 scale each) against kTokens tokens: sums[h][t] gains the 8 rows' x.d · d · Σ_i sc_i ·
// Σ (q − offset) · x. Both halves at once (kHalves 2, one token) share x's broadcasts.
template <DType kType, int kTokens, int kHalves>
inline void sixteen_column_halves_block(__m256 (*sums)[kTokens], const uint8_t* block, int b,
                                        int h0, const TokenX* x, LinesAhead ahead) {
    static_assert(kQ6KTileDOffset == kQ3KTileDOffset &&
                  kQ6KTileScalesOffset == kQ3KTileScalesOffset && kQ6KSubBlocks == kQ3KSubBlocks);
    constexpr int kOffset = kType == DType::Q6_K ? kQ6KLevelOffset : kQ3KLevelOffset;
    constexpr int kBlockBytes = super_block_tile_bytes(kType);
    const uint8_t* scales = block + kQ6KTileScalesOffset;
    // dots start at −offset · Σ_i sc_i · Σ x_i: the scales lie before the values.
    __m256i dots[kHalves][kTokens];  // Σ_i sc_i · Σ (q − offset) · x
#pragma GCC unroll 2
    for (int i = 0; i < kHalves; ++i) {
        const int h = h0 + i;
        // A lane's words: the int8 scales of sub-blocks 2p and 2p + 1, widened.
        __m256i scale_pairs[kQ6KSubBlocks / 2];
#pragma GCC unroll 8
        for (int p = 0; p < kQ6KSubBlocks / 2; ++p)
            scale_pairs[p] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(
                _mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales + kTileRows * 2 * p +
                                                                 h * kTileHalfRows)),
                _mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales + kTileRows * (2 * p + 1) +
                                                                 h * kTileHalfRows))));
#pragma GCC unroll 4
        for (int t = 0; t < kTokens; ++t) {
            __m256i scaled_sums = _mm256_setzero_si256();  // Σ_i sc_i · Σ x_i
#pragma GCC unroll 8
            for (int p = 0; p < kQ6KSubBlocks / 2; ++p)
                scaled_sums = _mm256_add_epi32(
                    scaled_sums,
                    _mm256_madd_epi16(scale_pairs[p],
                                      _mm256_set1_epi32(x[t].sums[b * kQ6KSubBlocks / 2 + p])));
            dots[i][t] = _mm256_mullo_epi32(scaled_sums, _mm256_set1_epi32(-kOffset));
        }
    }
    for (int s = 0; s < kQ6KSubBlocks; ++s) {
        prefetch_share<kBlockBytes / kCacheLine, kQ6KSubBlocks>(ahead, s);
        __m256i x_words[kTokens][4];  // x of columns 4m..4m + 3 of the sub-block, broadcast
        sub_block_x_words<kTokens>(x_words, x, b, s);
#pragma GCC unroll 2
        for (int i = 0; i < kHalves; ++i) {
            __m256i q[4];  // levels of columns 4m..4m + 3 of the sub-block
            if constexpr (kType == DType::Q6_K)
                q6_k_tile_levels(block, s, h0 + i, q);
            else
                q3_k_tile_levels(block, s, h0 + i, q);
            const __m256i scale =
                signed_scale_words(scales + kTileRows * s + (h0 + i) * kTileHalfRows);
#pragma GCC unroll 4
            for (int t = 0; t < kTokens; ++t) {
                const __m256i first_half =
                    _mm256_add_epi16(_mm256_maddubs_epi16(q[0], x_words[t][0]),
                                     _mm256_maddubs_epi16(q[1], x_words[t][1]));
                const __m256i second_half =
                    _mm256_add_epi16(_mm256_maddubs_epi16(q[2], x_words[t][2]),
                                     _mm256_maddubs_epi16(q[3], x_words[t][3]));
                dots[i][t] = _mm256_add_epi32(
                    dots[i][t], _mm256_add_epi32(_mm256_madd_epi16(first_half, scale),
                                                 _mm256_madd_epi16(second_half, scale)));
            }
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < kHalves; ++i) {
        const int h = h0 + i;
        const __m256 d = tile_halves(block + kQ6KTileDOffset + 2 * kTileHalfRows * h);
#pragma GCC unroll 4
        for (int t = 0; t < kTokens; ++t)
            sums[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[i][t]),
                                         _mm256_mul_ps(d, _mm256_set1_ps(x[t].d[b])), sums[h][t]);
    }
}

// Halves h0..h0 + kHalves − 1 of super-block b of a Q2_K tile against kTokens tokens:
// sums[h][t] gains the 8 rows' x.d · (d · Σ sc · q · x − dmin · Σ m · Σ x). Both halves at
// once (kHalves 2, one token) share x's broadcasts.
template <int kTokens, int kHalves>
inline void q2_k_halves_block(__m256 (*sums)[kTokens], const uint8_t* block, int b, int h0,
                              const TokenX* x, LinesAhead ahead) {
    constexpr int kPairs = kQ2KSubBlocks / 2;
    // Each lane's pair of words (the scales bytes of sub-blocks 2p and 2p + 1 of its row, a
    // word each) as the 4-bit scale of the first, or of the second, in both words.
    const __m256i first_scale =
        _mm256_setr_epi8(0, -1, 0, -1, 4, -1, 4, -1, 8, -1, 8, -1, 12, -1, 12, -1,  //
                         0, -1, 0, -1, 4, -1, 4, -1, 8, -1, 8, -1, 12, -1, 12, -1);
    const __m256i second_scale =
        _mm256_setr_epi8(2, -1, 2, -1, 6, -1, 6, -1, 10, -1, 10, -1, 14, -1, 14, -1,  //
                         2, -1, 2, -1, 6, -1, 6, -1, 10, -1, 10, -1, 14, -1, 14, -1);
    const __m256i low_nibbles = _mm256_set1_epi16(0x0f);
    __m256i scales[kHalves][kQ2KSubBlocks];
    // − dmin · Σ m · Σ x first: the scales and mins lie before the values.
#pragma GCC unroll 2
    for (int i = 0; i < kHalves; ++i) {
        const int h = h0 + i;
        __m256i mins[kPairs];  // a lane's words: the mins of sub-blocks 2p and 2p + 1
#pragma GCC unroll 8
        for (int p = 0; p < kPairs; ++p) {
            const __m256i packed =
                _mm256_cvtepu8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(
                    block + kQ2KTileScalesOffset + 2 * kTileRows * p + 2 * kTileHalfRows * h)));
            mins[p] = _mm256_srli_epi16(packed, kQ2KMinShift);
            const __m256i pair_scales = _mm256_and_si256(packed, low_nibbles);
            scales[i][2 * p] = _mm256_shuffle_epi8(pair_scales, first_scale);
            scales[i][2 * p + 1] = _mm256_shuffle_epi8(pair_scales, second_scale);
        }
        subtract_mins<kTokens, kPairs>(
            sums[h], mins, tile_halves(block + kQ2KTileDMinOffset + 2 * kTileHalfRows * h), x, b);
    }
    __m256i dots[kHalves][kTokens];  // Σ_i sc_i · Σ q · x
#pragma GCC unroll 2
    for (int i = 0; i < kHalves; ++i)
#pragma GCC unroll 4
        for (int t = 0; t < kTokens; ++t) dots[i][t] = _mm256_setzero_si256();
    for (int s = 0; s < kQ2KSubBlocks; ++s) {
        prefetch_share<kQ2KTileBlockBytes / kCacheLine, kQ2KSubBlocks>(ahead, s);
        __m256i x_words[kTokens][4];  // x of columns 4m..4m + 3 of the sub-block, broadcast
        sub_block_x_words<kTokens>(x_words, x, b, s);
#pragma GCC unroll 2
        for (int i = 0; i < kHalves; ++i) {
            __m256i q[4];  // levels of columns 4m..4m + 3 of the sub-block
            q2_k_tile_levels(block, s, h0 + i, q);
#pragma GCC unroll 4
            for (int t = 0; t < kTokens; ++t) {
                const __m256i pairs =
                    _mm256_add_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(q[0], x_words[t][0]),
                                                      _mm256_maddubs_epi16(q[1], x_words[t][1])),
                                     _mm256_add_epi16(_mm256_maddubs_epi16(q[2], x_words[t][2]),
                                                      _mm256_maddubs_epi16(q[3], x_words[t][3])));
                dots[i][t] = _mm256_add_epi32(dots[i][t], _mm256_madd_epi16(pairs, scales[i][s]));
            }
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < kHalves; ++i) {
        const int h = h0 + i;
        const __m256 d = tile_halves(block + kQ2KTileDOffset + 2 * kTileHalfRows * h);
#pragma GCC unroll 4
        for (int t = 0; t < kTokens; ++t)
            sums[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[i][t]),
                                         _mm256_mul_ps(d, _mm256_set1_ps(x[t].d[b])), sums[h][t]);
    }
}

// Halves h0..h0 + kHalves − 1 of super-block b of an IQ4_XS tile against kTokens tokens:
// sums[h][t] gains the 8 rows' x.d · d · Σ_j (ls_j − 32) · Σ value · x. Both halves at once
// (kHalves 2, one token) share x's broadcasts.
template <int kTokens, int kHalves>
inline void iq4_xs_halves_block(__m256 (*sums)[kTokens], const uint8_t* block, int b, int h0,
                                const TokenX* x, LinesAhead ahead) {
    const __m256i table = iq4_table();
    __m256i dots[kHalves][kTokens];  // Σ_j (ls_j − 32) · Σ value · x
#pragma GCC unroll 2
    for (int i = 0; i < kHalves; ++i)
#pragma GCC unroll 4
        for (int t = 0; t < kTokens; ++t) dots[i][t] = _mm256_setzero_si256();
    const uint8_t* scales = block + kIq4XSTileScalesOffset;
    for (int j = 0; j < kIq4XSSubBlocks; ++j) {
        __m256i scale[kHalves];
#pragma GCC unroll 2
        for (int i = 0; i < kHalves; ++i)
            scale[i] = signed_scale_words(scales + kTileRows * j + (h0 + i) * kTileHalfRows);
#pragma GCC unroll 4
        for (int k = 0; k < kIq4XSSubBlockRegisters; ++k) {
            prefetch_share<kIq4XSTileBlockBytes / kCacheLine,
                           kIq4XSSubBlocks * kIq4XSSubBlockRegisters>(
                ahead, j * kIq4XSSubBlockRegisters + k);
            __m256i x_low[kTokens], x_high[kTokens];
#pragma GCC unroll 4
            for (int t = 0; t < kTokens; ++t) {
                const int8_t* xj = x[t].values + size_t(b) * kSuperBlock + j * kSubBlock + k * 4;
                x_low[t] = broadcast_word(xj);
                x_high[t] = broadcast_word(xj + kSubBlock / 2);
            }
#pragma GCC unroll 2
            for (int i = 0; i < kHalves; ++i) {
                __m256i low, high;
                iq4_xs_tile_values(block, j, k, h0 + i, table, &low, &high);
                const __m256i low_magnitudes = _mm256_abs_epi8(low);
                const __m256i high_magnitudes = _mm256_abs_epi8(high);
#pragma GCC unroll 4
                for (int t = 0; t < kTokens; ++t) {
                    const __m256i low_pairs =
                        _mm256_maddubs_epi16(low_magnitudes, _mm256_sign_epi8(x_low[t], low));
                    const __m256i high_pairs =
                        _mm256_maddubs_epi16(high_magnitudes, _mm256_sign_epi8(x_high[t], high));
                    dots[i][t] = _mm256_add_epi32(
                        dots[i][t], _mm256_add_epi32(_mm256_madd_epi16(low_pairs, scale[i]),
                                                     _mm256_madd_epi16(high_pairs, scale[i])));
                }
            }
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < kHalves; ++i) {
        const int h = h0 + i;
        const __m256 d = tile_halves(block + kIq4XSTileDOffset + 2 * kTileHalfRows * h);
#pragma GCC unroll 4
        for (int t = 0; t < kTokens; ++t)
            sums[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[i][t]),
                                         _mm256_mul_ps(d, _mm256_set1_ps(x[t].d[b])), sums[h][t]);
    }
}

// Halves h0..h0 + kHalves − 1 of super-block b of a kType tile against kTokens tokens.
template <DType kType, int kTokens, int kHalves>
inline void halves_block(__m256 (*sums)[kTokens], const uint8_t* block, int b, int h0,
                         const TokenX* x, LinesAhead ahead) {
    if constexpr (kType == DType::Q4_K || kType == DType::Q5_K)
        k_halves_block<kTokens, kHalves, kType == DType::Q5_K>(sums, block, b, h0, x, ahead);
    else if constexpr (kType == DType::Q6_K || kType == DType::Q3_K)
        sixteen_column_halves_block<kType, kTokens, kHalves>(sums, block, b, h0, x, ahead);
    else if constexpr (kType == DType::Q2_K)
        q2_k_halves_block<kTokens, kHalves>(sums, block, b, h0, x, ahead);
    else
        iq4_xs_halves_block<kTokens, kHalves>(sums, block, b, h0, x, ahead);
}

// The rows [first, end) of the 16 of one tile (rows tile_row..tile_row + 15) against kTokens
// tokens: out[t · out_stride + row].
template <int kTokens, DType kType>
void tile_rows(float* out, size_t out_stride, int tile_row, int first, int end, const uint8_t* tile,
               int blocks, const TokenX* x, TilePrefetch prefetch) {
    constexpr int block_bytes = super_block_tile_bytes(kType);
    // The halves holding rows of [first, end).
    const int first_half = first - tile_row >= kTileHalfRows ? 1 : 0;
    const int end_half = end - tile_row <= kTileHalfRows ? 1 : kTileHalves;
    __m256 sums[kTileHalves][kTokens];
#pragma GCC unroll 4
    for (int t = 0; t < kTokens; ++t) sums[0][t] = sums[1][t] = _mm256_setzero_ps();
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = tile + size_t(b) * block_bytes;
        // The lines ahead, asked for in the first pass over the block.
        const LinesAhead ahead = lines_ahead(block, prefetch);
        // One token: both halves at once where the rows take both (with more tokens their
        // sums would not fit in the 16 registers); otherwise a half after the other.
        if constexpr (kTokens == 1) {
            if (first_half == 0 && end_half == kTileHalves) {
                halves_block<kType, kTokens, kTileHalves>(sums, block, b, 0, x, ahead);
                continue;
            }
        }
        for (int h = first_half; h < end_half; ++h)
            halves_block<kType, kTokens, 1>(sums, block, b, h, x,
                                            h == first_half ? ahead : LinesAhead{});
    }
    for (int h = first_half; h < end_half; ++h)
#pragma GCC unroll 4
        for (int t = 0; t < kTokens; ++t)
            store_rows(out + t * out_stride, sums[h][t], tile_row + h * kTileHalfRows, first, end);
}

// The kernels of each type for 1..kTileTokens tokens.
using TileKernel = void (*)(float*, size_t, int, int, int, const uint8_t*, int, const TokenX*,
                            TilePrefetch);
template <DType kType>
constexpr TileKernel kKernels[kTileTokens] = {tile_rows<1, kType>, tile_rows<2, kType>,
                                              tile_rows<3, kType>, tile_rows<4, kType>};

// IQ4_XS's kernel reads no sums of x.
void no_sums(std::vector<int32_t>* sums, const Q8KVector&) { sums->clear(); }

}  // namespace

void matvec_rows_block_tiles(float* out, size_t out_stride, const Matrix& w, const Q8KVector* x,
                             int tokens, int first_row, int row_count) {
    const TileKernel* kernels = w.dtype == DType::Q2_K   ? kKernels<DType::Q2_K>
                                : w.dtype == DType::Q3_K ? kKernels<DType::Q3_K>
                                : w.dtype == DType::Q4_K ? kKernels<DType::Q4_K>
                                : w.dtype == DType::Q5_K ? kKernels<DType::Q5_K>
                                : w.dtype == DType::Q6_K ? kKernels<DType::Q6_K>
                                                         : kKernels<DType::IQ4_XS>;
    const TokenX* token_x =
        tile_tokens(x, tokens,
                    w.dtype == DType::Q4_K || w.dtype == DType::Q5_K ? pair_sums_of_32
                    : w.dtype == DType::Q6_K || w.dtype == DType::Q3_K || w.dtype == DType::Q2_K
                        ? pair_sums_of_16
                        : no_sums);
    const int blocks = w.cols / kSuperBlock;
    const TilePrefetch prefetch = super_block_prefetch(w.dtype);
    const size_t bytes_per_tile = tile_bytes(w);
    const int end_row = first_row + row_count;
    for (int tile_row = first_row / kTileRows * kTileRows; tile_row < end_row;
         tile_row += kTileRows) {
        const uint8_t* tile = w.row_tiles + size_t(tile_row / kTileRows) * bytes_per_tile;
        // Only the first pass over a tile asks for the lines ahead: the later ones (more than
        // kTileTokens tokens) find them in cache.
        for (int t = 0; t < tokens; t += kTileTokens)
            kernels[std::min(kTileTokens, tokens - t) - 1](
                out + t * out_stride, out_stride, tile_row, first_row, end_row, tile, blocks,
                token_x + t, t == 0 ? prefetch : TilePrefetch{});
    }
}

}  // namespace barellm::cpu::avx2
