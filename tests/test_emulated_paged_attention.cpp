// The server step's kernels over the paged KV cache run on the CUDA emulation, launched as
// their launch functions launch them: rope_kv_store_paged_kernel (kernels/prefill.cuh) and
// the flash-decoding attention_paged_split_kernel + attention_paged_merge_kernel
// (kernels/attention_paged.cuh), against double-precision references written here. The
// block tables are scattered at random over a pool with blocks no sequence owns; block sizes
// 16, 32 and 64; lengths that are not multiples of the block; GQA, sliding windows, f32 and
// f16 caches; rows of several sequences in one step, some a prompt chunk (consecutive
// positions of one sequence attending causally), and one split up to many per row.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "attention_paged.cuh"
#include "emulated_inputs.h"
#include "prefill.cuh"

using namespace barellm;
using namespace barellm::cuda;
using namespace barellm::test;

namespace {

constexpr float kEps = 1e-5f;

template <typename KvT>
double pool_value(const std::vector<KvT>& pool, size_t i) {
    if constexpr (std::is_same_v<KvT, float>)
        return pool[i];
    else
        return half_to_float(pool[i].bits);
}

template <typename KvT>
std::vector<KvT> stored_pool(const std::vector<float>& values) {
    std::vector<KvT> pool(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
        if constexpr (std::is_same_v<KvT, float>)
            pool[i] = values[i];
        else
            pool[i] = __float2half_rn(values[i]);
    }
    return pool;
}

// One step's rows over a pool of `pool_blocks` blocks: sequences of the given lengths
// (positions filled), each with a table of distinct blocks drawn at random from the pool
// (some blocks left to no sequence); sequence s contributes its last rows_of[s] positions
// as rows (1: a decode row; more: a prompt chunk).
struct PagedStep {
    int block_size, pool_blocks, table_stride;
    std::vector<int> positions;     // [rows]
    std::vector<int> tables;        // [rows, table_stride]
    std::vector<int> row_sequence;  // [rows]

