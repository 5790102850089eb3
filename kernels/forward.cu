// The CUDA backend: tokens through the Llama transformer on the GPU (with Qwen2's q/k/v
// biases, Qwen3's per-head q/k norms and per-layer sliding windows where the model has them),
// step by step as src/cpu/forward.cpp runs them, with the kernels of kernels/*.cuh (launched
// through kernels.h).
//
// - Weights (f32, f16, bf16, Q8 or Q4) are uploaded once; decode activations are f32; the KV
//   cache is f16 or f32. Q8/Q4 matrices run through the int8 matvecs of matvec_quantized.cuh
//   in decode (kernels.h: matvec and matvec_swiglu dispatch on the dtype) and through the
//   GEMM's quantized tensor-core kernel in prefill.
// - The kernel sequence of one token (CudaBackend::record_forward) is captured once as a CUDA
//   graph and replayed for every token. The token id and the position live in a small device
//   buffer (`step`) that the host overwrites before each replay; no launch shape depends on
//   them.
// - One synchronisation per token, after the logits reach pinned host memory.
// - Prefill (CudaBackend::prefill_batch) runs up to kMaxBatch prompt tokens as matrices, one
//   row per token: GEMMs for the projections, row kernels for the steps between them, and
//   causal attention over the batch; one synchronisation per batch. The GEMMs read their
//   input activations in one dtype for the whole model (kernels.h: gemm_input_dtype): the
//   weights' dtype for f32, f16 and bf16 models, f16 for Q8 and Q4 models (whose f16
//   matrices, where a Q4 file keeps some, read f16 too). The output matrix, which may be
//   of another dtype, reads its own (a view of the same memory).
// - The GPU ladder (`barellm ladder --device cuda`, src/ladder.cpp) runs this backend with
//   simpler kernels (rung_kernels picks them from BackendOptions::cuda_kernels), without the
//   graph (cuda_graph) or without the attention split (flash_decoding).
// - Debugging knob: BARELLM_CUDA_GRAPHS=0 in the environment launches the kernels directly
//   on the stream for every token instead of replaying the captured graph.
// - BARELLM_CUDA_PDL=1 (sm_90 on) launches the decode kernels (the matvecs and the
//   attention) as programmatic dependents of the kernel before each (common.cuh:
//   launch_dependent): a kernel's blocks start in the SMs its predecessor's last blocks leave
//   free and request their first weights before they wait for its output.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "cuda_check.h"
#include "device_memory.h"
#include "error.h"
#include "kernels.h"
#include "memory.h"

