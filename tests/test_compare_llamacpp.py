"""scripts/compare_llamacpp.sh against stand-ins for both tools.

The stand-ins (small Python scripts) print llama-bench's and `barellm bench`'s JSON with
known samples, so every number of the table is known in advance: t/s = BASE[test] x
threads x the model's factor (the number written in the model file), times 1.3 in every
second call when asked to be noisy. The machine checks are replayed from
COMPARE_LLAMACPP_FAKE_CHECKS, so an idle or a busy machine is chosen by the test; the
checks' decision rules are tested on the module itself. One test runs the real barellm."""

import csv
import importlib.util
import io
import json
import os
import re
import stat
import subprocess

import pytest

from convert_testlib import BUILD, CONVERT, REPO, STORIES, need_shared, run

SCRIPT = os.path.join(REPO, "scripts", "compare_llamacpp.sh")
BARELLM = os.path.join(BUILD, "barellm")

# t/s per thread of each stand-in for the tests pp9 and tg5; ratios 1.1 and 1.25.
LLAMA_BASE = {"pp": 100.0, "tg": 20.0}
BARELLM_BASE = {"pp": 110.0, "tg": 25.0}
BARELLM_PEAK = 123 << 20  # the peak_rss_bytes the barellm stand-in reports
LLAMA_ALLOCATES_MIB = 40  # what the llama-bench stand-in touches, to show in its peak

STAND_IN = r'''#!/usr/bin/env python3
import json, os, signal, sys, time
TOOL = "{tool}"
BASE = {base}
here = os.path.dirname(os.path.abspath(__file__))
args = sys.argv[1:]
def option(*names):
    for name in names:
        if name in args:
            return args[args.index(name) + 1]
    sys.exit(f"{{TOOL}}: missing {{names}}")
model = args[1] if TOOL == "barellm" else option("-m")
threads, prompt, gen = int(option("-t", "--threads")), int(option("-p")), int(option("-n"))
reps = int(option("-r"))
depth = int(option("-d")) if "-d" in args else 0
counter = os.path.join(here, TOOL + ".calls")
calls = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
open(counter, "w").write(str(calls))
with open(os.path.join(here, "order.log"), "a") as log:
    log.write(TOOL + "\n")
with open(os.path.join(here, TOOL + ".args"), "a") as log:
    log.write(" ".join(args) + "\n")
behaviour = os.environ.get("FAKE_" + TOOL.upper().replace("-", "_"), "")
if "fail" in behaviour:
    print(TOOL + " stand-in: failing as asked", file=sys.stderr)
    sys.exit(3)
if "illegal" in behaviour:
    os.kill(os.getpid(), signal.SIGILL)
if "slow" in behaviour:
    time.sleep(0.3)
if TOOL == "llama-bench" and "quiet" not in behaviour:
    print("CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | AVX512 = 1 |",
          file=sys.stderr)
if TOOL == "llama-bench":
    ballast = bytearray({allocate} << 20)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
factor = float(open(model).read().strip() or 1)
if "noisy" in behaviour and calls % 2 == 0:
    factor *= 1.3
tests = []
for kind, n_prompt, n_gen in (("pp", prompt, 0), ("tg", 0, gen)):
    if n_prompt + n_gen == 0:
        continue
    value = BASE[kind] * threads * factor
    values = [value] * reps
    if "spread" in behaviour:
        values = [value * (0.8 if i % 2 else 1.2) for i in range(reps)]
    test = {{"n_prompt": n_prompt, "n_gen": n_gen, "n_depth": depth, "n_threads": threads,
            "avg_ts": sum(values) / reps, "samples_ts": values,
            "model_type": "llama 0.01B " + ("F16" if TOOL == "llama-bench" else "f16")}}
    if TOOL == "llama-bench":
        test["build_commit"] = "abc1234"
        if "-ngl" in args and "cpu" not in behaviour:
            test["gpu_info"] = "Stand-in GPU 80GB"
    else:
        test.update(simd="avx2", cpu_extensions="avx avx2 fma avx512f",
                    peak_rss_bytes={peak}, gbps=1.5 * threads, bw_pct=50.0)
    tests.append(test)
print("a line before the JSON")
print(json.dumps(tests, indent=1))
'''

IDLE = {"load1": 0.2, "others": 0.0, "cpu_share": 1.0, "slowdown": 1.01}
BUSY = {"load1": 2.9, "others": 1.0, "cpu_share": 0.5, "slowdown": 2.0}


