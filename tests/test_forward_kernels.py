"""Forward-pass kernels against float64 numpy and SIMD against scalar: attention (chunked, f16 or Q8_0 K/V) and SwiGLU."""
from __future__ import annotations

import numpy as np
import pytest
from tests.support.isa import each_level, on_cpu
from tests.support.strict import require

from edgeinfer._native import ffi, lib

ISAS = on_cpu()   # every level this CPU has, scalar first


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
                                          (333, 64, 5), (64, 64, 8), (290, 128, 3), (40, 256, 2), (17, 16, 3),
                                          # two heads of 64; AVX2 with an odd count of 8-float vectors
                                          (150, 64, 2), (99, 24, 3), (40, 8, 1),
                                          # Gemma 4's full layers: heads of 512 (AVX-512 past 16 vectors)
                                          (300, 512, 2), (33, 512, 1), (257, 384, 3)])
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
    for isa in each_level(ISAS):
        out = attend(isa, q, k, v, cell_pos, pos)
        assert np.isfinite(out).all()
        nmse = np.sum((out - scalar) ** 2) / np.sum(scalar.astype(np.float64) ** 2)
        assert nmse <= 1e-10, (isa, nmse)


@pytest.mark.parametrize("hd,g", [(64, 4), (128, 2), (64, 1)])
@pytest.mark.parametrize("pos", [0, 40, 300, 517])
def test_attention_over_a_causal_prefix_matches_exact_math(pos, hd, g):
    """Cells in order, as a prefill writes them: the query sees cells [0, pos], and the hidden
    cells after it (part of a chunk, whole chunks) are dropped before any kernel runs."""
    rng = np.random.default_rng(pos + hd + g)
    n_cells = 600
    q = (rng.standard_normal((g, hd)) * 2).astype(np.float32)
    k = (rng.standard_normal((n_cells, hd))).astype(np.float16).view(np.uint16)
    v = (rng.standard_normal((n_cells, hd))).astype(np.float16).view(np.uint16)
    cell_pos = np.arange(n_cells, dtype=np.int32)
    ref = reference(q, k, v, cell_pos, pos)
    for isa in each_level(ISAS):
        out = attend(isa, q, k, v, cell_pos, pos)
        assert np.abs(out - ref).max() < 1e-5, isa


@pytest.mark.parametrize("n_cells,hd,g,shuffled", [(600, 64, 4, False), (300, 64, 3, False), (520, 128, 3, False),
                                                   (333, 64, 5, True), (257, 128, 2, True), (90, 32, 2, False),
                                                   (300, 512, 2, False), (40, 64, 8, True), (200, 80, 3, True)])
