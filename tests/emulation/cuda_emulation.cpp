// The runtime of the CUDA emulation (cuda_emulation.h): a scheduler of fibers (user-level
// threads, each on a stack of its own, switched by switch_stacks below) that
// runs the threads of a cluster's blocks, the block barrier, the warp exchanges behind
// shuffles, ldmatrix and mma, and the per-thread queues of cp.async. The sm_90 instructions
// are in hopper_emulation.cpp.

#include <elf.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "emulation_runtime.h"
#include "util/error.h"

#if defined(__SANITIZE_ADDRESS__)
#define BARELLM_EMULATION_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BARELLM_EMULATION_ASAN 1
#endif
#endif
#ifdef BARELLM_EMULATION_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

// The bounds of the program's static data (.data and .bss), where __shared__ arrays lie: set
// by the linker (and __data_start's address gives the program's load address).
extern "C" {
extern char __data_start[];
extern char _end[];
}

#ifndef __x86_64__
#error "the CUDA emulation switches fibers with x86-64 instructions"
#endif

// switch_stacks(save, load): saves the calling fiber's callee-saved registers (the System V
// x86-64 ABI's rbx, rbp, r12-r15, and the SSE and x87 control words) on its stack and its
// stack pointer in *save, then continues the fiber whose stack pointer is `load` where it
// called switch_stacks (or, for a fresh stack, in fiber_entry). Unlike swapcontext it leaves
// the signal mask alone: no system call per switch, which made the emulation several times
// slower.
extern "C" void barellm_emulation_switch_stacks(void** save, void* load);
asm(R"(
    .text
    .p2align 4
    .globl barellm_emulation_switch_stacks
    .type barellm_emulation_switch_stacks, @function
barellm_emulation_switch_stacks:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size barellm_emulation_switch_stacks, .-barellm_emulation_switch_stacks
    .section .note.GNU-stack,"",@progbits
    .text
)");

