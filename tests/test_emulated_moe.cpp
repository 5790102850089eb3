// The mixture-of-experts kernels (kernels/moe.cuh) on the CUDA emulation: the routing
// (route_tokens_kernel) against a scalar reference written here (softmax, the k best with the
// lower index winning an exact tie, renormalised or not; exact ties, near-ties one ulp apart,
// 8, 60 and 128 experts; NaN and infinite logits, whose picks must stay in range, on the
// kernel and the CPU's route_token), the expert matvecs (each route's expert read from device
// memory; f32, f16, Q8, Q4, and random Q4_K, Q6_K, Q5_0, Q3_K, Q2_K, IQ4_NL, MXFP4 blocks and
// each i-quant's) against the plain matvec kernels on that expert's matrix and a double reference,
// and a whole sparse feed-forward for one token, launched as CudaBackend::record_experts
// launches it, against the CPU backend's cpu::MixtureOfExperts::decode (f32 and Q8 weights). A
// prefill batch: the grouping of its routes by expert (expert_groups.h), the gather of each
// grouped row's input and the weighted scatter back (moe_combine_kernel with grouped rows) against
// scalar references written here (empty experts, one expert in every token's routes), and a
// whole sparse feed-forward of a few tokens, launched as CudaBackend::prefill_experts runs it
// (f32: the SIMT GEMM of each expert over its rows; Q8: the expert matvec of each grouped row),
// against cpu::MixtureOfExperts::prefill (f32) or its decode of each token (Q8).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "cpu/moe.h"
#include "elementwise_simple.cuh"
#include "emulated_inputs.h"
#include "expert_groups.h"
#include "gemm.cuh"
#include "moe.cuh"
#include "prefill.cuh"
#include "test_block_matrices.h"
#include "test_matrices.h"

using namespace barellm;
using namespace barellm::cuda;
using namespace barellm::test;

namespace {

constexpr float kEps = 1e-5f;

// ---- Routing

// The scalar routing of one token, in f32 with the kernel's order of operations (the
// per-lane sums of a warp, then its butterfly), so that near-ties fall as they fall there:
// p = softmax(logits), the k largest p best first, an exact tie to the lower index, weights
// divided by their sum with normalize.
void route_reference(const float* logits, int experts, int k, bool normalize, int* chosen,
                     float* weights) {
    const float largest = *std::max_element(logits, logits + experts);
    float lanes[kWarpSize] = {};
    for (int i = 0; i < experts; ++i) lanes[i % kWarpSize] += std::exp(logits[i] - largest);
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
        float next[kWarpSize];
        for (int l = 0; l < kWarpSize; ++l) next[l] = lanes[l] + lanes[l ^ offset];
        std::copy(next, next + kWarpSize, lanes);
    }
    std::vector<float> p(experts);
    for (int i = 0; i < experts; ++i) p[i] = std::exp(logits[i] - largest) / lanes[0];
    std::vector<int> order(experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    float total = 0;
    for (int j = 0; j < k; ++j) total += p[order[j]];
    for (int j = 0; j < k; ++j) {
        chosen[j] = order[j];
        weights[j] = normalize ? p[order[j]] / total : p[order[j]];
    }
}

// Router logits of `tokens` tokens: random ones, then rows with exact ties (across the k-th
// place among them) and near-ties one ulp apart.
std::vector<float> routing_logits(int tokens, int experts, int k, std::mt19937& rng) {
    std::vector<float> logits = random_floats(size_t(tokens) * experts, rng, 4.0f);
    for (int t = 1; t < tokens; ++t) {
        float* row = &logits[size_t(t) * experts];
        std::uniform_int_distribution<int> index(0, experts - 1);
        if (t % 3 == 1) {  // exact ties: several experts share the best values
            const float best = 6.0f + float(t % 2);
            for (int n = 0; n < k + 1; ++n) row[index(rng)] = best;
            row[experts - 1] = best;
            row[0] = best - 1.0f;
        } else if (t % 3 == 2) {  // near-ties: one ulp apart, and exact ones beside them
            const float best = 5.0f;
            for (int n = 0; n < k; ++n) {
                const int i = index(rng);
                row[i] = n % 2 ? std::nextafter(best, 10.0f) : best;
            }
        }
    }
    return logits;
}

void check_routing(int experts, int k, bool normalize, std::mt19937& rng) {
    INFO(experts << " experts, top " << k << ", normalize " << normalize);
    const int tokens = 9;
    const std::vector<float> logits = routing_logits(tokens, experts, k, rng);
    std::vector<int> chosen(size_t(tokens) * k, -1);
    std::vector<float> weights(size_t(tokens) * k, NAN);
    emulate_launch(dim3(tokens), dim3(kRouteThreads), 0, route_tokens_kernel, chosen.data(),
                   weights.data(), logits.data(), experts, k, normalize);
    int wrong = 0;
    for (int t = 0; t < tokens; ++t) {
        std::vector<int> want_chosen(k);
        std::vector<float> want_weights(k);
        const float* row = &logits[size_t(t) * experts];
        route_reference(row, experts, k, normalize, want_chosen.data(), want_weights.data());
        // The weights against the softmax in double too (the f32 one could be wrong alike).
        double largest = *std::max_element(row, row + experts), sum = 0, chosen_sum = 0;
        for (int i = 0; i < experts; ++i) sum += std::exp(row[i] - largest);
        for (int j = 0; j < k; ++j) chosen_sum += std::exp(row[want_chosen[j]] - largest) / sum;
        for (int j = 0; j < k; ++j) {
            const size_t r = size_t(t) * k + j;
            wrong += chosen[r] != want_chosen[j];
            wrong += weights[r] != want_weights[j];
            const double p = std::exp(row[want_chosen[j]] - largest) / sum;
            const double want = normalize ? p / chosen_sum : p;
            wrong += std::fabs(weights[r] - want) > 1e-6 * want + 1e-12;
        }
        // The tie rule stated directly: no later pick comes before an earlier one.
        for (int j = 1; j < k; ++j) {
            const size_t r = size_t(t) * k + j;
            wrong += weights[r] > weights[r - 1] ||
                     (!normalize && weights[r] == weights[r - 1] && chosen[r] < chosen[r - 1]);
        }
    }
    CHECK(wrong == 0);
}

// ---- Device copies of CPU matrices

// A matrix in the device layout (kernels.h: DeviceMatrix): rows padded to padded_cols, Q8/Q4
// scales [rows, blocks_per_row] apart.
struct DeviceCopy {
    AlignedArray<uint8_t> values;
    AlignedArray<uint16_t> scales;
    DeviceMatrix matrix;

