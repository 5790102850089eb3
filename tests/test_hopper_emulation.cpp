// The emulation's sm_90 instructions (tests/emulation/wgmma_emulation.h) against what the
// PTX ISA and the CUDA driver API document, written out here independently of the emulation:
// wgmma's descriptors, the 128-byte swizzle and the accumulator fragments; wgmma's asynchrony;
// mbarrier phases with transaction bytes; tensor copies (swizzle, zero fill, multicast);
// clusters; and the faults the emulation must report instead of hanging or passing.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.cuh"
#include "emulated_inputs.h"
#include "util/error.h"
#include "gemm_warpgroup.cuh"  // warpgroup_tensor_map
#include "weights/half.h"
#include "wgmma.cuh"

using namespace barellm;
using namespace barellm::cuda;
using namespace barellm::test;
using Catch::Matchers::Contains;

namespace {

constexpr int kRowBytes = 128, kPatternBytes = 1024, kChunkBytes = 16;
constexpr int kM = 64, kK = 16, kN = 128;

// Where element (row, k) of a K-major operand of 16-bit elements lies in the 128-byte
// swizzle (PTX ISA, "Shared Memory Matrix Layout", 128B swizzling): rows 128 bytes apart in
// groups of 8 that are 1024 bytes apart; within row r, 16-byte chunk c stored at chunk
// c ^ (r % 8). `first_k` shifts the elements along the row (a later K step).
size_t swizzled_offset(int row, int k, int first_k) {
    const int byte = (first_k + k) * 2, chunk = byte / kChunkBytes;
    return size_t(row / 8) * kPatternBytes + size_t(row % 8) * kRowBytes +
           size_t(chunk ^ (row % 8)) * kChunkBytes + byte % kChunkBytes;
}

// The descriptor fields as the PTX ISA lists them: start address >> 4 in bits 0-13, leading
// byte offset >> 4 in 16-29 (unused here: 1), stride byte offset >> 4 in 32-45, swizzle mode
// in 62-63 (1: 128 bytes).
uint64_t descriptor(uint32_t start) {
    return uint64_t(start >> 4) | uint64_t(1) << 16 | uint64_t(kPatternBytes >> 4) << 32 |
           uint64_t(1) << 62;
}

// A in [0, 64) x [0, 16) and B in [0, 128) x [0, 16): small integers, exact in f16.
float a_value(int m, int k) { return float((m * 7 + k * 3) % 11 - 5); }
float b_value(int n, int k) { return float((n * 5 + k) % 9 - 4); }
float initial_value(int lane, int i) { return float(lane % 13 + i % 7); }

// The shared memory of the wgmma tests: A and B each on a 1024-byte pattern boundary.
constexpr size_t kOperandBytes = size_t(kN / 8) * kPatternBytes;
constexpr size_t kWgmmaShared = kPatternBytes + 2 * kOperandBytes;

// The block's dynamic shared memory from its first 1024-byte pattern boundary on (the launch
// asks for a pattern more than it uses).
uint8_t* pattern_aligned_shared() {
    uint8_t* shared = reinterpret_cast<uint8_t*>(dynamic_shared_floats());
    return shared + (kPatternBytes - shared_address(shared) % kPatternBytes) % kPatternBytes;
}

// One warpgroup issues one m64n128k16 wgmma with B at the pattern and A `a_offset` bytes
// past it (its descriptor ORed with `extra_bits`), after a wgmma.fence if `fence`, and
// waits for it if `wait`.
void issue_one_wgmma(uint64_t extra_bits, uint32_t a_offset, bool fence, bool wait) {
    emulate_launch(dim3(1), dim3(kWarpgroupThreads), kWgmmaShared, [=] {
        const uint32_t start = shared_address(pattern_aligned_shared());
        float d[kN / 2] = {};
        if (fence) warpgroup_fence();
        mma_64xNx16<kN, DType::F16>(d, descriptor(start + a_offset) | extra_bits,
                                    descriptor(start));
        warpgroup_commit();
        if (wait) warpgroup_wait<0>();
    });
}

// One warpgroup: A at `a`, B at `b` (both starting on a pattern), the K elements stored
// `first_k` elements into the rows; d = initial + A · Bᵀ (or, with overwrite, A replaced by
// -A after issuing and before waiting), each lane's 64 accumulators into out[lane][64].
void run_wgmma(std::vector<float>& out, int first_k, bool overwrite, uint64_t* descriptors) {
    emulate_launch(dim3(1), dim3(kWarpgroupThreads), kWgmmaShared, [&] {
        uint8_t* shared = pattern_aligned_shared();
        uint8_t* a = shared;
        uint8_t* b = shared + kOperandBytes;
        const int lane = threadIdx.x;
        if (lane == 0) {
            for (int m = 0; m < kM; ++m)
                for (int k = 0; k < kK; ++k) {
                    const uint16_t bits = float_to_half(a_value(m, k));
                    std::memcpy(a + swizzled_offset(m, k, first_k), &bits, 2);
                }
            for (int n = 0; n < kN; ++n)
                for (int k = 0; k < kK; ++k) {
                    const uint16_t bits = float_to_half(b_value(n, k));
                    std::memcpy(b + swizzled_offset(n, k, first_k), &bits, 2);
                }
        }
        __syncthreads();
        const uint32_t step = uint32_t(first_k * 2);
        const uint64_t da = descriptor(shared_address(a) + step);
        const uint64_t db = descriptor(shared_address(b) + step);
        if (lane == 0) {
            descriptors[0] = da;
            descriptors[1] = swizzled_descriptor(a + step);
        }
        float d[kN / 2];
        for (int i = 0; i < kN / 2; ++i) d[i] = initial_value(lane, i);
        warpgroup_fence();
        mma_64xNx16<kN, DType::F16>(d, da, db);
        warpgroup_commit();
        if (overwrite) {
            __syncthreads();
            if (lane == 0)
                for (int m = 0; m < kM; ++m)
                    for (int k = 0; k < kK; ++k) {
                        const uint16_t bits = float_to_half(-a_value(m, k));
                        std::memcpy(a + swizzled_offset(m, k, first_k), &bits, 2);
                    }
            __syncthreads();
            // Before the wait the accumulators are as they were.
            for (int i = 0; i < kN / 2; ++i)
                if (d[i] != initial_value(lane, i)) __trap();
        }
        warpgroup_wait<0>();
        for (int i = 0; i < kN / 2; ++i) out[size_t(lane) * (kN / 2) + i] = d[i];
    });
}

// Lane 32 w + 4 g + t holds D[16 w + g + 8 h][8 j + 2 t + e] in d[4 j + 2 h + e] (PTX ISA,
// "Register Fragments": wgmma .m64nNk16 D).
void check_fragments(const std::vector<float>& out, float a_sign) {
    int wrong = 0;
    for (int lane = 0; lane < kWarpgroupThreads; ++lane) {
        const int w = lane / 32, g = lane % 32 / 4, t = lane % 4;
        for (int i = 0; i < kN / 2; ++i) {
            const int j = i / 4, h = i % 4 / 2, e = i % 2;
            const int m = 16 * w + g + 8 * h, n = 8 * j + 2 * t + e;
            float want = initial_value(lane, i);
            for (int k = 0; k < kK; ++k) want += a_sign * a_value(m, k) * b_value(n, k);
            wrong += out[size_t(lane) * (kN / 2) + i] != want;
        }
    }
    CHECK(wrong == 0);
}

// A 2-D f16 tensor of rows x cols (pitch cols rounded to 8) with element (r, c) = r * 100 + c.
struct Tensor {
    int rows, cols, pitch;
    AlignedArray<uint16_t> data;
    Tensor(int rows_, int cols_)
        : rows(rows_), cols(cols_), pitch((cols_ + 7) / 8 * 8), data(size_t(rows_) * pitch) {
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < cols; ++c) data[size_t(r) * pitch + c] = uint16_t(r * 100 + c);
    }
};

