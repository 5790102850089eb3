// `barellm ladder` (ladder.h): the same model timed with one optimisation added per rung,
// on the CPU or on the GPU.
#include "commands/ladder.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend.h"
#include "commands/bench.h"
#include "cpu/kernels.h"
#include "util/error.h"
#include "generation/generate.h"
#include "weights/model_copy.h"
#include "generation/sampler.h"
#include "util/timing.h"
#include "tokenizer/tokenizer.h"

namespace barellm {

namespace {

constexpr int kDefaultLadderTokens = 64;
constexpr uint64_t kTokenSeed = 1234;          // random ids, the same every run (as bench)
constexpr int kWarmupPrefill = 16;             // tokens of the prefill rung's untimed warm-up
constexpr int kRepetitions = 3;                // timings per rung: mean and spread
constexpr double kMinRepetitionSeconds = 0.5;  // each repeats its pass until this long
constexpr double kBusySpread = 0.10;           // a spread above this says the machine is busy
// Other runnable tasks beyond the CPUs the ladder leaves free by more than this (a mean over
// samples, so a task that runs now and then counts in part) say other work competes with it.
constexpr double kBackgroundTasks = 0.5;
constexpr int kLoadSamples = 50;                // readings of the runnable tasks, ...
constexpr int kLoadSampleGapMilliseconds = 10;  // ... this far apart: half a second

// ==== Shared by the CPU and the GPU ladder

// A rung's speed over kRepetitions timings: tokens per second (mean, lowest, highest).
struct Speed {
    double mean = 0, lowest = 0, highest = 0;
    double gbps = 0;  // bytes moved per second, at the mean speed
    // The range of the repetitions relative to their mean.
    double spread() const { return mean > 0 ? (highest - lowest) / mean : 0; }
};

// Times `pass` (which computes `tokens` tokens and moves `bytes` bytes) kRepetitions
// times, each time repeating it until kMinRepetitionSeconds have passed.
template <typename Pass>
Speed repeated_speed(Pass pass, int tokens, double bytes) {
    std::vector<double> rates;
    for (int repetition = 0; repetition < kRepetitions; ++repetition) {
        int passes = 0;
        const auto start = Clock::now();
        double seconds = 0;
        do {
            pass();
            ++passes;
            seconds = seconds_since(start);
        } while (seconds < kMinRepetitionSeconds);
        rates.push_back(double(passes) * tokens / seconds);
    }
    Speed speed;
    for (double rate : rates) speed.mean += rate / rates.size();
    speed.lowest = *std::min_element(rates.begin(), rates.end());
    speed.highest = *std::max_element(rates.begin(), rates.end());
    speed.gbps = speed.mean * bytes / tokens / 1e9;
    return speed;
}

// Weight and KV bytes read by decode steps at positions 0 .. count-1.
double decode_bytes(const Backend& backend, const Model& model, int count) {
    double bytes = 0;
    for (int pos = 0; pos < count; ++pos)
        bytes += double(model.weight_bytes_per_token()) + backend.kv_bytes_read(pos);
    return bytes;
}

// A warm-up step, then passes of `count` decode steps from position 0.
Speed decode_speed(Backend& backend, const Model& model, const std::vector<int>& tokens,
                   int count) {
    backend.forward(tokens[0], 0);  // warm-up
    return repeated_speed(
        [&] {
            for (int pos = 0; pos < count; ++pos) backend.forward(tokens[pos], pos);
        },
        count, decode_bytes(backend, model, count));
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

// One row of the ladder's table.
struct TableRow {
    int rung;
    std::string change;
    std::string threads;  // the threads the rung's parallel regions use
    Speed speed;
    std::string percent_of_bandwidth;  // or why there is none
    double speedup;
    std::string note;  // why the rung is slower, or uses fewer threads than asked
};

void print_table_header() {
    std::printf(
        "| rung | what changed | threads | tok/s | spread | GB/s | %% bw | speed-up | note |\n");
    std::printf("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
    std::fflush(stdout);
}

void print_table_row(const TableRow& row) {
    std::printf("| %d | %s | %s | %.2f | %.1f%% | %.3f | %s | %.2fx | %s |\n", row.rung,
                row.change.c_str(), row.threads.c_str(), row.speed.mean, 100 * row.speed.spread(),
                row.speed.gbps, row.percent_of_bandwidth.c_str(), row.speedup, row.note.c_str());
    std::fflush(stdout);
}

std::string percent_text(double gbps, double bandwidth) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f%%", 100 * gbps / bandwidth);
    return text;
}

// Whether the two speeds' ranges overlap: their difference is within the noise.
bool within_noise(const Speed& a, const Speed& b) {
    return a.lowest <= b.highest && b.lowest <= a.highest;
}

std::string joined(const std::vector<std::string>& notes) {
    std::string text;
    for (const std::string& note : notes) text += (text.empty() ? "" : "; ") + note;
    return text;
}

// Whether other work (the runnable tasks before the ladder) needs the CPUs that `threads`
// threads of the ladder would use.
bool load_competes(double other_tasks, int threads, int online_cpus) {
    return other_tasks > std::max(0, online_cpus - threads) + kBackgroundTasks;
}

// The other runnable tasks measured before the ladder, then a warning for each thing that
// makes the table's numbers unreliable, one per line.
void print_busy_warnings(const std::vector<TableRow>& rows, double other_tasks, int online_cpus,
                         int threads) {
    std::printf("other runnable tasks before the ladder: %.2f (mean over %.1f s) on %d CPUs\n",
                other_tasks, kLoadSamples * kLoadSampleGapMilliseconds / 1000.0, online_cpus);
    for (const TableRow& row : rows)
        if (row.speed.spread() > kBusySpread)
            std::printf(
                "warning: rung %d varied by %.1f%% between its %d repetitions (more than "
                "%.0f%%): the machine is busy or its clock changes; its ratios are not "
                "reliable\n",
                row.rung, 100 * row.speed.spread(), kRepetitions, 100 * kBusySpread);
    if (load_competes(other_tasks, threads, online_cpus))
        std::printf(
            "warning: %.2f other runnable tasks before the ladder started, on %d CPUs: other "
            "work competes with the ladder's %d threads\n",
            other_tasks, online_cpus, threads);
}

// ==== The CPU ladder

struct Rung {
    int number;
    std::string change;  // what this rung adds to the one before
    int threads;
    cpu::SimdLevel simd;
    std::optional<DType> weights;  // none: the file's own, matrices of several types
    bool batched_prefill;
};

// The weights a rung runs, as `ladder` prints them: "F16", "Q8", or the file's mix ("Q4_K_M").
std::string weights_name(const Rung& rung, const Config& file_config) {
    return rung.weights ? weight_dtype_name(*rung.weights) : file_config.weight_dtype;
}

// prompt_tokens: the length the batched prefill rung (the last) is timed with, 0 when it
// runs a given text. A rung whose SIMD level the CPU lacks runs the best level it has. A file
// with block-type matrices (Q4_K_M, ...) gets a rung of its own weights after q8's, and the
// batched prefill runs them.
std::vector<Rung> ladder_rungs(int threads, int prompt_tokens, const Model& file) {
    using cpu::SimdLevel;
    std::string missing;
    const SimdLevel best = cpu::detect_simd_level(&missing);
    const SimdLevel avx2 = std::min(best, SimdLevel::Avx2);
    const std::string avx2_change =
        best >= SimdLevel::Avx2
            ? "+ AVX2/FMA SIMD kernels"
            : "+ AVX2/FMA SIMD kernels (not on this CPU, which lacks" + missing + ": scalar)";
    const std::string avx512_change = best == SimdLevel::Avx512 ? "+ AVX-512 kernels"
                                      : best == SimdLevel::Avx2
                                          ? "+ AVX-512 kernels (not on this CPU: AVX2)"
                                          : "+ AVX-512 kernels (not on this CPU: scalar)";
    const std::string thread_change =
        "+ OpenMP, " + std::to_string(threads) + (threads == 1 ? " thread" : " threads");
    const std::string prefill_change =
        prompt_tokens > 0 ? "+ batched prefill (" + std::to_string(prompt_tokens) + "-token prompt)"
                          : "+ batched prefill";
    std::vector<Rung> rungs = {
        {1, "scalar kernels, 1 thread, f32 weights", 1, SimdLevel::Scalar, DType::F32, false},
        {2, thread_change, threads, SimdLevel::Scalar, DType::F32, false},
        {3, avx2_change, threads, avx2, DType::F32, false},
        {4, avx512_change, threads, best, DType::F32, false},
        {5, "+ f16 weights", threads, best, DType::F16, false},
        {6, "+ q8 weights", threads, best, DType::Q8_0, false},
    };
    const std::vector<const Matrix*> matrices = file.matrices();
    if (std::any_of(matrices.begin(), matrices.end(),
                    [](const Matrix* m) { return is_block_type(m->dtype); })) {
        rungs.push_back({7, "+ the file's " + file.config.weight_dtype + " weights (super-blocks)",
                         threads, best, std::nullopt, false});
        rungs.push_back({8, prefill_change, threads, best, std::nullopt, true});
    } else {
        rungs.push_back({7, prefill_change, threads, best, DType::Q8_0, true});
    }
    return rungs;
}

// The model's weights in the dtype a rung needs: the file itself when its dtype matches,
// else an in-memory copy. At most one copy is held: the previous one is freed first.
class Weights {
public:
    explicit Weights(const Model& file_model) : file_model_(file_model) {}

    const Model& in(std::optional<DType> dtype) {
        const std::vector<const Matrix*> matrices = file_model_.matrices();
        if (!dtype || std::all_of(matrices.begin(), matrices.end(),
                                  [&](const Matrix* m) { return m->dtype == *dtype; })) {
            copy_.reset();
            return file_model_;
        }
        if (!copy_ || copy_->model.token_embedding.dtype != dtype) {
            copy_.reset();
            copy_ = copy_model(file_model_, *dtype);
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

// ---- What the machine offers: its last-level cache and how busy it is

struct CacheSize {
    size_t bytes = 0;  // 0: unknown
    int level = 0;
};

// "32768K" or "1M" or "512" (sysfs cache sizes) in bytes; 0 when unreadable.
size_t parse_cache_size(const std::string& text) {
    size_t end = 0;
    unsigned long long value = 0;
    try {
        value = std::stoull(text, &end);
    } catch (const std::exception&) {
        return 0;
    }
    const char unit = end < text.size() ? text[end] : ' ';
    const size_t multiplier = unit == 'K' ? 1024 : unit == 'M' ? 1024 * 1024 : 1;
    return size_t(value) * multiplier;
}

std::string first_line(const std::string& path) {
    std::ifstream file(path);
    std::string line;
    std::getline(file, line);
    return line;
}

// The highest-level data or unified cache of CPU 0, as Linux describes it in sysfs.
CacheSize last_level_cache() {
    constexpr int kMaxCacheIndices = 16;
    const std::string base = "/sys/devices/system/cpu/cpu0/cache/index";
    CacheSize last;
    for (int index = 0; index < kMaxCacheIndices; ++index) {
        const std::string folder = base + std::to_string(index) + "/";
        const std::string type = first_line(folder + "type");
        if (type != "Data" && type != "Unified") continue;
        const int level = std::atoi(first_line(folder + "level").c_str());
        const size_t bytes = parse_cache_size(first_line(folder + "size"));
        if (level > last.level && bytes > 0) last = {bytes, level};
    }
    return last;
}

// The tasks ready to run besides this thread: the mean of kLoadSamples readings of the running
// count in /proc/loadavg (its fourth field, "running/total"), 0 where it cannot be read. The
// 1-minute load average would lag: it still counts work that ended a minute ago.
double other_runnable_tasks() {
    double total = 0;
    for (int s = 0; s < kLoadSamples; ++s) {
        std::this_thread::sleep_for(std::chrono::milliseconds(kLoadSampleGapMilliseconds));
        std::istringstream fields(first_line("/proc/loadavg"));
        std::string field;
        for (int f = 0; f < 4; ++f) fields >> field;
        total += std::max(0, std::atoi(field.c_str()) - 1);
    }
    return total / kLoadSamples;
}

// ---- Threads: what a rung asks for and what its parallel regions use

// The largest parallel region of a rung's step: its multiply-adds and what it is.
struct Region {
    size_t work;
    std::string what;
};

// The parallel regions of a decode step attending `positions` positions (see
// CpuBackend::forward: q, k and v in one region, w1 and w3 in one). The matrices come
// first, then the output matrix, then attention.
std::vector<Region> decode_regions(const Config& c, int positions) {
    const size_t dim = c.dim, hidden = c.hidden_dim, q_dim = c.q_dim(), kv_dim = c.kv_dim();
    return {
        {(q_dim + 2 * kv_dim) * dim, "q, k and v"},
        {dim * q_dim, "wo"},
        {2 * hidden * dim, "w1 and w3"},
        {dim * hidden, "w2"},
        {size_t(c.vocab_size) * dim, "the output matrix"},
        {q_dim * positions * 2, "attention"},
    };
}

// The parallel regions of one prefill batch of `batch` tokens from position 0: every
// layer's product batched, the output matrix for the last token only, causal attention.
std::vector<Region> prefill_regions(const Config& c, int batch) {
    std::vector<Region> regions = decode_regions(c, batch);
    constexpr int kLayerProducts = 4;  // the first four regions: q/k/v, wo, w1/w3, w2
    for (int i = 0; i < kLayerProducts; ++i) regions[i].work *= batch;
    regions.back().work = size_t(c.q_dim()) * batch * batch * 2;
    return regions;
}

Region largest(const std::vector<Region>& regions) {
    return *std::max_element(regions.begin(), regions.end(),
                             [](const Region& a, const Region& b) { return a.work < b.work; });
}

// The threads the rung's largest parallel region uses (cpu::threads_for, the rung's
// OpenMP setting in force), and the reason when that is fewer than it asks for.
std::pair<int, std::string> threads_used(const Region& largest, int asked) {
    const int used = cpu::threads_for(largest.work);
    if (used >= asked) return {used, ""};
    return {used, "asks for " + std::to_string(asked) + " threads, uses " + std::to_string(used) +
                      ": its largest step (" + largest.what + ", " + std::to_string(largest.work) +
                      " multiply-adds) is below " + std::to_string(cpu::kMinWorkPerThread) +
                      " multiply-adds per thread, the least worth waking a thread for"};
}

// ---- Timing a rung

struct RungResult {
    Speed speed;
    Speed token_by_token;  // the batched prefill rung only: the same prompt, one token a step
};

RungResult time_rung(const Rung& rung, const Model& model, const std::vector<int>& tokens,
                     int gen_tokens, int prompt_tokens, KvType kv_type) {
    const int context = std::max(gen_tokens, prompt_tokens);
    auto backend = make_cpu_backend(model, BackendOptions{context, kv_type, Device::Cpu});
    RungResult result;
    if (!rung.batched_prefill) {
        result.speed = decode_speed(*backend, model, tokens, gen_tokens);
        return result;
    }
    backend->prefill(tokens.data(), std::min(prompt_tokens, kWarmupPrefill), 0, false);
    result.token_by_token = decode_speed(*backend, model, tokens, prompt_tokens);
    // Weights once per batch (a lower bound) plus every query's KV reads, as bench counts.
    const int batches = (prompt_tokens + backend->max_batch() - 1) / backend->max_batch();
    double bytes = double(model.weight_bytes_per_token()) * batches;
    for (int pos = 0; pos < prompt_tokens; ++pos) bytes += backend->kv_bytes_read(pos);
    result.speed = repeated_speed([&] { backend->prefill(tokens.data(), prompt_tokens, 0, false); },
                                  prompt_tokens, bytes);
    return result;
}

// Why rung `rung` is slower than the one it is compared with, when it is.
// best: the CPU's SIMD level (detect_simd_level).
// busy: other work holds the CPUs the rung's threads need (load_competes).
std::string slower_reason(const Rung& rung, const Speed& speed, const Speed& before,
                          bool fits_in_cache, cpu::SimdLevel best, int threads, bool busy) {
    if (speed.mean >= before.mean) return "";
    if (within_noise(speed, before)) return "slower within the noise of the repetitions";
    if (threads > 1 && busy)
        return "the machine is busy: its " + std::to_string(threads) +
               " threads wait for each other at every parallel step, each for a CPU that other "
               "work holds";
    if (rung.batched_prefill)
        return "a short prompt: widening each weight to f32 once per batch costs more than "
               "the batch saves; try -p 64 or more";
    if (!rung.weights)
        return fits_in_cache ? "weights fit in cache: unpacking the super-blocks' scales adds "
                               "work, saves no memory traffic"
                             : "unpacking the super-blocks costs more than the bytes saved";
    switch (rung.number) {
        case 2:
            return "the threads' start and join cost more than the work they share";
        case 3:
            return best >= cpu::SimdLevel::Avx2 ? "slower than the scalar kernels: unexpected"
                                                : "no AVX2 here: the same scalar kernels";
        case 4:
            if (best == cpu::SimdLevel::Avx2) return "no AVX-512 here: the same AVX2 kernels";
            if (best == cpu::SimdLevel::Scalar) return "no AVX-512 here: the same scalar kernels";
            return fits_in_cache
                       ? "weights fit in cache: on rows this short, each row's 16-lane sum "
                         "and masked tail weigh more than the wider multiply-adds save"
                       : "memory-bound: the AVX2 kernels read the weights as fast (a wider "
                         "register does not make memory faster; some CPUs also lower their "
                         "clock for 512-bit instructions)";
        case 5:
            return fits_in_cache
                       ? "weights fit in cache: f16 adds conversion work, saves no memory traffic"
                       : "widening f16 to f32 costs more than the bytes it saves";
        case 6:
            return fits_in_cache
                       ? "weights fit in cache: quantizing x to int8 and the scales add work, "
                         "save no memory traffic"
                       : "quantizing x and applying the scales cost more than the bytes saved";
        default:
            return "";
    }
}

// The ladder's rungs are dense forward passes: a mixture-of-experts model is refused.
void refuse_experts(const Model& model) {
    if (model.config.experts > 0)
        throw Error("ladder runs dense models; " + model.config.architecture +
                    " has a mixture of experts (use bench)");
}

int run_cpu_ladder(const Options& options, int gen_tokens) {
    const int prompt_tokens =
        options.has_prompt ? int(parse_integer("-p", options.prompt, 1, 1 << 20)) : gen_tokens;
    const int threads = omp_get_max_threads();  // --threads, or OpenMP's default
    const cpu::SimdLevel initial_level = cpu::simd_level();
    const Model file_model = Model::load(options.model_path);
    refuse_experts(file_model);
    const Config& config = file_model.config;
    Weights weights(file_model);
    const std::vector<Rung> rungs =
        ladder_rungs(threads, options.has_check_text ? 0 : prompt_tokens, file_model);

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
                 {"weights", weights_name(rung, config)},
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
    const double others_at_start = other_runnable_tasks();
    const int online_cpus = int(sysconf(_SC_NPROCESSORS_ONLN));
    const CacheSize cache = last_level_cache();

    // The bandwidth the fastest rungs can hope for: all threads, the best SIMD level.
    const cpu::SimdLevel best = cpu::detect_simd_level();
    omp_set_num_threads(threads);
    cpu::set_simd_level(best);
    const double bandwidth = measure_read_bandwidth();

    std::printf("%s: %s weights in the file, %d layers, dim %d; %d threads; KV cache %s\n\n",
                options.model_path.c_str(), config.weight_dtype.c_str(), config.layers, config.dim,
                threads, kv_name(options.kv_type));
    print_table_header();
    std::vector<std::pair<std::string, size_t>> bytes_per_token;
    std::vector<TableRow> rows;
    Speed previous;
    std::string previous_threads_note;
    RungResult last;
    for (const Rung& rung : rungs) {
        enter_rung(rung);
        const Model& model = weights.in(rung.weights);
        const size_t weight_bytes = model.weight_bytes_per_token();
        if (bytes_per_token.empty() || bytes_per_token.back().first != weights_name(rung, config))
            bytes_per_token.push_back({weights_name(rung, config), weight_bytes});
        const auto [used, threads_note] =
            threads_used(rung.batched_prefill ? largest(prefill_regions(config, prompt_tokens))
                                              : largest(decode_regions(config, gen_tokens)),
                         rung.threads);
        last = time_rung(rung, model, tokens, gen_tokens, prompt_tokens, options.kv_type);
        const bool fits_in_cache = cache.bytes > 0 && weight_bytes <= cache.bytes;
        const Speed& before = rung.batched_prefill ? last.token_by_token : previous;
        const double speedup = rung.number == 1 ? 1.0 : last.speed.mean / before.mean;
        const bool busy = load_competes(others_at_start, used, online_cpus);
        const std::string reason =
            rung.number == 1
                ? ""
                : slower_reason(rung, last.speed, before, fits_in_cache, best, used, busy);
        std::vector<std::string> notes;
        // The threads note where the threads change, not again on every rung after.
        if (!threads_note.empty() && threads_note != previous_threads_note)
            notes.push_back(threads_note);
        if (!reason.empty()) notes.push_back(reason);
        previous_threads_note = threads_note;
        TableRow row{rung.number,
                     rung.change,
                     std::to_string(used),
                     last.speed,
                     fits_in_cache ? "fits in cache" : percent_text(last.speed.gbps, bandwidth),
                     speedup,
                     joined(notes)};
        print_table_row(row);
        rows.push_back(row);
        previous = last.speed;
    }
    omp_set_num_threads(threads);
    cpu::set_simd_level(initial_level);

    std::printf("\nmemory bandwidth (streaming read, %d threads, same run): %.1f GB/s\n", threads,
                bandwidth);
    if (cache.bytes > 0)
        std::printf(
            "last-level cache: L%d, %.1f MiB; %% bw is given for weights larger than it "
            "(smaller ones are read from the cache, not from memory)\n",
            cache.level, cache.bytes / 1048576.0);
    else
        std::printf("last-level cache: unknown (no sysfs cache sizes); %% bw given for all\n");
    std::printf(
        "every rung: %d timings of at least %.1f s each, the pass repeated until then; tok/s is "
        "their mean, spread their range over the mean\n",
        kRepetitions, kMinRepetitionSeconds);
    const int prefill_rung = rungs.back().number;
    std::printf(
        "rungs 1-%d: passes of %d decode steps from random ids (seed %llu) after one warm-up "
        "step; GB/s counts the weights and the KV cache read\n",
        prefill_rung - 1, gen_tokens, static_cast<unsigned long long>(kTokenSeed));
    std::printf(
        "rung %d: a %d-token prompt, %.2f tok/s token by token with rung %d's kernels, %.2f "
        "tok/s as one prefill batch; its speed-up is batch over token by token\n",
        prefill_rung, prompt_tokens, last.token_by_token.mean, prefill_rung - 1, last.speed.mean);
    std::printf("weight bytes read per token:");
    for (const auto& [name, bytes] : bytes_per_token) std::printf(" %s %zu;", name.c_str(), bytes);
    std::printf(" KV cache per position %zu\n", 2 * size_t(config.layers) * config.kv_dim() *
                                                    (options.kv_type == KvType::F16 ? 2 : 4));
    print_busy_warnings(rows, others_at_start, online_cpus, threads);
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
    refuse_experts(model);
    const Config& config = model.config;
    for (const Matrix* m : model.matrices())
        if (m->dtype != DType::F32 && m->dtype != DType::F16 && m->dtype != DType::BF16)
            throw Error(
                "ladder --device cuda: its first rungs' simple matvecs read f32, f16 and bf16 "
                "weights, not " +
                config.weight_dtype +
                " (run the ladder on an f16 file; `bench --device cuda` "
                "times " +
                config.weight_dtype + ")");
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
    const double others_at_start = other_runnable_tasks();
    const int online_cpus = int(sysconf(_SC_NPROCESSORS_ONLN));
    double bandwidth = 0;
    Speed previous;
    std::vector<TableRow> rows;
    for (const GpuRung& rung : rungs) {
        auto backend = make_rung_backend(rung, model, gen_tokens);
        if (bandwidth == 0) {  // the first rung's backend measures it for the whole table
            bandwidth = backend->measure_bandwidth_gbps();
            print_table_header();
        }
        const Speed speed = decode_speed(*backend, model, tokens, gen_tokens);
        const bool slower_in_noise =
            rung.number > 1 && speed.mean < previous.mean && within_noise(speed, previous);
        TableRow row{rung.number,
                     rung.change,
                     "GPU",
                     speed,
                     percent_text(speed.gbps, bandwidth),
                     rung.number == 1 ? 1.0 : speed.mean / previous.mean,
                     slower_in_noise ? "slower within the noise of the repetitions" : ""};
        print_table_row(row);
        rows.push_back(row);
        previous = speed;
    }
    std::printf("\nmemory bandwidth (device-to-device copy, same run): %.1f GB/s\n", bandwidth);
    std::printf(
        "every rung: %d timings of at least %.1f s each, the pass repeated until then; tok/s is "
        "their mean, spread their range over the mean\n",
        kRepetitions, kMinRepetitionSeconds);
    std::printf(
        "every rung: passes of %d decode steps from position 0, random ids (seed %llu), after "
        "one warm-up step; GB/s counts the weights and the KV cache read\n",
        gen_tokens, static_cast<unsigned long long>(kTokenSeed));
    std::printf(
        "weight bytes read per token: %s %zu; KV cache per position: f32 %zu (rungs 1-5), f16 "
        "%zu (rungs 6-8)\n",
        config.weight_dtype.c_str(), model.weight_bytes_per_token(),
        2 * size_t(config.layers) * config.kv_dim() * kv_element_bytes(KvType::F32),
        2 * size_t(config.layers) * config.kv_dim() * kv_element_bytes(KvType::F16));
    print_busy_warnings(rows, others_at_start, online_cpus, /*threads=*/1);
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
