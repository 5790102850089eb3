// Reading tokenizer.json (declared in load.h): each section of the document becomes the
// component that runs it. Anything the components cannot reproduce exactly is refused here.
#include "tokenizer/load.h"

#include <cstdint>
#include <utility>

#include "util/error.h"
#include "util/json.h"
#include "tokenizer/unicode.h"

namespace barellm::tok {

namespace {

using json = nlohmann::json;
using unicode::decode_utf8;
using unicode::is_valid_utf8;
using unicode::utf8_length;

std::string describe(const std::string& what) { return "tokenizer.json: " + what; }

// `where` is a C string: a std::string temporary argument would make gcc 13 suspect that the
// returned reference dangles (-Wdangling-reference).
const json& member(const json& node, const char* key, const char* where) {
    if (!node.is_object() || !node.contains(key))
        throw Error(describe(std::string(where) + " has no '" + key + "'"));
    return node.at(key);
}

std::string string_member(const json& node, const char* key, const std::string& where) {
    const json& value = member(node, key, where.c_str());
    if (!value.is_string()) throw Error(describe(where + " '" + key + "' is not a string"));
    return value.get<std::string>();
}

bool bool_member(const json& node, const char* key, bool fallback) {
    if (!node.contains(key) || node.at(key).is_null()) return fallback;
    if (!node.at(key).is_boolean())
        throw Error(describe(std::string("'") + key + "' is not true or false"));
    return node.at(key).get<bool>();
}

std::string type_of(const json& node, const std::string& where) {
    return string_member(node, "type", where);
}

char32_t single_character(const std::string& text, const std::string& where) {
    if (text.empty() || !is_valid_utf8(text) || utf8_length(text[0]) != text.size())
        throw Error(describe(where + " " + quoted_excerpt(text) + " is not a single character"));
    return decode_utf8(text, 0);
}

// A {"String": ...} pattern's text; {"Regex": ...} is refused.
std::string literal_pattern(const json& node, const std::string& where) {
    const json& pattern = member(node, "pattern", where.c_str());
    if (pattern.is_object() && pattern.contains("String"))
        return string_member(pattern, "String", where);
    if (pattern.is_object() && pattern.contains("Regex"))
        throw Error(describe(where + " with Regex pattern " +
                             quoted_excerpt(string_member(pattern, "Regex", where)) +
                             " is not supported"));
    throw Error(describe(where + " has a pattern that is neither String nor Regex"));
}

std::unique_ptr<Normalizer> parse_normalizer(const json& node) {
    if (node.is_null()) return nullptr;
    const std::string type = type_of(node, "normalizer");
    if (type == "Sequence") {
        std::vector<std::unique_ptr<Normalizer>> steps;
        for (const json& child : member(node, "normalizers", "normalizer Sequence"))
            if (auto step = parse_normalizer(child)) steps.push_back(std::move(step));
        return std::make_unique<SequenceNormalizer>(std::move(steps));
    }
    if (type == "Prepend")
        return std::make_unique<PrependNormalizer>(
            string_member(node, "prepend", "normalizer Prepend"));
    if (type == "Replace")
        return std::make_unique<ReplaceNormalizer>(
            literal_pattern(node, "normalizer Replace"),
            string_member(node, "content", "normalizer Replace"));
    if (type == "NFC") return std::make_unique<NfcNormalizer>();
    throw Error(describe("normalizer type " + quoted_excerpt(type) + " is not supported"));
}

SplitBehavior parse_split_behavior(const std::string& name) {
    if (name == "Removed") return SplitBehavior::Removed;
    if (name == "Isolated") return SplitBehavior::Isolated;
    if (name == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
    if (name == "MergedWithNext") return SplitBehavior::MergedWithNext;
    if (name == "Contiguous") return SplitBehavior::Contiguous;
    throw Error(describe("Split behavior " + quoted_excerpt(name) + " is not supported"));
}

std::unique_ptr<SplitPattern> parse_split_pattern(const json& node) {
    const json& pattern = member(node, "pattern", "pre_tokenizer Split");
    if (pattern.is_object() && pattern.contains("Regex")) {
        const std::string regex = string_member(pattern, "Regex", "pre_tokenizer Split");
        try {
            return std::make_unique<RegexPattern>(Regex(regex));
        } catch (const Error& e) {  // "regex '...' is not supported: <the construct>"
            throw Error(describe(std::string("pre_tokenizer Split ") + e.what()));
        }
    }
    return std::make_unique<LiteralPattern>(literal_pattern(node, "pre_tokenizer Split"));
}

// prepend_scheme, or the older add_prefix_space (true meaning "always").
PrependScheme parse_prepend_scheme(const json& node, const std::string& where) {
    if (!node.contains("prepend_scheme"))
        return bool_member(node, "add_prefix_space", true) ? PrependScheme::Always
                                                           : PrependScheme::Never;
    const std::string scheme = string_member(node, "prepend_scheme", where);
    if (scheme == "always") return PrependScheme::Always;
    if (scheme == "never") return PrependScheme::Never;
    if (scheme == "first") return PrependScheme::First;
    throw Error(
        describe(where + " prepend_scheme " + quoted_excerpt(scheme) + " is not supported"));
}

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const json& node) {
    if (node.is_null()) return nullptr;
    const std::string type = type_of(node, "pre_tokenizer");
    if (type == "Sequence") {
        std::vector<std::unique_ptr<PreTokenizer>> steps;
        for (const json& child : member(node, "pretokenizers", "pre_tokenizer Sequence"))
            if (auto step = parse_pre_tokenizer(child)) steps.push_back(std::move(step));
        return std::make_unique<SequencePreTokenizer>(std::move(steps));
    }
    if (type == "ByteLevel")
        return std::make_unique<ByteLevelPreTokenizer>(bool_member(node, "add_prefix_space", true),
                                                       bool_member(node, "use_regex", true));
    if (type == "Digits") {
        // Digits splits on each numeric character: Isolated, or Contiguous to keep runs.
        const bool individual = bool_member(node, "individual_digits", false);
        return std::make_unique<SplitPreTokenizer>(
            std::make_unique<NumericCharPattern>(),
            individual ? SplitBehavior::Isolated : SplitBehavior::Contiguous, false);
    }
    if (type == "Split")
        return std::make_unique<SplitPreTokenizer>(
            parse_split_pattern(node),
            parse_split_behavior(string_member(node, "behavior", "pre_tokenizer Split")),
            bool_member(node, "invert", false));
    if (type == "Metaspace") {
        const std::string replacement =
            string_member(node, "replacement", "pre_tokenizer Metaspace");
        single_character(replacement, "pre_tokenizer Metaspace replacement");
        return std::make_unique<MetaspacePreTokenizer>(
            replacement, parse_prepend_scheme(node, "pre_tokenizer Metaspace"),
            bool_member(node, "split", true));
    }
    throw Error(describe("pre_tokenizer type " + quoted_excerpt(type) + " is not supported"));
}

size_t count_member(const json& node, const char* key, const std::string& where) {
    const json& value = member(node, key, where.c_str());
    if (!value.is_number_unsigned()) throw Error(describe(where + " '" + key + "' is not a count"));
    return value.get<size_t>();
}

void parse_decoder(const json& node, std::vector<StageFactory>& stages) {
    const std::string type = type_of(node, "decoder");
    if (type == "Sequence") {
        for (const json& child : member(node, "decoders", "decoder Sequence"))
            if (!child.is_null()) parse_decoder(child, stages);
    } else if (type == "Replace") {
        std::string pattern = literal_pattern(node, "decoder Replace");
        std::string content = string_member(node, "content", "decoder Replace");
        stages.push_back(
            [pattern, content](bool) { return std::make_unique<ReplaceStage>(pattern, content); });
    } else if (type == "ByteFallback") {
        stages.push_back([](bool eager) { return std::make_unique<ByteFallbackStage>(eager); });
    } else if (type == "Fuse") {
        stages.push_back([](bool) { return std::make_unique<FuseStage>(); });
    } else if (type == "Strip") {
        const char32_t content = single_character(string_member(node, "content", "decoder Strip"),
                                                  "decoder Strip content");
        const size_t start = count_member(node, "start", "decoder Strip");
        const size_t stop = count_member(node, "stop", "decoder Strip");
        stages.push_back([=](bool) { return std::make_unique<StripStage>(content, start, stop); });
    } else if (type == "ByteLevel") {
        stages.push_back([](bool) { return std::make_unique<ByteLevelStage>(); });
    } else if (type == "Metaspace") {
        const char32_t replacement =
            single_character(string_member(node, "replacement", "decoder Metaspace"),
                             "decoder Metaspace replacement");
        const PrependScheme scheme = parse_prepend_scheme(node, "decoder Metaspace");
        stages.push_back(
            [=](bool) { return std::make_unique<MetaspaceStage>(replacement, scheme); });
    } else {
        throw Error(describe("decoder type " + quoted_excerpt(type) + " is not supported"));
    }
}

// "a b" (exactly one space) or ["a", "b"].
std::pair<std::string, std::string> parse_merge(const json& merge, size_t rank) {
    if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string())
        return {merge[0].get<std::string>(), merge[1].get<std::string>()};
    if (merge.is_string()) {
        const std::string text = merge.get<std::string>();
        const size_t space = text.find(' ');
        if (space != std::string::npos && text.find(' ', space + 1) == std::string::npos)
            return {text.substr(0, space), text.substr(space + 1)};
    }
    throw Error(describe("merge " + std::to_string(rank + 1) + " (" + json_excerpt(merge) +
                         ") is not a pair of tokens"));
}

bool is_unset(const json& model, const char* key) {
    return !model.contains(key) || model.at(key).is_null() ||
           (model.at(key).is_string() && model.at(key).get<std::string>().empty());
}

// "<what> has id N, outside the vocabulary of `id_limit` ids".
std::string id_outside(const std::string& what, uint64_t id, int id_limit) {
    return describe(what + " has id " + std::to_string(id) + ", outside the vocabulary of " +
                    std::to_string(id_limit) + " ids");
}

void parse_model(const json& node, int id_limit, BpeModel& model) {
    const std::string type = node.contains("type") ? type_of(node, "model") : "BPE";
    if (type != "BPE")
        throw Error(describe("model type " + quoted_excerpt(type) + " is not supported"));
    for (const char* option : {"continuing_subword_prefix", "end_of_word_suffix"})
        if (!is_unset(node, option))
            throw Error(describe(std::string("BPE option ") + option + " is not supported"));
    if (node.contains("dropout") && !node.at("dropout").is_null() &&
        node.at("dropout").get<double>() != 0.0)
        throw Error(describe("BPE dropout is not supported"));
    model.byte_fallback = bool_member(node, "byte_fallback", false);
    model.fuse_unk = bool_member(node, "fuse_unk", false);
    model.ignore_merges = bool_member(node, "ignore_merges", false);
    if (!is_unset(node, "unk_token")) model.unk_token = string_member(node, "unk_token", "model");

    const json& vocab = member(node, "vocab", "model");
    if (!vocab.is_object()) throw Error(describe("model vocab is not an object"));
    model.vocab.reserve(vocab.size());
    for (const auto& [text, id] : vocab.items()) {
        if (!id.is_number_unsigned())
            throw Error(describe("vocab entry " + quoted_excerpt(text) + " has an invalid id"));
        if (id.get<uint64_t>() >= uint64_t(id_limit))
            throw Error(
                id_outside("vocab entry " + quoted_excerpt(text), id.get<uint64_t>(), id_limit));
        model.vocab.emplace(text, id.get<int>());
    }
    model.index_vocab();
    const json& merges = member(node, "merges", "model");
    if (!merges.is_array()) throw Error(describe("model merges is not a list"));
    for (size_t rank = 0; rank < merges.size(); ++rank) {
        const auto [left, right] = parse_merge(merges[rank], rank);
        model.add_merge(left, right, uint32_t(rank));
    }
}

AddedToken parse_added_token(const json& node) {
    AddedToken token;
    token.content = string_member(node, "content", "added token");
    token.special = bool_member(node, "special", false);
    token.single_word = bool_member(node, "single_word", false);
    token.lstrip = bool_member(node, "lstrip", false);
    token.rstrip = bool_member(node, "rstrip", false);
    token.normalized = bool_member(node, "normalized", !token.special);
    return token;
}

}  // namespace

Components load_components(const std::string& tokenizer_json, int id_limit) {
    const json root = parse_json(tokenizer_json, "tokenizer.json");
    if (!root.is_object()) throw Error(describe("not a JSON object"));
    Components parts;
    try {
        parse_model(member(root, "model", "tokenizer"), id_limit, parts.model);
        parts.normalizer = parse_normalizer(root.value("normalizer", json()));
        parts.pre_tokenizer = parse_pre_tokenizer(root.value("pre_tokenizer", json()));
        const json decoder = root.value("decoder", json());
        if (!decoder.is_null()) parse_decoder(decoder, parts.decoder);
        for (const json& token : root.value("added_tokens", json::array()))
            parts.added.add(parse_added_token(token), parts.model);
        // Added tokens outside the vocabulary take the ids after it.
        for (const AddedToken& token : parts.added.tokens())
            if (token.id >= id_limit)
                throw Error(id_outside("added token " + quoted_excerpt(token.content),
                                       uint64_t(token.id), id_limit));
        parts.added.build_matchers(parts.normalizer.get());
    } catch (const json::exception& e) {
        throw Error(describe(std::string("unexpected content (") + e.what() + ")"));
    }
    return parts;
}

}  // namespace barellm::tok
