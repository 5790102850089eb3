// The host interface to barellm's CUDA kernels: one launch function per kernel role. It holds
// no device code, so host code that only launches kernels does not recompile them.
//
// - The kernels live in the .cuh files named after what they compute (embedding.cuh,
//   matvec.cuh, matvec_quantized.cuh, matvec_blocks.cuh, rope.cuh, attention.cuh, gemm.cuh,
//   dequantize.cuh, post_norm.cuh; the server's step: matvec_rows.cuh, attention_paged.cuh;
//   how block-type matrices are read in block_units.cuh; the GPU ladder's simple versions in
//   matvec_simple.cuh, elementwise_simple.cuh, attention_simple.cuh), compiled once, in
//   kernels.cu. forward.cu, ladder_forward.cu and tests/tools/cuda_kernel_check.cu launch
//   them through here.
// - Decode activations are f32 in device memory, the batched prefill's GEMM inputs f32, f16 or bf16
//   (DeviceActivations); weights are f32, f16, bf16, Q8 (I8), Q4 (U8) or one of ggml's block types
//   (Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S,
//   IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0), each matrix its own: the decode kernels
//   (embedding, matvec, matvec_swiglu) and the batched prefill's GEMM (gemm, embedding_rows) read
//   them all, the GPU ladder's simple kernels the first three.
// - Every launch goes on `stream` and is checked with cudaGetLastError (a failure throws
//   barellm::Error).
// - Kernels that depend on the token or the position read them from `step`, a device array
//   {token, pos}, so that a captured CUDA graph replays unchanged for every token: the host
//   writes `step` before each replay.
#pragma once
#ifdef BARELLM_CUDA_EMULATION
#include "cuda_emulation.h"  // cudaStream_t, cudaError_t
#else
#include <cuda_runtime_api.h>
#endif

#include <cstddef>
#include <cstdint>

#include "kv_cache.h"
#include "weights/config.h"         // Activation
#include "weights/safetensors.h"    // DType
#include "weights/weight_blocks.h"  // is_block_type, block_weights, block_bytes

namespace barellm::cuda {

// Columns per scale of a Q8 group or a Q4 block (model.h: kQ8Group, kQ4Block).
constexpr int kQuantizedBlock = 32;

// A weight matrix in device memory: row-major [rows, cols] of `dtype`, each row padded with
// zeros to `pitch` elements (pitch = padded_cols(cols, dtype)) so that rows start on 16 bytes
// and are read as whole 16-byte vectors.
// - F32, F16, BF16: pitch is cols rounded up to 4 f32 or 8 f16/bf16 elements.
// - I8 (Q8) and U8 (Q4): pitch is cols rounded up to whole blocks of kQuantizedBlock
//   columns (Q4 has whole blocks already). A row holds pitch int8 values (I8) or pitch / 2
//   bytes of 4-bit values (U8: a block's 16 bytes hold its column j in the low nibble of byte
//   j and column j + 16 in the high nibble, as in the file); padding values are 0, so they
//   add nothing to a dot product. `scales` [rows, pitch / kQuantizedBlock] holds each
//   block's f16 scale, in the same allocation as the values, right after them (16-byte
//   aligned). A Q8 row's last group may be shorter in the file; padded, it is a whole block.
// - The block types (Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS and the
//   i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0;
//   src/weights/weight_blocks.h):
//   a row holds its cols / block_weights blocks as the file does, padded with zero bytes to a
//   multiple of 16 bytes (so every row starts 16-byte aligned); pitch is cols, a whole number of
//   blocks, and there are no separate scales.
struct DeviceMatrix {
    const void* data = nullptr;
    DType dtype = DType::F32;
    int rows = 0;
    int cols = 0;
    int pitch = 0;
    const uint16_t* scales = nullptr;  // I8 and U8 only

