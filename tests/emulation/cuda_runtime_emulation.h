// The part of the CUDA runtime's host API that the CUDA backend calls (kernels/forward.cu,
// ladder_forward.cu and the launch functions of kernels/*.cuh), on the CPU emulation
// (cuda_emulation.h, which includes this file): with it, `make emulated` builds the whole
// backend with g++ into build/emulated/ (barellm, dump_logits, step_logits), and --device
// cuda runs every kernel of a forward pass on the emulation. Definitions in
// cuda_runtime_emulation.cpp.
//
// - One emulated GPU. BARELLM_EMULATED_GPU="CAPABILITY:SMS" sets its compute capability
//   (75, 80, 86, 89 or 90; the launch rules and the shared memory per block follow it) and
//   its SM count (what grids sized to the GPU are sized to); default "80:3".
// - Device memory (1 GiB of it) is host memory of exactly the bytes asked for (aligned to
//   256 bytes, as cudaMalloc's; filled with 0xff, NaN as f32, f16 and bf16, as memory never
//   written), each allocation recorded: a copy or memset whose device side leaves the
//   allocations fails, as does a free of what was not allocated; under AddressSanitizer
//   (`make SAN=1`) so does a kernel that reads or writes past a buffer.
// - Streams run their work at once, in order, on the calling thread: a kernel launch runs the
//   grid before returning. A stream being captured (cudaStreamBeginCapture) records its
//   launches, asynchronous copies, memsets and event records instead, and the graph replays
//   them, with the arguments they were captured with. What CUDA refuses during a thread-local
//   capture fails here too: synchronous copies and memsets, allocations, frees, and
//   synchronising the captured stream.
// - A launch is checked as the GPU checks it: at most 1024 threads a block, and dynamic
//   shared memory within 48 KiB unless cudaFuncSetAttribute raised the kernel's allowance
//   (to at most the emulated GPU's opt-in limit). A refused call sets the error that
//   cudaGetLastError returns; a fault inside a kernel throws barellm::Error.
// - Programmatic dependent launches run as plain launches (every launch ends before the next
//   begins); clusters run as cuda_emulation.h's cluster launches.
#pragma once
#include <cstddef>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- Handles
struct CUgraph_st;
struct CUgraphExec_st;
struct CUevent_st;
using cudaGraph_t = CUgraph_st*;
using cudaGraphExec_t = CUgraphExec_st*;
using cudaEvent_t = CUevent_st*;

// ---- Enumerations, with the CUDA runtime's values
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
};
enum cudaDeviceAttr {
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2,
};
constexpr unsigned cudaStreamNonBlocking = 0x01;
enum cudaLaunchAttributeID {
    cudaLaunchAttributeClusterDimension = 4,
    cudaLaunchAttributeProgrammaticStreamSerialization = 5,
};

// ---- Structures (the fields the backend reads)
struct cudaDeviceProp {
    char name[256];
    int major, minor;
    int multiProcessorCount;
    size_t sharedMemPerBlock, sharedMemPerBlockOptin;
    size_t totalGlobalMem;
};
struct cudaFuncAttributes {
    int ptxVersion, binaryVersion;
    size_t sharedSizeBytes;
    int maxDynamicSharedSizeBytes;
};
union cudaLaunchAttributeValue {
    struct {
        unsigned x, y, z;
    } clusterDim;
    int programmaticStreamSerializationAllowed;
};
struct cudaLaunchAttribute {
    cudaLaunchAttributeID id;
    cudaLaunchAttributeValue val;
};
struct cudaLaunchConfig_t {
    dim3 gridDim, blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    cudaLaunchAttribute* attrs;
    unsigned numAttrs;
};

// ---- Functions. In a namespace of their own, so that a program that links both this
// emulation and the CUDA runtime (the unit tests, built with nvcc's objects) keeps the two
// apart.
namespace barellm::cuda::emulation::runtime {

cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorName(cudaError_t status);
const char* cudaGetErrorString(cudaError_t status);

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* properties, int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaDeviceSynchronize();

cudaError_t cudaMalloc(void** pointer, size_t bytes);
cudaError_t cudaFree(void* pointer);
cudaError_t cudaMallocHost(void** pointer, size_t bytes);
cudaError_t cudaFreeHost(void* pointer);
cudaError_t cudaMemcpy(void* to, const void* from, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* to, const void* from, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* to, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* to, int value, size_t bytes, cudaStream_t stream = nullptr);

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);

cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* milliseconds, cudaEvent_t start, cudaEvent_t end);

cudaError_t cudaFuncSetAttribute(const void* kernel, cudaFuncAttribute attribute, int value);
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attributes, const void* kernel);
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void* kernel,
                                                          int block_threads, size_t shared_bytes);
cudaError_t cudaOccupancyMaxActiveClusters(int* clusters, const void* kernel,
                                           const cudaLaunchConfig_t* config);

template <typename Kernel>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Kernel* kernel,
                                                          int block_threads, size_t shared_bytes) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        blocks, reinterpret_cast<const void*>(kernel), block_threads, shared_bytes);
}
template <typename Kernel>
cudaError_t cudaOccupancyMaxActiveClusters(int* clusters, Kernel* kernel,
                                           const cudaLaunchConfig_t* config) {
    return cudaOccupancyMaxActiveClusters(clusters, reinterpret_cast<const void*>(kernel), config);
}

}  // namespace barellm::cuda::emulation::runtime

namespace barellm::cuda::emulation {

// The cluster shape config's attributes ask for (1 x 1 x 1 without one).
dim3 cluster_dimension(const cudaLaunchConfig_t& config);
// Runs `work` on `stream` (the section above: now, or into the graph being captured).
void enqueue(cudaStream_t stream, std::function<void()> work);
// Whether a launch of `kernel` with this shape may run (the checks above); if not, records
// the launch error and returns false.
bool check_launch(const void* kernel, dim3 block, size_t dynamic_shared_bytes);

}  // namespace barellm::cuda::emulation

namespace barellm::cuda::emulation::runtime {

// kernel(args...) on config's grid, as a launch of the CUDA runtime (clusters from the
// cluster attribute); the arguments are converted to the kernel's parameter types and kept
// for a captured graph's replays.
template <typename... Params, typename... Args>
cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* config, void (*kernel)(Params...),
                               Args&&... args) {
    const dim3 cluster = barellm::cuda::emulation::cluster_dimension(*config);
    if (!barellm::cuda::emulation::check_launch(reinterpret_cast<const void*>(kernel),
                                                config->blockDim, config->dynamicSmemBytes))
        return cudaPeekAtLastError();
    const dim3 grid = config->gridDim, block = config->blockDim;
    const size_t shared = config->dynamicSmemBytes;
    barellm::cuda::emulation::enqueue(
        config->stream, [=, params = std::tuple<std::decay_t<Params>...>(
                                static_cast<Params>(std::forward<Args>(args))...)] {
            barellm::cuda::emulation::run_grid(grid, cluster, block, shared,
                                               [&] { std::apply(kernel, params); });
        });
    return cudaSuccess;
}

}  // namespace barellm::cuda::emulation::runtime

using namespace barellm::cuda::emulation::runtime;  // the host code calls them as CUDA's
