// The regular expressions of regex.h: a parser, a compiler and a backtracking matcher.
// - The pattern is parsed into a tree (Node), compiled into a program (Instruction, Program).
// - The machine tries things in Oniguruma's order, so it finds the same match.
// - Notes on the Oniguruma behaviour reproduced (that of Hugging Face `tokenizers` 0.23) sit
//   where it is reproduced.
#include "tokenizer/regex.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <utility>

#include "util/error.h"
#include "tokenizer/unicode.h"

namespace barellm {

namespace {

using unicode::GeneralCategory;

constexpr char32_t kMaxCodePoint = 0x10FFFF;
constexpr char32_t kAsciiEnd = 0x80;
// Oniguruma refuses larger repeat counts too.
constexpr uint32_t kMaxRepeatCount = 100000;
constexpr uint32_t kUnbounded = std::numeric_limits<uint32_t>::max();
// Limits that keep a hostile pattern from exhausting the stack or memory.
constexpr int kMaxGroupNesting = 64;
constexpr size_t kMaxInstructions = 10000;

// ============================================================================ Character sets

using CategoryMask = uint32_t;  // bit c: general category c
static_assert(unicode::kGeneralCategoryCount <= 32, "categories must fit in a CategoryMask");
constexpr CategoryMask kAllCategories = (CategoryMask{1} << unicode::kGeneralCategoryCount) - 1;

constexpr CategoryMask category_bit(GeneralCategory c) { return CategoryMask{1} << unsigned(c); }

// The categories from `first` to `last` in the enum's order (one group, such as L).
constexpr CategoryMask category_span(GeneralCategory first, GeneralCategory last) {
    return (category_bit(last) << 1) - category_bit(first);
}

// A character of the text being matched.
struct Char {
    char32_t cp;
    uint32_t length;           // in bytes
    GeneralCategory category;  // only looked up for non-ASCII characters
};

// A set of code points, as a list of intervals.
// - Each interval holds the general categories whose code points in it are in the set.
// - Any union, complement or mix of ranges and categories is exactly such a list.
// - ASCII is also held as a bitmap, for speed.
class CharSet {
public:
    CharSet() : intervals_{{0, 0}} {}

    static CharSet of_range(char32_t first, char32_t last) {
        CharSet set;
        set.append(first, kAllCategories);
        if (last < kMaxCodePoint) set.append(last + 1, 0);
        set.index_ascii();
        return set;
    }
    static CharSet of_char(char32_t cp) { return of_range(cp, cp); }
    static CharSet of_categories(CategoryMask categories) {
        CharSet set;
        set.intervals_ = {{0, categories}};
        set.index_ascii();
        return set;
    }
    static CharSet white_space() {
        CharSet set;
        for (size_t i = 0; i < unicode::kWhiteSpaceRangeCount; ++i)
            set.add(
                of_range(unicode::kWhiteSpaceRanges[i].first, unicode::kWhiteSpaceRanges[i].last));
        return set;
    }

    void add(const CharSet& other) {
        *this = combine(*this, other, [](CategoryMask a, CategoryMask b) { return a | b; });
    }
    CharSet complement() const {
        return combine(*this, *this,
                       [](CategoryMask a, CategoryMask) { return ~a & kAllCategories; });
    }

    bool contains(const Char& c) const {
        if (c.cp < kAsciiEnd) return (ascii_[c.cp >> 6] >> (c.cp & 63)) & 1;
        const CategoryMask categories = interval_at(c.cp).categories;
        return (categories >> unsigned(c.category)) & 1;
    }

private:
    struct Interval {
        char32_t first;  // the interval runs to the next one's first, or to the end
        CategoryMask categories;
    };

    const Interval& interval_at(char32_t cp) const {
        if (intervals_.size() == 1) return intervals_[0];
        const auto after =
            std::upper_bound(intervals_.begin(), intervals_.end(), cp,
                             [](char32_t value, const Interval& i) { return value < i.first; });
        return *(after - 1);
    }

    // Adds an interval from `first`, merged into the last one when it holds the same.
    void append(char32_t first, CategoryMask categories) {
        if (intervals_.back().categories == categories) return;
        if (intervals_.back().first == first)
            intervals_.back().categories = categories;
        else
            intervals_.push_back({first, categories});
        if (intervals_.size() >= 2 && intervals_[intervals_.size() - 2].categories == categories)
            intervals_.pop_back();
    }

    // Each interval of the result holds op(a's categories, b's categories) there.
    template <typename Op>
    static CharSet combine(const CharSet& a, const CharSet& b, Op op) {
        CharSet out;
        out.intervals_ = {{0, op(a.intervals_[0].categories, b.intervals_[0].categories)}};
        size_t i = 0, j = 0;
        constexpr char32_t kEnd = kMaxCodePoint + 1;
        for (;;) {
            const char32_t next_a = i + 1 < a.intervals_.size() ? a.intervals_[i + 1].first : kEnd;
            const char32_t next_b = j + 1 < b.intervals_.size() ? b.intervals_[j + 1].first : kEnd;
            const char32_t next = std::min(next_a, next_b);
            if (next == kEnd) break;
            if (next_a == next) ++i;
            if (next_b == next) ++j;
            out.append(next, op(a.intervals_[i].categories, b.intervals_[j].categories));
        }
        out.index_ascii();
        return out;
    }

    void index_ascii() {
        ascii_ = {};
        for (char32_t cp = 0; cp < kAsciiEnd; ++cp) {
            const CategoryMask categories = interval_at(cp).categories;
            if ((categories >> unsigned(unicode::general_category(cp))) & 1)
                ascii_[cp >> 6] |= uint64_t{1} << (cp & 63);
        }
    }

