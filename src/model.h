// The model's weights as views into the memory-mapped weight file, every
// tensor checked against the config before use.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "safetensors.h"

namespace barellm {

// A row-major [rows, cols] weight matrix stored in the file's dtype.
struct Matrix {
    const void* data = nullptr;
    DType dtype = DType::F32;
    int rows = 0;
    int cols = 0;
    size_t bytes() const { return size_t(rows) * cols * dtype_size(dtype); }
};

struct LayerWeights {
    const float* attn_norm;  // [dim]
    Matrix wq;               // [heads * head_dim, dim]
    Matrix wk;               // [kv_heads * head_dim, dim]
    Matrix wv;               // [kv_heads * head_dim, dim]
    Matrix wo;               // [dim, heads * head_dim]
    const float* ffn_norm;   // [dim]
    Matrix w1;               // [hidden_dim, dim]  gate
    Matrix w3;               // [hidden_dim, dim]  up
    Matrix w2;               // [dim, hidden_dim]  down
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

}  // namespace barellm
