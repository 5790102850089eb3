// The server's batched step over the paged KV cache (Backend::step on the CPU): attention
// through block tables against the contiguous kernel and a double-precision reference, the
// GEMMs' rows independent of the batch, and whole steps of interleaved sequences against each
// sequence run alone through prefill and forward, on small Llama, Qwen3 and Gemma 3 models
// written here with random weights.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend.h"
#include "cpu/kernels.h"
#include "test_block_matrices.h"
#include "test_matrices.h"
#include "util/error.h"
#include "weights/half.h"
#include "weights/model.h"
#include "weights/model_copy.h"

using namespace barellm;
using namespace barellm::test;
using nlohmann::json;

namespace {

constexpr cpu::SimdLevel kLevels[] = {cpu::SimdLevel::Scalar, cpu::SimdLevel::Avx2,
                                      cpu::SimdLevel::Avx512};

// Runs the CPU kernels at `level` for the life of the object.
struct SimdLevelScope {
    explicit SimdLevelScope(cpu::SimdLevel level) { cpu::set_simd_level(level); }
    ~SimdLevelScope() { cpu::set_simd_level(cpu::detect_simd_level()); }
};

// `count` distinct block ids out of `blocks`, in random order.
std::vector<int> random_blocks(int count, int blocks, std::mt19937& rng) {
    std::vector<int> ids(blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(count);
    return ids;
}

// Stores `values` as one KV element of `type` and returns what the cache then holds.
float stored(float value, KvType type) {
    return type == KvType::F32 ? value : half_to_float(float_to_half(value));
}

// softmax(q·k × scale) · v over keys[first..pos] in double: one head's attention output.
std::vector<double> attention_by_formula(const float* q, const std::vector<float>& keys,
                                         const std::vector<float>& values, int first, int pos,
                                         int kv_head, const AttentionShape& shape) {
    const int head_dim = shape.head_dim, kv_dim = shape.kv_heads * head_dim;
    std::vector<double> scores;
    double largest = -INFINITY;
    for (int p = first; p <= pos; ++p) {
        double dot = 0;
        for (int d = 0; d < head_dim; ++d)
            dot += double(q[d]) * keys[size_t(p) * kv_dim + kv_head * head_dim + d];
        scores.push_back(dot * shape.scale);
        largest = std::max(largest, scores.back());
    }
    double sum = 0;
    for (double& s : scores) sum += (s = std::exp(s - largest));
    std::vector<double> out(head_dim, 0.0);
    for (int p = first; p <= pos; ++p)
        for (int d = 0; d < head_dim; ++d)
            out[d] += scores[p - first] / sum * values[size_t(p) * kv_dim + kv_head * head_dim + d];
    return out;
}

}  // namespace

TEST_CASE("attention over block tables equals the contiguous attention and its formula") {
    std::mt19937 rng(59);
    const KvType type = GENERATE(KvType::F32, KvType::F16);
    const int block_size = GENERATE(16, 32, 64);
    // GQA (3 query heads per KV head), a head_dim that is not a multiple of 8 or 16, windows
    // shorter and longer than a block.
    const int window = GENERATE(0, 5, 40);
    const AttentionShape shape{6, 2, 20, window, 0.37f};
    const int kv_dim = shape.kv_heads * shape.head_dim, q_dim = shape.heads * shape.head_dim;
    const size_t element = kv_element_bytes(type);
    const int blocks = 40;
    // Sequences of lengths that are not multiples of a block, each with a scattered table; the
    // step's rows: the last position of each, and a run of positions of the longest.
    const std::vector<int> lengths = {1, 17, 70, 150};
    std::vector<int> positions;
    std::vector<int> row_sequence;
    for (int s = 0; s < int(lengths.size()); ++s) {
        if (s == 2)
            for (int p = 50; p < 55; ++p) positions.push_back(p), row_sequence.push_back(s);
        positions.push_back(lengths[s] - 1);
        row_sequence.push_back(s);
    }
    std::vector<uint8_t> key_pool(size_t(blocks) * block_size * kv_dim * element);
    std::vector<uint8_t> value_pool(key_pool.size());
    std::vector<std::vector<float>> keys(lengths.size()), values(lengths.size());
    std::vector<std::vector<int>> tables(lengths.size());
    const std::vector<int> free_blocks = random_blocks(blocks, blocks, rng);
    int next_free = 0;
    for (size_t s = 0; s < lengths.size(); ++s) {
        const int length = lengths[s];
        for (int b = 0; b < (length + block_size - 1) / block_size; ++b)
            tables[s].push_back(free_blocks.at(next_free++));
        keys[s] = random_floats(size_t(length) * kv_dim, rng);
        values[s] = random_floats(size_t(length) * kv_dim, rng);
        for (int p = 0; p < length; ++p) {
            // The layout of src/kv_cache.h, written out: slot p % block_size of the block
            // the table names for p.
            const size_t row = size_t(tables[s][p / block_size]) * block_size + p % block_size;
            cpu::kv_store(&key_pool[row * kv_dim * element], &keys[s][size_t(p) * kv_dim], kv_dim,
                          type);
            cpu::kv_store(&value_pool[row * kv_dim * element], &values[s][size_t(p) * kv_dim],
                          kv_dim, type);
        }
        for (float& k : keys[s]) k = stored(k, type);
        for (float& v : values[s]) v = stored(v, type);
    }
    const int count = int(positions.size());
    const std::vector<float> q = random_floats(size_t(count) * q_dim, rng);
    std::vector<const int*> block_tables;
    for (int s : row_sequence) block_tables.push_back(tables[s].data());
    const cpu::PagedKvLayer cache{key_pool.data(), value_pool.data(), block_size, type};

    for (cpu::SimdLevel level : kLevels) {
        if (level > cpu::detect_simd_level()) continue;
        SimdLevelScope scope(level);
        std::vector<float> out(size_t(count) * q_dim, NAN);
        cpu::attention_paged(out.data(), q.data(), count, positions.data(), block_tables.data(),
                             cache, shape);
        for (int i = 0; i < count; ++i) {
            const int s = row_sequence[i], pos = positions[i];
            INFO(cpu::simd_level_name(level) << " block " << block_size << " window " << window
                                             << " row " << i << " at " << pos);
            // The contiguous kernel over the same keys and values, stored in a row each.
            std::vector<uint8_t> key_cache(size_t(pos + 1) * kv_dim * element);
            std::vector<uint8_t> value_cache(key_cache.size());
            for (int p = 0; p <= pos; ++p) {
                cpu::kv_store(&key_cache[size_t(p) * kv_dim * element],
                              &keys[s][size_t(p) * kv_dim], kv_dim, type);
                cpu::kv_store(&value_cache[size_t(p) * kv_dim * element],
                              &values[s][size_t(p) * kv_dim], kv_dim, type);
            }
            std::vector<float> contiguous(q_dim), scores(size_t(shape.heads) * (pos + 1));
            cpu::attention(contiguous.data(), &q[size_t(i) * q_dim], pos, key_cache.data(),
                           value_cache.data(), scores.data(), shape, type);
            const std::vector<float> row(out.begin() + size_t(i) * q_dim,
                                         out.begin() + size_t(i + 1) * q_dim);
            CHECK(row == contiguous);
            std::vector<double> want;
            for (int h = 0; h < shape.heads; ++h) {
                const std::vector<double> head = attention_by_formula(
                    &q[size_t(i) * q_dim + h * shape.head_dim], keys[s], values[s],
                    attention_start(pos, window), pos, h / (shape.heads / shape.kv_heads), shape);
                want.insert(want.end(), head.begin(), head.end());
            }
            CHECK(relative_error(row, want) < 1e-5);
        }
    }
}

TEST_CASE("a GEMM gives each token the same bits whatever the batch around it") {
    // What makes a step's rows independent of each other (src/cpu/forward.cpp, step).
    std::mt19937 rng(590);
    const int rows = 70, cols = 512;
    std::vector<TestMatrix> matrices;
    for (DType dtype : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0})
        matrices.push_back(make_matrix(rows, cols, dtype, rng));
    for (DType dtype : {DType::Q4_K, DType::Q6_K, DType::Q5_0})
        matrices.push_back(make_block_matrix(rows, cols, dtype, rng));
    // Batches of 13 and of 8 tokens against parts of them: block-type weights meet up to 8
    // tokens through the matvec (cpu/kernels.h, gemm), Q8 and Q4 without a VNNI GEMM fewer
    // than 16, the same in every batch on each side.
    const std::vector<float> x = random_floats(size_t(13) * cols, rng);
    for (cpu::SimdLevel level : kLevels) {
        if (level > cpu::detect_simd_level()) continue;
        SimdLevelScope scope(level);
        for (const TestMatrix& m : matrices)
            for (auto [batch, parts] :
                 {std::pair{13, std::vector<std::pair<int, int>>{{0, 9}, {1, 12}, {4, 9}}},
                  std::pair{8, std::vector<std::pair<int, int>>{{0, 1}, {3, 2}, {1, 7}}}}) {
                INFO(cpu::simd_level_name(level)
                     << " " << dtype_name(m.matrix.dtype) << " batch " << batch);
                std::vector<float> together(size_t(batch) * rows);
                cpu::gemm(together.data(), x.data(), batch, m.matrix);
                for (auto [first, size] : parts) {
                    std::vector<float> part(size_t(size) * rows);
                    cpu::gemm(part.data(), &x[size_t(first) * cols], size, m.matrix);
                    CHECK(std::equal(part.begin(), part.end(),
                                     together.begin() + size_t(first) * rows));
                }
            }
    }
}

