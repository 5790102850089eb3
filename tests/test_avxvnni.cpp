// The AVX-VNNI kernels (the Q8/Q4/IQ4_NL/MXFP4 and TQ1_0 decode matvecs, the Q8/Q4 GEMM, the
// block types' GEMM) called directly, on x quantized by the scalar quantize_q8 (quantize_q8_k for
// TQ1_0), against a double-precision reference: built on SIMDe (namespace avxvnni_simde, any CPU)
// and, where the CPU has AVX-VNNI, natively (avxvnni). Sizes cover every tail: columns in short
// last groups, rows past whole panels and tiles, tokens past whole 3-token tiles.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/avx2/avx2.h"
#include "cpu/avx2/avxvnni.h"
// The SIMDe build's declarations: its files were compiled with avxvnni defined so.
#define avxvnni avxvnni_simde
#include "cpu/avx2/avxvnni.h"
#undef avxvnni
#include "test_block_matrices.h"
#include "test_matrices.h"

using namespace barellm;
using namespace barellm::test;

namespace {

// One build of the AVX-VNNI kernels.
struct AvxVnniBuild {
    std::string name;
    decltype(&cpu::avxvnni::matvec_rows_q8) matvec_rows_q8;
    decltype(&cpu::avxvnni::matvec_rows_q4) matvec_rows_q4;
    decltype(&cpu::avxvnni::matvec_rows_lookup_blocks) matvec_rows_lookup_blocks;
    decltype(&cpu::avxvnni::matvec_rows_tq1_0) matvec_rows_tq1_0;
    decltype(&cpu::avxvnni::gemm_rows_quantized) gemm_rows_quantized;
    decltype(&cpu::avxvnni::gemm_rows_blocks) gemm_rows_blocks;
};

// SIMDe's always; the native one where this CPU has AVX-VNNI (printed once).
std::vector<AvxVnniBuild> builds() {
    std::vector<AvxVnniBuild> list = {
        {"simde", cpu::avxvnni_simde::matvec_rows_q8, cpu::avxvnni_simde::matvec_rows_q4,
         cpu::avxvnni_simde::matvec_rows_lookup_blocks, cpu::avxvnni_simde::matvec_rows_tq1_0,
         cpu::avxvnni_simde::gemm_rows_quantized, cpu::avxvnni_simde::gemm_rows_blocks}};
    const bool native = cpu::cpu_has_avx_vnni();
    static bool said = false;
    if (!said) {
        std::printf("AVX-VNNI kernel tests: SIMDe build%s\n",
                    native ? " and native" : " only (this CPU has no AVX-VNNI)");
        said = true;
    }
    if (native)
        list.push_back({"native", cpu::avxvnni::matvec_rows_q8, cpu::avxvnni::matvec_rows_q4,
                        cpu::avxvnni::matvec_rows_lookup_blocks, cpu::avxvnni::matvec_rows_tq1_0,
                        cpu::avxvnni::gemm_rows_quantized, cpu::avxvnni::gemm_rows_blocks});
    return list;
}

}  // namespace

TEST_CASE("AVX-VNNI Q8 and Q4 decode matvec from tiles matches a reference") {
    std::mt19937 rng(614);
    const auto dtype = GENERATE(DType::Q8_0, DType::Q4_0);
    for (const AvxVnniBuild& build : builds())
        check_tile_matvec(dtype, dtype == DType::Q8_0 ? build.matvec_rows_q8 : build.matvec_rows_q4,
                          build.name, rng);
}

TEST_CASE(
    "AVX-VNNI matvec of the looked-up blocks of 32 (IQ4_NL, MXFP4) from their tiles equals the "
    "dequantized rows times x quantized per 32") {
    std::mt19937 rng(616);
    const DType dtype = GENERATE(DType::IQ4_NL, DType::MXFP4);
    for (const AvxVnniBuild& build : builds())
        check_lookup_matvec(build.matvec_rows_lookup_blocks, build.name, dtype, rng);
}

TEST_CASE("AVX-VNNI TQ1_0 matvec equals the dequantized rows times Q8_K x") {
    std::mt19937 rng(706);
    for (const AvxVnniBuild& build : builds())
        check_iq_matvec(build.matvec_rows_tq1_0, build.name, DType::TQ1_0, rng);
}

