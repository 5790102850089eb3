"""OpenAI's gpt-oss (Hugging Face `model_type` gpt_oss) in barellm's terms (docs/FORMAT.md).

- Config: GptOssConfig's defaults for omitted keys; every layer a mixture of experts whose
  router and experts add biases; attention sinks; q/k/v/o biases (attention_bias); the
  layers' sliding and full attention from layer_types (else sliding on the even layers);
  YaRN; the experts' clamped SwiGLU ("swiglu_oai", its limit swiglu_limit; its sigmoid gain
  swiglu_alpha must be barellm's 1.702).
- Experts: transformers keeps each layer's experts fused. gate_up_proj [experts, dim, 2H]
  multiplies x from the right, its even columns the gate, its odd ones the up projection;
  down_proj [experts, H, dim] likewise; gate_up_proj_bias [experts, 2H] interleaves the
  gate's and the up projection's biases the same way. barellm's stacked experts.w1, w3
  [experts * H, dim] and w2 [experts * dim, H] are their transposes, expert after expert.
- MXFP4 (OpenAI's checkpoints, quantization_config quant_method mxfp4): the experts as
  gate_up_proj_blocks [experts, 2H, dim / 32, 16] and gate_up_proj_scales [experts, 2H,
  dim / 32] (down_proj_* [experts, dim, H / 32, ...]): rows are outputs (barellm's order),
  each block of 32 weights an E8M0 exponent byte and 16 bytes whose low nibble holds weight
  2j and high nibble weight 2j + 1. ggml's block_mxfp4 is the same exponent byte, then 16
  bytes with weight j in the low nibble and weight j + 16 in the high one: the blocks are
  kept bit for bit with their nibbles moved.
"""

import numpy as np

from blocks import check_blocks
from common import ConvertError, float32
import dtypes
import kquants

# GptOssConfig's defaults (gpt-oss-120b's shape).
DEFAULTS = {
    "num_hidden_layers": 36, "num_local_experts": 128, "vocab_size": 201088,
    "hidden_size": 2880, "intermediate_size": 2880, "head_dim": 64,
    "num_attention_heads": 64, "num_key_value_heads": 8, "sliding_window": 128,
    "tie_word_embeddings": False, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "num_experts_per_tok": 4, "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
    "attention_bias": True,
}
DEFAULT_ROPE_THETA = 150000.0
DEFAULT_ROPE_SCALING = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                        "beta_slow": 1.0, "truncate": False,
                        "original_max_position_embeddings": 4096}
# The sigmoid gain of the clamped SwiGLU barellm computes (kSwigluOaiAlpha).
SWIGLU_ALPHA = 1.702
# The only quantization of a checkpoint read: the experts in MXFP4.
QUANT_METHOD = "mxfp4"
LAYER_TYPES = {"sliding_attention": "sliding", "full_attention": "full"}

MXFP4_WEIGHTS = kquants.MXFP4_BLOCK  # weights per block
MXFP4_HALF = MXFP4_WEIGHTS // 2  # bytes of nibbles per block
# E2M1 values of the 16 nibbles as transformers decodes them (-0.0 for code 8; ggml's
# kquants.MXFP4_LEVELS are these doubled, +0 there).
FP4_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6],
                      dtype=np.float32)


def with_defaults(cfg):
    """config.json with GptOssConfig's defaults for the keys it omits (or sets to null, which
    transformers treats as absent), and its RoPE as `rope_theta` plus `rope_scaling`: those
    keys, else `rope_parameters`, else the default YaRN over theta 150000."""
    given = {key: value for key, value in cfg.items()
             if value is not None or key == "sliding_window"}
    merged = {**DEFAULTS, **given}
    params = merged.pop("rope_parameters", None)
    params = params if isinstance(params, dict) else {}
    merged["rope_theta"] = merged.get("rope_theta", params.get("rope_theta", DEFAULT_ROPE_THETA))
    if "rope_scaling" not in merged:
        scaling = {key: value for key, value in params.items() if key != "rope_theta"}
        merged["rope_scaling"] = scaling or dict(DEFAULT_ROPE_SCALING)
    return merged


