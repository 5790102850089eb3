// The CUDA emulation (tests/emulation/cuda_emulation.h) against what the PTX ISA and the CUDA
// programming guide document: ldmatrix and mma fragment layouts (expected registers written
// out by hand), cp.async's asynchrony, shuffles, barriers, shared memory, and the faults it
// must report instead of hanging or passing.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common.cuh"
#include "dependent_launch.cuh"
#include "tensor_core.cuh"
#include "util/error.h"

using namespace barellm;
using namespace barellm::cuda;
using Catch::Matchers::Contains;

namespace {

constexpr int kLanes = 32;
constexpr int kMatrixSide = 8;
// Shared-memory rows of the ldmatrix tests: 16 elements (32 bytes) apart, wider than a row.
constexpr int kRowPitch = 16;
constexpr int kMatrices = 4;

// Element (row, column) of matrix m in the ldmatrix tests: all distinct.
uint16_t matrix_value(int m, int row, int column) { return uint16_t(64 * m + 8 * row + column); }

uint32_t pack(uint32_t low, uint32_t high) { return low | high << 16; }

// One warp: lane l gives the address of row l % 8 of matrix l / 8 (matrix m stored at rows
// 8 m .. 8 m + 7 of a [32, kRowPitch] shared array); out[lane][j] = the lane's register j.
template <int kCount, bool kTrans>
__global__ void load_matrices_kernel(uint32_t* out) {
    __shared__ __align__(16) uint16_t tile[kMatrices * kMatrixSide][kRowPitch];
    const int lane = threadIdx.x;
    for (int column = 0; column < kRowPitch; ++column)
        tile[lane][column] = column < kMatrixSide
                                 ? matrix_value(lane / kMatrixSide, lane % kMatrixSide, column)
                                 : uint16_t(0xffff);
    __syncthreads();
    // x2 reads addresses from lanes 0-15 only: the others give none.
    const void* row = kCount == 2 && lane >= 2 * kMatrixSide ? nullptr : &tile[lane][0];
    uint32_t r[kCount];
    if constexpr (kCount == 4) {
        if constexpr (kTrans)
            ldmatrix_x4_trans(r, row);
        else
            ldmatrix_x4(r, row);
    } else {
        if constexpr (kTrans)
            ldmatrix_x2_trans(r, row);
        else
            ldmatrix_x2(r, row);
    }
    for (int j = 0; j < kCount; ++j) out[lane * kMatrices + j] = r[j];
}

template <int kCount, bool kTrans>
std::vector<uint32_t> load_matrices() {
    std::vector<uint32_t> out(kLanes * kMatrices, 0);
    emulate_launch(dim3(1), dim3(kLanes), 0, load_matrices_kernel<kCount, kTrans>, out.data());
    return out;
}

}  // namespace

