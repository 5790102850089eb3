// The prefill GEMM of the block types on AVX2 + AVX-VNNI: the panels and micro-kernel of
// gemm_blocks_panels.h, each sub-block's dot on the 256-bit vpdpbusd. Its results are the plain
// AVX2 build's (gemm_blocks_avx2.cpp), bit for bit.
#include "cpu/avx2/avxvnni.h"
#include "cpu/avx2/gemm_blocks_panels.h"
#include "cpu/avx2/intrinsics_avx2.h"

namespace barellm::cpu::avxvnni {

void gemm_rows_blocks(float* out, const Matrix& w, const QuantizedBatch& x, int first_row,
                      int row_count) {
    avx2::gemm_rows_blocks_on<avx2::BlockDot::Vnni>(out, w, x, first_row, row_count);
}

}  // namespace barellm::cpu::avxvnni
