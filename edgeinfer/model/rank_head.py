"""A reranker's classification head, as llama.cpp computes its pooling type "rank" for a decoder:
the last token's hidden state after the final norm times `cls.output.weight` (one row per label:
Qwen3-Reranker's "yes" and "no"), plus `cls.output.bias` where the file has one; on Qwen3 the
softmax over the labels. The score of a pair is the first value."""
from __future__ import annotations

import numpy as np

from .._native import dequantize
from ..arch.table import RANK_HEAD_BIAS, RANK_HEAD_WEIGHT
from ..errors import GGUFError
from ..gguf.reader import GGUFFile
from ..gguf.types import COMPUTE_TYPES, GGMLType, ggml_type_name

WEIGHT, BIAS = RANK_HEAD_WEIGHT, RANK_HEAD_BIAS
MAX_LABELS = 1 << 16
#: the families whose head ends in a softmax over the labels (llama.cpp's rule: Qwen3 and Qwen3-VL)
SOFTMAX_ARCHS = frozenset({"qwen3", "qwen3vl"})


class RankHead:
    def __init__(self, weight: np.ndarray, bias: np.ndarray | None, softmax: bool, labels: list[str]):
        self.weight = weight.astype(np.float64)       # [n_labels, n_embd]
        self.bias = None if bias is None else bias.astype(np.float64)
        self.softmax = softmax
        self.labels = labels

    @classmethod
    def from_gguf(cls, f: GGUFFile, arch: str, n_embd: int) -> "RankHead | None":
        """The file's head, None when it has none; GGUFError for one of the wrong shape or type."""
        w = f.tensors.get(WEIGHT)
        if w is None:
            if BIAS in f.tensors:
                raise GGUFError(f"{f.path}: {BIAS!r} without {WEIGHT!r}")
            return None
        if len(w.shape) != 2 or w.shape[0] != n_embd or not 1 <= w.shape[1] <= MAX_LABELS:
            raise GGUFError(f"{f.path}: tensor {WEIGHT!r} has shape {list(w.shape)}, expected "
                            f"[{n_embd}, labels] (the model's width, one row per label)")
        if w.type not in COMPUTE_TYPES:
            raise GGUFError(f"{f.path}: tensor {WEIGHT!r} has type {ggml_type_name(w.type)}, which edgeinfer "
                            f"cannot compute with")
        n = w.shape[1]
        bias = None
        b = f.tensors.get(BIAS)
        if b is not None:
            if b.shape != (n,) or b.type != GGMLType.F32:
                raise GGUFError(f"{f.path}: tensor {BIAS!r} must be F32 of shape [{n}], got "
                                f"{ggml_type_name(b.type)} {list(b.shape)}")
            bias = dequantize(b.data, b.type, 1, n)[0]
        labels = f.metadata.get(f"{arch}.classifier.output_labels") or []
        return cls(dequantize(w.data, w.type, n, n_embd), bias, arch in SOFTMAX_ARCHS,
                   [str(x) for x in labels])

    def scores(self, hidden: np.ndarray) -> np.ndarray:
        """The head's values [n_labels] for one hidden state [n_embd]."""
        z = self.weight @ hidden.astype(np.float64)
        if self.bias is not None:
            z = z + self.bias
        if self.softmax:
            z = np.exp(z - z.max())
            z = z / z.sum()
        return z
