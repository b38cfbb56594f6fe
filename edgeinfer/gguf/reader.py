"""A validated, memory-mapped, zero-copy GGUF reader (numpy only).

Every count, length, offset, dimension, type and alignment is checked against the file before
it is used, so a malformed, truncated or hostile file ends in `GGUFError` (with the byte
offset, key or tensor name at fault) in time and memory bounded by the file's size and the
limits below; never a crash, hang, MemoryError, RecursionError or OverflowError.
"""
from __future__ import annotations

import mmap
import os
import re
import struct
from typing import Any, Iterator

import numpy as np

from ..errors import GGUFError, ModelNotFoundError
from .types import (
    FLOAT_VALUE_TYPES,
    GGML_TYPES,
    INT_VALUE_TYPES,
    VALUE_TYPE_DTYPES,
    VALUE_TYPE_SIZES,
    GGMLType,
    GGUFValueType,
    ggml_type_name,
)

__all__ = ["GGUFFile", "TensorInfo", "GGUF_MAGIC", "DEFAULT_ALIGNMENT", "SUPPORTED_VERSIONS"]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
INT64_MAX = 2**63 - 1

# Limits that bound memory for any input (far above what real models use).
MAX_KV_COUNT = 1 << 16            # real files: ~20..100 keys
MAX_TENSOR_COUNT = 1 << 18        # real files: up to a few thousand tensors
MAX_STRING_COUNT = 1 << 22        # strings decoded in all arrays together (vocab + merges)
MAX_STRING_BYTES = 1 << 28        # bytes decoded into Python strings, all strings together

_HEADER_SIZE = 4 + 4 + 8 + 8      # magic, version, tensor_count, kv_count
_MIN_KV_SIZE = 8 + 4 + 1          # empty key, value type, 1-byte value
_MIN_TENSOR_INFO_SIZE = 8 + 4 + 8 + 4 + 8   # empty name, n_dims, one dim, type, offset
_MIN_ARRAY_ITEM_SIZE = {GGUFValueType.STRING: 8, **VALUE_TYPE_SIZES}

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_SCALAR_STRUCTS = {
    GGUFValueType.UINT8: struct.Struct("<B"), GGUFValueType.INT8: struct.Struct("<b"),
    GGUFValueType.UINT16: struct.Struct("<H"), GGUFValueType.INT16: struct.Struct("<h"),
    GGUFValueType.UINT32: struct.Struct("<I"), GGUFValueType.INT32: struct.Struct("<i"),
    GGUFValueType.UINT64: struct.Struct("<Q"), GGUFValueType.INT64: struct.Struct("<q"),
    GGUFValueType.FLOAT32: struct.Struct("<f"), GGUFValueType.FLOAT64: struct.Struct("<d"),
    GGUFValueType.BOOL: struct.Struct("<B"),
}

_MISSING = object()


def _vt_name(vtype: int, etype: int | None = None) -> str:
    try:
        name = GGUFValueType(vtype).name
    except ValueError:
        name = f"type {vtype}"
    if etype is not None:
        name += f"[{GGUFValueType(etype).name}]"
    return name


class TensorInfo:
    """One tensor of a GGUF file: name, GGML type, shape (GGML order: ne0, the row length,
    first), size, absolute file offset, and `data`, a zero-copy uint8 view of its bytes."""

    __slots__ = ("name", "type", "shape", "n_elements", "nbytes", "offset", "_file")

    def __init__(self, name: str, type_id: int, shape: tuple[int, ...], n_elements: int,
                 nbytes: int, offset: int, file: "GGUFFile"):
        self.name = name
        self.type = type_id
        self.shape = shape
        self.n_elements = n_elements
        self.nbytes = nbytes
        self.offset = offset
        self._file = file

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.type].name

    @property
    def ggml_type(self) -> GGMLType:
        return GGMLType(self.type)

    @property
    def block_size(self) -> int:
        return GGML_TYPES[self.type].block_size

    @property
    def type_size(self) -> int:
        return GGML_TYPES[self.type].type_size

    @property
    def n_dims(self) -> int:
        return len(self.shape)

    @property
    def row_nbytes(self) -> int:
        """Bytes of one row (ne0 elements)."""
        info = GGML_TYPES[self.type]
        return self.shape[0] // info.block_size * info.type_size

    @property
    def n_rows(self) -> int:
        return self.n_elements // self.shape[0]

    @property
    def data(self) -> np.ndarray:
        """The tensor's bytes: a read-only uint8 view into the memory map (no copy)."""
        buf = self._file._buf
        if buf is None:
            raise GGUFError(f"tensor {self.name!r}: the GGUF file {self._file.path} is closed")
        return buf[self.offset:self.offset + self.nbytes]

    def __repr__(self) -> str:
        return (f"TensorInfo({self.name!r}, {self.type_name}, shape={self.shape}, "
                f"offset={self.offset}, nbytes={self.nbytes})")


