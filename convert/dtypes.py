"""Conversions between the safetensors float dtypes F32, F16 and BF16 with numpy only.

BF16 has no numpy dtype: its values are carried as uint16 bit patterns (the upper
half of an IEEE float32).
"""

import numpy as np

# safetensors dtype name -> numpy dtype holding its raw little-endian bytes.
STORAGE = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}

# command-line spelling -> safetensors dtype name.
CLI_NAMES = {"f32": "F32", "f16": "F16", "bf16": "BF16"}

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
