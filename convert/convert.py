#!/usr/bin/env python3
"""Convert a Hugging Face Llama/Mistral/Qwen2/Qwen3/Gemma 2/Gemma 3/Mixtral/Qwen3-MoE/gpt-oss
checkpoint, or a GGUF file of llama.cpp, into one barellm weight file.

    python3 convert/convert.py HF_DIR -o OUT [--dtype DTYPE] [--barellm PATH]
    python3 convert/convert.py MODEL.gguf -o OUT [--dtype DTYPE] [--barellm PATH]

DTYPE is f32, f16, bf16, q8 or q4 (one type for every matrix), or q2_k, q3_k_s, q3_k_m,
q3_k_l, q4_k_m, q5_k_m, q6_k, iq4_xs or iq4_nl (llama-quantize's mixes: a type per matrix,
mixes.py, quantized by kquants.py).
The output is described in docs/FORMAT.md; q8 stores every matrix as int8 values in
groups of 32 columns with f16 scales (tensors NAME and NAME.scale); q4 stores every
matrix whose columns are a multiple of 32 as llama.cpp's Q4_0 (4-bit values, two per
byte, in blocks of 32 columns with f16 scales), the others as f16; a mix keeps ggml's
blocks byte for byte (one U8 tensor NAME per matrix). Tensors are laid out by element
size (4-byte, then 2-byte, then U8, then I8) so each is naturally aligned, and streamed
one row block at a time, a tensor on each core (parallel.py), so memory stays bounded
whatever the checkpoint size.
A GGUF file is read by gguf_in.py; its tensors are sources with their own row blocks,
and without --dtype each matrix keeps its own type where barellm runs it.
Before the output is put in place, the barellm program loads it (barellm_check.py): a
file barellm refuses is not written, and barellm's message is shown. The program is
--barellm PATH, else $BARELLM, else build/barellm; when that is not built, the file is
written unchecked, with a warning.
The output appears only when the conversion succeeded; on any error a message
`convert: ...` goes to stderr and the exit status is 1 (128 + N after signal N).
"""

import math
import os
import sys
import tempfile
from typing import NamedTuple

import numpy as np

import barellm_check
import blocks
from common import (ConvertError, OneLineParser, compact_json, float32, read_json,
                    refuse_output_among_inputs, refuse_output_in_place_of, run_main,
                    stop_signals_held, umask_applied)
import dtypes
import gguf_in
import gpt_oss
import hf_tokenizer
import kquants
import mixes
import parallel
import rotary
import safetensors_io as st

# transformers' defaults for config.json keys a checkpoint may omit. Qwen2 and Qwen3 have
# a sliding window only with use_sliding_window, on layers max_window_layers and up; Qwen3's
# head_dim defaults to 128, not hidden_size / num_attention_heads.
CONFIG_DEFAULTS = {
    "llama": {"max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "sliding_window": None},
    "mistral": {"max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-6,
                "sliding_window": 4096},
    "qwen2": {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "sliding_window": 4096,
              "max_window_layers": 28},
    "qwen3": {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "sliding_window": 4096,
              "max_window_layers": 28, "head_dim": 128},
    # Mixture-of-experts models (MOE_DEFAULTS adds their experts' defaults).
    "mixtral": {"max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-5,
                "sliding_window": None},
    "qwen3_moe": {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
                  "sliding_window": 4096},
    # Phi-3 and Phi-4 (Phi3Config): fused q/k/v and gate/up matrices, a window on every
    # layer where sliding_window is set, LongRoPE, Phi-4-mini's partial rotary.
    "phi3": {"max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "sliding_window": None,
             "original_max_position_embeddings": 4096, "partial_rotary_factor": 1.0,
             "vocab_size": 32064, "bos_token_id": 1, "eos_token_id": 32000},
}
# transformers' defaults of the mixture-of-experts keys: Mixtral routes each token to 2 of 8
# experts of width intermediate_size and always rescales their weights to sum to 1; Qwen3-MoE
# to num_experts_per_tok of num_experts of width moe_intermediate_size, rescaled with
# norm_topk_prob, its layers sparse where (layer + 1) % decoder_sparse_step == 0 unless listed
# in mlp_only_layers.
MOE_DEFAULTS = {
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2},
    "qwen3_moe": {"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                  "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": None},
}
# transformers' Gemma3TextConfig defaults: the text part of a multimodal Gemma 3 config
# (4B and up) gives little more than its sizes.
GEMMA3_DEFAULTS = {
    "vocab_size": 262208, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0, "rope_scaling": None, "sliding_window": 4096,
    "sliding_window_pattern": 6, "query_pre_attn_scalar": 256,
    "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
    "bos_token_id": 2, "eos_token_id": 1,
}
CONFIG_DEFAULTS["gemma3_text"] = GEMMA3_DEFAULTS
# Keys of a multimodal config's top level that its text part inherits when it lacks them.
GEMMA3_INHERITED_KEYS = ("bos_token_id", "eos_token_id", "tie_word_embeddings", "torch_dtype",
                         "dtype")
# transformers' Gemma2Config defaults (the 2B model's shape): every other layer slides,
# from layer 0 (sliding_window_pattern below), and both soft-cappings are on.
GEMMA2_DEFAULTS = {
    "vocab_size": 256000, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "sliding_window": 4096, "sliding_window_pattern": 2, "query_pre_attn_scalar": 256,
    "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
    "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
    "bos_token_id": 2, "eos_token_id": 1,
}
CONFIG_DEFAULTS["gemma2"] = GEMMA2_DEFAULTS
# gpt-oss: GptOssConfig's defaults (gpt_oss.with_defaults).
CONFIG_DEFAULTS["gpt_oss"] = gpt_oss.DEFAULTS
# Gemma's GeGLU: GELU with the tanh approximation (transformers' name).
GEMMA_ACTIVATION = "gelu_pytorch_tanh"
# Gemma 2's soft-capping of the attention scores and of the logits (barellm.config's
# attn_logit_softcap and final_logit_softcap); Gemma 3 sets neither (null), but computes them
# where a config does.
SOFTCAPPING_KEYS = {"attn_logit_softcapping": "attn_logit_softcap",
                    "final_logit_softcapping": "final_logit_softcap"}
# The barellm architecture (docs/FORMAT.md) of each model_type.
ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
                 "gemma2": "gemma2", "gemma3_text": "gemma3", "mixtral": "mixtral",
                 "qwen3_moe": "qwen3_moe", "phi3": "phi3", "gpt_oss": "gpt_oss"}
GEMMA_ARCHITECTURES = ("gemma2", "gemma3")
# Mixture-of-experts model types barellm does not run, with what it lacks for them.
UNSUPPORTED_MOE = {
    "qwen2_moe": "Qwen2-MoE's shared expert and its sigmoid gate are not implemented (mixtral "
                 "and qwen3_moe are)",
    "deepseek_v2": "DeepSeek's shared experts and grouped routing are not implemented",
    "deepseek_v3": "DeepSeek's shared experts and grouped routing are not implemented",
}
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok",
            "moe_intermediate_size")
