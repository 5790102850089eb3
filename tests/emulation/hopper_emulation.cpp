// The sm_90 instructions of the CUDA emulation (wgmma_emulation.h): warpgroup MMAs read
// through matrix descriptors, mbarriers, tensor copies and their maps, and clusters.
#include <cstring>
#include <string>
#include <vector>

#include "emulation_runtime.h"
#include "util/error.h"
#include "weights/half.h"
#include "wgmma_emulation.h"

namespace barellm::cuda::emulation {
namespace {

// ---- The 128-byte swizzle: 16-byte chunk c of 128-byte row r of a 1024-byte pattern lies at
// chunk c ^ (r % 8), read from the address bits.
constexpr uint32_t kSwizzleRowBytes = 128;
constexpr uint32_t kSwizzlePatternBytes = 1024;
constexpr uint32_t kChunkShift = 4, kRowShift = 7, kRowsMask = 7;

uint32_t swizzled(uint32_t address) {
    return address ^ (((address >> kRowShift) & kRowsMask) << kChunkShift);
}

// ---- mbarriers: the state in the barrier's 8 bytes. Bits 0-15: arrivals per phase; 16-31:
// arrivals pending; 32-55: the transaction count (signed); 56: the phase's parity; 57-63: a
// tag that tells an initialised barrier from other bytes.
constexpr uint64_t kBarrierTag = 0x2a;
constexpr int kPendingShift = 16, kTransactionShift = 32, kPhaseShift = 56, kTagShift = 57;
constexpr uint64_t kCountMask = 0xffff, kTransactionMask = 0xffffff;
constexpr int kTransactionLimit = 1 << 23;  // the count's sign bit: its magnitude stays below
constexpr int kMaxArrivals = 0xffff;

struct BarrierState {
    int expected = 0, pending = 0, transactions = 0;
    uint32_t phase = 0;
};

bool barrier_initialised(uint64_t bits) { return bits >> kTagShift == kBarrierTag; }

BarrierState decode_barrier(uint64_t bits) {
    BarrierState s;
    s.expected = int(bits & kCountMask);
    s.pending = int(bits >> kPendingShift & kCountMask);
    // The 24-bit two's complement count, sign-extended.
    const int count = int(bits >> kTransactionShift & kTransactionMask);
    s.transactions = (count ^ kTransactionLimit) - kTransactionLimit;
    s.phase = uint32_t(bits >> kPhaseShift & 1);
    return s;
}

uint64_t load_bits(const uint64_t* barrier) {
    uint64_t bits;
    std::memcpy(&bits, barrier, sizeof bits);
    return bits;
}

BarrierState read_barrier(const uint64_t* barrier) {
    const uint64_t bits = load_bits(barrier);
    if (!barrier_initialised(bits))
        fail("an mbarrier used before mbarrier.init, or overwritten since");
    return decode_barrier(bits);
}

void write_barrier(uint64_t* barrier, const BarrierState& s) {
    if (s.transactions <= -kTransactionLimit || s.transactions >= kTransactionLimit)
        fail("an mbarrier's transaction count out of range");
    const uint64_t bits = uint64_t(s.expected) | uint64_t(s.pending) << kPendingShift |
                          (uint64_t(uint32_t(s.transactions)) & kTransactionMask)
                              << kTransactionShift |
                          uint64_t(s.phase) << kPhaseShift | kBarrierTag << kTagShift;
    std::memcpy(barrier, &bits, sizeof bits);
}

// The phase completes once its arrivals and its bytes have all come; the next begins.
void complete_phase_if_done(BarrierState& s) {
    if (s.pending == 0 && s.transactions == 0) {
        s.phase ^= 1u;
        s.pending = s.expected;
    }
}

// The barrier at `barrier` of the calling block, checked: 8-byte aligned, in shared memory.
uint64_t* checked_barrier(uint64_t* barrier) {
    if (reinterpret_cast<uintptr_t>(barrier) % sizeof(uint64_t))
        fail("an mbarrier not 8-byte aligned");
    window_address(current_block(), barrier);  // fails outside shared memory
    return barrier;
}

void arrive_on(uint64_t* barrier, int expected_bytes) {
    BarrierState s = read_barrier(barrier);
    if (s.pending == 0) fail("an arrival beyond the mbarrier's count");
    s.transactions += expected_bytes;
    --s.pending;
    complete_phase_if_done(s);
    write_barrier(barrier, s);
}

void complete_transactions(uint64_t* barrier, int bytes) {
    BarrierState s = read_barrier(barrier);
    s.transactions -= bytes;
    complete_phase_if_done(s);
    write_barrier(barrier, s);
}

// ---- Tensor maps: the fields of the emulated CUtensorMap's opaque words.
constexpr cuuint64_t kMapTag = 0x50414d524f534e45;  // tells a map made by the encoder
enum MapWord {
    kWordTag,
    kWordAddress,
    kWordElementBytes,
    kWordColumns,
    kWordRows,
    kWordRowStride,
    kWordBoxColumns,
    kWordBoxRows
};
constexpr cuuint64_t kMaxBoxExtent = 256;
constexpr cuuint64_t kGlobalAlignment = 16;
constexpr cuuint64_t kMaxStride = cuuint64_t(1) << 40;
constexpr cuuint64_t kMaxExtent = cuuint64_t(1) << 32;

struct TensorMap {
    const char* address;
    size_t element_bytes;
    cuuint64_t columns, rows, row_stride;
    int box_columns, box_rows;
};

TensorMap read_map(const CUtensorMap* map) {
    if (map == nullptr || map->opaque[kWordTag] != kMapTag)
        fail("a tensor copy through a map that encode_tensor_map_tiled did not make");
    const cuuint64_t* w = map->opaque;
    return {reinterpret_cast<const char*>(w[kWordAddress]),
            size_t(w[kWordElementBytes]),
            w[kWordColumns],
            w[kWordRows],
            w[kWordRowStride],
            int(w[kWordBoxColumns]),
            int(w[kWordBoxRows])};
}

// ---- Warpgroup MMAs

const char* warpgroup_op_name(WarpgroupOp op) {
    switch (op) {
        case WarpgroupOp::kFence:
            return "wgmma.fence";
        case WarpgroupOp::kMma:
            return "wgmma.mma_async";
        case WarpgroupOp::kCommit:
            return "wgmma.commit_group";
        case WarpgroupOp::kWait:
            return "wgmma.wait_group";
    }
    return "?";
}

// One lane's part in a warpgroup instruction: `deposit(group, lane)` gives its operands; the
// last of the 128 lanes to arrive runs `complete(group)`; the others wait for it.
template <typename Deposit, typename Complete>
void warpgroup_collective(WarpgroupOp op, Deposit deposit, Complete complete) {
    const int lane = collective_lane(warpgroup_op_name(op), "warpgroup", kWarpgroupLanes);
    Warpgroup& g =
        current_block().warpgroups[size_t(current_fiber().linear_index / kWarpgroupLanes)];
    if (g.arrived == 0)
        g.op = op;
    else if (g.op != op)
        fail(std::string(warpgroup_op_name(op)) + " while other lanes of the warpgroup wait at " +
             warpgroup_op_name(g.op));
    deposit(g, lane);
    const uint64_t generation = g.generation;
    if (++g.arrived == kWarpgroupLanes) {
        complete(g);
        g.arrived = 0;
        ++g.generation;
        return;
    }
    wait_until("a warpgroup instruction", [&g, generation] { return g.generation != generation; });
}

// An operand of wgmma: K-major, 16-bit elements, in the 128-byte swizzle (the one form
// emulated), read through its descriptor.
struct Operand {
    uint32_t start = 0, stride = 0;
};

constexpr uint64_t kAddressField = 0x3fff;  // 14 bits, in units of 16 bytes
constexpr int kStrideShift = 32, kBaseOffsetShift = 49, kSwizzleShift = 62;
constexpr uint64_t kBaseOffsetMask = 7;
constexpr uint64_t kSwizzle128 = 1;
// Bits 14-15, 30-31, 46-48 and 52-61: reserved.
constexpr uint64_t kReservedBits = 0x3ff1'c000'c000'c000ull;
constexpr uint32_t kDescriptorUnit = 16;
constexpr int kMmaK = 16, kMmaM = 64;

Operand decode_descriptor(uint64_t descriptor) {
    if (descriptor & kReservedBits) fail("a wgmma descriptor with reserved bits set");
    if (descriptor >> kSwizzleShift != kSwizzle128)
        fail("a wgmma operand in a layout other than the 128-byte swizzle (not emulated)");
    if ((descriptor >> kBaseOffsetShift & kBaseOffsetMask) != 0)
        fail("a wgmma descriptor with a base offset (not emulated)");
    Operand o;
    o.start = uint32_t(descriptor & kAddressField) * kDescriptorUnit;
    o.stride = uint32_t(descriptor >> kStrideShift & kAddressField) * kDescriptorUnit;
    if ((o.start >> kRowShift & kRowsMask) != 0)
        fail(
            "a swizzled wgmma operand starting past the first row of its 1024-byte pattern "
            "(that needs the descriptor's base offset)");
    if (o.start % kSwizzleRowBytes + kMmaK * sizeof(uint16_t) > kSwizzleRowBytes)
        fail("a wgmma K step that crosses its 128-byte swizzled row");
    return o;
}

// Element (row, k) of the operand, widened: row r of each group of 8 is 128 bytes past the
// one before, the groups `stride` bytes apart.
float operand_element(Block& block, const Operand& o, DType type, int row, int k) {
    const uint32_t address =
        swizzled(o.start + uint32_t(row / 8) * o.stride + uint32_t(row % 8) * kSwizzleRowBytes +
                 uint32_t(k) * uint32_t(sizeof(uint16_t)));
    uint16_t bits;
    std::memcpy(&bits, window_pointer(block, address, sizeof bits), sizeof bits);
    return type == DType::F16 ? half_to_float(bits) : bf16_to_float(bits);
}

// d += A (64 x 16) · Bᵀ (B: n rows of 16), into the lanes' accumulators: lane 32 w + 4 g + t
// holds rows 16 w + g (+ 8) and columns 8 j + 2 t (+ 1) in d[4 j + 2 half + e].
void perform(Block& block, const WarpgroupMma& op) {
    const Operand a = decode_descriptor(op.a), b = decode_descriptor(op.b);
    std::vector<float> as(size_t(kMmaM) * kMmaK), bs(size_t(op.n) * kMmaK);
    for (int m = 0; m < kMmaM; ++m)
        for (int k = 0; k < kMmaK; ++k)
            as[size_t(m) * kMmaK + k] = operand_element(block, a, op.type, m, k);
    for (int n = 0; n < op.n; ++n)
        for (int k = 0; k < kMmaK; ++k)
            bs[size_t(n) * kMmaK + k] = operand_element(block, b, op.type, n, k);
    for (int m = 0; m < kMmaM; ++m)
        for (int n = 0; n < op.n; ++n) {
            const int warp = m / 16, g = m % 8, half = m % 16 / 8;
            const int j = n / 8, t = n % 8 / 2, e = n % 2;
            float& d = op.d[warp * kWarpLanes + 4 * g + t][4 * j + 2 * half + e];
            float sum = d;
            for (int k = 0; k < kMmaK; ++k)
                sum += as[size_t(m) * kMmaK + k] * bs[size_t(n) * kMmaK + k];
            d = sum;
        }
}

}  // namespace

uint32_t shared_window_address(const void* pointer) {
    return window_address(current_block(), pointer);
}

void warpgroup_fence() {
    warpgroup_collective(
        WarpgroupOp::kFence, [](Warpgroup&, int) {}, [](Warpgroup& g) { g.fenced = true; });
}

void warpgroup_mma(DType type, int n, float* accumulators, uint64_t a, uint64_t b) {
    warpgroup_collective(
        WarpgroupOp::kMma,
        [&](Warpgroup& g, int lane) {
            if (!g.fenced)
                fail(
                    "wgmma.mma_async before the warpgroup's first wgmma.fence (which the PTX "
                    "ISA requires before the first wgmma)");
            if (g.arrived == 0) {
                g.deposit.type = type;
                g.deposit.n = n;
                g.deposit.a = a;
                g.deposit.b = b;
            } else if (g.deposit.type != type || g.deposit.n != n || g.deposit.a != a ||
                       g.deposit.b != b) {
                fail("lanes of a warpgroup issue wgmma with different shapes or descriptors");
            }
            g.deposit.d[lane] = accumulators;
        },
        [](Warpgroup& g) { g.open.push_back(g.deposit); });
}

void warpgroup_commit() {
    warpgroup_collective(
        WarpgroupOp::kCommit, [](Warpgroup&, int) {},
        [](Warpgroup& g) {
            g.committed.push_back(std::move(g.open));
            g.open.clear();
        });
}

void warpgroup_wait(int pending_groups) {
    Block& block = current_block();
    warpgroup_collective(
        WarpgroupOp::kWait,
        [&](Warpgroup& g, int) {
            if (g.arrived == 0)
                g.pending_groups = pending_groups;
            else if (g.pending_groups != pending_groups)
                fail("lanes of a warpgroup wait for different numbers of wgmma groups");
        },
        [&](Warpgroup& g) {
            while (g.committed.size() > size_t(g.pending_groups)) {
                for (const WarpgroupMma& op : g.committed.front()) perform(block, op);
                g.committed.pop_front();
            }
        });
}

std::string warpgroups_in_flight(const Launch& l) {
    for (const Block& b : l.blocks)
        for (const Warpgroup& g : b.warpgroups)
            if (!g.open.empty() || !g.committed.empty())
                return "the block ended with wgmma products in flight (not waited for)";
    return "";
}

void barrier_init(uint64_t* barrier, int arrivals) {
    if (arrivals < 1 || arrivals > kMaxArrivals)
        fail("mbarrier.init with " + std::to_string(arrivals) + " arrivals");
    BarrierState s;
    s.expected = s.pending = arrivals;
    write_barrier(checked_barrier(barrier), s);
}

void barrier_arrive(uint64_t* barrier, int expected_bytes) {
    arrive_on(checked_barrier(barrier), expected_bytes);
}

void barrier_arrive_in_block(uint64_t* barrier, uint32_t rank) {
    Launch& l = launch();
    const uint32_t address = window_address(current_block(), checked_barrier(barrier));
    if (rank >= l.blocks.size())
        fail("an mbarrier arrival in block " + std::to_string(rank) + " of a cluster of " +
             std::to_string(l.blocks.size()));
    arrive_on(
        reinterpret_cast<uint64_t*>(window_pointer(l.blocks[rank], address, sizeof(uint64_t))), 0);
}

void barrier_wait(uint64_t* barrier, uint32_t parity) {
    read_barrier(checked_barrier(barrier));  // initialised
    // Checked by the scheduler, outside the thread: a pure read.
    wait_until("an mbarrier phase", [barrier, parity] {
        return (decode_barrier(load_bits(barrier)).phase & 1u) != (parity & 1u);
    });
}

void tensor_copy(void* destination, const CUtensorMap* map_bits, int column, int row,
                 uint64_t* barrier, uint32_t blocks) {
    Launch& l = launch();
    Block& own = current_block();
    const TensorMap map = read_map(map_bits);
    const uint32_t start = window_address(own, destination);
    const uint32_t barrier_address = window_address(own, checked_barrier(barrier));
    if (start % kSwizzlePatternBytes)
        fail("a tensor copy in the 128-byte swizzle to shared address " + std::to_string(start) +
             ", not on a 1024-byte boundary");
    const size_t row_bytes = size_t(map.box_columns) * map.element_bytes;
    const int bytes = int(row_bytes) * map.box_rows;
    if (blocks >> l.blocks.size())
        fail("a multicast tensor copy to a block outside the cluster of " +
             std::to_string(l.blocks.size()));
    const auto copy_into = [&](Block& target) {
        for (int r = 0; r < map.box_rows; ++r)
            for (int c = 0; c < map.box_columns; ++c) {
                const int64_t global_row = int64_t(row) + r, global_column = int64_t(column) + c;
                const uint32_t address = swizzled(
                    start + uint32_t(size_t(r) * row_bytes + size_t(c) * map.element_bytes));
                char* to = window_pointer(target, address, map.element_bytes);
                if (global_row < 0 || global_column < 0 || uint64_t(global_row) >= map.rows ||
                    uint64_t(global_column) >= map.columns)
                    std::memset(to, 0, map.element_bytes);
                else
                    std::memcpy(to,
                                map.address + uint64_t(global_row) * map.row_stride +
                                    uint64_t(global_column) * map.element_bytes,
                                map.element_bytes);
            }
        complete_transactions(
            reinterpret_cast<uint64_t*>(window_pointer(target, barrier_address, sizeof(uint64_t))),
            bytes);
    };
    if (blocks == 0) {
        copy_into(own);
        return;
    }
    for (size_t rank = 0; rank < l.blocks.size(); ++rank)
        if (blocks >> rank & 1u) copy_into(l.blocks[rank]);
}

uint32_t cluster_rank() { return uint32_t(current_fiber().block); }

void cluster_arrive() {
    Launch& l = launch();
    Fiber& f = current_fiber();
    if (f.cluster_arrived) fail("a second arrival at the cluster barrier before waiting");
    f.cluster_arrived = true;
    f.cluster_phase = l.cluster_phase;
    ++l.cluster_arrivals;
    complete_cluster_phase_if_all_arrived(l);
}

void cluster_wait() {
    Launch& l = launch();
    Fiber& f = current_fiber();
    if (!f.cluster_arrived) fail("a wait at the cluster barrier without an arrival");
    const uint64_t phase = f.cluster_phase;
    wait_until("the cluster barrier", [&l, phase] { return l.cluster_phase != phase; });
    f.cluster_arrived = false;
}

CUresult encode_tensor_map_tiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank,
                                 void* address, const cuuint64_t* extents,
                                 const cuuint64_t* strides, const cuuint32_t* box,
                                 const cuuint32_t* element_strides,
                                 CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                 CUtensorMapL2promotion promotion, CUtensorMapFloatOOBfill fill) {
    constexpr size_t kElementBytes = sizeof(uint16_t);
    const bool valid =
        map != nullptr &&
        (type == CU_TENSOR_MAP_DATA_TYPE_FLOAT16 || type == CU_TENSOR_MAP_DATA_TYPE_BFLOAT16) &&
        rank == 2 && address != nullptr &&
        reinterpret_cast<uintptr_t>(address) % kGlobalAlignment == 0 && extents != nullptr &&
        extents[0] > 0 && extents[0] <= kMaxExtent && extents[1] > 0 && extents[1] <= kMaxExtent &&
        strides != nullptr && strides[0] % kGlobalAlignment == 0 && strides[0] < kMaxStride &&
        strides[0] >= extents[0] * kElementBytes && box != nullptr && box[0] > 0 &&
        box[0] <= kMaxBoxExtent && box[1] > 0 && box[1] <= kMaxBoxExtent &&
        box[0] * kElementBytes == kSwizzleRowBytes && element_strides != nullptr &&
        element_strides[0] == 1 && element_strides[1] == 1 &&
        interleave == CU_TENSOR_MAP_INTERLEAVE_NONE && swizzle == CU_TENSOR_MAP_SWIZZLE_128B &&
        promotion <= CU_TENSOR_MAP_L2_PROMOTION_L2_256B &&
        fill == CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE;
    if (!valid) return CUDA_ERROR_INVALID_VALUE;
    *map = CUtensorMap{};
    cuuint64_t* w = map->opaque;
    w[kWordTag] = kMapTag;
    w[kWordAddress] = reinterpret_cast<uintptr_t>(address);
    w[kWordElementBytes] = kElementBytes;
    w[kWordColumns] = extents[0];
    w[kWordRows] = extents[1];
    w[kWordRowStride] = strides[0];
    w[kWordBoxColumns] = box[0];
    w[kWordBoxRows] = box[1];
    return CUDA_SUCCESS;
}

}  // namespace barellm::cuda::emulation
