"""`edgeinfer serve`: the OpenAI client, batching, cancellation, bad input, the bounded queue,
auth, graceful shutdown. Servers bind 127.0.0.1 on a free port; generations stay short."""
from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from tests.support.strict import require

import edgeinfer
from edgeinfer.server import ServerThread

openai = require("openai", "the openai client is the server's oracle")

N_CTX = 128
PROMPTS = ["The history of the printing press begins", "Water boils at", "def fibonacci(n):",
           "My favourite colour is", "The capital of France is", "Once upon a time,",
           "import numpy as np\n", "The three laws of motion are"]


@pytest.fixture(scope="module")
def engine(smollm2_path):
    eng = edgeinfer.load(smollm2_path, n_ctx=N_CTX, n_threads=2, n_slots=4)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def server(engine):
    srv = ServerThread(engine, max_body=64 * 1024, model_name="smollm2").start()
    yield srv
    srv.stop(timeout_s=5)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def request(url: str, method: str = "GET", body=None, headers=None, raw: bytes | None = None):
    """(status, headers, parsed JSON or text) without raising on HTTP errors."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            status, hdrs, payload = r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        status, hdrs, payload = e.code, dict(e.headers), e.read()
    try:
        return status, hdrs, json.loads(payload)
    except ValueError:
        return status, hdrs, payload.decode()


def wait_ready(url: str, timeout: float = 60.0) -> int | None:
    """Polls a server started in a subprocess until /ready answers 200 (a bound against a
    hang, not a speed check); the last status, None when it never answered."""
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        try:
            status = request(url + "/ready")[0]
            if status == 200:
                break
        except OSError:
            pass
        time.sleep(0.1)
    return status


def wait_idle(engine, timeout: float = 60.0) -> dict:
    """Waits for every slot to be free by leasing them all (a lease wakes on the scheduler's
    own "slot freed" notification), then the snapshot. The timeout is a guard against a slot
    that is never freed, not a speed check."""
    freed = threading.Event()

    def lease_all() -> None:
        with contextlib.ExitStack() as held:
            for _ in range(engine.n_slots):
                held.enter_context(engine.lease())
        freed.set()

    threading.Thread(target=lease_all, daemon=True).start()   # daemon: a stuck slot must not hang the run
    assert freed.wait(timeout), f"a slot stayed busy: {engine.snapshot()}"
    return engine.snapshot()


def wait_in_flight(url: str, n: int, timeout: float = 60.0) -> None:
    """Polls /metrics of a server in another process until `n` generation requests are in
    flight (a bound against a hang, not a speed check)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, _, text = request(url + "/metrics")
        if f"edgeinfer_requests_in_flight {float(n)}" in text:
            return
    raise AssertionError(f"never {n} request(s) in flight")


# --------------------------------------------------------------------------- the OpenAI client

def test_chat_with_openai_client(client):
    msgs = [{"role": "user", "content": "Name a colour."}]
    kw = dict(model="smollm2", messages=msgs, max_tokens=12, temperature=0.8, seed=7)
    r = client.chat.completions.create(**kw)
    ch = r.choices[0]
    assert r.object == "chat.completion" and ch.message.role == "assistant"
    assert ch.finish_reason in ("stop", "length") and ch.message.content
    assert r.usage.completion_tokens <= 12 and r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # Streamed with the same seed: the same text; usage in the last chunk.
    pieces, finish, usage = [], None, None
    for chunk in client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            pieces.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert "".join(pieces) == ch.message.content
    assert finish == ch.finish_reason
    assert usage.completion_tokens == r.usage.completion_tokens
    assert usage.prompt_tokens == r.usage.prompt_tokens


