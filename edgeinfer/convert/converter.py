"""The conversion pipeline: plan every tensor from the checkpoint's headers, write the GGUF
header, then load -> merge LoRA -> rename/permute -> quantize -> write one tensor at a time."""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np
from gguf.constants import Keys

from ..errors import ConversionError
from ..gguf.types import GGMLType, GGUFValueType
from ..gguf.writer import GGUFWriter
from ..progress import bar, status
from ..arch import arch_for_hf, get_arch
from ..gguf import GGUFFile
from .arch import HParams, TensorMap, multimodal_part
from .gemma4 import Gemma4HParams
from .lfm2 import Lfm2HParams
from .checkpoint import Checkpoint
from .imatrix import Imatrix, ImportanceUse
from .lora import LoraAdapter
from .quantize import quantize, row_nbytes
from .recipe import AUTO, FLOAT_TYPES, Recipe, is_70b_class, parse_file_type, parse_keep
from .pooling import sentence_pooling
from .rerank import rerank_head
from .sensitivity import Sensitivity
from .tokenizer_meta import tokenizer_metadata

__all__ = ["convert_checkpoint", "compute_imatrix", "ConvertResult", "plan"]

_CALIB_CTX = 256     # --type auto's calibration window length (tokens, BOS included)


@dataclass
class _Item:
    gguf: str
    hf: str | None                 # None: synthesized (rope_freqs)
    shape: tuple[int, ...]         # GGML order (ne0 first)
    type: GGMLType = GGMLType.F32
    data: np.ndarray | None = None  # synthesized data
    rows: tuple[int, ...] = ()     # only these rows of `hf`, in this order (a reranker's head), kept F32


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
    bpw: float = 0.0                       # 8 * tensor bytes / weights
    predicted_kl: float | None = None      # --type auto: the sensitivity model's prediction
    sensitivity: "Sensitivity | None" = field(default=None, repr=False)
    notes: list[str] = field(default_factory=list)   # what the user should know (parts left out)


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
                                  f"({hp.hf_class}, {hp.n_layer} layers"
                                  f"{', untied head' if name == 'lm_head.weight' else ''})")
        got = tuple(ckpt.shape(name))
        if got != shape:
            raise ConversionError(f"{ckpt.dir}: tensor {name!r} has shape {list(got)}, but "
                                  f"config.json implies {list(shape)}")
    for name in ckpt.names():
        g = tmap.gguf_name(name)        # raises for tensors the architecture does not have
        if g is not None and name not in expected:
            raise ConversionError(f"{ckpt.dir}: unexpected tensor {name!r}")
    ggml = tmap.ggml_shapes()
    items = [_Item(tmap.gguf_name(n), n, ggml[n]) for n in _sorted_names(hp, expected, tmap)]
    for k, (name, data) in enumerate(hp.computed_tensors()):
        items.insert(1 + k, _Item(name, None, (data.shape[0],), data=data))
    return items


@dataclass
class _Source:
    """A checkpoint as the converter reads it: hyperparameters, tensor names, the tokenizer's
    metadata, and its tensors with a LoRA adapter merged."""
    ckpt: Checkpoint
    hp: HParams
    tmap: TensorMap
    tok_kv: list
    adapter: LoraAdapter | None
    notes: list[str]               # the parts of the checkpoint a text GGUF leaves out

    @property
    def tok_meta(self) -> dict:
        return {k: v for k, v, _ in self.tok_kv}

    def load_hf(self, hf: str) -> np.ndarray:
        x = self.ckpt.load(hf)
        if self.adapter is not None and (hf in self.adapter.pairs or hf in self.adapter.replacements):
            x = self.adapter.apply(hf, x)
        return x


def _open_source(checkpoint_dir: str, lora_dir: str | None, keep_mtp: bool = True) -> _Source:
    ckpt = Checkpoint(checkpoint_dir)
    family = {"gemma4": Gemma4HParams, "lfm2": Lfm2HParams}.get(   # their own sizes per layer
        arch_for_hf(ckpt.config)[0].name, HParams)
    hp = family.from_config(ckpt.config, keep_mtp=keep_mtp)
    tmap = TensorMap(hp)
    notes = _left_out_notes(ckpt, hp)
    ckpt.rename(tmap.canonical_name)
    adapter = None
    if lora_dir is not None:
        adapter = LoraAdapter(lora_dir)
        adapter.check_against({n: ckpt.shape(n) for n in ckpt.names()}, ckpt.dir)
        for t in adapter.targets():
            if tmap.gguf_name(t) is None:
                raise ConversionError(f"LoRA adapter {lora_dir} adapts {t!r}, which the "
                                      f"converted model does not use (tied head?)")
    return _Source(ckpt, hp, tmap, tokenizer_metadata(ckpt, hp.n_vocab), adapter, notes)


