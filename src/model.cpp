// Loading a model (model.h): the weight file mapped, every tensor checked against the config.
#include "model.h"

#include "error.h"
#include "json.h"

namespace barellm {

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
    std::string text = "[";
    for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
    return text + "]";
}

const TensorView& checked_tensor(const SafetensorsFile& file, const std::string& name,
                                 const std::vector<int64_t>& shape, DType dtype) {
    const TensorView& view = file.tensor(name);
    // The dtype first: the shape a quantized matrix is stored in depends on it.
    if (view.dtype != dtype)
        throw Error(file.path() + ": tensor '" + name + "' is " + dtype_name(view.dtype) +
                    ", expected " + dtype_name(dtype));
    if (view.shape != shape)
        throw Error(file.path() + ": tensor '" + name + "' has shape " + shape_text(view.shape) +
                    ", the config needs " + shape_text(shape));
    return view;
}

// The dtype a matrix of `cols` columns is stored in when the file's weight_dtype reads as
// `weights`: with Q4 (U8), a matrix whose columns are not whole blocks stays F16.
DType stored_dtype(DType weights, int cols) {
    return weights == DType::Q4_0 && cols % kQ4Block != 0 ? DType::F16 : weights;
}

Matrix matrix(const SafetensorsFile& file, const std::string& name, int rows, int cols,
              DType weights) {
    const DType dtype = stored_dtype(weights, cols);
    Matrix m{nullptr, dtype, rows, cols, nullptr};
    const int64_t stored_cols = dtype == DType::Q4_0 ? cols / 2 : cols;
    m.data = checked_tensor(file, name, {rows, stored_cols}, dtype).data;
    if (m.scale_count_per_row() > 0)
        m.scales = static_cast<const uint16_t*>(
            checked_tensor(file, name + ".scale", {rows, m.scale_count_per_row()}, DType::F16)
                .data);
    return m;
}

// A norm weight or a bias: always f32.
const float* f32_vector(const SafetensorsFile& file, const std::string& name, int dim) {
    return static_cast<const float*>(checked_tensor(file, name, {dim}, DType::F32).data);
}

DType weight_dtype(const Config& config, const std::string& path) {
    if (config.weight_dtype == "F32") return DType::F32;
    if (config.weight_dtype == "F16") return DType::F16;
    if (config.weight_dtype == "BF16") return DType::BF16;
    if (config.weight_dtype == "Q8") return DType::Q8_0;
    if (config.weight_dtype == "Q4") return DType::Q4_0;
    throw Error(path + ": weight_dtype " + quoted_excerpt(config.weight_dtype) +
                " is not supported");
}

}  // namespace

size_t layer_vector_floats(const Config& c) {
    return (c.qkv_bias ? size_t(c.q_dim()) + 2 * size_t(c.kv_dim()) : 0) +
           (c.o_bias ? size_t(c.dim) : 0) + (c.qk_norm ? 2 * size_t(c.head_dim) : 0);
}