namespace barellm {

namespace {

using cuda::DeviceBuffer;
using cuda::DeviceMatrix;
using cuda::PinnedBuffer;

constexpr size_t kStagingBytes = size_t(64) << 20;         // upload chunk (pinned)
constexpr size_t kBandwidthBufferBytes = size_t(1) << 30;  // 1 GiB: far beyond any L2
constexpr int kBandwidthPasses = 10;
constexpr size_t kMemoryHeadroom = size_t(256) << 20;  // left free for the CUDA context etc.
constexpr int kMaxBatch = 512;  // prefill runs longer prompts in batches of this many tokens

// Bytes of device memory still free on the current GPU.
size_t free_device_bytes() {
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    return free_bytes;
}

struct StreamDeleter {
    void operator()(cudaStream_t stream) const { cudaStreamDestroy(stream); }
};
struct GraphDeleter {
    void operator()(cudaGraph_t graph) const { cudaGraphDestroy(graph); }
};
struct GraphExecDeleter {
    void operator()(cudaGraphExec_t exec) const { cudaGraphExecDestroy(exec); }
};
struct EventDeleter {
    void operator()(cudaEvent_t event) const { cudaEventDestroy(event); }
};
using Stream = std::unique_ptr<CUstream_st, StreamDeleter>;
using Graph = std::unique_ptr<CUgraph_st, GraphDeleter>;
using GraphExec = std::unique_ptr<CUgraphExec_st, GraphExecDeleter>;
using Event = std::unique_ptr<CUevent_st, EventDeleter>;

Event make_event() {
    cudaEvent_t event = nullptr;
    CUDA_CHECK(cudaEventCreate(&event));
    return Event(event);
}

// One layer's weights and KV cache in device memory.
struct DeviceLayer {
    const float* attn_norm;  // [dim]
    DeviceMatrix wqkv;       // [heads * head_dim + 2 * kv_heads * head_dim, dim]: wq, wk, wv
    // Present only where the config says so (else nullptr):
    const float* qkv_bias;  // [heads * head_dim + 2 * kv_heads * head_dim]: bq, bk, bv (qkv_bias)
    const float* q_norm;    // [head_dim]  per-head RMSNorm of q before RoPE (qk_norm)
    const float* k_norm;    // [head_dim]  the same of k (qk_norm)
    DeviceMatrix wo;        // [dim, heads * head_dim]
    const float* o_bias;    // [dim]  (o_bias; else nullptr)
    const float* ffn_norm;  // [dim]
    DeviceMatrix w1;        // [hidden_dim, dim]  gate
    DeviceMatrix w3;        // [hidden_dim, dim]  up
    DeviceMatrix w2;        // [dim, hidden_dim]  down
    void* key_cache;        // [context, kv_dim] of kv_type: this layer's part of the key cache
    void* value_cache;      // [context, kv_dim] of kv_type: the same of the value cache
    int window;             // sliding window of this layer, 0 for none (Config::layer_window)
};

// Every activation buffer, in device memory, allocated once.
struct DeviceState {
    int* step;                // [2]  {token, pos} of the step being run
    float* x;                 // [dim]  residual stream
    float* qkv;               // [q_dim + 2 * kv_dim]  q (rotated in place), k, v of the token
    float* att;               // [q_dim]  attention output
    float* hidden;            // [hidden_dim]  silu(w1 · norm(x)) * (w3 · norm(x))
    float* logits;            // [vocab_size]
    float* partial_out;       // [heads, splits, head_dim]  flash-decoding partial outputs
    float* partial_stats;     // [heads, splits, 2]  their running (max, sum)
    unsigned* arrivals;       // [kv_heads * head groups]  attention blocks done (0 between steps)
    float* normed;            // [dim]  rmsnorm(x) (separate-kernel steps only)
    float* projected;         // [dim]  wo · att or w2 · hidden, before the residual add (same)
    float* up;                // [hidden_dim]  w3 · norm(x) (same)
    float* scores;            // [heads, context]  the naive attention's scores (its steps only)
    float* rope_frequencies;  // [head_dim / 2]
};

// The activations of a prefill batch of B <= CudaBackend::prefill_batch_ tokens, one row
// per token, allocated once for the largest batch (the DeviceActivations' tokens field is
// that size; a batch uses its first B rows).
struct PrefillState {
    int* tokens;                     // [B]  the batch's token ids
    float* x;                        // [B, dim]  residual stream
    cuda::DeviceActivations normed;  // [B, dim]  rmsnorm(x), the GEMMs' input
    float* qkv;                      // [B, q_dim + 2 * kv_dim]  q (rotated in place), k, v
    cuda::DeviceActivations att;     // [B, q_dim]  attention output, wo's input
    float* gate;                     // [B, hidden_dim]  w1 · normed
    float* up;                       // [B, hidden_dim]  w3 · normed
    cuda::DeviceActivations hidden;  // [B, hidden_dim]  silu(gate) * up, w2's input
    float* logits;                   // [B, vocab_size] with all_logits, else [1, vocab_size]
    // Q8/Q4 weights dequantized to f16 for the warpgroup GEMM (kernels.h: DequantizeScratch),
    // the largest matrix it takes at B tokens (w1 and w3 together); empty where none does or
    // the GPU has no room for it.
    cuda::DequantizeScratch dequantized;
};

// The first `tokens` rows of `rows`.
cuda::DeviceActivations first_rows(cuda::DeviceActivations rows, int tokens) {
    rows.tokens = tokens;
    return rows;
}

// ==== The steps of a layer, in the ways the rungs of the GPU ladder run them

// The matvec kernels a rung's steps launch (kernels.h).
struct MatvecKernels {
    // out = W · in: the separate-kernel steps' matvec.
    void (*plain)(float* out, const DeviceMatrix& w, const float* in, cudaStream_t stream);
    // out = W · rmsnorm(in) with norm_weight, + bias when given, out += with accumulate: the
    // fused steps'.
    void (*fused)(float* out, const DeviceMatrix& w, const float* in, const float* norm_weight,
                  float eps, const float* bias, bool accumulate, cudaStream_t stream);
    // out = silu(W1 · rmsnorm(in)) * (W3 · rmsnorm(in)): the fused steps'.
    void (*fused_swiglu)(float* out, const DeviceMatrix& w1, const DeviceMatrix& w3,
                         const float* in, const float* norm_weight, float eps, cudaStream_t stream);
};

// What every step launches with.
struct StepContext {
    cudaStream_t stream;
    const Config& config;
    const DeviceState& state;
    AttentionShape shape;  // the widest layer window; each layer's own: layer_shape
    KvType kv_type;
    int context;  // positions of the KV cache
    int splits;   // attention blocks per KV head (attention_fast)
    const MatvecKernels& matvecs;
};

// How a rung runs each step of a layer, and the scratch buffers those steps need.
struct Steps {
    // out = W · rmsnorm(x) * norm_weight (+ bias when given): q, k and v; the logits.
    void (*norm_matvec)(const StepContext& ctx, float* out, const DeviceMatrix& w, const float* x,
                        const float* norm_weight, const float* bias);
    // att = attention of rope(q) over the layer's cache, after row pos of the cache has
    // received rope(k) and v (q, k, v: the qkv matvec's output; q and k per-head RMSNormed
    // first where the layer has q_norm and k_norm).
    void (*attention)(const StepContext& ctx, const DeviceLayer& layer);
    // x += W · in (+ bias when given): wo and w2 with the residual connection.
    void (*add_matvec)(const StepContext& ctx, float* x, const DeviceMatrix& w, const float* in,
                       const float* bias);
    // out = silu(W1 · rmsnorm(x) * norm_weight) * (W3 · rmsnorm(x) * norm_weight).
    void (*norm_swiglu)(const StepContext& ctx, float* out, const DeviceMatrix& w1,
                        const DeviceMatrix& w3, const float* x, const float* norm_weight);
    bool uses_intermediates;  // DeviceState's normed, projected and up
    bool uses_scores;         // DeviceState's scores
};

// ---- Separate kernels (rungs 1-2): every operation its own kernel, as the CPU runs them,
// every intermediate through global memory.

// The attention shape of `layer`: its own sliding window.
AttentionShape layer_shape(const StepContext& ctx, const DeviceLayer& layer) {
    AttentionShape shape = ctx.shape;
    shape.window = layer.window;
    return shape;
}

void norm_matvec_separate(const StepContext& ctx, float* out, const DeviceMatrix& w, const float* x,
                          const float* norm_weight, const float* bias) {
    const Config& c = ctx.config;
    const DeviceState& s = ctx.state;
    cuda::rmsnorm(s.normed, x, norm_weight, c.dim, c.norm_eps, ctx.stream);
    ctx.matvecs.plain(out, w, s.normed, ctx.stream);
    if (bias) cuda::residual_add(out, bias, w.rows, ctx.stream);
}

void attention_separate(const StepContext& ctx, const DeviceLayer& layer) {
    const Config& c = ctx.config;
    const DeviceState& s = ctx.state;
    if (layer.q_norm)
        cuda::rmsnorm_heads(s.qkv, layer.q_norm, layer.k_norm, c.heads, c.kv_heads, c.head_dim,
                            c.norm_eps, ctx.stream);
    cuda::rope(s.qkv, s.rope_frequencies, s.step, c.heads, c.kv_heads, c.head_dim, ctx.stream);
    const float* k = s.qkv + c.q_dim();
    cuda::store_kv_row(k, k + c.kv_dim(), layer.key_cache, layer.value_cache, s.step, c.kv_dim(),
                       ctx.kv_type, ctx.stream);
    cuda::attention_naive(s.att, s.qkv, layer.key_cache, layer.value_cache, s.step, s.scores,
                          ctx.context, layer_shape(ctx, layer), ctx.kv_type, ctx.stream);
}

// x += (W · in + bias), in the CPU's order: the bias is added to the product first.
void add_matvec_separate(const StepContext& ctx, float* x, const DeviceMatrix& w, const float* in,
                         const float* bias) {
    const DeviceState& s = ctx.state;
    ctx.matvecs.plain(s.projected, w, in, ctx.stream);
    if (bias) cuda::residual_add(s.projected, bias, ctx.config.dim, ctx.stream);
    cuda::residual_add(x, s.projected, ctx.config.dim, ctx.stream);
}

void norm_swiglu_separate(const StepContext& ctx, float* out, const DeviceMatrix& w1,
                          const DeviceMatrix& w3, const float* x, const float* norm_weight) {
    const Config& c = ctx.config;
    const DeviceState& s = ctx.state;
    cuda::rmsnorm(s.normed, x, norm_weight, c.dim, c.norm_eps, ctx.stream);
    ctx.matvecs.plain(out, w1, s.normed, ctx.stream);  // gate
    ctx.matvecs.plain(s.up, w3, s.normed, ctx.stream);
    cuda::swiglu(out, s.up, c.hidden_dim, ctx.stream);
}

// The warp-per-row matvec without its fused RMSNorm and residual add: out = W · in.
void matvec_warp_per_row_plain(float* out, const DeviceMatrix& w, const float* in,
                               cudaStream_t stream) {
    cuda::matvec_warp_per_row(out, w, in, /*norm_weight=*/nullptr, /*eps=*/0.0f, /*bias=*/nullptr,
                              /*accumulate=*/false, stream);
}

// ---- Fused kernels (rung 3 on): RMSNorm, the bias, the residual add and SwiGLU inside the
// matvecs.

void norm_matvec_fused(const StepContext& ctx, float* out, const DeviceMatrix& w, const float* x,
                       const float* norm_weight, const float* bias) {
    ctx.matvecs.fused(out, w, x, norm_weight, ctx.config.norm_eps, bias, /*accumulate=*/false,
                      ctx.stream);
}

void add_matvec_fused(const StepContext& ctx, float* x, const DeviceMatrix& w, const float* in,
                      const float* bias) {
    ctx.matvecs.fused(x, w, in, /*norm_weight=*/nullptr, ctx.config.norm_eps, bias,
                      /*accumulate=*/true, ctx.stream);
}

void norm_swiglu_fused(const StepContext& ctx, float* out, const DeviceMatrix& w1,
                       const DeviceMatrix& w3, const float* x, const float* norm_weight) {
    ctx.matvecs.fused_swiglu(out, w1, w3, x, norm_weight, ctx.config.norm_eps, ctx.stream);
}

// The q/k norm and RoPE with the KV write in one kernel (rope_kv_store rotates q in place),
// then the naive attention (rungs 3-4).
void attention_fused(const StepContext& ctx, const DeviceLayer& layer) {
    const Config& c = ctx.config;
    const DeviceState& s = ctx.state;
    cuda::rope_kv_store(s.qkv, s.rope_frequencies, layer.key_cache, layer.value_cache, s.step,
                        c.heads, c.kv_heads, c.head_dim, layer.q_norm, layer.k_norm, c.norm_eps,
                        ctx.kv_type, ctx.stream);
    cuda::attention_naive(s.att, s.qkv, layer.key_cache, layer.value_cache, s.step, s.scores,
                          ctx.context, layer_shape(ctx, layer), ctx.kv_type, ctx.stream);
}

// One kernel: flash-decoding over ctx.splits blocks per KV head, the q/k norm, RoPE and the
// cache write folded in (rung 5 on).
void attention_fast(const StepContext& ctx, const DeviceLayer& layer) {
    const DeviceState& s = ctx.state;
    cuda::attention(s.att, s.qkv, s.rope_frequencies, layer.q_norm, layer.k_norm,
                    ctx.config.norm_eps, layer.key_cache, layer.value_cache, s.step, s.partial_out,
                    s.partial_stats, s.arrivals, layer_shape(ctx, layer), ctx.splits, ctx.kv_type,
                    ctx.stream);
}

// Every operation its own kernel (rungs 1-2).
constexpr Steps kSeparateSteps = {
    norm_matvec_separate,  // rmsnorm, a plain matvec, residual_add of a bias
    attention_separate,    // rmsnorm_heads (q/k norm), rope, store_kv_row, attention_naive
    add_matvec_separate,   // a plain matvec, residual_add of a bias, residual_add
    norm_swiglu_separate,  // rmsnorm, two plain matvecs, swiglu
    /*uses_intermediates=*/true,
    /*uses_scores=*/true,
};
// RMSNorm, the residual add and SwiGLU fused into the matvecs, RoPE into the KV write
// (rungs 3-4).
constexpr Steps kFusedSteps = {
    norm_matvec_fused,  // a matvec with RMSNorm (and the bias)
    attention_fused,    // rope_kv_store (with the q/k norm), attention_naive
    add_matvec_fused,   // a matvec adding to x (with the bias)
    norm_swiglu_fused,  // a matvec_swiglu with RMSNorm
    /*uses_intermediates=*/false,
    /*uses_scores=*/true,
};
// And the fast attention, RoPE and the KV write inside it (rung 5 on).
constexpr Steps kFastSteps = {
    norm_matvec_fused,
    attention_fast,  // cuda::attention
    add_matvec_fused,
    norm_swiglu_fused,
    /*uses_intermediates=*/false,
    /*uses_scores=*/false,
};

// What one rung of the GPU ladder runs a token with.
struct RungKernels {
    Steps steps;
    MatvecKernels matvecs;
};

// The kernels of each CudaKernels value (src/backend.h), rung by rung.
RungKernels rung_kernels(CudaKernels kernels) {
    switch (kernels) {
        case CudaKernels::NaivePort:
            return {kSeparateSteps, {cuda::matvec_thread_per_row, nullptr, nullptr}};
        case CudaKernels::WarpPerRow:
            return {kSeparateSteps, {matvec_warp_per_row_plain, nullptr, nullptr}};
        case CudaKernels::Fused:
            return {kFusedSteps,
                    {nullptr, cuda::matvec_warp_per_row, cuda::matvec_swiglu_warp_per_row}};
        case CudaKernels::FastMatvec:
            return {kFusedSteps, {nullptr, cuda::matvec, cuda::matvec_swiglu}};
        case CudaKernels::Fast:
            return {kFastSteps, {nullptr, cuda::matvec, cuda::matvec_swiglu}};
    }
    throw Error("unknown CudaKernels value " + std::to_string(int(kernels)));
}

class CudaBackend : public Backend {
public:
    CudaBackend(const Model& model, const BackendOptions& options)
        : model_(model),
          context_(options.context),
          kv_type_(options.kv_type),
          rung_(rung_kernels(options.cuda_kernels)) {
        const Config& c = model.config;
        const bool quantized = c.weight_dtype == "Q8" || c.weight_dtype == "Q4";
        if (quantized) check_quantized_rung(options);
        CUDA_CHECK(cudaSetDevice(0));
        cudaDeviceProp properties;
        CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
        check_shape(properties);
        cuda::warpgroup_gemm_use();  // a wrong BARELLM_CUDA_WGMMA stops here, before the upload
        if (options.flash_decoding)
            splits_ =
                cuda::attention_splits(attention_shape(), context_, properties.multiProcessorCount);
        // Batched prefill with the fast kernels; the GPU ladder's simpler rungs, a head size
        // whose attention tiles exceed the GPU's shared memory and a model whose layer
        // matrices take different GEMM input dtypes prefill token by token.
        if (options.cuda_kernels == CudaKernels::Fast && layers_share_gemm_input() &&
            cuda::attention_prefill_shared_bytes(c.head_dim) <= properties.sharedMemPerBlockOptin)
            prefill_batch_ = std::min(context_, kMaxBatch);

        cudaStream_t stream = nullptr;
        CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        stream_.reset(stream);

        check_free_memory(options.all_logits);
        upload_weights();
        allocate_state();
        if (prefill_batch_ > 0) allocate_prefill(options.all_logits);
        host_step_ = PinnedBuffer(2 * sizeof(int), "the step parameters");
        host_logits_ = PinnedBuffer(size_t(c.vocab_size) * sizeof(float), "the logits");
        if (options.all_logits) {  // host memory, for ppl: every position's logits
            const size_t floats = size_t(context_) * c.vocab_size;
            require_memory(
                floats * sizeof(float),
                "the logits of every position for a context of " + std::to_string(context_));
            all_logits_.resize(floats);
        }
        cuda::prepare_matvec(max_matvec_shared_bytes());
        // The uploads and memsets above ran on the legacy default stream, which does not
        // order itself with our non-blocking stream: let them finish before any kernel runs.
        CUDA_CHECK(cudaDeviceSynchronize());

        const char* graphs = std::getenv("BARELLM_CUDA_GRAPHS");
        if (options.cuda_graph && !(graphs && std::strcmp(graphs, "0") == 0)) capture_graph();
    }

