// The prefill GEMM on AVX-512 for f32, f16 and bf16 weights: out[token][row] = Σ_col
// W[row][col] · x[token][col] for a batch of tokens, each weight row read from memory once for
// the batch.
//
// The design of the AVX2 GEMM (gemm_avx2.cpp) on zmm registers, a sum of outer products:
// - x comes transposed into tiles of kGemmTokenTile = 16 tokens: one column of a tile is
//   one register.
// - A block of kRowBlock weight rows is converted to f32 one block of kDepthBlock columns at a
//   time (panel[row][col]); the panel stays in L2 while the token tiles meet all its rows,
//   the weights of the next panel prefetched meanwhile.
// - The micro-kernel (outer_product_kernel, helpers_avx512.h) keeps kRowTile rows ×
//   kTilesPerCall token tiles of outputs in kRowTile · kTilesPerCall registers. Each step
//   loads one register of x per tile and multiplies it by one weight per row, broadcast
//   from the panel.
// - Partial sums live in a contiguous buffer until the last column block, then are
//   transposed into the strided output once.
#include <algorithm>
#include <vector>

#include "cpu/avx512/avx512.h"
#include "cpu/avx512/helpers_avx512.h"

namespace barellm::cpu::avx512 {

namespace {

constexpr int kTilesPerCall = kOuterProductTiles;  // token tiles one micro-kernel call computes
constexpr int kRowTile = kOuterProductRows;        // weight rows per micro-kernel call
constexpr int kRowBlock = 8 * kRowTile;            // weight rows converted to f32 together
constexpr int kDepthBlock = 256;   // weight columns converted together (96 KB of L2)
constexpr int kPackAheadRows = 8;  // packing asks for the weights of the row this far ahead

// panel[r][i] = W[first_row + r][first_col + i] as f32, for `rows` rows.
template <DType kType>
void pack_rows(float* panel, const Matrix& w, int first_row, int rows, int first_col, int depth) {
    const size_t element_bytes = kType == DType::F32 ? 4 : 2;
    const uint8_t* data = static_cast<const uint8_t*>(w.data);
    for (int r = 0; r < rows; ++r) {
        float* dest = panel + r * kDepthBlock;
        const uint8_t* source = data + (size_t(first_row + r) * w.cols + first_col) * element_bytes;
        // The panel's rows lie a matrix row apart: each row's lines are requested while the
        // rows before it are converted, instead of when its own loads miss.
        if (r + kPackAheadRows < rows)
            prefetch_ahead(source, int(kPackAheadRows * w.cols * element_bytes),
                           int(depth * element_bytes));
        int i = 0;
        for (; i + kLanes <= depth; i += kLanes)
            _mm512_storeu_ps(dest + i, widen16<kType>(source + i * element_bytes));
        if (i < depth) {
            const __mmask16 mask = first_lanes(depth - i);
            _mm512_mask_storeu_ps(dest + i, mask, widen16<kType>(source + i * element_bytes, mask));
        }
    }
}

template <DType kType>
void batch_rows(float* out, const Matrix& w, const float* x_tiles, int batch, int first_row,
                int row_count) {
    const int tiles = (batch + kGemmTokenTile - 1) / kGemmTokenTile;
    const size_t sums_tile_stride = size_t(kRowBlock) * kTileFloats;
    const size_t x_tile_stride = size_t(w.cols) * kTileFloats;
    // One block of weight rows converted to f32, [kRowBlock, kDepthBlock], and its partial
    // sums [tiles, kRowBlock, kGemmTokenTile], both 64-byte aligned.
    static thread_local std::vector<float> panel_storage, sum_storage;
    panel_storage.resize(kRowBlock * kDepthBlock + kLanes);
    sum_storage.resize(tiles * sums_tile_stride + kLanes);
    float* panel = align64(panel_storage.data());
    float* sums = align64(sum_storage.data());
    const int end_row = first_row + row_count;
    for (int block = first_row; block < end_row; block += kRowBlock) {
        const int block_rows = std::min(kRowBlock, end_row - block);
        std::fill(sums, sums + tiles * sums_tile_stride, 0.0f);
        for (int depth_start = 0; depth_start < w.cols; depth_start += kDepthBlock) {
            const int depth = std::min(kDepthBlock, w.cols - depth_start);
            pack_rows<kType>(panel, w, block, block_rows, depth_start, depth);
            // Each pair of x tiles, loaded into L1 once, meets every row group of the block.
            const int calls = (tiles + kTilesPerCall - 1) / kTilesPerCall *
                              ((block_rows + kRowTile - 1) / kRowTile);
            PanelPrefetcher prefetcher =
                next_panel_prefetcher(w, kType == DType::F32 ? 4 : 2, block, end_row, depth_start,
                                      kRowBlock, kDepthBlock, calls);
            for (int tile = 0; tile < tiles; tile += kTilesPerCall) {
                const int tile_count = std::min(kTilesPerCall, tiles - tile);
                const float* x_tile = x_tiles + tile * x_tile_stride + depth_start * kTileFloats;
                float* tile_sums = sums + tile * sums_tile_stride;
                for (int group = 0; group < block_rows; group += kRowTile) {
                    const int rows = std::min(kRowTile, block_rows - group);
                    prefetcher.before_call();
                    outer_product_kernel_for(rows, tile_count)(
                        tile_sums + group * kTileFloats, sums_tile_stride,
                        panel + group * kDepthBlock, kDepthBlock, x_tile, x_tile_stride, depth);
                }
            }
        }
        for (int tile = 0; tile < tiles; ++tile)
            store_tile_sums(out + block, w.rows, sums + tile * sums_tile_stride, block_rows,
                            tile * kGemmTokenTile, batch);
    }
}

}  // namespace

// Blocks of 16 rows by 16 tokens are transposed in registers, so that both sides are read
// and written 16 floats at a time; the last rows of a block not a multiple of 16 one by one.
void store_tile_sums(float* out, int stride, const float* tile_sums, int rows, int first_token,
                     int batch) {
    const int tokens = std::min(kGemmTokenTile, batch - first_token);
    const int vector_rows = rows - rows % kLanes;
    for (int k = 0; k < vector_rows; k += kLanes) {
        __m512 block[kLanes];
#pragma GCC unroll 16
        for (int j = 0; j < kLanes; ++j)
            block[j] = _mm512_loadu_ps(tile_sums + (k + j) * kTileFloats);
        transpose16x16(block);
#pragma GCC unroll 16
        for (int t = 0; t < kLanes; ++t)
            if (t < tokens) _mm512_storeu_ps(out + size_t(first_token + t) * stride + k, block[t]);
    }
    for (int t = 0; t < tokens; ++t) {
        float* token_out = out + size_t(first_token + t) * stride;
        for (int k = vector_rows; k < rows; ++k) token_out[k] = tile_sums[k * kTileFloats + t];
    }
}

void gemm_rows(float* out, const Matrix& w, const float* x_tiles, int batch, int first_row,
               int row_count) {
    if (w.dtype == DType::F32)
        batch_rows<DType::F32>(out, w, x_tiles, batch, first_row, row_count);
    else if (w.dtype == DType::F16)
        batch_rows<DType::F16>(out, w, x_tiles, batch, first_row, row_count);
    else if (w.dtype == DType::BF16)
        batch_rows<DType::BF16>(out, w, x_tiles, batch, first_row, row_count);
}

}  // namespace barellm::cpu::avx512
