// The decode matvec on AVX-512 + VNNI for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS weights read from
// their tiles of 16 rows (cpu/super_block_tiles.h): out[t][r] = W[r] · x_t for one token or a few,
// each x_t quantized per 256 as Q8_K (quantize_q8_k), each super-block's dot products in integers.
//
// Each int32 lane is a row. Q4_K: a register of a chunk holds four bytes of each row:
// vpdpbusd multiplies their low nibbles (q, unsigned 0..15; sub-block 2c) by four of x's
// values (signed bytes, broadcast to every lane) and their high nibbles, masked in place
// (16 · q; sub-block 2c + 1), by the four 32 columns on: over the chunk's 8 registers, each
// row's Σ q · x of both sub-blocks, the second 16 times too large, which an arithmetic shift
// takes off exactly. vpmulld by the sub-block scales (a byte a row, widened) and a sum over
// the chunks give Σ_j sc_j · Σ q · x exactly in int32 (at most 8 · 63 · 32 · 15 · 127). The
// mins, widened to words a pair of sub-blocks a register, meet x's sums of each 32 by
// vpdpwssd: Σ_j m_j · Σ x. Per super-block, a register of 16 f32 sums per token gains
// x.d · (d · Σ sc · q · x − dmin · Σ m · Σ x), d and dmin those of the 16 rows; the sums are
// the 16 outputs.
//
// Q5_K: as Q4_K, on levels 0..31 (at most 8 · 63 · 32 · 31 · 127 over a super-block): each
// byte of a register holds sub-block 2c's level in bits 0-4, masked out, and three bits of
// sub-block 2c + 1's in bits 5-7, shifted down and joined to its top two bits (bits 2c and
// 2c + 1 of the tile's top bits, rotated to bits 3 and 4).
//
// Q6_K: a sub-block of 16 columns is three registers, whose low 6 bits and top pairs of bits
// make four registers of levels q (0..63), four columns each (q6_k_tile_levels); its dot product
// starts from −32 · Σ x (x's sums of 16), so that vpdpbusd leaves Σ (q − 32) · x, which vpmulld
// scales by the int8 sub-block scales (at most 16 · 16 · 32 · 127 · 128 over a super-block); per
// super-block the f32 sums gain x.d · d · that.
//
// Q3_K: as Q6_K, on levels 0..7 with an offset of 4 (at most 16 · 32 · 16 · 4 · 128 over a
// super-block): a pair of sub-blocks is three registers, which hold six registers of levels in
// 3-bit fields and two more in their top bits (q3_k_tile_levels).
//
// Q2_K: a sub-block of 16 columns is one register, whose pairs of bits make four registers of
// levels q (0..3) (q2_k_tile_levels); vpdpbusd gives Σ q · x, which vpmulld scales by the 4-bit
// scales (at most 16 · 15 · 16 · 3 · 127 over a super-block). The scales and mins come a pair of
// sub-blocks a register, widened to words: the mins' high nibbles meet x's sums of each 16 by
// vpdpwssd, Σ_i m_i · Σ x. Per super-block, as Q4_K, the f32 sums gain
// x.d · (d · Σ sc · q · x − dmin · Σ m · Σ x).
//
// IQ4_XS: a sub-block of 32 columns is four registers, each of whose nibbles a vpshufb table
// turns into the level + 128 (1..241, unsigned), four columns of 16 rows a register; the dot
// product starts from −128 · Σ x (x's sums of 32), so that vpdpbusd leaves Σ level · x, which
// vpmulld scales by the sub-blocks' ls − 32 (at most 8 · 32 · 32 · 127 · 128 over a
// super-block); per super-block the f32 sums gain x.d · d · that.
//
// Where super_block_prefetch says so, each step over a super-block asks for its share of the
// lines of the next super-block (prefetch_share: into the next tile at a tile's end; past the
// matrix only a hint), a line or two at a time.
//
// Tokens share each register of weights: up to kTileTokens at a time, as many as gemm_many
// sends here (a step of 8 sequences then reads each tile once). Each token keeps a few
// accumulators (Q4_K four: two of a chunk, one of the super-block, one of f32 sums): at 8
// tokens some spill to L1, which measured faster than a second pass over the tile (Q4_K,
// TinyLlama's ffn shape in cache, Zen 4, 8 tokens: 0.26 ms against 0.32 in passes of 4; one
// token at a time on the rows, 1.57). More tokens go over the tile again, by then in cache.
#include <algorithm>
#include <vector>