TEST_CASE("emulated ldmatrix gives the registers the PTX ISA documents", "[cuda_emulation]") {
    SECTION("x4: lane l holds row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1") {
        const std::vector<uint32_t> r = load_matrices<4, false>();
        CHECK(r[0 * kMatrices + 0] == pack(0, 1));                 // lane 0, matrix 0
        CHECK(r[5 * kMatrices + 0] == pack(10, 11));               // row 1, elements 2, 3
        CHECK(r[5 * kMatrices + 2] == pack(128 + 10, 128 + 11));   // matrix 2
        CHECK(r[31 * kMatrices + 3] == pack(192 + 62, 192 + 63));  // row 7, elements 6, 7
        CHECK(r[14 * kMatrices + 1] == pack(64 + 3 * 8 + 4, 64 + 3 * 8 + 5));  // row 3, 4, 5
        for (int lane = 0; lane < kLanes; ++lane)
            for (int m = 0; m < kMatrices; ++m) {
                const int row = lane / 4, column = 2 * (lane % 4);
                CHECK(r[lane * kMatrices + m] ==
                      pack(matrix_value(m, row, column), matrix_value(m, row, column + 1)));
            }
    }
    SECTION("x4 .trans: lane l holds column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1") {
        const std::vector<uint32_t> r = load_matrices<4, true>();
        CHECK(r[0 * kMatrices + 0] == pack(0, 8));               // column 0, rows 0, 1
        CHECK(r[5 * kMatrices + 0] == pack(17, 25));             // column 1, rows 2, 3
        CHECK(r[31 * kMatrices + 1] == pack(64 + 55, 64 + 63));  // column 7, rows 6, 7
        for (int lane = 0; lane < kLanes; ++lane)
            for (int m = 0; m < kMatrices; ++m) {
                const int column = lane / 4, row = 2 * (lane % 4);
                CHECK(r[lane * kMatrices + m] ==
                      pack(matrix_value(m, row, column), matrix_value(m, row + 1, column)));
            }
    }
    SECTION("x2 and x2 .trans read the addresses of lanes 0-15 only") {
        const std::vector<uint32_t> r = load_matrices<2, false>();
        CHECK(r[9 * kMatrices + 1] == pack(64 + 8 * 2 + 2, 64 + 8 * 2 + 3));
        const std::vector<uint32_t> t = load_matrices<2, true>();
        CHECK(t[9 * kMatrices + 1] == pack(64 + 8 * 2 + 2, 64 + 8 * 3 + 2));
        for (int lane = 0; lane < kLanes; ++lane) {
            CHECK(r[lane * kMatrices + 2] == 0);  // untouched
            CHECK(t[lane * kMatrices + 3] == 0);
        }
    }
}

