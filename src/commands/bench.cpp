// `barellm bench` (bench.h): timed prefill and decode runs, and the streaming-read bandwidth
// they are set against.
#include "commands/bench.h"

#include <immintrin.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "backend.h"
#include "cpu/kernels.h"
#include "util/error.h"
#include "generation/generate.h"
#include "util/machine.h"
#include "util/timing.h"

namespace barellm {

namespace {

constexpr size_t kBandwidthBufferBytes = size_t(1) << 30;  // 1 GiB: far beyond any L3
constexpr int kBandwidthPasses = 5;
constexpr uint64_t kTokenSeed = 1234;  // random prompt ids, the same every run

// Sums floats with eight independent vector accumulators: a pure streaming read.
__attribute__((target("avx2"))) float sum_avx2(const float* data, size_t count) {
    constexpr size_t kStep = 64;  // floats per iteration: 8 registers of 8
    __m256 sums[8];
    for (__m256& s : sums) s = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + kStep <= count; i += kStep)
        for (int k = 0; k < 8; ++k)
            sums[k] = _mm256_add_ps(sums[k], _mm256_loadu_ps(data + i + 8 * k));
    float lanes[8], total = 0;
    for (int k = 1; k < 8; ++k) sums[0] = _mm256_add_ps(sums[0], sums[k]);
    _mm256_storeu_ps(lanes, sums[0]);
    for (float lane : lanes) total += lane;
    for (; i < count; ++i) total += data[i];
    return total;
}

float sum_scalar(const float* data, size_t count) {
    float total = 0;
    for (size_t i = 0; i < count; ++i) total += data[i];
    return total;
}

struct Stats {
    double mean = 0, stddev = 0;
};

Stats mean_and_stddev(const std::vector<double>& samples) {
    Stats stats;
    for (double s : samples) stats.mean += s / samples.size();
    if (samples.size() > 1) {
        double squares = 0;
        for (double s : samples) squares += (s - stats.mean) * (s - stats.mean);
        stats.stddev = std::sqrt(squares / (samples.size() - 1));  // sample standard deviation
    }
    return stats;
}

struct TestResult {
    std::string name;  // pp512, tg128; at a depth "pp512 @ d4096"
    int prompt_tokens, gen_tokens;
    std::vector<double> tokens_per_second;
    double bytes_per_run;  // weights and KV cache the run must read
    double seconds_per_run;
    // The bandwidth measured right after each run: on a shared machine, whose neighbours
    // take more or less of the memory from one second to the next, a run is set against the
    // bandwidth of its own moment (bandwidth_share).
    std::vector<double> bandwidths;
};

// The mean over the runs of each run's GB/s as a share of the bandwidth measured after it.
double bandwidth_share(const TestResult& test) {
    const int tokens_per_run = test.prompt_tokens + test.gen_tokens;
    double sum = 0;
    for (size_t r = 0; r < test.bandwidths.size(); ++r)
        sum += test.bytes_per_run * test.tokens_per_second[r] / tokens_per_run / 1e9 /
               test.bandwidths[r];
    return sum / test.bandwidths.size();
}

// The peak resident memory of this program (/proc/self/status's VmHWM, in KiB); 0 where
// unreadable. Not getrusage's ru_maxrss: Linux carries into it the peak of the process that
// forked this one, so a barellm started by a large parent would report the parent's size.
size_t peak_resident_bytes() {
    std::FILE* status = std::fopen("/proc/self/status", "r");
    if (status == nullptr) return 0;
    char line[256];
    unsigned long long kib = 0;
    while (std::fgets(line, sizeof line, status) != nullptr)
        if (std::sscanf(line, "VmHWM: %llu kB", &kib) == 1) break;
    std::fclose(status);
    return size_t(kib) * 1024;
}

// The resident memory now (/proc/self/statm's second field, in pages); 0 where unreadable.
size_t resident_bytes_now() {
    std::FILE* statm = std::fopen("/proc/self/statm", "r");
    if (statm == nullptr) return 0;
    unsigned long long size_pages = 0, resident_pages = 0;
    const bool read = std::fscanf(statm, "%llu %llu", &size_pages, &resident_pages) == 2;
    std::fclose(statm);
    return read ? size_t(resident_pages) * size_t(sysconf(_SC_PAGESIZE)) : 0;
}

std::string model_label(const Model& model) {
    char label[64];
    std::snprintf(label, sizeof label, "%s %.2fB %s", model.config.architecture.c_str(),
                  model.parameter_count() / 1e9, model.config.weight_dtype.c_str());
    return label;
}

}  // namespace

