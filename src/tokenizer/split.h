// Splitting a piece of text on a pattern: where the pattern matches (SplitPattern) and what
// becomes of the matches (SplitBehavior). Used by the Split, Digits and Metaspace
// pre-tokenizers.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/regex.h"

namespace barellm::tok {

// A part of a piece: either a match of the split pattern or a gap between matches.
struct Span {
    size_t begin;
    size_t end;
    bool is_match;
};

class SplitPattern {
public:
    virtual ~SplitPattern() = default;
    // The matches and gaps covering `text`, in order.
    virtual void find(std::string_view text, std::vector<Span>& spans) const = 0;
};

// A literal string. Hugging Face escapes it into a regex, so matches are leftmost and
// non-overlapping. An empty pattern matches nothing.
class LiteralPattern : public SplitPattern {
public:
    explicit LiteralPattern(std::string literal) : literal_(std::move(literal)) {}
    void find(std::string_view text, std::vector<Span>& spans) const override;

private:
    std::string literal_;
};

// Each numeric character (Rust's char::is_numeric: categories Nd, Nl, No) is a match.
class NumericCharPattern : public SplitPattern {
public:
    void find(std::string_view text, std::vector<Span>& spans) const override;
};

// The matches of a regular expression, and the gaps between them.
class RegexPattern : public SplitPattern {
public:
    explicit RegexPattern(Regex regex) : regex_(std::move(regex)) {}
    void find(std::string_view text, std::vector<Span>& spans) const override;

private:
    Regex regex_;
};

// SplitDelimiterBehavior: what becomes of the matches ("delimiters") when splitting.
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// The pieces [begin, end) that Hugging Face's NormalizedString::split keeps, empty ones
// included (the caller drops them, as PreTokenizedString::split does).
std::vector<std::pair<size_t, size_t>> apply_split_behavior(const std::vector<Span>& spans,
                                                            SplitBehavior behavior);

}  // namespace barellm::tok
