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
//       -o build/gemm_tiles dev/gpu/gemm_tiles.cu src/weights/safetensors.cpp src/util/json.cpp src/util/files.cpp
//   build/gemm_tiles [SHAPE]     (SHAPE: qkv, wo, w1, w1w3 or w2 alone)
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <utility>
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

struct Operands {
    __half* weights;
    __half* in;
    float* out;
    int tokens, rows, cols;
    // The warpgroup GEMM's views of the operands by the rows of their boxes (the weight rows
    // and tokens a block copies), made on first use: the timed launches find them made.
    mutable std::map<std::pair<int, int>, WarpgroupMaps> maps_by_boxes;
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
    int concurrent_blocks = 0;  // the warpgroup GEMM's blocks at once (0: not counted)
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
    const std::pair<int, int> boxes(Tiles::kRowSlice, Tiles::kTokenSlice);
    auto found = o.maps_by_boxes.find(boxes);
    if (found == o.maps_by_boxes.end())
        found = o.maps_by_boxes
                    .emplace(boxes,
                             warpgroup_maps<DType::F16, Tiles>({o.weights, o.rows, o.cols}, nullptr,
                                                               {o.in, o.tokens, o.cols}, o.cols))
                    .first;
    launch_gemm_warpgroup_kernel<DType::F16, Tiles, false>(
        o.out, o.rows, o.rows, o.rows, o.tokens, o.cols, nullptr, false, found->second, 0);
}

// With the blocks the GPU runs at once, which choose_warpgroup_shape weighs (where the
// block fits the GPU's shared memory).
template <typename Tiles>
Variant warpgroup_variant(const char* name, size_t shared_limit) {
    const bool fits = Tiles::kSharedBytes <= shared_limit;
    return {name, launch_warpgroup<Tiles>, Tiles::kSharedBytes,
            fits ? warpgroup_concurrent_blocks<DType::F16, Tiles>() : 0};
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
            // The warpgroup GEMM: tile / stages / cluster of token tiles x row tiles. gemm
            // runs WarpgroupGemmTiles (2x2 clusters, 1x2 where the token tiles are odd, or
            // 1x1) with the rows and clusters choose_warpgroup_shape picks; others for
            // comparison.
            warpgroup_variant<WarpgroupTiles<128, 7, 1, 1>>("warpgroup 128x128/7/1x1", limit),
            warpgroup_variant<WarpgroupTiles<192, 5, 1, 1>>("warpgroup 128x192/5/1x1", limit),
            warpgroup_variant<WarpgroupTiles<224, 5, 1, 1>>("warpgroup 128x224/5/1x1", limit),
            warpgroup_variant<WarpgroupTiles<256, 4, 1, 1>>("warpgroup 128x256/4/1x1", limit),
            warpgroup_variant<WarpgroupGemmTiles<128, 2>>("warpgroup 128x128/7/2x2", limit),
            warpgroup_variant<WarpgroupGemmTiles<192, 2>>("warpgroup 128x192/5/2x2", limit),
            warpgroup_variant<WarpgroupGemmTiles<224, 2>>("warpgroup 128x224/5/2x2", limit),
            warpgroup_variant<WarpgroupGemmTiles<256, 2>>("warpgroup 128x256/4/2x2", limit),
            warpgroup_variant<WarpgroupGemmTiles<256, 1>>("warpgroup 128x256/4/1x2", limit),
            warpgroup_variant<WarpgroupTiles<256, 4, 2, 1>>("warpgroup 128x256/4/2x1", limit),
            warpgroup_variant<WarpgroupTiles<128, 7, 4, 2>>("warpgroup 128x128/7/4x2", limit),
        };
        // w1w3: the rows of w1 and w3 together, as many as the gated product of gemm_swiglu
        // (the same grid and FLOPs, a plain product).
        const Shape shapes[] = {{"qkv", 6144, 4096},
                                {"wo", 4096, 4096},
                                {"w1", 14336, 4096},
                                {"w1w3", 28672, 4096},
                                {"w2", 4096, 14336}};
        constexpr int kTokens = 512;

        // Every shape's operands first, and the medium tiles' result as the reference; then
        // each variant over the shapes (the warpgroup GEMM last: a fault there leaves the
        // others' rows printed).
        std::vector<Operands> operands;
        std::vector<std::vector<float>> references;
        std::vector<const char*> names;
        for (const Shape& shape : shapes) {
            if (argc > 1 && std::strcmp(argv[1], shape.name) != 0) continue;
            Operands o{nullptr, nullptr, nullptr, kTokens, shape.rows, shape.cols, {}};
            const size_t w_count = size_t(shape.rows) * shape.cols;
            const size_t in_count = size_t(kTokens) * shape.cols;
            CUDA_CHECK(cudaMalloc(&o.weights, w_count * sizeof(__half)));
            CUDA_CHECK(cudaMalloc(&o.in, in_count * sizeof(__half)));
            CUDA_CHECK(cudaMalloc(&o.out, size_t(kTokens) * shape.rows * sizeof(float)));
            fill_random_f16<<<1024, 256>>>(o.weights, w_count, 1);
            fill_random_f16<<<1024, 256>>>(o.in, in_count, 2);
            CUDA_CHECK_LAUNCH("fill_random_f16");
            variants.front().run(o);
            references.push_back(to_host(o.out, size_t(kTokens) * shape.rows));
            operands.push_back(o);
            names.push_back(shape.name);
        }

        std::printf(
            "\n| tiles | shape | us | TFLOPS | %% of peak | max diff vs medium | blocks at once |\n"
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
        for (const Variant& v : variants) {
            for (size_t s = 0; s < operands.size(); ++s) {
                const Operands& o = operands[s];
                if (v.shared_bytes > limit) {
                    std::printf("| %s | %s | more shared memory than the GPU has | | | | |\n",
                                v.name, names[s]);
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
                const std::string at_once =
                    v.concurrent_blocks > 0 ? std::to_string(v.concurrent_blocks) : "";
                std::printf("| %s | %s %dx%dx%d | %.1f | %.1f | %.1f%% | %.2g | %s |\n", v.name,
                            names[s], o.tokens, o.rows, o.cols, ms * 1e3, tflops,
                            100 * tflops / peak_tflops, worst / scale, at_once.c_str());
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
