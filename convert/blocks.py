"""The matrix types of a file with per-matrix types (docs/FORMAT.md), and ggml's block types
among them, which a barellm file holds byte for byte as ggml lays them out.

A block type's matrix is one U8 tensor [rows, cols / WEIGHTS * BYTES]: each row is its
blocks back to back. BLOCK_TYPES gives, per type, the weights and bytes of a block and where
its f16 fields (scales and mins) are, which must be finite: at byte offsets, and for IQ1_M,
whose block has no d field, in the top nibbles of its four u16 scales words (d's bits 4i..4i
+ 3 in word i). MXFP4's scale is a power of two, an E8M0 exponent byte e: 2^(e - 128) times
its levels (up to 12) must be a finite f32, so e is at most 252.
"""

from typing import NamedTuple

import numpy as np

from common import ConvertError
import dtypes


class BlockType(NamedTuple):
    weights: int  # weights per block
    bytes: int  # bytes per block
    f16_fields: tuple  # byte offsets of the block's f16 values
    # Byte offset of the four u16 words whose top nibbles make an f16 value, or None.
    nibble_f16: int = None
    # Byte offset of an E8M0 scale exponent (MXFP4), or None.
    e8m0: int = None


# The largest MXFP4 scale exponent whose weights are finite: 12 * 2^(252 - 128) < 2^128.
LARGEST_MXFP4_EXPONENT = 252


BLOCK_TYPES = {
    "Q4_1": BlockType(32, 20, (0, 2)),
    "Q5_0": BlockType(32, 22, (0,)),
    "Q5_1": BlockType(32, 24, (0, 2)),
    "Q2_K": BlockType(256, 84, (80, 82)),
    "Q3_K": BlockType(256, 110, (108,)),
    "Q4_K": BlockType(256, 144, (0, 2)),
    "Q5_K": BlockType(256, 176, (0, 2)),
    "Q6_K": BlockType(256, 210, (208,)),
    "IQ4_XS": BlockType(256, 136, (0,)),
    "IQ4_NL": BlockType(32, 18, (0,)),
    "IQ2_XXS": BlockType(256, 66, (0,)),
    "IQ2_XS": BlockType(256, 74, (0,)),
    "IQ2_S": BlockType(256, 82, (0,)),
    "IQ3_XXS": BlockType(256, 98, (0,)),
    "IQ3_S": BlockType(256, 110, (0,)),
    "IQ1_S": BlockType(256, 50, (0,)),
    "IQ1_M": BlockType(256, 56, (), nibble_f16=48),
    "MXFP4": BlockType(32, 17, (), e8m0=0),
    "TQ1_0": BlockType(256, 54, (52,)),
    "TQ2_0": BlockType(256, 66, (64,)),
}
# Types a matrix of a file with per-matrix types may have (barellm.matrix_types). Q8_0 and
# Q4_0 are stored as the uniform Q8 and Q4 files store their matrices (NAME and NAME.scale).
FLOAT_TYPES = ("F32", "F16", "BF16")
MATRIX_TYPES = FLOAT_TYPES + ("Q8_0", "Q4_0") + tuple(BLOCK_TYPES)
# weight_dtype of a uniform file -> the type of its matrices whose columns allow it.
UNIFORM_TYPES = {"F32": "F32", "F16": "F16", "BF16": "BF16", "Q8": "Q8_0", "Q4": "Q4_0"}


def uniform_matrix_type(weight_dtype, cols):
    """The type of a matrix of `cols` columns in a uniform file of `weight_dtype`: Q4
    keeps F16 for a matrix whose columns are not whole Q4 blocks."""
    if weight_dtype == "Q4" and dtypes.q4_stays_f16(cols):
        return "F16"
    return UNIFORM_TYPES[weight_dtype]


def row_bytes(type_name, cols):
    """Bytes of one row of `cols` weights of a block type."""
    block = BLOCK_TYPES[type_name]
    return cols // block.weights * block.bytes


def f16_fields(blocks, block):
    """(where, f16 values [n, 1]) of each f16 field of `blocks` (uint8 [n, block.bytes]) of
    the BlockType `block`; `where` names the field's bytes."""
    for offset in block.f16_fields:
        yield f"byte {offset}", blocks[:, offset:offset + 2].copy().view("<f2")
    if block.nibble_f16 is not None:
        offset = block.nibble_f16
        words = blocks[:, offset:offset + 8].copy().view("<u2")
        bits = np.zeros((len(blocks), 1), dtype="<u2")
        for i in range(4):
            bits |= (words[:, i:i + 1] >> 12) << (4 * i)
        yield f"top nibbles of bytes {offset}..{offset + 7}", bits.view("<f2")


def check_blocks(raw, type_name, tensor_name):
    """Refuse rows of blocks (uint8 [rows, row bytes]) holding a NaN or Inf f16 field, or an
    E8M0 exponent under which a weight would not be a finite f32."""
    block = BLOCK_TYPES[type_name]
    blocks = np.ascontiguousarray(raw).reshape(-1, block.bytes)
    if block.e8m0 is not None:
        exponents = blocks[:, block.e8m0]
        if (exponents > LARGEST_MXFP4_EXPONENT).any():
            index = int(np.argmax(exponents > LARGEST_MXFP4_EXPONENT))
            raise ConvertError(f"tensor '{tensor_name}' has scale exponent {exponents[index]} "
                               f"(byte {block.e8m0}) in {type_name} block {index}: its weights "
                               f"would not be finite (at most {LARGEST_MXFP4_EXPONENT})")
    for where, values in f16_fields(blocks, block):
        finite = np.isfinite(values)
        if not finite.all():
            index = int(np.argmin(finite))
            kind = "NaN" if np.isnan(values[index, 0]) else "Inf"
            raise ConvertError(f"tensor '{tensor_name}' has a {kind} f16 field ({where}) "
                               f"in {type_name} block {index}")
