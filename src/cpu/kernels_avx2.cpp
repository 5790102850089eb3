// AVX2 + FMA + F16C versions of the hot CPU kernels (compiled with -mavx2 -mfma -mf16c;
// only called after detect_simd_level() found those features).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "cpu/kernels.h"
#include "half.h"

namespace barellm::cpu::avx2 {

namespace {

constexpr int kLanes = 8;  // floats per 256-bit register

// Eight consecutive weights starting at `p`, widened to f32.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p, DType dtype) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if (dtype == DType::F16) return _mm256_cvtph_ps(raw);
    // bf16 -> f32: the 16 bits become the top half of each 32-bit lane.
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

inline float horizontal_sum(__m256 v) {
    const __m128 halves = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 pairs = _mm_add_ps(halves, _mm_movehl_ps(halves, halves));
    return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}

// Transposes the 8 × 8 block held in rows[0..7] (rows[i] lane j becomes rows[j] lane i).
inline void transpose8x8(__m256 rows[8]) {
    __m256 pairs[8], quads[8];
    for (int i = 0; i < 8; i += 2) {
        pairs[i] = _mm256_unpacklo_ps(rows[i], rows[i + 1]);
        pairs[i + 1] = _mm256_unpackhi_ps(rows[i], rows[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        quads[i] = _mm256_shuffle_ps(pairs[i], pairs[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        quads[i + 1] = _mm256_shuffle_ps(pairs[i], pairs[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        quads[i + 2] = _mm256_shuffle_ps(pairs[i + 1], pairs[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        quads[i + 3] = _mm256_shuffle_ps(pairs[i + 1], pairs[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; ++i) {
        rows[i] = _mm256_permute2f128_ps(quads[i], quads[i + 4], 0x20);
        rows[i + 4] = _mm256_permute2f128_ps(quads[i], quads[i + 4], 0x31);
    }
}

// e^x in each lane, for x ≤ 0 (below -87 it gives about 1e-38 rather than less): x = n·ln2 + r
// with |r| ≤ ln2/2, e^r by its Taylor polynomial of degree 6 (relative error below 2e-7),
// 2^n written into the exponent bits.
inline __m256 exp_nonpositive(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    // ln2 in two parts, so that n · (high part) is exact.
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    for (float coefficient : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(coefficient));
    const __m256i two_to_n =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(two_to_n));
}

inline float scalar_weight(const uint16_t* p, DType dtype) {
    return dtype == DType::F16 ? half_to_float(*p) : bf16_to_float(*p);
}

// Four rows at a time share each load of x; the tail columns (cols % 8) go scalar.
template <typename Weight>
void rows_kernel(float* out, const Weight* w, DType dtype, int cols, const float* x, int first_row,
                 int row_count) {
    const int vector_cols = cols - cols % kLanes;
    constexpr int kLineWeights = 64 / sizeof(Weight);  // weights per 64-byte cache line
    int r = first_row;
    const int end = first_row + row_count;
    for (; r + 4 <= end; r += 4) {
        const Weight* row0 = w + size_t(r) * cols;
        const Weight* row1 = row0 + cols;
        const Weight* row2 = row1 + cols;
        const Weight* row3 = row2 + cols;
        __m256 sum0 = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps();
        __m256 sum2 = _mm256_setzero_ps(), sum3 = _mm256_setzero_ps();
        for (int i = 0; i < vector_cols; i += kLanes) {
            // The same columns of the next four rows, a cache line per row at a time: rows
            // of 4 KB (2048 f16) each start a new page, where the hardware prefetcher stops.
            if (i % kLineWeights == 0)
                for (const Weight* row : {row0, row1, row2, row3})
                    _mm_prefetch(reinterpret_cast<const char*>(row + 4 * size_t(cols) + i),
                                 _MM_HINT_T0);
            const __m256 xv = _mm256_loadu_ps(x + i);
            if constexpr (std::is_same_v<Weight, float>) {
                sum0 = _mm256_fmadd_ps(load8(row0 + i), xv, sum0);
                sum1 = _mm256_fmadd_ps(load8(row1 + i), xv, sum1);
                sum2 = _mm256_fmadd_ps(load8(row2 + i), xv, sum2);
                sum3 = _mm256_fmadd_ps(load8(row3 + i), xv, sum3);
            } else {
                sum0 = _mm256_fmadd_ps(load8(row0 + i, dtype), xv, sum0);
                sum1 = _mm256_fmadd_ps(load8(row1 + i, dtype), xv, sum1);
                sum2 = _mm256_fmadd_ps(load8(row2 + i, dtype), xv, sum2);
                sum3 = _mm256_fmadd_ps(load8(row3 + i, dtype), xv, sum3);
            }
        }
        float totals[4] = {horizontal_sum(sum0), horizontal_sum(sum1), horizontal_sum(sum2),
                           horizontal_sum(sum3)};
        const Weight* rows[4] = {row0, row1, row2, row3};
        for (int k = 0; k < 4; ++k) {
            for (int i = vector_cols; i < cols; ++i) {
                if constexpr (std::is_same_v<Weight, float>)
                    totals[k] += rows[k][i] * x[i];
                else
                    totals[k] += scalar_weight(rows[k] + i, dtype) * x[i];
            }
            out[r + k] = totals[k];
        }
    }
    for (; r < end; ++r) {  // fewer than four rows left
        const Weight* row = w + size_t(r) * cols;
        __m256 sum = _mm256_setzero_ps();
        for (int i = 0; i < vector_cols; i += kLanes) {
            if constexpr (std::is_same_v<Weight, float>)
                sum = _mm256_fmadd_ps(load8(row + i), _mm256_loadu_ps(x + i), sum);
            else
                sum = _mm256_fmadd_ps(load8(row + i, dtype), _mm256_loadu_ps(x + i), sum);
        }
        float total = horizontal_sum(sum);
        for (int i = vector_cols; i < cols; ++i) {
            if constexpr (std::is_same_v<Weight, float>)
                total += row[i] * x[i];
            else
                total += scalar_weight(row + i, dtype) * x[i];
        }
        out[r] = total;
    }
}

}  // namespace

void matmul_rows(float* out, const Matrix& w, const float* x, int first_row, int row_count) {
    if (w.dtype == DType::F32)
        rows_kernel(out, static_cast<const float*>(w.data), w.dtype, w.cols, x, first_row,
                    row_count);
    else
        rows_kernel(out, static_cast<const uint16_t*>(w.data), w.dtype, w.cols, x, first_row,
                    row_count);
}

namespace {

// Sum over one group of 32 of w[i] * x[i] as int32 lanes: |w| (unsigned) times x with
// w's sign, multiplied in pairs into int16 (at most 2 * 127 * 127, no overflow), then
// pairs of those into int32.
inline __m256 q8_group_dot(const int8_t* w, const int8_t* x) {
    const __m256i weights = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    const __m256i values = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    const __m256i products =
        _mm256_maddubs_epi16(_mm256_sign_epi8(weights, weights), _mm256_sign_epi8(values, weights));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(products, _mm256_set1_epi16(1)));
}

// One Q8 row · quantized x: whole groups with AVX2, a short last group in scalar.
inline float q8_row_dot(const int8_t* row, const uint16_t* row_scales, const QuantizedVector& x,
                        int cols) {
    const int whole_groups = cols / kQ8Group;
    __m256 sum = _mm256_setzero_ps();
    int g = 0;
    // Eight groups at a time: their eight scales (weight × x) in one register, each
    // broadcast to the lanes of its group's sum.
    for (; g + kLanes <= whole_groups; g += kLanes) {
        const __m256 scales = _mm256_mul_ps(
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row_scales + g))),
            _mm256_loadu_ps(x.scales.data() + g));
#pragma GCC unroll 8
        for (int k = 0; k < kLanes; ++k) {
            const __m256 scale = _mm256_permutevar8x32_ps(scales, _mm256_set1_epi32(k));
            sum = _mm256_fmadd_ps(
                q8_group_dot(row + (g + k) * kQ8Group, x.values.data() + (g + k) * kQ8Group), scale,
                sum);
        }
    }
    for (; g < whole_groups; ++g) {
        const float scale = _cvtsh_ss(row_scales[g]) * x.scales[g];
        sum = _mm256_fmadd_ps(q8_group_dot(row + g * kQ8Group, x.values.data() + g * kQ8Group),
                              _mm256_set1_ps(scale), sum);
    }
    float total = horizontal_sum(sum);
    if (whole_groups * kQ8Group < cols) {
        int32_t tail = 0;
        for (int i = whole_groups * kQ8Group; i < cols; ++i) tail += row[i] * x.values[i];
        total += tail * _cvtsh_ss(row_scales[whole_groups]) * x.scales[whole_groups];
    }
    return total;
}

}  // namespace

void matmul_rows_q8(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                    int row_count) {
    const int8_t* values = static_cast<const int8_t*>(w.data);
    const int groups = w.q8_groups();
    for (int r = first_row; r < first_row + row_count; ++r)
        out[r] = q8_row_dot(values + size_t(r) * w.cols, w.scales + size_t(r) * groups, x, w.cols);
}

float dot_kv(const float* q, const void* keys, int n, KvType type) {
    const int vector_n = n - n % kLanes;
    __m256 sum = _mm256_setzero_ps();
    float total = 0.0f;
    if (type == KvType::F32) {
        const float* k = static_cast<const float*>(keys);
        for (int i = 0; i < vector_n; i += kLanes)
            sum = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), sum);
        for (int i = vector_n; i < n; ++i) total += q[i] * k[i];
    } else {
        const uint16_t* k = static_cast<const uint16_t*>(keys);
        for (int i = 0; i < vector_n; i += kLanes)
            sum = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k + i, DType::F16), sum);
        for (int i = vector_n; i < n; ++i) total += q[i] * half_to_float(k[i]);
    }
    return total + horizontal_sum(sum);
}

void add_scaled_kv(float* out, float scale, const void* values, int n, KvType type) {
    const int vector_n = n - n % kLanes;
    const __m256 scale_vector = _mm256_set1_ps(scale);
    if (type == KvType::F32) {
        const float* v = static_cast<const float*>(values);
        for (int i = 0; i < vector_n; i += kLanes)
            _mm256_storeu_ps(out + i, _mm256_fmadd_ps(scale_vector, _mm256_loadu_ps(v + i),
                                                      _mm256_loadu_ps(out + i)));
        for (int i = vector_n; i < n; ++i) out[i] += scale * v[i];
    } else {
        const uint16_t* v = static_cast<const uint16_t*>(values);
        for (int i = 0; i < vector_n; i += kLanes)
            _mm256_storeu_ps(out + i, _mm256_fmadd_ps(scale_vector, load8(v + i, DType::F16),
                                                      _mm256_loadu_ps(out + i)));
        for (int i = vector_n; i < n; ++i) out[i] += scale * half_to_float(v[i]);
    }
}

}  // namespace barellm::cpu::avx2

namespace barellm::cpu::avx2 {

namespace {

// Prefill GEMM, out[token][row] = Σ_col W[row][col] · x[token][col], as a sum of outer
// products. x is first transposed into tiles of kTokenTile tokens (x_tiles[tile][col]
// [token]: one column of a tile is two registers; pack_token_tile, once per call, the
// threads sharing it), then shared by every weight row. A block of kRowBlock weight rows is
// widened to f32 one block of kDepthBlock columns at a time (panel[row][col], row-major: the
// weights are never transposed), a panel that stays in L2 while each token tile, loaded into
// L1 once, meets all its rows. The micro-kernel keeps kRowTile × kTokenTile outputs in 12
// registers; each step loads two registers of x and broadcasts one weight per row: no
// horizontal sums. Partial sums live in a contiguous buffer until the last column block, then
// are transposed into the strided output once.
constexpr int kTokenTile = 16;  // two registers of 8 tokens
constexpr int kDepthBlock = 256;

// panel[r][i] = W[first_row + r][first_col + i] as f32, for `rows` rows.
void pack_rows(float* panel, const Matrix& w, int first_row, int rows, int first_col, int depth) {
    for (int r = 0; r < rows; ++r) {
        float* dest = panel + r * kDepthBlock;
        const size_t offset = size_t(first_row + r) * w.cols + first_col;
        if (w.dtype == DType::F32) {
            const float* source = static_cast<const float*>(w.data) + offset;
            std::copy(source, source + depth, dest);
        } else if (w.dtype == DType::I8) {
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
// kTokenTile columns t (tokens here; keys or value columns in attention_rows below).
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

using OuterProductKernel = void (*)(float*, const float*, int, const float*, int);

OuterProductKernel kernel_for(int rows) {
    static const OuterProductKernel table[kRowTile] = {
        outer_product_kernel<1>, outer_product_kernel<2>, outer_product_kernel<3>,
        outer_product_kernel<4>, outer_product_kernel<5>, outer_product_kernel<6>};
    return table[rows - 1];
}

}  // namespace

int token_tile_count(int batch) { return (batch + kTokenTile - 1) / kTokenTile; }

size_t token_tiles_floats(int batch, int cols) {
    return size_t(token_tile_count(batch)) * cols * kTokenTile + kLanes;
}

float* align32(float* p) {
    const uintptr_t misalignment = reinterpret_cast<uintptr_t>(p) % 32;
    return misalignment ? p + (32 - misalignment) / sizeof(float) : p;
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

void matmul_batch_rows(float* out, const Matrix& w, const float* x_tiles, int batch, int first_row,
                       int row_count) {
    const int tiles = token_tile_count(batch);
    // One block of weight rows widened to f32, [kRowBlock, kDepthBlock], and its partial
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
                    kernel_for(std::min(kRowTile, block_rows - group))(
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

// ==================================================================== Prefill attention
//
// For one KV head, the batch's queries that read it (rows: count tokens × group heads;
// row ρ is token ρ / group, query head kv_head · group + ρ % group) attend through two
// small GEMMs on the outer-product kernel: scores = Q·Kᵀ / √head_dim with the keys
// transposed into tiles of 16 keys (the GEMM's "tokens"), a causal softmax per row, then
// out = P·V with the values cut into tiles of 16 columns. Keys and values are widened to
// f32 once per KV head and shared by all rows.

namespace barellm::cpu::avx2 {

namespace {

int head_dim_tile_count(int head_dim) { return (head_dim + kTokenTile - 1) / kTokenTile; }

inline float horizontal_max(__m256 v) {
    const __m128 halves = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 pairs = _mm_max_ps(halves, _mm_movehl_ps(halves, halves));
    return _mm_cvtss_f32(_mm_max_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}

// row[begin, end) = exp(row - max) in place; returns their sum.
float exp_in_place(float* row, int begin, int end) {
    __m256 largest = _mm256_set1_ps(-INFINITY);
    int i = begin;
    for (; i + kLanes <= end; i += kLanes)
        largest = _mm256_max_ps(largest, _mm256_loadu_ps(row + i));
    float max_value = horizontal_max(largest);
    for (; i < end; ++i) max_value = std::max(max_value, row[i]);
    const __m256 max_vector = _mm256_set1_ps(max_value);
    __m256 sum = _mm256_setzero_ps();
    for (i = begin; i + kLanes <= end; i += kLanes) {
        const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(row + i), max_vector));
        _mm256_storeu_ps(row + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    float total = horizontal_sum(sum);
    for (; i < end; ++i) total += (row[i] = std::exp(row[i] - max_value));
    return total;
}

// out[n] = one KV-cache row as f32.
void load_kv_row(float* out, const uint8_t* row, int n, KvType type) {
    if (type == KvType::F32) {
        std::copy_n(reinterpret_cast<const float*>(row), n, out);
        return;
    }
    const uint16_t* halves = reinterpret_cast<const uint16_t*>(row);
    int i = 0;
    for (; i + kLanes <= n; i += kLanes) _mm256_storeu_ps(out + i, load8(halves + i, DType::F16));
    for (; i < n; ++i) out[i] = half_to_float(halves[i]);
}

}  // namespace

int kv_tile_count(int keys) { return (keys + kTokenTile - 1) / kTokenTile; }

size_t kv_tiles_floats(int keys, int head_dim) {
    const size_t padded_keys = size_t(kv_tile_count(keys)) * kTokenTile;
    return padded_keys * head_dim + head_dim_tile_count(head_dim) * padded_keys * kTokenTile +
           kLanes;
}

KvTiles kv_tiles(float* storage, int first_key, int keys, int head_dim) {
    KvTiles tiles;
    tiles.first_key = first_key;
    tiles.keys = keys;
    tiles.padded_keys = kv_tile_count(keys) * kTokenTile;
    tiles.key_tiles = align32(storage);
    tiles.value_tiles = tiles.key_tiles + size_t(tiles.padded_keys) * head_dim;
    return tiles;
}

void pack_kv_tile(const KvTiles& tiles, const void* key_cache, const void* value_cache, int kv_head,
                  int tile, const AttentionShape& shape, KvType type) {
    const int head_dim = shape.head_dim;
    const size_t element = type == KvType::F32 ? sizeof(float) : sizeof(uint16_t);
    const size_t row_bytes = size_t(shape.kv_heads) * head_dim * element;
    const size_t head_offset = size_t(kv_head) * head_dim * element;
    float* key_tile = tiles.key_tiles + size_t(tile) * head_dim * kTokenTile;
    static thread_local std::vector<float> key, value;  // one key and value row as f32
    key.resize(head_dim);
    value.resize(head_dim);
    for (int t = 0; t < kTokenTile; ++t) {
        const int k = tile * kTokenTile + t;  // key index, from first_key
        std::fill(key.begin(), key.end(), 0.0f);
        std::fill(value.begin(), value.end(), 0.0f);
        if (k < tiles.keys) {
            const size_t offset = size_t(tiles.first_key + k) * row_bytes + head_offset;
            load_kv_row(key.data(), static_cast<const uint8_t*>(key_cache) + offset, head_dim,
                        type);
            load_kv_row(value.data(), static_cast<const uint8_t*>(value_cache) + offset, head_dim,
                        type);
        }
        for (int d = 0; d < head_dim; ++d) key_tile[d * kTokenTile + t] = key[d];
        for (int column_tile = 0; column_tile < head_dim_tile_count(head_dim); ++column_tile) {
            float* dest =
                tiles.value_tiles + (size_t(column_tile) * tiles.padded_keys + k) * kTokenTile;
            for (int c = 0; c < kTokenTile; ++c) {
                const int d = column_tile * kTokenTile + c;
                dest[c] = d < head_dim ? value[d] : 0.0f;
            }
        }
    }
}

size_t attention_scratch_floats(int keys, int head_dim) {
    return size_t(kRowTile) * (head_dim + kv_tile_count(keys) * kTokenTile + kTokenTile) +
           2 * kLanes;
}

void attention_rows(float* out, const float* q, int first_row, int rows, int first_pos, int kv_head,
                    const KvTiles& tiles, const AttentionShape& shape, float* scratch) {
    const int head_dim = shape.head_dim, group = shape.heads / shape.kv_heads;
    const size_t q_dim = size_t(shape.heads) * head_dim;
    const float scale = 1.0f / std::sqrt(float(head_dim));
    // scratch: sums [kRowTile, 16] | scores [kRowTile, padded_keys] | queries [kRowTile, head_dim]
    float* sums = align32(scratch);
    float* scores = sums + kRowTile * kTokenTile;
    float* queries = scores + size_t(kRowTile) * tiles.padded_keys;
    int begin[kRowTile], end[kRowTile];  // each row's keys, from first_key
    float* out_rows[kRowTile];
    for (int r = 0; r < rows; ++r) {
        const int token = (first_row + r) / group;
        const int head = kv_head * group + (first_row + r) % group;
        const int pos = first_pos + token;
        begin[r] = attention_start(pos, shape.window) - tiles.first_key;
        end[r] = pos + 1 - tiles.first_key;
        const float* query = q + token * q_dim + size_t(head) * head_dim;
        for (int d = 0; d < head_dim; ++d) queries[r * head_dim + d] = query[d] * scale;
        out_rows[r] = out + token * q_dim + size_t(head) * head_dim;
    }
    const int first_tile = *std::min_element(begin, begin + rows) / kTokenTile;
    const int end_tile = kv_tile_count(*std::max_element(end, end + rows));
    const OuterProductKernel kernel = kernel_for(rows);

    // scores[r][k] = q_r · key_k / √head_dim, for the key tiles the rows reach.
    for (int tile = first_tile; tile < end_tile; ++tile) {
        std::fill(sums, sums + kRowTile * kTokenTile, 0.0f);
        kernel(sums, queries, head_dim, tiles.key_tiles + size_t(tile) * head_dim * kTokenTile,
               head_dim);
        for (int r = 0; r < rows; ++r)
            std::copy_n(sums + r * kTokenTile, kTokenTile,
                        scores + size_t(r) * tiles.padded_keys + tile * kTokenTile);
    }
    // Causal softmax: exp over each row's keys, zero around them; normalised at the end.
    const int key_begin = first_tile * kTokenTile, key_end = end_tile * kTokenTile;
    float inverse_sums[kRowTile];
    for (int r = 0; r < rows; ++r) {
        float* row = scores + size_t(r) * tiles.padded_keys;
        inverse_sums[r] = 1.0f / exp_in_place(row, begin[r], end[r]);
        std::fill(row + key_begin, row + begin[r], 0.0f);
        std::fill(row + end[r], row + key_end, 0.0f);
    }
    // out_r = Σ_k p_rk · value_k, 16 columns at a time.
    for (int column_tile = 0; column_tile < head_dim_tile_count(head_dim); ++column_tile) {
        std::fill(sums, sums + kRowTile * kTokenTile, 0.0f);
        kernel(
            sums, scores + key_begin, tiles.padded_keys,
            tiles.value_tiles + (size_t(column_tile) * tiles.padded_keys + key_begin) * kTokenTile,
            key_end - key_begin);
        const int columns = std::min(kTokenTile, head_dim - column_tile * kTokenTile);
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < columns; ++c)
                out_rows[r][column_tile * kTokenTile + c] =
                    sums[r * kTokenTile + c] * inverse_sums[r];
    }
}

}  // namespace barellm::cpu::avx2

namespace barellm::cpu::avx2 {

// gate[n] = silu(gate) · up, where silu(g) = g · σ(g) and σ(g) = 1 / (1 + e^-g), written
// with e = e^-|g| ≤ 1 as 1 / (1 + e) for g ≥ 0 and e / (1 + e) for g < 0.
void swiglu(float* gate, const float* up, int n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 sign_bit = _mm256_set1_ps(-0.0f);
    int i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = exp_nonpositive(_mm256_or_ps(g, sign_bit));  // e^-|g|
        const __m256 numerator = _mm256_blendv_ps(one, e, g);         // e where g's sign is set
        const __m256 sigmoid = _mm256_div_ps(numerator, _mm256_add_ps(one, e));
        _mm256_storeu_ps(gate + i,
                         _mm256_mul_ps(_mm256_mul_ps(g, sigmoid), _mm256_loadu_ps(up + i)));
    }
    scalar::swiglu(gate + i, up + i, n - i);
}

}  // namespace barellm::cpu::avx2
