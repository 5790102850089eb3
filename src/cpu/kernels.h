// The CPU kernels the forward pass calls. Each runs the path set by set_simd_level: the
// scalar one (cpu/scalar.h, the readable reference) or, where it matters, AVX2 (cpu/avx2/avx2.h)
// or AVX-512 (cpu/avx512/avx512.h; a kernel without an AVX-512 version runs its AVX2 one). The
// choice is made in cpu/dispatch.cpp; the threads a call is worth in cpu/threads.cpp, the
// quantization of x to Q8 in cpu/quantize_q8.cpp and to Q8_K in cpu/quantize_q8_k.cpp.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "kv_cache.h"
#include "weights/half.h"
#include "weights/model.h"

namespace barellm::cpu {

// Ordered: each level has every feature of the ones below it.
//   Avx2:   AVX2 + FMA + F16C
//   Avx512: also AVX-512 F, BW, VL and DQ
enum class SimdLevel { Scalar, Avx2, Avx512 };

// The best level this CPU runs; `missing` (if given) names the features it lacks for AVX2.
SimdLevel detect_simd_level(std::string* missing = nullptr);
// Whether the CPU has AVX512_VNNI (the int8 dot products of the AVX-512 q8/q4 matvecs;
// without it those run on AVX2).
bool cpu_has_avx512_vnni();
// Whether the CPU has AVX-VNNI (the 256-bit vpdpbusd, VEX-encoded, of Intel's client CPUs
// from Alder Lake on, which lack AVX-512): the AVX2 level's Q8/Q4 prefill GEMM then
// multiplies in int8; without it, it widens the weights to f32.
bool cpu_has_avx_vnni();
// Whether the CPU has AVX512_BF16 (vdpbf16ps, the bf16 prefill GEMM; without it that runs on
// AVX2).
bool cpu_has_avx512_bf16();
// Whether bf16 weights multiply with vdpbf16ps (x rounded to bf16, two products a lane per
// instruction), in the prefill GEMM and the decode matvec, rather than widening the weights
// to f32 for FMAs: where the CPU has AVX512_BF16 and is an AMD one. Zen 4 runs 512-bit FMAs
// at half rate and vdpbf16ps at full, which makes vdpbf16ps the faster there; Intel's
// full-rate 512-bit FMAs leave vdpbf16ps no faster and x's bf16 pairs a cost
// (docs/benchmarks-history.md: "CPU: bf16 products through vdpbf16ps, by vendor").
bool cpu_prefers_bf16_dot_products();
// Whether the hardware prefetcher alone keeps ahead of a decode matvec reading tiles of 16 rows
// (Q8 and Q4's, cpu/quantized_tiles.h, and the super-block types', cpu/super_block_tiles.h), so
// that software prefetches would only take load slots from the kernel: on AMD (Zen 4; but the
// Zen 3's AVX2 super-block tile matvec asks for them, super_block_prefetch). On Intel the
// tile matvecs ask for the lines ahead (docs/benchmarks-history.md: "CPU: software prefetch
// distances of the decode matvecs", "CPU: software prefetch of the super-block tiles").
bool cpu_prefetches_tiles_unaided();
void set_simd_level(SimdLevel level);
SimdLevel simd_level();
const char* simd_level_name(SimdLevel level);
// The level for a name of simd_level_name ("scalar", "avx2", "avx512"); false if none.
bool parse_simd_level(const std::string& name, SimdLevel* level);
// Whether the decode kernels of the level in use read matrices of `dtype` in tiles of 16 rows
// (Matrix::row_tiles): Q8, Q4, IQ4_NL and MXFP4 on AVX-512 with AVX512_VNNI and on AVX2 with
// AVX-VNNI (cpu/quantized_tiles.h), Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS on AVX2 and AVX-512
// (cpu/super_block_tiles.h). Elsewhere, and for matrices without tiles, they read the rows
// (Q3_K's on the scalar path).
bool uses_row_tiles(DType dtype);
// The level in use and its optional features, e.g. "avx512+vnni+bf16" or "avx2+avxvnni".
std::string simd_description();

// Below this many multiply-adds a thread costs more to wake than it saves.
constexpr size_t kMinWorkPerThread = 1 << 16;

// Threads worth using for `work` multiply-adds: at most OpenMP's, at least one (one per
// kMinWorkPerThread).
int threads_for(size_t work);

// Calls work(r) for each of `rows` independent rows of `row_work` multiply-adds each,
// split across threads when that is worth it.
void for_each_row(int rows, size_t row_work, const std::function<void(int)>& work);

// out[rows] = W[rows, cols] · x[cols]; rows split across OpenMP threads. With AVX2 and
// Q8, Q4, Q4_1, Q5_0, Q5_1, IQ4_NL or MXFP4 weights, x is first quantized to Q8 (per 32), with
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS or the i-quants to Q8_K (per 256), and the dot products
// are integer.
void matvec(float* out, const float* x, const Matrix& w);

// Several independent matvecs (e.g. q, k and v of one input, or the chosen experts' of a
// token) in one parallel region: their rows, one after another, are split across the threads.
struct MatvecTask {
    float* out;
    const float* x;
    const Matrix* w;
};
void matvec_many(std::initializer_list<MatvecTask> tasks);
void matvec_many(const MatvecTask* tasks, int count);

// x's Q8 rule, as llama.cpp quantizes the x of its Q8_0 and Q4_0 dot products (block_q8_0),
// so that both engines round x alike: per group, scale = max |x| / 127 rounded to f16 (kept
// f32 where f16 has no normal number for it), multiplier = 127 / max |x| (0 for a group of
// zeros), values = x × multiplier rounded to the nearest integer, ties to even.
struct Q8GroupScale {
    float scale, multiplier;
};
constexpr int kQ8Largest = 127;                       // |values| ≤ 127
constexpr float kHalfSmallestNormal = 6.1035156e-5f;  // 2^-14
constexpr float kHalfLargest = 65504.0f;
inline Q8GroupScale q8_group_scale(float largest) {
    if (largest == 0.0f) return {0.0f, 0.0f};
    float scale = largest / kQ8Largest;
    if (scale >= kHalfSmallestNormal && scale <= kHalfLargest)
        scale = half_to_float(float_to_half(scale));
    return {scale, kQ8Largest / largest};
}
// v rounded to the nearest integer, ties to even, for |v| < 2^22: adding 1.5 × 2^23 rounds
// in the f32 addition itself (exact IEEE arithmetic: no -ffast-math here), as the SIMD
// conversions (cvtps2dq) round. A NaN (from a file whose weights are not finite) gives 0,
// where converting it to int would be undefined.
inline int round_to_nearest_even(float v) {
    constexpr float kRoundingShift = 12582912.0f;
    if (std::isnan(v)) return 0;
    return int((v + kRoundingShift) - kRoundingShift);
}

// A vector quantized like a Q8 weight row by the rule above: x[i] ≈ values[i] ×
// scales[i / kQ8Group].
struct QuantizedVector {
    std::vector<int8_t> values;     // [n]
    std::vector<float> scales;      // [ceil(n / kQ8Group)]
    std::vector<float> group_sums;  // [ceil(n / kQ8Group)]: Σ values of each group (Q4's
                                    // offset of 8 is applied once per group with it)
    // [n]: the values in the order the AVX2 Q4 matvec reads them. One 32-byte load there holds
    // two Q4 blocks, g and g + 1 (g even), the first 16 columns of each in its low nibbles and
    // the last 16 in its high nibbles; so, for each such pair of whole groups, values of g
    // 0-15, g + 1 0-15, g 16-31, g + 1 16-31. Values past the last whole pair as they are.
    std::vector<int8_t> q4_pair_values;
};
// Both quantizers fill every field, q4_pair_values from values by order_q4_pairs.
void quantize_q8(QuantizedVector* out, const float* x, int n);
void order_q4_pairs(QuantizedVector* x);
// Sizes x's buffers for n values (the quantize_q8s).
void resize_quantized_vector(QuantizedVector* x, int n);

// A vector quantized per super-block of 256 as llama.cpp's Q8_K, the x of the Q3_K, Q4_K,
// Q5_K, Q6_K and IQ4_XS matvecs: x[i] ≈ d[i / 256] × values[i]. Per super-block, max is the value
// of largest magnitude (the first such, sign kept), values = nearest integer (ties to even) to x ×
// (−127 / max), capped at 127, and d = 1 / (−127 / max); all zero where max is 0.
struct Q8KVector {
    std::vector<float> d;        // [n / 256]
    std::vector<int8_t> values;  // [n]
    std::vector<int16_t> sums;   // [n / 16]: Σ values of each 16 (Q6_K's offset of 32, the
                                 // mins of Q4_K and Q5_K are applied with them)
};
// n a multiple of 256.
void quantize_q8_k(Q8KVector* out, const float* x, int n);
void resize_q8_k_vector(Q8KVector* x, int n);

// A batch of vectors quantized per group of 32, laid out for the integer prefill GEMMs
// (AVX-512 VNNI, AVX-VNNI, the block types' on AVX2): each token's values padded with zeros
// to whole groups, and per group its scale, the `start` its integer dot products begin from
// (−128 × Σ values; see gemm_quantized_avx512vnni.cpp) and its two sums of 16. Tokens come
// from quantize_token (each group quantized as quantize_q8 does) or, for the super-block
// types, from store_q8_k_token (x quantized per 256 as their matvecs' Q8_K).
struct QuantizedBatch {
    int batch = 0, groups = 0, padded_cols = 0;
    std::vector<int8_t> values;      // [batch, padded_cols]
    std::vector<float> scales;       // [batch, groups]
    std::vector<int32_t> starts;     // [batch, groups]
    std::vector<int32_t> half_sums;  // [batch, 2 × groups]: Σ values of each 16 (the block
                                     // types' offsets and mins)
};
// Sizes x's buffers for `batch` tokens of `cols` columns.
void resize_quantized_batch(QuantizedBatch* x, int batch, int cols);
// Stores token `token` of x from its Q8_K quantization (cols a multiple of 256): the values as
// they are, each super-block's d the scale of its eight groups, its sums of 16 the groups' halves
// (not the starts, which only the Q8 and Q4 GEMMs read).
// The GEMM then sums what the super-block matvecs sum: a token's result is the same, up to the
// order of f32 additions, whether it came in a prompt or alone.
void store_q8_k_token(QuantizedBatch* x, const Q8KVector& q8_k, int token);

// Prefill: out[batch, rows] = x[batch, cols] · W[rows, cols]ᵀ, a GEMM blocked so
// that each weight row is read from memory once for the whole batch. Each token's sums do not
// depend on the other tokens of the batch or their number, with two exceptions, faster through
// the matvec, whose sums differ from the GEMM's by rounding: block-type weights read from tiles
// (Q4_K, Q6_K, ...) meet batches of up to 8 tokens there, and Q8 and Q4 weights where no integer
// GEMM runs (AVX2 without VNNI) batches of fewer than 16. (With AVX-VNNI, Q8 and Q4 tokens have
// the same bits in a GEMM as through the matvec.)
void gemm(float* out, const float* x, int batch, const Matrix& w);

// Several GEMMs of the same x (e.g. q, k and v) in one parallel region: x is transposed
// once, and the threads take their rows, one matrix after another, in chunks that shrink
// near the end, so threads of unequal speed finish together.
struct BatchOutput {
    float* out;  // [batch, w->rows]
    const Matrix* w;
};
void gemm_many(const float* x, int batch, std::initializer_list<BatchOutput> outputs);

// out[n] = x / rms(x) * weight
void rmsnorm(float* out, const float* x, const float* weight, int n, float eps);
// Σ x² of x[n] as llama.cpp's RMSNorm takes it: each square rounded to f32, summed in double in
// order.
inline double sum_of_f32_squares(const float* x, int n) {
    double sum = 0.0;
    for (int i = 0; i < n; ++i) sum += double(x[i] * x[i]);
    return sum;
}
// RMSNorm's 1 / sqrt(mean(x²) + eps) of x[n] from Σ x² (each square rounded to f32, summed in
// double), the mean and the rest in f32: llama.cpp's RMSNorm bit for bit (its output is then
// x × scale × weight, in that order), so that both engines feed their quantized matvecs the
// same x. Where an f32 square overflowed (|x| above about 1.8e19), the true scale, from exact
// squares in double (an infinite sum would scale every output to 0).
inline float rms_scale(const float* x, int n, double sum_of_f32_squares, float eps) {
    if (!std::isinf(sum_of_f32_squares)) {
        const float mean = float(sum_of_f32_squares / n);
        return 1.0f / std::sqrt(mean + eps);
    }
    double sum_of_squares = 0.0;
    for (int i = 0; i < n; ++i) sum_of_squares += double(x[i]) * x[i];
    return float(1.0 / std::sqrt(sum_of_squares / n + eps));
}

// Whether `sum`, the n f32 squares of x summed in double in another order than x's (in SIMD
// lanes), gives rms_scale the f32 mean that the in-order sum gives. In any order, n terms ≥ 0
// sum to within (n - 1)·2^-53 of their exact sum (relative), so the in-order sum lies within
// 4n·2^-53·sum of this one; where both ends of that interval round to the same f32 mean, it
// does too. Otherwise (an f32 rounding boundary that close: rare), or where sum is not finite,
// the caller sums in order.
inline bool mean_of_squares_settled(double sum, int n) {
    constexpr double kUnitRoundoff = 0x1p-53;
    const double margin = 4.0 * n * kUnitRoundoff * sum;
    return float((sum - margin) / n) == float((sum + margin) / n);
}

// Rotates each head of vec[heads * head_dim] for position `pos` (rotate-half pairs i,
// i+head_dim/2) by the RoPE table rope[head_dim] (barellm::rope_table: the pairs' inverse
// frequencies, then their magnitudes).
void rope(float* vec, int heads, int head_dim, int pos, const float* rope_table);

// In place: x = exp(x - max) / sum. With a `sink` logit (attention sinks, gpt-oss) the sum
// also holds exp(sink - max), and max is over x and the sink: the n probabilities then sum to
// less than 1; -inf adds nothing.
void softmax(float* x, int n, float sink = -INFINITY);

// gate[n] = silu(gate) * up (Llama, Qwen), silu(g) = g / (1 + e^-g)
void swiglu(float* gate, const float* up, int n);

// gate[n] = gelu_tanh(gate) * up (Gemma), gelu_tanh(g) = g/2 (1 + tanh(√(2/π) (g + 0.044715 g³)))
void geglu(float* gate, const float* up, int n);

// gate[n] = gpt-oss's clamped SwiGLU: with g = min(gate, limit) and u = clamp(up, -limit,
// limit), g · σ(kSwigluOaiAlpha · g) · (u + 1)
void swiglu_oai(float* gate, const float* up, int n, float limit);

// gate[n] = act(gate) * up with the model's activation (Config::activation).
void gated_activation(float* gate, const float* up, int n, const Config& config);

// In place: x[n] = cap · tanh(x / cap), within (-cap, cap) (Gemma 2's soft-capping of the
// attention scores and the logits).
void softcap(float* x, int n, float cap);

// One embedding row as f32: out[cols] = table[row].
void embedding_row(float* out, const Matrix& table, int row);

// Stores n floats into a KV-cache slot of type `type`.
void kv_store(void* slot, const float* values, int n, KvType type);

// Causal attention over one layer's KV cache (the layout and the shape: src/kv_cache.h).

// Decode: one query q [heads * head_dim] at `pos`, heads in parallel.
//   out [heads * head_dim], scores [heads, pos + 1] scratch
void attention(float* out, const float* q, int pos, const void* key_cache, const void* value_cache,
               float* scores, const AttentionShape& shape, KvType type);

// One layer of the paged KV cache (src/kv_cache.h): keys and values [blocks, block_size,
// kv_heads * head_dim] of `type`.
struct PagedKvLayer {
    const void* keys;
    const void* values;
    int block_size;
    KvType type;
};

// Step: query rows q [count, heads * head_dim], row i at position positions[i] of its own
// sequence, whose keys and values are already in the paged cache, read through its block
// table block_tables[i]; (row, head) pairs in parallel. Each (row, head) runs the kernels of
// `attention` in the same order, so its output is bitwise what `attention` gives over a
// contiguous cache holding the same keys and values, whatever the other rows.
//   out [count, heads * head_dim]
void attention_paged(float* out, const float* q, int count, const int* positions,
                     const int* const* block_tables, const PagedKvLayer& cache,
                     const AttentionShape& shape);

// Prefill: queries q [count, heads * head_dim] at positions first_pos.., whose keys and
// values are already in the cache; (token, head) pairs in parallel. out [count, heads * head_dim]
void attention_batch(float* out, const float* q, int count, int first_pos, const void* key_cache,
                     const void* value_cache, const AttentionShape& shape, KvType type);

}  // namespace barellm::cpu
