// `run --chat` hides a reasoning reply's <think>...</think> block (ThinkBlockFilter,
// src/tokenizer/chat.h) and shows only the final channel of a harmony reply
// (HarmonyChannelFilter): the text shown is the same however the reply is cut into pieces,
// a marker split across pieces included.
#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/chat.h"

using namespace barellm;

namespace {

// The filter's output for `text` fed as the pieces that start at `cuts` (sorted offsets).
template <typename Filter>
std::string filtered(const std::string& text, const std::vector<size_t>& cuts) {
    Filter filter;
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

// Harmony replies, with the texts of their special tokens, and what is shown of them.
const std::vector<std::pair<std::string, std::string>> kHarmonyReplies = {
    {"<|channel|>analysis<|message|>The user greets me.<|end|><|start|>assistant<|channel|>final"
     "<|message|>Hello!",
     "Hello!"},
    {"<|channel|>final<|message|>Direct.<|return|>", "Direct."},
    {"<|channel|>analysis<|message|>a <|en b<|end|><|start|>assistant<|channel|>final<|message|>"
     "x <| y <|end z<|end|>",
     "x <| y <|end z"},
    {"<|channel|>analysis<|message|>only thinking", ""},
    {"<|channel|>final<|message|>ends with a partial marker <|ret",
     "ends with a partial marker <|ret"},
    {"<|channel|>analysis<|message|>ends inside a header<|end|><|start|>assistant<|chan", ""},
    {"<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>", ""},
    {"<|channel|>final <|constrain|>text<|message|>A<|end|><|start|>assistant<|channel|>final"
     "<|message|>B",
     "AB"},
    {"<|channel|>finally<|message|>not final<|end|>", ""},
    {"<|start|>assistant<|message|>no channel<|end|>", ""},
    {"plain text that is never a message <|channel|>final", ""},
    {"<|channel|>final<|message|><|channel|>final<|message|> is text here",
     "<|channel|>final<|message|> is text here"},
    {"<|channel|>analysis<|message|><|message|><|end|><|channel|>final<|message|>caf\xc3\xa9",
     "caf\xc3\xa9"},
};

// Every way of cutting `reply` into one, two or three pieces, and into single bytes, shows
// `shown`.
template <typename Filter>
void check_every_split(const std::string& reply, const std::string& shown) {
    INFO(reply);
    REQUIRE(filtered<Filter>(reply, {}) == shown);
    for (size_t cut = 0; cut <= reply.size(); ++cut)
        REQUIRE(filtered<Filter>(reply, {cut}) == shown);
    for (size_t first = 0; first <= reply.size(); ++first)
        for (size_t second = first; second <= reply.size(); ++second)
            REQUIRE(filtered<Filter>(reply, {first, second}) == shown);
    std::vector<size_t> every_byte;
    for (size_t cut = 1; cut < reply.size(); ++cut) every_byte.push_back(cut);
    REQUIRE(filtered<Filter>(reply, every_byte) == shown);
}

}  // namespace

TEST_CASE("the think block is hidden whatever the pieces", "[chat]") {
    for (const auto& [reply, shown] : kReplies) check_every_split<ThinkBlockFilter>(reply, shown);
}

TEST_CASE("only harmony's final channel is shown, whatever the pieces", "[chat]") {
    for (const auto& [reply, shown] : kHarmonyReplies)
        check_every_split<HarmonyChannelFilter>(reply, shown);
}

TEST_CASE("harmony's final channel against a model of the format on random replies", "[chat]") {
    // Random sequences of markers and short texts, cut at random: the filter shows what a
    // direct reading of the whole reply gives (each <|message|> opens a body that the next
    // end marker closes; the body is shown when its header names the final channel).
    const std::vector<std::string> parts = {
        "<|start|>", "assistant",  "<|channel|>", "final", "analysis", " to=x", "<|message|>",
        "<|end|>",   "<|return|>", "<|call|>",    "<|",    "|>",       "end",   "\xe2\x82\xac"};
    const std::vector<std::string> ends = {"<|end|>", "<|return|>", "<|call|>"};
    const std::string message = "<|message|>", channel = "<|channel|>", final_name = "final";
    std::mt19937 random(1);
    for (int trial = 0; trial < 2000; ++trial) {
        std::string reply;
        const int count = int(random() % 24);
        for (int i = 0; i < count; ++i) reply += parts[random() % parts.size()];
        std::string want;
        size_t at = 0;
        for (;;) {
            const size_t body = reply.find(message, at);
            if (body == std::string::npos) break;
            const std::string header = reply.substr(at, body - at);
            const size_t name = header.find(channel);
            const size_t after_name = name + channel.size() + final_name.size();
            const bool final_channel =
                name != std::string::npos &&
                header.compare(name + channel.size(), final_name.size(), final_name) == 0 &&
                (header.size() == after_name || header[after_name] == ' ' ||
                 header[after_name] == '<');
            const size_t text = body + message.size();
            size_t end = std::string::npos, end_length = 0;
            for (const std::string& marker : ends) {
                const size_t found = reply.find(marker, text);
                if (found < end) {
                    end = found;
                    end_length = marker.size();
                }
            }
            if (final_channel) want += reply.substr(text, end - text);
            if (end == std::string::npos) break;
            at = end + end_length;
        }
        std::vector<size_t> cuts;
        for (size_t cut = 1; cut < reply.size(); ++cut)
            if (random() % 3 == 0) cuts.push_back(cut);
        INFO(reply);
        REQUIRE(filtered<HarmonyChannelFilter>(reply, cuts) == want);
    }
}