    std::string name() const override { return "cuda"; }

    // Token by token (prefill_batch_ 0), a "batch" is one token: the weights are read once
    // per token.
    int max_batch() const override { return prefill_batch_ > 0 ? prefill_batch_ : 1; }

    size_t kv_bytes_read(int pos) const override {
        const Config& c = model_.config;
        size_t positions = 0;  // summed over the layers
        for (int l = 0; l < c.layers; ++l)
            positions += pos + 1 - attention_start(pos, c.layer_window(l));
        return 2 * positions * c.kv_dim() * kv_element_bytes(kv_type_);
    }

    const float* forward(int token, int pos) override {
        check_tokens(model_.config, &token, 1, pos, context_);
        int* step = host_step_.as<int>();  // the previous step's copy has completed
        step[0] = token;
        step[1] = pos;
        CUDA_CHECK(cudaMemcpyAsync(state_.step, step, 2 * sizeof(int), cudaMemcpyHostToDevice,
                                   stream_.get()));
        if (graph_exec_)
            CUDA_CHECK(cudaGraphLaunch(graph_exec_.get(), stream_.get()));
        else
            record_forward();
        CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
        return host_logits_.as<float>();
    }

    // Batches of up to prefill_batch_ tokens (prefill_batch), or one forward() per token
    // when the backend runs without batched prefill.
    const float* prefill(const int* tokens, int count, int first_pos, bool all_logits) override {
        check_tokens(model_.config, tokens, count, first_pos, context_);
        const size_t vocab = model_.config.vocab_size;
        if (all_logits && size_t(count) * vocab > all_logits_.size())
            throw Error("prefill: every position's logits need BackendOptions::all_logits");
        const float* logits = nullptr;
        if (prefill_batch_ == 0) {
            for (int i = 0; i < count; ++i) {
                logits = forward(tokens[i], first_pos + i);
                if (all_logits) std::copy(logits, logits + vocab, all_logits_.begin() + i * vocab);
            }
            return all_logits ? all_logits_.data() : logits;
        }
        for (int start = 0; start < count; start += prefill_batch_) {
            const int batch = std::min(prefill_batch_, count - start);
            float* logits_out = all_logits ? all_logits_.data() + size_t(start) * vocab : nullptr;
            logits = prefill_batch(tokens + start, batch, first_pos + start, logits_out);
        }
        return all_logits ? all_logits_.data() : logits;
    }

