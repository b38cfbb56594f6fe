"""The per-sequence state seam (engine/states.py).

On the fake backend: KV cells alone, and KV cells plus a recurrent state
(tests/support/fake_backend.py: a running CRC of the tokens fed, which moves the logits when it
is wrong). Prefix reuse, n > 1 siblings copying a prompt and speculative rollback must give the
tokens of a fresh sequence (`reference_greedy`), and must have gone through the seam (a kept
state restored or copied) rather than around it.

On the native runtime, one test per behaviour over both hybrid families (tiny random F32
checkpoints: LFM2's short-conv + GQA layouts and Qwen3.5's Gated DeltaNet + gated attention
patterns, tests/support/tiny_checkpoints.py): a prompt that extends an earlier one, an n = 2
sibling, a speculative run with rejections and a ring that slides each give exactly a fresh
engine's greedy tokens; a rollback that skips the restore is refused, never silently wrong;
info() and `plan` report the recurrent state's bytes apart from the KV ring's, equal to the
sizes computed from the checkpoint's config.json.
"""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

import edgeinfer
from edgeinfer.backends.base import KVPlan
from edgeinfer.engine.generation import Generation
from edgeinfer.engine.kv import KVRing
from edgeinfer.engine.runner import Runner
from edgeinfer.engine.sampling import SamplingParams
from edgeinfer.engine.scheduler import Scheduler
from edgeinfer.errors import StateError
from edgeinfer.tools import plan as P
from tests.support import fake_backend as fb
from tests.support import tiny_checkpoints as tc
from tests.support.llama_oracle import Q8_0_TIE_GAP
from tests.support.strict import require

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
    """Drafts: a random run of the true continuation (`truth(history, k)`: its next k tokens),
    then wrong tokens (a rollback every time one is rejected)."""

    def __init__(self, seed: int, truth, n_vocab: int):
        self.rng, self.truth, self.n_vocab = random.Random(seed), truth, n_vocab

    def propose(self, history, k):
        good = self.truth(history, k)[:self.rng.randint(0, k - 1)]
        return good + [self.rng.randrange(3, self.n_vocab) for _ in range(k - len(good))]


def _speculate(make, recurrent: bool) -> tuple[list[list[int]], list[list[int]], object]:
    sched, rt = make(recurrent, speculative="lookup")
    sched.policy.fixed_k = 4
    sched.lookup = _Proposer(7, fb.reference_greedy, fb.N_VOCAB)
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


# ----------------------------------------------------------------- the native hybrids
HYBRIDS = tuple(tc.LFM2_LAYOUTS) + tuple(tc.QWEN35_KINDS)
IDS = list(range(5, 45))
N_REAL = 16
LOGPROB_ATOL = 1e-4


@pytest.fixture(scope="module", params=HYBRIDS)
def hybrid(request, tmp_path_factory):
    """(checkpoint dir, our F32 file) of one hybrid layout."""
    require("torch")
    require("transformers")
    from edgeinfer.convert import convert_checkpoint

    d = tmp_path_factory.mktemp(request.param)
    src = tc.build(request.param, d / "hf")
    path = d / "f32.gguf"
    convert_checkpoint(str(src), str(path), "f32")
    return src, path


def _greedy(eng, prompt: list[int], n: int = N_REAL):
    """A greedy run with each chosen token's log-probability (Completion.logprobs)."""
    return eng.generate(prompt, max_tokens=n, temperature=0, ignore_eos=True, logprobs=0)


def _fresh(path, prompt, n_ctx: int = 128, **load):
    """(tokens, their log-probabilities) of a fresh engine's greedy run."""
    with edgeinfer.load(str(path), n_ctx=n_ctx, n_threads=2, **load) as e:
        got = _greedy(e, prompt)
    return got.tokens, _lps(got)


def _lps(got) -> np.ndarray:
    return np.array([lp.logprob for lp in got.logprobs])


def _assert_fresh(got, want) -> None:
    """The tokens a fresh engine gives, and their log-probabilities to within what another
    batching's rounding moves (F32 weights): a short conv's state lost after a reuse can keep
    the greedy tokens of a tiny random model while it moves their probabilities."""
    assert got.tokens == want[0]
    np.testing.assert_allclose(_lps(got), want[1], atol=LOGPROB_ATOL)


