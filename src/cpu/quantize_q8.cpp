// x quantized to Q8 for the integer dot products of the Q8 and Q4 kernels (cpu/kernels.h):
// the buffers, and quantize_q8, the scalar quantizer that the AVX2 matvecs use and that
// avx512::quantize_q8 matches exactly.
#include <algorithm>
#include <cmath>

#include "cpu/kernels.h"

namespace barellm::cpu {

namespace {

// lround(v) (halves away from zero) for |v| ≤ 127: truncate, then step away from zero where
// the part cut off is at least a half (exact in f32), as the SIMD quantizers do; inline,
// where lround is a call into libm for each value.
inline int round_half_away(float v) {
    const int whole = int(v);
    const float fraction = v - float(whole);
    return whole + (fraction >= 0.5f) - (fraction <= -0.5f);
}

}  // namespace

void resize_quantized_vector(QuantizedVector* x, int n) {
    const int groups = (n + kQ8Group - 1) / kQ8Group;
    x->values.resize(n);
    x->scales.resize(groups);
    x->group_sums.resize(groups);
}

void quantize_q8(QuantizedVector* out, const float* x, int n) {
    resize_quantized_vector(out, n);
    for (int g = 0; g < int(out->scales.size()); ++g) {
        const int first = g * kQ8Group, last = std::min(n, first + kQ8Group);
        float largest = 0.0f;
        for (int i = first; i < last; ++i) largest = std::max(largest, std::fabs(x[i]));
        const float scale = largest / 127.0f;
        const float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
        out->scales[g] = scale;
        int sum = 0;
        for (int i = first; i < last; ++i) {
            out->values[i] = int8_t(round_half_away(x[i] * inverse));
            sum += out->values[i];
        }
        out->group_sums[g] = float(sum);
    }
}

void resize_quantized_batch(QuantizedBatch* x, int batch, int cols) {
    x->batch = batch;
    x->groups = (cols + kQ8Group - 1) / kQ8Group;
    x->padded_cols = x->groups * kQ8Group;
    x->values.resize(size_t(batch) * x->padded_cols);
    x->scales.resize(size_t(batch) * x->groups);
    x->starts.resize(size_t(batch) * x->groups);
    x->half_sums.resize(size_t(batch) * x->groups * 2);
}

}  // namespace barellm::cpu
