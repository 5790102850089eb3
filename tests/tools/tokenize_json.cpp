// Test tool: runs barellm's tokenizer on a tokenizer.json, for comparison with Hugging Face.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "util/error.h"
#include "util/timing.h"
#include "tokenizer/tokenizer.h"

namespace {

using json = nlohmann::json;
using barellm::Clock;
using barellm::Error;
using barellm::seconds_since;
using barellm::Tokenizer;

const char* const kUsage = R"(usage: tokenize_json [options] TOKENIZER_JSON FILE
Prints the token ids of FILE's content as one JSON array.
  --no-special    special tokens in the text are tokenized as plain text
  --batch         FILE holds a JSON array of strings: print a JSON array of id arrays
  --decode        FILE holds a JSON array of ids: print their text (with --batch, FILE
                  holds an array of id arrays and the output is a JSON array of strings)
  --skip-special  with --decode: leave special tokens out
  --stream        with --decode: decode id by id with StreamDecoder and print the JSON
                  array of the pieces it returned, the flush last
  --time          print the seconds spent encoding or decoding to stderr
)";

struct Options {
    bool parse_special = true, batch = false, decode = false, skip_special = false;
    bool stream = false, time = false;
    std::string tokenizer_path, input_path;
};

Options parse_options(int argc, char** argv) {
    Options options;
    std::vector<std::string> paths;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--help") {
            std::cout << kUsage;
            std::exit(0);
        }
        if (arg == "--no-special")
            options.parse_special = false;
        else if (arg == "--batch")
            options.batch = true;
        else if (arg == "--decode")
            options.decode = true;
        else if (arg == "--skip-special")
            options.skip_special = true;
        else if (arg == "--stream")
            options.stream = true;
        else if (arg == "--time")
            options.time = true;
        else if (arg.rfind("--", 0) == 0)
            throw Error("unknown option " + arg);
        else
            paths.push_back(arg);
    }
    if (paths.size() != 2) throw Error("expected TOKENIZER_JSON and FILE (see --help)");
    options.tokenizer_path = paths[0];
    options.input_path = paths[1];
    return options;
}

std::string read_file(const std::string& path) {
    std::ifstream file(path, std::ios::binary);
    if (!file) throw Error(path + ": cannot open");
    std::ostringstream content;
    content << file.rdbuf();
    return content.str();
}

json parse_input_json(const std::string& text, const std::string& path) {
    try {
        return json::parse(text);
    } catch (const json::exception& e) {
        throw Error(path + ": not valid JSON (" + e.what() + ")");
    }
}

std::vector<int> ids_of(const json& array) {
    if (!array.is_array()) throw Error("expected a JSON array of ids");
    std::vector<int> ids;
    for (const json& id : array) {
        if (!id.is_number_integer()) throw Error("expected integer ids, got " + id.dump());
        ids.push_back(id.get<int>());
    }
    return ids;
}

json stream_pieces(const Tokenizer& tokenizer, const std::vector<int>& ids, bool skip_special) {
    barellm::StreamDecoder decoder(tokenizer, skip_special);
    json pieces = json::array();
    for (int id : ids) pieces.push_back(decoder.push(id));
    pieces.push_back(decoder.flush());
    return pieces;
}

json decode_one(const Tokenizer& tokenizer, const json& ids, const Options& options) {
    if (options.stream) return stream_pieces(tokenizer, ids_of(ids), options.skip_special);
    return tokenizer.decode(ids_of(ids), options.skip_special);
}

std::string run(const Options& options) {
    const Tokenizer tokenizer = Tokenizer::from_json(read_file(options.tokenizer_path));
    const std::string input = read_file(options.input_path);
    const auto start = Clock::now();
    json output;
    if (options.decode) {
        const json ids = parse_input_json(input, options.input_path);
        if (options.batch) {
            output = json::array();
            for (const json& sequence : ids)
                output.push_back(decode_one(tokenizer, sequence, options));
        } else {
            output = decode_one(tokenizer, ids, options);
        }
    } else if (options.batch) {
        output = json::array();
        for (const json& text : parse_input_json(input, options.input_path))
            output.push_back(tokenizer.encode(text.get<std::string>(), options.parse_special));
    } else {
        output = tokenizer.encode(input, options.parse_special);
    }
    if (options.time) {
        std::fprintf(stderr, "%.6f\n", seconds_since(start));
    }
    if (output.is_string()) return output.get<std::string>();
    return output.dump(-1, ' ', false, json::error_handler_t::strict) + "\n";
}

}  // namespace

int main(int argc, char** argv) {
    try {
        std::cout << run(parse_options(argc, argv));
        return 0;
    } catch (const std::exception& e) {
        std::string message = e.what();
        std::fprintf(stderr, "tokenize_json: %s\n", message.substr(0, message.find('\n')).c_str());
        return 1;
    }
}
