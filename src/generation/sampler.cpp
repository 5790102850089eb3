// The sampler of sampler.h: repeat penalty, top-k, top-p, min-p and temperature, in
// llama.cpp's order, from a seeded generator.
#include "generation/sampler.h"

#include <algorithm>
#include <cmath>

#include "cpu/kernels.h"

namespace barellm {

namespace {

// The order top-k and top-p select by: the larger value first, the lower id among equals.
constexpr auto larger_first = [](const auto& a, const auto& b) {
    return a.value > b.value || (a.value == b.value && a.id < b.id);
};

// Whether every token stays for the draw (no top-k, top-p or min-p).
bool filters_off(const SamplingOptions& options) {
    return options.top_k == 0 && options.top_p >= 1.0f && options.min_p <= 0.0f;
}

}  // namespace

int argmax(const float* values, int n) {
    return int(std::max_element(values, values + n) - values);
}

Sampler::Sampler(int vocab_size, const SamplingOptions& options, uint64_t seed)
    : vocab_size_(vocab_size),
      options_(options),
      generator_(seed),
      candidates_(vocab_size),
      penalized_(vocab_size) {}

float Sampler::random_unit() {
    constexpr int kMantissaBits = 24;  // a float holds 24 random bits exactly
    return float(generator_() >> (64 - kMantissaBits)) / float(1u << kMantissaBits);
}

void Sampler::accept(int id) {
    if (options_.repeat_last_n <= 0 || options_.repeat_penalty == 1.0f) return;
    recent_.push_back(id);
    if (int(recent_.size()) > options_.repeat_last_n) recent_.pop_front();
}

void Sampler::clear_history() { recent_.clear(); }

// Each token of the window once, however often it occurs there (llama.cpp's definition).
void Sampler::penalize_repeats(float* logits) {
    for (int id : recent_) {
        if (id < 0 || id >= vocab_size_ || penalized_[id]) continue;
        penalized_[id] = 1;
        float& logit = logits[id];
        logit = logit > 0 ? logit / options_.repeat_penalty : logit * options_.repeat_penalty;
    }
    for (int id : recent_)
        if (id >= 0 && id < vocab_size_) penalized_[id] = 0;
}

// Greedy at temperature 0, with one token, or when the largest logit is not a finite
// number (no softmax of it is meaningful).
bool Sampler::is_greedy(const float* logits, int best) const {
    return options_.temperature <= 0.0f || vocab_size_ == 1 || !std::isfinite(logits[best]);
}

// The nucleus is the k most probable candidates for the smallest k whose probabilities
// reach top_p: found by halving the range k may lie in, each time selecting (not sorting)
// the larger half of it, so that it takes time in proportion to the candidates.
int Sampler::keep_top_p(int count, float largest) {
    const auto weight = [&](int i) { return std::exp(candidates_[i].value - largest); };
    float total = 0.0f;
    for (int i = 0; i < count; ++i) total += weight(i);
    const float target = options_.top_p * total;
    const auto begin = candidates_.begin();
    // candidates_[0, low) are the `low` most probable, their weights adding up to `above`,
    // less than the target; the nucleus has more than `low` and at most `high` of them.
    int low = 0, high = count;
    float above = 0.0f;
    while (high - low > 1) {
        const int middle = low + (high - low) / 2;
        std::nth_element(begin + low, begin + middle, begin + high, larger_first);
        float weight_to_middle = above;
        for (int i = low; i < middle; ++i) weight_to_middle += weight(i);
        if (weight_to_middle >= target) {
            high = middle;
        } else {
            low = middle;
            above = weight_to_middle;
        }
    }
    return high;
}

// p >= min_p * p_max is logit >= largest + log(min_p).
int Sampler::keep_min_p(int count, float largest) {
    const float threshold = largest + std::log(options_.min_p);
    int kept = 0;
    for (int i = 0; i < count; ++i)
        if (candidates_[i].value >= threshold) candidates_[kept++] = candidates_[i];
    return kept;
}

int Sampler::keep_candidates(const float* logits, int best) {
    int count = 0;  // NaN never stays
    for (int i = 0; i < vocab_size_; ++i)
        if (!std::isnan(logits[i])) candidates_[count++] = {logits[i], i};
    if (options_.top_k > 0 && options_.top_k < count) {
        std::nth_element(candidates_.begin(), candidates_.begin() + options_.top_k,
                         candidates_.begin() + count, larger_first);
        count = options_.top_k;
    }
    if (options_.top_p < 1.0f && count > 1) count = keep_top_p(count, logits[best]);
    if (options_.min_p > 0.0f && count > 1) count = keep_min_p(count, logits[best]);
    return count;
}

void Sampler::to_probabilities(int count) {
    // The largest logit subtracted first: every scaled logit is at most 0, so however small
    // the temperature, a division overflows only to -inf, whose probability is exactly 0.
    float largest = candidates_[0].value;
    for (int i = 1; i < count; ++i) largest = std::max(largest, candidates_[i].value);
    float total = 0.0f;
    for (int i = 0; i < count; ++i) {
        candidates_[i].value = std::exp((candidates_[i].value - largest) / options_.temperature);
        total += candidates_[i].value;
    }
    for (int i = 0; i < count; ++i) candidates_[i].value /= total;
}

std::vector<std::pair<int, float>> Sampler::distribution(float* logits) {
    penalize_repeats(logits);
    const int best = argmax(logits, vocab_size_);
    if (is_greedy(logits, best)) return {{best, 1.0f}};
    const int count = keep_candidates(logits, best);
    to_probabilities(count);
    std::vector<std::pair<int, float>> out;
    for (int i = 0; i < count; ++i) out.emplace_back(candidates_[i].id, candidates_[i].value);
    return out;
}

int Sampler::sample(float* logits) {
    penalize_repeats(logits);
    const int best = argmax(logits, vocab_size_);
    if (is_greedy(logits, best)) return best;
    const float coin = random_unit();
    if (filters_off(options_)) {
        // The whole vocabulary, in its order.
        const float largest = logits[best];
        for (int i = 0; i < vocab_size_; ++i)
            logits[i] = (logits[i] - largest) / options_.temperature;
        cpu::softmax(logits, vocab_size_);
        float cumulative = 0.0f;
        for (int i = 0; i < vocab_size_; ++i) {
            cumulative += logits[i];
            if (coin < cumulative) return i;
        }
        return vocab_size_ - 1;  // rounding left the total just under 1
    }
    const int count = keep_candidates(logits, best);
    to_probabilities(count);
    float cumulative = 0.0f;
    for (int i = 0; i < count; ++i) {
        cumulative += candidates_[i].value;
        if (coin < cumulative) return candidates_[i].id;
    }
    return candidates_[count - 1].id;
}

}  // namespace barellm
