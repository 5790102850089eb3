// The CPU forward pass: tokens through the Llama transformer, top to bottom, with what the
// other families change where the model has it: Qwen2's q/k/v biases, Qwen3's per-head q/k
// norms, and Gemma 3's scaled embedding, norms of the sub-blocks' outputs, GeGLU, sliding
// layers with their own RoPE base, and attention scale (Gemma's norms, x · (1 + w), are plain
// RMSNorms here: the weight file holds the multipliers 1 + w); and Mixtral's and Qwen3-MoE's
// sparse layers, whose feed-forward is a mixture of experts (cpu/moe.h).
// `forward` runs one token (decode); `prefill` runs a batch of tokens as matrices.
#include <algorithm>
#include <vector>

#include "backend.h"
#include "commands/bench.h"
#include "cpu/kernels.h"
#include "cpu/moe.h"
#include "cpu/resident_weights.h"
#include "util/error.h"
#include "util/memory.h"

namespace barellm {

namespace {

constexpr int kMaxBatch = 512;     // prefill processes longer prompts in chunks of this size
constexpr size_t kSwigluCost = 8;  // one SiLU (an exp and a division) in multiply-adds
constexpr size_t kGegluCost = 12;  // one tanh-approximated GELU (SiLU's and a cubic)

// Every activation buffer and the KV cache, allocated once. Decode uses batch 1;
// prefill uses up to kMaxBatch rows (B below).
struct InferenceState {
    std::vector<float> x;                       // [B, dim]           residual stream
    std::vector<float> xb;                      // [B, dim]           normed input of a sub-block
    std::vector<float> q;                       // [B, heads * head_dim]
    std::vector<float> k;                       // [B, kv_heads * head_dim]
    std::vector<float> v;                       // [B, kv_heads * head_dim]
    std::vector<float> att;                     // [B, heads * head_dim]  attention output
    std::vector<float> scores;                  // [heads, context]   decode attention scratch
    std::vector<float> proj;                    // [B, dim]           output of wo or w2
    std::vector<float> gate;                    // [B, hidden_dim]    w1 x, then act(w1 x) * w3 x
    std::vector<float> up;                      // [B, hidden_dim]    w3 x
    std::vector<float> logits;                  // [vocab_size]       of the last token
    std::vector<uint8_t> key_cache;             // [layers, context, kv_dim] of kv_type
    std::vector<uint8_t> value_cache;           // [layers, context, kv_dim] of kv_type
    std::vector<float> rope_frequencies;        // [head_dim / 2]
    std::vector<float> rope_local_frequencies;  // [head_dim / 2] with rope_theta_local, else empty
};

class CpuBackend : public Backend {
public:
    CpuBackend(const Model& model, const BackendOptions& options)
        : model_(model),
          context_(options.context),
          kv_type_(options.kv_type),
          max_batch_(std::min(options.context, kMaxBatch)),
          // The layer and output matrices copied to 2 MiB pages; Q8 and Q4 ones in tiles of
          // 16 rows where the AVX-512 VNNI kernels will read them (cpu/resident_weights.h).
          weights_(cpu::resident_weights(model, cpu::uses_row_tiles())),
          experts_(model.config, max_batch_) {
        const Config& c = model.config;
        const size_t cache_bytes =
            size_t(c.layers) * context_ * c.kv_dim() * kv_element_bytes(kv_type_);
        const size_t B = max_batch_;
        const size_t activation_floats =
            B * (4 * size_t(c.dim) + 2 * c.q_dim() + 2 * c.kv_dim() + 2 * size_t(c.hidden_dim)) +
            size_t(c.heads) * context_ + c.vocab_size +
            cpu::MixtureOfExperts::buffer_floats(c, max_batch_);
        const size_t all_logits_floats = options.all_logits ? size_t(context_) * c.vocab_size : 0;
        const std::string what = options.all_logits
                                     ? "the KV cache, activations and logits of every position"
                                     : "the KV cache and activations";
        require_memory(2 * cache_bytes + (activation_floats + all_logits_floats) * sizeof(float),
                       what + " for a context of " + std::to_string(context_));
        InferenceState& s = state_;
        s.x.resize(B * c.dim);
        s.xb.resize(B * c.dim);
        s.q.resize(B * c.q_dim());
        s.k.resize(B * c.kv_dim());
        s.v.resize(B * c.kv_dim());
        s.att.resize(B * c.q_dim());
        s.scores.resize(size_t(c.heads) * context_);
        s.proj.resize(B * c.dim);
        s.gate.resize(B * c.hidden_dim);
        s.up.resize(B * c.hidden_dim);
        s.logits.resize(c.vocab_size);
        s.key_cache.resize(cache_bytes);
        s.value_cache.resize(cache_bytes);
        s.rope_frequencies = rope_inverse_frequencies(c);
        if (c.rope_theta_local > 0) s.rope_local_frequencies = rope_local_inverse_frequencies(c);
        all_logits_.resize(all_logits_floats);
    }

