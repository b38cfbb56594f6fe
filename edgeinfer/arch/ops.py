"""The numpy ops the reference forwards share (edgeinfer/arch/reference.py and the families
with a module of their own, such as gemma4.py)."""
from __future__ import annotations

import math

import numpy as np

__all__ = ["ACTIVATIONS", "apply_rope", "rms_norm", "rotate"]


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """RMSNorm over the last axis times w: (output, normalized x, 1 / rms)."""
    r = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    n = x * r
    return n * w, n, r


def rotate(x: np.ndarray, neox: bool) -> np.ndarray:
    """The 90-degree turn of each RoPE pair: (a, b) -> (-b, a); pairs (i, i + d/2) (neox) or
    (2i, 2i+1). RoPE is x cos + rotate(x) sin; its transpose is -rotate."""
    if neox:
        h = x.shape[-1] // 2
        return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    out = np.empty_like(x)
    out[..., 0::2] = -x[..., 1::2]
    out[..., 1::2] = x[..., 0::2]
    return out


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool) -> np.ndarray:
    """RoPE on the first rope_dim (= cos.shape[-1]) dimensions of each head; the rest pass."""
    d = cos.shape[-1]
    r = x[..., :d]
    y = r * cos + rotate(r, neox) * sin
    return y if d == x.shape[-1] else np.concatenate([y, x[..., d:]], axis=-1)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


#: The table's activations (Arch.act) of the gated FFN: down(act(gate(x)) * up(x)).
ACTIVATIONS = {"silu": _silu, "gelu_tanh": _gelu_tanh}
