#!/usr/bin/env python3
"""Write a GGUF file for llama.cpp from a Hugging Face Llama/Mistral/Qwen2/Qwen3/Phi-3/Gemma 2/
Gemma 3/Mixtral/Qwen3-MoE/gpt-oss checkpoint.

    python3 scripts/gguf_from_hf.py HF_DIR -o OUT.gguf [--type TYPE] [--pre NAME]

TYPE is f32, f16, bf16 or a type the gguf package quantizes: q8_0, q4_0, q4_1, q5_0, q5_1.

Used to benchmark barellm against llama.cpp on exactly the same weights: HF_DIR is the
same directory that convert/convert.py turns into a barellm file (config.json, one or
several *.safetensors with their index, tokenizer.json and/or tokenizer.model). The
config, the tensor list and the tokenizer are read and checked with the converter's own
code (convert/), so whatever barellm refuses is refused here too.

What is written (GGUF v3, through the `gguf` package, scripts/requirements.txt):
- architecture `llama` (Mistral too: llama.cpp runs it as llama), `qwen2` or `qwen3`
  (barellm's config architecture) with the hyperparameters llama.cpp reads: context,
  embedding and feed-forward length, block count, head counts, key/value length, RoPE
  base and dimension count, RMS-norm epsilon, vocabulary size; linear RoPE scaling as
  `rope.scaling.*`, llama3 RoPE scaling as a `rope_freqs.weight` tensor (the divisor of
  each frequency). Mistral's sliding window is not written (llama.cpp's llama
  architecture has none; it makes no difference up to 4096 tokens), nor Qwen's
  (use_sliding_window, which the released Qwen2/Qwen3 models leave off). An output
  projection bias (attention_bias) is refused (llama.cpp's qwen2 and qwen3 have none),
  and so are q/k/v biases on llama (convert/gguf_in.py reads none there).
- Gemma 3 as llama.cpp's `gemma3`: the norm weights as their multipliers 1 + w (as
  llama.cpp's converter writes them, and barellm files hold them), the embedding unscaled
  (llama.cpp multiplies by sqrt(dim) itself), q and k rows in Hugging Face's order (NEOX
  RoPE), the sliding window, which layers slide (`attention.sliding_window_pattern`, one
  flag per layer) and their RoPE base (`rope.freq_base_swa`). llama.cpp scales queries by
  head_dim^-1/2 (by (dim / heads)^-1/2 with 62 layers, the 27B model): another
  query_pre_attn_scalar is refused. The logits' soft-capping as
  `final_logit_softcapping`; soft-capped attention scores are refused (llama.cpp's gemma3
  does not read them).
- Gemma 2 as llama.cpp's `gemma2`, as Gemma 3 but without q and k norms: the sliding
  layers (every other one) and their window, and both soft-cappings
  (`attn_logit_softcapping`, `final_logit_softcapping`; llama.cpp's gemma2 always applies
  them, so a checkpoint without one is refused); the 27B model has 46 layers.
- Phi-3 and Phi-4 as llama.cpp's `phi3`: the fused `attn_qkv` and `ffn_up` (gate rows, then
  up rows) as the checkpoint holds them (NEOX RoPE: q and k rows in Hugging Face's order),
  the rotated elements as `rope.dimension_count`, LongRoPE's factors as the
  `rope_factors_long` and `rope_factors_short` tensors with `rope.scaling.attn_factor` and
  `rope.scaling.original_context_length`, the window as `attention.sliding_window` (0 for
  none; llama.cpp reads it but does not apply it).
- mixtures of experts as llama.cpp writes them: Mixtral as `llama` and Qwen3-MoE as
  `qwen3moe`, with `expert_count`, `expert_used_count` and `expert_feed_forward_length`;
  each sparse layer's router as `ffn_gate_inp` (F32) and its experts' matrices stacked into
  the 3-dimensional `ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`. llama.cpp has no dense
  layers among sparse ones, and rescales the chosen experts' weights always: a checkpoint
  with dense layers or without norm_topk_prob is refused.
- gpt-oss as llama.cpp's `gpt-oss`: q/k/v/o biases, `attn_sinks`, the feed-forward norm as
  `post_attention_norm`, the router's bias `ffn_gate_inp.bias`, the experts split from
  transformers' fused tensors (convert/gpt_oss.py; MXFP4 ones dequantized) into
  `ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps` with their biases [experts, rows], the
  window and which layers slide (`attention.sliding_window_pattern`, one flag per layer).
  llama.cpp's SwiGLU limit is 7: another swiglu_limit is refused.
- the tokenizer: SentencePiece (`llama`: pieces, scores, types, from tokenizer.model
  decoded by convert/spm.py, or from a byte-fallback BPE tokenizer.json with scores
  taken from the merge ranks) or byte-level BPE (`gpt2`: tokens, types, merges, and the
  pre-tokenizer name, recognized from tokenizer.json or given with --pre); BOS/EOS/UNK/PAD
  ids and whether BOS is added, decided as barellm decides it; the chat template of
  tokenizer_config.json.
- tensors named as llama.cpp names them (token_embd, blk.N.attn_q, ..., output_norm,
  output; Qwen's blk.N.attn_q.bias ... and blk.N.attn_q_norm, attn_k_norm: the tables of
  convert/gguf_in.py, which reads them back); norms and biases in F32, matrices in
  --type (default: the checkpoint's own dtype). With a quantized type a matrix whose
  rows are not a multiple of its block (32) long stays F16 (llama.cpp's blocks are never
  partial).

RoPE: Hugging Face's Llama rotates element i of a head with element i + head_dim/2
("rotate-half"); llama.cpp's llama architecture rotates elements 2i and 2i+1, both with
frequency theta^(-2i/head_dim). For llama the rows of q and k are therefore reordered
within each head: new row 2i + t takes old row t * head_dim/2 + i (t = 0, 1; i <
head_dim/2), so the dot products q.k are unchanged. llama.cpp's qwen2 and qwen3 rotate
half as Hugging Face does (NEOX RoPE): their rows keep their order.

Tensors are converted a tensor per core (source rows are read in blocks from the
memory-mapped safetensors files) and written in order, so memory stays around one output
tensor per core. The output is written to a temporary file renamed into place at the end.
"""

