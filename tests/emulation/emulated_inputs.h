// Inputs of the emulated kernel tests (test_emulated_*.cpp): rows of f32, f16 or bf16 as the
// CUDA kernels read them (16-byte aligned, each row padded with zeros to a 16-byte pitch),
// with the exact values they decode to (emulated_gemm.h: the GEMM tests' comparison).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "cuda_emulation.h"
#include "weights/half.h"
#include "kernels.h"  // padded_cols
#include "weights/safetensors.h"
#include "test_matrices.h"

namespace barellm::test {

// `value` rounded to nearest even in the 16-bit format `dtype` (f16 or bf16).
inline uint16_t to_16bit(DType dtype, float value) {
    return dtype == DType::F16 ? float_to_half(value) : __float2bfloat16_rn(value).bits;
}

inline float from_16bit(DType dtype, uint16_t bits) {
    return dtype == DType::F16 ? half_to_float(bits) : bf16_to_float(bits);
}

// `count` elements of T in 16-byte aligned storage.
template <typename T>
class AlignedArray {
public:
    explicit AlignedArray(size_t count, T fill = T{})
        : storage_((count * sizeof(T) + sizeof(uint4) - 1) / sizeof(uint4)), count_(count) {
        for (size_t i = 0; i < count; ++i) data()[i] = fill;
    }
    T* data() { return reinterpret_cast<T*>(storage_.data()); }
    const T* data() const { return reinterpret_cast<const T*>(storage_.data()); }
    T& operator[](size_t i) { return data()[i]; }
    const T& operator[](size_t i) const { return data()[i]; }
    size_t size() const { return count_; }

private:
    std::vector<uint4> storage_;
    size_t count_;
};

// The memory of a vector or an AlignedArray, for an EarlyLaunchCheck (what the kernels ahead
// of a launch wrote).
template <typename Container>
cuda::emulation::MemoryRegion region_of(Container& c) {
    return {c.data(), c.size() * sizeof(*c.data())};
}

// rows x cols random non-zero values stored as `dtype` with pitch padded_cols(cols, dtype)
// (columns cols..pitch-1 zero).
struct PaddedRows {
    DType dtype;
    int rows, cols, pitch;
    AlignedArray<uint8_t> bytes;
    std::vector<double> values;  // [rows, cols]: what the stored elements decode to

    PaddedRows(int rows_, int cols_, DType dtype_, std::mt19937& rng, float scale = 1.0f)
        : dtype(dtype_),
          rows(rows_),
          cols(cols_),
          pitch(cuda::padded_cols(cols_, dtype_)),
          bytes(size_t(rows_) * pitch * dtype_size(dtype_), 0),
          values(size_t(rows_) * cols_) {
        const std::vector<float> drawn = random_floats(values.size(), rng, scale);
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < cols; ++c) {
                const float v = drawn[size_t(r) * cols + c];
                const size_t e = size_t(r) * pitch + c;
                if (dtype == DType::F32) {
                    reinterpret_cast<float*>(bytes.data())[e] = v;
                    values[size_t(r) * cols + c] = v;
                } else {
                    const uint16_t bits = to_16bit(dtype, v);
                    reinterpret_cast<uint16_t*>(bytes.data())[e] = bits;
                    values[size_t(r) * cols + c] = from_16bit(dtype, bits);
                }
            }
    }
    void* data() { return bytes.data(); }
    double at(int r, int c) const { return values[size_t(r) * cols + c]; }
};

// Stored element i of a row of `dtype` (f32, f16 or bf16), decoded.
inline double stored_element(const void* row, DType dtype, int i) {
    if (dtype == DType::F32) return static_cast<const float*>(row)[i];
    return from_16bit(dtype, static_cast<const uint16_t*>(row)[i]);
}

// Elements of the cache rows outside first_row .. last_row (keys and values [context,
// kv_dim], filled with `sentinel` before the kernel ran) that no longer hold it: writes to rows
// the kernel must leave alone.
template <typename KvT>
int cache_writes_outside(const std::vector<KvT>& keys, const std::vector<KvT>& values,
                         const KvT& sentinel, int kv_dim, int first_row, int last_row) {
    int written = 0;
    for (size_t e = 0; e < keys.size(); ++e) {
        const int row = int(e / kv_dim);
        if (row >= first_row && row <= last_row) continue;
        written += std::memcmp(&keys[e], &sentinel, sizeof sentinel) != 0;
        written += std::memcmp(&values[e], &sentinel, sizeof sentinel) != 0;
    }
    return written;
}

// A RoPE table in barellm::rope_table's layout (head_dim / 2 inverse frequencies, then as
// many magnitudes) that exercises all of it: the last quarter of the pairs not rotated
// (frequency 0 and magnitude 1, a partial rotary_dim), the others at theta 10000 with
// LongRoPE's attention factor 1.19 as their magnitude.
inline std::vector<float> test_rope_table(int head_dim) {
    const int pairs = head_dim / 2, rotated = pairs - pairs / 4;
    constexpr float kAttentionFactor = 1.19f;
    std::vector<float> table(head_dim, 0.0f);
    for (int j = 0; j < pairs; ++j) {
        if (j < rotated) table[j] = float(std::pow(10000.0, -2.0 * j / (2 * rotated)));
        table[pairs + j] = j < rotated ? kAttentionFactor : 1.0f;
    }
    return table;
}

// (cos, sin) of pair j's rotation at `pos` by such a table, in double.
inline std::pair<double, double> rope_cos_sin_reference(const std::vector<float>& table, int j,
                                                        int pos) {
    const double angle = double(pos) * double(table[j]), magnitude = table[table.size() / 2 + j];
    return {std::cos(angle) * magnitude, std::sin(angle) * magnitude};
}

}  // namespace barellm::test
