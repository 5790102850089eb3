// Test tool (built only with nvcc): every CUDA kernel against the CPU kernel that computes
// the same thing, on random inputs of awkward shapes (sizes off the vector widths and off
// 32, GQA, sliding windows, several attention splits), with outputs poisoned (NaN) before
// each run so that an element the kernel forgot to write fails. The GPU ladder's simple
// kernels (kernels/*_simple.cuh) are checked the same way, beside the fast kernel that
// computes what they compute. Prints one line per check and ends
// with "N passed, M failed"; exits 1 when a check failed, 2 when no GPU is usable.
//   cuda_kernel_check [--bench | --bench-only]
// --bench also times the decode matvecs (f16, bf16, f32; Q4 and Q8 in each launch shape of
// their int8 products; the block types Q4_K, Q6_K, ...) and attention at Mistral-7B shapes and
// prints their bandwidth next to a device-to-device copy's, and the prefill GEMM's time, TFLOPS and
// share of the tensor cores' peak (512 tokens), and its time next to that of as many decode matvecs
// (1-64 tokens), and the prefill attention of a 512-token prompt. --bench-only times them without
// the checks (for a profiler: the first launch of each kernel is then the benchmark's).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend.h"
#include "cpu/kernels.h"
#include "cuda_check.h"
#include "device_memory.h"
#include "kernels.h"
#include "weights/half.h"

using namespace barellm;
using cuda::DeviceBuffer;
using cuda::DeviceMatrix;

namespace {

int passed = 0, failed = 0;
// Dynamic shared memory a block may use on this GPU (main sets it), less the matvecs' own
// static shared memory with room to spare (as forward.cu counts it). Q8/Q4 matvecs over
// 14336 columns stage 75 KiB: more than sm_75 allows.
size_t shared_memory_limit = 0;
constexpr size_t kStaticSharedAllowance = 1024;
bool matvec_fits(int cols, DType dtype) {
    return cuda::matvec_shared_bytes(cols, dtype) <= shared_memory_limit;
}
std::mt19937 rng(12345);

std::vector<float> random_floats(size_t count, float scale = 1.0f) {
    std::normal_distribution<float> normal(0.0f, scale);
    std::vector<float> values(count);
    for (float& v : values) v = normal(rng);
    return values;
}

uint16_t float_to_bf16(float value) {  // round to nearest even (inputs are finite)
    uint32_t bits = float_to_bits(value);
    bits += 0x7fff + ((bits >> 16) & 1);
    return uint16_t(bits >> 16);
}

// A host matrix of `dtype` holding rounded random values, kept alive with its bytes.
struct HostMatrix {
    std::vector<uint8_t> bytes;
    Matrix matrix;
};

// Uniform values in [-1, 1) from a xorshift generator: for timing, where only speed matters.
std::vector<float> cheap_random_floats(size_t count) {
    std::vector<float> values(count);
    uint64_t state = 0x9e3779b97f4a7c15ull;
    for (float& v : values) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        v = float(int32_t(state >> 32)) * (1.0f / 2147483648.0f);
    }
    return values;
}

// A host matrix [rows, cols] of `dtype` holding `values` rounded to it.
HostMatrix host_matrix(const std::vector<float>& values, int rows, int cols, DType dtype) {
    HostMatrix m;
    m.bytes.resize(values.size() * dtype_size(dtype));
    for (size_t i = 0; i < values.size(); ++i) {
        if (dtype == DType::F32) {
            std::memcpy(&m.bytes[4 * i], &values[i], 4);
        } else {
            const uint16_t bits =
                dtype == DType::F16 ? float_to_half(values[i]) : float_to_bf16(values[i]);
            std::memcpy(&m.bytes[2 * i], &bits, 2);
        }
    }
    m.matrix = Matrix{m.bytes.data(), dtype, rows, cols};
    return m;
}

// Random values about 1 / sqrt(cols), so that a row's dot product with values about 1 is
// about 1 (or, cheap, uniform in [-1, 1)).
HostMatrix random_matrix(int rows, int cols, DType dtype, bool cheap = false) {
    const std::vector<float> values =
        cheap ? cheap_random_floats(size_t(rows) * cols)
              : random_floats(size_t(rows) * cols, 1.0f / std::sqrt(float(cols)));
    return host_matrix(values, rows, cols, dtype);
}

// A random Q8 (I8) or Q4 (U8) host matrix: every value and every f16 scale drawn at random
// (Q8 values in [-127, 127], Q4 nibbles in [0, 15]; scales of either sign, about
// 1 / (64 sqrt(cols)), so that the weights are about 1 / sqrt(cols)). Q4 needs cols a
// multiple of 32. cheap: xorshift bytes and one scale for all blocks, for timing.
HostMatrix random_quantized_matrix(int rows, int cols, DType dtype, bool cheap = false) {
    HostMatrix m;
    m.matrix = Matrix{nullptr, dtype, rows, cols};
    const size_t value_bytes = size_t(rows) * m.matrix.row_bytes();
    const size_t scales = size_t(rows) * m.matrix.scale_count_per_row();
    m.bytes.resize(value_bytes + scales * sizeof(uint16_t));
    std::uniform_int_distribution<int> q8(-127, 127), byte(0, 255);
    uint64_t state = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < value_bytes; ++i) {
        if (cheap) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            m.bytes[i] = uint8_t(state >> 56);
        } else {
            m.bytes[i] = uint8_t(dtype == DType::Q8_0 ? q8(rng) : byte(rng));
        }
    }
    const float scale_size = 1.0f / (64.0f * std::sqrt(float(cols)));
    std::normal_distribution<float> normal(0.0f, scale_size);
    for (size_t i = 0; i < scales; ++i) {
        const uint16_t bits = float_to_half(cheap ? scale_size : normal(rng));
        std::memcpy(&m.bytes[value_bytes + 2 * i], &bits, 2);
    }
    m.matrix.data = m.bytes.data();
    m.matrix.scales = reinterpret_cast<const uint16_t*>(m.bytes.data() + value_bytes);
    return m;
}

// The block types the CUDA backend runs (src/weights/weight_blocks.h).
constexpr DType kBlockTypes[] = {DType::Q4_K,  DType::Q6_K,    DType::Q5_K,    DType::Q4_1,
                                 DType::Q5_0,  DType::Q5_1,    DType::IQ4_XS,  DType::Q3_K,
                                 DType::Q2_K,  DType::IQ4_NL,  DType::IQ2_XXS, DType::IQ2_XS,
                                 DType::IQ2_S, DType::IQ3_XXS, DType::IQ3_S,   DType::IQ1_S,
                                 DType::IQ1_M, DType::TQ1_0,   DType::TQ2_0,   DType::MXFP4};

// Byte offsets of a block's f16 fields (d, and dmin or m where the type has them; IQ1_M's d is
// spread over its scales words, MXFP4's scale is an exponent byte: set_block_half).
std::vector<int> block_half_fields(DType dtype) {
    switch (dtype) {
        case DType::Q4_1:
        case DType::Q5_1:
        case DType::Q4_K:
        case DType::Q5_K:
            return {0, 2};
        case DType::Q2_K:
            return {int(offsetof(BlockQ2_K, d)), int(offsetof(BlockQ2_K, dmin))};
        case DType::Q3_K:
            return {int(offsetof(BlockQ3_K, d))};
        case DType::Q6_K:
            return {208};
        case DType::IQ1_M:
            return {int(offsetof(BlockIQ1_M, scales))};
        case DType::TQ1_0:
            return {int(offsetof(BlockTQ1_0, d))};
        case DType::TQ2_0:
            return {int(offsetof(BlockTQ2_0, d))};
        default:  // Q5_0, IQ4_XS, IQ4_NL, the other i-quants, MXFP4
            return {0};
    }
}

// The largest MXFP4 exponent whose weights are finite (12 · 2^(252 − 128) < 2^128), as the
// converter allows.
constexpr int kLargestMxfp4Exponent = 252;

// Sets the f16 field at `field` (block_half_fields) of a block of `dtype` to `bits`; IQ1_M's d
// as the top nibbles of its four scales words (iq1m_d), their sub-block scales kept; MXFP4's
// exponent to that of the power of two nearest below |bits| (0 for 0).
void set_block_half(DType dtype, uint8_t* block, int field, uint16_t bits) {
    if (dtype == DType::MXFP4) {
        const float value = std::fabs(half_to_float(bits));
        block[field] = value == 0.0f
                           ? 0
                           : uint8_t(std::clamp(std::ilogb(value) + 128, 0, kLargestMxfp4Exponent));
        return;
    }
    if (dtype != DType::IQ1_M) {
        std::memcpy(block + field, &bits, 2);
        return;
    }
    for (int i = 0; i < 4; ++i) {
        uint16_t word;
        std::memcpy(&word, block + field + 2 * i, 2);
        word = uint16_t((word & 0x0fffu) | ((bits >> (4 * i)) & 15u) << 12);
        std::memcpy(block + field + 2 * i, &word, 2);
    }
}

// About the largest integer factor of a block type's weights (sub-block scales included): about
// 1000 for the K types, 30 for Q4_1, Q5_0 and Q5_1, 127 for IQ4_NL and 12 for MXFP4 (their
// largest levels), and for
// the i-quants the largest (2s + 1) / divisor times the largest grid value: IQ2's 31 / 8 · 43,
// IQ3_XXS's 31 / 4 · 62, IQ3_S's 31 · 15, IQ1's 15 · 9 / 8; 2 for the ternary types (TQ2_0's
// level 3).
float largest_integer_factor(DType dtype) {
    switch (dtype) {
        case DType::IQ4_NL:
            return -float(kIq4Values[0]);
        case DType::MXFP4:
            return float(kMxfp4LargestLevel);
        case DType::IQ2_XXS:
        case DType::IQ2_XS:
        case DType::IQ2_S:
            return 31.0f / 8 * 43;
        case DType::IQ3_XXS:
            return 31.0f / 4 * 62;
        case DType::IQ3_S:
            return 31.0f * 15;
        case DType::IQ1_S:
        case DType::IQ1_M:
            return 15.0f * 9 / 8;
        case DType::TQ1_0:
        case DType::TQ2_0:
            return 2.0f;
        default:
            return block_weights(dtype) == kSuperBlock ? 1000.0f : 30.0f;
    }
}

// A random host matrix of block type `dtype` (cols a multiple of its block): random bytes,
// each block's f16 fields of either sign, sized so that the weights are about
// 1 / sqrt(cols) (largest_integer_factor). cheap: xorshift bytes, for timing (the f16 fields
// still set: random bytes would hold infinities and NaNs).
HostMatrix random_block_matrix(int rows, int cols, DType dtype, bool cheap = false) {
    HostMatrix m;
    m.matrix = Matrix{nullptr, dtype, rows, cols};
    const size_t row_bytes = m.matrix.row_bytes();
    m.bytes.resize(size_t(rows) * row_bytes);
    std::uniform_int_distribution<int> byte(0, 255);
    uint64_t state = 0x9e3779b97f4a7c15ull;
    for (uint8_t& b : m.bytes) {
        if (cheap) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            b = uint8_t(state >> 56);
        } else {
            b = uint8_t(byte(rng));
        }
    }
    const float scale_size = 1.0f / (largest_integer_factor(dtype) * std::sqrt(float(cols)));
    std::normal_distribution<float> normal(0.0f, scale_size);
    const size_t blocks = size_t(rows) * (cols / block_weights(dtype));
    for (size_t b = 0; b < blocks; ++b)
        for (const int field : block_half_fields(dtype))
            set_block_half(dtype, &m.bytes[b * block_bytes(dtype)], field,
                           float_to_half(cheap ? scale_size : normal(rng)));
    m.matrix.data = m.bytes.data();
    return m;
}

// A random matrix of any weight type (cols a whole number of blocks for Q4 and the block
// types).
HostMatrix random_weights(int rows, int cols, DType dtype) {
    if (is_block_type(dtype)) return random_block_matrix(rows, cols, dtype);
    if (is_quantized(dtype)) return random_quantized_matrix(rows, cols, dtype);
    return random_matrix(rows, cols, dtype);
}

const char* dtype_label(DType dtype) {
    switch (dtype) {
        case DType::F32:
            return "f32";
        case DType::F16:
            return "f16";
        case DType::BF16:
            return "bf16";
        case DType::Q8_0:
            return "q8";
        case DType::Q4_0:
            return "q4";
        default:
            return dtype_name(dtype);
    }
}
const char* kv_label(KvType type) { return type == KvType::F32 ? "f32" : "f16"; }

DeviceBuffer to_device(const void* data, size_t bytes) {
    DeviceBuffer buffer(bytes, "a test input");
    CUDA_CHECK(cudaMemcpy(buffer.as(), data, bytes, cudaMemcpyHostToDevice));
    return buffer;
}
DeviceBuffer to_device(const std::vector<float>& values) {
    return to_device(values.data(), values.size() * sizeof(float));
}

// A device buffer of `count` floats, every one NaN.
DeviceBuffer poisoned(size_t count) {
    DeviceBuffer buffer(count * sizeof(float), "a test output");
    CUDA_CHECK(cudaMemset(buffer.as(), 0xff, count * sizeof(float)));
    return buffer;
}

// For Q8/Q4 and block-type w: scratch (in `memory`) where gemm dequantizes `matrices`
// matrices of its shape to f16, as the prefill lends it; none for other weights.
cuda::DequantizeScratch dequantize_scratch(const DeviceMatrix& w, int matrices,
                                           DeviceBuffer& memory) {
    if (!is_quantized(w.dtype) && !is_block_type(w.dtype)) return {};
    memory = DeviceBuffer(matrices * cuda::dequantized_bytes(w.rows, w.cols), "the f16 weights");
    return {memory.as(), memory.bytes()};
}

std::vector<float> to_host(const void* device, size_t count) {
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> values(count);
    CUDA_CHECK(cudaMemcpy(values.data(), device, count * sizeof(float), cudaMemcpyDeviceToHost));
    return values;
}

// ‖got − want‖ / ‖want‖ (absolute when want is 0); infinite when got has a NaN.
// ‖got − want‖ / ‖scale‖ (absolute when scale is 0); infinite when got has a NaN.
double scaled_error(const std::vector<float>& got, const std::vector<float>& want,
                    const std::vector<float>& scale) {
    double difference = 0, norm = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        if (!std::isfinite(got[i])) return INFINITY;
        difference += double(got[i] - want[i]) * (got[i] - want[i]);
        norm += double(scale[i]) * scale[i];
    }
    return norm > 0 ? std::sqrt(difference / norm) : std::sqrt(difference);
}

double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
    return scaled_error(got, want, want);
}

// The error of `got` against ‖scale‖ (report_scaled) or ‖want‖ (report) within tolerance.
void report_error(const std::string& name, double error, double tolerance) {
    const bool ok = error <= tolerance;
    (ok ? passed : failed)++;
    std::printf("%s %-60s rel error %.2e (tolerance %.0e)\n", ok ? "PASS" : "FAIL", name.c_str(),
                error, tolerance);
    std::fflush(stdout);
}

void report(const std::string& name, const std::vector<float>& got, const std::vector<float>& want,
            double tolerance) {
    report_error(name, relative_error(got, want), tolerance);
}

// As report, the error measured against ‖scale‖ instead of ‖want‖. For dot products scale
// holds each row's Σ |w·x|, what rounding errors grow with however much the terms cancel:
// against ‖want‖, a single row whose terms happen to cancel would fail on rounding alone.
void report_scaled(const std::string& name, const std::vector<float>& got,
                   const std::vector<float>& want, const std::vector<float>& scale,
                   double tolerance) {
    report_error(name, scaled_error(got, want, scale), tolerance);
}

