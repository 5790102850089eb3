"""Opening a GGUF file (llama.cpp's weight format, versions 2 and 3) safely.

Layout (little-endian): magic "GGUF", u32 version, u64 tensor count, u64 key/value count,
the key/value pairs (a string key, a u32 value type, the value), one info per tensor (a
string name, u32 dimension count, u64 dimensions from the fastest-varying, u32 ggml type,
u64 offset), padding to `general.alignment` (default 32), then the tensor data, each
tensor at its offset from the start of the data. A string is a u64 length and its bytes;
an array a u32 item type, a u64 count and the items.

The `gguf` package's GGUFReader reads the values and maps the tensors, but it trusts the
file: it loops over whatever count a header gives, reads past the end as empty arrays
and cuts short tensors that overrun the file. So the whole header is walked here first,
every count and length checked against the bytes that remain, every tensor against the
data section, before GGUFReader sees the file.
"""

import math
import os
import struct
from typing import NamedTuple

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
STRING_LENGTH_BYTES = 8
# The fewest bytes a key/value pair and a tensor info can take, to bound their counts.
MIN_KEY_VALUE_BYTES = STRING_LENGTH_BYTES + 4 + 1
MIN_TENSOR_INFO_BYTES = STRING_LENGTH_BYTES + 4 + 8 + 4 + 8


class TensorLayout(NamedTuple):
    """Where one tensor's data lies in the file."""

    name: str
    dims: tuple  # ggml order: the row length first
    ggml_type: int
    start: int  # absolute file offset
    nbytes: int


def require_package():
    """Refuse in one line when the gguf package is missing."""
    if gguf is None:
        raise ConvertError("reading GGUF files needs the gguf package: "
                           "python3 -m pip install -r convert/requirements.txt")


class _Cursor:
    """Bounds-checked little-endian reads from the start of an open file of `size` bytes."""

    def __init__(self, file, size, name):
        self.file, self.size, self.name, self.pos = file, size, name, 0

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

    def skip(self, count, what):
        """Step over the next `count` bytes without reading them."""
        self._check(count, what)
        self.pos += count
        self.file.seek(self.pos)

    def scalar(self, fmt, what):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what):
        raw = self.take(self.scalar("<Q", what), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ConvertError(f"{self.name}: {what} is not UTF-8 text") from None


def _skip_value(cursor, value_type, key):
    """Step over one value of `value_type`, checking it fits; return the scalar read when
    it is one (the alignment is needed), else None."""
    what = f"the value of '{key}'"
    if value_type in SCALAR_FORMATS:
        return cursor.scalar(SCALAR_FORMATS[value_type], what)
    if value_type == STRING_TYPE:
        cursor.skip(cursor.scalar("<Q", what), what)
        return None
    if value_type != ARRAY_TYPE:
        raise ConvertError(f"{cursor.name}: '{key}' has unknown value type {value_type}")
    item_type = cursor.scalar("<I", what)
    count = cursor.scalar("<Q", what)
    if item_type in SCALAR_FORMATS:
        cursor.skip(count * struct.calcsize(SCALAR_FORMATS[item_type]), what)
    elif item_type == STRING_TYPE:
        if count * STRING_LENGTH_BYTES > cursor.remaining():
            raise ConvertError(f"{cursor.name}: '{key}' claims {count} strings, more than "
                               "the file holds")
        for _ in range(count):
            cursor.skip(cursor.scalar("<Q", what), what)
    else:
        kind = "arrays of arrays" if item_type == ARRAY_TYPE else f"item type {item_type}"
        raise ConvertError(f"{cursor.name}: '{key}' is an array of {kind} (not supported)")
    return None


def _read_key_values(cursor, count):
    """Walk the key/value pairs; return the alignment of the data section."""
    keys, alignment = set(), DEFAULT_ALIGNMENT
    for _ in range(count):
        key = cursor.string("a key")
        if key in keys:
            raise ConvertError(f"{cursor.name}: key '{key}' appears twice")
        keys.add(key)
        value_type = cursor.scalar("<I", f"the type of '{key}'")
        value = _skip_value(cursor, value_type, key)
        if key == ALIGNMENT_KEY:
            if value_type != UINT32_TYPE or value == 0 or value & (value - 1):
                raise ConvertError(f"{cursor.name}: {ALIGNMENT_KEY} must be a power of two "
                                   "stored as uint32")
            alignment = value
    return alignment


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
    return TensorLayout(name, dims, ggml_type, start, nbytes)


def _check_no_overlap(file_name, layouts):
    """No two tensors may share bytes."""
    ordered = sorted(layouts, key=lambda t: t.start)
    for before, after in zip(ordered, ordered[1:]):
        if after.start < before.start + before.nbytes:
            raise ConvertError(f"{file_name}: tensors '{before.name}' and '{after.name}' "
                               "overlap")


def check_layout(path):
    """Walk and check the whole header of the GGUF file at `path`; return its tensors as
    {name: TensorLayout}. Raises ConvertError naming the first problem."""
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
            alignment = _read_key_values(cursor, kv_count)
            infos = _read_tensor_infos(cursor, tensor_count)
    except OSError as e:
        raise ConvertError(f"{name}: cannot read ({e.strerror})") from None
    data_start = -(-cursor.pos // alignment) * alignment
    layouts = [_tensor_layout(name, info, data_start, alignment, size) for info in infos]
    _check_no_overlap(name, layouts)
    return {layout.name: layout for layout in layouts}


def open_reader(path):
    """A GGUFReader over `path`, once check_layout has passed it."""
    try:
        return gguf.GGUFReader(path)
    except (ValueError, KeyError, IndexError, UnicodeDecodeError) as e:
        raise ConvertError(f"{os.path.basename(path)}: not a valid GGUF file ({e})") from None