def check(cfg):
    """Refuse what barellm does not compute for gpt-oss, naming the key."""
    quantization = cfg.get("quantization_config")
    if quantization and (not isinstance(quantization, dict)
                         or quantization.get("quant_method") != QUANT_METHOD):
        method = quantization.get("quant_method") if isinstance(quantization, dict) else None
        raise ConvertError(f"quantization_config quant_method {method!r} is not supported "
                           f"(gpt_oss: only {QUANT_METHOD}, the experts' own blocks)")
    alpha = cfg.get("swiglu_alpha", SWIGLU_ALPHA)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or (
            float32(alpha) != float32(SWIGLU_ALPHA)):
        raise ConvertError(f"swiglu_alpha {alpha!r} is not supported (only {SWIGLU_ALPHA})")


def layer_types(cfg, layers):
    """"sliding" or "full" per layer: config.json's layer_types, else GptOssConfig's default,
    sliding on the even layers."""
    given = cfg.get("layer_types")
    if given is None:
        return ["sliding" if (layer + 1) % 2 else "full" for layer in range(layers)]
    if (not isinstance(given, list) or len(given) != layers
            or not all(isinstance(kind, str) and kind in LAYER_TYPES for kind in given)):
        raise ConvertError(f"config.json: 'layer_types' must list {layers} values, each "
                           "sliding_attention or full_attention")
    return [LAYER_TYPES[kind] for kind in given]


# The fused tensors of a layer's experts (after "mlp.experts."), and the sources the
# converter reads in their place: barellm's name after "layers.{l}." -> (fused tensor, its
# part: "even" or "odd" columns of gate_up_proj, "all" of down_proj).
EXPERT_MATRICES = {"experts.w1": ("gate_up_proj", "even"), "experts.w3": ("gate_up_proj", "odd"),
                   "experts.w2": ("down_proj", "all")}
EXPERT_BIASES = {"experts.b1": ("gate_up_proj_bias", "even"),
                 "experts.b3": ("gate_up_proj_bias", "odd"),
                 "experts.b2": ("down_proj_bias", "all")}
SOURCE_NAME = "mlp.{short} (from mlp.experts.{fused})"


def source_name(short, fused):
    """The name under which the converter's plan knows a part of a fused tensor."""
    return SOURCE_NAME.format(short=short, fused=fused)


def layer_tensors(config, prefix, layer):
    """The expected entries (as convert.py's expected_tensors) of gpt-oss layer `layer`'s
    mixture of experts: the router and its bias, the stacked matrices and their biases."""
    dim, experts, width = config["dim"], config["experts"], config["moe_hidden_dim"]
    p = f"{prefix}layers.{layer}."
    shapes = {"experts.w1": (experts * width, dim), "experts.w3": (experts * width, dim),
              "experts.w2": (experts * dim, width), "experts.b1": (experts * width,),
              "experts.b3": (experts * width,), "experts.b2": (experts * dim,)}
    entries = {p + "mlp.router.weight": (f"layers.{layer}.router", (experts, dim), True),
               p + "mlp.router.bias": (f"layers.{layer}.router_bias", (experts,), True)}
    for short, (fused, _) in {**EXPERT_MATRICES, **EXPERT_BIASES}.items():
        entries[p + source_name(short, fused)] = (f"layers.{layer}.{short}", shapes[short],
                                                  short in EXPERT_BIASES)
    return entries


