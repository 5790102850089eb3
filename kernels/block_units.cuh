// How the device code reads matrices stored as ggml's blocks (src/weights/weight_blocks.h: Q4_1,
// Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, the i-quants IQ2_XXS, IQ2_XS,
// IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, and the ternary types TQ1_0, TQ2_0): the blocks as the file
// holds them, each device row padded to 16 bytes (kernels.h: DeviceMatrix), unpacked in registers
// only. Every reader loads a unit's bytes with load_unit; its stored values come out four to a
// word, in column order (group_words), and its scales as floats (unit_factors). The decode matvecs
// (matvec_blocks.cuh) multiply the words with an int8 input (dp4a); the embedding (embedding.cuh),
// the f16 copy for the prefill's GEMMs (dequantize.cuh) and the server step's batched matvec
// (matvec_rows.cuh) take the weights in f32 (decode_unit).
//
// Every block type is read in "units" of 32 weights: a small block is one unit, a super-block
// of 256 weights eight. A unit is two groups of 16 weights, each group 16 consecutive columns
// (group_column) sharing one f32 scale and offset: w = scale · (q − midpoint) + offset, q a
// small non-negative integer (the midpoint: Q5_0's 16, Q6_K's 32, Q3_K's 4, TQ1_0's and TQ2_0's 1,
// else 0; IQ4_XS's and IQ4_NL's q is the non-uniform level its nibble picks, signed, MXFP4's its
// doubled E2M1 value; an i-quant's q is its grid
// value times its sign, iq_group_words). Which bytes a unit reads, and which columns its groups
// cover:
// - Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4: the block; group 0 the low nibbles (columns 0..15), group 1
//   the high.
// - Q2_K: Q3_K's units without hmask. Unit k = 4h + 2p + m reads 16 bytes of qs,
//   32h + 16m .. + 15: its group g (t = 2p + g) takes bits 2t, 2t + 1 of them, columns
//   128h + 32t + 16m + i (sub-block 8h + 2t + m); of scales it reads the word
//   4(2h + p) .. + 3, whose bytes 2g + m hold its groups' 4-bit scales and mins, and d, dmin.
// - Q3_K: a group is a sub-block of 16. Unit k = 4h + 2p + m reads 16 bytes of qs,
//   32h + 16m .. + 15, and 16 of hmask, 16m .. + 15: its group g (t = 2p + g) takes bits 2t,
//   2t + 1 of the qs bytes and bit 4h + t of the hmask bytes, columns 128h + 32t + 16m + i
//   (sub-block 8h + 2t + m): Q4_K's map of columns, 64(k / 2) + 32g + 16(k % 2) + i. So each
//   byte of qs is read by two units and each of hmask by four; of the twelve bytes of scales
//   a unit reads the four that hold its groups' 6-bit scales, and d.
// - Q4_K, Q5_K: unit k reads 16 bytes of qs, 32c + 16h .. + 15 (c = k / 2, h = k % 2): their
//   low nibbles are columns 64c + 16h + i of sub-block 2c, their high nibbles columns
//   64c + 32 + 16h + i of sub-block 2c + 1; Q5_K's fifth bits are bits 2c and 2c + 1 of
//   qh[16h + i]. So every byte of qs is read once, and the 16-byte header (d, dmin, the
//   twelve bytes of scales) by the 8 units of a super-block.
// - Q6_K: unit k = 4n + 2p + g reads ql[64n + 32p + 16g ..] and qh[32n + 16g ..] (16 bytes
//   each): the low nibbles with bits 2p of qh are columns 128n + 32p + 16g + i, the high
//   nibbles with bits 2p + 4 columns 128n + 32(p + 2) + 16g + i.
// - IQ4_XS: unit k is sub-block k: its 16 bytes of qs, low nibbles columns 32k + i, high
//   nibbles 32k + 16 + i.
// - The i-quants: unit k is columns 32k .. 32k + 31 of the super-block, group g columns
//   32k + 16g + i: grid points 4k + 2g, 4k + 2g + 1 of 8 columns (IQ2, IQ1), or 8k + 4g .. + 3 of
//   4 (IQ3). Unit k reads its points' indices, signs and scales: IQ2_XXS the 8 bytes of sub-block
//   k; IQ2_XS qs[4k .. 4k + 3] (u16) and scales[k]; IQ2_S qs[4k ..], signs[4k ..] (4 bytes each),
//   qh[k], scales[k]; IQ3_XXS qs[8k .. 8k + 7] and the signs-and-scale word k; IQ3_S qs[8k ..],
//   qh[k], signs[4k ..], scales[k / 2]; IQ1_S qs[4k ..] and qh[k] (u16); IQ1_M qs[4k ..],
//   qh[2k], qh[2k + 1] and the four scales words (they hold d).
// - TQ2_0: Q2_K's units (its bit pairs lie as Q2_K's), with d alone as header.
// - TQ1_0: unit k is columns 32k .. 32k + 31, group g columns 32k + 16g + i. Units 0..4 read
//   qs[0..31], trit k of each byte (group 0 qs[0..15], group 1 qs[16..31]); units 5 and 6 read
//   qs[32..47], trit 2(k − 5) + g; unit 7 reads qs[32..47], trit 4 (group 0), and qh[0..3], word j
//   of group 1 their trit j (tq1_group_words). Each unit also reads d.
// A unit's loads are as wide as its alignment allows (BlockLayout::kLoadBytes): 16 bytes for
// Q4_K and Q5_K, 8 for Q5_1 and IQ4_XS (IQ1_M's scales words; its qs 4, its qh 2), 4 for Q4_1
// and Q2_K (blocks of 20 and 84 bytes), 2 for IQ4_NL, Q5_0, Q3_K and Q6_K (blocks of 18, 22, 110
// and 210 bytes), the other i-quants (blocks of 50 to 110 bytes, each 2 past a multiple of 4) and
// the ternary types (blocks of 54 and 66 bytes), 1 for MXFP4 (blocks of 17 bytes).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "common.cuh"
#include "iq_grids.cuh"
#include "kernels.h"
#include "util/error.h"
#include "weights/weight_blocks.h"