    std::vector<Interval> intervals_;  // sorted; the first starts at 0
    std::array<uint64_t, 2> ascii_{};
};

const CharSet& white_space_set() {
    static const CharSet set = CharSet::white_space();
    return set;
}

CharSet decimal_digit_set() { return CharSet::of_categories(category_bit(GeneralCategory::Nd)); }

// The general categories \p{...} accepts, under the names Oniguruma knows them by (short and
// long), written as Oniguruma compares them: lower case, without spaces, '-' and '_'.
std::optional<CategoryMask> property_categories(const std::string& name) {
    using G = GeneralCategory;
    struct Property {
        const char* short_name;
        const char* long_name;
        CategoryMask categories;
    };
    static const Property kProperties[] = {
        {"l", "letter", category_span(G::Lu, G::Lo)},
        {"lc", "casedletter", category_span(G::Lu, G::Lt)},
        {"lu", "uppercaseletter", category_bit(G::Lu)},
        {"ll", "lowercaseletter", category_bit(G::Ll)},
        {"lt", "titlecaseletter", category_bit(G::Lt)},
        {"lm", "modifierletter", category_bit(G::Lm)},
        {"lo", "otherletter", category_bit(G::Lo)},
        {"m", "mark", category_span(G::Mn, G::Me)},
        {"mn", "nonspacingmark", category_bit(G::Mn)},
        {"mc", "spacingmark", category_bit(G::Mc)},
        {"me", "enclosingmark", category_bit(G::Me)},
        {"n", "number", category_span(G::Nd, G::No)},
        {"nd", "decimalnumber", category_bit(G::Nd)},
        {"nl", "letternumber", category_bit(G::Nl)},
        {"no", "othernumber", category_bit(G::No)},
        {"p", "punctuation", category_span(G::Pc, G::Po)},
        {"pc", "connectorpunctuation", category_bit(G::Pc)},
        {"pd", "dashpunctuation", category_bit(G::Pd)},
        {"ps", "openpunctuation", category_bit(G::Ps)},
        {"pe", "closepunctuation", category_bit(G::Pe)},
        {"pi", "initialpunctuation", category_bit(G::Pi)},
        {"pf", "finalpunctuation", category_bit(G::Pf)},
        {"po", "otherpunctuation", category_bit(G::Po)},
        {"s", "symbol", category_span(G::Sm, G::So)},
        {"sm", "mathsymbol", category_bit(G::Sm)},
        {"sc", "currencysymbol", category_bit(G::Sc)},
        {"sk", "modifiersymbol", category_bit(G::Sk)},
        {"so", "othersymbol", category_bit(G::So)},
        {"z", "separator", category_span(G::Zs, G::Zp)},
        {"zs", "spaceseparator", category_bit(G::Zs)},
        {"zl", "lineseparator", category_bit(G::Zl)},
        {"zp", "paragraphseparator", category_bit(G::Zp)},
        {"c", "other", category_span(G::Cc, G::Cn)},
        {"cc", "control", category_bit(G::Cc)},
        {"cf", "format", category_bit(G::Cf)},
        {"cs", "surrogate", category_bit(G::Cs)},
        {"co", "privateuse", category_bit(G::Co)},
        {"cn", "unassigned", category_bit(G::Cn)},
    };
    for (const Property& p : kProperties)
        if (name == p.short_name || name == p.long_name) return p.categories;
    return std::nullopt;
}

// ============================================================================ Syntax tree

enum class Anchor : uint8_t {
    // Oniguruma's defaults: ^ and $ are line anchors, and only "\n" ends a line.
    LineStart,              // ^: at the start, or after a "\n" that is not the last character
    LineEnd,                // $: at the end, or before a "\n"
    TextStart,              // \A
    TextEnd,                // \z
    TextEndOrFinalNewline,  // \Z: at the end, or before a "\n" that ends the text
};

struct Node {
    enum class Kind : uint8_t {
        Empty,
        Char,         // one character of `chars`
        Sequence,     // the children one after the other
        Alternation,  // the first child that leads to a match
        Repeat,       // the child min to max times, as many as lead to a match
        Anchor,
        LookAhead,  // the child matches here (consuming nothing), or does not if `negative`
    };
    Kind kind = Kind::Empty;
    CharSet chars;
    std::vector<Node> children;
    uint32_t min = 0, max = 0;
    Anchor anchor = Anchor::LineStart;
    bool negative = false;
};

Node char_node(CharSet chars) {
    Node node;
    node.kind = Node::Kind::Char;
    node.chars = std::move(chars);
    return node;
}

Node anchor_node(Anchor anchor) {
    Node node;
    node.kind = Node::Kind::Anchor;
    node.anchor = anchor;
    return node;
}

// A Sequence or Alternation of `children`, or the only child itself.
Node list_node(Node::Kind kind, std::vector<Node> children) {
    if (children.size() == 1) return std::move(children[0]);
    Node node;
    node.kind = children.empty() ? Node::Kind::Empty : kind;
    node.children = std::move(children);
    return node;
}

bool can_be_empty(const Node& node) {
    switch (node.kind) {
        case Node::Kind::Char:
            return false;
        case Node::Kind::Sequence:
            return std::all_of(node.children.begin(), node.children.end(), can_be_empty);
        case Node::Kind::Alternation:
            return std::any_of(node.children.begin(), node.children.end(), can_be_empty);
        case Node::Kind::Repeat:
            return node.min == 0 || can_be_empty(node.children[0]);
        default:
            return true;
    }
}

// What a match of a node can begin with: a character of `chars`, or (when `can_be_empty`)
// whatever comes after the node. Assertions and lookaheads count as empty.
struct FirstChars {
    CharSet chars;
    bool can_be_empty = true;
};

FirstChars first_chars(const Node& node) {
    FirstChars first;
    switch (node.kind) {
        case Node::Kind::Char:
            first = {node.chars, false};
            break;
        case Node::Kind::Sequence:
            for (const Node& child : node.children) {
                const FirstChars part = first_chars(child);
                first.chars.add(part.chars);
                if (!part.can_be_empty) {
                    first.can_be_empty = false;
                    break;
                }
            }
            break;
        case Node::Kind::Alternation:
            first.can_be_empty = false;
            for (const Node& child : node.children) {
                const FirstChars part = first_chars(child);
                first.chars.add(part.chars);
                first.can_be_empty = first.can_be_empty || part.can_be_empty;
            }
            break;
        case Node::Kind::Repeat:
            first = first_chars(node.children[0]);
            first.can_be_empty = first.can_be_empty || node.min == 0;
            break;
        default:
            break;
    }
    return first;
}

// ============================================================================ Parser

bool is_ascii_punctuation_or_space(char32_t cp) {
    return cp == ' ' || (cp > ' ' && cp < 0x7F && !(cp >= '0' && cp <= '9') &&
                         !(cp >= 'A' && cp <= 'Z') && !(cp >= 'a' && cp <= 'z'));
}

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// The pattern as it is quoted in error messages: control characters escaped, so that the
// message stays on one line.
std::string quoted(std::string_view text) {
    std::string out = "'";
    for (char c : text) {
        const unsigned char byte = static_cast<unsigned char>(c);
        if (c == '\n') {
            out += "\\n";
        } else if (c == '\r') {
            out += "\\r";
        } else if (c == '\t') {
            out += "\\t";
        } else if (byte < 0x20 || byte == 0x7F) {
            char hex[8];
            std::snprintf(hex, sizeof(hex), "\\x%02X", byte);
            out += hex;
        } else {
            out += c;
        }
    }
    return out + "'";
}

// Case-insensitive text that Oniguruma's Unicode case folding also matches as one
// character: "ss" (U+00DF), "st" (U+FB06), "ff", "fi", "fl" (and "ffi", "ffl").
constexpr std::string_view kMultiCharFolds[] = {"ss", "st", "ff", "fi", "fl"};

// Within (?i:...), an ASCII letter matches either case, and the two other characters that
// Unicode case folding maps to an ASCII letter: U+017F (long s) and U+212A (Kelvin sign).
CharSet case_insensitive(char32_t cp) {
    const char32_t lower = cp >= 'A' && cp <= 'Z' ? cp + ('a' - 'A') : cp;
    CharSet set = CharSet::of_char(cp);
    if (lower >= 'a' && lower <= 'z') {
        set.add(CharSet::of_char(lower));
        set.add(CharSet::of_char(lower - ('a' - 'A')));
    }
    if (lower == 's') set.add(CharSet::of_char(0x17F));
    if (lower == 'k') set.add(CharSet::of_char(0x212A));
    return set;
}

class Parser {
public:
    explicit Parser(std::string_view pattern) : pattern_(pattern) {}

