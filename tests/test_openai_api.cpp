// The OpenAI protocol of `barellm serve` (src/serve/openai_api.h) and its /metrics text
// (src/serve/metrics.h): every field parsed as OpenAI documents it, every wrong one refused
// with status 400 and the field named; conversations rendered as the chat template's own
// first-turn and next-turn renderings put together; the response objects with the fields the
// `openai` client reads.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "serve/metrics.h"
#include "serve/openai_api.h"

using namespace barellm;
using namespace barellm::serve;
using json = nlohmann::json;

namespace {

// The ApiError parsing `body` as a completion request throws; fails when it throws none.
ApiError completion_error(const std::string& body) {
    try {
        parse_completion_request(body);
    } catch (const ApiError& e) {
        return e;
    }
    FAIL("no error for " << body);
    return ApiError(0, "");
}

ApiError chat_error(const std::string& body) {
    try {
        parse_chat_request(body);
    } catch (const ApiError& e) {
        return e;
    }
    FAIL("no error for " << body);
    return ApiError(0, "");
}

ChatTemplate chatml() {
    ChatTemplate chat;
    chat.family = ChatFamily::ChatML;
    return chat;
}

}  // namespace

TEST_CASE("completion requests: the prompt in each of its four forms", "[openai]") {
    auto text = parse_completion_request(R"({"model": "m", "prompt": "Once upon"})");
    CHECK(text.prompt_text == "Once upon");
    CHECK_FALSE(text.has_prompt_ids);
    CHECK(text.fields.model == "m");
    CHECK(parse_completion_request(R"({"prompt": ["one string"]})").prompt_text == "one string");
    auto ids = parse_completion_request(R"({"prompt": [1, 15043, 7]})");
    CHECK(ids.has_prompt_ids);
    CHECK(ids.prompt_ids == std::vector<int>{1, 15043, 7});
    CHECK(parse_completion_request(R"({"prompt": [[3, 4]]})").prompt_ids == std::vector<int>{3, 4});
    // Ids beyond int become -1, which no vocabulary holds.
    CHECK(parse_completion_request(R"({"prompt": [5, 99999999999]})").prompt_ids ==
          std::vector<int>{5, -1});
    CHECK(parse_completion_request(R"({"prompt": ""})").prompt_text.empty());
}

TEST_CASE("completion requests: absent fields stay empty, given ones are read", "[openai]") {
    const auto bare = parse_completion_request(R"({"prompt": "x"})").fields;
    CHECK_FALSE(bare.max_tokens);
    CHECK_FALSE(bare.temperature);
    CHECK_FALSE(bare.seed);
    CHECK_FALSE(bare.stream);
    CHECK(bare.stop.empty());
    CHECK(bare.model.empty());
    const auto full = parse_completion_request(R"({"prompt": "x", "max_tokens": 17,
        "temperature": 0, "top_p": 0.5, "top_k": 40, "min_p": 0.05, "repeat_penalty": 1.1,
        "seed": -1, "stop": ["\n", "END"], "n": 1, "stream": true,
        "stream_options": {"include_usage": true}, "frequency_penalty": 0,
        "user": "ignored"})")
                          .fields;
    CHECK(*full.max_tokens == 17);
    CHECK(*full.temperature == 0.0f);
    CHECK(*full.top_p == 0.5f);
    CHECK(*full.top_k == 40);
    CHECK(*full.min_p == Approx(0.05f));
    CHECK(*full.repeat_penalty == Approx(1.1f));
    CHECK(*full.seed == UINT64_MAX);  // -1 as its 64 bits
    CHECK(full.stop == std::vector<std::string>{"\n", "END"});
    CHECK(full.stream);
    CHECK(full.include_usage);
    // null is absent; max_completion_tokens is max_tokens' newer name.
    const auto nulls =
        parse_completion_request(R"({"prompt": "x", "temperature": null, "stop": null,
                                     "max_completion_tokens": 9})")
            .fields;
    CHECK_FALSE(nulls.temperature);
    CHECK(nulls.stop.empty());
    CHECK(*nulls.max_tokens == 9);
    CHECK(parse_completion_request(R"({"prompt": "x", "stop": "###"})").fields.stop ==
          std::vector<std::string>{"###"});
}

