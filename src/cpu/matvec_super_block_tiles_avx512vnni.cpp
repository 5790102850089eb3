// The decode matvec on AVX-512 + VNNI for Q4_K weights read from their tiles of 16 rows
// (cpu/super_block_tiles.h): out[t][r] = W[r] · x_t for one token or a few, each x_t quantized
// per 256 as Q8_K (quantize_q8_k), each super-block's dot products in integers.
//
// Each int32 lane is a row. A register of a chunk holds four bytes of each row: vpdpbusd
// multiplies their low nibbles (q, unsigned 0..15; sub-block 2c) by four of x's values
// (signed bytes, broadcast to every lane) and their high nibbles, masked in place (16 · q;
// sub-block 2c + 1), by the four 32 columns on: over the chunk's 8 registers, each row's
// Σ q · x of both sub-blocks, the second 16 times too large, which an arithmetic shift takes
// off exactly. vpmulld by the sub-block scales (a byte a row, widened) and a sum over the
// chunks give Σ_j sc_j · Σ q · x exactly in int32 (at most 8 · 63 · 32 · 15 · 127). The mins,
// widened to words a pair of sub-blocks a register, meet x's sums of each 32 by vpdpwssd:
// Σ_j m_j · Σ x. Per super-block, a register of 16 f32 sums per token gains
// x.d · (d · Σ sc · q · x − dmin · Σ m · Σ x), d and dmin those of the 16 rows; the sums are
// the 16 outputs.
//
// Tokens share each register of weights: up to kTileTokens at a time, as many as gemm_many
// sends here (a step of 8 sequences then reads each tile once). Each token keeps four
// accumulators (two of a chunk, one of the super-block, one of f32 sums): at 8 tokens a few
// spill to L1, which measured faster than a second pass over the tile (TinyLlama's ffn shape in
// cache, Zen 4, 8 tokens: 0.26 ms against 0.32 in passes of 4; one token at a time on the
// rows, 1.57). More tokens go over the tile again, by then in cache.
#include <algorithm>
#include <vector>

#include "cpu/avx512.h"
#include "cpu/helpers_avx512.h"
#include "cpu/super_block_tiles.h"

