// The prefill GEMM on AVX2 + AVX-VNNI for Q8 and Q4 weights: the panels and micro-kernel of
// gemm_quantized_panels.h on the 256-bit vpdpbusd.
#ifdef BARELLM_SIMDE
#include "simde_avx512.h"  // tests/simde/: SIMDe's AVX2, and vpdpbusd
#else
#include <immintrin.h>
#endif

#include "cpu/avx2/avxvnni.h"
#include "cpu/avx2/gemm_quantized_panels.h"

namespace barellm::cpu::avxvnni {

static_assert(kQuantizedRowTile == cpu::kQuantizedRowTile &&
              kQuantizedTokenTile == cpu::kQuantizedTokenTile);

void gemm_rows_quantized(float* out, const Matrix& w, const QuantizedBatch& x, int first_row,
                         int row_count) {
    if (w.dtype == DType::Q8_0)
        gemm_rows_typed<DType::Q8_0, GroupDot::Vnni>(out, w, x, first_row, row_count);
    else
        gemm_rows_typed<DType::Q4_0, GroupDot::Vnni>(out, w, x, first_row, row_count);
}

}  // namespace barellm::cpu::avxvnni