std::vector<float> kv_values_as_float(const std::vector<uint8_t>& cache, KvType type) {
    const size_t count = cache.size() / kv_element_bytes(type);
    std::vector<float> values(count);
    for (size_t i = 0; i < count; ++i) {
        if (type == KvType::F32) {
            std::memcpy(&values[i], &cache[4 * i], 4);
        } else {
            uint16_t bits;
            std::memcpy(&bits, &cache[2 * i], 2);
            values[i] = half_to_float(bits);
        }
    }
    return values;
}

// cuda::embedding of a row of `table` against the CPU's embedding_row.
void check_embedding_table(const HostMatrix& table) {
    const int rows = table.matrix.rows, cols = table.matrix.cols;
    cuda::PinnedBuffer staging(size_t(16) << 20, "staging");
    DeviceBuffer memory;
    const DeviceMatrix device_table = cuda::upload_matrix(table.matrix, memory, staging, "table");
    const int token = rows - 2 >= 0 ? rows - 2 : 0;
    const int step[2] = {token, 0};
    DeviceBuffer device_step = to_device(step, sizeof step);
    DeviceBuffer out = poisoned(cols);
    cuda::embedding(out.as<float>(), device_table, 1.0f, device_step.as<int>(), 0);
    std::vector<float> want(cols);
    cpu::embedding_row(want.data(), table.matrix, token);
    report(std::string("embedding ") + dtype_label(table.matrix.dtype) + " " +
               std::to_string(rows) + "x" + std::to_string(cols),
           to_host(out.as(), cols), want, 0.0);
}

void check_embedding() {
    for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
        const std::pair<int, int> shapes[] = {{5, 1}, {37, 45}, {512, 64}, {100, 4096}};
        for (auto [rows, cols] : shapes) check_embedding_table(random_matrix(rows, cols, dtype));
    }
    const std::pair<int, int> q8_shapes[] = {{5, 1}, {37, 45}, {512, 64}, {100, 4100}};
    for (auto [rows, cols] : q8_shapes)
        check_embedding_table(random_quantized_matrix(rows, cols, DType::Q8_0));
    const std::pair<int, int> q4_shapes[] = {{5, 32}, {37, 96}, {512, 64}, {100, 4128}};
    for (auto [rows, cols] : q4_shapes)
        check_embedding_table(random_quantized_matrix(rows, cols, DType::Q4_0));
}

// Every matvec kernel, fast and simple, against cpu::matvec: plain, with RMSNorm fused,
// with the residual added, with a bias (alone, after RMSNorm, before the residual), and
// SwiGLU. cpu::matvec runs at most at the AVX2 level, whose kernels read x in f32 as the
// GPU's do (the AVX-512 ones read it rounded to f16, a relative error near 2^-12).
void check_matvec() {
    const cpu::SimdLevel best = cpu::simd_level();
    cpu::set_simd_level(std::min(best, cpu::SimdLevel::Avx2));
    const std::pair<int, int> shapes[] = {{1, 1},      {7, 45},      {33, 172},  {64, 64},
                                          {129, 1000}, {1024, 4096}, {9, 14336}, {17, 8190}};
    cuda::prepare_matvec(cuda::matvec_shared_bytes(14336, DType::F32));
    cuda::PinnedBuffer staging(size_t(64) << 20, "staging");
    for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
        for (const auto& [shape_rows, cols] : shapes) {
            const int rows = shape_rows;  // a plain variable: the lambdas below capture it
            const HostMatrix w = random_matrix(rows, cols, dtype);
            const HostMatrix w3 = random_matrix(rows, cols, dtype);  // SwiGLU's second matrix
            DeviceBuffer memory, memory3;
            const DeviceMatrix device_w = cuda::upload_matrix(w.matrix, memory, staging, "w");
            const DeviceMatrix device_w3 = cuda::upload_matrix(w3.matrix, memory3, staging, "w3");
            const std::vector<float> x = random_floats(cols, 2.0f);
            std::vector<float> norm_weight = random_floats(cols, 0.1f);
            for (float& v : norm_weight) v += 1.0f;
            const float eps = 1e-5f;
            DeviceBuffer device_x = to_device(x), device_norm = to_device(norm_weight);
            const float* in = device_x.as<float>();
            const float* norm = device_norm.as<float>();
            const std::string shape = std::string(dtype_label(dtype)) + " " + std::to_string(rows) +
                                      "x" + std::to_string(cols);

            // What each variant must give, from the CPU kernels.
            std::vector<float> normed(cols), plain(rows), with_norm(rows), gated(rows), up(rows);
            cpu::matvec(plain.data(), x.data(), w.matrix);
            cpu::rmsnorm(normed.data(), x.data(), norm_weight.data(), cols, eps);
            cpu::matvec(with_norm.data(), normed.data(), w.matrix);
            cpu::matvec(gated.data(), normed.data(), w.matrix);
            cpu::matvec(up.data(), normed.data(), w3.matrix);
            std::vector<float> geglu = gated;
            cpu::swiglu(gated.data(), up.data(), rows);
            cpu::geglu(geglu.data(), up.data(), rows);
            const std::vector<float> residual = random_floats(rows);
            std::vector<float> with_residual = plain;
            for (int r = 0; r < rows; ++r) with_residual[r] += residual[r];
            // The bias is added to the product before the residual, as the CPU backend does.
            const std::vector<float> bias = random_floats(rows);
            DeviceBuffer device_bias_buffer = to_device(bias);
            const float* device_bias = device_bias_buffer.as<float>();
            std::vector<float> with_bias = plain, with_norm_bias = with_norm;
            std::vector<float> with_bias_residual = residual;
            for (int r = 0; r < rows; ++r) {
                with_bias[r] += bias[r];
                with_norm_bias[r] += bias[r];
                with_bias_residual[r] += plain[r] + bias[r];
            }

            // Runs launch(out) on an output that starts as `start` (NaN when empty).
            auto check = [&](const std::string& kernel, const std::vector<float>& want, auto launch,
                             const std::vector<float>& start = {}) {
                DeviceBuffer out = start.empty() ? poisoned(rows) : to_device(start);
                launch(out.as<float>());
                report(kernel + " " + shape, to_host(out.as(), rows), want, 1e-5);
            };
            check("matvec_thread_per_row", plain,
                  [&](float* out) { cuda::matvec_thread_per_row(out, device_w, in, 0); });
            // The fused steps, each alone and combined as the forward pass uses them, on both
            // kernels that fuse them (the fast matvec and the ladder's warp per row).
            struct Fusion {
                const char* suffix;
                const std::vector<float>& want;
                bool norm, bias, residual;
            };
            const Fusion fusions[] = {
                {"", plain, false, false, false},
                {"+rmsnorm", with_norm, true, false, false},
                {"+residual", with_residual, false, false, true},
                {"+bias", with_bias, false, true, false},
                {"+rmsnorm+bias", with_norm_bias, true, true, false},
                {"+bias+residual", with_bias_residual, false, true, true},
            };
            using Matvec = void (*)(float*, const DeviceMatrix&, const float*, const float*, float,
                                    const float*, bool, cudaStream_t);
            const std::pair<const char*, Matvec> matvecs[] = {
                {"matvec", cuda::matvec}, {"matvec_warp_per_row", cuda::matvec_warp_per_row}};
            for (const auto& kernel : matvecs) {
                const Matvec matvec = kernel.second;
                for (const Fusion& f : fusions)
                    check(
                        std::string(kernel.first) + f.suffix, f.want,
                        [&](float* out) {
                            matvec(out, device_w, in, f.norm ? norm : nullptr, f.norm ? eps : 0.0f,
                                   f.bias ? device_bias : nullptr, f.residual, 0);
                        },
                        f.residual ? residual : std::vector<float>{});
            }
            check("matvec_swiglu", gated, [&](float* out) {
                cuda::matvec_swiglu(out, device_w, device_w3, in, norm, eps, Activation::Silu, 0);
            });
            check("matvec_swiglu (GeGLU)", geglu, [&](float* out) {
                cuda::matvec_swiglu(out, device_w, device_w3, in, norm, eps, Activation::GeluTanh,
                                    0);
            });
            check("matvec_swiglu_warp_per_row", gated, [&](float* out) {
                cuda::matvec_swiglu_warp_per_row(out, device_w, device_w3, in, norm, eps, 0);
            });
        }
    }
    cpu::set_simd_level(best);
}

// What the CPU's Q8/Q4 matvec computes, values[rows] = W · x: x quantized by
// cpu::quantize_q8 (the int8 input of the CPU's integer dot products), the weights dequantized by
// cpu::embedding_row (the CPU's weight_at), the products summed in double, so that it does not
// depend on the CPU's SIMD level; and magnitudes[r] = Σ |w·x| over row r (report_scaled).
struct MatvecReference {
    std::vector<float> values, magnitudes;
};

MatvecReference quantized_matvec_reference(const Matrix& w, const std::vector<float>& x) {
    std::vector<double> input(w.cols);
    cpu::QuantizedVector quantized;
    cpu::quantize_q8(&quantized, x.data(), w.cols);
    for (int c = 0; c < w.cols; ++c)
        input[c] = double(quantized.values[c]) * quantized.scales[c / kQ8Group];
    std::vector<float> row(w.cols);
    MatvecReference out{std::vector<float>(w.rows), std::vector<float>(w.rows)};
    for (int r = 0; r < w.rows; ++r) {
        cpu::embedding_row(row.data(), w, r);
        double sum = 0, magnitude = 0;
        for (int c = 0; c < w.cols; ++c) {
            sum += double(row[c]) * input[c];
            magnitude += std::fabs(double(row[c]) * input[c]);
        }
        out.values[r] = float(sum);
        out.magnitudes[r] = float(magnitude);
    }
    return out;
}

// The Q8/Q4 matvec variants: int8 products launched as matvec chooses (QuantizedLaunch{})
// or with a given number of rows per warp, a block per row set or one wave of blocks.
struct QuantizedVariant {
    cuda::QuantizedLaunch launch;
    std::string label() const {
        if (launch.rows_per_warp == 0) return "int8";
        return "int8, " + std::to_string(launch.rows_per_warp) + " rows/warp" +
               (launch.grid == cuda::QuantizedGrid::kOneWave ? ", one wave" : "");
    }
};
constexpr cuda::QuantizedGrid kBlockPerSet = cuda::QuantizedGrid::kBlockPerSet;
constexpr cuda::QuantizedGrid kOneWave = cuda::QuantizedGrid::kOneWave;
constexpr QuantizedVariant kQuantizedVariants[] = {
    {{}}, {{1, kBlockPerSet}}, {{2, kBlockPerSet}}, {{1, kOneWave}}, {{2, kOneWave}}};

void quantized_matvec(const QuantizedVariant& variant, float* out, const DeviceMatrix& w,
                      const float* in, const float* norm_weight, float eps, const float* bias,
                      bool accumulate, cudaStream_t stream) {
    if (variant.launch.rows_per_warp == 0)
        cuda::matvec(out, w, in, norm_weight, eps, bias, accumulate, stream);
    else
        cuda::matvec_quantized_launch(variant.launch, out, w, in, norm_weight, eps, bias,
                                      accumulate, stream);
}

void quantized_matvec_swiglu(const QuantizedVariant& variant, float* out, const DeviceMatrix& w1,
                             const DeviceMatrix& w3, const float* in, const float* norm_weight,
                             float eps, cudaStream_t stream) {
    if (variant.launch.rows_per_warp == 0)
        cuda::matvec_swiglu(out, w1, w3, in, norm_weight, eps, Activation::Silu, stream);
    else
        cuda::matvec_swiglu_quantized_launch(variant.launch, out, w1, w3, in, norm_weight, eps,
                                             Activation::Silu, stream);
}

// The Q8 and Q4 matvecs (int8 products, in each launch shape) against the CPU's arithmetic:
// plain, with RMSNorm fused, with the residual added, with a bias (after RMSNorm, before the
// residual), and SwiGLU. Columns off every multiple of 32 * 8 (and, for Q8, off 32: a
// shorter last group), rows off the 16 rows of a block; 14336 columns (more than 48 KiB of
// shared memory) where the GPU allows it. Short rows also come 20000 at a time: more row
// sets than a wave of blocks, so that a one-wave block takes several.
void check_quantized_matvec() {
    const std::vector<int> row_counts = {1, 37, 300}, short_row_counts = {1, 37, 300, 20000};
    constexpr int kShortRow = 256;
    const std::vector<int> q8_cols = {45, 96, 160, 172, 4128, 14336};
    const std::vector<int> q4_cols = {32, 96, 160, 4128, 14336};
    cuda::prepare_matvec(
        std::min(cuda::matvec_shared_bytes(14336, DType::Q8_0), shared_memory_limit));
    cuda::PinnedBuffer staging(size_t(64) << 20, "staging");
    for (DType dtype : {DType::Q8_0, DType::Q4_0}) {
        for (int cols : dtype == DType::Q8_0 ? q8_cols : q4_cols) {
            if (!matvec_fits(cols, dtype)) {
                std::printf(
                    "SKIP %s matvecs over %d columns: more shared memory than the GPU has\n",
                    dtype_label(dtype), cols);
                continue;
            }
            for (int rows : cols <= kShortRow ? short_row_counts : row_counts) {
                const HostMatrix w = random_quantized_matrix(rows, cols, dtype);
                const HostMatrix w3 = random_quantized_matrix(rows, cols, dtype);
                DeviceBuffer memory, memory3;
                const DeviceMatrix device_w = cuda::upload_matrix(w.matrix, memory, staging, "w");
                const DeviceMatrix device_w3 =
                    cuda::upload_matrix(w3.matrix, memory3, staging, "w3");
                const std::vector<float> x = random_floats(cols, 2.0f);
                std::vector<float> norm_weight = random_floats(cols, 0.1f);
                for (float& v : norm_weight) v += 1.0f;
                const float eps = 1e-5f;
                std::vector<float> normed(cols);
                cpu::rmsnorm(normed.data(), x.data(), norm_weight.data(), cols, eps);
                DeviceBuffer device_x = to_device(x), device_norm = to_device(norm_weight);
                const float* in = device_x.as<float>();
                const float* norm = device_norm.as<float>();
                const std::vector<float> residual = random_floats(rows), bias = random_floats(rows);
                DeviceBuffer device_bias_buffer = to_device(bias);
                const float* device_bias = device_bias_buffer.as<float>();
                const std::string shape = std::string(dtype_label(dtype)) + " " +
                                          std::to_string(rows) + "x" + std::to_string(cols);

                for (const QuantizedVariant& variant : kQuantizedVariants) {
                    const MatvecReference plain = quantized_matvec_reference(w.matrix, x);
                    const MatvecReference with_norm = quantized_matvec_reference(w.matrix, normed);
                    const MatvecReference up = quantized_matvec_reference(w3.matrix, normed);
                    std::vector<float> gated = with_norm.values;
                    cpu::swiglu(gated.data(), up.values.data(), rows);
                    // The bias is added to the product before the residual (as in
                    // check_matvec). The scales of the errors: Σ |w·x| plus the size of what
                    // is added; for SwiGLU, |up|·Σ|w1·x| + |gate|·Σ|w3·x| (|silu'| <= 1.1,
                    // |silu(g)| <= |g|).
                    std::vector<float> with_residual = plain.values,
                                       with_norm_bias = with_norm.values,
                                       with_bias_residual = residual;
                    std::vector<float> residual_scale(rows), norm_bias_scale(rows),
                        bias_residual_scale(rows), gated_scale(rows);
                    for (int r = 0; r < rows; ++r) {
                        with_residual[r] += residual[r];
                        with_norm_bias[r] += bias[r];
                        with_bias_residual[r] += plain.values[r] + bias[r];
                        residual_scale[r] = plain.magnitudes[r] + std::fabs(residual[r]);
                        norm_bias_scale[r] = with_norm.magnitudes[r] + std::fabs(bias[r]);
                        bias_residual_scale[r] = residual_scale[r] + std::fabs(bias[r]);
                        gated_scale[r] = 1.1f * std::fabs(up.values[r]) * with_norm.magnitudes[r] +
                                         std::fabs(with_norm.values[r]) * up.magnitudes[r];
                    }

                    // The int8 input of a normed row may differ from the CPU's where the
                    // GPU's norm differs in the last bit and moves a rounding of x / scale.
                    const double normed_tolerance = 1e-4;
                    // cuda::matvec and cuda::matvec_swiglu, for this variant.
                    const auto matvec = [&](float* out, const DeviceMatrix& m, const float* input,
                                            const float* weights, float epsilon,
                                            const float* row_bias, bool accumulate,
                                            cudaStream_t stream) {
                        quantized_matvec(variant, out, m, input, weights, epsilon, row_bias,
                                         accumulate, stream);
                    };
                    const auto matvec_swiglu = [&](float* out, const DeviceMatrix& m1,
                                                   const DeviceMatrix& m3, const float* input,
                                                   const float* weights, float epsilon,
                                                   cudaStream_t stream) {
                        quantized_matvec_swiglu(variant, out, m1, m3, input, weights, epsilon,
                                                stream);
                    };
                    const std::string suffix = " (" + variant.label() + ") ";
                    auto check = [&](const std::string& kernel, const std::vector<float>& want,
                                     const std::vector<float>& scale, double tolerance, auto launch,
                                     const std::vector<float>& start = {}) {
                        DeviceBuffer out = start.empty() ? poisoned(rows) : to_device(start);
                        launch(out.as<float>());
                        report_scaled(kernel + suffix + shape, to_host(out.as(), rows), want, scale,
                                      tolerance);
                    };
                    check("matvec", plain.values, plain.magnitudes, 1e-5, [&](float* out) {
                        matvec(out, device_w, in, nullptr, 0.0f, nullptr, false, 0);
                    });
                    check("matvec+rmsnorm", with_norm.values, with_norm.magnitudes,
                          normed_tolerance, [&](float* out) {
                              matvec(out, device_w, in, norm, eps, nullptr, false, 0);
                          });
                    check(
                        "matvec+residual", with_residual, residual_scale, 1e-5,
                        [&](float* out) {
                            matvec(out, device_w, in, nullptr, 0.0f, nullptr, true, 0);
                        },
                        residual);
                    check("matvec+rmsnorm+bias", with_norm_bias, norm_bias_scale, normed_tolerance,
                          [&](float* out) {
                              matvec(out, device_w, in, norm, eps, device_bias, false, 0);
                          });
                    check(
                        "matvec+bias+residual", with_bias_residual, bias_residual_scale, 1e-5,
                        [&](float* out) {
                            matvec(out, device_w, in, nullptr, 0.0f, device_bias, true, 0);
                        },
                        residual);
                    check("matvec_swiglu", gated, gated_scale, normed_tolerance, [&](float* out) {
                        matvec_swiglu(out, device_w, device_w3, in, norm, eps, 0);
                    });
                }
            }
        }
    }
}