    PagedStep(int block_size_, const std::vector<int>& lengths, const std::vector<int>& rows_of,
              std::mt19937& rng)
        : block_size(block_size_) {
        int needed = 0, longest = 0;
        for (int length : lengths) {
            needed += (length + block_size - 1) / block_size;
            longest = std::max(longest, length);
        }
        pool_blocks = needed + 5;
        table_stride = (longest + block_size - 1) / block_size + 2;  // wider than any table
        std::vector<int> free_blocks(pool_blocks);
        std::iota(free_blocks.begin(), free_blocks.end(), 0);
        std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
        for (size_t s = 0; s < lengths.size(); ++s) {
            std::vector<int> table(table_stride, -1);  // entries past the length: never read
            for (int b = 0; b < (lengths[s] + block_size - 1) / block_size; ++b) {
                table[b] = free_blocks.back();
                free_blocks.pop_back();
            }
            for (int r = rows_of[s]; r >= 1; --r) {
                positions.push_back(lengths[s] - r);
                tables.insert(tables.end(), table.begin(), table.end());
                row_sequence.push_back(int(s));
            }
        }
    }
    int rows() const { return int(positions.size()); }
    size_t slot(int row, int pos) const {
        return size_t(tables[size_t(row) * table_stride + pos / block_size]) * block_size +
               pos % block_size;
    }
    int longest() const { return *std::max_element(positions.begin(), positions.end()) + 1; }
};

struct PagedCase {
    AttentionShape shape;
    int block_size;
    std::vector<int> lengths, rows_of;
    DType out_dtype;
    int splits;  // 0: attention_paged_splits' choice
};

// With sinks ([heads]; empty: none) each head's softmax has its sink logit, whose value is 0.
template <typename KvT>
void check_attention_paged(const PagedCase& c, std::mt19937& rng,
                           const std::vector<float>& sinks = {}) {
    const AttentionShape& shape = c.shape;
    const float* sink_logits = sinks.empty() ? nullptr : sinks.data();
    const PagedStep step(c.block_size, c.lengths, c.rows_of, rng);
    const int rows = step.rows();
    const int splits = c.splits > 0 ? c.splits : attention_paged_splits(rows, step.longest(), 1024);
    INFO(shape.heads << "/" << shape.kv_heads << " heads of " << shape.head_dim << ", window "
                     << shape.window << ", softcap " << shape.softcap << ", sinks "
                     << !sinks.empty() << ", blocks of " << c.block_size << ", " << rows
                     << " rows, " << splits << " splits, out " << dtype_name(c.out_dtype) << ", kv "
                     << (std::is_same_v<KvT, float> ? "f32" : "f16"));
    const int group = shape.heads / shape.kv_heads, head_dim = shape.head_dim;
    const int q_dim = shape.heads * head_dim, kv_dim = shape.kv_heads * head_dim;
    const int qkv_pitch = q_dim + 2 * kv_dim + 2;
    const size_t pool_positions = size_t(step.pool_blocks) * c.block_size;
    const std::vector<float> qkv = random_floats(size_t(rows) * qkv_pitch, rng, 2.0f);
    const std::vector<KvT> keys =
        stored_pool<KvT>(random_floats(pool_positions * kv_dim, rng, 2.0f));
    const std::vector<KvT> values = stored_pool<KvT>(random_floats(pool_positions * kv_dim, rng));
    const int out_pitch = padded_cols(q_dim, c.out_dtype);
    const size_t row_bytes = size_t(out_pitch) * dtype_size(c.out_dtype);
    AlignedArray<uint8_t> out(size_t(rows) * row_bytes, 0x3c);
    std::vector<float> partial_out(size_t(rows) * shape.heads * splits * head_dim, NAN);
    std::vector<float> partial_stats(size_t(rows) * shape.heads * splits * 2, NAN);

    // As attention_paged launches them.
    const PagedAttentionArgs args{qkv.data(),
                                  qkv_pitch,
                                  keys.data(),
                                  values.data(),
                                  step.positions.data(),
                                  step.tables.data(),
                                  step.table_stride,
                                  step.block_size,
                                  partial_out.data(),
                                  partial_stats.data(),
                                  shape.heads,
                                  shape.kv_heads,
                                  head_dim,
                                  shape.window,
                                  splits,
                                  shape.scale,
                                  shape.softcap};
    with_paged_pairs(head_dim, [&](auto pairs) {
        emulate_launch(attention_paged_split_grid(rows, shape, splits), dim3(kPagedThreads), 0,
                       attention_paged_split_kernel<KvT, decltype(pairs)::value>, args);
    });
    with_weight_dtype(c.out_dtype, [&](auto dtype) {
        emulate_launch(attention_paged_merge_grid(rows, shape.heads), dim3(kPagedThreads), 0,
                       attention_paged_merge_kernel<decltype(dtype)::value>,
                       static_cast<void*>(out.data()), out_pitch, partial_out.data(),
                       partial_stats.data(), sink_logits, shape.heads, head_dim, splits);
    });

    int wrong = 0;
    std::vector<double> scores;
    for (int t = 0; t < rows; ++t) {
        const int pos = step.positions[t], first = attention_start(pos, shape.window);
        const void* out_row = out.data() + t * row_bytes;
        for (int h = 0; h < shape.heads; ++h) {
            const float* q = &qkv[size_t(t) * qkv_pitch + size_t(h) * head_dim];
            const size_t head_offset = size_t(h / group) * head_dim;
            scores.assign(size_t(pos - first + 1), 0.0);
            double largest = -INFINITY;
            for (int p = first; p <= pos; ++p) {
                double dot = 0;
                for (int d = 0; d < head_dim; ++d)
                    dot +=
                        double(q[d]) * pool_value(keys, step.slot(t, p) * kv_dim + head_offset + d);
                scores[p - first] = dot * shape.scale;
                if (shape.softcap > 0)
                    scores[p - first] =
                        shape.softcap * std::tanh(scores[p - first] / shape.softcap);
                largest = std::max(largest, scores[p - first]);
            }
            if (sink_logits) largest = std::max(largest, double(sink_logits[h]));
            double total = sink_logits ? std::exp(sink_logits[h] - largest) : 0.0;
            for (double& s : scores) total += (s = std::exp(s - largest));
            for (int d = 0; d < head_dim; ++d) {
                double want = 0, magnitude = 0;
                for (int p = first; p <= pos; ++p) {
                    const double v = pool_value(values, step.slot(t, p) * kv_dim + head_offset + d);
                    want += scores[p - first] / total * v;
                    magnitude += scores[p - first] / total * std::fabs(v);
                }
                const double got = stored_element(out_row, c.out_dtype, h * head_dim + d);
                const double rounding = c.out_dtype == DType::F16    ? std::ldexp(1.0, -11)
                                        : c.out_dtype == DType::BF16 ? std::ldexp(1.0, -8)
                                                                     : 0.0;
                const double bound = 1e-5 * (1.0 + magnitude) + rounding * std::fabs(want) + 1e-7;
                if (!(std::fabs(got - want) <= bound) && ++wrong <= 3) {
                    INFO("row " << t << " (pos " << pos << ") head " << h << " dim " << d
                                << ": got " << got << ", want " << want);
                    CHECK(false);
                }
            }
        }
        for (int i = q_dim; i < out_pitch; ++i)  // the GEMM input's padding
            wrong += stored_element(out_row, c.out_dtype, i) != 0;
    }
    CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("emulated attention_paged matches a double reference over scattered block tables",
          "[cuda_emulation][paged]") {
    std::mt19937 rng(59);
    const PagedCase cases[] = {
        // Decode rows of three sequences, GQA, blocks of 16, one split.
        {{6, 2, 8, 0, 0.44f}, 16, {37, 5, 70}, {1, 1, 1}, DType::F32, 1},
        // A prompt chunk of 9 rows beside two decode rows, blocks of 32, the chosen splits.
        {{4, 4, 72, 0, 0.15f}, 32, {150, 41, 300}, {1, 9, 1}, DType::F16, 0},
        // Many splits, some empty for the short rows; blocks of 64; a sliding window.
        {{6, 3, 160, 45, 0.1f}, 64, {270, 3, 130}, {2, 3, 1}, DType::BF16, 7},
        // Splits more than a row's blocks; head_dim 256 (Gemma 3), one KV head.
        {{4, 1, 256, 0, 0.0625f}, 16, {200, 17}, {1, 4}, DType::F16, 13},
        // A window shorter than a block, crossing block edges; the output's padding.
        {{3, 1, 6, 7, 0.51f}, 16, {33, 64, 65}, {5, 1, 2}, DType::F16, 3},
        // head_dim 64 (one pair a lane), 8 query heads on one KV head (two blocks of 4): a
        // long decode row and the splits chosen for it.
        {{8, 1, 64, 0, 0.16f}, 32, {700, 12}, {1, 1}, DType::F32, 0},
        // Groups of 5 query heads (a block of 4 and a block of 1), a chunk and a window.
        {{10, 2, 16, 20, 0.3f}, 16, {90, 50}, {6, 1}, DType::BF16, 4},
        // Gemma 2's soft-capped scores (a cap of 1.5 bends them): a chunk and decode rows,
        // head_dim 256, a window.
        {{8, 4, 256, 40, 0.2f, 1.5f}, 16, {120, 30}, {1, 5}, DType::F16, 3},
    };
    for (const PagedCase& c : cases) {
        check_attention_paged<float>(c, rng);
        check_attention_paged<__half>(c, rng);
    }
}

TEST_CASE("emulated attention_paged with attention sinks matches a double reference",
          "[cuda_emulation][paged]") {
    std::mt19937 rng(62);
    const PagedCase cases[] = {
        // Groups of 5 query heads, head_dim 72, a chunk beside decode rows, runs merged, some
        // empty for the short row.
        {{10, 2, 72, 0, 0.15f}, 16, {150, 41, 9}, {1, 9, 1}, DType::F16, 5},
        // gpt-oss's window of 128 over blocks of 32, head_dim 80, the chosen splits.
        {{5, 1, 80, 128, 0.14f}, 32, {300, 130}, {2, 3}, DType::BF16, 0},
        // One run per row: the sink meets a single partial.
        {{6, 2, 8, 0, 0.44f}, 16, {37, 5}, {1, 1}, DType::F32, 1},
    };
    for (const PagedCase& c : cases) {
        // Heads in turn: a sink far above the scores (about ±1.5), far below, and among them.
        std::vector<float> sinks = random_floats(size_t(c.shape.heads), rng, 1.5f);
        for (int h = 0; h < c.shape.heads; ++h)
            sinks[h] += h % 3 == 0 ? 6.0f : h % 3 == 1 ? -6.0f : 0.0f;
        check_attention_paged<float>(c, rng, sinks);
        check_attention_paged<__half>(c, rng, sinks);
    }
}

TEST_CASE("attention_paged_splits: about one run per 128 positions within the partials",
          "[cuda_emulation][paged]") {
    CHECK(attention_paged_splits(1, 1, 1024) == 1);
    CHECK(attention_paged_splits(1, 129, 1024) == 2);
    CHECK(attention_paged_splits(3, 100000, 1024) == kPagedMaxSplits);
    CHECK(attention_paged_splits(512, 100000, 1024) == 2);
    CHECK(attention_paged_splits(512, 100000, 300) == 1);
}

namespace {

// rope_kv_store_paged_kernel against a double reference: q rotated in place, k rotated and v
// stored into each row's slot through its table, nothing else in the pool written.
template <typename KvT>
void check_rope_kv_store_paged(int heads, int kv_heads, int head_dim, int block_size, bool norms,
                               std::mt19937& rng) {
    INFO(heads << "/" << kv_heads << " heads of " << head_dim << ", blocks of " << block_size
               << ", norms " << norms << ", kv " << (std::is_same_v<KvT, float> ? "f32" : "f16"));
    const PagedStep step(block_size, {40, 7, 100}, {1, 5, 2}, rng);
    const int rows = step.rows(), half = head_dim / 2, kv_dim = kv_heads * head_dim;
    const int vectors = heads + 2 * kv_heads, qkv_pitch = vectors * head_dim + 3;
    const std::vector<float> rope_table = test_rope_table(head_dim);
    const std::vector<float> qkv_in = random_floats(size_t(rows) * qkv_pitch, rng, 2.0f);
    const std::vector<float> q_norm = random_floats(size_t(head_dim), rng);
    const std::vector<float> k_norm = random_floats(size_t(head_dim), rng);
    std::vector<float> qkv = qkv_in;
    KvT sentinel;
    std::memset(&sentinel, 0x55, sizeof sentinel);
    const size_t pool_elements = size_t(step.pool_blocks) * block_size * kv_dim;
    std::vector<KvT> keys(pool_elements, sentinel), values(keys);
    emulate_launch(rope_kv_store_rows_grid(heads, kv_heads, rows), dim3(kRopeRowsThreads), 0,
                   rope_kv_store_paged_kernel<KvT>, qkv.data(), qkv_pitch, rope_table.data(),
                   keys.data(), values.data(), step.positions.data(), step.tables.data(),
                   step.table_stride, block_size, heads, kv_heads, head_dim,
                   norms ? q_norm.data() : nullptr, norms ? k_norm.data() : nullptr, kEps);

    const double kv_rounding = std::is_same_v<KvT, float> ? 0.0 : std::ldexp(1.0, -11);
    auto close = [](double got, double want, double relative) {
        return std::fabs(got - want) <= relative * std::fabs(want) + 1e-5 * (1 + std::fabs(want));
    };
    int wrong = 0;
    std::vector<bool> written(size_t(step.pool_blocks) * block_size, false);
    for (int t = 0; t < rows; ++t) {
        const int pos = step.positions[t];
        const size_t slot = step.slot(t, pos);
        written[slot] = true;
        const float* in = &qkv_in[size_t(t) * qkv_pitch];
        for (int n = 0; n < vectors; ++n) {
            const float* v = in + size_t(n) * head_dim;
            if (n >= heads + kv_heads) {
                for (int i = 0; i < head_dim; ++i)
                    wrong +=
                        !close(pool_value(values, slot * kv_dim +
                                                      size_t(n - heads - kv_heads) * head_dim + i),
                               v[i], kv_rounding);
                continue;
            }
            const bool is_q = n < heads;
            double scale = 1.0;
            const std::vector<float>& norm = is_q ? q_norm : k_norm;
            if (norms) {
                double squares = 0;
                for (int i = 0; i < head_dim; ++i) squares += double(v[i]) * v[i];
                scale = 1.0 / std::sqrt(squares / head_dim + kEps);
            }
            for (int j = 0; j < half; ++j) {
                double a = v[j], b = v[j + half];
                if (norms) {
                    a *= scale * norm[j];
                    b *= scale * norm[j + half];
                }
                const auto [cos_angle, sin_angle] = rope_cos_sin_reference(rope_table, j, pos);
                const double x = a * cos_angle - b * sin_angle;
                const double y = b * cos_angle + a * sin_angle;
                if (is_q) {
                    const float* q = &qkv[size_t(t) * qkv_pitch + size_t(n) * head_dim];
                    wrong += !close(q[j], x, 0.0) + !close(q[j + half], y, 0.0);
                } else {
                    const size_t k = slot * kv_dim + size_t(n - heads) * head_dim;
                    wrong += !close(pool_value(keys, k + j), x, kv_rounding);
                    wrong += !close(pool_value(keys, k + j + half), y, kv_rounding);
                }
            }
        }
    }
    for (size_t slot = 0; slot < written.size(); ++slot)  // other slots keep the sentinel
        if (!written[slot])
            for (int i = 0; i < kv_dim; ++i)
                wrong += std::memcmp(&keys[slot * kv_dim + i], &sentinel, sizeof sentinel) != 0 ||
                         std::memcmp(&values[slot * kv_dim + i], &sentinel, sizeof sentinel) != 0;
    CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("emulated rope_kv_store_paged writes each row's slot through its block table",
          "[cuda_emulation][paged]") {
    std::mt19937 rng(60);
    check_rope_kv_store_paged<float>(6, 2, 8, 16, false, rng);
    check_rope_kv_store_paged<__half>(6, 2, 72, 32, true, rng);
    check_rope_kv_store_paged<__half>(4, 1, 256, 64, true, rng);
    check_rope_kv_store_paged<float>(3, 3, 6, 16, true, rng);
}

TEST_CASE("emulated gather_rows copies the rows named", "[cuda_emulation][paged]") {
    std::mt19937 rng(61);
    const int cols = 300, count = 5;
    const std::vector<float> x = random_floats(size_t(11) * cols, rng, 3.0f);
    const std::vector<int> rows = {10, 0, 7, 3, 4};
    std::vector<float> out(size_t(count) * cols, NAN);
    emulate_launch(gather_rows_grid(cols, count), dim3(kRowsThreads), 0, gather_rows_kernel,
                   out.data(), x.data(), rows.data(), cols);
    int wrong = 0;
    for (int t = 0; t < count; ++t)
        for (int i = 0; i < cols; ++i)
            wrong += out[size_t(t) * cols + i] != x[size_t(rows[t]) * cols + i];
    CHECK(wrong == 0);
}