def test_hybrid_prefix_reuse_gives_a_fresh_engines_tokens(hybrid):
    """The second prompt extends the first: the engine resumes from the state kept at the
    first prompt's end, and must give a fresh engine's greedy tokens."""
    _, path = hybrid
    first, second = IDS[:20], IDS[:20] + [7, 9, 11, 13]
    with edgeinfer.load(str(path), n_ctx=128, n_threads=2) as eng:
        eng.generate(first, max_tokens=6, temperature=0)
        got = _greedy(eng, second)
    assert got.stats.cached_tokens == len(first) - 1   # resumed from the kept state, not from 0
    _assert_fresh(got, _fresh(path, second))


def test_hybrid_scored_prompt_then_its_completion_gives_a_fresh_engines_tokens(hybrid):
    """An echoed prompt: scored in a lease that keeps its cells and state (all but the last
    token), then completed: the completion resumes there and gives a fresh engine's tokens."""
    _, path = hybrid
    prompt = IDS[:24]
    with edgeinfer.load(str(path), n_ctx=128, n_threads=2) as eng:
        eng.prompt_logprobs(prompt, 1)
        got = _greedy(eng, prompt)
    assert got.stats.cached_tokens == len(prompt) - 1
    _assert_fresh(got, _fresh(path, prompt))


def test_hybrid_n2_sibling_gives_a_fresh_engines_tokens(hybrid):
    """Two requests for one prompt (n = 2), the second arriving once the first's prompt is in
    (it is submitted from the first forward's return): it copies the first's cells and the
    state kept at the prompt's end, and both must give a fresh engine's tokens."""
    _, path = hybrid
    prompt = IDS[:12]
    want = _fresh(path, prompt)
    params = SamplingParams(max_tokens=N_REAL, temperature=0.0, ignore_eos=True)
    with edgeinfer.load(str(path), n_ctx=128, n_threads=2, n_slots=2) as eng:
        sibling: list[Generation] = []
        execute = eng.runner.execute

        def execute_then_sibling(plan):
            out = execute(plan)
            if not sibling:   # the first forward: the first request's prompt
                sibling.append(Generation(eng.scheduler, prompt, params, n_logprobs=0))
            return out

        eng.runner.execute = execute_then_sibling
        first = Generation(eng.scheduler, prompt, params, n_logprobs=0).result()
        second = sibling[0].result()
    _assert_fresh(first, want)
    _assert_fresh(second, want)
    assert (first.stats.cached_tokens, second.stats.cached_tokens) == (0, len(prompt) - 1)   # copied


def _speculate_native(path, prompt: list[int]):
    want = _fresh(path, prompt)
    eng = edgeinfer.load(str(path), n_ctx=128, n_threads=2, speculative="lookup")
    eng.scheduler.policy.fixed_k = 4   # the adaptive k would not draft for so small a model
    truth = want[0]
    eng.scheduler.lookup = _Proposer(7, lambda h, k: truth[len(h) - len(prompt):][:k], eng.config.n_vocab)
    return eng, want


def test_hybrid_speculative_rejections_give_a_fresh_engines_tokens(hybrid):
    """Rejected drafts roll the cells back and restore the recurrent state kept after the last
    confirmed token: the output is plain decoding's."""
    _, path = hybrid
    prompt = IDS[:24]
    eng, want = _speculate_native(path, prompt)
    with eng:
        got = _greedy(eng, prompt)
    assert 0 < got.stats.spec_accepted < got.stats.spec_proposed, got.stats   # drafts were rolled back
    _assert_fresh(got, want)


def test_hybrid_a_skipped_restore_is_refused(hybrid, monkeypatch):
    """A rollback that forgets the drafts' cells but skips restoring the recurrent state must
    not run on from the drafts' state: the runtime refuses the next forward by name."""
    _, path = hybrid
    prompt = IDS[:24]
    eng, _ = _speculate_native(path, prompt)
    monkeypatch.setattr(Runner, "restore_state", lambda self, slot, n: None)
    with eng, pytest.raises(StateError, match=r"recurrent state was forgotten and not restored"):
        eng.generate(prompt, max_tokens=N_REAL, temperature=0, ignore_eos=True)


