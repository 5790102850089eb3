// Hugging Face tokenizer.json, run natively. Encoding and decoding reproduce the output of
// the `tokenizers` library for the features below; any other feature is refused when the
// tokenizer is loaded, with an Error that names it.
//   model:          BPE (merges by rank, byte_fallback, unk_token/fuse_unk, ignore_merges)
//   normalizer:     Sequence, Prepend, Replace (string pattern), NFC
//   pre_tokenizer:  Sequence, ByteLevel, Digits, Metaspace, Split (string patterns, and
//                   regular expressions in the part of Oniguruma's syntax regex.h lists)
//   added_tokens:   matched in the raw text (or the normalized text for `normalized` ones)
//                   with lstrip/rstrip/single_word
//   decoder:        Sequence, Replace, ByteFallback, Fuse, Strip, ByteLevel, Metaspace
// The post-processor (BOS/EOS templates), truncation and padding are not applied: encode()
// returns the ids of the text alone.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace barellm {

class Tokenizer {
public:
    // The most ids a tokenizer may have when no model bounds them, and the largest vocab_size
    // a model may declare (src/weights/config.cpp): above any real vocabulary.
    static constexpr int kMaxVocabSize = 1 << 22;

    // Parses a tokenizer.json document. Throws Error naming any unsupported feature, and any
    // id that is not below `id_limit` (a model's vocab_size, where the model is known).
    static Tokenizer from_json(const std::string& tokenizer_json, int id_limit = kMaxVocabSize);

    // The ids of `text` (UTF-8; throws Error if it is not), without BOS/EOS. With
    // `parse_special` false, special added tokens in the text are tokenized as plain text
    // (Hugging Face's `encode_special_tokens = True`).
    std::vector<int> encode(std::string_view text, bool parse_special = true) const;

    // The text of `ids`, equal to Hugging Face `Tokenizer.decode(ids, skip_special_tokens)`.
    // Ids with no token are skipped, as Hugging Face does.
    std::string decode(const std::vector<int>& ids, bool skip_special = false) const;

    int vocab_size() const;  // largest id + 1
    std::optional<int> token_id(std::string_view token) const;
    const std::string& token_text(int id) const;  // throws Error for an id with no token
    bool is_special(int id) const;

    struct Impl;  // defined in tokenizer.cpp

private:
    explicit Tokenizer(std::shared_ptr<const Impl> impl);
    std::shared_ptr<const Impl> impl_;
    friend class StreamDecoder;
};

// Turns ids into text as they arrive. Everything returned is complete UTF-8: bytes of a
// character split across tokens are held until the character is complete, and bytes that
// cannot form one become U+FFFD. The concatenation of all push() results and flush() equals
// tokenizer.decode(all ids, skip_special), with one exception: a run of byte-fallback
// tokens that holds valid characters and later an invalid byte. Hugging Face then turns
// the whole run into U+FFFD, one per byte, while the stream has already shown the valid
// characters.
class StreamDecoder {
public:
    explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false);
    ~StreamDecoder();
    StreamDecoder(StreamDecoder&&) noexcept;
    StreamDecoder& operator=(StreamDecoder&&) noexcept;

    std::string push(int id);  // the text completed by this id
    std::string flush();       // what is left at the end; the decoder then starts afresh

    struct Pipeline;  // defined in tokenizer.cpp

private:
    std::shared_ptr<const Tokenizer::Impl> impl_;
    bool skip_special_;
    std::unique_ptr<Pipeline> pipeline_;
};

}  // namespace barellm
