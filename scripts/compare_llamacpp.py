#!/usr/bin/env python3
"""Prefill and decode speed of barellm next to llama.cpp's llama-bench on the same weights.

    scripts/compare_llamacpp.sh LLAMA_BENCH GGUF BARELLM_FILE [GGUF BARELLM_FILE ...] [options]

LLAMA_BENCH is a llama-bench binary (scripts/build_llamacpp.sh builds one); each GGUF and
BARELLM_FILE pair is one checkpoint written by scripts/gguf_from_hf.py and
convert/convert.py with matching types (f16 with f16, q8_0 with q8, ...). For every pair
and every thread count it runs, alternating the two tools and never both at once,
    build/barellm bench BARELLM_FILE --threads T -p P -n N -d D -r R -o json [--simd LEVEL]
    llama-bench -m GGUF -t T -p P -n N -d D -r R -o json
--rounds times, with a check of the machine before the first round and after each.
With --device cuda both run on the GPU: barellm with `--device cuda`, llama-bench with
every layer offloaded (`-ngl 99`; LLAMA_BENCH must then be a CUDA build), and the header
names the GPU (llama-bench's gpu_info); the % bw column is of the GPU's device-to-device
copy, measured by barellm bench in the same run.

Options:
  -t, --threads LIST   thread counts, comma-separated (default: the physical cores)
  -p P, -n N, -r R     prompt tokens, decode steps, repetitions (default 512, 128, 5)
  -d D                 depth: both tools run each test after D positions of the KV
                       cache, filled untimed (default 0); rows read "tg128 @ d4096"
  --rounds K           rounds per pair and thread count (default 2)
  --order alternate|blocks
                       alternate: barellm, llama.cpp, barellm, ... (default);
                       blocks: every barellm round, then every llama.cpp round
  --threshold PCT      the disagreement that flags a row (default 10)
  --json | --csv       one merged JSON document, or CSV rows, instead of markdown
  --plot FILE.png      also draw t/s per test, thread count and tool (needs matplotlib);
                       never over an input file, a folder or a device
  --barellm PATH       another barellm binary (default: build/barellm of this tree)
  --device cpu|cuda    where both tools run (default cpu)
  --simd LEVEL         barellm's kernels of at most this level (scalar, avx2, avx512; its
                       `--simd`), e.g. avx2 against a llama.cpp built without AVX-512
  --raw DIR            keep every tool's output and log in DIR, a new or empty folder

A row is flagged when either tool's repetitions spread by more than the threshold
(standard deviation over mean), when its rounds' ratios disagree by more than it
((max - min) / mean), when it ran in one round only, or when a machine check around its
rounds found the machine busy: its ratio is then shown in parentheses. A check samples
the load average and the other runnable tasks, and times a fixed spin loop on each
thread used: the loop's mean time against its fastest time (the idle expectation of the
same run) and the CPU time it got against the wall time. Progress goes to stderr. Peak
memory is the resident-set high-water mark of each process (GNU time's %M, /usr/bin/time:
Debian's package "time"); barellm's is the one bench reads itself before its 1 GiB
bandwidth buffer. Exit status 1 when a tool fails
(its log is shown), 2 for a wrong command line.

COMPARE_LLAMACPP_FAKE_CHECKS (for tests): a JSON list of machine-check results
({"load1", "others", "cpu_share", "slowdown"}) used in order instead of measuring.
"""

import argparse
import csv
import datetime
import io
import json
import multiprocessing
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = "compare_llamacpp"
MIB = 1 << 20
GNU_TIME = os.environ.get("COMPARE_LLAMACPP_TIME", "/usr/bin/time")

# Machine check: each spinner times SPIN_CHUNKS chunks of SPIN_STEPS additions.
SPIN_CHUNKS = 150
SPIN_STEPS = 20000
LOAD_SAMPLES = 10
BUSY_CPU_SHARE = 0.9  # a spinner getting less CPU time than this share of the wall time
ALL_LAYERS = 99  # llama-bench -ngl: offload every layer (more than any model here has)