#include "cpu/avx512/avx512.h"
#include "cpu/avx512/helpers_avx512.h"
#include "cpu/super_block_tiles.h"

namespace barellm::cpu::avx512 {

namespace {

constexpr int kTileTokens = 8;                            // tokens a pass over a tile
constexpr int kSumsPerBlock = kSuperBlock / kQ6SubBlock;  // Q8KVector::sums a super-block
constexpr int kMinPairs = kKSubBlocks / 2;                // pairs of sub-blocks a super-block
constexpr int kHighNibbleShift = 4;

// A token's x (TileTokenX) carries in `sums`, per type:
// - Q4_K, Q5_K: per pair of sub-blocks (2p, 2p + 1) their sums of 32 values (pair_sums_of_32);
// - Q2_K: per pair of sub-blocks (2p, 2p + 1) their sums of 16 values (pair_sums_of_16);
// - Q6_K, Q3_K: per 16 values −32 or −4 · their sum (offsets_of_16);
// - IQ4_XS: per 32 values −128 · their sum (iq4_xs_offsets).
using TokenX = TileTokenX;

// −kOffset · x's sums of 16 into `offsets` [n / 16].
template <int kOffset>
void offsets_of_16(std::vector<int32_t>* offsets, const Q8KVector& x) {
    offsets->resize(x.sums.size());
    for (size_t i = 0; i < x.sums.size(); ++i) (*offsets)[i] = -kOffset * x.sums[i];
}

// The 16 rows of one Q4_K (kFifthBit false) or Q5_K tile against kTokens tokens:
// out[t · out_stride + lane] for the lanes of `store`.
template <int kTokens, bool kFifthBit>
void k_tile_rows(float* out, size_t out_stride, __mmask16 store, const uint8_t* tile, int blocks,
                 const TokenX* x, TilePrefetch prefetch) {
    constexpr int kBlockBytes = kFifthBit ? kQ5KTileBlockBytes : kQ4KTileBlockBytes;
    const __m512i low_nibbles = _mm512_set1_epi8(0x0f), high_nibbles = _mm512_set1_epi8(-16);
    // Q5_K's masks: sub-block 2c's level; sub-block 2c + 1's low three bits and top two.
    const __m512i low_five_bits = _mm512_set1_epi8(0x1f), low_three_bits = _mm512_set1_epi8(0x07);
    const __m512i top_two_bits = _mm512_set1_epi8(0x18);
    __m512 sums[kTokens];
#pragma GCC unroll 8
    for (int t = 0; t < kTokens; ++t) sums[t] = _mm512_setzero_ps();
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = tile + size_t(b) * kBlockBytes;
        const LinesAhead ahead = lines_ahead(block, prefetch);
        __m512i dots[kTokens];  // Σ_j sc_j · Σ q · x
#pragma GCC unroll 8
        for (int t = 0; t < kTokens; ++t) dots[t] = _mm512_setzero_si512();
        for (int c = 0; c < kQ4KChunks; ++c) {
            const uint8_t* values =
                block + k_tile_values_offset(kFifthBit) + c * kQ4KTileChunkBytes;
            // Q5_K: the rotation (left, in 32-bit lanes) that moves bits 2c and 2c + 1 of each
            // byte of the top bits to bits 3 and 4.
            const __m512i top_rotation = _mm512_set1_epi32((3 - 2 * c) & 31);
            __m512i low[kTokens], high[kTokens];
#pragma GCC unroll 8
            for (int t = 0; t < kTokens; ++t) low[t] = high[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int k = 0; k < kQ4KChunkRegisters; ++k) {
                prefetch_share<kBlockBytes / kCacheLine, kQ4KChunks * kQ4KChunkRegisters>(
                    ahead, c * kQ4KChunkRegisters + k);
                const __m512i bytes = _mm512_load_si512(values + k * kTileRegisterBytes);
                __m512i q, q16;  // the low nibbles' levels; the high ones' (Q4_K: 16 times)
                if constexpr (kFifthBit) {
                    const __m512i top_bits =
                        _mm512_load_si512(block + kQ5KTileHighOffset + k * kTileRegisterBytes);
                    q = _mm512_and_si512(bytes, low_five_bits);
                    q16 = _mm512_ternarylogic_epi32(
                        _mm512_srli_epi16(bytes, kQ5KLowBits), low_three_bits,
                        _mm512_and_si512(_mm512_rolv_epi32(top_bits, top_rotation), top_two_bits),
                        kAndOr);
                } else {
                    q = _mm512_and_si512(bytes, low_nibbles);
                    q16 = _mm512_and_si512(bytes, high_nibbles);
                }
#pragma GCC unroll 8
                for (int t = 0; t < kTokens; ++t) {
                    const int8_t* xc =
                        x[t].values + size_t(b) * kSuperBlock + c * 2 * kSubBlock + k * 4;
                    low[t] = _mm512_dpbusd_epi32(low[t], q, broadcast_word(xc));
                    high[t] = _mm512_dpbusd_epi32(high[t], q16, broadcast_word(xc + kSubBlock));
                }
            }
            const __m512i low_scales =
                _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(
                    block + kQ4KTileScalesOffset + kTileRows * 2 * c)));
            const __m512i high_scales =
                _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(
                    block + kQ4KTileScalesOffset + kTileRows * (2 * c + 1))));
