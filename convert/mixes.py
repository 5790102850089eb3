"""The type of each matrix under llama-quantize's mixes Q2_K, Q3_K_S, Q3_K_M, Q3_K_L,
Q4_K_M, Q5_K_M, Q6_K, IQ4_XS, IQ4_NL and MXFP4_MOE (without an importance matrix;
llama.cpp's llama_tensor_get_type), for the models barellm runs.

- MXFP4_MOE has the experts' matrices in MXFP4 and every other matrix in Q8_0; none of the
  rules below applies to it.

- Each mix has a base type (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ4_NL).
- The output matrix (or the token embedding when it is tied to the output) is Q6_K; Q8_0
  where its rows are not whole blocks of the base type.
- Q4_K_M and Q5_K_M give Q6_K to attn_v (wv) and ffn_down (w2) in the "more bits" layers:
  the first and last eighth of the layers and every third layer between them
  (more_bits).
- Q2_K gives attn_v (wv) Q4_K where four or more query heads share a KV head, else Q3_K,
  and Q3_K to ffn_down (w2) and attn_output (wo).
- Q3_K_S has no other rule. Q3_K_M gives attn_v (wv) Q5_K in layers 0 and 1 and Q4_K in
  the others, ffn_down (w2) Q5_K in the first sixteenth of the layers and Q4_K in the
  others, and attn_output (wo) Q4_K. Q3_K_L gives Q5_K to wv, w2 and wo.
- IQ4_XS and IQ4_NL give Q5_K to attn_v (wv) where four or more query heads share a KV
  head, and to ffn_down (w2) in the first eighth of the layers.
- For a Llama of 80 layers with grouped-query attention (llama.cpp's 70B), a wv that
  would be Q3_K or Q4_K is Q5_K.
- A model of exactly 8 experts (Mixtral) has its wk and wv in Q8_0 under every mix, and its
  wo in Q5_K under Q2_K, Q3_K_S, Q3_K_M, Q4_K_M, IQ4_XS and IQ4_NL; under Q3_K_L its wo
  stays Q3_K (llama.cpp's rule for Q3_K_L's wo is for the other models only).
- A matrix whose rows are not a multiple of 256 falls back to a type of 32-weight
  blocks: Q2_K and Q3_K to Q4_0, Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, IQ4_XS to
  IQ4_NL; rows not a multiple of 32 stay F16 (also those of a 32-weight type chosen).
"""

from typing import NamedTuple

import blocks


class Mix(NamedTuple):
    base: str  # the type of the matrices no rule singles out
    more_bits: bool  # wv and w2 of the more_bits layers become Q6_K


MIXES = {"Q2_K": Mix("Q2_K", False), "Q3_K_S": Mix("Q3_K", False),
         "Q3_K_M": Mix("Q3_K", False), "Q3_K_L": Mix("Q3_K", False),
         "Q4_K_M": Mix("Q4_K", True), "Q5_K_M": Mix("Q5_K", True), "Q6_K": Mix("Q6_K", False),
         "IQ4_XS": Mix("IQ4_XS", False), "IQ4_NL": Mix("IQ4_NL", False),
         "MXFP4_MOE": Mix("Q8_0", False)}
# --dtype spelling -> mix.
CLI_NAMES = {name.lower(): name for name in MIXES}
OUTPUT_TYPE = "Q6_K"
MORE_BITS_TYPE = "Q6_K"
WIDE_OUTPUT_TYPE = "Q8_0"  # an output matrix whose rows are not whole base blocks
# A type of 256-weight super-blocks whose row is not whole super-blocks -> its 32-weight
# counterpart.
FALLBACKS = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0",
             "IQ4_XS": "IQ4_NL"}
