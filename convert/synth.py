#!/usr/bin/env python3
"""Write a Hugging Face Llama/Mistral/Qwen/Phi-3/Gemma 2/Gemma 3/Mixtral/Qwen3-MoE/gpt-oss
checkpoint with deterministic random weights.

    python3 convert/synth.py --preset NAME -o HF_DIR [--tokenizer DIR|FILE.gguf] [--dtype D]
                             [--seed N] [--layers N]
    python3 convert/synth.py --config CONFIG_JSON --tokenizer DIR|FILE.gguf -o HF_DIR [...]

Presets carry the config.json of real models (tinyllama-1.1b, mistral-7b, llama3-8b,
smollm2-135m, qwen2.5-0.5b, qwen3-0.6b, qwen3-8b, phi3-mini, phi4-mini, gemma2-2b, gemma2-9b,
gemma3-270m, gemma3-1b, gemma3-4b, mixtral-8x7b, qwen3-30b-a3b, gpt-oss-20b) so that speed and
memory can be measured at their exact shapes; --layers N keeps the first N layers of the shape
and of its layer_types (a 30B model with 8 layers fits a small machine, its per-layer speed
unchanged). A mixture-of-experts checkpoint holds each expert's matrices as Hugging Face's do,
one tensor per expert; its routers are random matrices like the others; a Phi-3 one its fused
qkv_proj and gate_up_proj; a gpt-oss one its experts fused as transformers keeps them
(gate_up_proj [experts, dim, 2 H], down_proj [experts, H, dim] and their biases), with random
non-zero biases and attention sinks. Weights are generated per tensor from numpy's Generator
seeded by (seed, tensor name) and written in row blocks, a tensor on each core (parallel.py),
so multi-GB checkpoints never sit in memory. Checkpoints larger than the shard limit (4 GB) are
split into model-0000i-of-0000n.safetensors files with a model.safetensors.index.json, as
Hugging Face does.

The tokenizer is copied from a Hugging Face directory (tokenizer.json and/or
tokenizer.model), or taken from a GGUF file's `tokenizer.ggml.*` keys (a vocabulary-only
GGUF such as llama.cpp's models/ggml-vocab-llama-spm.gguf will do) and written as
tokenizer.json and tokenizer_config.json, plus tokenizer.model for a SentencePiece-style
vocabulary (spm_writer.py), which llama.cpp's converter reads for Gemma 3.
"""

import json
import math
import os
import shutil
import sys
import zlib

import numpy as np

from common import ConvertError, OneLineParser, run_main
import convert
import dtypes
import gguf_file
import gguf_in
import gguf_tokenizer
import hf_tokenizer
import parallel
import safetensors_io as st
import spm
import spm_writer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_TOKENIZERS = os.path.join(REPO, "..", "shared", "tokenizers")

_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
          "attention_bias": False, "mlp_bias": False, "initializer_range": 0.02,
          "pretraining_tp": 1, "rope_scaling": None, "use_cache": True}

