"""Tests of `convert.py --dtype q8` (docs/FORMAT.md, "Q8 matrices") and of the numpy
reference reading Q8 files. The quantizer and dequantizer used to check the output are
written here, independently of convert/."""

import json
import math
import os

import numpy as np
import pytest

import model as reference
from convert_testlib import (CONVERT, SHARED, STORIES, TINY_CONFIG, make_checkpoint,
                             need_shared, read_raw, run, tiny_tensors)
from test_convert import (ODD_CONFIG, check_layout, converted, expected_names, hf_name,
                          refuse)

TINYSTORIES = os.path.join(SHARED, "eval", "tinystories_valid_sample.txt")
GROUP = 32


def convert_q8(directory, hf_dir, *options):
    """Convert `hf_dir` into `directory`/model.barellm (default --dtype q8); assert
    success; return the output path."""
    os.makedirs(directory, exist_ok=True)
    return converted(directory, hf_dir, *(options or ("--dtype", "q8")))


def is_matrix(name):
    """Whether barellm tensor `name` is a matrix (not a norm)."""
    return not (name.endswith("_norm") or name == "final_norm")


def dequantize(values, scales):
    """value * scale, one scale per group of 32 columns (fewer in a row's last group),
    computed in float64, group by group."""
    rows, cols = values.shape
    out = np.zeros((rows, cols))
    for g in range(math.ceil(cols / GROUP)):
        part = slice(g * GROUP, min(cols, (g + 1) * GROUP))
        out[:, part] = values[:, part].astype(np.float64) * scales[:, g:g + 1].astype(np.float64)
    return out


def quantize_group(weights):
    """The expected (int8 values, f16 scale) of one group of float32 weights:
    scale = f16(max|w| / 127 in float32); value = w / scale (float32 division) rounded
    half away from zero, clamped to +-127; scale 0 gives values 0."""
    amax = np.float32(max((abs(float(w)) for w in weights), default=0.0))
    scale = np.float16(amax / np.float32(127))
    if scale == 0:
        return [0] * len(weights), scale
    values = []
    for w in weights:
        ratio = float(np.float32(w) / np.float32(scale))  # exact in float64
        q = math.floor(abs(ratio) + 0.5) * (1 if ratio >= 0 else -1)
        values.append(max(-127, min(127, q)))
    return values, scale


def check_q8_matrix(values, scales, source, name):
    """`values`/`scales` are exactly the Q8 quantization of the float32 `source`, and
    every weight is within half a step (plus f16/float32 rounding slack) of its value
    * scale."""
    rows, cols = source.shape
    groups = math.ceil(cols / GROUP)
    assert values.dtype == np.int8 and values.shape == (rows, cols), name
    assert scales.dtype == np.float16 and scales.shape == (rows, groups), name
    assert np.isfinite(scales).all() and (scales >= 0).all(), name
    for row in range(rows):
        for g in range(groups):
            part = slice(g * GROUP, min(cols, (g + 1) * GROUP))
            expected, scale = quantize_group(source[row, part])
            assert scales[row, g] == scale, (name, row, g)
            assert values[row, part].tolist() == expected, (name, row, g)
    approx = dequantize(values, scales)
    step = np.repeat(scales.astype(np.float64), GROUP, axis=1)[:, :cols]
    error = np.abs(source.astype(np.float64) - approx)
    normal = step >= 2.0 ** -14   # scales that are f16 normals: relative precision 2^-11
    assert (error[normal] <= step[normal] * (0.5 + 1e-6)).all(), name
    zero = step == 0
    assert (approx[zero] == 0).all() and (np.abs(source[zero]) < 2.0 ** -25 * 127).all(), name
    return approx


def check_q8_file(out, source_weights, layers, tied):
    """Layout, names, dtypes and exact Q8 contents of the barellm file `out` converted
    from float32 `source_weights` (by Hugging Face name). Returns the header."""
    header, arrays = check_layout(out)
    # File order: F32 norms, then F16 scales, then I8 values, each in model order.
    assert list(arrays) == expected_names(layers, tied, weight_dtype="Q8")
    assert json.loads(header["__metadata__"]["barellm.config"])["weight_dtype"] == "Q8"
    for name, array in arrays.items():
        if name.endswith(".scale"):
            continue
        source = np.asarray(source_weights[hf_name(name)], dtype=np.float32)
        if is_matrix(name):
            assert header[name]["dtype"] == "I8" and header[name + ".scale"]["dtype"] == "F16"
            check_q8_matrix(array, arrays[name + ".scale"], source, name)
        else:
            assert header[name]["dtype"] == "F32"
            assert np.array_equal(array, source), name
    return header


