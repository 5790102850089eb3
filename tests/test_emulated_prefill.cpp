// The batched-prefill kernels of kernels/prefill.cuh, kernels/post_norm.cuh and
// kernels/attention_prefill.cuh run on the CUDA emulation, launched as their launch functions
// launch them, against double-precision references from the same rounded inputs: odd token
// counts, GQA, a sliding window, first_pos > 0, f32/f16/bf16 outputs and f32/f16 caches,
// SwiGLU and GeGLU, Gemma's scaled embeddings and post norms, head_dim 256.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <vector>

#include "attention_prefill.cuh"
#include "emulated_inputs.h"
#include "gated_reference.h"
#include "post_norm.cuh"
#include "prefill.cuh"

using namespace barellm;
using namespace barellm::cuda;
using namespace barellm::test;

namespace {

// Half of one unit in the last place, relative, of a value rounded to `dtype`.
double rounding_of(DType dtype) {
    switch (dtype) {
        case DType::F16:
            return std::ldexp(1.0, -11);
        case DType::BF16:
            return std::ldexp(1.0, -8);
        default:
            return 0.0;
    }
}

// |got - want| within the rounding to `dtype` plus `f32_error` (relative and absolute).
bool close(double got, double want, DType dtype, double f32_error) {
    const double subnormal_step = 1e-7;
    return std::fabs(got - want) <=
           (rounding_of(dtype) + f32_error) * std::fabs(want) + f32_error + subnormal_step;
}

constexpr DType kActivationTypes[] = {DType::F32, DType::F16, DType::BF16};
constexpr int kCounts[] = {1, 3, 17, 70};
constexpr int kColumns[] = {40, 72, 264, 43};
constexpr float kEps = 1e-5f;
constexpr double kF32Error = 2e-6;

}  // namespace

TEST_CASE("emulated embedding_rows copies the tokens' rows, scaled", "[cuda_emulation][prefill]") {
    std::mt19937 rng(1);
    constexpr int kVocab = 11;
    for (const DType dtype : kActivationTypes)
        for (const int cols : {40, 264, 300, 43})
            for (const float scale : {1.0f, std::sqrt(float(cols))}) {  // Gemma: sqrt(dim)
                PaddedRows table(kVocab, cols, dtype, rng);
                const int count = 17;
                std::vector<int> tokens(count);
                for (int t = 0; t < count; ++t) tokens[t] = int(rng() % kVocab);
                std::vector<float> x(size_t(count) * cols, NAN);
                with_weight_dtype(dtype, [&](auto d) {
                    emulate_launch(embedding_rows_grid(cols, count), dim3(kRowsThreads), 0,
                                   embedding_rows_kernel<decltype(d)::value>, x.data(),
                                   table.data(), cols, table.pitch, scale, tokens.data());
                });
                int wrong = 0;
                for (int t = 0; t < count; ++t)
                    for (int i = 0; i < cols; ++i)  // one f32 product
                        wrong += x[size_t(t) * cols + i] != float(table.at(tokens[t], i)) * scale;
                INFO(dtype_name(dtype) << ", " << cols << " cols, scale " << scale);
                CHECK(wrong == 0);
            }
}

