// The CPU forward pass: tokens through the Llama transformer, top to bottom, with what the
// other families change where the model has it: Qwen2's q/k/v biases, Qwen3's per-head q/k
// norms, and Gemma's scaled embedding, norms of the sub-blocks' outputs, GeGLU, sliding
// layers (Gemma 3's with their own RoPE base), and attention scale (Gemma's norms, x · (1 + w),
// are plain RMSNorms here: the weight file holds the multipliers 1 + w), Gemma 2's soft-capped
// attention scores and logits; Mixtral's, Qwen3-MoE's and gpt-oss's
// sparse layers, whose feed-forward is a mixture of experts (cpu/moe.h), and gpt-oss's
// attention sinks.
// `forward` runs one token (decode); `prefill` runs a batch of tokens of one sequence as
// matrices; `step` (the server's) runs a batch of rows of many sequences as matrices, over the
// paged KV cache. prefill and step share the layers (run_layers): only where the keys and
// values are written and read differs.
#include <algorithm>
#include <vector>

#include "backend.h"
#include "commands/bench.h"
#include "cpu/kernels.h"
#include "cpu/moe.h"
#include "cpu/resident_weights.h"
#include "util/error.h"
#include "util/memory.h"

namespace barellm {

namespace {

constexpr int kMaxBatch = 512;     // prefill processes longer prompts in chunks of this size
constexpr size_t kSwigluCost = 8;  // one SiLU (an exp and a division) in multiply-adds
constexpr size_t kGegluCost = 12;  // one tanh-approximated GELU (SiLU's and a cubic)

// Every activation buffer and the KV cache, allocated once. Decode uses batch 1;
// prefill and step use up to kMaxBatch rows (B below). The KV cache is the contiguous one
// (run, chat, ppl, bench) or, with BackendOptions::kv_blocks, the paged one (the server).
struct InferenceState {
    std::vector<float> x;              // [B, dim]           residual stream
    std::vector<float> xb;             // [B, dim]           normed input of a sub-block
    std::vector<float> q;              // [B, heads * head_dim]
    std::vector<float> k;              // [B, kv_heads * head_dim]
    std::vector<float> v;              // [B, kv_heads * head_dim]
    std::vector<float> att;            // [B, heads * head_dim]  attention output
    std::vector<float> scores;         // [heads, context]   decode attention scratch
    std::vector<float> proj;           // [B, dim]           output of wo or w2
    std::vector<float> gate;           // [B, hidden_dim]    w1 x, then act(w1 x) * w3 x
    std::vector<float> up;             // [B, hidden_dim]    w3 x
    std::vector<float> logits;         // [vocab_size]       of the last token
    std::vector<uint8_t> key_cache;    // [layers, context, kv_dim] of kv_type,
    std::vector<uint8_t> value_cache;  //   or [layers, kv_blocks, block_size, kv_dim]
    std::vector<float> rope;           // [head_dim]  rope_table: frequencies, magnitudes
    std::vector<float> rope_local;     // [head_dim] with rope_theta_local, else empty
};

class CpuBackend : public Backend {
public:
    CpuBackend(const Model& model, const BackendOptions& options)
        : model_(model),
          context_(options.context),
          kv_type_(options.kv_type),
          kv_blocks_(options.kv_blocks),
          kv_block_size_(options.kv_block_size),
          max_batch_(std::min(options.context, kMaxBatch)),
          // The layer and output matrices copied to 2 MiB pages; Q8 and Q4 ones in tiles of
          // 16 rows where the AVX-512 VNNI kernels will read them (cpu/resident_weights.h).
          weights_(cpu::resident_weights(model)),
          experts_(model.config) {
        const Config& c = model.config;
        if (kv_blocks_ < 0 || (kv_blocks_ > 0 && kv_block_size_ < 1))
            throw Error("the paged KV cache needs kv_blocks >= 0 and kv_block_size >= 1");
        const size_t cache_positions =
            paged() ? size_t(kv_blocks_) * kv_block_size_ : size_t(context_);
        const size_t cache_bytes =
            size_t(c.layers) * cache_positions * c.kv_dim() * kv_element_bytes(kv_type_);
        const size_t B = max_batch_;
        const size_t decode_scores = paged() ? 0 : size_t(c.heads) * context_;  // forward's
        const size_t activation_floats =
            B * (4 * size_t(c.dim) + 2 * c.q_dim() + 2 * c.kv_dim() + 2 * size_t(c.hidden_dim)) +
            decode_scores + c.vocab_size + cpu::MixtureOfExperts::buffer_floats(c, max_batch_);
        const size_t all_logits_floats = options.all_logits ? size_t(context_) * c.vocab_size : 0;
        const std::string what =
            paged() ? "the paged KV cache (" + std::to_string(kv_blocks_) + " blocks of " +
                          std::to_string(kv_block_size_) + " positions) and activations"
            : options.all_logits ? "the KV cache, activations and logits of every position"
                                 : "the KV cache and activations";
        require_memory(2 * cache_bytes + (activation_floats + all_logits_floats) * sizeof(float),
                       what + " for a context of " + std::to_string(context_));
        InferenceState& s = state_;
        experts_.reserve(max_batch_);
        s.x.resize(B * c.dim);
        s.xb.resize(B * c.dim);
        s.q.resize(B * c.q_dim());
        s.k.resize(B * c.kv_dim());
        s.v.resize(B * c.kv_dim());
        s.att.resize(B * c.q_dim());
        s.scores.resize(decode_scores);
        s.proj.resize(B * c.dim);
        s.gate.resize(B * c.hidden_dim);
        s.up.resize(B * c.hidden_dim);
        s.logits.resize(c.vocab_size);
        s.key_cache.resize(cache_bytes);
        s.value_cache.resize(cache_bytes);
        s.rope = rope_table(c, context_);
        if (c.rope_theta_local > 0) s.rope_local = rope_local_table(c);
        all_logits_.resize(all_logits_floats);
    }

