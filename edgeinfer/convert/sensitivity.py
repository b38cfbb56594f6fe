"""`--type auto`: per-tensor sensitivity on calibration text, and a size-budgeted choice of
per-tensor types that minimizes the predicted KL divergence.

Measurement (one float32 numpy forward and backward pass over the calibration text, streamed
layer by layer from the checkpoint; the forward is edgeinfer/arch/reference.py's):

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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..arch.reference import Layer, Positions, Reference, reference_for, rotate
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


# ------------------------------------------------------------------ float backward
class _ConvertedWeights(Mapping):
    """GGUF name -> float32 tensor as the converter writes it (the checkpoint's tensor through
    the name map's transforms; computed tensors from config.json), loaded on each access so
    that the forward streams the checkpoint layer by layer."""

    def __init__(self, hp: HParams, tmap: TensorMap, load: Callable[[str], np.ndarray]):
        self._hf = {w.name: w.hf for w in hp.arch.weights(hp) if w.hf is not None}
        self._computed = dict(hp.computed_tensors())
        self._tmap, self._load = tmap, load

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._computed:
            return self._computed[name]
        hf = self._hf[name]
        w = np.asarray(self._load(hf), dtype=np.float32)
        f = self._tmap.transform(hf)
        w = w if f is None else f(w)
        # rows as the file stores them (a conv's [channels, 1, taps] is [channels, taps] there)
        return w.reshape(-1, w.shape[-1]) if w.ndim > 2 else w

    def __contains__(self, name: object) -> bool:
        return name in self._hf or name in self._computed

    def __iter__(self):
        return iter([*self._hf, *self._computed])

    def __len__(self) -> int:
        return len(self._hf) + len(self._computed)


def _rms_back(dy: np.ndarray, w: np.ndarray, n: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Gradient at x of rms_norm(x, w) given dy at its output (n, r: its normalized x, 1/rms)."""
    dn = dy * w
    return r * (dn - n * (dn * n).mean(-1, keepdims=True))


def _rope_back(dy: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool) -> np.ndarray:
    """The transpose of apply_rope: rotation by minus the angle."""
    d = cos.shape[-1]
    r = dy[..., :d]
    g = r * cos - rotate(r * sin, neox)
    return g if d == dy.shape[-1] else np.concatenate([g, dy[..., d:]], axis=-1)


def _act_grad(act: str, x: np.ndarray) -> np.ndarray:
    """The derivative of the table's activation `act` at x."""
    if act == "gelu_tanh":
        c = math.sqrt(2.0 / math.pi)
        t = np.tanh(c * (x + 0.044715 * x * x * x))
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x)
    sg = 1.0 / (1.0 + np.exp(-x))
    return sg * (1.0 + x * (1.0 - sg))


def _acc(stats: dict, name: str, g: np.ndarray, x: np.ndarray) -> None:
    s = (g * g).T @ (x * x)
    if name in stats:
        stats[name] += s
    else:
        stats[name] = s


