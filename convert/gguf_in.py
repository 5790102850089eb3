"""A GGUF file (llama.cpp) as the converter's input: its config, tokenizer and tensors in
barellm's terms.

- Architectures: ARCHITECTURES maps `general.architecture` (llama, qwen2, qwen3, gemma2,
  gemma3, qwen3moe, gpt-oss; llama with `llama.expert_count` is Mixtral) to
  what differs between them (tensor names, the config flags of q/k/v biases, per-head q/k
  norms and Gemma's post-norms, whether llama.cpp stored q and k rows interleaved for its
  RoPE: llama yes, the Qwens and Gemma no); another architecture is refused, naming it.
  Gemma's further fields follow llama.cpp's rules for gemma2 and gemma3 (_gemma2_fields,
  _gemma3_fields).
- Config: from the `{arch}.*` keys (CONFIG_KEYS); RoPE scaling from `rope.scaling.*` or,
  for Llama 3, from the `rope_freqs` tensor.
- Tokenizer: gguf_tokenizer.py.
- Tensors: GGUFTensor gives a tensor's float32 row blocks (any type the gguf package
  can dequantize); for Q8_0 and Q4_0, its own values and f16 scales, which are exactly
  barellm's Q8 and Q4 blocks; for a block type (blocks.BLOCK_TYPES), its rows of blocks
  byte for byte. llama.cpp's converter reorders the q and k rows of each head so that its
  RoPE rotates neighbouring elements; reading puts them back in Hugging Face's rotate-half
  order, which barellm uses (whole rows: a row's blocks stay together).
- Experts: llama.cpp stacks each sparse layer's experts into one 3-dimensional tensor per
  matrix (ffn_gate_exps, ffn_up_exps, ffn_down_exps), expert after expert, which is
  barellm's stacked matrix with the first two dimensions merged; its router
  (ffn_gate_inp) becomes the F32 `router`. llama.cpp rescales the chosen experts' weights
  to sum to 1 for Mixtral, Qwen3-MoE and gpt-oss (norm_topk_prob).
- gpt-oss (llama.cpp's openai-moe): q/k/v/o biases, attention sinks (attn_sinks), its
  `post_attention_norm` the feed-forward's norm, the router's and the experts' biases
  (ffn_gate_inp.bias; ffn_*_exps.bias [experts, rows], flattened expert after expert), the
  clamped SwiGLU with llama.cpp's fixed limit GPT_OSS_SWIGLU_LIMIT, sliding layers by
  `attention.sliding_window_pattern` (default: the even layers), YaRN.
- Matrix types: without --dtype, a file whose matrices one uniform weight_dtype keeps
  exactly becomes that uniform file; any other keeps each matrix in its own type where
  barellm runs it (blocks.MATRIX_TYPES) and dequantizes the rest to F16, naming them.
"""

import math
from typing import NamedTuple

import numpy as np

from common import ConvertError, float32
import blocks
import gguf_file
import gguf_tokenizer
import rotary

# Elements converted at a time (as convert.py's CHUNK_ELEMENTS).
CHUNK_ELEMENTS = 1 << 23
# GGUF value types (gguf.GGUFValueType) by kind.
INTEGER_TYPES = {0, 1, 2, 3, 4, 5, 10, 11}
FLOAT32_TYPE = 6
FLOAT_TYPES = {FLOAT32_TYPE, 12}
BOOL_TYPE, STRING_TYPE, ARRAY_TYPE = 7, 8, 9
# The type of a matrix whose GGUF type barellm does not run, in a file of per-matrix types.
DEQUANTIZED_TYPE = "F16"
# general.file_type values: the flag llama.cpp adds when it guessed the type.
GUESSED_FILE_TYPE = 1024
# The mix name of a file of per-matrix types whose file type is not known, or is a
# uniform weight_dtype's name (F32, F16, BF16) although the matrices differ.
UNKNOWN_MIX = "mixed"
Q8_0_BLOCK_BYTES = 34  # an f16 scale, then 32 int8 values
Q4_0_BLOCK_BYTES = 18  # an f16 scale, then 16 bytes of two 4-bit values each
GGUF_BLOCK = 32  # weights per Q8_0 or Q4_0 block
LLAMA3_SCALING_DEFAULTS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192}
ROPE_FREQS = "rope_freqs.weight"
# barellm tensor name -> llama.cpp's (per layer: the part after "blk.{l}.").
LLAMA_GLOBAL_TENSORS = {"token_embedding": "token_embd.weight",
                        "final_norm": "output_norm.weight", "output": "output.weight"}
LLAMA_LAYER_TENSORS = {"attn_norm": "attn_norm.weight", "wq": "attn_q.weight",
                       "wk": "attn_k.weight", "wv": "attn_v.weight",
                       "wo": "attn_output.weight", "ffn_norm": "ffn_norm.weight",
                       "w1": "ffn_gate.weight", "w3": "ffn_up.weight",
                       "w2": "ffn_down.weight"}


# A sparse layer's router and stacked experts (a dense layer's w1, w3, w2 it has not).
MOE_TENSORS = {"router": "ffn_gate_inp.weight", "experts.w1": "ffn_gate_exps.weight",
               "experts.w3": "ffn_up_exps.weight", "experts.w2": "ffn_down_exps.weight"}