def split_experts(config, tensors, prefix):
    """The checkpoint's tensors with each layer's fused expert tensors replaced by the
    sources of barellm's stacked ones (under source_name's names): FusedExperts for float
    tensors, Mxfp4Experts for MXFP4 blocks and scales."""
    tensors = dict(tensors)
    dim, experts, width = config["dim"], config["experts"], config["moe_hidden_dim"]
    for layer in range(config["layers"]):
        p = f"{prefix}layers.{layer}.mlp.experts."
        for fused, cols, rows in (("gate_up_proj", dim, 2 * width), ("down_proj", width, dim)):
            parts = {short: part for short, (name, part) in EXPERT_MATRICES.items()
                     if name == fused}
            blocks, scales = p + fused + "_blocks", p + fused + "_scales"
            if blocks in tensors or scales in tensors:
                source = mxfp4_source(tensors, blocks, scales, (experts, rows, cols))
                sources = {short: Mxfp4Experts(source, part, f"{blocks} ({short})")
                           for short, part in parts.items()}
            else:
                info = tensors.pop(p + fused, None)
                if info is None:
                    raise ConvertError(f"missing tensors: {p + fused}")
                expect_shape(p + fused, info, (experts, cols, rows))
                sources = {short: FusedExperts(info, part, f"{p + fused} ({short})")
                           for short, part in parts.items()}
            for short, source in sources.items():
                tensors[f"{prefix}layers.{layer}.{source_name(short, fused)}"] = source
        for short, (fused, part) in EXPERT_BIASES.items():
            name = p + fused
            info = tensors.get(name)
            if info is None:
                raise ConvertError(f"missing tensors: {name}")
            expect_shape(name, info, (experts, 2 * width if "gate_up" in fused else dim))
            tensors[f"{prefix}layers.{layer}.{source_name(short, fused)}"] = FusedExperts(
                info, part, f"{name} ({short})")
        for fused in {fused for fused, _ in EXPERT_BIASES.values()}:
            tensors.pop(p + fused)
    return tensors


def expect_shape(name, info, shape):
    if tuple(info.shape) != tuple(shape):
        raise ConvertError(f"tensor '{name}' has shape {list(info.shape)}, expected "
                           f"{list(shape)}")


def mxfp4_source(tensors, blocks_name, scales_name, shape):
    """(blocks, scales) TensorInfos of one fused MXFP4 tensor of `shape` [experts, rows,
    cols], popped from `tensors`: both present, U8, of the shapes the config gives."""
    experts, rows, cols = shape
    missing = [name for name in (blocks_name, scales_name) if name not in tensors]
    if missing:
        raise ConvertError(f"missing tensors: {', '.join(missing)}")
    if cols % MXFP4_WEIGHTS:
        raise ConvertError(f"tensor '{blocks_name}': {cols} columns are not whole MXFP4 blocks "
                           f"of {MXFP4_WEIGHTS}")
    blocks, scales = tensors.pop(blocks_name), tensors.pop(scales_name)
    groups = cols // MXFP4_WEIGHTS
    for info, expected in ((blocks, (experts, rows, groups, MXFP4_HALF)),
                           (scales, (experts, rows, groups))):
        expect_shape(info.name, info, expected)
        if info.dtype != "U8":
            raise ConvertError(f"tensor '{info.name}' has dtype {info.dtype} (MXFP4 blocks and "
                               "scales are U8)")
    return blocks, scales


def map_tensor(info, dtype):
    try:
        return np.memmap(info.path, dtype=dtype, mode="r", offset=info.offset, shape=info.shape)
    except (OSError, ValueError) as e:
        raise ConvertError(f"cannot map tensor '{info.name}' ({e})") from None


def part_indices(part, count):
    """The indices of `part` ("even", "odd", "all") among `count` interleaved ones."""
    return {"even": slice(0, count, 2), "odd": slice(1, count, 2), "all": slice(0, count)}[part]


