#!/usr/bin/env bash
# The CUDA backend checked and timed on a machine with an NVIDIA GPU: builds it for that GPU,
# checks every kernel and the logits against the CPU backend (and Hugging Face
# transformers), measures prefill and decode against llama.cpp's CUDA build on the same
# weights, and prints a summary table last. Its results are in docs/BENCHMARKS.md.
#
#   dev/gpu/check.sh --stage          first, on a machine with ../shared and a network
#   bash dev/gpu/check.sh [STEP...]   on the GPU machine, from the repository root
#
# What the GPU machine needs: the CUDA toolkit (nvcc, and Nsight Compute for the *-ncu
# steps), a C++ compiler, Python 3 with numpy and pytest (torch and transformers for the
# transformers and logits-7b steps), OpenSSL's and zlib's shared libraries, and gpu_data/
# (git-ignored) from --stage: stories260K, the llama2, smollm2-135m and gemma3 tokenizers
# (the presets'), the eval texts, the nlohmann/json headers (those in data.tar.xz, unpacked
# here), cpp-httplib (`barellm serve`; Debian's libcpp-httplib-dev: its header with the
# OpenSSL, zlib and Brotli headers it includes, in data.tar.xz too, its shared library and
# Brotli's, which the build links with an rpath), the `openai` package's wheels and those
# of its dependencies (WHEELS, for Python 3.12; the serve step), GNU time, and llama.cpp's
# CUDA tools (llama-server among them) with the gguf Python package of the same sources, packed
# into gpu_data/llamacpp-cuda.tar.xz. --stage builds those tools (scripts/build_llamacpp.sh
# --cuda 90 --portable, into $LLAMACPP_CUDA, default ../llamacpp-cuda: about 35 minutes on
# 2 cores the first time); they link the toolkit's cuBLAS, so the GPU machine needs the
# same major CUDA version (13). Without them every step times barellm alone.
#
# Time: the default steps (kernels tests compare) take about 5 minutes on an H100 or H200,
# the build and the Mistral-7B files included. Every step is cut to end by DEADLINE
# (seconds, default 540): one that would end later is skipped with a note, so raise it to
# run more steps at once. Files made in $WORK are kept for the next run (e.g.
# `DEADLINE=250 bash dev/gpu/check.sh qwen3-8b` after the default steps, about 80 s).
#
# What it prints: each step's heading with the seconds spent ("==== [42s] ..."), a line per
# finding ("== ..."), failures and timing tables as they come, and last the summary: the
# GPU, the findings, a table of every `barellm bench` row (tok/s, GB/s, share of the copy
# bandwidth) and the comparisons with llama.cpp (scripts/compare_llamacpp.py's tables).
# Logs go to $WORK/logs; with OUT=DIR the summary and tables (*.md) are also copied into
# DIR, the logs archived in DIR/gpu_logs.tgz.
#
# The build (barellm, dump_logits, cuda_kernel_check) always runs; then the STEPs, in this
# order (default: kernels tests compare):
#   kernels       build/cuda_kernel_check --bench: every kernel against the CPU kernels
#                 (prints the FAIL and SKIP lines and "N passed, M failed"; every check's
#                 line is in kernel_check.log), then a table of the hot kernels' time and
#                 bandwidth, and the GEMMs' TFLOPS and share of the tensor-core peak, at
#                 Mistral-7B's shapes (cut at 120 s)
#   gemm-tiles    dev/gpu/gemm_tiles.cu: the f16 GEMM kernels with each tile shape (the
#                 warpgroup GEMM's among them), at Mistral-7B's matrices (Hopper only; about
#                 a minute)
#   gemm-ncu      after gemm-tiles: Nsight Compute's report (stall reasons, throughputs) on
#                 the large tiles and the warpgroup GEMM's tiles gemm takes at wo's shape on
#                 an H200 (192 rows, clusters of 2 x 2) (about 90 s)
#   matvec-ncu    Nsight Compute's report on the Q4 matvec (one row per warp, Mistral-7B's
#                 w2 with the residual) and the Q4 SwiGLU matvec, their first launches in
#                 `cuda_kernel_check --bench-only` (about 90 s)
#   tests         tests/test_cuda.py (CUDA logits against CPU logits at every position),
#                 tests/test_ladder.py -k gpu (every GPU rung gives the fast path's text)
#                 and the GPU cases of the i-quant, MXFP4 and ternary files' tests (with
#                 llama.cpp's gguf package), cut at 180, 30 and 90 s
#   compare       Mistral-7B shape: scripts/compare_llamacpp.py --device cuda (pp512 and
#                 tg128, 2 alternated rounds) on the f16 and q4 pairs (barellm file and
#                 GGUF of the same weights: llama.cpp's Q4_0 is barellm's q4), then barellm
#                 alone on q8 (tg128) and the f16 file's pp16/pp64 against tg64 (a short
#                 prompt must not be slower than decoding it)
#   quantized     the compare step's quantized rows alone: q4 against llama.cpp (pp512,
#                 tg128) and q8 (tg128), without the f16 files (about 3 minutes with the build)
#   kquants       Mistral-7B shape in the file most people download: a Q4_K_M GGUF made by
#                 llama-quantize from the f16 GGUF, converted to barellm's file (every matrix
#                 keeps its block type), against llama.cpp (pp512, tg128, 2 alternated
#                 rounds; about 4 minutes with its files, which need llama.cpp staged)
#   bf16          the same comparison on a bf16 pair (pp512, tg128; about 4 minutes), the
#                 compare step's GGUF files and q8 file removed first to make room
#   transformers  CUDA logits against transformers' (dev/gpu/transformers_logits.py) on
#                 the synthetic Llama/Mistral and Qwen2/Qwen3 shapes of tests/test_cuda.py
#                 (about 35 s a checkpoint)
#   logits-7b     the Mistral-7B f16 file's prefill logits (512 tokens, f16 KV cache)
#                 against transformers' on the GPU in f32, within 1e-2 at every position
#                 (the Hugging Face checkpoint is then kept; about 2 minutes)
#   decode        `barellm bench --device cuda -p 0` on stories260K (f16, q8, q4) and on the
#                 Mistral-7B f16 file, at short and long context (tg128 after 4096
#                 positions, -d 4096)
#   ladder        `barellm ladder --device cuda -n 64` on stories260K and Mistral-7B f16
#   wgmma         the GEMMs with and without the warpgroup GEMM of sm_90a (gemm takes it
#                 where its grid fills the GPU; BARELLM_CUDA_WGMMA=0 turns it off, =always
#                 takes it everywhere): cuda_kernel_check without it (the kernels step checks
#                 it: every GEMM case on its tiles with each row count too, the gated form of
#                 the feed-forward), the prefill, ppl, Qwen and greedy-text tests of
#                 tests/test_cuda.py with =always (their models' grids are small), then pp512
#                 on the Mistral-7B f16 file without (=0) and with it, alternated, 2 rounds
#                 (about 3 minutes after the file)
#   pdl           decode with programmatic dependent launch (BARELLM_CUDA_PDL=1,
#                 kernels/dependent_launch.cuh): its tests in tests/test_cuda.py (logits
#                 equal to those without it; part of the tests step, run here without it),
#                 then tg128 on a Llama-3.2-1B-shaped f16 file (made here), the Mistral-7B
#                 f16 and q4 files (and the Q4_K_M file where the kquants step made it) with
#                 it off and on, alternated, 2 rounds (not yet timed on a GPU machine)
#   gemma3        Gemma 3 at the 1B and 4B shapes, Gemma 2 at the 2B shape and Phi-4-mini
#                 (convert/synth.py --preset gemma3-1b, gemma3-4b, gemma2-2b and phi4-mini,
#                 Gemma 3's vocabulary of 262,144 pieces; Phi-4-mini's partial rotary and
#                 LongRoPE): an f16 GGUF written by
#                 scripts/gguf_from_hf.py and llama-quantize's Q4_K_M of it, each converted
#                 to barellm's file, against llama.cpp (pp512, tg128, 2 alternated rounds).
#                 Not yet timed on a GPU machine: run it alone
#   moe           mixture of experts: the Qwen3-30B-A3B shape with its first 8 layers
#                 (convert/synth.py --preset qwen3-30b-a3b --layers 8: 5.61 B parameters, 2
#                 bytes each in f16), llama-quantize's Q4_K_M, Q4_0 and MXFP4_MOE (the
#                 experts in MXFP4, gpt-oss's type) of its f16 GGUF, each converted to
#                 barellm's file (every matrix in its type), against llama.cpp (pp512,
#                 tg128, 2 alternated rounds; the share of the copy counts the active
#                 experts' bytes); then the gpt-oss-20b shape with its first 8 layers
#                 (--preset gpt-oss-20b --layers 8, bf16) in llama-quantize's MXFP4_MOE, the
#                 same way. Not yet timed on a GPU machine: run it alone, on a
#                 machine without the Mistral-7B files; without llama.cpp, barellm's q4 of
#                 the Qwen3 checkpoint alone
#   serve         `barellm serve --device cuda` against `llama-server -np 32` (every layer on
#                 the GPU) on the Mistral-7B f16 file and its GGUF: 32 streaming clients of
#                 128 tokens each, 2 alternated rounds (scripts/load_test.py, on the `openai`
#                 package of the staged wheels; not yet timed on a GPU machine)
#   ab            prefill and decode speed (pp512 and tg128 on the Mistral-7B f16 and q4
#                 files, and the Q4_K_M file where the kquants step runs too) of other
#                 trees beside this one, alternated in one run: each
#                 gpu_data/ab/NAME.tgz (made by `git archive -o gpu_data/ab/NAME.tgz REV`)
#                 is built (a later run keeps the build of an unchanged archive) and must
#                 give this tree's greedy text first
#   qwen3-8b      `barellm bench --device cuda -p 0` on a Qwen3-8B-shaped f16 checkpoint at
#                 short and long context (-d 4096; 16.4 GB: run it alone)
#   llama3-prefill  pp512 of a Llama-3-8B-shaped f16 pair against llama.cpp (48 GiB of
#                 files: run it alone, on a machine without the Mistral-7B files)
# The Mistral-7B checkpoints are made in the background from the start, on every core, while
# the build and the first steps run: the Hugging Face f16 checkpoint (convert/synth.py), then
# at once the f16 barellm file, its f16 GGUF (compare), a Q4_0 GGUF (compare, quantized) and
# the q8 barellm file, then the q4 barellm file from the Q4_0 GGUF (bit for bit; without that
# GGUF, by convert.py), and for kquants a Q4_K_M GGUF quantized from the f16 GGUF and its
# barellm file; each only where a step wanted reads it. The Hugging Face checkpoint is
# removed once they are written (about 52 GiB at the peak, 45 kept in $WORK, for the compare
# step). Files the free disk
# cannot hold are left out, the least needed first, with a note; nothing is timed while
# they are being made.
#
# Environment: CUDA_ARCHS (default 90a), WORK (default /tmp/barellm-gpu), DEADLINE (default
# 540), OUT (unset: the logs stay in $WORK/logs only).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