namespace {

constexpr int kTileM = 16, kTileN = 8, kTileK = 16;

uint16_t to_16bit(DType type, float value) {
    return type == DType::F16 ? float_to_half(value) : __float2bfloat16_rn(value).bits;
}

// One mma from fragments each lane packs itself from row-major A [16, 16] and B stored as
// N rows of K elements [8, 16] (16-bit) following the documented layout; c starts at c_in
// [16, 8] and lands in c_out.
template <DType kType>
__global__ void mma_from_fragments_kernel(const uint16_t* a, const uint16_t* b, const float* c_in,
                                          float* c_out) {
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    const auto a_pair = [&](int row, int column) {
        return pack(a[row * kTileK + column], a[row * kTileK + column + 1]);
    };
    const auto b_pair = [&](int n, int k) {
        return pack(b[n * kTileK + k], b[n * kTileK + k + 1]);
    };
    const uint32_t a_regs[4] = {a_pair(g, 2 * t), a_pair(g + 8, 2 * t), a_pair(g, 2 * t + 8),
                                a_pair(g + 8, 2 * t + 8)};
    const uint32_t b_regs[2] = {b_pair(g, 2 * t), b_pair(g, 2 * t + 8)};
    float c[4] = {c_in[g * kTileN + 2 * t], c_in[g * kTileN + 2 * t + 1],
                  c_in[(g + 8) * kTileN + 2 * t], c_in[(g + 8) * kTileN + 2 * t + 1]};
    mma_16x8x16<kType>(c, a_regs, b_regs);
    c_out[g * kTileN + 2 * t] = c[0];
    c_out[g * kTileN + 2 * t + 1] = c[1];
    c_out[(g + 8) * kTileN + 2 * t] = c[2];
    c_out[(g + 8) * kTileN + 2 * t + 1] = c[3];
}

template <DType kType>
void check_integer_mma() {
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> small(-8, 8);
    std::vector<int> a(kTileM * kTileK), b(kTileN * kTileK), c(kTileM * kTileN);
    for (int& v : a) v = small(rng);
    for (int& v : b) v = small(rng);
    for (int& v : c) v = 100 * small(rng);
    std::vector<uint16_t> a16(a.size()), b16(b.size());
    for (size_t i = 0; i < a.size(); ++i) a16[i] = to_16bit(kType, float(a[i]));
    for (size_t i = 0; i < b.size(); ++i) b16[i] = to_16bit(kType, float(b[i]));
    const std::vector<float> c_in(c.begin(), c.end());
    std::vector<float> c_out(c.size(), NAN);
    emulate_launch(dim3(1), dim3(kLanes), 0, mma_from_fragments_kernel<kType>, a16.data(),
                   b16.data(), c_in.data(), c_out.data());
    for (int m = 0; m < kTileM; ++m)
        for (int n = 0; n < kTileN; ++n) {
            int expected = c[m * kTileN + n];
            for (int k = 0; k < kTileK; ++k) expected += a[m * kTileK + k] * b[n * kTileK + k];
            INFO("m " << m << " n " << n);
            CHECK(c_out[m * kTileN + n] == float(expected));
        }
}

// A [16, 16] row-major and B [8, 16] (N rows of K) staged in shared memory, loaded with
// ldmatrix_x4 and ldmatrix_x2 as the GEMMs do (or B [16, 8] as K rows of N with
// ldmatrix_x2_trans), multiplied once: out [16, 8] = A · Bᵀ (resp. A · B).
template <DType kType, bool kTransposedB>
__global__ void ldmatrix_mma_kernel(const uint16_t* a, const uint16_t* b, float* out) {
    constexpr int kPitch = kTileK + 8;  // padded rows, 16-byte aligned
    __shared__ __align__(16) uint16_t a_tile[kTileM][kPitch];
    __shared__ __align__(16) uint16_t b_tile[kTileK][kPitch];
    const int lane = threadIdx.x;
    for (int i = lane; i < kTileM * kTileK; i += kLanes) a_tile[i / kTileK][i % kTileK] = a[i];
    const int b_row_length = kTransposedB ? kTileN : kTileK;
    for (int i = lane; i < kTileN * kTileK; i += kLanes)
        b_tile[i / b_row_length][i % b_row_length] = b[i];
    __syncthreads();
    uint32_t a_regs[4], b_regs[2];
    // Matrices: rows 0-7 / 8-15 (lanes 0-7 / 8-15) of columns 0-7, then of columns 8-15.
    ldmatrix_x4(a_regs, &a_tile[lane % 16][8 * (lane / 16)]);
    if constexpr (kTransposedB)
        ldmatrix_x2_trans(b_regs, &b_tile[lane % 16][0]);  // k rows 0-7, then 8-15
    else
        ldmatrix_x2(b_regs, &b_tile[lane % 8][8 * ((lane / 8) % 2)]);  // n rows, k 0-7 / 8-15
    float c[4] = {0, 0, 0, 0};
    mma_16x8x16<kType>(c, a_regs, b_regs);
    const int g = lane / 4, t = lane % 4;
    out[g * kTileN + 2 * t] = c[0];
    out[g * kTileN + 2 * t + 1] = c[1];
    out[(g + 8) * kTileN + 2 * t] = c[2];
    out[(g + 8) * kTileN + 2 * t + 1] = c[3];
}

template <DType kType, bool kTransposedB>
void check_ldmatrix_mma() {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<uint16_t> a(kTileM * kTileK), b(kTileN * kTileK);
    std::vector<double> a_values(a.size()), b_values(b.size());
    const auto widen_16 = [](uint16_t bits) {
        return kType == DType::F16 ? half_to_float(bits) : bf16_to_float(bits);
    };
    for (size_t i = 0; i < a.size(); ++i) a_values[i] = widen_16(a[i] = to_16bit(kType, dist(rng)));
    for (size_t i = 0; i < b.size(); ++i) b_values[i] = widen_16(b[i] = to_16bit(kType, dist(rng)));
    std::vector<float> out(kTileM * kTileN, NAN);
    emulate_launch(dim3(1), dim3(kLanes), 0, ldmatrix_mma_kernel<kType, kTransposedB>, a.data(),
                   b.data(), out.data());
    for (int m = 0; m < kTileM; ++m)
        for (int n = 0; n < kTileN; ++n) {
            double expected = 0;
            for (int k = 0; k < kTileK; ++k)
                expected += a_values[m * kTileK + k] *
                            (kTransposedB ? b_values[k * kTileN + n] : b_values[n * kTileK + k]);
            INFO("m " << m << " n " << n);
            CHECK(out[m * kTileN + n] == Approx(expected).margin(1e-5));
        }
}

}  // namespace