    explicit DeviceCopy(const Matrix& m)
        : values(size_t(m.rows) * device_shape(m).row_bytes()),
          scales(is_quantized(m.dtype) ? size_t(m.rows) * device_shape(m).blocks_per_row() : 0) {
        matrix = device_shape(m);
        const size_t row_bytes = matrix.row_bytes();
        for (int r = 0; r < m.rows; ++r) {
            std::copy_n(m.row_data(r), m.row_bytes(), values.data() + r * row_bytes);
            if (is_quantized(m.dtype))
                std::copy_n(m.scales + size_t(r) * m.scale_count_per_row(), m.scale_count_per_row(),
                            scales.data() + size_t(r) * matrix.blocks_per_row());
        }
        matrix.data = values.data();
        matrix.scales = is_quantized(m.dtype) ? scales.data() : nullptr;
    }

    static DeviceMatrix device_shape(const Matrix& m) {
        DeviceMatrix d;
        d.dtype = m.dtype;
        d.rows = m.rows;
        d.cols = m.cols;
        d.pitch = padded_cols(m.cols, m.dtype);
        return d;
    }
};

// The ExpertLaunch of expert_matvec (kernels/moe.cuh) for a stacked matrix of experts of
// `rows` rows each.
ExpertLaunch expert_launch(const DeviceMatrix& stacked, int rows, const int* experts,
                           int routes_per_input, int in_pitch, int out_pitch) {
    ExpertLaunch w{};
    w.data = stacked.data;
    w.scales = stacked.scales;
    w.expert_bytes = size_t(rows) * stacked.row_bytes();
    w.expert_scales = stacked.scales ? size_t(rows) * stacked.blocks_per_row() : 0;
    w.rows = rows;
    w.cols = stacked.cols;
    w.pitch = stacked.pitch;
    w.experts = experts;
    w.routes_per_input = routes_per_input;
    w.in_pitch = in_pitch;
    w.out_pitch = out_pitch;
    return w;
}

// expert_matvec's launch: out + r * out_pitch for each of `routes` routes.
void launch_expert_matvec(float* out, const ExpertLaunch& w, DType dtype, int routes,
                          const float* in, const float* norm_weight) {
    const dim3 grid = expert_matvec_grid(dtype, w.rows, w.pitch, routes);
    const dim3 block = expert_matvec_block(dtype, w.pitch);
    const size_t shared = expert_matvec_shared_bytes(dtype, w.pitch);
    switch (dtype) {
        case DType::F32:
            return emulate_launch(grid, block, shared, expert_matvec_kernel<DType::F32>, out, w, in,
                                  norm_weight, kEps);
        case DType::F16:
            return emulate_launch(grid, block, shared, expert_matvec_kernel<DType::F16>, out, w, in,
                                  norm_weight, kEps);
        case DType::Q8_0:
            return emulate_launch(grid, block, shared, expert_quantized_matvec_kernel<DType::Q8_0>,
                                  out, w, in, norm_weight, kEps);
        case DType::Q4_0:
            return emulate_launch(grid, block, shared, expert_quantized_matvec_kernel<DType::Q4_0>,
                                  out, w, in, norm_weight, kEps);
        default:
            break;
    }
    REQUIRE(is_block_type(dtype));
    with_block_dtype(dtype, [&](auto d) {
        emulate_launch(grid, block, shared, expert_block_matvec_kernel<decltype(d)::value>, out, w,
                       in, norm_weight, kEps);
    });
}

// The plain matvec of one matrix (matvec.cuh, matvec_quantized.cuh, matvec_blocks.cuh),
// normed with norm_weight where given, + bias where given.
void launch_plain_matvec(float* out, const DeviceMatrix& m, DType dtype, const float* in,
                         const float* norm_weight, const float* bias = nullptr) {
    if (is_quantized(dtype)) {
        const dim3 grid = quantized_matvec_grid(m.rows, 1);
        const size_t shared = quantized_staging_bytes(m.pitch);
        if (dtype == DType::Q8_0)
            emulate_launch(grid, dim3(kQuantizedMatvecThreads), shared,
                           quantized_matvec_kernel<DType::Q8_0, false, false, 1>, out, m.data,
                           m.scales, m.rows, m.pitch, in, m.cols, norm_weight, kEps, bias);
        else
            emulate_launch(grid, dim3(kQuantizedMatvecThreads), shared,
                           quantized_matvec_kernel<DType::Q4_0, false, false, 1>, out, m.data,
                           m.scales, m.rows, m.pitch, in, m.cols, norm_weight, kEps, bias);
        return;
    }
    if (is_block_type(dtype)) {
        with_block_dtype(dtype, [&](auto d) {
            emulate_launch(quantized_matvec_grid(m.rows, 1), dim3(kQuantizedMatvecThreads),
                           block_staging_bytes(m.pitch),
                           block_matvec_kernel<decltype(d)::value, false, false>, out, m.data,
                           m.rows, in, m.cols, norm_weight, kEps, bias);
        });
        return;
    }
    const dim3 grid = matvec_grid(m.rows, m.pitch), block = matvec_block(m.pitch);
    const size_t shared = staged_input_bytes(m.pitch);
    if (dtype == DType::F32)
        emulate_launch(grid, block, shared, matvec_kernel<DType::F32, false>, out, m.data, m.rows,
                       m.pitch, in, m.cols, norm_weight, kEps, bias);
    else
        emulate_launch(grid, block, shared, matvec_kernel<DType::F16, false>, out, m.data, m.rows,
                       m.pitch, in, m.cols, norm_weight, kEps, bias);
}

// DeviceExperts::expert's view, of a stacked copy.
DeviceMatrix expert_view(const DeviceMatrix& stacked, int e, int rows) {
    DeviceExperts experts;
    experts.stacked = stacked;
    experts.rows = rows;
    return experts.expert(e);
}

// With `biased`, each expert's rows add its bias (gpt-oss's expert biases).
void check_expert_matvec(DType dtype, int rows, int cols, bool shared_input, std::mt19937& rng,
                         bool biased = false) {
    INFO(dtype_name(dtype) << ", experts of " << rows << " x " << cols << ", shared input "
                           << shared_input << ", biased " << biased);
    const int experts = 5, routes = 6, k = 3;
    const TestMatrix stacked = is_block_type(dtype)
                                   ? make_block_matrix(experts * rows, cols, dtype, rng)
                                   : make_matrix(experts * rows, cols, dtype, rng);
    const DeviceCopy device(stacked.matrix);
    const std::vector<int> chosen = {4, 0, 2, 2, 4, 1};  // a repeat, the first and last
    const int in_pitch = padded_cols(cols, DType::Q8_0);
    const int inputs = shared_input ? routes / k : routes;
    AlignedArray<float> in(size_t(inputs) * in_pitch);
    const std::vector<float> drawn = random_floats(size_t(inputs) * cols, rng, 2.0f);
    for (int i = 0; i < inputs; ++i)
        std::copy_n(&drawn[size_t(i) * cols], cols, in.data() + size_t(i) * in_pitch);
    AlignedArray<float> norm(cols);
    const std::vector<float> norm_drawn = random_floats(cols, rng);
    std::copy(norm_drawn.begin(), norm_drawn.end(), norm.data());
    const float* norm_weight = shared_input ? norm.data() : nullptr;
    const int out_pitch = rows + 3;
    std::vector<float> out(size_t(routes) * out_pitch, NAN);
    const std::vector<float> biases = random_floats(size_t(experts) * rows, rng, 3.0f);
    ExpertLaunch w = expert_launch(device.matrix, rows, chosen.data(), shared_input ? k : 1,
                                   in_pitch, out_pitch);
    if (biased) w.biases = biases.data();
    launch_expert_matvec(out.data(), w, dtype, routes, in.data(), norm_weight);

    int different = 0, far = 0;
    for (int r = 0; r < routes; ++r) {
        const int e = chosen[r];
        const float* route_in = in.data() + size_t(shared_input ? r / k : r) * in_pitch;
        std::vector<float> plain(rows, NAN);
        const float* bias = biased ? &biases[size_t(e) * rows] : nullptr;
        launch_plain_matvec(plain.data(), expert_view(device.matrix, e, rows), dtype, route_in,
                            norm_weight, bias);
        // The double reference: the normed input (as the kernels stage it) times the weights.
        double squares = 0;
        for (int c = 0; c < cols; ++c) squares += double(route_in[c]) * route_in[c];
        const double scale = norm_weight ? 1.0 / std::sqrt(squares / cols + kEps) : 1.0;
        for (int i = 0; i < rows; ++i) {
            const float got = out[size_t(r) * out_pitch + i];
            different += got != plain[i];
            double sum = bias ? bias[i] : 0.0, magnitude = std::fabs(sum);
            for (int c = 0; c < cols; ++c) {
                const double x = route_in[c] * scale * (norm_weight ? norm_weight[c] : 1.0f);
                const double term = stacked.values[size_t(e * rows + i) * cols + c] * x;
                sum += term;
                magnitude += std::fabs(term);
            }
            // Q8/Q4 and the block types multiply the input rounded to int8 (half a step of
            // max|x| / 127 a block of 32 or 256).
            const double error = is_quantized(dtype) || is_block_type(dtype) ? 1.0 / 127 : 1e-5;
            far += std::fabs(got - sum) > error * magnitude + 1e-6;
        }
        for (int i = rows; i < out_pitch; ++i)
            different += !std::isnan(out[size_t(r) * out_pitch + i]);
    }
    CHECK(different == 0);
    CHECK(far == 0);
}

// ---- A prefill batch: its routes grouped by expert, gathered and scattered back

// How the routes of a test batch are drawn: each token's k experts distinct, from a few of the
// experts only (so that most experts get none), or with one expert in every token's routes.
enum class RoutePattern { FewExperts, OneExpertEverywhere };

std::vector<int> random_routes(int tokens, int experts, int k, RoutePattern pattern,
                               std::mt19937& rng) {
    std::vector<int> pool(experts);
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    // FewExperts: the tokens' experts come from k + 2 of them (all where fewer).
    const int drawn_from = pattern == RoutePattern::FewExperts ? std::min(experts, k + 2) : experts;
    const int everywhere = pool[0];
    std::vector<int> routes;
    for (int t = 0; t < tokens; ++t) {
        std::vector<int> candidates(pool.begin(), pool.begin() + drawn_from);
        std::shuffle(candidates.begin(), candidates.end(), rng);
        if (pattern == RoutePattern::OneExpertEverywhere) {
            // `everywhere` at a random place among the token's k.
            candidates.erase(std::find(candidates.begin(), candidates.end(), everywhere));
            candidates.insert(
                candidates.begin() + std::uniform_int_distribution<int>(0, k - 1)(rng), everywhere);
        }
        routes.insert(routes.end(), candidates.begin(), candidates.begin() + k);
    }
    return routes;
}

// The grouping written plainly: for each expert in order, each route of it in route order.
struct ReferenceGroups {
    std::vector<int> start, grouped_row, token_of_row;
};

ReferenceGroups group_reference(const std::vector<int>& chosen, int k, int experts) {
    ReferenceGroups g;
    const int routes = int(chosen.size());
    g.grouped_row.assign(routes, -1);
    for (int e = 0; e < experts; ++e) {
        g.start.push_back(int(g.token_of_row.size()));
        for (int r = 0; r < routes; ++r)
            if (chosen[r] == e) {
                g.grouped_row[r] = int(g.token_of_row.size());
                g.token_of_row.push_back(r / k);
            }
    }
    g.start.push_back(routes);
    return g;
}

void check_grouping(int tokens, int experts, int k, RoutePattern pattern, std::mt19937& rng) {
    INFO(tokens << " tokens, " << experts << " experts, top " << k << ", pattern " << int(pattern));
    const int routes = tokens * k, dim = 37;
    const std::vector<int> chosen = random_routes(tokens, experts, k, pattern, rng);
    std::vector<int> grouped_row(routes, -1), token_of_row(routes, -1);
    const std::vector<int> start = group_routes_by_expert(chosen.data(), routes, k, experts,
                                                          grouped_row.data(), token_of_row.data());
    const ReferenceGroups want = group_reference(chosen, k, experts);
    CHECK(start == want.start);
    CHECK(grouped_row == want.grouped_row);
    CHECK(token_of_row == want.token_of_row);
    if (pattern == RoutePattern::OneExpertEverywhere) {  // the shared expert has every token
        int largest = 0;
        for (int e = 0; e < experts; ++e) largest = std::max(largest, start[e + 1] - start[e]);
        CHECK(largest == tokens);
    }

    // Each grouped row's token's x (gather_rows_kernel, as prefill_experts launches it).
    const std::vector<float> x = random_floats(size_t(tokens) * dim, rng, 2.0f);
    std::vector<float> grouped_x(size_t(routes) * dim, NAN);
    emulate_launch(gather_rows_grid(dim, routes), dim3(kRowsThreads), 0, gather_rows_kernel,
                   grouped_x.data(), x.data(), token_of_row.data(), dim);
    int wrong = 0;
    for (int r = 0; r < routes; ++r)
        for (int i = 0; i < dim; ++i)
            wrong += grouped_x[size_t(want.grouped_row[r]) * dim + i] != x[size_t(r / k) * dim + i];
    CHECK(wrong == 0);

    // The weighted scatter back: x[t] += Σ_j weight(t, j) · (grouped row of route (t, j)).
    const std::vector<float> expert_out = random_floats(size_t(routes) * dim, rng, 3.0f);
    const std::vector<float> weights = random_floats(size_t(routes), rng);
    std::vector<float> got = x;
    emulate_launch(moe_combine_grid(dim, tokens), dim3(kCombineThreads), 0, moe_combine_kernel,
                   got.data(), dim, expert_out.data(), grouped_row.data(), weights.data(), k, dim);
    int far = 0;
    for (int t = 0; t < tokens; ++t)
        for (int i = 0; i < dim; ++i) {
            double sum = x[size_t(t) * dim + i], magnitude = std::fabs(sum);
            for (int j = 0; j < k; ++j) {
                const int r = t * k + j;
                const double term =
                    double(weights[r]) * expert_out[size_t(want.grouped_row[r]) * dim + i];
                sum += term;
                magnitude += std::fabs(term);
            }
            far += std::fabs(got[size_t(t) * dim + i] - sum) > 1e-6 * magnitude;
        }
    CHECK(far == 0);
}

// ---- A whole sparse feed-forward for one token against the CPU backend's

struct SparseLayer {
    Config config;
    std::vector<float> router;
    TestMatrix w1, w3, w2;  // stacked [experts * rows, cols]
    LayerWeights weights{};
};

SparseLayer make_sparse_layer(int experts, int k, bool normalize, int dim, int hidden, DType dtype,
                              std::mt19937& rng) {
    SparseLayer layer;
    Config& c = layer.config;
    c.dim = dim;
    c.experts = experts;
    c.experts_per_token = k;
    c.moe_hidden_dim = hidden;
    c.norm_topk_prob = normalize;
    layer.router = random_floats(size_t(experts) * dim, rng, 0.5f);
    layer.w1 = make_matrix(experts * hidden, dim, dtype, rng);
    layer.w3 = make_matrix(experts * hidden, dim, dtype, rng);
    layer.w2 = make_matrix(experts * dim, hidden, dtype, rng);
    layer.weights.router = layer.router.data();
    for (int e = 0; e < experts; ++e) {
        layer.weights.expert_w1.push_back(matrix_rows(layer.w1.matrix, e * hidden, hidden));
        layer.weights.expert_w3.push_back(matrix_rows(layer.w3.matrix, e * hidden, hidden));
        layer.weights.expert_w2.push_back(matrix_rows(layer.w2.matrix, e * dim, dim));
    }
    return layer;
}

// random_floats in 16-byte aligned memory (the kernels' vector loads).
AlignedArray<float> aligned_random_floats(size_t n, std::mt19937& rng, float scale = 1.0f) {
    const std::vector<float> drawn = random_floats(n, rng, scale);
    AlignedArray<float> values(n);
    std::copy(drawn.begin(), drawn.end(), values.data());
    return values;
}

// The GPU's x after the weighted sum, x + out, against the CPU's out for the same x.
void check_residual_sums(const float* x, const std::vector<float>& cpu_out,
                         const std::vector<float>& gpu_x, DType dtype) {
    double largest = 0, worst = 0;
    for (size_t i = 0; i < cpu_out.size(); ++i) {
        largest = std::max(largest, std::fabs(double(cpu_out[i])));
        worst = std::max(worst, std::fabs(double(gpu_x[i]) - (double(x[i]) + cpu_out[i])));
    }
    // f32: the same sums in other orders; Q8: the int8 input may round one step apart.
    const double allowed = (dtype == DType::F32 ? 1e-5 : 2e-3) * largest;
    INFO("worst difference " << worst << " of outputs up to " << largest);
    CHECK(worst <= allowed);
}

// The CPU's routing of the same logits [tokens, experts] (its own softmax): the same experts.
void check_routes_match_cpu(const std::vector<float>& logits, const std::vector<int>& chosen,
                            int tokens, const Config& c) {
    const int k = c.experts_per_token;
    for (int t = 0; t < tokens; ++t) {
        std::vector<float> cpu_logits(&logits[size_t(t) * c.experts],
                                      &logits[size_t(t) * c.experts] + c.experts);
        std::vector<int> cpu_chosen(k);
        std::vector<float> cpu_weights(k);
        cpu::route_token(cpu_chosen.data(), cpu_weights.data(), cpu_logits.data(), c);
        CHECK(std::equal(cpu_chosen.begin(), cpu_chosen.end(), chosen.begin() + size_t(t) * k));
    }
}

void check_sparse_feed_forward(int experts, int k, bool normalize, int dim, int hidden, DType dtype,
                               std::mt19937& rng) {
    INFO(dtype_name(dtype) << ", " << experts << " experts, top " << k << ", normalize "
                           << normalize << ", dim " << dim << ", hidden " << hidden);
    const SparseLayer layer = make_sparse_layer(experts, k, normalize, dim, hidden, dtype, rng);
    const Config& c = layer.config;
    const AlignedArray<float> x = aligned_random_floats(dim, rng, 2.0f);
    const AlignedArray<float> ffn_norm = aligned_random_floats(dim, rng);

    // The CPU: out = moe(rmsnorm(x)), then x + out.
    std::vector<float> normed(dim), cpu_out(dim, NAN);
    cpu::rmsnorm(normed.data(), x.data(), ffn_norm.data(), dim, kEps);
    cpu::MixtureOfExperts cpu_experts(c);
    cpu_experts.reserve(1);
    cpu_experts.decode(cpu_out.data(), normed.data(), layer.weights);

    // The GPU's kernels in CudaBackend::record_experts's order.
    const Matrix router_matrix{layer.router.data(), DType::F32, experts, dim, nullptr};
    const DeviceCopy router(router_matrix), w1(layer.w1.matrix), w3(layer.w3.matrix),
        w2(layer.w2.matrix);
    const int hidden_pitch = padded_cols(hidden, DType::F32);
    std::vector<float> logits(experts, NAN), route_weights(k, NAN);
    std::vector<int> chosen(k, -1);
    AlignedArray<float> gate(size_t(k) * hidden_pitch, 0.0f), up(size_t(k) * hidden_pitch, 0.0f);
    std::vector<float> expert_out(size_t(k) * dim, NAN);
    launch_plain_matvec(logits.data(), router.matrix, DType::F32, x.data(), ffn_norm.data());
    emulate_launch(dim3(1), dim3(kRouteThreads), 0, route_tokens_kernel, chosen.data(),
                   route_weights.data(), logits.data(), experts, k, normalize);
    launch_expert_matvec(gate.data(),
                         expert_launch(w1.matrix, hidden, chosen.data(), k, 0, hidden_pitch), dtype,
                         k, x.data(), ffn_norm.data());
    launch_expert_matvec(up.data(),
                         expert_launch(w3.matrix, hidden, chosen.data(), k, 0, hidden_pitch), dtype,
                         k, x.data(), ffn_norm.data());
    const int n = k * hidden_pitch;
    emulate_launch(dim3((n + kElementwiseThreads - 1) / kElementwiseThreads),
                   dim3(kElementwiseThreads), 0, swiglu_kernel<Activation::Silu>, gate.data(),
                   up.data(), n, /*limit=*/0.0f);
    launch_expert_matvec(expert_out.data(),
                         expert_launch(w2.matrix, dim, chosen.data(), 1, hidden_pitch, dim), dtype,
                         k, gate.data(), nullptr);
    std::vector<float> gpu_x(x.data(), x.data() + dim);
    emulate_launch(moe_combine_grid(dim, 1), dim3(kCombineThreads), 0, moe_combine_kernel,
                   gpu_x.data(), dim, expert_out.data(), nullptr, route_weights.data(), k, dim);

    check_routes_match_cpu(logits, chosen, 1, c);
    check_residual_sums(x.data(), cpu_out, gpu_x, dtype);
}

// The experts of a prefill batch over their grouped rows, as prefill_experts runs them for f32
// weights with w1 and w3 apart: the grouped rows normed (rmsnorm_rows_kernel), then for each
// expert with rows the SIMT GEMM of w1 and of w3 over its rows, act(gate) * up
// (swiglu_rows_kernel) and the GEMM of w2. expert_out [routes, dim].
void experts_by_gemm(float* expert_out, const SparseLayer& layer, const DeviceMatrix& w1,
                     const DeviceMatrix& w3, const DeviceMatrix& w2, const std::vector<int>& start,
                     const float* grouped_x, const float* ffn_norm) {
    const Config& c = layer.config;
    const int routes = start.back(), H = c.moe_hidden_dim;
    const int dim_pitch = padded_cols(c.dim, DType::F32), hidden_pitch = padded_cols(H, DType::F32);
    AlignedArray<float> normed(size_t(routes) * dim_pitch, NAN);
    AlignedArray<float> gate(size_t(routes) * H, NAN), up(size_t(routes) * H, NAN);
    AlignedArray<float> hidden(size_t(routes) * hidden_pitch, NAN);
    emulate_launch(rmsnorm_rows_grid(routes), dim3(kRowsThreads), 0,
                   rmsnorm_rows_kernel<DType::F32>, normed.data(), c.dim, dim_pitch, grouped_x,
                   ffn_norm, kEps);
    for (int e = 0; e < c.experts; ++e) {
        const int first = start[e], count = start[e + 1] - first;
        if (count == 0) continue;
        const float* in = normed.data() + size_t(first) * dim_pitch;
        for (const auto& [w, out] : {std::pair{&w1, gate.data()}, std::pair{&w3, up.data()}}) {
            const DeviceMatrix m = expert_view(*w, e, H);
            emulate_launch(gemm_simt_grid(count, H), dim3(kSimtThreads), 0,
                           gemm_simt_kernel<DType::F32>, out + size_t(first) * H, H, m.data, H,
                           m.pitch, static_cast<const void*>(in), count, dim_pitch,
                           gemm_k_extent(c.dim, DType::F32), nullptr, false);
        }
        float* expert_hidden = hidden.data() + size_t(first) * hidden_pitch;
        emulate_launch(swiglu_rows_grid(hidden_pitch, count), dim3(kRowsThreads), 0,
                       swiglu_rows_kernel<DType::F32, Activation::Silu>, expert_hidden, H,
                       hidden_pitch, gate.data() + size_t(first) * H, up.data() + size_t(first) * H,
                       H, /*limit=*/0.0f);
        const DeviceMatrix m2 = expert_view(w2, e, c.dim);
        emulate_launch(gemm_simt_grid(count, c.dim), dim3(kSimtThreads), 0,
                       gemm_simt_kernel<DType::F32>, expert_out + size_t(first) * c.dim, c.dim,
                       m2.data, c.dim, m2.pitch, static_cast<const void*>(expert_hidden), count,
                       hidden_pitch, gemm_k_extent(H, DType::F32), nullptr, false);
    }
}

// The same with the expert matvecs (for Q8 weights, whose GEMM runs on tensor cores the
// emulation does not reach here): a route per grouped row, its expert the one whose rows hold
// it, the norm fused.
void experts_by_matvec(float* expert_out, const SparseLayer& layer, const DeviceMatrix& w1,
                       const DeviceMatrix& w3, const DeviceMatrix& w2,
                       const std::vector<int>& start, const float* grouped_x,
                       const float* ffn_norm) {
    const Config& c = layer.config;
    const int routes = start.back(), H = c.moe_hidden_dim, dim = c.dim;
    std::vector<int> expert_of_row(routes, -1);
    for (int e = 0; e < c.experts; ++e)
        for (int g = start[e]; g < start[e + 1]; ++g) expert_of_row[g] = e;
    const int hidden_pitch = padded_cols(H, DType::F32);
    AlignedArray<float> gate(size_t(routes) * hidden_pitch, 0.0f),
        up(size_t(routes) * hidden_pitch, 0.0f);
    launch_expert_matvec(gate.data(),
                         expert_launch(w1, H, expert_of_row.data(), 1, dim, hidden_pitch), w1.dtype,
                         routes, grouped_x, ffn_norm);
    launch_expert_matvec(up.data(),
                         expert_launch(w3, H, expert_of_row.data(), 1, dim, hidden_pitch), w3.dtype,
                         routes, grouped_x, ffn_norm);
    const int n = routes * hidden_pitch;
    emulate_launch(dim3((n + kElementwiseThreads - 1) / kElementwiseThreads),
                   dim3(kElementwiseThreads), 0, swiglu_kernel<Activation::Silu>, gate.data(),
                   up.data(), n, /*limit=*/0.0f);
    launch_expert_matvec(expert_out,
                         expert_launch(w2, dim, expert_of_row.data(), 1, hidden_pitch, dim),
                         w2.dtype, routes, gate.data(), nullptr);
}

// A sparse feed-forward for `tokens` tokens in CudaBackend::prefill_experts's steps: each
// token's router logits and routes, the routes grouped by expert on the host, each grouped
// row's token's x gathered, each expert over its grouped rows (a GEMM an expert for f32
// weights, else the expert matvecs), and the weighted sum back into x; against
// cpu::MixtureOfExperts::prefill (f32; Q8: its decode of each token).
void check_sparse_prefill(int tokens, int experts, int k, bool normalize, int dim, int hidden,
                          DType dtype, std::mt19937& rng) {
    INFO(dtype_name(dtype) << ", " << tokens << " tokens, " << experts << " experts, top " << k
                           << ", dim " << dim << ", hidden " << hidden);
    const SparseLayer layer = make_sparse_layer(experts, k, normalize, dim, hidden, dtype, rng);
    const Config& c = layer.config;
    const int routes = tokens * k;
    const AlignedArray<float> x = aligned_random_floats(size_t(tokens) * dim, rng, 2.0f);
    const AlignedArray<float> ffn_norm = aligned_random_floats(dim, rng);

    // The CPU: out = moe(rmsnorm(x)) row by row, then x + out. Its prefill multiplies Q8
    // weights by the f32 input, where the expert matvecs (and the CPU's decode) round the input
    // to int8 per 32 first: for Q8 the reference is the CPU's decode of each token.
    std::vector<float> normed(size_t(tokens) * dim), cpu_out(size_t(tokens) * dim, NAN);
    for (int t = 0; t < tokens; ++t)
        cpu::rmsnorm(&normed[size_t(t) * dim], x.data() + size_t(t) * dim, ffn_norm.data(), dim,
                     kEps);
    if (dtype == DType::F32) {
        cpu::MixtureOfExperts cpu_experts(c);
        cpu_experts.reserve(tokens);
        cpu_experts.prefill(cpu_out.data(), normed.data(), tokens, layer.weights);
    } else {
        cpu::MixtureOfExperts cpu_experts(c);
        cpu_experts.reserve(1);
        for (int t = 0; t < tokens; ++t)
            cpu_experts.decode(&cpu_out[size_t(t) * dim], &normed[size_t(t) * dim], layer.weights);
    }

    // Routing.
    const Matrix router_matrix{layer.router.data(), DType::F32, experts, dim, nullptr};
    const DeviceCopy router(router_matrix), w1(layer.w1.matrix), w3(layer.w3.matrix),
        w2(layer.w2.matrix);
    std::vector<float> logits(size_t(tokens) * experts, NAN), route_weights(routes, NAN);
    std::vector<int> chosen(routes, -1);
    for (int t = 0; t < tokens; ++t)
        launch_plain_matvec(&logits[size_t(t) * experts], router.matrix, DType::F32,
                            x.data() + size_t(t) * dim, ffn_norm.data());
    emulate_launch(dim3(tokens), dim3(kRouteThreads), 0, route_tokens_kernel, chosen.data(),
                   route_weights.data(), logits.data(), experts, k, normalize);
    check_routes_match_cpu(logits, chosen, tokens, c);
    // Grouping, and each grouped row's input.
    std::vector<int> grouped_row(routes), token_of_row(routes);
    const std::vector<int> start = group_routes_by_expert(chosen.data(), routes, k, experts,
                                                          grouped_row.data(), token_of_row.data());
    AlignedArray<float> grouped_x(size_t(routes) * dim, NAN);
    emulate_launch(gather_rows_grid(dim, routes), dim3(kRowsThreads), 0, gather_rows_kernel,
                   grouped_x.data(), x.data(), token_of_row.data(), dim);
    std::vector<float> expert_out(size_t(routes) * dim, NAN);
    if (dtype == DType::F32)
        experts_by_gemm(expert_out.data(), layer, w1.matrix, w3.matrix, w2.matrix, start,
                        grouped_x.data(), ffn_norm.data());
    else
        experts_by_matvec(expert_out.data(), layer, w1.matrix, w3.matrix, w2.matrix, start,
                          grouped_x.data(), ffn_norm.data());
    // The weighted sum back into x.
    std::vector<float> gpu_x(x.data(), x.data() + size_t(tokens) * dim);
    emulate_launch(moe_combine_grid(dim, tokens), dim3(kCombineThreads), 0, moe_combine_kernel,
                   gpu_x.data(), dim, expert_out.data(), grouped_row.data(), route_weights.data(),
                   k, dim);

    check_residual_sums(x.data(), cpu_out, gpu_x, dtype);
}

// A sparse feed-forward for the `tokens` rows of a server step in CudaBackend::step_experts's
// order: the rows normed in f32 (rmsnorm_rows_kernel), the router's SIMT GEMM, each row routed
// on the device, the expert matvecs over all tokens × k routes (route r reading row r / k, no
// norm: the rows are normed already), act(gate) * up, the w2 matvecs, and the weighted sum
// into x without slots; against the CPU's decode of each row.
void check_sparse_step(int tokens, int experts, int k, bool normalize, int dim, int hidden,
                       DType dtype, std::mt19937& rng) {
    INFO(dtype_name(dtype) << ", a step of " << tokens << " rows, " << experts << " experts, top "
                           << k << ", dim " << dim << ", hidden " << hidden);
    const SparseLayer layer = make_sparse_layer(experts, k, normalize, dim, hidden, dtype, rng);
    const Config& c = layer.config;
    const int routes = tokens * k;
    const AlignedArray<float> x = aligned_random_floats(size_t(tokens) * dim, rng, 2.0f);
    const AlignedArray<float> ffn_norm = aligned_random_floats(dim, rng);

    // The CPU: each row's moe(rmsnorm(x)) as decode computes it, then x + out.
    std::vector<float> normed(dim), cpu_out(size_t(tokens) * dim, NAN);
    cpu::MixtureOfExperts cpu_experts(c);
    cpu_experts.reserve(1);
    for (int t = 0; t < tokens; ++t) {
        cpu::rmsnorm(normed.data(), x.data() + size_t(t) * dim, ffn_norm.data(), dim, kEps);
        cpu_experts.decode(&cpu_out[size_t(t) * dim], normed.data(), layer.weights);
    }

    // The GPU's kernels.
    const Matrix router_matrix{layer.router.data(), DType::F32, experts, dim, nullptr};
    const DeviceCopy router(router_matrix), w1(layer.w1.matrix), w3(layer.w3.matrix),
        w2(layer.w2.matrix);
    const int dim_pitch = padded_cols(dim, DType::F32),
              hidden_pitch = padded_cols(hidden, DType::F32);
    AlignedArray<float> gpu_normed(size_t(tokens) * dim_pitch, 0.0f);
    emulate_launch(rmsnorm_rows_grid(tokens), dim3(kRowsThreads), 0,
                   rmsnorm_rows_kernel<DType::F32>, gpu_normed.data(), dim, dim_pitch, x.data(),
                   ffn_norm.data(), kEps);
    std::vector<float> logits(size_t(tokens) * experts, NAN), route_weights(routes, NAN);
    std::vector<int> chosen(routes, -1);
    emulate_launch(gemm_simt_grid(tokens, experts), dim3(kSimtThreads), 0,
                   gemm_simt_kernel<DType::F32>, logits.data(), experts, router.matrix.data,
                   experts, router.matrix.pitch, static_cast<const void*>(gpu_normed.data()),
                   tokens, dim_pitch, gemm_k_extent(dim, DType::F32), nullptr, false);
    emulate_launch(dim3(tokens), dim3(kRouteThreads), 0, route_tokens_kernel, chosen.data(),
                   route_weights.data(), logits.data(), experts, k, normalize);
    check_routes_match_cpu(logits, chosen, tokens, c);
    AlignedArray<float> gate(size_t(routes) * hidden_pitch, 0.0f),
        up(size_t(routes) * hidden_pitch, 0.0f);
    launch_expert_matvec(
        gate.data(), expert_launch(w1.matrix, hidden, chosen.data(), k, dim_pitch, hidden_pitch),
        dtype, routes, gpu_normed.data(), nullptr);
    launch_expert_matvec(
        up.data(), expert_launch(w3.matrix, hidden, chosen.data(), k, dim_pitch, hidden_pitch),
        dtype, routes, gpu_normed.data(), nullptr);
    const int n = routes * hidden_pitch;
    emulate_launch(dim3((n + kElementwiseThreads - 1) / kElementwiseThreads),
                   dim3(kElementwiseThreads), 0, swiglu_kernel<Activation::Silu>, gate.data(),
                   up.data(), n, /*limit=*/0.0f);
    std::vector<float> expert_out(size_t(routes) * dim, NAN);
    launch_expert_matvec(expert_out.data(),
                         expert_launch(w2.matrix, dim, chosen.data(), 1, hidden_pitch, dim), dtype,
                         routes, gate.data(), nullptr);
    std::vector<float> gpu_x(x.data(), x.data() + size_t(tokens) * dim);
    emulate_launch(moe_combine_grid(dim, tokens), dim3(kCombineThreads), 0, moe_combine_kernel,
                   gpu_x.data(), dim, expert_out.data(), nullptr, route_weights.data(), k, dim);

    check_residual_sums(x.data(), cpu_out, gpu_x, dtype);
}

}  // namespace

