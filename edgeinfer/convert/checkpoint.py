"""Hugging Face checkpoint directories: config.json plus one or many safetensors files,
read one tensor at a time through the `safetensors` library.

Each `load(name)` opens the shard, copies exactly that tensor out and closes the shard again,
returning a float32 array: memory stays bounded by the largest tensor, whatever the size of
the checkpoint (a shard left open would keep every page it has touched mapped, and resident).
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import ConversionError

try:
    from safetensors import SafetensorError, safe_open
except ImportError:  # an optional extra: only the converter reads checkpoints
    raise ConversionError("converting needs safetensors: pip install 'edgeinfer[convert]'") from None

__all__ = ["Checkpoint", "SafetensorsFile", "TensorEntry", "read_json", "load_entry"]

#: safetensors dtypes a checkpoint's tensors may have (all read as float32)
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")


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
    dtype: str                # safetensors dtype name: F32, F16, BF16, F64
    shape: tuple[int, ...]    # as stored (PyTorch order: rows first)
    path: str

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _open(path: str):
    try:
        return safe_open(path, framework="numpy")
    except FileNotFoundError:
        raise ConversionError(f"safetensors file not found: {path}") from None
    except SafetensorError as e:     # bad length, bad JSON, offsets outside the file, ...
        raise ConversionError(f"{path}: corrupt safetensors header or truncated file "
                              f"({e})") from None
    except OSError as e:
        raise ConversionError(f"{path}: cannot read: {e}") from None


class SafetensorsFile:
    """One .safetensors file's tensor index (names, dtypes, shapes), validated by the
    safetensors library when it opens the file."""

    def __init__(self, path: str):
        self.path = path
        self.tensors: dict[str, TensorEntry] = {}
        with _open(path) as f:
            for name in f.keys():
                sl = f.get_slice(name)
                dtype = sl.get_dtype()
                if dtype not in FLOAT_DTYPES:
                    raise ConversionError(f"{path}: tensor {name!r} has dtype {dtype}; "
                                          f"supported: {', '.join(FLOAT_DTYPES)}")
                self.tensors[name] = TensorEntry(name, dtype, tuple(int(d) for d in sl.get_shape()),
                                                 path)


def _load_bf16(t: TensorEntry) -> np.ndarray:
    # numpy has no bfloat16, and safetensors' numpy framework raises "data type 'bfloat16'
    # not understood" for BF16 tensors (its other frameworks need torch/jax/...). So this one
    # dtype is read by hand: the file was already validated by safe_open, we only look up the
    # tensor's byte range in the JSON header and widen each 16-bit value to float32 (bf16 is
    # the top half of a float32).
    try:
        with open(t.path, "rb") as fh:
            (hlen,) = struct.unpack("<Q", fh.read(8))
            b, e = json.loads(fh.read(hlen))[t.name]["data_offsets"]
            fh.seek(8 + hlen + b)
            raw = fh.read(e - b)
    except (OSError, ValueError, KeyError, struct.error) as ex:
        raise ConversionError(f"{t.path}: cannot read tensor {t.name!r}: {ex}") from None
    if len(raw) != 2 * t.n_elements:
        raise ConversionError(f"{t.path}: truncated file: tensor {t.name!r}")
    a = np.frombuffer(raw, dtype="<u2").astype(np.uint32)
    a <<= 16
    return a.view(np.float32).reshape(t.shape)


def load_entry(t: TensorEntry) -> np.ndarray:
    """Reads one tensor from disk as float32 (a fresh array in PyTorch shape order)."""
    if t.dtype == "BF16":
        return _load_bf16(t)
    with _open(t.path) as f:
        try:
            a = f.get_tensor(t.name)
        except SafetensorError as e:
            raise ConversionError(f"{t.path}: cannot read tensor {t.name!r}: {e}") from None
    # get_tensor already copied the bytes out of the mapping: F32 is returned as is
    return a.astype(np.float32, copy=False).reshape(t.shape)


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

    def rename(self, canonical: Callable[[str], str | None]) -> None:
        """Names every tensor by `canonical` (None: not converted), for a family whose
        checkpoints nest or relocate the decoder's tensors (Qwen3.5's language_model, mtp)."""
        renamed: dict = {}
        for n, t in self.tensors.items():
            c = canonical(n)
            if c is None:
                continue
            if c in renamed:
                raise ConversionError(f"{self.dir}: two tensors name {c!r} (one of them {n!r}): "
                                      f"the folder holds two copies of the model?")
            renamed[c] = t
        self.tensors = renamed

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
