"""The converter's check by barellm (convert/barellm_check.py): barellm loads each converted
file before it is put in place. A tokenizer.json that barellm refuses, such as a Split regex
outside its subset, is refused with barellm's message and leaves no file; the regexes of
real tokenizers convert and load; without a built barellm the file is written with a
one-line warning; a barellm that crashes or cannot run gives one clear line."""

import json
import os
import shutil
import subprocess

import pytest

from convert_testlib import (BARELLM, BUILD, CONVERT, REPO, SMOLLM2_TOKENIZER, SYNTH,
                             TINY_CONFIG, make_checkpoint, need_shared, run,
                             tiny_tokenizer_json)

REGEX_CORPUS = os.path.join(REPO, "tests", "fuzz", "corpus", "regex")

# Split regexes that src/tokenizer/regex.cpp refuses, with the construct its message names.
REFUSED_REGEXES = {
    r"(?<=a)b": "lookbehind '(?<=' (at offset 0)",
    r"(a)\1": "backreference '\\1'",
    r"(?>a)": "atomic group",
    r"(?<name>a)": "named group",
    r"a*?": "lazy quantifier",
    r"a++": "possessive quantifier",
    r"\w": "word characters '\\w'",
    r"\p{Han}": "property '\\p{Han}' (only general categories are supported)",
    r"[a[b]]": "nested class",
    r"(?i)a": "option group '(?i)'",
    r"(?:a?)+": "which can match the empty string",
    r"(?:ab){5000}": "too large once its counted repeats are written out",
}


def split(regex):
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated",
            "invert": False}


def tokenizer_with(pre_tokenizer):
    return {**tiny_tokenizer_json(), "pre_tokenizer": pre_tokenizer}


def convert(tmp_path, hf, *options, env=None):
    """Run the converter into an empty folder; return (result, output path)."""
    out = tmp_path / "out" / "model.barellm"
    os.makedirs(out.parent, exist_ok=True)
    return run(CONVERT, hf, "-o", out, *options, env=env), out


def assert_refused(result, out, message):
    """Exit 1 with one `convert:` line holding `message`, no output, no temporary file."""
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith("convert: ") and result.stderr.count("\n") == 1, \
        result.stderr
    assert message in result.stderr, result.stderr
    assert os.listdir(out.parent) == []


def need_tool(name):
    path = os.path.join(BUILD, name)
    if not os.path.exists(path):
        pytest.fail(f"{path} is missing: run `make` first")
    return path


def tokenizer_load_error(tokenizer_json, tmp_path):
    """The message barellm's tokenizer gives when it loads `tokenizer_json` on its own
    (tests/tools/tokenize_json), independent of the converter."""
    (tmp_path / "text").write_text("ab", encoding="utf-8")
    result = subprocess.run([need_tool("tokenize_json"), tokenizer_json, tmp_path / "text"],
                            capture_output=True, text=True)
    assert result.returncode == 1 and result.stderr.startswith("tokenize_json: ")
    return result.stderr[len("tokenize_json: "):].rstrip("\n")


