// The i-quant types (weight_blocks.h: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) and
// the ternary types (TQ1_0, TQ2_0) as the CPU's integer kernels read them: scalar code, shared by
// the AVX2 and AVX-512 matvecs and GEMMs.
//
// Every i-quant weight is w = d · factor · m · (u − offset):
// - u an unsigned level 0..127, the grid value with its sign and the offset folded in
//   (IQ2_*, IQ3_*: offset ± grid value; IQ1_*: 8·level + 1 ± 1, so that u − 9 is 8·(level − 1)
//   ± 1, the value −1, 0 or +1 and its shift of ±1/8 in eighths);
// - m = 2s + 1, s the 4-bit (3-bit for IQ1_*) scale of the weight's sub-block of 16 or 32;
// - factor the type's constant (1/8, 1/4, 1 or 1/8).
// A ternary weight is the same with u = q (0..2, TQ2_0's 0..3), offset 1, m = 1 and factor 1: the
// kernels skip its multiplies by m (has_multipliers).
// A kernel's int32 dot of a sub-block is then Σ u·q − offset · Σ q (x's sums of 16), times m
// in int32, and each super-block's sum is scaled once by d · factor · x's scale.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "weights/half.h"
#include "weights/iq_grids.h"
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
        case DType::TQ1_0:
        case DType::TQ2_0:
            return {kTernaryOffset, kSubBlock, 1.0f};
        default:  // IQ1_M
            return {9, 16, 1.0f / 8};
    }
}

// Whether the i-quant kernels read this type: the i-quants and the ternary types.
constexpr bool is_iq_level_type(DType dtype) {
    return is_iq_grid_type(dtype) || is_ternary_type(dtype);
}
// Whether the type's weights have multipliers m (every i-quant; not the ternary types).
constexpr bool has_multipliers(DType dtype) { return !is_ternary_type(dtype); }

// f(std::integral_constant<DType, T>{}) for the type T that `dtype` names (is_iq_level_type; IQ1_M
// for any other type): the kernels' dispatch to their code for each type.
template <typename F>
decltype(auto) with_iq_type(DType dtype, F&& f) {
    switch (dtype) {
        case DType::IQ2_XXS:
            return f(std::integral_constant<DType, DType::IQ2_XXS>{});
        case DType::IQ2_XS:
            return f(std::integral_constant<DType, DType::IQ2_XS>{});
        case DType::IQ2_S:
            return f(std::integral_constant<DType, DType::IQ2_S>{});
        case DType::IQ3_XXS:
            return f(std::integral_constant<DType, DType::IQ3_XXS>{});
        case DType::IQ3_S:
            return f(std::integral_constant<DType, DType::IQ3_S>{});
        case DType::IQ1_S:
            return f(std::integral_constant<DType, DType::IQ1_S>{});
        case DType::TQ1_0:
            return f(std::integral_constant<DType, DType::TQ1_0>{});
        case DType::TQ2_0:
            return f(std::integral_constant<DType, DType::TQ2_0>{});
        default:
            return f(std::integral_constant<DType, DType::IQ1_M>{});
    }
}

// The signs of a group of 8 weights as byte masks, for each of the 128 values of the 7 stored
// sign bits (IQ2_XXS, IQ2_XS, IQ3_XXS; iq_signs_of_seven): byte i 0xff where weight i is
// negative, else 0. The AVX2 kernels load a group's mask where the parity and the spreading of
// the bits took some fifteen instructions a register.
constexpr int kIqSevenBits = 7;  // stored sign bits per group (IQ2_XXS, IQ2_XS, IQ3_XXS)
constexpr int kIqSevenMask = (1 << kIqSevenBits) - 1;
struct IqSignMasks {
    alignas(64) uint64_t of_seven[1 << kIqSevenBits];
};
constexpr IqSignMasks make_iq_sign_masks() {
    IqSignMasks masks{};
    constexpr uint64_t kNegativeByte = 0xff;
    constexpr int kByteBits = 8;
    for (unsigned seven = 0; seven <= kIqSevenMask; ++seven)
        for (int i = 0; i < kIqGridGroup; ++i)
            if (iq_signs_of_seven(seven) >> i & 1)
                masks.of_seven[seven] |= kNegativeByte << (kByteBits * i);
    return masks;
}
inline constexpr IqSignMasks kIqSignMasks = make_iq_sign_masks();

// The kernels hold m per 16 columns (a slot), each sub-block of 32 in two slots:
// iq_multiplier_lanes on AVX-512, iq_multiplier_words on AVX2, from the scale bits weight_blocks.h
// describes.
constexpr int kIqMultiplierCols = 16;
constexpr int kIqMultipliers = kSuperBlock / kIqMultiplierCols;

// The f16 d of an i-quant or ternary super-block (IQ1_M's from its scales' top nibbles; the
// ternary types' at their end).
inline uint16_t iq_d_bits(DType dtype, const uint8_t* block) {
    uint16_t d;
    if (dtype == DType::IQ1_M) {
        BlockIQ1_M b;
        std::memcpy(&b, block, sizeof b);
        d = iq1m_d(b);
    } else if (dtype == DType::TQ1_0) {
        std::memcpy(&d, block + offsetof(BlockTQ1_0, d), sizeof d);
    } else if (dtype == DType::TQ2_0) {
        std::memcpy(&d, block + offsetof(BlockTQ2_0, d), sizeof d);
    } else {
        std::memcpy(&d, block, sizeof d);  // every other i-quant block starts with d
    }
    return d;
}
inline float iq_d(DType dtype, const uint8_t* block) {
    return half_to_float(iq_d_bits(dtype, block));
}

}  // namespace barellm::cpu
