// `barellm serve` reads the calls out of a reply (ToolCallReader, src/tokenizer/chat_tools.h):
// the text and calls it gives are the same however the reply is cut into pieces, a marker split
// across pieces included; what is not a call after all passes as it was written. And
// python_json writes JSON as Python's json.dumps(ensure_ascii=False) does.
#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "tokenizer/chat_tools.h"

using namespace barellm;

namespace {

struct Read {
    std::string text;
    std::vector<ToolCall> calls;
    std::vector<size_t> calls_after;  // how much text came before each call
};

void collect(const std::vector<ReplyPart>& parts, Read& read) {
    for (const ReplyPart& part : parts) {
        read.text += part.text;
        if (part.call) {
            read.calls.push_back(*part.call);
            read.calls_after.push_back(read.text.size());
        }
    }
}

// What the reader gives for `text` fed as the pieces that start at `cuts` (sorted offsets).
Read read_reply(ToolFormat format, const std::string& text, const std::vector<size_t>& cuts) {
    ToolCallReader reader(format);
    Read read;
    size_t begin = 0;
    for (size_t cut : cuts) {
        collect(reader.feed(text.substr(begin, cut - begin)), read);
        begin = cut;
    }
    collect(reader.feed(text.substr(begin)), read);
    collect(reader.finish(), read);
    return read;
}

struct Case {
    std::string reply;
    std::string text;                           // the text passed on
    std::vector<std::string> names, arguments;  // the calls
};

const std::vector<Case> kHermesCases = {
    {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
     "",
     {"get_weather"},
     {"{\"city\": \"Paris\"}"}},
    {"Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
     "<tool_call>\n{\"arguments\": {\"x\": [1, 2.5]}, \"name\": \"b\"}\n</tool_call>\n",
     "Let me check.\n",
     {"a", "b"},
     {"{}", "{\"x\": [1, 2.5]}"}},
    {"No call here.", "No call here.", {}, {}},
    {"<think>\nI could write <tool_call> here.\n</think>\n\n<tool_call>{\"name\": \"f\", "
     "\"arguments\": {\"k\": \"v\"}}</tool_call>",
     "<think>\nI could write <tool_call> here.\n</think>\n\n",
     {"f"},
     {"{\"k\": \"v\"}"}},
    {"<tool_call>\nnot json\n</tool_call> after",
     "<tool_call>\nnot json\n</tool_call> after",
     {},
     {}},
    {"<tool_call>\n{\"arguments\": {}}\n</tool_call>",
     "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
     {},
     {}},
    {"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\":",
     "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\":",
     {},
     {}},
    {"<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n\nThen text.",
     "\n\nThen text.",
     {"f"},
     {"{}"}},
    {"ends with a partial marker <tool_ca", "ends with a partial marker <tool_ca", {}, {}},
    {"<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"q\\\": 1}\"}</tool_call>",
     "",
     {"f"},
     {"{\"q\": 1}"}},
};

const std::vector<Case> kLlama31Cases = {
    {"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 2}}",
     "",
     {"get_weather"},
     {"{\"city\": \"Paris\", \"days\": 2}"}},
    {"\n {\"name\": \"f\", \"arguments\": {}} \n", "", {"f"}, {"{}"}},
    {"The weather is fine.", "The weather is fine.", {}, {}},
    {"  {\"answer\": 42}", "  {\"answer\": 42}", {}, {}},
    {"{\"name\": \"f\", \"parameters\": {\"a\": 1}} and more",
     "{\"name\": \"f\", \"parameters\": {\"a\": 1}} and more",
     {},
     {}},
    {"{\"name\": \"f\", \"parameters\": {", "{\"name\": \"f\", \"parameters\": {", {}, {}},
    {"\n\n", "\n\n", {}, {}},
};

void check_cases(ToolFormat format, const std::vector<Case>& cases) {
    std::mt19937 random(7);
    for (const Case& c : cases) {
        INFO(c.reply);
        std::vector<std::vector<size_t>> cuttings = {{}};
        for (size_t cut = 1; cut < c.reply.size(); ++cut) cuttings.push_back({cut});
        std::vector<size_t> every(c.reply.size() > 0 ? c.reply.size() - 1 : 0);
        for (size_t i = 0; i < every.size(); ++i) every[i] = i + 1;
        cuttings.push_back(every);
        for (int trial = 0; trial < 20; ++trial) {
            std::vector<size_t> cuts;
            for (size_t cut = 1; cut < c.reply.size(); ++cut)
                if (random() % 3 == 0) cuts.push_back(cut);
            cuttings.push_back(cuts);
        }
        for (const auto& cuts : cuttings) {
            const Read read = read_reply(format, c.reply, cuts);
            CHECK(read.text == c.text);
            REQUIRE(read.calls.size() == c.names.size());
            for (size_t i = 0; i < read.calls.size(); ++i) {
                CHECK(read.calls[i].name == c.names[i]);
                CHECK(read.calls[i].arguments == c.arguments[i]);
                CHECK(read.calls[i].id.empty());
            }
        }
    }
}

}  // namespace

TEST_CASE("Hermes replies give the same text and calls however they are cut", "[tools]") {
    check_cases(ToolFormat::Hermes, kHermesCases);
}

TEST_CASE("Llama 3.1 replies give the same text and calls however they are cut", "[tools]") {
    check_cases(ToolFormat::Llama31, kLlama31Cases);
}

TEST_CASE("Hermes text before a call streams before the call is complete", "[tools]") {
    ToolCallReader reader(ToolFormat::Hermes);
    Read read;
    collect(reader.feed("Checking"), read);
    CHECK(read.text == "Checking");
    collect(reader.feed(" now.\n<tool_"), read);
    CHECK(read.text == "Checking now.\n");  // "<tool_" may start a call: held
    collect(reader.feed("call>{\"name\": \"f\", \"arguments\": {}}</tool_call>"), read);
    REQUIRE(read.calls.size() == 1);
    CHECK(read.calls_after[0] == read.text.size());
    collect(reader.finish(), read);
    CHECK(read.text == "Checking now.\n");
}

TEST_CASE("python_json writes as json.dumps(ensure_ascii=False)", "[tools]") {
    const auto parsed = nlohmann::ordered_json::parse(
        R"({"b": [1, 2.5, -0.0, 1e-05, 1e+20, 100.0, true, null], "a": {}, "c": [],
            "s": "caf\u00e9 \"q\" \\ \n\t\u0001\u001f\u007f"})");
    CHECK(python_json(parsed) ==
          "{\"b\": [1, 2.5, -0.0, 1e-05, 1e+20, 100.0, true, null], \"a\": {}, \"c\": [], "
          "\"s\": \"caf\xC3\xA9 \\\"q\\\" \\\\ \\n\\t\\u0001\\u001f\x7F\"}");
    CHECK(python_json(parsed, 4) ==
          "{\n    \"b\": [\n        1,\n        2.5,\n        -0.0,\n        1e-05,\n"
          "        1e+20,\n        100.0,\n        true,\n        null\n    ],\n    \"a\": {},\n"
          "    \"c\": [],\n    \"s\": \"caf\xC3\xA9 \\\"q\\\" \\\\ \\n\\t\\u0001\\u001f\x7F\"\n}");
}
