// The decode matvec on AVX-512 + VNNI for the blocks of 32 whose nibbles pick a level in a
// table (weight_blocks.h): IQ4_NL (kIq4Values under an f16 d) and MXFP4 (kMxfp4Values under
// 2^(e − 128)), all of an IQ4_NL file's matrices and the experts of an MXFP4 one. out = W · x
// for one token, x quantized per 32 to Q8 (cpu::quantize_q8, whose groups are these blocks).
//
// Two blocks a register: a row's 2 × 16 bytes of nibbles become 64 levels u = level + 128
// (vpshufb from unsigned_levels), in the order [block b columns 0-15, b + 1 columns 0-15,
// b columns 16-31, b + 1 columns 16-31], x's 64 values permuted once to the same order.
// vpdpbusd adds each lane's four u · x to −128 · (the four x's sum), computed once for all
// rows: each int32 lane is Σ level · x over its four columns, exact. Lanes 0-3 and 8-11
// belong to block b, 4-7 and 12-15 to b + 1; the lanes, as f32, are multiplied by their
// block's scale times x's scale and added to the row's 16 f32 sums.
//
// 16 rows side by side, each its own stream of loads (as the AVX2 matvec of these blocks,
// whose measurements chose 16), each asking for the line kPrefetchBytes ahead; the 16 rows'
// scales of a block come in one gather, already times x's scale, and vpermt2ps spreads a row's
// two scales over its lanes.
//
// One core, 2048 columns, the best of 30 runs, on a machine shared with other work: the AVX2
// matvec (matvec_small_blocks_avx2.cpp) read MXFP4 at 13.3 GB/s from L2 (0.3 MB) and 7.5 from
// memory (400 MB), IQ4_NL at 12.4 and 7.2; this one 17.8 and 8.6, 19.3 and 8.4 without
// prefetches; asking for the line 128, 256, 512 or 2048 bytes ahead, 8.3, 9.3, 8.7 and 9.1
// (MXFP4) from memory.
#include "cpu/avx512/avx512.h"
#include "cpu/avx512/helpers_avx512.h"

namespace barellm::cpu::avx512 {

namespace {

constexpr int kRowsAtOnce = 16;
constexpr int kPair = 2;  // blocks a register
constexpr int kLevelExcess = kIq4Excess;
constexpr int kPrefetchBytes = 4 * kCacheLine;

// Where a type's block keeps its nibbles, and its scale from the 32-bit word at the block's
// start (IQ4_NL: the f16 d; MXFP4: the exponent byte e), one lane a row, `rows` of them read.
template <DType kType>
struct LookupBlock;
template <>
struct LookupBlock<DType::IQ4_NL> {
    static constexpr size_t kBytes = sizeof(BlockIQ4_NL), kNibbles = offsetof(BlockIQ4_NL, qs);
    static __m512i levels() { return unsigned_levels(kIq4Values); }
    static __m512 scales(__m512i words, __mmask16) {
        return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
    }
};
template <>
struct LookupBlock<DType::MXFP4> {
    static constexpr size_t kBytes = sizeof(BlockMXFP4), kNibbles = offsetof(BlockMXFP4, qs);
    static __m512i levels() { return unsigned_levels(kMxfp4Values); }
    static __m512 scales(__m512i words, __mmask16 rows) {
        return mxfp4_row_scales(_mm512_and_si512(words, _mm512_set1_epi32(0xff)), rows);
    }
};

// The picks of vpermt2ps that give row k's scale of block b (lane k of the first table) to
// lanes 0-3 and 8-11 and of block b + 1 (lane k of the second) to lanes 4-7 and 12-15.
struct ScalePicks {
    alignas(64) int32_t lanes[kRowsAtOnce][kLanes];
    ScalePicks() {
        for (int k = 0; k < kRowsAtOnce; ++k)
            for (int l = 0; l < kLanes; ++l) lanes[k][l] = l / 4 % 2 == 0 ? k : kLanes + k;
    }
};
const ScalePicks scale_picks;

// Rows r..r + rows − 1 (rows ≤ 16, row_bytes apart from `first`) · x, into out[0..rows).
template <DType kType>
void lookup_rows_dot(float* out, const uint8_t* first, size_t row_bytes, int rows, int blocks,
                     const QuantizedVector& x) {
    using Block = LookupBlock<kType>;
    const __m512i table = Block::levels();
    const __m256i low_nibbles = _mm256_set1_epi8(0x0f);
    const __m512i excess = _mm512_set1_epi8(char(kLevelExcess));
    const __m512i row_offsets =
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                           _mm512_set1_epi32(int(row_bytes)));
    const __mmask16 row_lanes = first_lanes(rows);
    // The rows' scales of the blocks at `blocks` (one a row), times x's scale.
    const auto row_scales = [&](const uint8_t* blocks, float x_scale) {
        const __m512i words =
            _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), row_lanes, row_offsets, blocks, 1);
        return _mm512_mul_ps(Block::scales(words, row_lanes), _mm512_set1_ps(x_scale));
    };
    __m512 sums[kRowsAtOnce];
    for (int k = 0; k < kRowsAtOnce; ++k) sums[k] = _mm512_setzero_ps();
    for (int b = 0; b < blocks; b += kPair) {
        const bool pair = b + 1 < blocks;
        // x of both blocks, in the levels' order; zeros in place of a missing second block.
        const int8_t* xb = x.values.data() + size_t(b) * kSmallBlock;
        __m512i xv =
            pair ? _mm512_loadu_si512(xb) : _mm512_maskz_loadu_epi8(__mmask64(0xffffffffull), xb);
        xv = _mm512_shuffle_i32x4(xv, xv, _MM_SHUFFLE(3, 1, 2, 0));
        // −128 · Σ x of each lane's four columns: the dots' starting value.
        const __m512i start = _mm512_sub_epi32(
            _mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), excess, xv));
        // The rows' scales of both blocks, times x's.
        const uint8_t* blocks_at = first + size_t(b) * Block::kBytes;
        const __m512 scales_b = row_scales(blocks_at, x.scales[b]);
        const __m512 scales_next =
            pair ? row_scales(blocks_at + Block::kBytes, x.scales[b + 1]) : _mm512_setzero_ps();
