"""speculative="mtp": Qwen3.5's multi-token-prediction block as the draft (engine/mtp.py), on the
tiny random checkpoints of tests/support/tiny_checkpoints.py (which carry `mtp.*` under the names
real checkpoints use):

* the converter stores the block as llama.cpp's converter does (names, shapes, values);
* the block's math (edgeinfer/arch/nextn.py, float64) against the same math in torch built from
  the Hugging Face checkpoint (transformers' Qwen3.5 decoder layer, which Qwen3_5ForCausalLM itself
  does not hold for `mtp.*`), and the native block (ei_forward_nextn) against that reference;
* in a running engine, every proposal equals the reference's drafts for the sequence so far,
  through accepted and rejected drafts alike (the block's ring in step with the sequence);
* greedy output and its log-probabilities equal plain decoding's, one and two slots, acceptance
  reported; the adaptive switch turns drafting off when it loses;
* memory: the block's KV is one attention layer's cells, and no second packed head; `edgeinfer
  plan --speculative mtp` prices it as the engine allocates it;
* bad input: a file without the block, a draft file beside it, another backend: typed errors.
"""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from tests.support.strict import require

torch = require("torch")
tf = require("transformers")

import edgeinfer  # noqa: E402
from edgeinfer.arch.nextn import NextnReference  # noqa: E402
from edgeinfer.backends.base import Batch  # noqa: E402
from edgeinfer.convert import convert_checkpoint  # noqa: E402
from edgeinfer.engine.mtp import MtpDraft, forward_block, load_mtp, trunk_hidden  # noqa: E402
from edgeinfer.errors import NativeError  # noqa: E402
from edgeinfer.engine.speculative import SpecPolicy  # noqa: E402
from edgeinfer.gguf.reader import GGUFFile  # noqa: E402
from tests.support import tiny_checkpoints as tc  # noqa: E402

torch.set_num_threads(1)

IDS = [5, 77, 301, 12, 9, 250, 33, 140, 7, 64, 200, 18, 99, 3, 260, 41, 120, 8]
GREEDY = dict(temperature=0.0, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module", params=tuple(tc.QWEN35_KINDS))
def qwen35(request, tmp_path_factory):
    """(checkpoint dir, our F32 file) of one Qwen3.5 layout, its MTP block kept."""
    d = tmp_path_factory.mktemp(request.param)
    src = tc.build(request.param, d / "hf")
    path = d / "f32.gguf"
    convert_checkpoint(str(src), str(path), "f32")
    return src, path


def _weights(path) -> tuple[dict, dict]:
    g = GGUFFile(str(path))
    w = {n: np.frombuffer(t.data, dtype=np.float32).reshape(t.shape[::-1]) for n, t in g.tensors.items()}
    assert all(t.type == 0 for t in g.tensors.values())   # F32
    return g.metadata, w


def _reference(path) -> NextnReference:
    return NextnReference(*_weights(path))


# --------------------------------------------------------------------------- the file

def test_the_block_is_stored_as_llama_cpp_stores_it(qwen35, tmp_path):
    from tests.support.llama_cpp_convert import convert

    src, path = qwen35
    theirs = GGUFFile(str(convert(src, tmp_path / "llama.gguf", "f32", tmp_path, pre="qwen35")))
    ours = GGUFFile(str(path))
    n = ours.metadata["qwen35.block_count"] - 1
    assert ours.metadata["qwen35.nextn_predict_layers"] == theirs.metadata["qwen35.nextn_predict_layers"] == 1
    assert ours.metadata["qwen35.block_count"] == theirs.metadata["qwen35.block_count"]
    block = sorted(k for k in ours.tensors if k.startswith(f"blk.{n}."))
    assert block == sorted(k for k in theirs.tensors if k.startswith(f"blk.{n}."))
    assert {f"blk.{n}.nextn.{r}.weight" for r in ("eh_proj", "enorm", "hnorm", "shared_head_norm")} <= set(block)
    for name in block:
        a, b = ours.tensors[name], theirs.tensors[name]
        assert a.shape == b.shape, name
        np.testing.assert_array_equal(np.frombuffer(a.data, np.float32), np.frombuffer(b.data, np.float32),
                                      err_msg=name)


# --------------------------------------------------------------------------- the block's math

def _torch_block(src, ids: list[int]) -> np.ndarray:
    """The block's logits for entries 0..n-2 (entry p: token p + 1 and the trunk's state at p) from
    the Hugging Face checkpoint, in float64: transformers' trunk (last_hidden_state: after its final
    norm), then mtp.fc over [pre_fc_norm_embedding(embed); pre_fc_norm_hidden(h)], one
    transformers full-attention decoder layer with mtp.layers.0.*, mtp.norm, the head."""
    from safetensors.torch import load_file
    from transformers.models.qwen3_5 import modeling_qwen3_5 as q

    model = tf.Qwen3_5ForCausalLM.from_pretrained(str(src), dtype=torch.float64).eval()
    cfg = model.config
    cfg._attn_implementation = "eager"
    sd = {k: v.double() for k, v in load_file(str(src / "model.safetensors")).items() if k.startswith("mtp.")}
    full = cfg.layer_types.index("full_attention")
    layer = q.Qwen3_5DecoderLayer(cfg, full).double().eval()
    layer.load_state_dict({k[len("mtp.layers.0."):]: v for k, v in sd.items() if k.startswith("mtp.layers.0.")})

    def norm(name, x):
        n = q.Qwen3_5RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps).double()
        n.weight.data.copy_(sd[f"mtp.{name}.weight"])
        return n(x)

    with torch.no_grad():
        t = torch.tensor([ids])
        h = model.model(t).last_hidden_state[:, :-1]
        e = model.model.embed_tokens(t[:, 1:])
        x = torch.cat([norm("pre_fc_norm_embedding", e), norm("pre_fc_norm_hidden", h)], dim=-1) @ sd["mtp.fc.weight"].T
        n = x.shape[1]
        pos = torch.arange(n)[None]
        mask = torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)[None, None]
        x = layer(x, position_embeddings=model.model.rotary_emb(x, pos), attention_mask=mask, position_ids=pos)
        return model.lm_head(norm("norm", x))[0].numpy()


