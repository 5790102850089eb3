#include "ladder.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "backend.h"
#include "bench.h"
#include "error.h"
#include "model_copy.h"
#include "sampler.h"
#include "tokenizer.h"

namespace barellm {

namespace {

constexpr int kDefaultLadderTokens = 64;
constexpr uint64_t kTokenSeed = 1234;  // random ids, the same every run (as bench)
constexpr int kWarmupPrefill = 16;     // tokens of rung 6's untimed warm-up prefill

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

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

void enter_rung(const Rung& rung) {
    omp_set_num_threads(rung.threads);
    cpu::set_simd_level(rung.simd);
}

struct RungResult {
    double tokens_per_second = 0;
    double gbps = 0;
    double token_by_token_per_second = 0;  // rung 6 only: the same prompt, one token a step
};

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

RungResult time_rung(const Rung& rung, const Model& model, const std::vector<int>& tokens,
                     int gen_tokens, int prompt_tokens, cpu::KvType kv_type) {
    const int context = std::max(gen_tokens, prompt_tokens);
    auto backend = make_cpu_backend(model, BackendOptions{context, kv_type, Device::Cpu});
    RungResult result;
    if (!rung.batched_prefill) {
        backend->forward(tokens[0], 0);  // warm-up
        double bytes = 0;
        const double seconds = time_decode(*backend, model, tokens, gen_tokens, &bytes);
        result.tokens_per_second = gen_tokens / seconds;
        result.gbps = bytes / seconds / 1e9;
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

std::vector<int> encode_text(const Model& model, const Tokenizer& tokenizer,
                             const std::string& text, bool parse_special) {
    std::vector<int> ids;
    if (model.config.add_bos && model.config.bos_id >= 0) ids.push_back(model.config.bos_id);
    for (int id : tokenizer.encode(text, parse_special)) ids.push_back(id);
    if (ids.empty()) throw Error("--check-text is empty and the model adds no BOS token");
    return ids;
}

// Greedy completion of `prompt` as `barellm run --temp 0` does it (stop at an
// end-of-text token or after `generate` tokens), except that rungs 1-5 run the prompt
// one token at a time. Returns the prompt's text followed by the continuation.
std::string greedy_text(const Rung& rung, const Model& model, const Tokenizer& tokenizer,
                        const std::string& text, const std::vector<int>& prompt, int generate,
                        cpu::KvType kv_type) {
    const Config& c = model.config;
    const int context = int(prompt.size()) + generate;
    auto backend = make_cpu_backend(model, BackendOptions{context, kv_type, Device::Cpu});
    StreamDecoder decoder(tokenizer, /*skip_special=*/true);
    for (int id : prompt) decoder.push(id);
    const int count = int(prompt.size());
    const float* logits = nullptr;
    if (rung.batched_prefill) {
        logits = backend->prefill(prompt.data(), count, 0, false);
    } else {
        for (int pos = 0; pos < count; ++pos) logits = backend->forward(prompt[pos], pos);
    }
    std::string out = text;
    int pos = count;
    for (int generated = 1; generated <= generate; ++generated) {
        const int next = argmax(logits, c.vocab_size);
        if (std::find(c.eos_ids.begin(), c.eos_ids.end(), next) != c.eos_ids.end()) break;
        out += decoder.push(next);
        if (generated < generate) logits = backend->forward(next, pos++);
    }
    return out + decoder.flush();
}

void check_device(Device device) {
    if (device == Device::Cpu) return;
#ifdef BARELLM_CUDA
    std::string reason;
    if (!cuda_device_available(&reason))
        throw Error("ladder --device cuda: the GPU ladder needs a GPU build and a GPU: " + reason);
    throw Error(
        "ladder --device cuda: the GPU rungs are not written yet (docs/TOUR.md lists them "
        "as future work); run the CPU ladder without --device");
#else
    throw Error(
        "ladder --device cuda: the GPU ladder needs a GPU build and a GPU; this barellm was "
        "built without CUDA (nvcc was not found)");
#endif
}

}  // namespace

int run_ladder_command(const Options& options) {
    check_device(options.device);
    const int gen_tokens = options.has_generate ? options.generate : kDefaultLadderTokens;
    if (gen_tokens < 1) throw UsageError("ladder needs -n of at least 1");
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
        const Tokenizer tokenizer =
            Tokenizer::from_json(file_model.file->metadata_value("barellm.tokenizer"));
        const std::vector<int> prompt =
            encode_text(file_model, tokenizer, options.check_text, options.parse_special);
        if (int(prompt.size()) + gen_tokens > config.max_context)
            throw Error("--check-text and -n need " + std::to_string(prompt.size() + gen_tokens) +
                        " positions, beyond the model's " + std::to_string(config.max_context));
        for (const Rung& rung : rungs) {
            enter_rung(rung);
            const Model& model = weights.in(rung.weights);
            const std::string text = greedy_text(rung, model, tokenizer, options.check_text, prompt,
                                                 gen_tokens, options.kv_type);
            const nlohmann::json line = {
                {"rung", rung.number},
                {"change", rung.change},
                {"weights", weight_dtype_name(rung.weights)},
                {"threads", rung.threads},
                {"simd", cpu::simd_level_name(rung.simd)},
                {"prompt", rung.batched_prefill ? "batched prefill" : "token by token"},
                {"text", text}};
            std::printf(
                "%s\n",
                line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
            std::fflush(stdout);
        }
        omp_set_num_threads(threads);
        cpu::set_simd_level(initial_level);
        return 0;
    }

    const int context = std::max(gen_tokens, prompt_tokens);
    if (context > config.max_context)
        throw Error("ladder needs " + std::to_string(context) + " positions, beyond the model's " +
                    std::to_string(config.max_context));
    std::mt19937_64 rng(kTokenSeed);
    std::vector<int> tokens(context);
    for (int& t : tokens) t = int(rng() % config.vocab_size);

    // The bandwidth the fastest rungs can hope for: all threads, the best SIMD level.
    omp_set_num_threads(threads);
    cpu::set_simd_level(cpu::detect_simd_level());
    const double bandwidth = measure_read_bandwidth();

    std::printf("%s: %s weights in the file, %d layers, dim %d; %d threads; KV cache %s\n\n",
                options.model_path.c_str(), config.weight_dtype.c_str(), config.layers, config.dim,
                threads, options.kv_type == cpu::KvType::F16 ? "f16" : "f32");
    std::printf("| rung | what changed | tok/s | GB/s | %% bw | speed-up |\n");
    std::printf("| ---: | --- | ---: | ---: | ---: | ---: |\n");
    std::fflush(stdout);
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
        std::printf("| %d | %s | %.2f | %.3f | %.1f%% | %.2fx |\n", rung.number,
                    rung.change.c_str(), last.tokens_per_second, last.gbps,
                    100 * last.gbps / bandwidth, speedup);
        std::fflush(stdout);
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
                                                    (options.kv_type == cpu::KvType::F16 ? 2 : 4));
    return 0;
}

}  // namespace barellm
