"""PEFT LoRA adapters merged into base weights before quantization.

For each adapted linear layer: W += scale * B @ A, with scale = lora_alpha / r (or
lora_alpha / sqrt(r) with use_rslora); per-module `rank_pattern` / `alpha_pattern` honoured;
`fan_in_fan_out` layers store W transposed; embedding adapters (lora_embedding_A/B) add
(B @ A).T; `modules_to_save` copies replace the base tensor. The rank is read from the
tensors themselves.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass

import numpy as np

from ..errors import ConversionError
from ..gguf.types import GGMLType
from .arch import HParams
from .checkpoint import SafetensorsFile, load_entry, read_json

__all__ = ["LoraAdapter", "adapter_pairs", "hparams_from_model", "write_adapter_gguf", "convert_lora"]

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


# ---------------------------------------------------------------- adapters kept apart (run time)

def hparams_from_model(cfg) -> HParams:
    """The converter's hyperparameters of a loaded base model (edgeinfer.model.config.ModelConfig):
    what maps an adapter's Hugging Face names to the base GGUF's when no config.json is at hand."""
    values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(HParams)
              if f.name not in ("arch", "hf_class", "n_ctx", "partial_rotary", "rope_scaling", "ssm_conv_kernel")
              and hasattr(cfg, f.name)}
    return HParams(arch=cfg.family, hf_class=cfg.family.name, n_ctx=cfg.n_ctx_train,
                   partial_rotary=cfg.rope_dim / cfg.head_dim if cfg.head_dim else 1.0,
                   rope_scaling={"rope_type": "default"}, ssm_conv_kernel=getattr(cfg, "conv_kernel", 0),
                   **values)


def _row_or_column_permutation(f, shape: tuple[int, int]) -> tuple[str, np.ndarray] | None:
    """How the converter's transform f moves a weight's entries, when it only reorders its rows or
    its columns: ("rows", p) with f(W) = W[p], ("cols", p) with f(W) = W[:, p]; None otherwise."""
    rows = np.broadcast_to(np.arange(shape[0], dtype=np.float32)[:, None], shape).copy()
    cols = np.broadcast_to(np.arange(shape[1], dtype=np.float32)[None, :], shape).copy()
    fr, fc = np.asarray(f(rows)), np.asarray(f(cols))
    if fr.shape != shape or fc.shape != shape:
        return None
    if np.array_equal(fc, cols) and (fr == fr[:, :1]).all():
        return "rows", fr[:, 0].astype(np.int64)
    if np.array_equal(fr, rows) and (fc == fc[:1, :]).all():
        return "cols", fc[0].astype(np.int64)
    return None


def adapter_pairs(adapter: LoraAdapter, hp: HParams) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The adapter as float32 pairs on the GGUF tensors of the base: name -> (A [r, in], B [out, r])
    with the adapter's scale (alpha / r, rank and alpha patterns, rsLoRA) in B, and the converter's
    row or column reordering of that tensor (Llama's Q/K, Qwen3.5's value heads) applied to B or A,
    so that W + B A is what `convert --lora` merges. What cannot stay apart is refused by name."""
    from .arch import TensorMap

    tmap = TensorMap(hp)
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if adapter.replacements:
        name = sorted(adapter.replacements)[0]
        raise ConversionError(f"LoRA adapter {adapter.dir} replaces {name!r} whole (modules_to_save): "
                              f"such an adapter cannot be applied at run time; merge it with "
                              f"`edgeinfer convert --lora`")
    for hf, p in sorted(adapter.pairs.items()):
        canonical = tmap.canonical_name(hf)
        try:
            gguf = tmap.gguf_name(canonical) if canonical is not None else None
        except ConversionError as e:
            raise ConversionError(f"LoRA adapter {adapter.dir} does not fit the base model: {e}") from None
        if gguf is None:
            raise ConversionError(f"LoRA adapter {adapter.dir} adapts {hf!r}, which the base model "
                                  f"does not hold (a tied head?)")
        if p.embedding:
            raise ConversionError(f"LoRA adapter {adapter.dir} adapts the embedding {hf!r}: apply it "
                                  f"by merging (`edgeinfer convert --lora`)")
        a, b = p.a.astype(np.float32), p.b.astype(np.float32)
        if adapter.fan_in_fan_out:      # the delta is (B A)^T = A^T B^T
            a, b = b.T.copy(), a.T.copy()
        b = b * np.float32(adapter.scale(p.module, p.a.shape[0]))
        f = tmap.transform(canonical)
        if f is not None:
            moved = _row_or_column_permutation(f, (b.shape[0], a.shape[1]))
            if moved is None:
                raise ConversionError(f"LoRA adapter {adapter.dir}: the converter changes {hf!r} in a way "
                                      f"an adapter cannot follow; merge it with `edgeinfer convert --lora`")
            kind, perm = moved
            if kind == "rows":
                b = b[perm]
            else:
                a = a[:, perm]
        out[gguf] = (np.ascontiguousarray(a), np.ascontiguousarray(b))
    return out