PRESETS = {
    "tinyllama-1.1b": ("llama2", {
        **_LLAMA, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
        "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000,
        "max_position_embeddings": 2048, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}),
    "mistral-7b": ("llama2", {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral",
        "hidden_act": "silu", "initializer_range": 0.02, "use_cache": True,
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
        "max_position_embeddings": 32768, "rope_theta": 10000.0, "sliding_window": 4096,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "bos_token_id": 1,
        "eos_token_id": 2}),
    "llama3-8b": ("smollm2-135m", {
        **_LLAMA, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": 128001}),
    # meta-llama/Llama-3.2-1B: tied embeddings, llama3 RoPE scaling.
    "llama3.2-1b": ("smollm2-135m", {
        **_LLAMA, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5, "rope_scaling": {
            "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "tie_word_embeddings": True, "bos_token_id": 128000, "eos_token_id": 128001}),
    "smollm2-135m": ("smollm2-135m", {
        **_LLAMA, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
        "max_position_embeddings": 8192, "rope_theta": 100000, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
        "pad_token_id": 2, "initializer_range": 0.041666666666666664}),
}
# Qwen checkpoints as their config.json files give them (Qwen/Qwen2.5-0.5B-Instruct,
# Qwen/Qwen3-0.6B, Qwen/Qwen3-8B). No Qwen tokenizer is at hand: the presets take the
# SmolLM2 one, byte-level BPE with the same <|im_start|>/<|im_end|> ChatML markers (at
# other ids), so only speed and memory, not text, are meaningful.
_QWEN = {"hidden_act": "silu", "initializer_range": 0.02, "use_cache": True,
         "attention_dropout": 0.0, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
         "vocab_size": 151936, "bos_token_id": 151643, "eos_token_id": 151645,
         "use_sliding_window": False}
_QWEN3 = {**_QWEN, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
          "attention_bias": False, "head_dim": 128, "max_position_embeddings": 40960,
          "num_key_value_heads": 8, "rope_scaling": None, "sliding_window": None}
PRESETS.update({
    "qwen2.5-0.5b": ("smollm2-135m", {
        **_QWEN, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
        "max_window_layers": 21, "sliding_window": 32768, "tie_word_embeddings": True}),
    "qwen3-0.6b": ("smollm2-135m", {
        **_QWEN3, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
        "num_attention_heads": 16, "max_window_layers": 28, "tie_word_embeddings": True}),
    "qwen3-8b": ("smollm2-135m", {
        **_QWEN3, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
        "num_attention_heads": 32, "max_window_layers": 36, "tie_word_embeddings": False}),
})
# Gemma 3 checkpoints as their config.json files give them (google/gemma-3-270m,
# google/gemma-3-1b-it; the language model of google/gemma-3-4b-it, a multimodal
# checkpoint, as a text-only one), with the real vocabulary (a vocabulary-only GGUF).
_GEMMA3 = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
           "attention_bias": False, "attention_dropout": 0.0, "attn_logit_softcapping": None,
           "final_logit_softcapping": None, "head_dim": 256,
           "hidden_activation": "gelu_pytorch_tanh", "initializer_range": 0.02,
           "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-6, "rope_local_base_freq": 10000.0,
           "rope_theta": 1000000.0, "sliding_window_pattern": 6, "use_cache": True,
           "bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0,
           "tie_word_embeddings": True}
GEMMA3_TOKENIZER = os.path.join("gemma3", "gemma3-vocab.gguf")
PRESETS.update({
    "gemma3-270m": (GEMMA3_TOKENIZER, {
        **_GEMMA3, "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18,
        "num_attention_heads": 4, "num_key_value_heads": 1, "max_position_embeddings": 32768,
        "rope_scaling": None, "sliding_window": 512, "vocab_size": 262144}),
    "gemma3-1b": (GEMMA3_TOKENIZER, {
        **_GEMMA3, "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
        "num_attention_heads": 4, "num_key_value_heads": 1, "max_position_embeddings": 32768,
        "rope_scaling": None, "sliding_window": 512, "vocab_size": 262144}),
    "gemma3-4b": (GEMMA3_TOKENIZER, {
        **_GEMMA3, "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34,
        "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 131072,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window": 1024,
        "vocab_size": 262208}),
})
# Gemma 2 checkpoints as their config.json files give them (google/gemma-2-2b,
# google/gemma-2-9b), but with Gemma 3's vocabulary of 262,144 pieces: Gemma 2's own 256,000
# are not at hand, and its ids are Gemma 3's first ones (the embedding and the logits 2.4%
# larger than the real model's).
_GEMMA2 = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
           "attention_bias": False, "attention_dropout": 0.0, "attn_logit_softcapping": 50.0,
           "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
           "hidden_activation": "gelu_pytorch_tanh", "initializer_range": 0.02,
           "max_position_embeddings": 8192, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "sliding_window": 4096, "use_cache": True,
           "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "tie_word_embeddings": True,
           "vocab_size": 262144}
PRESETS.update({
    "gemma2-2b": (GEMMA3_TOKENIZER, {
        **_GEMMA2, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4}),
    "gemma2-9b": (GEMMA3_TOKENIZER, {
        **_GEMMA2, "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 42,
        "num_attention_heads": 16, "num_key_value_heads": 8}),
})
# Mixture-of-experts checkpoints as their config.json files give them
# (mistralai/Mixtral-8x7B-v0.1, Qwen/Qwen3-30B-A3B; the latter with the SmolLM2 tokenizer, as
# the Qwen presets above).
PRESETS.update({
    "mixtral-8x7b": ("llama2", {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_act": "silu",
        "initializer_range": 0.02, "use_cache": True, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768,
        "rope_theta": 1000000.0, "sliding_window": None, "rms_norm_eps": 1e-5,
        "num_local_experts": 8, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02,
        "output_router_logits": False, "tie_word_embeddings": False, "bos_token_id": 1,
        "eos_token_id": 2}),
    "qwen3-30b-a3b": ("smollm2-135m", {
        **_QWEN3, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
        "max_window_layers": 48, "num_experts": 128, "num_experts_per_tok": 8,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "output_router_logits": False, "router_aux_loss_coef": 0.001,
        "tie_word_embeddings": False}),
})
# Phi checkpoints as their config.json files give them (microsoft/Phi-3-mini-4k-instruct with
# the Llama 2 tokenizer it extends; microsoft/Phi-4-mini-instruct, whose GPT-4o-style
# tokenizer is not at hand, with the SmolLM2 one as the Qwen presets).
_PHI3 = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_act": "silu",
         "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02,
         "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "use_cache": True,
         "original_max_position_embeddings": 4096}
PRESETS.update({
    "phi3-mini": ("llama2", {
        **_PHI3, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064,
        "max_position_embeddings": 4096, "rope_scaling": None, "sliding_window": 2047,
        "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 32000,
        "pad_token_id": 32000}),
    "phi4-mini": ("smollm2-135m", {
        **_PHI3, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
        "num_attention_heads": 24, "num_key_value_heads": 8, "vocab_size": 200064,
        "max_position_embeddings": 131072, "partial_rotary_factor": 0.75,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [
            1, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817,
            2.187582649, 2.446418898, 2.735880826, 3.059592084, 3.421605075, 3.826451687,
            4.279200023, 4.785517845, 5.351743533, 5.984965424, 6.693110555, 7.485043894,
            8.370679318, 9.36110372, 10.4687158, 11.70738129, 13.09260651, 14.64173252,
            16.37415215, 18.31155283, 20.47818807, 22.90118105, 25.61086418, 28.64115884,
            32.03, 32.1, 32.13, 32.23, 32.6, 32.61, 32.64, 32.66, 32.7, 32.71, 32.93, 32.97,
            33.28, 33.49, 33.5, 44.16, 47.77]},
        "sliding_window": 262144, "tie_word_embeddings": True, "bos_token_id": 199999,
        "eos_token_id": 199999, "pad_token_id": 199999}),
})
# openai/gpt-oss-20b's config.json (its experts in BF16 rather than MXFP4); its o200k
# tokenizer is not at hand, the SmolLM2 one stands in, as for phi4-mini.
PRESETS.update({
    "gpt-oss-20b": ("smollm2-135m", {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_act": "silu",
        "attention_bias": True, "attention_dropout": 0.0, "initializer_range": 0.02,
        "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 24,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
        "num_local_experts": 32, "num_experts_per_tok": 4, "experts_per_token": 4,
        "vocab_size": 201088, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
        "rope_theta": 150000, "rope_scaling": {
            "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": False, "original_max_position_embeddings": 4096},
        "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 12,
        "swiglu_limit": 7.0, "router_aux_loss_coef": 0.9, "output_router_logits": False,
        "initial_context_length": 4096, "tie_word_embeddings": False, "use_cache": True,
        "eos_token_id": 200002, "pad_token_id": 199999}),
})
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                   "special_tokens_map.json")
MAX_SHARD_BYTES = 4 * 10**9
BLOCK_ELEMENTS = 1 << 22
TORCH_DTYPES = {v: k for k, v in dtypes.TORCH_NAMES.items()}


