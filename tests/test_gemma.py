"""Gemma 3 checkpoints (the embedding times sqrt(dim), x * (1 + w) norms, post-attention and
post-feed-forward norms before the residual add, GeGLU, per-head q/k norms, sliding and full
layers with their own RoPE bases, query_pre_attn_scalar) and Gemma 2 ones (no q/k norms, every
other layer sliding, the scores and the logits soft-capped): the converter's output run by the
C++ CPU backend, logits at every position against the independent numpy reference
(reference/model.py, which reads the Hugging Face directory itself), decode (one token at a
time) and prefill (one batch), every SIMD level, every weight dtype; the loader's checks of
Gemma's config fields."""

import json
import math

import numpy as np
import pytest

import model as reference
from convert_testlib import make_checkpoint, read_raw, write_safetensors
from test_end_to_end import (IDS, barellm_logits, bf16_tolerance, check_quantized_logits,
                             relative_error)
from test_qwen import barellm, convert

# 24 tokens: longer than the window of 5, so that sliding and full layers see different
# positions.
GEMMA_IDS = [2, 403, 407, 261, 378, 425, 301, 282, 500, 117, 300, 99, 1, 45, 67, 12, 480, 333,
             7, 250, 19, 388, 444, 3]

_GEMMA3 = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
           "vocab_size": 512, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
           "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": None,
           "sliding_window": 5, "hidden_activation": "gelu_pytorch_tanh",
           "final_logit_softcapping": None, "attn_logit_softcapping": None,
           "attention_bias": False, "tie_word_embeddings": True, "bos_token_id": 2,
           "eos_token_id": 1, "torch_dtype": "float32"}
# Sizes off the SIMD width and tiles; head_dim * heads != hidden_size; GQA.
CONFIGS = {
    # sliding_window_pattern 3: layers 2 and 5 full, the other five sliding; scores scaled by
    # 24^-1/2, not head_dim^-1/2.
    "gemma3": {**_GEMMA3, "hidden_size": 36, "intermediate_size": 70, "num_hidden_layers": 7,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 18,
               "sliding_window_pattern": 3, "query_pre_attn_scalar": 24},
    # layer_types given; linear RoPE scaling on the full layers only; three query heads a KV
    # head.
    "gemma3-scaled": {**_GEMMA3, "hidden_size": 40, "intermediate_size": 52,
                      "num_hidden_layers": 4, "num_attention_heads": 6,
                      "num_key_value_heads": 2, "head_dim": 10, "query_pre_attn_scalar": 10,
                      "rope_scaling": {"rope_type": "linear", "factor": 8.0},
                      "layer_types": ["sliding_attention", "full_attention",
                                      "sliding_attention", "full_attention"]},
    # Gemma 2: no q/k norms, layers 0, 2, 4 sliding (its default pattern), one RoPE base; caps
    # low enough to bend most scores (up to about 3 here) and logits (about 10).
    "gemma2": {**{key: value for key, value in _GEMMA3.items() if key != "rope_local_base_freq"},
               "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
               "rope_theta": 10000.0, "hidden_size": 36, "intermediate_size": 70,
               "num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 18, "query_pre_attn_scalar": 20, "attn_logit_softcapping": 1.5,
               "final_logit_softcapping": 6.0},
}
# The logits' spread: large enough that the softmax is far from uniform.
LOGIT_GAIN = 4.0
LAYER_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
               "post_feedforward_layernorm")


