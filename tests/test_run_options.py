"""`barellm run`'s prompt sources and sampling options on stories260K: -f and -p -, the
sampling steps against their definitions (a numpy greedy loop over the reference forward
pass for the repeat penalty; the limits where top-k, top-p and min-p keep only the most
probable token), --stop across token boundaries, --color, --device auto, the messages for
a Hugging Face directory or a GGUF given as MODEL, and every new flag malformed."""

import json
import os
import pty
import subprocess

import numpy as np
import pytest

from convert_testlib import BUILD, STORIES, assert_wrong_command_line, need_shared
from test_cli import barellm, stories  # noqa: F401  (stories: the f32 model fixture)

import model as reference  # noqa: E402  (reference/model.py, via conftest.py)

BARELLM = os.path.join(BUILD, "barellm")
PROMPT = "Once upon a time"


def completion(stories, *args, input_text=None):
    result = barellm("run", stories, *args, input_text=input_text)
    assert result.returncode == 0, result.stderr
    return result.stdout


def greedy(stories, n=40):
    return completion(stories, "-p", PROMPT, "--temp", "0", "-n", n)


# ---- where the prompt comes from ---------------------------------------------------------

def test_the_prompt_from_a_file_and_from_stdin(stories, tmp_path):
    want = greedy(stories)
    (tmp_path / "prompt.txt").write_text(PROMPT)
    assert completion(stories, "-f", tmp_path / "prompt.txt", "--temp", "0", "-n", 40) == want
    assert completion(stories, "-p", "-", "--temp", "0", "-n", 40, input_text=PROMPT) == want
    assert completion(stories, "-f", "-", "--temp", "0", "-n", 40, input_text=PROMPT) == want


def test_a_missing_prompt_file_is_one_line(stories, tmp_path):
    result = barellm("run", stories, "-f", tmp_path / "absent.txt")
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1
    assert "absent.txt: cannot open" in result.stderr


# ---- sampling ----------------------------------------------------------------------------

def reference_greedy_with_penalty(stories, prompt_ids, steps, penalty, last_n):
    """llama.cpp's repeat penalty over the last `last_n` tokens (prompt included), then
    argmax, on the numpy reference forward pass."""
    config, weights = reference.load(stories)
    ids = list(prompt_ids)
    for _ in range(steps):
        logits = reference.forward(config, weights, ids)[-1]
        for token in set(ids[-last_n:]):
            logits[token] = logits[token] / penalty if logits[token] > 0 else \
                logits[token] * penalty
        ids.append(int(np.argmax(logits)))
    return ids[len(prompt_ids):]


@pytest.mark.parametrize("penalty,last_n", [(1.3, 64), (3.0, 8), (0.5, 16)])
def test_the_repeat_penalty_matches_its_definition(stories, penalty, last_n):
    steps = 40
    prompt_ids = json.loads(barellm("tokenize", stories, "-p", PROMPT, "--bos").stdout)
    want = reference_greedy_with_penalty(stories, prompt_ids, steps, penalty, last_n)
    text = barellm("detokenize", stories, "-p", json.dumps(prompt_ids[1:] + want)).stdout
    got = completion(stories, "-p", PROMPT, "--temp", "0", "-n", steps, "--repeat-penalty",
                     penalty, "--repeat-last-n", last_n)
    assert got == text
    assert got != greedy(stories, steps)  # the penalty changed something


@pytest.mark.parametrize("option", [["--top-k", "1"], ["--min-p", "1"], ["--top-p", "1e-9"]])
def test_filters_that_keep_only_the_most_probable_token_are_greedy(stories, option):
    """At a high temperature the draw is random unless the filter leaves one token."""
    got = completion(stories, "-p", PROMPT, "-n", 40, "--temp", "5", "--seed", "3", *option)
    assert got == greedy(stories)
    assert completion(stories, "-p", PROMPT, "-n", 40, "--temp", "5", "--seed", "3") != got


@pytest.mark.parametrize("options", [
    ["--top-k", "5"], ["--min-p", "0.1"], ["--top-p", "0.5"],
    ["--repeat-penalty", "1.5", "--repeat-last-n", "10"],
    ["--top-k", "20", "--top-p", "0.8", "--min-p", "0.05", "--repeat-penalty", "1.1"]])
def test_every_sampler_is_reproducible_with_a_seed(stories, options):
    runs = [completion(stories, "-p", PROMPT, "-n", 40, "--temp", "1", "--seed", "11",
                       *options) for _ in range(2)]
    assert runs[0] == runs[1]
    other = completion(stories, "-p", PROMPT, "-n", 40, "--temp", "1", "--seed", "12", *options)
    assert other != runs[0]


# ---- --stop ------------------------------------------------------------------------------

def pieces(stories, text):
    """The token texts of `text`, as the tokenizer splits it."""
    ids = json.loads(barellm("tokenize", stories, "-p", text).stdout)
    return [barellm("detokenize", stories, "-p", json.dumps([i])).stdout[:-1] for i in ids]


def test_stop_cuts_before_a_string_that_spans_tokens(stories):
    full = greedy(stories)
    assert "girl named Lily" in full
    # "rl nam" starts inside the token "girl" and ends inside " named".
    assert not any("rl nam" in piece for piece in pieces(stories, full))
    result = barellm("run", stories, "-p", PROMPT, "--temp", "0", "-n", 40, "--stop", "rl nam")
    assert result.returncode == 0, result.stderr
    assert result.stdout == full[:full.index("rl nam")] + "\n"
    assert "stopped: stop string" in result.stderr


