"""Phi-3 and Phi-4 checkpoints (`phi3`: q, k and v fused in qkv_proj, the gate and up
projections in gate_up_proj; a window on every layer where sliding_window is set; LongRoPE's
short and long factors with its attention factor; Phi-4-mini's partial rotary): the
converter's output run by the C++ CPU backend, logits at every position against the
independent numpy reference (reference/model.py, which reads the Hugging Face directory
itself), decode and prefill, every weight dtype; a GGUF of the same weights converts to the
same file; the converter's refusals."""

import json
import math
import os

import gguf
import numpy as np
import pytest

import model as reference
from convert_testlib import CONVERT, REPO, make_checkpoint, read_raw, rewritten_gguf, run
from test_end_to_end import (IDS, barellm_logits, bf16_tolerance, check_quantized_logits,
                             relative_error)
from test_gemma import rewritten
from test_qwen import barellm, convert

# 24 tokens: longer than the window of 5 and than an original context of 8 (LongRoPE's long
# factors), shorter than one of 32 (its short factors).
PHI3_IDS = [1, 403, 407, 261, 378, 425, 301, 282, 500, 117, 300, 99, 5, 45, 67, 12, 480, 333,
            7, 250, 19, 388, 444, 3]

_PHI3 = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 512,
         "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
         "torch_dtype": "float32"}
# LongRoPE over 3 rotated pairs (of 5): 6 of head_dim 10 rotate (partial_rotary_factor 0.6).
_LONGROPE = {"type": "longrope", "short_factor": [1.0, 1.5, 2.5],
             "long_factor": [1.25, 4.0, 11.0]}
# Sizes off the SIMD width and tiles; GQA.
CONFIGS = {
    # Phi-3-mini's shape: every element rotated, no scaling, a window of 5 positions.
    "phi3-mini": {**_PHI3, "hidden_size": 40, "intermediate_size": 52, "num_hidden_layers": 3,
                  "num_attention_heads": 4, "num_key_value_heads": 4, "sliding_window": 5,
                  "tie_word_embeddings": False},
    # Phi-4-mini's: partial rotary, LongRoPE past an original context of 8 (factor 64 / 8,
    # attention factor sqrt(1 + ln 8 / ln 8)), tied embeddings, a window wider than the
    # context (none).
    "phi4-mini": {**_PHI3, "hidden_size": 40, "intermediate_size": 52, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 2,
                  "partial_rotary_factor": 0.6, "original_max_position_embeddings": 8,
                  "rope_scaling": _LONGROPE, "sliding_window": 262144,
                  "tie_word_embeddings": True},
    # The same within an original context of 32: the short factors, attention factor
    # sqrt(1 + ln 2 / ln 32).
    "phi4-mini-short": {**_PHI3, "hidden_size": 40, "intermediate_size": 52,
                        "num_hidden_layers": 2, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "partial_rotary_factor": 0.6,
                        "original_max_position_embeddings": 32, "rope_scaling": _LONGROPE,
                        "tie_word_embeddings": True},
}
LOGIT_GAIN = 4.0