def test_stories260k_q8_round_trip(tmp_path):
    need_shared(STORIES)
    out = converted(tmp_path, STORIES, "--dtype", "q8")
    source, _ = reference.read_safetensors(os.path.join(STORIES, "model.safetensors"))
    header = check_q8_file(out, source, layers=5, tied=True)
    assert json.loads(header["__metadata__"]["barellm.config"]) == {
        "architecture": "llama", "dim": 64, "hidden_dim": 172, "layers": 5, "heads": 8,
        "kv_heads": 4, "head_dim": 8, "vocab_size": 512, "max_context": 512,
        "rope_theta": 10000.0, "rope_scaling": None, "norm_eps": 1e-5,
        "sliding_window": None, "tied_embeddings": True, "bos_id": 1, "eos_ids": [2],
        "add_bos": True, "weight_dtype": "Q8"}
    shapes = {name: (entry["dtype"], entry["shape"]) for name, entry in header.items()
              if name != "__metadata__"}
    assert shapes["token_embedding"] == ("I8", [512, 64])
    assert shapes["token_embedding.scale"] == ("F16", [512, 2])
    assert shapes["layers.0.wk.scale"] == ("F16", [32, 2])
    assert shapes["layers.4.w1.scale"] == ("F16", [172, 2])
    assert shapes["layers.4.w2"] == ("I8", [64, 172])
    # 172 = 5 * 32 + 12: the last scale of a w2 row covers its last 12 columns only.
    assert shapes["layers.4.w2.scale"] == ("F16", [64, 6])
    _, _, arrays, _ = read_raw(out)
    w2 = source["model.layers.4.mlp.down_proj.weight"]
    last = np.float16(np.abs(w2[:, 160:]).max(axis=1) / np.float32(127))
    assert np.array_equal(arrays["layers.4.w2.scale"][:, 5], last)
    assert not np.array_equal(last, np.float16(np.abs(w2[:, 140:]).max(axis=1) / 127))


# Hand-checked 2x35 q_proj: groups of 32 + 3 columns.
# Row 0, group 0: max 127/64, so the scale is exactly 1/64 and w * 64 is the ratio:
# 2.5 -> 3, -2.5 -> -3, 0.5 -> 1, -0.5 -> -1 and -126.5 -> -127 (ties away from zero),
# 1.5 -> 2, 0.49 -> 0, 3.25 -> 3.
# Row 0, group 1: max 0.6: 0.6/127 = 0.0047244 = 1.2094 * 2^-8 -> f16 1238/1024 * 2^-8
# = 0.004722595...; 0.3 / s = 63.52 -> 64, -0.6 / s = -127.05 -> -127, 0.1 / s = 21.17 -> 21.
# Row 1, group 0: zeros -> scale 0, values 0.
# Row 1, group 1: max 5: 5/127 = 1.2598 * 2^-5 -> f16 1290/1024 * 2^-5 = 0.0393676...;
# -5 -> -127.008 -> -127, 5 -> 127, 2 / s = 50.80 -> 51.
HAND_Q = np.zeros((2, 35), dtype=np.float32)
HAND_Q[0, :9] = np.array([127, -2.5, 2.5, 0.5, -0.5, 1.5, 0.49, -126.5, 3.25],
                         dtype=np.float32) / 64
HAND_Q[0, 32:] = [0.3, -0.6, 0.1]
HAND_Q[1, 32:] = [-5.0, 5.0, 2.0]
HAND_Q_VALUES = np.zeros((2, 35), dtype=np.int8)
HAND_Q_VALUES[0, :9] = [127, -3, 3, 1, -1, 2, 0, -127, 3]
HAND_Q_VALUES[0, 32:] = [64, -127, 21]
HAND_Q_VALUES[1, 32:] = [-127, 127, 51]
HAND_Q_SCALES = np.array([[1 / 64, 1238 / 1024 * 2.0 ** -8], [0, 1290 / 1024 * 2.0 ** -5]])

