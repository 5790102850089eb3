// The loader refuses every malformed file with an Error naming the problem.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "util/error.h"
#include "weights/model.h"

using namespace barellm;
using nlohmann::json;

namespace {

// The files the tests of this process wrote, removed when the process ends.
struct TempFiles {
    std::set<std::string> paths;
    ~TempFiles() {
        for (const std::string& path : paths) std::remove(path.c_str());
    }
};

std::string temp_path(const std::string& name) {
    static TempFiles files;
    const std::string path = "/tmp/barellm_test_" + std::to_string(getpid()) + "_" + name;
    files.paths.insert(path);
    return path;
}

// Writes [u64 header length][header][data] and returns the path.
std::string write_raw(const std::string& name, const std::string& header, const std::string& data,
                      uint64_t header_length) {
    const std::string path = temp_path(name);
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(&header_length), sizeof header_length);
    out << header << data;
    return path;
}

// Writes a header padded with spaces to a multiple of 8 bytes, as converters do.
std::string write_file(const std::string& name, const json& header, const std::string& data) {
    std::string text = header.dump();
    text.resize((text.size() + 7) / 8 * 8, ' ');
    return write_raw(name, text, data, text.size());
}

// A complete, valid tiny model: dim 8, hidden 12, 1 layer, 2 heads, 1 KV head, vocab 10.
struct TinyModel {
    json header;
    std::string data;
    json config = {{"architecture", "llama"},
                   {"dim", 8},
                   {"hidden_dim", 12},
                   {"layers", 1},
                   {"heads", 2},
                   {"kv_heads", 1},
                   {"head_dim", 4},
                   {"vocab_size", 10},
                   {"max_context", 16},
                   {"rope_theta", 10000.0},
                   {"norm_eps", 1e-5},
                   {"tied_embeddings", true},
                   {"bos_id", 1},
                   {"eos_ids", {2}},
                   {"weight_dtype", "F32"}};

    void add(const std::string& name, std::vector<int64_t> shape) {
        size_t count = 1;
        for (int64_t d : shape) count *= size_t(d);
        const size_t begin = data.size();
        for (size_t i = 0; i < count; ++i) {
            const float value = 0.01f * float(i % 7 + 1);
            data.append(reinterpret_cast<const char*>(&value), sizeof value);
        }
        header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, data.size()}}};
    }

    TinyModel() {
        add("token_embedding", {10, 8});
        add("layers.0.attn_norm", {8});
        add("layers.0.wq", {8, 8});
        add("layers.0.wk", {4, 8});
        add("layers.0.wv", {4, 8});
        add("layers.0.wo", {8, 8});
        add("layers.0.ffn_norm", {8});
        add("layers.0.w1", {12, 8});
        add("layers.0.w3", {12, 8});
        add("layers.0.w2", {8, 12});
        add("final_norm", {8});
    }

    std::string write(const std::string& name) {
        header["__metadata__"] = {{"barellm.format", "1"}, {"barellm.config", config.dump()}};
        return write_file(name, header, data);
    }
};

