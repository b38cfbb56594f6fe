"""Speculative decoding (engine/speculative.py; OutputProcessor._verify, engine/output.py): greedy
output equals plain decoding token for token (real model, both proposers, one and several slots, across a ring
slide), sampled output has the model's own distribution (chi-square against the softmax of
the model's logits), and the ring stays coherent under random propose/accept/reject sequences
(a fuzz against a Python model of what each slot must hold)."""
from __future__ import annotations

import random
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from tests.support.strict import require

import edgeinfer
from tests.support import fake_backend as fb
from edgeinfer.backends.base import KVPlan
from edgeinfer.engine.generation import Generation
from edgeinfer.engine.kv import KVRing, slack_cells
from edgeinfer.engine.runner import Runner
from edgeinfer.engine.sampling import SamplingParams
from edgeinfer.engine.scheduler import Scheduler
from edgeinfer.engine.speculative import PromptLookup, SlotSpec, SpecPolicy
from tests.support.texts import PROMPTS, TEXTS



# --------------------------------------------------------------------------- units

def test_prompt_lookup_proposes_what_followed_the_latest_longest_match():
    look = PromptLookup(max_ngram=3)
    cases = [
        # (history, k, proposal)
        ([1, 2, 3, 4, 5, 1, 2, 3], 2, [4, 5]),              # trigram match
        ([1, 2, 3, 9, 1, 2, 7, 1, 2, 3], 3, [9, 1, 2]),      # the trigram beats the later bigram
        ([5, 6, 1, 7, 6, 1, 8, 6, 1], 4, [8, 6, 1]),         # the latest bigram; stops at the end
        ([4, 4, 4, 4], 3, [4]),                               # overlapping occurrence
        ([1, 2, 3], 3, []),                                   # nothing repeats
        ([7], 3, []),
        ([1, 2, 1, 2], 0, []),
    ]
    for history, k, want in cases:
        assert look.propose(history, k) == want, history


def test_policy_speculates_only_where_it_pays():
    pol = SpecPolicy(max_k=6, probe_every=4)
    for n, t in {1: 0.030, 2: 0.034, 3: 0.038, 5: 0.046, 7: 0.054}.items():
        pol.costs.observe_step(n, t)
    good = SlotSpec("lookup")
    for _ in range(20):
        good.record(4, 4)
    assert pol.choose_k(good, n_batch=1, n_others=0, k_limit=6, drafted=False) >= 4
    assert pol.choose_k(good, n_batch=1, n_others=0, k_limit=2, drafted=False) == 2
    assert pol.choose_k(good, n_batch=1, n_others=0, k_limit=0, drafted=False) == 0
    bad = SlotSpec("lookup")
    for _ in range(20):
        bad.record(4, 0)
    assert pol.choose_k(bad, n_batch=1, n_others=0, k_limit=6, drafted=False) == 0
    # switched off: plain steps, then one small probe
    assert [pol.choose_k(bad, 1, 0, 6, False) for _ in range(4)] == [0, 0, 0, 2]
    # a draft model whose tokens cost as much as a step never pays, even when always right
    pol.costs.observe_draft(4, 4 * 0.030)
    assert pol.choose_k(good, n_batch=1, n_others=0, k_limit=6, drafted=True) == 0


