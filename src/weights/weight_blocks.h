// The block-quantized weight types of llama.cpp's GGUF files that barellm runs as they are,
// beside Q8_0 and Q4_0 (model.h): their blocks, byte for byte as ggml lays them out
// (docs/FORMAT.md, "Block types"), and the scalar dequantization that every kernel is
// tested against.
//
// A block holds `block_weights` consecutive weights of one row in `block_bytes` bytes: a few
// f16 scales and the packed integers. The "K" types group 256 weights into a super-block of
// sub-blocks (8 of 32, or 16 of 16 for Q6_K), each with its own small integer scale (and min)
// that the super-block's f16 d (and dmin) multiply.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "weights/safetensors.h"

namespace barellm {

constexpr int kSmallBlock = 32;   // weights in a Q4_1, Q5_0, Q5_1, IQ4_NL or MXFP4 block
constexpr int kSuperBlock = 256;  // weights in a super-block of a "K" type or IQ4_XS
constexpr int kSubBlock = 32;     // weights under one 6-bit scale of Q4_K/Q5_K, 4-bit of IQ4_XS
constexpr int kQ6SubBlock = 16;   // weights under one scale of Q6_K, Q3_K and Q2_K

// Q4_1: w = d·q + m, q in 0..15 (byte j: weight j low nibble, weight j + 16 high nibble).
struct BlockQ4_1 {
    uint16_t d, m;  // f16
    uint8_t qs[kSmallBlock / 2];
};
// Q5_0: w = d·(q − 16), q in 0..31: the nibbles as Q4_1, bit j of qh (a little-endian
// u32) the fifth bit of weight j.
struct BlockQ5_0 {
    uint16_t d;  // f16
    uint8_t qh[4];
    uint8_t qs[kSmallBlock / 2];
};
// Q5_1: w = d·q + m, q as Q5_0.
struct BlockQ5_1 {
    uint16_t d, m;  // f16
    uint8_t qh[4];
    uint8_t qs[kSmallBlock / 2];
};
// Q2_K: 16 sub-blocks i of 16; w = d·sc_i·q − dmin·m_i, q in 0..3, sc_i and m_i 4-bit, the
// low and high nibble of scales[i]. Weight 128h + 32t + l (h 0..1, t 0..3, l 0..31) has q in
// bits 2t, 2t + 1 of qs[32h + l] (q2k_value), as Q3_K's low bits.
struct BlockQ2_K {
    uint8_t scales[kSuperBlock / kQ6SubBlock];
    uint8_t qs[kSuperBlock / 4];
    uint16_t d, dmin;  // f16
};
// Q3_K: 16 sub-blocks i of 16; w = d·(sc_i − 32)·(q − 4), q in 0..7, sc_i 6-bit
// (q3k_scale). Weight 128h + 32t + l (h 0..1, t 0..3, l 0..31) has the low 2 bits of q in bits
// 2t, 2t + 1 of qs[32h + l] and the top bit in bit 4h + t of hmask[l] (q3k_value).
struct BlockQ3_K {
    uint8_t hmask[kSuperBlock / 8];
    uint8_t qs[kSuperBlock / 4];
    uint8_t scales[12];
    uint16_t d;  // f16
};
constexpr int kQ3KScaleBias = 32;   // a Q3_K sub-block's sc (0..63) stands for sc − 32
constexpr int kQ3KLevelOffset = 4;  // a Q3_K level q (0..7) stands for q − 4
// Q4_K: 8 sub-blocks j of 32; w = d·sc_j·q − dmin·m_j, q in 0..15, sc_j and m_j 6-bit
// (k_scale_min). qs: 4 chunks of 32 bytes, chunk c holding sub-block 2c in its low nibbles
// and 2c + 1 in its high nibbles.
struct BlockQ4_K {
    uint16_t d, dmin;  // f16
    uint8_t scales[12];
    uint8_t qs[kSuperBlock / 2];
};
// Q5_K: as Q4_K with a fifth bit per weight: for chunk c, bit 2c of qh[l] belongs to
// weight 64c + l and bit 2c + 1 to weight 64c + 32 + l; q in 0..31.
struct BlockQ5_K {
    uint16_t d, dmin;  // f16
    uint8_t scales[12];
    uint8_t qh[kSuperBlock / 8];
    uint8_t qs[kSuperBlock / 2];
};
// Q6_K: 16 sub-blocks of 16; w = d·scales[i]·(q − 32), q in 0..63: the low 4 bits in ql,
// the high 2 in qh (q6k_value gives the arrangement).
struct BlockQ6_K {
    uint8_t ql[kSuperBlock / 2];
    uint8_t qh[kSuperBlock / 4];
    int8_t scales[kSuperBlock / kQ6SubBlock];
    uint16_t d;  // f16
};
constexpr int kQ6KLevelOffset = 32;  // a Q6_K level q (0..63) stands for q − 32
// IQ4_XS: 8 sub-blocks j of 32; w = d·(ls_j − 32)·kIq4Values[q], q in 0..15, ls_j 6-bit
// (low 4 bits in scales_l, high 2 in scales_h); byte l of sub-block j's 16 holds weight
// 32j + l in its low nibble and 32j + 16 + l in its high nibble.
struct BlockIQ4_XS {
    uint16_t d;  // f16
    uint16_t scales_h;
    uint8_t scales_l[kSuperBlock / kSubBlock / 2];
    uint8_t qs[kSuperBlock / 2];
};
// IQ4_NL: w = d·kIq4Values[q], q in 0..15, the nibbles as Q4_1's (byte j: weight j low nibble,
// weight j + 16 high nibble).
struct BlockIQ4_NL {
    uint16_t d;  // f16
    uint8_t qs[kSmallBlock / 2];
};
// MXFP4 (the OCP microscaling format's FP4, E2M1, under a power-of-two scale):
// w = mxfp4_scale(e)·kMxfp4Values[q], q in 0..15, the nibbles as Q4_1's. The levels are the E2M1
// values doubled, so that they are integers; the scale halves them again.
struct BlockMXFP4 {
    uint8_t e;  // E8M0: the exponent of the scale
    uint8_t qs[kSmallBlock / 2];
};
// The i-quants: super-blocks of 256 whose weights are looked up 8 or 4 at a time in a lattice
// grid (weights/iq_grids.h), each point's values non-negative with a sign bit per weight (IQ1_*:
// values −1, 0, +1 and a shift of ±1/8 instead). Indices and signs of column group g (8
// columns, 4 for the IQ3 types' indices) come in column order.
constexpr int kIqGridGroup = 8;   // columns of an IQ2 or IQ1 grid point, and under one sign byte
constexpr int kIq3GridGroup = 4;  // columns of an IQ3 grid point
// IQ2_XXS: 8 sub-blocks j of 32, each two u32 words: word 0 the four 8-bit grid indices (into
// kIq2XxsGrid) of its groups of 8, word 1 the four groups' 7-bit signs (iq_signs_of_seven) in
// bits 7k..7k + 6 and the 4-bit scale s in bits 28..31; w = d·(2s + 1)/8 · grid · sign.
struct BlockIQ2_XXS {
    uint16_t d;  // f16
    uint16_t qs[kSuperBlock / 8];
};
// IQ2_XS: a u16 per group of 8: a 9-bit index into kIq2XsGrid and 7-bit signs above it; 16
// sub-blocks i of 16, the 4-bit scale s_i in nibble i % 2 of scales[i / 2]; w = d·(2s_i + 1)/8 ·
// grid · sign.
struct BlockIQ2_XS {
    uint16_t d;  // f16
    uint16_t qs[kSuperBlock / 8];
    uint8_t scales[kSuperBlock / 32];
};
// IQ2_S: group k's 10-bit index into kIq2SGrid is qs[k] with bits 2(k % 4), +1 of qh[k / 4] above
// it; its signs the whole byte signs[k] (qs[32 + k] in ggml's struct); scales as IQ2_XS's.
struct BlockIQ2_S {
    uint16_t d;  // f16
    uint8_t qs[kSuperBlock / 8];
    uint8_t signs[kSuperBlock / 8];
    uint8_t qh[kSuperBlock / 32];
    uint8_t scales[kSuperBlock / 32];
};
// IQ3_XXS: 64 8-bit indices into kIq3XxsGrid, one per 4 columns; then 8 u32 words, one per
// sub-block j of 32: its four groups' 7-bit signs (iq_signs_of_seven) in bits 7k..7k + 6 and
// the 4-bit scale s in bits 28..31; w = d·(2s + 1)/4 · grid · sign.
struct BlockIQ3_XXS {
    uint16_t d;  // f16
    uint8_t qs[kSuperBlock / 4];
    uint8_t scales_signs[kSuperBlock / 8];
};
// IQ3_S: index k (4 columns) is qs[k] with bit k % 8 of qh[k / 8] above it, into kIq3SGrid;
// group k's signs the byte signs[k]; 8 sub-blocks j of 32, the 4-bit scale s_j in nibble j % 2
// of scales[j / 2]; w = d·(2s_j + 1) · grid · sign.
struct BlockIQ3_S {
    uint16_t d;  // f16
    uint8_t qs[kSuperBlock / 4];
    uint8_t qh[kSuperBlock / 32];
    uint8_t signs[kSuperBlock / 8];
    uint8_t scales[kSuperBlock / 64];
};
// IQ1_S: group k's 11-bit index into kIq1Grid is qs[k] with bits 3(k % 4)..3(k % 4) + 2 of
// qh[k / 4] above it; qh[j] of sub-block j (32 columns) also holds its 3-bit scale s_j in bits
// 12..14 and the sign of its shift in bit 15; w = d·(2s_j + 1)·(level − 1 ± 1/8).
struct BlockIQ1_S {
    uint16_t d;  // f16
    uint8_t qs[kSuperBlock / 8];
    uint16_t qh[kSuperBlock / 32];
};
// IQ1_M: no d field. Group k's index is qs[k] with bits 0..2 of nibble k % 2 of qh[k / 2] above
// it; bit 3 of that nibble is the sign of the group's shift. 16 sub-blocks i of 16, the 3-bit
// scale s_i in bits 3(i % 4)..+2 of the u16 scales word i / 4; the top nibbles of the four words
// make the f16 d (iq1m_d); w = d·(2s_i + 1)·(level − 1 ± 1/8).
struct BlockIQ1_M {
    uint8_t qs[kSuperBlock / 8];
    uint8_t qh[kSuperBlock / 16];
    uint16_t scales[kSuperBlock / 64];
};
// IQ1_S's and IQ1_M's shift, in eighths of a level.
constexpr int kIq1ShiftEighths = 1;

// The ternary types (TriLM's and BitNet b1.58's weights): super-blocks of 256 under one f16 d,
// w = d·(q − 1), q a trit 0..2 (TQ2_0's 2 bits may also hold 3: w = 2d).
constexpr int kTernaryOffset = 1;  // a ternary level q stands for q − 1
// TQ2_0: weight 128h + 32t + l (h 0..1, t 0..3, l 0..31) has q in bits 2t, 2t + 1 of qs[32h + l]
// (tq2_0_value), as Q2_K's levels.
struct BlockTQ2_0 {
    uint8_t qs[kSuperBlock / 4];
    uint16_t d;  // f16
};
// TQ1_0: trits packed in base 3, 5 a byte in qs, 4 a byte in qh, the first the most significant:
// trit n of byte v is ((v·3^n mod 256)·3) >> 8 (tq1_0_trit), as the byte holds the trits'
// base-3 number scaled to 0..255. Weight 32n + l (n 0..4, l 0..31) is trit n of qs[l]; weight
// 160 + 16n + l (l 0..15) trit n of qs[32 + l]; weight 240 + 4n + l (n 0..3, l 0..3) trit n of
// qh[l] (tq1_0_value).
constexpr int kTritBase = 3;
constexpr int kTq1QsTrits = 5;     // trits in a byte of qs
constexpr int kTq1QhTrits = 4;     // trits in a byte of qh
constexpr int kTq1WideRun = 32;    // the bytes of qs whose trits are weights 32n + l
constexpr int kTq1NarrowRun = 16;  // the bytes of qs after them, weights 160 + 16n + l
constexpr int kTq1QhBytes = 4;
struct BlockTQ1_0 {
    uint8_t qs[kTq1WideRun + kTq1NarrowRun];
    uint8_t qh[kTq1QhBytes];
    uint16_t d;  // f16
};
static_assert((kTq1WideRun + kTq1NarrowRun) * kTq1QsTrits + kTq1QhBytes * kTq1QhTrits ==
              kSuperBlock);
// 3^n, the multiplier that brings trit n of a TQ1_0 byte to the top.
constexpr uint8_t kTq1TritMultipliers[kTq1QsTrits] = {1, 3, 9, 27, 81};

// The 16 non-uniform levels of IQ4_XS and IQ4_NL, denser near zero.
constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};