constexpr int kBoxColumns = 64;  // 128 bytes of f16

// Element (r, c) of a box of 64 columns copied from `tensor` at (column, row): the tensor's,
// or 0 outside it.
uint16_t box_element(const Tensor& tensor, int column, int row, int r, int c) {
    const int tr = row + r, tc = column + c;
    return tr < tensor.rows && tc < tensor.cols ? uint16_t(tr * 100 + tc) : 0;
}

}  // namespace

TEST_CASE("emulated wgmma reads swizzled operands and fills the documented fragments",
          "[cuda_emulation][hopper]") {
    std::vector<float> out(size_t(kWarpgroupThreads) * (kN / 2));
    uint64_t descriptors[2] = {};
    for (const int first_k : {0, 16, 48}) {  // K steps 0, 1 and 3 of a 64-column row
        INFO("K elements from " << first_k);
        run_wgmma(out, first_k, false, descriptors);
        check_fragments(out, 1.0f);
        // wgmma.cuh's descriptor is the one the PTX ISA's fields give.
        CHECK(descriptors[1] == descriptors[0]);
    }
}

TEST_CASE("emulated wgmma reads its operands when its group is waited for",
          "[cuda_emulation][hopper]") {
    std::vector<float> out(size_t(kWarpgroupThreads) * (kN / 2));
    uint64_t descriptors[2] = {};
    run_wgmma(out, 0, true, descriptors);
    check_fragments(out, -1.0f);  // the operands as they were at the wait
}

