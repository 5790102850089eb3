// Test inputs for the CPU kernel tests: random non-zero floats, weight matrices of every
// storage type with the exact values they decode to, quantized independently of the
// kernels, x rounded as the kernels that round it do, and the error measure the tests
// compare with.
#pragma once
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/quantized_tiles.h"
#include "weights/half.h"
#include "weights/model.h"

namespace barellm::test {

inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float scale = 1.0f) {
    std::uniform_real_distribution<float> dist(-scale, scale);
    std::vector<float> values(n);
    for (float& v : values) {
        do v = dist(rng);
        while (v == 0.0f);
    }
    return values;
}

// A weight matrix in `dtype` plus its exact float values.
struct TestMatrix {
    std::vector<uint8_t> storage;
    std::vector<uint16_t> scales;  // Q8 and Q4 only: f16 [rows, groups]
    cpu::AlignedBytes row_tiles;   // Q8 and Q4 only: the tiles of the AVX-512 VNNI kernels
    std::vector<float> values;     // what the stored weights decode to
    Matrix matrix;
};

// Q8 and Q4 test matrices carry their tiles, as the CPU backend's do.
inline void add_row_tiles(TestMatrix* m) {
    m->row_tiles = cpu::make_row_tiles(m->matrix);
    m->matrix.row_tiles = m->row_tiles.get();
}

// Quantizes `values` [n] in groups of 32 as docs/FORMAT.md says, written out here
// independently of the kernels: scale = f16(max |v| / 127), q = round(v / scale).
inline void quantize_groups(const float* values, int n, int8_t* quantized, float* scales) {
    for (int first = 0, g = 0; first < n; first += 32, ++g) {
        const int last = std::min(n, first + 32);
        float largest = 0;
        for (int i = first; i < last; ++i) largest = std::max(largest, std::fabs(values[i]));
        const float scale = half_to_float(float_to_half(largest / 127));
        scales[g] = scale;
        for (int i = first; i < last; ++i) {
            const float ratio = scale > 0 ? values[i] / scale : 0;
            const float rounded = ratio < 0 ? -std::floor(-ratio + 0.5f) : std::floor(ratio + 0.5f);
            quantized[i] = int8_t(std::clamp(rounded, -127.0f, 127.0f));
        }
    }
}

// Quantizes one row [cols] (a multiple of 32) to Q4 as docs/FORMAT.md says, written out
// here independently of the converter: per block, m = the first value of largest
// magnitude, d = m / -8, q = min(15, int(v / d + 8.5)) computed as v * (1 / d) in float,
// the stored scale f16(d); byte j holds q of column j (low nibble) and j + 16 (high).
// `decoded` gets f16(d) × (q - 8).
inline void quantize_q4_row(const float* values, int cols, uint8_t* packed, uint16_t* scales,
                            float* decoded) {
    for (int block = 0; block < cols / 32; ++block) {
        const float* v = values + block * 32;
        float largest = 0;
        for (int i = 0; i < 32; ++i)
            if (std::fabs(v[i]) > std::fabs(largest)) largest = v[i];
        const float d = largest / -8.0f;
        const volatile float inverse = d != 0 ? 1.0f / d : 0.0f;
        scales[block] = float_to_half(d);
        int q[32];
        for (int i = 0; i < 32; ++i) {
            const volatile float product = v[i] * inverse;  // rounded before the addition
            q[i] = std::min(15, int(product + 8.5f));
            decoded[block * 32 + i] = half_to_float(scales[block]) * float(q[i] - 8);
        }
        for (int j = 0; j < 16; ++j) packed[block * 16 + j] = uint8_t(q[j] | (q[j + 16] << 4));
    }
}

