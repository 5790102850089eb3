// The prefill GEMM on AVX2 + FMA + F16C: out[token][row] = Σ_col W[row][col] · x[token][col]
// for a batch of tokens, each weight row read from memory once for the whole batch.
//
// It is a sum of outer products:
// - x is first transposed into tiles of kTokenTile tokens (x_tiles[tile][col][token]: one
//   column of a tile is two registers); pack_token_tile, once per call, the threads sharing
//   it; every weight row then reads them.
// - A block of kRowBlock weight rows is converted to f32 one block of kDepthBlock columns at a
//   time (panel[row][col], row-major: the weights are never transposed). The panel stays in
//   L2 while each token tile, loaded into L1 once, meets all its rows.
// - The micro-kernel keeps kRowTile × kTokenTile outputs in 12 registers. Each step loads
//   two registers of x and broadcasts one weight per row: no horizontal sums.
// - Partial sums live in a contiguous buffer until the last column block, then are
//   transposed into the strided output once.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "cpu/avx2/avx2.h"
#include "cpu/avx2/helpers_avx2.h"

namespace barellm::cpu::avx2 {

namespace {

constexpr int kDepthBlock = 256;  // weight columns converted to f32 together

// dest[0..31] = the 32 weights of one Q4 block as f32: (q - 8) × scale, eight at a time
// (low nibbles of bytes 0-15 are columns 0-15, high nibbles columns 16-31).
inline void unpack_q4_block(float* dest, const uint8_t* block, float scale) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block));
    const __m128i low_nibble = _mm_set1_epi8(0x0f);
    const __m128i halves[2] = {_mm_and_si128(bytes, low_nibble),
                               _mm_and_si128(_mm_srli_epi16(bytes, 4), low_nibble)};
    const __m256i offset = _mm256_set1_epi32(kQ4Offset);
    const __m256 scales = _mm256_set1_ps(scale);
    for (int h = 0; h < 2; ++h)
        for (int k = 0; k < 2; ++k) {
            const __m128i eight = k == 0 ? halves[h] : _mm_unpackhi_epi64(halves[h], halves[h]);
            const __m256i q = _mm256_sub_epi32(_mm256_cvtepu8_epi32(eight), offset);
            _mm256_storeu_ps(dest + h * kQ4BlockBytes + k * kLanes,
                             _mm256_mul_ps(_mm256_cvtepi32_ps(q), scales));
        }
}

// panel[r][i] = W[first_row + r][first_col + i] as f32, for `rows` rows.
void pack_rows(float* panel, const Matrix& w, int first_row, int rows, int first_col, int depth) {
    for (int r = 0; r < rows; ++r) {
        float* dest = panel + r * kDepthBlock;
        const size_t offset = size_t(first_row + r) * w.cols + first_col;
        if (w.dtype == DType::F32) {
            const float* source = static_cast<const float*>(w.data) + offset;
            std::copy(source, source + depth, dest);
        } else if (w.dtype == DType::Q8_0) {
            // first_col is a multiple of kQ8Group: whole groups, one scale each.
            const int8_t* source = static_cast<const int8_t*>(w.data) + offset;
            const uint16_t* scales = w.scales + size_t(first_row + r) * w.q8_groups();
            for (int i = 0; i < depth; i += kQ8Group) {
                const __m256 scale = _mm256_set1_ps(_cvtsh_ss(scales[(first_col + i) / kQ8Group]));
                const int group_end = std::min(depth, i + kQ8Group);
                int k = i;
                for (; k + kLanes <= group_end; k += kLanes) {
                    const __m128i bytes =
                        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(source + k));
                    const __m256 values = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
                    _mm256_storeu_ps(dest + k, _mm256_mul_ps(values, scale));
                }
                for (; k < group_end; ++k) dest[k] = source[k] * _mm256_cvtss_f32(scale);
            }
        } else if (w.dtype == DType::Q4_0) {
            // first_col and depth are multiples of kQ4Block (Q4 rows are whole blocks).
            const uint8_t* source =
                static_cast<const uint8_t*>(w.data) + (first_row + r) * w.row_bytes();
            const uint16_t* scales = w.scales + size_t(first_row + r) * w.q4_blocks();
            for (int i = 0; i < depth; i += kQ4Block)
                unpack_q4_block(dest + i, source + (first_col + i) / 2,
                                _cvtsh_ss(scales[(first_col + i) / kQ4Block]));
        } else if (is_block_type(w.dtype)) {
            // first_col and depth are whole blocks (kDepthBlock is a multiple of every block
            // type's weights): the scalar dequantization, once per call for all the tokens.
            const size_t first_block = size_t(first_col / block_weights(w.dtype));
            dequantize_row(w.dtype, w.row_data(first_row + r) + first_block * block_bytes(w.dtype),
                           dest, depth);
        } else {
            // One loop per type: load8 tests the type, and the compiler would otherwise
            // widen every vector both ways.
            const uint16_t* source = static_cast<const uint16_t*>(w.data) + offset;
            const int vector_depth = depth - depth % kLanes;
            if (w.dtype == DType::F16)
                for (int i = 0; i < vector_depth; i += kLanes)
                    _mm256_storeu_ps(dest + i, load8(source + i, DType::F16));
            else
                for (int i = 0; i < vector_depth; i += kLanes)
                    _mm256_storeu_ps(dest + i, load8(source + i, DType::BF16));
            for (int i = vector_depth; i < depth; ++i) dest[i] = scalar_weight(source + i, w.dtype);
        }
    }
}

