"""The barellm command line: what a user sees, and how it refuses bad input.

Every refusal is one line on stderr naming the problem and exit code 1 (2 for a wrong
command line; run with no arguments, the usage follows) — never a signal, never a
traceback."""

import json
import re
import os
import signal
import struct
import subprocess

import pytest

from convert_testlib import (BUILD, CONVERT, STORIES, assert_wrong_command_line, need_shared,
                             run)

BARELLM = os.path.join(BUILD, "barellm")
EVAL = os.path.join(os.path.dirname(STORIES), "..", "eval")


def barellm(*args, input_text=None):
    if not os.path.exists(BARELLM):
        pytest.fail(f"{BARELLM} is missing: run `make` first")
    return subprocess.run([BARELLM, *map(str, args)], capture_output=True, text=True,
                          timeout=120, input=input_text)


@pytest.fixture(scope="module")
def stories(tmp_path_factory):
    need_shared(STORIES)
    path = str(tmp_path_factory.mktemp("model") / "stories-f32.bin")
    result = run(CONVERT, STORIES, "-o", path, "--dtype", "f32")
    assert result.returncode == 0, result.stderr
    return path


def assert_refused(result, message):
    """Exit 1 with exactly one stderr line, which contains `message`."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1, result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("barellm: ") and message in lines[0], lines[0]


def test_greedy_story_about_lily(stories):
    result = barellm("run", stories, "-p", "Once upon a time", "--temp", "0", "-n", "40")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Once upon a time, there was a little girl named Lily.")
    assert "generated: 40 tokens" in result.stderr


def test_generation_stops_at_the_context_end(stories):
    result = barellm("run", stories, "-p", "Once upon a time", "--temp", "0", "-n", "100",
                     "--ctx", "20")
    assert result.returncode == 0, result.stderr
    assert "context full (20 tokens)" in result.stderr


def test_sampling_is_reproducible_with_a_seed(stories):
    runs = [barellm("run", stories, "-p", "Once", "--temp", "1", "--top-p", "0.9", "--seed",
                    "7", "-n", "30").stdout for _ in range(2)]
    assert runs[0] == runs[1]
    other = barellm("run", stories, "-p", "Once", "--temp", "1", "--seed", "8", "-n", "30")
    assert other.stdout != runs[0]


def test_a_temperature_that_overflows_the_logits_samples_the_largest(stories):
    greedy = barellm("run", stories, "-p", "Once", "--temp", "0", "-n", "20")
    tiny = barellm("run", stories, "-p", "Once", "--temp", "1.2e-38", "--seed", "1", "-n", "20")
    assert tiny.returncode == 0, tiny.stderr
    assert tiny.stdout == greedy.stdout


def test_ppl_prints_the_llama_cpp_line(stories):
    text = os.path.join(EVAL, "tinystories_valid_sample.txt")
    need_shared(text)
    result = barellm("ppl", stories, "-f", text, "--ctx", "128", "--chunks", "3")
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("PPL = ") and " +/- " in last
    assert 1 < float(last.split()[2]) < 50


def test_tokenize_and_detokenize_round_trip(stories):
    ids = json.loads(barellm("tokenize", stories, "-p", "Once upon a time", "--bos").stdout)
    assert ids[0] == 1 and len(ids) > 2
    assert barellm("detokenize", stories, "-p", json.dumps(ids[1:])).stdout == \
        "Once upon a time\n"


def test_info_and_help(stories):
    info = barellm("info", stories)
    assert info.returncode == 0 and "layers          5" in info.stdout
    assert barellm("--help").returncode == 0
    # The CPU kernels in use, lowered by --simd.
    kernels = re.search(r"^cpu kernels +(\S+)", info.stdout, re.M)
    assert kernels and re.fullmatch(r"scalar|avx2|avx512(\+vnni)?(\+bf16)?", kernels.group(1))
    lowered = barellm("info", stories, "--simd", "scalar")
    assert re.search(r"^cpu kernels +scalar$", lowered.stdout, re.M), lowered.stdout


def test_barellm_run_bare_prints_its_usage():
    result = barellm()
    assert result.returncode == 2
    assert result.stderr == "barellm: no command given\n\n" + barellm("--help").stdout


@pytest.mark.parametrize("args,message", [
    (["run"], "run needs a MODEL file"),
    (["run", "m.bin", "--bogus"], "unknown option --bogus"),
    (["run", "m.bin", "-p"], "-p needs a value"),
    (["run", "m.bin", "-n", "ten"], "-n needs an integer"),
    (["run", "m.bin", "--temp", "-1"], "--temp needs a number"),
    # Only plain decimal numbers: no hexadecimal, spaces, trailing text, "inf" or "nan".
    (["run", "m.bin", "--temp", "0x10"], "--temp needs a number"),
    (["run", "m.bin", "--temp", " 1"], "--temp needs a number"),
    (["run", "m.bin", "--temp", "1 "], "--temp needs a number"),
    (["run", "m.bin", "--temp", "1e"], "--temp needs a number"),
    (["run", "m.bin", "--temp", "1.5x"], "--temp needs a number"),
    (["run", "m.bin", "--temp", "."], "--temp needs a number"),
    (["run", "m.bin", "--temp", "nan"], "--temp needs a number"),
    (["run", "m.bin", "--top-p", "inf"], "--top-p needs a number"),
    (["run", "m.bin", "--min-p", "0x.8p0"], "--min-p needs a number"),
    (["run", "m.bin", "--repeat-penalty", "\t2"], "--repeat-penalty needs a number"),
    (["run", "m.bin", "-n", "0x10"], "-n needs an integer"),
    (["run", "m.bin", "-n", " 10"], "-n needs an integer"),
    (["run", "m.bin", "-n", "10abc"], "-n needs an integer"),
    (["run", "m.bin", "-n", "1e3"], "-n needs an integer"),
    (["run", "m.bin", "--top-k", "+-3"], "--top-k needs an integer"),
    (["run", "m.bin", "--seed", "0x5"], "--seed needs an integer"),
    (["run", "m.bin", "--ctx", "\n64"], "--ctx needs an integer"),
    (["run", "m.bin", "--threads", "0x2"], "--threads needs an integer"),
    (["run", "m.bin", "--repeat-last-n", "8 "], "--repeat-last-n needs an integer"),
    (["ppl", "m.bin", "--chunks", "2x"], "--chunks needs an integer"),
    (["bench", "m.bin", "-r", "0x1"], "-r needs an integer"),
    (["bench", "m.bin", "-p", " 8"], "-p needs an integer"),
    (["bench", "m.bin", "-d", "4k"], "-d needs an integer, got '4k'"),
    (["bench", "m.bin", "-d", "1.5"], "-d needs an integer"),
    (["bench", "m.bin", "-d", "-1"], "-d must be in [0, 1073741824], got '-1'"),
    (["bench", "m.bin", "-d"], "-d needs a value"),
    # A value quoted in the message is an excerpt of it.
    (["run", "m.bin", "-n", "9" * 5000 + "x"], "-n needs an integer, got '" + "9" * 60 + "...'"),
    (["run", "m.bin", "--kv", "f8"], "--kv takes f16 or f32"),
    (["frobnicate", "m.bin"], "unknown command 'frobnicate'"),
])
def test_wrong_command_lines_are_one_line_and_exit_2(args, message):
    assert_wrong_command_line(barellm(*args), "barellm", message)


def test_bad_requests_on_a_good_model(stories, tmp_path):
    assert_refused(barellm("run", stories, "-p", "word " * 600),
                   "longer than the context of 512")
    assert_refused(barellm("run", stories, "-p", "hi", "--ctx", "100000"),
                   "exceeds the model's maximum context of 512")
    assert_refused(barellm("run", stories, "-p", "hi", "--device", "cuda"), "--device cuda")
    assert_refused(barellm("ppl", stories, "-f", tmp_path / "none.txt"), "cannot open")
    short = tmp_path / "short.txt"
    short.write_text("Once upon a time")
    assert_refused(barellm("ppl", stories, "-f", short), "fewer than one chunk")
    assert_refused(barellm("detokenize", stories, "-p", "[1, 99999]"), "not a token id")


def truncations(path):
    """Cuts of a valid file at every section boundary and inside each section."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        (header,) = struct.unpack("<Q", f.read(8))
    data = 8 + header
    return sorted({0, 1, 7, 8, 9, 8 + header // 2, data - 1, data, data + 1,
                   (data + size) // 2, size - 1})


def test_truncated_files_are_refused(stories, tmp_path):
    with open(stories, "rb") as f:
        content = f.read()
    for cut in truncations(stories):
        broken = tmp_path / f"cut{cut}.bin"
        broken.write_bytes(content[:cut])
        result = barellm("run", broken, "-p", "Once")
        assert_refused(result, str(broken))


def write_with_header(path, header, data=b""):
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


@pytest.mark.parametrize("name,content,message", [
    ("missing", None, "cannot open"),
    ("random", os.urandom(4096), "not a safetensors file"),
    ("huge_header", struct.pack("<Q", 1 << 60) + b"{}", "does not fit the file size"),
    ("not_json", struct.pack("<Q", 8) + b"{{{{{{{{", "safetensors header: not valid JSON"),
    ("text", b"Once upon a time there was a model file", "not a safetensors file"),
])
def test_hostile_files_are_refused(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    assert_refused(barellm("info", path), message)


@pytest.mark.parametrize("name,header,message", [
    ("wrong_types", {"t": {"dtype": 7, "shape": "big", "data_offsets": [0, 4]}},
     "unsupported dtype"),
    ("i64", {"t": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}},
     "unsupported dtype \"I64\""),
    ("out_of_range", {"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1 << 40]}},
     "outside the"),
    ("absurd_shape", {"t": {"dtype": "F32", "shape": [1 << 40, 1 << 40],
                            "data_offsets": [0, 8]}}, "size overflows"),
    ("overlap", {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                 "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, "overlap"),
    ("no_metadata", {"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
     "not a barellm weight file"),
    ("bad_config", {"__metadata__": {"barellm.format": "1", "barellm.config": "{]"}},
     "barellm.config: not valid JSON"),
    ("gpt2", {"__metadata__": {"barellm.format": "1",
                               "barellm.config": json.dumps({"architecture": "gpt2"})}},
     "\"gpt2\" is not supported"),
])
def test_hostile_headers_are_refused(tmp_path, name, header, message):
    path = write_with_header(tmp_path / name, header, b"\x01" * 16)
    assert_refused(barellm("info", path), message)


def test_ctrl_c_stops_ppl_cleanly_with_a_result(stories):
    text = os.path.join(EVAL, "wiki.test.raw")
    need_shared(text)
    process = subprocess.Popen([BARELLM, "ppl", stories, "-f", text, "--ctx", "256",
                                "--threads", "1", "--device", "cpu"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    # Wait for the first chunk to be scored, then interrupt.
    first_line = process.stderr.readline()
    assert first_line.startswith("[1/"), first_line
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    assert "interrupted after" in stderr
    assert stdout.startswith("PPL = ")
