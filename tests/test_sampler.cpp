// The sampler: its steps against their definitions (llama.cpp's, worked out by hand on
// chosen logits), and a valid token id for every finite input: huge logits, tiny
// temperatures, ties, one token, and nucleus thresholds anywhere in (0, 1].
#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "generation/sampler.h"

using namespace barellm;

namespace {

constexpr int kDraws = 200;  // draws per case, each from a fresh copy of the logits

// Draws kDraws tokens from `logits` and returns how often each id came out.
std::vector<int> draw_counts(const std::vector<float>& logits, float temperature, float top_p) {
    SamplingOptions options;
    options.temperature = temperature;
    options.top_p = top_p;
    Sampler sampler(int(logits.size()), options, /*seed=*/1);
    std::vector<int> counts(logits.size());
    for (int draw = 0; draw < kDraws; ++draw) {
        std::vector<float> scratch = logits;
        const int id = sampler.sample(scratch.data());
        REQUIRE(id >= 0);
        REQUIRE(id < int(logits.size()));
        ++counts[id];
    }
    return counts;
}

const std::vector<float> kTopPs = {FLT_MIN, 1e-6f, 0.1f, 0.5f, 0.9f, std::nextafter(1.0f, 0.0f),
                                   1.0f};

}  // namespace

TEST_CASE("a temperature that overflows the scaled logits picks the largest logit", "[sampler]") {
    const std::vector<float> logits = {200.0f, 100.0f, -50.0f, 150.0f};
    for (float top_p : kTopPs) {
        INFO("top_p " << top_p);
        CHECK(draw_counts(logits, 1.2e-38f, top_p)[0] == kDraws);
    }
}

TEST_CASE("logits near the float range sample within the vocabulary", "[sampler]") {
    const std::vector<float> logits = {FLT_MAX, -FLT_MAX, 3e38f, -3e38f, 0.0f, FLT_MAX / 2};
    for (float temperature : {1.2e-38f, 1e-3f, 0.8f, 100.0f})
        for (float top_p : kTopPs) {
            INFO("temperature " << temperature << ", top_p " << top_p);
            const std::vector<int> counts = draw_counts(logits, temperature, top_p);
            CHECK(counts[1] == 0);  // exp(-FLT_MAX - FLT_MAX) is exactly 0
        }
}

TEST_CASE("tied and equal logits sample only among the tied best", "[sampler]") {
    for (float top_p : kTopPs) {
        INFO("top_p " << top_p);
        const std::vector<int> tied = draw_counts({7.0f, 1.0f, 7.0f, -2.0f}, 1e-30f, top_p);
        CHECK(tied[0] + tied[2] == kDraws);
        const std::vector<int> equal = draw_counts(std::vector<float>(50, 3.0f), 0.8f, top_p);
        int drawn = 0;
        for (int count : equal) drawn += count;
        CHECK(drawn == kDraws);
    }
}

TEST_CASE("one token is always that token", "[sampler]") {
    for (float temperature : {0.0f, 1e-38f, 1.0f})
        for (float top_p : kTopPs) CHECK(draw_counts({-FLT_MAX}, temperature, top_p)[0] == kDraws);
}

TEST_CASE("the nucleus keeps the fewest most likely tokens that reach top_p", "[sampler]") {
    // Probabilities 0.6, 0.3, 0.1 at temperature 1.
    const std::vector<float> logits = {std::log(0.6f), std::log(0.3f), std::log(0.1f)};
    CHECK(draw_counts(logits, 1.0f, 0.5f)[0] == kDraws);
    const std::vector<int> two = draw_counts(logits, 1.0f, 0.8f);
    CHECK(two[2] == 0);
    CHECK(two[0] > two[1]);
    CHECK(two[1] > 0);
    CHECK(draw_counts(logits, 1.0f, 1.0f)[2] > 0);
}

TEST_CASE("temperature 0 is the first largest logit", "[sampler]") {
    CHECK(draw_counts({1.0f, 5.0f, 5.0f, -FLT_MAX}, 0.0f, 0.9f)[1] == kDraws);
}

TEST_CASE("non-finite logits still give an id in the vocabulary", "[sampler]") {
    const float nan = std::nanf(""), inf = INFINITY;
    for (const std::vector<float>& logits : std::vector<std::vector<float>>{
             {nan, 1.0f, 2.0f}, {1.0f, nan, 2.0f}, {inf, 1.0f, -inf}, {-inf, -inf, -inf}})
        for (float top_p : kTopPs) draw_counts(logits, 0.8f, top_p);
}

