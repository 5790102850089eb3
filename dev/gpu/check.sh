#!/usr/bin/env bash
# The CUDA backend on a GPU machine: builds it for the local GPU, checks it against the CPU
# backend and Hugging Face transformers, measures decode speed and the GPU ladder, and
# prints a summary table last. Its results are in docs/BENCHMARKS.md.
#
#   dev/gpu/check.sh --stage          here first: what the GPU machine cannot fetch
#   bash dev/gpu/check.sh [STEP...]   on the GPU machine, from the repository root
#
# The GPU machine reaches neither ../shared nor a package registry: --stage copies
# stories260K, the llama2 tokenizer (the Mistral-7B preset's), the smollm2-135m tokenizer
# (the Qwen3-8B preset's), the eval texts and the nlohmann/json headers into gpu_data/
# (git-ignored), which must travel with the tree (the device tool: carry ["gpu_data"]), and,
# for the prefill step, llama.cpp's sources with the gguf package (the PyPI source
# distribution of llama-cpp-python, less what a CUDA build of its tools does not read: about
# 6 MB instead of 75).
#
# The build (barellm, dump_logits, cuda_kernel_check) always runs; then the STEPs, in this
# order (default: kernels tests transformers decode ladder):
#   kernels       build/cuda_kernel_check --bench: every kernel against the CPU kernels,
#                 then the hot kernels' time and bandwidth at Mistral-7B's shapes
#   tests         tests/test_cuda.py (CUDA logits against CPU logits at every position)
#                 and tests/test_ladder.py -k gpu (every GPU rung gives the fast path's text)
#   transformers  CUDA logits against transformers' (dev/gpu/transformers_logits.py) on
#                 the synthetic Llama/Mistral and Qwen2/Qwen3 shapes of tests/test_cuda.py
#   decode        `barellm bench --device cuda -p 0` on stories260K (f16, q8, q4) and on a
#                 Mistral-7B-shaped f16 checkpoint (convert/synth.py), at short and long
#                 context
#   quantized     the same on Mistral-7B-shaped q4 and q8 checkpoints (convert.py --dtype
#                 q4 / q8 of the Mistral-7B Hugging Face checkpoint below, kept in $WORK;
#                 writing them takes minutes: run it alone, e.g.
#                 `bash dev/gpu/check.sh quantized`)
#   ladder        `barellm ladder --device cuda -n 64` on the same two models
#   prefill       batched prompt processing: `barellm bench --device cuda` pp4/16/64 (against
#                 tg, token by token) and pp512 on the Mistral-7B shape in f16 and bf16,
#                 alternated with llama.cpp's CUDA llama-bench on a GGUF of the same
#                 weights (scripts/gguf_from_hf.py) when gpu_data/llamacpp/ holds its
#                 sources (--stage puts them there): built in the background with
#                 scripts/build_llamacpp.sh --cuda as soon as the script starts, into
#                 $WORK/llamacpp, where later runs find it (the build takes minutes: a
#                 first run may report llama.cpp as not ready yet); pp16 and pp512 of the
#                 q8/q4 checkpoints where the quantized step has written them
#   ab            decode speed of other trees beside this one, alternated in one run: each
#                 gpu_data/ab/NAME.tgz (made here by `git archive -o gpu_data/ab/NAME.tgz
#                 REV`) is built and must give this tree's greedy text first; run it alone
#   qwen3-8b      `barellm bench --device cuda -p 0` on a Qwen3-8B-shaped f16 checkpoint
#                 (convert/synth.py --preset qwen3-8b: 16.4 GB, written twice, a few minutes
#                 in the foreground), at short and long context; not a default step, run it
#                 alone
#   llama3-prefill  pp512 of a Llama-3-8B-shaped f16 checkpoint (convert/synth.py --preset
#                 llama3-8b, its barellm file and GGUF: 48 GiB, so on a machine without the
#                 Mistral-7B files) alternated with llama.cpp's; not a default step, run it
#                 alone (a second run goes on from the files the first one wrote)
# The Mistral-7B checkpoint (13.5 GiB, written twice) is made in the background while the
# first steps run, and kept in $WORK. The disk (64 GiB) holds it with the q8 and q4 ones and
# the prefill step's f16 GGUF, not the bf16 pair (file and GGUF) too: a step that would write
# past the free space notes its skip instead. The default steps take about 6-8 minutes on an H100;
# the checks and tests are cut to end by DEADLINE seconds and no long run starts too late to
# end by then (the device tool stops a command at 600, and the summary comes at the end).
#
# Logs go to $WORK/logs; when OUT is set, they are also archived in $OUT/gpu_logs.tgz, and
# the summary, the kernel timings and the ladder tables copied beside it as *.md (the
# device tool brings back at most 8 files). Environment: CUDA_ARCHS (default 90), WORK
# (default /tmp/barellm-gpu), DEADLINE (default 540).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

