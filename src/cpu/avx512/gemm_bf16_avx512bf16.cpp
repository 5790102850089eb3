// The prefill GEMM on AVX512_BF16 for bf16 weights: out[token][row] = Σ_col W[row][col] ·
// bf16(x[token][col]), where bf16() rounds x to bf16, to nearest even (as a bf16 model's GEMM
// does elsewhere too): vdpbf16ps multiplies pairs of bf16, twice the products per instruction
// of an f32 FMA. The products and their sums are f32; only x loses digits, about 3 of its
// decimal digits (8 significant bits), so results differ from the f32 path's by that much.
//
// The outer-product design of gemm_float_avx512.cpp on pairs of columns:
// - x is packed into pair tiles of kGemmTokenTile = 16 tokens: lane t of pair p's register is
//   the 32-bit pair (x[t][2p], x[t][2p + 1]) in bf16 (pack_token_pair_tile).
// - Weights need neither widening nor copying: the two columns 2p, 2p + 1 of a row are one
//   32-bit pair in memory already, broadcast straight from the matrix. A block of kRowBlock
//   rows × kDepthPairs pairs stays in L2 while the tiles meet it, the next block prefetched
//   meanwhile. The lone last column of an odd width is copied, with a zero high half.
// - The micro-kernel keeps kRowTile rows × kTilesPerCall token tiles of sums in registers;
//   each step loads one register of x pairs per tile and broadcasts one weight pair per row.
#include <algorithm>
#include <array>
#include <cstring>
#include <utility>
#include <vector>

#include "cpu/avx512/avx512.h"
#include "cpu/avx512/helpers_avx512.h"