def test_hybrid_a_slid_ring_keeps_the_recurrent_state(hybrid):
    """A ring of 32 cells slides under a 24-token prompt and 48 new tokens; the attention layers
    forget, the recurrent layers' state runs on. Each token must be the float64 reference's
    top one through the same ring (or within a near tie of it), and the engine then serves a
    fresh engine's tokens on its next request."""
    from tests.support.reference_forward import ReferenceModel

    _, path = hybrid
    cap, sink = 32, 4
    long = IDS[:24]
    with edgeinfer.load(str(path), n_ctx=cap, n_sink=sink, overflow="slide", n_threads=2) as eng:
        assert (eng.ring.capacity, eng.ring.n_sink) == (cap, sink)
        toks = eng.generate(long, max_tokens=48, temperature=0, ignore_eos=True).tokens
        assert eng.ring.slots[0].wrapped
        seq = long + toks[:-1]
        rows = ReferenceModel(path).logits(seq, ring=(cap, sink))[len(long) - 1:]
        gaps = rows.max(-1) - rows[np.arange(len(toks)), toks]
        assert gaps.max() <= Q8_0_TIE_GAP, gaps
        second = _greedy(eng, IDS[:10])
    _assert_fresh(second, _fresh(path, IDS[:10], n_ctx=cap, n_sink=sink, overflow="slide"))


def _state_floats_from_config(src) -> list[int]:
    """Each layer's recurrent state per slot, in floats, from the checkpoint's config.json (not
    from the GGUF or our config reader): a short conv keeps (L_cache - 1) x hidden inputs; a
    Gated DeltaNet layer (conv_kernel - 1) x its conv's channels (q and k: key heads x d_k
    each; v: value heads x d_v), then d_k x d_v per value head."""
    c = json.loads((src / "config.json").read_text())
    c = c.get("text_config", c)
    out = []
    for t in c["layer_types"]:
        if t == "conv":
            out.append((c["conv_L_cache"] - 1) * c["hidden_size"])
        elif t == "linear_attention":
            dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
            nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
            out.append((c["linear_conv_kernel_dim"] - 1) * (2 * nk * dk + nv * dv) + nv * dk * dv)
        else:
            out.append(0)
    return out


@pytest.mark.parametrize("slots", [1, 3])
def test_hybrid_state_bytes_reported_apart_from_the_ring(hybrid, slots):
    """info() reports the ring's and the recurrent state's bytes apart; the native figure is
    slots x (1 live + kept copies) x the layers' floats x 4, and `plan` prices the same."""
    src, path = hybrid
    floats = _state_floats_from_config(src)
    assert all(f % 16 == 0 for f in floats)   # whole 64-byte lines: the runtime pads no block
    with edgeinfer.load(str(path), n_ctx=256, n_threads=2, n_slots=slots) as eng:
        info = eng.info()
    assert info["state_snapshots"] > 0
    assert info["state_bytes"] == slots * (1 + info["state_snapshots"]) * sum(floats) * 4
    m = P.model_shape(path)
    assert P.state_bytes(m, slots, info["state_snapshots"]) == info["state_bytes"]
    row = P.plan_one(m, 256, slots)
    assert (row.state_bytes, row.kv_bytes) == (info["state_bytes"], info["kv_bytes"])
    assert row.total == row.weights + row.mapped + row.kv_bytes + row.state_bytes + row.scratch + row.overhead


