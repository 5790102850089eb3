// The regular expressions of Hugging Face pre-tokenizers: the Regex patterns of Split, and
// the pattern ByteLevel splits with. Hugging Face compiles them with Oniguruma (Ruby
// syntax, default options); this is a small backtracking matcher for the part of that
// syntax that tokenizer.json files use, matching each pattern it accepts exactly as
// Oniguruma does. It remembers what failed, so that its work grows linearly with the text
// (FailureMemo in regex.cpp). Any other construct is refused when the pattern is compiled,
// with an Error that names it: a pattern is matched like Hugging Face does or not at all. The
// converter has barellm load each file it writes (convert/barellm_check.py), so it refuses
// the same patterns with the same message.
//
// Supported:
//   literal characters; \t \n \r \f \v \a \e; \uHHHH, \x{H...} and \xHH (ASCII only); and a
//     backslash before ASCII punctuation or a space, for that character
//   .  (any character but \n), \s \S (White_Space), \d \D (general category Nd)
//   \p{...} \P{...} \p{^...}: general categories by short (Lu, L, LC) or long name
//     (Uppercase_Letter, Letter, Cased_Letter), in any case, spaces, '-' and '_' ignored
//   classes [...] [^...] of characters, ranges (a-z) and the escapes above
//   alternation |, groups (...) (?:...), and (?i:...) holding alternatives of ASCII text
//   greedy quantifiers ? * + {n} {n,} {n,m} {,m}
//   anchors ^ $ (of lines, as Oniguruma has them), \A \z \Z; lookahead (?=...) (?!...)
// Refused, among others: lookbehind, backreferences, atomic and named groups, lazy and
// possessive quantifiers, \w \b \h, scripts and other properties (\p{Han}), nested classes
// and class operators, inline options such as (?i), and quantifiers on what can match the
// empty string.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace barellm {

class Regex {
public:
    // Oniguruma's default limit on backtracking while matching at one position; past it,
    // Oniguruma fails the search, and so does find_all, with an Error.
    static constexpr size_t kDefaultBacktrackLimit = 10'000'000;

    // Compiles `pattern`; throws Error naming the first construct that is not supported.
    explicit Regex(std::string_view pattern, size_t backtrack_limit = kDefaultBacktrackLimit);
    ~Regex();
    Regex(Regex&&) noexcept;
    Regex& operator=(Regex&&) noexcept;

    struct Match {
        size_t begin;
        size_t end;
        bool operator==(const Match& other) const {
            return begin == other.begin && end == other.end;
        }
    };

    // The successive matches in `text` (valid UTF-8), in byte offsets, as Hugging Face's
    // Split finds them with the onig crate's find_iter: each search starts where the last
    // match ended and finds the leftmost match; an empty match right where the last match
    // ended is skipped (the search then starts one character later).
    std::vector<Match> find_all(std::string_view text) const;
    // The same, adding to `steps` the work it took (start positions tried, backtracking
    // steps, characters taken by repeats): tests check that it grows linearly with the text.
    std::vector<Match> find_all(std::string_view text, size_t& steps) const;

    const std::string& pattern() const { return pattern_; }

    struct Program;  // defined in regex.cpp

private:
    std::string pattern_;
    std::unique_ptr<const Program> program_;
    size_t backtrack_limit_;
};

}  // namespace barellm