Model Model::load(const std::string& path) {
    Model model;
    model.file = std::make_unique<SafetensorsFile>(path);
    const SafetensorsFile& file = *model.file;
    const auto& metadata = file.metadata();
    auto format = metadata.find("barellm.format");
    if (format == metadata.end())
        throw Error(path +
                    ": not a barellm weight file (no barellm.format metadata; convert it "
                    "with convert/convert.py)");
    if (format->second != "1")
        throw Error(path + ": barellm.format " + quoted_excerpt(format->second) +
                    " is not supported (expected 1)");
    model.config = Config::from_json(file.metadata_value("barellm.config"), path);
    const Config& c = model.config;
    const DType dtype = weight_dtype(c, path);

    model.token_embedding = matrix(file, "token_embedding", c.vocab_size, c.dim, dtype);
    for (int l = 0; l < c.layers; ++l) {
        const std::string prefix = "layers." + std::to_string(l) + ".";
        LayerWeights layer;
        layer.attn_norm = f32_vector(file, prefix + "attn_norm", c.dim);
        layer.wq = matrix(file, prefix + "wq", c.q_dim(), c.dim, dtype);
        layer.wk = matrix(file, prefix + "wk", c.kv_dim(), c.dim, dtype);
        layer.wv = matrix(file, prefix + "wv", c.kv_dim(), c.dim, dtype);
        layer.wo = matrix(file, prefix + "wo", c.dim, c.q_dim(), dtype);
        if (c.qkv_bias) {
            layer.bq = f32_vector(file, prefix + "bq", c.q_dim());
            layer.bk = f32_vector(file, prefix + "bk", c.kv_dim());
            layer.bv = f32_vector(file, prefix + "bv", c.kv_dim());
        }
        if (c.o_bias) layer.bo = f32_vector(file, prefix + "bo", c.dim);
        if (c.qk_norm) {
            layer.q_norm = f32_vector(file, prefix + "q_norm", c.head_dim);
            layer.k_norm = f32_vector(file, prefix + "k_norm", c.head_dim);
        }
        layer.ffn_norm = f32_vector(file, prefix + "ffn_norm", c.dim);
        layer.w1 = matrix(file, prefix + "w1", c.hidden_dim, c.dim, dtype);
        layer.w3 = matrix(file, prefix + "w3", c.hidden_dim, c.dim, dtype);
        layer.w2 = matrix(file, prefix + "w2", c.dim, c.hidden_dim, dtype);
        model.layers.push_back(layer);
    }
    model.final_norm = f32_vector(file, "final_norm", c.dim);
    if (c.tied_embeddings) {
        if (file.has_tensor("output"))
            throw Error(path + ": tensor 'output' present but the config says tied_embeddings");
        model.output = model.token_embedding;
    } else {
        model.output = matrix(file, "output", c.vocab_size, c.dim, dtype);
    }
    const size_t vectors_per_layer =
        2 + (c.qkv_bias ? 3 : 0) + (c.o_bias ? 1 : 0) + (c.qk_norm ? 2 : 0);  // norms and biases
    size_t expected_tensors = 1 + vectors_per_layer * size_t(c.layers);
    for (const Matrix* m : model.matrices()) expected_tensors += m->scales ? 2 : 1;
    if (file.tensors().size() != expected_tensors)
        throw Error(path + ": holds " + std::to_string(file.tensors().size()) +
                    " tensors, the config needs " + std::to_string(expected_tensors));
    return model;
}

std::vector<const Matrix*> Model::matrices() const {
    std::vector<const Matrix*> all = {&token_embedding};
    for (const LayerWeights& layer : layers)
        for (const Matrix* m :
             {&layer.wq, &layer.wk, &layer.wv, &layer.wo, &layer.w1, &layer.w3, &layer.w2})
            all.push_back(m);
    if (!config.tied_embeddings) all.push_back(&output);
    return all;
}

size_t Model::weight_bytes_per_token() const {
    size_t bytes = output.bytes() + size_t(config.dim) * sizeof(float);  // + final norm
    for (const LayerWeights& layer : layers)
        bytes += layer.wq.bytes() + layer.wk.bytes() + layer.wv.bytes() + layer.wo.bytes() +
                 layer.w1.bytes() + layer.w3.bytes() + layer.w2.bytes() +
                 2 * size_t(config.dim) * sizeof(float);
    return bytes + layer_vector_floats(config) * layers.size() * sizeof(float);
}

size_t Model::parameter_count() const {
    const Config& c = config;
    const size_t per_layer = 2 * size_t(c.dim) * c.q_dim() + 2 * size_t(c.dim) * c.kv_dim() +
                             3 * size_t(c.dim) * c.hidden_dim + 2 * size_t(c.dim) +
                             layer_vector_floats(c);
    const size_t embeddings = size_t(c.vocab_size) * c.dim * (c.tied_embeddings ? 1 : 2);
    return embeddings + per_layer * c.layers + c.dim;
}

}  // namespace barellm
