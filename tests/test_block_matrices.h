// Test inputs for the kernels of the block types (weight_blocks.h): matrices of random
// blocks (every byte random, except the f16 scales, which are finite, of both signs, from
// subnormal to the largest f16, and now and then zero), so that sub-block scales and mins
// reach 0 and 63 (int8 −128 and 127 for Q6_K), levels every value and the i-quants' grid
// indices every point, with the values dequantize_row gives them; and x quantized per 256 by
// llama.cpp's Q8_K rule written out here, independently of the kernels.
#pragma once
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cpu/kernels.h"
#include "test_matrices.h"
#include "weights/half.h"
#include "weights/weight_blocks.h"

namespace barellm::test {

constexpr DType kBlockTypes[] = {DType::Q2_K, DType::Q3_K,   DType::Q4_K, DType::Q5_K,
                                 DType::Q6_K, DType::IQ4_XS, DType::Q4_1, DType::Q5_0,
                                 DType::Q5_1, DType::IQ4_NL, DType::MXFP4};
// The i-quants: their grids looked up, signs and scales per 16 or 32 columns.
constexpr DType kIqGridTypes[] = {DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS,
                                  DType::IQ3_S,   DType::IQ1_S,  DType::IQ1_M};

// The ternary types: trits (TQ1_0) or bit pairs (TQ2_0) under one d a super-block, on the
// i-quants' CPU kernels.
constexpr DType kTernaryTypes[] = {DType::TQ1_0, DType::TQ2_0};

// Every block type the CUDA backend reads: kBlockTypes, then kIqGridTypes and kTernaryTypes.
inline std::vector<DType> cuda_block_types() {
    std::vector<DType> types(std::begin(kBlockTypes), std::end(kBlockTypes));
    types.insert(types.end(), std::begin(kIqGridTypes), std::end(kIqGridTypes));
    types.insert(types.end(), std::begin(kTernaryTypes), std::end(kTernaryTypes));
    return types;
}

// A random finite f16 of either sign: mostly ± 2^e for e in [−12, 4) times a random
// mantissa; one time in 16 each, 0, the largest f16 (65504) or a subnormal.
inline uint16_t random_block_scale(std::mt19937& rng) {
    std::uniform_int_distribution<int> pick(0, 15);
    const float sign = pick(rng) < 8 ? 1.0f : -1.0f;
    switch (pick(rng)) {
        case 0:
            return float_to_half(0.0f);
        case 1:
            return float_to_half(sign * 65504.0f);
        case 2:
            return float_to_half(sign * 3.0e-7f);  // subnormal in f16
        default:
            break;
    }
    std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
    std::uniform_int_distribution<int> exponent(-12, 3);
    return float_to_half(sign * std::ldexp(mantissa(rng), exponent(rng)));
}

// Byte offsets of a block's f16 scales (d, and dmin or m where the type has one; IQ1_M's d is
// spread over its scales words, MXFP4's scale is an exponent byte: set_block_scale).
inline std::vector<size_t> block_scale_offsets(DType dtype) {
    switch (dtype) {
        case DType::Q4_K:
        case DType::Q5_K:
        case DType::Q4_1:
        case DType::Q5_1:
            return {0, 2};
        case DType::Q2_K:
            return {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)};
        case DType::Q3_K:
            return {offsetof(BlockQ3_K, d)};
        case DType::Q6_K:
            return {offsetof(BlockQ6_K, d)};
        case DType::IQ1_M:  // d lies in the top nibbles of its scales (set_block_scale)
            return {offsetof(BlockIQ1_M, scales)};
        case DType::MXFP4:
            return {offsetof(BlockMXFP4, e)};
        case DType::TQ1_0:
            return {offsetof(BlockTQ1_0, d)};
        case DType::TQ2_0:
            return {offsetof(BlockTQ2_0, d)};
        default:  // Q5_0, IQ4_XS, IQ4_NL, the other i-quants
            return {0};
    }
}

// Bytes of a scale field at a block_scale_offsets offset.
inline size_t block_scale_bytes(DType dtype) { return dtype == DType::MXFP4 ? 1 : 2; }