// Runs `load` and returns the Error message (empty when it did not throw).
template <typename Load>
std::string error_of(Load load) {
    try {
        load();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

std::string load_error(const std::string& path) {
    return error_of([&] { Model::load(path); });
}

}  // namespace

TEST_CASE("a valid tiny model loads") {
    TinyModel tiny;
    const std::string path = tiny.write("valid");
    const Model model = Model::load(path);
    CHECK(model.config.dim == 8);
    CHECK(model.layers.size() == 1);
    CHECK(model.output.data == model.token_embedding.data);
    std::remove(path.c_str());
}

TEST_CASE("files that are not safetensors are refused") {
    CHECK_THAT(load_error(temp_path("does_not_exist")), Catch::Contains("cannot open"));
    CHECK_THAT(load_error(write_raw("short", "", "", 0).substr(0)),
               Catch::Contains("not a safetensors file"));
    {
        const std::string path = temp_path("tiny");
        std::ofstream(path) << "abc";
        CHECK_THAT(load_error(path), Catch::Contains("shorter than its 8-byte header"));
    }
    CHECK_THAT(load_error(write_raw("huge_header", "{}", "", uint64_t(1) << 62)),
               Catch::Contains("does not fit the file size"));
    CHECK_THAT(load_error(write_raw("not_json", "{\"a\": [", "", 7)),
               Catch::Contains("safetensors header: not valid JSON (syntax error at byte 8)"));
    CHECK_THAT(load_error(write_raw("array", "[1, 2]", "", 6)),
               Catch::Contains("header is not a JSON object"));
    CHECK_THAT(load_error(write_file("no_format", json::object(), "")),
               Catch::Contains("not a barellm weight file"));
}

TEST_CASE("bad tensor entries are refused naming the tensor") {
    auto entry_error = [](const std::string& name, const json& entry, const std::string& data) {
        return load_error(write_file(name, json{{"t", entry}}, data));
    };
    CHECK_THAT(entry_error("dtype", {{"dtype", "I64"}, {"shape", {1}}, {"data_offsets", {0, 8}}},
                           std::string(8, 'x')),
               Catch::Contains("tensor 't': unsupported dtype \"I64\""));
    CHECK_THAT(
        entry_error("negative", {{"dtype", "F32"}, {"shape", {-1}}, {"data_offsets", {0, 4}}},
                    std::string(4, 'x')),
        Catch::Contains("bad dimension"));
    CHECK_THAT(
        entry_error("truncated", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}},
                    std::string(8, 'x')),
        Catch::Contains("outside the 8 data bytes"));
    CHECK_THAT(
        entry_error("mismatch", {{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {0, 16}}},
                    std::string(16, 'x')),
        Catch::Contains("needs 12 bytes but data_offsets give 16"));
    CHECK_THAT(entry_error("overflow",
                           {{"dtype", "F32"},
                            {"shape", {int64_t(1) << 40, int64_t(1) << 40}},
                            {"data_offsets", {0, 4}}},
                           std::string(4, 'x')),
               Catch::Contains("size overflows"));
    {
        // A header of odd length puts the data of an F32 tensor at an odd offset.
        const json header = {{"t", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}}};
        const std::string text = header.dump() + (header.dump().size() % 2 ? "" : " ");
        CHECK_THAT(load_error(write_raw("misaligned", text, std::string(4, 'x'), text.size())),
                   Catch::Contains("not aligned to its 4-byte elements"));
    }
    CHECK_THAT(entry_error("missing_keys", {{"dtype", "F32"}}, ""),
               Catch::Contains("needs dtype, shape and data_offsets"));
    const json overlapping = {{"a", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
                              {"b", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {4, 12}}}}};
    CHECK_THAT(load_error(write_file("overlap", overlapping, std::string(12, 'x'))),
               Catch::Contains("overlap"));
    const json bad_metadata = {{"__metadata__", {{"k", 3}}}};
    CHECK_THAT(load_error(write_file("metadata", bad_metadata, "")),
               Catch::Contains("metadata 'k' is not a string"));
}

TEST_CASE("tensors and config that disagree are refused") {
    SECTION("missing tensor") {
        TinyModel tiny;
        tiny.header.erase("layers.0.w2");
        CHECK_THAT(load_error(tiny.write("missing")), Catch::Contains("'layers.0.w2' is missing"));
    }
    SECTION("wrong shape") {
        TinyModel tiny;
        tiny.config["hidden_dim"] = 13;
        CHECK_THAT(load_error(tiny.write("shape")),
                   Catch::Contains("'layers.0.w1' has shape [12, 8], the config needs [13, 8]"));
    }
    SECTION("extra tensor") {
        TinyModel tiny;
        tiny.add("stray", {2});
        CHECK_THAT(load_error(tiny.write("extra")), Catch::Contains("holds 12 tensors"));
    }
    SECTION("heads not a multiple of kv_heads") {
        TinyModel tiny;
        tiny.config["kv_heads"] = 3;
        CHECK_THAT(load_error(tiny.write("kv_heads")), Catch::Contains("kv_heads"));
    }
    SECTION("absurd values") {
        TinyModel tiny;
        tiny.config["layers"] = 1 << 30;
        CHECK_THAT(load_error(tiny.write("layers")), Catch::Contains("'layers' = 1073741824"));
    }
    SECTION("unknown architecture") {
        TinyModel tiny;
        tiny.config["architecture"] = "gpt2";
        CHECK_THAT(load_error(tiny.write("arch")), Catch::Contains("\"gpt2\" is not supported"));
    }
    SECTION("eos id outside the vocabulary") {
        TinyModel tiny;
        tiny.config["eos_ids"] = {10};
        CHECK_THAT(load_error(tiny.write("eos")), Catch::Contains("bad id 10"));
    }
}

