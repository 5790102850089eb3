// JSON from files and arguments barellm does not trust: parsing with a nesting limit, and
// excerpts of values short enough to quote in an error message.
#pragma once
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace barellm {

// The deepest nesting parse_json accepts. Real documents nest a few levels; the code that
// walks a document (and nlohmann's dump and copies) recurses once per level, so a deeper
// one could overflow the stack.
constexpr int kMaxJsonDepth = 64;

// About how many bytes of an untrusted value an error message quotes.
constexpr size_t kExcerptBytes = 60;

// Parses `text`. Throws Error "<what>: not valid JSON (...)" naming the byte where the
// syntax breaks, or "<what>: JSON nested deeper than ... levels".
nlohmann::json parse_json(std::string_view text, const std::string& what);

// The same, keeping each object's keys in the order of the text.
nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& what);

// `value` as JSON text, cut after about kExcerptBytes bytes with "..." when longer.
std::string json_excerpt(const nlohmann::json& value);

// `text` in single quotes, cut likewise.
std::string quoted_excerpt(std::string_view text);

}  // namespace barellm