class FusedExperts:
    """One of barellm's stacked expert tensors read from transformers' fused one: for a
    matrix ([experts, cols, rows] used as x @ W) expert e's rows are the transpose of its
    `part` columns; for a bias ([experts, rows]) expert e's `part` entries, expert after
    expert. A source for the converter's writer."""

    def __init__(self, info, part, name):
        self.info, self.part, self.name = info, part, name
        self.dtype, self.path = info.dtype, info.path
        experts, last = info.shape[0], info.shape[-1]
        rows = len(range(last)[part_indices(part, last)])
        self.shape = ((experts * rows, info.shape[1]) if len(info.shape) == 3
                      else (experts * rows,))

    def f32_blocks(self):
        if self.info.dtype not in dtypes.STORAGE:
            raise ConvertError(f"tensor '{self.info.name}' has dtype {self.info.dtype} "
                               "(only F32, F16 and BF16 are supported)")
        source = map_tensor(self.info, dtypes.STORAGE[self.info.dtype])
        select = part_indices(self.part, self.info.shape[-1])
        if len(self.info.shape) == 2:
            yield dtypes.to_f32(np.ascontiguousarray(source[:, select]), self.dtype).reshape(-1)
            return
        for expert in range(self.info.shape[0]):
            yield dtypes.to_f32(np.ascontiguousarray(source[expert][:, select].T), self.dtype)


def mxfp4_nibbles(raw):
    """The 4-bit codes [..., 32] of transformers' MXFP4 bytes [..., 16]: weight 2j in the
    low nibble of byte j, weight 2j + 1 in its high nibble."""
    codes = np.empty(raw.shape[:-1] + (MXFP4_WEIGHTS,), dtype=np.uint8)
    codes[..., 0::2] = raw & 0x0F
    codes[..., 1::2] = raw >> 4
    return codes


class Mxfp4Experts:
    """One of barellm's stacked expert matrices from an MXFP4 fused tensor: the `part` rows
    of each expert, as ggml's MXFP4 blocks (block_rows, bit for bit but for the nibbles'
    order) or as float32 values (f32_blocks: code value times 2^(scale - 127))."""

    def __init__(self, source, part, name):
        self.blocks, self.scales = source
        self.part, self.name, self.path = part, name, self.blocks.path
        self.dtype = "MXFP4"
        experts, rows, groups, _ = self.blocks.shape
        self.rows = len(range(rows)[part_indices(part, rows)])
        self.shape = (experts * self.rows, groups * MXFP4_WEIGHTS)

    def _experts(self):
        """(codes [rows, groups, 32], exponents [rows, groups]) of each expert's part."""
        blocks, scales = map_tensor(self.blocks, np.uint8), map_tensor(self.scales, np.uint8)
        select = part_indices(self.part, self.blocks.shape[1])
        for expert in range(self.blocks.shape[0]):
            yield (mxfp4_nibbles(np.ascontiguousarray(blocks[expert, select])),
                   np.ascontiguousarray(scales[expert, select]))

    def block_rows(self, type_name):
        if type_name != "MXFP4":
            return None
        return self._block_rows()

    def _block_rows(self):
        for codes, exponents in self._experts():
            ggml = np.empty(codes.shape[:-1] + (1 + MXFP4_HALF,), dtype=np.uint8)
            ggml[..., 0] = exponents
            ggml[..., 1:] = codes[..., :MXFP4_HALF] | (codes[..., MXFP4_HALF:] << 4)
            rows = ggml.reshape(len(ggml), -1)
            check_blocks(rows, "MXFP4", self.name)
            yield rows

    def f32_blocks(self):
        for codes, exponents in self._experts():
            values = np.ldexp(FP4_VALUES[codes],
                              exponents.astype(np.int32)[..., None] - kquants.E8M0_BIAS)
            yield values.astype(np.float32).reshape(len(codes), -1)


def is_mxfp4(plan):
    """Whether the plan's expert matrices are MXFP4 blocks."""
    return any(getattr(info, "dtype", None) == "MXFP4" for _, info, _ in plan)


def own_types(plan):
    """{matrix: type} keeping each matrix in its checkpoint's type: the MXFP4 experts in
    MXFP4, the others in their float dtype."""
    return {name: info.dtype for name, info, is_norm in plan if not is_norm}