def phi3_tensors(config, seed=0):
    """Random F32 tensors with Phi-3's names: N(0, 1/in) matrices (the embedding scaled by
    LOGIT_GAIN), norm weights around 1."""
    rng = np.random.default_rng(seed)
    dim, hidden, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = dim // heads

    def matrix(rows, cols, gain=1.0):
        return ("F32", (gain * rng.standard_normal((rows, cols)) / math.sqrt(cols)).astype("<f4"))

    def norm():
        return ("F32", (1 + 0.1 * rng.standard_normal(dim)).astype("<f4"))

    tensors = {"model.embed_tokens.weight": matrix(vocab, dim, LOGIT_GAIN)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        tensors.update({
            p + "input_layernorm.weight": norm(),
            p + "self_attn.qkv_proj.weight": matrix((heads + 2 * kv) * head_dim, dim),
            p + "self_attn.o_proj.weight": matrix(dim, heads * head_dim),
            p + "post_attention_layernorm.weight": norm(),
            p + "mlp.gate_up_proj.weight": matrix(2 * hidden, dim),
            p + "mlp.down_proj.weight": matrix(dim, hidden),
        })
    tensors["model.norm.weight"] = norm()
    if not config["tie_word_embeddings"]:
        tensors["lm_head.weight"] = matrix(vocab, dim, LOGIT_GAIN)
    return tensors


def checkpoint(tmp_path, name, config=None):
    """The Hugging Face directory of CONFIGS[name] (or `config`; tiny tokenizer)."""
    config = CONFIGS[name] if config is None else config
    return make_checkpoint(str(tmp_path / f"hf-{name}"), config, phi3_tensors(config))


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("mode", ["decode", "prefill"])
@pytest.mark.parametrize("simd", ["default", "scalar"])
def test_f32_logits_match_the_reference(tmp_path, name, mode, simd):
    hf = checkpoint(tmp_path, name)
    model = convert(hf, tmp_path / "model.bin", "f32")
    want = reference.logits_for(hf, PHI3_IDS)
    assert want.std(axis=1).min() > 2.0  # far from uniform
    flags = ["--kv", "f32"] + (["--simd", simd] if simd != "default" else [])
    got = barellm_logits(model, PHI3_IDS, *flags, *(["--prefill"] if mode == "prefill" else []))
    assert relative_error(got, want) < 1e-4
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_f16_and_bf16_match_the_reference_on_the_same_weights(tmp_path, name, dtype):
    """The reference reads the converted file: the same rounded matrices, q and k rows in
    barellm's order, the RoPE table of its config."""
    model = convert(checkpoint(tmp_path, name), tmp_path / "model.bin", dtype)
    want = reference.logits_for(model, PHI3_IDS)
    tolerance = bf16_tolerance(1e-3) if dtype == "bf16" else 1e-3
    for flags in ([], ["--prefill"]):
        got = barellm_logits(model, PHI3_IDS, "--kv", "f16", *flags)
        assert relative_error(got, want) < tolerance
        assert (got.argmax(axis=1) == want.argmax(axis=1)).mean() > 0.9  # near-ties may flip


@pytest.mark.parametrize("dtype", ["q8", "q4"])
def test_quantized_matches_the_reference_on_the_dequantized_weights(tmp_path, dtype):
    model = convert(checkpoint(tmp_path, "phi4-mini"), tmp_path / "model.bin", dtype)
    check_quantized_logits(model, reference.logits_for(model, IDS))


def test_the_file_holds_llama_matrices_in_barellm_rope_order(tmp_path):
    """The fused matrices are split row for row: v, the gate and up projections as stored,
    each head of q and k reordered so that the rotated pairs lead each half (rotary.py);
    the config says rotary_dim and LongRoPE's settings."""
    config = CONFIGS["phi4-mini"]
    tensors = phi3_tensors(config)
    model = convert(checkpoint(tmp_path, "phi4-mini"), tmp_path / "model.bin", "f32")
    _, header, arrays, _ = read_raw(model)
    saved = json.loads(header["__metadata__"]["barellm.config"])
    assert saved["architecture"] == "phi3" and saved["rotary_dim"] == 6
    assert saved["sliding_window"] is None and saved["tied_embeddings"]
    scaling = saved["rope_scaling"]
    assert scaling["long_factor"] == [1.25, 4.0, 11.0]
    assert scaling["original_max_position_embeddings"] == 8
    assert scaling["attention_factor"] == pytest.approx(math.sqrt(2))
    qkv = tensors["model.layers.1.self_attn.qkv_proj.weight"][1]
    gate_up = tensors["model.layers.1.mlp.gate_up_proj.weight"][1]
    # Within a head of 10: rotated pairs (0, 3), (1, 4), (2, 5) and the unrotated 6 .. 9.
    order = [0, 1, 2, 6, 7, 3, 4, 5, 8, 9]
    q = qkv[:40].reshape(4, 10, 40)[:, order].reshape(40, 40)
    k = qkv[40:60].reshape(2, 10, 40)[:, order].reshape(20, 40)
    assert np.array_equal(arrays["layers.1.wq"], q)
    assert np.array_equal(arrays["layers.1.wk"], k)
    assert np.array_equal(arrays["layers.1.wv"], qkv[60:])
    assert np.array_equal(arrays["layers.1.w1"], gate_up[:52])
    assert np.array_equal(arrays["layers.1.w3"], gate_up[52:])


@pytest.mark.parametrize("edit", [{"partial_rotary_factor": 1.0},
                                  {"original_max_position_embeddings": 32},
                                  {"rope_scaling": {**_LONGROPE, "attention_factor": 1.0}},
                                  {"sliding_window": 5}])
def test_each_phi3_setting_moves_the_logits(tmp_path, edit):
    """The partial rotary, the choice of LongRoPE's factor set, its attention factor and the
    window each change the reference logits far beyond the tolerance above (a backend that
    ignored one would fail there), and barellm follows each change. The factors' lengths
    follow the rotated pairs."""
    edited = {**CONFIGS["phi4-mini"], **edit}
    if edit.get("partial_rotary_factor") == 1.0:
        edited["rope_scaling"] = {"type": "longrope", "short_factor": [1.0, 1.5, 2.5, 3, 4],
                                  "long_factor": [1.25, 4.0, 11.0, 12.0, 13.0]}
    full = reference.logits_for(checkpoint(tmp_path, "phi4-mini"), PHI3_IDS)
    hf = checkpoint(tmp_path, "edited", edited)
    want = reference.logits_for(hf, PHI3_IDS)
    assert relative_error(want, full) > 0.01  # 100 times the tolerance
    model = convert(hf, tmp_path / "model.bin", "f32")
    for flags in ([], ["--prefill"]):
        assert relative_error(barellm_logits(model, PHI3_IDS, "--kv", "f32", *flags), want) < 1e-4


def test_the_context_picks_the_factor_set(tmp_path):
    """barellm picks LongRoPE's long factors only when the context it allocates exceeds
    the original one (as llama.cpp does; transformers when the sequence does): the file of
    phi4-mini (long factors at 24 tokens, test_f32_logits_match_the_reference) edited to an
    original context of 24 runs 24 tokens with the short factors, as the reference of a
    checkpoint with that original context (and the same attention factor) does."""
    long_model = convert(checkpoint(tmp_path, "phi4-mini"), tmp_path / "long.bin", "f32")
    edited = rewritten(tmp_path, long_model, {"rope_scaling": {
        **json.loads(read_raw(long_model)[1]["__metadata__"]["barellm.config"])["rope_scaling"],
        "original_max_position_embeddings": 24}})
    short_config = {**CONFIGS["phi4-mini"], "original_max_position_embeddings": 24,
                    "rope_scaling": {**_LONGROPE, "attention_factor": math.sqrt(2)}}
    want = reference.logits_for(checkpoint(tmp_path, "short", short_config), PHI3_IDS)
    assert relative_error(barellm_logits(edited, PHI3_IDS, "--kv", "f32"), want) < 1e-4


def test_the_configs_original_context_comes_before_rope_scalings(tmp_path):
    """As transformers reads a Phi-3 config: its own original_max_position_embeddings (32
    here: the short factors at 24 tokens) has priority over one in rope_scaling (8)."""
    config = {**CONFIGS["phi4-mini-short"],
              "rope_scaling": {**_LONGROPE, "original_max_position_embeddings": 8}}
    hf = checkpoint(tmp_path, "both", config)
    want = reference.logits_for(checkpoint(tmp_path, "phi4-mini-short"), PHI3_IDS)
    assert relative_error(reference.logits_for(hf, PHI3_IDS), want) < 1e-12
    model = convert(hf, tmp_path / "model.bin", "f32")
    assert relative_error(barellm_logits(model, PHI3_IDS, "--kv", "f32"), want) < 1e-4


@pytest.mark.parametrize("change,message", [
    ({"partial_rotary_factor": 0.5}, "rotates 5 of 10 elements; RoPE needs an even number"),
    ({"partial_rotary_factor": 0}, "partial_rotary_factor must be a number in (0, 1]"),
    ({"rope_scaling": {**_LONGROPE, "long_factor": [1.0, 2.0]}},
     "rope_scaling 'long_factor' must list 3 numbers"),
    ({"rope_scaling": {**_LONGROPE, "short_factor": [1.0, 0.0, 2.0]}},
     "rope_scaling 'short_factor' must be a positive number"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}},
     "rope_scaling type 'linear' is not supported for phi3"),
    ({"attention_bias": True}, "attention_bias=true is not supported for phi3"),
])
def test_the_converter_refuses_what_barellm_does_not_compute(tmp_path, change, message):
    hf = checkpoint(tmp_path, "bad", {**CONFIGS["phi4-mini"], **change})
    result = run(CONVERT, hf, "-o", tmp_path / "out.bin")
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert not (tmp_path / "out.bin").exists()


