// Unicode character properties and UTF-8 decoding, shared by the tokenizer and the
// regular expressions of its pre-tokenizers (regex.h). The character data is generated
// (unicode_tables.h, Unicode 16.0).
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

#include "tokenizer/unicode_tables.h"

namespace barellm::unicode {

// The general category of a code point; GeneralCategory::Cn for unassigned ones.
GeneralCategory general_category(char32_t cp);

// The groups of general categories: L (letters), M (marks), N (numbers).
inline bool is_letter(GeneralCategory c) { return c <= GeneralCategory::Lo; }
inline bool is_mark(GeneralCategory c) {
    return c >= GeneralCategory::Mn && c <= GeneralCategory::Me;
}
inline bool is_number(GeneralCategory c) {
    return c >= GeneralCategory::Nd && c <= GeneralCategory::No;
}

// The White_Space property, which is both Oniguruma's `\s` (verified against every code
// point) and Rust's char::is_whitespace: the code points of these ranges.
extern const CodePointRange kWhiteSpaceRanges[];
extern const size_t kWhiteSpaceRangeCount;
bool is_white_space(char32_t cp);

// Length of the character whose first byte is `lead`, in text known to be valid UTF-8.
inline size_t utf8_length(unsigned char lead) {
    if (lead < 0x80) return 1;
    if (lead < 0xE0) return 2;
    if (lead < 0xF0) return 3;
    return 4;
}

// The character at text[pos], in text known to be valid UTF-8.
inline char32_t decode_utf8(std::string_view text, size_t pos) {
    const auto byte = [&](size_t i) { return char32_t(static_cast<unsigned char>(text[pos + i])); };
    switch (utf8_length(static_cast<unsigned char>(text[pos]))) {
        case 1:
            return byte(0);
        case 2:
            return (byte(0) & 0x1F) << 6 | (byte(1) & 0x3F);
        case 3:
            return (byte(0) & 0x0F) << 12 | (byte(1) & 0x3F) << 6 | (byte(2) & 0x3F);
        default:
            return (byte(0) & 0x07) << 18 | (byte(1) & 0x3F) << 12 | (byte(2) & 0x3F) << 6 |
                   (byte(3) & 0x3F);
    }
}

// Start of the character that ends at text[pos] (pos > 0), in text known to be valid UTF-8.
inline size_t utf8_previous(std::string_view text, size_t pos) {
    do {
        --pos;
    } while ((static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80);
    return pos;
}

void append_utf8(std::string& out, char32_t cp);

enum class Utf8Status { Complete, Truncated, Invalid };
struct Utf8Scan {
    Utf8Status status;
    size_t length;  // of the character, of the cut-off beginning, or of the ill-formed part
};

// Classifies the bytes at bytes[pos] by Unicode's table of well-formed UTF-8 sequences: a
// complete character, the valid beginning of one cut off by the end of `bytes`, or an
// ill-formed sequence whose maximal valid-looking part (1 to 3 bytes) stands for one
// U+FFFD, as Rust's String::from_utf8_lossy (and so Hugging Face) replaces it.
Utf8Scan scan_utf8(std::string_view bytes, size_t pos);

bool is_valid_utf8(std::string_view bytes);

// The offset of the first byte of `bytes` that does not begin a complete, well-formed
// character; std::string_view::npos when all of `bytes` is valid UTF-8.
size_t first_invalid_utf8(std::string_view bytes);

}  // namespace barellm::unicode
