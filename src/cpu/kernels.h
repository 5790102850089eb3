// CPU kernels: each has a plain scalar version (the readable reference the tests
// compare against) and, where it matters for speed, an AVX2/FMA/F16C version in
// cpu/kernels_avx2.cpp. `matmul` and `attention` pick the path set by set_simd_level.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "kv_cache.h"
#include "model.h"

namespace barellm::cpu {

enum class SimdLevel { Scalar, Avx2 };

// The best level this CPU runs; `missing` (if given) names the features it lacks for AVX2.
SimdLevel detect_simd_level(std::string* missing = nullptr);
void set_simd_level(SimdLevel level);
SimdLevel simd_level();
const char* simd_level_name(SimdLevel level);

// Threads worth using for `work` multiply-adds: at most OpenMP's, at least one.
int threads_for(size_t work);

// Calls work(r) for each of `rows` independent rows of `row_work` multiply-adds each,
// split across threads when that is worth it.
void for_each_row(int rows, size_t row_work, const std::function<void(int)>& work);

// out[rows] = W[rows, cols] · x[cols]; rows split across OpenMP threads. With AVX2 and
// Q8 weights, x is first quantized to Q8 and the dot products are integer.
void matmul(float* out, const float* x, const Matrix& w);

// Several independent matmuls (e.g. q, k and v of one input) in one parallel region:
// their rows, one after another, are split across the threads (at most 4 tasks).
struct MatmulTask {
    float* out;
    const float* x;
    const Matrix* w;
};
void matmul_many(std::initializer_list<MatmulTask> tasks);

// A vector quantized like a Q8 weight row: x[i] ≈ values[i] × scales[i / kQ8Group],
// with scale = max |x| / 127 over each group.
struct QuantizedVector {
    std::vector<int8_t> values;  // [n]
    std::vector<float> scales;   // [ceil(n / kQ8Group)]
};
void quantize_q8(QuantizedVector* out, const float* x, int n);

// Prefill: out[batch, rows] = x[batch, cols] · W[rows, cols]ᵀ, a GEMM blocked so
// that each weight row is read from memory once for the whole batch.
void matmul_batch(float* out, const float* x, int batch, const Matrix& w);

// Several GEMMs of the same x (e.g. q, k and v) in one parallel region: x is transposed
// once, and the threads take their rows, one matrix after another, in chunks that shrink
// near the end, so threads of unequal speed finish together.
struct BatchOutput {
    float* out;  // [batch, w->rows]
    const Matrix* w;
};
void matmul_batch_many(const float* x, int batch, std::initializer_list<BatchOutput> outputs);

// out[n] = x / rms(x) * weight
void rmsnorm(float* out, const float* x, const float* weight, int n, float eps);

// Rotates each head of vec[heads * head_dim] for position `pos` (rotate-half pairs i,
// i+head_dim/2).
void rope(float* vec, int heads, int head_dim, int pos, const float* inverse_frequencies);

// In place: x = exp(x - max) / sum.
void softmax(float* x, int n);

// gate[n] = silu(gate) * up
void swiglu(float* gate, const float* up, int n);

// One embedding row as f32: out[cols] = table[row].
void embedding_row(float* out, const Matrix& table, int row);

// Stores n floats into a KV-cache slot of type `type`.
void kv_store(void* slot, const float* values, int n, KvType type);

// Causal attention over one layer's KV cache (the layout and the shape: src/kv_cache.h).

// Decode: one query q [heads * head_dim] at `pos`, heads in parallel.
//   out [heads * head_dim], scores [heads, pos + 1] scratch
void attention(float* out, const float* q, int pos, const void* key_cache, const void* value_cache,
               float* scores, const AttentionShape& shape, KvType type);

// Prefill: queries q [count, heads * head_dim] at positions first_pos.., whose keys and
// values are already in the cache; (token, head) pairs in parallel. out [count, heads * head_dim]
void attention_batch(float* out, const float* q, int count, int first_pos, const void* key_cache,
                     const void* value_cache, const AttentionShape& shape, KvType type);

// The scalar reference of each SIMD kernel, also used on CPUs without AVX2.
namespace scalar {
void matmul_rows(float* out, const Matrix& w, const float* x, int first_row, int row_count);
void matmul_batch_rows(float* out, const Matrix& w, const float* x, int batch, int first_row,
                       int row_count);
float dot_kv(const float* q, const void* keys, int n, KvType type);
void add_scaled_kv(float* out, float scale, const void* values, int n, KvType type);
void swiglu(float* gate, const float* up, int n);
}  // namespace scalar

namespace avx2 {
void matmul_rows(float* out, const Matrix& w, const float* x, int first_row, int row_count);
void matmul_rows_q8(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                    int row_count);
// The prefill GEMM in two steps: x [batch, cols] is transposed into tiles of 16 tokens
// (x_tiles [tiles, cols, 16], 32-byte aligned), then any run of rows is computed from them.
int token_tile_count(int batch);
size_t token_tiles_floats(int batch, int cols);  // buffer size, alignment slack included
float* align32(float* p);
void pack_token_tile(float* x_tiles, const float* x, int cols, int batch, int tile);
constexpr int kRowTile = 6;               // weight rows (or query rows) per GEMM micro-kernel call
constexpr int kRowBlock = 16 * kRowTile;  // weight rows widened to f32 together (96 KB of L2)
void matmul_batch_rows(float* out, const Matrix& w, const float* x_tiles, int batch, int first_row,
                       int row_count);
float dot_kv(const float* q, const void* keys, int n, KvType type);
void add_scaled_kv(float* out, float scale, const void* values, int n, KvType type);
void swiglu(float* gate, const float* up, int n);

// Prefill attention on the GEMM micro-kernel, one KV head at a time: its cache rows
// [first_key, first_key + keys) widened to f32 tiles (pack_kv_tile, the threads sharing
// the tiles), then blocks of at most kRowTile query rows (attention_rows). The rows of a
// KV head are its count × (heads / kv_heads) queries, token-major.
struct KvTiles {
    int first_key = 0, keys = 0;
    int padded_keys = 0;           // keys rounded up to whole tiles of 16
    float* key_tiles = nullptr;    // [padded_keys / 16, head_dim, 16]: keys transposed
    float* value_tiles = nullptr;  // [ceil(head_dim / 16), padded_keys, 16]: value columns
};
int kv_tile_count(int keys);
size_t kv_tiles_floats(int keys, int head_dim);  // storage, alignment slack included
KvTiles kv_tiles(float* storage, int first_key, int keys, int head_dim);
void pack_kv_tile(const KvTiles& tiles, const void* key_cache, const void* value_cache, int kv_head,
                  int tile, const AttentionShape& shape, KvType type);
size_t attention_scratch_floats(int keys, int head_dim);  // per thread
// out rows first_row .. first_row + rows (rows ≤ kRowTile) of queries q [count, heads *
// head_dim] at positions first_pos.. over `tiles`.
void attention_rows(float* out, const float* q, int first_row, int rows, int first_pos, int kv_head,
                    const KvTiles& tiles, const AttentionShape& shape, float* scratch);
}  // namespace avx2

}  // namespace barellm::cpu
