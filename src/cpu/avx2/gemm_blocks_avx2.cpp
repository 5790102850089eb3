// The prefill GEMM of the block types on plain AVX2 (no VNNI, e.g. AMD Zen 3): the panels and
// micro-kernel of gemm_blocks_panels.h, each sub-block's dot on vpmaddubsw and vpmaddwd.
#include <immintrin.h>

#include "cpu/avx2/avx2.h"
#include "cpu/avx2/gemm_blocks_panels.h"

namespace barellm::cpu::avx2 {

void gemm_rows_blocks(float* out, const Matrix& w, const QuantizedBatch& x, int first_row,
                      int row_count) {
    gemm_rows_blocks_on<BlockDot::Maddubs>(out, w, x, first_row, row_count);
}

}  // namespace barellm::cpu::avx2
