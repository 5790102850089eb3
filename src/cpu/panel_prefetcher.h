// Software prefetch shared by the AVX-512 and AVX2 kernels: a few cache lines ahead of a
// matvec's stream (prefetcht0, into L1), a block's lines spread over the steps of a kernel
// (prefetcht0 into L1, or prefetcht1 into L2), and a GEMM's next panel of weights (prefetcht1).
#pragma once
#include <algorithm>
#include <cstddef>

namespace barellm::cpu {

constexpr int kCacheLine = 64;  // bytes

// How far ahead of a row the AVX2 matvecs that read rows (Q8, Q4, the i-quants and the ternary
// types) ask for its lines: the hardware prefetcher alone leaves their loads waiting on memory. The
// best distance measured for Q8 and Q4 (docs/benchmarks-history.md: "CPU: software prefetch
// distances of the decode matvecs").
constexpr int kRowPrefetchBytes = 1536;

// Asks for the cache lines of [p + distance, p + distance + bytes) (a hint: it never faults,
// past the end of a buffer included).
inline void prefetch_ahead(const void* p, int distance, int bytes) {
    constexpr int kIntoL1 = 3;  // __builtin_prefetch's locality of prefetcht0
    const char* ahead = static_cast<const char*>(p) + distance;
    for (int line = 0; line < bytes; line += kCacheLine)
        __builtin_prefetch(ahead + line, 0, kIntoL1);
}

// The block a kernel asks for while it reads another: its first line (none where null), and
// whether its lines go into L2 only (prefetcht1) or on into L1 (prefetcht0).
struct LinesAhead {
    const void* from = nullptr;
    bool into_l2 = false;
};

// Step `step` of the kSteps a kernel takes over a block of kLines cache lines asks for its share
// of the lines of `ahead`, so that the block ahead is asked for a line or two at a time, spread
// over the block, not all at its start.
// Each request is an asm statement, which the compiler keeps: GCC 12's dead-code elimination
// dropped the builtin's prefetches here, in a loop whose bounds depend on the step.
template <int kLines, int kSteps>
inline void prefetch_share(LinesAhead ahead, int step) {
    if (ahead.from == nullptr) return;
    const char* lines = static_cast<const char*>(ahead.from);
    for (int line = step * kLines / kSteps; line < (step + 1) * kLines / kSteps; ++line) {
        if (ahead.into_l2)
            asm volatile("prefetcht1 %0" : : "m"(lines[line * kCacheLine]));
        else
            asm volatile("prefetcht0 %0" : : "m"(lines[line * kCacheLine]));
    }
}

// Requests the weights of the GEMM's next panel from memory while the current one is
// computed, a share of its rows before each of the current panel's micro-kernel calls, so
// that the next panel's first reads find them in cache instead of waiting on memory.
class PanelPrefetcher {
public:
    // The next panel: `rows` rows of `bytes` bytes from `first`, `stride` bytes apart (no
    // rows: nothing to fetch), spread over `calls` calls of before_call().
    PanelPrefetcher(const void* first, size_t stride, int rows, int bytes, int calls)
        : first_(static_cast<const char*>(first)),
          stride_(stride),
          rows_(rows),
          bytes_(bytes),
          rows_per_call_((rows + calls - 1) / calls) {}

    void before_call() {
        const int end = std::min(rows_, next_row_ + rows_per_call_);
        for (; next_row_ < end; ++next_row_)
            for (int offset = 0; offset < bytes_; offset += kCacheLine)
                __builtin_prefetch(first_ + next_row_ * stride_ + offset, 0, kIntoL2);
    }

private:
    static constexpr int kIntoL2 = 2;  // __builtin_prefetch's locality of prefetcht1
    const char* first_;
    size_t stride_;
    int rows_, bytes_, rows_per_call_;
    int next_row_ = 0;
};

}  // namespace barellm::cpu