TEST_CASE("emulated mma of small integers is the exact product", "[cuda_emulation]") {
    check_integer_mma<DType::F16>();
    check_integer_mma<DType::BF16>();
}

TEST_CASE("emulated ldmatrix then mma multiplies a tile by a transposed tile", "[cuda_emulation]") {
    check_ldmatrix_mma<DType::F16, false>();
    check_ldmatrix_mma<DType::BF16, false>();
    check_ldmatrix_mma<DType::F16, true>();
    check_ldmatrix_mma<DType::BF16, true>();
}

namespace {

constexpr int kCopyFloats = 4;  // one 16-byte copy
constexpr int kCopyThreads = 8;

// Each thread copies 16 bytes of `first` into buffer 0 and of `second` into buffer 1 as two
// groups, recording what it sees of them: before any wait (old), after waiting for all but
// one group, after waiting for all; then a copy with valid false. seen [5, threads, 4].
__global__ void copy_async_kernel(const float* first, const float* second, float* seen) {
    __shared__ __align__(16) float buffers[2][kCopyThreads * kCopyFloats];
    const int i = threadIdx.x * kCopyFloats;
    for (int k = 0; k < kCopyFloats; ++k) buffers[0][i + k] = buffers[1][i + k] = -1.0f;
    const auto record = [&](int stage, int buffer) {
        for (int k = 0; k < kCopyFloats; ++k)
            seen[(stage * kCopyThreads + int(threadIdx.x)) * kCopyFloats + k] =
                buffers[buffer][i + k];
    };
    copy_async_16(&buffers[0][i], first + i, true);
    copy_async_commit();
    copy_async_16(&buffers[1][i], second + i, true);
    copy_async_commit();
    record(0, 0);  // before any wait: the old contents
    copy_async_wait<1>();
    record(1, 0);  // group 1 done
    record(2, 1);  // group 2 maybe not: still old
    copy_async_wait<0>();
    record(3, 1);
    copy_async_16(&buffers[0][i], first + i, false);
    copy_async_commit();
    copy_async_wait<0>();
    record(4, 0);  // zeros
}

// Threads write their lane's value to dynamic shared memory; each reads its neighbour's
// without a barrier.
__global__ void missing_barrier_kernel(float* out) {
    float* values = dynamic_shared_floats();
    values[threadIdx.x] = float(threadIdx.x);
    out[threadIdx.x] = values[(threadIdx.x + 1) % kLanes];
}

// As missing_barrier_kernel with the barrier, and the first 20 threads returning first.
__global__ void early_return_kernel(float* out, int returning) {
    __shared__ float values[2 * kLanes];
    values[threadIdx.x] = float(threadIdx.x);
    if (int(threadIdx.x) < returning) return;
    __syncthreads();
    out[threadIdx.x] = values[(threadIdx.x + 1) % blockDim.x];
    __syncthreads();
}

}  // namespace

TEST_CASE("emulated cp.async copies only when a wait retires the group", "[cuda_emulation]") {
    std::vector<float> first(kCopyThreads * kCopyFloats), second(first.size());
    for (size_t i = 0; i < first.size(); ++i) {
        first[i] = float(i + 1);
        second[i] = float(1000 + i);
    }
    constexpr int kStages = 5;
    std::vector<float> seen(kStages * first.size(), NAN);
    emulate_launch(dim3(1), dim3(kCopyThreads), 0, copy_async_kernel, first.data(), second.data(),
                   seen.data());
    const auto at = [&](int stage, size_t i) { return seen[stage * first.size() + i]; };
    for (size_t i = 0; i < first.size(); ++i) {
        CHECK(at(0, i) == -1.0f);
        CHECK(at(1, i) == first[i]);
        CHECK(at(2, i) == -1.0f);
        CHECK(at(3, i) == second[i]);
        CHECK(at(4, i) == 0.0f);
    }
}

