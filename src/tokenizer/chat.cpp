// `run --chat`: the chat template families of chat.h, recognised by their markers and
// rendered without a Jinja engine.
#include "tokenizer/chat.h"

#include <algorithm>
#include <cstdint>
#include <ctime>

#include "util/error.h"
#include "util/json.h"

namespace barellm {

namespace {

bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

// A newline inside a Jinja string literal of the template: a real one (the JSON "\n") or
// the escape sequence (the JSON "\\n"); both render as a newline.
bool newline_at(const std::string& text, size_t at, size_t* length) {
    if (at < text.size() && text[at] == '\n') {
        *length = 1;
        return true;
    }
    if (at + 1 < text.size() && text[at] == '\\' && text[at + 1] == 'n') {
        *length = 2;
        return true;
    }
    return false;
}

// The character the escape `\c` stands for in a Jinja string literal; 0 for escapes not
// handled here.
char escaped_char(char c) {
    switch (c) {
        case 'n':
            return '\n';
        case 't':
            return '\t';
        case '\\':
        case '\'':
        case '"':
            return c;
        default:
            return 0;
    }
}

// Whether `text` holds `part`, whose newlines stand for newlines inside the template's Jinja
// string literals: written all as real newlines or all as "\n" escapes.
bool contains_literal(const std::string& text, const std::string& part) {
    std::string escaped;
    for (char c : part) escaped += c == '\n' ? std::string("\\n") : std::string(1, c);
    return contains(text, part) || contains(text, escaped);
}

// Decodes the escapes of a Jinja string literal's body, which holds only escapes
// escaped_char handles.
std::string unescape(const std::string& body) {
    std::string out;
    for (size_t i = 0; i < body.size(); ++i)
        out.push_back(body[i] == '\\' ? escaped_char(body[++i]) : body[i]);
    return out;
}

// Reads a template's backslash escapes once, from its start, to say whether a stretch of
// it holds an unescaped quote or an escape escaped_char does not handle. Stretches are
// asked for in order (neither end moves back), each starting where no escape is open.
class EscapeScanner {
public:
    explicit EscapeScanner(const std::string& text) : text_(text) {}