// x as the block-type matvecs multiply it: quantized to int8 as the CPU's matvecs of `dtype`
// quantize it (cpu::quantize_q8 per 32 columns for the small blocks, cpu::quantize_q8_k per
// 256 for the others), each value times its scale.
std::vector<double> block_matvec_input(DType dtype, const std::vector<float>& x) {
    const int n = int(x.size());
    std::vector<double> out(n);
    if (block_weights(dtype) == kSmallBlock) {
        cpu::QuantizedVector q;
        cpu::quantize_q8(&q, x.data(), n);
        for (int c = 0; c < n; ++c) out[c] = double(q.values[c]) * q.scales[c / kQ8Group];
    } else {
        cpu::Q8KVector q;
        cpu::quantize_q8_k(&q, x.data(), n);
        for (int c = 0; c < n; ++c) out[c] = double(q.values[c]) * q.d[c / kSuperBlock];
    }
    return out;
}

// The block types' kernels against dequantize_row: the embedding (exact), the f16 copy the
// prefill multiplies (exact: each weight rounded once), and matvec and matvec_swiglu (plain,
// RMSNorm with a bias, the residual added) against products in double with the input as
// the CPU quantizes it (block_matvec_input), their errors measured against Σ |w·x| as
// check_matvec's. Rows not a multiple of a block's warps, rows of fewer units than a warp's
// lanes and of many rounds (one block's columns also 20000 rows at a time: more row sets
// than a wave of blocks, so that a one-wave block takes several); each matvec on both
// grids.
void check_block_types() {
    const std::vector<int> row_counts = {1, 37, 300}, short_row_counts = {1, 37, 300, 20000};
    cuda::prepare_matvec(
        std::min(cuda::matvec_shared_bytes(14336, DType::Q4_K), shared_memory_limit));
    cuda::PinnedBuffer staging(size_t(64) << 20, "staging");
    constexpr double kTolerance = 1e-5;
    // The int8 input of a normed row may differ from the CPU's where the GPU's norm differs
    // in the last bit and moves a rounding of x / scale (as check_quantized_matvec's).
    constexpr double kNormedTolerance = 1e-4;
    for (const DType dtype : kBlockTypes) {
        const bool super = block_weights(dtype) == kSuperBlock;
        const std::vector<int> columns =
            super ? std::vector<int>{256, 4096, 14336} : std::vector<int>{32, 4128, 14336};
        for (const int cols : columns) {
            if (!matvec_fits(cols, dtype)) {
                std::printf(
                    "SKIP %s matvecs over %d columns: more shared memory than the GPU has\n",
                    dtype_label(dtype), cols);
                continue;
            }
            for (const int rows : cols == block_weights(dtype) ? short_row_counts : row_counts) {
                const std::string shape = std::string(dtype_label(dtype)) + " " +
                                          std::to_string(rows) + "x" + std::to_string(cols);
                const HostMatrix w = random_block_matrix(rows, cols, dtype);
                const HostMatrix w3 = random_block_matrix(rows, cols, dtype);
                DeviceBuffer memory, memory3;
                const DeviceMatrix device_w = cuda::upload_matrix(w.matrix, memory, staging, "w");
                const DeviceMatrix device_w3 =
                    cuda::upload_matrix(w3.matrix, memory3, staging, "w3");
                std::vector<float> weights(size_t(rows) * cols), weights3(weights.size());
                for (int r = 0; r < rows; ++r) {
                    dequantize_row(dtype, w.matrix.row_data(r), &weights[size_t(r) * cols], cols);
                    dequantize_row(dtype, w3.matrix.row_data(r), &weights3[size_t(r) * cols], cols);
                }

                // The embedding of the last row.
                const int step[2] = {rows - 1, 0};
                DeviceBuffer device_step = to_device(step, sizeof step);
                DeviceBuffer embedded = poisoned(cols);
                cuda::embedding(embedded.as<float>(), device_w, 1.0f, device_step.as<int>(), 0);
                report("embedding " + shape, to_host(embedded.as(), cols),
                       std::vector<float>(weights.end() - cols, weights.end()), 0.0);

                // The f16 copy.
                DeviceBuffer scratch_memory;
                const cuda::DequantizeScratch scratch =
                    dequantize_scratch(device_w, 1, scratch_memory);
                const DeviceMatrix f16 = cuda::dequantize_to_f16(device_w, scratch.data, 0);
                CUDA_CHECK(cudaDeviceSynchronize());
                std::vector<uint16_t> halves(size_t(rows) * f16.pitch);
                CUDA_CHECK(cudaMemcpy(halves.data(), f16.data, halves.size() * sizeof(uint16_t),
                                      cudaMemcpyDeviceToHost));
                int wrong = 0;
                for (int r = 0; r < rows; ++r)
                    for (int c = 0; c < cols; ++c)
                        wrong += halves[size_t(r) * f16.pitch + c] !=
                                 float_to_half(weights[size_t(r) * cols + c]);
                report_error("dequantize_to_f16 " + shape + " (values wrong)", wrong, 0);

                // The matvecs.
                const std::vector<float> x = random_floats(cols, 2.0f);
                std::vector<float> norm_weight = random_floats(cols, 0.1f);
                for (float& v : norm_weight) v += 1.0f;
                const float eps = 1e-5f;
                std::vector<float> normed(cols);
                cpu::rmsnorm(normed.data(), x.data(), norm_weight.data(), cols, eps);
                const std::vector<float> residual = random_floats(rows), bias = random_floats(rows);
                DeviceBuffer device_x = to_device(x), device_norm = to_device(norm_weight);
                DeviceBuffer device_bias = to_device(bias);
                // Σ w·x and Σ |w·x| of each row of `m` with `v`.
                auto product = [&](const std::vector<float>& m, const std::vector<double>& v,
                                   std::vector<float>* sums, std::vector<float>* sizes) {
                    sums->assign(rows, 0.0f);
                    sizes->assign(rows, 0.0f);
                    for (int r = 0; r < rows; ++r) {
                        double sum = 0, size = 0;
                        for (int c = 0; c < cols; ++c) {
                            const double term = double(m[size_t(r) * cols + c]) * v[c];
                            sum += term;
                            size += std::fabs(term);
                        }
                        (*sums)[r] = float(sum);
                        (*sizes)[r] = float(size);
                    }
                };
                std::vector<float> plain, plain_size, with_norm, with_norm_size, up, up_size;
                const std::vector<double> quantized_x = block_matvec_input(dtype, x);
                const std::vector<double> quantized_normed = block_matvec_input(dtype, normed);
                product(weights, quantized_x, &plain, &plain_size);
                product(weights, quantized_normed, &with_norm, &with_norm_size);
                product(weights3, quantized_normed, &up, &up_size);

                // Each grid the matvecs may take: a block per row set, and one wave of
                // blocks, each taking several sets where there are more than a wave.
                for (const cuda::QuantizedGrid grid : {kBlockPerSet, kOneWave}) {
                    const cuda::QuantizedLaunch launch{1, grid};
                    const std::string suffix =
                        std::string(grid == kOneWave ? " (one wave) " : " (block per set) ") +
                        shape;
                    DeviceBuffer out = poisoned(rows);
                    cuda::matvec_quantized_launch(launch, out.as<float>(), device_w,
                                                  device_x.as<float>(), nullptr, eps, nullptr,
                                                  false, 0);
                    report_scaled("matvec" + suffix, to_host(out.as(), rows), plain, plain_size,
                                  kTolerance);

                    out = poisoned(rows);
                    cuda::matvec_quantized_launch(launch, out.as<float>(), device_w,
                                                  device_x.as<float>(), device_norm.as<float>(),
                                                  eps, device_bias.as<float>(), false, 0);
                    std::vector<float> want = with_norm, scale = with_norm_size;
                    for (int r = 0; r < rows; ++r)
                        want[r] += bias[r], scale[r] += std::fabs(bias[r]);
                    report_scaled("matvec rmsnorm +bias" + suffix, to_host(out.as(), rows), want,
                                  scale, kNormedTolerance);

                    out = to_device(residual);
                    cuda::matvec_quantized_launch(launch, out.as<float>(), device_w,
                                                  device_x.as<float>(), nullptr, eps, nullptr, true,
                                                  0);
                    want = plain, scale = plain_size;
                    for (int r = 0; r < rows; ++r)
                        want[r] += residual[r], scale[r] += std::fabs(residual[r]);
                    report_scaled("matvec +=" + suffix, to_host(out.as(), rows), want, scale,
                                  kTolerance);

                    out = poisoned(rows);
                    cuda::matvec_swiglu_quantized_launch(
                        launch, out.as<float>(), device_w, device_w3, device_x.as<float>(),
                        device_norm.as<float>(), eps, Activation::Silu, 0);
                    want = with_norm;
                    cpu::swiglu(want.data(), up.data(), rows);
                    for (int r = 0; r < rows; ++r)
                        scale[r] = 1.1f * std::fabs(up[r]) * with_norm_size[r] +
                                   std::fabs(with_norm[r]) * up_size[r];
                    report_scaled("matvec_swiglu" + suffix, to_host(out.as(), rows), want, scale,
                                  kNormedTolerance);
                }
            }
        }
    }
}

// The GPU ladder's separate RMSNorm, residual add and SwiGLU kernels against the CPU's.
void check_elementwise() {
    for (int n : {1, 45, 172, 4097, 14339}) {
        const std::vector<float> x = random_floats(n, 2.0f), y = random_floats(n);
        std::vector<float> weight = random_floats(n, 0.1f);
        for (float& v : weight) v += 1.0f;
        DeviceBuffer device_x = to_device(x), device_y = to_device(y);
        DeviceBuffer device_weight = to_device(weight);
        const std::string size = " n " + std::to_string(n);

        DeviceBuffer out = poisoned(n);
        cuda::rmsnorm(out.as<float>(), device_x.as<float>(), device_weight.as<float>(), n, 1e-5f,
                      0);
        std::vector<float> want(n);
        cpu::rmsnorm(want.data(), x.data(), weight.data(), n, 1e-5f);
        report("rmsnorm" + size, to_host(out.as(), n), want, 1e-6);

        DeviceBuffer sum = to_device(x);
        cuda::residual_add(sum.as<float>(), device_y.as<float>(), n, 0);
        for (int i = 0; i < n; ++i) want[i] = x[i] + y[i];
        report("residual_add" + size, to_host(sum.as(), n), want, 0.0);

        DeviceBuffer gate = to_device(x);
        cuda::swiglu(gate.as<float>(), device_y.as<float>(), n, Activation::Silu, /*limit=*/0.0f,
                     0);
        want = x;
        cpu::swiglu(want.data(), y.data(), n);
        report("swiglu" + size, to_host(gate.as(), n), want, 1e-6);

        gate = to_device(x);
        cuda::swiglu(gate.as<float>(), device_y.as<float>(), n, Activation::GeluTanh,
                     /*limit=*/0.0f, 0);
        want = x;
        cpu::geglu(want.data(), y.data(), n);
        report("swiglu (GeGLU)" + size, to_host(gate.as(), n), want, 1e-6);

        // Gemma's post norm: x += rmsnorm(y) * weight, as the CPU's rmsnorm then the add.
        sum = to_device(x);
        cuda::add_rmsnorm_rows(sum.as<float>(), device_y.as<float>(), device_weight.as<float>(), n,
                               1, 1e-5f, 0);
        cpu::rmsnorm(want.data(), y.data(), weight.data(), n, 1e-5f);
        for (int i = 0; i < n; ++i) want[i] += x[i];
        report("add_rmsnorm_rows" + size, to_host(sum.as(), n), want, 1e-6);
    }
}

struct HeadShape {
    int heads, kv_heads, head_dim;
};

// RoPE's table for head_dim, theta 10000, every element rotated.
std::vector<float> test_rope_table(int head_dim) {
    Config config;
    config.head_dim = head_dim;
    config.rope_theta = 10000.0f;
    return rope_table(config, 1);
}

