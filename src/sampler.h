// Picks the next token from the logits: greedy (temperature 0), or a random draw
// from the softmax at a temperature, optionally restricted to the top-p nucleus.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace barellm {

class Sampler {
public:
    Sampler(int vocab_size, float temperature, float top_p, uint64_t seed);
    // `logits` [vocab_size] is used as scratch and overwritten.
    int sample(float* logits);

private:
    float random_unit();  // uniform in [0, 1)
    int sample_nucleus(const float* probabilities, int best, float coin);

    int vocab_size_;
    float temperature_;
    float top_p_;
    std::mt19937_64 generator_;
    std::vector<std::pair<float, int>> candidates_;  // [vocab_size] (probability, id)
};

int argmax(const float* values, int n);

}  // namespace barellm
