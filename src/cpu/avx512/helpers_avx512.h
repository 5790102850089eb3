// Inline AVX-512 helpers shared by the *_avx512*.cpp kernels: weights converted to f32, tail
// masks and the GEMM's prefetch of weights. Include it only from those files (built with
// -mavx512f -mavx512bw -mavx512vl -mavx512dq, or on SIMDe in the unit tests).
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "cpu/avx512/intrinsics_avx512.h"
#include "cpu/panel_prefetcher.h"
#include "cpu/super_block_tiles.h"
#include "weights/model.h"
#include "weights/weight_blocks.h"

namespace barellm::cpu::avx512 {

constexpr int kLanes = 16;  // floats per 512-bit register
// vpternlogd's truth table for (a & b) | c.
constexpr int kAndOr = 0xEA;

// The first `count` lanes of 16 (all of them when count ≥ 16).
inline __mmask16 first_lanes(int count) {
    return count >= kLanes ? __mmask16(0xffff) : __mmask16((1u << count) - 1);
}
// The lanes i of 16 with base + i in [first, end).
inline __mmask16 lanes_in(int base, int first, int end) {
    if (end <= base) return 0;
    return __mmask16(first_lanes(end - base) & ~first_lanes(std::max(0, first - base)));
}
// The four bytes at p in every 32-bit lane.
inline __m512i broadcast_word(const int8_t* p) {
    return _mm512_broadcastd_epi32(_mm_loadu_si32(p));
}
// IQ4_XS's levels + kIq4Excess (1..241, unsigned), a vpshufb table in each 128-bit lane: what
// the VNNI kernels multiply by x, taking kIq4Excess · Σ x off through x's sums. MXFP4's levels
// (kMxfp4Values) likewise, + kIq4Excess.
constexpr int kIq4Excess = kTileLevelExcess;  // 128, as the tiles' (cpu/quantized_tiles.h)
inline __m512i unsigned_levels(const int8_t (&values)[16]) {
    alignas(16) uint8_t levels[16];
    for (int i = 0; i < 16; ++i) levels[i] = uint8_t(values[i] + kIq4Excess);
    return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(levels)));
}
inline __m512i iq4_unsigned_levels() { return unsigned_levels(kIq4Values); }
// MXFP4's scales mxfp4_scale(e) of the exponents e (0..255), a lane each: the f32 bits
// (e − 1) << 23, 0 for e < 2 (also a gather's 0 past a matrix's last row).
inline __m512 mxfp4_scales(__m512i e) {
    const __m512i one = _mm512_set1_epi32(1);
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, one), kF32MantissaBits);
    const __mmask16 small =
        _mm512_cmple_epu32_mask(e, _mm512_set1_epi32(int(kMxfp4SubnormalBelow) - 1));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, _mm512_setzero_si512()));
}
// The 16 rows' scales of group g of a tile of cpu/quantized_tiles.h, as f32: f16, or MXFP4's
// bf16 (the top half of an f32).
template <DType kType>
inline __m512 group_tile_scales(const uint8_t* tile, int g) {
    const __m256i bits =
        _mm256_load_si256(reinterpret_cast<const __m256i*>(tile_group_scales(tile, kType, g)));
    if constexpr (kType == DType::MXFP4)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
    return _mm512_cvtph_ps(bits);
}
// The levels (0..63) of sub-block i of a Q6_K tile's super-block `block`
// (cpu/super_block_tiles.h): q[s] those of columns 16i + 4s..16i + 4s + 3, four a lane, the
// tile's 16 rows. Registers 0-2 hold levels 0-2 in their low 6 bits; level 3's pairs of bits,
// at the top of each byte, shift down into place (the word shifts carry the next byte's bits
// in above them, which the masks drop).
inline void q6_k_tile_levels(const uint8_t* block, int i, __m512i q[4]) {
    const uint8_t* values = block + kQ6KTileValuesOffset + i * kQ6KTileSubBlockBytes;
    __m512i registers[3];
#pragma GCC unroll 3
    for (int s = 0; s < 3; ++s) {
        registers[s] = _mm512_load_si512(values + s * kTileRegisterBytes);
        q[s] = _mm512_and_si512(registers[s], _mm512_set1_epi8(0x3f));
    }
    const __m512i bits_0_1 =
        _mm512_and_si512(_mm512_srli_epi16(registers[0], 6), _mm512_set1_epi8(0x03));
    const __m512i bits_0_3 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(registers[1], 4),
                                                       _mm512_set1_epi8(0x0c), bits_0_1, kAndOr);
    q[3] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(registers[2], 2), _mm512_set1_epi8(0x30),
                                     bits_0_3, kAndOr);
}