_NOT_A_MODEL = {"adapter": ": a LoRA adapter goes with its base model (--lora NAME=FILE)",
                "imatrix": ": an importance matrix goes to `edgeinfer convert --imatrix` or "
                           "`edgeinfer quantize --imatrix`"}


class GGUFFile:
    """A GGUF file, memory-mapped read-only and validated on open.

    Attributes: `path`, `size`, `version`, `alignment`, `data_offset` (absolute start of the
    tensor data section), `metadata` (key -> int | float | bool | str | list[str] |
    np.ndarray), `tensors` (name -> TensorInfo, in file order).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._mm: mmap.mmap | None = None
        self._buf: np.ndarray | None = None
        self.metadata: dict[str, Any] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._types: dict[str, tuple[GGUFValueType, GGUFValueType | None]] = {}
        self._key_offsets: dict[str, int] = {}
        self.version = 0
        self.alignment = DEFAULT_ALIGNMENT
        self.data_offset = 0
        self._pos = 0
        self._n_strings = 0
        self._n_string_bytes = 0
        self._open()
        try:
            self._parse()
            self._validate_known_keys()
        except GGUFError:
            self.close()
            raise
        except (struct.error, ValueError, OverflowError, IndexError, TypeError, KeyError) as e:
            # Safety net: every check above is explicit; this only turns a missed one into
            # the documented error type.
            self.close()
            raise GGUFError(f"{self.path}: malformed GGUF near byte offset {self._pos}: "
                            f"{type(e).__name__}: {e}") from e

    # ---------------------------------------------------------------- open / close
    def _open(self) -> None:
        try:
            fh = open(self.path, "rb")
        except FileNotFoundError as e:
            raise ModelNotFoundError(f"GGUF file not found: {self.path}") from e
        except OSError as e:
            raise GGUFError(f"{self.path}: cannot open: {e}") from e
        with fh:
            try:
                size = os.fstat(fh.fileno()).st_size
            except OSError as e:
                raise GGUFError(f"{self.path}: cannot stat: {e}") from e
            self.size = size
            if size < len(GGUF_MAGIC):
                raise GGUFError(f"{self.path}: file is {size} bytes, too short to be GGUF "
                                f"(needs at least the {_HEADER_SIZE}-byte header)")
            try:
                self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as e:
                raise GGUFError(f"{self.path}: cannot memory-map: {e}") from e
        self._buf = np.frombuffer(self._mm, dtype=np.uint8)

    def close(self) -> None:
        """Releases the map. Views still held elsewhere (tensor data, metadata arrays) keep
        the mapping alive until they are gone; `TensorInfo.data` fails after close."""
        self._buf = None
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # arrays still export the buffer; the map goes when they do

    def release(self, tensor: "TensorInfo") -> None:
        """Drops the pages of `tensor`'s data from this process's memory once read (they stay in
        the page cache; reading them again maps them again), so that streaming through a
        file several times the size of memory keeps the process small."""
        if self._mm is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        start = tensor.offset - tensor.offset % mmap.PAGESIZE
        end = min(self.size, tensor.offset + tensor.nbytes)
        if end > start:
            self._mm.madvise(mmap.MADV_DONTNEED, start, end - start)

    @property
    def closed(self) -> bool:
        return self._buf is None

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GGUFFile({self.path!r}, version={self.version}, {len(self.metadata)} keys, "
                f"{len(self.tensors)} tensors)")

    # ---------------------------------------------------------------- public getters
    def __contains__(self, key: str) -> bool:
        return key in self.metadata

    def keys(self) -> Iterator[str]:
        return iter(self.metadata)

    def require_model(self) -> None:
        """GGUFError unless the file holds a model (general.type "model", or no such key): an
        adapter or an importance matrix given where a model goes."""
        kind = self.get("general.type", "model")
        if kind != "model":
            raise GGUFError(f"{self.path} is not a model: its general.type is {kind!r}"
                            f"{_NOT_A_MODEL.get(kind, '')}")

    def field_type(self, key: str) -> tuple[GGUFValueType, GGUFValueType | None]:
        """(value type, array element type or None) of a metadata key."""
        if key not in self._types:
            raise GGUFError(f"{self.path}: metadata key {key!r} is missing")
        return self._types[key]

    def get(self, key: str, default: Any = _MISSING, kind: type | None = None) -> Any:
        """A metadata value, checked against `kind`.

        kind: int (any GGUF integer type), float (FLOAT32/FLOAT64), bool, str, list (any array;
        numeric arrays converted to a list), np.ndarray (numeric arrays), or None (no check).
        A missing key returns `default`, or raises GGUFError when no default is given.
        """
        if key not in self.metadata:
            if default is _MISSING:
                raise GGUFError(f"{self.path}: required metadata key {key!r} is missing")
            return default
        value = self.metadata[key]
        if kind is None:
            return value
        vtype, etype = self._types[key]
        ok: bool
        if kind is bool:
            ok = vtype == GGUFValueType.BOOL
        elif kind is int:
            ok = vtype in INT_VALUE_TYPES
        elif kind is float:
            ok = vtype in FLOAT_VALUE_TYPES
        elif kind is str:
            ok = vtype == GGUFValueType.STRING
        elif kind is list:
            ok = vtype == GGUFValueType.ARRAY
            if ok and isinstance(value, np.ndarray):
                value = value.tolist()
        elif kind is np.ndarray:
            ok = vtype == GGUFValueType.ARRAY and etype != GGUFValueType.STRING
        else:
            raise TypeError(f"unsupported kind {kind!r}")
        if not ok:
            raise GGUFError(f"{self.path}: metadata key {key!r} has type {_vt_name(vtype, etype)}, "
                            f"expected {kind.__name__}")
        return value

    # ---------------------------------------------------------------- low-level reads
    def _fail(self, msg: str, offset: int | None = None) -> GGUFError:
        where = f" (byte offset {self._pos if offset is None else offset})"
        return GGUFError(f"{self.path}: {msg}{where}")

    def _need(self, n: int, what: str) -> None:
        left = self.size - self._pos
        if n > left:
            raise self._fail(f"truncated: {what} needs {n} bytes but only {left} remain "
                             f"in the {self.size}-byte file")

    def _u32(self, what: str) -> int:
        self._need(4, what)
        (v,) = _U32.unpack_from(self._mm, self._pos)
        self._pos += 4
        return v

    def _u64(self, what: str) -> int:
        self._need(8, what)
        (v,) = _U64.unpack_from(self._mm, self._pos)
        self._pos += 8
        return v

    def _charge_strings(self, count: int, nbytes: int, what: str) -> None:
        self._n_strings += count
        self._n_string_bytes += nbytes
        if self._n_strings > MAX_STRING_COUNT:
            raise self._fail(f"{what}: more than {MAX_STRING_COUNT} strings in the file's metadata")
        if self._n_string_bytes > MAX_STRING_BYTES:
            raise self._fail(f"{what}: more than {MAX_STRING_BYTES} bytes of strings "
                             f"in the file's metadata")

    def _str(self, what: str) -> str:
        start = self._pos
        n = self._u64(f"{what} length")
        if n > self.size - self._pos:
            raise self._fail(f"{what}: string length {n} exceeds the {self.size - self._pos} "
                             f"bytes left in the file", start)
        self._charge_strings(1, n, what)
        raw = self._mm[self._pos:self._pos + n]
        try:
            s = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self._fail(f"{what}: invalid UTF-8 ({e.reason})", self._pos + e.start) from None
        self._pos += n
        return s

    def _str_array(self, count: int, what: str) -> list[str]:
        """`count` strings in one pass (count already checked against the bytes left)."""
        self._charge_strings(count, 0, what)
        mm = self._mm
        size = self.size
        pos = self._pos
        unpack = _U64.unpack_from
        out: list[str] = [""] * count
        nbytes = 0
        for i in range(count):
            if size - pos < 8:
                self._pos = pos
                raise self._fail(f"truncated: {what} item {i} length needs 8 bytes")
            (n,) = unpack(mm, pos)
            pos += 8
            if n > size - pos:
                raise self._fail(f"{what} item {i}: string length {n} exceeds the "
                                 f"{size - pos} bytes left in the file", pos - 8)
            end = pos + n
            try:
                out[i] = mm[pos:end].decode("utf-8")
            except UnicodeDecodeError as e:
                raise self._fail(f"{what} item {i}: invalid UTF-8 ({e.reason})",
                                 pos + e.start) from None
            nbytes += n
            pos = end
        self._pos = pos
        self._charge_strings(0, nbytes, what)
        return out

    def _value(self, vtype: int, key: str) -> tuple[Any, GGUFValueType | None]:
        """Reads one value of type `vtype`; returns (value, array element type or None)."""
        what = f"metadata key {key!r}"
        if vtype == GGUFValueType.STRING:
            return self._str(f"{what} value"), None
        st = _SCALAR_STRUCTS.get(vtype)
        if st is not None:
            self._need(st.size, f"{what} value")
            (v,) = st.unpack_from(self._mm, self._pos)
            self._pos += st.size
            if vtype == GGUFValueType.BOOL:
                v = v != 0
            return v, None
        if vtype != GGUFValueType.ARRAY:
            raise self._fail(f"{what}: unknown value type {vtype}", self._pos - 4)
        etype_at = self._pos
        etype = self._u32(f"{what} array element type")
        if etype == GGUFValueType.ARRAY:
            raise self._fail(f"{what}: nested arrays are not supported", etype_at)
        if etype not in _MIN_ARRAY_ITEM_SIZE:
            raise self._fail(f"{what}: unknown array element type {etype}", etype_at)
        etype = GGUFValueType(etype)
        count_at = self._pos
        count = self._u64(f"{what} array length")
        item = _MIN_ARRAY_ITEM_SIZE[etype]
        left = self.size - self._pos
        if count > left // item:
            raise self._fail(f"{what}: array of {count} {etype.name} items cannot fit in the "
                             f"{left} bytes left in the file", count_at)
        if etype == GGUFValueType.STRING:
            return self._str_array(count, f"{what} array"), etype
        nbytes = count * item
        arr = self._buf[self._pos:self._pos + nbytes].view(VALUE_TYPE_DTYPES[etype])
        if etype == GGUFValueType.BOOL:
            arr = arr != 0
        self._pos += nbytes
        return arr, etype

    # ---------------------------------------------------------------- parsing
    def _parse(self) -> None:
        mm = self._mm
        magic = bytes(mm[0:4])
        if magic != GGUF_MAGIC:
            hint = ""
            if magic in (b"lmgg", b"fmgg", b"tjgg", b"ggml", b"ggmf", b"ggjt"):
                hint = " (a legacy GGML/GGMF/GGJT file; convert it to GGUF)"
            raise self._fail(f"bad magic {magic!r}, expected {GGUF_MAGIC!r}{hint}", 0)
        self._pos = 4
        version = self._u32("version")
        if version not in SUPPORTED_VERSIONS:
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            if swapped in SUPPORTED_VERSIONS:
                raise self._fail(f"big-endian GGUF (version {swapped}) is not supported", 4)
            raise self._fail(f"unsupported GGUF version {version} (supported: 2 and 3)", 4)
        self.version = version
        tensor_count = self._u64("tensor count")
        kv_count = self._u64("metadata key/value count")
        left = self.size - self._pos
        if kv_count > MAX_KV_COUNT:
            raise self._fail(f"metadata key/value count {kv_count} exceeds the limit "
                             f"{MAX_KV_COUNT}", 16)
        if tensor_count > MAX_TENSOR_COUNT:
            raise self._fail(f"tensor count {tensor_count} exceeds the limit "
                             f"{MAX_TENSOR_COUNT}", 8)
        if kv_count * _MIN_KV_SIZE + tensor_count * _MIN_TENSOR_INFO_SIZE > left:
            raise self._fail(f"{kv_count} key/value pairs and {tensor_count} tensor infos "
                             f"cannot fit in the {left} bytes after the header", 8)

        # --- metadata
        for i in range(kv_count):
            key_at = self._pos
            key = self._str(f"metadata key #{i}")
            if key in self.metadata:
                raise self._fail(f"duplicate metadata key {key!r}", key_at)
            vtype_at = self._pos
            vtype = self._u32(f"metadata key {key!r} value type")
            if vtype not in GGUFValueType._value2member_map_:
                raise self._fail(f"metadata key {key!r}: unknown value type {vtype}", vtype_at)
            vtype = GGUFValueType(vtype)
            value, etype = self._value(vtype, key)
            self.metadata[key] = value
            self._types[key] = (vtype, etype)
            self._key_offsets[key] = key_at

        # --- alignment
        if "general.alignment" in self.metadata:
            vtype, etype = self._types["general.alignment"]
            at = self._key_offsets["general.alignment"]
            if vtype != GGUFValueType.UINT32:
                raise self._fail(f"metadata key 'general.alignment' has type "
                                 f"{_vt_name(vtype, etype)}, expected UINT32", at)
            a = self.metadata["general.alignment"]
            if a == 0 or a & (a - 1):
                raise self._fail(f"metadata key 'general.alignment' is {a}, "
                                 f"not a non-zero power of two", at)
            self.alignment = a

        # --- tensor infos
        raw: list[tuple[str, int, tuple[int, ...], int, int, int, int]] = []
        names: set[str] = set()
        for i in range(tensor_count):
            info_at = self._pos
            name = self._str(f"tensor #{i} name")
            if name in names:
                raise self._fail(f"duplicate tensor name {name!r}", info_at)
            names.add(name)
            tw = f"tensor {name!r}"
            n_dims = self._u32(f"{tw} n_dims")
            if not 1 <= n_dims <= MAX_DIMS:
                raise self._fail(f"{tw}: n_dims {n_dims} not in 1..{MAX_DIMS}", self._pos - 4)
            self._need(8 * n_dims, f"{tw} dimensions")
            shape = struct.unpack_from(f"<{n_dims}Q", mm, self._pos)
            dims_at = self._pos
            self._pos += 8 * n_dims
            n_elements = 1
            for d, ne in enumerate(shape):
                if ne < 1:
                    raise self._fail(f"{tw}: dimension {d} is {ne} (must be >= 1)", dims_at + 8 * d)
                n_elements *= ne
                if n_elements > INT64_MAX:
                    raise self._fail(f"{tw}: shape {list(shape)} overflows int64 "
                                     f"element count", dims_at)
            type_at = self._pos
            type_id = self._u32(f"{tw} type")
            tinfo = GGML_TYPES.get(type_id)
            if tinfo is None:
                raise self._fail(f"{tw}: GGML type {ggml_type_name(type_id)} is not a known "
                                 f"tensor type", type_at)
            if shape[0] % tinfo.block_size:
                raise self._fail(f"{tw}: row length ne0={shape[0]} is not a multiple of "
                                 f"{tinfo.name}'s block size {tinfo.block_size}", dims_at)
            nbytes = n_elements // tinfo.block_size * tinfo.type_size
            if nbytes > INT64_MAX:
                raise self._fail(f"{tw}: {nbytes} bytes of {tinfo.name} data overflows int64",
                                 dims_at)
            off_at = self._pos
            rel = self._u64(f"{tw} data offset")
            if rel % self.alignment:
                raise self._fail(f"{tw}: data offset {rel} is not a multiple of the "
                                 f"alignment {self.alignment}", off_at)
            raw.append((name, type_id, tuple(shape), n_elements, nbytes, rel, off_at))

        # --- data section
        pad = (-self._pos) % self.alignment
        self.data_offset = self._pos + pad
        for name, type_id, shape, n_elements, nbytes, rel, off_at in raw:
            start = self.data_offset + rel
            if start + nbytes > self.size:
                raise self._fail(f"tensor {name!r}: data [{start}, {start + nbytes}) lies "
                                 f"outside the {self.size}-byte file (data section starts at "
                                 f"{self.data_offset}, tensor offset {rel})", off_at)
        by_start = sorted(raw, key=lambda r: r[5])
        for a, b in zip(by_start, by_start[1:]):
            if a[5] + a[4] > b[5]:
                raise self._fail(f"tensors {a[0]!r} (data offset {a[5]}, {a[4]} bytes) and "
                                 f"{b[0]!r} (data offset {b[5]}) overlap", b[6])
        for name, type_id, shape, n_elements, nbytes, rel, _ in raw:
            self.tensors[name] = TensorInfo(name, type_id, shape, n_elements, nbytes,
                                            self.data_offset + rel, self)

    # ---------------------------------------------------------------- known keys
    def _expect(self, key: str, kinds: tuple[str, ...]) -> None:
        """Checks the stored type of a present key against kinds ('int', 'float', 'bool', 'str',
        'str[]', 'int[]', 'float[]')."""
        vtype, etype = self._types[key]
        for k in kinds:
            if k == "int" and vtype in INT_VALUE_TYPES:
                return
            if k == "float" and vtype in FLOAT_VALUE_TYPES:
                return
            if k == "bool" and vtype == GGUFValueType.BOOL:
                return
            if k == "str" and vtype == GGUFValueType.STRING:
                return
            if vtype == GGUFValueType.ARRAY:
                if k == "str[]" and etype == GGUFValueType.STRING:
                    return
                if k == "int[]" and etype in INT_VALUE_TYPES:
                    return
                if k == "float[]" and etype in FLOAT_VALUE_TYPES:
                    return
        raise self._fail(f"metadata key {key!r} has type {_vt_name(vtype, etype)}, "
                         f"expected {' or '.join(kinds)}", self._key_offsets[key])

    def _validate_known_keys(self) -> None:
        md = self.metadata
        for key in md:
            kinds = _KNOWN_KEYS.get(key)
            if kinds is None:
                if key.startswith("tokenizer.chat_template."):
                    kinds = ("str",)
                elif _TOKEN_ID_KEY.match(key):
                    kinds = ("int",)
            if kinds is not None:
                self._expect(key, kinds)
        arch = md.get("general.architecture")
        if isinstance(arch, str):
            prefix = arch + "."
            for key in md:
                if key.startswith(prefix):
                    kinds = _ARCH_KEYS.get(key[len(prefix):])
                    if kinds is not None:
                        self._expect(key, kinds)

        tokens = md.get("tokenizer.ggml.tokens")
        if tokens is not None:
            n = len(tokens)
            for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
                if key in md and len(md[key]) != n:
                    raise self._fail(f"metadata key {key!r} has {len(md[key])} entries but "
                                     f"tokenizer.ggml.tokens has {n}", self._key_offsets[key])
            for key, value in md.items():
                if _TOKEN_ID_KEY.match(key) and not 0 <= value < n:
                    raise self._fail(f"special token id {key!r} = {value} is out of range "
                                     f"[0, {n}) of tokenizer.ggml.tokens", self._key_offsets[key])


_TOKEN_ID_KEY = re.compile(r"^tokenizer\.ggml\.[A-Za-z0-9_]+_token_id$")

_KNOWN_KEYS: dict[str, tuple[str, ...]] = {
    "general.architecture": ("str",),
    "general.alignment": ("int",),
    "general.name": ("str",),
    "general.type": ("str",),
    "general.basename": ("str",),
    "general.finetune": ("str",),
    "general.size_label": ("str",),
    "general.license": ("str",),
    "general.organization": ("str",),
    "general.description": ("str",),
    "general.author": ("str",),
    "general.url": ("str",),
    "general.quantized_by": ("str",),
    "general.file_type": ("int",),
    "general.quantization_version": ("int",),
    "tokenizer.ggml.model": ("str",),
    "tokenizer.ggml.pre": ("str",),
    "tokenizer.ggml.tokens": ("str[]",),
    "tokenizer.ggml.merges": ("str[]",),
    "tokenizer.ggml.scores": ("float[]",),
    "tokenizer.ggml.token_type": ("int[]",),
    "tokenizer.ggml.add_bos_token": ("bool",),
    "tokenizer.ggml.add_eos_token": ("bool",),
    "tokenizer.ggml.add_sep_token": ("bool",),
    "tokenizer.ggml.add_space_prefix": ("bool",),
    "tokenizer.ggml.remove_extra_whitespaces": ("bool",),
    "tokenizer.chat_template": ("str",),
}

# Keys under `{general.architecture}.`; some models give per-layer arrays for head counts
# and FFN length, so those accept int arrays here (the model config decides what it runs).
_ARCH_KEYS: dict[str, tuple[str, ...]] = {
    "context_length": ("int",),
    "embedding_length": ("int",),
    "block_count": ("int",),
    "vocab_size": ("int",),
    "feed_forward_length": ("int", "int[]"),
    "attention.head_count": ("int", "int[]"),
    "attention.head_count_kv": ("int", "int[]"),
    "attention.key_length": ("int",),
    "attention.value_length": ("int",),
    "attention.layer_norm_rms_epsilon": ("float",),
    "attention.layer_norm_epsilon": ("float",),
    "rope.dimension_count": ("int",),
    "rope.freq_base": ("float",),
    "rope.scaling.type": ("str",),
    "rope.scaling.factor": ("float",),
    "rope.scale_linear": ("float",),
    "expert_count": ("int",),
    "expert_used_count": ("int",),
}
