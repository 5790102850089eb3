#!/usr/bin/env python3
"""Independent numpy reference of the Llama forward pass.

Computes what transformers' LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM /
Qwen3ForCausalLM / Phi3ForCausalLM / Gemma2ForCausalLM / Gemma3ForCausalLM /
MixtralForCausalLM / Qwen3MoeForCausalLM compute (with the weights upcast, math in float64):
RMSNorm, rotate-half RoPE (default, linear, llama3 and YaRN scaling), grouped-query causal
attention (Mistral's sliding window, Qwen2's q/k/v biases, Qwen3's per-head q/k RMSNorm
before RoPE, a sliding window on the layers from max_window_layers on), SwiGLU MLP, tied or
separate output projection. Gemma 3 changes: the embedding times sqrt(dim); every RMSNorm x
* (1 + w) (the Hugging Face weights hold w; a barellm file holds 1 + w and says nothing, its
norms are plain); the attention and MLP outputs RMS-normed before the residual add; GeGLU
(GELU, tanh approximation); per-head q/k RMSNorm; scores scaled by
query_pre_attn_scalar^-1/2; sliding and full layers in the config's pattern, the sliding
ones with RoPE base rope_local_base_freq and no scaling. Gemma 2: as Gemma 3 without the q/k
norms and the local RoPE base, every other layer sliding, and the scores (after their scale)
and the logits soft-capped, cap * tanh(x / cap), with attn_logit_softcapping and
final_logit_softcapping. Mixtral and Qwen3-MoE (a mixture of experts in place of the MLP of
their sparse layers): the router's logits, a softmax over all experts, the experts_per_token
most probable (an exact tie to the lower index), their probabilities rescaled to sum to 1
(Mixtral always, Qwen3-MoE with norm_topk_prob), and the sum of those experts' SwiGLU MLPs
weighted by them (Mixtral's softmax over the chosen logits is this renormalised softmax over
all). gpt-oss: every layer a mixture of experts whose router adds a bias before the
routing (the softmax over the k largest logits: the renormalised one above), each expert
adding biases to its gate, up and down projections and computing the clamped SwiGLU
g sigmoid(1.702 g) (u + 1), g = min(gate, limit), u = clamp(up, -limit, limit); attention
with q/k/v/o biases and a sink per head (one more logit in the softmax, not scaled, whose
value is zero); sliding and full layers from layer_types; YaRN. Its experts are fused in
the checkpoint (gate_up_proj [experts, dim, 2 H] used as x @ W, the gate in its even
columns, the up projection in its odd ones), or MXFP4 blocks of 32 weights (an E8M0 scale
byte, weight 2j in the low nibble of byte j, 2j + 1 in its high one). Phi-3: q, k, v and
the gate and up projections split from its fused matrices; RoPE on the first
int(head_dim * partial_rotary_factor) elements of each head (rotate-half among them),
LongRoPE's long factors where the sequence is longer than the original context, else
its short ones, and cos and sin times its attention factor; a window on every layer where
sliding_window is set. A barellm file's rotary_dim is its own layout (docs/FORMAT.md):
rotate-half over the whole head, the pairs past rotary_dim / 2 unrotated. It shares no code
with convert/: it has its own safetensors reader and reads either a Hugging Face directory
or a barellm file; a barellm Q8 matrix (I8 values NAME, F16 scales NAME.scale per 32 columns
of a row) is dequantized to value * scale, and a Q4 matrix (U8 NAME holding two 4-bit q per
byte, F16 scales per block of 32 columns) to scale * (q - 8), so the reference of a Q8 or Q4
file is the model it stores.

    python3 reference/model.py PATH (--ids 1,2,3 | --text "Once upon a time")
                               [--generate N] [--top K]

Library use: logits_for(path, token_ids) -> np.ndarray [len(token_ids), vocab_size].
"""

import argparse
import glob
import json
import math
import os
import struct
import sys

import numpy as np

HF_LAYER_NAMES = {
    "attn_norm": "input_layernorm.weight", "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight", "wv": "self_attn.v_proj.weight",
    "wo": "self_attn.o_proj.weight", "ffn_norm": "post_attention_layernorm.weight",
    "w1": "mlp.gate_proj.weight", "w3": "mlp.up_proj.weight", "w2": "mlp.down_proj.weight",
}
# Tensors only some models have (Qwen2: q/k/v biases; Qwen3: q/k norms; attention_bias:
# q/k/v/o biases), taken when the checkpoint holds them.
HF_OPTIONAL_LAYER_NAMES = {
    "bq": "self_attn.q_proj.bias", "bk": "self_attn.k_proj.bias",
    "bv": "self_attn.v_proj.bias", "bo": "self_attn.o_proj.bias",
    "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
}


def read_safetensors(path):
    """Read a whole safetensors file: ({name: float32 array}, metadata dict)."""
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    metadata = header.pop("__metadata__", {})
    base = 8 + header_len
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        raw = data[base + begin:base + end]
        if entry["dtype"] == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            values = bits.view(np.float32)
        else:
            values = np.frombuffer(raw, dtype={"F32": "<f4", "F16": "<f2",
                                               "I8": "i1", "U8": "u1"}[entry["dtype"]])
        tensors[name] = values.astype(np.float32).reshape(entry["shape"])
    return tensors, metadata