    Node parse() {
        if (!unicode::is_valid_utf8(pattern_)) refuse("text that is not valid UTF-8", 0);
        Node root = parse_alternation(0, false);
        if (pos_ < pattern_.size()) refuse("')' without a matching '('", pos_);
        return root;
    }

private:
    [[noreturn]] void refuse(const std::string& construct, size_t at) const {
        throw Error("regex " + quoted(pattern_) + " is not supported: " + construct +
                    " (at offset " + std::to_string(at) + ")");
    }

    bool at_end() const { return pos_ >= pattern_.size(); }
    char peek(size_t ahead = 0) const {
        return pos_ + ahead < pattern_.size() ? pattern_[pos_ + ahead] : '\0';
    }
    bool accept(std::string_view text) {
        if (pattern_.substr(pos_, text.size()) != text) return false;
        pos_ += text.size();
        return true;
    }
    char32_t next_code_point() {
        const char32_t cp = unicode::decode_utf8(pattern_, pos_);
        pos_ += unicode::utf8_length(static_cast<unsigned char>(pattern_[pos_]));
        return cp;
    }
    // The pattern's text from `from` to here, quoted, for messages.
    std::string text_from(size_t from) const { return quoted(pattern_.substr(from, pos_ - from)); }

    // ------------------------------------------------------------------ structure

    Node parse_alternation(int depth, bool ignore_case) {
        std::vector<Node> alternatives{parse_sequence(depth, ignore_case)};
        while (accept("|")) alternatives.push_back(parse_sequence(depth, ignore_case));
        return list_node(Node::Kind::Alternation, std::move(alternatives));
    }

    Node parse_sequence(int depth, bool ignore_case) {
        const size_t start = pos_;
        std::vector<Node> items;
        while (!at_end() && peek() != '|' && peek() != ')') {
            const size_t item_start = pos_;
            Node item = ignore_case ? parse_case_insensitive_char() : parse_atom(depth);
            parse_quantifier(item, item_start, ignore_case);
            items.push_back(std::move(item));
        }
        if (ignore_case) refuse_multi_char_folds(start);
        return list_node(Node::Kind::Sequence, std::move(items));
    }

    Node parse_atom(int depth) {
        const size_t start = pos_;
        switch (peek()) {
            case '(':
                return parse_group(depth);
            case '[':
                ++pos_;
                return char_node(parse_class(start));
            case '.':  // any character but "\n" (Oniguruma without its multiline option)
                ++pos_;
                return char_node(CharSet::of_char('\n').complement());
            case '^':
                ++pos_;
                return anchor_node(Anchor::LineStart);
            case '$':
                ++pos_;
                return anchor_node(Anchor::LineEnd);
            case '\\':
                return parse_escape();
            case '?':
            case '*':
            case '+':
                refuse(std::string("quantifier '") + peek() + "' with nothing to repeat", start);
            case '{':
                refuse("'{' that is not a quantifier after something to repeat (write \\{)", start);
            default:
                return char_node(CharSet::of_char(next_code_point()));
        }
    }

    Node parse_group(int depth) {
        const size_t start = pos_;
        if (depth + 1 > kMaxGroupNesting)
            refuse("groups nested deeper than " + std::to_string(kMaxGroupNesting), start);
        Node node;
        if (accept("(?:")) {
            node = parse_alternation(depth + 1, false);
        } else if (accept("(?i:")) {
            node = parse_alternation(depth + 1, true);
        } else if (accept("(?=") || accept("(?!")) {
            node.kind = Node::Kind::LookAhead;
            node.negative = pattern_[pos_ - 1] == '!';
            node.children.push_back(parse_alternation(depth + 1, false));
        } else if (accept("(?")) {
            refuse_group_kind(start);
        } else {
            ++pos_;  // a capturing group: with nothing to refer back to it, it is (?:...)
            node = parse_alternation(depth + 1, false);
        }
        if (!accept(")")) refuse("'(' without a matching ')'", start);
        return node;
    }

    [[noreturn]] void refuse_group_kind(size_t start) {
        if (accept("<=") || accept("<!")) refuse("lookbehind " + text_from(start), start);
        if (peek() == '<' || peek() == 'P' || peek() == '\'')
            refuse("named group " + text_from(start), start);
        if (peek() == '>') refuse("atomic group '(?>'", start);
        if (peek() == '#') refuse("comment group '(?#'", start);
        if (peek() == '~') refuse("absence operator '(?~'", start);
        if (peek() == '(') refuse("conditional group '(?('", start);
        while (!at_end() && peek() != ':' && peek() != ')') ++pos_;
        if (!at_end()) ++pos_;
        refuse("option group " + text_from(start) +
                   " (only (?i: holding alternatives of ASCII text is supported)",
               start);
    }

    // ------------------------------------------------------------------ quantifiers

    struct Bounds {
        uint32_t min, max;
    };

    // A quantifier at the current position, consumed; none when there is no quantifier.
    std::optional<Bounds> parse_quantifier_bounds() {
        const size_t start = pos_;
        if (accept("?")) return Bounds{0, 1};
        if (accept("*")) return Bounds{0, kUnbounded};
        if (accept("+")) return Bounds{1, kUnbounded};
        if (!accept("{")) return std::nullopt;
        const std::optional<uint32_t> min = parse_count(start);
        if (accept("}")) {
            if (!min) refuse_brace(start);
            return Bounds{*min, *min};
        }
        if (!accept(",")) refuse_brace(start);
        const std::optional<uint32_t> max = parse_count(start);
        if (!accept("}") || (!min && !max)) refuse_brace(start);
        const Bounds bounds{min.value_or(0), max.value_or(kUnbounded)};
        if (bounds.min > bounds.max)
            refuse("quantifier " + text_from(start) + " with n > m", start);
        return bounds;
    }

