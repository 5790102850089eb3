// The model hyper-parameters, read from the weight file's `barellm.config`
// metadata (see docs/FORMAT.md) and checked for consistency.
#pragma once
#include <string>
#include <vector>

namespace barellm {

// How RoPE frequencies are rescaled for long context (Hugging Face `rope_scaling`).
struct RopeScaling {
    enum class Kind { None, Linear, Llama3 } kind = Kind::None;
    float factor = 1.0f;
    float low_freq_factor = 1.0f;   // llama3 only
    float high_freq_factor = 1.0f;  // llama3 only
    int original_context = 0;       // llama3 only: original_max_position_embeddings
};

struct Config {
    int dim = 0;         // residual stream width (hidden_size)
    int hidden_dim = 0;  // feed-forward width (intermediate_size)
    int layers = 0;
    int heads = 0;     // query heads
    int kv_heads = 0;  // key/value heads (GQA when fewer than heads)
    int head_dim = 0;
    int vocab_size = 0;
    int max_context = 0;
    float rope_theta = 10000.0f;
    RopeScaling rope_scaling;
    float norm_eps = 1e-5f;
    int sliding_window = 0;              // 0: attend to the whole context
    int sliding_window_first_layer = 0;  // layers before it attend to the whole context
    std::string architecture = "llama";  // llama, qwen2 or qwen3: the family, as `info` shows
    bool qkv_bias = false;  // q, k and v projections add a bias (Qwen2, attention_bias)
    bool o_bias = false;    // the output projection adds a bias (attention_bias)
    bool qk_norm = false;   // RMSNorm over each head of q and of k before RoPE (Qwen3)
    bool tied_embeddings = false;
    int bos_id = -1;  // -1: the model has none
    std::vector<int> eos_ids;
    bool add_bos = true;
    std::string weight_dtype;

    int q_dim() const { return heads * head_dim; }
    int kv_dim() const { return kv_heads * head_dim; }
    // The sliding window of layer `layer`, 0 where it attends to the whole context.
    int layer_window(int layer) const {
        return layer >= sliding_window_first_layer ? sliding_window : 0;
    }

    // Parses and validates the JSON text; `source` names the file in errors.
    static Config from_json(const std::string& json_text, const std::string& source);
};

// The inverse frequency of each rotated pair (head_dim / 2 values), with scaling applied.
std::vector<float> rope_inverse_frequencies(const Config& config);

}  // namespace barellm