// The largest MXFP4 exponent whose weights are finite (12 · 2^(252 − 128) < 2^128), as the
// converter allows.
constexpr int kLargestMxfp4Exponent = 252;

// Writes the f16 `scale` at byte `offset` of `block`; IQ1_M's d goes to the top nibbles of its
// four scales words, their other bits kept; MXFP4 takes the exponent e of |scale|'s power of
// two, 2^(e − 128) (e = 0, a subnormal scale, for 0).
inline void set_block_scale(DType dtype, uint8_t* block, size_t offset, uint16_t scale) {
    if (dtype == DType::MXFP4) {
        const float value = std::fabs(half_to_float(scale));
        block[offset] =
            value == 0.0f ? 0
                          : uint8_t(std::clamp(std::ilogb(value) + 128, 0, kLargestMxfp4Exponent));
        return;
    }
    if (dtype != DType::IQ1_M) {
        std::memcpy(block + offset, &scale, sizeof scale);
        return;
    }
    for (int i = 0; i < 4; ++i) {
        uint16_t word;
        std::memcpy(&word, block + offset + 2 * i, sizeof word);
        word = uint16_t((word & 0x0fff) | ((scale >> 4 * i) & 15) << 12);
        std::memcpy(block + offset + 2 * i, &word, sizeof word);
    }
}
// The f16 at byte `offset` of `block`, as set_block_scale writes it (MXFP4: its exponent).
inline uint16_t block_scale(DType dtype, const uint8_t* block, size_t offset) {
    if (dtype == DType::MXFP4) return block[offset];
    if (dtype == DType::IQ1_M) {
        BlockIQ1_M b;
        std::memcpy(&b, block, sizeof b);
        return iq1m_d(b);
    }
    uint16_t scale;
    std::memcpy(&scale, block + offset, sizeof scale);
    return scale;
}

// rows × cols (a multiple of the type's block) of random blocks. The rows start 2 bytes past
// a 4-byte boundary, as a file's block tensors may (they are only 2-byte aligned).
inline TestMatrix make_block_matrix(int rows, int cols, DType dtype, std::mt19937& rng) {
    constexpr size_t kMisalignment = 2;
    TestMatrix m;
    const int blocks = rows * (cols / block_weights(dtype));
    m.storage.resize(kMisalignment + blocks * block_bytes(dtype));
    std::uniform_int_distribution<int> byte(0, 255);
    for (uint8_t& b : m.storage) b = uint8_t(byte(rng));
    uint8_t* data = m.storage.data() + kMisalignment;
    for (int b = 0; b < blocks; ++b)
        for (size_t offset : block_scale_offsets(dtype))
            set_block_scale(dtype, data + b * block_bytes(dtype), offset, random_block_scale(rng));
    m.matrix = Matrix{data, dtype, rows, cols};
    m.values.resize(size_t(rows) * cols);
    for (int r = 0; r < rows; ++r)
        dequantize_row(dtype, m.matrix.row_data(r), &m.values[size_t(r) * cols], cols);
    if (cpu::has_row_tiles(dtype))
        add_row_tiles(&m);  // the super-block types, IQ4_NL and MXFP4, as the CPU backend's
    return m;
}

