// The AVX-512 kernels called directly, against double-precision references: built on SIMDe
// (namespace avx512_simde, any CPU) and, where the CPU has AVX-512, natively (avx512). Sizes
// cover every tail: columns below, at and past whole registers, steps and groups.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <random>
#include <string>
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
    decltype(&cpu::avx512::matmul_rows) matmul_rows;
    decltype(&cpu::avx512::matmul_rows_q8) matmul_rows_q8;
    decltype(&cpu::avx512::matmul_rows_q4) matmul_rows_q4;
    decltype(&cpu::avx512::resize_quantized_batch) resize_quantized_batch;
    decltype(&cpu::avx512::quantize_token) quantize_token;
    decltype(&cpu::avx512::matmul_batch_rows_quantized) matmul_batch_rows_quantized;
};

// SIMDe's always; the native one where this CPU has AVX-512 (printed once).
std::vector<Avx512Build> builds() {
    std::vector<Avx512Build> list = {
        {"simde", true, cpu::avx512_simde::matmul_rows, cpu::avx512_simde::matmul_rows_q8,
         cpu::avx512_simde::matmul_rows_q4, cpu::avx512_simde::resize_quantized_batch,
         cpu::avx512_simde::quantize_token, cpu::avx512_simde::matmul_batch_rows_quantized}};
    const bool native = cpu::detect_simd_level() == cpu::SimdLevel::Avx512;
    static bool said = false;
    if (!said) {
        std::printf(
            "AVX-512 kernel tests: SIMDe build%s\n",
            native ? (cpu::cpu_has_avx512_vnni() ? " and native (with VNNI)"
                                                 : " and native (no VNNI: Q8/Q4 on SIMDe only)")
                   : " only (this CPU has no AVX-512)");
        said = true;
    }
    if (native)
        list.push_back({"native", cpu::cpu_has_avx512_vnni(), cpu::avx512::matmul_rows,
                        cpu::avx512::matmul_rows_q8, cpu::avx512::matmul_rows_q4,
                        cpu::avx512::resize_quantized_batch, cpu::avx512::quantize_token,
                        cpu::avx512::matmul_batch_rows_quantized});
    return list;
}

std::vector<double> reference_matvec(const TestMatrix& m, const std::vector<float>& x) {
    std::vector<double> want(m.matrix.rows);
    for (int r = 0; r < m.matrix.rows; ++r)
        for (int c = 0; c < m.matrix.cols; ++c)
            want[r] += double(m.values[size_t(r) * m.matrix.cols + c]) * x[c];
    return want;
}

// want[b][r] = Σ_c W[r][c] · x[b][c] for x [batch, cols], out [batch, rows].
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

TEST_CASE("AVX-512 quantize_token quantizes each token exactly as quantize_q8") {
    std::mt19937 rng(514);
    for (const Avx512Build& build : builds())
        for (int cols : {1, 16, 17, 31, 32, 33, 100, 600}) {
            const int batch = 3;
            std::vector<float> x = random_floats(size_t(batch) * cols, rng, 5.0f);
            // Exact halves where the scale is 1 (a largest value of 127): quantize_q8 rounds
            // them away from zero; just below a half rounds to 0.
            if (cols >= 8) {
                const float halves[] = {127.0f, 2.5f, -2.5f, 0.5f, -0.5f, 0.49999997f, -1.5f};
                std::copy(std::begin(halves), std::end(halves), x.begin() + cols);
            }
            cpu::QuantizedBatch quantized;
            build.resize_quantized_batch(&quantized, batch, cols);
            for (int b = 0; b < batch; ++b)
                build.quantize_token(&quantized, x.data() + size_t(b) * cols, cols, b);
            INFO(build.name << " cols " << cols);
            for (int b = 0; b < batch; ++b) {
                cpu::QuantizedVector want;
                cpu::quantize_q8(&want, x.data() + size_t(b) * cols, cols);
                for (int c = 0; c < quantized.padded_cols; ++c)
                    REQUIRE(int(quantized.values[size_t(b) * quantized.padded_cols + c]) ==
                            (c < cols ? int(want.values[c]) : 0));
                for (int g = 0; g < quantized.groups; ++g) {
                    REQUIRE(quantized.scales[size_t(b) * quantized.groups + g] == want.scales[g]);
                    REQUIRE(quantized.starts[size_t(b) * quantized.groups + g] ==
                            -128 * int(want.group_sums[g]));
                }
            }
        }
}