TEST_CASE("emulated shared memory is poisoned; barriers order the threads", "[cuda_emulation]") {
    std::vector<float> out(2 * kLanes, 0.0f);
    emulate_launch(dim3(1), dim3(kLanes), kLanes * sizeof(float), missing_barrier_kernel,
                   out.data());
    // A thread that runs before its neighbour reads uninitialised (NaN) shared memory.
    CHECK(std::any_of(out.begin(), out.begin() + kLanes, [](float v) { return std::isnan(v); }));

    const int threads = 2 * kLanes, returning = 20;
    std::fill(out.begin(), out.end(), -1.0f);
    emulate_launch(dim3(1), dim3(threads), 0, early_return_kernel, out.data(), returning);
    for (int i = 0; i < threads; ++i) CHECK(out[i] == (i < returning ? -1.0f : (i + 1) % threads));

    // Static shared memory: poisoned before every block, whatever the previous one wrote.
    constexpr int kBlocks = 3;
    std::vector<uint32_t> seen(kBlocks * kLanes);
    emulate_launch(dim3(kBlocks), dim3(kLanes), 0, [&] {
        __shared__ uint32_t words[kLanes];
        seen[blockIdx.x * kLanes + threadIdx.x] = words[threadIdx.x];
        words[threadIdx.x] = threadIdx.x;
    });
    CHECK(std::all_of(seen.begin(), seen.end(), [](uint32_t v) { return v == 0xffffffffu; }));

    // Dynamic shared memory: poisoned, then as written.
    constexpr int kFloats = 20;
    std::vector<uint32_t> before(kFloats);
    std::vector<float> after(kFloats);
    emulate_launch(dim3(1), dim3(kFloats), kFloats * sizeof(float), [&] {
        float* shared = dynamic_shared_floats();
        before[threadIdx.x] = __float_as_uint(shared[threadIdx.x]);
        shared[threadIdx.x] = float(threadIdx.x) * 2;
        __syncthreads();
        after[threadIdx.x] = shared[kFloats - 1 - threadIdx.x];
    });
    for (int i = 0; i < kFloats; ++i) {
        CHECK(before[i] == 0xffffffffu);
        CHECK(after[i] == float(kFloats - 1 - i) * 2);
    }
}

TEST_CASE("emulated shuffles and block reductions", "[cuda_emulation]") {
    constexpr int kWarps = 3, kThreads = kWarps * kLanes;
    constexpr int kResults = 8;
    std::vector<float> out(kThreads * kResults, NAN);
    const auto value_of = [](int thread) { return float(thread * thread % 97 + 1); };
    emulate_launch(dim3(1), dim3(kThreads), 0, [&] {
        __shared__ float scratch[kLanes];
        const int thread = threadIdx.x;
        const float v = value_of(thread);
        float* o = &out[thread * kResults];
        o[0] = __shfl_xor_sync(kFullMask, v, 5);
        o[1] = __shfl_down_sync(kFullMask, v, 3);
        o[2] = __shfl_sync(kFullMask, v, 31 - thread % kLanes);
        o[3] = __shfl_xor_sync(kFullMask, v, 4, 8);  // within segments of 8 lanes
        o[4] = warp_sum(v);
        o[5] = block_sum(v, scratch);
        o[6] = __shfl_up_sync(kFullMask, v, 2);
        // Segments of 8 may read earlier segments, not later ones (their own value then).
        o[7] = __shfl_xor_sync(kFullMask, v, 8, 8);
    });
    float total = 0;
    for (int t = 0; t < kThreads; ++t) total += value_of(t);
    for (int t = 0; t < kThreads; ++t) {
        const int lane = t % kLanes, warp_first = t - lane;
        const float* o = &out[t * kResults];
        INFO("thread " << t);
        CHECK(o[0] == value_of(warp_first + (lane ^ 5)));
        CHECK(o[1] == value_of(lane + 3 < kLanes ? t + 3 : t));
        CHECK(o[2] == value_of(warp_first + 31 - lane));
        CHECK(o[3] == value_of(warp_first + (lane ^ 4)));
        float warp_total = 0;
        for (int l = 0; l < kLanes; ++l) warp_total += value_of(warp_first + l);
        CHECK(o[4] == warp_total);
        CHECK(o[5] == total);
        CHECK(o[6] == value_of(lane >= 2 ? t - 2 : t));
        CHECK(o[7] == value_of((lane ^ 8) < lane ? t - 8 : t));
    }
}

