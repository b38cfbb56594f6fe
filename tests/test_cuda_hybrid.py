"""Hybrid models on the CUDA backend (native/cuda: shortconv_block / deltanet_block of forward.cu,
the recurrent kernels of kernels.cu, the per-slot states of ei_cuda_runtime).

Each tiny hybrid layout (tests/support/tiny_checkpoints.py: LFM2's short convolutions + GQA,
Qwen3.5's Gated DeltaNet + gated attention with partial RoPE), converted to F32:
- prefill (in chunks of max_batch, and whole), token-by-token decode (CUDA Graphs) and a batch
  whose rows alternate between two slots give the CPU backend's logits within tests/test_cuda.py's
  CPU-vs-CUDA bounds for tiny families (NMSE <= 1e-5, KL <= 1e-4, top-1 >= 0.95); the state and
  KV bytes are the CPU runtime's;
- runs of 64 rows or more (Qwen3.5's delta rule by chunks of 64, as the CPU's prefill), cut by a
  keep row or beside another slot's run, give the CPU backend's logits and the state decode goes on from;
- greedy tokens equal the CPU backend's;
- a prompt extending an earlier one (prefix reuse from a kept state), an n = 2 pair, an n = 2
  sibling that copies the first's prompt (ei_cuda_copy_prefix: cells and the kept state) and a
  speculative run with rejections (rollback = forget + restore) each give a fresh engine's tokens
  (and the sibling the CPU backend's); copy_prefix on the runtime gives the source slot's logits
  and refuses a prefix without a kept state by name;
  a skipped restore is refused by name; restore / drop on the runtime behave as the CPU's.

Needs a CUDA device; tests/test_cuda_sim.py runs this file on eisim, the CPU simulator."""
from __future__ import annotations

import random

import numpy as np
import pytest

from tests.support.cuda_bounds import assert_close, assert_steps_match
from tests.support.strict import require

torch = require("torch", "tiny checkpoints are built with torch")
require("transformers", "tiny checkpoints are built with transformers")

import edgeinfer
from edgeinfer.backends import Batch
from edgeinfer.backends import cuda as cb
from edgeinfer.convert import convert_checkpoint
from edgeinfer.engine.generation import Generation
from edgeinfer.engine.runner import Runner
from edgeinfer.engine.sampling import SamplingParams
from edgeinfer.errors import StateError
from edgeinfer.tools import plan as P
from tests.support import tiny_checkpoints as tc
from tests.support.siblings import run_siblings

DEVICES, NO_GPU_REASON = cb.probe()
pytestmark = pytest.mark.skipif(not DEVICES, reason=f"needs a CUDA GPU: {NO_GPU_REASON} "
                                "(tests/test_cuda_sim.py runs these on eisim)")

HYBRIDS = tuple(tc.LFM2_LAYOUTS) + tuple(tc.QWEN35_KINDS)
IDS = list(range(5, 29))
LONG = [5 + (i * 37) % 200 for i in range(100)]   # runs of 64 rows or more
N_NEW = 12


@pytest.fixture(scope="module", params=HYBRIDS)
def hybrid(request, tmp_path_factory):
    """(layout name, our F32 file) of one hybrid layout."""
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp(request.param)
    path = d / "f32.gguf"
    convert_checkpoint(str(tc.build(request.param, d / "hf")), str(path), "f32")
    return request.param, path


def _cuda(path, **kw):
    return edgeinfer.load(str(path), n_ctx=kw.pop("n_ctx", 64), device="cuda", **kw)


def _cpu(path, **kw):
    return edgeinfer.load(str(path), n_ctx=kw.pop("n_ctx", 64), device="cpu", n_threads=2, **kw)


def test_hybrid_logits_match_cpu(hybrid):
    """Prefill in chunks of 4 (each chunk continues the state the last one left) and whole,
    decode token by token in slot 1 (the graph path), and one batch alternating two slots'
    rows (each slot's rows continue its own state): the CPU backend's logits."""
    fam, path = hybrid
    with _cpu(path, n_slots=2) as cpu:
        ref = cpu.logits(IDS)
        cpu_info = cpu.info()
    for max_batch in (4, 64):
        with _cuda(path, n_slots=2, max_batch=max_batch) as gpu:
            info = gpu.info()
            assert info["device"] == "cuda"
            assert info["state_bytes"] == cpu_info["state_bytes"] > 0
            assert info["kv_bytes"] == P.kv_bytes(P.model_shape(path), 64, 2, "f16", max_batch)
            assert_close(ref, gpu.logits(IDS), (fam, "prefill", max_batch))
            # with max_batch 64: rows of slots 0 and 1 interleaved, 2 x 24 rows in one step
            assert_steps_match(gpu.runner.runtime, ref, IDS, (fam, max_batch), interleave=max_batch == 64)


