// Read-only view of a safetensors file: the file is memory-mapped, the JSON
// header parsed and every tensor entry checked before anyone touches the data.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace barellm {

// The tensor and matrix types barellm reads. The first five are stored types: F32, F16,
// BF16, and Q8_0 and Q4_0 (docs/FORMAT.md), stored as safetensors' I8 tensors (int8 values)
// and U8 tensors (two 4-bit values a byte), each with its f16 scales in a tensor of its own;
// dtype_name gives the stored name ("I8", "U8"). The others are matrix types only: ggml's
// block types (weight_blocks.h), stored as U8 tensors of whole blocks, that a file's
// `barellm.matrix_types` names; dtype_name gives their ggml name ("Q4_K").
enum class DType {
    // clang-format off
    F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ4_NL,
    IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, MXFP4, TQ1_0, TQ2_0
    // clang-format on
};

const char* dtype_name(DType dtype);
size_t dtype_size(DType dtype);

struct TensorView {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;  // outermost first, as in the file
    const void* data;            // inside the mapping
    size_t bytes;
};

// Owns a read-only mmap of a whole file.
class MappedFile {
public:
    explicit MappedFile(const std::string& path);
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    // Hands the whole pages of [begin, begin + bytes) back to the system where they lie in
    // the mapping (a later read maps them from the file again); elsewhere does nothing.
    void release_pages(const void* begin, size_t bytes) const;

private:
    uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

class SafetensorsFile {
public:
    // Throws Error naming the file and the offending field or tensor.
    explicit SafetensorsFile(const std::string& path);

    const std::string& path() const { return path_; }
    const std::map<std::string, TensorView>& tensors() const { return tensors_; }
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    size_t file_size() const { return file_.size(); }
    void release_pages(const void* begin, size_t bytes) const { file_.release_pages(begin, bytes); }

    // The tensor named `name`, or an Error saying it is missing.
    const TensorView& tensor(const std::string& name) const;
    bool has_tensor(const std::string& name) const { return tensors_.count(name) != 0; }
    // The metadata string under `key`, or an Error saying it is missing.
    const std::string& metadata_value(const std::string& key) const;

private:
    std::string path_;
    MappedFile file_;
    std::map<std::string, TensorView> tensors_;
    std::map<std::string, std::string> metadata_;
};

}  // namespace barellm