TEST_CASE("config numbers are checked as the floats the model computes with") {
    const auto config_error = [](const char* key, const json& value) {
        TinyModel tiny;
        tiny.config[key] = value;
        return load_error(tiny.write(std::string("float_") + key));
    };
    const std::string outside = " is not a positive number within the float range";
    CHECK_THAT(config_error("rope_theta", 1e300),
               Catch::Contains("'rope_theta' = 1e+300" + outside));
    CHECK_THAT(config_error("norm_eps", 1e300), Catch::Contains("'norm_eps' = 1e+300" + outside));
    CHECK_THAT(config_error("norm_eps", 1e-300), Catch::Contains("'norm_eps' = 1e-300" + outside));
    SECTION("a theta that makes a frequency 1 / theta^(2i / head_dim) overflow") {
        TinyModel tiny;
        tiny.config["rope_theta"] = 1e-45;
        tiny.config["head_dim"] = 64;  // the config is checked before the tensors' shapes
        CHECK_THAT(load_error(tiny.write("float_theta")),
                   Catch::Contains("'rope_theta' makes a RoPE frequency overflow as a float"));
    }
    const json linear = {{"rope_type", "linear"}, {"factor", 1e300}};
    CHECK_THAT(config_error("rope_scaling", linear),
               Catch::Contains("'factor' = 1e+300" + outside));
    const json llama3 = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1e-300},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}};
    CHECK_THAT(config_error("rope_scaling", llama3),
               Catch::Contains("'low_freq_factor' = 1e-300" + outside));
    SECTION("a scaling factor that makes a frequency round to 0") {
        TinyModel tiny;
        tiny.config["rope_theta"] = 1e30;
        tiny.config["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 3e38}};
        CHECK_THAT(load_error(tiny.write("float_scaled")),
                   Catch::Contains("'rope_scaling' makes a RoPE frequency round to 0 as a float"));
    }
}

TEST_CASE("rotary_dim and LongRoPE are read and checked") {
    const auto with = [](const json& fields) {
        TinyModel tiny;
        tiny.config["head_dim"] = 4;
        for (const auto& [key, value] : fields.items()) tiny.config[key] = value;
        return tiny;
    };
    const json longrope = {{"rope_type", "longrope"},
                           {"short_factor", {1.5}},
                           {"long_factor", {3.0}},
                           {"original_max_position_embeddings", 8},
                           {"attention_factor", 1.25}};
    SECTION("a valid partial rotary_dim with LongRoPE loads; its table picks factors by context") {
        TinyModel tiny = with({{"rotary_dim", 2}, {"rope_scaling", longrope}});
        const Model model = Model::load(tiny.write("longrope"));
        CHECK(model.config.rotary_dim == 2);
        const std::vector<float> short_table = rope_table(model.config, 8);
        const std::vector<float> long_table = rope_table(model.config, 9);
        CHECK(short_table == std::vector<float>{float(1 / 1.5), 0.0f, 1.25f, 1.0f});
        CHECK(long_table == std::vector<float>{float(1 / 3.0), 0.0f, 1.25f, 1.0f});
    }
    SECTION("rotary_dim defaults to head_dim") {
        TinyModel tiny;
        CHECK(Model::load(tiny.write("rotary_default")).config.rotary_dim == 4);
    }
    CHECK_THAT(load_error(with({{"rotary_dim", 3}}).write("rotary_odd")),
               Catch::Contains("rotary_dim 3 is odd"));
    CHECK_THAT(load_error(with({{"rotary_dim", 6}}).write("rotary_wide")),
               Catch::Contains("'rotary_dim' = 6 is outside [2, 4]"));
    json short_list = longrope;
    short_list["long_factor"] = {3.0, 3.0};  // 2 rotated pairs, rotary_dim 2 has one
    CHECK_THAT(load_error(with({{"rotary_dim", 2}, {"rope_scaling", short_list}}).write("lr_n")),
               Catch::Contains("'long_factor' is not a list of 1 numbers"));
    json zero = longrope;
    zero["short_factor"] = {0.0, 1.0};
    CHECK_THAT(load_error(with({{"rope_scaling", zero}}).write("lr_zero")),
               Catch::Contains("'short_factor' holds 0.0, not a positive number"));
    json no_factor = longrope;
    no_factor.erase("attention_factor");
    no_factor["short_factor"] = {1.0, 1.0};
    no_factor["long_factor"] = {1.0, 1.0};
    CHECK_THAT(load_error(with({{"rope_scaling", no_factor}}).write("lr_attention")),
               Catch::Contains("'attention_factor' is missing"));
}

