"""OpenAI's gpt-oss (Hugging Face model_type gpt_oss): the converter's config (GptOssConfig's
defaults, layer_types, YaRN without truncation, the sinks, the biases, swiglu_oai) and tensor
layouts (transformers' fused experts, x @ W with the gate in the even columns and the up
projection in the odd ones, and OpenAI's MXFP4 blocks, kept bit for bit as ggml's) checked
against the Hugging Face tensors with the layouts written out here; broken checkpoints refused
in one line; and barellm's logits against the numpy reference (reference/model.py, itself
checked against transformers with dev/gpu/transformers_logits.py), decode and prefill, f32, q8,
q4 and MXFP4 experts. Random non-zero biases and sinks; sizes off the SIMD widths."""

import json
import math

import numpy as np
import pytest

import model as reference
from convert_testlib import CONVERT, make_checkpoint, read_raw, rewritten_gguf, run
from test_end_to_end import IDS, barellm_logits, relative_error
from test_convert_kquants import matrix_values
from test_moe import check_experts_quantized_logits
from test_qwen import convert

# 3 layers (sliding, full, sliding: a window of 5 of the 19 ids), head_dim 10 apart from
# hidden_size / heads, 6 experts of width 28, top 2, YaRN over an original context of 256
# without truncation, and a SwiGLU limit low enough that the clamps act.
CONFIG = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 40,
    "intermediate_size": 28, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 10, "num_local_experts": 6,
    "num_experts_per_tok": 2, "vocab_size": 512, "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5, "sliding_window": 5,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "truncate": False, "original_max_position_embeddings": 256},
    "rope_theta": 10000.0, "swiglu_limit": 1.5, "swiglu_alpha": 1.702,
    "attention_bias": True, "tie_word_embeddings": False, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "torch_dtype": "float32",
}
# Whole blocks of 32 (Q4_0, MXFP4): dim 64, expert width 32, head_dim 16.
BLOCK_SHAPE = {"hidden_size": 64, "intermediate_size": 32, "head_dim": 16}
MXFP4_CONFIG = {**CONFIG, **BLOCK_SHAPE,
                "quantization_config": {"quant_method": "mxfp4",
                                        "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                   "model.layers.*.mlp.router",
                                                                   "model.embed_tokens",
                                                                   "lm_head"]}}
LOGIT_GAIN = 4.0
EXPERT_GAIN = 2.0  # the gate and up projections reach past swiglu_limit
# The E2M1 values of a nibble in transformers' MXFP4 (integrations/mxfp4.py), and ggml's
# levels of block_mxfp4 (kvalues_mxfp4: those doubled, the scale 2^(e - 128) halving them).
FP4_VALUES = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
GGML_LEVELS = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]
# MXFP4 scale bytes drawn around 2^0: each weight a level times 2^-4 .. 2^0 (|w| up to 6).
MXFP4_EXPONENTS = (123, 128)


