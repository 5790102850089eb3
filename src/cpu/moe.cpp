// The mixture-of-experts feed-forward on the CPU (cpu/moe.h).
#include "cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace barellm::cpu {

namespace {

// The router as a matrix: f32 [experts, dim].
Matrix router_matrix(const LayerWeights& w, const Config& c) {
    return Matrix{w.router, DType::F32, c.experts, c.dim, nullptr};
}

// rows [count, n] += expert e's bias, biases + e · n, in each row (gpt-oss's expert_b1, b3, b2);
// nothing where the model has none (biases nullptr).
void add_expert_bias(float* rows, int count, int n, const float* biases, int e) {
    if (!biases) return;
    const float* bias = biases + size_t(e) * n;
    for_each_row(count, n, [&](int r) {
        float* row = rows + size_t(r) * n;
        for (int i = 0; i < n; ++i) row[i] += bias[i];
    });
}

// logits [rows, experts] += the router's bias (gpt-oss); nothing where it has none.
void add_router_bias(float* logits, int rows, const LayerWeights& w, const Config& c) {
    if (!w.router_bias) return;
    for (size_t i = 0; i < size_t(rows) * c.experts; ++i) logits[i] += w.router_bias[i % c.experts];
}

}  // namespace

void route_token(int* experts, float* weights, float* logits, const Config& config) {
    const int k = config.experts_per_token;
    softmax(logits, config.experts);
    std::vector<int> order(config.experts);
    std::iota(order.begin(), order.end(), 0);
    // Larger first, ties to the lower index (transformers' rule). A NaN (from weights that
    // are not finite) ranks as −inf, so that the order stays a strict weak order.
    const auto rank = [&](int e) { return std::isnan(logits[e]) ? -INFINITY : logits[e]; };
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
        return rank(a) > rank(b) || (rank(a) == rank(b) && a < b);
    });
    float sum = 0;
    for (int j = 0; j < k; ++j) {
        experts[j] = order[j];
        weights[j] = logits[order[j]];
        sum += weights[j];
    }
    if (config.norm_topk_prob)
        for (int j = 0; j < k; ++j) weights[j] /= sum;
}

size_t MixtureOfExperts::buffer_floats(const Config& c, int max_batch) {
    const size_t B = max_batch, routed = B * c.experts_per_token;
    return B * c.experts + routed * (2 * size_t(c.dim) + 2 * size_t(c.moe_hidden_dim)) + 2 * routed;
}

void MixtureOfExperts::reserve(int max_batch) {
    const Config& c = config_;
    if (c.experts == 0) return;
    const size_t B = max_batch, routed = B * c.experts_per_token;
    logits_.resize(B * c.experts);
    chosen_.resize(routed);
    weights_.resize(routed);
    slot_.resize(routed);
    expert_start_.resize(c.experts + 1);
    grouped_x_.resize(routed * c.dim);
    gate_.resize(routed * c.moe_hidden_dim);
    up_.resize(routed * c.moe_hidden_dim);
    expert_out_.resize(routed * c.dim);
}

void MixtureOfExperts::activate_rows(float* gate, const float* up, int rows) const {
    const int H = config_.moe_hidden_dim;
    for_each_row(rows, size_t(H) * 8, [&](int r) {
        const size_t row = size_t(r) * H;
        gated_activation(gate + row, up + row, H, config_);
    });
}

