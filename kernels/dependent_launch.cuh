// Programmatic dependent launch (sm_90+): a decode kernel may start while the kernel ahead of
// it in the stream is still finishing, so that its prologue (the L2 prefetch of its first
// weights, tables that depend on nothing computed) overlaps that kernel's tail instead of
// following it.
//
// - A kernel that takes part calls finish_prologue() once every thread of its block has read
//   all it reads of what no kernel writes (weights, norm weights, RoPE frequencies, the step's
//   token and position, which the host writes before the graph runs). It waits until the
//   kernels ahead of it have ended and their writes can be seen, then lets the next kernel
//   launch. Nothing before it may read or write what another kernel writes.
// - So the next kernel launches once every block of this one is past its prologue: it runs
//   its own prologue during this kernel's main work and tail, and one kernel at most runs
//   ahead (letting it launch before the wait would let a chain of prologues hold SM slots
//   and L2 while the kernel doing the work runs).
// - Its host side launches it with launch_after_previous: with BARELLM_CUDA_PDL=1, on a GPU
//   of compute capability 9.0 or later running images built for it, as a programmatic
//   dependent launch (cudaLaunchAttributeProgrammaticStreamSerialization; captured into the
//   decode graph as a programmatic edge); otherwise as kernel<<<...>>> launches it. Without
//   the attribute the two instructions do nothing.
// - Taking part: the decode matvecs of every weight type (matvec.cuh, matvec_quantized.cuh,
//   matvec_blocks.cuh; the logits' too) and the decode attention (attention.cuh). Kernels
//   launched plainly start after the kernel ahead ends, as always: the embedding, Gemma's post
//   norms, the MoE router's pick and combine, and the expert matvecs, which find their expert
//   in what the router wrote before their prefetch (their finish_prologue does nothing).
// - A kernel waits only for the one ahead of it, which itself waited for its own predecessor
//   before it could end: every earlier kernel has ended once finish_prologue returns.
// - The CUDA emulation (tests/emulation/) checks the rule: under an EarlyLaunchCheck, what the
//   kernels ahead wrote reads as NaN until every thread of the block has passed
//   finish_prologue.
#pragma once
#include "common.cuh"
#include "cuda_check.h"
#include "kernels.h"  // dependent_launch_enabled

namespace barellm::cuda {

// Waits for the kernels ahead, then lets the next kernel launch (the header). Every thread
// of the block calls it, at the same point (in the emulation it holds a block barrier).
__device__ __forceinline__ void finish_prologue() {
#ifdef BARELLM_CUDA_EMULATION
    emulation::grid_dependency_wait();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#ifdef BARELLM_LAUNCH_FUNCTIONS

// kernel<<<grid, block, shared_bytes, stream>>>(args...), as a programmatic dependent launch
// where dependent_launch_enabled; the kernel calls finish_prologue.
template <typename... Params, typename... Args>
void launch_after_previous(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                           cudaStream_t stream, Args... args) {
    cudaLaunchAttribute overlap{};
    overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    overlap.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream;
    config.attrs = &overlap;
    config.numAttrs = dependent_launch_enabled() ? 1 : 0;
    CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...));
}

#endif  // BARELLM_LAUNCH_FUNCTIONS

}  // namespace barellm::cuda