// Qwen3's per-head q/k RMSNorm weights ([head_dim] each; both empty: no norm) on the host
// and on the device.
struct HeadNorms {
    std::vector<float> q, k;
    DeviceBuffer device_q, device_k;
    static constexpr float kEps = 1e-6f;

    bool given() const { return !q.empty(); }
    const float* q_device() const { return given() ? device_q.as<float>() : nullptr; }
    const float* k_device() const { return given() ? device_k.as<float>() : nullptr; }
};

// Random weights around 1.5 (far from 1, so that a skipped norm shows) when `given`.
HeadNorms head_norms(int head_dim, bool given) {
    HeadNorms norms;
    if (!given) return norms;
    norms.q = random_floats(head_dim, 0.4f);
    norms.k = random_floats(head_dim, 0.4f);
    for (float& v : norms.q) v += 1.5f;
    for (float& v : norms.k) v += 1.5f;
    norms.device_q = to_device(norms.q);
    norms.device_k = to_device(norms.k);
    return norms;
}

// What RoPE and the cache write must give for the token's qkv [q_dim + 2 * kv_dim] at pos:
// q and k per-head RMSNormed by cpu::rmsnorm when norms are given, rotated by cpu::rope, and
// row pos of the key and value caches as the CPU stores them (rotated k, v).
struct RopeReference {
    std::vector<float> q, k;
    std::vector<uint8_t> key_row, value_row;
};

RopeReference rope_reference(const std::vector<float>& qkv, const HeadShape& s, int pos,
                             const std::vector<float>& frequencies, const HeadNorms& norms,
                             KvType type) {
    const int q_dim = s.heads * s.head_dim, kv_dim = s.kv_heads * s.head_dim;
    const size_t element = kv_element_bytes(type);
    RopeReference r;
    r.q.assign(qkv.begin(), qkv.begin() + q_dim);
    r.k.assign(qkv.begin() + q_dim, qkv.begin() + q_dim + kv_dim);
    const std::vector<float> v(qkv.begin() + q_dim + kv_dim, qkv.end());
    if (norms.given()) {
        for (int h = 0; h < s.heads; ++h) {
            float* head = r.q.data() + size_t(h) * s.head_dim;
            cpu::rmsnorm(head, head, norms.q.data(), s.head_dim, HeadNorms::kEps);
        }
        for (int h = 0; h < s.kv_heads; ++h) {
            float* head = r.k.data() + size_t(h) * s.head_dim;
            cpu::rmsnorm(head, head, norms.k.data(), s.head_dim, HeadNorms::kEps);
        }
    }
    cpu::rope(r.q.data(), s.heads, s.head_dim, pos, frequencies.data());
    cpu::rope(r.k.data(), s.kv_heads, s.head_dim, pos, frequencies.data());
    r.key_row.resize(kv_dim * element);
    r.value_row.resize(kv_dim * element);
    cpu::kv_store(r.key_row.data(), r.k.data(), kv_dim, type);
    cpu::kv_store(r.value_row.data(), v.data(), kv_dim, type);
    return r;
}

// Row `row` of a device cache [rows, kv_dim] as floats.
std::vector<float> device_cache_row(const DeviceBuffer& cache, int row, int kv_dim, KvType type) {
    const size_t element = kv_element_bytes(type);
    std::vector<uint8_t> bytes(kv_dim * element);
    CUDA_CHECK(cudaMemcpy(bytes.data(), cache.as<uint8_t>() + size_t(row) * kv_dim * element,
                          bytes.size(), cudaMemcpyDeviceToHost));
    return kv_values_as_float(bytes, type);
}

// Row pos of both device caches against the reference rows (f32 keys within f32_tolerance;
// f16: a rounding tie may fall differently when the f32 values differ by an ulp); returns
// the rows read, key then value.
std::pair<std::vector<float>, std::vector<float>> check_cache_rows(
    const std::string& label, const DeviceBuffer& keys, const DeviceBuffer& values, int pos,
    int kv_dim, KvType type, const RopeReference& want, double f32_tolerance) {
    std::vector<float> key = device_cache_row(keys, pos, kv_dim, type);
    std::vector<float> value = device_cache_row(values, pos, kv_dim, type);
    report(label + " k", key, kv_values_as_float(want.key_row, type),
           type == KvType::F32 ? f32_tolerance : 1e-3);
    report(label + " v", value, kv_values_as_float(want.value_row, type), 0.0);
    return {key, value};
}

// Relative tolerance of f32 q and k after RoPE: the angle is computed in double on both
// sides; the per-head norm's sum of squares is a float tree sum on the GPU, a double one on
// the CPU, hence the looser figure with it.
constexpr double kRopeTolerance = 1e-6;
constexpr double kNormedRopeTolerance = 2e-6;

void check_rope() {
    const HeadShape shapes[] = {{8, 4, 8}, {6, 2, 34}, {5, 5, 18}, {32, 8, 128}, {4, 1, 256}};
    for (const HeadShape& s : shapes) {
        const std::vector<float> frequencies = test_rope_table(s.head_dim);
        DeviceBuffer device_frequencies = to_device(frequencies);
        const int q_dim = s.heads * s.head_dim, kv_dim = s.kv_heads * s.head_dim;
        for (bool qk_norm : {false, true}) {
            const HeadNorms norms = head_norms(s.head_dim, qk_norm);
            const double tolerance = qk_norm ? kNormedRopeTolerance : kRopeTolerance;
            for (int pos : {0, 7, 4095, 100000}) {
                for (KvType type : {KvType::F32, KvType::F16}) {
                    const size_t element = kv_element_bytes(type);
                    const std::vector<float> qkv = random_floats(q_dim + 2 * size_t(kv_dim));
                    DeviceBuffer device_qkv = to_device(qkv);
                    const size_t cache_bytes = (size_t(pos) + 1) * kv_dim * element;
                    DeviceBuffer keys(cache_bytes, "keys"), values(cache_bytes, "values");
                    CUDA_CHECK(cudaMemset(keys.as(), 0xff, cache_bytes));
                    CUDA_CHECK(cudaMemset(values.as(), 0xff, cache_bytes));
                    const int step[2] = {0, pos};
                    DeviceBuffer device_step = to_device(step, sizeof step);
                    cuda::rope_kv_store(device_qkv.as<float>(), device_frequencies.as<float>(),
                                        keys.as(), values.as(), device_step.as<int>(), s.heads,
                                        s.kv_heads, s.head_dim, norms.q_device(), norms.k_device(),
                                        HeadNorms::kEps, type, 0);

                    const RopeReference want =
                        rope_reference(qkv, s, pos, frequencies, norms, type);

                    const std::string what =
                        std::to_string(s.heads) + "/" + std::to_string(s.kv_heads) + "x" +
                        std::to_string(s.head_dim) + (qk_norm ? " qk_norm" : "") + " pos " +
                        std::to_string(pos) + " kv " + kv_label(type);
                    std::vector<float> got_qkv = to_host(device_qkv.as(), qkv.size());
                    report("rope_kv " + what + " q",
                           std::vector<float>(got_qkv.begin(), got_qkv.begin() + q_dim), want.q,
                           tolerance);
                    check_cache_rows("rope_kv " + what, keys, values, pos, kv_dim, type, want,
                                     tolerance);

                    // The GPU ladder's unfused steps: the q/k norm and RoPE in place on q and
                    // k, then the KV write.
                    DeviceBuffer simple_qkv = to_device(qkv);
                    CUDA_CHECK(cudaMemset(keys.as(), 0xff, cache_bytes));
                    CUDA_CHECK(cudaMemset(values.as(), 0xff, cache_bytes));
                    if (qk_norm)
                        cuda::rmsnorm_heads(simple_qkv.as<float>(), norms.q_device(),
                                            norms.k_device(), s.heads, s.kv_heads, s.head_dim,
                                            HeadNorms::kEps, 0);
                    cuda::rope(simple_qkv.as<float>(), device_frequencies.as<float>(),
                               device_step.as<int>(), s.heads, s.kv_heads, s.head_dim, 0);
                    const float* k_device = simple_qkv.as<float>() + q_dim;
                    cuda::store_kv_row(k_device, k_device + kv_dim, keys.as(), values.as(),
                                       device_step.as<int>(), kv_dim, type, 0);
                    got_qkv = to_host(simple_qkv.as(), qkv.size());
                    report("rope " + what + " q",
                           std::vector<float>(got_qkv.begin(), got_qkv.begin() + q_dim), want.q,
                           tolerance);
                    report("rope " + what + " k",
                           std::vector<float>(got_qkv.begin() + q_dim,
                                              got_qkv.begin() + q_dim + kv_dim),
                           want.k, tolerance);
                    check_cache_rows("store_kv_row " + what, keys, values, pos, kv_dim, type, want,
                                     tolerance);
                }
            }
        }
    }
}

// cpu::attention of q [heads * head_dim] at `pos` over caches of the KV type's bytes.
std::vector<float> cpu_attention(const std::vector<float>& q, int pos,
                                 const std::vector<uint8_t>& keys,
                                 const std::vector<uint8_t>& values, const AttentionShape& shape,
                                 KvType type) {
    std::vector<float> out(q.size()), scores(size_t(shape.heads) * (pos + 1));
    cpu::attention(out.data(), q.data(), pos, keys.data(), values.data(), scores.data(), shape,
                   type);
    return out;
}

// A device array of `count` zeros: attention's arrival counters.
DeviceBuffer zeroed_counters(size_t count) {
    DeviceBuffer buffer(count * sizeof(unsigned), "arrival counters");
    CUDA_CHECK(cudaMemset(buffer.as(), 0, count * sizeof(unsigned)));
    return buffer;
}

// The fused attention (the q/k norm where a case has one, RoPE of q and k, the cache write of
// row pos, flash-decoding with the merge in the last block) and the ladder's naive attention
// against the CPU: cpu::rmsnorm per head, cpu::rope, the row pos the CPU stores,
// cpu::attention. The naive kernel gets q normed and rotated by the CPU.
void check_attention(int multiprocessors) {
    struct Case {
        HeadShape shape;
        int window;
        bool qk_norm;  // Qwen3's per-head q/k RMSNorm
    };
    const Case cases[] = {
        {{8, 4, 8}, 0, false},    {{6, 2, 34}, 0, false},     {{5, 1, 8}, 6, false},
        {{32, 8, 128}, 0, false}, {{32, 8, 128}, 100, false}, {{8, 1, 64}, 0, false},
        {{12, 2, 256}, 0, false}, {{4, 4, 18}, 0, false},     {{16, 2, 80}, 33, false},
        {{6, 2, 34}, 0, true},    {{16, 8, 128}, 0, true},    {{5, 1, 18}, 6, true},
        {{12, 2, 256}, 40, true}};
    for (const Case& test : cases) {
        const HeadShape& s = test.shape;
        // A scale other than 1/√head_dim: both sides must take the shape's.
        const AttentionShape shape{s.heads, s.kv_heads, s.head_dim, test.window,
                                   1.25f / std::sqrt(float(s.head_dim))};
        const int q_dim = s.heads * s.head_dim, kv_dim = s.kv_heads * s.head_dim;
        const std::vector<float> frequencies = test_rope_table(s.head_dim);
        DeviceBuffer device_frequencies = to_device(frequencies);
        const HeadNorms norms = head_norms(s.head_dim, test.qk_norm);
        const size_t counters = cuda::attention_arrival_counters(shape);
        for (int context : {1, 7, 100, 4096}) {
            for (KvType type : {KvType::F32, KvType::F16}) {
                const size_t element = kv_element_bytes(type);
                // Random caches of the element type (the same bits on both sides).
                std::vector<uint8_t> keys(size_t(context) * kv_dim * element);
                std::vector<uint8_t> values(keys.size());
                const std::vector<float> key_values = random_floats(size_t(context) * kv_dim);
                const std::vector<float> value_values = random_floats(size_t(context) * kv_dim);
                cpu::kv_store(keys.data(), key_values.data(), context * kv_dim, type);
                cpu::kv_store(values.data(), value_values.data(), context * kv_dim, type);
                DeviceBuffer device_keys = to_device(keys.data(), keys.size());
                DeviceBuffer device_values = to_device(values.data(), values.size());

                const std::string name =
                    std::to_string(s.heads) + "/" + std::to_string(s.kv_heads) + "x" +
                    std::to_string(s.head_dim) + (test.qk_norm ? " qk_norm" : "") + " window " +
                    std::to_string(test.window) + " ctx " + std::to_string(context) + " kv " +
                    kv_label(type);
                DeviceBuffer scores = poisoned(size_t(s.heads) * context);
                const int natural = cuda::attention_splits(shape, context, multiprocessors);
                for (int pos : {0, context / 2, context - 1}) {
                    const std::vector<float> qkv = random_floats(q_dim + 2 * size_t(kv_dim));
                    DeviceBuffer device_qkv = to_device(qkv);
                    const RopeReference rotated =
                        rope_reference(qkv, s, pos, frequencies, norms, type);
                    const int step[2] = {0, pos};
                    DeviceBuffer device_step = to_device(step, sizeof step);
                    const std::string at = name + " pos " + std::to_string(pos);

                    // launch(out, arrivals) against `want`, out poisoned first; the arrival
                    // counters must be back at zero afterwards.
                    auto check = [&](const std::string& label, const std::vector<float>& want,
                                     auto launch, bool counts_arrivals) {
                        DeviceBuffer out = poisoned(q_dim), arrivals = zeroed_counters(counters);
                        launch(out.as<float>(), arrivals.as<unsigned>());
                        report(label, to_host(out.as(), q_dim), want, 1e-5);
                        if (!counts_arrivals) return;
                        std::vector<unsigned> left(counters);
                        CUDA_CHECK(cudaMemcpy(left.data(), arrivals.as(),
                                              counters * sizeof(unsigned), cudaMemcpyDeviceToHost));
                        const bool reset = std::all_of(left.begin(), left.end(),
                                                       [](unsigned n) { return n == 0; });
                        (reset ? passed : failed)++;
                        if (!reset)
                            std::printf("FAIL %s: arrival counters not reset\n", label.c_str());
                    };
                    auto fused = [&](int splits) {
                        return [&, splits](float* out, unsigned* arrivals) {
                            DeviceBuffer partial_out =
                                poisoned(size_t(s.heads) * splits * s.head_dim);
                            DeviceBuffer partial_stats = poisoned(size_t(s.heads) * splits * 2);
                            cuda::attention(out, device_qkv.as<float>(),
                                            device_frequencies.as<float>(), norms.q_device(),
                                            norms.k_device(), HeadNorms::kEps, device_keys.as(),
                                            device_values.as(), device_step.as<int>(),
                                            partial_out.as<float>(), partial_stats.as<float>(),
                                            arrivals, shape, splits, type, 0);
                            CUDA_CHECK(cudaDeviceSynchronize());  // before the partials go
                        };
                    };

                    // The first run writes row pos of the caches, checked against the CPU's
                    // rows; the CPU reference then attends to the rows the GPU wrote, so that
                    // an f16 rounding tie cannot move the outputs.
                    CUDA_CHECK(
                        cudaMemset(device_keys.as<uint8_t>() + size_t(pos) * kv_dim * element, 0xff,
                                   kv_dim * element));
                    CUDA_CHECK(
                        cudaMemset(device_values.as<uint8_t>() + size_t(pos) * kv_dim * element,
                                   0xff, kv_dim * element));
                    DeviceBuffer first_out = poisoned(q_dim), arrivals = zeroed_counters(counters);
                    fused(natural)(first_out.as<float>(), arrivals.as<unsigned>());
                    const auto [got_key, got_value] = check_cache_rows(
                        "attention " + at, device_keys, device_values, pos, kv_dim, type, rotated,
                        test.qk_norm ? kNormedRopeTolerance : kRopeTolerance);
                    cpu::kv_store(keys.data() + size_t(pos) * kv_dim * element, got_key.data(),
                                  kv_dim, type);
                    cpu::kv_store(values.data() + size_t(pos) * kv_dim * element, got_value.data(),
                                  kv_dim, type);
                    const std::vector<float> want =
                        cpu_attention(rotated.q, pos, keys, values, shape, type);

                    for (int splits : {natural, 1, 3, 256})
                        check("attention " + at + " splits " + std::to_string(splits), want,
                              fused(splits), true);
                    DeviceBuffer device_q = to_device(rotated.q);
                    check(
                        "attention_naive " + at, want,
                        [&](float* out, unsigned*) {
                            cuda::attention_naive(out, device_q.as<float>(), device_keys.as(),
                                                  device_values.as(), device_step.as<int>(),
                                                  scores.as<float>(), context, shape, type, 0);
                        },
                        false);
                }
            }
        }
    }
}