TEST_CASE("emulated route_tokens_kernel picks the experts and weights of the scalar routing",
          "[cuda_emulation][moe]") {
    std::mt19937 rng(60);
    for (const bool normalize : {true, false}) {
        check_routing(8, 2, normalize, rng);    // Mixtral
        check_routing(128, 8, normalize, rng);  // Qwen3-MoE
        check_routing(60, 4, normalize, rng);   // not a multiple of 32
        check_routing(8, 8, normalize, rng);    // every expert
        check_routing(128, 2, normalize, rng);
    }
}

TEST_CASE("routing logits that are not numbers still pick k distinct experts in range",
          "[cuda_emulation][moe]") {
    // A file whose weights are not finite gives NaN router logits (an infinite logit makes
    // the softmax NaN too); the picks index the stacked experts, so they must stay in range.
    const int experts = 40, k = 4, tokens = 3;
    std::mt19937 rng(62);
    std::vector<float> logits = random_floats(size_t(tokens) * experts, rng);
    std::fill_n(logits.begin(), experts, NAN);   // token 0: every logit
    logits[size_t(experts) + 7] = NAN;           // token 1: one
    logits[size_t(2) * experts + 5] = INFINITY;  // token 2: one infinite
    std::vector<int> chosen(size_t(tokens) * k, -1);
    std::vector<float> weights(size_t(tokens) * k);
    emulate_launch(dim3(tokens), dim3(kRouteThreads), 0, route_tokens_kernel, chosen.data(),
                   weights.data(), logits.data(), experts, k, true);
    Config c;
    c.experts = experts;
    c.experts_per_token = k;
    c.norm_topk_prob = true;
    for (int t = 0; t < tokens; ++t) {
        INFO("token " << t);
        std::vector<float> cpu_logits(logits.begin() + size_t(t) * experts,
                                      logits.begin() + size_t(t + 1) * experts);
        std::vector<int> cpu_chosen(k, -1);
        std::vector<float> cpu_weights(k);
        cpu::route_token(cpu_chosen.data(), cpu_weights.data(), cpu_logits.data(), c);
        const std::vector<int> device_chosen(chosen.begin() + size_t(t) * k,
                                             chosen.begin() + size_t(t + 1) * k);
        for (const std::vector<int>& picks : {device_chosen, cpu_chosen}) {
            std::vector<int> sorted = picks;
            std::sort(sorted.begin(), sorted.end());
            CHECK(sorted.front() >= 0);
            CHECK(sorted.back() < experts);
            CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
        }
        // The kernel's softmax sum is NaN in each of these rows, so every probability is:
        // equal in rank, they go to the lowest indices.
        CHECK(device_chosen == std::vector<int>{0, 1, 2, 3});
    }
}