if [ "${1:-}" = "--stage" ]; then
    shared=${SHARED:-../shared}
    rm -rf gpu_data/shared gpu_data/include
    mkdir -p gpu_data/shared/models gpu_data/shared/tokenizers gpu_data/include
    cp -r "$shared/models/stories260K" gpu_data/shared/models/
    cp -r "$shared/tokenizers/llama2" "$shared/tokenizers/smollm2-135m" \
        gpu_data/shared/tokenizers/
    cp -r "$shared/eval" gpu_data/shared/  # tests/test_cuda.py's ppl comparison
    [ -d /usr/include/nlohmann ] && cp -r /usr/include/nlohmann gpu_data/include/
    version=${LLAMACPP_VERSION:-0.3.36}
    name=llama_cpp_python-$version
    vendored=$name/vendor/llama.cpp
    download=$(mktemp -d)
    if python3 -m pip download -q --no-binary :all: --no-deps -d "$download" \
        "llama-cpp-python==$version" && tar -xzf "$download/$name.tar.gz" -C "$download"; then
        excluded=(models docs media benches tests examples tools/ui)
        for backend in cann et hexagon metal opencl openvino sycl virtgpu vulkan webgpu; do
            excluded+=("ggml/src/ggml-$backend")
        done
        rm -rf gpu_data/llamacpp && mkdir -p gpu_data/llamacpp
        tar -czf "gpu_data/llamacpp/$name.tar.gz" -C "$download" \
            "${excluded[@]/#/--exclude=$vendored/}" "$vendored"
    else
        echo "check.sh --stage: no llama.cpp sources: the prefill step will time barellm alone"
    fi
    rm -rf "$download"
    du -sh gpu_data
    exit 0
fi

STEPS=${*:-kernels tests transformers decode ladder}
for name in $STEPS; do
    case $name in
        kernels | tests | transformers | decode | quantized | ladder | prefill | ab | qwen3-8b | \
            llama3-prefill) ;;
        *) echo "check.sh: unknown step '$name' (see the header of $0)" >&2; exit 2 ;;
    esac
