#!/usr/bin/env bash
# One script for a session on a GPU machine (an H100/H200 with 16 cores, numpy, torch and
# transformers, no internet), about 6-8 minutes in all:
#   1. builds barellm with nvcc for the local GPU only (CUDA_ARCHS=90 unless told);
#   2. every CUDA kernel against the CPU kernels, and their bandwidth (build/cuda_kernel_check);
#   3. the CUDA parity tests (tests/test_cuda.py: CUDA logits against CPU logits);
#   4. CUDA logits against Hugging Face transformers on synthetic Llama/Mistral checkpoints;
#   5. generates a Mistral-7B-shaped f16 checkpoint on the machine (in the background from
#      the start: about 14.5 GB written twice) and benchmarks decode at short and long
#      context for it and for stories260K;
#   6. the GPU optimisation ladder (`barellm ladder --device cuda -n 64`, its greedy-text
#      test first) on stories260K and on the Mistral-7B-shaped checkpoint;
#   ending with a table: model, context, tok/s, GB/s, % of the device-to-device copy
#   bandwidth measured by the same run (the ladder tables are in ladder_*.md).
#
# The GPU machine cannot reach ../shared nor a package registry, so first, on the
# development machine:
#     dev/gpu/gpu_session.sh --stage
# which copies stories260K, the llama2 tokenizer and the nlohmann/json headers into
# gpu_data/ (git-ignored). Then run, on the GPU machine, from the repository root:
#     bash dev/gpu/gpu_session.sh            (the device tool: carry ["gpu_data"])
# Logs go to $WORK/logs and, when OUT is set, into one archive $OUT/gpu_logs.tgz (the device
# tool brings back at most 8 files). Environment: CUDA_ARCHS (default 90), WORK (scratch,
# default /tmp/barellm-gpu), SKIP_MISTRAL=1 (no 7B checkpoint nor its benchmark),
# MISTRAL_DEADLINE (seconds into the run after which the checkpoint is not waited for,
# default 420: the device tool stops a command at 600).
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--stage" ]; then
    SHARED=${SHARED:-../shared}
    rm -rf gpu_data
    mkdir -p gpu_data/shared/models gpu_data/shared/tokenizers gpu_data/include
    cp -r "$SHARED/models/stories260K" gpu_data/shared/models/
    cp -r "$SHARED/tokenizers/llama2" gpu_data/shared/tokenizers/
    if [ -d /usr/include/nlohmann ]; then cp -r /usr/include/nlohmann gpu_data/include/; fi
    du -sh gpu_data
    echo "staged: now run 'bash dev/gpu/gpu_session.sh' on the GPU machine, carrying gpu_data"
    exit 0
fi

WORK=${WORK:-/tmp/barellm-gpu}
LOG=$WORK/logs
CUDA_ARCHS=${CUDA_ARCHS:-90}
rm -rf "$LOG"
mkdir -p "$LOG"
# The device tool brings back at most 8 files from $OUT: every log goes into one archive,
# written however the script ends.
finish() {
    if [ -n "${OUT:-}" ]; then tar czf "$OUT/gpu_logs.tgz" -C "$WORK" logs; fi
    return 0
}
trap finish EXIT
export PYTHONUNBUFFERED=1
SUMMARY=()
# Each note is printed, kept for the summary and written to summary.txt at once, so that
# a run cut off by the device tool's 10-minute limit still leaves what it found.
note() { SUMMARY+=("$1"); echo "== $1"; echo "$1" >>"$LOG/summary.txt"; }
step() { echo; echo "==== [$(date +%T), ${SECONDS}s] $*"; }

. dev/gpu/gpu_common.sh
link_staged_shared
STORIES_HF=../shared/models/stories260K
[ -d "$STORIES_HF" ] || note "stories260K missing (run dev/gpu/gpu_session.sh --stage first)"

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 | tee "$LOG/gpu.txt"
{ command -v nvcc >/dev/null && nvcc --version || /usr/local/cuda/bin/nvcc --version; } | tail -2
nproc
df -h "$WORK" | tail -1

