// Wall-clock timing for the speed figures of run, ppl, bench and ladder.
#pragma once
#include <chrono>

namespace barellm {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace barellm
