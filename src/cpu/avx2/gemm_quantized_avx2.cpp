// The prefill GEMM on plain AVX2 (no VNNI) for Q4 weights: the panels and micro-kernel of
// gemm_quantized_panels.h on vpmaddubsw, each group's nibble products summed exactly in int16.
#include <immintrin.h>

#include "cpu/avx2/avx2.h"
#include "cpu/avx2/gemm_quantized_panels.h"

namespace barellm::cpu::avx2 {

static_assert(kQuantizedRowTile == cpu::kQuantizedRowTile);

void gemm_rows_q4(float* out, const Matrix& w, const QuantizedBatch& x, int first_row,
                  int row_count) {
    gemm_rows_typed<DType::Q4_0, GroupDot::Maddubs>(out, w, x, first_row, row_count);
}

}  // namespace barellm::cpu::avx2
