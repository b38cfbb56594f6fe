"""What quantization cost: a model against a reference on the same text -- perplexity of
both, KL(reference || model) per token (mean, p99, max) and top-1 agreement.

The text is tokenized once by the reference's tokenizer (both models must share the
vocabulary) and scored in non-overlapping windows of `ctx` tokens, each starting with the
tokens the tokenizer adds at the front (BOS) when it adds any.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass

import numpy as np

from .errors import EdgeInferError

__all__ = ["EvalResult", "evaluate", "compare_logits", "format_table"]


@dataclass
class EvalResult:
    model: str
    reference: str
    n_tokens: int            # tokens scored (KL / top-1 positions)
    n_windows: int
    ctx: int
    ppl_model: float
    ppl_reference: float
    kl_mean: float
    kl_p99: float
    kl_max: float
    top1: float
    size_model: int
    size_reference: int

    def to_dict(self) -> dict:
        return asdict(self)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def compare_logits(ref: np.ndarray, model: np.ndarray, ids: list[int], rows: int = 64):
    """Per-position KL(ref||model), top-1 matches, and next-token NLLs of both (positions
    0..n-2 predict ids[1:])."""
    n = ref.shape[0]
    kl = np.empty(n)
    top = np.empty(n, dtype=bool)
    nll_r = np.empty(max(n - 1, 0))
    nll_m = np.empty(max(n - 1, 0))
    for s in range(0, n, rows):
        lr = _log_softmax(ref[s:s + rows])
        lm = _log_softmax(model[s:s + rows])
        kl[s:s + rows] = np.sum(np.exp(lr) * (lr - lm), axis=-1)
        top[s:s + rows] = np.argmax(lr, axis=-1) == np.argmax(lm, axis=-1)
        for j in range(lr.shape[0]):
            p = s + j
            if p + 1 < n:
                nll_r[p] = -lr[j, ids[p + 1]]
                nll_m[p] = -lm[j, ids[p + 1]]
    return np.maximum(kl, 0.0), top, nll_r, nll_m


def evaluate(model: str, reference: str, text: str, ctx: int = 512, n_threads: int | None = None,
             max_tokens: int | None = None) -> EvalResult:
    from . import load
    from .models import resolve_model

    if ctx < 8:
        raise EdgeInferError(f"--ctx must be at least 8, got {ctx}")
    mpath, rpath = str(resolve_model(model)), str(resolve_model(reference))
    with load(rpath, n_ctx=ctx, n_threads=n_threads) as ref, \
            load(mpath, n_ctx=ctx, n_threads=n_threads) as mod:
        if ref.config.n_vocab != mod.config.n_vocab:
            raise EdgeInferError(f"the models do not share a vocabulary ({mod.config.n_vocab} vs "
                                 f"{ref.config.n_vocab} tokens): KL is undefined")
        prefix = ref.tokenize("", add_special=True)[:1]
        body = ref.tokenize(text, add_special=False, parse_special=False)
        if max_tokens is not None:
            body = body[:max_tokens]
        step = ctx - len(prefix)
        windows = [prefix + body[i:i + step] for i in range(0, len(body), step)]
        windows = [w for w in windows if len(w) >= 2]
        if not windows:
            raise EdgeInferError("the text is too short to evaluate (needs at least 2 tokens)")
        kls, tops, nr, nm = [], [], [], []
        for ids in windows:
            k, t, a, b = compare_logits(ref.logits(ids), mod.logits(ids), ids)
            kls.append(k); tops.append(t); nr.append(a); nm.append(b)
    kl = np.concatenate(kls)
    top = np.concatenate(tops)
    nll_r, nll_m = np.concatenate(nr), np.concatenate(nm)
    return EvalResult(
        model=mpath, reference=rpath, n_tokens=int(kl.size), n_windows=len(windows), ctx=ctx,
        ppl_model=float(math.exp(nll_m.mean())), ppl_reference=float(math.exp(nll_r.mean())),
        kl_mean=float(kl.mean()), kl_p99=float(np.percentile(kl, 99)), kl_max=float(kl.max()),
        top1=float(top.mean()), size_model=os.path.getsize(mpath),
        size_reference=os.path.getsize(rpath))


def format_table(r: EvalResult) -> str:
    def mib(n: int) -> str:
        return f"{n / 2**20:.1f} MiB"
    rows = [
        ("", "model", "reference"),
        ("file", os.path.basename(r.model), os.path.basename(r.reference)),
        ("size", mib(r.size_model), mib(r.size_reference)),
        ("perplexity", f"{r.ppl_model:.4f}", f"{r.ppl_reference:.4f}"),
    ]
    w0 = max(len(a) for a, _, _ in rows)
    w1 = max(len(b) for _, b, _ in rows)
    lines = [f"{a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows]
    lines += [
        "",
        f"KL(reference || model): mean {r.kl_mean:.6f}  p99 {r.kl_p99:.6f}  max {r.kl_max:.6f}",
        f"top-1 agreement: {100 * r.top1:.2f}%   ({r.n_tokens} tokens, {r.n_windows} windows of "
        f"<= {r.ctx})",
    ]
    return "\n".join(lines)


def to_json(r: EvalResult) -> str:
    return json.dumps(r.to_dict(), indent=2)
