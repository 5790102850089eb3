"""Qwen2/Qwen2.5 (q/k/v biases, a sliding window from max_window_layers on) and Qwen3 (per-head
q/k RMSNorm before RoPE, explicit head_dim, attention_bias) checkpoints, and YaRN's RoPE
scaling (their long-context setting): the converter's output, the loader's checks, and the
C++ CPU backend's logits at every position against the independent numpy reference
(reference/model.py), decode (one token at a time) and prefill (one batch), for every weight
dtype."""

import json
import math
import os
import subprocess

import gguf
import numpy as np
import pytest

import model as reference
from convert_testlib import (BARELLM, CONVERT, REPO, make_checkpoint, read_raw, require_cuda,
                             run, write_safetensors)
from test_convert import check_layout
from test_end_to_end import (IDS, barellm_logits, bf16_tolerance, check_quantized_logits,
                             relative_error)

_QWEN = {"hidden_act": "silu", "vocab_size": 512, "max_position_embeddings": 64,
         "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2,
         "use_sliding_window": False, "torch_dtype": "float32"}
# Sizes off the SIMD width and tiles; head_dim * heads != hidden_size for Qwen3.
CONFIGS = {
    "qwen2": {**_QWEN, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
              "hidden_size": 36, "intermediate_size": 70, "num_hidden_layers": 3,
              "num_attention_heads": 3, "num_key_value_heads": 1, "tie_word_embeddings": True,
              "sliding_window": 4096, "max_window_layers": 1},
    # A window of 5 positions on layers 1 and 2 only, shorter than the prompt.
    "qwen2-window": {**_QWEN, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                     "hidden_size": 36, "intermediate_size": 70, "num_hidden_layers": 3,
                     "num_attention_heads": 3, "num_key_value_heads": 1,
                     "tie_word_embeddings": False, "use_sliding_window": True,
                     "sliding_window": 5, "max_window_layers": 1},
    "qwen3": {**_QWEN, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
              "hidden_size": 40, "intermediate_size": 70, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 18,
              "attention_bias": False, "tie_word_embeddings": False, "sliding_window": None,
              "max_window_layers": 2},
    # attention_bias: q, k, v and o projections all add a bias.
    "qwen3-attention-bias": {**_QWEN, "architectures": ["Qwen3ForCausalLM"],
                             "model_type": "qwen3", "hidden_size": 40, "intermediate_size": 70,
                             "num_hidden_layers": 2, "num_attention_heads": 4,
                             "num_key_value_heads": 2, "head_dim": 18, "attention_bias": True,
                             "tie_word_embeddings": True},
    # YaRN (Qwen's long context), with an original context that puts its ramp inside these
    # small heads: pairs 0 and 1 keep their frequency, 3 to 5 are divided by 4, 2 between.
    "qwen2-yarn": {**_QWEN, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                   "hidden_size": 36, "intermediate_size": 70, "num_hidden_layers": 2,
                   "num_attention_heads": 3, "num_key_value_heads": 1, "rope_theta": 10000.0,
                   "tie_word_embeddings": True,
                   "rope_scaling": {"type": "yarn", "factor": 4.0, "beta_fast": 8,
                                    "original_max_position_embeddings": 256}},
    # The ramp's ends not rounded (truncate false: pairs 3 and 4 blended), the attention
    # factor from mscale and mscale_all_dim.
    "qwen3-yarn": {**_QWEN, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                   "hidden_size": 40, "intermediate_size": 70, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 18,
                   "rope_theta": 10000.0, "attention_bias": False, "tie_word_embeddings": False,
                   "rope_scaling": {"rope_type": "yarn", "factor": 3.0, "beta_fast": 4,
                                    "original_max_position_embeddings": 512, "truncate": False,
                                    "mscale": 1.0, "mscale_all_dim": 0.5}},
}
# The logits' spread: large enough that the softmax is far from uniform.
LOGIT_GAIN = 4.0


