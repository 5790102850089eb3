"""Conversions between the safetensors float dtypes F32, F16 and BF16, and the Q8 and Q4
quantizations of docs/FORMAT.md, with numpy only.

BF16 has no numpy dtype: its values are carried as uint16 bit patterns (the upper
half of an IEEE float32).
"""

import numpy as np

# safetensors dtype name -> numpy dtype holding its raw little-endian bytes.
STORAGE = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}

# command-line spelling -> safetensors dtype name.
# "Q8" and "Q4" are not safetensors dtypes but barellm's weight_dtype for int8 matrices
# with f16 scales (quantize_q8) and 4-bit matrices with f16 scales (quantize_q4).
CLI_NAMES = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8": "Q8", "q4": "Q4"}

# Q8: columns per scale group along each row.
Q8_GROUP = 32

# Q4 (llama.cpp's Q4_0): columns per block along each row; a matrix whose columns are
# not whole blocks stays F16 in a Q4 file.
Q4_BLOCK = 32
Q4_OFFSET = 8  # a weight is scale * (q - Q4_OFFSET), q in 0..15

# torch_dtype strings of config.json -> safetensors dtype name.
TORCH_NAMES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def bf16_to_f32(bits):
    """Widen BF16 bit patterns (uint16 array) to float32 exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values):
    """Narrow float32 values to BF16 bit patterns, rounding to nearest even.

    Overflow rounds to +-Inf as IEEE rounding does; NaN stays NaN (quiet, sign kept).
    """
    floats = np.ascontiguousarray(values, dtype=np.float32)
    bits = floats.view(np.uint32)
    rounding = np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))
    out = ((bits + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(floats)
    if nan.any():
        out[nan] = ((bits[nan] >> 16) | np.uint32(0x0040)).astype(np.uint16)
    return out


def to_f32(raw, dtype):
    """Convert raw storage of safetensors dtype `dtype` to a float32 array."""
    if dtype == "BF16":
        return bf16_to_f32(raw)
    return np.asarray(raw, dtype=np.float32)


def from_f32(values, dtype):
    """Convert float32 values to the raw storage of safetensors dtype `dtype`.

    Values beyond the F16 range become +-Inf, silently: callers check non_finite().
    """
    if dtype == "BF16":
        return f32_to_bf16(values)
    with np.errstate(over="ignore"):
        return np.asarray(values, dtype=STORAGE[dtype])


def non_finite(raw, dtype):
    """Boolean mask of the NaN/Inf elements of raw storage in dtype `dtype`."""
    if dtype == "BF16":
        return (np.asarray(raw) & np.uint16(0x7F80)) == np.uint16(0x7F80)
    return ~np.isfinite(raw)


def q8_groups(cols):
    """Number of Q8 scale groups of a row of `cols` columns."""
    return -(-cols // Q8_GROUP)


def quantize_q8(values):
    """Quantize a float32 matrix [rows, cols] to Q8 (docs/FORMAT.md).

    Each row is cut into groups of Q8_GROUP columns (the last one may be shorter).
    A group's scale is max|w| / 127 computed in float32 and rounded to f16; its values
    are w / scale (float32 division by the f16 scale) rounded to the nearest integer,
    ties away from zero, clamped to [-127, 127]. A group whose f16 scale is 0 (all
    zeros, or so tiny that the scale underflows) gets values 0. Returns
    (int8 [rows, cols], float16 [rows, q8_groups(cols)]); a scale beyond the f16 range
    comes back as Inf for the caller to refuse.
    """
    values = np.asarray(values, dtype=np.float32)
    rows, cols = values.shape
    groups = q8_groups(cols)
    padded = np.zeros((rows, groups * Q8_GROUP), dtype=np.float32)
    padded[:, :cols] = values
    grouped = padded.reshape(rows, groups, Q8_GROUP)
    amax = np.abs(grouped).max(axis=2)
    with np.errstate(over="ignore"):
        scales = (amax / np.float32(127)).astype(np.float16)
    divisor = scales.astype(np.float32)[:, :, None]
    usable = (divisor > 0) & np.isfinite(divisor)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(usable, grouped / np.where(usable, divisor, 1), 0).astype(np.float32)
    # Round half away from zero. x - trunc(x) is exact in float32, so ties are exact.
    whole = np.trunc(ratio)
    ties = np.abs(ratio - whole) == 0.5
    rounded = np.where(ties, whole + np.sign(ratio), np.rint(ratio))
    quantized = np.clip(rounded, -127, 127).astype(np.int8)
    return quantized.reshape(rows, groups * Q8_GROUP)[:, :cols], scales


def q4_stays_f16(cols):
    """Whether a matrix of `cols` columns is stored F16 rather than Q4 in a Q4 file."""
    return cols % Q4_BLOCK != 0


def quantize_q4(values):
    """Quantize a float32 matrix [rows, cols] (cols a multiple of Q4_BLOCK) to Q4
    (docs/FORMAT.md), with llama.cpp's rule for Q4_0, all in float32.

    Per block of Q4_BLOCK columns: `m` is the value of largest magnitude (the first one
    on ties), sign kept; d = m / -8; q = min(15, trunc(w * (1 / d) + 8.5)) (q = 8 when
    d is 0); the scale stored is d rounded to f16. Byte j of a block holds q of column j
    in its low nibble and of column j + 16 in its high nibble. Returns (uint8 [rows,
    cols / 2], float16 [rows, cols / Q4_BLOCK]); a scale beyond the f16 range comes back
    as Inf for the caller to refuse.
    """
    values = np.asarray(values, dtype=np.float32)
    rows, cols = values.shape
    blocks = values.reshape(rows, cols // Q4_BLOCK, Q4_BLOCK)
    largest = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=2)[..., None], axis=2)
    # ggml starts from +0: a block of zeros has d = +0 / -8 = -0, whatever its zeros' signs.
    largest = np.where(largest != 0, largest, np.float32(0))
    d = largest / np.float32(-Q4_OFFSET)
    with np.errstate(divide="ignore"):
        inverse = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    with np.errstate(invalid="ignore"):
        shifted = np.trunc(blocks * inverse + np.float32(Q4_OFFSET + 0.5))
    q = shifted.astype(np.uint8).clip(0, 15)
    half = Q4_BLOCK // 2
    packed = q[..., :half] | (q[..., half:] << np.uint8(4))
    with np.errstate(over="ignore"):
        scales = d[..., 0].astype(np.float16)
    return packed.reshape(rows, cols // 2), scales


def dequantize_q4(packed, scales):
    """The float32 weights [rows, cols] of Q4 `packed` [rows, cols / 2] and `scales`."""
    packed = np.asarray(packed, dtype=np.uint8)
    rows = packed.shape[0]
    blocks = packed.reshape(rows, -1, Q4_BLOCK // 2)
    q = np.concatenate([blocks & np.uint8(0x0F), blocks >> np.uint8(4)], axis=2)
    signed = q.astype(np.float32) - Q4_OFFSET
    return (signed * np.asarray(scales, dtype=np.float32)[..., None]).reshape(rows, -1)
