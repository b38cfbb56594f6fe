"""GGUF -> GGUF quantization (llama-quantize's job): a float GGUF -- an F16 or BF16 file
llama.cpp's converter wrote, or one of ours -- quantized by the recipe `convert` uses.

The output is the file llama.cpp's quantizer writes from the same input: the metadata copied
in order with general.quantization_version and general.file_type set last, the tensors in
llama.cpp's order (by block, then by name), tensors llama.cpp leaves alone copied byte for
byte, the rest quantized by the same rules and the same (bit-exact) quantizers."""
from __future__ import annotations

import os
import time
from typing import Callable

import numpy as np

from ..arch import get_arch
from ..errors import ConversionError
from ..gguf import GGUFFile
from ..gguf.types import COMPUTE_TYPES, GGMLType, GGUFValueType
from ..gguf.writer import DEFAULT_ALIGNMENT, GGUFWriter
from ..progress import bar
from .converter import ConvertResult, tensor_written
from .imatrix import Imatrix, ImportanceUse
from .quantize import quantize, row_nbytes
from .recipe import (AUTO, FLOAT_TYPES, Recipe, allows_quantization, block_index, is_70b_class,
                     parse_file_type, parse_keep)

__all__ = ["quantize_gguf"]

# keys the quantizer sets itself; a split file's part numbers do not describe the whole
_SET_HERE = {"general.quantization_version", "general.file_type", "split.no", "split.count",
             "split.tensors.count"}
_SLAB_FLOATS = 1 << 23         # rows quantized per step: 32 MiB of float32


def _llama_order(name: str) -> tuple[int, str]:
    """llama.cpp's tensor order (llama_model_loader's weight_name_comparer): tensors outside
    the blocks first, then block by block; by name within each."""
    i = block_index(name)
    return (-1 if i is None else i, name)


def quantize_gguf(src_path: str, out_path: str, file_type: str = "q4_k_m",
                  keep: list[str] | None = None, imatrix: str | None = None,
                  allow_requantize: bool = False, n_threads: int = 0,
                  progress: bool | Callable = False) -> ConvertResult:
    """Quantizes the model GGUF `src_path` to `file_type` into `out_path` (atomically).
    `keep` and `imatrix` as in convert_checkpoint. Tensors already quantized in the source
    are refused unless `allow_requantize` (their rounding error adds to the new one)."""
    t0 = time.perf_counter()
    ft = parse_file_type(file_type)
    if ft is AUTO:
        raise ConversionError("--type auto measures sensitivity on the Hugging Face checkpoint: "
                              "use `edgeinfer convert --type auto` on it")
    keeps = parse_keep(keep)
    if os.path.exists(out_path) and os.path.exists(src_path) and os.path.samefile(src_path, out_path):
        raise ConversionError(f"the output {out_path} is the input file: write the quantized model "
                              f"to another path")
    with GGUFFile(src_path) as src:
        src.require_model()
        if src.get("split.count", 1, kind=int) > 1:
            raise ConversionError(f"{src_path} is one part of a split model: merge the parts first "
                                  f"(llama.cpp's llama-gguf-split --merge)")
        importance = Imatrix.load(imatrix) if imatrix is not None else None
        plan = _plan(src, ft, keeps, importance is not None)
        requantized = _check_sources(src, plan, allow_requantize)
        use = ImportanceUse(importance)
        imatrix_kv = importance.metadata(imatrix) if importance is not None else []
        with GGUFWriter(out_path, alignment=src.alignment) as w:
            # the source's keys in its order but those set here, which go last as llama.cpp
            # sets them (a custom alignment the writer puts first)
            set_here = _SET_HERE | {key for key, _, _ in imatrix_kv}
            if src.alignment != DEFAULT_ALIGNMENT:
                set_here.add("general.alignment")
            for key in src.keys():
                if key not in set_here:
                    vtype, etype = src.field_type(key)
                    w.add_kv(key, src.metadata[key], vtype, etype)
            w.add_kv("general.quantization_version", 2, GGUFValueType.UINT32)
            w.add_kv("general.file_type", ft.llama_ftype, GGUFValueType.UINT32)
            for key, val, vt in imatrix_kv:
                w.add_kv(key, val, GGUFValueType[vt])
            for t, new in plan:
                w.add_tensor_info(t.name, _ggml_shape(t.shape), new)
            w.write_header()
            with bar(w.total_tensor_bytes, "quantize", quiet=progress is not True) as pbar:
                for k, (t, new) in enumerate(plan):
                    if new == t.ggml_type:
                        q = _checked_copy(t)
                    else:
                        q = _quantized(t, new, use.weights(t.name, t.shape[0], new), n_threads)
                    w.write_tensor_data(t.name, q)
                    src.release(t)
                    tensor_written(pbar, progress, k, len(plan), t.name, new, q.nbytes)
                    del q
            nbytes = w.total_tensor_bytes
        n_el = sum(t.n_elements for t, _ in plan)
    counts: dict[str, int] = {}
    for _, new in plan:
        counts[new.name] = counts.get(new.name, 0) + 1
    notes = []
    if requantized:
        notes.append(f"requantized {requantized} tensors that were already quantized")
    notes += use.notes()
    return ConvertResult(out_path, ft.name, len(plan), os.path.getsize(out_path),
                         time.perf_counter() - t0, counts, {t.name: new.name for t, new in plan},
                         bpw=8.0 * nbytes / n_el, notes=notes)