def test_a_sliding_ring_rolls_back_within_its_slack_only():
    """Slack cells belong to a ring that slides; once it has wrapped, the owner may roll back
    up to slack + 1 positions (a token and its drafts) and keep its place, further means
    starting over; prefix reuse by another request never sees a wrapped slot."""
    with pytest.raises(ValueError, match="only a sliding ring has slack"):
        KVRing(1, 16, n_sink=2, overflow="stop", slack=4)
    ring = KVRing(1, 16, n_sink=2, overflow="slide", slack=4)
    assert (ring.cells, ring.window, ring.max_chunk(0)) == (20, 14, 20)
    hist = list(range(100, 140))
    ring.reserve(0, hist[:20])
    assert not ring.slots[0].wrapped and ring.max_chunk(0) == 5       # full: slack + 1 a chunk
    pos, cells = ring.reserve(0, hist[20:25])
    assert ring.slots[0].wrapped and list(cells) == [2, 3, 4, 5, 6]  # past the sinks, oldest first
    assert ring.common_prefix(0, hist) == 0                            # no prefix reuse once wrapped
    assert ring.resume_point(0, hist[:23] + [7, 7]) == 23              # a rejected draft: roll back 2
    assert ring.truncate(0, 23) == 23 and ring.slots[0].n_past == 23 and ring.slots[0].wrapped
    ring.reserve(0, hist[23:28])
    assert ring.resume_point(0, hist[:22]) is None                     # 6 back: beyond the slack
    assert ring.truncate(0, 22) == 0 and ring.slots[0].n_past == 0 and not ring.slots[0].wrapped


# --------------------------------------------------------------------------- fuzz on the fake backend

class FuzzProposer:
    """Random proposals: a random-length run of the true greedy continuation (as the fake
    backend defines it) followed by random wrong tokens; sometimes nothing."""

    def __init__(self, rng: random.Random, truth):
        self.rng = rng
        self.truth = truth
        self.calls = 0

    def propose(self, history, k):
        self.calls += 1
        r = self.rng
        if r.random() < 0.15:
            return []
        n = r.randint(1, k)
        good = self.truth(history, n)[:r.randint(0, n)]
        return good + [r.randrange(3, fb.N_VOCAB) for _ in range(n - len(good))]


def _windowed_greedy(history: list[int], n: int, n_sink: int, window: int | None) -> list[int]:
    """The fake backend's greedy continuation when each token sees the sinks and the last
    `window` positions (None: everything)."""
    seq = list(history)
    for _ in range(n):
        p = len(seq) - 1
        ctx = seq if window is None else [t for i, t in enumerate(seq) if i < n_sink or i > p - window]
        seq.append(int(np.argmax(fb._row(ctx))))
    return seq[len(history):]


class CheckedRuntime:
    """Wraps the fake runtime: before each forward, every slot in the batch must hold exactly
    its sequence's tokens at the positions below the batch's first row for it (within the
    window once it slid), and no cell of a later position (a rollback that forgot nothing)."""

    def __init__(self, rt, ring: KVRing):
        self.rt, self.ring = rt, ring
        self.caps = rt.caps
        self.sched: Scheduler | None = None
        self.checked = 0
        self.ahead_after_slide = 0      # batches of several tokens of a slot whose ring has slid

    def __getattr__(self, name):
        return getattr(self.rt, name)

    def forward(self, batch, logits=None):
        self._check(batch)
        return self.rt.forward(batch, logits)

    def forward_topk(self, batch, k):
        self._check(batch)
        return self.rt.forward_topk(batch, k)

    def _check(self, batch):
        ring = self.ring
        by_slot = {r.slot: r for r in self.sched._active if r.slot is not None}
        for s in set(int(x) for x in batch.slots):
            rows = np.flatnonzero(batch.slots == s)
            p0 = int(batch.pos[rows[0]])
            hist = by_slot[s].seq.history
            assert list(batch.tokens[rows]) == hist[p0:p0 + len(rows)][:1] + list(batch.tokens[rows][1:])
            assert int(batch.tokens[rows[0]]) == hist[p0]
            # what the first row sees besides itself: the sinks and its window, once the ring slid
            lo = p0 - ring.window if ring.overflow == "slide" else 0
            want = {p: hist[p] for p in range(p0) if p < ring.n_sink or p > lo}
            held = {pos: tok for pos, tok in self.rt.cells[s].values()}
            before = {p: t for p, t in held.items() if p < p0}
            assert want.items() <= before.items(), (s, p0)
            assert all(hist[p] == t for p, t in before.items()), (s, p0)   # slack cells: older history
            assert not [p for p in held if p >= p0], (s, p0, sorted(held))
            self.checked += 1
            self.ahead_after_slide += len(rows) > 1 and p0 >= ring.cells


