// The AVX-512 path of the CPU kernels, private to src/cpu/: the functions of the
// *_avx512*.cpp files, which the dispatch in cpu/kernels.cpp calls when simd_level() is
// Avx512 (those in *_avx512vnni.cpp only when the CPU also has AVX512_VNNI).
//
// The unit tests build these files a second time on SIMDe (a portable implementation of the
// intrinsics, so that they run on any CPU) into the namespace avx512_simde: this header is
// then included again with BARELLM_AVX512_NAMESPACE naming that namespace.
#ifndef BARELLM_AVX512_NAMESPACE
#define BARELLM_AVX512_NAMESPACE avx512
#endif
#include <cstdint>

#include "cpu/kernels.h"

namespace barellm::cpu::BARELLM_AVX512_NAMESPACE {

// ---- Decode matvecs: out[r] = W[r] · x for each row r of the run.

// f32, f16 and bf16 weights (matmul_avx512.cpp).
void matmul_rows(float* out, const Matrix& w, const float* x, int first_row, int row_count);

// Q8 and Q4 weights against x quantized to Q8, as vpdpbusd integer dot products
// (matmul_avx512vnni.cpp).
void matmul_rows_q8(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                    int row_count);
void matmul_rows_q4(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                    int row_count);

// ---- The prefill GEMM for Q8 and Q4 weights (gemm_avx512vnni.cpp), in two steps:
// - x [batch, cols] is quantized to Q8 a token at a time (quantize_token, exactly as
//   quantize_q8 does), into a QuantizedBatch the threads share;
// - then any run of weight rows is computed from it (matmul_batch_rows_quantized,
//   out [batch, w.rows]), each group's dot product in int32 with vpdpbusd.

constexpr int kRowTile = 32;   // weight rows packed and computed together: two registers
constexpr int kTokenTile = 6;  // tokens per micro-kernel call

// Sizes x's buffers for `batch` tokens of `cols` columns.
void resize_quantized_batch(QuantizedBatch* x, int batch, int cols);
void quantize_token(QuantizedBatch* x, const float* x_row, int cols, int token);
void matmul_batch_rows_quantized(float* out, const Matrix& w, const QuantizedBatch& x,
                                 int first_row, int row_count);

}  // namespace barellm::cpu::BARELLM_AVX512_NAMESPACE