inline TestMatrix make_matrix(int rows, int cols, DType dtype, std::mt19937& rng) {
    TestMatrix m;
    m.values = random_floats(size_t(rows) * cols, rng);
    if (dtype == DType::Q4_0) {
        const int blocks = cols / 32;
        m.storage.resize(size_t(rows) * cols / 2);
        m.scales.resize(size_t(rows) * blocks);
        for (int r = 0; r < rows; ++r)
            quantize_q4_row(&m.values[size_t(r) * cols], cols, &m.storage[size_t(r) * cols / 2],
                            &m.scales[size_t(r) * blocks], &m.values[size_t(r) * cols]);
        m.matrix = Matrix{m.storage.data(), dtype, rows, cols, m.scales.data()};
        add_row_tiles(&m);
        return m;
    }
    m.storage.resize(m.values.size() * dtype_size(dtype));
    if (dtype == DType::Q8_0) {
        const int groups = (cols + 31) / 32;
        m.scales.resize(size_t(rows) * groups);
        std::vector<float> scales(groups);
        for (int r = 0; r < rows; ++r) {
            int8_t* quantized = reinterpret_cast<int8_t*>(m.storage.data()) + size_t(r) * cols;
            quantize_groups(&m.values[size_t(r) * cols], cols, quantized, scales.data());
            for (int c = 0; c < cols; ++c)
                m.values[size_t(r) * cols + c] = quantized[c] * scales[c / 32];
            for (int g = 0; g < groups; ++g)
                m.scales[size_t(r) * groups + g] = float_to_half(scales[g]);
        }
        m.matrix = Matrix{m.storage.data(), dtype, rows, cols, m.scales.data()};
        add_row_tiles(&m);
        return m;
    }
    for (size_t i = 0; i < m.values.size(); ++i) {
        if (dtype == DType::F32) {
            reinterpret_cast<float*>(m.storage.data())[i] = m.values[i];
        } else {
            const uint16_t bits = dtype == DType::F16 ? float_to_half(m.values[i])
                                                      : uint16_t(float_to_bits(m.values[i]) >> 16);
            reinterpret_cast<uint16_t*>(m.storage.data())[i] = bits;
            m.values[i] = dtype == DType::F16 ? half_to_float(bits) : bf16_to_float(bits);
        }
    }
    m.matrix = Matrix{m.storage.data(), dtype, rows, cols};
    return m;
}

inline double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        diff += (got[i] - want[i]) * (got[i] - want[i]);
        norm += want[i] * want[i];
    }
    return std::sqrt(diff / norm);
}

// x's Q8 scale and multiplier by the rule llama.cpp's block_q8_0 follows, written out here:
// scale = max |x| / 127 rounded to f16 where that is a normal f16 (else the f32 quotient),
// multiplier = 127 / max |x| (0 for zeros); q = x · multiplier, nearest integer, ties to even.
struct Q8Rule {
    float scale, multiplier;
};
inline Q8Rule q8_rule(float largest) {
    if (largest == 0) return {0, 0};
    const float quotient = largest / 127;
    const bool normal_half = quotient >= std::ldexp(1.0f, -14) && quotient <= 65504.0f;
    return {normal_half ? half_to_float(float_to_half(quotient)) : quotient, 127 / largest};
}

// x as the SIMD Q8/Q4 matvecs and the VNNI GEMMs use it: per group of 32, q8_rule's q × scale,
// in f32 as the kernels compute it.
inline std::vector<float> quantized_like_the_kernel(const std::vector<float>& x) {
    const int n = int(x.size());
    std::vector<float> out(n);
    for (int first = 0; first < n; first += 32) {
        const int last = std::min(n, first + 32);
        float largest = 0;
        for (int i = first; i < last; ++i) largest = std::max(largest, std::fabs(x[i]));
        const Q8Rule rule = q8_rule(largest);
        for (int i = first; i < last; ++i)
            out[i] = std::nearbyint(x[i] * rule.multiplier) * rule.scale;
    }
    return out;
}

// x [rows, cols] with each row quantized like the kernel, as the VNNI prefill GEMMs quantize
// each token.
inline std::vector<float> rows_quantized_like_the_kernel(const std::vector<float>& x, int cols) {
    std::vector<float> out;
    out.reserve(x.size());
    for (size_t first = 0; first < x.size(); first += cols) {
        const std::vector<float> row =
            quantized_like_the_kernel({x.begin() + first, x.begin() + first + cols});
        out.insert(out.end(), row.begin(), row.end());
    }
    return out;
}

// x as the AVX512_BF16 GEMM uses it: each value rounded to the nearer of the two bf16 values
// around it, the one with an even last bit on a tie (x finite).
inline std::vector<float> rounded_to_bf16(const std::vector<float>& x) {
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        uint32_t bits;
        std::memcpy(&bits, &x[i], sizeof bits);
        const uint16_t toward_zero = uint16_t(bits >> 16);
        const uint16_t away = uint16_t(toward_zero + 1);
        const double below = std::abs(double(bf16_to_float(toward_zero)) - x[i]);
        const double above = std::abs(double(bf16_to_float(away)) - x[i]);
        const bool take_away = above < below || (above == below && (away & 1) == 0);
        out[i] = bf16_to_float(take_away ? away : toward_zero);
    }
    return out;
}