namespace barellm::cuda::emulation {
namespace {

constexpr size_t kFiberStackBytes = 256 * 1024;
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxBlockZ = 64;
constexpr unsigned kMaxGridYZ = 65535;
constexpr unsigned kMaxClusterBlocks = 8;  // the portable cluster size
// The most dynamic shared memory one block can have on any GPU the build targets (sm_90).
constexpr size_t kMaxDynamicSharedBytes = 227 * 1024;
constexpr unsigned char kPoisonByte = 0xff;
constexpr size_t kSharedAlignment = 16;
constexpr size_t kCopyBytes = 16;
constexpr size_t kMatrixRowBytes = 16;
constexpr int kMatrixRows = 8;
constexpr int kLanesPerRow = 4;  // an 8x8 matrix row of 16-bit elements is 4 registers' worth
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kMmaK = 16;

const char* warp_op_name(WarpOp op) {
    switch (op) {
        case WarpOp::kSyncwarp:
            return "__syncwarp";
        case WarpOp::kShuffle:
            return "a shuffle";
        case WarpOp::kLdmatrix:
            return "ldmatrix";
        case WarpOp::kLdmatrixTrans:
            return "ldmatrix .trans";
        case WarpOp::kMmaF16:
            return "mma f16";
        case WarpOp::kMmaBf16:
            return "mma bf16";
    }
    return "?";
}

thread_local Launch* active_launch = nullptr;
// The EarlyLaunchCheck alive, if any.
thread_local EarlyLaunchCheck* early_launch_check = nullptr;

std::string describe(const uint3& v) {
    return "(" + std::to_string(v.x) + ", " + std::to_string(v.y) + ", " + std::to_string(v.z) +
           ")";
}

// Records the launch's first fault; the launch then ends every thread and throws.
void record_fault(Launch& l, const std::string& message) {
    if (l.fault.empty()) {
        l.fault = "CUDA emulation: block " + describe(blockIdx);
        if (l.current) l.fault += " thread " + describe(l.current->thread_index);
        l.fault += ": " + message;
    }
    l.aborting = true;
}

Warp& warp_of(Launch& l, const Fiber& f) {
    return l.blocks[size_t(f.block)].warps[size_t(f.linear_index / kWarpLanes)];
}

// From the running fiber back to the scheduler; returns when the scheduler resumes it.
void yield_to_scheduler(Launch& l, Fiber& f) {
#ifdef BARELLM_EMULATION_ASAN
    __sanitizer_start_switch_fiber(&f.fake_stack, l.scheduler_stack_bottom, l.scheduler_stack_size);
#endif
    barellm_emulation_switch_stacks(&f.stack_pointer, l.scheduler_stack_pointer);
#ifdef BARELLM_EMULATION_ASAN
    __sanitizer_finish_switch_fiber(f.fake_stack, &l.scheduler_stack_bottom,
                                    &l.scheduler_stack_size);
#endif
    if (l.aborting) throw KernelAbort{};
}

void release_barrier(Launch& l, Block& b) {
    Fiber* fibers = block_fibers(l, size_t(&b - l.blocks.data()));
    for (int i = 0; i < l.threads; ++i)
        if (fibers[i].state == FiberState::kAtBarrier) fibers[i].state = FiberState::kReady;
    b.at_barrier = 0;
    b.reverse = !b.reverse;
}

void thread_returned(Launch& l, Fiber& f) {
    f.state = FiberState::kExited;
    f.copies.clear();
    f.group_ends.clear();
    Block& b = l.blocks[size_t(f.block)];
    ++warp_of(l, f).exited;
    --b.live;
    --l.cluster_live;
    // A returned thread no longer counts at the cluster barrier, nor does its arrival.
    if (f.cluster_arrived && f.cluster_phase == l.cluster_phase) --l.cluster_arrivals;
    f.cluster_arrived = false;
    if (l.aborting) return;
    const Warp& w = warp_of(l, f);
    if (w.arrived > 0)
        record_fault(l, "returned while " + std::to_string(w.arrived) +
                            " lanes of its warp wait at " + warp_op_name(w.op) +
                            " (which needs all 32 lanes)");
    else if (b.at_barrier > 0 && b.at_barrier == b.live)
        release_barrier(l, b);
    complete_cluster_phase_if_all_arrived(l);
}

void fiber_main() {
    Launch& l = *active_launch;
    Fiber& f = *l.current;
#ifdef BARELLM_EMULATION_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &l.scheduler_stack_bottom, &l.scheduler_stack_size);
#endif
    if (!l.aborting) {
        try {
            (*l.body)();
        } catch (const KernelAbort&) {
        } catch (const std::exception& e) {
            record_fault(l, std::string("exception: ") + e.what());
        } catch (...) {
            record_fault(l, "unknown exception");
        }
    }
    thread_returned(l, f);
}

// Where a fresh fiber starts (make_fiber_stack): runs fiber_main, then gives the scheduler
// back its stack for good.
[[noreturn]] void fiber_entry() {
    fiber_main();
    Launch& l = *active_launch;
#ifdef BARELLM_EMULATION_ASAN
    __sanitizer_start_switch_fiber(nullptr, l.scheduler_stack_bottom, l.scheduler_stack_size);
#endif
    void* finished = nullptr;
    barellm_emulation_switch_stacks(&finished, l.scheduler_stack_pointer);
    __builtin_unreachable();  // nothing resumes a fiber that has returned
}

void resume(Launch& l, Fiber& f) {
    l.current = &f;
    threadIdx = f.thread_index;
    blockIdx = l.blocks[size_t(f.block)].index;
#ifdef BARELLM_EMULATION_ASAN
    __sanitizer_start_switch_fiber(&l.scheduler_fake_stack, f.stack, kFiberStackBytes);
#endif
    barellm_emulation_switch_stacks(&l.scheduler_stack_pointer, f.stack_pointer);
#ifdef BARELLM_EMULATION_ASAN
    __sanitizer_finish_switch_fiber(l.scheduler_fake_stack, nullptr, nullptr);
#endif
    l.current = nullptr;
}

std::string describe_waits(const Launch& l) {
    std::string text;
    for (size_t i = 0; i < l.blocks.size(); ++i) {
        const Block& b = l.blocks[i];
        if (l.blocks.size() > 1) text += "block " + describe(b.index) + ": ";
        text += std::to_string(b.at_barrier) + " threads wait at __syncthreads";
        for (size_t w = 0; w < b.warps.size(); ++w)
            if (b.warps[w].arrived > 0)
                text += ", " + std::to_string(b.warps[w].arrived) + " lanes of warp " +
                        std::to_string(w) + " at " + warp_op_name(b.warps[w].op);
        text += ", " + std::to_string(l.threads - b.live) + " threads returned";
        if (i + 1 < l.blocks.size()) text += "; ";
    }
    // The other waits, by what they wait for.
    std::vector<std::pair<std::string, int>> waits;
    for (const Fiber& f : l.fibers) {
        if (f.state != FiberState::kWaiting) continue;
        auto it = std::find_if(waits.begin(), waits.end(),
                               [&](const auto& w) { return w.first == f.waiting_for; });
        if (it == waits.end())
            waits.emplace_back(f.waiting_for, 1);
        else
            ++it->second;
    }
    for (const auto& [what, count] : waits)
        text += "; " + std::to_string(count) + " threads wait for " + what;
    return text;
}

// The mangled form of the ABI tag __shared__ puts on every static shared array's name.
constexpr char kSharedTag[] = "B14barellm_shared";

struct SharedArray {
    char* begin;
    size_t bytes;
};

// The program's static __shared__ arrays, or (found false) none known: its symbol table could
// not be read (a stripped binary).
struct StaticSharedArrays {
    bool found = false;
    std::vector<SharedArray> arrays;
};

// count items of T from `offset` of the file into out; false if it cannot.
template <typename T>
bool read_at(std::FILE* file, uint64_t offset, size_t count, std::vector<T>& out) {
    out.resize(count);
    return std::fseek(file, long(offset), SEEK_SET) == 0 &&
           std::fread(out.data(), sizeof(T), count, file) == count;
}

// The objects of the program's ELF symbol table whose names carry kSharedTag, at their
// run-time addresses (the symbol's value plus the load address, known from __data_start).
StaticSharedArrays find_static_shared_arrays() {
    StaticSharedArrays result;
    const std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen("/proc/self/exe", "rb"),
                                                               std::fclose);
    std::vector<Elf64_Ehdr> header;
    if (!file || !read_at(file.get(), 0, 1, header) ||
        std::memcmp(header[0].e_ident, ELFMAG, SELFMAG) != 0 ||
        header[0].e_ident[EI_CLASS] != ELFCLASS64 || header[0].e_shentsize != sizeof(Elf64_Shdr))
        return result;
    std::vector<Elf64_Shdr> sections;
    if (!read_at(file.get(), header[0].e_shoff, header[0].e_shnum, sections)) return result;
    for (const Elf64_Shdr& section : sections) {
        if (section.sh_type != SHT_SYMTAB || section.sh_link >= sections.size()) continue;
        const Elf64_Shdr& strings = sections[section.sh_link];
        std::vector<Elf64_Sym> symbols;
        std::vector<char> names;
        if (!read_at(file.get(), section.sh_offset, section.sh_size / sizeof(Elf64_Sym), symbols) ||
            !read_at(file.get(), strings.sh_offset, strings.sh_size, names))
            return result;
        names.push_back('\0');
        const auto name = [&](const Elf64_Sym& symbol) {
            return symbol.st_name < names.size() ? &names[symbol.st_name] : "";
        };
        const auto data_start =
            std::find_if(symbols.begin(), symbols.end(), [&](const Elf64_Sym& symbol) {
                return std::strcmp(name(symbol), "__data_start") == 0;
            });
        if (data_start == symbols.end()) return result;
        const uintptr_t load_address =
            reinterpret_cast<uintptr_t>(__data_start) - data_start->st_value;
        for (const Elf64_Sym& symbol : symbols)
            if (ELF64_ST_TYPE(symbol.st_info) == STT_OBJECT && symbol.st_size > 0 &&
                std::strstr(name(symbol), kSharedTag))
                result.arrays.push_back(
                    {reinterpret_cast<char*>(load_address + symbol.st_value), symbol.st_size});
        result.found = true;
        return result;
    }
    return result;
}

const StaticSharedArrays& static_shared_arrays() {
    static const StaticSharedArrays arrays = find_static_shared_arrays();
    return arrays;
}

void poison_shared_memory(Launch& l) {
    for (const SharedArray& array : static_shared_arrays().arrays)
        std::memset(array.begin, kPoisonByte, array.bytes);
    if (l.dynamic_shared_bytes)
        for (Block& b : l.blocks)
            std::memset(b.dynamic_shared, kPoisonByte, l.dynamic_shared_bytes);
}

// f's stack as switch_stacks leaves a fiber's, so that switching to it starts fiber_entry:
// from the top down, a return address slot (fiber_entry never returns; the slot leaves the
// stack pointer 8 bytes off a 16-byte boundary at its entry, as a call would), fiber_entry's
// address, six zeroed registers and the control words' defaults (every SSE exception
// masked, round to nearest; x87 likewise, double extended precision).
void make_fiber_stack(Fiber& f) {
    constexpr uint32_t kDefaultMxcsr = 0x1f80;
    constexpr uint16_t kDefaultFpuControl = 0x037f;
    constexpr int kSavedRegisters = 6;
    constexpr size_t kStackAlignment = 16;
#ifdef BARELLM_EMULATION_ASAN
    // The stack's earlier fiber (of the cluster before) left its frames' redzones poisoned.
    ASAN_UNPOISON_MEMORY_REGION(f.stack, kFiberStackBytes);
#endif
    auto top = reinterpret_cast<uintptr_t>(f.stack + kFiberStackBytes) & ~(kStackAlignment - 1);
    auto* slot = reinterpret_cast<uint64_t*>(top);
    *--slot = 0;  // fiber_entry's return address: never used
    *--slot = reinterpret_cast<uint64_t>(&fiber_entry);
    for (int i = 0; i < kSavedRegisters; ++i) *--slot = 0;
    *--slot = uint64_t(kDefaultMxcsr) | uint64_t(kDefaultFpuControl) << 32;
    f.stack_pointer = slot;
}

void start_fibers(Launch& l) {
    for (Fiber& f : l.fibers) {
        f.state = FiberState::kReady;
        f.cluster_arrived = false;
        make_fiber_stack(f);
    }
    for (Block& b : l.blocks) {
        for (Warp& w : b.warps) w.arrived = w.exited = 0;
        for (Warpgroup& g : b.warpgroups) g = Warpgroup{};
        b.live = l.threads;
        b.at_barrier = 0;
        b.reverse = false;
    }
    l.cluster_live = l.threads * int(l.blocks.size());
    l.cluster_arrivals = 0;
}

// Whether the scheduler may run f now: it is ready, or what it waits for has come.
bool runnable(Fiber& f) {
    if (f.state == FiberState::kWaiting && f.ready_when()) f.state = FiberState::kReady;
    return f.state == FiberState::kReady;
}

// Runs the current cluster's blocks to their end (every thread returned) or to a fault: in
// passes over the blocks, each block's threads in increasing or decreasing order.
void run_cluster(Launch& l) {
    poison_shared_memory(l);
    if (early_launch_check) {
        if (l.blocks.size() != 1)
            throw Error("CUDA emulation: an EarlyLaunchCheck takes clusters of one block");
        early_launch_check->hold_back();
    }
    start_fibers(l);
    while (l.cluster_live > 0 && !l.aborting) {
        bool ran = false;
        for (size_t i = 0; i < l.blocks.size() && !l.aborting; ++i) {
            Fiber* fibers = block_fibers(l, i);
            // A barrier released during the pass flips the next one.
            const bool reverse = l.blocks[i].reverse;
            for (int k = 0; k < l.threads && !l.aborting; ++k) {
                Fiber& f = fibers[reverse ? l.threads - 1 - k : k];
                if (!runnable(f)) continue;
                resume(l, f);
                ran = true;
            }
        }
        if (!ran && l.cluster_live > 0 && !l.aborting)
            record_fault(l, "deadlock: " + describe_waits(l));
    }
    if (early_launch_check) early_launch_check->give_back();  // no thread reached the wait
    if (!l.aborting) {
        const std::string busy = warpgroups_in_flight(l);
        if (!busy.empty()) record_fault(l, busy);
    }
    if (!l.aborting) return;
    // End every thread still waiting: its wait throws KernelAbort, unwinding its frames.
    for (Fiber& f : l.fibers)
        if (f.state != FiberState::kExited) resume(l, f);
}

// The fiber stacks, one after another, each above a guard page (an overflow faults instead of
// corrupting its neighbour). A host thread keeps its stacks from launch to launch, growing them
// when a launch has more threads: a decode step is hundreds of launches, and mapping, guarding
// and faulting in fresh stacks for each took a third of the emulation's time.
class StackPool {
public:
    StackPool() {
        const long page = sysconf(_SC_PAGESIZE);
        guard_bytes_ = size_t(page > 0 ? page : 4096);
    }
    StackPool(const StackPool&) = delete;
    StackPool& operator=(const StackPool&) = delete;
    ~StackPool() { release(); }