TEST_CASE("YaRN's settings are read and checked") {
    const json yarn = {
        {"rope_type", "yarn"}, {"factor", 4.0},    {"original_max_position_embeddings", 256},
        {"beta_fast", 8.0},    {"beta_slow", 1.0}, {"attention_factor", 1.25},
        {"truncate", false}};
    const auto with = [](const json& scaling) {
        TinyModel tiny;
        tiny.config["rope_scaling"] = scaling;
        return tiny;
    };
    SECTION("a valid one loads; every rotated pair's magnitude is the attention factor") {
        TinyModel tiny = with(yarn);
        const Model model = Model::load(tiny.write("yarn"));
        CHECK(model.config.rope_scaling.kind == RopeScaling::Kind::Yarn);
        CHECK_FALSE(model.config.rope_scaling.truncate);
        const std::vector<float> table = rope_table(model.config, 1);
        CHECK(table[2] == 1.25f);
        CHECK(table[3] == 1.25f);
    }
    json no_beta = yarn;
    no_beta.erase("beta_slow");
    CHECK_THAT(load_error(with(no_beta).write("yarn_beta")),
               Catch::Contains("'beta_slow' is missing"));
    json bad_truncate = yarn;
    bad_truncate["truncate"] = "yes";
    CHECK_THAT(load_error(with(bad_truncate).write("yarn_truncate")),
               Catch::Contains("'truncate' is not a boolean"));
}

namespace {

// A valid tiny model whose matrices each have their own type (barellm.matrix_types): dim 256,
// hidden `hidden`, 1 layer, 2 heads of 128, 1 KV head, vocab 10. The blocks' bytes are
// arbitrary but every f16 field is a finite 0.5.
struct MixedModel {
    json header;
    std::string floats, halves, bytes, int8s;  // the four groups, in file order
    json types = json::object();
    json config = {{"architecture", "llama"},
                   {"dim", 256},
                   {"hidden_dim", 256},
                   {"layers", 1},
                   {"heads", 2},
                   {"kv_heads", 1},
                   {"head_dim", 128},
                   {"vocab_size", 10},
                   {"max_context", 16},
                   {"rope_theta", 10000.0},
                   {"norm_eps", 1e-5},
                   {"tied_embeddings", true},
                   {"bos_id", 1},
                   {"eos_ids", {2}},
                   {"weight_dtype", "Q4_K_M"}};
    std::vector<std::pair<std::string, json>> entries;  // name, {group, dtype, shape, size}

