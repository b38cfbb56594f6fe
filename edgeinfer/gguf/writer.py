"""Streaming, atomic GGUF (v3) writing over the gguf package's `GGUFWriter`.

The gguf package (llama.cpp's own) lays out and encodes the file. This layer adds what a
converter of untrusted checkpoints needs: typed errors at the call that is wrong (duplicate
keys, values that do not fit their type, tensors out of planned order or of the wrong size),
our metadata type inference (ints are UINT32 as llama.cpp expects), and atomicity: the file
is written to a temporary sibling and renamed onto the target only when complete, so an
interrupted or failed write never leaves a truncated output file. Tensor data is streamed one
tensor at a time in the planned order, so memory stays bounded by the largest tensor.

    with GGUFWriter(path) as w:
        w.add_kv("general.architecture", "llama")
        w.add_tensor_info("token_embd.weight", (n_embd, n_vocab), GGMLType.Q8_0)
        w.write_header()
        w.write_tensor_data("token_embd.weight", data_bytes)
        # leaving the block without an exception finalizes (rename); with one, it discards
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Sequence

import gguf
import numpy as np

from ..errors import GGUFError
from .reader import DEFAULT_ALIGNMENT
from .types import GGML_TYPES, VALUE_TYPE_DTYPES, GGUFValueType, ggml_type_name

__all__ = ["GGUFWriter", "tensor_nbytes"]

_ARRAY_ITEM_TYPES = {np.dtype(d): t for t, d in VALUE_TYPE_DTYPES.items() if t != GGUFValueType.BOOL}
_ARRAY_ITEM_TYPES[np.dtype(bool)] = GGUFValueType.BOOL


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


def _scalar(key: str, value: Any, vtype: GGUFValueType) -> Any:
    """`value` as the Python value the package packs as `vtype`; GGUFError when it does not fit."""
    if vtype == GGUFValueType.STRING:
        if not isinstance(value, (str, bytes)):
            raise GGUFError(f"{key}: {value!r} is not a string")
        return value
    if vtype == GGUFValueType.BOOL:
        return bool(value)
    if vtype in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise GGUFError(f"{key}: {value!r} is not a number")
        return float(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise GGUFError(f"{key}: {value!r} is not an integer ({vtype.name})")
    lim = np.iinfo(VALUE_TYPE_DTYPES[vtype])
    if not lim.min <= int(value) <= lim.max:
        raise GGUFError(f"{key}: value {value!r} does not fit {vtype.name}")
    return int(value)


def _array(key: str, items: Any, item_type: GGUFValueType | None) -> tuple[list, GGUFValueType]:
    """(items as a list the package packs, their type)."""
    if item_type is None:
        if isinstance(items, np.ndarray):
            item_type = _ARRAY_ITEM_TYPES.get(items.dtype)
            if item_type is None:
                raise GGUFError(f"{key}: unsupported array dtype {items.dtype}")
        elif len(items):
            item_type = _infer_vtype(items[0])
    if len(items) == 0:     # the package cannot write one (nor type it)
        raise GGUFError(f"{key}: empty arrays cannot be written")
    item_type = GGUFValueType(item_type)
    if item_type == GGUFValueType.ARRAY:
        raise GGUFError(f"{key}: nested arrays are not supported")
    if item_type in (GGUFValueType.STRING, GGUFValueType.BOOL):
        return [_scalar(key, v, item_type) for v in items], item_type
    try:
        return np.asarray(items, dtype=VALUE_TYPE_DTYPES[item_type]).tolist(), item_type
    except (OverflowError, ValueError, TypeError) as e:
        raise GGUFError(f"{key}: items do not fit {item_type.name}: {e}") from None


def _new_file_mode() -> int:
    """0666 less the process umask: the mode open() gives a new file."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