namespace barellm::cuda {

constexpr int kUnitWeights = 32;   // weights of a unit
constexpr int kGroupWeights = 16;  // weights of a group (half a unit)
// Threads of a block of the kernels that take one unit per thread (the embedding, the f16
// dequantization).
constexpr int kBlockRowsThreads = 256;

// Bytes, weights and load width of a block type's blocks.
template <DType D>
struct BlockLayout;
template <>
struct BlockLayout<DType::Q4_1> {
    static constexpr int kWeights = 32, kBytes = 20, kLoadBytes = 4;
};
template <>
struct BlockLayout<DType::Q5_0> {
    static constexpr int kWeights = 32, kBytes = 22, kLoadBytes = 2;
};
template <>
struct BlockLayout<DType::Q5_1> {
    static constexpr int kWeights = 32, kBytes = 24, kLoadBytes = 8;
};
template <>
struct BlockLayout<DType::IQ4_NL> {
    static constexpr int kWeights = 32, kBytes = 18, kLoadBytes = 2;
};
template <>
struct BlockLayout<DType::MXFP4> {
    static constexpr int kWeights = 32, kBytes = 17, kLoadBytes = 1;
};
template <>
struct BlockLayout<DType::Q2_K> {
    static constexpr int kWeights = 256, kBytes = 84, kLoadBytes = 4;
};
template <>
struct BlockLayout<DType::Q3_K> {
    static constexpr int kWeights = 256, kBytes = 110, kLoadBytes = 2;
};
template <>
struct BlockLayout<DType::Q4_K> {
    static constexpr int kWeights = 256, kBytes = 144, kLoadBytes = 16;
};
template <>
struct BlockLayout<DType::Q5_K> {
    static constexpr int kWeights = 256, kBytes = 176, kLoadBytes = 16;
};
template <>
struct BlockLayout<DType::Q6_K> {
    static constexpr int kWeights = 256, kBytes = 210, kLoadBytes = 2;
};
template <>
struct BlockLayout<DType::IQ4_XS> {
    static constexpr int kWeights = 256, kBytes = 136, kLoadBytes = 8;
};
template <>
struct BlockLayout<DType::IQ2_XXS> {
    static constexpr int kWeights = 256, kBytes = 66, kLoadBytes = 2;
};
template <>
struct BlockLayout<DType::IQ2_XS> {
    static constexpr int kWeights = 256, kBytes = 74, kLoadBytes = 2;
};
template <>
struct BlockLayout<DType::IQ2_S> {
    static constexpr int kWeights = 256, kBytes = 82, kLoadBytes = 2;
};
template <>
struct BlockLayout<DType::IQ3_XXS> {
    static constexpr int kWeights = 256, kBytes = 98, kLoadBytes = 2;
};
template <>
struct BlockLayout<DType::IQ3_S> {
    static constexpr int kWeights = 256, kBytes = 110, kLoadBytes = 2;
};
template <>
struct BlockLayout<DType::IQ1_S> {
    static constexpr int kWeights = 256, kBytes = 50, kLoadBytes = 2;
};
template <>
struct BlockLayout<DType::IQ1_M> {
    static constexpr int kWeights = 256, kBytes = 56, kLoadBytes = 8;
};
template <>
struct BlockLayout<DType::TQ1_0> {
    static constexpr int kWeights = 256, kBytes = 54, kLoadBytes = 2;
};
template <>
struct BlockLayout<DType::TQ2_0> {
    static constexpr int kWeights = 256, kBytes = 66, kLoadBytes = 2;
};

// Whether D is an i-quant, its weights looked up in a lattice grid (iq_grids.cuh).
template <DType D>
constexpr bool kIsIqGrid =
    D == DType::IQ2_XXS || D == DType::IQ2_XS || D == DType::IQ2_S || D == DType::IQ3_XXS ||
    D == DType::IQ3_S || D == DType::IQ1_S || D == DType::IQ1_M;
// Whether D is a ternary type: w = d·(q − 1), one d a super-block.
template <DType D>
constexpr bool kIsTernary = D == DType::TQ1_0 || D == DType::TQ2_0;
// TQ1_0's units that read qs[0..31] (one a trit), and its last unit, which reads qh.
constexpr int kTq1WideUnits = kTq1QsTrits;
constexpr int kTq1LastUnit = 7;

// scales[kQ3TopBitsByte ..] of a Q3_K block hold its sub-block scales' top two bits
// (weight_blocks.h: q3k_scale).
constexpr int kQ3TopBitsByte = 8;

// The raw bytes of one unit: up to 16 of its block's header (scales; Q5_0's and Q5_1's fifth
// bits), 16 of packed low bits and 16 of high bits (Q5_K's fifth bits, Q6_K's qh, Q3_K's
// hmask), as little-endian words. The i-quants: d and small fields in head, the grid indices in
// low, the signs (IQ1_M: qh) in high (load_unit).
struct UnitBytes {
    uint32_t head[4];
    uint32_t low[4];
    uint32_t high[4];
};

// A unit dequantized: group g holds columns column[g] .. column[g] + 15 (of the row), their
// weights scale[g] · q[g][i] + offset[g].
struct WeightUnit {
    int column[2];
    float scale[2];
    float offset[2];
    int q[2][kGroupWeights];
};

// Whether the weights of type D have an offset (a min) beside scale · q.
template <DType D>
constexpr bool kHasOffset = D == DType::Q4_1 || D == DType::Q5_1 || D == DType::Q2_K ||
                            D == DType::Q4_K || D == DType::Q5_K;

// Weight i of group g of a decoded unit, as dequantize_row computes it in f32: scale · q,
// plus the offset where the type has one (adding a zero offset would turn −0 into +0).
template <DType D>
__device__ __forceinline__ float unit_weight(const WeightUnit& w, int g, int i) {
    const float product = w.scale[g] * float(w.q[g][i]);
    if constexpr (kHasOffset<D>)
        return product + w.offset[g];
    else
        return product;
}

// `bytes` bytes (a multiple of kAlign, at most 16) from p (kAlign-aligned) into words,
// in loads of kAlign bytes.
template <int kAlign, int kBytes = 16>
__device__ __forceinline__ void load_words(const uint8_t* p, uint32_t (&words)[4]) {
    static_assert(kBytes % kAlign == 0 && kBytes <= 16, "whole loads of at most 16 bytes");
    if constexpr (kAlign == 16) {
        const uint4 v = __ldcs(reinterpret_cast<const uint4*>(p));
        words[0] = v.x, words[1] = v.y, words[2] = v.z, words[3] = v.w;
    } else if constexpr (kAlign == 8) {
#pragma unroll
        for (int i = 0; i < kBytes / 8; ++i) {
            const uint2 v = __ldcs(reinterpret_cast<const uint2*>(p) + i);
            words[2 * i] = v.x, words[2 * i + 1] = v.y;
        }
    } else if constexpr (kAlign == 4) {
#pragma unroll
        for (int i = 0; i < kBytes / 4; ++i)
            words[i] = __ldcs(reinterpret_cast<const unsigned int*>(p) + i);
    } else if constexpr (kAlign == 2) {
#pragma unroll
        for (int i = 0; i < kBytes / 2; ++i) {
            const uint32_t half = __ldcs(reinterpret_cast<const unsigned short*>(p) + i);
            if (i % 2 == 0)
                words[i / 2] = half;
            else
                words[i / 2] |= half << 16;
        }
    } else {
        static_assert(kAlign == 1, "loads of 1, 2, 4, 8 or 16 bytes");
#pragma unroll
        for (int i = 0; i < kBytes; ++i) {
            const uint32_t byte = __ldcs(p + i);
            if (i % 4 == 0)
                words[i / 4] = byte;
            else
                words[i / 4] |= byte << (8 * (i % 4));
        }
    }
}

// The bytes of unit `unit` of a row (16-byte aligned) of block type D.
template <DType D>
__device__ __forceinline__ UnitBytes load_unit(const uint8_t* row, int unit) {
    using Layout = BlockLayout<D>;
    constexpr int kUnits = Layout::kWeights / kUnitWeights, kAlign = Layout::kLoadBytes;
    const uint8_t* block = row + size_t(unit / kUnits) * Layout::kBytes;
    const int k = unit % kUnits;
    UnitBytes u{};
    if constexpr (D == DType::Q4_1) {  // d, m | qs[16]
        load_words<kAlign, 4>(block, u.head);
        load_words<kAlign>(block + 4, u.low);
    } else if constexpr (D == DType::Q5_0) {  // d | qh[4] | qs[16]
        load_words<kAlign, 6>(block, u.head);
        load_words<kAlign>(block + 6, u.low);
    } else if constexpr (D == DType::Q5_1) {  // d, m | qh[4] | qs[16]
        load_words<kAlign, 8>(block, u.head);
        load_words<kAlign>(block + 8, u.low);
    } else if constexpr (D == DType::IQ4_NL) {  // d | qs[16]
        load_words<kAlign, 2>(block + offsetof(BlockIQ4_NL, d), u.head);
        load_words<kAlign>(block + offsetof(BlockIQ4_NL, qs), u.low);
    } else if constexpr (D == DType::MXFP4) {  // e | qs[16]
        load_words<kAlign, 1>(block + offsetof(BlockMXFP4, e), u.head);
        load_words<kAlign>(block + offsetof(BlockMXFP4, qs), u.low);
    } else if constexpr (D == DType::Q2_K) {  // scales[16] | qs[64] | d, dmin
        static_assert(Layout::kBytes % kAlign == 0 && offsetof(BlockQ2_K, qs) % kAlign == 0 &&
                          offsetof(BlockQ2_K, d) % kAlign == 0,
                      "aligned loads in every block of a row");
        load_words<kAlign>(block + offsetof(BlockQ2_K, qs) + 32 * (k / 4) + 16 * (k % 2), u.low);
        // head[0]: d, dmin; head[1]: scales[4(k / 2) .. + 3].
        load_words<kAlign, 4>(block + offsetof(BlockQ2_K, d), u.head);
        u.head[1] = __ldcs(
            reinterpret_cast<const unsigned int*>(block + offsetof(BlockQ2_K, scales)) + k / 2);
    } else if constexpr (D == DType::Q3_K) {  // hmask[32] | qs[64] | scales[12] | d
        const int h = k / 4, p = k / 2 % 2, m = k % 2;
        load_words<kAlign>(block + offsetof(BlockQ3_K, qs) + 32 * h + 16 * m, u.low);
        load_words<kAlign>(block + offsetof(BlockQ3_K, hmask) + 16 * m, u.high);
        // head[0]: byte g is scales[4p + 2g + m], which holds the low nibble of group g's
        // scale, byte 2 + g scales[8 + 2g + m], its top two bits; head[1]: d.
        const uint8_t* scales = block + offsetof(BlockQ3_K, scales);
#pragma unroll
        for (int g = 0; g < 2; ++g)
            u.head[0] |= uint32_t(__ldcs(scales + 4 * p + 2 * g + m)) << (8 * g) |
                         uint32_t(__ldcs(scales + kQ3TopBitsByte + 2 * g + m)) << (16 + 8 * g);
        u.head[1] = __ldcs(reinterpret_cast<const unsigned short*>(block + offsetof(BlockQ3_K, d)));
    } else if constexpr (D == DType::Q4_K) {  // d, dmin, scales[12] | qs[128]
        load_words<kAlign>(block, u.head);
        load_words<kAlign>(block + 16 + 16 * k, u.low);
    } else if constexpr (D == DType::Q5_K) {  // d, dmin, scales[12] | qh[32] | qs[128]
        load_words<kAlign>(block, u.head);
        load_words<kAlign>(block + 16 + 16 * (k % 2), u.high);
        load_words<kAlign>(block + 48 + 16 * k, u.low);
    } else if constexpr (D == DType::Q6_K) {  // ql[128] | qh[64] | scales[16] | d
        const int n = k / 4, p = k / 2 % 2, g = k % 2;
        load_words<kAlign>(block + 64 * n + 32 * p + 16 * g, u.low);
        load_words<kAlign>(block + 128 + 32 * n + 16 * g, u.high);
        // head: the two int8 scales of the unit's groups, then d.
        u.head[0] = __ldcs(block + 192 + 8 * n + g + 2 * p) |
                    uint32_t(__ldcs(block + 192 + 8 * n + g + 2 * p + 4)) << 8 |
                    uint32_t(__ldcs(reinterpret_cast<const unsigned short*>(block + 208))) << 16;
    } else if constexpr (D == DType::IQ4_XS) {
        load_words<kAlign, 8>(block, u.head);  // d, scales_h | scales_l[4]
        load_words<kAlign>(block + 8 + 16 * k, u.low);
    } else if constexpr (D == DType::IQ2_XXS) {  // d | qs[32] (u16)
        // head[0]: d; low[0]: the four grid indices of sub-block k, low[1]: its signs and scale.
        load_words<kAlign, 2>(block + offsetof(BlockIQ2_XXS, d), u.head);
        load_words<kAlign, 8>(block + offsetof(BlockIQ2_XXS, qs) + 8 * k, u.low);
    } else if constexpr (D == DType::IQ2_XS) {  // d | qs[32] (u16) | scales[8]
        // head[0]: d, scales[k] in byte 2; low[0], low[1]: group g's two u16 (index, signs).
        load_words<kAlign, 2>(block + offsetof(BlockIQ2_XS, d), u.head);
        u.head[0] |= uint32_t(__ldcs(block + offsetof(BlockIQ2_XS, scales) + k)) << 16;
        load_words<kAlign, 8>(block + offsetof(BlockIQ2_XS, qs) + 8 * k, u.low);
    } else if constexpr (D == DType::IQ2_S) {  // d | qs[32] | signs[32] | qh[8] | scales[8]
        // head[0]: d, scales[k] in byte 2, qh[k] in byte 3; low[0]: qs[4k ..]; high[0]:
        // signs[4k ..].
        load_words<kAlign, 2>(block + offsetof(BlockIQ2_S, d), u.head);
        u.head[0] |= uint32_t(__ldcs(block + offsetof(BlockIQ2_S, scales) + k)) << 16 |
                     uint32_t(__ldcs(block + offsetof(BlockIQ2_S, qh) + k)) << 24;
        load_words<kAlign, 4>(block + offsetof(BlockIQ2_S, qs) + 4 * k, u.low);
        load_words<kAlign, 4>(block + offsetof(BlockIQ2_S, signs) + 4 * k, u.high);
    } else if constexpr (D == DType::IQ3_XXS) {  // d | qs[64] | scales_signs[32]
        // head[0]: d; low[0..1]: qs[8k ..]; high[0]: sub-block k's signs-and-scale word.
        load_words<kAlign, 2>(block + offsetof(BlockIQ3_XXS, d), u.head);
        load_words<kAlign, 8>(block + offsetof(BlockIQ3_XXS, qs) + 8 * k, u.low);
        load_words<kAlign, 4>(block + offsetof(BlockIQ3_XXS, scales_signs) + 4 * k, u.high);
    } else if constexpr (D == DType::IQ3_S) {  // d | qs[64] | qh[8] | signs[32] | scales[4]
        // head[0]: d, scales[k / 2] in byte 2, qh[k] in byte 3; low[0..1]: qs[8k ..];
        // high[0]: signs[4k ..].
        load_words<kAlign, 2>(block + offsetof(BlockIQ3_S, d), u.head);
        u.head[0] |= uint32_t(__ldcs(block + offsetof(BlockIQ3_S, scales) + k / 2)) << 16 |
                     uint32_t(__ldcs(block + offsetof(BlockIQ3_S, qh) + k)) << 24;
        load_words<kAlign, 8>(block + offsetof(BlockIQ3_S, qs) + 8 * k, u.low);
        load_words<kAlign, 4>(block + offsetof(BlockIQ3_S, signs) + 4 * k, u.high);
    } else if constexpr (D == DType::IQ1_S) {  // d | qs[32] | qh[8] (u16)
        // head[0]: d, qh[k] in bytes 2-3; low[0]: qs[4k ..].
        load_words<kAlign, 2>(block + offsetof(BlockIQ1_S, d), u.head);
        const auto* qh = reinterpret_cast<const unsigned short*>(block + offsetof(BlockIQ1_S, qh));
        u.head[0] |= uint32_t(__ldcs(qh + k)) << 16;
        load_words<kAlign, 4>(block + offsetof(BlockIQ1_S, qs) + 4 * k, u.low);
    } else if constexpr (D == DType::IQ1_M) {  // qs[32] | qh[16] | scales[4] (u16)
        static_assert(Layout::kBytes % kAlign == 0 && offsetof(BlockIQ1_M, scales) % kAlign == 0,
                      "8-byte loads of the scales words in every block of a row");
        // head[0..1]: the four scales words; low[0]: qs[4k ..]; high[0]: qh[2k], qh[2k + 1].
        load_words<kAlign, 8>(block + offsetof(BlockIQ1_M, scales), u.head);
        load_words<4, 4>(block + offsetof(BlockIQ1_M, qs) + 4 * k, u.low);
        const auto* qh = reinterpret_cast<const unsigned short*>(block + offsetof(BlockIQ1_M, qh));
        u.high[0] = __ldcs(qh + k);
    } else if constexpr (D == DType::TQ2_0) {  // qs[64] | d
        // head[0]: d; low: qs[32h + 16m ..], k = 4h + 2p + m (Q2_K's units).
        load_words<kAlign, 2>(block + offsetof(BlockTQ2_0, d), u.head);
        load_words<kAlign>(block + offsetof(BlockTQ2_0, qs) + 32 * (k / 4) + 16 * (k % 2), u.low);
    } else {
        static_assert(D == DType::TQ1_0, "a block type");  // qs[48] | qh[4] | d
        // head[0]: d; units 0..4 low qs[0..15], high qs[16..31]; units 5..7 low qs[32..47], the
        // last high[0] qh[0..3].
        load_words<kAlign, 2>(block + offsetof(BlockTQ1_0, d), u.head);
        const uint8_t* qs = block + offsetof(BlockTQ1_0, qs);
        if (k < kTq1WideUnits) {
            load_words<kAlign>(qs, u.low);
            load_words<kAlign>(qs + kGroupWeights, u.high);
        } else {
            load_words<kAlign>(qs + kTq1WideRun, u.low);
            if (k == kTq1LastUnit)
                load_words<kAlign, kTq1QhBytes>(block + offsetof(BlockTQ1_0, qh), u.high);
        }
    }
    return u;
}

// Sub-block j's 6-bit scale and min of a Q4_K/Q5_K header (scales[0..11] at bytes 4..15 of
// head: words 1, 2 and 3), as k_scale_min reads them. Byte j % 4 of each of the three words
// is read by shifts, not by indexing the words with j: an index known only at run time would
// put the unit's bytes in local memory.
__device__ __forceinline__ void k_scale_min_of(const uint32_t (&head)[4], int j, int* scale,
                                               int* min) {
    const int shift = 8 * (j % 4);
    const int first = int(head[1] >> shift & 0xffu);   // scales[j % 4]
    const int second = int(head[2] >> shift & 0xffu);  // scales[4 + j % 4]
    const int third = int(head[3] >> shift & 0xffu);   // scales[8 + j % 4]
    if (j < 4) {
        *scale = first & 63;
        *min = second & 63;
    } else {
        *scale = (third & 15) | ((first >> 6) << 4);
        *min = (third >> 4) | ((second >> 6) << 4);
    }
}

// The integer a type's stored values are centred on: w = scale · (q − kMidpoint) + offset.
template <DType D>
constexpr int kMidpoint = D == DType::Q5_0   ? 16
                          : D == DType::Q6_K ? kQ6KLevelOffset
                          : D == DType::Q3_K ? kQ3KLevelOffset
                          : kIsTernary<D>    ? kTernaryOffset
                                             : 0;

// IQ1_M's f16 d from its four scales words (head[0..1]): the top nibble of word i is bits
// 4i .. 4i + 3 of d (weight_blocks.h: iq1m_d).
__device__ __forceinline__ uint32_t iq1m_d_bits(const uint32_t (&head)[4]) {
    return (head[0] >> 12 & 15u) | (head[0] >> 28) << 4 | (head[1] >> 12 & 15u) << 8 |
           (head[1] >> 28) << 12;
}

// MXFP4's scale 2^(e − 128) (weight_blocks.h: mxfp4_scale) from its exponent e: the f32 bits
// (e − 1) << 23, or 0 for e < 2 (where it would be subnormal).
__device__ __forceinline__ float mxfp4_scale_of(uint32_t e) {
    return __uint_as_float(e < kMxfp4SubnormalBelow ? 0u : (e - 1) << kF32MantissaBits);
}

// What an i-quant's group scale d·(2s + 1) is divided by (weight_blocks.h): IQ2's 8, IQ3_XXS's
// 4, IQ3_S's 1, and IQ1's 8, its values being eighths (iq1_values).
template <DType D>
constexpr int kIqScaleDivisor = D == DType::IQ3_XXS ? 4
                                : D == DType::IQ3_S ? 1
                                                    : 8;

// The factors of a unit's two groups: weight i of group g is
// scale[g] · (q_i − kMidpoint<D>) + offset[g], q_i its stored value (group_words).
struct UnitFactors {
    float scale[2];
    float offset[2];
};

// Unit `unit`'s factors, from its bytes (load_unit).
template <DType D>
__device__ __forceinline__ UnitFactors unit_factors(const UnitBytes& u, int unit) {
    constexpr int kUnits = BlockLayout<D>::kWeights / kUnitWeights;
    const int k = unit % kUnits;
    UnitFactors f;
    if constexpr (D == DType::Q4_1 || D == DType::Q5_0 || D == DType::Q5_1 || D == DType::IQ4_NL) {
        const float d = half_bits_to_float(u.head[0] & 0xffffu);
        const float m = kHasOffset<D> ? half_bits_to_float(u.head[0] >> 16) : 0.0f;
        f.scale[0] = f.scale[1] = d;
        f.offset[0] = f.offset[1] = m;
    } else if constexpr (D == DType::MXFP4) {
        f.scale[0] = f.scale[1] = mxfp4_scale_of(u.head[0] & 0xffu);
        f.offset[0] = f.offset[1] = 0.0f;
    } else if constexpr (D == DType::Q2_K) {
        // Byte 2g + m of head[1] (m = k % 2): group g's scale in its low nibble, its min in the
        // high one.
        const float d = half_bits_to_float(u.head[0] & 0xffffu);
        const float dmin = half_bits_to_float(u.head[0] >> 16);
#pragma unroll
        for (int g = 0; g < 2; ++g) {
            const uint32_t scale_min = u.head[1] >> (8 * (2 * g + k % 2));
            f.scale[g] = d * float(int(scale_min & 15u));
            f.offset[g] = -(dmin * float(int(scale_min >> 4 & 15u)));
        }
    } else if constexpr (D == DType::Q3_K) {
        // Group g's 6-bit scale sc of sub-block 8h + 2t + m (t = 2p + g): its low nibble is
        // nibble h of head byte g, its top two bits bits 2(2h + p) of head byte 2 + g.
        const float d = half_bits_to_float(u.head[1] & 0xffffu);
        const int h = k / 4, p = k / 2 % 2;
#pragma unroll
        for (int g = 0; g < 2; ++g) {
            const int low = int(u.head[0] >> (8 * g + 4 * h) & 15u);
            const int top = int(u.head[0] >> (16 + 8 * g + 2 * (2 * h + p)) & 3u);
            f.scale[g] = d * float((low | top << 4) - kQ3KScaleBias);
            f.offset[g] = 0.0f;
        }
    } else if constexpr (D == DType::Q4_K || D == DType::Q5_K) {
        const float d = half_bits_to_float(u.head[0] & 0xffffu);
        const float dmin = half_bits_to_float(u.head[0] >> 16);
#pragma unroll
        for (int g = 0; g < 2; ++g) {
            int scale, min;
            k_scale_min_of(u.head, 2 * (k / 2) + g, &scale, &min);
            f.scale[g] = d * float(scale);
            f.offset[g] = -(dmin * float(min));
        }
    } else if constexpr (D == DType::Q6_K) {
        const float d = half_bits_to_float(u.head[0] >> 16);
#pragma unroll
        for (int g = 0; g < 2; ++g) {
            f.scale[g] = d * float(int8_t(uint8_t(u.head[0] >> (8 * g))));
            f.offset[g] = 0.0f;
        }
    } else if constexpr (D == DType::IQ4_XS) {
        const float d = half_bits_to_float(u.head[0] & 0xffffu);
        // scales_l[k / 2] (byte 4 + k / 2 of the header: word 1), nibble k % 2.
        const int low = int(u.head[1] >> (8 * (k / 2) + 4 * (k % 2)) & 15u);
        const int high = int(u.head[0] >> 16 >> (2 * k) & 3u);
        f.scale[0] = f.scale[1] = d * float((low | high << 4) - 32);
        f.offset[0] = f.offset[1] = 0.0f;
    } else if constexpr (kIsTernary<D>) {
        f.scale[0] = f.scale[1] = half_bits_to_float(u.head[0] & 0xffffu);
        f.offset[0] = f.offset[1] = 0.0f;
    } else {
        static_assert(kIsIqGrid<D>, "a block type");
        // The sub-block scale s of each group: IQ2_XXS's and IQ3_XXS's in bits 28..31 of the
        // sub-block's signs-and-scale word; IQ2_XS's and IQ2_S's nibble g of scales[k];
        // IQ3_S's nibble k % 2 of scales[k / 2]; IQ1_S's bits 12..14 of qh[k]; IQ1_M's bits
        // 3i .. 3i + 2 (i = 2k + g, a sub-block of 16) of scales word k / 2.
        const float d =
            half_bits_to_float(D == DType::IQ1_M ? iq1m_d_bits(u.head) : u.head[0] & 0xffffu);
#pragma unroll
        for (int g = 0; g < 2; ++g) {
            uint32_t s;
            if constexpr (D == DType::IQ2_XXS || D == DType::IQ3_XXS)
                s = (D == DType::IQ2_XXS ? u.low[1] : u.high[0]) >> 28;
            else if constexpr (D == DType::IQ2_XS || D == DType::IQ2_S)
                s = u.head[0] >> (16 + 4 * g) & 15u;
            else if constexpr (D == DType::IQ3_S)
                s = u.head[0] >> (16 + 4 * (k % 2)) & 15u;
            else if constexpr (D == DType::IQ1_S)
                s = u.head[0] >> 28 & 7u;
            else  // IQ1_M: word k / 2 is half k / 2 % 2 of head[k / 4]
                s = (k < 4 ? u.head[0] : u.head[1]) >> (16 * (k / 2 % 2) + 3 * (2 * (k % 2) + g)) &
                    7u;
            f.scale[g] = d * float(2 * int(s) + 1) / kIqScaleDivisor<D>;
            f.offset[g] = 0.0f;
        }
    }
    return f;
}

constexpr uint32_t kLowNibbleBytes = 0x0f0f0f0fu;  // the low nibble of each byte of a word
constexpr uint32_t kLowBitBytes = 0x01010101u;     // bit 0 of each byte
constexpr uint32_t kLowTwoBitBytes = 0x03030303u;  // bits 0-1 of each byte

// Bits 0-3 of `bits` as bit 0 of bytes 0-3: the multiply adds four copies of the four bits,
// shifted left by 0, 7, 14 and 21 (no two overlap: no carries), and the copy shifted by 7i
// holds bit i at bit 8i.
__device__ __forceinline__ uint32_t spread_four_bits(uint32_t bits) {
    return ((bits & 0xfu) * 0x00204081u) & kLowBitBytes;
}

// Four values of a 16-entry int8 table (IQ4_XS's and IQ4_NL's kIq4Values, MXFP4's
// kMxfp4Values) picked by four indices 0..15, one a byte, as four int8 bytes: each half of the
// table is four bytes of two words, selected by the index's low three bits (two byte
// permutes), the index's bit 3 picking the half.
template <const int8_t (&kValues)[16]>
__device__ __forceinline__ uint32_t table_levels(uint32_t indices) {
    constexpr auto word = [](int first) {
        return uint32_t(uint8_t(kValues[first])) | uint32_t(uint8_t(kValues[first + 1])) << 8 |
               uint32_t(uint8_t(kValues[first + 2])) << 16 |
               uint32_t(uint8_t(kValues[first + 3])) << 24;
    };
    constexpr uint32_t kLevels[4] = {word(0), word(4), word(8), word(12)};
    // The permute's selector: the four low-three-bit indices as nibbles 0-3 (bytes 0 and 2
    // of low | low >> 4 hold indices 0, 1 and 2, 3 as two nibbles each).
    const uint32_t low = indices & 0x07070707u;
    const uint32_t selector = __byte_perm(low | low >> 4, 0, 0x0020);
    const uint32_t first_half = __byte_perm(kLevels[0], kLevels[1], selector);
    const uint32_t second_half = __byte_perm(kLevels[2], kLevels[3], selector);
    const uint32_t in_second = (indices >> 3 & kLowBitBytes) * 0xffu;  // 0xff where bit 3
    return (second_half & in_second) | (first_half & ~in_second);
}

// The 8 sign bits of IQ2_XXS's, IQ2_XS's and IQ3_XXS's 8 weights from the 7 stored in the low
// bits of `seven` (weights/iq_grids.h: iq_signs_of_seven): the eighth makes the count of set
// bits even.
__device__ __forceinline__ uint32_t signs_of_seven(uint32_t seven) {
    const uint32_t bits = seven & 0x7fu;
    return bits | (uint32_t(__popc(bits)) & 1u) << 7;
}

// Four grid values (0..127, one a byte) with bits 0-3 of `signs` as their signs (bit i set:
// byte i negated), as int8 bytes. A byte's negation is 0x80 − v with bit 7 flipped: 0x80 − v
// never borrows from the next byte, and flipping bit 7 subtracts the 0x80 again.
__device__ __forceinline__ uint32_t signed_bytes(uint32_t values, uint32_t signs) {
    constexpr uint32_t kTopBitBytes = 0x80808080u;
    const uint32_t negated = (kTopBitBytes - values) ^ kTopBitBytes;
    const uint32_t negative = spread_four_bits(signs) * 0xffu;  // 0xff where negated
    return (negated & negative) | (values & ~negative);
}

// Four IQ1 levels (0..2, one a byte) as int8 bytes 8·(level − 1) ± kIq1ShiftEighths: eighths of
// a level, the group's shift of ±1/8 made an integer (its scale d·(2s + 1) / 8). 0x80 + 8·level
// − (8 ∓ 1) stays within its byte, and flipping bit 7 subtracts the 0x80 again.
__device__ __forceinline__ uint32_t iq1_values(uint32_t levels, bool negative_shift) {
    constexpr uint32_t kTopBitBytes = 0x80808080u;
    const uint32_t below =
        uint32_t(negative_shift ? 8 + kIq1ShiftEighths : 8 - kIq1ShiftEighths) * kLowBitBytes;
    return ((levels << 3 | kTopBitBytes) - below) ^ kTopBitBytes;
}

// Point `index` of i-quant D's grid (iq_grids.cuh), through the read-only data cache: 8 values a
// u64 (IQ2, IQ1), 4 a u32 (IQ3), byte i value i.
template <DType D>
__device__ __forceinline__ auto iq_grid_point(uint32_t index) {
    if constexpr (D == DType::IQ2_XXS)
        return __ldg(kIq2XxsGrid + index);
    else if constexpr (D == DType::IQ2_XS)
        return __ldg(kIq2XsGrid + index);
    else if constexpr (D == DType::IQ2_S)
        return __ldg(kIq2SGrid + index);
    else if constexpr (D == DType::IQ3_XXS)
        return __ldg(kIq3XxsGrid + index);
    else if constexpr (D == DType::IQ3_S)
        return __ldg(kIq3SGrid + index);
    else
        return __ldg(kIq1Grid + index);  // IQ1_S, IQ1_M
}

// Group g's int8 values of unit k (k of its super-block) of i-quant D, four a word in column
// order: grid value times sign (IQ2: ±8, ±25, ±43; IQ3_XXS: ±4..62; IQ3_S: ±1..15), IQ1's
// 8·(level − 1) ± 1 (−9..9). Their dp4a with 16 int8 inputs of at most 127 stays below 2^17.
// IQ2 and IQ1 read points n = 2g, 2g + 1 of the unit (8 columns each), IQ3 points 4g .. 4g + 3
// (4 columns each); the unit's bytes as load_unit lays them out.
template <DType D>
__device__ __forceinline__ void iq_group_words(const UnitBytes& u, int g, uint32_t (&q)[4]) {
    if constexpr (D == DType::IQ3_XXS || D == DType::IQ3_S) {
        // The group's 16 sign bits: IQ3_XXS's two sevens at bits 14g, 14g + 7 of the
        // signs-and-scale word, IQ3_S's bytes 2g, 2g + 1 of signs[4k ..].
        const uint32_t signs = D == DType::IQ3_XXS
                                   ? signs_of_seven(u.high[0] >> (14 * g)) |
                                         signs_of_seven(u.high[0] >> (14 * g + 7)) << 8
                                   : u.high[0] >> (16 * g) & 0xffffu;
        const uint32_t indices = g == 0 ? u.low[0] : u.low[1];  // qs[8k + 4g + j], byte j
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            uint32_t index = indices >> (8 * j) & 0xffu;
            if constexpr (D == DType::IQ3_S)  // bit 4g + j of qh[k] (head byte 3)
                index |= (u.head[0] >> (24 + 4 * g + j) & 1u) << 8;
            q[j] = signed_bytes(iq_grid_point<D>(index), signs >> (4 * j));
        }
    } else {
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            const int n = 2 * g + p;
            // IQ2: the point's 8 sign bits; IQ1: the sign of its group's shift.
            uint32_t index, signs;
            if constexpr (D == DType::IQ2_XXS) {  // index byte n of low[0], signs 7n of low[1]
                index = u.low[0] >> (8 * n) & 0xffu;
                signs = signs_of_seven(u.low[1] >> (7 * n));
            } else if constexpr (D == DType::IQ2_XS) {  // u16 p of low[g]: index 9 bits, signs 7
                const uint32_t entry = (g == 0 ? u.low[0] : u.low[1]) >> (16 * p) & 0xffffu;
                index = entry & 511u;
                signs = signs_of_seven(entry >> 9);
            } else if constexpr (D == DType::IQ2_S) {  // qs byte n, bits 2n of qh[k], signs byte n
                index = (u.low[0] >> (8 * n) & 0xffu) | (u.head[0] >> (24 + 2 * n) & 3u) << 8;
                signs = u.high[0] >> (8 * n) & 0xffu;
            } else if constexpr (D == DType::IQ1_S) {  // qs byte n, bits 3n of qh[k]; bit 15
                index = (u.low[0] >> (8 * n) & 0xffu) | (u.head[0] >> (16 + 3 * n) & 7u) << 8;
                signs = u.head[0] >> 31;
            } else {
                static_assert(D == DType::IQ1_M, "an i-quant");
                // Nibble p of qh[2k + g]: bits 0..2 the index's top bits, bit 3 the shift's sign.
                const uint32_t nibble = u.high[0] >> (8 * g + 4 * p) & 15u;
                index = (u.low[0] >> (8 * n) & 0xffu) | (nibble & 7u) << 8;
                signs = nibble >> 3;
            }
            const uint64_t point = iq_grid_point<D>(index);
            const uint32_t low = uint32_t(point), high = uint32_t(point >> 32);
            if constexpr (D == DType::IQ1_S || D == DType::IQ1_M) {
                q[2 * p] = iq1_values(low, signs != 0);
                q[2 * p + 1] = iq1_values(high, signs != 0);
            } else {
                q[2 * p] = signed_bytes(low, signs);
                q[2 * p + 1] = signed_bytes(high, signs >> 4);
            }
        }
    }
}

