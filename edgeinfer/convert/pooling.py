"""A sentence-transformers checkpoint's pooling (an embedding model: Qwen3-Embedding's last token),
written as `{arch}.pooling_type` so that the file embeds as its card says, as llama.cpp's converter
reads it: the Pooling module of modules.json, its config's pooling_mode_* flags (mean, then cls,
then last token) or its `pooling_mode`. Such a checkpoint may hold the bare model (tensors without
the `model.` prefix, no LM head); the converter takes both."""
from __future__ import annotations

import os

from ..arch.table import POOLING_TYPES
from ..errors import ConversionError
from .checkpoint import read_json

MEAN, CLS, LAST = POOLING_TYPES["mean"], POOLING_TYPES["cls"], POOLING_TYPES["last"]
_MODES = {"mean": MEAN, "cls": CLS, "lasttoken": LAST}


def _json(path: str):
    return read_json(path, os.path.basename(path)) if os.path.isfile(path) else None


def sentence_pooling(folder: str) -> int | None:
    """The pooling type a checkpoint folder's sentence-transformers modules ask for; None without
    them. ConversionError for a pooling llama.cpp has no type for (max, weighted mean, ...)."""
    modules = _json(os.path.join(folder, "modules.json"))
    if not isinstance(modules, list):
        return None
    kinds = [str(m.get("type", "")) for m in modules if isinstance(m, dict)]
    if any(k.endswith("Dense") for k in kinds):
        raise ConversionError(f"{folder}: the sentence-transformers modules project the pooled vector "
                              f"(a Dense module), which edgeinfer does not convert")
    path = next((m.get("path", "") for m in modules
                 if isinstance(m, dict) and str(m.get("type", "")).endswith("Pooling")), None)
    if path is None:
        return None
    cfg = _json(os.path.join(folder, path, "config.json"))
    if not isinstance(cfg, dict):
        raise ConversionError(f"{folder}: modules.json names a Pooling module at {path!r} without its config.json")
    if cfg.get("pooling_mode_mean_tokens"):
        return MEAN
    if cfg.get("pooling_mode_cls_token"):
        return CLS
    if cfg.get("pooling_mode_lasttoken"):
        return LAST
    if cfg.get("pooling_mode") in _MODES:
        return _MODES[cfg["pooling_mode"]]
    raise ConversionError(f"{folder}: the sentence-transformers pooling {cfg} has no GGUF pooling type "
                          f"(mean, cls and last token have)")


def bare_model_name(hf: str) -> str:
    """A bare model's tensor name (`layers.0...`, `embed_tokens`, `norm`: a checkpoint saved from
    the model without its LM head) as the causal LM's (`model.layers.0...`)."""
    return "model." + hf if hf.startswith(("layers.", "embed_tokens.", "norm.")) else hf
