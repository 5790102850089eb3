// One core of the decode matvec on Q8 and Q4 weights and on the blocks of 32 whose nibbles pick
// a level in a table, IQ4_NL and MXFP4, x quantized once beforehand (quantize_q8): AVX2 on the
// rows as the file has them (avx2::matvec_rows_q8 / _q4 / _small_blocks), and AVX-VNNI and
// AVX-512 VNNI where the CPU has them, on weights in tiles of 16 rows (avxvnni:: and
// avx512::matvec_rows_q8 / _q4 / _lookup_blocks, cpu/quantized_tiles.h); in
// GB/s of the file's bytes (MXFP4's tiles hold 18 bytes a block of 32 where the file has 17): from
// L2 (a 0.3 MB matrix read again and again: the kernel's own speed) and from memory (a 600 MB
// matrix: what decode meets), beside the streaming read `barellm bench` measures
// (measure_read_bandwidth). A matvec well above the streaming read from L2 leaves the memory to set
// decode's pace. After `make`, linked against an archive of its objects (only what is used is
// taken):
//   ar rcs build/objects.a build/src/*.o build/src/*/*.o build/src/*/*/*.o
//   g++ -std=c++17 -O2 -fopenmp -Isrc -o build/quantized_matvec_bench
//       dev/cpu/quantized_matvec_bench.cpp build/objects.a        (one command)
//   (a build with CUDA: add build/kernels/*.o -L/usr/local/cuda/lib64 -lcudart_static -ldl -lrt
//   -lpthread, for the backend that bench's objects name)
//   build/quantized_matvec_bench [COLS (default 2048)]
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "commands/bench.h"
#include "cpu/avx2/avx2.h"
#include "cpu/avx2/avxvnni.h"
#include "cpu/avx512/avx512.h"
#include "cpu/kernels.h"
#include "cpu/quantized_tiles.h"
#include "weights/model.h"
#include "weights/weight_blocks.h"

using namespace barellm;

namespace {

constexpr double kInCacheBytes = 0.3e6;              // well inside a 1 MB L2
constexpr double kInMemoryBytes = 600e6;             // far past any last-level cache
constexpr double kBytesPerRun = 3e9;                 // repetitions: about this much read in all
constexpr uint16_t kScale = 0x2c00;                  // f16 1/16: every scale
constexpr uint8_t kMxfp4ScaleOfSixteenth = 128 - 4;  // MXFP4's e of the same 1/16

double seconds() {
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec + now.tv_nsec * 1e-9;
}

// The median GB/s of run() reading `bytes` each time.
template <typename Run>
double median_gbps(double bytes, Run run) {
    std::vector<double> rates;
    const int repetitions = std::max(5, int(kBytesPerRun / bytes));
    for (int r = 0; r < repetitions; ++r) {
        const double start = seconds();
        run();
        rates.push_back(bytes / (seconds() - start) / 1e9);
    }
    std::sort(rates.begin(), rates.end());
    return rates[rates.size() / 2];
}

// The kernels measured: AVX2's on the rows, AVX-VNNI's and AVX-512 VNNI's on the tiles.
enum class Kernel { Avx2, AvxVnni, Avx512Vnni };
const char* kernel_name(Kernel kernel) {
    return kernel == Kernel::Avx2      ? "AVX2"
           : kernel == Kernel::AvxVnni ? "AVX-VNNI"
                                       : "AVX-512 VNNI";
}

double matvec_gbps(DType dtype, Kernel kernel, int cols, double bytes) {
    std::mt19937 rng(1);
    Matrix m{nullptr, dtype, 1, cols, nullptr};
    const size_t row_bytes = m.row_bytes() + m.scale_count_per_row() * sizeof(uint16_t);
    m.rows = int(bytes / row_bytes);
    std::vector<uint8_t> values(size_t(m.rows) * m.row_bytes());
    for (uint8_t& v : values) v = uint8_t(rng());
    std::vector<uint16_t> scales(size_t(m.rows) * m.scale_count_per_row(), kScale);
    m.data = values.data();
    m.scales = scales.data();
    const bool lookup = dtype == DType::IQ4_NL || dtype == DType::MXFP4;
    if (lookup) {  // every block's scale 1/16: IQ4_NL's f16 d, MXFP4's exponent 2^(e − 128)
        const size_t block_bytes =
            dtype == DType::IQ4_NL ? sizeof(BlockIQ4_NL) : sizeof(BlockMXFP4);
        for (size_t at = 0; at < values.size(); at += block_bytes)
            if (dtype == DType::IQ4_NL)
                std::memcpy(&values[at], &kScale, sizeof(kScale));
            else
                values[at] = kMxfp4ScaleOfSixteenth;
    }
    const bool tiled = kernel != Kernel::Avx2;
    const cpu::AlignedBytes tiles = tiled ? cpu::make_row_tiles(m) : cpu::AlignedBytes();
    m.row_tiles = tiles.get();
    std::vector<float> x(cols), out(m.rows);
    for (float& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
    cpu::QuantizedVector quantized;
    cpu::quantize_q8(&quantized, x.data(), cols);
    using Matvec = void (*)(float*, const Matrix&, const cpu::QuantizedVector&, int, int);
    const auto pick = [&](Matvec avx2, Matvec avx_vnni, Matvec avx512_vnni) {
        return kernel == Kernel::Avx2 ? avx2 : kernel == Kernel::AvxVnni ? avx_vnni : avx512_vnni;
    };
    const Matvec matvec =
        lookup ? pick(cpu::avx2::matvec_rows_small_blocks, cpu::avxvnni::matvec_rows_lookup_blocks,
                      cpu::avx512::matvec_rows_lookup_blocks)
        : dtype == DType::Q8_0 ? pick(cpu::avx2::matvec_rows_q8, cpu::avxvnni::matvec_rows_q8,
                                      cpu::avx512::matvec_rows_q8)
                               : pick(cpu::avx2::matvec_rows_q4, cpu::avxvnni::matvec_rows_q4,
                                      cpu::avx512::matvec_rows_q4);
    return median_gbps(double(m.bytes()), [&] { matvec(out.data(), m, quantized, 0, m.rows); });
}

}  // namespace

int main(int argc, char** argv) {
    const int cols = argc > 1 ? std::atoi(argv[1]) : 2048;
    if (cpu::detect_simd_level() < cpu::SimdLevel::Avx2) {
        std::printf("this CPU has no AVX2: nothing to measure\n");
        return 1;
    }
    std::vector<Kernel> kernels = {Kernel::Avx2};
    if (cpu::cpu_has_avx_vnni()) kernels.push_back(Kernel::AvxVnni);
    if (cpu::detect_simd_level() >= cpu::SimdLevel::Avx512 && cpu::cpu_has_avx512_vnni())
        kernels.push_back(Kernel::Avx512Vnni);
    omp_set_num_threads(1);  // one core, the streaming read's too
    std::printf("%d columns, one thread, GB/s of weights (median)\n", cols);
    std::printf("| weights | kernel | from L2 | from memory |\n| --- | --- | ---: | ---: |\n");
    for (DType dtype : {DType::Q8_0, DType::Q4_0, DType::IQ4_NL, DType::MXFP4})
        for (Kernel kernel : kernels)
            std::printf("| %s | %s | %.1f | %.1f |\n", matrix_type_name(dtype).c_str(),
                        kernel_name(kernel), matvec_gbps(dtype, kernel, cols, kInCacheBytes),
                        matvec_gbps(dtype, kernel, cols, kInMemoryBytes));
    std::printf("| streaming read | | | %.1f |\n", measure_read_bandwidth());
}