    // Gives each of the fibers its stack (as the last launch left it: every fiber starts
    // from make_fiber_stack).
    void assign(std::vector<Fiber>& fibers) {
        if (fibers.size() > count_) {
            release();
            void* mapping = mmap(nullptr, per_fiber() * fibers.size(), PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (mapping == MAP_FAILED) throw Error("CUDA emulation: cannot map the fiber stacks");
            base_ = static_cast<char*>(mapping);
            count_ = fibers.size();
            for (size_t i = 0; i < count_; ++i)
                mprotect(base_ + per_fiber() * i, guard_bytes_, PROT_NONE);
        }
        for (size_t i = 0; i < fibers.size(); ++i)
            fibers[i].stack = base_ + per_fiber() * i + guard_bytes_;
    }

private:
    size_t per_fiber() const { return kFiberStackBytes + guard_bytes_; }
    void release() {
        if (!base_) return;
#ifdef BARELLM_EMULATION_ASAN
        for (size_t i = 0; i < count_; ++i)
            ASAN_UNPOISON_MEMORY_REGION(base_ + per_fiber() * i + guard_bytes_, kFiberStackBytes);
#endif
        munmap(base_, per_fiber() * count_);
        base_ = nullptr;
        count_ = 0;
    }

    char* base_ = nullptr;
    size_t count_ = 0;
    size_t guard_bytes_ = 0;
};

thread_local StackPool stack_pool;

void check_shape(dim3 grid, dim3 cluster, dim3 block, size_t dynamic_shared_bytes) {
    const auto bad = [](const std::string& what) {
        throw Error("CUDA emulation: invalid launch: " + what);
    };
    if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z) bad("a zero dimension");
    if (grid.y > kMaxGridYZ || grid.z > kMaxGridYZ) bad("grid y or z above 65535");
    if (block.z > kMaxBlockZ) bad("block z above 64");
    if (uint64_t(block.x) * block.y * block.z > kMaxThreadsPerBlock)
        bad("more than 1024 threads per block");
    if (dynamic_shared_bytes > kMaxDynamicSharedBytes)
        bad(std::to_string(dynamic_shared_bytes) + " bytes of dynamic shared memory");
    if (!cluster.x || !cluster.y || !cluster.z) bad("a zero cluster dimension");
    if (uint64_t(cluster.x) * cluster.y * cluster.z > kMaxClusterBlocks)
        bad("more than 8 blocks per cluster");
    if (grid.x % cluster.x || grid.y % cluster.y || grid.z % cluster.z)
        bad("a grid that is not made of whole clusters");
}

// ldmatrix for every lane at once, from the row addresses lanes 0 .. 8 matrices - 1 gave.
void complete_load_matrices(Warp& w, bool transposed) {
    const int matrices = w.operands[0].matrices;
    for (int lane = 1; lane < kWarpLanes; ++lane)
        if (w.operands[lane].matrices != matrices)
            fail("ldmatrix: lanes load different numbers of matrices");
    const unsigned char* rows[kWarpLanes] = {};
    for (int lane = 0; lane < matrices * kMatrixRows; ++lane) {
        const void* row = reinterpret_cast<const void*>(w.operands[lane].value);
        if (reinterpret_cast<uintptr_t>(row) % kMatrixRowBytes)
            fail("ldmatrix: lane " + std::to_string(lane) +
                 "'s row address is not 16-byte aligned");
        if (!is_shared(row, kMatrixRowBytes))
            fail("ldmatrix: lane " + std::to_string(lane) + "'s row is not in shared memory");
        rows[lane] = static_cast<const unsigned char*>(row);
    }
    const auto element = [&](int matrix, int row, int column) {
        uint16_t value;
        std::memcpy(&value, rows[matrix * kMatrixRows + row] + column * sizeof value, sizeof value);
        return uint32_t(value);
    };
    for (int lane = 0; lane < kWarpLanes; ++lane) {
        const int group = lane / kLanesPerRow, pair = 2 * (lane % kLanesPerRow);
        for (int j = 0; j < matrices; ++j) {
            // Lane l holds row l / 4, elements 2 (l % 4), 2 (l % 4) + 1; transposed, column
            // l / 4, rows 2 (l % 4), 2 (l % 4) + 1 (the lower-indexed one in the low half).
            const uint32_t low = transposed ? element(j, pair, group) : element(j, group, pair);
            const uint32_t high =
                transposed ? element(j, pair + 1, group) : element(j, group, pair + 1);
            w.results[lane].registers[j] = low | high << 16;
        }
    }
}

template <DType kType>
float widen(uint32_t bits16) {
    return kType == DType::F16 ? half_to_float(uint16_t(bits16)) : bf16_to_float(uint16_t(bits16));
}

// The element (row, column) of the tile whose fragment registers are `registers` of each lane,
// lane 4 (row % 8) + (column % 8) / 2, register register_index (which the caller derives from
// row and column), as mma lays them.
template <DType kType, typename Register>
float fragment_element(const Warp& w, Register registers, int row, int column, int register_index) {
    const int lane = kLanesPerRow * (row % kMatrixRows) + (column % kMatrixRows) / 2;
    const uint32_t word = registers(w.operands[lane])[register_index];
    return widen<kType>(column % 2 ? word >> 16 : word & 0xffffu);
}

template <DType kType>
void complete_mma(Warp& w) {
    // A[m][k]: lane 4 (m % 8) + (k % 8) / 2, register (m >= 8) + 2 (k >= 8).
    const auto a = [&](int m, int k) {
        return fragment_element<kType>(
            w, [](const LaneOperands& o) { return o.a; }, m, k,
            (m >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0));
    };
    // B[k][n]: lane 4 n + (k % 8) / 2, register k / 8 (as the element (n, k) of B's N x K rows).
    const auto b = [&](int k, int n) {
        return fragment_element<kType>(
            w, [](const LaneOperands& o) { return o.b; }, n, k, k / 8);
    };
    for (int lane = 0; lane < kWarpLanes; ++lane) {
        const int group = lane / kLanesPerRow, pair = 2 * (lane % kLanesPerRow);
        for (int i = 0; i < 4; ++i) {
            // c[0], c[1] = C[g][2t, 2t+1]; c[2], c[3] = C[g+8][2t, 2t+1].
            const int m = group + (i >= 2 ? kMatrixRows : 0), n = pair + i % 2;
            float sum = w.operands[lane].c[i];
            for (int k = 0; k < kMmaK; ++k) sum += a(m, k) * b(k, n);
            w.results[lane].c[i] = sum;
        }
    }
}

void complete(Warp& w) {
    switch (w.op) {
        case WarpOp::kSyncwarp:
            return;
        case WarpOp::kShuffle:
            for (int lane = 0; lane < kWarpLanes; ++lane)
                w.results[lane].value = w.operands[w.operands[lane].source_lane].value;
            return;
        case WarpOp::kLdmatrix:
            return complete_load_matrices(w, false);
        case WarpOp::kLdmatrixTrans:
            return complete_load_matrices(w, true);
        case WarpOp::kMmaF16:
            return complete_mma<DType::F16>(w);
        case WarpOp::kMmaBf16:
            return complete_mma<DType::BF16>(w);
    }
}

// One lane's part in a warp instruction: deposits its operands, waits for the other 31 lanes
// (the last to arrive computes every lane's result), returns this lane's result.
const LaneResult& warp_collective(WarpOp op, unsigned mask, const LaneOperands& operands) {
    Launch& l = launch();
    Fiber& f = current_fiber();
    if (mask != kFullMask)
        fail(std::string(warp_op_name(op)) + " with a mask other than 0xffffffff");
    const int lane = collective_lane(warp_op_name(op), "warp", kWarpLanes);
    const int first = f.linear_index - lane;
    Fiber* threads = block_fibers(l, size_t(f.block));
    Warp& w = warp_of(l, f);
    if (w.arrived == 0)
        w.op = op;
    else if (w.op != op)
        fail(std::string(warp_op_name(op)) + " while other lanes of the warp wait at " +
             warp_op_name(w.op));
    w.operands[lane] = operands;
    if (++w.arrived == kWarpLanes) {
        complete(w);
        w.arrived = 0;
        for (int other = first; other < first + kWarpLanes; ++other)
            if (threads[other].state == FiberState::kAtWarpOp)
                threads[other].state = FiberState::kReady;
    } else {
        f.state = FiberState::kAtWarpOp;
        yield_to_scheduler(l, f);
    }
    return w.results[lane];
}

}  // namespace

