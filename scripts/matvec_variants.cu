// A matvec design experiment for a GPU session: can a decode matvec stream one matrix as
// fast as matvec_swiglu streams two?
//
// docs/BENCHMARKS.md measured on an H100 (session 4) that a matvec took about
// bytes / 2.52 TB/s + 7.7 µs; since session 5's faster start-up, one matrix streams at
// 86-88% of the device-to-device copy and matvec_swiglu's two at 98% (session 6).
// This program times, at Mistral-7B's four matvec shapes in f16, the production kernel
// (cuda::matvec) against one variant: persistent blocks (as many as fit on the GPU at
// once) that stage the input once and then take groups of rows in turn, each warp
// streaming kRows rows at a time (kRows * kMatvecUnroll 16-byte loads in flight per lane).
// Every variant is first checked against a double-precision CPU product of the same f16
// weights; then each is timed over rotating copies of the weights (so L2 holds none).
//
// Written on a machine without a GPU: it compiles warning-free there, and has not run.
// On the GPU machine, after `make CUDA_ARCHS=90`:
//   nvcc -std=c++17 -O3 -arch=sm_90 -Isrc -Ikernels scripts/matvec_variants.cu
//        build/src/safetensors.o -o build/matvec_variants && build/matvec_variants
// (one command line).
// It prints one table: shape, variant, µs, GB/s, % of a device-to-device copy.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "device_memory.h"
#include "matmul.cuh"

// A named namespace: nvcc's kernel stubs cannot tell an anonymous one here from the one in
// matmul.cuh.
namespace matvec_variants {

using namespace barellm;
using namespace barellm::cuda;

constexpr int kWeightCopies = 4;  // rotated between timed calls: 4 x 235 MB far exceeds L2
constexpr int kTimedCalls = 40;
constexpr double kTolerance = 1e-5;  // relative L2 error against the double reference

// out[r] = (kAccumulate ? out[r] : 0) + W[r, :] · stage(in), as matvec_kernel computes it.
// Launch: prepare_launch's grid (as many blocks as fit at once), warps * 32 threads, dynamic shared
// memory pitch * 4 bytes. Block b takes the groups of warps * kRows rows b, b + gridDim.x, ...; in
// a group, warp w reads rows first + w + k * warps, k < kRows.
template <DType D, int kRows, bool kAccumulate>
__global__ void __launch_bounds__(kMatvecThreadsMax)
    matvec_persistent_kernel(float* __restrict__ out, const void* __restrict__ weights, int rows,
                             int pitch, const float* __restrict__ in, int cols,
                             const float* __restrict__ norm_weight, float eps) {
    __shared__ float scratch[kWarpSize];
    __shared__ float results[kMatvecMaxWarps * kRows];
    float* xs = dynamic_shared_floats();
    stage_input<WeightFormat<D>::kPerVector>(xs, in, cols, pitch, norm_weight, eps, scratch);

    const int warps = blockDim.x / kWarpSize, warp = threadIdx.x / kWarpSize;
    const int group_rows = warps * kRows;
    const int groups = (rows + group_rows - 1) / group_rows;
    for (int group = blockIdx.x; group < groups; group += gridDim.x) {  // uniform per block
        const int first = group * group_rows;
        const uint4* row_pointers[kRows];
#pragma unroll
        for (int k = 0; k < kRows; ++k) {  // past the last row: row 0 again, its sum unused
            const int row = first + warp + k * warps;
            row_pointers[k] = weight_row<D>(weights, row < rows ? row : 0, pitch);
        }
        float sums[kRows];
        dot_rows<D, kRows>(reinterpret_cast<const uint4* const(&)[kRows]>(row_pointers), xs, pitch,
                           sums);
        if (threadIdx.x % kWarpSize == 0)
#pragma unroll
            for (int k = 0; k < kRows; ++k) results[warp + k * warps] = sums[k];
        __syncthreads();
        for (int i = threadIdx.x; i < group_rows; i += blockDim.x) {  // coalesced store
            const int r = first + i;
            if (r < rows) out[r] = kAccumulate ? out[r] + results[i] : results[i];
        }
        __syncthreads();  // results is written again by the next group
    }
}

struct Shape {
    const char* name;
    int rows, cols;
    bool norm;        // RMSNorm staged into the input (q/k/v, w1)
    bool accumulate;  // residual added (wo, w2)
};

struct Variant {
    std::string name;
    int rows_per_warp;  // 0: the production kernel
    int warps;
};

using PersistentKernel = void (*)(float*, const void*, int, int, const float*, int, const float*,
                                  float);

PersistentKernel persistent_kernel(int rows_per_warp, bool accumulate) {
    if (rows_per_warp == 2)
        return accumulate ? matvec_persistent_kernel<DType::F16, 2, true>
                          : matvec_persistent_kernel<DType::F16, 2, false>;
    return accumulate ? matvec_persistent_kernel<DType::F16, 1, true>
                      : matvec_persistent_kernel<DType::F16, 1, false>;
}

// How a variant runs a shape, settled once before it is timed: the persistent kernel (null
// for the production one), its grid and its dynamic shared memory.
struct Launch {
    PersistentKernel kernel = nullptr;
    int grid = 0, threads = 0;
    size_t shared = 0;
};

Launch prepare_launch(const Variant& v, const Shape& shape, int multiprocessors) {
    Launch launch;
    if (v.rows_per_warp == 0) return launch;
    launch.kernel = persistent_kernel(v.rows_per_warp, shape.accumulate);
    launch.threads = v.warps * kWarpSize;
    launch.shared = matvec_shared_bytes(shape.cols);
    CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(launch.kernel),
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(launch.shared)));
    int per_multiprocessor = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, launch.kernel,
                                                             launch.threads, launch.shared));
    const int group_rows = v.warps * v.rows_per_warp;
    const int groups = (shape.rows + group_rows - 1) / group_rows;
    launch.grid = std::max(1, std::min(groups, per_multiprocessor * multiprocessors));
    return launch;
}