// 3^n (n 0..4) for TQ1_0's trit n: kTq1TritMultipliers, a byte each, in one word that device code
// indexes by shifts.
constexpr uint64_t tq1_packed_multipliers() {
    uint64_t packed = 0;
    for (int n = 0; n < kTq1QsTrits; ++n) packed |= uint64_t(kTq1TritMultipliers[n]) << (8 * n);
    return packed;
}
constexpr uint64_t kTq1PackedMultipliers = tq1_packed_multipliers();
__device__ __forceinline__ uint32_t tq1_multiplier(int n) {
    return uint32_t(kTq1PackedMultipliers >> (8 * n)) & 0xffu;
}

// Trit n of each byte of `word` (weight_blocks.h: tq1_0_trit), one a byte, `power` = 3^n: the even
// and the odd bytes each in a 16-bit half of their own, where v·3^n stays below 2^16, kept modulo
// 256; times 3, the trit is the half's bits 8-9.
__device__ __forceinline__ uint32_t tq1_trits(uint32_t word, uint32_t power) {
    constexpr uint32_t kEvenBytes = 0x00ff00ffu, kTritBits = 0x00030003u;
    const uint32_t even = (word & kEvenBytes) * power & kEvenBytes;
    const uint32_t odd = (word >> 8 & kEvenBytes) * power & kEvenBytes;
    return (even * kTritBase >> 8 & kTritBits) | (odd * kTritBase & kTritBits << 8);
}

