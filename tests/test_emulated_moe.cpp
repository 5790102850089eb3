// The mixture-of-experts kernels (kernels/moe.cuh) on the CUDA emulation: the routing
// (route_tokens_kernel) against a scalar reference written here (softmax, the k best with the
// lower index winning an exact tie, renormalised or not; exact ties, near-ties one ulp apart,
// 8, 60 and 128 experts), the expert matvecs (each route's expert read from device memory)
// against the plain matvec kernels on that expert's matrix and a double reference, and a whole
// sparse feed-forward for one token, launched as CudaBackend::record_experts launches it,
// against the CPU backend's cpu::MixtureOfExperts::decode (f32 and Q8 weights).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/moe.h"
#include "elementwise_simple.cuh"
#include "emulated_inputs.h"
#include "moe.cuh"
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
            FAIL("no expert matvec launch for this dtype here");
    }
}

// The plain matvec of one matrix (matvec.cuh, matvec_quantized.cuh), unnormed, no bias.
void launch_plain_matvec(float* out, const DeviceMatrix& m, DType dtype, const float* in,
                         const float* norm_weight) {
    if (is_quantized(dtype)) {
        const dim3 grid = quantized_matvec_grid(m.rows, 1);
        const size_t shared = quantized_staging_bytes(m.pitch);
        if (dtype == DType::Q8_0)
            emulate_launch(grid, dim3(kQuantizedMatvecThreads), shared,
                           quantized_matvec_kernel<DType::Q8_0, false, false, 1>, out, m.data,
                           m.scales, m.rows, m.pitch, in, m.cols, norm_weight, kEps, nullptr);
        else
            emulate_launch(grid, dim3(kQuantizedMatvecThreads), shared,
                           quantized_matvec_kernel<DType::Q4_0, false, false, 1>, out, m.data,
                           m.scales, m.rows, m.pitch, in, m.cols, norm_weight, kEps, nullptr);
        return;
    }
    const dim3 grid = matvec_grid(m.rows, m.pitch), block = matvec_block(m.pitch);
    const size_t shared = staged_input_bytes(m.pitch);
    if (dtype == DType::F32)
        emulate_launch(grid, block, shared, matvec_kernel<DType::F32, false>, out, m.data, m.rows,
                       m.pitch, in, m.cols, norm_weight, kEps, nullptr);
    else
        emulate_launch(grid, block, shared, matvec_kernel<DType::F16, false>, out, m.data, m.rows,
                       m.pitch, in, m.cols, norm_weight, kEps, nullptr);
}

// DeviceExperts::expert's view, of a stacked copy.
DeviceMatrix expert_view(const DeviceMatrix& stacked, int e, int rows) {
    DeviceExperts experts;
    experts.stacked = stacked;
    experts.rows = rows;
    return experts.expert(e);
}

