"""The fleet recipe (deploy/, docs/serving.md "A fleet behind a router"): `edgeinfer serve`
processes behind LiteLLM's Router, run with the recipe's own router settings
(deploy/litellm.yaml). The oracle of "no request lost" is the client LiteLLM hands back:
every request answered in full although a server died under load; of a drain, the requests
in flight when SIGTERM came, answered in full, and the process's exit status.
"""
from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from tests.support.strict import missing

from edgeinfer.server.openapi import OPERATIONS

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
MODEL = "smollm2"                      # the name deploy/ serves its devices' model under
LOAD_REQUESTS = 24
LOAD_CONCURRENCY = 6
MAX_TOKENS = 12


class Server:
    """One `edgeinfer serve` process on a free loopback port (port 0: the log line names it),
    small enough that three share two cores. Its log lines are the events the tests wait on."""

    def __init__(self, model_path: Path, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edgeinfer", "serve", "--model", f"{MODEL}={model_path}", "--port", "0",
             "--ctx", "256", "--slots", "2", "--threads", "1", *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read_log, daemon=True).start()
        listening = self.wait_for_log("listening on")
        self.url = re.search(r"http://127\.0\.0\.1:\d+", listening).group(0)

    def _read_log(self) -> None:
        for line in self.proc.stderr:
            self.log.put(line)
        self.log.put(None)

    def wait_for_log(self, text: str, timeout_s: float = 120) -> str:
        """The next log line containing `text` (the timeout guards a hang; it is no speed check)."""
        deadline = time.monotonic() + timeout_s
        while True:
            line = self.log.get(timeout=max(0.0, deadline - time.monotonic()))
            if line is None:
                raise AssertionError(f"the server exited ({self.proc.wait()}) before logging {text!r}")
            if text in line:
                return line

    def gauge(self, name: str) -> float:
        """A gauge of the default model from /metrics (unlabelled gauges as they are)."""
        text = httpx.get(self.url + "/metrics").text
        m = re.search(rf'^{name}(?:{{model="{MODEL}"}})? (\S+)$', text, re.M)
        return float(m.group(1))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=60)


@pytest.fixture
def servers(smollm2_path, request):
    started: list[Server] = []
    try:
        for _ in range(request.param):
            started.append(Server(smollm2_path, "--drain-timeout", "120"))
        for s in started:
            s.wait_for_log("ready:")
        yield started
    finally:
        for s in started:
            s.stop()


