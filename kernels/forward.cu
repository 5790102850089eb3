// The CUDA backend: tokens through the Llama transformer on the GPU (with Qwen2's q/k/v
// biases, Qwen3's per-head q/k norms and per-layer sliding windows where the model has them,
// Gemma 3's scaled embeddings, post norms, GeGLU and local RoPE, and gpt-oss's attention
// sinks, clamped SwiGLU and biased router and experts), step by step as
// src/cpu/forward.cpp runs them, with the kernels of kernels/*.cuh (launched through
// kernels.h).
//
// - Weights (f32, f16, bf16, Q8, Q4, or ggml's block types: Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K,
//   Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, the i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S,
//   IQ1_M, and TQ1_0, TQ2_0) are uploaded once, each matrix in its own type; decode activations
//   are f32; the KV cache is f16 or f32. Q8/Q4 matrices run through the int8 matvecs of
//   matvec_quantized.cuh in decode (kernels.h: matvec and matvec_swiglu dispatch on the dtype)
//   and through the GEMM's quantized tensor-core kernel in prefill; block-type matrices through
//   matvec_blocks.cuh in decode and, dequantized to f16 first, through the f16 GEMM in prefill.
// - Per-matrix types: wq, wk and wv are stacked into one matrix where they share a type
//   (every uniform file), else into runs of one type, each its own matvec or GEMM writing
//   its rows of qkv; w1 and w3 of different types run as two products and a SwiGLU step.
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
// - The GPU ladder (`barellm ladder --device cuda`, src/commands/ladder.cpp) runs this backend with
//   the switches of BackendOptions: its rungs 1-4 decode with simpler kernels
//   (ladder_forward.cu: LadderForward, chosen by cuda_kernels), rungs 5-8 with
//   record_forward's, without the graph (cuda_graph) or without the attention split
//   (flash_decoding).
// - The server's step (CudaBackend::step; BackendOptions::kv_blocks > 0): the KV cache is a
//   pool of blocks per layer instead of one row per position; each row of a step is one token
//   of some sequence at its own position. The step runs as a prefill batch does (the
//   projections on the GEMMs), with RoPE and the cache writes through each row's block table
//   (rope_kv_store_paged) and flash-decoding over the blocks (attention_paged.cuh); the
//   positions, block tables and the rows that want logits are uploaded once per step. A
//   sparse layer routes every row on the device and runs the expert matvecs over each
//   (row, expert) route, as decode does for one token (no grouping by expert, which would
//   wait on the host). The layers replay a CUDA graph per bucket of row counts (the rows
//   padded to the bucket), the logits of the rows that want them follow outside it.
// - Debugging knob: BARELLM_CUDA_GRAPHS=0 in the environment launches the kernels directly
//   on the stream for every token (and every server step) instead of replaying the
//   captured graphs.
// - BARELLM_CUDA_PDL=1 (sm_90 and later) lets each decode matvec and the attention start
//   while the kernel ahead of it ends, its weight prefetch overlapping that kernel's tail
//   (dependent_launch.cuh); off by default.
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
#include "device_model.h"
#include "expert_groups.h"
#include "kernels.h"
#include "ladder_forward.h"
#include "util/error.h"
#include "util/memory.h"

namespace barellm {

namespace {

using cuda::DeviceBuffer;
using cuda::DeviceLayer;
using cuda::DeviceMatrix;
using cuda::DeviceState;
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

// The activations of a prefill batch of B <= CudaBackend::prefill_batch_ tokens, one row
// per token, allocated once for the largest batch (the DeviceActivations' tokens field is
// that size; a batch uses its first B rows).
struct PrefillState {
    int* tokens;                     // [B]  the batch's token ids
    float* x;                        // [B, dim]  residual stream
    cuda::DeviceActivations normed;  // [B, dim]  rmsnorm(x), the GEMMs' input
    float* qkv;                      // [B, q_dim + 2 * kv_dim]  q (rotated in place), k, v
    cuda::DeviceActivations att;     // [B, q_dim]  attention output, wo's input
    float* projected;                // [B, dim]  wo's or w2's output before its post norm
                                     // (post_norms; else null)
    float* gate;                     // [B, hidden_dim]  w1 · normed
    float* up;                       // [B, hidden_dim]  w3 · normed
    cuda::DeviceActivations hidden;  // [B, hidden_dim]  act(gate) * up, w2's input
    float* logits;                   // [B, vocab_size] with all_logits, else [1, vocab_size]
    // Q8/Q4 weights dequantized to f16 for the warpgroup GEMM (kernels.h: DequantizeScratch),
    // the largest matrix it takes at B tokens (w1 and w3 together); empty where none does or
    // the GPU has no room for it. Block-type weights always take it (every product of theirs
    // multiplies their f16 copy): for them it is allocated, and counted, with the rest.
    cuda::DequantizeScratch dequantized;
    // A sparse layer's (models with experts; else null), routes = B * experts_per_token: the
    // router's input (f32, as the CPU's) and logits, each token's routes, and the routes
    // grouped by expert (expert e's first, in token order: prefill_experts).
    cuda::DeviceActivations router_input;    // [B, dim] f32  rmsnorm(x)
    float* router_logits;                    // [B, experts]
    int* chosen;                             // [routes]  token t's j-th expert at t * k + j
    float* route_weights;                    // [routes]  its weight
    int* route_rows;                         // [2 * routes]  each route's grouped row, then
                                             // each grouped row's token
    float* grouped_x;                        // [routes, dim]  x of each grouped row's token
    cuda::DeviceActivations grouped_normed;  // [routes, dim]  rmsnorm(grouped_x), the GEMM input
    float* expert_gate;                      // [routes, moe_hidden_dim]  w1_e · normed
    float* expert_up;                        // [routes, moe_hidden_dim]  w3_e · normed
    cuda::DeviceActivations expert_hidden;   // [routes, moe_hidden_dim]  act(gate) * up
    float* expert_out;                       // [routes, dim]  w2_e · hidden
};

// What a server step (CudaBackend::step) needs besides PrefillState, for steps of up to B
// rows: its rows' token ids, positions and block tables, the rows that want logits, and the
// attention's partials.
struct StepState {
    int* rows;  // [3 * B + B * table_stride]: StepRowsLayout
    // The f32 inputs of the batched matvec (steps below kStepGemmRows rows), each row padded
    // with zeros to whole blocks of kQuantizedBlock columns:
    cuda::DeviceActivations normed;  // [kStepGemmRows, dim]  rmsnorm(x)
    cuda::DeviceActivations att;     // [kStepGemmRows, q_dim]  attention output
    cuda::DeviceActivations hidden;  // [kStepGemmRows, hidden_dim]  act(gate) * up
    float* wanting_x;                // [B, dim]  x of the rows that want logits
    // A sparse model's (else null): the expert matvecs' outputs for B * experts_per_token
    // routes, rows expert_hidden_pitch apart (the w2 matvec's 16-byte aligned input).
    float* expert_gate;    // [routes, expert_hidden_pitch]  w1_e · norm(x), then act(gate) * up
    float* expert_up;      // [routes, expert_hidden_pitch]  w3_e · norm(x)
    float* partial_out;    // [partial_rows, heads * head_dim]  attention_paged's runs
    float* partial_stats;  // [partial_rows, heads * 2]
};

// Where a step's row data lie in StepState::rows (and its pinned host copy), for steps of up
// to B rows: token ids, positions, the indices of the rows that want logits, block tables.
struct StepRowsLayout {
    int B, table_stride;
    int tokens() const { return 0; }
    int positions() const { return B; }
    int logit_rows() const { return 2 * B; }
    int tables() const { return 3 * B; }
    size_t ints(int rows) const { return size_t(tables()) + size_t(rows) * table_stride; }
};

// Rows of attention_paged's partials StepState holds: with B rows, B runs / row or more.
constexpr int kPagedPartialRows = 1024;
// A step of this many rows or more multiplies on the GEMMs (whose tensor-core tiles it
// fills); fewer, on the batched matvec, which reads each weight once for all of them.
constexpr int kStepGemmRows = cuda::kMatvecRowsMax;

// Columns of a batched matvec input row of `cols` columns: whole blocks of kQuantizedBlock.
int matvec_rows_pitch(int cols) {
    return (cols + cuda::kQuantizedBlock - 1) / cuda::kQuantizedBlock * cuda::kQuantizedBlock;
}

// The first `tokens` rows of `rows`.
cuda::DeviceActivations first_rows(cuda::DeviceActivations rows, int tokens) {
    rows.tokens = tokens;
    return rows;
}

// Rows first .. first + tokens - 1 of `rows`.
cuda::DeviceActivations rows_from(cuda::DeviceActivations rows, int first, int tokens) {
    rows.data =
        static_cast<uint8_t*>(rows.data) + size_t(first) * rows.pitch * dtype_size(rows.dtype);
    rows.tokens = tokens;
    return rows;
}

// Floats per row of a decode expert's hidden activations (16-byte aligned rows, the expert
// matvecs' input).
int expert_hidden_pitch(const Config& c) { return cuda::padded_cols(c.moe_hidden_dim, DType::F32); }

class CudaBackend : public Backend {
public:
    CudaBackend(const Model& model, const BackendOptions& options)
        : model_(model),
          context_(options.context),
          kv_type_(options.kv_type),
          kv_blocks_(options.kv_blocks),
          kv_block_size_(options.kv_block_size) {
        const Config& c = model.config;
        cuda::check_ladder_model(options.cuda_kernels, c);
        CUDA_CHECK(cudaSetDevice(0));
        cudaDeviceProp properties;
        CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
        check_shape(properties);
        cuda::warpgroup_gemm_use();  // a wrong BARELLM_CUDA_WGMMA stops here, before the upload
        cuda::dependent_launch_enabled();  // and a wrong BARELLM_CUDA_PDL
        if (options.flash_decoding)
            splits_ =
                cuda::attention_splits(attention_shape(), context_, properties.multiProcessorCount);
        // Batched prefill with the fast kernels; the GPU ladder's simpler rungs, a head size
        // whose attention tiles exceed the GPU's shared memory and a model whose layer
        // matrices take different GEMM input dtypes prefill token by token. The paged cache's
        // step runs on the batched kernels (but for attention_prefill) or not at all, its rows
        // from several sequences (not bounded by one sequence's context).
        const bool batched = options.cuda_kernels == CudaKernels::Fast && layers_share_gemm_input();
        if (batched && (paged() || cuda::attention_prefill_shared_bytes(c.head_dim) <=
                                       properties.sharedMemPerBlockOptin))
            prefill_batch_ = paged() ? kMaxBatch : std::min(context_, kMaxBatch);
        if (kv_blocks_ != 0) check_paged(batched);

        cudaStream_t stream = nullptr;
        CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        stream_.reset(stream);

        check_free_memory(options.all_logits);
        upload_weights();
        allocate_state();
        if (options.cuda_kernels != CudaKernels::Fast)
            ladder_ = std::make_unique<cuda::LadderForward>(options.cuda_kernels, c, weights_,
                                                            state_, kv_type_, context_);
        if (prefill_batch_ > 0) allocate_prefill(options.all_logits || paged());
        if (paged()) allocate_step();
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
        if (options.cuda_graph && !(graphs && std::strcmp(graphs, "0") == 0)) {
            if (paged())
                make_step_buckets();
            else
                capture([&] { record_token(); }, &graph_, &graph_exec_);
        }
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
        refuse_if_paged("forward");
        check_tokens(model_.config, &token, 1, pos, context_);
        int* step = host_step_.as<int>();  // the previous step's copy has completed
        step[0] = token;
        step[1] = pos;
        CUDA_CHECK(cudaMemcpyAsync(state_.step, step, 2 * sizeof(int), cudaMemcpyHostToDevice,
                                   stream_.get()));
        if (graph_exec_)
            CUDA_CHECK(cudaGraphLaunch(graph_exec_.get(), stream_.get()));
        else
            record_token();
        CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
        return host_logits_.as<float>();
    }

