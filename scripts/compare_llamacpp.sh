#!/usr/bin/env bash
# Prefill and decode speed of barellm next to llama.cpp's llama-bench on the same weights,
# as one markdown table.
#
#   scripts/compare_llamacpp.sh LLAMA_BENCH GGUF_FILE BARELLM_FILE [-t THREADS] [-p 512]
#                               [-n 128] [-r 5] [--barellm PATH] [--raw DIR]
#
# LLAMA_BENCH is a llama-bench binary (scripts/build_llamacpp.sh builds one), GGUF_FILE
# and BARELLM_FILE the same checkpoint written by scripts/gguf_from_hf.py and
# convert/convert.py (with matching types: f16 with f16, q8_0 with q8...). Runs
#   llama-bench -m GGUF_FILE -t T -p P -n N -r R -o json
#   build/barellm bench BARELLM_FILE --threads T -p P -n N -r R -o json
# one after the other (never together: they would share the cores) and prints
#   | test | llama.cpp t/s | barellm t/s | ratio (barellm/llama.cpp) | barellm GB/s | % bw |
# t/s is mean ± standard deviation over the R repetitions of each tool. -t defaults to
# the number of cores. --barellm names another barellm binary; --raw DIR keeps both JSON
# outputs and logs there. Exit status 1 when either tool fails (its log is shown).
set -euo pipefail

usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

repo=$(cd "$(dirname "$0")/.." && pwd -P)
barellm="$repo/build/barellm"
threads=$(nproc 2>/dev/null || echo 1)
prompt=512 gen=128 reps=5 raw=""
positional=()
while [ $# -gt 0 ]; do
    case "$1" in
        -t|--threads) threads=$2; shift 2 ;;
        -p) prompt=$2; shift 2 ;;
        -n) gen=$2; shift 2 ;;
        -r) reps=$2; shift 2 ;;
        --barellm) barellm=$2; shift 2 ;;
        --raw) raw=$2; shift 2 ;;
        -h|--help) usage 0 ;;
        -*) echo "compare_llamacpp: unknown option $1" >&2; usage ;;
        *) positional+=("$1"); shift ;;
    esac
done
[ ${#positional[@]} -eq 3 ] || usage
llama_bench=${positional[0]} gguf_file=${positional[1]} barellm_file=${positional[2]}
for n in "$threads" "$prompt" "$gen" "$reps"; do
    [[ "$n" =~ ^[0-9]+$ ]] || { echo "compare_llamacpp: '$n' is not a number" >&2; exit 2; }
done
[ -x "$llama_bench" ] || { echo "compare_llamacpp: $llama_bench is not executable" >&2; exit 2; }
[ -x "$barellm" ] || { echo "compare_llamacpp: $barellm not found (make build/barellm)" >&2; exit 2; }
for f in "$gguf_file" "$barellm_file"; do
    [ -f "$f" ] || { echo "compare_llamacpp: $f: no such file" >&2; exit 2; }
done

if [ -n "$raw" ]; then
    mkdir -p "$raw"
    work=$raw
else
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
fi

run() {  # run NAME CMD...: stdout to $work/NAME.json, stderr to $work/NAME.log
    local name=$1; shift
    echo "compare_llamacpp: $*" >&2
    if ! "$@" >"$work/$name.json" 2>"$work/$name.log"; then
        echo "compare_llamacpp: $name failed; its output:" >&2
        tail -n 30 "$work/$name.log" "$work/$name.json" >&2
        exit 1
    fi
}

run llamacpp "$llama_bench" -m "$gguf_file" -t "$threads" -p "$prompt" -n "$gen" \
    -r "$reps" -o json
run barellm "$barellm" bench "$barellm_file" --threads "$threads" -p "$prompt" -n "$gen" \
    -r "$reps" -o json

python3 - "$work/llamacpp.json" "$work/barellm.json" "$threads" <<'EOF'
import json
import sys


def load(path, tool):
    """The list of test results a tool printed as JSON (text around it is ignored)."""
    text = open(path, encoding="utf-8", errors="replace").read()
    start, end = text.find("["), text.rfind("]")
    try:
        results = json.loads(text[start:end + 1]) if start >= 0 else None
    except json.JSONDecodeError as e:
        results = None
        print(f"compare_llamacpp: {tool} output is not JSON ({e})", file=sys.stderr)
    if not isinstance(results, list):
        sys.exit(f"compare_llamacpp: no JSON result list in the {tool} output ({path})")
    return results


def key(test):
    return int(test.get("n_prompt") or 0), int(test.get("n_gen") or 0)


def label(n_prompt, n_gen):
    if n_gen == 0:
        return f"pp{n_prompt}"
    if n_prompt == 0:
        return f"tg{n_gen}"
    return f"pp{n_prompt}+tg{n_gen}"


def rate(test):
    if test is None or test.get("avg_ts") is None:
        return "-"
    return f"{test['avg_ts']:.2f} ± {test.get('stddev_ts') or 0:.2f}"


def short(value):
    """Two decimals, or three significant digits for values below 0.1."""
    return f"{value:.2f}" if abs(value) >= 0.1 or value == 0 else f"{value:.3g}"


def number(test, field, fmt=None):
    value = None if test is None else test.get(field)
    if value is None:
        return "-"
    return format(value, fmt) if fmt else short(value)


llama = {key(t): t for t in load(sys.argv[1], "llama-bench")}
bare = {key(t): t for t in load(sys.argv[2], "barellm")}
first_llama = next(iter(llama.values()), {})
first_bare = next(iter(bare.values()), {})
print(f"llama.cpp: {first_llama.get('model_type', '?')}, "
      f"{(first_llama.get('model_size') or 0) / 2**30:.2f} GiB, "
      f"build {first_llama.get('build_commit', '?')}, "
      f"{first_llama.get('n_threads', sys.argv[3])} threads")
print(f"barellm:   {first_bare.get('model_type', '?')}, "
      f"{(first_bare.get('model_size') or 0) / 2**30:.2f} GiB, "
      f"{first_bare.get('backend', '?')}, {first_bare.get('n_threads', sys.argv[3])} threads, "
      f"streaming read {number(first_bare, 'bandwidth_gbps', '.1f')} GB/s")
print()
print("| test | llama.cpp t/s | barellm t/s | ratio (barellm/llama.cpp) | barellm GB/s | % bw |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for k in sorted(set(llama) | set(bare), key=lambda k: (k[1] != 0, k)):
    a, b = llama.get(k), bare.get(k)
    ratio = "-"
    if a and b and a.get("avg_ts") and b.get("avg_ts") is not None:
        ratio = short(b["avg_ts"] / a["avg_ts"])
    pct = number(b, "bw_pct", ".0f")
    print(f"| {label(*k)} | {rate(a)} | {rate(b)} | {ratio} | {number(b, 'gbps')} | "
          f"{pct + '%' if pct != '-' else pct} |")
EOF