def recipe_router(urls: list[str]):
    """litellm.Router with deploy/litellm.yaml's model_list and router_settings, its devices'
    api_base replaced by `urls` (the recipe itself, run here)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")     # no fetch of the price list
    import litellm

    recipe = yaml.safe_load((DEPLOY / "litellm.yaml").read_text())
    deployments = recipe["model_list"]
    assert len(deployments) == len(urls)
    model_list = [{**d, "litellm_params": {**d["litellm_params"], "api_base": url + "/v1", "api_key": "none"}}
                  for d, url in zip(deployments, urls)]
    return litellm.Router(model_list=model_list, **recipe["router_settings"])


@pytest.mark.parametrize("servers", [3], indirect=True)
def test_router_loses_no_request_when_a_server_is_killed_mid_load(servers):
    """24 chat requests, 6 at a time, through the recipe's Router over three servers; one
    server is SIGKILLed while it is generating. Every request comes back complete (the router
    sends the ones the dead server dropped, and the new ones, to the other two)."""
    router = recipe_router([s.url for s in servers])
    victim = servers[0]
    done: list[int] = []
    warmed = asyncio.Event()           # a first round of requests has been answered

    async def one(i: int, gate: asyncio.Semaphore):
        async with gate:
            r = await router.acompletion(model=MODEL, messages=[{"role": "user", "content": f"Count to {i}."}],
                                         max_tokens=MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True})
            done.append(i)
            if len(done) == LOAD_CONCURRENCY:
                warmed.set()
            return r

    async def kill_while_generating() -> int:
        """SIGKILL once a first round is answered and the victim holds a request in a slot
        (seen on its /metrics); the requests finished by then."""
        loop = asyncio.get_running_loop()
        await warmed.wait()
        for _ in range(10_000):        # bounded: the load cannot end before the victim takes one
            if await loop.run_in_executor(None, victim.gauge, "edgeinfer_slots_busy") >= 1:
                break
        else:
            raise AssertionError("the victim never held a request")
        victim.proc.kill()
        return len(done)

    async def run():
        gate = asyncio.Semaphore(LOAD_CONCURRENCY)
        load = [asyncio.ensure_future(one(i, gate)) for i in range(LOAD_REQUESTS)]
        finished_before_kill = await kill_while_generating()
        results = await asyncio.gather(*load, return_exceptions=True)
        return finished_before_kill, results

    finished_before_kill, results = asyncio.run(run())
    failures = [r for r in results if isinstance(r, BaseException)]
    print(f"\nfleet: {LOAD_REQUESTS} requests, {LOAD_CONCURRENCY} at a time, one of 3 servers killed after "
          f"{finished_before_kill} finished: {len(failures)} failed")
    assert victim.proc.wait(timeout=60) == -signal.SIGKILL
    assert finished_before_kill < LOAD_REQUESTS, "the kill came after the load"
    assert not failures, failures[:3]
    for r in results:
        assert r.usage.completion_tokens == MAX_TOKENS and r.choices[0].finish_reason == "length", r
        assert r.choices[0].message.content


def _stream(url: str, started: threading.Event, out: dict, max_tokens: int = 200) -> None:
    """A streamed chat request: `started` once its first token arrives (it holds a slot), then
    read to the end into `out` (content, finish_reason, usage, whether [DONE] came, whether the
    server cut it)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    pieces, out["done"], out["cut"] = [], False, False
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
            out["status"] = r.status_code
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    out["done"] = True
                    continue
                chunk = json.loads(line[6:])
                for c in chunk.get("choices", []):
                    pieces.append(c["delta"].get("content") or "")
                    if c["delta"].get("content"):
                        started.set()
                    out["finish_reason"] = c["finish_reason"] or out.get("finish_reason")
                if chunk.get("usage"):
                    out["usage"] = chunk["usage"]
    except httpx.RemoteProtocolError:
        out["cut"] = True                  # the server closed the stream before its end
    out["content"] = "".join(pieces)