    // Batches of up to prefill_batch_ tokens (prefill_batch), or one forward() per token
    // when the backend runs without batched prefill.
    const float* prefill(const int* tokens, int count, int first_pos, bool all_logits) override {
        refuse_if_paged("prefill");
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

    // The server's step over the paged KV cache: rows[0..count) as one batch, the layers as
    // prefill_batch runs them, each row at its own position with its own block table.
    const float* step(const StepRow* rows, int count) override {
        if (!paged())
            throw Error(
                "step needs a CUDA backend made with a paged KV cache "
                "(BackendOptions::kv_blocks)");
        if (count < 1 || count > prefill_batch_)
            throw Error("step: " + std::to_string(count) + " rows, but a step holds 1 to " +
                        std::to_string(prefill_batch_));
        const Config& c = model_.config;
        const PrefillState& s = prefill_;
        cudaStream_t stream = stream_.get();
        // With graphs, the step runs as its bucket's row count (padding rows after the real
        // ones), its attention split as for the longest context; without, as it comes.
        const int bucket = step_bucket(count);
        const int run_rows = bucket >= 0 ? step_buckets_[bucket].rows : count;
        const int wanting = upload_step_rows(rows, count, run_rows);
        int longest = context_;  // positions, before any window
        if (bucket < 0) {
            longest = 0;
            for (int t = 0; t < count; ++t) longest = std::max(longest, rows[t].pos + 1);
        }
        const int splits = cuda::attention_paged_splits(run_rows, longest, kPagedPartialRows);
        if (bucket < 0) {
            record_step_layers(run_rows, splits);
        } else {
            StepGraph& graph = step_buckets_[bucket];
            if (graph.exec) {
                CUDA_CHECK(cudaGraphLaunch(graph.exec.get(), stream));
            } else if (!graph.seen) {  // the first time: directly (kernels opt in to memory)
                record_step_layers(run_rows, splits);
                graph.seen = true;
            } else {
                capture([&] { record_step_layers(run_rows, splits); }, &graph.graph, &graph.exec);
                CUDA_CHECK(cudaGraphLaunch(graph.exec.get(), stream));
            }
        }
        const StepRowsLayout layout = step_layout();

        // logits = output · norm(x) of the rows that want them, gathered first
        float* host = host_step_logits_.as<float>();
        if (wanting > 0) {
            cuda::gather_rows(step_.wanting_x, s.x, step_.rows + layout.logit_rows(), wanting,
                              c.dim, stream);
            cuda::DeviceActivations final_normed = first_rows(step_.normed, wanting);
            if (wanting >= kStepGemmRows) {  // the output matrix's GEMM input dtype
                final_normed = first_rows(s.normed, wanting);
                final_normed.dtype = cuda::gemm_input_dtype(weights_.output.dtype);
                final_normed.pitch = cuda::padded_cols(c.dim, final_normed.dtype);
            }
            cuda::rmsnorm_rows(final_normed, step_.wanting_x, weights_.final_norm, c.norm_eps,
                               stream);
            step_product(s.logits, c.vocab_size, weights_.output, final_normed, /*bias=*/nullptr,
                         /*accumulate=*/false);
            softcap_logits(s.logits, wanting);
            CUDA_CHECK(cudaMemcpyAsync(host, s.logits,
                                       size_t(wanting) * c.vocab_size * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream));
        }
        CUDA_CHECK(cudaStreamSynchronize(stream));
        return host;
    }

    // Every layer's keys and values of pool block `from` copied to block `to`, in stream
    // order with the steps.
    void copy_kv_block(int from, int to) override {
        if (!paged())
            throw Error(
                "copy_kv_block needs a CUDA backend made with a paged KV cache "
                "(BackendOptions::kv_blocks)");
        for (int block : {from, to})
            if (block < 0 || block >= kv_blocks_)
                throw Error("copy_kv_block: block " + std::to_string(block) +
                            " is outside the paged KV cache's " + std::to_string(kv_blocks_));
        if (from == to) return;
        const size_t block_bytes =
            size_t(kv_block_size_) * model_.config.kv_dim() * kv_element_bytes(kv_type_);
        for (const DeviceLayer& layer : weights_.layers)
            for (void* pool : {layer.key_cache, layer.value_cache}) {
                uint8_t* bytes = static_cast<uint8_t*>(pool);
                CUDA_CHECK(cudaMemcpyAsync(bytes + size_t(to) * block_bytes,
                                           bytes + size_t(from) * block_bytes, block_bytes,
                                           cudaMemcpyDeviceToDevice, stream_.get()));
            }
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
    // The kernels of one token, enqueued on the stream (captured into the graph once, or run
    // directly), and the copy of its logits to host_logits_: record_forward's, or on the GPU
    // ladder's rungs 1-4 LadderForward's. Token and position come from state_.step.
    void record_token() {
        if (ladder_)
            ladder_->record(stream_.get());
        else
            record_forward();
        copy_logits_to_host();
    }

    // The fast kernels of one token, in the order of the math (src/cpu/forward.cpp runs the
    // same steps on the CPU). Each layer is five kernels: RMSNorm is fused into the matvec
    // that reads its output, the biases and the residual adds into the matvecs' stores,
    // SwiGLU (GeGLU) into the w1/w3 matvec, and RoPE, the q/k norm and the KV-cache write into
    // the attention. Gemma's post norms take a kernel each: wo and w2 store their output, which
    // add_rmsnorm_rows norms into x.
    void record_forward() {
        const Config& c = model_.config;
        const DeviceState& s = state_;
        cudaStream_t stream = stream_.get();
        // x = embed[token] * embedding_scale (Gemma: sqrt(dim); 1 elsewhere)
        cuda::embedding(s.x, weights_.embedding, c.embedding_scale, s.step, stream);

        AttentionShape shape = attention_shape();  // its window set layer by layer below
        for (const DeviceLayer& layer : weights_.layers) {
            // Attention: x += wo · attention(rope(wq · norm(x)), rope(wk · norm(x)), wv · norm(x))
            //   (Qwen2: + bq, bk, bv after the projections; Qwen3 and Gemma: each head of q and
            //    k RMS-normed before RoPE; with attention_bias: + bo after wo; Gemma: the
            //    layer's RoPE table and window, and x += rmsnorm(wo · a) * post_attn_norm)
            shape.window = layer.window;
            shape.sinks = layer.sinks;
            int first_row = 0;  // of qkv: wq, wk and wv in runs of one type
            for (const DeviceMatrix& part : layer.wqkv) {
                cuda::matvec(s.qkv + first_row, part, s.x, layer.attn_norm, c.norm_eps,
                             layer.qkv_bias ? layer.qkv_bias + first_row : nullptr,
                             /*accumulate=*/false, stream);
                first_row += part.rows;
            }
            cuda::attention(s.att, s.qkv, layer.rope_table, layer.q_norm, layer.k_norm, c.norm_eps,
                            layer.key_cache, layer.value_cache, s.step, s.partial_out,
                            s.partial_stats, s.arrivals, shape, splits_, kv_type_, stream);
            if (layer.post_attn_norm) {  // Gemma: the output normed before the residual add
                cuda::matvec(s.projected, layer.wo, s.att, /*norm_weight=*/nullptr, c.norm_eps,
                             layer.o_bias, /*accumulate=*/false, stream);
                cuda::add_rmsnorm_rows(s.x, s.projected, layer.post_attn_norm, c.dim, 1, c.norm_eps,
                                       stream);
            } else {
                cuda::matvec(s.x, layer.wo, s.att, /*norm_weight=*/nullptr, c.norm_eps,
                             layer.o_bias, /*accumulate=*/true, stream);
            }

            // Feed-forward: x += w2 · (act(w1 · norm(x)) * (w3 · norm(x)))
            //   (act: silu, or Gemma's gelu_tanh; Gemma: x += rmsnorm(w2 · ...) * post_ffn_norm;
            //    a sparse layer: the weighted sum of the feed-forwards of the experts its
            //    router picks)
            if (layer.sparse())
                record_experts(layer);
            else
                record_feed_forward(layer);
        }

        // logits = output · norm(x)   (Gemma 2: soft-capped, cap · tanh(logits / cap))
        cuda::matvec(s.logits, weights_.output, s.x, weights_.final_norm, c.norm_eps,
                     /*bias=*/nullptr, /*accumulate=*/false, stream);
        softcap_logits(s.logits, 1);
    }

    // A dense layer's feed-forward for one token: x += w2 · (act(w1 · norm(x)) * (w3 ·
    // norm(x))) (act: silu, or Gemma's gelu_tanh; Gemma: x += rmsnorm(w2 · ...) *
    // post_ffn_norm).
    void record_feed_forward(const DeviceLayer& layer) {
        const Config& c = model_.config;
        const DeviceState& s = state_;
        cudaStream_t stream = stream_.get();
        if (fuses_gate(layer.w1, layer.w3)) {
            cuda::matvec_swiglu(s.hidden, layer.w1, layer.w3, s.x, layer.ffn_norm, c.norm_eps,
                                c.activation, stream);
        } else {  // two types, or SwigluOai: two matvecs, then the activation
            cuda::matvec(s.hidden, layer.w1, s.x, layer.ffn_norm, c.norm_eps,
                         /*bias=*/nullptr, /*accumulate=*/false, stream);
            cuda::matvec(s.up, layer.w3, s.x, layer.ffn_norm, c.norm_eps, /*bias=*/nullptr,
                         /*accumulate=*/false, stream);
            cuda::swiglu(s.hidden, s.up, c.hidden_dim, c.activation, c.swiglu_limit, stream);
        }
        if (layer.post_ffn_norm) {  // Gemma
            cuda::matvec(s.projected, layer.w2, s.hidden, /*norm_weight=*/nullptr, c.norm_eps,
                         /*bias=*/nullptr, /*accumulate=*/false, stream);
            cuda::add_rmsnorm_rows(s.x, s.projected, layer.post_ffn_norm, c.dim, 1, c.norm_eps,
                                   stream);
        } else {
            cuda::matvec(s.x, layer.w2, s.hidden, /*norm_weight=*/nullptr, c.norm_eps,
                         /*bias=*/nullptr, /*accumulate=*/true, stream);
        }
    }

    // A sparse layer's feed-forward for one token (src/cpu/moe.h): the router's logits of
    // norm(x), the k experts and their weights picked on the device, then
    // x += Σ_j weight_j · w2_j (act(w1_j · norm(x)) * (w3_j · norm(x))), each expert matvec
    // reading its expert from s.chosen (gpt-oss: the router's logits + router_bias, and each
    // product + its expert's bias, b1, b3 or b2).
    void record_experts(const DeviceLayer& layer) {
        const Config& c = model_.config;
        const DeviceState& s = state_;
        cudaStream_t stream = stream_.get();
        const int k = c.experts_per_token, hidden_pitch = expert_hidden_pitch(c);
        cuda::matvec(s.router_logits, layer.router, s.x, layer.ffn_norm, c.norm_eps,
                     layer.router_bias, /*accumulate=*/false, stream);
        cuda::route_tokens(s.chosen, s.route_weights, s.router_logits, /*tokens=*/1, c.experts, k,
                           c.norm_topk_prob, stream);
        // gate_j = w1_j · norm(x), up_j = w3_j · norm(x): the one input for all k routes
        cuda::expert_matvec(s.expert_gate, hidden_pitch, layer.experts_w1, s.chosen, k,
                            /*routes_per_input=*/k, s.x, /*in_pitch=*/0, layer.ffn_norm, c.norm_eps,
                            layer.expert_b1, stream);
        cuda::expert_matvec(s.expert_up, hidden_pitch, layer.experts_w3, s.chosen, k,
                            /*routes_per_input=*/k, s.x, /*in_pitch=*/0, layer.ffn_norm, c.norm_eps,
                            layer.expert_b3, stream);
        cuda::swiglu(s.expert_gate, s.expert_up, k * hidden_pitch, c.activation, c.swiglu_limit,
                     stream);
        // out_j = w2_j · hidden_j, then x += Σ_j weight_j out_j
        cuda::expert_matvec(s.expert_out, c.dim, layer.experts_w2, s.chosen, k,
                            /*routes_per_input=*/1, s.expert_gate, hidden_pitch,
                            /*norm_weight=*/nullptr, c.norm_eps, layer.expert_b2, stream);
        cuda::moe_combine(s.x, c.dim, s.expert_out, /*slots=*/nullptr, s.route_weights, k, c.dim,
                          /*tokens=*/1, stream);
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
        // x = embed[tokens] * embedding_scale
        cuda::embedding_rows(s.x, weights_.embedding, c.embedding_scale, s.tokens, B, stream);

        AttentionShape shape = attention_shape();  // its window set layer by layer below
        for (const DeviceLayer& layer : weights_.layers) {
            // Attention: x += wo · attention(rope(wq · norm(x)), rope(wk · norm(x)), wv · norm(x))
            //   (the biases, q/k norms, RoPE table, window and post norm of the layer where it
            //    has them, as decode)
            shape.window = layer.window;
            shape.sinks = layer.sinks;
            cuda::rmsnorm_rows(normed, s.x, layer.attn_norm, c.norm_eps, stream);
            int first_row = 0;  // of qkv's rows: wq, wk and wv in runs of one type
            for (const DeviceMatrix& part : layer.wqkv) {
                cuda::gemm(s.qkv + first_row, qkv_pitch, part, normed,
                           layer.qkv_bias ? layer.qkv_bias + first_row : nullptr,
                           /*accumulate=*/false, stream, s.dequantized);
                first_row += part.rows;
            }
            cuda::rope_kv_store_rows(s.qkv, qkv_pitch, layer.rope_table, layer.key_cache,
                                     layer.value_cache, first_pos, B, c.heads, c.kv_heads,
                                     c.head_dim, layer.q_norm, layer.k_norm, c.norm_eps, kv_type_,
                                     stream);
            cuda::attention_prefill(att, s.qkv, qkv_pitch, layer.key_cache, layer.value_cache,
                                    first_pos, shape, kv_type_, stream);
            if (layer.post_attn_norm) {  // Gemma: x += rmsnorm(wo · a) * post_attn_norm
                cuda::gemm(s.projected, c.dim, layer.wo, att, layer.o_bias, /*accumulate=*/false,
                           stream, s.dequantized);
                cuda::add_rmsnorm_rows(s.x, s.projected, layer.post_attn_norm, c.dim, B, c.norm_eps,
                                       stream);
            } else {
                cuda::gemm(s.x, c.dim, layer.wo, att, layer.o_bias, /*accumulate=*/true, stream,
                           s.dequantized);
            }

            // Feed-forward: x += w2 · (act(w1 · norm(x)) * (w3 · norm(x)))
            //   (act: silu, or Gemma's gelu_tanh; Gemma: x += rmsnorm(w2 · ...) * post_ffn_norm;
            //    a sparse layer: each token's experts, grouped by expert)
            if (layer.sparse())
                prefill_experts(layer, B);
            else
                prefill_feed_forward(layer, B);
        }

        // logits = output · norm(x), of every row or of the last; the output matrix's dtype
        // may differ from the layers': its input is a view of the same memory.
        const int first_row = logits_out ? 0 : B - 1, rows = B - first_row;
        cuda::DeviceActivations final_normed = first_rows(s.normed, rows);
        final_normed.dtype = cuda::gemm_input_dtype(weights_.output.dtype);
        final_normed.pitch = cuda::padded_cols(c.dim, final_normed.dtype);
        cuda::rmsnorm_rows(final_normed, s.x + size_t(first_row) * c.dim, weights_.final_norm,
                           c.norm_eps, stream);
        cuda::gemm(s.logits, c.vocab_size, weights_.output, final_normed, /*bias=*/nullptr,
                   /*accumulate=*/false, stream, s.dequantized);
        softcap_logits(s.logits, rows);
        float* host = logits_out ? logits_out : host_logits_.as<float>();
        CUDA_CHECK(cudaMemcpyAsync(host, s.logits, size_t(rows) * c.vocab_size * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        return host + size_t(rows - 1) * c.vocab_size;
    }

    // A dense layer's feed-forward for a prefill batch of B tokens, as record_feed_forward.
    void prefill_feed_forward(const DeviceLayer& layer, int B) {
        const Config& c = model_.config;
        const PrefillState& s = prefill_;
        cudaStream_t stream = stream_.get();
        const cuda::DeviceActivations normed = first_rows(s.normed, B);
        const cuda::DeviceActivations hidden = first_rows(s.hidden, B);
        cuda::rmsnorm_rows(normed, s.x, layer.ffn_norm, c.norm_eps, stream);
        if (fuses_gate(layer.w1, layer.w3)) {
            cuda::gemm_swiglu(hidden, layer.w1, layer.w3, normed, s.gate, s.up, c.hidden_dim,
                              c.activation, stream, s.dequantized);
        } else {  // two types, or SwigluOai: two GEMMs, then the activation
            cuda::gemm(s.gate, c.hidden_dim, layer.w1, normed, /*bias=*/nullptr,
                       /*accumulate=*/false, stream, s.dequantized);
            cuda::gemm(s.up, c.hidden_dim, layer.w3, normed, /*bias=*/nullptr,
                       /*accumulate=*/false, stream, s.dequantized);
            cuda::swiglu_rows(hidden, s.gate, s.up, c.hidden_dim, c.activation, c.swiglu_limit,
                              stream);
        }
        if (layer.post_ffn_norm) {  // Gemma
            cuda::gemm(s.projected, c.dim, layer.w2, hidden, /*bias=*/nullptr,
                       /*accumulate=*/false, stream, s.dequantized);
            cuda::add_rmsnorm_rows(s.x, s.projected, layer.post_ffn_norm, c.dim, B, c.norm_eps,
                                   stream);
        } else {
            cuda::gemm(s.x, c.dim, layer.w2, hidden, /*bias=*/nullptr, /*accumulate=*/true, stream,
                       s.dequantized);
        }
    }

    // A sparse layer's feed-forward for a prefill batch of B tokens, as cpu::MixtureOfExperts
    // ::prefill: every token routed on the device; the routes copied to the host (one
    // synchronisation) and grouped by expert there; each expert with tokens then runs once,
    // a GEMM over its tokens for w1, w3 and w2; the results added back into x, weighted.
    void prefill_experts(const DeviceLayer& layer, int B) {
        const Config& c = model_.config;
        const PrefillState& s = prefill_;
        cudaStream_t stream = stream_.get();
        const int k = c.experts_per_token, routes = B * k, H = c.moe_hidden_dim;
        // Route every token (the router's input in f32, as its weights).
        const cuda::DeviceActivations router_input = first_rows(s.router_input, B);
        cuda::rmsnorm_rows(router_input, s.x, layer.ffn_norm, c.norm_eps, stream);
        cuda::gemm(s.router_logits, c.experts, layer.router, router_input, layer.router_bias,
                   /*accumulate=*/false, stream);
        cuda::route_tokens(s.chosen, s.route_weights, s.router_logits, B, c.experts, k,
                           c.norm_topk_prob, stream);
        int* host = host_routes_.as<int>();  // [3 * routes]: chosen, then route_rows
        CUDA_CHECK(
            cudaMemcpyAsync(host, s.chosen, routes * sizeof(int), cudaMemcpyDeviceToHost, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        // Group the routes by expert: expert e's take grouped rows expert_start[e] ..
        // expert_start[e + 1] - 1, in token order.
        int* grouped_row = host + routes;
        int* token_of_row = host + 2 * routes;
        const std::vector<int> expert_start =
            cuda::group_routes_by_expert(host, routes, k, c.experts, grouped_row, token_of_row);
        CUDA_CHECK(cudaMemcpyAsync(s.route_rows, grouped_row, 2 * routes * sizeof(int),
                                   cudaMemcpyHostToDevice, stream));
        // Each grouped row's input: its token's x, normed.
        cuda::gather_rows(s.grouped_x, s.x, s.route_rows + routes, routes, c.dim, stream);
        cuda::rmsnorm_rows(first_rows(s.grouped_normed, routes), s.grouped_x, layer.ffn_norm,
                           c.norm_eps, stream);
        // Each expert once, over its rows.
        for (int e = 0; e < c.experts; ++e) {
            const int first = expert_start[e], count = expert_start[e + 1] - first;
            if (count == 0) continue;
            const cuda::DeviceActivations normed = rows_from(s.grouped_normed, first, count);
            const cuda::DeviceActivations hidden = rows_from(s.expert_hidden, first, count);
            float* gate = s.expert_gate + size_t(first) * H;
            float* up = s.expert_up + size_t(first) * H;
            const DeviceMatrix w1 = layer.experts_w1.expert(e), w3 = layer.experts_w3.expert(e);
            if (fuses_gate(w1, w3) && !layer.expert_b1) {
                cuda::gemm_swiglu(hidden, w1, w3, normed, gate, up, H, c.activation, stream,
                                  s.dequantized);
            } else {  // two types, SwigluOai or biases: two GEMMs, then the activation
                cuda::gemm(gate, H, w1, normed, expert_bias(layer.expert_b1, e, H),
                           /*accumulate=*/false, stream, s.dequantized);
                cuda::gemm(up, H, w3, normed, expert_bias(layer.expert_b3, e, H),
                           /*accumulate=*/false, stream, s.dequantized);
                cuda::swiglu_rows(hidden, gate, up, H, c.activation, c.swiglu_limit, stream);
            }
            cuda::gemm(s.expert_out + size_t(first) * c.dim, c.dim, layer.experts_w2.expert(e),
                       hidden, expert_bias(layer.expert_b2, e, c.dim), /*accumulate=*/false, stream,
                       s.dequantized);
        }
        // x += Σ_j weight_j · (token's j-th expert's output)
        cuda::moe_combine(s.x, c.dim, s.expert_out, s.route_rows, s.route_weights, k, c.dim, B,
                          stream);
    }

    // The embedding and the layers of a step of `count` rows (StepState::rows holds their
    // tokens, positions and tables), the attention split in `splits` runs: captured once per
    // bucket into a CUDA graph, or run directly.
    void record_step_layers(int count, int splits) {
        const Config& c = model_.config;
        const PrefillState& s = prefill_;
        cudaStream_t stream = stream_.get();
        const StepRowsLayout layout = step_layout();
        const int* positions = step_.rows + layout.positions();
        const int* tables = step_.rows + layout.tables();
        const int qkv_pitch = c.q_dim() + 2 * c.kv_dim();
        // The products' inputs: f32 rows for the batched matvec below kStepGemmRows rows, the
        // GEMM's input dtype from there (step_product)
        const bool few = count < kStepGemmRows;
        const cuda::DeviceActivations normed = first_rows(few ? step_.normed : s.normed, count);
        const cuda::DeviceActivations att = first_rows(few ? step_.att : s.att, count);
        const cuda::DeviceActivations hidden = first_rows(few ? step_.hidden : s.hidden, count);
        // x = embed[tokens] * embedding_scale
        cuda::embedding_rows(s.x, weights_.embedding, c.embedding_scale,
                             step_.rows + layout.tokens(), count, stream);

        AttentionShape shape = attention_shape();  // its window set layer by layer below
        for (const DeviceLayer& layer : weights_.layers) {
            // Attention: x += wo · attention(rope(wq · norm(x)), rope(wk · norm(x)), wv · norm(x))
            //   (the biases, q/k norms, RoPE table, window and post norm of the layer where it
            //    has them, as decode); keys and values through the rows' block tables
            shape.window = layer.window;
            shape.sinks = layer.sinks;
            cuda::rmsnorm_rows(normed, s.x, layer.attn_norm, c.norm_eps, stream);
            int first_row = 0;  // of qkv's rows: wq, wk and wv in runs of one type
            for (const DeviceMatrix& part : layer.wqkv) {
                step_product(s.qkv + first_row, qkv_pitch, part, normed,
                             layer.qkv_bias ? layer.qkv_bias + first_row : nullptr,
                             /*accumulate=*/false);
                first_row += part.rows;
            }
            cuda::rope_kv_store_paged(s.qkv, qkv_pitch, layer.rope_table, layer.key_cache,
                                      layer.value_cache, positions, tables, layout.table_stride,
                                      kv_block_size_, count, c.heads, c.kv_heads, c.head_dim,
                                      layer.q_norm, layer.k_norm, c.norm_eps, kv_type_, stream);
            cuda::attention_paged(att, s.qkv, qkv_pitch, layer.key_cache, layer.value_cache,
                                  positions, tables, layout.table_stride, kv_block_size_, splits,
                                  step_.partial_out, step_.partial_stats, shape, kv_type_, stream);
            if (layer.post_attn_norm) {  // Gemma: x += rmsnorm(wo · a) * post_attn_norm
                step_product(s.projected, c.dim, layer.wo, att, layer.o_bias,
                             /*accumulate=*/false);
                cuda::add_rmsnorm_rows(s.x, s.projected, layer.post_attn_norm, c.dim, count,
                                       c.norm_eps, stream);
            } else {
                step_product(s.x, c.dim, layer.wo, att, layer.o_bias, /*accumulate=*/true);
            }

            // Feed-forward: x += w2 · (act(w1 · norm(x)) * (w3 · norm(x))), as prefill_batch;
            //   a sparse layer: each row's experts
            if (layer.sparse())
                step_experts(layer, count);
            else
                step_feed_forward(layer, normed, hidden);
        }
    }

    // A dense layer's feed-forward for the rows of a step, as prefill_feed_forward: normed
    // and hidden are the step's rows in the products' input dtype (record_step_layers).
    void step_feed_forward(const DeviceLayer& layer, const cuda::DeviceActivations& normed,
                           const cuda::DeviceActivations& hidden) {
        const Config& c = model_.config;
        const PrefillState& s = prefill_;
        cudaStream_t stream = stream_.get();
        const int count = normed.tokens;
        cuda::rmsnorm_rows(normed, s.x, layer.ffn_norm, c.norm_eps, stream);
        if (count >= kStepGemmRows && fuses_gate(layer.w1, layer.w3)) {
            cuda::gemm_swiglu(hidden, layer.w1, layer.w3, normed, s.gate, s.up, c.hidden_dim,
                              c.activation, stream, s.dequantized);
        } else {  // two products, then the activation
            step_product(s.gate, c.hidden_dim, layer.w1, normed, /*bias=*/nullptr,
                         /*accumulate=*/false);
            step_product(s.up, c.hidden_dim, layer.w3, normed, /*bias=*/nullptr,
                         /*accumulate=*/false);
            cuda::swiglu_rows(hidden, s.gate, s.up, c.hidden_dim, c.activation, c.swiglu_limit,
                              stream);
        }
        if (layer.post_ffn_norm) {  // Gemma
            step_product(s.projected, c.dim, layer.w2, hidden, /*bias=*/nullptr,
                         /*accumulate=*/false);
            cuda::add_rmsnorm_rows(s.x, s.projected, layer.post_ffn_norm, c.dim, count, c.norm_eps,
                                   stream);
        } else {
            step_product(s.x, c.dim, layer.w2, hidden, /*bias=*/nullptr, /*accumulate=*/true);
        }
    }

    // A sparse layer's feed-forward for the `count` rows of a step, as record_experts for one
    // token: every row routed on the device, then the expert matvecs over all count × k
    // routes (route r: row r / k's r % k-th expert, read from s.chosen), so nothing waits on
    // the host and the step's CUDA graph replays it; then x += Σ_j weight_j · out_j per row.
    // A row's experts are read for it alone, never grouped with other rows' as prefill does.
    void step_experts(const DeviceLayer& layer, int count) {
        const Config& c = model_.config;
        const PrefillState& s = prefill_;
        cudaStream_t stream = stream_.get();
        const int k = c.experts_per_token, routes = count * k;
        const int hidden_pitch = expert_hidden_pitch(c);
        // norm(x) in f32: the router's input (as its weights) and the expert matvecs'.
        const cuda::DeviceActivations normed = first_rows(s.router_input, count);
        cuda::rmsnorm_rows(normed, s.x, layer.ffn_norm, c.norm_eps, stream);
        cuda::gemm(s.router_logits, c.experts, layer.router, normed, layer.router_bias,
                   /*accumulate=*/false, stream);
        cuda::route_tokens(s.chosen, s.route_weights, s.router_logits, count, c.experts, k,
                           c.norm_topk_prob, stream);
        // gate_r = w1_e · norm(x_t), up_r = w3_e · norm(x_t), then act(gate) * up
        const float* normed_rows = static_cast<const float*>(normed.data);
        cuda::expert_matvec(step_.expert_gate, hidden_pitch, layer.experts_w1, s.chosen, routes,
                            /*routes_per_input=*/k, normed_rows, normed.pitch,
                            /*norm_weight=*/nullptr, c.norm_eps, layer.expert_b1, stream);
        cuda::expert_matvec(step_.expert_up, hidden_pitch, layer.experts_w3, s.chosen, routes,
                            /*routes_per_input=*/k, normed_rows, normed.pitch,
                            /*norm_weight=*/nullptr, c.norm_eps, layer.expert_b3, stream);
        cuda::swiglu(step_.expert_gate, step_.expert_up, routes * hidden_pitch, c.activation,
                     c.swiglu_limit, stream);
        // out_r = w2_e · hidden_r, then x_t += Σ_j weight_j out_(t k + j)
        cuda::expert_matvec(s.expert_out, c.dim, layer.experts_w2, s.chosen, routes,
                            /*routes_per_input=*/1, step_.expert_gate, hidden_pitch,
                            /*norm_weight=*/nullptr, c.norm_eps, layer.expert_b2, stream);
        cuda::moe_combine(s.x, c.dim, s.expert_out, /*slots=*/nullptr, s.route_weights, k, c.dim,
                          count, stream);
    }

    bool paged() const { return kv_blocks_ > 0; }

    // Whether a feed-forward's w1 and w3 run as one product with the activation fused
    // (matvec_swiglu, gemm_swiglu): they share a type and the activation is SiLU or GeLU
    // (SwigluOai, with its limit, runs as two products and swiglu or swiglu_rows).
    bool fuses_gate(const DeviceMatrix& w1, const DeviceMatrix& w3) const {
        return w1.dtype == w3.dtype && model_.config.activation != Activation::SwigluOai;
    }

    // Expert e's part of a layer's stacked expert biases (`rows` floats per expert), or
    // nullptr where the layer has none.
    static const float* expert_bias(const float* biases, int e, int rows) {
        return biases ? biases + size_t(e) * rows : nullptr;
    }

    // out = W · in (+ bias; out += with accumulate) for `in.tokens` rows of a step: the
    // batched matvec below kStepGemmRows rows (in: StepState's f32 rows), the GEMM from there.
    void step_product(float* out, int out_pitch, const DeviceMatrix& w,
                      const cuda::DeviceActivations& in, const float* bias, bool accumulate) {
        if (in.tokens < kStepGemmRows)
            cuda::matvec_rows(out, out_pitch, w, in, bias, accumulate, stream_.get());
        else
            cuda::gemm(out, out_pitch, w, in, bias, accumulate, stream_.get(),
                       prefill_.dequantized);
    }

    void refuse_if_paged(const char* what) const {
        if (paged())
            throw Error(std::string(what) +
                        " runs on the contiguous KV cache, but this CUDA backend holds the "
                        "server's paged one (BackendOptions::kv_blocks): use step");
    }

    void check_paged(bool batched) const {
        if (kv_blocks_ < 0)
            throw Error("the paged KV cache needs at least 1 block, not " +
                        std::to_string(kv_blocks_));
        if (kv_block_size_ < 1)
            throw Error("the paged KV cache needs blocks of at least 1 position, not " +
                        std::to_string(kv_block_size_));
        if (!batched)
            throw Error(
                "the CUDA backend's paged KV cache runs on its fast kernels, with every "
                "layer matrix taking one GEMM input dtype");
    }

    StepRowsLayout step_layout() const {
        return StepRowsLayout{prefill_batch_, (context_ + kv_block_size_ - 1) / kv_block_size_};
    }

    // Checks the rows (tokens, positions inside the context, blocks inside the pool), copies
    // their token ids, positions, block tables and the indices of the rows that want logits
    // to StepState::rows, and returns how many want logits. Rows count .. run_rows - 1 are
    // padding: token 0 at position 0 in the pool's spare block (kv_blocks_), no logits.
    int upload_step_rows(const StepRow* rows, int count, int run_rows) {
        const StepRowsLayout layout = step_layout();
        int* host = host_step_rows_.as<int>();  // the previous step has completed
        int wanting = 0;
        for (int t = 0; t < count; ++t) {
            const StepRow& row = rows[t];
            check_tokens(model_.config, &row.token, 1, row.pos, context_);
            host[layout.tokens() + t] = row.token;
            host[layout.positions() + t] = row.pos;
            if (row.wants_logits) host[layout.logit_rows() + wanting++] = t;
            int* table = host + layout.tables() + size_t(t) * layout.table_stride;
            for (int b = 0; b <= row.pos / kv_block_size_; ++b) {
                const int block = row.block_table[b];
                if (block < 0 || block >= kv_blocks_)
                    throw Error("step: row " + std::to_string(t) + " names block " +
                                std::to_string(block) + " outside the paged KV cache's " +
                                std::to_string(kv_blocks_));
                table[b] = block;
            }
        }
        for (int t = count; t < run_rows; ++t) {
            host[layout.tokens() + t] = 0;
            host[layout.positions() + t] = 0;
            host[layout.tables() + size_t(t) * layout.table_stride] = kv_blocks_;
        }
        CUDA_CHECK(cudaMemcpyAsync(step_.rows, host, layout.ints(run_rows) * sizeof(int),
                                   cudaMemcpyHostToDevice, stream_.get()));
        return wanting;
    }

    // StepState for steps of up to prefill_batch_ rows, and the pinned host copies of the
    // rows' data and the logits.
    void allocate_step() {
        const Config& c = model_.config;
        const StepRowsLayout layout = step_layout();
        const int B = prefill_batch_;
        auto bytes = [&](size_t count, const std::string& what) {
            memory_.emplace_back(count, what);
            CUDA_CHECK(cudaMemset(memory_.back().as(), 0, count));
            return memory_.back().as();
        };
        step_.rows = static_cast<int*>(bytes(layout.ints(B) * sizeof(int), "the step's rows"));
        auto few_rows = [&](int cols, const std::string& what) {
            cuda::DeviceActivations a;
            a.dtype = DType::F32;
            a.tokens = kStepGemmRows;
            a.cols = cols;
            a.pitch = matvec_rows_pitch(cols);
            a.data = bytes(a.bytes(), what);
            return a;
        };
        step_.normed = few_rows(c.dim, "the step's normed rows");
        step_.att = few_rows(c.q_dim(), "the step's attention rows");
        step_.hidden = few_rows(c.hidden_dim, "the step's hidden rows");
        step_.wanting_x =
            static_cast<float*>(bytes(size_t(B) * c.dim * sizeof(float), "the step's logit rows"));
        if (c.experts > 0) {
            const size_t route_floats = size_t(B) * c.experts_per_token * expert_hidden_pitch(c);
            step_.expert_gate =
                static_cast<float*>(bytes(route_floats * sizeof(float), "the step's expert gate"));
            step_.expert_up =
                static_cast<float*>(bytes(route_floats * sizeof(float), "the step's expert up"));
        }
        step_.partial_out = static_cast<float*>(
            bytes(size_t(kPagedPartialRows) * c.q_dim() * sizeof(float), "attention partials"));
        step_.partial_stats = static_cast<float*>(
            bytes(size_t(kPagedPartialRows) * c.heads * 2 * sizeof(float), "attention partials"));
        host_step_rows_ = PinnedBuffer(layout.ints(B) * sizeof(int), "the step's rows");
        host_step_logits_ =
            PinnedBuffer(size_t(B) * c.vocab_size * sizeof(float), "the step's logits");
    }

    // Device bytes allocate_step takes.
    size_t step_bytes() const {
        if (!paged()) return 0;
        const Config& c = model_.config;
        const size_t few_rows = size_t(kStepGemmRows) *
                                (matvec_rows_pitch(c.dim) + matvec_rows_pitch(c.q_dim()) +
                                 matvec_rows_pitch(c.hidden_dim)) *
                                sizeof(float);
        const size_t expert_rows = c.experts > 0
                                       ? 2 * size_t(prefill_batch_) * c.experts_per_token *
                                             expert_hidden_pitch(c) * sizeof(float)
                                       : 0;
        return step_layout().ints(prefill_batch_) * sizeof(int) + few_rows +
               size_t(prefill_batch_) * c.dim * sizeof(float) + expert_rows +
               size_t(kPagedPartialRows) * (c.q_dim() + 2 * c.heads) * sizeof(float);
    }

    void copy_logits_to_host() {
        CUDA_CHECK(cudaMemcpyAsync(host_logits_.as(), state_.logits,
                                   size_t(model_.config.vocab_size) * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_.get()));
    }

    // The kernels `record` enqueues, captured into *graph and instantiated into *exec.
    template <typename Record>
    void capture(Record record, Graph* graph_out, GraphExec* exec_out) {
        cudaStream_t stream = stream_.get();
        CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        try {
            record();
        } catch (...) {
            cudaGraph_t broken = nullptr;
            cudaStreamEndCapture(stream, &broken);  // leave the stream usable
            if (broken) cudaGraphDestroy(broken);
            cudaGetLastError();
            throw;
        }
        cudaGraph_t graph = nullptr;
        CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
        graph_out->reset(graph);
        cudaGraphExec_t exec = nullptr;
        CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        exec_out->reset(exec);
    }

    // The row counts a step runs as with graphs: 1, 2, 4, 8, the batched matvec's largest
    // (kStepGemmRows - 1), then kStepGemmRows doubling, up to prefill_batch_ (the last).
    void make_step_buckets() {
        std::vector<int> counts = {1, 2, 4, 8, kStepGemmRows - 1};
        for (int rows = kStepGemmRows; rows < prefill_batch_; rows *= 2) counts.push_back(rows);
        counts.push_back(prefill_batch_);
        for (int rows : counts)
            if (rows <= prefill_batch_ &&
                (step_buckets_.empty() || rows > step_buckets_.back().rows)) {
                step_buckets_.emplace_back();
                step_buckets_.back().rows = rows;
            }
    }

    // The bucket of a step of `count` rows (the fewest rows that hold it), -1 without graphs.
    int step_bucket(int count) const {
        for (size_t b = 0; b < step_buckets_.size(); ++b)
            if (step_buckets_[b].rows >= count) return int(b);
        return -1;
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
        for (int l = 0; l < c.layers; ++l) {
            const LayerWeights& w = model_.layers[l];
            for (const auto& run : qkv_runs(w)) bytes += cuda::stacked_bytes(run);
            bytes += cuda::stacked_bytes({&w.wo}) +
                     (2 * size_t(c.dim) + layer_vector_floats(c)) * sizeof(float);
            if (c.is_sparse(l)) {
                const Matrix router = router_matrix(w);
                bytes += cuda::stacked_bytes({&router}) +
                         expert_bias_floats(c, c.experts) * sizeof(float);
                for (const std::vector<Matrix>* experts :
                     {&w.expert_w1, &w.expert_w3, &w.expert_w2})
                    bytes += cuda::stacked_bytes(expert_parts(*experts));
            } else {
                bytes += cuda::stacked_bytes({&w.w1}) + cuda::stacked_bytes({&w.w3}) +
                         cuda::stacked_bytes({&w.w2});
            }
        }
        return bytes;
    }

    // wq, wk and wv as the runs of consecutive matrices of one type that are stacked into one
    // device matrix each: one run where the three share a type.
    static std::vector<std::vector<const Matrix*>> qkv_runs(const LayerWeights& w) {
        std::vector<std::vector<const Matrix*>> runs;
        for (const Matrix* m : {&w.wq, &w.wk, &w.wv}) {
            if (runs.empty() || runs.back().front()->dtype != m->dtype) runs.emplace_back();
            runs.back().push_back(m);
        }
        return runs;
    }

    // A sparse layer's router as a matrix: f32 [experts, dim].
    Matrix router_matrix(const LayerWeights& w) const {
        const Config& c = model_.config;
        return Matrix{w.router, DType::F32, c.experts, c.dim, nullptr};
    }

    // The experts' matrices of one role, in expert order: the parts of their stacked upload.
    static std::vector<const Matrix*> expert_parts(const std::vector<Matrix>& experts) {
        std::vector<const Matrix*> parts;
        for (const Matrix& m : experts) parts.push_back(&m);
        return parts;
    }

    // The feed-forward's matrices of a layer: w1, w3 and w2, or every expert's.
    static std::vector<const Matrix*> feed_forward_matrices(const LayerWeights& w) {
        if (w.expert_w1.empty()) return {&w.w1, &w.w3, &w.w2};
        std::vector<const Matrix*> out;
        for (const std::vector<Matrix>* experts : {&w.expert_w1, &w.expert_w3, &w.expert_w2})
            for (const Matrix& m : *experts) out.push_back(&m);
        return out;
    }

    bool has_block_types() const {
        for (const Matrix* m : model_.matrices())
            if (is_block_type(m->dtype)) return true;
        return false;
    }

    // Positions of one layer's cache: the context's, or the paged pool's (with one spare
    // block, where a step's padding rows write).
    size_t cache_positions() const {
        return paged() ? size_t(kv_blocks_ + 1) * kv_block_size_ : size_t(context_);
    }

    size_t cache_bytes() const {
        const Config& c = model_.config;
        return 2 * size_t(c.layers) * cache_positions() * c.kv_dim() * kv_element_bytes(kv_type_);
    }

    // The dtype every layer GEMM of the prefill reads its activations in.
    DType layer_gemm_input() const { return cuda::gemm_input_dtype(model_.layers[0].wq.dtype); }

    // Whether every layer matrix takes the same GEMM input dtype, so that the layers' GEMMs
    // share the activation buffers (true of every file convert writes: a Q4 file's f16
    // matrices take f16 as its Q4 ones do).
    bool layers_share_gemm_input() const {
        for (const LayerWeights& w : model_.layers) {
            std::vector<const Matrix*> matrices = feed_forward_matrices(w);
            matrices.insert(matrices.end(), {&w.wq, &w.wk, &w.wv, &w.wo});
            for (const Matrix* m : matrices)
                if (cuda::gemm_input_dtype(m->dtype) != layer_gemm_input()) return false;
        }
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

    // Bytes of PrefillState::dequantized: the largest matrix as f16 that gemm dequantizes at
    // prefill_batch_ tokens (w1 and w3 count together where they share a type), or 0: every
    // block-type matrix, and the Q8/Q4 ones it takes the warpgroup GEMM for. A batch of fewer
    // tokens dequantizes no larger matrix.
    size_t dequantize_scratch_bytes(bool all_logits) const {
        size_t bytes = 0;
        auto consider = [&](const Matrix& m, int rows, int matrices) {
            const bool dequantized =
                is_block_type(m.dtype) ||
                (is_quantized(m.dtype) &&
                 cuda::gemm_tiles(m.dtype, prefill_batch_, rows) == cuda::GemmTiles::kWarpgroup);
            if (dequantized)
                bytes = std::max(bytes, matrices * cuda::dequantized_bytes(rows, m.cols));
        };
        for (const LayerWeights& w : model_.layers) {
            for (const auto& run : qkv_runs(w)) {  // each run as one matrix
                int rows = 0;
                for (const Matrix* m : run) rows += m->rows;
                consider(*run.front(), rows, 1);
            }
            consider(w.wo, w.wo.rows, 1);
            if (w.expert_w1.empty()) {
                consider(w.w1, w.w1.rows, w.w1.dtype == w.w3.dtype ? 2 : 1);
                consider(w.w3, w.w3.rows, 1);
                consider(w.w2, w.w2.rows, 1);
            } else {  // one expert at a time (the scratch is reused)
                const Matrix &w1 = w.expert_w1.front(), &w3 = w.expert_w3.front();
                consider(w1, w1.rows, w1.dtype == w3.dtype ? 2 : 1);
                consider(w3, w3.rows, 1);
                consider(w.expert_w2.front(), w.expert_w2.front().rows, 1);
            }
        }
        // The logits of the last row alone multiply the whole output matrix too.
        if (all_logits || is_block_type(model_.output.dtype))
            consider(model_.output, model_.output.rows, 1);
        return bytes;
    }

    // Device bytes of the prefill activations (PrefillState) for batches of prefill_batch_.
    size_t prefill_bytes(bool all_logits) const {
        if (prefill_batch_ == 0) return 0;
        const Config& c = model_.config;
        const size_t per_token =
            sizeof(int) + size_t(c.dim) * sizeof(float) + activation_row_bytes(c.dim) +
            (size_t(c.q_dim()) + 2 * c.kv_dim()) * sizeof(float) + activation_row_bytes(c.q_dim()) +
            2 * size_t(c.hidden_dim) * sizeof(float) + activation_row_bytes(c.hidden_dim) +
            (c.post_norms ? size_t(c.dim) * sizeof(float) : 0);
        const size_t logits_rows = all_logits ? prefill_batch_ : 1;
        const size_t block_scratch = has_block_types() ? dequantize_scratch_bytes(all_logits) : 0;
        return (per_token + experts_bytes_per_token()) * prefill_batch_ +
               logits_rows * c.vocab_size * sizeof(float) + block_scratch;
    }

    // Device bytes per token of a prefill batch's sparse-layer buffers (PrefillState): 0
    // without experts.
    size_t experts_bytes_per_token() const {
        const Config& c = model_.config;
        if (c.experts == 0) return 0;
        const size_t k = c.experts_per_token;
        const size_t per_route =
            3 * sizeof(int) + sizeof(float) + size_t(c.dim) * sizeof(float) +
            activation_row_bytes(c.dim) + 2 * size_t(c.moe_hidden_dim) * sizeof(float) +
            activation_row_bytes(c.moe_hidden_dim) + size_t(c.dim) * sizeof(float);
        return size_t(cuda::padded_cols(c.dim, DType::F32)) * sizeof(float) +
               size_t(c.experts) * sizeof(float) + k * per_route;
    }

    // Refuses, naming the sizes, a model that cannot fit rather than failing half-way.
    void check_free_memory(bool all_logits) const {
        const size_t free_bytes = free_device_bytes();
        const size_t weights = weight_device_bytes(), cache = cache_bytes();
        const size_t prefill = prefill_bytes(all_logits || paged()) + step_bytes();
        if (weights + cache + prefill + kMemoryHeadroom <= free_bytes) return;
        const std::string cache_text =
            paged() ? "the paged KV cache of " + std::to_string(kv_blocks_) + " blocks of " +
                          std::to_string(kv_block_size_) + " positions"
                    : "the KV cache of " + std::to_string(context_) + " positions";
        const std::string batches =
            prefill_batch_ > 0 ? " and " + cuda::gib_text(prefill) + " for prefill batches of " +
                                     std::to_string(prefill_batch_) + " tokens"
                               : "";
        throw Error("the model needs " + cuda::gib_text(weights) +
                    " of GPU memory for weights and " + cuda::gib_text(cache) + " for " +
                    cache_text + batches + ", but only " + cuda::gib_text(free_bytes) +
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
        auto upload_experts = [&](const std::vector<Matrix>& experts, const std::string& what) {
            cuda::DeviceExperts out;
            out.stacked = upload(expert_parts(experts), what);
            out.rows = experts.front().rows;
            return out;
        };
        weights_.embedding = upload({&model_.token_embedding}, "token_embedding");
        for (int l = 0; l < c.layers; ++l) {
            const LayerWeights& w = model_.layers[l];
            const std::string prefix = "layers." + std::to_string(l) + ".";
            DeviceLayer layer{};
            layer.attn_norm = upload_norm(w.attn_norm, prefix + "attn_norm");
            for (const auto& run : qkv_runs(w)) {
                std::string names;
                for (const Matrix* m : run)
                    names += (names.empty() ? "" : "/") + std::string(m == &w.wq   ? "wq"
                                                                      : m == &w.wk ? "wk"
                                                                                   : "wv");
                layer.wqkv.push_back(upload(run, prefix + names));
            }
            if (c.qkv_bias) {  // stacked as wqkv's rows are
                std::vector<float> bias(w.bq, w.bq + c.q_dim());
                bias.insert(bias.end(), w.bk, w.bk + c.kv_dim());
                bias.insert(bias.end(), w.bv, w.bv + c.kv_dim());
                layer.qkv_bias = upload_vector(bias.data(), bias.size(), prefix + "bq/bk/bv");
            }
            layer.q_norm = upload_vector(w.q_norm, c.head_dim, prefix + "q_norm");
            layer.k_norm = upload_vector(w.k_norm, c.head_dim, prefix + "k_norm");
            layer.sinks = upload_vector(w.sinks, c.heads, prefix + "sinks");
            layer.wo = upload({&w.wo}, prefix + "wo");
            layer.o_bias = upload_vector(w.bo, c.dim, prefix + "bo");
            layer.post_attn_norm =
                upload_vector(w.post_attn_norm, c.dim, prefix + "post_attn_norm");
            layer.ffn_norm = upload_norm(w.ffn_norm, prefix + "ffn_norm");
            if (c.is_sparse(l)) {
                const Matrix router = router_matrix(w);
                layer.router = upload({&router}, prefix + "router");
                layer.experts_w1 = upload_experts(w.expert_w1, prefix + "experts.w1");
                layer.experts_w3 = upload_experts(w.expert_w3, prefix + "experts.w3");
                layer.experts_w2 = upload_experts(w.expert_w2, prefix + "experts.w2");
                const size_t hidden_floats = size_t(c.experts) * c.moe_hidden_dim;
                layer.router_bias = upload_vector(w.router_bias, c.experts, prefix + "router_bias");
                layer.expert_b1 = upload_vector(w.expert_b1, hidden_floats, prefix + "experts.b1");
                layer.expert_b3 = upload_vector(w.expert_b3, hidden_floats, prefix + "experts.b3");
                layer.expert_b2 =
                    upload_vector(w.expert_b2, size_t(c.experts) * c.dim, prefix + "experts.b2");
            } else {
                layer.w1 = upload({&w.w1}, prefix + "w1");
                layer.w3 = upload({&w.w3}, prefix + "w3");
                layer.w2 = upload({&w.w2}, prefix + "w2");
            }
            layer.post_ffn_norm = upload_vector(w.post_ffn_norm, c.dim, prefix + "post_ffn_norm");
            layer.window = c.layer_window(l);
            weights_.layers.push_back(layer);
        }
        weights_.final_norm = upload_norm(model_.final_norm, "final_norm");
        weights_.output = tied_output() ? weights_.embedding : upload({&model_.output}, "output");
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
        state_.projected = floats(c.dim, "projected");
        state_.hidden = floats(c.hidden_dim, "hidden");
        state_.up = floats(c.hidden_dim, "up");
        state_.logits = floats(c.vocab_size, "logits");
        if (c.experts > 0) {
            const int k = c.experts_per_token;
            state_.router_logits = floats(c.experts, "router logits");
            memory_.emplace_back(k * sizeof(int), "the chosen experts");
            state_.chosen = memory_.back().as<int>();
            CUDA_CHECK(cudaMemset(state_.chosen, 0, k * sizeof(int)));
            state_.route_weights = floats(k, "routing weights");
            state_.expert_gate = floats(size_t(k) * expert_hidden_pitch(c), "expert gate");
            state_.expert_up = floats(size_t(k) * expert_hidden_pitch(c), "expert up");
            state_.expert_out = floats(size_t(k) * c.dim, "expert outputs");
        }
        state_.partial_out = floats(size_t(c.heads) * splits_ * c.head_dim, "attention partials");
        state_.partial_stats = floats(size_t(c.heads) * splits_ * 2, "attention partials");
        const size_t counters = cuda::attention_arrival_counters(attention_shape());
        memory_.emplace_back(counters * sizeof(unsigned), "the attention arrival counters");
        state_.arrivals = memory_.back().as<unsigned>();
        CUDA_CHECK(cudaMemset(state_.arrivals, 0, counters * sizeof(unsigned)));
        const size_t one_cache = cache_bytes() / 2;
        memory_.emplace_back(one_cache, "the key cache");
        uint8_t* key_cache = memory_.back().as<uint8_t>();
        memory_.emplace_back(one_cache, "the value cache");
        uint8_t* value_cache = memory_.back().as<uint8_t>();
        CUDA_CHECK(cudaMemset(key_cache, 0, one_cache));
        CUDA_CHECK(cudaMemset(value_cache, 0, one_cache));
        const size_t layer_bytes = cache_positions() * c.kv_dim() * kv_element_bytes(kv_type_);
        for (int l = 0; l < c.layers; ++l) {
            weights_.layers[l].key_cache = key_cache + l * layer_bytes;
            weights_.layers[l].value_cache = value_cache + l * layer_bytes;
        }
        const std::vector<float> rope = rope_table(c, context_);
        memory_.push_back(cuda::upload_floats(rope.data(), rope.size(), "RoPE"));
        state_.rope_table = memory_.back().as<float>();
        state_.rope_local_table = nullptr;
        if (c.rope_theta_local > 0) {  // Gemma 3's sliding layers
            const std::vector<float> local = rope_local_table(c);
            memory_.push_back(cuda::upload_floats(local.data(), local.size(), "the local RoPE"));
            state_.rope_local_table = memory_.back().as<float>();
        }
        for (int l = 0; l < c.layers; ++l)
            weights_.layers[l].rope_table =
                c.uses_local_rope(l) ? state_.rope_local_table : state_.rope_table;
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
        auto activations = [&](int cols, const std::string& what, size_t rows = 0) {
            cuda::DeviceActivations a;
            a.dtype = layer_gemm_input();
            a.tokens = rows > 0 ? int(rows) : B;
            a.cols = cols;
            a.pitch = cuda::padded_cols(cols, a.dtype);
            a.data = bytes(size_t(a.tokens) * activation_row_bytes(cols), what);
            return a;
        };
        PrefillState& s = prefill_;
        s.tokens = static_cast<int*>(bytes(size_t(B) * sizeof(int), "the prefill token ids"));
        s.x = floats(size_t(B) * c.dim, "prefill x");
        s.normed = activations(c.dim, "prefill normed");
        s.qkv = floats(size_t(B) * (c.q_dim() + 2 * c.kv_dim()), "prefill qkv");
        s.att = activations(c.q_dim(), "prefill att");
        s.projected = c.post_norms ? floats(size_t(B) * c.dim, "prefill projected") : nullptr;
        s.gate = floats(size_t(B) * c.hidden_dim, "prefill gate");
        s.up = floats(size_t(B) * c.hidden_dim, "prefill up");
        s.hidden = activations(c.hidden_dim, "prefill hidden");
        s.logits = floats(size_t(all_logits ? B : 1) * c.vocab_size, "prefill logits");
        if (c.experts > 0) {
            const size_t routes = size_t(B) * c.experts_per_token;
            s.router_input.dtype = DType::F32;
            s.router_input.tokens = B;
            s.router_input.cols = c.dim;
            s.router_input.pitch = cuda::padded_cols(c.dim, DType::F32);
            s.router_input.data = bytes(s.router_input.bytes(), "prefill router input");
            s.router_logits = floats(size_t(B) * c.experts, "prefill router logits");
            s.chosen = static_cast<int*>(bytes(routes * sizeof(int), "prefill routes"));
            s.route_weights = floats(routes, "prefill routing weights");
            s.route_rows = static_cast<int*>(bytes(2 * routes * sizeof(int), "prefill routes"));
            s.grouped_x = floats(routes * c.dim, "prefill expert inputs");
            s.grouped_normed = activations(c.dim, "prefill expert inputs", routes);
            s.expert_gate = floats(routes * c.moe_hidden_dim, "prefill expert gate");
            s.expert_up = floats(routes * c.moe_hidden_dim, "prefill expert up");
            s.expert_hidden = activations(c.moe_hidden_dim, "prefill expert hidden", routes);
            s.expert_out = floats(routes * c.dim, "prefill expert outputs");
            host_routes_ = PinnedBuffer(3 * routes * sizeof(int), "the prefill routes");
        }
        // Block types: always (prefill_bytes counted it). Q8/Q4 only where the GPU has room
        // for it after everything else: without it, the quantized tiles multiply Q8/Q4
        // weights (no model is refused for want of it).
        const size_t dequantized_bytes = dequantize_scratch_bytes(all_logits);
        const size_t free_bytes = free_device_bytes();
        if (dequantized_bytes > 0 &&
            (has_block_types() || dequantized_bytes + kMemoryHeadroom <= free_bytes))
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
        return AttentionShape{c.heads, c.kv_heads,        c.head_dim,
                              widest,  c.attention_scale, c.attn_logit_softcap};
    }

    // logits [rows, vocab_size] on the device = cap · tanh(logits / cap) with
    // final_logit_softcap (Gemma 2), in stream order; nothing when the model has none.
    void softcap_logits(float* logits, int rows) const {
        const Config& c = model_.config;
        if (c.final_logit_softcap > 0)
            cuda::softcap(logits, size_t(rows) * c.vocab_size, c.final_logit_softcap,
                          stream_.get());
    }

    const Model& model_;
    const int context_;
    const KvType kv_type_;
    const int kv_blocks_;      // the paged KV cache's blocks (BackendOptions::kv_blocks), or 0
    const int kv_block_size_;  // positions per block
    int splits_ = 1;           // attention blocks per KV head, fixed for the context
    int prefill_batch_ = 0;    // tokens per prefill batch; 0: prefill runs token by token
    // Declared before everything that uses it: destroyed last.
    Stream stream_;
    std::vector<DeviceBuffer> memory_;  // every device allocation (weights, state, cache)
    cuda::DeviceWeights weights_;
    DeviceState state_{};
    PrefillState prefill_{};
    StepState step_{};  // the paged cache's steps only
    // The GPU ladder's rungs 1-4 (BackendOptions::cuda_kernels below Fast); null on the
    // fast path.
    std::unique_ptr<cuda::LadderForward> ladder_;
    PinnedBuffer host_tokens_;       // [prefill_batch_]  a batch's token ids, copied to prefill_
    PinnedBuffer host_routes_;       // [3 * prefill_batch_ * k]  prefill_experts' routes
    PinnedBuffer host_step_;         // [2]  {token, pos}, copied to state_.step before each step
    PinnedBuffer host_logits_;       // [vocab_size]  what forward() returns
    PinnedBuffer host_step_rows_;    // StepState::rows' host copy
    PinnedBuffer host_step_logits_;  // [prefill_batch_, vocab_size]  what step() returns
    std::vector<float> all_logits_;  // [context, vocab_size] with BackendOptions::all_logits
    Graph graph_;
    GraphExec graph_exec_;
    // The server step's graphs, one per bucket of row counts (make_step_buckets; none without
    // graphs): a bucket's first step runs its kernels directly (each opting in to its shared
    // memory outside any capture), the second captures them, later ones replay the graph.
    struct StepGraph {
        int rows = 0;
        bool seen = false;
        Graph graph;
        GraphExec exec;
    };
    std::vector<StepGraph> step_buckets_;
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
#ifndef BARELLM_CUDA_EMULATION  // whose GPU needs no driver
    // The CUDA runtime loads the driver library itself; trying first gives a plain message
    // for the common case of a machine without an NVIDIA driver.
    if (void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL))
        dlclose(driver);
    else
        return unavailable("no NVIDIA GPU driver found (libcuda.so.1 cannot be loaded)");
#endif
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