namespace barellm::cpu::avx512 {

namespace {

constexpr int kTilesPerCall = 2;            // token tiles one micro-kernel call computes
constexpr int kRowTile = 12;                // weight rows per call: 24 accumulators of 32
constexpr int kRowBlock = 8 * kRowTile;     // weight rows the token tiles meet together
constexpr int kDepthPairs = 256;            // column pairs of those (96 KB of L2)
constexpr int kTileWords = kGemmTokenTile;  // 32-bit pairs of one tile column

int pair_count(int cols) { return (cols + 1) / 2; }

// The 16 32-bit lanes of v as 32 bf16 values, for vdpbf16ps.
inline __m512bh as_bf16_pairs(__m512i v) { return (__m512bh)v; }

// For each of TILES token tiles t (x_pairs + t · x_tile_stride, sums + t · sums_tile_stride):
//   sums[r][k] += Σ_p Σ_{j=0,1} weights[r · weight_stride + 2p + j] · x_pairs[p][k].bf16[j]
// for r < ROWS, k < 16 tokens. Registers: ROWS × TILES accumulators and TILES of x pairs.
template <int ROWS, int TILES>
void pair_product_kernel(float* sums, size_t sums_tile_stride, const uint16_t* weights,
                         size_t weight_stride, const uint32_t* x_pairs, size_t x_tile_stride,
                         int pairs) {
    __m512 acc[TILES][ROWS];
#pragma GCC unroll 16
    for (int t = 0; t < TILES; ++t)
#pragma GCC unroll 16
        for (int r = 0; r < ROWS; ++r)
            acc[t][r] = _mm512_loadu_ps(sums + t * sums_tile_stride + r * kTileWords);
    RowAddresses<ROWS> rows(weights, weight_stride * sizeof(uint16_t));
    for (int p = 0; p < pairs; ++p) {
        __m512bh x[TILES];
#pragma GCC unroll 16
        for (int t = 0; t < TILES; ++t)
            x[t] = as_bf16_pairs(
                _mm512_loadu_si512(x_pairs + t * x_tile_stride + size_t(p) * kTileWords));
#pragma GCC unroll 16
        for (int r = 0; r < ROWS; ++r) {
            uint32_t pair;  // rows of an odd width are 2-byte aligned only
            std::memcpy(&pair, rows.row(r), sizeof pair);
            const __m512bh weight = as_bf16_pairs(_mm512_set1_epi32(int(pair)));
#pragma GCC unroll 16
            for (int t = 0; t < TILES; ++t) acc[t][r] = _mm512_dpbf16_ps(acc[t][r], weight, x[t]);
        }
        rows.advance(sizeof(uint32_t));  // one pair of columns
    }
#pragma GCC unroll 16
    for (int t = 0; t < TILES; ++t)
#pragma GCC unroll 16
        for (int r = 0; r < ROWS; ++r)
            _mm512_storeu_ps(sums + t * sums_tile_stride + r * kTileWords, acc[t][r]);
}

using PairProductKernel = void (*)(float* sums, size_t sums_tile_stride, const uint16_t* weights,
                                   size_t weight_stride, const uint32_t* x_pairs,
                                   size_t x_tile_stride, int pairs);

// kernels[tiles - 1][rows - 1]: every shape up to kTilesPerCall × kRowTile.
template <int TILES, int... ROWS_MINUS_ONE>
constexpr std::array<PairProductKernel, kRowTile> kernels_for_tiles(
    std::integer_sequence<int, ROWS_MINUS_ONE...>) {
    return {pair_product_kernel<ROWS_MINUS_ONE + 1, TILES>...};
}
constexpr std::array<PairProductKernel, kRowTile> kPairProductKernels[kTilesPerCall] = {
    kernels_for_tiles<1>(std::make_integer_sequence<int, kRowTile>()),
    kernels_for_tiles<2>(std::make_integer_sequence<int, kRowTile>())};
static_assert(kTilesPerCall == 2, "kPairProductKernels lists one entry per tile count");

}  // namespace

size_t token_pair_tiles_words(int batch, int cols) {
    const int tiles = (batch + kGemmTokenTile - 1) / kGemmTokenTile;
    return size_t(tiles) * pair_count(cols) * kTileWords + kTileWords;
}

// Token by token: 32 columns of x rounded to bf16 by one vcvtne2ps2bf16 are 16 pairs,
// which go to lane t of 16 tile columns.
void pack_token_pair_tile(uint32_t* pair_tiles, const float* x, int cols, int batch, int tile) {
    const int pairs = pair_count(cols);
    uint32_t* dest = pair_tiles + size_t(tile) * pairs * kTileWords;
    for (int t = 0; t < kGemmTokenTile; ++t) {
        const int token = tile * kGemmTokenTile + t;
        if (token >= batch) {
            for (int p = 0; p < pairs; ++p) dest[size_t(p) * kTileWords + t] = 0;
            continue;
        }
        const float* row = x + size_t(token) * cols;
        for (int first = 0; first < cols; first += 2 * kLanes) {
            const int left = cols - first;
            const __m512 low = _mm512_maskz_loadu_ps(first_lanes(left), row + first);
            const __m512 high = left > kLanes ? _mm512_maskz_loadu_ps(first_lanes(left - kLanes),
                                                                      row + first + kLanes)
                                              : _mm512_setzero_ps();
            uint32_t converted[kLanes];
            _mm512_storeu_si512(converted, (__m512i)_mm512_cvtne2ps_pbh(high, low));
            const int first_pair = first / 2;
            const int count = std::min(kLanes, pairs - first_pair);
            for (int j = 0; j < count; ++j)
                dest[size_t(first_pair + j) * kTileWords + t] = converted[j];
        }
    }
}

void gemm_rows_bf16(float* out, const Matrix& w, const uint32_t* pair_tiles, int batch,
                    int first_row, int row_count) {
    const int tiles = (batch + kGemmTokenTile - 1) / kGemmTokenTile;
    const size_t sums_tile_stride = size_t(kRowBlock) * kTileWords;
    const size_t x_tile_stride = size_t(pair_count(w.cols)) * kTileWords;
    // The partial sums of a block of rows, [tiles, kRowBlock, kGemmTokenTile], and the lone
    // last column of an odd width as pairs with a zero high half, both 64-byte aligned.
    static thread_local std::vector<float> sum_storage;
    static thread_local std::vector<uint16_t> lone_column_storage;
    sum_storage.resize(tiles * sums_tile_stride + kTileWords);
    lone_column_storage.resize(2 * (kRowBlock + kTileWords));
    float* sums = align64(sum_storage.data());
    uint16_t* lone_column = align64(lone_column_storage.data());
    const uint16_t* data = static_cast<const uint16_t*>(w.data);
    const int whole_pairs = w.cols / 2;
    const int end_row = first_row + row_count;
    for (int block = first_row; block < end_row; block += kRowBlock) {
        const int block_rows = std::min(kRowBlock, end_row - block);
        const int calls =
            (tiles + kTilesPerCall - 1) / kTilesPerCall * ((block_rows + kRowTile - 1) / kRowTile);
        // Pairs [first_pair, first_pair + pairs) of every row of the block, from `weights`
        // (row `block` of them), each x tile meeting every group of rows.
        auto multiply = [&](const uint16_t* weights, size_t weight_stride, int first_pair,
                            int pairs, PanelPrefetcher* prefetcher) {
            for (int tile = 0; tile < tiles; tile += kTilesPerCall) {
                const int tile_count = std::min(kTilesPerCall, tiles - tile);
                const uint32_t* x_pairs =
                    pair_tiles + tile * x_tile_stride + size_t(first_pair) * kTileWords;
                float* tile_sums = sums + tile * sums_tile_stride;
                for (int group = 0; group < block_rows; group += kRowTile) {
                    const int rows = std::min(kRowTile, block_rows - group);
                    if (prefetcher) prefetcher->before_call();
                    kPairProductKernels[tile_count - 1][rows - 1](
                        tile_sums + group * kTileWords, sums_tile_stride,
                        weights + group * weight_stride, weight_stride, x_pairs, x_tile_stride,
                        pairs);
                }
            }
        };
        std::fill(sums, sums + tiles * sums_tile_stride, 0.0f);
        // The whole pairs straight from the matrix, kDepthPairs at a time (a block of them
        // stays in L2 while the tiles meet it), the next block's prefetched meanwhile.
        const uint16_t* block_weights = data + size_t(block) * w.cols;
        for (int first_pair = 0; first_pair < whole_pairs; first_pair += kDepthPairs) {
            PanelPrefetcher prefetcher =
                next_panel_prefetcher(w, sizeof(uint16_t), block, end_row, 2 * first_pair,
                                      kRowBlock, 2 * kDepthPairs, calls);
            multiply(block_weights + 2 * first_pair, w.cols, first_pair,
                     std::min(kDepthPairs, whole_pairs - first_pair), &prefetcher);
        }
        if (w.cols % 2) {
            std::fill(lone_column, lone_column + 2 * block_rows, uint16_t(0));
            for (int r = 0; r < block_rows; ++r)
                lone_column[2 * r] = block_weights[size_t(r) * w.cols + w.cols - 1];
            multiply(lone_column, 2, whole_pairs, 1, nullptr);
        }
        for (int tile = 0; tile < tiles; ++tile)
            store_tile_sums(out + block, w.rows, sums + tile * sums_tile_stride, block_rows,
                            tile * kGemmTokenTile, batch);
    }
}

}  // namespace barellm::cpu::avx512