def _fake_scheduler(n_slots, n_ctx, n_sink, overflow, max_batch, speculative, max_topk=0):
    slack = slack_cells(overflow, max_batch)
    rt = fb.FakeBackend(max_topk).create_runtime(None, None, KVPlan(n_slots, n_ctx, n_sink, max_batch, slack=slack))
    ring = KVRing(n_slots, n_ctx, n_sink=n_sink, overflow=overflow, slack=slack)
    checked = CheckedRuntime(rt, ring)
    sched = Scheduler(Runner(checked), ring, fb.tokenizer(), speculative=speculative,
                      spec_max_slots=n_slots, max_batch=max_batch)
    checked.sched = sched
    return sched, checked


def test_fuzz_propose_accept_reject_keeps_the_ring_coherent():
    """Random prompts (sharing prefixes with earlier prompts and outputs, so cells written by
    verified drafts are reused), random proposals, 1-3 slots running at once, stop and slide
    rings, logits rows or device top-k candidates: the output equals plain decoding's and each
    slot holds exactly what its next token sees (its window, once the ring slid)."""
    rng = random.Random(1234)
    n_checked = 0
    for case in range(6):
        overflow = "slide" if case % 2 else "stop"
        n_slots = 1 + case % 3
        n_ctx = 48
        topk = 16 if case >= 3 else 0       # the last cases sample from device top-k candidates
        spec, checked = _fake_scheduler(n_slots, n_ctx, 4, overflow, 12, "lookup", max_topk=topk)
        plain, _ = _fake_scheduler(1, n_ctx, 4, overflow, 12, None)
        spec.policy.fixed_k = 6
        window = spec.ring.window if overflow == "slide" else None
        spec.lookup = FuzzProposer(rng, lambda h, n: _windowed_greedy(h, n, 4, window))
        pool: list[list[int]] = [[rng.randrange(3, fb.N_VOCAB) for _ in range(rng.randint(1, 12))]]
        try:
            for _round in range(4):
                reqs = []
                for _ in range(n_slots + 1):
                    base = rng.choice(pool)
                    prompt = base[:rng.randint(1, len(base))] + [rng.randrange(3, fb.N_VOCAB)
                                                                 for _ in range(rng.randint(0, 4))]
                    temp = rng.choice([0.0, 0.9])
                    n_new = rng.randint(1, 90) if overflow == "slide" else rng.randint(1, n_ctx - len(prompt))
                    params = SamplingParams(max_tokens=n_new, temperature=temp, seed=rng.randrange(1000),
                                            top_k=8, ignore_eos=True)
                    reqs.append((prompt, params))
                gens = [Generation(spec, p, sp) for p, sp in reqs]
                outs = [g.result().tokens for g in gens]
                for (prompt, params), got in zip(reqs, outs):
                    want = Generation(plain, prompt, params).result().tokens
                    assert got == want, (case, prompt, params)
                    pool.append(prompt + got)
            assert spec.output.spec_proposed > spec.output.spec_accepted > 0
            assert bool(checked.rt.topk_calls) == bool(topk)
            assert (checked.ahead_after_slide > 0) == (overflow == "slide")   # drafts verified after a slide
            n_checked += checked.checked
        finally:
            spec.close()
            plain.close()
    assert n_checked > 100


# --------------------------------------------------------------------------- the real model, greedy

GREEDY = dict(max_tokens=24, temperature=0.0, ignore_eos=True)