def test_reference_block_matches_transformers_layer(qwen35):
    src, path = qwen35
    want = _torch_block(src, IDS)
    ref = _reference(path)
    got, _ = ref.forward(IDS[1:], ref.trunk_hidden(IDS)[:-1])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=2e-6 * np.abs(want).max())


def test_native_block_matches_the_reference(qwen35):
    """All entries in one step, then the same entries fed 5, then 1 at a time (its own KV cells)."""
    _, path = qwen35
    ref = _reference(path)
    h = ref.trunk_hidden(IDS)[:-1]
    want, want_states = ref.forward(IDS[1:], h)
    n = len(IDS) - 1
    with edgeinfer.load(str(path), n_ctx=64, n_threads=2, n_slots=2, speculative="mtp") as eng:
        block = eng.scheduler.draft
        rt = block.runner.runtime
        logits = np.empty((n, rt.caps.n_vocab), np.float32)
        states = np.empty((n, rt.model.cfg.n_embd), np.float32)
        forward_block(rt, Batch.of_slot(0, IDS[1:], np.arange(n), np.arange(n), np.arange(n)), h, logits, states)
        scale = np.abs(want).max()
        np.testing.assert_allclose(logits, want, atol=2e-4 * scale)
        np.testing.assert_allclose(states, want_states, atol=2e-4 * np.abs(want_states).max())
        step = []
        for lo, hi in [(0, 5)] + [(i, i + 1) for i in range(5, n)]:
            rows = np.arange(hi - lo, dtype=np.int32)
            out = np.empty((hi - lo, rt.caps.n_vocab), np.float32)
            forward_block(rt, Batch.of_slot(1, IDS[1 + lo:1 + hi], np.arange(lo, hi), np.arange(lo, hi), rows),
                          h[lo:hi], out, np.empty((hi - lo, rt.model.cfg.n_embd), np.float32))
            step.append(out)
        np.testing.assert_allclose(np.concatenate(step), want, atol=2e-4 * scale)
        with pytest.raises(ValueError, match="hidden rows"):
            forward_block(rt, Batch.of_slot(0, IDS[1:3], [0, 1], [0, 1], [1]), h[:1], logits[:1], states[:1])


# --------------------------------------------------------------------------- in the engine

def _truth(path, prompt: list[int], n: int):
    with edgeinfer.load(str(path), n_ctx=128, n_threads=2) as e:
        got = e.generate(prompt, max_tokens=n, **GREEDY)
    return got.tokens, np.array([lp.logprob for lp in got.logprobs])