    std::string name() const override { return "cpu"; }
    int max_batch() const override { return max_batch_; }

    size_t kv_bytes_read(int pos) const override {
        const Config& c = model_.config;
        size_t positions = 0;  // summed over the layers
        for (int l = 0; l < c.layers; ++l)
            positions += pos + 1 - attention_start(pos, c.layer_window(l));
        return 2 * positions * c.kv_dim() * kv_element_bytes(kv_type_);
    }

    double measure_bandwidth_gbps() override { return measure_read_bandwidth(); }

    const float* forward(int token, int pos) override {
        const Config& c = model_.config;
        InferenceState& s = state_;
        require_contiguous_cache("forward");
        check_tokens(c, &token, 1, pos, context_);
        // x = the token's row of the embedding table (Gemma: times √dim)
        cpu::embedding_row(s.x.data(), model_.token_embedding, token);
        scale_embedding(s.x.data(), 1);

        for (int l = 0; l < c.layers; ++l) {
            const LayerWeights& w = weights_.layers[l];
            const float* layer_rope = layer_rope_table(l);
            // Attention: x += wo · attention(rope(wq · norm(x)), rope(wk · norm(x)), wv · norm(x))
            //   (Qwen2: + bq, bk, bv after the projections; Qwen3 and Gemma 3: each head of q and
            //    k RMS-normed before RoPE; with attention_bias: + bo after wo; Gemma: wo's
            //    output RMS-normed before the add, and scores scaled by attention_scale, not
            //    1/√head_dim (Gemma 2: then soft-capped, cap · tanh(score / cap));
            //    sliding layers attend to the last `window` positions, and Gemma 3's
            //    rotate with their own RoPE base; gpt-oss: each head's softmax has one more
            //    logit, its sink, which weighs no value)
            cpu::rmsnorm(s.xb.data(), s.x.data(), w.attn_norm, c.dim, c.norm_eps);
            cpu::matvec_many({{s.q.data(), s.xb.data(), &w.wq},
                              {s.k.data(), s.xb.data(), &w.wk},
                              {s.v.data(), s.xb.data(), &w.wv}});
            add_bias(s.q.data(), w.bq, c.q_dim());
            add_bias(s.k.data(), w.bk, c.kv_dim());
            add_bias(s.v.data(), w.bv, c.kv_dim());
            rmsnorm_heads(s.q.data(), w.q_norm, c.heads);
            rmsnorm_heads(s.k.data(), w.k_norm, c.kv_heads);
            cpu::rope(s.q.data(), c.heads, c.head_dim, pos, layer_rope);
            cpu::rope(s.k.data(), c.kv_heads, c.head_dim, pos, layer_rope);
            cpu::kv_store(cache_row(s.key_cache, l, pos), s.k.data(), c.kv_dim(), kv_type_);
            cpu::kv_store(cache_row(s.value_cache, l, pos), s.v.data(), c.kv_dim(), kv_type_);
            cpu::attention(s.att.data(), s.q.data(), pos, cache_row(s.key_cache, l, 0),
                           cache_row(s.value_cache, l, 0), s.scores.data(), attention_shape(l),
                           kv_type_);
            cpu::matvec(s.proj.data(), s.att.data(), w.wo);
            add_bias(s.proj.data(), w.bo, c.dim);
            post_norm(s.proj.data(), w.post_attn_norm, 1);
            for (int i = 0; i < c.dim; ++i) s.x[i] += s.proj[i];

            // Feed-forward: x += w2 · (act(w1 · norm(x)) * (w3 · norm(x)))
            //   (act: silu, SwiGLU; Gemma: gelu_tanh, GeGLU, and w2's output RMS-normed
            //    before the add; a sparse layer: the router picks k experts, and the sum of
            //    their feed-forwards, weighted by the router, takes the place of w1, w3, w2;
            //    gpt-oss: the router and the experts add biases, and act is a clamped SwiGLU)
            cpu::rmsnorm(s.xb.data(), s.x.data(), w.ffn_norm, c.dim, c.norm_eps);
            if (c.is_sparse(l))
                experts_.decode(s.proj.data(), s.xb.data(), w);
            else
                dense_ffn(w);
            post_norm(s.proj.data(), w.post_ffn_norm, 1);
            for (int i = 0; i < c.dim; ++i) s.x[i] += s.proj[i];
        }

        // logits = output · norm(x)   (Gemma 2: soft-capped, cap · tanh(logits / cap))
        cpu::rmsnorm(s.x.data(), s.x.data(), model_.final_norm, c.dim, c.norm_eps);
        cpu::matvec(s.logits.data(), s.x.data(), weights_.output);
        softcap_logits(s.logits.data(), 1);
        return s.logits.data();
    }