#pragma GCC unroll 8
            for (int t = 0; t < kTokens; ++t)
                dots[t] = _mm512_add_epi32(
                    dots[t],
                    _mm512_add_epi32(
                        _mm512_mullo_epi32(low[t], low_scales),
                        _mm512_mullo_epi32(
                            kFifthBit ? high[t] : _mm512_srai_epi32(high[t], kHighNibbleShift),
                            high_scales)));
        }
        __m512i mins[kMinPairs];
#pragma GCC unroll 4
        for (int p = 0; p < kMinPairs; ++p)
            mins[p] = _mm512_cvtepu8_epi16(_mm256_load_si256(
                reinterpret_cast<const __m256i*>(block + kQ4KTileMinsOffset + 2 * kTileRows * p)));
        const __m512 d = _mm512_cvtph_ps(
            _mm256_load_si256(reinterpret_cast<const __m256i*>(block + kQ4KTileDOffset)));
        const __m512 dmin = _mm512_cvtph_ps(
            _mm256_load_si256(reinterpret_cast<const __m256i*>(block + kQ4KTileDMinOffset)));
#pragma GCC unroll 8
        for (int t = 0; t < kTokens; ++t) {
            __m512i min_dots = _mm512_setzero_si512();  // Σ_j m_j · Σ x
#pragma GCC unroll 4
            for (int p = 0; p < kMinPairs; ++p)
                min_dots = _mm512_dpwssd_epi32(min_dots, mins[p],
                                               _mm512_set1_epi32(x[t].sums[b * kMinPairs + p]));
            const __m512 x_d = _mm512_set1_ps(x[t].d[b]);
            sums[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[t]), _mm512_mul_ps(d, x_d), sums[t]);
            sums[t] =
                _mm512_fnmadd_ps(_mm512_cvtepi32_ps(min_dots), _mm512_mul_ps(dmin, x_d), sums[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < kTokens; ++t) _mm512_mask_storeu_ps(out + t * out_stride, store, sums[t]);
}

// Super-block b's share of the sums of 16 rows and kTokens tokens, where each row has one d
// (Q6_K, IQ4_XS): sums[t] += x_t.d[b] · d · dots[t], d the rows' f16 at `d_at`.
template <int kTokens>
inline void add_block_sums(__m512* sums, const __m512i* dots, const uint8_t* d_at, const TokenX* x,
                           int b) {
    const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(d_at)));
#pragma GCC unroll 8
    for (int t = 0; t < kTokens; ++t)
        sums[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[t]),
                                  _mm512_mul_ps(d, _mm512_set1_ps(x[t].d[b])), sums[t]);
}

