#!/usr/bin/env python3
"""Soak test of `edgeinfer serve`: hours of Poisson load, judged on what a long run breaks.

    python scripts/soak.py --duration 3600 --rate 1 --threads 2 --json-out soak.json
    python scripts/soak.py --url http://127.0.0.1:8080 --duration 600   # a server already running

It starts the server itself (the default model, or --model PATH) on 127.0.0.1 on a free port,
or targets --url, a loopback address only. Requests arrive as a Poisson process at --rate per
second, a seeded mix of: plain completions, streamed chats (with usage), streams the client
drops after a few chunks, n > 1 choices, long prompts (half the context; some past it, which
must be refused with a 400), structured output (response_format json_schema) and malformed
bodies (each must get its 4xx).

Every interval (--interval seconds) it prints a row: requests by outcome, P50/P99 TTFT and TPOT
of the streams, and the server's RSS (read with psutil from its pid). At the end a JSON summary
(also written to --json-out). Exit 1 naming the reason on any of:

* a 5xx (an error event inside a stream counts), except a 503 with Retry-After (busy);
* a lost request: neither a complete response nor the expected refusal (its 4xx, or a 429 /
  503 with Retry-After); a stream that ended without its final event and [DONE] is lost;
* RSS growth after warm-up above --max-rss-growth (3%): the median RSS of the last interval
  over the median of the first interval after --warmup. With --rss anon (the default) the
  judged RSS is the server's anonymous memory (RssAnon + RssShmem: what it allocated, where a
  leak shows); its file-backed pages (RssFile: libraries, the model's file mapping, where an
  untied token embedding's rows fault in as new tokens are seen, up to the table's size, and
  stay reclaimable) are reported beside it. --rss total judges VmRSS, both together;
* the server exiting during the run, or not becoming ready;
* a slot or queue entry still held once every request is over (/health, after the drain).

Every loop is bounded: arrivals stop at --duration, at most --max-inflight requests are open
(an arrival past it is counted as skipped, not sent), each request has a timeout, and the
in-flight ones get --drain seconds at the end.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlparse

# outcomes: the first three pass, the last two fail the run
OK, REFUSED, BUSY, DISCONNECTED, SERVER_ERROR, LOST = "ok", "refused", "busy", "disconnected", "5xx", "lost"
OUTCOMES = (OK, REFUSED, BUSY, DISCONNECTED, SERVER_ERROR, LOST)
KINDS = {  # weight of each request kind in the mix
    "complete": 3, "chat_stream": 4, "disconnect": 1, "n_choices": 1, "long_prompt": 1, "over_context": 0.5,
    "json_schema": 1, "malformed": 1,
}
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
# malformed bodies and the status each must get (raw bytes: sent as they are)
MALFORMED = [
    (b'{"messages": [{"role": "user", "content": "hi"}', 400),                       # truncated JSON
    (b'[1, 2, 3]', 400),                                                              # not an object
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}).encode(), 400),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "n": 0}).encode(), 400),
    (json.dumps({"messages": []}).encode(), 400),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}).encode(), 400),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "model": "no-such-model"}).encode(), 404),
    (b'\xff\xfe\x00 not utf-8', 400),
]
RSS_KINDS = ("rss", "anon", "file")   # VmRSS; RssAnon + RssShmem; RssFile (bytes)
WORDS = ("river", "stone", "light", "paper", "garden", "window", "music", "thunder", "orange", "silver",
         "forest", "market", "engine", "harbor", "candle", "winter", "letter", "mountain", "bridge", "story")
# (each is one token in SmolLM2's vocabulary: a prompt of k words is about k tokens)


@dataclass
class Result:
    kind: str
    outcome: str
    t_start: float                 # seconds since the run started
    status: int = 0
    ttft_s: float | None = None    # streams only: first content chunk
    tpot_s: float | None = None    # streams only: (last - first chunk) / (tokens - 1)
    detail: str = ""               # what was wrong (failures), the request in short


@dataclass
class Verdict:
    passed: bool
    reasons: list[str] = field(default_factory=list)


# ------------------------------------------------------------------ judging (pure: tests/test_soak.py)

def classify_status(status: int, headers: dict, expected_4xx: int | None) -> str | None:
    """The outcome of an HTTP status before the body is read; None: a 2xx, read the body.
    `expected_4xx`: the refusal this request must get (None: it is well formed)."""
    if status in (429, 503) and "retry-after" in {k.lower() for k in headers}:
        return BUSY
    if status >= 500:
        return SERVER_ERROR
    if expected_4xx is not None:
        return REFUSED if status == expected_4xx else LOST
    if 200 <= status < 300:
        return None
    return LOST                     # a well-formed request refused


def check_stream(events: list, n: int) -> str | None:
    """What is wrong with a finished SSE stream (parsed `data:` payloads, "[DONE]" as the
    string), or None: every one of the n choices ended with a finish_reason, then [DONE]."""
    if not events or events[-1] != "[DONE]":
        return "the stream ended without [DONE]"
    finished = set()
    for ev in events[:-1]:
        if isinstance(ev, dict) and "error" in ev:
            return f"error event: {json.dumps(ev)[:300]}"
        for ch in (ev.get("choices") or []) if isinstance(ev, dict) else []:
            if ch.get("finish_reason"):
                finished.add(ch.get("index", 0))
    if finished != set(range(n)):
        return f"finish_reason for choices {sorted(finished)} of {n}"
    return None


def check_completion(body, kind: str, n: int) -> str | None:
    """What is wrong with a complete (non-streamed) response body, or None."""
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
        return f"no choices in {str(body)[:200]}"
    choices = body["choices"]
    if sorted(c.get("index") for c in choices) != list(range(n)):
        return f"{len(choices)} choices, {n} asked"
    if any(not c.get("finish_reason") for c in choices):
        return "a choice without finish_reason"
    if kind == "json_schema":
        for c in choices:
            if c["finish_reason"] != "stop":
                continue            # cut by max_tokens: not a complete document
            try:
                doc = json.loads(c["message"]["content"])
            except (TypeError, ValueError, KeyError):
                return f"not JSON: {str(c.get('message'))[:200]}"
            if not isinstance(doc, dict) or set(doc) != {"name", "age"}:
                return f"does not follow the schema: {str(doc)[:200]}"
    return None


def percentile(xs: list[float], p: float) -> float | None:
    """Linear interpolation between order statistics (numpy's default)."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def interval_row(index: int, t0: float, t1: float, results: list[Result], rss: list[dict]) -> dict:
    """One interval's figures: requests started in [t0, t1) by outcome, stream latencies, and
    the medians of the RSS samples (dicts of total / anon / file bytes) and the largest total."""
    mine = [r for r in results if t0 <= r.t_start < t1]
    ttft = [r.ttft_s for r in mine if r.ttft_s is not None]
    tpot = [r.tpot_s for r in mine if r.tpot_s is not None]

    def ms(v):
        return None if v is None else round(v * 1e3, 1)
    return {"interval": index, "t0": round(t0, 1), "t1": round(t1, 1), "requests": len(mine),
            **{o: sum(r.outcome == o for r in mine) for o in OUTCOMES},
            "ttft_ms_p50": ms(percentile(ttft, 0.5)), "ttft_ms_p99": ms(percentile(ttft, 0.99)),
            "tpot_ms_p50": ms(percentile(tpot, 0.5)), "tpot_ms_p99": ms(percentile(tpot, 0.99)),
            **{f"{k}_median": int(statistics.median(x[k] for x in rss)) if rss else None for k in RSS_KINDS},
            "rss_max": max(x["rss"] for x in rss) if rss else None}


def rss_growth(intervals: list[dict], warmup_s: float,
               kind: str = "rss") -> tuple[float | None, int | None, int | None]:
    """(growth, baseline, end) of the `kind` RSS: the last interval's median over the first
    interval's wholly after the warm-up; None when fewer than two intervals lie after it."""
    key = f"{kind}_median"
    after = [iv for iv in intervals if iv["t0"] >= warmup_s and iv.get(key)]
    if len(after) < 2:
        return None, None, None
    base, end = after[0][key], after[-1][key]
    return end / base - 1, base, end


def judge(results: list[Result], intervals: list[dict], warmup_s: float, max_growth: float,
          server_exit: int | None = None, rss_required: bool = True, idle: dict | None = None,
          rss_kind: str = "anon") -> Verdict:
    """Pass or fail, with every reason: 5xx, lost requests, RSS growth, a server that exited,
    slots or queue still held once every request is over (`idle`: /health after the drain)."""
    reasons = []
    for outcome, what in ((SERVER_ERROR, "5xx response(s)"), (LOST, "lost request(s)")):
        bad = [r for r in results if r.outcome == outcome]
        if bad:
            first = bad[0]
            reasons.append(f"{len(bad)} {what}; first: {first.kind} at {first.t_start:.1f} s, "
                           f"HTTP {first.status}: {first.detail}")
    growth, base, end = rss_growth(intervals, warmup_s, rss_kind)
    if growth is None:
        if rss_required:
            reasons.append(f"RSS not judged: fewer than two intervals after the {warmup_s:g} s warm-up")
    elif growth > max_growth:
        what = "RSS" if rss_kind == "rss" else f"RSS ({rss_kind})"
        reasons.append(f"{what} grew {growth:.1%} after warm-up ({base / 2**20:.1f} -> {end / 2**20:.1f} MiB), "
                       f"more than {max_growth:.0%}")
    if server_exit is not None:
        reasons.append(f"the server exited with status {server_exit} during the run")
    elif idle is None or not idle.get("idle"):
        reasons.append(f"the server did not come back to idle after the run (/health: {idle})")
    return Verdict(not reasons, reasons)


# ------------------------------------------------------------------ requests

def _prompt_words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def make_request(kind: str, rng: random.Random, ctx: int) -> tuple[str, bytes, int, bool, int | None]:
    """(route, body, n choices, streamed, expected 4xx or None) of one request of `kind`."""
    chat = "/v1/chat/completions"
    seed = rng.randrange(2**31)
    msgs = [{"role": "user", "content": f"Write about {_prompt_words(rng, 3)}."}]
    if kind == "malformed":
        raw, status = rng.choice(MALFORMED)
        return chat, raw, 1, False, status
    if kind == "complete":
        body = {"prompt": _prompt_words(rng, 12), "max_tokens": rng.randint(8, 32), "seed": seed}
        return "/v1/completions", json.dumps(body).encode(), 1, False, None
    if kind in ("chat_stream", "disconnect"):
        body = {"messages": msgs, "max_tokens": rng.randint(16, 48), "stream": True, "seed": seed,
                "stream_options": {"include_usage": True}}
        return chat, json.dumps(body).encode(), 1, True, None
    if kind == "n_choices":
        n = rng.choice((2, 3))
        stream = rng.random() < 0.5
        body = {"messages": msgs, "max_tokens": 16, "n": n, "seed": seed, "stream": stream}
        return chat, json.dumps(body).encode(), n, stream, None
    if kind == "long_prompt":   # about half the context (a word is about one token)
        body = {"prompt": _prompt_words(rng, ctx // 2), "max_tokens": 8, "stream": True, "seed": seed}
        return "/v1/completions", json.dumps(body).encode(), 1, True, None
    if kind == "over_context":
        body = {"prompt": _prompt_words(rng, ctx + 64), "max_tokens": 8}
        return "/v1/completions", json.dumps(body).encode(), 1, False, 400
    if kind == "json_schema":
        body = {"messages": [{"role": "user", "content": "Give a person's name and age as JSON."}],
                "max_tokens": 64, "seed": seed, "temperature": 0.7,
                "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}}
        return chat, json.dumps(body).encode(), 1, False, None
    raise ValueError(f"unknown request kind {kind!r}")


async def send(session, url: str, kind: str, rng: random.Random, ctx: int, t_run0: float,
               timeout_s: float) -> Result:
    import aiohttp

    route, body, n, stream, expected = make_request(kind, rng, ctx)
    t_start = time.monotonic()
    res = Result(kind, LOST, t_start - t_run0, detail=f"{route} {body[:160]!r}")
    drop_after = rng.randint(1, 4) if kind == "disconnect" else None
    try:
        async with session.post(url + route, data=body, headers={"Content-Type": "application/json"},
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            res.status = resp.status
            outcome = classify_status(resp.status, dict(resp.headers), expected)
            if outcome is not None:
                res.outcome = outcome
                if outcome in (SERVER_ERROR, LOST):
                    res.detail += f" -> {(await resp.text(errors='replace'))[:300]}"
                return res
            if not stream:
                problem = check_completion(await resp.json(content_type=None), kind, n)
                res.outcome, res.detail = (LOST, res.detail + f" -> {problem}") if problem else (OK, "")
                return res
            events: list = []
            times: list[float] = []
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                events.append("[DONE]" if data == b"[DONE]" else json.loads(data))
                ev = events[-1]
                if isinstance(ev, dict) and any((c.get("delta") or {}).get("content") or c.get("text")
                                                for c in ev.get("choices") or []):
                    times.append(time.monotonic())
                if drop_after is not None and len(times) >= drop_after:
                    res.outcome, res.detail = DISCONNECTED, ""
                    return res          # leaving the block closes the connection mid-stream
            problem = check_stream(events, n)
            if problem:
                res.outcome = SERVER_ERROR if problem.startswith("error event") else LOST
                res.detail += f" -> {problem}"
                return res
            if times:
                res.ttft_s = times[0] - t_start
                if len(times) > 1 and n == 1:
                    res.tpot_s = (times[-1] - times[0]) / (len(times) - 1)
            res.outcome, res.detail = OK, ""
            return res
    except (asyncio.TimeoutError, aiohttp.ClientError, ValueError) as e:
        res.outcome = LOST
        res.detail += f" -> {type(e).__name__}: {e}"
        return res
    except asyncio.CancelledError:      # still open when the drain ran out
        res.outcome = LOST
        res.detail += " -> no answer by the end of the drain"
        return res


# ------------------------------------------------------------------ the server

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_loopback(url: str) -> str:
    """The URL without a trailing slash; ValueError unless its host is a loopback address."""
    host = urlparse(url).hostname or ""
    try:
        loop = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loop = False
    if not loop or urlparse(url).scheme != "http":
        raise ValueError(f"--url must be http on the loopback (127.0.0.1, ::1, localhost), got {url!r}")
    return url.rstrip("/")


def listening_pid(port: int) -> int | None:
    """The pid of the process listening on 127.0.0.1:port (for RSS), if it can be seen."""
    import psutil

    with contextlib.suppress(psutil.Error):
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                return c.pid
    return None


def start_server(args, port: int, log_path: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "edgeinfer", "serve", *([args.model] if args.model else []),
           "--host", "127.0.0.1", "--port", str(port), "--threads", str(args.threads), "--slots", str(args.slots),
           "--ctx", str(args.ctx), "--max-queue", str(args.max_queue)]
    with open(log_path, "wb") as log:     # the child keeps its own descriptor
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


async def wait_ready(session, url: str, proc: subprocess.Popen | None, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s      # a bound on the wait, not a measurement
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        with contextlib.suppress(Exception):
            async with session.get(url + "/ready") as r:
                if r.status == 200:
                    return True
        await asyncio.sleep(0.5)
    return False


async def wait_idle(session, url: str, timeout_s: float) -> dict | None:
    """/health once every sequence is gone (no busy slot, empty queue), or the last answer
    (None: none) when the bound runs out: a slot still held after the run is a leak."""
    last = None
    deadline = time.monotonic() + timeout_s      # a bound on the wait, not a measurement
    while True:
        with contextlib.suppress(Exception):
            async with session.get(url + "/health") as r:
                last = await r.json(content_type=None)
                if r.status == 200 and last.get("slots_busy") == 0 and last.get("queue_length") == 0:
                    return {**last, "idle": True}
        if time.monotonic() >= deadline:
            return None if last is None else {**last, "idle": False}
        await asyncio.sleep(0.5)


# ------------------------------------------------------------------ the run

HEADER = (f"{'t(s)':>7} {'reqs':>5} {'ok':>5} {'4xx':>4} {'busy':>4} {'disc':>4} {'5xx':>4} {'lost':>4} "
          f"{'TTFT p50':>9} {'p99':>7} {'TPOT p50':>9} {'p99':>7} {'RSS MiB':>8} {'anon':>7} {'file':>6}")


def format_row(iv: dict) -> str:
    def f(v):
        return "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}"
    rss, anon, file = ("-" if iv[f"{k}_median"] is None else f"{iv[f'{k}_median'] / 2**20:.1f}"
                       for k in RSS_KINDS)
    return (f"{iv['t1']:>7.0f} {iv['requests']:>5} {iv[OK]:>5} {iv[REFUSED]:>4} {iv[BUSY]:>4} {iv[DISCONNECTED]:>4} "
            f"{iv[SERVER_ERROR]:>4} {iv[LOST]:>4} {f(iv['ttft_ms_p50']):>9} {f(iv['ttft_ms_p99']):>7} "
            f"{f(iv['tpot_ms_p50']):>9} {f(iv['tpot_ms_p99']):>7} {rss:>8} {anon:>7} {file:>6}")


async def soak(args) -> dict:
    import aiohttp
    import psutil

    rng = random.Random(args.seed)
    kinds, weights = zip(*KINDS.items())
    proc, log_path = None, None
    if args.url:
        url = check_loopback(args.url)
    else:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log_path = Path(args.server_log or tempfile.mkstemp(prefix="edgeinfer-soak-", suffix=".log")[1])
        proc = start_server(args, port, log_path)
    results: list[Result] = []
    intervals: list[dict] = []
    server_exit = None
    idle = None
    server = None
    peak_os = None
    conn = aiohttp.TCPConnector(limit=args.max_inflight + 4)
    try:
        async with aiohttp.ClientSession(connector=conn) as session:
            if not await wait_ready(session, url, proc, args.ready_timeout):
                raise SystemExit(f"soak: the server at {url} did not become ready"
                                 + (f" (log: {log_path})" if log_path else ""))
            pid = proc.pid if proc is not None else (args.pid or listening_pid(urlparse(url).port or 80))
            server = psutil.Process(pid) if pid else None
            print(f"soak: {url} (pid {pid or 'unknown'}), {args.duration:g} s at {args.rate:g} req/s, "
                  f"warm-up {args.warmup:g} s, intervals of {args.interval:g} s", flush=True)
            print(HEADER, flush=True)
            t0 = time.monotonic()
            tasks: set[asyncio.Task] = set()
            skipped = 0
            rss: list[dict] = []
            next_arrival = t0 + rng.expovariate(args.rate)
            next_rss = t0
            iv_end = t0 + args.interval
            end = t0 + args.duration
            max_requests = int(args.rate * args.duration * 2) + 100     # a bound on the loop
            sent = 0
            while True:
                now = time.monotonic()
                if (now >= iv_end or now >= end) and min(iv_end, end) > iv_end - args.interval:
                    row = interval_row(len(intervals), iv_end - args.interval - t0, min(iv_end, end) - t0,
                                       results, rss)
                    intervals.append(row)
                    print(format_row(row), flush=True)
                    rss = []
                    iv_end += args.interval
                if now >= end:
                    break
                if proc is not None and proc.poll() is not None:
                    server_exit = proc.returncode
                    break
                if now >= next_rss:
                    if server is not None:
                        with contextlib.suppress(psutil.Error):
                            rss.append(rss_sample(server))
                    next_rss += 1.0
                if now >= next_arrival and sent < max_requests:
                    kind = rng.choices(kinds, weights)[0]
                    if len(tasks) >= args.max_inflight:
                        skipped += 1
                    else:
                        sub_rng = random.Random(rng.randrange(2**63))
                        t = asyncio.create_task(send(session, url, kind, sub_rng, args.ctx, t0, args.timeout))
                        t.add_done_callback(tasks.discard)
                        t.add_done_callback(lambda t: results.append(t.result()))
                        tasks.add(t)
                        sent += 1
                    next_arrival += rng.expovariate(args.rate)
                await asyncio.sleep(max(0.0, min(next_arrival, next_rss, iv_end, end) - time.monotonic()))
            if tasks:        # the in-flight requests: started inside the run, judged with it
                await asyncio.wait(set(tasks), timeout=args.drain)
                left = list(tasks)
                for t in left:
                    t.cancel()
                if left:
                    await asyncio.wait(left)
            if server_exit is None:
                idle = await wait_idle(session, url, args.idle_timeout)
                peak_os = _peak_rss(server)
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=args.drain + 30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    # the last interval's rows may have missed requests that finished in the drain: recount
    memory_keys = [f"{k}_median" for k in RSS_KINDS] + ["rss_max"]
    intervals = [{**interval_row(iv["interval"], iv["t0"], iv["t1"], results, []),
                  **{k: iv[k] for k in memory_keys}} for iv in intervals]
    rss_kind = "rss" if args.rss == "total" else "anon"
    verdict = judge(results, intervals, args.warmup, args.max_rss_growth, server_exit,
                    rss_required=server is not None, idle=idle, rss_kind=rss_kind)
    growth_of = {k: rss_growth(intervals, args.warmup, k) for k in RSS_KINDS}
    stream_ttft = [r.ttft_s for r in results if r.ttft_s is not None]
    stream_tpot = [r.tpot_s for r in results if r.tpot_s is not None]
    failures = [asdict(r) for r in results if r.outcome in (SERVER_ERROR, LOST)]
    return {
        "passed": verdict.passed, "reasons": verdict.reasons,
        "config": {k: v for k, v in vars(args).items() if k != "json_out"}, "url": url,
        "server_log": str(log_path) if log_path else None,
        "requests": len(results), "skipped_at_max_inflight": skipped,
        "outcomes": {o: sum(r.outcome == o for r in results) for o in OUTCOMES},
        "by_kind": {k: {o: sum(r.kind == k and r.outcome == o for r in results) for o in OUTCOMES
                        if any(r.kind == k and r.outcome == o for r in results)} for k in kinds},
        "ttft_ms": {p: _ms(percentile(stream_ttft, q)) for p, q in (("p50", 0.5), ("p99", 0.99))},
        "tpot_ms": {p: _ms(percentile(stream_tpot, q)) for p, q in (("p50", 0.5), ("p99", 0.99))},
        "rss": {"judged": "VmRSS" if rss_kind == "rss" else "RssAnon + RssShmem",
                **{f"{k}_after_warmup": {"baseline": b, "end": e, "growth": None if g is None else round(g, 4)}
                   for k, (g, b, e) in growth_of.items()},
                "peak_sampled": max((iv["rss_max"] or 0 for iv in intervals), default=None),
                "peak_os": peak_os, "plan_predicted": None if args.url else plan_prediction(args)},
        "idle_after": idle, "intervals": intervals, "failures": failures[:20],
    }


def _ms(v):
    return None if v is None else round(v * 1e3, 1)


def plan_prediction(args) -> int | None:
    """What `edgeinfer plan` predicts for the server this script started (its peak RSS)."""
    from edgeinfer.errors import EdgeInferError
    from edgeinfer.hub import DEFAULT_MODEL
    from edgeinfer.tools import plan as P

    try:
        m = P.model_shape(args.model or DEFAULT_MODEL)
    except (EdgeInferError, OSError):   # the soak's verdict does not depend on it
        return None
    return P.plan_one(m, args.ctx, args.slots, n_threads=args.threads, process="serve").total


def rss_sample(server) -> dict:
    """The server's RSS now: total, anonymous (+ shared memory) and file-backed bytes, from
    /proc/PID/status on Linux (elsewhere the total alone, for all three)."""
    try:
        with open(f"/proc/{server.pid}/status") as f:
            kb = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f if ":" in line)
                  if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem")}
        return {"rss": kb["VmRSS"], "anon": kb["RssAnon"] + kb.get("RssShmem", 0), "file": kb["RssFile"]}
    except (OSError, KeyError, ValueError):
        total = server.memory_info().rss
        return {"rss": total, "anon": total, "file": total}


def _peak_rss(server) -> int | None:
    """The server's peak RSS as the kernel counted it (VmHWM), when it is readable."""
    if server is None:
        return None
    with contextlib.suppress(OSError), open(f"/proc/{server.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def parse_args(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="GGUF file or known model name for the server it starts (default model)")
    ap.add_argument("--url", help="target a running server (loopback only) instead of starting one")
    ap.add_argument("--pid", type=int, help="with --url: the server's pid for RSS (default: who listens on the port)")
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    ap.add_argument("--rate", type=float, default=1.0, help="Poisson arrivals per second")
    ap.add_argument("--interval", type=float, default=60.0, help="seconds per report row")
    ap.add_argument("--warmup", type=float, default=None,
                    help="seconds before the RSS baseline (default: 10%% of the duration, at least one interval)")
    ap.add_argument("--max-rss-growth", type=float, default=0.03, help="RSS growth allowed after warm-up")
    ap.add_argument("--rss", choices=("anon", "total"), default="anon",
                    help="the RSS judged: anonymous memory (where a leak shows), or VmRSS with file pages")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--max-queue", type=int, default=16)
    ap.add_argument("--max-inflight", type=int, default=32, help="open requests at most (client side)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    ap.add_argument("--drain", type=float, default=120.0, help="seconds for in-flight requests at the end")
    ap.add_argument("--ready-timeout", type=float, default=600.0)
    ap.add_argument("--idle-timeout", type=float, default=30.0,
                    help="seconds for the server to free every slot once the last request is over")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server-log", help="file for the started server's output (default: a temp file)")
    ap.add_argument("--json-out", help="also write the JSON summary here")
    args = ap.parse_args(argv)
    if args.duration <= 0 or args.rate <= 0 or args.interval <= 0 or args.max_inflight < 1:
        ap.error("--duration, --rate, --interval and --max-inflight must be positive")
    if args.url:
        try:
            check_loopback(args.url)
        except ValueError as e:
            ap.error(str(e))
    if args.warmup is None:
        args.warmup = max(args.interval, round(0.1 * args.duration / args.interval) * args.interval)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    summary = asyncio.run(soak(args))
    text = json.dumps(summary, indent=2)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    o = summary["outcomes"]
    print(f"\n{summary['requests']} requests: " + ", ".join(f"{k} {v}" for k, v in o.items())
          + f"; skipped at --max-inflight {summary['skipped_at_max_inflight']}")
    print(json.dumps({k: summary[k] for k in ("passed", "reasons", "outcomes", "ttft_ms", "tpot_ms", "rss")}))
    if not summary["passed"]:
        for r in summary["reasons"]:
            print(f"soak FAILED: {r}", file=sys.stderr)
        return 1
    print("soak passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
