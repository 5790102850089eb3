// The Q8/Q4 batched-prefill GEMM kernel of kernels/gemm.cuh (gemm_quantized_tensor_core_kernel)
// runs on the CUDA emulation, launched as gemm_with_tiles launches it, against a
// double-precision reference: random quantized weights in the DeviceMatrix layout (values of
// every byte, scales of either sign, Q8 rows padded to whole blocks) decoded here from the
// format's definition and rounded to f16 as the kernel dequantizes them, times f16
// activations; every tile shape, at sizes that are not multiples of the tiles, with bias,
// accumulation and a wider output pitch. The batched prefill's Q8/Q4 embedding rows, and the
// whole matrices dequantized to f16 for the warpgroup GEMM (dequantize.cuh), too.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "emulated_gemm.h"
#include "gemm.cuh"
#include "prefill.cuh"

using namespace barellm;
using namespace barellm::cuda;
using namespace barellm::test;

namespace {

// A Q8 (I8) or Q4 (U8) matrix as kernels.h's DeviceMatrix lays it out in device memory: rows
// of pitch = padded_cols(cols) values (int8, or two nibbles a byte), padding values zero, then
// the f16 scales [rows, pitch / 32]; with the values each weight decodes to, rounded to f16.
struct QuantizedRows {
    DType dtype;
    int rows, cols, pitch;
    AlignedArray<uint8_t> bytes;
    std::vector<double> values;  // [rows, cols]

