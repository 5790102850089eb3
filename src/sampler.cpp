// The sampler of sampler.h: repeat penalty, top-k, top-p, min-p and temperature, in
// llama.cpp's order, from a seeded generator.
#include "sampler.h"

#include <algorithm>
#include <cmath>

#include "cpu/kernels.h"

namespace barellm {

namespace {

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

int Sampler::keep_top_p(int count, bool sorted) {
    const float largest = candidates_[0].logit;
    float total = 0.0f;
    for (int i = 0; i < count; ++i) total += std::exp(candidates_[i].logit - largest);
    if (!sorted) {
        // A token below (1 - top_p) / (count - 1) of the total can never be in the nucleus
        // unless it is the most probable one (when all are about equal): skip sorting it.
        // As a logit: exp(logit - largest) >= total * (1 - top_p) / (count - 1).
        const float cutoff = largest + std::log(total * (1.0f - options_.top_p) / float(count - 1));
        int kept = 1;  // candidates_[0] is the most probable
        for (int i = 1; i < count; ++i)
            if (candidates_[i].logit >= cutoff) candidates_[kept++] = candidates_[i];
        count = kept;
        std::sort(candidates_.begin(), candidates_.begin() + count,
                  [](const Candidate& a, const Candidate& b) {
                      return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
                  });
    }
    float cumulative = 0.0f;
    for (int i = 0; i < count; ++i) {
        cumulative += std::exp(candidates_[i].logit - largest) / total;
        if (cumulative >= options_.top_p) return i + 1;
    }
    return count;
}

// p >= min_p * p_max is logit >= largest + log(min_p); candidates_[0] holds the largest.
int Sampler::keep_min_p(int count) {
    const float threshold = candidates_[0].logit + std::log(options_.min_p);
    int kept = 1;
    for (int i = 1; i < count; ++i)
        if (candidates_[i].logit >= threshold) candidates_[kept++] = candidates_[i];
    return kept;
}

int Sampler::keep_candidates(const float* logits, int best) {
    // The most probable token first, so that every step keeps it; NaN never stays.
    int count = 0;
    candidates_[count++] = {logits[best], best};
    for (int i = 0; i < vocab_size_; ++i)
        if (i != best && !std::isnan(logits[i])) candidates_[count++] = {logits[i], i};
    bool sorted = false;
    if (options_.top_k > 0 && options_.top_k < count) {
        std::partial_sort(candidates_.begin(), candidates_.begin() + options_.top_k,
                          candidates_.begin() + count, [](const Candidate& a, const Candidate& b) {
                              return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
                          });
        count = options_.top_k;
        sorted = true;
    }
    if (options_.top_p < 1.0f && count > 1) count = keep_top_p(count, sorted);
    if (options_.min_p > 0.0f && count > 1) count = keep_min_p(count);
    return count;
}

void Sampler::to_probabilities(int count) {
    // The largest logit subtracted first: every scaled logit is at most 0, so however small
    // the temperature, a division overflows only to -inf, whose probability is exactly 0.
    float largest = candidates_[0].logit;
    for (int i = 1; i < count; ++i) largest = std::max(largest, candidates_[i].logit);
    float total = 0.0f;
    for (int i = 0; i < count; ++i) {
        candidates_[i].logit = std::exp((candidates_[i].logit - largest) / options_.temperature);
        total += candidates_[i].logit;
    }
    for (int i = 0; i < count; ++i) candidates_[i].logit /= total;
}

std::vector<std::pair<int, float>> Sampler::distribution(float* logits) {
    penalize_repeats(logits);
    const int best = argmax(logits, vocab_size_);
    if (is_greedy(logits, best)) return {{best, 1.0f}};
    const int count = keep_candidates(logits, best);
    to_probabilities(count);
    std::vector<std::pair<int, float>> out;
    for (int i = 0; i < count; ++i) out.emplace_back(candidates_[i].id, candidates_[i].logit);
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
        cumulative += candidates_[i].logit;
        if (coin < cumulative) return candidates_[i].id;
    }
    return candidates_[count - 1].id;
}

}  // namespace barellm