    const float* prefill(const int* tokens, int count, int first_pos, bool all_logits) override {
        require_contiguous_cache("prefill");
        check_tokens(model_.config, tokens, count, first_pos, context_);
        if (all_logits && size_t(count) * model_.config.vocab_size > all_logits_.size())
            throw Error("prefill: every position's logits need BackendOptions::all_logits");
        const float* last = nullptr;
        for (int start = 0; start < count; start += max_batch_) {
            const int batch = std::min(max_batch_, count - start);
            float* logits_out = all_logits
                                    ? all_logits_.data() + size_t(start) * model_.config.vocab_size
                                    : nullptr;
            last = prefill_batch(tokens + start, batch, first_pos + start, logits_out);
        }
        return all_logits ? all_logits_.data() : last;
    }

    // Row independence: in a step of two rows or more, a row's logits depend only on its
    // token, its position and its own sequence's keys and values, never on which rows share
    // the step or how many, or how many want logits: every kernel computes each row on its
    // own in a fixed order (the GEMMs' per-token sums, the element-wise steps,
    // attention_paged per (row, head)), so the bits are the same in any batch, for every
    // weight type (block types: in any batch on the same side of 8 rows; Q8 and Q4 on AVX2
    // without VNNI: of 16; cpu::gemm). A step
    // of one row runs forward's kernels (matvecs, the same attention sums) and gives forward's
    // bits; they differ from a batched row's by rounding (a matvec and a GEMM sum in
    // different orders). Returns nullptr when no row wants logits.
    const float* step(const StepRow* rows, int count) override {
        const Config& c = model_.config;
        InferenceState& s = state_;
        if (!paged()) throw Error("step needs the paged KV cache (BackendOptions::kv_blocks)");
        check_step_rows(rows, count);
        for (int b = 0; b < count; ++b)
            cpu::embedding_row(&s.x[size_t(b) * c.dim], model_.token_embedding, rows[b].token);
        scale_embedding(s.x.data(), count);
        const BatchPlaces places{rows, 0};
        run_layers(count, places);

        // logits = output · norm(x), for the rows that want them, gathered into one GEMM.
        int wanting = 0;
        for (int b = 0; b < count; ++b)
            if (rows[b].wants_logits)
                std::copy_n(&s.x[size_t(b) * c.dim], c.dim, &s.xb[size_t(wanting++) * c.dim]);
        if (wanting == 0) return nullptr;
        rmsnorm_rows(s.xb.data(), s.xb.data(), model_.final_norm, wanting);
        const size_t logits_floats = size_t(wanting) * c.vocab_size;
        if (step_logits_.size() < logits_floats) {
            require_memory((logits_floats - step_logits_.size()) * sizeof(float),
                           "the logits of " + std::to_string(wanting) + " rows");
            step_logits_.resize(logits_floats);
        }
        // The GEMM for a step of several rows even when one wants logits: its bits then do not
        // depend on how many do.
        if (count > 1)
            cpu::gemm(step_logits_.data(), s.xb.data(), wanting, weights_.output);
        else
            multiply(s.xb.data(), 1, {{step_logits_.data(), &weights_.output}});
        softcap_logits(step_logits_.data(), wanting);
        return step_logits_.data();
    }