# A sparse layer's tensors: the router (kept in F32, as barellm computes it) and each
# expert's three matrices, stacked expert after expert into one tensor each (docs/FORMAT.md).
# Per model type: the router's Hugging Face name and each expert's, {expert} its index.
MOE_TENSORS = {
    "mixtral": ("block_sparse_moe.gate.weight",
                {"w1": "block_sparse_moe.experts.{expert}.w1.weight",
                 "w3": "block_sparse_moe.experts.{expert}.w3.weight",
                 "w2": "block_sparse_moe.experts.{expert}.w2.weight"}),
    "qwen3_moe": ("mlp.gate.weight",
                  {"w1": "mlp.experts.{expert}.gate_proj.weight",
                   "w3": "mlp.experts.{expert}.up_proj.weight",
                   "w2": "mlp.experts.{expert}.down_proj.weight"}),
}
# Phi3Config's names of LongRoPE (it renames "su" and "yarn" to "longrope").
LONGROPE_TYPES = ("longrope", "su", "yarn")
ROPE_SCALING_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"),
}
# barellm name suffix, Hugging Face name, is a vector (norm or bias, always F32), the
# config flag that must be true for the tensor to exist (None: always) — per layer.
LAYER_TENSORS = (
    ("attn_norm", "input_layernorm.weight", True, None),
    ("wq", "self_attn.q_proj.weight", False, None),
    ("wk", "self_attn.k_proj.weight", False, None),
    ("wv", "self_attn.v_proj.weight", False, None),
    ("bq", "self_attn.q_proj.bias", True, "qkv_bias"),
    ("bk", "self_attn.k_proj.bias", True, "qkv_bias"),
    ("bv", "self_attn.v_proj.bias", True, "qkv_bias"),
    ("q_norm", "self_attn.q_norm.weight", True, "qk_norm"),
    ("k_norm", "self_attn.k_norm.weight", True, "qk_norm"),
    ("wo", "self_attn.o_proj.weight", False, None),
    ("bo", "self_attn.o_proj.bias", True, "o_bias"),
    ("sinks", "self_attn.sinks", True, "attention_sinks"),
    ("ffn_norm", "post_attention_layernorm.weight", True, None),
    ("w1", "mlp.gate_proj.weight", False, None),
    ("w3", "mlp.up_proj.weight", False, None),
    ("w2", "mlp.down_proj.weight", False, None),
)
# Gemma's layer: four norms, two of them on the outputs of attention and feed-forward
# (transformers' post_attention_layernorm is barellm's post_attn_norm, its
# pre_feedforward_layernorm barellm's ffn_norm); Gemma 3's has q and k norms too, Gemma 2's
# not.
GEMMA3_LAYER_TENSORS = (
    ("attn_norm", "input_layernorm.weight", True, None),
    ("wq", "self_attn.q_proj.weight", False, None),
    ("wk", "self_attn.k_proj.weight", False, None),
    ("wv", "self_attn.v_proj.weight", False, None),
    ("q_norm", "self_attn.q_norm.weight", True, None),
    ("k_norm", "self_attn.k_norm.weight", True, None),
    ("wo", "self_attn.o_proj.weight", False, None),
    ("post_attn_norm", "post_attention_layernorm.weight", True, None),
    ("ffn_norm", "pre_feedforward_layernorm.weight", True, None),
    ("w1", "mlp.gate_proj.weight", False, None),
    ("w3", "mlp.up_proj.weight", False, None),
    ("w2", "mlp.down_proj.weight", False, None),
    ("post_ffn_norm", "post_feedforward_layernorm.weight", True, None),
)
GEMMA2_LAYER_TENSORS = tuple(entry for entry in GEMMA3_LAYER_TENSORS
                             if entry[0] not in ("q_norm", "k_norm"))
LAYER_TABLES = {"gemma2": GEMMA2_LAYER_TENSORS, "gemma3": GEMMA3_LAYER_TENSORS}


class Layout(NamedTuple):
    """Where a checkpoint keeps its language model's tensors: the prefix of the model's
    own (embed_tokens, layers, norm), the name of the output matrix, and the prefixes of
    the tensors of other parts (a vision tower), which are not converted."""

    prefix: str
    lm_head: str
    skipped: tuple = ()


TEXT_LAYOUT = Layout("model.", "lm_head.weight")
# A multimodal Gemma 3 (Gemma3ForConditionalGeneration), as transformers saves it before
# 4.52 and from then on.
MULTIMODAL_LAYOUTS = (
    Layout("language_model.model.", "language_model.lm_head.weight",
           ("vision_tower.", "multi_modal_projector.")),
    Layout("model.language_model.", "lm_head.weight",
           ("model.vision_tower.", "model.multi_modal_projector.")),
)
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# The files of a checkpoint besides its *.safetensors, which -o must not overwrite.
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer_config.json",
              "tokenizer.json", "tokenizer.model", hf_tokenizer.CHAT_TEMPLATE_FILE,
              "model.safetensors.index.json")
CHUNK_ELEMENTS = 1 << 23
ALIGNMENT = 64


def json_object(path, required):
    """Read a JSON file that must hold an object; None when absent and not required."""
    value = read_json(path, required)
    if value is not None and not isinstance(value, dict):
        raise ConvertError(f"{os.path.basename(path)}: not a JSON object")
    return value


def language_model_config(cfg):
    """The config of the language model of config.json: the text part of a multimodal
    Gemma 3 config (`text_config`, with the top level's BOS/EOS ids, tying and dtype where
    it lacks them), else the config itself; Gemma's and Phi-3's omitted keys take
    transformers' defaults (CONFIG_DEFAULTS)."""
    if cfg.get("model_type") == "gemma3":
        text = cfg.get("text_config")
        if not isinstance(text, dict):
            raise ConvertError("config.json: a multimodal gemma3 config needs a 'text_config' "
                               "object")
        if text.get("model_type", "gemma3_text") != "gemma3_text":
            raise ConvertError(f"config.json: text_config has model_type "
                               f"'{text.get('model_type')}', not gemma3_text")
        inherited = {key: cfg[key] for key in GEMMA3_INHERITED_KEYS if key in cfg}
        cfg = {**inherited, **text, "model_type": "gemma3_text"}
    if cfg.get("model_type") in ("gemma2", "gemma3_text", "phi3"):
        cfg = {**CONFIG_DEFAULTS[cfg["model_type"]], **cfg}
    if cfg.get("model_type") == "gpt_oss":
        cfg = gpt_oss.with_defaults(cfg)
    return cfg


def check_gemma(cfg):
    """Refuse Gemma 2 and Gemma 3 configurations barellm does not implement, naming the
    key. `cfg` has the model type's defaults."""
    model_type = cfg["model_type"]
    act = cfg.get("hidden_activation")
    if act != GEMMA_ACTIVATION:
        raise ConvertError(f"hidden_activation '{act}' is not supported (only "
                           f"{GEMMA_ACTIVATION} for {model_type})")
    if cfg.get("use_bidirectional_attention"):
        raise ConvertError("use_bidirectional_attention=true is not supported (barellm "
                           "attends causally)")
    if cfg.get("attention_bias"):
        raise ConvertError(f"attention_bias=true is not supported for {model_type}")


def check_architecture(cfg):
    """Refuse configurations barellm does not implement, naming the feature. `cfg` is
    config.json as read (a multimodal Gemma 3 one is checked on its text part)."""
    model_type = cfg.get("model_type")
    if model_type == "gemma3":
        cfg = language_model_config(cfg)
        model_type = cfg["model_type"]
    if model_type in UNSUPPORTED_MOE:
        raise ConvertError(f"model_type '{model_type}' is not supported: "
                           f"{UNSUPPORTED_MOE[model_type]}")
    if model_type not in CONFIG_DEFAULTS:
        raise ConvertError(f"model_type '{model_type}' is not supported (only llama, mistral, "
                           "qwen2, qwen3, phi3, gemma2, gemma3_text, gemma3, mixtral, "
                           "qwen3_moe and gpt_oss)")
    if model_type == "gpt_oss":
        gpt_oss.check(cfg)
        return
    if cfg.get("quantization_config"):
        raise ConvertError("quantized checkpoints (quantization_config) are not supported")
    if cfg.get("mlp_bias"):
        raise ConvertError("mlp_bias=true is not supported (no feed-forward bias tensors)")
    if model_type in ("mistral", "phi3") and cfg.get("attention_bias"):
        raise ConvertError(f"attention_bias=true is not supported for {model_type}")
    for key in MOE_KEYS:
        if cfg.get(key) and model_type not in MOE_DEFAULTS:
            raise ConvertError(f"mixture-of-experts models ({key}={cfg[key]}) are not supported "
                               f"for model_type '{model_type}' (only mixtral and qwen3_moe)")
    if model_type == "qwen3_moe" and cfg.get("use_sliding_window"):
        raise ConvertError("use_sliding_window=true is not supported for qwen3_moe")
    if model_type == "mixtral" and cfg.get("router_jitter_noise"):
        raise ConvertError(f"router_jitter_noise={cfg['router_jitter_noise']} is not supported "
                           "(it only perturbs training)")
    if model_type in ("gemma2", "gemma3_text"):
        check_gemma(language_model_config(cfg))
        return
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ConvertError(f"hidden_act '{act}' is not supported (only silu)")


def positive_int(cfg, key, default=None):
    """A config value that must be a positive integer; null counts as absent."""
    value = cfg.get(key)
    if value is None:
        value = default
    if value is None:
        raise ConvertError(f"config.json: missing '{key}'")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConvertError(f"config.json: '{key}' must be a positive integer, not {value!r}")
    return value