const char* tiles_label(cuda::GemmTiles tiles) {
    switch (tiles) {
        case cuda::GemmTiles::kSimt:
            return "simt";
        case cuda::GemmTiles::kSmallBatch:
            return "small-batch";
        case cuda::GemmTiles::kMedium:
            return "medium";
        case cuda::GemmTiles::kLarge:
            return "large";
        case cuda::GemmTiles::kWide:
            return "wide";
        case cuda::GemmTiles::kWarpgroup:
            return "warpgroup";
    }
    return "?";
}

// The tiles gemm_with_tiles can run for `dtype` on this GPU: the SIMT GEMM for f32 and bf16
// (bf16's path below sm_80), the tensor-core tiles where the GPU multiplies dtype on tensor
// cores (the large ones where they fit its shared memory: gemm picks them, or the wide ones,
// for a huge size; the wide ones, which need less, for f16 and bf16 weights where the large
// ones fit), and for f16 and bf16 the warpgroup GEMM where it is enabled (sm_90a, unless
// BARELLM_CUDA_WGMMA=0). f16, Q8 and Q4 weights run on tensor cores only.
std::vector<cuda::GemmTiles> runnable_tiles(DType dtype) {
    std::vector<cuda::GemmTiles> tiles;
    if (dtype == DType::F32 || dtype == DType::BF16) tiles.push_back(cuda::GemmTiles::kSimt);
    if (cuda::gemm_tiles(dtype, 1, 1) == cuda::GemmTiles::kSimt) return tiles;
    tiles.push_back(cuda::GemmTiles::kSmallBatch);
    tiles.push_back(cuda::GemmTiles::kMedium);
    constexpr int kHuge = 1 << 20;
    const cuda::GemmTiles huge = cuda::gemm_tiles(dtype, kHuge, kHuge);
    const bool large_fits = huge == cuda::GemmTiles::kLarge || huge == cuda::GemmTiles::kWide ||
                            huge == cuda::GemmTiles::kWarpgroup;
    if (large_fits) tiles.push_back(cuda::GemmTiles::kLarge);
    // Block types are multiplied as their f16 copies, on f16's tiles.
    const bool f16_or_bf16 = dtype == DType::F16 || dtype == DType::BF16 || is_block_type(dtype);
    if (large_fits && f16_or_bf16) tiles.push_back(cuda::GemmTiles::kWide);
    // Q8/Q4 weights: dequantized to f16 first (dequantize_scratch).
    if ((f16_or_bf16 || is_quantized(dtype)) && cuda::warpgroup_gemm_enabled())
        tiles.push_back(cuda::GemmTiles::kWarpgroup);
    return tiles;
}

// The element values of a host matrix as f32 (exact: f16 and bf16 widen exactly). Q8 and Q4
// values are dequantized by cpu::embedding_row (q * scale, exact in f32), block types by
// dequantize_row, and rounded to f16, as the GEMM dequantizes them for its f16 tensor-core
// products.
std::vector<float> matrix_values(const HostMatrix& m) {
    const size_t count = size_t(m.matrix.rows) * m.matrix.cols;
    std::vector<float> values(count);
    if (is_quantized(m.matrix.dtype) || is_block_type(m.matrix.dtype)) {
        for (int r = 0; r < m.matrix.rows; ++r) {
            float* row = &values[size_t(r) * m.matrix.cols];
            if (is_block_type(m.matrix.dtype))
                dequantize_row(m.matrix.dtype, m.matrix.row_data(r), row, m.matrix.cols);
            else
                cpu::embedding_row(row, m.matrix, r);
        }
        for (float& v : values) v = half_to_float(float_to_half(v));
        return values;
    }
    for (size_t i = 0; i < count; ++i) {
        if (m.matrix.dtype == DType::F32) {
            std::memcpy(&values[i], &m.bytes[4 * i], 4);
        } else {
            uint16_t bits;
            std::memcpy(&bits, &m.bytes[2 * i], 2);
            values[i] = m.matrix.dtype == DType::F16 ? half_to_float(bits) : bf16_to_float(bits);
        }
    }
    return values;
}

// cuda::gemm (and gemm_with_tiles with every tile shape this GPU runs) against a
// double-precision product of the same rounded inputs, with and without bias and
// accumulate, outputs poisoned first. Q8 and Q4 weights (random values and scales) multiply
// f16 activations; their reference weights are the dequantized values rounded to f16
// (matrix_values), and Q4 takes each case's columns rounded up to a multiple of 32 (Q8 keeps
// them: its rows are padded to whole blocks, wider than the activations' rows). The error of out[t,
// r] is measured against sum_c |in[t, c] W[r, c]| + |bias[r]| + |out_before[t, r]| (what f32
// rounding scales with); the output's pitch is wider than its rows and the columns in between must
// stay untouched. Large shapes compare every token_stride-th token (and the last) with the
// reference.
void check_gemm() {
    struct Case {
        int tokens, rows, cols, token_stride;
    };
    const Case cases[] = {{1, 200, 72, 1},     {3, 200, 4100, 1},    {17, 200, 72, 1},
                          {100, 200, 4100, 1}, {511, 200, 72, 1},    {600, 77, 1000, 1},
                          {64, 1000, 300, 1},  {130, 129, 8, 1},     {5, 33, 1, 1},
                          {7, 4096, 14336, 1}, {512, 6144, 4096, 32}};
    constexpr int kPitchSlack = 5;  // output columns past the rows, left alone
    constexpr double kTolerance = 1e-5;
    cuda::PinnedBuffer staging(size_t(64) << 20, "staging");
    // Of the block types, those of a Q4_K_M file (Q5_0 where a row is not whole super-blocks),
    // Q3_K, a Q3_K_M file's, Q2_K, IQ4_NL, an IQ4_XS file's where a row is not whole
    // super-blocks, the i-quants that name the IQ2_XXS, IQ3_XXS, IQ1_S and IQ1_M files, the
    // ternary types, and MXFP4, an MXFP4 MoE file's experts.
    for (DType dtype :
         {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K,
          DType::Q5_0, DType::Q3_K, DType::Q2_K, DType::IQ4_NL, DType::IQ2_XXS, DType::IQ3_XXS,
          DType::IQ1_S, DType::IQ1_M, DType::TQ1_0, DType::TQ2_0, DType::MXFP4}) {
        const std::vector<cuda::GemmTiles> tiles = runnable_tiles(dtype);
        const DType in_dtype = cuda::gemm_input_dtype(dtype);
        for (Case test : cases) {
            if (dtype == DType::Q4_0) test.cols = (test.cols + kQ4Block - 1) / kQ4Block * kQ4Block;
            if (is_block_type(dtype)) {
                const int block = block_weights(dtype);
                test.cols = (test.cols + block - 1) / block * block;
            }
            const HostMatrix w = random_weights(test.rows, test.cols, dtype);
            const HostMatrix x = random_matrix(test.tokens, test.cols, in_dtype);
            DeviceBuffer w_memory, x_memory;
            const DeviceMatrix device_w = cuda::upload_matrix(w.matrix, w_memory, staging, "w");
            const DeviceMatrix device_x = cuda::upload_matrix(x.matrix, x_memory, staging, "x");
            const cuda::DeviceActivations in{x_memory.as(), in_dtype, test.tokens, test.cols,
                                             device_x.pitch};
            DeviceBuffer scratch_memory;
            const cuda::DequantizeScratch scratch = dequantize_scratch(device_w, 1, scratch_memory);
            const std::vector<float> bias = random_floats(test.rows);
            DeviceBuffer device_bias = to_device(bias);
            const int out_pitch = test.rows + kPitchSlack;
            const size_t out_count = size_t(test.tokens) * out_pitch;
            const std::vector<float> residual = random_floats(out_count);

            // The product and its magnitude, in double, at the compared tokens.
            std::vector<int> compared;
            for (int t = 0; t < test.tokens; t += test.token_stride) compared.push_back(t);
            if (compared.back() != test.tokens - 1) compared.push_back(test.tokens - 1);
            const std::vector<float> w_values = matrix_values(w), x_values = matrix_values(x);
            std::vector<double> product(compared.size() * test.rows);
            std::vector<double> magnitude(product.size());
            for (size_t i = 0; i < compared.size(); ++i) {
                const float* row_x = &x_values[size_t(compared[i]) * test.cols];
                for (int r = 0; r < test.rows; ++r) {
                    const float* row_w = &w_values[size_t(r) * test.cols];
                    double sum = 0, size = 0;
                    for (int c = 0; c < test.cols; ++c) {
                        const double term = double(row_x[c]) * row_w[c];
                        sum += term;
                        size += std::fabs(term);
                    }
                    product[i * test.rows + r] = sum;
                    magnitude[i * test.rows + r] = size;
                }
            }

            const std::string shape = std::string(dtype_label(dtype)) + " " +
                                      std::to_string(test.tokens) + "x" +
                                      std::to_string(test.rows) + "x" + std::to_string(test.cols);
            // Every tile shape (the warpgroup GEMM with each of its row counts), gemm's own
            // choice (empty) first.
            struct TileChoice {
                cuda::GemmTiles tiles;
                int warpgroup_rows;
            };
            std::vector<std::optional<TileChoice>> choices = {std::nullopt};
            for (cuda::GemmTiles t : tiles)
                if (t == cuda::GemmTiles::kWarpgroup)
                    for (int rows : cuda::kWarpgroupRowChoices)
                        choices.push_back(TileChoice{t, rows});
                else
                    choices.push_back(TileChoice{t, 0});
            for (const std::optional<TileChoice>& choice : choices) {
                const std::string tiles_name =
                    !choice ? std::string("gemm's ") +
                                  tiles_label(cuda::gemm_tiles(dtype, test.tokens, test.rows))
                    : choice->warpgroup_rows ? tiles_label(choice->tiles) + std::string(" ") +
                                                   std::to_string(choice->warpgroup_rows)
                                             : tiles_label(choice->tiles);
                for (int variant = 0; variant < 4; ++variant) {
                    const bool with_bias = variant & 1, accumulate = variant & 2;
                    DeviceBuffer out = accumulate ? to_device(residual) : poisoned(out_count);
                    const float* bias_pointer = with_bias ? device_bias.as<float>() : nullptr;
                    if (choice)
                        cuda::gemm_with_tiles(choice->tiles, out.as<float>(), out_pitch, device_w,
                                              in, bias_pointer, accumulate, 0, scratch,
                                              choice->warpgroup_rows);
                    else
                        cuda::gemm(out.as<float>(), out_pitch, device_w, in, bias_pointer,
                                   accumulate, 0, scratch);
                    const std::vector<float> got = to_host(out.as(), out_count);
                    double worst = 0;
                    for (int t = 0; t < test.tokens; ++t)  // written where due, nowhere else
                        for (int r = 0; r < out_pitch; ++r) {
                            const float value = got[size_t(t) * out_pitch + r];
                            const float before =
                                accumulate ? residual[size_t(t) * out_pitch + r] : NAN;
                            const bool untouched =
                                std::isnan(before) ? std::isnan(value) : value == before;
                            if (r < test.rows ? !std::isfinite(value) : !untouched)
                                worst = INFINITY;
                        }
                    for (size_t i = 0; i < compared.size() && std::isfinite(worst); ++i) {
                        const int t = compared[i];
                        for (int r = 0; r < test.rows; ++r) {
                            const size_t at = size_t(t) * out_pitch + r;
                            double want = product[i * test.rows + r];
                            double size = magnitude[i * test.rows + r];
                            if (with_bias) want += bias[r], size += std::fabs(bias[r]);
                            if (accumulate) want += residual[at], size += std::fabs(residual[at]);
                            const double error = std::fabs(got[at] - want);
                            worst = std::max(worst, size > 0 ? error / size : error);
                        }
                    }
                    const bool ok = worst <= kTolerance;
                    (ok ? passed : failed)++;
                    const std::string name = "gemm " + shape + " " + tiles_name +
                                             (with_bias ? " +bias" : "") +
                                             (accumulate ? " +=" : "");
                    std::printf("%s %-60s error / sum|terms| %.2e (tolerance %.0e)\n",
                                ok ? "PASS" : "FAIL", name.c_str(), worst, kTolerance);
                    std::fflush(stdout);
                }
            }
        }
    }
}

// ==== Batched prefill: the row kernels and attention_prefill against the CPU's prefill steps.

constexpr int kBatchSizes[] = {1, 3, 17, 100, 511};

// values rounded to dtype, as the GPU stores a GEMM input of that dtype.
std::vector<float> rounded(std::vector<float> values, DType dtype) {
    for (float& v : values) {
        if (dtype == DType::F16) v = half_to_float(float_to_half(v));
        if (dtype == DType::BF16) v = bf16_to_float(float_to_bf16(v));
    }
    return values;
}

// The relative error a result rounded to dtype may show against a reference rounded the same
// way (an ulp where the two sides' f32 values straddle a rounding boundary).
double rounding_tolerance(DType dtype, double f32_tolerance) {
    return dtype == DType::F32 ? f32_tolerance : dtype == DType::F16 ? 1e-3 : 8e-3;
}

// Activations [tokens, pitch] of `dtype` with every element NaN (0xff bytes are NaN in f32,
// f16 and bf16), backed by `memory`.
cuda::DeviceActivations poisoned_activations(DeviceBuffer& memory, int tokens, int cols,
                                             DType dtype) {
    cuda::DeviceActivations a;
    a.dtype = dtype;
    a.tokens = tokens;
    a.cols = cols;
    a.pitch = cuda::padded_cols(cols, dtype);
    memory = DeviceBuffer(a.bytes(), "a test output");
    CUDA_CHECK(cudaMemset(memory.as(), 0xff, a.bytes()));
    a.data = memory.as();
    return a;
}

// Every element of activations [tokens, pitch] (padding included) as f32.
std::vector<float> activations_to_host(const cuda::DeviceActivations& a) {
    CUDA_CHECK(cudaDeviceSynchronize());
    const size_t count = size_t(a.tokens) * a.pitch;
    std::vector<uint8_t> bytes(a.bytes());
    CUDA_CHECK(cudaMemcpy(bytes.data(), a.data, bytes.size(), cudaMemcpyDeviceToHost));
    std::vector<float> values(count);
    for (size_t i = 0; i < count; ++i) {
        if (a.dtype == DType::F32) {
            std::memcpy(&values[i], &bytes[4 * i], 4);
        } else {
            uint16_t bits;
            std::memcpy(&bits, &bytes[2 * i], 2);
            values[i] = a.dtype == DType::F16 ? half_to_float(bits) : bf16_to_float(bits);
        }
    }
    return values;
}

