"""convert/convert.py on Gemma 3 and Gemma 2: Hugging Face checkpoints (gemma3_text, the text
part of a multimodal gemma3 in both of transformers' layouts, gemma2) and GGUF files written
here with the `gguf` package under llama.cpp's names and rules, and by scripts/gguf_from_hf.py.
The barellm file's config holds Gemma's fields (docs/FORMAT.md) and its norms the multipliers
1 + w; refusals are one line."""

import json
import math
import os
import sys

import numpy as np
import pytest

from convert_testlib import (CONVERT, REPO, make_checkpoint, read_raw, run,
                             tiny_tokenizer_json, write_safetensors)

sys.path.insert(0, os.path.dirname(CONVERT))
import convert  # noqa: E402  (convert/convert.py)
import mixes  # noqa: E402

gguf = pytest.importorskip("gguf", reason="pip package gguf missing")

# A tiny Gemma 3: head_dim 8 is not hidden_size / heads (24 / 4), 7 layers so that the
# default pattern (6) has sliding layers on both sides of a global one.
GEMMA3_CONFIG = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 24,
    "intermediate_size": 40, "num_hidden_layers": 7, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 40, "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
    "rope_scaling": None, "sliding_window": 4, "sliding_window_pattern": 6,
    "query_pre_attn_scalar": 8, "hidden_activation": "gelu_pytorch_tanh",
    "final_logit_softcapping": None, "attn_logit_softcapping": None,
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
    "torch_dtype": "float32",
}
# Hugging Face name within a layer -> barellm name: post_attention_layernorm is applied to
# the attention's output, pre_feedforward_layernorm is the feed-forward input's norm.
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm", "self_attn.q_proj.weight": "wq",
    "self_attn.k_proj.weight": "wk", "self_attn.v_proj.weight": "wv",
    "self_attn.o_proj.weight": "wo", "self_attn.q_norm.weight": "q_norm",
    "self_attn.k_norm.weight": "k_norm", "post_attention_layernorm.weight": "post_attn_norm",
    "pre_feedforward_layernorm.weight": "ffn_norm",
    "post_feedforward_layernorm.weight": "post_ffn_norm", "mlp.gate_proj.weight": "w1",
    "mlp.up_proj.weight": "w3", "mlp.down_proj.weight": "w2",
}


def gemma3_tensors(config, seed=0, prefix="model."):
    """{Hugging Face name: ("F32", array)} of random weights; norm weights w ~ N(0, 0.1)
    (the multiplier is 1 + w)."""
    rng = np.random.default_rng(seed)
    dim, hidden, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv, hd = (config["num_attention_heads"], config["num_key_value_heads"],
                     config["head_dim"])
    shapes = {"input_layernorm.weight": (dim,), "self_attn.q_proj.weight": (heads * hd, dim),
              "self_attn.k_proj.weight": (kv * hd, dim), "self_attn.v_proj.weight": (kv * hd, dim),
              "self_attn.o_proj.weight": (dim, heads * hd), "self_attn.q_norm.weight": (hd,),
              "self_attn.k_norm.weight": (hd,), "post_attention_layernorm.weight": (dim,),
              "pre_feedforward_layernorm.weight": (dim,),
              "post_feedforward_layernorm.weight": (dim,),
              "mlp.gate_proj.weight": (hidden, dim), "mlp.up_proj.weight": (hidden, dim),
              "mlp.down_proj.weight": (dim, hidden)}

    def random(shape):
        scale = 0.1 if len(shape) == 1 else 1 / math.sqrt(shape[-1])
        return ("F32", (scale * rng.standard_normal(shape)).astype("<f4"))

    tensors = {f"{prefix}embed_tokens.weight": random((vocab, dim))}
    for layer in range(config["num_hidden_layers"]):
        for name, shape in shapes.items():
            tensors[f"{prefix}layers.{layer}.{name}"] = random(shape)
    tensors[f"{prefix}norm.weight"] = random((dim,))
    return tensors


def barellm_name(hf_name):
    """The barellm name of a Hugging Face tensor name (text layout)."""
    if hf_name == "model.embed_tokens.weight":
        return "token_embedding"
    if hf_name == "model.norm.weight":
        return "final_norm"
    _, _, layer, rest = hf_name.split(".", 3)
    return f"layers.{layer}.{LAYER_NAMES[rest]}"


