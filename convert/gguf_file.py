"""Reading the header of a GGUF file (llama.cpp's weight format, versions 2 and 3),
checked against the file before anything is allocated.

Layout (little-endian): magic "GGUF", u32 version, u64 tensor count, u64 key/value count,
the key/value pairs (a string key, a u32 value type, the value), one info per tensor (a
string name, u32 dimension count, u64 dimensions from the fastest-varying, u32 ggml type,
u64 offset), padding to `general.alignment` (default 32), then the tensor data, each
tensor at its offset from the start of the data. A string is a u64 length and its bytes;
an array a u32 item type, a u64 count and the items.

The header is read here, every count and length checked against the bytes that remain
and every tensor against the data section; the `gguf` package gives the tensor types
(their block sizes) and decodes the tensor data (gguf_in.py). Its own GGUFReader is not
used: it trusts the file (it loops over whatever count a header gives, reads past the end
as empty arrays, cuts short tensors that overrun the file), and it holds each array item
as a numpy array of its own (an array of 4 million items took it 441 s and 3 GB).
"""

import math
import os
import struct
from typing import NamedTuple

import numpy as np

from common import ConvertError

try:
    import gguf
except ImportError:
    gguf = None

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMENSIONS = 4  # ggml's GGML_MAX_DIMS
ALIGNMENT_KEY = "general.alignment"
# GGUFValueType -> struct format of a scalar of that type.
SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                  10: "<Q", 11: "<q", 12: "<d"}
STRING_TYPE, ARRAY_TYPE, UINT32_TYPE = 8, 9, 4
# GGUFValueType -> numpy dtype, to read a whole array of that type at once.
ARRAY_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
                10: "<u8", 11: "<i8", 12: "<f8"}
STRING_LENGTH_BYTES = 8
# Bounds on what the header may hold, far above real files (Llama 3: 128256 tokens,
# 280147 merges, 291 tensors), which keep the memory of its values to a few hundred MB.
MAX_ARRAY_ITEMS = 1 << 22  # over all arrays of the header
MAX_KEYS = 1 << 16
MAX_TENSORS = 1 << 16
# The fewest bytes a key/value pair and a tensor info can take, to bound their counts.
MIN_KEY_VALUE_BYTES = STRING_LENGTH_BYTES + 4 + 1
MIN_TENSOR_INFO_BYTES = STRING_LENGTH_BYTES + 4 + 8 + 4 + 8


class TensorLayout(NamedTuple):
    """Where one tensor's data lies in the file."""

    name: str
    dims: tuple  # ggml order: the row length first
    ggml_type: object  # gguf.GGMLQuantizationType
    start: int  # absolute file offset
    nbytes: int


class Contents(NamedTuple):
    """What read_header read: the keys and the tensors."""

    # key -> (types, value): types is [value type], or [ARRAY, item type] with a list
    keys: dict
    tensors: dict  # name -> TensorLayout


def require_package():
    """Refuse in one line when the gguf package is missing."""
    if gguf is None:
        raise ConvertError("reading GGUF files needs the gguf package: "
                           "python3 -m pip install -r convert/requirements.txt")