// Group g's levels (0..2) of unit k of a TQ1_0 super-block, four a word in column order, from the
// unit's bytes (load_unit): word j is trit n of four bytes, the bytes and n as the header says.
__device__ __forceinline__ void tq1_group_words(const UnitBytes& u, int k, int g,
                                                uint32_t (&q)[4]) {
    if (k == kTq1LastUnit && g == 1) {  // qh[0..3]: columns 240 + 4j + l are trit j of qh[l]
#pragma unroll
        for (int j = 0; j < 4; ++j) q[j] = tq1_trits(u.high[0], tq1_multiplier(j));
        return;
    }
    const int n = k < kTq1WideUnits   ? k
                  : k == kTq1LastUnit ? kTq1QsTrits - 1
                                      : 2 * (k - kTq1WideUnits) + g;
    const uint32_t power = tq1_multiplier(n);
    const bool from_high = k < kTq1WideUnits && g == 1;
#pragma unroll
    for (int j = 0; j < 4; ++j) q[j] = tq1_trits(from_high ? u.high[j] : u.low[j], power);
}

// The stored values q of group g of unit `unit`, in column order, four a word (byte i of
// word j: column group_column + 4j + i), each a non-negative int8 (IQ4_XS, IQ4_NL, MXFP4: its
// signed level; the i-quants: iq_group_words): what dp4a multiplies with the int8 input, and
// decode_unit unpacks.
template <DType D>
__device__ __forceinline__ void group_words(const UnitBytes& u, int unit, int g, uint32_t (&q)[4]) {
    constexpr int kUnits = BlockLayout<D>::kWeights / kUnitWeights;
    const int k = unit % kUnits;
    if constexpr (D == DType::Q2_K || D == DType::Q3_K || D == DType::TQ2_0) {
        // k = 4h + 2p + m: bits 2t, 2t + 1 of qs, t = 2p + g.
        const int t = 2 * (k / 2 % 2) + g;
#pragma unroll
        for (int j = 0; j < 4; ++j) q[j] = u.low[j] >> (2 * t) & kLowTwoBitBytes;
    } else if constexpr (kIsIqGrid<D>) {
        iq_group_words<D>(u, g, q);
    } else if constexpr (D == DType::TQ1_0) {
        tq1_group_words(u, k, g, q);
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
            q[j] = u.low[j] >> (4 * g) & kLowNibbleBytes;  // low, high nibbles
    }
    if constexpr (D == DType::Q5_0 || D == DType::Q5_1) {
        // qh: a u32 after d (Q5_0: bytes 2..5) or after d and m (Q5_1: bytes 4..7); bit c of
        // it is column c's fifth bit.
        const uint32_t qh = D == DType::Q5_0 ? (u.head[0] >> 16 | u.head[1] << 16) : u.head[1];
#pragma unroll
        for (int j = 0; j < 4; ++j)
            q[j] |= spread_four_bits(qh >> (kGroupWeights * g + 4 * j)) << 4;
    } else if constexpr (D == DType::Q3_K) {  // bit 4h + t of each byte of hmask
        const int h = k / 4, t = 2 * (k / 2 % 2) + g;
#pragma unroll
        for (int j = 0; j < 4; ++j) q[j] |= (u.high[j] >> (4 * h + t) & kLowBitBytes) << 2;
    } else if constexpr (D == DType::Q5_K) {  // bit 2c + g of each byte of qh
#pragma unroll
        for (int j = 0; j < 4; ++j) q[j] |= (u.high[j] >> (2 * (k / 2) + g) & kLowBitBytes) << 4;
    } else if constexpr (D == DType::Q6_K) {  // bits 2t, 2t + 1 of qh, t = p + 2g
        const int t = k / 2 % 2 + 2 * g;
#pragma unroll
        for (int j = 0; j < 4; ++j) q[j] |= (u.high[j] >> (2 * t) & kLowTwoBitBytes) << 4;
    } else if constexpr (D == DType::IQ4_XS || D == DType::IQ4_NL) {
#pragma unroll
        for (int j = 0; j < 4; ++j) q[j] = table_levels<kIq4Values>(q[j]);
    } else if constexpr (D == DType::MXFP4) {
#pragma unroll
        for (int j = 0; j < 4; ++j) q[j] = table_levels<kMxfp4Values>(q[j]);
    }
}