// ---- the sampling steps against their definitions, on logits chosen so that the expected
// probabilities can be worked out by hand -------------------------------------------------

namespace {

// Probabilities 0.1, 0.4, 0.05, 0.3, 0.15 at temperature 1: sorted, ids 1, 3, 4, 0, 2.
const std::vector<float> kFive = {std::log(0.1f), std::log(0.4f), std::log(0.05f), std::log(0.3f),
                                  std::log(0.15f)};

// The distribution the sampler draws from, as a map from id to probability.
std::map<int, float> distribution(const std::vector<float>& logits, const SamplingOptions& options,
                                  const std::vector<int>& accepted = {}) {
    Sampler sampler(int(logits.size()), options, /*seed=*/1);
    for (int id : accepted) sampler.accept(id);
    std::vector<float> scratch = logits;
    std::map<int, float> out;
    for (const auto& [id, probability] : sampler.distribution(scratch.data()))
        out[id] = probability;
    return out;
}

SamplingOptions neutral(float temperature) {
    SamplingOptions options;
    options.temperature = temperature;
    options.top_p = 1.0f;
    return options;
}

// `got` has exactly the ids of `want`, each with its probability.
void check_distribution(const std::map<int, float>& got, const std::map<int, float>& want) {
    REQUIRE(got.size() == want.size());
    for (const auto& [id, probability] : want) {
        INFO("id " << id);
        REQUIRE(got.count(id) == 1);
        CHECK(got.at(id) == Approx(probability).epsilon(1e-5));
    }
}

}  // namespace

TEST_CASE("top-k keeps the k largest logits", "[sampler]") {
    SamplingOptions options = neutral(1.0f);
    options.top_k = 2;
    check_distribution(distribution(kFive, options), {{1, 0.4f / 0.7f}, {3, 0.3f / 0.7f}});
    options.top_k = 5;  // the whole vocabulary: off
    check_distribution(distribution(kFive, options),
                       {{0, 0.1f}, {1, 0.4f}, {2, 0.05f}, {3, 0.3f}, {4, 0.15f}});
}

TEST_CASE("top-p keeps the fewest most probable tokens that reach p", "[sampler]") {
    SamplingOptions options = neutral(1.0f);
    options.top_p = 0.65f;
    check_distribution(distribution(kFive, options), {{1, 0.4f / 0.7f}, {3, 0.3f / 0.7f}});
    options.top_p = 0.75f;
    check_distribution(distribution(kFive, options),
                       {{1, 0.4f / 0.85f}, {3, 0.3f / 0.85f}, {4, 0.15f / 0.85f}});
}

TEST_CASE("min-p keeps the tokens of at least p times the largest probability", "[sampler]") {
    SamplingOptions options = neutral(1.0f);
    options.min_p = 0.3f;  // 0.12 and above
    check_distribution(distribution(kFive, options),
                       {{1, 0.4f / 0.85f}, {3, 0.3f / 0.85f}, {4, 0.15f / 0.85f}});
    options.min_p = 0.5f;  // 0.2 and above
    check_distribution(distribution(kFive, options), {{1, 0.4f / 0.7f}, {3, 0.3f / 0.7f}});
}

TEST_CASE("top-k comes before top-p, which sees the renormalised top k", "[sampler]") {
    // Alone, top-p 0.8 keeps 0.4 + 0.3 + 0.15. After top-k 3 the three are 0.47, 0.35,
    // 0.18, and the first two reach 0.8.
    SamplingOptions options = neutral(1.0f);
    options.top_p = 0.8f;
    CHECK(distribution(kFive, options).size() == 3);
    options.top_k = 3;
    check_distribution(distribution(kFive, options), {{1, 0.4f / 0.7f}, {3, 0.3f / 0.7f}});
}

