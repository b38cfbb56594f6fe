"""The per-sequence state seam (engine/states.py) on the fake backend: KV cells alone, and KV
cells plus a recurrent state (tests/support/fake_backend.py: a running CRC of the tokens fed,
which moves the logits when it is wrong). Prefix reuse, n > 1 siblings copying a prompt and
speculative rollback must give the tokens of a fresh sequence (`reference_greedy`), and must
have gone through the seam (a kept state restored or copied) rather than around it."""
from __future__ import annotations

import random

import pytest

from edgeinfer.backends.base import KVPlan
from edgeinfer.engine.generation import Generation
from edgeinfer.engine.kv import KVRing
from edgeinfer.engine.runner import Runner
from edgeinfer.engine.sampling import SamplingParams
from edgeinfer.engine.scheduler import Scheduler
from tests.support import fake_backend as fb

N_NEW = 8
GREEDY = SamplingParams(max_tokens=N_NEW, temperature=0.0, ignore_eos=True)
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]


@pytest.fixture
def make():
    """make(recurrent, ...) -> (scheduler, fake runtime); every scheduler is closed at the end."""
    made = []

    def make(recurrent: bool, n_slots: int = 2, max_batch: int = 16, speculative: str | None = None):
        rt = fb.FakeBackend(copy_prefix=True, recurrent=recurrent).create_runtime(
            None, None, KVPlan(n_slots, 64, 0, max_batch))
        sched = Scheduler(Runner(rt), KVRing(n_slots, 64, n_sink=0), fb.tokenizer(), max_batch=max_batch,
                          speculative=speculative, spec_max_slots=n_slots)
        made.append(sched)
        return sched, rt

    yield make
    for s in made:
        s.close()


def _run(sched, prompt):
    return Generation(sched, prompt, GREEDY).result().tokens


@pytest.mark.parametrize("recurrent", [False, True], ids=["kv", "kv+recurrent"])
def test_prefix_reuse_resumes_where_the_state_is_exact(make, recurrent):
    """A slot that held a prompt serves the same prompt, a longer one and one that diverges early:
    each resumes from what the slot holds exactly (with a recurrent state: the state kept after
    the prompt's last-but-one token) and gets a fresh sequence's tokens."""
    sched, rt = make(recurrent, n_slots=1)
    assert _run(sched, PROMPT) == fb.reference_greedy(PROMPT, N_NEW)
    cases = [(PROMPT, len(PROMPT) - 1),                           # the same prompt: all but its last token
             (PROMPT + [40, 41], len(PROMPT) - 1 if recurrent else len(PROMPT)),
             (PROMPT[:5] + [42], 0 if recurrent else 5)]           # no state kept at 5: start over
    for prompt, resumed in cases:
        first = len(rt.batches)
        assert _run(sched, prompt) == fb.reference_greedy(prompt, N_NEW)
        assert int(rt.batches[first].pos[0]) == resumed, prompt
    if recurrent:
        assert (0, len(PROMPT) - 1) in rt.restores


@pytest.mark.parametrize("recurrent", [False, True], ids=["kv", "kv+recurrent"])
def test_a_sibling_copies_the_running_prompt(make, recurrent):
    """n > 1: a request arriving while another runs the same prompt copies its cells (and the
    state it kept) instead of computing the prompt again; both get a fresh sequence's tokens."""
    sched, rt = make(recurrent)
    rt.gate.clear()
    first = Generation(sched, PROMPT, GREEDY)
    rt.entered.acquire()                 # the first request's prefill is in its forward
    second = Generation(sched, PROMPT, GREEDY)   # admitted at the next step, the prompt in a slot
    rt.gate.set()
    want = fb.reference_greedy(PROMPT, N_NEW)
    assert first.result().tokens == want and second.result().tokens == want
    assert [n for _, _, n in rt.copies] == [len(PROMPT) - 1]
    assert sum(len(b) for b in rt.batches) == len(PROMPT) + 1 + 2 * (N_NEW - 1)   # one prefill, one last token


class _Proposer:
    """Drafts: a random run of the true continuation, then wrong tokens (a rollback every time
    one is rejected)."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def propose(self, history, k):
        good = fb.reference_greedy(history, k)[:self.rng.randint(0, k - 1)]
        return good + [self.rng.randrange(3, fb.N_VOCAB) for _ in range(k - len(good))]


def _speculate(make, recurrent: bool) -> tuple[list[list[int]], list[list[int]], object]:
    sched, rt = make(recurrent, speculative="lookup")
    sched.policy.fixed_k = 4
    sched.lookup = _Proposer(7)
    prompts = [PROMPT, [20, 21, 22], [30, 31, 32, 33, 34]]
    gens = [Generation(sched, p, GREEDY) for p in prompts]
    assert sched.output.spec_proposed >= 0
    got = [g.result().tokens for g in gens]
    assert sched.output.spec_accepted < sched.output.spec_proposed   # some drafts were rolled back
    return got, [fb.reference_greedy(p, N_NEW) for p in prompts], rt


@pytest.mark.parametrize("recurrent", [False, True], ids=["kv", "kv+recurrent"])
def test_speculative_rollback_restores_the_state(make, recurrent):
    """Rejected drafts are rolled back: the cells forgotten and the recurrent state restored to
    the one kept after the last confirmed token; the output is plain decoding's."""
    got, want, rt = _speculate(make, recurrent)
    assert got == want
    assert bool(rt.restores) == recurrent


def test_a_skipped_restore_changes_the_output(make, monkeypatch):
    """The fake recurrent state is an oracle with teeth: a rollback that leaves the drafts in
    the state gives other tokens."""
    monkeypatch.setattr(fb.FakeRuntime, "restore_state", lambda self, slot, n: None)
    got, want, _ = _speculate(make, True)
    assert got != want