    void copy_kv_block(int from, int to) override {
        if (!paged())
            throw Error("copy_kv_block needs the paged KV cache (BackendOptions::kv_blocks)");
        if (from < 0 || from >= kv_blocks_ || to < 0 || to >= kv_blocks_)
            throw Error("copy_kv_block: block " +
                        std::to_string(from < 0 || from >= kv_blocks_ ? from : to) +
                        " is outside the " + std::to_string(kv_blocks_) + " blocks");
        const size_t block_bytes =
            size_t(kv_block_size_) * model_.config.kv_dim() * kv_element_bytes(kv_type_);
        for (int l = 0; l < model_.config.layers; ++l)
            for (std::vector<uint8_t>* cache : {&state_.key_cache, &state_.value_cache}) {
                const uint8_t* source = paged_slot(*cache, l, size_t(from) * kv_block_size_);
                std::copy_n(source, block_bytes,
                            paged_slot(*cache, l, size_t(to) * kv_block_size_));
            }
    }

private:
    // Where the rows of a batch keep their keys and values, the one thing prefill and step
    // do differently: prefill's rows are tokens of one sequence at positions first_pos.. of
    // the contiguous cache; a step's rows are each at its own position of its own sequence,
    // in the paged cache through the row's block table.
    struct BatchPlaces {
        const StepRow* step_rows;  // the step's rows; nullptr for prefill
        int first_pos;             // prefill's first position
        int pos(int b) const { return step_rows ? step_rows[b].pos : first_pos + b; }
    };

    // One batch of B tokens at positions first_pos.., the same math as `forward` on matrices.
    // Writes every row's logits to logits_out [B, vocab] if given; returns the last row's.
    const float* prefill_batch(const int* tokens, int B, int first_pos, float* logits_out) {
        const Config& c = model_.config;
        InferenceState& s = state_;
        for (int b = 0; b < B; ++b)
            cpu::embedding_row(&s.x[size_t(b) * c.dim], model_.token_embedding, tokens[b]);
        scale_embedding(s.x.data(), B);
        run_layers(B, BatchPlaces{nullptr, first_pos});

        if (logits_out) {
            rmsnorm_rows(s.x.data(), s.x.data(), model_.final_norm, B);
            cpu::gemm(logits_out, s.x.data(), B, weights_.output);
            softcap_logits(logits_out, B);
            return logits_out + size_t(B - 1) * c.vocab_size;
        }
        float* last_x = &s.x[size_t(B - 1) * c.dim];
        cpu::rmsnorm(last_x, last_x, model_.final_norm, c.dim, c.norm_eps);
        cpu::matvec(s.logits.data(), last_x, weights_.output);
        softcap_logits(s.logits.data(), 1);
        return s.logits.data();
    }