TEST_CASE("the temperature applies to what top-p and min-p kept at temperature 1", "[sampler]") {
    // At temperature 2 the kept probabilities go as sqrt(p); had the temperature come first,
    // top-p 0.65 would keep three tokens (sqrt(p) normalised: 0.30, 0.26, 0.18, ...).
    SamplingOptions options = neutral(2.0f);
    options.top_p = 0.65f;
    const float a = std::sqrt(0.4f), b = std::sqrt(0.3f);
    check_distribution(distribution(kFive, options), {{1, a / (a + b)}, {3, b / (a + b)}});
    // At temperature 0.5 they go as p^2; min-p 0.5 keeps p >= 0.2 whatever the temperature.
    options = neutral(0.5f);
    options.min_p = 0.5f;
    check_distribution(distribution(kFive, options), {{1, 0.16f / 0.25f}, {3, 0.09f / 0.25f}});
}

TEST_CASE("the repeat penalty divides positive and multiplies negative logits", "[sampler]") {
    SamplingOptions options = neutral(0.0f);
    options.repeat_penalty = 2.0f;
    const std::vector<float> logits = {2.0f, -1.0f, 1.5f, 0.5f};
    // No history: greedy picks 0.
    check_distribution(distribution(logits, options), {{0, 1.0f}});
    // 0 penalised (twice in the window, once applied): 2 -> 1, below 1.5.
    check_distribution(distribution(logits, options, {0, 1, 0}), {{2, 1.0f}});
    // 2 and 0 penalised: 1.5 -> 0.75 and 2 -> 1, 0 wins again.
    options.repeat_last_n = 2;
    check_distribution(distribution(logits, options, {1, 2, 0}), {{0, 1.0f}});
    // The window of 1 holds only the last token, 0.
    options.repeat_last_n = 1;
    check_distribution(distribution(logits, options, {2, 0}), {{2, 1.0f}});
    // Negative logits move away from 0: -1 -> -2 falls below -1.5.
    options.repeat_last_n = 64;
    check_distribution(distribution({-1.0f, -1.5f}, options, {0}), {{1, 1.0f}});
    // At temperature 1 the penalised log(0.5) becomes log(0.25): three equal tokens.
    options.temperature = 1.0f;
    check_distribution(
        distribution({std::log(0.5f), std::log(0.25f), std::log(0.25f)}, options, {0}),
        {{0, 1.0f / 3}, {1, 1.0f / 3}, {2, 1.0f / 3}});
    // Penalty 1 changes nothing.
    options.repeat_penalty = 1.0f;
    check_distribution(
        distribution({std::log(0.5f), std::log(0.25f), std::log(0.25f)}, options, {0}),
        {{0, 0.5f}, {1, 0.25f}, {2, 0.25f}});
}

TEST_CASE("draws come only from the kept tokens, the same ones for the same seed", "[sampler]") {
    SamplingOptions options = neutral(1.0f);
    options.top_k = 3;
    options.min_p = 0.5f;  // of 0.4, 0.3, 0.15 only the first two
    Sampler first(int(kFive.size()), options, /*seed=*/42), second(int(kFive.size()), options, 42);
    std::vector<int> counts(kFive.size());
    for (int draw = 0; draw < kDraws; ++draw) {
        std::vector<float> a = kFive, b = kFive;
        const int id = first.sample(a.data());
        CHECK(id == second.sample(b.data()));
        ++counts[id];
    }
    CHECK(counts[1] + counts[3] == kDraws);
    CHECK(counts[1] > counts[3]);
    CHECK(counts[3] > 0);
}

TEST_CASE("top-p over many tokens keeps the same nucleus as sorting them all", "[sampler]") {
    // 1000 logits with ties and a long flat tail; the nucleus by the definition: sort by
    // probability (lower id first among equals) and take the shortest prefix reaching p.
    std::mt19937 generator(5);
    std::vector<float> logits(1000);
    for (float& logit : logits) logit = float(int(generator() % 400)) / 50.0f;
    std::vector<double> probabilities(logits.size());
    double total = 0;
    for (size_t i = 0; i < logits.size(); ++i) total += probabilities[i] = std::exp(logits[i]);
    std::vector<int> order(logits.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return logits[a] > logits[b]; });
    for (float top_p : {0.05f, 0.3f, 0.61f, 0.9f, 0.999f}) {
        INFO("top_p " << top_p);
        std::set<int> want;
        double cumulative = 0;
        for (int id : order) {
            want.insert(id);
            cumulative += probabilities[id] / total;
            if (cumulative >= top_p) break;
        }
        SamplingOptions options = neutral(1.0f);
        options.top_p = top_p;
        std::set<int> got;
        for (const auto& [id, probability] : distribution(logits, options)) got.insert(id);
        CHECK(got == want);
    }
}
