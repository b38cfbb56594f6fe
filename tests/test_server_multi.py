"""`edgeinfer serve` with several models (a request's `model` picks one; the fallback route)
and the rest of the OpenAI surface: n > 1, stop (at most 4), seed, user, max_tokens omitted.

Most tests serve SmolLM2 Q4_1 loaded twice, once with an f16 KV arena and once with q8_0:
one file that is always there, and two engines whose log-probabilities differ, so a reply
shows which one served it. Two genuinely different models (SmolLM2 and a tiny Gemma 3:
another vocabulary, tokenizer and chat template) share a server in
test_two_families_each_request_gets_its_own_tokenizer_and_template."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from tests.support.strict import require

import edgeinfer
import edgeinfer.errors
from edgeinfer.backends.base import Batch
from edgeinfer.server import ServerThread
from edgeinfer.server.app import _sibling_seeds
from tests.test_server import _free_port, request, wait_idle, wait_ready

openai = require("openai", "the openai client is the server's oracle")
parser = require("prometheus_client.parser", "prometheus-client parses /metrics")

N_CTX = 96
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def engines(smollm2_path):
    a = edgeinfer.load(smollm2_path, n_ctx=N_CTX, n_threads=2, n_slots=3)
    b = edgeinfer.load(smollm2_path, n_ctx=N_CTX, n_threads=2, n_slots=1, max_queue=0, kv_type="q8_0")
    yield a, b
    a.close()
    b.close()


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    """A tiny random-weight Gemma 3 (SentencePiece vocabulary of a few hundred pieces, Gemma's
    turn template), converted by our converter: (its GGUF, its Hugging Face checkpoint)."""
    require("torch", "tiny checkpoints are built with torch")
    require("transformers", "tiny checkpoints are built with transformers")
    require("sentencepiece", "the tiny Gemma 3 has a SentencePiece vocabulary")
    from tests.support import tiny_checkpoints

    from edgeinfer.convert import convert_checkpoint

    root = tmp_path_factory.mktemp("gemma3")
    checkpoint = tiny_checkpoints.build("gemma3", root / "hf")
    path = root / "gemma3.gguf"
    convert_checkpoint(str(checkpoint), str(path), "f32")
    return path, checkpoint


def metric(url: str, name: str, **labels) -> float:
    """One sample of /metrics, read with prometheus-client's own parser (0 when absent)."""
    _, _, text = request(url + "/metrics")
    for fam in parser.text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def client_of(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_two_models_each_request_gets_its_own(engines):
    """A request naming a model is served by that model's engine: its log-probabilities are
    that engine's own (and differ from the other's), `model` names it, and the per-model
    counters of /metrics count it; /v1/models lists both; another name is 404."""
    a, b = engines
    with ServerThread(models={"f16": a, "q8": b}) as srv:
        c = client_of(srv)
        assert [m.id for m in c.models.list().data] == ["f16", "q8"]
        assert c.models.retrieve("q8").id == "q8"
        seen = {}
        for name, eng in (("f16", a), ("q8", b)):
            r = c.completions.create(model=name, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=1,
                                     extra_body={"ignore_eos": True})
            own = eng.generate(PROMPT, max_tokens=6, temperature=0, logprobs=1, ignore_eos=True)
            assert r.model == name
            assert r.choices[0].logprobs.token_logprobs == [x.logprob for x in own.logprobs], name
            seen[name] = r.choices[0].logprobs.token_logprobs
            assert metric(srv.url, "edgeinfer_generation_tokens_total", model=name) == 6
        assert seen["f16"] != seen["q8"]
        # The request with no model goes to the first; a name served nowhere is 404.
        st, _, out = request(srv.url + "/v1/completions", "POST", {"prompt": PROMPT, "max_tokens": 1})
        assert st == 200 and out["model"] == "f16"
        with pytest.raises(openai.NotFoundError) as e:
            c.completions.create(model="gpt-4o", prompt=PROMPT, max_tokens=1)
        assert e.value.code == "model_not_found" and "'f16', 'q8'" in str(e.value)
        assert metric(srv.url, "edgeinfer_slots_total", model="f16") == 3
        assert metric(srv.url, "edgeinfer_slots_total", model="q8") == 1


@pytest.mark.oracle
def test_two_families_each_request_gets_its_own_tokenizer_and_template(engines, gemma3):
    """SmolLM2 (byte-level BPE, ChatML with a default system prompt) and a tiny Gemma 3
    (SentencePiece, <start_of_turn> turns) behind one server: `model` picks the tokenizer, the
    chat template and the weights. Oracles: for Gemma 3's prompts, its checkpoint's chat
    template rendered by Jinja2 and tokenized by llama.cpp; for the replies, each model's own
    Engine; the two vocabularies really differ (ids valid in one are refused by the other)."""
    jinja2 = require("jinja2", "Jinja2 renders the checkpoint's chat template")
    require("llama_cpp", "llama.cpp tokenizes the Gemma 3 oracle prompts")
    from tests.support.llama_oracle import llama_tokenize

    smol, _ = engines
    path, checkpoint = gemma3
    gemma = edgeinfer.load(path, n_ctx=N_CTX, n_threads=2, n_slots=2)
    hf_config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    msgs = [{"role": "user", "content": "Name a colour."}]
    try:
        with ServerThread(models={"smollm2": smol, "gemma3": gemma}) as srv:
            c = client_of(srv)
            meta = {m.id: m.meta for m in c.models.list().data}
            assert meta["gemma3"]["arch"] == "gemma3" and meta["gemma3"]["n_vocab"] == gemma.config.n_vocab
            assert meta["smollm2"]["n_vocab"] != meta["gemma3"]["n_vocab"]
            usage = {}
            for name, eng in (("smollm2", smol), ("gemma3", gemma)):
                r = c.completions.create(model=name, prompt=PROMPT, max_tokens=6, temperature=0,
                                         extra_body={"ignore_eos": True})
                assert r.model == name
                assert r.choices[0].text == eng.generate(PROMPT, max_tokens=6, temperature=0, ignore_eos=True).text
                assert r.usage.prompt_tokens == len(eng.tokenize(PROMPT))
                chat = c.chat.completions.create(model=name, messages=msgs, max_tokens=6, temperature=0,
                                                 extra_body={"ignore_eos": True})
                assert chat.choices[0].message.content == eng.chat(msgs, max_tokens=6, temperature=0,
                                                                   ignore_eos=True).text
                assert chat.usage.prompt_tokens == len(eng.chat_ids(msgs))
                usage[name] = (r.usage.prompt_tokens, chat.usage.prompt_tokens)
            assert usage["smollm2"] != usage["gemma3"]
            # Gemma's own prompts, as its checkpoint templates them and llama.cpp tokenizes them
            rendered = jinja2.Environment().from_string(hf_config["chat_template"]).render(
                messages=msgs, bos_token=hf_config["bos_token"], add_generation_prompt=True)
            assert usage["gemma3"][0] == len(llama_tokenize(path, PROMPT))
            assert usage["gemma3"][1] == len(llama_tokenize(path, rendered, add_bos=False, special=True))
            # Token ids belong to one vocabulary: past Gemma's, refused by it and not by SmolLM2.
            ids = [meta["gemma3"]["n_vocab"] + 5]
            with pytest.raises(openai.BadRequestError) as e:
                c.completions.create(model="gemma3", prompt=ids, max_tokens=1)
            assert e.value.code == "invalid_token"
            assert c.completions.create(model="smollm2", prompt=ids, max_tokens=1).usage.prompt_tokens == 1
    finally:
        gemma.close()


def test_fallback_fires_when_the_queue_is_full_and_is_counted(engines):
    """With `q8` (one slot, no queue) busy, a request for it goes to the fallback `f16`, says
    so in `model`, and /metrics counts it; once `q8` is free again it serves its own. Without
    a fallback the same request is a 429."""
    a, b = engines
    with ServerThread(models={"q8": b, "f16": a}, fallback="f16") as srv:
        c = client_of(srv)
        hold = b.stream(PROMPT, max_tokens=N_CTX - 10, ignore_eos=True)   # takes q8's only slot
        try:
            r = c.completions.create(model="q8", prompt=PROMPT, max_tokens=3, temperature=0)
            assert r.model == "f16"
            assert metric(srv.url, "edgeinfer_fallbacks_total", model="q8", to="f16", reason="queue_full") == 1
            # The fallback model never falls back.
            assert c.completions.create(model="f16", prompt=PROMPT, max_tokens=1).model == "f16"
        finally:
            hold.close()
        wait_idle(b)
        assert c.completions.create(model="q8", prompt=PROMPT, max_tokens=2).model == "q8"
        assert metric(srv.url, "edgeinfer_fallbacks_total", model="q8", to="f16", reason="queue_full") == 1
    with ServerThread(models={"q8": b, "f16": a}) as srv:
        hold = b.stream(PROMPT, max_tokens=N_CTX - 10, ignore_eos=True)
        try:
            st, _, out = request(srv.url + "/v1/completions", "POST",
                                 {"model": "q8", "prompt": PROMPT, "max_tokens": 1})
            assert st == 429 and out["error"]["code"] == "queue_full"
        finally:
            hold.close()
        wait_idle(b)


def test_fallback_fires_when_the_recent_ttft_is_over_the_limit(engines):
    """A TTFT limit no request meets: after one request to `q8` has measured its TTFT, the
    next request for `q8` goes to `f16`, counted with reason ttft."""
    a, b = engines
    with ServerThread(models={"q8": b, "f16": a}, fallback="f16", fallback_ttft_s=1e-9) as srv:
        c = client_of(srv)
        assert c.completions.create(model="q8", prompt=PROMPT, max_tokens=2).model == "q8"
        assert c.completions.create(model="q8", prompt=PROMPT, max_tokens=2).model == "f16"
        assert metric(srv.url, "edgeinfer_fallbacks_total", model="q8", to="f16", reason="ttft") == 1
        assert metric(srv.url, "edgeinfer_fallbacks_total", model="q8", to="f16", reason="queue_full") == 0


@pytest.mark.slow
def test_n_choices(engines):
    """n=3: three choices with index 0..2, plain and streamed; greedy, all equal to n=1; with
    a seed, choice 0 is the n=1 reply and choice i is what the engine gives with the i-th
    derived seed (siblings differ by seed, not by chance). Usage counts the prompt once."""
    a, _ = engines
    with ServerThread(models={"m": a}) as srv:
        c = client_of(srv)
        msgs = [{"role": "user", "content": "Name a fruit."}]
        one = c.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=0)
        three = c.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=0, n=3,
                                          user="user-1234")
        assert [ch.index for ch in three.choices] == [0, 1, 2]
        assert [ch.message.content for ch in three.choices] == [one.choices[0].message.content] * 3
        assert three.usage.prompt_tokens == one.usage.prompt_tokens
        assert three.usage.completion_tokens == 3 * one.usage.completion_tokens
        # Streamed: the pieces of each index make the same three replies.
        texts, finish = ["", "", ""], [None] * 3
        for chunk in c.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=0, n=3,
                                               stream=True):
            for ch in chunk.choices:
                texts[ch.index] += ch.delta.content or ""
                finish[ch.index] = ch.finish_reason or finish[ch.index]
        assert texts == [one.choices[0].message.content] * 3 and None not in finish
        # Sampled with a seed: each choice is the engine's reply with its derived seed.
        kw = dict(max_tokens=10, temperature=1.0, ignore_eos=True, top_k=0, top_p=1.0, min_p=0.0)  # OpenAI's
        r = c.completions.create(model="m", prompt=PROMPT, n=3, seed=42, max_tokens=10, temperature=1.0,
                                 extra_body={"ignore_eos": True})
        seeds = _sibling_seeds(42, 3)
        assert len(set(seeds)) == 3 and seeds[0] == 42
        assert [ch.text for ch in r.choices] == [a.generate(PROMPT, seed=s, **kw).text for s in seeds]
        single = c.completions.create(model="m", prompt=PROMPT, seed=42, max_tokens=10, temperature=1.0,
                                      extra_body={"ignore_eos": True})
        assert single.choices[0].text == r.choices[0].text


