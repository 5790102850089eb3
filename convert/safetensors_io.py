"""Hand-written safetensors reading and header writing (numpy only).

Layout: [u64 little-endian N][N bytes of JSON header][tensor bytes]; the header maps
each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} with offsets
relative to the first byte after the header, plus an optional "__metadata__" map.
"""

import math
import os
import struct
from typing import NamedTuple

import numpy as np

from common import ConvertError, compact_json, parse_json, read_json
from dtypes import STORAGE

ITEM_SIZES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1,
    "BOOL": 1,
}


class TensorInfo(NamedTuple):
    """Where one tensor lives: its file, absolute byte offset, dtype and shape."""

    name: str
    dtype: str
    shape: tuple
    path: str
    offset: int
    nbytes: int


def read_header(path):
    """Parse and validate the header of the safetensors file at `path`.

    Returns (tensors, metadata): a dict name -> TensorInfo and the `__metadata__` map.
    Raises ConvertError for a malformed or truncated file.
    """
    name = os.path.basename(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise ConvertError(f"{name}: not a safetensors file (only {size} bytes)")
            (header_len,) = struct.unpack("<Q", prefix)
            if 8 + header_len > size:
                raise ConvertError(
                    f"{name}: file is truncated (header of {header_len} bytes, "
                    f"file has {size} bytes)")
            header_bytes = f.read(header_len)
    except OSError as e:
        raise ConvertError(f"{name}: cannot read ({e.strerror})") from None
    header = parse_json(header_bytes, f"{name}: safetensors header")
    if not isinstance(header, dict):
        raise ConvertError(f"{name}: invalid safetensors header (not a JSON object)")
    metadata = header.pop("__metadata__", None) or {}
    data_start = 8 + header_len
    tensors = {}
    for tensor_name, entry in header.items():
        info = _tensor_info(name, path, tensor_name, entry, data_start)
        if info.offset + info.nbytes > size:
            raise ConvertError(
                f"{name}: file is truncated (tensor '{tensor_name}' ends at byte "
                f"{info.offset + info.nbytes}, file has {size} bytes)")
        tensors[tensor_name] = info
    _check_layout(name, tensors.values(), data_start, size)
    return tensors, metadata


def _check_layout(file_name, tensors, data_start, file_size):
    """The tensors must tile the data section, as the safetensors format requires: in
    offset order each starts where the one before ends (no overlap, no gap) and the last
    ends with the file."""
    position, previous = data_start, "the header"
    for info in sorted(tensors, key=lambda t: (t.offset, t.nbytes)):
        where = f"{file_name}: tensor '{info.name}'"
        if info.offset < position:
            raise ConvertError(f"{where} overlaps {previous}")
        if info.offset > position:
            raise ConvertError(f"{where} starts {info.offset - position} bytes after the end "
                               f"of {previous} (bytes of no tensor)")
        position, previous = info.offset + info.nbytes, f"tensor '{info.name}'"
    if position < file_size:
        raise ConvertError(f"{file_name}: {file_size - position} bytes after the end of "
                           f"{previous} belong to no tensor")


def _tensor_info(file_name, path, tensor_name, entry, data_start):
    """Validate one header entry and turn it into a TensorInfo."""
    where = f"{file_name}: tensor '{tensor_name}'"
    try:
        dtype = entry["dtype"]
        shape = tuple(entry["shape"])
        begin, end = entry["data_offsets"]
    except (TypeError, KeyError, ValueError):
        raise ConvertError(f"{where}: malformed header entry") from None
    if not (isinstance(dtype, str) and all(_is_count(n) for n in (*shape, begin, end))
            and begin <= end):
        raise ConvertError(f"{where}: malformed header entry")
    if dtype not in ITEM_SIZES:
        raise ConvertError(f"{where}: unknown dtype {dtype!r}")
    if end - begin != math.prod(shape) * ITEM_SIZES[dtype]:
        raise ConvertError(
            f"{where}: data_offsets cover {end - begin} bytes but shape {list(shape)} "
            f"of {dtype} needs {math.prod(shape) * ITEM_SIZES[dtype]}")
    return TensorInfo(tensor_name, dtype, shape, path, data_start + begin, end - begin)


def _is_count(value):
    """Whether `value` is a non-negative int (true and false are not)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def open_checkpoint(hf_dir):
    """Index every tensor of the Hugging Face checkpoint in `hf_dir`.

    Uses model.safetensors.index.json when present, else model.safetensors, else every
    *.safetensors file. Returns a dict name -> TensorInfo.
    """
    index_name = "model.safetensors.index.json"
    index = read_json(os.path.join(hf_dir, index_name), required=False)
    weight_map = None
    if index is not None:
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ConvertError(f"{index_name}: no weight_map")
        files = sorted(set(weight_map.values()))
    elif os.path.exists(os.path.join(hf_dir, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        files = sorted(f for f in os.listdir(hf_dir) if f.endswith(".safetensors"))
        if not files:
            raise ConvertError(f"{hf_dir}: no *.safetensors file")
    tensors = {}
    for file_name in files:
        path = os.path.join(hf_dir, file_name)
        if not os.path.isfile(path):
            raise ConvertError(f"{file_name}: listed in {index_name} but missing")
        for name, info in read_header(path)[0].items():
            if name in tensors:
                raise ConvertError(f"tensor '{name}' appears in both "
                                   f"{os.path.basename(tensors[name].path)} and {file_name}")
            tensors[name] = info
    for name, file_name in (weight_map or {}).items():
        if name not in tensors or os.path.basename(tensors[name].path) != file_name:
            raise ConvertError(f"{index_name}: tensor '{name}' is not in {file_name}")
    return tensors


def map_tensor(info):
    """Memory-map a F32/F16/BF16 tensor read-only, in its raw storage dtype."""
    return np.memmap(info.path, dtype=STORAGE[info.dtype], mode="r",
                     offset=info.offset, shape=info.shape)


def row_blocks(array, max_elements):
    """Yield consecutive slices of `array` along axis 0 of at most `max_elements` each."""
    if array.ndim < 2:
        yield array
        return
    row_size = math.prod(array.shape[1:]) or 1
    rows = max(1, max_elements // row_size)
    for start in range(0, array.shape[0], rows):
        yield array[start:start + rows]


def data_offsets(entries):
    """[begin, end) of each of the (name, dtype, shape) `entries` laid out back to back
    in the given order, relative to the data section: {name: (begin, end)}."""
    offsets, offset = {}, 0
    for name, dtype, shape in entries:
        nbytes = math.prod(shape) * ITEM_SIZES[dtype]
        offsets[name] = (offset, offset + nbytes)
        offset += nbytes
    return offsets


def encode_header(entries, metadata, alignment):
    """Build the 8-byte length prefix plus JSON header for `entries`.

    `entries` is a list of (name, dtype, shape) in file order; tensors are laid out
    back to back in that order (see data_offsets) and the header lists them in that
    order. The header is padded with spaces so that the data section starts at a
    multiple of `alignment` bytes. Returns (prefix_and_header, total_data_bytes).
    """
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    offsets = data_offsets(entries)
    for name, dtype, shape in entries:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": list(offsets[name])}
    body = compact_json(header).encode("utf-8")
    body += b" " * (-(8 + len(body)) % alignment)
    end = max((e for _, e in offsets.values()), default=0)
    return struct.pack("<Q", len(body)) + body, end