    std::optional<uint32_t> parse_count(size_t quantifier_start) {
        if (!(peek() >= '0' && peek() <= '9')) return std::nullopt;
        uint64_t count = 0;
        while (peek() >= '0' && peek() <= '9') {
            count = count * 10 + uint64_t(peek() - '0');
            ++pos_;
            if (count > kMaxRepeatCount)
                refuse("repeat count above " + std::to_string(kMaxRepeatCount), quantifier_start);
        }
        return uint32_t(count);
    }

    // Oniguruma reads a '{' that does not form {n}, {n,}, {n,m} or {,m} as the character.
    [[noreturn]] void refuse_brace(size_t start) {
        refuse("'{' that is not a quantifier {n}, {n,}, {n,m} or {,m} (write \\{)", start);
    }

    void parse_quantifier(Node& item, size_t item_start, bool ignore_case) {
        const size_t start = pos_;
        const std::optional<Bounds> bounds = parse_quantifier_bounds();
        if (!bounds) return;
        if (ignore_case) refuse("quantifier " + text_from(start) + " inside (?i:...)", start);
        const size_t second = pos_;
        if (pattern_[start] != '{' && (peek() == '?' || peek() == '+')) {
            const bool lazy = peek() == '?';
            ++pos_;
            refuse(std::string(lazy ? "lazy" : "possessive") + " quantifier " + text_from(start),
                   start);
        }
        if (parse_quantifier_bounds())
            refuse("quantifier " + text_from(second) + " after the quantifier " +
                       quoted(pattern_.substr(start, second - start)),
                   second);
        if (item.kind == Node::Kind::Anchor || item.kind == Node::Kind::LookAhead)
            refuse(
                "quantifier " + quoted(pattern_.substr(start, second - start)) + " on an assertion",
                start);
        if (can_be_empty(item))
            refuse("quantifier on " + quoted(pattern_.substr(item_start, start - item_start)) +
                       ", which can match the empty string",
                   start);
        Node repeat;
        repeat.kind = Node::Kind::Repeat;
        repeat.min = bounds->min;
        repeat.max = bounds->max;
        repeat.children.push_back(std::move(item));
        item = std::move(repeat);
    }

    // ------------------------------------------------------------------ (?i:...)

    Node parse_case_insensitive_char() {
        const size_t start = pos_;
        char32_t cp;
        if (peek() == '\\' && is_ascii_punctuation_or_space(static_cast<unsigned char>(peek(1)))) {
            cp = static_cast<unsigned char>(peek(1));
            pos_ += 2;
        } else if (peek() == '\\' || peek() == '(' || peek() == '[' || peek() == '.' ||
                   peek() == '^' || peek() == '$' || peek() == '?' || peek() == '*' ||
                   peek() == '+' || peek() == '{') {
            refuse(std::string("'") + peek() +
                       "' inside (?i:...) (only ASCII text is supported there)",
                   start);
        } else {
            cp = next_code_point();
            if (cp >= kAsciiEnd)
                refuse("non-ASCII character " + text_from(start) + " inside (?i:...)", start);
        }
        return char_node(case_insensitive(cp));
    }

    // Oniguruma folds a string (the characters of one alternative) as a whole, so that
    // (?i:ss) also matches U+00DF; that is not reproduced, and so refused.
    void refuse_multi_char_folds(size_t start) const {
        std::string text;
        for (char c : pattern_.substr(start, pos_ - start))
            if (c != '\\') text += char(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
        for (std::string_view fold : kMultiCharFolds)
            if (text.find(fold) != std::string::npos)
                refuse("case-insensitive '" + std::string(fold) +
                           "', which Unicode case folding also matches as one character",
                       start);
    }

    // ------------------------------------------------------------------ escapes

    // The character of an escape that stands for one character (\n, \u00E9, \.), if it does.
    std::optional<char32_t> parse_char_escape() {
        const size_t start = pos_;
        const char c = peek(1);
        const unsigned char byte = static_cast<unsigned char>(c);
        static constexpr std::pair<char, char32_t> kControls[] = {
            {'t', '\t'}, {'n', '\n'}, {'r', '\r'}, {'f', '\f'},
            {'v', '\v'}, {'a', '\a'}, {'e', 0x1B}};
        for (const auto& [letter, control] : kControls) {
            if (c == letter) {
                pos_ += 2;
                return control;
            }
        }
        if (byte < kAsciiEnd && is_ascii_punctuation_or_space(byte)) {
            pos_ += 2;
            return byte;
        }
        if (c == 'u') {
            pos_ += 2;
            return checked_code_point(parse_hex(4, 4, start), start);
        }
        if (c == 'x') {
            pos_ += 2;
            if (accept("{")) {
                const char32_t cp = parse_hex(1, 8, start);
                if (!accept("}")) refuse("unterminated '\\x{'", start);
                return checked_code_point(cp, start);
            }
            const char32_t cp = parse_hex(1, 2, start);
            if (cp >= kAsciiEnd)
                refuse(text_from(start) + " (a byte, not a character, in Oniguruma)", start);
            return cp;
        }
        return std::nullopt;
    }

    char32_t parse_hex(size_t min_digits, size_t max_digits, size_t start) {
        uint64_t value = 0;
        size_t digits = 0;
        while (digits < max_digits && hex_value(peek()) >= 0) {
            value = value * 16 + uint64_t(hex_value(peek()));
            ++pos_;
            ++digits;
        }
        if (digits < min_digits)
            refuse("escape " + text_from(start) + " without hex digits", start);
        return value > kMaxCodePoint ? kMaxCodePoint + 1 : char32_t(value);
    }

    char32_t checked_code_point(char32_t cp, size_t start) const {
        if (cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF))
            refuse("escape " + text_from(start) + ", which is not a character", start);
        return cp;
    }

    // An escape that stands for a set of characters: \s \S \d \D \p{..} \P{..}.
    std::optional<CharSet> parse_set_escape() {
        switch (peek(1)) {
            case 's':
                pos_ += 2;
                return white_space_set();
            case 'S':
                pos_ += 2;
                return white_space_set().complement();
            case 'd':  // Oniguruma's \d with Unicode text is Nd, not only 0-9
                pos_ += 2;
                return decimal_digit_set();
            case 'D':
                pos_ += 2;
                return decimal_digit_set().complement();
            case 'p':
            case 'P':
                return parse_property();
            default:
                return std::nullopt;
        }
    }

