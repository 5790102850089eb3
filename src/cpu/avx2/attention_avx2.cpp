// Attention on AVX2 + FMA + F16C. Decode: a query head's dot with a key row, the softmax of
// its scores and the weighted sum of value rows. Prefill: two small GEMMs per KV head, on the GEMM
// micro-kernel.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/attention_rows.h"
#include "cpu/avx2/avx2.h"
#include "cpu/avx2/helpers_avx2.h"
#include "kv_cache.h"

namespace barellm::cpu::avx2 {

namespace {

inline float horizontal_max(__m256 v) {
    const __m128 halves = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 pairs = _mm_max_ps(halves, _mm_movehl_ps(halves, halves));
    return _mm_cvtss_f32(_mm_max_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}

// row[begin, end) = exp(row - max) in place; returns their sum, plus exp(sink - max) where the
// row has a sink logit (attention sinks; -inf: none), max being over the row and the sink.
float exp_in_place(float* row, int begin, int end, float sink) {
    __m256 largest = _mm256_set1_ps(sink);
    int i = begin;
    for (; i + kLanes <= end; i += kLanes)
        largest = _mm256_max_ps(largest, _mm256_loadu_ps(row + i));
    float max_value = horizontal_max(largest);
    for (; i < end; ++i) max_value = std::max(max_value, row[i]);
    const __m256 max_vector = _mm256_set1_ps(max_value);
    __m256 sum = _mm256_setzero_ps();
    for (i = begin; i + kLanes <= end; i += kLanes) {
        const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(row + i), max_vector));
        _mm256_storeu_ps(row + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    float total = horizontal_sum(sum);
    for (; i < end; ++i) total += (row[i] = std::exp(row[i] - max_value));
    return total + std::exp(sink - max_value);
}

}  // namespace

// ==================================================================== Decode

// q · one cache row of n elements.
float dot_kv(const float* q, const void* keys, int n, KvType type) {
    const int vector_n = n - n % kLanes;
    __m256 sum = _mm256_setzero_ps();
    float total = 0.0f;
    if (type == KvType::F32) {
        const float* k = static_cast<const float*>(keys);
        for (int i = 0; i < vector_n; i += kLanes)
            sum = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), sum);
        for (int i = vector_n; i < n; ++i) total += q[i] * k[i];
    } else {
        const uint16_t* k = static_cast<const uint16_t*>(keys);
        for (int i = 0; i < vector_n; i += kLanes)
            sum = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k + i, DType::F16), sum);
        for (int i = vector_n; i < n; ++i) total += q[i] * half_to_float(k[i]);
    }
    return total + horizontal_sum(sum);
}

// out += scale · one cache row of n elements.
void add_scaled_kv(float* out, float scale, const void* values, int n, KvType type) {
    const int vector_n = n - n % kLanes;
    const __m256 scale_vector = _mm256_set1_ps(scale);
    if (type == KvType::F32) {
        const float* v = static_cast<const float*>(values);
        for (int i = 0; i < vector_n; i += kLanes)
            _mm256_storeu_ps(out + i, _mm256_fmadd_ps(scale_vector, _mm256_loadu_ps(v + i),
                                                      _mm256_loadu_ps(out + i)));
        for (int i = vector_n; i < n; ++i) out[i] += scale * v[i];
    } else {
        const uint16_t* v = static_cast<const uint16_t*>(values);
        for (int i = 0; i < vector_n; i += kLanes)
            _mm256_storeu_ps(out + i, _mm256_fmadd_ps(scale_vector, load8(v + i, DType::F16),
                                                      _mm256_loadu_ps(out + i)));
        for (int i = vector_n; i < n; ++i) out[i] += scale * half_to_float(v[i]);
    }
}

void softmax(float* x, int n, float sink) {
    const float inverse_sum = 1.0f / exp_in_place(x, 0, n, sink);
    const __m256 inverse_sum_vector = _mm256_set1_ps(inverse_sum);
    int i = 0;
    for (; i + kLanes <= n; i += kLanes)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inverse_sum_vector));
    for (; i < n; ++i) x[i] *= inverse_sum;
}

// ==================================================================== Prefill
//
// For one KV head, the batch's queries that read it attend through two small GEMMs:
// - rows: count tokens × group heads; row ρ is token ρ / group, query head
//   kv_head · group + ρ % group;
// - scores = Q·Kᵀ × shape.scale, the keys transposed into tiles of 16 keys (the GEMM's
//   "tokens");
// - a causal softmax per row;
// - out = P·V, the values cut into tiles of 16 columns.
// Keys and values are converted to f32 once per KV head and shared by all rows.

namespace {

int head_dim_tile_count(int head_dim) { return (head_dim + kTokenTile - 1) / kTokenTile; }

// out[n] = one KV-cache row as f32.
void load_kv_row(float* out, const uint8_t* row, int n, KvType type) {
    if (type == KvType::F32) {
        std::copy_n(reinterpret_cast<const float*>(row), n, out);
        return;
    }
    const uint16_t* halves = reinterpret_cast<const uint16_t*>(row);
    int i = 0;
    for (; i + kLanes <= n; i += kLanes) _mm256_storeu_ps(out + i, load8(halves + i, DType::F16));
    for (; i < n; ++i) out[i] = half_to_float(halves[i]);
}

}  // namespace

int kv_tile_count(int keys) { return (keys + kTokenTile - 1) / kTokenTile; }

size_t kv_tiles_floats(int keys, int head_dim) {
    const size_t padded_keys = size_t(kv_tile_count(keys)) * kTokenTile;
    return padded_keys * head_dim + head_dim_tile_count(head_dim) * padded_keys * kTokenTile +
           kLanes;
}