# Gemma 3's layers: the four norms (HF's post_attention_layernorm normalises the attention
# OUTPUT, barellm's post_attn_norm; pre_feedforward_layernorm is barellm's ffn_norm) and q/k
# norms, besides the projections; Gemma 2's the same without the q/k norms.
GEMMA3_LAYER_NAMES = {
    "attn_norm": "input_layernorm.weight", "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight", "wv": "self_attn.v_proj.weight",
    "wo": "self_attn.o_proj.weight", "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight", "post_attn_norm": "post_attention_layernorm.weight",
    "ffn_norm": "pre_feedforward_layernorm.weight",
    "post_ffn_norm": "post_feedforward_layernorm.weight", "w1": "mlp.gate_proj.weight",
    "w3": "mlp.up_proj.weight", "w2": "mlp.down_proj.weight",
}
# Gemma3TextConfig's and Gemma2Config's defaults, for the fields a config.json may leave out
# (Gemma 2 slides every other layer from layer 0: a pattern of 2).
GEMMA3_DEFAULTS = {
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
    "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "sliding_window_pattern": 6,
    "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "bos_token_id": 2,
}
GEMMA2_DEFAULTS = {
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
    "rms_norm_eps": 1e-6, "rope_theta": 10_000.0, "query_pre_attn_scalar": 256,
    "sliding_window": 4096, "sliding_window_pattern": 2,
    "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "bos_token_id": 2,
    "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
}


# A sparse layer's router and each expert's matrices ({expert}: its index) in a Mixtral and a
# Qwen3-MoE checkpoint, by barellm name.
HF_MOE_NAMES = {
    "mixtral": ("block_sparse_moe.gate.weight",
                {"w1": "block_sparse_moe.experts.{expert}.w1.weight",
                 "w3": "block_sparse_moe.experts.{expert}.w3.weight",
                 "w2": "block_sparse_moe.experts.{expert}.w2.weight"}),
    "qwen3_moe": ("mlp.gate.weight",
                  {"w1": "mlp.experts.{expert}.gate_proj.weight",
                   "w3": "mlp.experts.{expert}.up_proj.weight",
                   "w2": "mlp.experts.{expert}.down_proj.weight"}),
}


def hf_experts(hf):
    """The mixture-of-experts part of the reference config of a Mixtral or Qwen3-MoE
    config.json (transformers' defaults for absent keys), {} for another model."""
    if hf["model_type"] == "mixtral":
        return {"experts": hf.get("num_local_experts", 8),
                "experts_per_token": hf.get("num_experts_per_tok", 2),
                "moe_hidden_dim": hf["intermediate_size"], "norm_topk_prob": True}
    if hf["model_type"] != "qwen3_moe":
        return {}
    layers, step = hf["num_hidden_layers"], hf.get("decoder_sparse_step", 1)
    only_mlp = hf.get("mlp_only_layers") or []
    return {"experts": hf.get("num_experts", 128),
            "experts_per_token": hf.get("num_experts_per_tok", 8),
            "moe_hidden_dim": hf.get("moe_intermediate_size", 768),
            "norm_topk_prob": hf.get("norm_topk_prob", False),
            "dense_layers": [layer for layer in range(layers)
                             if layer in only_mlp or (layer + 1) % step != 0]}


def is_sparse(config, layer):
    """Whether `layer`'s MLP is a mixture of experts."""
    return bool(config.get("experts")) and layer not in config.get("dense_layers", [])


def phi3_rope(hf, head_dim):
    """(rotary_dim, rope_scaling) of a Phi-3 config as transformers computes them:
    int(head_dim * partial_rotary_factor) rotated elements; LongRoPE ("longrope", or "su" and
    "yarn", which Phi3Config renames) with transformers' default attention factor
    sqrt(1 + ln(factor) / ln(original)), factor = max_position_embeddings / original."""
    params = hf.get("rope_parameters") or {}
    partial = hf.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0))
    rotary_dim = int(head_dim * partial)
    scaling = hf.get("rope_scaling") or params
    if scaling.get("rope_type", scaling.get("type")) not in ("longrope", "su", "yarn"):
        return rotary_dim, None
    # The config's own original_max_position_embeddings (Phi3Config's default 4096) has
    # priority over rope_scaling's, as transformers reads them.
    original = hf.get("original_max_position_embeddings", 4096)
    factor = scaling.get("factor") or hf.get("max_position_embeddings", 4096) / original
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        attention_factor = (1.0 if factor <= 1 else
                            math.sqrt(1 + math.log(factor) / math.log(original)))
    return rotary_dim, {"rope_type": "longrope", "short_factor": scaling["short_factor"],
                        "long_factor": scaling["long_factor"],
                        "original_max_position_embeddings": original,
                        "attention_factor": attention_factor}