// MXFP4's 16 levels: the E2M1 values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, doubled.
constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
constexpr int kMxfp4LargestLevel = 12;
// An MXFP4 block's scale: 2^(e − 128), half the E8M0 value 2^(e − 127), exact in f32: the f32
// whose biased exponent is e − 1. Below kMxfp4SubnormalBelow it would be a subnormal f32 (2^−128,
// 2^−127): every path of barellm takes it as 0 instead. llama.cpp writes e = 0 only for a block
// of zeros, a block of e = 1 holds weights below 2^−123, and arithmetic on subnormals is several
// times slower on Intel CPUs.
constexpr int kF32MantissaBits = 23;
constexpr uint32_t kMxfp4SubnormalBelow = 2;
inline float mxfp4_scale(uint8_t e) {
    const uint32_t bits = e < kMxfp4SubnormalBelow ? 0 : uint32_t(e - 1) << kF32MantissaBits;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    return scale;
}

static_assert(sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockIQ4_XS) == 136 && sizeof(BlockIQ4_NL) == 18 && sizeof(BlockMXFP4) == 17);
static_assert(sizeof(BlockTQ2_0) == 66 && sizeof(BlockTQ1_0) == 54);
static_assert(sizeof(BlockIQ2_XXS) == 66 && sizeof(BlockIQ2_XS) == 74 && sizeof(BlockIQ2_S) == 82 &&
              sizeof(BlockIQ3_XXS) == 98 && sizeof(BlockIQ3_S) == 110 && sizeof(BlockIQ1_S) == 50 &&
              sizeof(BlockIQ1_M) == 56);