    int blocks_per_row() const { return pitch / kQuantizedBlock; }
    // Bytes of one row's values in device memory (scales aside).
    size_t row_bytes() const {
        if (is_block_type(dtype)) {
            const size_t bytes = size_t(cols) / block_weights(dtype) * block_bytes(dtype);
            return (bytes + 15) / 16 * 16;
        }
        return dtype == DType::Q4_0 ? size_t(pitch) / 2 : size_t(pitch) * dtype_size(dtype);
    }
    size_t scale_bytes() const {
        const bool quantized = dtype == DType::Q8_0 || dtype == DType::Q4_0;
        return quantized ? size_t(rows) * blocks_per_row() * sizeof(uint16_t) : 0;
    }
    size_t bytes() const { return size_t(rows) * row_bytes() + scale_bytes(); }
};

// Elements per row in device memory for `cols` columns of `dtype`.
inline int padded_cols(int cols, DType dtype) {
    if (is_block_type(dtype)) return cols;  // whole blocks already
    const int multiple = dtype == DType::Q8_0 || dtype == DType::Q4_0 ? kQuantizedBlock
                                                                      : 16 / int(dtype_size(dtype));
    return (cols + multiple - 1) / multiple * multiple;
}

// x[dim] = table[token] as f32 times scale (Config::embedding_scale: 1 but for Gemma), token =
// step[0].
void embedding(float* x, const DeviceMatrix& table, float scale, const int* step,
               cudaStream_t stream);

// Matrix-vector product for one token: out[rows] = W[rows, cols] · in'[cols] + bias, where
// in' = in * rsqrt(mean(in²) + eps) * norm_weight when norm_weight is given (RMSNorm fused
// into the load of the input) and in' = in otherwise, and bias (f32 [rows]; Qwen's q/k/v and
// o biases) is added before the store when given. With accumulate, out += (W · in' + bias)
// instead of out = (the residual connection after wo and w2). `in` and `out` must not overlap.
void matvec(float* out, const DeviceMatrix& w, const float* in, const float* norm_weight, float eps,
            const float* bias, bool accumulate, cudaStream_t stream);

// The feed-forward's first half in one pass: out[rows] = act(W1 · in') * (W3 · in'), in' as
// for matvec with norm_weight (always given), act silu (SwiGLU) or gelu_tanh (GeGLU, Gemma)
// by `activation` (SwigluOai, whose clamp needs its limit, is refused: its feed-forward runs
// as two matvecs and swiglu). W1 and W3 have the same shape.
void matvec_swiglu(float* out, const DeviceMatrix& w1, const DeviceMatrix& w3, const float* in,
                   const float* norm_weight, float eps, Activation activation, cudaStream_t stream);

// Q8 and Q4 weights (matvec_quantized.cuh): the input (normed, when norm_weight is given) is
// quantized to int8 per block of 32 as the CPU's cpu::quantize_q8 does, and multiplied with
// the weights in int8 dot products.
// How the int8 kernels spread over the GPU: one or two rows per warp (SwiGLU: of each
// matrix), and a block per row set of 16 warps' rows, or one wave: only as many blocks as the
// GPU holds at once, each staging the input once for several row sets. QuantizedLaunch{} is
// matvec's choice of both; quantized_launch says what it is for the Q8/Q4 matrix w on this
// GPU (swiglu: matvec_swiglu's, w being w1), and matvec_quantized_launch /
// matvec_swiglu_quantized_launch are matvec / matvec_swiglu launched as given
// (cuda_kernel_check checks and times each). They take the block types' matrices too
// (matvec_blocks.cuh: int8 products, one row per warp, the grid as given).
enum class QuantizedGrid { kChosen, kBlockPerSet, kOneWave };
struct QuantizedLaunch {
    int rows_per_warp = 0;  // 0: matvec's choice
    QuantizedGrid grid = QuantizedGrid::kChosen;
};
QuantizedLaunch quantized_launch(const DeviceMatrix& w, bool swiglu);
void matvec_quantized_launch(QuantizedLaunch launch, float* out, const DeviceMatrix& w,
                             const float* in, const float* norm_weight, float eps,
                             const float* bias, bool accumulate, cudaStream_t stream);
void matvec_swiglu_quantized_launch(QuantizedLaunch launch, float* out, const DeviceMatrix& w1,
                                    const DeviceMatrix& w3, const float* in,
                                    const float* norm_weight, float eps, Activation activation,
                                    cudaStream_t stream);

// Dynamic shared memory a matvec over rows of `cols` columns of `dtype` needs (the staged
// input, and for Q8/Q4 its int8 copy).
size_t matvec_shared_bytes(int cols, DType dtype);
// Allows every matvec kernel up to `bytes` of dynamic shared memory (needed above 48 KiB).
// Call once, before capturing a graph.
void prepare_matvec(size_t bytes);

// RoPE fused with the KV-cache write, for position pos = step[1]. qkv [q_dim + 2 * kv_dim]
// holds q, k and v of the token (heads then kv_heads then kv_heads vectors of head_dim):
// q is rotated in place, rotated k and unchanged v are stored (as kv_type) into row pos of
// key_cache and value_cache [context, kv_dim] (one layer's). Rotate-half pairs (i,
// i + head_dim/2) with angle pos * rope_table[i] and magnitude rope_table[head_dim/2 + i],
// computed in double as the CPU does; rope_table [head_dim] comes from barellm::rope_table.
// With q_norm and k_norm (Qwen3; [head_dim] each, or both null) each head's q and k vector x
// becomes x * rsqrt(mean(x²) + eps) * weight before the rotation, as the CPU orders it.
void rope_kv_store(float* qkv, const float* rope_table, void* key_cache, void* value_cache,
                   const int* step, int heads, int kv_heads, int head_dim, const float* q_norm,
                   const float* k_norm, float eps, KvType kv_type, cudaStream_t stream);

// Flash-decoding attention of one query token at pos = step[1] over one layer's KV cache
// [context, kv_dim], positions attention_start(pos, window) .. pos, RoPE and the cache
// write folded in:
// - qkv [q_dim + 2 * kv_dim] holds q, k and v of the token before RoPE (as the qkv matvec
//   leaves them; it is not modified). The kernel rotates q as it reads it, and stores the
//   rotated k and v into row pos of key_cache and value_cache (what rope_kv_store does)
//   before attending to that row. With q_norm and k_norm, q and k heads are RMSNormed
//   (eps) before they are rotated, as rope_kv_store does.
// - The positions are split across `splits` blocks per KV head (the grid is fixed for a
//   given context: it does not depend on pos). Each block writes a partial output and its
//   (max, sum); the last block of each KV head to finish merges them into out
//   [heads * head_dim]. Where pos leaves one split non-empty, that block writes out itself.
// - Scratch: partial_out [heads, splits, head_dim] and partial_stats [heads, splits, 2];
//   arrivals [attention_arrival_counters(shape)] must be zero before the first call and is
//   zero again after each.
// - Attention sinks: with shape.sinks ([heads], device memory; gpt-oss), each query head's
//   softmax has one more logit, sinks[head] (not scaled, not soft-capped), whose value is
//   zero; the attention kernels below take them too.
void attention(float* out, const float* qkv, const float* rope_table, const float* q_norm,
               const float* k_norm, float eps, void* key_cache, void* value_cache, const int* step,
               float* partial_out, float* partial_stats, unsigned* arrivals,
               const AttentionShape& shape, int splits, KvType kv_type, cudaStream_t stream);
// The arrival counters attention needs for `shape`.
int attention_arrival_counters(const AttentionShape& shape);

// The largest head_dim the attention kernels handle.
constexpr int kMaxHeadDim = 256;
// How many blocks per KV head to split the positions of a context of `context` across on
// a GPU with `multiprocessors` SMs: enough blocks to fill the GPU, no more than useful.
int attention_splits(const AttentionShape& shape, int context, int multiprocessors);

// ==== Batched prefill: `count` prompt tokens at positions first_pos .. first_pos + count - 1
// run as matrices, one row per token (row-major; a row's pitch is given in elements).
// These kernels take first_pos and count as host values: prefill launches them directly
// (no CUDA graph).

// Activations a GEMM reads: [tokens, pitch] of dtype, rows 16-byte aligned, columns
// cols..pitch-1 zero. dtype is gemm_input_dtype(the weights' dtype): f16 or bf16 for f16 or
// bf16 weights and f16 for Q8 and Q4 weights (the products run on tensor cores), f32 for
// f32 weights; pitch = padded_cols(cols, dtype).
struct DeviceActivations {
    void* data = nullptr;
    DType dtype = DType::F32;
    int tokens = 0;
    int cols = 0;
    int pitch = 0;
    size_t bytes() const { return size_t(tokens) * pitch * dtype_size(dtype); }
};

// The activations' dtype a GEMM with weights of `weights` reads: F16 for Q8 (I8), Q4 (U8)
// and the block types, whose blocks are dequantized to f16 for the tensor cores; the
// weights' own otherwise.
inline DType gemm_input_dtype(DType weights) {
    const bool dequantized =
        weights == DType::Q8_0 || weights == DType::Q4_0 || is_block_type(weights);
    return dequantized ? DType::F16 : weights;
}

// Device memory where gemm and gemm_swiglu dequantize Q8/Q4 weights to f16 for the warpgroup
// GEMM of sm_90a: where that GEMM would take f16 weights of the same shape, a Q8/Q4 matrix is
// first dequantized into the scratch (dequantized_bytes; gemm_swiglu's gated form both w1
// and w3, w3 after w1), then multiplied as f16. Without room (or without scratch) Q8/Q4
// weights take the quantized tiles. The product is that of the same f16 weights either way.
// Block-type weights (Q4_K, Q6_K, ...) always go through the scratch: gemm refuses them
// without room for their f16 copy.
struct DequantizeScratch {
    void* data = nullptr;  // 16-byte aligned
    size_t bytes = 0;
};
// Bytes of the f16 copy of a Q8/Q4 or block-type matrix of rows x cols (rows of padded_cols(cols,
// F16) values).
size_t dequantized_bytes(int rows, int cols);
// The f16 matrix of w's weights (each q * scale rounded to f16, as the quantized tiles
// dequantize them; a block type's weights computed in f32, then rounded), written into f16
// (dequantized_bytes(w.rows, w.cols), 16-byte aligned).
// (dequantize.cuh)
DeviceMatrix dequantize_to_f16(const DeviceMatrix& w, void* f16, cudaStream_t stream);

// out[t, r] = sum_c in[t, c] * W[r, c] (+ bias[r] when bias is given) for t < in.tokens,
// r < w.rows, accumulated in f32; with accumulate, out[t, r] += that sum (the residual
// connection). in.dtype == gemm_input_dtype(w.dtype), in.cols == w.cols; out is f32 [in.tokens,
// out_pitch], out_pitch >= w.rows, and must not overlap in. (kernels/gemm.cuh)
void gemm(float* out, int out_pitch, const DeviceMatrix& w, const DeviceActivations& in,
          const float* bias, bool accumulate, cudaStream_t stream,
          const DequantizeScratch& scratch = {});

// The block tiles gemm chooses among (kernels/gemm.cuh: choose_gemm_tiles is the rule):
// the SIMT GEMM (f32 weights; bf16 below sm_80), four tensor-core tile shapes (kWide: f16
// and bf16 weights only), and the warpgroup GEMM of sm_90a (f16 and bf16, and Q8/Q4
// dequantized to f16 in a DequantizeScratch; kernels/gemm_warpgroup.cuh), where
// warpgroup_gemm_enabled.
enum class GemmTiles { kSimt, kSmallBatch, kMedium, kLarge, kWide, kWarpgroup };
// Where gemm runs the warpgroup GEMM on sm_90a GPUs (H100, H200): where its grid fills the
// GPU (the default, or BARELLM_CUDA_WGMMA=1), nowhere (BARELLM_CUDA_WGMMA=0: the other
// tiles, to compare), or for every f16/bf16 product past the small batches (and Q8/Q4
// given scratch), whatever its grid (BARELLM_CUDA_WGMMA=always: the tests' small models).
enum class WarpgroupUse { kNever, kWhereItFills, kAlways };
WarpgroupUse warpgroup_gemm_use();
// warpgroup_gemm_use() != kNever.
bool warpgroup_gemm_enabled();
// The tiles gemm picks for these sizes on the current GPU (Q8/Q4: given scratch with room).
GemmTiles gemm_tiles(DType dtype, int tokens, int rows);
// The weight rows of the warpgroup GEMM's blocks gemm chooses among (largest first).
constexpr int kWarpgroupRowChoices[] = {256, 224, 192, 128};
// gemm with the given tiles, whatever the sizes (tests and benchmarks reach every path
// with it); throws when the GPU or the dtype cannot run them. The warpgroup GEMM's blocks
// take `warpgroup_rows` weight rows (one of kWarpgroupRowChoices), or with 0 those gemm
// would. Q8/Q4 weights on the warpgroup GEMM need the scratch.
void gemm_with_tiles(GemmTiles tiles, float* out, int out_pitch, const DeviceMatrix& w,
                     const DeviceActivations& in, const float* bias, bool accumulate,
                     cudaStream_t stream, const DequantizeScratch& scratch = {},
                     int warpgroup_rows = 0);
// The feed-forward's gate of a prefill batch: out[t, i] = act(in[t, :] · W1[i, :]) ·
// (in[t, :] · W3[i, :]) as out's dtype, i < W1's rows (out's padding columns 0), act by
// `activation` (matvec_swiglu's two; SwigluOai is refused, as there). Where gemm would run
// the warpgroup GEMM (or with
// warpgroup_rows, as for gemm_with_tiles, wherever it runs; Q8/Q4 weights where the scratch
// holds both as f16) and out has the dtype of the GEMM's input, one pass computes both
// products and applies the activation before its stores; otherwise gemm writes them into
// gate and up ([tokens, gate_pitch] f32) and swiglu_rows combines them.
void gemm_swiglu(const DeviceActivations& out, const DeviceMatrix& w1, const DeviceMatrix& w3,
                 const DeviceActivations& in, float* gate, float* up, int gate_pitch,
                 Activation activation, cudaStream_t stream, const DequantizeScratch& scratch = {},
                 int warpgroup_rows = 0);

// x[t, 0..dim) = table[tokens[t]] as f32 times scale (as embedding) for t < count (tokens in
// device memory, checked on the host before); x has pitch table.cols. (kernels/prefill.cuh)
void embedding_rows(float* x, const DeviceMatrix& table, float scale, const int* tokens, int count,
                    cudaStream_t stream);

// out[t] = x[t] * rsqrt(mean(x[t]²) + eps) * weight, rounded to out.dtype, for t < out.tokens;
// x is f32 [out.tokens, out.cols] (pitch out.cols). (kernels/prefill.cuh)
void rmsnorm_rows(const DeviceActivations& out, const float* x, const float* weight, float eps,
                  cudaStream_t stream);

// out[t, i] = act(gate[t, i]) * up[t, i] rounded to out.dtype, i < out.cols, t < out.tokens,
// act by `activation` (matvec_swiglu's, or SwigluOai with its clamp `limit`:
// Config::swiglu_limit, unused by the others); gate and up are f32 [out.tokens, in_pitch].
// (kernels/prefill.cuh)
void swiglu_rows(const DeviceActivations& out, const float* gate, const float* up, int in_pitch,
                 Activation activation, float limit, cudaStream_t stream);

// Gemma's post norms, the residual add of its attention and feed-forward outputs:
// x[t] += y[t] * rsqrt(mean(y[t]²) + eps) * weight for t < count, x and y f32 [count, cols]
// (y: wo's or w2's output; decode runs it on one row). (kernels/post_norm.cuh)
void add_rmsnorm_rows(float* x, const float* y, const float* weight, int cols, int count, float eps,
                      cudaStream_t stream);

// x[i] = cap * tanh(x[i] / cap) for i < n, f32 (Gemma 2's logits; final_logit_softcap).
// (kernels/softcap.cuh)
void softcap(float* x, size_t n, float cap, cudaStream_t stream);

// RoPE and the KV-cache write of `count` tokens, as rope_kv_store does for one: row t of qkv
// [count, qkv_pitch] (f32, as the qkv GEMM leaves it) holds q, k and v of the token at
// first_pos + t; q is rotated in place, rotated k and unchanged v are stored into cache row
// first_pos + t (one layer's key_cache / value_cache [context, kv_dim]). With q_norm and
// k_norm (Qwen3; [head_dim] each, or both null) each head's q and k vector is RMSNormed
// with them (eps) before the rotation. (kernels/prefill.cuh)
void rope_kv_store_rows(float* qkv, int qkv_pitch, const float* rope_table, void* key_cache,
                        void* value_cache, int first_pos, int count, int heads, int kv_heads,
                        int head_dim, const float* q_norm, const float* k_norm, float eps,
                        KvType kv_type, cudaStream_t stream);

// Causal attention of out.tokens query tokens at positions first_pos.. over one layer's cache
// [context, kv_dim]: the query at pos attends to rows attention_start(pos, shape.window) ..
// pos, all written before (rope_kv_store_rows). The queries are the rotated q at the start
// of each row of qkv [out.tokens, qkv_pitch]; out [out.tokens, heads * head_dim] is written
// in the wo GEMM's input type. (kernels/attention_prefill.cuh)
void attention_prefill(const DeviceActivations& out, const float* qkv, int qkv_pitch,
                       const void* key_cache, const void* value_cache, int first_pos,
                       const AttentionShape& shape, KvType kv_type, cudaStream_t stream);
// Dynamic shared memory attention_prefill needs per block for head_dim (compare with the
// GPU's sharedMemPerBlockOptin before batching a model's prefill).
size_t attention_prefill_shared_bytes(int head_dim);
// Whether attention_prefill runs on tensor cores (an f16 cache, head_dim a multiple of 16 up
// to kAttentionPrefillMmaMaxHeadDim; the queries and the softmax probabilities rounded to
// f16, f32 accumulation) or on CUDA cores in f32 (every other shape, f32 caches).
constexpr int kAttentionPrefillMmaMaxHeadDim = 128;
inline bool attention_prefill_uses_mma(KvType kv_type, int head_dim) {
    return kv_type == KvType::F16 && head_dim % 16 == 0 &&
           head_dim <= kAttentionPrefillMmaMaxHeadDim;
}

// ==== The server's step (Backend::step) over the paged KV cache: `count` rows, each one token
// of some sequence at its own position; a layer's keys and values live in pools [kv_blocks *
// block_size, kv_dim] of kv_type, and row t's position p in slot p % block_size of block
// block_tables[t * table_stride + p / block_size]. positions [count] and block_tables are in
// device memory; the projections run on gemm (or, for a few rows, matvec_rows) and the
// steps between them on the prefill's row kernels.

// The most input rows matvec_rows takes.
constexpr int kMatvecRowsMax = 16;
// out[t, r] = sum_c W[r, c] * in[t, c] (+ bias[r] when given; with accumulate out[t, r] +=
// that) for t < in.tokens <= kMatvecRowsMax, r < w.rows: each weight read and dequantized
// once for all the rows (every dtype matvec takes). in is f32, in.cols == w.cols, its pitch a
// multiple of kQuantizedBlock (and >= w.pitch), zero past cols; out f32 [in.tokens,
// out_pitch], not overlapping in. (kernels/matvec_rows.cuh)
void matvec_rows(float* out, int out_pitch, const DeviceMatrix& w, const DeviceActivations& in,
                 const float* bias, bool accumulate, cudaStream_t stream);

// As rope_kv_store_rows, row t at position positions[t], its key and value stored into its
// slot of one layer's key_pool / value_pool through its block table. (kernels/prefill.cuh)
void rope_kv_store_paged(float* qkv, int qkv_pitch, const float* rope_table, void* key_pool,
                         void* value_pool, const int* positions, const int* block_tables,
                         int table_stride, int block_size, int count, int heads, int kv_heads,
                         int head_dim, const float* q_norm, const float* k_norm, float eps,
                         KvType kv_type, cudaStream_t stream);

// out[t, 0..cols) = x[rows[t], 0..cols) for t < count; x and out f32 with pitch cols, rows in
// device memory. (kernels/prefill.cuh)
void gather_rows(float* out, const float* x, const int* rows, int count, int cols,
                 cudaStream_t stream);

// Attention of out.tokens rows over one layer's pools: row t (rotated q at the start of row t
// of qkv [out.tokens, qkv_pitch]) attends to positions attention_start(pos, shape.window) ..
// pos = positions[t] of its sequence, read through its block table (written before by
// rope_kv_store_paged, this step's rows included). Flash-decoding: each row's KV blocks are
// cut into `splits` runs (attention_paged_splits), whose partials, in partial_out [count,
// heads, splits, head_dim] and partial_stats [count, heads, splits, 2], a second kernel
// merges into out [out.tokens, heads * head_dim] of out.dtype (padding columns zeroed).
// (kernels/attention_paged.cuh)
void attention_paged(const DeviceActivations& out, const float* qkv, int qkv_pitch,
                     const void* keys, const void* values, const int* positions,
                     const int* block_tables, int table_stride, int block_size, int splits,
                     float* partial_out, float* partial_stats, const AttentionShape& shape,
                     KvType kv_type, cudaStream_t stream);
// The runs per row for a step of `rows` rows whose longest sees `longest_positions`
// positions: about one per kPagedMinSplitPositions, at most kPagedMaxSplits, and at most
// partial_rows / rows (the rows of runs the partials hold; at least 1).
constexpr int kPagedMaxSplits = 32;
constexpr int kPagedMinSplitPositions = 128;
inline int attention_paged_splits(int rows, int longest_positions, int partial_rows) {
    const int wanted = (longest_positions + kPagedMinSplitPositions - 1) / kPagedMinSplitPositions;
    const int room = partial_rows / (rows > 0 ? rows : 1);
    int splits = wanted < kPagedMaxSplits ? wanted : kPagedMaxSplits;
    if (splits > room) splits = room;
    return splits > 1 ? splits : 1;
}

// ==== A sparse layer's feed-forward, a mixture of experts (kernels/moe.cuh; what it computes:
// src/cpu/moe.h). The routing stays on the device: the expert matvecs read each route's expert
// from device memory, so decode's launches do not depend on it.

// One sparse layer's experts of one role (w1, w3 or w2): the experts' matrices stacked in
// expert order into one device matrix [experts * rows, cols] (upload_stacked), expert e's
// rows e * rows .. (e + 1) * rows - 1 (and, for Q8/Q4, its scales likewise).
struct DeviceExperts {
    DeviceMatrix stacked;
    int rows = 0;  // of one expert
    // Expert e's matrix, a view into `stacked`.
    DeviceMatrix expert(int e) const {
        DeviceMatrix m = stacked;
        m.rows = rows;
        m.data = static_cast<const uint8_t*>(stacked.data) + size_t(e) * rows * stacked.row_bytes();
        if (stacked.scales) m.scales = stacked.scales + size_t(e) * rows * stacked.blocks_per_row();
        return m;
    }
};

// chosen[t * k + j] and weights[t * k + j] (j < k <= 32) for t < tokens: token t's j-th
// expert and its weight from its router logits [tokens, experts] (cpu::route_token's rule:
// softmax, the k best, a tie to the lower index; with normalize the k weights rescaled to
// sum 1).
void route_tokens(int* chosen, float* weights, const float* logits, int tokens, int experts, int k,
                  bool normalize, cudaStream_t stream);
// out[r * out_pitch + i] = W_e[i, :] · in'_r for each route r < routes and row i < w.rows, W_e
// the matrix of expert e = experts[r] (device memory), in'_r row r / routes_per_input of in
// (f32, in_pitch floats apart, 16-byte aligned), RMSNormed with norm_weight when given (as
// matvec), plus biases[e * w.rows + i] where biases (f32 [experts * w.rows]: gpt-oss's
// expert biases) is given. Every weight dtype matvec takes.
void expert_matvec(float* out, int out_pitch, const DeviceExperts& w, const int* experts,
                   int routes, int routes_per_input, const float* in, int in_pitch,
                   const float* norm_weight, float eps, const float* biases, cudaStream_t stream);
// x[t * x_pitch + i] += Σ_j weights[t * k + j] · expert_out[slot * dim + i] for t < tokens,
// i < dim, slot = slots[t * k + j] (device memory), or t * k + j without slots.
void moe_combine(float* x, int x_pitch, const float* expert_out, const int* slots,
                 const float* weights, int k, int dim, int tokens, cudaStream_t stream);

// ==== The GPU ladder's simple kernels (BackendOptions::cuda_kernels, `barellm ladder
// --device cuda`): what the fast kernels above compute, the plain way, one optimisation
// fewer per rung; cuda_kernel_check checks them against the CPU kernels like the fast ones.

// out[rows] = W · in, one thread per row (rung 1; matvec_simple.cuh).
void matvec_thread_per_row(float* out, const DeviceMatrix& w, const float* in, cudaStream_t stream);
// As matvec (RMSNorm fused when norm_weight is given, the bias added when given, out += with
// accumulate), one warp per row, lane 0 storing (rung 2 without norm_weight, bias nor
// accumulate, rung 3 with them).
void matvec_warp_per_row(float* out, const DeviceMatrix& w, const float* in,
                         const float* norm_weight, float eps, const float* bias, bool accumulate,
                         cudaStream_t stream);
// As matvec_swiglu, one warp per row (rung 3).
void matvec_swiglu_warp_per_row(float* out, const DeviceMatrix& w1, const DeviceMatrix& w3,
                                const float* in, const float* norm_weight, float eps,
                                cudaStream_t stream);

// The steps rungs 1-2 run as separate kernels (elementwise_simple.cuh):
// out[n] = in * rsqrt(mean(in²) + eps) * weight.
void rmsnorm(float* out, const float* in, const float* weight, int n, float eps,
             cudaStream_t stream);
// x[n] += y (the residual connection).
void residual_add(float* x, const float* y, int n, cudaStream_t stream);
// gate[n] = act(gate) * up, act by `activation` as for swiglu_rows (`limit`: SwigluOai's; the
// fast path's feed-forward runs it where w1 and w3 differ in type, for SwigluOai and for the
// experts).
void swiglu(float* gate, const float* up, int n, Activation activation, float limit,
            cudaStream_t stream);
// RoPE, in place, on the heads q vectors then kv_heads k vectors at the start of qk, for
// pos = step[1] (the rotation of rope_kv_store).
void rope(float* qk, const float* rope_table, const int* step, int heads, int kv_heads,
          int head_dim, cudaStream_t stream);
// Qwen3's per-head norm on its own, in place, before rope: each of the heads q vectors then
// kv_heads k vectors of head_dim at the start of qk RMSNormed with q_norm or k_norm
// [head_dim] (x * rsqrt(mean(x²) + eps) * weight).
void rmsnorm_heads(float* qk, const float* q_norm, const float* k_norm, int heads, int kv_heads,
                   int head_dim, float eps, cudaStream_t stream);
// Row pos = step[1] of key_cache and value_cache [context, kv_dim] = k[kv_dim], v[kv_dim].
void store_kv_row(const float* k, const float* v, void* key_cache, void* value_cache,
                  const int* step, int kv_dim, KvType kv_type, cudaStream_t stream);

// What attention computes, naively (rungs 1-4; attention_simple.cuh): one block per query
// head, scores [heads, context] (scratch) in global memory, no split.
void attention_naive(float* out, const float* q, const void* key_cache, const void* value_cache,
                     const int* step, float* scores, int context, const AttentionShape& shape,
                     KvType kv_type, cudaStream_t stream);

// Whether the decode kernels that finish a prologue start while the kernel ahead of them ends
// (programmatic dependent launch; kernels/dependent_launch.cuh): BARELLM_CUDA_PDL=1 (0, the
// default, turns it off; another value is refused, throwing), on a GPU of compute capability
// 9.0 or later running kernel images built for it.
bool dependent_launch_enabled();

// cudaSuccess when this binary holds kernels the current GPU can run (otherwise, typically
// cudaErrorNoKernelImageForDevice: it was built for other architectures).
cudaError_t kernel_image_status();

}  // namespace barellm::cuda