@pytest.mark.parametrize("servers", [1], indirect=True)
def test_sigterm_drains_in_flight_requests_and_refuses_new_ones(servers):
    """SIGTERM while two streams are generating: new requests get 503 with Retry-After, /ready
    503 and /health 200 while the two finish in full (200 tokens each, [DONE]); the process then
    exits 0."""
    srv = servers[0]
    outs = [{}, {}]
    started = [threading.Event(), threading.Event()]
    streams = [threading.Thread(target=_stream, args=(srv.url, e, o)) for e, o in zip(started, outs)]
    for t in streams:
        t.start()
    assert all(e.wait(120) for e in started), outs
    t_term = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    srv.wait_for_log("shutting down")              # the drain has begun

    refused = httpx.post(srv.url + "/v1/chat/completions",
                         json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    ready, health = httpx.get(srv.url + "/ready"), httpx.get(srv.url + "/health")
    in_flight, free = srv.gauge("edgeinfer_requests_in_flight"), srv.gauge("edgeinfer_slots_free")
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down", refused.text
    assert int(refused.headers["Retry-After"]) >= 1
    assert ready.status_code == 503 and ready.json()["status"] == "draining"
    assert health.status_code == 200
    assert in_flight == 2 and free == 0, "the streams must still be running while the drain refuses"

    for t in streams:
        t.join(300)
    exit_status = srv.proc.wait(timeout=300)
    print(f"\ndrain: 2 in-flight streams finished; SIGTERM to exit {time.monotonic() - t_term:.2f} s")
    for o in outs:
        assert o["status"] == 200 and o["done"] and not o["cut"] and o["finish_reason"] == "length", o
        assert o["usage"]["completion_tokens"] == 200 and o["content"]
    assert exit_status == 0


def test_a_second_sigterm_ends_the_drain(smollm2_path):
    """A second signal during the drain stops waiting: a stream of 4000 tokens (a sliding
    context) still in flight is cut (no [DONE]), the server says it cancelled it and exits 0
    without waiting out --drain-timeout."""
    srv = Server(smollm2_path, "--overflow", "slide", "--drain-timeout", "600")
    try:
        srv.wait_for_log("ready:")
        out, started = {}, threading.Event()
        stream = threading.Thread(target=_stream, args=(srv.url, started, out, 4000))
        stream.start()
        assert started.wait(120), out
        srv.proc.send_signal(signal.SIGTERM)
        srv.wait_for_log("shutting down")
        srv.proc.send_signal(signal.SIGTERM)
        assert "cancelling 1 request(s)" in srv.wait_for_log("drain ended")
        assert srv.proc.wait(timeout=60) == 0
        stream.join(60)
        assert out["cut"] and not out["done"] and "usage" not in out, out
    finally:
        srv.stop()


# --------------------------------------------------------------------------- the deploy/ files

ROUTES = {op.path for op in OPERATIONS if op.method == "GET"}


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_kubernetes_probes_and_drain_fit_the_server():
    """The StatefulSet's probes name the server's readiness and liveness routes; the grace
    period outlasts preStop plus the drain; the devices serve the model name the proxy asks for."""
    (sts,) = [d for d in _docs(DEPLOY / "k8s" / "edge.yaml") if d["kind"] == "StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready" and "/ready" in ROUTES
    assert c["livenessProbe"]["httpGet"]["path"] == "/health" and "/health" in ROUTES
    assert c["startupProbe"]["httpGet"]["path"] in ROUTES
    pause = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > pause + float(_flag(c["args"], "--drain-timeout"))
    assert _flag(c["args"], "--model").split("=")[0] == MODEL
    recipe = yaml.safe_load((DEPLOY / "litellm.yaml").read_text())
    hosts = {re.match(r"http://([^:/]+)", d["litellm_params"]["api_base"]).group(1) for d in recipe["model_list"]}
    assert hosts == {f"{sts['metadata']['name']}-{i}.{sts['spec']['serviceName']}"
                     for i in range(sts["spec"]["replicas"])}
    assert {d["litellm_params"]["model"] for d in recipe["model_list"]} == {f"openai/{MODEL}"}


def test_compose_services_match_the_proxy_config():
    """Each device the proxy lists is a compose service (by its network alias) that checks
    /ready and stops within a grace period longer than its drain."""
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    recipe = yaml.safe_load((DEPLOY / "litellm.yaml").read_text())
    hosts = {re.match(r"http://([^:/]+)", d["litellm_params"]["api_base"]).group(1) for d in recipe["model_list"]}
    devices = {name: s for name, s in compose["services"].items() if name != "litellm"}
    assert {a for s in devices.values() for a in s["networks"]["default"]["aliases"]} == hosts
    for s in devices.values():
        assert re.search(r"127\.0\.0\.1:8080(/\w+)", s["healthcheck"]["test"][-1]).group(1) in ROUTES
        assert float(s["stop_grace_period"].rstrip("s")) > float(_flag(s["command"], "--drain-timeout"))
    assert compose["services"]["litellm"]["volumes"][0].startswith("./litellm.yaml:")


def test_kustomization_builds_with_the_proxy_config():
    """`kubectl kustomize deploy/` renders, and the proxy's ConfigMap is deploy/litellm.yaml."""
    if shutil.which("kubectl") is None:     # the oracle: strict mode fails without it
        missing("kubectl (its kustomize renders deploy/) is not installed")
    out = subprocess.run(["kubectl", "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert yaml.safe_load(cm["data"]["config.yaml"]) == yaml.safe_load((DEPLOY / "litellm.yaml").read_text())
    (proxy,) = [d for d in docs if d["kind"] == "Deployment"]
    assert proxy["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"] == cm["metadata"]["name"]