    std::string name() const override { return "cpu"; }
    int max_batch() const override { return max_batch_; }

    size_t kv_bytes_read(int pos) const override {
        const Config& c = model_.config;
        size_t positions = 0;  // summed over the layers
        for (int l = 0; l < c.layers; ++l)
            positions += pos + 1 - attention_start(pos, c.layer_window(l));
        return 2 * positions * c.kv_dim() * kv_element_bytes(kv_type_);
    }

    double measure_bandwidth_gbps() override { return measure_read_bandwidth(); }

    const float* forward(int token, int pos) override {
        const Config& c = model_.config;
        InferenceState& s = state_;
        check_tokens(c, &token, 1, pos, context_);
        // x = the token's row of the embedding table (Gemma: times √dim)
        cpu::embedding_row(s.x.data(), model_.token_embedding, token);
        scale_embedding(s.x.data(), 1);

        for (int l = 0; l < c.layers; ++l) {
            const LayerWeights& w = weights_.layers[l];
            const float* rope_frequencies = layer_rope_frequencies(l);
            // Attention: x += wo · attention(rope(wq · norm(x)), rope(wk · norm(x)), wv · norm(x))
            //   (Qwen2: + bq, bk, bv after the projections; Qwen3 and Gemma: each head of q and
            //    k RMS-normed before RoPE; with attention_bias: + bo after wo; Gemma: wo's
            //    output RMS-normed before the add, and scores scaled by attention_scale, not
            //    1/√head_dim; sliding layers attend to the last `window` positions, and Gemma's
            //    rotate with their own RoPE base)
            cpu::rmsnorm(s.xb.data(), s.x.data(), w.attn_norm, c.dim, c.norm_eps);
            cpu::matvec_many({{s.q.data(), s.xb.data(), &w.wq},
                              {s.k.data(), s.xb.data(), &w.wk},
                              {s.v.data(), s.xb.data(), &w.wv}});
            add_bias(s.q.data(), w.bq, c.q_dim());
            add_bias(s.k.data(), w.bk, c.kv_dim());
            add_bias(s.v.data(), w.bv, c.kv_dim());
            rmsnorm_heads(s.q.data(), w.q_norm, c.heads);
            rmsnorm_heads(s.k.data(), w.k_norm, c.kv_heads);
            cpu::rope(s.q.data(), c.heads, c.head_dim, pos, rope_frequencies);
            cpu::rope(s.k.data(), c.kv_heads, c.head_dim, pos, rope_frequencies);
            cpu::kv_store(cache_row(s.key_cache, l, pos), s.k.data(), c.kv_dim(), kv_type_);
            cpu::kv_store(cache_row(s.value_cache, l, pos), s.v.data(), c.kv_dim(), kv_type_);
            cpu::attention(s.att.data(), s.q.data(), pos, cache_row(s.key_cache, l, 0),
                           cache_row(s.value_cache, l, 0), s.scores.data(), attention_shape(l),
                           kv_type_);
            cpu::matvec(s.proj.data(), s.att.data(), w.wo);
            add_bias(s.proj.data(), w.bo, c.dim);
            post_norm(s.proj.data(), w.post_attn_norm, 1);
            for (int i = 0; i < c.dim; ++i) s.x[i] += s.proj[i];

            // Feed-forward: x += w2 · (act(w1 · norm(x)) * (w3 · norm(x)))
            //   (act: silu, SwiGLU; Gemma: gelu_tanh, GeGLU, and w2's output RMS-normed
            //    before the add; a sparse layer: the router picks k experts, and the sum of
            //    their feed-forwards, weighted by the router, takes the place of w1, w3, w2)
            cpu::rmsnorm(s.xb.data(), s.x.data(), w.ffn_norm, c.dim, c.norm_eps);
            if (c.is_sparse(l))
                experts_.decode(s.proj.data(), s.xb.data(), w);
            else
                dense_ffn(w);
            post_norm(s.proj.data(), w.post_ffn_norm, 1);
            for (int i = 0; i < c.dim; ++i) s.x[i] += s.proj[i];
        }

        // logits = output · norm(x)
        cpu::rmsnorm(s.x.data(), s.x.data(), model_.final_norm, c.dim, c.norm_eps);
        cpu::matvec(s.logits.data(), s.x.data(), weights_.output);
        return s.logits.data();
    }

