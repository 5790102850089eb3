// The command line: the usage text, the options, and their parsing. Separate from
// main.cpp so that the parser can be tested and fuzzed on its own.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend.h"
#include "generation/sampler.h"
#include "util/error.h"

namespace barellm {

extern const char* const kUsage;

// A wrong command line: main prints the message in one line (run with no arguments, the
// usage after it) and exits with 2.
struct UsageError : Error {
    using Error::Error;
};

constexpr int kDefaultGenerate = 256;

struct Options {
    std::string command, model_path, prompt, file;
    bool has_prompt = false, has_file = false;
    int generate = kDefaultGenerate;
    bool has_generate = false;
    int repetitions = 5;
    int depth = 0;  // bench -d: positions of the KV cache filled before the tests
    bool json_output = false;
    SamplingOptions sampling;
    std::vector<std::string> stop_strings;  // --stop, in the order given
    bool color = false;                     // --color: mark the prompt on a terminal
    uint64_t seed = 0;
    bool has_seed = false;
    int context = 0;   // 0: the command's default
    int threads = 0;   // 0: OpenMP's default
    std::string simd;  // --simd scalar|avx2|avx512; empty: the best this CPU runs
    int chunks = 0;    // 0: all
    KvType kv_type = KvType::F16;
    Device device = Device::Auto;
    bool bos = false, parse_special = true;
    bool chat = false;                  // run --chat: the prompt in the model's chat template
    std::optional<std::string> system;  // run --chat, chat: the system message
    bool no_think = false;              // run --chat --no-think: enable_thinking=False
    bool show_think = false;            // run --chat --show-think: print <think> blocks
    // run --chat, chat: a harmony template's reasoning effort (gpt-oss: low, medium, high)
    std::optional<std::string> reasoning_effort;
    std::string check_text;  // ladder --check-text
    bool has_check_text = false;
    // serve:
    std::string host = "127.0.0.1";
    int port = 8080;
    int parallel = 4;        // sequences in the running batch
    size_t kv_memory = 0;    // bytes of the paged KV cache; 0: --parallel sequences of --ctx
    int block_size = 16;     // positions per KV block
    std::string api_key;     // "": none
    std::string serve_flag;  // the first serve-only flag given (refused by other commands)
};

// Parses argv; throws UsageError for anything malformed. "-h"/"--help" give command "help".
Options parse_options(int argc, const char* const* argv);

// Parses a size in bytes: digits with an optional K, M or G (KiB, MiB, GiB; "KB", "KiB" and
// lower case too) in [1, highest]; throws UsageError naming `flag`.
size_t parse_size(const std::string& flag, const std::string& text, size_t highest);

// Parses a whole decimal integer in [lowest, highest]; throws UsageError naming `flag`.
long long parse_integer(const std::string& flag, const std::string& text, long long lowest,
                        long long highest);

}  // namespace barellm
