// The batched-prefill GEMM kernels of kernels/gemm.cuh run on the CUDA emulation, launched as
// gemm_with_tiles launches them, against a double-precision reference from the same rounded
// inputs: every tile shape, f16 and bf16 on tensor cores, f32 and bf16 on the SIMT kernel, at
// sizes that are not multiples of the tiles, with bias, accumulation and a wider output pitch.
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "emulated_gemm.h"
#include "gemm.cuh"

using namespace barellm;
using namespace barellm::cuda;
using namespace barellm::test;

namespace {

// Sizes around the tiles: 1 token, odd counts, more tokens than a small tile; rows below and
// above a tile; columns a multiple of 8 but not of the K tile, and not a multiple of 8.
const GemmCase kCases[] = {
    {1, 24, 40, false, false},  {3, 200, 264, true, false}, {17, 24, 72, false, true},
    {70, 200, 261, true, true}, {33, 72, 43, true, false},  {130, 300, 72, true, true},
};

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
        case GemmTiles::kWide:
            return "wide";
        case GemmTiles::kWarpgroup:
            return "warpgroup";
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
        case GemmTiles::kWide:
            if constexpr (D != DType::F32) tensor_core(WideTiles{});
            return;
        case GemmTiles::kWarpgroup:  // test_emulated_gemm_warpgroup.cpp launches it
            FAIL("the warpgroup GEMM takes tensor maps and clusters");
            return;
    }
}

template <DType D>
void check_gemm(GemmTiles tiles, const GemmCase& c, std::mt19937& rng) {
    INFO(dtype_name(D) << " " << tiles_name(tiles) << " tiles: " << c.tokens << " tokens, "
                       << c.rows << " rows, " << c.cols << " cols, bias " << c.bias
                       << ", accumulate " << c.accumulate);
    PaddedRows w(c.rows, c.cols, D, rng), in(c.tokens, c.cols, D, rng);
    GemmOutput result(c, rng);
    launch_emulated_gemm<D>(tiles, result.out.data(), result.out_pitch, w, in,
                            result.bias_or_null(c), c.accumulate);
    result.check(c, w, in);
}

}  // namespace