    CharSet parse_property() {
        const size_t start = pos_;
        bool negated = peek(1) == 'P';
        pos_ += 2;
        if (!accept("{")) refuse("property " + text_from(start) + " without {name}", start);
        if (accept("^")) negated = !negated;
        std::string name;
        while (!at_end() && peek() != '}') {
            const char c = peek();
            if (c != ' ' && c != '-' && c != '_') name += char(c >= 'A' && c <= 'Z' ? c + 32 : c);
            ++pos_;
        }
        if (!accept("}")) refuse("unterminated property " + text_from(start), start);
        const std::optional<CategoryMask> categories = property_categories(name);
        if (!categories)
            refuse("property " + text_from(start) + " (only general categories are supported)",
                   start);
        const CharSet set = CharSet::of_categories(*categories);
        return negated ? set.complement() : set;
    }

    [[noreturn]] void refuse_escape(size_t start) {
        if (at_end() || pos_ + 1 >= pattern_.size())
            refuse("'\\' at the end of the pattern", start);
        const char c = peek(1);
        pos_ += 1 + unicode::utf8_length(static_cast<unsigned char>(c));  // all of c's bytes
        if (c >= '1' && c <= '9') refuse("backreference " + text_from(start), start);
        if (c == '0') refuse("octal escape " + text_from(start), start);
        if (c == 'k' || c == 'g') refuse("group reference " + text_from(start), start);
        if (c == 'w' || c == 'W') refuse("word characters " + text_from(start), start);
        if (c == 'b' || c == 'B') refuse("word boundary " + text_from(start), start);
        if (c == 'h' || c == 'H') refuse("hexadecimal digits " + text_from(start), start);
        refuse("escape " + text_from(start), start);
    }

    Node parse_escape() {
        const size_t start = pos_;
        if (auto cp = parse_char_escape()) return char_node(CharSet::of_char(*cp));
        if (auto set = parse_set_escape()) return char_node(std::move(*set));
        static constexpr std::pair<char, Anchor> kAnchors[] = {
            {'A', Anchor::TextStart}, {'z', Anchor::TextEnd}, {'Z', Anchor::TextEndOrFinalNewline}};
        for (const auto& [letter, anchor] : kAnchors) {
            if (peek(1) == letter) {
                pos_ += 2;
                return anchor_node(anchor);
            }
        }
        refuse_escape(start);
    }

    // ------------------------------------------------------------------ classes [...]

    // One member of a class: a character (which may start a range) or a set.
    struct ClassItem {
        std::optional<char32_t> cp;
        CharSet set;
    };

    ClassItem parse_class_item(bool first, size_t class_start) {
        const size_t start = pos_;
        if (at_end()) refuse("'[' without a matching ']'", class_start);
        const char c = peek();
        if (c == '[') refuse("nested class or POSIX bracket '['", start);
        if (c == '&' && peek(1) == '&') refuse("class intersection '&&'", start);
        if (c == '-' && !first && peek(1) != ']' && pos_ + 1 < pattern_.size())
            refuse("'-' that neither forms a range nor starts or ends the class (write \\-)",
                   start);
        if (c == '\\') {
            if (auto cp = parse_char_escape()) return {cp, CharSet::of_char(*cp)};
            if (auto set = parse_set_escape()) return {std::nullopt, std::move(*set)};
            refuse_escape(start);
        }
        const char32_t cp = next_code_point();
        return {cp, CharSet::of_char(cp)};
    }

    // A class, from after its '['.
    CharSet parse_class(size_t class_start) {
        const bool negated = accept("^");
        if (peek() == ']') refuse("']' at the start of a class (empty class, or write \\])", pos_);
        CharSet set;
        for (bool first = true; !accept("]"); first = false) {
            const size_t item_start = pos_;
            ClassItem low = parse_class_item(first, class_start);
            if (peek() != '-' || peek(1) == ']' || pos_ + 1 >= pattern_.size()) {
                set.add(low.set);
                continue;
            }
            ++pos_;  // '-'
            const ClassItem high = parse_class_item(false, class_start);
            if (!low.cp || !high.cp)
                refuse("range " + text_from(item_start) + " with a set at one end", item_start);
            if (*high.cp < *low.cp)
                refuse("range " + text_from(item_start) + " out of order", item_start);
            set.add(CharSet::of_range(*low.cp, *high.cp));
        }
        return negated ? set.complement() : set;
    }

    std::string_view pattern_;
    size_t pos_ = 0;
};

// ============================================================================ Program

enum class Op : uint8_t {
    Char,        // one character of sets[arg]
    CharRepeat,  // min to max characters of sets[arg], as many as lead to a match
    Branch,      // the alternatives branches[arg], in order
    Jump,        // to arg
    Assert,      // the anchor holds here
    LookAhead,   // the program from the next instruction to a Match does (or, if negative,
                 // does not) match here; then on at arg
    Match,
};

constexpr uint32_t kNoMemoRow = std::numeric_limits<uint32_t>::max();

struct Instruction {
    Op op;
    Anchor anchor = Anchor::LineStart;
    bool negative = false;
    uint32_t arg = 0;
    uint32_t min = 0, max = 0;
    // CharRepeat: the program matches right after it, so it never gives characters back
    // (the common `\p{L}+` at the end of an alternative).
    bool before_match = false;
    // Its row in the FailureMemo (Branch, and CharRepeat that may give characters back).
    uint32_t memo_row = kNoMemoRow;
};

// One alternative of a Branch: where it starts, and the set its first character is in
// (kAnyChar when it may begin with anything, or match the empty string).
struct Alternative {
    uint32_t pc;
    uint32_t first;
};
constexpr uint32_t kAnyChar = std::numeric_limits<uint32_t>::max();

// A set of the alternatives of a Branch: bit i is alternative i.
using AlternativeMask = uint64_t;
constexpr size_t kMaxAlternatives = 64;

// The alternatives of a Branch, and which of them may begin with each ASCII character or at
// the end of the text, so that the machine tries only those.
struct Branch {
    std::vector<Alternative> alternatives;
    std::array<AlternativeMask, kAsciiEnd> ascii{};
    AlternativeMask at_end = 0;
};

}  // namespace

struct Regex::Program {
    std::vector<Instruction> code;
    std::vector<CharSet> sets;
    std::vector<Branch> branches;
    uint32_t first = kAnyChar;  // the set a match's first character is in, or kAnyChar
    uint32_t memo_rows = 0;
};

namespace {

class Compiler {
public:
    Compiler(Regex::Program& program, const std::string& pattern)
        : program_(program), pattern_(pattern) {}

