// How many threads a kernel's work is worth (cpu/kernels.h).
#include <omp.h>

#include <algorithm>

#include "cpu/kernels.h"

namespace barellm::cpu {

int threads_for(size_t work) {
    return int(
        std::max<size_t>(1, std::min<size_t>(omp_get_max_threads(), work / kMinWorkPerThread)));
}

void for_each_row(int rows, size_t row_work, const std::function<void(int)>& work) {
#pragma omp parallel for schedule(static) num_threads(threads_for(size_t(rows) * row_work))
    for (int r = 0; r < rows; ++r) work(r);
}

}  // namespace barellm::cpu
