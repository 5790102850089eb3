// One core of the decode matvec on the super-block types' tiles (cpu/super_block_tiles.h:
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS), on AVX2 (avx2::matvec_rows_block_tiles) and AVX-512 VNNI
// (avx512::matvec_rows_block_tiles), and on the i-quants' and the ternary types' rows (IQ2_XXS,
// IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0: avx2:: and avx512::matvec_rows_iq,
// and TQ1_0's avxvnni::matvec_rows_tq1_0),
// x quantized once beforehand as Q8_K:
// GB/s of the weights'
// bytes in the file, from L2 (a 0.3 MB matrix read again and again: the kernel's own speed) and
// from memory (a 600 MB matrix: what decode meets), beside the streaming read `barellm bench`
// measures. Each figure is the best of its repetitions: on a shared machine the best run is the
// one least slowed by the neighbours. A kernel well above the streaming read from L2 leaves the
// memory to set decode's pace; one near it spends part of each cache line's wait computing.
// After `make`, linked against an archive of its objects as quantized_matvec_bench.cpp says:
//   ar rcs build/objects.a build/src/*.o build/src/*/*.o build/src/*/*/*.o
//   g++ -std=c++17 -O2 -fopenmp -Isrc -o build/super_block_matvec_bench
//       dev/cpu/super_block_matvec_bench.cpp build/objects.a        (one command)
//   build/super_block_matvec_bench [COLS (default 2048, a multiple of 256)] [TYPE]
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "commands/bench.h"
#include "cpu/avx2/avx2.h"
#include "cpu/avx2/avxvnni.h"
#include "cpu/avx512/avx512.h"
#include "cpu/kernels.h"
#include "cpu/quantized_tiles.h"
#include "weights/weight_blocks.h"

using namespace barellm;