FALLBACK_BLOCK = 32
UNQUANTIZED_TYPE = "F16"  # rows that are not whole blocks of 32 either
# llama.cpp's 70B (a Llama of this many layers with grouped-query attention): its wv of
# Q3_K or Q4_K become Q5_K.
LLAMA_70B_LAYERS = 80
LLAMA_70B_WV_RAISED = ("Q3_K", "Q4_K")
LLAMA_70B_WV_TYPE = "Q5_K"
# Q3_K_M and Q3_K_L: the type of wv, w2 and wo (Q3_K_S: the base type for all three).
# Q3_K_M's wv is Q5_K in its first Q3_K_M_WIDER_WV layers, and its w2 in the first
# sixteenth of the layers; Q4_K elsewhere.
Q3_K_M_WIDER_TYPE = "Q5_K"
Q3_K_M_WIDER_WV = 2
Q3_K_M_WIDER_W2_PART = 16
Q3_K_M_TYPE = "Q4_K"
Q3_K_L_TYPE = "Q5_K"
# Where at least this many query heads share each KV head (grouped_wv), the wv of Q2_K and
# of IQ4_MIXES have more bits.
GROUPED_WV_HEADS = 4
# Q2_K's wv, w2 and wo are Q2_K_WIDER_TYPE; its wv Q2_K_GROUPED_WV_TYPE where grouped_wv.
Q2_K_WIDER_TYPE = "Q3_K"
Q2_K_GROUPED_WV_TYPE = "Q4_K"
# The wv of IQ4_MIXES where grouped_wv, and their w2 in the first eighth of the layers, are
# of IQ4_WIDER_TYPE.
IQ4_MIXES = ("IQ4_XS", "IQ4_NL")
IQ4_WIDER_TYPE = "Q5_K"
# MXFP4_MOE: its experts' type (its other matrices have its base type, Q8_0).
MXFP4_MOE = "MXFP4_MOE"
MXFP4_MOE_EXPERTS_TYPE = "MXFP4"
# A model of this many experts per sparse layer: wk and wv of this type, and wo of the
# listed mixes of the other.
EIGHT_EXPERTS = 8
EIGHT_EXPERTS_KV_TYPE = "Q8_0"
EIGHT_EXPERTS_WO_TYPE = "Q5_K"
EIGHT_EXPERTS_WO_MIXES = ("Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_M", "IQ4_XS", "IQ4_NL")


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


def grouped_wv(config):
    """Whether GROUPED_WV_HEADS or more query heads share each KV head (llama.cpp's
    n_gqa() >= 4)."""
    return config["heads"] // config["kv_heads"] >= GROUPED_WV_HEADS


def q2_k_type(short, config):
    """The type of wv, w2 or wo (`short`) under Q2_K."""
    if short == "wv" and grouped_wv(config):
        return Q2_K_GROUPED_WV_TYPE
    return Q2_K_WIDER_TYPE


def q3_k_type(mix, short, layer, config):
    """The type of wv, w2 or wo (`short`) of layer `layer` under Q3_K_M or Q3_K_L."""
    if mix == "Q3_K_L":
        return Q3_K_L_TYPE
    if short == "wv":
        return Q3_K_M_WIDER_TYPE if layer < Q3_K_M_WIDER_WV else Q3_K_M_TYPE
    if short == "w2":
        return (Q3_K_M_WIDER_TYPE if layer < config["layers"] // Q3_K_M_WIDER_W2_PART
                else Q3_K_M_TYPE)
    return Q3_K_M_TYPE


def matrix_type(mix, name, cols, config):
    """The type of the matrix `name` (barellm's name) of `cols` columns under `mix`."""
    base = MIXES[mix].base
    if mix == MXFP4_MOE:
        return with_fallback(MXFP4_MOE_EXPERTS_TYPE if ".experts." in name else base, cols)
    short = name.rsplit(".", 1)[-1]
    is_output = name == "output" or (name == "token_embedding" and config["tied_embeddings"])
    if is_output:
        chosen = WIDE_OUTPUT_TYPE if cols % block_weights(base) else OUTPUT_TYPE
    elif mix == "Q2_K" and short in ("wv", "w2", "wo"):
        chosen = q2_k_type(short, config)
    elif (mix in ("Q3_K_M", "Q3_K_L") and short in ("wv", "w2", "wo")
          and not (short == "wo" and config.get("experts") == EIGHT_EXPERTS)):
        chosen = q3_k_type(mix, short, int(name.split(".")[1]), config)
    elif short in ("wv", "w2") and mix in IQ4_MIXES:
        layer = int(name.split(".")[1])
        wider = grouped_wv(config) if short == "wv" else layer < config["layers"] // 8
        chosen = IQ4_WIDER_TYPE if wider else base
    elif short in ("wv", "w2") and MIXES[mix].more_bits:
        layer = int(name.split(".")[1])
        chosen = MORE_BITS_TYPE if more_bits(layer, config["layers"]) else base
    else:
        chosen = base
    if (short == "wv" and chosen in LLAMA_70B_WV_RAISED and config["architecture"] == "llama"
            and config["layers"] == LLAMA_70B_LAYERS and config["heads"] != config["kv_heads"]):
        chosen = LLAMA_70B_WV_TYPE
    if config.get("experts") == EIGHT_EXPERTS and short in ("wk", "wv"):
        chosen = EIGHT_EXPERTS_KV_TYPE
    elif config.get("experts") == EIGHT_EXPERTS and short == "wo" and mix in EIGHT_EXPERTS_WO_MIXES:
        chosen = EIGHT_EXPERTS_WO_TYPE
    return with_fallback(chosen, cols)


def matrix_types(mix, config, plan):
    """{matrix name: type} of every matrix of `plan` under `mix`, in model order."""
    return {name: matrix_type(mix, name, info.shape[1], config)
            for name, info, is_norm in plan if not is_norm}
