// Splitting a piece of text on a pattern (declared in split.h).
#include "tokenizer/split.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace barellm::tok {

namespace {

void add_gap(std::vector<Span>& spans, size_t begin, size_t end) {
    if (begin < end) spans.push_back({begin, end, false});
}

}  // namespace

void LiteralPattern::find(std::string_view text, std::vector<Span>& spans) const {
    size_t pos = 0;
    if (!literal_.empty()) {
        for (size_t found; (found = text.find(literal_, pos)) != std::string_view::npos;
             pos = found + literal_.size()) {
            add_gap(spans, pos, found);
            spans.push_back({found, found + literal_.size(), true});
        }
    }
    add_gap(spans, pos, text.size());
}

void NumericCharPattern::find(std::string_view text, std::vector<Span>& spans) const {
    size_t gap_begin = 0;
    for (size_t pos = 0; pos < text.size();) {
        const size_t length = unicode::utf8_length(text[pos]);
        if (unicode::is_number(unicode::general_category(unicode::decode_utf8(text, pos)))) {
            add_gap(spans, gap_begin, pos);
            spans.push_back({pos, pos + length, true});
            gap_begin = pos + length;
        }
        pos += length;
    }
    add_gap(spans, gap_begin, text.size());
}

void RegexPattern::find(std::string_view text, std::vector<Span>& spans) const {
    size_t gap_begin = 0;
    for (const Regex::Match& match : regex_.find_all(text)) {
        add_gap(spans, gap_begin, match.begin);
        spans.push_back({match.begin, match.end, true});
        gap_begin = match.end;
    }
    add_gap(spans, gap_begin, text.size());
}

std::vector<std::pair<size_t, size_t>> apply_split_behavior(const std::vector<Span>& spans,
                                                            SplitBehavior behavior) {
    std::vector<std::pair<size_t, size_t>> pieces;
    switch (behavior) {
        case SplitBehavior::Removed:
            for (const Span& s : spans)
                if (!s.is_match) pieces.emplace_back(s.begin, s.end);
            break;
        case SplitBehavior::Isolated:
            for (const Span& s : spans) pieces.emplace_back(s.begin, s.end);
            break;
        case SplitBehavior::Contiguous: {
            // Consecutive matches fuse into one piece.
            bool previous_match = false;
            for (const Span& s : spans) {
                if (s.is_match == previous_match && !pieces.empty())
                    pieces.back().second = s.end;
                else
                    pieces.emplace_back(s.begin, s.end);
                previous_match = s.is_match;
            }
            break;
        }
        case SplitBehavior::MergedWithPrevious: {
            // A match joins the gap before it (a match after a match stands alone).
            bool previous_match = false;
            for (const Span& s : spans) {
                if (s.is_match && !previous_match && !pieces.empty())
                    pieces.back().second = s.end;
                else
                    pieces.emplace_back(s.begin, s.end);
                previous_match = s.is_match;
            }
            break;
        }
        case SplitBehavior::MergedWithNext: {
            // Mirror image: a match joins the gap after it (walking backwards).
            bool next_match = false;
            for (auto s = spans.rbegin(); s != spans.rend(); ++s) {
                if (s->is_match && !next_match && !pieces.empty())
                    pieces.back().first = s->begin;
                else
                    pieces.emplace_back(s->begin, s->end);
                next_match = s->is_match;
            }
            std::reverse(pieces.begin(), pieces.end());
            break;
        }
    }
    return pieces;
}

}  // namespace barellm::tok