// x [batch, cols] as the integer GEMMs' quantize_token lays it out, from quantize_q8 (the
// rule they follow): each token's values padded with zeros to whole groups, its scales, each
// group's start (−128 × Σ values, see cpu::QuantizedBatch) and its sums of 16.
inline cpu::QuantizedBatch quantized_batch_by_rule(const std::vector<float>& x, int batch,
                                                   int cols) {
    cpu::QuantizedBatch q;
    cpu::resize_quantized_batch(&q, batch, cols);
    for (int b = 0; b < batch; ++b) {
        cpu::QuantizedVector v;
        cpu::quantize_q8(&v, x.data() + size_t(b) * cols, cols);
        for (int c = 0; c < q.padded_cols; ++c)
            q.values[size_t(b) * q.padded_cols + c] = c < cols ? v.values[c] : 0;
        for (int g = 0; g < q.groups; ++g) {
            q.scales[size_t(b) * q.groups + g] = v.scales[g];
            q.starts[size_t(b) * q.groups + g] = -128 * int(v.group_sums[g]);
            for (int half = 0; half < 2; ++half) {
                int sum = 0;
                for (int c = 32 * g + 16 * half; c < 32 * g + 16 * (half + 1); ++c)
                    sum += q.values[size_t(b) * q.padded_cols + c];
                q.half_sums[(size_t(b) * q.groups + g) * 2 + half] = sum;
            }
        }
    }
    return q;
}

// Quantizes three tokens of random x of `cols` columns with an integer GEMM's quantize_token
// and compares them with quantized_batch_by_rule: "" where every value (padding included),
// scale, start and sum of 16 is equal, else the first difference. x includes exact halves
// where the multiplier is 1 (a largest value of 127): quantize_q8 rounds them to even; just
// below a half rounds to 0.
using QuantizeToken = void (*)(cpu::QuantizedBatch*, const float*, int, int);
inline std::string quantize_token_difference(QuantizeToken quantize_token, int cols,
                                             std::mt19937& rng) {
    const int batch = 3;
    std::vector<float> x = random_floats(size_t(batch) * cols, rng, 5.0f);
    if (cols >= 8) {
        const float halves[] = {127.0f, 2.5f, -2.5f, 0.5f, -0.5f, 0.49999997f, -1.5f};
        std::copy(std::begin(halves), std::end(halves), x.begin() + cols);
    }
    // The last token's groups with scales outside f16's normal numbers (kept in f32) and at
    // its edges: largest |x| of 1e-4, 127 · 2^-14, 127 · 65504 and 1e8.
    const float largest[] = {1e-4f, 127.0f * 6.1035156e-5f, 127.0f * 65504.0f, 1e8f};
    for (int g = 0; g < 4 && (g + 1) * 32 <= cols; ++g) {
        float* group = x.data() + size_t(batch - 1) * cols + g * 32;
        for (int i = 0; i < 32; ++i) group[i] *= largest[g] / 5.0f;
        group[g] = largest[g];
    }
    cpu::QuantizedBatch got;
    cpu::resize_quantized_batch(&got, batch, cols);
    for (int b = 0; b < batch; ++b) quantize_token(&got, x.data() + size_t(b) * cols, cols, b);
    const cpu::QuantizedBatch want = quantized_batch_by_rule(x, batch, cols);
    for (size_t i = 0; i < want.values.size(); ++i)
        if (got.values[i] != want.values[i]) return "value " + std::to_string(i);
    for (size_t i = 0; i < want.scales.size(); ++i) {
        if (got.scales[i] != want.scales[i]) return "scale " + std::to_string(i);
        if (got.starts[i] != want.starts[i]) return "start " + std::to_string(i);
    }
    for (size_t i = 0; i < want.half_sums.size(); ++i)
        if (got.half_sums[i] != want.half_sums[i]) return "sum of 16 " + std::to_string(i);
    return "";
}

// The elements [first, first + count) of out, as a vector.
template <typename Value>
std::vector<Value> row_range(const std::vector<Value>& out, int first, int count) {
    return {out.begin() + first, out.begin() + first + count};
}

// Random x [batch, cols] of large values (its quantized products reach their extremes), token
// 0 all positive and token 1 (where there is one) all negative: with weights of one sign an
// integer GEMM's sums then reach their bounds.
inline std::vector<float> one_sign_tokens(int batch, int cols, std::mt19937& rng) {
    std::vector<float> x = random_floats(size_t(batch) * cols, rng, 50.0f);
    for (int c = 0; c < cols; ++c) {
        x[c] = std::fabs(x[c]);
        if (batch > 1) x[cols + c] = -std::fabs(x[cols + c]);
    }
    return x;
}