def test_attention_of_two_tokens_at_once_is_the_same_bits(n_cells, hd, g, shuffled):
    """A prefill reads each chunk once for a pair of its tokens: each token's output is the same
    bits as alone, on every level, whether the pair is adjacent or far apart, and where one of the
    two sees no cell of a chunk."""
    rng = np.random.default_rng(n_cells * 7 + hd + g)
    q0, q1 = ((rng.standard_normal((g, hd)) * 2).astype(np.float32) for _ in range(2))
    k = (rng.standard_normal((n_cells, hd))).astype(np.float16).view(np.uint16)
    v = (rng.standard_normal((n_cells, hd))).astype(np.float16).view(np.uint16)
    cell_pos = np.arange(n_cells, dtype=np.int32)
    if shuffled:
        rng.shuffle(cell_pos)
        cell_pos[rng.random(n_cells) < 0.1] = -1
    for pos0, pos1 in ((n_cells // 2, n_cells // 2 + 1), (3, n_cells - 1), (n_cells - 1, 20)):
        outs = [np.zeros((g, hd), np.float32) for _ in range(2)]
        for isa in each_level(ISAS):
            st = lib.ei_kernel_attention_pair(isa, ffi.from_buffer("float[]", q0), ffi.from_buffer("float[]", q1), g,
                                              ffi.from_buffer(k), ffi.from_buffer(v), lib.EI_TYPE_F16,
                                              ffi.from_buffer("int32_t[]", cell_pos), n_cells, pos0, pos1, hd,
                                              ffi.from_buffer("float[]", outs[0]), ffi.from_buffer("float[]", outs[1]))
            assert st == 0
            for q, pos, out in ((q0, pos0, outs[0]), (q1, pos1, outs[1])):
                assert np.array_equal(out, attend(isa, q, k, v, cell_pos, pos)), (isa, pos0, pos1)
                assert np.abs(out - reference(q, k, v, cell_pos, pos)).max() < 1e-5


def q8_0_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows quantized to GGUF Q8_0 blocks with the gguf package, and their exact dequantized values."""
    from gguf import GGMLQuantizationType as T, quants

    raw = quants.quantize(x.astype(np.float32), T.Q8_0)
    return np.ascontiguousarray(raw), quants.dequantize(raw, T.Q8_0).astype(np.float64)


def q8_attention_model(q, k_raw, v_raw, cell_pos, pos, chunk=256, wmax=32767.0):
    """llama.cpp-style attention over a Q8_0 KV cache, in float64 numpy, chunk by chunk as the
    kernel documents it: the query quantized to Q8_0 (float scale), integer dots with K; per
    chunk a softmax partial whose V sum uses weights p * d_v quantized to 15 bits per block;
    partials merged in order."""
    g, hd = q.shape
    nb = hd // 32
    rows = lambda raw: (raw.reshape(len(raw), nb, 34)[:, :, :2].copy().view(np.float16)[:, :, 0].astype(np.float64),
                        raw.reshape(len(raw), nb, 34)[:, :, 2:].view(np.int8).astype(np.int64))
    dk, k8 = rows(k_raw)
    dv, v8 = rows(v_raw)
    x = (q.astype(np.float32) * np.float32(1 / np.sqrt(np.float32(hd)))).reshape(g, nb, 32).astype(np.float64)
    dq = np.abs(x).max(axis=2) / 127
    q8 = np.clip(np.round(x / np.where(dq > 0, dq, 1)[:, :, None]), -127, 127).astype(np.int64)
    vis = (cell_pos >= 0) & (cell_pos <= pos)
    s = np.einsum("jbi,cbi->jcb", q8, k8) * dq[:, None, :] * dk[None, :, :]
    s = np.where(vis[None, :], s.sum(axis=2), -np.inf)
    m, tot, o = np.full(g, -np.inf), np.zeros(g), np.zeros((g, hd))
    for c0 in range(0, len(cell_pos), chunk):
        sc, cv = s[:, c0:c0 + chunk], vis[c0:c0 + chunk]
        if not cv.any():
            continue
        mc = sc.max(axis=1)
        p = np.where(cv[None, :], np.exp(sc - mc[:, None]), 0.0)
        w = p[:, :, None] * dv[None, c0:c0 + chunk, :]                    # [j, c, b]
        top = w.max(axis=1)
        keep = top > 1e-30                                                 # EI_ATTN_WMIN
        w16 = np.round(w * np.where(keep, wmax / np.where(keep, top, 1), 0)[:, None, :])
        oc = (np.einsum("jcb,cbi->jbi", w16, v8[c0:c0 + chunk]) * (top / wmax)[:, :, None]).reshape(g, hd)
        mn = np.maximum(m, mc)
        a, bb = np.where(np.isinf(m), 0.0, np.exp(m - mn)), np.exp(mc - mn)
        o, tot, m = o * a[:, None] + oc * bb[:, None], tot * a + p.sum(axis=1) * bb, mn
    return o / tot[:, None]


@pytest.mark.parametrize("n_cells,hd,g", [(9, 64, 3), (300, 64, 3), (520, 128, 2), (70, 32, 1), (300, 64, 5),
                                          (260, 128, 3), (333, 96, 2), (100, 256, 2), (40, 64, 11), (600, 64, 1),
                                          (70, 32, 3),
                                          # Gemma 4's full layers: heads of 512 (a group wider than 8 too), and 384
                                          (300, 512, 2), (40, 512, 9), (257, 384, 3)])
def test_attention_over_q8_0_kv(n_cells, hd, g):
    """A Q8_0 KV arena: every ISA computes the documented quantized algorithm (numpy model), and
    that algorithm stays close to the exact softmax over the dequantized rows."""
    require("gguf", "gguf.quants is the Q8_0 oracle")
    rng = np.random.default_rng(n_cells + hd + g)
    q = (rng.standard_normal((g, hd)) * 2).astype(np.float32)
    k_raw, k = q8_0_rows(rng.standard_normal((n_cells, hd)))
    v_raw, v = q8_0_rows(rng.standard_normal((n_cells, hd)))
    cell_pos = np.arange(n_cells, dtype=np.int32)
    rng.shuffle(cell_pos)
    cell_pos[rng.random(n_cells) < 0.1] = -1
    pos = int(cell_pos.max()) - n_cells // 4
    vis = (cell_pos >= 0) & (cell_pos <= pos)
    s = q.astype(np.float64) @ k[vis].T / np.sqrt(hd)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    exact = (p / p.sum(axis=1, keepdims=True)) @ v[vis]
    model = q8_attention_model(q, k_raw, v_raw, cell_pos, pos)
    nmse_exact = np.sum((model - exact) ** 2) / np.sum(exact ** 2)
    assert nmse_exact < 1e-3, nmse_exact          # the price of an 8-bit query, as in llama.cpp
    for isa in each_level(ISAS):
        out = attend(isa, q, k_raw, v_raw, cell_pos, pos, kv_type=lib.EI_TYPE_Q8_0)
        assert np.abs(out - model).max() < 1e-4, isa


@pytest.mark.parametrize("hd", [384, 512])
def test_attention_simd_levels_take_wide_heads(hd):
    """Heads of 384 and 512 (Gemma 4's full layers) run each level's own kernel, F16 and Q8_0 KV,
    not the scalar fallback: the tests above would pass either way, but a SIMD kernel sums in
    another order (and Q8_0's in another exp), so its result is never bit-identical to scalar's."""
    require("gguf", "gguf.quants is the Q8_0 oracle")
    rng = np.random.default_rng(hd)
    g, n_cells = 3, 300
    q = (rng.standard_normal((g, hd)) * 2).astype(np.float32)
    f16 = [rng.standard_normal((n_cells, hd)).astype(np.float16).view(np.uint16) for _ in range(2)]
    q8 = [q8_0_rows(rng.standard_normal((n_cells, hd)))[0] for _ in range(2)]
    cell_pos = np.arange(n_cells, dtype=np.int32)
    for kv_type, (k, v) in ((lib.EI_TYPE_F16, f16), (lib.EI_TYPE_Q8_0, q8)):
        scalar = attend(lib.EI_ISA_SCALAR, q, k, v, cell_pos, n_cells - 1, kv_type)
        for isa in each_level(ISAS):
            if isa != lib.EI_ISA_SCALAR:
                out = attend(isa, q, k, v, cell_pos, n_cells - 1, kv_type)
                assert not np.array_equal(out, scalar), (isa, kv_type, "the scalar fallback ran")


def test_attention_q8_0_tiny_weights_stay_finite():
    """The top cell's V block is all zeros and the other cells score ~85 lower: the largest
    weight of the block is ~1e-37. Every ISA drops the block (no WMAX / wmax overflow)."""
    require("gguf", "gguf.quants is the Q8_0 oracle")
    hd = 32
    q = np.full((1, hd), 10.0, np.float32)
    k_raw, _ = q8_0_rows(np.stack([np.full(hd, 1.0), np.full(hd, -1.0), np.full(hd, -0.5)]))
    v_raw, v = q8_0_rows(np.stack([np.zeros(hd), np.linspace(-1, 1, hd), np.linspace(1, -1, hd)]))
    cell_pos = np.arange(3, dtype=np.int32)
    for isa in each_level(ISAS):
        out = attend(isa, q, k_raw, v_raw, cell_pos, 2, kv_type=lib.EI_TYPE_Q8_0)
        assert np.isfinite(out).all() and np.abs(out).max() < 1e-20, (isa, out)


def test_attention_rejects_bad_arguments():
    assert lib.ei_kernel_attention(lib.EI_ISA_SCALAR, ffi.NULL, 1, ffi.NULL, ffi.NULL, lib.EI_TYPE_F16, ffi.NULL,
                                   1, 0, 64, ffi.NULL) == lib.EI_ERR_INVALID_ARG
    q = np.zeros(48, np.float32)
    kv = np.zeros(48, np.uint16)
    cp = np.zeros(1, np.int32)
    assert lib.ei_kernel_attention(lib.EI_ISA_SCALAR, ffi.from_buffer("float[]", q), 1, ffi.from_buffer(kv),
                                   ffi.from_buffer(kv), lib.EI_TYPE_Q8_0, ffi.from_buffer("int32_t[]", cp), 1, 0,
                                   48, ffi.from_buffer("float[]", q)) == lib.EI_ERR_UNSUPPORTED


def _silu(g):
    return g / (1 + np.exp(-g))


def _gelu_tanh(g):
    return 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))


@pytest.mark.parametrize("n", [1, 7, 8, 15, 16, 1536, 1539])
def test_gated_activations_simd_match_scalar_and_exact(n):
    """SwiGLU (silu(gate) * up) and Gemma's GeGLU (gelu_tanh(gate) * up): every ISA against
    the scalar reference and float64, with saturated ends, zero and SIMD tails."""
    rng = np.random.default_rng(n)
    for kernel, act in ((lib.ei_kernel_swiglu, _silu), (lib.ei_kernel_geglu, _gelu_tanh)):
        gate = (rng.standard_normal(n) * 5).astype(np.float32)
        gate[:4] = [-100.0, 0.0, 100.0, -5.0][: min(4, n)]
        up = rng.standard_normal(n).astype(np.float32)
        exact = act(gate.astype(np.float64)) * up
        outs = {}
        for isa in each_level(ISAS):
            g = gate.copy()
            assert kernel(isa, ffi.from_buffer("float[]", g), ffi.from_buffer("float[]", up), n) == 0
            assert np.isfinite(g).all()
            outs[isa] = g
        np.testing.assert_allclose(outs[lib.EI_ISA_SCALAR], exact, rtol=1e-5, atol=1e-6)
        for isa, g in outs.items():
            nmse = np.sum((g - outs[lib.EI_ISA_SCALAR]) ** 2) / max(np.sum(exact ** 2), 1e-30)
            assert nmse <= 1e-12, (kernel, isa, nmse)


def test_gated_activations_reject_bad_arguments():
    for kernel in (lib.ei_kernel_swiglu, lib.ei_kernel_geglu):
        assert kernel(lib.EI_ISA_SCALAR, ffi.NULL, ffi.NULL, 4) == lib.EI_ERR_INVALID_ARG


@pytest.mark.parametrize("n,rank", [(1, 1), (15, 4), (16, 8), (17, 16), (2048, 16), (1539, 7)])
def test_lora_up_simd_matches_scalar_and_exact(n, rank):
    """LoRA's up projection (y += c . B^T over a strided block of B^T): every ISA against the scalar
    reference and float64, SIMD tails included, and only columns [0, n) of a wider B^T read."""
    rng = np.random.default_rng(n * 31 + rank)
    ld = n + 5
    bt = rng.standard_normal((rank, ld)).astype(np.float32)
    c = rng.standard_normal(rank).astype(np.float32)
    y0 = rng.standard_normal(n + 3).astype(np.float32)
    exact = y0[:n].astype(np.float64) + c.astype(np.float64) @ bt[:, :n].astype(np.float64)
    outs = {}
    for isa in each_level(ISAS):
        y = y0.copy()
        assert lib.ei_kernel_lora_up(isa, n, rank, ffi.from_buffer("float[]", c), ffi.from_buffer("float[]", bt),
                                     ld, ffi.from_buffer("float[]", y)) == 0
        np.testing.assert_array_equal(y[n:], y0[n:])      # nothing past n written
        outs[isa] = y[:n]
    np.testing.assert_allclose(outs[lib.EI_ISA_SCALAR], exact, rtol=1e-5, atol=1e-5)
    for isa, y in outs.items():
        np.testing.assert_allclose(y, outs[lib.EI_ISA_SCALAR], rtol=1e-5, atol=1e-5)


def test_lora_up_rejects_bad_arguments():
    y = np.zeros(4, np.float32)
    assert lib.ei_kernel_lora_up(lib.EI_ISA_SCALAR, 4, 0, ffi.NULL, ffi.NULL, 4, ffi.from_buffer("float[]", y)) \
        == lib.EI_ERR_INVALID_ARG
    assert lib.ei_kernel_lora_up(lib.EI_ISA_SCALAR, 8, 2, ffi.from_buffer("float[]", y), ffi.from_buffer("float[]", y),
                                 4, ffi.from_buffer("float[]", y)) == lib.EI_ERR_INVALID_ARG
