"""`--type auto`: per-tensor sensitivity on calibration text, and a size-budgeted choice of
per-tensor types that minimizes the predicted KL divergence.

Measurement (one float32 numpy forward and backward pass over the calibration text, streamed
layer by layer from the checkpoint):

* Quantizing weight W of a linear layer y = W x perturbs its output by dy = E x, E = Q(W) - W.
  To second order, the KL divergence between the float model's next-token distribution p and
  the perturbed one is 0.5 dz^T F dz, where dz is the change in logits and F = diag(p) - p p^T
  the Fisher matrix of the softmax. Writing F = B B^T (B = diag(sqrt p) - p sqrt(p)^T), a
  random-sign vector r gives an unbiased sample v = B r with E[v v^T] = F; back-propagating v
  from the logits to y gives g with KL ~= 0.5 E[(g . dy)^2] (the linearization dz = J dy).
* Dropping the cross terms between different outputs and inputs (quantization errors of
  different weights are nearly independent and zero-mean) leaves, per calibration token t,
  0.5 sum_ij g_ti^2 x_tj^2 E_ij^2. So one matrix per tensor, S = sum_t (g_t^2)(x_t^2)^T (the
  size of W), measured once, prices every candidate type: predicted mean KL per token
  = 0.5 / n_tokens * sum(S * E^2), with E computed by really quantizing W to that type.
* Embedding rows are priced by the gradients at the embedding output of the tokens that use
  them (a tied embedding adds that to its cost as the output head).

The choice is a knapsack over bytes: each tensor starts at its cheapest candidate; the
greedy step takes the upgrade with the largest predicted-KL reduction per extra byte (over
each tensor's lower convex hull of (bytes, predicted KL)) while it fits the budget, then any
upgrade that still fits and lowers the prediction. Upgrades that predict no gain are not
taken, so the file can come out smaller than the budget.
"""
from __future__ import annotations

import heapq
import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import ConversionError
from ..gguf.types import GGMLType as T
from .arch import HParams, TensorMap
from .quantize import can_quantize, dequantize, quantize, row_nbytes

__all__ = ["CANDIDATES", "TensorCost", "Sensitivity", "analyze", "allocate",
           "default_calibration_text", "LLAMA_FTYPE"]

#: The types `auto` chooses from (each tensor: those its row length allows).
CANDIDATES = (T.F16, T.Q8_0, T.Q6_K, T.Q5_1, T.Q5_0, T.Q4_K, T.Q4_1, T.Q4_0)
#: general.file_type for a file whose largest share of bytes is of a type.
LLAMA_FTYPE = {T.F32: 0, T.F16: 1, T.BF16: 32, T.Q8_0: 7, T.Q6_K: 18, T.Q5_0: 8, T.Q5_1: 9,
               T.Q5_K: 17, T.Q4_K: 15, T.Q4_1: 3, T.Q4_0: 2}


def default_calibration_text() -> str:
    """The calibration text shipped with the package (edgeinfer/convert/calibration.txt)."""
    path = os.path.join(os.path.dirname(__file__), "calibration.txt")
    with open(path, encoding="utf-8") as fh:
        return fh.read()


@dataclass
class TensorCost:
    name: str                       # GGUF name
    n_elements: int
    cost: dict[int, tuple[int, float]] = field(default_factory=dict)  # type -> (bytes, pred. KL)


@dataclass
class Sensitivity:
    tensors: dict[str, TensorCost]
    n_tokens: int
    seconds: float

    def predicted_kl(self, types: dict[str, int]) -> float:
        return float(sum(c.cost[int(types[n])][1] for n, c in self.tensors.items()
                         if int(types.get(n, -1)) in c.cost))


# ------------------------------------------------------------------ float forward/backward
def _rms(x: np.ndarray, w: np.ndarray, eps: float):
    r = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    n = x * r
    return n * w, n, r


def _rms_back(dy: np.ndarray, w: np.ndarray, n: np.ndarray, r: np.ndarray) -> np.ndarray:
    dn = dy * w
    return r * (dn - n * (dn * n).mean(-1, keepdims=True))