void check_expert_matvec(DType dtype, int rows, int cols, bool shared_input, std::mt19937& rng) {
    INFO(dtype_name(dtype) << ", experts of " << rows << " x " << cols << ", shared input "
                           << shared_input);
    const int experts = 5, routes = 6, k = 3;
    const TestMatrix stacked = make_matrix(experts * rows, cols, dtype, rng);
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
    const ExpertLaunch w = expert_launch(device.matrix, rows, chosen.data(), shared_input ? k : 1,
                                         in_pitch, out_pitch);
    launch_expert_matvec(out.data(), w, dtype, routes, in.data(), norm_weight);

    int different = 0, far = 0;
    for (int r = 0; r < routes; ++r) {
        const int e = chosen[r];
        const float* route_in = in.data() + size_t(shared_input ? r / k : r) * in_pitch;
        std::vector<float> plain(rows, NAN);
        launch_plain_matvec(plain.data(), expert_view(device.matrix, e, rows), dtype, route_in,
                            norm_weight);
        // The double reference: the normed input (as the kernels stage it) times the weights.
        double squares = 0;
        for (int c = 0; c < cols; ++c) squares += double(route_in[c]) * route_in[c];
        const double scale = norm_weight ? 1.0 / std::sqrt(squares / cols + kEps) : 1.0;
        for (int i = 0; i < rows; ++i) {
            const float got = out[size_t(r) * out_pitch + i];
            different += got != plain[i];
            double sum = 0, magnitude = 0;
            for (int c = 0; c < cols; ++c) {
                const double x = route_in[c] * scale * (norm_weight ? norm_weight[c] : 1.0f);
                const double term = stacked.values[size_t(e * rows + i) * cols + c] * x;
                sum += term;
                magnitude += std::fabs(term);
            }
            // Q8/Q4 multiply the input rounded to int8 (half a step of max|x| / 127 a block).
            const double error = is_quantized(dtype) ? 1.0 / 127 : 1e-5;
            far += std::fabs(got - sum) > error * magnitude + 1e-6;
        }
        for (int i = rows; i < out_pitch; ++i)
            different += !std::isnan(out[size_t(r) * out_pitch + i]);
    }
    CHECK(different == 0);
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

void check_sparse_feed_forward(int experts, int k, bool normalize, int dim, int hidden, DType dtype,
                               std::mt19937& rng) {
    INFO(dtype_name(dtype) << ", " << experts << " experts, top " << k << ", normalize "
                           << normalize << ", dim " << dim << ", hidden " << hidden);
    const SparseLayer layer = make_sparse_layer(experts, k, normalize, dim, hidden, dtype, rng);
    const Config& c = layer.config;
    AlignedArray<float> x(dim), ffn_norm(dim);
    const std::vector<float> x_drawn = random_floats(dim, rng, 2.0f);
    const std::vector<float> norm_drawn = random_floats(dim, rng);
    std::copy(x_drawn.begin(), x_drawn.end(), x.data());
    std::copy(norm_drawn.begin(), norm_drawn.end(), ffn_norm.data());

    // The CPU: out = moe(rmsnorm(x)), then x + out.
    std::vector<float> normed(dim), cpu_out(dim, NAN);
    cpu::rmsnorm(normed.data(), x.data(), ffn_norm.data(), dim, kEps);
    cpu::MixtureOfExperts cpu_experts(c, 1);
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
                   up.data(), n);
    launch_expert_matvec(expert_out.data(),
                         expert_launch(w2.matrix, dim, chosen.data(), 1, hidden_pitch, dim), dtype,
                         k, gate.data(), nullptr);
    std::vector<float> gpu_x(x.data(), x.data() + dim);
    emulate_launch(moe_combine_grid(dim, 1), dim3(kCombineThreads), 0, moe_combine_kernel,
                   gpu_x.data(), dim, expert_out.data(), nullptr, route_weights.data(), k, dim);

    // The CPU's routing of the same logits (its own softmax): the same experts.
    std::vector<float> cpu_logits = logits;
    std::vector<int> cpu_chosen(k);
    std::vector<float> cpu_weights(k);
    cpu::route_token(cpu_chosen.data(), cpu_weights.data(), cpu_logits.data(), c);
    CHECK(chosen == cpu_chosen);
    double largest = 0, worst = 0;
    for (int i = 0; i < dim; ++i) largest = std::max(largest, std::fabs(double(cpu_out[i])));
    for (int i = 0; i < dim; ++i)
        worst = std::max(worst, std::fabs(double(gpu_x[i]) - (double(x[i]) + cpu_out[i])));
    // f32: the same sums in other orders; Q8: the int8 input may round one step apart.
    const double allowed = (dtype == DType::F32 ? 1e-5 : 2e-3) * largest;
    INFO("worst difference " << worst << " of outputs up to " << largest);
    CHECK(worst <= allowed);
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

TEST_CASE("emulated expert matvecs read each route's expert from device memory",
          "[cuda_emulation][moe]") {
    std::mt19937 rng(61);
    for (const bool shared_input : {true, false}) {
        check_expert_matvec(DType::F32, 37, 44, shared_input, rng);
        check_expert_matvec(DType::F16, 19, 40, shared_input, rng);
        check_expert_matvec(DType::Q8_0, 37, 45, shared_input, rng);
        check_expert_matvec(DType::Q4_0, 21, 64, shared_input, rng);
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