# 5a. The Mistral-7B-shaped checkpoint, generated while the rest runs.
[ "${SKIP_MISTRAL:-0}" = 1 ] || start_mistral_checkpoint

# 1. Build for this GPU only (one architecture keeps nvcc fast).
step "build (CUDA_ARCHS=$CUDA_ARCHS)"
if build_for_gpu build/barellm build/dump_logits build/cuda_kernel_check; then
    grep -i "warning" "$LOG/build.log" | head -20
    note "build: ok ($(grep -ci warning "$LOG/build.log") warning lines)"
else
    tail -30 "$LOG/build.log"
    note "build: FAILED (see build.log)"
    printf '%s\n' "${SUMMARY[@]}"
    exit 1
fi
if ! reason=$(build/dump_logits --check-cuda); then
    note "no usable CUDA GPU: $reason"
    printf '%s\n' "${SUMMARY[@]}"
    exit 1
fi

# 2. Every kernel against the CPU kernels, then their bandwidth.
step "cuda_kernel_check --bench"
timeout 240 build/cuda_kernel_check --bench >"$LOG/kernel_check.log" 2>&1
status=$?
grep -v "^PASS" "$LOG/kernel_check.log" | head -60
note "cuda_kernel_check: $(tail -1 "$LOG/kernel_check.log") (exit $status)"

# 3. CUDA against CPU logits.
step "tests/test_cuda.py"
XDIST=""
python3 -c "import xdist" 2>/dev/null && XDIST="-n 8"
OMP_NUM_THREADS=2 timeout 300 python3 -m pytest -q -rs $XDIST tests/test_cuda.py >"$LOG/test_cuda.log" 2>&1
status=$?
grep -E "FAILED|Error|error" "$LOG/test_cuda.log" | head -30
note "test_cuda.py: $(tail -1 "$LOG/test_cuda.log") (exit $status)"

# 3b. Every rung of the GPU ladder gives the fast path's greedy text (and the table's shape).
step "tests/test_ladder.py -k gpu"
timeout 120 python3 -m pytest -q -rs tests/test_ladder.py -k gpu >"$LOG/test_ladder.log" 2>&1
status=$?
grep -E "FAILED|Error|error" "$LOG/test_ladder.log" | head -20
note "test_ladder.py -k gpu: $(tail -1 "$LOG/test_ladder.log") (exit $status)"

