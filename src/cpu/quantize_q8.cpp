// x quantized to Q8 for the integer dot products of the Q8 and Q4 kernels (cpu/kernels.h):
// the buffers; quantize_q8, the scalar quantizer that the AVX2 matvecs use and that
// avx512::quantize_q8 matches exactly; and order_q4_pairs, the values reordered for the AVX2
// Q4 matvec.
#include <algorithm>
#include <cmath>

#include "cpu/kernels.h"

namespace barellm::cpu {

void resize_quantized_vector(QuantizedVector* x, int n) {
    const int groups = (n + kQ8Group - 1) / kQ8Group;
    x->values.resize(n);
    x->scales.resize(groups);
    x->group_sums.resize(groups);
    x->q4_pair_values.resize(n);
}

void order_q4_pairs(QuantizedVector* x) {
    constexpr int kHalf = kQ8Group / 2, kPair = 2 * kQ8Group;
    const int n = int(x->values.size()), paired = n / kPair * kPair;
    const int8_t* values = x->values.data();
    int8_t* ordered = x->q4_pair_values.data();
    for (int first = 0; first < paired; first += kPair) {
        const int8_t* g = values + first;
        const int8_t* next = g + kQ8Group;
        int8_t* out = ordered + first;
        std::copy_n(g, kHalf, out);
        std::copy_n(next, kHalf, out + kHalf);
        std::copy_n(g + kHalf, kHalf, out + 2 * kHalf);
        std::copy_n(next + kHalf, kHalf, out + 3 * kHalf);
    }
    std::copy(values + paired, values + n, ordered + paired);
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
    order_q4_pairs(out);
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