done
ROOT=$PWD
WORK=${WORK:-/tmp/barellm-gpu}
LOG=$WORK/logs
CUDA_ARCHS=${CUDA_ARCHS:-90}
DEADLINE=${DEADLINE:-540}
rm -rf "$LOG" && mkdir -p "$LOG"
SUMMARY=$LOG/summary.md
RESULTS=$LOG/bench_results.jsonl
: >"$RESULTS"
MISTRAL_PID=  # the process writing the Mistral-7B checkpoint, while it runs
finish() {
    if [ -n "$MISTRAL_PID" ] && kill -0 "$MISTRAL_PID" 2>/dev/null; then
        pkill -P "$MISTRAL_PID"
        kill "$MISTRAL_PID"
    fi
    python3 - "$RESULTS" <<'EOF' >>"$SUMMARY"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
if rows:
    print("\n| model | decode positions | tok/s | GB/s | % of the copy | copy GB/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
for r in rows:
    print(f"| {r['label']} | 0..{r['n_gen'] - 1} | {r['avg_ts']:.1f} ± {r['stddev_ts']:.1f} "
          f"| {r['gbps']:.0f} | {r['bw_pct']:.1f}% | {r['bandwidth_gbps']:.0f} |")
EOF
    echo
    echo "==== summary (${SECONDS}s)"
    cat "$SUMMARY"
    [ -s "$LOG/prefill.md" ] && cat "$LOG/prefill.md"
    if [ -n "${OUT:-}" ]; then
        cp "$LOG"/*.md "$OUT"/
        tar czf "$OUT/gpu_logs.tgz" -C "$WORK" logs
    fi
}
trap finish EXIT
export PYTHONUNBUFFERED=1
# A note goes to the summary at once, so that a run cut off still leaves what it found (with
# OUT set, into $OUT too: a command the device tool stops at its limit still brings it back).
note() {
    echo "== $1"
    echo "- $1" >>"$SUMMARY"
    if [ -n "${OUT:-}" ]; then cp "$SUMMARY" "$OUT/"; fi
}
step() { echo; echo "==== [${SECONDS}s] $*"; }
wants() { [[ " $STEPS " == *" $1 "* ]]; }
# True when a run of about $1 seconds still ends before DEADLINE; else notes the skip of $2.
fits() {
    [ $((SECONDS + $1)) -lt "$DEADLINE" ] && return 0
    note "$2: skipped, ${SECONDS}s spent"
    return 1
}
# The time limit of a run of at most $1 seconds, cut to end by DEADLINE (at least 1 second:
# timeout 0 would not limit it).
capped() {
    local left=$((DEADLINE - SECONDS))
    echo $((left < $1 ? (left > 1 ? left : 1) : $1))
}
# True when the disk of $WORK has $1 GiB free; else notes the skip of $2.
disk_has() {
    local free
    free=$(df -BG --output=avail "$WORK" | tail -1 | tr -dc 0-9)
    [ "${free:-0}" -ge "$1" ] && return 0
    note "$2: skipped, ${free:-?} GiB free on the disk of $WORK"
    return 1
}
MISTRAL_GIB=14    # a Mistral-7B-shaped f16 or bf16 file, or its GGUF, rounded up
QWEN3_8B_GIB=16   # a Qwen3-8B-shaped f16 file, rounded up
LLAMA3_8B_GIB=16  # a Llama-3-8B-shaped f16 file, or its GGUF, rounded up
QUANTIZED_GIB=8   # a Mistral-7B-shaped q8 file, rounded up (q4: about half)

[ -e ../shared ] || [ ! -d gpu_data/shared ] || ln -s "$PWD/gpu_data/shared" ../shared
STORIES_HF=../shared/models/stories260K
[ -d "$STORIES_HF" ] || note "$STORIES_HF missing: run dev/gpu/check.sh --stage first"

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG/gpu.txt"
note "GPU: $(head -1 "$LOG/gpu.txt"), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

# The Mistral-7B-shaped checkpoint, written in the background unless it exists.
MISTRAL=$WORK/mistral-7b-f16.bin
# The Hugging Face checkpoint stays in $MISTRAL_HF for the prefill step (bf16 and GGUF
# files of the same weights).
MISTRAL_HF=$WORK/mistral-hf
if { wants decode || wants quantized || wants ladder || wants ab || wants prefill; } &&
    [ ! -f "$MISTRAL" ]; then
    (
        rm -rf "$MISTRAL_HF" &&
            python3 convert/synth.py --preset mistral-7b --dtype f16 -o "$MISTRAL_HF" &&
            python3 convert/convert.py "$MISTRAL_HF" -o "$MISTRAL.part" --dtype f16 &&
            mv "$MISTRAL.part" "$MISTRAL"
    ) >"$LOG/mistral_synth.log" 2>&1 &
    MISTRAL_PID=$!
fi
# Waits for the checkpoint while a run of $1 seconds would still fit; true when it exists.
mistral_ready() {
    while [ -n "$MISTRAL_PID" ] && kill -0 "$MISTRAL_PID" 2>/dev/null &&
        [ $((SECONDS + $1)) -lt "$DEADLINE" ]; do sleep 2; done
    [ -f "$MISTRAL" ] && return 0
    note "Mistral-7B checkpoint not ready at ${SECONDS}s: $(tail -1 "$LOG/mistral_synth.log")"
    return 1
}

# One architecture keeps nvcc fast; CPPFLAGS points at the staged nlohmann/json headers.
build() {  # DIRECTORY LOGFILE TARGET...
    local dir=$1 log=$2
    shift 2
    (cd "$dir" && make -j"$(nproc)" CUDA_ARCHS="$CUDA_ARCHS" CUDA_PTX_ARCH="${CUDA_ARCHS##* }" \
        CPPFLAGS="-I$ROOT/gpu_data/include" "$@") >"$log" 2>&1
}
step "build (CUDA_ARCHS=$CUDA_ARCHS)"
if ! build . "$LOG/build.log" build/barellm build/dump_logits build/cuda_kernel_check; then
    tail -30 "$LOG/build.log"
    note "build FAILED (build.log)"
    exit 1
fi
note "build: $(grep -ci warning "$LOG/build.log") warning lines"
if ! reason=$(build/dump_logits --check-cuda); then
    note "no usable CUDA GPU: $reason"
    exit 1
fi
# llama.cpp with CUDA for the prefill step, built in a session of its own: it outlives this
# command (the device tool lets such a process run on), so a later run finds it built. At
# the lowest priority, so that it disturbs this run's timings as little as it can (they are
# still best taken in a run after it has finished).
LLAMACPP=$WORK/llamacpp
if { wants prefill || wants llama3-prefill; } && [ ! -x "$LLAMACPP/bin/llama-bench" ]; then
    sources=(gpu_data/llamacpp/llama_cpp_python-*.tar.gz)
    if [ ! -f "${sources[0]}" ]; then
        note "llama.cpp: no sources in gpu_data/llamacpp (dev/gpu/check.sh --stage)"
    elif ! kill -0 "$(cat "$WORK/llamacpp_build.pid" 2>/dev/null)" 2>/dev/null; then
        setsid nohup nice -n 19 scripts/build_llamacpp.sh "$LLAMACPP" --sdist "${sources[0]}" \
            --cuda "$CUDA_ARCHS" -j "$(nproc)" >"$WORK/llamacpp_build.log" 2>&1 </dev/null &
        echo $! >"$WORK/llamacpp_build.pid"
        note "llama.cpp: CUDA build started in the background ($WORK/llamacpp_build.log)"
    fi
fi
python3 convert/convert.py "$STORIES_HF" -o "$WORK/stories260K-f16.bin" --dtype f16 >/dev/null
python3 convert/convert.py "$STORIES_HF" -o "$WORK/stories260K-f32.bin" --dtype f32 >/dev/null
for dtype in q8 q4; do
    python3 convert/convert.py "$STORIES_HF" -o "$WORK/stories260K-$dtype.bin" --dtype $dtype \
        >/dev/null 2>&1
done

if wants kernels && fits 60 "cuda_kernel_check"; then
    step "build/cuda_kernel_check --bench"
    timeout "$(capped 300)" build/cuda_kernel_check --bench >"$LOG/kernel_check.log" 2>&1
    status=$?
    grep -v "^PASS" "$LOG/kernel_check.log" | grep -v "^|" | head -40
    grep "^|" "$LOG/kernel_check.log" | tee "$LOG/kernel_bench.md"
    note "cuda_kernel_check: $(tail -1 "$LOG/kernel_check.log") (exit $status)"
fi

if wants tests && fits 60 "tests"; then
    step "tests/test_cuda.py, tests/test_ladder.py -k gpu"
    xdist=()
    python3 -c "import xdist" 2>/dev/null && xdist=(-n 8)
    # The kernels step already ran cuda_kernel_check, which one test wraps.
    deselect=()
    wants kernels &&
        deselect=(--deselect tests/test_cuda.py::test_every_kernel_matches_the_cpu_kernels)
    OMP_NUM_THREADS=2 timeout "$(capped 300)" python3 -m pytest -q -rs "${xdist[@]}" \
        "${deselect[@]}" tests/test_cuda.py >"$LOG/test_cuda.log" 2>&1
    note "tests/test_cuda.py: $(tail -1 "$LOG/test_cuda.log")"
    if fits 30 "tests/test_ladder.py -k gpu"; then
        timeout "$(capped 120)" python3 -m pytest -q -rs tests/test_ladder.py -k gpu \
            >"$LOG/test_ladder.log" 2>&1
        note "tests/test_ladder.py -k gpu: $(tail -1 "$LOG/test_ladder.log")"
    fi
    grep -h "^FAILED" "$LOG/test_cuda.log" "$LOG/test_ladder.log" 2>/dev/null | head -10
fi

if wants transformers; then
    step "CUDA logits against transformers (f32 weights and KV cache, 200 positions, decode" \
        "and one prefill batch)"
    ids=$(python3 -c "import numpy as np; \
print(','.join(map(str, np.random.default_rng(11).integers(0, 512, 200))))")
    IFS=, read -ra id_list <<<"$ids"
    for name in gqa-window wide-heads group-of-8 qwen2-window qwen2-tied qwen3 \
        qwen3-attention-bias; do
        fits 30 "transformers $name and the rest" || break
        dir=$WORK/hf-$name
        rm -rf "$dir" && mkdir -p "$dir"
        if python3 -c "import sys; sys.path[:0] = ['tests', 'reference']; import test_cuda; \
test_cuda.write_hf_checkpoint('$name', '$dir/hf', seed=7)" >/dev/null \
            2>>"$LOG/transformers_$name.err" &&
            python3 convert/convert.py "$dir/hf" -o "$dir/model.bin" --dtype f32 >/dev/null \
                2>>"$LOG/transformers_$name.err"; then
            for mode in decode prefill; do
                flags=()
                [ "$mode" = prefill ] && flags=(--prefill)
                result=
                build/dump_logits "$dir/model.bin" "$dir/cuda.logits" "${id_list[@]}" --kv f32 \
                    --device cuda "${flags[@]}" 2>>"$LOG/transformers_$name.err" &&
                    result=$(timeout "$(capped 120)" python3 dev/gpu/transformers_logits.py \
                        "$dir/hf" --ids "$ids" --compare "$dir/cuda.logits" \
                        2>>"$LOG/transformers_$name.err")
                note "transformers $name ($mode): ${result:-FAILED: \
$(tail -1 "$LOG/transformers_$name.err")}"
            done
        else
            note "transformers $name: no checkpoint: $(tail -1 "$LOG/transformers_$name.err")"
        fi
    done
fi

bench() {  # LABEL BINARY MODEL TOKENS REPETITIONS: one row of the summary table
    local label=$1 binary=$2 model=$3 n=$4 r=$5 json=$LOG/bench_$1_tg$4.json
    fits $((n * (r + 1) / 150 + 20)) "bench $label tg$n" || return 0
    if "$binary" bench "$model" --device cuda -p 0 -n "$n" -r "$r" -o json >"$json" \
        2>"$LOG/bench_$label.err"; then
        python3 -c "import json, sys; [print(json.dumps({**row, 'label': sys.argv[2]})) \
for row in json.load(open(sys.argv[1]))]" "$json" "$label" >>"$RESULTS"
    else
        note "bench $label tg$n FAILED: $(tail -1 "$LOG/bench_$label.err")"
    fi
}

if wants decode; then
    step "decode"
    bench stories260K-f16 build/barellm "$WORK/stories260K-f16.bin" 128 5
    bench stories260K-f16 build/barellm "$WORK/stories260K-f16.bin" 512 3
    bench stories260K-q8 build/barellm "$WORK/stories260K-q8.bin" 128 5
    bench stories260K-q4 build/barellm "$WORK/stories260K-q4.bin" 128 5
    if mistral_ready 90; then
        bench mistral-7b-f16 build/barellm "$MISTRAL" 128 3
        bench mistral-7b-f16 build/barellm "$MISTRAL" 4096 1
    fi
fi

if wants quantized; then
    step "quantized decode (Mistral-7B shape, q4 and q8)"
    # Converted from $MISTRAL_HF (the weights of the f16 checkpoint: one copy on the disk).
    for dtype in q4 q8; do
        model=$WORK/mistral-7b-$dtype.bin
        if [ ! -f "$model" ] && mistral_ready 300 && fits 300 "mistral-7b $dtype checkpoint" &&
            disk_has "$QUANTIZED_GIB" "mistral-7b $dtype checkpoint"; then
            python3 convert/convert.py "$MISTRAL_HF" -o "$model.part" --dtype $dtype &&
                mv "$model.part" "$model"
        fi >>"$LOG/quantized_synth.log" 2>&1
        if [ -f "$model" ]; then
            bench mistral-7b-$dtype build/barellm "$model" 128 3
        else
            note "mistral-7b $dtype: no checkpoint: $(tail -1 "$LOG/quantized_synth.log")"
        fi
    done
fi

if wants ladder; then
    step "GPU ladder"
    for model in "$WORK/stories260K-f32.bin" "$MISTRAL"; do
        label=$(basename "$model" .bin)
        [ "$model" = "$MISTRAL" ] && ! mistral_ready 150 && continue
        fits 150 "ladder $label" || continue
        if timeout 150 build/barellm ladder "$model" --device cuda -n 64 >"$LOG/ladder_$label.md" \
            2>"$LOG/ladder_$label.err"; then
            cat "$LOG/ladder_$label.md"
            rungs=$(grep '^| [0-9]' "$LOG/ladder_$label.md")
            note "ladder $label: $(wc -l <<<"$rungs") rungs, the last: $(tail -1 <<<"$rungs")"
        else
            note "ladder $label FAILED: $(tail -1 "$LOG/ladder_$label.err")"
        fi
    done
fi

PREFILL=$LOG/prefill.jsonl
: >"$PREFILL"
# Appends the rows of a JSON array of bench results (barellm's or llama-bench's) to PREFILL.
prefill_rows() {  # JSON MODEL_LABEL TOOL ROUND
    python3 -c "import json, sys; [print(json.dumps({**row, 'label': sys.argv[2], \
'tool': sys.argv[3], 'round': sys.argv[4]})) for row in json.load(open(sys.argv[1]))]" "$@" \
        >>"$PREFILL"
}
barellm_prefill() {  # LABEL MODEL ROUND BENCH_ARGS...
    local label=$1 model=$2 round=$3 json=$LOG/prefill_$1_$3.json
    shift 3
    fits 60 "barellm prefill $label $*" || return 0
    if build/barellm bench "$model" --device cuda "$@" -o json >"$json" \
        2>"$LOG/prefill_$label.err"; then
        prefill_rows "$json" "$label" barellm "$round"
    else
        note "barellm prefill $label $* FAILED: $(tail -1 "$LOG/prefill_$label.err")"
    fi
}
llamacpp_prefill() {  # LABEL GGUF ROUND
    local label=$1 json=$LOG/prefill_$1_$3_llamacpp.json
    fits 60 "llama.cpp prefill $label" || return 0
    if "$LLAMACPP/bin/llama-bench" -m "$2" -p 512 -n 0 -r 3 -ngl 99 -o json >"$json" \
        2>"$LOG/prefill_${label}_llamacpp.err"; then
        prefill_rows "$json" "$label" llama.cpp "$3"
    else
        note "llama.cpp prefill $label FAILED: $(tail -1 "$LOG/prefill_${label}_llamacpp.err")"
    fi
}
# Waits up to $1 seconds for the llama.cpp build; true when llama-bench is there.
llamacpp_ready() {
    local until=$((SECONDS + $1))
    while [ ! -x "$LLAMACPP/bin/llama-bench" ] && [ $SECONDS -lt $until ] &&
        kill -0 "$(cat "$WORK/llamacpp_build.pid" 2>/dev/null)" 2>/dev/null; do sleep 5; done
    [ -x "$LLAMACPP/bin/llama-bench" ] && return 0
    note "llama.cpp not built yet at ${SECONDS}s: $(tail -1 "$WORK/llamacpp_build.log" 2>/dev/null)"
    return 1
}
# A GGUF of a Hugging Face checkpoint, through the gguf package of the staged llama.cpp
# sources (scripts/gguf_from_hf.py).
gguf_from_hf() {  # HF_DIR OUT TYPE GIB
    [ -f "$2" ] && return 0
    local gguf_py=("$LLAMACPP"/llama_cpp_python-*/vendor/llama.cpp/gguf-py) name log
    name=$(basename "$2")
    log=$LOG/gguf_$name.log
    fits 150 "GGUF $name" && disk_has "$4" "GGUF $name" &&
        PYTHONPATH=${gguf_py[0]} python3 scripts/gguf_from_hf.py "$1" -o "$2.part" \
            --type "$3" >"$log" 2>&1 && mv "$2.part" "$2" && return 0
    note "$name not written: $(tail -1 "$log" 2>/dev/null)"
    return 1
}
# The prefill rows gathered so far as a table: barellm against llama.cpp, round by round.
prefill_table() {
    python3 - "$PREFILL" <<'EOF' | tee "$LOG/prefill.md"
import json, sys
from collections import defaultdict
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
speed = defaultdict(list)  # (model, test, tool) -> t/s of each round
for r in rows:
    test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
    speed[(r["label"], test, r["tool"])].append(r["avg_ts"])
print("| model | test | barellm t/s | llama.cpp t/s | barellm / llama.cpp, by round |")
print("| --- | --- | ---: | ---: | ---: |")
for (label, test, tool), ours in speed.items():
    if tool != "barellm":
        continue
    theirs = speed.get((label, test, "llama.cpp"), [])
    ratios = " / ".join(f"{a / b:.2f}" for a, b in zip(ours, theirs))
    theirs_mean = f"{sum(theirs) / len(theirs):.0f}" if theirs else ""
    print(f"| {label} | {test} | {sum(ours) / len(ours):.0f} | {theirs_mean} | {ratios} |")
EOF
    note "prefill: $(grep -c -E '^\| .* \| (pp|tg)[0-9]+ \|' "$LOG/prefill.md") rows (prefill.md)"
}