double measure_read_bandwidth() {
    const size_t count = kBandwidthBufferBytes / sizeof(float);
    std::unique_ptr<float[]> buffer(new float[count]);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < count; ++i) buffer[i] = float(i % 7);  // touch every page, in place
    const bool use_avx2 = cpu::simd_level() >= cpu::SimdLevel::Avx2;
    double best = 0;
    volatile float sink = 0;  // keeps the sums alive
    for (int pass = 0; pass < kBandwidthPasses; ++pass) {
        const auto start = Clock::now();
        float total = 0;
#pragma omp parallel reduction(+ : total)
        {
            const size_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
            const size_t first = count * thread / threads, last = count * (thread + 1) / threads;
            total += use_avx2 ? sum_avx2(buffer.get() + first, last - first)
                              : sum_scalar(buffer.get() + first, last - first);
        }
        const double seconds = seconds_since(start);
        sink = sink + total;
        best = std::max(best, kBandwidthBufferBytes / seconds / 1e9);
    }
    return best;
}

void run_bench(const BenchOptions& options) {
    const Model model = Model::load(options.model_path);
    const Config& config = model.config;
    // The tests run after `depth` filled positions (-d): pp<P> at positions depth..depth+P-1,
    // tg<N> at depth..depth+N-1.
    const int depth = options.depth;
    const int64_t positions =
        int64_t(depth) + std::max(1, std::max(options.prompt_tokens, options.gen_tokens));
    if (positions > config.max_context)
        throw Error("bench needs " + std::to_string(positions) + " positions, beyond the model's " +
                    std::to_string(config.max_context));
    const int context = int(positions);
    std::string device_choice;
    auto backend = make_backend(model, BackendOptions{context, options.kv_type, options.device},
                                &device_choice);
    if (!device_choice.empty()) std::fprintf(stderr, "barellm: %s\n", device_choice.c_str());

    std::mt19937_64 rng(kTokenSeed);
    std::vector<int> tokens(context);
    for (int& t : tokens) t = int(rng() % config.vocab_size);

    // One untimed warm-up, as llama-bench does: the prefill test once (its buffers are
    // allocated and their pages touched before the clock starts), then one decode step.
    // Their logits must be finite: a model that computes NaN or Inf is refused, not timed.
    if (options.prompt_tokens > 0)
        check_finite(backend->prefill(tokens.data(), options.prompt_tokens, 0, false),
                     config.vocab_size, options.prompt_tokens - 1);
    check_finite(backend->forward(tokens[0], 0), config.vocab_size, 0);
    // The depth: positions 0..depth-1 filled by one untimed prefill after the warm-up (which
    // wrote from position 0). The tests write only from position depth on, so this one fill
    // is what every repetition reads.
    if (depth > 0)
        check_finite(backend->prefill(tokens.data(), depth, 0, false), config.vocab_size,
                     depth - 1);

    // The peak memory of the model, the buffers and the KV cache, comparable with another
    // engine's: the peak before the first bandwidth measurement, whose buffer of up to 1 GiB
    // is freed after each, then the resident memory before each later one (a later run can
    // still touch pages of the KV cache).
    size_t peak_rss = 0;
    bool bandwidth_measured = false;
    auto record_run = [&](TestResult* test, double seconds) {
        peak_rss =
            std::max(peak_rss, bandwidth_measured ? resident_bytes_now() : peak_resident_bytes());
        bandwidth_measured = true;
        test->tokens_per_second.push_back((test->prompt_tokens + test->gen_tokens) / seconds);
        test->seconds_per_run += seconds / options.repetitions;
        test->bandwidths.push_back(backend->measure_bandwidth_gbps());
    };

    const double weight_bytes = double(model.weight_bytes_per_token());
    // llama-bench's markdown names: "pp512", and "pp512 @ d4096" at a depth.
    const std::string depth_suffix = depth > 0 ? " @ d" + std::to_string(depth) : "";
    std::vector<TestResult> results;
    if (options.prompt_tokens > 0) {
        const int p = options.prompt_tokens;
        TestResult test{"pp" + std::to_string(p) + depth_suffix, p, 0, {}, 0, 0, {}};
        // Weights once per prefill batch (a lower bound) plus every query's KV reads.
        const int batches = (p + backend->max_batch() - 1) / backend->max_batch();
        test.bytes_per_run = weight_bytes * batches;
        for (int pos = depth; pos < depth + p; ++pos)
            test.bytes_per_run += backend->kv_bytes_read(pos);
        for (int r = 0; r < options.repetitions; ++r) {
            const auto start = Clock::now();
            backend->prefill(tokens.data() + depth, p, depth, false);
            record_run(&test, seconds_since(start));
        }
        results.push_back(test);
    }
    if (options.gen_tokens > 0) {
        const int n = options.gen_tokens;
        TestResult test{"tg" + std::to_string(n) + depth_suffix, 0, n, {}, 0, 0, {}};
        for (int pos = depth; pos < depth + n; ++pos)
            test.bytes_per_run += weight_bytes + backend->kv_bytes_read(pos);
        for (int r = 0; r < options.repetitions; ++r) {
            const auto start = Clock::now();
            for (int pos = depth; pos < depth + n; ++pos) backend->forward(tokens[pos], pos);
            record_run(&test, seconds_since(start));
        }
        results.push_back(test);
    }
    const int threads = omp_get_max_threads();
    const double model_bytes = double(model.file->file_size());
    const std::string cpu_model = machine_cpu_model();
    const char* simd = cpu::simd_level_name(cpu::simd_level());
    const std::string extensions = cpu_vector_extensions();
    if (options.json) {
        nlohmann::json array = nlohmann::json::array();
        for (const TestResult& test : results) {
            const Stats stats = mean_and_stddev(test.tokens_per_second);
            const double gbps = test.bytes_per_run / test.seconds_per_run / 1e9;
            const double bandwidth = mean_and_stddev(test.bandwidths).mean;
            array.push_back({{"model_filename", options.model_path},
                             {"model_type", model_label(model)},
                             {"model_size", size_t(model_bytes)},
                             {"model_n_params", model.parameter_count()},
                             {"backend", backend->name()},
                             {"n_threads", threads},
                             {"cpu_info", cpu_model},
                             {"physical_cores", physical_core_count()},
                             {"simd", simd},
                             {"cpu_extensions", extensions},
                             {"n_prompt", test.prompt_tokens},
                             {"n_gen", test.gen_tokens},
                             {"n_depth", depth},
                             {"avg_ts", stats.mean},
                             {"stddev_ts", stats.stddev},
                             {"samples_ts", test.tokens_per_second},
                             {"gbps", gbps},
                             {"bw_pct", 100 * bandwidth_share(test)},
                             {"bandwidth_gbps", bandwidth},
                             {"samples_bandwidth_gbps", test.bandwidths},
                             {"peak_rss_bytes", peak_rss}});
        }
        std::printf("%s\n", array.dump(2).c_str());
        return;
    }
    std::printf("cpu: %s, %d physical cores; simd: %s (the CPU offers %s); threads: %d\n\n",
                cpu_model.c_str(), physical_core_count(), cpu::simd_description().c_str(),
                extensions.c_str(), threads);
    std::printf("| model | size | params | backend | threads | test | t/s | GB/s | %% bw |\n");
    std::printf("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n");
    std::vector<double> bandwidths;
    for (const TestResult& test : results) {
        const Stats stats = mean_and_stddev(test.tokens_per_second);
        const double gbps = test.bytes_per_run / test.seconds_per_run / 1e9;
        std::printf("| %s | %.2f GiB | %.2f B | %s | %d | %s | %.2f ± %.2f | %.1f | %.0f%% |\n",
                    model_label(model).c_str(), model_bytes / (1u << 30),
                    model.parameter_count() / 1e9, backend->name().c_str(), threads,
                    test.name.c_str(), stats.mean, stats.stddev, gbps, 100 * bandwidth_share(test));
        bandwidths.insert(bandwidths.end(), test.bandwidths.begin(), test.bandwidths.end());
    }
    if (bandwidths.empty()) return;
    const auto [lowest, highest] = std::minmax_element(bandwidths.begin(), bandwidths.end());
    if (backend->name() == "cuda")
        std::printf("\nmemory bandwidth (device-to-device copy");
    else
        std::printf("\nmemory bandwidth (streaming read, %d threads", threads);
    std::printf(", after each run; %% bw: each run against the one after it): %.1f-%.1f GB/s; ",
                *lowest, *highest);
    std::printf("peak resident memory without its buffer %.2f GiB\n", peak_rss / double(1u << 30));
}

}  // namespace barellm