// Rows `rows` of m made of the largest levels, scales and mins: every byte but the f16 scales
// 0xff (levels 3, 7, 15, 31, 63, IQ4_XS's 113, TQ1_0's trits 2; 6-bit scales and mins 63, Q2_K's
// 4-bit 15) where `fill` is 0xff, or 0 (IQ4_XS's −127, the ternary types' −1; MXFP4's −12 is
// 0xff); their values and tiles follow. With x of one sign the integer sums of the kernels then
// reach their bounds. IQ1_M's d, spread over its scales words, is kept.
inline void fill_rows(TestMatrix* m, std::initializer_list<int> rows, uint8_t fill) {
    const DType dtype = m->matrix.dtype;
    const std::vector<size_t> scales = block_scale_offsets(dtype);
    const size_t bytes = block_bytes(dtype);
    for (int r : rows) {
        uint8_t* row = m->storage.data() + (m->matrix.row_data(r) - m->storage.data());
        std::vector<uint16_t> kept;  // IQ1_M's d, spread over bytes that are filled too
        for (size_t b = 0; b < m->matrix.row_bytes() / bytes; ++b)
            for (size_t at : scales) kept.push_back(block_scale(dtype, row + b * bytes, at));
        for (size_t i = 0; i < m->matrix.row_bytes(); ++i)
            if (std::none_of(scales.begin(), scales.end(), [&](size_t at) {
                    const size_t in_block = i % bytes;
                    return in_block >= at && in_block < at + block_scale_bytes(dtype);
                }))
                row[i] = fill;
        if (dtype == DType::IQ1_M)
            for (size_t b = 0; b < m->matrix.row_bytes() / bytes; ++b)
                set_block_scale(dtype, row + b * bytes, scales[0], kept[b]);
        dequantize_row(dtype, row, &m->values[size_t(r) * m->matrix.cols], m->matrix.cols);
    }
    if (m->row_tiles) add_row_tiles(m);
}

// llama.cpp's Q8_K of x (n a multiple of 256), written from its rule: per 256, max = the
// first value of largest magnitude, sign kept; scale = −127 / max; q = round(scale · x) to
// nearest, ties to even, at most 127; d = 1 / scale; all 0 where max is 0. Sums of 16.
struct Q8K {
    std::vector<float> d;
    std::vector<int8_t> values;
    std::vector<int16_t> sums;
    std::vector<float> dequantized;  // d · q, what the kernels' integer dot products stand for
};
inline Q8K q8_k_by_rule(const std::vector<float>& x) {
    Q8K q;
    const int n = int(x.size());
    for (int first = 0; first < n; first += 256) {
        float max = 0;
        for (int i = first; i < first + 256; ++i)
            if (std::fabs(x[i]) > std::fabs(max)) max = x[i];
        const float scale = max != 0 ? -127.0f / max : 0.0f;
        q.d.push_back(max != 0 ? 1.0f / scale : 0.0f);
        for (int i = first; i < first + 256; ++i) {
            const float product = scale * x[i];
            q.values.push_back(int8_t(std::min(127.0f, std::nearbyint(product))));
            q.dequantized.push_back(q.d.back() * q.values.back());
        }
        for (int s = first; s < first + 256; s += 16) {
            int sum = 0;
            for (int i = s; i < s + 16; ++i) sum += q.values[i];
            q.sums.push_back(int16_t(sum));
        }
    }
    return q;
}

// Random x [n] with the cases of the Q8_K rule: a super-block of zeros, one whose largest
// value is negative and appears again with the other sign, one with exact ties at a scale of
// 1 (largest −127).
inline std::vector<float> q8_k_test_input(int n, std::mt19937& rng) {
    std::vector<float> x = random_floats(n, rng, 3.0f);
    if (n >= 3 * 256) {
        std::fill(x.begin(), x.begin() + 256, 0.0f);
        x[256 + 7] = -5.0f;
        x[256 + 100] = 5.0f;
        const float ties[] = {-127.0f, 2.5f, -2.5f, 0.5f, -0.5f, 3.5f, 127.0f, 126.5f};
        std::copy(std::begin(ties), std::end(ties), x.begin() + 512);
    }
    return x;
}

// want[r] = Σ_c values[r][c] · x[c] in double.
inline std::vector<double> block_reference(const TestMatrix& m, const std::vector<float>& x) {
    std::vector<double> want(m.matrix.rows);
    for (int r = 0; r < m.matrix.rows; ++r)
        for (int c = 0; c < m.matrix.cols; ++c)
            want[r] += double(m.values[size_t(r) * m.matrix.cols + c]) * x[c];
    return want;
}

