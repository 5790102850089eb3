// barellm command line: run, chat, serve, ppl, bench, ladder, info, tokenize, detokenize.
// Every failure arrives here as a barellm::Error and is printed as one line.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>

#include "backend.h"
#include "commands/bench.h"
#include "commands/cli.h"
#include "commands/ladder.h"
#include "cpu/kernels.h"
#include "generation/chat_session.h"
#include "generation/generate.h"
#include "generation/sampler.h"
#include "serve/http_server.h"
#include "serve/scheduler.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/files.h"
#include "util/json.h"
#include "util/machine.h"
#include "util/memory.h"
#include "util/terminal.h"
#include "util/timing.h"
#include "weights/model.h"

using namespace barellm;

namespace {

constexpr int kUsageExit = 2;
constexpr int kDefaultContextCap = 4096;      // KV cache size when --ctx is not given
constexpr int kInterruptedExit = 130;         // the shell convention for SIGINT
const char* const kColorPrompt = "\x1b[33m";  // yellow, as llama-cli writes the prompt
const char* const kColorReset = "\x1b[0m";

// The KV-cache length for a command: --ctx, else the model's own capped at a default.
int context_length(const Options& options, const Config& config, int default_cap) {
    if (options.context > config.max_context)
        throw Error("--ctx " + std::to_string(options.context) +
                    " exceeds the model's maximum context of " +
                    std::to_string(config.max_context));
    return options.context > 0 ? options.context : std::min(config.max_context, default_cap);
}

// The backend of --device; for --device auto, one line on stderr says which it is.
std::unique_ptr<Backend> make_backend_saying_device(const Model& model,
                                                    const BackendOptions& options) {
    std::string choice;
    auto backend = make_backend(model, options, &choice);
    if (!choice.empty()) std::fprintf(stderr, "barellm: %s\n", choice.c_str());
    return backend;
}

Sampler make_sampler(const Options& options, const Config& config) {
    const uint64_t seed =
        options.has_seed ? options.seed : uint64_t(Clock::now().time_since_epoch().count());
    return Sampler(config.vocab_size, options.sampling, seed);
}

// The prompt of run: -p TEXT, -p - (standard input) or -f FILE.
std::string run_prompt_text(const Options& options) {
    if (options.has_prompt == options.has_file)
        throw UsageError("run needs -p PROMPT, -p - or -f FILE (one of them)");
    if (options.has_file) return read_text_file(options.file);
    return options.prompt == "-" ? read_text_file("-") : options.prompt;
}

int command_run(const Options& options) {
    const std::string prompt_text = run_prompt_text(options);
    const auto [model, tokenizer] = load_model_and_tokenizer(options.model_path);
    const Config& config = model.config;
    const int context = context_length(options, config, kDefaultContextCap);
    // --chat: the prompt rendered by the model's chat template (src/generation/chat_session.h).
    std::vector<int> prompt;
    int end_of_turn = -1;
    ReasoningMarkup reasoning = ReasoningMarkup::ThinkBlock;
    bool markup_is_special = false;
    if (options.chat) {
        ChatFormat format = load_chat_format(model, tokenizer, "--chat");
        if (options.reasoning_effort)
            set_reasoning_effort(format.chat, *options.reasoning_effort, "--reasoning-effort");
        prompt = first_turn_ids(format, tokenizer, config, options.system, prompt_text,
                                !options.no_think);
        end_of_turn = format.end_of_turn;
        reasoning = chat_reasoning_markup(format.chat.family);
        markup_is_special = chat_markup_is_special(format.chat.family);
    } else {
        prompt =
            encode_prompt(tokenizer, config, prompt_text, config.add_bos, options.parse_special);
    }
    if (prompt.empty()) throw Error("the prompt is empty and the model adds no BOS token");
    if (int(prompt.size()) > context)
        throw Error("the prompt is " + std::to_string(prompt.size()) +
                    " tokens, longer than the context of " + std::to_string(context));

    auto backend =
        make_backend_saying_device(model, BackendOptions{context, options.kv_type, options.device});
    Sampler sampler = make_sampler(options, config);
    GenerateOptions generation;
    generation.max_tokens = options.generate;
    generation.context = context;
    generation.end_of_turn = end_of_turn;
    generation.stop_strings = options.stop_strings;
    generation.keep_special_text = markup_is_special;
    generation.interrupted = &interrupted;
    catch_interrupts();

    if (!options.chat) {  // --chat: the reply only
        const bool color = options.color && is_terminal(STDOUT_FILENO);
        write_now(color ? kColorPrompt + prompt_text + kColorReset : prompt_text);
    }
    // --chat hides a reasoning reply's <think>...</think> block (harmony: every channel but
    // the final one) unless --show-think, which prints the reply as generated.
    ReasoningFilter reasoning_filter(reasoning);
    const bool hide_reasoning = options.chat && !options.show_think;
    const GenerateStats stats = generate(
        *backend, config, tokenizer, sampler, prompt, generation, [&](const std::string& piece) {
            write_now(hide_reasoning ? reasoning_filter.feed(piece) : piece);
        });
    write_now(reasoning_filter.finish() + "\n");
    std::fprintf(stderr, "\n%s\n", stats_line(stats, context).c_str());
    return interrupted ? kInterruptedExit : 0;
}

int command_chat(const Options& options) {
    if (options.has_prompt || options.has_file)
        throw UsageError("chat reads its messages from standard input; it takes no -p or -f");
    if (options.chat) throw UsageError("--chat is for run; chat is a conversation already");
    const auto [model, tokenizer] = load_model_and_tokenizer(options.model_path);
    const int context = context_length(options, model.config, kDefaultContextCap);
    ChatFormat format = load_chat_format(model, tokenizer, "chat");
    if (options.reasoning_effort)
        set_reasoning_effort(format.chat, *options.reasoning_effort, "--reasoning-effort");
    auto backend =
        make_backend_saying_device(model, BackendOptions{context, options.kv_type, options.device});
    Sampler sampler = make_sampler(options, model.config);
    ChatSettings settings;
    settings.context = context;
    settings.max_reply_tokens = options.generate;
    settings.system = options.system;
    settings.stop_strings = options.stop_strings;
    settings.color = options.color;
    if (const auto model_file = file_identity(options.model_path))
        settings.inputs.push_back(*model_file);
    return run_chat(model, tokenizer, *backend, sampler, format, settings);
}

// The blocks of serve's paged KV cache: --kv-memory's worth, else enough for --parallel
// sequences of the whole context, as far as half the available memory allows. Either way at
// least the blocks one sequence of the whole context needs.
int serve_kv_blocks(const Options& options, const Config& config, int context) {
    const size_t block_bytes = size_t(config.layers) * config.kv_heads * config.head_dim * 2 *
                               kv_element_bytes(options.kv_type) * options.block_size;
    const size_t per_sequence = (size_t(context) + options.block_size - 1) / options.block_size;
    size_t blocks = per_sequence * options.parallel;
    if (options.kv_memory > 0) {
        blocks = options.kv_memory / block_bytes;
        if (blocks < per_sequence)
            throw Error("--kv-memory " + std::to_string(options.kv_memory) + " holds " +
                        std::to_string(blocks) + " KV blocks of " +
                        std::to_string(options.block_size) + " positions (" +
                        std::to_string(block_bytes) + " bytes each); one sequence of --ctx " +
                        std::to_string(context) + " needs " + std::to_string(per_sequence));
    } else if (const size_t available = available_memory_bytes();
               available > 0 && blocks * block_bytes > available / 2) {
        blocks = std::max(per_sequence, available / 2 / block_bytes);
        std::fprintf(stderr,
                     "barellm: %zu KV blocks (%zu MiB, half the available memory) hold fewer "
                     "than --parallel %d sequences of --ctx %d; longer ones wait or are "
                     "preempted\n",
                     blocks, blocks * block_bytes >> 20, options.parallel, context);
    }
    constexpr size_t kMaxBlocks = size_t(1) << 30;
    return int(std::min(blocks, kMaxBlocks));
}

int command_serve(const Options& options) {
    const auto [model, tokenizer] = load_model_and_tokenizer(options.model_path);
    const Config& config = model.config;
    const int context = context_length(options, config, kDefaultContextCap);
    if (context < 2) throw Error("serve needs --ctx of at least 2: a prompt and a reply");
    BackendOptions backend_options{context, options.kv_type, options.device};
    backend_options.kv_blocks = serve_kv_blocks(options, config, context);
    backend_options.kv_block_size = options.block_size;
    auto backend = make_backend_saying_device(model, backend_options);

    serve::ServerOptions server;
    server.host = options.host;
    server.port = options.port;
    server.api_key = options.api_key;
    const size_t slash = options.model_path.find_last_of('/');
    server.model_id =
        slash == std::string::npos ? options.model_path : options.model_path.substr(slash + 1);
    server.context = context;
    server.parallel = options.parallel;
    server.sampling = options.sampling;
    if (options.has_seed) server.seed = options.seed;
    try {
        server.chat = load_chat_format(model, tokenizer, "/v1/chat/completions");
    } catch (const Error& e) {
        server.no_chat = e.what();
    }
    serve::SchedulerOptions scheduling;
    scheduling.parallel = options.parallel;
    scheduling.context = context;
    scheduling.loop_thread = serve::LoopThread::Caller;  // on this thread: serve_http
    serve::Scheduler scheduler(*backend, config, tokenizer, scheduling, backend_options.kv_blocks,
                               options.block_size);
    serve::serve_http(config, tokenizer, scheduler, server);
    return 0;
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
    auto backend = make_backend_saying_device(model, backend_options);
    catch_interrupts();

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
    bench.depth = options.depth;
    bench.repetitions = options.repetitions;
    bench.json = options.json_output;
    bench.kv_type = options.kv_type;
    bench.device = options.device;
    run_bench(bench);
    return 0;
}

// What the attention adds to Llama's: "q/k/v bias, q/k norm per head" (Qwen2, Qwen3...).
std::string attention_features(const Config& c) {
    std::string features;
    for (const auto& [present, name] :
         {std::pair{c.qkv_bias, "q/k/v bias"}, std::pair{c.o_bias, "output bias"},
          std::pair{c.qk_norm, "q/k norm per head"}})
        if (present) features += std::string(features.empty() ? "" : ", ") + name;
    return features.empty() ? "no biases, no q/k norm" : features;
}

// How RoPE's frequencies are rescaled, in one line: "llama3, factor 8, original context
// 8192", "longrope, long factors beyond 4096 positions, attention factor 1.19", "yarn, ...".
std::string rope_scaling_summary(const RopeScaling& s) {
    char text[160];
    switch (s.kind) {
        case RopeScaling::Kind::Linear:
            std::snprintf(text, sizeof text, "linear, factor %g", s.factor);
            break;
        case RopeScaling::Kind::Llama3:
            std::snprintf(text, sizeof text, "llama3, factor %g, original context %d", s.factor,
                          s.original_context);
            break;
        case RopeScaling::Kind::Yarn:
            std::snprintf(text, sizeof text,
                          "yarn, factor %g, original context %d, attention factor %g", s.factor,
                          s.original_context, s.attention_factor);
            break;
        case RopeScaling::Kind::LongRope:
            std::snprintf(text, sizeof text,
                          "longrope, long factors beyond %d positions, attention factor %g",
                          s.original_context, s.attention_factor);
            break;
        case RopeScaling::Kind::None:
            return "none";
    }
    return text;
}

// The table of matrix types: for each type, how many matrices, which, and their bytes.
void print_matrix_types(const Model& model) {
    struct Row {
        int count = 0;
        size_t bytes = 0;
        std::vector<std::string> names;  // the matrices' names without "layers.N." or "[e]"
    };
    std::map<std::string, Row> rows;
    for (const auto& [name, m] : model.named_matrices()) {
        Row& row = rows[matrix_type_name(m->dtype)];
        ++row.count;
        row.bytes += m->bytes();
        std::string role = name.substr(name.rfind('.') + 1);
        if (name.find(".experts.") != std::string::npos)  // "layers.N.experts.w1[e]"
            role = "experts." + role.substr(0, role.find('['));
        if (std::find(row.names.begin(), row.names.end(), role) == row.names.end())
            row.names.push_back(role);
    }
    std::printf("matrix types    type    matrices       bytes  which\n");
    for (const auto& [type, row] : rows) {
        std::string which;
        for (const std::string& name : row.names) which += (which.empty() ? "" : " ") + name;
        std::printf("                %-7s %8d %11zu  %s\n", type.c_str(), row.count, row.bytes,
                    which.c_str());
    }
}

int command_info(const Options& options) {
    const Model model = Model::load(options.model_path);
    const Config& c = model.config;
    std::map<std::string, size_t> bytes_by_dtype;
    for (const auto& [name, view] : model.file->tensors())
        bytes_by_dtype[dtype_name(view.dtype)] += view.bytes;
    std::printf("file            %s (%zu bytes)\n", options.model_path.c_str(),
                model.file->file_size());
    std::printf("architecture    %s\n", c.architecture.c_str());
    std::printf("attention       %s\n", attention_features(c).c_str());
    std::printf("dim             %d\nhidden_dim      %d\nlayers          %d\n", c.dim, c.hidden_dim,
                c.layers);
    std::printf("heads           %d\nkv_heads        %d\nhead_dim        %d\n", c.heads, c.kv_heads,
                c.head_dim);
    if (c.experts > 0) {
        int sparse = 0;
        for (int l = 0; l < c.layers; ++l) sparse += c.is_sparse(l);
        std::printf("experts         %d, %d active per token, moe_hidden_dim %d, weights %s\n",
                    c.experts, c.experts_per_token, c.moe_hidden_dim,
                    c.norm_topk_prob ? "rescaled to sum to 1" : "as the softmax gives them");
        if (c.expert_biases) std::printf("expert_biases   router and experts\n");
        std::printf("sparse layers   %d of %d\n", sparse, c.layers);
    }
    std::printf("vocab_size      %d\nmax_context     %d\n", c.vocab_size, c.max_context);
    std::printf("rope_theta      %g\n", c.rope_theta);
    if (c.rotary_dim != c.head_dim)
        std::printf("rotary_dim      %d of each head's %d elements\n", c.rotary_dim, c.head_dim);
    if (c.rope_scaling.kind != RopeScaling::Kind::None)
        std::printf("rope_scaling    %s\n", rope_scaling_summary(c.rope_scaling).c_str());
    if (c.rope_theta_local > 0)
        std::printf("rope_theta_local %g (sliding layers)\n", c.rope_theta_local);
    std::printf("norm_eps        %g\n", c.norm_eps);
    std::printf("sliding_window  %d", c.sliding_window);
    if (!c.sliding_layers.empty()) {
        std::printf(" (layers");
        for (int l = 0; l < c.layers; ++l)
            if (c.layer_window(l) > 0) std::printf(" %d", l);
        std::printf(")");
    } else if (c.sliding_window_first_layer > 0) {
        std::printf(" (layers %d and up)", c.sliding_window_first_layer);
    }
    // Gemma's and gpt-oss's departures from Llama, shown where the model has them.
    if (c.attention_scale != float(1.0 / std::sqrt(double(c.head_dim))))
        std::printf("\nattention_scale %g", c.attention_scale);
    if (c.embedding_scale != 1.0f) std::printf("\nembedding_scale %g", c.embedding_scale);
    if (c.post_norms) std::printf("\npost_norms      attention and feed-forward outputs");
    if (c.activation == Activation::GeluTanh) std::printf("\nactivation      gelu_tanh (GeGLU)");
    if (c.activation == Activation::SwigluOai)
        std::printf("\nactivation      swiglu_oai (clamped SwiGLU, limit %g)", c.swiglu_limit);
    if (c.attention_sinks) std::printf("\nattention_sinks one per query head");
    if (c.attn_logit_softcap > 0)
        std::printf("\nsoftcap         attention scores %g", c.attn_logit_softcap);
    if (c.final_logit_softcap > 0)
        std::printf("\nsoftcap         logits %g", c.final_logit_softcap);
    std::printf("\ntied_embeddings %s\n", c.tied_embeddings ? "yes" : "no");
    std::printf("bos_id          %d\neos_ids        ", c.bos_id);
    for (int id : c.eos_ids) std::printf(" %d", id);
    std::printf("\nweight_dtype    %s\n", c.weight_dtype.c_str());
    std::printf("tensors         %zu\nparameters      %zu\n", model.file->tensors().size(),
                model.parameter_count());
    if (c.experts > 0) std::printf("active parameters %zu\n", model.active_parameter_count());
    for (const auto& [dtype, bytes] : bytes_by_dtype)
        std::printf("bytes %-9s %zu\n", dtype.c_str(), bytes);
    print_matrix_types(model);
    std::printf("weight bytes read per token %zu\n", model.weight_bytes_per_token());
    std::printf("cpu kernels     %s\n", cpu::simd_description().c_str());
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

// Sets the thread count: --threads, else OMP_NUM_THREADS when set, else one thread per
// physical core; and starts the OpenMP threads now, having checked that they can start
// (the OpenMP runtime ends the process when a thread it needs cannot be created).
void start_threads(const Options& options) {
    if (options.threads > 0)
        omp_set_num_threads(options.threads);
    else if (!std::getenv("OMP_NUM_THREADS"))
        omp_set_num_threads(physical_core_count());
    const int wanted = omp_get_max_threads();
    int error = 0;
    const int started = threads_that_start(wanted, &error);
    if (started < wanted) {
        const std::string asked = options.threads > 0              ? "--threads"
                                  : std::getenv("OMP_NUM_THREADS") ? "OMP_NUM_THREADS"
                                                                   : "one thread per core";
        throw Error("only " + std::to_string(started) + " of the " + std::to_string(wanted) +
                    " threads asked for (" + asked + ") could be started: " + std::strerror(error) +
                    "; ask for fewer with --threads");
    }
#pragma omp parallel
    {
        // Nothing: the team of threads is created here, while they are known to fit.
    }
}

int run_command(const Options& options) {
    if (options.command == "help") {
        write_now(kUsage);
        return 0;
    }
    std::string missing;
    const cpu::SimdLevel best = cpu::detect_simd_level(&missing);
    if (best == cpu::SimdLevel::Scalar && options.simd != "scalar")
        std::fprintf(stderr, "barellm: this CPU lacks%s; using the slow scalar kernels\n",
                     missing.c_str());
    if (!options.simd.empty()) {
        cpu::SimdLevel asked = best;
        cpu::parse_simd_level(options.simd, &asked);
        if (asked > best)
            throw UsageError("--simd " + options.simd + ": this CPU runs at most " +
                             cpu::simd_level_name(best));
        cpu::set_simd_level(asked);
    }
    start_threads(options);
    using Command = int (*)(const Options&);
    static const std::map<std::string, Command> commands = {{"run", command_run},
                                                            {"chat", command_chat},
                                                            {"serve", command_serve},
                                                            {"ppl", command_ppl},
                                                            {"info", command_info},
                                                            {"bench", command_bench},
                                                            {"ladder", run_ladder_command},
                                                            {"tokenize", command_tokenize},
                                                            {"detokenize", command_detokenize}};
    const auto command = commands.find(options.command);
    if (command == commands.end())
        throw UsageError("unknown command " + quoted_excerpt(options.command));
    check_model_path(options.model_path);
    return command->second(options);
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const int status = run_command(parse_options(argc, argv));
        check_standard_output();
        return status;
    } catch (const UsageError& e) {
        // Run bare, barellm shows its usage; a wrong command line gets one line.
        if (argc <= 1)
            std::fprintf(stderr, "barellm: %s\n\n%s", e.what(), kUsage);
        else
            std::fprintf(stderr, "barellm: %s (barellm --help lists the options)\n", e.what());
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
