// The OpenAI protocol of `barellm serve`, as pure functions: request bodies parsed and checked
// into plain structs (every wrong field refused with an ApiError naming it), and the response,
// stream-chunk and error objects built from plain values. No I/O, no model: the unit tests
// (tests/test_openai_api.cpp) run them alone; src/serve/http_server.cpp puts them on the wire.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat.h"
#include "tokenizer/chat_tools.h"
#include "util/error.h"

namespace barellm::serve {

// A request refused: the HTTP status and OpenAI's error object {"error": {"message", "type",
// "param", "code"}} (error_body). `param` and `code` are "" when they are null.
struct ApiError : Error {
    ApiError(int status, const std::string& message, std::string param = "", std::string code = "");
    int status;
    std::string type;  // "invalid_request_error", "authentication_error", ... from the status
    std::string param;
    std::string code;
};

constexpr int kMaxStopStrings = 4;  // OpenAI's limit

// The fields both endpoints share; absent (or null) fields stay empty and the server's
// defaults apply.
struct GenerationFields {
    std::string model;              // "" when absent
    std::optional<int> max_tokens;  // max_tokens, or max_completion_tokens; >= 1
    std::optional<float> temperature, top_p, min_p, repeat_penalty;
    std::optional<int> top_k;
    std::optional<uint64_t> seed;   // any 64-bit integer, negative ones as their bits
    std::vector<std::string> stop;  // at most kMaxStopStrings, each non-empty
    bool stream = false;
    bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
};

// POST /v1/completions: prompt as a string, a list of one string, a list of token ids or a
// list of one list of token ids (the ids are checked against the vocabulary later).
struct CompletionRequest {
    GenerationFields fields;
    std::string prompt_text;
    std::vector<int> prompt_ids;
    bool has_prompt_ids = false;
};

// A message's role is "system" ("developer" is read as "system"), "user", "assistant" or
// "tool"; an assistant message may carry calls (tool_calls, its content then optional).
using barellm::ChatMessage;
using barellm::ToolCall;

// tool_choice: "auto" (the model may call the tools), "none" (the tools are not rendered),
// "required" (a call) or {"type": "function", "function": {"name": NAME}} (a call of NAME). A
// call is asked for by starting the reply with the start of one (forced_call_prefix); what
// follows is the model's: barellm does not constrain generation.
enum class ToolChoice { Auto, None, Required, Function };

// POST /v1/chat/completions.
struct ChatRequest {
    GenerationFields fields;
    std::vector<ChatMessage> messages;
    std::optional<std::string> reasoning_effort;  // OpenAI's field: a harmony template's level
    // Function definitions ({"type": "function", "function": {"name", ...}}), each object's
    // keys in the order the client sent them.
    std::vector<nlohmann::ordered_json> tools;
    ToolChoice tool_choice = ToolChoice::Auto;
    std::string forced_function;  // ToolChoice::Function: the function's name
};

// Whether the reply to `request` is read for calls: tools given, tool_choice other than "none".
bool request_calls_tools(const ChatRequest& request);

// The start of a call the reply is made to begin with, for tool_choice "required" or a named
// function (forced_call_start of the template's format); "" otherwise.
std::string forced_call_prefix(const ChatTemplate& chat, const ChatRequest& request);

// Parse a request body; ApiError 400 for anything malformed: not JSON, not an object, a
// field of the wrong type or out of range, n other than 1, more than 4 stop strings.
CompletionRequest parse_completion_request(std::string_view body);
ChatRequest parse_chat_request(std::string_view body);

// The text a chat template renders for `messages`: an optional system message first, then
// user and assistant messages in turn, ending with a user message. The first user message is
// rendered with the system message by render_chat, each assistant message follows as the
// template writes it (trimmed by Llama 3 and Gemma; trimmed after a space by Llama-2-chat;
// as it is by ChatML and Mistral), and each later user message by render_next_turn: the
// text Hugging Face's apply_chat_template gives for the conversation. ApiError 400 for any other
// order and for what the template refuses (a system message where it has none, an empty BOS or EOS
// text it needs).
std::string render_conversation(const ChatTemplate& chat, const std::vector<ChatMessage>& messages,
                                const std::string& bos_text, const std::string& eos_text);

// The text a chat template renders for a request: with the tools (request_calls_tools) and
// any order of messages by render_tool_conversation where the template writes tools, followed by
// forced_call_prefix; else by render_conversation, and ApiError 400 for tools, calls or results
// the template cannot write.
std::string render_chat_request(const ChatTemplate& chat, const ChatRequest& request,
                                const std::string& bos_text, const std::string& eos_text);

// What every response object names.
struct ResponseHeader {
    std::string id;       // "cmpl-..." or "chatcmpl-..."
    int64_t created = 0;  // Unix seconds
    std::string model;
};

struct Usage {
    int prompt_tokens = 0;
    int completion_tokens = 0;
};

// finish_reason is "stop", "length" or "tool_calls"; "" writes null (a chunk before the
// last).
nlohmann::json completion_response(const ResponseHeader& header, const std::string& text,
                                   const std::string& finish_reason, const Usage& usage);
nlohmann::json completion_chunk(const ResponseHeader& header, const std::string& text,
                                const std::string& finish_reason);
// A reply with calls has their list in tool_calls, and a null content when it has no text.
nlohmann::json chat_response(const ResponseHeader& header, const std::string& text,
                             const std::vector<ToolCall>& calls, const std::string& finish_reason,
                             const Usage& usage);
// The first chunk of a chat stream carries the role: {"role": "assistant", "content": ""}.
nlohmann::json chat_role_chunk(const ResponseHeader& header);
// A chunk with `text` as its delta's content, or with an empty delta when finish_reason is
// given.
nlohmann::json chat_chunk(const ResponseHeader& header, const std::string& text,
                          const std::string& finish_reason);
// A chunk with one whole call as its delta's tool_calls[0], `index` counting the calls.
nlohmann::json chat_tool_call_chunk(const ResponseHeader& header, const ToolCall& call, int index);
// The chunk after the last when stream_options.include_usage: no choices, the usage.
nlohmann::json usage_chunk(const ResponseHeader& header, bool chat, const Usage& usage);
nlohmann::json usage_object(const Usage& usage);

// GET /v1/models: the one model the server holds.
nlohmann::json models_response(const std::string& model, int64_t created);

nlohmann::json error_body(const ApiError& error);

// One server-sent event: "data: " + the object's JSON + "\n\n"; the stream ends with
// kSseDone.
std::string sse_event(const nlohmann::json& object);
extern const char* const kSseDone;

}  // namespace barellm::serve