def converted(source, out, *options):
    result = run(CONVERT, source, "-o", out, *options)
    assert result.returncode == 0, result.stderr
    _, header, arrays, _ = read_raw(out)
    return json.loads(header["__metadata__"]["barellm.config"]), arrays, result


def refused(tmp_path, source, message):
    """The conversion of `source` fails with the one line `convert: {message}...`."""
    out = tmp_path / "refused.barellm"
    result = run(CONVERT, source, "-o", out)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(f"convert: {message}"), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert not out.exists()


def f32(value):
    return float(np.float32(value))


def test_hf_config_and_norms_plus_one(tmp_path):
    tensors = gemma3_tensors(GEMMA3_CONFIG)
    hf = make_checkpoint(tmp_path / "hf", GEMMA3_CONFIG, tensors)
    config, arrays, _ = converted(hf, tmp_path / "out.barellm")
    assert config["architecture"] == "gemma3"
    shape = (config["dim"], config["heads"], config["kv_heads"], config["head_dim"])
    assert shape == (24, 4, 2, 8)
    assert config["activation"] == "gelu_tanh"
    assert config["embedding_scale"] == f32(math.sqrt(24))
    assert config["post_norms"] is True and config["qk_norm"] is True
    assert config["tied_embeddings"] is True and "output" not in arrays
    # (l + 1) % 6 == 0 is global: layer 5 of 0..6.
    assert config["layer_types"] == ["sliding"] * 5 + ["full", "sliding"]
    assert config["sliding_window"] == 4
    assert (config["rope_theta"], config["rope_theta_local"]) == (1e6, 1e4)
    assert config["rope_scaling"] is None
    assert config["attention_scale"] == f32(8 ** -0.5)
    assert "sliding_window_first_layer" not in config and "qkv_bias" not in config
    assert sorted(arrays) == sorted(barellm_name(name) for name in tensors)
    for name, (_, values) in tensors.items():
        stored = arrays[barellm_name(name)]
        if values.ndim == 1:  # every vector is a norm: stored as 1 + w in F32
            assert stored.dtype == np.float32
            assert np.array_equal(stored, np.float32(1) + values), name
        else:
            assert np.array_equal(stored, values), name


def test_bf16_norms_become_f32_one_plus_w(tmp_path):
    tensors = gemma3_tensors(GEMMA3_CONFIG, seed=3)
    name = "model.layers.2.post_feedforward_layernorm.weight"
    bits = (tensors[name][1].view("<u4") >> 16).astype("<u2")  # truncated to bf16
    tensors[name] = ("BF16", bits)
    hf = make_checkpoint(tmp_path / "hf", GEMMA3_CONFIG, tensors)
    _, arrays, _ = converted(hf, tmp_path / "out.barellm")
    w = (bits.astype("<u4") << 16).view("<f4")
    assert np.array_equal(arrays["layers.2.post_ffn_norm"], np.float32(1) + w)


def test_layer_types_rope_scaling_and_rope_parameters(tmp_path):
    types = ["full_attention", "sliding_attention", "sliding_attention", "full_attention",
             "sliding_attention", "sliding_attention", "sliding_attention"]
    cfg = {**GEMMA3_CONFIG, "layer_types": types, "sliding_window_pattern": 2,
           "rope_scaling": {"rope_type": "linear", "factor": 8.0},
           "rope_local_base_freq": 20000.0, "query_pre_attn_scalar": 168}
    hf = make_checkpoint(tmp_path / "hf", cfg, gemma3_tensors(cfg))
    config, _, _ = converted(hf, tmp_path / "a.barellm")
    assert config["layer_types"] == [kind.split("_")[0] for kind in types]
    assert config["rope_scaling"] == {"rope_type": "linear", "factor": 8.0}
    assert config["rope_theta_local"] == 20000.0
    assert config["attention_scale"] == f32(168 ** -0.5)
    # transformers 5 keeps both RoPEs in rope_parameters.
    newer = {key: value for key, value in cfg.items()
             if key not in ("rope_theta", "rope_scaling", "rope_local_base_freq")}
    newer["rope_parameters"] = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}}
    hf2 = make_checkpoint(tmp_path / "hf2", newer, gemma3_tensors(cfg))
    config2, _, _ = converted(hf2, tmp_path / "b.barellm")
    assert config2 == config
    # Pattern 1: every layer global, no window.
    every = {**GEMMA3_CONFIG, "sliding_window_pattern": 1}
    hf3 = make_checkpoint(tmp_path / "hf3", every, gemma3_tensors(every))
    config3, _, _ = converted(hf3, tmp_path / "c.barellm")
    assert config3["layer_types"] == ["full"] * 7 and config3["sliding_window"] is None