// The 16 rows of one Q6_K or Q3_K tile (sub-blocks of 16 columns, an int8 scale each) against
// kTokens tokens, as k_tile_rows.
template <int kTokens, DType kType>
void sixteen_column_tile_rows(float* out, size_t out_stride, __mmask16 store, const uint8_t* tile,
                              int blocks, const TokenX* x, TilePrefetch prefetch) {
    static_assert(kQ6KTileDOffset == kQ3KTileDOffset &&
                  kQ6KTileScalesOffset == kQ3KTileScalesOffset && kQ6KSubBlocks == kQ3KSubBlocks);
    constexpr int kBlockBytes = super_block_tile_bytes(kType);
    __m512 sums[kTokens];
#pragma GCC unroll 8
    for (int t = 0; t < kTokens; ++t) sums[t] = _mm512_setzero_ps();
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = tile + size_t(b) * kBlockBytes;
        const LinesAhead ahead = lines_ahead(block, prefetch);
        __m512i dots[kTokens];  // Σ_i sc_i · Σ (q − offset) · x
#pragma GCC unroll 8
        for (int t = 0; t < kTokens; ++t) dots[t] = _mm512_setzero_si512();
        for (int i = 0; i < kQ6KSubBlocks; ++i) {
            prefetch_share<kBlockBytes / kCacheLine, kQ6KSubBlocks>(ahead, i);
            __m512i q[4];  // levels of columns 4s..4s + 3 of the sub-block
            if constexpr (kType == DType::Q6_K)
                q6_k_tile_levels(block, i, q);
            else
                q3_k_tile_levels(block, i, q);
            const __m512i scales = _mm512_cvtepi8_epi32(_mm_load_si128(
                reinterpret_cast<const __m128i*>(block + kQ6KTileScalesOffset + kTileRows * i)));
#pragma GCC unroll 8
            for (int t = 0; t < kTokens; ++t) {
                const int8_t* xi = x[t].values + size_t(b) * kSuperBlock + i * kQ6SubBlock;
                __m512i dot = _mm512_set1_epi32(x[t].sums[b * kQ6KSubBlocks + i]);
#pragma GCC unroll 4
                for (int s = 0; s < 4; ++s)
                    dot = _mm512_dpbusd_epi32(dot, q[s], broadcast_word(xi + 4 * s));
                dots[t] = _mm512_add_epi32(dots[t], _mm512_mullo_epi32(dot, scales));
            }
        }
        add_block_sums<kTokens>(sums, dots, block + kQ6KTileDOffset, x, b);
    }
#pragma GCC unroll 8
    for (int t = 0; t < kTokens; ++t) _mm512_mask_storeu_ps(out + t * out_stride, store, sums[t]);
}

// The 16 rows of one Q2_K tile against kTokens tokens, as k_tile_rows.
template <int kTokens>
void q2_k_tile_rows(float* out, size_t out_stride, __mmask16 store, const uint8_t* tile, int blocks,
                    const TokenX* x, TilePrefetch prefetch) {
    constexpr int kPairs = kQ2KSubBlocks / 2;
    const __m512i low_word_nibble = _mm512_set1_epi32(0x0f);
    __m512 sums[kTokens];
#pragma GCC unroll 8
    for (int t = 0; t < kTokens; ++t) sums[t] = _mm512_setzero_ps();
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = tile + size_t(b) * kQ2KTileBlockBytes;
        const LinesAhead ahead = lines_ahead(block, prefetch);
        __m512i dots[kTokens], min_dots[kTokens];  // Σ_i sc_i · Σ q · x; Σ_i m_i · Σ x
#pragma GCC unroll 8
        for (int t = 0; t < kTokens; ++t) dots[t] = min_dots[t] = _mm512_setzero_si512();
        for (int p = 0; p < kPairs; ++p) {
            // Lane r: the scales bytes of sub-blocks 2p and 2p + 1 of row r, a word each.
            const __m512i packed =
                _mm512_cvtepu8_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(
                    block + kQ2KTileScalesOffset + 2 * kTileRows * p)));
            const __m512i scales[2] = {
                _mm512_and_si512(packed, low_word_nibble),
                _mm512_and_si512(_mm512_srli_epi32(packed, 16), low_word_nibble)};
#pragma GCC unroll 2
            for (int half = 0; half < 2; ++half) {
                const int i = 2 * p + half;
                prefetch_share<kQ2KTileBlockBytes / kCacheLine, kQ2KSubBlocks>(ahead, i);
                __m512i q[4];  // levels of columns 4s..4s + 3 of the sub-block
                q2_k_tile_levels(block, i, q);
#pragma GCC unroll 8
                for (int t = 0; t < kTokens; ++t) {
                    const int8_t* xi = x[t].values + size_t(b) * kSuperBlock + i * kQ6SubBlock;
                    __m512i dot = _mm512_setzero_si512();
#pragma GCC unroll 4
                    for (int s = 0; s < 4; ++s)
                        dot = _mm512_dpbusd_epi32(dot, q[s], broadcast_word(xi + 4 * s));
                    dots[t] = _mm512_add_epi32(dots[t], _mm512_mullo_epi32(dot, scales[half]));
                }
            }
            const __m512i mins = _mm512_srli_epi16(packed, kQ2KMinShift);