    QuantizedRows(int rows_, int cols_, DType dtype_, std::mt19937& rng)
        : dtype(dtype_),
          rows(rows_),
          cols(cols_),
          pitch(padded_cols(cols_, dtype_)),
          bytes(size_t(rows_) * row_bytes() + size_t(rows_) * blocks() * sizeof(uint16_t), 0),
          values(size_t(rows_) * cols_) {
        std::uniform_int_distribution<int> q8(-128, 127), nibble(0, 15);
        std::normal_distribution<float> scale(0.0f, 1.0f / 64);
        for (int r = 0; r < rows; ++r) {
            for (int b = 0; b < blocks(); ++b)
                scales()[size_t(r) * blocks() + b] = float_to_half(scale(rng));
            uint8_t* row = bytes.data() + size_t(r) * row_bytes();
            for (int c = 0; c < cols; ++c) {
                const float s = half_to_float(scales()[size_t(r) * blocks() + c / kQuantizedBlock]);
                int q;
                if (dtype == DType::Q8_0) {
                    q = q8(rng);
                    row[c] = uint8_t(int8_t(q));
                } else {  // byte j of a block: column j in the low nibble, j + 16 in the high
                    const int n = nibble(rng), within = c % kQuantizedBlock,
                              half = kQuantizedBlock / 2;
                    uint8_t& byte = row[c / kQuantizedBlock * half + within % half];
                    byte |= uint8_t(within < half ? n : n << 4);
                    q = n - kQ4Offset;
                }
                values[size_t(r) * cols + c] = half_to_float(float_to_half(float(q) * s));
            }
        }
    }
    int blocks() const { return pitch / kQuantizedBlock; }
    size_t row_bytes() const { return dtype == DType::Q4_0 ? size_t(pitch) / 2 : size_t(pitch); }
    uint16_t* scales() {
        return reinterpret_cast<uint16_t*>(bytes.data() + size_t(rows) * row_bytes());
    }
    double at(int r, int c) const { return values[size_t(r) * cols + c]; }
};

// Sizes around the tiles: 1 token, odd counts, more tokens than a small tile; rows below and
// above a tile; columns (Q8) a multiple of 8 but not of 32, not a multiple of 8, and more than
// one and two K tiles of every tile shape; Q4 takes them rounded up to whole blocks.
const GemmCase kCases[] = {
    {1, 24, 40, false, false},  {3, 200, 264, true, false}, {17, 24, 72, false, true},
    {70, 200, 261, true, true}, {33, 72, 43, true, false},  {5, 40, 600, true, true},
};

// Launches the kernel gemm_with_tiles launches for `tiles` and weights W.
template <DType W>
void launch_emulated_gemm(GemmTiles tiles, float* out, int out_pitch, QuantizedRows& w,
                          PaddedRows& in, const float* bias, bool accumulate) {
    const auto launch = [&](auto tile_type) {
        using Tiles = decltype(tile_type);
        emulate_launch(gemm_tensor_core_grid<Tiles>(in.rows, w.rows), dim3(Tiles::kThreads),
                       QuantizedTiles<W, Tiles>::kSharedBytes,
                       gemm_quantized_tensor_core_kernel<W, Tiles>, out, out_pitch,
                       static_cast<const uint8_t*>(w.bytes.data()),
                       static_cast<const uint16_t*>(w.scales()), w.rows, w.pitch,
                       static_cast<const uint16_t*>(in.data()), in.rows, in.pitch,
                       gemm_k_extent(in.cols, DType::F16), bias, accumulate);
    };
    switch (tiles) {
        case GemmTiles::kSimt:
            FAIL("Q8/Q4 weights have no SIMT GEMM");
            return;
        case GemmTiles::kSmallBatch:
            return launch(QuantizedSmallBatchTiles{});
        case GemmTiles::kMedium:
            return launch(MediumTiles{});
        case GemmTiles::kLarge:
            return launch(LargeTiles{});
        case GemmTiles::kWide:
        case GemmTiles::kWarpgroup:
            FAIL("the wide and warpgroup tiles take f16 and bf16 weights");
            return;
    }
}

template <DType W>
void check_gemm(GemmTiles tiles, GemmCase c, std::mt19937& rng) {
    if (W == DType::Q4_0)
        c.cols = (c.cols + kQuantizedBlock - 1) / kQuantizedBlock * kQuantizedBlock;
    INFO(dtype_name(W) << " tiles " << int(tiles) << ": " << c.tokens << " tokens, " << c.rows
                       << " rows, " << c.cols << " cols, bias " << c.bias << ", accumulate "
                       << c.accumulate);
    QuantizedRows w(c.rows, c.cols, W, rng);
    PaddedRows in(c.tokens, c.cols, gemm_input_dtype(W), rng);
    GemmOutput result(c, rng);
    launch_emulated_gemm<W>(tiles, result.out.data(), result.out_pitch, w, in,
                            result.bias_or_null(c), c.accumulate);
    result.check(c, w, in);
}

// embedding_rows_quantized_kernel as embedding_rows launches it, against the decoded table
// (exact: q * scale in f32, then times the embedding scale).
template <DType W>
void check_embedding_rows(std::mt19937& rng) {
    const int cols = W == DType::Q4_0 ? 96 : 83, vocab = 37, count = 5;
    QuantizedRows table(vocab, cols, W, rng);
    const int tokens[count] = {0, 36, 5, 5, 17};
    const float embedding_scale = std::sqrt(float(cols));  // Gemma: sqrt(dim)
    std::vector<float> x(size_t(count) * cols, kUntouched);
    emulate_launch(
        embedding_rows_grid(cols, count), dim3(kRowsThreads), 0, embedding_rows_quantized_kernel<W>,
        x.data(), static_cast<const void*>(table.bytes.data()),
        static_cast<const uint16_t*>(table.scales()), cols, table.pitch, embedding_scale, tokens);
    for (int t = 0; t < count; ++t)
        for (int c = 0; c < cols; ++c) {
            const uint8_t* row = table.bytes.data() + size_t(tokens[t]) * table.row_bytes();
            const int within = c % kQuantizedBlock, half = kQuantizedBlock / 2;
            const uint8_t byte = row[c / kQuantizedBlock * half + within % half];
            const int q = W == DType::Q8_0 ? int(int8_t(row[c]))
                                           : (within < half ? byte & 0xf : byte >> 4) - kQ4Offset;
            const float scale = half_to_float(
                table.scales()[size_t(tokens[t]) * table.blocks() + c / kQuantizedBlock]);
            INFO(dtype_name(W) << " token " << tokens[t] << " column " << c);
            CHECK(x[size_t(t) * cols + c] == float(q) * scale * embedding_scale);
        }
}

// dequantize_rows_kernel as dequantize_to_f16 launches it: every value the f16 of the
// decoded weight (the rounding the GEMM tiles apply), the padding columns of the f16 rows
// (Q8's padding values) zero, nothing written past the rows.
template <DType W>
void check_dequantize_rows(int rows, int cols, std::mt19937& rng) {
    INFO(dtype_name(W) << " " << rows << " x " << cols);
    QuantizedRows w(rows, cols, W, rng);
    const int out_pitch = padded_cols(cols, DType::F16);
    constexpr uint16_t kPoison = 0x7e00;  // f16 NaN
    AlignedArray<uint16_t> out(size_t(rows + 1) * out_pitch, kPoison);
    emulate_launch(dequantize_rows_grid(rows, out_pitch), dim3(kDequantizeThreads), 0,
                   dequantize_rows_kernel<W>, out.data(), out_pitch,
                   static_cast<const uint8_t*>(w.bytes.data()),
                   static_cast<const uint16_t*>(w.scales()), rows, w.pitch);
    int wrong = 0;
    for (int r = 0; r < rows + 1; ++r)
        for (int c = 0; c < out_pitch; ++c) {
            const uint16_t got = out[size_t(r) * out_pitch + c];
            if (r == rows)
                wrong += got != kPoison;
            else if (c < cols)
                wrong += got != float_to_half(float(w.at(r, c)));
            else  // 0 times the block's scale: zero of either sign
                wrong += half_to_float(got) != 0.0f;
        }
    CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("emulated dequantize_rows_kernel gives the f16 of every decoded weight",
          "[cuda_emulation][gemm]") {
    std::mt19937 rng(2028);
    // Q8: columns not a multiple of 8 (f16 padding inside a block) or of 32; Q4: whole blocks.
    for (const int rows : {1, 5, 37}) {
        for (const int cols : {8, 75, 261}) check_dequantize_rows<DType::Q8_0>(rows, cols, rng);
        for (const int cols : {32, 96, 288}) check_dequantize_rows<DType::Q4_0>(rows, cols, rng);
    }
}

TEST_CASE("emulated Q8/Q4 tensor-core gemm matches a double reference", "[cuda_emulation][gemm]") {
    std::mt19937 rng(2026);
    for (const GemmTiles tiles : {GemmTiles::kSmallBatch, GemmTiles::kMedium, GemmTiles::kLarge})
        for (const GemmCase& c : kCases) {
            check_gemm<DType::Q8_0>(tiles, c, rng);
            check_gemm<DType::Q4_0>(tiles, c, rng);
        }
}

TEST_CASE("emulated Q8/Q4 embedding rows match the decoded table", "[cuda_emulation][prefill]") {
    std::mt19937 rng(2027);
    check_embedding_rows<DType::Q8_0>(rng);
    check_embedding_rows<DType::Q4_0>(rng);
}
