// UTF-8 string helpers shared by the tokenizer's components (declared in text.h).
#include "tokenizer/text.h"

#include "util/error.h"
#include "tokenizer/unicode.h"

namespace barellm::tok {

using unicode::append_utf8;
using unicode::scan_utf8;
using unicode::Utf8Scan;
using unicode::Utf8Status;

std::string utf8_of(char32_t cp) {
    std::string out;
    append_utf8(out, cp);
    return out;
}

void require_valid_utf8(std::string_view text) {
    const size_t invalid = unicode::first_invalid_utf8(text);
    if (invalid != std::string_view::npos)
        throw Error("text to tokenize is not valid UTF-8 (at byte " + std::to_string(invalid) +
                    ")");
}

size_t append_lossy_utf8(std::string_view bytes, std::string& out, bool at_end) {
    size_t pos = 0;
    while (pos < bytes.size()) {
        const Utf8Scan scan = scan_utf8(bytes, pos);
        if (scan.status == Utf8Status::Truncated && !at_end) break;
        if (scan.status == Utf8Status::Complete) {
            out.append(bytes.substr(pos, scan.length));
        } else {
            append_utf8(out, kReplacementCharacter);
        }
        pos += scan.length;
    }
    return pos;
}

std::string replace_all(std::string_view text, std::string_view pattern, std::string_view content) {
    if (pattern.empty()) return std::string(text);
    std::string out;
    out.reserve(text.size());
    size_t pos = 0;
    for (size_t found; (found = text.find(pattern, pos)) != std::string_view::npos;
         pos = found + pattern.size()) {
        out.append(text.substr(pos, found - pos));
        out.append(content);
    }
    out.append(text.substr(pos));
    return out;
}

}  // namespace barellm::tok