import argparse
import collections
import json
import math
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "convert"))

from common import (ConvertError, refuse_output_among_inputs,  # noqa: E402
                    refuse_output_in_place_of, run_main, umask_applied)
import convert  # noqa: E402
import dtypes  # noqa: E402
import gguf_in  # noqa: E402
import gpt_oss  # noqa: E402
import gguf_tokenizer  # noqa: E402
import hf_tokenizer  # noqa: E402
import parallel  # noqa: E402
import safetensors_io as st  # noqa: E402
import spm  # noqa: E402

try:
    import gguf
except ImportError:
    sys.exit("gguf_from_hf: the gguf package is missing: "
             "python3 -m pip install -r scripts/requirements.txt")

QT = gguf.GGMLQuantizationType
# --type -> (tensor type of the matrices, general.file_type)
TYPES = {
    "f32": (QT.F32, gguf.LlamaFileType.ALL_F32),
    "f16": (QT.F16, gguf.LlamaFileType.MOSTLY_F16),
    "bf16": (QT.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "q8_0": (QT.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "q4_0": (QT.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    "q4_1": (QT.Q4_1, gguf.LlamaFileType.MOSTLY_Q4_1),
    "q5_0": (QT.Q5_0, gguf.LlamaFileType.MOSTLY_Q5_0),
    "q5_1": (QT.Q5_1, gguf.LlamaFileType.MOSTLY_Q5_1),
}
FLOAT_TYPES = (QT.F32, QT.F16, QT.BF16)
# barellm weight_dtype (the checkpoint's own dtype) -> --type
DEFAULT_TYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16"}
# barellm config flags of optional layer parts (docs/FORMAT.md).
LAYER_FLAGS = ("qkv_bias", "o_bias", "qk_norm")


# The GGUF architecture of a barellm one where they differ (mixtures of experts).
GGUF_ARCHITECTURES = {barellm: gguf for gguf, barellm in gguf_in.MOE_ARCHITECTURES.items()}


# Phi-3's fused matrices (phi3_fused_plan's names): q, k and v; the gate and up projections.
PHI3_FUSED = {"qkv": gguf_in.PHI3_FUSED_QKV, "gate_up": gguf_in.PHI3_FUSED_GATE_UP}


def gguf_name(name, arch):
    """llama.cpp's name of the barellm tensor `name` (docs/FORMAT.md) in the
    architecture `arch` (a gguf_in.Architecture)."""
    if name.startswith("layers."):
        _, layer, short = name.split(".", 2)
        return f"blk.{layer}.{PHI3_FUSED.get(short) or arch.layer_tensors[short]}"
    return arch.global_tensors[name]


def phi3_fused_plan(config, tensors):
    """The plan of a Phi-3 checkpoint (checked as convert.py checks it) with its fused
    matrices kept whole, as llama.cpp's phi3 reads them: layers.N.qkv (q, k then v, each
    head's rows in Hugging Face's order, which llama.cpp's NEOX RoPE rotates as they are)
    in place of wq, wk and wv, layers.N.gate_up in place of w1 and w3."""
    plan = convert.tensor_plan(config, convert.split_phi3(config, tensors))
    fused = []
    for name, info, is_norm in plan:
        layer_prefix, _, short = name.rpartition(".")
        hf_prefix = f"model.{layer_prefix}."
        if short == "wq":
            fused.append((f"{layer_prefix}.qkv", tensors[hf_prefix + convert.PHI3_QKV], False))
        elif short == "w1":
            fused.append((f"{layer_prefix}.gate_up", tensors[hf_prefix + convert.PHI3_GATE_UP],
                          False))
        elif short not in ("wk", "wv", "w3"):
            fused.append((name, info, is_norm))
    return fused


def check_experts(config):
    """Refuse the mixtures of experts llama.cpp computes otherwise (see the top)."""
    if config.get("dense_layers"):
        raise ConvertError("dense layers among sparse ones: llama.cpp's GGUF has none; cannot "
                           "write this checkpoint as GGUF")
    if config.get("experts") and not config["norm_topk_prob"]:
        raise ConvertError("norm_topk_prob false: llama.cpp rescales the chosen experts' "
                           "weights always; cannot write this checkpoint as GGUF")


def check_layer_flags(config, arch_name):
    """Refuse the optional layer parts that GGUF files of `arch_name` do not carry here
    (convert/gguf_in.py's table: llama.cpp's qwen2 and qwen3 have no output bias)."""
    arch = gguf_in.ARCHITECTURES[arch_name]
    for flag in LAYER_FLAGS:
        if config.get(flag) and flag not in arch.flags and flag not in arch.optional_flags:
            raise ConvertError(f"{flag}: a GGUF file of architecture {arch_name} holds no "
                               "such tensors here; cannot write this checkpoint as GGUF")


# ---------------------------------------------------------------------------- tokenizer

def _pad_vocab(tokens, scores, types, vocab_size):
    """Fill ids the tokenizer does not use up to vocab_size with unused tokens."""
    for i in range(len(tokens), vocab_size):
        tokens.append(f"[PAD{i}]")
        types.append(gguf.TokenType.UNUSED)
        if scores is not None:
            scores.append(-1e9)


def spm_from_model(path, vocab_size):
    """SentencePiece vocabulary from tokenizer.model, decoded by convert/spm.py."""
    try:
        with open(path, "rb") as f:
            model = spm.parse_model(f.read())
    except OSError as e:
        raise ConvertError(f"tokenizer.model: cannot read ({e.strerror})") from None
    if model["model_type"] != 2:
        kind = spm.MODEL_TYPES.get(model["model_type"], str(model["model_type"]))
        raise ConvertError(f"tokenizer.model: SentencePiece model type {kind} "
                           "is not supported (only BPE)")
    pieces = model["pieces"]
    if len(pieces) > vocab_size:
        raise ConvertError(f"tokenizer.model has {len(pieces)} pieces but vocab_size "
                           f"is {vocab_size}")
    tokens = [p for p, _, _ in pieces]
    scores = [float(s) for _, s, _ in pieces]
    # SentencePiece's piece types have the same values as gguf.TokenType.
    types = [int(t) for _, _, t in pieces]
    _pad_vocab(tokens, scores, types, vocab_size)
    unk = next((i for i, (_, _, t) in enumerate(pieces) if t == spm.UNKNOWN), None)
    return tokens, scores, types, unk, model["add_dummy_prefix"]


def _id_table(tokenizer, vocab_size):
    """(tokens by id, added-token entries by id) of a tokenizer.json."""
    by_id = {}
    for piece, token_id in tokenizer["model"]["vocab"].items():
        by_id[token_id] = piece
    added = {}
    for entry in tokenizer.get("added_tokens") or []:
        by_id[entry["id"]] = entry["content"]
        added[entry["id"]] = entry
    if by_id and max(by_id) >= vocab_size:
        raise ConvertError(f"the tokenizer has ids up to {max(by_id)} but vocab_size "
                           f"is {vocab_size}")
    return by_id, added


def _merge_pairs(tokenizer):
    """BPE merges of a tokenizer.json as (left, right) pairs, in rank order."""
    pairs = []
    for merge in tokenizer["model"].get("merges") or []:
        if isinstance(merge, str):
            left, sep, right = merge.partition(" ")
            if not sep:
                raise ConvertError(f"tokenizer.json: malformed merge {merge!r}")
        else:
            left, right = merge
        pairs.append((left, right))
    return pairs


def _added_type(entry):
    return gguf.TokenType.CONTROL if entry.get("special") else gguf.TokenType.USER_DEFINED


def spm_from_json(tokenizer, vocab_size):
    """SentencePiece-style vocabulary from a byte-fallback BPE tokenizer.json.

    llama.cpp's SentencePiece tokenizer merges the adjacent pair whose concatenation has
    the highest score; Hugging Face's BPE merges the pair of lowest rank. A piece scores
    minus the rank of the first merge producing it, so both pick the same merge."""
    by_id, added = _id_table(tokenizer, vocab_size)
    rank = {}
    for r, (left, right) in enumerate(_merge_pairs(tokenizer)):
        rank.setdefault(left + right, r)
    unk_piece = tokenizer["model"].get("unk_token")
    tokens, scores, types, unk = [], [], [], None
    for i in range(max(by_id) + 1 if by_id else 0):
        piece = by_id.get(i)
        if piece is None:
            tokens.append(f"[PAD{i}]")
            scores.append(-1e9)
            types.append(gguf.TokenType.UNUSED)
            continue
        tokens.append(piece)
        if piece == unk_piece:
            unk = i
            types.append(gguf.TokenType.UNKNOWN)
        elif i in added:
            types.append(_added_type(added[i]))
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(gguf.TokenType.NORMAL)
        if piece in rank:
            scores.append(-float(rank[piece]) - 1.0)
        elif len(piece) == 1 or types[-1] != gguf.TokenType.NORMAL:
            scores.append(0.0)
        else:
            scores.append(-float(len(rank)) - 1.0)  # no merge makes it
    _pad_vocab(tokens, scores, types, vocab_size)
    normalizer = json.dumps(tokenizer.get("normalizer"))
    add_prefix = '"Prepend"' in normalizer or '"prepend_scheme": "always"' in json.dumps(
        tokenizer.get("pre_tokenizer"))
    return tokens, scores, types, unk, add_prefix


def _component_types(node, children):
    """Flatten a (possibly Sequence) tokenizer.json component into its parts."""
    if not isinstance(node, dict):
        return []
    if node.get("type") == "Sequence":
        parts = []
        for child in node.get(children) or []:
            parts.extend(_component_types(child, children))
        return parts
    return [node]


def is_byte_level(tokenizer):
    """Whether a tokenizer.json is a byte-level (GPT-2 style) BPE."""
    parts = (_component_types(tokenizer.get("pre_tokenizer"), "pretokenizers")
             + _component_types(tokenizer.get("decoder"), "decoders"))
    return any(p.get("type") == "ByteLevel" for p in parts)


def detect_pre(tokenizer):
    """llama.cpp's pre-tokenizer name for a byte-level tokenizer.json, or None."""
    parts = _component_types(tokenizer.get("pre_tokenizer"), "pretokenizers")
    kinds = [p.get("type") for p in parts]
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True):
        return "gpt-2"
    if (kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits")
            and parts[1].get("use_regex", True)):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not parts[1].get("use_regex", True):
        pattern = (parts[0].get("pattern") or {}).get("Regex")
        if pattern == gguf_tokenizer.LLAMA3_REGEX:
            return "llama-bpe"
        if pattern == gguf_tokenizer.QWEN2_REGEX:
            return "qwen2"
        if pattern == gguf_tokenizer.GPT4O_REGEX:
            return "gpt-4o"
    return None


def gpt2_vocab(tokenizer, vocab_size):
    """Byte-level BPE vocabulary: tokens, types and merges ("left right")."""
    by_id, added = _id_table(tokenizer, vocab_size)
    tokens, types = [], []
    for i in range(max(by_id) + 1 if by_id else 0):
        piece = by_id.get(i)
        if piece is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        else:
            tokens.append(piece)
            types.append(_added_type(added[i]) if i in added else gguf.TokenType.NORMAL)
    _pad_vocab(tokens, None, types, vocab_size)
    merges = [f"{left} {right}" for left, right in _merge_pairs(tokenizer)]
    return tokens, types, merges


def add_tokenizer(writer, hf_dir, config, pre_override):
    """Write the tokenizer.ggml.* keys; return a one-word description."""
    vocab_size = config["vocab_size"]
    tok_cfg = convert.json_object(os.path.join(hf_dir, "tokenizer_config.json"), False)
    tokenizer, from_sentencepiece = hf_tokenizer.load_tokenizer(hf_dir)
    hf_tokenizer.check_supported(tokenizer)
    convert.check_token_ids(config, tokenizer)
    add_bos = hf_tokenizer.add_bos(tok_cfg, tokenizer, from_sentencepiece)
    model_path = os.path.join(hf_dir, "tokenizer.model")
    if not is_byte_level(tokenizer):
        if os.path.exists(model_path):
            tokens, scores, types, unk, prefix = spm_from_model(model_path, vocab_size)
            source = "SentencePiece (tokenizer.model)"
        else:
            tokens, scores, types, unk, prefix = spm_from_json(tokenizer, vocab_size)
            source = "SentencePiece-style BPE (tokenizer.json)"
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        writer.add_add_space_prefix(bool(prefix))
        if unk is not None:
            writer.add_unk_token_id(unk)
    else:
        pre = pre_override or detect_pre(tokenizer)
        if pre is None:
            raise ConvertError(
                "tokenizer.json: byte-level pre-tokenizer not recognized "
                f"({json.dumps(tokenizer.get('pre_tokenizer'))[:200]}); name llama.cpp's "
                "pre-tokenizer with --pre (e.g. gpt-2, llama-bpe, smollm)")
        tokens, types, merges = gpt2_vocab(tokenizer, vocab_size)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)
        source = f"byte-level BPE (pre-tokenizer {pre})"
    bos_id = config["bos_id"]
    if bos_id is None and add_bos:  # as convert.py takes it
        bos_id = hf_tokenizer.bos_id(hf_dir, tok_cfg, tokenizer)
    if bos_id is not None:
        writer.add_bos_token_id(bos_id)
    if config["eos_ids"]:
        writer.add_eos_token_id(config["eos_ids"][0])
    cfg = convert.json_object(os.path.join(hf_dir, "config.json"), True)
    pad = cfg.get("pad_token_id")
    if isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < vocab_size:
        writer.add_pad_token_id(pad)
    writer.add_add_bos_token(bool(add_bos))
    writer.add_add_eos_token(False)
    template = hf_tokenizer.chat_template(hf_dir, tok_cfg)
    if template is not None:
        writer.add_chat_template(template)
    return source


# ------------------------------------------------------------------------------ tensors

def tensor_type(name, info, is_norm, qtype):
    """GGML type of one output tensor."""
    if is_norm:
        return QT.F32
    if info.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0]:
        return QT.F16
    return qtype