def test_siblings_copy_the_prompt_cells_instead_of_computing_them(smollm2_path):
    """n > 1: the siblings after the first find its prompt in the KV cache and copy its cells
    (counted as cached prompt tokens), and still give exactly the n=1 reply. The native copy
    gives the same logits as computing the prompt, and refuses positions the slot lacks."""
    eng = edgeinfer.load(smollm2_path, n_ctx=64, n_threads=2, n_slots=3)
    try:
        prompt = "Zebras graze on the savanna because"
        ids = eng.tokenize(prompt)
        with ServerThread(models={"m": eng}) as srv:
            c = client_of(srv)
            before = metric(srv.url, "edgeinfer_prompt_tokens_cached_total", model="m")
            r = c.completions.create(model="m", prompt=prompt, n=3, max_tokens=6, temperature=0,
                                     extra_body={"ignore_eos": True})
            cached = metric(srv.url, "edgeinfer_prompt_tokens_cached_total", model="m") - before
        assert cached >= 2 * (len(ids) - 1), cached
        alone = eng.generate(prompt, max_tokens=6, temperature=0, ignore_eos=True).text
        assert [ch.text for ch in r.choices] == [alone] * 3
        # The runtime itself: slot 1 gets slot 0's cells; its last token's logits are slot 0's.
        rt, n = eng.runner.runtime, len(ids)
        with eng.runner.lock:
            for s in (0, 1, 2):
                rt.clear_slot(s)
            pos = np.arange(n, dtype=np.int32)
            full = rt.forward(Batch.of_slot(0, ids, pos, pos, [n - 1])).copy()
            rt.copy_prefix(0, 1, n - 1)
            last = rt.forward(Batch.of_slot(1, ids[-1:], pos[-1:], pos[-1:], [0]))
            assert np.array_equal(full, last)
            with pytest.raises(edgeinfer.errors.StateError, match="does not hold position"):
                rt.copy_prefix(2, 1, 3)          # slot 2 is empty
            for s in (0, 1, 2):
                rt.clear_slot(s)
            eng.scheduler.ring.truncate(0, 0)    # the scheduler's bookkeeping agrees: all empty
            eng.scheduler.ring.truncate(1, 0)
            eng.scheduler.ring.truncate(2, 0)
    finally:
        eng.close()


