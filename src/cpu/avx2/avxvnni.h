// The AVX-VNNI part of the AVX2 path, private to src/cpu/: the functions of the
// *_avxvnni.cpp files, which the dispatch in cpu/dispatch.cpp calls when simd_level() is Avx2
// and the CPU has AVX-VNNI (the 256-bit vpdpbusd of Intel's client CPUs from Alder Lake on,
// which lack AVX-512; cpu_has_avx_vnni).
//
// As cpu/avx512/avx512.h, the unit tests include this header a second time with the name avxvnni
// defined as avxvnni_simde, for the SIMDe build of those files (hence no include guard).
#include <cstddef>
#include <cstdint>

#include "cpu/kernels.h"

namespace barellm::cpu::avxvnni {

// ---- Decode matvecs for Q8, Q4, and IQ4_NL and MXFP4 (lookup_blocks) weights read from their
// tiles (Matrix::row_tiles, cpu/quantized_tiles.h), x quantized by quantize_q8
// (matvec_quantized_avxvnni.cpp): out[r] = W[r] · x for each row r of the run.
void matvec_rows_q8(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                    int row_count);
void matvec_rows_q4(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                    int row_count);
void matvec_rows_lookup_blocks(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                               int row_count);

// ---- The decode matvec for TQ1_0 weights read from their rows, x quantized per 256 as Q8_K
// (cpu::quantize_q8_k; matvec_tq1_0_avxvnni.cpp): avx2::matvec_rows_iq for TQ1_0, each
// super-block's int32 dot taken by vpdpbusd on the trits' bytes without unpacking them.
void matvec_rows_tq1_0(float* out, const Matrix& w, const Q8KVector& x, int first_row,
                       int row_count);

// ---- The GEMM for Q8 and Q4 weights (gemm_quantized_avxvnni.cpp), for a server step's few
// tokens and a prompt's many, in two steps, as the AVX-512 VNNI one:
// - x [batch, cols] is quantized to Q8 a token at a time (avx2::quantize_token, exactly as
//   quantize_q8 does) into a QuantizedBatch (resize_quantized_batch) the threads share;
// - then any run of weight rows, read from their tiles (or from the rows where w has none), is
//   computed from it (gemm_rows_quantized, out [batch, w.rows]), each group's dot product in
//   int32; a token's sums are the bits of the matvec above.

constexpr int kQuantizedRowTile = 16;   // weight rows packed and computed together: two registers
constexpr int kQuantizedTokenTile = 3;  // tokens per micro-kernel call

void gemm_rows_quantized(float* out, const Matrix& w, const QuantizedBatch& x, int first_row,
                         int row_count);

// ---- The prefill GEMM of the block types (gemm_blocks_avxvnni.cpp): avx2::gemm_rows_blocks
// (avx2.h) on vpdpbusd: the same QuantizedBatch, tiles of avx2::kBlockRowTile rows, the same
// results.
void gemm_rows_blocks(float* out, const Matrix& w, const QuantizedBatch& x, int first_row,
                      int row_count);

}  // namespace barellm::cpu::avxvnni
