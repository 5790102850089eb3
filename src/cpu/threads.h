// How the dispatch (cpu/dispatch.cpp) splits the rows of a kernel across the threads of a
// parallel region, private to src/cpu/. How many threads a call is worth: threads_for
// (cpu/kernels.h).
#pragma once
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "cpu/kernels.h"

namespace barellm::cpu {

// Calls work(first, count) on each OpenMP thread with its own contiguous run of the
// `rows` rows; `row_work` is the multiply-adds of one row.
template <typename Work>
void split_rows(int rows, size_t row_work, Work work) {
#pragma omp parallel num_threads(threads_for(rows* row_work))
    {
        const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
        const int first = int(rows * thread / threads);
        const int last = int(rows * (thread + 1) / threads);
        if (last > first) work(first, last - first);
    }
}

// The rows a thread claims next when `rows_left` rows of the GEMMs remain: whole blocks
// while there is plenty, then ever smaller runs (whole tiles), so that no thread is left
// with a long one while the others wait.
inline int chunk_rows(int rows_left, int threads, int tile, int block) {
    const int share = (rows_left / (2 * threads) + tile - 1) / tile;
    return std::clamp(share * tile, tile, block);
}

// Run by every thread of a parallel region: claims runs of the rows of all outputs, one
// matrix after another (next_row counts them), until none are left, and calls
// work(output, first_row, row_count) for each run cut at the boundaries between matrices.
template <typename Output, typename Work>
void claim_rows(std::initializer_list<Output> outputs, int total_rows, std::atomic<int>* next_row,
                int tile, int block, Work work) {
    const int threads = omp_get_num_threads();
    for (;;) {
        const int size = chunk_rows(total_rows - next_row->load(), threads, tile, block);
        const int first = next_row->fetch_add(size);
        if (first >= total_rows) break;
        const int last = std::min(total_rows, first + size);
        int matrix_start = 0;
        for (const Output& o : outputs) {
            const int begin = std::max(first, matrix_start);
            const int end = std::min(last, matrix_start + o.w->rows);
            if (begin < end) work(o, begin - matrix_start, end - begin);
            matrix_start += o.w->rows;
        }
    }
}

}  // namespace barellm::cpu