def test_a_missing_fused_matrix_is_named(tmp_path):
    config = CONFIGS["phi3-mini"]
    tensors = phi3_tensors(config)
    del tensors["model.layers.2.mlp.gate_up_proj.weight"]
    hf = make_checkpoint(str(tmp_path / "hf"), config, tensors)
    result = run(CONVERT, hf, "-o", tmp_path / "out.bin")
    assert result.returncode == 1
    assert "missing tensors: model.layers.2.mlp.gate_up_proj.weight" in result.stderr


GGUF_FROM_HF = os.path.join(REPO, "scripts", "gguf_from_hf.py")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_gguf_of_the_checkpoint_converts_to_its_file(tmp_path, name):
    """scripts/gguf_from_hf.py writes llama.cpp's phi3 (fused attn_qkv and ffn_up, q and k
    rows in Hugging Face's order, LongRoPE's factors as tensors); convert.py reads it back
    to the checkpoint's own file: every tensor equal, the same config (the attention
    factor as the GGUF's float32)."""
    hf = checkpoint(tmp_path, name)
    result = run(GGUF_FROM_HF, hf, "-o", tmp_path / "m.gguf")
    assert result.returncode == 0, result.stderr
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    fields = {key: field.contents() for key, field in reader.fields.items()}
    tensor_names = {tensor.name for tensor in reader.tensors}
    assert fields["general.architecture"] == "phi3"
    assert {"blk.0.attn_qkv.weight", "blk.0.ffn_up.weight"} <= tensor_names
    assert not {"blk.0.attn_q.weight", "blk.0.ffn_gate.weight"} & tensor_names
    from_hf = convert(hf, tmp_path / "hf.bin", "f32")
    from_gguf = tmp_path / "gguf.bin"
    result = run(CONVERT, tmp_path / "m.gguf", "-o", from_gguf)
    assert result.returncode == 0, result.stderr
    (_, hf_header, hf_arrays, _), (_, header, arrays, _) = read_raw(from_hf), read_raw(from_gguf)
    want = json.loads(hf_header["__metadata__"]["barellm.config"])
    got = json.loads(header["__metadata__"]["barellm.config"])
    if want["rope_scaling"]:
        assert fields["phi3.rope.dimension_count"] == want["rotary_dim"]
        assert {"rope_factors_long.weight", "rope_factors_short.weight"} <= tensor_names
        factor = got["rope_scaling"].pop("attention_factor")
        assert factor == pytest.approx(want["rope_scaling"].pop("attention_factor"), rel=1e-7)
    assert got == {**want, "weight_dtype": got["weight_dtype"]}
    assert sorted(arrays) == sorted(hf_arrays)
    for tensor, values in hf_arrays.items():
        assert np.array_equal(arrays[tensor], values), tensor