TEST_CASE("emulated expert matvecs read each route's expert from device memory",
          "[cuda_emulation][moe]") {
    std::mt19937 rng(61);
    for (const bool shared_input : {true, false}) {
        check_expert_matvec(DType::F32, 37, 44, shared_input, rng);
        check_expert_matvec(DType::F16, 19, 40, shared_input, rng);
        check_expert_matvec(DType::Q8_0, 37, 45, shared_input, rng);
        check_expert_matvec(DType::Q4_0, 21, 64, shared_input, rng);
        check_expert_matvec(DType::Q4_K, 13, 512, shared_input, rng);
        check_expert_matvec(DType::Q6_K, 11, 768, shared_input, rng);
        check_expert_matvec(DType::Q5_0, 9, 96, shared_input, rng);
        check_expert_matvec(DType::Q3_K, 7, 512, shared_input, rng);
        check_expert_matvec(DType::Q2_K, 5, 256, shared_input, rng);
        check_expert_matvec(DType::IQ4_NL, 15, 160, shared_input, rng);
        check_expert_matvec(DType::IQ2_XXS, 5, 512, shared_input, rng);
        check_expert_matvec(DType::IQ2_XS, 7, 256, shared_input, rng);
        check_expert_matvec(DType::IQ2_S, 3, 256, shared_input, rng);
        check_expert_matvec(DType::IQ3_XXS, 6, 256, shared_input, rng);
        check_expert_matvec(DType::IQ3_S, 9, 512, shared_input, rng);
        check_expert_matvec(DType::IQ1_S, 4, 256, shared_input, rng);
        check_expert_matvec(DType::IQ1_M, 11, 256, shared_input, rng);
        check_expert_matvec(DType::MXFP4, 13, 224, shared_input, rng);
        check_expert_matvec(DType::TQ1_0, 6, 512, shared_input, rng);
        check_expert_matvec(DType::TQ2_0, 5, 256, shared_input, rng);
    }
}