def test_completion_with_openai_client(client, engine):
    kw = dict(model="smollm2", prompt=PROMPTS[0], max_tokens=10, temperature=0.0)
    r = client.completions.create(**kw)
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 10
    assert r.usage.prompt_tokens == len(engine.tokenize(PROMPTS[0]))
    text = r.choices[0].text
    assert text == engine.generate(PROMPTS[0], max_tokens=10, temperature=0.0).text
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True) if c.choices)
    assert streamed == text
    # Token ids as the prompt give the same text.
    ids = engine.tokenize(PROMPTS[0])
    assert client.completions.create(**{**kw, "prompt": ids}).choices[0].text == text
    # A stop string ends with finish_reason "stop" and is not included.
    stop = text[3:7]
    s = client.completions.create(**kw, stop=[stop])
    assert s.choices[0].finish_reason == "stop" and s.choices[0].text == text[:text.index(stop)]


def test_completion_of_several_prompts(client, engine):
    """A list of prompts (texts or token ids) with n choices each: choice i of prompt k at index
    k * n + i, each the text that prompt alone gives, usage over all of them; streamed, each
    chunk names its choice; a bad prompt's 400 names its index."""
    ids = engine.tokenize(PROMPTS[1])
    kw = dict(model="smollm2", max_tokens=6, temperature=0.0, n=2)
    alone = [client.completions.create(**{**kw, "n": 1}, prompt=p) for p in (PROMPTS[0], ids)]
    r = client.completions.create(**kw, prompt=[PROMPTS[0], ids])
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == [a.choices[0].text for a in alone for _ in range(2)]
    assert r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert r.usage.completion_tokens == 2 * sum(a.usage.completion_tokens for a in alone)
    texts = ["", "", "", ""]
    for c in client.completions.create(**kw, prompt=[PROMPTS[0], ids], stream=True):
        for ch in c.choices:
            texts[ch.index] += ch.text
    assert texts == [c.text for c in r.choices]
    for bad_prompt in ([10 ** 9], ""):          # refused as the request is read, and as it is tokenized
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(**kw, prompt=[PROMPTS[0], bad_prompt])
        assert e.value.body["param"] == "prompt[1]", e.value.body


def test_a_batch_past_the_queue_is_a_400_not_a_retry(smollm2_path):
    """More choices than the model's slots and queue hold at once could never be admitted: a
    400 that says so, where a 429 would have the client retry forever."""
    with edgeinfer.load(smollm2_path, n_ctx=128, n_threads=1, n_slots=2, max_queue=4) as eng, \
            ServerThread(eng, model_name="smollm2") as srv:
        st, _, got = request(srv.url + "/v1/completions", "POST", {"prompt": ["a", "b", "c", "d"], "n": 2,
                                                                   "max_tokens": 2})
        assert st == 400 and "holds at once" in got["error"]["message"], got
        st, _, got = request(srv.url + "/v1/completions", "POST", {"prompt": ["a", "b", "c"], "n": 2, "max_tokens": 2})
        assert st == 200 and len(got["choices"]) == 6


def test_logprobs_and_extensions(client):
    r = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=4, temperature=0, logprobs=True, top_logprobs=3,
                                       extra_body={"top_k": 20, "min_p": 0.05, "repeat_penalty": 1.1})
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens
    assert all(len(x.top_logprobs) == 3 and x.logprob <= 0 for x in lp)
    assert lp[0].token == lp[0].top_logprobs[0].token       # greedy takes the most likely
    c = client.completions.create(model="smollm2", prompt="Water boils at", max_tokens=3, temperature=0,
                                  logprobs=2)
    assert len(c.choices[0].logprobs.tokens) == 3 and len(c.choices[0].logprobs.top_logprobs[0]) == 2


