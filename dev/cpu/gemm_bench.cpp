// One-core speed of the prefill GEMM (cpu::gemm) on TinyLlama's w1 shape
// (5632 x 2048, f16 weights): the median and the best of 30 runs. Times are the thread's
// CPU time, so other load on the machine counts less (shared caches still feel it).
// After `make`, linked against an archive of its objects (only what is used is taken):
//   ar rcs build/objects.a build/src/*.o build/src/*/*.o
//   g++ -std=c++17 -O2 -fopenmp -Isrc -o build/gemm_bench dev/cpu/gemm_bench.cpp build/objects.a
//   OMP_NUM_THREADS=1 build/gemm_bench [BATCH (default 128)]
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cpu/kernels.h"
#include "weights/half.h"

using namespace barellm;

namespace {

double thread_seconds() {
    timespec now;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return now.tv_sec + now.tv_nsec * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
    const int rows = 5632, cols = 2048, batch = argc > 1 ? std::atoi(argv[1]) : 128;
    constexpr int kRepetitions = 30;
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> uniform(-1, 1);
    // On 2 MiB pages, as the CPU backend holds its weights (resident_weights.cpp).
    constexpr size_t kHugePage = size_t(2) << 20;
    const size_t weight_bytes = (size_t(rows) * cols * 2 + kHugePage - 1) / kHugePage * kHugePage;
    uint16_t* weights = static_cast<uint16_t*>(std::aligned_alloc(kHugePage, weight_bytes));
    madvise(weights, weight_bytes, MADV_HUGEPAGE);
    for (size_t i = 0; i < size_t(rows) * cols; ++i) weights[i] = float_to_half(uniform(rng));
    std::vector<float> x(size_t(batch) * cols), out(size_t(batch) * rows);
    for (float& v : x) v = uniform(rng);
    const Matrix m{weights, DType::F16, rows, cols, nullptr};
    std::vector<double> rates;
    for (int r = 0; r < kRepetitions; ++r) {
        const double start = thread_seconds();
        cpu::gemm(out.data(), x.data(), batch, m);
        rates.push_back(2.0 * rows * cols * batch / (thread_seconds() - start) / 1e9);
    }
    std::sort(rates.begin(), rates.end());
    std::printf("GEMM batch %d: median %.1f, best %.1f GFLOP/s\n", batch, rates[rates.size() / 2],
                rates.back());
}
