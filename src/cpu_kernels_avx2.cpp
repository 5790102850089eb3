// AVX2 + FMA + F16C versions of the hot CPU kernels (compiled with -mavx2 -mfma -mf16c;
// only called after detect_simd_level() found those features).
#include <immintrin.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "cpu_kernels.h"
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

inline float scalar_weight(const uint16_t* p, DType dtype) {
    return dtype == DType::F16 ? half_to_float(*p) : bf16_to_float(*p);
}

// Four rows at a time share each load of x; the tail columns (cols % 8) go scalar.
template <typename Weight>
void rows_kernel(float* out, const Weight* w, DType dtype, int cols, const float* x, int first_row,
                 int row_count) {
    const int vector_cols = cols - cols % kLanes;
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
    for (int g = 0; g < whole_groups; ++g) {
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

// Prefill GEMM, out[token][row] = Σ_col x[token][col] · W[row][col], as a sum of outer
// products. For each block of kDepthBlock columns, x is repacked so that each tile of
// kTokenTile tokens is contiguous (x_tiles[tile][col][token]); then a panel of
// kPanelWidth weight rows is converted to f32 and transposed once (panel[col][row],
// 16 KiB) and every token tile streams past it. The micro-kernel holds
// kTokenTile × kPanelWidth outputs in 12 registers; each step loads 16 weights and
// broadcasts one x per token: no horizontal sums, and no strided reads of x.
constexpr int kPanelWidth = 16;  // two registers of 8 rows
constexpr int kTokenTile = 6;
constexpr int kDepthBlock = 256;

// panel[i * kPanelWidth + r] = W[first_row + r][first_col + i]; rows past `rows` are zero.
void pack_panel(float* panel, const Matrix& w, int first_row, int rows, int first_col, int depth) {
    alignas(32) float row_values[kDepthBlock];
    for (int r = 0; r < kPanelWidth; ++r) {
        if (r >= rows) {
            for (int i = 0; i < depth; ++i) panel[i * kPanelWidth + r] = 0.0f;
            continue;
        }
        const size_t offset = size_t(first_row + r) * w.cols + first_col;
        if (w.dtype == DType::F32) {
            const float* source = static_cast<const float*>(w.data) + offset;
            std::copy(source, source + depth, row_values);
        } else if (w.dtype == DType::I8) {
            const int8_t* source = static_cast<const int8_t*>(w.data) + offset;
            const uint16_t* scales = w.scales + size_t(first_row + r) * w.q8_groups();
            for (int i = 0; i < depth; ++i)  // first_col is a multiple of kQ8Group
                row_values[i] = source[i] * _cvtsh_ss(scales[(first_col + i) / kQ8Group]);
        } else {
            const uint16_t* source = static_cast<const uint16_t*>(w.data) + offset;
            int i = 0;
            for (; i + kLanes <= depth; i += kLanes)
                _mm256_store_ps(row_values + i, load8(source + i, w.dtype));
            for (; i < depth; ++i) row_values[i] = scalar_weight(source + i, w.dtype);
        }
        for (int i = 0; i < depth; ++i) panel[i * kPanelWidth + r] = row_values[i];
    }
}

// x_tiles[tile][i][t] = x[tile * kTokenTile + t][first_col + i], zero past the last token.
void pack_token_tiles(float* x_tiles, const float* x, size_t x_stride, int batch, int first_col,
                      int depth) {
    const int tiles = (batch + kTokenTile - 1) / kTokenTile;
    for (int tile = 0; tile < tiles; ++tile) {
        float* dest = x_tiles + size_t(tile) * depth * kTokenTile;
        for (int t = 0; t < kTokenTile; ++t) {
            const int token = tile * kTokenTile + t;
            const float* source = x + size_t(token) * x_stride + first_col;
            for (int i = 0; i < depth; ++i)
                dest[i * kTokenTile + t] = token < batch ? source[i] : 0.0f;
        }
    }
}

// out[t][r] (+)= Σ_i panel[i][r] · x_tile[i][t] for TOKENS tokens and `rows` rows.
template <int TOKENS>
void outer_product_kernel(float* out, size_t out_stride, const float* panel, const float* x_tile,
                          int depth, int rows, bool accumulate) {
    __m256 low[TOKENS], high[TOKENS];  // rows 0-7 and 8-15 of each token
#pragma GCC unroll 6
    for (int t = 0; t < TOKENS; ++t) low[t] = high[t] = _mm256_setzero_ps();
    for (int i = 0; i < depth; ++i) {
        const __m256 weights_low = _mm256_load_ps(panel + i * kPanelWidth);
        const __m256 weights_high = _mm256_load_ps(panel + i * kPanelWidth + kLanes);
#pragma GCC unroll 6
        for (int t = 0; t < TOKENS; ++t) {
            const __m256 xt = _mm256_broadcast_ss(x_tile + i * kTokenTile + t);
            low[t] = _mm256_fmadd_ps(weights_low, xt, low[t]);
            high[t] = _mm256_fmadd_ps(weights_high, xt, high[t]);
        }
    }
#pragma GCC unroll 6
    for (int t = 0; t < TOKENS; ++t) {
        float* target = out + t * out_stride;
        alignas(32) float sums[kPanelWidth];
        _mm256_store_ps(sums, low[t]);
        _mm256_store_ps(sums + kLanes, high[t]);
        for (int r = 0; r < rows; ++r) target[r] = accumulate ? target[r] + sums[r] : sums[r];
    }
}

using OuterProductKernel = void (*)(float*, size_t, const float*, const float*, int, int, bool);

OuterProductKernel kernel_for(int tokens) {
    static const OuterProductKernel table[kTokenTile] = {
        outer_product_kernel<1>, outer_product_kernel<2>, outer_product_kernel<3>,
        outer_product_kernel<4>, outer_product_kernel<5>, outer_product_kernel<6>};
    return table[tokens - 1];
}

}  // namespace

void matmul_batch_rows(float* out, const Matrix& w, const float* x, int batch, int first_row,
                       int row_count) {
    alignas(32) float panel[kDepthBlock * kPanelWidth];
    static thread_local std::vector<float> x_tiles;  // [tiles, depth, kTokenTile]
    x_tiles.resize(size_t(batch + kTokenTile - 1) / kTokenTile * kTokenTile * kDepthBlock);
    const int end_row = first_row + row_count;
    for (int depth_start = 0; depth_start < w.cols; depth_start += kDepthBlock) {
        const int depth = std::min(kDepthBlock, w.cols - depth_start);
        const bool accumulate = depth_start > 0;
        pack_token_tiles(x_tiles.data(), x, w.cols, batch, depth_start, depth);
        for (int r = first_row; r < end_row; r += kPanelWidth) {
            const int rows = std::min(kPanelWidth, end_row - r);
            pack_panel(panel, w, r, rows, depth_start, depth);
            for (int t = 0; t < batch; t += kTokenTile) {
                const int tokens = std::min(kTokenTile, batch - t);
                kernel_for(tokens)(out + size_t(t) * w.rows + r, w.rows, panel,
                                   x_tiles.data() + size_t(t) * depth, depth, rows, accumulate);
            }
        }
    }
}

}  // namespace barellm::cpu::avx2
