"""Helpers for the converter tests: paths, running the tools, an independent
safetensors writer/reader and tiny hand-made Hugging Face checkpoints."""

import json
import math
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The build to test: `make test` sets BARELLM_BUILD (build/san for SAN=1).
BUILD = os.path.join(REPO, os.environ.get("BARELLM_BUILD", "build"))
# The barellm program the converter loads its output with (convert/barellm_check.py).
BARELLM = os.path.join(BUILD, "barellm")
CONVERT = os.path.join(REPO, "convert", "convert.py")
SYNTH = os.path.join(REPO, "convert", "synth.py")
SHARED = os.path.normpath(os.path.join(REPO, "..", "shared"))
STORIES = os.path.join(SHARED, "models", "stories260K")
LLAMA2_TOKENIZER = os.path.join(SHARED, "tokenizers", "llama2")
SMOLLM2_TOKENIZER = os.path.join(SHARED, "tokenizers", "smollm2-135m")

# A tiny Llama shape used by most tests: 2 layers, GQA 4/2, head_dim 4.
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16,
    "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 40, "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
    "torch_dtype": "float32",
}


def need_shared(path):
    """Skip the calling test, saying why, when a ../shared path is absent."""
    if not os.path.exists(path):
        pytest.skip(f"shared data not found: {path} (tests read ../shared; absent in a "
                    "fresh clone)")
    return path


def cuda_unavailable_reason():
    """None when build/dump_logits finds a usable CUDA GPU, else why not."""
    dump_logits = os.path.join(BUILD, "dump_logits")
    if not os.path.exists(dump_logits):
        pytest.fail(f"{dump_logits} is missing: run `make` first")
    result = subprocess.run([dump_logits, "--check-cuda"], capture_output=True, text=True)
    if result.returncode == 0:
        return None
    return (result.stdout + result.stderr).strip() or f"exit status {result.returncode}"


def gpu_present():
    """Whether the NVIDIA driver sees a GPU, whatever barellm makes of it."""
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


def require_cuda():
    """Skip the calling test, printing why, unless a CUDA GPU is usable. Where the driver
    sees a GPU that a CUDA build of barellm cannot use (built for other architectures, a
    driver too old), fail instead: a suite that skips there would pass without testing."""
    reason = cuda_unavailable_reason()
    if reason is None:
        return
    if gpu_present() and "no CUDA backend" not in reason:
        pytest.fail(f"a GPU is present but barellm cannot use it: {reason}")
    pytest.skip(f"no usable CUDA GPU: {reason}")


def run(script, *args, env=None):
    """Run a tool with the current interpreter; return the CompletedProcess. The
    environment is `env`, else this one with $BARELLM naming the build under test."""
    env = {**os.environ, "BARELLM": BARELLM} if env is None else env
    return subprocess.run([sys.executable, script, *map(str, args)],
                          capture_output=True, text=True, timeout=120, env=env)


def assert_wrong_command_line(result, program, message):
    """Exit 2 with exactly one stderr line: `program: `, a message that starts with
    `message`, then where the options are listed."""
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"{program}: {message}"), result.stderr
    assert result.stderr.endswith(f" ({program} --help lists the options)\n"), result.stderr


def write_safetensors(path, tensors, metadata=None):
    """Write {name: (dtype, array)} as a safetensors file (F32/F16, or BF16 given
    as uint16 bit patterns), tensors in the given order."""
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, array) in tensors.items():
        raw = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(np.shape(array)),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    body = json.dumps(header).encode()
    body += b" " * (-len(body) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(body)) + body + b"".join(chunks))


def read_raw(path):
    """Read a safetensors file as (header_length, header dict, {name: raw array}, size).

    Raw arrays keep the stored dtype (I8 as int8, U8 as uint8); BF16 comes back as uint16 bit
    patterns."""
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    arrays = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        storage = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "I8": "i1",
                   "U8": "u1"}[entry["dtype"]]
        arrays[name] = np.frombuffer(data[8 + length + begin:8 + length + end],
                                     dtype=storage).reshape(entry["shape"])
    return length, header, arrays, len(data)


def tiny_tokenizer_json():
    """A minimal supported tokenizer.json (SentencePiece-like BPE) with 40 ids."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for ch in "\u2581abcdefghijklmnopqrstuvwxyz":
        vocab[ch] = len(vocab)
    merges = [["\u2581", "a"], ["a", "b"], ["\u2581a", "b"]]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    vocab.update({f"<0x{i:02X}>": len(vocab) + i for i in range(40 - len(vocab))})
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for c, i in list(vocab.items())[:3]],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None, "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


def tiny_tensors(config, seed=0):
    """Random F32 tensors with Hugging Face names for a Llama `config`."""
    rng = np.random.default_rng(seed)
    dim, hidden, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config.get("head_dim") or dim // heads

    def matrix(rows, cols):
        return ("F32", (rng.standard_normal((rows, cols)) / math.sqrt(cols)).astype("<f4"))

    def norm():
        return ("F32", (1 + 0.1 * rng.standard_normal(dim)).astype("<f4"))

    tensors = {"model.embed_tokens.weight": matrix(vocab, dim)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        tensors.update({
            p + "input_layernorm.weight": norm(),
            p + "self_attn.q_proj.weight": matrix(heads * hd, dim),
            p + "self_attn.k_proj.weight": matrix(kv * hd, dim),
            p + "self_attn.v_proj.weight": matrix(kv * hd, dim),
            p + "self_attn.o_proj.weight": matrix(dim, heads * hd),
            p + "post_attention_layernorm.weight": norm(),
            p + "mlp.gate_proj.weight": matrix(hidden, dim),
            p + "mlp.up_proj.weight": matrix(hidden, dim),
            p + "mlp.down_proj.weight": matrix(dim, hidden),
        })
    tensors["model.norm.weight"] = norm()
    if not config.get("tie_word_embeddings"):
        tensors["lm_head.weight"] = matrix(vocab, dim)
    return tensors


def make_checkpoint(path, config=None, tensors=None, tokenizer=None):
    """Write a Hugging Face directory from a config (default TINY_CONFIG), tensors
    (default tiny_tensors(config)) and a tokenizer.json dict (default tiny)."""
    config = TINY_CONFIG if config is None else config
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(path, "tokenizer.json"), "w") as f:
        json.dump(tiny_tokenizer_json() if tokenizer is None else tokenizer, f)
    write_safetensors(os.path.join(path, "model.safetensors"),
                      tiny_tensors(config) if tensors is None else tensors)
    return path


def rewritten_gguf(source, out, keys=None, tensors=None):
    """A copy of the GGUF file `source` with keys set ({name: (value, GGUFValueType)}; None
    drops the key) and tensors replaced ({name: float32 array}; None drops the tensor)."""
    keys, tensors = keys or {}, tensors or {}
    gguf = pytest.importorskip("gguf", reason="pip package gguf missing")
    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(out), reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in keys:
            continue
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type)
    for name, value in keys.items():
        if value is not None:
            writer.add_key_value(name, *value)
    for tensor in reader.tensors:
        data = tensors.get(tensor.name, np.array(tensor.data))
        if data is not None:
            writer.add_tensor(tensor.name, data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