#pragma GCC unroll 8
            for (int t = 0; t < kTokens; ++t)
                min_dots[t] = _mm512_dpwssd_epi32(min_dots[t], mins,
                                                  _mm512_set1_epi32(x[t].sums[b * kPairs + p]));
        }
        const __m512 d = _mm512_cvtph_ps(
            _mm256_load_si256(reinterpret_cast<const __m256i*>(block + kQ2KTileDOffset)));
        const __m512 dmin = _mm512_cvtph_ps(
            _mm256_load_si256(reinterpret_cast<const __m256i*>(block + kQ2KTileDMinOffset)));
#pragma GCC unroll 8
        for (int t = 0; t < kTokens; ++t) {
            const __m512 x_d = _mm512_set1_ps(x[t].d[b]);
            sums[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[t]), _mm512_mul_ps(d, x_d), sums[t]);
            sums[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(min_dots[t]), _mm512_mul_ps(dmin, x_d),
                                       sums[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < kTokens; ++t) _mm512_mask_storeu_ps(out + t * out_stride, store, sums[t]);
}

// −128 · x's sums of 32 into `offsets` [n / 32].
void iq4_xs_offsets(std::vector<int32_t>* offsets, const Q8KVector& x) {
    offsets->resize(x.sums.size() / 2);
    for (size_t j = 0; j < offsets->size(); ++j)
        (*offsets)[j] = -kIq4Excess * (x.sums[2 * j] + x.sums[2 * j + 1]);
}

// The 16 rows of one IQ4_XS tile against kTokens tokens, as k_tile_rows.
template <int kTokens>
void iq4_xs_tile_rows(float* out, size_t out_stride, __mmask16 store, const uint8_t* tile,
                      int blocks, const TokenX* x, TilePrefetch prefetch) {
    const __m512i low_nibbles = _mm512_set1_epi8(0x0f), table = iq4_unsigned_levels();
    __m512 sums[kTokens];
#pragma GCC unroll 8
    for (int t = 0; t < kTokens; ++t) sums[t] = _mm512_setzero_ps();
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = tile + size_t(b) * kIq4XSTileBlockBytes;
        const LinesAhead ahead = lines_ahead(block, prefetch);
        __m512i dots[kTokens];  // Σ_j (ls_j − 32) · Σ level · x
#pragma GCC unroll 8
        for (int t = 0; t < kTokens; ++t) dots[t] = _mm512_setzero_si512();
        for (int j = 0; j < kIq4XSSubBlocks; ++j) {
            const uint8_t* values = block + kIq4XSTileValuesOffset + j * kIq4XSTileSubBlockBytes;
            __m512i dot[kTokens];
#pragma GCC unroll 8
            for (int t = 0; t < kTokens; ++t)
                dot[t] = _mm512_set1_epi32(x[t].sums[b * kIq4XSSubBlocks + j]);
#pragma GCC unroll 4
            for (int k = 0; k < kIq4XSSubBlockRegisters; ++k) {
                prefetch_share<kIq4XSTileBlockBytes / kCacheLine,
                               kIq4XSSubBlocks * kIq4XSSubBlockRegisters>(
                    ahead, j * kIq4XSSubBlockRegisters + k);
                const __m512i bytes = _mm512_load_si512(values + k * kTileRegisterBytes);
                const __m512i low =
                    _mm512_shuffle_epi8(table, _mm512_and_si512(bytes, low_nibbles));
                const __m512i high = _mm512_shuffle_epi8(
                    table, _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low_nibbles));
#pragma GCC unroll 8
                for (int t = 0; t < kTokens; ++t) {
                    const int8_t* xj =
                        x[t].values + size_t(b) * kSuperBlock + j * kSubBlock + k * 4;
                    dot[t] = _mm512_dpbusd_epi32(dot[t], low, broadcast_word(xj));
                    dot[t] = _mm512_dpbusd_epi32(dot[t], high, broadcast_word(xj + kSubBlock / 2));
                }
            }
            const __m512i scales = _mm512_cvtepi8_epi32(_mm_load_si128(
                reinterpret_cast<const __m128i*>(block + kIq4XSTileScalesOffset + kTileRows * j)));
#pragma GCC unroll 8
            for (int t = 0; t < kTokens; ++t)
                dots[t] = _mm512_add_epi32(dots[t], _mm512_mullo_epi32(dot[t], scales));
        }
        add_block_sums<kTokens>(sums, dots, block + kIq4XSTileDOffset, x, b);
    }
