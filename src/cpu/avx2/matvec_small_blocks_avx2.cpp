// The decode matvecs on AVX2 + FMA + F16C for Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4 weights
// (weight_blocks.h), the blocks of 32 that K-quant and IQ4_XS files hold where a row is no
// multiple of 256 (and all of an IQ4_NL file, the experts of an MXFP4 one): out = W · x for one
// token, x quantized per 32 to Q8 (cpu::quantize_q8, whose groups are these blocks), each block's
// dot product in integers. The AVX-512 level runs them too, but for IQ4_NL and MXFP4 where it has
// VNNI (from their tiles: matvec_quantized_avx512vnni.cpp).
//
// A block's 32 q (unsigned: 0..15, or 0..31 with the fifth bits of qh) widen to one register
// in x's order; vpmaddubsw multiplies them by x's signed bytes into int16 pairs and vpmaddwd
// adds those into 8 int32 lanes, exact. What q stands for comes in through x's group sum:
// Q4_1/Q5_1's w = d·q + m adds m · Σx, Q5_0's w = d·(q − 16) subtracts 16 · d · Σx.
// IQ4_NL's values (−127..113, looked up by vpshufb) and MXFP4's (−12..12) are signed:
// vpmaddubsw multiplies |value| by x with the value's sign (vpsignb), two products into int16
// (at most 2 · 127 · 127). An MXFP4 block's scale is 2^(e − 128) (mxfp4_scale), not an f16.
#include <immintrin.h>

#include <cstddef>
#include <cstring>

#include "cpu/avx2/avx2.h"
#include "cpu/avx2/block_levels_avx2.h"
#include "cpu/avx2/helpers_avx2.h"
#include "weights/weight_blocks.h"

namespace barellm::cpu::avx2 {

namespace {

// Rows read side by side: a whole IQ4_NL file's matrices are mostly these rows, and one row
// at a time left the loads waiting on memory. IQ4_NL, one core, 2048 columns, from memory
// (230 MB) and from cache (6.5 MB): one row 3.4 and 8.2 GB/s, 4 rows 4.3 and 11.5, 8 rows 5.9
// and 11.5, 16 rows 7.3 and 11.6; asking for the lines 0.75-6 KB ahead changed nothing.
constexpr int kRowsAtOnce = 16;

template <DType kType>
constexpr size_t small_block_bytes() {
    return kType == DType::Q4_1    ? sizeof(BlockQ4_1)
           : kType == DType::Q5_0  ? sizeof(BlockQ5_0)
           : kType == DType::Q5_1  ? sizeof(BlockQ5_1)
           : kType == DType::MXFP4 ? sizeof(BlockMXFP4)
                                   : sizeof(BlockIQ4_NL);
}

// The signed types: their nibbles pick a value in a table.
template <DType kType>
constexpr bool looks_levels_up() {
    return kType == DType::IQ4_NL || kType == DType::MXFP4;
}

// A block's scale: MXFP4's power of two, the others' f16 d (their first field).
template <DType kType>
float block_scale(const uint8_t* block) {
    if constexpr (kType == DType::MXFP4) return mxfp4_scale(block[offsetof(BlockMXFP4, e)]);
    return f16_at(block);
}

// Rows r..r + kRows − 1 (row_bytes apart from `first`) · x, into out[0..kRows): the rows side
// by side, each block of x loaded once for all of them, each row its own accumulators and its
// own stream of loads.
template <DType kType, int kRows>
void small_block_rows_dot(float* out, const uint8_t* first, size_t row_bytes, int blocks,
                          const QuantizedVector& x) {
    constexpr bool kSigned = looks_levels_up<kType>();
    constexpr bool kHasMin = kType == DType::Q4_1 || kType == DType::Q5_1;
    constexpr size_t kValuesOffset =
        kType == DType::MXFP4 ? offsetof(BlockMXFP4, qs) : offsetof(BlockIQ4_NL, qs);
    const __m256i ones = _mm256_set1_epi16(1),
                  table = kType == DType::MXFP4 ? mxfp4_table() : iq4_table();
    __m256 sums[kRows];
    float offsets[kRows];  // Σ of the m · Σx (or −16 · d · Σx) terms, times x's scales
    for (int k = 0; k < kRows; ++k) {
        sums[k] = _mm256_setzero_ps();
        offsets[k] = 0.0f;
    }
    for (int b = 0; b < blocks; ++b) {
        const __m256i values =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.values.data() + b * kSmallBlock));
        const float x_scale = x.scales[b];
#pragma GCC unroll 16
        for (int k = 0; k < kRows; ++k) {
            const uint8_t* block = first + k * row_bytes + size_t(b) * small_block_bytes<kType>();
            __m256i pairs;
            if constexpr (kSigned) {
                const __m256i levels = _mm256_shuffle_epi8(table, nibbles(block + kValuesOffset));
                pairs =
                    _mm256_maddubs_epi16(_mm256_abs_epi8(levels), _mm256_sign_epi8(values, levels));
            } else {
                pairs = _mm256_maddubs_epi16(small_block_levels<kType>(block), values);
            }
            const __m256i dot = _mm256_madd_epi16(pairs, ones);
            const float d = block_scale<kType>(block);
            sums[k] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(d * x_scale), sums[k]);
            if constexpr (!kSigned)
                offsets[k] +=
                    (kHasMin ? f16_at(block + 2) : -kQ5Offset * d) * x_scale * x.group_sums[b];
        }
    }
    for (int k = 0; k < kRows; ++k) out[k] = horizontal_sum(sums[k]) + offsets[k];
}

// Rows [first_row, first_row + row_count) of w, kRowsAtOnce at a time, then the rest one by one.
template <DType kType>
void small_block_rows(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                      int row_count) {
    const int blocks = w.cols / kSmallBlock;
    int r = first_row;
    for (; r + kRowsAtOnce <= first_row + row_count; r += kRowsAtOnce)
        small_block_rows_dot<kType, kRowsAtOnce>(out + r, w.row_data(r), w.row_bytes(), blocks, x);
    for (; r < first_row + row_count; ++r)
        small_block_rows_dot<kType, 1>(out + r, w.row_data(r), w.row_bytes(), blocks, x);
}

}  // namespace

void matvec_rows_small_blocks(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                              int row_count) {
    (w.dtype == DType::Q4_1    ? small_block_rows<DType::Q4_1>
     : w.dtype == DType::Q5_0  ? small_block_rows<DType::Q5_0>
     : w.dtype == DType::Q5_1  ? small_block_rows<DType::Q5_1>
     : w.dtype == DType::MXFP4 ? small_block_rows<DType::MXFP4>
                               : small_block_rows<DType::IQ4_NL>)(out, w, x, first_row, row_count);
}

}  // namespace barellm::cpu::avx2