    void compile(const Node& root) {
        const FirstChars first = first_chars(root);
        if (!first.can_be_empty) program_.first = add_set(first.chars);
        emit(root);
        push({Op::Match});
        index_branches();
        mark_repeats_before_match();
        assign_memo_rows();
    }

private:
    uint32_t here() const { return uint32_t(program_.code.size()); }

    uint32_t push(Instruction instruction) {
        if (program_.code.size() >= kMaxInstructions)
            throw Error("regex " + quoted(pattern_) +
                        " is not supported: it is too large once its counted repeats are "
                        "written out (more than " +
                        std::to_string(kMaxInstructions) + " instructions)");
        program_.code.push_back(instruction);
        return here() - 1;
    }

    uint32_t add_set(const CharSet& set) {
        program_.sets.push_back(set);
        return uint32_t(program_.sets.size() - 1);
    }

    uint32_t first_set_of(const Node& node) {
        const FirstChars first = first_chars(node);
        return first.can_be_empty ? kAnyChar : add_set(first.chars);
    }

    uint32_t push_branch() {
        program_.branches.emplace_back();
        return push({Op::Branch, Anchor::LineStart, false, uint32_t(program_.branches.size() - 1)});
    }
    std::vector<Alternative>& alternatives(uint32_t branch_pc) {
        return program_.branches[program_.code[branch_pc].arg].alternatives;
    }

    void mark_repeats_before_match() {
        std::vector<Instruction>& code = program_.code;
        for (uint32_t pc = 0; pc < here(); ++pc) {
            if (code[pc].op != Op::CharRepeat) continue;
            uint32_t next = pc + 1;
            while (code[next].op == Op::Jump) next = code[next].arg;
            code[pc].before_match = code[next].op == Op::Match;
        }
    }

    // The instructions where failures are worth recording: where the machine may come back
    // to the same text position by other paths.
    void assign_memo_rows() {
        for (Instruction& instruction : program_.code) {
            const bool gives_back = instruction.op == Op::CharRepeat && !instruction.before_match &&
                                    instruction.min < instruction.max;
            if (instruction.op == Op::Branch || gives_back)
                instruction.memo_row = program_.memo_rows++;
        }
    }

    void index_branches() {
        for (Branch& branch : program_.branches) {
            for (size_t i = 0; i < branch.alternatives.size(); ++i) {
                const AlternativeMask bit = AlternativeMask{1} << i;
                const uint32_t first = branch.alternatives[i].first;
                if (first == kAnyChar) branch.at_end |= bit;
                for (char32_t cp = 0; cp < kAsciiEnd; ++cp)
                    if (first == kAnyChar || program_.sets[first].contains({cp, 1, {}}))
                        branch.ascii[cp] |= bit;
            }
        }
    }

    void emit(const Node& node) {
        switch (node.kind) {
            case Node::Kind::Empty:
                break;
            case Node::Kind::Char:
                push({Op::Char, Anchor::LineStart, false, add_set(node.chars)});
                break;
            case Node::Kind::Sequence:
                for (const Node& child : node.children) emit(child);
                break;
            case Node::Kind::Alternation:
                emit_alternation(node);
                break;
            case Node::Kind::Repeat:
                emit_repeat(node);
                break;
            case Node::Kind::Anchor:
                push({Op::Assert, node.anchor});
                break;
            case Node::Kind::LookAhead: {
                // Oniguruma's lookahead is atomic: once its sub-program has matched, the
                // machine does not come back into it to try other ways.
                const uint32_t look = push({Op::LookAhead, Anchor::LineStart, node.negative});
                emit(node.children[0]);
                push({Op::Match});
                program_.code[look].arg = here();
                break;
            }
        }
    }

    // The alternatives from `from` on. Past kMaxAlternatives, the last alternative of the
    // Branch is a Branch of the rest.
    void emit_alternation(const Node& node, size_t from = 0) {
        const uint32_t branch = push_branch();
        std::vector<uint32_t> jumps_to_end;
        const size_t count = node.children.size() - from;
        const size_t direct = count > kMaxAlternatives ? kMaxAlternatives - 1 : count;
        for (size_t i = from; i < from + direct; ++i) {
            alternatives(branch).push_back({here(), first_set_of(node.children[i])});
            emit(node.children[i]);
            if (i + 1 < node.children.size()) jumps_to_end.push_back(push({Op::Jump}));
        }
        if (direct < count) {
            alternatives(branch).push_back({here(), kAnyChar});
            emit_alternation(node, from + direct);
        }
        for (uint32_t jump : jumps_to_end) program_.code[jump].arg = here();
    }

    // A repeated character is one instruction. Other repeats are written out:
    // - min copies,
    // - then a loop (unbounded), or max - min nested optional copies, each of which first
    //   tries one more copy (greedy), else skips to the end.
    void emit_repeat(const Node& node) {
        const Node& child = node.children[0];
        if (child.kind == Node::Kind::Char) {
            push({Op::CharRepeat, Anchor::LineStart, false, add_set(child.chars), node.min,
                  node.max});
            return;
        }
        for (uint32_t i = 0; i < node.min; ++i) emit(child);
        const uint32_t first = first_set_of(child);
        if (node.max == kUnbounded) {
            const uint32_t loop = push_branch();
            alternatives(loop).push_back({here(), first});
            emit(child);
            push({Op::Jump, Anchor::LineStart, false, loop});
            alternatives(loop).push_back({here(), kAnyChar});
            return;
        }
        std::vector<uint32_t> optionals;
        for (uint32_t i = node.min; i < node.max; ++i) {
            optionals.push_back(push_branch());
            alternatives(optionals.back()).push_back({here(), first});
            emit(child);
        }
        for (uint32_t branch : optionals) alternatives(branch).push_back({here(), kAnyChar});
    }

