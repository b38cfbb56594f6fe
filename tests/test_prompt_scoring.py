"""Scoring a text: `echo` with `logprobs` on /v1/completions (each prompt token's log-probability
given the tokens before it, as OpenAI's legacy completions and vLLM give them), and
lm-evaluation-harness's `local-completions` model run against the server with its tokenizer
taken from the server (vLLM's /tokenizer_info, /tokenize and /detokenize): its loglikelihood
requests are what llama.cpp's logits on the same file give.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.support.strict import require

openai = require("openai", "the openai client is the echo field's oracle")
require("llama_cpp", "llama.cpp's logits are the scores' oracle")
lm_eval = require("lm_eval", "lm-evaluation-harness is the scoring client's oracle")
require("tenacity", "lm-evaluation-harness's API models need it (lm_eval[api])")

from lm_eval.api.instance import Instance
from lm_eval.models.openai_completions import LocalCompletionsAPI

from tests.support.llama_oracle import llama_logits, llama_tokenize, log_softmax
from tests.support.logprob_oracle import logprob_errors
from tests.support.serving import openai_client, smollm2_server
from tests.test_server import request

pytestmark = [pytest.mark.oracle]

TEXT = "The capital of France is Paris, and the capital of Italy is Rome."
# Our logprobs against llama.cpp's on the same Q4_1 file differ by their kernels' rounding:
# 0.02-0.06 on average, 0.16 at most over three texts (2026-12-07); a token off by one is 3-11 away.
TOL_MEAN, TOL_MAX = 0.1, 0.5
# (context, continuation): likely and unlikely ones, one the model's greedy choice
PAIRS = [("The capital of France is", " Paris"), ("The capital of France is", " a banana split"),
         ("Water boils at 100 degrees", " Celsius"), ("1, 2, 3, 4,", " 5")]


@pytest.fixture(scope="module")
def server(smollm2_path):
    with smollm2_server(smollm2_path) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def test_echoed_prompt_logprobs_are_log_softmax_of_the_logits(smollm2_path, server, client):
    """max_tokens 0: the prompt alone, its tokens llama.cpp's, the first without a logprob, each
    other one with its 5 alternatives: log_softmax of the engine's teacher-forced logits, and
    llama.cpp's on the same file within the two engines' rounding."""
    r = client.completions.create(model="smollm2", prompt=TEXT, echo=True, max_tokens=0, logprobs=5)
    ch = r.choices[0]
    ids = llama_tokenize(smollm2_path, TEXT)
    assert (ch.text, ch.finish_reason, r.usage.completion_tokens) == (TEXT, "length", 0)
    lp = ch.logprobs
    assert "".join(lp.tokens) == TEXT and len(lp.tokens) == len(ids) == r.usage.prompt_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(TEXT[o:o + len(t)] == t for o, t in zip(lp.text_offset, lp.tokens))
    eng = server.state.require_engine()
    from edgeinfer.engine import TokenLogprob
    pieces = {i: eng.tokenizer.token_to_bytes(i).decode("utf-8", "replace") for i in range(eng.config.n_vocab)}
    by_piece = {v: k for k, v in pieces.items()}
    got = [TokenLogprob(ids[k], lp.token_logprobs[k], [(by_piece[p], v) for p, v in lp.top_logprobs[k].items()])
           for k in range(1, len(ids))]
    assert not logprob_errors(eng.logits(ids)[:-1], ids[1:], got, n_top=5)
    theirs = log_softmax(llama_logits(smollm2_path, ids))
    diff = np.array([abs(lp.token_logprobs[k] - theirs[k - 1, ids[k]]) for k in range(1, len(ids))])
    assert diff.mean() < TOL_MEAN and diff.max() < TOL_MAX, diff


def test_echo_puts_the_prompt_before_the_reply(client):
    """The reply is the prompt and the completion the same request gives without echo; the
    logprobs run on from the prompt's into the reply's, plain and streamed."""
    kw = {"model": "smollm2", "prompt": "Water boils at", "max_tokens": 8, "temperature": 0, "logprobs": 2}
    plain = client.completions.create(**kw).choices[0]
    echoed = client.completions.create(**kw, echo=True).choices[0]
    assert echoed.text == "Water boils at" + plain.text
    n = len(echoed.logprobs.tokens) - len(plain.logprobs.tokens)
    assert echoed.logprobs.token_logprobs[n:] == plain.logprobs.token_logprobs
    assert all(echoed.text[o:o + len(t)] == t for o, t in zip(echoed.logprobs.text_offset, echoed.logprobs.tokens))
    chunks = [c.choices[0].text for c in client.completions.create(**kw, echo=True, stream=True)]
    assert chunks[0] == "Water boils at" and "".join(chunks) == echoed.text


def test_a_prompt_longer_than_a_chunk_of_logits(server, client):
    """A prompt scored in more than one chunk of logits (341 rows for SmolLM2's vocabulary):
    every token's logprob is log_softmax of the engine's teacher-forced logits."""
    text = " ".join(f"item{i} costs {i % 7} coins;" for i in range(60))
    r = client.completions.create(model="smollm2", prompt=text, echo=True, max_tokens=0, logprobs=1)
    eng = server.state.require_engine()
    ids = eng.tokenize(text)
    assert 341 < len(ids) <= 512
    ref = log_softmax(eng.logits(ids))
    got = r.choices[0].logprobs.token_logprobs
    assert max(abs(got[k] - ref[k - 1, ids[k]]) for k in range(1, len(ids))) < 1e-4


def test_the_completion_reuses_the_scored_prompt(client):
    """An echoed prompt is computed once: scored first, its cells left in the slot, where the
    completion finds all but its last token (which a completion always feeds again)."""
    text = "A prompt seen once, then scored: " + " ".join(f"w{i}" for i in range(40))
    r = client.completions.create(model="smollm2", prompt=text, echo=True, max_tokens=2, logprobs=1, temperature=0)
    assert r.usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens - 1


@pytest.mark.parametrize("batch_size", [1, 4])
def test_lm_evaluation_harness_scores_as_llama_cpp_does(smollm2_path, server, batch_size):
    """lm-evaluation-harness's local-completions model, its tokenizer the server's (remote), a
    request a pair or four pairs in one (a list of prompts): each loglikelihood is the sum of
    llama.cpp's log-softmax over the continuation's tokens (within TOL_MAX a token), and "is
    greedy" is whether llama.cpp's argmax is each of them."""
    lm = LocalCompletionsAPI(base_url=server.url + "/v1/completions", model="smollm2", tokenizer_backend="remote",
                             max_length=512, batch_size=batch_size)
    got = lm.loglikelihood([Instance(request_type="loglikelihood", doc={}, arguments=p, idx=i)
                            for i, p in enumerate(PAIRS)])
    for (ctx, cont), (score, greedy) in zip(PAIRS, got):
        c, whole = llama_tokenize(smollm2_path, ctx), llama_tokenize(smollm2_path, ctx + cont)
        ref = log_softmax(llama_logits(smollm2_path, whole))
        rows = range(len(c), len(whole))
        assert abs(score - sum(ref[k - 1, whole[k]] for k in rows)) < TOL_MAX * len(rows), (ctx, cont)
        assert greedy == all(ref[k - 1].argmax() == whole[k] for k in rows), (ctx, cont)
    assert [g for _, g in got] != [got[0][1]] * len(got)     # the pairs hold greedy and non-greedy ones


def test_an_end_of_text_completion_is_listed_last(smollm2_path, server, client):
    """A completion ended by the end-of-text token (forced here) still lists that token last,
    with its logprob, so lm-evaluation-harness's `[ctxlen:-1]` keeps every continuation token."""
    from tests.support.llama_oracle import get_llama
    eos = get_llama(smollm2_path).token_eos()
    r = client.completions.create(model="smollm2", prompt="The capital of France is", echo=True, max_tokens=1,
                                  logprobs=1, temperature=0, logit_bias={str(eos): 100})
    ch, n = r.choices[0], len(llama_tokenize(smollm2_path, "The capital of France is"))
    assert (ch.text, ch.finish_reason) == ("The capital of France is", "stop")
    assert len(ch.logprobs.tokens) == n + 1 and ch.logprobs.token_logprobs[-1] is not None
    eng = server.state.require_engine()
    assert ch.logprobs.tokens[-1] == eng.tokenizer.token_to_bytes(eos).decode()
    plain = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=1, logprobs=1,
                                      temperature=0, logit_bias={str(eos): 100}).choices[0]
    assert plain.logprobs is None or plain.logprobs.tokens == []        # without echo, as before