def hf_yarn(hf, scaling):
    """YaRN's settings as transformers reads them: the config's own
    original_max_position_embeddings before rope_scaling's, then max_position_embeddings;
    beta_fast 32 and beta_slow 1 where absent or 0; the attention factor given, else
    mscale / mscale_all_dim's, else 0.1 ln(factor) + 1 (1 for a factor up to 1)."""
    factor = scaling["factor"]

    def mscale(m=1.0):
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention_factor = mscale(m) / mscale(m_all) if m and m_all else mscale()
    original = hf.get("original_max_position_embeddings",
                      scaling.get("original_max_position_embeddings",
                                  hf.get("max_position_embeddings")))
    return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original,
            "beta_fast": scaling.get("beta_fast") or 32, "beta_slow": scaling.get("beta_slow") or 1,
            "truncate": scaling.get("truncate", True), "attention_factor": attention_factor}


def split_phi3(raw, config):
    """Phi-3's fused matrices as Llama's: qkv_proj's rows are q, k then v; gate_up_proj's
    the gate then the up projection."""
    q_rows = config["heads"] * config["head_dim"]
    kv_rows = config["kv_heads"] * config["head_dim"]
    for layer in range(config["layers"]):
        prefix = f"model.layers.{layer}."
        qkv = raw.pop(prefix + "self_attn.qkv_proj.weight")
        raw[prefix + "self_attn.q_proj.weight"] = qkv[:q_rows]
        raw[prefix + "self_attn.k_proj.weight"] = qkv[q_rows:q_rows + kv_rows]
        raw[prefix + "self_attn.v_proj.weight"] = qkv[q_rows + kv_rows:]
        gate, up = np.split(raw.pop(prefix + "mlp.gate_up_proj.weight"), 2)
        raw[prefix + "mlp.gate_proj.weight"], raw[prefix + "mlp.up_proj.weight"] = gate, up


# GptOssConfig's defaults, and the E2M1 values of an MXFP4 nibble.
GPT_OSS_DEFAULTS = {
    "num_local_experts": 128, "num_experts_per_tok": 4, "head_dim": 64,
    "num_key_value_heads": 8, "sliding_window": 128, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False, "swiglu_limit": 7.0, "attention_bias": True,
}
GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096,
                "rope_theta": 150000.0}
FP4_VALUES = [0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6]


def gpt_oss_experts(raw, prefix, name):
    """The fused expert matrix `name` as transformers uses it, x @ W per expert: the float
    tensor, or its MXFP4 `_blocks` [experts, rows, groups, 16] and `_scales` [experts, rows,
    groups] dequantized and transposed to [experts, cols, rows]."""
    if prefix + name in raw:
        return raw[prefix + name]
    blocks = raw[prefix + name + "_blocks"].astype(np.uint8)
    scales = raw[prefix + name + "_scales"].astype(np.int64)
    values = np.zeros(blocks.shape[:-1] + (2 * blocks.shape[-1],))
    values[..., 0::2] = np.array(FP4_VALUES)[blocks & 15]
    values[..., 1::2] = np.array(FP4_VALUES)[blocks >> 4]
    values *= 2.0 ** (scales[..., None] - 127)
    return values.reshape(values.shape[0], values.shape[1], -1).transpose(0, 2, 1)