#pragma GCC unroll 16
        for (int k = 0; k < kRowsAtOnce; ++k) {
            if (k >= rows) break;
            const uint8_t* nibbles = blocks_at + k * row_bytes + Block::kNibbles;
            prefetch_ahead(nibbles, kPrefetchBytes, kCacheLine);
            const __m128i low_block = _mm_loadu_si128(reinterpret_cast<const __m128i*>(nibbles));
            const __m256i both =
                pair ? _mm256_inserti128_si256(_mm256_castsi128_si256(low_block),
                                               _mm_loadu_si128(reinterpret_cast<const __m128i*>(
                                                   nibbles + Block::kBytes)),
                                               1)
                     : _mm256_zextsi128_si256(low_block);
            const __m256i low = _mm256_and_si256(both, low_nibbles);
            const __m256i high = _mm256_and_si256(_mm256_srli_epi16(both, 4), low_nibbles);
            const __m512i indices = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
            const __m512i dots =
                _mm512_dpbusd_epi32(start, _mm512_shuffle_epi8(table, indices), xv);
            const __m512 scales = _mm512_permutex2var_ps(
                scales_b, _mm512_load_si512(scale_picks.lanes[k]), scales_next);
            sums[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), scales, sums[k]);
        }
    }
    for (int k = 0; k < rows; ++k) out[k] = _mm512_reduce_add_ps(sums[k]);
}

template <DType kType>
void lookup_rows(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                 int row_count) {
    const int blocks = w.cols / kSmallBlock;
    for (int r = first_row; r < first_row + row_count; r += kRowsAtOnce)
        lookup_rows_dot<kType>(out + r, w.row_data(r), w.row_bytes(),
                               std::min(kRowsAtOnce, first_row + row_count - r), blocks, x);
}

}  // namespace

void matvec_rows_lookup_blocks(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                               int row_count) {
    (w.dtype == DType::MXFP4 ? lookup_rows<DType::MXFP4>
                             : lookup_rows<DType::IQ4_NL>)(out, w, x, first_row, row_count);
}

}  // namespace barellm::cpu::avx512
