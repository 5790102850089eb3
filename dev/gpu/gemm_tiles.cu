// The prefill GEMM's tensor-core kernel (kernels/gemm.cuh, gemm_tensor_core_kernel) with the
// tile shapes gemm chooses among for 512 tokens, and the warpgroup GEMM
// (kernels/gemm_warpgroup.cuh) with several tile, stage and cluster shapes, at Mistral 7B's
// matrices: each one's time, TFLOPS and share of the dense f16 peak at the GPU's reported
// clock, and its largest difference from the medium tiles' result (checked against the CPU by
// cuda_kernel_check), relative to the largest output. Other shapes go into the list to be
// timed; those that win go into gemm.cuh's tiles and rule.
//
// Build and run on an H100 or H200, from the repository root (about a minute to build;
// sm_90a for the warpgroup GEMM):
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Isrc -Ikernels \
//       -o build/gemm_tiles dev/gpu/gemm_tiles.cu src/safetensors.cpp src/json.cpp src/files.cpp
//   build/gemm_tiles [SHAPE]     (SHAPE: qkv, wo, w1 or w2 alone)
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "gemm.cuh"

// A named namespace: nvcc's generated launch stub cannot name a kernel in an anonymous one
// beside gemm.cuh's.
namespace gemm_tiles {

using namespace barellm;
using namespace barellm::cuda;

// Fills `count` f16 values with a hash of their index in [-1, 1): random-looking bits, so the
// tensor cores draw the power they draw on real weights.
__global__ void fill_random_f16(__half* values, size_t count, uint32_t seed) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
         i += size_t(gridDim.x) * blockDim.x) {
        uint32_t h = uint32_t(i) * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        values[i] = __float2half(float(h >> 8) / float(1u << 23) - 1.0f);
    }
}

struct Shape {
    const char* name;
    int rows, cols;
};

constexpr int kSliceRows = 32;  // the warpgroup GEMM's smallest slice of rows
constexpr int kSliceSizes = 4;  // 32, 64, 128, 256 rows

// i with kSliceRows << i == rows.
constexpr int slice_map(int rows) {
    int i = 0;
    while (kSliceRows << i < rows) ++i;
    return i;
}

struct Operands {
    __half* weights;
    __half* in;
    float* out;
    int tokens, rows, cols;
    // The warpgroup GEMM's views of the operands, in boxes of kSliceRows << i rows
    // (in_maps[i], weights_maps[i]): the slices of 32 to 256 rows a block copies.
    CUtensorMap in_maps[kSliceSizes], weights_maps[kSliceSizes];
};

using Launch = void (*)(const Operands&);

template <typename Tiles>
void launch(const Operands& o) {
    auto kernel = gemm_tensor_core_kernel<DType::F16, Tiles>;
    kernel<<<gemm_tensor_core_grid<Tiles>(o.tokens, o.rows), Tiles::kThreads,
             Tiles::kSharedBytes>>>(o.out, o.rows, reinterpret_cast<const uint16_t*>(o.weights),
                                    o.rows, o.cols, reinterpret_cast<const uint16_t*>(o.in),
                                    o.tokens, o.cols, o.cols, nullptr, false);
    CUDA_CHECK_LAUNCH("gemm_tensor_core_kernel");
}

struct Variant {
    const char* name;  // tokens x rows, warps tokens x rows x K, columns per warp, stages
    Launch run;
    size_t shared_bytes;
};

// Each variant opts in to its shared memory here, once, outside the timed launches.
template <typename Tiles>
Variant variant(const char* name, size_t shared_limit) {
    if (Tiles::kSharedBytes <= shared_limit)
        allow_shared_bytes(gemm_tensor_core_kernel<DType::F16, Tiles>, Tiles::kSharedBytes);
    return {name, launch<Tiles>, Tiles::kSharedBytes};
}

template <typename Tiles>
void launch_warpgroup(const Operands& o) {
    static_assert(Tiles::kRowSlice >= kSliceRows && Tiles::kTokenSlice >= kSliceRows,
                  "the maps' slices start at kSliceRows");
    launch_gemm_warpgroup_kernel<DType::F16, Tiles>(
        o.out, o.rows, o.rows, o.tokens, o.cols, nullptr, false,
        o.weights_maps[slice_map(Tiles::kRowSlice)], o.in_maps[slice_map(Tiles::kTokenSlice)], 0);
}

// The launch opts in to the shared memory (launch_gemm_warpgroup_kernel), where it fits.
template <typename Tiles>
Variant warpgroup_variant(const char* name) {
    return {name, launch_warpgroup<Tiles>, Tiles::kSharedBytes};
}

double median_ms(const Operands& o, Launch run) {
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    constexpr int kWarmups = 3, kRepeats = 25;
    for (int i = 0; i < kWarmups; ++i) run(o);
    std::vector<float> times;
    for (int i = 0; i < kRepeats; ++i) {
        CUDA_CHECK(cudaEventRecord(start));
        run(o);
        CUDA_CHECK(cudaEventRecord(stop));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        times.push_back(ms);
    }
    std::sort(times.begin(), times.end());
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    return times[times.size() / 2];
}

