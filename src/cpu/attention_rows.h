// The first step of the AVX2 and AVX-512 prefill attention (attention_avx2.cpp,
// attention_avx512.cpp), which is the same for both: where each query row of a block reads
// and writes. In an unnamed namespace, so that each of those files compiles its own copy for
// its own instruction set (one shared copy could carry AVX-512 instructions into the AVX2
// path).
#pragma once
#include <cmath>
#include <cstddef>

#include "kv_cache.h"

namespace barellm::cpu {

namespace {

// The query rows first_row .. first_row + rows of KV head kv_head, token-major (row ρ is
// token ρ / group, query head kv_head · group + ρ % group), for queries q [count, heads *
// head_dim] at positions first_pos..: row r attends to keys [begin[r], end[r]) counted from
// the cache row first_key, writes out_rows[r] (in out, shaped like q), its query times
// shape.scale is queries[r · head_dim ..], and its head's sink logit sinks[r] (-inf: none).
inline void gather_query_rows(const float* q, float* out, int first_row, int rows, int first_pos,
                              int kv_head, int first_key, const AttentionShape& shape, int* begin,
                              int* end, float** out_rows, float* queries, float* sinks) {
    const int head_dim = shape.head_dim, group = shape.heads / shape.kv_heads;
    const size_t q_dim = size_t(shape.heads) * head_dim;
    for (int r = 0; r < rows; ++r) {
        const int token = (first_row + r) / group;
        const int head = kv_head * group + (first_row + r) % group;
        const int pos = first_pos + token;
        begin[r] = attention_start(pos, shape.window) - first_key;
        end[r] = pos + 1 - first_key;
        const float* query = q + token * q_dim + size_t(head) * head_dim;
        for (int d = 0; d < head_dim; ++d) queries[r * head_dim + d] = query[d] * shape.scale;
        out_rows[r] = out + token * q_dim + size_t(head) * head_dim;
        sinks[r] = shape.sinks ? shape.sinks[head] : -INFINITY;
    }
}

}  // namespace

}  // namespace barellm::cpu
