// Mapping a safetensors file and checking its header (safetensors.h).
#include "weights/safetensors.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "util/error.h"
#include "util/files.h"
#include "util/json.h"

namespace barellm {

namespace {

constexpr size_t kHeaderLengthBytes = 8;
// The reference safetensors implementation refuses headers above 100 MB.
constexpr uint64_t kMaxHeaderBytes = 100u * 1000 * 1000;
constexpr int kMaxDims = 8;

bool parse_dtype(const std::string& name, DType* dtype) {
    if (name == "F32")
        *dtype = DType::F32;
    else if (name == "F16")
        *dtype = DType::F16;
    else if (name == "BF16")
        *dtype = DType::BF16;
    else if (name == "I8")
        *dtype = DType::Q8_0;
    else if (name == "U8")
        *dtype = DType::Q4_0;
    else
        return false;
    return true;
}

// Element count times element size, or an error when it overflows.
size_t checked_byte_count(const std::vector<int64_t>& shape, size_t element_size,
                          const std::string& where) {
    size_t count = element_size;
    for (int64_t dim : shape) {
        if (dim != 0 && count > SIZE_MAX / size_t(dim))
            throw Error(where + ": shape is too large (size overflows)");
        count *= size_t(dim);
    }
    return count;
}

}  // namespace

const char* dtype_name(DType dtype) {
    switch (dtype) {
        case DType::F32:
            return "F32";
        case DType::F16:
            return "F16";
        case DType::BF16:
            return "BF16";
        case DType::Q8_0:
            return "I8";
        case DType::Q4_0:
            return "U8";
        case DType::Q4_1:
            return "Q4_1";
        case DType::Q5_0:
            return "Q5_0";
        case DType::Q5_1:
            return "Q5_1";
        case DType::Q2_K:
            return "Q2_K";
        case DType::Q3_K:
            return "Q3_K";
        case DType::Q4_K:
            return "Q4_K";
        case DType::Q5_K:
            return "Q5_K";
        case DType::Q6_K:
            return "Q6_K";
        case DType::IQ4_XS:
            return "IQ4_XS";
        case DType::IQ4_NL:
            return "IQ4_NL";
        case DType::IQ2_XXS:
            return "IQ2_XXS";
        case DType::IQ2_XS:
            return "IQ2_XS";
        case DType::IQ2_S:
            return "IQ2_S";
        case DType::IQ3_XXS:
            return "IQ3_XXS";
        case DType::IQ3_S:
            return "IQ3_S";
        case DType::IQ1_S:
            return "IQ1_S";
        case DType::IQ1_M:
            return "IQ1_M";
        case DType::MXFP4:
            return "MXFP4";
        case DType::TQ1_0:
            return "TQ1_0";
        case DType::TQ2_0:
            return "TQ2_0";
    }
    return "?";
}

size_t dtype_size(DType dtype) {
    switch (dtype) {
        case DType::F32:
            return 4;
        case DType::F16:
        case DType::BF16:
            return 2;
        default:  // Q8_0, Q4_0 and the block types: stored as bytes
            return 1;
    }
}

MappedFile::MappedFile(const std::string& path) {
    const int fd = open_regular_file(path, &size_);
    if (size_ > 0) {
        void* mapping = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (mapping == MAP_FAILED) {
            close(fd);
            throw Error(path + ": cannot map: " + std::strerror(errno));
        }
        data_ = static_cast<uint8_t*>(mapping);
    }
    close(fd);
}

MappedFile::~MappedFile() {
    if (data_) munmap(data_, size_);
}

void MappedFile::release_pages(const void* begin, size_t bytes) const {
    const uintptr_t start = reinterpret_cast<uintptr_t>(begin);
    const uintptr_t mapping = reinterpret_cast<uintptr_t>(data_);
    if (!data_ || start < mapping || start + bytes > mapping + size_) return;
    const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
    const uintptr_t first = (start + page - 1) / page * page, last = (start + bytes) / page * page;
    // Advice only: where it is refused, the pages simply stay.
    if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), file_(path) {
    const size_t size = file_.size();
    if (size < kHeaderLengthBytes)
        throw Error(path + ": not a safetensors file (shorter than its 8-byte header length)");
    uint64_t header_bytes;
    std::memcpy(&header_bytes, file_.data(), sizeof header_bytes);  // little-endian host
    if (header_bytes < 2 || header_bytes > kMaxHeaderBytes ||
        header_bytes > size - kHeaderLengthBytes)
        throw Error(path + ": not a safetensors file (header length " +
                    std::to_string(header_bytes) + " does not fit the file size " +
                    std::to_string(size) + ")");
    const char* header_text = reinterpret_cast<const char*>(file_.data() + kHeaderLengthBytes);
    const nlohmann::json header =
        parse_json(std::string_view(header_text, header_bytes), path + ": safetensors header");
    if (!header.is_object())
        throw Error(path + ": not a safetensors file (header is not a JSON object)");

    const uint8_t* data_start = file_.data() + kHeaderLengthBytes + header_bytes;
    const size_t data_bytes = size - kHeaderLengthBytes - header_bytes;
    std::vector<std::pair<size_t, size_t>> ranges;  // [begin, end) of each tensor

    for (const auto& [name, entry] : header.items()) {
        if (name == "__metadata__") {
            if (!entry.is_object()) throw Error(path + ": __metadata__ is not an object");
            for (const auto& [key, value] : entry.items()) {
                if (!value.is_string())
                    throw Error(path + ": metadata " + quoted_excerpt(key) + " is not a string");
                metadata_[key] = value.get<std::string>();
            }
            continue;
        }
        const std::string where = path + ": tensor " + quoted_excerpt(name);
        if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
            !entry.contains("data_offsets"))
            throw Error(where + ": entry needs dtype, shape and data_offsets");
        TensorView view;
        view.name = name;
        if (!entry["dtype"].is_string() ||
            !parse_dtype(entry["dtype"].get<std::string>(), &view.dtype))
            throw Error(where + ": unsupported dtype " + json_excerpt(entry["dtype"]) +
                        " (barellm reads F32, F16, BF16, I8)");
        const auto& shape = entry["shape"];
        if (!shape.is_array() || shape.size() > size_t(kMaxDims))
            throw Error(where + ": shape is not an array of at most 8 dimensions");
        for (const auto& dim : shape) {
            if (!dim.is_number_integer() || dim.get<int64_t>() < 0)
                throw Error(where + ": shape " + json_excerpt(shape) + " has a bad dimension");
            view.shape.push_back(dim.get<int64_t>());
        }
        const auto& offsets = entry["data_offsets"];
        if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
            !offsets[1].is_number_unsigned())
            throw Error(where + ": data_offsets is not two non-negative integers");
        const uint64_t begin = offsets[0].get<uint64_t>();
        const uint64_t end = offsets[1].get<uint64_t>();
        if (begin > end || end > data_bytes)
            throw Error(where + ": data_offsets [" + std::to_string(begin) + ", " +
                        std::to_string(end) + "] lie outside the " + std::to_string(data_bytes) +
                        " data bytes (file truncated?)");
        view.bytes = checked_byte_count(view.shape, dtype_size(view.dtype), where);
        if (view.bytes != end - begin)
            throw Error(where + ": shape " + json_excerpt(shape) + " needs " +
                        std::to_string(view.bytes) + " bytes but data_offsets give " +
                        std::to_string(end - begin));
        view.data = data_start + begin;
        // Kernels read tensors through typed pointers: each must be naturally aligned.
        if (reinterpret_cast<uintptr_t>(view.data) % dtype_size(view.dtype) != 0)
            throw Error(where + ": data at file offset " +
                        std::to_string(kHeaderLengthBytes + header_bytes + begin) +
                        " is not aligned to its " + std::to_string(dtype_size(view.dtype)) +
                        "-byte elements (re-convert the model with convert/convert.py)");
        ranges.emplace_back(begin, end);
        tensors_.emplace(name, std::move(view));
    }

    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i)
        if (ranges[i].first < ranges[i - 1].second)
            throw Error(path + ": two tensors overlap at data offset " +
                        std::to_string(ranges[i].first));
}

const TensorView& SafetensorsFile::tensor(const std::string& name) const {
    auto found = tensors_.find(name);
    if (found == tensors_.end()) throw Error(path_ + ": tensor '" + name + "' is missing");
    return found->second;
}

const std::string& SafetensorsFile::metadata_value(const std::string& key) const {
    auto found = metadata_.find(key);
    if (found == metadata_.end()) throw Error(path_ + ": metadata '" + key + "' is missing");
    return found->second;
}

}  // namespace barellm