    void add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
             size_t size) {
        std::string* group = dtype == "F32"   ? &floats
                             : dtype == "F16" ? &halves
                             : dtype == "U8"  ? &bytes
                                              : &int8s;
        const size_t begin = group->size();
        for (size_t i = 0; i < size; i += 2) group->append(dtype == "F32" ? "\0\0" : "\0\x38", 2);
        group->resize(begin + size);
        if (dtype == "F32")
            for (size_t i = begin; i < begin + size; i += 4) group->replace(i, 4, "\0\0\0\x3f", 4);
        entries.emplace_back(
            name,
            json{{"dtype", dtype}, {"shape", shape}, {"begin", begin}, {"end", group->size()}});
    }

    // A matrix of `type` (a barellm.matrix_types name), rows × cols.
    void matrix(const std::string& name, const std::string& type, int64_t rows, int64_t cols) {
        types[name] = type;
        const std::map<std::string, std::pair<int, int>> blocks = {
            {"Q4_1", {32, 20}},   {"Q5_0", {32, 22}},    {"Q5_1", {32, 24}},
            {"Q3_K", {256, 110}}, {"Q4_K", {256, 144}},  {"Q5_K", {256, 176}},
            {"Q6_K", {256, 210}}, {"IQ4_XS", {256, 136}}};
        if (type == "F16" || type == "F32") {
            add(name, type, {rows, cols}, size_t(rows * cols) * (type == "F16" ? 2 : 4));
        } else if (type == "Q8_0") {
            add(name, "I8", {rows, cols}, size_t(rows * cols));
            add(name + ".scale", "F16", {rows, (cols + 31) / 32},
                size_t(rows * ((cols + 31) / 32)) * 2);
        } else if (type == "Q4_0") {
            add(name, "U8", {rows, cols / 2}, size_t(rows * cols / 2));
            add(name + ".scale", "F16", {rows, cols / 32}, size_t(rows * cols / 32) * 2);
        } else {
            const auto [weights, block_bytes] = blocks.at(type);
            const int64_t row_bytes = cols / weights * block_bytes;
            add(name, "U8", {rows, row_bytes}, size_t(rows * row_bytes));
        }
    }

    explicit MixedModel(int hidden = 256) {
        config["hidden_dim"] = hidden;
        matrix("token_embedding", "F16", 10, 256);
        add("layers.0.attn_norm", "F32", {256}, 256 * 4);
        matrix("layers.0.wq", "Q4_K", 256, 256);
        matrix("layers.0.wk", "Q5_K", 128, 256);
        matrix("layers.0.wv", "Q6_K", 128, 256);
        matrix("layers.0.wo", "Q8_0", 256, 256);
        add("layers.0.ffn_norm", "F32", {256}, 256 * 4);
        matrix("layers.0.w1", "Q4_0", hidden, 256);
        matrix("layers.0.w3", "IQ4_XS", hidden, 256);
        matrix("layers.0.w2", "Q5_1", 256, hidden);
        add("final_norm", "F32", {256}, 256 * 4);
    }

    std::string write(const std::string& name, bool with_types = true) {
        const std::map<std::string, size_t> group_start = {
            {"F32", 0},
            {"F16", floats.size()},
            {"U8", floats.size() + halves.size()},
            {"I8", floats.size() + halves.size() + bytes.size()}};
        for (const auto& [tensor, e] : entries) {
            const size_t start =
                group_start.at(e["dtype"] == "BF16" ? "F16" : e["dtype"].get<std::string>());
            header[tensor] = {{"dtype", e["dtype"]},
                              {"shape", e["shape"]},
                              {"data_offsets",
                               {start + e["begin"].get<size_t>(), start + e["end"].get<size_t>()}}};
        }
        header["__metadata__"] = {{"barellm.format", "1"}, {"barellm.config", config.dump()}};
        if (with_types) header["__metadata__"]["barellm.matrix_types"] = types.dump();
        return write_file(name, header, floats + halves + bytes + int8s);
    }
};

}  // namespace