// rows [tokens, cols] laid out with `pitch`, the padding columns zero.
std::vector<float> with_pitch(const std::vector<float>& rows, int tokens, int cols, int pitch) {
    std::vector<float> out(size_t(tokens) * pitch, 0.0f);
    for (int t = 0; t < tokens; ++t)
        std::copy(rows.begin() + size_t(t) * cols, rows.begin() + size_t(t + 1) * cols,
                  out.begin() + size_t(t) * pitch);
    return out;
}

// embedding_rows, rmsnorm_rows and swiglu_rows against cpu::embedding_row, cpu::rmsnorm and
// cpu::swiglu row by row; the GEMM-input outputs in every dtype, their padding included.
void check_prefill_rows() {
    cuda::PinnedBuffer staging(size_t(16) << 20, "staging");
    std::uniform_int_distribution<int> any_token(0, 514);
    for (DType dtype : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0}) {
        const int cols = dtype == DType::Q4_0 ? 224 : 204;  // Q4: whole blocks of 32
        const HostMatrix table = is_quantized(dtype) ? random_quantized_matrix(515, cols, dtype)
                                                     : random_matrix(515, cols, dtype);
        DeviceBuffer table_memory;
        const DeviceMatrix device_table =
            cuda::upload_matrix(table.matrix, table_memory, staging, "table");
        for (int count : kBatchSizes) {
            std::vector<int> tokens(count);
            for (int& token : tokens) token = any_token(rng);
            DeviceBuffer device_tokens = to_device(tokens.data(), count * sizeof(int));
            DeviceBuffer x = poisoned(size_t(count) * cols);
            cuda::embedding_rows(x.as<float>(), device_table, 1.0f, device_tokens.as<int>(), count,
                                 0);
            std::vector<float> want(size_t(count) * cols);
            for (int t = 0; t < count; ++t)
                cpu::embedding_row(&want[size_t(t) * cols], table.matrix, tokens[t]);
            report(std::string("embedding_rows ") + dtype_label(dtype) + " 515x" +
                       std::to_string(cols) + " B " + std::to_string(count),
                   to_host(x.as(), want.size()), want, 0.0);
        }
    }

    const float eps = 1e-5f;
    for (int cols : {45, 204, 4099}) {
        std::vector<float> weight = random_floats(cols, 0.1f);
        for (float& v : weight) v += 1.0f;
        DeviceBuffer device_weight = to_device(weight);
        for (int count : kBatchSizes) {
            const std::vector<float> x = random_floats(size_t(count) * cols, 2.0f);
            const int in_pitch = cols + 3;  // gate and up with a pitch of their own
            const std::vector<float> gate = random_floats(size_t(count) * in_pitch, 2.0f);
            const std::vector<float> up = random_floats(size_t(count) * in_pitch);
            DeviceBuffer device_x = to_device(x), device_gate = to_device(gate),
                         device_up = to_device(up);
            std::vector<float> normed(size_t(count) * cols), gated(size_t(count) * cols);
            for (int t = 0; t < count; ++t) {
                cpu::rmsnorm(&normed[size_t(t) * cols], &x[size_t(t) * cols], weight.data(), cols,
                             eps);
                std::copy(gate.begin() + size_t(t) * in_pitch,
                          gate.begin() + size_t(t) * in_pitch + cols,
                          gated.begin() + size_t(t) * cols);
                cpu::swiglu(&gated[size_t(t) * cols], &up[size_t(t) * in_pitch], cols);
            }
            for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
                const std::string shape = std::string(dtype_label(dtype)) + " B " +
                                          std::to_string(count) + " cols " + std::to_string(cols);
                const int pitch = cuda::padded_cols(cols, dtype);
                DeviceBuffer memory;
                cuda::DeviceActivations out = poisoned_activations(memory, count, cols, dtype);
                cuda::rmsnorm_rows(out, device_x.as<float>(), device_weight.as<float>(), eps, 0);
                report("rmsnorm_rows " + shape, activations_to_host(out),
                       with_pitch(rounded(normed, dtype), count, cols, pitch),
                       rounding_tolerance(dtype, 1e-6));

                out = poisoned_activations(memory, count, cols, dtype);
                cuda::swiglu_rows(out, device_gate.as<float>(), device_up.as<float>(), in_pitch,
                                  Activation::Silu, /*limit=*/0.0f, 0);
                report("swiglu_rows " + shape, activations_to_host(out),
                       with_pitch(rounded(gated, dtype), count, cols, pitch),
                       rounding_tolerance(dtype, 1e-6));
            }
        }
    }
}

// dequantize_to_f16 against the CPU's dequantized weights rounded to f16 (matrix_values),
// bit for bit, and the f16 rows' padding columns (Q8 padding: zero): columns that are not
// a multiple of 8 (Q8) and more than one block.
void check_dequantize_to_f16() {
    cuda::PinnedBuffer staging(size_t(1) << 20, "staging");
    for (DType dtype : {DType::Q8_0, DType::Q4_0}) {
        const int rows = 37, cols = dtype == DType::Q8_0 ? 75 : 96;
        const HostMatrix w = random_quantized_matrix(rows, cols, dtype);
        DeviceBuffer w_memory, scratch_memory;
        const DeviceMatrix device_w = cuda::upload_matrix(w.matrix, w_memory, staging, "w");
        const cuda::DequantizeScratch scratch = dequantize_scratch(device_w, 1, scratch_memory);
        const DeviceMatrix f16 = cuda::dequantize_to_f16(device_w, scratch.data, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<uint16_t> got(size_t(rows) * f16.pitch);
        CUDA_CHECK(cudaMemcpy(got.data(), f16.data, got.size() * sizeof(uint16_t),
                              cudaMemcpyDeviceToHost));
        const std::vector<float> want = matrix_values(w);
        int wrong = 0;
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < f16.pitch; ++c) {
                const float value = half_to_float(got[size_t(r) * f16.pitch + c]);
                wrong += c < cols ? value != want[size_t(r) * cols + c] : value != 0.0f;
            }
        report_error(std::string("dequantize_to_f16 ") + dtype_label(dtype) + " " +
                         std::to_string(rows) + "x" + std::to_string(cols) + " (values wrong)",
                     wrong, 0);
    }
}

// gemm_swiglu against silu(x · W1ᵀ) · (x · W3ᵀ) in double from the same rounded inputs,
// rounded to the output's dtype, padding columns included: the warpgroup GEMM's gated form
// with each of its row counts where gemm takes the warpgroup GEMM, otherwise gemm, gemm and
// swiglu_rows. Hidden sizes end inside a tile and a TMA box; columns inside a K tile. Q8
// and Q4 weights (Q4: columns rounded up to whole blocks) multiply f16 activations, with
// scratch for both matrices as f16 (the gated form dequantizes them there).
void check_gemm_swiglu() {
    struct Case {
        int tokens, hidden, cols;
    };
    const Case cases[] = {
        {3, 172, 72}, {100, 172, 72}, {130, 200, 4100}, {511, 1000, 300}, {600, 77, 1000}};
    cuda::PinnedBuffer staging(size_t(64) << 20, "staging");
    for (DType dtype : {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0}) {
        const DType in_dtype = cuda::gemm_input_dtype(dtype);  // and the output's
        for (Case c : cases) {
            if (dtype == DType::Q4_0) c.cols = (c.cols + kQ4Block - 1) / kQ4Block * kQ4Block;
            const auto weights = [&] {
                return is_quantized(dtype) ? random_quantized_matrix(c.hidden, c.cols, dtype)
                                           : random_matrix(c.hidden, c.cols, dtype);
            };
            const HostMatrix w1 = weights(), w3 = weights();
            // x about 1, as RMSNorm leaves it: gate and up about 1, where silu bends.
            const HostMatrix x =
                host_matrix(random_floats(size_t(c.tokens) * c.cols), c.tokens, c.cols, in_dtype);
            DeviceBuffer w1_memory, w3_memory, x_memory, scratch_memory;
            const DeviceMatrix device_w1 = cuda::upload_matrix(w1.matrix, w1_memory, staging, "w1");
            const DeviceMatrix device_w3 = cuda::upload_matrix(w3.matrix, w3_memory, staging, "w3");
            const DeviceMatrix device_x = cuda::upload_matrix(x.matrix, x_memory, staging, "x");
            const cuda::DeviceActivations in{x_memory.as(), in_dtype, c.tokens, c.cols,
                                             device_x.pitch};
            const cuda::DequantizeScratch scratch =
                dequantize_scratch(device_w1, 2, scratch_memory);
            const std::vector<float> w1_values = matrix_values(w1), w3_values = matrix_values(w3),
                                     x_values = matrix_values(x);
            std::vector<float> gated(size_t(c.tokens) * c.hidden), ups(gated.size());
            for (int t = 0; t < c.tokens; ++t)
                for (int i = 0; i < c.hidden; ++i) {
                    double gate = 0, up = 0;
                    for (int k = 0; k < c.cols; ++k) {
                        const double xk = x_values[size_t(t) * c.cols + k];
                        gate += xk * w1_values[size_t(i) * c.cols + k];
                        up += xk * w3_values[size_t(i) * c.cols + k];
                    }
                    gated[size_t(t) * c.hidden + i] = float(gate);
                    ups[size_t(t) * c.hidden + i] = float(up);
                }
            for (int t = 0; t < c.tokens; ++t)
                cpu::swiglu(&gated[size_t(t) * c.hidden], &ups[size_t(t) * c.hidden], c.hidden);
            const int pitch = cuda::padded_cols(c.hidden, in_dtype);
            const std::vector<float> want =
                with_pitch(rounded(gated, in_dtype), c.tokens, c.hidden, pitch);

            // 0: gemm_swiglu's own choice; then, where the warpgroup GEMM runs, its gated form
            // with each row count, whatever gemm's rule would take.
            std::vector<int> row_counts = {0};
            if (cuda::warpgroup_gemm_enabled())
                for (int rows : cuda::kWarpgroupRowChoices) row_counts.push_back(rows);
            for (int rows : row_counts) {
                DeviceBuffer memory;
                const cuda::DeviceActivations out =
                    poisoned_activations(memory, c.tokens, c.hidden, in_dtype);
                DeviceBuffer gate = poisoned(size_t(c.tokens) * c.hidden),
                             up = poisoned(size_t(c.tokens) * c.hidden);
                cuda::gemm_swiglu(out, device_w1, device_w3, in, gate.as<float>(), up.as<float>(),
                                  c.hidden, Activation::Silu, 0, scratch, rows);
                const bool gated = rows != 0 || cuda::gemm_tiles(dtype, c.tokens, c.hidden) ==
                                                    cuda::GemmTiles::kWarpgroup;
                const std::string path = !gated      ? "gemm + swiglu_rows"
                                         : rows == 0 ? "gated warpgroup"
                                                     : "gated warpgroup " + std::to_string(rows);
                const std::string name = "gemm_swiglu " + path + " " + dtype_label(dtype) + " " +
                                         std::to_string(c.tokens) + "x" + std::to_string(c.hidden) +
                                         "x" + std::to_string(c.cols);
                report(name, activations_to_host(out), want, rounding_tolerance(in_dtype, 0));
                // The gated form leaves gate and up alone (poisoned): it ran, not the fallback.
                if (gated) {
                    const std::vector<float> gate_after = to_host(gate.as(), c.tokens * c.hidden);
                    const bool untouched = std::all_of(gate_after.begin(), gate_after.end(),
                                                       [](float v) { return std::isnan(v); });
                    report_error(name + " without gate and up", untouched ? 0 : INFINITY, 0);
                }
            }
        }
    }
}

// rope_kv_store_rows against the CPU prefill's per-token steps (Qwen3's per-head RMSNorm of q
// and k when normed, cpu::rope, cpu::kv_store), continuing a cache at first_pos > 0 too.
void check_rope_kv_store_rows() {
    const HeadShape shapes[] = {{6, 2, 34}, {8, 1, 64}, {5, 5, 72}, {32, 8, 128}, {4, 1, 256}};
    const float eps = 1e-6f;
    for (const HeadShape& s : shapes) {
        const std::vector<float> frequencies = test_rope_table(s.head_dim);
        DeviceBuffer device_frequencies = to_device(frequencies);
        const int q_dim = s.heads * s.head_dim, kv_dim = s.kv_heads * s.head_dim;
        const int qkv_pitch = q_dim + 2 * kv_dim + 2;  // rows with a pitch of their own
        std::vector<float> q_norm = random_floats(s.head_dim, 0.1f),
                           k_norm = random_floats(s.head_dim, 0.1f);
        for (float& v : q_norm) v += 1.0f;
        for (float& v : k_norm) v += 1.0f;
        DeviceBuffer device_q_norm = to_device(q_norm), device_k_norm = to_device(k_norm);
        for (int count : kBatchSizes) {
            for (int first_pos : {0, 3000}) {
                for (KvType type : {KvType::F32, KvType::F16}) {
                    for (bool normed : {false, true}) {
                        const size_t element = kv_element_bytes(type);
                        const std::vector<float> qkv = random_floats(size_t(count) * qkv_pitch);
                        DeviceBuffer device_qkv = to_device(qkv);
                        const int rows = first_pos + count;
                        const size_t cache_bytes = size_t(rows) * kv_dim * element;
                        DeviceBuffer keys(cache_bytes, "keys"), values(cache_bytes, "values");
                        CUDA_CHECK(cudaMemset(keys.as(), 0xff, cache_bytes));
                        CUDA_CHECK(cudaMemset(values.as(), 0xff, cache_bytes));
                        cuda::rope_kv_store_rows(
                            device_qkv.as<float>(), qkv_pitch, device_frequencies.as<float>(),
                            keys.as(), values.as(), first_pos, count, s.heads, s.kv_heads,
                            s.head_dim, normed ? device_q_norm.as<float>() : nullptr,
                            normed ? device_k_norm.as<float>() : nullptr, eps, type, 0);

                        // The CPU's steps, token by token.
                        std::vector<float> want_q(size_t(count) * q_dim);
                        std::vector<uint8_t> want_keys(size_t(count) * kv_dim * element),
                            want_values(want_keys.size());
                        for (int t = 0; t < count; ++t) {
                            const float* row = &qkv[size_t(t) * qkv_pitch];
                            float* q = &want_q[size_t(t) * q_dim];
                            std::vector<float> k(row + q_dim, row + q_dim + kv_dim);
                            std::copy(row, row + q_dim, q);
                            if (normed) {
                                for (int h = 0; h < s.heads; ++h)
                                    cpu::rmsnorm(q + h * s.head_dim, q + h * s.head_dim,
                                                 q_norm.data(), s.head_dim, eps);
                                for (int h = 0; h < s.kv_heads; ++h)
                                    cpu::rmsnorm(&k[h * s.head_dim], &k[h * s.head_dim],
                                                 k_norm.data(), s.head_dim, eps);
                            }
                            cpu::rope(q, s.heads, s.head_dim, first_pos + t, frequencies.data());
                            cpu::rope(k.data(), s.kv_heads, s.head_dim, first_pos + t,
                                      frequencies.data());
                            cpu::kv_store(&want_keys[size_t(t) * kv_dim * element], k.data(),
                                          kv_dim, type);
                            cpu::kv_store(&want_values[size_t(t) * kv_dim * element],
                                          row + q_dim + kv_dim, kv_dim, type);
                        }

                        const std::string what =
                            std::to_string(s.heads) + "/" + std::to_string(s.kv_heads) + "x" +
                            std::to_string(s.head_dim) + " B " + std::to_string(count) + " from " +
                            std::to_string(first_pos) + " kv " + kv_label(type) +
                            (normed ? " q/k norm" : "");
                        const std::vector<float> got_qkv = to_host(device_qkv.as(), qkv.size());
                        std::vector<float> got_q(want_q.size());
                        for (int t = 0; t < count; ++t)
                            std::copy(got_qkv.begin() + size_t(t) * qkv_pitch,
                                      got_qkv.begin() + size_t(t) * qkv_pitch + q_dim,
                                      got_q.begin() + size_t(t) * q_dim);
                        report("rope_kv_store_rows " + what + " q", got_q, want_q,
                               normed ? 1e-5 : 1e-6);
                        // The rows first_pos.. of the caches (f16: a rounding tie may fall
                        // differently when the f32 values differ by an ulp).
                        auto cache_rows = [&](const DeviceBuffer& cache) {
                            std::vector<uint8_t> bytes(want_keys.size());
                            CUDA_CHECK(cudaMemcpy(
                                bytes.data(),
                                cache.as<uint8_t>() + size_t(first_pos) * kv_dim * element,
                                bytes.size(), cudaMemcpyDeviceToHost));
                            return kv_values_as_float(bytes, type);
                        };
                        report("rope_kv_store_rows " + what + " k", cache_rows(keys),
                               kv_values_as_float(want_keys, type),
                               type == KvType::F32 ? (normed ? 1e-5 : 1e-6) : 1e-3);
                        report("rope_kv_store_rows " + what + " v", cache_rows(values),
                               kv_values_as_float(want_values, type), 0.0);
                    }
                }
            }
        }
    }
}