def write_stand_in(path, tool, base):
    path.write_text(STAND_IN.format(tool=tool, base=base, allocate=LLAMA_ALLOCATES_MIB,
                                    peak=BARELLM_PEAK))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def tools(tmp_path):
    """The two stand-ins and two model pairs (factors 1 and 2) in a fresh folder."""
    if not os.access("/usr/bin/time", os.X_OK):
        pytest.skip("GNU time (/usr/bin/time) is not installed: apt-get install time")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_stand_in(bin_dir / "llama-bench", "llama-bench", LLAMA_BASE)
    write_stand_in(bin_dir / "barellm", "barellm", BARELLM_BASE)
    models = []
    for name, factor in (("small", 1), ("large", 2)):
        for suffix in ("gguf", "bin"):
            (tmp_path / f"{name}.{suffix}").write_text(str(factor))
        models.append((str(tmp_path / f"{name}.gguf"), str(tmp_path / f"{name}.bin")))
    return bin_dir, models


def compare(tools, *args, pairs=1, checks=(IDLE,), env=None):
    bin_dir, models = tools
    files = [path for pair in models[:pairs] for path in pair]
    command = [SCRIPT, str(bin_dir / "llama-bench"), *files, "--barellm",
               str(bin_dir / "barellm"), "-p", "9", "-n", "5", "-r", "2", *args]
    environment = {**os.environ, "COMPARE_LLAMACPP_FAKE_CHECKS": json.dumps(list(checks)),
                   **(env or {})}
    return subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env=environment)


def compare_json(tools, *args, **kwargs):
    result = compare(tools, "--json", *args, **kwargs)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def table_rows(markdown):
    """The cells of each data row of the markdown table, by (model, threads, test)."""
    rows = {}
    for line in markdown.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 13 and re.fullmatch(r"(pp|tg)\d+( @ d\d+)?",
                                                                         cells[3]):
            rows[cells[0], int(cells[2]), cells[3]] = cells
    return rows


def cpuinfo_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    return "unknown"