// The first of the 16 columns (of the row) that group g of unit `unit` covers (the map of
// the header above).
template <DType D>
__device__ __forceinline__ int group_column(int unit, int g) {
    using Layout = BlockLayout<D>;
    constexpr int kUnits = Layout::kWeights / kUnitWeights;
    const int base = unit / kUnits * Layout::kWeights, k = unit % kUnits;
    if constexpr (D == DType::Q2_K || D == DType::Q3_K || D == DType::Q4_K || D == DType::Q5_K ||
                  D == DType::TQ2_0) {
        return base + 64 * (k / 2) + 32 * g + 16 * (k % 2);
    } else if constexpr (D == DType::Q6_K) {
        const int n = k / 4, p = k / 2 % 2, g16 = k % 2;
        return base + 128 * n + 32 * (p + 2 * g) + 16 * g16;
    } else {  // the small blocks (one unit a block), IQ4_XS, the i-quants and TQ1_0
        return base + kUnitWeights * k + kGroupWeights * g;
    }
}

// Unit `unit` of a row of block type D, from its bytes (load_unit), as scales, offsets and
// integers: the weights src/weights/weight_blocks.cpp's dequantize_row gives.
template <DType D>
__device__ __forceinline__ WeightUnit decode_unit(const UnitBytes& u, int unit) {
    const UnitFactors f = unit_factors<D>(u, unit);
    WeightUnit w;
#pragma unroll
    for (int g = 0; g < 2; ++g) {
        w.column[g] = group_column<D>(unit, g);
        w.scale[g] = f.scale[g];
        w.offset[g] = f.offset[g];
        uint32_t q[4];
        group_words<D>(u, unit, g, q);
#pragma unroll
        for (int i = 0; i < kGroupWeights; ++i)
            w.q[g][i] = int(int8_t(uint8_t(q[i / 4] >> (8 * (i % 4))))) - kMidpoint<D>;
    }
    return w;
}

