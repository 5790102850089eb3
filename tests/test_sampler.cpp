// The sampler returns a valid token id for every finite input: huge logits, tiny
// temperatures, ties, one token, and nucleus thresholds anywhere in (0, 1].
#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <vector>

#include "sampler.h"

using namespace barellm;

namespace {

constexpr int kDraws = 200;  // draws per case, each from a fresh copy of the logits

// Draws kDraws tokens from `logits` and returns how often each id came out.
std::vector<int> draw_counts(const std::vector<float>& logits, float temperature, float top_p) {
    Sampler sampler(int(logits.size()), temperature, top_p, /*seed=*/1);
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