// The levels (0..3) of sub-block i of a Q2_K tile's super-block `block`
// (cpu/super_block_tiles.h): q[s] those of columns 16i + 4s..16i + 4s + 3, four a lane, the
// tile's 16 rows, bits 2s and 2s + 1 of each byte of the sub-block's register (the word shifts
// carry the next byte's bits in above them, which the mask drops).
inline void q2_k_tile_levels(const uint8_t* block, int i, __m512i q[4]) {
    const __m512i levels = _mm512_load_si512(block + kQ2KTileValuesOffset + i * kTileRegisterBytes);
    const __m512i level = _mm512_set1_epi8(0x03);
    q[0] = _mm512_and_si512(levels, level);
#pragma GCC unroll 3
    for (int s = 1; s < 4; ++s)
        q[s] = _mm512_and_si512(_mm512_srli_epi16(levels, kQ2KLevelBits * s), level);
}

// The levels (0..7) of sub-block i of a Q3_K tile's super-block `block`
// (cpu/super_block_tiles.h): q[s] those of columns 16i + 4s..16i + 4s + 3, four a lane, the
// tile's 16 rows. Sub-block 2p's four are bits 0-2 and 3-5 of its pair's R0 and R1; 2p + 1's
// first two those of R2, its last two gathered from the three registers' bits 6-7 (the word
// shifts carry the next byte's bits in above them, which the masks drop).
inline void q3_k_tile_levels(const uint8_t* block, int i, __m512i q[4]) {
    const uint8_t* pair = block + kQ3KTileValuesOffset + i / 2 * kQ3KTilePairBytes;
    const __m512i r0 = _mm512_load_si512(pair), r1 = _mm512_load_si512(pair + kTileRegisterBytes);
    const __m512i level = _mm512_set1_epi8(0x07);
    if (i % 2 == 0) {
        q[0] = _mm512_and_si512(r0, level);
        q[1] = _mm512_and_si512(_mm512_srli_epi16(r0, 3), level);
        q[2] = _mm512_and_si512(r1, level);
        q[3] = _mm512_and_si512(_mm512_srli_epi16(r1, 3), level);
        return;
    }
    const __m512i r2 = _mm512_load_si512(pair + 2 * kTileRegisterBytes);
    q[0] = _mm512_and_si512(r2, level);
    q[1] = _mm512_and_si512(_mm512_srli_epi16(r2, 3), level);
    q[2] = _mm512_ternarylogic_epi32(
        _mm512_srli_epi16(r1, 4), _mm512_set1_epi8(0x04),
        _mm512_and_si512(_mm512_srli_epi16(r0, 6), _mm512_set1_epi8(0x03)), kAndOr);
    q[3] = _mm512_ternarylogic_epi32(
        _mm512_srli_epi16(r2, 5), _mm512_set1_epi8(0x06),
        _mm512_and_si512(_mm512_srli_epi16(r1, 7), _mm512_set1_epi8(0x01)), kAndOr);
}

