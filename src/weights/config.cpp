// Reading and checking the model hyper-parameters stored in the weight file (config.h).
#include "weights/config.h"

#include <algorithm>
#include <cmath>

#include "tokenizer/tokenizer.h"  // Tokenizer::kMaxVocabSize
#include "util/error.h"
#include "util/json.h"

namespace barellm {

namespace {

using nlohmann::json;

// Sanity bounds: anything outside them is a corrupt or hostile file, not a model.
constexpr int kMaxDim = 1 << 16;
constexpr int kMaxLayers = 1024;
constexpr int kMaxContext = 1 << 24;

int read_int(const json& object, const char* key, const std::string& source, int lowest,
             int highest) {
    if (!object.contains(key) || !object[key].is_number_integer())
        throw Error(source + ": config field '" + key + "' is missing or not an integer");
    const int64_t value = object[key].get<int64_t>();
    if (value < lowest || value > highest)
        throw Error(source + ": config field '" + key + "' = " + std::to_string(value) +
                    " is outside [" + std::to_string(lowest) + ", " + std::to_string(highest) +
                    "]");
    return int(value);
}

// The model computes with the float: it must be positive and finite once narrowed
// (1e300 would become inf, 1e-300 zero).
float read_positive_float(const json& object, const char* key, const std::string& source) {
    if (!object.contains(key) || !object[key].is_number())
        throw Error(source + ": config field '" + key + "' is missing or not a number");
    const float value = float(object[key].get<double>());
    if (!(value > 0) || !std::isfinite(value))
        throw Error(source + ": config field '" + key + "' = " + object[key].dump() +
                    " is not a positive number within the float range");
    return value;
}

bool is_known_architecture(const json& value) {
    return value == "llama" || value == "qwen2" || value == "qwen3" || value == "gemma2" ||
           value == "gemma3" || value == "mixtral" || value == "qwen3_moe" || value == "phi3" ||
           value == "gpt_oss";
}

// A boolean field that is false when absent.
bool read_optional_bool(const json& object, const char* key, const std::string& source) {
    if (!object.contains(key)) return false;
    if (!object[key].is_boolean())
        throw Error(source + ": config field '" + key + "' is not a boolean");
    return object[key].get<bool>();
}

// A list of `count` positive finite floats (LongRoPE's factors of the rotated pairs).
std::vector<float> read_positive_floats(const json& object, const char* key, size_t count,
                                        const std::string& source) {
    if (!object.contains(key) || !object[key].is_array() || object[key].size() != count)
        throw Error(source + ": config field '" + key + "' is not a list of " +
                    std::to_string(count) + " numbers (one per rotated pair)");
    std::vector<float> values;
    for (const json& item : object[key]) {
        const float value = item.is_number() ? float(item.get<double>()) : 0.0f;
        if (!(value > 0) || !std::isfinite(value))
            throw Error(source + ": config field '" + key + "' holds " + json_excerpt(item) +
                        ", not a positive number within the float range");
        values.push_back(value);
    }
    return values;
}

RopeScaling read_rope_scaling(const json& config, int rotary_dim, const std::string& source) {
    RopeScaling scaling;
    if (!config.contains("rope_scaling") || config["rope_scaling"].is_null()) return scaling;
    const json& object = config["rope_scaling"];
    if (!object.is_object()) throw Error(source + ": config field 'rope_scaling' is not an object");
    std::string type;
    for (const char* key : {"rope_type", "type"})
        if (object.contains(key) && object[key].is_string()) type = object[key].get<std::string>();
    if (type == "default") return scaling;
    if (type == "linear") {
        scaling.kind = RopeScaling::Kind::Linear;
        scaling.factor = read_positive_float(object, "factor", source);
    } else if (type == "llama3") {
        scaling.kind = RopeScaling::Kind::Llama3;
        scaling.factor = read_positive_float(object, "factor", source);
        scaling.low_freq_factor = read_positive_float(object, "low_freq_factor", source);
        scaling.high_freq_factor = read_positive_float(object, "high_freq_factor", source);
        scaling.original_context =
            read_int(object, "original_max_position_embeddings", source, 1, kMaxContext);
        if (scaling.high_freq_factor <= scaling.low_freq_factor)
            throw Error(source + ": rope_scaling needs high_freq_factor > low_freq_factor");
    } else if (type == "longrope") {
        scaling.kind = RopeScaling::Kind::LongRope;
        scaling.short_factors =
            read_positive_floats(object, "short_factor", rotary_dim / 2, source);
        scaling.long_factors = read_positive_floats(object, "long_factor", rotary_dim / 2, source);
        scaling.original_context =
            read_int(object, "original_max_position_embeddings", source, 1, kMaxContext);
        scaling.attention_factor = read_positive_float(object, "attention_factor", source);
    } else if (type == "yarn") {
        scaling.kind = RopeScaling::Kind::Yarn;
        scaling.factor = read_positive_float(object, "factor", source);
        scaling.original_context =
            read_int(object, "original_max_position_embeddings", source, 1, kMaxContext);
        scaling.beta_fast = read_positive_float(object, "beta_fast", source);
        scaling.beta_slow = read_positive_float(object, "beta_slow", source);
        scaling.attention_factor = read_positive_float(object, "attention_factor", source);
        scaling.truncate =
            !object.contains("truncate") || read_optional_bool(object, "truncate", source);
    } else {
        throw Error(source + ": rope_scaling type " + quoted_excerpt(type) + " is not supported");
    }
    return scaling;
}

// YaRN's ramp over the rotated pairs' index: a pair turning `turns` times over the original
// context has the index rotary_dim · ln(original / (2π turns)) / (2 ln theta); pairs below
// `low` (beta_fast turns) keep their frequency, those past `high` (beta_slow turns) have it
// divided by `factor`, and between the two the weights of both ramp linearly (transformers'
// _compute_yarn_parameters).
struct YarnRamp {
    double low = 0, high = 1;
};

YarnRamp yarn_ramp(const RopeScaling& s, int rotary_dim, float theta) {
    const auto pair_of = [&](double turns) {
        return rotary_dim * std::log(s.original_context / (turns * 2 * M_PI)) /
               (2 * std::log(double(theta)));
    };
    YarnRamp ramp{pair_of(s.beta_fast), pair_of(s.beta_slow)};
    if (s.truncate) {
        ramp.low = std::floor(ramp.low);
        ramp.high = std::ceil(ramp.high);
    }
    ramp.low = std::max(ramp.low, 0.0);
    ramp.high = std::min(ramp.high, double(rotary_dim - 1));
    if (ramp.low == ramp.high) ramp.high += 0.001;  // transformers' guard against a width of 0
    return ramp;
}

// Every RoPE inverse frequency of a rotated pair in `table` (rope_table's layout) must be a
// positive finite float; `key` names the config field blamed when one is not.
void check_rope_table(const std::vector<float>& table, const Config& config, const char* key,
                      const std::string& source) {
    for (int j = 0; j < config.rotary_dim / 2; ++j)
        if (!(table[j] > 0) || !std::isfinite(table[j]))
            throw Error(source + ": config field '" + key + "' makes a RoPE frequency " +
                        (table[j] > 0 ? "overflow" : "round to 0") + " as a float");
}

// "layer_types": one "sliding" or "full" per layer, in place of sliding_window_first_layer.
void read_layer_types(const json& object, const std::string& source, Config* config) {
    const json& types = object["layer_types"];
    if (!types.is_array() || types.size() != size_t(config->layers))
        throw Error(source + ": config field 'layer_types' is not a list of " +
                    std::to_string(config->layers) + " layer types");
    if (object.contains("sliding_window_first_layer"))
        throw Error(source +
                    ": config fields 'layer_types' and 'sliding_window_first_layer' exclude "
                    "each other");
    for (const json& type : types) {
        if (type != "sliding" && type != "full")
            throw Error(source + ": config field 'layer_types' holds " + json_excerpt(type) +
                        ", not \"sliding\" or \"full\"");
        config->sliding_layers.push_back(type == "sliding");
    }
    if (config->sliding_window == 0 &&
        std::find(config->sliding_layers.begin(), config->sliding_layers.end(), true) !=
            config->sliding_layers.end())
        throw Error(source +
                    ": config field 'layer_types' has sliding layers but no sliding_window");
}

// The mixture-of-experts fields: experts, experts_per_token, moe_hidden_dim, norm_topk_prob and
// dense_layers (the indices of the layers that keep a dense feed-forward), all or none.
void read_experts(const json& object, const std::string& source, Config* config) {
    if (!object.contains("experts")) {
        for (const char* key : {"experts_per_token", "moe_hidden_dim", "norm_topk_prob",
                                "expert_biases", "dense_layers"})
            if (object.contains(key))
                throw Error(source + ": config field '" + key + "' needs 'experts'");
        return;
    }
    constexpr int kMaxExperts = 1024;
    config->experts = read_int(object, "experts", source, 1, kMaxExperts);
    config->experts_per_token = read_int(object, "experts_per_token", source, 1, config->experts);
    config->moe_hidden_dim = read_int(object, "moe_hidden_dim", source, 1, 4 * kMaxDim);
    config->norm_topk_prob = read_optional_bool(object, "norm_topk_prob", source);
    config->expert_biases = read_optional_bool(object, "expert_biases", source);
    if (!object.contains("dense_layers")) return;
    const json& dense = object["dense_layers"];
    if (!dense.is_array())
        throw Error(source + ": config field 'dense_layers' is not a list of layer indices");
    config->dense_layers.assign(config->layers, false);
    for (const json& layer : dense) {
        if (!layer.is_number_integer() || layer.get<int64_t>() < 0 ||
            layer.get<int64_t>() >= config->layers || config->dense_layers[layer.get<int>()])
            throw Error(source + ": config field 'dense_layers' holds " + json_excerpt(layer) +
                        ", not a layer index below " + std::to_string(config->layers) +
                        " given once");
        config->dense_layers[layer.get<int>()] = true;
    }
}

}  // namespace

Config Config::from_json(const std::string& json_text, const std::string& source) {
    const json object = parse_json(json_text, source + ": metadata barellm.config");
    if (!object.is_object()) throw Error(source + ": metadata barellm.config is not a JSON object");
    if (!object.contains("architecture") || !is_known_architecture(object["architecture"]))
        throw Error(
            source + ": architecture " +
            (object.contains("architecture") ? json_excerpt(object["architecture"]) : "(missing)") +
            " is not supported (barellm runs llama, qwen2, qwen3, phi3, gemma2, gemma3, mixtral, "
            "qwen3_moe and gpt_oss)");
    Config config;
    config.architecture = object["architecture"].get<std::string>();
    config.dim = read_int(object, "dim", source, 1, kMaxDim);
    config.hidden_dim = read_int(object, "hidden_dim", source, 1, 4 * kMaxDim);
    config.layers = read_int(object, "layers", source, 1, kMaxLayers);
    config.heads = read_int(object, "heads", source, 1, kMaxDim);
    config.kv_heads = read_int(object, "kv_heads", source, 1, config.heads);
    config.head_dim = read_int(object, "head_dim", source, 2, kMaxDim);
    config.rotary_dim = object.contains("rotary_dim")
                            ? read_int(object, "rotary_dim", source, 2, config.head_dim)
                            : config.head_dim;
    if (config.rotary_dim % 2 != 0)
        throw Error(source + ": rotary_dim " + std::to_string(config.rotary_dim) +
                    " is odd; RoPE rotates pairs");
    config.vocab_size = read_int(object, "vocab_size", source, 1, Tokenizer::kMaxVocabSize);
    config.max_context = read_int(object, "max_context", source, 1, kMaxContext);
    config.rope_theta = read_positive_float(object, "rope_theta", source);
    check_rope_table(rope_table(config, 1), config, "rope_theta", source);
    config.rope_scaling = read_rope_scaling(object, config.rotary_dim, source);
    for (int context : {1, kMaxContext})  // both of LongRoPE's factor sets
        check_rope_table(rope_table(config, context), config, "rope_scaling", source);
    config.norm_eps = read_positive_float(object, "norm_eps", source);
    if (object.contains("sliding_window") && !object["sliding_window"].is_null())
        config.sliding_window = read_int(object, "sliding_window", source, 1, kMaxContext);
    if (object.contains("sliding_window_first_layer"))
        config.sliding_window_first_layer =
            read_int(object, "sliding_window_first_layer", source, 0, config.layers - 1);
    if (object.contains("layer_types")) read_layer_types(object, source, &config);
    config.qkv_bias = read_optional_bool(object, "qkv_bias", source);
    config.o_bias = read_optional_bool(object, "o_bias", source);
    config.qk_norm = read_optional_bool(object, "qk_norm", source);
    config.attention_sinks = read_optional_bool(object, "attention_sinks", source);
    if (!object.contains("tied_embeddings") || !object["tied_embeddings"].is_boolean())
        throw Error(source + ": config field 'tied_embeddings' is missing or not a boolean");
    config.tied_embeddings = object["tied_embeddings"].get<bool>();
    if (object.contains("bos_id") && !object["bos_id"].is_null())
        config.bos_id = read_int(object, "bos_id", source, 0, config.vocab_size - 1);
    if (!object.contains("eos_ids") || !object["eos_ids"].is_array())
        throw Error(source + ": config field 'eos_ids' is missing or not a list");
    for (const auto& id : object["eos_ids"]) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
            id.get<int64_t>() >= config.vocab_size)
            throw Error(source + ": config field 'eos_ids' holds a bad id " + json_excerpt(id));
        config.eos_ids.push_back(id.get<int>());
    }
    if (object.contains("add_bos")) {
        if (!object["add_bos"].is_boolean())
            throw Error(source + ": config field 'add_bos' is not a boolean");
        config.add_bos = object["add_bos"].get<bool>();
    }
    if (config.add_bos && config.bos_id < 0)
        throw Error(source + ": config asks for add_bos but has no bos_id");
    if (!object.contains("weight_dtype") || !object["weight_dtype"].is_string())
        throw Error(source + ": config field 'weight_dtype' is missing or not a string");
    config.weight_dtype = object["weight_dtype"].get<std::string>();
    if (object.contains("activation")) {
        const json& name = object["activation"];
        if (name == "silu")
            config.activation = Activation::Silu;
        else if (name == "gelu_tanh")
            config.activation = Activation::GeluTanh;
        else if (name == "swiglu_oai")
            config.activation = Activation::SwigluOai;
        else
            throw Error(source + ": config field 'activation' " + json_excerpt(name) +
                        " is not \"silu\", \"gelu_tanh\" or \"swiglu_oai\"");
    }
    if (config.activation == Activation::SwigluOai)
        config.swiglu_limit = read_positive_float(object, "swiglu_limit", source);
    else if (object.contains("swiglu_limit"))
        throw Error(source + ": config field 'swiglu_limit' needs activation \"swiglu_oai\"");
    if (object.contains("embedding_scale"))
        config.embedding_scale = read_positive_float(object, "embedding_scale", source);
    config.post_norms = read_optional_bool(object, "post_norms", source);
    if (object.contains("rope_theta_local")) {
        config.rope_theta_local = read_positive_float(object, "rope_theta_local", source);
        check_rope_table(rope_local_table(config), config, "rope_theta_local", source);
    }

    if (object.contains("attn_logit_softcap"))
        config.attn_logit_softcap = read_positive_float(object, "attn_logit_softcap", source);
    if (object.contains("final_logit_softcap"))
        config.final_logit_softcap = read_positive_float(object, "final_logit_softcap", source);

    read_experts(object, source, &config);
    const bool moe_architecture = config.architecture == "mixtral" ||
                                  config.architecture == "qwen3_moe" ||
                                  config.architecture == "gpt_oss";
    if (moe_architecture && config.experts == 0)
        throw Error(source + ": architecture " + config.architecture + " needs 'experts'");
    if (!moe_architecture && config.experts > 0)
        throw Error(source + ": architecture " + config.architecture +
                    " has no experts (mixtral, qwen3_moe and gpt_oss have)");

    if (config.heads % config.kv_heads != 0)
        throw Error(source + ": heads (" + std::to_string(config.heads) +
                    ") is not a multiple of kv_heads (" + std::to_string(config.kv_heads) + ")");
    if (config.head_dim % 2 != 0)
        throw Error(source + ": head_dim " + std::to_string(config.head_dim) +
                    " is odd; RoPE rotates pairs");
    if (int64_t(config.heads) * config.head_dim > 4 * kMaxDim)
        throw Error(source + ": heads * head_dim is too large");
    config.attention_scale = object.contains("attention_scale")
                                 ? read_positive_float(object, "attention_scale", source)
                                 : float(1.0 / std::sqrt(double(config.head_dim)));
    return config;
}