    // Every layer over the residual stream x [B, dim] of a batch: the math of `forward`
    // (its comments say what each step is) on matrices, the weights read once for all rows.
    void run_layers(int B, const BatchPlaces& places) {
        const Config& c = model_.config;
        InferenceState& s = state_;
        for (int l = 0; l < c.layers; ++l) {
            const LayerWeights& w = weights_.layers[l];
            const float* layer_rope = layer_rope_table(l);
            rmsnorm_rows(s.xb.data(), s.x.data(), w.attn_norm, B);
            multiply(s.xb.data(), B,
                     {{s.q.data(), &w.wq}, {s.k.data(), &w.wk}, {s.v.data(), &w.wv}});
            cpu::for_each_row(B, c.q_dim() + c.kv_dim(), [&](int b) {
                const int pos = places.pos(b);
                float* q_row = &s.q[size_t(b) * c.q_dim()];
                float* k_row = &s.k[size_t(b) * c.kv_dim()];
                float* v_row = &s.v[size_t(b) * c.kv_dim()];
                add_bias(q_row, w.bq, c.q_dim());
                add_bias(k_row, w.bk, c.kv_dim());
                add_bias(v_row, w.bv, c.kv_dim());
                rmsnorm_heads(q_row, w.q_norm, c.heads);
                rmsnorm_heads(k_row, w.k_norm, c.kv_heads);
                cpu::rope(q_row, c.heads, c.head_dim, pos, layer_rope);
                cpu::rope(k_row, c.kv_heads, c.head_dim, pos, layer_rope);
                cpu::kv_store(kv_slot(s.key_cache, l, places, b), k_row, c.kv_dim(), kv_type_);
                cpu::kv_store(kv_slot(s.value_cache, l, places, b), v_row, c.kv_dim(), kv_type_);
            });
            attend(l, B, places);
            multiply(s.att.data(), B, {{s.proj.data(), &w.wo}});
            if (w.bo)
                cpu::for_each_row(
                    B, c.dim, [&](int b) { add_bias(&s.proj[size_t(b) * c.dim], w.bo, c.dim); });
            post_norm(s.proj.data(), w.post_attn_norm, B);
            add_rows(s.x.data(), s.proj.data(), B);

            rmsnorm_rows(s.xb.data(), s.x.data(), w.ffn_norm, B);
            if (c.is_sparse(l))
                experts_.prefill(s.proj.data(), s.xb.data(), B, w);
            else
                dense_ffn_rows(w, B);
            post_norm(s.proj.data(), w.post_ffn_norm, B);
            add_rows(s.x.data(), s.proj.data(), B);
        }
    }

    // att [B, q_dim] = each row's query q attending to its sequence's keys and values of layer
    // `layer`, those of this batch already stored.
    void attend(int layer, int B, const BatchPlaces& places) {
        InferenceState& s = state_;
        if (!places.step_rows) {
            cpu::attention_batch(
                s.att.data(), s.q.data(), B, places.first_pos, cache_row(s.key_cache, layer, 0),
                cache_row(s.value_cache, layer, 0), attention_shape(layer), kv_type_);
            return;
        }
        std::vector<int>& positions = step_positions_;
        std::vector<const int*>& block_tables = step_block_tables_;
        positions.resize(B);
        block_tables.resize(B);
        for (int b = 0; b < B; ++b) {
            positions[b] = places.step_rows[b].pos;
            block_tables[b] = places.step_rows[b].block_table;
        }
        const cpu::PagedKvLayer cache{paged_slot(s.key_cache, layer, 0),
                                      paged_slot(s.value_cache, layer, 0), kv_block_size_,
                                      kv_type_};
        cpu::attention_paged(s.att.data(), s.q.data(), B, positions.data(), block_tables.data(),
                             cache, attention_shape(layer));
    }

    // Where row b of a batch stores its key (or value) of layer `layer`.
    uint8_t* kv_slot(std::vector<uint8_t>& cache, int layer, const BatchPlaces& places,
                     int b) const {
        if (!places.step_rows) return cache_row(cache, layer, places.first_pos + b);
        const StepRow& row = places.step_rows[b];
        return paged_slot(cache, layer, paged_row(row.block_table, row.pos, kv_block_size_));
    }

