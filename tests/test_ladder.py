"""`barellm ladder`: every rung computes the same model, and the table has its shape.

What must be equal, and why (all on stories260K, converted to f32):

- rungs 1 and 2 (scalar kernels, 1 thread vs 2 threads) do the same arithmetic in the same
  order (threads only split rows and heads): identical text, at any length;
- rung 7 (q8 weights, the CPU's best kernels, batched prefill) is exactly what
  `barellm run --temp 0` does on a q8 file from convert.py (the in-memory quantization is
  byte-identical to the converter's, see test_in_memory_weights_equal_the_converters):
  identical text, at any length;
- rungs 3 and 4 both run the f32 weights as they are, against x in f32 (the AVX-512 path
  rounds x to f16 only for f16 and bf16 weights): AVX2 sums a dot product in 8 lanes,
  AVX-512 in two registers of 16, so they differ in the last bits, as scalar and SIMD
  do. On a CPU without AVX-512, rung 4 runs rung 3's AVX2 kernels: the same arithmetic,
  identical text at any length (checked where the JSON says so);
- rungs 3 and 4 (f32) and rung 5 (f16) differ from `run` on the same dtype in rounding:
  rungs 1-6 feed the prompt one token at a time, `run` as one batch, and the batched GEMM
  sums in another order. With AVX-512, rung 5 also rounds x to f16 in every matrix-vector
  product of the prompt, which `run` does only in decode (its prefill GEMM reads x in f32).
  Rounding can flip a near-tie in a long greedy text, so they are compared over 40 tokens,
  where they agree;
- rung 6 (q8 weights, prompt token by token) quantizes the activations to int8 in every
  matrix-vector product, while the batched prefill of `run` keeps them in f32 (with
  AVX-512 VNNI it quantizes them too, a token at a time, and then sums in another order):
  a larger difference than rounding. Over 40 tokens from "Once upon a time" it still agrees
  (with some other prompts it does not: "The cat sat" diverges within 40 tokens);
- scalar vs SIMD (rungs 2 and 3) and AVX2 vs AVX-512 (rungs 3 and 4) differ in the last
  bits of each dot product; over 40 tokens from "Once upon a time" every rung, f32 to q8,
  gives the same text as the fastest path (rung 7). That is a fact about this model and
  prompt, checked here, not a law: q8 weights move logits by far more than rounding.

The GPU ladder (`--device cuda`, tests that skip without a usable GPU): every rung runs the
file's weights; its kernels differ in the order they sum (a thread, a warp or a block per
row; one or several attention splits) and rungs 1-5 keep the KV cache in f32, rungs 6-8 in
f16. Over 40 tokens from "Once upon a time" every rung gives the text of
`barellm run --device cuda --temp 0`, the fast path.
"""

import functools
import json
import os
import re
import subprocess
import sys

import pytest

from convert_testlib import (BUILD, CONVERT, STORIES, SYNTH, assert_wrong_command_line,
                             cuda_unavailable_reason, need_shared, require_cuda, run)

BARELLM = os.path.join(BUILD, "barellm")
COPY_CHECK = os.path.join(BUILD, "model_copy_check")
PROMPT = "Once upon a time"


