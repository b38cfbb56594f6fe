"""The logprob oracle: what a generation reports as logprobs against log_softmax of the model's
logits at each step, computed on an independent path.

What edgeinfer reports (edgeinfer/engine/generation.py, token_logprob) is OpenAI's `logprobs`:
the log-probabilities of the model's own distribution -- the raw logits at temperature 1,
before penalties, logit_bias, masks and the sampler's filters. So the oracle is plain
log_softmax of teacher-forced logits, whatever the request's sampling settings.

    rows = teacher_forced_rows(eng.logits, prompt_ids, out.tokens)
    assert_logprobs_match(rows, out.tokens, out.logprobs, n_top=5)
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from tests.support.llama_oracle import log_softmax

# Float tolerance only: the CPU kernels give a decode step's row and a teacher-forced prefill's
# row of the same tokens bit for bit (measured on SmolLM2 Q4_1: 3e-15 after log_softmax).
ATOL = 1e-4


def teacher_forced_rows(logits: Callable[[Sequence[int]], np.ndarray], prompt_ids: Sequence[int],
                        tokens: Sequence[int]) -> np.ndarray:
    """The logits each generated token was drawn from, [len(tokens), n_vocab]: `logits` (e.g.
    Engine.logits, or llama_oracle.llama_logits on the same file) teacher-forced on the prompt
    and every generated token but the last."""
    ids = [int(t) for t in prompt_ids] + [int(t) for t in tokens[:-1]]
    return np.asarray(logits(ids))[len(prompt_ids) - 1:]


def logprob_errors(rows: np.ndarray, tokens: Sequence[int], logprobs, n_top: int,
                   atol: float = ATOL) -> list[str]:
    """What in `logprobs` (TokenLogprob per token) disagrees with log_softmax(rows): the
    token, its logprob, and the n_top alternatives (the top-n of the oracle, up to near ties
    within atol at the cut, each with the oracle's value, most likely first)."""
    ref = log_softmax(rows)
    errors: list[str] = []
    if len(logprobs) != len(tokens) or ref.shape[0] != len(tokens):
        return [f"{len(logprobs)} logprobs, {len(tokens)} tokens, {ref.shape[0]} oracle rows"]
    for i, (lp, tok) in enumerate(zip(logprobs, tokens)):
        want = ref[i]
        if lp.token != tok:
            errors.append(f"step {i}: logprob of token {lp.token}, generated {tok}")
        if abs(lp.logprob - want[tok]) > atol:
            errors.append(f"step {i}: token {tok} logprob {lp.logprob:.5f}, oracle {want[tok]:.5f}")
        top_ids = [t for t, _ in lp.top]
        top_vals = np.array([v for _, v in lp.top])
        if len(lp.top) != n_top:
            errors.append(f"step {i}: {len(lp.top)} alternatives, asked for {n_top}")
            continue
        if n_top == 0:
            continue
        cut = np.sort(want)[-n_top]             # the oracle's n_top-th largest logprob
        if np.any(np.abs(top_vals - want[top_ids]) > atol):
            errors.append(f"step {i}: alternatives {lp.top} vs oracle {[float(want[t]) for t in top_ids]}")
        elif np.any(want[top_ids] < cut - atol) or len(set(top_ids)) != n_top:
            errors.append(f"step {i}: alternatives {top_ids} are not the oracle's top {n_top} "
                          f"{list(np.argsort(-want)[:n_top])}")
        elif np.any(np.diff(top_vals) > 0):
            errors.append(f"step {i}: alternatives not most likely first: {lp.top}")
    return errors


def assert_logprobs_match(rows: np.ndarray, tokens: Sequence[int], logprobs, n_top: int,
                          atol: float = ATOL) -> None:
    errors = logprob_errors(rows, tokens, logprobs, n_top, atol)
    assert not errors, "\n".join(errors[:10])
