// The i-quant types (weight_blocks.h: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) as
// the CPU's integer kernels read them: scalar code, shared by the AVX2 and AVX-512 matvecs and
// GEMMs.
//
// Every i-quant weight is w = d · factor · m · (u − offset):
// - u an unsigned level 0..127, the grid value with its sign and the offset folded in
//   (IQ2_*, IQ3_*: offset ± grid value; IQ1_*: 8·level + 1 ± 1, so that u − 9 is 8·(level − 1)
//   ± 1, the value −1, 0 or +1 and its shift of ±1/8 in eighths);
// - m = 2s + 1, s the 4-bit (3-bit for IQ1_*) scale of the weight's sub-block of 16 or 32;
// - factor the type's constant (1/8, 1/4, 1 or 1/8).
// A kernel's int32 dot of a sub-block is then Σ u·q − offset · Σ q (x's sums of 16), times m
// in int32, and each super-block's sum is scaled once by d · factor · x's scale.
#pragma once
#include <cstdint>
#include <cstring>

#include "weights/half.h"
#include "weights/weight_blocks.h"

namespace barellm::cpu {

struct IqShape {
    int offset;      // u − offset is the signed integer value
    int scale_cols;  // columns under one m: 16 or 32
    float factor;    // of d
};

constexpr IqShape iq_shape(DType dtype) {
    switch (dtype) {
        case DType::IQ2_XXS:
            return {64, 32, 1.0f / 8};
        case DType::IQ2_XS:
        case DType::IQ2_S:
            return {64, 16, 1.0f / 8};
        case DType::IQ3_XXS:
            return {64, 32, 1.0f / 4};
        case DType::IQ3_S:
            return {16, 32, 1.0f};
        case DType::IQ1_S:
            return {9, 32, 1.0f / 8};
        default:  // IQ1_M
            return {9, 16, 1.0f / 8};
    }
}

// Bytes of a super-block (block_bytes, known at compile time).
constexpr size_t iq_block_bytes(DType dtype) {
    switch (dtype) {
        case DType::IQ2_XXS:
            return sizeof(BlockIQ2_XXS);
        case DType::IQ2_XS:
            return sizeof(BlockIQ2_XS);
        case DType::IQ2_S:
            return sizeof(BlockIQ2_S);
        case DType::IQ3_XXS:
            return sizeof(BlockIQ3_XXS);
        case DType::IQ3_S:
            return sizeof(BlockIQ3_S);
        case DType::IQ1_S:
            return sizeof(BlockIQ1_S);
        default:  // IQ1_M
            return sizeof(BlockIQ1_M);
    }
}

// Columns under one multiplier slot of iq_multipliers.
constexpr int kIqMultiplierCols = 16;
constexpr int kIqMultipliers = kSuperBlock / kIqMultiplierCols;

// The f16 d of an i-quant super-block (IQ1_M's from its scales' top nibbles).
inline uint16_t iq_d_bits(DType dtype, const uint8_t* block) {
    uint16_t d;
    if (dtype == DType::IQ1_M) {
        BlockIQ1_M b;
        std::memcpy(&b, block, sizeof b);
        d = iq1m_d(b);
    } else {
        std::memcpy(&d, block, sizeof d);  // every other i-quant block starts with d
    }
    return d;
}
inline float iq_d(DType dtype, const uint8_t* block) {
    return half_to_float(iq_d_bits(dtype, block));
}

// m = 2s + 1 of each 16 columns of an i-quant super-block (twice the same m for sub-blocks of
// 32), in `m`.
template <DType kType>
void iq_multipliers(const uint8_t* block, int32_t (&m)[kIqMultipliers]) {
    auto four_bits = [&](const uint8_t* scales, int i) {
        return (scales[i / 2] >> 4 * (i % 2)) & 15;
    };
    for (int i = 0; i < kIqMultipliers; ++i) {
        int s;
        if constexpr (kType == DType::IQ2_XXS || kType == DType::IQ3_XXS) {
            // the top nibble of sub-block i / 2's word of signs and scale
            const size_t words = kType == DType::IQ2_XXS ? offsetof(BlockIQ2_XXS, qs) + 4
                                                         : offsetof(BlockIQ3_XXS, scales_signs);
            const size_t stride = kType == DType::IQ2_XXS ? 8 : 4;
            uint32_t word;
            std::memcpy(&word, block + words + stride * (i / 2), sizeof word);
            s = int(word >> 28);
        } else if constexpr (kType == DType::IQ2_XS) {
            s = four_bits(block + offsetof(BlockIQ2_XS, scales), i);
        } else if constexpr (kType == DType::IQ2_S) {
            s = four_bits(block + offsetof(BlockIQ2_S, scales), i);
        } else if constexpr (kType == DType::IQ3_S) {
            s = four_bits(block + offsetof(BlockIQ3_S, scales), i / 2);
        } else if constexpr (kType == DType::IQ1_S) {
            uint16_t high;
            std::memcpy(&high, block + offsetof(BlockIQ1_S, qh) + 2 * (i / 2), sizeof high);
            s = (high >> 12) & 7;
        } else {  // IQ1_M
            uint16_t word;
            std::memcpy(&word, block + offsetof(BlockIQ1_M, scales) + 2 * (i / 4), sizeof word);
            s = (word >> 3 * (i % 4)) & 7;
        }
        m[i] = 2 * s + 1;
    }
}

}  // namespace barellm::cpu
