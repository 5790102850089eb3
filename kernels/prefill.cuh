// The row-wise steps of batched prefill (kernels.h, "Batched prefill"): one row per prompt
// token. The embedding rows (scaled), RMSNorm into the GEMM's input type, SwiGLU or GeGLU
// into the same, and RoPE with the KV-cache writes (Qwen3's per-head q/k RMSNorm before it
// when given). The server's step (kernels.h, "The server's step") runs them too, with RoPE
// and the cache writes through each row's block table (rope_kv_store_paged_kernel) and the
// rows that want logits gathered (gather_rows_kernel).
//
// Device code first; the launch shapes as host functions outside the CUDA-only part, so that
// the emulated unit tests launch the kernels exactly as the launch functions at the end do.
#pragma once
#include "common.cuh"
#include "cuda_check.h"
#include "embedding.cuh"  // quantized_table_element, launch_block_embedding_rows
#include "kernels.h"
#include "rope.cuh"

namespace barellm::cuda {

constexpr int kRowsThreads = 256;  // embedding_rows, rmsnorm_rows and swiglu_rows
constexpr int kRopeRowsWarps = 4;  // rope_kv_store_rows: a warp per head vector
constexpr int kRopeRowsThreads = kRopeRowsWarps * kWarpSize;

// Element i of an activation row of dtype D = value, rounded to nearest even for f16/bf16.
template <DType D>
__device__ __forceinline__ void store_activation(void* row, int i, float value) {
    if constexpr (D == DType::F32)
        static_cast<float*>(row)[i] = value;
    else if constexpr (D == DType::F16)
        static_cast<__half*>(row)[i] = __float2half_rn(value);
    else
        static_cast<__nv_bfloat16*>(row)[i] = __float2bfloat16_rn(value);
}

// Elements i and i + 1 (i even) of an f16 or bf16 activation row, as store_activation rounds
// them, in one 4-byte store.
template <DType D>
__device__ __forceinline__ void store_activation_pair(void* row, int i, float first, float second) {
    if constexpr (D == DType::F16)
        reinterpret_cast<__half2*>(static_cast<__half*>(row) + i)[0] =
            __floats2half2_rn(first, second);
    else
        reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(row) + i)[0] =
            __floats2bfloat162_rn(first, second);
}

// Row t of activations [tokens, pitch] of dtype D.
template <DType D>
__device__ __forceinline__ void* activation_row(void* data, int pitch, int t) {
    return static_cast<char*>(data) + size_t(t) * pitch * dtype_size_v<D>;
}

// x[t, i] = table[tokens[t], i] as f32 times scale; x has pitch cols.
// Launch: grid (ceil(cols / 256), count), block 256, no shared memory; thread i of block row
// t copies element i of token t.
template <DType D>
__global__ void __launch_bounds__(kRowsThreads)
    embedding_rows_kernel(float* __restrict__ x, const void* __restrict__ table, int cols,
                          int pitch, float scale, const int* __restrict__ tokens) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    const int t = blockIdx.y;
    const char* row = static_cast<const char*>(table) + size_t(tokens[t]) * pitch * dtype_size_v<D>;
    x[size_t(t) * cols + i] = WeightFormat<D>::element(row, i) * scale;
}

// As embedding_rows_kernel for a Q8 (I8) or Q4 (U8) table (quantized_table_element, as
// embedding_quantized_kernel computes it for one token).
// Launch: as embedding_rows_kernel (grid (ceil(cols / 256), count), block 256, no shared
// memory).
template <DType D>
__global__ void __launch_bounds__(kRowsThreads)
    embedding_rows_quantized_kernel(float* __restrict__ x, const void* __restrict__ table,
                                    const uint16_t* __restrict__ scales, int cols, int pitch,
                                    float scale, const int* __restrict__ tokens) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    const int t = blockIdx.y;
    x[size_t(t) * cols + i] =
        quantized_table_element<D>(table, scales, pitch, size_t(tokens[t]), i) * scale;
}