def _prompts_50() -> list[str]:
    """50 prompts; most invite copying (so proposals get both confirmed and rejected)."""
    sentences = [s.strip() for t in TEXTS.values() for s in t.replace("\n", " ").split(". ") if len(s) > 40]
    out = list(PROMPTS)
    i = 0
    while len(out) < 50:
        s = sentences[(i // 2) % len(sentences)]
        out.append(f"Text: {s}.\nRepeat the text word for word.\nText: " if i % 2 == 0
                   else f"{s}. {s[:len(s) // 2]}")
        i += 1
    return out[:50]


def _generate_all(eng, prompts, concurrent: bool, **kw) -> list[list[int]]:
    if not concurrent:
        return [eng.generate(p, **kw).tokens for p in prompts]
    out: list = [None] * len(prompts)
    errors: list = []
    n = eng.ring.n_slots

    def work(i0):
        try:
            for i in range(i0, len(prompts), n):
                out[i] = eng.generate(prompts[i], **kw).tokens
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    assert not errors, errors
    return out


@pytest.fixture(scope="module")
def target_and_draft(smollm2_path) -> tuple[Path, Path]:
    """SmolLM2's Q8_0 file and its Q4_0 file to draft for it, made by llama.cpp's quantizer
    (scripts/make_quants.py) into the model cache when missing."""
    require("llama_cpp", "llama.cpp's quantizer makes the Q8_0 and Q4_0 files")
    script = Path(__file__).resolve().parents[1] / "scripts" / "make_quants.py"
    r = subprocess.run([sys.executable, str(script), "q8_0", "q4_0", "--src", str(smollm2_path)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    target, draft = (Path(line) for line in r.stdout.split())
    assert target.name.endswith("Q8_0.gguf") and draft.name.endswith("Q4_0.gguf"), r.stdout
    return target, draft


@pytest.mark.slow
def test_greedy_speculative_equals_plain_on_50_prompts(target_and_draft):
    """Q8_0 with the Q4_0 file drafting; plain, lookup and draft on one slot, then lookup and
    draft with four slots decoding at once (speculation allowed for all four)."""
    target, draft = target_and_draft
    prompts = _prompts_50()
    assert len(set(prompts)) == 50
    eng = edgeinfer.load(target, n_ctx=256, n_threads=2, n_slots=4, draft=draft, spec_max_slots=4)
    try:
        eng.fix_speculation(4)      # verify every step (the adaptive switch may not)
        plain = _generate_all(eng, prompts, False, **GREEDY)
        for mode in ("lookup", "draft"):
            for concurrent in (False, True):
                before = (eng.scheduler.output.spec_proposed, eng.scheduler.output.spec_accepted)
                got = _generate_all(eng, prompts, concurrent, speculative=mode, **GREEDY)
                diff = [i for i in range(50) if got[i] != plain[i]]
                assert not diff, (mode, concurrent, diff[:5])
                proposed = eng.scheduler.output.spec_proposed - before[0]
                accepted = eng.scheduler.output.spec_accepted - before[1]
                assert proposed > accepted > 0, (mode, concurrent, proposed, accepted)
    finally:
        eng.close()


@pytest.mark.slow
def test_greedy_speculative_equals_plain_across_a_ring_slide(target_and_draft):
    """A 64-cell sliding ring and 160 generated tokens per prompt, one slot and then two
    decoding at once: both proposers keep speculating after the ring slid (drafts verified and
    accepted, rejected cells rolled back, past the slide) and the output is plain decoding's."""
    target, draft = target_and_draft
    eng = edgeinfer.load(target, n_ctx=64, n_threads=2, n_slots=2, n_sink=4, overflow="slide", draft=draft,
                         spec_max_slots=2)
    prompts = ["Repeat after me: one two three four five six seven eight nine ten. One two three",
               "Copy this list: apples, pears, plums, figs, grapes, limes. Copy: apples, pears,",
               "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the",
               "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef"]
    after_slide = {"accepted": 0, "proposed": 0}
    verify = eng.scheduler.output._verify

    def counting_verify(r, out, row0, drafts, k):     # what speculation did on slid rings
        sched, slid = eng.scheduler, eng.ring.slots[r.slot].wrapped
        before = (sched.output.spec_proposed, sched.output.spec_accepted)
        result = verify(r, out, row0, drafts, k)
        if slid:
            after_slide["proposed"] += sched.output.spec_proposed - before[0]
            after_slide["accepted"] += sched.output.spec_accepted - before[1]
        return result

    eng.scheduler.output._verify = counting_verify
    try:
        eng.fix_speculation(4)
        kw = dict(max_tokens=160, temperature=0.0, ignore_eos=True)
        plain = _generate_all(eng, prompts, False, **kw)
        for mode in ("lookup", "draft"):
            for concurrent in (False, True):
                after_slide.update(accepted=0, proposed=0)
                got = _generate_all(eng, prompts, concurrent, speculative=mode, **kw)
                assert got == plain, (mode, concurrent, [i for i in range(len(got)) if got[i] != plain[i]])
                assert after_slide["proposed"] > after_slide["accepted"] > 50, (mode, concurrent, after_slide)
    finally:
        eng.close()


# --------------------------------------------------------------------------- the real model, sampled

# Each request samples with a seed; the verifier replays the sequence's random stream row by
# row, so speculative output must be plain decoding's tokens, seed for seed (docs/speculative.md).
SAMPLED = {
    "top_p": dict(temperature=0.8, top_k=0, top_p=0.9, min_p=0.0),
    "min_p": dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.1),
    "top_k": dict(temperature=0.7, top_k=20, top_p=0.95, min_p=0.05),
    # a short window: the recent tokens are penalised, the copied ones mostly not, so drafts pass
    "penalties": dict(temperature=0.7, top_k=40, repeat_penalty=1.15, presence_penalty=0.3,
                      frequency_penalty=0.2, penalty_last_n=8),
    "logit_bias": dict(temperature=0.8, top_k=40),      # the bias: _bias_of below
}
COPY_PROMPTS = ["Copy this list: apples, pears, plums, figs, grapes, limes. Copy: apples, pears,",
                "Repeat after me: one two three four five six seven eight nine ten. One two three",
                "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef"]


def _bias_of(ids: list[int]) -> dict[int, float]:
    """A bias that changes the text: the prompt's 4th token pushed up, its 6th banned."""
    return {ids[3]: 3.0, ids[5]: -100.0}


@pytest.fixture(scope="module")
def target_and_q4_1_draft(target_and_draft, smollm2_path) -> tuple[Path, Path]:
    """SmolLM2 Q8_0, with the shipped Q4_1 file drafting for it."""
    return target_and_draft[0], smollm2_path


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["lookup", "draft"])
def test_seeded_speculative_sampling_draws_plain_sampling_tokens(target_and_q4_1_draft, mode):
    """Temperature with top-p, min-p, top-k, repetition / presence / frequency penalties and a
    logit bias, 2 seeds x 3 copy-heavy prompts each: the speculative tokens are plain
    decoding's, and drafts were both accepted and rejected under every setting."""
    target, draft = target_and_q4_1_draft
    with edgeinfer.load(target, n_ctx=256, n_threads=2, draft=draft) as eng:
        eng.fix_speculation(4)
        out = eng.scheduler.output
        for name, sampling in SAMPLED.items():
            before = (out.spec_proposed, out.spec_accepted)
            for prompt in COPY_PROMPTS:
                ids = eng.tokenize(prompt)
                extra = dict(logit_bias=_bias_of(ids)) if name == "logit_bias" else {}
                for seed in (1, 2):
                    kw = dict(max_tokens=24, seed=seed, ignore_eos=True, **sampling, **extra)
                    plain = eng.generate(ids, **kw).tokens
                    spec = eng.generate(ids, speculative=mode, **kw).tokens
                    assert spec == plain, (mode, name, prompt[:20], seed)
            proposed, accepted = out.spec_proposed - before[0], out.spec_accepted - before[1]
            assert proposed > accepted > 0, (mode, name, proposed, accepted)


# --------------------------------------------------------------------------- temperature > 0

def _tiny_path(tmp_path) -> Path:
    from tests.support.gguf_corpus import tiny_llama

    p = tmp_path / "tiny.gguf"
    p.write_bytes(tiny_llama().build())
    return p


@pytest.mark.slow
def test_sampled_speculative_tokens_follow_the_model_distribution(tmp_path):
    """Plain temperature sampling (no top-k/top-p/min-p) on the tiny model (40 tokens, logits
    about 1e-3 apart, so T = 5e-4 spreads them like a real model's): 1500 seeds, the draft being the model
    itself (greedy: accepted with probability p(argmax), so both branches run). The first
    and second sampled tokens' frequencies against the exact marginals from the model's own
    logits (p(t1) and sum over t1 of p(t1) p(t2 | t1)): chi-square p > 0.001 each. A rule
    that accepted the draft without sampling would put the argmax's mass far too high."""
    stats = require("scipy.stats", "the chi-square test")
    path = _tiny_path(tmp_path)
    prompt = [1, 10, 11, 12, 10, 11]
    T = 5e-4
    with edgeinfer.load(path, n_ctx=32, n_threads=1, draft=path, speculative="draft") as eng:
        eng.fix_speculation(3)
        n_vocab = eng.config.n_vocab

        sampling = dict(temperature=T, top_k=0, top_p=1.0, min_p=0.0, ignore_eos=True)

        def softmax(x):
            x = x / T
            e = np.exp(x - x.max())
            return e / e.sum()

        p1 = softmax(eng.logits(prompt)[-1].astype(np.float64))
        p2 = np.zeros(n_vocab)
        for t1 in range(n_vocab):
            p2 += p1[t1] * softmax(eng.logits(prompt + [t1])[-1].astype(np.float64))
        n = 1500
        c1, c2 = np.zeros(n_vocab), np.zeros(n_vocab)
        for seed in range(n):
            toks = eng.generate(prompt, max_tokens=3, seed=seed, **sampling).tokens
            c1[toks[0]] += 1
            c2[toks[1]] += 1
        assert eng.scheduler.output.spec_proposed > eng.scheduler.output.spec_accepted > 0
        for counts, p in ((c1, p1), (c2, p2)):
            big = p * n >= 5       # pool the rare tokens into one cell
            obs = np.append(counts[big], counts[~big].sum())
            exp = np.append(p[big], p[~big].sum()) * n
            keep = exp > 0
            res = stats.chisquare(obs[keep], exp[keep])
            assert res.pvalue > 1e-3, (res, obs, exp)
        # with the same seed, speculative and plain sampling draw the same tokens
        for seed in range(20):
            kw = dict(max_tokens=8, seed=seed, **sampling)
            assert eng.generate(prompt, speculative="draft", **kw).tokens == \
                eng.generate(prompt, speculative=None, **kw).tokens


@pytest.mark.slow
def test_constrained_sequences_decode_plainly(smollm2_path):
    """A grammar's mask follows the sampled tokens one at a time, so a constrained request
    does not speculate (its output is plain decoding's); an unconstrained one beside it does."""
    with edgeinfer.load(smollm2_path, n_ctx=128, n_threads=2) as eng:
        eng.fix_speculation(4)
        prompt = "Repeat: red green blue red green blue red"
        kw = dict(max_tokens=12, temperature=0.0, regex="( ?(red|green|blue))+")
        plain = eng.generate(prompt, **kw)
        spec = eng.generate(prompt, speculative="lookup", **kw)
        assert spec.tokens == plain.tokens and spec.stats.spec_proposed == 0
        free = eng.generate(prompt, speculative="lookup", max_tokens=12, temperature=0.0)
        assert free.stats.spec_proposed > 0


# --------------------------------------------------------------------------- API errors

def test_bad_speculative_arguments_are_typed_errors(tmp_path, smollm2_path):
    path = _tiny_path(tmp_path)
    with edgeinfer.load(path, n_ctx=32, n_threads=1) as eng:
        with pytest.raises(ValueError, match="speculative"):
            eng.generate([1, 2], speculative="magic")
        with pytest.raises(ValueError, match="draft model"):
            eng.generate([1, 2], speculative="draft")
        kw = dict(max_tokens=8, temperature=0.0, ignore_eos=True)
        plain = eng.generate([1, 10, 11, 10, 11], **kw).tokens
        eng.fix_speculation(2)      # the adaptive policy may find drafting on so tiny a model slower
        out = eng.generate([1, 10, 11, 10, 11], speculative="lookup", **kw)
        assert out.tokens == plain and out.stats.spec_proposed > 0   # the output repeats: it drafts
    with pytest.raises(ValueError, match="speculative"):
        edgeinfer.load(path, n_ctx=32, n_threads=1, speculative="draft")
    with pytest.raises(ValueError, match="vocabulary"):
        edgeinfer.load(path, n_ctx=32, n_threads=1, draft=smollm2_path)


# --------------------------------------------------------------------------- server, CLI

@pytest.mark.slow
def test_server_speculates_and_reports_it_in_metrics(smollm2_path):
    """An engine loaded with speculative='lookup' (what `serve --speculative lookup` does):
    a completion over HTTP equals plain greedy decoding and /metrics counts the drafts."""
    import json
    import urllib.request

    from edgeinfer.server import ServerThread

    prompt = "Copy this line twice: alpha beta gamma delta epsilon zeta eta theta.\nalpha beta gamma"
    body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    with edgeinfer.load(smollm2_path, n_ctx=128, n_threads=2) as eng:
        plain = eng.generate(prompt, max_tokens=24, temperature=0.0, ignore_eos=True).text
    with edgeinfer.load(smollm2_path, n_ctx=128, n_threads=2, speculative="lookup") as eng:
        eng.fix_speculation(4)
        srv = ServerThread(eng, model_name="smollm2").start()
        try:
            req = urllib.request.Request(srv.url + "/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                out = json.loads(r.read())
            assert out["choices"][0]["text"] == plain
            with urllib.request.urlopen(srv.url + "/metrics", timeout=60) as r:
                text = r.read().decode()
        finally:
            srv.stop(timeout_s=5)
    values = {line.split()[0].split("{")[0]: float(line.split()[-1]) for line in text.splitlines()
              if line.startswith("edgeinfer_spec_")}
    assert values["edgeinfer_spec_proposed_tokens"] >= values["edgeinfer_spec_accepted_tokens"] > 0, values
    assert values["edgeinfer_spec_verify_steps"] > 0 and values["edgeinfer_spec_mean_k"] > 0


@pytest.mark.slow
def test_cli_rejects_bad_speculative_options():
    import subprocess
    import sys

    for args in (["serve", "x.gguf", "--speculative", "draft"], ["serve", "x.gguf", "--speculative", "magic"],
                 ["bench", "x.gguf", "--speculative", "draft"], ["bench", "x.gguf", "--speculative", "auto"]):
        r = subprocess.run([sys.executable, "-m", "edgeinfer", *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "speculative" in r.stderr, (args, r.returncode, r.stderr)


@pytest.mark.slow
def test_a_failing_draft_model_only_turns_speculation_off(tmp_path):
    """The draft model only proposes: when its forward fails, the request decodes plainly
    (same tokens) instead of failing."""
    path = _tiny_path(tmp_path)
    with edgeinfer.load(path, n_ctx=32, n_threads=1, draft=path) as eng:
        eng.fix_speculation(3)
        kw = dict(max_tokens=6, temperature=0.0, ignore_eos=True)
        plain = eng.generate([1, 10, 11, 12], **kw).tokens
        calls = []

        def broken(batch, logits=None):
            calls.append(len(batch))
            raise RuntimeError("draft forward failed")

        eng.draft.runner.runtime.forward = broken
        for mode_prefill in (True, False):      # failing in the prompt's catch-up, then in a proposal
            if not mode_prefill:
                eng.scheduler._draft_prefill = lambda r: None
            out = eng.generate([1, 10, 11, 12], speculative="draft", **kw)
            assert out.tokens == plain and out.finish_reason == "length"
        assert len(calls) >= 2