def test_server_logprobs_are_log_softmax_of_the_logits(client, engine):
    """Every logprob the HTTP API reports, top lists included, is log_softmax of the model's
    logits at that step (teacher-forced through Engine.logits; tests/support/logprob_oracle.py)."""
    from tests.support.llama_oracle import log_softmax
    from tests.support.logprob_oracle import ATOL, teacher_forced_rows

    prompt = "The three primary colours are"
    c = client.completions.create(model="smollm2", prompt=prompt, max_tokens=6, temperature=0.9, seed=3,
                                  logprobs=3, top_p=0.9,
                                  extra_body={"repeat_penalty": 1.3, "top_k": 20, "min_p": 0.02})
    got = c.choices[0].logprobs
    ids = engine.generate(prompt, max_tokens=6, temperature=0.9, seed=3, top_p=0.9, repeat_penalty=1.3,
                          top_k=20, min_p=0.02).tokens
    assert engine.detokenize(ids) == c.choices[0].text     # the same draws, so the same tokens
    ref = log_softmax(teacher_forced_rows(engine.logits, engine.tokenize(prompt), ids))
    assert len(got.tokens) == len(ids) == len(ref)
    for i, t in enumerate(ids):
        assert got.tokens[i] == engine.detokenize([t])
        assert abs(got.token_logprobs[i] - ref[i][t]) <= ATOL, (i, got.token_logprobs[i], ref[i][t])
        top = np.argsort(-ref[i])[:3]
        want = {engine.detokenize([int(j)]): float(ref[i][j]) for j in top}
        assert set(got.top_logprobs[i]) == set(want), (i, got.top_logprobs[i], want)
        assert all(abs(got.top_logprobs[i][k] - want[k]) <= ATOL for k in want)


def test_models_tokenize_health_metrics(server, engine):
    st, _, body = request(server.url + "/v1/models")
    assert st == 200 and body["data"][0]["id"] == "smollm2"
    st, _, body = request(server.url + "/tokenize", "POST", {"content": "Hello world"})
    assert st == 200 and body["tokens"] == engine.tokenize("Hello world")
    st, _, back = request(server.url + "/detokenize", "POST", {"tokens": body["tokens"]})
    assert st == 200 and back["content"] == engine.detokenize(body["tokens"])
    assert request(server.url + "/health")[0] == 200
    st, _, text = request(server.url + "/metrics")
    assert st == 200
    for name in ("edgeinfer_requests_total", "edgeinfer_time_to_first_token_seconds_bucket",
                 "edgeinfer_time_per_output_token_seconds_bucket", "edgeinfer_e2e_request_latency_seconds_bucket",
                 "edgeinfer_queue_time_seconds_bucket", "edgeinfer_prompt_tokens_total",
                 "edgeinfer_generation_tokens_total", "edgeinfer_slots_busy", "edgeinfer_kv_cells_used"):
        assert name in text, name


# --------------------------------------------------------------------------- batching

@pytest.mark.slow
def test_eight_concurrent_greedy_equal_alone(server, client, engine):
    kw = dict(model="smollm2", max_tokens=8, temperature=0.0, extra_body={"ignore_eos": True})
    alone = [client.completions.create(prompt=p, **kw).choices[0].text for p in PROMPTS]
    steps0 = engine.scheduler.steps
    with ThreadPoolExecutor(8) as ex:
        together = list(ex.map(lambda p: client.completions.create(prompt=p, **kw).choices[0].text, PROMPTS))
    assert together == alone
    # 4 slots, 8 requests of 1 prefill + 7 decode steps: batched, far fewer than 64 steps.
    assert engine.scheduler.steps - steps0 < 40


# --------------------------------------------------------------------------- cancellation