int collective_lane(const char* instruction, const char* group, int lanes) {
    Launch& l = launch();
    const Fiber& f = current_fiber();
    const int lane = f.linear_index % lanes, first = f.linear_index - lane;
    if (first + lanes > l.threads)
        fail(std::string(instruction) + " in a " + group + " of " +
             std::to_string(l.threads - first) + " threads (all " + std::to_string(lanes) +
             " lanes must take part)");
    // The group's warps count their returned lanes: a collective instruction looks at each
    // warp once, not at each lane (it runs once per lane).
    const std::vector<Warp>& warps = l.blocks[size_t(f.block)].warps;
    int exited = 0;
    for (int warp = first / kWarpLanes; warp < (first + lanes) / kWarpLanes; ++warp)
        exited += warps[size_t(warp)].exited;
    if (exited == 0) return lane;
    const Fiber* threads = block_fibers(l, size_t(f.block));
    for (int other = first; other < first + lanes; ++other)
        if (threads[other].state == FiberState::kExited)
            fail(std::string(instruction) + " after lane " + std::to_string(other - first) +
                 " of the " + group + " returned");
    return lane;
}

Launch& launch() {
    if (!active_launch) throw Error("CUDA emulation: device code called outside emulate_launch");
    return *active_launch;
}

Fiber& current_fiber() {
    Launch& l = launch();
    if (!l.current) throw Error("CUDA emulation: device code called outside a kernel thread");
    return *l.current;
}