def positive_number(value, what):
    """Check a positive int/float that stays positive and finite as the float32 barellm
    computes with, and return it as a float."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not 0 < float32(value) < math.inf):
        raise ConvertError(f"config.json: {what} must be a positive number within the float32 "
                           f"range, not {value!r}")
    return float(value)


def yarn_scaling(cfg, scaling):
    """rope_scaling of a YaRN config as transformers computes it: `factor`; the original
    context from the config's own original_max_position_embeddings, else rope_scaling's,
    else max_position_embeddings; beta_fast and beta_slow (32 and 1 where absent or 0);
    `truncate` (true where absent); the attention factor given, else mscale / mscale_all_dim's
    (0.1 m ln(factor) + 1 for each m), else 0.1 ln(factor) + 1 (1 for a factor up to 1)."""
    factor = positive_number(scaling.get("factor"), "rope_scaling 'factor' of type yarn")
    original = cfg.get("original_max_position_embeddings",
                       scaling.get("original_max_position_embeddings",
                                   cfg.get("max_position_embeddings")))
    original = positive_int({"original_max_position_embeddings": original},
                            "original_max_position_embeddings")

    def mscale(m=1.0):
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if m and m_all:
            attention_factor = (mscale(positive_number(m, "rope_scaling 'mscale'")) /
                                mscale(positive_number(m_all, "rope_scaling 'mscale_all_dim'")))
        else:
            attention_factor = mscale()
    truncate = scaling.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ConvertError(f"config.json: rope_scaling 'truncate' must be true or false, not "
                           f"{truncate!r}")
    betas = {key: positive_number(scaling.get(key) or default, f"rope_scaling '{key}'")
             for key, default in (("beta_fast", 32.0), ("beta_slow", 1.0))}
    return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original,
            **betas, "truncate": truncate,
            "attention_factor": positive_number(attention_factor,
                                                "rope_scaling 'attention_factor'")}


def rope_settings(cfg):
    """Return (rope_theta, rope_scaling) with rope_scaling null, linear, llama3 or yarn.

    Newer transformers keep both in `rope_parameters`; older ones use `rope_theta`
    and `rope_scaling`. A "default" rope type means no scaling.
    """
    params = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    theta = positive_number(cfg.get("rope_theta", params.get("rope_theta", 10000.0)),
                            "rope_theta")
    scaling = cfg.get("rope_scaling")
    if scaling is None and params:
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if scaling is None:
        return theta, None
    if not isinstance(scaling, dict):
        raise ConvertError("config.json: rope_scaling must be an object or null")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "default":
        return theta, None
    if kind == "yarn":
        return theta, yarn_scaling(cfg, scaling)
    if kind not in ROPE_SCALING_KEYS:
        raise ConvertError(f"rope_scaling type '{kind}' is not supported "
                           "(only linear, llama3 and yarn)")
    for key in ROPE_SCALING_KEYS[kind]:
        positive_number(scaling.get(key), f"rope_scaling '{key}' of type {kind}")
    if kind == "llama3":
        positive_int(scaling, "original_max_position_embeddings")
        if not float32(scaling["high_freq_factor"]) > float32(scaling["low_freq_factor"]):
            raise ConvertError("config.json: rope_scaling needs high_freq_factor > "
                               "low_freq_factor")
    return theta, scaling


def rope_frequencies(theta, scaling, head_dim):
    """The RoPE inverse frequencies of the rotated pairs barellm derives from these settings
    (head_dim: the elements rotated), computed as rope_table in src/weights/config.cpp does:
    float32 settings, float64 arithmetic; LongRoPE's with each factor set, one after the
    other; for YaRN the unscaled ones, then those divided by its factor (each YaRN frequency
    lies between the two)."""
    kind = scaling.get("rope_type", scaling.get("type")) if scaling else None
    if kind == "yarn":  # each of YaRN's frequencies lies between these two
        plain = rope_frequencies(theta, None, head_dim)
        return plain + [frequency / float32(scaling["factor"]) for frequency in plain]
    if kind == "longrope":  # both factor sets, each frequency divided by its pair's factor
        plain = rope_frequencies(theta, None, head_dim)
        return [frequency / float32(factors[i]) for key in ("short_factor", "long_factor")
                for factors in (scaling[key],) for i, frequency in enumerate(plain)]
    frequencies = []
    for i in range(head_dim // 2):
        frequency = float32(theta) ** (-2 * i / head_dim)
        if kind == "linear":
            frequency /= float32(scaling["factor"])
        elif kind == "llama3":
            factor, low, high = (float32(scaling[key]) for key in ROPE_SCALING_KEYS[kind][:3])
            context = scaling["original_max_position_embeddings"]
            wavelength = 2 * math.pi / frequency
            if wavelength > context / low:
                frequency /= factor
            elif wavelength >= context / high:
                smooth = (context / wavelength - low) / (high - low)
                frequency = (1 - smooth) * frequency / factor + smooth * frequency
        frequencies.append(frequency)
    return frequencies


def check_rope_frequencies(theta, scaling, head_dim):
    """Every RoPE inverse frequency must be a positive float32, as barellm requires;
    the error names rope_theta, or rope_scaling when the scaling breaks it."""
    for key, scaled in (("rope_theta", None), ("rope_scaling", scaling)):
        for frequency in rope_frequencies(theta, scaled, head_dim):
            if not 0 < float32(frequency) < math.inf:
                what = "overflow" if frequency > 1 else "round to 0"
                raise ConvertError(f"config.json: {key} makes a RoPE frequency {what} as a float32")


def optional_fields(**fields):
    """The fields whose value is not their default (0 or false): a Llama file carries none
    of them, as before they existed."""
    return {key: value for key, value in fields.items() if value}


def sliding_window(cfg, defaults, layers):
    """(window or None, first windowed layer). Mistral's window covers every layer. Qwen2
    and Qwen3 use one only with use_sliding_window, and then, as transformers does, on the
    layers from max_window_layers on (none when that is past the last layer)."""
    window = cfg.get("sliding_window", defaults["sliding_window"])
    first_layer = 0
    if cfg["model_type"] == "qwen3_moe":
        return None, 0
    if cfg["model_type"] in ("qwen2", "qwen3"):
        if not cfg.get("use_sliding_window", False):
            window = None
        first_layer = cfg.get("max_window_layers", defaults["max_window_layers"])
        if isinstance(first_layer, bool) or not isinstance(first_layer, int) or first_layer < 0:
            raise ConvertError(f"config.json: 'max_window_layers' must be a non-negative "
                               f"integer, not {first_layer!r}")
        if first_layer >= layers or window is None:
            first_layer, window = 0, None
        derived = ["full_attention" if window is None or i < first_layer
                   else "sliding_attention" for i in range(layers)]
        if cfg.get("layer_types") is not None and cfg["layer_types"] != derived:
            raise ConvertError("config.json: 'layer_types' differs from what use_sliding_window "
                               "and max_window_layers give; barellm cannot run that layer mix")
    elif cfg["model_type"] not in ("mistral", "mixtral", "phi3"):
        return None, 0
    if window is None:
        return None, 0
    return positive_int({"sliding_window": window}, "sliding_window"), first_layer


def gemma3_rope(cfg):
    """(rope_theta, rope_scaling, rope_theta_local) of a Gemma 3 config: the global layers'
    RoPE (rope_theta and rope_scaling, or rope_parameters' full_attention in newer
    transformers) and the sliding layers' base (rope_local_base_freq, or rope_parameters'
    sliding_attention), which has no scaling."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and ("full_attention" in params
                                     or "sliding_attention" in params):
        full, local = params.get("full_attention", {}), params.get("sliding_attention", {})
        if not isinstance(full, dict) or not isinstance(local, dict):
            raise ConvertError("config.json: rope_parameters' full_attention and "
                               "sliding_attention must be objects")
        theta, scaling = rope_settings({"rope_parameters": full})
        kind = local.get("rope_type", "default")
        if kind != "default":
            raise ConvertError(f"rope_scaling type '{kind}' on sliding layers is not "
                               "supported (barellm scales only the global layers' RoPE)")
        local_theta = local.get("rope_theta", GEMMA3_DEFAULTS["rope_local_base_freq"])
    else:
        theta, scaling = rope_settings(cfg)
        local_theta = cfg.get("rope_local_base_freq")
    return theta, scaling, positive_number(local_theta, "rope_local_base_freq")