def _open_and_drop(url: str, prompt: str, wait_first: bool) -> bool:
    """Starts a stream; drops the connection after the first token (or at once). True if it streamed."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = json.dumps({"prompt": prompt, "max_tokens": 100, "temperature": 0, "stream": True,
                       "ignore_eos": True})
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    got = False
    if wait_first:
        resp = conn.getresponse()
        got = resp.status == 200 and resp.readline().startswith(b"data: ")
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    return got


def test_fifty_cancelled_streams_free_every_slot(server, client, engine):
    with ThreadPoolExecutor(10) as ex:
        results = list(ex.map(lambda i: _open_and_drop(server.url, PROMPTS[i % 8], wait_first=i % 5 != 0),
                              range(50)))
    assert sum(results) >= 30                    # most got a token before hanging up
    snap = wait_idle(engine, timeout=10)
    assert snap["slots_busy"] == 0 and snap["queue_length"] == 0
    r = client.completions.create(model="smollm2", prompt=PROMPTS[1], max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5


def test_disconnect_frees_slot_within_a_step(server, engine):
    steps = engine.scheduler.steps
    assert _open_and_drop(server.url, PROMPTS[0], wait_first=True)
    snap = wait_idle(engine, timeout=60)   # a bound against hanging, not a speed check
    assert snap["slots_busy"] == 0
    # the stream asked for 100 tokens: the scheduler stepped a few times, not to the end
    assert engine.scheduler.steps - steps <= 10, engine.scheduler.steps - steps


# --------------------------------------------------------------------------- bad input

BAD = [
    ("/v1/chat/completions", b"{not json", 400),
    ("/v1/chat/completions", {"messages": "hi"}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 0}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 17}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_p": 0}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stop": [1, 2]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "user": 12}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}, 400),
    ("/v1/completions", [1, 2, 3], 400),
    ("/v1/completions", {"prompt": [1, 2, 10 ** 9]}, 400),
    ("/v1/completions", {"prompt": [1, -5]}, 400),
    ("/v1/completions", {"prompt": 42}, 400),
    ("/v1/completions", {"prompt": "x", "seed": 1.5}, 400),
    ("/v1/completions", {"prompt": "x", "top_k": -1}, 400),
    ("/v1/completions", {"prompt": "x", "max_tokens": N_CTX}, 400),
    ("/v1/completions", {"prompt": ["a", [10 ** 9]]}, 400),
    ("/v1/completions", {"prompt": ["a"] * 65, "n": 2}, 400),
    ("/v1/completions", {"prompt": [["a", "b"], "c"]}, 400),
    ("/detokenize", {"tokens": [10 ** 9]}, 400),
    ("/tokenize", {"content": 3}, 400),
    ("/v1/completions", b"x" * (65 * 1024), 413),
    ("/v1/nothing", {}, 404),
]


def test_bad_inputs_get_status_and_json_error(server, client):
    for path, body, status in BAD:
        raw = body if isinstance(body, bytes) else None
        st, _, out = request(server.url + path, "POST", None if raw else body, raw=raw)
        assert st == status, (path, body if not raw else raw[:20], st, out)
        assert isinstance(out, dict) and set(out["error"]) == {"message", "type", "param", "code"}, out
    st, _, out = request(server.url + "/health", "POST", {})
    assert st == 405 and "error" in out
    # The context error names both numbers.
    n_prompt = 3
    st, _, out = request(server.url + "/v1/completions", "POST",
                         {"prompt": [1, 2, 3], "max_tokens": N_CTX})
    msg = out["error"]["message"]
    assert str(n_prompt) in msg and str(N_CTX) in msg and out["error"]["code"] == "context_length_exceeded"
    # The server still answers.
    r = client.completions.create(model="smollm2", prompt=PROMPTS[1], max_tokens=3, temperature=0)
    assert r.usage.completion_tokens == 3


def test_a_message_too_large_to_render_is_a_context_error(engine):
    """A chat message longer than any rendered prompt may be is reported as the context error
    it is, naming the sizes, not as the template's output limit (engine and HTTP alike)."""
    huge = [{"role": "user", "content": "a" * (engine.template.max_output_chars + 1)}]
    with pytest.raises(edgeinfer.ContextOverflowError, match=f"{engine.n_ctx} tokens"):
        engine.chat_ids(huge)
    with ServerThread(engine) as srv:   # the default body limit (4 MiB) lets the message through
        st, _, out = request(srv.url + "/v1/chat/completions", "POST", {"messages": huge, "max_tokens": 1})
    assert st == 400 and out["error"]["code"] == "context_length_exceeded", out
    assert out["error"]["param"] == "messages" and "characters" in out["error"]["message"]