KvTiles kv_tiles(float* storage, int first_key, int keys, int head_dim) {
    KvTiles tiles;
    tiles.first_key = first_key;
    tiles.keys = keys;
    tiles.padded_keys = kv_tile_count(keys) * kTokenTile;
    tiles.key_tiles = align32(storage);
    tiles.value_tiles = tiles.key_tiles + size_t(tiles.padded_keys) * head_dim;
    return tiles;
}

void pack_kv_tile(const KvTiles& tiles, const void* key_cache, const void* value_cache, int kv_head,
                  int tile, const AttentionShape& shape, KvType type) {
    const int head_dim = shape.head_dim;
    const size_t element = type == KvType::F32 ? sizeof(float) : sizeof(uint16_t);
    const size_t row_bytes = size_t(shape.kv_heads) * head_dim * element;
    const size_t head_offset = size_t(kv_head) * head_dim * element;
    float* key_tile = tiles.key_tiles + size_t(tile) * head_dim * kTokenTile;
    static thread_local std::vector<float> key, value;  // one key and value row as f32
    key.resize(head_dim);
    value.resize(head_dim);
    for (int t = 0; t < kTokenTile; ++t) {
        const int k = tile * kTokenTile + t;  // key index, from first_key
        std::fill(key.begin(), key.end(), 0.0f);
        std::fill(value.begin(), value.end(), 0.0f);
        if (k < tiles.keys) {
            const size_t offset = size_t(tiles.first_key + k) * row_bytes + head_offset;
            load_kv_row(key.data(), static_cast<const uint8_t*>(key_cache) + offset, head_dim,
                        type);
            load_kv_row(value.data(), static_cast<const uint8_t*>(value_cache) + offset, head_dim,
                        type);
        }
        for (int d = 0; d < head_dim; ++d) key_tile[d * kTokenTile + t] = key[d];
        for (int column_tile = 0; column_tile < head_dim_tile_count(head_dim); ++column_tile) {
            float* dest =
                tiles.value_tiles + (size_t(column_tile) * tiles.padded_keys + k) * kTokenTile;
            for (int c = 0; c < kTokenTile; ++c) {
                const int d = column_tile * kTokenTile + c;
                dest[c] = d < head_dim ? value[d] : 0.0f;
            }
        }
    }
}

size_t attention_scratch_floats(int keys, int head_dim) {
    return size_t(kRowTile) * (head_dim + kv_tile_count(keys) * kTokenTile + kTokenTile) +
           2 * kLanes;
}

void attention_rows(float* out, const float* q, int first_row, int rows, int first_pos, int kv_head,
                    const KvTiles& tiles, const AttentionShape& shape, float* scratch) {
    const int head_dim = shape.head_dim;
    // scratch: sums [kRowTile, 16] | scores [kRowTile, padded_keys] | queries [kRowTile, head_dim]
    float* sums = align32(scratch);
    float* scores = sums + kRowTile * kTokenTile;
    float* queries = scores + size_t(kRowTile) * tiles.padded_keys;
    int begin[kRowTile] = {}, end[kRowTile] = {};  // each row's keys, from first_key
    float* out_rows[kRowTile];
    float sinks[kRowTile];
    gather_query_rows(q, out, first_row, rows, first_pos, kv_head, tiles.first_key, shape, begin,
                      end, out_rows, queries, sinks);
    const int first_tile = *std::min_element(begin, begin + rows) / kTokenTile;
    const int end_tile = kv_tile_count(*std::max_element(end, end + rows));
    const OuterProductKernel kernel = outer_product_kernel_for(rows);

    // scores[r][k] = q_r · key_k × shape.scale, for the key tiles the rows reach.
    for (int tile = first_tile; tile < end_tile; ++tile) {
        std::fill(sums, sums + kRowTile * kTokenTile, 0.0f);
        kernel(sums, queries, head_dim, tiles.key_tiles + size_t(tile) * head_dim * kTokenTile,
               head_dim);
        for (int r = 0; r < rows; ++r)
            std::copy_n(sums + r * kTokenTile, kTokenTile,
                        scores + size_t(r) * tiles.padded_keys + tile * kTokenTile);
    }
    // Causal softmax (the scores soft-capped first where the shape says): exp over each row's
    // keys, zero around them; normalised at the end (by a sum holding the sink's share, if any).
    const int key_begin = first_tile * kTokenTile, key_end = end_tile * kTokenTile;
    float inverse_sums[kRowTile];
    for (int r = 0; r < rows; ++r) {
        float* row = scores + size_t(r) * tiles.padded_keys;
        if (shape.softcap > 0) softcap(row + begin[r], end[r] - begin[r], shape.softcap);
        inverse_sums[r] = 1.0f / exp_in_place(row, begin[r], end[r], sinks[r]);
        std::fill(row + key_begin, row + begin[r], 0.0f);
        std::fill(row + end[r], row + key_end, 0.0f);
    }
    // out_r = Σ_k p_rk · value_k, 16 columns at a time.
    for (int column_tile = 0; column_tile < head_dim_tile_count(head_dim); ++column_tile) {
        std::fill(sums, sums + kRowTile * kTokenTile, 0.0f);
        kernel(
            sums, scores + key_begin, tiles.padded_keys,
            tiles.value_tiles + (size_t(column_tile) * tiles.padded_keys + key_begin) * kTokenTile,
            key_end - key_begin);
        const int columns = std::min(kTokenTile, head_dim - column_tile * kTokenTile);
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < columns; ++c)
                out_rows[r][column_tile * kTokenTile + c] =
                    sums[r * kTokenTile + c] * inverse_sums[r];
    }
}

}  // namespace barellm::cpu::avx2