#pragma GCC unroll 8
    for (int t = 0; t < kTokens; ++t) _mm512_mask_storeu_ps(out + t * out_stride, store, sums[t]);
}

// The kernels of each type for 1..kTileTokens tokens.
using TileKernel = void (*)(float*, size_t, __mmask16, const uint8_t*, int, const TokenX*,
                            TilePrefetch);
template <bool kFifthBit>
constexpr TileKernel kKKernels[kTileTokens] = {
    k_tile_rows<1, kFifthBit>, k_tile_rows<2, kFifthBit>, k_tile_rows<3, kFifthBit>,
    k_tile_rows<4, kFifthBit>, k_tile_rows<5, kFifthBit>, k_tile_rows<6, kFifthBit>,
    k_tile_rows<7, kFifthBit>, k_tile_rows<8, kFifthBit>};
template <DType kType>
constexpr TileKernel kSixteenColumnKernels[kTileTokens] = {
    sixteen_column_tile_rows<1, kType>, sixteen_column_tile_rows<2, kType>,
    sixteen_column_tile_rows<3, kType>, sixteen_column_tile_rows<4, kType>,
    sixteen_column_tile_rows<5, kType>, sixteen_column_tile_rows<6, kType>,
    sixteen_column_tile_rows<7, kType>, sixteen_column_tile_rows<8, kType>};
constexpr TileKernel kQ2KKernels[kTileTokens] = {
    q2_k_tile_rows<1>, q2_k_tile_rows<2>, q2_k_tile_rows<3>, q2_k_tile_rows<4>,
    q2_k_tile_rows<5>, q2_k_tile_rows<6>, q2_k_tile_rows<7>, q2_k_tile_rows<8>};
constexpr TileKernel kIq4XSKernels[kTileTokens] = {
    iq4_xs_tile_rows<1>, iq4_xs_tile_rows<2>, iq4_xs_tile_rows<3>, iq4_xs_tile_rows<4>,
    iq4_xs_tile_rows<5>, iq4_xs_tile_rows<6>, iq4_xs_tile_rows<7>, iq4_xs_tile_rows<8>};

}  // namespace

void matvec_rows_block_tiles(float* out, size_t out_stride, const Matrix& w, const Q8KVector* x,
                             int tokens, int first_row, int row_count) {
    static_assert(kSumsPerBlock == 4 * kMinPairs && kSumsPerBlock == kQ6KSubBlocks);
    const bool with_mins = w.dtype == DType::Q4_K || w.dtype == DType::Q5_K;
    const TileKernel* kernels = w.dtype == DType::Q2_K   ? kQ2KKernels
                                : w.dtype == DType::Q3_K ? kSixteenColumnKernels<DType::Q3_K>
                                : w.dtype == DType::Q4_K ? kKKernels<false>
                                : w.dtype == DType::Q5_K ? kKKernels<true>
                                : w.dtype == DType::Q6_K ? kSixteenColumnKernels<DType::Q6_K>
                                                         : kIq4XSKernels;
    const TokenX* token_x = tile_tokens(x, tokens,
                                        with_mins                ? pair_sums_of_32
                                        : w.dtype == DType::Q2_K ? pair_sums_of_16
                                        : w.dtype == DType::Q6_K ? offsets_of_16<kQ6KLevelOffset>
                                        : w.dtype == DType::Q3_K ? offsets_of_16<kQ3KLevelOffset>
                                                                 : iq4_xs_offsets);
    const int blocks = w.cols / kSuperBlock;
    const TilePrefetch prefetch = super_block_prefetch(w.dtype);
    const size_t bytes_per_tile = tile_bytes(w);
    const int end_row = first_row + row_count;
    // Whole tiles; a tile the run shares with another thread's is computed by both, each
    // storing its own rows.
    for (int tile_row = first_row / kTileRows * kTileRows; tile_row < end_row;
         tile_row += kTileRows) {
        const uint8_t* tile = w.row_tiles + size_t(tile_row / kTileRows) * bytes_per_tile;
        const __mmask16 store = lanes_in(tile_row, first_row, end_row);
        // Only the first pass over a tile asks for the lines ahead: the later ones (more than
        // kTileTokens tokens) find them in cache.
        for (int t = 0; t < tokens; t += kTileTokens)
            kernels[std::min(kTileTokens, tokens - t) - 1](
                out + t * out_stride + tile_row, out_stride, store, tile, blocks, token_x + t,
                t == 0 ? prefetch : TilePrefetch{});
    }
}

}  // namespace barellm::cpu::avx512