def qwen_tensors(config, seed=0):
    """Random F32 tensors with Hugging Face names: N(0, 1/in) matrices (the output scaled by
    LOGIT_GAIN), norms around 1, biases N(0, 1), q/k norm weights in [0.5, 2.5]."""
    rng = np.random.default_rng(seed)
    dim, hidden, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config.get("head_dim") or dim // heads
    qwen2, qwen3 = config["model_type"] == "qwen2", config["model_type"] == "qwen3"
    attention_bias = config.get("attention_bias", False)

    def matrix(rows, cols, gain=1.0):
        return ("F32", (gain * rng.standard_normal((rows, cols)) / math.sqrt(cols)).astype("<f4"))

    def vector(size, center=0.0, spread=1.0):
        return ("F32", (center + spread * rng.standard_normal(size)).astype("<f4"))

    tied = config["tie_word_embeddings"]
    tensors = {"model.embed_tokens.weight": matrix(vocab, dim, LOGIT_GAIN if tied else 1.0)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}.self_attn."
        tensors.update({
            f"model.layers.{layer}.input_layernorm.weight": vector(dim, 1.0, 0.1),
            p + "q_proj.weight": matrix(heads * hd, dim),
            p + "k_proj.weight": matrix(kv * hd, dim),
            p + "v_proj.weight": matrix(kv * hd, dim),
            p + "o_proj.weight": matrix(dim, heads * hd),
            f"model.layers.{layer}.post_attention_layernorm.weight": vector(dim, 1.0, 0.1),
            f"model.layers.{layer}.mlp.gate_proj.weight": matrix(hidden, dim),
            f"model.layers.{layer}.mlp.up_proj.weight": matrix(hidden, dim),
            f"model.layers.{layer}.mlp.down_proj.weight": matrix(dim, hidden),
        })
        if qwen2 or attention_bias:
            tensors.update({p + "q_proj.bias": vector(heads * hd), p + "k_proj.bias": vector(kv * hd),
                            p + "v_proj.bias": vector(kv * hd)})
        if attention_bias:
            tensors[p + "o_proj.bias"] = vector(dim)
        if qwen3:
            for name in ("q_norm.weight", "k_norm.weight"):
                tensors[p + name] = ("F32", rng.uniform(0.5, 2.5, hd).astype("<f4"))
    tensors["model.norm.weight"] = vector(dim, 1.0, 0.1)
    if not tied:
        tensors["lm_head.weight"] = matrix(vocab, dim, LOGIT_GAIN)
    return tensors


def checkpoint(tmp_path, name, tensors=None):
    """The Hugging Face directory of CONFIGS[name] (tiny tokenizer, vocab 512)."""
    config = CONFIGS[name]
    return make_checkpoint(str(tmp_path / f"hf-{name}"), config,
                           qwen_tensors(config) if tensors is None else tensors)


def convert(hf_dir, out, dtype):
    result = run(CONVERT, hf_dir, "-o", out, "--dtype", dtype)
    assert result.returncode == 0, result.stderr
    return str(out)


