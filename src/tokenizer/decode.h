// Decoders: turn the texts of token ids back into text (Replace, ByteFallback, Fuse, Strip,
// ByteLevel, Metaspace, and joining with spaces when there is no decoder).
// - Hugging Face decoders map the list of token strings to a new list (decode_chain); the
//   result is concatenated.
// - Here the list flows through the chain of stages as a stream of pieces, so that text can
//   come out as soon as it is final.
// - A piece is a token or part of one, and carries whether it starts and whether it ends
//   its token.
// - Stages that rewrite a token character by character work on pieces; stages that need a
//   whole token collect its pieces first (TokenAssembler).
// - decode() feeds whole tokens and gets exactly Hugging Face's result; the stream decoder
//   feeds the same stages one token at a time.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/pretokenize.h"

namespace barellm::tok {

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

// Makes a decoder's stage; `eager` for the stream decoder (see ByteFallbackStage).
using StageFactory = std::function<std::unique_ptr<DecodeStage>(bool eager)>;

// Collects the pieces of a token for stages that look at whole tokens.
class TokenAssembler {
public:
    // The whole token once `piece` ends it.
    std::optional<std::string> add(DecodePiece& piece);

private:
    std::string buffer_;
};

// Replace: every occurrence of the pattern in each token. A piece's end that may be the
// beginning of an occurrence waits for the rest of its token.
class ReplaceStage : public DecodeStage {
public:
    ReplaceStage(std::string pattern, std::string content)
        : pattern_(std::move(pattern)), content_(std::move(content)) {}
    void push(DecodePiece piece, DecodePieces& out) override;

private:
    size_t final_prefix_length(const std::string& text) const;
    std::string pattern_, content_, held_;
};

// ByteFallback: a run of consecutive <0xXX> tokens becomes
// - its bytes as one token, if they form valid UTF-8;
// - otherwise one U+FFFD token per byte of the run.
// `eager` (streaming) lets complete characters out before the run ends, and turns the bytes
// from the first invalid one on into U+FFFD at once.
class ByteFallbackStage : public DecodeStage {
public:
    explicit ByteFallbackStage(bool eager) : eager_(eager) {}
    void push(DecodePiece piece, DecodePieces& out) override;
    void finish(DecodePieces& out) override;

private:
    void emit_final_part(DecodePieces& out);
    void end_run(DecodePieces& out);
    void emit_replacements(DecodePieces& out);
    void close_open_token(DecodePieces& out);
    bool eager_;
    TokenAssembler assembler_;
    std::string pending_;  // bytes of the current run not yet let out
    bool open_ = false;    // part of the run went out as a token that has not ended yet
    bool broken_ = false;  // the run holds an invalid byte
};

// Fuse: all tokens become one.
class FuseStage : public DecodeStage {
public:
    void push(DecodePiece piece, DecodePieces& out) override;
    void finish(DecodePieces& out) override;

private:
    bool started_ = false;
};

// Strip: up to `start` leading and `stop` trailing `content` characters off each token.
// Trailing candidates wait until the token goes on or ends.
class StripStage : public DecodeStage {
public:
    StripStage(char32_t content, size_t start, size_t stop);
    void push(DecodePiece piece, DecodePieces& out) override;

private:
    char32_t content_;
    std::string content_utf8_;
    size_t start_, stop_;
    size_t leading_stripped_ = 0;
    bool leading_done_ = false;
    size_t held_ = 0;  // trailing content characters not let out yet
};

// ByteLevel:
// - each token's characters map back to bytes through GPT-2's alphabet (a token with a
//   character outside it contributes its own UTF-8 bytes);
// - all bytes together are read as UTF-8, invalid sequences replaced, into one token.
class ByteLevelStage : public DecodeStage {
public:
    ByteLevelStage();
    void push(DecodePiece piece, DecodePieces& out) override;
    void finish(DecodePieces& out) override;

private:
    void append_bytes(const std::string& token);
    std::unordered_map<char32_t, char> byte_of_char_;
    TokenAssembler assembler_;
    std::string pending_;  // bytes of a character not complete yet
    bool started_ = false;
};

// Metaspace: the replacement character becomes a space. In the first token Hugging Face
// drops every replacement character instead, unless the prepend scheme is "never".
class MetaspaceStage : public DecodeStage {
public:
    MetaspaceStage(char32_t replacement, PrependScheme scheme)
        : replacement_(replacement), scheme_(scheme) {}
    void push(DecodePiece piece, DecodePieces& out) override;

private:
    char32_t replacement_;
    PrependScheme scheme_;
    size_t tokens_started_ = 0;
};

// Without a decoder Hugging Face joins the tokens with spaces.
class JoinWithSpacesStage : public DecodeStage {
public:
    void push(DecodePiece piece, DecodePieces& out) override;

private:
    size_t tokens_started_ = 0;
};

}  // namespace barellm::tok