def test_unknown_model_names_are_404_and_models_can_be_retrieved(server, client):
    """OpenAI's behaviour: a model the server does not serve is 404 model_not_found, never
    silently answered by another model; GET /v1/models/{id} knows every name of the served one."""
    assert client.models.retrieve("smollm2").id == "smollm2"
    assert client.models.retrieve("default").id == "smollm2"          # an alias of the same model
    for call in (lambda: client.models.retrieve("gpt-4o"),
                 lambda: client.chat.completions.create(model="gpt-4o", max_tokens=1,
                                                        messages=[{"role": "user", "content": "Hi"}]),
                 lambda: client.completions.create(model="gpt-4o", prompt="Hi", max_tokens=1)):
        with pytest.raises(openai.NotFoundError) as e:
            call()
        assert e.value.code == "model_not_found" and "gpt-4o" in str(e.value)
    st, _, out = request(server.url + "/v1/completions", "POST", {"prompt": "Hi", "max_tokens": 1})
    assert st == 200 and out["model"] == "smollm2"                     # no model: the served one


def test_api_key(engine):
    with ServerThread(engine, api_key="s3cret") as srv:
        assert request(srv.url + "/health")[0] == 200
        st, hdrs, out = request(srv.url + "/v1/models")
        assert st == 401 and out["error"]["code"] == "invalid_api_key"
        assert request(srv.url + "/metrics", headers={"Authorization": "Bearer wrong"})[0] == 401
        assert request(srv.url + "/v1/models", headers={"Authorization": "Bearer s3cret"})[0] == 200
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="s3cret", max_retries=0)
        assert c.completions.create(model=c.models.list().data[0].id, prompt="Hi", max_tokens=2, temperature=0).usage.completion_tokens >= 1


def test_cors_lets_the_named_origins_call(engine):
    """--cors-origin: a page of a named origin gets the CORS headers, on plain and streamed
    replies, and its preflight a 204 without the API key; another origin's requests are refused
    with a 403 before anything runs (a browser sends a simple POST without a preflight)."""
    page, other = {"Origin": "http://app.example"}, {"Origin": "http://evil.example"}
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type"}
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    with ServerThread(engine, api_key="s3cret", cors_origins=["http://app.example"]) as srv:
        st, hdrs, _ = request(srv.url + "/v1/chat/completions", "OPTIONS", headers={**page, **preflight})
        assert st == 204 and hdrs["Access-Control-Allow-Origin"] == "http://app.example"
        assert "POST" in hdrs["Access-Control-Allow-Methods"]
        assert hdrs["Access-Control-Allow-Headers"] == "authorization, content-type"
        auth = {"Authorization": "Bearer s3cret"}
        st, hdrs, _ = request(srv.url + "/v1/models", headers={**page, **auth})
        assert st == 200 and hdrs["Access-Control-Allow-Origin"] == "http://app.example" and hdrs["Vary"] == "Origin"
        st, hdrs, _ = request(srv.url + "/v1/chat/completions", "POST", {**chat, "stream": True}, headers={**page, **auth})
        assert st == 200 and hdrs["Access-Control-Allow-Origin"] == "http://app.example"
        assert request(srv.url + "/v1/models", headers=page)[1]["Access-Control-Allow-Origin"]   # a 401 too
        for method, body, h in (("OPTIONS", None, preflight), ("POST", chat, auth), ("GET", None, auth)):
            st, hdrs, got = request(srv.url + "/v1/chat/completions" if body or method == "OPTIONS"
                                    else srv.url + "/v1/models", method, body, headers={**other, **h})
            assert st == 403 and got["error"]["code"] == "origin_not_allowed"
            assert "Access-Control-Allow-Origin" not in hdrs
        assert request(srv.url + "/v1/models", headers=auth)[0] == 200        # no Origin: not a browser's page
    with ServerThread(engine) as srv:          # by default no other origin may call; the server's own may
        assert request(srv.url + "/v1/models", headers=page)[0] == 403
        assert request(srv.url + "/v1/models", headers={"Origin": srv.url})[0] == 200


# --------------------------------------------------------------------------- the bounded queue