Block& current_block() { return launch().blocks[size_t(current_fiber().block)]; }

void complete_cluster_phase_if_all_arrived(Launch& l) {
    if (l.cluster_arrivals > 0 && l.cluster_arrivals == l.cluster_live) {
        l.cluster_arrivals = 0;
        ++l.cluster_phase;
    }
}

void fail(const std::string& message) {
    record_fault(launch(), message);
    throw KernelAbort{};
}

void wait_until(const char* what, std::function<bool()> ready) {
    if (ready()) return;
    Launch& l = launch();
    Fiber& f = current_fiber();
    f.state = FiberState::kWaiting;
    f.waiting_for = what;
    f.ready_when = std::move(ready);
    yield_to_scheduler(l, f);
    f.ready_when = nullptr;
}

uint32_t window_address(const Block& block, const void* pointer) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(pointer);
    const uintptr_t begin = reinterpret_cast<uintptr_t>(block.dynamic_shared);
    if (p < begin || p - begin > launch().dynamic_shared_bytes)
        fail(
            "the shared address of memory outside the block's dynamic shared memory (the "
            "emulation's shared window holds only that)");
    return kSharedWindowStart + uint32_t(p - begin);
}

char* window_pointer(Block& block, uint32_t address, size_t bytes) {
    const size_t size = launch().dynamic_shared_bytes;
    if (address < kSharedWindowStart || address - kSharedWindowStart > size ||
        bytes > size - (address - kSharedWindowStart))
        fail("shared address " + std::to_string(address) + " (" + std::to_string(bytes) +
             " bytes) outside the block's dynamic shared memory");
    return block.dynamic_shared + (address - kSharedWindowStart);
}