def _rot(x):          # HF rotate_half
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def _rot_t(y):        # its transpose
    h = y.shape[-1] // 2
    return np.concatenate([y[..., h:], -y[..., :h]], axis=-1)


def _gelu_tanh(x):
    """GELU, tanh form, and its derivative."""
    c = math.sqrt(2.0 / math.pi)
    t = np.tanh(c * (x + 0.044715 * x * x * x))
    return 0.5 * x * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x)


def _silu(x):
    """SiLU and its derivative."""
    sg = 1.0 / (1.0 + np.exp(-x))
    return x * sg, sg * (1.0 + x * (1.0 - sg))


def _rope_tables(hp: HParams, n: int, local: bool = False):
    """cos, sin [n, rope_dim] in HF's rotate-half order: llama3 or LongRoPE factors (LongRoPE:
    long past the original context, as transformers switches), times the attention factor.
    local: a sliding-window layer's own base, unscaled (Gemma 3)."""
    d = hp.rope_dim
    base = hp.rope_theta_local if local else hp.rope_theta
    inv = 1.0 / (base ** (np.arange(0, d, 2, dtype=np.float64) / d))
    pos = np.arange(n, dtype=np.float64)
    m = 1.0
    if not local:
        rf = hp.rope_freqs()
        if rf is not None:
            inv = inv / rf
        if hp.has_longrope:
            key = "long_factor" if n > hp.longrope_ctx_orig() else "short_factor"
            inv = inv / np.asarray(hp.rope_scaling[key], dtype=np.float64)
            m = hp.longrope_attn_factor()
        if hp.rope_scaling.get("rope_type") == "linear":
            pos = pos / float(hp.rope_scaling.get("factor", 1.0))
    ang = np.outer(pos, inv)
    ang = np.concatenate([ang, ang], axis=-1)
    return (np.cos(ang) * m).astype(np.float32), (np.sin(ang) * m).astype(np.float32)


def _rope(x, cos, sin):
    """RoPE on the first rope_dim (= cos.shape[-1]) dimensions of each head."""
    rd = cos.shape[-1]
    r = x[..., :rd]
    y = r * cos + _rot(r) * sin
    return y if rd == x.shape[-1] else np.concatenate([y, x[..., rd:]], axis=-1)


def _rope_back(dy, cos, sin):
    rd = cos.shape[-1]
    r = dy[..., :rd]
    g = r * cos + _rot_t(r * sin)
    return g if rd == dy.shape[-1] else np.concatenate([g, dy[..., rd:]], axis=-1)


def _acc(stats: dict, name: str, g: np.ndarray, x: np.ndarray) -> None:
    s = (g * g).T @ (x * x)
    if name in stats:
        stats[name] += s
    else:
        stats[name] = s