TEST_CASE("emulated grids run every thread of every block once", "[cuda_emulation]") {
    const dim3 grid(3, 2, 2), block(5, 3, 2);
    const int threads = 3 * 2 * 2 * 5 * 3 * 2;
    std::vector<int> visits(threads, 0);
    unsigned counter = 0;
    emulate_launch(dim3(grid), dim3(block), 0, [&] {
        const unsigned block_index = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        const unsigned thread_index =
            threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
        ++visits[block_index * blockDim.x * blockDim.y * blockDim.z + thread_index];
        atomicAdd(&counter, 1u);
    });
    CHECK(counter == unsigned(threads));
    CHECK(std::all_of(visits.begin(), visits.end(), [](int v) { return v == 1; }));
}

TEST_CASE("an EarlyLaunchCheck holds back the memory of the kernels ahead until finish_prologue",
          "[cuda_emulation]") {
    // 3 blocks of 37 threads: thread i of block b reads ahead[i] before and after
    // finish_prologue, and writes mine[b * 37 + i] before it (lost) and after it (kept); block 2
    // returns without waiting and must leave both arrays as it found them.
    constexpr int kBlocks = 3, kThreads = 37;
    std::vector<float> ahead(kThreads), mine(kBlocks * kThreads, 0.0f);
    for (int i = 0; i < kThreads; ++i) ahead[i] = float(i + 1);
    std::vector<float> before(kBlocks * kThreads, 0.0f), after(kBlocks * kThreads, 0.0f);
    {
        const emulation::EarlyLaunchCheck check({{ahead.data(), ahead.size() * sizeof(float)},
                                                 {mine.data(), mine.size() * sizeof(float)}});
        emulate_launch(dim3(kBlocks), dim3(kThreads), 0, [&] {
            const int i = int(threadIdx.x), slot = int(blockIdx.x) * kThreads + i;
            if (blockIdx.x == kBlocks - 1) return;
            before[slot] = ahead[i];
            mine[slot] = -1.0f;
            finish_prologue();
            after[slot] = ahead[i];
            if (mine[slot] == 0.0f) mine[slot] = 2.0f;
        });
    }
    for (int b = 0; b < kBlocks; ++b)
        for (int i = 0; i < kThreads; ++i) {
            const int slot = b * kThreads + i;
            const bool waited = b < kBlocks - 1;
            INFO("block " << b << ", thread " << i);
            CHECK((waited ? std::isnan(before[slot]) : before[slot] == 0.0f));
            CHECK(after[slot] == (waited ? float(i + 1) : 0.0f));
            CHECK(mine[slot] == (waited ? 2.0f : 0.0f));
        }
    for (int i = 0; i < kThreads; ++i) CHECK(ahead[i] == float(i + 1));
    // Without a check, finish_prologue is a barrier and the memory reads as it is.
    std::vector<float> plain(kThreads, 0.0f);
    emulate_launch(dim3(1), dim3(kThreads), 0, [&] {
        plain[threadIdx.x] = ahead[threadIdx.x];
        finish_prologue();
    });
    CHECK(plain == ahead);
}

