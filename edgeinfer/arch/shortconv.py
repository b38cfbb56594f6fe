"""LFM2's gated short convolution in numpy: the reference the native layer is judged by.

Weights in GGUF layout (numpy shapes): shortconv_in [3 C, C] whose rows are B, C, x;
shortconv_conv [C, K] (taps oldest first); shortconv_out [C, C]. Per layer on the normed
residual h [n, C]:

    B, C, x = split(h in_proj^T);  y = C * conv(B * x);  out = y out_proj^T
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from .deltanet import causal_conv

__all__ = ["shortconv_layer"]


def shortconv_layer(h: np.ndarray, w: Mapping[str, np.ndarray],
                    window: np.ndarray | None = None, linear=None) -> tuple[np.ndarray, np.ndarray]:
    """The token mixer on h [n, C] after `window` [K-1, C] (the previous B * x; zeros at the
    start); returns (out [n, C], the new window). `linear(x, role)`: the projections' matmul
    (default x @ w[role].T)."""
    mm = linear or (lambda v, role: v @ w[role].T)
    b, c, x = np.split(mm(h, "shortconv_in"), 3, axis=-1)
    y, window = causal_conv(b * x, w["shortconv_conv"], window)
    return mm(c * y, "shortconv_out"), window