namespace {

// A model file with random weights, removed with the object.
struct SyntheticModel {
    std::string path;
    json config;
    ~SyntheticModel() { std::remove(path.c_str()); }
};

// Writes a small model of `family` ("llama", "qwen3" or "gemma3") with f32 weights.
std::unique_ptr<SyntheticModel> write_model(const std::string& family, std::mt19937& rng) {
    auto model = std::make_unique<SyntheticModel>();
    const int dim = 64, hidden = 96, vocab = 67;
    const bool gemma = family == "gemma3";
    const int layers = gemma ? 3 : 2, heads = 4, kv_heads = gemma ? 1 : 2,
              head_dim = gemma ? 32 : 16;
    json& c = model->config;
    c = {{"architecture", family},
         {"dim", dim},
         {"hidden_dim", hidden},
         {"layers", layers},
         {"heads", heads},
         {"kv_heads", kv_heads},
         {"head_dim", head_dim},
         {"vocab_size", vocab},
         {"max_context", 128},
         {"rope_theta", gemma ? 1000000.0 : 10000.0},
         {"norm_eps", 1e-6},
         {"tied_embeddings", family != "qwen3"},
         {"bos_id", 1},
         {"eos_ids", {2}},
         {"weight_dtype", "F32"}};
    if (family == "qwen3") c["qk_norm"] = true;
    if (gemma) {
        c["activation"] = "gelu_tanh";
        c["embedding_scale"] = 8.0;
        c["post_norms"] = true;
        c["sliding_window"] = 7;
        c["layer_types"] = {"sliding", "full", "sliding"};
        c["rope_theta_local"] = 10000.0;
        c["attention_scale"] = 0.2;
    }
    json header;
    std::string data;
    auto add = [&](const std::string& name, std::vector<int64_t> shape, float center,
                   float spread) {
        size_t count = 1;
        for (int64_t d : shape) count *= size_t(d);
        const size_t begin = data.size();
        for (float v : random_floats(count, rng, spread)) {
            v += center;
            data.append(reinterpret_cast<const char*>(&v), sizeof v);
        }
        header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, data.size()}}};
    };
    const int q_dim = heads * head_dim, kv_dim = kv_heads * head_dim;
    add("token_embedding", {vocab, dim}, 0, 1);
    for (int l = 0; l < layers; ++l) {
        const std::string p = "layers." + std::to_string(l) + ".";
        add(p + "attn_norm", {dim}, 1, 0.2f);
        add(p + "wq", {q_dim, dim}, 0, 0.25f);
        add(p + "wk", {kv_dim, dim}, 0, 0.25f);
        add(p + "wv", {kv_dim, dim}, 0, 0.25f);
        add(p + "wo", {dim, q_dim}, 0, 0.2f);
        if (family == "qwen3" || gemma) {
            add(p + "q_norm", {head_dim}, 1, 0.2f);
            add(p + "k_norm", {head_dim}, 1, 0.2f);
        }
        add(p + "ffn_norm", {dim}, 1, 0.2f);
        add(p + "w1", {hidden, dim}, 0, 0.25f);
        add(p + "w3", {hidden, dim}, 0, 0.25f);
        add(p + "w2", {dim, hidden}, 0, 0.2f);
        if (gemma) {
            add(p + "post_attn_norm", {dim}, 1, 0.2f);
            add(p + "post_ffn_norm", {dim}, 1, 0.2f);
        }
    }
    add("final_norm", {dim}, 1, 0.2f);
    if (family == "qwen3") add("output", {vocab, dim}, 0, 0.25f);
    if (gemma) c["qk_norm"] = true;
    header["__metadata__"] = {{"barellm.format", "1"}, {"barellm.config", c.dump()}};
    std::string text = header.dump();
    text.resize((text.size() + 7) / 8 * 8, ' ');
    model->path = "/tmp/barellm_test_" + std::to_string(getpid()) + "_paged_" + family;
    std::ofstream out(model->path, std::ios::binary);
    const uint64_t length = text.size();
    out.write(reinterpret_cast<const char*>(&length), sizeof length);
    out << text << data;
    return model;
}