namespace {

constexpr double kInCacheBytes = 0.3e6;   // well inside a 1 MB L2
constexpr double kInMemoryBytes = 600e6;  // far past any last-level cache
constexpr double kBytesPerRun = 3e9;      // repetitions: about this much read in all
constexpr int kLeastRepetitions = 15;
constexpr uint16_t kSmallScale = 0x2c00;  // f16 1/16: every d and dmin

double seconds() {
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec + now.tv_nsec * 1e-9;
}

// The best GB/s of run() reading `bytes` each time.
template <typename Run>
double best_gbps(double bytes, Run run) {
    double best = 0;
    const int repetitions = std::max(kLeastRepetitions, int(kBytesPerRun / bytes));
    for (int r = 0; r < repetitions; ++r) {
        const double start = seconds();
        run();
        best = std::max(best, bytes / (seconds() - start) / 1e9);
    }
    return best;
}

// Random blocks of `dtype` with finite scales: d (and dmin) set to kSmallScale, the rest random.
std::vector<uint8_t> random_blocks(DType dtype, size_t blocks, std::mt19937* rng) {
    const int bytes = block_bytes(dtype);
    std::vector<uint8_t> values(blocks * bytes);
    for (uint8_t& v : values) v = uint8_t((*rng)());
    for (size_t b = 0; b < blocks; ++b) {
        uint8_t* block = values.data() + b * bytes;
        switch (dtype) {
            case DType::Q2_K:  // d, dmin last
                std::memcpy(block + bytes - 2 * sizeof kSmallScale, &kSmallScale,
                            sizeof kSmallScale);
                [[fallthrough]];
            case DType::Q3_K:  // d last
            case DType::Q6_K:
            case DType::TQ1_0:
            case DType::TQ2_0:
                std::memcpy(block + bytes - sizeof kSmallScale, &kSmallScale, sizeof kSmallScale);
                break;
            case DType::Q4_K:
            case DType::Q5_K:  // d, dmin first
                std::memcpy(block + sizeof kSmallScale, &kSmallScale, sizeof kSmallScale);
                [[fallthrough]];
            case DType::IQ1_M:  // d in the top nibbles of the four scales words
                for (int i = 0; i < 4; ++i) {
                    uint8_t* top = block + offsetof(BlockIQ1_M, scales) + 2 * i + 1;
                    *top = uint8_t((*top & 0x0f) | ((kSmallScale >> (4 * i)) & 15) << 4);
                }
                break;
            default:  // IQ4_XS and the other i-quants: d first
                std::memcpy(block, &kSmallScale, sizeof kSmallScale);
        }
    }
    return values;
}

enum class Kernel { Avx2, AvxVnni, Avx512Vnni };

double matvec_gbps(DType dtype, Kernel kernel_set, int cols, double bytes) {
    const bool avx512 = kernel_set == Kernel::Avx512Vnni;
    std::mt19937 rng(1);
    Matrix m{nullptr, dtype, 1, cols, nullptr};
    m.rows = std::max(1, int(bytes / m.row_bytes()));
    const std::vector<uint8_t> values =
        random_blocks(dtype, size_t(m.rows) * (cols / kSuperBlock), &rng);
    m.data = values.data();
    std::vector<float> x(cols), out(m.rows);
    for (float& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
    cpu::Q8KVector quantized;
    cpu::quantize_q8_k(&quantized, x.data(), cols);
    if (is_iq_grid_type(dtype) || is_ternary_type(dtype)) {  // read from their rows
        const auto kernel = avx512                          ? cpu::avx512::matvec_rows_iq
                            : kernel_set == Kernel::AvxVnni ? cpu::avxvnni::matvec_rows_tq1_0
                                                            : cpu::avx2::matvec_rows_iq;
        return best_gbps(double(m.bytes()), [&] { kernel(out.data(), m, quantized, 0, m.rows); });
    }
    const cpu::AlignedBytes tiles = cpu::make_row_tiles(m);
    m.row_tiles = tiles.get();
    const auto kernel =
        avx512 ? cpu::avx512::matvec_rows_block_tiles : cpu::avx2::matvec_rows_block_tiles;
    return best_gbps(double(m.bytes()),
                     [&] { kernel(out.data(), size_t(m.rows), m, &quantized, 1, 0, m.rows); });
}

}  // namespace

int main(int argc, char** argv) {
    const int cols = argc > 1 ? std::atoi(argv[1]) : 2048;
    const std::string only = argc > 2 ? argv[2] : "";
    if (cols <= 0 || cols % kSuperBlock != 0) {
        std::printf("COLS must be a positive multiple of %d\n", kSuperBlock);
        return 1;
    }
    if (cpu::detect_simd_level() < cpu::SimdLevel::Avx2) {
        std::printf("this CPU has no AVX2: nothing to measure\n");
        return 1;
    }
    const bool has_avx512 =
        cpu::detect_simd_level() >= cpu::SimdLevel::Avx512 && cpu::cpu_has_avx512_vnni();
    omp_set_num_threads(1);  // one core, the streaming read's too
    std::printf("%d columns, one thread, GB/s of weights (best)\n", cols);
    std::printf("| weights | kernel | from L2 | from memory |\n| --- | --- | ---: | ---: |\n");
    for (DType dtype : {DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K,
                        DType::IQ4_XS, DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS,
                        DType::IQ3_S, DType::IQ1_S, DType::IQ1_M, DType::TQ1_0, DType::TQ2_0}) {
        const std::string name = matrix_type_name(dtype);
        if (!only.empty() && name != only) continue;
        for (Kernel kernel : {Kernel::Avx2, Kernel::AvxVnni, Kernel::Avx512Vnni}) {
            if (kernel == Kernel::Avx512Vnni && !has_avx512) continue;
            if (kernel == Kernel::AvxVnni && (dtype != DType::TQ1_0 || !cpu::cpu_has_avx_vnni()))
                continue;
            std::printf("| %s | %s | %.1f | %.1f |\n", name.c_str(),
                        kernel == Kernel::Avx512Vnni ? "AVX-512 VNNI"
                        : kernel == Kernel::AvxVnni  ? "AVX-VNNI"
                                                     : "AVX2",
                        matvec_gbps(dtype, kernel, cols, kInCacheBytes),
                        matvec_gbps(dtype, kernel, cols, kInMemoryBytes));
        }
    }
    std::printf("| streaming read | | | %.1f |\n", measure_read_bandwidth());
}
