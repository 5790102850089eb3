// Pre-tokenizers (declared in pretokenize.h).
#include "tokenizer/pretokenize.h"

#include "tokenizer/text.h"

namespace barellm::tok {

namespace {

void split_and_emit(std::string_view piece, bool at_text_start, const SplitPattern& pattern,
                    SplitBehavior behavior, bool invert, const PieceSink& sink) {
    std::vector<Span> spans;
    pattern.find(piece, spans);
    if (invert)
        for (Span& s : spans) s.is_match = !s.is_match;
    for (const auto& [begin, end] : apply_split_behavior(spans, behavior))
        if (begin < end) sink(piece.substr(begin, end - begin), at_text_start && begin == 0);
}

// The pattern of GPT-2's pre-tokenizer, which ByteLevel splits with when use_regex is set.
const Regex& gpt2_regex() {
    static const Regex regex(
        R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
    return regex;
}

}  // namespace

void SequencePreTokenizer::split(std::string_view piece, bool at_text_start,
                                 const PieceSink& sink) const {
    split_from(0, piece, at_text_start, sink);
}

void SequencePreTokenizer::split_from(size_t step, std::string_view piece, bool at_text_start,
                                      const PieceSink& sink) const {
    if (step == steps_.size()) {
        sink(piece, at_text_start);
        return;
    }
    steps_[step]->split(piece, at_text_start, [&](std::string_view sub, bool sub_at_start) {
        split_from(step + 1, sub, sub_at_start, sink);
    });
}

void SplitPreTokenizer::split(std::string_view piece, bool at_text_start,
                              const PieceSink& sink) const {
    split_and_emit(piece, at_text_start, *pattern_, behavior_, invert_, sink);
}

std::array<char32_t, 256> byte_level_alphabet() {
    std::array<char32_t, 256> chars{};
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
        const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        chars[b] = printable ? char32_t(b) : next++;
    }
    return chars;
}

ByteLevelPreTokenizer::ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
    : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {
    const auto alphabet = byte_level_alphabet();
    for (int b = 0; b < 256; ++b) byte_chars_[b] = utf8_of(alphabet[b]);
}

void ByteLevelPreTokenizer::split(std::string_view piece, bool at_text_start,
                                  const PieceSink& sink) const {
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

void ByteLevelPreTokenizer::emit_mapped(std::string_view word, bool at_text_start,
                                        const PieceSink& sink) const {
    std::string mapped;
    mapped.reserve(word.size() * 2);
    for (char byte : word) mapped += byte_chars_[static_cast<unsigned char>(byte)];
    sink(mapped, at_text_start);
}

void MetaspacePreTokenizer::split(std::string_view piece, bool at_text_start,
                                  const PieceSink& sink) const {
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

}  // namespace barellm::tok
