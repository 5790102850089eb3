// The GEMM of a few tokens on Q8 and Q4 weights (cpu::gemm, as a server step of a few decoding
// sequences runs it: with AVX-512 VNNI or AVX-VNNI the tiles read as they are, no panel), in GB/s
// of weights read from memory (a 600 MB matrix, far past any last-level cache) and in tokens ×
// GB/s, for batches of 1 to 16 tokens, on the threads OMP_NUM_THREADS gives. A batch that keeps the
// GB/s of one token multiplies the tokens a pass of the weights serves. After `make`, linked as
// quantized_matvec_bench.cpp says:
//   g++ -std=c++17 -O2 -fopenmp -Isrc -o build/quantized_gemm_bench
//       dev/cpu/quantized_gemm_bench.cpp build/objects.a        (one command)
//   OMP_NUM_THREADS=2 build/quantized_gemm_bench [COLS (default 2048)] [LEVEL (avx2, avx512;
//       default the best this CPU runs)]
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/quantized_tiles.h"

using namespace barellm;

namespace {

constexpr double kMatrixBytes = 600e6;  // far past any last-level cache
constexpr double kBytesPerRun = 6e9;    // repetitions: about this much read in all
constexpr int kBatches[] = {1, 2, 4, 6, 8, 12, 16};

double seconds() {
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec + now.tv_nsec * 1e-9;
}

// The median GB/s of cpu::gemm over `batch` tokens of a random matrix of about kMatrixBytes.
double gemm_gbps(const Matrix& m, int batch, std::mt19937& rng) {
    std::vector<float> x(size_t(batch) * m.cols), out(size_t(batch) * m.rows);
    for (float& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
    std::vector<double> rates;
    const int repetitions = std::max(5, int(kBytesPerRun / m.bytes()));
    for (int r = 0; r < repetitions; ++r) {
        const double start = seconds();
        cpu::gemm(out.data(), x.data(), batch, m);
        rates.push_back(m.bytes() / (seconds() - start) / 1e9);
    }
    std::sort(rates.begin(), rates.end());
    return rates[rates.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    const int cols = argc > 1 ? std::atoi(argv[1]) : 2048;
    if (argc > 2) {
        cpu::SimdLevel level;
        if (!cpu::parse_simd_level(argv[2], &level) || level > cpu::detect_simd_level()) {
            std::fprintf(stderr, "quantized_gemm_bench: no level %s on this CPU\n", argv[2]);
            return 1;
        }
        cpu::set_simd_level(level);
    }
    std::printf("%d columns, %d threads, %s, GB/s of weights from memory (median); tokens × GB/s\n",
                cols, omp_get_max_threads(), cpu::simd_description().c_str());
    std::printf("| weights | tokens | GB/s | tokens × GB/s |\n| --- | ---: | ---: | ---: |\n");
    std::mt19937 rng(1);
    for (DType dtype : {DType::Q8_0, DType::Q4_0}) {
        Matrix m{nullptr, dtype, 1, cols, nullptr};
        const size_t row_bytes = m.row_bytes() + m.scale_count_per_row() * sizeof(uint16_t);
        m.rows = int(kMatrixBytes / row_bytes) + 5;  // a last tile of 5 rows
        std::vector<uint8_t> values(size_t(m.rows) * m.row_bytes());
        for (uint8_t& v : values) v = uint8_t(rng());
        const uint16_t kScale = 0x2c00;  // f16 1/16
        std::vector<uint16_t> scales(size_t(m.rows) * m.scale_count_per_row(), kScale);
        m.data = values.data();
        m.scales = scales.data();
        const cpu::AlignedBytes tiles = cpu::make_row_tiles(m);
        m.row_tiles = tiles.get();
        for (int batch : kBatches) {
            const double gbps = gemm_gbps(m, batch, rng);
            std::printf("| %s | %d | %.1f | %.1f |\n", dtype == DType::Q8_0 ? "Q8" : "Q4", batch,
                        gbps, gbps * batch);
        }
    }
}