# Hand-checked 2x35 k_proj, edge cases.
# Row 0, group 0: max 177.8 * 2^-24: the scale 1.4 * 2^-24 rounds to the f16 subnormal
# 2^-24, so +-177.8 clamps to +-127; 50 * 2^-24 -> 50, 2.5 * 2^-24 -> 3.
# Row 0, group 1: max 2e-9: the scale underflows f16 to 0, so values 0 (no NaN).
# Row 1, group 0: the max is negative: -3 / 127 -> f16 1548/1024 * 2^-6 = 0.0236206...;
# -3 -> -127.006 -> -127, 1 / s = 42.34 -> 42. Row 1, group 1: zeros.
HAND_K = np.zeros((2, 35), dtype=np.float32)
HAND_K[0, :4] = np.array([177.8, -177.8, 50, 2.5], dtype=np.float32) * np.float32(2.0 ** -24)
HAND_K[0, 32:] = [1e-9, -2e-9, 0]
HAND_K[1, :2] = [-3.0, 1.0]
HAND_K_VALUES = np.zeros((2, 35), dtype=np.int8)
HAND_K_VALUES[0, :4] = [127, -127, 50, 3]
HAND_K_VALUES[1, :2] = [-127, 42]
HAND_K_SCALES = np.array([[2.0 ** -24, 0], [1548 / 1024 * 2.0 ** -6, 0]])

HAND_CONFIG = {**TINY_CONFIG, "hidden_size": 35, "num_attention_heads": 1,
               "num_key_value_heads": 1, "head_dim": 2}


def hand_checkpoint(path, dtype="F32"):
    """A checkpoint of HAND_CONFIG whose q/k projections of layer 0 are HAND_Q/HAND_K,
    with layer 1's v_proj all zeros; every tensor stored as `dtype` (F32 or F16)."""
    tensors = tiny_tensors(HAND_CONFIG, seed=5)
    tensors["model.layers.0.self_attn.q_proj.weight"] = ("F32", HAND_Q)
    tensors["model.layers.0.self_attn.k_proj.weight"] = ("F32", HAND_K)
    tensors["model.layers.1.self_attn.v_proj.weight"] = ("F32", np.zeros((2, 35), "<f4"))
    if dtype == "F16":
        tensors = {name: ("F16", array.astype("<f2")) for name, (_, array) in tensors.items()}
    return make_checkpoint(path, config=HAND_CONFIG, tensors=tensors), tensors


def test_hand_checked_values(tmp_path):
    hf, tensors = hand_checkpoint(tmp_path / "hf")
    out = converted(tmp_path, hf, "--dtype", "q8")
    _, _, arrays, _ = read_raw(out)
    assert np.array_equal(arrays["layers.0.wq"], HAND_Q_VALUES)
    assert np.array_equal(arrays["layers.0.wq.scale"], HAND_Q_SCALES.astype(np.float16))
    assert np.array_equal(arrays["layers.0.wq.scale"].astype(np.float64), HAND_Q_SCALES)
    assert np.array_equal(arrays["layers.0.wk"], HAND_K_VALUES)
    assert np.array_equal(arrays["layers.0.wk.scale"].astype(np.float64), HAND_K_SCALES)
    # An all-zero matrix: scales 0 and values 0.
    assert not arrays["layers.1.wv"].any() and not arrays["layers.1.wv.scale"].any()
    # Every other matrix (wo has 2 columns, w2 24: a single partial group) exactly.
    check_q8_file(out, {name: array for name, (_, array) in tensors.items()},
                  layers=2, tied=False)
    _, weights = reference.load(str(out))
    np.testing.assert_array_equal(weights["layers.0.wq"],
                                  HAND_Q_VALUES * HAND_Q_SCALES.repeat([32, 3], axis=1))
    logits = reference.logits_for(str(out), [1, 4, 9, 30, 2])
    assert np.isfinite(logits).all()


def test_row_blocks_give_the_same_file(tmp_path, monkeypatch):
    import convert as converter   # convert/convert.py (on sys.path via test_convert)
    hf, _ = hand_checkpoint(tmp_path / "hf")
    whole = convert_q8(tmp_path / "whole", hf)
    monkeypatch.setattr(converter, "CHUNK_ELEMENTS", 3 * 35)   # 3 rows of 35 per block
    converter.convert(str(hf), str(tmp_path / "blocks.barellm"), "Q8")
    assert (tmp_path / "blocks.barellm").read_bytes() == whole.read_bytes()


def test_odd_sizes(tmp_path):
    # I8 tensors of odd byte counts: values and scales still land at their own offsets.
    tensors = tiny_tensors(ODD_CONFIG, seed=11)
    hf = make_checkpoint(tmp_path / "hf", config=ODD_CONFIG, tensors=tensors)
    out = convert_q8(tmp_path / "out", hf)
    check_q8_file(out, {name: array for name, (_, array) in tensors.items()},
                  layers=2, tied=False)
    assert np.isfinite(reference.logits_for(str(out), [1, 4, 9, 30, 2])).all()


def test_f16_source_is_upcast_first(tmp_path):
    hf, tensors = hand_checkpoint(tmp_path / "hf", dtype="F16")
    out = converted(tmp_path, hf, "--dtype", "q8")
    check_q8_file(out, {name: array.astype(np.float32) for name, (_, array) in tensors.items()},
                  layers=2, tied=False)


