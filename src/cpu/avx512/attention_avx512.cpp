// Attention on AVX-512. Decode: a query head's dot with a key row, and the weighted sum of
// value rows, 16 elements per instruction, the tail masked. Prefill: the design of the AVX2
// prefill attention (attention_avx2.cpp), two small GEMMs per KV head, on the AVX-512
// outer-product micro-kernel (12 query rows by two tiles of 16 a call). Both softmaxes on a
// vectorised e^x.
#include <algorithm>
#include <cmath>

#include "cpu/attention_rows.h"
#include "cpu/avx512/avx512.h"
#include "cpu/avx512/helpers_avx512.h"
#include "kv_cache.h"

namespace barellm::cpu::avx512 {

namespace {

// n cache elements at p (f32 or f16) from element i on, converted to f32; lanes outside
// `mask` are 0.
inline __m512 load_kv(const void* p, int i, KvType type, __mmask16 mask) {
    return type == KvType::F32 ? widen16<DType::F32>(static_cast<const float*>(p) + i, mask)
                               : widen16<DType::F16>(static_cast<const uint16_t*>(p) + i, mask);
}

// row[begin, end) = e^(row - max) in place; returns their sum, plus e^(sink - max) where the
// row has a sink logit (attention sinks; -inf: none), max being over the row and the sink.
float exp_in_place(float* row, int begin, int end, float sink) {
    __m512 largest = _mm512_set1_ps(sink);
    for (int i = begin; i < end; i += kLanes) {
        const __mmask16 mask = first_lanes(end - i);
        largest = _mm512_mask_max_ps(largest, mask, largest, _mm512_maskz_loadu_ps(mask, row + i));
    }
    const float max_value = _mm512_reduce_max_ps(largest);
    const __m512 max_vector = _mm512_set1_ps(max_value);
    __m512 sum = _mm512_setzero_ps();
    for (int i = begin; i < end; i += kLanes) {
        const __mmask16 mask = first_lanes(end - i);
        const __m512 e =
            exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, row + i), max_vector));
        _mm512_mask_storeu_ps(row + i, mask, e);
        sum = _mm512_mask_add_ps(sum, mask, sum, e);
    }
    return _mm512_reduce_add_ps(sum) + std::exp(sink - max_value);
}

int tiles_of_16(int n) { return (n + kTileFloats - 1) / kTileFloats; }

static_assert(kAttentionRowTile <= kOuterProductRows, "a block of rows is one kernel call");

}  // namespace

// ==================================================================== Decode

float dot_kv(const float* q, const void* keys, int n, KvType type) {
    __m512 sum = _mm512_setzero_ps();
    for (int i = 0; i < n; i += kLanes) {
        const __mmask16 mask = first_lanes(n - i);
        sum =
            _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, q + i), load_kv(keys, i, type, mask), sum);
    }
    return _mm512_reduce_add_ps(sum);
}

void add_scaled_kv(float* out, float scale, const void* values, int n, KvType type) {
    const __m512 scale_vector = _mm512_set1_ps(scale);
    for (int i = 0; i < n; i += kLanes) {
        const __mmask16 mask = first_lanes(n - i);
        _mm512_mask_storeu_ps(out + i, mask,
                              _mm512_fmadd_ps(scale_vector, load_kv(values, i, type, mask),
                                              _mm512_maskz_loadu_ps(mask, out + i)));
    }
}

void softmax(float* x, int n, float sink) {
    const __m512 inverse_sum = _mm512_set1_ps(1.0f / exp_in_place(x, 0, n, sink));
    for (int i = 0; i < n; i += kLanes) {
        const __mmask16 mask = first_lanes(n - i);
        _mm512_mask_storeu_ps(x + i, mask,
                              _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + i), inverse_sum));
    }
}

// ==================================================================== Prefill

size_t attention_scratch_floats(int keys, int head_dim) {
    const size_t padded_keys = size_t(tiles_of_16(keys)) * kTileFloats;
    return size_t(kAttentionRowTile) * (kOuterProductTiles * kTileFloats + padded_keys + head_dim) +
           kLanes;
}

