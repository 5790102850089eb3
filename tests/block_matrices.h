// Test matrices of the block types (weight_blocks.h): random blocks, every byte random except
// the f16 scales, which get both signs and magnitudes from tiny to large (and now and then
// zero), so that sub-block scales and mins reach 0 and 63 (int8 −128 and 127 for Q6_K) and
// levels every value. The values are what dequantize_row decodes the blocks to.
#pragma once
#include <random>
#include <vector>

#include "half.h"
#include "test_matrices.h"
#include "weight_blocks.h"

namespace barellm::test {

constexpr DType kBlockTypes[] = {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS,
                                 DType::Q4_1, DType::Q5_0, DType::Q5_1};

// An f16 scale: ± 2^e for e in [−12, 4) times a random mantissa, or 0 one time in 16.
inline uint16_t random_block_scale(std::mt19937& rng) {
    std::uniform_int_distribution<int> pick(0, 15);
    if (pick(rng) == 0) return float_to_half(0.0f);
    std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
    std::uniform_int_distribution<int> exponent(-12, 3);
    const float magnitude = std::ldexp(mantissa(rng), exponent(rng));
    return float_to_half(pick(rng) < 8 ? magnitude : -magnitude);
}

// Byte offsets of a block's f16 scales (d, and dmin or m where the type has one).
inline std::vector<size_t> block_scale_offsets(DType dtype) {
    switch (dtype) {
        case DType::Q4_K:
        case DType::Q5_K:
        case DType::Q4_1:
        case DType::Q5_1:
            return {0, 2};
        case DType::Q6_K:
            return {offsetof(BlockQ6_K, d)};
        default:  // Q5_0, IQ4_XS
            return {0};
    }
}

// rows × cols (a multiple of the type's block) of random blocks. The rows start 2 bytes past
// a 4-byte boundary, as a file's block tensors may (they are only 2-byte aligned).
inline TestMatrix make_block_matrix(int rows, int cols, DType dtype, std::mt19937& rng) {
    constexpr size_t kMisalignment = 2;
    TestMatrix m;
    const int blocks = rows * (cols / block_weights(dtype));
    m.storage.resize(kMisalignment + blocks * block_bytes(dtype));
    std::uniform_int_distribution<int> byte(0, 255);
    for (uint8_t& b : m.storage) b = uint8_t(byte(rng));
    uint8_t* data = m.storage.data() + kMisalignment;
    for (int b = 0; b < blocks; ++b)
        for (size_t offset : block_scale_offsets(dtype)) {
            const uint16_t scale = random_block_scale(rng);
            std::memcpy(data + b * block_bytes(dtype) + offset, &scale, sizeof scale);
        }
    m.matrix = Matrix{data, dtype, rows, cols};
    m.values.resize(size_t(rows) * cols);
    for (int r = 0; r < rows; ++r)
        dequantize_row(dtype, m.matrix.row_data(r), &m.values[size_t(r) * cols], cols);
    return m;
}

}  // namespace barellm::test