def test_bf16_source_matches_its_f32_upcast(tmp_path):
    tensors = tiny_tensors(TINY_CONFIG, seed=3)
    bf16 = {name: ("BF16", (array.view(np.uint32) >> 16).astype("<u2"))
            for name, (_, array) in tensors.items()}
    upcast = {name: ("F32", (bits.astype(np.uint32) << 16).view("<f4"))
              for name, (_, bits) in bf16.items()}
    out_bf16 = convert_q8(tmp_path / "a", make_checkpoint(tmp_path / "hf_bf16", tensors=bf16))
    out_f32 = convert_q8(tmp_path / "b", make_checkpoint(tmp_path / "hf_f32", tensors=upcast))
    assert out_bf16.read_bytes() == out_f32.read_bytes()
    check_q8_file(out_bf16, {name: array for name, (_, array) in upcast.items()},
                  layers=2, tied=False)


def test_refuses_scale_beyond_f16(tmp_path):
    tensors = tiny_tensors(TINY_CONFIG)
    array = tensors["model.layers.0.mlp.up_proj.weight"][1].copy()
    array[3, 5] = 1e7   # 1e7 / 127 > 65504
    tensors["model.layers.0.mlp.up_proj.weight"] = ("F32", array)
    hf = make_checkpoint(tmp_path / "hf", tensors=tensors)
    refuse(tmp_path, hf, "'model.layers.0.mlp.up_proj.weight' has values beyond the Q8 range",
           "--dtype", "q8")
    array[3, 5] = 8e6   # 8e6 / 127 = 62992: fits
    tensors["model.layers.0.mlp.up_proj.weight"] = ("F32", array)
    hf = make_checkpoint(tmp_path / "hf2", tensors=tensors)
    out = converted(tmp_path, hf, "--dtype", "q8")
    assert read_raw(out)[2]["layers.0.w3"][3, 5] == 127


def test_help_lists_q8():
    result = run(CONVERT, "--help")
    assert result.returncode == 0 and "q8" in result.stdout


def story_ids():
    """Token ids of the TinyStories sample (no BOS) with the stories260K tokenizer."""
    need_shared(STORIES)
    need_shared(TINYSTORIES)
    tokenizers = pytest.importorskip("tokenizers", reason="pip package tokenizers missing")
    tokenizer = tokenizers.Tokenizer.from_file(os.path.join(STORIES, "tokenizer.json"))
    with open(TINYSTORIES, encoding="utf-8") as f:
        return tokenizer.encode(f.read(), add_special_tokens=False).ids


def test_q8_logits_close_to_f32(tmp_path):
    ids = [1] + story_ids()[:127]
    out = converted(tmp_path, STORIES, "--dtype", "q8")
    exact = reference.logits_for(STORIES, ids)
    q8 = reference.logits_for(str(out), ids)
    relative = np.linalg.norm(q8 - exact) / np.linalg.norm(exact)
    same = np.mean(q8.argmax(axis=1) == exact.argmax(axis=1))
    print(f"q8 vs f32 logits: relative error {relative:.2e}, same argmax {same:.1%}")
    assert relative < 5e-2
    assert same >= 0.9


def perplexity(path, ids, context=512):
    """Perplexity of the reference model at `path` over `ids`, cut into windows of
    `context` tokens that each start with BOS (1) and predict the rest."""
    config, weights = reference.load(path)
    nll = []
    for start in range(0, len(ids), context - 1):
        window = [1] + ids[start:start + context - 1]
        logits = reference.forward(config, weights, window)
        logits -= logits.max(axis=1, keepdims=True)
        log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        nll += list(-log_probs[np.arange(len(window) - 1), window[1:]])
    return math.exp(np.mean(nll)), len(nll)


def test_q8_perplexity_within_one_percent_of_f16(tmp_path):
    ids = story_ids()[:2 * 511]
    f16 = convert_q8(tmp_path / "f16", STORIES, "--dtype", "f16")
    q8 = convert_q8(tmp_path / "q8", STORIES)
    ppl_f16, count = perplexity(str(f16), ids)
    ppl_q8, _ = perplexity(str(q8), ids)
    print(f"perplexity over {count} tokens: f16 {ppl_f16:.4f}, q8 {ppl_q8:.4f} "
          f"({ppl_q8 / ppl_f16 - 1:+.3%})")
    assert 3 < ppl_f16 < 12
    assert abs(ppl_q8 / ppl_f16 - 1) < 0.01