def _calibration_tokens(tok_meta: Mapping, calibration: str | None) -> tuple[list[int], list[int]]:
    """(prefix, body): the tokenizer's BOS when it adds one (never an EOS), and the calibration
    text (default: the one shipped with the package) as tokens, special-token text kept as text.
    `tok_meta`: the tokenizer's GGUF metadata (a file's, or _Source.tok_meta)."""
    from ..text.tokenizer import Tokenizer
    from .sensitivity import default_calibration_text

    if calibration is None:
        text = default_calibration_text()
    else:
        try:
            with open(calibration, encoding="utf-8") as fh:
                text = fh.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ConversionError(f"cannot read --calibration {calibration}: {e}") from None
    tok = Tokenizer.from_metadata(tok_meta)
    prefix = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
    return prefix, tok.encode(text, add_special=False, parse_special=False)


def _calibration_windows(tok_meta: Mapping, calibration: str | None, max_tokens: int, window: int) -> list[list[int]]:
    """--type auto's windows: the first max_tokens tokens of the text in windows of at most
    `window` tokens, each after the BOS."""
    prefix, body = _calibration_tokens(tok_meta, calibration)
    body = body[:max(2, int(max_tokens))]
    step = window - len(prefix)
    return [prefix + body[i:i + step] for i in range(0, len(body), step)]


def _imatrix_chunks(tok_meta: Mapping, calibration: str | None, chunk_size: int, n_chunks: int | None) -> list[list[int]]:
    """llama-imatrix's chunks: the whole text tokenized after one BOS, cut into full chunks of
    chunk_size tokens (a shorter tail left out), each chunk's first token made the BOS."""
    if chunk_size < 16:      # llama-imatrix skips matmuls of fewer than 16 rows
        raise ConversionError(f"--chunk-size {chunk_size}: at least 16 tokens")
    prefix, body = _calibration_tokens(tok_meta, calibration)
    tokens = prefix + body
    n = len(tokens) // chunk_size if n_chunks is None else min(n_chunks, len(tokens) // chunk_size)
    if n < 1:
        raise ConversionError(f"the calibration text is {len(tokens)} tokens, less than one chunk of "
                              f"{chunk_size} (--chunk-size)")
    return [prefix + tokens[i * chunk_size + len(prefix):(i + 1) * chunk_size] for i in range(n)]


def compute_imatrix(model: str, out_path: str, calibration: str | None = None,
                    chunk_size: int = 512, n_chunks: int | None = None, lora_dir: str | None = None,
                    progress: bool = False) -> Imatrix:
    """Collects an importance matrix for `model` -- a Hugging Face checkpoint directory
    (LoRA-merged if given), or a GGUF model file as llama-imatrix takes one (an F16 file, or a
    quantized one whose rounded weights then run as they are) -- on the calibration text, cut
    into chunks as llama-imatrix cuts it (at most n_chunks of them), and writes it to out_path
    in llama.cpp's GGUF imatrix format (what `convert --imatrix`, `quantize --imatrix` and
    llama-quantize read)."""
    from ..arch.reference import reference_for
    from .sensitivity import _ConvertedWeights

    if n_chunks is not None and n_chunks < 1:
        raise ConversionError(f"--chunks {n_chunks}: at least 1")
    dataset = calibration if calibration is not None else "edgeinfer/convert/calibration.txt"
    if not os.path.exists(model):
        raise ConversionError(f"{model}: no such checkpoint directory or GGUF file")
    if not os.path.isdir(model):
        if lora_dir is not None:
            raise ConversionError("--lora merges into a checkpoint directory; for a GGUF model, "
                                  "collect on the merged model's file")
        with GGUFFile(model) as f:
            f.require_model()
            get_arch(f.get("general.architecture", kind=str), model)
            chunks = _imatrix_chunks(f.metadata, calibration, chunk_size, n_chunks)
            ref = reference_for(f.metadata, _GGUFWeights(f), np.float32)
            im = _collect(ref, chunks, dataset, chunk_size, progress)
    else:
        src = _open_source(model, lora_dir)
        hp = src.hp
        chunks = _imatrix_chunks(src.tok_meta, calibration, chunk_size, n_chunks)
        meta = {"general.architecture": hp.arch.name, **{k: v for k, v, _ in hp.metadata()}}
        ref = reference_for(meta, _ConvertedWeights(hp, src.tmap, src.load_hf), np.float32)
        im = _collect(ref, chunks, dataset, chunk_size, progress)
    im.save(out_path)
    return im