def _plan(src: GGUFFile, ft, keeps, imatrix: bool) -> list[tuple]:
    """(tensor, its new type) in llama.cpp's order, by the recipe; tensors llama.cpp never
    quantizes keep their type."""
    arch = get_arch(src.get("general.architecture", kind=str), src.path)
    n_layer = src.get(f"{arch.name}.block_count", kind=int)
    type_70b = False
    if arch.name in ("llama", "qwen2"):
        n_head = src.get(f"{arch.name}.attention.head_count", kind=int)
        n_head_kv = src.get(f"{arch.name}.attention.head_count_kv", n_head, kind=int)
        type_70b = is_70b_class(arch.name, n_layer, n_head, n_head_kv)
    tensors = sorted(src.tensors.values(), key=lambda t: _llama_order(t.name))
    recipe = Recipe(ft, n_layer, "output.weight" in src.tensors, keeps, imatrix=imatrix,
                    names=[t.name for t in tensors], type_70b=type_70b)
    plan = [(t, recipe.choose(t.name, t.shape) if allows_quantization(t.name, _n_dims(t.shape))
             else t.ggml_type) for t in tensors]
    unused = recipe.unused_keeps()
    if unused:
        raise ConversionError(f"--keep pattern(s) {', '.join(unused)} match no tensor of {src.path} "
                              f"that is quantized (norms, 1-D tensors and the small tensors llama.cpp "
                              f"leaves alone keep their type)")
    return plan


def _check_sources(src: GGUFFile, plan: list[tuple], allow_requantize: bool) -> int:
    """How many already quantized tensors are quantized again; ConversionError, before anything
    is written, for one quantized again without leave, or in a type edgeinfer cannot read."""
    requantized = [t for t, new in plan if new != t.ggml_type and t.ggml_type not in FLOAT_TYPES]
    if requantized and not allow_requantize:
        t = requantized[0]
        raise ConversionError(
            f"{src.path} is already quantized ({t.name} is {t.type_name}): quantizing it again "
            f"adds a second rounding error to the first; start from the F16/BF16 file, or pass "
            f"--allow-requantize to do it anyway")
    unreadable = [t for t in requantized if t.ggml_type not in COMPUTE_TYPES]
    if unreadable:
        t = unreadable[0]
        raise ConversionError(
            f"{src.path}: tensor {t.name} is {t.type_name}, which edgeinfer cannot read to quantize "
            f"again (it reads {', '.join(GGMLType(x).name for x in sorted(COMPUTE_TYPES))})")
    return len(requantized)


def _n_dims(shape: tuple[int, ...]) -> int:
    """ggml_n_dims: the dimensions up to the last one that is not 1 (at least one)."""
    n = len(shape)
    while n > 1 and shape[n - 1] == 1:
        n -= 1
    return n


def _ggml_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape as llama.cpp writes it: trailing dimensions of 1 dropped."""
    return tuple(shape[:_n_dims(shape)])


def _checked_copy(t) -> np.ndarray:
    """A tensor copied unchanged; ConversionError if it is a float tensor holding NaN or inf."""
    bits = {GGMLType.F32: (np.uint32, 0x7F800000), GGMLType.F16: (np.uint16, 0x7C00),
            GGMLType.BF16: (np.uint16, 0x7F80)}.get(t.ggml_type)
    if bits is not None:
        dtype, exponent = bits
        values = t.data.view(dtype)
        for i in range(0, values.size, _SLAB_FLOATS):     # no temporary the size of the tensor
            if ((values[i:i + _SLAB_FLOATS] & dtype(exponent)) == exponent).any():
                raise ConversionError(f"tensor {t.name!r} holds NaN or infinite values")
    return t.data


def _quantized(t, new: GGMLType, importance: np.ndarray | None, n_threads: int) -> np.ndarray:
    """Tensor `t` quantized to `new`, a slab of rows at a time: no float copy of a whole
    tensor (a 128K-row embedding table is 1 GiB of float32). ConversionError on a value that
    is not finite."""
    from .._native import dequantize

    out = np.empty((t.n_rows, row_nbytes(new, t.shape[0])), dtype=np.uint8)
    step = max(1, _SLAB_FLOATS // t.shape[0])
    for r0 in range(0, t.n_rows, step):
        r1 = min(t.n_rows, r0 + step)
        x = dequantize(t.data[r0 * t.row_nbytes:r1 * t.row_nbytes], t.type, r1 - r0, t.shape[0])
        if not np.isfinite(x).all():
            raise ConversionError(f"tensor {t.name!r} holds NaN or infinite values")
        quantize(x, new, n_threads, importance=importance, out=out[r0:r1])
    return out
