#!/usr/bin/env bash
# barellm against llama.cpp's llama-bench on the same weights: a table (markdown, --json or
# --csv) with the machine, both tools' SIMD levels and commits, t/s, ratios, peak memory,
# and flags for noisy rows or a busy machine. The work is done by compare_llamacpp.py;
# `scripts/compare_llamacpp.sh --help` prints the usage.
exec python3 "$(dirname "$0")/compare_llamacpp.py" "$@"