# 4. CUDA against Hugging Face transformers (f32 weights, f32 KV cache).
step "CUDA logits against transformers"
for name in gqa-window wide-heads group-of-8; do
    dir=$WORK/hf-$name
    rm -rf "$dir" && mkdir -p "$dir"
    python3 -c "import json, sys; sys.path.insert(0, 'tests'); import test_cuda; \
json.dump(test_cuda.SYNTHETIC['$name'], open('$dir/config.json', 'w'))" &&
        python3 convert/synth.py --config "$dir/config.json" --tokenizer "$STORIES_HF" \
            -o "$dir/hf" --dtype f32 --seed 7 >/dev/null &&
        python3 convert/convert.py "$dir/hf" -o "$dir/model.bin" --dtype f32 >/dev/null || {
        note "transformers $name: could not make the checkpoint"
        continue
    }
    ids=$(python3 -c "import numpy as np; print(','.join(map(str, \
np.random.default_rng(11).integers(0, 512, 200))))")
    if build/dump_logits "$dir/model.bin" "$dir/cuda.logits" ${ids//,/ } --kv f32 --device cuda \
        2>"$LOG/transformers_$name.err"; then
        result=$(timeout 120 python3 dev/gpu/transformers_logits.py "$dir/hf" --ids "$ids" \
            --compare "$dir/cuda.logits" 2>>"$LOG/transformers_$name.err")
        echo "$result" >>"$LOG/transformers.log"
        note "transformers $name: ${result:-FAILED (see transformers_$name.err)}"
    else
        note "transformers $name: dump_logits --device cuda failed: $(tail -1 "$LOG/transformers_$name.err")"
    fi
done

# 5b. Decode benchmarks.
step "benchmarks"
python3 convert/convert.py "$STORIES_HF" -o "$WORK/stories260K-f16.bin" --dtype f16 >/dev/null
BENCH_RESULTS=$LOG/bench_results.jsonl
: >"$BENCH_RESULTS"
bench() {  # MODEL_LABEL MODEL_FILE GEN_TOKENS REPETITIONS
    local label=$1 file=$2 n=$3 r=$4
    echo "-- $label tg$n"
    if build/barellm bench "$file" --device cuda -p 0 -n "$n" -r "$r" -o json \
        >"$LOG/bench_${label}_tg$n.json" 2>"$LOG/bench_${label}_tg$n.err"; then
        python3 -c "import json, sys; [print(json.dumps({**e, 'label': '$label'})) \
for e in json.load(open('$LOG/bench_${label}_tg$n.json'))]" >>"$BENCH_RESULTS"
    else
        note "bench $label tg$n failed: $(tail -1 "$LOG/bench_${label}_tg$n.err")"
    fi
}
bench stories260K "$WORK/stories260K-f16.bin" 128 5
bench stories260K "$WORK/stories260K-f16.bin" 512 3
build/barellm bench "$WORK/stories260K-f16.bin" --device cuda -p 0 -n 128 -r 3 \
    >"$LOG/bench_stories_table.md" 2>&1 && tail -1 "$LOG/bench_stories_table.md"

wait_for_mistral_checkpoint "${MISTRAL_DEADLINE:-420}"
if [ -f "$MISTRAL" ]; then
    ls -la "$MISTRAL"
    bench mistral-7b-f16 "$MISTRAL" 128 3
    if [ "$SECONDS" -lt 450 ]; then
        bench mistral-7b-f16 "$MISTRAL" 4096 1
    else
        note "skipped mistral-7b tg4096: ${SECONDS}s already spent"
    fi
fi

# 6. The GPU ladder: decode with each optimisation added in turn, the file's weights.
step "GPU ladder"
ladder() {  # MODEL_LABEL MODEL_FILE
    if timeout 150 build/barellm ladder "$2" --device cuda -n 64 >"$LOG/ladder_$1.md" \
        2>"$LOG/ladder_$1.err"; then
        cat "$LOG/ladder_$1.md"
        note "ladder $1: $(grep -c '^| [0-9]' "$LOG/ladder_$1.md") rungs (ladder_$1.md)"
    else
        note "ladder $1 failed: $(tail -1 "$LOG/ladder_$1.err")"
    fi
}
python3 convert/convert.py "$STORIES_HF" -o "$WORK/stories260K-f32.bin" --dtype f32 >/dev/null
ladder stories260K-f32 "$WORK/stories260K-f32.bin"
if [ -f "$MISTRAL" ]; then
    if [ "$SECONDS" -lt 420 ]; then
        ladder mistral-7b-f16 "$MISTRAL"
    else
        note "skipped the mistral-7b ladder: ${SECONDS}s already spent"
    fi
fi

step "summary"
printf '%s\n' "${SUMMARY[@]}"
echo
python3 - "$BENCH_RESULTS" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
print("| model | context (decode positions) | tok/s | GB/s | % of d2d copy | d2d copy GB/s |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for r in rows:
    print(f"| {r['label']} | 0..{r['n_gen'] - 1} | {r['avg_ts']:.1f} ± {r['stddev_ts']:.1f} "
          f"| {r['gbps']:.0f} | {r['bw_pct']:.0f}% | {r['bandwidth_gbps']:.0f} |")
EOF
echo "logs: $LOG, and \$OUT/gpu_logs.tgz when OUT is set (${SECONDS}s in all)"
