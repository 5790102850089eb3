// x quantized to Q8 for the integer dot products of the Q8 and Q4 kernels (cpu/kernels.h):
// the buffers, and quantize_q8, the scalar quantizer that the AVX2 matvecs use and that
// avx512::quantize_q8 matches exactly.
#include <algorithm>
#include <cmath>

#include "cpu/kernels.h"

namespace barellm::cpu {

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
        const Q8GroupScale rule = q8_group_scale(largest);
        out->scales[g] = rule.scale;
        int sum = 0;
        for (int i = first; i < last; ++i) {
            out->values[i] = int8_t(round_to_nearest_even(x[i] * rule.multiplier));
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
