// `run --chat` hides a reasoning reply's <think>...</think> block (ThinkBlockFilter,
// src/tokenizer/chat.h): the text shown is the same however the reply is cut into pieces,
// a marker split across pieces included.
#include <catch2/catch.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/chat.h"

using namespace barellm;

namespace {

// The filter's output for `text` fed as the pieces that start at `cuts` (sorted offsets).
std::string filtered(const std::string& text, const std::vector<size_t>& cuts) {
    ThinkBlockFilter filter;
    std::string shown;
    size_t begin = 0;
    for (size_t cut : cuts) {
        shown += filter.feed(text.substr(begin, cut - begin));
        begin = cut;
    }
    shown += filter.feed(text.substr(begin));
    return shown + filter.finish();
}

// Reply text and what is shown of it (checked by hand).
const std::vector<std::pair<std::string, std::string>> kReplies = {
    {"<think>\nThe user greets me.\n</think>\n\nHello!", "Hello!"},
    {"No reasoning here.", "No reasoning here."},
    {"<think>\n\n</think>\n\nShort.", "Short."},
    {"Before <think> hidden </think>  after", "Before after"},
    {"<think>never closed", ""},
    {"ends with a partial marker <thi", "ends with a partial marker <thi"},
    {"a < b and </think> outside a block", "a < b and </think> outside a block"},
    {"<think>a</think>b<think>c</think>d", "bd"},
    {"<think>x</think>\n\n", ""},
};

}  // namespace

TEST_CASE("the think block is hidden whole", "[chat]") {
    for (const auto& [reply, shown] : kReplies) REQUIRE(filtered(reply, {}) == shown);
}

TEST_CASE("the think block is hidden whatever the pieces", "[chat]") {
    for (const auto& [reply, shown] : kReplies) {
        for (size_t cut = 0; cut <= reply.size(); ++cut) REQUIRE(filtered(reply, {cut}) == shown);
        for (size_t first = 0; first <= reply.size(); ++first)
            for (size_t second = first; second <= reply.size(); ++second)
                REQUIRE(filtered(reply, {first, second}) == shown);
        std::vector<size_t> every_byte;
        for (size_t cut = 1; cut < reply.size(); ++cut) every_byte.push_back(cut);
        REQUIRE(filtered(reply, every_byte) == shown);
    }
}
