"""Helpers around llama-cpp-python (the llama.cpp oracle) plus comparison metrics.

llama.cpp objects are cached per model path (loading costs time).  Tests that
need llama.cpp should call ``require("llama_cpp", ...)`` (tests/support/strict.py)
first; the metric functions here need only numpy.

Typical use in a test::

    from tests.support.llama_oracle import text_ids, llama_logits, kl_divergence, top1_agreement
    from tests.support.reference_forward import reference_logits
    for name, ids in text_ids(path).items():
        exact = reference_logits(path, ids)
        kl_llama = kl_divergence(exact, llama_logits(path, ids)).mean()
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np

N_THREADS = int(os.environ.get("EDGEINFER_TEST_THREADS", "2"))
_MIN_CTX = 1024

_LLAMAS: dict[str, object] = {}
_LOCK = threading.RLock()
_LOGITS: dict[tuple[str, tuple[int, ...]], np.ndarray] = {}


def _key(path) -> str:
    return str(Path(path).resolve())


def get_llama(path, n_ctx: int = _MIN_CTX):
    """A cached ``llama_cpp.Llama`` for ``path`` with at least ``n_ctx`` context and logits_all."""
    from llama_cpp import Llama

    key = _key(path)
    with _LOCK:
        llm = _LLAMAS.get(key)
        if llm is not None and llm.n_ctx() >= n_ctx:
            return llm
        if llm is not None:
            _LLAMAS.pop(key)
            llm.close() if hasattr(llm, "close") else None
            del llm
        ctx = max(_MIN_CTX, -(-n_ctx // 256) * 256)
        llm = Llama(
            model_path=key,
            n_ctx=ctx,
            n_batch=min(ctx, 512),
            logits_all=True,
            n_threads=N_THREADS,
            n_threads_batch=N_THREADS,
            verbose=False,
        )
        _LLAMAS[key] = llm
        return llm


def llama_quantize(src, dst, ftype: int, pure: bool = False, imatrix=None,
                   allow_requantize: bool = False) -> None:
    """llama.cpp's quantizer (llama_model_quantize) on the GGUF `src` to llama_ftype `ftype`,
    with an importance matrix given as {tensor name: per-column weights} (what llama-quantize
    hands it after loading a file: sum / count)."""
    import ctypes

    import llama_cpp

    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.pure, p.nthread, p.allow_requantize = ftype, pure, N_THREADS, allow_requantize
    keep = []      # the arrays and names stay alive through the call
    if imatrix:
        data = (llama_cpp.llama_model_imatrix_data * (len(imatrix) + 1))()   # NULL-terminated
        for i, (name, w) in enumerate(sorted(imatrix.items())):
            a = np.ascontiguousarray(w, dtype=np.float32)
            keep += [a, name.encode()]
            data[i].name, data[i].size = keep[-1], a.size
            data[i].data = a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        keep.append(data)
        p.imatrix = ctypes.cast(data, type(p.imatrix)) if p.imatrix is not None else ctypes.cast(data, ctypes.c_void_p)
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(p)) == 0


def llama_tokenize(path, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
    """llama.cpp tokenization. ``add_bos`` = llama.cpp's add_special (BOS only if the model asks)."""
    with _LOCK:
        llm = get_llama(path)
        return [int(t) for t in llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)]


def llama_detokenize(path, ids) -> str:
    with _LOCK:
        llm = get_llama(path)
        return llm.detokenize([int(i) for i in ids]).decode("utf-8", errors="replace")


def llama_logits(path, ids) -> np.ndarray:
    """Teacher-forced llama.cpp logits, float32 [len(ids), n_vocab], fresh sequence (cached; read-only)."""
    ids = [int(i) for i in ids]
    if not ids:
        raise ValueError("ids must be non-empty")
    ck = (_key(path), tuple(ids))
    hit = _LOGITS.get(ck)
    if hit is not None:
        return hit
    with _LOCK:
        llm = get_llama(path, n_ctx=len(ids))
        llm.reset()
        llm.eval(ids)
        out = np.array(llm.scores[: len(ids)], dtype=np.float32, copy=True)
        llm.reset()
    out.setflags(write=False)
    _LOGITS[ck] = out
    return out


def llama_greedy(path, prompt_ids, n: int, stop_at_eos: bool = False) -> list[int]:
    """Greedy (argmax) continuation of ``prompt_ids`` by llama.cpp: ``n`` new token ids."""
    prompt_ids = [int(i) for i in prompt_ids]
    with _LOCK:
        llm = get_llama(path, n_ctx=len(prompt_ids) + n)
        eos = llm.token_eos()
        llm.reset()
        llm.eval(prompt_ids)
        out: list[int] = []
        for _ in range(n):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            out.append(tok)
            if stop_at_eos and tok == eos:
                break
            llm.eval([tok])
        llm.reset()
    return out