TEST_CASE("a model whose matrices have their own types loads") {
    MixedModel mixed;
    const Model model = Model::load(mixed.write("mixed"));
    const LayerWeights& layer = model.layers[0];
    CHECK(model.token_embedding.dtype == DType::F16);
    CHECK(layer.wq.dtype == DType::Q4_K);
    CHECK(layer.wk.dtype == DType::Q5_K);
    CHECK(layer.wv.dtype == DType::Q6_K);
    CHECK(layer.wo.dtype == DType::Q8_0);
    CHECK(layer.w1.dtype == DType::Q4_0);
    CHECK(layer.w3.dtype == DType::IQ4_XS);
    CHECK(layer.w2.dtype == DType::Q5_1);
    CHECK(layer.wq.row_bytes() == 144);
    CHECK(layer.wv.bytes() == 128 * 210);
    CHECK(layer.w2.bytes() == 256 * 8 * 24);
    // Every f16 field of the blocks is 0.5 and every byte of the values 0x38 or 0: the rows
    // dequantize to finite numbers.
    std::vector<float> row(256);
    for (const auto& [name, m] : model.named_matrices()) {
        matrix_row_to_float(row.data(), *m, m->rows - 1);
        for (float value : row) CHECK(std::isfinite(value));
    }
}

TEST_CASE("files of mixed types that disagree with their matrix types are refused") {
    SECTION("no matrix_types") {
        MixedModel mixed;
        CHECK_THAT(load_error(mixed.write("no_types", false)),
                   Catch::Contains("'Q4_K_M' is not one type") &&
                       Catch::Contains("no barellm.matrix_types"));
    }
    SECTION("matrix_types in a file of one type") {
        MixedModel mixed;
        mixed.config["weight_dtype"] = "F16";
        CHECK_THAT(load_error(mixed.write("uniform")),
                   Catch::Contains("matrix_types is present but weight_dtype F16"));
    }
    SECTION("a type barellm does not run") {
        MixedModel mixed;
        mixed.types["layers.0.wq"] = "NVFP4";
        CHECK_THAT(
            load_error(mixed.write("nvfp4")),
            Catch::Contains("gives 'layers.0.wq' the type \"NVFP4\", which barellm does not run"));
    }
    SECTION("a matrix without a type") {
        MixedModel mixed;
        mixed.types.erase("layers.0.w3");
        CHECK_THAT(load_error(mixed.write("missing_type")),
                   Catch::Contains("no type for 'layers.0.w3'"));
    }
    SECTION("a type for something that is not a matrix") {
        MixedModel mixed;
        mixed.types["layers.0.attn_norm"] = "F32";
        CHECK_THAT(load_error(mixed.write("stray_type")),
                   Catch::Contains("names 'layers.0.attn_norm', which is not a matrix"));
    }
    SECTION("a block type whose rows are not whole blocks") {
        MixedModel mixed(288);  // w2's 288 columns are 9 Q5_1 blocks; w3's rows are fine
        mixed.types["layers.0.w2"] = "Q6_K";
        CHECK_THAT(load_error(mixed.write("partial_block")),
                   Catch::Contains("'layers.0.w2' has 288 columns, not a multiple of the 256"));
    }
    SECTION("a block matrix of the wrong length") {
        MixedModel mixed;
        mixed.types["layers.0.wq"] = "Q5_K";  // stored as Q4_K: 144 bytes a block, not 176
        CHECK_THAT(
            load_error(mixed.write("wrong_length")),
            Catch::Contains("'layers.0.wq' has shape [256, 144], the config needs [256, 176]"));
    }
    SECTION("a block matrix at an odd offset") {
        MixedModel mixed;
        // One byte before the blocks shifts every U8 tensor after it to an odd offset.
        for (auto& [name, e] : mixed.entries)
            if (e["dtype"] == "U8") {
                e["begin"] = e["begin"].get<size_t>() + 1;
                e["end"] = e["end"].get<size_t>() + 1;
            }
        mixed.entries.emplace_back("odd",
                                   json{{"dtype", "U8"}, {"shape", {1}}, {"begin", 0}, {"end", 1}});
        mixed.bytes.insert(0, 1, '\0');
        CHECK_THAT(load_error(mixed.write("odd_offset")),
                   Catch::Contains("starts at an odd offset"));
    }
}