    // A device-to-device copy of up to 1 GiB, best of several, counting bytes read and
    // written: the bandwidth a memory-bound kernel can hope for.
    double measure_bandwidth_gbps() override {
        const size_t free_bytes = free_device_bytes();
        const size_t mib = size_t(1) << 20;
        const size_t bytes =
            std::max(mib, std::min(kBandwidthBufferBytes, free_bytes / 4) / mib * mib);
        DeviceBuffer source(bytes, "the bandwidth test"), target(bytes, "the bandwidth test");
        cudaStream_t stream = stream_.get();
        CUDA_CHECK(cudaMemsetAsync(source.as(), 1, bytes, stream));
        CUDA_CHECK(cudaMemcpyAsync(target.as(), source.as(), bytes, cudaMemcpyDeviceToDevice,
                                   stream));  // warm-up
        const Event start = make_event(), stop = make_event();
        double best = 0;
        for (int pass = 0; pass < kBandwidthPasses; ++pass) {
            CUDA_CHECK(cudaEventRecord(start.get(), stream));
            CUDA_CHECK(
                cudaMemcpyAsync(target.as(), source.as(), bytes, cudaMemcpyDeviceToDevice, stream));
            CUDA_CHECK(cudaEventRecord(stop.get(), stream));
            CUDA_CHECK(cudaEventSynchronize(stop.get()));
            float milliseconds = 0;
            CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start.get(), stop.get()));
            if (milliseconds > 0) best = std::max(best, 2.0 * bytes / (milliseconds * 1e-3) / 1e9);
        }
        return best;
    }

private:
    // The kernel sequence of one token, enqueued on the stream (captured into the graph
    // once, or run directly). Token and position come from state_.step.
    void record_forward() {
        const DeviceState& s = state_;
        const Steps& steps = rung_.steps;
        const StepContext ctx = step_context();
        cuda::embedding(s.x, embedding_, s.step, ctx.stream);

        for (const DeviceLayer& layer : layers_) {
            // Attention: x += wo · attention(rope(wq · norm(x)), rope(wk · norm(x)), wv · norm(x))
            //   (Qwen2: + bq, bk, bv after the projections; Qwen3: each head of q and k
            //    RMS-normed before RoPE; with attention_bias: + bo after wo)
            steps.norm_matvec(ctx, s.qkv, layer.wqkv, s.x, layer.attn_norm, layer.qkv_bias);
            steps.attention(ctx, layer);  // q/k norm, RoPE and the KV-cache write included
            steps.add_matvec(ctx, s.x, layer.wo, s.att, layer.o_bias);

            // Feed-forward: x += w2 · (silu(w1 · norm(x)) * (w3 · norm(x)))
            steps.norm_swiglu(ctx, s.hidden, layer.w1, layer.w3, s.x, layer.ffn_norm);
            steps.add_matvec(ctx, s.x, layer.w2, s.hidden, /*bias=*/nullptr);
        }

        // logits = output · norm(x)
        steps.norm_matvec(ctx, s.logits, output_, s.x, final_norm_, /*bias=*/nullptr);
        copy_logits_to_host();
    }