ADAPTER_TYPES = {"f32": GGMLType.F32, "f16": GGMLType.F16, "q8_0": GGMLType.Q8_0}


def write_adapter_gguf(pairs: dict[str, tuple[np.ndarray, np.ndarray]], arch: str, out_path: str,
                       type_: str = "f32", name: str = "") -> int:
    """A llama.cpp LoRA GGUF (general.type "adapter", `<tensor>.lora_a` [in, r] and `.lora_b` [r, out]
    in GGML order); the scale is in B already, so adapter.lora.alpha is 0 (llama.cpp: scale 1).
    Returns the file's size in bytes."""
    from ..gguf.types import GGUFValueType
    from ..gguf.writer import GGUFWriter
    from .quantize import can_quantize, quantize

    if type_ not in ADAPTER_TYPES:
        raise ConversionError(f"adapter type must be one of {sorted(ADAPTER_TYPES)}, got {type_!r}")
    want = ADAPTER_TYPES[type_]
    with GGUFWriter(out_path) as w:
        w.add_kv("general.architecture", arch)
        w.add_kv("general.type", "adapter")
        if name:
            w.add_kv("general.name", name[:200])
        w.add_kv("adapter.type", "lora")
        w.add_kv("adapter.lora.alpha", 0.0, GGUFValueType.FLOAT32)
        tensors = []
        for tname, (a, b) in pairs.items():
            for suffix, x in (("lora_a", a), ("lora_b", b)):
                t = want if can_quantize(want, x.shape[1]) else GGMLType.F32
                tensors.append((f"{tname}.{suffix}", x, t))
                w.add_tensor_info(f"{tname}.{suffix}", (x.shape[1], x.shape[0]), t)
        w.write_header()
        for tname, x, t in tensors:
            w.write_tensor_data(tname, quantize(x, t))
    return os.path.getsize(out_path)


def convert_lora(adapter_dir: str, base_dir: str, out_path: str, type_: str = "f32") -> tuple[int, int]:
    """`edgeinfer convert-lora`: a PEFT adapter folder -> a llama.cpp LoRA GGUF for the base model whose
    Hugging Face folder (its config.json) is `base_dir`. Returns (adapted tensors, file bytes)."""
    adapter = LoraAdapter(adapter_dir)
    if not os.path.isdir(base_dir):
        raise ConversionError(f"--base must be the base model's Hugging Face folder (its config.json), "
                              f"got {base_dir}")
    hp = HParams.from_config(read_json(os.path.join(base_dir, "config.json"), "config.json"))
    pairs = adapter_pairs(adapter, hp)
    name = os.path.basename(os.path.abspath(adapter_dir))
    return len(pairs), write_adapter_gguf(pairs, hp.arch.name, out_path, type_, name)