// One sequence of a step plan: its tokens, its blocks, and how many of its tokens each step
// runs (0: none that step).
struct PlannedSequence {
    std::vector<int> tokens;
    std::vector<int> block_table;
    std::vector<int> chunks;
    bool logits = true;  // false: no row of the sequence wants its logits
};

// Logits of a plan's rows: [sequence][position], empty where the row did not ask for them.
using PlanLogits = std::vector<std::vector<std::vector<float>>>;

// Runs the plan's steps on `backend`: step i holds chunk i of every sequence, the rows of the
// sequences interleaved at random (each sequence's in increasing positions); a row wants its
// logits at random, and always at the end of its chunk (if its sequence wants any).
PlanLogits run_plan(Backend& backend, const std::vector<PlannedSequence>& plan, std::mt19937& rng) {
    const int vocab = 67;
    PlanLogits logits(plan.size());
    std::vector<int> next(plan.size(), 0);
    for (size_t s = 0; s < plan.size(); ++s) logits[s].resize(plan[s].tokens.size());
    for (size_t step = 0;; ++step) {
        std::vector<int> owners;  // the sequence of each row, shuffled
        for (size_t s = 0; s < plan.size(); ++s)
            if (step < plan[s].chunks.size()) owners.insert(owners.end(), plan[s].chunks[step], s);
        if (owners.empty() && std::all_of(plan.begin(), plan.end(), [&](const PlannedSequence& p) {
                return step >= p.chunks.size();
            }))
            break;
        if (owners.empty()) continue;
        std::shuffle(owners.begin(), owners.end(), rng);
        std::vector<StepRow> rows;
        std::vector<int> remaining(plan.size(), 0);
        for (int s : owners) ++remaining[s];
        for (int s : owners) {
            const int pos = next[s]++;
            const bool last = --remaining[s] == 0;
            rows.push_back({plan[s].tokens[pos], pos, plan[s].block_table.data(),
                            plan[s].logits && (last || rng() % 2 == 0)});
        }
        const float* out = backend.step(rows.data(), int(rows.size()));
        for (size_t r = 0, wanting = 0; r < rows.size(); ++r) {
            if (!rows[r].wants_logits) continue;
            logits[owners[r]][rows[r].pos].assign(out + wanting * vocab,
                                                  out + (wanting + 1) * vocab);
            ++wanting;
        }
    }
    return logits;
}