void run_variant(const Launch& launch, float* out, const void* weights, const Shape& shape,
                 const float* in, const float* norm_weight) {
    if (launch.kernel == nullptr) {
        const DeviceMatrix w{weights, DType::F16, shape.rows, shape.cols, shape.cols};
        matvec(out, w, in, norm_weight, 1e-5f, shape.accumulate, nullptr);
        return;
    }
    launch.kernel<<<launch.grid, launch.threads, launch.shared>>>(
        out, weights, shape.rows, shape.cols, in, shape.cols, norm_weight, 1e-5f);
    CUDA_CHECK_LAUNCH("matvec_persistent_kernel");
}

// The product in double precision from the same f16 weights, RMSNorm and residual included.
std::vector<double> reference(const std::vector<__half>& w, const Shape& shape,
                              const std::vector<float>& in, const std::vector<float>& norm,
                              const std::vector<float>& residual) {
    std::vector<double> x(in.begin(), in.end());
    if (shape.norm) {
        double squares = 0;
        for (float v : in) squares += double(v) * v;
        const float scale = 1.0f / std::sqrt(float(squares / shape.cols) + 1e-5f);
        for (int c = 0; c < shape.cols; ++c) x[c] = double(in[c] * scale * norm[c]);
    }
    std::vector<double> out(shape.rows);
    for (int r = 0; r < shape.rows; ++r) {
        double sum = shape.accumulate ? residual[r] : 0.0;
        for (int c = 0; c < shape.cols; ++c)
            sum += double(__half2float(w[size_t(r) * shape.cols + c])) * x[c];
        out[r] = sum;
    }
    return out;
}

double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
    double difference = 0, norm = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        if (!std::isfinite(got[i])) return INFINITY;
        difference += (got[i] - want[i]) * (got[i] - want[i]);
        norm += want[i] * want[i];
    }
    return std::sqrt(difference / norm);
}

template <typename Work>
double milliseconds_per_call(Work work) {
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    work(0);  // warm-up
    CUDA_CHECK(cudaEventRecord(start));
    for (int call = 0; call < kTimedCalls; ++call) work(call);
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    return ms / kTimedCalls;
}

}  // namespace matvec_variants