class GGUFWriter:
    """Writes one GGUF file atomically (temp file + rename). Use as a context manager, or
    call `finish()` / `abort()` yourself."""

    def __init__(self, path: str | os.PathLike, alignment: int = DEFAULT_ALIGNMENT):
        self.path = os.fspath(path)
        # arch "": general.architecture comes through add_kv, where the caller puts it
        self._w = gguf.GGUFWriter(None, arch="")
        self._keys: set[str] = set()
        self._tensors: list[tuple[str, int]] = []     # (name, bytes) in planned order
        self._next = 0            # index of the next tensor whose data is expected
        self._tmp: str | None = None
        self._finished = False
        if alignment != DEFAULT_ALIGNMENT:
            try:
                self._w.add_custom_alignment(alignment)
            except ValueError as e:
                raise GGUFError(f"alignment {alignment}: {e}") from None
            self._keys.add(gguf.Keys.General.ALIGNMENT)

    # ------------------------------------------------------------------ metadata
    def add_kv(self, key: str, value: Any, vtype: GGUFValueType | None = None,
               item_type: GGUFValueType | None = None) -> None:
        """Adds one metadata pair. Types are inferred unless given: bool -> BOOL, int ->
        UINT32 (INT64 when out of range), float -> FLOAT32, str -> STRING, sequences ->
        ARRAY (items typed by `item_type` or inferred from the first item)."""
        if self._tmp is not None:
            raise GGUFError("metadata must be added before the header is written")
        if key in self._keys:
            raise GGUFError(f"duplicate metadata key {key!r}")
        vtype = _infer_vtype(value) if vtype is None else GGUFValueType(vtype)
        if vtype == GGUFValueType.ARRAY:
            value, item_type = _array(key, value, item_type)
        else:
            value, item_type = _scalar(key, value, vtype), None
        self._w.add_key_value(key, value, vtype, sub_type=item_type)
        self._keys.add(key)

    # ------------------------------------------------------------------ tensors
    def add_tensor_info(self, name: str, shape: Sequence[int], type_id: int) -> int:
        """Plans one tensor (GGML shape: ne0, the row length, first). Returns its byte size."""
        if self._tmp is not None:
            raise GGUFError("tensors must be planned before the header is written")
        if any(name == n for n, _ in self._tensors):
            raise GGUFError(f"duplicate tensor name {name!r}")
        if len(name.encode("utf-8")) >= 64:
            raise GGUFError(f"tensor name {name!r} is longer than GGML's 63-byte limit")
        shape = tuple(int(d) for d in shape)
        if not 1 <= len(shape) <= 4 or any(d <= 0 for d in shape):
            raise GGUFError(f"tensor {name!r}: invalid shape {list(shape)}")
        nbytes = tensor_nbytes(shape, type_id)
        # the package takes numpy's order (outermost first) and no dtype: the shape is in elements
        self._w.add_tensor_info(name, shape[::-1], None, nbytes,
                                raw_dtype=gguf.GGMLQuantizationType(int(type_id)))
        self._tensors.append((name, nbytes))
        return nbytes

    @property
    def total_tensor_bytes(self) -> int:
        return sum(n for _, n in self._tensors)

    def write_header(self) -> None:
        """Opens the temporary file and writes header, metadata and tensor infos."""
        if self._tmp is not None:
            raise GGUFError("header already written")
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise GGUFError(f"output directory does not exist: {directory}")
        fd, self._tmp = tempfile.mkstemp(prefix="." + os.path.basename(self.path) + ".",
                                         suffix=".partial", dir=directory)
        os.close(fd)
        self._w.write_header_to_file(Path(self._tmp))
        self._w.write_kv_data_to_file()
        self._w.write_ti_data_to_file()

    def write_tensor_data(self, name: str, data) -> None:
        """Writes the next tensor's bytes (tensors must come in planned order)."""
        if self._tmp is None:
            raise GGUFError("write_header() must come before tensor data")
        if self._next >= len(self._tensors):
            raise GGUFError(f"tensor {name!r} was not planned (all planned tensors written)")
        want, nbytes = self._tensors[self._next]
        if want != name:
            raise GGUFError(f"tensor data out of order: expected {want!r}, got {name!r}")
        arr = np.ascontiguousarray(data)
        if arr.nbytes != nbytes:
            raise GGUFError(f"tensor {name!r}: {arr.nbytes} bytes of data for a planned tensor "
                            f"of {nbytes} bytes")
        self._w.write_tensor_data(arr)
        self._next += 1

    # ------------------------------------------------------------------ finish
    def finish(self) -> None:
        """Checks every tensor was written, flushes, fsyncs and renames onto the target."""
        if self._finished:
            return
        if self._tmp is None:
            self.write_header()
        if self._next != len(self._tensors):
            missing = self._tensors[self._next][0]
            self.abort()
            raise GGUFError(f"GGUF write incomplete: tensor {missing!r} and "
                            f"{len(self._tensors) - self._next - 1} more were never written")
        self._w.flush()
        os.fsync(self._w.fout[0].fileno())
        self._w.close()
        os.chmod(self._tmp, _new_file_mode())   # mkstemp made it 0600: unreadable by a service user
        os.replace(self._tmp, self.path)
        self._tmp = None
        self._finished = True

    def abort(self) -> None:
        """Discards the temporary file; the target path is left untouched."""
        try:
            self._w.close()
        except OSError:
            pass
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