void MixtureOfExperts::decode(float* out, const float* x, const LayerWeights& w) {
    const Config& c = config_;
    const int k = c.experts_per_token, H = c.moe_hidden_dim;
    // The router: which k experts, with what weights.
    matvec(logits_.data(), x, router_matrix(w, c));
    add_router_bias(logits_.data(), 1, w, c);
    route_token(chosen_.data(), weights_.data(), logits_.data(), c);
    // gate_j = w1_j · x and up_j = w3_j · x for the k experts, all rows in one region...
    tasks_.clear();
    for (int j = 0; j < k; ++j) {
        const int e = chosen_[j];
        tasks_.push_back({&gate_[size_t(j) * H], x, &w.expert_w1[e]});
        tasks_.push_back({&up_[size_t(j) * H], x, &w.expert_w3[e]});
    }
    matvec_many(tasks_.data(), int(tasks_.size()));
    for (int j = 0; j < k; ++j) {
        add_expert_bias(&gate_[size_t(j) * H], 1, H, w.expert_b1, chosen_[j]);
        add_expert_bias(&up_[size_t(j) * H], 1, H, w.expert_b3, chosen_[j]);
    }
    activate_rows(gate_.data(), up_.data(), k);
    // ... then down_j = w2_j · act(gate_j) * up_j likewise...
    tasks_.clear();
    for (int j = 0; j < k; ++j)
        tasks_.push_back(
            {&expert_out_[size_t(j) * c.dim], &gate_[size_t(j) * H], &w.expert_w2[chosen_[j]]});
    matvec_many(tasks_.data(), int(tasks_.size()));
    for (int j = 0; j < k; ++j)
        add_expert_bias(&expert_out_[size_t(j) * c.dim], 1, c.dim, w.expert_b2, chosen_[j]);
    // ... and out = Σ_j weight_j down_j.
    for (int i = 0; i < c.dim; ++i) {
        float sum = 0;
        for (int j = 0; j < k; ++j) sum += weights_[j] * expert_out_[size_t(j) * c.dim + i];
        out[i] = sum;
    }
}

void MixtureOfExperts::prefill(float* out, const float* x, int B, const LayerWeights& w) {
    const Config& c = config_;
    const int k = c.experts_per_token, H = c.moe_hidden_dim, dim = c.dim;
    // Route every token.
    gemm(logits_.data(), x, B, router_matrix(w, c));
    add_router_bias(logits_.data(), B, w, c);
    for_each_row(B, size_t(c.experts) * 16, [&](int b) {
        route_token(&chosen_[size_t(b) * k], &weights_[size_t(b) * k],
                    &logits_[size_t(b) * c.experts], c);
    });
    // Group the (token, j) pairs by expert: expert e's tokens take the grouped rows
    // expert_start_[e] .. expert_start_[e + 1] - 1, in token order.
    std::fill(expert_start_.begin(), expert_start_.end(), 0);
    for (int i = 0; i < B * k; ++i) ++expert_start_[chosen_[i] + 1];
    std::partial_sum(expert_start_.begin(), expert_start_.end(), expert_start_.begin());
    std::vector<int> next(expert_start_.begin(), expert_start_.end() - 1);
    for (int i = 0; i < B * k; ++i) slot_[i] = next[chosen_[i]]++;
    for_each_row(B * k, dim, [&](int i) {
        std::copy_n(x + size_t(i / k) * dim, dim, &grouped_x_[size_t(slot_[i]) * dim]);
    });
    // Each expert once, over its tokens: a GEMM for w1 and w3, the activation, one for w2.
    for (int e = 0; e < c.experts; ++e) {
        const int first = expert_start_[e], count = expert_start_[e + 1] - first;
        if (count == 0) continue;
        float* gate = &gate_[size_t(first) * H];
        float* up = &up_[size_t(first) * H];
        gemm_many(&grouped_x_[size_t(first) * dim], count,
                  {{gate, &w.expert_w1[e]}, {up, &w.expert_w3[e]}});
        add_expert_bias(gate, count, H, w.expert_b1, e);
        add_expert_bias(up, count, H, w.expert_b3, e);
        activate_rows(gate, up, count);
        float* down = &expert_out_[size_t(first) * dim];
        gemm(down, gate, count, w.expert_w2[e]);
        add_expert_bias(down, count, dim, w.expert_b2, e);
    }
    // Each token's k outputs back, weighted.
    for_each_row(B, size_t(dim) * k, [&](int b) {
        float* row = out + size_t(b) * dim;
        std::fill_n(row, dim, 0.0f);
        for (int j = 0; j < k; ++j) {
            const float weight = weights_[size_t(b) * k + j];
            const float* expert_row = &expert_out_[size_t(slot_[size_t(b) * k + j]) * dim];
            for (int i = 0; i < dim; ++i) row[i] += weight * expert_row[i];
        }
    });
}

}  // namespace barellm::cpu
