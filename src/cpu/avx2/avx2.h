// The AVX2 path of the CPU kernels, private to src/cpu/: the functions of the *_avx2.cpp
// files, which the dispatch in cpu/dispatch.cpp calls when simd_level() is Avx2.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cpu/kernels.h"

namespace barellm::cpu::avx2 {

// ---- Decode matvecs: out[r] = W[r] · x for each row r of the run; f32, f16 and bf16 weights
// (matvec_float_avx2.cpp), Q8 and Q4 (matvec_quantized_avx2.cpp).

void matvec_rows(float* out, const Matrix& w, const float* x, int first_row, int row_count);
void matvec_rows_q8(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                    int row_count);
void matvec_rows_q4(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                    int row_count);
// The same for `tokens` vectors x[t], out[t · out_stride + r], each row read from memory once
// for all of them; each token's sums are the one-token matvec's bits.
void matvec_rows_q8_tokens(float* out, size_t out_stride, const Matrix& w, const QuantizedVector* x,
                           int tokens, int first_row, int row_count);
void matvec_rows_q4_tokens(float* out, size_t out_stride, const Matrix& w, const QuantizedVector* x,
                           int tokens, int first_row, int row_count);

// Q4_K, Q5_K, Q6_K and IQ4_XS weights against x quantized per 256 as Q8_K
// (matvec_super_blocks_avx2.cpp), by quantize_q8_k here, byte for byte as cpu::quantize_q8_k.
void quantize_q8_k(Q8KVector* out, const float* x, int n);
void matvec_rows_super_blocks(float* out, const Matrix& w, const Q8KVector& x, int first_row,
                              int row_count);
// The i-quant types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) and the ternary types
// (TQ1_0, TQ2_0) against x quantized as Q8_K, a row at a time (matvec_iq_avx2.cpp).
void matvec_rows_iq(float* out, const Matrix& w, const Q8KVector& x, int first_row, int row_count);
// Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS weights read from their tiles (Matrix::row_tiles,
// cpu/super_block_tiles.h) against `tokens` vectors x[t] quantized as Q8_K, out[t · out_stride + r]
// for each of them, each tile read once for a few tokens (matvec_super_block_tiles_avx2.cpp).
void matvec_rows_block_tiles(float* out, size_t out_stride, const Matrix& w, const Q8KVector* x,
                             int tokens, int first_row, int row_count);

// Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4 weights against x quantized per 32
// (matvec_small_blocks_avx2.cpp; the AVX-512 level runs them too, but for IQ4_NL and MXFP4 where
// it has VNNI: avx512::matvec_rows_lookup_blocks, from their tiles).
void matvec_rows_small_blocks(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                              int row_count);

// ---- The prefill GEMM (gemm_avx2.cpp), in two steps:
// - x [batch, cols] is transposed into tiles of kTokenTile tokens (x_tiles [tiles, cols,
//   kTokenTile], 32-byte aligned);
// - then any run of weight rows is computed from those tiles.

constexpr int kTokenTile = 16;            // tokens per tile: two registers of 8
constexpr int kRowTile = 6;               // weight rows (or query rows) per micro-kernel call
constexpr int kRowBlock = 16 * kRowTile;  // weight rows converted to f32 together (96 KB of L2)

int token_tile_count(int batch);
size_t token_tiles_floats(int batch, int cols);  // buffer size, alignment slack included
void pack_token_tile(float* x_tiles, const float* x, int cols, int batch, int tile);
void gemm_rows(float* out, const Matrix& w, const float* x_tiles, int batch, int first_row,
               int row_count);

// ---- The prefill GEMM of the block types (weight_blocks.h) in integers, in two steps, as
// the VNNI ones:
// - x [batch, cols] is quantized to Q8 a token at a time (quantize_token, exactly as
//   quantize_q8 does, in quantize_batch_avx2.cpp; with each group's start and sums of 16)
//   into a QuantizedBatch (resize_quantized_batch) the threads share; AVX-VNNI's Q8/Q4 GEMM
//   reads it too. The super-block types read x quantized per 256 instead (quantize_q8_k,
//   cpu::store_q8_k_token), as their matvecs do;
// - then any run of weight rows is computed from it (gemm_rows_blocks, gemm_blocks_avx2.cpp on
//   gemm_blocks_panels.h, out [batch, w.rows]): each tile of kBlockRowTile rows unpacked to
//   levels and f32 sub-block scales once, then met by every token, vpmaddubsw and vpmaddwd in
//   int32 (with AVX-VNNI, avxvnni::gemm_rows_blocks: vpdpbusd, the same results).

constexpr int kBlockRowTile = 32;  // weight rows unpacked and computed together

void quantize_token(QuantizedBatch* x, const float* x_row, int cols, int token);
void gemm_rows_blocks(float* out, const Matrix& w, const QuantizedBatch& x, int first_row,
                      int row_count);

// Q4 weights from the same QuantizedBatch, without VNNI (gemm_quantized_avx2.cpp): AVX-VNNI's
// Q8/Q4 GEMM (avxvnni.h) with vpmaddubsw in place of vpdpbusd, out [batch, w.rows].
void gemm_rows_q4(float* out, const Matrix& w, const QuantizedBatch& x, int first_row,
                  int row_count);

// The first 32-byte aligned float at or after p.
inline float* align32(float* p) {
    const uintptr_t misalignment = reinterpret_cast<uintptr_t>(p) % 32;
    return misalignment ? p + (32 - misalignment) / sizeof(float) : p;
}

// The GEMM micro-kernel, also used by prefill attention, for `rows` rows (1 ≤ rows ≤ kRowTile):
//   sums[r][t] += Σ_i panel[r * panel_stride + i] · x_tile[i][t], t < kTokenTile
// sums and x_tile are 32-byte aligned.
using OuterProductKernel = void (*)(float* sums, const float* panel, int panel_stride,
                                    const float* x_tile, int depth);
extern const OuterProductKernel outer_product_kernels[kRowTile];  // [rows - 1]
inline OuterProductKernel outer_product_kernel_for(int rows) {
    return outer_product_kernels[rows - 1];
}

// ---- Attention (attention_avx2.cpp).

// Decode: one query head against one cache row.
float dot_kv(const float* q, const void* keys, int n, KvType type);
void add_scaled_kv(float* out, float scale, const void* values, int n, KvType type);
void softmax(float* x, int n, float sink);  // in place (cpu::softmax)

// Prefill, one KV head at a time:
// - its cache rows [first_key, first_key + keys) are converted to f32 tiles (pack_kv_tile,
//   the threads sharing the tiles);
// - then blocks of at most kRowTile query rows attend (attention_rows).
// The rows of a KV head are its count × (heads / kv_heads) queries, token-major.
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
// Out rows first_row .. first_row + rows (rows ≤ kRowTile) of queries q [count, heads *
// head_dim] at positions first_pos.., over `tiles`.
void attention_rows(float* out, const float* q, int first_row, int rows, int first_pos, int kv_head,
                    const KvTiles& tiles, const AttentionShape& shape, float* scratch);

// ---- Element-wise (swiglu_avx2.cpp, rmsnorm_avx2.cpp).

void swiglu(float* gate, const float* up, int n);
void rmsnorm(float* out, const float* x, const float* weight, int n, float eps);
void geglu(float* gate, const float* up, int n);
void swiglu_oai(float* gate, const float* up, int n, float limit);
void softcap(float* x, int n, float cap);

}  // namespace barellm::cpu::avx2
