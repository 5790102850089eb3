// Owning handles for device and pinned host memory, and the upload of weight matrices (f32,
// f16, bf16, Q8, Q4) into the padded-row layout the kernels read (kernels.h: DeviceMatrix).
// Host code only.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cuda_check.h"
#include "kernels.h"
#include "weights/model.h"

namespace barellm::cuda {

inline std::string gib_text(size_t bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f GiB", bytes / double(size_t(1) << 30));
    return text;
}

// Where a CudaBuffer's memory comes from: device memory (cudaMalloc), or page-locked host
// memory (cudaMallocHost), the target of the asynchronous logits copy and the staging
// area of uploads.
struct DeviceMemory {
    static constexpr const char* kName = "GPU memory";
    static cudaError_t allocate(void** data, size_t bytes) { return cudaMalloc(data, bytes); }
    static void release(void* data) { cudaFree(data); }
};
struct PinnedHostMemory {
    static constexpr const char* kName = "pinned host memory";
    static cudaError_t allocate(void** data, size_t bytes) { return cudaMallocHost(data, bytes); }
    static void release(void* data) { cudaFreeHost(data); }
};

// Memory of `Memory`'s kind, freed on destruction; moves, never copies. `what` names it
// in the out-of-memory error.
template <typename Memory>
class CudaBuffer {
public:
    CudaBuffer() = default;
    CudaBuffer(size_t bytes, const std::string& what) : bytes_(bytes) {
        if (bytes == 0) return;
        const cudaError_t status = Memory::allocate(&data_, bytes);
        if (status != cudaSuccess) {
            cudaGetLastError();
            data_ = nullptr;
            throw Error("CUDA error: cannot allocate " + gib_text(bytes) + " of " + Memory::kName +
                        " for " + what + ": " + cudaGetErrorString(status));
        }
    }
    ~CudaBuffer() {
        if (data_) Memory::release(data_);
    }
    CudaBuffer(CudaBuffer&& other) noexcept
        : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
    CudaBuffer& operator=(CudaBuffer&& other) noexcept {
        std::swap(data_, other.data_);
        std::swap(bytes_, other.bytes_);
        return *this;
    }
    CudaBuffer(const CudaBuffer&) = delete;
    CudaBuffer& operator=(const CudaBuffer&) = delete;

    template <typename T = void>
    T* as() const {
        return static_cast<T*>(data_);
    }
    size_t bytes() const { return bytes_; }

private:
    void* data_ = nullptr;
    size_t bytes_ = 0;
};

using DeviceBuffer = CudaBuffer<DeviceMemory>;
using PinnedBuffer = CudaBuffer<PinnedHostMemory>;

// The device matrix `parts` stacked into (see upload_stacked), its data and scales unset.
inline DeviceMatrix stacked_shape(const std::vector<const Matrix*>& parts) {
    const Matrix& first = *parts.front();
    DeviceMatrix out;
    out.dtype = first.dtype;
    out.cols = first.cols;
    out.pitch = padded_cols(first.cols, first.dtype);
    for (const Matrix* part : parts) out.rows += part->rows;
    return out;
}

// Device bytes of `parts` stacked into one padded matrix (see upload_stacked).
inline size_t stacked_bytes(const std::vector<const Matrix*>& parts) {
    return stacked_shape(parts).bytes();
}

// Copies host matrices with equal cols and dtype into one device matrix whose rows are the
// rows of parts[0], then of parts[1], ... (how wq, wk and wv become one [q+k+v, dim] matrix),
// each row padded with zeros to padded_cols. Q8/Q4 matrices: the values of each row are
// padded the same way (a row's blocks belong to its part: rows never mix parts), and the
// scales of parts[0], parts[1], ... follow all values ([rows, blocks_per_row], 16-byte
// aligned; the file's per-row scale count is blocks_per_row). `memory` receives the
// allocation. The rows travel through `staging` (pinned) in chunks of whole rows.
inline DeviceMatrix upload_stacked(const std::vector<const Matrix*>& parts, DeviceBuffer& memory,
                                   PinnedBuffer& staging, const std::string& what) {
    const Matrix& first = *parts.front();
    DeviceMatrix out = stacked_shape(parts);
    for (const Matrix* part : parts) {
        if (part->cols != first.cols || part->dtype != first.dtype)
            throw Error("upload of " + what + ": stacked matrices differ in columns or dtype");
        if (is_quantized(part->dtype) &&
            (part->scales == nullptr || part->scale_count_per_row() != out.blocks_per_row()))
            throw Error("upload of " + what + ": its scales do not cover whole blocks of " +
                        std::to_string(kQuantizedBlock) + " columns");
    }
    memory = DeviceBuffer(out.bytes(), what);
    out.data = memory.as();

    const size_t source_row = first.row_bytes(), device_row = out.row_bytes();
    if (staging.bytes() < device_row)
        throw Error("upload of " + what + ": staging buffer too small");
    const size_t rows_per_chunk = staging.bytes() / device_row;
    uint8_t* device = memory.as<uint8_t>();
    for (const Matrix* part : parts) {
        const uint8_t* source = static_cast<const uint8_t*>(part->data);
        for (size_t row = 0; row < size_t(part->rows); row += rows_per_chunk) {
            const size_t rows = std::min(rows_per_chunk, size_t(part->rows) - row);
            uint8_t* chunk = staging.as<uint8_t>();
            if (source_row == device_row) {
                std::memcpy(chunk, source + row * source_row, rows * source_row);
            } else {
                for (size_t r = 0; r < rows; ++r) {
                    std::memcpy(chunk + r * device_row, source + (row + r) * source_row,
                                source_row);
                    std::memset(chunk + r * device_row + source_row, 0, device_row - source_row);
                }
            }
            CUDA_CHECK(cudaMemcpy(device, chunk, rows * device_row, cudaMemcpyHostToDevice));
            device += rows * device_row;
        }
    }
    if (is_quantized(out.dtype)) {  // device now points right after the values
        out.scales = reinterpret_cast<const uint16_t*>(device);
        for (const Matrix* part : parts) {
            const size_t bytes = size_t(part->rows) * out.blocks_per_row() * sizeof(uint16_t);
            CUDA_CHECK(cudaMemcpy(device, part->scales, bytes, cudaMemcpyHostToDevice));
            device += bytes;
        }
    }
    return out;
}

inline DeviceMatrix upload_matrix(const Matrix& m, DeviceBuffer& memory, PinnedBuffer& staging,
                                  const std::string& what) {
    return upload_stacked({&m}, memory, staging, what);
}

// Copies `count` floats from host to a new device buffer.
inline DeviceBuffer upload_floats(const float* values, size_t count, const std::string& what) {
    DeviceBuffer buffer(count * sizeof(float), what);
    CUDA_CHECK(cudaMemcpy(buffer.as(), values, count * sizeof(float), cudaMemcpyHostToDevice));
    return buffer;
}

}  // namespace barellm::cuda