def test_every_proposal_is_the_reference_blocks_through_accepts_and_rejects(qwen35, monkeypatch):
    """The block's own proposal at every step equals the reference's drafts for the sequence so
    far; the engine then verifies a doctored proposal (a random number of the true tokens, then a
    wrong one), so that the block's ring goes through accepted and rejected drafts alike. The output
    stays plain decoding's."""
    _, path = qwen35
    n_new = 24
    want_tokens, want_lps = _truth(path, IDS, n_new)
    ref = _reference(path)
    rng = random.Random(3)
    seen: list[tuple[list[int], list[int]]] = []
    propose = MtpDraft.propose

    def doctored(self, slot, history, k):
        drafts = propose(self, slot, history, k)
        seen.append((list(history), drafts))
        done = len(history) - len(IDS)
        true = want_tokens[done:done + k]
        j = rng.randint(0, len(true))
        wrong = [(t + 1) % self.n_vocab for t in true[j:j + 1]]
        return (true[:j] + wrong)[:k] if drafts else drafts

    monkeypatch.setattr(MtpDraft, "propose", doctored)
    with edgeinfer.load(str(path), n_ctx=128, n_threads=2, speculative="mtp") as eng:
        eng.fix_speculation(3)
        got = eng.generate(IDS, max_tokens=n_new, **GREEDY)
    assert got.tokens == want_tokens
    np.testing.assert_allclose([lp.logprob for lp in got.logprobs], want_lps, atol=1e-4)
    assert 0 < got.stats.spec_accepted < got.stats.spec_proposed, got.stats
    assert len(seen) >= 8 and all(d for _, d in seen)
    for history, drafts in seen:
        assert drafts == ref.drafts(history, len(drafts)), history


def test_greedy_mtp_equals_plain_on_one_and_two_slots(qwen35):
    _, path = qwen35
    prompts = [IDS, IDS[3:15], [9, 9, 9, 40, 41, 42, 9, 9, 9, 40, 41]]
    n_new = 20
    want = [_truth(path, p, n_new) for p in prompts]
    for n_slots in (1, 2):
        with edgeinfer.load(str(path), n_ctx=128, n_threads=2, n_slots=n_slots, speculative="mtp",
                            spec_max_slots=2) as eng:
            eng.fix_speculation(4)
            gens = [eng.stream(p, max_tokens=n_new, **GREEDY) for p in prompts] if n_slots > 1 else None
            results = [g.result() for g in gens] if gens else [eng.generate(p, max_tokens=n_new, **GREEDY)
                                                              for p in prompts]
            for got, (tokens, lps) in zip(results, want):
                assert got.tokens == tokens
                np.testing.assert_allclose([lp.logprob for lp in got.logprobs], lps, atol=1e-4)
                assert got.stats.spec_proposed > 0, got.stats        # it drafted (and reports it)
            assert eng.scheduler.output.spec_proposed >= sum(r.stats.spec_proposed for r in results)


def test_seeded_sampling_with_mtp_draws_plain_sampling_tokens(qwen35):
    """Sampled output goes through the same verification: with a seed, plain decoding's tokens."""
    _, path = qwen35
    kw = dict(max_tokens=24, temperature=0.9, top_p=0.95, seed=5, ignore_eos=True)
    with edgeinfer.load(str(path), n_ctx=128, n_threads=2) as eng:
        want = eng.generate(IDS, **kw).tokens
    with edgeinfer.load(str(path), n_ctx=128, n_threads=2, speculative="mtp") as eng:
        eng.fix_speculation(3)
        got = eng.generate(IDS, **kw)
    assert got.tokens == want and got.stats.spec_proposed > 0, got.stats


def test_a_reused_prefix_keeps_drafting_when_the_block_holds_it(qwen35):
    """The second prompt extends the first request's: the trunk resumes from its cells and the
    block from its own ring, and drafting goes on; after a plain request the block lacks the
    trunk's states for the reused prefix, so that request decodes plainly (same tokens)."""
    _, path = qwen35
    first, second = IDS[:12], IDS[:12] + [7, 9, 11, 13]
    want = _truth(path, second, 16)
    with edgeinfer.load(str(path), n_ctx=128, n_threads=2, speculative="mtp") as eng:
        eng.fix_speculation(3)
        eng.generate(first, max_tokens=6, **GREEDY)
        got = eng.generate(second, max_tokens=16, **GREEDY)
        assert got.stats.cached_tokens > 0 and got.stats.spec_proposed > 0, got.stats
        assert got.tokens == want[0]
        np.testing.assert_allclose([lp.logprob for lp in got.logprobs], want[1], atol=1e-4)
    with edgeinfer.load(str(path), n_ctx=128, n_threads=2, speculative="mtp") as eng:
        eng.fix_speculation(3)
        eng.generate(first, max_tokens=6, speculative=None, **GREEDY)
        got = eng.generate(second, max_tokens=16, **GREEDY)
        assert got.stats.cached_tokens > 0 and got.stats.spec_proposed == 0, got.stats
        assert got.tokens == want[0]