def _collect(ref, chunks: list[list[int]], dataset: str, chunk_size: int,
             progress: bool) -> Imatrix:
    from .imatrix import collect

    with status("imatrix", quiet=not progress, leave=True) as note:
        im = collect(ref, chunks, dataset, progress=note)
        note(f"{len(chunks)} chunk{'s' if len(chunks) != 1 else ''} of {chunk_size} tokens")
    return im


class _GGUFWeights(Mapping):
    """GGUF name -> float32 tensor of an open GGUF file (rows as stored), dequantized on each
    access so that the forward streams the file layer by layer."""

    def __init__(self, f: GGUFFile):
        self._f = f

    def __getitem__(self, name: str) -> np.ndarray:
        from .._native import dequantize

        t = self._f.tensors[name]
        x = dequantize(t.data, t.type, t.n_rows, t.shape[0])
        return x if t.n_dims > 1 else x.reshape(-1)

    def __contains__(self, name: object) -> bool:
        return name in self._f.tensors

    def __iter__(self):
        return iter(self._f.tensors)

    def __len__(self) -> int:
        return len(self._f.tensors)


def convert_checkpoint(checkpoint_dir: str, out_path: str, file_type: str = "q4_k_m",
                       lora_dir: str | None = None, keep: list[str] | None = None,
                       n_threads: int = 0, progress: bool | Callable = False,
                       name: str | None = None, target_bpw: float | None = None,
                       calibration: str | None = None, calibration_tokens: int = 512,
                       sensitivity: "Sensitivity | None" = None, keep_mtp: bool = True,
                       imatrix: str | None = None) -> ConvertResult:
    """Converts a Hugging Face checkpoint directory to one GGUF file (atomically).

    file_type "auto" chooses every 2-D weight's type by its measured sensitivity on
    `calibration` (a text file; default: the text shipped with the package, at most
    `calibration_tokens` tokens) so that the tensor data stays within `target_bpw` bits per
    weight; a `sensitivity` from an earlier call (ConvertResult.sensitivity) skips the
    measurement. keep_mtp=False leaves out a checkpoint's multi-token-prediction block.
    `imatrix`: an importance matrix file (llama.cpp's GGUF or legacy .dat, or compute_imatrix's)
    whose per-column weights guide the quantizer, as llama-quantize --imatrix uses it."""
    t0 = time.perf_counter()
    ft = parse_file_type(file_type)
    keeps = parse_keep(keep)
    src = _open_source(checkpoint_dir, lora_dir, keep_mtp)
    ckpt, hp, tmap, adapter, tok_kv, load_hf = (src.ckpt, src.hp, src.tmap, src.adapter, src.tok_kv,
                                                src.load_hf)
    notes = list(src.notes)
    pooling = sentence_pooling(ckpt.dir)
    head_hf = next((t.hf for t in hp.arch.tensors if t.role == "output"), None)
    if pooling is not None and not hp.tied_output and head_hf is not None and head_hf not in ckpt:
        hp.tied_output = True          # an embedding model saved without its LM head: none written, as llama.cpp does
        notes.append("no LM head in the checkpoint (an embedding model): the file embeds; text it would "
                     "generate goes through the embedding table")
    items = plan(ckpt, hp, tmap)
    head = rerank_head(ckpt, hp, tok_kv)
    if head is not None:
        items.append(_Item(head.gguf, head.source, (hp.n_embd, len(head.rows)), rows=head.rows))
        tok_kv = tok_kv + head.metadata(hp)
        notes.append("a Qwen3-Reranker: its \"yes\" / \"no\" head rows written as the reranking head "
                     "(Engine.rerank, POST /v1/rerank)")
    elif pooling is not None:
        tok_kv = tok_kv + [(f"{hp.arch.name}.pooling_type", pooling, "UINT32")]

    importance = None
    if imatrix is not None:
        if ft is AUTO:
            raise ConversionError("--imatrix goes with a fixed --type; --type auto measures "
                                  "its own sensitivity")
        importance = Imatrix.load(imatrix)
        tok_kv = tok_kv + importance.metadata(imatrix)
    has_output = any(it.gguf == "output.weight" for it in items)
    recipe = Recipe(ft, hp.n_layer, has_output, keeps, imatrix=importance is not None,
                    type_70b=is_70b_class(hp.arch.name, hp.n_layer, hp.n_head, hp.n_head_kv),
                    names=[it.gguf for it in items])
    predicted = None
    if ft is AUTO:
        if target_bpw is None:
            raise ConversionError("--type auto needs --target-bpw (bits per weight, e.g. 5.0)")
        if sensitivity is None:
            sensitivity = _measure(hp, tmap, src.tok_meta, load_hf, calibration, calibration_tokens,
                                   n_threads, progress)
        predicted = _auto_types(items, recipe, sensitivity, float(target_bpw))
        ft = dataclasses.replace(AUTO, llama_ftype=_dominant_ftype(items))
    else:
        if target_bpw is not None or calibration is not None:
            raise ConversionError("--target-bpw and --calibration go with --type auto")
        for it in items:
            it.type = GGMLType.F32 if it.rows else recipe.choose(it.gguf, it.shape)
    unused = recipe.unused_keeps()
    if unused:
        raise ConversionError(f"--keep pattern(s) {', '.join(unused)} match no tensor "
                              f"(names look like 'blk.0.attn_v.weight', 'output.weight')")

    out_path = os.fspath(out_path)
    model_name = name or ckpt.config.get("_name_or_path") or os.path.basename(
        os.path.abspath(checkpoint_dir))
    quantized = any(it.type not in FLOAT_TYPES for it in items)
    merged = 0
    use = ImportanceUse(importance)
    with GGUFWriter(out_path) as w:
        w.add_kv(Keys.General.ARCHITECTURE, hp.arch.name)
        w.add_kv(Keys.General.TYPE, "model")
        w.add_kv(Keys.General.NAME, str(model_name)[:200])
        if lora_dir is not None:
            w.add_kv(Keys.General.FINETUNE, "lora-merged")
        w.add_kv(Keys.General.FILE_TYPE, ft.llama_ftype, GGUFValueType.UINT32)
        if quantized:
            w.add_kv(Keys.General.QUANTIZATION_VERSION, 2, GGUFValueType.UINT32)
        for key, val, vt in hp.metadata() + tok_kv:
            if vt == "STRING" and isinstance(val, list):
                w.add_kv(key, val, GGUFValueType.ARRAY, GGUFValueType.STRING)
            elif isinstance(val, list):
                w.add_kv(key, np.asarray(val, dtype={"FLOAT32": np.float32, "INT32": np.int32, "UINT32": np.uint32,
                                                     "BOOL": np.bool_}[vt]))
            else:
                w.add_kv(key, val, GGUFValueType[vt])
        for it in items:
            w.add_tensor_info(it.gguf, it.shape, it.type)
        w.write_header()
        with bar(w.total_tensor_bytes, "convert", quiet=progress is not True) as pbar:
            for k, it in enumerate(items):
                if it.hf is None:
                    x = it.data
                else:
                    x = load_hf(it.hf)
                    if adapter is not None and (it.hf in adapter.pairs
                                                or it.hf in adapter.replacements):
                        merged += 1
                    f = tmap.transform(it.hf)
                    if it.rows:
                        x = x[list(it.rows)]
                    elif f is not None:
                        x = f(x)
                    if not np.isfinite(x).all():
                        raise ConversionError(f"tensor {it.hf!r} holds NaN or infinite values")
                qw = use.weights(it.gguf, it.shape[0], it.type)
                q = quantize(x.reshape(-1, it.shape[0]), it.type, n_threads, importance=qw)
                del x
                w.write_tensor_data(it.gguf, q)
                tensor_written(pbar, progress, k, len(items), it.gguf, it.type, q.nbytes)
                del q
        nbytes = w.total_tensor_bytes
    counts: dict[str, int] = {}
    for it in items:
        counts[it.type.name] = counts.get(it.type.name, 0) + 1
    n_el = sum(int(np.prod(it.shape)) for it in items)
    notes += use.notes()
    return ConvertResult(out_path, ft.name, len(items), os.path.getsize(out_path),
                         time.perf_counter() - t0, counts,
                         {it.gguf: it.type.name for it in items}, merged,
                         bpw=8.0 * nbytes / n_el, predicted_kl=predicted,
                         sensitivity=sensitivity, notes=notes)