// The largest |got[r] − want[r]| relative to Σ_c |values[r][c] · x[c]|, over the rows
// [first, first + count): float summation's error measure, row by row (a row of small
// blocks is checked as closely as one of extreme ones).
inline double worst_row_error(const std::vector<float>& got, const std::vector<double>& want,
                              const TestMatrix& m, const std::vector<float>& x, int first,
                              int count) {
    double worst = 0;
    for (int r = first; r < first + count; ++r) {
        double magnitude = 0;
        for (int c = 0; c < m.matrix.cols; ++c)
            magnitude += std::fabs(double(m.values[size_t(r) * m.matrix.cols + c]) * x[c]);
        if (!std::isfinite(got[r])) return INFINITY;  // NaN: never written
        const double error = std::fabs(got[r] - want[r]);
        worst = std::max(worst, magnitude > 0 ? error / magnitude : error);
    }
    return worst;
}

// A decode matvec of tiles of a super-block type (avx512:: or avx2::matvec_rows_block_tiles)
// against the dequantized rows times x quantized by the Q8_K rule: 37 rows (a multiple of no tile,
// rows of the largest levels, scales and mins among them), one and several super-blocks a row, a
// token, part of a pass of tokens, a whole pass (8 tokens on AVX-512, 4 on AVX2) and more, runs of
// rows as threads are given (each starting and ending inside a tile, or a tile's half).
using BlockTileMatvec = void (*)(float* out, size_t out_stride, const Matrix& w,
                                 const cpu::Q8KVector* x, int tokens, int first_row, int row_count);
inline void check_block_tile_matvec(BlockTileMatvec kernel, const std::string& name, DType dtype,
                                    std::mt19937& rng) {
    for (int cols : {256, 1280})
        for (int tokens : {1, 3, 4, 5, 8, 9}) {
            const int rows = 37;
            TestMatrix m = make_block_matrix(rows, cols, dtype, rng);
            // With x of one sign the int32 (and AVX2's int16) sums reach their bounds; row 20
            // holds IQ4_XS's largest magnitude, −127, under the scale −32. Token 1 has x of
            // one sign; of a single token (the AVX2 kernel's own path), with 1280 columns.
            fill_rows(&m, {16, 36}, 0xff);
            fill_rows(&m, {20}, 0);
            const int one_sign_token = tokens > 1 ? 1 : cols == 1280 ? 0 : -1;
            std::vector<cpu::Q8KVector> x_q8_k(tokens);
            std::vector<Q8K> quantized;
            for (int t = 0; t < tokens; ++t) {
                std::vector<float> x = q8_k_test_input(cols, rng);
                if (t == one_sign_token)
                    for (float& v : x) v = std::fabs(v) + 1.0f;  // one sign, no zeros
                quantized.push_back(q8_k_by_rule(x));
                cpu::quantize_q8_k(&x_q8_k[t], x.data(), cols);
            }
            for (auto [first, count] : {std::pair{1, rows - 2}, {17, 3}, {5, 11}, {9, 20}}) {
                std::vector<float> got(size_t(tokens) * rows, NAN);
                kernel(got.data(), rows, m.matrix, x_q8_k.data(), tokens, first, count);
                for (int t = 0; t < tokens; ++t) {
                    INFO(name << " " << matrix_type_name(dtype) << " cols " << cols << " token "
                              << t << " of " << tokens << " rows " << first << ".."
                              << first + count - 1);
                    const std::vector<float> token_got(got.begin() + size_t(t) * rows,
                                                       got.begin() + size_t(t + 1) * rows);
                    const std::vector<double> want = block_reference(m, quantized[t].dequantized);
                    CHECK(worst_row_error(token_got, want, m, quantized[t].dequantized, first,
                                          count) < 1e-6);
                    CHECK(std::isnan(token_got[first - 1]));
                    CHECK(std::isnan(token_got[first + count]));
                }
            }
        }
}

// A decode matvec of IQ4_NL or MXFP4 tiles (avx512:: or avxvnni::matvec_rows_lookup_blocks)
// against the dequantized rows times x quantized per 32 (quantize_q8): rows past one tile of 16
// and off it; an odd and an even count of blocks (two a tile's block), one block alone; rows 16
// and 36 of the largest levels and 20 of zeros (fill_rows) against x of one sign and of both;
// runs of rows as threads are given, the rows outside left alone.
using LookupMatvec = void (*)(float* out, const Matrix& w, const cpu::QuantizedVector& x,
                              int first_row, int row_count);
