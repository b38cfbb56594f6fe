"""Qwen3.5's Gated DeltaNet kernels (native/src/deltanet.c), every ISA this CPU has, against
the numpy reference (edgeinfer/arch/deltanet.py, in float64) and the scalar kernels: the gated
delta rule token by token and by chunks (several chunk sizes, a run longer than one chunk, a
carried-in state, tiled value heads), L2-normalised rows, gated RMSNorm."""
from __future__ import annotations

import numpy as np
import pytest

from edgeinfer._native_ext import ffi, lib
from edgeinfer.arch import deltanet as ref

ISAS = ["scalar", "avx2", "avx512", "neon"]


def _level(isa):
    level = getattr(lib, "EI_ISA_" + isa.upper())
    if not lib.ei_isa_supported(level):
        pytest.skip(f"{isa} not on this CPU")
    return level


def _f(a):
    return ffi.from_buffer("float[]", a)


def _inputs(n, nh, nk, dk, dv, seed=0):
    rng = np.random.default_rng(seed)
    q = ref.l2norm(rng.standard_normal((n, nk, dk))) / np.sqrt(dk)
    k = ref.l2norm(rng.standard_normal((n, nk, dk)))
    v = rng.standard_normal((n, nh, dv))
    g = -ref.softplus(rng.standard_normal((n, nh))) * 0.5
    beta = 1.0 / (1.0 + np.exp(-rng.standard_normal((n, nh))))
    s0 = rng.standard_normal((nh, dk, dv)) * 0.3
    return q, k, v, g, beta, s0


def _native(level, chunk, q, k, v, g, beta, s0):
    n, nh, dv = v.shape
    nk, dk = q.shape[1], q.shape[2]
    f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)  # noqa: E731
    q, k, v, g, beta = map(f32, (q, k, v, g, beta))
    state, o = f32(s0).copy(), np.zeros((n, nh, dv), np.float32)
    assert lib.ei_kernel_delta_rule(level, chunk, _f(q), _f(k), _f(v), _f(g), _f(beta), n, nh, nk, dk, dv,
                                    _f(state), _f(o)) == lib.EI_OK
    return o, state


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("chunk", [0, 1, 7, 64])
@pytest.mark.parametrize("shape", [(4, 2, 16, 16), (2, 2, 24, 40)])   # (value heads, key heads, dk, dv)
def test_delta_rule_matches_numpy(isa, chunk, shape):
    level = _level(isa)
    nh, nk, dk, dv = shape
    q, k, v, g, beta, s0 = _inputs(23, nh, nk, dk, dv)
    rep = nh // nk
    want_o, want_s = ref.gated_delta_rule(np.tile(q, (1, rep, 1)), np.tile(k, (1, rep, 1)), v, g, beta, s0)
    o, s = _native(level, chunk, q, k, v, g, beta, s0)
    np.testing.assert_allclose(o, want_o, rtol=0, atol=2e-5)
    np.testing.assert_allclose(s, want_s, rtol=0, atol=2e-5)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dims", [(128, 128), (40, 36)])
def test_delta_rule_chunked_at_qwen35_head(isa, dims):
    """Qwen3.5's head (dk = dv = 128) over two whole chunks of 64 and a partial one: the chunked
    form's matrix products run every register tile, the remainders of rows and columns, and the
    forward substitution's blocks after the first (and an odd shape for the column tails)."""
    level = _level(isa)
    dk, dv = dims
    q, k, v, g, beta, s0 = _inputs(150, 2, 1, dk, dv, seed=4)
    want_o, want_s = ref.gated_delta_rule(np.tile(q, (1, 2, 1)), np.tile(k, (1, 2, 1)), v, g, beta, s0)
    for chunk in (0, 64):
        o, s = _native(level, chunk, q, k, v, g, beta, s0)   # errors seen: ~3e-8 (o), ~2e-7 (state)
        np.testing.assert_allclose(o, want_o, rtol=0, atol=2e-6)
        np.testing.assert_allclose(s, want_s, rtol=0, atol=2e-6)


@pytest.mark.parametrize("isa", ISAS[1:])
@pytest.mark.parametrize("chunk", [0, 16])
def test_delta_rule_matches_scalar(isa, chunk):
    level = _level(isa)
    args = _inputs(40, 4, 2, 32, 32, seed=1)
    o0, s0 = _native(lib.EI_ISA_SCALAR, chunk, *args)
    o1, s1 = _native(level, chunk, *args)
    np.testing.assert_allclose(o1, o0, rtol=0, atol=1e-5)
    np.testing.assert_allclose(s1, s0, rtol=0, atol=1e-5)


@pytest.mark.parametrize("isa", ISAS)
def test_l2norm_matches_numpy(isa):
    level = _level(isa)
    x = np.random.default_rng(2).standard_normal((5, 37)).astype(np.float32)
    want = ref.l2norm(x.astype(np.float64)) * 0.25
    assert lib.ei_kernel_l2norm(level, _f(x), 5, 37, ref.L2_EPS, 0.25) == lib.EI_OK
    np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("isa", ISAS)
def test_gated_rms_norm_matches_numpy(isa):
    level = _level(isa)
    rng = np.random.default_rng(3)
    x, z = rng.standard_normal((2, 6, 37)).astype(np.float32) * 3
    w = rng.standard_normal(37).astype(np.float32)
    want = ref.gated_rms_norm(x.astype(np.float64), w, z.astype(np.float64), 1e-6)
    assert lib.ei_kernel_gated_rms_norm(level, _f(x), _f(w), _f(z), 6, 37, 1e-6) == lib.EI_OK
    np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-5)