    // Throws Error unless each row's token is in the vocabulary, its position inside the
    // context, and the blocks its attention reads inside the paged cache; rows of one sequence
    // (one block table) come in increasing positions.
    void check_step_rows(const StepRow* rows, int count) const {
        const Config& c = model_.config;
        if (count < 1 || count > max_batch_)
            throw Error("step: " + std::to_string(count) + " rows, expected 1 to " +
                        std::to_string(max_batch_));
        for (int b = 0; b < count; ++b) {
            const StepRow& row = rows[b];
            check_tokens(c, &row.token, 1, row.pos, context_);
            if (!row.block_table)
                throw Error("step: row " + std::to_string(b) + " has no block table");
            for (int p = 0; p <= row.pos; p += kv_block_size_) {
                const int block = row.block_table[p / kv_block_size_];
                if (block < 0 || block >= kv_blocks_)
                    throw Error("step: row " + std::to_string(b) + " names block " +
                                std::to_string(block) + ", outside the " +
                                std::to_string(kv_blocks_) + " blocks");
            }
            for (int earlier = 0; earlier < b; ++earlier)
                if (rows[earlier].block_table == row.block_table && rows[earlier].pos >= row.pos)
                    throw Error("step: rows of one sequence must come in increasing positions");
        }
    }

    // out = W · x for each of the B rows of x [B, cols] and each of the 1 to 3 outputs (one
    // input, e.g. q, k and v): the GEMM, which reads each weight once for every row; a single
    // row through forward's matvecs, faster than a GEMM of one row.
    static void multiply(const float* x, int B, std::initializer_list<cpu::BatchOutput> outputs) {
        if (B > 1) return cpu::gemm_many(x, B, outputs);
        const cpu::BatchOutput* o = outputs.begin();
        switch (outputs.size()) {
            case 1:
                return cpu::matvec(o[0].out, x, *o[0].w);
            case 2:
                return cpu::matvec_many({{o[0].out, x, o[0].w}, {o[1].out, x, o[1].w}});
            case 3:
                return cpu::matvec_many(
                    {{o[0].out, x, o[0].w}, {o[1].out, x, o[1].w}, {o[2].out, x, o[2].w}});
            default:
                throw Error("multiply: 1 to 3 outputs");
        }
    }

    // The dense feed-forward of one token: proj = w2 · (act(w1 · xb) * (w3 · xb)).
    void dense_ffn(const LayerWeights& w) {
        InferenceState& s = state_;
        cpu::matvec_many({{s.gate.data(), s.xb.data(), &w.w1}, {s.up.data(), s.xb.data(), &w.w3}});
        gated_activation(s.gate.data(), s.up.data());
        cpu::matvec(s.proj.data(), s.gate.data(), w.w2);
    }

    // The same for the B rows of xb, into the B rows of proj.
    void dense_ffn_rows(const LayerWeights& w, int B) {
        const Config& c = model_.config;
        InferenceState& s = state_;
        multiply(s.xb.data(), B, {{s.gate.data(), &w.w1}, {s.up.data(), &w.w3}});
        const size_t activation_cost =
            c.activation == Activation::GeluTanh ? kGegluCost : kSwigluCost;
        cpu::for_each_row(B, c.hidden_dim * activation_cost, [&](int b) {
            const size_t row = size_t(b) * c.hidden_dim;
            gated_activation(&s.gate[row], &s.up[row]);
        });
        multiply(s.gate.data(), B, {{s.proj.data(), &w.w2}});
    }

    // The element-wise steps of prefill and step, a row (token) per call, rows split across
    // threads.
    //   out, x [rows, dim]
    void rmsnorm_rows(float* out, const float* x, const float* weight, int rows) const {
        const int dim = model_.config.dim;
        cpu::for_each_row(rows, dim, [&](int r) {
            cpu::rmsnorm(out + size_t(r) * dim, x + size_t(r) * dim, weight, dim,
                         model_.config.norm_eps);
        });
    }

    // x [rows, dim] *= embedding_scale (Gemma's √dim); nothing when it is 1.
    void scale_embedding(float* x, int rows) const {
        const float scale = model_.config.embedding_scale;
        if (scale == 1.0f) return;
        for (size_t i = 0; i < size_t(rows) * model_.config.dim; ++i) x[i] *= scale;
    }

    // logits [rows, vocab_size] = cap · tanh(logits / cap) with final_logit_softcap (Gemma 2);
    // nothing when the model has none.
    void softcap_logits(float* logits, int rows) const {
        const Config& c = model_.config;
        if (c.final_logit_softcap > 0)
            cpu::for_each_row(rows, c.vocab_size, [&](int r) {
                cpu::softcap(logits + size_t(r) * c.vocab_size, c.vocab_size,
                             c.final_logit_softcap);
            });
    }

