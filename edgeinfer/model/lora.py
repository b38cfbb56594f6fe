"""LoRA adapters kept apart from the base weights: float32 (A, B) pairs on the base GGUF's tensor
names, read from a llama.cpp LoRA GGUF and checked against the base model, and their native
handle (native/src/lora.c). A PEFT folder becomes such pairs in edgeinfer.convert.lora."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._native import check, dequantize, ffi, lib
from ..errors import EdgeInferError
from ..gguf.reader import GGUFFile
from .config import ModelConfig
from .native_model import NativeModel, c_role

__all__ = ["AdapterError", "LoraWeights", "read_gguf_adapter", "check_pairs", "role_pairs", "NativeLora"]


class AdapterError(EdgeInferError, ValueError):
    """An adapter that cannot be used with this base model (HTTP 400): unreadable, for another
    architecture, or a tensor the base lacks or has in another shape (named in the message)."""


@dataclass
class LoraWeights:
    """One adapter: GGUF tensor name -> (A [rank, in], B [out, rank]) float32, its scale in B."""
    path: str
    pairs: dict[str, tuple[np.ndarray, np.ndarray]]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.pairs.values())

    @property
    def ranks(self) -> list[int]:
        return sorted({a.shape[0] for a, _ in self.pairs.values()})


def _floats(info) -> np.ndarray:
    """A GGUF tensor as float32 [ne1, ne0] (any type the native kernels can dequantize)."""
    return dequantize(info.data, info.type, int(np.prod(info.shape[1:], dtype=np.int64)), info.shape[0])


def read_gguf_adapter(path: str, cfg: ModelConfig) -> LoraWeights:
    """A llama.cpp LoRA GGUF (convert_lora_to_gguf.py's or `edgeinfer convert-lora`'s) for `cfg`'s model;
    the scale is alpha / rank (llama.cpp's), 1 where alpha is 0."""
    try:
        f = GGUFFile(path)
    except (OSError, EdgeInferError) as e:
        raise AdapterError(f"{path}: not a readable GGUF adapter: {e}") from None
    with f:
        kind, atype = f.get("general.type", ""), f.get("adapter.type", "")
        if kind != "adapter" or atype != "lora":
            raise AdapterError(f"{path}: not a LoRA adapter (general.type {kind!r}, adapter.type {atype!r})")
        arch = f.get("general.architecture", "")
        if arch != cfg.arch:
            raise AdapterError(f"{path}: a LoRA adapter for architecture {arch!r}, the base model is {cfg.arch!r}")
        alpha = float(f.get("adapter.lora.alpha", 0.0) or 0.0)
        halves: dict[str, dict[str, np.ndarray]] = {}
        for name, info in f.tensors.items():
            base, _, part = name.rpartition(".")
            if part not in ("lora_a", "lora_b"):
                raise AdapterError(f"{path}: tensor {name!r} is neither a .lora_a nor a .lora_b")
            halves.setdefault(base, {})[part] = _floats(info)
    pairs = {}
    for base, h in halves.items():
        if set(h) != {"lora_a", "lora_b"}:
            raise AdapterError(f"{path}: {base!r} has only its {next(iter(h))}")
        a, b = h["lora_a"], h["lora_b"]
        if a.shape[0] != b.shape[1]:
            raise AdapterError(f"{path}: {base!r}: lora_a has rank {a.shape[0]}, lora_b {b.shape[1]}")
        scale = alpha / a.shape[0] if alpha else 1.0
        pairs[base] = (a, (b * np.float32(scale)) if scale != 1.0 else b)
    return LoraWeights(path, pairs)


def check_pairs(weights: LoraWeights, cfg: ModelConfig) -> None:
    """Every pair adapts a matrix of the base in its shape; AdapterError names the first that does not."""
    shapes = {w.name: w.shape for w in cfg.weights() if w.layer < cfg.n_layer}
    if not weights.pairs:
        raise AdapterError(f"{weights.path}: the adapter holds no tensor pairs")
    for name, (a, b) in weights.pairs.items():
        shape = shapes.get(name)
        if shape is None:
            raise AdapterError(f"adapter {weights.path} does not fit this base model: it adapts {name!r}, "
                               f"which the base model does not have")
        if name == "token_embd.weight" or len(shape) != 2:
            raise AdapterError(f"adapter {weights.path} adapts {name!r}, which is not a matmul weight "
                               f"(merge such an adapter with `edgeinfer convert --lora`)")
        if a.shape[1] != shape[0] or b.shape[0] != shape[1] or a.shape[0] != b.shape[1]:
            raise AdapterError(f"adapter {weights.path} does not fit this base model: {name!r} is "
                               f"[{shape[0]}, {shape[1]}] (GGML order) in the base, the adapter's A is "
                               f"{list(a.shape)} and B {list(b.shape)}")
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            raise AdapterError(f"adapter {weights.path}: {name!r} holds NaN or infinite values")


def role_pairs(weights: LoraWeights, cfg: ModelConfig):
    """(tensor name, layer, C role, A, B) float32 contiguous for every pair, a fused tensor's B cut by
    rows into its C roles (the runtimes hold those roles apart); what each backend's handle is fed."""
    by_name = {w.name: w for w in cfg.weights()}
    for name, (a, b) in weights.pairs.items():
        w = by_name[name]
        t = w.tensor
        parts = [(t.role, b)]
        if t.split:     # a fused tensor run as several C roles: B's rows go with their role
            parts, row = [], 0
            for role, rows in t.split:
                n = rows(cfg)
                parts.append((role, b[row:row + n]))
                row += n
        a32 = np.ascontiguousarray(a, dtype=np.float32)
        for role, bpart in parts:
            yield name, w.layer, c_role(role), a32, np.ascontiguousarray(bpart, dtype=np.float32)


class NativeLora:
    """The adapter's native handle for one loaded model (the native side copies the pairs)."""

    def __init__(self, model: NativeModel, weights: LoraWeights):
        check_pairs(weights, model.cfg)
        self.weights = weights
        out = ffi.new("ei_lora **")
        check(lib.ei_lora_create(model.handle, out), "lora_create")
        self.handle = ffi.gc(out[0], lib.ei_lora_free)
        for name, layer, role, a32, bpart in role_pairs(weights, model.cfg):
            check(lib.ei_lora_set(self.handle, layer, role, a32.shape[0],
                                  ffi.from_buffer("float[]", a32), ffi.from_buffer("float[]", bpart)),
                  f"adapter tensor {name}")