class _Layer:
    """One decoder layer's weights (HF layout, float32) by role; `hf` names their tensors. A
    fused tensor (Phi-3's qkv_proj, gate_up_proj) gives each of its parts' roles a run of its
    rows; `parts` lists them, in row order, by HF name."""

    def __init__(self, hp: HParams, i: int, load: Callable[[str], np.ndarray]):
        self.hf, self.w, self.parts = {}, {}, {}
        for t in hp.arch.tensors:
            if not t.per_layer or t.hf is None or (t.when is not None and not getattr(hp, t.when)):
                continue
            name = t.hf.format(i=i)
            w = np.asarray(load(name), dtype=np.float32)
            r0 = 0
            for role, rows in t.split or ((t.role, lambda h, n=w.shape[0]: n),):
                n = rows(hp)
                self.hf[role], self.w[role] = name, w[r0:r0 + n]
                self.parts.setdefault(name, []).append(role)
                r0 += n
        for role in self.w:     # Gemma's norms scale by (1 + w)
            if role.endswith("norm") and hp.arch.norm_shift:
                self.w[role] = self.w[role] + np.float32(hp.arch.norm_shift)
        self.hp = hp
        self.local = bool(hp.swa_window and hp.arch.swa_pattern and (i + 1) % hp.arch.swa_pattern)

    def _lin(self, x, role):
        y = x @ self.w[role].T
        b = self.w.get(role + "_bias")
        return y if b is None else y + b

    def _mask(self, n: int) -> np.ndarray:
        """Causal, and on a sliding-window layer the last swa_window positions only."""
        i, j = np.arange(n)[:, None], np.arange(n)[None, :]
        hide = j > i
        if self.local:
            hide |= i - j >= self.hp.swa_window
        return np.where(hide, -np.inf, 0.0).astype(np.float32)

    def _act(self, gt):
        return _gelu_tanh(gt) if self.hp.arch.act == "gelu_tanh" else _silu(gt)

    def forward(self, x: np.ndarray, tables, keep: bool = False):
        """tables: (cos, sin) of the global layers and of the local ones."""
        hp, w = self.hp, self.w
        cos, sin = tables[1] if self.local else tables[0]
        n = x.shape[0]
        nh, nkv, hd = hp.n_head, hp.n_head_kv, hp.head_dim
        a, an, ar = _rms(x, w["attn_norm"], hp.rms_eps)
        q = self._lin(a, "attn_q").reshape(n, nh, hd).transpose(1, 0, 2)
        k = self._lin(a, "attn_k").reshape(n, nkv, hd).transpose(1, 0, 2)
        v = self._lin(a, "attn_v").reshape(n, nkv, hd).transpose(1, 0, 2)
        c = {}
        if hp.has_qk_norm:      # each head's RMSNorm before RoPE (Qwen3, Gemma 3)
            q, c["qn"], c["qrr"] = _rms(q, w["attn_q_norm"], hp.rms_eps)
            k, c["kn"], c["krr"] = _rms(k, w["attn_k_norm"], hp.rms_eps)
        qr = _rope(q, cos, sin)
        kr = _rope(k, cos, sin)
        grp = nh // nkv
        kx, vx = np.repeat(kr, grp, axis=0), np.repeat(v, grp, axis=0)
        scale = hp.attn_scale or 1.0 / math.sqrt(hd)
        s = qr @ kx.transpose(0, 2, 1) * scale + self._mask(n)
        s -= s.max(-1, keepdims=True)
        pr = np.exp(s)
        pr /= pr.sum(-1, keepdims=True)
        o = (pr @ vx).transpose(1, 0, 2).reshape(n, nh * hd)
        ao = o @ w["attn_output"].T
        if hp.has_post_norms:
            ao, c["pan"], c["par"] = _rms(ao, w["attn_post_norm"], hp.rms_eps)
        xm = x + ao
        b, bn, br = _rms(xm, w["ffn_norm"], hp.rms_eps)
        gt = b @ w["ffn_gate"].T
        up = b @ w["ffn_up"].T
        ag, dag = self._act(gt)
        m = ag * up
        fo = m @ w["ffn_down"].T
        if hp.has_post_norms:
            fo, c["pfn"], c["pfr"] = _rms(fo, w["ffn_post_norm"], hp.rms_eps)
        out = xm + fo
        if not keep:
            return out
        c.update(a=a, an=an, ar=ar, qr=qr, kx=kx, vx=vx, pr=pr, o=o, b=b, bn=bn, br=br, ag=ag, dag=dag, up=up, m=m)
        return out, c

    def backward(self, x: np.ndarray, dout: np.ndarray, tables, stats: dict) -> np.ndarray:
        """Gradient at the layer input given `dout` at its output; accumulates each weight's
        sum_t g_t^2 x_t^2 into stats (keys: roles)."""
        hp, w = self.hp, self.w
        cos, sin = tables[1] if self.local else tables[0]
        n = x.shape[0]
        nh, nkv, hd = hp.n_head, hp.n_head_kv, hp.head_dim
        _, c = self.forward(x, tables, keep=True)
        # MLP
        dfo = _rms_back(dout, w["ffn_post_norm"], c["pfn"], c["pfr"]) if hp.has_post_norms else dout
        _acc(stats, "ffn_down", dfo, c["m"])
        dm = dfo @ w["ffn_down"]
        dup = dm * c["ag"]
        dgt = dm * c["up"] * c["dag"]
        _acc(stats, "ffn_up", dup, c["b"])
        _acc(stats, "ffn_gate", dgt, c["b"])
        db = dup @ w["ffn_up"] + dgt @ w["ffn_gate"]
        dxm = dout + _rms_back(db, w["ffn_norm"], c["bn"], c["br"])
        # attention
        dao = _rms_back(dxm, w["attn_post_norm"], c["pan"], c["par"]) if hp.has_post_norms else dxm
        _acc(stats, "attn_output", dao, c["o"])
        do = (dao @ w["attn_output"]).reshape(n, nh, hd).transpose(1, 0, 2)
        pr, vx, kx, qr = c["pr"], c["vx"], c["kx"], c["qr"]
        scale = hp.attn_scale or 1.0 / math.sqrt(hd)
        dpr = do @ vx.transpose(0, 2, 1)
        dvx = pr.transpose(0, 2, 1) @ do
        ds = pr * (dpr - (dpr * pr).sum(-1, keepdims=True))
        dqr = ds @ kx * scale
        dkx = ds.transpose(0, 2, 1) @ qr * scale
        grp = nh // nkv
        dkr = dkx.reshape(nkv, grp, n, hd).sum(1)
        dv = dvx.reshape(nkv, grp, n, hd).sum(1)
        dq = _rope_back(dqr, cos, sin)
        dk = _rope_back(dkr, cos, sin)
        if hp.has_qk_norm:
            dq = _rms_back(dq, w["attn_q_norm"], c["qn"], c["qrr"])
            dk = _rms_back(dk, w["attn_k_norm"], c["kn"], c["krr"])
        dq = dq.transpose(1, 0, 2).reshape(n, nh * hd)
        dk = dk.transpose(1, 0, 2).reshape(n, nkv * hd)
        dv = dv.transpose(1, 0, 2).reshape(n, nkv * hd)
        a = c["a"]
        _acc(stats, "attn_q", dq, a)
        _acc(stats, "attn_k", dk, a)
        _acc(stats, "attn_v", dv, a)
        da = dq @ w["attn_q"] + dk @ w["attn_k"] + dv @ w["attn_v"]
        return dxm + _rms_back(da, w["attn_norm"], c["an"], c["ar"])


