"""Hugging Face checkpoint directories: config.json plus one or many safetensors files,
read one tensor at a time (no torch, no safetensors package: the format is a length, a JSON
header and raw little-endian data, parsed and validated here).

Each `load(name)` reads exactly that tensor's bytes from disk and returns a float32 array, so
memory stays bounded by the largest tensor, whatever the size of the checkpoint.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from ..errors import ConversionError

__all__ = ["Checkpoint", "SafetensorsFile", "TensorEntry", "read_json"]

_DTYPES = {  # safetensors dtype -> (bytes per element, numpy dtype read from disk)
    "F32": (4, np.dtype("<f4")),
    "F16": (2, np.dtype("<f2")),
    "BF16": (2, np.dtype("<u2")),
    "F64": (8, np.dtype("<f8")),
}
MAX_HEADER_BYTES = 100 << 20


def read_json(path: str, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise ConversionError(f"{what} not found: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConversionError(f"{path}: cannot read {what}: {e}") from None


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]   # as stored (PyTorch order: rows first)
    path: str
    start: int               # absolute file offset
    nbytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class SafetensorsFile:
    """One .safetensors file: the header parsed and checked against the file size."""

    def __init__(self, path: str):
        self.path = path
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as fh:
                raw = fh.read(8)
                if len(raw) < 8:
                    raise ConversionError(f"{path}: not a safetensors file (too short)")
                (hlen,) = struct.unpack("<Q", raw)
                if hlen > MAX_HEADER_BYTES or 8 + hlen > size:
                    raise ConversionError(f"{path}: corrupt safetensors header (header length "
                                          f"{hlen} for a file of {size} bytes)")
                head = fh.read(hlen)
        except FileNotFoundError:
            raise ConversionError(f"safetensors file not found: {path}") from None
        except OSError as e:
            raise ConversionError(f"{path}: cannot read: {e}") from None
        try:
            meta = json.loads(head.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConversionError(f"{path}: corrupt safetensors header (not JSON: {e})") from None
        if not isinstance(meta, dict):
            raise ConversionError(f"{path}: corrupt safetensors header (not a JSON object)")
        data_start = 8 + hlen
        data_len = size - data_start
        self.tensors: dict[str, TensorEntry] = {}
        for name, info in meta.items():
            if name == "__metadata__":
                continue
            try:
                dtype = info["dtype"]
                shape = tuple(int(d) for d in info["shape"])
                b, e = (int(v) for v in info["data_offsets"])
            except (KeyError, TypeError, ValueError) as ex:
                raise ConversionError(f"{path}: corrupt safetensors header entry for {name!r}: "
                                      f"{ex!r}") from None
            if dtype not in _DTYPES:
                raise ConversionError(f"{path}: tensor {name!r} has dtype {dtype}; supported: "
                                      f"{', '.join(_DTYPES)}")
            if any(d < 0 for d in shape) or not 0 <= b <= e <= data_len:
                raise ConversionError(f"{path}: corrupt safetensors header: tensor {name!r} "
                                      f"offsets [{b}, {e}) outside the {data_len}-byte data area")
            n = 1
            for d in shape:
                n *= d
            if n * _DTYPES[dtype][0] != e - b:
                raise ConversionError(f"{path}: corrupt safetensors header: tensor {name!r} of "
                                      f"shape {list(shape)} {dtype} should be "
                                      f"{n * _DTYPES[dtype][0]} bytes, header says {e - b}")
            self.tensors[name] = TensorEntry(name, dtype, shape, path, data_start + b, e - b)


def load_entry(t: TensorEntry) -> np.ndarray:
    """Reads one tensor from disk as float32 (a fresh array in PyTorch shape order)."""
    size, dt = _DTYPES[t.dtype]
    try:
        with open(t.path, "rb") as fh:
            fh.seek(t.start)
            raw = fh.read(t.nbytes)
    except OSError as e:
        raise ConversionError(f"{t.path}: cannot read tensor {t.name!r}: {e}") from None
    if len(raw) != t.nbytes:
        raise ConversionError(f"{t.path}: truncated file: tensor {t.name!r} needs {t.nbytes} "
                              f"bytes, got {len(raw)}")
    a = np.frombuffer(raw, dtype=dt)
    if t.dtype == "BF16":
        a = (a.astype(np.uint32) << 16).view(np.float32)
    else:
        a = a.astype(np.float32)
    return a.reshape(t.shape)


class Checkpoint:
    """A Hugging Face model directory: `config` (config.json), the tensor index across all
    safetensors shards, and the tokenizer/generation files next to them."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = os.fspath(directory)
        if not os.path.isdir(self.dir):
            raise ConversionError(f"checkpoint directory not found: {self.dir}")
        self.config: dict = read_json(os.path.join(self.dir, "config.json"), "config.json")
        if not isinstance(self.config, dict):
            raise ConversionError(f"{self.dir}/config.json is not a JSON object")
        self.tensors: dict[str, TensorEntry] = {}
        for path in self._shard_paths():
            for name, t in SafetensorsFile(path).tensors.items():
                if name in self.tensors:
                    raise ConversionError(f"tensor {name!r} appears in two shards: "
                                          f"{self.tensors[name].path} and {path}")
                self.tensors[name] = t

    def _shard_paths(self) -> list[str]:
        index = os.path.join(self.dir, "model.safetensors.index.json")
        if os.path.exists(index):
            data = read_json(index, "model.safetensors.index.json")
            wm = data.get("weight_map") if isinstance(data, dict) else None
            if not isinstance(wm, dict) or not wm:
                raise ConversionError(f"{index}: no 'weight_map'")
            files = sorted(set(wm.values()))
            paths = [os.path.join(self.dir, f) for f in files]
            missing = [p for p in paths if not os.path.exists(p)]
            if missing:
                raise ConversionError(f"{index} lists shard(s) that are missing: "
                                      f"{', '.join(os.path.basename(p) for p in missing)}")
            return paths
        paths = sorted(os.path.join(self.dir, f) for f in os.listdir(self.dir)
                       if f.endswith(".safetensors"))
        if not paths:
            bins = [f for f in os.listdir(self.dir) if f.endswith((".bin", ".pt", ".pth"))]
            hint = (f" (found {', '.join(bins)}: PyTorch pickles are not read; re-save with "
                    f"save_pretrained(..., safe_serialization=True))") if bins else ""
            raise ConversionError(f"{self.dir}: no *.safetensors weights{hint}")
        return paths

    # ------------------------------------------------------------------ access
    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def names(self) -> Iterator[str]:
        return iter(self.tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.tensors[name].shape

    def load(self, name: str) -> np.ndarray:
        t = self.tensors.get(name)
        if t is None:
            raise ConversionError(f"{self.dir}: tensor {name!r} is missing from the checkpoint")
        return load_entry(t)

    def file(self, name: str) -> str | None:
        p = os.path.join(self.dir, name)
        return p if os.path.exists(p) else None

    def json_file(self, name: str) -> Any | None:
        p = self.file(name)
        return None if p is None else read_json(p, name)