// Rows 1 and 2 of a Q4 test matrix (at least three rows) made all nibbles 15 (value 7) and all
// nibbles 0 (value −8): with x of one sign (one_sign_tokens), the int16 sums of the Q4 kernels'
// vpmaddubsw pairs reach their bounds.
inline void set_extreme_q4_rows(TestMatrix* m) {
    const int cols = m->matrix.cols, blocks = cols / kQ4Block;
    for (auto [row, fill, value] : {std::tuple{1, 0xff, 7}, {2, 0x00, -8}}) {
        std::fill_n(&m->storage[size_t(row) * cols / 2], cols / 2, uint8_t(fill));
        for (int c = 0; c < cols; ++c)
            m->values[size_t(row) * cols + c] =
                value * half_to_float(m->scales[size_t(row) * blocks + c / kQ4Block]);
    }
}

// Checks the rows [first, first + count) of each token of got [batch, rows] against want
// within `limit` (relative), and that the rows just outside the run were left NaN.
template <typename Want>
void check_row_run(const std::vector<float>& got, const std::vector<Want>& want, int batch,
                   int rows, int first, int count, double limit) {
    for (int b = 0; b < batch; ++b) {
        const int row0 = b * rows;
        CHECK(relative_error(row_range(got, row0 + first, count),
                             row_range(want, row0 + first, count)) < limit);
        if (first > 0) CHECK(std::isnan(got[row0 + first - 1]));
        if (first + count < rows) CHECK(std::isnan(got[row0 + first + count]));
    }
}

// want[b][r] = Σ_c W[r][c] · x[b][c] for x [batch, cols], out [batch, rows].
inline std::vector<double> reference_gemm(const TestMatrix& m, const std::vector<float>& x,
                                          int batch) {
    const int rows = m.matrix.rows, cols = m.matrix.cols;
    std::vector<double> want(size_t(batch) * rows);
    for (int b = 0; b < batch; ++b)
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < cols; ++c)
                want[size_t(b) * rows + r] +=
                    double(m.values[size_t(r) * cols + c]) * x[size_t(b) * cols + c];
    return want;
}

// A Q8 or Q4 decode matvec from tiles (AVX-512 VNNI's, AVX-VNNI's) against a double reference
// on x quantized as the kernel reads it. Q8: any width (a short last group); Q4: whole blocks of
// 32; odd and even group counts (a tile's blocks hold two groups, the last one maybe only one).
// Three tiles of 16 rows, the last partial; runs of rows from a tile's middle to another's and
// within one half of 8 rows, as threads are given; NaN guards either side.
using QuantizedMatvec = void (*)(float*, const Matrix&, const cpu::QuantizedVector&, int, int);
inline void check_tile_matvec(DType dtype, QuantizedMatvec matvec, const std::string& name,
                              std::mt19937& rng) {
    const std::vector<int> widths =
        dtype == DType::Q8_0
            ? std::vector<int>{1, 5, 31, 32, 33, 63, 64, 65, 100, 511, 512, 513, 600, 1100}
            : std::vector<int>{32, 64, 96, 160, 512, 544, 608, 1056};
    for (int cols : widths) {
        const int rows = 37;
        const TestMatrix m = make_matrix(rows, cols, dtype, rng);
        // Large values: the int8 products then reach their extremes (±127 × 127).
        const std::vector<float> x = random_floats(cols, rng, 50.0f);
        cpu::QuantizedVector quantized;
        cpu::quantize_q8(&quantized, x.data(), cols);
        const std::vector<double> want = reference_gemm(m, quantized_like_the_kernel(x), 1);
        for (auto [first, count] : {std::pair{1, rows - 2}, {17, 3}, {5, 11}, {9, 26}}) {
            std::vector<float> got(rows, NAN);
            matvec(got.data(), m.matrix, quantized, first, count);
            INFO(name << " " << dtype_name(dtype) << " cols " << cols << " rows " << first << ".."
                      << first + count - 1);
            CHECK(relative_error(row_range(got, first, count), row_range(want, first, count)) <
                  1e-6);
            CHECK(std::isnan(got[first - 1]));
            CHECK(std::isnan(got[first + count]));
        }
    }
}

}  // namespace barellm::test
