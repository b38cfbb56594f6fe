"""Forward-pass kernels against float64 numpy and SIMD against scalar: attention (chunked, f16 or Q8_0 K/V) and SwiGLU."""
from __future__ import annotations

import numpy as np
import pytest

from edgeinfer._native import ffi, lib

ISAS = [i for i in (lib.EI_ISA_SCALAR, lib.EI_ISA_AVX2, lib.EI_ISA_AVX512) if lib.ei_isa_supported(i)]


def attend(isa, q, k, v, cell_pos, pos, kv_type=lib.EI_TYPE_F16):
    g, hd = q.shape
    out = np.zeros((g, hd), np.float32)
    st = lib.ei_kernel_attention(isa, ffi.from_buffer("float[]", q), g, ffi.from_buffer(k), ffi.from_buffer(v),
                                 kv_type, ffi.from_buffer("int32_t[]", cell_pos), len(cell_pos), pos, hd,
                                 ffi.from_buffer("float[]", out))
    assert st == 0
    return out


def reference(q, k, v, cell_pos, pos):
    kf, vf = k.view(np.float16).astype(np.float64), v.view(np.float16).astype(np.float64)
    vis = (cell_pos >= 0) & (cell_pos <= pos)
    s = q.astype(np.float64) @ kf[vis].T / np.sqrt(q.shape[1])
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ vf[vis]


@pytest.mark.parametrize("n_cells,hd,g", [(1, 64, 1), (7, 64, 3), (255, 64, 3), (256, 64, 3), (257, 64, 3),
                                          (700, 64, 3), (600, 128, 4), (300, 32, 2), (90, 48, 1), (130, 20, 2),
                                          # head tiles of the AVX-512 kernel: 4 + 1, 4 + 4, 2 + 1, one head of 256, hd 16
                                          (333, 64, 5), (64, 64, 8), (290, 128, 3), (40, 256, 2), (17, 16, 3)])
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


def q8_0_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows quantized to GGUF Q8_0 blocks with the gguf package, and their exact dequantized values."""
    from gguf import GGMLQuantizationType as T, quants

    raw = quants.quantize(x.astype(np.float32), T.Q8_0)
    return np.ascontiguousarray(raw), quants.dequantize(raw, T.Q8_0).astype(np.float64)


@pytest.mark.parametrize("n_cells,hd,g", [(9, 64, 3), (300, 64, 3), (520, 128, 2), (70, 32, 1), (300, 64, 5), (260, 128, 3)])
def test_attention_over_q8_0_kv(n_cells, hd, g):
    """A Q8_0 KV arena: the kernel computes the exact softmax over the dequantized rows."""
    pytest.importorskip("gguf")
    rng = np.random.default_rng(n_cells + hd)
    q = (rng.standard_normal((g, hd)) * 2).astype(np.float32)
    k_raw, k = q8_0_rows(rng.standard_normal((n_cells, hd)))
    v_raw, v = q8_0_rows(rng.standard_normal((n_cells, hd)))
    cell_pos = np.arange(n_cells, dtype=np.int32)
    pos = n_cells - 1 - n_cells // 4
    vis = cell_pos <= pos
    s = q.astype(np.float64) @ k[vis].T / np.sqrt(hd)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    ref = (p / p.sum(axis=1, keepdims=True)) @ v[vis]
    for isa in ISAS:
        out = attend(isa, q, k_raw, v_raw, cell_pos, pos, kv_type=lib.EI_TYPE_Q8_0)
        assert np.abs(out - ref).max() < 1e-5, isa


def test_attention_rejects_bad_arguments():
    assert lib.ei_kernel_attention(lib.EI_ISA_SCALAR, ffi.NULL, 1, ffi.NULL, ffi.NULL, lib.EI_TYPE_F16, ffi.NULL,
                                   1, 0, 64, ffi.NULL) == lib.EI_ERR_INVALID_ARG
    q = np.zeros(48, np.float32)
    kv = np.zeros(48, np.uint16)
    cp = np.zeros(1, np.int32)
    assert lib.ei_kernel_attention(lib.EI_ISA_SCALAR, ffi.from_buffer("float[]", q), 1, ffi.from_buffer(kv),
                                   ffi.from_buffer(kv), lib.EI_TYPE_Q8_0, ffi.from_buffer("int32_t[]", cp), 1, 0,
                                   48, ffi.from_buffer("float[]", q)) == lib.EI_ERR_UNSUPPORTED


@pytest.mark.parametrize("n", [1, 7, 8, 1536, 1539])
def test_swiglu_simd_matches_scalar_and_exact(n):
    rng = np.random.default_rng(n)
    gate = (rng.standard_normal(n) * 6).astype(np.float32)
    gate[:3] = [-100.0, 0.0, 100.0][: min(3, n)]      # saturated ends and zero
    up = rng.standard_normal(n).astype(np.float32)
    g64 = gate.astype(np.float64)
    exact = g64 / (1 + np.exp(-g64)) * up
    outs = {}
    for isa in ISAS:
        g = gate.copy()
        assert lib.ei_kernel_swiglu(isa, ffi.from_buffer("float[]", g), ffi.from_buffer("float[]", up), n) == 0
        assert np.isfinite(g).all()
        outs[isa] = g
    np.testing.assert_allclose(outs[lib.EI_ISA_SCALAR], exact, rtol=1e-5, atol=1e-6)
    for isa, g in outs.items():
        nmse = np.sum((g - outs[lib.EI_ISA_SCALAR]) ** 2) / max(np.sum(exact ** 2), 1e-30)
        assert nmse <= 1e-12, (isa, nmse)


def test_swiglu_rejects_bad_arguments():
    assert lib.ei_kernel_swiglu(lib.EI_ISA_SCALAR, ffi.NULL, ffi.NULL, 4) == lib.EI_ERR_INVALID_ARG