inline void check_lookup_matvec(LookupMatvec kernel, const std::string& name, DType dtype,
                                std::mt19937& rng) {
    for (const int cols : {32, 64, 96, 1280}) {
        const int rows = 37;
        TestMatrix m = make_block_matrix(rows, cols, dtype, rng);
        fill_rows(&m, {16, 36}, 0xff);
        fill_rows(&m, {20}, 0);
        for (const bool one_sign : {false, true}) {
            std::vector<float> x = random_floats(cols, rng, 4.0f);
            if (one_sign)
                for (float& v : x) v = std::fabs(v) + 1.0f;
            const std::vector<float> x_used = quantized_like_the_kernel(x);
            cpu::QuantizedVector quantized;
            cpu::quantize_q8(&quantized, x.data(), cols);
            const std::vector<double> want = block_reference(m, x_used);
            for (auto [first, count] : {std::pair{1, rows - 2}, {17, 3}, {3, 16}, {36, 1}}) {
                std::vector<float> got(rows, NAN);
                kernel(got.data(), m.matrix, quantized, first, count);
                INFO(name << " " << matrix_type_name(dtype) << " cols " << cols << " one sign "
                          << one_sign << " rows " << first << ".." << first + count - 1);
                CHECK(worst_row_error(got, want, m, x_used, first, count) < 1e-6);
                CHECK(std::all_of(got.begin(), got.begin() + first,
                                  [](float v) { return std::isnan(v); }));
                CHECK(std::all_of(got.begin() + first + count, got.end(),
                                  [](float v) { return std::isnan(v); }));
            }
        }
    }
}

// An i-quant decode matvec (avx2:: or avx512::matvec_rows_iq) against the dequantized rows times
// x quantized by the Q8_K rule: rows a multiple of nothing, one and five super-blocks a row, rows
// 16 and 36 of the largest bytes and 20 of zeros (fill_rows) against x of one sign (every sum at
// its bound) and x of both; runs of rows as threads are given, the rows outside left alone.
using IqMatvec = void (*)(float* out, const Matrix& w, const cpu::Q8KVector& x, int first_row,
                          int row_count);
inline void check_iq_matvec(IqMatvec kernel, const std::string& name, DType dtype,
                            std::mt19937& rng) {
    for (auto [rows, cols] : {std::pair{37, 256}, {53, 1280}}) {
        TestMatrix m = make_block_matrix(rows, cols, dtype, rng);
        fill_rows(&m, {16, 36}, 0xff);
        fill_rows(&m, {20}, 0);
        for (bool one_sign : {false, true}) {
            std::vector<float> x = q8_k_test_input(cols, rng);
            if (one_sign)
                for (float& v : x) v = std::fabs(v) + 1.0f;
            const Q8K quantized = q8_k_by_rule(x);
            cpu::Q8KVector x_q8_k;
            cpu::quantize_q8_k(&x_q8_k, x.data(), cols);
            const std::vector<double> want = block_reference(m, quantized.dequantized);
            for (auto [first, count] : {std::pair{1, rows - 2}, {17, 3}, {5, 11}, {36, 1}}) {
                std::vector<float> got(rows, NAN);
                kernel(got.data(), m.matrix, x_q8_k, first, count);
                INFO(name << " " << matrix_type_name(dtype) << " cols " << cols << " one sign "
                          << one_sign << " rows " << first << ".." << first + count - 1);
                CHECK(worst_row_error(got, want, m, quantized.dequantized, first, count) < 1e-6);
                CHECK(std::all_of(got.begin(), got.begin() + first,
                                  [](float v) { return std::isnan(v); }));
                CHECK(std::all_of(got.begin() + first + count, got.end(),
                                  [](float v) { return std::isnan(v); }));
            }
        }
    }
}

