// The CUDA forward pass: one token through the Llama transformer on the GPU, top to bottom
// like src/cpu/forward.cpp, every kernel our own (kernels/*.cuh, launched through
// kernels.h). Weights are uploaded once; activations are f32; the KV cache is f16 or f32.
// The kernel sequence of one token is captured once as a CUDA graph and replayed for every
// token: the token id and the position live in a small device buffer (`step`) that the host
// overwrites before each replay, and no kernel's launch shape depends on them. One
// synchronisation per token, after the logits reach pinned host memory.
//
// VERIFICATION STATUS:
//   verified:   kernels/ and this file compile warning-free with nvcc 13.0 (host g++ 12,
//               -Wall -Wextra) for sm_75, sm_80, sm_86, sm_89, sm_90 plus compute_90 PTX;
//               ptxas reports no register spills (rope_kv_kernel keeps a 40-byte stack
//               frame for the double-precision sincos); without a CUDA driver,
//               `barellm run ... --device cuda` prints one line and exits 1, and the GPU
//               tests skip with that reason; the CPU-only build (make CUDA=0) still works.
//               On one GPU, an H100 80GB HBM3 (sm_90, built with CUDA_ARCHS=90), on
//               2026-11-22 with dev/gpu/gpu_session.sh at commit b0e3489: every kernel,
//               fast and simple, matches the CPU kernels (build/cuda_kernel_check), the
//               logits match the CPU backend's (tests/test_cuda.py, graph replay included)
//               and those of Hugging Face transformers on three synthetic checkpoints, and
//               every rung of the GPU ladder gives the fast path's greedy text
//               (tests/test_ladder.py).
//   NOT verified: any other GPU or architecture (sm_75 to sm_89 are compiled, never run).
//   Speed on that H100: docs/BENCHMARKS.md (7B f16 decode at 85% of the copy bandwidth,
//               83% at 4096 positions).
//
// The GPU ladder (`barellm ladder --device cuda`, src/ladder.cpp) runs this backend with
// simpler kernels (BackendOptions::cuda_kernels: record_forward_unfused for the first two
// rungs, then the member functions matvec, matvec_swiglu and attention pick the kernels),
// without the graph (cuda_graph) or without the attention split (flash_decoding).
//
// Debugging knob: BARELLM_CUDA_GRAPHS=0 in the environment launches the kernels directly
// on the stream for every token instead of replaying the captured graph.
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

namespace barellm {

namespace {

using cuda::DeviceBuffer;
using cuda::DeviceMatrix;
using cuda::PinnedBuffer;

constexpr size_t kStagingBytes = size_t(64) << 20;         // upload chunk (pinned)
constexpr size_t kBandwidthBufferBytes = size_t(1) << 30;  // 1 GiB: far beyond any L2
constexpr int kBandwidthPasses = 10;
constexpr size_t kMemoryHeadroom = size_t(256) << 20;  // left free for the CUDA context etc.

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

// One layer's weights in device memory.
struct DeviceLayer {
    const float* attn_norm;  // [dim]
    DeviceMatrix wqkv;       // [heads * head_dim + 2 * kv_heads * head_dim, dim]: wq, wk, wv
    DeviceMatrix wo;         // [dim, heads * head_dim]
    const float* ffn_norm;   // [dim]
    DeviceMatrix w1;         // [hidden_dim, dim]  gate
    DeviceMatrix w3;         // [hidden_dim, dim]  up
    DeviceMatrix w2;         // [dim, hidden_dim]  down
};

// Every activation buffer and the KV cache, in device memory, allocated once.
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
    float* normed;            // [dim]  rmsnorm(x) (unfused kernels only)
    float* projected;         // [dim]  wo · att or w2 · hidden, before the residual add (same)
    float* up;                // [hidden_dim]  w3 · norm(x) (same)
    float* scores;            // [heads, context]  attention_naive's scores (naive attention only)
    void* key_cache;          // [layers, context, kv_dim] of kv_type
    void* value_cache;        // [layers, context, kv_dim] of kv_type
    float* rope_frequencies;  // [head_dim / 2]
};

class CudaBackend : public Backend {
public:
    CudaBackend(const Model& model, const BackendOptions& options)
        : model_(model),
          context_(options.context),
          kv_type_(options.kv_type),
          kernels_(options.cuda_kernels) {
        const Config& c = model.config;
        CUDA_CHECK(cudaSetDevice(0));
        cudaDeviceProp properties;
        CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
        check_shape(properties);
        if (options.flash_decoding)
            splits_ =
                cuda::attention_splits(attention_shape(), context_, properties.multiProcessorCount);

        cudaStream_t stream = nullptr;
        CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        stream_.reset(stream);

        check_free_memory();
        upload_weights();
        allocate_state();
        host_step_ = PinnedBuffer(2 * sizeof(int), "the step parameters");
        host_logits_ = PinnedBuffer(size_t(c.vocab_size) * sizeof(float), "the logits");
        cuda::prepare_matvec(max_matvec_shared_bytes());
        // The uploads and memsets above ran on the legacy default stream, which does not
        // order itself with our non-blocking stream: let them finish before any kernel runs.
        CUDA_CHECK(cudaDeviceSynchronize());

        const char* graphs = std::getenv("BARELLM_CUDA_GRAPHS");
        if (options.cuda_graph && !(graphs && std::strcmp(graphs, "0") == 0)) capture_graph();
    }

