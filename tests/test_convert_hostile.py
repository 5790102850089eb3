"""convert/convert.py on hostile input: every refusal is one `convert:` line on stderr and
exit status 1 (128 + N after signal N), never a traceback; it leaves no file behind and
never overwrites one of its inputs."""

import json
import os
import signal
import struct
import subprocess
import sys

import pytest

from convert_testlib import (CONVERT, TINY_CONFIG, make_checkpoint, run, tiny_tensors,
                             write_safetensors)


def assert_refused(result, message, status=1):
    """Exit `status` with exactly one stderr line, a `convert:` one containing `message`."""
    lines = result.stderr.splitlines()
    assert result.returncode == status, result.stdout + result.stderr
    assert len(lines) == 1 and lines[0].startswith("convert: "), result.stderr
    assert message in lines[0], lines[0]


def snapshot(root):
    """{relative path: bytes} of every file under `root` (links followed)."""
    files = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, root)] = f.read()
    return files


def refused_leaving_nothing(tmp_path, hf, message):
    """Convert `hf` into an empty folder: refused with `message`, the folder stays empty."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    assert_refused(run(CONVERT, hf, "-o", out / "model.bin"), message)
    assert os.listdir(out) == []


def with_config(tmp_path, **changes):
    """The tiny checkpoint with config.json keys changed."""
    return make_checkpoint(tmp_path / "hf", config={**TINY_CONFIG, **changes},
                           tensors=tiny_tensors(TINY_CONFIG))


# ---- -o naming one of the inputs ---------------------------------------------------------

def sharded_checkpoint(path):
    """The tiny checkpoint with every file the converter may read: two shards and their
    index, tokenizer_config.json, generation_config.json and chat_template.jinja."""
    hf = make_checkpoint(path)
    os.remove(hf / "model.safetensors")
    tensors = list(tiny_tensors(TINY_CONFIG).items())
    shards = {"model-00001-of-00002.safetensors": dict(tensors[:5]),
              "model-00002-of-00002.safetensors": dict(tensors[5:])}
    for name, part in shards.items():
        write_safetensors(hf / name, part)
    index = {"weight_map": {tensor: name for name, part in shards.items() for tensor in part}}
    for name, value in (("model.safetensors.index.json", index),
                        ("tokenizer_config.json", {"add_bos_token": True}),
                        ("generation_config.json", {"eos_token_id": 2})):
        with open(hf / name, "w") as f:
            json.dump(value, f)
    (hf / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    return hf


@pytest.mark.parametrize("name", ["config.json", "generation_config.json",
                                  "tokenizer_config.json", "tokenizer.json",
                                  "chat_template.jinja", "model.safetensors.index.json",
                                  "model-00002-of-00002.safetensors"])
def test_refuses_an_output_that_is_an_input(tmp_path, name):
    hf = sharded_checkpoint(tmp_path / "hf")
    before = snapshot(tmp_path)
    assert_refused(run(CONVERT, hf, "-o", hf / name), f"is the input file {hf / name}")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("spelling", ["dot-dot", "symbolic link", "hard link"])
def test_refuses_an_input_under_another_name(tmp_path, spelling):
    hf = make_checkpoint(tmp_path / "hf")
    shard = hf / "model.safetensors"
    if spelling == "dot-dot":
        out = f"{tmp_path}/hf/../hf/./model.safetensors"
    else:
        out = tmp_path / "other.bin"
        (os.symlink if spelling == "symbolic link" else os.link)(shard, out)
    before = snapshot(tmp_path)
    assert_refused(run(CONVERT, hf, "-o", out), f"is the input file {shard}")
    assert snapshot(tmp_path) == before
    assert os.path.islink(out) == (spelling == "symbolic link")


# ---- signals -----------------------------------------------------------------------------

# Runs convert.py with os.replace sending `signum` to the process first: the signal comes
# when the temporary output is complete and about to be renamed into place.
SIGNAL_BEFORE_RENAME = """
import os, runpy, sys
convert, signum, *args = sys.argv[1:]
sys.path.insert(0, os.path.dirname(convert))
sys.argv = [convert, *args]
rename = os.replace
def signal_then_rename(*names):
    os.kill(os.getpid(), int(signum))
    rename(*names)
