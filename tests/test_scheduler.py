"""The continuous-batching scheduler: batch invariance, prefix reuse, cancellation, the bounded
queue -- on the real model, and on a fake backend (tests/support/fake_backend.py) that pins down its
batching decisions without one."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import edgeinfer
from tests.support import fake_backend as fb
from edgeinfer.backends.base import KVPlan
from edgeinfer.engine.generation import DoneEvent, Generation
from edgeinfer.engine.kv import KVRing
from edgeinfer.engine.runner import Runner
from edgeinfer.engine.sampling import SamplingParams
from edgeinfer.engine.scheduler import QueueFullError, Scheduler, SchedulerClosedError
from edgeinfer.errors import NativeError, StateError
from tests.support.logprob_oracle import assert_logprobs_match, teacher_forced_rows
from tests.test_server import wait_idle

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
    snap = wait_idle(eng, timeout=10)   # the cancelled streams' slot, freed as an event
    assert snap["slots_busy"] == 0 and snap["queue_length"] == 0
    out = eng.generate(PROMPTS[3], max_tokens=3, temperature=0.0, ignore_eos=True)
    assert len(out.tokens) == 3 and out.finish_reason == "length"
    assert out.stats.queue_s >= 0 and out.stats.e2e_s >= out.stats.ttft_s
    eng.close()
    with pytest.raises(SchedulerClosedError):
        eng.scheduler.submit([1, 2], SamplingParams(), lambda events: None)


def test_logprobs_and_max_tokens_zero(smollm2_path):
    eng = edgeinfer.load(smollm2_path, n_ctx=64, n_threads=2, n_slots=2)
    ids = eng.tokenize(PROMPTS[1])
    out = eng.generate(ids, max_tokens=3, temperature=0.0, ignore_eos=True, logprobs=3)
    assert len(out.tokens) == 3
    assert_logprobs_match(teacher_forced_rows(eng.logits, ids, out.tokens), out.tokens, out.logprobs, n_top=3)
    assert all(lp.top[0][0] == tok for lp, tok in zip(out.logprobs, out.tokens))   # greedy: the most likely
    zero = eng.generate(PROMPTS[1], max_tokens=0)
    assert zero.tokens == [] and zero.finish_reason == "length"
    eng.close()


# --------------------------------------------------------------------------- on a fake backend
# tests/support/fake_backend.py: deterministic logits from the tokens a row attends to, no model.

FAKE_GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
FAKE_PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15, 16, 17], [5, 6, 7, 30], [20], [21, 22, 23, 24, 25]]


@pytest.fixture
def fake():
    """make(**kw) -> (scheduler, fake runtime); every scheduler is closed at the end."""
    made = []

    def make(n_slots=2, max_batch=8, n_ctx=64, max_queue=8, max_topk=0):
        rt = fb.FakeBackend(max_topk).create_runtime(None, None, KVPlan(n_slots, n_ctx, 0, max_batch))
        sched = Scheduler(Runner(rt), KVRing(n_slots, n_ctx, n_sink=0), fb.tokenizer(), max_queue=max_queue)
        made.append(sched)
        return sched, rt

    yield make
    for s in made:
        s.close()


def test_fake_concurrent_sequences_match_reference(fake):
    sched, rt = fake(n_slots=3, max_batch=5)
    gens = [Generation(sched, p, FAKE_GREEDY) for p in FAKE_PROMPTS]
    for p, g in zip(FAKE_PROMPTS, gens):
        assert g.result().tokens == fb.reference_greedy(p, 6)
    # 5 sequences on 3 slots of a 5-token budget: steps were shared
    assert sched.steps < sum(len(p) + 6 for p in FAKE_PROMPTS)
    assert all(len(b) <= 5 for b in rt.batches)


def test_fake_slot_reuse_keeps_the_longest_prefix(fake):
    sched, rt = fake(n_slots=2)
    a, b = FAKE_PROMPTS[0], FAKE_PROMPTS[3]
    assert Generation(sched, a, FAKE_GREEDY).result().tokens == fb.reference_greedy(a, 6)
    assert Generation(sched, b, FAKE_GREEDY).result().tokens == fb.reference_greedy(b, 6)
    again = Generation(sched, a, FAKE_GREEDY)
    assert again.result().tokens == fb.reference_greedy(a, 6)
    assert again.stats.cached_tokens == len(a) - 1          # all but the last prompt token reused
    longer = FAKE_PROMPTS[2]                                  # a + [30]: its slot holds a and more
    g = Generation(sched, longer, FAKE_GREEDY)
    assert g.result().tokens == fb.reference_greedy(longer, 6)
    assert g.stats.cached_tokens == len(a)
    assert rt.batches[-6].tokens.tolist() == [30]             # only the new token was fed


def test_fake_batches_put_decodes_first_within_the_budget(fake):
    sched, rt = fake(n_slots=2, max_batch=4)
    long, short = FAKE_PROMPTS[1], [40, 41, 42]
    rt.gate.clear()
    g_long = Generation(sched, long, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    assert rt.entered.acquire(timeout=30)                     # step 1 (long's first chunk) in flight
    g_short = Generation(sched, short, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    rt.gate.set()
    assert g_long.result().tokens == fb.reference_greedy(long, 3)
    assert g_short.result().tokens == fb.reference_greedy(short, 3)
    shape = [(b.slots.tolist(), b.out_rows.tolist()) for b in rt.batches[:5]]
    assert shape == [
        ([0] * 4, []),                    # long: prefill chunk of the whole budget
        ([0] * 4, []),                    # short was admitted, but long's chunk takes the budget
        ([0, 0, 1, 1], [1]),              # long's last 2 prompt tokens -> its first logits; short starts
        ([0, 1], [0, 1]),                 # long's decode token first, then short's last prompt token
        ([0, 1], [0, 1]),                 # both decode
    ]


def test_fake_queue_is_bounded_and_cancel_frees_the_slot(fake):
    sched, rt = fake(n_slots=1, max_queue=1)
    rt.gate.clear()
    running = Generation(sched, FAKE_PROMPTS[0], SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True))
    assert rt.entered.acquire(timeout=30)                     # admitted: holds the only slot
    waiting = Generation(sched, FAKE_PROMPTS[3], FAKE_GREEDY)
    with pytest.raises(QueueFullError):
        Generation(sched, FAKE_PROMPTS[4], FAKE_GREEDY)
    waiting.close()                                           # cancelled before it ever ran
    running.close()
    rt.gate.set()
    assert waiting.result().tokens == [] and running.finish_reason is None
    fresh = Generation(sched, FAKE_PROMPTS[4], FAKE_GREEDY)   # gets the freed slot
    assert fresh.result().tokens == fb.reference_greedy(FAKE_PROMPTS[4], 6)
    assert sched.drain(timeout_s=30)
    snap = sched.snapshot()
    assert snap["slots_busy"] == 0 and snap["queue_length"] == 0
    assert all(20 not in b.tokens.tolist() for b in rt.batches)   # the cancelled waiter never ran


def test_fake_cancelled_request_ends_with_cancelled(fake):
    sched, rt = fake(n_slots=1)
    events = []
    got = threading.Event()

    def sink(evs):
        events.extend(evs)
        if any(isinstance(e, DoneEvent) for e in evs):
            got.set()

    rt.gate.clear()
    req = sched.submit(FAKE_PROMPTS[0], SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True), sink)
    assert rt.entered.acquire(timeout=30)
    req.cancel()
    rt.gate.set()
    assert got.wait(30)
    assert [e.finish_reason for e in events if isinstance(e, DoneEvent)] == ["cancelled"]


def test_fake_device_top_k_serves_greedy_and_top_k_but_not_logprobs(fake):
    sched, rt = fake(n_slots=2, max_topk=8)
    greedy = Generation(sched, FAKE_PROMPTS[0], FAKE_GREEDY)
    top5 = Generation(sched, FAKE_PROMPTS[3], SamplingParams(max_tokens=6, temperature=1.0, top_k=5, seed=3,
                                                            ignore_eos=True))
    assert greedy.result().tokens == fb.reference_greedy(FAKE_PROMPTS[0], 6)
    sampled = top5.result().tokens
    assert rt.topk_calls and set(rt.topk_calls) <= {1, 5}
    # The same draws from whole rows on the host (max_topk=0), and logprobs always need whole rows.
    sched2, rt2 = fake(n_slots=2)
    again = Generation(sched2, FAKE_PROMPTS[3], SamplingParams(max_tokens=6, temperature=1.0, top_k=5, seed=3,
                                                               ignore_eos=True))
    assert again.result().tokens == sampled
    n_calls = len(rt.topk_calls)
    lp = Generation(sched, FAKE_PROMPTS[4], FAKE_GREEDY, n_logprobs=2)
    assert lp.result().tokens == fb.reference_greedy(FAKE_PROMPTS[4], 6) and len(rt.topk_calls) == n_calls


def test_fake_native_failure_reaches_the_consumer_and_frees_the_slot(fake):
    sched, rt = fake(n_slots=1)
    rt.fail_next = NativeError("forward failed (status 4): boom")
    with pytest.raises(NativeError, match="boom"):
        Generation(sched, FAKE_PROMPTS[0], FAKE_GREEDY).result()
    assert Generation(sched, FAKE_PROMPTS[0], FAKE_GREEDY).result().tokens == fb.reference_greedy(FAKE_PROMPTS[0], 6)


def test_fake_failed_admission_fails_that_request_and_the_loop_serves_on(fake, monkeypatch):
    """A refusal while a request is admitted (here: the runtime's prefix copy) ends that request
    with the error and returns its slot; the stepping loop keeps serving the next ones."""
    sched, rt = fake(n_slots=1)
    running_prefix = sched._running_prefix
    calls = iter([StateError("slot 0: its sliding-window ring lost position 6")])

    def refuse_once(ids, key):
        exc = next(calls, None)
        if exc is not None:
            raise exc
        return running_prefix(ids, key)

    monkeypatch.setattr(sched, "_running_prefix", refuse_once)
    got: list[BaseException] = []

    def first():
        try:
            Generation(sched, FAKE_PROMPTS[0], FAKE_GREEDY).result()
        except StateError as exc:
            got.append(exc)

    t = threading.Thread(target=first)
    t.start()
    t.join(timeout=60)   # a bound on a hang (the loop died), not a timing
    assert not t.is_alive() and len(got) == 1 and "lost position 6" in str(got[0])
    assert Generation(sched, FAKE_PROMPTS[0], FAKE_GREEDY).result().tokens == fb.reference_greedy(FAKE_PROMPTS[0], 6)


def test_fake_lease_feeds_a_fresh_slot_through_the_runner(fake):
    sched, rt = fake(n_slots=2)
    Generation(sched, FAKE_PROMPTS[0], FAKE_GREEDY).result()     # leaves tokens in a slot
    ids = FAKE_PROMPTS[1]
    with sched.lease_slot() as lease:
        out = np.vstack([lease.feed(ids[:4], np.arange(4, dtype=np.int32)),
                         lease.feed(ids[4:], np.arange(len(ids) - 4, dtype=np.int32))])
        assert sched.snapshot()["slots_busy"] == 1
    ref = np.array([fb._row(ids[:i + 1]) for i in range(len(ids))])
    np.testing.assert_array_equal(out, ref)
    assert not rt.cells[lease.slot] and sched.ring.cells_used(lease.slot) == 0   # emptied on the way out


def test_fake_stop_string_is_applied_off_the_stepping_thread(fake):
    sched, rt = fake(n_slots=1)
    prompt = FAKE_PROMPTS[4]
    ids = fb.reference_greedy(prompt, 12)
    full = sched.tokenizer.decode(ids)
    cut = len(sched.tokenizer.decode(ids[:5]))
    stop = full[cut - 2:cut + 3]                       # spans the end of token 5
    assert stop not in full[:cut - 2 + len(stop) - 1]
    gen = Generation(sched, prompt, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, stop=[stop]))
    text = gen.result().text
    assert gen.finish_reason == "stop" and text == full[:full.index(stop)]
    assert gen.tokens == ids[:len(gen.tokens)] and len(gen.tokens) < 12
    assert gen.stats.completion_tokens == len(gen.tokens)
    # The request ends in the scheduler too: its slot comes free, and the next one gets it.
    assert Generation(sched, prompt, FAKE_GREEDY).result().tokens == fb.reference_greedy(prompt, 6)


def test_fake_sinks_run_off_the_stepping_thread(fake):
    sched, rt = fake(n_slots=1)
    names = []
    done = threading.Event()

    def sink(evs):
        names.append(threading.current_thread().name)
        if any(isinstance(e, DoneEvent) for e in evs):
            done.set()

    sched.submit(FAKE_PROMPTS[0], FAKE_GREEDY, sink)
    assert done.wait(30)
    assert names and set(names) == {"edgeinfer-delivery"}
