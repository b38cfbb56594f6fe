"""The continuous-batching scheduler on the real model: batch invariance, prefix reuse,
cancellation, the bounded queue."""
from __future__ import annotations

import threading
import time

import pytest

import edgeinfer
from edgeinfer.engine.sampling import SamplingParams
from edgeinfer.engine.scheduler import QueueFullError, SchedulerClosedError

PROMPTS = [
    "The history of the printing press begins",
    "Water boils at",
    "def fibonacci(n):",
    "My favourite colour is",
    "The capital of France is",
    "Once upon a time, in a small village,",
    "import numpy as np\n",
    "The three laws of motion are",
]
GREEDY = dict(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def alone(smollm2_path):
    """Each prompt generated alone on a one-slot engine (the reference)."""
    eng = edgeinfer.load(smollm2_path, n_ctx=128, n_threads=2, n_slots=1)
    out = {p: eng.generate(p, **GREEDY).tokens for p in PROMPTS}
    eng.close()
    return out


def _run_concurrently(eng, prompts, **kw):
    results, errors = {}, []

    def work(p):
        try:
            results[p] = eng.generate(p, **kw).tokens
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    return results


@pytest.mark.slow
def test_eight_concurrent_equal_alone_and_share_steps(smollm2_path, alone):
    eng = edgeinfer.load(smollm2_path, n_ctx=128, n_threads=2, n_slots=8)
    got = _run_concurrently(eng, PROMPTS, **GREEDY)
    assert got == alone
    # Batched: far fewer steps than 8 sequences run one after another would need.
    assert eng.scheduler.steps < 8 * (GREEDY["max_tokens"] + 1)
    eng.close()


@pytest.mark.slow
def test_chunked_prefill_and_prefix_reuse_are_invariant(smollm2_path, alone):
    # max_batch=5: prompts are fed in chunks of various sizes next to other sequences' decodes.
    eng = edgeinfer.load(smollm2_path, n_ctx=128, n_threads=2, n_slots=3, max_batch=5)
    got = _run_concurrently(eng, PROMPTS[:5], **GREEDY)
    assert got == {p: alone[p] for p in PROMPTS[:5]}
    # Prefix reuse: the same prompt again reuses all but its last token.
    p = PROMPTS[0]
    assert eng.generate(p, **GREEDY).tokens == alone[p]
    gen = eng.stream(p, **GREEDY)
    assert gen.result().tokens == alone[p]
    assert gen.stats.cached_tokens == len(eng.tokenize(p)) - 1
    # A longer prompt sharing a prefix with a slot: reuse, and the same tokens as a fresh engine.
    longer = p + " in Mainz"
    g2 = eng.stream(longer, **GREEDY)
    toks = g2.result().tokens
    assert g2.stats.cached_tokens >= len(eng.tokenize(p)) - 1
    fresh = edgeinfer.load(smollm2_path, n_ctx=128, n_threads=2, n_slots=1)
    assert fresh.generate(longer, **GREEDY).tokens == toks
    eng.close()
    fresh.close()


def test_cancel_frees_slot_and_queue_is_bounded(smollm2_path):
    eng = edgeinfer.load(smollm2_path, n_ctx=128, n_threads=2, n_slots=1, max_queue=1)
    long = dict(max_tokens=100, temperature=0.0, ignore_eos=True)
    running = eng.stream(PROMPTS[0], **long)
    next(running)                                  # holds the only slot
    waiting = eng.stream(PROMPTS[1], **long)       # fills the queue
    with pytest.raises(QueueFullError):
        eng.stream(PROMPTS[2], **long)
    waiting.close()
    running.close()
    deadline = time.time() + 10
    while eng.scheduler.snapshot()["slots_busy"] and time.time() < deadline:
        time.sleep(0.01)
    snap = eng.scheduler.snapshot()
    assert snap["slots_busy"] == 0 and snap["queue_length"] == 0
    out = eng.generate(PROMPTS[3], max_tokens=3, temperature=0.0, ignore_eos=True)
    assert len(out.tokens) == 3 and out.finish_reason == "length"
    assert out.stats.queue_s >= 0 and out.stats.e2e_s >= out.stats.ttft_s
    eng.close()
    with pytest.raises(SchedulerClosedError):
        eng.scheduler.submit([1, 2], SamplingParams(), lambda events: None)


def test_logprobs_and_max_tokens_zero(smollm2_path):
    eng = edgeinfer.load(smollm2_path, n_ctx=64, n_threads=2, n_slots=2)
    out = eng.generate(PROMPTS[1], max_tokens=3, temperature=0.0, ignore_eos=True, logprobs=3)
    assert len(out.logprobs) == 3
    for lp, tok in zip(out.logprobs, out.tokens):
        assert lp.token == tok and lp.logprob <= 0
        assert len(lp.top) == 3 and lp.top[0][0] == tok      # greedy picks the most likely
    zero = eng.generate(PROMPTS[1], max_tokens=0)
    assert zero.tokens == [] and zero.finish_reason == "length"
    eng.close()
