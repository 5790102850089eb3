// The batched-prefill GEMM kernels of kernels/gemm.cuh run on the CUDA emulation, launched as
// gemm_with_tiles launches them, against a double-precision reference from the same rounded
// inputs: every tile shape, f16 and bf16 on tensor cores, f32 and bf16 on the SIMT kernel, at
// sizes that are not multiples of the tiles, with bias, accumulation and a wider output pitch.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "emulated_inputs.h"
#include "gemm.cuh"

using namespace barellm;
using namespace barellm::cuda;
using namespace barellm::test;

namespace {

struct GemmCase {
    int tokens, rows, cols;
    bool bias, accumulate;
};

// Sizes around the tiles: 1 token, odd counts, more tokens than a small tile; rows below and
// above a tile; columns a multiple of 8 but not of the K tile, and not a multiple of 8.
const GemmCase kCases[] = {
    {1, 24, 40, false, false},  {3, 200, 264, true, false}, {17, 24, 72, false, true},
    {70, 200, 261, true, true}, {33, 72, 43, true, false},
};
constexpr int kOutPitchExtra = 5;  // output columns past the rows, which must stay untouched
constexpr float kUntouched = 12345.0f;

const char* tiles_name(GemmTiles tiles) {
    switch (tiles) {
        case GemmTiles::kSimt:
            return "simt";
        case GemmTiles::kSmallBatch:
            return "small batch";
        case GemmTiles::kMedium:
            return "medium";
        case GemmTiles::kLarge:
            return "large";
    }
    return "?";
}

// Launches the kernel gemm_with_tiles would for `tiles` and dtype D.
template <DType D>
void launch_emulated_gemm(GemmTiles tiles, float* out, int out_pitch, PaddedRows& w, PaddedRows& in,
                          const float* bias, bool accumulate) {
    const int k_extent = gemm_k_extent(w.cols, D);
    const auto tensor_core = [&](auto tile_type) {
        using Tiles = decltype(tile_type);
        emulate_launch(gemm_tensor_core_grid<Tiles>(in.rows, w.rows), dim3(Tiles::kThreads),
                       Tiles::kSharedBytes, gemm_tensor_core_kernel<D, Tiles>, out, out_pitch,
                       static_cast<const uint16_t*>(w.data()), w.rows, w.pitch,
                       static_cast<const uint16_t*>(in.data()), in.rows, in.pitch, k_extent, bias,
                       accumulate);
    };
    switch (tiles) {
        case GemmTiles::kSimt:
            if constexpr (D != DType::F16)
                emulate_launch(gemm_simt_grid(in.rows, w.rows), dim3(kSimtThreads), 0,
                               gemm_simt_kernel<D>, out, out_pitch, w.data(), w.rows, w.pitch,
                               in.data(), in.rows, in.pitch, k_extent, bias, accumulate);
            return;
        case GemmTiles::kSmallBatch:
            if constexpr (D != DType::F32) tensor_core(SmallBatchTiles{});
            return;
        case GemmTiles::kMedium:
            if constexpr (D != DType::F32) tensor_core(MediumTiles{});
            return;
        case GemmTiles::kLarge:
            if constexpr (D != DType::F32) tensor_core(LargeTiles{});
            return;
    }
}

template <DType D>
void check_gemm(GemmTiles tiles, const GemmCase& c, std::mt19937& rng) {
    INFO(dtype_name(D) << " " << tiles_name(tiles) << " tiles: " << c.tokens << " tokens, "
                       << c.rows << " rows, " << c.cols << " cols, bias " << c.bias
                       << ", accumulate " << c.accumulate);
    PaddedRows w(c.rows, c.cols, D, rng), in(c.tokens, c.cols, D, rng);
    const std::vector<float> bias = random_floats(size_t(c.rows), rng);
    const int out_pitch = c.rows + kOutPitchExtra;
    std::vector<float> out(size_t(c.tokens) * out_pitch, kUntouched);
    const std::vector<float> initial = random_floats(out.size(), rng);
    if (c.accumulate)
        for (int t = 0; t < c.tokens; ++t)
            for (int r = 0; r < c.rows; ++r)
                out[size_t(t) * out_pitch + r] = initial[size_t(t) * out_pitch + r];
    launch_emulated_gemm<D>(tiles, out.data(), out_pitch, w, in, c.bias ? bias.data() : nullptr,
                            c.accumulate);

    int wrong = 0;
    for (int t = 0; t < c.tokens; ++t) {
        for (int r = 0; r < c.rows; ++r) {
            double sum = 0, magnitude = 0;
            for (int k = 0; k < c.cols; ++k) {
                sum += in.at(t, k) * w.at(r, k);
                magnitude += std::fabs(in.at(t, k) * w.at(r, k));
            }
            if (c.bias) sum += bias[r];
            if (c.accumulate) sum += initial[size_t(t) * out_pitch + r];
            // f32 accumulation of exact products: a few ulps of the magnitude per addition.
            const double tolerance = 1e-6 * (magnitude + std::fabs(sum) + 1.0) * std::sqrt(c.cols);
            const float got = out[size_t(t) * out_pitch + r];
            if (!(std::fabs(got - sum) <= tolerance) && ++wrong <= 5) {
                INFO("token " << t << " row " << r << ": got " << got << ", want " << sum);
                CHECK(false);
            }
        }
        for (int r = c.rows; r < out_pitch; ++r)
            if (out[size_t(t) * out_pitch + r] != kUntouched && ++wrong <= 5) {
                INFO("token " << t << " padding column " << r << " was written");
                CHECK(false);
            }
    }
    CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("emulated tensor-core gemm matches a double reference", "[cuda_emulation][gemm]") {
    std::mt19937 rng(2024);
    for (const GemmTiles tiles : {GemmTiles::kSmallBatch, GemmTiles::kMedium, GemmTiles::kLarge})
        for (const GemmCase& c : kCases) {
            check_gemm<DType::F16>(tiles, c, rng);
            check_gemm<DType::BF16>(tiles, c, rng);
        }
}

TEST_CASE("emulated SIMT gemm matches a double reference", "[cuda_emulation][gemm]") {
    std::mt19937 rng(2025);
    for (const GemmCase& c : kCases) {
        check_gemm<DType::F32>(GemmTiles::kSimt, c, rng);
        check_gemm<DType::BF16>(GemmTiles::kSimt, c, rng);
    }
}
