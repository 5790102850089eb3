// The model's weights as views into the memory-mapped weight file, every
// tensor checked against the config before use.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "safetensors.h"

namespace barellm {

// Q8 matrices: int8 values in groups of kQ8Group consecutive columns of a row, each
// group with one f16 scale (docs/FORMAT.md).
constexpr int kQ8Group = 32;

// A row-major [rows, cols] weight matrix stored in the file's dtype: F32, F16, BF16,
// or I8 with `scales` [rows, q8_groups()] (the Q8 format).
struct Matrix {
    const void* data = nullptr;
    DType dtype = DType::F32;
    int rows = 0;
    int cols = 0;
    const uint16_t* scales = nullptr;  // f16 [rows, q8_groups()], I8 only

    int q8_groups() const { return (cols + kQ8Group - 1) / kQ8Group; }
    size_t bytes() const {
        const size_t scale_bytes = dtype == DType::I8 ? size_t(rows) * q8_groups() * 2 : 0;
        return size_t(rows) * cols * dtype_size(dtype) + scale_bytes;
    }
};

struct LayerWeights {
    const float* attn_norm;  // [dim]
    Matrix wq;               // [heads * head_dim, dim]
    Matrix wk;               // [kv_heads * head_dim, dim]
    Matrix wv;               // [kv_heads * head_dim, dim]
    Matrix wo;               // [dim, heads * head_dim]
    // Present only where the config says so (else nullptr), all f32:
    const float* bq = nullptr;      // [heads * head_dim]     qkv_bias
    const float* bk = nullptr;      // [kv_heads * head_dim]  qkv_bias
    const float* bv = nullptr;      // [kv_heads * head_dim]  qkv_bias
    const float* bo = nullptr;      // [dim]                  o_bias
    const float* q_norm = nullptr;  // [head_dim]             qk_norm
    const float* k_norm = nullptr;  // [head_dim]             qk_norm
    const float* ffn_norm;          // [dim]
    Matrix w1;                      // [hidden_dim, dim]  gate
    Matrix w3;                      // [hidden_dim, dim]  up
    Matrix w2;                      // [dim, hidden_dim]  down
};

struct Model {
    std::unique_ptr<SafetensorsFile> file;
    Config config;
    Matrix token_embedding;  // [vocab_size, dim]
    std::vector<LayerWeights> layers;
    const float* final_norm;  // [dim]
    Matrix output;            // [vocab_size, dim]; the embedding when tied

    // Maps and validates a converted weight file; throws Error naming the problem.
    static Model load(const std::string& path);

    // Bytes of weights one decode step reads (every matrix once, embedding row aside).
    size_t weight_bytes_per_token() const;
    size_t parameter_count() const;
};

// Floats per layer of the optional biases and q/k norms the config asks for.
size_t layer_vector_floats(const Config& config);

}  // namespace barellm