def multimodal_checkpoint(path, layout_prefix, lm_head=None):
    """A multimodal gemma3 directory whose text_config gives only what the 4B's does (the
    rest: transformers' defaults), with a vision tower and projector."""
    text = {"model_type": "gemma3_text", "hidden_size": 24, "intermediate_size": 40,
            "num_hidden_layers": 7, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "vocab_size": 40, "sliding_window": 4,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
           "text_config": text, "vision_config": {"model_type": "siglip_vision_model"},
           "eos_token_id": [1, 2], "torch_dtype": "float32", "image_token_index": 39}
    tensors = gemma3_tensors({**GEMMA3_CONFIG, **text}, prefix=layout_prefix)
    rng = np.random.default_rng(5)
    vision = layout_prefix.replace("language_model.model.", "").replace("language_model.", "")
    for name in ("vision_tower.vision_model.embeddings.patch_embedding.weight",
                 "vision_tower.vision_model.post_layernorm.weight",
                 "multi_modal_projector.mm_input_projection_weight"):
        tensors[vision + name] = ("F32", rng.standard_normal((3, 5)).astype("<f4"))
    if lm_head:
        tensors[lm_head] = tensors[layout_prefix + "embed_tokens.weight"]
    return make_checkpoint(path, cfg, tensors), tensors


@pytest.mark.parametrize("prefix, lm_head", [("language_model.model.", None),
                                             ("model.language_model.", "lm_head.weight")])
def test_multimodal_text_part(tmp_path, prefix, lm_head):
    hf, tensors = multimodal_checkpoint(tmp_path / "hf", prefix, lm_head)
    config, arrays, result = converted(hf, tmp_path / "out.barellm")
    notes = [line for line in result.stderr.splitlines() if "not converted" in line]
    assert notes == ["convert: note: 3 tensors of the multi_modal_projector and vision_tower "
                     "are not converted (barellm runs the language model only, on text)"]
    # Gemma3TextConfig's defaults fill what text_config omits.
    assert config["max_context"] == 131072 and config["norm_eps"] == 1e-6
    assert config["attention_scale"] == f32(256 ** -0.5)
    assert (config["rope_theta"], config["rope_theta_local"]) == (1e6, 1e4)
    assert config["layer_types"] == ["sliding"] * 5 + ["full", "sliding"]
    assert config["eos_ids"] == [1, 2] and config["tied_embeddings"] is True
    for name, (_, values) in tensors.items():
        if name.startswith(prefix):
            text_name = "model." + name[len(prefix):]
            expected = np.float32(1) + values if values.ndim == 1 else values
            assert np.array_equal(arrays[barellm_name(text_name)], expected), name
    assert len(arrays) == sum(name.startswith(prefix) for name in tensors)


# ------------------------------------------------------------------------------------ GGUF