void fault(const char* message) { fail(message); }

void block_barrier() {
    Launch& l = launch();
    Fiber& f = current_fiber();
    Block& b = current_block();
    if (++b.at_barrier == b.live) {
        release_barrier(l, b);
        return;
    }
    f.state = FiberState::kAtBarrier;
    yield_to_scheduler(l, f);
}

void warp_barrier(unsigned mask) { warp_collective(WarpOp::kSyncwarp, mask, LaneOperands{}); }

uint64_t warp_shuffle(unsigned mask, uint64_t value, int source_lane) {
    LaneOperands operands;
    operands.value = value;
    operands.source_lane = source_lane;
    return warp_collective(WarpOp::kShuffle, mask, operands).value;
}

void load_matrices(uint32_t* registers, int matrices, bool transposed, const void* row) {
    LaneOperands operands;
    operands.value = reinterpret_cast<uintptr_t>(row);
    operands.matrices = matrices;
    const LaneResult& result = warp_collective(
        transposed ? WarpOp::kLdmatrixTrans : WarpOp::kLdmatrix, kFullMask, operands);
    std::copy(result.registers, result.registers + matrices, registers);
}

void tensor_core_mma(DType type, float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    LaneOperands operands;
    std::copy(c, c + 4, operands.c);
    std::copy(a, a + 4, operands.a);
    std::copy(b, b + 2, operands.b);
    const LaneResult& result = warp_collective(
        type == DType::F16 ? WarpOp::kMmaF16 : WarpOp::kMmaBf16, kFullMask, operands);
    std::copy(result.c, result.c + 4, c);
}