def byte_shape(shape, qtype):
    """Shape of the numpy array holding a tensor of `shape` in type `qtype`."""
    if qtype not in FLOAT_TYPES:
        return gguf.quants.quant_shape_to_byte_shape(shape, qtype)
    return tuple(shape)


def numpy_type(qtype):
    """numpy dtype of the array holding a tensor of type `qtype` (bytes when quantized)."""
    return {QT.F32: np.float32, QT.F16: np.float16, QT.BF16: np.uint16}.get(qtype, np.uint8)


def encode(values, qtype):
    """float32 rows -> their storage in `qtype`, refusing values out of range."""
    if qtype == QT.F32:
        return values
    if qtype == QT.BF16:
        out = dtypes.f32_to_bf16(values)
        bad = dtypes.non_finite(out, "BF16")
    elif qtype == QT.F16:
        with np.errstate(over="ignore"):
            out = values.astype(np.float16)
        bad = ~np.isfinite(out)
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            out = gguf.quants.quantize(values, qtype)
        # Every block of these types starts with its f16 scale (d), and in Q4_1 and Q5_1
        # that is followed by an f16 minimum (m): decoded back, an overflow shows.
        with np.errstate(over="ignore", invalid="ignore"):
            bad = ~np.isfinite(gguf.quants.dequantize(out, qtype))
    if bad.any():
        raise ConvertError(f"values beyond the {qtype.name} range "
                           f"(max |x| = {np.abs(values).max():g}); choose another --type")
    return out