def gpt_oss_tensors(config, seed=0, mxfp4=False):
    """Random F32 tensors (U8 blocks and scales for MXFP4 experts) with transformers' names:
    N(0, 1/in) matrices, norms around 1, every bias and sink N(0, 0.5^2)."""
    rng = np.random.default_rng(seed)
    dim, vocab, width = config["hidden_size"], config["vocab_size"], config["intermediate_size"]
    heads, kv, hd = (config[k] for k in ("num_attention_heads", "num_key_value_heads",
                                         "head_dim"))
    experts = config["num_local_experts"]

    def values(shape, scale=1.0):
        return ("F32", (scale * rng.standard_normal(shape)).astype("<f4"))

    def matrix(rows, cols, gain=1.0):
        return values((rows, cols), gain / math.sqrt(cols))

    tensors = {"model.embed_tokens.weight": matrix(vocab, dim)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        tensors.update({
            p + "input_layernorm.weight": ("F32", (1 + 0.1 * rng.standard_normal(dim))
                                           .astype("<f4")),
            p + "self_attn.q_proj.weight": matrix(heads * hd, dim),
            p + "self_attn.q_proj.bias": values(heads * hd, 0.5),
            p + "self_attn.k_proj.weight": matrix(kv * hd, dim),
            p + "self_attn.k_proj.bias": values(kv * hd, 0.5),
            p + "self_attn.v_proj.weight": matrix(kv * hd, dim),
            p + "self_attn.v_proj.bias": values(kv * hd, 0.5),
            p + "self_attn.o_proj.weight": matrix(dim, heads * hd),
            p + "self_attn.o_proj.bias": values(dim, 0.5),
            p + "self_attn.sinks": values(heads, 1.0),
            p + "post_attention_layernorm.weight": ("F32", (1 + 0.1 * rng.standard_normal(dim))
                                                    .astype("<f4")),
            p + "mlp.router.weight": matrix(experts, dim, 2.0),
            p + "mlp.router.bias": values(experts, 0.5),
            p + "mlp.experts.gate_up_proj_bias": values((experts, 2 * width), 0.5),
            p + "mlp.experts.down_proj_bias": values((experts, dim), 0.5),
        })
        fused = {"gate_up_proj": (2 * width, dim), "down_proj": (dim, width)}
        for name, (rows, cols) in fused.items():
            if mxfp4:
                tensors[p + f"mlp.experts.{name}_blocks"] = (
                    "U8", rng.integers(0, 256, (experts, rows, cols // 32, 16), dtype=np.uint8))
                tensors[p + f"mlp.experts.{name}_scales"] = (
                    "U8", rng.integers(*MXFP4_EXPONENTS, (experts, rows, cols // 32),
                                       dtype=np.uint8, endpoint=True))
            else:  # used as x @ W: [experts, cols (in), rows (out)]
                tensors[p + f"mlp.experts.{name}"] = values(
                    (experts, cols, rows), EXPERT_GAIN / math.sqrt(cols))
    tensors["model.norm.weight"] = ("F32", (1 + 0.1 * rng.standard_normal(dim)).astype("<f4"))
    tensors["lm_head.weight"] = matrix(vocab, dim, LOGIT_GAIN)
    return tensors


def checkpoint(tmp_path, config=CONFIG, tensors=None, name="hf"):
    if tensors is None:
        tensors = gpt_oss_tensors(config, mxfp4="quantization_config" in config)
    return make_checkpoint(str(tmp_path / name), config, tensors)


def stored_config(model):
    return json.loads(read_raw(model)[1]["__metadata__"]["barellm.config"])


def hf_mxfp4_values(blocks, scales):
    """transformers' weights [experts, rows, cols] of MXFP4 blocks: weight 2j of a block in
    the low nibble of byte j, 2j + 1 in the high one, times 2^(scale - 127)."""
    codes = np.stack([blocks & 15, blocks >> 4], axis=-1).reshape(blocks.shape[:-1] + (32,))
    values = np.array(FP4_VALUES)[codes] * 2.0 ** (scales.astype(int)[..., None] - 127)
    return values.reshape(blocks.shape[0], blocks.shape[1], -1)


def ggml_mxfp4_values(rows):
    """The weights [rows, cols] of ggml's block_mxfp4 rows (17 bytes a block: the exponent
    e, then 16 bytes, weight j in the low nibble of byte j and j + 16 in its high one):
    level times 2^(e - 128)."""
    blocks = rows.reshape(len(rows), -1, 17)
    qs = blocks[..., 1:]
    codes = np.concatenate([qs & 15, qs >> 4], axis=-1)
    scale = 2.0 ** (blocks[..., 0].astype(int) - 128)
    return (np.array(GGML_LEVELS)[codes] * scale[..., None]).reshape(len(rows), -1)


# ---- config --------------------------------------------------------------------------

def test_the_config_has_the_gpt_oss_fields(tmp_path):
    model = convert(checkpoint(tmp_path), tmp_path / "m.bin", "f32")
    stored = stored_config(model)
    expected = {"architecture": "gpt_oss", "dim": 40, "hidden_dim": 28, "layers": 3,
                "heads": 4, "kv_heads": 2, "head_dim": 10, "sliding_window": 5,
                "layer_types": ["sliding", "full", "sliding"], "qkv_bias": True,
                "o_bias": True, "attention_sinks": True, "activation": "swiglu_oai",
                "swiglu_limit": 1.5, "experts": 6, "experts_per_token": 2,
                "moe_hidden_dim": 28, "norm_topk_prob": True, "expert_biases": True,
                "tied_embeddings": False, "rope_theta": 10000.0, "eos_ids": [2]}
    assert {key: stored.get(key) for key in expected} == expected
    scaling = stored["rope_scaling"]
    assert (scaling["rope_type"], scaling["factor"], scaling["truncate"],
            scaling["original_max_position_embeddings"]) == ("yarn", 4.0, False, 256)
    assert scaling["attention_factor"] == pytest.approx(0.1 * math.log(4.0) + 1)
    assert "dense_layers" not in stored


def test_omitted_keys_take_gpt_oss_config_defaults(tmp_path):
    """GptOssConfig's defaults: layer_types alternating from a sliding layer 0, a window of
    128, YaRN factor 32 over 4096 positions untruncated, theta 150000, swiglu_limit 7, four
    experts per token, q/k/v/o biases; eos from generation_config.json."""
    config = {key: value for key, value in CONFIG.items()
              if key not in ("layer_types", "sliding_window", "rope_scaling", "rope_theta",
                             "swiglu_limit", "swiglu_alpha", "attention_bias",
                             "num_experts_per_tok", "eos_token_id")}
    hf = checkpoint(tmp_path, config, gpt_oss_tensors(CONFIG))
    with open(f"{hf}/generation_config.json", "w") as f:
        json.dump({"eos_token_id": [2, 3]}, f)
    stored = stored_config(convert(hf, tmp_path / "m.bin", "f32"))
    assert stored["layer_types"] == ["sliding", "full", "sliding"]
    assert stored["sliding_window"] == 128 and stored["rope_theta"] == 150000.0
    assert stored["swiglu_limit"] == 7.0 and stored["experts_per_token"] == 4
    assert stored["qkv_bias"] and stored["o_bias"] and stored["eos_ids"] == [2, 3]
    scaling = stored["rope_scaling"]
    assert (scaling["factor"], scaling["original_max_position_embeddings"],
            scaling["truncate"], scaling["beta_fast"], scaling["beta_slow"]) == (
                32.0, 4096, False, 32.0, 1.0)


def test_rope_parameters_of_newer_transformers_are_read(tmp_path):
    """transformers 5 writes rope_parameters (the theta inside) rather than rope_scaling."""
    config = {key: value for key, value in CONFIG.items()
              if key not in ("rope_scaling", "rope_theta")}
    config["rope_parameters"] = {**CONFIG["rope_scaling"], "rope_theta": 5000.0}
    stored = stored_config(convert(checkpoint(tmp_path, config, gpt_oss_tensors(CONFIG)),
                                   tmp_path / "m.bin", "f32"))
    assert stored["rope_theta"] == 5000.0
    assert stored["rope_scaling"]["original_max_position_embeddings"] == 256


# ---- tensors -------------------------------------------------------------------------

def test_fused_experts_become_barellm_stacked_rows(tmp_path):
    """experts.w1 (w3) holds expert e's gate (up) projection as rows: the transpose of the even
    (odd) columns of gate_up_proj[e]; w2 the transpose of down_proj[e]; b1, b3 the even and
    odd entries of gate_up_proj_bias, b2 down_proj_bias, expert after expert; the sinks, the
    router and its bias and the attention biases as they are, in F32 whatever the dtype."""
    tensors = gpt_oss_tensors(CONFIG)
    header, arrays = read_raw(convert(checkpoint(tmp_path, tensors=tensors),
                                      tmp_path / "m.bin", "f32"))[1:3]
    experts, width, dim = 6, 28, 40
    for layer in range(3):
        p, q = f"model.layers.{layer}.", f"layers.{layer}."
        gate_up = tensors[p + "mlp.experts.gate_up_proj"][1]
        down = tensors[p + "mlp.experts.down_proj"][1]
        bias = tensors[p + "mlp.experts.gate_up_proj_bias"][1]
        assert arrays[q + "experts.w1"].shape == (experts * width, dim)
        assert arrays[q + "experts.w2"].shape == (experts * dim, width)
        for e in range(experts):
            rows, out = slice(e * width, (e + 1) * width), slice(e * dim, (e + 1) * dim)
            for i in range(width):
                assert np.array_equal(arrays[q + "experts.w1"][rows][i], gate_up[e, :, 2 * i])
                assert np.array_equal(arrays[q + "experts.w3"][rows][i],
                                      gate_up[e, :, 2 * i + 1])
                assert arrays[q + "experts.b1"][e * width + i] == bias[e, 2 * i]
                assert arrays[q + "experts.b3"][e * width + i] == bias[e, 2 * i + 1]
            for j in range(dim):
                assert np.array_equal(arrays[q + "experts.w2"][out][j], down[e, :, j])
            assert np.array_equal(arrays[q + "experts.b2"][out],
                                  tensors[p + "mlp.experts.down_proj_bias"][1][e])
        for name, hf in (("sinks", "self_attn.sinks"), ("router", "mlp.router.weight"),
                         ("router_bias", "mlp.router.bias"), ("bq", "self_attn.q_proj.bias"),
                         ("bo", "self_attn.o_proj.bias")):
            assert np.array_equal(arrays[q + name], tensors[p + hf][1]), name
    q8 = read_raw(convert(checkpoint(tmp_path, tensors=tensors), tmp_path / "q8.bin", "q8"))[1]
    for name in ("sinks", "router", "router_bias", "experts.b1", "experts.b3", "experts.b2"):
        assert q8[f"layers.1.{name}"]["dtype"] == "F32", name


def test_mxfp4_experts_are_kept_bit_for_bit(tmp_path):
    """Without --dtype, OpenAI's MXFP4 experts stay MXFP4 (ggml's blocks: the nibbles moved,
    the exponents kept) and the other matrices keep their dtype: the stored blocks decode, by
    ggml's formula, to transformers' weights of the even and odd rows of gate_up_proj and of
    down_proj; the same weights come out of --dtype f32 and, block for block, --dtype
    mxfp4_moe."""
    tensors = gpt_oss_tensors(MXFP4_CONFIG, mxfp4=True)
    hf = checkpoint(tmp_path, MXFP4_CONFIG, tensors)
    model = str(tmp_path / "m.bin")
    result = run(CONVERT, hf, "-o", model)
    assert result.returncode == 0, result.stderr
    header, arrays = read_raw(model)[1:3]
    metadata = header["__metadata__"]
    types = json.loads(metadata["barellm.matrix_types"])
    assert json.loads(metadata["barellm.config"])["weight_dtype"] == "mixed"
    assert types["layers.0.experts.w1"] == types["layers.2.experts.w2"] == "MXFP4"
    assert types["layers.0.wq"] == types["output"] == "F32"
    floats = read_raw(convert(hf, tmp_path / "f32.bin", "f32"))[2]
    mix = read_raw(convert(hf, tmp_path / "mix.bin", "mxfp4_moe"))[2]
    experts, width, dim = 6, 32, 64
    for layer in range(3):
        p, q = f"model.layers.{layer}.mlp.experts.", f"layers.{layer}.experts."
        gate_up = hf_mxfp4_values(tensors[p + "gate_up_proj_blocks"][1],
                                  tensors[p + "gate_up_proj_scales"][1])
        down = hf_mxfp4_values(tensors[p + "down_proj_blocks"][1],
                               tensors[p + "down_proj_scales"][1])
        want = {"w1": gate_up[:, 0::2].reshape(experts * width, dim),
                "w3": gate_up[:, 1::2].reshape(experts * width, dim),
                "w2": down.reshape(experts * dim, width)}
        for short, weights in want.items():
            assert header[q + short]["dtype"] == "U8"
            assert np.array_equal(ggml_mxfp4_values(arrays[q + short]), weights), short
            assert np.array_equal(floats[q + short], weights.astype(np.float32)), short
            assert np.array_equal(mix[q + short], arrays[q + short]), short
        exponents = arrays[q + "w1"].reshape(experts * width, -1, 17)[..., 0]
        assert np.array_equal(exponents, tensors[p + "gate_up_proj_scales"][1][:, 0::2]
                              .reshape(experts * width, -1))


# ---- refusals ------------------------------------------------------------------------

def without(tensors, name):
    return {key: value for key, value in tensors.items() if key != name}


def reshaped(tensors, name, shape):
    dtype, array = tensors[name]
    return {**tensors, name: (dtype, np.resize(array, shape))}


TENSORS = gpt_oss_tensors(CONFIG)
MXFP4_TENSORS = gpt_oss_tensors(MXFP4_CONFIG, mxfp4=True)


@pytest.mark.parametrize("config,tensors,message", [
    (CONFIG, without(TENSORS, "model.layers.1.self_attn.sinks"),
     "missing tensors: model.layers.1.self_attn.sinks"),
    (CONFIG, without(TENSORS, "model.layers.2.mlp.router.bias"),
     "missing tensors: model.layers.2.mlp.router.bias"),
    (CONFIG, without(TENSORS, "model.layers.0.mlp.experts.down_proj_bias"),
     "missing tensors: model.layers.0.mlp.experts.down_proj_bias"),
    (CONFIG, without(TENSORS, "model.layers.0.mlp.experts.gate_up_proj"),
     "missing tensors: model.layers.0.mlp.experts.gate_up_proj"),
    (CONFIG, reshaped(TENSORS, "model.layers.0.mlp.experts.gate_up_proj", (6, 56, 40)),
     "tensor 'model.layers.0.mlp.experts.gate_up_proj' has shape [6, 56, 40], expected "
     "[6, 40, 56]"),
    (CONFIG, reshaped(TENSORS, "model.layers.1.self_attn.sinks", (5,)),
     "tensor 'model.layers.1.self_attn.sinks' has shape [5], expected [4]"),
    (CONFIG, reshaped(TENSORS, "model.layers.0.mlp.experts.gate_up_proj_bias", (6, 28)),
     "tensor 'model.layers.0.mlp.experts.gate_up_proj_bias' has shape [6, 28], expected "
     "[6, 56]"),
    (MXFP4_CONFIG, without(MXFP4_TENSORS, "model.layers.1.mlp.experts.down_proj_scales"),
     "missing tensors: model.layers.1.mlp.experts.down_proj_scales"),
    (MXFP4_CONFIG, reshaped(MXFP4_TENSORS, "model.layers.0.mlp.experts.down_proj_scales",
                            (6, 64, 2)),
     "tensor 'model.layers.0.mlp.experts.down_proj_scales' has shape [6, 64, 2], expected "
     "[6, 64, 1]"),
    ({**CONFIG, "swiglu_alpha": 1.5}, TENSORS, "swiglu_alpha 1.5 is not supported"),
    ({**CONFIG, "quantization_config": {"quant_method": "fp8"}}, TENSORS,
     "quantization_config quant_method 'fp8' is not supported"),
    ({**CONFIG, "layer_types": ["sliding_attention"]}, TENSORS,
     "'layer_types' must list 3 values"),
    ({**CONFIG, "num_experts_per_tok": 7}, TENSORS,
     "num_experts_per_tok 7 is more than the 6 experts"),
])
def test_broken_checkpoints_are_refused_in_one_line(tmp_path, config, tensors, message):
    hf = checkpoint(tmp_path, config, tensors)
    result = run(CONVERT, hf, "-o", tmp_path / "m.bin")
    assert result.returncode == 1
    assert message in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "m.bin").exists()


def test_an_mxfp4_exponent_past_the_float32_range_is_refused(tmp_path):
    tensors = dict(MXFP4_TENSORS)
    name = "model.layers.2.mlp.experts.down_proj_scales"
    scales = tensors[name][1].copy()
    scales[3, 5, 0] = 253
    tensors[name] = ("U8", scales)
    result = run(CONVERT, checkpoint(tmp_path, MXFP4_CONFIG, tensors), "-o", tmp_path / "m.bin")
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert "has scale exponent 253" in result.stderr


# ---- the reference -------------------------------------------------------------------

def test_the_reference_reads_the_converted_file_as_the_checkpoint(tmp_path):
    """reference/model.py reads the Hugging Face tensors its own way; the converted f32 file
    gives it the same logits, MXFP4 experts included (dequantized to f32 by the converter)."""
    hf = checkpoint(tmp_path)
    want = reference.logits_for(hf, IDS)
    assert want.std(axis=1).min() > 2.0
    got = reference.logits_for(convert(hf, tmp_path / "m.bin", "f32"), IDS)
    assert np.abs(got - want).max() < 1e-5 * np.abs(want).max()
    hf = checkpoint(tmp_path, MXFP4_CONFIG, name="mxfp4")
    want = reference.logits_for(hf, IDS)
    got = reference.logits_for(convert(hf, tmp_path / "mxfp4.bin", "f32"), IDS)
    assert np.abs(got - want).max() < 1e-5 * np.abs(want).max()


def zeroed(tensors, suffix):
    return {name: (dtype, np.zeros_like(array) if name.endswith(suffix) else array)
            for name, (dtype, array) in tensors.items()}


@pytest.mark.parametrize("edit", ["sinks", "router.bias", "gate_up_proj_bias",
                                  "down_proj_bias", "q_proj.bias", "o_proj.bias",
                                  "swiglu_limit", "sliding_window", "truncate"])
def test_each_gpt_oss_feature_moves_the_logits(tmp_path, edit):
    """Each of gpt-oss's additions changes the reference logits far beyond the tolerances of
    the tests below, so a backend that ignored one would fail them."""
    config, tensors = dict(CONFIG), TENSORS
    if edit == "swiglu_limit":
        config["swiglu_limit"] = 100.0
    elif edit == "sliding_window":
        config["layer_types"] = ["full_attention"] * 3
    elif edit == "truncate":
        config["rope_scaling"] = {**CONFIG["rope_scaling"], "truncate": True}
    else:
        tensors = zeroed(TENSORS, edit)
    original = reference.logits_for(checkpoint(tmp_path, name="original"), IDS)
    changed = reference.logits_for(checkpoint(tmp_path, config, tensors, "edited"), IDS)
    assert relative_error(changed, original) > (1e-3 if edit == "truncate" else 1e-2)


# ---- barellm against the reference (the CPU forward pass of gpt_oss) ------------------

@pytest.mark.parametrize("mode", ["decode", "prefill"])
@pytest.mark.parametrize("simd", ["default", "avx2", "scalar"])
def test_f32_logits_match_the_reference(tmp_path, mode, simd):
    hf = checkpoint(tmp_path)
    model = convert(hf, tmp_path / "m.bin", "f32")
    want = reference.logits_for(hf, IDS)
    flags = ["--kv", "f32"] + ([] if simd == "default" else ["--simd", simd])
    got = barellm_logits(model, IDS, *flags, *(["--prefill"] if mode == "prefill" else []))
    assert relative_error(got, want) < 1e-4
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()


@pytest.mark.parametrize("dtype", ["q8", "q4"])
def test_quantized_logits_match_the_reference_on_the_dequantized_weights(tmp_path, dtype):
    """The scalar path computes with the file's dequantized weights exactly; the SIMD paths
    quantize the activations to 8 bits too (the tolerance of tests/test_moe.py). Every expert
    is chosen: that rounding would otherwise move some token's choice between two close
    experts (measured with 2 of 6: 8.5e-2 to 1.3e-1; with all 6: 2.8e-2 to 3.4e-2)."""
    config = {**CONFIG, **BLOCK_SHAPE, "num_experts_per_tok": CONFIG["num_local_experts"]}
    model = convert(checkpoint(tmp_path, config, gpt_oss_tensors(config)), tmp_path / "m.bin",
                    dtype)
    check_experts_quantized_logits(model, reference.logits_for(model, IDS))


@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_mxfp4_experts_match_the_reference(tmp_path, mode):
    """The MXFP4 file (experts in ggml's blocks, the rest F32) against the reference fed the
    weights ggml's formula decodes from the stored blocks (which are the checkpoint's)."""
    hf = checkpoint(tmp_path, MXFP4_CONFIG)
    model = str(tmp_path / "m.bin")
    result = run(CONVERT, hf, "-o", model)
    assert result.returncode == 0, result.stderr
    header, stored = read_raw(model)[1:3]
    config, weights = reference.load(model)
    for name, kind in json.loads(header["__metadata__"]["barellm.matrix_types"]).items():
        values = (ggml_mxfp4_values(stored[name]) if kind == "MXFP4"
                  else matrix_values(stored, name, kind))
        weights[name] = values.astype(np.float32)
    want = reference.forward(config, weights, IDS)
    assert relative_error(want, reference.logits_for(hf, IDS)) < 1e-6
    scalar = barellm_logits(model, IDS, "--kv", "f32", "--simd", "scalar",
                            *(["--prefill"] if mode == "prefill" else []))
    assert relative_error(scalar, want) < 1e-4
    got = barellm_logits(model, IDS, "--kv", "f32", *(["--prefill"] if mode == "prefill"
                                                      else []))
    assert relative_error(got, want) < 1e-1
    assert (got.argmax(axis=1) == want.argmax(axis=1)).mean() >= 0.8


# ---- GGUF (llama.cpp's gpt-oss) ------------------------------------------------------

# llama.cpp's gpt-oss: YaRN's ramp rounded outward (truncate) and a SwiGLU limit of 7.
GGUF_CONFIG = {**CONFIG, "swiglu_limit": 7.0,
               "rope_scaling": {**CONFIG["rope_scaling"], "truncate": True}}


def gguf_checkpoint(tmp_path, config=GGUF_CONFIG):
    """(HF directory, its GGUF written by scripts/gguf_from_hf.py)."""
    from test_convert_gguf import gguf_from_hf
    hf = checkpoint(tmp_path, config, gpt_oss_tensors(config, mxfp4="quantization_config"
                                                      in config))
    return hf, gguf_from_hf(hf, tmp_path / "m.gguf", "--type", "f32")


@pytest.mark.parametrize("config", [GGUF_CONFIG, {**MXFP4_CONFIG, "swiglu_limit": 7.0,
                                                   "rope_scaling": GGUF_CONFIG["rope_scaling"]}],
                         ids=["f32", "mxfp4"])
def test_a_gguf_file_converts_to_the_checkpoints_file(tmp_path, config):
    """The checkpoint as llama.cpp's GGUF (gpt-oss: attn_sinks, post_attention_norm, the
    experts stacked in ffn_*_exps with their biases [experts, rows], the router's bias) converts
    back to the checkpoint's own f32 file: config and every tensor."""
    gguf = pytest.importorskip("gguf", reason="pip package gguf missing")
    hf, source = gguf_checkpoint(tmp_path, config)
    reader = gguf.GGUFReader(str(source))
    assert reader.fields["general.architecture"].contents() == "gpt-oss"
    assert reader.fields["gpt-oss.attention.sliding_window"].contents() == 5
    assert reader.fields["gpt-oss.attention.sliding_window_pattern"].contents() == [
        True, False, True]
    shapes = {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors}
    dim, width = config["hidden_size"], config["intermediate_size"]
    assert shapes["blk.0.ffn_gate_exps.weight"] == (dim, width, 6)
    assert shapes["blk.0.ffn_down_exps.weight"] == (width, dim, 6)
    assert shapes["blk.0.ffn_gate_exps.bias"] == (width, 6)
    assert shapes["blk.0.attn_sinks.weight"] == (4,)
    assert shapes["blk.2.post_attention_norm.weight"] == (dim,)
    from_gguf = str(tmp_path / "gguf.bin")
    result = run(CONVERT, source, "-o", from_gguf)
    assert result.returncode == 0, result.stderr
    direct = convert(hf, tmp_path / "hf.bin", "f32")
    header_a, a = read_raw(from_gguf)[1:3]
    header_b, b = read_raw(direct)[1:3]
    config_a, config_b = (json.loads(h["__metadata__"]["barellm.config"])
                          for h in (header_a, header_b))
    for key in ("architecture", "dim", "hidden_dim", "heads", "kv_heads", "head_dim",
                "experts", "experts_per_token", "moe_hidden_dim", "norm_topk_prob",
                "expert_biases", "attention_sinks", "qkv_bias", "o_bias", "activation",
                "swiglu_limit", "sliding_window", "layer_types", "rope_theta", "norm_eps"):
        assert config_a.get(key) == config_b.get(key), key
    for key in ("rope_type", "factor", "original_max_position_embeddings", "beta_fast",
                "beta_slow", "truncate"):
        assert config_a["rope_scaling"][key] == config_b["rope_scaling"][key], key
    assert config_a["rope_scaling"]["attention_factor"] == pytest.approx(
        config_b["rope_scaling"]["attention_factor"])
    assert sorted(a) == sorted(b)
    for tensor in a:
        assert np.array_equal(a[tensor], b[tensor]), tensor


def hostile_cases():
    gguf = pytest.importorskip("gguf")
    u32, f32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32
    return {
        "no sinks": ({"tensors": {"blk.1.attn_sinks.weight": None}},
                     "missing tensors: blk.1.attn_sinks.weight"),
        "no router bias": ({"tensors": {"blk.0.ffn_gate_inp.bias": None}},
                           "missing tensors: blk.0.ffn_gate_inp.bias"),
        "no expert bias": ({"tensors": {"blk.2.ffn_down_exps.bias": None}},
                           "missing tensors: blk.2.ffn_down_exps.bias"),
        "no window": ({"keys": {"gpt-oss.attention.sliding_window": None}},
                      "'gpt-oss.attention.sliding_window' is missing"),
        "no experts": ({"keys": {"gpt-oss.expert_count": None}},
                       "'gpt-oss.expert_count' is missing"),
        "sliding RoPE base": ({"keys": {"gpt-oss.rope.freq_base_swa": (500.0, f32)}},
                              "'gpt-oss.rope.freq_base_swa' is 500"),
        "too many experts used": ({"keys": {"gpt-oss.expert_used_count": (9, u32)}},
                                  "'gpt-oss.expert_used_count' is 9, more than the 6"),
        "short sinks": ({"tensors": {"blk.0.attn_sinks.weight": np.ones(3, np.float32)}},
                        "tensor 'blk.0.attn_sinks.weight' has shape [3], expected [4]"),
        "short expert bias": ({"tensors": {"blk.0.ffn_up_exps.bias":
                                           np.ones((6, 27), np.float32)}},
                              "tensor 'blk.0.ffn_up_exps.bias' has shape [162], expected "
                              "[168]"),
    }


@pytest.mark.parametrize("case", ["no sinks", "no router bias", "no expert bias", "no window",
                                  "no experts", "sliding RoPE base", "too many experts used",
                                  "short sinks", "short expert bias"])
def test_broken_gguf_files_are_refused_in_one_line(tmp_path, case):
    edit, message = hostile_cases()[case]
    _, source = gguf_checkpoint(tmp_path)
    broken = rewritten_gguf(source, tmp_path / "broken.gguf", **edit)
    result = run(CONVERT, broken, "-o", tmp_path / "m.bin")
    assert result.returncode == 1
    assert message in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "m.bin").exists()


@pytest.mark.parametrize("edit,message", [
    ({"swiglu_limit": 5.0}, "swiglu_limit 5: llama.cpp's gpt-oss clamps at 7"),
    ({"rope_scaling": CONFIG["rope_scaling"]}, "YaRN with truncate false"),
])
def test_gguf_from_hf_refuses_what_llama_cpp_computes_otherwise(tmp_path, edit, message):
    from convert_testlib import REPO
    config = {**GGUF_CONFIG, **edit}
    result = run(f"{REPO}/scripts/gguf_from_hf.py", checkpoint(tmp_path, config, TENSORS),
                 "-o", tmp_path / "m.gguf")
    assert result.returncode == 1 and message in result.stderr
    assert result.stderr.count("\n") == 1