def phi3_rope(cfg, head_dim):
    """(rotary_dim, rope_theta, rope_scaling) of a Phi-3 config as transformers computes
    them: int(head_dim * partial_rotary_factor) elements rotated; LongRoPE's factor per
    rotated pair (short_factor, long_factor), its original context (the config's
    original_max_position_embeddings, before rope_scaling's) and its attention factor
    (given, else sqrt(1 + ln(factor) / ln(original)), factor = max_position_embeddings /
    original where not given, 1 for a factor up to 1)."""
    params = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    theta = positive_number(cfg.get("rope_theta", params.get("rope_theta", 10000.0)),
                            "rope_theta")
    partial = cfg.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0))
    if isinstance(partial, bool) or not isinstance(partial, (int, float)) or not 0 < partial <= 1:
        raise ConvertError(f"config.json: partial_rotary_factor must be a number in (0, 1], "
                           f"not {partial!r}")
    rotary_dim = int(head_dim * partial)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ConvertError(f"config.json: partial_rotary_factor {partial} rotates {rotary_dim} "
                           f"of {head_dim} elements; RoPE needs an even number, at least 2")
    scaling = cfg.get("rope_scaling")
    if scaling is None:
        scaling = {k: v for k, v in params.items()
                   if k not in ("rope_theta", "partial_rotary_factor")}
    if not isinstance(scaling, dict):
        raise ConvertError("config.json: rope_scaling must be an object or null")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        check_rope_frequencies(theta, None, rotary_dim)
        return rotary_dim, theta, None
    if kind not in LONGROPE_TYPES:
        raise ConvertError(f"rope_scaling type '{kind}' is not supported for phi3 (only "
                           "longrope)")
    factors = {}
    for key in ("short_factor", "long_factor"):
        values = scaling.get(key)
        if not isinstance(values, list) or len(values) != rotary_dim // 2:
            raise ConvertError(f"config.json: rope_scaling '{key}' must list {rotary_dim // 2} "
                               "numbers, one per rotated pair")
        factors[key] = [positive_number(v, f"rope_scaling '{key}'") for v in values]
    # transformers gives the config's own original_max_position_embeddings (Phi3Config's
    # default 4096 where absent) priority over rope_scaling's.
    original = positive_int(cfg, "original_max_position_embeddings")
    factor = scaling.get("factor")
    if factor is None:
        factor = positive_int(cfg, "max_position_embeddings") / original
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        attention_factor = (1.0 if positive_number(factor, "rope_scaling 'factor'") <= 1
                            else math.sqrt(1 + math.log(factor) / math.log(original)))
    scaling = {"rope_type": "longrope", **factors, "original_max_position_embeddings": original,
               "attention_factor": positive_number(attention_factor,
                                                   "rope_scaling 'attention_factor'")}
    check_rope_frequencies(theta, scaling, rotary_dim)
    return rotary_dim, theta, scaling


def gemma_layer_types(cfg, layers):
    """"sliding" or "full" for each layer: config.json's layer_types, else its
    sliding_window_pattern P (layer l is global when (l + 1) % P == 0, as transformers
    derives layer_types; Gemma 2's P is 2)."""
    names = {"sliding_attention": "sliding", "full_attention": "full"}
    given = cfg.get("layer_types")
    if given is not None:
        if (not isinstance(given, list) or len(given) != layers
                or not all(isinstance(kind, str) and kind in names for kind in given)):
            raise ConvertError(f"config.json: 'layer_types' must list {layers} values, each "
                               "sliding_attention or full_attention")
        return [names[kind] for kind in given]
    pattern = positive_int(cfg, "sliding_window_pattern")
    return ["full" if (layer + 1) % pattern == 0 else "sliding" for layer in range(layers)]


def gemma_fields(cfg, dim, head_dim, layers):
    """The fields a Gemma 2 or Gemma 3 config adds (docs/FORMAT.md), with rope_theta,
    rope_scaling and sliding_window: √dim scales the embedding, post-norms, GeGLU, the
    layers' pattern of sliding and global attention, and queries scaled by
    query_pre_attn_scalar^-1/2 (in float32, as computed); Gemma 3's q and k norms and its
    sliding layers' RoPE base; the soft-capping of the scores and the logits where the
    config has it (Gemma 2)."""
    gemma3 = cfg["model_type"] == "gemma3_text"
    if gemma3:
        theta, scaling, local_theta = gemma3_rope(cfg)
        check_rope_frequencies(local_theta, None, head_dim)
    else:
        theta, scaling = rope_settings(cfg)
    check_rope_frequencies(theta, scaling, head_dim)
    layer_types = gemma_layer_types(cfg, layers)
    window = None
    if "sliding" in layer_types:
        window = positive_int(cfg, "sliding_window")
    scalar = positive_number(cfg.get("query_pre_attn_scalar"), "query_pre_attn_scalar")
    fields = {
        "rope_theta": theta,
        "rope_scaling": scaling,
        "sliding_window": window,
        "activation": "gelu_tanh",
        "embedding_scale": float(np.float32(math.sqrt(dim))),
        "post_norms": True,
        "layer_types": layer_types,
        "attention_scale": float(np.float32(scalar ** -0.5)),
    }
    if gemma3:
        fields.update(qk_norm=True, rope_theta_local=local_theta)
    for key, field in SOFTCAPPING_KEYS.items():
        if cfg.get(key) is not None:
            fields[field] = positive_number(cfg[key], key)
    return fields


def moe_fields(cfg, layers):
    """The mixture-of-experts fields of barellm.config (docs/FORMAT.md) of a mixtral or
    qwen3_moe config, {} for another: experts, experts_per_token, moe_hidden_dim,
    norm_topk_prob and the dense layers among the sparse ones."""
    model_type = cfg["model_type"]
    if model_type not in MOE_DEFAULTS:
        return {}
    cfg = {**MOE_DEFAULTS[model_type], **{k: v for k, v in cfg.items() if v is not None}}
    if model_type == "mixtral":
        experts = positive_int(cfg, "num_local_experts")
        width, normalized, dense = positive_int(cfg, "intermediate_size"), True, []
    else:
        experts = positive_int(cfg, "num_experts")
        width = positive_int(cfg, "moe_intermediate_size")
        normalized = cfg["norm_topk_prob"]
        if not isinstance(normalized, bool):
            raise ConvertError(f"config.json: 'norm_topk_prob' must be true or false, not "
                               f"{normalized!r}")
        step = positive_int(cfg, "decoder_sparse_step")
        only_mlp = cfg["mlp_only_layers"] or []
        if not isinstance(only_mlp, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in only_mlp):
            raise ConvertError(f"config.json: 'mlp_only_layers' must be a list of layer "
                               f"indices, not {only_mlp!r}")
        dense = [layer for layer in range(layers)
                 if layer in only_mlp or (layer + 1) % step != 0]
    per_token = positive_int(cfg, "num_experts_per_tok")
    if per_token > experts:
        raise ConvertError(f"config.json: num_experts_per_tok {per_token} is more than the "
                           f"{experts} experts")
    fields = {"experts": experts, "experts_per_token": per_token, "moe_hidden_dim": width,
              "norm_topk_prob": normalized}
    if dense:
        fields["dense_layers"] = dense
    return fields


def gpt_oss_fields(cfg, layers):
    """The barellm.config fields of a gpt-oss config (with its defaults) beyond the common
    ones: sliding_window (None where no layer slides) and layer_types, attention sinks, the
    clamped SwiGLU and its limit, every layer's experts with their biases, the chosen ones'
    weights a softmax over their logits (norm_topk_prob)."""
    kinds = gpt_oss.layer_types(cfg, layers)
    window = None
    if "sliding" in kinds and cfg.get("sliding_window") is not None:
        window = positive_int(cfg, "sliding_window")
    if window is None:  # transformers' sliding layers without a window attend to everything
        kinds = ["full"] * layers
    experts = positive_int(cfg, "num_local_experts")
    per_token = positive_int(cfg, "num_experts_per_tok")
    if per_token > experts:
        raise ConvertError(f"config.json: num_experts_per_tok {per_token} is more than the "
                           f"{experts} experts")
    fields = {"sliding_window": window}
    if window is not None:
        fields["layer_types"] = kinds
    return {**fields, "attention_sinks": True, "activation": "swiglu_oai",
            "swiglu_limit": positive_number(cfg.get("swiglu_limit"), "swiglu_limit"),
            "experts": experts, "experts_per_token": per_token,
            "moe_hidden_dim": positive_int(cfg, "intermediate_size"), "norm_topk_prob": True,
            "expert_biases": True}


def is_sparse(config, layer):
    """Whether `layer` of barellm.config `config` is a mixture of experts."""
    return bool(config.get("experts")) and layer not in config.get("dense_layers", [])


def token_id_list(value, what):
    """Normalize an id or list of ids (or null) to a list of non-negative ints."""
    ids = [] if value is None else value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ConvertError(f"{what} must be a token id or a list of ids, not {value!r}")
    return ids