def test_stop_takes_at_most_four_strings(engines):
    a, _ = engines
    with ServerThread(models={"m": a}) as srv:
        c = client_of(srv)
        full = c.completions.create(model="m", prompt=PROMPT, max_tokens=12, temperature=0).choices[0].text
        stops = ["\u2603", "\u2604", "\u2605", full[4:7]]        # three that never occur, one that does
        r = c.completions.create(model="m", prompt=PROMPT, max_tokens=12, temperature=0, stop=stops)
        assert r.choices[0].finish_reason == "stop" and r.choices[0].text == full[:full.index(full[4:7])]
        for call in (lambda: c.completions.create(model="m", prompt=PROMPT, max_tokens=2, stop=stops + ["x"]),
                     lambda: c.chat.completions.create(model="m", max_tokens=2, stop=stops + ["x"],
                                                       messages=[{"role": "user", "content": "Hi"}])):
            with pytest.raises(openai.BadRequestError) as e:
                call()
            assert e.value.status_code == 400 and e.value.body["param"] == "stop"


@pytest.mark.slow
def test_max_tokens_omitted_runs_to_the_end_of_the_context(engines):
    """No max_tokens (or null): a reply that never stops runs until the context is full, on
    chat and completions alike."""
    a, _ = engines
    with ServerThread(models={"m": a}) as srv:
        c = client_of(srv)
        n_prompt = len(a.tokenize(PROMPT))
        r = c.completions.create(model="m", prompt=PROMPT, temperature=0, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == N_CTX - n_prompt and r.choices[0].finish_reason == "length"
        msgs = [{"role": "user", "content": "Hi"}]
        st, _, out = request(srv.url + "/v1/chat/completions", "POST",
                             {"messages": msgs, "max_tokens": None, "temperature": 0, "ignore_eos": True})
        assert st == 200 and out["usage"]["completion_tokens"] == N_CTX - len(a.chat_ids(msgs))


def _serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeinfer", "serve", "--port", str(_free_port()), *args],
                          capture_output=True, text=True, timeout=120)   # a hang guard, not a speed check


