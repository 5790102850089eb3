// cpu::resident_weights, the CPU backend's own copy of the matrices: copied a chunk of rows at a
// time, every matrix holds the bytes of a copy made in one piece, whatever the chunk, type and
// SIMD level (which decides between the rows and the tiles of 16 rows).
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/resident_weights.h"
#include "test_block_matrices.h"
#include "test_matrices.h"

using namespace barellm;
using namespace barellm::test;

namespace {

// Whether the copy `got` holds the bytes of the matrix `source` as the level in use reads
// them: its tiles (made here in one piece) or its values and scales.
bool holds_the_same_bytes(const Matrix& got, const Matrix& source) {
    if (cpu::uses_row_tiles(source.dtype)) {
        const cpu::AlignedBytes tiles = cpu::make_row_tiles(source);
        return got.row_tiles != nullptr &&
               std::memcmp(got.row_tiles, tiles.get(), cpu::row_tiles_bytes(source)) == 0;
    }
    const size_t scales = size_t(source.rows) * source.scale_count_per_row() * sizeof(uint16_t);
    return got.data != source.data &&
           std::memcmp(got.data, source.data, size_t(source.rows) * source.row_bytes()) == 0 &&
           (scales == 0 || std::memcmp(got.scales, source.scales, scales) == 0);
}

}  // namespace

TEST_CASE("resident_weights copied a chunk at a time holds every matrix's bytes") {
    std::mt19937 rng(74);
    // 203 rows: 12 whole tiles of 16 and a part; every type the copy keeps as it is or in tiles.
    std::vector<TestMatrix> matrices;
    for (DType dtype : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0})
        matrices.push_back(make_matrix(203, 96, dtype, rng));
    for (DType dtype : {DType::Q4_K, DType::Q6_K, DType::IQ4_XS})
        matrices.push_back(make_block_matrix(203, 256, dtype, rng));
    Model model;
    model.layers.resize(1);
    LayerWeights& layer = model.layers[0];
    Matrix* slots[] = {&layer.wq, &layer.wk, &layer.wv, &layer.wo,
                       &layer.w1, &layer.w3, &layer.w2, &model.output};
    for (size_t i = 0; i < matrices.size(); ++i) *slots[i] = matrices[i].matrix;

    const auto level =
        GENERATE(cpu::SimdLevel::Scalar, cpu::SimdLevel::Avx2, cpu::SimdLevel::Avx512);
    if (level > cpu::detect_simd_level()) return;
    cpu::set_simd_level(level);
    // One byte: chunks of one tile of rows (16); a few tiles; the whole matrix at once.
    for (size_t chunk_bytes : {size_t(1), size_t(5000), cpu::kResidentCopyChunkBytes}) {
        INFO(cpu::simd_level_name(level) << ", chunks of " << chunk_bytes << " bytes");
        const cpu::ResidentWeights resident = cpu::resident_weights(model, chunk_bytes);
        const LayerWeights& copied = resident.layers[0];
        const Matrix* got[] = {&copied.wq, &copied.wk, &copied.wv, &copied.wo,
                               &copied.w1, &copied.w3, &copied.w2, &resident.output};
        for (size_t i = 0; i < matrices.size(); ++i) {
            INFO(dtype_name(matrices[i].matrix.dtype));
            CHECK(holds_the_same_bytes(*got[i], matrices[i].matrix));
        }
    }
    cpu::set_simd_level(cpu::detect_simd_level());
}