TEST_CASE("completion requests: each malformed body or field is a 400 naming it", "[openai]") {
    struct Case {
        const char* body;
        const char* param;  // "" when the error names none
    };
    const std::vector<Case> cases = {
        {R"({"prompt": "x")", ""},
        {"", ""},
        {R"([1, 2])", ""},
        {R"("just a string")", ""},
        {R"({})", "prompt"},
        {R"({"prompt": 7})", "prompt"},
        {R"({"prompt": []})", "prompt"},
        {R"({"prompt": ["a", "b"]})", "prompt"},
        {R"({"prompt": [[1], [2]]})", "prompt"},
        {R"({"prompt": [1, "two"]})", "prompt"},
        {R"({"prompt": [1.5]})", "prompt"},
        {R"({"prompt": "x", "model": 3})", "model"},
        {R"({"prompt": "x", "max_tokens": 0})", "max_tokens"},
        {R"({"prompt": "x", "max_tokens": -5})", "max_tokens"},
        {R"({"prompt": "x", "max_tokens": 2.5})", "max_tokens"},
        {R"({"prompt": "x", "max_tokens": "10"})", "max_tokens"},
        {R"({"prompt": "x", "max_tokens": 100000000000})", "max_tokens"},
        {R"({"prompt": "x", "max_completion_tokens": true})", "max_completion_tokens"},
        {R"({"prompt": "x", "temperature": "hot"})", "temperature"},
        {R"({"prompt": "x", "temperature": -0.1})", "temperature"},
        {R"({"prompt": "x", "temperature": 1e9})", "temperature"},
        {R"({"prompt": "x", "top_p": 1.5})", "top_p"},
        {R"({"prompt": "x", "min_p": -1})", "min_p"},
        {R"({"prompt": "x", "top_k": -1})", "top_k"},
        {R"({"prompt": "x", "top_k": 0.5})", "top_k"},
        {R"({"prompt": "x", "repeat_penalty": 0})", "repeat_penalty"},
        {R"({"prompt": "x", "seed": "42"})", "seed"},
        {R"({"prompt": "x", "seed": 18446744073709551615})", "seed"},
        {R"({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]})", "stop"},
        {R"({"prompt": "x", "stop": ""})", "stop"},
        {R"({"prompt": "x", "stop": [""]})", "stop"},
        {R"({"prompt": "x", "stop": [1]})", "stop"},
        {R"({"prompt": "x", "stop": {"a": 1}})", "stop"},
        {R"({"prompt": "x", "n": 2})", "n"},
        {R"({"prompt": "x", "n": "1"})", "n"},
        {R"({"prompt": "x", "stream": "yes"})", "stream"},
        {R"({"prompt": "x", "stream_options": true})", "stream_options"},
        {R"({"prompt": "x", "stream_options": {"include_usage": 1}})", "include_usage"},
    };
    for (const Case& c : cases) {
        INFO(c.body);
        const ApiError error = completion_error(c.body);
        CHECK(error.status == 400);
        CHECK(error.type == "invalid_request_error");
        CHECK(error.param == c.param);
        CHECK(std::string(error.what()).size() > 10);
    }
    // Nesting beyond the limit is refused, not recursed into.
    const std::string deep =
        R"({"prompt": )" + std::string(100000, '[') + "1" + std::string(100000, ']') + "}";
    CHECK(completion_error(deep).status == 400);
    // The message quotes a long wrong value only in part.
    const std::string long_value =
        R"({"prompt": "x", "temperature": ")" + std::string(10000, 'a') + "\"}";
    CHECK(std::string(completion_error(long_value).what()).size() < 300);
}

TEST_CASE("chat requests: messages, roles and content parts", "[openai]") {
    const auto request = parse_chat_request(R"({"messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Again", "name": "ignored"}], "max_tokens": 3})");
    REQUIRE(request.messages.size() == 4);
    CHECK(request.messages[0].role == "system");
    CHECK(request.messages[0].content == "Be brief.");
    CHECK(request.messages[1].content == "Hi there");
    CHECK(request.messages[2].role == "assistant");
    CHECK(request.messages[3].content == "Again");
    CHECK(*request.fields.max_tokens == 3);

    for (const char* body :
         {R"({})", R"({"messages": []})", R"({"messages": "hi"})", R"({"messages": [1]})",
          R"({"messages": [{"content": "x"}]})",
          R"({"messages": [{"role": "function", "content": "x"}]})",
          R"({"messages": [{"role": "user"}]})",
          R"({"messages": [{"role": "user", "content": 5}]})",
          R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
          R"({"messages": [{"role": "user", "content": "x"}], "n": 3})"}) {
        INFO(body);
        const ApiError error = chat_error(body);
        CHECK(error.status == 400);
        CHECK_FALSE(error.param.empty());
    }
}

