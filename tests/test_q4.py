"""Tests of `convert.py --dtype q4` (docs/FORMAT.md, "Q4 matrices"), of barellm loading
and running Q4 files, and of the numpy reference reading them. The quantizer used to
check the output is written here, block by block, independently of convert/; it is also
checked against llama.cpp's own Q4_0 (the gguf package's numpy implementation)."""

import json
import os
import subprocess

import numpy as np
import pytest

import model as reference
from convert_testlib import (BARELLM, CONVERT, STORIES, TINY_CONFIG, make_checkpoint,
                             need_shared, read_raw, run, tiny_tensors, write_safetensors)
from test_convert import check_layout, converted, hf_name, model_names, refuse
from test_end_to_end import IDS, barellm_logits, check_quantized_logits, relative_error

BLOCK = 32


def quantize_block(weights):
    """(q list, f16 scale) of one block of 32 float32 weights by llama.cpp's Q4_0 rule,
    every step rounded to float32: m = the first weight of largest magnitude, d = m / -8,
    q = min(15, trunc(w * (1 / d) + 8.5)), q = 8 when d is 0; the scale is f16(d)."""
    largest = np.float32(0)
    for w in weights:
        if abs(w) > abs(largest):
            largest = np.float32(w)
    d = np.float32(largest / np.float32(-8))
    inverse = np.float32(0) if d == 0 else np.float32(np.float32(1) / d)
    q = [min(15, int(np.float32(np.float32(w * inverse) + np.float32(8.5)))) for w in weights]
    return q, np.float16(d)