def barellm(*args):
    if not os.path.exists(BARELLM):
        pytest.fail(f"{BARELLM} is missing: run `make` first")
    return subprocess.run([BARELLM, *map(str, args)], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_f32_logits_match_the_reference(tmp_path, name, mode):
    hf = checkpoint(tmp_path, name)
    model = convert(hf, tmp_path / "model.bin", "f32")
    want = reference.logits_for(hf, IDS)
    assert want.std(axis=1).min() > 2.0  # far from uniform
    flags = ["--kv", "f32"] + (["--prefill"] if mode == "prefill" else [])
    got = barellm_logits(model, IDS, *flags)
    assert relative_error(got, want) < 1e-4
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()


@pytest.mark.parametrize("name", ["qwen2", "qwen2-window", "qwen3", "qwen3-attention-bias"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_f16_and_bf16_match_the_reference_on_the_same_weights(tmp_path, name, dtype, mode):
    """The reference reads the converted file: the same rounded matrices, f32 biases and
    norms. The f16 KV cache adds a small error."""
    model = convert(checkpoint(tmp_path, name), tmp_path / "model.bin", dtype)
    want = reference.logits_for(model, IDS)
    got = barellm_logits(model, IDS, "--kv", "f16", *(["--prefill"] if mode == "prefill" else []))
    tolerance = 1e-3
    if dtype == "bf16":
        tolerance = bf16_tolerance(tolerance)
    assert relative_error(got, want) < tolerance
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()


@pytest.mark.parametrize("name", ["qwen2-window", "qwen3-attention-bias"])
def test_q8_matches_the_reference_on_the_dequantized_weights(tmp_path, name):
    """As tests/test_end_to_end.py for Llama: the scalar path uses the dequantized weights
    exactly; SIMD decode and the AVX-512 VNNI prefill also quantize the activations."""
    model = convert(checkpoint(tmp_path, name), tmp_path / "model.bin", "q8")
    want = reference.logits_for(model, IDS)
    check_quantized_logits(model, want)


def without(tensors, suffix, replacement):
    """`tensors` with every tensor whose name ends in `suffix` replaced by
    replacement(array)."""
    return {name: ("F32", replacement(array)) if name.endswith(suffix) else (dtype, array)
            for name, (dtype, array) in tensors.items()}


@pytest.mark.parametrize("name,suffix,replacement", [
    ("qwen2", "q_proj.bias", np.zeros_like),
    ("qwen2", "k_proj.bias", np.zeros_like),
    ("qwen2", "v_proj.bias", np.zeros_like),
    ("qwen3", "q_norm.weight", np.ones_like),
    ("qwen3", "k_norm.weight", np.ones_like),
    ("qwen3-attention-bias", "o_proj.bias", np.zeros_like),
])
def test_each_feature_moves_the_logits(tmp_path, name, suffix, replacement):
    """Dropping one feature changes the reference logits far beyond the 1e-4 tolerance, so a
    backend that skipped it would fail the tests above; barellm follows the change."""
    tensors = qwen_tensors(CONFIGS[name])
    full = reference.logits_for(checkpoint(tmp_path, name, tensors), IDS)
    hf = make_checkpoint(str(tmp_path / "edited"), CONFIGS[name],
                         without(tensors, suffix, replacement))
    edited = reference.logits_for(hf, IDS)
    assert relative_error(edited, full) > 0.05
    model = convert(hf, tmp_path / "edited.bin", "f32")
    assert relative_error(barellm_logits(model, IDS, "--kv", "f32"), edited) < 1e-4


def test_the_window_moves_the_logits(tmp_path):
    """Without its window (or with it on every layer) the qwen2-window model's logits differ
    past the window's length: the first windowed layer matters."""
    config, weights = reference.load(checkpoint(tmp_path, "qwen2-window"))
    want = reference.forward(config, weights, IDS)
    for first_layer, window in ((0, 5), (1, None)):
        changed = reference.forward({**config, "sliding_window": window,
                                     "sliding_window_first_layer": first_layer}, weights, IDS)
        assert np.allclose(changed[:5], want[:5])  # within the window: the same
        assert relative_error(changed[5:], want[5:]) > 0.05


# ---- the converted file ----------------------------------------------------------------

# The model order of a layer's tensors (docs/FORMAT.md, the table under Tensors).
LAYER_ORDER = ["attn_norm", "wq", "wk", "wv", "bq", "bk", "bv", "q_norm", "k_norm", "wo", "bo",
               "ffn_norm", "w1", "w3", "w2"]
ELEMENT_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I8": 1}


@pytest.mark.parametrize("dtype,matrix_dtype", [("f32", "F32"), ("bf16", "BF16"), ("q8", "I8")])
def test_biases_and_qk_norms_are_f32_tensors(tmp_path, dtype, matrix_dtype):
    for name in ("qwen2-window", "qwen3-attention-bias"):
        model = convert(checkpoint(tmp_path, name), tmp_path / f"{name}.bin", dtype)
        header, arrays = check_layout(model)
        # File order: by element size, then model order.
        layer0 = [(-ELEMENT_BYTES[entry["dtype"]], LAYER_ORDER.index(tensor.split(".")[2]))
                  for tensor, entry in header.items()
                  if tensor.startswith("layers.0.") and not tensor.endswith(".scale")]
        assert layer0 == sorted(layer0)
        config = json.loads(header["__metadata__"]["barellm.config"])
        hf = CONFIGS[name]
        hd = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
        expected = {"bq": hf["num_attention_heads"] * hd, "bk": hf["num_key_value_heads"] * hd,
                    "bv": hf["num_key_value_heads"] * hd}
        if name == "qwen3-attention-bias":
            expected.update({"bo": hf["hidden_size"], "q_norm": hd, "k_norm": hd})
        for layer in range(hf["num_hidden_layers"]):
            for short, size in expected.items():
                entry = header[f"layers.{layer}.{short}"]
                assert entry["dtype"] == "F32" and entry["shape"] == [size]
            assert header[f"layers.{layer}.wq"]["dtype"] == matrix_dtype
        source = qwen_tensors(hf)
        assert np.array_equal(arrays["layers.1.bk"],
                              source["model.layers.1.self_attn.k_proj.bias"][1])
        assert config["architecture"] == hf["model_type"]
        assert config["qkv_bias"] is True
        assert config.get("qk_norm", False) is (hf["model_type"] == "qwen3")
        assert config.get("o_bias", False) is hf.get("attention_bias", False)


@pytest.mark.parametrize("changes,window,first_layer", [
    ({}, 5, 1),                                            # layers 1 and up
    ({"max_window_layers": 0}, 5, 0),                      # every layer
    ({"max_window_layers": 3}, None, 0),                   # no layer reaches it
    ({"use_sliding_window": False}, None, 0),              # the window is off
    ({"layer_types": ["full_attention"] + ["sliding_attention"] * 2}, 5, 1),
])
def test_sliding_window_settings_follow_transformers(tmp_path, changes, window, first_layer):
    config = {**CONFIGS["qwen2-window"], **changes}
    hf = make_checkpoint(str(tmp_path / "hf"), config, qwen_tensors(config))
    model = convert(hf, tmp_path / "model.bin", "f32")
    stored = json.loads(read_raw(model)[1]["__metadata__"]["barellm.config"])
    assert (stored["sliding_window"], stored.get("sliding_window_first_layer", 0)) == (
        window, first_layer)


def test_a_layer_mix_barellm_cannot_run_is_refused(tmp_path):
    config = {**CONFIGS["qwen2-window"],
              "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}
    hf = make_checkpoint(str(tmp_path / "hf"), config, qwen_tensors(config))
    result = run(CONVERT, hf, "-o", tmp_path / "model.bin")
    assert result.returncode == 1 and "'layer_types' differs" in result.stderr
    assert not os.path.exists(tmp_path / "model.bin")


def test_qwen3_head_dim_defaults_to_128(tmp_path):
    config = {**CONFIGS["qwen3"], "hidden_size": 32, "num_attention_heads": 2}
    del config["head_dim"]
    hf = make_checkpoint(str(tmp_path / "hf"), config, qwen_tensors({**config, "head_dim": 128}))
    model = convert(hf, tmp_path / "model.bin", "f32")
    stored = json.loads(read_raw(model)[1]["__metadata__"]["barellm.config"])
    assert stored["head_dim"] == 128
    assert relative_error(barellm_logits(model, IDS[:6], "--kv", "f32"),
                          reference.logits_for(hf, IDS[:6])) < 1e-4


# ---- the loader ------------------------------------------------------------------------

def rewritten(tmp_path, model, edit_config=None, drop=None):
    """A copy of the barellm file `model` with its config edited and/or a tensor dropped
    (written in the file's own order, so only the edit is wrong)."""
    _, header, arrays, _ = read_raw(model)
    metadata = dict(header["__metadata__"])
    if edit_config:
        metadata["barellm.config"] = json.dumps(
            {**json.loads(metadata["barellm.config"]), **edit_config})
    tensors = {name: (header[name]["dtype"], arrays[name]) for name in arrays if name != drop}
    out = tmp_path / "edited.bin"
    write_safetensors(out, tensors, metadata)
    return out


@pytest.mark.parametrize("edit_config,drop,message", [
    (None, "layers.1.bv", "layers.1.bv"),
    (None, "layers.0.q_norm", "layers.0.q_norm"),
    ({"qk_norm": False}, None, "tensors, the config needs"),
    ({"o_bias": False}, None, "tensors, the config needs"),
    ({"qkv_bias": "yes"}, None, "config field 'qkv_bias' is not a boolean"),
    ({"architecture": "qwen2_moe"}, None, "architecture \"qwen2_moe\" is not supported"),
    ({"architecture": "qwen3_moe"}, None, "architecture qwen3_moe needs 'experts'"),
    ({"sliding_window_first_layer": 2}, None, "'sliding_window_first_layer' = 2 is outside"),
])
def test_the_loader_refuses_tensors_the_config_does_not_match(tmp_path, edit_config, drop,
                                                              message):
    model = convert(checkpoint(tmp_path, "qwen3-attention-bias"), tmp_path / "model.bin", "f32")
    result = barellm("info", rewritten(tmp_path, model, edit_config, drop))
    assert result.returncode == 1 and result.stdout == ""
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_info_shows_the_architecture(tmp_path):
    model = convert(checkpoint(tmp_path, "qwen2-window"), tmp_path / "model.bin", "f32")
    result = barellm("info", model)
    assert result.returncode == 0, result.stderr
    assert "architecture    qwen2\n" in result.stdout
    assert "attention       q/k/v bias\n" in result.stdout
    assert "sliding_window  5 (layers 1 and up)\n" in result.stdout
    model = convert(checkpoint(tmp_path, "qwen3-attention-bias"), tmp_path / "q3.bin", "f32")
    result = barellm("info", model)
    assert "architecture    qwen3\n" in result.stdout
    assert "attention       q/k/v bias, output bias, q/k norm per head\n" in result.stdout


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_cuda_decode_matches_the_reference(tmp_path, name):
    """The CUDA backend (decode; skipped without a GPU) against the reference, as the CPU
    backend above: f32 weights and KV cache. tests/test_cuda.py holds it against the CPU
    backend at more shapes and dtypes."""
    require_cuda()
    hf = checkpoint(tmp_path, name)
    model = convert(hf, tmp_path / "model.bin", "f32")
    want = reference.logits_for(hf, IDS)
    got = barellm_logits(model, IDS, "--kv", "f32", "--device", "cuda")
    assert relative_error(got, want) < 1e-4
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()


# ---- YaRN --------------------------------------------------------------------------------

GGUF_FROM_HF = os.path.join(REPO, "scripts", "gguf_from_hf.py")

def numbers_close(got, want):
    """The same keys and values, numbers equal to float32 rounding."""
    return got.keys() == want.keys() and all(
        got[key] == want[key] if isinstance(want[key], (str, bool))
        else math.isclose(got[key], want[key], rel_tol=1e-6) for key in want)


def test_yarn_settings_follow_transformers(tmp_path):
    """The file's rope_scaling is YaRN's as transformers completes it: beta_slow 1, truncate
    true and the attention factor 0.1 ln(factor) + 1 where absent; mscale / mscale_all_dim's
    ratio where given."""
    want = {"qwen2-yarn": {"rope_type": "yarn", "factor": 4.0,
                           "original_max_position_embeddings": 256, "beta_fast": 8.0,
                           "beta_slow": 1.0, "truncate": True,
                           "attention_factor": 0.1 * math.log(4.0) + 1},
            "qwen3-yarn": {"rope_type": "yarn", "factor": 3.0,
                           "original_max_position_embeddings": 512, "beta_fast": 4.0,
                           "beta_slow": 1.0, "truncate": False,
                           "attention_factor": (0.1 * math.log(3.0) + 1) /
                                               (0.05 * math.log(3.0) + 1)}}
    for name, scaling in want.items():
        model = convert(checkpoint(tmp_path, name), tmp_path / f"{name}.bin", "f32")
        stored = json.loads(read_raw(model)[1]["__metadata__"]["barellm.config"])
        assert numbers_close(stored["rope_scaling"], scaling)
    config = {**CONFIGS["qwen2-yarn"], "original_max_position_embeddings": 128}
    hf = make_checkpoint(str(tmp_path / "top"), config, qwen_tensors(config))
    stored = json.loads(read_raw(convert(hf, tmp_path / "top.bin", "f32"))[1]["__metadata__"]
                        ["barellm.config"])
    assert stored["rope_scaling"]["original_max_position_embeddings"] == 128  # the config's


@pytest.mark.parametrize("name,edit", [("qwen2-yarn", {"attention_factor": 1.0}),
                                       ("qwen3-yarn", {"truncate": True}),
                                       ("qwen2-yarn", {"factor": 2.0}),
                                       ("qwen2-yarn", {"beta_fast": 32.0})])
def test_each_yarn_setting_moves_the_logits(tmp_path, name, edit):
    """YaRN itself, and each of its settings changed in the converted file, change the
    reference logits far beyond the 1e-4 tolerance (a backend that ignored one would fail
    test_f32_logits_match_the_reference), and barellm follows each change."""
    model = convert(checkpoint(tmp_path, name), tmp_path / "model.bin", "f32")
    full = reference.logits_for(model, IDS)
    stored = json.loads(read_raw(model)[1]["__metadata__"]["barellm.config"])
    unscaled = reference.logits_for(rewritten(tmp_path, model, {"rope_scaling": None}), IDS)
    assert relative_error(unscaled, full) > 0.01
    edited_model = str(rewritten(tmp_path, model, {"rope_scaling": {**stored["rope_scaling"],
                                                                    **edit}}))
    edited = reference.logits_for(edited_model, IDS)
    assert relative_error(edited, full) > 0.01
    for flags in ([], ["--prefill"]):
        got = barellm_logits(edited_model, IDS, "--kv", "f32", *flags)
        assert relative_error(got, edited) < 1e-4


def test_a_yarn_gguf_converts_to_the_checkpoints_file(tmp_path):
    """gguf_from_hf.py writes YaRN as llama.cpp reads it (rope.scaling.type yarn, factor,
    original context, betas); convert.py reads it back to the checkpoint's own file. A YaRN
    that llama.cpp computes otherwise (truncate false) is refused."""
    hf = checkpoint(tmp_path, "qwen2-yarn")
    result = run(GGUF_FROM_HF, hf, "-o", tmp_path / "m.gguf")
    assert result.returncode == 0, result.stderr
    fields = {key: field.contents()
              for key, field in gguf.GGUFReader(str(tmp_path / "m.gguf")).fields.items()}
    assert fields["qwen2.rope.scaling.type"] == "yarn"
    assert fields["qwen2.rope.scaling.original_context_length"] == 256
    from_hf = read_raw(convert(hf, tmp_path / "hf.bin", "f32"))
    result = run(CONVERT, tmp_path / "m.gguf", "-o", tmp_path / "gguf.bin")
    assert result.returncode == 0, result.stderr
    from_gguf = read_raw(tmp_path / "gguf.bin")
    want, got = (json.loads(raw[1]["__metadata__"]["barellm.config"])["rope_scaling"]
                 for raw in (from_hf, from_gguf))
    assert numbers_close(got, want)
    for name, values in from_hf[2].items():
        assert np.array_equal(from_gguf[2][name], values), name
    result = run(GGUF_FROM_HF, checkpoint(tmp_path, "qwen3-yarn"), "-o", tmp_path / "q3.gguf")
    assert result.returncode == 1 and "YaRN with truncate false" in result.stderr


@pytest.mark.parametrize("scaling,message", [
    ({"type": "yarn"}, "rope_scaling 'factor' of type yarn must be a positive number"),
    ({"type": "yarn", "factor": 4.0, "truncate": "yes"}, "'truncate' must be true or false"),
    ({"type": "yarn", "factor": 4.0, "beta_fast": -1}, "rope_scaling 'beta_fast' must be"),
    ({"type": "yarn", "factor": 4.0, "mscale": "1", "mscale_all_dim": 1},
     "rope_scaling 'mscale' must be a positive number"),
])
def test_the_converter_refuses_broken_yarn_settings(tmp_path, scaling, message):
    config = {**CONFIGS["qwen2-yarn"], "rope_scaling": scaling}
    hf = make_checkpoint(str(tmp_path / "hf"), config, qwen_tensors(config))
    result = run(CONVERT, hf, "-o", tmp_path / "model.bin")
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert not os.path.exists(tmp_path / "model.bin")