    const float* prefill(const int* tokens, int count, int first_pos, bool all_logits) override {
        check_tokens(model_.config, tokens, count, first_pos, context_);
        if (all_logits && size_t(count) * model_.config.vocab_size > all_logits_.size())
            throw Error("prefill: every position's logits need BackendOptions::all_logits");
        const float* last = nullptr;
        for (int start = 0; start < count; start += max_batch_) {
            const int batch = std::min(max_batch_, count - start);
            float* logits_out = all_logits
                                    ? all_logits_.data() + size_t(start) * model_.config.vocab_size
                                    : nullptr;
            last = prefill_batch(tokens + start, batch, first_pos + start, logits_out);
        }
        return all_logits ? all_logits_.data() : last;
    }

private:
    // One batch of B tokens at positions first_pos.., the same math as `forward` on matrices.
    // Writes every row's logits to logits_out [B, vocab] if given; returns the last row's.
    const float* prefill_batch(const int* tokens, int B, int first_pos, float* logits_out) {
        const Config& c = model_.config;
        InferenceState& s = state_;
        for (int b = 0; b < B; ++b)
            cpu::embedding_row(&s.x[size_t(b) * c.dim], model_.token_embedding, tokens[b]);
        scale_embedding(s.x.data(), B);

        for (int l = 0; l < c.layers; ++l) {
            const LayerWeights& w = weights_.layers[l];
            const float* rope_frequencies = layer_rope_frequencies(l);
            rmsnorm_rows(s.xb.data(), s.x.data(), w.attn_norm, B);
            cpu::gemm_many(s.xb.data(), B,
                           {{s.q.data(), &w.wq}, {s.k.data(), &w.wk}, {s.v.data(), &w.wv}});
            cpu::for_each_row(B, c.q_dim() + c.kv_dim(), [&](int b) {
                const int pos = first_pos + b;
                float* q_row = &s.q[size_t(b) * c.q_dim()];
                float* k_row = &s.k[size_t(b) * c.kv_dim()];
                float* v_row = &s.v[size_t(b) * c.kv_dim()];
                add_bias(q_row, w.bq, c.q_dim());
                add_bias(k_row, w.bk, c.kv_dim());
                add_bias(v_row, w.bv, c.kv_dim());
                rmsnorm_heads(q_row, w.q_norm, c.heads);
                rmsnorm_heads(k_row, w.k_norm, c.kv_heads);
                cpu::rope(q_row, c.heads, c.head_dim, pos, rope_frequencies);
                cpu::rope(k_row, c.kv_heads, c.head_dim, pos, rope_frequencies);
                cpu::kv_store(cache_row(s.key_cache, l, pos), k_row, c.kv_dim(), kv_type_);
                cpu::kv_store(cache_row(s.value_cache, l, pos), v_row, c.kv_dim(), kv_type_);
            });
            cpu::attention_batch(s.att.data(), s.q.data(), B, first_pos,
                                 cache_row(s.key_cache, l, 0), cache_row(s.value_cache, l, 0),
                                 attention_shape(l), kv_type_);
            cpu::gemm(s.proj.data(), s.att.data(), B, w.wo);
            if (w.bo)
                cpu::for_each_row(
                    B, c.dim, [&](int b) { add_bias(&s.proj[size_t(b) * c.dim], w.bo, c.dim); });
            post_norm(s.proj.data(), w.post_attn_norm, B);
            add_rows(s.x.data(), s.proj.data(), B);

            rmsnorm_rows(s.xb.data(), s.x.data(), w.ffn_norm, B);
            if (c.is_sparse(l))
                experts_.prefill(s.proj.data(), s.xb.data(), B, w);
            else
                dense_ffn_rows(w, B);
            post_norm(s.proj.data(), w.post_ffn_norm, B);
            add_rows(s.x.data(), s.proj.data(), B);
        }

        if (logits_out) {
            rmsnorm_rows(s.x.data(), s.x.data(), model_.final_norm, B);
            cpu::gemm(logits_out, s.x.data(), B, weights_.output);
            return logits_out + size_t(B - 1) * c.vocab_size;
        }
        float* last_x = &s.x[size_t(B - 1) * c.dim];
        cpu::rmsnorm(last_x, last_x, model_.final_norm, c.dim, c.norm_eps);
        cpu::matvec(s.logits.data(), last_x, weights_.output);
        return s.logits.data();
    }

    // The dense feed-forward of one token: proj = w2 · (act(w1 · xb) * (w3 · xb)).
    void dense_ffn(const LayerWeights& w) {
        InferenceState& s = state_;
        cpu::matvec_many({{s.gate.data(), s.xb.data(), &w.w1}, {s.up.data(), s.xb.data(), &w.w3}});
        gated_activation(s.gate.data(), s.up.data());
        cpu::matvec(s.proj.data(), s.gate.data(), w.w2);
    }

