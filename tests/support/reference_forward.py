"""The exact math: edgeinfer's reference forward (edgeinfer/arch/reference.py) in float64 on a
GGUF file read by the ``gguf`` package.

Weights are dequantized with ``gguf.quants.dequantize`` and every operation after that runs
in float64, with no activation quantization and no reduced-precision KV cache. Anything else
(llama.cpp, edgeinfer's runtimes) is judged by its distance from these logits; the reference
itself is checked against transformers and llama.cpp (tests/test_reference_forward.py).

    ref = ReferenceModel(path)
    lg = ref.logits(ids)                  # np.float64 [len(ids), n_vocab]
    lg = ref.logits(ids, ring=(64, 4))    # as through a KV ring of 64 cells, 4 of them sinks

``n_ctx`` is the runtime context the model stands for (LongRoPE's factors follow it, as
llama.cpp's do). ``reference_logits(path, ids)`` caches models and results per process so
several tests can share one forward pass.
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from edgeinfer.arch.reference import ForwardParams, Reference


class ReferenceModel:
    """Float64 forward pass of a GGUF model (teacher-forced)."""

    def __init__(self, path: str | Path, n_ctx: int = 4096):
        import gguf
        from gguf.quants import dequantize

        self.path, self.n_ctx = str(path), n_ctx
        reader = gguf.GGUFReader(self.path)
        meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.")}
        weights = {t.name: np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64)
                   .reshape(tuple(int(d) for d in reversed(t.shape.tolist())))   # rows = outputs
                   for t in reader.tensors}
        self.params = ForwardParams.from_metadata(meta)
        self.ref = Reference(self.params, weights, np.float64)
        self.arch = self.params.arch.name
        self.n_vocab = weights["token_embd.weight"].shape[0]
        self.tied_output = "output.weight" not in weights

    def logits(self, ids, ring: tuple[int, int] | None = None) -> np.ndarray:
        """Teacher-forced logits, float64 [len(ids), n_vocab] (ring: see the module docstring)."""
        return self.ref.logits(ids, n_ctx=self.n_ctx, ring=ring)


_MODELS: dict[str, ReferenceModel] = {}
_LOGITS: dict[tuple[str, tuple[int, ...]], np.ndarray] = {}
_LOCK = threading.Lock()


def get_reference_model(path: str | Path) -> ReferenceModel:
    """Load (once per process) the float64 reference model for ``path``."""
    key = str(Path(path).resolve())
    with _LOCK:
        m = _MODELS.get(key)
        if m is None:
            m = ReferenceModel(key)
            _MODELS[key] = m
        return m


def reference_logits(path: str | Path, ids) -> np.ndarray:
    """Exact float64 logits [len(ids), n_vocab], cached per (path, ids). Do not mutate."""
    key = (str(Path(path).resolve()), tuple(int(i) for i in ids))
    hit = _LOGITS.get(key)
    if hit is not None:
        return hit
    lg = get_reference_model(path).logits(key[1])
    lg.setflags(write=False)
    _LOGITS[key] = lg
    return lg
