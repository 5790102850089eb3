// Unicode character properties (general category, White_Space) and UTF-8 encoding and
// validation, declared in unicode.h.
#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>

namespace barellm::unicode {

namespace {

// The Basic Multilingual Plane (every script in common use) is looked up in a table built at
// first use, the rest by binary search.
constexpr char32_t kDirectLookupEnd = 0x10000;

GeneralCategory category_from_table(char32_t cp) {
    const CategoryRange* after =
        std::upper_bound(kCategoryRanges, kCategoryRanges + kCategoryRangeCount, cp,
                         [](char32_t value, const CategoryRange& r) { return value < r.first; });
    return (after - 1)->category;  // the first range starts at code point 0
}

}  // namespace

GeneralCategory general_category(char32_t cp) {
    static const std::array<GeneralCategory, kDirectLookupEnd> direct = [] {
        std::array<GeneralCategory, kDirectLookupEnd> table{};
        for (size_t i = 0; i < kCategoryRangeCount && kCategoryRanges[i].first < kDirectLookupEnd;
             ++i) {
            const char32_t next = i + 1 < kCategoryRangeCount
                                      ? std::min(kCategoryRanges[i + 1].first, kDirectLookupEnd)
                                      : kDirectLookupEnd;
            std::fill(table.begin() + kCategoryRanges[i].first, table.begin() + next,
                      kCategoryRanges[i].category);
        }
        return table;
    }();
    return cp < kDirectLookupEnd ? direct[cp] : category_from_table(cp);
}

const CodePointRange kWhiteSpaceRanges[] = {
    {0x09, 0x0D},     {0x20, 0x20},     {0x85, 0x85},     {0xA0, 0xA0},     {0x1680, 0x1680},
    {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}};
const size_t kWhiteSpaceRangeCount = sizeof(kWhiteSpaceRanges) / sizeof(kWhiteSpaceRanges[0]);

bool is_white_space(char32_t cp) {
    for (size_t i = 0; i < kWhiteSpaceRangeCount && cp >= kWhiteSpaceRanges[i].first; ++i)
        if (cp <= kWhiteSpaceRanges[i].last) return true;
    return false;
}

void append_utf8(std::string& out, char32_t cp) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xC0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += char(0xE0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    } else {
        out += char(0xF0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3F));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    }
}

Utf8Scan scan_utf8(std::string_view bytes, size_t pos) {
    const auto byte = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
    const unsigned char lead = byte(pos);
    if (lead < 0x80) return {Utf8Status::Complete, 1};
    size_t length = 0;
    unsigned char second_min = 0x80, second_max = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
        length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
        length = 3;
        if (lead == 0xE0) second_min = 0xA0;  // no overlong forms
        if (lead == 0xED) second_max = 0x9F;  // no surrogates
    } else if (lead >= 0xF0 && lead <= 0xF4) {
        length = 4;
        if (lead == 0xF0) second_min = 0x90;  // no overlong forms
        if (lead == 0xF4) second_max = 0x8F;  // nothing above U+10FFFF
    } else {
        return {Utf8Status::Invalid, 1};
    }
    for (size_t i = 1; i < length; ++i) {
        if (pos + i >= bytes.size()) return {Utf8Status::Truncated, i};
        const unsigned char b = byte(pos + i);
        const unsigned char min = i == 1 ? second_min : 0x80, max = i == 1 ? second_max : 0xBF;
        if (b < min || b > max) return {Utf8Status::Invalid, i};
    }
    return {Utf8Status::Complete, length};
}

size_t first_invalid_utf8(std::string_view bytes) {
    for (size_t pos = 0; pos < bytes.size();) {
        const Utf8Scan scan = scan_utf8(bytes, pos);
        if (scan.status != Utf8Status::Complete) return pos;
        pos += scan.length;
    }
    return std::string_view::npos;
}

bool is_valid_utf8(std::string_view bytes) {
    return first_invalid_utf8(bytes) == std::string_view::npos;
}

}  // namespace barellm::unicode