    // The same for the B rows of xb, into the B rows of proj.
    void dense_ffn_rows(const LayerWeights& w, int B) {
        const Config& c = model_.config;
        InferenceState& s = state_;
        cpu::gemm_many(s.xb.data(), B, {{s.gate.data(), &w.w1}, {s.up.data(), &w.w3}});
        const size_t activation_cost =
            c.activation == Activation::GeluTanh ? kGegluCost : kSwigluCost;
        cpu::for_each_row(B, c.hidden_dim * activation_cost, [&](int b) {
            const size_t row = size_t(b) * c.hidden_dim;
            gated_activation(&s.gate[row], &s.up[row]);
        });
        cpu::gemm(s.proj.data(), s.gate.data(), B, w.w2);
    }

    // The element-wise steps of prefill, a row (token) per call, rows split across threads.
    //   out, x [rows, dim]
    void rmsnorm_rows(float* out, const float* x, const float* weight, int rows) const {
        const int dim = model_.config.dim;
        cpu::for_each_row(rows, dim, [&](int r) {
            cpu::rmsnorm(out + size_t(r) * dim, x + size_t(r) * dim, weight, dim,
                         model_.config.norm_eps);
        });
    }

    // x [rows, dim] *= embedding_scale (Gemma's √dim); nothing when it is 1.
    void scale_embedding(float* x, int rows) const {
        const float scale = model_.config.embedding_scale;
        if (scale == 1.0f) return;
        for (size_t i = 0; i < size_t(rows) * model_.config.dim; ++i) x[i] *= scale;
    }

    // A sub-block's output y [rows, dim] RMS-normed in place with `weight` before the residual
    // add (Gemma's post_attn_norm and post_ffn_norm); nothing when weight is nullptr.
    void post_norm(float* y, const float* weight, int rows) const {
        if (weight) rmsnorm_rows(y, y, weight, rows);
    }

    // gate[hidden_dim] = act(gate) * up: SwiGLU, or GeGLU where the config says (Gemma).
    void gated_activation(float* gate, const float* up) const {
        const Config& c = model_.config;
        if (c.activation == Activation::GeluTanh)
            cpu::geglu(gate, up, c.hidden_dim);
        else
            cpu::swiglu(gate, up, c.hidden_dim);
    }

    // The RoPE table of layer `layer`: the sliding layers' own with rope_theta_local (Gemma 3),
    // else the model's.
    const float* layer_rope_frequencies(int layer) const {
        return model_.config.uses_local_rope(layer) ? state_.rope_local_frequencies.data()
                                                    : state_.rope_frequencies.data();
    }

    // x += y, both [rows, dim]: the residual connection.
    void add_rows(float* x, const float* y, int rows) const {
        const int dim = model_.config.dim;
        cpu::for_each_row(rows, dim, [&](int r) {
            for (size_t i = size_t(r) * dim; i < size_t(r + 1) * dim; ++i) x[i] += y[i];
        });
    }

    // x += bias, both [n]; nothing when the model has no such bias (bias nullptr).
    static void add_bias(float* x, const float* bias, int n) {
        if (!bias) return;
        for (int i = 0; i < n; ++i) x[i] += bias[i];
    }

    // Each of the `heads` heads of x [heads, head_dim] RMS-normed in place with `weight`
    // [head_dim] (Qwen3's q_norm and k_norm); nothing when weight is nullptr.
    void rmsnorm_heads(float* x, const float* weight, int heads) const {
        if (!weight) return;
        const Config& c = model_.config;
        for (int h = 0; h < heads; ++h) {
            float* head = x + size_t(h) * c.head_dim;
            cpu::rmsnorm(head, head, weight, c.head_dim, c.norm_eps);
        }
    }

    AttentionShape attention_shape(int layer) const {
        const Config& c = model_.config;
        return AttentionShape{c.heads, c.kv_heads, c.head_dim, c.layer_window(layer),
                              c.attention_scale};
    }

    // The KV-cache row of layer `layer` at position `pos`.
    uint8_t* cache_row(std::vector<uint8_t>& cache, int layer, int pos) const {
        const size_t row_bytes = size_t(model_.config.kv_dim()) * kv_element_bytes(kv_type_);
        return cache.data() + (size_t(layer) * context_ + pos) * row_bytes;
    }

    const Model& model_;
    const int context_;
    const KvType kv_type_;
    const int max_batch_;
    const cpu::ResidentWeights weights_;
    cpu::MixtureOfExperts experts_;  // the sparse layers' feed-forward
    InferenceState state_;
    std::vector<float> all_logits_;  // [context, vocab_size] with BackendOptions::all_logits
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Model& model, const BackendOptions& options) {
    return std::make_unique<CpuBackend>(model, options);
}

}  // namespace barellm
