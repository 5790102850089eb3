// Picks the next token from the logits, with llama.cpp's definitions of each step and its
// default order:
//   1. repeat penalty: the logit of every token among the last repeat_last_n accepted is
//      divided by repeat_penalty when positive, multiplied by it when negative;
//   2. top-k: the k largest logits stay;
//   3. top-p: the fewest most probable tokens whose probabilities (softmax at temperature 1
//      over what stayed) reach top_p stay;
//   4. min-p: the tokens whose probability is at least min_p times the largest stay;
//   5. temperature: a random draw from the softmax of the logits that stayed, divided by
//      the temperature; temperature 0 takes the largest logit after the penalty (greedy).
// Each step is off at its neutral value (penalty 1, k 0, top_p 1, min_p 0). The draws come
// from one generator seeded once, so a seed gives the same tokens for the same logits.
#pragma once
#include <cstdint>
#include <deque>
#include <random>
#include <utility>
#include <vector>

namespace barellm {

struct SamplingOptions {
    float temperature = 0.8f;
    float top_p = 0.9f;
    int top_k = 0;
    float min_p = 0.0f;
    float repeat_penalty = 1.0f;
    int repeat_last_n = 64;  // how many accepted tokens the penalty looks back over
};

class Sampler {
public:
    Sampler(int vocab_size, const SamplingOptions& options, uint64_t seed);
    // `logits` [vocab_size] is used as scratch and overwritten.
    int sample(float* logits);
    // The tokens a draw from `logits` picks among, with their probabilities (which add up
    // to 1), in no particular order; one token with probability 1 when greedy. `logits` is
    // overwritten as by sample().
    std::vector<std::pair<int, float>> distribution(float* logits);
    // Appends `id` to the text the repeat penalty looks back over (prompt and output alike).
    void accept(int id);
    // Forgets the accepted tokens (a new conversation).
    void clear_history();

private:
    struct Candidate {
        float value;  // the logit; its probability after to_probabilities()
        int id;
    };
    float random_unit();  // uniform in [0, 1)
    void penalize_repeats(float* logits);
    // Fills candidates_ with the tokens steps 2-4 keep; returns how many.
    int keep_candidates(const float* logits, int best);
    // Move the candidates of candidates_[0, count) that the step keeps to the front and
    // return how many; `largest` is the largest logit.
    int keep_top_p(int count, float largest);
    int keep_min_p(int count, float largest);
    // Turns the kept candidates' logits into probabilities at the temperature.
    void to_probabilities(int count);
    bool is_greedy(const float* logits, int best) const;

    int vocab_size_;
    SamplingOptions options_;
    std::mt19937_64 generator_;
    std::vector<Candidate> candidates_;  // [vocab_size]
    std::deque<int> recent_;             // the last repeat_last_n accepted tokens
    std::vector<uint8_t> penalized_;     // [vocab_size] scratch: already penalized this step
};

int argmax(const float* values, int n);

}  // namespace barellm
