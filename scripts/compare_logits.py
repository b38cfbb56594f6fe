#!/usr/bin/env python3
"""edgeinfer's logits against llama.cpp's on one GGUF file (any model, e.g. a random-weight
shape file from make_shape_model.py): teacher-forced logits of random token ids.

    python scripts/compare_logits.py FILE [--n 64] [--threads 2] [--seed 0]

Prints mean/max KL(llama.cpp || edgeinfer), top-1 agreement, and the largest logit
difference relative to the logits' spread (with --hf, also each engine's KL against
transformers on the source checkpoint); exits 1 when top-1 < --min-top1 or mean KL >
--max-kl (defaults: the limits tests/test_engine_accuracy.py holds on SmolLM2; on random
weights top-1 is noisy, since the leading logits are near-ties).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    lp, lq = _log_softmax(p_logits), _log_softmax(q_logits)
    return (np.exp(lp) * (lp - lq)).sum(-1)


def hf_logits(hf_dir: str, ids: list[int]) -> np.ndarray:
    """transformers' float32 logits of the checkpoint the file was made from (the oracle)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def compare(path: str, n: int = 64, threads: int = 2, seed: int = 0, hf: str | None = None) -> dict:
    import llama_cpp

    import edgeinfer

    eng = edgeinfer.load(path, n_ctx=max(256, n), n_threads=threads)
    try:
        n_vocab = eng.config.n_vocab
        ids = [int(x) for x in np.random.default_rng(seed).integers(min(100, n_vocab // 2), n_vocab, n)]
        ours = eng.logits(ids)
    finally:
        eng.close()
    llm = llama_cpp.Llama(model_path=path, n_ctx=max(256, n), n_batch=max(256, n), logits_all=True,
                          n_threads=threads, n_threads_batch=threads, verbose=False)
    try:
        llm.eval(ids)
        theirs = np.array(llm.scores[:n], dtype=np.float32)
    finally:
        llm.close()
    kl = _kl(theirs, ours)
    out = {}
    if hf:
        ref = hf_logits(hf, ids)[:, :n_vocab]
        out = {"kl_hf_edgeinfer": float(_kl(ref, ours).mean()), "kl_hf_llamacpp": float(_kl(ref, theirs).mean())}
    return {**out, "n": n, "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "top1": float((theirs.argmax(-1) == ours.argmax(-1)).mean()),
            "max_abs_diff_over_std": float(np.abs(theirs - ours).max() / theirs.std()),
            "logit_std": float(theirs.std(-1).mean()), "finite": bool(np.isfinite(ours).all())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--hf", help="the Hugging Face checkpoint the file was made from: also "
                    "compares both engines with transformers' float32 logits")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-top1", type=float, default=0.90)
    ap.add_argument("--max-kl", type=float, default=0.02)
    a = ap.parse_args()
    r = compare(a.model, a.n, a.threads, a.seed, a.hf)
    print(f"{Path(a.model).name}: {r['n']} tokens, KL mean {r['kl_mean']:.5f} max {r['kl_max']:.5f}, "
          f"top-1 {r['top1']:.3f}, max |diff| / std {r['max_abs_diff_over_std']:.3f}"
          + (f"; KL against transformers: edgeinfer {r['kl_hf_edgeinfer']:.5f}, llama.cpp "
             f"{r['kl_hf_llamacpp']:.5f}" if a.hf else ""))
    return 0 if r["finite"] and r["top1"] >= a.min_top1 and r["kl_mean"] <= a.max_kl else 1


if __name__ == "__main__":
    raise SystemExit(main())
