// x quantized per super-block of 256 as llama.cpp's Q8_K (cpu/kernels.h, Q8KVector) for the
// integer dot products of the Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS matvecs: the scalar quantizer,
// which the SIMD levels' (avx2::quantize_q8_k, avx512::quantize_q8_k) match byte for byte; and the
// same x laid out for their prefill GEMMs (store_q8_k_token).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/kernels.h"
#include "weights/weight_blocks.h"

namespace barellm::cpu {

namespace {

constexpr float kQ8KLargest = 127.0f;  // |values| ≤ 127

}  // namespace

void resize_q8_k_vector(Q8KVector* x, int n) {
    x->d.resize(n / kSuperBlock);
    x->values.resize(n);
    x->sums.resize(n / kQ6SubBlock);
}

void quantize_q8_k(Q8KVector* out, const float* x, int n) {
    resize_q8_k_vector(out, n);
    for (int b = 0; b < n / kSuperBlock; ++b) {
        const float* block = x + size_t(b) * kSuperBlock;
        int8_t* values = out->values.data() + size_t(b) * kSuperBlock;
        float largest = 0.0f;  // the first value of largest magnitude, sign kept
        for (int i = 0; i < kSuperBlock; ++i)
            if (std::fabs(block[i]) > std::fabs(largest)) largest = block[i];
        if (largest == 0.0f) {
            out->d[b] = 0.0f;
            std::fill(values, values + kSuperBlock, int8_t(0));
        } else {
            const float inverse = -kQ8KLargest / largest;
            for (int i = 0; i < kSuperBlock; ++i)
                values[i] = int8_t(std::min(127, round_to_nearest_even(inverse * block[i])));
            out->d[b] = 1.0f / inverse;
        }
        for (int s = 0; s < kSuperBlock / kQ6SubBlock; ++s) {
            int sum = 0;
            for (int i = 0; i < kQ6SubBlock; ++i) sum += values[s * kQ6SubBlock + i];
            out->sums[size_t(b) * (kSuperBlock / kQ6SubBlock) + s] = int16_t(sum);
        }
    }
}

void store_q8_k_token(QuantizedBatch* x, const Q8KVector& q8_k, int token) {
    constexpr int kGroupsPerSuperBlock = kSuperBlock / kQ8Group;
    constexpr int kHalvesPerGroup = kQ8Group / kQ6SubBlock;
    const int cols = int(q8_k.values.size());
    std::memcpy(x->values.data() + size_t(token) * x->padded_cols, q8_k.values.data(), cols);
    float* scales = x->scales.data() + size_t(token) * x->groups;
    int32_t* half_sums = x->half_sums.data() + size_t(token) * x->groups * kHalvesPerGroup;
    for (int g = 0; g < cols / kQ8Group; ++g) {
        scales[g] = q8_k.d[g / kGroupsPerSuperBlock];
        for (int h = 0; h < kHalvesPerGroup; ++h)
            half_sums[kHalvesPerGroup * g + h] = q8_k.sums[size_t(kHalvesPerGroup) * g + h];
    }
}

}  // namespace barellm::cpu
