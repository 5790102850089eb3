// Added tokens (special tokens such as <s>, and others the tokenizer.json lists): found in
// the text before anything else runs, and given their own ids.
#pragma once
#include <array>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace barellm::tok {

class BpeModel;
class Normalizer;

struct AddedToken {
    std::string content;
    // The token's text for decoding: the content, normalized if the token is `normalized`
    // (Hugging Face's id_to_token gives the normalized form, which decode() then uses).
    std::string text;
    int id = -1;
    bool single_word = false;
    bool lstrip = false;
    bool rstrip = false;
    bool normalized = false;
    bool special = false;
};

// Byte trie over token texts answering "which is the longest token starting here".
class TokenTrie {
public:
    void add(std::string_view text, int token_index);
    bool may_start_at(unsigned char byte) const { return first_bytes_[byte]; }
    // The longest token that starts at text[pos]: (length, token index), length 0 if none.
    std::pair<size_t, int> longest_at(std::string_view text, size_t pos) const;

private:
    struct Node {
        std::vector<std::pair<unsigned char, int>> children;
        int token_index = -1;
    };
    int child_of(int node, unsigned char byte) const;
    std::vector<Node> nodes_{Node{}};
    std::array<bool, 256> first_bytes_{};
};

// Receives each piece of a text split on added tokens: the piece, its offset, and the
// added token it is (nullptr for the text between tokens).
using AddedSplitSink =
    std::function<void(std::string_view piece, size_t offset, const AddedToken*)>;

class AddedVocabulary {
public:
    // Hugging Face's AddedVocabulary::add_tokens. A token keeps the id it already has in the
    // added tokens or the model vocabulary. A new one gets the next id after the model's
    // vocabulary and the added tokens so far (the id written in tokenizer.json is ignored).
    void add(AddedToken token, const BpeModel& model);

    // Hugging Face's refresh_added_tokens: special tokens first, then the others. Tokens
    // marked `normalized` are matched in normalized text, by their normalized form.
    void build_matchers(const Normalizer* normalizer);

    const std::vector<AddedToken>& tokens() const { return tokens_; }
    bool is_special_content(const std::string& content) const {
        return special_contents_.count(content) != 0;
    }

    // Splits text on the tokens that are not `normalized` (before the normalizer runs).
    void split_raw(std::string_view text, bool parse_special, const AddedSplitSink& sink) const;
    // Splits normalized text on the `normalized` tokens.
    void split_normalized(std::string_view text, bool parse_special,
                          const AddedSplitSink& sink) const;

private:
    void split(std::string_view text, const TokenTrie& trie, bool parse_special,
               const AddedSplitSink& sink) const;

    std::vector<AddedToken> tokens_;
    std::unordered_map<std::string, size_t> index_by_content_;
    std::unordered_set<std::string> special_contents_;
    int max_id_ = -1;
    TokenTrie raw_trie_, normalized_trie_;
};

}  // namespace barellm::tok
