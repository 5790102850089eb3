// Untrusted input at the library's edges: JSON nested too deep and the excerpts of values
// that messages quote (json.h), files that are not regular files and texts over the limit,
// writes that must not replace what is there (files.h), text that is not UTF-8, token ids
// outside the model's vocabulary, and more threads than the process may start.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "util/error.h"
#include "util/files.h"
#include "util/json.h"
#include "util/machine.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

using namespace barellm;
using nlohmann::json;

namespace {

std::string nested_arrays(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

std::string temp_path(const std::string& name) {
    return "/tmp/barellm_hostile_" + std::to_string(getpid()) + "_" + name;
}

// Runs `read` with standard input reading `text` from a pipe, then restores standard input.
template <typename Read>
void with_stdin(const std::string& text, Read read) {
    int ends[2];
    REQUIRE(pipe(ends) == 0);
    REQUIRE(write(ends[1], text.data(), text.size()) == ssize_t(text.size()));
    close(ends[1]);
    const int saved = dup(STDIN_FILENO);
    dup2(ends[0], STDIN_FILENO);
    close(ends[0]);
    read();
    dup2(saved, STDIN_FILENO);
    close(saved);
}

bool link_path(const std::string& existing, const std::string& name) {
    return link(existing.c_str(), name.c_str()) == 0;
}

std::string contents(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// A tokenizer.json whose vocabulary is "a" with id `a_id` and "b" with id 1.
std::string two_token_tokenizer(int64_t a_id) {
    return json{
        {"model", {{"type", "BPE"}, {"vocab", {{"a", a_id}, {"b", 1}}}, {"merges", json::array()}}}}
        .dump();
}

}  // namespace

TEST_CASE("parse_json refuses nesting deeper than the limit", "[hostile]") {
    CHECK(parse_json(nested_arrays(kMaxJsonDepth), "doc").is_array());
    CHECK_THROWS_WITH(parse_json(nested_arrays(kMaxJsonDepth + 1), "doc"),
                      "doc: JSON nested deeper than 64 levels");
    CHECK_THROWS_WITH(parse_json(nested_arrays(100000), "doc"),
                      "doc: JSON nested deeper than 64 levels");
    std::string objects;
    for (int i = 0; i <= kMaxJsonDepth; ++i) objects += "{\"a\":";
    objects += "1" + std::string(kMaxJsonDepth + 1, '}');
    CHECK_THROWS_WITH(parse_json(objects, "doc"), "doc: JSON nested deeper than 64 levels");
    CHECK_THROWS_WITH(parse_json("{\"a\": [", "doc"),
                      "doc: not valid JSON (syntax error at byte 8)");
    // The message of a syntax error does not quote the (possibly huge) token it stopped in.
    CHECK_THROWS_WITH(parse_json("\"" + std::string(100000, 'x'), "doc"),
                      "doc: not valid JSON (syntax error at byte 100002)");
}

TEST_CASE("parse_json refuses a number beyond double's range with an Error", "[hostile]") {
    CHECK(parse_json("[1e308]", "doc").is_array());
    CHECK_THROWS_WITH(parse_json("{\"a\": 2e880}", "doc"),
                      "doc: not valid JSON (a number is out of range)");
}

TEST_CASE("messages quote only an excerpt of an untrusted value", "[hostile]") {
    const json small = json::parse(R"({"shape":[1,-2],"dtype":"I64"})");
    CHECK(json_excerpt(small) == small.dump());
    CHECK(json_excerpt(json(std::string(1000, 'x'))) ==
          "\"" + std::string(kExcerptBytes - 1, 'x') + "...");
    CHECK(json_excerpt(json(std::vector<int>(10000000, 7))).size() <= kExcerptBytes + 3);
    // A cut never splits a character.
    const std::string excerpt = json_excerpt(json(std::string(100, 'x') + "\xC3\xA9"));
    CHECK(unicode::is_valid_utf8(excerpt));
    std::string accents;
    for (int i = 0; i < 100; ++i) accents += "\xC3\xA9";
    CHECK(unicode::is_valid_utf8(json_excerpt(json(accents))));
    CHECK(unicode::is_valid_utf8(quoted_excerpt(accents)));

    CHECK(quoted_excerpt("WordPiece") == "'WordPiece'");
    CHECK(quoted_excerpt("two\nlines") == "'two?lines'");
    CHECK(quoted_excerpt(std::string(1000000, 'y')) ==
          "'" + std::string(kExcerptBytes, 'y') + "...'");
}

TEST_CASE("texts are read from regular files or standard input, up to a limit", "[hostile]") {
    const std::string path = temp_path("text");
    std::ofstream(path) << "0123456789";
    CHECK(read_text_file(path) == "0123456789");
    CHECK(read_text_file(path, 10) == "0123456789");
    CHECK_THROWS_WITH(read_text_file(path, 9),
                      path + ": longer than 9 bytes, the most barellm reads as a text");
    std::remove(path.c_str());

    CHECK_THROWS_WITH(read_text_file("/tmp"), "/tmp: not a regular file");
    CHECK_THROWS_WITH(read_text_file("/dev/zero"), "/dev/zero: not a regular file");
    const std::string fifo = temp_path("fifo");
    REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
    CHECK_THROWS_WITH(read_text_file(fifo), fifo + ": not a regular file");  // without blocking
    std::remove(fifo.c_str());
    CHECK_THROWS_WITH(read_text_file(temp_path("missing")), Catch::Contains("cannot open"));

    const std::string piped(5000, 'p');
    with_stdin(piped, [&] { CHECK(read_text_file("-", 5000) == piped); });
    with_stdin(piped, [&] {
        CHECK_THROWS_WITH(read_text_file("-", 4096),
                          "standard input: longer than 4096 bytes, the most barellm reads as a "
                          "text");
    });
}

TEST_CASE("tokenizer ids must lie below the vocabulary size", "[hostile]") {
    CHECK(Tokenizer::from_json(two_token_tokenizer(9), 10).vocab_size() == 10);
    CHECK_THROWS_WITH(
        Tokenizer::from_json(two_token_tokenizer(10), 10),
        "tokenizer.json: vocab entry 'a' has id 10, outside the vocabulary of 10 ids");
    // Without a model, ids up to Tokenizer::kMaxVocabSize are accepted.
    CHECK_THROWS_WITH(Tokenizer::from_json(two_token_tokenizer(INT32_MAX)),
                      Catch::Contains("has id 2147483647, outside the vocabulary of 4194304 ids"));
    CHECK_THROWS_WITH(Tokenizer::from_json(two_token_tokenizer(int64_t(1) << 40)),
                      Catch::Contains("has id 1099511627776, outside"));

    // An added token not in the vocabulary takes the next id, which must fit too.
    json document = json::parse(two_token_tokenizer(0));
    document["added_tokens"] = {{{"id", 2}, {"content", "<x>"}, {"special", true}}};
    CHECK(Tokenizer::from_json(document.dump(), 3).token_id("<x>") == 2);
    CHECK_THROWS_WITH(
        Tokenizer::from_json(document.dump(), 2),
        "tokenizer.json: added token '<x>' has id 2, outside the vocabulary of 2 ids");
}

TEST_CASE("a tokenizer nested too deep is refused before it is walked", "[hostile]") {
    constexpr int kDepth = 100000;
    std::string normalizer;
    for (int i = 0; i < kDepth; ++i) normalizer += R"({"type": "Sequence", "normalizers": [)";
    for (int i = 0; i < kDepth; ++i) normalizer += "]}";
    json document = json::parse(two_token_tokenizer(0));
    std::string text = document.dump();
    text.insert(1, "\"normalizer\": " + normalizer + ", ");
    CHECK_THROWS_WITH(Tokenizer::from_json(text),
                      "tokenizer.json: JSON nested deeper than 64 levels");
}

TEST_CASE("first_invalid_utf8 names the first byte that starts no character", "[hostile]") {
    using unicode::first_invalid_utf8;
    CHECK(first_invalid_utf8("") == std::string::npos);
    CHECK(first_invalid_utf8("caf\xC3\xA9 \xF0\x9F\x98\x80") == std::string::npos);
    CHECK(first_invalid_utf8("hi \xFF") == 3);
    CHECK(first_invalid_utf8("ab\xE2\x82") == 2);        // cut off at the end
    CHECK(first_invalid_utf8("\xC3\xA9\xC0\xAF") == 2);  // an overlong '/'
    CHECK(first_invalid_utf8("a\xED\xA0\x80") == 1);     // a surrogate
    CHECK(first_invalid_utf8(std::string("a\0b", 3)) == std::string::npos);
}

TEST_CASE("write_file_safely writes new files and replaces regular ones only when told",
          "[hostile]") {
    const std::string directory = temp_path("writes");
    REQUIRE(mkdir(directory.c_str(), 0700) == 0);
    const std::string path = directory + "/out.json";
    WriteRules rules;
    rules.how_to_replace = "say so to replace it";
    write_file_safely(path, "first\n", rules);
    CHECK(contents(path) == "first\n");
    CHECK_THROWS_WITH(write_file_safely(path, "second\n", rules),
                      path + " exists already; say so to replace it");
    CHECK(contents(path) == "first\n");
    REQUIRE(chmod(path.c_str(), 0604) == 0);
    rules.replace_existing = true;
    write_file_safely(path, "second\n", rules);
    CHECK(contents(path) == "second\n");
    struct stat info;
    REQUIRE(stat(path.c_str(), &info) == 0);
    CHECK((info.st_mode & 0777) == 0604);

    // A symbolic link to a regular file stays a link; its target gets the text.
    const std::string link = directory + "/link.json";
    REQUIRE(symlink(path.c_str(), link.c_str()) == 0);
    write_file_safely(link, "third\n", rules);
    REQUIRE(lstat(link.c_str(), &info) == 0);
    CHECK(S_ISLNK(info.st_mode));
    CHECK(contents(path) == "third\n");

    // A file being read is never replaced, however it is named.
    const std::string hard_link = directory + "/hard.json";
    REQUIRE(link_path(path, hard_link));
    rules.inputs.push_back(*file_identity(path));
    for (const std::string& name :
         {path, link, hard_link, directory + "/../" + directory.substr(5) + "/out.json"})
        CHECK_THROWS_WITH(write_file_safely(name, "fourth\n", rules),
                          name + ": is a file being read, never replaced");
    CHECK(contents(path) == "third\n");

    CHECK_THROWS_WITH(write_file_safely(directory, "x", rules), directory + ": is a directory");
    CHECK_THROWS_WITH(write_file_safely(directory + "/new/", "x", rules),
                      directory + "/new/: is a directory");
    const std::string fifo = directory + "/fifo";
    REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
    const std::string dangling = directory + "/dangling";
    REQUIRE(symlink((directory + "/nothing").c_str(), dangling.c_str()) == 0);
    CHECK_THROWS_WITH(write_file_safely(fifo, "x", rules), Catch::Contains("not a regular file"));
    CHECK_THROWS_WITH(write_file_safely("/dev/null", "x", rules),
                      Catch::Contains("/dev/null: not a regular file"));
    CHECK_THROWS_WITH(write_file_safely(dangling, "x", rules),
                      dangling + ": a symbolic link to a file that does not exist");
    CHECK_THROWS_WITH(write_file_safely(directory + "/missing/x", "x", rules),
                      "cannot write " + directory + "/missing/x: No such file or directory");
    CHECK_THROWS_WITH(write_file_safely(path + "/x", "x", rules), path + "/x: Not a directory");
    CHECK_THROWS_WITH(write_file_safely("", "x", rules), "no file name given");
    CHECK_THROWS_WITH(write_file_safely(directory + std::string("/a\0b", 4), "x", rules),
                      "a file name cannot hold a NUL byte");

    // Nothing but what was written is left in the directory: no temporary file.
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(directory))
        names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    CHECK(names ==
          std::vector<std::string>{"dangling", "fifo", "hard.json", "link.json", "out.json"});
    std::filesystem::remove_all(directory);
}

TEST_CASE("threads_that_start starts every thread it is asked for", "[hostile]") {
    int error = -1;
    CHECK(threads_that_start(1, &error) == 1);
    CHECK(error == 0);
    CHECK(threads_that_start(7, &error) == 7);
    CHECK(error == 0);
}
