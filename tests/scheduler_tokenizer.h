// The tokenizer the scheduler tests share (test_scheduler.cpp, test_scheduler_cpu.cpp): a
// tokenizer.json with pieces "a".."z", "th", "\u2581" (a space), "w34".."w39", byte
// tokens for "é", BOS, EOS and an end-of-turn token, kSchedulerVocab ids in all.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

constexpr int kSchedulerVocab = 40;

inline std::string scheduler_tokenizer_json() {
    nlohmann::json vocab = {{"<unk>", 0}, {"<s>", 1},    {"</s>", 2},
                            {"<eot>", 3}, {"<0xC3>", 4}, {"<0xA9>", 5}};
    for (int i = 0; i < 26; ++i) vocab[std::string(1, char('a' + i))] = 6 + i;
    vocab["th"] = 32;
    vocab["\xE2\x96\x81"] = 33;
    for (int i = 34; i < kSchedulerVocab; ++i) vocab["w" + std::to_string(i)] = i;
    nlohmann::json added = nlohmann::json::array();
    for (auto [text, id] : {std::pair<const char*, int>{"<s>", 1}, {"</s>", 2}, {"<eot>", 3}})
        added.push_back({{"id", id},
                         {"content", text},
                         {"single_word", false},
                         {"lstrip", false},
                         {"rstrip", false},
                         {"normalized", false},
                         {"special", true}});
    return nlohmann::json{
        {"version", "1.0"},
        {"added_tokens", added},
        {"normalizer", nullptr},
        {"pre_tokenizer", nullptr},
        {"decoder",
         {{"type", "Sequence"},
          {"decoders",
           {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
            {{"type", "ByteFallback"}},
            {{"type", "Fuse"}}}}}},
        {"model",
         {{"type", "BPE"},
          {"unk_token", "<unk>"},
          {"byte_fallback", true},
          {"vocab", vocab},
          {"merges", {"t h"}}}}}
        .dump();
}
