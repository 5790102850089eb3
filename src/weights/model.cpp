// Loading a model (model.h): the weight file mapped, every tensor checked against the config.
#include "weights/model.h"

#include <cstring>
#include <map>
#include <optional>

#include "util/error.h"
#include "util/json.h"
#include "weights/half.h"

namespace barellm {

// The `barellm.matrix_types` names of the types a matrix can have.
std::string matrix_type_name(DType dtype) {
    if (dtype == DType::Q8_0) return "Q8_0";
    if (dtype == DType::Q4_0) return "Q4_0";
    return dtype_name(dtype);
}

std::optional<DType> matrix_type(const std::string& name) {
    for (DType dtype : {DType::F32,     DType::F16,    DType::BF16,  DType::Q8_0,    DType::Q4_0,
                        DType::Q4_1,    DType::Q5_0,   DType::Q5_1,  DType::Q2_K,    DType::Q3_K,
                        DType::Q4_K,    DType::Q5_K,   DType::Q6_K,  DType::IQ4_XS,  DType::IQ4_NL,
                        DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS, DType::IQ3_S,
                        DType::IQ1_S,   DType::IQ1_M,  DType::MXFP4, DType::TQ1_0,   DType::TQ2_0})
        if (name == matrix_type_name(dtype)) return dtype;
    return std::nullopt;
}

void matrix_row_to_float(float* out, const Matrix& w, int row) {
    if (is_block_type(w.dtype)) return dequantize_row(w.dtype, w.row_data(row), out, w.cols);
    const size_t first = size_t(row) * w.cols;
    switch (w.dtype) {
        case DType::F32:
            std::memcpy(out, static_cast<const float*>(w.data) + first, w.cols * sizeof(float));
            return;
        case DType::F16:
            for (int i = 0; i < w.cols; ++i)
                out[i] = half_to_float(static_cast<const uint16_t*>(w.data)[first + i]);
            return;
        case DType::BF16:
            for (int i = 0; i < w.cols; ++i)
                out[i] = bf16_to_float(static_cast<const uint16_t*>(w.data)[first + i]);
            return;
        case DType::Q8_0: {
            const int8_t* values = static_cast<const int8_t*>(w.data) + first;
            const uint16_t* scales = w.scales + size_t(row) * w.q8_groups();
            for (int i = 0; i < w.cols; ++i)
                out[i] = values[i] * half_to_float(scales[i / kQ8Group]);
            return;
        }
        case DType::Q4_0: {
            const uint8_t* values = w.row_data(row);
            const uint16_t* scales = w.scales + size_t(row) * w.q4_blocks();
            for (int i = 0; i < w.cols; ++i)
                out[i] = q4_value(values, i) * half_to_float(scales[i / kQ4Block]);
            return;
        }
        default:
            return;
    }
}

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

// The type of each matrix. In a file of one weight type (weight_dtype F32, F16, BF16, Q8 or
// Q4) every matrix has it, except that with Q4 a matrix whose columns are not whole blocks
// is F16. In a file of mixed types (any other weight_dtype, the name of the mix) the
// metadata `barellm.matrix_types` names the type of every matrix, and of nothing else.
class MatrixTypes {
public:
    MatrixTypes(const SafetensorsFile& file, const Config& config) : path_(file.path()) {
        const std::string& name = config.weight_dtype;
        const auto listed = file.metadata().find("barellm.matrix_types");
        for (auto [uniform_name, dtype] : {std::pair{"F32", DType::F32},
                                           {"F16", DType::F16},
                                           {"BF16", DType::BF16},
                                           {"Q8", DType::Q8_0},
                                           {"Q4", DType::Q4_0}})
            if (name == uniform_name) uniform_ = dtype;
        if (uniform_) {
            if (listed != file.metadata().end())
                throw Error(path_ + ": barellm.matrix_types is present but weight_dtype " + name +
                            " says every matrix has one type");
            return;
        }
        if (listed == file.metadata().end())
            throw Error(path_ + ": weight_dtype " + quoted_excerpt(name) +
                        " is not one type (F32, F16, BF16, Q8, Q4) and the file has no "
                        "barellm.matrix_types");
        const nlohmann::json types = parse_json(listed->second, path_ + ": barellm.matrix_types");
        if (!types.is_object()) throw Error(path_ + ": barellm.matrix_types is not a JSON object");
        for (const auto& [matrix, type] : types.items()) {
            const std::optional<DType> dtype =
                type.is_string() ? matrix_type(type.get<std::string>()) : std::nullopt;
            if (!dtype)
                throw Error(path_ + ": barellm.matrix_types gives " + quoted_excerpt(matrix) +
                            " the type " + json_excerpt(type) + ", which barellm does not run");
            listed_[matrix] = *dtype;
        }
    }

