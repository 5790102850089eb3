// The scalar path of the CPU kernels (cpu/scalar.h): the readable reference of each SIMD
// kernel, also run on CPUs without AVX2.
#include "cpu/scalar.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "weights/half.h"

namespace barellm::cpu {

namespace {

inline float kv_at(const void* cache, int i, KvType type) {
    return type == KvType::F32 ? static_cast<const float*>(cache)[i]
                               : half_to_float(static_cast<const uint16_t*>(cache)[i]);
}

}  // namespace

void scalar::matvec_rows(float* out, const Matrix& w, const float* x, int first_row,
                         int row_count) {
    std::vector<float> row(w.cols);
    for (int r = first_row; r < first_row + row_count; ++r) {
        matrix_row_to_float(row.data(), w, r);
        float sum = 0.0f;
        for (int i = 0; i < w.cols; ++i) sum += row[i] * x[i];
        out[r] = sum;
    }
}

void scalar::gemm_rows(float* out, const Matrix& w, const float* x, int batch, int first_row,
                       int row_count) {
    std::vector<float> row(w.cols);
    for (int r = first_row; r < first_row + row_count; ++r) {
        matrix_row_to_float(row.data(), w, r);
        for (int b = 0; b < batch; ++b) {
            const float* x_row = x + size_t(b) * w.cols;
            float sum = 0.0f;
            for (int i = 0; i < w.cols; ++i) sum += row[i] * x_row[i];
            out[size_t(b) * w.rows + r] = sum;
        }
    }
}

float scalar::dot_kv(const float* q, const void* keys, int n, KvType type) {
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) sum += q[i] * kv_at(keys, i, type);
    return sum;
}

void scalar::add_scaled_kv(float* out, float scale, const void* values, int n, KvType type) {
    for (int i = 0; i < n; ++i) out[i] += scale * kv_at(values, i, type);
}

void scalar::rmsnorm(float* out, const float* x, const float* weight, int n, float eps) {
    const float scale = rms_scale(x, n, sum_of_f32_squares(x, n), eps);
    for (int i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

void scalar::softmax(float* x, int n, float sink) {
    const float max_value = std::max(sink, *std::max_element(x, x + n));
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - max_value);
        sum += x[i];
    }
    sum += std::exp(sink - max_value);
    for (int i = 0; i < n; ++i) x[i] /= sum;
}

void scalar::swiglu(float* gate, const float* up, int n) {
    for (int i = 0; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void scalar::swiglu_oai(float* gate, const float* up, int n, float limit) {
    for (int i = 0; i < n; ++i) {
        const float g = std::min(gate[i], limit);
        const float u = std::clamp(up[i], -limit, limit);
        gate[i] = g / (1.0f + std::exp(-kSwigluOaiAlpha * g)) * (u + 1.0f);
    }
}

void scalar::geglu(float* gate, const float* up, int n) {
    const float sqrt_2_over_pi = 0.7978845608f;
    for (int i = 0; i < n; ++i) {
        const float g = gate[i];
        gate[i] =
            0.5f * g * (1.0f + std::tanh(sqrt_2_over_pi * (g + 0.044715f * g * g * g))) * up[i];
    }
}

void scalar::softcap(float* x, int n, float cap) {
    for (int i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

}  // namespace barellm::cpu