void copy_async(void* shared, const void* global, bool valid) {
    Fiber& f = current_fiber();
    if (reinterpret_cast<uintptr_t>(shared) % kCopyBytes ||
        reinterpret_cast<uintptr_t>(global) % kCopyBytes)
        fail("copy_async_16 with an address that is not 16-byte aligned");
    if (!is_shared(shared, kCopyBytes)) fail("copy_async_16 to an address outside shared memory");
    if (is_shared(global, 1)) fail("copy_async_16 from shared memory");
    f.copies.push_back({shared, global, valid});
}

void copy_async_commit() {
    Fiber& f = current_fiber();
    f.group_ends.push_back(f.copies.size());
}

void copy_async_wait(int pending_groups) {
    Fiber& f = current_fiber();
    const size_t groups = f.group_ends.size();
    if (groups <= size_t(pending_groups)) return;
    const size_t retiring = groups - size_t(pending_groups);
    const size_t done = f.group_ends[retiring - 1];
    for (size_t i = 0; i < done; ++i) {
        const PendingCopy& copy = f.copies[i];
        if (copy.valid)
            std::memcpy(copy.shared, copy.global, kCopyBytes);
        else
            std::memset(copy.shared, 0, kCopyBytes);
    }
    f.copies.erase(f.copies.begin(), f.copies.begin() + std::ptrdiff_t(done));
    f.group_ends.erase(f.group_ends.begin(), f.group_ends.begin() + std::ptrdiff_t(retiring));
    for (size_t& end : f.group_ends) end -= done;
}

float* dynamic_shared_memory() { return reinterpret_cast<float*>(current_block().dynamic_shared); }

int lane_index() { return current_fiber().linear_index % kWarpLanes; }