TEST_CASE(
    "emulated mbarriers complete a phase on arrivals and bytes; tensor copies swizzle "
    "and fill zeros",
    "[cuda_emulation][hopper]") {
    const Tensor tensor(5, 90);
    const CUtensorMap map = warpgroup_tensor_map(tensor.data.data(), DType::F16, tensor.rows,
                                                 tensor.cols, tensor.pitch, 4);
    constexpr int kBoxRows = 4;
    // The box at column 64, row 3: columns 64-89 and rows 3-4 inside, the rest zeros.
    constexpr int kColumn = 64, kRow = 3;
    constexpr int kThreads = 64, kExpecting = 32, kArriving = 33, kCopying = 0;
    constexpr int kStarting = kThreads - 1;
    // Threads 32 and 33 arrive (32 announcing the box's bytes); thread 0 issues the copy once
    // the last thread lets it go (a second barrier). The others wait for the phase, then count
    // the box's elements that differ from the tensor's (zeros outside it), in the swizzle: row
    // r's chunk c / 8 at chunk (c / 8) ^ r (rows 0-3 of a pattern). Whichever way the
    // scheduler goes through the threads, some of them look between the arrivals and the
    // copy: a phase completed without its bytes would show them the unwritten box.
    std::vector<int> wrong(kThreads, -1);
    emulate_launch(dim3(1), dim3(kThreads), 3 * kPatternBytes, [&] {
        uint8_t* shared = pattern_aligned_shared();
        uint64_t* barrier = reinterpret_cast<uint64_t*>(shared + kPatternBytes);
        uint64_t* go = barrier + 1;
        if (threadIdx.x == 0) {
            barrier_init(barrier, 2);
            barrier_init(go, 1);
        }
        __syncthreads();
        if (threadIdx.x == kCopying) {
            // A fresh barrier has completed the phase before its first: parity 1.
            barrier_wait(barrier, 1);
            barrier_wait(go, 0);
            tensor_copy(shared, &map, kColumn, kRow, barrier);
        } else if (threadIdx.x == kExpecting) {
            barrier_arrive_expecting(barrier, kBoxRows * kRowBytes);
        } else if (threadIdx.x == kArriving) {
            barrier_arrive(barrier);
        } else if (threadIdx.x == kStarting) {
            barrier_arrive(go);
        } else {
            barrier_wait(barrier, 0);
            int differing = 0;
            for (int r = 0; r < kBoxRows; ++r)
                for (int c = 0; c < kBoxColumns; ++c) {
                    const size_t at = size_t(r) * kRowBytes +
                                      size_t((c * 2 / kChunkBytes) ^ r) * kChunkBytes +
                                      c * 2 % kChunkBytes;
                    uint16_t element;
                    std::memcpy(&element, shared + at, 2);
                    differing += element != box_element(tensor, kColumn, kRow, r, c);
                }
            wrong[threadIdx.x] = differing;
        }
    });
    for (int t = 1; t < kThreads; ++t)
        if (t != kExpecting && t != kArriving && t != kStarting) CHECK(wrong[size_t(t)] == 0);
}

TEST_CASE("emulated clusters: ranks, remote arrivals, multicast copies, the cluster barrier",
          "[cuda_emulation][hopper]") {
    const Tensor tensor(8, 64);
    const CUtensorMap map = warpgroup_tensor_map(tensor.data.data(), DType::F16, tensor.rows,
                                                 tensor.cols, tensor.pitch, 2);
    const dim3 grid(4, 2), cluster(2, 2);
    constexpr int kBlocks = 8, kClusterBlocks = 4, kThreads = 32;
    std::vector<uint32_t> ranks(kBlocks, 99);
    std::vector<uint16_t> first_elements(kBlocks, 0xeeee);
    std::vector<int> after_barrier(kBlocks, 0);
    int arrived_before_barrier = 0;
    emulate_cluster_launch(grid, cluster, dim3(kThreads), 2 * kPatternBytes, [&] {
        uint8_t* shared = pattern_aligned_shared();
        uint64_t* copied = reinterpret_cast<uint64_t*>(shared + kPatternBytes);
        uint64_t* neighbour = copied + 1;
        const int block = int(blockIdx.x + grid.x * blockIdx.y);
        const uint32_t rank = rank_in_cluster();
        if (threadIdx.x == 0) {
            ranks[size_t(block)] = rank;
            barrier_init(copied, 1);
            barrier_init(neighbour, 1);
        }
        // Every block's barriers are ready before any block uses another's.
        cluster_arrive();
        ++arrived_before_barrier;
        cluster_wait();
        after_barrier[size_t(block)] = arrived_before_barrier;
        if (threadIdx.x == 0) {
            barrier_arrive_in_block(neighbour, (rank + 1) % kClusterBlocks);
            // Ranks 0 and 2 (the x = 0 column) each receive one copy: rank 0 sends rows 0-1
            // to both; rank 2 expects the bytes of one box, rank 0 too.
            if (rank == 0 || rank == 2) barrier_arrive_expecting(copied, 2 * kRowBytes);
            if (rank == 0) tensor_copy_to_blocks(shared, &map, 0, 2, copied, 0b0101);
            barrier_wait(neighbour, 0);
            if (rank == 0 || rank == 2) {
                barrier_wait(copied, 0);
                std::memcpy(&first_elements[size_t(block)], shared, 2);
            }
        }
    });
    for (int block = 0; block < kBlocks; ++block) {
        const int x = block % 4, y = block / 4;
        CHECK(ranks[size_t(block)] == uint32_t(x % 2 + 2 * (y % 2)));
        // Every thread of the block's cluster had arrived before any left the barrier.
        CHECK(after_barrier[size_t(block)] % (kClusterBlocks * kThreads) == 0);
        const bool receives = x % 2 == 0;
        CHECK(first_elements[size_t(block)] == (receives ? uint16_t(200) : uint16_t(0xeeee)));
    }
}