void attention_rows(float* out, const float* q, int first_row, int rows, int first_pos, int kv_head,
                    const avx2::KvTiles& tiles, const AttentionShape& shape, float* scratch) {
    const int head_dim = shape.head_dim;
    // scratch: sums [2 tiles, kAttentionRowTile, 16] | scores [kAttentionRowTile,
    // padded_keys] | queries [kAttentionRowTile, head_dim]
    const size_t sums_tile_stride = size_t(kAttentionRowTile) * kTileFloats;
    float* sums = align64(scratch);
    float* scores = sums + kOuterProductTiles * sums_tile_stride;
    float* queries = scores + size_t(kAttentionRowTile) * tiles.padded_keys;
    // Each row's keys, from first_key.
    int begin[kAttentionRowTile] = {}, end[kAttentionRowTile] = {};
    float* out_rows[kAttentionRowTile];
    float sinks[kAttentionRowTile];
    gather_query_rows(q, out, first_row, rows, first_pos, kv_head, tiles.first_key, shape, begin,
                      end, out_rows, queries, sinks);
    const int first_tile = *std::min_element(begin, begin + rows) / kTileFloats;
    const int end_tile = tiles_of_16(*std::max_element(end, end + rows));

    // scores[r][k] = q_r · key_k × shape.scale, two tiles of 16 keys a call.
    const size_t key_tile_stride = size_t(head_dim) * kTileFloats;
    for (int tile = first_tile; tile < end_tile; tile += kOuterProductTiles) {
        const int tile_count = std::min(kOuterProductTiles, end_tile - tile);
        std::fill(sums, sums + tile_count * sums_tile_stride, 0.0f);
        outer_product_kernel_for(rows, tile_count)(sums, sums_tile_stride, queries, head_dim,
                                                   tiles.key_tiles + tile * key_tile_stride,
                                                   key_tile_stride, head_dim);
        for (int t = 0; t < tile_count; ++t)
            for (int r = 0; r < rows; ++r)
                _mm512_storeu_ps(scores + size_t(r) * tiles.padded_keys + (tile + t) * kTileFloats,
                                 _mm512_loadu_ps(sums + t * sums_tile_stride + r * kTileFloats));
    }
    // Causal softmax (the scores soft-capped first where the shape says): exp over each row's
    // keys, zero around them; normalised at the end (by a sum holding the sink's share, if any).
    const int key_begin = first_tile * kTileFloats, key_end = end_tile * kTileFloats;
    float inverse_sums[kAttentionRowTile];
    for (int r = 0; r < rows; ++r) {
        float* row = scores + size_t(r) * tiles.padded_keys;
        if (shape.softcap > 0) softcap(row + begin[r], end[r] - begin[r], shape.softcap);
        inverse_sums[r] = 1.0f / exp_in_place(row, begin[r], end[r], sinks[r]);
        std::fill(row + key_begin, row + begin[r], 0.0f);
        std::fill(row + end[r], row + key_end, 0.0f);
    }
    // out_r = Σ_k p_rk · value_k, two tiles of 16 columns a call.
    const size_t value_tile_stride = size_t(tiles.padded_keys) * kTileFloats;
    const int column_tiles = tiles_of_16(head_dim);
    for (int column_tile = 0; column_tile < column_tiles; column_tile += kOuterProductTiles) {
        const int tile_count = std::min(kOuterProductTiles, column_tiles - column_tile);
        std::fill(sums, sums + tile_count * sums_tile_stride, 0.0f);
        outer_product_kernel_for(rows, tile_count)(
            sums, sums_tile_stride, scores + key_begin, tiles.padded_keys,
            tiles.value_tiles + column_tile * value_tile_stride + size_t(key_begin) * kTileFloats,
            value_tile_stride, key_end - key_begin);
        for (int t = 0; t < tile_count; ++t) {
            const int first_column = (column_tile + t) * kTileFloats;
            const __mmask16 mask = first_lanes(head_dim - first_column);
            for (int r = 0; r < rows; ++r)
                _mm512_mask_storeu_ps(
                    out_rows[r] + first_column, mask,
                    _mm512_mul_ps(_mm512_loadu_ps(sums + t * sums_tile_stride + r * kTileFloats),
                                  _mm512_set1_ps(inverse_sums[r])));
        }
    }
}

}  // namespace barellm::cpu::avx512