TEST_CASE("emulated expert matvecs add each route's expert's bias", "[cuda_emulation][moe]") {
    std::mt19937 rng(67);
    for (const bool shared_input : {true, false}) {
        check_expert_matvec(DType::F32, 37, 44, shared_input, rng, /*biased=*/true);
        check_expert_matvec(DType::F16, 19, 40, shared_input, rng, /*biased=*/true);
        check_expert_matvec(DType::Q8_0, 37, 45, shared_input, rng, /*biased=*/true);
        check_expert_matvec(DType::MXFP4, 13, 224, shared_input, rng, /*biased=*/true);
    }
}

TEST_CASE("an emulated sparse feed-forward matches the CPU backend's mixture of experts",
          "[cuda_emulation][moe]") {
    std::mt19937 rng(62);
    check_sparse_feed_forward(8, 2, true, 96, 52, DType::F32, rng);    // Mixtral's routing
    check_sparse_feed_forward(36, 8, true, 64, 40, DType::F32, rng);   // Qwen3-MoE's
    check_sparse_feed_forward(36, 8, false, 64, 40, DType::F32, rng);  // not renormalised
    check_sparse_feed_forward(8, 2, true, 96, 64, DType::Q8_0, rng);
    check_sparse_feed_forward(36, 8, true, 64, 96, DType::Q8_0, rng);
}

