// The AVX-512 path of the CPU kernels, private to src/cpu/: the functions of the
// *_avx512*.cpp files, which the dispatch in cpu/dispatch.cpp calls when simd_level() is
// Avx512 (those in *_avx512vnni.cpp only when the CPU also has AVX512_VNNI, those in
// *_avx512bf16.cpp only when it has AVX512_BF16).
//
// The unit tests build these files a second time on SIMDe (a portable implementation of the
// intrinsics, so that they run on any CPU) with the name avx512 defined as avx512_simde:
// they include this header once more under that definition (hence no include guard).
#include <cstddef>
#include <cstdint>

#include "cpu/avx2/avx2.h"
#include "cpu/kernels.h"

namespace barellm::cpu::avx512 {

// ---- Decode matvecs: out[r] = W[r] · x for each row r of the run.

// f32, f16 and bf16 weights (matvec_float_avx512.cpp).
void matvec_rows(float* out, const Matrix& w, const float* x, int first_row, int row_count);

// How far ahead of the row being read the f16/bf16 matvecs' software prefetches ask, in
// bytes: by CPU vendor, as measured (matvec_float_avx512.cpp).
int matvec_prefetch_bytes();

// f16 and bf16 weights against x rounded to f16 (half_x, from round_to_half): half the
// bytes of x to read for each weight row, which keeps x in L1 for rows of up to ~5000
// columns and the loads at one stream of weights (matvec_float_avx512.cpp).
void matvec_rows_half_x(float* out, const Matrix& w, const uint16_t* half_x, int first_row,
                        int row_count);
// half_x[n] = x rounded to f16 (nearest even); false, and half_x unspecified, where some
// |x| is too large for f16 (or x is not finite).
bool round_to_half(uint16_t* half_x, const float* x, int n);

// bf16 weights against x rounded to bf16 (bf16_x, from round_to_bf16), as vdpbf16ps
// (matvec_bf16_avx512bf16.cpp).
void matvec_rows_bf16_x(float* out, const Matrix& w, const uint16_t* bf16_x, int first_row,
                        int row_count);
// bf16_x[n] = x rounded to bf16 (nearest even).
void round_to_bf16(uint16_t* bf16_x, const float* x, int n);

// Q8, Q4, and IQ4_NL and MXFP4 (their nibbles looked up in a table) weights, read from their
// tiles (Matrix::row_tiles, cpu/quantized_tiles.h), against x quantized to Q8, as vpdpbusd integer
// dot products (matvec_quantized_avx512vnni.cpp). quantize_q8 quantizes x for them exactly as
// cpu::quantize_q8 does, 16 values at a time.
void quantize_q8(QuantizedVector* out, const float* x, int n);
void matvec_rows_q8(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                    int row_count);
void matvec_rows_q4(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                    int row_count);
void matvec_rows_lookup_blocks(float* out, const Matrix& w, const QuantizedVector& x, int first_row,
                               int row_count);

// Q4_K, Q5_K, Q6_K and IQ4_XS weights, a row at a time, against x quantized per 256 as Q8_K, as
// integer dot products (matvec_super_blocks_avx512vnni.cpp). quantize_q8_k quantizes x for them
// exactly as cpu::quantize_q8_k does, 16 values at a time.
void quantize_q8_k(Q8KVector* out, const float* x, int n);
void matvec_rows_super_blocks(float* out, const Matrix& w, const Q8KVector& x, int first_row,
                              int row_count);
// The i-quant types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) and the ternary types
// (TQ1_0, TQ2_0) against x quantized as Q8_K, a row at a time (matvec_iq_avx512vnni.cpp).
void matvec_rows_iq(float* out, const Matrix& w, const Q8KVector& x, int first_row, int row_count);
// Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS weights read from their tiles (Matrix::row_tiles,
// cpu/super_block_tiles.h) against `tokens` vectors x[t] quantized as Q8_K, out[t · out_stride + r]
// for each of them, each tile read once for a few tokens (matvec_super_block_tiles_avx512vnni.cpp).
void matvec_rows_block_tiles(float* out, size_t out_stride, const Matrix& w, const Q8KVector* x,
                             int tokens, int first_row, int row_count);

// ---- Attention (attention_avx512.cpp).
// Decode: one query head against one cache row, and the softmax of its scores in place.
float dot_kv(const float* q, const void* keys, int n, KvType type);
void add_scaled_kv(float* out, float scale, const void* values, int n, KvType type);
void softmax(float* x, int n, float sink);  // cpu::softmax

// Prefill, as avx2::attention_rows (the same steps and KvTiles, packed by avx2::pack_kv_tile
// with key_tiles 64-byte aligned), for blocks of at most kAttentionRowTile query rows.
constexpr int kAttentionRowTile = 12;
size_t attention_scratch_floats(int keys, int head_dim);  // per thread
void attention_rows(float* out, const float* q, int first_row, int rows, int first_pos, int kv_head,
                    const avx2::KvTiles& tiles, const AttentionShape& shape, float* scratch);

// ---- Element-wise: SwiGLU, GeGLU and soft-capping (swiglu_avx512.cpp), RMSNorm
// (rmsnorm_avx512.cpp).

void swiglu(float* gate, const float* up, int n);
void geglu(float* gate, const float* up, int n);
void swiglu_oai(float* gate, const float* up, int n, float limit);
void softcap(float* x, int n, float cap);
void rmsnorm(float* out, const float* x, const float* weight, int n, float eps);

// ---- The prefill GEMM for Q8 and Q4 weights (gemm_quantized_avx512vnni.cpp), in two steps:
// - x [batch, cols] is quantized to Q8 a token at a time (quantize_token, exactly as
//   quantize_q8 does), into a QuantizedBatch (resize_quantized_batch) the threads share;
// - then any run of weight rows is computed from it (gemm_rows_quantized,
//   out [batch, w.rows]), each group's dot product in int32 with vpdpbusd.

constexpr int kQuantizedRowTile = 32;   // weight rows packed and computed together: two registers
constexpr int kQuantizedTokenTile = 6;  // tokens per micro-kernel call

void quantize_token(QuantizedBatch* x, const float* x_row, int cols, int token);
void gemm_rows_quantized(float* out, const Matrix& w, const QuantizedBatch& x, int first_row,
                         int row_count);

// The block types (weight_blocks.h), from a QuantizedBatch as well (the super-block types' x
// quantized per 256 by quantize_q8_k and cpu::store_q8_k_token, as their matvecs read it): each
// row tile's blocks unpacked to levels and f32 sub-block scales once, then met by every token
// (gemm_blocks_avx512vnni.cpp).
void gemm_rows_blocks(float* out, const Matrix& w, const QuantizedBatch& x, int first_row,
                      int row_count);

// ---- The prefill GEMM: out[token][row] = Σ_col W[row][col] · x[token][col] for a batch of
// tokens, on tiles of x transposed once per call and shared by the threads.

constexpr int kGemmTokenTile = 16;  // tokens per tile: one register of f32 (or of bf16 pairs)

// The first 64-byte aligned element at or after p (a tile column on one cache line).
template <typename Element>
inline Element* align64(Element* p) {
    static_assert(64 % sizeof(Element) == 0);
    const uintptr_t misalignment = reinterpret_cast<uintptr_t>(p) % 64;
    return misalignment ? p + (64 - misalignment) / sizeof(Element) : p;
}

// f32, f16 and bf16 weights (gemm_float_avx512.cpp), from x_tiles [tiles, cols, kGemmTokenTile]: x
// transposed, zero past the last token (the layout of avx2::pack_token_tile).
void gemm_rows(float* out, const Matrix& w, const float* x_tiles, int batch, int first_row,
               int row_count);

// bf16 weights (gemm_bf16_avx512bf16.cpp), as vdpbf16ps on x rounded to bf16: from pair tiles
// [tiles, ceil(cols / 2), kGemmTokenTile] of 32-bit lanes, each holding x[token][2p] (low
// half) and x[token][2p + 1] (high half, 0 past an odd last column) as bf16.
size_t token_pair_tiles_words(int batch, int cols);  // buffer size, alignment slack included
void pack_token_pair_tile(uint32_t* pair_tiles, const float* x, int cols, int batch, int tile);
void gemm_rows_bf16(float* out, const Matrix& w, const uint32_t* pair_tiles, int batch,
                    int first_row, int row_count);

// Shared by both: out[first_token + t][k] = tile_sums[k][t] for the tile's tokens below
// `batch` and k < rows; out has `stride` floats a token.
void store_tile_sums(float* out, int stride, const float* tile_sums, int rows, int first_token,
                     int batch);

}  // namespace barellm::cpu::avx512
