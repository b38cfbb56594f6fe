"""How close the CUDA backend's logits must be to the CPU backend's on the tiny families (the
bounds tests/test_cuda.py, test_cuda_lora.py and test_cuda_hybrid.py share)."""
from __future__ import annotations

import numpy as np

from .llama_oracle import kl_divergence

NMSE_MAX, KL_MAX, TOP1_MIN = 1e-5, 1e-4, 0.95


def nmse(ref, got) -> float:
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    assert np.isfinite(got).all(), "NaN or inf in the CUDA output"
    return float(np.sum((ref - got) ** 2) / max(np.sum(ref ** 2), 1e-30))


def kl(ref, got) -> float:
    """Mean KL(ref || got) of the rows' softmaxes."""
    return float(kl_divergence(ref, got).mean())


def assert_close(ref, got, what) -> None:
    top1 = float(np.mean(ref.argmax(axis=1) == got.argmax(axis=1)))
    assert nmse(ref, got) <= NMSE_MAX and kl(ref, got) <= KL_MAX and top1 >= TOP1_MIN, \
        (what, nmse(ref, got), kl(ref, got), top1)


def assert_steps_match(rt, ref, ids, tag, interleave: bool) -> None:
    """A runtime's token-by-token decode in slot 1 and, with `interleave`, slots 0 and 1's rows
    interleaved in one step (each slot's rows continue its own state) against `ref`, the logits of
    `ids` in one prefill."""
    from edgeinfer.backends import Batch

    rt.clear_slot(1)
    decode = np.array([rt.forward(Batch([t], [1], [i], [i], [0]))[0].copy() for i, t in enumerate(ids)])
    assert_close(ref, decode, (*tag, "decode"))
    if interleave:
        rt.clear_slot(0)
        rt.clear_slot(1)
        n = len(ids)
        toks = [t for t in ids for _ in range(2)]
        slots, pos = [0, 1] * n, [i for i in range(n) for _ in range(2)]
        got = rt.forward(Batch(toks, slots, pos, pos, list(range(2 * n))))
        assert_close(ref, got[0::2], (*tag, "interleaved slot 0"))
        assert_close(ref, got[1::2], (*tag, "interleaved slot 1"))
