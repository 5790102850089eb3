// The decode step of the GPU ladder's simpler rungs (`barellm ladder --device cuda`,
// src/commands/ladder.cpp): the kernels of one token as rungs 1 to 4 run them (BackendOptions::
// cuda_kernels NaivePort, WarpPerRow, Fused, FastMatvec), on the CudaBackend's weights, KV
// cache and activations. Rungs 5 to 8 run the fast path itself (forward.cu:
// CudaBackend::record_forward). Host code only.
#pragma once
#include <string>

#include "backend.h"  // CudaKernels
#include "device_memory.h"
#include "device_model.h"
#include "kv_cache.h"
#include "weights/model.h"  // Config

namespace barellm::cuda {

// What the GPU ladder's rungs 1-4 run: the Llama-family layer (SwiGLU, no post norms, one
// RoPE table, unscaled embeddings; Gemma 3 runs from rung 5 on), and on the simple matvecs
// (rungs 1-3) f32, f16 and bf16 weights only. Throws, naming what the model has, otherwise.
void check_ladder_model(CudaKernels kernels, const Config& config);

class LadderForward {
public:
    // `kernels` is a rung below CudaKernels::Fast. Keeps references to weights and state
    // (which must outlive it) and allocates the scratch buffers its rung's kernels need.
    LadderForward(CudaKernels kernels, const Config& config, const DeviceWeights& weights,
                  const DeviceState& state, KvType kv_type, int context);

    // The kernels of one token on `stream` (the token and position from state.step), ending
    // with the logits in state.logits.
    void record(cudaStream_t stream) const;

private:
    // out = W · rmsnorm(x) * norm_weight (+ bias when given): q, k and v; the logits.
    void norm_matvec(float* out, const DeviceMatrix& w, const float* x, const float* norm_weight,
                     const float* bias, cudaStream_t stream) const;
    // att = attention of rope(q) over the layer's cache, after row pos of the cache has
    // received rope(k) and v (q and k per-head RMSNormed first where the layer has q_norm).
    void attention(const DeviceLayer& layer, cudaStream_t stream) const;
    // x += W · in (+ bias when given): wo and w2 with the residual connection.
    void add_matvec(float* x, const DeviceMatrix& w, const float* in, const float* bias,
                    cudaStream_t stream) const;
    // out = silu(W1 · rmsnorm(x) * norm_weight) * (W3 · rmsnorm(x) * norm_weight).
    void norm_swiglu(float* out, const DeviceMatrix& w1, const DeviceMatrix& w3, const float* x,
                     const float* norm_weight, cudaStream_t stream) const;
    // out = W · in, the plain matvec of the separate-kernel rungs (1-2).
    void plain_matvec(float* out, const DeviceMatrix& w, const float* in,
                      cudaStream_t stream) const;

    // Rungs 1-2: every operation its own kernel; rungs 3-4 fuse RMSNorm, the bias, the
    // residual add and SwiGLU into the matvecs and RoPE into the KV write.
    bool separate() const {
        return kernels_ == CudaKernels::NaivePort || kernels_ == CudaKernels::WarpPerRow;
    }

    const CudaKernels kernels_;
    const Config& config_;
    const DeviceWeights& weights_;
    const DeviceState& state_;
    const KvType kv_type_;
    const int context_;
    // Scratch: normed, projected and up for the separate kernels (rungs 1-2), scores for the
    // naive attention (every rung here).
    DeviceBuffer normed_;     // [dim]  rmsnorm(x)
    DeviceBuffer projected_;  // [dim]  wo · att or w2 · hidden, before the residual add
    DeviceBuffer up_;         // [hidden_dim]  w3 · rmsnorm(x)
    DeviceBuffer scores_;     // [heads, context]
};

}  // namespace barellm::cuda