# The per-row fields of --json and --csv, in this order.
ROW_FIELDS = [
    "model", "gguf", "dtype", "llamacpp_dtype", "threads", "test",
    "llamacpp_ts", "llamacpp_ts_spread", "barellm_ts", "barellm_ts_spread",
    "ratio", "ratio_spread", "round_ratios",
    "llamacpp_peak_rss_mib", "barellm_peak_rss_mib", "llamacpp_simd", "barellm_simd",
    "barellm_gbps", "barellm_bw_pct", "flagged", "flags",
]


class Failure(Exception):
    """A tool failed or printed something unusable: one line, exit status 1."""


def progress(message):
    print(f"{PROGRAM}: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- the machine

def read_cpuinfo():
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def cpuinfo_field(cpuinfo, name):
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return None


def physical_cores(cpuinfo):
    """Distinct (physical id, core id) pairs, at most the CPUs this process may use."""
    pairs, current = set(), {}
    for line in cpuinfo.splitlines() + ["processor:"]:
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "processor":
            if current:
                pairs.add((current.get("physical id"), current.get("core id")))
            current = {"seen": True}
        elif key in ("physical id", "core id"):
            current[key] = value.strip()
    schedulable = len(os.sched_getaffinity(0))
    if not pairs or any(None in pair for pair in pairs):
        return schedulable
    return min(len(pairs), schedulable)


def spin(steps, chunks, results):
    """One spinner: the wall time of each chunk of a fixed loop, and the CPU time got."""
    times = []
    wall_start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(chunks):
        start = time.perf_counter()
        total = 0
        for i in range(steps):
            total += i
        times.append(time.perf_counter() - start)
    results.put((times, time.process_time() - cpu_start, time.perf_counter() - wall_start))


def runnable_others(spinners):
    """Runnable tasks besides the spinners and this process, from /proc/loadavg."""
    with open("/proc/loadavg") as f:
        running = int(f.read().split()[3].split("/")[0])
    return max(0, running - spinners - 1)


def measure_machine(threads):
    """Load and the spin-loop timings on `threads` cores at once."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    spinners = [context.Process(target=spin, args=(SPIN_STEPS, SPIN_CHUNKS, results))
                for _ in range(threads)]
    for p in spinners:
        p.start()
    others = []
    for _ in range(LOAD_SAMPLES):
        time.sleep(0.01)
        others.append(runnable_others(threads))
    outcomes = [results.get() for _ in spinners]
    for p in spinners:
        p.join()
    slowdowns = [statistics.fmean(t) / min(t) for t, _, _ in outcomes]
    shares = [cpu / wall for _, cpu, wall in outcomes]
    return {"load1": os.getloadavg()[0], "others": statistics.fmean(others),
            "cpu_share": min(shares), "slowdown": max(slowdowns)}


class MachineChecks:
    """Machine checks, measured or (COMPARE_LLAMACPP_FAKE_CHECKS) replayed."""

    def __init__(self, threshold):
        self.threshold = threshold
        self.fake = None
        text = os.environ.get("COMPARE_LLAMACPP_FAKE_CHECKS")
        if text:
            self.fake = json.loads(text)
            if not isinstance(self.fake, list) or not self.fake:
                raise ValueError("COMPARE_LLAMACPP_FAKE_CHECKS is not a JSON list")
        self.done = []

    def check(self, threads, when):
        if self.fake is not None:
            result = dict(self.fake[min(len(self.done), len(self.fake) - 1)])
        else:
            result = measure_machine(min(threads, len(os.sched_getaffinity(0))))
        free_cores = max(0, len(os.sched_getaffinity(0)) - threads)
        reasons = []
        if result["slowdown"] > 1 + self.threshold:
            reasons.append(f"spin loop {result['slowdown']:.2f}x its fastest")
        if result["cpu_share"] < BUSY_CPU_SHARE:
            reasons.append(f"spinner got {100 * result['cpu_share']:.0f}% of a core")
        if result["others"] > free_cores + 0.5:
            reasons.append(f"{result['others']:.1f} other runnable tasks for "
                           f"{free_cores} free cores")
        result.update(threads=threads, when=when, busy=bool(reasons), reasons=reasons)
        self.done.append(result)
        progress(f"machine check ({when}): load {result['load1']:.2f}, "
                 f"{result['others']:.1f} other runnable, spin {result['slowdown']:.2f}x "
                 f"fastest, {100 * result['cpu_share']:.0f}% CPU: "
                 + ("BUSY: " + "; ".join(reasons) if reasons else "idle"))
        return result


# ---------------------------------------------------------------------------- the tools

# GNU time's exit status for a command killed by a signal is 128 + the signal.
ILLEGAL_INSTRUCTION_STATUS = 128 + signal.SIGILL

def run_tool(name, command, work):
    """Runs a tool under GNU time with stdout and stderr in files; returns (stdout, stderr,
    peak RSS bytes). The peak comes from GNU time, whose own small process forks the tool:
    a child forked from this Python process would carry this process's pages in its peak."""
    paths = {kind: os.path.join(work, f"{name}.{kind}") for kind in ("json", "log", "rss")}
    start = time.perf_counter()
    with open(paths["json"], "w") as out, open(paths["log"], "w") as log:
        try:
            returncode = subprocess.run([GNU_TIME, "-f", "%M", "-o", paths["rss"], *command],
                                        stdout=out, stderr=log).returncode
        except OSError as e:
            raise Failure(f"cannot run {GNU_TIME}: {e.strerror}")
    texts = {}
    for kind in ("json", "log", "rss"):
        with open(paths[kind], encoding="utf-8", errors="replace") as f:
            texts[kind] = f.read()
    if returncode != 0:
        tail = "\n".join((texts["log"] + texts["json"]).splitlines()[-30:])
        if returncode == ILLEGAL_INSTRUCTION_STATUS:
            tail += ("\nan illegal instruction: the tool uses instructions this CPU, or its "
                     "kernel, does not let it run. llama.cpp built with AMX (Intel Sapphire "
                     "Rapids and later) dies so where Linux grants AMX one thread at a time: "
                     "rebuild it with scripts/build_llamacpp.sh DIR --no-amx")
        raise Failure(f"{name} failed (exit status {returncode}): {shlex.join(command)}\n{tail}")
    peak_kib = texts["rss"].split()[-1] if texts["rss"].split() else ""
    if not peak_kib.isdigit():
        raise Failure(f"{GNU_TIME} reported no peak memory for {name}: {texts['rss']!r}")
    progress(f"  {name}: done in {time.perf_counter() - start:.1f} s")
    return texts["json"], texts["log"], int(peak_kib) * 1024  # GNU time reports KiB


def parse_results(text, tool):
    """The list of test results a tool printed as JSON (text around it is ignored)."""
    start, end = text.find("["), text.rfind("]")
    try:
        results = json.loads(text[start:end + 1]) if start >= 0 else None
    except json.JSONDecodeError as e:
        raise Failure(f"{tool} printed no JSON result list ({e})")
    if not isinstance(results, list) or not all(isinstance(t, dict) for t in results):
        raise Failure(f"{tool} printed no JSON result list")
    for t in results:
        if not isinstance(t.get("avg_ts"), (int, float)):
            raise Failure(f"{tool} printed a result without avg_ts")
    return results


def test_key(result):
    return (int(result.get("n_prompt") or 0), int(result.get("n_gen") or 0),
            int(result.get("n_depth") or 0))


def test_label(key):
    """llama-bench's markdown name of a test: pp512, tg128, tg128 @ d4096."""
    n_prompt, n_gen, n_depth = key
    if n_gen == 0:
        name = f"pp{n_prompt}"
    elif n_prompt == 0:
        name = f"tg{n_gen}"
    else:
        name = f"pp{n_prompt}+tg{n_gen}"
    return f"{name} @ d{n_depth}" if n_depth else name


FEATURE = re.compile(r"\b(AVX512[A-Z0-9_]*|AVX_VNNI|AVX2|AVX|FMA|F16C|SSE3|AMX_[A-Z0-9]+)"
                     r"\s*=\s*1\b")


def llamacpp_simd(llama_bench, stderr):
    """llama.cpp's SIMD level: from a system-info line ("AVX2 = 1 | AVX512 = 1 | ...") in
    its output, else from its build's CMakeCache.txt: with GGML_NATIVE=ON it is built for
    this CPU (-march=native, less AVX-512 where its C flags say -mno-avx512f), else for the
    GGML_<ISA> options switched on."""
    found = FEATURE.findall(stderr)
    if found:
        return simd_name(found)
    build = os.path.dirname(os.path.dirname(os.path.realpath(llama_bench)))
    cache = os.path.join(build, "CMakeCache.txt")
    try:
        with open(cache, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return "unknown"
    options = dict(re.findall(r"^(GGML_[A-Z0-9_]+):BOOL=(\w+)$", text, re.M))
    if options.get("GGML_NATIVE", "").upper() in ("ON", "TRUE", "1"):
        flags = (cpuinfo_field(read_cpuinfo(), "flags") or "").upper().split()
        # build_llamacpp.sh --no-avx512 takes AVX-512 away from -march=native.
        if re.search(r"^CMAKE_C_FLAGS:STRING=.*-mno-avx512f\b", text, re.M):
            flags = [flag for flag in flags if not flag.startswith("AVX512")]
        return simd_name(flags) + " (native build)"
    on = [name[len("GGML_"):] for name, value in options.items()
          if value.upper() in ("ON", "TRUE", "1")]
    return simd_name(on) + " (build options)"


def simd_name(features):
    """The widest x86 vector level among feature names (AVX512F, AVX2, ...)."""
    names = {f.upper() for f in features}
    if any(n.startswith("AVX512") for n in names):
        return "avx512"
    if "AVX2" in names:
        return "avx2"
    if "AVX" in names:
        return "avx"
    return "scalar" if names else "unknown"


def git_commit(path):
    """The commit of the tree a binary was built in (with -dirty), or "unknown"."""
    folder = os.path.dirname(os.path.realpath(path))
    try:
        result = subprocess.run(["git", "-C", folder, "describe", "--always", "--dirty",
                                 "--abbrev=7"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return result.stdout.strip() if result.returncode == 0 else "unknown"


# ---------------------------------------------------------------------------- measuring

def mean_sd(values):
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def samples(result):
    """Every repetition's t/s (samples_ts), or the mean when absent."""
    values = result.get("samples_ts") or [result["avg_ts"]]
    return [float(v) for v in values]


def weight_dtype(result):
    """The weight type after the architecture and size of model_type, in the spelling of
    barellm's weight_dtype: "llama 1B F16" -> "F16", "llama 1B Q4_K - Medium" -> "Q4_K_M"."""
    words = str(result.get("model_type", "")).split()
    if len(words) < 3:
        return words[-1] if words else "?"
    name = " ".join(words[2:])
    for size in ("Small", "Medium", "Large"):
        name = name.replace(" - " + size, "_" + size[0])
    return name


def run_group(args, pair_index, gguf, model, threads, checks, work, header):
    """All rounds of one model pair at one thread count: the rows of its tests."""
    label = f"{os.path.basename(model)}, {threads} thread{'s' if threads > 1 else ''}"
    ours, theirs = [], []  # per round: ({test key: result}, peak RSS bytes)
    group_checks = [checks.check(threads, f"{label}, before the first run")]
    barellm_cmd = [args.barellm, "bench", model, "--threads", str(threads), "-p",
                   str(args.p), "-n", str(args.n), "-d", str(args.d), "-r", str(args.r),
                   "-o", "json"]
    if args.simd:
        barellm_cmd += ["--simd", args.simd]
    llama_cmd = [args.llama_bench, "-m", gguf, "-t", str(threads), "-p", str(args.p),
                 "-n", str(args.n), "-d", str(args.d), "-r", str(args.r), "-o", "json"]
    if args.device == "cuda":
        barellm_cmd += ["--device", "cuda"]
        llama_cmd += ["-ngl", str(ALL_LAYERS)]
    steps = [(tool, r) for r in range(1, args.rounds + 1) for tool in ("barellm", "llamacpp")]
    if args.order == "blocks":
        steps.sort(key=lambda step: step[0] != "barellm")
    for index, (tool, r) in enumerate(steps):
        name = f"{tool}-{pair_index}-t{threads}-{r}"
        progress(f"{label}: round {r}/{args.rounds}: "
                 f"{'barellm bench' if tool == 'barellm' else 'llama-bench'}")
        stdout, stderr, peak = run_tool(name, barellm_cmd if tool == "barellm" else llama_cmd,
                                        work)
        results = parse_results(stdout, "barellm" if tool == "barellm" else "llama-bench")
        (ours if tool == "barellm" else theirs).append(
            ({test_key(t): t for t in results}, peak, stderr))
        if index % 2 == 1:  # after every second run: between rounds, and after the last
            group_checks.append(checks.check(threads, f"{label}, after run {index + 1}"))
    header.setdefault("llamacpp_simd", llamacpp_simd(args.llama_bench, theirs[0][2]))
    first_llama = next(iter(theirs[0][0].values()), {})
    first_ours = next(iter(ours[0][0].values()), {})
    header.setdefault("llamacpp_commit", first_llama.get("build_commit", "unknown"))
    if args.device == "cuda":
        if not first_llama.get("gpu_info"):
            raise Failure(f"llama-bench names no GPU (gpu_info): {args.llama_bench} is not a "
                          "CUDA build, or found no GPU; it would be timed on the CPU")
        header.setdefault("gpu", first_llama["gpu_info"])
    header.setdefault("barellm_simd", first_ours.get("simd", "unknown"))
    header.setdefault("cpu_extensions", first_ours.get("cpu_extensions", "unknown"))
    busy = [c for c in group_checks if c["busy"]]
    rows = []
    keys = sorted(set().union(*(r for r, _, _ in ours), *(r for r, _, _ in theirs)),
                  key=lambda k: (k[1] != 0, k))
    for key in keys:
        rows.append(make_row(args, key, gguf, model, threads, ours, theirs, busy, header))
    return rows


def make_row(args, key, gguf, model, threads, ours, theirs, busy, header):
    threshold = args.threshold
    our_results = [r[key] for r, _, _ in ours if key in r]
    their_results = [r[key] for r, _, _ in theirs if key in r]
    row = {"model": os.path.basename(model), "gguf": os.path.basename(gguf),
           "dtype": weight_dtype(our_results[0]).lower() if our_results else "?",
           "llamacpp_dtype": weight_dtype(their_results[0]) if their_results else "?",
           "threads": threads, "test": test_label(key),
           "llamacpp_simd": header["llamacpp_simd"], "barellm_simd": header["barellm_simd"]}
    flags = []
    for tool, results, peaks in (("llamacpp", their_results, [p for _, p, _ in theirs]),
                                 ("barellm", our_results, [p for _, p, _ in ours])):
        values = [v for t in results for v in samples(t)]
        mean, sd = mean_sd(values) if values else (None, None)
        row[f"{tool}_ts"], row[f"{tool}_ts_spread"] = mean, sd
        if mean and sd / mean > threshold:
            flags.append(f"{'llama.cpp' if tool == 'llamacpp' else 'barellm'} spread "
                         f"{100 * sd / mean:.0f}%")
        if tool == "barellm":  # bench's own reading, before its bandwidth buffer
            peaks = [t.get("peak_rss_bytes") or p for t, p in zip(results, peaks)]
        row[f"{tool}_peak_rss_mib"] = round(max(peaks) / MIB, 1) if peaks else None
    for field, name in (("gbps", "barellm_gbps"), ("bw_pct", "barellm_bw_pct")):
        values = [t[field] for t in our_results if isinstance(t.get(field), (int, float))]
        row[name] = statistics.fmean(values) if values else None
    ratios = [b[key]["avg_ts"] / a[key]["avg_ts"] for (b, _, _), (a, _, _) in zip(ours, theirs)
              if key in a and key in b and a[key]["avg_ts"] > 0]
    row["round_ratios"] = [round(r, 4) for r in ratios]
    row["ratio"], row["ratio_spread"] = mean_sd(ratios) if ratios else (None, None)
    if len(ratios) == 1:
        flags.append("one round")
    elif ratios and (max(ratios) - min(ratios)) / statistics.fmean(ratios) > threshold:
        flags.append(f"rounds disagree by "
                     f"{100 * (max(ratios) - min(ratios)) / statistics.fmean(ratios):.0f}%")
    if busy:
        flags.append(f"machine busy in {len(busy)} check{'s' if len(busy) > 1 else ''}")
    row["flagged"], row["flags"] = bool(flags), flags
    return {field: row[field] for field in ROW_FIELDS}


# ---------------------------------------------------------------------------- output

def short(value):
    """Two decimals, or three significant digits below 0.1."""
    if value is None:
        return "-"
    return f"{value:.2f}" if abs(value) >= 0.1 or value == 0 else f"{value:.3g}"


def checks_summary(checks):
    """The worst of the machine checks, in words."""
    if not checks:
        return "none"
    return (f"load average up to {max(c['load1'] for c in checks):.2f}, "
            f"up to {max(c['others'] for c in checks):.1f} other runnable tasks, "
            f"spin loop up to {max(c['slowdown'] for c in checks):.2f}x its fastest, "
            f"spinners got at least {100 * min(c['cpu_share'] for c in checks):.0f}% of a core")


def markdown(document):
    h = document["header"]
    out = io.StringIO()
    print("## barellm against llama.cpp", file=out)
    print(file=out)
    print(f"- CPU: {h['cpu_model']}, {h['physical_cores']} physical cores "
          f"({h['logical_cpus']} logical); threads: {', '.join(map(str, h['threads']))}",
          file=out)
    if h["device"] == "cuda":
        print(f"- GPU: {h.get('gpu', 'unknown')}; both tools on the GPU (barellm --device "
              f"cuda, llama-bench -ngl {ALL_LAYERS}); % bw: of the device-to-device copy",
              file=out)
    print(f"- barellm {h['barellm_commit']}, SIMD {h['barellm_simd']} "
          f"(the CPU offers {h['cpu_extensions']})", file=out)
    print(f"- llama.cpp {h['llamacpp_commit']}, SIMD {h['llamacpp_simd']}", file=out)
    depth = f"-d {h['n_depth']} " if h["n_depth"] else ""
    print(f"- {h['date']}; {h['rounds']} rounds, {h['order']}; -p {h['n_prompt']} "
          f"-n {h['n_gen']} {depth}-r {h['repetitions']}", file=out)
    busy = [c for c in document["checks"] if c["busy"]]
    print(f"- machine checks: {len(document['checks'])}, "
          + (f"BUSY in {len(busy)}" if busy else "all idle") + " (" + checks_summary(
              document["checks"]) + ")", file=out)
    print(f"- command: `{h['command']}`", file=out)
    print(file=out)
    print("| model | dtype | threads | test | llama.cpp t/s | barellm t/s "
          "| ratio (barellm/llama.cpp) | rounds | llama.cpp MiB | barellm MiB | barellm GB/s "
          "| % bw | flags |", file=out)
    print("| --- | --- | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |",
          file=out)
    for row in document["rows"]:
        ratio = "-" if row["ratio"] is None else short(row["ratio"])
        if row["ratio"] is not None and len(row["round_ratios"]) > 1:
            ratio += f" ± {row['ratio_spread']:.2f}"
        if row["flagged"] and row["ratio"] is not None:
            ratio = f"({ratio})"
        dtype = row["dtype"] if row["dtype"].upper() == row["llamacpp_dtype"].upper() \
            else f"{row['dtype']} / {row['llamacpp_dtype']}"
        cells = [row["model"], dtype, str(row["threads"]), row["test"],
                 f"{short(row['llamacpp_ts'])} ± {short(row['llamacpp_ts_spread'])}",
                 f"{short(row['barellm_ts'])} ± {short(row['barellm_ts_spread'])}",
                 ratio, ", ".join(short(r) for r in row["round_ratios"]),
                 short(row["llamacpp_peak_rss_mib"]), short(row["barellm_peak_rss_mib"]),
                 short(row["barellm_gbps"]),
                 "-" if row["barellm_bw_pct"] is None else f"{row['barellm_bw_pct']:.0f}%",
                 "; ".join(row["flags"]) or "ok"]
        print("| " + " | ".join(cells) + " |", file=out)
    if any(row["flagged"] for row in document["rows"]):
        print(file=out)
        print(f"Ratios in parentheses are flagged (spread or rounds over "
              f"{100 * h['threshold']:.0f}%, one round, or a busy machine): rerun before "
              "quoting them.", file=out)
    return out.getvalue()


def csv_text(document):
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=ROW_FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in document["rows"]:
        writer.writerow({**row, "round_ratios": ";".join(map(str, row["round_ratios"])),
                         "flags": ";".join(row["flags"]), "flagged": int(row["flagged"])})
    return out.getvalue()


def plot(document, path):
    """t/s against thread count: one panel per test, one line per tool and model."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise Failure("--plot needs matplotlib (python3 -m pip install matplotlib)")
    rows = document["rows"]
    tests = sorted({r["test"] for r in rows}, key=lambda t: (not t.startswith("pp"), t))
    models = sorted({r["model"] for r in rows})
    figure, axes = plt.subplots(1, len(tests), figsize=(6.5 * len(tests), 4.8), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for axis, test in zip(axes[0], tests):
        for m, model in enumerate(models):
            mine = sorted((r for r in rows if r["test"] == test and r["model"] == model),
                          key=lambda r: r["threads"])
            for tool, name, style, file_key in (("barellm", "barellm", "-o", "model"),
                                                ("llamacpp", "llama.cpp", "--s", "gguf")):
                points = [r for r in mine if r[f"{tool}_ts"] is not None]
                axis.errorbar([r["threads"] for r in points], [r[f"{tool}_ts"] for r in points],
                              yerr=[r[f"{tool}_ts_spread"] for r in points], fmt=style,
                              color=colors[m % len(colors)], capsize=3,
                              label=f"{name}: {mine[0][file_key] if mine else model}")
            for r in mine:
                if r["flagged"] and r["barellm_ts"] is not None:
                    axis.annotate("flagged", (r["threads"], r["barellm_ts"]),
                                  textcoords="offset points", xytext=(4, 6), fontsize=8,
                                  color="red")
        axis.set_title(test)
        axis.set_xlabel("threads")
        axis.set_ylabel("tokens per second")
        axis.set_xticks(sorted({r["threads"] for r in rows}))
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8, loc="best")
    h = document["header"]
    figure.suptitle(f"barellm {h['barellm_commit']} ({h['barellm_simd']}) against llama.cpp "
                    f"{h['llamacpp_commit']} ({h['llamacpp_simd']})\n{h['cpu_model']}, "
                    f"{h['date']}", fontsize=10)
    figure.text(0.5, 0.01, "solid: barellm, dashed: llama.cpp; error bars: standard deviation "
                "of the repetitions; \"flagged\": see the flags of the table", ha="center",
                fontsize=8, color="dimgray")
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)


# ---------------------------------------------------------------------------- main

def thread_list(text):
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of numbers")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("thread counts must be at least 1")
    return values


def positive(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number")
    if value < 0:
        raise argparse.ArgumentTypeError(f"'{text}' is negative")
    return value


class Parser(argparse.ArgumentParser):
    def error(self, message):
        print(f"{PROGRAM}: {message} (--help for the usage)", file=sys.stderr)
        sys.exit(2)


def parse_args(argv):
    parser = Parser(prog="compare_llamacpp.sh", add_help=False)
    parser.add_argument("-h", "--help", action="store_true")
    parser.add_argument("files", nargs="*")
    parser.add_argument("-t", "--threads", type=thread_list)
    parser.add_argument("-p", type=positive, default=512)
    parser.add_argument("-n", type=positive, default=128)
    parser.add_argument("-d", type=positive, default=0)
    parser.add_argument("-r", type=positive, default=5)
    parser.add_argument("--rounds", type=positive, default=2)
    parser.add_argument("--order", choices=("alternate", "blocks"), default="alternate")
    parser.add_argument("--threshold", type=float, default=10.0)
    formats = parser.add_mutually_exclusive_group()
    formats.add_argument("--json", action="store_true")
    formats.add_argument("--csv", action="store_true")
    parser.add_argument("--plot")
    parser.add_argument("--barellm", default=os.path.join(REPO, "build", "barellm"))
    parser.add_argument("--simd", choices=("scalar", "avx2", "avx512"))
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--raw")
    args = parser.parse_args(argv)
    if args.help:
        print(__doc__.strip())
        sys.exit(0)
    if len(args.files) < 3 or len(args.files) % 2 == 0:
        parser.error("needs LLAMA_BENCH and one or more GGUF BARELLM_FILE pairs")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.r < 1:
        parser.error("-r must be at least 1")
    if args.p == 0 and args.n == 0:
        parser.error("-p 0 -n 0 leaves nothing to measure")
    if not 0 < args.threshold < 100:
        parser.error("--threshold is a percentage between 0 and 100")
    args.threshold /= 100
    args.llama_bench = args.files[0]
    args.pairs = list(zip(args.files[1::2], args.files[2::2]))
    for tool in (args.llama_bench, args.barellm):
        if not (os.path.isfile(tool) and os.access(tool, os.X_OK)):
            parser.error(f"{tool} is not an executable file"
                         + (" (make build/barellm)" if tool == args.barellm else ""))
    if not os.access(GNU_TIME, os.X_OK):
        parser.error(f"{GNU_TIME} (GNU time, for the peak memory) is missing: "
                     "apt-get install time")
    for gguf, model in args.pairs:
        for path in (gguf, model):
            if not os.path.isfile(path):
                parser.error(f"{path}: no such file")
    if args.plot and not args.plot.lower().endswith(".png"):
        parser.error("--plot writes a .png file")
    inputs = [args.llama_bench, args.barellm, *args.files[1:]]
    if args.plot and (os.path.isdir(args.plot) or
                      (os.path.exists(args.plot) and not os.path.isfile(args.plot)) or
                      any(same_file(args.plot, path) for path in inputs)):
        parser.error(f"--plot {args.plot}: not a new or regular file apart from the inputs")
    if args.raw and os.path.exists(args.raw) and not (os.path.isdir(args.raw) and
                                                      not os.listdir(args.raw)):
        parser.error(f"--raw {args.raw}: not a new or empty folder (the outputs it keeps "
                     "would replace what is there)")
    return args


def same_file(a, b):
    """Whether two paths name one existing file, however spelled."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def compare(args, argv):
    cpuinfo = read_cpuinfo()
    cores = physical_cores(cpuinfo)
    threads = args.threads or [cores]
    checks = MachineChecks(args.threshold)
    header = {
        "device": args.device,
        "cpu_model": cpuinfo_field(cpuinfo, "model name") or "unknown",
        "physical_cores": cores, "logical_cpus": os.cpu_count(), "threads": threads,
        "barellm_commit": git_commit(args.barellm),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "rounds": args.rounds, "order": args.order, "n_prompt": args.p, "n_gen": args.n,
        "n_depth": args.d, "repetitions": args.r, "threshold": args.threshold,
        "command": shlex.join(["scripts/compare_llamacpp.sh", *argv]),
    }
    if max(threads) > cores:
        progress(f"warning: {max(threads)} threads on {cores} physical cores: "
                 "hardware threads share a core's arithmetic units")
    work = args.raw or tempfile.mkdtemp(prefix="compare_llamacpp.")
    os.makedirs(work, exist_ok=True)
    rows = []
    try:
        for index, (gguf, model) in enumerate(args.pairs, 1):
            for t in threads:
                rows += run_group(args, index, gguf, model, t, checks, work, header)
    finally:
        if not args.raw:
            for name in os.listdir(work):
                os.remove(os.path.join(work, name))
            os.rmdir(work)
    return {"header": header, "checks": checks.done, "rows": rows}


def main(argv):
    args = parse_args(argv)
    try:
        document = compare(args, argv)
        if args.json:
            text = json.dumps(document, indent=2) + "\n"
        elif args.csv:
            text = csv_text(document)
        else:
            text = markdown(document)
        if args.plot:
            plot(document, args.plot)
            progress(f"plot written to {args.plot}")
    except (Failure, ValueError) as e:
        print(f"{PROGRAM}: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