def write_gemma3_gguf(path, config, tensors, keys=(), arch="gemma3", window_and_caps=True):
    """A gemma3 (or gemma2) GGUF file as llama.cpp's converter writes one from the
    checkpoint (config, tensors): names by the gguf package's map, norms stored as 1 + w, the
    keys it writes (sliding_window only when some layer slides; gemma2: its soft-caps; neither
    without window_and_caps), then `keys` ((method, value) of GGUFWriter's add_* methods)."""
    layers = config["num_hidden_layers"]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(layers)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_rope_freq_base(config["rope_theta"])
    if config.get("sliding_window_pattern") != 1 and window_and_caps:
        writer.add_sliding_window(config["sliding_window"])
    if arch == "gemma2" and window_and_caps:
        writer.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
    for method, value in keys:
        getattr(writer, method)(value)
    tok = tiny_tokenizer_json()["model"]["vocab"]
    tokens = sorted(tok, key=tok.get)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] *
                           (len(tokens) - 3))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], layers)
    for name, (_, values) in tensors.items():
        gguf_name = names.get_name(name, try_suffixes=(".weight",))
        assert gguf_name is not None, name
        data = np.float32(1) + values if name.endswith("norm.weight") else values
        writer.add_tensor(gguf_name, np.ascontiguousarray(data, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


GEMMA3_FIELDS = ("architecture", "dim", "hidden_dim", "layers", "heads", "kv_heads",
                 "head_dim", "vocab_size", "max_context", "rope_theta", "rope_scaling",
                 "norm_eps", "sliding_window", "qk_norm", "activation", "embedding_scale",
                 "post_norms", "layer_types", "rope_theta_local", "attention_scale",
                 "tied_embeddings")


def test_gguf_gives_the_checkpoints_file(tmp_path):
    tensors = gemma3_tensors(GEMMA3_CONFIG, seed=1)
    hf = make_checkpoint(tmp_path / "hf", GEMMA3_CONFIG, tensors)
    from_hf, hf_arrays, _ = converted(hf, tmp_path / "hf.barellm")
    source = write_gemma3_gguf(tmp_path / "m.gguf", GEMMA3_CONFIG, tensors)
    from_gguf, arrays, _ = converted(source, tmp_path / "gguf.barellm")
    for field in GEMMA3_FIELDS:
        assert from_gguf.get(field) == from_hf.get(field), field
    assert sorted(arrays) == sorted(hf_arrays)
    for name, values in hf_arrays.items():  # q and k rows are not reordered (NEOX RoPE)
        assert np.array_equal(arrays[name], values), name


def test_gguf_keys_of_the_pattern_local_rope_and_scaling(tmp_path):
    cfg = {**GEMMA3_CONFIG, "sliding_window_pattern": 3}
    tensors = gemma3_tensors(cfg, seed=2)
    keys = [("add_sliding_window_pattern", 3), ("add_rope_freq_base_swa", 20000.0),
            ("add_rope_scaling_type", gguf.RopeScalingType.LINEAR),
            ("add_rope_scaling_factor", 8.0)]
    config, _, _ = converted(write_gemma3_gguf(tmp_path / "a.gguf", cfg, tensors, keys),
                             tmp_path / "a.barellm")
    # llama.cpp: layer l slides unless l % 3 == 2.
    assert config["layer_types"] == ["sliding", "sliding", "full"] * 2 + ["sliding"]
    assert config["rope_theta_local"] == 20000.0
    assert config["rope_scaling"] == {"rope_type": "linear", "factor": 8.0}
    flags = [True, False, True, True, False, False, True]
    config, _, _ = converted(
        write_gemma3_gguf(tmp_path / "b.gguf", cfg, tensors,
                          [("add_sliding_window_pattern", flags)]), tmp_path / "b.barellm")
    assert config["layer_types"] == ["sliding" if flag else "full" for flag in flags]
    no_window = {**cfg, "sliding_window_pattern": 1}
    config, _, _ = converted(write_gemma3_gguf(tmp_path / "c.gguf", no_window, tensors),
                             tmp_path / "c.barellm")
    assert config["layer_types"] == ["full"] * 7 and config["sliding_window"] is None


def test_gguf_27b_queries_scaled_by_dim_over_heads(tmp_path):
    """llama.cpp scales the 27B model's queries (62 layers) by (dim / heads)^-1/2 (its
    query_pre_attn_scalar 168 = 5376 / 32), the others' by head_dim^-1/2."""
    cfg = {**GEMMA3_CONFIG, "hidden_size": 12, "intermediate_size": 8,
           "num_hidden_layers": 62, "num_attention_heads": 2, "num_key_value_heads": 1,
           "head_dim": 4}
    config, _, _ = converted(write_gemma3_gguf(tmp_path / "m.gguf", cfg, gemma3_tensors(cfg)),
                             tmp_path / "m.barellm")
    assert config["attention_scale"] == float(np.float32(1) / np.sqrt(np.float32(6)))
    assert config["layer_types"][:6] == ["sliding"] * 5 + ["full"]


def test_gguf_final_logit_softcapping_of_gemma3_is_read(tmp_path):
    """llama.cpp's gemma3 soft-caps the logits where the key says (not the scores)."""
    source = write_gemma3_gguf(tmp_path / "m.gguf", GEMMA3_CONFIG, gemma3_tensors(GEMMA3_CONFIG),
                               [("add_final_logit_softcapping", 30.0)])
    config, _, _ = converted(source, tmp_path / "m.barellm")
    assert config["final_logit_softcap"] == 30.0 and "attn_logit_softcap" not in config


@pytest.mark.parametrize("keys, message", [
    ([("add_attn_logit_softcapping", 50.0)], "GGUF key 'gemma3.attn_logit_softcapping' "
     "is 50: gemma3 with soft-capped attention scores is not supported (gemma2 is)"),
    ([("add_sliding_window_pattern", [True, False])], "GGUF key "
     "'gemma3.attention.sliding_window_pattern' has 2 entries for 7 layers"),
])
def test_gguf_refusals(tmp_path, keys, message):
    source = write_gemma3_gguf(tmp_path / "m.gguf", GEMMA3_CONFIG,
                               gemma3_tensors(GEMMA3_CONFIG), keys)
    refused(tmp_path, source, message)


GGUF_FROM_HF = os.path.join(REPO, "scripts", "gguf_from_hf.py")


def test_gguf_from_hf_writes_llama_cpps_gemma3(tmp_path):
    """scripts/gguf_from_hf.py writes a Gemma 3 checkpoint as llama.cpp's gemma3 (the norms
    as 1 + w in F32, the window, one sliding flag per layer, the local RoPE base, linear
    scaling); converted back, it is the checkpoint's own file: config and tensors."""
    cfg = {**GEMMA3_CONFIG, "sliding_window_pattern": 3, "rope_local_base_freq": 20000.0,
           "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    tensors = gemma3_tensors(cfg, seed=3)
    hf = make_checkpoint(tmp_path / "hf", cfg, tensors)
    result = run(GGUF_FROM_HF, hf, "-o", tmp_path / "m.gguf")
    assert result.returncode == 0, result.stderr
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    assert fields["general.architecture"] == "gemma3"
    assert fields["gemma3.attention.sliding_window"] == 4
    assert fields["gemma3.attention.sliding_window_pattern"] == [True, True, False] * 2 + [True]
    assert fields["gemma3.rope.freq_base_swa"] == 20000.0
    assert fields["gemma3.rope.scaling.factor"] == 8.0
    stored = {t.name: np.asarray(t.data) for t in reader.tensors}
    norm = tensors["model.layers.0.post_attention_layernorm.weight"][1]
    assert np.array_equal(stored["blk.0.post_attention_norm.weight"], np.float32(1) + norm)
    from_hf, hf_arrays, _ = converted(hf, tmp_path / "hf.barellm", "--dtype", "f32")
    from_gguf, arrays, _ = converted(tmp_path / "m.gguf", tmp_path / "gguf.barellm")
    for field in GEMMA3_FIELDS:
        assert from_gguf.get(field) == from_hf.get(field), field
    assert sorted(arrays) == sorted(hf_arrays)
    for name, values in hf_arrays.items():
        assert np.array_equal(arrays[name], values), name


def test_gguf_from_hf_refuses_a_query_scale_llama_cpp_does_not_take(tmp_path):
    """llama.cpp scales Gemma 3's queries by head_dim^-1/2 (but with 62 layers): another
    query_pre_attn_scalar cannot be written, in one line, and nothing is left behind."""
    cfg = {**GEMMA3_CONFIG, "query_pre_attn_scalar": 24}
    hf = make_checkpoint(tmp_path / "hf", cfg, gemma3_tensors(cfg))
    result = run(GGUF_FROM_HF, hf, "-o", tmp_path / "m.gguf")
    assert result.returncode == 1
    assert result.stderr == ("gguf_from_hf: query_pre_attn_scalar gives the scale 0.204124; "
                             "llama.cpp's gemma3 takes 0.353553 (1/sqrt(8)) for 7 layers: "
                             "cannot write this checkpoint as GGUF\n")
    assert sorted(os.listdir(tmp_path)) == ["hf"]


def test_gguf_without_post_norms_is_refused(tmp_path):
    tensors = gemma3_tensors(GEMMA3_CONFIG)
    del tensors["model.layers.0.post_feedforward_layernorm.weight"]
    refused(tmp_path, write_gemma3_gguf(tmp_path / "m.gguf", GEMMA3_CONFIG, tensors),
            "missing tensors: blk.0.post_ffw_norm.weight")


# -------------------------------------------------------------------------------- Gemma 2

# A tiny Gemma 2: as GEMMA3_CONFIG without q/k norms and the local RoPE base, 5 layers (0, 2
# and 4 slide), its two soft-caps.
GEMMA2_CONFIG = {
    **{key: value for key, value in GEMMA3_CONFIG.items()
       if key not in ("rope_local_base_freq", "sliding_window_pattern")},
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "num_hidden_layers": 5,
    "rope_theta": 10000.0, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
}
GEMMA2_FIELDS = tuple(field for field in GEMMA3_FIELDS if field != "rope_theta_local") + (
    "attn_logit_softcap", "final_logit_softcap", "qk_norm")


def gemma2_tensors(config, seed=0):
    return {name: value for name, value in gemma3_tensors(config, seed).items()
            if "_norm." not in name or "layernorm" in name or name == "model.norm.weight"}


def test_gemma2_hf_config_and_tensors(tmp_path):
    tensors = gemma2_tensors(GEMMA2_CONFIG)
    assert not any("q_norm" in name for name in tensors)
    hf = make_checkpoint(tmp_path / "hf", GEMMA2_CONFIG, tensors)
    config, arrays, _ = converted(hf, tmp_path / "out.barellm")
    assert config["architecture"] == "gemma2"
    assert config["layer_types"] == ["sliding", "full"] * 2 + ["sliding"]
    assert config["sliding_window"] == 4 and config["rope_theta"] == 1e4
    assert (config["attn_logit_softcap"], config["final_logit_softcap"]) == (50.0, 30.0)
    assert config["attention_scale"] == f32(8 ** -0.5)
    assert config["post_norms"] is True and config["activation"] == "gelu_tanh"
    assert "qk_norm" not in config and "rope_theta_local" not in config
    assert sorted(arrays) == sorted(barellm_name(name) for name in tensors)
    for name, (_, values) in tensors.items():
        want = np.float32(1) + values if values.ndim == 1 else values
        assert np.array_equal(arrays[barellm_name(name)], want), name
    # transformers' defaults where config.json leaves them out; a null cap turns it off.
    cfg = {key: value for key, value in GEMMA2_CONFIG.items()
           if key not in ("attn_logit_softcapping", "sliding_window")}
    hf = make_checkpoint(tmp_path / "defaults", {**cfg, "final_logit_softcapping": None},
                         tensors)
    config, _, _ = converted(hf, tmp_path / "defaults.barellm")
    assert config["attn_logit_softcap"] == 50.0 and "final_logit_softcap" not in config
    assert config["sliding_window"] == 4096


def test_gemma2_gguf_gives_the_checkpoints_file(tmp_path):
    tensors = gemma2_tensors(GEMMA2_CONFIG, seed=1)
    hf = make_checkpoint(tmp_path / "hf", GEMMA2_CONFIG, tensors)
    from_hf, hf_arrays, _ = converted(hf, tmp_path / "hf.barellm")
    source = write_gemma3_gguf(tmp_path / "m.gguf", GEMMA2_CONFIG, tensors, arch="gemma2")
    from_gguf, arrays, _ = converted(source, tmp_path / "gguf.barellm")
    for field in GEMMA2_FIELDS:
        assert from_gguf.get(field) == from_hf.get(field), field
    assert sorted(arrays) == sorted(hf_arrays)
    for name, values in hf_arrays.items():
        assert np.array_equal(arrays[name], values), name


def test_gemma2_gguf_takes_llama_cpps_defaults(tmp_path):
    """Without the keys, llama.cpp's gemma2 slides every other layer over 4096 positions and
    caps the scores at 50 and the logits at 30; its 27B model (46 layers) scales queries by
    (dim / heads)^-1/2, the others by head_dim^-1/2."""
    cfg = {**GEMMA2_CONFIG, "hidden_size": 12, "intermediate_size": 8, "num_hidden_layers": 46,
           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4}
    source = write_gemma3_gguf(tmp_path / "m.gguf", cfg, gemma2_tensors(cfg), arch="gemma2",
                               window_and_caps=False)
    config, _, _ = converted(source, tmp_path / "m.barellm")
    assert config["attention_scale"] == float(np.float32(1) / np.sqrt(np.float32(6)))
    assert config["layer_types"] == ["sliding", "full"] * 23
    assert config["sliding_window"] == 4096
    assert (config["attn_logit_softcap"], config["final_logit_softcap"]) == (50.0, 30.0)
    cfg = {**cfg, "num_hidden_layers": 5}
    source = write_gemma3_gguf(tmp_path / "n.gguf", cfg, gemma2_tensors(cfg), arch="gemma2",
                               keys=[("add_sliding_window_pattern", [False] * 5)])
    config, _, _ = converted(source, tmp_path / "n.barellm")
    assert config["attention_scale"] == f32(4 ** -0.5)
    assert config["layer_types"] == ["full"] * 5 and config["sliding_window"] is None


def test_gguf_from_hf_writes_llama_cpps_gemma2(tmp_path):
    """scripts/gguf_from_hf.py writes Gemma 2 as llama.cpp's gemma2, which converts back to
    the checkpoint's own file; without one of the caps it cannot (llama.cpp's gemma2
    always applies both)."""
    tensors = gemma2_tensors(GEMMA2_CONFIG, seed=4)
    hf = make_checkpoint(tmp_path / "hf", GEMMA2_CONFIG, tensors)
    result = run(GGUF_FROM_HF, hf, "-o", tmp_path / "m.gguf")
    assert result.returncode == 0, result.stderr
    fields = {name: field.contents()
              for name, field in gguf.GGUFReader(str(tmp_path / "m.gguf")).fields.items()}
    assert fields["general.architecture"] == "gemma2"
    assert fields["gemma2.attn_logit_softcapping"] == 50.0
    assert fields["gemma2.final_logit_softcapping"] == 30.0
    assert fields["gemma2.attention.sliding_window_pattern"] == [True, False] * 2 + [True]
    from_hf, hf_arrays, _ = converted(hf, tmp_path / "hf.barellm", "--dtype", "f32")
    from_gguf, arrays, _ = converted(tmp_path / "m.gguf", tmp_path / "gguf.barellm")
    for field in GEMMA2_FIELDS:
        assert from_gguf.get(field) == from_hf.get(field), field
    for name, values in hf_arrays.items():
        assert np.array_equal(arrays[name], values), name
    uncapped = make_checkpoint(tmp_path / "uncapped",
                               {**GEMMA2_CONFIG, "attn_logit_softcapping": None}, tensors)
    result = run(GGUF_FROM_HF, uncapped, "-o", tmp_path / "u.gguf")
    assert result.returncode == 1
    assert result.stderr.startswith("gguf_from_hf: llama.cpp's gemma2 soft-caps both")
    assert not (tmp_path / "u.gguf").exists()


# ------------------------------------------------------------------------------- refusals

@pytest.mark.parametrize("changes, message", [
    ({"final_logit_softcapping": -30.0}, "config.json: final_logit_softcapping must be a "
     "positive number"),
    ({"attn_logit_softcapping": "50"}, "config.json: attn_logit_softcapping must be a "
     "positive number"),
    ({"hidden_activation": "gelu"}, "hidden_activation 'gelu' is not supported"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention=true"),
    ({"attention_bias": True}, "attention_bias=true is not supported for gemma3"),
    ({"layer_types": ["full_attention"] * 3}, "config.json: 'layer_types' must list 7 values"),
    ({"layer_types": ["local"] * 7}, "config.json: 'layer_types' must list 7 values"),
    ({"sliding_window": None}, "config.json: missing 'sliding_window'"),
    ({"sliding_window_pattern": 0}, "config.json: 'sliding_window_pattern' must be a "
     "positive integer"),
    ({"query_pre_attn_scalar": 0}, "config.json: query_pre_attn_scalar must be a positive"),
    ({"rope_local_base_freq": -1}, "config.json: rope_local_base_freq must be a positive"),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0}}},
     "rope_scaling type 'linear' on sliding layers is not supported"),
])
def test_refused_configs(tmp_path, changes, message):
    cfg = {**GEMMA3_CONFIG, **changes}
    hf = make_checkpoint(tmp_path / "hf", cfg, gemma3_tensors(GEMMA3_CONFIG))
    refused(tmp_path, hf, message)


