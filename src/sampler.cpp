// The sampler of sampler.h: greedy, or temperature and top-p from a seeded generator.
#include "sampler.h"

#include <algorithm>

#include "cpu/kernels.h"

namespace barellm {

int argmax(const float* values, int n) {
    return int(std::max_element(values, values + n) - values);
}

Sampler::Sampler(int vocab_size, float temperature, float top_p, uint64_t seed)
    : vocab_size_(vocab_size),
      temperature_(temperature),
      top_p_(top_p),
      generator_(seed),
      candidates_(vocab_size) {}

float Sampler::random_unit() {
    constexpr int kMantissaBits = 24;  // a float holds 24 random bits exactly
    return float(generator_() >> (64 - kMantissaBits)) / float(1u << kMantissaBits);
}

int Sampler::sample(float* logits) {
    const int best = argmax(logits, vocab_size_);
    if (temperature_ <= 0.0f || vocab_size_ == 1) return best;
    // The largest logit subtracted first: every scaled logit is at most 0, so however small
    // the temperature, a division overflows only to -inf, whose probability is exactly 0.
    const float largest = logits[best];
    for (int i = 0; i < vocab_size_; ++i) logits[i] = (logits[i] - largest) / temperature_;
    cpu::softmax(logits, vocab_size_);
    const float coin = random_unit();
    if (top_p_ > 0.0f && top_p_ < 1.0f) return sample_nucleus(logits, best, coin);
    float cumulative = 0.0f;
    for (int i = 0; i < vocab_size_; ++i) {
        cumulative += logits[i];
        if (coin < cumulative) return i;
    }
    return vocab_size_ - 1;  // rounding left the total just under 1
}

// Draws among the most probable tokens whose probabilities add up to top_p.
int Sampler::sample_nucleus(const float* probabilities, int best, float coin) {
    // A token below (1 - top_p) / (n - 1) can never be in the nucleus, unless it is the most
    // probable one (when all are about equal): skip sorting the others.
    const float cutoff = (1.0f - top_p_) / float(vocab_size_ - 1);
    int count = 0;
    for (int i = 0; i < vocab_size_; ++i)
        if (probabilities[i] >= cutoff || i == best) candidates_[count++] = {probabilities[i], i};
    std::sort(candidates_.begin(), candidates_.begin() + count,
              [](const auto& a, const auto& b) { return a.first > b.first; });
    float kept = 0.0f;
    int last = count - 1;
    for (int i = 0; i < count; ++i) {
        kept += candidates_[i].first;
        if (kept > top_p_) {
            last = i;
            break;
        }
    }
    const float target = coin * kept;
    float cumulative = 0.0f;
    for (int i = 0; i <= last; ++i) {
        cumulative += candidates_[i].first;
        if (target < cumulative) return candidates_[i].second;
    }
    return candidates_[last].second;
}

}  // namespace barellm