os.replace = signal_then_rename
runpy.run_path(convert, run_name="__main__")
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=lambda signum: signum.name)
def test_a_signal_removes_the_temporary_output(tmp_path, signum):
    hf = make_checkpoint(tmp_path / "hf")
    out = tmp_path / "out"
    out.mkdir()
    result = subprocess.run([sys.executable, "-c", SIGNAL_BEFORE_RENAME, CONVERT,
                             str(int(signum)), hf, "-o", out / "model.bin"],
                            capture_output=True, text=True, timeout=120)
    assert_refused(result, f"interrupted by {signum.name}", status=128 + signum)
    assert os.listdir(out) == []


# ---- source safetensors that break the format --------------------------------------------

def edit_shard(path, edit_header, extra=b""):
    """Rewrite the safetensors file at `path` with its header edited and `extra` bytes
    appended to its data."""
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    edit_header(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data[8 + length:] + extra)


def set_entry(name, key, value):
    """Header edit: set one field of tensor `name`."""
    return lambda header: header[name].__setitem__(key, value)


def shift_last(header):
    """Header edit: move the last tensor 4 bytes further (with 4 bytes appended, a gap)."""
    last = max((entry for entry in header.values()), key=lambda e: e["data_offsets"])
    last["data_offsets"] = [offset + 4 for offset in last["data_offsets"]]


EMBEDDING, NORM = "model.embed_tokens.weight", "model.norm.weight"
SHARD_REFUSALS = [
    (lambda h: h["lm_head.weight"].__setitem__("data_offsets", h[EMBEDDING]["data_offsets"]),
     b"", "tensor 'lm_head.weight' overlaps tensor 'model.embed_tokens.weight'"),
    (lambda h: None, b"\0" * 4, "4 bytes after the end of tensor 'lm_head.weight' belong to "
     "no tensor"),
    (shift_last, b"\0" * 4, "tensor 'lm_head.weight' starts 4 bytes after the end of tensor "
     f"'{NORM}'"),
    (set_entry(NORM, "dtype", "F16"), b"", f"tensor '{NORM}': data_offsets cover 64 bytes but "
     "shape [16] of F16 needs 32"),
    (set_entry(NORM, "dtype", "F12"), b"", f"tensor '{NORM}': unknown dtype 'F12'"),
    (set_entry(NORM, "shape", [True, 16]), b"", f"tensor '{NORM}': malformed header entry"),
    (set_entry(NORM, "data_offsets", [-64, 0]), b"", f"tensor '{NORM}': malformed header entry"),
]


@pytest.mark.parametrize("edit,extra,message", SHARD_REFUSALS,
                         ids=["overlap", "trailing bytes", "gap", "size", "unknown dtype",
                              "boolean dimension", "negative offset"])
def test_refuses_a_shard_that_breaks_the_format(tmp_path, edit, extra, message):
    hf = make_checkpoint(tmp_path / "hf")
    edit_shard(hf / "model.safetensors", edit, extra)
    refused_leaving_nothing(tmp_path, hf, f"model.safetensors: {message}")


# ---- JSON files that are not text, too deep, or not what barellm reads back ----------------

JSON_FILES = ["config.json", "tokenizer.json", "tokenizer_config.json",
              "generation_config.json"]


def checkpoint_with(tmp_path, name, data):
    """The tiny checkpoint with the file `name` holding the bytes `data`."""
    hf = make_checkpoint(tmp_path / "hf")
    (hf / name).write_bytes(data)
    return hf


def test_refuses_a_chat_template_file_that_is_not_utf8(tmp_path):
    hf = checkpoint_with(tmp_path, "chat_template.jinja", b"{{ 'caf\xe9' }}")
    refused_leaving_nothing(tmp_path, hf, "chat_template.jinja: not UTF-8 text (byte 7 is 0xe9)")


@pytest.mark.parametrize("name", JSON_FILES)
def test_refuses_json_that_is_not_utf8(tmp_path, name):
    hf = checkpoint_with(tmp_path, name, b'{"chat_template": "caf\xe9"}')
    refused_leaving_nothing(tmp_path, hf, f"{name}: not UTF-8 text (byte 22 is 0xe9)")


@pytest.mark.parametrize("name", JSON_FILES)
@pytest.mark.parametrize("levels", [101, 100_000])
def test_refuses_deeply_nested_json(tmp_path, name, levels):
    hf = checkpoint_with(tmp_path, name, b"[" * levels + b"]" * levels)
    refused_leaving_nothing(tmp_path, hf, f"{name}: JSON nested more than 100 levels deep")


