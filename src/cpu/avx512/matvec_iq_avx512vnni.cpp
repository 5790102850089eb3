// The decode matvec on AVX-512 + VNNI for the i-quant types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
// IQ3_S, IQ1_S, IQ1_M) and the ternary types (TQ1_0, TQ2_0): out = W · x for one token, x
// quantized per 256 as Q8_K, a row at a time.
//
// Each weight is d · factor · m · (u − offset) (cpu/iq_levels.h). Per register of 64 columns
// (iq_levels_avx512.h): vpmaddubsw multiplies the unsigned levels u by x's int8 values and adds
// each two into an int16 (at most 2 · 127 · 127: no saturation); vpdpwssd multiplies each two
// int16 by the lane's multiplier m (2s + 1 ≤ 31, one per 16 columns, vpermd'd to the lanes, in
// both 16-bit words) and adds them into the lane's int32 sum: m applied without a vpmulld, which
// took 10% longer (dev/cpu/super_block_matvec_bench.cpp, IQ2_XS). The offset comes off once
// per super-block as offset · m · (x's sum of 16), a lane per 16 columns. The super-block's
// int32 lanes (at most 4 · 4 · 127 · 127 · 31 + 64 · 31 · 16 · 127: below 2^24) are scaled by
// d · factor · x's d into 16 f32 sums, reduced at the end of the row. The ternary types have no
// m: vpdpbusd adds their levels' products straight into the super-block's lanes.
#include "cpu/avx512/avx512.h"
#include "cpu/avx512/helpers_avx512.h"
#include "cpu/avx512/iq_levels_avx512.h"
#include "cpu/iq_levels.h"
#include "cpu/panel_prefetcher.h"

namespace barellm::cpu::avx512 {

namespace {

constexpr int kLaneColumns = 4;  // columns of one int32 lane of vpdpbusd or vpdpwssd
constexpr int kWordBits = 16;

inline float f16_to_float(uint16_t bits) {
#ifdef BARELLM_SIMDE
    return half_to_float(bits);
#else
    return _cvtsh_ss(bits);  // F16C
#endif
}

// One row of kType · x.
template <DType kType>
float iq_row_dot(const uint8_t* row, int blocks, const Q8KVector& x) {
    constexpr IqShape kShape = iq_shape(kType);
    constexpr size_t kBlockBytes = block_bytes(kType);
    // Lane l of register r: columns 64r + 4l.., multiplier slot (64r + 4l) / 16.
    constexpr int kLanesPerSlot = kIqMultiplierCols / kLaneColumns;
    __m512i slot_picks[kIqRegisters];
    for (int r = 0; r < kIqRegisters; ++r) {
        alignas(64) int32_t picks[kLanes];
        for (int l = 0; l < kLanes; ++l)
            picks[l] = r * (kLanes / kLanesPerSlot) + l / kLanesPerSlot;
        slot_picks[r] = _mm512_load_si512(picks);
    }
    // The cache lines this far ahead are asked for as a block is read: the float matvec's
    // distance for the i-quants, twice that for the ternary types, whose kernels read two to
    // three times faster, so that their lines are needed sooner (on the Intel Xeon 1536 bytes,
    // against 768: decode 11-17% faster; on AMD, whose distance is 256, unmeasured).
    constexpr int kTernaryDistanceFactor = 2;
    const int prefetch_bytes = is_ternary_type(kType)
                                   ? kTernaryDistanceFactor * matvec_prefetch_bytes()
                                   : matvec_prefetch_bytes();
    __m512 sums = _mm512_setzero_ps();
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = row + size_t(b) * kBlockBytes;
        prefetch_ahead(block, prefetch_bytes, kBlockBytes);
        const int8_t* xb = x.values.data() + size_t(b) * kSuperBlock;
        const __m512i x_sums = _mm512_cvtepi16_epi32(_mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(x.sums.data() + size_t(b) * kIqMultipliers)));
        __m512i dots;
        if constexpr (has_multipliers(kType)) {
            const __m512i m = iq_multiplier_lanes<kType>(block);
            dots = _mm512_mullo_epi32(_mm512_mullo_epi32(m, x_sums),
                                      _mm512_set1_epi32(-kShape.offset));
            const __m512i m_words = _mm512_or_si512(m, _mm512_slli_epi32(m, kWordBits));
#pragma GCC unroll 4
            for (int r = 0; r < kIqRegisters; ++r) {
                const __m512i pairs = _mm512_maddubs_epi16(iq_levels<kType>(block, r),
                                                           _mm512_loadu_si512(xb + 64 * r));
                dots = _mm512_dpwssd_epi32(dots, pairs,
                                           _mm512_permutexvar_epi32(slot_picks[r], m_words));
            }
        } else {  // the ternary types: m = 1, the levels' dots added straight into the lanes
            dots = _mm512_mullo_epi32(x_sums, _mm512_set1_epi32(-kShape.offset));
#pragma GCC unroll 4
            for (int r = 0; r < kIqRegisters; ++r)
                dots = _mm512_dpbusd_epi32(dots, iq_levels<kType>(block, r),
                                           _mm512_loadu_si512(xb + 64 * r));
        }
        sums = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(dots),
            _mm512_set1_ps(x.d[b] * f16_to_float(iq_d_bits(kType, block)) * kShape.factor), sums);
    }
    return _mm512_reduce_add_ps(sums);
}

template <DType kType>
void iq_rows(float* out, const Matrix& w, const Q8KVector& x, int first_row, int row_count) {
    const int blocks = w.cols / kSuperBlock;
    for (int r = first_row; r < first_row + row_count; ++r)
        out[r] = iq_row_dot<kType>(w.row_data(r), blocks, x);
}

}  // namespace

void matvec_rows_iq(float* out, const Matrix& w, const Q8KVector& x, int first_row, int row_count) {
    with_iq_type(w.dtype, [&](auto type) { iq_rows<type()>(out, w, x, first_row, row_count); });
}

}  // namespace barellm::cpu::avx512