def test_refused_multimodal_layouts(tmp_path):
    hf, tensors = multimodal_checkpoint(tmp_path / "hf", "language_model.model.")
    with open(hf / "config.json") as f:
        cfg = json.load(f)
    del cfg["text_config"]
    (hf / "config.json").write_text(json.dumps(cfg))
    refused(tmp_path, hf, "config.json: a multimodal gemma3 config needs a 'text_config'")
    cfg["text_config"] = {"model_type": "gemma2"}
    (hf / "config.json").write_text(json.dumps(cfg))
    refused(tmp_path, hf, "config.json: text_config has model_type 'gemma2'")
    # Text-layout tensors under a multimodal config: the language model's are missing.
    text_hf = make_checkpoint(tmp_path / "text", GEMMA3_CONFIG, gemma3_tensors(GEMMA3_CONFIG))
    (text_hf / "config.json").write_text(json.dumps(
        {**cfg, "text_config": {"hidden_size": 24, "intermediate_size": 40,
                                "num_hidden_layers": 7, "num_attention_heads": 4,
                                "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 40}}))
    refused(tmp_path, text_hf, "missing tensors: language_model.model.embed_tokens.weight")


def test_refused_norm_with_nan(tmp_path):
    tensors = gemma3_tensors(GEMMA3_CONFIG)
    tensors["model.layers.1.self_attn.k_norm.weight"][1][3] = np.nan
    hf = make_checkpoint(tmp_path / "hf", GEMMA3_CONFIG, tensors)
    refused(tmp_path, hf, "tensor 'model.layers.1.self_attn.k_norm.weight' contains NaN")


# -------------------------------------------------------------------------- K-quant mixes

def test_mix_types_at_the_270m_shape():
    """llama-quantize's Q4_K_M for gemma3 (src/llama-quant.cpp), at the 270M shape (dim
    640, not whole 256-weight blocks): the tied embedding is the output, Q8_0 for rows of
    640; 640-column matrices fall back to Q5_0; wv and w2 of the more-bits layers are
    Q6_K; vectors (the four norms) are not matrices."""
    import synth
    preset = synth.PRESETS["gemma3-270m"][1]
    config = convert.model_config(convert.language_model_config(preset), None)

    class Shape:
        def __init__(self, shape):
            self.shape = shape

    plan = [(name, Shape(shape), is_norm)
            for name, shape, is_norm in convert.expected_tensors(config).values()]
    types = mixes.matrix_types("Q4_K_M", config, plan)
    assert types["token_embedding"] == "Q8_0"
    # 18 layers: more bits below 18 // 8 = 2, from 7 * 18 // 8 = 15 on, and in every third
    # layer from 2 on (l - 2) % 3 == 2.
    more_bits = {0, 1, 4, 7, 10, 13, 15, 16, 17}
    for layer in range(18):
        p = f"layers.{layer}."
        for short in ("wq", "wk", "w1", "w3"):
            assert types[p + short] == "Q5_0"
        assert types[p + "wv"] == ("Q8_0" if layer in more_bits else "Q5_0")  # Q6_K's fallback
        assert types[p + "wo"] == "Q4_K"  # 1024 columns
        assert types[p + "w2"] == ("Q6_K" if layer in more_bits else "Q4_K")  # 2048 columns
        for norm in ("attn_norm", "post_attn_norm", "ffn_norm", "post_ffn_norm", "q_norm"):
            assert p + norm not in types