    Regex::Program& program_;
    const std::string& pattern_;
};

// ============================================================================ Matching

// What the machine does when it comes back to a Backtrack.
enum class Resume : uint8_t {
    Alternatives,  // tries the other alternatives of the Branch at pc
    GiveBack,      // the CharRepeat at pc matches one character fewer
    Failed,        // records in the FailureMemo that nothing from pc matched
};

// A way to go on that the machine has not tried yet, or a failure to record.
struct Backtrack {
    uint32_t pc;
    Resume resume;
    size_t pos;     // where the Branch started, or where the CharRepeat ends now
    uint64_t rest;  // Alternatives: an AlternativeMask; GiveBack: where its min characters
                    // end; Failed: the last position of the failure
};

// Most bits a FailureMemo may take (16 MiB); past it, searches go without one.
constexpr size_t kMaxMemoBits = size_t{1} << 27;
// The steps per byte of text after which a FailureMemo is started (the patterns of
// tokenizers take 0.1 to 3.5 steps a byte on natural text).
constexpr size_t kStepsPerByteBeforeMemo = 32;

// The states (instruction, text position) known to lead to no match. Without it, the
// machine would scan the same text again from each start position (a*b over a long run of
// a's is quadratic, (a|aa)*c exponential); with it, each state fails at most once.
// - Sound because what follows a state depends on the state only: there are no
//   backreferences, no captures and no \G, and a lookahead looks at the text only.
// - So a state that failed fails again from any later start, in any search of the text.
// - Failures are recorded on the way back: a Failed Backtrack under the ways to go on from a
//   state is reached once they all failed.
// - Rows: each Branch, and each CharRepeat that may give characters back. The bit of a
//   CharRepeat at q says that ending it anywhere from q to where its run of characters
//   ends leads to no match, however many it has taken.
// - Recording costs time, so it starts only once the work exceeds kStepsPerByteBeforeMemo
//   per byte of text: the work stays linear, and most searches never need it.
// - One bit per row and text position; a text for which that is more than kMaxMemoBits is
//   searched without it, under the backtrack limit alone.
class FailureMemo {
public:
    // `bits` is working memory, passed in so that its allocation can be reused.
    explicit FailureMemo(std::vector<uint64_t>& bits) : bits_(bits) {}

    // Starts recording, with no state known to fail; stays off if it would be too large.
    void start(size_t rows, size_t text_size) {
        const size_t positions = text_size + 1;
        if (rows == 0 || rows > kMaxMemoBits / positions) return;
        row_words_ = (positions + kWordBits - 1) / kWordBits;
        bits_.assign(rows * row_words_, 0);
    }

    bool on() const { return row_words_ != 0; }

    bool failed(uint32_t row, size_t pos) const { return ahead(row, pos) & 1; }

    // The bits of `row` from `pos` (bit 0) to the end of their 64-bit word.
    uint64_t ahead(uint32_t row, size_t pos) const {
        return bits_[row * row_words_ + pos / kWordBits] >> (pos % kWordBits);
    }
    // The position where the word after that of `pos` starts.
    static size_t next_word(size_t pos) { return (pos / kWordBits + 1) * kWordBits; }

    void mark(uint32_t row, size_t first, size_t last) {
        for (size_t pos = first; pos <= last; ++pos)
            bits_[row * row_words_ + pos / kWordBits] |= uint64_t{1} << (pos % kWordBits);
    }

private:
    static constexpr size_t kWordBits = 64;
    std::vector<uint64_t>& bits_;
    size_t row_words_ = 0;  // 0: off
};

// Runs the program on one text, at one start position after another.
class Matcher {
public:
    // `stack` and `memo_bits` are working memory, passed in so that their allocations can be
    // reused.
    Matcher(const Regex::Program& program, std::string_view text, const std::string& pattern,
            size_t backtrack_limit, std::vector<Backtrack>& stack, std::vector<uint64_t>& memo_bits)
        : program_(program),
          text_(text),
          pattern_(pattern),
          backtrack_limit_(backtrack_limit),
          stack_(stack),
          memo_(memo_bits),
          memo_after_steps_(kStepsPerByteBeforeMemo * (text.size() + 1)) {}

    // The work so far: start positions tried, backtracking steps, and characters taken by
    // repeats (each step runs at most as many instructions as the program has).
    size_t steps() const { return steps_; }

    // The leftmost match that starts at or after `from`.
    std::optional<Regex::Match> search(size_t from) {
        for (size_t start = from;; start += char_at(start).length) {
            if (can_start_at(start)) {
                ++steps_;
                backtracks_ = 0;
                const size_t end = run(0, start);
                if (end != kNoMatch) return Regex::Match{start, end};
            }
            if (start == text_.size()) return std::nullopt;
        }
    }

private:
    static constexpr size_t kNoMatch = std::numeric_limits<size_t>::max();
    static constexpr size_t kNever = std::numeric_limits<size_t>::max();  // a position or count
    static constexpr size_t kMinStackSize = 64;

    Char char_at(size_t pos) const {
        const unsigned char lead = static_cast<unsigned char>(text_[pos]);
        if (lead < kAsciiEnd) return {lead, 1, GeneralCategory::Cc};
        const char32_t cp = unicode::decode_utf8(text_, pos);
        return {cp, uint32_t(unicode::utf8_length(lead)), unicode::general_category(cp)};
    }

    bool can_start_at(size_t pos) const {
        return program_.first == kAnyChar ||
               (pos < text_.size() && program_.sets[program_.first].contains(char_at(pos)));
    }

    void push(const Backtrack& backtrack) {
        if (depth_ == stack_.size()) stack_.resize(std::max(kMinStackSize, 2 * depth_));
        stack_[depth_++] = backtrack;
    }

    // The alternatives of `branch` that may begin at `pos`.
    AlternativeMask alternatives_at(const Branch& branch, size_t pos) const {
        if (pos == text_.size()) return branch.at_end;
        const unsigned char lead = static_cast<unsigned char>(text_[pos]);
        if (lead < kAsciiEnd) return branch.ascii[lead];
        const Char c = char_at(pos);
        AlternativeMask mask = 0;
        for (size_t i = 0; i < branch.alternatives.size(); ++i) {
            const uint32_t first = branch.alternatives[i].first;
            if (first == kAnyChar || program_.sets[first].contains(c))
                mask |= AlternativeMask{1} << i;
        }
        return mask;
    }

    bool holds(Anchor anchor, size_t pos) const {
        const size_t size = text_.size();
        switch (anchor) {
            case Anchor::LineStart:
                return pos == 0 || (text_[pos - 1] == '\n' && pos < size);
            case Anchor::LineEnd:
                return pos == size || text_[pos] == '\n';
            case Anchor::TextStart:
                return pos == 0;
            case Anchor::TextEnd:
                return pos == size;
            case Anchor::TextEndOrFinalNewline:
                return pos == size || (pos + 1 == size && text_[pos] == '\n');
        }
        return false;
    }

    // Goes on with the first of the alternatives `mask` of the Branch at `branch_pc`,
    // leaving a Backtrack for the others.
    uint32_t take_first(uint32_t branch_pc, AlternativeMask mask, size_t pos) {
        const Branch& branch = program_.branches[program_.code[branch_pc].arg];
        if (const AlternativeMask rest = mask & (mask - 1))
            push({branch_pc, Resume::Alternatives, pos, rest});
        return branch.alternatives[__builtin_ctzll(mask)].pc;
    }