def gemma_tensors(config, seed=0, prefix="model."):
    """Random F32 tensors with Hugging Face names under `prefix`: N(0, 1/in) matrices (the
    tied embedding scaled by LOGIT_GAIN), norm weights w ~ N(0, 0.1) (multipliers 1 + w
    around 1), q/k norm weights in [-0.5, 1.5] (multipliers 0.5 .. 2.5)."""
    rng = np.random.default_rng(seed)
    dim, hidden, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv, hd = (config["num_attention_heads"], config["num_key_value_heads"],
                     config["head_dim"])

    def matrix(rows, cols, gain=1.0):
        return ("F32", (gain * rng.standard_normal((rows, cols)) / math.sqrt(cols)).astype("<f4"))

    def norm(size):
        return ("F32", (0.1 * rng.standard_normal(size)).astype("<f4"))

    tensors = {prefix + "embed_tokens.weight": matrix(vocab, dim, LOGIT_GAIN)}
    for layer in range(config["num_hidden_layers"]):
        p = f"{prefix}layers.{layer}."
        tensors.update({p + name + ".weight": norm(dim) for name in LAYER_NORMS})
        tensors.update({
            p + "self_attn.q_proj.weight": matrix(heads * hd, dim),
            p + "self_attn.k_proj.weight": matrix(kv * hd, dim),
            p + "self_attn.v_proj.weight": matrix(kv * hd, dim),
            p + "self_attn.o_proj.weight": matrix(dim, heads * hd),
            p + "mlp.gate_proj.weight": matrix(hidden, dim),
            p + "mlp.up_proj.weight": matrix(hidden, dim),
            p + "mlp.down_proj.weight": matrix(dim, hidden),
        })
        for name in ("q_norm", "k_norm") if config["model_type"] != "gemma2" else ():
            tensors[p + f"self_attn.{name}.weight"] = ("F32",
                                                       rng.uniform(-0.5, 1.5, hd).astype("<f4"))
    tensors[prefix + "norm.weight"] = norm(dim)
    return tensors


def checkpoint(tmp_path, name):
    """The Hugging Face directory of CONFIGS[name] (tiny tokenizer, vocab 512)."""
    config = CONFIGS[name]
    return make_checkpoint(str(tmp_path / f"hf-{name}"), config, gemma_tensors(config))


SIMD_LEVELS = ["default", "avx2", "scalar"]


def simd_flags(level):
    return [] if level == "default" else ["--simd", level]


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("mode", ["decode", "prefill"])
@pytest.mark.parametrize("simd", SIMD_LEVELS)
def test_f32_logits_match_the_reference(tmp_path, name, mode, simd):
    hf = checkpoint(tmp_path, name)
    model = convert(hf, tmp_path / "model.bin", "f32")
    want = reference.logits_for(hf, GEMMA_IDS)
    assert want.std(axis=1).min() > 2.0  # far from uniform
    flags = ["--kv", "f32", *simd_flags(simd)] + (["--prefill"] if mode == "prefill" else [])
    got = barellm_logits(model, GEMMA_IDS, *flags)
    assert relative_error(got, want) < 1e-4
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_f16_and_bf16_match_the_reference_on_the_same_weights(tmp_path, name, dtype, mode):
    """The reference reads the converted file: the same rounded matrices, f32 norms (1 + w).
    The f16 KV cache adds a small error."""
    model = convert(checkpoint(tmp_path, name), tmp_path / "model.bin", dtype)
    want = reference.logits_for(model, GEMMA_IDS)
    got = barellm_logits(model, GEMMA_IDS, "--kv", "f16",
                         *(["--prefill"] if mode == "prefill" else []))
    tolerance = 1e-3
    if dtype == "bf16":
        tolerance = bf16_tolerance(tolerance)
    assert relative_error(got, want) < tolerance
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("dtype", ["q8", "q4"])
def test_quantized_matches_the_reference_on_the_dequantized_weights(tmp_path, name, dtype):
    """As tests/test_end_to_end.py for Llama: the scalar path uses the dequantized weights
    exactly; SIMD decode and prefill also quantize the activations."""
    model = convert(checkpoint(tmp_path, name), tmp_path / "model.bin", dtype)
    check_quantized_logits(model, reference.logits_for(model, IDS))


