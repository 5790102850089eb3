// The model hyper-parameters, read from the weight file's `barellm.config`
// metadata (see docs/FORMAT.md) and checked for consistency.
#pragma once
#include <string>
#include <vector>

namespace barellm {

// How RoPE frequencies are rescaled for long context (Hugging Face `rope_scaling`).
struct RopeScaling {
    enum class Kind { None, Linear, Llama3, LongRope, Yarn } kind = Kind::None;
    float factor = 1.0f;
    float low_freq_factor = 1.0f;   // llama3 only
    float high_freq_factor = 1.0f;  // llama3 only
    int original_context = 0;       // llama3, longrope, yarn: original_max_position_embeddings
    // YaRN (Qwen's long context): the pairs that turn fewer than beta_slow times over the
    // original context divided by `factor`, those that turn more than beta_fast times kept,
    // a linear ramp over the pair index between (its ends rounded outward with `truncate`);
    // cos and sin multiplied by attention_factor.
    float beta_fast = 32.0f, beta_slow = 1.0f;
    bool truncate = true;
    // LongRoPE (Phi-3, Phi-4): rotated pair j's frequency is divided by short_factors[j], or by
    // long_factors[j] when the context allocated exceeds original_context; cos and sin are
    // multiplied by attention_factor.
    std::vector<float> short_factors, long_factors;  // rotary_dim / 2 each
    float attention_factor = 1.0f;                   // longrope, yarn
};

// The feed-forward gate's activation: SiLU (SwiGLU, Llama and Qwen), GELU with the tanh
// approximation (GeGLU, Gemma), or gpt-oss's clamped SwiGLU (SwigluOai): with g = min(gate,
// limit) and u = clamp(up, -limit, limit), act(gate) * up is g · σ(kSwigluOaiAlpha · g) · (u + 1).
enum class Activation { Silu, GeluTanh, SwigluOai };
constexpr float kSwigluOaiAlpha = 1.702f;

struct Config {
    int dim = 0;         // residual stream width (hidden_size)
    int hidden_dim = 0;  // feed-forward width (intermediate_size)
    int layers = 0;
    int heads = 0;     // query heads
    int kv_heads = 0;  // key/value heads (GQA when fewer than heads)
    int head_dim = 0;
    // Elements of each q and k head RoPE rotates (partial_rotary_factor · head_dim): the pairs
    // (j, j + head_dim/2) for j < rotary_dim/2; the others pass unchanged. from_json: given or
    // head_dim; 0 counts as head_dim.
    int rotary_dim = 0;
    int vocab_size = 0;
    int max_context = 0;
    float rope_theta = 10000.0f;
    RopeScaling rope_scaling;
    float norm_eps = 1e-5f;
    int sliding_window = 0;              // 0: attend to the whole context
    int sliding_window_first_layer = 0;  // layers before it attend to the whole context
    std::string architecture = "llama";  // llama, qwen2, qwen3, gemma2, gemma3, ... (`info`)
    bool qkv_bias = false;  // q, k and v projections add a bias (Qwen2, attention_bias)
    bool o_bias = false;    // the output projection adds a bias (attention_bias)
    bool qk_norm = false;   // RMSNorm over each head of q and of k before RoPE (Qwen3)
    // Attention sinks (gpt-oss): each query head's softmax has one more logit, the head's
    // learned `sinks` value, whose value vector is zero: it takes a share of the probability.
    bool attention_sinks = false;
    bool tied_embeddings = false;
    int bos_id = -1;  // -1: the model has none
    std::vector<int> eos_ids;
    bool add_bos = true;
    std::string weight_dtype;
    Activation activation = Activation::Silu;
    float swiglu_limit = 0.0f;         // SwigluOai's clamp of the gate and the up projection
    float embedding_scale = 1.0f;      // multiplies the embedding row (Gemma: sqrt(dim))
    bool post_norms = false;           // RMSNorm of the attention and feed-forward outputs (Gemma)
    std::vector<bool> sliding_layers;  // per layer (Gemma); empty: sliding_window_first_layer
    float rope_theta_local = 0.0f;     // RoPE base of sliding layers, unscaled; 0: rope_theta
    float attention_scale = 0.0f;      // multiplies q·k; from_json: given or 1/sqrt(head_dim)
    // Soft-capping (Gemma 2): a score s becomes cap · tanh(s / cap), within (-cap, cap); 0: none.
    float attn_logit_softcap = 0.0f;   // of the attention scores, after attention_scale
    float final_logit_softcap = 0.0f;  // of the logits
    // Mixture of experts (Mixtral, Qwen3-MoE); experts 0: every layer dense. A sparse layer's
    // feed-forward is `experts` networks of width moe_hidden_dim and a router that sends
    // each token to experts_per_token of them; the dense ones (dense_layers) keep hidden_dim.
    int experts = 0;
    int experts_per_token = 0;
    int moe_hidden_dim = 0;
    bool norm_topk_prob = false;     // the chosen experts' weights rescaled to sum to 1
    bool expert_biases = false;      // the router and each expert's three matrices add biases
    std::vector<bool> dense_layers;  // per layer with experts; empty: every layer sparse

    int q_dim() const { return heads * head_dim; }
    int kv_dim() const { return kv_heads * head_dim; }
    // The sliding window of layer `layer`, 0 where it attends to the whole context.
    int layer_window(int layer) const {
        if (!sliding_layers.empty()) return sliding_layers[layer] ? sliding_window : 0;
        return layer >= sliding_window_first_layer ? sliding_window : 0;
    }
    // Whether layer `layer`'s feed-forward is a mixture of experts.
    bool is_sparse(int layer) const {
        return experts > 0 && (dense_layers.empty() || !dense_layers[layer]);
    }
    // Whether layer `layer` rotates with rope_local_inverse_frequencies (a sliding layer of a
    // model with rope_theta_local).
    bool uses_local_rope(int layer) const {
        return rope_theta_local > 0 && layer_window(layer) > 0;
    }

    // Parses and validates the JSON text; `source` names the file in errors.
    static Config from_json(const std::string& json_text, const std::string& source);
};

// A RoPE table, as every rope kernel reads it: head_dim floats, the inverse frequency of each
// pair j < head_dim/2 (elements j and j + head_dim/2 of a head), then each pair's magnitude.
// Pair j at position pos is rotated by the angle pos · inverse_frequency[j], and its cos and
// sin are multiplied by magnitude[j]. The pairs past rotary_dim / 2 have frequency 0 and
// magnitude 1: they pass unchanged.
//
// The table of every layer, or of the full-attention layers of a model with
// rope_theta_local: from rope_theta, with rope_scaling applied; `context` is the number of
// positions allocated (LongRoPE picks its long factors beyond original_context).
std::vector<float> rope_table(const Config& config, int context);
// The same from rope_theta_local, unscaled: the RoPE of the sliding layers (Gemma 3).
// Requires rope_theta_local > 0.
std::vector<float> rope_local_table(const Config& config);

}  // namespace barellm