def load_module():
    spec = importlib.util.spec_from_file_location(
        "compare_llamacpp", os.path.join(REPO, "scripts", "compare_llamacpp.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_markdown_names_the_machine_tools_and_ratios(tools):
    result = compare(tools, "-t", "1,3")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"- CPU: {cpuinfo_model()}, " in out
    assert "threads: 1, 3" in out
    assert "SIMD avx2 (the CPU offers avx avx2 fma avx512f)" in out  # barellm's own report
    assert "- llama.cpp abc1234, SIMD avx512" in out  # from its system-info line
    assert "2 rounds, alternate; -p 9 -n 5 -r 2" in out
    assert "machine checks: 6, all idle" in out  # 3 per thread count
    rows = table_rows(out)
    assert set(rows) == {("small.bin", t, test) for t in (1, 3) for test in ("pp9", "tg5")}
    for (_, threads, test), cells in rows.items():
        kind = test[:2]
        assert cells[1] == "f16"
        assert cells[4] == f"{LLAMA_BASE[kind] * threads:.2f} ± 0.00"
        assert cells[5] == f"{BARELLM_BASE[kind] * threads:.2f} ± 0.00"
        expected = BARELLM_BASE[kind] / LLAMA_BASE[kind]
        assert cells[6] == f"{expected:.2f} ± 0.00"
        assert cells[7] == f"{expected:.2f}, {expected:.2f}"
        assert cells[9] == "123.00"  # bench's own peak, before its bandwidth buffer
        assert float(cells[8]) >= LLAMA_ALLOCATES_MIB  # GNU time's peak of the stand-in
        assert (cells[10], cells[11]) == (f"{1.5 * threads:.2f}", "50%")
        assert cells[12] == "ok"
    assert "in parentheses" not in out


def test_depth_reaches_both_tools_and_names_the_rows(tools):
    result = compare(tools, "-t", "1", "-d", "32")
    assert result.returncode == 0, result.stderr
    assert "2 rounds, alternate; -p 9 -n 5 -d 32 -r 2" in result.stdout
    rows = table_rows(result.stdout)
    assert set(rows) == {("small.bin", 1, "pp9 @ d32"), ("small.bin", 1, "tg5 @ d32")}
    for (_, _, test), cells in rows.items():
        kind = test[:2]
        assert cells[6] == f"{BARELLM_BASE[kind] / LLAMA_BASE[kind]:.2f} ± 0.00"  # paired
    bin_dir, _ = tools
    for tool in ("barellm", "llama-bench"):
        calls = (bin_dir / f"{tool}.args").read_text().splitlines()
        assert len(calls) == 2 and all(" -d 32 " in call for call in calls), calls
    document = compare_json(tools, "-t", "1", "-d", "32")
    assert document["header"]["n_depth"] == 32
    assert [row["test"] for row in document["rows"]] == ["pp9 @ d32", "tg5 @ d32"]


def test_depth_is_part_of_a_tests_key_and_label():
    module = load_module()
    assert module.test_key({"n_prompt": 0, "n_gen": 128}) == (0, 128, 0)  # no n_depth: 0
    assert module.test_key({"n_prompt": 0, "n_gen": 128, "n_depth": 4096}) == (0, 128, 4096)
    assert [module.test_label(key) for key in ((512, 0, 0), (0, 128, 0), (0, 128, 4096),
                                               (512, 0, 4096), (16, 8, 32))] == [
        "pp512", "tg128", "tg128 @ d4096", "pp512 @ d4096", "pp16+tg8 @ d32"]


def test_device_cuda_runs_both_tools_on_the_gpu(tools):
    result = compare(tools, "-t", "1", "--device", "cuda")
    assert result.returncode == 0, result.stderr
    assert "- GPU: Stand-in GPU 80GB; both tools on the GPU" in result.stdout
    bin_dir, _ = tools
    for tool, flags in (("barellm", "--device cuda"), ("llama-bench", "-ngl 99")):
        calls = (bin_dir / f"{tool}.args").read_text().splitlines()
        assert len(calls) == 2 and all(call.endswith(flags) for call in calls), calls
    cpu_only = compare(tools, "-t", "1", "--device", "cuda", env={"FAKE_LLAMA_BENCH": "cpu"})
    assert cpu_only.returncode == 1
    assert "llama-bench names no GPU" in cpu_only.stderr
    for tool in ("llama-bench", "barellm"):
        (bin_dir / f"{tool}.args").unlink()
    plain = compare(tools, "-t", "1")
    assert "GPU" not in plain.stdout
    assert not any("-ngl" in call or "--device" in call
                   for tool in ("llama-bench", "barellm")
                   for call in (bin_dir / f"{tool}.args").read_text().splitlines())


def test_progress_lines_name_every_test_and_round(tools):
    result = compare(tools, "-t", "2", "--rounds", "3", env={"FAKE_BARELLM": "slow"})
    assert result.returncode == 0, result.stderr
    steps = re.findall(r"small\.bin, 2 threads: round (\d)/3: (barellm bench|llama-bench)",
                       result.stderr)
    assert steps == [(str(r), tool) for r in (1, 2, 3)
                     for tool in ("barellm bench", "llama-bench")]
    assert len(re.findall(r"machine check \(.*\): load .*: idle", result.stderr)) == 4


@pytest.mark.parametrize("order, expected", [
    ("alternate", ["barellm", "llama-bench"] * 3),
    ("blocks", ["barellm"] * 3 + ["llama-bench"] * 3),
])
def test_rounds_run_in_the_order_asked(tools, order, expected):
    document = compare_json(tools, "-t", "1", "--rounds", "3", "--order", order)
    assert (tools[0] / "order.log").read_text().split() == expected
    assert len(document["checks"]) == 4  # before the first round and after each pair of runs


def test_json_rows_carry_every_field(tools):
    document = compare_json(tools, "-t", "2")
    header = document["header"]
    assert header["cpu_model"] == cpuinfo_model()
    assert header["llamacpp_commit"] == "abc1234" and header["barellm_commit"] == "unknown"
    assert header["barellm_simd"] == "avx2" and header["llamacpp_simd"] == "avx512"
    assert [c["busy"] for c in document["checks"]] == [False] * 3
    assert len(document["rows"]) == 2
    for row in document["rows"]:
        assert list(row) == load_module().ROW_FIELDS
        kind = row["test"][:2]
        assert (row["model"], row["gguf"], row["threads"]) == ("small.bin", "small.gguf", 2)
        assert (row["dtype"], row["llamacpp_dtype"]) == ("f16", "F16")
        assert row["llamacpp_ts"] == pytest.approx(LLAMA_BASE[kind] * 2)
        assert row["barellm_ts"] == pytest.approx(BARELLM_BASE[kind] * 2)
        assert row["llamacpp_ts_spread"] == row["barellm_ts_spread"] == 0
        assert row["ratio"] == pytest.approx(BARELLM_BASE[kind] / LLAMA_BASE[kind])
        assert row["round_ratios"] == [pytest.approx(row["ratio"])] * 2
        assert row["barellm_peak_rss_mib"] == 123.0
        assert row["llamacpp_peak_rss_mib"] >= LLAMA_ALLOCATES_MIB
        assert (row["barellm_simd"], row["llamacpp_simd"]) == ("avx2", "avx512")
        assert (row["barellm_gbps"], row["barellm_bw_pct"]) == (3.0, 50.0)
        assert row["flagged"] is False and row["flags"] == []


@pytest.mark.parametrize("cache, expected", [
    ("GGML_NATIVE:BOOL=ON\nGGML_AVX2:BOOL=OFF\n", "native"),
    ("GGML_NATIVE:BOOL=ON\nCMAKE_C_FLAGS:STRING= -mno-amx-tile -mno-avx512f\n",
     "native without avx512"),
    ("GGML_NATIVE:BOOL=OFF\nGGML_AVX:BOOL=ON\nGGML_AVX2:BOOL=ON\nGGML_AVX512:BOOL=OFF\n",
     "avx2 (build options)"),
    (None, "unknown"),
])
def test_llamacpp_simd_from_its_build_when_it_prints_none(tools, cache, expected):
    bin_dir, _ = tools
    if cache is not None:  # the stand-in lives in BUILD/bin, as llama.cpp's binaries do
        (bin_dir.parent / "CMakeCache.txt").write_text("# CMake cache\n" + cache)
    if expected.startswith("native"):  # built with -march=native: this CPU's widest level
        with open("/proc/cpuinfo") as f:
            flags = next(line for line in f if line.startswith("flags")).split()
        if expected == "native without avx512":  # build_llamacpp.sh --no-avx512
            flags = [flag for flag in flags if not flag.startswith("avx512")]
        widest = ("avx512" if any(f.startswith("avx512") for f in flags) else
                  "avx2" if "avx2" in flags else "avx" if "avx" in flags else "scalar")
        expected = f"{widest} (native build)"
    document = compare_json(tools, "-t", "1", env={"FAKE_LLAMA_BENCH": "quiet"})
    assert document["header"]["llamacpp_simd"] == expected
    assert {row["llamacpp_simd"] for row in document["rows"]} == {expected}


def test_csv_has_the_json_rows(tools):
    result = compare(tools, "-t", "1,2", "--csv")
    assert result.returncode == 0, result.stderr
    reader = csv.DictReader(io.StringIO(result.stdout))
    assert reader.fieldnames == load_module().ROW_FIELDS
    rows = list(reader)
    assert [(r["threads"], r["test"]) for r in rows] == [("1", "pp9"), ("1", "tg5"),
                                                        ("2", "pp9"), ("2", "tg5")]
    for row in rows:
        kind, threads = row["test"][:2], int(row["threads"])
        assert float(row["llamacpp_ts"]) == pytest.approx(LLAMA_BASE[kind] * threads)
        assert float(row["barellm_ts"]) == pytest.approx(BARELLM_BASE[kind] * threads)
        assert float(row["ratio"]) == pytest.approx(BARELLM_BASE[kind] / LLAMA_BASE[kind])
        assert row["round_ratios"].count(";") == 1
        assert float(row["barellm_peak_rss_mib"]) == 123.0
        assert (row["barellm_simd"], row["llamacpp_simd"], row["flagged"]) == ("avx2", "avx512",
                                                                              "0")


def test_rounds_that_disagree_flag_the_row(tools):
    # Every second barellm call runs 1.3x faster: the rounds' ratios differ by 26%.
    document = compare_json(tools, "-t", "1", env={"FAKE_BARELLM": "noisy"})
    for row in document["rows"]:
        base = BARELLM_BASE[row["test"][:2]] / LLAMA_BASE[row["test"][:2]]
        assert row["round_ratios"] == [pytest.approx(base), pytest.approx(base * 1.3)]
        assert row["flagged"] and row["flags"] == ["barellm spread 15%", "rounds disagree by 26%"]


def test_a_wide_spread_flags_the_row_and_hides_no_ratio(tools):
    result = compare(tools, "-t", "1", env={"FAKE_LLAMA_BENCH": "spread"})
    assert result.returncode == 0, result.stderr
    for cells in table_rows(result.stdout).values():
        assert cells[6].startswith("(") and cells[6].endswith(")"), cells
        assert cells[12] == "llama.cpp spread 23%"  # samples 120, 80: sd 23.1% of the mean
    assert "Ratios in parentheses are flagged" in result.stdout


def test_a_threshold_above_the_noise_clears_the_flags(tools):
    document = compare_json(tools, "-t", "1", "--threshold", "30",
                            env={"FAKE_BARELLM": "noisy"})
    assert not any(row["flagged"] for row in document["rows"])


def test_a_busy_machine_flags_every_ratio_of_its_rounds(tools):
    # The second check (after round 1 of 1 thread) finds the machine busy; those of the
    # 2-thread rounds find it idle.
    result = compare(tools, "-t", "1,2", checks=(IDLE, BUSY, IDLE, IDLE, IDLE, IDLE))
    assert result.returncode == 0, result.stderr
    assert "machine checks: 6, BUSY in 1" in result.stdout
    assert "spin loop up to 2.00x its fastest" in result.stdout
    rows = table_rows(result.stdout)
    for (_, threads, _), cells in rows.items():
        if threads == 1:
            assert cells[6].startswith("("), cells
            assert cells[12] == "machine busy in 1 check"
        else:
            assert not cells[6].startswith("(") and cells[12] == "ok", cells
    assert "BUSY: spin loop 2.00x its fastest; spinner got 50% of a core" in result.stderr


def test_the_busy_rules(monkeypatch):
    module = load_module()
    threads = len(os.sched_getaffinity(0))  # every CPU used: no free core
    cases = [({}, False), ({"slowdown": 1.11}, True), ({"slowdown": 1.09}, False),
             ({"cpu_share": 0.85}, True), ({"others": 0.6}, True), ({"others": 0.4}, False)]
    monkeypatch.setenv("COMPARE_LLAMACPP_FAKE_CHECKS",
                       json.dumps([{**IDLE, **c} for c, _ in cases]))
    checks = module.MachineChecks(0.10)
    assert [checks.check(threads, "test")["busy"] for _ in cases] == [b for _, b in cases]


def test_a_sweep_covers_every_pair_and_thread_count(tools):
    document = compare_json(tools, "-t", "1,2,4", pairs=2)
    rows = {(r["model"], r["threads"], r["test"]): r for r in document["rows"]}
    assert len(rows) == len(document["rows"]) == 12
    for (model, threads, test), row in rows.items():
        factor = 2 if model == "large.bin" else 1
        assert row["llamacpp_ts"] == pytest.approx(LLAMA_BASE[test[:2]] * threads * factor)
        assert row["barellm_ts"] == pytest.approx(BARELLM_BASE[test[:2]] * threads * factor)
    assert len(document["checks"]) == 2 * 3 * 3


def test_plot_writes_a_png(tools, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is optional: --plot needs it")
    png = tmp_path / "sweep.png"
    result = compare(tools, "-t", "1,2", "--plot", str(png), pairs=2)
    assert result.returncode == 0, result.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20000
    assert f"plot written to {png}" in result.stderr


def test_plot_without_matplotlib_says_so(tools, tmp_path):
    blocker = tmp_path / "blocker" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    result = compare(tools, "-t", "1", "--plot", str(tmp_path / "x.png"),
                     env={"PYTHONPATH": str(blocker.parent)})
    assert result.returncode == 1
    assert "--plot needs matplotlib (python3 -m pip install matplotlib)" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "x.png").exists()


def test_a_failing_tool_stops_the_comparison(tools):
    result = compare(tools, "-t", "1", env={"FAKE_LLAMA_BENCH": "fail"})
    assert result.returncode == 1
    assert "llamacpp-1-t1-1 failed (exit status 3)" in result.stderr
    assert "failing as asked" in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""


def test_an_illegal_instruction_names_the_likely_cause(tools):
    result = compare(tools, "-t", "1", env={"FAKE_LLAMA_BENCH": "illegal"})
    assert result.returncode == 1
    assert "llamacpp-1-t1-1 failed (exit status 132)" in result.stderr
    assert "illegal instruction" in result.stderr and "--no-amx" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--rounds", "0"], "--rounds must be at least 1"),
    (["--rounds", "two"], "'two' is not a number"),
    (["-t", "1,x"], "'1,x' is not a comma-separated list of numbers"),
    (["-t", "0"], "thread counts must be at least 1"),
    (["--json", "--csv"], "not allowed with argument"),
    (["--plot", "out.svg"], "--plot writes a .png file"),
    (["--threshold", "0"], "--threshold is a percentage between 0 and 100"),
    (["-p", "0", "-n", "0"], "-p 0 -n 0 leaves nothing to measure"),
    (["-d", "-1"], "'-1' is negative"),
    (["-d", "deep"], "'deep' is not a number"),
])
def test_bad_options_are_refused(tools, args, message):
    result = compare(tools, *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr


def test_a_missing_model_or_an_odd_pair_is_refused(tools):
    bin_dir, models = tools
    for files in ([models[0][0]], [models[0][0], "/nonexistent.bin"]):
        result = subprocess.run([SCRIPT, str(bin_dir / "llama-bench"), *files, "--barellm",
                                 str(bin_dir / "barellm")], capture_output=True, text=True)
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr


def compare_with_the_real_barellm(tools, tmp_path, *options):
    """The script on the stand-in llama-bench and the real barellm (stories260K in f32):
    one thread, pp9 and tg5, with `options`, as --json; the finished process."""
    need_shared(STORIES)
    if not os.path.exists(BARELLM):
        pytest.fail(f"{BARELLM} is missing: run `make` first")
    model = str(tmp_path / "stories-f32.bin")
    result = run(CONVERT, STORIES, "-o", model, "--dtype", "f32")
    assert result.returncode == 0, result.stderr
    bin_dir, models = tools
    return subprocess.run(
        [SCRIPT, str(bin_dir / "llama-bench"), models[0][0], model, "-t", "1", "-p", "9",
         "-n", "5", *options, "--json"], capture_output=True, text=True, timeout=300,
        env={**os.environ, "COMPARE_LLAMACPP_FAKE_CHECKS": json.dumps([IDLE])})


def test_with_the_real_barellm(tools, tmp_path):
    """The real bench's JSON goes through: its SIMD level and its measured t/s."""
    raw = tmp_path / "raw"
    result = compare_with_the_real_barellm(tools, tmp_path, "-r", "2", "--raw", str(raw))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    ours = json.loads((raw / "barellm-1-t1-1.json").read_text())
    peak = max(json.loads((raw / f"barellm-1-t1-{r}.json").read_text())[0]["peak_rss_bytes"]
               for r in (1, 2))
    assert document["header"]["barellm_simd"] == ours[0]["simd"]
    assert document["header"]["cpu_extensions"] == ours[0]["cpu_extensions"]
    assert document["header"]["barellm_commit"] != "unknown"
    for row in document["rows"]:
        assert row["dtype"] == "f32" and row["barellm_ts"] > 0
        assert row["barellm_peak_rss_mib"] == round(peak / 2**20, 1)  # the larger round's


def test_depth_reaches_the_real_barellm(tools, tmp_path):
    """-d D reaches the real bench, whose n_depth pairs its rows with llama-bench's."""
    result = compare_with_the_real_barellm(tools, tmp_path, "-d", "16", "-r", "1", "--rounds",
                                           "1")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["rows"]
    assert [row["test"] for row in rows] == ["pp9 @ d16", "tg5 @ d16"]
    assert all(row["barellm_ts"] > 0 and row["ratio"] is not None for row in rows), rows


def test_simd_reaches_the_real_barellm(tools, tmp_path):
    """--simd LEVEL runs barellm's kernels of that level, which its bench reports."""
    result = compare_with_the_real_barellm(tools, tmp_path, "-r", "1", "--rounds", "1",
                                           "--simd", "scalar")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["header"]["barellm_simd"] == "scalar"


@pytest.mark.parametrize("model_type, expected", [
    ("llama 1B F16", "F16"),
    ("llama 1B Q8_0", "Q8_0"),
    ("llama 1B Q4_K - Medium", "Q4_K_M"),
    ("llama 7B Q5_K - Small", "Q5_K_S"),
    ("llama 1B Q6_K", "Q6_K"),
    ("qwen3 0.6B all F32", "all F32"),
])
def test_llama_bench_weight_types_read_as_barellm_spells_them(model_type, expected):
    assert load_module().weight_dtype({"model_type": model_type}) == expected
