// The Tokenizer and StreamDecoder of tokenizer.h, running the components of this folder:
//   encode: text -> split on added tokens -> normalize each piece -> split on normalized
//           added tokens -> pre-tokenize into words -> BPE each word -> ids
//   decode: ids -> token texts -> the decoder's stages (decode.h) -> text
// README.md maps the files.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <utility>

#include "util/error.h"
#include "tokenizer/load.h"
#include "tokenizer/text.h"

namespace barellm {

using tok::AddedToken;
using tok::DecodePiece;
using tok::DecodePieces;

// The loaded components, and the text of each id for decoding.
struct Tokenizer::Impl : tok::Components {
    std::vector<std::string> texts;  // by id ("" where an id has no token)
    std::vector<bool> has_text;
    std::vector<bool> special;

    explicit Impl(tok::Components components) : Components(std::move(components)) { index_ids(); }

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
        tok::EncodeScratch scratch;
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

// The decoder's stages, fed one token text at a time.
struct StreamDecoder::Pipeline {
    std::vector<std::unique_ptr<tok::DecodeStage>> stages;

    Pipeline(const Tokenizer::Impl& impl, bool eager) {
        for (const tok::StageFactory& make : impl.decoder) stages.push_back(make(eager));
        if (stages.empty()) stages.push_back(std::make_unique<tok::JoinWithSpacesStage>());
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

// ============================================================================ Tokenizer

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::from_json(const std::string& tokenizer_json, int id_limit) {
    return Tokenizer(std::make_shared<Impl>(tok::load_components(tokenizer_json, id_limit)));
}

std::vector<int> Tokenizer::encode(std::string_view text, bool parse_special) const {
    tok::require_valid_utf8(text);
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