def test_hybrid_long_runs_match_cpu(hybrid):
    """Runs of 64 rows or more of one slot (Qwen3.5: the delta rule by chunks of 64, as the CPU's
    prefill; LFM2: the same blocks as shorter runs): a 100-row prefill (chunks of 64 and 36), then
    one step holding slot 0's 70 rows, cut after row 63 by a keep row (a run of 64 by chunks, then
    6 token by token), and slot 1's 80 rows (64 + 16) give the CPU backend's logits; slot 1 then
    decodes on from the state its chunks left, and slot 0 from the copy kept after 64 rows."""
    fam, path = hybrid
    n = len(LONG)
    with _cpu(path, n_ctx=256) as cpu:
        ref = cpu.logits(LONG)
    with _cuda(path, n_ctx=256, n_slots=2, max_batch=160) as gpu:
        assert_close(ref, gpu.logits(LONG), (fam, "prefill of 100"))
        rt = gpu.runner.runtime
        for s in (0, 1):
            rt.clear_slot(s)
        pos = list(range(70)) + list(range(80))
        got = rt.forward(Batch(LONG[:70] + LONG[:80], [0] * 70 + [1] * 80, pos, pos, list(range(150)),
                               keep_rows=[63])).copy()
        assert_close(ref[:70], got[:70], (fam, "slot 0: 64 by chunks, 6 by steps"))
        assert_close(ref[:80], got[70:], (fam, "slot 1: 80 by chunks"))
        decode = np.array([rt.forward(Batch([LONG[i]], [1], [i], [i], [0]))[0].copy() for i in range(80, n)])
        assert_close(ref[80:], decode, (fam, "slot 1 decodes on"))
        rt.forget_from(0, 64)
        rt.restore_state(0, 64)
        tail = list(range(64, n))
        assert_close(ref[64:], rt.forward(Batch(LONG[64:], [0] * (n - 64), tail, tail, list(range(n - 64)))),
                     (fam, "slot 0 from its copy at 64"))


def test_hybrid_greedy_tokens_equal_cpu(hybrid):
    _, path = hybrid
    with _cpu(path) as cpu:
        want = cpu.generate(IDS[:16], max_tokens=N_NEW, temperature=0, ignore_eos=True).tokens
    with _cuda(path) as gpu:
        got = gpu.generate(IDS[:16], max_tokens=N_NEW, temperature=0, ignore_eos=True).tokens
    assert got == want


def _fresh(path, prompt) -> list[int]:
    with _cuda(path) as e:
        return e.generate(prompt, max_tokens=N_NEW, temperature=0, ignore_eos=True).tokens


def test_hybrid_prefix_reuse_gives_a_fresh_engines_tokens(hybrid):
    """The second prompt extends the first: the engine resumes from the device state kept at the
    first prompt's end (cached_tokens says so) and gives a fresh engine's tokens."""
    _, path = hybrid
    first, second = IDS[:16], IDS[:16] + [7, 9, 11]
    with _cuda(path) as eng:
        eng.generate(first, max_tokens=4, temperature=0)
        got = eng.generate(second, max_tokens=N_NEW, temperature=0, ignore_eos=True)
    assert got.stats.cached_tokens == len(first) - 1
    assert got.tokens == _fresh(path, second)


def test_hybrid_n2_pair_gives_a_fresh_engines_tokens(hybrid):
    """Two requests for one prompt in two slots at once (the CUDA runtime does not copy a
    prefix: each computes it, in shared steps): both give a fresh engine's tokens."""
    _, path = hybrid
    prompt = IDS[:12]
    params = SamplingParams(max_tokens=N_NEW, temperature=0.0, ignore_eos=True)
    with _cuda(path, n_slots=2) as eng:
        gens = [Generation(eng.scheduler, prompt, params) for _ in range(2)]
        got = [g.result().tokens for g in gens]
    want = _fresh(path, prompt)
    assert got == [want, want]


def test_hybrid_n2_sibling_copies_the_prompt(hybrid):
    """The second request of n = 2 arrives once the first's prompt is in: it copies the first's
    cells and the device state kept at the prompt's end (one copy of 11 positions, cached_tokens
    11), and both give the CPU backend's and a fresh engine's tokens."""
    _, path = hybrid
    prompt = IDS[:12]
    with _cpu(path) as cpu:
        want = cpu.generate(prompt, max_tokens=N_NEW, temperature=0, ignore_eos=True).tokens
    with _cuda(path, n_slots=2) as eng:
        first, second, copies = run_siblings(eng, prompt, N_NEW)
    assert len(copies) == 1 and copies[0][0] != copies[0][1] and copies[0][2] == len(prompt) - 1, copies
    assert (first.stats.cached_tokens, second.stats.cached_tokens) == (0, len(prompt) - 1)
    assert first.tokens == want and second.tokens == want
    assert _fresh(path, prompt) == want


