"""ggml's block types in the converter: GGUF tensors of the types barellm runs (Q4_1, Q5_0,
Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ4_NL, beside Q8_0 and Q4_0) kept byte for byte
in a file of per-matrix types; q2_k, q3_k_s, q3_k_m, q3_k_l, q4_k_m, q5_k_m, q6_k, iq4_xs and
iq4_nl of a Hugging Face checkpoint (llama-quantize's mixes, ggml's reference quantizers);
hostile blocks refused.

The dequantization of every block type is written here from ggml's layouts
(docs/FORMAT.md), independently of the converter, and checked against the gguf package's."""

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from convert_testlib import (BUILD, CONVERT, REPO, TINY_CONFIG, make_checkpoint, read_raw, run,
                             tiny_tensors)

gguf = pytest.importorskip("gguf", reason="pip package gguf missing")

GGUF_FROM_HF = os.path.join(REPO, "scripts", "gguf_from_hf.py")
# llama.cpp's llama-quantize, where it is built (scripts/build_llamacpp.sh): the mixes of a
# checkpoint are compared with its files, block for block.
LLAMA_QUANTIZE = os.environ.get("LLAMA_QUANTIZE", "/work/llama/bin/llama-quantize")
F32 = np.float32
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89,
                       113], dtype=F32)


# ------------------------------------------------------- dequantization, written here

def half(blocks, offset):
    """The f16 field at byte `offset` of each block, as float32 [n, 1]."""
    return blocks[:, offset:offset + 2].copy().view("<f2").astype(F32)


def nibbles(qs):
    """Weights j (low nibble of byte j) then j + 16 (high nibble) of 16-byte runs."""
    return np.concatenate([qs & 15, qs >> 4], axis=1).astype(F32)


def fifth_bits(qh_bytes):
    """Bit j of the little-endian u32 of each block's 4 bytes, for j = 0..31."""
    word = qh_bytes.copy().view("<u4")
    return ((word >> np.arange(32, dtype=np.uint32)) & 1).astype(F32)


def dequantize_q4_1(b):
    return half(b, 0) * nibbles(b[:, 4:20]) + half(b, 2)


def dequantize_q5_0(b):
    return half(b, 0) * (nibbles(b[:, 6:22]) + 16 * fifth_bits(b[:, 2:6]) - 16)


def dequantize_q5_1(b):
    return half(b, 0) * (nibbles(b[:, 8:24]) + 16 * fifth_bits(b[:, 4:8])) + half(b, 2)


def k_scales(scales):
    """The 6-bit scales and mins of the eight sub-blocks of Q4_K/Q5_K."""
    sc = np.zeros((len(scales), 8), dtype=F32)
    mn = np.zeros((len(scales), 8), dtype=F32)
    for s in range(8):
        if s < 4:
            sc[:, s] = scales[:, s] & 63
            mn[:, s] = scales[:, s + 4] & 63
        else:
            sc[:, s] = (scales[:, s + 4] & 15) | ((scales[:, s - 4] >> 6) << 4)
            mn[:, s] = (scales[:, s + 4] >> 4) | ((scales[:, s] >> 6) << 4)
    return sc, mn


def dequantize_k(b, qs_at, qh_at):
    """Q4_K (qh_at None) or Q5_K super-blocks."""
    d, dmin = half(b, 0), half(b, 2)
    sc, mn = k_scales(b[:, 4:16])
    out = np.zeros((len(b), 256), dtype=F32)
    for c in range(4):
        chunk = b[:, qs_at + 32 * c:qs_at + 32 * c + 32]
        for t, q in enumerate((chunk & 15, chunk >> 4)):
            s = 2 * c + t
            q = q.astype(F32)
            if qh_at is not None:
                q = q + 16 * ((b[:, qh_at:qh_at + 32] >> s) & 1)
            out[:, 32 * s:32 * s + 32] = (d * sc[:, s:s + 1]) * q - dmin * mn[:, s:s + 1]
    return out


def dequantize_q6_k(b):
    ql, qh, scales = b[:, :128], b[:, 128:192], b[:, 192:208].view(np.int8).astype(F32)
    d = half(b, 208)
    out = np.zeros((len(b), 256), dtype=F32)
    for n in range(2):
        low, high, sc = ql[:, 64 * n:64 * n + 64], qh[:, 32 * n:32 * n + 32], scales[:, 8 * n:]
        for l in range(32):
            i = l // 16
            q = [(low[:, l] & 15) | ((high[:, l] & 3) << 4),
                 (low[:, l + 32] & 15) | (((high[:, l] >> 2) & 3) << 4),
                 (low[:, l] >> 4) | (((high[:, l] >> 4) & 3) << 4),
                 (low[:, l + 32] >> 4) | ((high[:, l] >> 6) << 4)]
            for k in range(4):
                out[:, 128 * n + 32 * k + l] = (d[:, 0] * sc[:, i + 2 * k]) * (
                    q[k].astype(F32) - 32)
    return out


