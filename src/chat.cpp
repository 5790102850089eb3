#include "chat.h"

#include <cstdint>

#include "error.h"

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

// Decodes the escapes of a Jinja string literal's body; false for escapes not handled.
bool unescape(const std::string& body, std::string* out) {
    out->clear();
    for (size_t i = 0; i < body.size(); ++i) {
        if (body[i] != '\\') {
            out->push_back(body[i]);
            continue;
        }
        if (++i == body.size()) return false;
        switch (body[i]) {
            case 'n': out->push_back('\n'); break;
            case 't': out->push_back('\t'); break;
            case '\\': case '\'': case '"': out->push_back(body[i]); break;
            default: return false;
        }
    }
    return true;
}

// The system message of a literal 'QUOTE<|im_start|>system\n TEXT <|im_end|>\nQUOTE' in
// the template (the turn ChatML templates write when the conversation brings no system
// message), or "" when there is none.
std::string chatml_default_system(const std::string& text) {
    const std::string open = "<|im_start|>system", close = "<|im_end|>";
    for (size_t at = text.find(open); at != std::string::npos; at = text.find(open, at + 1)) {
        if (at == 0 || (text[at - 1] != '\'' && text[at - 1] != '"')) continue;
        const char quote = text[at - 1];
        size_t newline = 0;
        if (!newline_at(text, at + open.size(), &newline)) continue;
        const size_t body = at + open.size() + newline;
        const size_t end = text.find(close, body);
        if (end == std::string::npos || end == body) continue;
        const std::string raw = text.substr(body, end - body);
        // The literal must not close before <|im_end|> (as in '...system\n' + content).
        bool closes = false;
        for (size_t i = 0; i < raw.size(); ++i) {
            if (raw[i] == '\\') ++i;
            else if (raw[i] == quote) closes = true;
        }
        if (closes) continue;
        if (!newline_at(text, end + close.size(), &newline)) continue;
        if (end + close.size() + newline >= text.size() ||
            text[end + close.size() + newline] != quote)
            continue;
        std::string system;
        if (unescape(raw, &system)) return system;
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
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 ||
           cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

}  // namespace

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
        if (!contains(text, "<|im_start|>assistant\n") &&
            !contains(text, "<|im_start|>assistant\\n"))
            throw Error("--chat: the ChatML chat template has no '<|im_start|>assistant\\n' "
                        "generation prompt");
        chat.default_system = chatml_default_system(text);
        return chat;
    }
    if (contains(text, "<|start_header_id|>") && contains(text, "<|end_header_id|>") &&
        contains(text, "<|eot_id|>")) {
        chat.family = ChatFamily::Llama3;
        if (contains(text, "Cutting Knowledge Date"))
            throw Error("--chat: Llama 3.1+ chat templates (a system header with 'Cutting "
                        "Knowledge Date') are not supported; only Llama 3's");
        if (!contains(text, "message['content'] | trim") || !contains(text, "bos_token"))
            throw Error("--chat: a Llama 3-style chat template without Llama 3's "
                        "\"bos_token + ... message['content'] | trim\" is not recognised");
        chat.strip_prompt = true;
        chat.needs_bos = true;
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
            contains(text, "'[INST] ' + message['content'] + ' [/INST]'"))
            return chat;  // Mistral-Instruct v0.1/v0.2
        throw Error("--chat: an [INST] chat template of a variant barellm does not know "
                    "(neither Llama-2-chat's \"bos_token + '[INST] ' + content.strip() + "
                    "' [/INST]'\" nor Mistral-Instruct's \"'[INST] ' + message['content'] + "
                    "' [/INST]'\")");
    }
    throw Error("--chat: the model's chat template is not one barellm knows (no ChatML "
                "<|im_start|>/<|im_end|>, Llama 3 <|start_header_id|>/<|eot_id|> or "
                "Llama 2/Mistral [INST] markers)");
}

std::string render_chat(const ChatTemplate& chat, const std::string& prompt,
                        const std::string& bos_token) {
    if (chat.needs_bos && bos_token.empty())
        throw Error(std::string("--chat: the ") + chat_family_name(chat.family) +
                    " chat template starts with BOS but the model has no BOS token");
    const std::string content = chat.strip_prompt ? python_strip(prompt) : prompt;
    switch (chat.family) {
        case ChatFamily::ChatML: {
            std::string out;
            if (!chat.default_system.empty())
                out += "<|im_start|>system\n" + chat.default_system + "<|im_end|>\n";
            return out + "<|im_start|>user\n" + content + "<|im_end|>\n<|im_start|>assistant\n";
        }
        case ChatFamily::Llama3:
            return bos_token + "<|start_header_id|>user<|end_header_id|>\n\n" + content +
                   "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
        case ChatFamily::Llama2:
            return bos_token + "[INST] " + content + " [/INST]";
    }
    return "";
}

std::string chat_end_of_turn(ChatFamily family) {
    switch (family) {
        case ChatFamily::ChatML: return "<|im_end|>";
        case ChatFamily::Llama3: return "<|eot_id|>";
        case ChatFamily::Llama2: return "";
    }
    return "";
}

const char* chat_family_name(ChatFamily family) {
    switch (family) {
        case ChatFamily::ChatML: return "ChatML";
        case ChatFamily::Llama3: return "Llama 3";
        case ChatFamily::Llama2: return "Llama 2";
    }
    return "";
}

}  // namespace barellm