    // One batch of B tokens at positions first_pos.., the layers as record_forward runs them
    // for one token, on matrices. Writes every row's logits to logits_out [B, vocab] (host
    // memory) if given; returns the last row's.
    const float* prefill_batch(const int* tokens, int B, int first_pos, float* logits_out) {
        const Config& c = model_.config;
        const PrefillState& s = prefill_;
        cudaStream_t stream = stream_.get();
        const int qkv_pitch = c.q_dim() + 2 * c.kv_dim();
        int* host_tokens = host_tokens_.as<int>();  // the previous batch has completed
        std::copy(tokens, tokens + B, host_tokens);
        CUDA_CHECK(cudaMemcpyAsync(s.tokens, host_tokens, B * sizeof(int), cudaMemcpyHostToDevice,
                                   stream));
        const cuda::DeviceActivations normed = first_rows(s.normed, B);
        const cuda::DeviceActivations att = first_rows(s.att, B);
        const cuda::DeviceActivations hidden = first_rows(s.hidden, B);
        cuda::embedding_rows(s.x, embedding_, s.tokens, B, stream);

        AttentionShape shape = attention_shape();  // its window set layer by layer below
        for (const DeviceLayer& layer : layers_) {
            // Attention: x += wo · attention(rope(wq · norm(x)), rope(wk · norm(x)), wv · norm(x))
            //   (the biases, q/k norms and window of the layer where it has them, as decode)
            shape.window = layer.window;
            cuda::rmsnorm_rows(normed, s.x, layer.attn_norm, c.norm_eps, stream);
            cuda::gemm(s.qkv, qkv_pitch, layer.wqkv, normed, layer.qkv_bias, /*accumulate=*/false,
                       stream, s.dequantized);
            cuda::rope_kv_store_rows(s.qkv, qkv_pitch, state_.rope_frequencies, layer.key_cache,
                                     layer.value_cache, first_pos, B, c.heads, c.kv_heads,
                                     c.head_dim, layer.q_norm, layer.k_norm, c.norm_eps, kv_type_,
                                     stream);
            cuda::attention_prefill(att, s.qkv, qkv_pitch, layer.key_cache, layer.value_cache,
                                    first_pos, shape, kv_type_, stream);
            cuda::gemm(s.x, c.dim, layer.wo, att, layer.o_bias, /*accumulate=*/true, stream,
                       s.dequantized);

            // Feed-forward: x += w2 · (silu(w1 · norm(x)) * (w3 · norm(x)))
            cuda::rmsnorm_rows(normed, s.x, layer.ffn_norm, c.norm_eps, stream);
            cuda::gemm_swiglu(hidden, layer.w1, layer.w3, normed, s.gate, s.up, c.hidden_dim,
                              stream, s.dequantized);
            cuda::gemm(s.x, c.dim, layer.w2, hidden, /*bias=*/nullptr, /*accumulate=*/true, stream,
                       s.dequantized);
        }

        // logits = output · norm(x), of every row or of the last; the output matrix's dtype
        // may differ from the layers': its input is a view of the same memory.
        const int first_row = logits_out ? 0 : B - 1, rows = B - first_row;
        cuda::DeviceActivations final_normed = first_rows(s.normed, rows);
        final_normed.dtype = cuda::gemm_input_dtype(output_.dtype);
        final_normed.pitch = cuda::padded_cols(c.dim, final_normed.dtype);
        cuda::rmsnorm_rows(final_normed, s.x + size_t(first_row) * c.dim, final_norm_, c.norm_eps,
                           stream);
        cuda::gemm(s.logits, c.vocab_size, output_, final_normed, /*bias=*/nullptr,
                   /*accumulate=*/false, stream, s.dequantized);
        float* host = logits_out ? logits_out : host_logits_.as<float>();
        CUDA_CHECK(cudaMemcpyAsync(host, s.logits, size_t(rows) * c.vocab_size * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        return host + size_t(rows - 1) * c.vocab_size;
    }

    StepContext step_context() const {
        return {
            stream_.get(), model_.config, state_,  attention_shape(),
            kv_type_,      context_,      splits_, rung_.matvecs,
        };
    }

    void copy_logits_to_host() {
        CUDA_CHECK(cudaMemcpyAsync(host_logits_.as(), state_.logits,
                                   size_t(model_.config.vocab_size) * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_.get()));
    }

    void capture_graph() {
        cudaStream_t stream = stream_.get();
        CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        try {
            record_forward();
        } catch (...) {
            cudaGraph_t broken = nullptr;
            cudaStreamEndCapture(stream, &broken);  // leave the stream usable
            if (broken) cudaGraphDestroy(broken);
            cudaGetLastError();
            throw;
        }
        cudaGraph_t graph = nullptr;
        CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
        graph_.reset(graph);
        cudaGraphExec_t exec = nullptr;
        CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        graph_exec_.reset(exec);
    }

    // The GPU ladder's simple matvecs (rungs 1-3) read f32, f16 and bf16 weights only.
    void check_quantized_rung(const BackendOptions& options) const {
        const CudaKernels kernels = options.cuda_kernels;
        if (kernels == CudaKernels::NaivePort || kernels == CudaKernels::WarpPerRow ||
            kernels == CudaKernels::Fused)
            throw Error(
                "the GPU ladder's simple matvecs (rungs 1-3) read f32, f16 and bf16 "
                "weights, not " +
                model_.config.weight_dtype + ": convert with --dtype f16 for the ladder");
    }

    void check_shape(const cudaDeviceProp& properties) const {
        const Config& c = model_.config;
        if (context_ < 1) throw Error("the CUDA backend needs a context of at least 1 position");
        if (c.head_dim % 2 != 0 || c.head_dim > cuda::kMaxHeadDim)
            throw Error("the CUDA backend supports even head_dim up to " +
                        std::to_string(cuda::kMaxHeadDim) + ", the model has " +
                        std::to_string(c.head_dim));
        if (c.heads % c.kv_heads != 0)
            throw Error("heads (" + std::to_string(c.heads) + ") is not a multiple of kv_heads (" +
                        std::to_string(c.kv_heads) + ")");
        const size_t shared = max_matvec_shared_bytes();
        const size_t static_shared = 1024;  // the matvec kernels' own, with room to spare
        if (shared + static_shared > properties.sharedMemPerBlockOptin)
            throw Error("the CUDA matvec stages a whole input row in shared memory: " +
                        std::to_string(shared) + " bytes for this model, but " + properties.name +
                        " allows " + std::to_string(properties.sharedMemPerBlockOptin) +
                        " per block");
    }

    // The most shared memory a matvec of this model needs (a Q4 file mixes Q4 and F16
    // matrices: each has its own).
    size_t max_matvec_shared_bytes() const {
        size_t bytes = 0;
        for (const Matrix* m : model_.matrices())
            bytes = std::max(bytes, cuda::matvec_shared_bytes(m->cols, m->dtype));
        return bytes;
    }

    bool tied_output() const { return model_.output.data == model_.token_embedding.data; }

    size_t weight_device_bytes() const {
        const Config& c = model_.config;
        size_t bytes = cuda::stacked_bytes({&model_.token_embedding}) +
                       (tied_output() ? 0 : cuda::stacked_bytes({&model_.output})) +
                       size_t(c.dim) * sizeof(float);
        for (const LayerWeights& w : model_.layers)
            bytes += cuda::stacked_bytes({&w.wq, &w.wk, &w.wv}) + cuda::stacked_bytes({&w.wo}) +
                     cuda::stacked_bytes({&w.w1}) + cuda::stacked_bytes({&w.w3}) +
                     cuda::stacked_bytes({&w.w2}) +
                     (2 * size_t(c.dim) + layer_vector_floats(c)) * sizeof(float);
        return bytes;
    }

    size_t cache_bytes() const {
        const Config& c = model_.config;
        return 2 * size_t(c.layers) * context_ * c.kv_dim() * kv_element_bytes(kv_type_);
    }

    // The dtype every layer GEMM of the prefill reads its activations in.
    DType layer_gemm_input() const { return cuda::gemm_input_dtype(model_.layers[0].wq.dtype); }

    // Whether every layer matrix takes the same GEMM input dtype, so that the layers' GEMMs
    // share the activation buffers (true of every file convert writes: a Q4 file's f16
    // matrices take f16 as its Q4 ones do).
    bool layers_share_gemm_input() const {
        for (const LayerWeights& w : model_.layers)
            for (const Matrix* m : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w1, &w.w3, &w.w2})
                if (cuda::gemm_input_dtype(m->dtype) != layer_gemm_input()) return false;
        return true;
    }

    // Bytes of one row of the prefill's GEMM input activations of `cols` columns: in the
    // layers' input dtype, or the output matrix's for the logits (the same memory, `normed`).
    size_t activation_row_bytes(int cols) const {
        size_t bytes = 0;
        for (DType dtype : {layer_gemm_input(), cuda::gemm_input_dtype(model_.output.dtype)})
            bytes = std::max(bytes, size_t(cuda::padded_cols(cols, dtype)) * dtype_size(dtype));
        return bytes;
    }

    // Bytes of PrefillState::dequantized: the largest Q8/Q4 matrix as f16 that gemm takes the
    // warpgroup GEMM for at prefill_batch_ tokens (w1 and w3 count together), or 0. A batch
    // of fewer tokens takes it for no larger matrix.
    size_t dequantize_scratch_bytes(bool all_logits) const {
        const Config& c = model_.config;
        size_t bytes = 0;
        auto consider = [&](const Matrix& m, int rows, int matrices) {
            if (is_quantized(m.dtype) &&
                cuda::gemm_tiles(m.dtype, prefill_batch_, rows) == cuda::GemmTiles::kWarpgroup)
                bytes = std::max(bytes, matrices * cuda::dequantized_bytes(rows, m.cols));
        };
        for (const LayerWeights& w : model_.layers) {
            consider(w.wq, c.q_dim() + 2 * c.kv_dim(), 1);  // wq, wk and wv as one matrix
            consider(w.wo, w.wo.rows, 1);
            consider(w.w1, w.w1.rows, 2);
            consider(w.w2, w.w2.rows, 1);
        }
        if (all_logits) consider(model_.output, model_.output.rows, 1);
        return bytes;
    }

    // Device bytes of the prefill activations (PrefillState) for batches of prefill_batch_.
    size_t prefill_bytes(bool all_logits) const {
        if (prefill_batch_ == 0) return 0;
        const Config& c = model_.config;
        const size_t per_token =
            sizeof(int) + size_t(c.dim) * sizeof(float) + activation_row_bytes(c.dim) +
            (size_t(c.q_dim()) + 2 * c.kv_dim()) * sizeof(float) + activation_row_bytes(c.q_dim()) +
            2 * size_t(c.hidden_dim) * sizeof(float) + activation_row_bytes(c.hidden_dim);
        const size_t logits_rows = all_logits ? prefill_batch_ : 1;
        return per_token * prefill_batch_ + logits_rows * c.vocab_size * sizeof(float);
    }

    // Refuses, naming the sizes, a model that cannot fit rather than failing half-way.
    void check_free_memory(bool all_logits) const {
        const size_t free_bytes = free_device_bytes();
        const size_t weights = weight_device_bytes(), cache = cache_bytes();
        const size_t prefill = prefill_bytes(all_logits);
        if (weights + cache + prefill + kMemoryHeadroom <= free_bytes) return;
        const std::string batches =
            prefill_batch_ > 0 ? " and " + cuda::gib_text(prefill) + " for prefill batches of " +
                                     std::to_string(prefill_batch_) + " tokens"
                               : "";
        throw Error("the model needs " + cuda::gib_text(weights) +
                    " of GPU memory for weights and " + cuda::gib_text(cache) +
                    " for the KV cache of " + std::to_string(context_) + " positions" + batches +
                    ", but only " + cuda::gib_text(free_bytes) +
                    " are free (try a smaller --ctx or --kv f16)");
    }

    void upload_weights() {
        const Config& c = model_.config;
        PinnedBuffer staging(kStagingBytes, "uploading weights");
        auto upload = [&](std::vector<const Matrix*> parts, const std::string& what) {
            memory_.emplace_back();
            return cuda::upload_stacked(parts, memory_.back(), staging, what);
        };
        // `count` floats, or nullptr for a tensor the model does not have.
        auto upload_vector = [&](const float* values, size_t count, const std::string& what) {
            if (!values) return static_cast<const float*>(nullptr);
            memory_.push_back(cuda::upload_floats(values, count, what));
            return memory_.back().as<const float>();
        };
        auto upload_norm = [&](const float* weight, const std::string& what) {
            return upload_vector(weight, c.dim, what);
        };
        embedding_ = upload({&model_.token_embedding}, "token_embedding");
        for (int l = 0; l < c.layers; ++l) {
            const LayerWeights& w = model_.layers[l];
            const std::string prefix = "layers." + std::to_string(l) + ".";
            DeviceLayer layer{};
            layer.attn_norm = upload_norm(w.attn_norm, prefix + "attn_norm");
            layer.wqkv = upload({&w.wq, &w.wk, &w.wv}, prefix + "wq/wk/wv");
            if (c.qkv_bias) {  // stacked as wqkv's rows are
                std::vector<float> bias(w.bq, w.bq + c.q_dim());
                bias.insert(bias.end(), w.bk, w.bk + c.kv_dim());
                bias.insert(bias.end(), w.bv, w.bv + c.kv_dim());
                layer.qkv_bias = upload_vector(bias.data(), bias.size(), prefix + "bq/bk/bv");
            }
            layer.q_norm = upload_vector(w.q_norm, c.head_dim, prefix + "q_norm");
            layer.k_norm = upload_vector(w.k_norm, c.head_dim, prefix + "k_norm");
            layer.wo = upload({&w.wo}, prefix + "wo");
            layer.o_bias = upload_vector(w.bo, c.dim, prefix + "bo");
            layer.ffn_norm = upload_norm(w.ffn_norm, prefix + "ffn_norm");
            layer.w1 = upload({&w.w1}, prefix + "w1");
            layer.w3 = upload({&w.w3}, prefix + "w3");
            layer.w2 = upload({&w.w2}, prefix + "w2");
            layer.window = c.layer_window(l);
            layers_.push_back(layer);
        }
        final_norm_ = upload_norm(model_.final_norm, "final_norm");
        output_ = tied_output() ? embedding_ : upload({&model_.output}, "output");
    }

    void allocate_state() {
        const Config& c = model_.config;
        auto floats = [&](size_t count, const std::string& what) {
            memory_.emplace_back(count * sizeof(float), what);
            CUDA_CHECK(cudaMemset(memory_.back().as(), 0, count * sizeof(float)));
            return memory_.back().as<float>();
        };
        memory_.emplace_back(2 * sizeof(int), "the step parameters");
        state_.step = memory_.back().as<int>();
        CUDA_CHECK(cudaMemset(state_.step, 0, 2 * sizeof(int)));
        state_.x = floats(c.dim, "x");
        state_.qkv = floats(size_t(c.q_dim()) + 2 * size_t(c.kv_dim()), "qkv");
        state_.att = floats(c.q_dim(), "att");
        state_.hidden = floats(c.hidden_dim, "hidden");
        state_.logits = floats(c.vocab_size, "logits");
        state_.partial_out = floats(size_t(c.heads) * splits_ * c.head_dim, "attention partials");
        state_.partial_stats = floats(size_t(c.heads) * splits_ * 2, "attention partials");
        const size_t counters = cuda::attention_arrival_counters(attention_shape());
        memory_.emplace_back(counters * sizeof(unsigned), "the attention arrival counters");
        state_.arrivals = memory_.back().as<unsigned>();
        CUDA_CHECK(cudaMemset(state_.arrivals, 0, counters * sizeof(unsigned)));
        if (rung_.steps.uses_intermediates) {
            state_.normed = floats(c.dim, "normed");
            state_.projected = floats(c.dim, "projected");
            state_.up = floats(c.hidden_dim, "up");
        }
        if (rung_.steps.uses_scores)
            state_.scores = floats(size_t(c.heads) * context_, "attention scores");
        const size_t one_cache = cache_bytes() / 2;
        memory_.emplace_back(one_cache, "the key cache");
        uint8_t* key_cache = memory_.back().as<uint8_t>();
        memory_.emplace_back(one_cache, "the value cache");
        uint8_t* value_cache = memory_.back().as<uint8_t>();
        CUDA_CHECK(cudaMemset(key_cache, 0, one_cache));
        CUDA_CHECK(cudaMemset(value_cache, 0, one_cache));
        const size_t layer_bytes = size_t(context_) * c.kv_dim() * kv_element_bytes(kv_type_);
        for (int l = 0; l < c.layers; ++l) {
            layers_[l].key_cache = key_cache + l * layer_bytes;
            layers_[l].value_cache = value_cache + l * layer_bytes;
        }
        const std::vector<float> frequencies = rope_inverse_frequencies(c);
        memory_.push_back(cuda::upload_floats(frequencies.data(), frequencies.size(), "RoPE"));
        state_.rope_frequencies = memory_.back().as<float>();
    }

    // PrefillState for batches of prefill_batch_ tokens (zeroed: the padding columns of the
    // GEMM inputs stay zero), and the pinned host copy of a batch's token ids.
    void allocate_prefill(bool all_logits) {
        const Config& c = model_.config;
        const int B = prefill_batch_;
        auto bytes = [&](size_t count, const std::string& what) {
            memory_.emplace_back(count, what);
            CUDA_CHECK(cudaMemset(memory_.back().as(), 0, count));
            return memory_.back().as();
        };
        auto floats = [&](size_t count, const std::string& what) {
            return static_cast<float*>(bytes(count * sizeof(float), what));
        };
        auto activations = [&](int cols, const std::string& what) {
            cuda::DeviceActivations a;
            a.dtype = layer_gemm_input();
            a.tokens = B;
            a.cols = cols;
            a.pitch = cuda::padded_cols(cols, a.dtype);
            a.data = bytes(size_t(B) * activation_row_bytes(cols), what);
            return a;
        };
        PrefillState& s = prefill_;
        s.tokens = static_cast<int*>(bytes(size_t(B) * sizeof(int), "the prefill token ids"));
        s.x = floats(size_t(B) * c.dim, "prefill x");
        s.normed = activations(c.dim, "prefill normed");
        s.qkv = floats(size_t(B) * (c.q_dim() + 2 * c.kv_dim()), "prefill qkv");
        s.att = activations(c.q_dim(), "prefill att");
        s.gate = floats(size_t(B) * c.hidden_dim, "prefill gate");
        s.up = floats(size_t(B) * c.hidden_dim, "prefill up");
        s.hidden = activations(c.hidden_dim, "prefill hidden");
        s.logits = floats(size_t(all_logits ? B : 1) * c.vocab_size, "prefill logits");
        // Where the GPU has room for it after everything else: without it, the quantized tiles
        // multiply Q8/Q4 weights (no model is refused for want of it).
        const size_t dequantized_bytes = dequantize_scratch_bytes(all_logits);
        const size_t free_bytes = free_device_bytes();
        if (dequantized_bytes > 0 && dequantized_bytes + kMemoryHeadroom <= free_bytes)
            s.dequantized = {bytes(dequantized_bytes, "prefill f16 weights"), dequantized_bytes};
        host_tokens_ = PinnedBuffer(size_t(B) * sizeof(int), "the prefill token ids");
    }

    // The shape of every layer's attention, with the window of the layer that attends to the
    // most positions (0 when one attends to all): what the split count is chosen for. Each
    // layer attends with its own window (DeviceLayer::window).
    AttentionShape attention_shape() const {
        const Config& c = model_.config;
        int widest = c.layer_window(0);
        for (int l = 1; l < c.layers; ++l) {
            const int window = c.layer_window(l);
            widest = widest == 0 || window == 0 ? 0 : std::max(widest, window);
        }
        return AttentionShape{c.heads, c.kv_heads, c.head_dim, widest};
    }

    const Model& model_;
    const int context_;
    const KvType kv_type_;
    const RungKernels rung_;  // the kernels of each step
    int splits_ = 1;          // attention blocks per KV head, fixed for the context
    int prefill_batch_ = 0;   // tokens per prefill batch; 0: prefill runs token by token
    // Declared before everything that uses it: destroyed last.
    Stream stream_;
    std::vector<DeviceBuffer> memory_;  // every device allocation (weights, state, cache)
    DeviceMatrix embedding_;            // [vocab_size, dim]
    std::vector<DeviceLayer> layers_;
    const float* final_norm_ = nullptr;  // [dim]
    DeviceMatrix output_;                // [vocab_size, dim]; the embedding when tied
    DeviceState state_{};
    PrefillState prefill_{};
    PinnedBuffer host_tokens_;       // [prefill_batch_]  a batch's token ids, copied to prefill_
    PinnedBuffer host_step_;         // [2]  {token, pos}, copied to state_.step before each step
    PinnedBuffer host_logits_;       // [vocab_size]  what forward() returns
    std::vector<float> all_logits_;  // [context, vocab_size] with BackendOptions::all_logits
    Graph graph_;
    GraphExec graph_exec_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const Model& model, const BackendOptions& options) {
    return std::make_unique<CudaBackend>(model, options);
}

bool cuda_device_available(std::string* reason) {
    auto unavailable = [&](const std::string& why) {
        if (reason) *reason = why;
        return false;
    };
    // The CUDA runtime loads the driver library itself; trying first gives a plain message
    // for the common case of a machine without an NVIDIA driver.
    if (void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL))
        dlclose(driver);
    else
        return unavailable("no NVIDIA GPU driver found (libcuda.so.1 cannot be loaded)");
    int count = 0;
    cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
        cudaGetLastError();
        return unavailable(std::string("no usable CUDA GPU: ") + cudaGetErrorString(status));
    }
    if (count == 0) return unavailable("no CUDA GPU found");
    cudaDeviceProp properties;
    status = cudaGetDeviceProperties(&properties, 0);
    if (status != cudaSuccess) {
        cudaGetLastError();
        return unavailable(std::string("cannot query the GPU: ") + cudaGetErrorString(status));
    }
    const std::string arch = std::to_string(properties.major) + std::to_string(properties.minor);
    if (properties.major * 10 + properties.minor < 75)
        return unavailable(std::string(properties.name) + " has compute capability " +
                           std::to_string(properties.major) + "." +
                           std::to_string(properties.minor) +
                           "; barellm's CUDA kernels need 7.5 or newer");
    status = cudaSetDevice(0);
    if (status == cudaSuccess) status = cuda::kernel_image_status();
    if (status != cudaSuccess) {
        cudaGetLastError();
        return unavailable(std::string("this barellm has no kernels for ") + properties.name +
                           " (sm_" + arch + "): rebuild with CUDA_ARCHS including " + arch + " (" +
                           cudaGetErrorString(status) + ")");
    }
    return true;
}

}  // namespace barellm