def test_greedy_mtp_equals_plain_across_a_ring_slide(qwen35, monkeypatch):
    """A 40-cell ring that slides: the block's ring slides with it and keeps drafting after."""
    _, path = qwen35
    load = dict(n_ctx=40, n_threads=2, n_sink=4, overflow="slide")
    with edgeinfer.load(str(path), **load) as eng:
        want = eng.generate(IDS, max_tokens=60, **GREEDY)
    lengths: list[int] = []
    propose = MtpDraft.propose

    def counted(self, slot, history, k):
        out = propose(self, slot, history, k)
        lengths.append(len(history) if out else 0)
        return out

    monkeypatch.setattr(MtpDraft, "propose", counted)
    with edgeinfer.load(str(path), speculative="mtp", **load) as eng:
        eng.fix_speculation(3)
        got = eng.generate(IDS, max_tokens=60, **GREEDY)
    assert got.tokens == want.tokens
    np.testing.assert_allclose([lp.logprob for lp in got.logprobs], [lp.logprob for lp in want.logprobs], atol=1e-4)
    assert sum(n > 50 for n in lengths) >= 5, lengths      # drafts made after the ring slid


def _priced(eng, ks: list[int]) -> None:
    """Fixed step and draft costs (no clock in the test): a step of n tokens 30 + 2 (n - 1) ms, a
    draft token 4 ms, so that drafting pays when the drafts are mostly right and loses otherwise;
    ks gets the k the policy chooses at each step."""
    pol = eng.scheduler.policy
    choose = pol.choose_k
    pol.choose_k = lambda *a, **kw: ks.append(choose(*a, **kw)) or ks[-1]
    costs = pol.costs
    for n in range(1, 40):
        costs.observe_step(n, 0.030 + 0.002 * (n - 1))
    costs.observe_draft(1, 0.004)
    costs.observe_step = lambda n, s: None
    costs.observe_draft = lambda n, s: None