def text_ids(path, texts: dict[str, str] | None = None, add_bos: bool = True) -> dict[str, list[int]]:
    """The evaluation texts (tests/support/texts.py) tokenized by llama.cpp: {name: ids}."""
    if texts is None:
        from tests.support.texts import TEXTS as texts  # noqa: N811
    return {name: llama_tokenize(path, t, add_bos=add_bos, special=False) for name, t in texts.items()}


# ----------------------------------------------------------------- metrics
def log_softmax(logits) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    z = x - m
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def kl_divergence(p_logits, q_logits) -> np.ndarray:
    """Per-token KL(p || q) in float64 from logits [n, vocab] (or [vocab]); returns [n]."""
    lp = log_softmax(p_logits)
    lq = log_softmax(q_logits)
    if lp.shape != lq.shape:
        raise ValueError(f"shape mismatch {lp.shape} vs {lq.shape}")
    return np.sum(np.exp(lp) * (lp - lq), axis=-1)


def top1_agreement(a_logits, b_logits) -> float:
    """Fraction of positions where the argmax tokens agree."""
    a = np.asarray(a_logits)
    b = np.asarray(b_logits)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch {a.shape} vs {b.shape}")
    return float(np.mean(np.argmax(a, axis=-1) == np.argmax(b, axis=-1)))


# Q8_0 files: where llama.cpp's top-2 logits are closer than this, the two runtimes' rounding
# (llama.cpp rounds activations to 8 bits) may order them either way.
Q8_0_TIE_GAP = 0.05


def top1_errors(ref_logits, other_logits, tie_gap: float) -> list[int]:
    """Positions where ``other``'s argmax is not ``ref``'s and ``ref`` puts it more than
    ``tie_gap`` below its own top logit (a wrong top token, not a near tie)."""
    ref = np.asarray(ref_logits, dtype=np.float64)
    other = np.asarray(other_logits)
    if ref.shape != other.shape:
        raise ValueError(f"shape mismatch {ref.shape} vs {other.shape}")
    picked = np.argmax(other, axis=-1)
    gap = ref.max(axis=-1) - np.take_along_axis(ref, picked[:, None], axis=-1)[:, 0]
    return [int(i) for i in np.flatnonzero(gap > tie_gap)]


def first_divergence(a, b) -> int | None:
    """Index of the first differing token of two sequences (None if equal, incl. length)."""
    a = list(a)
    b = list(b)
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def greedy_differences(path, seq, generate, offsets=(0, 50, 100, 150, 200), n_prompt: int = 10,
                       n: int = 32) -> list[tuple[int, list[int], list[int]]]:
    """Greedy continuations of pieces of a memorized sequence (tiny_checkpoints.memorize): for
    each offset, ``n`` tokens after ``seq[o:o + n_prompt]`` from ``generate(prompt, n)`` and from
    llama.cpp on ``path``; returns (offset, ours, llama.cpp's) where they differ."""
    diffs = []
    for o in offsets:
        prompt = [int(i) for i in seq[o:o + n_prompt]]
        ours, theirs = list(generate(prompt, n)), llama_greedy(path, prompt, n)
        if ours != theirs:
            diffs.append((o, ours, theirs))
    return diffs


def greedy_disagreements(path, prompt_ids, tokens, tie_gap: float) -> list[tuple[int, int, int, float]]:
    """Steps where greedy ``tokens`` (generated after ``prompt_ids``) are not llama.cpp's choice
    on ``path``, beyond near ties: (step, ours, llama.cpp's argmax, llama.cpp's logit gap between
    the two) wherever that gap exceeds ``tie_gap``.

    llama.cpp is teacher-forced on the prompt and our tokens, so every step is judged on the
    same history: a near tie taken the other way does not end the comparison (a free-running
    llama.cpp would continue a different text from there), and llama.cpp's own step-by-step
    and batched rows, which round differently, cannot disagree about which history is meant."""
    prompt_ids, tokens = [int(i) for i in prompt_ids], [int(t) for t in tokens]
    if not tokens:
        return []
    rows = llama_logits(path, prompt_ids + tokens[:-1])[len(prompt_ids) - 1:]
    out = []
    for i, (row, tok) in enumerate(zip(rows, tokens)):
        best = int(np.argmax(row))
        gap = float(row[best] - row[tok])
        if gap > tie_gap:
            out.append((i, tok, best, gap))
    return out


def compare_logits(exact, other) -> dict:
    """Summary of ``other`` against ``exact``: mean/max KL(exact||other) and top-1 agreement."""
    kl = kl_divergence(exact, other)
    return {"kl_mean": float(kl.mean()), "kl_max": float(kl.max()), "top1": top1_agreement(exact, other), "n": int(kl.size)}