    // CharRepeat: takes as many characters as it may, leaving a Backtrack to give them
    // back one at a time. False when fewer than min are there, or when the memo shows that
    // no way to end it leads to a match.
    bool repeat(const Instruction& instruction, uint32_t pc, size_t& pos) {
        const CharSet& set = program_.sets[instruction.arg];
        const bool memoized = memo_.on() && instruction.memo_row != kNoMemoRow;
        // The next position whose bit in the memo may be set (read a word at a time).
        size_t look_at = memoized ? pos : kNever;
        bool known_failed = false;  // stopped at a position where the memo says it fails
        size_t floor = pos;
        uint32_t count = 0;
        while (count < instruction.max && pos < text_.size()) {
            if (pos >= look_at) {
                const uint64_t ahead = memo_.ahead(instruction.memo_row, pos);
                known_failed = ahead & 1;
                if (known_failed) break;
                look_at = ahead ? pos + __builtin_ctzll(ahead) : FailureMemo::next_word(pos);
            }
            const Char c = char_at(pos);
            if (!set.contains(c)) break;
            pos += c.length;
            if (++count == instruction.min) floor = pos;
        }
        steps_ += count;
        if (count < instruction.min || (known_failed && pos == floor)) return false;
        if (memoized) push({pc, Resume::Failed, floor, pos});
        if (known_failed) pos = unicode::utf8_previous(text_, pos);
        if (pos > floor && !instruction.before_match) push({pc, Resume::GiveBack, pos, floor});
        return true;
    }

    // Marks the failure of a Branch at b.pos, or of a CharRepeat ending from b.pos to b.rest.
    void record_failure(const Backtrack& b) {
        const Instruction& instruction = program_.code[b.pc];
        const size_t end = b.rest;
        // A CharRepeat that stopped at its max count, with more of its characters after,
        // has not tried ending further on.
        if (instruction.op == Op::CharRepeat && end < text_.size() &&
            !memo_.failed(instruction.memo_row, end) &&
            program_.sets[instruction.arg].contains(char_at(end)))
            return;
        memo_.mark(instruction.memo_row, b.pos, end);
    }

    // Resumes the most recent Backtrack above `base`, recording the failures it passes;
    // false when there is none.
    bool backtrack(size_t base, uint32_t& pc, size_t& pos) {
        if (steps_ > memo_after_steps_) {
            memo_.start(program_.memo_rows, text_.size());
            memo_after_steps_ = kNever;
        }
        for (;;) {
            if (depth_ == base) return false;
            const Backtrack b = stack_[--depth_];
            if (b.resume == Resume::Failed) {
                record_failure(b);
                continue;
            }
            ++steps_;
            if (++backtracks_ > backtrack_limit_)
                throw Error("regex " + quoted(pattern_) + ": more than " +
                            std::to_string(backtrack_limit_) +
                            " backtracking steps to match at one position (Oniguruma's limit)");
            if (b.resume == Resume::GiveBack) {
                pos = unicode::utf8_previous(text_, b.pos);
                if (pos > b.rest) push({b.pc, Resume::GiveBack, pos, b.rest});
                pc = b.pc + 1;
            } else {
                pos = b.pos;
                pc = take_first(b.pc, b.rest, b.pos);
            }
            return true;
        }
    }

    // Runs the program from `pc` at `pos`: the end of the first match found, or kNoMatch.
    size_t run(uint32_t pc, size_t pos) {
        const size_t base = depth_;
        for (;;) {
            const Instruction& instruction = program_.code[pc];
            bool ok = true;
            switch (instruction.op) {
                case Op::Char:
                    if (pos < text_.size()) {
                        const Char c = char_at(pos);
                        ok = program_.sets[instruction.arg].contains(c);
                        pos += c.length;
                    } else {
                        ok = false;
                    }
                    ++pc;
                    break;
                case Op::CharRepeat:
                    ok = repeat(instruction, pc, pos);
                    ++pc;
                    break;
                case Op::Branch: {
                    const AlternativeMask mask =
                        alternatives_at(program_.branches[instruction.arg], pos);
                    if (memo_.on() && mask) {
                        if (memo_.failed(instruction.memo_row, pos)) {
                            ok = false;
                            break;
                        }
                        push({pc, Resume::Failed, pos, pos});
                    }
                    if (mask)
                        pc = take_first(pc, mask, pos);
                    else
                        ok = false;
                    break;
                }
                case Op::Jump:
                    pc = instruction.arg;
                    break;
                case Op::Assert:
                    ok = holds(instruction.anchor, pos);
                    ++pc;
                    break;
                case Op::LookAhead:
                    ok = (run(pc + 1, pos) != kNoMatch) != instruction.negative;
                    pc = instruction.arg;
                    break;
                case Op::Match:
                    depth_ = base;
                    return pos;
            }
            if (!ok && !backtrack(base, pc, pos)) return kNoMatch;
        }
    }

    const Regex::Program& program_;
    std::string_view text_;
    const std::string& pattern_;
    size_t backtrack_limit_;
    size_t backtracks_ = 0;
    std::vector<Backtrack>& stack_;  // its first depth_ entries are in use
    size_t depth_ = 0;
    FailureMemo memo_;
    size_t memo_after_steps_;  // the steps after which the memo starts
    size_t steps_ = 0;
};

}  // namespace

Regex::Regex(std::string_view pattern, size_t backtrack_limit)
    : pattern_(pattern), backtrack_limit_(backtrack_limit) {
    const Node root = Parser(pattern_).parse();
    auto program = std::make_unique<Program>();
    Compiler(*program, pattern_).compile(root);
    program_ = std::move(program);
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

std::vector<Regex::Match> Regex::find_all(std::string_view text) const {
    size_t steps = 0;
    return find_all(text, steps);
}

std::vector<Regex::Match> Regex::find_all(std::string_view text, size_t& steps) const {
    std::vector<Match> matches;
    thread_local std::vector<Backtrack> stack;  // reused: most texts are short
    thread_local std::vector<uint64_t> memo_bits;
    Matcher matcher(*program_, text, pattern_, backtrack_limit_, stack, memo_bits);
    size_t from = 0;
    while (const std::optional<Match> found = matcher.search(from)) {
        // The onig crate's find_iter does not take an empty match where the previous match
        // ended; it searches again from the next character.
        if (found->begin == found->end && !matches.empty() && matches.back().end == found->end) {
            if (from == text.size()) break;
            from += unicode::utf8_length(static_cast<unsigned char>(text[from]));
            continue;
        }
        matches.push_back(*found);
        from = found->end;
    }
    steps += matcher.steps();
    return matches;
}

}  // namespace barellm
