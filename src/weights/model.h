// The model's weights as views into the memory-mapped weight file, every
// tensor checked against the config before use.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "weights/config.h"
#include "weights/safetensors.h"
#include "weights/weight_blocks.h"

namespace barellm {

// Q8 matrices: int8 values in groups of kQ8Group consecutive columns of a row, each
// group with one f16 scale (docs/FORMAT.md).
constexpr int kQ8Group = 32;

// Q4 matrices (llama.cpp's Q4_0): blocks of kQ4Block consecutive columns of a row, each
// with one f16 scale d; a weight is d × (q - 8) with q in 0..15, two q per byte
// (docs/FORMAT.md). Only matrices whose column count is a multiple of kQ4Block are Q4.
constexpr int kQ4Block = 32;
constexpr int kQ4BlockBytes = kQ4Block / 2;
constexpr int kQ4Offset = 8;  // q - kQ4Offset is the signed value, -8..7

// q - 8 of column `col` of a Q4 row: byte j of a block holds column j in its low nibble
// and column j + 16 in its high nibble.
inline int q4_value(const uint8_t* row, int col) {
    const int j = col % kQ4Block;
    const uint8_t byte = row[(col / kQ4Block) * kQ4BlockBytes + j % kQ4BlockBytes];
    return (j < kQ4BlockBytes ? byte & 0x0f : byte >> 4) - kQ4Offset;
}

// Whether a matrix of this type is stored as integers with scales apart (Q8 or Q4); the
// block types (weight_blocks.h) keep their scales inside their blocks.
inline bool is_quantized(DType dtype) { return dtype == DType::Q8_0 || dtype == DType::Q4_0; }

// A row-major [rows, cols] weight matrix of its own type: F32, F16, BF16, I8 with `scales`
// [rows, q8_groups()] (Q8_0), U8 with `scales` [rows, q4_blocks()] (Q4_0: cols / 2 bytes a
// row), or a block type (cols / block_weights blocks a row, row after row).

struct Matrix {
    const void* data = nullptr;
    DType dtype = DType::F32;
    int rows = 0;
    int cols = 0;
    const uint16_t* scales = nullptr;  // f16, I8 and U8 only
    // Q8 and Q4 (I8, U8), IQ4_NL, MXFP4 and the super-block types (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
    // IQ4_XS) on the CPU backend's paths that read them so (cpu::uses_row_tiles): the same weights
    // in tiles of 16 rows (cpu/quantized_tiles.h, cpu/super_block_tiles.h), else nullptr.
    const uint8_t* row_tiles = nullptr;

    int q8_groups() const { return (cols + kQ8Group - 1) / kQ8Group; }
    int q4_blocks() const { return cols / kQ4Block; }
    // Bytes of one row's values (scales aside).
    size_t row_bytes() const {
        if (is_block_type(dtype)) return size_t(cols / block_weights(dtype)) * block_bytes(dtype);
        return dtype == DType::Q4_0 ? size_t(cols) / 2 : size_t(cols) * dtype_size(dtype);
    }
    // The start of row r's values (its blocks, for a block type).
    const uint8_t* row_data(int r) const {
        return static_cast<const uint8_t*>(data) + size_t(r) * row_bytes();
    }
    int scale_count_per_row() const {
        return dtype == DType::Q8_0 ? q8_groups() : dtype == DType::Q4_0 ? q4_blocks() : 0;
    }
    size_t bytes() const {
        return size_t(rows) * (row_bytes() + 2 * size_t(scale_count_per_row()));
    }
};

// The name of a matrix type in `barellm.matrix_types` and `info`: "F16", "Q8_0", "Q4_K".
std::string matrix_type_name(DType dtype);

// Row `row` of w as f32 (out[w.cols]), whatever its type.
void matrix_row_to_float(float* out, const Matrix& w, int row);

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
    const float* sinks = nullptr;   // [heads]                attention_sinks: each head's logit
    const float* ffn_norm;          // [dim]
    // A dense layer's feed-forward (empty in a sparse one):
    Matrix w1;  // [hidden_dim, dim]  gate
    Matrix w3;  // [hidden_dim, dim]  up
    Matrix w2;  // [dim, hidden_dim]  down
    // A sparse layer's (Config::is_sparse): the router, f32, and each expert's three matrices,
    // views of the file's stacked tensors (docs/FORMAT.md); empty in a dense layer.
    const float* router = nullptr;  // [experts, dim]
    std::vector<Matrix> expert_w1;  // [experts] of [moe_hidden_dim, dim]  gate
    std::vector<Matrix> expert_w3;  // [experts] of [moe_hidden_dim, dim]  up
    std::vector<Matrix> expert_w2;  // [experts] of [dim, moe_hidden_dim]  down
    // With expert_biases, f32: the router's bias and each expert's biases, expert e's at
    // e × moe_hidden_dim (b1, b3) or e × dim (b2); else nullptr.
    const float* router_bias = nullptr;  // [experts]
    const float* expert_b1 = nullptr;    // [experts * moe_hidden_dim]  gate
    const float* expert_b3 = nullptr;    // [experts * moe_hidden_dim]  up
    const float* expert_b2 = nullptr;    // [experts * dim]             down
    // Present only with post_norms (Gemma), f32: the RMSNorm weights of wo's and w2's outputs,
    // applied before the residual add.
    const float* post_attn_norm = nullptr;  // [dim]
    const float* post_ffn_norm = nullptr;   // [dim]
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

    // Every distinct matrix: the embedding, each layer's (its attention's four, then its dense
    // feed-forward's three or every expert's three), the output when untied.
    std::vector<const Matrix*> matrices() const;
    // The same with their names ("token_embedding", "layers.0.wq", an expert's
    // "layers.1.experts.w1[5]": expert 5's rows of the stacked tensor "layers.1.experts.w1").
    std::vector<std::pair<std::string, const Matrix*>> named_matrices() const;

    // Bytes of weights one decode step reads (every matrix once, embedding row aside; of a
    // sparse layer, the router and experts_per_token experts' matrices).
    size_t weight_bytes_per_token() const;
    size_t parameter_count() const;
    // The parameters one token computes with: parameter_count less the experts it is not
    // routed to (the same for a dense model).
    size_t active_parameter_count() const;
};

// Rows first_row .. first_row + rows - 1 of w as a matrix of its own (an expert's part of
// a stacked tensor).
Matrix matrix_rows(const Matrix& w, int first_row, int rows);

// Floats per layer of the optional biases, q/k norms, sinks and post norms the config asks for
// (the experts' biases aside).
size_t layer_vector_floats(const Config& config);
// Floats of a sparse layer's biases (expert_biases) with `experts_used` experts counted: the
// router's and those experts' b1, b3, b2.
size_t expert_bias_floats(const Config& config, int experts_used);

}  // namespace barellm
