#!/usr/bin/env bash
# Where the time of one decode step goes on the GPU, for a Mistral-7B-shaped f16 checkpoint
# generated on the machine: about 6 minutes on an H100.
#   1. builds barellm, dump_logits and cuda_kernel_check for the local GPU (CUDA_ARCHS,
#      default 90) and checks every kernel against the CPU (cuda_kernel_check), then times
#      the hot kernels alone at Mistral's shapes (--bench);
#   2. while the checkpoint is generated, scripts/matvec_variants.cu (matvec designs timed
#      against the production kernel), tests/test_cuda.py (CUDA logits against CPU) and the
#      GPU ladder's tests (every rung gives the fast path's text);
#   3. decode tok/s at short and long context, with and without the CUDA graph;
#   4. with PROFILE_NCU=1, Nsight Compute (ncu) over the kernels of two decode steps
#      launched without the graph: per kernel, calls per token, µs per token and GB/s from
#      its DRAM bytes.
# First `dev/gpu/gpu_session.sh --stage` here, then on the GPU machine, from the repository
# root (the device tool: carry ["gpu_data"], timeout_s 600):
#     bash dev/gpu/gpu_decode_profile.sh
# A/B against other trees (an earlier commit, an experiment on a branch): for each, `git
# archive -o gpu_data/ab/NAME.tgz REV` here first; the script then builds every such tree
# too (beside this one) and runs the decode benchmarks of all in turn, twice over, so that
# they are compared within one run on one GPU.
# Logs go to one archive, $OUT/profile_logs.tgz (the device tool brings back few files);
# the summary is printed last. Environment: CUDA_ARCHS (default 90), WORK (default
# /tmp/barellm-gpu), PROFILE_NCU, MATVEC_VARIANTS (1: time scripts/matvec_variants.cu even
# when trees are compared; 0: never).
set -uo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-/tmp/barellm-gpu}
CUDA_ARCHS=${CUDA_ARCHS:-90}
LOG=$WORK/profile_logs
mkdir -p "$LOG"
finish() { [ -n "${OUT:-}" ] && tar czf "$OUT/profile_logs.tgz" -C "$WORK" profile_logs; }
trap finish EXIT
SUMMARY=$LOG/summary.txt
: >"$SUMMARY"
note() { echo "$1" | tee -a "$SUMMARY"; }
step() { echo "==== [${SECONDS}s] $*"; }

. dev/gpu/gpu_common.sh
link_staged_shared  # the tokenizers synth.py takes
start_mistral_checkpoint