TEST_CASE("AVX-512 VNNI Q8 and Q4 prefill GEMM matches a reference on quantized x") {
    std::mt19937 rng(515);
    const auto dtype = GENERATE(DType::I8, DType::U8);
    for (const Avx512Build& build : builds()) {
        if (!build.has_vnni) continue;
        // Q8: short last groups; Q4: whole blocks. Rows are not multiples of the 32-row
        // tile, batches not multiples of the 6-token tile.
        const std::vector<int> widths =
            dtype == DType::I8 ? std::vector<int>{5, 33, 100, 600} : std::vector<int>{32, 96, 608};
        for (int batch : {1, 3, 17, 70})
            for (int cols : widths) {
                const int rows = 75;
                const TestMatrix m = make_matrix(rows, cols, dtype, rng);
                // Large values: the int8 products then reach their extremes (±127 × 127).
                const std::vector<float> x = random_floats(size_t(batch) * cols, rng, 50.0f);
                const std::vector<double> want =
                    reference_gemm(m, rows_quantized_like_the_kernel(x, cols), batch);
                cpu::QuantizedBatch quantized;
                build.resize_quantized_batch(&quantized, batch, cols);
                for (int b = 0; b < batch; ++b)
                    build.quantize_token(&quantized, x.data() + size_t(b) * cols, cols, b);
                // A run of rows not starting at row 0 (a thread's share), over two tiles.
                const int first = 3, count = rows - 5;
                std::vector<float> got(size_t(batch) * rows, NAN);
                build.matmul_batch_rows_quantized(got.data(), m.matrix, quantized, first, count);
                INFO(build.name << " " << dtype_name(dtype) << " batch " << batch << " cols "
                                << cols);
                for (int b = 0; b < batch; ++b) {
                    const size_t row0 = size_t(b) * rows;
                    CHECK(relative_error(row_range(got, int(row0) + first, count),
                                         row_range(want, int(row0) + first, count)) < 1e-6);
                    CHECK(std::isnan(got[row0 + first - 1]));
                    CHECK(std::isnan(got[row0 + first + count]));
                }
            }
    }
}

TEST_CASE("AVX-512 VNNI prefill GEMM of several Q8 and Q4 matrices on several threads") {
    if (cpu::detect_simd_level() < cpu::SimdLevel::Avx512 || !cpu::cpu_has_avx512_vnni()) return;
    std::mt19937 rng(516);
    const auto dtype = GENERATE(DType::I8, DType::U8);
    const int threads = GENERATE(2, 3);
    const int saved_threads = omp_get_max_threads();
    omp_set_num_threads(threads);
    cpu::set_simd_level(cpu::SimdLevel::Avx512);
    // Enough rows for every thread; row counts off the 32-row tile, so that the runs the
    // threads claim straddle the boundary between the matrices.
    const int batch = 23, cols = dtype == DType::I8 ? 330 : 320;
    const TestMatrix first = make_matrix(301, cols, dtype, rng);
    const TestMatrix second = make_matrix(45, cols, dtype, rng);
    const std::vector<float> x = random_floats(size_t(batch) * cols, rng);
    std::vector<float> got_first(size_t(batch) * 301, NAN), got_second(size_t(batch) * 45, NAN);
    cpu::matmul_batch_many(
        x.data(), batch, {{got_first.data(), &first.matrix}, {got_second.data(), &second.matrix}});
    cpu::set_simd_level(cpu::detect_simd_level());
    omp_set_num_threads(saved_threads);
    const std::vector<float> x_quantized = rows_quantized_like_the_kernel(x, cols);
    INFO(dtype_name(dtype) << " " << threads << " threads");
    CHECK(relative_error(got_first, reference_gemm(first, x_quantized, batch)) < 1e-6);
    CHECK(relative_error(got_second, reference_gemm(second, x_quantized, batch)) < 1e-6);
}