// sums[r][t] += Σ_i panel[r * panel_stride + i] · x_tile[i][t] for ROWS rows and
// kTokenTile columns t (tokens here; keys or value columns in avx2::attention_rows).
template <int ROWS>
void outer_product_kernel(float* sums, const float* panel, int panel_stride, const float* x_tile,
                          int depth) {
    __m256 low[ROWS], high[ROWS];  // columns 0-7 and 8-15 of each row
#pragma GCC unroll 6
    for (int r = 0; r < ROWS; ++r) {
        low[r] = _mm256_load_ps(sums + r * kTokenTile);
        high[r] = _mm256_load_ps(sums + r * kTokenTile + kLanes);
    }
    for (int i = 0; i < depth; ++i) {
        const __m256 x_low = _mm256_load_ps(x_tile + i * kTokenTile);
        const __m256 x_high = _mm256_load_ps(x_tile + i * kTokenTile + kLanes);
#pragma GCC unroll 6
        for (int r = 0; r < ROWS; ++r) {
            const __m256 weight = _mm256_broadcast_ss(panel + r * panel_stride + i);
            low[r] = _mm256_fmadd_ps(weight, x_low, low[r]);
            high[r] = _mm256_fmadd_ps(weight, x_high, high[r]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < ROWS; ++r) {
        _mm256_store_ps(sums + r * kTokenTile, low[r]);
        _mm256_store_ps(sums + r * kTokenTile + kLanes, high[r]);
    }
}

// out[token][k] = tile_sums[k][token - first_token] for the tile's tokens below `batch`
// and k < rows; out has `stride` floats a token. Blocks of eight rows by eight tokens are
// transposed in registers, so both sides are read and written eight floats at a time.
void store_tile_sums(float* out, int stride, const float* tile_sums, int rows, int first_token,
                     int batch) {
    const int vector_rows = rows - rows % kLanes;
    for (int t = 0; t < kTokenTile && first_token + t < batch; t += kLanes) {
        const int tokens = std::min(kLanes, batch - first_token - t);
        for (int k = 0; k < vector_rows; k += kLanes) {
            __m256 block[kLanes];
            for (int j = 0; j < kLanes; ++j)
                block[j] = _mm256_load_ps(tile_sums + (k + j) * kTokenTile + t);
            transpose8x8(block);
            for (int j = 0; j < tokens; ++j)
                _mm256_storeu_ps(out + size_t(first_token + t + j) * stride + k, block[j]);
        }
        for (int j = 0; j < tokens; ++j)
            for (int k = vector_rows; k < rows; ++k)
                out[size_t(first_token + t + j) * stride + k] = tile_sums[k * kTokenTile + t + j];
    }
}

}  // namespace

const OuterProductKernel outer_product_kernels[kRowTile] = {
    outer_product_kernel<1>, outer_product_kernel<2>, outer_product_kernel<3>,
    outer_product_kernel<4>, outer_product_kernel<5>, outer_product_kernel<6>};

int token_tile_count(int batch) { return (batch + kTokenTile - 1) / kTokenTile; }

size_t token_tiles_floats(int batch, int cols) {
    return size_t(token_tile_count(batch)) * cols * kTokenTile + kLanes;
}

// x_tiles[tile][i][t] = x[tile * kTokenTile + t][i], zero past the last token; eight
// tokens by eight columns at a time.
void pack_token_tile(float* x_tiles, const float* x, int cols, int batch, int tile) {
    float* dest = x_tiles + size_t(tile) * cols * kTokenTile;
    const int vector_cols = cols - cols % kLanes;
    for (int t = 0; t < kTokenTile; t += kLanes) {
        const float* rows[kLanes];  // the eight tokens' rows of x, or nullptr past the last
        for (int k = 0; k < kLanes; ++k) {
            const int token = tile * kTokenTile + t + k;
            rows[k] = token < batch ? x + size_t(token) * cols : nullptr;
        }
        for (int i = 0; i < vector_cols; i += kLanes) {
            __m256 block[kLanes];
            for (int k = 0; k < kLanes; ++k)
                block[k] = rows[k] ? _mm256_loadu_ps(rows[k] + i) : _mm256_setzero_ps();
            transpose8x8(block);
            for (int k = 0; k < kLanes; ++k)
                _mm256_store_ps(dest + size_t(i + k) * kTokenTile + t, block[k]);
        }
        for (int i = vector_cols; i < cols; ++i)
            for (int k = 0; k < kLanes; ++k)
                dest[size_t(i) * kTokenTile + t + k] = rows[k] ? rows[k][i] : 0.0f;
    }
}

void gemm_rows(float* out, const Matrix& w, const float* x_tiles, int batch, int first_row,
               int row_count) {
    const int tiles = token_tile_count(batch);
    // One block of weight rows converted to f32, [kRowBlock, kDepthBlock], and its partial
    // sums [tiles, kRowBlock, kTokenTile], both 32-byte aligned.
    static thread_local std::vector<float> panel_storage, sum_storage;
    panel_storage.resize(kRowBlock * kDepthBlock + kLanes);
    sum_storage.resize(size_t(tiles) * kRowBlock * kTokenTile + kLanes);
    float* panel = align32(panel_storage.data());
    float* sums = align32(sum_storage.data());
    const int end_row = first_row + row_count;
    for (int block = first_row; block < end_row; block += kRowBlock) {
        const int block_rows = std::min(kRowBlock, end_row - block);
        std::fill(sums, sums + size_t(tiles) * kRowBlock * kTokenTile, 0.0f);
        for (int depth_start = 0; depth_start < w.cols; depth_start += kDepthBlock) {
            const int depth = std::min(kDepthBlock, w.cols - depth_start);
            pack_rows(panel, w, block, block_rows, depth_start, depth);
            // Each tile of x, loaded into L1 once, meets every row group of the block.
            for (int tile = 0; tile < tiles; ++tile) {
                const float* x_tile = x_tiles + (size_t(tile) * w.cols + depth_start) * kTokenTile;
                float* tile_sums = sums + size_t(tile) * kRowBlock * kTokenTile;
                for (int group = 0; group < block_rows; group += kRowTile)
                    outer_product_kernel_for(std::min(kRowTile, block_rows - group))(
                        tile_sums + group * kTokenTile, panel + group * kDepthBlock, kDepthBlock,
                        x_tile, depth);
            }
        }
        for (int tile = 0; tile < tiles; ++tile)
            store_tile_sums(out + block, w.rows, sums + size_t(tile) * kRowBlock * kTokenTile,
                            block_rows, tile * kTokenTile, batch);
    }
}

}  // namespace barellm::cpu::avx2