    // Whether [begin, end) holds an unescaped `quote` or an escape not handled.
    bool quote_or_bad_escape(size_t begin, size_t end, char quote) {
        for (; next_ < end; ++next_) {
            const char c = text_[next_];
            if (c == '\'')
                single_quote_end_ = next_ + 1;
            else if (c == '"')
                double_quote_end_ = next_ + 1;
            else if (c == '\\') {
                if (next_ + 1 == text_.size() || escaped_char(text_[next_ + 1]) == 0)
                    bad_escape_end_ = next_ + 1;
                ++next_;  // the escaped character
            }
        }
        const size_t quote_end = quote == '\'' ? single_quote_end_ : double_quote_end_;
        return quote_end > begin || bad_escape_end_ > begin;
    }

private:
    const std::string& text_;
    size_t next_ = 0;  // the first position not read yet
    // One past the last position read of each mark; 0 while there was none.
    size_t single_quote_end_ = 0, double_quote_end_ = 0, bad_escape_end_ = 0;
};

// The system message of a literal 'QUOTE<|im_start|>system\n TEXT <|im_end|>\nQUOTE' in
// the template (the turn ChatML templates write when the conversation brings no system
// message), or "" when there is none.
std::string chatml_default_system(const std::string& text) {
    const std::string open = "<|im_start|>system", close = "<|im_end|>";
    // One pass: the candidate bodies only move forward, and so do their ends (the first
    // close after the body), so each stretch of text is searched and scanned once.
    EscapeScanner scanner(text);
    size_t end = 0;
    for (size_t at = text.find(open); at != std::string::npos; at = text.find(open, at + 1)) {
        if (at == 0 || (text[at - 1] != '\'' && text[at - 1] != '"')) continue;
        const char quote = text[at - 1];
        size_t newline = 0;
        if (!newline_at(text, at + open.size(), &newline)) continue;
        const size_t body = at + open.size() + newline;  // "system\n" leaves no escape open
        if (end < body) end = text.find(close, body);
        if (end == std::string::npos) return "";
        if (end == body) continue;
        // The literal must not close before <|im_end|> (as in '...system\n' + content).
        if (scanner.quote_or_bad_escape(body, end, quote)) continue;
        if (!newline_at(text, end + close.size(), &newline)) continue;
        if (end + close.size() + newline >= text.size() ||
            text[end + close.size() + newline] != quote)
            continue;
        return unescape(text.substr(body, end - body));
    }
    return "";
}

// Decodes one UTF-8 character at `at` (false if invalid), setting its code point and size.
bool decode_utf8(const std::string& s, size_t at, uint32_t* cp, size_t* size) {
    const auto byte = [&](size_t i) { return uint8_t(s[i]); };
    const uint8_t b = byte(at);
    size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || at + n > s.size()) return false;
    uint32_t value = n == 1 ? b : n == 2 ? (b & 0x1f) : n == 3 ? (b & 0x0f) : (b & 0x07);
    for (size_t i = 1; i < n; ++i) {
        if ((byte(at + i) & 0xc0) != 0x80) return false;
        value = (value << 6) | (byte(at + i) & 0x3f);
    }
    *cp = value;
    *size = n;
    return true;
}

bool is_python_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

constexpr const char* kLlama31DateFormat = "%d %b %Y";  // "26 Jul 2024"
constexpr const char* kHarmonyDateFormat = "%Y-%m-%d";  // "2024-07-26"

// The date a Llama 3.1+ template writes in its system header: strftime_now("%d %b %Y")
// when it asks for the current date (Llama 3.2), else its `set date_string = "..."`
// default (Llama 3.1, 3.3: "26 Jul 2024"). Empty when neither is there.
std::string llama31_date_default(const std::string& text, bool* from_clock) {
    *from_clock = contains(text, std::string("strftime_now(\"") + kLlama31DateFormat + "\")");
    if (*from_clock) return "";
    const std::string assignment = "set date_string = \"";
    const size_t at = text.find(assignment);
    if (at == std::string::npos) return "";
    const size_t begin = at + assignment.size(), end = text.find('"', begin);
    if (end == std::string::npos) return "";
    return text.substr(begin, end - begin);
}

// Llama 3.1+ templates always write a system header,
//     "Cutting Knowledge Date: " KNOWLEDGE "\n" "Today Date: " + date_string + "\n\n"
// followed by the (trimmed) system message. Fills `chat` or throws naming what is missing.
void recognise_dated_system_header(const std::string& text, ChatTemplate& chat) {
    chat.family = ChatFamily::Llama31;
    const auto refuse = [](const std::string& what) {
        throw Error(
            "--chat: a Llama 3.1-style chat template (a system header with 'Cutting "
            "Knowledge Date') without " +
            what + " is not recognised");
    };
    const std::string knowledge = "Cutting Knowledge Date: ";
    const size_t begin = text.find(knowledge) + knowledge.size();
    size_t end = begin, newline = 0;
    while (end < text.size() && text[end] != '"' && !newline_at(text, end, &newline)) ++end;
    if (end == text.size() || text[end] == '"' || end == begin)
        refuse("a knowledge date ending in a newline");
    chat.knowledge_date = text.substr(begin, end - begin);
    if (!contains(text, "\"Today Date: \" + date_string + \"\\n\\n\""))
        refuse("\"Today Date: \" + date_string + \"\\n\\n\"");
    chat.date = llama31_date_default(text, &chat.date_from_clock);
    chat.date_format = kLlama31DateFormat;
    if (chat.date.empty() && !chat.date_from_clock)
        refuse("a date_string default (set date_string = \"...\" or strftime_now(\"%d %b %Y\"))");
    if (!contains(text, "messages[0]['content']|trim") ||
        !contains(text, "message['content'] | trim") || !contains(text, "bos_token"))
        refuse("Llama 3.1's bos_token and trimmed system and user messages");
}

// Today's date as Python's strftime(format) writes it in the C locale, e.g. "22 Nov 2026"
// for "%d %b %Y".
std::string today(const std::string& format) {
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char text[64];
    if (std::strftime(text, sizeof text, format.c_str(), &local) == 0)
        throw Error("--chat: the chat template's date format \"" + format + "\" is too long");
    return text;
}

// Harmony's markers and the channel line of its system message.
constexpr const char* kHarmonyStart = "<|start|>";
constexpr const char* kHarmonyMessage = "<|message|>";
constexpr const char* kHarmonyChannel = "<|channel|>";
constexpr const char* kHarmonyFinalChannel = "final";
constexpr const char* kHarmonyFinalHeader = "<|channel|>final<|message|>";
constexpr const char* kHarmonyAnalysisHeader = "<|channel|>analysis<|message|>";
constexpr const char* kHarmonyChannels =
    "# Valid channels: analysis, commentary, final. Channel must be included for every "
    "message.";
// The texts that end a message: <|end|> (another message follows), <|return|> (the
// answer is complete), <|call|> (a tool call).
const char* const kHarmonyMessageEnds[] = {"<|end|>", "<|return|>", "<|call|>"};

// The body of the double-quoted Jinja string literal that `prefix` (which ends with its
// opening quote) starts in the template; "" when `prefix` is missing, the literal never
// closes or it holds an escape.
std::string literal_after(const std::string& text, const std::string& prefix) {
    const size_t at = text.find(prefix);
    if (at == std::string::npos) return "";
    const size_t begin = at + prefix.size(), end = text.find('"', begin);
    if (end == std::string::npos) return "";
    const std::string body = text.substr(begin, end - begin);
    return contains(body, "\\") ? "" : body;
}

// OpenAI's harmony template (gpt-oss): a system message built from the template's
// model_identity, knowledge cutoff, today's date and reasoning_effort; the system message of
// the conversation as a developer message; user and assistant (final channel) messages.
// Fills `chat` or throws naming what is missing.
void recognise_harmony(const std::string& text, ChatTemplate& chat) {
    chat.family = ChatFamily::Harmony;
    const auto refuse = [](const std::string& what) {
        throw Error(
            "--chat: a harmony chat template (<|start|>, <|channel|>, <|message|>) without " +
            what + " is not recognised");
    };
    if (!contains(text, "\"<|start|>system<|message|>\""))
        refuse("a \"<|start|>system<|message|>\"");
    chat.model_identity = literal_after(text, "set model_identity = \"");
    if (chat.model_identity.empty())
        refuse("a model_identity default (set model_identity = \"...\")");
    // "Knowledge cutoff: 2024-06\n": the literal up to its newline escape.
    const std::string cutoff_prefix = "\"Knowledge cutoff: ";
    const size_t cutoff_at = text.find(cutoff_prefix);
    std::string cutoff;
    if (cutoff_at != std::string::npos) {
        const size_t begin = cutoff_at + cutoff_prefix.size();
        const size_t end = text.find("\\n\"", begin);
        if (end != std::string::npos) cutoff = text.substr(begin, end - begin);
    }
    if (cutoff.empty() || contains(cutoff, "\"") || contains(cutoff, "\\"))
        refuse("a knowledge cutoff (\"Knowledge cutoff: ...\\n\")");
    chat.knowledge_date = cutoff;
    if (!contains(text,
                  std::string("\"Current date: \" + strftime_now(\"") + kHarmonyDateFormat + "\")"))
        refuse("\"Current date: \" + strftime_now(\"%Y-%m-%d\")");
    chat.date_from_clock = true;
    chat.date_format = kHarmonyDateFormat;
    chat.reasoning_effort = literal_after(text, "set reasoning_effort = \"");
    if (chat.reasoning_effort.empty() || !contains(text, "\"Reasoning: \" + reasoning_effort"))
        refuse("a reasoning_effort default (set reasoning_effort = \"...\") and its line");
    if (!contains(text, kHarmonyChannels)) refuse(std::string("\"") + kHarmonyChannels + "\"");
    if (!contains(text, "\"<|start|>developer<|message|>\"") ||
        !contains_literal(text, "\"# Instructions\n\n\""))
        refuse("a developer message \"<|start|>developer<|message|>\" \"# Instructions\\n\\n\"");
    if (!contains(text, "\"<|start|>user<|message|>\" + message.content + \"<|end|>\""))
        refuse("\"<|start|>user<|message|>\" + message.content + \"<|end|>\"");
    if (!contains(text,
                  "\"<|start|>assistant<|channel|>final<|message|>\" + message.content + "
                  "\"<|end|>\""))
        refuse("\"<|start|>assistant<|channel|>final<|message|>\" + message.content + \"<|end|>\"");
}

// The channel a Harmony message's header names ("<|channel|>final" gives "final"), "" when it
// names none.
std::string harmony_channel(const std::string& header) {
    const size_t at = header.find(kHarmonyChannel);
    if (at == std::string::npos) return "";
    const size_t begin = at + std::string(kHarmonyChannel).size();
    const size_t end = header.find_first_of(" <", begin);
    return header.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

// Qwen3's "{%- if enable_thinking is defined and enable_thinking is false %}
// {{- '<think>\n\n</think>\n\n' }}" after the generation prompt.
bool has_thinking_switch(const std::string& text) {
    return contains(text, "enable_thinking is defined and enable_thinking is false") &&
           (contains(text, "'<think>\\n\\n</think>\\n\\n'") ||
            contains(text, "'<think>\n\n</think>\n\n'"));
}

constexpr const char* kEmptyThinkBlock = "<think>\n\n</think>\n\n";

// Gemma's <start_of_turn>/<end_of_turn> templates. Fills `chat` or throws naming what is
// missing.
void recognise_gemma(const std::string& text, ChatTemplate& chat) {
    chat.family = ChatFamily::Gemma;
    chat.strip_prompt = true;
    chat.needs_bos = true;
    const auto refuse = [](const std::string& what) {
        throw Error(
            "--chat: a Gemma-style chat template (<start_of_turn>, <end_of_turn>) without " + what +
            " is not recognised");
    };
    if (!contains(text, "{{ bos_token }}")) refuse("{{ bos_token }}");
    if (!contains(text, "message['content'] | trim")) refuse("message['content'] | trim");
    if (!contains(text, "\"model\"") && !contains(text, "'model'"))
        refuse("the assistant's role written \"model\"");
    if (!contains_literal(text, "'<start_of_turn>model\n'"))
        refuse("a '<start_of_turn>model\\n' generation prompt");
    if (!contains_literal(text, "'<end_of_turn>\n'")) refuse("'<end_of_turn>\\n' after a turn");
    if (contains(text, "System role not supported")) {
        chat.system_role = false;  // Gemma 1 and 2
        return;
    }
    if (!contains_literal(text, "set first_user_prefix = messages[0]['content'] + '\n\n'"))
        refuse(
            "Gemma 3's system message folded into the first user turn (first_user_prefix = "
            "messages[0]['content'] + '\\n\\n') or Gemma 2's refusal of one");
}

// Phi's <|user|>/<|end|> templates: Phi-3 and Phi-3.5 spell each role's turn out, with a
// newline after the role and after the turn; Phi-4-mini writes every role as
// '<|' + message['role'] + '|>', without newlines. Fills `chat` or throws naming what is
// missing.
void recognise_phi(const std::string& text, ChatTemplate& chat) {
    chat.family = ChatFamily::Phi;
    const auto refuse = [](const std::string& what) {
        throw Error("--chat: a Phi-style chat template (<|user|>, <|end|>) without " + what +
                    " is not recognised");
    };
    if (contains(text, "'<|' + message['role'] + '|>' + message['content'] + '<|end|>'")) {
        chat.role_separator = chat.turn_separator = "";  // Phi-4-mini
        if (!contains(text, "'<|assistant|>'")) refuse("an '<|assistant|>' generation prompt");
        return;
    }
    if (!contains_literal(text, "'<|user|>\n' + message['content'] + '<|end|>\n'"))
        refuse(
            "'<|user|>\\n' + message['content'] + '<|end|>\\n' (Phi-3) or '<|' + "
            "message['role'] + '|>' + message['content'] + '<|end|>' (Phi-4-mini)");
    if (!contains_literal(text, "'<|assistant|>\n'"))
        refuse("an '<|assistant|>\\n' generation prompt");
    chat.system_role = contains_literal(text, "'<|system|>\n' + message['content'] + '<|end|>\n'");
    chat.skip_empty_system = contains(text, "message['role'] == 'system' and message['content']");
}

// Phi-4's ChatML: '<|im_start|>' ROLE '<|im_sep|>' + message['content'] + '<|im_end|>', no
// newlines. Fills `chat` or throws naming what is missing.
void recognise_chatml_im_sep(const std::string& text, ChatTemplate& chat) {
    if (!contains(text, "'<|im_start|>assistant<|im_sep|>'") ||
        !contains(text, "<|im_sep|>' + message['content'] + '<|im_end|>'"))
        throw Error(
            "--chat: a ChatML chat template with <|im_sep|> but without Phi-4's "
            "'<|im_start|>assistant<|im_sep|>' generation prompt and turns ending in "
            "'<|im_end|>' is not recognised");
    chat.role_separator = "<|im_sep|>";
    chat.turn_separator = "";
}

// The tool formats of chat_tools.h, recognised by the texts they write: each piece the
// renderer writes must be in the template (as a Jinja literal, its newlines real or escaped).
// A template that writes tools otherwise keeps ToolFormat::None, and tools are refused.
void recognise_tool_format(const std::string& text, ChatTemplate& chat) {
    const auto holds_all = [&](std::initializer_list<const char*> parts) {
        for (const char* part : parts)
            if (!contains_literal(text, part)) return false;
        return true;
    };
    if (chat.family == ChatFamily::ChatML &&
        holds_all({"# Tools\n\nYou may call one or more functions to assist with the user "
                   "query.\n\nYou are provided with function signatures within <tools></tools> "
                   "XML tags:\n<tools>",
                   "\n</tools>\n\nFor each function call, return a json object with function name "
                   "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n",
                   "<args-json-object>}\n</tool_call><|im_end|>\n", "tool | tojson",
                   "<tool_call>\n{\"name\": \"", "\", \"arguments\": ", "}\n</tool_call>",
                   "\n<tool_response>\n", "\n</tool_response>", "'<|im_start|>user'"})) {
        chat.splits_think_blocks = contains(text, "message.content.split('</think>')[-1]");
        // Qwen3's think blocks and string arguments come together; a thinking switch without
        // them is a variant not known here.
        if (chat.thinking_switch != chat.splits_think_blocks) return;
        chat.verbatim_string_arguments = contains(text, "tool_call.arguments is string");
        chat.tool_format = ToolFormat::Hermes;
    }
    if (chat.family == ChatFamily::Llama31 &&
        holds_all({"Given the following functions, please respond with a JSON for a function "
                   "call ",
                   "with its proper arguments that best answers the given prompt.\n\n",
                   "Respond in the format {\"name\": function name, \"parameters\": dictionary "
                   "of argument name and its value}.",
                   "Do not use variables.\n\n", "t | tojson(indent=4)", "Environment: ipython\n",
                   "set tools_in_user_message = true", "message.tool_calls[0].function",
                   "<|start_header_id|>ipython<|end_header_id|>\n\n", "'\"parameters\": '",
                   "tool_call.arguments | tojson"}))
        chat.tool_format = ToolFormat::Llama31;
}

}  // namespace

std::string ThinkBlockFilter::feed(const std::string& piece) {
    std::string text = held_ + piece, shown;
    held_.clear();
    while (!text.empty()) {
        if (inside_) {
            const size_t close = text.find(kThinkClose);
            if (close == std::string::npos) {  // keep only what may start the marker
                held_ = text.substr(text.size() - partial_marker_length(text, kThinkClose));
                return shown;
            }
            text.erase(0, close + std::string(kThinkClose).size());
            inside_ = false;
            after_block_ = true;
            continue;
        }
        if (after_block_) {
            const size_t content = text.find_first_not_of(" \t\r\n");
            if (content == std::string::npos) return shown;
            text.erase(0, content);
            after_block_ = false;
        }
        const size_t open = text.find(kThinkOpen);
        if (open == std::string::npos) {
            const size_t partial = partial_marker_length(text, kThinkOpen);
            shown += text.substr(0, text.size() - partial);
            held_ = text.substr(text.size() - partial);
            return shown;
        }
        shown += text.substr(0, open);
        text.erase(0, open + std::string(kThinkOpen).size());
        inside_ = true;
    }
    return shown;
}

std::string ThinkBlockFilter::finish() {
    std::string rest = inside_ ? "" : held_;
    held_.clear();
    return rest;
}

std::string HarmonyChannelFilter::feed(const std::string& piece) {
    std::string text = held_ + piece, shown;
    held_.clear();
    const size_t message_length = std::string(kHarmonyMessage).size();
    while (!text.empty()) {
        if (!in_body_) {
            // The header held back was searched before, but for a marker's start at its end.
            const size_t body = text.find(kHarmonyMessage, header_searched_);
            if (body == std::string::npos) {
                held_ = text;
                header_searched_ =
                    text.size() >= message_length ? text.size() - message_length + 1 : 0;
                return shown;
            }
            shown_ = harmony_channel(text.substr(0, body)) == kHarmonyFinalChannel;
            text.erase(0, body + message_length);
            header_searched_ = 0;
            in_body_ = true;
            continue;
        }
        size_t end = std::string::npos, end_length = 0, partial = 0;
        for (const char* marker : kHarmonyMessageEnds) {
            const size_t at = text.find(marker);
            if (at < end) {
                end = at;
                end_length = std::string(marker).size();
            }
            partial = std::max(partial, partial_marker_length(text, marker));
        }
        if (end == std::string::npos) {  // keep only what may start a marker
            if (shown_) shown += text.substr(0, text.size() - partial);
            held_ = text.substr(text.size() - partial);
            return shown;
        }
        if (shown_) shown += text.substr(0, end);
        text.erase(0, end + end_length);
        in_body_ = false;
    }
    return shown;
}

std::string HarmonyChannelFilter::finish() {
    std::string rest = in_body_ && shown_ ? held_ : "";
    held_.clear();
    header_searched_ = 0;
    return rest;
}

ReasoningMarkup chat_reasoning_markup(ChatFamily family) {
    return family == ChatFamily::Harmony ? ReasoningMarkup::HarmonyChannels
                                         : ReasoningMarkup::ThinkBlock;
}

bool chat_markup_is_special(ChatFamily family) { return family == ChatFamily::Harmony; }

std::string ReasoningFilter::feed(const std::string& piece) {
    return markup_ == ReasoningMarkup::HarmonyChannels ? harmony_.feed(piece) : think_.feed(piece);
}

std::string ReasoningFilter::finish() {
    return markup_ == ReasoningMarkup::HarmonyChannels ? harmony_.finish() : think_.finish();
}

std::string python_strip(const std::string& text) {
    // Split into characters; invalid bytes count as non-space characters of one byte.
    size_t begin = 0, end = text.size();
    while (begin < end) {
        uint32_t cp = 0;
        size_t size = 0;
        if (!decode_utf8(text, begin, &cp, &size) || !is_python_space(cp)) break;
        begin += size;
    }
    while (end > begin) {
        size_t start = end - 1;  // back to the first byte of the last character
        while (start > begin && (uint8_t(text[start]) & 0xc0) == 0x80 && end - start < 4) --start;
        uint32_t cp = 0;
        size_t size = 0;
        if (!decode_utf8(text, start, &cp, &size) || start + size != end || !is_python_space(cp))
            break;
        end = start;
    }
    return text.substr(begin, end - begin);
}

ChatTemplate recognise_chat_template(const std::string& text) {
    ChatTemplate chat;
    if (contains(text, "<|im_start|>") && contains(text, "<|im_end|>")) {
        chat.family = ChatFamily::ChatML;
        if (contains(text, "<|im_sep|>")) {
            recognise_chatml_im_sep(text, chat);
            return chat;
        }
        if (!contains(text, "<|im_start|>assistant\n") &&
            !contains(text, "<|im_start|>assistant\\n"))
            throw Error(
                "--chat: the ChatML chat template has no '<|im_start|>assistant\\n' "
                "generation prompt");
        chat.default_system = chatml_default_system(text);
        chat.thinking_switch = has_thinking_switch(text);
        recognise_tool_format(text, chat);
        return chat;
    }
    if (contains(text, "<|start_header_id|>") && contains(text, "<|end_header_id|>") &&
        contains(text, "<|eot_id|>")) {
        chat.strip_prompt = true;
        chat.needs_bos = true;
        if (contains(text, "Cutting Knowledge Date: ")) {
            recognise_dated_system_header(text, chat);
            recognise_tool_format(text, chat);
            return chat;
        }
        chat.family = ChatFamily::Llama3;
        if (!contains(text, "message['content'] | trim") || !contains(text, "bos_token"))
            throw Error(
                "--chat: a Llama 3-style chat template without Llama 3's "
                "\"bos_token + ... message['content'] | trim\" is not recognised");
        return chat;
    }
    if (contains(text, kHarmonyStart) && contains(text, kHarmonyChannel) &&
        contains(text, kHarmonyMessage)) {
        recognise_harmony(text, chat);
        return chat;
    }
    if (contains(text, "<start_of_turn>") && contains(text, "<end_of_turn>")) {
        recognise_gemma(text, chat);
        return chat;
    }
    if (contains(text, "<|end|>") &&
        (contains(text, "<|user|>") || contains(text, "'<|' + message['role'] + '|>'"))) {
        recognise_phi(text, chat);
        return chat;
    }
    if (contains(text, "[INST]")) {
        chat.family = ChatFamily::Llama2;
        chat.needs_bos = true;
        if (contains(text, "bos_token + '[INST] ' + content.strip() + ' [/INST]'")) {
            chat.strip_prompt = true;  // Llama-2-chat
            return chat;
        }
        if (contains(text, "{{ bos_token }}") &&
            contains(text, "'[INST] ' + message['content'] + ' [/INST]'")) {
            chat.system_role = false;  // "Only user and assistant roles are supported!"
            chat.space_after_eos = contains(text, "eos_token + ' '");
            return chat;  // Mistral-Instruct v0.1/v0.2
        }
        throw Error(
            "--chat: an [INST] chat template of a variant barellm does not know "
            "(neither Llama-2-chat's \"bos_token + '[INST] ' + content.strip() + "
            "' [/INST]'\" nor Mistral-Instruct's \"'[INST] ' + message['content'] + "
            "' [/INST]'\")");
    }
    throw Error(
        "--chat: the model's chat template is not one barellm knows (no ChatML "
        "<|im_start|>/<|im_end|>, Llama 3 <|start_header_id|>/<|eot_id|>, "
        "Llama 2/Mistral [INST], Gemma <start_of_turn>/<end_of_turn>, Phi <|user|>/<|end|> or "
        "harmony <|start|>/<|channel|>/<|message|> markers)");
}

namespace {

// The Llama 3 user turn with the generation prompt.
std::string llama3_user_turn(const std::string& content) {
    return "<|start_header_id|>user<|end_header_id|>\n\n" + content +
           "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
}

// The Gemma user turn with the generation prompt.
std::string gemma_user_turn(const std::string& content) {
    return "<start_of_turn>user\n" + content + "<end_of_turn>\n<start_of_turn>model\n";
}

// One ChatML turn: <|im_start|>ROLE, the role separator, the content, <|im_end|> and the turn
// separator.
std::string chatml_turn(const ChatTemplate& chat, const std::string& role,
                        const std::string& content) {
    return "<|im_start|>" + role + chat.role_separator + content + "<|im_end|>" +
           chat.turn_separator;
}

// The ChatML user turn with the generation prompt.
std::string chatml_user_turn(const ChatTemplate& chat, const std::string& content) {
    return chatml_turn(chat, "user", content) + "<|im_start|>assistant" + chat.role_separator;
}

// One Phi turn: <|ROLE|>, the role separator, the content, <|end|> and the turn separator.
std::string phi_turn(const ChatTemplate& chat, const std::string& role,
                     const std::string& content) {
    return "<|" + role + "|>" + chat.role_separator + content + "<|end|>" + chat.turn_separator;
}

// The Phi user turn with the generation prompt.
std::string phi_user_turn(const ChatTemplate& chat, const std::string& content) {
    return phi_turn(chat, "user", content) + "<|assistant|>" + chat.role_separator;
}

// The Harmony user turn with the generation prompt.
std::string harmony_user_turn(const std::string& content) {
    return "<|start|>user<|message|>" + content + "<|end|><|start|>assistant";
}

// Harmony's system message, always written, and the system message of the conversation as a
// developer message when it is not empty.
std::string harmony_system(const ChatTemplate& chat, const std::optional<std::string>& system) {
    std::string out = "<|start|>system<|message|>" + chat.model_identity +
                      "\nKnowledge cutoff: " + chat.knowledge_date +
                      "\nCurrent date: " + chat_template_date(chat) +
                      "\n\nReasoning: " + chat.reasoning_effort + "\n\n" + kHarmonyChannels +
                      "<|end|>";
    if (system && !system->empty())
        out += "<|start|>developer<|message|># Instructions\n\n" + *system + "\n\n<|end|>";
    return out;
}

}  // namespace

std::string render_chat(const ChatTemplate& chat, const std::optional<std::string>& system,
                        const std::string& prompt, const std::string& bos_token,
                        bool enable_thinking) {
    const char* family = chat_family_name(chat.family);
    if (!enable_thinking && !chat.thinking_switch)
        throw Error(std::string("--no-think: the model's ") + family +
                    " chat template has no enable_thinking switch");
    if (chat.needs_bos && bos_token.empty())
        throw Error(std::string("--chat: the ") + family +
                    " chat template starts with BOS but the model has no BOS token");
    if (system && !chat.system_role)
        throw Error(std::string("--system: the model's ") + family +
                    " chat template has no system role");
    const std::string content = chat.strip_prompt ? python_strip(prompt) : prompt;
    const std::string llama3_turns = llama3_user_turn(content);
    const std::string llama3_system = "<|start_header_id|>system<|end_header_id|>\n\n";
    switch (chat.family) {
        case ChatFamily::ChatML: {
            std::string out;
            const std::string& system_text = system ? *system : chat.default_system;
            if (system || !chat.default_system.empty())
                out += chatml_turn(chat, "system", system_text);
            return out + chatml_user_turn(chat, content) +
                   (enable_thinking ? "" : kEmptyThinkBlock);
        }
        case ChatFamily::Llama3:
            if (!system) return bos_token + llama3_turns;
            return bos_token + llama3_system + python_strip(*system) + "<|eot_id|>" + llama3_turns;
        case ChatFamily::Llama31:
            return bos_token + llama3_system + "Cutting Knowledge Date: " + chat.knowledge_date +
                   "\nToday Date: " + chat_template_date(chat) + "\n\n" +
                   (system ? python_strip(*system) : "") + "<|eot_id|>" + llama3_turns;
        case ChatFamily::Llama2: {
            // Llama-2-chat strips the whole content, system block included.
            const std::string with_system =
                system ? "<<SYS>>\n" + *system + "\n<</SYS>>\n\n" + prompt : prompt;
            return bos_token + "[INST] " +
                   (chat.strip_prompt ? python_strip(with_system) : with_system) + " [/INST]";
        }
        case ChatFamily::Gemma:
            return bos_token + gemma_user_turn(system ? *system + "\n\n" + content : content);
        case ChatFamily::Phi: {
            const bool with_system = system && !(chat.skip_empty_system && system->empty());
            return (with_system ? phi_turn(chat, "system", *system) : "") +
                   phi_user_turn(chat, content);
        }
        case ChatFamily::Harmony:
            return harmony_system(chat, system) + harmony_user_turn(content);
    }
    return "";
}

void set_reasoning_effort(ChatTemplate& chat, const std::string& effort, const std::string& what) {
    if (chat.family != ChatFamily::Harmony)
        throw Error(what + " needs a harmony chat template (gpt-oss); this model's is " +
                    chat_family_name(chat.family));
    for (const char* level : {"low", "medium", "high"})
        if (effort == level) {
            chat.reasoning_effort = effort;
            return;
        }
    throw Error(what + " " + quoted_excerpt(effort) + " is not low, medium or high");
}

bool chat_rewrites_replies(ChatFamily family) { return family == ChatFamily::Harmony; }

std::string render_reply(const ChatTemplate& chat, const std::string& content) {
    switch (chat.family) {
        case ChatFamily::ChatML:
        case ChatFamily::Phi:
            return content;
        case ChatFamily::Llama3:
        case ChatFamily::Llama31:
        case ChatFamily::Gemma:
            return python_strip(content);
        case ChatFamily::Llama2:
            return chat.strip_prompt ? " " + python_strip(content) : content;
        case ChatFamily::Harmony:
            if (contains(content, kHarmonyAnalysisHeader) || contains(content, kHarmonyFinalHeader))
                throw Error(std::string("the harmony chat template refuses an assistant message "
                                        "holding ") +
                            kHarmonyAnalysisHeader + " or " + kHarmonyFinalHeader);
            return kHarmonyFinalHeader + content;
    }
    return content;
}

std::string render_next_turn(const ChatTemplate& chat, const std::string& prompt,
                             const std::string& bos_token, const std::string& eos_token) {
    const std::string content = chat.strip_prompt ? python_strip(prompt) : prompt;
    switch (chat.family) {
        case ChatFamily::ChatML:
            return "<|im_end|>" + chat.turn_separator + chatml_user_turn(chat, content);
        case ChatFamily::Llama3:
        case ChatFamily::Llama31:
            return "<|eot_id|>" + llama3_user_turn(content);
        case ChatFamily::Llama2: {
            if (eos_token.empty() || (chat.strip_prompt && bos_token.empty()))
                throw Error(
                    "chat: the Llama 2 chat template ends a reply with EOS and starts the next "
                    "turn with BOS, but the model lacks one of them");
            if (chat.strip_prompt)  // Llama-2-chat
                return " " + eos_token + bos_token + "[INST] " + content + " [/INST]";
            return eos_token + (chat.space_after_eos ? " " : "") + "[INST] " + content + " [/INST]";
        }
        case ChatFamily::Gemma:
            return "<end_of_turn>\n" + gemma_user_turn(content);
        case ChatFamily::Phi:
            return "<|end|>" + chat.turn_separator + phi_user_turn(chat, content);
        case ChatFamily::Harmony:
            return "<|end|>" + harmony_user_turn(content);
    }
    return "";
}

std::string chat_end_of_turn(ChatFamily family) {
    switch (family) {
        case ChatFamily::ChatML:
            return "<|im_end|>";
        case ChatFamily::Llama3:
        case ChatFamily::Llama31:
            return "<|eot_id|>";
        case ChatFamily::Llama2:
            return "";
        case ChatFamily::Gemma:
            return "<end_of_turn>";
        case ChatFamily::Phi:
            return "<|end|>";
        case ChatFamily::Harmony:
            return "<|return|>";
    }
    return "";
}

size_t partial_marker_length(const std::string& text, const std::string& marker) {
    for (size_t length = std::min(text.size(), marker.size() - 1); length > 0; --length)
        if (text.compare(text.size() - length, length, marker, 0, length) == 0) return length;
    return 0;
}

std::string chat_template_date(const ChatTemplate& chat) {
    return chat.date_from_clock ? today(chat.date_format) : chat.date;
}

const char* chat_family_name(ChatFamily family) {
    switch (family) {
        case ChatFamily::ChatML:
            return "ChatML";
        case ChatFamily::Llama3:
            return "Llama 3";
        case ChatFamily::Llama31:
            return "Llama 3.1";
        case ChatFamily::Llama2:
            return "Llama 2";
        case ChatFamily::Gemma:
            return "Gemma";
        case ChatFamily::Phi:
            return "Phi";
        case ChatFamily::Harmony:
            return "Harmony";
    }
    return "";
}

}  // namespace barellm
