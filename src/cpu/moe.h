// The feed-forward of a sparse layer, a mixture of experts (Mixtral, Qwen3-MoE, gpt-oss), on
// the CPU. A router scores the layer's experts for each token (f32 logits, plus a bias in
// gpt-oss; softmax), the token goes to the experts_per_token best (route_token), and the
// layer's output is the sum of those experts' gated feed-forward outputs (gpt-oss: each matrix
// adding its expert's bias), each times its routing weight. Only the chosen experts' matrices
// are read: decode runs the k experts' matvecs in one parallel region, so the threads share
// their rows; prefill groups the batch's tokens by expert and runs one GEMM per expert over
// its tokens, then adds each token's k results back, weighted.
#pragma once
#include <vector>

#include "cpu/kernels.h"
#include "weights/model.h"

namespace barellm::cpu {

// The routing of one token from its router logits [experts] (overwritten with the
// probabilities): p = softmax(logits); the k = experts_per_token largest p, best first, a tie
// going to the lower index (torch.topk's order, which transformers' Mixtral and Qwen3-MoE
// use); weights = those p, divided by their sum with norm_topk_prob. experts[k], weights[k].
void route_token(int* experts, float* weights, float* logits, const Config& config);

class MixtureOfExperts {
public:
    // No buffers until reserve.
    explicit MixtureOfExperts(const Config& config) : config_(config) {}

    // Allocates the buffers for batches of up to max_batch tokens (buffer_floats of them).
    void reserve(int max_batch);

    // Decode: out[dim] = Σ_j weight_j · w2_j (act(w1_j · x) * (w3_j · x)) over the k experts
    // j the router of layer `w` picks for x [dim] (the normed residual); with expert_biases,
    // each of w1_j, w3_j and w2_j adds expert j's bias.
    void decode(float* out, const float* x, const LayerWeights& w);

    // Prefill: the same for each of the B rows of x [B, dim], into out [B, dim].
    void prefill(float* out, const float* x, int B, const LayerWeights& w);

    // Floats of the buffers for max_batch tokens (for the memory check).
    static size_t buffer_floats(const Config& config, int max_batch);

private:
    // act(gate) * up in place of gate, rows of moe_hidden_dim.
    void activate_rows(float* gate, const float* up, int rows) const;

    const Config& config_;
    std::vector<float> logits_;      // [B, experts]  router logits, then probabilities
    std::vector<int> chosen_;        // [B, k]  each token's experts, best first
    std::vector<float> weights_;     // [B, k]  their routing weights
    std::vector<int> slot_;          // [B, k]  row of (token, j) in the grouped buffers
    std::vector<int> expert_start_;  // [experts + 1]  first grouped row of each expert
    std::vector<float> grouped_x_;   // [B * k, dim]  tokens' x, grouped by expert
    std::vector<float> gate_;        // [B * k, moe_hidden_dim]
    std::vector<float> up_;          // [B * k, moe_hidden_dim]
    std::vector<float> expert_out_;  // [B * k, dim]
    std::vector<MatvecTask> tasks_;  // decode's matvecs
};

}  // namespace barellm::cpu