@pytest.mark.parametrize("ctx,slots,max_batch", [(256, 1, 256), (512, 3, 64), (1024, 2, 17)])
def test_hybrid_plan_buffers_are_the_runtimes(hybrid, ctx, slots, max_batch):
    """`plan`'s working buffers for a hybrid are what ei_runtime_create allocated, to the byte:
    the attention path's, plus the recurrent layers' (state.c: in_proj rows of the short conv,
    conv taps, kept copies' tags; recurrent.c: the delta-net's qkv, gate, decay rows and its
    chunked delta rule's work areas). Without the recurrent part the plan is 23-54% short here."""
    _, path = hybrid
    m = P.model_shape(path)
    with edgeinfer.load(str(path), n_ctx=ctx, n_threads=2, n_slots=slots, max_batch=max_batch) as eng:
        info = eng.info()
    row = P.plan_one(m, ctx, slots, max_batch=max_batch, n_threads=info["n_threads"])
    assert row.scratch == info["scratch_bytes"], (row.scratch, info["scratch_bytes"])
    assert P.recurrent_scratch_bytes(m, slots, max_batch) > 0


def test_hybrid_plan_cli_prices_the_state(hybrid):
    """`edgeinfer plan` prices the state apart from the ring: a JSON field per row, a line and
    a column in the table (attention-only models have neither: tests/test_doctor_plan.py)."""
    from typer.testing import CliRunner

    from edgeinfer.cli import app

    _, path = hybrid
    r = CliRunner().invoke(app, ["plan", str(path), "--json", "--ctx", "256,1024", "--slots", "2"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)["rows"]
    per_slot = P.state_bytes(P.model_shape(path), 1)
    assert [x["state_bytes"] for x in rows] == [2 * per_slot] * 2   # not the context's
    r = CliRunner().invoke(app, ["plan", str(path), "--ctx", "256", "--slots", "2"])
    assert r.exit_code == 0, r.output
    assert f"state     {P.human(per_slot)} per slot" in r.output
    row = next(line.split() for line in r.output.splitlines() if line.split()[:2] == ["256", "2"])
    assert row[4:6] == P.human(2 * per_slot).split()   # ctx, slots, KV (value, unit), state


# ----------------------------------------------------------------- kept copies within a byte budget
def test_snapshot_count_follows_the_byte_budget():
    """A small state keeps SNAPSHOTS_MAX copies (a prompt end and spec_max_k drafts); a large
    one as many as SNAPSHOT_BUDGET holds, never under SNAPSHOTS_MIN. At Qwen3.5-0.8B's shape
    (config.json: 24 layers, 3 Gated DeltaNet to 1 attention, 16 key and 16 value heads of 128,
    conv kernel 4, hidden 1024) a copy is ~19 MiB: 16 copies cost 300+ MiB a slot, the budget 64."""
    from types import SimpleNamespace

    assert KVPlan.snapshots_for(1 << 10) == KVPlan.SNAPSHOTS_MAX
    assert KVPlan.snapshots_for(KVPlan.SNAPSHOT_BUDGET // 3) == 3
    assert KVPlan.snapshots_for(KVPlan.SNAPSHOT_BUDGET) == KVPlan.SNAPSHOTS_MIN
    kinds = ["recurrent", "recurrent", "recurrent", "attention"] * 6
    cfg = SimpleNamespace(layer_kinds=kinds, n_layer=24, conv_kernel=4, n_embd=1024,
                          ssm_conv_dim=2 * 16 * 128 + 16 * 128, ssm_inner=16 * 128, ssm_head_dim=128)
    copy = sum(P.layer_state_floats(cfg)) * 4
    assert 18 << 20 < copy < 20 << 20
    n = KVPlan.snapshots_for(copy)
    assert n == 3 and n * copy <= KVPlan.SNAPSHOT_BUDGET


def test_hybrid_few_kept_copies_keep_speculation_exact(hybrid, monkeypatch):
    """With a budget of three copies (a state bigger than the tiny model's), the engine keeps
    three, info() and `plan` price 1 + 3 per slot, a step drafts at most two tokens although
    the policy asks for four, and rejected drafts still give a fresh engine's tokens."""
    src, path = hybrid
    copy = sum(_state_floats_from_config(src)) * 4
    monkeypatch.setattr(KVPlan, "SNAPSHOT_BUDGET", 3 * copy)
    prompt = IDS[:24]
    eng, want = _speculate_native(path, prompt)
    sizes: list[int] = []
    execute = eng.runner.execute

    def execute_recording(plan):
        sizes.extend(len(d) for d in plan.drafts)
        return execute(plan)

    eng.runner.execute = execute_recording
    with eng:
        info = eng.info()
        got = _greedy(eng, prompt)
    assert info["state_snapshots"] == 3
    assert info["state_bytes"] == (1 + 3) * copy == P.state_bytes(P.model_shape(path), 1)
    assert max(sizes) == 2, sizes     # fixed_k = 4, held to kept copies - 1
    assert 0 < got.stats.spec_accepted < got.stats.spec_proposed, got.stats   # drafts were rolled back
    _assert_fresh(got, want)


# ----------------------------------------------------------------- a sliding-window ring
@pytest.fixture(scope="module")
def gemma3_file(tmp_path_factory):
    """A tiny Gemma 3 (F16): local layers with a window of 16 beside global ones."""
    require("torch")
    require("transformers")
    from edgeinfer.convert import convert_checkpoint

    d = tmp_path_factory.mktemp("gemma3")
    path = d / "g.gguf"
    convert_checkpoint(str(tc.build("gemma3", d / "hf")), str(path), "f16")
    return path


def test_ring_bookkeeping_never_offers_a_window_the_runtime_lost(gemma3_file):
    """Random appends and rollbacks on a slot whose local ring (16 + 4 - 1 = 19 cells) wraps:
    wherever KVRing says the slot still holds the window of its first n positions, the runtime
    copies them (ei_check_prefix agrees); a rollback empties cells, so what they held before
    stays lost (the slot's high-water mark, not its current length, decides)."""
    from edgeinfer.backends.base import Batch
    from edgeinfer.errors import StateError

    rng = random.Random(0)
    with edgeinfer.load(str(gemma3_file), n_ctx=64, n_threads=2, n_slots=2, max_batch=4) as eng:
        states, ring, rt = eng.scheduler.states, eng.scheduler.ring, eng.runner.runtime
        offered = 0
        for _ in range(12):
            for _ in range(rng.randint(1, 4)):   # append up to 4 tokens at a time
                n_past = ring.slots[0].n_past
                toks = [rng.randrange(5, 60) for _ in range(rng.randint(1, min(4, 60 - n_past)))]
                pos, cells = ring.reserve(0, toks)
                rt.forward(Batch.of_slot(0, toks, pos, cells, np.empty(0, dtype=np.int32)))
            states.rollback(0, rng.randint(1, ring.slots[0].n_past))
            for n in range(1, ring.slots[0].n_past + 1):
                if ring.holds_window(0, n):
                    offered += 1
                    try:
                        rt.copy_prefix(0, 1, n)
                    except StateError as e:
                        pytest.fail(f"KVRing offers {n} positions the runtime lost: {e}")
        assert offered > 0


@pytest.mark.parametrize("after,copied", [(6, True), (10, False)])
def test_sibling_of_a_wrapped_sliding_ring(gemma3_file, after, copied):
    """Gemma 3 with max_batch 4: the local layers' ring is 16 + 4 - 1 = 19 cells, so a 24-token
    prompt has wrapped it when an n = 2 sibling arrives. Once the prompt is in (after 6 chunks)
    the sibling copies 23 positions (the ring's window, not 23 rows past its end); once the first
    request has decoded 4 more tokens over the window (after 10) it computes its prompt instead.
    Either way a fresh engine's tokens."""
    from tests.support.siblings import run_siblings

    path = gemma3_file
    with edgeinfer.load(str(path), n_ctx=64, n_threads=2) as eng:
        prompt = eng.tokenize("Once upon a time, in a small village, there lived an old clockmaker")[:24]
        want = eng.generate(prompt, max_tokens=12, temperature=0, ignore_eos=True).tokens
    with edgeinfer.load(str(path), n_ctx=64, n_threads=2, n_slots=2, max_batch=4) as eng:
        assert eng.info()["local_kv_cells"] == 19
        first, second, copies = run_siblings(eng, prompt, 12, after=after)
    assert copies == ([(0, 1, 23)] if copied else [])
    assert second.stats.cached_tokens == (23 if copied else 0)
    assert first.tokens == want and second.tokens == want