// Whether matrices of this type are stored as ggml blocks in one U8 tensor (the types
// above); F32/F16/BF16 are plain and Q8_0/Q4_0 keep their values and scales apart.
bool is_block_type(DType dtype);
// Whether a block type looks its weights up in a lattice grid (IQ2_*, IQ3_*, IQ1_*).
constexpr bool is_iq_grid_type(DType dtype) {
    return dtype == DType::IQ2_XXS || dtype == DType::IQ2_XS || dtype == DType::IQ2_S ||
           dtype == DType::IQ3_XXS || dtype == DType::IQ3_S || dtype == DType::IQ1_S ||
           dtype == DType::IQ1_M;
}
// Whether a block type holds ternary levels (TQ1_0, TQ2_0).
constexpr bool is_ternary_type(DType dtype) {
    return dtype == DType::TQ1_0 || dtype == DType::TQ2_0;
}
// Weights per block and bytes per block of a block type (0 for any other type).
constexpr int block_weights(DType dtype) {
    switch (dtype) {
        case DType::Q4_1:
        case DType::Q5_0:
        case DType::Q5_1:
        case DType::IQ4_NL:
        case DType::MXFP4:
            return kSmallBlock;
        case DType::Q2_K:
        case DType::Q3_K:
        case DType::Q4_K:
        case DType::Q5_K:
        case DType::Q6_K:
        case DType::IQ4_XS:
        case DType::IQ2_XXS:
        case DType::IQ2_XS:
        case DType::IQ2_S:
        case DType::IQ3_XXS:
        case DType::IQ3_S:
        case DType::IQ1_S:
        case DType::IQ1_M:
        case DType::TQ1_0:
        case DType::TQ2_0:
            return kSuperBlock;
        default:
            return 0;
    }
}