TEST_CASE(
    "emulated rmsnorm_rows and swiglu_rows (SwiGLU, GeGLU, gpt-oss's) match double references",
    "[cuda_emulation][prefill]") {
    std::mt19937 rng(2);
    for (const DType dtype : kActivationTypes)
        for (const int cols : kColumns)
            for (const Activation activation : kElementwiseActivations) {
                const int tokens = kCounts[rng() % std::size(kCounts)];
                const int pitch = padded_cols(cols, dtype);
                const int in_pitch = cols + 3;  // the GEMM output's pitch may exceed cols
                INFO(dtype_name(dtype) << ", " << tokens << " tokens, " << cols << " cols, "
                                       << activation_name(activation));
                const std::vector<float> x = random_floats(size_t(tokens) * cols, rng, 3.0f);
                const std::vector<float> weight = random_floats(size_t(cols), rng);
                const std::vector<float> gate = random_floats(size_t(tokens) * in_pitch, rng, 4.0f);
                const std::vector<float> up = random_floats(size_t(tokens) * in_pitch, rng, 2.0f);
                AlignedArray<uint8_t> normed(size_t(tokens) * pitch * dtype_size(dtype), 0xee);
                AlignedArray<uint8_t> gated(size_t(tokens) * pitch * dtype_size(dtype), 0xee);
                with_weight_dtype(dtype, [&](auto d) {
                    constexpr DType D = decltype(d)::value;
                    emulate_launch(rmsnorm_rows_grid(tokens), dim3(kRowsThreads), 0,
                                   rmsnorm_rows_kernel<D>, normed.data(), cols, pitch, x.data(),
                                   weight.data(), kEps);
                    with_any_activation(activation, [&](auto act) {
                        emulate_launch(swiglu_rows_grid(pitch, tokens), dim3(kRowsThreads), 0,
                                       swiglu_rows_kernel<D, decltype(act)::value>, gated.data(),
                                       cols, pitch, gate.data(), up.data(), in_pitch,
                                       float(kTestSwigluLimit));
                    });
                });
                int wrong = 0;
                const size_t row_bytes = size_t(pitch) * dtype_size(dtype);
                for (int t = 0; t < tokens; ++t) {
                    double squares = 0;
                    for (int i = 0; i < cols; ++i)
                        squares += double(x[t * cols + i]) * x[t * cols + i];
                    const double scale = 1.0 / std::sqrt(squares / cols + kEps);
                    const void* normed_row = normed.data() + t * row_bytes;
                    const void* gated_row = gated.data() + t * row_bytes;
                    for (int i = 0; i < pitch; ++i) {
                        const double got_norm = stored_element(normed_row, dtype, i);
                        const double got_swiglu = stored_element(gated_row, dtype, i);
                        if (i >= cols) {
                            wrong += got_norm != 0.0 || got_swiglu != 0.0;  // exact zero padding
                            continue;
                        }
                        const double g = gate[size_t(t) * in_pitch + i];
                        const double want_norm = x[t * cols + i] * scale * weight[i];
                        const double u = up[size_t(t) * in_pitch + i];
                        const double want_swiglu =
                            gated_reference(activation, g, u, kTestSwigluLimit);
                        wrong += !close(got_norm, want_norm, dtype, kF32Error);
                        // GeGLU's 1 + tanh cancels for negative gates: f32's error there is
                        // absolute, about an ulp of 1 times |g u|.
                        wrong += !close(got_swiglu, want_swiglu, dtype,
                                        kF32Error + 2e-7 * std::fabs(g * u));
                    }
                }
                CHECK(wrong == 0);
            }
}

// Gemma's post norms: x += rmsnorm(y) * weight, row by row (decode: one row), including
// outputs whose squares overflow f32 (the norm's rescue sum, kRmsRescue).
TEST_CASE("emulated add_rmsnorm_rows matches a double reference", "[cuda_emulation][prefill]") {
    std::mt19937 rng(5);
    for (const int cols : {43, 264, 1155})
        for (const int count : {1, 3, 17})
            for (const float magnitude : {5.0f, 1e38f}) {
                INFO(count << " rows of " << cols << ", y up to " << magnitude);
                const std::vector<float> x = random_floats(size_t(count) * cols, rng, 3.0f);
                const std::vector<float> y = random_floats(size_t(count) * cols, rng, magnitude);
                const std::vector<float> weight = random_floats(size_t(cols), rng);
                std::vector<float> sum = x;
                emulate_launch(add_rmsnorm_rows_grid(count), dim3(kPostNormThreads), 0,
                               add_rmsnorm_rows_kernel, sum.data(), y.data(), weight.data(), cols,
                               kEps);
                int wrong = 0;
                for (int t = 0; t < count; ++t) {
                    const float* row = &y[size_t(t) * cols];
                    double squares = 0;
                    for (int i = 0; i < cols; ++i) squares += double(row[i]) * row[i];
                    const double scale = 1.0 / std::sqrt(squares / cols + kEps);
                    for (int i = 0; i < cols; ++i) {
                        const size_t at = size_t(t) * cols + i;
                        const double normed = row[i] * scale * weight[i];
                        // The normed term's f32 error, then the sum's rounding.
                        const double bound = kF32Error * std::fabs(normed) +
                                             std::ldexp(std::fabs(x[at] + normed), -24) + 1e-7;
                        wrong += !(std::fabs(sum[at] - (x[at] + normed)) <= bound);
                    }
                }
                CHECK(wrong == 0);
            }
}