bool is_shared(const void* address, size_t bytes) {
    const auto inside = [&](const char* begin, size_t size) {
        const uintptr_t a = reinterpret_cast<uintptr_t>(address);
        const uintptr_t b = reinterpret_cast<uintptr_t>(begin);
        return begin && a >= b && a - b <= size && bytes <= size - (a - b);
    };
    const Launch* l = active_launch;
    if (l && l->current && l->dynamic_shared_bytes &&
        inside(l->blocks[size_t(l->current->block)].dynamic_shared, l->dynamic_shared_bytes))
        return true;
    const StaticSharedArrays& statics = static_shared_arrays();
    if (!statics.found) return inside(__data_start, size_t(_end - __data_start));
    return std::any_of(statics.arrays.begin(), statics.arrays.end(),
                       [&](const SharedArray& array) { return inside(array.begin, array.bytes); });
}

void grid_dependency_wait() {
    block_barrier();
    // The first thread past the barrier gives the regions back before any other runs on.
    if (early_launch_check) early_launch_check->give_back();
}

EarlyLaunchCheck::EarlyLaunchCheck(std::vector<MemoryRegion> regions)
    : regions_(std::move(regions)), saved_(regions_.size()) {
    if (early_launch_check) throw Error("CUDA emulation: an EarlyLaunchCheck inside another");
    early_launch_check = this;
}

EarlyLaunchCheck::~EarlyLaunchCheck() { early_launch_check = nullptr; }

void EarlyLaunchCheck::hold_back() {
    for (size_t i = 0; i < regions_.size(); ++i) {
        const auto* begin = static_cast<const unsigned char*>(regions_[i].begin);
        saved_[i].assign(begin, begin + regions_[i].bytes);
        std::memset(regions_[i].begin, kPoisonByte, regions_[i].bytes);
    }
    held_ = true;
}

void EarlyLaunchCheck::give_back() {
    if (!held_) return;
    for (size_t i = 0; i < regions_.size(); ++i)
        std::memcpy(regions_[i].begin, saved_[i].data(), regions_[i].bytes);
    held_ = false;
}

void run_grid(dim3 grid, dim3 cluster, dim3 block, size_t dynamic_shared_bytes,
              const std::function<void()>& thread_body) {
    if (active_launch) throw Error("CUDA emulation: a launch inside a launch");
    check_shape(grid, cluster, block, dynamic_shared_bytes);
    Launch l;
    l.threads = int(block.x * block.y * block.z);
    l.body = &thread_body;
    l.dynamic_shared_bytes = dynamic_shared_bytes;
    const size_t cluster_blocks = size_t(cluster.x) * cluster.y * cluster.z;
    const size_t warps = size_t((l.threads + kWarpLanes - 1) / kWarpLanes);
    l.blocks.resize(cluster_blocks);
    for (Block& b : l.blocks) {
        // Dynamic shared memory: the bytes asked for, rounded up to 16 (AddressSanitizer sees
        // overruns past that).
        b.dynamic_storage.resize((dynamic_shared_bytes + sizeof(float4) - 1) / sizeof(float4));
        b.dynamic_shared = reinterpret_cast<char*>(b.dynamic_storage.data());
        b.warps.resize(warps);
        b.warpgroups.resize(size_t((l.threads + kWarpgroupLanes - 1) / kWarpgroupLanes));
    }
    l.fibers.resize(cluster_blocks * size_t(l.threads));
    for (size_t i = 0; i < l.fibers.size(); ++i) {
        Fiber& f = l.fibers[i];
        const unsigned t = unsigned(i % size_t(l.threads));
        f.block = int(i / size_t(l.threads));
        f.linear_index = int(t);
        f.thread_index = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
    }
    stack_pool.assign(l.fibers);

    struct ActiveLaunch {
        explicit ActiveLaunch(Launch* l) { active_launch = l; }
        ~ActiveLaunch() { active_launch = nullptr; }
    } active(&l);
    gridDim = grid;
    blockDim = block;
    // Clusters one after another (x fastest, then y, then z); within a cluster the blocks by
    // rank, x fastest.
    for (unsigned z = 0; z < grid.z; z += cluster.z)
        for (unsigned y = 0; y < grid.y; y += cluster.y)
            for (unsigned x = 0; x < grid.x; x += cluster.x) {
                for (size_t rank = 0; rank < cluster_blocks; ++rank)
                    l.blocks[rank].index = {x + unsigned(rank % cluster.x),
                                            y + unsigned(rank / cluster.x % cluster.y),
                                            z + unsigned(rank / (size_t(cluster.x) * cluster.y))};
                blockIdx = l.blocks[0].index;
                run_cluster(l);
                if (l.aborting) throw Error(l.fault);
            }
}

}  // namespace barellm::cuda::emulation