def tokenize(model, text):
    """The ids of `text` by `barellm tokenize`; asserts success."""
    result = subprocess.run([BARELLM, "tokenize", model, "-p", text], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# ---------------------------------------------------------------- what is refused


@pytest.mark.parametrize("regex", sorted(REFUSED_REGEXES))
@pytest.mark.parametrize("nested", [False, True], ids=["alone", "in-sequence"])
def test_refused_regex_gives_barellms_message(tmp_path, regex, nested):
    pre_tokenizer = split(regex)
    if nested:
        pre_tokenizer = {"type": "Sequence", "pretokenizers": [
            {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always"},
            pre_tokenizer]}
    hf = make_checkpoint(tmp_path / "hf", tokenizer=tokenizer_with(pre_tokenizer))
    result, out = convert(tmp_path, hf)
    message = tokenizer_load_error(hf / "tokenizer.json", tmp_path)
    assert message.startswith("tokenizer.json: pre_tokenizer Split regex ")
    assert REFUSED_REGEXES[regex] in message
    assert_refused(result, out, f"barellm refuses the output: {message}")
    assert result.stderr == f"convert: barellm refuses the output: {message}\n"


@pytest.mark.parametrize("key,value,message", [
    ("normalizer", {"type": "Replace", "pattern": {"Regex": " +"}, "content": "\u2581"},
     "tokenizer.json: normalizer Replace with Regex pattern ' +' is not supported"),
    ("pre_tokenizer", {**split("a"), "behavior": "Scattered"},
     "tokenizer.json: Split behavior 'Scattered' is not supported"),
])
def test_other_tokenizer_settings_barellm_refuses(tmp_path, key, value, message):
    hf = make_checkpoint(tmp_path / "hf", tokenizer={**tiny_tokenizer_json(), key: value})
    result, out = convert(tmp_path, hf)
    assert_refused(result, out, f"barellm refuses the output: {message}")


def test_text_that_is_not_utf8_is_refused_before_conversion(tmp_path):
    """The converter itself refuses what it cannot write as UTF-8: JSON's escape of half a
    surrogate pair ("\\ud800"), which is no character, and bytes that are not UTF-8."""
    hf = make_checkpoint(tmp_path / "hf", tokenizer=tokenizer_with(split("a\ud800")))
    result, out = convert(tmp_path, hf)
    assert_refused(result, out, "tokenizer.json: \\ud800 is half of a surrogate pair")
    paired = tokenizer_with(split("\U0001F600"))  # json.dump writes "\\ud83d\\ude00"
    result, out = convert(tmp_path, make_checkpoint(tmp_path / "paired", tokenizer=paired))
    assert result.returncode == 0, result.stderr
    os.remove(out)
    (hf / "tokenizer.json").write_bytes(b'{"model": "\xff"}')
    result, out = convert(tmp_path, hf)
    assert_refused(result, out, "tokenizer.json: not UTF-8 text (byte 11 is 0xff)")


def test_refusal_keeps_an_existing_output(tmp_path):
    hf = make_checkpoint(tmp_path / "hf", tokenizer=tokenizer_with(split(r"(?<=a)b")))
    out = tmp_path / "model.barellm"
    out.write_bytes(b"previous")
    result = run(CONVERT, hf, "-o", out)
    assert result.returncode == 1 and "lookbehind" in result.stderr
    assert out.read_bytes() == b"previous"
    assert sorted(os.listdir(tmp_path)) == ["hf", "model.barellm"]


# ---------------------------------------------------------------- what barellm runs


def corpus_regexes():
    """(name, pattern, text) of the fuzzing seeds: real tokenizers' Split regexes and
    the anchors and case-insensitive text they use, each with a text to split."""
    seeds = []
    for name in sorted(os.listdir(REGEX_CORPUS)):
        with open(os.path.join(REGEX_CORPUS, name), "rb") as f:
            pattern, text = f.read().split(b"\0", 1)
        seeds.append(pytest.param(pattern.decode(), text.decode(), id=name))
    return seeds


@pytest.mark.parametrize("regex,text", corpus_regexes())
def test_real_regexes_convert_and_load(tmp_path, regex, text):
    hf = make_checkpoint(tmp_path / "hf", tokenizer=tokenizer_with(split(regex)))
    result, out = convert(tmp_path, hf)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    ids = tokenize(out, text)
    assert ids and all(0 <= i < TINY_CONFIG["vocab_size"] for i in ids)


def test_smollm2_tokenizer_converts_and_loads(tmp_path):
    """SmolLM2's tokenizer (49152 ids, a GPT-2 Split regex and ByteLevel) on random
    weights."""
    need_shared(SMOLLM2_TOKENIZER)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**TINY_CONFIG, "vocab_size": 49152}))
    hf = tmp_path / "hf"
    made = run(SYNTH, "--config", config, "--tokenizer", SMOLLM2_TOKENIZER, "-o", hf)
    assert made.returncode == 0, made.stderr
    result, out = convert(tmp_path, hf)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert len(tokenize(out, "Hello, world! It's 2024.")) > 5