def load_hf_gpt_oss(hf, raw):
    """(config, weights) of a gpt-oss checkpoint, its fused experts split into barellm's
    stacked w1, w3, w2 and b1, b3, b2."""
    hf = {**GPT_OSS_DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
    rope = hf.get("rope_scaling") or hf.get("rope_parameters") or GPT_OSS_ROPE
    theta = hf.get("rope_theta", rope.get("rope_theta", GPT_OSS_ROPE["rope_theta"]))
    scaling = hf_yarn(hf, rope) if rope.get("rope_type") == "yarn" else None
    layers = hf["num_hidden_layers"]
    kinds = hf.get("layer_types") or ["sliding_attention" if layer % 2 == 0
                                      else "full_attention" for layer in range(layers)]
    config = {
        "architecture": "gpt_oss", "dim": hf["hidden_size"], "layers": layers,
        "heads": hf["num_attention_heads"], "kv_heads": hf["num_key_value_heads"],
        "head_dim": hf["head_dim"], "rope_theta": theta, "rope_scaling": scaling,
        "norm_eps": hf["rms_norm_eps"], "sliding_window": hf["sliding_window"],
        "layer_types": ["sliding" if kind == "sliding_attention" else "full" for kind in kinds],
        "experts": hf["num_local_experts"], "experts_per_token": hf["num_experts_per_tok"],
        "moe_hidden_dim": hf["intermediate_size"], "norm_topk_prob": True,
        "activation": "swiglu_oai", "swiglu_limit": hf["swiglu_limit"],
        "tied_embeddings": hf["tie_word_embeddings"], "bos_id": hf.get("bos_token_id"),
    }
    weights = {"token_embedding": raw["model.embed_tokens.weight"],
               "final_norm": raw["model.norm.weight"]}
    if not config["tied_embeddings"]:
        weights["output"] = raw["lm_head.weight"]
    for layer in range(layers):
        prefix, short = f"model.layers.{layer}.", f"layers.{layer}."
        for name, hf_name in HF_LAYER_NAMES.items():
            if name not in ("w1", "w3", "w2"):
                weights[short + name] = raw[prefix + hf_name]
        for name, hf_name in HF_OPTIONAL_LAYER_NAMES.items():
            if prefix + hf_name in raw:
                weights[short + name] = raw[prefix + hf_name]
        weights[short + "sinks"] = raw[prefix + "self_attn.sinks"]
        weights[short + "router"] = raw[prefix + "mlp.router.weight"]
        weights[short + "router_bias"] = raw[prefix + "mlp.router.bias"]
        experts = prefix + "mlp.experts."
        gate_up = gpt_oss_experts(raw, experts, "gate_up_proj")
        down = gpt_oss_experts(raw, experts, "down_proj")
        weights[short + "experts.w1"] = np.concatenate(gate_up[:, :, 0::2].transpose(0, 2, 1))
        weights[short + "experts.w3"] = np.concatenate(gate_up[:, :, 1::2].transpose(0, 2, 1))
        weights[short + "experts.w2"] = np.concatenate(down.transpose(0, 2, 1))
        biases = raw[experts + "gate_up_proj_bias"]
        weights[short + "experts.b1"] = biases[:, 0::2].reshape(-1)
        weights[short + "experts.b3"] = biases[:, 1::2].reshape(-1)
        weights[short + "experts.b2"] = raw[experts + "down_proj_bias"].reshape(-1)
    return config, weights


def load_hf(hf_dir):
    """Load a Hugging Face checkpoint as (config, weights) with barellm tensor names."""
    with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
        hf = json.load(f)
    raw = {}
    for path in sorted(glob.glob(os.path.join(hf_dir, "*.safetensors"))):
        raw.update(read_safetensors(path)[0])
    if hf["model_type"] in ("gemma2", "gemma3", "gemma3_text"):
        return load_hf_gemma(hf, raw)
    if hf["model_type"] == "gpt_oss":
        return load_hf_gpt_oss(hf, raw)
    dim, heads = hf["hidden_size"], hf["num_attention_heads"]
    model_type = hf["model_type"]
    scaling = hf.get("rope_scaling")
    if scaling and scaling.get("rope_type", scaling.get("type")) == "default":
        scaling = None
    head_dim = hf.get("head_dim") or (128 if model_type == "qwen3" else dim // heads)
    if scaling and scaling.get("rope_type", scaling.get("type")) == "yarn":
        scaling = hf_yarn(hf, scaling)
    rotary = {}
    if model_type == "phi3":
        rotary_dim, scaling = phi3_rope(hf, head_dim)
        # Hugging Face's partial rotary: rotate-half within the first rotary_dim elements.
        rotary = {"rotary_dim": rotary_dim, "rotary_first": True}
    config = {
        "dim": dim, "layers": hf["num_hidden_layers"], "heads": heads,
        "kv_heads": hf.get("num_key_value_heads") or heads,
        "head_dim": head_dim, **rotary,
        **hf_experts(hf),
        "rope_theta": hf.get("rope_theta", 10000.0), "rope_scaling": scaling,
        "norm_eps": hf.get("rms_norm_eps", 1e-6),
        "tied_embeddings": hf.get("tie_word_embeddings", False),
        "bos_id": hf.get("bos_token_id"),
    }
    config["sliding_window"], config["sliding_window_first_layer"] = hf_sliding_window(hf)
    if model_type == "phi3":
        split_phi3(raw, config)
    weights = {"token_embedding": raw["model.embed_tokens.weight"],
               "final_norm": raw["model.norm.weight"]}
    if not config["tied_embeddings"]:
        weights["output"] = raw["lm_head.weight"]
    for layer in range(config["layers"]):
        for short, hf_name in HF_LAYER_NAMES.items():
            if short in ("w1", "w3", "w2") and is_sparse(config, layer):
                continue
            weights[f"layers.{layer}.{short}"] = raw[f"model.layers.{layer}.{hf_name}"]
        if is_sparse(config, layer):
            router, names = HF_MOE_NAMES[model_type]
            prefix = f"model.layers.{layer}."
            weights[f"layers.{layer}.router"] = raw[prefix + router]
            for short, name in names.items():  # stacked as in a barellm file
                weights[f"layers.{layer}.experts.{short}"] = np.concatenate(
                    [raw[prefix + name.format(expert=e)] for e in range(config["experts"])])
        for short, hf_name in HF_OPTIONAL_LAYER_NAMES.items():
            if f"model.layers.{layer}.{hf_name}" in raw:
                weights[f"layers.{layer}.{short}"] = raw[f"model.layers.{layer}.{hf_name}"]
    return config, weights


def load_hf_gemma(hf, raw):
    """(config, weights) of a Gemma 2 or Gemma 3 checkpoint: Gemma2ForCausalLM (gemma2),
    Gemma3ForCausalLM (gemma3_text), or the text part of Gemma3ForConditionalGeneration
    (gemma3: text_config, tensors under language_model.model. or model.language_model.; the
    vision tower's are left unread)."""
    gemma2 = hf["model_type"] == "gemma2"
    if hf["model_type"] == "gemma3":
        tied = hf.get("tie_word_embeddings", True)
        hf = dict(hf.get("text_config") or {}, tie_word_embeddings=tied)
    # A soft-capping key set to null turns it off: it does not take the default.
    given = {key: value for key, value in hf.items()
             if value is not None or key.endswith("_softcapping")}
    hf = dict(GEMMA2_DEFAULTS if gemma2 else GEMMA3_DEFAULTS, **given)
    if hf["hidden_activation"] != "gelu_pytorch_tanh":
        raise ValueError(f"Gemma reference: activation {hf['hidden_activation']!r}")
    prefix = next(p for p in ("model.", "language_model.model.", "model.language_model.")
                  if p + "embed_tokens.weight" in raw)
    layers = hf["num_hidden_layers"]
    if "layer_types" in hf:
        sliding = [kind == "sliding_attention" for kind in hf["layer_types"]]
    else:
        sliding = [(layer + 1) % hf["sliding_window_pattern"] != 0 for layer in range(layers)]
    scaling = hf.get("rope_scaling")
    if scaling and scaling.get("rope_type", scaling.get("type")) == "default":
        scaling = None
    config = {
        "architecture": "gemma2" if gemma2 else "gemma3", "dim": hf["hidden_size"],
        "layers": layers, "heads": hf["num_attention_heads"],
        "kv_heads": hf["num_key_value_heads"], "head_dim": hf["head_dim"],
        "rope_theta": hf["rope_theta"], "rope_scaling": scaling,
        "rope_theta_local": None if gemma2 else hf["rope_local_base_freq"],
        "attn_logit_softcap": hf.get("attn_logit_softcapping"),
        "final_logit_softcap": hf.get("final_logit_softcapping"),
        "norm_eps": hf["rms_norm_eps"], "sliding_window": hf["sliding_window"],
        "layer_types": ["sliding" if s else "full" for s in sliding],
        "attention_scale": hf["query_pre_attn_scalar"] ** -0.5,
        "embedding_scale": math.sqrt(hf["hidden_size"]), "activation": "gelu_tanh",
        "tied_embeddings": hf["tie_word_embeddings"], "bos_id": hf["bos_token_id"],
        "norms_add_one": True,
    }
    weights = {"token_embedding": raw[prefix + "embed_tokens.weight"],
               "final_norm": raw[prefix + "norm.weight"]}
    if not config["tied_embeddings"]:
        weights["output"] = raw["lm_head.weight"]
    for layer in range(layers):
        for short, hf_name in GEMMA3_LAYER_NAMES.items():
            if not (gemma2 and short in ("q_norm", "k_norm")):
                weights[f"layers.{layer}.{short}"] = raw[f"{prefix}layers.{layer}.{hf_name}"]
    return config, weights


def hf_sliding_window(hf):
    """(window or None, first layer that uses it) as transformers decides: Mistral's window
    (default 4096) covers every layer; Qwen2/Qwen3 have one only with use_sliding_window,
    on layers max_window_layers (default 28) and up."""
    if hf["model_type"] == "mistral":
        return hf.get("sliding_window", 4096), 0
    if hf["model_type"] in ("mixtral", "phi3"):
        return hf.get("sliding_window"), 0
    if hf["model_type"] in ("qwen2", "qwen3") and hf.get("use_sliding_window"):
        return hf.get("sliding_window", 4096), hf.get("max_window_layers", 28)
    return None, 0


def dequantize_q8(values, scales):
    """The float32 matrix of Q8 `values` [rows, cols] and f16 `scales` [rows, groups]
    (both already widened exactly to float32): value * scale, scale g covering
    columns 32 g .. 32 g + 31 (fewer in a row's last group)."""
    cols = values.shape[1]
    per_column = np.repeat(np.asarray(scales, dtype=np.float32), 32, axis=1)[:, :cols]
    return np.asarray(values, dtype=np.float32) * per_column


def dequantize_q4(packed, scales):
    """The float32 matrix of Q4 `packed` [rows, cols / 2] (bytes widened to float32) and
    f16 `scales` [rows, cols / 32]: in each block of 32 columns, byte j holds q of
    column j in its low 4 bits and of column j + 16 in its high 4 bits; a weight is
    scale * (q - 8)."""
    rows, half_cols = packed.shape
    cols = 2 * half_cols
    out = np.zeros((rows, cols), dtype=np.float32)
    for row in range(rows):
        for col in range(cols):
            block, j = divmod(col, 32)
            byte = int(packed[row, block * 16 + j % 16])
            q = byte & 15 if j < 16 else byte >> 4
            out[row, col] = scales[row, block] * (q - 8)
    return out


def load_barellm(path):
    """Load a barellm weight file as (config, weights), Q8 and Q4 matrices dequantized."""
    tensors, metadata = read_safetensors(path)
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        dtypes = {name: entry["dtype"] for name, entry in json.loads(f.read(header_len)).items()
                  if name != "__metadata__"}
    weights = {}
    for name, values in tensors.items():
        if name.endswith(".scale"):
            continue
        if name + ".scale" not in tensors:
            weights[name] = values
        elif dtypes[name] == "U8":
            weights[name] = dequantize_q4(values, tensors[name + ".scale"])
        else:
            weights[name] = dequantize_q8(values, tensors[name + ".scale"])
    return json.loads(metadata["barellm.config"]), weights


def load(path):
    """Load a Hugging Face directory or a barellm file as (config, weights)."""
    return load_hf(path) if os.path.isdir(path) else load_barellm(path)


def rms_norm(x, weight, eps):
    """x * rsqrt(mean(x^2) + eps) * weight over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def norm(config, x, weight):
    """The model's RMSNorm: x * rsqrt(mean(x^2) + eps) * weight, or * (1 + weight) where the
    weights hold w of Gemma's x * (1 + w) (a Hugging Face Gemma checkpoint)."""
    return rms_norm(x, 1 + weight if config.get("norms_add_one") else weight, config["norm_eps"])


def layer_window(config, layer):
    """The sliding window of `layer`, None where it attends to the whole context: per layer
    from layer_types (Gemma 3), else from sliding_window_first_layer on."""
    if "layer_types" in config:
        return config["sliding_window"] if config["layer_types"][layer] == "sliding" else None
    if layer >= config.get("sliding_window_first_layer", 0):
        return config.get("sliding_window")
    return None


def inverse_frequencies(config, layer=0, length=1):
    """RoPE inverse frequencies of the rotary_dim / 2 rotated pairs of one head of `layer`
    at a sequence of `length` tokens, with linear, llama3 or LongRoPE scaling applied (the
    long factors where length exceeds the original context, as transformers picks them);
    Gemma 3's sliding layers: from rope_theta_local, unscaled."""
    rotary_dim = config.get("rotary_dim") or config["head_dim"]
    exponents = np.arange(0, rotary_dim, 2) / rotary_dim
    if config.get("rope_theta_local") and layer_window(config, layer):
        return 1.0 / config["rope_theta_local"] ** exponents
    inv = 1.0 / config["rope_theta"] ** exponents
    scaling = config.get("rope_scaling")
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "longrope":
        long = length > scaling["original_max_position_embeddings"]
        return inv / np.array(scaling["long_factor" if long else "short_factor"])
    if kind == "yarn":  # the pair index turning `turns` times over the original context
        def pair_of(turns):
            return (rotary_dim * math.log(scaling["original_max_position_embeddings"] /
                                          (turns * 2 * math.pi)) /
                    (2 * math.log(config["rope_theta"])))
        low, high = pair_of(scaling["beta_fast"]), pair_of(scaling["beta_slow"])
        if scaling["truncate"]:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, rotary_dim - 1)
        if low == high:
            high += 0.001
        scaled = np.clip((np.arange(len(inv)) - low) / (high - low), 0, 1)
        return inv / scaling["factor"] * scaled + inv * (1 - scaled)
    factor = scaling["factor"]
    if kind == "linear":
        return inv / factor
    if kind != "llama3":
        raise ValueError(f"unsupported rope scaling {kind}")
    old_len = scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old_len / low, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return np.where(medium, smoothed, scaled)


def rope(x, cos, sin):
    """Rotate-half RoPE of x [heads, T, head_dim] by tables [T, n]: pairs element i with
    i + n/2 among the first n elements (Hugging Face's partial rotary), the others unchanged."""
    n = cos.shape[-1]
    part, rest = x[..., :n], x[..., n:]
    rotated = np.concatenate([-part[..., n // 2:], part[..., :n // 2]], axis=-1)
    return np.concatenate([part * cos + rotated * sin, rest], axis=-1)


def attention_mask(config, length, layer=0):
    """Boolean [T, T] mask of allowed (query, key) pairs of `layer`: causal, plus the
    window on the layers that have one."""
    query = np.arange(length)[:, None]
    key = np.arange(length)[None, :]
    allowed = key <= query
    window = layer_window(config, layer)
    if window:
        allowed &= query - key < window
    return allowed


def projection(weights, prefix, name, h):
    """h @ W.T, plus the bias `b<name>` where the model has one."""
    out = h @ weights[prefix + "w" + name].T
    bias = weights.get(prefix + "b" + name)
    return out if bias is None else out + bias


def attention(config, weights, prefix, h, cos, sin, mask):
    """Grouped-query causal self-attention of the normed hidden states h [T, dim]. Qwen3 and
    Gemma 3 RMS-normalise each head of q and k (q_norm, k_norm) before RoPE; Gemma scales
    the scores by attention_scale rather than 1/sqrt(head_dim), and Gemma 2 soft-caps them."""
    length, heads, kv_heads, hd = len(h), config["heads"], config["kv_heads"], config["head_dim"]
    q = projection(weights, prefix, "q", h).reshape(length, heads, hd).transpose(1, 0, 2)
    k = projection(weights, prefix, "k", h).reshape(length, kv_heads, hd).transpose(1, 0, 2)
    v = projection(weights, prefix, "v", h).reshape(length, kv_heads, hd).transpose(1, 0, 2)
    if prefix + "q_norm" in weights:
        q = norm(config, q, weights[prefix + "q_norm"])
        k = norm(config, k, weights[prefix + "k_norm"])
    q, k = rope(q, cos, sin), rope(k, cos, sin)
    group = heads // kv_heads
    k, v = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)
    scores = q @ k.transpose(0, 2, 1) * config.get("attention_scale", 1 / math.sqrt(hd))
    scores = soft_cap(scores, config.get("attn_logit_softcap"))
    scores = np.where(mask, scores, -np.inf)
    sinks = weights.get(prefix + "sinks")
    if sinks is None:
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
    else:  # one more logit per head, the sink's, whose value vector is zero
        sink = sinks[:, None, None]
        top = np.maximum(scores.max(axis=-1, keepdims=True), sink)
        scores = np.exp(scores - top)
        probs = scores / (scores.sum(axis=-1, keepdims=True) + np.exp(sink - top))
    out = (probs @ v).transpose(1, 0, 2).reshape(length, heads * hd)
    return projection(weights, prefix, "o", out)


def soft_cap(x, cap):
    """cap * tanh(x / cap) (Gemma 2's soft-capping); x itself where cap is None or 0."""
    return cap * np.tanh(x / cap) if cap else x


def mlp(config, weights, prefix, h):
    """SwiGLU: w2(silu(w1 h) * w3 h); Gemma 3's GeGLU: w2(gelu_tanh(w1 h) * w3 h), with
    gelu_tanh(g) = g/2 (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))."""
    gate = h @ weights[prefix + "w1"].T
    up = h @ weights[prefix + "w3"].T
    if config.get("activation", "silu") == "gelu_tanh":
        activated = 0.5 * gate * (1 + np.tanh(math.sqrt(2 / math.pi) *
                                              (gate + 0.044715 * gate ** 3)))
    else:
        activated = gate / (1.0 + np.exp(-gate))
    return (activated * up) @ weights[prefix + "w2"].T


def swiglu_oai(config, gate, up):
    """gpt-oss's clamped SwiGLU: g sigmoid(1.702 g) (u + 1), g = min(gate, limit),
    u = clamp(up, -limit, limit)."""
    limit = config["swiglu_limit"]
    g, u = np.minimum(gate, limit), np.clip(up, -limit, limit)
    return g / (1.0 + np.exp(-1.702 * g)) * (u + 1)


def route(config, logits):
    """(experts [k], weights [k]) of one token from its router logits [experts]: softmax
    over all experts, the k = experts_per_token most probable (a stable sort: an exact tie
    to the lower index), their probabilities, rescaled to sum to 1 with norm_topk_prob."""
    probabilities = np.exp(logits - logits.max())
    probabilities /= probabilities.sum()
    chosen = np.argsort(-probabilities, kind="stable")[:config["experts_per_token"]]
    weights = probabilities[chosen]
    if config["norm_topk_prob"]:
        weights = weights / weights.sum()
    return chosen, weights


def mixture_of_experts(config, weights, prefix, h):
    """A sparse layer's MLP of the normed hidden states h [T, dim]: for each token, the sum
    over the experts route() picks of weight * SwiGLU MLP of that expert (its rows of the
    stacked experts.w1, experts.w3 and experts.w2). With the experts' biases (gpt-oss) the
    router's logits and each projection add theirs, and the activation is swiglu_oai."""
    width, dim = config["moe_hidden_dim"], config["dim"]
    w1, w3, w2 = (weights[prefix + "experts." + short] for short in ("w1", "w3", "w2"))
    zeros = {"router_bias": np.zeros(config["experts"]), "experts.b1": np.zeros(len(w1)),
             "experts.b3": np.zeros(len(w3)), "experts.b2": np.zeros(len(w2))}
    b1, b3, b2, router_bias = (weights.get(prefix + name, zeros[name]) for name in
                               ("experts.b1", "experts.b3", "experts.b2", "router_bias"))
    out = np.zeros_like(h)
    for t, logits in enumerate(h @ weights[prefix + "router"].T + router_bias):
        for expert, weight in zip(*route(config, logits)):
            rows = slice(expert * width, (expert + 1) * width)
            gate, up = w1[rows] @ h[t] + b1[rows], w3[rows] @ h[t] + b3[rows]
            if config.get("activation") == "swiglu_oai":
                activated = swiglu_oai(config, gate, up)
            else:
                activated = gate / (1.0 + np.exp(-gate)) * up
            down = slice(expert * dim, (expert + 1) * dim)
            out[t] += weight * (w2[down] @ activated + b2[down])
    return out


def post_norm(config, weights, name, y):
    """Gemma 3: a sub-block's output RMS-normed with `name` before the residual add; y itself
    where the model has no such norm."""
    return norm(config, y, weights[name]) if name in weights else y


def rope_tables(config, layer, length, dtype):
    """(cos, sin) of `layer`'s RoPE at positions 0 .. length - 1, times LongRoPE's attention
    factor: [T, rotary_dim] for a Hugging Face checkpoint's partial rotary (the first
    rotary_dim elements), else [T, head_dim], the pairs (i, i + head_dim/2) past
    rotary_dim / 2 not rotated (barellm's layout, docs/FORMAT.md)."""
    frequencies = inverse_frequencies(config, layer, length)
    scaling = config.get("rope_scaling") or {}
    magnitude = scaling.get("attention_factor", 1.0) if not (
        config.get("rope_theta_local") and layer_window(config, layer)) else 1.0
    pairs = len(frequencies) if config.get("rotary_first") else config["head_dim"] // 2
    angles = np.zeros((length, pairs))
    angles[:, :len(frequencies)] = np.arange(length)[:, None] * frequencies[None, :]
    scale = np.ones(pairs)
    scale[:len(frequencies)] = magnitude
    angles, scale = np.concatenate([angles, angles], axis=-1), np.concatenate([scale, scale])
    return (np.cos(angles) * scale).astype(dtype), (np.sin(angles) * scale).astype(dtype)


def forward(config, weights, token_ids, dtype=np.float64):
    """Logits [T, vocab] for every position of `token_ids`."""
    w = {name: value.astype(dtype) for name, value in weights.items()}
    x = w["token_embedding"][np.asarray(token_ids)] * config.get("embedding_scale", 1.0)
    for layer in range(config["layers"]):
        prefix = f"layers.{layer}."
        cos, sin = rope_tables(config, layer, len(token_ids), dtype)
        attended = attention(config, w, prefix, norm(config, x, w[prefix + "attn_norm"]),
                             cos, sin, attention_mask(config, len(token_ids), layer))
        x = x + post_norm(config, w, prefix + "post_attn_norm", attended)
        mix = mixture_of_experts if is_sparse(config, layer) else mlp
        mixed = mix(config, w, prefix, norm(config, x, w[prefix + "ffn_norm"]))
        x = x + post_norm(config, w, prefix + "post_ffn_norm", mixed)
    x = norm(config, x, w["final_norm"])
    output = w["token_embedding"] if config["tied_embeddings"] else w["output"]
    return soft_cap(x @ output.T, config.get("final_logit_softcap"))


def logits_for(path, token_ids):
    """Logits [len(token_ids), vocab_size] (float64) of the model at `path`, which is a
    Hugging Face directory or a barellm weight file."""
    config, weights = load(path)
    return forward(config, weights, token_ids)


def greedy(config, weights, token_ids, steps):
    """Extend `token_ids` by `steps` argmax tokens (full recomputation each step)."""
    ids = list(token_ids)
    for _ in range(steps):
        ids.append(int(np.argmax(forward(config, weights, ids)[-1])))
    return ids[len(token_ids):]


def text_tokenizer(path):
    """A pip `tokenizers` Tokenizer for the model at `path`, or None if unavailable."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    if not os.path.isdir(path):
        return Tokenizer.from_str(read_safetensors(path)[1]["barellm.tokenizer"])
    json_path = os.path.join(path, "tokenizer.json")
    return Tokenizer.from_file(json_path) if os.path.exists(json_path) else None


def main(argv=None):
    """CLI: print the top logits per position and an optional greedy continuation."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="Hugging Face directory or barellm file")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--ids", help="comma-separated token ids")
    source.add_argument("--text", help="prompt, encoded with tokenizer.json after BOS")
    parser.add_argument("--generate", type=int, default=0, help="greedy tokens to add")
    parser.add_argument("--top", type=int, default=5, help="logits shown per position")
    args = parser.parse_args(argv)
    config, weights = load(args.path)
    tokenizer = text_tokenizer(args.path)
    if args.ids is not None:
        ids = [int(i) for i in args.ids.split(",")]
    elif tokenizer is None:
        sys.exit("reference: --text needs tokenizer.json and the tokenizers package")
    else:
        bos = [config["bos_id"]] if config.get("bos_id") is not None else []
        ids = bos + tokenizer.encode(args.text, add_special_tokens=False).ids
    logits = forward(config, weights, ids)
    print(f"{config['layers']} layers, dim {config['dim']}, vocab {logits.shape[1]}; ids {ids}")
    for pos, row in enumerate(logits):
        top = np.argsort(-row)[:args.top]
        shown = ", ".join(f"{t}:{row[t]:.4f}" for t in top)
        print(f"pos {pos} (id {ids[pos]}): top {shown}")
    if args.generate:
        new = greedy(config, weights, ids, args.generate)
        print("greedy ids:", ",".join(map(str, new)))
        if tokenizer is not None:
            print("greedy text:", repr(tokenizer.decode(ids + new)))


if __name__ == "__main__":
    main()