def barellm(*args, timeout=300):
    if not os.path.exists(BARELLM):
        pytest.fail(f"{BARELLM} is missing: run `make` first")
    return subprocess.run([BARELLM, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


COLUMNS = ["rung", "what changed", "threads", "tok/s", "spread", "GB/s", "% bw", "speed-up",
           "note"]
RUNG, CHANGE, THREADS, TOKS, SPREAD, GBPS, PERCENT, SPEEDUP, NOTE = range(len(COLUMNS))


def assert_percent_of_bandwidth(row, bandwidth):
    """The "% bw" cell is 100 × GB/s ÷ bandwidth, up to the rounding of the three printed
    numbers (GB/s to 3 decimals, the bandwidth to 1, the percentage to 1)."""
    gbps, percent = float(row[GBPS]), float(row[PERCENT][:-1])
    expected = 100 * gbps / bandwidth
    rounding = expected * (0.05 / bandwidth + 0.0005 / gbps) + 0.05
    assert abs(percent - expected) <= rounding * 1.01, row


@pytest.fixture(scope="module")
def stories(tmp_path_factory):
    """stories260K converted to each dtype: {"f32": path, ...}."""
    need_shared(STORIES)
    folder = tmp_path_factory.mktemp("ladder")
    paths = {}
    for dtype in ("f32", "f16", "bf16", "q8"):
        paths[dtype] = str(folder / f"stories-{dtype}.bin")
        result = run(CONVERT, STORIES, "-o", paths[dtype], "--dtype", dtype)
        assert result.returncode == 0, result.stderr
    return paths


def rung_texts(model, prompt, tokens):
    result = barellm("ladder", model, "--check-text", prompt, "-n", tokens, "--threads", 2)
    assert result.returncode == 0, result.stderr
    rungs = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["rung"] for r in rungs] == [1, 2, 3, 4, 5, 6, 7]
    return {r["rung"]: r for r in rungs}


def run_text(model, prompt, tokens):
    result = barellm("run", model, "-p", prompt, "--temp", 0, "-n", tokens, "--threads", 2)
    assert result.returncode == 0, result.stderr
    return result.stdout.rstrip("\n")


def best_simd_level():
    """The kernels this CPU runs at best, read from the flags in /proc/cpuinfo (a second
    reading of what barellm asks CPUID): "avx512", "avx2" or "scalar"."""
    with open("/proc/cpuinfo") as f:
        flags = next((set(line.split(":", 1)[1].split()) for line in f
                      if line.startswith("flags")), set())
    if not {"avx2", "fma", "f16c"} <= flags:
        return "scalar"
    return "avx512" if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags else "avx2"


def test_rungs_have_the_weights_threads_and_kernels_they_claim(stories):
    rungs = rung_texts(stories["f32"], PROMPT, 4)
    claimed = [(r["weights"], r["threads"], r["prompt"]) for r in rungs.values()]
    assert claimed == [("F32", 1, "token by token"), ("F32", 2, "token by token"),
                       ("F32", 2, "token by token"), ("F32", 2, "token by token"),
                       ("F16", 2, "token by token"), ("Q8", 2, "token by token"),
                       ("Q8", 2, "batched prefill")]
    best = best_simd_level()
    assert rungs[1]["simd"] == rungs[2]["simd"] == "scalar"
    assert rungs[3]["simd"] == ("scalar" if best == "scalar" else "avx2")
    assert [rungs[r]["simd"] for r in (4, 5, 6, 7)] == [best] * 4
    # A rung whose kernels the CPU lacks says so, and which it runs instead.
    assert rungs[3]["change"].startswith("+ AVX2/FMA SIMD kernels")
    assert ("not on this CPU" in rungs[3]["change"]) == (best == "scalar")
    assert rungs[4]["change"] == {"avx512": "+ AVX-512 kernels",
                                  "avx2": "+ AVX-512 kernels (not on this CPU: AVX2)",
                                  "scalar": "+ AVX-512 kernels (not on this CPU: scalar)"}[best]


def test_every_rung_gives_the_greedy_text_of_run_on_the_same_weights(stories):
    rungs = rung_texts(stories["f32"], PROMPT, 40)
    runs = {dtype: run_text(stories[dtype], PROMPT, 40) for dtype in ("f32", "f16", "q8")}
    assert runs["f32"].startswith("Once upon a time, there was a little girl named Lily.")
    weights = {"F32": "f32", "F16": "f16", "Q8": "q8"}
    for number, rung in rungs.items():
        assert rung["text"] == runs[weights[rung["weights"]]], f"rung {number}: {rung}"
    # ...and here every rung also gives the text of the fastest path (see the docstring).
    assert len({rung["text"] for rung in rungs.values()}) == 1


def test_exact_rungs_stay_identical_over_a_long_text(stories):
    """Rungs 1 = 2 and rung 7 = `run` on q8 compute exactly the same numbers, and so do
    rungs 3 = 4 on a CPU without AVX-512 (both then run the AVX2 kernels)."""
    rungs = rung_texts(stories["f32"], "One day, a big dog", 200)
    assert rungs[1]["text"] == rungs[2]["text"]
    assert rungs[7]["text"] == run_text(stories["q8"], "One day, a big dog", 200)
    assert len(rungs[7]["text"]) > 400
    if rungs[3]["simd"] == rungs[4]["simd"]:
        assert rungs[3]["text"] == rungs[4]["text"]


def test_in_memory_weights_equal_the_converters(stories):
    """model_copy's f16, bf16 and q8 conversions of the f32 file are byte for byte what
    convert.py writes from the checkpoint."""
    if not os.path.exists(COPY_CHECK):
        pytest.fail(f"{COPY_CHECK} is missing: run `make` first")
    for dtype in ("f16", "bf16", "q8"):
        result = subprocess.run([COPY_CHECK, stories["f32"], stories[dtype]],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.startswith("identical: 36 matrices"), result.stdout
    # A different source (f16 rounding first) gives different q8 bytes: the check can fail.
    result = subprocess.run([COPY_CHECK, stories["f16"], stories["q8"]], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1 and result.stdout.startswith("DIFFERENT"), result.stdout


def parse_table(stdout):
    rows = [line for line in stdout.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert header == COLUMNS
    assert re.fullmatch(r"\|( -*:? \|)+", rows[1]), rows[1]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def last_level_cache_bytes():
    """The largest-level data or unified cache of CPU 0 in sysfs, read here as a second
    reading of what barellm reads; 0 when unknown."""
    base, best = "/sys/devices/system/cpu/cpu0/cache", (0, 0)
    if not os.path.isdir(base):
        return 0
    for index in os.listdir(base):
        folder = os.path.join(base, index)
        try:
            with open(os.path.join(folder, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(folder, "level")) as f:
                level = int(f.read())
            with open(os.path.join(folder, "size")) as f:
                size = f.read().strip()
        except (OSError, ValueError):
            continue
        units = {"K": 1024, "M": 1024 * 1024}
        size_bytes = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
        if kind in ("Data", "Unified") and level > best[0]:
            best = (level, size_bytes)
    return best[1]


def ladder_table(model, *args):
    result = barellm("ladder", model, *args)
    assert result.returncode == 0, result.stderr
    return parse_table(result.stdout), result.stdout


@functools.lru_cache(maxsize=None)
def shared_ladder_table(model, *args):
    """ladder_table, run once for each model and arguments and shared by the tests that read
    different columns of the same table: a run takes at least 10.5 s (7 rungs, 3 timings of at
    least 0.5 s each)."""
    return ladder_table(model, *args)


def assert_rows_well_formed(rows):
    for row in rows:
        assert float(row[TOKS]) > 0 and float(row[GBPS]) > 0, row
        assert re.fullmatch(r"\d+\.\d%", row[SPREAD]), row
        assert re.fullmatch(r"\d+\.\d\dx", row[SPEEDUP]), row
    assert rows[0][SPEEDUP] == "1.00x"


def assert_warnings_match_the_table(rows, stdout, threads):
    """A warning for each rung whose spread is above 10%, and one for other runnable tasks
    beyond the CPUs the ladder's threads leave free by more than half a task; no other."""
    load = re.search(r"^other runnable tasks before the ladder: ([\d.]+) \(mean over 0.5 s\) "
                     r"on (\d+) CPUs$", stdout, re.M)
    assert load, stdout
    warned = dict(re.findall(r"^warning: rung (\d+) varied by ([\d.]+)% between its 3 "
                             r"repetitions", stdout, re.M))
    # The table and the warning print the spread to 0.1%, the test is on the unrounded value.
    spreads = {row[RUNG]: float(row[SPREAD][:-1]) for row in rows}
    for rung, spread in spreads.items():
        if abs(spread - 10) > 0.05:
            assert (rung in warned) == (spread > 10), stdout
        if rung in warned:
            assert float(warned[rung]) == spread, stdout
    busy = float(load.group(1)) > max(0, int(load.group(2)) - threads) + 0.5
    assert busy == ("other runnable tasks before the ladder started" in stdout), stdout


@pytest.mark.parametrize("model", ["f32", "q8"])
def test_the_ladder_table_has_seven_rungs_with_numbers(stories, model):
    rows, stdout = shared_ladder_table(stories[model], "-n", 8, "-p", 12, "--threads", 2)
    assert [row[RUNG] for row in rows] == ["1", "2", "3", "4", "5", "6", "7"]
    changes = [row[CHANGE] for row in rows]
    assert changes[0] == "scalar kernels, 1 thread, f32 weights"
    assert changes[1] == "+ OpenMP, 2 threads"
    assert changes[2].startswith("+ AVX2/FMA SIMD kernels")
    assert changes[3].startswith("+ AVX-512 kernels")
    assert changes[4:6] == ["+ f16 weights", "+ q8 weights"]
    assert changes[6] == "+ batched prefill (12-token prompt)"
    assert_rows_well_formed(rows)
    assert "every rung: 3 timings of at least 0.5 s each" in stdout
    assert "rungs 1-6: passes of 8 decode steps from random ids" in stdout
    assert re.search(r"rung 7: a 12-token prompt, [\d.]+ tok/s token by token with rung 6's "
                     r"kernels", stdout)
    assert "weight bytes read per token: F32 1040128; F16 521472; Q8 278752;" in stdout
    assert_warnings_match_the_table(rows, stdout, threads=2)


def test_other_work_on_every_cpu_is_flagged(stories):
    """A busy-looping process on each CPU: the ladder counts about one other runnable task
    per CPU before it starts and warns that they compete with its threads."""
    cpus = len(os.sched_getaffinity(0))
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(cpus)]
    try:
        _, stdout = ladder_table(stories["f32"], "-n", 8, "-p", 12, "--threads", 2)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    others = re.search(r"^other runnable tasks before the ladder: ([\d.]+)", stdout, re.M)
    assert others and float(others.group(1)) >= cpus - 0.5, stdout
    assert re.search(r"^warning: [\d.]+ other runnable tasks before the ladder started, on "
                     rf"{cpus} CPUs: other work competes with the ladder's 2 threads$",
                     stdout, re.M), stdout


def test_the_threads_column_says_what_each_rung_uses(stories):
    """stories260K by hand: the largest decode product is the output matrix, 512 × 64 =
    32768 multiply-adds, below the 65536 a thread must have, so decode uses 1 thread of
    the 2 asked; a 12-token prefill batches w1 and w3, 2 × 172 × 64 × 12 = 264192, enough
    for 2."""
    rows, _ = shared_ladder_table(stories["f32"], "-n", 8, "-p", 12, "--threads", 2)
    assert [row[THREADS] for row in rows] == ["1", "1", "1", "1", "1", "1", "2"]
    assert rows[1][NOTE].startswith(
        "asks for 2 threads, uses 1: its largest step (the output matrix, 32768 "
        "multiply-adds) is below 65536 multiply-adds per thread"), rows[1]
    # Said once, where the threads change, not again on the rungs after it.
    assert all("asks for" not in row[NOTE] for row in rows[2:]), rows
    # With 4 tokens the prefill's w1 and w3 are 88064 multiply-adds: one thread.
    rows, _ = shared_ladder_table(stories["f32"], "-n", 8, "-p", 4, "--threads", 2)
    assert rows[6][THREADS] == "1"


def test_a_model_in_the_cache_has_no_percent_of_bandwidth(stories):
    cache = last_level_cache_bytes()
    if cache < 1040128:
        pytest.skip(f"the last-level cache ({cache} bytes) does not hold stories260K in f32")
    rows, stdout = shared_ladder_table(stories["f32"], "-n", 8, "-p", 12, "--threads", 2)
    assert [row[PERCENT] for row in rows] == ["fits in cache"] * 7
    assert "last-level cache: L" in stdout and f"{cache / 1048576:.1f} MiB" in stdout


# Two layers of dim 1024: about 105 MB in f32, 53 MB in f16, 28 MB in q8 (untied output).
BIG_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024,
    "intermediate_size": 2816, "num_hidden_layers": 2, "num_attention_heads": 8,
    "num_key_value_heads": 8, "vocab_size": 512, "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
    "torch_dtype": "float32",
}


def test_percent_of_bandwidth_only_for_weights_larger_than_the_cache(tmp_path):
    """On a model whose f32 weights exceed the last-level cache, those rungs get a % bw
    (GB/s over the measured bandwidth); rungs whose weights fit say so instead."""
    cache = last_level_cache_bytes()
    if cache == 0:
        pytest.skip("no last-level cache size in sysfs here")
    need_shared(STORIES)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(BIG_CONFIG))
    hf = tmp_path / "hf"
    result = run(SYNTH, "--config", config, "--tokenizer", STORIES, "-o", hf, "--dtype", "f32")
    assert result.returncode == 0, result.stderr
    model = tmp_path / "big.bin"
    result = run(CONVERT, hf, "-o", model, "--dtype", "f32")
    assert result.returncode == 0, result.stderr
    rows, stdout = ladder_table(model, "-n", 2, "-p", 2, "--threads", 1)
    sizes = re.search(r"weight bytes read per token: F32 (\d+); F16 (\d+); Q8 (\d+);", stdout)
    f32, f16, q8 = (int(sizes.group(i)) for i in (1, 2, 3))
    if f32 <= cache:
        pytest.skip(f"the last-level cache ({cache} bytes) holds this model's {f32} bytes")
    bandwidth = re.search(r"memory bandwidth \(streaming read, 1 threads, same run\): "
                          r"([\d.]+) GB/s", stdout)
    assert bandwidth, stdout
    for row, weight_bytes in zip(rows, [f32, f32, f32, f32, f16, q8, q8]):
        if weight_bytes <= cache:
            assert row[PERCENT] == "fits in cache", row
        else:
            assert_percent_of_bandwidth(row, float(bandwidth.group(1)))
    assert_rows_well_formed(rows)


def test_a_slower_rung_says_why(stories):
    """Every rung slower than the one it is compared with carries a reason in its note;
    a rung that is not slower carries none (the timings decide which rungs these are, so
    the test checks the pairing, not which rungs are slower)."""
    reasons = ("slower within the noise", "the machine is busy", "weights fit in cache",
               "costs more than", "the threads' start and join", "no AVX2 here",
               "no AVX-512 here", "memory-bound", "unexpected")
    for model in ("f32", "q8"):
        rows, stdout = shared_ladder_table(stories[model], "-n", 8, "-p", 12, "--threads", 2)
        token_by_token = re.search(r"rung 7: a 12-token prompt, ([\d.]+) tok/s token by token",
                                   stdout)
        before = [float(row[TOKS]) for row in rows[:5]] + [float(token_by_token.group(1))]
        for row, speed_before in zip(rows[1:], before):
            slower = float(row[TOKS]) < speed_before
            assert slower == any(reason in row[NOTE] for reason in reasons), row


@pytest.fixture(scope="module")
def cuda():
    require_cuda()


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_every_gpu_rung_gives_the_text_of_the_fast_path(cuda, stories, dtype):
    result = barellm("ladder", stories[dtype], "--device", "cuda", "--check-text", PROMPT, "-n", 40)
    assert result.returncode == 0, result.stderr
    rungs = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["rung"] for r in rungs] == [1, 2, 3, 4, 5, 6, 7, 8]
    claimed = [(r["weights"], r["kv"], r["graph"], r["flash_decoding"]) for r in rungs]
    weights = dtype.upper()
    assert claimed == [(weights, "f32", False, False)] * 5 + [
        (weights, "f16", False, False), (weights, "f16", True, False),
        (weights, "f16", True, True)]
    fast = barellm("run", stories[dtype], "-p", PROMPT, "--temp", 0, "-n", 40, "--device", "cuda")
    assert fast.returncode == 0, fast.stderr
    assert fast.stdout.startswith("Once upon a time, there was a little girl named Lily.")
    for rung in rungs:
        assert rung["text"] == fast.stdout.rstrip("\n"), f"rung {rung['rung']}: {rung}"


def test_the_gpu_ladder_table_has_eight_rungs_with_numbers(cuda, stories):
    result = barellm("ladder", stories["f32"], "--device", "cuda", "-n", 8)
    assert result.returncode == 0, result.stderr
    rows = parse_table(result.stdout)
    assert [row[RUNG] for row in rows] == [str(n) for n in range(1, 9)]
    assert rows[0][CHANGE].startswith("naive port: a thread per matrix row")
    assert rows[7][CHANGE].startswith("+ flash-decoding")
    assert all(row[THREADS] == "GPU" for row in rows), rows
    bandwidth = re.search(r"memory bandwidth \(device-to-device copy, same run\): ([\d.]+) GB/s",
                          result.stdout)
    assert bandwidth and float(bandwidth.group(1)) > 0, result.stdout
    for row in rows:
        assert_percent_of_bandwidth(row, float(bandwidth.group(1)))
    assert_rows_well_formed(rows)
    assert "weight bytes read per token: F32 1040128; KV cache per position: f32 1280" in (
        result.stdout)


def test_the_gpu_ladder_refuses_without_a_gpu(stories):
    """Runs where there is no GPU (CI): one line on stderr, exit status 1."""
    if cuda_unavailable_reason() is None:
        pytest.skip("a CUDA GPU is present: the no-GPU message cannot be checked here")
    result = barellm("ladder", stories["f32"], "--device", "cuda", "-n", 4)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith("barellm: ladder --device cuda: the GPU")
    assert result.stdout == ""


@pytest.mark.parametrize("args, message", [
    (["-n", "0"], "ladder needs -n of at least 1"),
    (["-p", "many"], "-p needs an integer"),
    (["--device", "cuda", "-p", "12"], "ladder --device cuda times decode only"),
])
def test_ladder_usage_errors(stories, args, message):
    assert_wrong_command_line(barellm("ladder", stories["f32"], *args), "barellm", message)


def test_the_ladder_refuses_more_positions_than_the_model_has(stories):
    result = barellm("ladder", stories["f32"], "-n", 600)
    assert result.returncode == 1
    assert "ladder needs 600 positions, beyond the model's 512" in result.stderr