# ------------------------------------------------------------------ pricing
def _candidates(n_cols: int) -> list[int]:
    return [int(t) for t in CANDIDATES if can_quantize(t, n_cols)]


def _price(name: str, w: np.ndarray, s: np.ndarray | None, n_tokens: int, n_threads: int,
           rows: np.ndarray | None = None, s_rows: np.ndarray | None = None,
           cost: TensorCost | None = None) -> TensorCost:
    """Predicted KL of every candidate type for weight w (GGUF row order, rows x n_cols) given
    its sensitivity matrix s (same shape) and/or, for an embedding, the sensitivity s_rows of
    the rows `rows`. Adds to `cost` if given."""
    n_rows, n_cols = w.shape
    if cost is None:
        cost = TensorCost(name, w.size)
    chunk = max(1, (1 << 22) // n_cols)
    for t in _candidates(n_cols):
        err = 0.0
        if s is not None:
            for r0 in range(0, n_rows, chunk):
                x = w[r0:r0 + chunk]
                e = dequantize(quantize(x, t, n_threads), t, n_cols) - x
                err += float(np.einsum("ij,ij->", e * e, s[r0:r0 + chunk], dtype=np.float64))
        if rows is not None and len(rows):
            x = w[rows]
            e = dequantize(quantize(x, t, n_threads), t, n_cols) - x
            err += float(np.einsum("ij,ij->", e * e, s_rows, dtype=np.float64))
        prev = cost.cost.get(t, (0, 0.0))[1]
        cost.cost[t] = (row_nbytes(t, n_cols) * n_rows, prev + 0.5 * err / n_tokens)
    return cost


def analyze(hp: HParams, tmap: TensorMap, load: Callable[[str], np.ndarray],
            ids: list[list[int]], n_threads: int = 0, seed: int = 0,
            progress: Callable[[str], None] | None = None,
            record: dict | None = None) -> Sensitivity:
    """Prices every 2-D weight at every candidate type on the token windows `ids` (each a list
    of token ids). `load(hf_name)` returns a tensor in Hugging Face layout (LoRA merged).
    `record` (for tests) receives the logit-gradient samples ("dz", one per window), the
    sensitivity matrices ("S", by HF name, HF layout) and the embedding rows' ("emb_rows":
    (token ids, matrix))."""
    t0 = time.perf_counter()
    ids = [np.asarray(w, dtype=np.int64) for w in ids if len(w) >= 2]
    if not ids:
        raise ConversionError("the calibration text is too short (needs at least 2 tokens)")
    n_tok = int(sum(len(w) for w in ids))
    note = progress or (lambda s: None)
    costs: dict[str, TensorCost] = {}
    rng = np.random.default_rng(seed)
    tables = {len(w): (_rope_tables(hp, len(w)), _rope_tables(hp, len(w), local=True) if hp.swa_window else None)
              for w in ids}
    # Gemma scales the embeddings by sqrt(n_embd) (in the dtype, as transformers does)
    emb_scale = float(np.float32(math.sqrt(hp.n_embd))) if hp.arch.embd_scale_sqrt else 1.0

    emb_name, norm_name = (hp.arch.tensor(r).hf for r in ("token_embd", "output_norm"))
    emb = np.asarray(load(emb_name), dtype=np.float32)
    xs = [[emb[w] * np.float32(emb_scale) for w in ids]]      # residual input of each layer
    del emb
    for i in range(hp.n_layer):
        note(f"forward layer {i}")
        layer = _Layer(hp, i, load)
        xs.append([layer.forward(x, tables[len(x)]) for x in xs[-1]])
        del layer

    # head: logits, a Fisher sample at the logits, back to the last residual
    note("output head")
    norm = np.asarray(load(norm_name), dtype=np.float32) + np.float32(hp.arch.norm_shift)
    head_name = emb_name if hp.tied_output else hp.arch.tensor("output").hf
    head = np.asarray(load(head_name), dtype=np.float32)
    s_head = np.zeros(head.shape, dtype=np.float32)
    grads = []
    for x in xs[-1]:
        xf, xn, xr = _rms(x, norm, hp.rms_eps)
        z = xf @ head.T
        if hp.final_softcap:     # z = cap * tanh(z / cap): the sample is taken at the capped logits
            th = np.tanh(z / hp.final_softcap)
            z = hp.final_softcap * th
        z -= z.max(-1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(-1, keepdims=True)
        sp = np.sqrt(p)
        r = np.where(rng.random(p.shape, dtype=np.float32) < 0.5, -sp, sp)   # sqrt(p) * +-1
        dz = r - p * r.sum(-1, keepdims=True)
        if record is not None:
            record.setdefault("dz", []).append(dz.copy())
        if hp.final_softcap:
            dz = dz * (1.0 - th * th)
        s_head += (dz * dz).T @ (xf * xf)
        grads.append(_rms_back(dz @ head, norm, xn, xr))
        del z, p, sp, r, dz
    if record is not None:
        record.setdefault("S", {})[head_name] = s_head.copy()
    head_gguf = tmap.gguf_name(head_name)
    costs[head_gguf] = _price(head_gguf, head, s_head, n_tok, n_threads)
    del head, s_head

    for i in reversed(range(hp.n_layer)):
        note(f"backward layer {i}")
        layer = _Layer(hp, i, load)
        stats: dict[str, np.ndarray] = {}
        grads = [layer.backward(x, g, tables[len(x)], stats) for x, g in zip(xs[i], grads)]
        xs.pop()
        for hf, roles in layer.parts.items():
            if roles[0] not in stats:        # norms
                continue
            s = np.concatenate([stats[r] for r in roles]) if len(roles) > 1 else stats[roles[0]]
            if record is not None:
                record.setdefault("S", {})[hf] = s.copy()
            w = np.concatenate([layer.w[r] for r in roles]) if len(roles) > 1 else layer.w[roles[0]]
            f = tmap.transform(hf)
            if f is not None:          # GGUF row order: permute the weight and its sensitivity
                w, s = f(w), f(s)
            g = tmap.gguf_name(hf)
            costs[g] = _price(g, np.ascontiguousarray(w), s, n_tok, n_threads)
        del layer, stats

    note("token embedding")
    all_ids = np.concatenate(ids)
    dx0 = np.concatenate(grads) * np.float32(emb_scale)
    uniq, inv = np.unique(all_ids, return_inverse=True)
    s_rows = np.zeros((len(uniq), hp.n_embd), dtype=np.float32)
    np.add.at(s_rows, inv, dx0 * dx0)
    if record is not None:
        record["emb_rows"] = (uniq, s_rows.copy())
    emb = np.asarray(load(emb_name), dtype=np.float32)
    g = tmap.gguf_name(emb_name)
    costs[g] = _price(g, emb, None, n_tok, n_threads, rows=uniq, s_rows=s_rows,
                      cost=costs.get(g))
    return Sensitivity(costs, n_tok, time.perf_counter() - t0)


# ------------------------------------------------------------------ allocation
def _hull(opts: list[tuple[int, float, int]]) -> list[tuple[int, float, int]]:
    """Lower convex hull of (bytes, predicted KL, type), cheapest first, KL strictly falling."""
    opts = sorted(opts, key=lambda o: (o[0], o[1]))
    front: list[tuple[int, float, int]] = []
    for o in opts:
        if front and o[0] == front[-1][0]:
            continue
        if not front or o[1] < front[-1][1]:
            front.append(o)
    hull: list[tuple[int, float, int]] = []
    for o in front:
        while len(hull) >= 2:
            (b0, e0, _), (b1, e1, _) = hull[-2], hull[-1]
            # drop the middle point when it lies on or above the chord
            if (e1 - e0) * (o[0] - b0) >= (o[1] - e0) * (b1 - b0):
                hull.pop()
            else:
                break
        hull.append(o)
    return hull


def allocate(sens: Sensitivity, budget_bytes: int) -> dict[str, int]:
    """Per-tensor types (GGUF name -> GGML type) with total bytes <= budget_bytes that
    minimize the summed predicted KL (greedy on the convex hulls, then a fill pass)."""
    opts = {n: [(b, e, t) for t, (b, e) in c.cost.items()] for n, c in sens.tensors.items()}
    hulls = {n: _hull(o) for n, o in opts.items()}
    pos = {n: 0 for n in hulls}
    total = sum(h[0][0] for h in hulls.values())
    if total > budget_bytes:
        raise ConversionError(f"the budget is below the smallest file --type auto can make "
                              f"({total} bytes of quantized weights needed, {budget_bytes} "
                              f"allowed)")
    heap: list[tuple[float, str]] = []

    def push(n: str) -> None:
        h, i = hulls[n], pos[n]
        if i + 1 < len(h):
            gain, extra = h[i][1] - h[i + 1][1], h[i + 1][0] - h[i][0]
            if gain > 0:
                heapq.heappush(heap, (-gain / extra, n))

    for n in hulls:
        push(n)
    while heap:
        _, n = heapq.heappop(heap)
        h, i = hulls[n], pos[n]
        extra = h[i + 1][0] - h[i][0]
        if total + extra <= budget_bytes:
            total += extra
            pos[n] = i + 1
            push(n)
    cur = {n: hulls[n][pos[n]] for n in hulls}
    while True:                                  # fill: any upgrade that fits and helps
        best = None
        for n, o in opts.items():
            b0, e0, _ = cur[n]
            for b, e, t in o:
                if e < e0 and total - b0 + b <= budget_bytes:
                    if best is None or e0 - e > best[0]:
                        best = (e0 - e, n, (b, e, t))
        if best is None:
            break
        _, n, o = best
        total += o[0] - cur[n][0]
        cur[n] = o
    return {n: o[2] for n, o in cur.items()}
