// UTF-8 string helpers shared by the tokenizer's components (normalizers, pre-tokenizers,
// decoders).
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace barellm::tok {

constexpr char32_t kReplacementCharacter = 0xFFFD;  // stands for ill-formed UTF-8

// The UTF-8 encoding of one code point.
std::string utf8_of(char32_t cp);

// Throws Error if `text` is not valid UTF-8.
void require_valid_utf8(std::string_view text);

// Appends `bytes` to `out` as text, each ill-formed sequence replaced by U+FFFD.
// - A character cut off at the end is left out, unless `at_end`: then it is ill-formed too.
// - Returns the number of bytes consumed.
size_t append_lossy_utf8(std::string_view bytes, std::string& out, bool at_end);

// `text` with every occurrence of `pattern` replaced by `content` (none if `pattern` is "").
std::string replace_all(std::string_view text, std::string_view pattern, std::string_view content);

}  // namespace barellm::tok