// out[t, i] = x[t, i] * rsqrt(mean(x[t]²) + eps) * weight[i] as D for i < cols, 0 for
// cols <= i < pitch; x is f32 [tokens, cols].
// Launch: grid tokens, block 256, no dynamic shared memory; block t normalises row t.
template <DType D>
__global__ void __launch_bounds__(kRowsThreads)
    rmsnorm_rows_kernel(void* __restrict__ out, int cols, int pitch, const float* __restrict__ x,
                        const float* __restrict__ weight, float eps) {
    __shared__ float scratch[kWarpSize];
    const int t = blockIdx.x;
    const float* in = x + size_t(t) * cols;
    const float scale = rms_scale(in, cols, eps, scratch);
    void* row = activation_row<D>(out, pitch, t);
    for (int i = threadIdx.x; i < pitch; i += blockDim.x)
        store_activation<D>(row, i, i < cols ? in[i] * scale * weight[i] : 0.0f);
}

// out[t, i] = act(gate[t, i]) * up[t, i] as D for i < cols, 0 for cols <= i < pitch, act of
// A (gated_value; limit: SwigluOai's); gate and up are f32 [tokens, in_pitch].
// Launch: grid (ceil(pitch / 256), tokens), block 256, no shared memory; one element a thread.
template <DType D, Activation A>
__global__ void __launch_bounds__(kRowsThreads)
    swiglu_rows_kernel(void* __restrict__ out, int cols, int pitch, const float* __restrict__ gate,
                       const float* __restrict__ up, int in_pitch, float limit) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pitch) return;
    const int t = blockIdx.y;
    const size_t in = size_t(t) * in_pitch + i;
    store_activation<D>(activation_row<D>(out, pitch, t), i,
                        i < cols ? gated_value<A>(gate[in], up[in], limit) : 0.0f);
}

// RoPE and the cache write of one token at `pos`: `qkv_row` holds heads q vectors, kv_heads k
// vectors and kv_heads v vectors of head_dim; "vector" n < heads + 2 * kv_heads is the n-th
// of them; key_row and value_row are the token's cache rows [kv_dim].
// - The calling warp handles `vector`: a q vector is (RMSNormed with q_norm, then) rotated
//   in place, a k vector (RMSNormed with k_norm, then) rotated into key_row, a v vector
//   copied into value_row.
// - Lane l rotates the pairs (j, j + head_dim/2) for j = l, l + 32, ... (rope_rotate, the
//   angle in double); with a norm, the warp first sums the squares of the whole vector.
template <typename KvT>
__device__ __forceinline__ void rope_kv_store_vector(float* qkv_row, int vector, int pos,
                                                     const float* rope_table, KvT* key_row,
                                                     KvT* value_row, int heads, int kv_heads,
                                                     int head_dim, const float* q_norm,
                                                     const float* k_norm, float eps) {
    const int lane = threadIdx.x % kWarpSize;
    const int half = head_dim / 2;
    float* vec = qkv_row + size_t(vector) * head_dim;
    if (vector >= heads + kv_heads) {  // v: stored unchanged
        KvT* value = value_row + size_t(vector - heads - kv_heads) * head_dim;
        for (int i = lane; i < head_dim; i += kWarpSize) kv_store(value + i, vec[i]);
        return;
    }
    const bool is_q = vector < heads;
    const float* norm = is_q ? q_norm : k_norm;
    float scale = 1.0f;
    if (norm) {
        scale = head_rms_scale(vec, head_dim, eps);
        __syncwarp();  // every lane's reads of vec before any lane writes it back
    }
    KvT* key = key_row + size_t(vector - heads) * head_dim;
    for (int j = lane; j < half; j += kWarpSize) {
        float a = vec[j], b = vec[j + half];
        if (norm) {
            a = a * scale * norm[j];
            b = b * scale * norm[j + half];
        }
        const float2 rotated = rope_rotate(a, b, rope_cos_sin(pos, rope_table, j, half));
        if (is_q) {
            vec[j] = rotated.x;
            vec[j + half] = rotated.y;
        } else {
            kv_store(key + j, rotated.x);
            kv_store(key + j + half, rotated.y);
        }
    }
}