constexpr size_t block_bytes(DType dtype) {
    switch (dtype) {
        case DType::Q4_1:
            return sizeof(BlockQ4_1);
        case DType::Q5_0:
            return sizeof(BlockQ5_0);
        case DType::Q5_1:
            return sizeof(BlockQ5_1);
        case DType::Q2_K:
            return sizeof(BlockQ2_K);
        case DType::Q3_K:
            return sizeof(BlockQ3_K);
        case DType::Q4_K:
            return sizeof(BlockQ4_K);
        case DType::Q5_K:
            return sizeof(BlockQ5_K);
        case DType::Q6_K:
            return sizeof(BlockQ6_K);
        case DType::IQ4_XS:
            return sizeof(BlockIQ4_XS);
        case DType::IQ4_NL:
            return sizeof(BlockIQ4_NL);
        case DType::MXFP4:
            return sizeof(BlockMXFP4);
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
        case DType::IQ1_M:
            return sizeof(BlockIQ1_M);
        case DType::TQ1_0:
            return sizeof(BlockTQ1_0);
        case DType::TQ2_0:
            return sizeof(BlockTQ2_0);
        default:
            return 0;
    }
}

// IQ1_M's f16 d: the top nibble of scales word i is bits 4i..4i + 3 of d.
inline uint16_t iq1m_d(const BlockIQ1_M& block) {
    uint16_t d = 0;
    for (int i = 0; i < 4; ++i) d |= uint16_t((block.scales[i] >> 12) << (4 * i));
    return d;
}

// q of weight i (0..255) of a Q2_K super-block, 0..3 (the weight is d·sc·q − dmin·m).
inline int q2k_value(const BlockQ2_K& block, int i) {
    const int half = i / 128, t = (i % 128) / 32, l = i % 32;
    return (block.qs[32 * half + l] >> (2 * t)) & 3;
}

