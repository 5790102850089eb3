// Tool calling through a chat template, without a Jinja engine: a conversation of OpenAI's
// protocol (function definitions, assistant messages that call them, the functions' results)
// rendered as Hugging Face's apply_chat_template(messages, tools=tools, tokenize=False,
// add_generation_prompt=True) renders it with the template (tests/test_chat_tools.py checks
// this against jinja2 on the real templates), and the calls read back from the reply.
//
//   Hermes   Qwen2.5 and Qwen3 (ChatML). The tools go into the system turn:
//              <|im_start|>system\n[{system or default system}\n\n]# Tools\n\nYou may call one
//              or more functions ...\n<tools>\n{tool as JSON}\n{tool as JSON}\n</tools>\n\n
//              For each function call, return a json object ...</tool_call><|im_end|>\n
//            a reply calls them with one block per call after its text:
//              <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>
//            and the results come back in one user turn:
//              <|im_start|>user\n<tool_response>\n{result}\n</tool_response>\n
//              <tool_response>\n...\n</tool_response><|im_end|>\n
//            Qwen3 drops a past reply's <think> block, except after the last user query where
//            it is written back as <think>\n{reasoning}\n</think>\n\n.
//   Llama31  Llama 3.1 and 3.2 (tools in the first user message, the templates' default):
//              system header: "Environment: ipython\n" before "Cutting Knowledge Date: ..."
//              first user turn: Given the following functions, ...Do not use variables.\n\n
//                               {tool as JSON, indented by 4}\n\n...{trim(user message)}
//            a reply calls one function as a JSON object,
//              {"name": NAME, "parameters": {...}}
//            and its result comes back in an ipython turn, as a JSON string:
//              <|start_header_id|>ipython<|end_header_id|>\n\n"{result}"<|eot_id|>
// JSON is written as Python's json.dumps(ensure_ascii=False) writes it, the keys in the order
// the client sent them. A call's arguments arrive as JSON text (OpenAI's "arguments" string)
// and are written as the object they hold, as servers pass them to the template.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/chat.h"

namespace barellm {

// A function call: in an assistant message a client sends back, or read from a reply.
struct ToolCall {
    std::string id;  // OpenAI's call id; the templates do not write it
    std::string name;
    std::string arguments;  // JSON text, as OpenAI's protocol carries it
};

// One message of a conversation.
struct ChatMessage {
    std::string role;  // "system", "user", "assistant" or "tool" (a function's result)
    std::string content;
    std::vector<ToolCall> tool_calls = {};  // an assistant message's calls
};

// Whether the template writes tools, calls and results (its ToolFormat is not None).
bool chat_renders_tools(const ChatTemplate& chat);

// The rendering of `messages` (an optional system message first; then user, assistant and tool
// messages in any order, a tool message following an assistant message that calls or another
// tool message; ending with a user or tool message) with `tools` (OpenAI's
// {"type": "function", "function": {...}} objects; none: the template's rendering without
// tools) and the generation prompt. Error for what the template refuses (Llama31: an assistant
// message with more than one call) or does not write (a system message after the first).
std::string render_tool_conversation(const ChatTemplate& chat,
                                     const std::vector<ChatMessage>& messages,
                                     const std::vector<nlohmann::ordered_json>& tools,
                                     const std::string& bos_token);

// The start of a call in the template's format, which a reply made to begin with it goes on
// (tool_choice "required" or a named function): Hermes "<tool_call>\n", with `name`
// "<tool_call>\n{"name": NAME, "arguments": "; Llama31 "{"name": "", with `name`
// "{"name": NAME, "parameters": ". Its name is written as the templates write names.
std::string forced_call_start(ToolFormat format, const std::string& name);

// `value` as Python's json.dumps(value, ensure_ascii=False, indent=indent) writes it (the
// templates' `tojson`): ", " and ": " between items without an indent (indent < 0), each item
// on its own line with one.
std::string python_json(const nlohmann::ordered_json& value, int indent = -1);

// A part of a reply: text to show, or a call.
struct ReplyPart {
    std::string text;
    std::optional<ToolCall> call;
};

// Reads the calls out of a reply that arrives in pieces (the text of each token), in the
// template's tool format, letting the rest through as text:
//   Hermes   each <tool_call>...</tool_call> block whose body is a JSON object with a "name"
//            string and an "arguments" object is a call; text before the first block passes as
//            it comes; whitespace between and after blocks is dropped. Inside a <think> block
//            nothing is read as a call.
//   Llama31  a reply that is one JSON object with a "name" string and a "parameters" (or
//            "arguments") object is a call; a reply starting with "{" is held to its end to
//            tell.
// What is not a call after all (a block whose JSON does not parse, an unclosed block) is
// passed as text, as it was written. A call's id is left empty; its arguments are written as
// python_json writes them.
class ToolCallReader {
public:
    explicit ToolCallReader(ToolFormat format) : format_(format) {}
    std::vector<ReplyPart> feed(const std::string& piece);
    // What was held back at the end.
    std::vector<ReplyPart> finish();

private:
    std::vector<ReplyPart> feed_hermes(bool at_end);
    std::vector<ReplyPart> feed_llama31(bool at_end);

    ToolFormat format_;
    std::string held_;           // text not passed on yet
    bool in_think_ = false;      // Hermes: inside a <think> block
    bool in_call_ = false;       // Hermes: after <tool_call>, before </tool_call>
    bool called_ = false;        // Hermes: a call was read; whitespace after it is dropped
    bool started_ = false;       // Llama31: the first character other than whitespace came
    bool holding_json_ = false;  // Llama31: the reply starts with "{"
};

}  // namespace barellm
