// The decode step of the GPU ladder's rungs 1 to 4 (ladder_forward.h): the steps of
// CudaBackend::record_forward (forward.cu) with the simple kernels of *_simple.cuh, one
// optimisation fewer per rung, launched through kernels.h:
//   1 NaivePort   a thread per matrix row; RMSNorm, the bias and residual adds, SwiGLU, the
//                 q/k norm, RoPE and the KV write as kernels of their own; naive attention
//   2 WarpPerRow  + a warp per matrix row
//   3 Fused       + RMSNorm, the bias, the residual add and SwiGLU inside the (warp-per-row)
//                 matvecs, the q/k norm and RoPE with the KV write (rope_kv_store)
//   4 FastMatvec  + the fast matvecs (matvec.cuh, matvec_quantized.cuh)
#include "cuda_check.h"
#include "kernels.h"
#include "ladder_forward.h"
#include "util/error.h"

namespace barellm::cuda {

namespace {

// `count` floats of device memory, zeroed.
DeviceBuffer zeroed_floats(size_t count, const std::string& what) {
    DeviceBuffer buffer(count * sizeof(float), what);
    CUDA_CHECK(cudaMemset(buffer.as(), 0, count * sizeof(float)));
    return buffer;
}

}  // namespace

void check_ladder_model(CudaKernels kernels, const Config& config) {
    const bool gpt_oss_steps = config.attention_sinks || config.expert_biases ||
                               config.activation == Activation::SwigluOai;
    if (kernels != CudaKernels::Fast && gpt_oss_steps)
        throw Error("the GPU ladder's rungs 1-4 run the Llama-family layer, not " +
                    config.architecture +
                    "'s (attention sinks, clamped SwiGLU, the router's and experts' biases)");
    const bool gemma_steps = config.activation != Activation::Silu || config.post_norms ||
                             config.embedding_scale != 1.0f || config.rope_theta_local > 0 ||
                             config.attn_logit_softcap > 0 || config.final_logit_softcap > 0;
    if (kernels != CudaKernels::Fast && gemma_steps)
        throw Error("the GPU ladder's rungs 1-4 run the Llama-family layer, not " +
                    config.architecture +
                    "'s (GeGLU, post norms, scaled embeddings, local RoPE, soft-capping)");
    if (kernels != CudaKernels::Fast && config.experts > 0)
        throw Error("the GPU ladder's rungs 1-4 run dense feed-forwards, not " +
                    config.architecture + "'s mixture of experts");
    const std::string& weight_dtype = config.weight_dtype;
    const bool simple_matvecs = kernels == CudaKernels::NaivePort ||
                                kernels == CudaKernels::WarpPerRow || kernels == CudaKernels::Fused;
    const bool quantized = weight_dtype == "Q8" || weight_dtype == "Q4";
    if (simple_matvecs && quantized)
        throw Error(
            "the GPU ladder's simple matvecs (rungs 1-3) read f32, f16 and bf16 "
            "weights, not " +
            weight_dtype + ": convert with --dtype f16 for the ladder");
    const bool uniform =
        quantized || weight_dtype == "F32" || weight_dtype == "F16" || weight_dtype == "BF16";
    if (kernels != CudaKernels::Fast && !uniform)
        throw Error("the GPU ladder runs files of one weight type, not a " + weight_dtype +
                    " mix: convert with --dtype f16 for the ladder");
}

LadderForward::LadderForward(CudaKernels kernels, const Config& config,
                             const DeviceWeights& weights, const DeviceState& state, KvType kv_type,
                             int context)
    : kernels_(kernels),
      config_(config),
      weights_(weights),
      state_(state),
      kv_type_(kv_type),
      context_(context) {
    if (kernels == CudaKernels::Fast)
        throw Error("LadderForward runs the rungs below the fast kernels, not CudaKernels::Fast");
    if (separate()) {
        normed_ = zeroed_floats(config.dim, "normed");
        projected_ = zeroed_floats(config.dim, "projected");
        up_ = zeroed_floats(config.hidden_dim, "up");
    }
    scores_ = zeroed_floats(size_t(config.heads) * context, "attention scores");
}

void LadderForward::record(cudaStream_t stream) const {
    const DeviceState& s = state_;
    cuda::embedding(s.x, weights_.embedding, /*scale=*/1.0f, s.step, stream);
    for (const DeviceLayer& layer : weights_.layers) {
        // Attention: x += wo · attention(rope(wq · norm(x)), rope(wk · norm(x)), wv · norm(x))
        norm_matvec(s.qkv, layer.wqkv.front(), s.x, layer.attn_norm, layer.qkv_bias, stream);
        attention(layer, stream);
        add_matvec(s.x, layer.wo, s.att, layer.o_bias, stream);

        // Feed-forward: x += w2 · (silu(w1 · norm(x)) * (w3 · norm(x)))
        norm_swiglu(s.hidden, layer.w1, layer.w3, s.x, layer.ffn_norm, stream);
        add_matvec(s.x, layer.w2, s.hidden, /*bias=*/nullptr, stream);
    }

    // logits = output · norm(x)
    norm_matvec(s.logits, weights_.output, s.x, weights_.final_norm, /*bias=*/nullptr, stream);
}

void LadderForward::plain_matvec(float* out, const DeviceMatrix& w, const float* in,
                                 cudaStream_t stream) const {
    if (kernels_ == CudaKernels::NaivePort)
        cuda::matvec_thread_per_row(out, w, in, stream);
    else  // the warp-per-row matvec without its fused RMSNorm and residual add
        cuda::matvec_warp_per_row(out, w, in, /*norm_weight=*/nullptr, /*eps=*/0.0f,
                                  /*bias=*/nullptr, /*accumulate=*/false, stream);
}

void LadderForward::norm_matvec(float* out, const DeviceMatrix& w, const float* x,
                                const float* norm_weight, const float* bias,
                                cudaStream_t stream) const {
    const Config& c = config_;
    if (separate()) {  // rmsnorm, a plain matvec, residual_add of the bias
        float* normed = normed_.as<float>();
        cuda::rmsnorm(normed, x, norm_weight, c.dim, c.norm_eps, stream);
        plain_matvec(out, w, normed, stream);
        if (bias) cuda::residual_add(out, bias, w.rows, stream);
    } else if (kernels_ == CudaKernels::Fused) {  // one matvec with RMSNorm and the bias
        cuda::matvec_warp_per_row(out, w, x, norm_weight, c.norm_eps, bias, /*accumulate=*/false,
                                  stream);
    } else {
        cuda::matvec(out, w, x, norm_weight, c.norm_eps, bias, /*accumulate=*/false, stream);
    }
}

void LadderForward::attention(const DeviceLayer& layer, cudaStream_t stream) const {
    const Config& c = config_;
    const DeviceState& s = state_;
    if (separate()) {  // rmsnorm_heads (q/k norm), rope, store_kv_row
        if (layer.q_norm)
            cuda::rmsnorm_heads(s.qkv, layer.q_norm, layer.k_norm, c.heads, c.kv_heads, c.head_dim,
                                c.norm_eps, stream);
        cuda::rope(s.qkv, s.rope_table, s.step, c.heads, c.kv_heads, c.head_dim, stream);
        const float* k = s.qkv + c.q_dim();
        cuda::store_kv_row(k, k + c.kv_dim(), layer.key_cache, layer.value_cache, s.step,
                           c.kv_dim(), kv_type_, stream);
    } else {  // rope_kv_store (with the q/k norm) rotates q in place and writes k and v
        cuda::rope_kv_store(s.qkv, s.rope_table, layer.key_cache, layer.value_cache, s.step,
                            c.heads, c.kv_heads, c.head_dim, layer.q_norm, layer.k_norm, c.norm_eps,
                            kv_type_, stream);
    }
    const AttentionShape shape{c.heads, c.kv_heads, c.head_dim, layer.window, c.attention_scale};
    cuda::attention_naive(s.att, s.qkv, layer.key_cache, layer.value_cache, s.step,
                          scores_.as<float>(), context_, shape, kv_type_, stream);
}

// x += (W · in + bias), in the CPU's order: the bias is added to the product first.
void LadderForward::add_matvec(float* x, const DeviceMatrix& w, const float* in, const float* bias,
                               cudaStream_t stream) const {
    const Config& c = config_;
    if (separate()) {  // a plain matvec, residual_add of the bias, residual_add
        float* projected = projected_.as<float>();
        plain_matvec(projected, w, in, stream);
        if (bias) cuda::residual_add(projected, bias, c.dim, stream);
        cuda::residual_add(x, projected, c.dim, stream);
    } else if (kernels_ == CudaKernels::Fused) {  // one matvec adding to x (with the bias)
        cuda::matvec_warp_per_row(x, w, in, /*norm_weight=*/nullptr, c.norm_eps, bias,
                                  /*accumulate=*/true, stream);
    } else {
        cuda::matvec(x, w, in, /*norm_weight=*/nullptr, c.norm_eps, bias, /*accumulate=*/true,
                     stream);
    }
}

void LadderForward::norm_swiglu(float* out, const DeviceMatrix& w1, const DeviceMatrix& w3,
                                const float* x, const float* norm_weight,
                                cudaStream_t stream) const {
    const Config& c = config_;
    if (separate()) {  // rmsnorm, two plain matvecs, swiglu
        float* normed = normed_.as<float>();
        float* up = up_.as<float>();
        cuda::rmsnorm(normed, x, norm_weight, c.dim, c.norm_eps, stream);
        plain_matvec(out, w1, normed, stream);  // gate
        plain_matvec(up, w3, normed, stream);
        cuda::swiglu(out, up, c.hidden_dim, Activation::Silu, /*limit=*/0.0f, stream);
    } else if (kernels_ == CudaKernels::Fused) {  // one matvec_swiglu with RMSNorm
        cuda::matvec_swiglu_warp_per_row(out, w1, w3, x, norm_weight, c.norm_eps, stream);
    } else {
        cuda::matvec_swiglu(out, w1, w3, x, norm_weight, c.norm_eps, Activation::Silu, stream);
    }
}

}  // namespace barellm::cuda
