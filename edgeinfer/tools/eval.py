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

from ..errors import EdgeInferError

__all__ = ["EvalResult", "evaluate", "compare_logits", "format_table", "SweepPoint", "sweep",
           "plot_sweep", "format_sweep", "SWEEP_TYPES"]


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
    from ..engine import Engine
    from ..hub import resolve_model

    if ctx < 8:
        raise EdgeInferError(f"--ctx must be at least 8, got {ctx}")
    mpath, rpath = str(resolve_model(model)), str(resolve_model(reference))
    with Engine.load(rpath, n_ctx=ctx, n_threads=n_threads) as ref, \
            Engine.load(mpath, n_ctx=ctx, n_threads=n_threads) as mod:
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


# ------------------------------------------------------------------ the KL-vs-size sweep
#: Fixed types a sweep converts to by default (each also sets one `auto` budget).
SWEEP_TYPES = ("q8_0", "q6_k", "q5_k_m", "q5_1", "q5_0", "q4_k_m", "q4_1", "q4_0")


@dataclass
class SweepPoint:
    label: str               # the type, or "auto@<bpw>"
    kind: str                # "fixed" or "auto"
    path: str
    bpw: float               # 8 * tensor bytes / weights
    target_bpw: float | None
    predicted_kl: float | None
    result: EvalResult

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(d.pop("result"))
        return d


def sweep(checkpoint: str, reference: str, text: str, types=SWEEP_TYPES,
          budgets: list[float] | None = None, out_dir: str | None = None,
          calibration: str | None = None, ctx: int = 512, n_threads: int | None = None,
          max_tokens: int | None = None, progress=None) -> list[SweepPoint]:
    """Converts `checkpoint` to every type in `types` and to `auto` at each budget (bits per
    weight; default: the bits per weight of each fixed type's file, i.e. the same sizes), and
    evaluates each file against `reference`. Files go to out_dir (kept) or a temporary
    directory (removed)."""
    import tempfile

    from ..convert import convert_checkpoint

    note = progress or (lambda s: None)
    threads = n_threads or 0
    tmp = None
    if out_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="edgeinfer-sweep-")
        out_dir = tmp.name
    os.makedirs(out_dir, exist_ok=True)
    points: list[SweepPoint] = []
    try:
        def run(label, kind, path, conv_bpw, target, predicted):
            note(f"eval {label}")
            r = evaluate(path, reference, text, ctx=ctx, n_threads=n_threads,
                         max_tokens=max_tokens)
            points.append(SweepPoint(label, kind, path, conv_bpw, target, predicted, r))

        fixed_bpw = []
        for t in types:
            note(f"convert {t}")
            path = os.path.join(out_dir, f"{t}.gguf")
            c = convert_checkpoint(checkpoint, path, t, n_threads=threads)
            fixed_bpw.append(c.bpw)
            run(t, "fixed", path, c.bpw, None, None)
        targets = sorted(set(round(b, 4) for b in (budgets if budgets else fixed_bpw)))
        sens = None
        for b in targets:
            note(f"convert auto at {b:.3f} bpw")
            label = f"auto@{b:.2f}"
            path = os.path.join(out_dir, f"auto-{b:.3f}.gguf")
            c = convert_checkpoint(checkpoint, path, "auto", n_threads=threads, target_bpw=b,
                                   calibration=calibration, sensitivity=sens)
            sens = c.sensitivity
            run(label, "auto", path, c.bpw, b, c.predicted_kl)
    finally:
        if tmp is not None:
            tmp.cleanup()
            for p in points:
                p.path = os.path.basename(p.path)
    return points


def format_sweep(points: list[SweepPoint]) -> str:
    rows = [("file", "kind", "size", "bpw", "KL mean", "KL p99", "top-1", "ppl", "predicted")]
    for p in points:
        r = p.result
        rows.append((p.label, p.kind, f"{r.size_model / 2**20:.1f} MiB", f"{p.bpw:.3f}",
                     f"{r.kl_mean:.5f}", f"{r.kl_p99:.4f}", f"{100 * r.top1:.1f}%",
                     f"{r.ppl_model:.3f}",
                     "" if p.predicted_kl is None else f"{p.predicted_kl:.5f}"))
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip() for r in rows)


def plot_sweep(points: list[SweepPoint], path: str, title: str | None = None) -> None:
    """KL (log scale) against file size: fixed types as labelled points, auto as a line."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise EdgeInferError("--plot needs matplotlib (pip install matplotlib)") from None
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    floor = 1e-6
    fixed = [p for p in points if p.kind == "fixed"]
    auto = sorted((p for p in points if p.kind == "auto"), key=lambda p: p.result.size_model)
    if fixed:
        ax.scatter([p.result.size_model / 2**20 for p in fixed],
                   [max(p.result.kl_mean, floor) for p in fixed], color="tab:blue",
                   label="fixed types (llama.cpp recipes)", zorder=3)
        for p in fixed:
            ax.annotate(p.label, (p.result.size_model / 2**20, max(p.result.kl_mean, floor)),
                        textcoords="offset points", xytext=(5, 4), fontsize=8)
    if auto:
        ax.plot([p.result.size_model / 2**20 for p in auto],
                [max(p.result.kl_mean, floor) for p in auto], "o-", color="tab:red",
                label="auto (sensitivity-driven)", zorder=3)
    ax.set_yscale("log")
    ax.set_xlabel("file size (MiB)")
    ax.set_ylabel("mean KL(reference || model), nats/token")
    ax.set_title(title or "KL divergence vs file size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