// attention_prefill against cpu::attention_batch: random caches of first_pos + count rows,
// the queries at positions first_pos.., GQA, sliding windows, f32 and f16 caches, the output
// in each GEMM-input dtype (its padding columns zero). With an f16 cache and head_dim a
// multiple of 16 up to 128 it runs on tensor cores, the queries and the probabilities
// rounded to f16 (11 significant bits): a tolerance of 2e-3 instead of 1e-5.
void check_attention_prefill() {
    struct Case {
        HeadShape shape;
        int window;
    };
    const Case cases[] = {{{8, 4, 8}, 0},    {{6, 2, 34}, 0},     {{5, 1, 72}, 6},
                          {{32, 8, 128}, 0}, {{32, 8, 128}, 100}, {{8, 1, 64}, 0},
                          {{12, 2, 256}, 0}, {{4, 4, 72}, 0},     {{16, 2, 80}, 33},
                          {{3, 3, 130}, 0},  {{6, 3, 96}, 5},     {{4, 2, 16}, 0}};
    for (const Case& test : cases) {
        const HeadShape& s = test.shape;
        // A scale other than 1/√head_dim: both sides must take the shape's.
        const AttentionShape shape{s.heads, s.kv_heads, s.head_dim, test.window,
                                   1.25f / std::sqrt(float(s.head_dim))};
        const int q_dim = s.heads * s.head_dim, kv_dim = s.kv_heads * s.head_dim;
        const int qkv_pitch = q_dim + 2 * kv_dim;
        for (int count : kBatchSizes) {
            for (int first_pos : {0, 300}) {
                for (KvType type : {KvType::F32, KvType::F16}) {
                    const size_t element = kv_element_bytes(type);
                    const int rows = first_pos + count;
                    std::vector<uint8_t> keys(size_t(rows) * kv_dim * element);
                    std::vector<uint8_t> values(keys.size());
                    const std::vector<float> key_values = random_floats(size_t(rows) * kv_dim);
                    const std::vector<float> value_values = random_floats(size_t(rows) * kv_dim);
                    cpu::kv_store(keys.data(), key_values.data(), rows * kv_dim, type);
                    cpu::kv_store(values.data(), value_values.data(), rows * kv_dim, type);
                    DeviceBuffer device_keys = to_device(keys.data(), keys.size());
                    DeviceBuffer device_values = to_device(values.data(), values.size());
                    const std::vector<float> qkv = random_floats(size_t(count) * qkv_pitch);
                    DeviceBuffer device_qkv = to_device(qkv);

                    std::vector<float> q(size_t(count) * q_dim), want(q.size());
                    for (int t = 0; t < count; ++t)
                        std::copy(qkv.begin() + size_t(t) * qkv_pitch,
                                  qkv.begin() + size_t(t) * qkv_pitch + q_dim,
                                  q.begin() + size_t(t) * q_dim);
                    cpu::attention_batch(want.data(), q.data(), count, first_pos, keys.data(),
                                         values.data(), shape, type);

                    const std::string name =
                        std::to_string(s.heads) + "/" + std::to_string(s.kv_heads) + "x" +
                        std::to_string(s.head_dim) + " window " + std::to_string(test.window) +
                        " B " + std::to_string(count) + " from " + std::to_string(first_pos) +
                        " kv " + kv_label(type);
                    // f16 and bf16 outputs at one batch size: the rounding is the same code.
                    std::vector<DType> dtypes = {DType::F32};
                    if (count == 100) dtypes = {DType::F32, DType::F16, DType::BF16};
                    for (DType dtype : dtypes) {
                        DeviceBuffer memory;
                        const cuda::DeviceActivations out =
                            poisoned_activations(memory, count, q_dim, dtype);
                        cuda::attention_prefill(out, device_qkv.as<float>(), qkv_pitch,
                                                device_keys.as(), device_values.as(), first_pos,
                                                shape, type, 0);
                        const bool tensor_cores =
                            cuda::attention_prefill_uses_mma(type, s.head_dim);
                        report("attention_prefill " + name + " out " + dtype_label(dtype) +
                                   (tensor_cores ? " (tensor cores)" : ""),
                               activations_to_host(out),
                               with_pitch(rounded(want, dtype), count, q_dim, out.pitch),
                               tensor_cores ? std::max(rounding_tolerance(dtype, 0.0), 2e-3)
                                            : rounding_tolerance(dtype, 1e-5));
                    }
                }
            }
        }
    }
}

