// Parsing the command line into Options (cli.h): every flag checked, bad ones refused in one line.
#include "commands/cli.h"

#include <cctype>

#include "tokenizer/unicode.h"
#include "util/json.h"

namespace barellm {

const char* const kUsage = R"(usage: barellm COMMAND MODEL [options]

commands:
  run MODEL -p PROMPT      complete a prompt, streaming the text to stdout
      -p -                 read the prompt from standard input
      -f FILE              read the prompt from FILE (instead of -p)
      -n N                 tokens to generate (default 256)
      --stop TEXT          stop before TEXT in the output (repeatable); the text is
                           held back while it could be the start of one
      --color              mark the prompt in colour when stdout is a terminal
      --chat               wrap the prompt in the model's chat template as one user
                           message; print only the reply
      --system TEXT        with --chat: a system message before the prompt
      --no-think           with --chat: enable_thinking=False for templates with that
                           switch (Qwen3): the reply starts after an empty think block
      --show-think         with --chat: also print the <think>...</think> block of a
                           reasoning reply (hidden by default)
      --reasoning-effort L
                           with --chat, a harmony template (gpt-oss): low, medium or
                           high in place of the template's default (medium)
      and the sampling options below
  chat MODEL               a conversation in the model's chat template: type a message,
                           the reply streams; each turn adds to the KV cache, so only
                           its own tokens are prefilled. Ctrl-C stops a reply; Ctrl-C
                           at the prompt, Ctrl-D or /exit leaves; /reset starts over;
                           /help lists the commands;
                           /save FILE writes the conversation as JSON messages to a
                           new FILE (- : stdout), /save! FILE also over an existing
                           regular file; never over the model, a directory or a
                           device. When the context is full, a turn is refused until
                           /reset; a message that is not UTF-8 is refused. With
                           stdin not a terminal, each line is a turn (empty lines
                           are skipped) and only the replies are printed, each
                           followed by a newline; the exit status is 1 when a turn
                           or /save failed, the last stderr line naming the lines.
      --system TEXT        a system message before the conversation
      --reasoning-effort L
                           a harmony template's (gpt-oss): low, medium or high
      -n N                 the most tokens of one reply (default 256)
      --stop TEXT, --color and the sampling options below
  ppl MODEL -f FILE        perplexity, llama.cpp's llama-perplexity convention
      --chunks K           score at most K chunks of --ctx tokens (default: all)
  bench MODEL              prefill and decode speed, llama-bench style
      -p P                 prompt tokens for the pp test (default 512, 0 skips)
      -n N                 decode steps for the tg test (default 128, 0 skips)
      -d D                 depth: both tests run after D positions of the KV cache,
                           filled by one untimed prefill (default 0)
      -r R                 repetitions (default 5)
      -o md|json           output format (default md)
  ladder MODEL             optimisation ladder: speed per rung (docs/TOUR.md), on the
                           CPU or, with --device cuda, on the GPU
      -n N                 decode steps per rung (default 64)
      -p P                 prompt tokens of the CPU's batched-prefill rung (default: N)
      --check-text TEXT    print each rung's greedy completion of TEXT instead
  serve MODEL              an OpenAI-compatible HTTP server (/v1/completions,
                           /v1/chat/completions, /v1/models, /health, /metrics) that
                           batches the requests it holds into one step per token
      --host H             the address to listen on (default 127.0.0.1)
      --port P             the port (default 8080; 0: any free one, named on stderr)
      --parallel N         the most sequences generated at once (default 4); more
                           requests wait in a queue, beyond 256 they get 503
      --kv-memory SIZE     bytes of KV cache, e.g. 512M or 2G (default: --parallel
                           sequences of --ctx, at most half the available memory)
      --block-size B       positions per KV cache block (default 16)
      --api-key KEY        requests to /v1/ and /metrics must send
                           'Authorization: Bearer KEY'
      and the sampling options below as the defaults of a request's fields
  info MODEL               config, tensors, dtypes and bytes
  tokenize MODEL (-p TEXT | -f FILE) [--bos] [--no-special]
                           print the token ids as one JSON array
  detokenize MODEL -p "[ids...]"
                           print the text of the ids

sampling options (run, chat, serve), applied in llama.cpp's order: repeat penalty, top-k,
top-p, min-p, temperature:
  --repeat-penalty R       divide positive and multiply negative logits of the tokens
                           seen in the last --repeat-last-n tokens by R (default 1, off)
  --repeat-last-n N        how many tokens the penalty looks back over (default 64)
  --top-k K                keep the K most probable tokens (default 0, off)
  --top-p P                keep the fewest most probable tokens that add up to P
                           (default 0.9; 1 is off)
  --min-p P                keep the tokens at least P times as probable as the most
                           probable one (default 0, off)
  --temp T                 temperature, 0 = greedy (default 0.8)
  --seed S                 random seed: the same seed gives the same text (default:
                           from the clock)

common options:
  -f -                     read the text of ppl or tokenize from standard input
  --ctx C                  context length (default: the model's, at most 4096; ppl: 512)
  --threads K              CPU threads (default: OMP_NUM_THREADS, else the physical
                           cores, not counting a core's second hardware thread)
  --simd scalar|avx2|avx512
                           CPU kernels of at most this level (default: the best this
                           CPU runs)
  --kv f16|f32             KV cache element type (default f16)
  --device auto|cpu|cuda   where to run (default auto: the GPU when this build has CUDA
                           and one is usable, else the CPU, said on stderr; ladder runs
                           on the GPU only with --device cuda)
  -h, --help               this text
)";

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// How many decimal digits `text` holds from `at` on.
size_t digits_from(const std::string& text, size_t at) {
    size_t end = at;
    while (end < text.size() && is_digit(text[end])) ++end;
    return end - at;
}

// Whether `text` is a plain decimal integer: an optional sign and digits, nothing else
// (std::stoll alone also takes leading spaces, and std::stod hexadecimal and "inf").
bool is_decimal_integer(const std::string& text) {
    const size_t start = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
    const size_t digits = digits_from(text, start);
    return digits > 0 && start + digits == text.size();
}

// Whether `text` is a plain decimal number: an optional sign, digits with an optional
// fraction ("1", "0.8", ".5", "2."), and an optional exponent ("1e-3").
bool is_decimal_number(const std::string& text) {
    size_t at = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
    size_t mantissa_digits = digits_from(text, at);
    at += mantissa_digits;
    if (at < text.size() && text[at] == '.') {
        const size_t fraction = digits_from(text, at + 1);
        mantissa_digits += fraction;
        at += 1 + fraction;
    }
    if (mantissa_digits == 0) return false;
    if (at < text.size() && (text[at] == 'e' || text[at] == 'E')) {
        ++at;
        if (at < text.size() && (text[at] == '-' || text[at] == '+')) ++at;
        const size_t exponent_digits = digits_from(text, at);
        if (exponent_digits == 0) return false;
        at += exponent_digits;
    }
    return at == text.size();
}

}  // namespace

long long parse_integer(const std::string& flag, const std::string& text, long long lowest,
                        long long highest) {
    size_t used = 0;
    long long value = 0;
    if (is_decimal_integer(text)) {
        try {
            value = std::stoll(text, &used);
        } catch (const std::exception&) {
            used = 0;
        }
    }
    if (used != text.size() || text.empty())
        throw UsageError(flag + " needs an integer, got " + quoted_excerpt(text));
    if (value < lowest || value > highest)
        throw UsageError(flag + " must be in [" + std::to_string(lowest) + ", " +
                         std::to_string(highest) + "], got " + quoted_excerpt(text));
    return value;
}

size_t parse_size(const std::string& flag, const std::string& text, size_t highest) {
    const size_t digits = digits_from(text, 0);
    std::string unit = text.substr(digits);
    for (char& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
    size_t scale = 0;
    for (const auto& [name, bytes] :
         {std::pair{"", size_t(1)}, std::pair{"K", size_t(1) << 10},
          std::pair{"M", size_t(1) << 20}, std::pair{"G", size_t(1) << 30}}) {
        const std::string base = name;
        if (unit == base || (!base.empty() && (unit == base + "B" || unit == base + "IB")))
            scale = bytes;
    }
    const std::string needs = flag + " needs a size in bytes, e.g. 1048576, 512M or 2G, at most " +
                              std::to_string(highest >> 30) + "G, got " + quoted_excerpt(text);
    if (digits == 0 || digits > 12 || scale == 0) throw UsageError(needs);
    const size_t number = std::stoull(text.substr(0, digits));
    if (number == 0 || number > highest / scale) throw UsageError(needs);
    return number * scale;
}

namespace {

constexpr size_t kMaxKvMemory = size_t(1) << 40;  // 1 TiB: beyond any machine's memory

constexpr float kMaxTemperature = 100.0f;
constexpr float kMaxRepeatPenalty = 100.0f;
constexpr long long kMaxRepeatLastN = 1 << 24;  // as many as the largest --ctx

// `text` itself, refused unless it is valid UTF-8: it is compared with or tokenized as text.
std::string utf8_text(const std::string& flag, const std::string& text) {
    const size_t invalid = unicode::first_invalid_utf8(text);
    if (invalid != std::string::npos)
        throw UsageError(flag + " needs UTF-8 text; byte " + std::to_string(invalid) +
                         " of its value is not");
    return text;
}

float parse_float(const std::string& flag, const std::string& text, float lowest, float highest) {
    size_t used = 0;
    float value = 0;
    if (is_decimal_number(text)) {
        try {
            value = std::stof(text, &used);
        } catch (const std::exception&) {
            used = 0;
        }
    }
    if (used != text.size() || text.empty() || !(value >= lowest && value <= highest))
        throw UsageError(flag + " needs a number in [" + std::to_string(lowest) + ", " +
                         std::to_string(highest) + "], got " + quoted_excerpt(text));
    return value;
}

}  // namespace

Options parse_options(int argc, const char* const* argv) {
    Options options;
    std::vector<std::string> positional;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) throw UsageError(arg + " needs a value");
            return argv[++i];
        };
        if (arg == "-h" || arg == "--help") {
            options.command = "help";
            return options;
        } else if (arg == "-p") {
            options.prompt = value();
            options.has_prompt = true;
        } else if (arg == "-f") {
            options.file = value();
            options.has_file = true;
        } else if (arg == "-n") {
            options.generate = int(parse_integer(arg, value(), 0, 1 << 30));
            options.has_generate = true;
        } else if (arg == "-d") {
            options.depth = int(parse_integer(arg, value(), 0, 1 << 30));
        } else if (arg == "-r") {
            options.repetitions = int(parse_integer(arg, value(), 1, 1000));
        } else if (arg == "-o") {
            const std::string format = value();
            if (format != "md" && format != "json") throw UsageError("-o takes md or json");
            options.json_output = format == "json";
        } else if (arg == "--temp") {
            options.sampling.temperature = parse_float(arg, value(), 0.0f, kMaxTemperature);
        } else if (arg == "--top-p") {
            options.sampling.top_p = parse_float(arg, value(), 0.0f, 1.0f);
        } else if (arg == "--top-k") {
            options.sampling.top_k = int(parse_integer(arg, value(), 0, INT32_MAX));
        } else if (arg == "--min-p") {
            options.sampling.min_p = parse_float(arg, value(), 0.0f, 1.0f);
        } else if (arg == "--repeat-penalty") {
            options.sampling.repeat_penalty = parse_float(arg, value(), 0.0f, kMaxRepeatPenalty);
            if (options.sampling.repeat_penalty == 0.0f)
                throw UsageError("--repeat-penalty must be above 0 (1 is off)");
        } else if (arg == "--repeat-last-n") {
            options.sampling.repeat_last_n = int(parse_integer(arg, value(), 0, kMaxRepeatLastN));
        } else if (arg == "--stop") {
            options.stop_strings.push_back(utf8_text(arg, value()));
            if (options.stop_strings.back().empty())
                throw UsageError("--stop needs a non-empty text");
        } else if (arg == "--color") {
            options.color = true;
        } else if (arg == "--seed") {
            options.seed = uint64_t(parse_integer(arg, value(), 0, INT64_MAX));
            options.has_seed = true;
        } else if (arg == "--ctx") {
            options.context = int(parse_integer(arg, value(), 1, 1 << 24));
        } else if (arg == "--threads") {
            options.threads = int(parse_integer(arg, value(), 1, 1024));
        } else if (arg == "--simd") {
            options.simd = value();
            if (options.simd != "scalar" && options.simd != "avx2" && options.simd != "avx512")
                throw UsageError("--simd takes scalar, avx2 or avx512");
        } else if (arg == "--chunks") {
            options.chunks = int(parse_integer(arg, value(), 1, 1 << 30));
        } else if (arg == "--kv") {
            const std::string type = value();
            if (type != "f16" && type != "f32") throw UsageError("--kv takes f16 or f32");
            options.kv_type = type == "f16" ? KvType::F16 : KvType::F32;
        } else if (arg == "--device") {
            const std::string device = value();
            if (device != "cpu" && device != "cuda" && device != "auto")
                throw UsageError("--device takes auto, cpu or cuda");
            options.device = device == "cpu"    ? Device::Cpu
                             : device == "cuda" ? Device::Cuda
                                                : Device::Auto;
        } else if (arg == "--bos") {
            options.bos = true;
        } else if (arg == "--chat") {
            options.chat = true;
        } else if (arg == "--system") {
            options.system = utf8_text(arg, value());
        } else if (arg == "--no-think") {
            options.no_think = true;
        } else if (arg == "--reasoning-effort") {
            options.reasoning_effort = value();
        } else if (arg == "--show-think") {
            options.show_think = true;
        } else if (arg == "--no-special") {
            options.parse_special = false;
        } else if (arg == "--check-text") {
            options.check_text = value();
            options.has_check_text = true;
        } else if (arg == "--host" || arg == "--port" || arg == "--parallel" ||
                   arg == "--kv-memory" || arg == "--block-size" || arg == "--api-key") {
            if (options.serve_flag.empty()) options.serve_flag = arg;
            if (arg == "--host") {
                options.host = value();
                if (options.host.empty()) throw UsageError("--host needs an address");
            } else if (arg == "--port") {
                options.port = int(parse_integer(arg, value(), 0, 65535));
            } else if (arg == "--parallel") {
                options.parallel = int(parse_integer(arg, value(), 1, 256));
            } else if (arg == "--kv-memory") {
                options.kv_memory = parse_size(arg, value(), kMaxKvMemory);
            } else if (arg == "--block-size") {
                options.block_size = int(parse_integer(arg, value(), 1, 1024));
            } else {
                options.api_key = value();
                if (options.api_key.empty()) throw UsageError("--api-key needs a non-empty key");
            }
        } else if (arg.size() > 1 && arg[0] == '-') {
            throw UsageError("unknown option " + arg);
        } else {
            positional.push_back(arg);
        }
    }
    if (positional.empty()) throw UsageError("no command given");
    options.command = positional[0];
    if (positional.size() < 2) throw UsageError(options.command + " needs a MODEL file");
    if (positional.size() > 2) throw UsageError("unexpected argument '" + positional[2] + "'");
    options.model_path = positional[1];
    if (options.system && !options.chat && options.command != "chat")
        throw UsageError("--system needs --chat (or the chat command)");
    if (!options.serve_flag.empty() && options.command != "serve")
        throw UsageError(options.serve_flag + " is for serve");
    if (options.command == "serve" && (options.has_prompt || options.has_file || options.chat ||
                                       options.has_generate || !options.stop_strings.empty()))
        throw UsageError(
            "serve takes its prompts, lengths and stop strings over HTTP: no -p, -f, -n, --stop "
            "or --chat");
    if (options.reasoning_effort && !options.chat && options.command != "chat")
        throw UsageError("--reasoning-effort needs --chat (or the chat command)");
    if ((options.no_think || options.show_think) && !options.chat)
        throw UsageError(std::string(options.no_think ? "--no-think" : "--show-think") +
                         " needs --chat");
    return options;
}

}  // namespace barellm
