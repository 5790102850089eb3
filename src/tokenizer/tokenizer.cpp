// Hugging Face tokenizer.json, reimplemented. Each component reproduces the behaviour of
// the `tokenizers` library (version 0.23); comments name the rule being reproduced where
// it is not obvious. Encoding runs:
//   text -> split on added tokens -> normalize each piece -> split on normalized added
//   tokens -> pre-tokenize into words -> BPE each word -> ids
// and decoding runs the decoder chain as a stream of token pieces (see DecodeStage).
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "error.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace barellm {
namespace {

using json = nlohmann::json;
using unicode::append_utf8;
using unicode::decode_utf8;
using unicode::is_valid_utf8;
using unicode::is_white_space;
using unicode::scan_utf8;
using unicode::utf8_length;
using unicode::Utf8Scan;
using unicode::Utf8Status;

// ============================================================================ UTF-8

constexpr char32_t kReplacementCharacter = 0xFFFD;

std::string utf8_of(char32_t cp) {
    std::string out;
    append_utf8(out, cp);
    return out;
}

void require_valid_utf8(std::string_view text) {
    for (size_t pos = 0; pos < text.size();) {
        const Utf8Scan scan = scan_utf8(text, pos);
        if (scan.status != Utf8Status::Complete)
            throw Error("text to tokenize is not valid UTF-8 (at byte " + std::to_string(pos) +
                        ")");
        pos += scan.length;
    }
}

// Appends `bytes` to `out` as text, each ill-formed sequence replaced by U+FFFD. A character
// cut off at the end is left out unless `at_end`, when it is ill-formed too. Returns the
// number of bytes consumed.
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

// ============================================================================ Unicode

// Last table entry whose first code point is <= cp, in a table sorted by first code point.
template <typename Entry>
const Entry* last_entry_at_or_before(const Entry* table, size_t count, char32_t cp) {
    const Entry* after = std::upper_bound(
        table, table + count, cp, [](char32_t value, const Entry& e) { return value < e.first; });
    return after == table ? nullptr : after - 1;
}

// Rust regex's `\w` (used by added tokens' single_word): Alphabetic, marks, decimal numbers,
// connector punctuation and the two join controls. Alphabetic is approximated by letters and
// letter numbers (it also holds a few symbols, such as circled letters).
bool is_word_character(char32_t cp) {
    using unicode::GeneralCategory;
    const GeneralCategory c = unicode::general_category(cp);
    return unicode::is_letter(c) || unicode::is_mark(c) || c == GeneralCategory::Nd ||
           c == GeneralCategory::Nl || c == GeneralCategory::Pc || cp == 0x200C || cp == 0x200D;
}

// ============================================================================ NFC
//
// Hugging Face's NFC (the unicode-normalization-alignments crate) knows the characters of
// Unicode 9.0 only, and so do the NFC tables: later characters pass through unchanged.

constexpr char32_t kHangulSyllableBase = 0xAC00, kHangulLeadBase = 0x1100,
                   kHangulVowelBase = 0x1161, kHangulTrailBase = 0x11A7;
constexpr char32_t kHangulLeadCount = 19, kHangulVowelCount = 21, kHangulTrailCount = 28;
constexpr char32_t kHangulSyllablesPerLead = kHangulVowelCount * kHangulTrailCount;
constexpr char32_t kHangulSyllableCount = kHangulLeadCount * kHangulSyllablesPerLead;

uint8_t combining_class(char32_t cp) {
    if (cp < 0x300) return 0;
    const auto* range = last_entry_at_or_before(unicode::kCombiningClassRanges,
                                                unicode::kCombiningClassRangeCount, cp);
    return range != nullptr && cp <= range->last ? range->combining_class : 0;
}

bool is_nfc_sensitive(char32_t cp) {
    if (cp < 0x300) return false;
    const auto* range =
        last_entry_at_or_before(unicode::kNfcSensitiveRanges, unicode::kNfcSensitiveRangeCount, cp);
    return range != nullptr && cp <= range->last;
}

void append_decomposition(char32_t cp, std::vector<char32_t>& out) {
    if (cp >= kHangulSyllableBase && cp < kHangulSyllableBase + kHangulSyllableCount) {
        const char32_t index = cp - kHangulSyllableBase;
        out.push_back(kHangulLeadBase + index / kHangulSyllablesPerLead);
        out.push_back(kHangulVowelBase + (index % kHangulSyllablesPerLead) / kHangulTrailCount);
        if (index % kHangulTrailCount != 0)
            out.push_back(kHangulTrailBase + index % kHangulTrailCount);
        return;
    }
    const auto* end = unicode::kDecompositions + unicode::kDecompositionCount;
    const auto* found = std::lower_bound(
        unicode::kDecompositions, end, cp,
        [](const unicode::Decomposition& d, char32_t value) { return d.code_point < value; });
    if (found == end || found->code_point != cp) {
        out.push_back(cp);
        return;
    }
    const char32_t* data = unicode::kDecompositionData + found->offset;
    out.insert(out.end(), data, data + found->length);
}

// Canonical ordering: each run of non-starters sorted (stably) by combining class.
void reorder_canonically(std::vector<char32_t>& cps) {
    for (size_t i = 0; i < cps.size();) {
        if (combining_class(cps[i]) == 0) {
            ++i;
            continue;
        }
        size_t end = i;
        while (end < cps.size() && combining_class(cps[end]) != 0) ++end;
        std::stable_sort(cps.begin() + i, cps.begin() + end, [](char32_t a, char32_t b) {
            return combining_class(a) < combining_class(b);
        });
        i = end;
    }
}

std::optional<char32_t> compose_pair(char32_t first, char32_t second) {
    if (first >= kHangulLeadBase && first < kHangulLeadBase + kHangulLeadCount &&
        second >= kHangulVowelBase && second < kHangulVowelBase + kHangulVowelCount) {
        return kHangulSyllableBase +
               ((first - kHangulLeadBase) * kHangulVowelCount + (second - kHangulVowelBase)) *
                   kHangulTrailCount;
    }
    if (first >= kHangulSyllableBase && first < kHangulSyllableBase + kHangulSyllableCount &&
        (first - kHangulSyllableBase) % kHangulTrailCount == 0 && second > kHangulTrailBase &&
        second < kHangulTrailBase + kHangulTrailCount) {
        return first + (second - kHangulTrailBase);
    }
    const auto* end = unicode::kCompositions + unicode::kCompositionCount;
    const auto* found = std::lower_bound(
        unicode::kCompositions, end, std::make_pair(first, second),
        [](const unicode::Composition& c, const std::pair<char32_t, char32_t>& value) {
            return std::make_pair(c.first, c.second) < value;
        });
    if (found == end || found->first != first || found->second != second) return std::nullopt;
    return found->composite;
}

// The canonical composition algorithm of UAX #15: each character joins the last starter
// unless a character between them has a class of zero or at least its own.
void compose_canonically(std::vector<char32_t>& cps) {
    std::vector<char32_t> out;
    out.reserve(cps.size());
    size_t starter = SIZE_MAX;
    uint8_t last_class = 0;
    for (char32_t cp : cps) {
        const uint8_t cls = combining_class(cp);
        if (starter != SIZE_MAX) {
            const bool adjacent = out.size() == starter + 1;
            const bool blocked = !adjacent && (last_class == 0 || last_class >= cls);
            if (!blocked) {
                if (auto composite = compose_pair(out[starter], cp)) {
                    out[starter] = *composite;
                    continue;
                }
            }
        }
        if (cls == 0) starter = out.size();
        out.push_back(cp);
        last_class = cls;
    }
    cps.swap(out);
}

std::string to_nfc(std::string_view text) {
    bool sensitive = false;
    for (size_t pos = 0; pos < text.size() && !sensitive; pos += utf8_length(text[pos]))
        sensitive = static_cast<unsigned char>(text[pos]) >= 0xCC &&
                    is_nfc_sensitive(decode_utf8(text, pos));
    if (!sensitive) return std::string(text);
    std::vector<char32_t> cps;
    for (size_t pos = 0; pos < text.size(); pos += utf8_length(text[pos]))
        append_decomposition(decode_utf8(text, pos), cps);
    reorder_canonically(cps);
    compose_canonically(cps);
    std::string out;
    for (char32_t cp : cps) append_utf8(out, cp);
    return out;
}

// ============================================================================ Splitting

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

void add_gap(std::vector<Span>& spans, size_t begin, size_t end) {
    if (begin < end) spans.push_back({begin, end, false});
}

// A literal string; Hugging Face escapes it into a regex, so matches are leftmost and
// non-overlapping. An empty pattern matches nothing.
class LiteralPattern : public SplitPattern {
public:
    explicit LiteralPattern(std::string literal) : literal_(std::move(literal)) {}
    void find(std::string_view text, std::vector<Span>& spans) const override {
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

private:
    std::string literal_;
};

// Each numeric character (Rust's char::is_numeric: categories Nd, Nl, No) is a match.
class NumericCharPattern : public SplitPattern {
public:
    void find(std::string_view text, std::vector<Span>& spans) const override {
        size_t gap_begin = 0;
        for (size_t pos = 0; pos < text.size();) {
            const size_t length = utf8_length(text[pos]);
            if (unicode::is_number(unicode::general_category(decode_utf8(text, pos)))) {
                add_gap(spans, gap_begin, pos);
                spans.push_back({pos, pos + length, true});
                gap_begin = pos + length;
            }
            pos += length;
        }
        add_gap(spans, gap_begin, text.size());
    }
};

// The matches of a regular expression, and the gaps between them.
class RegexPattern : public SplitPattern {
public:
    explicit RegexPattern(Regex regex) : regex_(std::move(regex)) {}
    void find(std::string_view text, std::vector<Span>& spans) const override {
        size_t gap_begin = 0;
        for (const Regex::Match& match : regex_.find_all(text)) {
            add_gap(spans, gap_begin, match.begin);
            spans.push_back({match.begin, match.end, true});
            gap_begin = match.end;
        }
        add_gap(spans, gap_begin, text.size());
    }

private:
    Regex regex_;
};

// The pattern of GPT-2's pre-tokenizer, which ByteLevel splits with when use_regex is set.
const Regex& gpt2_regex() {
    static const Regex regex(
        R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
    return regex;
}

// SplitDelimiterBehavior: what becomes of the matches ("delimiters") when splitting.
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// The pieces [begin, end) that Hugging Face's NormalizedString::split keeps, empty ones
// included (the caller drops them, as PreTokenizedString::split does).
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

// ============================================================================ Normalizers

class Normalizer {
public:
    virtual ~Normalizer() = default;
    virtual void apply(std::string& text) const = 0;
};

class SequenceNormalizer : public Normalizer {
public:
    explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
        : steps_(std::move(steps)) {}
    void apply(std::string& text) const override {
        for (const auto& step : steps_) step->apply(text);
    }

private:
    std::vector<std::unique_ptr<Normalizer>> steps_;
};

// Prepend: only to non-empty text.
class PrependNormalizer : public Normalizer {
public:
    explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
    void apply(std::string& text) const override {
        if (!text.empty()) text.insert(0, prefix_);
    }

private:
    std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
public:
    ReplaceNormalizer(std::string pattern, std::string content)
        : pattern_(std::move(pattern)), content_(std::move(content)) {}
    void apply(std::string& text) const override {
        if (text.find(pattern_) != std::string::npos) text = replace_all(text, pattern_, content_);
    }

private:
    std::string pattern_, content_;
};

class NfcNormalizer : public Normalizer {
public:
    void apply(std::string& text) const override { text = to_nfc(text); }
};

// ============================================================================ Pre-tokenizers

// Receives each piece a pre-tokenizer produces and whether it begins the original text.
using PieceSink = std::function<void(std::string_view piece, bool at_text_start)>;

class PreTokenizer {
public:
    virtual ~PreTokenizer() = default;
    // Splits a non-empty piece; `sink` receives only non-empty pieces.
    virtual void split(std::string_view piece, bool at_text_start, const PieceSink& sink) const = 0;
};

void split_and_emit(std::string_view piece, bool at_text_start, const SplitPattern& pattern,
                    SplitBehavior behavior, bool invert, const PieceSink& sink) {
    std::vector<Span> spans;
    pattern.find(piece, spans);
    if (invert)
        for (Span& s : spans) s.is_match = !s.is_match;
    for (const auto& [begin, end] : apply_split_behavior(spans, behavior))
        if (begin < end) sink(piece.substr(begin, end - begin), at_text_start && begin == 0);
}

class SequencePreTokenizer : public PreTokenizer {
public:
    explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
        : steps_(std::move(steps)) {}
    void split(std::string_view piece, bool at_text_start, const PieceSink& sink) const override {
        split_from(0, piece, at_text_start, sink);
    }

private:
    void split_from(size_t step, std::string_view piece, bool at_text_start,
                    const PieceSink& sink) const {
        if (step == steps_.size()) {
            sink(piece, at_text_start);
            return;
        }
        steps_[step]->split(piece, at_text_start, [&](std::string_view sub, bool sub_at_start) {
            split_from(step + 1, sub, sub_at_start, sink);
        });
    }
    std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class SplitPreTokenizer : public PreTokenizer {
public:
    SplitPreTokenizer(std::unique_ptr<SplitPattern> pattern, SplitBehavior behavior, bool invert)
        : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
    void split(std::string_view piece, bool at_text_start, const PieceSink& sink) const override {
        split_and_emit(piece, at_text_start, *pattern_, behavior_, invert_, sink);
    }

private:
    std::unique_ptr<SplitPattern> pattern_;
    SplitBehavior behavior_;
    bool invert_;
};

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other bytes
// for U+0100 upwards in byte order, so that every byte is a visible character.
std::array<char32_t, 256> byte_level_alphabet() {
    std::array<char32_t, 256> chars{};
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
        const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        chars[b] = printable ? char32_t(b) : next++;
    }
    return chars;
}

class ByteLevelPreTokenizer : public PreTokenizer {
public:
    ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
        : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {
        const auto alphabet = byte_level_alphabet();
        for (int b = 0; b < 256; ++b) byte_chars_[b] = utf8_of(alphabet[b]);
    }
    void split(std::string_view piece, bool at_text_start, const PieceSink& sink) const override {
        std::string prefixed;
        if (add_prefix_space_ && piece[0] != ' ') {
            prefixed = " " + std::string(piece);
            piece = prefixed;
        }
        if (!use_regex_) {
            emit_mapped(piece, at_text_start, sink);
            return;
        }
        // Hugging Face splits with the pattern (Isolated): into its matches and the gaps
        // between them (the GPT-2 pattern leaves none).
        const auto emit = [&](size_t begin, size_t end) {
            if (begin < end)
                emit_mapped(piece.substr(begin, end - begin), at_text_start && begin == 0, sink);
        };
        size_t gap_begin = 0;
        for (const Regex::Match& match : gpt2_regex().find_all(piece)) {
            emit(gap_begin, match.begin);
            emit(match.begin, match.end);
            gap_begin = match.end;
        }
        emit(gap_begin, piece.size());
    }

private:
    void emit_mapped(std::string_view word, bool at_text_start, const PieceSink& sink) const {
        std::string mapped;
        mapped.reserve(word.size() * 2);
        for (char byte : word) mapped += byte_chars_[static_cast<unsigned char>(byte)];
        sink(mapped, at_text_start);
    }
    bool add_prefix_space_, use_regex_;
    std::array<std::string, 256> byte_chars_;
};

enum class PrependScheme { Always, Never, First };

// Metaspace: spaces become the replacement character, which is prepended ("always", or
// "first": only to the piece that begins the original text), then each replacement starts
// a new piece (split on it with MergedWithNext).
class MetaspacePreTokenizer : public PreTokenizer {
public:
    MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
        : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
    void split(std::string_view piece, bool at_text_start, const PieceSink& sink) const override {
        std::string text = replace_all(piece, " ", replacement_);
        const bool prepend =
            scheme_ == PrependScheme::Always || (scheme_ == PrependScheme::First && at_text_start);
        if (prepend && text.compare(0, replacement_.size(), replacement_) != 0)
            text.insert(0, replacement_);
        if (split_) {
            split_and_emit(text, at_text_start, LiteralPattern(replacement_),
                           SplitBehavior::MergedWithNext, false, sink);
        } else {
            sink(text, at_text_start);
        }
    }

private:
    std::string replacement_;
    PrependScheme scheme_;
    bool split_;
};

// ============================================================================ Flat hash map

// Open-addressing map from 64-bit keys to 64-bit values, for the BPE hot loops (millions of
// pair and character lookups per megabyte of text).
class FlatMap {
public:
    void insert_or_assign(uint64_t key, uint64_t value) {
        if ((size_ + 1) * 10 > slots_.size() * 7) grow();
        Slot& slot = slots_[find_slot(key)];
        if (slot.key == kEmpty) ++size_;
        slot = {key, value};
    }
    const uint64_t* find(uint64_t key) const {
        if (slots_.empty()) return nullptr;
        const Slot& slot = slots_[find_slot(key)];
        return slot.key == key ? &slot.value : nullptr;
    }

private:
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    struct Slot {
        uint64_t key = kEmpty;
        uint64_t value = 0;
    };
    size_t find_slot(uint64_t key) const {
        const size_t mask = slots_.size() - 1;
        size_t i = size_t((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
        while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask;
        return i;
    }
    void grow() {
        std::vector<Slot> old = std::move(slots_);
        slots_.assign(old.empty() ? 64 : old.size() * 2, Slot{});
        size_ = 0;
        for (const Slot& s : old)
            if (s.key != kEmpty) insert_or_assign(s.key, s.value);
    }
    std::vector<Slot> slots_;
    size_t size_ = 0;
};

// ============================================================================ BPE model

struct BpeSymbol {
    int id;
    int prev;
    int next;
    bool removed;
};

// A merge waiting in the queue. Hugging Face's Merge order, lowest rank first and then
// leftmost, is the order of `rank << 32 | pos`.
struct PendingMerge {
    uint64_t order;
    int merged_id;

    uint32_t pos() const { return uint32_t(order); }
};

struct ComesLater {  // for std::*_heap, which keep the greatest element first
    bool operator()(const PendingMerge& a, const PendingMerge& b) const {
        return a.order > b.order;
    }
};

// Working memory of one encode() call, reused across words.
struct EncodeScratch {
    std::vector<BpeSymbol> symbols;
    std::vector<PendingMerge> queue;
    std::string key;
    // Words already tokenized in this call (like Hugging Face's BPE cache, which also only
    // keeps words shorter than 256 bytes): word -> [offset, count) in cached_ids.
    std::unordered_map<std::string, std::pair<uint32_t, uint32_t>> cache;
    std::vector<int> cached_ids;
};

class BpeModel {
public:
    std::unordered_map<std::string, int> vocab;
    bool byte_fallback = false;
    bool fuse_unk = false;
    bool ignore_merges = false;
    std::optional<std::string> unk_token;

    // Call once the vocabulary is filled.
    void index_vocab() {
        for (const auto& [text, id] : vocab) {
            if (!text.empty() && utf8_length(text[0]) == text.size())
                char_ids_.insert_or_assign(decode_utf8(text, 0), uint64_t(id));
        }
        for (int b = 0; b < 256; ++b) {
            char name[8];
            std::snprintf(name, sizeof(name), "<0x%02X>", b);
            const auto found = vocab.find(name);
            byte_ids_[b] = found == vocab.end() ? -1 : found->second;
        }
        if (unk_token) {
            const auto found = vocab.find(*unk_token);
            if (found != vocab.end()) unk_id_ = found->second;
        }
        segment_at_space_markers_ = vocab.count(std::string(kSpaceMarker)) != 0 &&
                                    std::none_of(vocab.begin(), vocab.end(), [](const auto& entry) {
                                        return has_marker_after_other(entry.first);
                                    });
    }

    void add_merge(const std::string& left, const std::string& right, uint32_t rank) {
        const int left_id = vocab_id(left, left, right);
        const int right_id = vocab_id(right, left, right);
        const int merged_id = vocab_id(left + right, left, right);
        // A pair listed twice keeps its last rank, as Hugging Face's HashMap collect does.
        merges_.insert_or_assign(pair_key(left_id, right_id),
                                 uint64_t(rank) << 32 | uint32_t(merged_id));
    }

    void encode_word(std::string_view word, std::vector<int>& ids, EncodeScratch& scratch) const {
        if (ignore_merges) {
            scratch.key.assign(word);
            if (const auto found = vocab.find(scratch.key); found != vocab.end()) {
                ids.push_back(found->second);
                return;
            }
        }
        if (!segment_at_space_markers_) {
            merge_segment(word, ids, scratch);
            return;
        }
        size_t begin = 0;
        for (size_t marker = word.find(kSpaceMarker, 1); marker != std::string_view::npos;
             marker = word.find(kSpaceMarker, marker + kSpaceMarker.size())) {
            if (!follows_marker(word, marker)) {
                merge_segment(word.substr(begin, marker - begin), ids, scratch);
                begin = marker;
            }
        }
        merge_segment(word.substr(begin), ids, scratch);
    }

private:
    // U+2581, SentencePiece's space marker. A SentencePiece vocabulary has it only at the
    // start of tokens. Then no merge can join a marker to a character before it other than
    // a marker, so a word splits there into segments that BPE independently, with exactly
    // the result of merging the whole word (only faster, and cacheable): SentencePiece-style
    // tokenizers have no pre-tokenizer, which makes a whole text one word.
    static constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";

    static bool follows_marker(std::string_view text, size_t pos) {
        return pos >= kSpaceMarker.size() &&
               text.substr(pos - kSpaceMarker.size(), kSpaceMarker.size()) == kSpaceMarker;
    }

    // Whether `text` has a space marker right after a character that is not one.
    static bool has_marker_after_other(std::string_view text) {
        for (size_t pos = text.find(kSpaceMarker, 1); pos != std::string_view::npos;
             pos = text.find(kSpaceMarker, pos + 1)) {
            if (!follows_marker(text, pos)) return true;
        }
        return false;
    }

    void merge_segment(std::string_view word, std::vector<int>& ids, EncodeScratch& scratch) const {
        constexpr size_t kMaxCachedWordBytes = 256;
        const bool cacheable = word.size() < kMaxCachedWordBytes;
        if (cacheable) {
            scratch.key.assign(word);
            if (const auto hit = scratch.cache.find(scratch.key); hit != scratch.cache.end()) {
                const auto [offset, count] = hit->second;
                ids.insert(ids.end(), scratch.cached_ids.begin() + offset,
                           scratch.cached_ids.begin() + offset + count);
                return;
            }
        }
        const size_t first = ids.size();
        initial_symbols(word, scratch.symbols);
        merge_symbols(scratch.symbols, scratch.queue);
        for (const BpeSymbol& s : scratch.symbols)
            if (!s.removed) ids.push_back(s.id);
        if (cacheable) {
            const auto offset = uint32_t(scratch.cached_ids.size());
            scratch.cached_ids.insert(scratch.cached_ids.end(), ids.begin() + first, ids.end());
            scratch.cache.emplace(std::string(word),
                                  std::make_pair(offset, uint32_t(ids.size() - first)));
        }
    }

    static uint64_t pair_key(int left, int right) {
        return uint64_t(uint32_t(left)) << 32 | uint32_t(right);
    }

    int vocab_id(const std::string& token, const std::string& left,
                 const std::string& right) const {
        const auto found = vocab.find(token);
        if (found == vocab.end())
            throw Error("tokenizer.json: merge '" + left + " " + right + "' needs '" + token +
                        "', which is not in the vocabulary");
        return found->second;
    }

    int unk_id() const {
        if (!unk_id_)
            throw Error("tokenizer.json: unk_token '" + *unk_token + "' is not in the vocabulary");
        return *unk_id_;
    }

    static void add_symbol(std::vector<BpeSymbol>& symbols, int id) {
        const int index = int(symbols.size());
        symbols.push_back({id, index - 1, index + 1, false});
    }

    // One symbol per character, as Hugging Face's BPE::merge_word: a character outside the
    // vocabulary becomes its <0xXX> byte tokens (byte_fallback) or the unknown token, with
    // consecutive unknowns fused into one (fuse_unk), or is dropped when there is neither.
    void initial_symbols(std::string_view word, std::vector<BpeSymbol>& symbols) const {
        symbols.clear();
        std::optional<int> pending_unk;
        for (size_t pos = 0; pos < word.size();) {
            const size_t length = utf8_length(word[pos]);
            if (const uint64_t* id = char_ids_.find(decode_utf8(word, pos))) {
                if (pending_unk) add_symbol(symbols, *std::exchange(pending_unk, std::nullopt));
                add_symbol(symbols, int(*id));
            } else if (byte_fallback && has_byte_tokens(word.substr(pos, length))) {
                // Hugging Face leaves a pending unknown for later here: it lands after the bytes.
                for (size_t i = 0; i < length; ++i)
                    add_symbol(symbols, byte_ids_[static_cast<unsigned char>(word[pos + i])]);
            } else if (unk_token) {
                if (pending_unk && !fuse_unk) add_symbol(symbols, *pending_unk);
                pending_unk = unk_id();
            }
            pos += length;
        }
        if (pending_unk) add_symbol(symbols, *pending_unk);
        if (!symbols.empty()) symbols.back().next = -1;
    }

    bool has_byte_tokens(std::string_view bytes) const {
        return std::all_of(bytes.begin(), bytes.end(),
                           [&](char b) { return byte_ids_[static_cast<unsigned char>(b)] >= 0; });
    }

    // `merge` is a merges_ value: rank << 32 | merged id.
    static PendingMerge pending_merge(uint64_t merge, int pos) {
        return {(merge >> 32) << 32 | uint32_t(pos), int(uint32_t(merge))};
    }

    void push_merge_if_known(std::vector<BpeSymbol>& symbols, std::vector<PendingMerge>& queue,
                             int pos) const {
        const BpeSymbol& left = symbols[pos];
        if (left.next < 0) return;
        if (const uint64_t* merge = merges_.find(pair_key(left.id, symbols[left.next].id))) {
            queue.push_back(pending_merge(*merge, pos));
            std::push_heap(queue.begin(), queue.end(), ComesLater());
        }
    }

    // Hugging Face's Word::merge_all: repeatedly apply the best-ranked (then leftmost)
    // merge; queue entries made stale by earlier merges are recognised because the pair
    // now at their position no longer produces their token.
    void merge_symbols(std::vector<BpeSymbol>& symbols, std::vector<PendingMerge>& queue) const {
        queue.clear();
        for (int pos = 0; pos + 1 < int(symbols.size()); ++pos) {
            if (const uint64_t* merge =
                    merges_.find(pair_key(symbols[pos].id, symbols[pos + 1].id)))
                queue.push_back(pending_merge(*merge, pos));
        }
        std::make_heap(queue.begin(), queue.end(), ComesLater());
        while (!queue.empty()) {
            std::pop_heap(queue.begin(), queue.end(), ComesLater());
            const PendingMerge top = queue.back();
            queue.pop_back();
            const int pos = int(top.pos());
            BpeSymbol& left = symbols[pos];
            if (left.removed || left.next < 0) continue;
            BpeSymbol& right = symbols[left.next];
            const uint64_t* current = merges_.find(pair_key(left.id, right.id));
            if (current == nullptr || int(uint32_t(*current)) != top.merged_id) continue;
            left.id = top.merged_id;
            right.removed = true;
            left.next = right.next;
            if (right.next >= 0) symbols[right.next].prev = pos;
            if (left.prev >= 0) push_merge_if_known(symbols, queue, left.prev);
            push_merge_if_known(symbols, queue, pos);
        }
    }

    FlatMap merges_;    // (left id, right id) -> rank << 32 | merged id
    FlatMap char_ids_;  // code point -> id of the single-character token
    std::array<int, 256> byte_ids_{};
    std::optional<int> unk_id_;
    bool segment_at_space_markers_ = false;
};

// ============================================================================ Added tokens

struct AddedToken {
    std::string content;
    // The token's text for decoding: the content, normalized if the token is `normalized`
    // (Hugging Face's id_to_token gives the normalized form, which decode() then uses).
    std::string text;
    int id = -1;
    bool single_word = false;
    bool lstrip = false;
    bool rstrip = false;
    bool normalized = false;
    bool special = false;
};

// Byte trie over token texts answering "which is the longest token starting here".
class TokenTrie {
public:
    void add(std::string_view text, int token_index) {
        int node = 0;
        for (char c : text) {
            const int child = child_of(node, static_cast<unsigned char>(c));
            if (child >= 0) {
                node = child;
                continue;
            }
            nodes_.push_back({});
            nodes_[node].children.emplace_back(static_cast<unsigned char>(c),
                                               int(nodes_.size() - 1));
            node = int(nodes_.size() - 1);
        }
        // Of two tokens with the same text, the first added wins (lowest pattern index).
        if (nodes_[node].token_index < 0) nodes_[node].token_index = token_index;
        first_bytes_[static_cast<unsigned char>(text[0])] = true;
    }

    bool may_start_at(unsigned char byte) const { return first_bytes_[byte]; }

    // The longest token that starts at text[pos]: (length, token index), length 0 if none.
    std::pair<size_t, int> longest_at(std::string_view text, size_t pos) const {
        std::pair<size_t, int> best{0, -1};
        int node = 0;
        for (size_t i = pos; i < text.size(); ++i) {
            node = child_of(node, static_cast<unsigned char>(text[i]));
            if (node < 0) break;
            if (nodes_[node].token_index >= 0) best = {i + 1 - pos, nodes_[node].token_index};
        }
        return best;
    }

private:
    struct Node {
        std::vector<std::pair<unsigned char, int>> children;
        int token_index = -1;
    };
    int child_of(int node, unsigned char byte) const {
        for (const auto& [b, child] : nodes_[node].children)
            if (b == byte) return child;
        return -1;
    }
    std::vector<Node> nodes_{Node{}};
    std::array<bool, 256> first_bytes_{};
};

// Start of the run of white space that ends at `end` (Rust regex \s*$).
size_t white_space_run_start(std::string_view text, size_t end) {
    size_t start = end;
    while (start > 0) {
        size_t prev = start - 1;
        while (prev > 0 && (static_cast<unsigned char>(text[prev]) & 0xC0) == 0x80) --prev;
        if (!is_white_space(decode_utf8(text, prev))) break;
        start = prev;
    }
    return start;
}

// End of the run of white space that starts at `begin` (Rust regex ^\s*).
size_t white_space_run_end(std::string_view text, size_t begin) {
    while (begin < text.size() && is_white_space(decode_utf8(text, begin)))
        begin += utf8_length(text[begin]);
    return begin;
}

bool word_character_before(std::string_view text, size_t pos) {
    if (pos == 0) return false;
    size_t prev = pos - 1;
    while (prev > 0 && (static_cast<unsigned char>(text[prev]) & 0xC0) == 0x80) --prev;
    return is_word_character(decode_utf8(text, prev));
}

bool word_character_at(std::string_view text, size_t pos) {
    return pos < text.size() && is_word_character(decode_utf8(text, pos));
}

// Receives each piece of a text split on added tokens: the piece, its offset, and the
// added token it is (nullptr for the text between tokens).
using AddedSplitSink =
    std::function<void(std::string_view piece, size_t offset, const AddedToken*)>;

class AddedVocabulary {
public:
    // Hugging Face's AddedVocabulary::add_tokens: a token keeps the id it already has in the
    // added tokens or the model vocabulary; a new one gets the next id after the model's
    // vocabulary and the added tokens so far (the id written in tokenizer.json is ignored).
    void add(AddedToken token, const BpeModel& model) {
        if (token.content.empty()) return;
        if (token.special) special_contents_.insert(token.content);
        if (const auto existing = index_by_content_.find(token.content);
            existing != index_by_content_.end()) {
            token.id = tokens_[existing->second].id;
            tokens_[existing->second] = std::move(token);
            return;
        }
        if (const auto in_vocab = model.vocab.find(token.content); in_vocab != model.vocab.end()) {
            token.id = in_vocab->second;
        } else {
            const int vocab_count = int(model.vocab.size());
            token.id = max_id_ >= vocab_count ? max_id_ + 1 : vocab_count;
        }
        max_id_ = std::max(max_id_, token.id);
        index_by_content_.emplace(token.content, tokens_.size());
        tokens_.push_back(std::move(token));
    }

    // Hugging Face's refresh_added_tokens: special tokens first, then the others; tokens
    // marked `normalized` are matched in normalized text, by their normalized form.
    void build_matchers(const Normalizer* normalizer) {
        for (AddedToken& token : tokens_) {
            token.text = token.content;
            if (token.normalized && normalizer != nullptr) normalizer->apply(token.text);
        }
        for (bool special : {true, false}) {
            for (size_t i = 0; i < tokens_.size(); ++i) {
                const AddedToken& token = tokens_[i];
                if (is_special_content(token.content) != special || token.text.empty()) continue;
                (token.normalized ? normalized_trie_ : raw_trie_).add(token.text, int(i));
            }
        }
    }

    const std::vector<AddedToken>& tokens() const { return tokens_; }
    bool is_special_content(const std::string& content) const {
        return special_contents_.count(content) != 0;
    }

    void split_raw(std::string_view text, bool parse_special, const AddedSplitSink& sink) const {
        split(text, raw_trie_, parse_special, sink);
    }
    void split_normalized(std::string_view text, bool parse_special,
                          const AddedSplitSink& sink) const {
        split(text, normalized_trie_, parse_special, sink);
    }

private:
    // Hugging Face's find_matches: leftmost-longest matches, scanning on from the end of each
    // (also of one it then discards); single_word tokens need non-word characters around
    // them, lstrip/rstrip tokens swallow the white space beside them.
    void split(std::string_view text, const TokenTrie& trie, bool parse_special,
               const AddedSplitSink& sink) const {
        size_t emitted = 0;
        for (size_t pos = 0; pos < text.size();) {
            if (!trie.may_start_at(static_cast<unsigned char>(text[pos]))) {
                ++pos;
                continue;
            }
            const auto [length, index] = trie.longest_at(text, pos);
            if (length == 0) {
                ++pos;
                continue;
            }
            const AddedToken& token = tokens_[index];
            size_t start = pos, stop = pos + length;
            pos = stop;
            if (token.special && !parse_special) continue;
            if (token.single_word &&
                (word_character_before(text, start) || word_character_at(text, stop)))
                continue;
            if (token.lstrip) start = std::max(white_space_run_start(text, start), emitted);
            if (token.rstrip) pos = stop = white_space_run_end(text, stop);
            if (emitted < start) sink(text.substr(emitted, start - emitted), emitted, nullptr);
            sink(text.substr(start, stop - start), start, &token);
            emitted = stop;
        }
        if (emitted < text.size()) sink(text.substr(emitted), emitted, nullptr);
    }

    std::vector<AddedToken> tokens_;
    std::unordered_map<std::string, size_t> index_by_content_;
    std::unordered_set<std::string> special_contents_;
    int max_id_ = -1;
    TokenTrie raw_trie_, normalized_trie_;
};

// ============================================================================ Decoders
//
// Hugging Face decoders map the list of token strings to a new list (decode_chain), and the
// result is concatenated. Here the list flows through the chain as a stream of pieces, so
// that text can come out as soon as it is final: a piece is a token or part of one, and
// carries whether it starts and whether it ends its token. Stages that rewrite a token
// character by character work on pieces; stages that need a whole token collect its pieces
// first. decode() feeds whole tokens and gets exactly Hugging Face's result; the stream
// decoder feeds the same stages one token at a time.

struct DecodePiece {
    std::string text;
    bool starts_token;
    bool ends_token;
};
using DecodePieces = std::vector<DecodePiece>;

class DecodeStage {
public:
    virtual ~DecodeStage() = default;
    virtual void push(DecodePiece piece, DecodePieces& out) = 0;
    virtual void finish(DecodePieces&) {}  // after the last token
};

// Collects the pieces of a token for stages that look at whole tokens.
class TokenAssembler {
public:
    std::optional<std::string> add(DecodePiece& piece) {
        if (piece.starts_token) buffer_.clear();
        buffer_ += piece.text;
        if (!piece.ends_token) return std::nullopt;
        return std::exchange(buffer_, {});
    }

private:
    std::string buffer_;
};

// Replace: every occurrence of the pattern in each token. A piece's end that may be the
// beginning of an occurrence waits for the rest of its token.
class ReplaceStage : public DecodeStage {
public:
    ReplaceStage(std::string pattern, std::string content)
        : pattern_(std::move(pattern)), content_(std::move(content)) {}
    void push(DecodePiece piece, DecodePieces& out) override {
        std::string text = std::exchange(held_, {}) + piece.text;
        if (!piece.ends_token) {
            const size_t keep = final_prefix_length(text);
            held_ = text.substr(keep);
            text.resize(keep);
        }
        out.push_back(
            {replace_all(text, pattern_, content_), piece.starts_token, piece.ends_token});
    }

private:
    // Length of the prefix of `text` whose replacement no continuation can change: up to
    // where a proper prefix of the pattern runs to the end, after the last occurrence.
    size_t final_prefix_length(const std::string& text) const {
        if (pattern_.empty()) return text.size();
        size_t pos = 0;
        for (size_t found; (found = text.find(pattern_, pos)) != std::string::npos;)
            pos = found + pattern_.size();
        for (; pos < text.size(); ++pos) {
            const size_t rest = text.size() - pos;
            if (rest < pattern_.size() && pattern_.compare(0, rest, text, pos, rest) == 0) break;
        }
        return pos;
    }
    std::string pattern_, content_, held_;
};

// "<0xAB>" (Hugging Face checks length 6, the "<0x" and ">" around, and parses the middle
// with u8::from_str_radix, which also takes a leading '+': "<0x+A>" is byte 0x0A).
std::optional<unsigned char> parse_byte_token(const std::string& token) {
    if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>')
        return std::nullopt;
    const auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    };
    const int high = token[3] == '+' ? 0 : hex(token[3]), low = hex(token[4]);
    if (high < 0 || low < 0) return std::nullopt;
    return static_cast<unsigned char>(high * 16 + low);
}

// ByteFallback: a run of consecutive <0xXX> tokens becomes its bytes as one token if they
// form valid UTF-8, and otherwise one U+FFFD token per byte of the run. `eager` (streaming)
// lets complete characters out before the run ends and turns the bytes from the first
// invalid one on into U+FFFD at once.
class ByteFallbackStage : public DecodeStage {
public:
    explicit ByteFallbackStage(bool eager) : eager_(eager) {}
    void push(DecodePiece piece, DecodePieces& out) override {
        std::optional<std::string> token = assembler_.add(piece);
        if (!token) return;
        if (const auto byte = parse_byte_token(*token)) {
            pending_ += char(*byte);
            if (eager_) emit_final_part(out);
            return;
        }
        end_run(out);
        out.push_back({std::move(*token), true, true});
    }
    void finish(DecodePieces& out) override { end_run(out); }

private:
    void emit_final_part(DecodePieces& out) {
        size_t complete = 0;
        while (!broken_ && complete < pending_.size()) {
            const Utf8Scan scan = scan_utf8(pending_, complete);
            if (scan.status == Utf8Status::Truncated) break;
            if (scan.status == Utf8Status::Invalid)
                broken_ = true;
            else
                complete += scan.length;
        }
        if (broken_) {
            emit_replacements(out);
        } else if (complete > 0) {
            out.push_back({pending_.substr(0, complete), !open_, false});
            open_ = true;
            pending_.erase(0, complete);
        }
    }
    void end_run(DecodePieces& out) {
        if (!pending_.empty() && !broken_ && is_valid_utf8(pending_)) {
            out.push_back({std::exchange(pending_, {}), !open_, true});
            open_ = false;
        }
        emit_replacements(out);
        close_open_token(out);
        broken_ = false;
    }
    void emit_replacements(DecodePieces& out) {
        if (pending_.empty()) return;
        close_open_token(out);
        for (size_t i = 0; i < pending_.size(); ++i)
            out.push_back({utf8_of(kReplacementCharacter), true, true});
        pending_.clear();
    }
    void close_open_token(DecodePieces& out) {
        if (open_) out.push_back({"", false, true});
        open_ = false;
    }
    bool eager_;
    TokenAssembler assembler_;
    std::string pending_;  // bytes of the current run not yet let out
    bool open_ = false;    // part of the run went out as a token that has not ended yet
    bool broken_ = false;  // the run holds an invalid byte
};

// Fuse: all tokens become one.
class FuseStage : public DecodeStage {
public:
    void push(DecodePiece piece, DecodePieces& out) override {
        out.push_back({std::move(piece.text), !started_, false});
        started_ = true;
    }
    void finish(DecodePieces& out) override { out.push_back({"", !started_, true}); }

private:
    bool started_ = false;
};

// Strip: up to `start` leading and `stop` trailing `content` characters off each token.
// Trailing candidates wait until the token goes on or ends.
class StripStage : public DecodeStage {
public:
    StripStage(char32_t content, size_t start, size_t stop)
        : content_(content), content_utf8_(utf8_of(content)), start_(start), stop_(stop) {}
    void push(DecodePiece piece, DecodePieces& out) override {
        if (piece.starts_token) {
            leading_stripped_ = 0;
            leading_done_ = false;
            held_ = 0;
        }
        std::string text;
        for (size_t pos = 0; pos < piece.text.size();) {
            const size_t length = utf8_length(piece.text[pos]);
            const bool is_content = decode_utf8(piece.text, pos) == content_;
            if (!leading_done_ && is_content && leading_stripped_ < start_) {
                ++leading_stripped_;
            } else {
                leading_done_ = true;
                if (is_content && stop_ > 0) {
                    if (++held_ > stop_) {
                        text += content_utf8_;
                        --held_;
                    }
                } else {
                    for (; held_ > 0; --held_) text += content_utf8_;
                    text.append(piece.text, pos, length);
                }
            }
            pos += length;
        }
        if (piece.ends_token) held_ = 0;
        out.push_back({std::move(text), piece.starts_token, piece.ends_token});
    }

private:
    char32_t content_;
    std::string content_utf8_;
    size_t start_, stop_;
    size_t leading_stripped_ = 0;
    bool leading_done_ = false;
    size_t held_ = 0;  // trailing content characters not let out yet
};

// ByteLevel: each token's characters map back to bytes through GPT-2's alphabet (a token
// with a character outside it contributes its own UTF-8 bytes), and all bytes together are
// read as UTF-8 with invalid sequences replaced, into one token.
class ByteLevelStage : public DecodeStage {
public:
    ByteLevelStage() {
        const auto alphabet = byte_level_alphabet();
        for (int b = 0; b < 256; ++b) byte_of_char_.emplace(alphabet[b], char(b));
    }
    void push(DecodePiece piece, DecodePieces& out) override {
        std::optional<std::string> token = assembler_.add(piece);
        if (!token) return;
        append_bytes(*token);
        std::string text;
        pending_.erase(0, append_lossy_utf8(pending_, text, false));
        if (text.empty()) return;
        out.push_back({std::move(text), !started_, false});
        started_ = true;
    }
    void finish(DecodePieces& out) override {
        std::string text;
        append_lossy_utf8(pending_, text, true);
        out.push_back({std::move(text), !started_, true});
    }

private:
    void append_bytes(const std::string& token) {
        std::string bytes;
        for (size_t pos = 0; pos < token.size(); pos += utf8_length(token[pos])) {
            const auto found = byte_of_char_.find(decode_utf8(token, pos));
            if (found == byte_of_char_.end()) {
                pending_ += token;
                return;
            }
            bytes += found->second;
        }
        pending_ += bytes;
    }
    std::unordered_map<char32_t, char> byte_of_char_;
    TokenAssembler assembler_;
    std::string pending_;  // bytes of a character not complete yet
    bool started_ = false;
};

// Metaspace: the replacement character becomes a space, except in the first token, where
// Hugging Face drops every replacement character unless the prepend scheme is "never".
class MetaspaceStage : public DecodeStage {
public:
    MetaspaceStage(char32_t replacement, PrependScheme scheme)
        : replacement_(replacement), scheme_(scheme) {}
    void push(DecodePiece piece, DecodePieces& out) override {
        if (piece.starts_token) ++tokens_started_;
        const bool drop = tokens_started_ == 1 && scheme_ != PrependScheme::Never;
        std::string text;
        for (size_t pos = 0; pos < piece.text.size();) {
            const size_t length = utf8_length(piece.text[pos]);
            if (decode_utf8(piece.text, pos) != replacement_)
                text.append(piece.text, pos, length);
            else if (!drop)
                text += ' ';
            pos += length;
        }
        out.push_back({std::move(text), piece.starts_token, piece.ends_token});
    }

private:
    char32_t replacement_;
    PrependScheme scheme_;
    size_t tokens_started_ = 0;
};

// Without a decoder Hugging Face joins the tokens with spaces.
class JoinWithSpacesStage : public DecodeStage {
public:
    void push(DecodePiece piece, DecodePieces& out) override {
        if (piece.starts_token && tokens_started_++ > 0) piece.text.insert(0, " ");
        out.push_back(std::move(piece));
    }

private:
    size_t tokens_started_ = 0;
};

using StageFactory = std::function<std::unique_ptr<DecodeStage>(bool eager)>;

// ============================================================= Loading tokenizer.json

std::string describe(const std::string& what) { return "tokenizer.json: " + what; }

const json& member(const json& node, const char* key, const std::string& where) {
    if (!node.is_object() || !node.contains(key))
        throw Error(describe(where + " has no '" + key + "'"));
    return node.at(key);
}

std::string string_member(const json& node, const char* key, const std::string& where) {
    const json& value = member(node, key, where);
    if (!value.is_string()) throw Error(describe(where + " '" + key + "' is not a string"));
    return value.get<std::string>();
}

bool bool_member(const json& node, const char* key, bool fallback) {
    if (!node.contains(key) || node.at(key).is_null()) return fallback;
    if (!node.at(key).is_boolean())
        throw Error(describe(std::string("'") + key + "' is not true or false"));
    return node.at(key).get<bool>();
}

std::string type_of(const json& node, const std::string& where) {
    return string_member(node, "type", where);
}

char32_t single_character(const std::string& text, const std::string& where) {
    if (text.empty() || !is_valid_utf8(text) || utf8_length(text[0]) != text.size())
        throw Error(describe(where + " '" + text + "' is not a single character"));
    return decode_utf8(text, 0);
}

// A {"String": ...} pattern's text; {"Regex": ...} is refused.
std::string literal_pattern(const json& node, const std::string& where) {
    const json& pattern = member(node, "pattern", where);
    if (pattern.is_object() && pattern.contains("String"))
        return string_member(pattern, "String", where);
    if (pattern.is_object() && pattern.contains("Regex"))
        throw Error(describe(where + " with Regex pattern '" +
                             string_member(pattern, "Regex", where) + "' is not supported"));
    throw Error(describe(where + " has a pattern that is neither String nor Regex"));
}

std::unique_ptr<Normalizer> parse_normalizer(const json& node) {
    if (node.is_null()) return nullptr;
    const std::string type = type_of(node, "normalizer");
    if (type == "Sequence") {
        std::vector<std::unique_ptr<Normalizer>> steps;
        for (const json& child : member(node, "normalizers", "normalizer Sequence"))
            if (auto step = parse_normalizer(child)) steps.push_back(std::move(step));
        return std::make_unique<SequenceNormalizer>(std::move(steps));
    }
    if (type == "Prepend")
        return std::make_unique<PrependNormalizer>(
            string_member(node, "prepend", "normalizer Prepend"));
    if (type == "Replace")
        return std::make_unique<ReplaceNormalizer>(
            literal_pattern(node, "normalizer Replace"),
            string_member(node, "content", "normalizer Replace"));
    if (type == "NFC") return std::make_unique<NfcNormalizer>();
    throw Error(describe("normalizer type '" + type + "' is not supported"));
}

SplitBehavior parse_split_behavior(const std::string& name) {
    if (name == "Removed") return SplitBehavior::Removed;
    if (name == "Isolated") return SplitBehavior::Isolated;
    if (name == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
    if (name == "MergedWithNext") return SplitBehavior::MergedWithNext;
    if (name == "Contiguous") return SplitBehavior::Contiguous;
    throw Error(describe("Split behavior '" + name + "' is not supported"));
}

std::unique_ptr<SplitPattern> parse_split_pattern(const json& node) {
    const json& pattern = member(node, "pattern", "pre_tokenizer Split");
    if (pattern.is_object() && pattern.contains("Regex")) {
        const std::string regex = string_member(pattern, "Regex", "pre_tokenizer Split");
        try {
            return std::make_unique<RegexPattern>(Regex(regex));
        } catch (const Error& e) {  // "regex '...' is not supported: <the construct>"
            throw Error(describe(std::string("pre_tokenizer Split ") + e.what()));
        }
    }
    return std::make_unique<LiteralPattern>(literal_pattern(node, "pre_tokenizer Split"));
}

// prepend_scheme, or the older add_prefix_space (true meaning "always").
PrependScheme parse_prepend_scheme(const json& node, const std::string& where) {
    if (!node.contains("prepend_scheme"))
        return bool_member(node, "add_prefix_space", true) ? PrependScheme::Always
                                                           : PrependScheme::Never;
    const std::string scheme = string_member(node, "prepend_scheme", where);
    if (scheme == "always") return PrependScheme::Always;
    if (scheme == "never") return PrependScheme::Never;
    if (scheme == "first") return PrependScheme::First;
    throw Error(describe(where + " prepend_scheme '" + scheme + "' is not supported"));
}

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const json& node) {
    if (node.is_null()) return nullptr;
    const std::string type = type_of(node, "pre_tokenizer");
    if (type == "Sequence") {
        std::vector<std::unique_ptr<PreTokenizer>> steps;
        for (const json& child : member(node, "pretokenizers", "pre_tokenizer Sequence"))
            if (auto step = parse_pre_tokenizer(child)) steps.push_back(std::move(step));
        return std::make_unique<SequencePreTokenizer>(std::move(steps));
    }
    if (type == "ByteLevel")
        return std::make_unique<ByteLevelPreTokenizer>(bool_member(node, "add_prefix_space", true),
                                                       bool_member(node, "use_regex", true));
    if (type == "Digits") {
        // Digits splits on each numeric character: Isolated, or Contiguous to keep runs.
        const bool individual = bool_member(node, "individual_digits", false);
        return std::make_unique<SplitPreTokenizer>(
            std::make_unique<NumericCharPattern>(),
            individual ? SplitBehavior::Isolated : SplitBehavior::Contiguous, false);
    }
    if (type == "Split")
        return std::make_unique<SplitPreTokenizer>(
            parse_split_pattern(node),
            parse_split_behavior(string_member(node, "behavior", "pre_tokenizer Split")),
            bool_member(node, "invert", false));
    if (type == "Metaspace") {
        const std::string replacement =
            string_member(node, "replacement", "pre_tokenizer Metaspace");
        single_character(replacement, "pre_tokenizer Metaspace replacement");
        return std::make_unique<MetaspacePreTokenizer>(
            replacement, parse_prepend_scheme(node, "pre_tokenizer Metaspace"),
            bool_member(node, "split", true));
    }
    throw Error(describe("pre_tokenizer type '" + type + "' is not supported"));
}

size_t count_member(const json& node, const char* key, const std::string& where) {
    const json& value = member(node, key, where);
    if (!value.is_number_unsigned()) throw Error(describe(where + " '" + key + "' is not a count"));
    return value.get<size_t>();
}

void parse_decoder(const json& node, std::vector<StageFactory>& stages) {
    const std::string type = type_of(node, "decoder");
    if (type == "Sequence") {
        for (const json& child : member(node, "decoders", "decoder Sequence"))
            if (!child.is_null()) parse_decoder(child, stages);
    } else if (type == "Replace") {
        std::string pattern = literal_pattern(node, "decoder Replace");
        std::string content = string_member(node, "content", "decoder Replace");
        stages.push_back(
            [pattern, content](bool) { return std::make_unique<ReplaceStage>(pattern, content); });
    } else if (type == "ByteFallback") {
        stages.push_back([](bool eager) { return std::make_unique<ByteFallbackStage>(eager); });
    } else if (type == "Fuse") {
        stages.push_back([](bool) { return std::make_unique<FuseStage>(); });
    } else if (type == "Strip") {
        const char32_t content = single_character(string_member(node, "content", "decoder Strip"),
                                                  "decoder Strip content");
        const size_t start = count_member(node, "start", "decoder Strip");
        const size_t stop = count_member(node, "stop", "decoder Strip");
        stages.push_back([=](bool) { return std::make_unique<StripStage>(content, start, stop); });
    } else if (type == "ByteLevel") {
        stages.push_back([](bool) { return std::make_unique<ByteLevelStage>(); });
    } else if (type == "Metaspace") {
        const char32_t replacement =
            single_character(string_member(node, "replacement", "decoder Metaspace"),
                             "decoder Metaspace replacement");
        const PrependScheme scheme = parse_prepend_scheme(node, "decoder Metaspace");
        stages.push_back(
            [=](bool) { return std::make_unique<MetaspaceStage>(replacement, scheme); });
    } else {
        throw Error(describe("decoder type '" + type + "' is not supported"));
    }
}

// "a b" (exactly one space) or ["a", "b"].
std::pair<std::string, std::string> parse_merge(const json& merge, size_t rank) {
    if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string())
        return {merge[0].get<std::string>(), merge[1].get<std::string>()};
    if (merge.is_string()) {
        const std::string text = merge.get<std::string>();
        const size_t space = text.find(' ');
        if (space != std::string::npos && text.find(' ', space + 1) == std::string::npos)
            return {text.substr(0, space), text.substr(space + 1)};
    }
    throw Error(describe("merge " + std::to_string(rank + 1) + " (" + merge.dump() +
                         ") is not a pair of tokens"));
}

bool is_unset(const json& model, const char* key) {
    return !model.contains(key) || model.at(key).is_null() ||
           (model.at(key).is_string() && model.at(key).get<std::string>().empty());
}

void parse_model(const json& node, BpeModel& model) {
    const std::string type = node.contains("type") ? type_of(node, "model") : "BPE";
    if (type != "BPE") throw Error(describe("model type '" + type + "' is not supported"));
    for (const char* option : {"continuing_subword_prefix", "end_of_word_suffix"})
        if (!is_unset(node, option))
            throw Error(describe(std::string("BPE option ") + option + " is not supported"));
    if (node.contains("dropout") && !node.at("dropout").is_null() &&
        node.at("dropout").get<double>() != 0.0)
        throw Error(describe("BPE dropout is not supported"));
    model.byte_fallback = bool_member(node, "byte_fallback", false);
    model.fuse_unk = bool_member(node, "fuse_unk", false);
    model.ignore_merges = bool_member(node, "ignore_merges", false);
    if (!is_unset(node, "unk_token")) model.unk_token = string_member(node, "unk_token", "model");

    const json& vocab = member(node, "vocab", "model");
    if (!vocab.is_object()) throw Error(describe("model vocab is not an object"));
    for (const auto& [text, id] : vocab.items()) {
        if (!id.is_number_unsigned() || id.get<uint64_t>() > uint64_t(INT32_MAX))
            throw Error(describe("vocab entry '" + text + "' has an invalid id"));
        model.vocab.emplace(text, id.get<int>());
    }
    model.index_vocab();
    const json& merges = member(node, "merges", "model");
    if (!merges.is_array()) throw Error(describe("model merges is not a list"));
    for (size_t rank = 0; rank < merges.size(); ++rank) {
        const auto [left, right] = parse_merge(merges[rank], rank);
        model.add_merge(left, right, uint32_t(rank));
    }
}

AddedToken parse_added_token(const json& node) {
    AddedToken token;
    token.content = string_member(node, "content", "added token");
    token.special = bool_member(node, "special", false);
    token.single_word = bool_member(node, "single_word", false);
    token.lstrip = bool_member(node, "lstrip", false);
    token.rstrip = bool_member(node, "rstrip", false);
    token.normalized = bool_member(node, "normalized", !token.special);
    return token;
}

}  // namespace

// ============================================================================ Tokenizer

struct Tokenizer::Impl {
    BpeModel model;
    AddedVocabulary added;
    std::unique_ptr<Normalizer> normalizer;
    std::unique_ptr<PreTokenizer> pre_tokenizer;
    std::vector<StageFactory> decoder;  // empty: join tokens with spaces
    std::vector<std::string> texts;     // by id ("" where an id has no token)
    std::vector<bool> has_text;
    std::vector<bool> special;

