"""convert/convert.py on hostile GGUF files: each is refused with one `convert:` line on
stderr and exit status 1, leaving no file behind.

The files are built here, byte by byte (TinyGGUF), from a valid tiny llama model that
converts, with one thing broken: the header (magic, version, counts, lengths, types),
the tensor table (offsets, shapes, types), the data, the config or the tokenizer."""

import math
import os
import struct

import numpy as np
import pytest

from convert_testlib import CONVERT, run

pytest.importorskip("gguf", reason="pip package gguf missing")

# GGUF value types and ggml tensor types used here.
U8, I32, U32, F32_VALUE, BOOL, STRING, ARRAY, U64 = 0, 5, 4, 6, 7, 8, 9, 10
F32, F16, Q8_0 = 0, 1, 8
SCALAR_FORMATS = {U8: "<B", U32: "<I", I32: "<i", F32_VALUE: "<f", BOOL: "<?", U64: "<Q"}
DIM, HIDDEN, HEADS, KV_HEADS, LAYERS = 32, 64, 4, 2, 1
HEAD_DIM = DIM // HEADS
TOKENS = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581", "a",
                                                                             "\u2581a"]
TOKEN_TYPES = [2, 3, 3] + [6] * 256 + [1, 1, 1]
VOCAB = len(TOKENS)


def gguf_string(text):
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def gguf_value(kind, value):
    if kind == STRING:
        return gguf_string(value)
    if kind == ARRAY and isinstance(value[1], bytes):  # U8 items, given as bytes
        return struct.pack("<IQ", value[0], len(value[1])) + value[1]
    if kind == ARRAY:
        item_kind, items = value
        return struct.pack("<IQ", item_kind, len(items)) + b"".join(
            gguf_value(item_kind, item) for item in items)
    if kind not in SCALAR_FORMATS:  # an unknown type: no value
        return b""
    return struct.pack(SCALAR_FORMATS[kind], value)