TEST_CASE("conversations render as the template's first turn and next turns", "[openai]") {
    const ChatTemplate chat = chatml();
    const std::vector<ChatMessage> one = {{"user", "Hi"}};
    CHECK(render_conversation(chat, one, "", "") == render_chat(chat, std::nullopt, "Hi", ""));
    CHECK(render_conversation(chat, one, "", "") ==
          "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    const std::vector<ChatMessage> three = {
        {"system", "S"}, {"user", "A"}, {"assistant", "B"}, {"user", "C"}};
    CHECK(render_conversation(chat, three, "", "") ==
          render_chat(chat, std::string("S"), "A", "") + "B" + render_next_turn(chat, "C", "", ""));
    CHECK(render_conversation(chat, three, "", "") ==
          "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nA<|im_end|>\n<|im_start|>"
          "assistant\nB<|im_end|>\n<|im_start|>user\nC<|im_end|>\n<|im_start|>assistant\n");

    ChatTemplate llama2;  // Llama-2-chat: a space, then the stripped reply
    llama2.family = ChatFamily::Llama2;
    llama2.strip_prompt = true;
    llama2.needs_bos = true;
    const std::vector<ChatMessage> turns = {{"user", "A"}, {"assistant", "\n B \n"}, {"user", "C"}};
    CHECK(render_conversation(llama2, turns, "<s>", "</s>") ==
          render_chat(llama2, std::nullopt, "A", "<s>") + " B" +
              render_next_turn(llama2, "C", "<s>", "</s>"));
    CHECK(render_conversation(llama2, turns, "<s>", "</s>") ==
          "<s>[INST] A [/INST] B </s><s>[INST] C [/INST]");
    ChatTemplate gemma;
    gemma.family = ChatFamily::Gemma;
    gemma.strip_prompt = true;
    gemma.needs_bos = true;
    CHECK(render_conversation(gemma, turns, "<bos>", "<eos>") ==
          "<bos><start_of_turn>user\nA<end_of_turn>\n<start_of_turn>model\nB<end_of_turn>\n"
          "<start_of_turn>user\nC<end_of_turn>\n<start_of_turn>model\n");
    // ChatML keeps the reply as it is.
    CHECK(render_conversation(chat, turns, "", "").find("assistant\n\n B \n<|im_end|>") !=
          std::string::npos);

    // What no template renders: the order is wrong, or the template refuses a part of it.
    const std::vector<std::vector<ChatMessage>> refused = {
        {{"system", "S"}},
        {{"assistant", "B"}},
        {{"user", "A"}, {"assistant", "B"}},
        {{"user", "A"}, {"user", "C"}},
        {{"user", "A"}, {"system", "S"}, {"user", "C"}},
        {{"system", "S"}, {"system", "T"}, {"user", "C"}},
    };
    for (const auto& messages : refused) {
        try {
            render_conversation(chat, messages, "", "");
            FAIL("rendered " << messages.size() << " messages in a wrong order");
        } catch (const ApiError& e) {
            CHECK(e.status == 400);
            CHECK(e.param == "messages");
        }
    }
    ChatTemplate gemma2;
    gemma2.family = ChatFamily::Gemma;
    gemma2.system_role = false;
    gemma2.needs_bos = true;
    try {
        render_conversation(gemma2, {{"system", "S"}, {"user", "A"}}, "<bos>", "<eos>");
        FAIL("a template without a system role rendered one");
    } catch (const ApiError& e) {
        CHECK(e.status == 400);
        CHECK(std::string(e.what()).find("chat template") != std::string::npos);
    }
    // Llama-2's next turn needs the EOS text.
    CHECK_THROWS_AS(render_conversation(llama2, turns, "<s>", ""), ApiError);
}

