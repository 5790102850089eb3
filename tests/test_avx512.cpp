// The AVX-512 kernels called directly, against double-precision references: built on SIMDe
// (namespace avx512_simde, any CPU) and, where the CPU has AVX-512, natively (avx512). Sizes
// cover every tail: columns below, at and past whole registers, steps and groups.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cpu/avx512.h"
#undef BARELLM_AVX512_NAMESPACE
#define BARELLM_AVX512_NAMESPACE avx512_simde
#include "cpu/avx512.h"
#include "test_matrices.h"

using namespace barellm;
using namespace barellm::test;

namespace {

// One build of the AVX-512 kernels.
struct Avx512Build {
    std::string name;
    bool has_vnni;  // whether its Q8/Q4 kernels can run here
    bool has_bf16;  // whether its bf16 GEMM can run here
    decltype(&cpu::avx512::matmul_rows) matmul_rows;
    decltype(&cpu::avx512::matmul_rows_q8) matmul_rows_q8;
    decltype(&cpu::avx512::matmul_rows_q4) matmul_rows_q4;
    decltype(&cpu::avx512::matmul_batch_rows) matmul_batch_rows;
    decltype(&cpu::avx512::pack_token_pair_tile) pack_token_pair_tile;
    decltype(&cpu::avx512::matmul_batch_rows_bf16) matmul_batch_rows_bf16;
};

// SIMDe's always; the native one where this CPU has AVX-512 (printed once).
std::vector<Avx512Build> builds() {
    std::vector<Avx512Build> list = {
        {"simde", true, true, cpu::avx512_simde::matmul_rows, cpu::avx512_simde::matmul_rows_q8,
         cpu::avx512_simde::matmul_rows_q4, cpu::avx512_simde::matmul_batch_rows,
         cpu::avx512_simde::pack_token_pair_tile, cpu::avx512_simde::matmul_batch_rows_bf16}};
    const bool native = cpu::detect_simd_level() == cpu::SimdLevel::Avx512;
    static bool said = false;
    if (!said) {
        std::printf(
            "AVX-512 kernel tests: SIMDe build%s%s%s\n",
            native ? " and native" : " only (this CPU has no AVX-512)",
            native && !cpu::cpu_has_avx512_vnni() ? " (no VNNI: Q8/Q4 on SIMDe only)" : "",
            native && !cpu::cpu_has_avx512_bf16() ? " (no BF16: bf16 GEMM on SIMDe only)" : "");
        said = true;
    }
    if (native)
        list.push_back({"native", cpu::cpu_has_avx512_vnni(), cpu::cpu_has_avx512_bf16(),
                        cpu::avx512::matmul_rows, cpu::avx512::matmul_rows_q8,
                        cpu::avx512::matmul_rows_q4, cpu::avx512::matmul_batch_rows,
                        cpu::avx512::pack_token_pair_tile, cpu::avx512::matmul_batch_rows_bf16});
    return list;
}

std::vector<double> reference_matvec(const TestMatrix& m, const std::vector<float>& x) {
    std::vector<double> want(m.matrix.rows);
    for (int r = 0; r < m.matrix.rows; ++r)
        for (int c = 0; c < m.matrix.cols; ++c)
            want[r] += double(m.values[size_t(r) * m.matrix.cols + c]) * x[c];
    return want;
}

// want[b][r] = Σ_c W[r][c] · x[b][c] in double.
std::vector<double> reference_gemm(const TestMatrix& m, const std::vector<float>& x, int batch) {
    const int rows = m.matrix.rows, cols = m.matrix.cols;
    std::vector<double> want(size_t(batch) * rows);
    for (int b = 0; b < batch; ++b)
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < cols; ++c)
                want[size_t(b) * rows + r] +=
                    double(m.values[size_t(r) * cols + c]) * x[size_t(b) * cols + c];
    return want;
}