class TinyGGUF:
    """A tiny llama GGUF file (v3, F32 tensors) to break in one place before bytes();
    `hidden` is the feed-forward size."""

    def __init__(self, hidden=HIDDEN):
        rng = np.random.default_rng(7)
        self.version = 3
        self.alignment = 32
        self.keys = [
            ("general.architecture", STRING, "llama"),
            ("llama.context_length", U32, 64),
            ("llama.embedding_length", U32, DIM),
            ("llama.block_count", U32, LAYERS),
            ("llama.feed_forward_length", U32, hidden),
            ("llama.attention.head_count", U32, HEADS),
            ("llama.attention.head_count_kv", U32, KV_HEADS),
            ("llama.rope.freq_base", F32_VALUE, 10000.0),
            ("llama.attention.layer_norm_rms_epsilon", F32_VALUE, 1e-5),
            ("tokenizer.ggml.model", STRING, "llama"),
            ("tokenizer.ggml.tokens", ARRAY, (STRING, TOKENS)),
            ("tokenizer.ggml.scores", ARRAY, (F32_VALUE, [0.0] * VOCAB)),
            ("tokenizer.ggml.token_type", ARRAY, (I32, TOKEN_TYPES)),
            ("tokenizer.ggml.bos_token_id", U32, 1),
            ("tokenizer.ggml.eos_token_id", U32, 2),
        ]
        shapes = {"token_embd.weight": (VOCAB, DIM), "output_norm.weight": (DIM,)}
        for suffix, shape in (("attn_norm", (DIM,)), ("attn_q", (DIM, DIM)),
                              ("attn_k", (KV_HEADS * HEAD_DIM, DIM)),
                              ("attn_v", (KV_HEADS * HEAD_DIM, DIM)),
                              ("attn_output", (DIM, DIM)), ("ffn_norm", (DIM,)),
                              ("ffn_gate", (hidden, DIM)), ("ffn_up", (hidden, DIM)),
                              ("ffn_down", (DIM, hidden))):
            shapes[f"blk.0.{suffix}.weight"] = shape
        # name -> [dims (row length first), ggml type, data bytes, offset or None (next)]
        self.tensors = {}
        for name, shape in shapes.items():
            values = (rng.standard_normal(shape) / math.sqrt(shape[-1])).astype("<f4")
            self.tensors[name] = [tuple(reversed(shape)), F32, values.tobytes(), None]
        self.tensor_count = None  # None: the real counts
        self.key_count = None
        self.cut = None  # keep only this many bytes

    def key(self, name, kind, value):
        """Set (or add) a key."""
        self.keys = [k for k in self.keys if k[0] != name] + [(name, kind, value)]

    def drop_key(self, name):
        self.keys = [k for k in self.keys if k[0] != name]

    def offsets(self):
        offsets, position = {}, 0
        for name, (_, _, data, offset) in self.tensors.items():
            position = -(-position // self.alignment) * self.alignment
            offsets[name] = position if offset is None else offset
            position += len(data)
        return offsets

    def __bytes__(self):
        keys = b"".join(gguf_string(name) + struct.pack("<I", kind) + gguf_value(kind, value)
                        for name, kind, value in self.keys)
        offsets = self.offsets()
        infos = b"".join(
            gguf_string(name) + struct.pack("<I", len(dims)) +
            b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", kind, offsets[name])
            for name, (dims, kind, _, _) in self.tensors.items())
        tensor_count = len(self.tensors) if self.tensor_count is None else self.tensor_count
        key_count = len(self.keys) if self.key_count is None else self.key_count
        head = (b"GGUF" + struct.pack("<IQQ", self.version, tensor_count, key_count) + keys +
                infos)
        head += b"\0" * (-len(head) % self.alignment)
        data = bytearray()
        for name, (_, _, raw, offset) in self.tensors.items():
            if offset is not None:  # a broken offset: only the tensor info says it
                continue
            end = offsets[name] + len(raw)
            data.extend(b"\0" * max(0, end - len(data)))
            data[offsets[name]:end] = raw
        out = head + bytes(data)
        return out if self.cut is None else out[:self.cut]


def convert_bytes(tmp_path, raw, *options):
    source = tmp_path / "model.gguf"
    source.write_bytes(raw)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    result = run(CONVERT, source, "-o", out_dir / "model.bin", *options)
    return result, out_dir


def assert_refused(tmp_path, raw, message, *options):
    result, out_dir = convert_bytes(tmp_path, raw, *options)
    lines = result.stderr.splitlines()
    assert result.returncode == 1, result.stdout + result.stderr
    assert len(lines) == 1 and lines[0].startswith("convert: "), result.stderr
    assert message in lines[0], lines[0]
    assert os.listdir(out_dir) == []


@pytest.mark.parametrize("version,alignment", [(3, 32), (2, 32), (3, 64)])
def test_the_tiny_model_converts(tmp_path, version, alignment):
    """The base of every hostile case is valid (so each case tests its one change), as
    GGUF version 3 or 2, with the default alignment or general.alignment 64."""
    model = TinyGGUF()
    model.version = version
    if alignment != 32:
        model.alignment = alignment
        model.key("general.alignment", U32, alignment)
    result, out_dir = convert_bytes(tmp_path, bytes(model))
    assert result.returncode == 0, result.stderr
    assert os.listdir(out_dir) == ["model.bin"]


def header_length():
    model = TinyGGUF()
    raw = bytes(model)
    return len(raw) - sum(len(t[2]) for t in model.tensors.values())


# Each case: (a change to the tiny model, part of the one-line message).
def with_(attribute, value):
    def change(model):
        setattr(model, attribute, value)
    return change


def with_key(name, kind, value):
    return lambda model: model.key(name, kind, value)


def without_key(name):
    return lambda model: model.drop_key(name)


def with_tensor(name, index, value):
    def change(model):
        model.tensors[name][index] = value
    return change


def cut_at(fraction_of_header):
    return with_("cut", int(header_length() * fraction_of_header))


def cut_after(text, extra):
    """Keep the file up to `extra` bytes after the first occurrence of `text`."""
    raw = bytes(TinyGGUF())
    return with_("cut", raw.index(text) + len(text) + extra)


def overlapping(model):
    model.tensors["blk.0.ffn_up.weight"][3] = model.offsets()["blk.0.ffn_gate.weight"]


def renamed_tensor(model):
    model.tensors["blk.0.ffn_upp.weight"] = model.tensors.pop("blk.0.ffn_up.weight")


def extra_tensor(model):
    model.tensors["blk.0.attn_q.bias"] = [(DIM,), F32, b"\0" * DIM * 4, None]


def nan_weight(model):
    dims, kind, raw, offset = model.tensors["blk.0.attn_v.weight"]
    values = np.frombuffer(raw, dtype="<f4").copy()
    values[5] = np.nan
    model.tensors["blk.0.attn_v.weight"] = [dims, kind, values.tobytes(), offset]


def q8_0_with_minus_128(model):
    rows, cols = HIDDEN, DIM
    blocks = np.zeros((rows, cols // 32, 34), dtype=np.uint8)
    blocks[:, :, :2] = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    blocks[:, :, 2:] = 3
    blocks[4, 0, 9] = 0x80  # -128
    model.tensors["blk.0.ffn_gate.weight"] = [(cols, rows), Q8_0, blocks.tobytes(), None]


def duplicate_key(model):
    model.keys.append(model.keys[1])


HOSTILE = {
    "bad magic": (lambda m: None, "not a GGUF file"),
    "version 1": (with_("version", 1), "GGUF version 1 is not supported"),
    "version 4": (with_("version", 4), "GGUF version 4 is not supported"),
    "big-endian": (with_("version", 3 << 24), "big-endian"),
    "empty file": (with_("cut", 0), "truncated GGUF header"),
    "cut in the counts": (with_("cut", 12), "truncated GGUF header"),
    "cut in the keys": (cut_after(b"tokenizer.ggml.bos_token_id", 2),
                        "truncated GGUF header"),
    "cut in the token list": (cut_at(0.3), "claims 262 items, more than the file holds"),
    "cut in the tensor infos": (cut_at(0.95), "truncated GGUF header"),
    "cut in the data": (with_("cut", len(bytes(TinyGGUF())) - 100), "truncated?"),
    "huge tensor count": (with_("tensor_count", 2**62), "cannot fit in"),
    "huge key count": (with_("key_count", 2**40), "cannot fit in"),
    "huge string length": (with_key("general.name", STRING, b"x" * 3),
                           "truncated GGUF header"),
    "huge array count": (with_key("tokenizer.ggml.merges", ARRAY, (STRING, [])),
                         "more than the file holds"),
    "huge scalar array": (with_key("tokenizer.ggml.scores", ARRAY, (F32_VALUE, [])),
                          "more than the file holds"),
    "too many array items": (with_key("general.odd", ARRAY, (U8, bytes(1 << 22))),
                             "hold more than 4194304 items"),
    "unknown value type": (with_key("general.odd", 13, None), "unknown value type 13"),
    "array of arrays": (with_key("general.odd", ARRAY, (ARRAY, [])), "arrays of arrays"),
    "non-UTF-8 key": (with_key(b"general.\xff", U32, 1), "not UTF-8"),
    "duplicate key": (duplicate_key, "appears twice"),
    "duplicate tensor": (lambda m: None, "tensor 'blk.0.attn_k.weight' appears twice"),
    "bad alignment": (with_key("general.alignment", U32, 24), "power of two"),
    "unknown tensor type": (with_tensor("blk.0.attn_k.weight", 1, 99), "unknown ggml type 99"),
    "five dimensions": (with_tensor("blk.0.attn_k.weight", 0, (DIM, 1, 1, 1, 1)),
                        "5 dimensions"),
    "empty dimension": (with_tensor("blk.0.attn_k.weight", 0, (DIM, 0)), "empty dimension"),
    "offset beyond the file": (with_tensor("output_norm.weight", 3, 2**40),
                               "ends at byte"),
    "misaligned offset": (with_tensor("output_norm.weight", 3, 4), "not a multiple of"),
    "overlapping tensors": (overlapping, "overlap"),
    "huge dimensions": (with_tensor("blk.0.ffn_up.weight", 0, (2**31, 2**31, 2**31)),
                        "ends at byte"),
    "other architecture": (with_key("general.architecture", STRING, "qwen2moe"),
                           "architecture 'qwen2moe' is not supported: Qwen2-MoE's shared "
                           "expert is not implemented (only gemma2, gemma3, gpt-oss, llama, "
                           "phi3, qwen2, qwen3, qwen3moe)"),
    "no architecture": (without_key("general.architecture"), "general.architecture"),
    "missing config key": (without_key("llama.block_count"), "'llama.block_count' is missing"),
    "config key of the wrong type": (with_key("llama.block_count", STRING, "1"),
                                     "not an integer"),
    "zero heads": (with_key("llama.attention.head_count", U32, 0), "must be positive"),
    "config disagrees with the shapes": (with_key("llama.feed_forward_length", U32, 48),
                                         "expected [48, 32] from the config"),
    "more layers than tensors": (with_key("llama.block_count", U32, 2), "missing tensors"),
    "renamed tensor": (renamed_tensor, "missing tensors: blk.0.ffn_up.weight"),
    "extra tensor": (extra_tensor, "unexpected tensors: blk.0.attn_q.bias"),
    "NaN weight": (nan_weight, "contains NaN"),
    "Q8_0 -128": (q8_0_with_minus_128, "-128", "--dtype", "q8"),
    "dynamic RoPE": (with_key("llama.rope.scaling.type", STRING, "dynamic"), "'dynamic'"),
    "yarn RoPE without its factor": (with_key("llama.rope.scaling.type", STRING, "yarn"),
                                     "'llama.rope.scaling.factor' is missing"),
    "unknown tokenizer model": (with_key("tokenizer.ggml.model", STRING, "t5"),
                                "tokenizer.ggml.model 't5' is not supported"),
    "unknown pre-tokenizer": (lambda m: (m.key("tokenizer.ggml.model", STRING, "gpt2"),
                                         m.key("tokenizer.ggml.pre", STRING, "falcon"),
                                         m.key("tokenizer.ggml.merges", ARRAY,
                                               (STRING, ["a b"]))),
                              "tokenizer.ggml.pre 'falcon' is not supported"),
    "token types of another length": (with_key("tokenizer.ggml.token_type", ARRAY,
                                               (I32, [1, 1])), "2 entries"),
    "BOS id out of range": (with_key("tokenizer.ggml.bos_token_id", U32, VOCAB),
                            "is not below"),
    "add BOS without a BOS id": (without_key("tokenizer.ggml.bos_token_id"),
                                 "tokenizer.ggml.bos_token_id is missing"),
    "empty token list": (with_key("tokenizer.ggml.tokens", ARRAY, (STRING, [])),
                         "GGUF key 'tokenizer.ggml.tokens' is empty"),
    "no token list": (without_key("tokenizer.ggml.tokens"),
                      "'tokenizer.ggml.tokens' is missing"),
    "duplicate token": (with_key("tokenizer.ggml.tokens", ARRAY,
                                 (STRING, TOKENS[:-1] + ["a"])), "is both id"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_gguf_is_refused(tmp_path, case):
    change, message, *options = HOSTILE[case]
    model = TinyGGUF()
    change(model)
    raw = bytes(model)
    if case == "bad magic":
        raw = b"GGML" + raw[4:]
    if case == "duplicate tensor":
        raw = raw.replace(b"blk.0.attn_q.weight", b"blk.0.attn_k.weight")
    if case in ("huge string length", "huge array count", "huge scalar array"):
        raw = with_huge_count(raw, case)
    assert_refused(tmp_path, raw, message, *options)


# The key each "huge" case adds last, and whether its value is an array (whose count
# follows the item type) or a string (whose length comes first).
HUGE_COUNT_KEYS = {"huge string length": (b"general.name", False),
                   "huge array count": (b"tokenizer.ggml.merges", True),
                   "huge scalar array": (b"tokenizer.ggml.scores", True)}


def with_huge_count(raw, case):
    """Raise the length or count of the key the case added to 2^60."""
    key, is_array = HUGE_COUNT_KEYS[case]
    count_at = raw.index(key) + len(key) + 4 + (4 if is_array else 0)
    return raw[:count_at] + struct.pack("<Q", 2**60) + raw[count_at + 8:]