    void index_ids() {
        int largest = -1;
        for (const auto& [text, id] : model.vocab) largest = std::max(largest, id);
        for (const AddedToken& token : added.tokens()) largest = std::max(largest, token.id);
        texts.assign(size_t(largest + 1), std::string());
        has_text.assign(texts.size(), false);
        special.assign(texts.size(), false);
        for (const auto& [text, id] : model.vocab) set_text(id, text);
        for (const AddedToken& token : added.tokens()) set_text(token.id, token.text);
    }

    // Hugging Face decides "special" by the token's text, so a special token that is also
    // `normalized` (its text changed by the normalizer) is not skipped when decoding.
    void set_text(int id, const std::string& text) {
        texts[id] = text;
        has_text[id] = true;
        special[id] = added.is_special_content(text);
    }

    bool has_id(int id) const { return id >= 0 && size_t(id) < texts.size() && has_text[id]; }

    void encode(std::string_view text, bool parse_special, std::vector<int>& ids) const {
        EncodeScratch scratch;
        added.split_raw(
            text, parse_special,
            [&](std::string_view piece, size_t offset, const AddedToken* token) {
                if (token != nullptr) {
                    ids.push_back(token->id);
                    return;
                }
                std::string normalized(piece);
                if (normalizer) normalizer->apply(normalized);
                added.split_normalized(
                    normalized, parse_special,
                    [&](std::string_view sub, size_t sub_offset, const AddedToken* sub_token) {
                        if (sub_token != nullptr) {
                            ids.push_back(sub_token->id);
                            return;
                        }
                        const bool at_text_start = offset == 0 && sub_offset == 0;
                        if (!pre_tokenizer) {
                            model.encode_word(sub, ids, scratch);
                            return;
                        }
                        pre_tokenizer->split(sub, at_text_start, [&](std::string_view word, bool) {
                            model.encode_word(word, ids, scratch);
                        });
                    });
            });
    }
};

struct StreamDecoder::Pipeline {
    std::vector<std::unique_ptr<DecodeStage>> stages;

