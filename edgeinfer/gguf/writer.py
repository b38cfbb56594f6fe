"""A streaming GGUF (v3) writer (numpy only).

The layout is planned first (metadata, then every tensor's name, type and shape, which fix
all offsets), the header is written, and tensor data is then streamed one tensor at a time in
the planned order, so memory stays bounded by the largest tensor. The file is written to a
temporary sibling and renamed onto the target only when complete: an interrupted or failed
write never leaves a truncated output file.

    with GGUFWriter(path) as w:
        w.add_kv("general.architecture", "llama")
        w.add_tensor_info("token_embd.weight", (n_embd, n_vocab), GGMLType.Q8_0)
        w.write_header()
        w.write_tensor_data("token_embd.weight", data_bytes)
        # leaving the block without an exception finalizes (rename); with one, it discards
"""
from __future__ import annotations

import os
import struct
import tempfile
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import GGUFError
from .reader import DEFAULT_ALIGNMENT, GGUF_MAGIC
from .types import GGML_TYPES, GGUFValueType, ggml_type_name

__all__ = ["GGUFWriter", "tensor_nbytes"]

GGUF_VERSION = 3

_SCALAR_FMT = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.FLOAT64: "<d",
    GGUFValueType.BOOL: "<B",
}
_NP_DTYPE = {
    GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2", GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4",
    GGUFValueType.UINT64: "<u8", GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT32: "<f4", GGUFValueType.FLOAT64: "<f8",
    GGUFValueType.BOOL: "<u1",
}


def tensor_nbytes(shape: Sequence[int], type_id: int) -> int:
    """Bytes of a tensor of GGML shape `shape` (ne0 first) and type `type_id`."""
    info = GGML_TYPES.get(int(type_id))
    if info is None:
        raise GGUFError(f"cannot write tensors of GGML type {ggml_type_name(type_id)}")
    if not shape or shape[0] % info.block_size:
        raise GGUFError(f"row length {shape[0] if shape else 0} is not a multiple of the "
                        f"{info.name} block size {info.block_size}")
    n = 1
    for d in shape:
        n *= int(d)
    return n // info.block_size * info.type_size


def _infer_vtype(value: Any) -> GGUFValueType:
    if isinstance(value, bool):
        return GGUFValueType.BOOL
    if isinstance(value, (int, np.integer)):
        return GGUFValueType.UINT32 if 0 <= int(value) < 2**32 else GGUFValueType.INT64
    if isinstance(value, (float, np.floating)):
        return GGUFValueType.FLOAT32
    if isinstance(value, (str, bytes)):
        return GGUFValueType.STRING
    if isinstance(value, (list, tuple, np.ndarray)):
        return GGUFValueType.ARRAY
    raise GGUFError(f"cannot store a value of type {type(value).__name__} in GGUF metadata")