std::vector<float> rope_local_table(const Config& config) {
    if (!(config.rope_theta_local > 0))
        throw Error("rope_local_table: the model has no rope_theta_local");
    Config local = config;
    local.rope_theta = config.rope_theta_local;
    local.rope_scaling = RopeScaling{};
    return rope_table(local, 1);
}

std::vector<float> rope_table(const Config& config, int context) {
    const int rotary_dim = config.rotary_dim > 0 ? config.rotary_dim : config.head_dim;
    const int pairs = config.head_dim / 2, rotated_pairs = rotary_dim / 2;
    std::vector<float> table(2 * pairs, 0.0f);
    float* inverse = table.data();
    float* magnitude = table.data() + pairs;
    const RopeScaling& scaling = config.rope_scaling;
    const YarnRamp ramp = scaling.kind == RopeScaling::Kind::Yarn
                              ? yarn_ramp(scaling, rotary_dim, config.rope_theta)
                              : YarnRamp{};
    for (int i = 0; i < pairs; ++i) {
        magnitude[i] = 1.0f;
        if (i >= rotated_pairs) continue;  // past rotary_dim: frequency 0, not rotated
        double frequency = std::pow(double(config.rope_theta), -2.0 * i / rotary_dim);
        if (scaling.kind == RopeScaling::Kind::Linear) {
            frequency /= scaling.factor;
        } else if (scaling.kind == RopeScaling::Kind::Llama3) {
            // Llama 3.1: keep high frequencies, divide low ones by `factor`, blend between.
            const double wavelength = 2 * M_PI / frequency;
            const double low_freq_wavelength = scaling.original_context / scaling.low_freq_factor;
            const double high_freq_wavelength = scaling.original_context / scaling.high_freq_factor;
            if (wavelength > low_freq_wavelength) {
                frequency /= scaling.factor;
            } else if (wavelength >= high_freq_wavelength) {
                const double smooth =
                    (scaling.original_context / wavelength - scaling.low_freq_factor) /
                    (scaling.high_freq_factor - scaling.low_freq_factor);
                frequency = (1 - smooth) * frequency / scaling.factor + smooth * frequency;
            }
        } else if (scaling.kind == RopeScaling::Kind::Yarn) {
            const double scaled = std::clamp((i - ramp.low) / (ramp.high - ramp.low), 0.0, 1.0);
            frequency = frequency / scaling.factor * scaled + frequency * (1 - scaled);
            magnitude[i] = scaling.attention_factor;
        } else if (scaling.kind == RopeScaling::Kind::LongRope) {
            // Phi-3: a factor per pair, the long set once the context outgrows the original.
            const bool long_context = context > scaling.original_context;
            frequency /= (long_context ? scaling.long_factors : scaling.short_factors)[i];
            magnitude[i] = scaling.attention_factor;
        }
        inverse[i] = float(frequency);
    }
    return table;
}

}  // namespace barellm