// x [batch, cols] as the f32/f16 GEMM reads it: tiles[tile][c][t] = x[tile · 16 + t][c],
// zero past the last token.
std::vector<float> token_tiles(const std::vector<float>& x, int batch, int cols) {
    const int tile_tokens = cpu::avx512::kGemmTokenTile;
    const int tiles = (batch + tile_tokens - 1) / tile_tokens;
    std::vector<float> tiles_data(size_t(tiles) * cols * tile_tokens);
    for (int b = 0; b < batch; ++b)
        for (int c = 0; c < cols; ++c)
            tiles_data[(size_t(b / tile_tokens) * cols + c) * tile_tokens + b % tile_tokens] =
                x[size_t(b) * cols + c];
    return tiles_data;
}

// Each token's rows [first, first + count) of out [batch, rows], one after another.
std::vector<float> gemm_rows(const std::vector<float>& out, int rows, int first, int count) {
    std::vector<float> picked;
    for (size_t b = 0; b < out.size() / rows; ++b)
        picked.insert(picked.end(), out.begin() + b * rows + first,
                      out.begin() + b * rows + first + count);
    return picked;
}
std::vector<double> gemm_rows(const std::vector<double>& out, int rows, int first, int count) {
    std::vector<double> picked;
    for (size_t b = 0; b < out.size() / rows; ++b)
        picked.insert(picked.end(), out.begin() + b * rows + first,
                      out.begin() + b * rows + first + count);
    return picked;
}

// Whether out [batch, rows] is NaN (never written) outside rows [first, first + count).
bool untouched_outside(const std::vector<float>& out, int rows, int first, int count) {
    for (size_t i = 0; i < out.size(); ++i) {
        const int r = int(i % rows);
        if ((r < first || r >= first + count) && !std::isnan(out[i])) return false;
    }
    return true;
}

// The rows [first, first + count) of out, as a vector.
std::vector<float> row_range(const std::vector<float>& out, int first, int count) {
    return {out.begin() + first, out.begin() + first + count};
}
std::vector<double> row_range(const std::vector<double>& out, int first, int count) {
    return {out.begin() + first, out.begin() + first + count};
}

}  // namespace

TEST_CASE("AVX-512 f32/f16/bf16 matvecs match a double-precision reference at every tail") {
    std::mt19937 rng(512);
    const auto dtype = GENERATE(DType::F32, DType::F16, DType::BF16);
    for (const Avx512Build& build : builds())
        for (int cols : {1, 7, 15, 16, 17, 31, 33, 64, 65, 100, 128, 129, 200, 257}) {
            const int rows = 9;
            const TestMatrix m = make_matrix(rows, cols, dtype, rng);
            const std::vector<float> x = random_floats(cols, rng);
            const std::vector<double> want = reference_matvec(m, x);
            // A run of rows not starting at row 0, as a thread's share is.
            const int first = 2, count = 6;
            std::vector<float> got(rows, NAN);
            build.matmul_rows(got.data(), m.matrix, x.data(), first, count);
            INFO(build.name << " " << dtype_name(dtype) << " cols " << cols);
            CHECK(relative_error(row_range(got, first, count), row_range(want, first, count)) <
                  1e-6);
            CHECK(std::isnan(got[first - 1]));
            CHECK(std::isnan(got[first + count]));
        }
}