# The wheels of the serve step's client: the `openai` package and what it needs, pinned.
WHEELS="openai==3.63.0 httpx2==2.17.0 httpcore2==2.17.0 h11==0.16.0 truststore==0.10.5
    anyio==4.16.0 idna==3.20 sniffio==1.3.1 jiter==0.19.0 pydantic==2.13.4 pydantic-core==2.46.4
    annotated-types==0.7.0 typing-inspection==0.4.2 typing-extensions==4.16.0"

# Unpacks the archive $1 into the folder $2 with Python's tarfile (the GPU machine's image
# may have no xz).
unpack() {
    python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], \
**({'filter': 'data'} if hasattr(tarfile, 'data_filter') else {}))" "$1" "$2"
}

if [ "${1:-}" = "--stage" ]; then
    shared=${SHARED:-../shared}
    # shared/ and include/ travel as one archive, gpu_data/data.tar.xz (text, a quarter of
    # their size), unpacked on the GPU machine.
    packed=$(mktemp -d)
    rm -rf gpu_data/shared gpu_data/include gpu_data/lib gpu_data/data.tar.xz
    mkdir -p "$packed/shared/models" "$packed/shared/tokenizers" "$packed/include" gpu_data/lib
    cp -r "$shared/models/stories260K" "$packed/shared/models/"
    # llama2: the Mistral-7B preset's; smollm2-135m: the Llama-3 and Qwen presets'; gemma3:
    # the Gemma 3 and Gemma 2 presets' (the gemma3 step).
    cp -r "$shared/tokenizers/llama2" "$shared/tokenizers/smollm2-135m" \
        "$shared/tokenizers/gemma3" "$packed/shared/tokenizers/"
    cp -r "$shared/eval" "$packed/shared/"  # tests/test_cuda.py's ppl comparison
    [ -d /usr/include/nlohmann ] && cp -r /usr/include/nlohmann "$packed/include/"
    # cpp-httplib as the Makefile builds against it: its header and the OpenSSL, zlib and
    # Brotli headers it includes with their defines (the Makefile's when pkg-config is
    # missing), and its library under its soname (the build adds the linker's name for it).
    multiarch=$(gcc -print-multiarch)
    httplib=$(realpath "/usr/lib/$multiarch/libcpp-httplib.so" 2>/dev/null)
    if [ -f /usr/include/httplib.h ] && [ -f "$httplib" ]; then
        for header in $(g++ -std=c++17 -M -DCPPHTTPLIB_OPENSSL_SUPPORT -DCPPHTTPLIB_ZLIB_SUPPORT \
            -DCPPHTTPLIB_BROTLI_SUPPORT -x c++ /usr/include/httplib.h | tr ' \\' '\n\n' |
            grep -E "^/usr/include/(httplib\.h|zlib\.h|zconf\.h|openssl/|brotli/|$multiarch/openssl/)"); do
            relative=${header#/usr/include/}
            relative=${relative#"$multiarch"/}
            mkdir -p "$packed/include/$(dirname "$relative")"
            cp "$header" "$packed/include/$relative"
        done
        cp "$httplib" "gpu_data/lib/$(objdump -p "$httplib" | awk '/SONAME/ {print $2}')"
        for lib in $(ldd "$httplib" | awk '/libbrotli/ {print $3}'); do
            cp -L "$lib" gpu_data/lib/
        done
    else
        echo "check.sh --stage: no cpp-httplib (apt-get install libcpp-httplib-dev): the GPU" \
            "machine's build needs it"
    fi
    tar -cJf gpu_data/data.tar.xz -C "$packed" shared include
    rm -rf "$packed"
    # The GPU image's Python (3.12) has no `openai` package.
    rm -rf gpu_data/wheels
    # shellcheck disable=SC2086  # one word per wheel
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d gpu_data/wheels $WHEELS ||
        echo "check.sh --stage: the wheels did not download: no serve step there"
    # compare_llamacpp.py reads each tool's peak memory from GNU time (libc only).
    mkdir -p gpu_data/bin && cp /usr/bin/time gpu_data/bin/time ||
        echo "check.sh --stage: no GNU time (apt-get install time): no comparison there"
    llamacpp=${LLAMACPP_CUDA:-../llamacpp-cuda}
    if [ ! -x "$llamacpp/bin/llama-bench" ]; then
        echo "check.sh --stage: building llama.cpp's CUDA tools into $llamacpp (about 35" \
            "minutes on 2 cores)"
        scripts/build_llamacpp.sh "$llamacpp" --cuda 90 --portable
    fi
    rm -rf gpu_data/llamacpp gpu_data/llamacpp-cuda.tar.xz
    if [ -x "$llamacpp/bin/llama-bench" ]; then
        # The binaries and the shared libraries beside them in the build tree; gguf-py from
        # the same sources.
        built=$(dirname "$(realpath "$llamacpp/bin/llama-bench")")
        packed=$(mktemp -d)
        mkdir -p "$packed/llamacpp-cuda/bin"
        cp -a "$built"/llama-bench "$built"/llama-perplexity "$built"/llama-simple \
            "$built"/llama-quantize "$built"/llama-server "$built"/*.so* \
            "$packed/llamacpp-cuda/bin/"
        cp -r "$built/../../gguf-py" "$packed/llamacpp-cuda/"
        tar -cJf gpu_data/llamacpp-cuda.tar.xz -C "$packed" llamacpp-cuda
        rm -rf "$packed"
    else
        echo "check.sh --stage: no llama.cpp: the comparisons will time barellm alone"
    fi
    du -sh gpu_data
    exit 0
fi

STEPS=${*:-kernels tests compare}
for name in $STEPS; do
    case $name in
        kernels | gemm-tiles | gemm-ncu | matvec-ncu | tests | compare | quantized | kquants | \
            bf16 | transformers | logits-7b | decode | ladder | wgmma | pdl | gemma3 | moe | \
            serve | ab | qwen3-8b | llama3-prefill) ;;
        *) echo "check.sh: unknown step '$name' (see the header of $0)" >&2; exit 2 ;;
    esac
done
ROOT=$PWD
WORK=${WORK:-/tmp/barellm-gpu}
LOG=$WORK/logs
CUDA_ARCHS=${CUDA_ARCHS:-90a}
DEADLINE=${DEADLINE:-540}
rm -rf "$LOG" && mkdir -p "$LOG"
SUMMARY=$LOG/summary.md
RESULTS=$LOG/bench_results.jsonl
: >"$RESULTS"
MODELS_PID=  # the process making the Mistral-7B files, while it runs
# Ends a process and every process it started (children from /proc, else pgrep).
kill_tree() {
    local child
    for child in $({ cat /proc/"$1"/task/*/children; pgrep -P "$1"; } 2>/dev/null | sort -u); do
        kill_tree "$child"
    done
    kill "$1" 2>/dev/null
}
finish() {
    [ -n "$MODELS_PID" ] && kill_tree "$MODELS_PID"
    python3 - "$RESULTS" <<'EOF' >>"$SUMMARY"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
if rows:
    print("\n| model (barellm alone) | test | tok/s | GB/s | % of the copy | copy GB/s |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
for r in rows:
    test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
    if r.get("n_depth"):
        test += f" @ d{r['n_depth']}"
    print(f"| {r['label']} | {test} | {r['avg_ts']:.1f} ± {r['stddev_ts']:.1f} "
          f"| {r['gbps']:.0f} | {r['bw_pct']:.1f}% | {r['bandwidth_gbps']:.0f} |")
EOF
    echo
    echo "==== summary (${SECONDS}s)"
    cat "$SUMMARY"
    for table in "$LOG"/compare_*.md; do [ -s "$table" ] && cat "$table"; done
    if [ -n "${OUT:-}" ]; then
        cp "$LOG"/*.md "$OUT"/
        tar czf "$OUT/gpu_logs.tgz" -C "$WORK" logs
    fi
}
trap finish EXIT
export PYTHONUNBUFFERED=1
# A note goes to the summary at once, so that a run cut off still leaves what it found (with
# OUT set, in $OUT too: a run stopped from outside leaves its findings there).
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
# The GiB free on the disk of $WORK.
free_gib() { df -BG --output=avail "$WORK" | tail -1 | tr -dc 0-9; }
# True when the disk of $WORK has $1 GiB free; else notes the skip of $2.
disk_has() {
    local free
    free=$(free_gib)
    [ "${free:-0}" -ge "$1" ] && return 0
    note "$2: skipped, ${free:-?} GiB free on the disk of $WORK"
    return 1
}
QWEN3_8B_GIB=16   # a Qwen3-8B-shaped f16 file, rounded up
LLAMA3_8B_GIB=16  # a Llama-3-8B-shaped f16 file, or its GGUF, rounded up

[ -d gpu_data/shared ] || [ ! -f gpu_data/data.tar.xz ] || unpack gpu_data/data.tar.xz gpu_data
[ -e ../shared ] || [ ! -d gpu_data/shared ] || ln -s "$PWD/gpu_data/shared" ../shared
STORIES_HF=../shared/models/stories260K
[ -d "$STORIES_HF" ] || note "$STORIES_HF missing: run dev/gpu/check.sh --stage first"

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG/gpu.txt"
note "GPU: $(head -1 "$LOG/gpu.txt"), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
note "host CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores"

# llama.cpp's CUDA tools and gguf package, staged by --stage (unpacked by Python's tarfile:
# the image may have no xz).
LLAMACPP=$WORK/llamacpp-cuda
LLAMA_BENCH=$LLAMACPP/bin/llama-bench
GGUF_PY=$LLAMACPP/gguf-py
if [ ! -d "$LLAMACPP" ] && [ -f gpu_data/llamacpp-cuda.tar.xz ]; then
    unpack gpu_data/llamacpp-cuda.tar.xz "$WORK"
fi
# Its cuBLAS: the toolkit's, else the one of the nvidia-cublas Python package.
cublas=$(find /usr/local/cuda*/ -name 'libcublas.so.13' 2>/dev/null | head -1)
[ -n "$cublas" ] || cublas=$(python3 -c "import glob, nvidia.cublas as c; \
print(glob.glob(c.__path__[0] + '/lib/libcublas.so.13')[0])" 2>/dev/null)
cublas_dir=$(dirname "${cublas:-/usr/local/cuda/lib64/libcublas.so.13}")
export LD_LIBRARY_PATH=$LLAMACPP/bin:$cublas_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export COMPARE_LLAMACPP_TIME=$ROOT/gpu_data/bin/time
PYTHONPATH=$GGUF_PY python3 -c "import gguf" >"$LOG/gguf_import.txt" 2>&1 || GGUF_PY=
if [ ! -x "$LLAMA_BENCH" ]; then
    note "llama.cpp: not staged (dev/gpu/check.sh --stage): barellm is timed alone"
    LLAMA_BENCH=
elif ! "$LLAMA_BENCH" --list-devices >"$LOG/llamacpp_devices.txt" 2>&1; then
    note "llama.cpp: llama-bench does not start: $(tail -1 "$LOG/llamacpp_devices.txt")"
    LLAMA_BENCH=
elif [ -z "$GGUF_PY" ]; then
    note "llama.cpp: its gguf package does not import ($(tail -1 "$LOG/gguf_import.txt")):" \
        "no GGUF, barellm is timed alone"
    LLAMA_BENCH=
elif [ ! -x "$COMPARE_LLAMACPP_TIME" ]; then
    note "llama.cpp: no GNU time staged (compare_llamacpp.py reads peak memory with it):" \
        "barellm is timed alone"
    LLAMA_BENCH=
else
    note "llama.cpp: $(grep -m1 -i 'cuda0' "$LOG/llamacpp_devices.txt" || echo 'no CUDA0 device')"
fi
# A GGUF of a Hugging Face checkpoint, through llama.cpp's own gguf package
# (scripts/gguf_from_hf.py).
gguf_from_hf() {  # HF_DIR OUT TYPE
    PYTHONPATH=$GGUF_PY python3 scripts/gguf_from_hf.py "$1" -o "$2" --type "$3"
}
# True when llama.cpp is staged to compare with and to quantize GGUFs.
can_quantize() { [ -n "$LLAMA_BENCH" ] && [ -x "$LLAMA_QUANTIZE" ]; }
# llama-quantize's TYPE of the GGUF $1 as the GGUF $2 (under its final name once complete),
# and that GGUF converted to the barellm file $4 (every matrix in its own type).
quantize_gguf() {  # GGUF OUT_GGUF TYPE OUT_BARELLM
    "$LLAMA_QUANTIZE" "$1" "$2.part" "$3" "$(nproc)" && mv "$2.part" "$2" &&
        PYTHONPATH=$GGUF_PY python3 convert/convert.py "$2" -o "$4"
}

# True when the barellm file $1 is missing, or its GGUF $2 where llama.cpp is there to use it.
pair_missing() { [ ! -f "$1" ] || { [ -n "$LLAMA_BENCH" ] && [ ! -f "$2" ]; }; }
# A barellm file and (where llama.cpp is there) a GGUF of the same random weights, from a
# Hugging Face checkpoint of convert/synth.py's PRESET in DTYPE, which is removed after.
make_pair() {  # PRESET DTYPE HF_DIR BARELLM_FILE GGUF
    rm -rf "$3" && python3 convert/synth.py --preset "$1" --dtype "$2" -o "$3" && made "$3" && {
        python3 convert/convert.py "$3" -o "$4" --dtype "$2" &
        if [ -n "$LLAMA_BENCH" ]; then gguf_from_hf "$3" "$5" "$2"; fi
        wait
    }
    rm -rf "$3"
}

# The Mistral-7B-shaped files, made in the background (the header says which, and in what
# order); each appears under its final name only once complete (the writers rename a
# temporary file), and models.log says what was made when.
MISTRAL_HF=$WORK/mistral-hf
MISTRAL=$WORK/mistral-7b-f16.bin
MISTRAL_GGUF=$WORK/mistral-7b-f16.gguf
MISTRAL_Q4=$WORK/mistral-7b-q4.bin
MISTRAL_Q4_GGUF=$WORK/mistral-7b-q4_0.gguf
MISTRAL_Q8=$WORK/mistral-7b-q8.bin
MISTRAL_Q4KM_GGUF=$WORK/mistral-7b-q4_k_m.gguf
MISTRAL_Q4KM=$WORK/mistral-7b-q4_k_m.bin
LLAMA_QUANTIZE=$LLAMACPP/bin/llama-quantize
MISTRAL_GIB=14    # a Mistral-7B-shaped f16 or bf16 file, or its GGUF, rounded up
# GiB of each file, rounded up (the Hugging Face checkpoint is another MISTRAL_GIB).
declare -A GIB=(["$MISTRAL"]=$MISTRAL_GIB ["$MISTRAL_GGUF"]=$MISTRAL_GIB ["$MISTRAL_Q4"]=4
    ["$MISTRAL_Q4_GGUF"]=4 ["$MISTRAL_Q8"]=8 ["$MISTRAL_Q4KM_GGUF"]=5 ["$MISTRAL_Q4KM"]=5)
# The files to make, in the order of their worth: the missing ones that the free disk holds
# beside the checkpoint (those that do not fit are noted and left out, the last first).
MISTRAL_PLAN=()
# True when a step wanted reads the Mistral-7B f16 file.
wants_mistral_f16() {
    wants compare || wants logits-7b || wants decode || wants ladder || wants wgmma || wants pdl ||
        wants serve || wants ab
}
plan_mistral() {
    local -a wanted=()
    wants_mistral_f16 && wanted+=("$MISTRAL")
    # The GGUFs only for the steps that compare with llama.cpp.
    if [ -n "$LLAMA_BENCH" ]; then
        { wants compare || wants kquants || wants serve; } && wanted+=("$MISTRAL_GGUF")
        { wants compare || wants quantized; } && wanted+=("$MISTRAL_Q4_GGUF")
        wants kquants && [ -x "$LLAMA_QUANTIZE" ] &&
            wanted+=("$MISTRAL_Q4KM_GGUF" "$MISTRAL_Q4KM")
    fi
    { wants compare || wants quantized || wants ab || wants pdl; } && wanted+=("$MISTRAL_Q4")
    { wants compare || wants quantized; } && wanted+=("$MISTRAL_Q8")
    local file need=0 free
    for file in "${wanted[@]}"; do
        [ -f "$file" ] || { MISTRAL_PLAN+=("$file"); need=$((need + GIB[$file])); }
    done
    [ ${#MISTRAL_PLAN[@]} -gt 0 ] && [ ! -d "$MISTRAL_HF" ] && need=$((need + MISTRAL_GIB))
    free=$(free_gib)
    note "disk: ${free:-?} GiB free on $WORK; the Mistral-7B files need $need"
    while [ ${#MISTRAL_PLAN[@]} -gt 0 ] && [ "$need" -gt $((${free:-0} - 2)) ]; do
        file=${MISTRAL_PLAN[-1]}
        unset 'MISTRAL_PLAN[-1]'
        need=$((need - GIB[$file]))
        note "$(basename "$file"): not made, no room on the disk"
    done
    [ ${#MISTRAL_PLAN[@]} -gt 0 ] || return 0
}
planned() { [[ " ${MISTRAL_PLAN[*]} " == *" $1 "* ]]; }
made() { echo "[${SECONDS}s] $*" >>"$LOG/models.log"; }
make_mistral() {
    local -a jobs=()
    local file
    rm -f "$WORK"/.barellm-*.tmp "$WORK"/.gguf-*.tmp  # left by a run cut off
    if [ ! -d "$MISTRAL_HF" ]; then
        rm -rf "$MISTRAL_HF.part" &&
            python3 convert/synth.py --preset mistral-7b --dtype f16 -o "$MISTRAL_HF.part" &&
            mv "$MISTRAL_HF.part" "$MISTRAL_HF" && made "$MISTRAL_HF" || return 1
    fi
    # convert.py checks its output with build/barellm, which the main script is building.
    while [ ! -f "$LOG/built" ]; do sleep 1; done
    if planned "$MISTRAL"; then
        python3 convert/convert.py "$MISTRAL_HF" -o "$MISTRAL" --dtype f16 && made "$MISTRAL" &
        jobs+=($!)
    fi
    if planned "$MISTRAL_GGUF"; then
        # The Q4_K_M GGUF as people get it: llama-quantize of the f16 GGUF.
        {
            gguf_from_hf "$MISTRAL_HF" "$MISTRAL_GGUF" f16 && made "$MISTRAL_GGUF" &&
                { ! planned "$MISTRAL_Q4KM_GGUF" || {
                    quantize_gguf "$MISTRAL_GGUF" "$MISTRAL_Q4KM_GGUF" Q4_K_M "$MISTRAL_Q4KM" \
                        >"$LOG/llama_quantize.log" 2>&1 &&
                        made "$MISTRAL_Q4KM_GGUF" && made "$MISTRAL_Q4KM"; }; }
        } &
        jobs+=($!)
    fi
    if planned "$MISTRAL_Q4_GGUF"; then
        # barellm's q4 is llama.cpp's Q4_0: the GGUF's tensors are copied bit for bit.
        {
            gguf_from_hf "$MISTRAL_HF" "$MISTRAL_Q4_GGUF" q4_0 && made "$MISTRAL_Q4_GGUF" &&
                { ! planned "$MISTRAL_Q4" || {
                    PYTHONPATH=$GGUF_PY python3 convert/convert.py "$MISTRAL_Q4_GGUF" \
                        -o "$MISTRAL_Q4" --dtype q4 &&
                        made "$MISTRAL_Q4"; }; }
        } &
        jobs+=($!)
    elif planned "$MISTRAL_Q4"; then  # no llama.cpp to compare with: barellm's own quantizer
        python3 convert/convert.py "$MISTRAL_HF" -o "$MISTRAL_Q4" --dtype q4 && made "$MISTRAL_Q4" &
        jobs+=($!)
    fi
    if planned "$MISTRAL_Q8"; then
        python3 convert/convert.py "$MISTRAL_HF" -o "$MISTRAL_Q8" --dtype q8 && made "$MISTRAL_Q8" &
        jobs+=($!)
    fi
    wait "${jobs[@]}"
    for file in "${MISTRAL_PLAN[@]}"; do
        [ -f "$file" ] || { made "$(basename "$file") missing: $MISTRAL_HF kept"; return 1; }
    done
    wants logits-7b || { rm -rf "$MISTRAL_HF" && made "removed $MISTRAL_HF"; }
}
if wants_mistral_f16 || wants quantized || wants kquants; then
    plan_mistral
    if [ ${#MISTRAL_PLAN[@]} -gt 0 ]; then
        # Below the checks in priority: every process it starts inherits the niceness.
        { renice -n 5 -p "$BASHPID" >/dev/null; make_mistral; } >>"$LOG/models.log" 2>&1 &
        MODELS_PID=$!
    fi
fi
# True while the Mistral-7B files are being made.
making() { [ -n "$MODELS_PID" ] && kill -0 "$MODELS_PID" 2>/dev/null; }
# Waits for FILE while a run of $2 seconds would still fit after it; true when it exists.
ready() {  # FILE SECONDS
    while [ ! -f "$1" ] && making && [ $((SECONDS + $2)) -lt "$DEADLINE" ]; do sleep 2; done
    [ -f "$1" ] && return 0
    note "$(basename "$1") not ready at ${SECONDS}s: $(tail -1 "$LOG/models.log" 2>/dev/null)"
    return 1
}
# Waits for the Mistral-7B files to be all made (they load every core: nothing is timed
# beside them) while a run of $1 seconds would still fit.
models_done() {  # SECONDS
    while making && [ $((SECONDS + $1)) -lt "$DEADLINE" ]; do sleep 2; done
    making && note "Mistral-7B files still being made at ${SECONDS}s: timed beside them"
    return 0
}

# One architecture keeps nvcc fast; CPPFLAGS points at the staged headers (nlohmann/json,
# cpp-httplib and what it includes), LINKFLAGS at the staged cpp-httplib library (given the
# name the linker looks for here) with an RPATH, which, unlike a RUNPATH, also finds the
# staged Brotli libraries that cpp-httplib itself needs.
for lib in gpu_data/lib/libcpp-httplib.so.*; do
    [ -f "$lib" ] && ln -sf "$(basename "$lib")" gpu_data/lib/libcpp-httplib.so
done
build() {  # DIRECTORY LOGFILE TARGET...
    local dir=$1 log=$2
    shift 2
    (cd "$dir" && make -j"$(nproc)" CUDA_ARCHS="$CUDA_ARCHS" CUDA_PTX_ARCH="${CUDA_ARCHS##* }" \
        CPPFLAGS="-I$ROOT/gpu_data/include" \
        LINKFLAGS="-L$ROOT/gpu_data/lib -Wl,-rpath,$ROOT/gpu_data/lib -Wl,--disable-new-dtags" \
        "$@") >"$log" 2>&1
}
step "build (CUDA_ARCHS=$CUDA_ARCHS)"
if ! build . "$LOG/build.log" build/barellm build/dump_logits build/step_logits \
    build/cuda_kernel_check; then
    tail -30 "$LOG/build.log"
    note "build FAILED (build.log)"
    exit 1
fi
note "build: $(grep -ci warning "$LOG/build.log") warning lines"
if ! reason=$(build/dump_logits --check-cuda); then
    note "no usable CUDA GPU: $reason"
    exit 1
fi
touch "$LOG/built"  # the Mistral-7B conversions wait for it: convert.py loads its output
python3 convert/convert.py "$STORIES_HF" -o "$WORK/stories260K-f16.bin" --dtype f16 >/dev/null
python3 convert/convert.py "$STORIES_HF" -o "$WORK/stories260K-f32.bin" --dtype f32 >/dev/null
for dtype in q8 q4; do
    python3 convert/convert.py "$STORIES_HF" -o "$WORK/stories260K-$dtype.bin" --dtype $dtype \
        >/dev/null 2>&1
done

if wants kernels && fits 60 "cuda_kernel_check"; then
    step "build/cuda_kernel_check --bench"
    timeout "$(capped 120)" build/cuda_kernel_check --bench >"$LOG/kernel_check.log" 2>&1
    status=$?
    grep -v "^PASS" "$LOG/kernel_check.log" | grep -v "^|" | head -40
    grep "^|" "$LOG/kernel_check.log" | tee "$LOG/kernel_bench.md"
    note "cuda_kernel_check: $(tail -1 "$LOG/kernel_check.log") (exit $status)"
fi

if wants gemm-tiles && fits 60 "gemm-tiles"; then
    step "dev/gpu/gemm_tiles.cu"
    # sm_90a: the warpgroup GEMM's instructions (Hopper only).
    if nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Isrc -Ikernels \
        -I"$ROOT/gpu_data/include" -o build/gemm_tiles dev/gpu/gemm_tiles.cu src/weights/safetensors.cpp \
        src/util/json.cpp src/util/files.cpp >"$LOG/gemm_tiles_build.log" 2>&1; then
        timeout "$(capped 90)" build/gemm_tiles >"$LOG/gemm_tiles.log" 2>&1
        status=$?
        grep "^|" "$LOG/gemm_tiles.log" >"$LOG/gemm_tiles.md"
        note "gemm_tiles: $(head -1 "$LOG/gemm_tiles.log") (exit $status)"
        # The large tiles' kernel (mangled: TensorCoreTiles<128, 128, 2, 2, 2, 32, 4, 1>) and
        # the warpgroup GEMM's 128 x 192 tiles in clusters of 2 x 2 (WarpgroupTiles<192, 5, 2,
        # 2>), their first launches at wo's shape; ncu leaves the clocks as they are.
        for kernel in TensorCoreTilesILi128ELi128ELi2ELi2ELi2ELi32ELi4ELi1E \
            WarpgroupTilesILi192ELi5ELi2ELi2E; do
            if wants gemm-ncu && command -v ncu >/dev/null && fits 60 "ncu $kernel"; then
                timeout "$(capped 60)" ncu --clock-control none --kernel-name-base mangled \
                    -k regex:"$kernel" --launch-count 1 --section SpeedOfLight \
                    --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis \
                    --section LaunchStats build/gemm_tiles wo >"$LOG/ncu_$kernel.log" 2>&1
                note "ncu on $kernel (wo): exit $?, ncu_$kernel.log"
            fi
        done
    else
        note "gemm_tiles: build FAILED ($(tail -1 "$LOG/gemm_tiles_build.log"))"
    fi
fi

if wants matvec-ncu && command -v ncu >/dev/null; then
    step "Nsight Compute on the Q4 matvecs"
    for kernel in quantized_matvec_kernel quantized_matvec_swiglu_kernel; do
        fits 60 "ncu $kernel" || continue
        timeout "$(capped 60)" ncu --clock-control none -k regex:"$kernel" --launch-count 1 \
            --section SpeedOfLight --section WarpStateStats --section Occupancy \
            --section MemoryWorkloadAnalysis --section LaunchStats --section SchedulerStats \
            build/cuda_kernel_check --bench-only >"$LOG/ncu_$kernel.log" 2>&1
        note "ncu on $kernel: exit $?, ncu_$kernel.log"
    done
fi

# pytest's workers where pytest-xdist is installed, three for every four cores (the tests and
# wgmma steps).
xdist=()
python3 -c "import xdist" 2>/dev/null && xdist=(-n $(($(nproc) * 3 / 4)))

if wants tests && fits 60 "tests"; then
    step "tests/test_cuda.py, tests/test_ladder.py -k gpu, the GGUF block types' tests"
    # The kernels step already ran cuda_kernel_check, which one test wraps.
    deselect=()
    wants kernels &&
        deselect=(--deselect tests/test_cuda.py::test_every_kernel_matches_the_cpu_kernels)
    OMP_NUM_THREADS=2 timeout "$(capped 180)" python3 -m pytest -q -rs "${xdist[@]}" \
        "${deselect[@]}" tests/test_cuda.py >"$LOG/test_cuda.log" 2>&1
    note "tests/test_cuda.py: $(tail -1 "$LOG/test_cuda.log")"
    if fits 30 "tests/test_ladder.py -k gpu"; then
        timeout "$(capped 30)" python3 -m pytest -q -rs tests/test_ladder.py -k gpu \
            >"$LOG/test_ladder.log" 2>&1
        note "tests/test_ladder.py -k gpu: $(tail -1 "$LOG/test_ladder.log")"
    fi
    # The types kept as GGUF blocks (the i-quants, MXFP4, TQ1_0 and TQ2_0) on the GPU; their
    # tests need the gguf package: llama.cpp's, where it is staged.
    if [ -n "$GGUF_PY" ] && fits 60 "the GGUF block types' tests"; then
        PYTHONPATH=$GGUF_PY OMP_NUM_THREADS=2 timeout "$(capped 90)" python3 -m pytest -q -rs \
            "${xdist[@]}" -k "cuda_backend and gpu" tests/test_convert_iquants.py \
            tests/test_convert_mxfp4.py tests/test_convert_ternary.py \
            >"$LOG/test_block_types.log" 2>&1
        note "i-quant, MXFP4 and ternary files on the GPU: $(tail -1 "$LOG/test_block_types.log")"
    fi
    grep -h "^FAILED" "$LOG/test_cuda.log" "$LOG/test_ladder.log" \
        "$LOG/test_block_types.log" 2>/dev/null | head -10
fi

# One row per test of `barellm bench --device cuda` in the summary table.
bench() {  # LABEL BINARY MODEL SECONDS BENCH_ARGS...
    local label=$1 binary=$2 model=$3 seconds=$4 json
    shift 4
    json=$LOG/bench_${label}_$(tr -dc 'a-z0-9' <<<"$*").json
    fits "$seconds" "bench $label $*" || return 0
    if timeout "$(capped "$seconds")" "$binary" bench "$model" --device cuda "$@" -o json \
        >"$json" 2>"$LOG/bench_$label.err"; then
        python3 -c "import json, sys; [print(json.dumps({**row, 'label': sys.argv[2]})) \
for row in json.load(open(sys.argv[1]))]" "$json" "$label" >>"$RESULTS"
    else
        note "bench $label $* FAILED: $(tail -1 "$LOG/bench_$label.err")"
    fi
}
# barellm against llama.cpp on one pair of files of the same weights: a table
# compare_LABEL.md (scripts/compare_llamacpp.py --device cuda, 2 alternated rounds), or
# barellm's rows alone where llama.cpp is missing.
compare() {  # LABEL GGUF MODEL SECONDS PROMPT GENERATED
    local label=$1 gguf=$2 model=$3 seconds=$4 p=$5 n=$6 table=$LOG/compare_$1.md
    if [ -z "$LLAMA_BENCH" ] || [ ! -f "$gguf" ]; then
        bench "$label" build/barellm "$model" "$seconds" -p "$p" -n "$n" -r 3
        return
    fi
    fits "$seconds" "compare $label" || return 0
    if timeout "$(capped "$seconds")" python3 scripts/compare_llamacpp.py "$LLAMA_BENCH" \
        "$gguf" "$model" --device cuda -t 4 -p "$p" -n "$n" -r 3 --rounds 2 \
        --raw "$LOG/compare_$label" >"$table" 2>"$LOG/compare_$label.err"; then
        note "compare $label: $(grep -cE '^\| .* \| (pp|tg)[0-9]+ \|' "$table") rows" \
            "(compare_$label.md)"
    else
        note "compare $label FAILED: $(tail -1 "$LOG/compare_$label.err")"
        rm -f "$table"
    fi
}

if wants compare; then
    step "Mistral-7B shape against llama.cpp: f16 and q4 (pp512, tg128), q8 alone, short prompts"
    models_done 110
    [ -f "$MISTRAL" ] && compare mistral-7b-f16 "$MISTRAL_GGUF" "$MISTRAL" 110 512 128
    [ -f "$MISTRAL_Q4" ] && compare mistral-7b-q4 "$MISTRAL_Q4_GGUF" "$MISTRAL_Q4" 70 512 128
    [ -f "$MISTRAL_Q8" ] && bench mistral-7b-q8 build/barellm "$MISTRAL_Q8" 20 -p 0 -n 128 -r 3
    # A short prompt in one batch against decoding it token by token.
    if [ -f "$MISTRAL" ]; then
        bench mistral-7b-f16 build/barellm "$MISTRAL" 20 -p 16 -n 64 -r 3
        bench mistral-7b-f16 build/barellm "$MISTRAL" 15 -p 64 -n 0 -r 3
    fi
    for file in "${MISTRAL_PLAN[@]}"; do [ -f "$file" ] || note "$(basename "$file") was not made"; done
fi

if wants quantized && ! wants compare; then
    step "Mistral-7B shape against llama.cpp: q4 (pp512, tg128), q8 alone"
    models_done 70
    [ -f "$MISTRAL_Q4" ] && compare mistral-7b-q4 "$MISTRAL_Q4_GGUF" "$MISTRAL_Q4" 70 512 128
    [ -f "$MISTRAL_Q8" ] && bench mistral-7b-q8 build/barellm "$MISTRAL_Q8" 20 -p 0 -n 128 -r 3
fi

if wants kquants; then
    step "Mistral-7B shape, Q4_K_M (llama-quantize's) against llama.cpp: pp512, tg128"
    if ! can_quantize; then
        note "kquants: skipped, no llama.cpp (llama-bench and llama-quantize) staged"
    elif ready "$MISTRAL_Q4KM" 90; then
        models_done 90
        compare mistral-7b-q4_k_m "$MISTRAL_Q4KM_GGUF" "$MISTRAL_Q4KM" 90 512 128
    fi
fi

if wants bf16; then
    step "bf16 (Mistral-7B shape) against llama.cpp: pp512, tg128"
    BF16=$WORK/mistral-7b-bf16.bin BF16_GGUF=$WORK/mistral-7b-bf16.gguf BF16_HF=$WORK/bf16-hf
    if pair_missing "$BF16" "$BF16_GGUF" && fits 240 "bf16 files and their comparison"; then
        [ -n "$MODELS_PID" ] && wait "$MODELS_PID"
        MODELS_PID=
        # Room for the bf16 checkpoint and its two files: the compare step's files go, but
        # the f16 and q4 barellm files (decode, ladder, ab).
        rm -f "$MISTRAL_GGUF" "$MISTRAL_Q4_GGUF" "$MISTRAL_Q8" "$WORK"/.barellm-*.tmp \
            "$WORK"/.gguf-*.tmp
        if disk_has $((3 * MISTRAL_GIB)) "bf16 files"; then
            make_pair mistral-7b bf16 "$BF16_HF" "$BF16" "$BF16_GGUF" >>"$LOG/models.log" 2>&1
            note "bf16 files: $([ -f "$BF16" ] && echo "$BF16")$([ -f "$BF16_GGUF" ] &&
                echo " $BF16_GGUF") at ${SECONDS}s"
        fi
    fi
    [ -f "$BF16" ] && compare mistral-7b-bf16 "$BF16_GGUF" "$BF16" 110 512 128
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

if wants logits-7b; then
    step "Mistral-7B f16 prefill logits against transformers (512 positions, f16 KV cache)"
    ids=$(python3 -c "import numpy as np; \
print(','.join(map(str, np.random.default_rng(12).integers(0, 32000, 512))))")
    IFS=, read -ra id_list <<<"$ids"
    if [ ! -d "$MISTRAL_HF" ] && ! making && fits 150 "the Mistral-7B checkpoint for logits-7b"; then
        rm -rf "$MISTRAL_HF.part" &&
            python3 convert/synth.py --preset mistral-7b --dtype f16 -o "$MISTRAL_HF.part" \
                >>"$LOG/models.log" 2>&1 && mv "$MISTRAL_HF.part" "$MISTRAL_HF"
    fi
    result=
    if ready "$MISTRAL" 120 && [ -d "$MISTRAL_HF" ] && fits 120 "logits-7b"; then
        models_done 120
        build/dump_logits "$MISTRAL" "$WORK/mistral.logits" "${id_list[@]}" --prefill \
            --device cuda 2>"$LOG/logits_7b.err" &&
            result=$(timeout "$(capped 240)" python3 dev/gpu/transformers_logits.py \
                "$MISTRAL_HF" --ids "$ids" --compare "$WORK/mistral.logits" --device cuda \
                --tolerance 1e-2 2>>"$LOG/logits_7b.err")
        note "logits-7b: ${result:-FAILED: $(tail -1 "$LOG/logits_7b.err")}"
    fi
fi

if wants decode; then
    step "decode"
    bench stories260K-f16 build/barellm "$WORK/stories260K-f16.bin" 20 -p 0 -n 128 -r 5
    bench stories260K-f16 build/barellm "$WORK/stories260K-f16.bin" 20 -p 0 -n 512 -r 3
    bench stories260K-q8 build/barellm "$WORK/stories260K-q8.bin" 20 -p 0 -n 128 -r 5
    bench stories260K-q4 build/barellm "$WORK/stories260K-q4.bin" 20 -p 0 -n 128 -r 5
    if ready "$MISTRAL" 90; then
        bench mistral-7b-f16 build/barellm "$MISTRAL" 30 -p 0 -n 128 -r 3
        bench mistral-7b-f16 build/barellm "$MISTRAL" 30 -p 0 -n 128 -d 4096 -r 3
    fi
fi

if wants ladder; then
    step "GPU ladder"
    for model in "$WORK/stories260K-f32.bin" "$MISTRAL"; do
        label=$(basename "$model" .bin)
        [ "$model" = "$MISTRAL" ] && ! ready "$MISTRAL" 150 && continue
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

if wants wgmma; then
    step "prefill with and without the warpgroup GEMM"
    if fits 60 "cuda_kernel_check without the warpgroup GEMM"; then
        BARELLM_CUDA_WGMMA=0 timeout "$(capped 60)" build/cuda_kernel_check \
            >"$LOG/wgmma_kernels.log" 2>&1
        note "wgmma=0: cuda_kernel_check: exit $?, $(tail -1 "$LOG/wgmma_kernels.log")"
        grep -v "^PASS" "$LOG/wgmma_kernels.log" | grep -v "^|" | head -20
    fi
    if fits 90 "the prefill tests with the warpgroup GEMM"; then
        BARELLM_CUDA_WGMMA=always OMP_NUM_THREADS=2 timeout "$(capped 90)" \
            python3 -m pytest -q -rs "${xdist[@]}" tests/test_cuda.py \
            -k "prefill_cuda or ppl or qwen_cuda or greedy" >"$LOG/wgmma_tests.log" 2>&1
        note "wgmma: test_cuda.py prefill/ppl/qwen/greedy: $(tail -1 "$LOG/wgmma_tests.log")"
        grep -h "^FAILED" "$LOG/wgmma_tests.log" | head -10
    fi
    models_done 110
    for round in 1 2; do
        [ -f "$MISTRAL" ] || break
        BARELLM_CUDA_WGMMA=0 bench "mistral-f16-mma-$round" build/barellm "$MISTRAL" 30 \
            -p 512 -n 0 -r 3
        BARELLM_CUDA_WGMMA=1 bench "mistral-f16-wgmma-$round" build/barellm "$MISTRAL" 30 \
            -p 512 -n 0 -r 3
    done
fi

if wants pdl; then
    step "decode with and without programmatic dependent launch (BARELLM_CUDA_PDL)"
    # Logits with it equal to those without, bit for bit (the tests step compares those
    # with the CPU's).
    if ! wants tests && fits 60 "the dependent-launch tests"; then
        OMP_NUM_THREADS=2 timeout "$(capped 90)" python3 -m pytest -q -rs "${xdist[@]}" \
            tests/test_cuda.py -k dependent_launch >"$LOG/pdl_tests.log" 2>&1
        note "pdl: test_cuda.py -k dependent_launch: $(tail -1 "$LOG/pdl_tests.log")"
        grep -h "^FAILED" "$LOG/pdl_tests.log" | head -10
    fi
    # The Llama-3.2-1B shape (f16), where each kernel's fixed cost weighs most.
    LLAMA1B=$WORK/llama3.2-1b-f16.bin
    if [ ! -f "$LLAMA1B" ] && fits 150 "the Llama-3.2-1B file"; then
        { rm -rf "$WORK/llama1b-hf" &&
            python3 convert/synth.py --preset llama3.2-1b --dtype f16 -o "$WORK/llama1b-hf" &&
            python3 convert/convert.py "$WORK/llama1b-hf" -o "$LLAMA1B" --dtype f16
          rm -rf "$WORK/llama1b-hf"; } >"$LOG/llama1b.log" 2>&1
    fi
    models_done 120
    files=()
    [ -f "$LLAMA1B" ] && files+=("$LLAMA1B")
    [ -f "$MISTRAL" ] && files+=("$MISTRAL")
    [ -f "$MISTRAL_Q4" ] && files+=("$MISTRAL_Q4")
    [ -f "$MISTRAL_Q4KM" ] && files+=("$MISTRAL_Q4KM")
    for round in 1 2; do
        for file in "${files[@]}"; do
            label=$(basename "$file" .bin)
            BARELLM_CUDA_PDL=0 bench "$label-pdl0-$round" build/barellm "$file" 25 -p 0 -n 128 -r 3
            BARELLM_CUDA_PDL=1 bench "$label-pdl1-$round" build/barellm "$file" 25 -p 0 -n 128 -r 3
        done
    done
fi

if wants gemma3; then
    step "Gemma 3 at the 1B and 4B shapes, Gemma 2 at 2B and Phi-4-mini, f16 and Q4_K_M, against llama.cpp"
    gemma_files() {  # PRESET: the f16 GGUF and barellm file, Q4_K_M GGUF and barellm file
        local base=$WORK/$1
        rm -rf "$base-hf" &&
            python3 convert/synth.py --preset "$1" --dtype f16 -o "$base-hf" &&
            gguf_from_hf "$base-hf" "$base-f16.gguf" f16 &&
            python3 convert/convert.py "$base-hf" -o "$base-f16.bin" --dtype f16 || return 1
        rm -rf "$base-hf"
        quantize_gguf "$base-f16.gguf" "$base-q4_k_m.gguf" Q4_K_M "$base-q4_k_m.bin"
    }
    presets=(gemma3-1b gemma3-4b gemma2-2b phi4-mini)
    if ! can_quantize; then
        note "gemma3: skipped, no llama.cpp (llama-bench and llama-quantize) staged"
        presets=()
    fi
    for preset in "${presets[@]}"; do
        if [ ! -f "$WORK/$preset-q4_k_m.bin" ] && fits 240 "$preset files"; then
            gemma_files "$preset" >"$LOG/${preset}_files.log" 2>&1 ||
                note "$preset files FAILED: $(tail -1 "$LOG/${preset}_files.log")"
        fi
        for type in f16 q4_k_m; do
            [ -f "$WORK/$preset-$type.bin" ] && compare "$preset-$type" "$WORK/$preset-$type.gguf" \
                "$WORK/$preset-$type.bin" 90 512 128
        done
    done
fi

if wants moe; then
    step "mixture of experts: the Qwen3-30B-A3B and gpt-oss-20b shapes, 8 layers, against llama.cpp"
    MOE=$WORK/qwen3-30b-a3b-8l MOE_GIB=11  # the f16 checkpoint or GGUF, rounded up
    moe_files() {  # the f16 GGUF, its Q4_K_M, Q4_0 and MXFP4_MOE, and their barellm files
        rm -rf "$MOE-hf" &&
            python3 convert/synth.py --preset qwen3-30b-a3b --layers 8 --dtype f16 -o "$MOE-hf" &&
            gguf_from_hf "$MOE-hf" "$MOE-f16.gguf" f16 || return 1
        rm -rf "$MOE-hf"
        local type
        for type in q4_k_m q4_0 mxfp4_moe; do
            quantize_gguf "$MOE-f16.gguf" "$MOE-$type.gguf" "${type^^}" "$MOE-$type.bin" || return 1
        done
        rm -f "$MOE-f16.gguf"
    }
    if ! can_quantize; then
        if [ ! -f "$MOE-q4.bin" ] && fits 300 "moe files" && disk_has $((2 * MOE_GIB)) "moe files"; then
            { rm -rf "$MOE-hf" &&
                python3 convert/synth.py --preset qwen3-30b-a3b --layers 8 --dtype f16 \
                    -o "$MOE-hf" &&
                python3 convert/convert.py "$MOE-hf" -o "$MOE-q4.bin" --dtype q4
              rm -rf "$MOE-hf"; } >"$LOG/moe_files.log" 2>&1
        fi
        [ -f "$MOE-q4.bin" ] && bench qwen3-30b-a3b-8l-q4 build/barellm "$MOE-q4.bin" 60 -p 512 \
            -n 128 -r 3
    else
        if { [ ! -f "$MOE-q4_k_m.bin" ] || [ ! -f "$MOE-q4_0.bin" ] ||
            [ ! -f "$MOE-mxfp4_moe.bin" ]; } && fits 480 "moe files" &&
            disk_has $((4 * MOE_GIB)) "moe files"; then
            moe_files >"$LOG/moe_files.log" 2>&1
            made_files=()
            for file in "$MOE"-*.bin; do [ -f "$file" ] && made_files+=("$(basename "$file")"); done
            note "moe files: ${made_files[*]:-none} at ${SECONDS}s ($(tail -1 "$LOG/moe_files.log"))"
        fi
        for type in q4_k_m q4_0 mxfp4_moe; do
            [ -f "$MOE-$type.bin" ] && compare "qwen3-30b-a3b-8l-$type" "$MOE-$type.gguf" \
                "$MOE-$type.bin" 120 512 128
        done
        # gpt-oss-20b's shape with 8 of its 24 layers in MXFP4_MOE (the experts in OpenAI's
        # type, the rest Q8_0), YaRN's ramp rounded as llama.cpp rounds it (truncate true).
        GPT_OSS=$WORK/gpt-oss-20b-8l GPT_OSS_GIB=15  # the bf16 checkpoint or GGUF, rounded up
        gpt_oss_files() {
            rm -rf "$GPT_OSS-hf" &&
                python3 convert/synth.py --preset gpt-oss-20b --layers 8 -o "$GPT_OSS-hf" &&
                python3 -c 'import json, sys
path = sys.argv[1]; config = json.load(open(path))
config["rope_scaling"]["truncate"] = True
json.dump(config, open(path, "w"))' "$GPT_OSS-hf/config.json" &&
                gguf_from_hf "$GPT_OSS-hf" "$GPT_OSS-bf16.gguf" bf16 || return 1
            rm -rf "$GPT_OSS-hf"
            quantize_gguf "$GPT_OSS-bf16.gguf" "$GPT_OSS-mxfp4_moe.gguf" MXFP4_MOE \
                "$GPT_OSS-mxfp4_moe.bin" || return 1
            rm -f "$GPT_OSS-bf16.gguf"
        }
        if [ ! -f "$GPT_OSS-mxfp4_moe.bin" ] && fits 420 "gpt-oss files" &&
            disk_has $((2 * GPT_OSS_GIB)) "gpt-oss files"; then
            gpt_oss_files >"$LOG/gpt_oss_files.log" 2>&1
            note "gpt-oss files at ${SECONDS}s ($(tail -1 "$LOG/gpt_oss_files.log"))"
        fi
        [ -f "$GPT_OSS-mxfp4_moe.bin" ] && compare gpt-oss-20b-8l-mxfp4_moe \
            "$GPT_OSS-mxfp4_moe.gguf" "$GPT_OSS-mxfp4_moe.bin" 120 512 128
    fi
fi

if wants serve; then
    step "barellm serve against llama-server -np 32 on the GPU (Mistral-7B f16)"
    site=$WORK/site
    llama_server=()
    [ -n "$LLAMA_BENCH" ] && [ -x "$LLAMACPP/bin/llama-server" ] &&
        llama_server=(--llama-server "$LLAMACPP/bin/llama-server" --gguf "$MISTRAL_GGUF")
    if ! python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" \
        gpu_data/wheels/*.whl >"$LOG/wheels.log" 2>&1; then
        note "serve: the staged wheels do not install: $(tail -1 "$LOG/wheels.log")"
    elif ready "$MISTRAL" 180 && { [ ${#llama_server[@]} -eq 0 ] || ready "$MISTRAL_GGUF" 180; } &&
        fits 180 "serve"; then
        models_done 180
        [ ${#llama_server[@]} -eq 0 ] && note "serve: no llama-server staged: barellm alone"
        if PYTHONPATH=$site timeout "$(capped 300)" python3 scripts/load_test.py "$MISTRAL" \
            --device cuda --clients 32 --rounds 2 --max-tokens 128 --ctx 1024 --threads 4 \
            "${llama_server[@]}" >"$LOG/compare_serve.md" 2>"$LOG/serve.err"; then
            note "serve: 32 streams (compare_serve.md)"
        else
            note "serve FAILED: $(tail -1 "$LOG/serve.err")"
            rm -f "$LOG/compare_serve.md"
        fi
    fi
fi

if wants ab; then
    step "A/B: gpu_data/ab/*.tgz beside this tree"
    greedy() {  # BINARY: its greedy completions on stories260K, f16 and q4
        local dtype
        for dtype in f16 q4; do
            "$1" run "$WORK/stories260K-$dtype.bin" --device cuda -p "Once upon a time" -n 60 \
                --temp 0 2>/dev/null
        done
    }
    want=$(greedy build/barellm)
    trees=()
    for archive in gpu_data/ab/*.tgz; do
        [ -f "$archive" ] || continue
        name=$(basename "$archive" .tgz)
        tree=$WORK/ab/$name
        # A tree built from the same archive by an earlier run on this machine is kept.
        if cmp -s "$archive" "$tree.tgz" && [ -x "$tree/build/barellm" ]; then
            note "tree $name: built by an earlier run"
        elif ! fits 60 "tree $name"; then
            continue
        elif ! { rm -rf "$tree" "$tree.tgz" && mkdir -p "$tree" && tar xzf "$archive" -C "$tree" &&
            build "$tree" "$LOG/build_$name.log" build/barellm && cp "$archive" "$tree.tgz"; }; then
            note "tree $name: build FAILED: $(grep -m1 -i error "$LOG/build_$name.log")"
            continue
        fi
        if [ "$(greedy "$tree/build/barellm")" != "$want" ]; then
            note "tree $name: greedy text differs from this tree's on stories260K: not timed"
        else
            note "tree $name: the same greedy text as this tree on stories260K"
            trees+=("$name")
        fi
    done
    if [ "${#trees[@]}" -gt 0 ] && ready "$MISTRAL" 120; then
        files=("$MISTRAL")
        ready "$MISTRAL_Q4" 60 && files+=("$MISTRAL_Q4")
        if [ -f "$MISTRAL_Q4KM" ] || planned "$MISTRAL_Q4KM"; then  # the kquants step's
            ready "$MISTRAL_Q4KM" 60 && files+=("$MISTRAL_Q4KM")
        fi
        for round in 1 2; do
            for file in "${files[@]}"; do
                label=$(basename "$file" .bin)
                for name in "${trees[@]}"; do
                    bench "$name-$label-$round" "$WORK/ab/$name/build/barellm" "$file" 30 \
                        -p 512 -n 128 -r 3
                done
                bench "this-$label-$round" build/barellm "$file" 30 -p 512 -n 128 -r 3
            done
        done
        # Long context as every tree can time it (bench -d is newer than some).
        for name in "${trees[@]}"; do
            bench "$name" "$WORK/ab/$name/build/barellm" "$MISTRAL" 60 -p 0 -n 4096 -r 1
        done
        bench this build/barellm "$MISTRAL" 60 -p 0 -n 4096 -r 1
    fi
fi

if wants qwen3-8b; then
    step "decode at Qwen3-8B's shape"
    QWEN3=$WORK/qwen3-8b-f16.bin
    if [ ! -f "$QWEN3" ] && fits 240 "Qwen3-8B checkpoint" &&
        disk_has $((2 * QWEN3_8B_GIB)) "Qwen3-8B checkpoint"; then
        rm -rf "$WORK/qwen3-hf" &&
            python3 convert/synth.py --preset qwen3-8b --dtype f16 -o "$WORK/qwen3-hf" &&
            python3 convert/convert.py "$WORK/qwen3-hf" -o "$QWEN3" --dtype f16 &&
            rm -rf "$WORK/qwen3-hf"
    fi >"$LOG/qwen3_synth.log" 2>&1
    if [ -f "$QWEN3" ]; then
        note "Qwen3-8B checkpoint ready at ${SECONDS}s"
        bench qwen3-8b-f16 build/barellm "$QWEN3" 30 -p 0 -n 128 -r 3
        bench qwen3-8b-f16 build/barellm "$QWEN3" 30 -p 0 -n 128 -d 4096 -r 3
    else
        note "Qwen3-8B checkpoint not made: $(tail -1 "$LOG/qwen3_synth.log")"
    fi
fi

if wants llama3-prefill; then
    step "prefill at Llama-3-8B's shape: pp512 f16 against llama.cpp"
    LLAMA3_HF=$WORK/llama3-hf LLAMA3=$WORK/llama3-8b-f16.bin LLAMA3_GGUF=$WORK/llama3-8b-f16.gguf
    if pair_missing "$LLAMA3" "$LLAMA3_GGUF" && fits 240 "Llama-3-8B files" &&
        disk_has $((3 * LLAMA3_8B_GIB)) "Llama-3-8B checkpoint, its barellm file and GGUF"; then
        make_pair llama3-8b f16 "$LLAMA3_HF" "$LLAMA3" "$LLAMA3_GGUF" >"$LOG/llama3_synth.log" 2>&1
    fi
    if [ -f "$LLAMA3" ]; then
        compare llama3-8b-f16 "$LLAMA3_GGUF" "$LLAMA3" 120 512 0
    else
        note "Llama-3-8B checkpoint not made: $(tail -1 "$LOG/llama3_synth.log")"
    fi
fi