// Transposes the 16 × 16 block held in rows[0..15] (rows[i] lane j becomes rows[j] lane i):
// pairs of rows interleaved, then 4 × 4 blocks within each 128-bit lane, then those lanes.
// The loops are unrolled so that the arrays live in registers, not on the stack.
inline void transpose16x16(__m512 rows[16]) {
    __m512 pairs[16], quads[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 2) {
        pairs[i] = _mm512_unpacklo_ps(rows[i], rows[i + 1]);
        pairs[i + 1] = _mm512_unpackhi_ps(rows[i], rows[i + 1]);
    }
    // quads[4i + j], 128-bit lane l: rows 4i .. 4i + 3 of column 4l + j.
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 4) {
        quads[i] = _mm512_shuffle_ps(pairs[i], pairs[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        quads[i + 1] = _mm512_shuffle_ps(pairs[i], pairs[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        quads[i + 2] = _mm512_shuffle_ps(pairs[i + 1], pairs[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        quads[i + 3] = _mm512_shuffle_ps(pairs[i + 1], pairs[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    constexpr int kEvenLanes = _MM_SHUFFLE(2, 0, 2, 0), kOddLanes = _MM_SHUFFLE(3, 1, 3, 1);
#pragma GCC unroll 16
    for (int j = 0; j < 4; ++j) {
        const __m512 low_even = _mm512_shuffle_f32x4(quads[j], quads[4 + j], kEvenLanes);
        const __m512 low_odd = _mm512_shuffle_f32x4(quads[j], quads[4 + j], kOddLanes);
        const __m512 high_even = _mm512_shuffle_f32x4(quads[8 + j], quads[12 + j], kEvenLanes);
        const __m512 high_odd = _mm512_shuffle_f32x4(quads[8 + j], quads[12 + j], kOddLanes);
        rows[j] = _mm512_shuffle_f32x4(low_even, high_even, kEvenLanes);
        rows[4 + j] = _mm512_shuffle_f32x4(low_odd, high_odd, kEvenLanes);
        rows[8 + j] = _mm512_shuffle_f32x4(low_even, high_even, kOddLanes);
        rows[12 + j] = _mm512_shuffle_f32x4(low_odd, high_odd, kOddLanes);
    }
}

// The first `count` bytes of 64.
inline __mmask64 first_bytes(int count) {
    return count >= 64 ? ~__mmask64(0) : (__mmask64(1) << count) - 1;
}

// x's Q8 rule (cpu/kernels.h, q8_group_scale) for up to 16 groups of 32 at once: the scale and
// multiplier of groups first_group .. first_group + count - 1 of x[cols]. Each group's largest
// |x| in a lane, then one division for the 16 scales, one for the 16 multipliers, and f16's
// rounding by vcvtps2ph (to nearest even): the bits of q8_group_scale.
inline void q8_group_scales(const float* x, int cols, int first_group, int count, float* scales,
                            float* multipliers) {
    alignas(64) float largest[kLanes] = {};
    for (int j = 0; j < count; ++j) {
        const int first = (first_group + j) * kQ8Group, in_group = std::min(kQ8Group, cols - first);
        const __m512 low = _mm512_maskz_loadu_ps(first_lanes(in_group), x + first);
        const __m512 high =
            _mm512_maskz_loadu_ps(first_lanes(std::max(0, in_group - kLanes)), x + first + kLanes);
        largest[j] = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(low), _mm512_abs_ps(high)));
    }
    const __m512 q8_largest = _mm512_set1_ps(kQ8Largest);
    const __m512 l = _mm512_load_ps(largest);
    const __mmask16 nonzero = _mm512_cmp_ps_mask(l, _mm512_setzero_ps(), _CMP_NEQ_UQ);
    const __m512 scale = _mm512_maskz_div_ps(nonzero, l, q8_largest);
    const __mmask16 half_normal =
        _mm512_cmp_ps_mask(scale, _mm512_set1_ps(kHalfSmallestNormal), _CMP_GE_OQ) &
        _mm512_cmp_ps_mask(scale, _mm512_set1_ps(kHalfLargest), _CMP_LE_OQ);
    const __m512 rounded =
        _mm512_cvtph_ps(_mm512_cvtps_ph(scale, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __mmask16 stored = first_lanes(count);
    _mm512_mask_storeu_ps(scales, stored, _mm512_mask_mov_ps(scale, half_normal, rounded));
    _mm512_mask_storeu_ps(multipliers, stored, _mm512_maskz_div_ps(nonzero, q8_largest, l));
}

// The sum of 16 int8 values: vpsadbw adds the 8 bytes of each half, taken as value + 128.
inline int32_t sum_of_16_bytes(__m128i values) {
    constexpr int kByteOffset = 128;
    const __m128i sums =
        _mm_sad_epu8(_mm_xor_si128(values, _mm_set1_epi8(char(kByteOffset))), _mm_setzero_si128());
    return _mm_cvtsi128_si32(sums) + _mm_extract_epi16(sums, 4) - 16 * kByteOffset;
}

// x[cols] quantized to Q8 a group of 32 at a time, by x's Q8 rule (q8_group_scales): the
// scale of group g in scales[g], its values handed to store(g, low, high) as int8 lanes,
// columns 0-15 in `low` and 16-31 in `high`, 0 past cols.
template <typename Store>
inline void quantize_groups(const float* x, int cols, int groups, float* scales, Store store) {
    for (int first_group = 0; first_group < groups; first_group += kLanes) {
        const int count = std::min(kLanes, groups - first_group);
        alignas(64) float multipliers[kLanes];
        q8_group_scales(x, cols, first_group, count, scales + first_group, multipliers);
        for (int j = 0; j < count; ++j) {
            const int g = first_group + j, first = g * kQ8Group;
            const int in_group = std::min(kQ8Group, cols - first);
            const __m512 low = _mm512_maskz_loadu_ps(first_lanes(in_group), x + first);
            const __m512 high = _mm512_maskz_loadu_ps(first_lanes(std::max(0, in_group - kLanes)),
                                                      x + first + kLanes);
            const __m512 m = _mm512_set1_ps(multipliers[j]);
            // cvtps2dq rounds to the nearest integer, ties to even (the default MXCSR mode).
            store(g, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(low, m))),
                  _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(high, m))));
        }
    }
}

// The weights of storage type kType at p[0..15] as f32; lanes outside `mask` are 0 and
// their memory is not read.
template <DType kType>
inline __m512 widen16(const void* p, __mmask16 mask) {
    if constexpr (kType == DType::F32) {
        return _mm512_maskz_loadu_ps(mask, p);
    } else {
        const __m256i raw = _mm256_maskz_loadu_epi16(mask, p);
        if constexpr (kType == DType::F16) return _mm512_cvtph_ps(raw);
        // bf16 -> f32: the 16 bits become the top half of each 32-bit lane.
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    }
}
template <DType kType>
inline __m512 widen16(const void* p) {
    if constexpr (kType == DType::F32) {
        return _mm512_loadu_ps(p);
    } else {
        const __m256i raw = _mm256_loadu_si256(static_cast<const __m256i*>(p));
        if constexpr (kType == DType::F16) return _mm512_cvtph_ps(raw);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    }
}

// Below this e^x is taken as 0: e^-87 ≈ 1.6e-38 is near the smallest normal float.
constexpr float kExpLowest = -87.0f;

// e^x in each lane, for x ≤ 0, as avx2::exp_nonpositive (0 below kExpLowest, so e^-inf is
// exactly 0):
// - x = n·ln2 + r with |r| ≤ ln2/2;
// - e^r by its Taylor polynomial of degree 6 (relative error below 2e-7);
// - 2^n written into the exponent bits.
inline __m512 exp_nonpositive(__m512 x) {
    const __mmask16 below = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpLowest), _CMP_LT_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(kExpLowest));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    // ln2 in two parts, so that n · (high part) is exact.
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    for (float coefficient : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(coefficient));
    const __m512i two_to_n =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mask_blend_ps(below, _mm512_mul_ps(p, _mm512_castsi512_ps(two_to_n)),
                                _mm512_setzero_ps());
}

// ---- The outer-product micro-kernel of the f32 GEMM (gemm_float_avx512.cpp) and of prefill
// attention (attention_avx512.cpp).

constexpr int kTileFloats = 16;        // floats of one tile column: one register
constexpr int kOuterProductRows = 12;  // panel rows per call at most
constexpr int kOuterProductTiles = 2;  // tiles per call at most: 24 accumulators of 32 registers

// The addresses of ROWS rows `row_bytes` apart, as one pointer per three rows and the
// stride (a row is its pointer plus 0, 1 or 2 strides: one x86-64 address each): a
// micro-kernel reading 12 rows keeps them in five general registers. A pointer per row would
// take twelve, which with the loop's others is more than x86-64's 16, and the loop would
// reload some of them from the stack at every step.
template <int ROWS>
class RowAddresses {
public:
    RowAddresses(const void* first_row, size_t row_bytes) : row_bytes_(row_bytes) {
#pragma GCC unroll 16
        for (int j = 0; j < kPointers; ++j)
            pointers_[j] = static_cast<const char*>(first_row) + j * kRowsPerPointer * row_bytes;
    }
    // Row r at the current column.
    const char* row(int r) const {
        return pointers_[r / kRowsPerPointer] + r % kRowsPerPointer * row_bytes_;
    }
    // Moves every row `bytes` further along.
    void advance(size_t bytes) {
#pragma GCC unroll 16
        for (int j = 0; j < kPointers; ++j) pointers_[j] += bytes;
    }

private:
    static constexpr int kRowsPerPointer = 3;
    static constexpr int kPointers = (ROWS + kRowsPerPointer - 1) / kRowsPerPointer;
    const char* pointers_[kPointers];
    size_t row_bytes_;
};

// For each of TILES tiles t (x_tile + t · x_tile_stride, sums + t · sums_tile_stride):
//   sums[r][k] += Σ_i panel[r · panel_stride + i] · x_tile[i][k], r < ROWS, k < 16.
// Registers: ROWS × TILES accumulators and TILES of x; each step broadcasts one panel value
// per row (RowAddresses).
template <int ROWS, int TILES>
void outer_product_kernel(float* sums, size_t sums_tile_stride, const float* panel,
                          size_t panel_stride, const float* x_tile, size_t x_tile_stride,
                          int depth) {
    __m512 acc[TILES][ROWS];
#pragma GCC unroll 16
    for (int t = 0; t < TILES; ++t)
#pragma GCC unroll 16
        for (int r = 0; r < ROWS; ++r)
            acc[t][r] = _mm512_loadu_ps(sums + t * sums_tile_stride + r * kTileFloats);
    RowAddresses<ROWS> rows(panel, panel_stride * sizeof(float));
    for (int i = 0; i < depth; ++i) {
        __m512 x[TILES];
#pragma GCC unroll 16
        for (int t = 0; t < TILES; ++t)
            x[t] = _mm512_loadu_ps(x_tile + t * x_tile_stride + i * kTileFloats);
#pragma GCC unroll 16
        for (int r = 0; r < ROWS; ++r) {
            const __m512 weight = _mm512_set1_ps(*reinterpret_cast<const float*>(rows.row(r)));
#pragma GCC unroll 16
            for (int t = 0; t < TILES; ++t) acc[t][r] = _mm512_fmadd_ps(weight, x[t], acc[t][r]);
        }
        rows.advance(sizeof(float));
    }
#pragma GCC unroll 16
    for (int t = 0; t < TILES; ++t)
#pragma GCC unroll 16
        for (int r = 0; r < ROWS; ++r)
            _mm512_storeu_ps(sums + t * sums_tile_stride + r * kTileFloats, acc[t][r]);
}

using OuterProductKernel = void (*)(float* sums, size_t sums_tile_stride, const float* panel,
                                    size_t panel_stride, const float* x_tile, size_t x_tile_stride,
                                    int depth);

template <int TILES, int... ROWS_MINUS_ONE>
constexpr std::array<OuterProductKernel, kOuterProductRows> outer_product_kernels_for_tiles(
    std::integer_sequence<int, ROWS_MINUS_ONE...>) {
    return {outer_product_kernel<ROWS_MINUS_ONE + 1, TILES>...};
}
// [tiles - 1][rows - 1]: every shape up to kOuterProductTiles × kOuterProductRows.
inline constexpr std::array<OuterProductKernel, kOuterProductRows>
    kOuterProductKernels[kOuterProductTiles] = {
        outer_product_kernels_for_tiles<1>(std::make_integer_sequence<int, kOuterProductRows>()),
        outer_product_kernels_for_tiles<2>(std::make_integer_sequence<int, kOuterProductRows>())};
static_assert(kOuterProductTiles == 2, "kOuterProductKernels lists one entry per tile count");

// The kernel for 1 ≤ rows ≤ kOuterProductRows and 1 ≤ tiles ≤ kOuterProductTiles.
inline OuterProductKernel outer_product_kernel_for(int rows, int tiles) {
    return kOuterProductKernels[tiles - 1][rows - 1];
}

// The prefetcher, over `calls` micro-kernel calls, of the GEMM panel after the one of rows
// [block, block + row_block) and columns [depth_start, depth_start + depth_block) of w, in
// a thread's rows up to end_row: the next columns of the same rows, else the first columns of
// the next block of rows.
inline PanelPrefetcher next_panel_prefetcher(const Matrix& w, int element_bytes, int block,
                                             int end_row, int depth_start, int row_block,
                                             int depth_block, int calls) {
    const bool last_columns = depth_start + depth_block >= w.cols;
    const int next_block = last_columns ? block + row_block : block;
    const int next_depth_start = last_columns ? 0 : depth_start + depth_block;
    const int rows = next_block < end_row ? std::min(row_block, end_row - next_block) : 0;
    const int depth = std::min(depth_block, w.cols - next_depth_start);
    const char* data = static_cast<const char*>(w.data);
    const size_t row_bytes = size_t(w.cols) * element_bytes;
    return PanelPrefetcher(
        rows ? data + next_block * row_bytes + size_t(next_depth_start) * element_bytes : data,
        row_bytes, rows, depth * element_bytes, calls);
}

}  // namespace barellm::cpu::avx512
