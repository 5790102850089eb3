// The FMA peak of each core, the roof of the prefill GEMM: 12 independent chains of 256-bit
// fused multiply-adds on every OpenMP thread at once, one line per thread.
//   g++ -O2 -mavx2 -mfma -fopenmp dev/cpu/fma_peak.cpp -o build/fma_peak
//   OMP_NUM_THREADS=1 build/fma_peak      (one core; without it, every core at once)
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdio>

int main() {
#pragma omp parallel
    {
        constexpr int kChains = 12;
        constexpr long kIterations = 200000000;
        __m256 chains[kChains];
        for (int i = 0; i < kChains; ++i) chains[i] = _mm256_set1_ps(i * 0.001f);
        const __m256 scale = _mm256_set1_ps(0.9999f), offset = _mm256_set1_ps(0.0001f);
        const auto start = std::chrono::steady_clock::now();
        for (long k = 0; k < kIterations; ++k) {
#pragma GCC unroll 12
            for (int i = 0; i < kChains; ++i) chains[i] = _mm256_fmadd_ps(chains[i], scale, offset);
        }
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        __m256 total = chains[0];
        for (int i = 1; i < kChains; ++i) total = _mm256_add_ps(total, chains[i]);
        float lanes[8];
        _mm256_storeu_ps(lanes, total);
        const double flops = double(kIterations) * kChains * 8 * 2;  // 8 lanes, multiply + add
        std::printf("thread %d: %.1f GFLOP/s (checksum %g)\n", omp_get_thread_num(),
                    flops / seconds / 1e9, lanes[0]);
    }
}