def quantize(matrix):
    """(uint8 [rows, cols / 2], float16 [rows, cols / 32]) of a float32 matrix: byte j of
    a block holds q of column j (low 4 bits) and of column j + 16 (high 4 bits)."""
    matrix = np.asarray(matrix, dtype=np.float32)
    rows, cols = matrix.shape
    packed = np.zeros((rows, cols // 2), dtype=np.uint8)
    scales = np.zeros((rows, cols // BLOCK), dtype=np.float16)
    for row in range(rows):
        for block in range(cols // BLOCK):
            q, scales[row, block] = quantize_block(matrix[row, block * BLOCK:(block + 1) * BLOCK])
            for j in range(16):
                packed[row, block * 16 + j] = q[j] | (q[j + 16] << 4)
    return packed, scales


def dequantize(packed, scales):
    """scale * (q - 8) for every column, in float64."""
    low = (packed & 0x0F).astype(np.float64).reshape(len(packed), -1, 16)
    high = (packed >> 4).astype(np.float64).reshape(len(packed), -1, 16)
    q = np.concatenate([low, high], axis=2)
    return ((q - 8) * scales.astype(np.float64)[..., None]).reshape(len(packed), -1)


def gguf_q4_0(matrix):
    """llama.cpp's Q4_0 of `matrix` from the gguf package, split into this format's two
    tensors: (uint8 [rows, cols / 2], float16 [rows, cols / 32]) and its dequantization."""
    gguf = pytest.importorskip("gguf", reason="pip package gguf missing")
    kind = gguf.GGMLQuantizationType.Q4_0
    rows, cols = matrix.shape
    raw = gguf.quants.quantize(np.asarray(matrix, dtype=np.float32), kind)
    blocks = raw.reshape(rows, cols // BLOCK, 18)   # [f16 d][16 bytes of q]
    scales = blocks[:, :, :2].copy().view(np.float16).reshape(rows, cols // BLOCK)
    packed = blocks[:, :, 2:].reshape(rows, cols // 2)
    return packed, scales, gguf.quants.dequantize(raw, kind)


def random_matrices():
    """Random float32 matrices with what the rule must get right: blocks of zeros, ties
    for the largest magnitude (of either sign), tiny and large magnitudes."""
    rng = np.random.default_rng(18)
    for rows, cols, scale in [(1, 32, 1.0), (7, 96, 1e-3), (13, 160, 40.0), (5, 288, 1e-6)]:
        matrix = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        matrix[0, :BLOCK] = 0
        if rows > 2:
            matrix[1, 3], matrix[1, 9] = -2 * scale, 2 * scale     # a tie: the first wins
            matrix[2, 40], matrix[2, 50] = 3 * scale, 3 * scale
        yield matrix


def test_quantizer_matches_gguf_and_this_rule():
    import dtypes   # convert/dtypes.py (on sys.path via test_convert)
    for matrix in random_matrices():
        packed, scales = dtypes.quantize_q4(matrix)
        want_packed, want_scales = quantize(matrix)
        gguf_packed, gguf_scales, gguf_values = gguf_q4_0(matrix)
        assert np.array_equal(packed, want_packed) and np.array_equal(packed, gguf_packed)
        assert np.array_equal(scales.view(np.uint16), want_scales.view(np.uint16))
        assert np.array_equal(scales.view(np.uint16), gguf_scales.view(np.uint16))
        assert np.array_equal(dequantize(packed, scales), gguf_values)
        assert np.array_equal(dtypes.dequantize_q4(packed, scales), gguf_values)


def test_hand_checked_block():
    import dtypes
    # m = -4 (|-4| = |4|, the first wins): d = 0.5, 1 / d = 2; w = 4 -> 8 + 8.5 -> 16 -> 15,
    # w = -4 -> 0, w = 0.74 -> 9.98 -> 9, w = -0.26 -> 7.98 -> 7, w = 0.25 -> 9.
    block = np.zeros((1, 32), dtype=np.float32)
    block[0, [0, 1, 2, 17, 31]] = [-4, 4, 0.74, -0.26, 0.25]
    packed, scales = dtypes.quantize_q4(block)
    assert scales[0, 0] == np.float16(0.5)
    q = [8] * 32
    q[0], q[1], q[2], q[17], q[31] = 0, 15, 9, 7, 9
    assert packed[0].tolist() == [q[j] | q[j + 16] << 4 for j in range(16)]


def is_matrix(name):
    return not (name.endswith("_norm") or name == "final_norm")


def stays_f16(shape):
    return shape[1] % BLOCK != 0


def check_q4_file(out, source, layers, tied):
    """Layout, names, dtypes and exact contents of the Q4 file `out` converted from the
    float32 `source` (by Hugging Face name). Returns the header."""
    header, arrays = check_layout(out)
    assert json.loads(header["__metadata__"]["barellm.config"])["weight_dtype"] == "Q4"
    names = model_names(layers, tied)
    quantized = [n for n in names if is_matrix(n) and not stays_f16(source[hf_name(n)].shape)]
    # File order: F32 norms, then F16 tensors (scales and F16 matrices), then U8 values.
    assert list(arrays) == ([n for n in names if not is_matrix(n)] +
                            [n + ".scale" if n in quantized else n
                             for n in names if is_matrix(n)] + quantized)
    for name in names:
        weights = np.asarray(source[hf_name(name)], dtype=np.float32)
        if name in quantized:
            assert header[name]["dtype"] == "U8" and header[name + ".scale"]["dtype"] == "F16"
            packed, scales = quantize(weights)
            assert np.array_equal(arrays[name], packed), name
            assert np.array_equal(arrays[name + ".scale"].view(np.uint16),
                                  scales.view(np.uint16)), name
        elif is_matrix(name):
            assert header[name]["dtype"] == "F16"
            assert np.array_equal(arrays[name], weights.astype(np.float16)), name
        else:
            assert header[name]["dtype"] == "F32" and np.array_equal(arrays[name], weights)
    return header


def test_stories260k_q4_keeps_w2_in_f16(tmp_path):
    need_shared(STORIES)
    result = run(CONVERT, STORIES, "-o", tmp_path / "q4.bin", "--dtype", "q4")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ("convert: note: q4 stores in F16 the matrices whose columns are "
                             "not a multiple of 32: w2 (172 columns)\n")
    source, _ = reference.read_safetensors(os.path.join(STORIES, "model.safetensors"))
    header = check_q4_file(tmp_path / "q4.bin", source, layers=5, tied=True)
    shapes = {name: (entry["dtype"], entry["shape"]) for name, entry in header.items()
              if name != "__metadata__"}
    assert shapes["token_embedding"] == ("U8", [512, 32])
    assert shapes["token_embedding.scale"] == ("F16", [512, 2])
    assert shapes["layers.4.w1"] == ("U8", [172, 32])
    assert shapes["layers.4.w2"] == ("F16", [64, 172])
    info = subprocess.run([BARELLM, "info", tmp_path / "q4.bin"], capture_output=True,
                          text=True)
    assert info.returncode == 0 and "weight_dtype    Q4" in info.stdout
    assert "bytes U8        102144" in info.stdout


def test_stories260k_q4_logits_match_reference(tmp_path):
    """The scalar path uses the dequantized weights exactly; SIMD decode and the AVX-512
    VNNI prefill also quantize the activations to 8 bits, a small extra error."""
    need_shared(STORIES)
    model = str(converted(tmp_path, STORIES, "--dtype", "q4"))
    want = reference.logits_for(model, IDS)
    check_quantized_logits(model, want)
    # The reference does read Q4: its logits differ from those of the f32 weights.
    assert relative_error(reference.logits_for(STORIES, IDS), want) > 1e-2


# Q4 for the matrices of 64 columns, F16 for w2 (40 columns); untied output.
WIDE_CONFIG = {**TINY_CONFIG, "hidden_size": 64, "intermediate_size": 40}
# The opposite: dim 48 keeps every matrix but w2 (64 columns) in F16, the tied embedding
# included.
NARROW_CONFIG = {**TINY_CONFIG, "hidden_size": 48, "intermediate_size": 64,
                 "num_attention_heads": 3, "num_key_value_heads": 1,
                 "tie_word_embeddings": True}


@pytest.mark.parametrize("config,note", [
    (WIDE_CONFIG, "w2 (40 columns)"),
    (NARROW_CONFIG, "token_embedding (48 columns), w1 (48 columns), w3 (48 columns), "
                    "wk (48 columns), wo (48 columns) (and 2 more)")])
def test_mixed_files_match_reference(tmp_path, config, note):
    tensors = tiny_tensors(config, seed=21)
    hf = make_checkpoint(tmp_path / "hf", config=config, tensors=tensors)
    result = run(CONVERT, hf, "-o", tmp_path / "q4.bin", "--dtype", "q4")
    assert result.returncode == 0, result.stderr
    assert result.stderr.endswith(f"not a multiple of 32: {note}\n")
    check_q4_file(tmp_path / "q4.bin", {name: array for name, (_, array) in tensors.items()},
                  layers=2, tied=config["tie_word_embeddings"])
    model = str(tmp_path / "q4.bin")
    ids = [1, 4, 9, 30, 2, 17, 39, 5, 11]
    want = reference.logits_for(model, ids)
    assert relative_error(barellm_logits(model, ids, "--kv", "f32", "--simd", "scalar"), want) < 1e-4
    for flags in ([], ["--prefill"]):
        assert relative_error(barellm_logits(model, ids, "--kv", "f32", *flags), want) < 2e-2


def test_row_blocks_give_the_same_file(tmp_path, monkeypatch):
    import convert as converter
    hf = make_checkpoint(tmp_path / "hf", config=WIDE_CONFIG,
                         tensors=tiny_tensors(WIDE_CONFIG, seed=2))
    whole = converted(tmp_path, hf, "--dtype", "q4")
    monkeypatch.setattr(converter, "CHUNK_ELEMENTS", 3 * 64)   # 3 rows of 64 per block
    converter.convert(str(hf), str(tmp_path / "blocks.barellm"), "Q4")
    assert (tmp_path / "blocks.barellm").read_bytes() == whole.read_bytes()


def test_refuses_scale_beyond_f16(tmp_path):
    tensors = tiny_tensors(WIDE_CONFIG)
    array = tensors["model.layers.0.mlp.up_proj.weight"][1].copy()
    array[3, 5] = 6e5   # d = 6e5 / 8 = 75000 > 65504
    tensors["model.layers.0.mlp.up_proj.weight"] = ("F32", array)
    hf = make_checkpoint(tmp_path / "hf", config=WIDE_CONFIG, tensors=tensors)
    refuse(tmp_path, hf, "'model.layers.0.mlp.up_proj.weight' has values beyond the Q4 range",
           "--dtype", "q4")


def test_help_lists_q4():
    result = run(CONVERT, "--help")
    assert result.returncode == 0 and "q4" in result.stdout


def rewritten(source, out, tensors=None, config=None):
    """Write `source`'s tensors (edited by `tensors`: name -> (dtype, array) or None to
    drop it) with its metadata (the config's keys changed by `config`) to `out`, tensors
    grouped by element size so that each stays aligned."""
    _, header, arrays, _ = read_raw(source)
    metadata = dict(header["__metadata__"])
    metadata["barellm.config"] = json.dumps(
        {**json.loads(metadata["barellm.config"]), **(config or {})})
    entries = {name: (header[name]["dtype"], array) for name, array in arrays.items()}
    for name, entry in (tensors or {}).items():
        if entry is None:
            del entries[name]
        else:
            entries[name] = entry
    order = sorted(entries, key=lambda name: -entries[name][1].dtype.itemsize)
    write_safetensors(out, {name: entries[name] for name in order}, metadata)
    return out


@pytest.fixture(scope="module")
def stories_files(tmp_path_factory):
    need_shared(STORIES)
    directory = tmp_path_factory.mktemp("stories")
    paths = {}
    for dtype in ("q4", "f16"):
        paths[dtype] = directory / f"{dtype}.bin"
        result = run(CONVERT, STORIES, "-o", paths[dtype], "--dtype", dtype)
        assert result.returncode == 0, result.stderr
    return paths


def inconsistent_files(paths, tmp_path):
    """(file, the message barellm must refuse it with) for files whose tensors do not
    follow their weight_dtype."""
    yield (rewritten(paths["f16"], tmp_path / "f16_as_q4.bin", config={"weight_dtype": "Q4"}),
           "tensor 'token_embedding' is F16, expected U8")
    yield (rewritten(paths["q4"], tmp_path / "q4_as_q8.bin", config={"weight_dtype": "Q8"}),
           "tensor 'token_embedding' is U8, expected I8")
    yield (rewritten(paths["q4"], tmp_path / "no_scale.bin",
                     tensors={"layers.2.wk.scale": None}),
           "layers.2.wk.scale")
    # w2 has 172 columns: a Q4 w2 (even of the right size) is not this format.
    yield (rewritten(paths["q4"], tmp_path / "q4_w2.bin",
                     tensors={"layers.0.w2": ("U8", np.zeros((64, 86), np.uint8))}),
           "tensor 'layers.0.w2' is U8, expected F16")
    yield (rewritten(paths["q4"], tmp_path / "wide_q4.bin",
                     tensors={"layers.0.wq": ("U8", np.zeros((64, 64), np.uint8))}),
           "tensor 'layers.0.wq' has shape [64, 64], the config needs [64, 32]")
    yield (rewritten(paths["q4"], tmp_path / "extra_scale.bin",
                     tensors={"layers.0.w2.scale": ("F16", np.ones((64, 5), np.float16))}),
           "holds 79 tensors, the config needs 78")


def test_inconsistent_files_are_refused_in_one_line(stories_files, tmp_path):
    for path, message in inconsistent_files(stories_files, tmp_path):
        result = subprocess.run([BARELLM, "info", path], capture_output=True, text=True)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1 and len(lines) == 1, (path, result.stderr)
        assert lines[0].startswith("barellm: ") and message in lines[0], lines[0]
