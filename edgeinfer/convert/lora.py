"""PEFT LoRA adapters merged into base weights before quantization.

For each adapted linear layer: W += scale * B @ A, with scale = lora_alpha / r (or
lora_alpha / sqrt(r) with use_rslora); per-module `rank_pattern` / `alpha_pattern` honoured;
`fan_in_fan_out` layers store W transposed; embedding adapters (lora_embedding_A/B) add
(B @ A).T; `modules_to_save` copies replace the base tensor. The rank is read from the
tensors themselves.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

import numpy as np

from ..errors import ConversionError
from .checkpoint import SafetensorsFile, load_entry, read_json

__all__ = ["LoraAdapter"]

_KEY_RE = re.compile(r"^(?P<mod>.+?)\.(?P<kind>lora_A|lora_B|lora_embedding_A|lora_embedding_B)"
                     r"(?:\.[A-Za-z0-9_]+)?(?:\.weight)?$")


def _strip(name: str) -> str:
    for p in ("base_model.model.",):
        if name.startswith(p):
            name = name[len(p):]
    return name.replace(".modules_to_save.default", "").replace(".default.", ".")


def _pattern_value(patterns: dict, module: str, default):
    for key, val in (patterns or {}).items():
        if re.match(rf"(.*\.)?{key}$", module):
            return val
    return default


@dataclass
class _Pair:
    module: str
    a: np.ndarray | None = None
    b: np.ndarray | None = None
    embedding: bool = False


class LoraAdapter:
    """A PEFT adapter directory (adapter_config.json + adapter_model.safetensors)."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = os.fspath(directory)
        if not os.path.isdir(self.dir):
            raise ConversionError(f"LoRA adapter directory not found: {self.dir}")
        cfg = read_json(os.path.join(self.dir, "adapter_config.json"), "adapter_config.json")
        if not isinstance(cfg, dict):
            raise ConversionError(f"{self.dir}/adapter_config.json is not a JSON object")
        self.config = cfg
        ptype = str(cfg.get("peft_type", "LORA")).upper()
        if ptype != "LORA":
            raise ConversionError(f"{self.dir}: adapter type {ptype} is not supported (LORA only)")
        if cfg.get("use_dora"):
            raise ConversionError(f"{self.dir}: DoRA adapters (use_dora) are not supported")
        if cfg.get("bias", "none") not in ("none", None):
            raise ConversionError(f"{self.dir}: adapters that train biases "
                                  f"(bias={cfg.get('bias')!r}) are not supported")
        self.r = int(cfg.get("r", 8))
        self.alpha = float(cfg.get("lora_alpha", self.r))
        self.rslora = bool(cfg.get("use_rslora", False))
        self.fan_in_fan_out = bool(cfg.get("fan_in_fan_out", False))
        path = os.path.join(self.dir, "adapter_model.safetensors")
        if not os.path.exists(path):
            hint = (" (adapter_model.bin is a PyTorch pickle: re-save with "
                    "safe_serialization=True)"
                    if os.path.exists(os.path.join(self.dir, "adapter_model.bin")) else "")
            raise ConversionError(f"{self.dir}: adapter_model.safetensors not found{hint}")
        st = SafetensorsFile(path)
        pairs: dict[str, _Pair] = {}
        self.replacements: dict[str, np.ndarray] = {}
        for name, entry in st.tensors.items():
            n = _strip(name)
            m = _KEY_RE.match(n)
            if m is None:
                if n.endswith((".weight", ".bias")):
                    self.replacements[n] = load_entry(entry)   # modules_to_save
                    continue
                raise ConversionError(f"{path}: unrecognised adapter tensor {name!r}")
            p = pairs.setdefault(m["mod"], _Pair(m["mod"]))
            kind = m["kind"]
            p.embedding = kind.startswith("lora_embedding")
            if kind.endswith("A"):
                p.a = load_entry(entry)
            else:
                p.b = load_entry(entry)
        for p in pairs.values():
            if p.a is None or p.b is None:
                raise ConversionError(f"{path}: module {p.module!r} has only one of "
                                      f"lora_A / lora_B")
        # base tensor name -> pair
        self.pairs = {p.module + ".weight": p for p in pairs.values()}
        self.used: set[str] = set()

    def scale(self, module: str, rank: int) -> float:
        r = int(_pattern_value(self.config.get("rank_pattern"), module, rank))
        alpha = float(_pattern_value(self.config.get("alpha_pattern"), module, self.alpha))
        return alpha / math.sqrt(r) if self.rslora else alpha / r

    def targets(self) -> list[str]:
        return sorted(set(self.pairs) | set(self.replacements))

    def check_against(self, shapes: dict[str, tuple[int, ...]], base_dir: str) -> None:
        """Every adapted tensor must exist in the base with compatible shapes."""
        for name in self.targets():
            if name not in shapes:
                raise ConversionError(
                    f"LoRA adapter {self.dir} does not match the base model {base_dir}: it "
                    f"adapts {name!r}, which the base model does not have")
            if name in self.replacements:
                if tuple(self.replacements[name].shape) != tuple(shapes[name]):
                    raise ConversionError(
                        f"LoRA adapter {self.dir} does not match the base model {base_dir}: "
                        f"{name!r} is {list(self.replacements[name].shape)} in the adapter, "
                        f"{list(shapes[name])} in the base")
                continue
            p = self.pairs[name]
            w = tuple(shapes[name])
            if len(w) != 2:
                raise ConversionError(f"LoRA adapter targets the 1-D tensor {name!r}")
            a, b = p.a.shape, p.b.shape
            if p.embedding:        # A: [r, vocab], B: [dim, r]; W: [vocab, dim]
                want = (a[0] == b[1] and a[1] == w[0] and b[0] == w[1])
            else:
                out_dim, in_dim = (w[1], w[0]) if self.fan_in_fan_out else w
                want = (a[0] == b[1] and a[1] == in_dim and b[0] == out_dim)
            if not want:
                raise ConversionError(
                    f"LoRA adapter {self.dir} does not match the base model {base_dir}: "
                    f"{name!r} is {list(w)} in the base but the adapter's A is {list(a)} and "
                    f"B is {list(b)}")

    def apply(self, name: str, w: np.ndarray) -> np.ndarray:
        """The merged weight for base tensor `name` (float32, PyTorch layout)."""
        if name in self.replacements:
            self.used.add(name)
            return self.replacements[name].astype(np.float32, copy=True)
        p = self.pairs.get(name)
        if p is None:
            return w
        self.used.add(name)
        rank = p.a.shape[0]
        s = self.scale(p.module, rank)
        delta = (p.b.astype(np.float64) @ p.a.astype(np.float64)) * s
        if p.embedding or self.fan_in_fan_out:
            delta = delta.T
        return (w.astype(np.float64) + delta).astype(np.float32)