def convert_tensor(info, qtype, row_order):
    """One whole output tensor, converted from the source one row block at a time."""
    out = np.empty(byte_shape(info.shape, qtype), dtype=numpy_type(qtype))
    row = 0
    for values in convert.f32_blocks(info):
        try:
            encoded = encode(values, qtype)
        except ConvertError as e:
            raise ConvertError(f"tensor '{info.name}': {e}") from None
        rows = slice(row, row + len(values))
        if row_order is None:
            out[rows] = encoded
        else:
            out[row_order[rows]] = encoded
        row += len(values)
    return out


def converted_in_order(jobs):
    """The data of every (gguf name, source, type, row order, shape) job, in job order,
    converted a tensor per core ahead of the one being written (numpy releases the GIL)."""
    def data(job):
        _, source, ttype, order, shape = job
        if isinstance(source, np.ndarray):
            return source
        return convert_tensor(source, ttype, order).reshape(byte_shape(shape, ttype))

    workers = parallel.cores()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        ahead = collections.deque()
        for job in jobs:
            ahead.append(pool.submit(data, job))
            if len(ahead) > workers:
                yield ahead.popleft().result()
        while ahead:
            yield ahead.popleft().result()


def llama3_rope_factors(config):
    """Divisor of each RoPE frequency for llama3 scaling (rope_freqs.weight), as
    Llama 3.1 (and barellm's rope_inverse_frequencies) scale the frequencies."""
    s = config["rope_scaling"]
    head_dim = config["head_dim"]
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_ctx = s["original_max_position_embeddings"]
    factors = []
    for i in range(head_dim // 2):
        freq = config["rope_theta"] ** (-2.0 * i / head_dim)
        wavelength = 2 * math.pi / freq
        if wavelength > old_ctx / low:
            scaled = freq / factor
        elif wavelength >= old_ctx / high:
            smooth = (old_ctx / wavelength - low) / (high - low)
            scaled = (1 - smooth) * freq / factor + smooth * freq
        else:
            scaled = freq
        factors.append(freq / scaled)
    return np.array(factors, dtype=np.float32)


def check_yarn(scaling):
    """Refuse the YaRN settings llama.cpp computes otherwise: its ramp's ends are always
    rounded outward (truncate), and its attention factor is 0.1 ln(factor) + 1."""
    factor = scaling["factor"]
    llama_factor = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
    if not scaling["truncate"] or not math.isclose(scaling["attention_factor"], llama_factor,
                                                   rel_tol=1e-6):
        raise ConvertError("YaRN with truncate false or an attention factor other than "
                           "0.1 ln(factor) + 1: llama.cpp computes it otherwise; cannot write "
                           "this checkpoint as GGUF")


# ------------------------------------------------------------------------------- driver

def add_hparams(writer, config, name):
    """The general.* and {architecture}.* keys."""
    writer.add_name(name)
    writer.add_vocab_size(config["vocab_size"])
    writer.add_context_length(config["max_context"])
    writer.add_embedding_length(config["dim"])
    writer.add_block_count(config["layers"])
    writer.add_feed_forward_length(config["hidden_dim"])
    writer.add_head_count(config["heads"])
    writer.add_head_count_kv(config["kv_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_rope_dimension_count(config.get("rotary_dim", config["head_dim"]))
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["norm_eps"])
    if config.get("experts"):
        writer.add_expert_count(config["experts"])
        writer.add_expert_used_count(config["experts_per_token"])
        writer.add_expert_feed_forward_length(config["moe_hidden_dim"])
    scaling = config["rope_scaling"]
    kind = scaling and scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(scaling["factor"]))
    if kind == "yarn":
        check_yarn(scaling)
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(float(scaling["factor"]))
        writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
        writer.add_float32(f"{writer.arch}.rope.scaling.yarn_beta_fast", scaling["beta_fast"])
        writer.add_float32(f"{writer.arch}.rope.scaling.yarn_beta_slow", scaling["beta_slow"])
    if kind == "longrope":  # the factors are tensors (rope_factors_long, rope_factors_short)
        writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
        writer.add_rope_scaling_attn_factors(scaling["attention_factor"])
    if config["architecture"] == "phi3":  # 0: none, as llama.cpp's converter writes it
        writer.add_sliding_window(config["sliding_window"] or 0)
    if config["architecture"] in ("gemma2", "gemma3"):
        add_gemma_hparams(writer, config)
    if config["architecture"] == "gpt_oss":
        add_gpt_oss_hparams(writer, config)


def add_gpt_oss_hparams(writer, config):
    """gpt-oss's keys (read back by convert/gguf_in.py as llama.cpp reads them): the window
    and the flag of each layer, after refusing a SwiGLU limit llama.cpp does not compute."""
    if config["swiglu_limit"] != gguf_in.GPT_OSS_SWIGLU_LIMIT:
        raise ConvertError(f"swiglu_limit {config['swiglu_limit']:g}: llama.cpp's gpt-oss "
                           f"clamps at {gguf_in.GPT_OSS_SWIGLU_LIMIT:g}; cannot write this "
                           "checkpoint as GGUF")
    kinds = config.get("layer_types") or ["full"] * config["layers"]
    # llama.cpp requires the window; with no sliding layer its value does not matter.
    writer.add_sliding_window(config["sliding_window"] or config["max_context"])
    writer.add_array(f"{writer.arch}.attention.sliding_window_pattern",
                     [kind == "sliding" for kind in kinds])


def add_gemma_hparams(writer, config):
    """Gemma 2's or Gemma 3's keys (read back by convert/gguf_in.py as llama.cpp reads
    them), after refusing what llama.cpp would compute otherwise (see the top)."""
    arch = writer.arch
    gemma2 = arch == "gemma2"
    shape = config["dim"], config["heads"], config["head_dim"], config["layers"]
    layers_27b = gguf_in.GEMMA2_27B_LAYERS if gemma2 else gguf_in.GEMMA3_27B_LAYERS
    llama_scale = gguf_in.gemma_attention_scale(*shape, layers_27b)
    if config["attention_scale"] != llama_scale:
        raise ConvertError(f"query_pre_attn_scalar gives the scale {config['attention_scale']:g}; "
                           f"llama.cpp's {arch} takes {llama_scale:g} "
                           f"(1/sqrt({gguf_in.gemma_query_scalar(*shape, layers_27b)})) for "
                           f"{config['layers']} layers: cannot write this checkpoint as GGUF")
    if gemma2 and not (config.get("attn_logit_softcap") and config.get("final_logit_softcap")):
        raise ConvertError("llama.cpp's gemma2 soft-caps both the attention scores and the "
                           "logits; a checkpoint without attn_logit_softcapping or "
                           "final_logit_softcapping cannot be written as GGUF")
    if not gemma2 and config.get("attn_logit_softcap"):
        raise ConvertError("llama.cpp's gemma3 does not soft-cap the attention scores "
                           "(attn_logit_softcapping): cannot write this checkpoint as GGUF")
    sliding = [kind == "sliding" for kind in config["layer_types"]]
    if any(sliding):
        writer.add_uint32(f"{arch}.attention.sliding_window", config["sliding_window"])
        writer.add_array(f"{arch}.attention.sliding_window_pattern", sliding)
        if "rope_theta_local" in config:
            writer.add_float32(f"{arch}.rope.freq_base_swa", config["rope_theta_local"])
    elif gemma2:  # llama.cpp's gemma2 slides every other layer unless told
        writer.add_array(f"{arch}.attention.sliding_window_pattern", sliding)
    for key, (field, _) in gguf_in.GEMMA2_SOFTCAPS.items():
        if config.get(field):
            writer.add_float32(f"{arch}.{key}", config[field])


def gguf_from_hf(hf_dir, output, type_name=None, pre=None, log=print):
    """Convert the checkpoint in `hf_dir` to the GGUF file `output`; return a summary."""
    if not os.path.isdir(hf_dir):
        raise ConvertError(f"{hf_dir}: not a directory")
    cfg = convert.json_object(os.path.join(hf_dir, "config.json"), required=True)
    gen = convert.json_object(os.path.join(hf_dir, "generation_config.json"), required=False)
    convert.check_architecture(cfg)
    config = convert.model_config(convert.language_model_config(cfg), gen)
    arch_name = GGUF_ARCHITECTURES.get(config["architecture"], config["architecture"])
    check_experts(config)
    check_layer_flags(config, arch_name)
    arch = gguf_in.ARCHITECTURES[arch_name]
    tensors = st.open_checkpoint(hf_dir)
    refuse_output_among_inputs(output, [os.path.join(hf_dir, name) for name in convert.SIDE_FILES]
                               + sorted({info.path for info in tensors.values()}))
    if config["architecture"] == "phi3":
        plan = phi3_fused_plan(config, tensors)
    else:
        if config["architecture"] == "gpt_oss":
            tensors = gpt_oss.split_experts(config, tensors, convert.TEXT_LAYOUT.prefix)
        plan = convert.tensor_plan(config, tensors)
    type_name = type_name or DEFAULT_TYPES[convert.default_weight_dtype(cfg, plan)]
    qtype, file_type = TYPES[type_name]
    refuse_output_in_place_of(output)

    fd, tmp = tempfile.mkstemp(prefix=".gguf-", suffix=".tmp",
                               dir=os.path.dirname(os.path.abspath(output)))
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(tmp, arch_name)
        add_hparams(writer, config, os.path.basename(os.path.normpath(hf_dir)))
        writer.add_file_type(int(file_type))
        if qtype not in FLOAT_TYPES:
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        tokenizer = add_tokenizer(writer, hf_dir, config, pre)

        jobs = []  # (gguf name, TensorInfo or array, type, row order, shape)
        scaling = config["rope_scaling"]
        if scaling and scaling.get("rope_type", scaling.get("type")) == "llama3":
            factors = llama3_rope_factors(config)
            jobs.append(("rope_freqs.weight", factors, QT.F32, None, factors.shape))
        if scaling and scaling.get("rope_type") == "longrope":
            for key, gname in gguf_in.ROPE_FACTORS.items():
                factors = np.array(scaling[key], dtype=np.float32)
                jobs.append((gname, factors, QT.F32, None, factors.shape))
        kept_f16 = []
        for name, info, is_norm in plan:
            ttype = tensor_type(name, info, is_norm, qtype)
            if ttype != qtype and not is_norm:
                kept_f16.append(gguf_name(name, arch))
            order = None
            if arch.interleaved_qk and name.endswith((".wq", ".wk")):
                heads = config["heads"] if name.endswith(".wq") else config["kv_heads"]
                assert info.shape[0] == heads * config["head_dim"]
                order = gguf_in.rope_row_order(info.shape[0], config["head_dim"])
            shape = info.shape
            if ".experts." in name:  # [experts, rows, cols]; a bias [experts, rows]
                shape = (config["experts"], shape[0] // config["experts"], *shape[1:])
            jobs.append((gguf_name(name, arch), info, ttype, order, shape))
        for gname, source, ttype, _, shape in jobs:
            nbytes = math.prod(byte_shape(shape, ttype)) * np.dtype(numpy_type(ttype)).itemsize
            writer.add_tensor_info(gname, byte_shape(shape, ttype),
                                   np.dtype(numpy_type(ttype)), nbytes, raw_dtype=ttype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for data in converted_in_order(jobs):
            writer.write_tensor_data(data)
            del data
        writer.close()
        os.chmod(tmp, umask_applied(0o666))
        os.replace(tmp, output)
    except OSError as e:
        raise ConvertError(f"cannot write output '{output}': {e.strerror or e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    if kept_f16:
        log(f"note: {len(kept_f16)} tensors with rows not whole {qtype.name} blocks kept in "
            f"F16 ({', '.join(kept_f16[:3])}{', ...' if len(kept_f16) > 3 else ''})")
    size = os.path.getsize(output)
    return (f"wrote {output}: {config['layers']} layers, dim {config['dim']}, vocab "
            f"{config['vocab_size']}, {type_name} matrices, tokenizer {tokenizer}, "
            f"{size / 2**20:.1f} MiB")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="gguf_from_hf.py",
        description="Write a llama.cpp GGUF file from a Hugging Face Llama/Mistral/Qwen2/Qwen3/"
        "Gemma 3 checkpoint (the same input as convert/convert.py).")
    parser.add_argument("hf_dir", help="Hugging Face checkpoint directory")
    parser.add_argument("-o", "--output", required=True, help="GGUF file to write")
    parser.add_argument("--type", choices=sorted(TYPES),
                        help="matrix type (default: the checkpoint's own dtype); norms "
                        "are always f32")
    parser.add_argument("--pre", help="llama.cpp pre-tokenizer name for a byte-level BPE "
                        "tokenizer (default: recognized from tokenizer.json)")
    args = parser.parse_args(argv)
    if args.type not in (None, "f32", "f16", "bf16") and not hasattr(gguf, "quants"):
        print(f"gguf_from_hf: this gguf package has no quants module; {args.type} is "
              "unavailable (pip install -U gguf)", file=sys.stderr)
        return 1
    try:
        print(gguf_from_hf(args.hf_dir, args.output, args.type, args.pre))
    except ConvertError as e:
        print(f"gguf_from_hf: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    run_main(main, "gguf_from_hf")  # a stop signal removes the temporary output first
