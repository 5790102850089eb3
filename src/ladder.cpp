// `barellm ladder` (ladder.h): the same model timed with one optimisation added per rung,
// on the CPU or on the GPU.
#include "ladder.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "backend.h"
#include "bench.h"
#include "cpu/kernels.h"
#include "error.h"
#include "generate.h"
#include "model_copy.h"
#include "sampler.h"
#include "timing.h"
#include "tokenizer/tokenizer.h"

namespace barellm {

namespace {

constexpr int kDefaultLadderTokens = 64;
constexpr uint64_t kTokenSeed = 1234;  // random ids, the same every run (as bench)
constexpr int kWarmupPrefill = 16;     // tokens of rung 6's untimed warm-up prefill

// ==== Shared by the CPU and the GPU ladder

// `count` decode steps from position 0; returns seconds, adds the bytes read to *bytes.
double time_decode(Backend& backend, const Model& model, const std::vector<int>& tokens, int count,
                   double* bytes) {
    const auto start = Clock::now();
    for (int pos = 0; pos < count; ++pos) backend.forward(tokens[pos], pos);
    const double seconds = seconds_since(start);
    for (int pos = 0; pos < count; ++pos)
        *bytes += double(model.weight_bytes_per_token()) + backend.kv_bytes_read(pos);
    return seconds;
}

// A warm-up step, then `count` timed decode steps from position 0: tok/s and GB/s.
std::pair<double, double> decode_speed(Backend& backend, const Model& model,
                                       const std::vector<int>& tokens, int count) {
    backend.forward(tokens[0], 0);  // warm-up
    double bytes = 0;
    const double seconds = time_decode(backend, model, tokens, count, &bytes);
    return {count / seconds, bytes / seconds / 1e9};
}

// `count` random ids, the same every run.
std::vector<int> random_tokens(const Config& config, int count) {
    std::mt19937_64 rng(kTokenSeed);
    std::vector<int> tokens(count);
    for (int& t : tokens) t = int(rng() % config.vocab_size);
    return tokens;
}

// The --check-text prompt as ids, refused when it and -n do not fit in the model.
std::vector<int> check_text_prompt(const Model& model, const Tokenizer& tokenizer,
                                   const Options& options, int gen_tokens) {
    std::vector<int> prompt = encode_prompt(tokenizer, model.config, options.check_text,
                                            model.config.add_bos, options.parse_special);
    if (prompt.empty()) throw Error("--check-text is empty and the model adds no BOS token");
    if (int(prompt.size()) + gen_tokens > model.config.max_context)
        throw Error("--check-text and -n need " + std::to_string(prompt.size() + gen_tokens) +
                    " positions, beyond the model's " + std::to_string(model.config.max_context));
    return prompt;
}

// Greedy completion of `prompt` on `backend`, the loop of `barellm run --temp 0`, the
// prompt as one prefill batch or one token at a time. Returns the prompt's text followed
// by the continuation of at most `gen_tokens` tokens.
std::string greedy_text(Backend& backend, PromptFeed feed, const Model& model,
                        const Tokenizer& tokenizer, const std::string& text,
                        const std::vector<int>& prompt, int gen_tokens) {
    SamplingOptions greedy_options;
    greedy_options.temperature = 0;
    Sampler greedy(model.config.vocab_size, greedy_options, /*seed=*/0);
    GenerateOptions options;
    options.max_tokens = gen_tokens;
    options.context = int(prompt.size()) + gen_tokens;
    options.prompt_feed = feed;
    std::string out = text;
    generate(backend, model.config, tokenizer, greedy, prompt, options,
             [&out](const std::string& piece) { out += piece; });
    return out;
}

const char* kv_name(KvType type) { return type == KvType::F16 ? "f16" : "f32"; }

void print_json_line(const nlohmann::json& line) {
    std::printf("%s\n",
                line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    std::fflush(stdout);
}

void print_table_header() {
    std::printf("| rung | what changed | tok/s | GB/s | %% bw | speed-up |\n");
    std::printf("| ---: | --- | ---: | ---: | ---: | ---: |\n");
    std::fflush(stdout);
}

void print_table_row(int rung, const std::string& change, double tokens_per_second, double gbps,
                     double bandwidth, double speedup) {
    std::printf("| %d | %s | %.2f | %.3f | %.1f%% | %.2fx |\n", rung, change.c_str(),
                tokens_per_second, gbps, 100 * gbps / bandwidth, speedup);
    std::fflush(stdout);
}

// ==== The CPU ladder

struct Rung {
    int number;
    std::string change;  // what this rung adds to the one before
    int threads;
    cpu::SimdLevel simd;
    DType weights;
    bool batched_prefill;
};

// prompt_tokens: the length rung 6 is timed with, 0 when it runs a given text.
std::vector<Rung> ladder_rungs(int threads, int prompt_tokens) {
    std::string missing;
    const cpu::SimdLevel best = cpu::detect_simd_level(&missing);
    const std::string simd_change =
        best == cpu::SimdLevel::Avx2
            ? "+ AVX2/FMA SIMD kernels"
            : "+ AVX2/FMA SIMD kernels (not on this CPU, which lacks" + missing + ": scalar)";
    const std::string thread_change =
        "+ OpenMP, " + std::to_string(threads) + (threads == 1 ? " thread" : " threads");
    const std::string prefill_change =
        prompt_tokens > 0 ? "+ batched prefill (" + std::to_string(prompt_tokens) + "-token prompt)"
                          : "+ batched prefill";
    using cpu::SimdLevel;
    return {
        {1, "scalar kernels, 1 thread, f32 weights", 1, SimdLevel::Scalar, DType::F32, false},
        {2, thread_change, threads, SimdLevel::Scalar, DType::F32, false},
        {3, simd_change, threads, best, DType::F32, false},
        {4, "+ f16 weights", threads, best, DType::F16, false},
        {5, "+ q8 weights", threads, best, DType::I8, false},
        {6, prefill_change, threads, best, DType::I8, true},
    };
}

// The model's weights in the dtype a rung needs: the file itself when its dtype matches,
// else an in-memory copy. At most one copy is held: the previous one is freed first.
class Weights {
public:
    explicit Weights(const Model& file_model) : file_model_(file_model) {}

    const Model& in(DType dtype) {
        if (file_model_.token_embedding.dtype == dtype) {
            copy_.reset();
            return file_model_;
        }
        if (!copy_ || copy_->model.token_embedding.dtype != dtype) {
            copy_.reset();
            copy_ = copy_model(file_model_, dtype);
        }
        return copy_->model;
    }

private:
    const Model& file_model_;
    std::unique_ptr<ModelCopy> copy_;
};

void enter_rung(const Rung& rung) {
    omp_set_num_threads(rung.threads);
    cpu::set_simd_level(rung.simd);
}

struct RungResult {
    double tokens_per_second = 0;
    double gbps = 0;
    double token_by_token_per_second = 0;  // rung 6 only: the same prompt, one token a step
};

RungResult time_rung(const Rung& rung, const Model& model, const std::vector<int>& tokens,
                     int gen_tokens, int prompt_tokens, KvType kv_type) {
    const int context = std::max(gen_tokens, prompt_tokens);
    auto backend = make_cpu_backend(model, BackendOptions{context, kv_type, Device::Cpu});
    RungResult result;
    if (!rung.batched_prefill) {
        std::tie(result.tokens_per_second, result.gbps) =
            decode_speed(*backend, model, tokens, gen_tokens);
        return result;
    }
    backend->prefill(tokens.data(), std::min(prompt_tokens, kWarmupPrefill), 0, false);
    double unused = 0;
    result.token_by_token_per_second =
        prompt_tokens / time_decode(*backend, model, tokens, prompt_tokens, &unused);
    const auto start = Clock::now();
    backend->prefill(tokens.data(), prompt_tokens, 0, false);
    const double seconds = seconds_since(start);
    // Weights once per batch (a lower bound) plus every query's KV reads, as bench counts.
    const int batches = (prompt_tokens + backend->max_batch() - 1) / backend->max_batch();
    double bytes = double(model.weight_bytes_per_token()) * batches;
    for (int pos = 0; pos < prompt_tokens; ++pos) bytes += backend->kv_bytes_read(pos);
    result.tokens_per_second = prompt_tokens / seconds;
    result.gbps = bytes / seconds / 1e9;
    return result;
}

int run_cpu_ladder(const Options& options, int gen_tokens) {
    const int prompt_tokens =
        options.has_prompt ? int(parse_integer("-p", options.prompt, 1, 1 << 20)) : gen_tokens;
    const int threads = omp_get_max_threads();  // --threads, or OpenMP's default
    const cpu::SimdLevel initial_level = cpu::simd_level();
    const Model file_model = Model::load(options.model_path);
    const Config& config = file_model.config;
    Weights weights(file_model);
    const std::vector<Rung> rungs =
        ladder_rungs(threads, options.has_check_text ? 0 : prompt_tokens);

    if (options.has_check_text) {
        const Tokenizer tokenizer = load_tokenizer(file_model);
        const std::vector<int> prompt =
            check_text_prompt(file_model, tokenizer, options, gen_tokens);
        const int context = int(prompt.size()) + gen_tokens;
        for (const Rung& rung : rungs) {
            enter_rung(rung);
            const Model& model = weights.in(rung.weights);
            auto backend =
                make_cpu_backend(model, BackendOptions{context, options.kv_type, Device::Cpu});
            const PromptFeed feed =
                rung.batched_prefill ? PromptFeed::OneBatch : PromptFeed::TokenByToken;
            const std::string text = greedy_text(*backend, feed, model, tokenizer,
                                                 options.check_text, prompt, gen_tokens);
            print_json_line(
                {{"rung", rung.number},
                 {"change", rung.change},
                 {"weights", weight_dtype_name(rung.weights)},
                 {"threads", rung.threads},
                 {"simd", cpu::simd_level_name(rung.simd)},
                 {"prompt", rung.batched_prefill ? "batched prefill" : "token by token"},
                 {"text", text}});
        }
        omp_set_num_threads(threads);
        cpu::set_simd_level(initial_level);
        return 0;
    }

    const int context = std::max(gen_tokens, prompt_tokens);
    if (context > config.max_context)
        throw Error("ladder needs " + std::to_string(context) + " positions, beyond the model's " +
                    std::to_string(config.max_context));
    const std::vector<int> tokens = random_tokens(config, context);

    // The bandwidth the fastest rungs can hope for: all threads, the best SIMD level.
    omp_set_num_threads(threads);
    cpu::set_simd_level(cpu::detect_simd_level());
    const double bandwidth = measure_read_bandwidth();

    std::printf("%s: %s weights in the file, %d layers, dim %d; %d threads; KV cache %s\n\n",
                options.model_path.c_str(), config.weight_dtype.c_str(), config.layers, config.dim,
                threads, kv_name(options.kv_type));
    print_table_header();
    std::vector<std::pair<DType, size_t>> bytes_per_token;
    double previous = 0;
    RungResult last;
    for (const Rung& rung : rungs) {
        enter_rung(rung);
        const Model& model = weights.in(rung.weights);
        if (bytes_per_token.empty() || bytes_per_token.back().first != rung.weights)
            bytes_per_token.push_back({rung.weights, model.weight_bytes_per_token()});
        last = time_rung(rung, model, tokens, gen_tokens, prompt_tokens, options.kv_type);
        const double speedup = rung.batched_prefill
                                   ? last.tokens_per_second / last.token_by_token_per_second
                                   : (previous > 0 ? last.tokens_per_second / previous : 1.0);
        print_table_row(rung.number, rung.change, last.tokens_per_second, last.gbps, bandwidth,
                        speedup);
        previous = last.tokens_per_second;
    }
    omp_set_num_threads(threads);
    cpu::set_simd_level(initial_level);

    std::printf("\nmemory bandwidth (streaming read, %d threads, same run): %.1f GB/s\n", threads,
                bandwidth);
    std::printf(
        "rungs 1-5: %d decode steps from random ids (seed %llu) after one warm-up step; "
        "GB/s counts the weights and the KV cache read\n",
        gen_tokens, static_cast<unsigned long long>(kTokenSeed));
    std::printf(
        "rung 6: a %d-token prompt, %.2f tok/s token by token with rung 5's kernels, %.2f "
        "tok/s as one prefill batch; its speed-up is batch over token by token\n",
        prompt_tokens, last.token_by_token_per_second, last.tokens_per_second);
    std::printf("weight bytes read per token:");
    for (const auto& [dtype, bytes] : bytes_per_token)
        std::printf(" %s %zu;", weight_dtype_name(dtype), bytes);
    std::printf(" KV cache per position %zu\n", 2 * size_t(config.layers) * config.kv_dim() *
                                                    (options.kv_type == KvType::F16 ? 2 : 4));
    return 0;
}

// ==== The GPU ladder

// A rung of the GPU ladder: the CUDA backend's switches (BackendOptions).
struct GpuRung {
    int number;
    std::string change;  // what this rung adds to the one before
    CudaKernels kernels;
    KvType kv_type;
    bool graph;
    bool flash_decoding;
};

std::vector<GpuRung> gpu_ladder_rungs() {
    using K = CudaKernels;
    constexpr KvType F32 = KvType::F32, F16 = KvType::F16;
    return {
        {1,
         "naive port: a thread per matrix row, RMSNorm, RoPE, KV write, residual adds and SwiGLU "
         "as separate kernels, naive attention, f32 KV cache, no graph",
         K::NaivePort, F32, false, false},
        {2, "+ a warp per matrix row (coalesced loads, shuffle sum, lane 0 stores)", K::WarpPerRow,
         F32, false, false},
        {3,
         "+ fused kernels: RMSNorm and residual adds in the matvecs, w1/w3 and SwiGLU in one, "
         "RoPE with the KV write",
         K::Fused, F32, false, false},
        {4,
         "+ fast matvecs: 16-byte loads, 4 in flight, input staged in shared memory, coalesced "
         "stores",
         K::FastMatvec, F32, false, false},
        {5,
         "+ coalesced attention: a block per KV head reads each K/V row once, 8 lanes per key, "
         "a warp per value, online softmax (one split), RoPE and the KV write inside",
         K::Fast, F32, false, false},
        {6, "+ f16 KV cache (read as half2)", K::Fast, F16, false, false},
        {7, "+ CUDA graph: one launch per token", K::Fast, F16, true, false},
        {8, "+ flash-decoding: positions split across blocks, merged by the last (the fast path)",
         K::Fast, F16, true, true},
    };
}

std::unique_ptr<Backend> make_rung_backend(const GpuRung& rung, const Model& model, int context) {
    BackendOptions options{context, rung.kv_type, Device::Cuda};
    options.cuda_kernels = rung.kernels;
    options.cuda_graph = rung.graph;
    options.flash_decoding = rung.flash_decoding;
    return make_backend(model, options);
}

void check_gpu() {
#ifdef BARELLM_CUDA
    std::string reason;
    if (!cuda_device_available(&reason))
        throw Error("ladder --device cuda: the GPU ladder needs a GPU build and a GPU: " + reason);
#else
    throw Error(
        "ladder --device cuda: the GPU ladder needs a GPU build and a GPU; this barellm was "
        "built without CUDA (nvcc was not found)");
#endif
}

int run_gpu_ladder(const Options& options, int gen_tokens) {
    if (options.has_prompt)
        throw UsageError(
            "ladder --device cuda times decode only: -p (the CPU ladder's prefill rung) does "
            "not apply");
    check_gpu();
    const Model model = Model::load(options.model_path);  // the file's weights, its dtype
    const Config& config = model.config;
    const std::vector<GpuRung> rungs = gpu_ladder_rungs();

    if (options.has_check_text) {
        const Tokenizer tokenizer = load_tokenizer(model);
        const std::vector<int> prompt = check_text_prompt(model, tokenizer, options, gen_tokens);
        for (const GpuRung& rung : rungs) {
            auto backend = make_rung_backend(rung, model, int(prompt.size()) + gen_tokens);
            print_json_line(
                {{"rung", rung.number},
                 {"change", rung.change},
                 {"weights", config.weight_dtype},
                 {"kv", kv_name(rung.kv_type)},
                 {"graph", rung.graph},
                 {"flash_decoding", rung.flash_decoding},
                 {"text", greedy_text(*backend, PromptFeed::TokenByToken, model, tokenizer,
                                      options.check_text, prompt, gen_tokens)}});
        }
        return 0;
    }

    if (gen_tokens > config.max_context)
        throw Error("ladder needs " + std::to_string(gen_tokens) +
                    " positions, beyond the model's " + std::to_string(config.max_context));
    const std::vector<int> tokens = random_tokens(config, gen_tokens);
    std::printf("%s: %s weights (the file's), %d layers, dim %d; GPU\n\n",
                options.model_path.c_str(), config.weight_dtype.c_str(), config.layers, config.dim);
    double bandwidth = 0, previous = 0;
    for (const GpuRung& rung : rungs) {
        auto backend = make_rung_backend(rung, model, gen_tokens);
        if (bandwidth == 0) {  // the first rung's backend measures it for the whole table
            bandwidth = backend->measure_bandwidth_gbps();
            print_table_header();
        }
        const auto [tokens_per_second, gbps] = decode_speed(*backend, model, tokens, gen_tokens);
        print_table_row(rung.number, rung.change, tokens_per_second, gbps, bandwidth,
                        previous > 0 ? tokens_per_second / previous : 1.0);
        previous = tokens_per_second;
    }
    std::printf("\nmemory bandwidth (device-to-device copy, same run): %.1f GB/s\n", bandwidth);
    std::printf(
        "every rung: %d decode steps from position 0, random ids (seed %llu), after one "
        "warm-up step; GB/s counts the weights and the KV cache read\n",
        gen_tokens, static_cast<unsigned long long>(kTokenSeed));
    std::printf(
        "weight bytes read per token: %s %zu; KV cache per position: f32 %zu (rungs 1-5), f16 "
        "%zu (rungs 6-8)\n",
        config.weight_dtype.c_str(), model.weight_bytes_per_token(),
        2 * size_t(config.layers) * config.kv_dim() * kv_element_bytes(KvType::F32),
        2 * size_t(config.layers) * config.kv_dim() * kv_element_bytes(KvType::F16));
    return 0;
}

}  // namespace

int run_ladder_command(const Options& options) {
    const int gen_tokens = options.has_generate ? options.generate : kDefaultLadderTokens;
    if (gen_tokens < 1) throw UsageError("ladder needs -n of at least 1");
    return options.device == Device::Cuda ? run_gpu_ladder(options, gen_tokens)
                                          : run_cpu_ladder(options, gen_tokens);
}

}  // namespace barellm
