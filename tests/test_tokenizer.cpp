// Unit tests of the tokenizer on small hand-written tokenizer.json documents whose ids are
// worked out by hand. Parity with Hugging Face on real tokenizers is tested by
// tests/test_tokenizer_parity.py.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "util/error.h"
#include "tokenizer/tokenizer.h"

using barellm::Error;
using barellm::StreamDecoder;
using barellm::Tokenizer;
using json = nlohmann::json;
using Ids = std::vector<int>;

namespace {

const std::string kSpaceMarker = "\xE2\x96\x81";  // U+2581

// Letters a-d, some merges of them, bytes 0xC3/0xA9/0xE4/0xB8/0xAD as <0xXX> tokens, an
// unknown token and a special token. Merge ranks: "b c" 0, "a b" 1, "c d" 2, "a bc" 3,
// "bc d" 4.
json tiny_tokenizer() {
    json vocab = {{"<unk>", 0},   {"<s>", 1},     {"a", 2},          {"b", 3},       {"c", 4},
                  {"d", 5},       {"ab", 6},      {"bc", 7},         {"cd", 8},      {"abc", 9},
                  {"bcd", 10},    {"da", 11},     {"<0xC3>", 12},    {"<0xA9>", 13}, {"<0xE4>", 14},
                  {"<0xB8>", 15}, {"<0xAD>", 16}, {kSpaceMarker, 17}};
    return {
        {"version", "1.0"},
        {"added_tokens",
         {{{"id", 1},
           {"content", "<s>"},
           {"single_word", false},
           {"lstrip", false},
           {"rstrip", false},
           {"normalized", false},
           {"special", true}}}},
        {"normalizer", nullptr},
        {"pre_tokenizer", nullptr},
        {"decoder",
         {{"type", "Sequence"},
          {"decoders",
           {{{"type", "Replace"}, {"pattern", {{"String", kSpaceMarker}}}, {"content", " "}},
            {{"type", "ByteFallback"}},
            {{"type", "Fuse"}},
            {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
        {"model",
         {{"type", "BPE"},
          {"unk_token", "<unk>"},
          {"fuse_unk", true},
          {"byte_fallback", true},
          {"vocab", vocab},
          {"merges", {"b c", "a b", "c d", "a bc", "bc d"}}}},
    };
}

Tokenizer load(const json& document) { return Tokenizer::from_json(document.dump()); }

// The error message of loading `document`, or "" if it loads.
std::string load_error(const json& document) {
    try {
        load(document);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// A byte-level style vocabulary of the digits 1-4 and their runs "12", "123", "1234".
json digits_tokenizer(const std::string& split_regex) {
    json document = tiny_tokenizer();
    document["model"]["vocab"] = {{"1", 0},  {"2", 1},   {"3", 2},   {"4", 3},
                                  {"12", 4}, {"123", 5}, {"1234", 6}};
    document["model"]["merges"] = {"1 2", "12 3", "123 4"};
    document["model"]["unk_token"] = nullptr;
    document["added_tokens"] = json::array();
    document["pre_tokenizer"] = {{"type", "Split"},
                                 {"pattern", {{"Regex", split_regex}}},
                                 {"behavior", "Isolated"},
                                 {"invert", false}};
    return document;
}

const std::string kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const std::string kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const std::string kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string stream_all(const Tokenizer& tokenizer, const Ids& ids, bool skip_special = false) {
    StreamDecoder decoder(tokenizer, skip_special);
    std::string text;
    for (int id : ids) text += decoder.push(id);
    return text + decoder.flush();
}

}  // namespace

TEST_CASE("BPE applies merges by rank, leftmost first on ties", "[tokenizer]") {
    const Tokenizer tokenizer = load(tiny_tokenizer());
    // "b c" (rank 0) beats "a b" (rank 1); then "a bc" (3) beats "bc d" (4).
    CHECK(tokenizer.encode("abcd") == Ids{9, 5});
    // Equal ranks merge left to right: "ab ab", "bc bc".
    CHECK(tokenizer.encode("abab") == Ids{6, 6});
    CHECK(tokenizer.encode("bcbc") == Ids{7, 7});
    // "c d" (rank 2) loses to "b c" (0), then "bc d" (4) applies.
    CHECK(tokenizer.encode("bcd") == Ids{10});
    CHECK(tokenizer.encode("da") == Ids{5, 2});
    CHECK(tokenizer.encode("").empty());
}

TEST_CASE("merges may be written as [left, right] lists", "[tokenizer]") {
    json document = tiny_tokenizer();
    // nlohmann reads a braced list of pairs as an object: build the arrays explicitly.
    document["model"]["merges"] = json::array();
    for (const auto& [left, right] : std::vector<std::pair<std::string, std::string>>{
             {"b", "c"}, {"a", "b"}, {"c", "d"}, {"a", "bc"}, {"bc", "d"}})
        document["model"]["merges"].push_back(json::array({left, right}));
    CHECK(load(document).encode("abcd") == Ids{9, 5});
}

TEST_CASE("byte fallback and fused unknown characters", "[tokenizer]") {
    const Tokenizer tokenizer = load(tiny_tokenizer());
    CHECK(tokenizer.encode("\xC3\xA9") == Ids{12, 13});  // é -> <0xC3> <0xA9>
    CHECK(tokenizer.encode("zzaz") == Ids{0, 2, 0});     // no <0x7A>: unknowns
    CHECK(tokenizer.encode("\xE4\xB8\xAD"
                           "a") == Ids{14, 15, 16, 2});  // 中a

    json unfused = tiny_tokenizer();
    unfused["model"]["fuse_unk"] = false;
    CHECK(load(unfused).encode("zzaz") == Ids{0, 0, 2, 0});

    json no_unknown = tiny_tokenizer();
    no_unknown["model"]["unk_token"] = nullptr;
    CHECK(load(no_unknown).encode("zzaz") == Ids{2});  // dropped, as Hugging Face does
}

TEST_CASE("ignore_merges takes a whole word from the vocabulary", "[tokenizer]") {
    json document = tiny_tokenizer();
    document["model"]["ignore_merges"] = true;
    CHECK(load(document).encode("da") == Ids{11});
    CHECK(load(document).encode("abcd") == Ids{9, 5});
}

TEST_CASE("special tokens are matched in the raw text unless parse_special is off", "[tokenizer]") {
    const Tokenizer tokenizer = load(tiny_tokenizer());
    CHECK(tokenizer.encode("ab<s>cd") == Ids{6, 1, 8});
    CHECK(tokenizer.encode("ab<s>cd", false) == Ids{6, 0, 8});  // "<s>" is one fused unknown
    CHECK(tokenizer.is_special(1));
    CHECK_FALSE(tokenizer.is_special(6));
    CHECK(tokenizer.token_id("<s>") == 1);
    CHECK(tokenizer.token_id("abc") == 9);
    CHECK_FALSE(tokenizer.token_id("zz").has_value());
    CHECK(tokenizer.token_text(10) == "bcd");
    CHECK(tokenizer.vocab_size() == 18);
    CHECK_THROWS_AS(tokenizer.token_text(18), Error);
    CHECK_THROWS_AS(tokenizer.token_text(-1), Error);
}

TEST_CASE("added tokens outside the vocabulary get the next ids, longest match first",
          "[tokenizer]") {
    json document = tiny_tokenizer();
    const auto added = [](const std::string& content, bool lstrip, bool rstrip) {
        return json{{"id", 999},        {"content", content}, {"single_word", false},
                    {"lstrip", lstrip}, {"rstrip", rstrip},   {"normalized", false},
                    {"special", true}};
    };
    document["added_tokens"].push_back(added("<x>", false, false));
    document["added_tokens"].push_back(added("<x><y>", false, false));
    document["added_tokens"].push_back(added("<m>", true, true));
    const Tokenizer tokenizer = load(document);
    CHECK(tokenizer.token_id("<x>") == 18);  // the id in the file (999) is ignored
    CHECK(tokenizer.token_id("<x><y>") == 19);
    CHECK(tokenizer.vocab_size() == 21);
    CHECK(tokenizer.encode("a<x><y><x>b") == Ids{2, 19, 18, 3});
    // lstrip/rstrip swallow the white space around <m> (spaces are unknown here).
    CHECK(tokenizer.encode("a  <m>  b") == Ids{2, 20, 3});
}

TEST_CASE("text that is not UTF-8 is refused", "[tokenizer]") {
    const Tokenizer tokenizer = load(tiny_tokenizer());
    CHECK_THROWS_WITH(tokenizer.encode("ab\xFF"),
                      Catch::Contains("not valid UTF-8") && Catch::Contains("byte 2"));
    CHECK_THROWS_AS(tokenizer.encode("\xC3"), Error);          // cut off
    CHECK_THROWS_AS(tokenizer.encode("\xED\xA0\x80"), Error);  // surrogate
    CHECK_THROWS_AS(tokenizer.encode("\xC0\x80"), Error);      // overlong
}

TEST_CASE("normalizers: Prepend, Replace and NFC", "[tokenizer]") {
    json document = tiny_tokenizer();
    document["normalizer"] = {
        {"type", "Sequence"},
        {"normalizers",
         {{{"type", "NFC"}},
          {{"type", "Prepend"}, {"prepend", kSpaceMarker}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpaceMarker}}}}};
    document["model"]["vocab"]["\xC3\xA9"] = 18;      // é
    document["model"]["vocab"]["\xEA\xB0\x80"] = 19;  // 가 (U+AC00)
    const Tokenizer tokenizer = load(document);
    CHECK(tokenizer.encode("a b") == Ids{17, 2, 17, 3});
    CHECK(tokenizer.encode("e\xCC\x81") == Ids{17, 18});                 // e + U+0301 -> é
    CHECK(tokenizer.encode("\xE1\x84\x80\xE1\x85\xA1") == Ids{17, 19});  // jamo -> 가
    // Each piece between added tokens is normalized on its own (a marker each).
    CHECK(tokenizer.encode("a<s>b") == Ids{17, 2, 1, 17, 3});
}

TEST_CASE("normalizers may make a text at most 8 times as long, plus 4096 bytes", "[tokenizer]") {
    const auto replace = [](const std::string& pattern, const std::string& content) {
        return json{{"type", "Replace"}, {"pattern", {{"String", pattern}}}, {"content", content}};
    };
    // A Sequence of Replace normalizers that each double the a's.
    const auto doubling = [&](int steps) {
        json document = tiny_tokenizer();
        json normalizers = json::array();
        for (int i = 0; i < steps; ++i) normalizers.push_back(replace("a", "aa"));
        document["normalizer"] = {{"type", "Sequence"}, {"normalizers", normalizers}};
        return load(document);
    };
    const std::string text(1024, 'a');
    CHECK(doubling(3).encode(text) == Ids(8 * text.size(), 2));
    const std::string limit = "longer than the 12288 bytes allowed";
    CHECK_THROWS_WITH(doubling(4).encode(text),
                      Catch::Contains("normalizer Replace") && Catch::Contains(limit));
    // 20 of them would make 1 KB into 1 GB.
    CHECK_THROWS_WITH(doubling(20).encode(text), Catch::Contains(limit));
    // One Replace by a long content.
    json document = tiny_tokenizer();
    document["normalizer"] = replace("a", std::string(5000, 'b'));
    CHECK_THROWS_WITH(load(document).encode("a"), Catch::Contains("normalizer Replace"));
    // Real normalizers make a text at most 3 times as long, plus a few bytes.
    document["normalizer"] = {
        {"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", kSpaceMarker}}, replace(" ", kSpaceMarker)}}};
    CHECK(load(document).encode(std::string(1000, ' ')) == Ids(1001, 17));
}

TEST_CASE("Split splits at the matches of its regex", "[tokenizer]") {
    CHECK(load(digits_tokenizer(kGpt2Regex)).encode("1234") == Ids{6});
    CHECK(load(digits_tokenizer(kLlama3Regex)).encode("1234") == Ids{5, 3});
    CHECK(load(digits_tokenizer(kQwen2Regex)).encode("1234") == Ids{0, 1, 2, 3});
    CHECK(load(digits_tokenizer(R"(\d{2})")).encode("1234") == Ids{4, 2, 3});
    // An empty match splits too: "12" and "34".
    CHECK(load(digits_tokenizer("(?=3)")).encode("1234") == Ids{4, 2, 3});
}

TEST_CASE("Metaspace pre-tokenizer marks and splits at spaces", "[tokenizer]") {
    json document = tiny_tokenizer();
    document["model"]["vocab"][kSpaceMarker + "a"] = 18;
    document["model"]["merges"].push_back(kSpaceMarker + " a");
    document["pre_tokenizer"] = {{"type", "Metaspace"},
                                 {"replacement", kSpaceMarker},
                                 {"prepend_scheme", "always"},
                                 {"split", true}};
    document["decoder"] = {{"type", "Metaspace"},
                           {"replacement", kSpaceMarker},
                           {"prepend_scheme", "always"},
                           {"split", true}};
    const Tokenizer tokenizer = load(document);
    // "▁ab": "a b" (rank 1) comes before "▁ a" (rank 5).
    CHECK(tokenizer.encode("a ab") == Ids{18, 17, 6});
    CHECK(tokenizer.decode({18, 17, 6}) == "a ab");
}

TEST_CASE("decode: SentencePiece decoder chain and byte fallback", "[tokenizer]") {
    const Tokenizer tokenizer = load(tiny_tokenizer());
    // Replace marker -> space, Fuse, then Strip one leading space of the whole text.
    CHECK(tokenizer.decode({17, 2, 17, 3}) == "a b");
    CHECK(tokenizer.decode({17, 17, 2}) == " a");
    CHECK(tokenizer.decode({1, 17, 2}) == "<s> a");
    CHECK(tokenizer.decode({1, 17, 2}, true) == "a");
    CHECK(tokenizer.decode({12, 13}) == "\xC3\xA9");
    // A run of byte tokens that is not valid UTF-8 becomes one U+FFFD per byte.
    CHECK(tokenizer.decode({2, 14, 15, 2}) ==
          "a\xEF\xBF\xBD\xEF\xBF\xBD"
          "a");
    CHECK(tokenizer.decode({13, 12}) == "\xEF\xBF\xBD\xEF\xBF\xBD");
    // Ids with no token are skipped.
    CHECK(tokenizer.decode({2, 99, -5, 3}) == "ab");
}

TEST_CASE("stream decoder holds split characters until they are complete", "[tokenizer]") {
    const Tokenizer tokenizer = load(tiny_tokenizer());
    StreamDecoder decoder(tokenizer);
    CHECK(decoder.push(17) == "");  // the leading space that Strip removes
    CHECK(decoder.push(2) == "a");
    CHECK(decoder.push(14) == "");
    CHECK(decoder.push(15) == "");
    CHECK(decoder.push(16) == "\xE4\xB8\xAD");  // 中 once its third byte arrives
    CHECK(decoder.push(17) == " ");
    CHECK(decoder.push(12) == "");
    CHECK(decoder.push(3) ==
          "\xEF\xBF\xBD"
          "b");  // a lone lead byte, then b
    CHECK(decoder.push(14) == "");
    CHECK(decoder.flush() == "\xEF\xBF\xBD");  // cut off at the end
    // After flush the decoder starts afresh: the first space is stripped again.
    CHECK(decoder.push(17) == "");
    CHECK(decoder.push(3) == "b");
}

TEST_CASE("stream decoder output equals decode", "[tokenizer]") {
    const Tokenizer tokenizer = load(tiny_tokenizer());
    const std::vector<Ids> sequences = {
        {17, 2, 17, 3},     {1, 17, 2, 1},   {12, 13, 12, 13, 2}, {14, 15, 16, 14, 15, 16},
        {14, 2, 15},        {13, 13, 17, 2}, {17, 17, 17},        {},
        {2, 14, 15, 16, 2}, {1, 14, 1, 15},
    };
    for (const Ids& ids : sequences) {
        for (bool skip : {false, true}) {
            INFO("sequence of " << ids.size() << " ids, skip_special " << skip);
            CHECK(stream_all(tokenizer, ids, skip) == tokenizer.decode(ids, skip));
        }
    }
}

TEST_CASE("stream decoder shows a byte run's characters before the run goes bad", "[tokenizer]") {
    // The documented exception: Hugging Face turns the whole run 中 + <0xC3> into four
    // U+FFFD, but the stream has shown 中 by the time <0xC3> arrives.
    const Tokenizer tokenizer = load(tiny_tokenizer());
    const Ids ids = {2, 14, 15, 16, 12};
    CHECK(tokenizer.decode(ids) == "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
    CHECK(stream_all(tokenizer, ids) == "a\xE4\xB8\xAD\xEF\xBF\xBD");
}

TEST_CASE("stream decoder waits while a Replace or Strip may still change the text",
          "[tokenizer]") {
    json document = tiny_tokenizer();
    document["decoder"] = {
        {"type", "Sequence"},
        {"decoders",
         {{{"type", "Fuse"}},
          {{"type", "Replace"}, {"pattern", {{"String", "ab"}}}, {"content", "X"}},
          {{"type", "Strip"}, {"content", "d"}, {"start", 0}, {"stop", 2}}}}};
    const Tokenizer tokenizer = load(document);
    StreamDecoder decoder(tokenizer);
    CHECK(decoder.push(2) == "");   // "a" may begin "ab"
    CHECK(decoder.push(3) == "X");  // it did
    CHECK(decoder.push(2) == "");
    CHECK(decoder.push(4) == "ac");  // "ac" cannot
    CHECK(decoder.push(5) == "");    // a trailing "d" may be stripped
    CHECK(decoder.push(5) == "");
    CHECK(decoder.push(5) == "d");    // only the last two can be
    CHECK(decoder.push(2) == "");     // "a" may begin "ab" again
    CHECK(decoder.push(5) == "dda");  // "ad" cannot; the new "d" may be stripped
    CHECK(decoder.flush() == "");
    CHECK(tokenizer.decode({2, 3, 2, 4, 5, 5, 5, 2, 5}) == "Xacddda");
}

TEST_CASE("stream decoder with a byte-level decoder", "[tokenizer]") {
    json document = tiny_tokenizer();
    // GPT-2's alphabet: byte 0xE4 is U+00E4, 0xB8 is U+00B8, 0xAD is U+0143.
    document["model"]["vocab"] = {
        {"\xC3\xA4", 0}, {"\xC2\xB8", 1}, {"\xC5\x83", 2}, {"a", 3}, {"\xC4\xA0", 4}};  // ä ¸ Ń a Ġ
    document["model"]["merges"] = json::array();
    document["model"]["unk_token"] = nullptr;
    document["added_tokens"] = json::array();
    document["pre_tokenizer"] = {{"type", "ByteLevel"},
                                 {"add_prefix_space", false},
                                 {"trim_offsets", true},
                                 {"use_regex", true}};
    document["decoder"] = {{"type", "ByteLevel"}};
    const Tokenizer tokenizer = load(document);
    CHECK(tokenizer.encode("\xE4\xB8\xAD a") == Ids{0, 1, 2, 4, 3});
    StreamDecoder decoder(tokenizer);
    CHECK(decoder.push(0) == "");
    CHECK(decoder.push(1) == "");
    CHECK(decoder.push(2) == "\xE4\xB8\xAD");
    CHECK(decoder.push(0) == "");
    CHECK(decoder.push(3) ==
          "\xEF\xBF\xBD"
          "a");
    CHECK(decoder.flush() == "");
    CHECK(tokenizer.decode({0, 3, 0, 1}) ==
          "\xEF\xBF\xBD"
          "a\xEF\xBF\xBD");
}

TEST_CASE("unsupported features are refused with a message naming them", "[tokenizer]") {
    const auto with = [](const char* key, const json& value) {
        json document = tiny_tokenizer();
        document[key] = value;
        return document;
    };
    const auto with_model = [](const char* key, const json& value) {
        json document = tiny_tokenizer();
        document["model"][key] = value;
        return document;
    };
    CHECK_THAT(load_error(with_model("type", "WordPiece")),
               Catch::Contains("model type 'WordPiece' is not supported"));
    CHECK_THAT(load_error(with_model("continuing_subword_prefix", "##")),
               Catch::Contains("continuing_subword_prefix is not supported"));
    CHECK_THAT(load_error(with_model("end_of_word_suffix", "</w>")),
               Catch::Contains("end_of_word_suffix is not supported"));
    CHECK_THAT(load_error(with_model("dropout", 0.1)), Catch::Contains("dropout"));
    CHECK_THAT(load_error(with("normalizer", {{"type", "Lowercase"}})),
               Catch::Contains("normalizer type 'Lowercase' is not supported"));
    CHECK_THAT(
        load_error(with("normalizer",
                        {{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", " "}})),
        Catch::Contains("Regex pattern '\\s+' is not supported"));
    CHECK_THAT(load_error(with("pre_tokenizer", {{"type", "Whitespace"}})),
               Catch::Contains("pre_tokenizer type 'Whitespace' is not supported"));
    CHECK_THAT(load_error(with("pre_tokenizer", {{"type", "Split"},
                                                 {"pattern", {{"Regex", "(?<=a)b"}}},
                                                 {"behavior", "Isolated"},
                                                 {"invert", false}})),
               Catch::Contains("pre_tokenizer Split regex '(?<=a)b' is not supported: "
                               "lookbehind '(?<='"));
    CHECK_THAT(load_error(with("decoder", {{"type", "WordPiece"}})),
               Catch::Contains("decoder type 'WordPiece' is not supported"));
    CHECK_THAT(load_error(with_model("merges", {"a z"})),
               Catch::Contains("'z', which is not in the vocabulary"));
    CHECK_THAT(load_error(with_model("merges", {"a b c"})), Catch::Contains("merge 1"));
    CHECK_THAT(load_error(with_model("vocab", {{"a", -1}})), Catch::Contains("invalid id"));
    CHECK_THROWS_WITH(Tokenizer::from_json("{not json"), Catch::Contains("not valid JSON"));
    CHECK_THROWS_WITH(Tokenizer::from_json("{}"), Catch::Contains("no 'model'"));
}
