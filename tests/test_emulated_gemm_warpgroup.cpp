// The warpgroup GEMM of kernels/gemm_warpgroup.cuh (sm_90a: wgmma, TMA copies, clusters
// sharing their tiles) run on the CUDA emulation, launched as launch_gemm_warpgroup launches
// it (its tensor maps made by warpgroup_maps), against a double-precision reference
// from the same rounded inputs: every row-tile shape, clusters of one and two token tiles, f16
// and bf16, the plain product with bias and accumulation and the gated (SwiGLU, GeGLU) form, at
// sizes that are not multiples of the tiles and with more K tiles than stages (each stage
// used several times).
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "emulated_gemm.h"
#include "gated_reference.h"
#include "gemm.cuh"

using namespace barellm;
using namespace barellm::cuda;
using namespace barellm::test;

namespace {

// Runs gemm_warpgroup_kernel<D, Tiles, gated, A> as launch_gemm_warpgroup would: the plain
// product into f32 `out` (up null), or the gated one of w and up (activation A) into
// activations of D.
template <DType D, typename Tiles, Activation A = Activation::Silu>
void launch_emulated_warpgroup(void* out, int out_pitch, int out_cols, PaddedRows& w,
                               PaddedRows* up, PaddedRows& in, const float* bias, bool accumulate) {
    const int k_extent = gemm_k_extent(w.cols, D);
    const WarpgroupOperand up_operand =
        up != nullptr ? WarpgroupOperand{up->data(), up->rows, up->pitch} : WarpgroupOperand{};
    const WarpgroupMaps maps =
        warpgroup_maps<D, Tiles>({w.data(), w.rows, w.pitch}, up != nullptr ? &up_operand : nullptr,
                                 {in.data(), in.rows, in.pitch}, k_extent);
    const dim3 cluster(Tiles::kClusterTokens, Tiles::kClusterRows);
    const dim3 block(kWarpgroupGemmThreads);
    if (up == nullptr)
        emulate_cluster_launch(gemm_warpgroup_grid<Tiles>(in.rows, w.rows), cluster, block,
                               Tiles::kSharedBytes, gemm_warpgroup_kernel<D, Tiles, false>, out,
                               out_pitch, out_cols, in.rows, k_extent, bias, accumulate,
                               maps.weights, maps.up, maps.in);
    else
        emulate_cluster_launch(gemm_warpgroup_grid<Tiles>(in.rows, 2 * w.rows), cluster, block,
                               Tiles::kSharedBytes, gemm_warpgroup_kernel<D, Tiles, true, A>, out,
                               out_pitch, out_cols, in.rows, k_extent, nullptr, false, maps.weights,
                               maps.up, maps.in);
}

template <DType D, typename Tiles>
void check_product(const GemmCase& c, std::mt19937& rng) {
    INFO(dtype_name(D) << " warpgroup tiles of " << Tiles::kRows << " rows, " << Tiles::kStages
                       << " stages, clusters of " << Tiles::kClusterTokens << " x "
                       << Tiles::kClusterRows << ": " << c.tokens << " tokens, " << c.rows
                       << " rows, " << c.cols << " cols, bias " << c.bias << ", accumulate "
                       << c.accumulate);
    PaddedRows w(c.rows, c.cols, D, rng), in(c.tokens, c.cols, D, rng);
    GemmOutput result(c, rng);
    launch_emulated_warpgroup<D, Tiles>(result.out.data(), result.out_pitch, c.rows, w, nullptr, in,
                                        result.bias_or_null(c), c.accumulate);
    result.check(c, w, in);
}

// out[t, r] = act(in · w1[r]) * (in · w3[r]) as D for r < rows (act of A), zeros in the
// padding columns up to out's pitch.
template <DType D, typename Tiles, Activation A>
void check_gated(int tokens, int rows, int cols, std::mt19937& rng) {
    INFO(dtype_name(D) << " gated (" << activation_name(A) << ") warpgroup tiles of "
                       << Tiles::kRows << " rows, clusters of " << Tiles::kClusterTokens << " x "
                       << Tiles::kClusterRows << ": " << tokens << " tokens, " << rows << " rows, "
                       << cols << " cols");
    PaddedRows w1(rows, cols, D, rng), w3(rows, cols, D, rng), in(tokens, cols, D, rng);
    const int pitch = padded_cols(rows, D);
    constexpr uint16_t kPoison = 0x7e00;  // NaN in f16 and a large value in bf16: must go
    AlignedArray<uint16_t> out(size_t(tokens) * pitch, kPoison);
    launch_emulated_warpgroup<D, Tiles, A>(out.data(), pitch, pitch, w1, &w3, in, nullptr, false);
    // The output's rounding to D, and the sums' f32 error (as emulated_gemm.h) carried
    // through act (slope below kActivationSlope) and the product.
    const double rounding = D == DType::F16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    int wrong = 0;
    for (int t = 0; t < tokens; ++t) {
        for (int r = 0; r < pitch; ++r) {
            const double got = from_16bit(D, out[size_t(t) * pitch + r]);
            if (r >= rows) {
                if (got != 0.0 && ++wrong <= 5) {
                    INFO("token " << t << " padding column " << r << " holds " << got);
                    CHECK(false);
                }
                continue;
            }
            double gate = 0, up = 0, gate_magnitude = 0, up_magnitude = 0;
            for (int k = 0; k < cols; ++k) {
                gate += in.at(t, k) * w1.at(r, k);
                up += in.at(t, k) * w3.at(r, k);
                gate_magnitude += std::fabs(in.at(t, k) * w1.at(r, k));
                up_magnitude += std::fabs(in.at(t, k) * w3.at(r, k));
            }
            const auto sum_error = [&](double sum, double magnitude) {
                return 1e-6 * (magnitude + std::fabs(sum) + 1.0) * std::sqrt(cols);
            };
            const double act = activation_reference(A, gate);
            const double want = act * up;
            const double tolerance =
                rounding * std::fabs(want) +
                kActivationSlope * std::fabs(up) * sum_error(gate, gate_magnitude) +
                std::fabs(act) * sum_error(up, up_magnitude) + 1e-6;
            if (!(std::fabs(got - want) <= tolerance) && ++wrong <= 5) {
                INFO("token " << t << " row " << r << ": got " << got << ", want " << want);
                CHECK(false);
            }
        }
    }
    CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("emulated warpgroup gemm matches a double reference", "[cuda_emulation][gemm]") {
    std::mt19937 rng(2026);
    // Two token tiles (clusters of 2 x 2: tiles multicast along both) and more K tiles (9)
    // than the 128-row tiles' 7 stages; a row tile cut by the rows.
    check_product<DType::F16, WarpgroupGemmTiles<128, 2>>({130, 300, 520, true, true}, rng);
    // One token tile, cut short (clusters of 1 x 2: the token tile multicast to both blocks).
    check_product<DType::BF16, WarpgroupGemmTiles<192, 1>>({70, 200, 72, true, false}, rng);
    check_product<DType::F16, WarpgroupGemmTiles<224, 2>>({200, 230, 136, false, true}, rng);
    // 256-row tiles: 4 stages, used twice over 6 K tiles.
    check_product<DType::BF16, WarpgroupGemmTiles<256, 1>>({33, 260, 330, false, false}, rng);
    // Blocks of their own (clusters of 1 x 1: no multicast), as gemm takes them where
    // clusters would take more waves.
    check_product<DType::F16, WarpgroupGemmTiles<192, 1, 1>>({150, 410, 200, true, true}, rng);
}

TEST_CASE("emulated gated warpgroup gemm matches silu(gate) * up and gelu_tanh(gate) * up",
          "[cuda_emulation][gemm]") {
    std::mt19937 rng(2027);
    constexpr Activation kSilu = Activation::Silu, kGelu = Activation::GeluTanh;
    check_gated<DType::F16, WarpgroupGemmTiles<128, 2>, kSilu>(129, 100, 136, rng);
    check_gated<DType::BF16, WarpgroupGemmTiles<224, 1>, kSilu>(17, 150, 300, rng);
    check_gated<DType::F16, WarpgroupGemmTiles<256, 2>, kSilu>(140, 70, 64, rng);
    check_gated<DType::BF16, WarpgroupGemmTiles<128, 1, 1>, kSilu>(130, 90, 200, rng);
    check_gated<DType::F16, WarpgroupGemmTiles<192, 2>, kGelu>(131, 101, 200, rng);
    check_gated<DType::BF16, WarpgroupGemmTiles<128, 1, 1>, kGelu>(17, 70, 136, rng);
}
