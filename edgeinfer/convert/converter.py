"""The conversion pipeline: plan every tensor from the checkpoint's headers, write the GGUF
header, then load -> merge LoRA -> rename/permute -> quantize -> write one tensor at a time."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import ConversionError
from ..gguf.types import GGMLType, GGUFValueType
from ..gguf.writer import GGUFWriter
from .arch import HParams, TensorMap
from .checkpoint import Checkpoint
from .lora import LoraAdapter
from .quantize import quantize
from .recipe import Recipe, parse_file_type, parse_keep
from .tokenizer_meta import tokenizer_metadata

__all__ = ["convert_checkpoint", "ConvertResult", "plan"]


@dataclass
class _Item:
    gguf: str
    hf: str | None                 # None: synthesized (rope_freqs)
    shape: tuple[int, ...]         # GGML order (ne0 first)
    type: GGMLType = GGMLType.F32
    data: np.ndarray | None = None  # synthesized data


@dataclass
class ConvertResult:
    path: str
    file_type: str
    n_tensors: int
    nbytes: int
    seconds: float
    type_counts: dict[str, int] = field(default_factory=dict)
    tensor_types: dict[str, str] = field(default_factory=dict)
    lora_merged: int = 0


def _sorted_names(hp: HParams, expected: dict[str, tuple[int, ...]], tmap: TensorMap):
    """Expected HF names in GGUF file order: token_embd, layers in order, output_norm, output."""
    def key(hf: str):
        g = tmap.gguf_name(hf) or ""
        if g.startswith("token_embd"):
            return (0, 0, g)
        if g.startswith("blk."):
            return (1, int(g.split(".")[1]), "")   # stable within a layer (insertion order)
        return (2, 0 if g.startswith("output_norm") else 1, g)
    return sorted(expected, key=key)


def plan(ckpt: Checkpoint, hp: HParams, tmap: TensorMap) -> list[_Item]:
    expected = tmap.expected()
    for name, shape in expected.items():
        if name not in ckpt:
            raise ConversionError(f"{ckpt.dir}: tensor {name!r} is missing from the checkpoint "
                                  f"({hp.arch.hf_name}, {hp.n_layer} layers"
                                  f"{', untied head' if name == 'lm_head.weight' else ''})")
        got = tuple(ckpt.shape(name))
        if got != shape:
            raise ConversionError(f"{ckpt.dir}: tensor {name!r} has shape {list(got)}, but "
                                  f"config.json implies {list(shape)}")
    for name in ckpt.names():
        g = tmap.gguf_name(name)        # raises for tensors the architecture does not have
        if g is not None and name not in expected:
            raise ConversionError(f"{ckpt.dir}: unexpected tensor {name!r}")
    items = [_Item(tmap.gguf_name(n), n, tuple(reversed(expected[n])))
             for n in _sorted_names(hp, expected, tmap)]
    rf = hp.rope_freqs()
    if rf is not None:
        items.insert(1, _Item("rope_freqs.weight", None, (rf.shape[0],), data=rf))
    return items


def convert_checkpoint(checkpoint_dir: str, out_path: str, file_type: str = "q4_k_m",
                       lora_dir: str | None = None, keep: list[str] | None = None,
                       n_threads: int = 0, progress: bool | Callable = False,
                       name: str | None = None) -> ConvertResult:
    """Converts a Hugging Face checkpoint directory to one GGUF file (atomically)."""
    t0 = time.perf_counter()
    ft = parse_file_type(file_type)
    keeps = parse_keep(keep)
    ckpt = Checkpoint(checkpoint_dir)
    hp = HParams.from_config(ckpt.config)
    tmap = TensorMap(hp)
    items = plan(ckpt, hp, tmap)
    adapter = None
    if lora_dir is not None:
        adapter = LoraAdapter(lora_dir)
        adapter.check_against({n: ckpt.shape(n) for n in ckpt.names()}, ckpt.dir)
        for t in adapter.targets():
            if tmap.gguf_name(t) is None:
                raise ConversionError(f"LoRA adapter {lora_dir} adapts {t!r}, which the "
                                      f"converted model does not use (tied head?)")
    tok_kv = tokenizer_metadata(ckpt, hp.n_vocab)

    has_output = any(it.gguf == "output.weight" for it in items)
    recipe = Recipe(ft, hp.n_layer, has_output, keeps)
    for it in items:
        it.type = recipe.choose(it.gguf, it.shape)
    unused = recipe.unused_keeps()
    if unused:
        raise ConversionError(f"--keep pattern(s) {', '.join(unused)} match no tensor "
                              f"(names look like 'blk.0.attn_v.weight', 'output.weight')")

    out_path = os.fspath(out_path)
    model_name = name or ckpt.config.get("_name_or_path") or os.path.basename(
        os.path.abspath(checkpoint_dir))
    quantized = any(it.type not in (GGMLType.F32, GGMLType.F16, GGMLType.BF16) for it in items)
    merged = 0
    with GGUFWriter(out_path) as w:
        w.add_kv("general.architecture", hp.arch.gguf_arch)
        w.add_kv("general.type", "model")
        w.add_kv("general.name", str(model_name)[:200])
        if lora_dir is not None:
            w.add_kv("general.finetune", "lora-merged")
        w.add_kv("general.file_type", ft.llama_ftype, GGUFValueType.UINT32)
        if quantized:
            w.add_kv("general.quantization_version", 2, GGUFValueType.UINT32)
        for key, val, vt in hp.metadata() + tok_kv:
            if vt == "STRING" and isinstance(val, list):
                w.add_kv(key, val, GGUFValueType.ARRAY, GGUFValueType.STRING)
            elif isinstance(val, list):
                w.add_kv(key, np.asarray(val, dtype={"FLOAT32": np.float32,
                                                     "INT32": np.int32}[vt]))
            else:
                w.add_kv(key, val, GGUFValueType[vt])
        for it in items:
            w.add_tensor_info(it.gguf, it.shape, it.type)
        w.write_header()
        bar = None
        if progress is True:
            from tqdm import tqdm
            bar = tqdm(total=w.total_tensor_bytes, unit="B", unit_scale=True,
                       unit_divisor=1024, desc="convert", dynamic_ncols=True)
        try:
            for k, it in enumerate(items):
                if it.hf is None:
                    x = it.data
                else:
                    x = ckpt.load(it.hf)
                    if adapter is not None and (it.hf in adapter.pairs
                                                or it.hf in adapter.replacements):
                        x = adapter.apply(it.hf, x)
                        merged += 1
                    f = tmap.transform(it.hf)
                    if f is not None:
                        x = f(x)
                    if not np.isfinite(x).all():
                        raise ConversionError(f"tensor {it.hf!r} holds NaN or infinite values")
                q = quantize(x.reshape(-1, it.shape[0]), it.type, n_threads)
                del x
                w.write_tensor_data(it.gguf, q)
                if bar is not None:
                    bar.set_postfix_str(f"{k + 1}/{len(items)} {it.gguf} {it.type.name}",
                                        refresh=False)
                    bar.update(q.nbytes)
                elif callable(progress):
                    progress(k + 1, len(items), it.gguf, q.nbytes)
                del q
        finally:
            if bar is not None:
                bar.close()
        nbytes = w.total_tensor_bytes
    counts: dict[str, int] = {}
    for it in items:
        counts[it.type.name] = counts.get(it.type.name, 0) + 1
    return ConvertResult(out_path, ft.name, len(items), os.path.getsize(out_path),
                         time.perf_counter() - t0, counts,
                         {it.gguf: it.type.name for it in items}, merged)
