// x quantized to Q8 a token at a time for the integer prefill GEMMs of the AVX2 level (the
// block types' on AVX2 and AVX-VNNI, gemm_blocks_panels.h; Q8 and Q4 with AVX-VNNI,
// gemm_quantized_avxvnni.cpp): each group of 32 exactly as quantize_q8, into a QuantizedBatch
// with each group's start (−128 × Σ values, for AVX-VNNI's unsigned weights) and its sums of
// 16 (the block types' offsets and mins).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "cpu/avx2/avx2.h"
#include "cpu/avx2/helpers_avx2.h"

namespace barellm::cpu::avx2 {

namespace {

constexpr int kGroup = kQ8Group;
constexpr int kUnsignedOffset = 128;  // AVX-VNNI's stored weight = value + 128

}  // namespace

void quantize_token(QuantizedBatch* x, const float* x_row, int cols, int token) {
    constexpr int kRegisters = kGroup / kLanes;  // registers of one group: 4
    int8_t* values = x->values.data() + size_t(token) * x->padded_cols;
    float* scales = x->scales.data() + size_t(token) * x->groups;
    int32_t* starts = x->starts.data() + size_t(token) * x->groups;
    int32_t* half_sums = x->half_sums.data() + size_t(token) * x->groups * 2;
    const __m256 sign_bit = _mm256_set1_ps(-0.0f);
    // A short last group is read through a copy padded with zeros.
    alignas(32) float tail[kGroup];
    const auto group_values = [&](int g) {
        const int first = g * kGroup, count = std::min(kGroup, cols - first);
        if (count == kGroup) return x_row + first;
        std::fill(std::copy_n(x_row + first, count, tail), tail + kGroup, 0.0f);
        return static_cast<const float*>(tail);
    };
    const __m256i byte_largest = _mm256_set1_epi32(INT8_MAX);
    const __m256i byte_smallest = _mm256_set1_epi32(INT8_MIN);
    // Eight groups at a time: their largest |x|, their scales and multipliers, their values.
    for (int first_group = 0; first_group < x->groups; first_group += kLanes) {
        const int count = std::min(kLanes, x->groups - first_group);
        float largest[kLanes], multipliers[kLanes];
        for (int j = 0; j < count; ++j) {
            const float* group = group_values(first_group + j);
            __m256 group_largest = _mm256_setzero_ps();
            for (int r = 0; r < kRegisters; ++r)
                group_largest = _mm256_max_ps(
                    group_largest, _mm256_andnot_ps(sign_bit, _mm256_loadu_ps(group + r * kLanes)));
            largest[j] = horizontal_max(group_largest);
        }
        q8_group_scales(largest, count, scales + first_group, multipliers);
        for (int j = 0; j < count; ++j) {
            const int g = first_group + j;
            const float* group = group_values(g);
            const __m256 multiplier = _mm256_set1_ps(multipliers[j]);
            // cvtps2dq rounds to the nearest integer, ties to even (the default MXCSR mode).
            // |q| ≤ 127 for finite x; a NaN or infinity converts to INT32_MIN, clamped here to
            // the byte the packs saturate it to, so that the sums below are the stored bytes'.
            __m256i q[kRegisters];
            for (int r = 0; r < kRegisters; ++r)
                q[r] = _mm256_max_epi32(
                    _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(
                                         _mm256_loadu_ps(group + r * kLanes), multiplier)),
                                     byte_largest),
                    byte_smallest);
            // int32 -> int8. The packs work within 128-bit halves:
            // their word k (four bytes) holds the first (k < 4) or second half of q[k % 4].
            const __m256i bytes =
                _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256(
                reinterpret_cast<__m256i*>(values + g * kGroup),
                _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
            half_sums[2 * g] = horizontal_sum(_mm256_add_epi32(q[0], q[1]));
            half_sums[2 * g + 1] = horizontal_sum(_mm256_add_epi32(q[2], q[3]));
            starts[g] = -kUnsignedOffset * (half_sums[2 * g] + half_sums[2 * g + 1]);
        }
    }
}

}  // namespace barellm::cpu::avx2
