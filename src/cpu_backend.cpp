// The CPU forward pass: one token through the Llama transformer, top to bottom.
#include <algorithm>
#include <vector>

#include "backend.h"
#include "error.h"

namespace barellm {

namespace {

// Every activation buffer and the KV cache, allocated once.
struct InferenceState {
    std::vector<float> x;                 // [dim]            residual stream
    std::vector<float> xb;                // [dim]            normed input of a sub-block
    std::vector<float> q;                 // [heads * head_dim]
    std::vector<float> k;                 // [kv_heads * head_dim]
    std::vector<float> v;                 // [kv_heads * head_dim]
    std::vector<float> att;               // [heads * head_dim]  attention output
    std::vector<float> scores;            // [heads, context]
    std::vector<float> proj;              // [dim]            output of wo or w2
    std::vector<float> gate;              // [hidden_dim]     w1 x, then silu(w1 x) * w3 x
    std::vector<float> up;                // [hidden_dim]     w3 x
    std::vector<float> logits;            // [vocab_size]
    std::vector<uint8_t> key_cache;       // [layers, context, kv_dim] of kv_type
    std::vector<uint8_t> value_cache;     // [layers, context, kv_dim] of kv_type
    std::vector<float> rope_frequencies;  // [head_dim / 2]
};

class CpuBackend : public Backend {
public:
    CpuBackend(const Model& model, const BackendOptions& options)
        : model_(model), context_(options.context), kv_type_(options.kv_type) {
        const Config& c = model.config;
        const size_t cache_bytes = size_t(c.layers) * context_ * c.kv_dim() * kv_element_bytes();
        InferenceState& s = state_;
        s.x.resize(c.dim);
        s.xb.resize(c.dim);
        s.q.resize(c.q_dim());
        s.k.resize(c.kv_dim());
        s.v.resize(c.kv_dim());
        s.att.resize(c.q_dim());
        s.scores.resize(size_t(c.heads) * context_);
        s.proj.resize(c.dim);
        s.gate.resize(c.hidden_dim);
        s.up.resize(c.hidden_dim);
        s.logits.resize(c.vocab_size);
        s.key_cache.resize(cache_bytes);
        s.value_cache.resize(cache_bytes);
        s.rope_frequencies = rope_inverse_frequencies(c);
    }

    std::string name() const override { return "cpu"; }

    size_t kv_bytes_read(int pos) const override {
        const Config& c = model_.config;
        return 2 * size_t(c.layers) * size_t(attended_positions(pos)) * c.kv_dim() *
               kv_element_bytes();
    }

    const float* forward(int token, int pos) override {
        const Config& c = model_.config;
        InferenceState& s = state_;
        if (token < 0 || token >= c.vocab_size)
            throw Error("token id " + std::to_string(token) + " is outside the vocabulary");
        if (pos < 0 || pos >= context_)
            throw Error("position " + std::to_string(pos) + " is outside the context of " +
                        std::to_string(context_));
        cpu::embedding_row(s.x.data(), model_.token_embedding, token);

        for (int l = 0; l < c.layers; ++l) {
            const LayerWeights& w = model_.layers[l];
            // Attention: x += wo · attention(rope(wq · norm(x)), rope(wk · norm(x)), wv · norm(x))
            cpu::rmsnorm(s.xb.data(), s.x.data(), w.attn_norm, c.dim, c.norm_eps);
            cpu::matmul(s.q.data(), s.xb.data(), w.wq);
            cpu::matmul(s.k.data(), s.xb.data(), w.wk);
            cpu::matmul(s.v.data(), s.xb.data(), w.wv);
            cpu::rope(s.q.data(), c.heads, c.head_dim, pos, s.rope_frequencies.data());
            cpu::rope(s.k.data(), c.kv_heads, c.head_dim, pos, s.rope_frequencies.data());
            cpu::kv_store(cache_row(s.key_cache, l, pos), s.k.data(), c.kv_dim(), kv_type_);
            cpu::kv_store(cache_row(s.value_cache, l, pos), s.v.data(), c.kv_dim(), kv_type_);
            const int first = pos + 1 - attended_positions(pos);
            const cpu::AttentionShape shape{c.heads, c.kv_heads, c.head_dim, first, pos};
            cpu::attention(s.att.data(), s.q.data(), cache_row(s.key_cache, l, first),
                           cache_row(s.value_cache, l, first), s.scores.data(), shape, kv_type_);
            cpu::matmul(s.proj.data(), s.att.data(), w.wo);
            for (int i = 0; i < c.dim; ++i) s.x[i] += s.proj[i];

            // Feed-forward: x += w2 · (silu(w1 · norm(x)) * (w3 · norm(x)))
            cpu::rmsnorm(s.xb.data(), s.x.data(), w.ffn_norm, c.dim, c.norm_eps);
            cpu::matmul(s.gate.data(), s.xb.data(), w.w1);
            cpu::matmul(s.up.data(), s.xb.data(), w.w3);
            cpu::swiglu(s.gate.data(), s.up.data(), c.hidden_dim);
            cpu::matmul(s.proj.data(), s.gate.data(), w.w2);
            for (int i = 0; i < c.dim; ++i) s.x[i] += s.proj[i];
        }

        cpu::rmsnorm(s.x.data(), s.x.data(), model_.final_norm, c.dim, c.norm_eps);
        cpu::matmul(s.logits.data(), s.x.data(), model_.output);
        return s.logits.data();
    }

private:
    size_t kv_element_bytes() const { return kv_type_ == cpu::KvType::F32 ? 4 : 2; }

    // Positions a query at `pos` attends to: all before it, or the sliding window.
    int attended_positions(int pos) const {
        const int window = model_.config.sliding_window;
        return window > 0 ? std::min(pos + 1, window) : pos + 1;
    }

    // The KV-cache row of layer `layer` at position `pos`.
    uint8_t* cache_row(std::vector<uint8_t>& cache, int layer, int pos) const {
        const size_t row_bytes = size_t(model_.config.kv_dim()) * kv_element_bytes();
        return cache.data() + (size_t(layer) * context_ + pos) * row_bytes;
    }

    const Model& model_;
    const int context_;
    const cpu::KvType kv_type_;
    InferenceState state_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Model& model, const BackendOptions& options) {
    return std::make_unique<CpuBackend>(model, options);
}

}  // namespace barellm
