#!/usr/bin/env bash
# Prefill and decode speed of barellm next to llama.cpp's llama-bench on the same weights,
# as one markdown table.
#
#   scripts/compare_llamacpp.sh LLAMA_BENCH GGUF_FILE BARELLM_FILE [-t THREADS] [-p 512]
#                               [-n 128] [-r 5] [--rounds 1] [--barellm PATH] [--raw DIR]
#
# LLAMA_BENCH is a llama-bench binary (scripts/build_llamacpp.sh builds one), GGUF_FILE
# and BARELLM_FILE the same checkpoint written by scripts/gguf_from_hf.py and
# convert/convert.py (with matching types: f16 with f16, q8_0 with q8...). Runs
#   llama-bench -m GGUF_FILE -t T -p P -n N -r R -o json
#   build/barellm bench BARELLM_FILE --threads T -p P -n N -r R -o json
# one after the other (never together: they would share the cores), --rounds times in
# alternation, and prints
#   | test | llama.cpp t/s | barellm t/s | ratio (barellm/llama.cpp) | barellm GB/s | % bw |
# t/s is mean ± standard deviation over all repetitions of each tool. With one round the
# ratio is that of the two means; with several it is the mean ± standard deviation of the
# rounds' ratios, each round's listed below the table: on a machine whose speed drifts,
# only runs next to each other compare. -t defaults to the number of cores. --barellm
# names another barellm binary; --raw DIR keeps the JSON outputs and logs there. Exit
# status 1 when either tool fails (its log is shown).
set -euo pipefail

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

repo=$(cd "$(dirname "$0")/.." && pwd -P)
barellm="$repo/build/barellm"
threads=$(nproc 2>/dev/null || echo 1)
prompt=512 gen=128 reps=5 rounds=1 raw=""
positional=()
while [ $# -gt 0 ]; do
    case "$1" in
        -t|--threads) threads=$2; shift 2 ;;
        -p) prompt=$2; shift 2 ;;
        -n) gen=$2; shift 2 ;;
        -r) reps=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --barellm) barellm=$2; shift 2 ;;
        --raw) raw=$2; shift 2 ;;
        -h|--help) usage 0 ;;
        -*) echo "compare_llamacpp: unknown option $1" >&2; usage ;;
        *) positional+=("$1"); shift ;;
    esac
done
[ ${#positional[@]} -eq 3 ] || usage
llama_bench=${positional[0]} gguf_file=${positional[1]} barellm_file=${positional[2]}
for n in "$threads" "$prompt" "$gen" "$reps" "$rounds"; do
    [[ "$n" =~ ^[0-9]+$ ]] || { echo "compare_llamacpp: '$n' is not a number" >&2; exit 2; }
done
[ "$rounds" -ge 1 ] || { echo "compare_llamacpp: --rounds must be at least 1" >&2; exit 2; }
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

for round in $(seq "$rounds"); do
    run "llamacpp-$round" "$llama_bench" -m "$gguf_file" -t "$threads" -p "$prompt" -n "$gen" \
        -r "$reps" -o json
    run "barellm-$round" "$barellm" bench "$barellm_file" --threads "$threads" -p "$prompt" \
        -n "$gen" -r "$reps" -o json
done

python3 - "$work" "$rounds" "$threads" <<'EOF'
import json
import statistics
import sys

work, rounds = sys.argv[1], int(sys.argv[2])


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


def mean_sd(values):
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def short(value):
    """Two decimals, or three significant digits for values below 0.1."""
    return f"{value:.2f}" if abs(value) >= 0.1 or value == 0 else f"{value:.3g}"


def number(test, field, fmt=None):
    value = None if test is None else test.get(field)
    if value is None:
        return "-"
    return format(value, fmt) if fmt else short(value)


def samples(test):
    """Every repetition's t/s (llama-bench's samples_ts), or the mean when absent."""
    values = test.get("samples_ts") or [test["avg_ts"]]
    return [float(v) for v in values]


# llama[round][test key] and bare[round][test key]: each round's results.
llama = [{key(t): t for t in load(f"{work}/llamacpp-{r}.json", "llama-bench")}
         for r in range(1, rounds + 1)]
bare = [{key(t): t for t in load(f"{work}/barellm-{r}.json", "barellm")}
        for r in range(1, rounds + 1)]
first_llama = next(iter(llama[0].values()), {})
first_bare = next(iter(bare[0].values()), {})
print(f"llama.cpp: {first_llama.get('model_type', '?')}, "
      f"{(first_llama.get('model_size') or 0) / 2**30:.2f} GiB, "
      f"build {first_llama.get('build_commit', '?')}, "
      f"{first_llama.get('n_threads', sys.argv[3])} threads")
print(f"barellm:   {first_bare.get('model_type', '?')}, "
      f"{(first_bare.get('model_size') or 0) / 2**30:.2f} GiB, "
      f"{first_bare.get('backend', '?')}, {first_bare.get('n_threads', sys.argv[3])} threads, "
      f"streaming read {number(first_bare, 'bandwidth_gbps', '.1f')} GB/s"
      + (f" (first round of {rounds})" if rounds > 1 else ""))
print()
print("| test | llama.cpp t/s | barellm t/s | ratio (barellm/llama.cpp) | barellm GB/s | % bw |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
round_lines = []
tests = set().union(*llama, *bare)
for k in sorted(tests, key=lambda k: (k[1] != 0, k)):
    ours = [b[k] for b in bare if k in b]
    both = [(a[k], b[k]) for a, b in zip(llama, bare)
            if k in a and k in b and a[k].get("avg_ts") and b[k].get("avg_ts") is not None]
    columns = []
    for results in ([a[k] for a in llama if k in a], ours):
        values = [v for t in results if t.get("avg_ts") is not None for v in samples(t)]
        columns.append("%.2f ± %.2f" % mean_sd(values) if values else "-")
    ratios = [b["avg_ts"] / a["avg_ts"] for a, b in both]
    if not ratios:
        ratio = "-"
    elif rounds == 1:
        ratio = short(ratios[0])
    else:
        ratio = "%s ± %s" % tuple(short(v) for v in mean_sd(ratios))
        round_lines.append(f"{label(*k)} ratio by round: " + ", ".join(short(r) for r in ratios))
    gbps = [t["gbps"] for t in ours if t.get("gbps") is not None]
    pct = [t["bw_pct"] for t in ours if t.get("bw_pct") is not None]
    print(f"| {label(*k)} | {columns[0]} | {columns[1]} | {ratio} | "
          f"{short(statistics.fmean(gbps)) if gbps else '-'} | "
          f"{'%.0f%%' % statistics.fmean(pct) if pct else '-'} |")
if round_lines:
    print()
    print("\n".join(round_lines))
EOF
