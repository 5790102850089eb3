// Decoder stages (declared in decode.h).
#include "tokenizer/decode.h"

#include "tokenizer/text.h"
#include "tokenizer/unicode.h"

namespace barellm::tok {

namespace {

using unicode::decode_utf8;
using unicode::utf8_length;

// "<0xAB>", as Hugging Face reads it:
// - length 6, with "<0x" and ">" around;
// - the middle parsed by u8::from_str_radix, which also takes a leading '+' ("<0x+A>" is
//   byte 0x0A).
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

}  // namespace

std::optional<std::string> TokenAssembler::add(DecodePiece& piece) {
    if (piece.starts_token) buffer_.clear();
    buffer_ += piece.text;
    if (!piece.ends_token) return std::nullopt;
    return std::exchange(buffer_, {});
}

// ============================================================================ Replace

void ReplaceStage::push(DecodePiece piece, DecodePieces& out) {
    std::string text = std::exchange(held_, {}) + piece.text;
    if (!piece.ends_token) {
        const size_t keep = final_prefix_length(text);
        held_ = text.substr(keep);
        text.resize(keep);
    }
    out.push_back({replace_all(text, pattern_, content_), piece.starts_token, piece.ends_token});
}

// Length of the prefix of `text` whose replacement no continuation can change: up to where a
// proper prefix of the pattern runs to the end, after the last occurrence.
size_t ReplaceStage::final_prefix_length(const std::string& text) const {
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

// ============================================================================ ByteFallback

void ByteFallbackStage::push(DecodePiece piece, DecodePieces& out) {
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

void ByteFallbackStage::finish(DecodePieces& out) { end_run(out); }

void ByteFallbackStage::emit_final_part(DecodePieces& out) {
    size_t complete = 0;
    while (!broken_ && complete < pending_.size()) {
        const unicode::Utf8Scan scan = unicode::scan_utf8(pending_, complete);
        if (scan.status == unicode::Utf8Status::Truncated) break;
        if (scan.status == unicode::Utf8Status::Invalid)
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

void ByteFallbackStage::end_run(DecodePieces& out) {
    if (!pending_.empty() && !broken_ && unicode::is_valid_utf8(pending_)) {
        out.push_back({std::exchange(pending_, {}), !open_, true});
        open_ = false;
    }
    emit_replacements(out);
    close_open_token(out);
    broken_ = false;
}

void ByteFallbackStage::emit_replacements(DecodePieces& out) {
    if (pending_.empty()) return;
    close_open_token(out);
    for (size_t i = 0; i < pending_.size(); ++i)
        out.push_back({utf8_of(kReplacementCharacter), true, true});
    pending_.clear();
}

void ByteFallbackStage::close_open_token(DecodePieces& out) {
    if (open_) out.push_back({"", false, true});
    open_ = false;
}

// ============================================================================ Fuse

void FuseStage::push(DecodePiece piece, DecodePieces& out) {
    out.push_back({std::move(piece.text), !started_, false});
    started_ = true;
}

void FuseStage::finish(DecodePieces& out) { out.push_back({"", !started_, true}); }

// ============================================================================ Strip

StripStage::StripStage(char32_t content, size_t start, size_t stop)
    : content_(content), content_utf8_(utf8_of(content)), start_(start), stop_(stop) {}

void StripStage::push(DecodePiece piece, DecodePieces& out) {
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

// ============================================================================ ByteLevel

ByteLevelStage::ByteLevelStage() {
    const auto alphabet = byte_level_alphabet();
    for (int b = 0; b < 256; ++b) byte_of_char_.emplace(alphabet[b], char(b));
}

void ByteLevelStage::push(DecodePiece piece, DecodePieces& out) {
    std::optional<std::string> token = assembler_.add(piece);
    if (!token) return;
    append_bytes(*token);
    std::string text;
    pending_.erase(0, append_lossy_utf8(pending_, text, false));
    if (text.empty()) return;
    out.push_back({std::move(text), !started_, false});
    started_ = true;
}

void ByteLevelStage::finish(DecodePieces& out) {
    std::string text;
    append_lossy_utf8(pending_, text, true);
    out.push_back({std::move(text), !started_, true});
}

void ByteLevelStage::append_bytes(const std::string& token) {
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

// ============================================================================ Metaspace

void MetaspaceStage::push(DecodePiece piece, DecodePieces& out) {
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

// ============================================================================ No decoder

void JoinWithSpacesStage::push(DecodePiece piece, DecodePieces& out) {
    if (piece.starts_token && tokens_started_++ > 0) piece.text.insert(0, " ");
    out.push_back(std::move(piece));
}

}  // namespace barellm::tok