def test_alternatives_of_the_same_text_keep_the_likeliest(server, client):
    """Byte tokens of a character split across tokens render alike: the alternatives keyed by
    text keep the likeliest one's value, so the first key's value is the row's maximum."""
    text = "Emoji 🤖 and 中文字 ok"
    r = client.completions.create(model="smollm2", prompt=text, echo=True, max_tokens=0, logprobs=5)
    eng = server.state.require_engine()
    ids = eng.tokenize(text)
    ref = log_softmax(eng.logits(ids))
    tops = r.choices[0].logprobs.top_logprobs
    piece = [eng.tokenizer.token_to_bytes(i).decode("utf-8", "replace") for i in range(eng.config.n_vocab)]
    shared = [k for k in range(1, len(ids))         # rows whose likeliest text another of the top 5 shares
              if [piece[i] for i in np.argsort(-ref[k - 1])[:5]].count(piece[int(ref[k - 1].argmax())]) > 1]
    assert shared, "the text has no row to test"
    for k in range(1, len(ids)):
        assert abs(max(tops[k].values()) - ref[k - 1].max()) < 1e-4, k


def test_vllm_tokenizer_routes(smollm2_path, server):
    """/tokenizer_info names llama.cpp's special tokens; /tokenize takes vLLM's fields and gives
    its count; /detokenize gives the text under vLLM's key too."""
    from tests.support.llama_oracle import get_llama
    llm = get_llama(smollm2_path)
    _, _, info = request(server.url + "/tokenizer_info")
    assert info["eos_token"] == llm.detokenize([llm.token_eos()], special=True).decode()
    assert info["model_max_length"] == 512 and "im_start" in info["chat_template"]
    _, _, tok = request(server.url + "/tokenize", "POST", {"prompt": TEXT, "add_special_tokens": False})
    assert tok["tokens"] == llama_tokenize(smollm2_path, TEXT, add_bos=False) and tok["count"] == len(tok["tokens"])
    _, _, text = request(server.url + "/detokenize", "POST", {"tokens": tok["tokens"]})
    assert text["prompt"] == text["content"] == TEXT


def test_echo_with_suffix_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="echo"):
        client.completions.create(model="smollm2", prompt="a", suffix="b", echo=True, max_tokens=1)
