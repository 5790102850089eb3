// Converting a loaded model's matrices to another dtype in memory, as the converter would.
#include "weights/model_copy.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>

#include "util/error.h"
#include "weights/half.h"
#include "util/memory.h"

namespace barellm {

namespace {

// f32 -> bf16 bits, round to nearest even; NaN stays a quiet NaN (convert/dtypes.py).
uint16_t float_to_bf16(float value) {
    const uint32_t bits = float_to_bits(value);
    if (std::isnan(value)) return uint16_t((bits >> 16) | 0x0040);
    return uint16_t((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

// One row of Q8 as docs/FORMAT.md and convert/dtypes.py quantize_q8 define it: per group
// of kQ8Group columns, scale = f16(max |w| / 127), value = round(w / scale) (ties away
// from zero) clamped to [-127, 127]; a group whose f16 scale is 0 gets values 0.
// Returns false when a scale overflows f16.
bool quantize_row_q8(int8_t* values, uint16_t* scales, const float* row, int cols) {
    bool ok = true;
    for (int first = 0, g = 0; first < cols; first += kQ8Group, ++g) {
        const int last = std::min(cols, first + kQ8Group);
        float largest = 0.0f;
        for (int i = first; i < last; ++i) largest = std::max(largest, std::fabs(row[i]));
        const uint16_t scale_bits = float_to_half(largest / 127.0f);
        scales[g] = scale_bits;
        const float scale = half_to_float(scale_bits);
        if (!std::isfinite(scale)) ok = false;
        const bool usable = scale > 0.0f && std::isfinite(scale);
        for (int i = first; i < last; ++i) {
            const float rounded = usable ? std::round(row[i] / scale) : 0.0f;
            values[i] = int8_t(std::clamp(rounded, -127.0f, 127.0f));
        }
    }
    return ok;
}

size_t matrix_bytes(int rows, int cols, DType dtype) {
    return Matrix{nullptr, dtype, rows, cols, nullptr}.bytes();
}

class Copier {
public:
    Copier(ModelCopy& copy, DType dtype) : copy_(copy), dtype_(dtype) {}

    uint8_t* allocate(size_t bytes) {
        copy_.storage.emplace_back(new uint8_t[std::max<size_t>(bytes, 1)]);
        return copy_.storage.back().get();
    }

    // A norm weight or a bias (f32 in every copy); nullptr stays nullptr.
    const float* norm(const float* source, int dim) {
        if (!source) return nullptr;
        float* target = reinterpret_cast<float*>(allocate(dim * sizeof(float)));
        std::copy(source, source + dim, target);
        return target;
    }

    Matrix matrix(const Matrix& source, const std::string& name) {
        Matrix m{nullptr, dtype_, source.rows, source.cols, nullptr};
        const size_t value_bytes = size_t(m.rows) * m.cols * dtype_size(dtype_);
        uint8_t* data = allocate(value_bytes);
        m.data = data;
        uint16_t* scales = nullptr;
        if (dtype_ == DType::Q8_0) {
            scales = reinterpret_cast<uint16_t*>(allocate(size_t(m.rows) * m.q8_groups() * 2));
            m.scales = scales;
        }
        std::atomic<bool> overflow{false};
#pragma omp parallel
        {
            std::vector<float> row(m.cols);
#pragma omp for schedule(static)
            for (int r = 0; r < m.rows; ++r) {
                matrix_row_to_float(row.data(), source, r);
                const size_t first = size_t(r) * m.cols;
                switch (dtype_) {
                    case DType::F32:
                        std::memcpy(reinterpret_cast<float*>(data) + first, row.data(),
                                    m.cols * sizeof(float));
                        break;
                    case DType::F16:
                        for (int i = 0; i < m.cols; ++i)
                            reinterpret_cast<uint16_t*>(data)[first + i] = float_to_half(row[i]);
                        break;
                    case DType::BF16:
                        for (int i = 0; i < m.cols; ++i)
                            reinterpret_cast<uint16_t*>(data)[first + i] = float_to_bf16(row[i]);
                        break;
                    default:  // Q4_0 and the block types: refused by copy_model
                        break;
                    case DType::Q8_0:
                        if (!quantize_row_q8(reinterpret_cast<int8_t*>(data) + first,
                                             scales + size_t(r) * m.q8_groups(), row.data(),
                                             m.cols))
                            overflow = true;
                        break;
                }
            }
        }
        if (overflow)
            throw Error("tensor '" + name +
                        "' has values beyond the Q8 range (a scale overflows f16)");
        return m;
    }

private:
    ModelCopy& copy_;
    DType dtype_;
};

}  // namespace

const char* weight_dtype_name(DType dtype) {
    // Q8 and Q4 matrices are I8 and U8 tensors plus scales; the other names are the tensor
    // dtypes'.
    if (dtype == DType::Q8_0) return "Q8";
    if (dtype == DType::Q4_0) return "Q4";
    return dtype_name(dtype);
}

size_t model_copy_bytes(const Model& source, DType dtype) {
    const Config& c = source.config;
    size_t bytes =
        matrix_bytes(c.vocab_size, c.dim, dtype) + size_t(c.dim) * sizeof(float);  // + final norm
    if (source.output.data != source.token_embedding.data)
        bytes += matrix_bytes(c.vocab_size, c.dim, dtype);
    for (const LayerWeights& w : source.layers)
        for (const Matrix* m : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w1, &w.w3, &w.w2})
            bytes += matrix_bytes(m->rows, m->cols, dtype);
    // the norms, biases and q/k norms
    return bytes +
           source.layers.size() * (2 * size_t(c.dim) + layer_vector_floats(c)) * sizeof(float);
}

std::unique_ptr<ModelCopy> copy_model(const Model& source, DType dtype) {
    const char* name = weight_dtype_name(dtype);
    if (dtype == DType::Q4_0 || is_block_type(dtype))
        throw Error(std::string("in-memory ") + name +
                    " copies are not supported: convert the model to that type");
    require_memory(model_copy_bytes(source, dtype),
                   std::string("an in-memory ") + name + " copy of the weights");
    auto copy = std::make_unique<ModelCopy>();
    Model& m = copy->model;
    m.config = source.config;
    m.config.weight_dtype = name;
    Copier copier(*copy, dtype);
    m.token_embedding = copier.matrix(source.token_embedding, "token_embedding");
    for (size_t l = 0; l < source.layers.size(); ++l) {
        const LayerWeights& w = source.layers[l];
        const std::string prefix = "layers." + std::to_string(l) + ".";
        const int dim = source.config.dim;
        LayerWeights layer;
        layer.attn_norm = copier.norm(w.attn_norm, dim);
        layer.wq = copier.matrix(w.wq, prefix + "wq");
        layer.wk = copier.matrix(w.wk, prefix + "wk");
        layer.wv = copier.matrix(w.wv, prefix + "wv");
        layer.wo = copier.matrix(w.wo, prefix + "wo");
        const Config& c = source.config;
        layer.bq = copier.norm(w.bq, c.q_dim());
        layer.bk = copier.norm(w.bk, c.kv_dim());
        layer.bv = copier.norm(w.bv, c.kv_dim());
        layer.bo = copier.norm(w.bo, dim);
        layer.q_norm = copier.norm(w.q_norm, c.head_dim);
        layer.k_norm = copier.norm(w.k_norm, c.head_dim);
        layer.ffn_norm = copier.norm(w.ffn_norm, dim);
        layer.w1 = copier.matrix(w.w1, prefix + "w1");
        layer.w3 = copier.matrix(w.w3, prefix + "w3");
        layer.w2 = copier.matrix(w.w2, prefix + "w2");
        layer.post_attn_norm = copier.norm(w.post_attn_norm, dim);
        layer.post_ffn_norm = copier.norm(w.post_ffn_norm, dim);
        m.layers.push_back(layer);
    }
    m.final_norm = copier.norm(source.final_norm, source.config.dim);
    m.output = source.output.data == source.token_embedding.data
                   ? m.token_embedding
                   : copier.matrix(source.output, "output");
    return copy;
}

}  // namespace barellm