// A prefill GEMM of the block types on 256-bit registers (avx2::gemm_rows_blocks,
// avxvnni::gemm_rows_blocks): out [batch, w.rows] for a run of rows.
using BlockGemmRows = void (*)(float* out, const Matrix& w, const cpu::QuantizedBatch& x,
                               int first_row, int row_count);

// Checks `gemm` on each of `types` (kBlockTypes, kIqGridTypes, kTernaryTypes) against the
// double-precision reference, on x quantized per 32 by `quantize` (avx2::quantize_token's rule);
// where `same_bits_as` is given, its results must also equal that GEMM's bit for bit.
template <size_t kTypes>
void check_block_gemm(const DType (&types)[kTypes], BlockGemmRows gemm, const std::string& name,
                      cpu::QuantizedBatch (*quantize)(const std::vector<float>&, int, int),
                      BlockGemmRows same_bits_as, std::mt19937& rng) {
    for (const DType dtype : types) {
        // Rows off the 32-row tile and its 16-row halves, batches off the 3-token tile; one
        // block a row, and enough for the 16 groups of a micro-kernel call and a part (and,
        // for the blocks of 32, a part of a span of 8 blocks).
        const int block = block_weights(dtype);
        for (int batch : {1, 5, 13})
            for (int cols : {block, block == kSmallBlock ? 21 * block : 3 * block}) {
                const int rows = 45;
                TestMatrix m = make_block_matrix(rows, cols, dtype, rng);
                // Rows 1 and 2 of the largest levels (fill_rows); with x of one sign, every
                // int16 sum of vpmaddubsw pairs then reaches its bound.
                fill_rows(&m, {1}, 0xff);
                fill_rows(&m, {2}, 0);
                // The products reach ±127 × the largest level.
                const std::vector<float> x = one_sign_tokens(batch, cols, rng);
                const std::vector<double> want =
                    reference_gemm(m, rows_quantized_like_the_kernel(x, cols), batch);
                const cpu::QuantizedBatch quantized = quantize(x, batch, cols);
                INFO(name << " " << matrix_type_name(dtype) << " batch " << batch << " cols "
                          << cols);
                // A run of rows not starting at row 0 (a thread's share) over two tiles, one
                // that ends inside the first half of a tile, and the whole matrix, whose last
                // tile runs past its rows.
                for (auto [first, count] : {std::pair{1, rows - 5}, {20, 19}, {0, rows}}) {
                    std::vector<float> got(size_t(batch) * rows, NAN);
                    gemm(got.data(), m.matrix, quantized, first, count);
                    // The super-block types from their tiles (those of make_block_matrix) and
                    // from their rows: the same panel, the same bits.
                    if (m.matrix.row_tiles && !cpu::read_from_tiles_only(dtype)) {
                        Matrix rows_only = m.matrix;
                        rows_only.row_tiles = nullptr;
                        std::vector<float> from_rows(size_t(batch) * rows, NAN);
                        gemm(from_rows.data(), rows_only, quantized, first, count);
                        CHECK(std::memcmp(from_rows.data(), got.data(),
                                          got.size() * sizeof(float)) == 0);
                    }
                    if (same_bits_as) {
                        std::vector<float> other(size_t(batch) * rows, NAN);
                        same_bits_as(other.data(), m.matrix, quantized, first, count);
                        CHECK(std::memcmp(other.data(), got.data(), got.size() * sizeof(float)) ==
                              0);
                    }
                    // f32 sums of terms scaled from subnormal to 65504, which cancel in part
                    // (as for the AVX-512 VNNI kernel). The i-quants' values lie evenly about 0
                    // (IQ1's −1, 0, +1; the ternary types' too), so that their rows cancel further
                    // even against x of one sign: SIMDe's fused multiply-add, rounding twice, came
                    // to 3.2e-5 on IQ1_M.
                    check_row_run(got, want, batch, rows, first, count,
                                  is_iq_grid_type(dtype) || is_ternary_type(dtype) ? 1e-4 : 3e-5);
                }
            }
    }
}

}  // namespace barellm::test