// RoPE and the cache write of token t = blockIdx.y at pos = first_pos + t, into cache row
// pos (rope_kv_store_vector; row t of qkv [count, qkv_pitch]). Warp w of block x handles
// vector x * 4 + w.
// Launch: grid (ceil((heads + 2 * kv_heads) / 4), count), block 128, no shared memory.
template <typename KvT>
__global__ void __launch_bounds__(kRopeRowsThreads)
    rope_kv_store_rows_kernel(float* __restrict__ qkv, int qkv_pitch,
                              const float* __restrict__ rope_table, KvT* __restrict__ key_cache,
                              KvT* __restrict__ value_cache, int first_pos, int heads, int kv_heads,
                              int head_dim, const float* __restrict__ q_norm,
                              const float* __restrict__ k_norm, float eps) {
    const int vector = blockIdx.x * kRopeRowsWarps + threadIdx.x / kWarpSize;
    if (vector >= heads + 2 * kv_heads) return;  // the whole warp
    const int t = blockIdx.y, pos = first_pos + t;
    const size_t cache_row = size_t(pos) * kv_heads * head_dim;
    rope_kv_store_vector(qkv + size_t(t) * qkv_pitch, vector, pos, rope_table,
                         key_cache + cache_row, value_cache + cache_row, heads, kv_heads, head_dim,
                         q_norm, k_norm, eps);
}

// As rope_kv_store_rows_kernel for the rows of a server step over the paged KV cache: row t
// is at positions[t], and its key and value go to slot pos % block_size of pool block
// block_tables[t * table_stride + pos / block_size] (key_pool, value_pool [kv_blocks *
// block_size, kv_dim], one layer's).
// Launch: as rope_kv_store_rows_kernel (grid (ceil((heads + 2 * kv_heads) / 4), count),
// block 128, no shared memory).
template <typename KvT>
__global__ void __launch_bounds__(kRopeRowsThreads)
    rope_kv_store_paged_kernel(float* __restrict__ qkv, int qkv_pitch,
                               const float* __restrict__ rope_table, KvT* __restrict__ key_pool,
                               KvT* __restrict__ value_pool, const int* __restrict__ positions,
                               const int* __restrict__ block_tables, int table_stride,
                               int block_size, int heads, int kv_heads, int head_dim,
                               const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                               float eps) {
    const int vector = blockIdx.x * kRopeRowsWarps + threadIdx.x / kWarpSize;
    if (vector >= heads + 2 * kv_heads) return;  // the whole warp
    const int t = blockIdx.y, pos = positions[t];
    const int block = block_tables[size_t(t) * table_stride + pos / block_size];
    const size_t slot = size_t(block) * block_size + pos % block_size;
    const size_t cache_row = slot * kv_heads * head_dim;
    rope_kv_store_vector(qkv + size_t(t) * qkv_pitch, vector, pos, rope_table, key_pool + cache_row,
                         value_pool + cache_row, heads, kv_heads, head_dim, q_norm, k_norm, eps);
}

// out[t, 0..cols) = x[rows[t], 0..cols) for t < count (the rows of a step that want logits).
// Launch: grid (ceil(cols / 256), count), block 256, no shared memory.
__global__ void __launch_bounds__(kRowsThreads)
    gather_rows_kernel(float* __restrict__ out, const float* __restrict__ x,
                       const int* __restrict__ rows, int cols) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    const int t = blockIdx.y;
    out[size_t(t) * cols + i] = x[size_t(rows[t]) * cols + i];
}

// ---- Launch shapes

inline dim3 embedding_rows_grid(int cols, int count) {
    return dim3((cols + kRowsThreads - 1) / kRowsThreads, count);
}
inline dim3 rmsnorm_rows_grid(int tokens) { return dim3(tokens); }
inline dim3 swiglu_rows_grid(int pitch, int tokens) {
    return dim3((pitch + kRowsThreads - 1) / kRowsThreads, tokens);
}
inline dim3 rope_kv_store_rows_grid(int heads, int kv_heads, int count) {
    return dim3((heads + 2 * kv_heads + kRopeRowsWarps - 1) / kRopeRowsWarps, count);
}
inline dim3 gather_rows_grid(int cols, int count) { return embedding_rows_grid(cols, count); }

#ifdef BARELLM_LAUNCH_FUNCTIONS

void embedding_rows(float* x, const DeviceMatrix& table, float scale, const int* tokens, int count,
                    cudaStream_t stream) {
    if (count == 0) return;
    if (is_block_type(table.dtype))
        return launch_block_embedding_rows(x, table, scale, tokens, count, stream);
    if (is_quantized(table.dtype)) {
        with_quantized_dtype(table.dtype, [&](auto dtype) {
            launch_kernel(embedding_rows_quantized_kernel<decltype(dtype)::value>,
                          embedding_rows_grid(table.cols, count), kRowsThreads, 0, stream, x,
                          table.data, table.scales, table.cols, table.pitch, scale, tokens);
        });
        CUDA_CHECK_LAUNCH("embedding_rows_quantized_kernel");
        return;
    }
    with_weight_dtype(table.dtype, [&](auto dtype) {
        launch_kernel(embedding_rows_kernel<decltype(dtype)::value>,
                      embedding_rows_grid(table.cols, count), kRowsThreads, 0, stream, x,
                      table.data, table.cols, table.pitch, scale, tokens);
    });
    CUDA_CHECK_LAUNCH("embedding_rows_kernel");
}