def _backward(layer: Layer, x: np.ndarray, dout: np.ndarray, pos: Positions, stats: dict) -> np.ndarray:
    """Gradient at the input x of `layer` given `dout` at its output; accumulates each
    weight's sum_t g_t^2 x_t^2 into stats (keys: roles)."""
    ref, w, c = layer.ref, layer.w, {}
    p, a_ = ref.params, ref.params.arch
    layer.forward(x, pos, trace=c)
    cos, sin = layer.rope_tables(pos)
    n = x.shape[0]
    nh, nkv, hd = p.n_head, p.n_head_kv, p.head_dim
    # FFN
    dfo = _rms_back(dout, w["ffn_post_norm"], c["pfn"], c["pfnr"]) if a_.post_norms else dout
    _acc(stats, "ffn_down", dfo, c["m"])
    dm = dfo @ w["ffn_down"]
    dup = dm * ref.act(c["gate"])
    dgate = dm * c["up"] * _act_grad(a_.act, c["gate"])
    _acc(stats, "ffn_up", dup, c["b"])
    _acc(stats, "ffn_gate", dgate, c["b"])
    db = dup @ w["ffn_up"] + dgate @ w["ffn_gate"]
    dxm = dout + _rms_back(db, w["ffn_norm"], c["bn"], c["br"])
    # attention
    dao = _rms_back(dxm, w["attn_post_norm"], c["pan"], c["panr"]) if a_.post_norms else dxm
    _acc(stats, "attn_output", dao, c["o"])
    do = (dao @ w["attn_output"]).reshape(n, nh, hd).transpose(1, 0, 2)
    pr, vx, kx, qr = c["pr"], c["vx"], c["kx"], c["qr"]
    scale = np.float32(ref.attn_scale)
    dpr = do @ vx.transpose(0, 2, 1)
    dvx = pr.transpose(0, 2, 1) @ do
    ds = pr * (dpr - (dpr * pr).sum(-1, keepdims=True))
    dqr = ds @ kx * scale
    dkx = ds.transpose(0, 2, 1) @ qr * scale
    group = nh // nkv
    dkr = dkx.reshape(nkv, group, n, hd).sum(1)
    dv = dvx.reshape(nkv, group, n, hd).sum(1)
    dq = _rope_back(dqr, cos, sin, ref.neox)
    dk = _rope_back(dkr, cos, sin, ref.neox)
    if a_.qk_norm:
        dq = _rms_back(dq, w["attn_q_norm"], c["qn"], c["qnr"])
        dk = _rms_back(dk, w["attn_k_norm"], c["kn"], c["knr"])
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
    of token ids). `load(hf_name)` returns a tensor in Hugging Face layout (LoRA merged); the
    float32 forward (edgeinfer/arch/reference.py) runs on the tensors as the GGUF file will
    hold them. `record` (for tests) receives the logit-gradient samples ("dz", one per
    window), the sensitivity matrices ("S", by GGUF name, in GGUF layout) and the embedding
    rows' ("emb_rows": (token ids, matrix))."""
    t0 = time.perf_counter()
    ids = [np.asarray(w, dtype=np.int64) for w in ids if len(w) >= 2]
    if not ids:
        raise ConversionError("the calibration text is too short (needs at least 2 tokens)")
    n_tok = int(sum(len(w) for w in ids))
    note = progress or (lambda s: None)
    costs: dict[str, TensorCost] = {}
    rng = np.random.default_rng(seed)
    meta = {"general.architecture": hp.arch.name, **{k: v for k, v, _ in hp.metadata()}}
    ref = reference_for(meta, _ConvertedWeights(hp, tmap, load), np.float32)
    if not isinstance(ref, Reference):   # the backward below walks the table-driven Reference's layers
        raise ConversionError(f"--type auto cannot price {hp.arch.name} weights (its per-layer inputs and "
                              f"KV-shared layers have no backward here); choose a --type")
    if any(k != "attention" for k in ref.params.layer_kinds or ()):
        raise ConversionError(f"--type auto cannot price {hp.arch.name} weights (its recurrent layers "
                              f"have no backward here); choose a --type")
    # LongRoPE's factors by the window's length, as transformers chooses them
    pos = {len(w): ref.positions(len(w)) for w in ids}

    xs = [np.split(ref.embed(np.concatenate(ids)), np.cumsum([len(w) for w in ids])[:-1])]  # each layer's input
    for i in range(hp.n_layer):
        note(f"forward layer {i}")
        layer = ref.layer(i)
        xs.append([layer.forward(x, pos[len(x)]) for x in xs[-1]])
        del layer

    # head: logits, a Fisher sample at the logits, back to the last residual
    note("output head")
    norm, head = ref.tensor("output_norm"), ref.head()
    head_name = hp.arch.tensor("output" if hp.has_output else "token_embd").gguf
    s_head = np.zeros(head.shape, dtype=np.float32)
    grads = []
    for x in xs[-1]:
        c: dict = {}
        z = ref.output(x, c)      # softcapped: the sample is taken at the capped logits
        z -= z.max(-1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(-1, keepdims=True)
        sp = np.sqrt(p)
        r = np.where(rng.random(p.shape, dtype=np.float32) < 0.5, -sp, sp)   # sqrt(p) * +-1
        dz = r - p * r.sum(-1, keepdims=True)
        if record is not None:
            record.setdefault("dz", []).append(dz.copy())
        if c["softcap_tanh"] is not None:
            dz = dz * (1.0 - c["softcap_tanh"] ** 2)
        s_head += (dz * dz).T @ (c["xf"] * c["xf"])
        grads.append(_rms_back(dz @ head, norm, c["xn"], c["xr"]))
        del z, p, sp, r, dz, c
    if record is not None:
        record.setdefault("S", {})[head_name] = s_head.copy()
    costs[head_name] = _price(head_name, head, s_head, n_tok, n_threads)
    del head, s_head

    for i in reversed(range(hp.n_layer)):
        note(f"backward layer {i}")
        layer = ref.layer(i)
        stats: dict[str, np.ndarray] = {}
        grads = [_backward(layer, x, g, pos[len(x)], stats) for x, g in zip(xs[i], grads)]
        xs.pop()
        for name, roles in layer.parts.items():
            if roles[0] not in stats:        # norms, biases
                continue
            s = np.concatenate([stats[r] for r in roles]) if len(roles) > 1 else stats[roles[0]]
            if record is not None:
                record.setdefault("S", {})[name] = s.copy()
            w = np.concatenate([layer.w[r] for r in roles]) if len(roles) > 1 else layer.w[roles[0]]
            costs[name] = _price(name, np.ascontiguousarray(w), s, n_tok, n_threads)
        del layer, stats

    note("token embedding")
    all_ids = np.concatenate(ids)
    dx0 = np.concatenate(grads)
    if ref.embd_scale is not None:
        dx0 = dx0 * ref.embd_scale
    uniq, inv = np.unique(all_ids, return_inverse=True)
    s_rows = np.zeros((len(uniq), hp.n_embd), dtype=np.float32)
    np.add.at(s_rows, inv, dx0 * dx0)
    if record is not None:
        record["emb_rows"] = (uniq, s_rows.copy())
    emb = ref.tensor("token_embd")
    g = hp.arch.tensor("token_embd").gguf
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
