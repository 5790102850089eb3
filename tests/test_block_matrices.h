// Test inputs for the kernels of the block types (weight_blocks.h): matrices of random
// blocks (every byte random, except the f16 scales, which are finite, of both signs and now
// and then extreme) with the values dequantize_row gives them, and x quantized per 256 by
// llama.cpp's Q8_K rule written out here, independently of the kernels.
#pragma once
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/kernels.h"
#include "half.h"
#include "test_matrices.h"
#include "weight_blocks.h"

namespace barellm::test {

// A random finite f16 of either sign: mostly of magnitude 2^-3..2^2; one in eight the
// largest f16 (65504), a subnormal or zero.
inline uint16_t random_block_scale(std::mt19937& rng) {
    std::uniform_real_distribution<float> magnitude(0.125f, 4.0f);
    const float sign = rng() % 2 ? -1.0f : 1.0f;
    switch (rng() % 16) {
        case 0:
            return float_to_half(sign * 65504.0f);
        case 1:
            return float_to_half(sign * 3.0e-7f);  // subnormal in f16
        default:
            return float_to_half(sign * magnitude(rng));
    }
}

// A [rows, cols] matrix of block type `dtype` (cols a multiple of its block), random
// blocks, and its values as dequantize_row decodes them.
inline TestMatrix make_block_matrix(int rows, int cols, DType dtype, std::mt19937& rng) {
    TestMatrix m;
    const int blocks = rows * (cols / block_weights(dtype));
    const size_t bytes = block_bytes(dtype);
    m.storage.resize(size_t(blocks) * bytes);
    for (uint8_t& byte : m.storage) byte = uint8_t(rng());
    // The f16 fields: d (and dmin or m) at the start, Q6_K's d at its end.
    for (int b = 0; b < blocks; ++b) {
        uint8_t* block = m.storage.data() + size_t(b) * bytes;
        const int scales = dtype == DType::Q5_0 || dtype == DType::IQ4_XS ? 1 : 2;
        uint8_t* first = dtype == DType::Q6_K ? block + bytes - 2 : block;
        for (int s = 0; s < (dtype == DType::Q6_K ? 1 : scales); ++s) {
            const uint16_t bits = random_block_scale(rng);
            std::memcpy(first + 2 * s, &bits, sizeof bits);
        }
    }
    m.values.resize(size_t(rows) * cols);
    m.matrix = Matrix{m.storage.data(), dtype, rows, cols};
    for (int r = 0; r < rows; ++r)
        dequantize_row(dtype, m.matrix.row_data(r), m.values.data() + size_t(r) * cols, cols);
    return m;
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

}  // namespace barellm::test