    // A sub-block's output y [rows, dim] RMS-normed in place with `weight` before the residual
    // add (Gemma's post_attn_norm and post_ffn_norm); nothing when weight is nullptr.
    void post_norm(float* y, const float* weight, int rows) const {
        if (weight) rmsnorm_rows(y, y, weight, rows);
    }

    // gate[hidden_dim] = act(gate) * up: SwiGLU, or GeGLU (Gemma) or the clamped SwiGLU
    // (gpt-oss) where the config says.
    void gated_activation(float* gate, const float* up) const {
        cpu::gated_activation(gate, up, model_.config.hidden_dim, model_.config);
    }

    // The RoPE table of layer `layer`: the sliding layers' own with rope_theta_local (Gemma 3),
    // else the model's.
    const float* layer_rope_table(int layer) const {
        return model_.config.uses_local_rope(layer) ? state_.rope_local.data() : state_.rope.data();
    }

    // x += y, both [rows, dim]: the residual connection.
    void add_rows(float* x, const float* y, int rows) const {
        const int dim = model_.config.dim;
        cpu::for_each_row(rows, dim, [&](int r) {
            for (size_t i = size_t(r) * dim; i < size_t(r + 1) * dim; ++i) x[i] += y[i];
        });
    }

    // x += bias, both [n]; nothing when the model has no such bias (bias nullptr).
    static void add_bias(float* x, const float* bias, int n) {
        if (!bias) return;
        for (int i = 0; i < n; ++i) x[i] += bias[i];
    }

    // Each of the `heads` heads of x [heads, head_dim] RMS-normed in place with `weight`
    // [head_dim] (Qwen3's q_norm and k_norm); nothing when weight is nullptr.
    void rmsnorm_heads(float* x, const float* weight, int heads) const {
        if (!weight) return;
        const Config& c = model_.config;
        for (int h = 0; h < heads; ++h) {
            float* head = x + size_t(h) * c.head_dim;
            cpu::rmsnorm(head, head, weight, c.head_dim, c.norm_eps);
        }
    }

    AttentionShape attention_shape(int layer) const {
        const Config& c = model_.config;
        return AttentionShape{c.heads,
                              c.kv_heads,
                              c.head_dim,
                              c.layer_window(layer),
                              c.attention_scale,
                              c.attn_logit_softcap,
                              model_.layers[layer].sinks};
    }

    // The contiguous KV cache's row of layer `layer` at position `pos`.
    uint8_t* cache_row(std::vector<uint8_t>& cache, int layer, int pos) const {
        const size_t row_bytes = size_t(model_.config.kv_dim()) * kv_element_bytes(kv_type_);
        return cache.data() + (size_t(layer) * context_ + pos) * row_bytes;
    }

    // The paged KV cache's row `row` (src/kv_cache.h: paged_row) of layer `layer`.
    uint8_t* paged_slot(std::vector<uint8_t>& cache, int layer, size_t row) const {
        const size_t row_bytes = size_t(model_.config.kv_dim()) * kv_element_bytes(kv_type_);
        const size_t layer_rows = size_t(kv_blocks_) * kv_block_size_;
        return cache.data() + (size_t(layer) * layer_rows + row) * row_bytes;
    }

    bool paged() const { return kv_blocks_ > 0; }

    void require_contiguous_cache(const char* what) const {
        if (paged())
            throw Error(std::string(what) +
                        ": this backend holds the paged KV cache (BackendOptions::kv_blocks); "
                        "use step");
    }

    const Model& model_;
    const int context_;
    const KvType kv_type_;
    const int kv_blocks_;      // 0: the contiguous KV cache of context_ positions
    const int kv_block_size_;  // positions per block of the paged one
    const int max_batch_;
    const cpu::ResidentWeights weights_;
    cpu::MixtureOfExperts experts_;  // the sparse layers' feed-forward
    InferenceState state_;
    std::vector<float> all_logits_;    // [context, vocab_size] with BackendOptions::all_logits
    std::vector<float> step_logits_;   // [rows wanting logits, vocab_size] of the last step
    std::vector<int> step_positions_;  // [B] each step row's position
    std::vector<const int*> step_block_tables_;  // [B] each step row's block table
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Model& model, const BackendOptions& options) {
    return std::make_unique<CpuBackend>(model, options);
}

}  // namespace barellm
