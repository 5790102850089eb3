// Host-side CUDA error checking: the status of every CUDA runtime call, and of every kernel
// launch (cudaGetLastError right after it), becomes a barellm::Error with a one-line message
// naming the call and where it was made. Nothing here exits the program. Host code only.
// The runtime API comes from here for all host code: CUDA's, or on the CPU emulation of CUDA
// (tests/emulation/) the emulated one (cuda_runtime_emulation.h).
#pragma once
#ifdef BARELLM_CUDA_EMULATION
#include "cuda_emulation.h"
#else
#include <cuda_runtime_api.h>
#endif

#include <string>

#include "util/error.h"

namespace barellm::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* what, const char* file,
                                          int line) {
    throw Error(std::string("CUDA error: ") + what + " failed: " + cudaGetErrorName(status) + " (" +
                cudaGetErrorString(status) + ") at " + file + ":" + std::to_string(line));
}

inline void check_cuda(cudaError_t status, const char* what, const char* file, int line) {
    if (status != cudaSuccess) throw_cuda_error(status, what, file, line);
}

}  // namespace barellm::cuda

// Throws barellm::Error when a CUDA runtime call does not return cudaSuccess.
#define CUDA_CHECK(call) ::barellm::cuda::check_cuda((call), #call, __FILE__, __LINE__)

// Throws barellm::Error when the kernel launch just made failed (bad configuration, no
// kernel image for this GPU, ...). Errors while the kernel runs surface at the next
// synchronisation, which is checked too.
#define CUDA_CHECK_LAUNCH(kernel_name) \
    ::barellm::cuda::check_cuda(cudaGetLastError(), "launch of " kernel_name, __FILE__, __LINE__)