def model_config(cfg, gen):
    """Build barellm.config (docs/FORMAT.md) from config.json and generation_config.json.

    `add_bos` and `weight_dtype` are left None for the caller to fill in.
    """
    defaults = CONFIG_DEFAULTS[cfg["model_type"]]
    dim = positive_int(cfg, "hidden_size")
    heads = positive_int(cfg, "num_attention_heads")
    kv_heads = positive_int(cfg, "num_key_value_heads", heads)
    if heads % kv_heads:
        raise ConvertError(f"num_attention_heads {heads} is not a multiple of "
                           f"num_key_value_heads {kv_heads}")
    default_head_dim = defaults.get("head_dim")
    if cfg.get("head_dim") is None and default_head_dim is None and dim % heads:
        raise ConvertError(f"hidden_size {dim} is not a multiple of num_attention_heads {heads}")
    head_dim = positive_int(cfg, "head_dim", default_head_dim or dim // heads)
    if head_dim % 2:
        raise ConvertError(f"head_dim {head_dim} is odd (RoPE needs an even head_dim)")
    layers = positive_int(cfg, "num_hidden_layers")
    if cfg["model_type"] in ("gemma2", "gemma3_text"):
        extra = gemma_fields(cfg, dim, head_dim, layers)
        theta, scaling, window = (extra.pop(key) for key in
                                  ("rope_theta", "rope_scaling", "sliding_window"))
        window_first_layer = 0
    elif cfg["model_type"] == "gpt_oss":
        theta, scaling = rope_settings(cfg)
        check_rope_frequencies(theta, scaling, head_dim)
        extra = gpt_oss_fields(cfg, layers)
        window, window_first_layer = extra.pop("sliding_window"), 0
    elif cfg["model_type"] == "phi3":
        rotary_dim, theta, scaling = phi3_rope(cfg, head_dim)
        extra = {"rotary_dim": rotary_dim} if rotary_dim != head_dim else {}
        window, window_first_layer = sliding_window(cfg, defaults, layers)
        if window is not None and window >= positive_int(cfg, "max_position_embeddings"):
            window = None  # wider than any context: every layer attends to all of it
    else:
        extra = {}
        theta, scaling = rope_settings(cfg)
        check_rope_frequencies(theta, scaling, head_dim)
        window, window_first_layer = sliding_window(cfg, defaults, layers)
    gen = gen or {}
    eos_source = gen if gen.get("eos_token_id") is not None else cfg
    bos_ids = token_id_list(cfg.get("bos_token_id", gen.get("bos_token_id")), "bos_token_id")
    model_type = cfg["model_type"]
    attention_bias = cfg.get("attention_bias") is True
    return {
        "architecture": ARCHITECTURES[model_type],
        "dim": dim,
        "hidden_dim": positive_int(cfg, "intermediate_size"),
        "layers": layers,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": positive_int(cfg, "vocab_size"),
        "max_context": positive_int(cfg, "max_position_embeddings",
                                    defaults["max_position_embeddings"]),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "norm_eps": positive_number(cfg.get("rms_norm_eps", defaults["rms_norm_eps"]),
                                    "rms_norm_eps"),
        "sliding_window": window,
        **optional_fields(sliding_window_first_layer=window_first_layer,
                          qkv_bias=model_type == "qwen2" or attention_bias,
                          o_bias=attention_bias,
                          qk_norm=model_type in ("qwen3", "qwen3_moe")),
        **extra,
        **moe_fields(cfg, layers),
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "bos_id": bos_ids[0] if bos_ids else None,
        "eos_ids": token_id_list(eos_source.get("eos_token_id"), "eos_token_id"),
        "add_bos": None,
        "weight_dtype": None,
    }


def check_token_ids(config, tokenizer):
    """The tokenizer and the special ids must fit in the model's vocabulary."""
    vocab = config["vocab_size"]
    size = hf_tokenizer.vocab_size(tokenizer)
    if size > vocab:
        raise ConvertError(f"the tokenizer has {size} ids but vocab_size is {vocab}")
    special = ([config["bos_id"]] if config["bos_id"] is not None else []) + config["eos_ids"]
    for token_id in special:
        if token_id >= vocab:
            raise ConvertError(f"special token id {token_id} is not below vocab_size {vocab}")


def expected_tensors(config, layout=TEXT_LAYOUT):
    """Map each expected Hugging Face tensor name (under `layout`) to (barellm name, shape,
    is_norm), where is_norm marks the vectors kept in F32 (norm weights and biases), in
    output order."""
    dim, hidden, vocab = config["dim"], config["hidden_dim"], config["vocab_size"]
    q_rows = config["heads"] * config["head_dim"]
    kv_rows = config["kv_heads"] * config["head_dim"]
    shapes = {"attn_norm": (dim,), "wq": (q_rows, dim), "wk": (kv_rows, dim),
              "wv": (kv_rows, dim), "wo": (dim, q_rows), "ffn_norm": (dim,),
              "w1": (hidden, dim), "w3": (hidden, dim), "w2": (dim, hidden),
              "bq": (q_rows,), "bk": (kv_rows,), "bv": (kv_rows,), "bo": (dim,),
              "q_norm": (config["head_dim"],), "k_norm": (config["head_dim"],),
              "post_attn_norm": (dim,), "post_ffn_norm": (dim,), "sinks": (config["heads"],)}
    prefix = layout.prefix
    table = LAYER_TABLES.get(config["architecture"], LAYER_TENSORS)
    expected = {f"{prefix}embed_tokens.weight": ("token_embedding", (vocab, dim), False)}
    for layer in range(config["layers"]):
        for short, hf, is_vector, flag in table:
            if short in ("w1", "w3", "w2") and is_sparse(config, layer):
                continue
            if flag is None or config.get(flag):
                expected[f"{prefix}layers.{layer}.{hf}"] = (
                    f"layers.{layer}.{short}", shapes[short], is_vector)
            if short == "ffn_norm" and is_sparse(config, layer):
                expected.update(gpt_oss.layer_tensors(config, prefix, layer)
                                if config["architecture"] == "gpt_oss"
                                else moe_layer_tensors(config, prefix, layer))
    expected[f"{prefix}norm.weight"] = ("final_norm", (dim,), True)
    if not config["tied_embeddings"]:
        expected[layout.lm_head] = ("output", (vocab, dim), False)
    return expected


def moe_layer_tensors(config, prefix, layer):
    """The expected entries of sparse layer `layer` (as expected_tensors'): the router
    (F32), then w1, w3 and w2 stacked over the experts, whose key is the tuple of the
    experts' Hugging Face names."""
    dim, experts, width = config["dim"], config["experts"], config["moe_hidden_dim"]
    router, names = MOE_TENSORS[config["architecture"]]
    layer_prefix = f"{prefix}layers.{layer}."
    entries = {layer_prefix + router: (f"layers.{layer}.router", (experts, dim), True)}
    for short, shape in (("w1", (experts * width, dim)), ("w3", (experts * width, dim)),
                         ("w2", (experts * dim, width))):
        key = tuple(layer_prefix + names[short].format(expert=e) for e in range(experts))
        entries[key] = (f"layers.{layer}.experts.{short}", shape, False)
    return entries


class StackedExperts:
    """The experts' tensors of one stacked matrix, expert after expert (rows of expert e
    follow those of e - 1): a source for the writer, like a safetensors TensorInfo."""

    def __init__(self, infos, shape):
        self.infos = infos
        self.name = infos[0].name.replace(".0.", ".*.", 1)
        self.shape, self.dtype, self.path = shape, infos[0].dtype, infos[0].path

    def f32_blocks(self):
        for info in self.infos:
            yield from safetensors_f32_blocks(info)


class NormPlusOne:
    """A Gemma norm weight w of a checkpoint as the multiplier 1 + w (float32, as
    transformers computes it) that barellm files store: a source for the writer, like a
    safetensors TensorInfo."""

    def __init__(self, info):
        self.info = info
        self.name, self.shape, self.dtype, self.path = info.name, info.shape, info.dtype, info.path

    def f32_blocks(self):
        for values in safetensors_f32_blocks(self.info):
            yield np.float32(1) + values


class RowSelection:
    """Rows `rows` (in that order) of a safetensors tensor, as a tensor of their own: a
    source for the writer, like a safetensors TensorInfo."""

    def __init__(self, info, rows, name):
        self.info, self.rows, self.name = info, np.asarray(rows), name
        self.shape = (len(self.rows),) + tuple(info.shape[1:])
        self.dtype, self.path = info.dtype, info.path

    def f32_blocks(self):
        try:
            source = st.map_tensor(self.info)
        except (OSError, ValueError) as e:
            raise ConvertError(f"{os.path.basename(self.path)}: cannot map tensor "
                               f"'{self.info.name}' ({e})") from None
        step = max(1, CHUNK_ELEMENTS // max(1, math.prod(self.shape[1:])))
        for start in range(0, len(self.rows), step):
            block = np.ascontiguousarray(source[self.rows[start:start + step]])
            yield dtypes.to_f32(block, self.dtype)


# Phi-3's fused matrices: qkv_proj holds the rows of q, k then v; gate_up_proj those of the
# gate, then the up projection.
PHI3_QKV, PHI3_GATE_UP = "self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight"


def split_phi3(config, tensors, prefix=TEXT_LAYOUT.prefix):
    """The checkpoint's tensors with Phi-3's fused matrices split into Llama's (q_proj,
    k_proj, v_proj, gate_proj, up_proj: RowSelections), the rows of each q and k head put in
    barellm's order for a partial rotary (rotary.py)."""
    head_dim, dim, hidden = config["head_dim"], config["dim"], config["hidden_dim"]
    q_rows, kv_rows = config["heads"] * head_dim, config["kv_heads"] * head_dim
    order = rotary.partial_rotary_order(head_dim, config.get("rotary_dim", head_dim))
    tensors = dict(tensors)
    for layer in range(config["layers"]):
        p = f"{prefix}layers.{layer}."
        parts = {PHI3_QKV: ((q_rows + 2 * kv_rows, dim), {
                     "self_attn.q_proj.weight": rotary.head_rows(q_rows, head_dim, order),
                     "self_attn.k_proj.weight": q_rows + rotary.head_rows(kv_rows, head_dim,
                                                                          order),
                     "self_attn.v_proj.weight": q_rows + kv_rows + np.arange(kv_rows)}),
                 PHI3_GATE_UP: ((2 * hidden, dim), {
                     "mlp.gate_proj.weight": np.arange(hidden),
                     "mlp.up_proj.weight": hidden + np.arange(hidden)})}
        for fused, (shape, pieces) in parts.items():
            info = tensors.pop(p + fused, None)
            if info is None:
                raise ConvertError(f"missing tensors: {p + fused}")
            if info.shape != shape:
                raise ConvertError(f"tensor '{p + fused}' has shape {list(info.shape)}, "
                                   f"expected {list(shape)}")
            for name, rows in pieces.items():
                tensors[p + name] = RowSelection(info, rows, f"{p + fused} ({name})")
    return tensors


def checkpoint_layout(cfg, tensors):
    """The Layout of the checkpoint's tensors: TEXT_LAYOUT, or for a multimodal Gemma 3
    config the one whose embedding the checkpoint holds."""
    if cfg.get("model_type") != "gemma3":
        return TEXT_LAYOUT
    for layout in MULTIMODAL_LAYOUTS:
        if f"{layout.prefix}embed_tokens.weight" in tensors:
            return layout
    return MULTIMODAL_LAYOUTS[0]  # tensor_plan names what is missing


def skipped_note(layout, tensors):
    """The stderr line naming the tensors of other parts than the language model (a
    vision tower), which are not converted; None when there are none."""
    skipped = sorted(name for name in tensors if name.startswith(layout.skipped))
    if not skipped:
        return None
    parts = sorted({name.split(".")[1 if name.startswith("model.") else 0]
                    for name in skipped})
    return (f"note: {len(skipped)} tensors of the {' and '.join(parts)} are not converted "
            "(barellm runs the language model only, on text)")


def name_list(names):
    """Quote up to five names, then say how many more there are."""
    shown = ", ".join(names[:5])
    return shown + (f" (and {len(names) - 5} more)" if len(names) > 5 else "")


def tensor_plan(config, tensors, layout=TEXT_LAYOUT):
    """Check the checkpoint holds exactly the expected tensors (under `layout`, whose
    skipped parts are left out) with the right shapes and dtypes; return [(barellm name,
    source, is_norm)] in output order, the source a TensorInfo, or NormPlusOne for a
    Gemma norm."""
    expected = expected_tensors(config, layout)
    if layout.skipped:
        tensors = {name: info for name, info in tensors.items()
                   if not name.startswith(layout.skipped)}
    # Each expert's tensor on its own (a stacked matrix's key is the tuple of them).
    names = dict.fromkeys(part for key in expected
                          for part in (key if isinstance(key, tuple) else (key,)))
    biases = sorted(n for n in tensors if n.endswith(".bias") and n not in names)
    if biases:
        raise ConvertError(f"bias tensors are not supported: {name_list(biases)}")
    missing = [n for n in names if n not in tensors]
    if missing:
        hint = " (tie_word_embeddings is false)" if "lm_head.weight" in missing else ""
        raise ConvertError(f"missing tensors: {name_list(missing)}{hint}")
    ignored = {layout.lm_head} if config["tied_embeddings"] else set()
    extra = sorted(n for n in tensors if n not in names and n not in ignored
                   and not n.endswith(IGNORED_SUFFIXES))
    if extra:
        raise ConvertError(f"unexpected tensors: {name_list(extra)}")
    plan = []
    for hf_name, (name, shape, is_norm) in expected.items():
        if isinstance(hf_name, tuple):
            plan.append((name, stacked_experts(tensors, hf_name, shape), is_norm))
            continue
        info = tensors[hf_name]
        if info.shape != shape:
            raise ConvertError(f"tensor '{hf_name}' has shape {list(info.shape)}, "
                               f"expected {list(shape)}")
        if info.dtype not in dtypes.STORAGE and not isinstance(info, gpt_oss.Mxfp4Experts):
            raise ConvertError(f"tensor '{hf_name}' has dtype {info.dtype} "
                               "(only F32, F16 and BF16 are supported)")
        if is_norm and config["architecture"] in GEMMA_ARCHITECTURES:
            info = NormPlusOne(info)
        plan.append((name, info, is_norm))
    return plan


def stacked_experts(tensors, names, shape):
    """The StackedExperts source of the experts' tensors `names` (one per expert), which
    together have `shape`; each must have an expert's part of it and a float dtype."""
    part = (shape[0] // len(names), shape[1])
    for name in names:
        info = tensors[name]
        if info.shape != part:
            raise ConvertError(f"tensor '{name}' has shape {list(info.shape)}, expected "
                               f"{list(part)}")
        if info.dtype not in dtypes.STORAGE:
            raise ConvertError(f"tensor '{name}' has dtype {info.dtype} "
                               "(only F32, F16 and BF16 are supported)")
    return StackedExperts([tensors[name] for name in names], shape)


def default_weight_dtype(cfg, plan):
    """The checkpoint's own matrix dtype; else its torch_dtype; else F16."""
    kinds = {info.dtype for _, info, is_norm in plan if not is_norm}
    if len(kinds) == 1:
        return kinds.pop()
    return dtypes.TORCH_NAMES.get(cfg.get("torch_dtype", cfg.get("dtype")), "F16")


def safetensors_f32_blocks(info):
    """Yield the safetensors tensor `info` as float32 row blocks."""
    try:
        source = st.map_tensor(info)
    except (OSError, ValueError) as e:
        raise ConvertError(f"{os.path.basename(info.path)}: cannot map tensor "
                           f"'{info.name}' ({e})") from None
    for block in st.row_blocks(source, CHUNK_ELEMENTS):
        yield dtypes.to_f32(block, info.dtype)


def f32_blocks(info):
    """Yield the tensor `info` as float32 row blocks, refusing NaN/Inf. `info` is a
    safetensors TensorInfo or a source with its own f32_blocks() (gguf_in.GGUFTensor)."""
    blocks = info.f32_blocks() if hasattr(info, "f32_blocks") else safetensors_f32_blocks(info)
    for values in blocks:
        if not np.isfinite(values).all():
            kind = "NaN" if np.isnan(values).any() else "Inf"
            raise ConvertError(f"tensor '{info.name}' contains {kind} values")
        yield values


def write_tensor(out, info, out_dtype):
    """Stream one tensor through `out` (a parallel.BlockWriter) converted to `out_dtype`,
    refusing NaN/Inf and values that overflow the output dtype."""
    for values in f32_blocks(info):
        converted = dtypes.from_f32(values, out_dtype)
        if dtypes.non_finite(converted, out_dtype).any():
            raise ConvertError(
                f"tensor '{info.name}' has values beyond the {out_dtype} range "
                f"(max |x| = {np.abs(values).max():g}); choose another --dtype")
        out.write(converted)


# Matrix types stored as values and f16 scales (NAME and NAME.scale) -> the kind of
# quantized_blocks; the quantizers of a uniform file (Q8, Q4: dtypes.py) and of a file of
# per-matrix types (Q8_0 by ggml's rule: such files reproduce llama.cpp's mixes).
SCALED_TYPES = {"Q8_0": "Q8", "Q4_0": "Q4"}
UNIFORM_QUANTIZERS = {"Q8_0": dtypes.quantize_q8, "Q4_0": dtypes.quantize_q4}
MIXED_QUANTIZERS = {"Q8_0": kquants.quantize_q8_0, "Q4_0": dtypes.quantize_q4}
# File order by dtype: 4-byte elements, 2-byte elements, then U8 (whose tensors all have
# an even byte count), then I8 (docs/FORMAT.md).
FILE_ORDER = {"F32": 0, "F16": 1, "BF16": 1, "U8": 2, "I8": 3}


def quantized_blocks(info, kind, quantize):
    """Yield the matrix `info` as row blocks of `kind` ("Q8": int8 values, "Q4": packed
    u8 values; f16 scales): the source's own where it has them (a GGUF Q8_0 or Q4_0
    tensor, copied bit for bit), else quantized from its float32 values by `quantize`."""
    own = info.quantized_blocks(kind) if hasattr(info, "quantized_blocks") else None
    if own is not None:
        yield from own
        return
    for values in f32_blocks(info):
        quantized, scales = quantize(values)
        if not np.isfinite(scales).all():
            raise ConvertError(
                f"tensor '{info.name}' has values beyond the {kind} range "
                f"(max |x| = {np.abs(values).max():g}, scale over the F16 maximum); "
                "choose another --dtype")
        yield quantized, scales


def write_quantized_tensor(values_out, scales_out, info, kind, quantize):
    """Stream one matrix as `kind` ("Q8": I8 values; "Q4": packed U8 values): its values
    through `values_out` and its F16 scales through `scales_out` (parallel.BlockWriters at
    the two parts' places in the file), block by block in one pass over the source."""
    for quantized, scales in quantized_blocks(info, kind, quantize):
        values_out.write(quantized)
        scales_out.write(scales.astype("<f2", copy=False))


def write_block_tensor(out, info, type_name):
    """Stream one matrix of the block type `type_name` through `out`: the source's own
    rows of blocks where it has them (a GGUF tensor of that type, byte for byte), else
    its float32 values quantized by llama.cpp's rule for the type (kquants.py)."""
    own = info.block_rows(type_name) if hasattr(info, "block_rows") else None
    if own is not None:
        for rows in own:
            out.write(rows)
        return
    for values in f32_blocks(info):
        rows = kquants.quantize(values, type_name)
        if rows is None:
            raise ConvertError(
                f"tensor '{info.name}' has values beyond the {type_name} range (max |x| = "
                f"{np.abs(values).max():g}, a scale over the F16 maximum); choose another "
                "--dtype")
        out.write(rows)


def tensor_task(fd, name, info, stored, places, quantizers):
    """The task (for parallel.run_tasks) that writes the tensor `name`, stored as `stored`
    (a matrix type of blocks.py, or F32 for a vector), and its scales if it has any, at
    their places in the open file `fd`: `places` maps each output tensor's name to its
    [start, end) in the file; `quantizers` are those of SCALED_TYPES. A part that does not
    end where the next begins is an error (the file is sized in advance: a short part
    would leave zeros unnoticed)."""
    parts = [name] + ([name + ".scale"] if stored in SCALED_TYPES else [])

    def task(stopping):
        out = [parallel.BlockWriter(fd, places[part][0], stopping) for part in parts]
        if stored in SCALED_TYPES:
            write_quantized_tensor(out[0], out[1], info, SCALED_TYPES[stored],
                                   quantizers[stored])
        elif stored in blocks.BLOCK_TYPES:
            write_block_tensor(out[0], info, stored)
        else:
            write_tensor(out[0], info, stored)
        for part, writer in zip(parts, out):
            if writer.offset != places[part][1]:
                raise ConvertError(f"tensor '{part}': {writer.offset - places[part][0]} bytes "
                                   f"written, {places[part][1] - places[part][0]} expected")
    return task


def uniform_types(plan, weight_dtype):
    """{matrix name: type} of a uniform file of `weight_dtype`."""
    return {name: blocks.uniform_matrix_type(weight_dtype, info.shape[1])
            for name, info, is_norm in plan if not is_norm}


def q4_f16_note(plan):
    """The stderr line naming the matrices a Q4 file keeps in F16, or None."""
    kept = sorted({f"{name.split('.')[-1]} ({info.shape[1]} columns)"
                   for name, info, is_norm in plan
                   if not is_norm and blocks.uniform_matrix_type("Q4", info.shape[1]) == "F16"})
    if not kept:
        return None
    return (f"convert: note: q4 stores in F16 the matrices whose columns are not a multiple "
            f"of {dtypes.Q4_BLOCK}: {name_list(kept)}")


def header_entries(plan, types):
    """(name, dtype, shape) of every output tensor in file order; `types` maps each matrix
    to its type (blocks.py).

    A Q8_0 matrix NAME is an I8 tensor NAME plus an F16 tensor NAME.scale; a Q4_0 one a
    U8 tensor NAME [rows, cols / 2] plus NAME.scale; one of a block type a U8 tensor
    [rows, bytes of a row of blocks]. File order (FILE_ORDER) puts tensors of 4-byte
    elements first, then those of 2-byte elements, then U8, then I8, each class in model
    order. As the data section starts at a multiple of 64 bytes and every U8 tensor has an
    even size, every tensor then starts at a multiple of its element size, and every block
    tensor at an even offset (docs/FORMAT.md)."""
    entries = []
    for name, info, is_norm in plan:
        kind = "F32" if is_norm else types[name]
        if kind in SCALED_TYPES or kind in blocks.BLOCK_TYPES:
            rows, cols = info.shape
            if kind == "Q8_0":
                entries.append((name, "I8", info.shape))
                entries.append((name + ".scale", "F16", (rows, dtypes.q8_groups(cols))))
            elif kind == "Q4_0":
                entries.append((name, "U8", (rows, cols // 2)))
                entries.append((name + ".scale", "F16", (rows, cols // dtypes.Q4_BLOCK)))
            else:
                entries.append((name, "U8", (rows, blocks.row_bytes(kind, cols))))
        else:
            entries.append((name, kind, info.shape))
    # sorted() is stable: model order within each class.
    return sorted(entries, key=lambda entry: FILE_ORDER[entry[1]])


def write_output(path, plan, metadata, types, quantizers, barellm):
    """Write the barellm file through a temporary file in the output's directory,
    renamed into place only once complete and loaded by the program `barellm` (None:
    unchecked); the temporary file never survives. `types` maps each matrix to its type,
    `quantizers` are those of SCALED_TYPES.

    Each tensor is converted in one pass over its source and written at its place in the
    file layout (header_entries), several tensors at a time (parallel.run_tasks)."""
    entries = header_entries(plan, types)
    header, data_bytes = st.encode_header(entries, metadata, ALIGNMENT)
    places = {name: (len(header) + begin, len(header) + end)
              for name, (begin, end) in st.data_offsets(entries).items()}
    refuse_output_in_place_of(path)
    tmp = None
    try:
        with stop_signals_held():  # a signal right after mkstemp still finds `tmp` set
            fd, tmp = tempfile.mkstemp(prefix=".barellm-", suffix=".tmp",
                                       dir=os.path.dirname(os.path.abspath(path)))
        with os.fdopen(fd, "wb") as f:
            os.ftruncate(f.fileno(), len(header) + data_bytes)
            parallel.pwrite_all(f.fileno(), header, 0)
            parallel.run_tasks([
                tensor_task(f.fileno(), name, info, "F32" if is_norm else types[name],
                            places, quantizers)
                for name, info, is_norm in plan])
        os.chmod(tmp, umask_applied(0o666))
        if barellm is not None:
            barellm_check.check_loads(barellm, tmp, path)
        os.replace(tmp, path)
    except OSError as e:
        raise ConvertError(f"cannot write output '{path}': {e.strerror}") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return len(header) + data_bytes


def read_checkpoint(hf_dir, output, weight_dtype):
    """(config, tokenizer.json, chat template or None, plan, matrix types, note) of the
    Hugging Face checkpoint in `hf_dir`, the config's weight_dtype `weight_dtype` or the
    checkpoint's own; the note names the tensors not converted (a vision tower), or is
    None."""
    cfg = json_object(os.path.join(hf_dir, "config.json"), required=True)
    gen = json_object(os.path.join(hf_dir, "generation_config.json"), required=False)
    tok_cfg = json_object(os.path.join(hf_dir, "tokenizer_config.json"), required=False)
    check_architecture(cfg)
    config = model_config(language_model_config(cfg), gen)
    tokenizer, from_sentencepiece = hf_tokenizer.load_tokenizer(hf_dir)
    hf_tokenizer.check_supported(tokenizer)
    check_token_ids(config, tokenizer)
    config["add_bos"] = hf_tokenizer.add_bos(tok_cfg, tokenizer, from_sentencepiece)
    if config["add_bos"] and config["bos_id"] is None:
        config["bos_id"] = hf_tokenizer.bos_id(hf_dir, tok_cfg, tokenizer)
        if config["bos_id"] is None:
            raise ConvertError("the tokenizer adds BOS but no BOS id is known: config.json "
                               "has no bos_token_id, and neither tokenizer_config.json's "
                               "bos_token nor tokenizer.model names one")
    tensors = st.open_checkpoint(hf_dir)
    refuse_output_among_inputs(output, [os.path.join(hf_dir, name) for name in SIDE_FILES] +
                               sorted({info.path for info in tensors.values()}))
    layout = checkpoint_layout(cfg, tensors)
    if config["architecture"] == "phi3":
        tensors = split_phi3(config, tensors)
    if config["architecture"] == "gpt_oss":
        tensors = gpt_oss.split_experts(config, tensors, layout.prefix)
    plan = tensor_plan(config, tensors, layout)
    if weight_dtype is None and gpt_oss.is_mxfp4(plan):
        # MXFP4 experts are kept as they are, the other matrices in their own dtype.
        config["weight_dtype"] = gguf_in.UNKNOWN_MIX
        types = gpt_oss.own_types(plan)
    else:
        config["weight_dtype"] = weight_dtype or default_weight_dtype(
            language_model_config(cfg), plan)
        types = requested_types(config, plan)
    return config, tokenizer, hf_tokenizer.chat_template(hf_dir, tok_cfg), plan, types, \
        skipped_note(layout, tensors)


def requested_types(config, plan):
    """{matrix name: type} for the config's weight_dtype: a uniform one, or a mix of
    llama-quantize's (mixes.py)."""
    if config["weight_dtype"] in mixes.MIXES:
        return mixes.matrix_types(config["weight_dtype"], config, plan)
    return uniform_types(plan, config["weight_dtype"])


def read_gguf(path, output, weight_dtype):
    """(config, tokenizer.json, chat template or None, plan, matrix types, note) of the
    GGUF file `path` (gguf_in.py).

    With `weight_dtype` None every matrix keeps its own type: the file is uniform when
    one weight_dtype stores them all exactly, else it has per-matrix types, named after
    the GGUF's file type, and the matrices of types barellm does not run are dequantized
    to F16; the note names those. Else the matrices take `weight_dtype` (a uniform one or
    a mix), copied bit for bit where their GGUF type is already the one chosen; with a
    uniform one the note names the matrices that change type (None when none does)."""
    refuse_output_among_inputs(output, [path])
    model = gguf_in.GGUFModel(path)
    config = model.config()
    vocabulary = model.vocabulary(config["vocab_size"])
    config.update(add_bos=vocabulary.add_bos, bos_id=vocabulary.bos_id,
                  eos_ids=vocabulary.eos_ids)
    hf_tokenizer.check_supported(vocabulary.tokenizer)
    check_token_ids(config, vocabulary.tokenizer)
    expected = {name: (shape, is_norm)
                for name, shape, is_norm in expected_tensors(config).values()}
    plan = model.plan(config, expected)
    template = model.keys.string("tokenizer.chat_template")
    if weight_dtype is None:
        config["weight_dtype"] = gguf_in.uniform_weight_dtype(plan)
        if config["weight_dtype"] is None:
            config["weight_dtype"] = model.mix_name()
            return (config, vocabulary.tokenizer, template, plan, gguf_in.kept_types(plan),
                    gguf_in.dequantized_note(plan))
    else:
        config["weight_dtype"] = weight_dtype
    note = (None if weight_dtype in mixes.MIXES
            else gguf_in.changed_types_note(plan, config["weight_dtype"]))
    return config, vocabulary.tokenizer, template, plan, requested_types(config, plan), note


def convert(source, output, weight_dtype=None, barellm=None):
    """Convert `source`, a Hugging Face checkpoint directory or a GGUF file, to the
    barellm file `output`.

    `weight_dtype` is "F32", "F16", "BF16", "Q8", "Q4", a mix of mixes.MIXES, or None
    for the source's own dtype (a GGUF file's own types; with Q4, a note naming the
    matrices kept in F16 goes to stderr).
    `barellm` is the program that must load the file before it is put in place (None:
    no check). Returns a one-line summary; a note on what changed type goes to stderr once
    the file is written.
    """
    if os.path.isdir(source):
        config, tokenizer, template, plan, types, note = read_checkpoint(source, output,
                                                                         weight_dtype)
    elif os.path.isfile(source):
        config, tokenizer, template, plan, types, note = read_gguf(source, output,
                                                                   weight_dtype)
    else:
        raise ConvertError(f"{source}: not a directory or a GGUF file")
    metadata = {"barellm.format": "1", "barellm.config": compact_json(config),
                "barellm.tokenizer": compact_json(tokenizer)}
    if template is not None:
        metadata["barellm.chat_template"] = template
    uniform = config["weight_dtype"] in blocks.UNIFORM_TYPES
    if not uniform:
        metadata["barellm.matrix_types"] = compact_json(types)
    size = write_output(output, plan, metadata, types,
                        UNIFORM_QUANTIZERS if uniform else MIXED_QUANTIZERS, barellm)
    if note:
        print(f"convert: {note}", file=sys.stderr)
    q4_note = q4_f16_note(plan) if config["weight_dtype"] == "Q4" else None
    if q4_note:
        print(q4_note, file=sys.stderr)
    return (f"wrote {output}: {config['layers']} layers, dim {config['dim']}, vocab "
            f"{config['vocab_size']}, {config['weight_dtype']} weights, "
            f"{size / 2**20:.1f} MiB")


def parse_args(argv):
    """Command-line arguments."""
    parser = OneLineParser(
        prog="convert.py",
        description="Convert a Hugging Face Llama/Mistral/Qwen2/Qwen3/Gemma 2/Gemma 3/Mixtral/"
        "Qwen3-MoE/gpt-oss checkpoint or a llama.cpp GGUF file to a barellm file.")
    parser.add_argument("source", help="Hugging Face checkpoint directory, or GGUF file")
    parser.add_argument("-o", "--output", required=True, help="barellm file to write")
    parser.add_argument("--dtype", choices=sorted(dtypes.CLI_NAMES) + sorted(mixes.CLI_NAMES),
                        help="matrix dtype (default: the checkpoint's own; for a GGUF "
                        "file, each matrix's own type where barellm runs it, else f16); "
                        "q8 is int8 with one f16 scale per 32 columns of a row; q4 is "
                        "llama.cpp's Q4_0 (4-bit, one f16 scale per 32 columns), f16 for "
                        "matrices whose columns are not a multiple of 32; q2_k, q3_k_s, "
                        "q3_k_m, q3_k_l, q4_k_m, q5_k_m, q6_k, iq4_xs and iq4_nl are "
                        "llama-quantize's mixes of those names (a type per matrix)")
    parser.add_argument("--barellm", metavar="PATH",
                        help="the barellm program that loads the output before it is put in "
                        "place, so that a file barellm refuses is never written (default: "
                        f"${barellm_check.ENVIRONMENT_VARIABLE}, else build/barellm; when that "
                        "is not built, the output is written unchecked, with a warning)")
    return parser.parse_args(argv)


def main(argv=None):
    """CLI entry point; returns the exit status."""
    args = parse_args(argv)
    try:
        barellm = barellm_check.find_binary(args.barellm)
        weight_dtype = dtypes.CLI_NAMES.get(args.dtype) or mixes.CLI_NAMES.get(args.dtype)
        print(convert(args.source, args.output, weight_dtype, barellm))
    except ConvertError as e:
        print(f"convert: {e}", file=sys.stderr)
        return 1
    if barellm is None:
        print(barellm_check.unchecked_warning(args.output), file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main(main, "convert")