def test_queue_overflow_gives_429_while_health_stays_200(smollm2_path):
    """One slot (held by a lease) and a queue of one: the first request waits in the queue,
    the next is refused with 429 and Retry-After, /health stays 200; once the slot is free
    the waiting request is served."""
    eng = edgeinfer.load(smollm2_path, n_ctx=64, n_threads=2, n_slots=1, max_queue=1)
    with ServerThread(eng) as srv, ThreadPoolExecutor(1) as ex:
        body = {"prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0, "ignore_eos": True}
        with eng.lease():
            waiting = ex.submit(request, srv.url + "/v1/completions", "POST", body)
            assert srv.state.wait_until(lambda s: s.in_flight == 1, 60)     # queued behind the lease
            st, hdrs, out = request(srv.url + "/v1/completions", "POST", body)
            assert st == 429 and out["error"]["code"] == "queue_full" and int(hdrs["Retry-After"]) >= 1
            st, _, health = request(srv.url + "/health")
            assert st == 200 and health["queue_length"] == 1 and health["slots_busy"] == 1
        st, _, out = waiting.result()
        assert st == 200 and out["usage"]["completion_tokens"] == 4
    eng.close()


# --------------------------------------------------------------------------- shutdown

def test_stop_finishes_in_flight_requests(smollm2_path):
    """A request in flight when stop() begins draining is answered in full: a lease holds it
    in the queue until the server is seen draining."""
    eng = edgeinfer.load(smollm2_path, n_ctx=64, n_threads=2, n_slots=1)
    srv = ServerThread(eng).start()
    body = {"prompt": PROMPTS[2], "max_tokens": 20, "temperature": 0, "ignore_eos": True}
    with ThreadPoolExecutor(2) as ex:
        with eng.lease():
            fut = ex.submit(request, srv.url + "/v1/completions", "POST", body)
            assert srv.state.wait_until(lambda s: s.in_flight == 1, 60)
            stopping = ex.submit(srv.stop, 60)
            assert srv.state.wait_until(lambda s: s.draining, 60)
        stopping.result()
        st, _, out = fut.result()
    assert st == 200 and out["usage"]["completion_tokens"] == 20
    eng.close()


def test_cli_serve_exits_non_zero_when_the_model_cannot_load(tmp_path):
    """A supervisor must learn that the model is missing: exit 1 naming it, not a server that
    runs on with nothing to serve. With --wait-for-model it keeps running: alive, not ready."""
    missing = tmp_path / "nope.gguf"
    port = _free_port()
    r = subprocess.run([sys.executable, "-m", "edgeinfer", "serve", str(missing), "--port", str(port)],
                       capture_output=True, text=True, timeout=120)   # a hang guard, not a speed check
    assert r.returncode == 1 and "failed to load" in r.stderr and "nope.gguf" in r.stderr, r.stderr
    proc = subprocess.Popen([sys.executable, "-m", "edgeinfer", "serve", str(missing), "--port", str(port),
                             "--wait-for-model"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        ready = None
        for _ in range(600):   # until the load has failed (bounded: 60 s of polling)
            try:
                ready = request(url + "/ready")
                if ready[2].get("status") == "failed":
                    break
            except OSError:
                pass
            time.sleep(0.1)
        assert ready[0] == 503 and "nope.gguf" in ready[2]["error"], ready
        assert request(url + "/health")[0] == 200 and proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_cli_serve_and_sigterm(smollm2_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "edgeinfer", "serve", str(smollm2_path), "--port", str(port),
                             "--ctx", "64", "--slots", "2", "--threads", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ})
    try:
        assert wait_ready(url) == 200
        body = {"prompt": "Hello", "max_tokens": 48, "temperature": 0, "ignore_eos": True}
        result = {}
        t = threading.Thread(target=lambda: result.update(r=request(url + "/v1/completions", "POST", body)))
        t.start()
        wait_in_flight(url, 1)
        proc.send_signal(signal.SIGTERM)
        t.join(60)
        assert result["r"][0] == 200 and result["r"][2]["usage"]["completion_tokens"] == 48
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_load_bench_against_the_server(server):
    from edgeinfer.tools.loadbench import run_server_bench

    lines: list[str] = []
    r = run_server_bench(server.url, concurrency=[1, 2], requests=2, max_tokens=4, warmup=0, json=True,
                         out=lines.append)
    assert [lv["concurrency"] for lv in r["levels"]] == [1, 2]
    for lv in r["levels"]:
        assert lv["ok"] == 2 and lv["failed"] == 0 and lv["output_tokens"] == 8, lv
        assert lv["ttft_ms"]["p50"] > 0 and lv["tpot_ms"]["p99"] > 0 and lv["output_tokens_per_s"] > 0
    assert json.loads(lines[-1])["levels"][0]["requests"] == 2
    poisson = run_server_bench(server.url, concurrency=[2], requests=3, rate=20.0, max_tokens=2, warmup=0,
                               out=lines.append)
    assert poisson["levels"][0]["ok"] == 3


def test_bench_cli_dispatches_to_the_server(server):
    from typer.testing import CliRunner

    from edgeinfer.cli import app

    r = CliRunner().invoke(app, ["bench", "--server", server.url, "--concurrency", "1", "--requests", "2",
                                 "--max-tokens", "3", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output[r.output.index("{"):])
    assert doc["levels"][0]["ok"] == 2 and doc["levels"][0]["failed"] == 0


# --------------------------------------------------------------------------- units (no server)

def test_request_errors_name_the_field_and_unknown_fields_are_ignored():
    from edgeinfer.server.protocol import APIError, EmbeddingsBody, parse, parse_chat, parse_completion

    msg = [{"role": "user", "content": "x"}]
    for body, param, code in (
            ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "invalid_type"),
            ({"messages": msg, "temperature": 2.5}, "temperature", "invalid_value"),
            ({"messages": msg, "temperature": float("nan")}, "temperature", "invalid_value"),
            ({"messages": msg, "max_tokens": True}, "max_tokens", "invalid_type"),
            ({"messages": msg, "stop": ["a", 3]}, "stop[1]", "invalid_type"),
            ({"messages": msg, "stream_options": {"include_usage": "yes"}},
             "stream_options.include_usage", "invalid_type")):
        with pytest.raises(APIError) as e:
            parse_chat(body)
        assert (e.value.status, e.value.param, e.value.code) == (400, param, code), e.value.body()
        assert param in e.value.message
    # a value that fails every member of a union: the member that took its shape is reported,
    # under the field's name (not pydantic's name for the member)
    for body, param, says in (
            ({"input": [[1, -2]]}, "input[0][1]", "greater than or equal to 0"),
            ({"input": [[]]}, "input[0]", "at least 1 item"),
            ({"input": [1, "a"]}, "input[1]", "valid integer")):
        with pytest.raises(APIError) as e:
            parse(EmbeddingsBody, body)
        assert (e.value.param, says in e.value.message) == (param, True), e.value.body()
    with pytest.raises(APIError) as e:
        parse_chat({"messages": msg, "tool_choice": 5})
    assert e.value.param == "tool_choice", e.value.body()
    req = parse_chat({"messages": msg, "max_tokens": 5, "service_tier": "auto", "modalities": ["text"]})
    assert req.max_tokens == 5 and req.messages == msg
    # max_tokens omitted: until EOS or the context is full (the server resolves None to the room left)
    assert parse_completion({"prompt": "x", "prediction": {"type": "content"}}, 10).max_tokens is None


def test_metrics_escape_label_values():
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
    from prometheus_client.parser import text_string_to_metric_families

    from edgeinfer.server.metrics import Metrics

    nasty = 'a "quoted" \\ back\nslash'
    m = Metrics(gauges=lambda: {"edgeinfer_ready": (1, "1 when the server can serve.")})
    m.count_request(nasty, 200)
    text, content_type = m.render()
    assert content_type.startswith("text/plain; version=0.0.4")
    fams = {f.name: f for f in text_string_to_metric_families(text.decode())}
    routes = [s.labels["route"] for s in fams["edgeinfer_requests"].samples if s.name.endswith("_total")]
    assert routes == [nasty]
    assert fams["edgeinfer_ready"].samples[0].value == 1
    om, content_type = m.render("application/openmetrics-text; version=1.0.0")   # when a scraper asks
    assert content_type.startswith("application/openmetrics-text")
    fams = {f.name: f for f in openmetrics_families(om.decode())}
    assert [s.labels["route"] for s in fams["edgeinfer_requests"].samples if s.name.endswith("_total")] == [nasty]
