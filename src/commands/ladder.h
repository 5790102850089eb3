// `barellm ladder`: the optimisation ladder, reproducible on the reader's machine. Each rung
// is every optimisation of the rungs above it plus one. The CPU ladder:
//   1 scalar kernels, 1 thread, f32 weights    5 + f16 weights
//   2 + OpenMP threads                         6 + q8 weights
//   3 + AVX2/FMA SIMD kernels                  7 + batched prefill (prompt processing)
//   4 + AVX-512 kernels
// A rung whose kernels the CPU lacks runs the best it has, and its text says so.
// Rungs 1-6 time passes of N decode steps from random ids (fixed seed) after one warm-up
// step; rung 7 times a prompt of P tokens run token by token and as one prefill batch. The
// weights are converted in memory (model_copy.h) to the dtype of each rung. Every rung is
// timed 3 times, each repeating its pass for at least 0.5 s: the table gives the mean and
// the spread, the threads the rung uses, % bw only for weights larger than the last-level
// cache, the reason beside a slower rung, and warnings when the spread or the load
// average says the machine is busy.
// With --check-text, each rung instead completes the text greedily and prints it, one
// JSON object per line (tests/test_ladder.py compares them with `barellm run --temp 0`).
// With --device cuda, the GPU ladder: the CUDA backend with its kernels made simpler
// (BackendOptions::cuda_kernels, kernels/*_simple.cuh run by kernels/ladder_forward.cu) and
// its switches off, then each optimisation added in turn, the file's weights on every rung:
//   1 naive port: a thread per matrix row,     5 + coalesced attention (attention.cuh,
//     separate kernels, naive attention,          one split)
//     f32 KV cache, no graph                   6 + f16 KV cache
//   2 + a warp per matrix row                  7 + CUDA graph
//   3 + fused kernels                          8 + flash-decoding: the fast path
//   4 + the fast matvecs (matvec.cuh)
// Every rung times N decode steps (no prefill rung); --check-text prints each rung's text.
// docs/TOUR.md explains what each rung changes and why it helps.
#pragma once
#include <string>

#include "commands/cli.h"

namespace barellm {

// Runs the ladder the command line asks for, printing the table (or the texts) to stdout.
int run_ladder_command(const Options& options);

}  // namespace barellm