def tensor_blocks(name, shape, is_norm, seed, norm_offset=1.0):
    """Yield float32 row blocks of one random tensor, identical for a given seed.

    Norms (Qwen3's q/k norms too) are norm_offset + N(0, 0.05): multipliers near 1, as
    Gemma's weights w are with norm_offset 0 (it multiplies by 1 + w); biases are
    N(0, 0.25); matrices (embeddings included) are N(0, 1/in_features), which keeps
    activations O(1) through any number of pre-norm residual layers and logits with a
    standard deviation near 1. A gpt-oss fused experts' tensor [experts, in, out] is
    multiplied from the left, x @ W: its in_features are its second dimension, and its
    attention sinks are norm-like, near norm_offset.
    """
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if name.endswith((".bias", "_bias")):
        yield np.float32(0.25) * rng.standard_normal(shape, dtype=np.float32)
        return
    if is_norm:
        yield np.float32(norm_offset) + np.float32(0.05) * rng.standard_normal(
            shape, dtype=np.float32)
        return
    if len(shape) == 3:
        rows, cols, fan_in = shape[0] * shape[1], shape[2], shape[1]
    else:
        (rows, cols), fan_in = shape, shape[1]
    scale = np.float32(1.0 / math.sqrt(fan_in))
    step = max(1, BLOCK_ELEMENTS // cols)
    for start in range(0, rows, step):
        yield scale * rng.standard_normal((min(step, rows - start), cols), dtype=np.float32)


def shard_groups(entries, max_bytes):
    """Split (name, dtype, shape, is_norm) entries into consecutive groups whose data
    stays within `max_bytes` (a larger single tensor gets a group of its own)."""
    groups, size = [[]], 0
    for entry in entries:
        nbytes = math.prod(entry[2]) * st.ITEM_SIZES[entry[1]]
        if groups[-1] and size + nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(entry)
        size += nbytes
    return groups


def tensor_task(fd, offset, name, dtype, shape, is_norm, seed, norm_offset):
    """The task (for parallel.run_tasks) that writes one random tensor at `offset` of the
    open file `fd`."""
    def task(stopping):
        out = parallel.BlockWriter(fd, offset, stopping)
        for block in tensor_blocks(name, shape, is_norm, seed, norm_offset):
            out.write(dtypes.from_f32(block, dtype))
    return task


def write_shards(shards, seed, norm_offset):
    """Write safetensors files of random tensors, [(path, group)], each through a
    temporary name; their tensors are generated on every core (parallel.py)."""
    files = []  # (temporary path, final path, open file)
    try:
        tasks = []
        for path, group in shards:
            entries = [e[:3] for e in group]
            header, data_bytes = st.encode_header(entries, {"format": "pt"}, 8)
            f = open(path + ".tmp", "wb")
            files.append((path + ".tmp", path, f))
            os.ftruncate(f.fileno(), len(header) + data_bytes)
            parallel.pwrite_all(f.fileno(), header, 0)
            offsets = st.data_offsets(entries)
            tasks += [tensor_task(f.fileno(), len(header) + offsets[name][0], name, dtype, shape,
                                  is_norm, seed, norm_offset)
                      for name, dtype, shape, is_norm in group]
        parallel.run_tasks(tasks)
        for tmp, path, f in files:
            f.close()
            os.replace(tmp, path)
    finally:
        for tmp, _, f in files:
            f.close()
            if os.path.exists(tmp):
                os.unlink(tmp)


def write_weights(out_dir, config, layout, weight_dtype, seed, max_shard_bytes):
    """Write model.safetensors, or shards plus model.safetensors.index.json, with the
    tensor names of `layout` (convert.Layout)."""
    entries = []
    for hf, (name, shape, is_norm) in convert.expected_tensors(config, layout).items():
        if isinstance(hf, tuple):  # a stacked matrix: each expert's part is a tensor
            entries += [(part, weight_dtype, (shape[0] // len(hf), shape[1]), False)
                        for part in hf]
        elif name.endswith(".router"):  # a matrix of the checkpoint, F32 in barellm's file
            entries.append((hf, weight_dtype, shape, False))
        else:
            entries.append((hf, "F32" if is_norm else weight_dtype, shape, is_norm))
    if config["architecture"] == "phi3":
        entries = phi3_fused_entries(entries)
    if config["architecture"] == "gpt_oss":
        entries = gpt_oss_fused_entries(entries, config, weight_dtype)
    groups = shard_groups(entries, max_shard_bytes)
    # Gemma's checkpoints hold norm weights w for the multipliers 1 + w.
    norm_offset = 0.0 if config["architecture"] in convert.GEMMA_ARCHITECTURES else 1.0
    if len(groups) == 1:
        write_shards([(os.path.join(out_dir, "model.safetensors"), groups[0])], seed,
                     norm_offset)
        return
    names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    write_shards([(os.path.join(out_dir, name), group) for name, group in zip(names, groups)],
                 seed, norm_offset)
    weight_map, total = {}, 0
    for file_name, group in zip(names, groups):
        for name, dtype, shape, _ in group:
            weight_map[name] = file_name
            total += math.prod(shape) * st.ITEM_SIZES[dtype]
    write_json(os.path.join(out_dir, "model.safetensors.index.json"),
               {"metadata": {"total_size": total}, "weight_map": weight_map})


def phi3_fused_entries(entries):
    """Phi-3's checkpoint entries: each layer's q_proj, k_proj and v_proj as one qkv_proj,
    its gate_proj and up_proj as one gate_up_proj (convert.py splits them back)."""
    kv_rows = {name: shape[0] for name, _, shape, _ in entries}
    out = []
    for name, dtype, shape, is_norm in entries:
        prefix, _, short = name.partition("self_attn.")
        if short == "q_proj.weight":
            rows = shape[0] + 2 * kv_rows[prefix + "self_attn.k_proj.weight"]
            out.append((prefix + convert.PHI3_QKV, dtype, (rows, shape[1]), False))
        elif name.endswith("mlp.gate_proj.weight"):
            prefix = name[:-len("mlp.gate_proj.weight")]
            out.append((prefix + convert.PHI3_GATE_UP, dtype, (2 * shape[0], shape[1]), False))
        elif not name.endswith(("k_proj.weight", "v_proj.weight", "mlp.up_proj.weight")):
            out.append((name, dtype, shape, is_norm))
    return out


def gpt_oss_fused_entries(entries, config, weight_dtype):
    """gpt-oss's checkpoint entries: each layer's experts as transformers' fused tensors
    (gpt_oss.py), in place of the converter's sources of barellm's stacked ones."""
    experts, dim, width = config["experts"], config["dim"], config["moe_hidden_dim"]
    out = []
    for name, dtype, shape, is_norm in entries:
        prefix, _, short = name.partition("mlp.experts.")
        if short.startswith("w1 "):
            out += [(prefix + "mlp.experts.gate_up_proj", weight_dtype,
                     (experts, dim, 2 * width), False),
                    (prefix + "mlp.experts.gate_up_proj_bias", weight_dtype,
                     (experts, 2 * width), True)]
        elif short.startswith("w2 "):
            out += [(prefix + "mlp.experts.down_proj", weight_dtype, (experts, width, dim), False),
                    (prefix + "mlp.experts.down_proj_bias", weight_dtype, (experts, dim), True)]
        elif not short:
            out.append((name, dtype, shape, is_norm))
    return out


def write_json(path, value):
    """Write `value` as indented JSON."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, ensure_ascii=False)
        f.write("\n")


def copy_tokenizer(tokenizer_dir, out_dir, vocab):
    """Copy the tokenizer files, checking that every token id is below `vocab`.

    A tokenizer_config.json is written when the source has none: a SentencePiece
    tokenizer is a Llama tokenizer that adds BOS; a tokenizer.json-only one adds BOS
    only as its own post-processor says.
    """
    tokenizer, from_sentencepiece = hf_tokenizer.load_tokenizer(tokenizer_dir)
    size = hf_tokenizer.vocab_size(tokenizer)
    if size > vocab:
        raise ConvertError(f"the tokenizer has {size} ids but vocab_size is {vocab}")
    for file_name in TOKENIZER_FILES:
        source = os.path.join(tokenizer_dir, file_name)
        if os.path.exists(source):
            shutil.copyfile(source, os.path.join(out_dir, file_name))
    if not os.path.exists(os.path.join(tokenizer_dir, "tokenizer_config.json")):
        tok_config = {"add_bos_token": hf_tokenizer.add_bos(None, tokenizer,
                                                            from_sentencepiece),
                      "add_eos_token": False,
                      "tokenizer_class": ("LlamaTokenizer" if from_sentencepiece
                                          else "PreTrainedTokenizerFast")}
        if from_sentencepiece:
            tok_config["legacy"] = True
        write_json(os.path.join(out_dir, "tokenizer_config.json"), tok_config)


def sentencepiece_model(keys, tokens):
    """The bytes of the tokenizer.model of a GGUF file's SentencePiece-style (`llama`)
    vocabulary: its tokens, scores and types, and its special ids. The unknown token's id
    gets the UNKNOWN type that SentencePiece requires of it, whatever type the GGUF
    gives it."""
    scores = keys.array("tokenizer.ggml.scores", gguf_in.FLOAT_TYPES, "floats")
    types = keys.array("tokenizer.ggml.token_type", gguf_in.INTEGER_TYPES, "integers")
    scores = [0.0] * len(tokens) if scores is None else scores
    types = [spm.NORMAL] * len(tokens) if types is None else list(types)
    ids = {}
    for name in ("unknown", "bos", "eos", "padding"):
        value = keys.whole_number(f"tokenizer.ggml.{name}_token_id")
        if value is not None and not 0 <= value < len(tokens):
            raise ConvertError(f"tokenizer.ggml.{name}_token_id {value} is not a token id")
        ids[name] = value
    if ids["unknown"] is None:
        ids["unknown"] = next((i for i, kind in enumerate(types) if kind == spm.UNKNOWN), None)
    if ids["unknown"] is None:
        raise ConvertError("the GGUF vocabulary has no unknown token, which a SentencePiece "
                           "tokenizer.model needs")
    types[ids["unknown"]] = spm.UNKNOWN
    add_prefix = keys.flag("tokenizer.ggml.add_space_prefix")
    return spm_writer.model_bytes(list(zip(tokens, scores, types)), ids["unknown"],
                                  ids["bos"], ids["eos"], ids["padding"],
                                  add_dummy_prefix=True if add_prefix is None else add_prefix)


def tokenizer_from_gguf(gguf_path, out_dir, vocab):
    """Write tokenizer.json and tokenizer_config.json from a GGUF file's tokenizer, and for
    a SentencePiece-style vocabulary (model `llama`) tokenizer.model too."""
    gguf_file.require_package()
    keys = gguf_in.Keys(gguf_file.read_header(gguf_path).keys)
    vocabulary = gguf_tokenizer.vocabulary(keys.tokenizer_keys(), vocab)
    tokens = keys.array("tokenizer.ggml.tokens", {gguf_in.STRING_TYPE}, "strings")
    if keys.string("tokenizer.ggml.model") == "llama":
        with open(os.path.join(out_dir, "tokenizer.model"), "wb") as f:
            f.write(sentencepiece_model(keys, tokens))
    tok_config = {"add_bos_token": vocabulary.add_bos, "add_eos_token": False,
                  "tokenizer_class": "PreTrainedTokenizerFast"}
    if vocabulary.bos_id is not None:
        tok_config["bos_token"] = tokens[vocabulary.bos_id]
    if vocabulary.eos_ids:
        tok_config["eos_token"] = tokens[vocabulary.eos_ids[0]]
    template = keys.string("tokenizer.chat_template")
    if template is not None:
        tok_config["chat_template"] = template
    # The added tokens by id, as transformers saves them; llama.cpp's converter takes the
    # types of tokenizer.model's pieces from them (special: control, else user-defined).
    tok_config["added_tokens_decoder"] = {
        str(entry["id"]): {"content": entry["content"], "lstrip": False, "normalized": False,
                           "rstrip": False, "single_word": False, "special": entry["special"]}
        for entry in vocabulary.tokenizer.get("added_tokens") or []}
    write_json(os.path.join(out_dir, "tokenizer.json"), vocabulary.tokenizer)
    write_json(os.path.join(out_dir, "tokenizer_config.json"), tok_config)


def synthesize(cfg, tokenizer_dir, out_dir, weight_dtype, seed, max_shard_bytes):
    """Write the whole Hugging Face directory; returns a one-line summary."""
    cfg = {**cfg, "torch_dtype": TORCH_DTYPES[weight_dtype]}
    convert.check_architecture(cfg)
    config = convert.model_config(convert.language_model_config(cfg), None)
    layout = (convert.MULTIMODAL_LAYOUTS[0] if cfg.get("model_type") == "gemma3"
              else convert.TEXT_LAYOUT)
    from_gguf = os.path.isfile(tokenizer_dir) and tokenizer_dir.endswith(".gguf")
    if not from_gguf and not os.path.isdir(tokenizer_dir):
        raise ConvertError(f"tokenizer {tokenizer_dir} is neither a directory nor a .gguf "
                           "file (use --tokenizer)")
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise ConvertError(f"{out_dir} exists and is not an empty directory")
    os.makedirs(out_dir, exist_ok=True)
    if from_gguf:
        tokenizer_from_gguf(tokenizer_dir, out_dir, config["vocab_size"])
    else:
        copy_tokenizer(tokenizer_dir, out_dir, config["vocab_size"])
    write_json(os.path.join(out_dir, "config.json"), cfg)
    write_json(os.path.join(out_dir, "generation_config.json"),
               {"bos_token_id": cfg.get("bos_token_id"),
                "eos_token_id": cfg.get("eos_token_id")})
    write_weights(out_dir, config, layout, weight_dtype, seed, max_shard_bytes)
    return (f"wrote {out_dir}: {config['layers']} layers, dim {config['dim']}, "
            f"vocab {config['vocab_size']}, {weight_dtype}, seed {seed}")


def first_layers(cfg, layers):
    """The config of a preset's first `layers` layers (and of its layer_types)."""
    if not 0 < layers <= cfg["num_hidden_layers"]:
        raise ConvertError(f"--layers {layers} is not between 1 and the "
                           f"preset's {cfg['num_hidden_layers']}")
    cfg = {**cfg, "num_hidden_layers": layers}
    if "layer_types" in cfg:
        cfg["layer_types"] = cfg["layer_types"][:layers]
    return cfg


def parse_args(argv):
    """Command-line arguments."""
    parser = OneLineParser(
        prog="synth.py",
        description="Write a Hugging Face checkpoint with random weights.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--preset", choices=sorted(PRESETS), help="a real model's shape")
    source.add_argument("--config", help="a Hugging Face config.json to use")
    parser.add_argument("--tokenizer", help="directory with tokenizer.json or tokenizer.model, "
                        "or a GGUF file with a tokenizer (default for presets: "
                        "../shared/tokenizers/<preset tokenizer>)")
    parser.add_argument("-o", "--output", required=True, help="directory to create")
    # A Hugging Face checkpoint holds float matrices only: no q8 or q4.
    float_names = sorted(name for name, dtype in dtypes.CLI_NAMES.items()
                         if dtype in TORCH_DTYPES)
    parser.add_argument("--dtype", choices=float_names, default="bf16",
                        help="matrix dtype (default bf16)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--layers", type=int, help="keep only the first N layers of the shape")
    parser.add_argument("--max-shard-bytes", type=int, default=MAX_SHARD_BYTES,
                        help="largest shard before splitting (default 4 GB)")
    return parser.parse_args(argv)


def main(argv=None):
    """CLI entry point; returns the exit status."""
    args = parse_args(argv)
    try:
        if args.preset:
            tokenizer_name, cfg = PRESETS[args.preset]
            tokenizer_dir = args.tokenizer or os.path.join(SHARED_TOKENIZERS, tokenizer_name)
            if args.layers is not None:
                cfg = first_layers(cfg, args.layers)
        else:
            cfg = convert.json_object(args.config, required=True)
            if not args.tokenizer:
                raise ConvertError("--tokenizer is required with --config")
            if args.layers is not None:
                raise ConvertError("--layers goes with --preset")
            tokenizer_dir = args.tokenizer
        print(synthesize(cfg, os.path.normpath(tokenizer_dir), args.output,
                         dtypes.CLI_NAMES[args.dtype], args.seed, args.max_shard_bytes))
    except ConvertError as e:
        print(f"synth: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"synth: {e.filename}: {e.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    run_main(main, "synth")  # a stop signal removes the temporary output first
