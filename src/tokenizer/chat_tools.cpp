// Tool calling through the Hermes and Llama 3.1 chat templates (chat_tools.h): the rendering
// of a conversation with tools, and the calls read back from a reply.
#include "tokenizer/chat_tools.h"

#include <algorithm>

#include "util/error.h"
#include "util/json.h"

namespace barellm {

namespace {

using ordered_json = nlohmann::ordered_json;

// Qwen2.5's and Qwen3's system turn around the tools, one JSON object per line between.
constexpr const char* kHermesToolsIntro =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\n<tools>";
constexpr const char* kHermesToolsOutro =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";
constexpr const char* kCallOpen = "<tool_call>";
constexpr const char* kCallClose = "</tool_call>";
constexpr const char* kToolResponseOpen = "<tool_response>";
constexpr const char* kToolResponseClose = "</tool_response>";

// Llama 3.1's and 3.2's first user message before the tools.
constexpr const char* kLlama31ToolsIntro =
    "Given the following functions, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt.\n\nRespond in the format {\"name\": "
    "function name, \"parameters\": dictionary of argument name and its value}.Do not use "
    "variables.\n\n";
constexpr const char* kLlama31Header = "<|start_header_id|>";
constexpr const char* kLlama31HeaderEnd = "<|end_header_id|>\n\n";
constexpr const char* kLlama31TurnEnd = "<|eot_id|>";
constexpr int kLlama31ToolIndent = 4;  // tojson(indent=4)

void append_json(const ordered_json& value, int indent, int depth, std::string& out) {
    if (!value.is_structured()) {
        out += value.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
        return;
    }
    const bool object = value.is_object();
    if (value.empty()) {
        out += object ? "{}" : "[]";
        return;
    }
    out += object ? '{' : '[';
    for (auto item = value.begin(); item != value.end(); ++item) {
        if (item != value.begin()) out += indent < 0 ? ", " : ",";
        if (indent >= 0) out += '\n' + std::string(size_t(indent) * size_t(depth + 1), ' ');
        if (object) {
            append_json(ordered_json(item.key()), indent, depth, out);
            out += ": ";
        }
        append_json(item.value(), indent, depth + 1, out);
    }
    if (indent >= 0) out += '\n' + std::string(size_t(indent) * size_t(depth), ' ');
    out += object ? '}' : ']';
}

// A call's arguments as the templates write them: the JSON value the text holds, or, where it
// is not JSON, the text as a JSON string (or as it is, `verbatim`).
std::string arguments_text(const std::string& arguments, bool verbatim) {
    try {
        return python_json(parse_ordered_json(arguments, "arguments"));
    } catch (const Error&) {
        return verbatim ? arguments : python_json(ordered_json(arguments));
    }
}

bool starts_with(const std::string& text, const std::string& prefix) {
    return text.compare(0, prefix.size(), prefix) == 0;
}

bool ends_with(const std::string& text, const std::string& suffix) {
    return text.size() >= suffix.size() &&
           text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Python's text.lstrip('\n') and text.rstrip('\n').
std::string lstrip_newlines(const std::string& text) {
    const size_t begin = text.find_first_not_of('\n');
    return begin == std::string::npos ? "" : text.substr(begin);
}

std::string rstrip_newlines(const std::string& text) {
    const size_t end = text.find_last_not_of('\n');
    return end == std::string::npos ? "" : text.substr(0, end + 1);
}

bool all_space(const std::string& text) {
    return std::all_of(text.begin(), text.end(),
                       [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; });
}

// The index of the last user message that is a question rather than results wrapped in
// <tool_response> tags (Qwen3's last_query_index); the last index when there is none.
size_t last_query_index(const std::vector<ChatMessage>& messages) {
    for (size_t i = messages.size(); i-- > 0;) {
        const std::string& content = messages[i].content;
        if (messages[i].role == "user" &&
            !(starts_with(content, kToolResponseOpen) && ends_with(content, kToolResponseClose)))
            return i;
    }
    return messages.size() - 1;
}

// An assistant message as Qwen2.5's and Qwen3's templates write it.
std::string hermes_assistant(const ChatTemplate& chat, const ChatMessage& message,
                             bool after_last_query) {
    std::string content = message.content, reasoning;
    const size_t close = content.find(kThinkClose);
    if (chat.splits_think_blocks && close != std::string::npos) {
        // split('</think>'): the answer after the last marker, the reasoning before the first
        // (after the last <think> there).
        content = lstrip_newlines(message.content.substr(message.content.rfind(kThinkClose) +
                                                         std::string(kThinkClose).size()));
        const std::string before = rstrip_newlines(message.content.substr(0, close));
        const size_t open = before.rfind(kThinkOpen);
        reasoning = lstrip_newlines(open == std::string::npos
                                        ? before
                                        : before.substr(open + std::string(kThinkOpen).size()));
    }
    std::string out = "<|im_start|>assistant\n";
    if (after_last_query && !reasoning.empty())
        out += "<think>\n" + rstrip_newlines(reasoning) + "\n</think>\n\n";  // strip('\n')
    out += content;
    for (size_t i = 0; i < message.tool_calls.size(); ++i) {
        const ToolCall& call = message.tool_calls[i];
        if (i > 0 || !content.empty()) out += '\n';
        out += std::string(kCallOpen) + "\n{\"name\": \"" + call.name + "\", \"arguments\": " +
               arguments_text(call.arguments, chat.verbatim_string_arguments) + "}\n" + kCallClose;
    }
    return out + "<|im_end|>\n";
}

std::string render_hermes(const ChatTemplate& chat, const std::vector<ChatMessage>& messages,
                          const std::vector<ordered_json>& tools) {
    const bool has_system = messages[0].role == "system";
    const std::string* system = has_system ? &messages[0].content : nullptr;
    std::string out;
    if (!tools.empty()) {
        out += "<|im_start|>system\n";
        if (system)
            out += *system + "\n\n";
        else if (!chat.default_system.empty())
            out += chat.default_system + "\n\n";
        out += kHermesToolsIntro;
        for (const ordered_json& tool : tools) out += "\n" + python_json(tool);
        out += std::string(kHermesToolsOutro) + "<|im_end|>\n";
    } else if (system || !chat.default_system.empty()) {
        out += "<|im_start|>system\n" + (system ? *system : chat.default_system) + "<|im_end|>\n";
    }
    const size_t last_query = last_query_index(messages);
    for (size_t i = has_system ? 1 : 0; i < messages.size(); ++i) {
        const ChatMessage& message = messages[i];
        if (message.role == "assistant") {
            out += hermes_assistant(chat, message, chat.splits_think_blocks && i > last_query);
        } else if (message.role == "tool") {
            // Consecutive results share one user turn.
            if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
            out += std::string("\n") + kToolResponseOpen + "\n" + message.content + "\n" +
                   kToolResponseClose;
            if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
        } else {
            out += "<|im_start|>" + message.role + "\n" + message.content + "<|im_end|>\n";
        }
    }
    return out + "<|im_start|>assistant\n";
}

std::string llama31_turn(const std::string& role, const std::string& content) {
    return kLlama31Header + role + kLlama31HeaderEnd + content + kLlama31TurnEnd;
}

std::string render_llama31(const ChatTemplate& chat, const std::vector<ChatMessage>& messages,
                           const std::vector<ordered_json>& tools, const std::string& bos_token) {
    size_t at = 0;
    std::string system;
    if (messages[0].role == "system") system = python_strip(messages[at++].content);
    std::string out = bos_token + kLlama31Header + "system" + kLlama31HeaderEnd;
    if (!tools.empty()) out += "Environment: ipython\n";
    out += "Cutting Knowledge Date: " + chat.knowledge_date +
           "\nToday Date: " + chat_template_date(chat) + "\n\n" + system + kLlama31TurnEnd;
    if (!tools.empty()) {
        if (at == messages.size() || messages[at].role != "user")
            throw Error(
                "the Llama 3.1 chat template writes the tools into the first user message: the "
                "conversation must start with one (after the system message)");
        std::string first = kLlama31ToolsIntro;
        for (const ordered_json& tool : tools)
            first += python_json(tool, kLlama31ToolIndent) + "\n\n";
        out += llama31_turn("user", first + python_strip(messages[at++].content));
    }
    for (; at < messages.size(); ++at) {
        const ChatMessage& message = messages[at];
        if (message.role == "tool") {
            // The template writes a string result with tojson, as a JSON string.
            out += llama31_turn("ipython", python_json(ordered_json(message.content)));
        } else if (!message.tool_calls.empty()) {
            if (message.tool_calls.size() != 1)
                throw Error(
                    "the Llama 3.1 chat template writes one call per assistant message (\"This "
                    "model only supports single tool-calls at once!\")");
            const ToolCall& call = message.tool_calls[0];
            out += llama31_turn("assistant", "{\"name\": \"" + call.name + "\", \"parameters\": " +
                                                 arguments_text(call.arguments, false) + "}");
        } else {
            out += llama31_turn(message.role, python_strip(message.content));
        }
    }
    return out + kLlama31Header + "assistant" + kLlama31HeaderEnd;
}

// The call a JSON text holds: an object with a "name" string and its arguments under one of
// `argument_keys` (an object, or a string taken as OpenAI's arguments text).
std::optional<ToolCall> call_in(const std::string& text,
                                std::initializer_list<const char*> argument_keys) {
    ordered_json object;
    try {
        object = parse_ordered_json(text, "a tool call");
    } catch (const Error&) {
        return std::nullopt;
    }
    if (!object.is_object()) return std::nullopt;
    const auto name = object.find("name");
    if (name == object.end() || !name->is_string()) return std::nullopt;
    for (const char* key : argument_keys) {
        const auto arguments = object.find(key);
        if (arguments == object.end()) continue;
        if (arguments->is_object())
            return ToolCall{"", name->get<std::string>(), python_json(*arguments)};
        if (arguments->is_string())
            return ToolCall{"", name->get<std::string>(), arguments->get<std::string>()};
        return std::nullopt;
    }
    return std::nullopt;
}

// Appends text to `parts`, joining it to a last part of text.
void append_text(std::vector<ReplyPart>& parts, const std::string& text) {
    if (text.empty()) return;
    if (!parts.empty() && !parts.back().call)
        parts.back().text += text;
    else
        parts.push_back({text, std::nullopt});
}

}  // namespace

bool chat_renders_tools(const ChatTemplate& chat) { return chat.tool_format != ToolFormat::None; }

std::string python_json(const ordered_json& value, int indent) {
    std::string out;
    append_json(value, indent, 0, out);
    return out;
}

std::string render_tool_conversation(const ChatTemplate& chat,
                                     const std::vector<ChatMessage>& messages,
                                     const std::vector<ordered_json>& tools,
                                     const std::string& bos_token) {
    if (messages.empty() || (messages.back().role != "user" && messages.back().role != "tool"))
        throw Error("the conversation must end with a user message or a tool's result");
    switch (chat.tool_format) {
        case ToolFormat::Hermes:
            return render_hermes(chat, messages, tools);
        case ToolFormat::Llama31:
            if (bos_token.empty())
                throw Error("the Llama 3.1 chat template starts with BOS but the model has none");
            return render_llama31(chat, messages, tools, bos_token);
        case ToolFormat::None:
            break;
    }
    throw Error(std::string("the model's ") + chat_family_name(chat.family) +
                " chat template does not write tools (barellm writes those of Qwen2.5, Qwen3, "
                "Llama 3.1 and Llama 3.2)");
}

std::string forced_call_start(ToolFormat format, const std::string& name) {
    switch (format) {
        case ToolFormat::Hermes:
            return std::string(kCallOpen) + "\n" +
                   (name.empty() ? "" : "{\"name\": \"" + name + "\", \"arguments\": ");
        case ToolFormat::Llama31:
            return "{\"name\": \"" + (name.empty() ? "" : name + "\", \"parameters\": ");
        case ToolFormat::None:
            break;
    }
    return "";
}

std::vector<ReplyPart> ToolCallReader::feed(const std::string& piece) {
    held_ += piece;
    return format_ == ToolFormat::Llama31 ? feed_llama31(false) : feed_hermes(false);
}

std::vector<ReplyPart> ToolCallReader::finish() {
    return format_ == ToolFormat::Llama31 ? feed_llama31(true) : feed_hermes(true);
}

std::vector<ReplyPart> ToolCallReader::feed_hermes(bool at_end) {
    std::vector<ReplyPart> parts;
    for (;;) {
        if (in_call_) {
            const size_t close = held_.find(kCallClose);
            if (close == std::string::npos) {
                if (at_end) {  // never closed: the text as written
                    append_text(parts, kCallOpen + held_);
                    held_.clear();
                }
                return parts;
            }
            const std::string body = held_.substr(0, close);
            held_.erase(0, close + std::string(kCallClose).size());
            in_call_ = false;
            if (const auto call = call_in(body, {"arguments"})) {
                parts.push_back({"", call});
                called_ = true;
            } else {
                append_text(parts, kCallOpen + body + kCallClose);
            }
            continue;
        }
        if (in_think_) {
            const size_t close = held_.find(kThinkClose);
            const size_t shown =
                close != std::string::npos ? close + std::string(kThinkClose).size()
                : at_end                   ? held_.size()
                         : held_.size() - partial_marker_length(held_, kThinkClose);
            append_text(parts, held_.substr(0, shown));
            held_.erase(0, shown);
            if (close == std::string::npos) return parts;
            in_think_ = false;
            continue;
        }
        const size_t call = held_.find(kCallOpen), think = held_.find(kThinkOpen);
        const size_t first = std::min(call, think);
        if (first == std::string::npos) {
            const size_t partial = at_end ? 0
                                          : std::max(partial_marker_length(held_, kCallOpen),
                                                     partial_marker_length(held_, kThinkOpen));
            const std::string text = held_.substr(0, held_.size() - partial);
            // Whitespace after a call waits for text to follow it, and is dropped at the end.
            if (called_ && all_space(text)) {
                if (at_end) held_.clear();
                return parts;
            }
            append_text(parts, text);
            held_.erase(0, text.size());
            return parts;
        }
        const std::string before = held_.substr(0, first);
        if (!(called_ && all_space(before))) append_text(parts, before);
        if (first == call) {
            held_.erase(0, first + std::string(kCallOpen).size());
            in_call_ = true;
        } else {
            append_text(parts, kThinkOpen);
            held_.erase(0, first + std::string(kThinkOpen).size());
            in_think_ = true;
        }
    }
}

std::vector<ReplyPart> ToolCallReader::feed_llama31(bool at_end) {
    std::vector<ReplyPart> parts;
    if (!started_) {
        const size_t first = held_.find_first_not_of(" \t\r\n");
        if (first == std::string::npos) {
            if (at_end) {
                append_text(parts, held_);
                held_.clear();
            }
            return parts;
        }
        started_ = true;
        holding_json_ = held_[first] == '{';
    }
    if (holding_json_ && !at_end) return parts;
    if (holding_json_) {
        if (const auto call = call_in(held_, {"parameters", "arguments"})) {
            parts.push_back({"", call});
            held_.clear();
            return parts;
        }
    }
    append_text(parts, held_);
    held_.clear();
    return parts;
}

}  // namespace barellm