TEST_CASE("a prefill batch's routes grouped by expert, gathered and scattered back",
          "[cuda_emulation][moe]") {
    std::mt19937 rng(63);
    for (const int tokens : {1, 7, 60})
        for (const RoutePattern pattern :
             {RoutePattern::FewExperts, RoutePattern::OneExpertEverywhere}) {
            check_grouping(tokens, 8, 2, pattern, rng);
            check_grouping(tokens, 60, 8, pattern, rng);
            check_grouping(tokens, 128, 8, pattern, rng);
        }
}

TEST_CASE("grouping rejects an expert index out of range", "[cuda_emulation][moe]") {
    const std::vector<int> chosen = {0, 3, 8, 1};
    std::vector<int> grouped_row(4), token_of_row(4);
    CHECK_THROWS_AS(
        group_routes_by_expert(chosen.data(), 4, 2, 8, grouped_row.data(), token_of_row.data()),
        Error);
}

TEST_CASE("an emulated sparse prefill matches the CPU backend's mixture of experts",
          "[cuda_emulation][moe]") {
    std::mt19937 rng(64);
    check_sparse_prefill(1, 8, 2, true, 96, 52, DType::F32, rng);
    check_sparse_prefill(5, 8, 2, true, 96, 52, DType::F32, rng);
    check_sparse_prefill(7, 36, 8, false, 64, 40, DType::F32, rng);
    check_sparse_prefill(6, 36, 8, true, 64, 96, DType::Q8_0, rng);
}

TEST_CASE("an emulated sparse server step matches the CPU backend's mixture of experts per row",
          "[cuda_emulation][moe]") {
    std::mt19937 rng(65);
    check_sparse_step(1, 8, 2, true, 96, 52, DType::F32, rng);
    check_sparse_step(5, 8, 2, true, 92, 52, DType::F32, rng);  // rows 23 × 16 bytes apart
    check_sparse_step(7, 36, 8, false, 64, 40, DType::F32, rng);
    check_sparse_step(3, 36, 8, true, 64, 96, DType::Q8_0, rng);
    check_sparse_step(6, 8, 2, true, 64, 64, DType::Q4_0, rng);
}
