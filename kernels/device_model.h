// The model and the decode activations in device memory, as the CUDA backend's forward
// passes read them: the fast path (forward.cu: CudaBackend::record_forward) and the GPU
// ladder's simpler rungs (ladder_forward.cu). Pointers into memory the backend owns. Host
// code only.
#pragma once
#include <vector>

#include "kernels.h"  // DeviceMatrix

namespace barellm::cuda {

// One layer's weights and KV cache in device memory.
struct DeviceLayer {
    const float* attn_norm;  // [dim]
    // [heads * head_dim + 2 * kv_heads * head_dim, dim]: wq, wk, wv stacked, one matrix where
    // the three share a type (every uniform file), else runs of one type in row order
    std::vector<DeviceMatrix> wqkv;
    // Present only where the config says so (else nullptr):
    const float* qkv_bias;  // [heads * head_dim + 2 * kv_heads * head_dim]: bq, bk, bv (qkv_bias)
    const float* q_norm;    // [head_dim]  per-head RMSNorm of q before RoPE (qk_norm)
    const float* k_norm;    // [head_dim]  the same of k (qk_norm)
    const float* sinks;     // [heads]  each query head's attention sink logit (attention_sinks)
    DeviceMatrix wo;        // [dim, heads * head_dim]
    const float* o_bias;    // [dim]  (o_bias; else nullptr)
    const float* post_attn_norm;  // [dim]  RMSNorm of wo's output (post_norms; else nullptr)
    const float* ffn_norm;        // [dim]
    // A dense layer's feed-forward (empty in a sparse one):
    DeviceMatrix w1;  // [hidden_dim, dim]  gate
    DeviceMatrix w3;  // [hidden_dim, dim]  up
    DeviceMatrix w2;  // [dim, hidden_dim]  down
    // A sparse layer's (Config::is_sparse; empty in a dense one): the router, f32, and the
    // experts' matrices, each role's stacked in expert order
    DeviceMatrix router;       // [experts, dim]
    DeviceExperts experts_w1;  // [experts * moe_hidden_dim, dim]  gate
    DeviceExperts experts_w3;  // [experts * moe_hidden_dim, dim]  up
    DeviceExperts experts_w2;  // [experts * dim, moe_hidden_dim]  down
    // With expert_biases (else nullptr): the router's bias and each expert's, expert e's at
    // e * moe_hidden_dim (b1, b3) or e * dim (b2)
    const float* router_bias;    // [experts]
    const float* expert_b1;      // [experts * moe_hidden_dim]  gate
    const float* expert_b3;      // [experts * moe_hidden_dim]  up
    const float* expert_b2;      // [experts * dim]  down
    const float* post_ffn_norm;  // [dim]  RMSNorm of w2's output (post_norms; else nullptr)
    // [context, kv_dim] of kv_type: this layer's part of the key cache; with the server's
    // paged cache (BackendOptions::kv_blocks) its pool [kv_blocks * kv_block_size, kv_dim]
    void* key_cache;
    void* value_cache;  // the same of the value cache
    int window;         // sliding window of this layer, 0 for none (Config::layer_window)
    // [head_dim]  the layer's RoPE table: DeviceState::rope_table, or for a sliding layer
    // of a model with rope_theta_local (Gemma 3) DeviceState::rope_local_table
    const float* rope_table;

    // Whether the feed-forward is a mixture of experts.
    bool sparse() const { return router.data != nullptr; }
};

// Every weight of the model in device memory.
struct DeviceWeights {
    DeviceMatrix embedding;  // [vocab_size, dim]
    std::vector<DeviceLayer> layers;
    const float* final_norm = nullptr;  // [dim]
    DeviceMatrix output;                // [vocab_size, dim]; the embedding when tied
};

// The activations of one decode step, in device memory, allocated once.
struct DeviceState {
    int* step;         // [2]  {token, pos} of the step being run
    float* x;          // [dim]  residual stream
    float* qkv;        // [q_dim + 2 * kv_dim]  q (rotated in place), k, v of the token
    float* att;        // [q_dim]  attention output
    float* projected;  // [dim]  wo's or w2's output before its post norm (post_norms)
    float* hidden;     // [hidden_dim]  act(w1 · norm(x)) * (w3 · norm(x))
    float* up;         // [hidden_dim]  w3 · norm(x) where w1 and w3 differ in type
    float* logits;     // [vocab_size]
    // A sparse layer's (models with experts; else null), k = experts_per_token:
    float* router_logits;     // [experts]
    int* chosen;              // [k]  the token's experts, best first
    float* route_weights;     // [k]  their weights
    float* expert_gate;       // [k, hidden_pitch]  w1_j · norm(x), then act(..) * up
    float* expert_up;         // [k, hidden_pitch]  w3_j · norm(x)
    float* expert_out;        // [k, dim]  w2_j · hidden_j
    float* partial_out;       // [heads, splits, head_dim]  flash-decoding partial outputs
    float* partial_stats;     // [heads, splits, 2]  their running (max, sum)
    unsigned* arrivals;       // [kv_heads * head groups]  attention blocks done (0 between steps)
    float* rope_table;        // [head_dim]  barellm::rope_table
    float* rope_local_table;  // [head_dim]  barellm::rope_local_table, or null
};

}  // namespace barellm::cuda