TEST_CASE(
    "AVX-VNNI Q8 and Q4 GEMM matches a reference, from tiles and rows alike, and each "
    "token the matvec's bits") {
    std::mt19937 rng(615);
    const auto dtype = GENERATE(DType::Q8_0, DType::Q4_0);
    for (const AvxVnniBuild& build : builds()) {
        // Q8: short last groups; Q4: whole blocks. Rows are not multiples of the 16-row
        // panel, batches not multiples of the 3-token tile; up to 16 tokens read the tiles
        // directly, more pack panels.
        const std::vector<int> widths = dtype == DType::Q8_0 ? std::vector<int>{5, 33, 100, 600}
                                                             : std::vector<int>{32, 96, 608};
        for (int batch : {1, 2, 4, 8, 16, 17, 70})
            for (int cols : widths) {
                const int rows = 43;
                const TestMatrix m = make_matrix(rows, cols, dtype, rng);
                Matrix rows_only = m.matrix;
                rows_only.row_tiles = nullptr;
                // Large values: the int8 products then reach their extremes (±127 × 127).
                const std::vector<float> x = random_floats(size_t(batch) * cols, rng, 50.0f);
                const std::vector<double> want =
                    reference_gemm(m, rows_quantized_like_the_kernel(x, cols), batch);
                const cpu::QuantizedBatch quantized = quantized_batch_by_rule(x, batch, cols);
                INFO(build.name << " " << dtype_name(dtype) << " batch " << batch << " cols "
                                << cols);
                // A run of rows not starting at row 0 (a thread's share) over three panels,
                // and the whole matrix, whose last panel runs past its rows.
                for (auto [first, count] : {std::pair{3, rows - 8}, {0, rows}}) {
                    std::vector<float> got(size_t(batch) * rows, NAN);
                    build.gemm_rows_quantized(got.data(), m.matrix, quantized, first, count);
                    check_row_run(got, want, batch, rows, first, count, 1e-6);
                    // The rows packed into the same panels: the same bits.
                    std::vector<float> from_rows(size_t(batch) * rows, NAN);
                    build.gemm_rows_quantized(from_rows.data(), rows_only, quantized, first, count);
                    CHECK(std::memcmp(from_rows.data(), got.data(), got.size() * sizeof(float)) ==
                          0);
                    // Each token alone through the decode matvec: the same bits.
                    for (int b = 0; b < batch; ++b) {
                        cpu::QuantizedVector token;
                        cpu::quantize_q8(&token, x.data() + size_t(b) * cols, cols);
                        std::vector<float> alone(rows, NAN);
                        (dtype == DType::Q8_0 ? build.matvec_rows_q8 : build.matvec_rows_q4)(
                            alone.data(), m.matrix, token, first, count);
                        CHECK(std::memcmp(alone.data() + first,
                                          got.data() + size_t(b) * rows + first,
                                          count * sizeof(float)) == 0);
                    }
                }
            }
    }
}

TEST_CASE("AVX-VNNI prefill GEMM of the block types matches a reference and the AVX2 one's bits") {
    std::mt19937 rng(519);
    // The native build gives the plain AVX2 build's results: the same int32 dots in the same f32
    // order. (SIMDe's fused multiply-add rounds twice, so its build only comes near them.)
    for (const AvxVnniBuild& build : builds())
        check_block_gemm(kBlockTypes, build.gemm_rows_blocks, build.name, quantized_batch_by_rule,
                         build.name == "native" ? cpu::avx2::gemm_rows_blocks : nullptr, rng);
}

TEST_CASE("AVX-VNNI prefill GEMM of the i-quants matches a reference and the AVX2 one's bits") {
    std::mt19937 rng(529);
    for (const AvxVnniBuild& build : builds())
        check_block_gemm(kIqGridTypes, build.gemm_rows_blocks, build.name, quantized_batch_by_rule,
                         build.name == "native" ? cpu::avx2::gemm_rows_blocks : nullptr, rng);
}

TEST_CASE(
    "AVX-VNNI prefill GEMM of the ternary types matches a reference and the AVX2 one's bits") {
    std::mt19937 rng(530);
    for (const AvxVnniBuild& build : builds())
        check_block_gemm(kTernaryTypes, build.gemm_rows_blocks, build.name, quantized_batch_by_rule,
                         build.name == "native" ? cpu::avx2::gemm_rows_blocks : nullptr, rng);
}