TEST_CASE("responses, chunks and errors have the fields of OpenAI's objects", "[openai]") {
    const ResponseHeader header{"cmpl-7", 1700000000, "stories.bin"};
    const json completion = completion_response(header, "text", "length", {5, 3});
    CHECK(completion["object"] == "text_completion");
    CHECK(completion["id"] == "cmpl-7");
    CHECK(completion["created"] == 1700000000);
    CHECK(completion["model"] == "stories.bin");
    CHECK(completion["choices"].size() == 1);
    CHECK(completion["choices"][0]["text"] == "text");
    CHECK(completion["choices"][0]["index"] == 0);
    CHECK(completion["choices"][0]["finish_reason"] == "length");
    CHECK(completion["usage"] ==
          json{{"prompt_tokens", 5}, {"completion_tokens", 3}, {"total_tokens", 8}});

    const json chunk = completion_chunk(header, "piece", "");
    CHECK(chunk["choices"][0]["finish_reason"].is_null());
    CHECK(chunk["choices"][0]["text"] == "piece");
    CHECK_FALSE(chunk.contains("usage"));

    const json chat = chat_response(header, "reply", {}, "stop", {2, 1});
    CHECK(chat["object"] == "chat.completion");
    CHECK(chat["choices"][0]["message"] == json{{"role", "assistant"}, {"content", "reply"}});
    CHECK(chat["choices"][0]["finish_reason"] == "stop");
    CHECK(chat["usage"]["total_tokens"] == 3);

    const json role = chat_role_chunk(header);
    CHECK(role["object"] == "chat.completion.chunk");
    CHECK(role["choices"][0]["delta"] == json{{"role", "assistant"}, {"content", ""}});
    CHECK(chat_chunk(header, "x", "")["choices"][0]["delta"] == json{{"content", "x"}});
    const json last = chat_chunk(header, "", "stop");
    CHECK(last["choices"][0]["delta"] == json::object());
    CHECK(last["choices"][0]["finish_reason"] == "stop");
    const json usage = usage_chunk(header, true, {4, 6});
    CHECK(usage["choices"] == json::array());
    CHECK(usage["usage"]["completion_tokens"] == 6);

    // A reply that calls: the calls, and a null content where it has no text.
    const ToolCall call{"call_7_0", "get_weather", R"({"city": "Paris"})"};
    const json called = chat_response(header, "", {call}, "tool_calls", {2, 1});
    const json tool_call = {{"id", "call_7_0"},
                            {"type", "function"},
                            {"function", {{"name", "get_weather"}, {"arguments", call.arguments}}}};
    CHECK(called["choices"][0]["message"] ==
          json{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {tool_call}}});
    CHECK(called["choices"][0]["finish_reason"] == "tool_calls");
    CHECK(chat_response(header, "Checking.", {call}, "tool_calls",
                        {2, 1})["choices"][0]["message"]["content"] == "Checking.");
    json delta_call = tool_call;
    delta_call["index"] = 1;
    const json call_chunk = chat_tool_call_chunk(header, call, 1);
    CHECK(call_chunk["choices"][0]["delta"] == json{{"tool_calls", {delta_call}}});
    CHECK(call_chunk["choices"][0]["finish_reason"].is_null());

    const json models = models_response("stories.bin", 1700000000);
    CHECK(models["object"] == "list");
    CHECK(models["data"][0]["id"] == "stories.bin");
    CHECK(models["data"][0]["object"] == "model");

    const json error = error_body(ApiError(401, "wrong API key", "", "invalid_api_key"));
    CHECK(error == json{{"error",
                         {{"message", "wrong API key"},
                          {"type", "authentication_error"},
                          {"param", nullptr},
                          {"code", "invalid_api_key"}}}});
    CHECK(error_body(ApiError(400, "bad", "top_p"))["error"]["param"] == "top_p");
    CHECK(error_body(ApiError(503, "full"))["error"]["type"] == "server_error");
    CHECK(error_body(ApiError(404, "no"))["error"]["type"] == "not_found_error");

    CHECK(sse_event(json{{"a", 1}}) == "data: {\"a\":1}\n\n");
    CHECK(std::string(kSseDone) == "data: [DONE]\n\n");
    // Text that is not UTF-8 cannot break the stream: it is written as U+FFFD.
    CHECK(sse_event(json{{"t", std::string("a\xff")}}) == "data: {\"t\":\"a\xEF\xBF\xBD\"}\n\n");
}

TEST_CASE("the /metrics text: every metric with HELP, TYPE and its value", "[openai]") {
    SchedulerMetrics m;
    m.requests_total = 12;
    m.prompt_tokens_total = 345;
    m.generated_tokens_total = 678;
    m.preemptions_total = 2;
    m.queue_length = 3;
    m.running = 4;
    m.last_batch_rows = 5;
    m.kv_blocks_used = 6;
    m.kv_blocks_free = 7;
    m.kv_block_size = 16;
    m.kv_tokens_held = 90;
    const std::string text = prometheus_text(m, 99);
    const std::vector<std::pair<std::string, std::string>> expected = {
        {"http_requests_total", "99"},  {"requests_total", "12"},
        {"prompt_tokens_total", "345"}, {"generated_tokens_total", "678"},
        {"preemptions_total", "2"},     {"queue_length", "3"},
        {"running_sequences", "4"},     {"batch_rows", "5"},
        {"kv_blocks_used", "6"},        {"kv_blocks_free", "7"},
        {"kv_block_size", "16"},        {"kv_tokens_held", "90"}};
    for (const auto& [name, value] : expected) {
        INFO(name);
        const std::string type =
            name.size() > 6 && name.substr(name.size() - 6) == "_total" ? "counter" : "gauge";
        CHECK(text.find("# HELP barellm_" + name + " ") != std::string::npos);
        CHECK(text.find("# TYPE barellm_" + name + " " + type + "\n") != std::string::npos);
        CHECK(text.find("\nbarellm_" + name + " " + value + "\n") != std::string::npos);
    }
    CHECK(text.back() == '\n');
}
