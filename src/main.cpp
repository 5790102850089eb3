// barellm command line: run, ppl, bench, info, tokenize, detokenize.
// Every failure arrives here as a barellm::Error and is printed as one line.
#include <omp.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>

#include "backend.h"
#include "bench.h"
#include "cli.h"
#include "cpu/kernels.h"
#include "error.h"
#include "files.h"
#include "generate.h"
#include "json.h"
#include "ladder.h"
#include "machine.h"
#include "model.h"
#include "sampler.h"
#include "timing.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

using namespace barellm;

namespace {

constexpr int kUsageExit = 2;
constexpr int kDefaultContextCap = 4096;  // KV cache size when --ctx is not given

// The Error for output that did not reach standard output (a full disk, say).
Error standard_output_error() {
    return Error(std::string("cannot write to standard output") +
                 (errno != 0 ? std::string(": ") + std::strerror(errno) : ""));
}

// Writes `text` to standard output now; throws Error when it does not get there.
void write_now(const std::string& text) {
    errno = 0;
    std::cout << text << std::flush;
    if (!std::cout) throw standard_output_error();
}

// Throws Error unless everything written to standard output, through std::cout or stdio,
// got there.
void check_standard_output() {
    errno = 0;
    std::cout.flush();
    if (std::fflush(stdout) != 0 || std::ferror(stdout) || !std::cout)
        throw standard_output_error();
}

// Ctrl-C sets this; the commands stop at the next token or chunk and still report.
std::atomic<bool> interrupted{false};
void on_interrupt(int) { interrupted = true; }
constexpr int kInterruptedExit = 130;  // the shell convention for SIGINT

// The KV-cache length for a command: --ctx, else the model's own capped at a default.
int context_length(const Options& options, const Config& config, int default_cap) {
    if (options.context > config.max_context)
        throw Error("--ctx " + std::to_string(options.context) +
                    " exceeds the model's maximum context of " +
                    std::to_string(config.max_context));
    return options.context > 0 ? options.context : std::min(config.max_context, default_cap);
}

int command_run(const Options& options) {
    if (!options.has_prompt) throw UsageError("run needs -p PROMPT");
    const auto [model, tokenizer] = load_model_and_tokenizer(options.model_path);
    const Config& config = model.config;
    const int context = context_length(options, config, kDefaultContextCap);
    // --chat: the prompt rendered by the model's chat template (src/tokenizer/chat.h), special
    // tokens parsed, BOS added only when the rendering does not start with it already.
    std::string text = options.prompt;
    bool add_bos = config.add_bos;
    int end_of_turn = -1;
    if (options.chat) {
        const auto& metadata = model.file->metadata();
        const auto found = metadata.find("barellm.chat_template");
        if (found == metadata.end())
            throw Error(
                "--chat: this model has no chat template (its tokenizer_config.json "
                "had no chat_template when it was converted)");
        const ChatTemplate chat = recognise_chat_template(found->second);
        const std::string bos = config.bos_id >= 0 ? tokenizer.token_text(config.bos_id) : "";
        text = render_chat(chat, options.system, options.prompt, bos);
        add_bos = config.add_bos && config.bos_id >= 0 && text.compare(0, bos.size(), bos) != 0;
        const std::string turn_end = chat_end_of_turn(chat.family);
        if (!turn_end.empty()) {
            const auto id = tokenizer.token_id(turn_end);
            if (!id) throw Error("--chat: the tokenizer has no " + turn_end + " token");
            end_of_turn = *id;
        }
    }
    const std::vector<int> prompt =
        encode_prompt(tokenizer, config, text, add_bos, options.parse_special || options.chat);
    if (prompt.empty()) throw Error("the prompt is empty and the model adds no BOS token");
    if (int(prompt.size()) > context)
        throw Error("the prompt is " + std::to_string(prompt.size()) +
                    " tokens, longer than the context of " + std::to_string(context));

    auto backend = make_backend(model, BackendOptions{context, options.kv_type, options.device});
    const uint64_t seed =
        options.has_seed ? options.seed : uint64_t(Clock::now().time_since_epoch().count());
    Sampler sampler(config.vocab_size, options.temperature, options.top_p, seed);
    GenerateOptions generation;
    generation.max_tokens = options.generate;
    generation.context = context;
    generation.end_of_turn = end_of_turn;
    generation.interrupted = &interrupted;
    std::signal(SIGINT, on_interrupt);

    if (!options.chat) write_now(options.prompt);  // --chat: the reply only
    const GenerateStats stats =
        generate(*backend, config, tokenizer, sampler, prompt, generation, write_now);
    write_now("\n");
    std::fprintf(stderr,
                 "\nprompt: %d tokens, %.1f tok/s | generated: %d tokens, %.1f tok/s | "
                 "stopped: %s\n",
                 stats.prompt_tokens, stats.prompt_tokens / stats.prefill_seconds,
                 stats.generated_tokens,
                 stats.generated_tokens / std::max(stats.decode_seconds, 1e-9),
                 stop_reason_text(stats.stop_reason, context).c_str());
    return interrupted ? kInterruptedExit : 0;
}

// Perplexity as llama.cpp's llama-perplexity computes it: the text tokenized once with
// BOS, cut into non-overlapping chunks of `context` tokens whose first token becomes BOS;
// only the second half of each chunk is scored.
int command_ppl(const Options& options) {
    if (!options.has_file) throw UsageError("ppl needs -f FILE");
    const auto [model, tokenizer] = load_model_and_tokenizer(options.model_path);
    const Config& config = model.config;
    constexpr int kDefaultPplContext = 512;
    const int context = context_length(options, config, kDefaultPplContext);
    if (context < 4) throw Error("ppl needs --ctx of at least 4");
    const std::vector<int> tokens = encode_prompt(tokenizer, config, read_text_file(options.file),
                                                  config.add_bos, /*parse_special=*/false);
    const int available_chunks = int(tokens.size() / context);
    if (available_chunks < 1)
        throw Error(options.file + ": " + std::to_string(tokens.size()) +
                    " tokens are fewer than one chunk of " + std::to_string(context));
    const int chunks =
        options.chunks > 0 ? std::min(options.chunks, available_chunks) : available_chunks;
    BackendOptions backend_options{context, options.kv_type, options.device};
    backend_options.all_logits = true;
    auto backend = make_backend(model, backend_options);
    std::signal(SIGINT, on_interrupt);

    const int first_scored = context / 2;
    double nll_sum = 0, nll_squared_sum = 0;
    long scored = 0;
    int chunks_done = 0;
    const auto start = Clock::now();
    for (int chunk = 0; chunk < chunks && !interrupted; ++chunk) {
        std::vector<int> chunk_tokens(tokens.begin() + size_t(chunk) * context,
                                      tokens.begin() + size_t(chunk + 1) * context);
        if (config.add_bos) chunk_tokens[0] = config.bos_id;
        const float* all_logits = backend->prefill(chunk_tokens.data(), context, 0, true);
        for (int pos = first_scored; pos < context - 1; ++pos) {
            const float* logits = all_logits + size_t(pos) * config.vocab_size;
            check_finite(logits, config.vocab_size, pos);
            // -log softmax(logits)[next], computed stably in double.
            const float max_logit = *std::max_element(logits, logits + config.vocab_size);
            double sum = 0;
            for (int i = 0; i < config.vocab_size; ++i)
                sum += std::exp(double(logits[i]) - max_logit);
            const double nll = std::log(sum) - (double(logits[chunk_tokens[pos + 1]]) - max_logit);
            nll_sum += nll;
            nll_squared_sum += nll * nll;
            ++scored;
        }
        std::fprintf(stderr, "[%d/%d] running PPL = %.4f\n", chunk + 1, chunks,
                     std::exp(nll_sum / scored));
        ++chunks_done;
    }
    if (scored == 0) throw Error("interrupted before any token was scored");
    const double mean = nll_sum / scored;
    const double variance = nll_squared_sum / scored - mean * mean;
    const double ppl = std::exp(mean);
    const double ppl_error =
        variance > 0 && scored > 1 ? std::sqrt(variance / (scored - 1)) * ppl : 0;
    std::fprintf(stderr, "%ld tokens scored in %.1f s%s\n", scored, seconds_since(start),
                 interrupted ? (" (interrupted after " + std::to_string(chunks_done) + " of " +
                                std::to_string(chunks) + " chunks)")
                                   .c_str()
                             : "");
    std::printf("PPL = %.4f +/- %.5f\n", ppl, ppl_error);
    return interrupted ? kInterruptedExit : 0;
}

int command_bench(const Options& options) {
    BenchOptions bench;
    bench.model_path = options.model_path;
    if (options.has_prompt)
        bench.prompt_tokens = int(parse_integer("-p", options.prompt, 0, 1 << 20));
    if (options.has_generate) bench.gen_tokens = options.generate;
    if (bench.prompt_tokens == 0 && bench.gen_tokens == 0)
        throw UsageError("bench has nothing to run with -p 0 -n 0");
    bench.repetitions = options.repetitions;
    bench.json = options.json_output;
    bench.kv_type = options.kv_type;
    bench.device = options.device;
    run_bench(bench);
    return 0;
}

int command_info(const Options& options) {
    const Model model = Model::load(options.model_path);
    const Config& c = model.config;
    std::map<std::string, size_t> bytes_by_dtype;
    for (const auto& [name, view] : model.file->tensors())
        bytes_by_dtype[dtype_name(view.dtype)] += view.bytes;
    std::printf("file            %s (%zu bytes)\n", options.model_path.c_str(),
                model.file->file_size());
    std::printf("architecture    llama\n");
    std::printf("dim             %d\nhidden_dim      %d\nlayers          %d\n", c.dim, c.hidden_dim,
                c.layers);
    std::printf("heads           %d\nkv_heads        %d\nhead_dim        %d\n", c.heads, c.kv_heads,
                c.head_dim);
    std::printf("vocab_size      %d\nmax_context     %d\n", c.vocab_size, c.max_context);
    std::printf("rope_theta      %g\nnorm_eps        %g\n", c.rope_theta, c.norm_eps);
    std::printf("sliding_window  %d\ntied_embeddings %s\n", c.sliding_window,
                c.tied_embeddings ? "yes" : "no");
    std::printf("bos_id          %d\neos_ids        ", c.bos_id);
    for (int id : c.eos_ids) std::printf(" %d", id);
    std::printf("\nweight_dtype    %s\n", c.weight_dtype.c_str());
    std::printf("tensors         %zu\nparameters      %zu\n", model.file->tensors().size(),
                model.parameter_count());
    for (const auto& [dtype, bytes] : bytes_by_dtype)
        std::printf("bytes %-9s %zu\n", dtype.c_str(), bytes);
    std::printf("weight bytes read per token %zu\n", model.weight_bytes_per_token());
    return 0;
}

int command_tokenize(const Options& options) {
    if (options.has_prompt == options.has_file)
        throw UsageError("tokenize needs -p TEXT or -f FILE");
    const auto [model, tokenizer] = load_model_and_tokenizer(options.model_path);
    const std::string text = options.has_prompt ? options.prompt : read_text_file(options.file);
    const std::vector<int> ids =
        encode_prompt(tokenizer, model.config, text, options.bos, options.parse_special);
    std::cout << nlohmann::json(ids).dump() << "\n";
    return 0;
}

int command_detokenize(const Options& options) {
    if (!options.has_prompt) throw UsageError("detokenize needs -p \"[ids...]\"");
    const auto [model, tokenizer] = load_model_and_tokenizer(options.model_path);
    const auto ids = parse_json(options.prompt, "detokenize: -p");
    if (!ids.is_array()) throw Error("detokenize: -p is not a JSON array of ids");
    std::vector<int> values;
    for (const auto& id : ids) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
            id.get<int64_t>() >= tokenizer.vocab_size())
            throw Error("detokenize: " + json_excerpt(id) + " is not a token id of this model");
        values.push_back(id.get<int>());
    }
    std::cout << tokenizer.decode(values) << "\n";
    return 0;
}

