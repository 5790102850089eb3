// `barellm ladder`: the CPU optimisation ladder, reproducible on the reader's machine.
// Each rung is every optimisation of the rungs above it plus one:
//   1 scalar kernels, 1 thread, f32 weights    4 + f16 weights
//   2 + OpenMP threads                         5 + q8 weights
//   3 + AVX2/FMA SIMD kernels                  6 + batched prefill (prompt processing)
// Rungs 1-5 time N decode steps from random ids (fixed seed) after one warm-up step;
// rung 6 times a prompt of P tokens run token by token and as one prefill batch. The
// weights are converted in memory (model_copy.h) to the dtype of each rung.
// With --check-text, each rung instead completes the text greedily and prints it, one
// JSON object per line (tests/test_ladder.py compares them with `barellm run --temp 0`).
// docs/TOUR.md explains what each rung changes and why it helps.
#pragma once
#include <string>

#include "cli.h"

namespace barellm {

// Runs the ladder the command line asks for, printing the table (or the texts) to stdout.
int run_ladder_command(const Options& options);

}  // namespace barellm