# The barellm architecture of a GGUF architecture whose layers have experts.
MOE_ARCHITECTURES = {"llama": "mixtral", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss"}
# gpt-oss's layer beyond Llama's attention and experts: biases, sinks, its feed-forward norm
# named post_attention_norm, the router's and experts' biases.
GPT_OSS_LAYER_TENSORS = {
    **{short: name for short, name in LLAMA_LAYER_TENSORS.items()
       if short not in ("w1", "w3", "w2", "ffn_norm")},
    "bq": "attn_q.bias", "bk": "attn_k.bias", "bv": "attn_v.bias", "bo": "attn_output.bias",
    "sinks": "attn_sinks.weight", "ffn_norm": "post_attention_norm.weight", **MOE_TENSORS,
    "router_bias": "ffn_gate_inp.bias", "experts.b1": "ffn_gate_exps.bias",
    "experts.b3": "ffn_up_exps.bias", "experts.b2": "ffn_down_exps.bias",
}
# llama.cpp's gpt-oss: the SwiGLU's limit is a constant; of each GPT_OSS_SWA_PATTERN layers
# all but the last slide.
GPT_OSS_SWIGLU_LIMIT = 7.0
GPT_OSS_SWA_PATTERN = 2
# Mixture-of-experts keys of what barellm does not compute: shared experts (Qwen2-MoE,
# DeepSeek), dense leading layers (DeepSeek).
UNSUPPORTED_MOE_KEYS = {"expert_shared_count": "shared experts",
                        "expert_shared_feed_forward_length": "shared experts",
                        "leading_dense_block_count": "dense leading layers"}

# The optional parts of a layer (barellm config flags, docs/FORMAT.md): their tensors.
QKV_BIAS_TENSORS = {"bq": "attn_q.bias", "bk": "attn_k.bias", "bv": "attn_v.bias"}
QK_NORM_TENSORS = {"q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight"}


class Architecture(NamedTuple):
    """How one `general.architecture` maps onto barellm."""

    barellm_name: str  # the config's "architecture"
    global_tensors: dict  # barellm name -> llama.cpp name
    layer_tensors: dict  # barellm layer suffix -> llama.cpp suffix after "blk.{l}."
    # llama.cpp's converter interleaved the rows of q and k (its llama RoPE rotates
    # neighbours); False where it keeps Hugging Face's rotate-half order (NEOX RoPE).
    interleaved_qk: bool
    # Config flags that are always true, and those true when layer 0 holds the tensor
    # named (flag -> llama.cpp suffix): llama.cpp loads q/k/v biases where present.
    flags: tuple = ()
    optional_flags: dict = {}


# Gemma's norms on the outputs of attention and of the feed-forward network.
POST_NORM_TENSORS = {"post_attn_norm": "post_attention_norm.weight",
                     "post_ffn_norm": "post_ffw_norm.weight"}
# llama.cpp's rules for gemma3 (src/models/gemma3.cpp): without a
# `attention.sliding_window_pattern` key, of each GEMMA3_SWA_PATTERN layers all but the last
# are sliding; the sliding layers' RoPE base is `rope.freq_base_swa`, else
# GEMMA3_LOCAL_ROPE_THETA, without scaling; queries are scaled by head_dim^-1/2, but by
# (dim / heads)^-1/2 in the 27B model (query_pre_attn_scalar 168), which has
# GEMMA3_27B_LAYERS layers.
GEMMA3_SWA_PATTERN = 6
GEMMA3_LOCAL_ROPE_THETA = 10000.0
GEMMA3_27B_LAYERS = 62
# llama.cpp's rules for gemma2 (src/models/gemma2.cpp): a window of GEMMA2_WINDOW positions
# without `attention.sliding_window`; of each GEMMA2_SWA_PATTERN layers all but the last
# slide (every other layer, from layer 0); the sliding layers' RoPE base is the model's unless
# `rope.freq_base_swa` says; the queries' scale is gemma3's rule with the 27B model's
# GEMMA2_27B_LAYERS; the scores and the logits are always soft-capped, with the caps of
# GEMMA2_SOFTCAPS without their keys.
GEMMA2_WINDOW = 4096
GEMMA2_SWA_PATTERN = 2
GEMMA2_27B_LAYERS = 46
# GGUF key suffix -> (barellm.config field, llama.cpp's gemma2 default).
GEMMA2_SOFTCAPS = {"attn_logit_softcapping": ("attn_logit_softcap", 50.0),
                   "final_logit_softcapping": ("final_logit_softcap", 30.0)}


def gemma_query_scalar(dim, heads, head_dim, layers, layers_27b=GEMMA3_27B_LAYERS):
    """The s of the scale s^-1/2 llama.cpp's gemma3 (gemma2: layers_27b GEMMA2_27B_LAYERS)
    gives the queries (the rules above)."""
    return dim // heads if layers == layers_27b else head_dim


def gemma_attention_scale(dim, heads, head_dim, layers, layers_27b=GEMMA3_27B_LAYERS):
    """That scale, as an f32 value."""
    scalar = gemma_query_scalar(dim, heads, head_dim, layers, layers_27b)
    return float(np.float32(1) / np.sqrt(np.float32(scalar)))
# What barellm lacks for architectures close to those it runs.
UNSUPPORTED = {"qwen2moe": "Qwen2-MoE's shared expert is not implemented"}

ARCHITECTURES = {
    "llama": Architecture("llama", LLAMA_GLOBAL_TENSORS, {**LLAMA_LAYER_TENSORS, **MOE_TENSORS},
                          True),
    "qwen2": Architecture("qwen2", LLAMA_GLOBAL_TENSORS,
                          {**LLAMA_LAYER_TENSORS, **QKV_BIAS_TENSORS}, False,
                          optional_flags={"qkv_bias": QKV_BIAS_TENSORS["bq"]}),
    "qwen3": Architecture("qwen3", LLAMA_GLOBAL_TENSORS,
                          {**LLAMA_LAYER_TENSORS, **QKV_BIAS_TENSORS, **QK_NORM_TENSORS},
                          False, flags=("qk_norm",),
                          optional_flags={"qkv_bias": QKV_BIAS_TENSORS["bq"]}),
    # llama.cpp's gemma2 and gemma3 norms already hold the multiplier 1 + w (its converter
    # adds 1), as barellm files do.
    "gemma2": Architecture("gemma2", LLAMA_GLOBAL_TENSORS,
                           {**LLAMA_LAYER_TENSORS, **POST_NORM_TENSORS}, False,
                           flags=("post_norms",)),
    "gemma3": Architecture("gemma3", LLAMA_GLOBAL_TENSORS,
                           {**LLAMA_LAYER_TENSORS, **QK_NORM_TENSORS, **POST_NORM_TENSORS},
                           False, flags=("qk_norm", "post_norms")),
    "qwen3moe": Architecture("qwen3_moe", LLAMA_GLOBAL_TENSORS,
                             {**LLAMA_LAYER_TENSORS, **QK_NORM_TENSORS, **MOE_TENSORS},
                             False, flags=("qk_norm",)),
    # Phi-3 and Phi-4: q, k and v fused (PHI3_FUSED_QKV) unless the file holds them apart;
    # the gate and up rows always fused in ffn_up (PHI3_FUSED_GATE_UP).
    "phi3": Architecture("phi3", LLAMA_GLOBAL_TENSORS, LLAMA_LAYER_TENSORS, False),
    "gpt-oss": Architecture("gpt_oss", LLAMA_GLOBAL_TENSORS, GPT_OSS_LAYER_TENSORS, False,
                            flags=("qkv_bias", "o_bias", "attention_sinks")),
}
PHI3_FUSED_QKV = "attn_qkv.weight"
PHI3_FUSED_GATE_UP = "ffn_up.weight"
# Phi-3's LongRoPE: the divisors of the rotated pairs' frequencies beyond the original
# context and within it.
ROPE_FACTORS = {"long_factor": "rope_factors_long.weight",
                "short_factor": "rope_factors_short.weight"}


def rope_row_order(rows, head_dim):
    """order[r]: the interleaved (llama.cpp) row holding rotate-half (Hugging Face) row r.

    Within each head, rotate-half row t * head_dim/2 + i (t = 0, 1) is interleaved row
    2i + t; so rotate-half rows are interleaved[order], and interleaved[order] = rows
    puts them the other way."""
    half = head_dim // 2
    row = np.arange(rows)
    head, within = row // head_dim, row % head_dim
    t, i = within // half, within % half
    return head * head_dim + 2 * i + t


# ---------------------------------------------------------------------------- key values

class Keys:
    """Typed access to the GGUF keys; errors name the key."""

    def __init__(self, entries):
        self.entries = entries  # key -> (types, value), as gguf_file.read_header gives

    def has(self, key):
        return key in self.entries

    def _typed(self, key, allowed, what):
        if key not in self.entries:
            return None
        types, value = self.entries[key]
        if not types or types[0] not in allowed:
            raise ConvertError(f"GGUF key '{key}' is not {what}")
        return value

    def integer(self, key, default=None, required=True):
        value = self._typed(key, INTEGER_TYPES, "an integer")
        if value is None:
            value = default
        if value is None and required:
            raise ConvertError(f"GGUF key '{key}' is missing")
        if value is not None and value <= 0:
            raise ConvertError(f"GGUF key '{key}' must be positive, not {value}")
        return value

    def whole_number(self, key):
        """An integer key that may be 0, or None when absent."""
        return self._typed(key, INTEGER_TYPES, "an integer")

    def any_number(self, key):
        """A number key of any value, or None when absent."""
        return self._typed(key, INTEGER_TYPES | FLOAT_TYPES, "a number")

    def number(self, key, default=None):
        value = self._typed(key, INTEGER_TYPES | FLOAT_TYPES, "a number")
        if value is None:
            value = default
        elif self.entries[key][0][0] == FLOAT32_TYPE:
            value = float(str(np.float32(value)))  # the shortest decimal of the float32
        else:
            value = float(value)
        if value is None:
            raise ConvertError(f"GGUF key '{key}' is missing")
        if not 0 < float32(value) < math.inf:
            raise ConvertError(f"GGUF key '{key}' must be a positive float32, not {value!r}")
        return value

    def string(self, key):
        return self._typed(key, {STRING_TYPE}, "a string")

    def flag(self, key):
        return self._typed(key, {BOOL_TYPE}, "a bool")

    def array(self, key, item_types, what):
        types, value = self.entries.get(key, (None, None))
        if types is None:
            return None
        if types[0] != ARRAY_TYPE or (value and types[-1] not in item_types):
            raise ConvertError(f"GGUF key '{key}' is not an array of {what}")
        return value

    def tokenizer_keys(self):
        """The tokenizer.ggml.* values gguf_tokenizer.vocabulary reads, type-checked."""
        prefix = "tokenizer.ggml."
        values = {}
        for name in ("model", "pre"):
            values[prefix + name] = self.string(prefix + name)
        for name in ("tokens", "merges"):
            values[prefix + name] = self.array(prefix + name, {STRING_TYPE}, "strings")
        values[prefix + "token_type"] = self.array(prefix + "token_type", INTEGER_TYPES,
                                                   "integers")
        values[prefix + "scores"] = self.array(prefix + "scores", FLOAT_TYPES, "floats")
        for name in ("add_bos_token", "add_space_prefix"):
            values[prefix + name] = self.flag(prefix + name)
        for name in ("bos", "eos", "eot", "eom"):
            key = f"{prefix}{name}_token_id"
            values[key] = self._typed(key, INTEGER_TYPES, "an integer")
        return {key: value for key, value in values.items() if value is not None}


# -------------------------------------------------------------------------------- tensors

class GGUFTensor:
    """One tensor of the GGUF file, read in row blocks, rows in Hugging Face order.

    `shape` is Hugging Face's ([rows, cols], or [n] for a vector), `dtype` the ggml type
    name. f32_blocks() and quantized_blocks() are what convert.py's writer asks of a
    source."""

    def __init__(self, path, layout, head_order=None, rows=None):
        self.name = layout.name
        self.qtype = layout.ggml_type
        self.dtype = self.qtype.name
        self.shape = tuple(reversed(layout.dims))
        self.path, self.layout = path, layout
        # The order of each head's rows (q and k: an order within one head), else None.
        self.head_order = None if head_order is None else np.asarray(head_order)
        # [first, last) of the stored rows this tensor is (a part of a fused one), else None.
        self.rows = rows
        if rows is not None:
            self.name = f"{layout.name} (rows {rows[0]} to {rows[1] - 1})"
            self.shape = (rows[1] - rows[0],) + self.shape[1:]

    def _row_slices(self):
        """(slice, row order within it or None) of consecutive row blocks; with a row
        order, blocks hold whole heads."""
        if len(self.shape) == 1:
            yield slice(None), None
            return
        rows, cols = math.prod(self.shape[:-1]), self.shape[-1]
        first = self.rows[0] if self.rows is not None else 0
        step = max(1, CHUNK_ELEMENTS // cols)
        head_dim = None if self.head_order is None else len(self.head_order)
        if head_dim:
            step = max(1, step // head_dim) * head_dim
        for start in range(0, rows, step):
            count = min(step, rows - start)
            order = rotary.head_rows(count, head_dim, self.head_order) if head_dim else None
            yield slice(first + start, first + start + count), order

    def _bytes(self):
        return gguf_file.map_tensor(self.path, self.layout)

    def _decode(self, raw):
        """float32 values of stored rows (bytes)."""
        try:
            values = gguf_file.gguf.quants.dequantize(np.ascontiguousarray(raw), self.qtype)
        except NotImplementedError:
            raise ConvertError(f"tensor '{self.name}' has type {self.dtype}, which the gguf "
                               "package cannot dequantize") from None
        return np.asarray(values, dtype=np.float32).reshape(raw.shape[:-1] + self.shape[-1:])

    def f32_blocks(self):
        """Yield the tensor as float32 row blocks."""
        data = self._bytes()
        for rows, order in self._row_slices():
            values = self._decode(data[rows])
            yield values if order is None else values[order]

    def quantized_blocks(self, kind):
        """For a Q8_0 tensor and `kind` "Q8", or Q4_0 and "Q4", a generator of (values,
        f16 scales) row blocks that are barellm's blocks of that kind bit for bit (Q8:
        int8 values; Q4: the packed bytes, in the same nibble order); else None."""
        if (self.dtype, kind) == ("Q8_0", "Q8"):
            return self._blocks(Q8_0_BLOCK_BYTES, np.int8)
        if (self.dtype, kind) == ("Q4_0", "Q4"):
            return self._blocks(Q4_0_BLOCK_BYTES, np.uint8)
        return None

    def block_rows(self, type_name):
        """For a tensor of the block type `type_name` (blocks.BLOCK_TYPES), a generator of
        its rows of blocks, byte for byte (uint8 [rows, row bytes] blocks of rows; q and k
        rows put in rotate-half order whole, as a row's blocks cover only that row); else
        None. Refuses blocks with a NaN or Inf f16 field."""
        if self.dtype != type_name or type_name not in blocks.BLOCK_TYPES:
            return None
        return self._block_rows()

    def _block_rows(self):
        data = self._bytes()
        for row_slice, order in self._row_slices():
            raw = np.ascontiguousarray(data[row_slice])
            blocks.check_blocks(raw, self.dtype, self.name)
            yield raw if order is None else raw[order]

    def _blocks(self, block_bytes, value_type):
        """(values, scales) row blocks of a tensor whose blocks of 32 weights are an f16
        scale then `block_bytes - 2` bytes of values."""
        cols = self.shape[-1]
        data = self._bytes()
        for row_slice, order in self._row_slices():
            blocks = np.ascontiguousarray(data[row_slice]).reshape(
                -1, cols // GGUF_BLOCK, block_bytes)
            scales = np.ascontiguousarray(blocks[:, :, :2]).view("<f2")[:, :, 0]
            values = np.ascontiguousarray(blocks[:, :, 2:]).view(value_type).reshape(
                len(blocks), -1)
            if not np.isfinite(scales).all():
                raise ConvertError(f"tensor '{self.name}' has a NaN or Inf {self.dtype} scale")
            if value_type == np.int8 and (values == -128).any():
                raise ConvertError(f"tensor '{self.name}' holds the Q8_0 value -128, "
                                   "outside barellm's Q8 range [-127, 127]; convert with "
                                   "--dtype f32")
            yield (values, scales) if order is None else (values[order], scales[order])


# ---------------------------------------------------------------------------- the model

class GGUFModel:
    """A checked GGUF file: its architecture, keys and tensors."""

    def __init__(self, path):
        self.path = path
        contents = gguf_file.read_header(path)
        self.keys = Keys(contents.keys)
        self.tensors = contents.tensors
        arch = self.keys.string("general.architecture")
        if arch is None:
            raise ConvertError("GGUF key 'general.architecture' is missing")
        if arch not in ARCHITECTURES:
            why = f": {UNSUPPORTED[arch]}" if arch in UNSUPPORTED else ""
            raise ConvertError(f"architecture '{arch}' is not supported{why} "
                               f"(only {', '.join(sorted(ARCHITECTURES))})")
        self.arch_name, self.arch = arch, ARCHITECTURES[arch]

    def _key(self, suffix):
        return f"{self.arch_name}.{suffix}"

    def mix_name(self):
        """The name of the file's mix from general.file_type (MOSTLY_Q4_K_M: "Q4_K_M"),
        UNKNOWN_MIX where that is absent, unknown or the name of a uniform weight_dtype."""
        value = self.keys.whole_number("general.file_type")
        if value is None:
            return UNKNOWN_MIX
        try:
            name = gguf_file.gguf.LlamaFileType(value & ~GUESSED_FILE_TYPE).name
        except ValueError:
            return UNKNOWN_MIX
        name = name.split("_", 1)[1]  # after MOSTLY_ or ALL_
        return UNKNOWN_MIX if name in blocks.UNIFORM_TYPES else name

    def vocabulary(self, vocab_size):
        return gguf_tokenizer.vocabulary(self.keys.tokenizer_keys(), vocab_size)

    def vocab_size(self):
        """`{arch}.vocab_size`, else the length of the token list."""
        size = self.keys.integer(self._key("vocab_size"), required=False)
        if size is None:
            tokens = self.keys.array("tokenizer.ggml.tokens", {STRING_TYPE}, "strings")
            if tokens is None:
                raise ConvertError("GGUF key 'tokenizer.ggml.tokens' is missing")
            if not tokens:
                raise ConvertError("GGUF key 'tokenizer.ggml.tokens' is empty")
            size = len(tokens)
        return size

    def config(self):
        """barellm.config (docs/FORMAT.md) without add_bos, bos_id, eos_ids and
        weight_dtype, which the caller fills in."""
        k, integer = self._key, self.keys.integer
        dim = integer(k("embedding_length"))
        heads = integer(k("attention.head_count"))
        kv_heads = integer(k("attention.head_count_kv"), heads)
        if heads % kv_heads:
            raise ConvertError(f"{heads} attention heads are not a multiple of {kv_heads} "
                               "key/value heads")
        if not self.keys.has(k("attention.key_length")) and dim % heads:
            raise ConvertError(f"embedding length {dim} is not a multiple of {heads} heads")
        head_dim = integer(k("attention.key_length"), dim // heads)
        value = integer(k("attention.value_length"), head_dim)
        if value != head_dim:
            raise ConvertError(f"GGUF key '{k('attention.value_length')}' is {value}, not the "
                               f"head size {head_dim} (not supported)")
        rotary_dim = integer(k("rope.dimension_count"), head_dim)
        partial_allowed = self.arch_name == "phi3" and rotary_dim < head_dim and rotary_dim % 2 == 0
        if rotary_dim != head_dim and not partial_allowed:
            raise ConvertError(f"GGUF key '{k('rope.dimension_count')}' is {rotary_dim}, not "
                               f"the head size {head_dim} (not supported; phi3 may rotate an "
                               "even number of elements below it)")
        if head_dim % 2:
            raise ConvertError(f"head size {head_dim} is odd (RoPE needs it even)")
        theta = self.keys.number(k("rope.freq_base"), 10000.0)
        layers = integer(k("block_count"))
        context = integer(k("context_length"))
        extra = {"rotary_dim": rotary_dim} if rotary_dim != head_dim else {}
        if self.arch_name == "gemma2":
            window, gemma = self._gemma2_fields(dim, heads, head_dim, layers, theta)
            extra.update(gemma)
        elif self.arch_name == "gemma3":
            window, gemma = self._gemma3_fields(dim, heads, head_dim, layers)
            extra.update(gemma)
        elif self.arch_name == "gpt-oss":
            window, fields = self._gpt_oss_fields(layers, theta)
            extra.update(fields)
        elif self.arch_name == "phi3":
            # 0 (llama.cpp's converter writes it for Phi-4) or wider than the context: none.
            window = self._window_key()
            window = window if window and window < context else None
        else:
            window = integer(k("attention.sliding_window"), required=False)
        flags = {flag: True for flag in self.arch.flags}
        flags.update({flag: True for flag, suffix in self.arch.optional_flags.items()
                      if f"blk.0.{suffix}" in self.tensors})
        experts = self._expert_fields()
        architecture = self.arch.barellm_name
        if experts:
            architecture = MOE_ARCHITECTURES[self.arch_name]
        elif self.arch_name in ("qwen3moe", "gpt-oss"):
            raise ConvertError(f"GGUF key '{k('expert_count')}' is missing")
        return {
            "architecture": architecture,
            "dim": dim,
            "hidden_dim": integer(k("feed_forward_length"), experts.get("moe_hidden_dim")),
            "layers": layers,
            "heads": heads,
            "kv_heads": kv_heads,
            "head_dim": head_dim,
            "vocab_size": self.vocab_size(),
            "max_context": context,
            "rope_theta": theta,
            "rope_scaling": self._rope_scaling(theta, rotary_dim),
            "norm_eps": self.keys.number(k("attention.layer_norm_rms_epsilon")),
            "sliding_window": window,
            **flags,
            **extra,
            **experts,
            "tied_embeddings": self.arch.global_tensors["output"] not in self.tensors,
            "bos_id": None,
            "eos_ids": [],
            "add_bos": None,
            "weight_dtype": None,
        }

    def _expert_fields(self):
        """The mixture-of-experts fields of the config ({} without `expert_count`): every
        layer sparse, the chosen experts' weights rescaled to sum to 1, as llama.cpp
        computes them."""
        k = self._key
        count = self.keys.whole_number(k("expert_count"))
        if not count:
            return {}
        if self.arch_name not in MOE_ARCHITECTURES:
            raise ConvertError(f"architecture '{self.arch_name}' with experts is not supported "
                               "(only llama, as Mixtral, qwen3moe and gpt-oss)")
        for key, what in UNSUPPORTED_MOE_KEYS.items():
            if self.keys.whole_number(k(key)):
                raise ConvertError(f"GGUF key '{k(key)}': {what} are not supported")
        scale = self.keys.any_number(k("expert_weights_scale"))
        if scale not in (None, 0, 1):
            raise ConvertError(f"GGUF key '{k('expert_weights_scale')}' is {scale:g}: scaled "
                               "expert weights are not supported")
        if count < 0:
            raise ConvertError(f"GGUF key '{k('expert_count')}' must be positive, not {count}")
        per_token = self.keys.integer(k("expert_used_count"))
        if per_token > count:
            raise ConvertError(f"GGUF key '{k('expert_used_count')}' is {per_token}, more "
                               f"than the {count} experts")
        width = self.keys.integer(k("expert_feed_forward_length"), required=False)
        if width is None:
            width = self.keys.integer(k("feed_forward_length"))
        fields = {"experts": count, "experts_per_token": per_token, "moe_hidden_dim": width,
                  "norm_topk_prob": True}
        if self.arch_name == "gpt-oss":
            fields["expert_biases"] = True
        return fields

    def _gpt_oss_fields(self, layers, theta):
        """(sliding_window, the fields gpt-oss adds to the config) as llama.cpp reads them: a
        window (`attention.sliding_window`, required) on the layers of
        `attention.sliding_window_pattern` (default GPT_OSS_SWA_PATTERN); a sliding layers'
        RoPE base other than the model's (`rope.freq_base_swa`) is refused."""
        k = self._key
        window = self._window_key()
        if window is None:
            raise ConvertError(f"GGUF key '{k('attention.sliding_window')}' is missing or 0 "
                               "(gpt-oss slides on some layers)")
        local_theta = self.keys.number(k("rope.freq_base_swa"), theta)
        if local_theta != theta:
            raise ConvertError(f"GGUF key '{k('rope.freq_base_swa')}' is {local_theta:g}, not "
                               f"the model's {theta:g}: gpt-oss with another RoPE base on its "
                               "sliding layers is not supported")
        sliding = self._sliding_layers(layers, GPT_OSS_SWA_PATTERN)
        window = window if any(sliding) else None
        fields = {"activation": "swiglu_oai", "swiglu_limit": GPT_OSS_SWIGLU_LIMIT}
        if window is not None:
            fields["layer_types"] = ["sliding" if flag else "full" for flag in sliding]
        return window, fields

    def _window_key(self, default=None):
        """`attention.sliding_window` (Gemma's and Phi-3's), else `default`; None where it is 0
        or absent; a negative one is refused."""
        k = self._key
        window = self.keys.whole_number(k("attention.sliding_window"))
        window = default if window is None else window
        if window is not None and window < 0:
            raise ConvertError(f"GGUF key '{k('attention.sliding_window')}' must not be "
                               f"negative, not {window}")
        return window or None

    @staticmethod
    def _gemma_common_fields(dim, sliding):
        """The fields gemma2 and gemma3 both add: GeGLU, √dim scaling the embedding, each
        layer's attention (`sliding`: one flag per layer)."""
        return {
            "activation": "gelu_tanh",
            "embedding_scale": float(np.sqrt(np.float32(dim))),
            "layer_types": ["sliding" if is_sliding else "full" for is_sliding in sliding],
        }

    def _gemma2_fields(self, dim, heads, head_dim, layers, theta):
        """(sliding_window, the fields gemma2 adds to the config) by llama.cpp's rules
        (GEMMA2_*)."""
        k = self._key
        window = self._window_key(GEMMA2_WINDOW)
        sliding = (self._sliding_layers(layers, GEMMA2_SWA_PATTERN) if window
                   else [False] * layers)
        window = window if any(sliding) else None
        fields = self._gemma_common_fields(dim, sliding)
        fields["attention_scale"] = gemma_attention_scale(dim, heads, head_dim, layers,
                                                          GEMMA2_27B_LAYERS)
        local_theta = self.keys.number(k("rope.freq_base_swa"), theta)
        if local_theta != theta:
            fields["rope_theta_local"] = local_theta
        for key, (field, default) in GEMMA2_SOFTCAPS.items():
            fields[field] = self.keys.number(k(key), default)
        return window, fields

    def _gemma3_fields(self, dim, heads, head_dim, layers):
        """(sliding_window, the fields gemma3 adds to the config) by llama.cpp's rules
        (GEMMA3_*): the logits soft-capped where `final_logit_softcapping` is set; an
        `attn_logit_softcapping`, which llama.cpp's gemma3 does not read, is refused."""
        k = self._key
        attention_cap = self.keys.any_number(k("attn_logit_softcapping"))
        if attention_cap:
            raise ConvertError(f"GGUF key '{k('attn_logit_softcapping')}' is "
                               f"{attention_cap:g}: gemma3 with soft-capped attention scores "
                               "is not supported (gemma2 is)")
        window = self._window_key()
        sliding = (self._sliding_layers(layers, GEMMA3_SWA_PATTERN) if window
                   else [False] * layers)
        fields = {
            **self._gemma_common_fields(dim, sliding),
            "rope_theta_local": self.keys.number(k("rope.freq_base_swa"),
                                                 GEMMA3_LOCAL_ROPE_THETA),
            "attention_scale": gemma_attention_scale(dim, heads, head_dim, layers),
        }
        if self.keys.any_number(k("final_logit_softcapping")):
            fields["final_logit_softcap"] = self.keys.number(k("final_logit_softcapping"))
        return window, fields

    def _sliding_layers(self, layers, default_period):
        """Whether each layer is sliding: `attention.sliding_window_pattern` as one flag per
        layer, or as a period N (layer l slides unless l % N == N - 1; N = 0: every layer
        slides), default_period when absent."""
        key = self._key("attention.sliding_window_pattern")
        types, value = self.keys.entries.get(key, (None, None))
        if types and types[0] == ARRAY_TYPE:
            flags = self.keys.array(key, INTEGER_TYPES | {BOOL_TYPE}, "flags")
            if len(flags) != layers:
                raise ConvertError(f"GGUF key '{key}' has {len(flags)} entries for {layers} "
                                   "layers")
            return [bool(flag) for flag in flags]
        period = self.keys.whole_number(key)
        period = default_period if period is None else period
        if period < 0:
            raise ConvertError(f"GGUF key '{key}' must not be negative, not {period}")
        return [period == 0 or layer % period < period - 1 for layer in range(layers)]

    def _rope_scaling(self, theta, head_dim):
        """rope_scaling from `rope.scaling.type` (none, linear or yarn), the rope_freqs tensor
        (Llama 3) or the rope_factors_long and rope_factors_short tensors (Phi-3's LongRoPE).
        `head_dim`: the elements rotated."""
        if any(name in self.tensors for name in ROPE_FACTORS.values()):
            return self._longrope_scaling(head_dim)
        kind = self.keys.string(self._key("rope.scaling.type")) or "none"
        if kind == "yarn":
            return self._yarn_scaling()
        if kind not in ("none", "linear"):
            raise ConvertError(f"RoPE scaling type '{kind}' is not supported (none, linear, "
                               "yarn, or Llama 3 rope_freqs)")
        if ROPE_FREQS in self.tensors:
            if kind != "none":
                raise ConvertError(f"both {ROPE_FREQS} and {kind} RoPE scaling (not "
                                   "supported)")
            return self._llama3_scaling(theta, head_dim)
        if kind == "linear":
            factor = self.keys.number(self._key("rope.scaling.factor"))
            return {"rope_type": "linear", "factor": factor}
        return None

    def _longrope_scaling(self, rotary_dim):
        """LongRoPE as llama.cpp's phi3 computes it: a divisor per rotated pair from
        rope_factors_long beyond `rope.scaling.original_context_length` positions (else the
        context length), from rope_factors_short within; cos and sin times
        `rope.scaling.attn_factor` (default 1)."""
        if self.arch_name != "phi3":
            raise ConvertError(f"{ROPE_FACTORS['long_factor']} (LongRoPE) is not supported for "
                               f"architecture '{self.arch_name}' (only phi3)")
        scaling = {"rope_type": "longrope"}
        for key, name in ROPE_FACTORS.items():
            if name not in self.tensors:
                raise ConvertError(f"missing tensors: {name} (LongRoPE needs both factor sets)")
            scaling[key] = [float(value) for value in self._rope_divisors(name, rotary_dim // 2)]
        k = self._key
        scaling["original_max_position_embeddings"] = self.keys.integer(
            k("rope.scaling.original_context_length"), self.keys.integer(k("context_length")))
        scaling["attention_factor"] = self.keys.number(k("rope.scaling.attn_factor"), 1.0)
        return scaling

    def _yarn_scaling(self):
        """YaRN as llama.cpp applies it: `rope.scaling.factor`, the original context
        `rope.scaling.original_context_length` (default `context_length`), `yarn_beta_fast`
        and `yarn_beta_slow` (32 and 1), the ramp's ends rounded outward; cos and sin times
        0.1 ln(factor) + 1 (1 for a factor up to 1) and `rope.scaling.attn_factor` (1).
        The keys that change llama.cpp's mix or scale otherwise (`yarn_ext_factor` other
        than 1, `yarn_log_multiplier`, `yarn_attn_factor`) are refused."""
        k = self._key
        for key, allowed in (("rope.scaling.yarn_ext_factor", (None, 1)),
                             ("rope.scaling.yarn_log_multiplier", (None, 0)),
                             ("rope.scaling.yarn_attn_factor", (None, 1))):
            value = self.keys.any_number(k(key))
            if value not in allowed:
                raise ConvertError(f"GGUF key '{k(key)}' is {value:g}: YaRN with it is not "
                                   "supported")
        factor = self.keys.number(k("rope.scaling.factor"))
        mscale = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
        return {"rope_type": "yarn", "factor": factor,
                "original_max_position_embeddings": self.keys.integer(
                    k("rope.scaling.original_context_length"),
                    self.keys.integer(k("context_length"))),
                "beta_fast": self.keys.number(k("rope.scaling.yarn_beta_fast"), 32.0),
                "beta_slow": self.keys.number(k("rope.scaling.yarn_beta_slow"), 1.0),
                "truncate": True,
                "attention_factor": mscale * self.keys.number(k("rope.scaling.attn_factor"), 1.0)}

    def _rope_divisors(self, name, pairs):
        """The vector tensor `name` of a divisor per rotated pair (rope_freqs,
        rope_factors_long, rope_factors_short), float64; each must be a positive number."""
        source = GGUFTensor(self.path, self.tensors[name])
        if source.shape != (pairs,):
            raise ConvertError(f"{name} has shape {list(source.shape)}, expected [{pairs}]")
        divisors = next(source.f32_blocks()).astype(np.float64)
        if not (np.isfinite(divisors).all() and (divisors > 0).all()):
            raise ConvertError(f"{name} holds values that are not positive numbers")
        return divisors

    def _llama3_scaling(self, theta, head_dim):
        """The llama3 rope_scaling whose frequency divisors are the rope_freqs tensor.

        llama.cpp stores the divisor of each RoPE frequency; Llama 3.x derive them from
        factor, low_freq_factor, high_freq_factor and the original context. The factor is
        the largest divisor; the other three are the GGUF's `rope.scaling.*` where given,
        else Llama 3.1's (1, 4, 8192); the tensor must then match to float32 rounding."""
        divisors = self._rope_divisors(ROPE_FREQS, head_dim // 2)
        if (divisors == 1).all():
            return None
        scaling = {"rope_type": "llama3", "factor": float(divisors.max())}
        keys = {"original_max_position_embeddings": "rope.scaling.original_context_length"}
        for name, default in LLAMA3_SCALING_DEFAULTS.items():
            key = self._key(keys.get(name, f"rope.scaling.{name}"))
            if name == "original_max_position_embeddings":
                scaling[name] = self.keys.integer(key, default)
            else:
                scaling[name] = self.keys.number(key, default)
        expected = llama3_divisors(theta, scaling, head_dim)
        if not np.allclose(divisors, expected, rtol=1e-5, atol=0):
            raise ConvertError(f"{ROPE_FREQS} is not Llama 3 RoPE scaling with factor "
                               f"{scaling['factor']:g}, low_freq_factor "
                               f"{scaling['low_freq_factor']:g}, high_freq_factor "
                               f"{scaling['high_freq_factor']:g} and original context "
                               f"{scaling['original_max_position_embeddings']}")
        return scaling

    def _source(self, name, config):
        """(llama.cpp tensor name, [first, last) of its rows or None: all) of the barellm
        tensor `name`: Phi-3's q, k and v are rows of attn_qkv where the file fuses them,
        its gate and up projections the first and second half of ffn_up's rows."""
        gguf_name = self._gguf_name(name)
        if self.arch_name != "phi3" or not name.startswith("layers."):
            return gguf_name, None
        _, layer, short = name.split(".", 2)
        q_rows = config["heads"] * config["head_dim"]
        kv_rows = config["kv_heads"] * config["head_dim"]
        fused_qkv = f"blk.{layer}.{PHI3_FUSED_QKV}"
        parts = {"wq": (fused_qkv, (0, q_rows)),
                 "wk": (fused_qkv, (q_rows, q_rows + kv_rows)),
                 "wv": (fused_qkv, (q_rows + kv_rows, q_rows + 2 * kv_rows)),
                 "w1": (f"blk.{layer}.{PHI3_FUSED_GATE_UP}", (0, config["hidden_dim"])),
                 "w3": (f"blk.{layer}.{PHI3_FUSED_GATE_UP}",
                        (config["hidden_dim"], 2 * config["hidden_dim"]))}
        if short in ("wq", "wk", "wv") and fused_qkv not in self.tensors:
            return gguf_name, None
        return parts.get(short, (gguf_name, None))

    def _check_fused(self, sources):
        """A fused tensor must have exactly the rows of its parts."""
        ends = {}
        for gguf_name, rows in sources.values():
            if rows is not None:
                ends[gguf_name] = max(ends.get(gguf_name, 0), rows[1])
        for gguf_name, end in ends.items():
            stored = tuple(reversed(self.tensors[gguf_name].dims))
            if len(stored) != 2 or stored[0] != end:
                raise ConvertError(f"tensor '{gguf_name}' has shape {list(stored)}, expected "
                                   f"{end} rows from the config")

    def _gguf_name(self, name):
        if name.startswith("layers."):
            _, layer, short = name.split(".", 2)
            return f"blk.{layer}.{self.arch.layer_tensors[short]}"
        return self.arch.global_tensors[name]

    def plan(self, config, expected):
        """[(barellm name, GGUFTensor, is_norm)] in output order, checking the file holds
        exactly these tensors with the shapes of `expected` ({barellm name: (shape,
        is_norm)}, in output order)."""
        sources = {name: self._source(name, config) for name in expected}
        used = list(dict.fromkeys(gguf_name for gguf_name, _ in sources.values()))
        missing = [gguf_name for gguf_name in used if gguf_name not in self.tensors]
        if missing:
            raise ConvertError(f"missing tensors: {', '.join(missing[:5])}")
        extra = sorted(n for n in self.tensors if n not in used and n != ROPE_FREQS
                       and n not in ROPE_FACTORS.values())
        if extra:
            raise ConvertError(f"unexpected tensors: {', '.join(extra[:5])}")
        self._check_fused(sources)
        head_dim = config["head_dim"]
        partial = rotary.partial_rotary_order(head_dim, config.get("rotary_dim", head_dim))
        plan = []
        for name, (gguf_name, rows) in sources.items():
            shape, is_norm = expected[name]
            tensor = self.tensors[gguf_name]
            short = name.rsplit(".", 1)[-1]
            head_order = None
            if short in ("wq", "wk"):
                if self.arch.interleaved_qk:
                    head_order = rope_row_order(head_dim, head_dim)
                elif "rotary_dim" in config:
                    head_order = partial
            source = GGUFTensor(self.path, tensor, head_order, rows)
            if short in ("w1", "w3", "w2") and len(source.shape) == 3:
                # Stacked experts [experts, rows, cols]: one matrix, expert after expert.
                source.shape = (source.shape[0] * source.shape[1], source.shape[2])
            if short in ("b1", "b3", "b2") and len(source.shape) == 2:
                # The experts' biases [experts, rows]: one vector, expert after expert.
                source = FlatVector(source)
            if source.shape != tuple(shape):
                raise ConvertError(f"tensor '{gguf_name}' has shape {list(source.shape)}, "
                                   f"expected {list(shape)} from the config")
            plan.append((name, source, is_norm))
        return plan


class FlatVector:
    """A GGUFTensor of several rows as one vector, row after row: a source for
    convert.py's writer."""

    def __init__(self, source):
        self.source, self.name, self.dtype = source, source.name, source.dtype
        self.shape = (math.prod(source.shape),)

    def f32_blocks(self):
        for values in self.source.f32_blocks():
            yield values.reshape(-1)


def llama3_divisors(theta, scaling, head_dim):
    """The divisor of each RoPE frequency under llama3 scaling (as src/weights/config.cpp
    scales them: float32 settings, float64 arithmetic)."""
    factor, low, high = (float32(scaling[key]) for key in
                         ("factor", "low_freq_factor", "high_freq_factor"))
    context = scaling["original_max_position_embeddings"]
    divisors = []
    for i in range(head_dim // 2):
        frequency = float32(theta) ** (-2 * i / head_dim)
        wavelength = 2 * math.pi / frequency
        if wavelength > context / low:
            divisors.append(factor)
        elif wavelength < context / high:
            divisors.append(1.0)
        else:
            smooth = (context / wavelength - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(divisors)


def own_types(plan):
    """{barellm name: the GGUF type of each matrix}, in model order."""
    return {name: source.dtype for name, source, is_norm in plan if not is_norm}


def uniform_weight_dtype(plan):
    """The weight_dtype of a uniform file (F32, F16, BF16, Q8, Q4) that stores every matrix
    of the GGUF file in its own type, or None when there is none: a file of several
    types (beyond Q4's F16 matrices whose columns are not whole blocks) or of a block
    type."""
    types = own_types(plan)
    shapes = {name: source.shape for name, source, is_norm in plan if not is_norm}
    for weight_dtype in blocks.UNIFORM_TYPES:
        if all(blocks.uniform_matrix_type(weight_dtype, shapes[name][-1]) == kind
               for name, kind in types.items()):
            return weight_dtype
    return None


def kept_types(plan):
    """{barellm name: type} keeping each matrix in its own type where barellm has it
    (blocks.MATRIX_TYPES), else F16 (dequantized)."""
    return {name: kind if kind in blocks.MATRIX_TYPES else DEQUANTIZED_TYPE
            for name, kind in own_types(plan).items()}


def dequantized_note(plan):
    """One line naming the matrices dequantized to F16 because barellm has no kernels
    for their type, by type; None when there are none."""
    changed = {}
    for _, source, is_norm in plan:
        if not is_norm and source.dtype not in blocks.MATRIX_TYPES:
            changed.setdefault(source.dtype, []).append(source.name)
    if not changed:
        return None
    parts = [f"{len(names)} {kind} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
             for kind, names in sorted(changed.items())]
    return (f"dequantized to {DEQUANTIZED_TYPE} (types barellm does not run): "
            f"{'; '.join(parts)}")


def changed_types_note(plan, weight_dtype):
    """One line naming the matrices whose type changes (by source type), or None."""
    changed = {}
    for _, source, is_norm in plan:
        # Under Q4 a matrix whose columns are not whole blocks is stored as F16.
        stored = blocks.uniform_matrix_type(weight_dtype, source.shape[-1])
        if not is_norm and source.dtype != stored:
            changed.setdefault(source.dtype, []).append(source.name)
    if not changed:
        return None
    count = sum(len(names) for names in changed.values())
    parts = [f"{len(names)} {kind} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
             for kind, names in sorted(changed.items())]
    tensors = "tensor" if count == 1 else "tensors"
    return f"{count} {tensors} stored as {weight_dtype} from other types: {'; '.join(parts)}"