if wants prefill && mistral_ready 120; then
    step "prefill: batched pp4/16/64 against tg; pp512 f16 and bf16 against llama.cpp"
    for p in 4 16 64; do barellm_prefill mistral-7b-f16 "$MISTRAL" small -p "$p" -n 0 -r 3; done
    barellm_prefill mistral-7b-f16 "$MISTRAL" small -p 0 -n 64 -r 3
    for dtype in f16 bf16; do
        model=$WORK/mistral-7b-$dtype.bin gguf=$WORK/mistral-7b-$dtype.gguf
        if [ ! -f "$model" ] && fits 150 "convert $dtype" &&
            disk_has $((2 * MISTRAL_GIB)) "convert $dtype (and its GGUF)"; then
            python3 convert/convert.py "$MISTRAL_HF" -o "$model.part" --dtype "$dtype" \
                >"$LOG/convert_$dtype.log" 2>&1 && mv "$model.part" "$model"
        fi
        [ -f "$model" ] || continue
        with_llamacpp=0
        llamacpp_ready 60 && gguf_from_hf "$MISTRAL_HF" "$gguf" "$dtype" "$MISTRAL_GIB" &&
            with_llamacpp=1
        for round in 1 2; do
            barellm_prefill "mistral-7b-$dtype" "$model" "$round" -p 512 -n 0 -r 3
            [ $with_llamacpp = 1 ] && llamacpp_prefill "mistral-7b-$dtype" "$gguf" "$round"
        done
        # The disk holds the f16 files and one more pair at a time.
        [ "$dtype" = f16 ] || rm -f "$model"
        rm -f "$gguf"
    done
    # q8 and q4 (the quantized GEMM), on the checkpoints the quantized step keeps in $WORK.
    for dtype in q8 q4; do
        model=$WORK/mistral-7b-$dtype.bin
        [ -f "$model" ] || continue
        for p in 16 512; do barellm_prefill "mistral-7b-$dtype" "$model" 1 -p "$p" -n 0 -r 3; done
    done
    prefill_table
