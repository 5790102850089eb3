#include "targets.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend.h"
#include "commands/cli.h"
#include "serve/openai_api.h"
#include "tokenizer/chat.h"
#include "tokenizer/chat_tools.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "util/error.h"
#include "weights/model.h"

namespace barellm::fuzz {

namespace {

// model_file's forward pass: a prompt of kPromptTokens, then one token decoded after it.
constexpr int kPromptTokens = 2;

// A small SentencePiece-style tokenizer with byte fallback, used when the real one in
// ../shared is not there.
const char* kFallbackTokenizer = R"({
  "added_tokens": [{"id": 0, "content": "<unk>", "special": true, "single_word": false,
                    "lstrip": false, "rstrip": false, "normalized": false},
                   {"id": 1, "content": "<s>", "special": true, "single_word": false,
                    "lstrip": false, "rstrip": false, "normalized": false}],
  "normalizer": {"type": "Sequence", "normalizers": [
      {"type": "Prepend", "prepend": "\u2581"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
  "pre_tokenizer": null,
  "decoder": {"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
  "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true,
            "vocab": {"<unk>": 0, "<s>": 1, "<0x41>": 2, "<0xC3>": 3, "<0xA9>": 4,
                      "\u2581": 5, "a": 6, "b": 7, "ab": 8, "\u2581ab": 9},
            "merges": ["a b", "\u2581 ab"]}
})";

std::string read_file(const char* path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

// The tokenizer to fuzz: $BARELLM_FUZZ_TOKENIZER, else stories260K's, else the fallback.
const Tokenizer& fuzz_tokenizer() {
    static const Tokenizer tokenizer = [] {
        const char* chosen = std::getenv("BARELLM_FUZZ_TOKENIZER");
        const std::string path = chosen ? chosen : "../shared/models/stories260K/tokenizer.json";
        const std::string json = read_file(path.c_str());
        return Tokenizer::from_json(json.empty() ? kFallbackTokenizer : json);
    }();
    return tokenizer;
}

// The templates chat_request renders with: those of tests/data/chat_templates.json that barellm
// recognises (the fuzzer and the unit tests run from the repository's root), none elsewhere.
const std::vector<ChatTemplate>& fuzz_chat_templates() {
    static const std::vector<ChatTemplate> templates = [] {
        std::vector<ChatTemplate> recognised;
        const std::string text = read_file("tests/data/chat_templates.json");
        if (text.empty()) return recognised;
        for (const nlohmann::json& entry : nlohmann::json::parse(text)) {
            try {
                recognised.push_back(recognise_chat_template(entry.at("chat_template")));
            } catch (const Error&) {
            }
        }
        return recognised;
    }();
    return templates;
}

// chat_request feeds a reply to the call readers this many bytes at a time.
constexpr size_t kReplyPieceBytes = 3;

}  // namespace

void model_file(const uint8_t* data, size_t size) {
    static const std::string path = "/tmp/barellm_fuzz_model_" + std::to_string(getpid());
    if (FILE* out = std::fopen(path.c_str(), "wb")) {
        std::fwrite(data, 1, size, out);
        std::fclose(out);
    }
    try {
        const Model model = Model::load(path);
        // The tokenizer stored in the file, as barellm loads it with the model.
        const auto& metadata = model.file->metadata();
        if (const auto found = metadata.find("barellm.tokenizer"); found != metadata.end())
            Tokenizer::from_json(found->second, model.config.vocab_size);
        // A file the loader takes must run: the CPU backend takes it (re-laying out its
        // matrices for the kernels of this CPU), prefills two tokens and decodes a third.
        BackendOptions options;
        options.context = std::min(model.config.max_context, kPromptTokens + 1);
        const std::unique_ptr<Backend> backend = make_cpu_backend(model, options);
        const int last_token = model.config.vocab_size - 1;
        const int prompt[kPromptTokens] = {std::max(model.config.bos_id, 0), last_token};
        backend->prefill(prompt, kPromptTokens, 0, false);
        backend->forward(last_token, kPromptTokens);
    } catch (const Error&) {
    }
    std::remove(path.c_str());  // the mapping is gone with `model`: leave nothing in /tmp
}

void tokenizer_encode(const uint8_t* data, size_t size) {
    const Tokenizer& tokenizer = fuzz_tokenizer();
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    for (bool parse_special : {true, false}) {
        std::vector<int> ids;
        try {
            ids = tokenizer.encode(text, parse_special);
        } catch (const Error&) {  // invalid UTF-8 is refused
            return;
        }
        for (int id : ids)
            if (id < 0 || id >= tokenizer.vocab_size()) __builtin_trap();
        tokenizer.decode(ids);
    }
}

void tokenizer_decode(const uint8_t* data, size_t size) {
    const Tokenizer& tokenizer = fuzz_tokenizer();
    std::vector<int> ids;
    for (size_t i = 0; i + 1 < size; i += 2) {
        const int id = data[i] | (data[i + 1] << 8);
        // Mostly valid ids, sometimes one past the end, which must be refused cleanly.
        ids.push_back(id % (tokenizer.vocab_size() + 1));
    }
    try {
        tokenizer.decode(ids, size % 2 == 1);
        StreamDecoder stream(tokenizer);
        for (int id : ids) stream.push(id);
        stream.flush();
    } catch (const Error&) {
    }
}

void command_line(const uint8_t* data, size_t size) {
    std::vector<std::string> arguments{"barellm"};
    std::string current;
    for (size_t i = 0; i < size; ++i) {
        if (data[i] == 0) {
            arguments.push_back(current);
            current.clear();
        } else {
            current.push_back(char(data[i]));
        }
    }
    arguments.push_back(current);
    std::vector<const char*> argv;
    for (const std::string& argument : arguments) argv.push_back(argument.c_str());
    try {
        parse_options(int(argv.size()), argv.data());
    } catch (const Error&) {
    }
}

void regex(const uint8_t* data, size_t size) {
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);
    const size_t separator = bytes.find('\0');
    if (separator == std::string_view::npos) return;
    const std::string_view text = bytes.substr(separator + 1);
    if (!unicode::is_valid_utf8(text)) return;  // the tokenizer only matches valid text
    // A small backtracking limit, so that patterns that backtrack exponentially fail fast.
    constexpr size_t kBacktrackLimit = 100000;
    try {
        const Regex regex(bytes.substr(0, separator), kBacktrackLimit);
        size_t end = 0;
        for (const Regex::Match& match : regex.find_all(text)) {
            // In order, not overlapping, and on character boundaries.
            const bool ordered = match.begin >= end && match.end >= match.begin;
            const auto at_boundary = [&](size_t pos) {
                return pos == text.size() || (static_cast<unsigned char>(text[pos]) & 0xC0) != 0x80;
            };
            if (!ordered || match.end > text.size() || !at_boundary(match.begin) ||
                !at_boundary(match.end))
                __builtin_trap();
            end = match.end;
        }
    } catch (const Error&) {  // an unsupported pattern, or too much backtracking
    }
}

void chat_request(const uint8_t* data, size_t size) {
    const std::string bytes(reinterpret_cast<const char*>(data), size);
    try {
        const serve::ChatRequest request = serve::parse_chat_request(bytes);
        for (const ChatTemplate& chat : fuzz_chat_templates()) {
            try {
                serve::render_chat_request(chat, request, "<s>", "</s>");
            } catch (const Error&) {  // what the template refuses
            }
        }
    } catch (const Error&) {  // a malformed request
    }
    for (const ToolFormat format : {ToolFormat::Hermes, ToolFormat::Llama31}) {
        ToolCallReader reader(format);
        std::string passed;
        bool called = false;
        const auto collect = [&](const std::vector<ReplyPart>& parts) {
            for (const ReplyPart& part : parts) {
                passed += part.text;
                called = called || part.call.has_value();
            }
        };
        for (size_t at = 0; at < size; at += kReplyPieceBytes)
            collect(reader.feed(bytes.substr(at, kReplyPieceBytes)));
        collect(reader.finish());
        if (!called && passed != bytes) __builtin_trap();
    }
}

}  // namespace barellm::fuzz