def test_the_adaptive_switch_turns_drafting_off_where_it_loses(qwen35, monkeypatch):
    """Random weights: the block's drafts are wrong, so after its first tries the policy decodes
    plainly; the same drafts made right (the true tokens, the block still run) keep it drafting."""
    _, path = qwen35
    n_new = 48
    ks: dict[str, list[int]] = {"loses": [], "wins": []}
    with edgeinfer.load(str(path), n_ctx=128, n_threads=2, speculative="mtp") as eng:
        _priced(eng, ks["loses"])
        loses = eng.generate(IDS, max_tokens=n_new, **GREEDY)
    truth, _ = _truth(path, IDS[1:], n_new)
    propose = MtpDraft.propose

    def right(self, slot, history, k):
        done = len(history) - (len(IDS) - 1)
        return truth[done:done + len(propose(self, slot, history, k))]

    monkeypatch.setattr(MtpDraft, "propose", right)
    with edgeinfer.load(str(path), n_ctx=128, n_threads=2, speculative="mtp") as eng:
        _priced(eng, ks["wins"])
        wins = eng.generate(IDS[1:], max_tokens=n_new, **GREEDY)
    assert wins.tokens == truth and wins.stats.spec_accepted == wins.stats.spec_proposed >= n_new // 2, wins.stats
    assert loses.stats.spec_accepted == 0 < loses.stats.spec_proposed, loses.stats
    # the k chosen at each step: drafting goes on while it wins, stops (but for a probe) when it loses
    assert all(k > 0 for k in ks["wins"]), ks["wins"]
    late = ks["loses"][len(ks["loses"]) // 2:]
    assert ks["loses"][0] > 0 and len(late) >= 10 and sum(k > 0 for k in late) <= 1, ks["loses"]
    pol = SpecPolicy(max_k=4)
    assert set(pol.seen) == {"lookup", "draft", "mtp"} and pol.new_slot("mtp").mode == "mtp"


def test_the_blocks_memory_is_one_attention_layer_and_no_second_head(qwen35):
    _, path = qwen35
    with edgeinfer.load(str(path), n_ctx=64, n_threads=2, n_slots=2, speculative="mtp") as eng:
        cfg, caps = eng.config, eng.scheduler.draft.runner.caps
        assert caps.kv_bytes == 2 * 2 * 64 * cfg.n_head_kv * cfg.head_dim * 2    # K and V, 2 slots, 64 cells, f16
        head = cfg.n_vocab * cfg.n_embd * 4
        assert caps.packed_bytes < head      # its layer only: the head is the trunk's packed copy
        info = eng.info()
        assert (info["draft"], info["draft_kv_bytes"], info["draft_packed_weight_bytes"]) == \
            ("mtp", caps.kv_bytes, caps.packed_bytes)


# --------------------------------------------------------------------------- the memory plan

@pytest.mark.parametrize("ctx,slots,max_batch,kv", [(64, 2, 256, "f16"), (200, 3, 64, "q8_0")])
def test_plan_prices_the_blocks_kv_as_the_engine_allocates_it(qwen35, ctx, slots, max_batch, kv):
    """`edgeinfer plan --speculative mtp` (tools/plan.py): the block's KV ring equals what info()
    reports and the native runtime allocated (ei_runtime_kv_bytes), its buffers the block
    runtime's within 5%, its weights the block's tensors; without the flag none of it is counted
    and the trunk's weights leave the block's tensors out (the trunk never reads them)."""
    from edgeinfer.tools import plan as P

    _, path = qwen35
    m = P.model_shape(path)
    kv = kv if m.head_dim % 32 == 0 else "f16"   # a Q8_0 arena needs heads of whole blocks
    with edgeinfer.load(str(path), n_ctx=ctx, n_slots=slots, max_batch=max_batch, kv_type=kv, n_threads=2,
                        speculative="mtp") as eng:
        info, caps = eng.info(), eng.scheduler.draft.runner.caps
        row = P.plan_one(m, ctx, slots, kv, max_batch=max_batch, n_threads=info["n_threads"], speculative="mtp")
        assert row.mtp_kv_bytes == info["draft_kv_bytes"] == caps.kv_bytes > 0
        assert abs(row.mtp_scratch - caps.scratch_bytes) <= 0.05 * caps.scratch_bytes, (row.mtp_scratch, caps.scratch_bytes)
        assert row.kv_bytes == info["kv_bytes"] and row.state_bytes == info["state_bytes"]
        n = eng.config.n_layer
        block = {k: t.nbytes for k, t in eng.gguf.tensors.items() if k.startswith(f"blk.{n}.")}
        assert row.mtp_weights == sum(block.values()) >= caps.packed_bytes
        assert m.weights_bytes + m.mtp_file_bytes == sum(t.nbytes for t in eng.gguf.tensors.values())
        assert m.mtp_file_bytes == sum(block.values())
    plain = P.plan_one(m, ctx, slots, kv, max_batch=max_batch, n_threads=info["n_threads"])
    assert (plain.mtp_kv_bytes, plain.mtp_weights, plain.mtp_scratch) == (0, 0, 0)
    assert row.total - plain.total >= row.mtp_kv_bytes + row.mtp_weights + row.mtp_scratch


def test_plan_cli_shows_the_mtp_draft_apart(qwen35, tmp_path):
    from typer.testing import CliRunner

    from edgeinfer.cli import app

    src, path = qwen35
    cli = CliRunner()
    args = ["plan", str(path), "--ctx", "128,512", "--slots", "1,2", "--memory", "8GiB"]
    plain = cli.invoke(app, args)
    assert plain.exit_code == 0, plain.output
    assert "MTP block" in plain.output and "unused" in plain.output and "MTP KV" not in plain.output
    spec = cli.invoke(app, args + ["--speculative", "mtp"])
    assert spec.exit_code == 0, spec.output
    assert "MTP KV" in spec.output and "unused" not in spec.output
    got = json.loads(cli.invoke(app, args + ["--speculative", "mtp", "--json"]).output)
    for r in got["rows"]:   # one attention layer's cells, f16: 2 (K, V) x heads x head_dim x 2 B per cell
        with edgeinfer.load(str(path), n_ctx=r["ctx"], n_slots=r["slots"], n_threads=1, speculative="mtp") as eng:
            assert r["mtp_kv_bytes"] == eng.info()["draft_kv_bytes"]
    base = json.loads(cli.invoke(app, args + ["--json"]).output)
    assert [r["total"] < s["total"] for r, s in zip(base["rows"], got["rows"])] == [True] * 4
    # a file without the block: a clear error naming it, no table
    no_mtp = tmp_path / "no_mtp.gguf"
    convert_checkpoint(str(src), str(no_mtp), "f32", keep_mtp=False)
    bad = cli.invoke(app, ["plan", str(no_mtp), "--speculative", "mtp"])
    assert bad.exit_code == 1 and "no MTP block" in bad.output and "ctx" not in bad.output.split("error:")[0]
    assert "MTP block" not in cli.invoke(app, ["plan", str(no_mtp), "--ctx", "128"]).output
    other = cli.invoke(app, ["plan", str(path), "--speculative", "lookup"])
    assert other.exit_code == 1 and "--speculative" in other.output


def test_serve_memory_check_counts_the_mtp_draft(qwen35, tmp_path):
    """`serve --speculative mtp --memory X` checks the load it makes: the default model with its
    MTP block's ring, weights and buffers (plan_serve's speculative map). A budget that holds the
    plain load exactly is refused with the draft, naming it; a file without the block is left
    to Engine.load's own error rather than a crash in the check."""
    import typer
    from typer.testing import CliRunner

    from edgeinfer.cli import app
    from edgeinfer.cli.serve import _check_memory
    from edgeinfer.tools import plan as P

    src, path = qwen35
    m = P.model_shape(path)
    budget = P.plan_serve([("", m)], 128, 2, n_threads=2).total
    assert P.plan_serve([("", m)], 128, 2, n_threads=2, speculative={"": "mtp"}).total > budget
    _check_memory([("", str(path))], str(budget), 128, 2, "f16", 256, 2, False)   # fits: returns
    with pytest.raises(typer.Exit):
        _check_memory([("", str(path))], str(budget), 128, 2, "f16", 256, 2, False, speculative="mtp")
    r = CliRunner().invoke(app, ["serve", str(path), "--memory", str(budget), "--ctx", "128", "--slots", "2",
                                 "--threads", "2", "--speculative", "mtp"])
    assert r.exit_code == 1 and "MTP draft" in r.output, r.output
    no_mtp = tmp_path / "no_mtp.gguf"
    convert_checkpoint(str(src), str(no_mtp), "f32", keep_mtp=False)
    _check_memory([("", str(no_mtp))], "8GiB", 128, 2, "f16", 256, 2, False, speculative="mtp")


# --------------------------------------------------------------------------- bad input

def test_bad_mtp_arguments_are_typed_errors(qwen35, tmp_path):
    src, path = qwen35
    no_mtp = tmp_path / "no_mtp.gguf"
    convert_checkpoint(str(src), str(no_mtp), "f32", keep_mtp=False)
    with pytest.raises(ValueError, match="MTP block"):
        edgeinfer.load(str(no_mtp), n_ctx=32, n_threads=1, speculative="mtp")
    with pytest.raises(ValueError, match="draft=PATH"):
        edgeinfer.load(str(path), n_ctx=32, n_threads=1, speculative="mtp", draft=str(path))
    with edgeinfer.load(str(path), n_ctx=32, n_threads=1) as eng:
        with pytest.raises(ValueError, match="speculative='mtp'"):
            eng.generate([1, 2], speculative="mtp")

        class OtherBackend:
            name = "cuda"

        with pytest.raises(ValueError, match="CPU backend only"):
            load_mtp(OtherBackend(), eng.gguf, eng.config, None, eng.runner)
        eng.generate([1, 2, 3], max_tokens=1)
        rt = eng.runner.runtime
        assert trunk_hidden(rt, [0, 2]).shape == (2, eng.config.n_embd)
        with pytest.raises(NativeError, match="outside the latest forward"):
            trunk_hidden(rt, [3])
        with pytest.raises(NativeError, match="no MTP block input"):   # the trunk is not a block
            forward_block(rt, Batch.of_slot(0, [1], [0], [0], [0]), np.zeros((1, eng.config.n_embd)),
                          np.empty((1, eng.config.n_vocab), np.float32), np.empty((1, eng.config.n_embd), np.float32))
