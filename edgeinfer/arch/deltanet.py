"""Qwen3.5's Gated DeltaNet layer in numpy: the reference the native kernels are judged by.

Weights are in GGUF layout after llama.cpp's converter (edgeinfer/convert/arch.py): ssm_a holds
A = -exp(A_log), ssm_conv1d is [conv_dim, K] (numpy), value heads are tiled (value head h reads
key head h % n_k_heads). Per token t and value head h, with S the d_k x d_v state:

    g = A * softplus(alpha + dt),  beta = sigmoid(b)
    q, k = l2norm(q) / sqrt(d_k), l2norm(k)        (after the causal conv and SiLU)
    S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q
    out = ssm_out(rmsnorm(o) * ssm_norm * silu(z))

`gated_delta_rule` is the step-by-step recurrence; `chunked_gated_delta_rule` computes the same
over chunks of C tokens with the UT transform (matrix work within a chunk, one state update
per chunk), the form the native prefill uses.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["l2norm", "softplus", "causal_conv", "gated_delta_rule", "chunked_gated_delta_rule",
           "gated_rms_norm", "deltanet_layer"]

L2_EPS = 1e-6    # transformers' l2norm (as FLA): x / sqrt(sum x^2 + eps)


def l2norm(x: np.ndarray, eps: float = L2_EPS) -> np.ndarray:
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + eps)


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x).astype(x.dtype)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def causal_conv(x: np.ndarray, w: np.ndarray, window: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal conv of x [n, ch] with taps w [ch, K] (oldest first) after `window`
    [K-1, ch] (the previous inputs; zeros at the start); returns (y [n, ch], the new window)."""
    k = w.shape[1]
    if window is None:
        window = np.zeros((k - 1, x.shape[1]), dtype=x.dtype)
    full = np.concatenate([window, x], axis=0)
    y = sum(full[j:j + x.shape[0]] * w[:, j] for j in range(k))
    return y, full[full.shape[0] - (k - 1):]


def gated_delta_rule(q, k, v, g, beta, state=None):
    """The recurrence, token by token. q, k [n, H, dk] (already per value head), v [n, H, dv],
    g, beta [n, H]; state [H, dk, dv]. Returns (o [n, H, dv], final state)."""
    n, nh, dk = k.shape
    s = np.zeros((nh, dk, v.shape[-1]), dtype=v.dtype) if state is None else state.copy()
    o = np.empty_like(v)
    for t in range(n):
        s *= np.exp(g[t])[:, None, None]
        kv = np.einsum("hk,hkv->hv", k[t], s)
        delta = (v[t] - kv) * beta[t][:, None]
        s += k[t][:, :, None] * delta[:, None, :]
        o[t] = np.einsum("hk,hkv->hv", q[t], s)
    return o, s


def chunked_gated_delta_rule(q, k, v, g, beta, state=None, chunk: int = 64):
    """The same recurrence by chunks (the UT-transform / WY form of the delta rule): within a
    chunk, with cumulative log decays c_i, the corrections u solve the unit lower-triangular
    system (I + tril(beta_i exp(c_i - c_j) k_i.k_j, -1)) u = beta (v - exp(c) k S0); outputs are
    exp(c) q S0 plus the causal (q_i.k_j exp(c_i - c_j)) u; the state leaves as
    exp(c_last) S0 + sum_j exp(c_last - c_j) k_j u_j^T."""
    n, nh, dk = k.shape
    dv = v.shape[-1]
    s = np.zeros((nh, dk, dv), dtype=v.dtype) if state is None else state.copy()
    o = np.empty_like(v)
    for c0 in range(0, n, chunk):
        sl = slice(c0, min(n, c0 + chunk))
        qc, kc, vc = (a[sl].transpose(1, 0, 2) for a in (q, k, v))      # [H, C, d]
        gc, bc = g[sl].T, beta[sl].T                                   # [H, C]
        c = np.cumsum(gc, axis=1)
        m = len(range(*sl.indices(n)))
        decay = np.exp(c[:, :, None] - c[:, None, :])                 # [H, i, j]: exp(c_i - c_j)
        strict = np.tril(np.ones((m, m), dtype=bool), -1)
        a = np.where(strict, bc[:, :, None] * decay * (kc @ kc.transpose(0, 2, 1)), 0.0)
        rhs = bc[:, :, None] * (vc - np.exp(c)[:, :, None] * (kc @ s))
        u = np.stack([np.linalg.solve(np.eye(m) + a[h], rhs[h]) for h in range(nh)]).astype(v.dtype)
        causal = np.tril(np.ones((m, m), dtype=bool))
        att = np.where(causal, (qc @ kc.transpose(0, 2, 1)) * decay, 0.0)
        o[sl] = (np.exp(c)[:, :, None] * (qc @ s) + att @ u).transpose(1, 0, 2)
        tail = np.exp(c[:, -1:] - c)                                   # [H, C]: exp(c_last - c_j)
        s = np.exp(c[:, -1])[:, None, None] * s + (kc * tail[:, :, None]).transpose(0, 2, 1) @ u
    return o, s


def gated_rms_norm(x: np.ndarray, w: np.ndarray, gate: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm of x over its last axis, times w, times silu(gate)."""
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w * _silu(gate)


def deltanet_layer(x: np.ndarray, w, p, chunk: int | None = None, linear=None) -> np.ndarray:
    """The token mixer of one Gated DeltaNet layer on x [n, n_embd] (already attn_norm'ed),
    from a fresh state. `w`: role -> weight; `p`: the sizes (RecurrentDims, rms_eps);
    `linear(x, role)`: the projections' matmul (default x @ w[role].T)."""
    mm = linear or (lambda v, role: v @ w[role].T)
    n = x.shape[0]
    nk, nv, d = p.ssm_k_heads, p.ssm_v_heads, p.ssm_head_dim
    mixed = mm(x, "ssm_qkv")
    y, _ = causal_conv(mixed, w["ssm_conv1d"])
    y = _silu(y)
    kd = nk * d
    q = y[:, :kd].reshape(n, nk, d)
    k = y[:, kd:2 * kd].reshape(n, nk, d)
    v = y[:, 2 * kd:].reshape(n, nv, d)
    rep = nv // nk                      # tiled value heads: head h reads key head h % nk
    q = np.tile(l2norm(q), (1, rep, 1)) / q.dtype.type(math.sqrt(d))
    k = np.tile(l2norm(k), (1, rep, 1))
    beta = 1.0 / (1.0 + np.exp(-mm(x, "ssm_beta")))
    g = w["ssm_a"] * softplus(mm(x, "ssm_alpha") + w["ssm_dt"])
    rule = gated_delta_rule if chunk is None else (lambda *a: chunked_gated_delta_rule(*a, chunk=chunk))
    o, _ = rule(q, k, v, g, beta)
    z = mm(x, "ssm_gate").reshape(n, nv, d)
    o = gated_rms_norm(o, w["ssm_norm"], z, p.rms_eps).reshape(n, nv * d)
    return mm(o, "ssm_out")