def test_refuses_a_deeply_nested_safetensors_header(tmp_path):
    hf = make_checkpoint(tmp_path / "hf")
    deep = json.loads("[" * 200 + "]" * 200)
    edit_shard(hf / "model.safetensors", set_entry(NORM, "shape", deep))
    refused_leaving_nothing(tmp_path, hf, "model.safetensors: safetensors header: JSON nested "
                            "more than 100 levels deep")


@pytest.mark.parametrize("name,text,message", [
    ("tokenizer.json", '{"model": NaN}', "NaN is not valid JSON"),
    ("config.json", '{"rope_theta": -Infinity}', "-Infinity is not valid JSON"),
    ("generation_config.json", '{"temperature": 1e400}',
     "the number 1e400 is beyond the float64 range"),
    ("config.json", '{"rope_theta": ' + "9" * 5000 + "}",
     "an integer has more than 4300 digits"),
    ("tokenizer_config.json", '{"chat_template": "\\ud800 alone"}',
     "\\ud800 is half of a surrogate pair"),
])
def test_refuses_json_that_barellm_could_not_read_back(tmp_path, name, text, message):
    hf = checkpoint_with(tmp_path, name, text.encode())
    refused_leaving_nothing(tmp_path, hf, f"{name}: {message}")


def test_keeps_a_surrogate_pair(tmp_path):
    hf = checkpoint_with(tmp_path, "tokenizer_config.json",
                         b'{"chat_template": "<|im_start|>\\ud83d\\ude00<|im_end|>"}')
    result = run(CONVERT, hf, "-o", tmp_path / "model.bin")
    assert result.returncode == 0, result.stderr


# ---- a standard output that cannot be written ----------------------------------------------

@pytest.mark.parametrize("with_help", [False, True])
def test_a_full_standard_output_is_one_line(tmp_path, with_help):
    hf = make_checkpoint(tmp_path / "hf")
    args = ["--help"] if with_help else [hf, "-o", tmp_path / "model.bin"]
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, CONVERT, *map(str, args)], stdout=full,
                                stderr=subprocess.PIPE, text=True, timeout=120)
    assert_refused(result, "cannot write the standard output (No space left on device)")


# ---- config numbers that barellm would make inf or 0 as float32 ----------------------------

OUTSIDE_FLOAT32 = "must be a positive number within the float32 range"
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@pytest.mark.parametrize("changes,message", [
    ({"rope_theta": 1e300}, f"rope_theta {OUTSIDE_FLOAT32}, not 1e+300"),
    ({"rope_theta": 10**400}, f"rope_theta {OUTSIDE_FLOAT32}, not 1000"),
    ({"rms_norm_eps": 1e300}, f"rms_norm_eps {OUTSIDE_FLOAT32}, not 1e+300"),
    ({"rms_norm_eps": 1e-300}, f"rms_norm_eps {OUTSIDE_FLOAT32}, not 1e-300"),
    ({"rope_scaling": {"type": "linear", "factor": 1e300}}, "rope_scaling 'factor' of type "
     f"linear {OUTSIDE_FLOAT32}"),
    ({"rope_scaling": {**LLAMA3, "low_freq_factor": 1e-300}}, "'low_freq_factor'"),
    ({"rope_scaling": {**LLAMA3, "high_freq_factor": 1.0}}, "high_freq_factor > low_freq_factor"),
    ({"rope_scaling": {**LLAMA3, "original_max_position_embeddings": 8192.5}},
     "'original_max_position_embeddings' must be a positive integer"),
    ({"rope_theta": 1e-45, "head_dim": 64}, "rope_theta makes a RoPE frequency overflow"),
    ({"rope_theta": 1e30, "rope_scaling": {"type": "linear", "factor": 3e38}},
     "rope_scaling makes a RoPE frequency round to 0"),
], ids=["huge theta", "huge integer theta", "huge eps", "tiny eps", "huge linear factor", "tiny llama3 factor",
        "llama3 high = low", "fractional context", "frequency overflow", "frequency underflow"])
def test_refuses_config_numbers_outside_float32(tmp_path, changes, message):
    refused_leaving_nothing(tmp_path, with_config(tmp_path, **changes), message)