def test_the_multimodal_layout_is_the_same_model(tmp_path):
    """The text part of a Gemma3ForConditionalGeneration checkpoint (text_config, tensors
    under model.language_model., a vision tensor beside them) gives the text model's logits."""
    text = CONFIGS["gemma3"]
    multimodal = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                  "text_config": {**text, "model_type": "gemma3_text"},
                  "vision_config": {"model_type": "siglip_vision_model"},
                  "tie_word_embeddings": True, "torch_dtype": "float32"}
    tensors = gemma_tensors(text, prefix="model.language_model.")
    tensors["model.vision_tower.vision_model.post_layernorm.weight"] = (
        "F32", np.ones(8, dtype="<f4"))
    hf = make_checkpoint(str(tmp_path / "hf-multimodal"), multimodal, tensors)
    want = reference.logits_for(checkpoint(tmp_path, "gemma3"), GEMMA_IDS)
    assert relative_error(reference.logits_for(hf, GEMMA_IDS), want) < 1e-12
    model = convert(hf, tmp_path / "model.bin", "f32")
    assert relative_error(barellm_logits(model, GEMMA_IDS, "--kv", "f32"), want) < 1e-4


def rewritten(tmp_path, model, edit_config=None, drop=None):
    """A copy of the barellm file `model` with its config edited (a value None removes the
    field) and/or a tensor dropped, in the file's own order."""
    _, header, arrays, _ = read_raw(model)
    metadata = dict(header["__metadata__"])
    config = {**json.loads(metadata["barellm.config"]), **(edit_config or {})}
    metadata["barellm.config"] = json.dumps(
        {key: value for key, value in config.items() if value is not None})
    tensors = {name: (header[name]["dtype"], arrays[name]) for name in arrays if name != drop}
    out = tmp_path / "edited.bin"
    write_safetensors(out, tensors, metadata)
    return str(out)


@pytest.mark.parametrize("name,edit", [
    ("gemma3", {"activation": "silu"}),
    ("gemma3", {"embedding_scale": None}),
    ("gemma3", {"attention_scale": None}),
    ("gemma3", {"rope_theta_local": None}),
    ("gemma3", {"layer_types": ["full"] * 7}),
    ("gemma3", {"layer_types": ["sliding"] * 7}),
    ("gemma3", {"sliding_window": 9}),
    ("gemma3-scaled", {"rope_scaling": None}),
    ("gemma3-scaled", {"rope_theta_local": None}),
    ("gemma2", {"attn_logit_softcap": None}),
    ("gemma2", {"final_logit_softcap": None}),
    ("gemma2", {"attn_logit_softcap": 3.0}),
    ("gemma2", {"layer_types": ["full"] * 5}),
])
def test_each_gemma_field_moves_the_logits(tmp_path, name, edit):
    """Each of Gemma's config fields, changed in the converted file, changes the reference
    logits far beyond the 1e-4 tolerance (a backend that ignored the field would fail the
    tests above), and barellm follows the change."""
    model = convert(checkpoint(tmp_path, name), tmp_path / "model.bin", "f32")
    full = reference.logits_for(model, GEMMA_IDS)
    edited_model = rewritten(tmp_path, model, edit)
    edited = reference.logits_for(edited_model, GEMMA_IDS)
    assert relative_error(edited, full) > 0.01  # 100 times the tolerance
    for flags in ([], ["--prefill"]):
        got = barellm_logits(edited_model, GEMMA_IDS, "--kv", "f32", *flags)
        assert relative_error(got, edited) < 1e-4


def test_the_post_norms_and_the_plus_one_move_the_reference(tmp_path):
    """The reference's own Gemma steps each matter: without the post norms, or with the
    Hugging Face norm weights taken as plain multipliers, the logits differ."""
    config, weights = reference.load(checkpoint(tmp_path, "gemma3"))
    want = reference.forward(config, weights, GEMMA_IDS)
    no_post = {name: value for name, value in weights.items() if "post_" not in name}
    assert relative_error(reference.forward(config, no_post, GEMMA_IDS), want) > 0.05
    plain = {**config, "norms_add_one": False}
    assert relative_error(reference.forward(plain, weights, GEMMA_IDS), want) > 0.05


