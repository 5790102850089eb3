"""`barellm bench`: the machine it reports (CPU model, SIMD level, physical cores, threads)
against what Linux itself says in /proc/cpuinfo and /sys, its peak-memory field, and the
bandwidth each run is set against."""

import json
import os
import re
import subprocess
import sys

import pytest

from convert_testlib import BUILD, CONVERT, STORIES, need_shared, run

BARELLM = os.path.join(BUILD, "barellm")


def cpuinfo_field(name):
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == name:
                return value.strip()
    return None


def physical_cores_from_sys():
    """Distinct (package, core) pairs of the CPUs this process may run on, from /sys."""
    pairs = set()
    for cpu in os.sched_getaffinity(0):
        topology = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        if not os.path.exists(f"{topology}/core_id"):
            pytest.skip("/sys has no CPU topology here")
        with open(f"{topology}/physical_package_id") as package, open(f"{topology}/core_id") as core:
            pairs.add((package.read().strip(), core.read().strip()))
    return len(pairs)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    need_shared(STORIES)
    if not os.path.exists(BARELLM):
        pytest.fail(f"{BARELLM} is missing: run `make` first")
    path = str(tmp_path_factory.mktemp("bench") / "stories-f32.bin")
    result = run(CONVERT, STORIES, "-o", path, "--dtype", "f32")
    assert result.returncode == 0, result.stderr
    return path


def bench(model, *args, threads_env=None):
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if threads_env:
        env["OMP_NUM_THREADS"] = threads_env
    return subprocess.run([BARELLM, "bench", model, "-p", "9", "-n", "5", "-r", "2", *args],
                          capture_output=True, text=True, timeout=120, env=env)


def best_simd_level(flags):
    """The level barellm should pick on a CPU with these /proc/cpuinfo flags."""
    if not {"avx2", "fma", "f16c"} <= flags:
        return "scalar"
    return "avx512" if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags else "avx2"


def test_json_names_the_machine_and_the_simd_level(model):
    result = bench(model, "-o", "json")
    assert result.returncode == 0, result.stderr
    tests = json.loads(result.stdout)
    assert [(t["n_prompt"], t["n_gen"]) for t in tests] == [(9, 0), (0, 5)]
    flags = set(cpuinfo_field("flags").split())
    for test in tests:
        assert test["cpu_info"] == cpuinfo_field("model name")
        assert test["physical_cores"] == physical_cores_from_sys()
        assert test["n_threads"] == physical_cores_from_sys()  # the default
        assert test["simd"] == best_simd_level(flags)
        extensions = test["cpu_extensions"].split()
        # barellm's names, and /proc/cpuinfo's where they differ.
        cpuinfo_names = {"avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16"}
        assert extensions == [name for name in ("avx", "avx2", "fma", "avx512f", "avx512bw",
                                                "avx512vl", "avx512vnni", "avx512bf16")
                              if cpuinfo_names.get(name, name) in flags], test["cpu_extensions"]
        # Read before the 1 GiB bandwidth buffer: a 1 MB model stays far below it.
        assert 0 < test["peak_rss_bytes"] < 256 << 20


def test_each_run_is_set_against_the_bandwidth_measured_after_it(model):
    result = bench(model, "-o", "json", "-r", "3")
    assert result.returncode == 0, result.stderr
    for test in json.loads(result.stdout):
        tokens = test["n_prompt"] + test["n_gen"]
        speeds, bandwidths = test["samples_ts"], test["samples_bandwidth_gbps"]
        assert len(speeds) == len(bandwidths) == 3 and min(bandwidths) > 0
        assert test["bandwidth_gbps"] == pytest.approx(sum(bandwidths) / 3, rel=1e-9)
        # gbps is the bytes of a run over the mean seconds of a run; each run's own GB/s
        # is those bytes over its seconds, tokens / its t/s.
        seconds = [tokens / s for s in speeds]
        bytes_per_run = test["gbps"] * 1e9 * sum(seconds) / 3
        shares = [bytes_per_run / s / 1e9 / bw for s, bw in zip(seconds, bandwidths)]
        assert test["bw_pct"] == pytest.approx(100 * sum(shares) / 3, rel=1e-9)


def test_markdown_header_names_the_machine(model):
    result = bench(model)
    assert result.returncode == 0, result.stderr
    header = result.stdout.splitlines()[0]
    match = re.fullmatch(r"cpu: (.*), (\d+) physical cores; simd: (\w+)(\+vnni)?(\+bf16)? "
                         r"\(the CPU offers (.*)\); threads: (\d+)", header)
    assert match, header
    flags = set(cpuinfo_field("flags").split())
    assert match.group(1) == cpuinfo_field("model name")
    assert match.group(3) == best_simd_level(flags)
    assert bool(match.group(4)) == (match.group(3) == "avx512" and "avx512_vnni" in flags)
    assert bool(match.group(5)) == (match.group(3) == "avx512" and "avx512_bf16" in flags)
    assert int(match.group(2)) == physical_cores_from_sys()
    assert int(match.group(7)) == physical_cores_from_sys()