def test_info_shows_the_rotary_and_longrope(tmp_path):
    model = convert(checkpoint(tmp_path, "phi4-mini"), tmp_path / "model.bin", "f32")
    result = barellm("info", model)
    assert result.returncode == 0, result.stderr
    assert "architecture    phi3\n" in result.stdout
    assert "rotary_dim      6 of each head's 10 elements\n" in result.stdout
    assert ("rope_scaling    longrope, long factors beyond 8 positions, attention factor "
            "1.41421\n") in result.stdout


U32 = gguf.GGUFValueType.UINT32


def test_a_gguf_rewritten_unchanged_converts_to_the_same_file(tmp_path):
    """rewritten_gguf with nothing changed breaks nothing (so the refusals below are the
    changes')."""
    result = run(GGUF_FROM_HF, checkpoint(tmp_path, "phi4-mini"), "-o", tmp_path / "m.gguf")
    assert result.returncode == 0, result.stderr
    same = rewritten_gguf(tmp_path / "m.gguf", tmp_path / "same.gguf")
    for source, out in ((tmp_path / "m.gguf", "a.bin"), (same, "b.bin")):
        result = run(CONVERT, source, "-o", tmp_path / out)
        assert result.returncode == 0, result.stderr
    assert (tmp_path / "a.bin").read_bytes() == (tmp_path / "b.bin").read_bytes()


@pytest.mark.parametrize("keys,tensors,message", [
    ({}, {"rope_factors_long.weight": None},
     "missing tensors: rope_factors_long.weight (LongRoPE needs both factor sets)"),
    ({}, {"rope_factors_short.weight": np.array([1.0, 0.0, 2.0], dtype=np.float32)},
     "rope_factors_short.weight holds values that are not positive numbers"),
    ({}, {"rope_factors_long.weight": np.ones(4, dtype=np.float32)},
     "rope_factors_long.weight has shape [4], expected [3]"),
    ({"phi3.rope.dimension_count": (5, U32)}, {},
     "'phi3.rope.dimension_count' is 5, not the head size 10 (not supported; phi3 may rotate"),
    ({}, {"blk.1.attn_qkv.weight": np.zeros((79, 40), dtype=np.float32)},
     "tensor 'blk.1.attn_qkv.weight' has shape [79, 40], expected 80 rows from the config"),
    ({}, {"blk.0.ffn_up.weight": None}, "missing tensors: blk.0.ffn_up.weight"),
    ({"phi3.attention.sliding_window": (-5, gguf.GGUFValueType.INT32)}, {},
     "'phi3.attention.sliding_window' must not be negative"),
])
def test_the_converter_refuses_broken_phi3_ggufs(tmp_path, keys, tensors, message):
    """A phi3 GGUF (gguf_from_hf.py's) with one thing broken: one line, no file."""
    result = run(GGUF_FROM_HF, checkpoint(tmp_path, "phi4-mini"), "-o", tmp_path / "m.gguf")
    assert result.returncode == 0, result.stderr
    broken = rewritten_gguf(tmp_path / "m.gguf", tmp_path / "broken.gguf", keys, tensors)
    result = run(CONVERT, broken, "-o", tmp_path / "out.bin")
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.bin").exists()