def _enc_str(s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


@dataclass
class _TensorPlan:
    name: str
    shape: tuple[int, ...]
    type: int
    nbytes: int
    offset: int = 0   # relative to the start of the data section


class GGUFWriter:
    """Writes one GGUF file atomically (temp file + rename). Use as a context manager, or
    call `finish()` / `abort()` yourself."""

    def __init__(self, path: str | os.PathLike, alignment: int = DEFAULT_ALIGNMENT):
        if alignment <= 0 or alignment % 8:
            raise GGUFError(f"alignment {alignment} must be a positive multiple of 8")
        self.path = os.fspath(path)
        self.alignment = alignment
        self._kv: list[tuple[str, bytes]] = []
        self._keys: set[str] = set()
        self._tensors: list[_TensorPlan] = []
        self._by_name: dict[str, _TensorPlan] = {}
        self._fh = None
        self._tmp: str | None = None
        self._next = 0            # index of the next tensor whose data is expected
        self._data_start = 0
        self._finished = False
        if alignment != DEFAULT_ALIGNMENT:
            self.add_kv("general.alignment", alignment, GGUFValueType.UINT32)

    # ------------------------------------------------------------------ metadata
    def add_kv(self, key: str, value: Any, vtype: GGUFValueType | None = None,
               item_type: GGUFValueType | None = None) -> None:
        """Adds one metadata pair. Types are inferred unless given: bool -> BOOL, int ->
        UINT32 (INT64 when out of range), float -> FLOAT32, str -> STRING, sequences ->
        ARRAY (items typed by `item_type` or inferred from the first item)."""
        if self._fh is not None:
            raise GGUFError("metadata must be added before the header is written")
        if key in self._keys:
            raise GGUFError(f"duplicate metadata key {key!r}")
        vtype = _infer_vtype(value) if vtype is None else GGUFValueType(vtype)
        out = bytearray(_enc_str(key))
        out += struct.pack("<I", int(vtype))
        if vtype == GGUFValueType.ARRAY:
            items = value
            if item_type is None:
                if isinstance(items, np.ndarray):
                    item_type = {np.dtype("float32"): GGUFValueType.FLOAT32,
                                 np.dtype("int32"): GGUFValueType.INT32,
                                 np.dtype("uint32"): GGUFValueType.UINT32,
                                 np.dtype("float64"): GGUFValueType.FLOAT64,
                                 np.dtype("int64"): GGUFValueType.INT64,
                                 np.dtype("uint8"): GGUFValueType.UINT8,
                                 np.dtype("int8"): GGUFValueType.INT8,
                                 np.dtype("bool"): GGUFValueType.BOOL}.get(items.dtype)
                    if item_type is None:
                        raise GGUFError(f"{key}: unsupported array dtype {items.dtype}")
                elif len(items) == 0:
                    item_type = GGUFValueType.UINT32
                else:
                    item_type = _infer_vtype(items[0])
            item_type = GGUFValueType(item_type)
            if item_type == GGUFValueType.ARRAY:
                raise GGUFError(f"{key}: nested arrays are not supported")
            out += struct.pack("<IQ", int(item_type), len(items))
            if item_type == GGUFValueType.STRING:
                for s in items:
                    out += _enc_str(s)
            else:
                arr = np.asarray(items, dtype=_NP_DTYPE[item_type])
                out += arr.tobytes()
        elif vtype == GGUFValueType.STRING:
            out += _enc_str(value)
        else:
            if vtype == GGUFValueType.BOOL:
                value = int(bool(value))
            try:
                out += struct.pack(_SCALAR_FMT[vtype], value)
            except struct.error as e:
                raise GGUFError(f"{key}: value {value!r} does not fit {vtype.name}") from e
        self._kv.append((key, bytes(out)))
        self._keys.add(key)

    # ------------------------------------------------------------------ tensors
    def add_tensor_info(self, name: str, shape: Sequence[int], type_id: int) -> int:
        """Plans one tensor (GGML shape: ne0, the row length, first). Returns its byte size."""
        if self._fh is not None:
            raise GGUFError("tensors must be planned before the header is written")
        if name in self._by_name:
            raise GGUFError(f"duplicate tensor name {name!r}")
        if len(name.encode("utf-8")) >= 64:
            raise GGUFError(f"tensor name {name!r} is longer than GGML's 63-byte limit")
        shape = tuple(int(d) for d in shape)
        if not 1 <= len(shape) <= 4 or any(d <= 0 for d in shape):
            raise GGUFError(f"tensor {name!r}: invalid shape {list(shape)}")
        nbytes = tensor_nbytes(shape, type_id)
        t = _TensorPlan(name, shape, int(type_id), nbytes)
        self._tensors.append(t)
        self._by_name[name] = t
        return nbytes

    @property
    def total_tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self._tensors)

    def _pad(self, n: int) -> int:
        return (-n) % self.alignment

    def write_header(self) -> None:
        """Opens the temporary file and writes header, metadata and tensor infos."""
        if self._fh is not None:
            raise GGUFError("header already written")
        off = 0
        for t in self._tensors:
            t.offset = off
            off += t.nbytes + self._pad(t.nbytes)
        head = bytearray(GGUF_MAGIC)
        head += struct.pack("<IQQ", GGUF_VERSION, len(self._tensors), len(self._kv))
        for _, enc in self._kv:
            head += enc
        for t in self._tensors:
            head += _enc_str(t.name)
            head += struct.pack("<I", len(t.shape))
            head += struct.pack(f"<{len(t.shape)}Q", *t.shape)
            head += struct.pack("<IQ", t.type, t.offset)
        head += b"\0" * self._pad(len(head))
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise GGUFError(f"output directory does not exist: {directory}")
        fd, self._tmp = tempfile.mkstemp(prefix="." + os.path.basename(self.path) + ".",
                                         suffix=".partial", dir=directory)
        self._fh = os.fdopen(fd, "wb")
        self._fh.write(head)
        self._data_start = len(head)

    def write_tensor_data(self, name: str, data) -> None:
        """Writes the next tensor's bytes (tensors must come in planned order)."""
        if self._fh is None:
            raise GGUFError("write_header() must come before tensor data")
        if self._next >= len(self._tensors):
            raise GGUFError(f"tensor {name!r} was not planned (all planned tensors written)")
        t = self._tensors[self._next]
        if t.name != name:
            raise GGUFError(f"tensor data out of order: expected {t.name!r}, got {name!r}")
        buf = memoryview(np.ascontiguousarray(data)).cast("B")
        if buf.nbytes != t.nbytes:
            raise GGUFError(f"tensor {name!r}: {buf.nbytes} bytes of data for a planned "
                            f"{ggml_type_name(t.type)} tensor of {t.nbytes} bytes")
        self._fh.write(buf)
        pad = self._pad(t.nbytes)
        if pad and self._next + 1 < len(self._tensors):
            self._fh.write(b"\0" * pad)
        self._next += 1

    # ------------------------------------------------------------------ finish
    def finish(self) -> None:
        """Checks every tensor was written, flushes, fsyncs and renames onto the target."""
        if self._finished:
            return
        if self._fh is None:
            self.write_header()
        if self._next != len(self._tensors):
            missing = self._tensors[self._next].name
            self.abort()
            raise GGUFError(f"GGUF write incomplete: tensor {missing!r} and "
                            f"{len(self._tensors) - self._next - 1} more were never written")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None
        os.replace(self._tmp, self.path)
        self._tmp = None
        self._finished = True

    def abort(self) -> None:
        """Discards the temporary file; the target path is left untouched."""
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError:
                pass
            self._fh = None
        if self._tmp is not None:
            try:
                os.unlink(self._tmp)
            except OSError:
                pass
            self._tmp = None

    def __enter__(self) -> "GGUFWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.abort()

    def __del__(self):  # never leave a stray temp file behind
        try:
            self.abort()
        except Exception:
            pass