TEST_CASE("emulated 16-bit conversions round to nearest even", "[cuda_emulation]") {
    CHECK(__float2bfloat16_rn(1.0f).bits == 0x3f80);
    CHECK(__float2bfloat16_rn(1.0f + std::ldexp(1.0f, -8)).bits == 0x3f80);      // tie, even
    CHECK(__float2bfloat16_rn(1.0f + 3 * std::ldexp(1.0f, -8)).bits == 0x3f82);  // tie, up
    CHECK(__float2bfloat16_rn(-2.5f).bits == 0xc020);
    CHECK((__float2bfloat16_rn(NAN).bits & 0x7fc0) == 0x7fc0);
    CHECK(__bfloat162float(__ushort_as_bfloat16(0x3fc0)) == 1.5f);
    CHECK(__half_as_ushort(__float2half_rn(0.1f)) == 0x2e66);
    CHECK(__half2float(__ushort_as_half(0x3555)) == 0.333251953125f);
    const float2 pair = __half22float2(__floats2half2_rn(1.0f, -2.0f));
    CHECK(pair.x == 1.0f);
    CHECK(pair.y == -2.0f);
}

TEST_CASE("emulated dp4a is the signed 4 x 8-bit dot product plus the accumulator",
          "[cuda_emulation]") {
    // Bytes (low to high) 1, -2, 127, -128 and 3, 4, -5, -128.
    const int a = int(0x807f'fe01u), b = int(0x80fb'0403u);
    CHECK(__dp4a(a, b, 0) == 1 * 3 + -2 * 4 + 127 * -5 + -128 * -128);
    CHECK(__dp4a(a, b, -1000) == 15744 - 1000);
    CHECK(__dp4a(0x0f0f0f0f, 0x01010101, 7) == 4 * 15 + 7);
    // Against the byte-by-byte definition on random words.
    std::mt19937 rng(5);
    for (int trial = 0; trial < 1000; ++trial) {
        const uint32_t x = rng(), y = rng();
        const int c = int(rng() % 200001) - 100000;
        int want = c;
        for (int byte = 0; byte < 4; ++byte)
            want += int(int8_t(x >> (8 * byte))) * int(int8_t(y >> (8 * byte)));
        REQUIRE(__dp4a(int(x), int(y), c) == want);
    }
    // The sum wraps as a 32-bit addition.
    CHECK(__dp4a(0x7f, 0x7f, 0x7fffffff) == int(0x7fffffffu + 127u * 127u));
}

