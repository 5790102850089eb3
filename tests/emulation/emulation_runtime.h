// The emulation's runtime state, shared by its two halves: cuda_emulation.cpp (the scheduler,
// block barriers, warp instructions, cp.async) and hopper_emulation.cpp (the sm_90
// instructions of kernels/wgmma.cuh: warpgroup MMAs, mbarriers, tensor copies, clusters).
// Internal to tests/emulation: kernels and tests include cuda_emulation.h.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "cuda_emulation.h"

namespace barellm::cuda::emulation {

constexpr int kWarpgroupLanes = 128;  // 4 warps

// Thrown through a fiber's kernel frames to end it once the launch has failed.
struct KernelAbort {};

enum class FiberState { kReady, kAtBarrier, kAtWarpOp, kWaiting, kExited };

enum class WarpOp { kSyncwarp, kShuffle, kLdmatrix, kLdmatrixTrans, kMmaF16, kMmaBf16 };

// What one lane brings to a warp instruction and what it gets back.
struct LaneOperands {
    uint64_t value = 0;  // shuffle: the value; ldmatrix: the row address
    int source_lane = 0;
    int matrices = 0;
    float c[4] = {};
    uint32_t a[4] = {};
    uint32_t b[2] = {};
};

struct LaneResult {
    uint64_t value = 0;
    uint32_t registers[4] = {};
    float c[4] = {};
};

struct PendingCopy {
    void* shared;
    const void* global;
    bool valid;
};

struct Fiber {
    void* stack_pointer = nullptr;  // saved by switch_stacks while it does not run
    char* stack = nullptr;
    uint3 thread_index = {0, 0, 0};
    int linear_index = 0;  // within its block
    int block = 0;         // its block's rank in the cluster (Launch::blocks)
    FiberState state = FiberState::kReady;
    // kWaiting: what the thread waits for (wait_until), checked by the scheduler.
    std::function<bool()> ready_when;
    const char* waiting_for = "";
    std::vector<PendingCopy> copies;  // issued, not yet performed, oldest first
    std::vector<size_t> group_ends;   // committed groups: copies [previous end, end)
    // The cluster barrier: whether the thread has arrived and not yet waited, and the
    // barrier's phase it arrived in.
    bool cluster_arrived = false;
    uint64_t cluster_phase = 0;
    void* fake_stack = nullptr;  // AddressSanitizer's, across fiber switches
};

struct Warp {
    int arrived = 0;
    int exited = 0;  // lanes that have returned
    WarpOp op = WarpOp::kSyncwarp;
    LaneOperands operands[kWarpLanes];
    LaneResult results[kWarpLanes];
};

// One asynchronous warpgroup MMA (hopper_emulation.cpp): its operands' descriptors, and where
// each of the 128 lanes holds its accumulators.
struct WarpgroupMma {
    DType type = DType::F16;
    int n = 0;
    uint64_t a = 0, b = 0;
    float* d[kWarpgroupLanes] = {};
};

enum class WarpgroupOp { kFence, kMma, kCommit, kWait };

// A warpgroup's collective instructions (the last of its 128 lanes to arrive performs one)
// and its MMAs in flight: those issued since the last commit, then the committed groups,
// oldest first.
struct Warpgroup {
    int arrived = 0;
    uint64_t generation = 0;  // instructions completed
    WarpgroupOp op = WarpgroupOp::kMma;
    WarpgroupMma deposit;  // the instruction being gathered
    int pending_groups = 0;
    bool fenced = false;  // a wgmma.fence has completed (one must precede the first wgmma)
    std::vector<WarpgroupMma> open;
    std::deque<std::vector<WarpgroupMma>> committed;
};

// A block of the cluster that runs at once.
struct Block {
    uint3 index = {0, 0, 0};
    std::vector<float4> dynamic_storage;
    char* dynamic_shared = nullptr;
    int live = 0;        // threads that have not returned
    int at_barrier = 0;  // of them, waiting at __syncthreads
    bool reverse = false;
    std::vector<Warp> warps;
    std::vector<Warpgroup> warpgroups;
};

struct Launch {
    int threads = 0;  // per block
    const std::function<void()>* body = nullptr;
    size_t dynamic_shared_bytes = 0;
    std::vector<Block> blocks;                // the running cluster's, by rank
    std::vector<Fiber> fibers;                // block after block
    void* scheduler_stack_pointer = nullptr;  // likewise, the scheduler's
    Fiber* current = nullptr;
    int cluster_live = 0;  // threads of the cluster that have not returned
    // The cluster barrier: arrivals in the current phase.
    int cluster_arrivals = 0;
    uint64_t cluster_phase = 0;
    bool aborting = false;
    std::string fault;
    void* scheduler_fake_stack = nullptr;  // AddressSanitizer's
    const void* scheduler_stack_bottom = nullptr;
    size_t scheduler_stack_size = 0;
};

Launch& launch();
Fiber& current_fiber();
Block& current_block();

// The threads of the cluster's block of rank `block` (Launch::fibers holds them block after
// block).
inline Fiber* block_fibers(Launch& l, size_t block) { return &l.fibers[block * size_t(l.threads)]; }

// Ends the calling thread's kernel: the launch fails with `message` (where it happened added).
[[noreturn]] void fail(const std::string& message);

// The calling thread's lane in its group of `lanes` consecutive threads (a warp, a warpgroup)
// about to run collective `instruction`; fails unless every thread of the group exists and has
// not returned.
int collective_lane(const char* instruction, const char* group, int lanes);

// Returns once ready() holds, letting the other threads run meanwhile (the scheduler checks
// it); `what` names the wait in a deadlock's report.
void wait_until(const char* what, std::function<bool()> ready);

// The shared window: shared_address maps block `block`'s dynamic shared memory to addresses
// from kSharedWindowStart on, which window_pointer maps back (failing outside it).
constexpr uint32_t kSharedWindowStart = 48;  // not on a 1024-byte boundary, as on a GPU
uint32_t window_address(const Block& block, const void* pointer);
char* window_pointer(Block& block, uint32_t address, size_t bytes);

// The cluster barrier's phase completes once every thread of the cluster still running has
// arrived.
void complete_cluster_phase_if_all_arrived(Launch& l);

// At a cluster's end (hopper_emulation.cpp): what is wrong if a warpgroup still has MMAs in
// flight, or nothing.
std::string warpgroups_in_flight(const Launch& l);

}  // namespace barellm::cuda::emulation