// Milliseconds per call of `work`, median of `repeats` timed with events after a warm-up.
template <typename Work>
double time_ms(Work work, int repeats = 30) {
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    work(0);
    std::vector<double> samples;
    for (int r = 0; r < repeats; ++r) {
        CUDA_CHECK(cudaEventRecord(start));
        work(r);
        CUDA_CHECK(cudaEventRecord(stop));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        samples.push_back(ms);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    std::sort(samples.begin(), samples.end());
    return samples[samples.size() / 2];
}

void bench(int multiprocessors) {
    const size_t copy_bytes = size_t(1) << 30;
    DeviceBuffer a(copy_bytes, "copy"), b(copy_bytes, "copy");
    CUDA_CHECK(cudaMemset(a.as(), 1, copy_bytes));
    const double copy_ms = time_ms([&](int) {
        CUDA_CHECK(cudaMemcpyAsync(b.as(), a.as(), copy_bytes, cudaMemcpyDeviceToDevice));
    });
    const double copy_gbps = 2.0 * copy_bytes / copy_ms / 1e6;
    std::printf(
        "\n| kernel | shape | us | GB/s | %% of copy |\n| --- | --- | ---: | ---: | ---: |\n");
    std::printf("| device-to-device copy | 1 GiB | %.1f | %.0f | 100%% |\n", copy_ms * 1e3,
                copy_gbps);
    auto line = [&](const char* kernel, const char* shape, double ms, double bytes) {
        const double gbps = bytes / ms / 1e6;
        std::printf("| %s | %s | %.1f | %.0f | %.0f%% |\n", kernel, shape, ms * 1e3, gbps,
                    100 * gbps / copy_gbps);
        std::fflush(stdout);
    };

    cuda::PinnedBuffer staging(size_t(64) << 20, "staging");
    cuda::prepare_matvec(cuda::matvec_shared_bytes(14336, DType::F32));
    for (DType dtype : {DType::F16, DType::BF16, DType::F32}) {
        // Matrices far larger than L2, so every call streams from device memory.
        const HostMatrix w1 = random_matrix(14336, 4096, dtype, true),
                         w3 = random_matrix(14336, 4096, dtype, true);
        const HostMatrix w2 = random_matrix(4096, 14336, dtype, true);
        DeviceBuffer m1, m3, m2;
        const DeviceMatrix d1 = cuda::upload_matrix(w1.matrix, m1, staging, "w1");
        const DeviceMatrix d3 = cuda::upload_matrix(w3.matrix, m3, staging, "w3");
        const DeviceMatrix d2 = cuda::upload_matrix(w2.matrix, m2, staging, "w2");
        // Mistral 7B's qkv and wo shapes too (wo: the first 4096 rows of qkv's matrix).
        const HostMatrix wqkv = random_matrix(6144, 4096, dtype, true);
        DeviceBuffer mqkv;
        const DeviceMatrix dqkv = cuda::upload_matrix(wqkv.matrix, mqkv, staging, "wqkv");
        const DeviceMatrix dwo{dqkv.data, dtype, 4096, 4096, dqkv.pitch, nullptr};
        DeviceBuffer x = to_device(random_floats(14336)), norm = to_device(random_floats(14336));
        DeviceBuffer out = poisoned(14336);
        const std::string label = std::string("matvec ") + dtype_label(dtype);
        line((label + " (w2, +residual)").c_str(), "4096x14336", time_ms([&](int) {
                 cuda::matvec(out.as<float>(), d2, x.as<float>(), nullptr, 0, nullptr, true, 0);
             }),
             double(d2.bytes()));
        line((label + " (rmsnorm)").c_str(), "14336x4096", time_ms([&](int) {
                 cuda::matvec(out.as<float>(), d1, x.as<float>(), norm.as<float>(), 1e-5f, nullptr,
                              false, 0);
             }),
             double(d1.bytes()));
        line((label + " (qkv, rmsnorm)").c_str(), "6144x4096", time_ms([&](int) {
                 cuda::matvec(out.as<float>(), dqkv, x.as<float>(), norm.as<float>(), 1e-5f,
                              nullptr, false, 0);
             }),
             double(dqkv.bytes()));
        line((label + " (wo, +residual)").c_str(), "4096x4096", time_ms([&](int) {
                 cuda::matvec(out.as<float>(), dwo, x.as<float>(), nullptr, 0, nullptr, true, 0);
             }),
             double(dwo.bytes()));
        line((std::string("matvec_swiglu ") + dtype_label(dtype)).c_str(), "2 x 14336x4096",
             time_ms([&](int) {
                 cuda::matvec_swiglu(out.as<float>(), d1, d3, x.as<float>(), norm.as<float>(),
                                     1e-5f, Activation::Silu, 0);
             }),
             double(d1.bytes() + d3.bytes()));
    }

    // Q4 and Q8, int8 products in each launch shape; the bytes counted are the values and the
    // scales.
    const bool quantized_fits = matvec_fits(14336, DType::Q8_0);
    if (quantized_fits)
        cuda::prepare_matvec(cuda::matvec_shared_bytes(14336, DType::Q8_0));
    else
        std::printf("| q4, q8 matvecs | not timed: 14336 columns need more shared memory |\n");
    for (DType dtype : {DType::Q4_0, DType::Q8_0}) {
        if (!quantized_fits) break;
        const HostMatrix w1 = random_quantized_matrix(14336, 4096, dtype, true),
                         w3 = random_quantized_matrix(14336, 4096, dtype, true);
        const HostMatrix w2 = random_quantized_matrix(4096, 14336, dtype, true);
        DeviceBuffer m1, m3, m2;
        const DeviceMatrix d1 = cuda::upload_matrix(w1.matrix, m1, staging, "w1");
        const DeviceMatrix d3 = cuda::upload_matrix(w3.matrix, m3, staging, "w3");
        const DeviceMatrix d2 = cuda::upload_matrix(w2.matrix, m2, staging, "w2");
        DeviceBuffer x = to_device(random_floats(14336)), norm = to_device(random_floats(14336));
        DeviceBuffer out = poisoned(14336);
        // Mistral 7B's qkv and wo shapes too: the rows per warp and the grid matvec chooses
        // depend on the rows (marked "matvec's").
        const HostMatrix wqkv = random_quantized_matrix(6144, 4096, dtype, true);
        DeviceBuffer mqkv;
        const DeviceMatrix dqkv = cuda::upload_matrix(wqkv.matrix, mqkv, staging, "wqkv");
        const DeviceMatrix dwo{dqkv.data, dtype, 4096, 4096, dqkv.pitch, dqkv.scales};
        for (const QuantizedVariant& variant : kQuantizedVariants) {
            if (variant.launch.rows_per_warp == 0) continue;  // marked below
            const auto mark = [&](const DeviceMatrix& w, bool swiglu = false) {
                const cuda::QuantizedLaunch chosen = cuda::quantized_launch(w, swiglu);
                return variant.launch.rows_per_warp == chosen.rows_per_warp &&
                               variant.launch.grid == chosen.grid
                           ? ", matvec's"
                           : "";
            };
            const std::string variant_label =
                std::string(dtype_label(dtype)) + " " + variant.label();
            line(("matvec " + variant_label + mark(d2) + " (w2, +residual)").c_str(), "4096x14336",
                 time_ms([&](int) {
                     quantized_matvec(variant, out.as<float>(), d2, x.as<float>(), nullptr, 0,
                                      nullptr, true, 0);
                 }),
                 double(d2.bytes()));
            line(("matvec " + variant_label + mark(d1) + " (rmsnorm)").c_str(), "14336x4096",
                 time_ms([&](int) {
                     quantized_matvec(variant, out.as<float>(), d1, x.as<float>(), norm.as<float>(),
                                      1e-5f, nullptr, false, 0);
                 }),
                 double(d1.bytes()));
            line(("matvec " + variant_label + mark(dqkv) + " (qkv, rmsnorm)").c_str(), "6144x4096",
                 time_ms([&](int) {
                     quantized_matvec(variant, out.as<float>(), dqkv, x.as<float>(),
                                      norm.as<float>(), 1e-5f, nullptr, false, 0);
                 }),
                 double(dqkv.bytes()));
            line(("matvec " + variant_label + mark(dwo) + " (wo, +residual)").c_str(), "4096x4096",
                 time_ms([&](int) {
                     quantized_matvec(variant, out.as<float>(), dwo, x.as<float>(), nullptr, 0,
                                      nullptr, true, 0);
                 }),
                 double(dwo.bytes()));
            line(("matvec_swiglu " + variant_label + mark(d1, true)).c_str(), "2 x 14336x4096",
                 time_ms([&](int) {
                     quantized_matvec_swiglu(variant, out.as<float>(), d1, d3, x.as<float>(),
                                             norm.as<float>(), 1e-5f, 0);
                 }),
                 double(d1.bytes() + d3.bytes()));
        }
    }

    // The block types' matvecs (matvec_blocks.cuh) at the same shapes: the bytes they stream
    // include their blocks' scales.
    for (const DType dtype : kBlockTypes) {
        if (!matvec_fits(14336, dtype)) {
            std::printf(
                "| block-type matvecs | not timed: 14336 columns need more shared memory |\n");
            break;
        }
        const HostMatrix w1 = random_block_matrix(14336, 4096, dtype, true),
                         w3 = random_block_matrix(14336, 4096, dtype, true);
        const HostMatrix w2 = random_block_matrix(4096, 14336, dtype, true);
        const HostMatrix wqkv = random_block_matrix(6144, 4096, dtype, true);
        DeviceBuffer m1, m3, m2, mqkv;
        const DeviceMatrix d1 = cuda::upload_matrix(w1.matrix, m1, staging, "w1");
        const DeviceMatrix d3 = cuda::upload_matrix(w3.matrix, m3, staging, "w3");
        const DeviceMatrix d2 = cuda::upload_matrix(w2.matrix, m2, staging, "w2");
        const DeviceMatrix dqkv = cuda::upload_matrix(wqkv.matrix, mqkv, staging, "wqkv");
        DeviceBuffer x = to_device(random_floats(14336)), norm = to_device(random_floats(14336));
        DeviceBuffer out = poisoned(14336);
        // Each grid: the one matvec takes at these shapes on this GPU, and the other.
        for (const cuda::QuantizedGrid grid : {kBlockPerSet, kOneWave}) {
            const cuda::QuantizedLaunch launch{1, grid};
            const std::string type = std::string(dtype_label(dtype)) +
                                     (grid == kOneWave ? ", one wave" : ", block per set");
            const std::string label = "matvec " + type;
            line((label + " (w2, +residual)").c_str(), "4096x14336", time_ms([&](int) {
                     cuda::matvec_quantized_launch(launch, out.as<float>(), d2, x.as<float>(),
                                                   nullptr, 0, nullptr, true, 0);
                 }),
                 double(d2.bytes()));
            line((label + " (rmsnorm)").c_str(), "14336x4096", time_ms([&](int) {
                     cuda::matvec_quantized_launch(launch, out.as<float>(), d1, x.as<float>(),
                                                   norm.as<float>(), 1e-5f, nullptr, false, 0);
                 }),
                 double(d1.bytes()));
            line((label + " (qkv, rmsnorm)").c_str(), "6144x4096", time_ms([&](int) {
                     cuda::matvec_quantized_launch(launch, out.as<float>(), dqkv, x.as<float>(),
                                                   norm.as<float>(), 1e-5f, nullptr, false, 0);
                 }),
                 double(dqkv.bytes()));
            line(("matvec_swiglu " + type).c_str(), "2 x 14336x4096", time_ms([&](int) {
                     cuda::matvec_swiglu_quantized_launch(launch, out.as<float>(), d1, d3,
                                                          x.as<float>(), norm.as<float>(), 1e-5f,
                                                          Activation::Silu, 0);
                 }),
                 double(d1.bytes() + d3.bytes()));
        }
    }

    // Attention at Mistral 7B's shape with a context of 4096, rotating over 8 layers' caches:
    // at position 4095 (every split busy), and at 31 (a lone split: the fixed cost).
    const AttentionShape shape{32, 8, 128, 4096, 1.0f / std::sqrt(128.0f)};
    const int context = 4096, layers = 8;
    for (KvType type : {KvType::F16, KvType::F32}) {
        const size_t row_bytes = size_t(1024) * kv_element_bytes(type);
        const size_t layer_bytes = size_t(context) * row_bytes;
        DeviceBuffer keys(layer_bytes * layers, "keys"), values(layer_bytes * layers, "values");
        CUDA_CHECK(cudaMemset(keys.as(), 0, layer_bytes * layers));
        CUDA_CHECK(cudaMemset(values.as(), 0, layer_bytes * layers));
        const int splits = cuda::attention_splits(shape, context, multiprocessors);
        DeviceBuffer qkv = to_device(random_floats(4096 + 2 * 1024)), out = poisoned(4096);
        DeviceBuffer frequencies = to_device(test_rope_table(128));
        DeviceBuffer arrivals = zeroed_counters(cuda::attention_arrival_counters(shape));
        DeviceBuffer partial_out = poisoned(size_t(32) * splits * 128),
                     partial_stats = poisoned(size_t(32) * splits * 2);
        const std::string name = std::string("attention kv ") + kv_label(type) + " (" +
                                 std::to_string(splits) + " splits)";
        for (int pos : {context - 1, 31}) {
            const int step[2] = {0, pos};
            DeviceBuffer device_step = to_device(step, sizeof step);
            const double ms = time_ms([&](int r) {
                const size_t offset = size_t(r % layers) * layer_bytes;
                cuda::attention(out.as<float>(), qkv.as<float>(), frequencies.as<float>(), nullptr,
                                nullptr, 0.0f, keys.as<uint8_t>() + offset,
                                values.as<uint8_t>() + offset, device_step.as<int>(),
                                partial_out.as<float>(), partial_stats.as<float>(),
                                arrivals.as<unsigned>(), shape, splits, type, 0);
            });
            const std::string at = "32/8x128 pos " + std::to_string(pos);
            line(name.c_str(), at.c_str(), ms, 2.0 * row_bytes * (pos + 1));
        }
    }

    // Prefill attention of a 512-token prompt at Mistral 7B's shape: time and the rate of
    // its causal QKᵀ and PV (2 flops per multiply-add: 4 * heads * head_dim flops per visible
    // (query, key) pair).
    const int prompt = 512;
    std::printf("\n| kernel | shape | us | TFLOP/s |\n| --- | --- | ---: | ---: |\n");
    for (KvType type : {KvType::F16, KvType::F32}) {
        const size_t cache_bytes = size_t(prompt) * 1024 * kv_element_bytes(type);
        DeviceBuffer keys(cache_bytes, "keys"), values(cache_bytes, "values");
        CUDA_CHECK(cudaMemset(keys.as(), 0, cache_bytes));
        CUDA_CHECK(cudaMemset(values.as(), 0, cache_bytes));
        const int qkv_pitch = 4096 + 2 * 1024;
        DeviceBuffer qkv = to_device(cheap_random_floats(size_t(prompt) * qkv_pitch));
        DeviceBuffer memory;
        const cuda::DeviceActivations out = poisoned_activations(memory, prompt, 4096, DType::F16);
        const double ms = time_ms([&](int) {
            cuda::attention_prefill(out, qkv.as<float>(), qkv_pitch, keys.as(), values.as(), 0,
                                    shape, type, 0);
        });
        const double flops = 4.0 * 32 * 128 * (double(prompt) * (prompt + 1) / 2);
        std::printf(
            "| attention_prefill kv %s, f16 out (%s) | 32/8x128, %d tokens | %.1f | %.2f |\n",
            kv_label(type), cuda::attention_prefill_uses_mma(type, 128) ? "tensor cores" : "SIMT",
            prompt, ms * 1e3, flops / ms / 1e9);
        std::fflush(stdout);
    }
}

// Dense f16/bf16 tensor-core FLOPs per clock and SM (f32 accumulation): 4096 on sm_90 (the
// H100 SXM datasheet's 989.4 dense TFLOPS = 132 SMs x 1830 MHz x 4096), 2048 on sm_80
// (A100: 312 TFLOPS = 108 SMs x 1410 MHz x 2048); 0 for GPUs not listed here.
int tensor_flops_per_clock(const cudaDeviceProp& properties) {
    const int capability = 10 * properties.major + properties.minor;
    return capability == 90 ? 4096 : capability == 80 ? 2048 : 0;
}

// The prefill GEMM at Mistral 7B's shapes: 512 tokens with each tile shape (TFLOPS against
// the tensor cores' peak at the clock the GPU reports, its highest: a GPU that runs slower
// under load gets a lower share than at its running clock), then 1-64 tokens against as
// many decode matvecs.
void bench_gemm(const cudaDeviceProp& properties) {
    int clock_khz = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    const double peak_tflops = double(properties.multiProcessorCount) * clock_khz * 1e3 *
                               tensor_flops_per_clock(properties) / 1e12;
    if (peak_tflops > 0)
        std::printf(
            "\ntensor-core peak (dense f16/bf16): %d SMs x %d MHz x %d FLOP/clock = %.1f "
            "TFLOPS\n",
            properties.multiProcessorCount, clock_khz / 1000, tensor_flops_per_clock(properties),
            peak_tflops);
    else
        std::printf("\ntensor-core peak of sm_%d%d: not known here\n", properties.major,
                    properties.minor);

    struct Shape {
        const char* name;
        int rows, cols;
    };
    const Shape shapes[] = {
        {"qkv", 6144, 4096}, {"wo", 4096, 4096}, {"w1, w3", 14336, 4096}, {"w2", 4096, 14336}};
    constexpr int kBatch = 512;
    cuda::PinnedBuffer staging(size_t(64) << 20, "staging");
    const bool quantized_matvec_fits = matvec_fits(14336, DType::Q8_0);
    cuda::prepare_matvec(std::max(
        cuda::matvec_shared_bytes(14336, DType::F32),
        quantized_matvec_fits ? cuda::matvec_shared_bytes(14336, DType::Q8_0) : size_t(0)));
    // A weight matrix for the benchmark: random cheap values of dtype (Q8, Q4 included).
    const auto bench_matrix = [](int rows, int cols, DType dtype) {
        return is_quantized(dtype) ? random_quantized_matrix(rows, cols, dtype, true)
                                   : random_matrix(rows, cols, dtype, true);
    };
    constexpr DType kGemmDtypes[] = {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0};
    std::printf(
        "\n| gemm | tokens x rows x cols | tiles | us | TFLOPS | %% of peak |\n"
        "| --- | --- | --- | ---: | ---: | ---: |\n");
    for (DType dtype : kGemmDtypes) {
        const DType in_dtype = cuda::gemm_input_dtype(dtype);
        for (const Shape& shape : shapes) {
            const HostMatrix w = bench_matrix(shape.rows, shape.cols, dtype);
            const HostMatrix x = random_matrix(kBatch, shape.cols, in_dtype, true);
            DeviceBuffer w_memory, x_memory;
            const DeviceMatrix device_w = cuda::upload_matrix(w.matrix, w_memory, staging, "w");
            const DeviceMatrix device_x = cuda::upload_matrix(x.matrix, x_memory, staging, "x");
            const cuda::DeviceActivations in{x_memory.as(), in_dtype, kBatch, shape.cols,
                                             device_x.pitch};
            DeviceBuffer out = poisoned(size_t(kBatch) * shape.rows), scratch_memory;
            // Q8/Q4 on the warpgroup GEMM: the time to dequantize included.
            const cuda::DequantizeScratch scratch = dequantize_scratch(device_w, 1, scratch_memory);
            const cuda::GemmTiles chosen = cuda::gemm_tiles(dtype, kBatch, shape.rows);
            for (cuda::GemmTiles tiles : runnable_tiles(dtype)) {
                const double ms = time_ms([&](int) {
                    cuda::gemm_with_tiles(tiles, out.as<float>(), shape.rows, device_w, in, nullptr,
                                          false, 0, scratch);
                });
                const double tflops = 2.0 * kBatch * shape.rows * shape.cols / ms / 1e9;
                char share[16] = "-";
                if (peak_tflops > 0)
                    std::snprintf(share, sizeof share, "%.1f%%", 100 * tflops / peak_tflops);
                std::printf("| %s %s | %dx%dx%d | %s%s | %.1f | %.1f | %s |\n", shape.name,
                            dtype_label(dtype), kBatch, shape.rows, shape.cols, tiles_label(tiles),
                            tiles == chosen ? " (gemm's)" : "", ms * 1e3, tflops, share);
                std::fflush(stdout);
            }
        }
    }

    // Small batches read the weights once, as decode does for every token: each tensor-core
    // tile shape, gemm's marked, against as many matvecs (Q8, Q4: the int8 matvecs decode
    // runs), and the rate at which the GEMM reads the weights (values and scales) once.
    std::printf(
        "\n| gemm | tokens | tiles | gemm us | weights GB/s | that many matvecs us | gemm / "
        "matvecs |\n"
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |\n");
    for (DType dtype : kGemmDtypes) {
        if (is_quantized(dtype) && !quantized_matvec_fits) continue;
        const DType in_dtype = cuda::gemm_input_dtype(dtype);
        for (const Shape& shape : {shapes[2], shapes[3]}) {
            const HostMatrix w = bench_matrix(shape.rows, shape.cols, dtype);
            DeviceBuffer w_memory;
            const DeviceMatrix device_w = cuda::upload_matrix(w.matrix, w_memory, staging, "w");
            DeviceBuffer vector_in = to_device(random_floats(shape.cols)), scratch_memory;
            const cuda::DequantizeScratch scratch = dequantize_scratch(device_w, 1, scratch_memory);
            for (int tokens : {1, 4, 16, 64}) {
                const HostMatrix x = random_matrix(tokens, shape.cols, in_dtype, true);
                DeviceBuffer x_memory;
                const DeviceMatrix device_x = cuda::upload_matrix(x.matrix, x_memory, staging, "x");
                const cuda::DeviceActivations in{x_memory.as(), in_dtype, tokens, shape.cols,
                                                 device_x.pitch};
                DeviceBuffer out = poisoned(size_t(tokens) * shape.rows);
                const double matvec_ms = time_ms([&](int) {
                    for (int t = 0; t < tokens; ++t)
                        cuda::matvec(out.as<float>() + size_t(t) * shape.rows, device_w,
                                     vector_in.as<float>(), nullptr, 0.0f, nullptr, false, 0);
                });
                const cuda::GemmTiles chosen = cuda::gemm_tiles(dtype, tokens, shape.rows);
                for (cuda::GemmTiles tiles : runnable_tiles(dtype)) {
                    if (tiles == cuda::GemmTiles::kSimt) continue;
                    const double gemm_ms = time_ms([&](int) {
                        cuda::gemm_with_tiles(tiles, out.as<float>(), shape.rows, device_w, in,
                                              nullptr, false, 0, scratch);
                    });
                    std::printf("| %s %s %dx%d | %d | %s%s | %.1f | %.0f | %.1f | %.2f |\n",
                                shape.name, dtype_label(dtype), shape.rows, shape.cols, tokens,
                                tiles_label(tiles), tiles == chosen ? " (gemm's)" : "",
                                gemm_ms * 1e3, double(device_w.bytes()) / gemm_ms / 1e6,
                                matvec_ms * 1e3, gemm_ms / matvec_ms);
                    std::fflush(stdout);
                }
            }
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    try {
        std::string reason;
        if (!cuda_device_available(&reason)) {
            std::printf("cuda_kernel_check: %s\n", reason.c_str());
            return 2;
        }
        CUDA_CHECK(cudaSetDevice(0));
        cudaDeviceProp properties;
        CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
        std::printf("GPU: %s (sm_%d%d, %d SMs)\n", properties.name, properties.major,
                    properties.minor, properties.multiProcessorCount);
        shared_memory_limit = properties.sharedMemPerBlockOptin - kStaticSharedAllowance;
        if (argc > 1 && std::strcmp(argv[1], "--bench-only") == 0) {
            bench(properties.multiProcessorCount);
            bench_gemm(properties);
            return 0;
        }
        check_embedding();
        check_matvec();
        check_quantized_matvec();
        check_block_types();
        check_elementwise();
        check_rope();
        check_attention(properties.multiProcessorCount);
        check_gemm();
        check_dequantize_to_f16();
        check_prefill_rows();
        check_gemm_swiglu();
        check_rope_kv_store_rows();
        check_attention_prefill();
        if (argc > 1 && std::strcmp(argv[1], "--bench") == 0) {
            bench(properties.multiProcessorCount);
            bench_gemm(properties);
        }
        std::printf("%d passed, %d failed\n", passed, failed);
        return failed ? 1 : 0;
    } catch (const std::exception& e) {
        std::printf("cuda_kernel_check: %s\n%d passed, %d failed\n", e.what(), passed, failed + 1);
        return 1;
    }
}