# Trees to compare with this one (gpu_data/ab/NAME.tgz), built in the background.
declare -A AB_PIDS=()
for archive in gpu_data/ab/*.tgz; do
    [ -f "$archive" ] || continue
    name=$(basename "$archive" .tgz)
    step "building tree '$name' ($archive) in the background"
    rm -rf "$WORK/ab/$name" && mkdir -p "$WORK/ab/$name" && tar xzf "$archive" -C "$WORK/ab/$name"
    (cd "$WORK/ab/$name" && make -j4 CUDA_ARCHS="$CUDA_ARCHS" CUDA_PTX_ARCH="${CUDA_ARCHS##* }" \
        CPPFLAGS="$CPPFLAGS_EXTRA" build/barellm) >"$LOG/build_$name.log" 2>&1 &
    AB_PIDS[$name]=$!
done

step "build (CUDA_ARCHS=$CUDA_ARCHS)"
build_for_gpu build/barellm build/dump_logits build/cuda_kernel_check ||
    { tail -20 "$LOG/build.log"; exit 1; }
AB_TREES=()  # the names of the trees that built
for name in "${!AB_PIDS[@]}"; do
    if wait "${AB_PIDS[$name]}"; then
        AB_TREES+=("$name")
    else
        note "tree $name: build failed: $(grep -m1 -i error "$LOG/build_$name.log")"
    fi
done

# Every tree must complete a prompt with the same greedy text as this one (the benchmarks
# compare speed only: a faster tree that computes something else is wrong, not faster).
if [ "${#AB_TREES[@]}" -gt 0 ]; then
    STORIES=$WORK/stories260K-f16.bin
    python3 convert/convert.py gpu_data/shared/models/stories260K -o "$STORIES" --dtype f16 \
        >/dev/null 2>&1
    greedy() { "$1" run "$STORIES" --device cuda -p "Once upon a time" -n 60 --temp 0 2>/dev/null; }
    want=$(greedy build/barellm)
    [ -n "$want" ] || note "greedy text: this tree printed nothing (the comparisons are void)"
    for name in "${AB_TREES[@]}"; do
        if [ "$(greedy "$WORK/ab/$name/build/barellm")" = "$want" ]; then
            note "tree $name: same greedy text as this tree on stories260K"
        else
            note "tree $name: DIFFERENT greedy text from this tree on stories260K"
        fi
    done
fi

step "cuda_kernel_check --bench"
timeout 240 build/cuda_kernel_check --bench >"$LOG/kernel_check.log" 2>&1
note "cuda_kernel_check: $(tail -1 "$LOG/kernel_check.log")"
grep "^|" "$LOG/kernel_check.log" >"$LOG/kernel_bench.md"

# The matvec designs (by default only without trees to compare: the run has 10 minutes).
MATVEC_VARIANTS=${MATVEC_VARIANTS:-$([ "${#AB_TREES[@]}" -eq 0 ] && echo 1 || echo 0)}
if [ "$MATVEC_VARIANTS" = 1 ]; then
step "scripts/matvec_variants.cu"
if nvcc -std=c++17 -O3 -arch="sm_${CUDA_ARCHS%% *}" -Isrc -Ikernels $CPPFLAGS_EXTRA \
    scripts/matvec_variants.cu build/src/safetensors.o -o build/matvec_variants \
    >"$LOG/matvec_variants_build.log" 2>&1; then
    timeout 120 build/matvec_variants >"$LOG/matvec_variants.md" 2>&1
    note "matvec_variants: exit $? ($(tail -1 "$LOG/matvec_variants.md"))"
else
    note "matvec_variants: build failed: $(grep -m1 error "$LOG/matvec_variants_build.log")"
fi
fi

step "tests/test_cuda.py, tests/test_ladder.py -k gpu"
XDIST=""
python3 -c "import xdist" 2>/dev/null && XDIST="-n 8"
# (cuda_kernel_check ran above: its pytest wrapper is left out.)
OMP_NUM_THREADS=2 timeout 200 python3 -m pytest -q -rs $XDIST tests/test_cuda.py \
    tests/test_ladder.py -k "test_cuda or gpu" \
    --deselect tests/test_cuda.py::test_every_kernel_matches_the_cpu_kernels \
    >"$LOG/test_cuda.log" 2>&1
note "test_cuda.py + test_ladder.py -k gpu: $(tail -1 "$LOG/test_cuda.log")"
grep -E "^FAILED|relative error" "$LOG/test_cuda.log" | head -5

wait_for_mistral_checkpoint 420
[ -f "$MISTRAL" ] || { cat "$LOG/kernel_bench.md"; exit 1; }

step "decode benchmarks"
# The device tool kills the run at 600 s, before the logs are archived: no run starts late.
bench() {  # NAME BINARY ENV... : one bench line into the summary (N tokens, REPS repetitions)
    local name=$1 binary=$2; shift 2
    local estimate=$((N * REPS / 120 + 15))  # seconds: about 140 tok/s, and the load
    [ "$((SECONDS + estimate))" -lt 570 ] || { note "bench $name: skipped (time)"; return; }
    env "$@" "$binary" bench "$MISTRAL" --device cuda -p 0 -n "$N" -r "$REPS" \
        >"$LOG/bench_$name.md" 2>&1
    note "bench $name: $(grep "| tg" "$LOG/bench_$name.md" | cut -d'|' -f8-10) $(grep -o "copy, same run): [0-9.]* GB/s" "$LOG/bench_$name.md")"
}
if [ "${#AB_TREES[@]}" -gt 0 ]; then
    for round in 1 2; do
        for name in "${AB_TREES[@]}"; do
            N=128 REPS=3 bench "tg128-$name-$round" "$WORK/ab/$name/build/barellm"
        done
        N=128 REPS=3 bench "tg128-this-$round" build/barellm
    done
    for name in "${AB_TREES[@]}" this; do
        binary=build/barellm
        [ "$name" = this ] || binary=$WORK/ab/$name/build/barellm
        N=4096 REPS=1 bench "tg4096-$name" "$binary"
    done
else
    N=128 REPS=3 bench tg128-graph build/barellm BARELLM_CUDA_GRAPHS=1
    N=128 REPS=3 bench tg128-no-graph build/barellm BARELLM_CUDA_GRAPHS=0
    N=4096 REPS=3 bench tg4096-graph build/barellm BARELLM_CUDA_GRAPHS=1
fi

if [ "${PROFILE_NCU:-0}" = 1 ]; then
step "ncu: two decode steps without the graph"
BARELLM_CUDA_GRAPHS=0 timeout 150 ncu --clock-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv \
    --page raw build/barellm bench "$MISTRAL" --device cuda -p 0 -n 1 -r 1 \
    >"$LOG/ncu.csv" 2>"$LOG/ncu.err"
note "ncu exit $? ($(wc -l <"$LOG/ncu.csv") lines)"
python3 - "$LOG/ncu.csv" <<'EOF' | tee -a "$SUMMARY"
import collections, csv, io, sys
text = open(sys.argv[1], errors="replace").read()
rows = list(csv.reader(io.StringIO(text[text.find('"ID"'):])))
if len(rows) < 3:
    sys.exit("no ncu rows")
header, units = rows[0], rows[1]
col = {name: i for i, name in enumerate(header)}
scale = {"ns": 1e-3, "us": 1, "ms": 1e3, "nsecond": 1e-3, "usecond": 1, "msecond": 1e3,
         "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}
def value(row, name):  # in us or bytes
    i = col[name]
    return float(row[i].replace(",", "")) * scale[units[i]]
# Two decode steps ran (the warm-up and the timed one): halve the totals.
per_kernel = collections.defaultdict(lambda: [0, 0.0, 0.0])
for row in rows[2:]:
    name = row[col["Kernel Name"]].split("(")[0].split("<")[0].replace("void ", "")
    k = per_kernel[name]
    k[0] += 1
    k[1] += value(row, "gpu__time_duration.sum")
    k[2] += value(row, "dram__bytes_read.sum") + value(row, "dram__bytes_write.sum")
total = sum(k[1] for k in per_kernel.values()) / 2
print(f"\nkernels of one decode step (ncu, no graph): {total:.0f} us in all")
print("| kernel | calls | us | % | GB/s |\n| --- | ---: | ---: | ---: | ---: |")
for name, (calls, us, nbytes) in sorted(per_kernel.items(), key=lambda kv: -kv[1][1]):
    print(f"| {name} | {calls // 2} | {us / 2:.0f} | {100 * us / 2 / total:.1f} | "
          f"{nbytes / us / 1e3 if us else 0:.0f} |")
EOF
fi

echo
echo "==== summary (${SECONDS}s)"
cat "$LOG/kernel_bench.md"
grep "^|" "$LOG/matvec_variants.md" 2>/dev/null
cat "$SUMMARY"