class _Cursor:
    """Bounds-checked little-endian reads from the start of an open file of `size` bytes;
    counts the array items read."""

    def __init__(self, file, size, name):
        self.file, self.size, self.name, self.pos = file, size, name, 0
        self.array_items = 0

    def remaining(self):
        return self.size - self.pos

    def _check(self, count, what):
        if count > self.remaining():
            raise ConvertError(f"{self.name}: truncated GGUF header ({what} needs {count} "
                               f"bytes at offset {self.pos}, {self.remaining()} remain)")

    def take(self, count, what):
        """The next `count` bytes."""
        self._check(count, what)
        self.pos += count
        return self.file.read(count)

    def scalar(self, fmt, what):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what):
        raw = self.take(self.scalar("<Q", what), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ConvertError(f"{self.name}: {what} is not UTF-8 text") from None


def _read_value(cursor, value_type, key):
    """Read one value of `value_type`, checking it fits; return (types, value)."""
    what = f"the value of '{key}'"
    if value_type in SCALAR_FORMATS:
        value = cursor.scalar(SCALAR_FORMATS[value_type], what)
        return [value_type], value
    if value_type == STRING_TYPE:
        return [value_type], cursor.string(what)
    if value_type != ARRAY_TYPE:
        raise ConvertError(f"{cursor.name}: '{key}' has unknown value type {value_type}")
    item_type = cursor.scalar("<I", what)
    count = cursor.scalar("<Q", what)
    if item_type in ARRAY_DTYPES or item_type == STRING_TYPE:
        dtype = np.dtype(ARRAY_DTYPES.get(item_type, "<u8"))  # a string's length at least
        if count * dtype.itemsize > cursor.remaining():
            raise ConvertError(f"{cursor.name}: '{key}' claims {count} items, more than "
                               "the file holds")
        cursor.array_items += count
        if cursor.array_items > MAX_ARRAY_ITEMS:
            raise ConvertError(f"{cursor.name}: the arrays of the header hold more than "
                               f"{MAX_ARRAY_ITEMS} items (at '{key}')")
    if item_type in ARRAY_DTYPES:
        items = np.frombuffer(cursor.take(count * dtype.itemsize, what), dtype=dtype)
        return [value_type, item_type], items.tolist()
    if item_type == STRING_TYPE:
        return [value_type, item_type], [cursor.string(what) for _ in range(count)]
    kind = "arrays of arrays" if item_type == ARRAY_TYPE else f"item type {item_type}"
    raise ConvertError(f"{cursor.name}: '{key}' is an array of {kind} (not supported)")


def _read_key_values(cursor, count):
    """Read the key/value pairs: {key: (types, value)}."""
    keys = {}
    for _ in range(count):
        key = cursor.string("a key")
        if key in keys:
            raise ConvertError(f"{cursor.name}: key '{key}' appears twice")
        value_type = cursor.scalar("<I", f"the type of '{key}'")
        keys[key] = _read_value(cursor, value_type, key)
    return keys


def _alignment(name, keys):
    """The alignment of the data section: general.alignment, else 32."""
    if ALIGNMENT_KEY not in keys:
        return DEFAULT_ALIGNMENT
    types, value = keys[ALIGNMENT_KEY]
    if types != [UINT32_TYPE] or value == 0 or value & (value - 1):
        raise ConvertError(f"{name}: {ALIGNMENT_KEY} must be a power of two stored as uint32")
    return value


def _read_tensor_infos(cursor, count):
    """Walk the tensor infos: [(name, dims, ggml type, offset)]."""
    infos, names = [], set()
    for _ in range(count):
        name = cursor.string("a tensor name")
        if name in names:
            raise ConvertError(f"{cursor.name}: tensor '{name}' appears twice")
        names.add(name)
        n_dims = cursor.scalar("<I", f"tensor '{name}'")
        if not 1 <= n_dims <= MAX_DIMENSIONS:
            raise ConvertError(f"{cursor.name}: tensor '{name}' has {n_dims} dimensions "
                               f"(1 to {MAX_DIMENSIONS})")
        dims = tuple(cursor.scalar("<Q", f"tensor '{name}'") for _ in range(n_dims))
        ggml_type = cursor.scalar("<I", f"tensor '{name}'")
        offset = cursor.scalar("<Q", f"tensor '{name}'")
        infos.append((name, dims, ggml_type, offset))
    return infos


def _tensor_layout(file_name, info, data_start, alignment, file_size):
    """Check one tensor info against the data section; return its TensorLayout."""
    name, dims, ggml_type, offset = info
    where = f"{file_name}: tensor '{name}'"
    try:
        qtype = gguf.GGMLQuantizationType(ggml_type)
        block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise ConvertError(f"{where} has unknown ggml type {ggml_type}") from None
    if 0 in dims:
        raise ConvertError(f"{where} has an empty dimension {list(dims)}")
    if dims[0] % block:
        raise ConvertError(f"{where}: rows of {dims[0]} are not whole {qtype.name} blocks "
                           f"of {block}")
    if offset % alignment:
        raise ConvertError(f"{where} starts at offset {offset}, not a multiple of the "
                           f"alignment {alignment}")
    nbytes = math.prod(dims) // block * block_bytes
    start = data_start + offset
    if start + nbytes > file_size:
        raise ConvertError(f"{where} ends at byte {start + nbytes} but the file has "
                           f"{file_size} bytes (truncated?)")
    return TensorLayout(name, dims, qtype, start, nbytes)


def _check_no_overlap(file_name, layouts):
    """No two tensors may share bytes."""
    ordered = sorted(layouts, key=lambda t: t.start)
    for before, after in zip(ordered, ordered[1:]):
        if after.start < before.start + before.nbytes:
            raise ConvertError(f"{file_name}: tensors '{before.name}' and '{after.name}' "
                               "overlap")


def read_header(path):
    """Read and check the whole header of the GGUF file at `path`, and where its tensors
    lie; return its Contents. Raises ConvertError naming the first problem."""
    require_package()
    name = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            cursor = _Cursor(f, size, name)
            magic = cursor.take(len(MAGIC), "the magic")
            if magic != MAGIC:
                raise ConvertError(f"{name}: not a GGUF file (starts with {magic!r})")
            version = cursor.scalar("<I", "the version")
            if version not in VERSIONS:
                if version & 0xFFFF == 0:
                    raise ConvertError(f"{name}: big-endian GGUF files are not supported")
                raise ConvertError(f"{name}: GGUF version {version} is not supported "
                                   "(2 or 3)")
            tensor_count = cursor.scalar("<Q", "the tensor count")
            kv_count = cursor.scalar("<Q", "the key/value count")
            needed = kv_count * MIN_KEY_VALUE_BYTES + tensor_count * MIN_TENSOR_INFO_BYTES
            if needed > cursor.remaining():
                raise ConvertError(f"{name}: {tensor_count} tensors and {kv_count} keys "
                                   f"cannot fit in {size} bytes")
            if tensor_count > MAX_TENSORS or kv_count > MAX_KEYS:
                raise ConvertError(f"{name}: {tensor_count} tensors and {kv_count} keys are "
                                   f"more than supported ({MAX_TENSORS} and {MAX_KEYS})")
            keys = _read_key_values(cursor, kv_count)
            infos = _read_tensor_infos(cursor, tensor_count)
    except OSError as e:
        raise ConvertError(f"{name}: cannot read ({e.strerror})") from None
    alignment = _alignment(name, keys)
    data_start = -(-cursor.pos // alignment) * alignment
    layouts = [_tensor_layout(name, info, data_start, alignment, size) for info in infos]
    _check_no_overlap(name, layouts)
    return Contents(keys, {layout.name: layout for layout in layouts})


def map_tensor(path, layout):
    """The bytes of one tensor, memory-mapped read-only: [rows, bytes per row], rows being
    every dimension after the first ([bytes] for a vector)."""
    qtype = layout.ggml_type
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    row_bytes = layout.dims[0] // block * block_bytes
    shape = (row_bytes,) if len(layout.dims) == 1 else (layout.nbytes // row_bytes, row_bytes)
    return np.memmap(path, dtype=np.uint8, mode="r", offset=layout.start, shape=shape)