// max |got - want| / max |want|
double worst_difference(const float* got, const float* want, int n) {
    double difference = 0, largest = 0;
    for (int i = 0; i < n; ++i) {
        difference = std::max(difference, double(std::fabs(got[i] - want[i])));
        largest = std::max(largest, double(std::fabs(want[i])));
    }
    return difference / largest;
}

std::vector<int> random_tokens(int count, std::mt19937& rng) {
    std::vector<int> tokens(count);
    for (int& t : tokens) t = int(rng() % 67);
    return tokens;
}

BackendOptions paged_options(int blocks, int block_size, KvType kv_type) {
    BackendOptions options;
    options.context = 128;
    options.kv_type = kv_type;
    options.kv_blocks = blocks;
    options.kv_block_size = block_size;
    return options;
}

}  // namespace

TEST_CASE("a step of interleaved sequences equals each sequence run alone") {
    const std::string family = GENERATE("llama", "qwen3", "gemma3");
    const KvType kv_type = GENERATE(KvType::F32, KvType::F16);
    std::mt19937 rng(5900);
    const auto file = write_model(family, rng);
    const Model model = Model::load(file->path);
    const int block_size = 16, blocks = 24;
    // Three sequences: one prefilled in a chunk of 30 while another decodes, one joining
    // late with chunks of 4 and 5, then everyone decoding one token a step.
    std::vector<PlannedSequence> plan(3);
    plan[0].chunks = {30, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    plan[1].chunks = {1, 15, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    plan[2].chunks = {0, 4, 5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    const std::vector<int> free_blocks = random_blocks(blocks, blocks, rng);
    int next_free = 0;
    for (PlannedSequence& p : plan) {
        const int length = std::accumulate(p.chunks.begin(), p.chunks.end(), 0);
        p.tokens = random_tokens(length, rng);
        for (int b = 0; b < (length + block_size - 1) / block_size; ++b)
            p.block_table.push_back(free_blocks.at(next_free++));
    }
    auto paged = make_cpu_backend(model, paged_options(blocks, block_size, kv_type));
    const PlanLogits stepped = run_plan(*paged, plan, rng);
    // The paths sum in different orders (attention per row here, in tiles in prefill; GEMMs
    // here, matvecs in forward): f32 rounding apart, which with an f16 cache can put a key
    // element one f16 step (2^-11 relative) away.
    const double tolerance = kv_type == KvType::F32 ? 1e-5 : 1e-4;

    for (size_t s = 0; s < plan.size(); ++s) {
        const std::vector<int>& tokens = plan[s].tokens;
        const int n = int(tokens.size()), vocab = model.config.vocab_size;
        BackendOptions options{128, kv_type};
        options.all_logits = true;
        auto alone = make_cpu_backend(model, options);
        const float* prefilled = alone->prefill(tokens.data(), n, 0, true);
        const std::vector<float> prefill_logits(prefilled, prefilled + size_t(n) * vocab);
        auto decoding = make_cpu_backend(model, BackendOptions{128, kv_type});
        int compared = 0;
        for (int pos = 0; pos < n; ++pos) {
            const float* forward_logits = decoding->forward(tokens[pos], pos);
            const std::vector<float>& got = stepped[s][pos];
            if (got.empty()) continue;
            INFO(family << " kv " << (kv_type == KvType::F32 ? "f32" : "f16") << " sequence " << s
                        << " position " << pos);
            CHECK(worst_difference(got.data(), &prefill_logits[size_t(pos) * vocab], vocab) <
                  tolerance);
            CHECK(worst_difference(got.data(), forward_logits, vocab) < tolerance);
            ++compared;
        }
        CHECK(compared >= 12);
    }
}

TEST_CASE("a row's logits do not depend on the rows that share its step") {
    const std::string family = GENERATE("llama", "qwen3", "gemma3");
    const DType dtype = GENERATE(DType::F32, DType::Q8_0, DType::F16);
    std::mt19937 rng(59000);
    const auto file = write_model(family, rng);
    const Model source = Model::load(file->path);
    const auto copy = copy_model(source, dtype);
    const Model& model = copy->model;
    for (cpu::SimdLevel level : kLevels) {
        if (level > cpu::detect_simd_level()) continue;
        SimdLevelScope scope(level);
        std::vector<PlannedSequence> together(3), beside(2);
        // Q8 weights without a VNNI GEMM (AVX-512 VNNI's, AVX-VNNI's) meet fewer than 16 rows
        // through the AVX2 matvec, more through a GEMM (cpu/kernels.h, gemm): there every step
        // stays under 16 rows. The VNNI GEMMs give a row the same bits from tiles or panels.
        const bool matvec_below_16 =
            dtype == DType::Q8_0 &&
            ((level == cpu::SimdLevel::Avx2 && !cpu::cpu_has_avx_vnni()) ||
             (level == cpu::SimdLevel::Avx512 && !cpu::cpu_has_avx512_vnni()));
        together[0].chunks = {matvec_below_16 ? 11 : 20, 1, 1, 1, 1, 1};
        together[1].chunks = {3, 6, 1, 1, 1, 1};
        together[2].chunks = {1, 1, 1, 9, 1, 1};
        const int block_size = 32, blocks = 12;
        const std::vector<int> free_blocks = random_blocks(blocks, blocks, rng);
        int next_free = 0;
        for (PlannedSequence& p : together) {
            const int length = std::accumulate(p.chunks.begin(), p.chunks.end(), 0);
            p.tokens = random_tokens(length, rng);
            for (int b = 0; b < (length + block_size - 1) / block_size; ++b)
                p.block_table.push_back(free_blocks.at(next_free++));
        }
        auto batched = make_cpu_backend(model, paged_options(blocks, block_size, KvType::F16));
        const PlanLogits batched_logits = run_plan(*batched, together, rng);
        // Each sequence again, one token a step, beside a different sequence that wants no
        // logits (steps of two rows, one wanting logits; one row alone runs forward's kernels,
        // below), in other blocks.
        for (size_t s = 0; s < together.size(); ++s) {
            const int length = int(together[s].tokens.size());
            beside[0].tokens = together[s].tokens;
            beside[1].tokens = random_tokens(length, rng);
            for (int i = 0; i < 2; ++i) {
                beside[i].chunks.assign(length, 1);
                beside[i].block_table = {free_blocks.at((next_free + i) % blocks)};
            }
            beside[1].logits = false;
            auto other = make_cpu_backend(model, paged_options(blocks, block_size, KvType::F16));
            const PlanLogits beside_logits = run_plan(*other, beside, rng);
            for (int pos = 0; pos < length; ++pos) {
                INFO(family << " " << dtype_name(dtype) << " " << cpu::simd_level_name(level)
                            << " sequence " << s << " position " << pos);
                if (!batched_logits[s][pos].empty() && !beside_logits[0][pos].empty())
                    CHECK(batched_logits[s][pos] == beside_logits[0][pos]);
            }
        }
    }
}

TEST_CASE("steps of one row give forward's logits bit for bit") {
    const std::string family = GENERATE("llama", "gemma3");
    const DType dtype = GENERATE(DType::F32, DType::Q8_0, DType::BF16);
    std::mt19937 rng(59001);
    const auto file = write_model(family, rng);
    const Model source = Model::load(file->path);
    const auto copy = copy_model(source, dtype);
    const Model& model = copy->model;
    const std::vector<int> tokens = random_tokens(40, rng);
    const std::vector<int> table = {3, 0, 2};
    for (cpu::SimdLevel level : kLevels) {
        if (level > cpu::detect_simd_level()) continue;
        SimdLevelScope scope(level);
        auto paged = make_cpu_backend(model, paged_options(4, 16, KvType::F16));
        auto decoding = make_cpu_backend(model, BackendOptions{128, KvType::F16});
        for (int pos = 0; pos < int(tokens.size()); ++pos) {
            const StepRow row{tokens[pos], pos, table.data(), true};
            const float* stepped = paged->step(&row, 1);
            const float* forward = decoding->forward(tokens[pos], pos);
            INFO(family << " " << dtype_name(dtype) << " " << cpu::simd_level_name(level)
                        << " position " << pos);
            CHECK(std::equal(stepped, stepped + model.config.vocab_size, forward));
        }
    }
}

TEST_CASE("a step reads a block copied with copy_kv_block as it read the original") {
    std::mt19937 rng(5901);
    const auto file = write_model("llama", rng);
    const Model model = Model::load(file->path);
    const int block_size = 16, blocks = 8, length = 40;
    auto backend = make_cpu_backend(model, paged_options(blocks, block_size, KvType::F16));
    const std::vector<int> tokens = random_tokens(length + 1, rng);
    const std::vector<int> table = {5, 2, 7}, copied = {0, 6, 3}, intruder = {5, 2, 7};
    std::vector<StepRow> rows;
    for (int pos = 0; pos < length; ++pos) rows.push_back({tokens[pos], pos, table.data(), false});
    backend->step(rows.data(), length);
    for (int b = 0; b < 3; ++b) backend->copy_kv_block(table[b], copied[b]);
    // The original blocks overwritten by another sequence, then the next token read through
    // the copies, and through the originals on a backend that never copied.
    const std::vector<int> other = random_tokens(length, rng);
    for (int pos = 0; pos < length; ++pos) rows[pos] = {other[pos], pos, intruder.data(), false};
    backend->step(rows.data(), length);
    const StepRow next{tokens[length], length, copied.data(), true};
    const float* got = backend->step(&next, 1);
    const std::vector<float> through_copy(got, got + model.config.vocab_size);

    auto reference = make_cpu_backend(model, paged_options(blocks, block_size, KvType::F16));
    for (int pos = 0; pos < length; ++pos) rows[pos] = {tokens[pos], pos, table.data(), false};
    reference->step(rows.data(), length);
    const StepRow next_original{tokens[length], length, table.data(), true};
    const float* want = reference->step(&next_original, 1);
    CHECK(through_copy == std::vector<float>(want, want + model.config.vocab_size));
}

TEST_CASE("the paged backend refuses what it cannot run with one clear error") {
    std::mt19937 rng(5902);
    const auto file = write_model("llama", rng);
    const Model model = Model::load(file->path);
    auto paged = make_cpu_backend(model, paged_options(4, 16, KvType::F16));
    const int token = 3;
    CHECK_THROWS_WITH(paged->forward(token, 0), Catch::Contains("paged KV cache"));
    CHECK_THROWS_WITH(paged->prefill(&token, 1, 0, false), Catch::Contains("paged KV cache"));
    const std::vector<int> table = {1, 9};
    const StepRow outside{token, 20, table.data(), true};
    CHECK_THROWS_WITH(paged->step(&outside, 1), Catch::Contains("block 9"));
    const StepRow too_far{token, 128, table.data(), true};
    CHECK_THROWS_AS(paged->step(&too_far, 1), Error);
    const StepRow bad_token{67, 0, table.data(), true};
    CHECK_THROWS_AS(paged->step(&bad_token, 1), Error);
    const StepRow backwards[2] = {{token, 1, table.data(), true}, {token, 0, table.data(), true}};
    CHECK_THROWS_WITH(paged->step(backwards, 2), Catch::Contains("increasing positions"));
    CHECK_THROWS_WITH(paged->copy_kv_block(0, 4), Catch::Contains("block 4"));
    auto contiguous = make_cpu_backend(model, BackendOptions{16, KvType::F16});
    const StepRow row{token, 0, table.data(), true};
    CHECK_THROWS_WITH(contiguous->step(&row, 1), Catch::Contains("kv_blocks"));
    CHECK_THROWS_WITH(contiguous->copy_kv_block(0, 1), Catch::Contains("kv_blocks"));
}
