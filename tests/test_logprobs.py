"""Every logprob a generation reports is log_softmax of the model's logits at that step
(tests/support/logprob_oracle.py): the token's and the top-n alternatives', whatever the
request's temperature, filters, penalties and logit_bias (OpenAI's logprobs are of the model's
distribution), from plain decode steps, speculative verify rows and batched steps alike. The
oracle's logits come from Engine.logits teacher-forced on the prompt and the generated tokens."""
from __future__ import annotations

import threading

import pytest

import edgeinfer
from tests.support.logprob_oracle import assert_logprobs_match, logprob_errors, teacher_forced_rows

PROMPT = "Copy this list: apples, pears, plums, figs, grapes, limes. Copy: apples, pears,"
N_TOP = 5

SETTINGS = {
    "greedy": dict(temperature=0.0),
    "temperature": dict(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0, seed=1),
    "filters": dict(temperature=1.2, top_k=20, top_p=0.9, min_p=0.05, seed=2),
    "penalties": dict(temperature=0.8, repeat_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.5, seed=3),
}


@pytest.fixture(scope="module")
def engine(smollm2_path):
    with edgeinfer.load(smollm2_path, n_ctx=256, n_threads=2, n_slots=2) as eng:
        yield eng


def _check(eng, ids, out, n_top=N_TOP):
    assert_logprobs_match(teacher_forced_rows(eng.logits, ids, out.tokens), out.tokens, out.logprobs, n_top)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_logprobs_are_log_softmax_of_the_logits(engine, name):
    ids = engine.tokenize(PROMPT)
    out = engine.generate(ids, max_tokens=24, ignore_eos=True, logprobs=N_TOP, **SETTINGS[name])
    assert len(out.tokens) == 24
    _check(engine, ids, out)


def test_logit_bias_does_not_enter_the_logprobs(engine):
    """The bias changes what is sampled (the banned token never comes), not the model's
    distribution that the logprobs report."""
    ids = engine.tokenize(PROMPT)
    plain = engine.generate(ids, max_tokens=8, temperature=0.0, ignore_eos=True)
    banned = plain.tokens[1]
    boosted = next(t for t in plain.tokens[2:] if t != banned)
    out = engine.generate(ids, max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=N_TOP,
                          logit_bias={banned: -100, boosted: 5.0})
    assert banned not in out.tokens and out.tokens != plain.tokens
    _check(engine, ids, out)


def test_logprobs_without_alternatives(engine):
    ids = engine.tokenize(PROMPT)
    out = engine.generate(ids, max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=0)
    _check(engine, ids, out, n_top=0)


@pytest.mark.parametrize("sampling", ["greedy", "filters"])
def test_logprobs_of_speculative_verify_rows(engine, sampling):
    """Tokens confirmed from a verify step's rows report those rows' distribution."""
    ids = engine.tokenize(PROMPT)
    engine.fix_speculation(4)
    try:
        out = engine.generate(ids, max_tokens=24, ignore_eos=True, logprobs=N_TOP, speculative="lookup",
                              **SETTINGS[sampling])
    finally:
        engine.fix_speculation(None)
    assert out.stats.spec_accepted > 0
    _check(engine, ids, out)


def test_logprobs_of_batched_steps(engine):
    """Two sequences decoding in the same steps: each reports its own row's distribution."""
    prompts = [engine.tokenize(PROMPT), engine.tokenize("The capital of France is")]
    outs: list = [None, None]
    start = threading.Barrier(2)

    def work(i):
        start.wait()
        outs[i] = engine.generate(prompts[i], max_tokens=16, ignore_eos=True, logprobs=N_TOP,
                                  **SETTINGS["filters"])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for ids, out in zip(prompts, outs):
        _check(engine, ids, out)


def test_the_oracle_refuses_processed_distributions(engine):
    """logprob_errors is not blind: logprobs of the temperature-scaled, the penalised or the
    biased logits, or alternatives that are not the top n, are reported."""
    import numpy as np

    from edgeinfer.engine.generation import token_logprob

    ids = engine.tokenize(PROMPT)
    out = engine.generate(ids, max_tokens=8, temperature=0.0, ignore_eos=True)
    rows = teacher_forced_rows(engine.logits, ids, out.tokens)
    good = [token_logprob(r, t, N_TOP) for r, t in zip(rows, out.tokens)]
    assert not logprob_errors(rows, out.tokens, good, N_TOP)
    scaled = [token_logprob(r / 0.7, t, N_TOP) for r, t in zip(rows, out.tokens)]
    assert logprob_errors(rows, out.tokens, scaled, N_TOP)
    biased = rows.copy()
    biased[:, out.tokens[0]] += 1.0
    assert logprob_errors(rows, out.tokens, [token_logprob(r, t, N_TOP) for r, t in zip(biased, out.tokens)], N_TOP)
    shifted = [token_logprob(r, t, N_TOP + 1) for r, t in zip(rows, out.tokens)]
    for lp in shifted:
        del lp.top[0]
    assert logprob_errors(rows, out.tokens, shifted, N_TOP)
    assert np.isfinite(rows).all()