@pytest.mark.slow
def test_cli_refuses_models_that_cannot_be_served_before_loading(smollm2_path, tmp_path):
    """Before anything loads: a missing file among several models, models that do not fit
    the memory budget (naming the figures), a fallback or a name that is wrong: non-zero."""
    p = str(smollm2_path)
    r = _serve("--model", f"a={p}", "--model", f"b={tmp_path / 'nope.gguf'}")
    assert r.returncode == 1 and "failed to load" in r.stderr and "nope.gguf" in r.stderr, r.stderr
    r = _serve("--model", f"a={p}", "--model", f"b={p}", "--memory", "100MB", "--ctx", "64")
    assert r.returncode == 1 and "memory budget of 95.37 MiB (--memory 100MB)" in r.stderr, r.stderr
    assert "a: weights" in r.stderr and "b: weights" in r.stderr and "KV" in r.stderr, r.stderr
    r = _serve("--model", f"a={p}", "--model", f"b={p}", "--fallback", "c")
    assert r.returncode == 2 and "'c' is not the name of a served model" in r.stderr, r.stderr
    r = _serve("--model", p, "--model", p)
    assert r.returncode == 2 and "name them" in r.stderr, r.stderr


@pytest.mark.slow
def test_cli_serves_two_models(smollm2_path):
    """`serve --model a=PATH --model b=PATH --fallback b` loads both; each answers under its name."""
    import signal

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "edgeinfer", "serve", "--port", str(port), "--ctx", "64",
                             "--slots", "1", "--threads", "2", "--model", f"a={smollm2_path}",
                             "--model", f"b={smollm2_path}", "--fallback", "b", "--memory", "4GiB"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert wait_ready(url) == 200      # both are loaded
        assert [m["id"] for m in request(url + "/v1/models")[2]["data"]] == ["a", "b"]
        for name in ("a", "b"):
            st, _, out = request(url + "/v1/completions", "POST", {"model": name, "prompt": "Hi", "max_tokens": 2})
            assert st == 200 and out["model"] == name
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_plan_serve_counts_every_model_and_the_process_once(smollm2_path):
    """plan_serve: each model's row is plan_one's (its own weights, KV arena and buffers), the
    process overhead counted once; check_serve refuses one byte short, naming the figures."""
    from edgeinfer.tools import plan as P

    m = P.model_shape(smollm2_path)
    p = P.plan_serve([("a", m), ("b", m)], ctx=256, slots=2, n_threads=2)
    one = P.plan_one(m, 256, 2, n_threads=2)
    assert [r for _, r in p.rows] == [one, one]
    assert p.total == 2 * one.total - P.PROCESS_OVERHEAD and p.fits is None
    assert P.check_serve([("a", m), ("b", m)], 256, 2, "f16", p.total, n_threads=2).fits
    with pytest.raises(P.MemoryBudgetError) as e:
        P.check_serve([("a", m), ("b", m)], 256, 2, "f16", p.total - 1, n_threads=2, budget_source="--memory X")
    msg = str(e.value)
    assert P.human(p.total) in msg and "(--memory X)" in msg and f"a: weights {P.human(m.weights_bytes)}" in msg


def test_plan_serve_counts_the_adapters_budget(smollm2_path):
    """With LoRA adapters served, their budget (serve --lora-budget) is in the plan's total and its figures."""
    from edgeinfer.tools import plan as P

    m = P.model_shape(smollm2_path)
    base = P.plan_serve([("a", m)], ctx=256, slots=2, n_threads=2)
    p = P.plan_serve([("a", m)], ctx=256, slots=2, n_threads=2, adapter_bytes=64 << 20)
    assert p.total == base.total + (64 << 20)
    with pytest.raises(P.MemoryBudgetError, match="LoRA adapters 64.00 MiB"):
        P.check_serve([("a", m)], 256, 2, "f16", p.total - 1, n_threads=2, adapter_bytes=64 << 20)