# ---------------------------------------------------------------- finding barellm


def converter_copy(tmp_path):
    """convert/ copied into a folder with no build/ beside it."""
    copy = tmp_path / "repo" / "convert"
    shutil.copytree(os.path.dirname(CONVERT), copy,
                    ignore=shutil.ignore_patterns("__pycache__"))
    return copy / "convert.py"


def environment_without_barellm():
    return {k: v for k, v in os.environ.items() if k != "BARELLM"}


def test_without_a_built_barellm_the_file_is_written_with_a_warning(tmp_path):
    converter = converter_copy(tmp_path)
    hf = make_checkpoint(tmp_path / "hf", tokenizer=tokenizer_with(split(r"(?<=a)b")))
    out = tmp_path / "model.barellm"
    result = run(converter, hf, "-o", out, env=environment_without_barellm())
    assert result.returncode == 0, result.stderr
    assert out.exists() and result.stdout.startswith("wrote ")
    default = tmp_path / "repo" / "build" / "barellm"
    assert result.stderr == (f"convert: warning: {out} was not checked by barellm ({default} "
                             "is not built: run `make`, or give --barellm PATH)\n")


@pytest.mark.parametrize("how", ["option", "environment"])
def test_a_barellm_named_but_absent_is_an_error(tmp_path, how):
    hf = make_checkpoint(tmp_path / "hf")
    missing = tmp_path / "nowhere" / "barellm"
    if how == "option":
        result, out = convert(tmp_path, hf, "--barellm", missing)
        assert_refused(result, out, f"convert: --barellm {missing}: no such file")
    else:
        env = {**os.environ, "BARELLM": str(missing)}
        result, out = convert(tmp_path, hf, env=env)
        assert_refused(result, out, f"convert: $BARELLM {missing}: no such file")


def fake_barellm(tmp_path, script, mode=0o755):
    """A program standing in for barellm: a shell script run as `barellm tokenize FILE
    -p ''`."""
    path = tmp_path / "bin" / "barellm"
    os.makedirs(path.parent, exist_ok=True)
    path.write_text("#!/bin/sh\n" + script + "\n")
    os.chmod(path, mode)
    return path


@pytest.mark.parametrize("script,mode,message", [
    ("kill -SEGV $$", 0o755, "was killed by SIGSEGV while loading the output"),
    ("exit 0", 0o644, "to check the output: Permission denied"),
    ("echo '==7==ERROR: AddressSanitizer: heap-use-after-free' >&2; exit 1", 0o755,
     "failed with exit status 1 while loading the output: ==7==ERROR: AddressSanitizer: "
     "heap-use-after-free"),
    ("exit 3", 0o755, "failed with exit status 3 while loading the output: no message"),
], ids=["crash", "not-executable", "sanitizer-report", "silent-failure"])
def test_a_failing_barellm_gives_one_clear_line(tmp_path, script, mode, message):
    binary = fake_barellm(tmp_path, script, mode)
    result, out = convert(tmp_path, make_checkpoint(tmp_path / "hf"), "--barellm", binary)
    assert "Traceback" not in result.stderr
    assert_refused(result, out, message)
    assert str(binary) in result.stderr


def test_messages_name_the_output_not_the_temporary_file(tmp_path):
    binary = fake_barellm(tmp_path, 'echo "barellm: $2: refused" >&2; exit 1')
    result, out = convert(tmp_path, make_checkpoint(tmp_path / "hf"), "--barellm", binary)
    assert_refused(result, out, f"barellm refuses the output: {out}: refused")


def test_option_comes_before_environment(tmp_path):
    crash = fake_barellm(tmp_path, "kill -SEGV $$")
    hf = make_checkpoint(tmp_path / "hf")
    result, out = convert(tmp_path, hf, env={**os.environ, "BARELLM": str(crash)})
    assert_refused(result, out, "SIGSEGV")
    result, out = convert(tmp_path, hf, "--barellm", BARELLM,
                          env={**os.environ, "BARELLM": str(crash)})
    assert result.returncode == 0 and out.exists(), result.stderr