namespace {

struct RopeCase {
    int heads, kv_heads, head_dim, count, first_pos;
    bool norms;
};

template <typename KvT>
double cache_value(const KvT* cache, size_t i) {
    if constexpr (std::is_same_v<KvT, float>)
        return cache[i];
    else
        return half_to_float(cache[i].bits);
}

// rope_kv_store_rows_kernel on qkv rows random in [-input_scale, input_scale] against a
// double reference.
template <typename KvT>
void check_rope_kv_store_rows(const RopeCase& c, std::mt19937& rng, float input_scale = 2.0f) {
    const KvType kv_type = std::is_same_v<KvT, float> ? KvType::F32 : KvType::F16;
    INFO(c.heads << "/" << c.kv_heads << " heads of " << c.head_dim << ", " << c.count
                 << " tokens from " << c.first_pos << ", norms " << c.norms << ", kv "
                 << (kv_type == KvType::F32 ? "f32" : "f16"));
    const int half = c.head_dim / 2, kv_dim = c.kv_heads * c.head_dim;
    const int vectors = c.heads + 2 * c.kv_heads, qkv_pitch = vectors * c.head_dim + 3;
    const int context = c.first_pos + c.count + 2;
    const std::vector<float> rope_table = test_rope_table(c.head_dim);
    const std::vector<float> qkv_in = random_floats(size_t(c.count) * qkv_pitch, rng, input_scale);
    const std::vector<float> q_norm = random_floats(size_t(c.head_dim), rng);
    const std::vector<float> k_norm = random_floats(size_t(c.head_dim), rng);
    std::vector<float> qkv = qkv_in;
    KvT sentinel;
    std::memset(&sentinel, 0x55, sizeof sentinel);
    std::vector<KvT> keys(size_t(context) * kv_dim, sentinel), values(keys);
    emulate_launch(rope_kv_store_rows_grid(c.heads, c.kv_heads, c.count), dim3(kRopeRowsThreads), 0,
                   rope_kv_store_rows_kernel<KvT>, qkv.data(), qkv_pitch, rope_table.data(),
                   keys.data(), values.data(), c.first_pos, c.heads, c.kv_heads, c.head_dim,
                   c.norms ? q_norm.data() : nullptr, c.norms ? k_norm.data() : nullptr, kEps);

    const DType kv_dtype = kv_type == KvType::F32 ? DType::F32 : DType::F16;
    int wrong = 0;
    for (int t = 0; t < c.count; ++t) {
        const int pos = c.first_pos + t;
        const float* in = &qkv_in[size_t(t) * qkv_pitch];
        const float* got_q = &qkv[size_t(t) * qkv_pitch];
        for (int n = 0; n < vectors; ++n) {
            const float* v = in + size_t(n) * c.head_dim;
            const size_t cache = size_t(pos) * kv_dim;
            if (n >= c.heads + c.kv_heads) {  // v: stored unchanged
                for (int i = 0; i < c.head_dim; ++i)
                    wrong += !close(
                        cache_value(values.data(),
                                    cache + size_t(n - c.heads - c.kv_heads) * c.head_dim + i),
                        v[i], kv_dtype, 0.0);
                continue;
            }
            const bool is_q = n < c.heads;
            double scale = 1.0;
            const std::vector<float>& norm = is_q ? q_norm : k_norm;
            if (c.norms) {
                double squares = 0;
                for (int i = 0; i < c.head_dim; ++i) squares += double(v[i]) * v[i];
                scale = 1.0 / std::sqrt(squares / c.head_dim + kEps);
            }
            for (int j = 0; j < half; ++j) {
                double a = v[j], b = v[j + half];
                if (c.norms) {
                    a *= scale * norm[j];
                    b *= scale * norm[j + half];
                }
                const auto [cos_angle, sin_angle] = rope_cos_sin_reference(rope_table, j, pos);
                const double x = a * cos_angle - b * sin_angle;
                const double y = b * cos_angle + a * sin_angle;
                const double error = 1e-5;  // f32 rotation (and norm)
                if (is_q) {
                    const float* q = got_q + size_t(n) * c.head_dim;
                    wrong += !close(q[j], x, DType::F32, error);
                    wrong += !close(q[j + half], y, DType::F32, error);
                } else {
                    const size_t k = cache + size_t(n - c.heads) * c.head_dim;
                    wrong += !close(cache_value(keys.data(), k + j), x, kv_dtype, error);
                    wrong += !close(cache_value(keys.data(), k + j + half), y, kv_dtype, error);
                }
            }
        }
        // k, v and the padding of the qkv row are not written.
        for (int i = c.heads * c.head_dim; i < qkv_pitch; ++i) wrong += got_q[i] != in[i];
    }
    // Cache rows outside first_pos .. first_pos + count - 1 are not written.
    wrong += cache_writes_outside(keys, values, sentinel, kv_dim, c.first_pos,
                                  c.first_pos + c.count - 1);
    CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("emulated rope_kv_store_rows matches a double reference", "[cuda_emulation][prefill]") {
    std::mt19937 rng(3);
    const RopeCase cases[] = {
        {6, 2, 8, 17, 0, false}, {6, 2, 72, 3, 9, true}, {4, 4, 128, 1, 30, false},
        {2, 1, 64, 70, 5, true}, {3, 1, 6, 3, 0, true},
    };
    for (const RopeCase& c : cases) {
        check_rope_kv_store_rows<float>(c, rng);
        check_rope_kv_store_rows<__half>(c, rng);
    }
}

// Inputs whose squares overflow f32 (|x| up to 1e38): the RMSNorms sum them again
// (kRmsRescue) instead of scaling every element to 0.
TEST_CASE("emulated prefill RMSNorms of inputs whose squares overflow f32 match double references",
          "[cuda_emulation][prefill]") {
    constexpr float kOverflowingInput = 1e38f;
    std::mt19937 rng(4);
    for (const int cols : kColumns) {
        const int tokens = 3, pitch = padded_cols(cols, DType::F32);
        INFO(cols << " cols");
        const std::vector<float> x = random_floats(size_t(tokens) * cols, rng, kOverflowingInput);
        const std::vector<float> weight = random_floats(size_t(cols), rng);
        AlignedArray<float> normed(size_t(tokens) * pitch);
        emulate_launch(rmsnorm_rows_grid(tokens), dim3(kRowsThreads), 0,
                       rmsnorm_rows_kernel<DType::F32>, normed.data(), cols, pitch, x.data(),
                       weight.data(), kEps);
        int wrong = 0;
        for (int t = 0; t < tokens; ++t) {
            const float* row = &x[size_t(t) * cols];
            float f32_squares = 0.0f;
            double squares = 0;
            for (int i = 0; i < cols; ++i) {
                f32_squares += row[i] * row[i];
                squares += double(row[i]) * row[i];
            }
            REQUIRE(std::isinf(f32_squares));  // the case under test
            const double scale = 1.0 / std::sqrt(squares / cols + kEps);
            for (int i = 0; i < cols; ++i)
                wrong += !close(normed[size_t(t) * pitch + i], row[i] * scale * weight[i],
                                DType::F32, kF32Error);
        }
        CHECK(wrong == 0);
    }
    // The q/k head norms (an f32 cache: f16 cannot hold the v values, stored unchanged).
    check_rope_kv_store_rows<float>({6, 2, 72, 3, 9, true}, rng, kOverflowingInput);
    check_rope_kv_store_rows<float>({3, 1, 6, 3, 0, true}, rng, kOverflowingInput);
}

namespace {

struct AttentionCase {
    AttentionShape shape;
    int count, first_pos;
    KvType kv_type;
    DType out_dtype;
};

template <typename KvT>
void store_cache(std::vector<KvT>& cache, const std::vector<float>& values) {
    cache.resize(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
        if constexpr (std::is_same_v<KvT, float>)
            cache[i] = values[i];
        else
            cache[i] = __float2half_rn(values[i]);
    }
}

// The tensor-core kernel runs with `mma_buffers` tile buffers (1 or 2) where it applies.
// With sinks ([heads]; empty: none) each head's softmax has its sink logit, whose value is 0.
template <typename KvT>
void check_attention_prefill(const AttentionCase& c, int mma_buffers, std::mt19937& rng,
                             const std::vector<float>& sinks = {}) {
    const AttentionShape& shape = c.shape;
    const float* sink_logits = sinks.empty() ? nullptr : sinks.data();
    INFO(shape.heads << "/" << shape.kv_heads << " heads of " << shape.head_dim << ", window "
                     << shape.window << ", softcap " << shape.softcap << ", sinks "
                     << !sinks.empty() << ", " << c.count << " tokens from " << c.first_pos
                     << ", out " << dtype_name(c.out_dtype) << ", kv "
                     << (c.kv_type == KvType::F32 ? "f32" : "f16") << ", " << mma_buffers
                     << " tile buffers");
    const int group = shape.heads / shape.kv_heads, head_dim = shape.head_dim;
    const int q_dim = shape.heads * head_dim, kv_dim = shape.kv_heads * head_dim;
    const int qkv_pitch = q_dim + 2 * kv_dim + 1;
    const int context = c.first_pos + c.count + 3;
    const std::vector<float> qkv = random_floats(size_t(c.count) * qkv_pitch, rng, 2.0f);
    std::vector<KvT> keys, values;
    store_cache(keys, random_floats(size_t(context) * kv_dim, rng, 2.0f));
    store_cache(values, random_floats(size_t(context) * kv_dim, rng));
    const int out_pitch = padded_cols(q_dim, c.out_dtype);
    const size_t row_bytes = size_t(out_pitch) * dtype_size(c.out_dtype);
    AlignedArray<uint8_t> out(size_t(c.count) * row_bytes, 0x3c);  // 0x3c3c... as f32, f16, bf16

    // As attention_prefill launches them: the tensor-core kernel where it applies.
    const bool mma = attention_prefill_uses_mma(c.kv_type, head_dim);
    with_weight_dtype(c.out_dtype, [&](auto dtype) {
        constexpr DType kOut = decltype(dtype)::value;
        if constexpr (std::is_same_v<KvT, __half>) {
            if (mma) {
                const auto kernel = attention_prefill_mma_kernel_for<kOut>(head_dim, mma_buffers);
                emulate_launch(
                    attention_prefill_mma_grid(c.count, shape), dim3(kAttentionPrefillThreads),
                    attention_prefill_mma_shared_bytes(head_dim, mma_buffers), kernel,
                    static_cast<void*>(out.data()), out_pitch, qkv.data(), qkv_pitch, keys.data(),
                    values.data(), c.first_pos, c.count, shape.heads, shape.kv_heads, head_dim,
                    shape.window, shape.scale, shape.softcap, sink_logits);
                return;
            }
        }
        with_prefill_dims_per_lane(head_dim, [&](auto dims) {
            emulate_launch(attention_prefill_grid(c.count, shape), dim3(kAttentionPrefillThreads),
                           attention_prefill_shared_floats(head_dim) * sizeof(float),
                           attention_prefill_kernel<KvT, kOut, decltype(dims)::value>,
                           static_cast<void*>(out.data()), out_pitch, qkv.data(), qkv_pitch,
                           keys.data(), values.data(), c.first_pos, c.count, shape.heads,
                           shape.kv_heads, head_dim, shape.window, shape.scale, shape.softcap,
                           sink_logits);
        });
    });
    // The tensor-core kernel rounds the queries to f16 (an input of the reference below) and
    // the probabilities to f16 for PV (a relative error of 2^-11 each, and as much between
    // the rounded weights and the f32 sum that divides them).
    const double probability_rounding = mma ? std::ldexp(1.0, -10) : 0.0;

    int wrong = 0;
    std::vector<double> scores;
    for (int t = 0; t < c.count; ++t) {
        const int pos = c.first_pos + t, first = attention_start(pos, shape.window);
        const void* out_row = out.data() + t * row_bytes;
        for (int h = 0; h < shape.heads; ++h) {
            std::vector<double> q(head_dim);
            for (int d = 0; d < head_dim; ++d) {
                const float v = qkv[size_t(t) * qkv_pitch + size_t(h) * head_dim + d];
                q[d] = mma ? half_to_float(float_to_half(v)) : v;
            }
            const size_t head_offset = size_t(h / group) * head_dim;
            scores.assign(size_t(pos - first + 1), 0.0);
            double largest = -INFINITY;
            for (int key = first; key <= pos; ++key) {
                double dot = 0;
                for (int d = 0; d < head_dim; ++d)
                    dot += q[d] * cache_value(keys.data(), size_t(key) * kv_dim + head_offset + d);
                scores[key - first] = dot * shape.scale;
                if (shape.softcap > 0)
                    scores[key - first] =
                        shape.softcap * std::tanh(scores[key - first] / shape.softcap);
                largest = std::max(largest, scores[key - first]);
            }
            if (sink_logits) largest = std::max(largest, double(sink_logits[h]));
            double total = sink_logits ? std::exp(sink_logits[h] - largest) : 0.0;
            for (double& s : scores) total += (s = std::exp(s - largest));
            for (int d = 0; d < head_dim; ++d) {
                double want = 0, magnitude = 0;
                for (int key = first; key <= pos; ++key) {
                    const double v =
                        cache_value(values.data(), size_t(key) * kv_dim + head_offset + d);
                    want += scores[key - first] / total * v;
                    magnitude += scores[key - first] / total * std::fabs(v);
                }
                const double got = stored_element(out_row, c.out_dtype, h * head_dim + d);
                const double f32_error =
                    1e-5 * (1.0 + magnitude) + probability_rounding * magnitude;
                const bool ok = close(got, want, c.out_dtype, f32_error);
                if (!ok && ++wrong <= 3) {
                    INFO("token " << t << " head " << h << " dim " << d << ": got " << got
                                  << ", want " << want);
                    CHECK(false);
                }
            }
        }
        for (int i = q_dim; i < out_pitch; ++i)
            wrong += stored_element(out_row, c.out_dtype, i) != 0;
    }
    CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("emulated attention_prefill matches a double reference", "[cuda_emulation][prefill]") {
    std::mt19937 rng(4);
    // Scales about 1.25/√head_dim, not 1/√head_dim: the kernels must take the shape's.
    const AttentionCase cases[] = {
        {{6, 2, 8, 0, 0.44f}, 17, 0, KvType::F16, DType::F16},   // GQA, 2 dims per lane
        {{4, 4, 72, 0, 0.15f}, 3, 40, KvType::F32, DType::F32},  // 4 dims per lane, first_pos > 0
        // 8 dims per lane, sliding window:
        {{6, 3, 160, 20, 0.1f}, 70, 5, KvType::F16, DType::BF16},
        {{2, 1, 64, 0, 0.16f}, 1, 100, KvType::F32, DType::F16},  // one token after a long cache
        {{3, 1, 6, 7, 0.51f}, 33, 2, KvType::F16, DType::F16},    // output padding, window
        {{8, 2, 32, 0, 0.22f}, 70, 0, KvType::F32, DType::BF16},  // several key tiles from 0
        // Tensor cores (f16 cache, head_dim a multiple of 16 up to 128):
        {{6, 2, 16, 0, 0.31f}, 70, 0, KvType::F16, DType::F16},    // GQA, two row blocks
        {{4, 4, 64, 9, 0.16f}, 17, 60, KvType::F16, DType::BF16},  // window, first_pos > 0
        {{2, 1, 80, 0, 0.14f}, 1, 130, KvType::F16, DType::F32},   // kDims 128 > head_dim, 3 tiles
        {{4, 2, 128, 0, 0.11f}, 3, 0, KvType::F16, DType::F16},
        {{3, 1, 48, 70, 0.18f}, 33, 40, KvType::F16, DType::F16},   // output padding, long window
        {{4, 2, 128, 0, 0.11f}, 150, 60, KvType::F16, DType::F16},  // 4 key tiles a block, two
                                                                    // taking turns in the buffers
        // warps skipping tiles (window):
        {{4, 2, 32, 50, 0.22f}, 150, 60, KvType::F16, DType::BF16},
        // Gemma 3 1B's heads (4 of 256, one KV head) on CUDA cores: a window crossing the batch
        // and one past its start, the scale of query_pre_attn_scalar 168 (27B's); f32 and f16
        // caches.
        {{4, 1, 256, 37, 0.0772f}, 70, 10, KvType::F16, DType::BF16},
        {{4, 1, 256, 21, 0.0625f}, 17, 40, KvType::F32, DType::F16},
        {{4, 1, 256, 0, 0.0772f}, 5, 33, KvType::F16, DType::F32},
        // Gemma 2's soft-capped scores (a cap of 1.5, below the largest scores, so that it
        // bends them): on tensor cores, sliding, and on CUDA cores at 2B's head_dim 256.
        {{4, 2, 64, 9, 0.3f, 1.5f}, 70, 20, KvType::F16, DType::F16},
        {{6, 2, 8, 0, 0.9f, 1.5f}, 17, 3, KvType::F32, DType::F32},
        {{4, 2, 256, 21, 0.1f, 1.5f}, 33, 10, KvType::F16, DType::BF16},
    };
    for (const AttentionCase& c : cases) {
        if (c.kv_type == KvType::F32) {
            check_attention_prefill<float>(c, 1, rng);
        } else {
            check_attention_prefill<__half>(c, 1, rng);  // sm_75's one tile buffer
            if (attention_prefill_uses_mma(c.kv_type, c.shape.head_dim))
                check_attention_prefill<__half>(c, 2, rng);  // two, from sm_80
        }
    }
}

TEST_CASE("emulated attention_prefill with attention sinks matches a double reference",
          "[cuda_emulation][prefill]") {
    std::mt19937 rng(5);
    // gpt-oss's shapes, scaled down: heads in groups of 5 (not a multiple of a warp's rows),
    // head_dim 72 (CUDA cores) and 64 or 80 (tensor cores), its window of 128 and a shorter
    // one, batches off the tiles, first_pos > 0.
    const AttentionCase cases[] = {
        {{10, 2, 72, 0, 0.15f}, 37, 5, KvType::F32, DType::F32},
        {{5, 1, 72, 9, 0.15f}, 33, 40, KvType::F16, DType::BF16},
        {{10, 2, 64, 128, 0.16f}, 70, 100, KvType::F16, DType::F16},
        {{5, 1, 80, 0, 0.14f}, 17, 3, KvType::F16, DType::F32},
        {{6, 2, 8, 0, 0.44f}, 17, 0, KvType::F16, DType::F16},
    };
    for (const AttentionCase& c : cases) {
        // Heads in turn: a sink far above the scores (about ±1.5), far below, and among them.
        std::vector<float> sinks = random_floats(size_t(c.shape.heads), rng, 1.5f);
        for (int h = 0; h < c.shape.heads; ++h)
            sinks[h] += h % 3 == 0 ? 6.0f : h % 3 == 1 ? -6.0f : 0.0f;
        if (c.kv_type == KvType::F32) {
            check_attention_prefill<float>(c, 1, rng, sinks);
        } else {
            check_attention_prefill<__half>(c, 1, rng, sinks);
            if (attention_prefill_uses_mma(c.kv_type, c.shape.head_dim))
                check_attention_prefill<__half>(c, 2, rng, sinks);
        }
    }
}