std::vector<float> to_host(const float* device, size_t count) {
    std::vector<float> host(count);
    CUDA_CHECK(cudaMemcpy(host.data(), device, count * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
}

}  // namespace gemm_tiles

int main(int argc, char** argv) {
    using namespace gemm_tiles;
    try {
        cudaDeviceProp properties;
        CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
        int clock_khz = 0;
        CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
        constexpr double kSm90FlopsPerClock = 4096;  // dense f16, f32 accumulation, per SM
        const double peak_tflops =
            properties.multiProcessorCount * (clock_khz * 1e3) * kSm90FlopsPerClock / 1e12;
        std::printf("%s, %d SMs, %d MHz: dense f16 peak %.1f TFLOPS\n", properties.name,
                    properties.multiProcessorCount, clock_khz / 1000, peak_tflops);

        // name: tile tokens x rows / warps tokens x rows x K / columns per warp and K tile /
        // stages (warpgroup: tile / stages / cluster).
        const size_t limit = properties.sharedMemPerBlockOptin;
        const std::vector<Variant> variants = {
            variant<MediumTiles>("medium 64x64/2x2x1/32/4", limit),
            variant<LargeTiles>("large 128x128/2x2x2/32/4", limit),
            variant<WideTiles>("wide 128x256/2x4x1/32/4", limit),
            // The warpgroup GEMM: tile / stages / cluster of token tiles x row tiles
            // (WarpgroupWideTiles<2>: 128x256/4/2x2, WarpgroupNarrowTiles<2>: 128x128/6/2x2;
            // gemm takes 1x2 clusters where the token tiles are odd).
            warpgroup_variant<WarpgroupTiles<128, 6, 1, 1>>("warpgroup 128x128/6/1x1"),
            warpgroup_variant<WarpgroupTiles<256, 4, 1, 1>>("warpgroup 128x256/4/1x1"),
            warpgroup_variant<WarpgroupTiles<256, 4, 2, 1>>("warpgroup 128x256/4/2x1"),
            warpgroup_variant<WarpgroupTiles<256, 4, 4, 1>>("warpgroup 128x256/4/4x1"),
            warpgroup_variant<WarpgroupWideTiles<2>>("warpgroup 128x256/4/2x2"),
            warpgroup_variant<WarpgroupNarrowTiles<2>>("warpgroup 128x128/6/2x2"),
            warpgroup_variant<WarpgroupTiles<128, 6, 4, 2>>("warpgroup 128x128/6/4x2"),
        };
        const Shape shapes[] = {
            {"qkv", 6144, 4096}, {"wo", 4096, 4096}, {"w1", 14336, 4096}, {"w2", 4096, 14336}};
        constexpr int kTokens = 512;

        // Every shape's operands first, and the medium tiles' result as the reference; then
        // each variant over the shapes (the warpgroup GEMM last: a fault there leaves the
        // others' rows printed).
        std::vector<Operands> operands;
        std::vector<std::vector<float>> references;
        std::vector<const char*> names;
        for (const Shape& shape : shapes) {
            if (argc > 1 && std::strcmp(argv[1], shape.name) != 0) continue;
            Operands o{nullptr, nullptr, nullptr, kTokens, shape.rows, shape.cols, {}, {}};
            const size_t w_count = size_t(shape.rows) * shape.cols;
            const size_t in_count = size_t(kTokens) * shape.cols;
            CUDA_CHECK(cudaMalloc(&o.weights, w_count * sizeof(__half)));
            CUDA_CHECK(cudaMalloc(&o.in, in_count * sizeof(__half)));
            CUDA_CHECK(cudaMalloc(&o.out, size_t(kTokens) * shape.rows * sizeof(float)));
            for (int i = 0; i < kSliceSizes; ++i) {
                o.in_maps[i] = warpgroup_tensor_map(o.in, DType::F16, kTokens, shape.cols,
                                                    shape.cols, kSliceRows << i);
                o.weights_maps[i] = warpgroup_tensor_map(o.weights, DType::F16, shape.rows,
                                                         shape.cols, shape.cols, kSliceRows << i);
            }
            fill_random_f16<<<1024, 256>>>(o.weights, w_count, 1);
            fill_random_f16<<<1024, 256>>>(o.in, in_count, 2);
            CUDA_CHECK_LAUNCH("fill_random_f16");
            variants.front().run(o);
            references.push_back(to_host(o.out, size_t(kTokens) * shape.rows));
            operands.push_back(o);
            names.push_back(shape.name);
        }

        std::printf(
            "\n| tiles | shape | us | TFLOPS | %% of peak | max diff vs medium |\n"
            "| --- | --- | ---: | ---: | ---: | ---: |\n");
        for (const Variant& v : variants) {
            for (size_t s = 0; s < operands.size(); ++s) {
                const Operands& o = operands[s];
                if (v.shared_bytes > limit) {
                    std::printf("| %s | %s | more shared memory than the GPU has | | | |\n", v.name,
                                names[s]);
                    continue;
                }
                const size_t out_count = size_t(o.tokens) * o.rows;
                CUDA_CHECK(cudaMemset(o.out, 0xff, out_count * sizeof(float)));  // NaN
                v.run(o);
                const std::vector<float> result = to_host(o.out, out_count);
                const std::vector<float>& reference = references[s];
                double worst = 0, scale = 0;
                for (size_t i = 0; i < out_count; ++i) {
                    scale = std::max(scale, double(std::fabs(reference[i])));
                    const double d = std::fabs(double(result[i]) - reference[i]);
                    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
                }
                const double ms = median_ms(o, v.run);
                const double tflops = 2.0 * o.tokens * o.rows * o.cols / ms / 1e9;
                std::printf("| %s | %s %dx%dx%d | %.1f | %.1f | %.1f%% | %.2g |\n", v.name,
                            names[s], o.tokens, o.rows, o.cols, ms * 1e3, tflops,
                            100 * tflops / peak_tflops, worst / scale);
                std::fflush(stdout);
            }
        }
        for (const Operands& o : operands) {
            CUDA_CHECK(cudaFree(o.weights));
            CUDA_CHECK(cudaFree(o.in));
            CUDA_CHECK(cudaFree(o.out));
        }
        return 0;
    } catch (const std::exception& e) {
        std::printf("gemm_tiles: %s\n", e.what());
        return 1;
    }
}