TEST_CASE("emulated tensor-core gemm matches a double reference", "[cuda_emulation][gemm]") {
    std::mt19937 rng(2024);
    for (const GemmTiles tiles :
         {GemmTiles::kSmallBatch, GemmTiles::kMedium, GemmTiles::kLarge, GemmTiles::kWide})
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

TEST_CASE("gemm's tile rule picks the tiles the H100 measurements favour",
          "[cuda_emulation][gemm]") {
    // An H100: sm_90, 132 SMs, 227 KiB of shared memory per block with opt-in.
    constexpr int kSm90 = 90, kH100Sms = 132;
    constexpr size_t kH100Shared = 227 * 1024;
    const auto h100 = [&](DType dtype, int tokens, int rows,
                          WarpgroupUse warpgroup = WarpgroupUse::kNever) {
        return choose_gemm_tiles(dtype, tokens, rows, kSm90, kH100Sms, kH100Shared, warpgroup);
    };
    // Mistral-7B at 512 tokens (docs/BENCHMARKS.md): the wide tiles for qkv and w1/w3, the
    // large ones for wo and w2, whose wide grid (64 blocks) would leave half the SMs idle.
    CHECK(h100(DType::F16, 512, 6144) == GemmTiles::kWide);
    CHECK(h100(DType::F16, 512, 14336) == GemmTiles::kWide);
    CHECK(h100(DType::BF16, 512, 14336) == GemmTiles::kWide);
    CHECK(h100(DType::F16, 512, 4096) == GemmTiles::kLarge);
    // Q8/Q4 weights have no wide tiles.
    CHECK(h100(DType::Q4_0, 512, 14336) == GemmTiles::kLarge);
    CHECK(h100(DType::Q8_0, 512, 6144) == GemmTiles::kLarge);
    // Few tokens: the small-batch tiles; a grid too small for the large tiles: the medium.
    CHECK(h100(DType::F16, 64, 14336) == GemmTiles::kSmallBatch);
    CHECK(h100(DType::F16, 65, 1024) == GemmTiles::kMedium);
    // f32 weights: SIMT; bf16 below sm_80 too.
    CHECK(h100(DType::F32, 512, 4096) == GemmTiles::kSimt);
    CHECK(choose_gemm_tiles(DType::BF16, 512, 4096, 75, 40, 64 * 1024) == GemmTiles::kSimt);
    // An sm_86/89 GPU (99 KiB a block): neither the large nor the wide tiles fit.
    CHECK(choose_gemm_tiles(DType::F16, 512, 14336, 89, 128, 99 * 1024) == GemmTiles::kMedium);
    // With the warpgroup GEMM enabled: f16 and bf16 past the small batches take it where its
    // grid has 3 blocks per 4 SMs, and so do Q8 and Q4 (dequantized to f16 first); f32
    // weights and small batches keep their tiles.
    constexpr WarpgroupUse kFills = WarpgroupUse::kWhereItFills, kAlways = WarpgroupUse::kAlways;
    CHECK(h100(DType::F16, 512, 4096, kFills) == GemmTiles::kWarpgroup);
    CHECK(h100(DType::BF16, 65, 14336, kFills) == GemmTiles::kWarpgroup);  // 112 blocks
    // Mistral-7B's qkv: 48 blocks at 100 tokens (the medium tiles stream it on every SM),
    // 96 at 256, 144 at 257.
    CHECK(h100(DType::F16, 100, 6144, kFills) == GemmTiles::kMedium);
    CHECK(h100(DType::F16, 256, 6144, kFills) != GemmTiles::kWarpgroup);
    CHECK(h100(DType::F16, 257, 6144, kFills) == GemmTiles::kWarpgroup);
    CHECK(h100(DType::F16, 64, 14336, kFills) == GemmTiles::kSmallBatch);
    CHECK(h100(DType::Q4_0, 512, 14336, kFills) == GemmTiles::kWarpgroup);
    CHECK(h100(DType::Q8_0, 257, 6144, kFills) == GemmTiles::kWarpgroup);
    CHECK(h100(DType::Q8_0, 100, 6144, kFills) == GemmTiles::kMedium);
    CHECK(h100(DType::Q4_0, 64, 14336, kFills) == GemmTiles::kSmallBatch);
    CHECK(h100(DType::F32, 512, 4096, kFills) == GemmTiles::kSimt);
    // BARELLM_CUDA_WGMMA=always: whatever the grid, past the small batches.
    CHECK(h100(DType::F16, 100, 6144, kAlways) == GemmTiles::kWarpgroup);
    CHECK(h100(DType::BF16, 65, 64, kAlways) == GemmTiles::kWarpgroup);
    CHECK(h100(DType::F16, 64, 6144, kAlways) == GemmTiles::kSmallBatch);
    CHECK(h100(DType::Q4_0, 100, 6144, kAlways) == GemmTiles::kWarpgroup);
}

TEST_CASE("the warpgroup GEMM leaves its clusters where their waves take longer",
          "[cuda_emulation][gemm]") {
    // An H200: clusters of 2 x 2 run 120 blocks at once, blocks of their own 132.
    const std::array<int, kWarpgroupRowKinds> clustered = {120, 120, 120, 120},
                                              alone = {132, 132, 132, 132};
    // Mistral-7B at 512 tokens. wo and w2: 128 blocks of 128 rows are one wave alone, two
    // in clusters (which take 192 rows: 88 blocks, one wave of 192).
    WarpgroupShape shape = choose_warpgroup_shape(512, 4096, 2, clustered, alone);
    CHECK(shape.tile_rows == 128);
    CHECK_FALSE(shape.clustered);
    // qkv: 128 blocks of 192 rows alone (one wave of 192) against 112 of 224 in clusters.
    shape = choose_warpgroup_shape(512, 6144, 2, clustered, alone);
    CHECK(shape.tile_rows == 192);
    CHECK_FALSE(shape.clustered);
    // The gated w1/w3 (28672 product rows): 512 blocks of 224 alone (four waves, 896)
    // against 600 of 192 in clusters (five, 960).
    shape = choose_warpgroup_shape(512, 28672, 2, clustered, alone);
    CHECK(shape.tile_rows == 224);
    CHECK_FALSE(shape.clustered);
    // Where both take one wave of the same rows the clusters stay: 256 tokens of wo's rows,
    // 64 blocks of 128 either way.
    shape = choose_warpgroup_shape(256, 4096, 2, clustered, alone);
    CHECK(shape.tile_rows == 128);
    CHECK(shape.clustered);
}

TEST_CASE("the warpgroup GEMM's row rule fills the GPU's waves", "[cuda_emulation][gemm]") {
    // The fastest rows in clusters of cluster_tokens x kWarpgroupClusterRows.
    const auto clustered_rows = [](int tokens, int rows, int cluster_tokens,
                                   const std::array<int, kWarpgroupRowKinds>& blocks) {
        return fastest_warpgroup_rows(tokens, rows, cluster_tokens, kWarpgroupClusterRows, blocks)
            .tile_rows;
    };
    // Blocks at once for each of kWarpgroupRowChoices: an H100's 132 SMs, or 120 where its
    // clusters of four cannot use every SM.
    const std::array<int, kWarpgroupRowKinds> h100 = {132, 132, 132, 132},
                                              fewer = {120, 120, 120, 120};
    // Mistral-7B at 512 tokens, clusters of 2 x 2: qkv in one wave of 128 blocks of 192 rows
    // (256 would take 96, 73% of the SMs), w1/w3 in two of 256 blocks of 224 rows (256: 224
    // blocks, 85%), wo and w2 in one of 128 blocks of 128 rows.
    CHECK(clustered_rows(512, 6144, 2, h100) == 192);
    CHECK(clustered_rows(512, 14336, 2, h100) == 224);
    CHECK(clustered_rows(512, 4096, 2, h100) == 128);
    // Qwen3-8B's w1/w3 (12288 rows): 192 and 128 rows tie (2 waves of 256 blocks, 3 of
    // 384): the larger tiles win.
    CHECK(clustered_rows(512, 12288, 2, h100) == 192);
    // With 120 blocks at once w1/w3's 224-row grid needs a third wave: 256 rows (two waves
    // of 224 blocks) tie with 128 (four of 448) and win.
    CHECK(clustered_rows(512, 14336, 2, fewer) == 256);
    // One token tile (1 x 2 clusters): every grid is one wave, the smallest tiles finish
    // first.
    CHECK(clustered_rows(100, 6144, 1, h100) == 128);
    // Long prompts: many waves; 256, 224 and 128 rows tie (14, 16 and 28 waves) and the
    // largest tiles win.
    CHECK(clustered_rows(4096, 14336, 2, h100) == 256);
    // The grid rounds to whole clusters: 200 rows are one row tile of any size, padded to a
    // cluster's two.
    const dim3 grid = warpgroup_grid(511, 200, 224, 2, kWarpgroupClusterRows);
    CHECK(grid.x == 4);
    CHECK(grid.y == 2);
}