def test_hybrid_copy_prefix_on_the_runtime(hybrid):
    """copy_prefix(0, 1, 10) after a forward that kept the state at 10: slot 1 goes on from there
    with slot 0's logits, and keeps that state (a rollback of slot 1 to 10 restores it); a prefix
    whose state was not kept, or that slot 0 does not hold, is a StateError naming it."""
    _, path = hybrid
    n = len(IDS)
    pos = list(range(n))
    with _cuda(path, n_slots=2, max_batch=64) as gpu:
        rt = gpu.runner.runtime
        assert rt.caps.copy_prefix
        for s in (0, 1):
            rt.clear_slot(s)
        first = rt.forward(Batch(IDS, [0] * n, pos, pos, list(range(n)), keep_rows=[9])).copy()
        rt.forward(Batch(IDS[:5], [1] * 5, pos[:5], pos[:5], []))   # something for the copy to replace
        rt.copy_prefix(0, 1, 10)
        tail = Batch(IDS[10:], [1] * (n - 10), pos[10:], pos[10:], list(range(n - 10)))
        np.testing.assert_allclose(rt.forward(tail), first[10:], rtol=0, atol=1e-5)
        rt.forget_from(1, 10)
        rt.restore_state(1, 10)   # the copy is kept in slot 1 too
        np.testing.assert_allclose(rt.forward(tail), first[10:], rtol=0, atol=1e-5)
        with pytest.raises(StateError, match="slot 0 kept no recurrent state after 12 positions"):
            rt.copy_prefix(0, 1, 12)
        rt.forget_from(0, 20)
        with pytest.raises(StateError, match="slot 0 does not hold position 20 in cell 20"):
            rt.copy_prefix(0, 1, 21)


class _Proposer:
    """Drafts a random run of the true continuation, then wrong tokens (a rollback each time)."""

    def __init__(self, seed: int, truth: list[int], n_prompt: int, n_vocab: int):
        self.rng, self.truth, self.n_prompt, self.n_vocab = random.Random(seed), truth, n_prompt, n_vocab

    def propose(self, history, k):
        good = self.truth[len(history) - self.n_prompt:][:self.rng.randint(0, k - 1)]
        return good + [self.rng.randrange(3, self.n_vocab) for _ in range(k - len(good))]


def _speculating(path, prompt):
    want = _fresh(path, prompt)
    eng = _cuda(path, speculative="lookup")
    eng.scheduler.policy.fixed_k = 4   # the adaptive k would not draft for so small a model
    eng.scheduler.lookup = _Proposer(7, want, len(prompt), eng.config.n_vocab)
    return eng, want


def test_hybrid_speculative_rejections_give_a_fresh_engines_tokens(hybrid):
    """Rejected drafts roll the cells back and restore the device state kept after the last
    confirmed token: the output is plain decoding's."""
    _, path = hybrid
    prompt = IDS[:16]
    eng, want = _speculating(path, prompt)
    with eng:
        got = eng.generate(prompt, max_tokens=N_NEW, temperature=0, ignore_eos=True)
    assert 0 < got.stats.spec_accepted < got.stats.spec_proposed, got.stats   # drafts were rolled back
    assert got.tokens == want


def test_hybrid_a_skipped_restore_is_refused(hybrid, monkeypatch):
    """A rollback that skips restoring the state must not run on from the drafts' state: the
    CUDA runtime refuses the next forward by name, as the CPU's does."""
    _, path = hybrid
    prompt = IDS[:16]
    eng, _ = _speculating(path, prompt)
    monkeypatch.setattr(Runner, "restore_state", lambda self, slot, n: None)
    with eng, pytest.raises(StateError, match=r"recurrent state was forgotten and not restored"):
        eng.generate(prompt, max_tokens=N_NEW, temperature=0, ignore_eos=True)


def test_hybrid_restore_and_drop_on_the_runtime(hybrid):
    """keep_rows keeps the state after a row; forget_from + restore_state there and the same
    tokens again give the same logits; a state never kept, or dropped, is a StateError."""
    _, path = hybrid
    n = len(IDS)
    with _cuda(path, max_batch=64) as gpu:
        rt = gpu.runner.runtime
        assert rt.caps.recurrent_state and rt.caps.state_snapshots and rt.caps.max_snapshots > 0
        rt.clear_slot(0)
        pos = list(range(n))
        first = rt.forward(Batch(IDS, [0] * n, pos, pos, list(range(n)), keep_rows=[9, 15])).copy()
        rt.forget_from(0, 10)
        with pytest.raises(StateError, match="forgotten and not restored"):
            rt.forward(Batch(IDS[10:], [0] * (n - 10), pos[10:], pos[10:], [0]))
        rt.restore_state(0, 10)
        again = rt.forward(Batch(IDS[10:], [0] * (n - 10), pos[10:], pos[10:], list(range(n - 10))))
        np.testing.assert_allclose(again, first[10:], rtol=0, atol=1e-5)
        with pytest.raises(StateError, match="kept no recurrent state after 12 positions"):
            rt.restore_state(0, 12)
        for drop in (False, True):
            rt.clear_slot(0)
            rt.forward(Batch(IDS, [0] * n, pos, pos, [n - 1], keep_rows=[15]))
            rt.forget_from(0, 16)
            if drop:
                rt.drop_states(0, [16])
                with pytest.raises(StateError, match="kept no recurrent state after 16 positions"):
                    rt.restore_state(0, 16)
            else:
                rt.restore_state(0, 16)
                np.testing.assert_allclose(rt.forward(Batch(IDS[16:], [0] * (n - 16), pos[16:], pos[16:], [0]))[0],
                                           first[16], rtol=0, atol=1e-5)