    Pipeline(const Tokenizer::Impl& impl, bool eager) {
        for (const StageFactory& make : impl.decoder) stages.push_back(make(eager));
        if (stages.empty()) stages.push_back(std::make_unique<JoinWithSpacesStage>());
    }

    std::string push(const std::string& token) {
        DecodePieces pieces{{token, true, true}};
        run_from(0, pieces);
        return concatenate(pieces);
    }

    std::string finish() {
        std::string text;
        for (size_t stage = 0; stage < stages.size(); ++stage) {
            DecodePieces pieces;
            stages[stage]->finish(pieces);
            run_from(stage + 1, pieces);
            text += concatenate(pieces);
        }
        return text;
    }

private:
    void run_from(size_t first_stage, DecodePieces& pieces) {
        for (size_t stage = first_stage; stage < stages.size() && !pieces.empty(); ++stage) {
            DecodePieces next;
            for (DecodePiece& piece : pieces) stages[stage]->push(std::move(piece), next);
            pieces.swap(next);
        }
    }
    static std::string concatenate(const DecodePieces& pieces) {
        std::string text;
        for (const DecodePiece& piece : pieces) text += piece.text;
        return text;
    }
};

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::from_json(const std::string& tokenizer_json) {
    json root;
    try {
        root = json::parse(tokenizer_json);
    } catch (const json::exception& e) {
        throw Error(describe(std::string("not valid JSON (") + e.what() + ")"));
    }
    if (!root.is_object()) throw Error(describe("not a JSON object"));
    auto impl = std::make_shared<Impl>();
    try {
        parse_model(member(root, "model", "tokenizer"), impl->model);
        impl->normalizer = parse_normalizer(root.value("normalizer", json()));
        impl->pre_tokenizer = parse_pre_tokenizer(root.value("pre_tokenizer", json()));
        const json decoder = root.value("decoder", json());
        if (!decoder.is_null()) parse_decoder(decoder, impl->decoder);
        for (const json& token : root.value("added_tokens", json::array()))
            impl->added.add(parse_added_token(token), impl->model);
        impl->added.build_matchers(impl->normalizer.get());
        impl->index_ids();
    } catch (const json::exception& e) {
        throw Error(describe(std::string("unexpected content (") + e.what() + ")"));
    }
    return Tokenizer(std::move(impl));
}

std::vector<int> Tokenizer::encode(std::string_view text, bool parse_special) const {
    require_valid_utf8(text);
    std::vector<int> ids;
    impl_->encode(text, parse_special, ids);
    return ids;
}

std::string Tokenizer::decode(const std::vector<int>& ids, bool skip_special) const {
    StreamDecoder::Pipeline pipeline(*impl_, /*eager=*/false);
    std::string text;
    for (int id : ids) {
        if (!impl_->has_id(id) || (skip_special && impl_->special[id])) continue;
        text += pipeline.push(impl_->texts[id]);
    }
    return text + pipeline.finish();
}

int Tokenizer::vocab_size() const { return int(impl_->texts.size()); }

std::optional<int> Tokenizer::token_id(std::string_view token) const {
    const std::string key(token);
    for (const AddedToken& added : impl_->added.tokens())
        if (added.content == key) return added.id;
    if (const auto found = impl_->model.vocab.find(key); found != impl_->model.vocab.end())
        return found->second;
    return std::nullopt;
}

const std::string& Tokenizer::token_text(int id) const {
    if (!impl_->has_id(id)) throw Error("token id " + std::to_string(id) + " has no token");
    return impl_->texts[id];
}

bool Tokenizer::is_special(int id) const { return impl_->has_id(id) && impl_->special[id]; }

// ============================================================================ StreamDecoder

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : impl_(tokenizer.impl_),
      skip_special_(skip_special),
      pipeline_(std::make_unique<Pipeline>(*impl_, /*eager=*/true)) {}

StreamDecoder::~StreamDecoder() = default;
StreamDecoder::StreamDecoder(StreamDecoder&&) noexcept = default;
StreamDecoder& StreamDecoder::operator=(StreamDecoder&&) noexcept = default;

std::string StreamDecoder::push(int id) {
    if (!impl_->has_id(id) || (skip_special_ && impl_->special[id])) return {};
    return pipeline_->push(impl_->texts[id]);
}

std::string StreamDecoder::flush() {
    std::string text = pipeline_->finish();
    pipeline_ = std::make_unique<Pipeline>(*impl_, /*eager=*/true);
    return text;
}

}  // namespace barellm
