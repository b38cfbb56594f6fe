"""Weights as native handles: the GGUF mmap's tensors handed to C without copying."""
from __future__ import annotations

from typing import Iterator, NamedTuple

import numpy as np

from ..arch.table import LONGROPE_ROLES
from ..gguf.reader import GGUFFile
from ..gguf.types import GGML_TYPES
from .._native import check, ffi, lib
from .config import ModelConfig


def c_role(role: str) -> int:
    """The C id of a table role: EI_T_<ROLE> of native/include/edgeinfer_roles.h."""
    return getattr(lib, "EI_T_" + role.upper())


def fill_config(c, cfg: ModelConfig) -> None:
    """Fills an ei_model_config struct (of any cffi instance: the CPU's or the CUDA library's)
    field by field from the ModelConfig attribute of the same name, so a field added to the C
    struct needs only that attribute (flags go over as 0 / 1)."""
    for name, _ in ffi.typeof(c).item.fields:
        setattr(c, name, getattr(cfg, name))


class Part(NamedTuple):
    """What one C role gets: a tensor of the file, or a run of its rows (a fused tensor's part)."""
    name: str
    type: int
    shape: tuple[int, ...]      # GGML order (ne0 first)
    data: np.ndarray            # zero-copy uint8 view of the bytes


def model_tensors(gguf: GGUFFile, cfg: ModelConfig, n_ctx: int) -> Iterator[tuple[int, int, Part]]:
    """(layer or -1, C role id, part) for every tensor the model uses, in file order. Fused
    tensors are cut into their C roles by rows (rows are whole blocks, so any type cuts);
    of LongRoPE's factor sets, the one for a context of `n_ctx` becomes rope_freqs."""
    longrope = LONGROPE_ROLES[1] if n_ctx > cfg.rope_ctx_orig else LONGROPE_ROLES[0]
    weights = {w.name: w for w in cfg.weights()}
    for name, info in gguf.tensors.items():
        w = weights.get(name)
        if w is None or w.layer >= cfg.n_layer:   # MTP blocks: kept in the file, not run by the trunk
            continue
        t = w.tensor
        if t.role in LONGROPE_ROLES:
            if t.role == longrope:
                yield w.layer, c_role("rope_freqs"), Part(name, info.type, info.shape, info.data)
            continue
        if not t.split:
            yield w.layer, c_role(t.role), Part(name, info.type, info.shape, info.data)
            continue
        tt = GGML_TYPES[info.type]
        row_bytes = info.shape[0] // tt.block_size * tt.type_size
        data, row = info.data, 0
        for role, rows in t.split:
            n = rows(cfg)
            yield w.layer, c_role(role), Part(f"{name}[{role}]", info.type, (info.shape[0], n),
                                              data[row * row_bytes:(row + n) * row_bytes])
            row += n


class NativeModel:
    """Owns an ei_model whose tensors point into the (kept-open) GGUF mmap."""

    def __init__(self, gguf: GGUFFile, cfg: ModelConfig, n_ctx: int):
        self.gguf = gguf          # keeps the mmap alive as long as the native model
        self.cfg = cfg
        c = ffi.new("ei_model_config *")
        fill_config(c, cfg)
        out = ffi.new("ei_model **")
        check(lib.ei_model_create(c, out), "model_create")
        self.handle = ffi.gc(out[0], lib.ei_model_free)
        for layer, role, info in model_tensors(gguf, cfg, n_ctx):
            ne0 = info.shape[0]
            ne1 = info.shape[1] if len(info.shape) > 1 else 1
            ptr = ffi.from_buffer(info.data)
            check(lib.ei_model_set_tensor(self.handle, layer, role, ptr, info.type, ne0, ne1),
                  f"tensor {info.name}")
        check(lib.ei_model_finalize(self.handle), "model_finalize")