@pytest.mark.parametrize("edit_config,drop,message", [
    (None, "layers.3.post_ffn_norm", "layers.3.post_ffn_norm"),
    ({"post_norms": False}, None, "tensors, the config needs"),
    ({"activation": "gelu"}, None, "config field 'activation' \"gelu\" is not"),
    ({"layer_types": ["full"] * 6}, None, "config field 'layer_types' is not a list of 7"),
    ({"layer_types": ["full"] * 6 + ["local"]}, None, "'layer_types' holds \"local\""),
    ({"sliding_window": None}, None, "has sliding layers but no sliding_window"),
    ({"sliding_window_first_layer": 1}, None, "exclude each other"),
    ({"attention_scale": 0}, None, "'attention_scale' = 0 is not a positive number"),
    ({"embedding_scale": -6.0}, None, "'embedding_scale' = -6.0 is not a positive number"),
    ({"rope_theta_local": "10000"}, None, "'rope_theta_local' is missing or not a number"),
    ({"post_norms": 1}, None, "config field 'post_norms' is not a boolean"),
])
def test_the_loader_refuses_bad_gemma_fields(tmp_path, edit_config, drop, message):
    model = convert(checkpoint(tmp_path, "gemma3"), tmp_path / "model.bin", "f32")
    result = barellm("info", rewritten(tmp_path, model, edit_config, drop))
    assert result.returncode == 1 and result.stdout == ""
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_the_reference_soft_caps_where_the_config_says(tmp_path):
    """The reference's soft-capping: the logits stay within the cap; a soft-capping key set
    to null turns it off rather than taking Gemma2Config's default; Gemma 3 with a
    final_logit_softcapping caps its logits too."""
    config, weights = reference.load(checkpoint(tmp_path, "gemma2"))
    capped = reference.forward(config, weights, GEMMA_IDS)
    assert config["final_logit_softcap"] == 6.0 and np.abs(capped).max() < 6.0
    assert np.abs(capped).max() > 5.0  # the cap bends the largest logits
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        edited = {**CONFIGS["gemma2"], key: None}
        hf = make_checkpoint(str(tmp_path / f"hf-{key}"), edited, gemma_tensors(edited))
        assert relative_error(reference.logits_for(hf, GEMMA_IDS), capped) > 0.01
    gemma3 = {**CONFIGS["gemma3"], "final_logit_softcapping": 2.0}
    hf = make_checkpoint(str(tmp_path / "hf-gemma3"), gemma3, gemma_tensors(gemma3))
    assert np.abs(reference.logits_for(hf, GEMMA_IDS)).max() < 2.0


def test_gemma3_with_a_final_logit_cap_matches_the_reference(tmp_path):
    """transformers' Gemma 3 soft-caps its logits where the config says: so does barellm."""
    gemma3 = {**CONFIGS["gemma3"], "final_logit_softcapping": 2.0}
    hf = make_checkpoint(str(tmp_path / "hf-gemma3"), gemma3, gemma_tensors(gemma3))
    model = convert(hf, tmp_path / "model.bin", "f32")
    want = reference.logits_for(hf, GEMMA_IDS)
    assert relative_error(barellm_logits(model, GEMMA_IDS, "--kv", "f32"), want) < 1e-4


def test_info_shows_gemma2s_soft_capping(tmp_path):
    result = barellm("info", convert(checkpoint(tmp_path, "gemma2"), tmp_path / "model.bin",
                                     "f32"))
    assert result.returncode == 0, result.stderr
    for line in ("architecture    gemma2", "sliding_window  5 (layers 0 2 4)",
                 "attention_scale 0.223607", "softcap         attention scores 1.5",
                 "softcap         logits 6"):
        assert line + "\n" in result.stdout
    assert "rope_theta_local" not in result.stdout


def test_info_shows_gemmas_fields(tmp_path):
    model = convert(checkpoint(tmp_path, "gemma3"), tmp_path / "model.bin", "f32")
    result = barellm("info", model)
    assert result.returncode == 0, result.stderr
    for line in ("architecture    gemma3", "attention       q/k norm per head",
                 "rope_theta_local 10000 (sliding layers)",
                 "sliding_window  5 (layers 0 1 3 4 6)", "attention_scale 0.204124",
                 "embedding_scale 6", "post_norms      attention and feed-forward outputs",
                 "activation      gelu_tanh (GeGLU)"):
        assert line + "\n" in result.stdout