    // The type of matrix `name`, of `cols` columns.
    DType of(const std::string& name, int cols) {
        if (uniform_)
            return *uniform_ == DType::Q4_0 && cols % kQ4Block != 0 ? DType::F16 : *uniform_;
        const auto found = listed_.find(name);
        if (found == listed_.end())
            throw Error(path_ + ": barellm.matrix_types has no type for '" + name + "'");
        const DType dtype = found->second;
        listed_.erase(found);
        const int block = is_block_type(dtype)   ? block_weights(dtype)
                          : dtype == DType::Q4_0 ? kQ4Block
                                                 : 1;
        if (cols % block != 0)
            throw Error(path_ + ": matrix '" + name + "' has " + std::to_string(cols) +
                        " columns, not a multiple of the " + std::to_string(block) +
                        " weights of a " + matrix_type_name(dtype) + " block");
        return dtype;
    }

    // After every matrix has been asked for: refuses names that are not matrices.
    void check_nothing_left() const {
        if (!listed_.empty())
            throw Error(path_ + ": barellm.matrix_types names " +
                        quoted_excerpt(listed_.begin()->first) +
                        ", which is not a matrix of the model");
    }

private:
    std::string path_;
    std::optional<DType> uniform_;
    std::map<std::string, DType> listed_;  // the types not yet asked for
};

Matrix matrix(const SafetensorsFile& file, const std::string& name, int rows, int cols,
              MatrixTypes& types) {
    const DType dtype = types.of(name, cols);
    Matrix m{nullptr, dtype, rows, cols, nullptr};
    // Block types are stored as U8 tensors of whole blocks, [rows, row_bytes]; Q4_0 as U8
    // [rows, cols / 2]; the others one element per weight.
    const DType stored = is_block_type(dtype) ? DType::Q4_0 : dtype;
    const int64_t stored_cols =
        dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16 || dtype == DType::Q8_0
            ? cols
            : int64_t(m.row_bytes());
    m.data = checked_tensor(file, name, {rows, stored_cols}, stored).data;
    // The f16 fields of a block are read in place: the converter's order puts every U8
    // tensor (all of even length) before the I8 ones, so blocks start on even offsets.
    if (is_block_type(dtype) && reinterpret_cast<uintptr_t>(m.data) % alignof(uint16_t) != 0)
        throw Error(file.path() + ": tensor '" + name + "' starts at an odd offset");
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

}  // namespace

Matrix matrix_rows(const Matrix& w, int first_row, int rows) {
    Matrix part = w;
    part.data = w.row_data(first_row);
    part.rows = rows;
    if (w.scales) part.scales = w.scales + size_t(first_row) * w.scale_count_per_row();
    part.row_tiles = nullptr;
    return part;
}

size_t layer_vector_floats(const Config& c) {
    return (c.qkv_bias ? size_t(c.q_dim()) + 2 * size_t(c.kv_dim()) : 0) +
           (c.o_bias ? size_t(c.dim) : 0) + (c.qk_norm ? 2 * size_t(c.head_dim) : 0) +
           (c.attention_sinks ? size_t(c.heads) : 0) + (c.post_norms ? 2 * size_t(c.dim) : 0);
}

size_t expert_bias_floats(const Config& c, int experts_used) {
    if (!c.expert_biases) return 0;
    return c.experts + size_t(experts_used) * (2 * size_t(c.moe_hidden_dim) + c.dim);
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
    MatrixTypes dtype(file, c);

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
        if (c.attention_sinks) layer.sinks = f32_vector(file, prefix + "sinks", c.heads);
        layer.ffn_norm = f32_vector(file, prefix + "ffn_norm", c.dim);
        if (c.is_sparse(l)) {
            layer.router = static_cast<const float*>(
                checked_tensor(file, prefix + "router", {c.experts, c.dim}, DType::F32).data);
            // Expert e's rows of each stacked matrix: e × moe_hidden_dim on for w1 and w3,
            // e × dim on for w2.
            const int E = c.experts, H = c.moe_hidden_dim;
            const Matrix w1 = matrix(file, prefix + "experts.w1", E * H, c.dim, dtype);
            const Matrix w3 = matrix(file, prefix + "experts.w3", E * H, c.dim, dtype);
            const Matrix w2 = matrix(file, prefix + "experts.w2", E * c.dim, H, dtype);
            for (int e = 0; e < E; ++e) {
                layer.expert_w1.push_back(matrix_rows(w1, e * H, H));
                layer.expert_w3.push_back(matrix_rows(w3, e * H, H));
                layer.expert_w2.push_back(matrix_rows(w2, e * c.dim, c.dim));
            }
            if (c.expert_biases) {
                layer.router_bias = f32_vector(file, prefix + "router_bias", E);
                layer.expert_b1 = f32_vector(file, prefix + "experts.b1", E * H);
                layer.expert_b3 = f32_vector(file, prefix + "experts.b3", E * H);
                layer.expert_b2 = f32_vector(file, prefix + "experts.b2", E * c.dim);
            }
        } else {
            layer.w1 = matrix(file, prefix + "w1", c.hidden_dim, c.dim, dtype);
            layer.w3 = matrix(file, prefix + "w3", c.hidden_dim, c.dim, dtype);
            layer.w2 = matrix(file, prefix + "w2", c.dim, c.hidden_dim, dtype);
        }
        if (c.post_norms) {
            layer.post_attn_norm = f32_vector(file, prefix + "post_attn_norm", c.dim);
            layer.post_ffn_norm = f32_vector(file, prefix + "post_ffn_norm", c.dim);
        }
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
    dtype.check_nothing_left();
    const size_t vectors_per_layer = 2 + (c.qkv_bias ? 3 : 0) + (c.o_bias ? 1 : 0) +
                                     (c.qk_norm ? 2 : 0) + (c.attention_sinks ? 1 : 0) +
                                     (c.post_norms ? 2 : 0);  // norms, biases, sinks
    size_t expected_tensors = 1 + vectors_per_layer * size_t(c.layers);
    for (const Matrix* m : model.matrices()) expected_tensors += m->scales ? 2 : 1;
    // A sparse layer's tensors are its router and three stacked ones, not one per expert.
    for (int l = 0; l < c.layers; ++l) {
        if (!c.is_sparse(l)) continue;
        const LayerWeights& layer = model.layers[l];
        expected_tensors += c.expert_biases ? 5 : 1;  // the router (its bias, the experts')
        for (const Matrix* first : {&layer.expert_w1[0], &layer.expert_w3[0], &layer.expert_w2[0]})
            expected_tensors -= (first->scales ? 2 : 1) * (size_t(c.experts) - 1);
    }
    if (file.tensors().size() != expected_tensors)
        throw Error(path + ": holds " + std::to_string(file.tensors().size()) +
                    " tensors, the config needs " + std::to_string(expected_tensors));
    return model;
}

std::vector<const Matrix*> Model::matrices() const {
    std::vector<const Matrix*> all;
    for (const auto& named : named_matrices()) all.push_back(named.second);
    return all;
}

std::vector<std::pair<std::string, const Matrix*>> Model::named_matrices() const {
    std::vector<std::pair<std::string, const Matrix*>> all = {
        {"token_embedding", &token_embedding}};
    for (size_t l = 0; l < layers.size(); ++l) {
        const LayerWeights& layer = layers[l];
        const std::string prefix = "layers." + std::to_string(l) + ".";
        for (const auto& [name, m] :
             {std::pair{"wq", &layer.wq}, {"wk", &layer.wk}, {"wv", &layer.wv}, {"wo", &layer.wo}})
            all.emplace_back(prefix + name, m);
        if (config.is_sparse(int(l))) {
            for (const auto& [name, experts] : {std::pair{"experts.w1", &layer.expert_w1},
                                                {"experts.w3", &layer.expert_w3},
                                                {"experts.w2", &layer.expert_w2}})
                for (size_t e = 0; e < experts->size(); ++e)
                    all.emplace_back(prefix + name + "[" + std::to_string(e) + "]", &(*experts)[e]);
        } else {
            for (const auto& [name, m] :
                 {std::pair{"w1", &layer.w1}, {"w3", &layer.w3}, {"w2", &layer.w2}})
                all.emplace_back(prefix + name, m);
        }
    }
    if (!config.tied_embeddings) all.emplace_back("output", &output);
    return all;
}

size_t Model::weight_bytes_per_token() const {
    const Config& c = config;
    size_t bytes = output.bytes() + size_t(c.dim) * sizeof(float);  // + final norm
    for (size_t l = 0; l < layers.size(); ++l) {
        const LayerWeights& layer = layers[l];
        bytes += layer.wq.bytes() + layer.wk.bytes() + layer.wv.bytes() + layer.wo.bytes() +
                 2 * size_t(c.dim) * sizeof(float);
        if (c.is_sparse(int(l)))  // the router and k experts (all of one size)
            bytes += size_t(c.experts) * c.dim * sizeof(float) +
                     size_t(c.experts_per_token) *
                         (layer.expert_w1[0].bytes() + layer.expert_w3[0].bytes() +
                          layer.expert_w2[0].bytes()) +
                     expert_bias_floats(c, c.experts_per_token) * sizeof(float);
        else
            bytes += layer.w1.bytes() + layer.w3.bytes() + layer.w2.bytes();
    }
    return bytes + layer_vector_floats(c) * layers.size() * sizeof(float);
}

namespace {

// The parameters of the model with `experts_used` experts of each sparse layer counted.
size_t parameters(const Config& c, int experts_used) {
    const size_t attention = 2 * size_t(c.dim) * c.q_dim() + 2 * size_t(c.dim) * c.kv_dim() +
                             2 * size_t(c.dim) + layer_vector_floats(c);
    size_t total = size_t(c.vocab_size) * c.dim * (c.tied_embeddings ? 1 : 2) + c.dim;
    for (int l = 0; l < c.layers; ++l)
        total +=
            attention + (c.is_sparse(l) ? size_t(c.experts) * c.dim +
                                              size_t(experts_used) * 3 * c.dim * c.moe_hidden_dim +
                                              expert_bias_floats(c, experts_used)
                                        : 3 * size_t(c.dim) * c.hidden_dim);
    return total;
}

}  // namespace

size_t Model::parameter_count() const { return parameters(config, config.experts); }

size_t Model::active_parameter_count() const {
    return parameters(config, config.experts_per_token);
}

}  // namespace barellm