// Bytes of a device row of `cols` columns of block type `dtype` (kernels.h: DeviceMatrix).
template <DType D>
__host__ __device__ __forceinline__ size_t block_row_bytes(int cols) {
    return (size_t(cols) / BlockLayout<D>::kWeights * BlockLayout<D>::kBytes + 15) / 16 * 16;
}

template <DType D>
__device__ __forceinline__ const uint8_t* block_row(const void* weights, int row, int cols) {
    return static_cast<const uint8_t*>(weights) + size_t(row) * block_row_bytes<D>(cols);
}

// Host side: calls use(std::integral_constant<DType, D>{}) for block type `dtype`.
template <typename Use>
void with_block_dtype(DType dtype, Use&& use) {
    switch (dtype) {
        case DType::Q4_1:
            return use(std::integral_constant<DType, DType::Q4_1>{});
        case DType::Q5_0:
            return use(std::integral_constant<DType, DType::Q5_0>{});
        case DType::Q5_1:
            return use(std::integral_constant<DType, DType::Q5_1>{});
        case DType::IQ4_NL:
            return use(std::integral_constant<DType, DType::IQ4_NL>{});
        case DType::MXFP4:
            return use(std::integral_constant<DType, DType::MXFP4>{});
        case DType::Q2_K:
            return use(std::integral_constant<DType, DType::Q2_K>{});
        case DType::Q3_K:
            return use(std::integral_constant<DType, DType::Q3_K>{});
        case DType::Q4_K:
            return use(std::integral_constant<DType, DType::Q4_K>{});
        case DType::Q5_K:
            return use(std::integral_constant<DType, DType::Q5_K>{});
        case DType::Q6_K:
            return use(std::integral_constant<DType, DType::Q6_K>{});
        case DType::IQ4_XS:
            return use(std::integral_constant<DType, DType::IQ4_XS>{});
        case DType::IQ2_XXS:
            return use(std::integral_constant<DType, DType::IQ2_XXS>{});
        case DType::IQ2_XS:
            return use(std::integral_constant<DType, DType::IQ2_XS>{});
        case DType::IQ2_S:
            return use(std::integral_constant<DType, DType::IQ2_S>{});
        case DType::IQ3_XXS:
            return use(std::integral_constant<DType, DType::IQ3_XXS>{});
        case DType::IQ3_S:
            return use(std::integral_constant<DType, DType::IQ3_S>{});
        case DType::IQ1_S:
            return use(std::integral_constant<DType, DType::IQ1_S>{});
        case DType::IQ1_M:
            return use(std::integral_constant<DType, DType::IQ1_M>{});
        case DType::TQ1_0:
            return use(std::integral_constant<DType, DType::TQ1_0>{});
        case DType::TQ2_0:
            return use(std::integral_constant<DType, DType::TQ2_0>{});
        default:
            throw Error("with_block_dtype: not a block type");
    }
}

#ifdef BARELLM_LAUNCH_FUNCTIONS

// Throws unless w is a block-type device matrix of whole blocks (rows of block_row_bytes).
inline void check_block_matrix(const DeviceMatrix& w, const char* what) {
    if (!is_block_type(w.dtype) || w.cols % block_weights(w.dtype) != 0 || w.pitch != w.cols)
        throw Error(std::string(what) + ": not a block-type device matrix of whole blocks");
}

#endif  // BARELLM_LAUNCH_FUNCTIONS

}  // namespace barellm::cuda
