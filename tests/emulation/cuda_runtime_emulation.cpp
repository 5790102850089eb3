// The CUDA runtime's host API on the CPU emulation (cuda_runtime_emulation.h says what is
// emulated and what is checked).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda_emulation.h"
#include "util/error.h"

// The handles' objects.
struct CUstream_st {
    bool capturing = false;
    std::vector<std::function<void()>> captured;
};
struct CUgraph_st {
    std::vector<std::function<void()>> work;
};
struct CUgraphExec_st {
    std::vector<std::function<void()>> work;
};
struct CUevent_st {
    std::chrono::steady_clock::time_point at;
    bool recorded = false;
};

namespace barellm::cuda::emulation {
namespace {

constexpr size_t kKiB = 1024;
constexpr size_t kAllocationAlignment = 256;        // cudaMalloc's
constexpr unsigned char kUninitialisedByte = 0xff;  // NaN as f32, f16 and bf16
constexpr size_t kDefaultSharedBytes = 48 * kKiB;   // without cudaFuncSetAttribute
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr size_t kEmulatedMemoryBytes = size_t(1) << 30;
constexpr int kMaxBlocksPerMultiprocessor = 32;

// What a GPU of one compute capability offers, as NVIDIA's tables give it.
struct Architecture {
    int capability;
    size_t shared_per_block_optin;     // dynamic shared memory a block may opt in to
    size_t shared_per_multiprocessor;  // what an SM's blocks share
    int threads_per_multiprocessor;
};
constexpr Architecture kArchitectures[] = {{75, 64 * kKiB, 64 * kKiB, 1024},
                                           {80, 163 * kKiB, 164 * kKiB, 2048},
                                           {86, 99 * kKiB, 100 * kKiB, 1536},
                                           {89, 99 * kKiB, 100 * kKiB, 1536},
                                           {90, 227 * kKiB, 228 * kKiB, 2048}};

// The emulated GPU (BARELLM_EMULATED_GPU): its architecture and SM count.
struct EmulatedGpu : Architecture {
    int multiprocessors;
};

EmulatedGpu make_gpu() {
    int capability = 80, multiprocessors = 3;
    if (const char* setting = std::getenv("BARELLM_EMULATED_GPU")) {
        char rest = 0;
        if (std::sscanf(setting, "%d:%d%c", &capability, &multiprocessors, &rest) != 2 ||
            multiprocessors < 1)
            throw Error(std::string("BARELLM_EMULATED_GPU is '") + setting +
                        "': it takes CAPABILITY:SMS, e.g. 80:3");
    }
    for (const Architecture& architecture : kArchitectures)
        if (architecture.capability == capability) return {architecture, multiprocessors};
    throw Error("BARELLM_EMULATED_GPU: compute capability " + std::to_string(capability) +
                " is not one of 75, 80, 86, 89, 90");
}

const EmulatedGpu& gpu() {
    static const EmulatedGpu figures = make_gpu();
    return figures;
}

// The errors the emulated runtime returns: their names and texts, as CUDA's.
struct ErrorText {
    cudaError_t status;
    const char* name;
    const char* text;
};
constexpr ErrorText kErrorTexts[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
};

struct RuntimeState {
    cudaError_t last_error = cudaSuccess;
    std::map<const char*, size_t> device_allocations;  // start -> bytes
    size_t device_bytes = 0;
    std::map<const void*, std::unique_ptr<char[]>> pinned_allocations;
    std::map<const void*, int> shared_allowance;  // kernel -> dynamic shared bytes allowed
    int capturing_streams = 0;
};

RuntimeState& state() {
    static RuntimeState runtime;
    return runtime;
}

// The dynamic shared memory `kernel` may launch with (cudaFuncSetAttribute's, else 48 KiB).
size_t shared_allowance(const void* kernel) {
    const auto& allowance = state().shared_allowance;
    const auto found = allowance.find(kernel);
    return found != allowance.end() ? size_t(found->second) : kDefaultSharedBytes;
}

// The device memory an allocation of `bytes` takes: whole units of cudaMalloc's alignment.
size_t allocated_bytes(size_t bytes) {
    return (bytes + kAllocationAlignment - 1) / kAllocationAlignment * kAllocationAlignment;
}

cudaError_t fail(cudaError_t status) {
    state().last_error = status;
    return status;
}

// Whether [pointer, pointer + bytes) lies inside one device allocation.
bool inside_device_memory(const void* pointer, size_t bytes) {
    const auto& allocations = state().device_allocations;
    const char* p = static_cast<const char*>(pointer);
    auto after = allocations.upper_bound(p);
    if (after == allocations.begin()) return false;
    const auto& [start, size] = *std::prev(after);
    return p >= start && p + bytes <= start + size;
}

// Whether the device sides of a copy of `kind` lie in device memory.
bool copy_sides_valid(void* to, const void* from, size_t bytes, cudaMemcpyKind kind) {
    const bool to_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool from_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    return (!to_device || inside_device_memory(to, bytes)) &&
           (!from_device || inside_device_memory(from, bytes));
}

}  // namespace

void enqueue(cudaStream_t stream, std::function<void()> work) {
    if (stream != nullptr && stream->capturing)
        stream->captured.push_back(std::move(work));
    else
        work();
}

dim3 cluster_dimension(const cudaLaunchConfig_t& config) {
    dim3 cluster(1, 1, 1);
    for (unsigned i = 0; i < config.numAttrs; ++i)
        if (config.attrs[i].id == cudaLaunchAttributeClusterDimension) {
            const auto& dims = config.attrs[i].val.clusterDim;
            cluster = dim3(dims.x, dims.y, dims.z);
        }
    return cluster;
}

bool check_launch(const void* kernel, dim3 block, size_t dynamic_shared_bytes) {
    if (size_t(block.x) * block.y * block.z > kMaxThreadsPerBlock ||
        dynamic_shared_bytes > shared_allowance(kernel)) {
        fail(cudaErrorInvalidConfiguration);
        return false;
    }
    return true;
}

}  // namespace barellm::cuda::emulation

