"""The whole model against outside oracles: the float64 exact math and llama.cpp, on each real
file (SmolLM2-135M-Instruct Q4_1, Gemma 3 270M Q4_K_M).

Judged as the issue asks: KL(exact || edgeinfer) must be at most 1.25x
KL(exact || llama.cpp) on the same tokens, and edgeinfer must agree with
llama.cpp directly (top-1 and mean KL bars per file, below); greedy tokens are
llama.cpp's argmax on the same history wherever it is not a near tie.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from tests.support.strict import require

import edgeinfer

require("llama_cpp")
require("gguf", "the gguf package is a test dependency")

pytestmark = [pytest.mark.oracle, pytest.mark.slow]

from tests.support.llama_oracle import compare_logits, greedy_disagreements, llama_logits, text_ids  # noqa: E402
from tests.support.reference_forward import reference_logits  # noqa: E402
from tests.support.texts import DIALOGUE_CODE, PROMPTS, STORY, TECHNICAL, TEXTS  # noqa: E402


@dataclass(frozen=True)
class RealFile:
    fixture: str              # the conftest fixture that fetches the file
    texts: dict[str, str]     # teacher-forced texts
    top1: float               # direct top-1 agreement with llama.cpp, at least
    kl: float                 # direct mean KL(llama.cpp || edgeinfer), at most
    tie_gap: float            # llama.cpp's logit gap up to which a greedy step is a near tie
    judged: float             # the share of greedy steps beyond a near tie, at least


# SmolLM2 Q4_1, measured: direct top-1 0.962-0.964, KL 0.0033-0.0041; against the exact math
# our top-1 is within 0.011 of llama.cpp's. llama.cpp rounds the activations to 8 bits before
# each dot product: the gap between two tokens moves by up to 0.44 between the runtimes
# (5 prompts x 32 steps), so a step where llama.cpp's argmax leads our token by more than 0.6
# is a wrong token, not a near tie.
SMOLLM2 = RealFile("smollm2_path", TEXTS, top1=0.93, kl=0.008, tie_gap=0.6, judged=0.5)

# Gemma 3 270M Q4_K_M (Q4_K / Q5_0 / Q6_K / Q8_0 tensors, logits up to ~27, no softcap), measured:
# direct top-1 0.956-0.965, KL 0.0061-0.0066, the same before and past the 512-token window;
# against the exact math our KL is 0.40x llama.cpp's. Greedy: llama.cpp's argmax differed from
# ours at 8 of 160 steps, by up to 1.02 logits, and there the exact math sides with us (it ranks
# our token 0.26 higher: llama.cpp's rounding moved that gap by 1.40); with the tie bar at 1.5,
# 85 of 160 steps are judged.
GEMMA3 = RealFile("gemma3_path", {"story+technical": STORY + "\n" + TECHNICAL, "dialogue_code": DIALOGUE_CODE},
                  top1=0.93, kl=0.010, tie_gap=1.5, judged=0.4)


@pytest.fixture(scope="module", params=[SMOLLM2, GEMMA3], ids=lambda f: f.fixture.removesuffix("_path"))
def real(request):
    """(RealFile, path, Engine) for each real file."""
    case = request.param
    path = request.getfixturevalue(case.fixture)
    eng = edgeinfer.load(path, n_ctx=1024, n_threads=2)
    yield case, path, eng
    eng.close()


@pytest.fixture(scope="module")
def engine(smollm2_path):
    eng = edgeinfer.load(smollm2_path, n_ctx=1024, n_threads=2)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def texts(smollm2_path):
    ids = text_ids(smollm2_path)
    assert len(ids) >= 3 and all(len(v) >= 256 for v in ids.values())
    return ids


def test_logits_at_least_as_accurate_as_llama_cpp(real):
    case, path, engine = real
    texts = text_ids(path, case.texts)
    assert all(len(v) >= 256 for v in texts.values())
    window = int(engine.gguf.metadata.get(f"{engine.config.arch}.attention.sliding_window", 0))
    assert not window or max(len(v) for v in texts.values()) >= window + 128, "no text runs past the window"
    ours_all, theirs_all = [], []
    for name, ids in texts.items():
        exact = reference_logits(path, ids)
        ours = engine.logits(ids)
        theirs = llama_logits(path, ids)
        assert np.isfinite(ours).all()
        o, t = compare_logits(exact, ours), compare_logits(exact, theirs)
        direct = compare_logits(theirs, ours)
        print(f"\n{name} ({len(ids)} tokens): exact-vs-edgeinfer KL {o['kl_mean']:.5f} top1 {o['top1']:.3f} | "
              f"exact-vs-llama.cpp KL {t['kl_mean']:.5f} top1 {t['top1']:.3f} | "
              f"llama.cpp-vs-edgeinfer KL {direct['kl_mean']:.5f} top1 {direct['top1']:.3f}")
        ours_all.append(o["kl_mean"])
        theirs_all.append(t["kl_mean"])
        assert direct["top1"] >= case.top1 and direct["kl_mean"] <= case.kl, (name, direct)
        assert o["top1"] >= t["top1"] - 0.03, (name, o, t)
    assert np.mean(ours_all) <= 1.25 * np.mean(theirs_all)


def test_greedy_generation_matches_llama_cpp(real):
    """32 greedy tokens per prompt, every one llama.cpp's argmax on the same history except
    where llama.cpp's own logits call it a near tie (tests/support/llama_oracle.py,
    greedy_disagreements); and enough steps are judged (a tie bar that excused everything
    would pass any output)."""
    case, path, engine = real
    n = 32
    judged = 0
    for prompt in PROMPTS:
        ids = engine.tokenize(prompt)
        ours = engine.generate(ids, max_tokens=n, temperature=0.0, ignore_eos=True).tokens
        assert len(ours) == n
        bad = greedy_disagreements(path, ids, ours, case.tie_gap)
        assert not bad, (prompt, bad)
        rows = llama_logits(path, ids + ours[:-1])[len(ids) - 1:]
        top2 = np.sort(rows, axis=-1)[:, -2:]
        judged += int(np.sum(top2[:, 1] - top2[:, 0] > case.tie_gap))
    print(f"\ngreedy: {judged} of {n * len(PROMPTS)} steps beyond a near tie")
    assert judged >= case.judged * n * len(PROMPTS), judged


def test_q8_0_kv_arena_costs_little_accuracy(engine, smollm2_path, texts):
    """kv_type="q8_0" halves the KV arena; judged against the exact math next to the f16 arena."""
    q8 = edgeinfer.load(smollm2_path, n_ctx=1024, n_threads=2, kv_type="q8_0")
    assert q8.info()["kv_bytes"] * 64 == engine.info()["kv_bytes"] * 34   # 34 bytes per 32 values vs 64
    kl16, kl8 = [], []
    for name, ids in texts.items():
        exact = reference_logits(smollm2_path, ids)
        f16, q8_logits = engine.logits(ids), q8.logits(ids)
        kl16.append(compare_logits(exact, f16)["kl_mean"])
        kl8.append(compare_logits(exact, q8_logits)["kl_mean"])
        assert compare_logits(f16, q8_logits)["top1"] >= 0.9
    print(f"\nmean KL vs exact: f16 KV {np.mean(kl16):.5f}, q8_0 KV {np.mean(kl8):.5f}")
    assert np.mean(kl8) <= 1.5 * np.mean(kl16)