int run_command(const Options& options) {
    if (options.command == "help") {
        std::fputs(kUsage, stdout);
        return 0;
    }
    std::string missing;
    if (cpu::detect_simd_level(&missing) == cpu::SimdLevel::Scalar)
        std::fprintf(stderr, "barellm: this CPU lacks%s; using the slow scalar kernels\n",
                     missing.c_str());
    // --threads, else OMP_NUM_THREADS when set, else one thread per physical core.
    if (options.threads > 0)
        omp_set_num_threads(options.threads);
    else if (!std::getenv("OMP_NUM_THREADS"))
        omp_set_num_threads(physical_core_count());
    if (options.command == "run") return command_run(options);
    if (options.command == "ppl") return command_ppl(options);
    if (options.command == "info") return command_info(options);
    if (options.command == "bench") return command_bench(options);
    if (options.command == "ladder") return run_ladder_command(options);
    if (options.command == "tokenize") return command_tokenize(options);
    if (options.command == "detokenize") return command_detokenize(options);
    throw UsageError("unknown command " + quoted_excerpt(options.command));
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const int status = run_command(parse_options(argc, argv));
        check_standard_output();
        return status;
    } catch (const UsageError& e) {
        std::fprintf(stderr, "barellm: %s\n\n%s", e.what(), kUsage);
        return kUsageExit;
    } catch (const Error& e) {
        std::fprintf(stderr, "barellm: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "barellm: out of memory\n");
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "barellm: unexpected error: %s\n", e.what());
        return 1;
    }
}