def test_the_earliest_of_several_stop_strings_wins(stories):
    full = greedy(stories)
    result = barellm("run", stories, "-p", PROMPT, "--temp", "0", "-n", 40,
                     "--stop", "Lily", "--stop", "little")
    assert result.stdout == full[:full.index("little")] + "\n"


def test_held_back_text_that_is_no_stop_string_is_printed(stories):
    """"Lily. Zz" begins like the text but never comes: nothing may be lost or doubled."""
    full = greedy(stories)
    result = barellm("run", stories, "-p", PROMPT, "--temp", "0", "-n", 40, "--stop", "Lily. Zz")
    assert result.stdout == full
    assert "stopped: reached -n" in result.stderr


def test_a_stop_string_in_the_prompt_does_not_stop(stories):
    result = barellm("run", stories, "-p", PROMPT, "--temp", "0", "-n", 40, "--stop", "upon")
    assert result.stdout == greedy(stories)


# ---- --color, --device, the model file ---------------------------------------------------

def run_on_a_terminal(*args):
    """stdout of barellm on a pseudo-terminal, as bytes."""
    master, slave = pty.openpty()
    try:
        process = subprocess.Popen([BARELLM, *map(str, args)], stdout=slave,
                                   stderr=subprocess.DEVNULL)
        os.close(slave)
        out = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        assert process.wait(timeout=60) == 0
        return out
    finally:
        os.close(master)


def test_color_marks_the_prompt_on_a_terminal_only(stories):
    out = run_on_a_terminal("run", stories, "-p", PROMPT, "--temp", "0", "-n", 8, "--color")
    assert out.startswith(b"\x1b[33m" + PROMPT.encode() + b"\x1b[0m")
    plain = completion(stories, "-p", PROMPT, "--temp", "0", "-n", 8, "--color")
    assert "\x1b" not in plain and plain.startswith(PROMPT)


def test_device_auto_says_where_it_runs(stories):
    result = barellm("run", stories, "-p", PROMPT, "--temp", "0", "-n", 4)
    lines = [line for line in result.stderr.splitlines() if "--device auto" in line]
    assert len(lines) == 1 and ("on the CPU (" in lines[0] or "on the GPU" in lines[0])
    for device in ["cpu", "auto"]:
        assert completion(stories, "-p", PROMPT, "--temp", "0", "-n", 40,
                          "--device", device) == greedy(stories)
    explicit = barellm("run", stories, "-p", PROMPT, "--temp", "0", "-n", 4, "--device", "cpu")
    assert "--device auto" not in explicit.stderr


def test_a_hugging_face_directory_names_the_converter(tmp_path):
    hf = need_shared(STORIES)
    result = barellm("run", hf, "-p", PROMPT)
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1
    assert "is a Hugging Face checkpoint directory" in result.stderr
    assert f"python3 convert/convert.py {hf} -o OUT.bin" in result.stderr


def test_a_gguf_file_names_the_converter(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(64))
    for command in [["run", gguf, "-p", PROMPT], ["info", gguf], ["chat", gguf]]:
        result = barellm(*command)
        assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1
        assert "is a GGUF file, not a barellm weight file" in result.stderr
        assert f"python3 convert/convert.py {gguf} -o OUT.bin" in result.stderr


# ---- malformed flags -----------------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["--top-k", "-1"], "--top-k must be in"),
    (["--top-k", "five"], "--top-k needs an integer"),
    (["--top-k"], "--top-k needs a value"),
    (["--min-p", "1.5"], "--min-p needs a number in"),
    (["--min-p", "-0.1"], "--min-p needs a number in"),
    (["--min-p", "x"], "--min-p needs a number in"),
    (["--repeat-penalty", "0"], "--repeat-penalty must be above 0"),
    (["--repeat-penalty", "-1"], "--repeat-penalty needs a number in"),
    (["--repeat-penalty", "nan"], "--repeat-penalty needs a number in"),
    (["--repeat-penalty"], "--repeat-penalty needs a value"),
    (["--repeat-last-n", "-1"], "--repeat-last-n must be in"),
    (["--repeat-last-n", "1.5"], "--repeat-last-n needs an integer"),
    (["--stop", ""], "--stop needs a non-empty text"),
    (["--stop"], "--stop needs a value"),
    (["--device", "gpu"], "--device takes auto, cpu or cuda"),
    (["--color", "yes"], "unexpected argument 'yes'"),
])
def test_malformed_run_options_are_one_line_and_exit_2(stories, args, message):
    assert_wrong_command_line(barellm("run", stories, "-p", PROMPT, *args), "barellm", message)


@pytest.mark.parametrize("args", [["-p", PROMPT, "-f", "x.txt"], []])
def test_run_takes_one_prompt(stories, args):
    assert_wrong_command_line(barellm("run", stories, *args), "barellm",
                              "run needs -p PROMPT, -p - or -f FILE (one of them)")


def test_help_lists_every_new_option():
    result = barellm("--help")
    for option in ["chat MODEL", "-p -", "-f FILE", "--top-k", "--min-p", "--repeat-penalty",
                   "--repeat-last-n", "--stop", "--color", "--seed", "--device auto|cpu|cuda",
                   "/reset", "/save FILE", "/exit"]:
        assert option in result.stdout, option