TEST_CASE("the emulation reports misused sm_90 instructions", "[cuda_emulation][hopper]") {
    SECTION("a wait on an mbarrier phase that never completes: deadlock") {
        CHECK_THROWS_WITH(emulate_launch(dim3(1), dim3(32), 64,
                                         [] {
                                             uint64_t* barrier = reinterpret_cast<uint64_t*>(
                                                 dynamic_shared_floats());
                                             if (threadIdx.x == 0) barrier_init(barrier, 2);
                                             __syncthreads();
                                             if (threadIdx.x == 0) barrier_arrive(barrier);
                                             barrier_wait(barrier, 0);
                                         }),
                          Contains("deadlock") && Contains("32 threads wait for an mbarrier"));
    }
    SECTION("an mbarrier used before init") {
        CHECK_THROWS_WITH(
            emulate_launch(
                dim3(1), dim3(32), 64,
                [] { barrier_arrive(reinterpret_cast<uint64_t*>(dynamic_shared_floats())); }),
            Contains("before mbarrier.init"));
    }
    SECTION("a descriptor with a reserved bit, or starting inside its swizzle pattern") {
        CHECK_THROWS_WITH(issue_one_wgmma(uint64_t(1) << 47, 0, true, true),
                          Contains("reserved bits"));
        CHECK_THROWS_WITH(issue_one_wgmma(0, kRowBytes, true, true),
                          Contains("past the first row"));
        CHECK_THROWS_WITH(issue_one_wgmma(0, 112, true, true),
                          Contains("crosses its 128-byte swizzled row"));
    }
    SECTION("a block ending with products not waited for") {
        CHECK_THROWS_WITH(issue_one_wgmma(0, 0, true, false), Contains("in flight"));
    }
    SECTION("a wgmma before any wgmma.fence") {
        CHECK_THROWS_WITH(issue_one_wgmma(0, 0, false, true), Contains("first wgmma.fence"));
    }
    SECTION("a tensor copy to a destination off the swizzle pattern") {
        const Tensor tensor(4, 64);
        const CUtensorMap map =
            warpgroup_tensor_map(tensor.data.data(), DType::F16, 4, 64, tensor.pitch, 1);
        CHECK_THROWS_WITH(
            emulate_launch(dim3(1), dim3(32), 3 * kPatternBytes,
                           [&] {
                               uint8_t* shared = pattern_aligned_shared();
                               uint64_t* barrier = reinterpret_cast<uint64_t*>(shared);
                               if (threadIdx.x == 0) {
                                   barrier_init(barrier, 1);
                                   tensor_copy(shared + kRowBytes, &map, 0, 0, barrier);
                               }
                           }),
            Contains("not on a 1024-byte boundary"));
    }
    SECTION("tensor maps the driver refuses") {
        const Tensor tensor(4, 64);
        // A box of more than 256 rows, a base not on 16 bytes, rows whose stride is not a
        // multiple of 16 bytes.
        CHECK_THROWS_WITH(warpgroup_tensor_map(tensor.data.data(), DType::F16, 4, 64, 64, 300),
                          Contains("cuTensorMapEncodeTiled failed"));
        CHECK_THROWS_WITH(
            warpgroup_tensor_map(tensor.data.data() + 1, DType::F16, 4, 60, tensor.pitch, 1),
            Contains("cuTensorMapEncodeTiled failed"));
        CHECK_THROWS_WITH(warpgroup_tensor_map(tensor.data.data(), DType::F16, 4, 60, 60, 1),
                          Contains("cuTensorMapEncodeTiled failed"));
    }
    SECTION("a grid that is not made of whole clusters") {
        CHECK_THROWS_WITH(emulate_cluster_launch(dim3(3), dim3(2), dim3(32), 0, [] {}),
                          Contains("whole clusters"));
    }
}
