// Unit tests of the regex engine of the pre-tokenizers on small hand-checked cases. That it
// matches like Oniguruma (through Hugging Face `tokenizers`) on real patterns, large texts
// and every code point is tested by tests/test_tokenizer_parity.py.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "util/error.h"
#include "tokenizer/regex.h"

using barellm::Error;
using barellm::Regex;
using Matches = std::vector<Regex::Match>;

namespace {

Matches find(const std::string& pattern, const std::string& text) {
    return Regex(pattern).find_all(text);
}

// The error message of compiling `pattern`, or "" if it compiles.
std::string refusal(const std::string& pattern) {
    try {
        Regex regex(pattern);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("alternatives are tried left to right, the first that matches wins", "[regex]") {
    CHECK(find("a|ab", "ab") == Matches{{0, 1}});
    CHECK(find("ab|a", "ab") == Matches{{0, 2}});
    // More alternatives than a Branch holds (64): w0|w1|...|w69, and the same backwards.
    std::string forwards = "w0", backwards = "w69";
    for (int i = 1; i < 70; ++i) {
        forwards += "|w" + std::to_string(i);
        backwards += "|w" + std::to_string(69 - i);
    }
    CHECK(find(forwards, "w69w5w10") == Matches{{0, 2}, {3, 5}, {5, 7}});
    CHECK(find(backwards, "w69w5w10") == Matches{{0, 3}, {3, 5}, {5, 8}});
    // GPT-2's last two alternatives: a run of spaces leaves its last one to the next word.
    CHECK(find(R"(\s+(?!\S)|\s+)", "a   b") == Matches{{1, 3}, {3, 4}});
}

TEST_CASE("greedy quantifiers give back characters until the rest matches", "[regex]") {
    CHECK(find("a+ab", "aaab") == Matches{{0, 4}});
    CHECK(find("(?:a|b)*c", "ababc abd") == Matches{{0, 5}});
    // Llama 3's \s*[\r\n]+ backtracks to the last line break of a run of spaces.
    CHECK(find(R"(\s*[\r\n]+)", "  \n  \n  x") == Matches{{0, 6}});
}

TEST_CASE("quantifier bounds", "[regex]") {
    CHECK(find(R"(\d{1,3})", "12345") == Matches{{0, 3}, {3, 5}});
    CHECK(find("x{2}", "xxxxx") == Matches{{0, 2}, {2, 4}});
    CHECK(find("x{2,}", "xxxxx") == Matches{{0, 5}});
    CHECK(find("x{,2}", "xxx") == Matches{{0, 2}, {2, 3}});
    CHECK(find("x?", "x") == Matches{{0, 1}});
    CHECK(find("(?:ab)+", "ababa") == Matches{{0, 4}});
    CHECK(find("(?:ab){2,3}", "abababab") == Matches{{0, 6}});
    CHECK(find("(?:ab){2}", "ab") == Matches{});
}

TEST_CASE("lookahead matches without consuming", "[regex]") {
    CHECK(find("a(?=b)", "abac") == Matches{{0, 1}});
    CHECK(find("a(?!b)", "abac") == Matches{{2, 3}});
    CHECK(find("(?=a)", "banana") == Matches{{1, 1}, {3, 3}, {5, 5}});
}

TEST_CASE("^ and $ are line anchors, and only \\n ends a line", "[regex]") {
    CHECK(find("^a", "a\na\n") == Matches{{0, 1}, {2, 3}});
    CHECK(find(R"(\s+$)", "a  \n b  ") == Matches{{1, 3}, {6, 8}});
    CHECK(find("x$", "x\rx\n") == Matches{{2, 3}});
    // ^ does not match at the end of the text, even after a final "\n".
    CHECK(find("\\n^", "a\n") == Matches{});
    CHECK(find("\\n^", "a\nb") == Matches{{1, 2}});
    CHECK(find(R"(\Ax)", "xx") == Matches{{0, 1}});
    CHECK(find(R"(x\z)", "x\n") == Matches{});
    CHECK(find(R"(x\Z)", "x\n") == Matches{{0, 1}});
    CHECK(find(R"(x\Z)", "x\n\n") == Matches{});
}

TEST_CASE("an empty match right after the previous match is skipped", "[regex]") {
    CHECK(find("x*", "axxb") == Matches{{0, 0}, {1, 3}, {4, 4}});
    CHECK(find("", "ab") == Matches{{0, 0}, {1, 1}, {2, 2}});
    CHECK(find("a|", "bab") == Matches{{0, 0}, {1, 2}, {3, 3}});
}

TEST_CASE("classes, properties and escapes", "[regex]") {
    CHECK(find(R"(\p{L}+)", "h\xC3\xA9llo w\xC3\xB6rld") == Matches{{0, 6}, {7, 13}});
    CHECK(find(R"([^\s\p{L}\p{N}]+)", "ab, c!?") == Matches{{2, 3}, {5, 7}});
    CHECK(find(".+", "a\rb\nc") == Matches{{0, 3}, {4, 5}});
    CHECK(find(R"([a-c\-])", "d-b") == Matches{{1, 2}, {2, 3}});
    CHECK(find(R"(\u00e9|\x{4E2D}|\x41)", "A\xC3\xA9\xE4\xB8\xAD") ==
          Matches{{0, 1}, {1, 3}, {3, 6}});
    CHECK(find(R"(\p{^L}|\P{N})", "a1") == Matches{{0, 1}, {1, 2}});
    CHECK(find(R"(\p{ Uppercase-Letter })", "aB") == Matches{{1, 2}});
    CHECK(find(R"(\d+)", "12\xD9\xA1\xC2\xB2") == Matches{{0, 4}});  // Arabic 1 is Nd, ² is No
}

TEST_CASE("(?i:...) matches ASCII letters in either case, and their Unicode folds", "[regex]") {
    // U+017F LATIN SMALL LETTER LONG S folds to s, U+212A KELVIN SIGN to k.
    CHECK(find("(?i:'s)", "'S '\xC5\xBF 's") == Matches{{0, 2}, {3, 6}, {7, 9}});
    CHECK(find("(?i:k)", "kK\xE2\x84\xAA") == Matches{{0, 1}, {1, 2}, {2, 5}});
    CHECK(find("(?i:'ll)", "'lL 'LL") == Matches{{0, 3}, {4, 7}});
}

TEST_CASE("constructs outside the subset are refused, naming them and the pattern", "[regex]") {
    const std::pair<const char*, const char*> cases[] = {
        {R"((a)\1)", "backreference '\\1'"},
        {"(?<=a)b", "lookbehind '(?<='"},
        {"(?<!a)b", "lookbehind '(?<!'"},
        {"(?<name>a)", "named group"},
        {"(?>a)", "atomic group"},
        {"(?i)a", "option group '(?i)'"},
        {"(?m:a)", "option group '(?m:'"},
        {"a*?", "lazy quantifier '*?'"},
        {"a++", "possessive quantifier '++'"},
        {"a{2}{3}", "quantifier '{3}' after the quantifier '{2}'"},
        {"*a", "quantifier '*' with nothing to repeat"},
        {"(?:a?)*", "quantifier on '(?:a?)', which can match the empty string"},
        {"^*", "quantifier '*' on an assertion"},
        {R"(\p{Nonsense})", "property '\\p{Nonsense}'"},
        {R"(\p{Han})", "property '\\p{Han}' (only general categories"},
        {R"(\w)", "word characters '\\w'"},
        {R"(\b)", "word boundary '\\b'"},
        {R"(\y)", "escape '\\y'"},
        {"\\\xC3\xA9", "escape '\\\xC3\xA9' (at offset 0)"},  // the whole character
        {R"(\xE9)", "'\\xE9' (a byte"},
        {R"(\uD800)", "not a character"},
        {"[a[b]]", "nested class"},
        {"[a&&b]", "class intersection '&&'"},
        {"[]a]", "']' at the start of a class"},
        {"[z-a]", "range 'z-a' out of order"},
        {R"([\s-z])", "range '\\s-z' with a set at one end"},
        {"[a-c-e]", "'-' that neither forms a range"},
        {"[ab", "'[' without a matching ']'"},
        {"(a", "'(' without a matching ')'"},
        {"a)", "')' without a matching '('"},
        {"a\\", "'\\' at the end of the pattern"},
        {"a{", "'{' that is not a quantifier"},
        {"a{1,x}", "'{' that is not a quantifier"},
        {"a{3,2}", "with n > m"},
        {"a{100001}", "repeat count above 100000"},
        {"(?i:ss)", "case-insensitive 'ss'"},
        {"(?i:fi|x)", "case-insensitive 'fi'"},
        {"(?i:\xC3\xA9)", "non-ASCII character"},
        {"(?i:[a])", "'[' inside (?i:...)"},
        {"(?i:a+)", "quantifier '+' inside (?i:...)"},
        {"(?:ab){60000}", "too large"},
        {"\xFF", "not valid UTF-8"},
    };
    for (const auto& [pattern, construct] : cases) {
        INFO(pattern);
        const std::string message = refusal(pattern);
        CHECK_THAT(message, Catch::Contains(construct) && Catch::Contains("is not supported"));
    }
    CHECK_THAT(refusal(std::string(65, '(') + std::string(65, ')')),
               Catch::Contains("nested deeper than 64"));
    // The message stays on one line, whatever the pattern holds.
    CHECK(refusal("[\r\n").find_first_of("\r\n") == std::string::npos);
    CHECK_THAT(refusal("[\r\n"), Catch::Contains("'[\\r\\n'"));
}

TEST_CASE("the patterns of Llama-family tokenizers compile", "[regex]") {
    const char* patterns[] = {
        R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+)"
        R"([\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
        R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
        R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+)"
        R"(| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
        "[\xE4\xB8\x80-\xE9\xBE\xA5\xE0\xA0\x80-\xE4\xB8\x80\xEA\xB0\x80-\xED\x9F\xBF]+",
        R"(\s+$)",
    };
    for (const char* pattern : patterns) {
        INFO(pattern);
        CHECK_NOTHROW(Regex(pattern));
    }
}

TEST_CASE("too much backtracking fails the search with an Error", "[regex]") {
    // At the first a, a* takes them all, then gives them back one at a time.
    const Regex regex("a*b", 1000);
    CHECK_THROWS_WITH(regex.find_all(std::string(2000, 'a')), Catch::Contains("backtracking"));
    CHECK(regex.find_all("aab") == Matches{{0, 3}});
}

TEST_CASE("the work of a search grows linearly with the text", "[regex]") {
    // Patterns that, tried at one start after another, would scan the rest of a long run
    // each time (or, for (a|aa)*c, take exponentially many ways through it).
    struct Case {
        const char* pattern;
        std::string unit;  // the text is a run of it
        bool matches;      // each unit of the run is a match (else there is none)
    };
    const Case cases[] = {
        {"a*b", "a", false},
        {"(a|aa)*c", "a", false},
        {"(?:a|a)+b", "a", false},
        {R"(\p{L}+x|\p{L})", "\xC3\xA9", true},
        {R"([a-z]*[a-z]*q|\S)", "a", true},
        {R"(\s*[\r\n]+|\s)", " ", true},
    };
    for (const Case& c : cases) {
        INFO(c.pattern);
        const Regex regex(c.pattern);
        const auto steps_over = [&](size_t units) {
            std::string text;
            for (size_t i = 0; i < units; ++i) text += c.unit;
            size_t steps = 0;
            const Matches matches = regex.find_all(text, steps);
            CHECK(matches.size() == (c.matches ? units : 0));
            if (c.matches && !matches.empty())
                CHECK(matches.back() == Regex::Match{text.size() - c.unit.size(), text.size()});
            return steps;
        };
        constexpr size_t kUnits = 20000;
        const size_t steps = steps_over(kUnits), steps_twice = steps_over(2 * kUnits);
        CHECK(steps_twice <= 2.2 * steps);
    }
    // Matches that span a long run are found whole.
    const std::string run(20000, 'a');
    CHECK(find("a*b", run + "b") == Matches{{0, run.size() + 1}});
    CHECK(find("(a|aa)*c", run + "c") == Matches{{0, run.size() + 1}});
    CHECK(find("(?:a|a)+b", run + "b") == Matches{{0, run.size() + 1}});
}