// q of weight i (0..255) of a Q3_K super-block, 0..7 (the weight is d·(sc − 32)·(q − 4)).
inline int q3k_value(const BlockQ3_K& block, int i) {
    const int half = i / 128, t = (i % 128) / 32, l = i % 32;
    const int low_bits = (block.qs[32 * half + l] >> (2 * t)) & 3;
    const int top_bit = (block.hmask[l] >> (4 * half + t)) & 1;
    return low_bits | top_bit << 2;
}

// q of weight i (0..255) of a TQ2_0 super-block, 0..3 (the weight is d·(q − 1)).
inline int tq2_0_value(const BlockTQ2_0& block, int i) {
    const int half = i / 128, t = (i % 128) / 32, l = i % 32;
    return (block.qs[32 * half + l] >> (2 * t)) & 3;
}

// Trit n (0..4) of a TQ1_0 byte, 0..2: v·3^n modulo 256 holds the trits from n on at the top,
// and times 3, over 256, the first of them.
inline int tq1_0_trit(uint8_t byte, int n) {
    const uint8_t shifted = uint8_t(byte * kTq1TritMultipliers[n]);
    return (shifted * kTritBase) >> 8;
}

// q of weight i (0..255) of a TQ1_0 super-block, 0..2 (the weight is d·(q − 1)).
inline int tq1_0_value(const BlockTQ1_0& block, int i) {
    constexpr int kWideWeights = kTq1WideRun * kTq1QsTrits;                 // 160
    constexpr int kQsWeights = kWideWeights + kTq1NarrowRun * kTq1QsTrits;  // 240
    if (i < kWideWeights) return tq1_0_trit(block.qs[i % kTq1WideRun], i / kTq1WideRun);
    if (i < kQsWeights) {
        const int j = i - kWideWeights;
        return tq1_0_trit(block.qs[kTq1WideRun + j % kTq1NarrowRun], j / kTq1NarrowRun);
    }
    const int j = i - kQsWeights;
    return tq1_0_trit(block.qh[j % kTq1QhBytes], j / kTq1QhBytes);
}

// Sub-block i's 6-bit scale sc_i (0..63) of a Q3_K super-block: the low 4 bits in nibble i / 8
// of scales[i % 8], the top 2 in bits 2(i / 4), 2(i / 4) + 1 of scales[8 + i % 4].
inline int q3k_scale(const BlockQ3_K& block, int i) {
    const int low = (block.scales[i % 8] >> (4 * (i / 8))) & 15;
    const int high = (block.scales[8 + i % 4] >> (2 * (i / 4))) & 3;
    return low | high << 4;
}

// Sub-block j's 6-bit scale and min of a Q4_K or Q5_K super-block: j < 4 in the low 6 bits
// of scales[j] and scales[j + 4]; j ≥ 4 the low 4 bits in scales[j + 4] (scale low nibble,
// min high nibble) and the top 2 in the top bits of scales[j − 4] (scale) and scales[j] (min).
inline void k_scale_min(const uint8_t* scales, int j, int* scale, int* min) {
    if (j < 4) {
        *scale = scales[j] & 63;
        *min = scales[j + 4] & 63;
    } else {
        *scale = (scales[j + 4] & 15) | ((scales[j - 4] >> 6) << 4);
        *min = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
    }
}

// q of weight i (0..255) of a Q6_K super-block, 0..63: each half of 128 weights reads 64
// bytes of ql and 32 of qh; weight 32t + l of a half (t 0..3, l 0..31) has its low 4 bits
// in ql[l + 32 (t & 1)] (low nibble for t < 2, high for t ≥ 2) and its high 2 in bits
// 2t, 2t + 1 of qh[l].
inline int q6k_value(const BlockQ6_K& block, int i) {
    const int half = i / 128, t = (i % 128) / 32, l = i % 32;
    const uint8_t low = block.ql[64 * half + l + 32 * (t & 1)];
    const int low_bits = t < 2 ? low & 15 : low >> 4;
    const int high_bits = (block.qh[32 * half + l] >> (2 * t)) & 3;
    return low_bits | high_bits << 4;
}

// Sub-block j's scale ls_j − 32 (−32..31) of an IQ4_XS super-block: the low 4 bits of ls_j in
// nibble j % 2 of scales_l[j / 2], the high 2 in bits 2j, 2j + 1 of scales_h.
inline int iq4_xs_scale(const BlockIQ4_XS& block, int j) {
    const int low = (block.scales_l[j / 2] >> (4 * (j % 2))) & 15;
    const int high = (block.scales_h >> (2 * j)) & 3;
    return (low | high << 4) - 32;
}

// Weights [0, cols) of one row of block type `dtype` (cols a multiple of its block) as f32.
void dequantize_row(DType dtype, const void* row, float* out, int cols);

}  // namespace barellm
