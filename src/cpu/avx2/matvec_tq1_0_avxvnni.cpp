// The decode matvec on AVX2 + AVX-VNNI for TQ1_0 (trits packed five a byte in base 3,
// weight_blocks.h): out = W · x for one token, x quantized per 256 as Q8_K, each super-block's dot
// product in integers, a row at a time. AVX2 alone reads the trits out as levels
// (matvec_iq_avx2.cpp); the 256-bit vpdpbusd lets the dot skip them.
//
// A register's shifted bytes v (avx2::tq1_0_shifted_bytes: each byte times 3^n modulo 256, trit
// n at its top) hold each column's trit t as 3v = 256·t + (3v mod 256). So
// 256 · Σ t·q = 3 · Σ v·q − Σ (3v mod 256)·q: two vpdpbusd of unsigned bytes a register, and the
// bytes times 3 are the next trit's shifted bytes, which the loop makes anyway. The weight is
// d · (t − 1): the offset comes off once per super-block as x's sum. Two pairs of accumulators
// take alternate registers, so that each chain of dependent vpdpbusd is half as long. In a lane,
// Σ v·q is at most 8 registers · 4 bytes · 255 · 127, and three times that far below 2^31.
#include "cpu/avx2/avxvnni.h"
#include "cpu/avx2/helpers_avx2.h"
#include "cpu/avx2/intrinsics_avx2.h"
#include "cpu/avx2/iq_levels_avx2.h"
#include "cpu/iq_levels.h"
#include "cpu/panel_prefetcher.h"
#include "weights/weight_blocks.h"

namespace barellm::cpu::avxvnni {

namespace {

using avx2::bytes_times_three;
using avx2::kIqRegisterCols;
using avx2::kIqRegisters;
using avx2::load256;

constexpr int kSumsPerBlock = kSuperBlock / kIqMultiplierCols;  // Q8KVector::sums a super-block
constexpr int kChains = 2;                                      // accumulators of each sum
constexpr int kByteBits = 8;

// One row of TQ1_0 · x: Σ over super-blocks b of x.d[b] · d · Σ (t − 1)·q.
float tq1_0_row_dot(const uint8_t* row, int blocks, const Q8KVector& x) {
    constexpr DType kType = DType::TQ1_0;
    constexpr size_t kBlockBytes = sizeof(BlockTQ1_0);
    constexpr IqShape kShape = iq_shape(kType);
    __m256 sums = _mm256_setzero_ps();
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = row + size_t(b) * kBlockBytes;
        prefetch_ahead(block, kRowPrefetchBytes, int(kBlockBytes));
        const int8_t* xb = x.values.data() + size_t(b) * kSuperBlock;
        __m256i byte_dots[kChains], tripled_dots[kChains];  // Σ v·q, Σ (3v mod 256)·q
        for (int c = 0; c < kChains; ++c) byte_dots[c] = tripled_dots[c] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int r = 0; r < kIqRegisters; ++r) {
            const __m256i v = avx2::tq1_0_shifted_bytes<false>(block, r);
            const __m256i xr = load256(xb + kIqRegisterCols * r);
            byte_dots[r % kChains] = _mm256_dpbusd_avx_epi32(byte_dots[r % kChains], v, xr);
            tripled_dots[r % kChains] =
                _mm256_dpbusd_avx_epi32(tripled_dots[r % kChains], bytes_times_three(v), xr);
        }
        __m256i byte_dot = byte_dots[0], tripled_dot = tripled_dots[0];
        for (int c = 1; c < kChains; ++c) {
            byte_dot = _mm256_add_epi32(byte_dot, byte_dots[c]);
            tripled_dot = _mm256_add_epi32(tripled_dot, tripled_dots[c]);
        }
        const __m256i trit_dots = _mm256_srai_epi32(
            _mm256_sub_epi32(_mm256_add_epi32(_mm256_slli_epi32(byte_dot, 1), byte_dot),
                             tripled_dot),
            kByteBits);
        // −offset · Σx, x's 16 sums of 16 in pairs.
        const __m256i offset_dots =
            _mm256_madd_epi16(load256(x.sums.data() + size_t(b) * kSumsPerBlock),
                              _mm256_set1_epi16(short(-kShape.offset)));
        sums = _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(_mm256_add_epi32(trit_dots, offset_dots)),
            _mm256_set1_ps(x.d[b] * _cvtsh_ss(iq_d_bits(kType, block)) * kShape.factor), sums);
    }
    return avx2::horizontal_sum(sums);
}

}  // namespace

void matvec_rows_tq1_0(float* out, const Matrix& w, const Q8KVector& x, int first_row,
                       int row_count) {
    const int blocks = w.cols / kSuperBlock;
    for (int r = first_row; r < first_row + row_count; ++r)
        out[r] = tq1_0_row_dot(w.row_data(r), blocks, x);
}

}  // namespace barellm::cpu::avxvnni