def dequantize_iq4_xs(b):
    d = half(b, 0)
    scales_h = b[:, 2:4].copy().view("<u2")[:, 0].astype(np.int64)
    out = np.zeros((len(b), 256), dtype=F32)
    for s in range(8):
        ls = ((b[:, 4 + s // 2] >> (4 * (s % 2))) & 15) | (((scales_h >> (2 * s)) & 3) << 4)
        dl = d[:, 0] * (ls.astype(F32) - 32)
        qs = b[:, 8 + 16 * s:8 + 16 * s + 16]
        out[:, 32 * s:32 * s + 16] = dl[:, None] * IQ4_VALUES[qs & 15]
        out[:, 32 * s + 16:32 * s + 32] = dl[:, None] * IQ4_VALUES[qs >> 4]
    return out


def dequantize_iq4_nl(b):
    """IQ4_NL blocks: f16 d, qs[16] (weight j the low nibble of qs[j], j + 16 its high);
    w = d * IQ4_VALUES[nibble]."""
    return half(b, 0) * IQ4_VALUES[nibbles(b[:, 2:18]).astype(np.uint8)]


def dequantize_q2_k(b):
    """Q2_K super-blocks: scales[16], qs[64], f16 d, f16 dmin. Weight 128h + 32t + l has q
    (0..3) at bits 2t, 2t + 1 of qs[32h + l]; sub-block i (weights 16i..16i + 15) has a
    4-bit scale, the low nibble of scales[i], and a 4-bit min, its high nibble;
    w = d * scale * q - dmin * min."""
    scales, qs, d, dmin = b[:, :16], b[:, 16:80], half(b, 80), half(b, 82)
    out = np.zeros((len(b), 256), dtype=F32)
    for i in range(16):
        dl = d[:, 0] * (scales[:, i] & 15).astype(F32)
        ml = dmin[:, 0] * (scales[:, i] >> 4).astype(F32)
        for w in range(16 * i, 16 * i + 16):
            h, t, l = w // 128, (w // 32) % 4, w % 32
            q = (qs[:, 32 * h + l] >> (2 * t)) & 3
            out[:, w] = dl * q.astype(F32) - ml
    return out


def dequantize_q3_k(b):
    """Q3_K super-blocks: hmask[32], qs[64], scales[12], f16 d. Weight 128h + 32t + l has
    its low 2 bits at bits 2t, 2t + 1 of qs[32h + l] and its top bit at bit 4h + t of
    hmask[l] (q in 0..7); sub-block i (weights 16i..16i + 15) has a 6-bit scale, its low 4
    bits in nibble i // 8 of scales[i % 8], its top 2 bits at bits 2(i // 4), 2(i // 4) + 1
    of scales[8 + i % 4]; w = d * (scale - 32) * (q - 4)."""
    hmask, qs, scales, d = b[:, :32], b[:, 32:96], b[:, 96:108], half(b, 108)
    out = np.zeros((len(b), 256), dtype=F32)
    for i in range(16):
        low = (scales[:, i % 8] >> (4 * (i // 8))) & 15
        top = (scales[:, 8 + i % 4] >> (2 * (i // 4))) & 3
        dl = d[:, 0] * ((low | (top << 4)).astype(F32) - 32)
        for w in range(16 * i, 16 * i + 16):
            h, t, l = w // 128, (w // 32) % 4, w % 32
            q = ((qs[:, 32 * h + l] >> (2 * t)) & 3) | (((hmask[:, l] >> (4 * h + t)) & 1) << 2)
            out[:, w] = dl * (q.astype(F32) - 4)
    return out


def dequantize_q8_0(b):
    return half(b, 0) * b[:, 2:].view(np.int8).astype(F32)


def dequantize_q4_0(b):
    return half(b, 0) * (nibbles(b[:, 2:]) - 8)


# type -> (weights per block, bytes per block, f16 field offsets, dequantization)
TYPES = {
    "Q4_1": (32, 20, (0, 2), dequantize_q4_1),
    "Q5_0": (32, 22, (0,), dequantize_q5_0),
    "Q5_1": (32, 24, (0, 2), dequantize_q5_1),
    "Q2_K": (256, 84, (80, 82), dequantize_q2_k),
    "Q3_K": (256, 110, (108,), dequantize_q3_k),
    "Q4_K": (256, 144, (0, 2), lambda b: dequantize_k(b, 16, None)),
    "Q5_K": (256, 176, (0, 2), lambda b: dequantize_k(b, 48, 16)),
    "Q6_K": (256, 210, (208,), dequantize_q6_k),
    "IQ4_XS": (256, 136, (0,), dequantize_iq4_xs),
    "IQ4_NL": (32, 18, (0,), dequantize_iq4_nl),
    "Q8_0": (32, 34, (0,), dequantize_q8_0),
    "Q4_0": (32, 18, (0,), dequantize_q4_0),
}
BLOCK_TYPES = ("Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS",
               "IQ4_NL")


def dequantize(raw, type_name):
    """float32 [rows, cols] of rows of blocks (uint8 [rows, row bytes])."""
    weights, size, _, function = TYPES[type_name]
    rows = raw.shape[0]
    return function(np.ascontiguousarray(raw).reshape(-1, size)).reshape(rows, -1)


# f16 scales of both signs, from the smallest subnormal to the largest finite.
EXTREME_SCALES = np.array([6e-8, -6e-8, 1e-4, -3e-3, 0.0, -0.0, 1.0, -1.0, 65504.0, -65504.0,
                           0.5, -2.0], dtype="<f2")


def random_blocks(type_name, count, rng, extreme=False):
    """`count` blocks of random bytes whose f16 fields are finite: small scales of both
    signs, or with `extreme` the EXTREME_SCALES."""
    _, size, fields, _ = TYPES[type_name]
    raw = rng.integers(0, 256, (count, size), dtype=np.uint8)
    for offset in fields:
        if extreme:
            values = rng.choice(EXTREME_SCALES, count)
        else:
            values = (rng.uniform(-0.02, 0.02, count)).astype("<f2")
        raw[:, offset:offset + 2] = values.view(np.uint8).reshape(count, 2)
    if type_name == "Q8_0":  # barellm's Q8 range is -127..127
        values = raw[:, 2:].view(np.int8)
        values[values == -128] = -127
    return raw


@pytest.mark.parametrize("extreme", [False, True])
@pytest.mark.parametrize("type_name", sorted(TYPES))
def test_dequantization_matches_the_gguf_package(type_name, extreme):
    """This file's dequantization (ggml's layouts as docs/FORMAT.md gives them) and the
    gguf package's agree on random blocks, small and extreme scales of both signs."""
    rng = np.random.default_rng(11)
    raw = random_blocks(type_name, 37, rng, extreme)
    ours = dequantize(raw, type_name)
    theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name])
    finite = np.isfinite(theirs)
    assert np.array_equal(np.isfinite(ours), finite)
    np.testing.assert_allclose(ours[finite], theirs[finite], rtol=2e-6, atol=0)
    assert np.count_nonzero(ours) > ours.size // 2


# ------------------------------------------------------------------- GGUF files in

# A llama whose matrices all have rows of 256 (head_dim 64: q and k rows are permuted);
# 37 vocabulary rows; ffn rows of 288 (not whole super-blocks).
KQ_CONFIG = {**TINY_CONFIG, "hidden_size": 256, "intermediate_size": 288,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 41,
             "num_hidden_layers": 2}


def gguf_from_hf(hf, out):
    result = run(GGUF_FROM_HF, hf, "-o", out, "--type", "f32")
    assert result.returncode == 0, result.stderr
    return out


def rewritten_gguf(source, out, replaced, file_type=None):
    """A copy of the GGUF `source` whose tensors named in `replaced` hold the given raw
    blocks ({name: (type name, uint8 [rows, row bytes])})."""
    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(out), reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        if field.name == "general.file_type" and file_type is not None:
            continue
        kind = field.types[0]
        writer.add_key_value(field.name, field.contents(), kind,
                             field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    if file_type is not None:
        writer.add_file_type(file_type)
    for tensor in reader.tensors:
        if tensor.name in replaced:
            type_name, raw = replaced[tensor.name]
            writer.add_tensor(tensor.name, raw,
                              raw_dtype=gguf.GGMLQuantizationType[type_name])
        else:
            writer.add_tensor(tensor.name, np.asarray(tensor.data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def random_matrix_blocks(type_name, rows, cols, rng):
    weights, size = TYPES[type_name][:2]
    return random_blocks(type_name, rows * cols // weights, rng).reshape(rows, -1)


def rotate_half(rows, head_dim):
    """llama.cpp's interleaved q/k rows in rotate-half order: within each head, row
    t * head_dim/2 + i is interleaved row 2i + t."""
    out = np.empty_like(rows)
    half_dim = head_dim // 2
    for head in range(rows.shape[0] // head_dim):
        for t in range(2):
            for i in range(half_dim):
                out[head * head_dim + t * half_dim + i] = rows[head * head_dim + 2 * i + t]
    return out


def convert(source, out, *options):
    result = run(CONVERT, source, "-o", out, *options)
    assert result.returncode == 0, result.stderr
    return out, result.stderr


def metadata(path):
    return read_raw(path)[1]["__metadata__"]


def matrix_values(tensors, name, kind):
    """The float32 weights of the matrix `name` of type `kind` in a converted file's
    tensors (read_raw), dequantized here."""
    if kind in ("F16", "F32"):
        return tensors[name].astype(F32)
    if kind in ("Q8_0", "Q4_0"):
        scales = tensors[name + ".scale"].astype(F32)
        rows = len(scales)
        if kind == "Q8_0":
            values = tensors[name].astype(F32)
        else:
            values = nibbles(tensors[name].reshape(-1, 16)).reshape(rows, -1) - 8
        return (values.reshape(rows, -1, 32) * scales[..., None]).reshape(rows, -1)
    return dequantize(tensors[name], kind)


@pytest.fixture(scope="module")
def f32_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("kq")
    hf = make_checkpoint(path / "hf", config=KQ_CONFIG)
    return gguf_from_hf(hf, path / "f32.gguf")


@pytest.mark.parametrize("type_name", BLOCK_TYPES + ("Q8_0", "Q4_0"))
def test_gguf_types_are_kept_byte_for_byte(tmp_path, f32_gguf, type_name):
    """A matrix of each type barellm runs keeps its blocks (q and k rows moved whole into
    rotate-half order); the file is named after general.file_type and maps every matrix
    to its type; the others (F32 here) stay F32."""
    rng = np.random.default_rng(5)
    cols = 256
    replaced = {name: (type_name, random_matrix_blocks(type_name, rows, cols, rng))
                for name, rows in (("blk.0.attn_v.weight", 128), ("blk.1.attn_q.weight", 256),
                                   ("blk.1.attn_k.weight", 128),
                                   ("token_embd.weight", KQ_CONFIG["vocab_size"]))}
    source = rewritten_gguf(f32_gguf, tmp_path / "m.gguf", replaced,
                            file_type=gguf.LlamaFileType.MOSTLY_Q4_K_M)
    out, log = convert(source, tmp_path / "m.bin")
    assert "dequantized" not in log and "stored as" not in log, log
    config = json.loads(metadata(out)["barellm.config"])
    assert config["weight_dtype"] == "Q4_K_M"
    types = json.loads(metadata(out)["barellm.matrix_types"])
    mine = {"layers.0.wv", "layers.1.wq", "layers.1.wk", "token_embedding"}
    assert {name for name, kind in types.items() if kind == type_name} == mine
    assert set(types.values()) == {type_name, "F32"}
    assert len(types) == 2 * 7 + 2
    tensors = read_raw(out)[2]
    for gguf_name, name in (("blk.0.attn_v.weight", "layers.0.wv"),
                            ("token_embd.weight", "token_embedding"),
                            ("blk.1.attn_q.weight", "layers.1.wq"),
                            ("blk.1.attn_k.weight", "layers.1.wk")):
        raw = replaced[gguf_name][1]
        permuted = name.endswith((".wq", ".wk"))
        if type_name in BLOCK_TYPES:
            assert tensors[name].dtype == np.uint8
            assert np.array_equal(tensors[name], rotate_half(raw, 64) if permuted else raw), name
        weights = dequantize(raw, type_name)
        got = matrix_values(tensors, name, type_name)
        # The dequantized matrix is the GGUF's with its rows permuted.
        assert np.array_equal(got, rotate_half(weights, 64) if permuted else weights), name


def test_file_order_and_alignment(tmp_path, f32_gguf):
    """F32, then F16 (scales and F16 matrices), then U8, then I8, each in model order;
    every U8 tensor has an even size and starts at an even offset."""
    rng = np.random.default_rng(6)
    replaced = {"blk.0.attn_q.weight": ("Q8_0", random_matrix_blocks("Q8_0", 256, 256, rng)),
                "blk.0.attn_k.weight": ("Q6_K", random_matrix_blocks("Q6_K", 128, 256, rng)),
                "blk.0.attn_v.weight": ("Q5_0", random_matrix_blocks("Q5_0", 128, 256, rng)),
                "blk.1.ffn_down.weight": ("F16", rng.standard_normal((256, 288)).astype("<f2")),
                "blk.1.attn_q.weight": ("Q4_0", random_matrix_blocks("Q4_0", 256, 256, rng)),
                "output.weight": ("Q4_K", random_matrix_blocks("Q4_K", 41, 256, rng))}
    source = rewritten_gguf(f32_gguf, tmp_path / "m.gguf", replaced)
    out, _ = convert(source, tmp_path / "m.bin")
    length, header, _, _ = read_raw(out)
    assert json.loads(metadata(out)["barellm.config"])["weight_dtype"] == "mixed"
    entries = [(name, entry["dtype"], entry["data_offsets"]) for name, entry in header.items()
               if name != "__metadata__"]
    rank = {"F32": 0, "F16": 1, "U8": 2, "I8": 3}
    ranks = [rank[dtype] for _, dtype, _ in entries]
    assert ranks == sorted(ranks)
    assert [name for name, dtype, _ in entries if dtype == "U8"] == [
        "layers.0.wk", "layers.0.wv", "layers.1.wq", "output"]
    assert [name for name, dtype, _ in entries if dtype == "I8"] == ["layers.0.wq"]
    assert [name for name, dtype, _ in entries if dtype == "F16"] == [
        "layers.0.wq.scale", "layers.1.wq.scale", "layers.1.w2"]
    for name, dtype, (begin, end) in entries:
        if dtype == "U8":
            assert (8 + length + begin) % 2 == 0 and (end - begin) % 2 == 0, name


def test_q2_k_is_kept_and_a_type_barellm_does_not_run_becomes_f16_in_one_line(tmp_path,
                                                                               f32_gguf):
    """A file of llama.cpp's Q2_K type: its Q2_K matrices are kept byte for byte (q and k
    rows moved whole into rotate-half order); an NVFP4 matrix, a type barellm does not
    run, is dequantized to F16 and named in one line."""
    rng = np.random.default_rng(7)
    kept = {}
    for layer in range(2):
        for part, short, rows in (("attn_q", "wq", 256), ("attn_k", "wk", 128)):
            kept[f"layers.{layer}.{short}"] = (f"blk.{layer}.{part}.weight", (
                "Q2_K", random_matrix_blocks("Q2_K", rows, 256, rng)))
    nvfp4_weights, nvfp4_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.NVFP4]
    rows = 128
    nvfp4 = rng.integers(0, 256, (rows * 256 // nvfp4_weights, nvfp4_bytes), dtype=np.uint8)
    # The four UE4M3 scales of each block of 64, 2^-4 to 2^-1.
    nvfp4[:, :4] = rng.integers(0x18, 0x30, (len(nvfp4), 4), dtype=np.uint8)
    nvfp4 = nvfp4.reshape(rows, -1)
    replaced = dict(kept.values())
    replaced["blk.1.attn_v.weight"] = ("NVFP4", nvfp4)
    replaced["blk.0.ffn_gate.weight"] = ("Q4_K", random_matrix_blocks("Q4_K", 288, 256, rng))
    source = rewritten_gguf(f32_gguf, tmp_path / "m.gguf", replaced,
                            file_type=gguf.LlamaFileType.MOSTLY_Q2_K)
    out, log = convert(source, tmp_path / "m.bin")
    assert log.count("\n") == 1, log
    assert log.startswith("convert: dequantized to F16") and "1 NVFP4 (blk.1.attn_v" in log
    assert "Q2_K" not in log, log
    types = json.loads(metadata(out)["barellm.matrix_types"])
    assert json.loads(metadata(out)["barellm.config"])["weight_dtype"] == "Q2_K"
    assert {name for name, kind in types.items() if kind == "Q2_K"} == set(kept)
    assert types["layers.1.wv"] == "F16" and types["layers.0.w1"] == "Q4_K"
    tensors = read_raw(out)[2]
    for name, (_, (_, raw)) in kept.items():
        assert tensors[name].dtype == np.uint8
        assert np.array_equal(tensors[name], rotate_half(raw, 64)), name
    expected = gguf.quants.dequantize(nvfp4, gguf.GGMLQuantizationType.NVFP4)
    assert np.array_equal(tensors["layers.1.wv"], expected.astype(np.float16))


def test_a_uniform_gguf_stays_a_uniform_file(tmp_path, f32_gguf):
    """All F32: today's uniform F32 file, without barellm.matrix_types."""
    out, log = convert(f32_gguf, tmp_path / "m.bin")
    assert json.loads(metadata(out)["barellm.config"])["weight_dtype"] == "F32"
    assert "barellm.matrix_types" not in metadata(out) and log == ""


def test_a_mix_of_a_gguf_file_reuses_its_blocks(tmp_path, f32_gguf):
    """--dtype q4_k_m on a GGUF file: a matrix already of the type the mix chooses (the
    output, Q6_K) is copied; the others are quantized from their values."""
    rng = np.random.default_rng(10)
    output = random_matrix_blocks("Q6_K", KQ_CONFIG["vocab_size"], 256, rng)
    wq = random_matrix_blocks("Q4_K", 256, 256, rng)
    source = rewritten_gguf(f32_gguf, tmp_path / "m.gguf", {
        "output.weight": ("Q6_K", output), "blk.0.attn_q.weight": ("Q4_K", wq)})
    out, log = convert(source, tmp_path / "m.bin", "--dtype", "q4_k_m")
    assert log == ""
    types = json.loads(metadata(out)["barellm.matrix_types"])
    assert types["output"] == "Q6_K" and types["layers.0.w2"] == "Q5_0"
    tensors = read_raw(out)[2]
    assert np.array_equal(tensors["output"], output)
    assert np.array_equal(tensors["layers.0.wq"], rotate_half(wq, 64))
    original = gguf.quants.dequantize(np.asarray(next(
        t for t in gguf.GGUFReader(str(f32_gguf)).tensors if t.name == "blk.0.ffn_down.weight"
    ).data), gguf.GGMLQuantizationType.F32)
    got = matrix_values(tensors, "layers.0.w2", "Q5_0")
    assert np.linalg.norm(got - original) / np.linalg.norm(original) < RELATIVE_ERROR["Q5_0"]


# ---------------------------------------------------------------- hostile GGUF files

def assert_refused(tmp_path, raw, message):
    source = tmp_path / "bad.gguf"
    source.write_bytes(raw)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    result = run(CONVERT, source, "-o", out_dir / "m.bin")
    lines = result.stderr.splitlines()
    assert result.returncode == 1, result.stderr
    assert len(lines) == 1 and lines[0].startswith("convert: "), result.stderr
    assert message in lines[0], lines[0]
    assert os.listdir(out_dir) == []


def q4_k_gguf(tmp_path, f32_gguf, blocks_of_wv):
    return rewritten_gguf(f32_gguf, tmp_path / "q.gguf",
                          {"blk.1.attn_v.weight": ("Q4_K", blocks_of_wv)}).read_bytes()


@pytest.mark.parametrize("field,value,kind", [(0, np.nan, "NaN"), (2, np.inf, "Inf"),
                                               (0, -np.inf, "Inf")])
def test_a_non_finite_f16_field_is_refused(tmp_path, f32_gguf, field, value, kind):
    raw = random_matrix_blocks("Q4_K", 128, 256, np.random.default_rng(8))
    raw[37, field:field + 2] = np.array([value], dtype="<f2").view(np.uint8)
    assert_refused(tmp_path, q4_k_gguf(tmp_path, f32_gguf, raw),
                   f"tensor 'blk.1.attn_v.weight' has a {kind} f16 field (byte {field})")


@pytest.mark.parametrize("type_name", BLOCK_TYPES)
def test_a_nan_in_the_last_f16_field_of_each_block_type_is_refused(tmp_path, f32_gguf,
                                                                    type_name):
    """The last f16 field of block 5 (Q2_K's dmin, Q3_K's and Q6_K's d, at the block's
    end) is NaN."""
    raw = random_matrix_blocks(type_name, 128, 256, np.random.default_rng(8))
    field = TYPES[type_name][2][-1]
    size = TYPES[type_name][1]
    blocks_of = raw.reshape(-1, size)
    blocks_of[5, field:field + 2] = np.array([np.nan], dtype="<f2").view(np.uint8)
    data = rewritten_gguf(f32_gguf, tmp_path / "q.gguf",
                          {"blk.0.attn_k.weight": (type_name, raw)}).read_bytes()
    assert_refused(tmp_path, data, f"NaN f16 field (byte {field}) in {type_name} block 5")


def tensor_info_at(data, name):
    """The offset of the ggml type (u32) in the tensor info of `name`."""
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    dims = struct.unpack("<I", data[at:at + 4])[0]
    return at + 4 + 8 * dims


def test_truncated_block_data_is_refused(tmp_path, f32_gguf):
    data = rewritten_gguf(f32_gguf, tmp_path / "q.gguf",
                          {"output.weight": ("Q4_K", random_matrix_blocks(
                              "Q4_K", 41, 256, np.random.default_rng(9)))}).read_bytes()
    assert_refused(tmp_path, data[:-100], "truncated")


def test_an_unknown_type_id_is_refused(tmp_path, f32_gguf):
    data = bytearray(q4_k_gguf(tmp_path, f32_gguf, random_matrix_blocks(
        "Q4_K", 128, 256, np.random.default_rng(9))))
    at = tensor_info_at(bytes(data), b"blk.1.attn_v.weight")
    data[at:at + 4] = struct.pack("<I", 99)
    assert_refused(tmp_path, bytes(data), "unknown ggml type 99")


def test_rows_not_whole_super_blocks_are_refused(tmp_path, f32_gguf):
    """A Q4_K tensor whose rows claim 288 weights (not a multiple of 256)."""
    data = bytearray(rewritten_gguf(f32_gguf, tmp_path / "q.gguf", {
        "blk.0.ffn_gate.weight": ("Q4_K", random_matrix_blocks(
            "Q4_K", 288, 256, np.random.default_rng(9)))}).read_bytes())
    name = b"blk.0.ffn_gate.weight"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name) + 4
    data[at:at + 8] = struct.pack("<Q", 288)  # row length 256 -> 288
    data[at + 8:at + 16] = struct.pack("<Q", 256)
    assert_refused(tmp_path, bytes(data), "rows of 288 are not whole Q4_K blocks of 256")


# ------------------------------------------------------------- Hugging Face in: mixes

def more_bits(layer, layers):
    """llama-quantize's use_more_bits."""
    return (layer < layers // 8 or layer >= 7 * layers // 8
            or (layer - layers // 8) % 3 == 2)


def expected_type(mix, name, cols, tied, layers, query_heads_per_kv=1):
    """llama-quantize's choice for a dense llama (docs/FORMAT.md), written here."""
    base = {"q2_k": "Q2_K", "q3_k_s": "Q3_K", "q3_k_m": "Q3_K", "q3_k_l": "Q3_K",
            "q4_k_m": "Q4_K", "q5_k_m": "Q5_K", "q6_k": "Q6_K", "iq4_xs": "IQ4_XS",
            "iq4_nl": "IQ4_NL"}[mix]
    short = name.rsplit(".", 1)[-1]
    layer = int(name.split(".")[1]) if name.startswith("layers.") else None
    if name == "output" or (tied and name == "token_embedding"):
        kind = "Q6_K" if cols % 256 == 0 else "Q8_0"
    elif mix == "q2_k" and short == "wv":
        kind = "Q4_K" if query_heads_per_kv >= 4 else "Q3_K"
    elif mix == "q2_k" and short in ("w2", "wo"):
        kind = "Q3_K"
    elif mix == "q3_k_l" and short in ("wv", "w2", "wo"):
        kind = "Q5_K"
    elif mix == "q3_k_m" and short == "wv":
        kind = "Q5_K" if layer < 2 else "Q4_K"
    elif mix == "q3_k_m" and short == "w2":
        kind = "Q5_K" if layer < layers // 16 else "Q4_K"
    elif mix == "q3_k_m" and short == "wo":
        kind = "Q4_K"
    elif mix in ("iq4_xs", "iq4_nl") and short == "wv":
        kind = "Q5_K" if query_heads_per_kv >= 4 else base
    elif mix in ("iq4_xs", "iq4_nl") and short == "w2":
        kind = "Q5_K" if int(name.split(".")[1]) < layers // 8 else base
    elif mix in ("q4_k_m", "q5_k_m") and short in ("wv", "w2") and more_bits(layer, layers):
        kind = "Q6_K"
    else:
        kind = base
    if cols % TYPES.get(kind, (256,))[0]:
        kind = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1",
                "Q6_K": "Q8_0", "IQ4_XS": "IQ4_NL"}.get(kind, kind)
    if cols % 32:
        kind = "F16"
    return kind


# Relative RMS error of each type on Gaussian weights, with a margin (measured: IQ4_XS
# 0.077, IQ4_NL 0.076, Q2_K 0.295, Q3_K 0.152, Q4_K 0.072, Q5_K 0.036, Q6_K 0.018, Q4_0
# 0.088, Q5_0 0.043, Q5_1 0.038, Q8_0 0.004).
RELATIVE_ERROR = {"IQ4_XS": 0.09, "IQ4_NL": 0.09, "Q2_K": 0.34, "Q3_K": 0.18, "Q4_K": 0.09,
                  "Q5_K": 0.045, "Q6_K": 0.023, "Q4_0": 0.105, "Q5_0": 0.055, "Q5_1": 0.048,
                  "Q8_0": 0.006, "F16": 0.001}


MIX_CONFIGS = {
    # 9 layers: the more-bits layers are 0, 3, 6, 7, 8; w2 rows of 288 fall back.
    "untied": {**TINY_CONFIG, "hidden_size": 256, "intermediate_size": 288,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 41,
               "num_hidden_layers": 9},
    # rows of 96: everything falls back; the tied embedding is the output (Q8_0).
    "tied-96": {**TINY_CONFIG, "hidden_size": 96, "intermediate_size": 80,
                "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 41,
                "num_hidden_layers": 3, "tie_word_embeddings": True},
}
# Rows of whole super-blocks (IQ4_XS falls back nowhere); 4 query heads a KV head give wv
# Q5_K under IQ4_XS and IQ4_NL, 9 layers w2 of layer 0 Q5_K.
IQ4_CONFIG = {**TINY_CONFIG, "hidden_size": 256, "intermediate_size": 512,
              "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 41,
              "num_hidden_layers": 9}
MIX_CASES = [(mix, shape)
             for mix in ("q2_k", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_m", "q5_k_m", "q6_k",
                         "iq4_xs", "iq4_nl")
             for shape in MIX_CONFIGS]
# IQ4_CONFIG's 4 query heads a KV head also give Q2_K's wv Q4_K.
MIX_CASES += [("iq4_xs", "iq4"), ("iq4_nl", "iq4"), ("q2_k", "iq4")]


def mix_config(shape):
    return IQ4_CONFIG if shape == "iq4" else MIX_CONFIGS[shape]


@pytest.mark.parametrize("mix,shape", MIX_CASES)
def test_mixes_of_a_checkpoint(tmp_path, mix, shape):
    """Each matrix gets llama-quantize's type for the mix, and its dequantized values are
    within the type's error of the checkpoint's."""
    config = mix_config(shape)
    tensors = tiny_tensors(config, seed=3)
    hf = make_checkpoint(tmp_path / "hf", config=config, tensors=tensors)
    out, log = convert(hf, tmp_path / "m.bin", "--dtype", mix)
    assert json.loads(metadata(out)["barellm.config"])["weight_dtype"] == mix.upper()
    types = json.loads(metadata(out)["barellm.matrix_types"])
    stored = read_raw(out)[2]
    hf_names = {"token_embedding": "model.embed_tokens.weight", "output": "lm_head.weight"}
    parts = {"wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj",
             "wo": "self_attn.o_proj", "w1": "mlp.gate_proj", "w3": "mlp.up_proj",
             "w2": "mlp.down_proj"}
    for layer in range(config["num_hidden_layers"]):
        for short, part in parts.items():
            hf_names[f"layers.{layer}.{short}"] = f"model.layers.{layer}.{part}.weight"
    if config.get("tie_word_embeddings"):
        del hf_names["output"]
    assert list(types) == [name for name in types if name in hf_names]
    assert set(types) == set(hf_names)
    seen = set()
    for name, hf_name in hf_names.items():
        original = tensors[hf_name][1]
        kind = expected_type(mix, name, original.shape[1], bool(config.get(
            "tie_word_embeddings")), config["num_hidden_layers"],
            config["num_attention_heads"] // config["num_key_value_heads"])
        assert types[name] == kind, name
        seen.add(kind)
        got = matrix_values(stored, name, kind)
        error = np.linalg.norm(got - original) / np.linalg.norm(original)
        assert error < RELATIVE_ERROR[kind], (name, kind, error)
    print(mix, shape, sorted(seen))


@pytest.mark.parametrize("mix,base,wo", [("Q4_K_M", "Q4_K", "Q5_K"), ("Q5_K_M", "Q5_K", "Q5_K"),
                                         ("Q6_K", "Q6_K", "Q6_K"), ("IQ4_XS", "IQ4_XS", "Q5_K"),
                                         ("Q3_K_S", "Q3_K", "Q5_K"), ("Q3_K_M", "Q3_K", "Q5_K"),
                                         ("Q3_K_L", "Q3_K", "Q3_K"), ("Q2_K", "Q2_K", "Q5_K"),
                                         ("IQ4_NL", "IQ4_NL", "Q5_K")])
def test_eight_experts_keep_wk_and_wv_in_q8_0(mix, base, wo):
    """llama-quantize's rules for a model of 8 experts (Mixtral): wk and wv Q8_0 under every
    mix, wo Q5_K under Q2_K, Q3_K_S, Q3_K_M, Q4_K_M, IQ4_XS and IQ4_NL (under Q3_K_L it
    stays Q3_K: llama.cpp's Q5_K for Q3_K_L's wo is in the branch of the other models); the
    experts' w2 follow the dense rules."""
    sys.path.insert(0, os.path.join(REPO, "convert"))
    import mixes
    config = {"layers": 32, "tied_embeddings": False, "architecture": "mixtral", "heads": 32,
              "kv_heads": 8, "experts": 8}
    assert mixes.matrix_type(mix, "layers.5.wk", 4096, config) == "Q8_0"
    assert mixes.matrix_type(mix, "layers.5.wv", 4096, config) == "Q8_0"
    assert mixes.matrix_type(mix, "layers.5.wo", 4096, config) == wo
    assert mixes.matrix_type(mix, "layers.5.wq", 4096, config) == base
    assert mixes.matrix_type(mix, "layers.5.experts.w1", 4096, config) == base
    more_bits_w2 = {"Q4_K_M": "Q6_K", "Q5_K_M": "Q6_K", "Q6_K": "Q6_K", "IQ4_XS": "Q5_K",
                    "Q3_K_S": "Q3_K", "Q3_K_M": "Q5_K", "Q3_K_L": "Q5_K", "Q2_K": "Q3_K",
                    "IQ4_NL": "Q5_K"}[mix]
    assert mixes.matrix_type(mix, "layers.0.experts.w2", 14336, config) == more_bits_w2
    sixteen = {**config, "experts": 16}
    assert mixes.matrix_type(mix, "layers.5.wk", 4096, sixteen) == base
    dense_wo = {"Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K", "Q2_K": "Q3_K"}.get(mix, base)
    assert mixes.matrix_type(mix, "layers.5.wo", 4096, sixteen) == dense_wo


def test_q3_k_mixes_of_a_deep_model():
    """Q3_K_M: wv Q5_K in layers 0 and 1, Q4_K after; w2 Q5_K in the first sixteenth of the
    layers, Q4_K after; wo Q4_K. Q3_K_L: wv, w2 and wo Q5_K. Q3_K_S: all Q3_K. The others
    (wq, wk, w1, w3, an untied token embedding) Q3_K; output Q6_K; llama.cpp's 70B raises
    every Q3_K or Q4_K wv to Q5_K; rows not whole super-blocks fall back to Q4_0, F16 when
    not whole blocks of 32 either."""
    sys.path.insert(0, os.path.join(REPO, "convert"))
    import mixes
    config = {"layers": 40, "tied_embeddings": False, "architecture": "llama", "heads": 40,
              "kv_heads": 8}

    def types(mix, short, cols=5120, of=config):
        return [mixes.matrix_type(mix, f"layers.{layer}.{short}", cols, of)
                for layer in range(of["layers"])]

    assert types("Q3_K_M", "wv") == ["Q5_K"] * 2 + ["Q4_K"] * 38
    assert types("Q3_K_M", "w2", 13824) == ["Q5_K"] * 2 + ["Q4_K"] * 38  # 40 // 16 = 2
    assert types("Q3_K_M", "wo") == ["Q4_K"] * 40
    for short in ("wv", "w2", "wo"):
        assert types("Q3_K_L", short) == ["Q5_K"] * 40
        assert types("Q3_K_S", short) == ["Q3_K"] * 40
    for mix in ("Q3_K_S", "Q3_K_M", "Q3_K_L"):
        for short in ("wq", "wk", "w1", "w3"):
            assert types(mix, short) == ["Q3_K"] * 40
        assert mixes.matrix_type(mix, "token_embedding", 5120, config) == "Q3_K"
        assert mixes.matrix_type(mix, "output", 5120, config) == "Q6_K"
        assert mixes.matrix_type(mix, "output", 5120 + 32, config) == "Q8_0"
        assert mixes.matrix_type(mix, "layers.3.wq", 5120 + 32, config) == "Q4_0"
        assert mixes.matrix_type(mix, "layers.3.wq", 5120 + 16, config) == "F16"
    assert mixes.matrix_type("Q3_K_M", "layers.0.wv", 5120 + 32, config) == "Q5_1"
    assert mixes.matrix_type("Q3_K_M", "layers.9.wo", 5120 + 32, config) == "Q5_0"
    seventy = {**config, "layers": 80, "heads": 64, "kv_heads": 8}
    for mix in ("Q3_K_S", "Q3_K_M", "Q3_K_L"):
        assert types(mix, "wv", 8192, seventy) == ["Q5_K"] * 80
        assert mixes.matrix_type(mix, "layers.11.wq", 8192, seventy) == "Q3_K"
    sixty_five = {**seventy, "kv_heads": 64}  # no grouped-query attention: not the 70B
    assert mixes.matrix_type("Q3_K_S", "layers.11.wv", 8192, sixty_five) == "Q3_K"
    assert mixes.matrix_type("Q3_K_M", "layers.11.wv", 8192, sixty_five) == "Q4_K"


def test_q2_k_mix_of_a_deep_model():
    """Q2_K: wv Q4_K where four or more query heads share a KV head, else Q3_K; w2 and wo
    Q3_K in every layer; wq, wk, w1, w3 and an untied token embedding Q2_K; output Q6_K;
    llama.cpp's 70B raises wv to Q5_K; rows not whole super-blocks fall back to Q4_0 (from
    Q2_K and Q3_K) or Q5_0 (from Q4_K), F16 when not whole blocks of 32 either."""
    sys.path.insert(0, os.path.join(REPO, "convert"))
    import mixes
    five_a_kv_head = {"layers": 40, "tied_embeddings": False, "architecture": "llama",
                      "heads": 40, "kv_heads": 8}
    three_a_kv_head = {**five_a_kv_head, "heads": 24}

    def types(short, config, cols=5120):
        return [mixes.matrix_type("Q2_K", f"layers.{layer}.{short}", cols, config)
                for layer in range(config["layers"])]

    assert types("wv", five_a_kv_head) == ["Q4_K"] * 40
    assert types("wv", three_a_kv_head) == ["Q3_K"] * 40
    for config in (five_a_kv_head, three_a_kv_head):
        assert types("w2", config, 13824) == ["Q3_K"] * 40
        assert types("wo", config) == ["Q3_K"] * 40
        for short in ("wq", "wk", "w1", "w3"):
            assert types(short, config) == ["Q2_K"] * 40
        assert mixes.matrix_type("Q2_K", "token_embedding", 5120, config) == "Q2_K"
        assert mixes.matrix_type("Q2_K", "output", 5120, config) == "Q6_K"
        assert mixes.matrix_type("Q2_K", "output", 5120 + 32, config) == "Q8_0"
        assert mixes.matrix_type("Q2_K", "layers.3.wq", 5120 + 32, config) == "Q4_0"
        assert mixes.matrix_type("Q2_K", "layers.3.w2", 13824 + 32, config) == "Q4_0"
        assert mixes.matrix_type("Q2_K", "layers.3.wq", 5120 + 16, config) == "F16"
    assert mixes.matrix_type("Q2_K", "layers.3.wv", 5120 + 32, five_a_kv_head) == "Q5_0"
    assert mixes.matrix_type("Q2_K", "layers.3.wv", 5120 + 32, three_a_kv_head) == "Q4_0"
    seventy = {**five_a_kv_head, "layers": 80, "heads": 64, "kv_heads": 8}
    assert types("wv", seventy, 8192) == ["Q5_K"] * 80
    assert mixes.matrix_type("Q2_K", "layers.11.wq", 8192, seventy) == "Q2_K"
    sixty_five = {**seventy, "kv_heads": 64}  # no grouped-query attention: not the 70B
    assert mixes.matrix_type("Q2_K", "layers.11.wv", 8192, sixty_five) == "Q3_K"


@pytest.mark.parametrize("mix", ["IQ4_XS", "IQ4_NL"])
def test_iq4_mixes_of_a_deep_model(mix):
    """IQ4_XS and IQ4_NL: wv Q5_K where four or more query heads share a KV head, else the
    base type; w2 Q5_K in the first eighth of the layers; wq, wk, wo, w1, w3 and an untied
    token embedding the base type; output Q6_K. Rows not whole super-blocks fall back:
    IQ4_XS to IQ4_NL, Q5_K to Q5_1, the output to Q8_0; rows not whole blocks of 32 stay
    F16."""
    sys.path.insert(0, os.path.join(REPO, "convert"))
    import mixes
    five_a_kv_head = {"layers": 40, "tied_embeddings": False, "architecture": "llama",
                      "heads": 40, "kv_heads": 8}
    three_a_kv_head = {**five_a_kv_head, "heads": 24}

    def types(short, config, cols=5120):
        return [mixes.matrix_type(mix, f"layers.{layer}.{short}", cols, config)
                for layer in range(config["layers"])]

    assert types("wv", five_a_kv_head) == ["Q5_K"] * 40
    assert types("wv", three_a_kv_head) == [mix] * 40
    for config in (five_a_kv_head, three_a_kv_head):
        assert types("w2", config, 13824) == ["Q5_K"] * 5 + [mix] * 35
        assert types("w2", config, 13824 + 32) == ["Q5_1"] * 5 + ["IQ4_NL"] * 35
        assert types("w2", config, 13824 + 16) == ["F16"] * 40
        for short in ("wq", "wk", "wo", "w1", "w3"):
            assert types(short, config) == [mix] * 40
            assert types(short, config, 5120 + 32) == ["IQ4_NL"] * 40
        assert mixes.matrix_type(mix, "token_embedding", 5120, config) == mix
        assert mixes.matrix_type(mix, "output", 5120, config) == "Q6_K"
        assert mixes.matrix_type(mix, "output", 5120 + 32, config) == "Q8_0"
        assert mixes.matrix_type(mix, "output", 5120 + 16, config) == "F16"
    assert mixes.matrix_type(mix, "layers.3.wv", 5120 + 32, five_a_kv_head) == "Q5_1"
    assert mixes.matrix_type(mix, "layers.3.wv", 5120 + 32, three_a_kv_head) == "IQ4_NL"


def test_q4_k_m_more_bits_layers_of_tinyllama():
    """TinyLlama's 22 layers: llama-quantize gives Q6_K to wv and w2 of layers 0, 1, 4, 7,
    10, 13, 16, 19, 20, 21."""
    sys.path.insert(0, os.path.join(REPO, "convert"))
    import mixes
    config = {"layers": 22, "tied_embeddings": False, "architecture": "llama", "heads": 32,
              "kv_heads": 4}
    chosen = [layer for layer in range(22)
              if mixes.matrix_type("Q4_K_M", f"layers.{layer}.w2", 5632, config) == "Q6_K"]
    assert chosen == [0, 1, 4, 7, 10, 13, 16, 19, 20, 21]
    assert mixes.matrix_type("Q4_K_M", "layers.2.wv", 2048, config) == "Q4_K"
    seventy = {**config, "layers": 80, "heads": 64, "kv_heads": 8}
    assert mixes.matrix_type("Q4_K_M", "layers.11.wv", 8192, seventy) == "Q5_K"
    assert mixes.matrix_type("Q4_K_M", "layers.11.wq", 8192, seventy) == "Q4_K"


# ------------------------------------------- the quantizers against a scalar reference

def nearest(value):
    """ggml's nearest_int: to nearest, ties to even, of a float32."""
    return int(np.rint(F32(value)))


def scalar_qkx2(x, w, nmax, rmin, rdelta, nstep, use_mad):
    """make_qkx2_quants, one value at a time in float32 (ggml-quants.c's published rule);
    with use_mad the error of a trial is the weighted sum of |error|, else of error²."""

    def deviation(diff):
        return abs(diff) if use_mad else diff * diff

    low, high = x[0], x[0]
    sum_w, sum_x = w[0], w[0] * x[0]
    for i in range(1, len(x)):
        low = x[i] if x[i] < low else low
        high = x[i] if x[i] > high else high
        sum_w = F32(sum_w + w[i])
        sum_x = F32(sum_x + w[i] * x[i])
    low = F32(0) if low > 0 else low
    if high == low:
        return F32(0), -low, [0] * len(x)
    iscale = F32(nmax) / (high - low)
    scale = F32(1) / iscale
    levels = [min(nmax, max(0, nearest(iscale * (x[i] - low)))) for i in range(len(x))]
    best = F32(0)
    for i in range(len(x)):
        diff = scale * F32(levels[i]) + low - x[i]
        best = F32(best + w[i] * deviation(diff))
    for step in range(nstep + 1):
        iscale = (F32(rmin) + F32(rdelta) * F32(step) + F32(nmax)) / (high - low)
        trial = [min(nmax, max(0, nearest(iscale * (x[i] - low)))) for i in range(len(x))]
        sum_l = sum_l2 = sum_xl = F32(0)
        for i in range(len(x)):
            wl = w[i] * F32(trial[i])
            sum_l, sum_l2, sum_xl = F32(sum_l + wl), F32(sum_l2 + wl * F32(trial[i])), \
                F32(sum_xl + wl * x[i])
        det = sum_w * sum_l2 - sum_l * sum_l
        if det > 0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
            if this_min > 0:
                this_min, this_scale = F32(0), sum_xl / sum_l2
            error = F32(0)
            for i in range(len(x)):
                diff = this_scale * F32(trial[i]) + this_min - x[i]
                error = F32(error + w[i] * deviation(diff))
            if error < best:
                levels, best, scale, low = trial, error, this_scale, this_min
    return scale, -low, levels


def scalar_q45_k(x, type_name):
    """One Q4_K or Q5_K super-block (256 float32) as bytes, value by value."""
    nmax, rmin, nstep = {"Q4_K": (15, -1.0, 20), "Q5_K": (31, -0.5, 15)}[type_name]
    scales, mins, levels = [], [], []
    for j in range(8):
        xs = x[32 * j:32 * j + 32]
        sum_x2 = F32(0)
        for value in xs:
            sum_x2 = F32(sum_x2 + value * value)
        average = np.sqrt(sum_x2 / F32(32))
        w = [average + abs(value) for value in xs]
        scale, the_min, sub = scalar_qkx2(xs, w, nmax, rmin, F32(0.1), nstep, False)
        scales.append(scale)
        mins.append(the_min)
        levels += sub
    max_scale = max([F32(0)] + scales)
    max_min = max([F32(0)] + mins)
    inv_scale = F32(63) / max_scale if max_scale > 0 else F32(0)
    inv_min = F32(63) / max_min if max_min > 0 else F32(0)
    ls = [min(63, nearest(inv_scale * s) & 255) for s in scales]
    lm = [min(63, nearest(inv_min * m) & 255) for m in mins]
    packed = [0] * 12
    for j in range(8):
        if j < 4:
            packed[j], packed[j + 4] = ls[j], lm[j]
        else:
            packed[j + 4] = (ls[j] & 15) | ((lm[j] & 15) << 4)
            packed[j - 4] |= (ls[j] >> 4) << 6
            packed[j] |= (lm[j] >> 4) << 6
    d = np.array(max_scale / F32(63), dtype="<f2")
    dmin = np.array(max_min / F32(63), dtype="<f2")
    for j in range(8):
        dj = F32(d) * F32(ls[j])
        if dj == 0:
            continue
        mj = F32(dmin) * F32(lm[j])
        for i in range(32):
            levels[32 * j + i] = min(nmax, max(0, nearest((x[32 * j + i] + mj) / dj)))
    qs = [levels[64 * c + l] & 15 | (levels[64 * c + 32 + l] & 15) << 4
          for c in range(4) for l in range(32)]
    qh = [sum(((levels[64 * c + l] >> 4) << (2 * c)) | ((levels[64 * c + 32 + l] >> 4)
                                                         << (2 * c + 1)) for c in range(4))
          for l in range(32)]
    head = d.tobytes() + dmin.tobytes() + bytes(packed)
    return head + (bytes(qh) if type_name == "Q5_K" else b"") + bytes(qs)


def scalar_q2_k(x):
    """One Q2_K super-block (256 float32) as bytes, value by value (quantize_row_q2_K_ref of
    ggml-quants.c)."""
    scales, mins, levels = [], [], []
    for j in range(16):
        xs = x[16 * j:16 * j + 16]
        scale, the_min, sub = scalar_qkx2(xs, [abs(value) for value in xs], 3, -0.5, F32(0.1),
                                          15, True)
        scales.append(scale)
        mins.append(the_min)
        levels += sub
    max_scale = max([F32(0)] + scales)
    max_min = max([F32(0)] + mins)
    packed = [0] * 16
    d = dmin = np.array(0, dtype="<f2")
    if max_scale > 0:
        packed = [nearest(F32(15) / max_scale * scale) & 255 for scale in scales]
        d = np.array(max_scale / F32(15), dtype="<f2")
    if max_min > 0:
        packed = [(p | nearest(F32(15) / max_min * m) << 4) & 255 for p, m in zip(packed, mins)]
        dmin = np.array(max_min / F32(15), dtype="<f2")
    for j in range(16):
        dj = F32(d) * F32(packed[j] & 15)
        if dj == 0:
            continue
        mj = F32(dmin) * F32(packed[j] >> 4)
        for i in range(16):
            levels[16 * j + i] = min(3, max(0, nearest((x[16 * j + i] + mj) / dj)))
    qs = [0] * 64
    for j, l in enumerate(levels):
        qs[32 * (j // 128) + j % 32] |= l << (2 * ((j // 32) % 4))
    return bytes(packed) + bytes(qs) + d.tobytes() + dmin.tobytes()


def scalar_qx(x):
    """make_qx_quants(16, 32, rmse_type 1) value by value: (scale, levels + 32)."""
    amax, largest = F32(0), F32(0)
    for value in x:
        if abs(value) > amax:
            amax, largest = abs(value), value
    if amax < F32(1e-15):
        return F32(0), [0] * len(x)

    def trial(iscale):
        levels = [min(31, max(-32, nearest(iscale * value))) for value in x]
        sumlx = suml2 = F32(0)
        for value, l in zip(x, levels):
            w = value * value
            sumlx = F32(sumlx + w * value * F32(l))
            suml2 = F32(suml2 + w * F32(l) * F32(l))
        return levels, sumlx, suml2

    levels, sumlx, suml2 = trial(F32(-32) / largest)
    scale = sumlx / suml2 if suml2 else F32(0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step:
            candidate, sumlx, suml2 = trial(-(F32(32) + F32(0.1) * F32(step)) / largest)
            if suml2 > 0 and sumlx * sumlx > best * suml2:
                levels, scale = candidate, sumlx / suml2
                best = scale * sumlx
    return scale, [l + 32 for l in levels]


def scalar_q6_k(x):
    scales, levels = [], []
    for j in range(16):
        scale, sub = scalar_qx(x[16 * j:16 * j + 16])
        scales.append(scale)
        levels += sub
    max_scale, max_abs = F32(0), F32(0)
    for scale in scales:
        if abs(scale) > max_abs:
            max_abs, max_scale = abs(scale), scale
    if max_abs < F32(1e-15):
        return bytes(210)
    iscale = F32(-128) / max_scale
    d = np.array(F32(1) / iscale, dtype="<f2")
    sub_scales = [min(127, nearest(iscale * scale)) for scale in scales]
    for j in range(16):
        dj = F32(d) * F32(sub_scales[j])
        if dj == 0:
            continue
        for i in range(16):
            levels[16 * j + i] = min(31, max(-32, nearest(x[16 * j + i] / dj))) + 32
    ql, qh = [], []
    for n in range(2):
        part = levels[128 * n:128 * n + 128]
        ql += [part[l] & 15 | (part[l + 64] & 15) << 4 for l in range(32)]
        ql += [part[l + 32] & 15 | (part[l + 96] & 15) << 4 for l in range(32)]
        qh += [part[l] >> 4 | (part[l + 32] >> 4) << 2 | (part[l + 64] >> 4) << 4 |
               (part[l + 96] >> 4) << 6 for l in range(32)]
    return bytes(ql) + bytes(qh) + np.array(sub_scales, dtype=np.int8).tobytes() + d.tobytes()


def scalar_q3(x):
    """make_q3_quants(16, 4, do_rmse true) value by value: (scale, levels + 4), with ggml's
    early stop after a pass that changes nothing."""
    amax, largest = F32(0), F32(0)
    for value in x:
        if abs(value) > amax:
            amax, largest = abs(value), value
    if amax < F32(1e-15):
        return F32(0), [0] * len(x)
    iscale = F32(-4) / largest
    levels = [min(3, max(-4, nearest(iscale * value))) for value in x]
    sumlx = suml2 = F32(0)
    for value, l in zip(x, levels):
        w = F32(value * value)
        sumlx = F32(sumlx + F32(w * value) * F32(l))
        suml2 = F32(suml2 + F32(w * F32(l)) * F32(l))
    for _ in range(5):
        changed = 0
        for i, value in enumerate(x):
            w = F32(value * value)
            slx = F32(sumlx - F32(w * value) * F32(levels[i]))
            if slx > 0:
                sl2 = F32(suml2 - F32(w * F32(levels[i])) * F32(levels[i]))
                new_l = min(3, max(-4, nearest(F32(value * sl2) / slx)))
                if new_l != levels[i]:
                    slx = F32(slx + F32(w * value) * F32(new_l))
                    sl2 = F32(sl2 + F32(w * F32(new_l)) * F32(new_l))
                    if sl2 > 0 and F32(F32(slx * slx) * suml2) > F32(F32(sumlx * sumlx) * sl2):
                        levels[i], sumlx, suml2 = new_l, slx, sl2
                        changed += 1
        if not changed:
            break
    return (sumlx / suml2 if suml2 > 0 else F32(0)), [l + 4 for l in levels]


def scalar_q3_k(x):
    """One Q3_K super-block (256 float32) as bytes, value by value (quantize_row_q3_K_ref of
    ggml-quants.c)."""
    scales, levels = [], []
    for j in range(16):
        scale, sub = scalar_q3(x[16 * j:16 * j + 16])
        scales.append(scale)
        levels += sub
    max_scale, max_abs = F32(0), F32(0)
    for scale in scales:
        if abs(scale) > max_abs:
            max_abs, max_scale = abs(scale), scale
    stored = [0] * 16
    d = np.array(0, dtype="<f2")
    if max_scale:
        iscale = F32(-32) / max_scale
        stored = [max(-32, min(31, nearest(iscale * scale))) + 32 for scale in scales]
        d = np.array(F32(1) / iscale, dtype="<f2")
    for j in range(16):
        dl = F32(d) * F32(stored[j] - 32)
        if dl == 0:
            continue
        for i in range(16):
            levels[16 * j + i] = max(-4, min(3, nearest(x[16 * j + i] / dl))) + 4
    hmask, qs = [0] * 32, [0] * 64
    for j, l in enumerate(levels):
        hmask[j % 32] |= (l >> 2) << (j // 32)
        qs[32 * (j // 128) + j % 32] |= (l & 3) << (2 * ((j // 32) % 4))
    packed = [0] * 12
    for j, l in enumerate(stored):
        packed[j % 8] |= (l & 15) << (4 * (j // 8))
        packed[8 + j % 4] |= (l >> 4) << (2 * (j // 4))
    return bytes(hmask) + bytes(qs) + bytes(packed) + d.tobytes()


IQ4_LEVELS = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]


def scalar_best_index(value):
    """best_index_int8 over the IQ4 levels: the nearest, the upper one on a tie."""
    if value <= IQ4_LEVELS[0]:
        return 0
    if value >= IQ4_LEVELS[-1]:
        return len(IQ4_LEVELS) - 1
    upper = next(i for i, level in enumerate(IQ4_LEVELS) if level > value)
    below = F32(value - F32(IQ4_LEVELS[upper - 1]))
    above = F32(F32(IQ4_LEVELS[upper]) - value)
    return upper - 1 if below < above else upper


def scalar_iq4_scale(xs):
    """The scale of 32 float32 weights (an IQ4_XS sub-block, an IQ4_NL block) by
    quantize_row_iq4_nl_impl of ggml-quants.c without an importance matrix: seven tries
    either side."""
    amax, largest = F32(0), F32(0)
    for value in xs:
        if abs(value) > amax:
            amax, largest = abs(value), value
    if amax < F32(1e-15):
        return F32(0)

    def sums(inverse):
        sumqx = sumq2 = F32(0)
        for value in xs:
            q = F32(IQ4_LEVELS[scalar_best_index(F32(inverse * value))])
            w = F32(value * value)
            sumqx = F32(sumqx + F32(w * q) * value)
            sumq2 = F32(sumq2 + F32(w * q) * q)
        return sumqx, sumq2

    sumqx, sumq2 = sums(F32(1) / (-largest / F32(-127)))
    d = sumqx / sumq2 if sumq2 > 0 else F32(0)
    best = F32(d * sumqx)
    for attempt in range(-7, 8):
        sumqx, sumq2 = sums(F32(attempt - 127) / largest)
        if sumq2 > 0 and F32(sumqx * sumqx) > F32(best * sumq2):
            d = F32(sumqx / sumq2)
            best = F32(d * sumqx)
    return F32(d)


def scalar_iq4_xs(x):
    """One IQ4_XS super-block (256 float32) as bytes, value by value (quantize_iq4_xs of
    ggml-quants.c without an importance matrix)."""
    scales = [scalar_iq4_scale(x[32 * j:32 * j + 32]) for j in range(8)]
    max_abs, max_scale = F32(0), F32(0)
    for scale in scales:
        if abs(scale) > max_abs:
            max_abs, max_scale = abs(scale), scale
    d = F32(-max_scale / F32(32))
    inverse = F32(1) / d if d else F32(0)
    levels, stored = [], []
    for j in range(8):
        l = max(-32, min(31, nearest(F32(inverse * scales[j]))))
        dl = F32(d * F32(l))
        idl = F32(1) / dl if dl else F32(0)
        levels += [scalar_best_index(F32(idl * value)) for value in x[32 * j:32 * j + 32]]
        stored.append(l + 32)
    scales_h = sum((l >> 4) << (2 * j) for j, l in enumerate(stored))
    scales_l = [(stored[2 * k] & 15) | (stored[2 * k + 1] & 15) << 4 for k in range(4)]
    qs = [levels[32 * i + j] | levels[32 * i + 16 + j] << 4 for i in range(8) for j in range(16)]
    return (np.array(d, dtype="<f2").tobytes() + int(scales_h).to_bytes(2, "little") +
            bytes(scales_l) + bytes(qs))


def scalar_iq4_nl(x):
    """Consecutive IQ4_NL blocks (32 float32 each) as bytes, value by value (quantize_iq4_nl
    of ggml-quants.c without an importance matrix): each block's scale d stored as f16, its
    weights the levels nearest x * (1 / d), d in float32."""
    out = b""
    for start in range(0, len(x), 32):
        xs = x[start:start + 32]
        d = scalar_iq4_scale(xs)
        inverse = F32(1) / d if d else F32(0)
        levels = [scalar_best_index(F32(inverse * value)) for value in xs]
        out += np.array(d, dtype="<f2").tobytes() + bytes(
            levels[j] | levels[j + 16] << 4 for j in range(16))
    return out


def edge_super_blocks(rng):
    """Super-blocks (float32 [n, 256]) with the cases the rules single out: Gaussian,
    heavy-tailed, all positive, all negative, a constant sub-block, zero sub-blocks with
    signed zeros, a block of zeros, repeated values."""
    gaussian = rng.standard_normal(256) * 0.02
    heavy = rng.standard_t(2, 256) * 0.05
    mixed = rng.standard_normal(256)
    mixed[32:64] = 0.25
    mixed[64:96] = np.where(rng.random(32) < 0.5, 0.0, -0.0)
    mixed[96:112] = 0.0
    steps = np.round(rng.standard_normal(256) * 3) / 8
    return np.stack([gaussian, heavy, np.abs(mixed), -np.abs(gaussian), mixed, np.zeros(256),
                     steps]).astype(F32)


@pytest.mark.parametrize("type_name", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS",
                                       "IQ4_NL"])
def test_k_quantizers_match_a_scalar_reference(type_name):
    """The converter's vectorised quantizers (convert/kquants.py) give the bytes of ggml's
    reference rules computed here one value at a time in float32; the super-blocks (of
    IQ4_NL: 8 blocks each, a block of zeros among them) are quantized as one row."""
    sys.path.insert(0, os.path.join(REPO, "convert"))
    import kquants
    rng = np.random.default_rng(12)
    x = edge_super_blocks(rng)
    if type_name in ("IQ4_XS", "IQ4_NL", "Q2_K", "Q3_K"):  # IQ4_XS and IQ4_NL: the outermost
        # tries of their search win on some uniform blocks; IQ4_NL, Q2_K and Q3_K: blocks of
        # small integers (ties of nearest_int), tiny weights (blocks or sub-blocks below
        # GROUP_MAX_EPS beside others), sparse blocks
        x = np.concatenate([x, rng.uniform(-1, 1, (24, 256)).astype(F32),
                            rng.standard_normal((24, 256)).astype(F32)])
    if type_name in ("IQ4_NL", "Q2_K", "Q3_K"):
        tiny = rng.standard_normal((4, 256)).astype(F32)
        tiny[:, :128] *= F32(1e-16)
        x = np.concatenate([x, rng.integers(-4, 4, (8, 256)).astype(F32), tiny,
                            (rng.standard_normal((8, 256)) * (rng.random((8, 256)) < 0.05)
                             ).astype(F32)])
    got = kquants.quantize(x.reshape(1, -1), type_name).reshape(len(x), -1)
    scalar = {"Q2_K": scalar_q2_k, "Q3_K": scalar_q3_k, "Q6_K": scalar_q6_k,
              "IQ4_XS": scalar_iq4_xs, "IQ4_NL": scalar_iq4_nl}
    for row, block in zip(x, got):
        expected = (scalar[type_name](row) if type_name in scalar
                    else scalar_q45_k(row, type_name))
        assert block.tobytes() == expected


@pytest.mark.parametrize("mix,part,kind", [
    ("q2_k", "q_proj", "Q2_K"), ("q3_k_s", "o_proj", "Q3_K"), ("q4_k_m", "o_proj", "Q4_K"),
    ("q6_k", "o_proj", "Q6_K"), ("iq4_nl", "q_proj", "IQ4_NL")])
def test_weights_beyond_the_f16_scales_are_refused(tmp_path, mix, part, kind):
    config = MIX_CONFIGS["untied"]
    tensors = tiny_tensors(config, seed=3)
    name = f"model.layers.1.self_attn.{part}.weight"
    tensors[name][1][7, 3] = 3e9
    hf = make_checkpoint(tmp_path / "hf", config=config, tensors=tensors)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    result = run(CONVERT, hf, "-o", out_dir / "m.bin", "--dtype", mix)
    lines = result.stderr.splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"convert: tensor '{name}' has values beyond the {kind} range"), \
        lines[0]
    assert os.listdir(out_dir) == []


# The models compared with llama-quantize's files, by the query heads a KV head: 2, with
# 16 layers (Q3_K_M's w2 of layer 0 is Q5_K: 16 // 16 = 1) and w2 rows of 288 (fallbacks:
# IQ4_XS's to IQ4_NL in layers 2 to 15); 4 (the wv of Q2_K Q4_K, of IQ4_NL Q5_K), with w2
# rows of two super-blocks.
LLAMA_QUANTIZE_CONFIGS = {"2-per-kv": {**MIX_CONFIGS["untied"], "num_hidden_layers": 16}}
LLAMA_QUANTIZE_CONFIGS["4-per-kv"] = {**LLAMA_QUANTIZE_CONFIGS["2-per-kv"],
                                      "num_attention_heads": 8, "intermediate_size": 512}


def llama_quantize(source, out, type_name):
    """llama-quantize's `type_name` file (`out`) of the GGUF `source`; the test is skipped
    where llama-quantize is not built."""
    if not os.path.exists(LLAMA_QUANTIZE):
        pytest.skip(f"{LLAMA_QUANTIZE} is not built (scripts/build_llamacpp.sh)")
    result = subprocess.run([LLAMA_QUANTIZE, str(source), str(out), type_name, "1"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def llama_quantize_model(tmp_path_factory, request):
    """(Hugging Face checkpoint, its f32 GGUF) of LLAMA_QUANTIZE_CONFIGS[request.param];
    skipped where llama-quantize is not built."""
    if not os.path.exists(LLAMA_QUANTIZE):
        pytest.skip(f"{LLAMA_QUANTIZE} is not built (scripts/build_llamacpp.sh)")
    path = tmp_path_factory.mktemp("llama-quantize")
    config = LLAMA_QUANTIZE_CONFIGS[request.param]
    hf = make_checkpoint(path / "hf", config=config, tensors=tiny_tensors(config, seed=7))
    return hf, gguf_from_hf(hf, path / "f32.gguf")


def assert_same_matrices(ours, kept):
    """Two converted files have the same type for every matrix and the same dtype and bytes in
    every tensor; returns their barellm.matrix_types."""
    types = json.loads(metadata(ours)["barellm.matrix_types"])
    assert json.loads(metadata(kept)["barellm.matrix_types"]) == types
    ours_tensors, kept_tensors = read_raw(ours)[2], read_raw(kept)[2]
    assert set(ours_tensors) == set(kept_tensors)
    for name, values in ours_tensors.items():
        assert values.dtype == kept_tensors[name].dtype, name
        assert np.array_equal(values.view(np.uint8), kept_tensors[name].view(np.uint8)), name
    return types


@pytest.mark.parametrize("mix,llama_quantize_model",
                         [(mix, "2-per-kv") for mix in ("q2_k", "q3_k_s", "q3_k_m", "q3_k_l",
                                                        "q4_k_m", "q5_k_m", "q6_k", "iq4_xs",
                                                        "iq4_nl")]
                         + [("q2_k", "4-per-kv"), ("iq4_nl", "4-per-kv")],
                         indirect=["llama_quantize_model"])
def test_mixes_equal_llama_quantize(tmp_path, llama_quantize_model, mix):
    """The converter's mix of a checkpoint and llama-quantize's file of its f32 GGUF
    (converted as it is) have the same type for every matrix and the same bytes in every
    tensor (blocks, Q4_0/Q8_0 values and scales)."""
    hf, f32 = llama_quantize_model
    theirs = llama_quantize(f32, tmp_path / "theirs.gguf", mix.upper())
    ours, _ = convert(hf, tmp_path / "ours.bin", "--dtype", mix)
    kept, _ = convert(theirs, tmp_path / "theirs.bin")
    types = assert_same_matrices(ours, kept)
    print(mix, sorted(set(types.values())))


# ------------------------------------------- running a mix (needs barellm's per-matrix types)

def logits(model, ids, *flags):
    dump_logits = os.path.join(BUILD, "dump_logits")
    if not os.path.exists(dump_logits):
        pytest.fail(f"{dump_logits} is missing: run `make` first")
    out = str(model) + ".logits"
    result = subprocess.run([dump_logits, str(model), out, *map(str, ids), *flags],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


def assert_logits_match(model, ids, want, what):
    """barellm's logits of `ids` on `model` against `want`, the reference's on its dequantized
    weights: the scalar path multiplies those exactly (in float32); SIMD decode and prefill,
    native and at --simd avx2, quantize the activations to 8 bits for their integer dot
    products (per 256 as Q8_K, or per 32): over a few layers a few percent, as q8's."""
    scalar = logits(model, ids, "--kv", "f32", "--simd", "scalar")
    relative = np.linalg.norm(scalar - want) / np.linalg.norm(want)
    print(f"{what} scalar: logits relative error {relative:.2e}")
    assert relative < 1e-4
    for flags in ([], ["--prefill"], ["--simd", "avx2"], ["--simd", "avx2", "--prefill"]):
        got = logits(model, ids, "--kv", "f32", *flags)
        relative = np.linalg.norm(got - want) / np.linalg.norm(want)
        print(f"{what} {' '.join(flags)}: logits relative error {relative:.2e}")
        assert relative < 5e-2
        assert (got.argmax(axis=1) == want.argmax(axis=1)).mean() > 0.8


@pytest.mark.parametrize("mix,shape", MIX_CASES)
def test_a_mix_runs_as_its_dequantized_weights(tmp_path, mix, shape):
    """barellm's logits of a mix are those of an F32 file of the same weights dequantized
    here, up to the quantization of the activations in the integer dot products."""
    config = mix_config(shape)
    tensors = tiny_tensors(config, seed=4)
    hf = make_checkpoint(tmp_path / "hf", config=config, tensors=tensors)
    mixed, _ = convert(hf, tmp_path / "mix.bin", "--dtype", mix)
    types = json.loads(metadata(mixed)["barellm.matrix_types"])
    stored = read_raw(mixed)[2]
    names = {"token_embedding": "model.embed_tokens.weight", "output": "lm_head.weight"}
    parts = {"wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj",
             "wo": "self_attn.o_proj", "w1": "mlp.gate_proj", "w3": "mlp.up_proj",
             "w2": "mlp.down_proj"}
    for layer in range(config["num_hidden_layers"]):
        for short, part in parts.items():
            names[f"layers.{layer}.{short}"] = f"model.layers.{layer}.{part}.weight"
    dequantized = dict(tensors)
    for name, kind in types.items():
        values = matrix_values(stored, name, kind)
        dequantized[names[name]] = ("F32", np.ascontiguousarray(values, dtype="<f4"))
    exact_hf = make_checkpoint(tmp_path / "deq", config=config, tensors=dequantized)
    exact, _ = convert(exact_hf, tmp_path / "f32.bin", "--dtype", "f32")
    ids = [1, 5, 9, 30, 31, 7, 2, 17, 3, 12, 40]
    want = logits(exact, ids, "--kv", "f32")
    assert_logits_match(mixed, ids, want, f"{mix} {shape}")
