// `barellm bench`: prefill and decode speed in llama-bench's conventions, with the
// achieved memory bandwidth set against a streaming-read measurement from the same run.
#pragma once
#include <string>

#include "backend.h"

namespace barellm {

struct BenchOptions {
    std::string model_path;
    int prompt_tokens = 512;  // pp<P>; 0 skips the test
    int gen_tokens = 128;     // tg<N>; 0 skips the test
    int depth = 0;            // -d: positions of the KV cache filled before the tests
    int repetitions = 5;
    bool json = false;  // -o json instead of a markdown table
    KvType kv_type = KvType::F16;
    Device device = Device::Auto;
};

// Best-of-several parallel streaming read of a buffer far larger than the caches, GB/s.
double measure_read_bandwidth();

// Runs the benchmark and prints the table (or JSON) to stdout.
void run_bench(const BenchOptions& options);

}  // namespace barellm
