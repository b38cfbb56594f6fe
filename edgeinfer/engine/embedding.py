"""Embeddings of a decoder model, as llama.cpp's embedding mode makes them: each input's hidden
states after the final norm (one row per token, causal attention) pooled into one vector,
then scaled to unit Euclidean length."""
from __future__ import annotations

import numpy as np

from ..arch.table import POOLING_TYPES
from ..errors import EmbeddingError

POOLINGS = ("mean", "cls", "last")
# llama.cpp's llama_pooling_type, the values of the GGUF key `{arch}.pooling_type`; none (0) and
# rank (4) give no one vector per input, so they fall back to mean as an unset key does
_GGUF_POOLING = {v: k for k, v in POOLING_TYPES.items() if k in POOLINGS}


def file_pooling(metadata: dict, arch: str) -> str:
    """The pooling a GGUF asks for (`{arch}.pooling_type`), mean where it names none."""
    return _GGUF_POOLING.get(metadata.get(f"{arch}.pooling_type"), "mean")


def check_pooling(pooling: object) -> str:
    if pooling not in POOLINGS:
        raise EmbeddingError(f"pooling must be one of {list(POOLINGS)}, got {pooling!r}")
    return pooling  # type: ignore[return-value]


class Pooler:
    """Pools one input's hidden rows, fed in chunks of consecutive positions."""

    def __init__(self, pooling: str, n_embd: int):
        self.pooling = check_pooling(pooling)
        self.total = np.zeros(n_embd, dtype=np.float64)
        self.rows = 0

    def add(self, hidden: np.ndarray) -> None:
        if self.pooling == "mean":
            self.total += hidden.sum(axis=0, dtype=np.float64)
        elif self.pooling == "last" or self.rows == 0:   # cls: the first row only
            self.total[:] = hidden[0 if self.pooling == "cls" else -1]
        self.rows += len(hidden)

    def result(self, normalize: bool) -> np.ndarray:
        v = self.total / self.rows if self.pooling == "mean" else self.total
        if normalize:
            norm = np.linalg.norm(v)
            v = v / norm if norm > 0 else v
        return v.astype(np.float32)
