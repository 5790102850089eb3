// What a benchmark says about the machine it ran on: the CPU's model name, its vector
// extensions, and the number of physical cores (the default thread count: a second
// hardware thread on a core shares that core's FMA units and adds nothing to dense kernels);
// and how many threads the process can start at all.
#pragma once
#include <string>

namespace barellm {

// The number of distinct (physical id, core id) pairs in the text of /proc/cpuinfo;
// 0 when any processor lacks either field (the count is then unknown).
int count_physical_cores(const std::string& cpuinfo);

// The first "model name" of the text of /proc/cpuinfo; "" when there is none.
std::string cpu_model_name(const std::string& cpuinfo);

// Physical cores of this machine, at most the CPUs this process may run on; the logical
// CPU count where /proc/cpuinfo does not tell. At least 1.
int physical_core_count();

// How many threads of `wanted` (the calling one included) can run at once: the others are
// started with the default stack size, as the OpenMP runtime starts its own, then joined.
// Below `wanted` when a thread could not be started (a memory or process limit); `error`
// then receives pthread_create's error number.
int threads_that_start(int wanted, int* error);

// This machine's CPU model ("unknown" when /proc/cpuinfo does not name it).
std::string machine_cpu_model();

// The vector extensions this CPU offers, of those that matter to inference kernels
// ("avx2 fma f16c avx512f ..."), whether or not barellm uses them.
std::string cpu_vector_extensions();

}  // namespace barellm
