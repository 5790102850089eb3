// The scalar path of the CPU kernels, private to src/cpu/: the readable reference of each
// SIMD kernel, also run on CPUs without AVX2. Defined in cpu/scalar.cpp.
#pragma once
#include "cpu/kernels.h"
#include "half.h"

namespace barellm::cpu::scalar {

// Weight (row, col) of w as float, whatever its storage.
inline float weight_at(const Matrix& w, int row, int col) {
    const size_t i = size_t(row) * w.cols + col;
    switch (w.dtype) {
        case DType::F32:
            return static_cast<const float*>(w.data)[i];
        case DType::F16:
            return half_to_float(static_cast<const uint16_t*>(w.data)[i]);
        case DType::BF16:
            return bf16_to_float(static_cast<const uint16_t*>(w.data)[i]);
        case DType::Q8_0:
            return static_cast<const int8_t*>(w.data)[i] *
                   half_to_float(w.scales[size_t(row) * w.q8_groups() + col / kQ8Group]);
        case DType::Q4_0:
            return q4_value(static_cast<const uint8_t*>(w.data) + row * w.row_bytes(), col) *
                   half_to_float(w.scales[size_t(row) * w.q4_blocks() + col / kQ4Block]);
    }
    return 0.0f;
}

void matvec_rows(float* out, const Matrix& w, const float* x, int first_row, int row_count);
void gemm_rows(float* out, const Matrix& w, const float* x, int batch, int first_row,
               int row_count);
float dot_kv(const float* q, const void* keys, int n, KvType type);
void add_scaled_kv(float* out, float scale, const void* values, int n, KvType type);
void softmax(float* x, int n);
void swiglu(float* gate, const float* up, int n);
void rmsnorm(float* out, const float* x, const float* weight, int n, float eps);

}  // namespace barellm::cpu::scalar