def test_peak_memory_is_barellms_own_not_its_parents(model):
    """A parent holding 400 MiB starts bench on a 1 MB model: the peak reported is bench's own
    (getrusage's ru_maxrss would carry the parent's peak through fork and exec)."""
    script = ("import subprocess, sys\n"
              "held = bytearray(400 << 20)\n"
              "for i in range(0, len(held), 4096): held[i] = 1\n"
              "sys.stdout.write(subprocess.run(sys.argv[1:], capture_output=True, text=True,"
              " timeout=120).stdout)\n")
    result = subprocess.run([sys.executable, "-c", script, BARELLM, "bench", model, "-p", "9",
                             "-n", "5", "-r", "2", "-o", "json"], capture_output=True, text=True,
                            timeout=180)
    tests = json.loads(result.stdout)
    assert all(0 < test["peak_rss_bytes"] < 256 << 20 for test in tests), tests


@pytest.mark.parametrize("level", ["scalar", "avx2", "avx512"])
def test_simd_forces_a_lower_level_and_refuses_a_higher_one(model, level):
    flags = set(cpuinfo_field("flags").split())
    order = ["scalar", "avx2", "avx512"]
    result = bench(model, "--simd", level, "-o", "json")
    if order.index(level) > order.index(best_simd_level(flags)):
        assert result.returncode == 2
        assert (f"--simd {level}: this CPU runs at most {best_simd_level(flags)}"
                in result.stderr.strip().splitlines()[-1])
    else:
        assert result.returncode == 0, result.stderr
        assert {test["simd"] for test in json.loads(result.stdout)} == {level}


def test_simd_refuses_an_unknown_level(model):
    result = bench(model, "--simd", "avx1024")
    assert result.returncode == 2
    assert "--simd takes scalar, avx2 or avx512" in result.stderr


@pytest.mark.parametrize("args, env, threads", [
    (["--threads", "3"], None, 3),
    ([], "1", 1),
])
def test_threads_follow_the_flag_then_omp_num_threads(model, args, env, threads):
    result = bench(model, "-o", "json", *args, threads_env=env)
    assert result.returncode == 0, result.stderr
    assert {t["n_threads"] for t in json.loads(result.stdout)} == {threads}


def bytes_per_run(test):
    """The bytes bench counts for one run of a test: gbps is those bytes over the mean
    seconds of a run, and each run's seconds are its tokens over its t/s."""
    tokens = test["n_prompt"] + test["n_gen"]
    seconds = [tokens / s for s in test["samples_ts"]]
    return test["gbps"] * 1e9 * sum(seconds) / len(seconds)


def kv_bytes_per_position():
    """A position's keys and values over all layers in the default f16 cache, from the
    checkpoint's config."""
    with open(os.path.join(STORIES, "config.json")) as f:
        config = json.load(f)
    return 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * config["head_dim"] * 2


def test_depth_names_the_tests_as_llama_bench_does(model):
    deep = bench(model, "-d", "32", "-o", "json")
    assert deep.returncode == 0, deep.stderr
    assert [(t["n_prompt"], t["n_gen"], t["n_depth"]) for t in json.loads(deep.stdout)] == [
        (9, 0, 32), (0, 5, 32)]
    plain = bench(model, "-o", "json")
    assert plain.returncode == 0, plain.stderr
    assert [t["n_depth"] for t in json.loads(plain.stdout)] == [0, 0]
    for args, names in ((["-d", "32"], ["pp9 @ d32", "tg5 @ d32"]), ([], ["pp9", "tg5"])):
        result = bench(model, *args)
        assert result.returncode == 0, result.stderr
        rows = [line.split("|") for line in result.stdout.splitlines()
                if line.startswith("| llama ")]
        assert [cells[6].strip() for cells in rows] == names, result.stdout


def test_a_test_at_depth_counts_the_deeper_kv_reads(model):
    """Each position of pp9 and tg5 at depth 100 attends to 100 positions more than at depth
    0: bench's bytes per run (its GB/s times its seconds) grow by tokens x 100 positions'
    keys and values, the weights' bytes being the same."""
    depth = 100
    runs = {}
    for d in (0, depth):
        result = bench(model, "-d", str(d), "-o", "json")
        assert result.returncode == 0, result.stderr
        runs[d] = {(t["n_prompt"], t["n_gen"]): t for t in json.loads(result.stdout)}
    for key, test in runs[depth].items():
        tokens = sum(key)
        added = bytes_per_run(test) - bytes_per_run(runs[0][key])
        assert added == pytest.approx(tokens * depth * kv_bytes_per_position(), rel=1e-6), key


def test_depth_fills_up_to_the_context_and_no_further(model):
    """stories260K holds 512 positions: -d 503 with -p 9 runs its last prefill row at 511;
    -d 504 would need 513 and is refused in one line."""
    full = bench(model, "-d", "503", "-o", "json")
    assert full.returncode == 0, full.stderr
    assert [t["n_depth"] for t in json.loads(full.stdout)] == [503, 503]
    beyond = bench(model, "-d", "504")
    assert beyond.returncode == 1 and beyond.stdout == ""
    assert beyond.stderr == "barellm: bench needs 513 positions, beyond the model's 512\n"