void rmsnorm_rows(const DeviceActivations& out, const float* x, const float* weight, float eps,
                  cudaStream_t stream) {
    if (out.tokens == 0) return;
    with_weight_dtype(out.dtype, [&](auto dtype) {
        launch_kernel(rmsnorm_rows_kernel<decltype(dtype)::value>, rmsnorm_rows_grid(out.tokens),
                      kRowsThreads, 0, stream, out.data, out.cols, out.pitch, x, weight, eps);
    });
    CUDA_CHECK_LAUNCH("rmsnorm_rows_kernel");
}

void swiglu_rows(const DeviceActivations& out, const float* gate, const float* up, int in_pitch,
                 Activation activation, float limit, cudaStream_t stream) {
    if (out.tokens == 0) return;
    with_weight_dtype(out.dtype, [&](auto dtype) {
        with_any_activation(activation, [&](auto act) {
            launch_kernel(swiglu_rows_kernel<decltype(dtype)::value, decltype(act)::value>,
                          swiglu_rows_grid(out.pitch, out.tokens), kRowsThreads, 0, stream,
                          out.data, out.cols, out.pitch, gate, up, in_pitch, limit);
        });
    });
    CUDA_CHECK_LAUNCH("swiglu_rows_kernel");
}

void rope_kv_store_rows(float* qkv, int qkv_pitch, const float* rope_table, void* key_cache,
                        void* value_cache, int first_pos, int count, int heads, int kv_heads,
                        int head_dim, const float* q_norm, const float* k_norm, float eps,
                        KvType kv_type, cudaStream_t stream) {
    if ((q_norm == nullptr) != (k_norm == nullptr))
        throw Error("rope_kv_store_rows: q_norm and k_norm are given together or not at all");
    if (count == 0) return;
    with_kv_type(kv_type, [&](auto element) {
        using KvT = decltype(element);
        launch_kernel(rope_kv_store_rows_kernel<KvT>,
                      rope_kv_store_rows_grid(heads, kv_heads, count), kRopeRowsThreads, 0, stream,
                      qkv, qkv_pitch, rope_table, static_cast<KvT*>(key_cache),
                      static_cast<KvT*>(value_cache), first_pos, heads, kv_heads, head_dim, q_norm,
                      k_norm, eps);
    });
    CUDA_CHECK_LAUNCH("rope_kv_store_rows_kernel");
}

void rope_kv_store_paged(float* qkv, int qkv_pitch, const float* rope_table, void* key_pool,
                         void* value_pool, const int* positions, const int* block_tables,
                         int table_stride, int block_size, int count, int heads, int kv_heads,
                         int head_dim, const float* q_norm, const float* k_norm, float eps,
                         KvType kv_type, cudaStream_t stream) {
    if ((q_norm == nullptr) != (k_norm == nullptr))
        throw Error("rope_kv_store_paged: q_norm and k_norm are given together or not at all");
    if (count == 0) return;
    with_kv_type(kv_type, [&](auto element) {
        using KvT = decltype(element);
        launch_kernel(rope_kv_store_paged_kernel<KvT>,
                      rope_kv_store_rows_grid(heads, kv_heads, count), kRopeRowsThreads, 0, stream,
                      qkv, qkv_pitch, rope_table, static_cast<KvT*>(key_pool),
                      static_cast<KvT*>(value_pool), positions, block_tables, table_stride,
                      block_size, heads, kv_heads, head_dim, q_norm, k_norm, eps);
    });
    CUDA_CHECK_LAUNCH("rope_kv_store_paged_kernel");
}

void gather_rows(float* out, const float* x, const int* rows, int count, int cols,
                 cudaStream_t stream) {
    if (count == 0) return;
    launch_kernel(gather_rows_kernel, gather_rows_grid(cols, count), kRowsThreads, 0, stream, out,
                  x, rows, cols);
    CUDA_CHECK_LAUNCH("gather_rows_kernel");
}

#endif  // BARELLM_LAUNCH_FUNCTIONS

}  // namespace barellm::cuda
