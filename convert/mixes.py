"""The type of each matrix under llama-quantize's mixes Q4_K_M, Q5_K_M, Q6_K and IQ4_XS
(without an importance matrix), for the models barellm runs.

- Each mix has a base type (Q4_K, Q5_K, Q6_K, IQ4_XS).
- The output matrix (or the token embedding when it is tied to the output) is Q6_K; Q8_0
  where its rows are not whole blocks of the base type.
- Q4_K_M and Q5_K_M give Q6_K to attn_v (wv) and ffn_down (w2) in the "more bits" layers:
  the first and last eighth of the layers and every third layer between them
  (more_bits). For a Llama of 80 layers with grouped-query attention (llama.cpp's 70B),
  the other wv of Q4_K_M are Q5_K.
- IQ4_XS gives Q5_K to attn_v (wv) where four or more query heads share a KV head, and to
  ffn_down (w2) in the first eighth of the layers.
- A model of exactly 8 experts (Mixtral) has its wk and wv in Q8_0 under every mix, and its
  wo in Q5_K under Q4_K_M and IQ4_XS.
- A matrix whose rows are not a multiple of 256 falls back to a type of 32-weight
  blocks: Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0; rows not a multiple of 32 either
  stay F16. IQ4_XS would fall back to IQ4_NL, which barellm does not run: such a
  matrix is refused.
"""

from typing import NamedTuple

import blocks
from common import ConvertError


class Mix(NamedTuple):
    base: str  # the type of the matrices no rule singles out
    more_bits: bool  # wv and w2 of the more_bits layers become Q6_K


MIXES = {"Q4_K_M": Mix("Q4_K", True), "Q5_K_M": Mix("Q5_K", True), "Q6_K": Mix("Q6_K", False),
         "IQ4_XS": Mix("IQ4_XS", False)}
# --dtype spelling -> mix.
CLI_NAMES = {name.lower(): name for name in MIXES}
OUTPUT_TYPE = "Q6_K"
MORE_BITS_TYPE = "Q6_K"
WIDE_OUTPUT_TYPE = "Q8_0"  # an output matrix whose rows are not whole base blocks
# A K-quant whose row is not whole super-blocks -> its 32-weight counterpart.
FALLBACKS = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
FALLBACK_BLOCK = 32
UNQUANTIZED_TYPE = "F16"  # rows that are not whole blocks of 32 either
# llama.cpp's 70B (a Llama of this many layers with grouped-query attention): its wv of
# Q4_K become Q5_K.
LLAMA_70B_LAYERS = 80
# IQ4_XS's wv where at least this many query heads share a KV head, and its w2 in the first
# eighth of the layers, are of this type.
IQ4_XS_WIDER_TYPE = "Q5_K"
IQ4_XS_WIDER_WV_GROUP = 4
# A model of this many experts per sparse layer: wk and wv of this type, and wo of the
# listed mixes of the other.
EIGHT_EXPERTS = 8
EIGHT_EXPERTS_KV_TYPE = "Q8_0"
EIGHT_EXPERTS_WO_TYPE = "Q5_K"
EIGHT_EXPERTS_WO_MIXES = ("Q4_K_M", "IQ4_XS")


def more_bits(layer, layers):
    """llama.cpp's use_more_bits: the first and last eighth of the layers, and every third
    layer from the first eighth on."""
    eighth = layers // 8
    return layer < eighth or layer >= 7 * layers // 8 or (layer - eighth) % 3 == 2


def block_weights(type_name):
    return blocks.BLOCK_TYPES[type_name].weights if type_name in blocks.BLOCK_TYPES else 32


def with_fallback(type_name, cols):
    """`type_name`, or its fallback where rows of `cols` are not whole blocks of it."""
    if cols % block_weights(type_name) == 0:
        return type_name
    fallback = FALLBACKS.get(type_name, type_name)
    return fallback if cols % FALLBACK_BLOCK == 0 else UNQUANTIZED_TYPE


def matrix_type(mix, name, cols, config):
    """The type of the matrix `name` (barellm's name) of `cols` columns under `mix`."""
    base = MIXES[mix].base
    short = name.rsplit(".", 1)[-1]
    is_output = name == "output" or (name == "token_embedding" and config["tied_embeddings"])
    if is_output:
        chosen = WIDE_OUTPUT_TYPE if cols % block_weights(base) else OUTPUT_TYPE
    elif short in ("wv", "w2") and base == "IQ4_XS":
        layer = int(name.split(".")[1])
        wider = (config["heads"] // config["kv_heads"] >= IQ4_XS_WIDER_WV_GROUP if short == "wv"
                 else layer < config["layers"] // 8)
        chosen = IQ4_XS_WIDER_TYPE if wider else base
    elif short in ("wv", "w2") and MIXES[mix].more_bits:
        layer = int(name.split(".")[1])
        chosen = MORE_BITS_TYPE if more_bits(layer, config["layers"]) else base
        if (short == "wv" and chosen == "Q4_K" and config["architecture"] == "llama"
                and config["layers"] == LLAMA_70B_LAYERS
                and config["heads"] != config["kv_heads"]):
            chosen = "Q5_K"
    else:
        chosen = base
    if config.get("experts") == EIGHT_EXPERTS and short in ("wk", "wv"):
        chosen = EIGHT_EXPERTS_KV_TYPE
    elif config.get("experts") == EIGHT_EXPERTS and short == "wo" and mix in EIGHT_EXPERTS_WO_MIXES:
        chosen = EIGHT_EXPERTS_WO_TYPE
    if chosen == "IQ4_XS" and cols % block_weights(chosen):
        raise ConvertError(f"--dtype iq4_xs: matrix '{name}' has rows of {cols} columns, not "
                           f"whole blocks of {block_weights(chosen)}; llama-quantize would "
                           "store it as IQ4_NL, which barellm does not run")
    return with_fallback(chosen, cols)


def matrix_types(mix, config, plan):
    """{matrix name: type} of every matrix of `plan` under `mix`, in model order."""
    return {name: matrix_type(mix, name, info.shape[1], config)
            for name, info, is_norm in plan if not is_norm}