TEST_CASE("the emulation reports broken barriers and misused warp instructions",
          "[cuda_emulation]") {
    SECTION("half a warp at __syncthreads, the other half at a shuffle: deadlock") {
        CHECK_THROWS_WITH(emulate_launch(dim3(1), dim3(kLanes), 0,
                                         [] {
                                             if (threadIdx.x < 16)
                                                 __syncthreads();
                                             else
                                                 __syncwarp();
                                         }),
                          Contains("deadlock") && Contains("16 threads wait at __syncthreads"));
    }
    SECTION("a lane returning while the rest of its warp waits at a shuffle") {
        CHECK_THROWS_WITH(emulate_launch(dim3(1), dim3(2 * kLanes), 0,
                                         [] {
                                             if (threadIdx.x == kLanes + 7) return;
                                             __shfl_xor_sync(kFullMask, 1.0f, 1);
                                         }),
                          Contains("returned"));
    }
    SECTION("a warp instruction after a lane of the warp returned") {
        CHECK_THROWS_WITH(emulate_launch(dim3(1), dim3(2 * kLanes), 0,
                                         [] {
                                             if (threadIdx.x == kLanes) return;
                                             __shfl_xor_sync(kFullMask, 1.0f, 1);
                                         }),
                          Contains("after lane 0 of the warp returned"));
    }
    SECTION("a warp that returned whole does not stop another's warp instructions") {
        std::vector<float> sums(2 * kLanes, 0.0f);
        float* out = sums.data();
        emulate_launch(dim3(1), dim3(3 * kLanes), 0, [out] {
            if (threadIdx.x < kLanes) return;
            const float value = float(threadIdx.x);
            out[threadIdx.x - kLanes] = value + __shfl_xor_sync(kFullMask, value, 1);
        });
        for (int i = 0; i < 2 * kLanes; ++i)
            CHECK(sums[size_t(i)] == float(2 * (i + kLanes)) + (i % 2 ? -1.0f : 1.0f));
    }
    SECTION("lanes of one warp at different warp instructions") {
        CHECK_THROWS_WITH(emulate_launch(dim3(1), dim3(kLanes), 0,
                                         [] {
                                             if (threadIdx.x % 2)
                                                 __syncwarp();
                                             else
                                                 __shfl_xor_sync(kFullMask, 1.0f, 1);
                                         }),
                          Contains("while other lanes of the warp wait"));
    }
    SECTION("a shuffle after a lane returned, or in a partial warp") {
        CHECK_THROWS_WITH(emulate_launch(dim3(1), dim3(kLanes), 0,
                                         [] {
                                             if (threadIdx.x == 3) return;
                                             __shfl_down_sync(kFullMask, 1.0f, 1);
                                         }),
                          Contains("thread (3, 0, 0): returned while"));
        CHECK_THROWS_WITH(
            emulate_launch(dim3(1), dim3(40), 0, [] { __shfl_down_sync(kFullMask, 1.0f, 1); }),
            Contains("a warp of 8 threads"));
        CHECK_THROWS_WITH(
            emulate_launch(dim3(1), dim3(kLanes), 0, [] { __shfl_down_sync(0xffffu, 1.0f, 1); }),
            Contains("mask"));
    }
    SECTION("misaligned or non-shared addresses, __trap") {
        std::vector<float4> global(kLanes);
        static float4 static_global[kLanes];  // static data, not __shared__
        CHECK_THROWS_WITH(emulate_launch(dim3(1), dim3(kLanes), 0,
                                         [&] {
                                             uint32_t r[2];
                                             ldmatrix_x2(r, &static_global[threadIdx.x]);
                                         }),
                          Contains("not in shared memory"));
        CHECK_THROWS_WITH(emulate_launch(dim3(1), dim3(kLanes), 0,
                                         [&] {
                                             uint32_t r[4];
                                             ldmatrix_x4(r, &global[threadIdx.x]);
                                         }),
                          Contains("not in shared memory"));
        CHECK_THROWS_WITH(
            emulate_launch(dim3(1), dim3(1), 64,
                           [&] { copy_async_16(dynamic_shared_floats() + 1, &global[0], true); }),
            Contains("16-byte aligned"));
        CHECK_THROWS_WITH(emulate_launch(dim3(1), dim3(2), 0, [] { __trap(); }),
                          Contains("block (0, 0, 0) thread (0, 0, 0): __trap()"));
    }
    SECTION("launch shapes a GPU refuses") {
        CHECK_THROWS_AS(emulate_launch(dim3(1), dim3(1025), 0, [] {}), Error);
        CHECK_THROWS_AS(emulate_launch(dim3(1), dim3(32), 300 * 1024, [] {}), Error);
    }
    SECTION("a launch after a failed one runs normally") {
        CHECK_THROWS(emulate_launch(dim3(2), dim3(kLanes), 0, [] { __trap(); }));
        int ran = 0;
        emulate_launch(dim3(2), dim3(kLanes), 0, [&] {
            __syncthreads();
            ++ran;
        });
        CHECK(ran == 2 * kLanes);
    }
}
