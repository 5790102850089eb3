// A prefill batch's routes grouped by expert, on the host (the routes route_tokens_kernel picked,
// copied back), so that CudaBackend's prefill runs each expert once, a GEMM over its rows:
// gather_rows_kernel (prefill.cuh) copies each grouped row's token in, and moe_combine_kernel
// (moe.cuh), given each route's grouped row, adds the experts' rows back into x, weighted.
#pragma once
#include <string>
#include <vector>

#include "util/error.h"

namespace barellm::cuda {

// chosen[r] is route r's expert (route r = token r / k's (r % k)-th, r < routes). Grouped rows
// hold expert 0's routes first, then expert 1's, ..., each expert's in route order (so in token
// order). Writes grouped_row[r] (route r's grouped row) and token_of_row[g] (grouped row g's
// token), and returns the first grouped row of each expert, then routes (experts + 1 values):
// expert e takes grouped rows start[e] .. start[e + 1] - 1, none where they are equal.
inline std::vector<int> group_routes_by_expert(const int* chosen, int routes, int k, int experts,
                                               int* grouped_row, int* token_of_row) {
    std::vector<int> start(size_t(experts) + 1, 0);
    for (int r = 0; r < routes; ++r) {
        if (chosen[r] < 0 || chosen[r] >= experts)
            throw Error("group_routes_by_expert: expert " + std::to_string(chosen[r]) + " of " +
                        std::to_string(experts));
        ++start[size_t(chosen[r]) + 1];
    }
    for (int e = 0; e < experts; ++e) start[size_t(e) + 1] += start[size_t(e)];
    std::vector<int> next(start.begin(), start.end() - 1);
    for (int r = 0; r < routes; ++r) {
        const int row = next[size_t(chosen[r])]++;
        grouped_row[r] = row;
        token_of_row[row] = r / k;
    }
    return start;
}

}  // namespace barellm::cuda