    std::string name() const override { return "cuda"; }

    // prefill runs forward() one token at a time (batched GPU prefill is a later issue),
    // so a "batch" is one token, and the weights are read once per token.
    int max_batch() const override { return 1; }

    size_t kv_bytes_read(int pos) const override {
        const Config& c = model_.config;
        const size_t positions = pos + 1 - attention_start(pos, c.sliding_window);
        return 2 * size_t(c.layers) * positions * c.kv_dim() * kv_element_bytes(kv_type_);
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

    // One forward() per token for now: batched GPU prefill is a later issue.
    const float* prefill(const int* tokens, int count, int first_pos, bool all_logits) override {
        check_tokens(model_.config, tokens, count, first_pos, context_);
        const size_t vocab = model_.config.vocab_size;
        if (all_logits) all_logits_.resize(size_t(count) * vocab);
        const float* logits = nullptr;
        for (int i = 0; i < count; ++i) {
            logits = forward(tokens[i], first_pos + i);
            if (all_logits) std::copy(logits, logits + vocab, all_logits_.begin() + i * vocab);
        }
        return all_logits ? all_logits_.data() : logits;
    }

    // A device-to-device copy of up to 1 GiB, best of several, counting bytes read and
    // written: the bandwidth a memory-bound kernel can hope for.
    double measure_bandwidth_gbps() override {
        size_t free_bytes = 0, total_bytes = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
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
        if (kernels_ < CudaKernels::Fused) return record_forward_unfused();
        const Config& c = model_.config;
        const DeviceState& s = state_;
        cudaStream_t stream = stream_.get();
        cuda::embedding(s.x, embedding_, s.step, stream);

        for (int l = 0; l < c.layers; ++l) {
            const DeviceLayer& w = layers_[l];
            // Attention: x += wo · attention(rope(wq · norm(x)), rope(wk · norm(x)), wv · norm(x))
            matvec(s.qkv, w.wqkv, s.x, w.attn_norm, /*accumulate=*/false);
            attention(l);  // RoPE and the KV-cache write of this position included
            matvec(s.x, w.wo, s.att, nullptr, /*accumulate=*/true);

            // Feed-forward: x += w2 · (silu(w1 · norm(x)) * (w3 · norm(x)))
            matvec_swiglu(s.hidden, w.w1, w.w3, s.x, w.ffn_norm);
            matvec(s.x, w.w2, s.hidden, nullptr, /*accumulate=*/true);
        }

        // logits = output · norm(x)
        matvec(s.logits, output_, s.x, final_norm_, /*accumulate=*/false);
        copy_logits_to_host();
    }

    // The same token with every step its own kernel, as the CPU runs it (the GPU ladder's
    // rungs 1-2): a thread or a warp per matrix row, RMSNorm, RoPE, the KV write, the
    // residual adds and SwiGLU apart, every intermediate through global memory.
    void record_forward_unfused() {
        const Config& c = model_.config;
        const DeviceState& s = state_;
        cudaStream_t stream = stream_.get();
        const float eps = c.norm_eps;
        cuda::embedding(s.x, embedding_, s.step, stream);

        for (int l = 0; l < c.layers; ++l) {
            const DeviceLayer& w = layers_[l];
            cuda::rmsnorm(s.normed, s.x, w.attn_norm, c.dim, eps, stream);
            plain_matvec(s.qkv, w.wqkv, s.normed);  // q, k, v
            cuda::rope(s.qkv, s.rope_frequencies, s.step, c.heads, c.kv_heads, c.head_dim, stream);
            const float* k = s.qkv + c.q_dim();
            cuda::store_kv_row(k, k + c.kv_dim(), cache_layer(s.key_cache, l),
                               cache_layer(s.value_cache, l), s.step, c.kv_dim(), kv_type_, stream);
            naive_attention(l);
            plain_matvec(s.projected, w.wo, s.att);
            cuda::residual_add(s.x, s.projected, c.dim, stream);

            cuda::rmsnorm(s.normed, s.x, w.ffn_norm, c.dim, eps, stream);
            plain_matvec(s.hidden, w.w1, s.normed);  // gate
            plain_matvec(s.up, w.w3, s.normed);
            cuda::swiglu(s.hidden, s.up, c.hidden_dim, stream);
            plain_matvec(s.projected, w.w2, s.hidden);
            cuda::residual_add(s.x, s.projected, c.dim, stream);
        }

        cuda::rmsnorm(s.normed, s.x, final_norm_, c.dim, eps, stream);
        plain_matvec(s.logits, output_, s.normed);
        copy_logits_to_host();
    }

    // out = W · norm(in), or out += W · in with accumulate: the fast matvec from rung
    // FastMatvec on, the warp-per-row one before.
    void matvec(float* out, const DeviceMatrix& w, const float* in, const float* norm_weight,
                bool accumulate) {
        const float eps = model_.config.norm_eps;
        if (kernels_ >= CudaKernels::FastMatvec)
            cuda::matvec(out, w, in, norm_weight, eps, accumulate, stream_.get());
        else
            cuda::matvec_warp_per_row(out, w, in, norm_weight, eps, accumulate, stream_.get());
    }

    // out = silu(w1 · norm(in)) * (w3 · norm(in)), chosen as matvec is.
    void matvec_swiglu(float* out, const DeviceMatrix& w1, const DeviceMatrix& w3, const float* in,
                       const float* norm_weight) {
        const float eps = model_.config.norm_eps;
        if (kernels_ >= CudaKernels::FastMatvec)
            cuda::matvec_swiglu(out, w1, w3, in, norm_weight, eps, stream_.get());
        else
            cuda::matvec_swiglu_warp_per_row(out, w1, w3, in, norm_weight, eps, stream_.get());
    }

    // out = W · in, nothing fused (rungs 1-2): a thread per row, then a warp per row.
    void plain_matvec(float* out, const DeviceMatrix& w, const float* in) {
        if (kernels_ == CudaKernels::NaivePort)
            cuda::matvec_thread_per_row(out, w, in, stream_.get());
        else
            cuda::matvec_warp_per_row(out, w, in, nullptr, 0.0f, /*accumulate=*/false,
                                      stream_.get());
    }

    // att = attention of rope(q) over layer `layer`'s cache, after row pos of the cache has
    // received rope(k) and v (q, k, v: the qkv matvec's output). From rung Fast on, one
    // kernel does all of it (flash-decoding, RoPE and the cache write folded in); before,
    // rope_kv_store rotates q in place and writes the cache row, then the naive kernel.
    void attention(int layer) {
        const Config& c = model_.config;
        const DeviceState& s = state_;
        void* keys = cache_layer(s.key_cache, layer);
        void* values = cache_layer(s.value_cache, layer);
        if (kernels_ >= CudaKernels::Fast) {
            cuda::attention(s.att, s.qkv, s.rope_frequencies, keys, values, s.step, s.partial_out,
                            s.partial_stats, s.arrivals, attention_shape(), splits_, kv_type_,
                            stream_.get());
        } else {
            cuda::rope_kv_store(s.qkv, s.rope_frequencies, keys, values, s.step, c.heads,
                                c.kv_heads, c.head_dim, kv_type_, stream_.get());
            naive_attention(layer);
        }
    }

    // att = attention of q (rotated already) over layer `layer`'s cache (row pos written).
    void naive_attention(int layer) {
        const DeviceState& s = state_;
        cuda::attention_naive(s.att, s.qkv, cache_layer(s.key_cache, layer),
                              cache_layer(s.value_cache, layer), s.step, s.scores, context_,
                              attention_shape(), kv_type_, stream_.get());
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

    void check_shape(const cudaDeviceProp& properties) const {
        const Config& c = model_.config;
        if (model_.token_embedding.dtype == DType::I8)
            throw Error(
                "the CUDA backend does not run Q8 weights yet: convert with --dtype "
                "f16, bf16 or f32");
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

    size_t max_matvec_shared_bytes() const {
        const Config& c = model_.config;
        const DType dtype = model_.token_embedding.dtype;
        int pitch = 0;
        for (int cols : {c.dim, c.q_dim(), c.hidden_dim})
            pitch = std::max(pitch, cuda::padded_cols(cols, dtype));
        return cuda::matvec_shared_bytes(pitch);
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
                     cuda::stacked_bytes({&w.w2}) + 2 * size_t(c.dim) * sizeof(float);
        return bytes;
    }

    size_t cache_bytes() const {
        const Config& c = model_.config;
        return 2 * size_t(c.layers) * context_ * c.kv_dim() * kv_element_bytes(kv_type_);
    }

    // Refuses, naming the sizes, a model that cannot fit rather than failing half-way.
    void check_free_memory() const {
        size_t free_bytes = 0, total_bytes = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
        const size_t weights = weight_device_bytes(), cache = cache_bytes();
        if (weights + cache + kMemoryHeadroom > free_bytes)
            throw Error("the model needs " + cuda::gib_text(weights) +
                        " of GPU memory for weights and " + cuda::gib_text(cache) +
                        " for the KV cache of " + std::to_string(context_) +
                        " positions, but only " + cuda::gib_text(free_bytes) +
                        " are free (try a smaller --ctx or --kv f16)");
    }

    void upload_weights() {
        const Config& c = model_.config;
        PinnedBuffer staging(kStagingBytes, "uploading weights");
        auto upload = [&](std::vector<const Matrix*> parts, const std::string& what) {
            memory_.emplace_back();
            return cuda::upload_stacked(parts, memory_.back(), staging, what);
        };
        auto upload_norm = [&](const float* weight, const std::string& what) {
            memory_.push_back(cuda::upload_floats(weight, c.dim, what));
            return memory_.back().as<const float>();
        };
        embedding_ = upload({&model_.token_embedding}, "token_embedding");
        for (int l = 0; l < c.layers; ++l) {
            const LayerWeights& w = model_.layers[l];
            const std::string prefix = "layers." + std::to_string(l) + ".";
            DeviceLayer layer;
            layer.attn_norm = upload_norm(w.attn_norm, prefix + "attn_norm");
            layer.wqkv = upload({&w.wq, &w.wk, &w.wv}, prefix + "wq/wk/wv");
            layer.wo = upload({&w.wo}, prefix + "wo");
            layer.ffn_norm = upload_norm(w.ffn_norm, prefix + "ffn_norm");
            layer.w1 = upload({&w.w1}, prefix + "w1");
            layer.w3 = upload({&w.w3}, prefix + "w3");
            layer.w2 = upload({&w.w2}, prefix + "w2");
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
        if (kernels_ < CudaKernels::Fused) {
            state_.normed = floats(c.dim, "normed");
            state_.projected = floats(c.dim, "projected");
            state_.up = floats(c.hidden_dim, "up");
        }
        if (kernels_ < CudaKernels::Fast)
            state_.scores = floats(size_t(c.heads) * context_, "attention scores");
        const size_t one_cache = cache_bytes() / 2;
        memory_.emplace_back(one_cache, "the key cache");
        state_.key_cache = memory_.back().as();
        memory_.emplace_back(one_cache, "the value cache");
        state_.value_cache = memory_.back().as();
        CUDA_CHECK(cudaMemset(state_.key_cache, 0, one_cache));
        CUDA_CHECK(cudaMemset(state_.value_cache, 0, one_cache));
        const std::vector<float> frequencies = rope_inverse_frequencies(c);
        memory_.push_back(cuda::upload_floats(frequencies.data(), frequencies.size(), "RoPE"));
        state_.rope_frequencies = memory_.back().as<float>();
    }

    AttentionShape attention_shape() const {
        const Config& c = model_.config;
        return AttentionShape{c.heads, c.kv_heads, c.head_dim, c.sliding_window};
    }

    // Layer `layer`'s part [context, kv_dim] of a cache.
    void* cache_layer(void* cache, int layer) const {
        const size_t layer_bytes =
            size_t(context_) * model_.config.kv_dim() * kv_element_bytes(kv_type_);
        return static_cast<uint8_t*>(cache) + layer * layer_bytes;
    }

    const Model& model_;
    const int context_;
    const KvType kv_type_;
    const CudaKernels kernels_;
    int splits_ = 1;  // attention blocks per KV head, fixed for the context
    // Declared before everything that uses it: destroyed last.
    Stream stream_;
    std::vector<DeviceBuffer> memory_;  // every device allocation (weights, state, cache)
    DeviceMatrix embedding_;            // [vocab_size, dim]
    std::vector<DeviceLayer> layers_;
    const float* final_norm_ = nullptr;  // [dim]
    DeviceMatrix output_;                // [vocab_size, dim]; the embedding when tied
    DeviceState state_{};
    PinnedBuffer host_step_;         // [2]  {token, pos}, copied to state_.step before each step
    PinnedBuffer host_logits_;       // [vocab_size]  what forward() returns
    std::vector<float> all_logits_;  // [count, vocab_size] when prefill asks for every row
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
