// Added tokens (declared in added_tokens.h): matching them in the text as Hugging Face's
// AddedVocabulary does.
#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/bpe.h"
#include "tokenizer/normalize.h"
#include "tokenizer/unicode.h"

namespace barellm::tok {

namespace {

using unicode::decode_utf8;
using unicode::is_white_space;

// Rust regex's `\w` (used by added tokens' single_word): Alphabetic, marks, decimal numbers,
// connector punctuation and the two join controls. Alphabetic is approximated by letters and
// letter numbers (it also holds a few symbols, such as circled letters).
bool is_word_character(char32_t cp) {
    using unicode::GeneralCategory;
    const GeneralCategory c = unicode::general_category(cp);
    return unicode::is_letter(c) || unicode::is_mark(c) || c == GeneralCategory::Nd ||
           c == GeneralCategory::Nl || c == GeneralCategory::Pc || cp == 0x200C || cp == 0x200D;
}

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
        begin += unicode::utf8_length(text[begin]);
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

}  // namespace

void TokenTrie::add(std::string_view text, int token_index) {
    int node = 0;
    for (char c : text) {
        const int child = child_of(node, static_cast<unsigned char>(c));
        if (child >= 0) {
            node = child;
            continue;
        }
        nodes_.push_back({});
        nodes_[node].children.emplace_back(static_cast<unsigned char>(c), int(nodes_.size() - 1));
        node = int(nodes_.size() - 1);
    }
    // Of two tokens with the same text, the first added wins (lowest pattern index).
    if (nodes_[node].token_index < 0) nodes_[node].token_index = token_index;
    first_bytes_[static_cast<unsigned char>(text[0])] = true;
}

std::pair<size_t, int> TokenTrie::longest_at(std::string_view text, size_t pos) const {
    std::pair<size_t, int> best{0, -1};
    int node = 0;
    for (size_t i = pos; i < text.size(); ++i) {
        node = child_of(node, static_cast<unsigned char>(text[i]));
        if (node < 0) break;
        if (nodes_[node].token_index >= 0) best = {i + 1 - pos, nodes_[node].token_index};
    }
    return best;
}

int TokenTrie::child_of(int node, unsigned char byte) const {
    for (const auto& [b, child] : nodes_[node].children)
        if (b == byte) return child;
    return -1;
}

void AddedVocabulary::add(AddedToken token, const BpeModel& model) {
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

void AddedVocabulary::build_matchers(const Normalizer* normalizer) {
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

void AddedVocabulary::split_raw(std::string_view text, bool parse_special,
                                const AddedSplitSink& sink) const {
    split(text, raw_trie_, parse_special, sink);
}

void AddedVocabulary::split_normalized(std::string_view text, bool parse_special,
                                       const AddedSplitSink& sink) const {
    split(text, normalized_trie_, parse_special, sink);
}

// Hugging Face's find_matches:
// - leftmost-longest matches, scanning on from the end of each (also of one it then
//   discards);
// - single_word tokens need non-word characters around them;
// - lstrip/rstrip tokens swallow the white space beside them.
void AddedVocabulary::split(std::string_view text, const TokenTrie& trie, bool parse_special,
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

}  // namespace barellm::tok