namespace barellm::cuda::emulation::runtime {

cudaError_t cudaGetLastError() {
    const cudaError_t status = state().last_error;
    state().last_error = cudaSuccess;
    return status;
}

cudaError_t cudaPeekAtLastError() { return state().last_error; }

const char* cudaGetErrorName(cudaError_t status) {
    for (const ErrorText& error : kErrorTexts)
        if (error.status == status) return error.name;
    return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t status) {
    for (const ErrorText& error : kErrorTexts)
        if (error.status == status) return error.text;
    return "unknown error";
}

cudaError_t cudaGetDeviceCount(int* count) {
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
    *device = 0;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    return device == 0 ? cudaSuccess : fail(cudaErrorInvalidValue);
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* properties, int device) {
    if (device != 0) return fail(cudaErrorInvalidValue);
    *properties = {};
    std::snprintf(properties->name, sizeof properties->name, "CUDA emulation (sm_%d, %d SMs)",
                  gpu().capability, gpu().multiprocessors);
    properties->major = gpu().capability / 10;
    properties->minor = gpu().capability % 10;
    properties->multiProcessorCount = gpu().multiprocessors;
    properties->sharedMemPerBlock = kDefaultSharedBytes;
    properties->sharedMemPerBlockOptin = gpu().shared_per_block_optin;
    properties->totalGlobalMem = kEmulatedMemoryBytes;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
    if (device != 0) return fail(cudaErrorInvalidValue);
    switch (attribute) {
        case cudaDevAttrMultiProcessorCount:
            *value = gpu().multiprocessors;
            return cudaSuccess;
        case cudaDevAttrComputeCapabilityMajor:
            *value = gpu().capability / 10;
            return cudaSuccess;
        case cudaDevAttrComputeCapabilityMinor:
            *value = gpu().capability % 10;
            return cudaSuccess;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin:
            *value = int(gpu().shared_per_block_optin);
            return cudaSuccess;
    }
    return fail(cudaErrorInvalidValue);
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    *total_bytes = kEmulatedMemoryBytes;
    *free_bytes = kEmulatedMemoryBytes - state().device_bytes;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaMalloc(void** pointer, size_t bytes) {
    RuntimeState& s = state();
    if (s.capturing_streams > 0) return fail(cudaErrorStreamCaptureUnsupported);
    const size_t rounded = allocated_bytes(bytes);
    if (rounded > kEmulatedMemoryBytes - s.device_bytes) return fail(cudaErrorMemoryAllocation);
    // The bytes asked for, no more: under AddressSanitizer a kernel that reads past them fails.
    void* memory = nullptr;
    if (posix_memalign(&memory, kAllocationAlignment, std::max<size_t>(bytes, 1)) != 0)
        return fail(cudaErrorMemoryAllocation);
    std::memset(memory, kUninitialisedByte, bytes);
    s.device_allocations[static_cast<const char*>(memory)] = bytes;
    s.device_bytes += rounded;
    *pointer = memory;
    return cudaSuccess;
}

cudaError_t cudaFree(void* pointer) {
    RuntimeState& s = state();
    if (s.capturing_streams > 0) return fail(cudaErrorStreamCaptureUnsupported);
    if (pointer == nullptr) return cudaSuccess;
    const auto found = s.device_allocations.find(static_cast<const char*>(pointer));
    if (found == s.device_allocations.end()) return fail(cudaErrorInvalidDevicePointer);
    s.device_bytes -= allocated_bytes(found->second);
    s.device_allocations.erase(found);
    std::free(pointer);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void** pointer, size_t bytes) {
    RuntimeState& s = state();
    if (s.capturing_streams > 0) return fail(cudaErrorStreamCaptureUnsupported);
    auto memory = std::make_unique<char[]>(bytes);
    *pointer = memory.get();
    s.pinned_allocations[memory.get()] = std::move(memory);
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void* pointer) {
    RuntimeState& s = state();
    if (s.capturing_streams > 0) return fail(cudaErrorStreamCaptureUnsupported);
    return s.pinned_allocations.erase(pointer) == 1 ? cudaSuccess : fail(cudaErrorInvalidValue);
}

cudaError_t cudaMemcpy(void* to, const void* from, size_t bytes, cudaMemcpyKind kind) {
    if (state().capturing_streams > 0) return fail(cudaErrorStreamCaptureUnsupported);
    return cudaMemcpyAsync(to, from, bytes, kind, nullptr);
}

cudaError_t cudaMemcpyAsync(void* to, const void* from, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
    if (!copy_sides_valid(to, from, bytes, kind)) return fail(cudaErrorInvalidValue);
    enqueue(stream, [=] { std::memmove(to, from, bytes); });
    return cudaSuccess;
}

cudaError_t cudaMemset(void* to, int value, size_t bytes) {
    if (state().capturing_streams > 0) return fail(cudaErrorStreamCaptureUnsupported);
    return cudaMemsetAsync(to, value, bytes, nullptr);
}

cudaError_t cudaMemsetAsync(void* to, int value, size_t bytes, cudaStream_t stream) {
    if (!inside_device_memory(to, bytes)) return fail(cudaErrorInvalidValue);
    enqueue(stream, [=] { std::memset(to, value, bytes); });
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned /*flags*/) {
    *stream = new CUstream_st;
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    if (stream != nullptr && stream->capturing) state().capturing_streams -= 1;
    delete stream;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    return stream != nullptr && stream->capturing ? fail(cudaErrorStreamCaptureUnsupported)
                                                  : cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode /*mode*/) {
    if (stream == nullptr || stream->capturing) return fail(cudaErrorInvalidValue);
    stream->capturing = true;
    stream->captured.clear();
    state().capturing_streams += 1;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
    if (stream == nullptr || !stream->capturing) return fail(cudaErrorInvalidValue);
    stream->capturing = false;
    state().capturing_streams -= 1;
    *graph = new CUgraph_st{std::move(stream->captured)};
    stream->captured.clear();
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long /*flags*/) {
    if (graph == nullptr) return fail(cudaErrorInvalidValue);
    *exec = new CUgraphExec_st{graph->work};
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
    if (exec == nullptr) return fail(cudaErrorInvalidResourceHandle);
    enqueue(stream, [exec] {
        for (const auto& work : exec->work) work();
    });
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    delete graph;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete exec;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
    *event = new CUevent_st;
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    delete event;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    enqueue(stream, [event] {
        event->at = std::chrono::steady_clock::now();
        event->recorded = true;
    });
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    return event->recorded ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventElapsedTime(float* milliseconds, cudaEvent_t start, cudaEvent_t end) {
    if (!start->recorded || !end->recorded) return fail(cudaErrorInvalidResourceHandle);
    *milliseconds = std::chrono::duration<float, std::milli>(end->at - start->at).count();
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* kernel, cudaFuncAttribute attribute, int value) {
    if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        size_t(value) > gpu().shared_per_block_optin)
        return fail(cudaErrorInvalidValue);
    state().shared_allowance[kernel] = value;
    return cudaSuccess;
}

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attributes, const void* kernel) {
    *attributes = {};
    attributes->ptxVersion = attributes->binaryVersion = gpu().capability;
    attributes->maxDynamicSharedSizeBytes = int(shared_allowance(kernel));
    return cudaSuccess;
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void* /*kernel*/,
                                                          int block_threads, size_t shared_bytes) {
    if (block_threads <= 0) return fail(cudaErrorInvalidValue);
    int fit =
        std::min(kMaxBlocksPerMultiprocessor, gpu().threads_per_multiprocessor / block_threads);
    if (shared_bytes > 0) fit = std::min(fit, int(gpu().shared_per_multiprocessor / shared_bytes));
    *blocks = fit;
    return cudaSuccess;
}

cudaError_t cudaOccupancyMaxActiveClusters(int* clusters, const void* kernel,
                                           const cudaLaunchConfig_t* config) {
    int per_multiprocessor = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_multiprocessor, kernel,
        int(config->blockDim.x * config->blockDim.y * config->blockDim.z),
        config->dynamicSmemBytes);
    const dim3 cluster = cluster_dimension(*config);
    *clusters = per_multiprocessor * gpu().multiprocessors / int(cluster.x * cluster.y * cluster.z);
    return cudaSuccess;
}

}  // namespace barellm::cuda::emulation::runtime