def tensor_written(pbar, progress: bool | Callable, k: int, n: int, name: str, type_id: GGMLType,
                   nbytes: int) -> None:
    """Reports the k-th of n tensors written: the bar, and `progress` when it is a callable."""
    pbar.set_postfix_str(f"{k + 1}/{n} {name} {type_id.name}", refresh=False)
    pbar.update(nbytes)
    if callable(progress):
        progress(k + 1, n, name, nbytes)


def _left_out_notes(ckpt: Checkpoint, hp: HParams) -> list[str]:
    """One line per multimodal part (vision / audio tower) the text-only GGUF leaves out."""
    parts: dict[str, int] = {}
    for n in ckpt.names():
        part = multimodal_part(n)
        if part is not None:
            parts[part] = parts.get(part, 0) + 1
    return [f"left out the {part} tower of {hp.hf_class} ({k} tensors): edgeinfer converts the "
            f"text model" for part, k in sorted(parts.items())]


def _item_bytes(it: _Item) -> int:
    return row_nbytes(it.type, it.shape[0]) * (int(np.prod(it.shape)) // it.shape[0])


def _measure(hp: HParams, tmap: TensorMap, tok_meta: Mapping, load_hf, calibration: str | None,
             max_tokens: int, n_threads: int, progress) -> "Sensitivity":
    from .sensitivity import analyze

    windows = _calibration_windows(tok_meta, calibration, max_tokens, _CALIB_CTX)
    with status("sensitivity", quiet=progress is not True, leave=True) as note:
        sens = analyze(hp, tmap, load_hf, windows, n_threads=n_threads, progress=note)
        note(f"{sens.n_tokens} tokens in {sens.seconds:.1f} s")
    return sens


def _auto_types(items: list[_Item], recipe: Recipe, sens: "Sensitivity",
                target_bpw: float) -> float:
    """Sets every item's type for `--type auto`; returns the predicted mean KL."""
    from .sensitivity import allocate

    if not (0 < target_bpw <= 64):
        raise ConversionError(f"--target-bpw {target_bpw} is out of range")
    free, fixed = [], 0
    for it in items:
        t = recipe.override(it.gguf, it.shape) if len(it.shape) >= 2 and not it.rows else GGMLType.F32
        if t is None and it.gguf not in sens.tensors:
            raise ConversionError(f"no sensitivity measured for {it.gguf!r}")
        if t is None:
            free.append(it)
        else:
            it.type = t
            fixed += _item_bytes(it)
    n_el = sum(int(np.prod(it.shape)) for it in items)
    budget = int(target_bpw * n_el / 8) - fixed
    sub = dataclasses.replace(sens, tensors={it.gguf: sens.tensors[it.gguf] for it in free})
    try:
        types = allocate(sub, budget)
    except ConversionError:
        least = fixed + sum(min(b for b, _ in sens.tensors[it.gguf].cost.values())
                            for it in free)
        raise ConversionError(f"--target-bpw {target_bpw:g} is below the smallest file "
                              f"--type auto can make ({8 * least / n_el:.3f} bits per "
                              f"weight)") from None
    for it in free:
        it.type = GGMLType(types[it.gguf])
    return sub.predicted_kl(types)


def _dominant_ftype(items: list[_Item]) -> int:
    from .sensitivity import LLAMA_FTYPE

    by: dict[GGMLType, int] = {}
    for it in items:
        if len(it.shape) >= 2:
            by[it.type] = by.get(it.type, 0) + _item_bytes(it)
    return LLAMA_FTYPE.get(max(by, key=by.__getitem__), 0) if by else 0