TEST_CASE("AVX-512 VNNI Q8 and Q4 matvecs equal the integer dot products of quantized x") {
    std::mt19937 rng(513);
    const auto dtype = GENERATE(DType::I8, DType::U8);
    for (const Avx512Build& build : builds()) {
        if (!build.has_vnni) continue;
        // Q8: any width (a short last group); Q4: whole blocks of 32, odd and even counts,
        // more than 16 blocks (two registers of scales).
        const std::vector<int> widths =
            dtype == DType::I8
                ? std::vector<int>{1, 5, 31, 32, 33, 63, 64, 65, 100, 511, 512, 513, 600, 1100}
                : std::vector<int>{32, 64, 96, 160, 512, 544, 608, 1056};
        for (int cols : widths) {
            const int rows = 7;
            const TestMatrix m = make_matrix(rows, cols, dtype, rng);
            // Large values: the int8 products then reach their extremes (±127 × 127).
            const std::vector<float> x = random_floats(cols, rng, 50.0f);
            cpu::QuantizedVector quantized;
            cpu::quantize_q8(&quantized, x.data(), cols);
            const std::vector<double> want = reference_matvec(m, quantized_like_the_kernel(x));
            std::vector<float> got(rows, NAN);
            (dtype == DType::I8 ? build.matmul_rows_q8 : build.matmul_rows_q4)(
                got.data(), m.matrix, quantized, 1, rows - 1);
            INFO(build.name << " " << dtype_name(dtype) << " cols " << cols);
            CHECK(relative_error(row_range(got, 1, rows - 1), row_range(want, 1, rows - 1)) < 1e-6);
            CHECK(std::isnan(got[0]));
        }
    }
}

// Batches of one, part of one, several and an odd number of 16-token tiles; widths below,
// at and past the 256-column block, odd ones (a lone last bf16 column); row runs not
// starting at row 0, past one 12-row tile and the 96-row block, with short last tiles.
constexpr int kGemmBatches[] = {1, 3, 17, 70};
constexpr std::pair<int, int> kGemmShapes[] = {{5, 1}, {7, 7}, {15, 33}, {29, 256}, {101, 517}};

TEST_CASE("AVX-512 f32/f16 prefill GEMM matches a double-precision reference at every tail") {
    std::mt19937 rng(514);
    const auto dtype = GENERATE(DType::F32, DType::F16);
    for (const Avx512Build& build : builds())
        for (int batch : kGemmBatches)
            for (auto [rows, cols] : kGemmShapes) {
                const TestMatrix m = make_matrix(rows, cols, dtype, rng);
                const std::vector<float> x = random_floats(size_t(batch) * cols, rng);
                const std::vector<float> tiles = token_tiles(x, batch, cols);
                const int first = 1, count = rows - 2;
                std::vector<float> got(size_t(batch) * rows, NAN);
                build.matmul_batch_rows(got.data(), m.matrix, tiles.data(), batch, first, count);
                INFO(build.name << " " << dtype_name(dtype) << " batch " << batch << " " << rows
                                << "x" << cols);
                CHECK(relative_error(gemm_rows(got, rows, first, count),
                                     gemm_rows(reference_gemm(m, x, batch), rows, first, count)) <
                      1e-6);
                CHECK(untouched_outside(got, rows, first, count));
            }
}

TEST_CASE("AVX512_BF16 prefill GEMM matches a double-precision reference on x rounded to bf16") {
    std::mt19937 rng(515);
    for (const Avx512Build& build : builds()) {
        if (!build.has_bf16) continue;
        for (int batch : kGemmBatches)
            for (auto [rows, cols] : kGemmShapes) {
                const TestMatrix m = make_matrix(rows, cols, DType::BF16, rng);
                const std::vector<float> x = random_floats(size_t(batch) * cols, rng);
                std::vector<uint32_t> pair_tiles(cpu::avx512::token_pair_tiles_words(batch, cols));
                const int tiles =
                    (batch + cpu::avx512::kGemmTokenTile - 1) / cpu::avx512::kGemmTokenTile;
                for (int tile = 0; tile < tiles; ++tile)
                    build.pack_token_pair_tile(pair_tiles.data(), x.data(), cols, batch, tile);
                const int first = 1, count = rows - 2;
                std::vector<float> got(size_t(batch) * rows, NAN);
                build.matmul_batch_rows_bf16(got.data(), m.matrix, pair_tiles.data(), batch, first,
                                             count);
                INFO(build.name << " batch " << batch << " " << rows << "x" << cols);
                CHECK(relative_error(gemm_rows(got, rows, first, count),
                                     gemm_rows(reference_gemm(m, rounded_to_bf16(x), batch), rows,
                                               first, count)) < 1e-6);
                CHECK(untouched_outside(got, rows, first, count));
            }
    }
}
