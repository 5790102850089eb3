// Normalizers (declared in normalize.h), and the NFC algorithm the NFC normalizer runs.
#include "tokenizer/normalize.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>

#include "util/error.h"
#include "tokenizer/text.h"
#include "tokenizer/unicode.h"

namespace barellm::tok {

namespace {

[[noreturn]] void refuse_growth(const char* normalizer, size_t max_size) {
    throw Error(std::string("normalizer ") + normalizer + " would make the text longer than the " +
                std::to_string(max_size) + " bytes allowed (normalizers may make a text " +
                std::to_string(kMaxNormalizedGrowth) + " times as long, plus " +
                std::to_string(kNormalizedSlackBytes) + " bytes)");
}

}  // namespace

void SequenceNormalizer::rewrite(std::string& text, size_t max_size) const {
    for (const auto& step : steps_) step->rewrite(text, max_size);
}

void PrependNormalizer::rewrite(std::string& text, size_t max_size) const {
    if (text.empty()) return;
    if (text.size() + prefix_.size() > max_size) refuse_growth("Prepend", max_size);
    text.insert(0, prefix_);
}

void ReplaceNormalizer::rewrite(std::string& text, size_t max_size) const {
    if (pattern_.empty() || text.find(pattern_) == std::string::npos) return;
    // Checked before the text is built, as one Replace alone can multiply its size. Each
    // occurrence adds `growth` bytes and `allowed` of them fit: they are counted only when
    // there could be more.
    if (content_.size() > pattern_.size()) {
        const size_t growth = content_.size() - pattern_.size();
        const size_t allowed = (max_size - text.size()) / growth;
        size_t count = 0;
        if (text.size() / pattern_.size() > allowed)
            for (size_t pos = text.find(pattern_); pos != std::string::npos && count <= allowed;
                 pos = text.find(pattern_, pos + pattern_.size()))
                ++count;
        if (count > allowed) refuse_growth("Replace", max_size);
    }
    text = replace_all(text, pattern_, content_);
}

// ============================================================================ NFC
//
// Hugging Face's NFC (the unicode-normalization-alignments crate) knows the characters of
// Unicode 9.0 only, and so do the NFC tables: later characters pass through unchanged.

namespace {

using unicode::decode_utf8;
using unicode::utf8_length;

constexpr char32_t kHangulSyllableBase = 0xAC00, kHangulLeadBase = 0x1100,
                   kHangulVowelBase = 0x1161, kHangulTrailBase = 0x11A7;
constexpr char32_t kHangulLeadCount = 19, kHangulVowelCount = 21, kHangulTrailCount = 28;
constexpr char32_t kHangulSyllablesPerLead = kHangulVowelCount * kHangulTrailCount;
constexpr char32_t kHangulSyllableCount = kHangulLeadCount * kHangulSyllablesPerLead;

// Last table entry whose first code point is <= cp, in a table sorted by first code point.
template <typename Entry>
const Entry* last_entry_at_or_before(const Entry* table, size_t count, char32_t cp) {
    const Entry* after = std::upper_bound(
        table, table + count, cp, [](char32_t value, const Entry& e) { return value < e.first; });
    return after == table ? nullptr : after - 1;
}

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
    for (char32_t cp : cps) unicode::append_utf8(out, cp);
    return out;
}

}  // namespace

void NfcNormalizer::rewrite(std::string& text, size_t max_size) const {
    text = to_nfc(text);  // at most 3 times as many characters
    if (text.size() > max_size) refuse_growth("NFC", max_size);
}

}  // namespace barellm::tok
