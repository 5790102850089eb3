"""scripts/compare_llamacpp.sh: its table against the numbers the two tools printed.

A stand-in llama-bench (a small script printing llama-bench's JSON with known samples)
keeps the test independent of a llama.cpp build; barellm runs for real on stories260K."""

import json
import os
import re
import stat
import statistics
import subprocess

import pytest

from convert_testlib import BUILD, CONVERT, REPO, STORIES, need_shared, run

SCRIPT = os.path.join(REPO, "scripts", "compare_llamacpp.sh")
BARELLM = os.path.join(BUILD, "barellm")

# The stand-in llama-bench: round r (counted in a file) reports these t/s samples.
FAKE_LLAMA_BENCH = """#!/usr/bin/env python3
import json, os, sys
counter = os.path.join(os.path.dirname(sys.argv[0]), "calls")
calls = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
open(counter, "w").write(str(calls))
if os.environ.get("FAKE_FAIL"):
    print("fake llama-bench: failing as asked", file=sys.stderr)
    sys.exit(1)
samples = {"pp": [[4000.0, 5000.0], [6000.0, 7000.0]], "tg": [[900.0, 1100.0], [1300.0, 1500.0]]}
tests = []
for kind, n_prompt, n_gen in (("pp", 9, 0), ("tg", 0, 5)):
    values = samples[kind][(calls - 1) % 2]
    tests.append({"n_prompt": n_prompt, "n_gen": n_gen, "n_threads": 1,
                  "avg_ts": sum(values) / len(values), "stddev_ts": 0.0,
                  "samples_ts": values, "model_type": "fake", "model_size": 1000})
print(json.dumps(tests))
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    need_shared(STORIES)
    if not os.path.exists(BARELLM):
        pytest.fail(f"{BARELLM} is missing: run `make` first")
    folder = tmp_path_factory.mktemp("compare")
    model = str(folder / "stories-f32.bin")
    result = run(CONVERT, STORIES, "-o", model, "--dtype", "f32")
    assert result.returncode == 0, result.stderr
    gguf = folder / "model.gguf"  # only passed through to the stand-in
    gguf.write_bytes(b"GGUF")
    return folder, model, str(gguf)


def compare(folder, model, gguf, *args, env=None):
    fake = folder / "bin" / "llama-bench"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(FAKE_LLAMA_BENCH)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    (fake.parent / "calls").unlink(missing_ok=True)
    return subprocess.run([SCRIPT, str(fake), gguf, model, "-t", "1", "-p", "9", "-n", "5",
                           "-r", "2", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def table_rows(stdout):
    return {row[0]: row for row in (
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in stdout.splitlines() if re.match(r"\| (pp|tg)\d", line))}


def barellm_rounds(raw, rounds):
    return [{(t["n_prompt"], t["n_gen"]): t
             for t in json.loads(open(raw / f"barellm-{r}.json").read())}
            for r in range(1, rounds + 1)]


def test_one_round_shows_both_tools_and_their_ratio(files, tmp_path):
    folder, model, gguf = files
    result = compare(folder, model, gguf, "--raw", str(tmp_path))
    assert result.returncode == 0, result.stderr
    rows = table_rows(result.stdout)
    assert set(rows) == {"pp9", "tg5"}, result.stdout
    ours = barellm_rounds(tmp_path, 1)[0]
    for name, key, llama_samples in (("pp9", (9, 0), [4000.0, 5000.0]),
                                      ("tg5", (0, 5), [900.0, 1100.0])):
        llama_mean = statistics.fmean(llama_samples)
        assert rows[name][1] == f"{llama_mean:.2f} ± {statistics.stdev(llama_samples):.2f}"
        our_samples = ours[key]["samples_ts"]
        assert rows[name][2] == (f"{statistics.fmean(our_samples):.2f} ± "
                                 f"{statistics.stdev(our_samples):.2f}"), rows[name]
        assert float(rows[name][3]) == pytest.approx(ours[key]["avg_ts"] / llama_mean, abs=0.006)
    assert "ratio by round" not in result.stdout


def test_rounds_alternate_and_the_ratio_is_their_mean(files, tmp_path):
    folder, model, gguf = files
    result = compare(folder, model, gguf, "--rounds", "2", "--raw", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert (folder / "bin" / "calls").read_text() == "2"
    # The tools ran in alternation: llama-bench, barellm, llama-bench, barellm.
    order = [line.split()[1] for line in result.stderr.splitlines()
             if line.startswith("compare_llamacpp: ")]
    assert [os.path.basename(c) for c in order] == ["llama-bench", "barellm"] * 2, result.stderr
    rows = table_rows(result.stdout)
    ours = barellm_rounds(tmp_path, 2)
    for name, key, llama_means, llama_samples in (
            ("pp9", (9, 0), [4500.0, 6500.0], [4000.0, 5000.0, 6000.0, 7000.0]),
            ("tg5", (0, 5), [1000.0, 1400.0], [900.0, 1100.0, 1300.0, 1500.0])):
        expected = f"{statistics.fmean(llama_samples):.2f} ± {statistics.stdev(llama_samples):.2f}"
        assert rows[name][1] == expected, rows[name]
        our_samples = [v for r in ours for v in r[key]["samples_ts"]]
        assert rows[name][2] == (f"{statistics.fmean(our_samples):.2f} ± "
                                 f"{statistics.stdev(our_samples):.2f}"), rows[name]
        ratios = [r[key]["avg_ts"] / m for r, m in zip(ours, llama_means)]
        mean, sd = rows[name][3].split(" ± ")
        assert float(mean) == pytest.approx(statistics.fmean(ratios), abs=0.006)
        assert float(sd) == pytest.approx(statistics.stdev(ratios), abs=0.006)
        by_round = re.search(rf"^{name} ratio by round: (.*)$", result.stdout, re.M)
        assert by_round, result.stdout
        assert [float(v) for v in by_round.group(1).split(", ")] == pytest.approx(ratios, abs=0.006)


def test_a_failing_llama_bench_stops_the_comparison(files):
    folder, model, gguf = files
    result = compare(folder, model, gguf, env={"FAKE_FAIL": "1"})
    assert result.returncode == 1
    assert "llamacpp-1 failed" in result.stderr and "failing as asked" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("args, message", [
    (["--rounds", "0"], "--rounds must be at least 1"),
    (["--rounds", "two"], "'two' is not a number"),
])
def test_bad_options_are_refused(files, args, message):
    folder, model, gguf = files
    result = compare(folder, model, gguf, *args)
    assert result.returncode == 2 and message in result.stderr, result.stderr
