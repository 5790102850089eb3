// Test tool: compiles regex patterns with barellm's engine (src/tokenizer/regex.h), for comparison
// with the converter's check of the same subset (convert/regex_subset.py,
// tests/test_regex_subset.py).
//   regex_check < PATTERNS
// reads one pattern a line, each a JSON string, and prints one JSON line for each:
// {"ok":true} when it compiles, else {"ok":false,"error":"<the Error's message>"}.
// A line that is not a JSON string prints the problem on stderr and exits with 1.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "error.h"
#include "tokenizer/regex.h"

namespace {

using json = nlohmann::json;

json verdict(const std::string& pattern) {
    try {
        barellm::Regex regex(pattern);
    } catch (const barellm::Error& e) {
        return {{"ok", false}, {"error", e.what()}};
    }
    return {{"ok", true}};
}

}  // namespace

int main() {
    std::string line;
    for (size_t number = 1; std::getline(std::cin, line); ++number) {
        json pattern;
        try {
            pattern = json::parse(line);
        } catch (const json::exception& e) {
            std::fprintf(stderr, "regex_check: line %zu: not valid JSON (%s)\n", number, e.what());
            return 1;
        }
        if (!pattern.is_string()) {
            std::fprintf(stderr, "regex_check: line %zu: not a JSON string\n", number);
            return 1;
        }
        // A message that quotes invalid UTF-8 shows U+FFFD there, and so differs from the
        // converter's: the comparison names the pattern, where a throw here would not.
        std::cout << verdict(pattern.get<std::string>())
                         .dump(-1, ' ', false, json::error_handler_t::replace)
                  << '\n';
    }
    return 0;
}
