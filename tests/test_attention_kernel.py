"""The attention kernel (chunked, f16 K/V) against a float64 numpy softmax, and SIMD against scalar."""
from __future__ import annotations

import numpy as np
import pytest

from edgeinfer._native import ffi, lib

ISAS = [i for i in (lib.EI_ISA_SCALAR, lib.EI_ISA_AVX2, lib.EI_ISA_AVX512) if lib.ei_isa_supported(i)]


def attend(isa, q, k, v, cell_pos, pos):
    g, hd = q.shape
    out = np.zeros((g, hd), np.float32)
    st = lib.ei_kernel_attention(isa, ffi.from_buffer("float[]", q), g, ffi.from_buffer("uint16_t[]", k),
                                 ffi.from_buffer("uint16_t[]", v), ffi.from_buffer("int32_t[]", cell_pos),
                                 len(cell_pos), pos, hd, ffi.from_buffer("float[]", out))
    assert st == 0
    return out


def reference(q, k, v, cell_pos, pos):
    kf, vf = k.view(np.float16).astype(np.float64), v.view(np.float16).astype(np.float64)
    vis = (cell_pos >= 0) & (cell_pos <= pos)
    s = q.astype(np.float64) @ kf[vis].T / np.sqrt(q.shape[1])
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ vf[vis]


@pytest.mark.parametrize("n_cells,hd,g", [(1, 64, 1), (7, 64, 3), (255, 64, 3), (256, 64, 3), (257, 64, 3),
                                          (700, 64, 3), (600, 128, 4), (300, 32, 2), (90, 48, 1), (130, 20, 2)])
def test_attention_matches_exact_math(n_cells, hd, g):
    rng = np.random.default_rng(n_cells * 131 + hd)
    q = (rng.standard_normal((g, hd)) * 2).astype(np.float32)
    k = (rng.standard_normal((n_cells, hd))).astype(np.float16).view(np.uint16)
    v = (rng.standard_normal((n_cells, hd))).astype(np.float16).view(np.uint16)
    cell_pos = np.arange(n_cells, dtype=np.int32)
    rng.shuffle(cell_pos)                       # a wrapped ring holds positions out of order
    cell_pos[rng.random(n_cells) < 0.1] = -1    # empty cells
    pos = int(np.max(cell_pos)) - n_cells // 5  # cells beyond the query's position are masked
    if not ((cell_pos >= 0) & (cell_pos <= pos)).any():
        pos = int(np.max(cell_pos))
    ref = reference(q, k, v, cell_pos, pos)
    scalar = attend(lib.EI_ISA_SCALAR, q, k, v, cell_pos, pos)
    assert np.abs(scalar - ref).max() < 1e-5
    for isa in ISAS:
        out = attend(isa, q, k, v, cell_pos, pos)
        assert np.isfinite(out).all()
        nmse = np.sum((out - scalar) ** 2) / np.sum(scalar.astype(np.float64) ** 2)
        assert nmse <= 1e-10, (isa, nmse)


def test_attention_rejects_bad_arguments():
    assert lib.ei_kernel_attention(lib.EI_ISA_SCALAR, ffi.NULL, 1, ffi.NULL, ffi.NULL, ffi.NULL, 1, 0, 64,
                                   ffi.NULL) == lib.EI_ERR_INVALID_ARG