namespace barellm::cpu::avx512 {

namespace {

constexpr int kTileTokens = 8;                            // tokens a pass over a tile
constexpr int kSumsPerBlock = kSuperBlock / kQ6SubBlock;  // Q8KVector::sums a super-block
constexpr int kMinPairs = kKSubBlocks / 2;                // pairs of sub-blocks a super-block
constexpr int kHighNibbleShift = 4;

// One token's x as the kernel reads it: Q8_K values and d, and per pair of sub-blocks
// (2p, 2p + 1) their sums of 32 values as two int16 in an int32 (the low one 2p's).
struct TokenX {
    const int8_t* values;
    const float* d;
    const int32_t* min_pairs;
};

// The sums of 32 of x, by pairs, into `pairs` [n / 64].
void pair_sums(std::vector<int32_t>* pairs, const Q8KVector& x) {
    const size_t count = x.values.size() / (2 * kSubBlock);
    pairs->resize(count);
    for (size_t p = 0; p < count; ++p) {
        const int16_t* sums = x.sums.data() + 4 * p;  // four sums of 16
        const int first = sums[0] + sums[1], second = sums[2] + sums[3];
        (*pairs)[p] = int32_t(uint32_t(uint16_t(first)) | uint32_t(uint16_t(second)) << 16);
    }
}

// The 16 rows of one tile against kTokens tokens: out[t · out_stride + lane] for the lanes of
// `store`.
template <int kTokens>
void tile_rows(float* out, size_t out_stride, __mmask16 store, const uint8_t* tile, int blocks,
               const TokenX* x) {
    const __m512i low_nibbles = _mm512_set1_epi8(0x0f), high_nibbles = _mm512_set1_epi8(-16);
    __m512 sums[kTokens];
#pragma GCC unroll 8
    for (int t = 0; t < kTokens; ++t) sums[t] = _mm512_setzero_ps();
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = tile + size_t(b) * kQ4KTileBlockBytes;
        __m512i dots[kTokens];  // Σ_j sc_j · Σ q · x
#pragma GCC unroll 8
        for (int t = 0; t < kTokens; ++t) dots[t] = _mm512_setzero_si512();
        for (int c = 0; c < kQ4KChunks; ++c) {
            const uint8_t* values = block + kQ4KTileValuesOffset + c * kQ4KTileChunkBytes;
            __m512i low[kTokens], high[kTokens];
#pragma GCC unroll 8
            for (int t = 0; t < kTokens; ++t) low[t] = high[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int k = 0; k < kQ4KChunkRegisters; ++k) {
                const __m512i bytes = _mm512_load_si512(values + k * kTileRegisterBytes);
                const __m512i q = _mm512_and_si512(bytes, low_nibbles);
                const __m512i q16 = _mm512_and_si512(bytes, high_nibbles);
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
                    dots[t], _mm512_add_epi32(
                                 _mm512_mullo_epi32(low[t], low_scales),
                                 _mm512_mullo_epi32(_mm512_srai_epi32(high[t], kHighNibbleShift),
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
                min_dots = _mm512_dpwssd_epi32(
                    min_dots, mins[p], _mm512_set1_epi32(x[t].min_pairs[b * kMinPairs + p]));
            const __m512 x_d = _mm512_set1_ps(x[t].d[b]);
            sums[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[t]), _mm512_mul_ps(d, x_d), sums[t]);
            sums[t] =
                _mm512_fnmadd_ps(_mm512_cvtepi32_ps(min_dots), _mm512_mul_ps(dmin, x_d), sums[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < kTokens; ++t) _mm512_mask_storeu_ps(out + t * out_stride, store, sums[t]);
}

}  // namespace

void matvec_rows_q4_k_tiles(float* out, size_t out_stride, const Matrix& w, const Q8KVector* x,
                            int tokens, int first_row, int row_count) {
    static_assert(kSumsPerBlock == 4 * kMinPairs);
    using Kernel = void (*)(float*, size_t, __mmask16, const uint8_t*, int, const TokenX*);
    static constexpr Kernel kernels[kTileTokens] = {tile_rows<1>, tile_rows<2>, tile_rows<3>,
                                                    tile_rows<4>, tile_rows<5>, tile_rows<6>,
                                                    tile_rows<7>, tile_rows<8>};
    // Each token's sums of 32 by pairs, this thread's, kept from call to call.
    static thread_local std::vector<std::vector<int32_t>> pairs;
    if (pairs.size() < size_t(tokens)) pairs.resize(tokens);
    static thread_local std::vector<TokenX> token_x;
    token_x.resize(tokens);
    for (int t = 0; t < tokens; ++t) {
        pair_sums(&pairs[t], x[t]);
        token_x[t] = {x[t].values.data(), x[t].d.data(), pairs[t].data()};
    }
    const int blocks = w.cols / kSuperBlock;
    const size_t bytes_per_tile = tile_bytes(w);
    const int end_row = first_row + row_count;
    // Whole tiles; a tile the run shares with another thread's is computed by both, each
    // storing its own rows.
    for (int tile_row = first_row / kTileRows * kTileRows; tile_row < end_row;
         tile_row += kTileRows) {
        const uint8_t* tile = w.row_tiles + size_t(tile_row / kTileRows) * bytes_per_tile;
        const __mmask16 store = lanes_in(tile_row, first_row, end_row);
        for (int t = 0; t < tokens; t += kTileTokens)
            kernels[std::min(kTileTokens, tokens - t) - 1](out + t * out_stride + tile_row,
                                                           out_stride, store, tile, blocks,
                                                           token_x.data() + t);
    }
}

}  // namespace barellm::cpu::avx512