fi

if wants ab; then
    step "A/B: gpu_data/ab/*.tgz beside this tree"
    greedy() {  # BINARY: its greedy completion on stories260K
        "$1" run "$WORK/stories260K-f16.bin" --device cuda -p "Once upon a time" -n 60 --temp 0 \
            2>/dev/null
    }
    want=$(greedy build/barellm)
    trees=()
    for archive in gpu_data/ab/*.tgz; do
        [ -f "$archive" ] || continue
        name=$(basename "$archive" .tgz)
        tree=$WORK/ab/$name
        rm -rf "$tree" && mkdir -p "$tree" && tar xzf "$archive" -C "$tree"
        if ! build "$tree" "$LOG/build_$name.log" build/barellm; then
            note "tree $name: build FAILED: $(grep -m1 -i error "$LOG/build_$name.log")"
        elif [ "$(greedy "$tree/build/barellm")" != "$want" ]; then
            note "tree $name: greedy text differs from this tree's on stories260K: not timed"
        else
            note "tree $name: the same greedy text as this tree on stories260K"
            trees+=("$name")
        fi
    done
    if [ "${#trees[@]}" -gt 0 ] && mistral_ready 120; then
        for round in 1 2; do
            for name in "${trees[@]}"; do
                bench "$name-$round" "$WORK/ab/$name/build/barellm" "$MISTRAL" 128 3
            done
            bench "this-$round" build/barellm "$MISTRAL" 128 3
        done
        for name in "${trees[@]}"; do
            bench "$name" "$WORK/ab/$name/build/barellm" "$MISTRAL" 4096 1
        done
        bench this build/barellm "$MISTRAL" 4096 1
    fi
fi

if wants qwen3-8b; then
    step "decode at Qwen3-8B's shape"
    QWEN3=$WORK/qwen3-8b-f16.bin
    if [ ! -f "$QWEN3" ] && fits 420 "Qwen3-8B checkpoint" &&
        disk_has $((2 * QWEN3_8B_GIB)) "Qwen3-8B checkpoint"; then
        rm -rf "$WORK/qwen3-hf" &&
            python3 convert/synth.py --preset qwen3-8b --dtype f16 -o "$WORK/qwen3-hf" &&
            python3 convert/convert.py "$WORK/qwen3-hf" -o "$QWEN3.part" --dtype f16 &&
            mv "$QWEN3.part" "$QWEN3" && rm -rf "$WORK/qwen3-hf"
    fi >"$LOG/qwen3_synth.log" 2>&1
    if [ -f "$QWEN3" ]; then
        note "Qwen3-8B checkpoint ready at ${SECONDS}s"
        bench qwen3-8b-f16 build/barellm "$QWEN3" 128 3
        bench qwen3-8b-f16 build/barellm "$QWEN3" 4096 1
    else
        note "Qwen3-8B checkpoint not made: $(tail -1 "$LOG/qwen3_synth.log")"
    fi
fi

if wants llama3-prefill; then
    step "prefill at Llama-3-8B's shape: pp512 f16 against llama.cpp"
    LLAMA3_HF=$WORK/llama3-hf LLAMA3=$WORK/llama3-8b-f16.bin
    if [ ! -f "$LLAMA3" ] && fits 420 "Llama-3-8B checkpoint" &&
        disk_has $((3 * LLAMA3_8B_GIB)) "Llama-3-8B checkpoint, its barellm file and GGUF"; then
        { [ -d "$LLAMA3_HF" ] || { rm -rf "$LLAMA3_HF.part" && python3 convert/synth.py \
            --preset llama3-8b --dtype f16 -o "$LLAMA3_HF.part" &&
            mv "$LLAMA3_HF.part" "$LLAMA3_HF"; }; } &&
            python3 convert/convert.py "$LLAMA3_HF" -o "$LLAMA3.part" --dtype f16 &&
            mv "$LLAMA3.part" "$LLAMA3"
    fi >"$LOG/llama3_synth.log" 2>&1
    if [ -f "$LLAMA3" ]; then
        with_llamacpp=0
        llamacpp_ready 60 && gguf_from_hf "$LLAMA3_HF" "$WORK/llama3-8b-f16.gguf" f16 \
            "$LLAMA3_8B_GIB" && with_llamacpp=1
        for round in 1 2; do
            barellm_prefill llama3-8b-f16 "$LLAMA3" "$round" -p 512 -n 0 -r 3
            [ $with_llamacpp = 1 ] &&
                llamacpp_prefill llama3-8b-f16 "$WORK/llama3-8b-f16.gguf" "$round"
        done
        prefill_table
    else
        note "Llama-3-8B checkpoint not made: $(tail -1 "$LOG/llama3_synth.log")"
    fi
fi
