// The scalar path of the CPU kernels, private to src/cpu/: the readable reference of each
// SIMD kernel, also run on CPUs without AVX2. Defined in cpu/scalar.cpp.
#pragma once
#include "cpu/kernels.h"
#include "weights/half.h"

namespace barellm::cpu::scalar {

void matvec_rows(float* out, const Matrix& w, const float* x, int first_row, int row_count);
void gemm_rows(float* out, const Matrix& w, const float* x, int batch, int first_row,
               int row_count);
float dot_kv(const float* q, const void* keys, int n, KvType type);
void add_scaled_kv(float* out, float scale, const void* values, int n, KvType type);
void softmax(float* x, int n, float sink);
void swiglu(float* gate, const float* up, int n);
void geglu(float* gate, const float* up, int n);
void swiglu_oai(float* gate, const float* up, int n, float limit);
void softcap(float* x, int n, float cap);
void rmsnorm(float* out, const float* x, const float* weight, int n, float eps);

}  // namespace barellm::cpu::scalar