int main() {
    using namespace matvec_variants;
    try {
        cudaDeviceProp properties;
        CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
        std::printf("GPU: %s (%d SMs)\n", properties.name, properties.multiProcessorCount);
        const std::vector<Shape> shapes = {{"q/k/v + RMSNorm", 6144, 4096, true, false},
                                           {"wo + residual", 4096, 4096, false, true},
                                           {"w1 + RMSNorm", 14336, 4096, true, false},
                                           {"w2 + residual", 4096, 14336, false, true}};
        const std::vector<Variant> variants = {{"production (a block per 8/16 rows)", 0, 0},
                                               {"persistent, 1 row per warp, 8 warps", 1, 8},
                                               {"persistent, 2 rows per warp, 8 warps", 2, 8},
                                               {"persistent, 1 row per warp, 16 warps", 1, 16},
                                               {"persistent, 2 rows per warp, 16 warps", 2, 16}};
        prepare_matvec(matvec_shared_bytes(14336));

        const size_t copy_bytes = size_t(1) << 30;
        DeviceBuffer copy_from(copy_bytes, "copy"), copy_to(copy_bytes, "copy");
        CUDA_CHECK(cudaMemset(copy_from.as(), 1, copy_bytes));
        const double copy_gbps =
            2.0 * copy_bytes / 1e6 / milliseconds_per_call([&](int) {
                CUDA_CHECK(cudaMemcpyAsync(copy_to.as(), copy_from.as(), copy_bytes,
                                           cudaMemcpyDeviceToDevice));
            });

        std::mt19937 rng(5);
        std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
        int failures = 0;
        std::printf("\n| shape | variant | check | us | GB/s | %% of copy |\n");
        std::printf("| --- | --- | --- | ---: | ---: | ---: |\n");
        std::printf("| device-to-device copy | | | | %.0f | 100%% |\n", copy_gbps);
        for (const Shape& shape : shapes) {
            const size_t elements = size_t(shape.rows) * shape.cols;
            std::vector<__half> w(elements);
            for (__half& h : w) h = __float2half(uniform(rng) * 0.05f);
            std::vector<float> in(shape.cols), norm(shape.cols), residual(shape.rows);
            for (float& v : in) v = uniform(rng);
            for (float& v : norm) v = 1.0f + 0.5f * uniform(rng);
            for (float& v : residual) v = uniform(rng);
            DeviceBuffer weights(elements * sizeof(__half) * kWeightCopies, "weights");
            for (int copy = 0; copy < kWeightCopies; ++copy)
                CUDA_CHECK(cudaMemcpy(weights.as<__half>() + copy * elements, w.data(),
                                      elements * sizeof(__half), cudaMemcpyHostToDevice));
            DeviceBuffer device_in(in.size() * sizeof(float), "in"),
                device_norm(norm.size() * sizeof(float), "norm"),
                out(residual.size() * sizeof(float), "out");
            CUDA_CHECK(cudaMemcpy(device_in.as(), in.data(), in.size() * sizeof(float),
                                  cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(device_norm.as(), norm.data(), norm.size() * sizeof(float),
                                  cudaMemcpyHostToDevice));
            const std::vector<double> want = reference(w, shape, in, norm, residual);
            const float* norm_weight = shape.norm ? device_norm.as<float>() : nullptr;

            for (const Variant& v : variants) {
                // Check: out poisoned (or the residual, when accumulating), one call.
                std::vector<float> start(shape.rows, NAN);
                if (shape.accumulate) start = residual;
                CUDA_CHECK(cudaMemcpy(out.as(), start.data(), start.size() * sizeof(float),
                                      cudaMemcpyHostToDevice));
                const Launch launch = prepare_launch(v, shape, properties.multiProcessorCount);
                run_variant(launch, out.as<float>(), weights.as(), shape, device_in.as<float>(),
                            norm_weight);
                std::vector<float> got(shape.rows);
                CUDA_CHECK(cudaMemcpy(got.data(), out.as(), got.size() * sizeof(float),
                                      cudaMemcpyDeviceToHost));
                const double error = relative_error(got, want);
                const bool pass = error <= kTolerance;
                failures += !pass;
                const double ms = milliseconds_per_call([&](int call) {
                    run_variant(launch, out.as<float>(),
                                weights.as<__half>() + (call % kWeightCopies) * elements, shape,
                                device_in.as<float>(), norm_weight);
                });
                const double gbps = elements * sizeof(__half) / ms / 1e6;
                std::printf("| %s | %s | %s %.1e | %.1f | %.0f | %.0f%% |\n", shape.name,
                            v.name.c_str(), pass ? "PASS" : "FAIL", error, ms * 1e3, gbps,
                            100 * gbps / copy_gbps);
                std::fflush(stdout);
            }
        }
        std::printf("\n%d check(s) failed\n", failures);
        return failures == 0 ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "matvec_variants: %s\n", e.what());
        return 2;
    }
}
