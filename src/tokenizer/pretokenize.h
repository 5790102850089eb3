// Pre-tokenizers: split normalized text into the words that BPE encodes one at a time
// (Sequence, Split, Digits, ByteLevel, Metaspace).
#pragma once
#include <array>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/split.h"

namespace barellm::tok {

// Receives each piece a pre-tokenizer produces and whether it begins the original text.
using PieceSink = std::function<void(std::string_view piece, bool at_text_start)>;

class PreTokenizer {
public:
    virtual ~PreTokenizer() = default;
    // Splits a non-empty piece; `sink` receives only non-empty pieces.
    virtual void split(std::string_view piece, bool at_text_start, const PieceSink& sink) const = 0;
};

// Each step splits the pieces of the step before.
class SequencePreTokenizer : public PreTokenizer {
public:
    explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
        : steps_(std::move(steps)) {}
    void split(std::string_view piece, bool at_text_start, const PieceSink& sink) const override;

private:
    void split_from(size_t step, std::string_view piece, bool at_text_start,
                    const PieceSink& sink) const;
    std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

// Split, and Digits (a split on each numeric character).
class SplitPreTokenizer : public PreTokenizer {
public:
    SplitPreTokenizer(std::unique_ptr<SplitPattern> pattern, SplitBehavior behavior, bool invert)
        : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
    void split(std::string_view piece, bool at_text_start, const PieceSink& sink) const override;

private:
    std::unique_ptr<SplitPattern> pattern_;
    SplitBehavior behavior_;
    bool invert_;
};

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other bytes
// for U+0100 upwards in byte order, so that every byte is a visible character.
std::array<char32_t, 256> byte_level_alphabet();

// ByteLevel: splits with GPT-2's pattern (if use_regex), then writes each byte of a word as
// its character of byte_level_alphabet().
class ByteLevelPreTokenizer : public PreTokenizer {
public:
    ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex);
    void split(std::string_view piece, bool at_text_start, const PieceSink& sink) const override;

private:
    void emit_mapped(std::string_view word, bool at_text_start, const PieceSink& sink) const;
    bool add_prefix_space_, use_regex_;
    std::array<std::string, 256> byte_chars_;
};

// Where Metaspace puts a replacement character before the text.
enum class PrependScheme { Always, Never, First };

// Metaspace:
// - spaces become the replacement character;
// - the replacement is prepended ("always", or "first": only to the piece that begins the
//   original text);
// - then each replacement starts a new piece (split on it with MergedWithNext).
class MetaspacePreTokenizer : public PreTokenizer {
public:
    MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
        : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
    void split(std::string_view piece, bool at_text_start, const PieceSink& sink) const override;

private:
    std::string replacement_;
    PrependScheme scheme_;
    bool split_;
};

}  // namespace barellm::tok
