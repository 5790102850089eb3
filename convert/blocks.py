"""The matrix types of a file with per-matrix types (docs/FORMAT.md), and ggml's block types
among them, which a barellm file holds byte for byte as ggml lays them out.

A block type's matrix is one U8 tensor [rows, cols / WEIGHTS * BYTES]: each row is its
blocks back to back. BLOCK_TYPES gives, per type, the weights and bytes of a block and the
byte offsets of its f16 fields (scales and mins), which must be finite.
"""

from typing import NamedTuple

import numpy as np

from common import ConvertError
import dtypes


class BlockType(NamedTuple):
    weights: int  # weights per block
    bytes: int  # bytes per block
    f16_fields: tuple  # byte offsets of the block's f16 values


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


def check_blocks(raw, type_name, tensor_name):
    """Refuse rows of blocks (uint8 [rows, row bytes]) holding a NaN or Inf f16 field."""
    block = BLOCK_TYPES[type_name]
    blocks = np.ascontiguousarray(raw).reshape(-1, block.bytes)
    for offset in block.f16_fields:
        values = blocks[:, offset:offset + 2].copy().view("<f2")
        finite = np.isfinite(values)
        if not finite.all():
            index = int(np.argmin(finite))
            kind = "NaN" if np.isnan(values[index, 0]) else "Inf"
            raise ConvertError(f"tensor '{tensor_name}' has a {kind} f16 field (byte "
                               f"{offset}) in {type_name} block {index}")
