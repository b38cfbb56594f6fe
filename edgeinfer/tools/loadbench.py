"""Load benchmark of a running server (`edgeinfer bench --server URL`).

For each concurrency level it sends `requests` streaming completions (closed loop: each of
`c` workers sends the next request when its last one ends; with `rate`, Poisson arrivals at
`rate` requests/s, at most `c` in flight) and reports throughput and P50/P90/P99 of TTFT,
TPOT and end-to-end latency, as defined in docs/architecture.md (Metrics), measured at the client.
"""
from __future__ import annotations

import asyncio
import json as _json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

TOPICS = ["a lighthouse", "the moon", "a lost key", "a red bicycle", "an old library", "the sea",
          "a mountain village", "a clockmaker", "a small robot", "a winter storm", "a garden", "a train"]


@dataclass
class Sample:
    ok: bool
    status: int = 0
    ttft_s: float = 0.0
    tpot_s: float = 0.0
    e2e_s: float = 0.0
    tokens: int = 0
    error: str = ""


@dataclass
class LevelResult:
    concurrency: int
    requests: int
    ok: int
    failed: int
    wall_s: float
    output_tokens: int
    output_tokens_per_s: float
    requests_per_s: float
    ttft_ms: dict = field(default_factory=dict)      # p50/p90/p99/mean
    tpot_ms: dict = field(default_factory=dict)
    e2e_ms: dict = field(default_factory=dict)
    rate: float | None = None
    errors: list[str] = field(default_factory=list)


def percentiles(xs: Sequence[float]) -> dict:
    if not xs:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    s = sorted(xs)

    def q(p: float) -> float:          # linear interpolation (numpy's default)
        k = (len(s) - 1) * p
        lo, hi = int(k), min(int(k) + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)
    return {"p50": q(0.50), "p90": q(0.90), "p99": q(0.99), "mean": sum(s) / len(s)}


def _ms(d: dict) -> dict:
    return {k: (None if v is None else round(v * 1e3, 2)) for k, v in d.items()}


async def _one(session, url: str, body: dict, headers: dict) -> Sample:
    t0 = time.perf_counter()
    t_first = None
    n_tokens = 0
    usage_tokens = None
    try:
        async with session.post(url + "/v1/completions", json=body, headers=headers) as resp:
            if resp.status != 200:
                text = await resp.text()
                return Sample(False, resp.status, error=f"HTTP {resp.status}: {text[:200]}")
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if data == b"[DONE]":
                    break
                chunk = _json.loads(data)
                if "error" in chunk:
                    return Sample(False, 200, error=str(chunk["error"].get("message")))
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"]["completion_tokens"]
                for c in chunk.get("choices", []):
                    if c.get("text"):
                        n_tokens += 1
                        if t_first is None:
                            t_first = time.perf_counter()
    except Exception as e:  # connection errors count as failures
        return Sample(False, 0, error=f"{type(e).__name__}: {e}")
    t_end = time.perf_counter()
    n = usage_tokens if usage_tokens is not None else n_tokens
    if t_first is None:
        t_first = t_end
    return Sample(True, 200, ttft_s=t_first - t0, tpot_s=(t_end - t_first) / (n - 1) if n > 1 else 0.0,
                  e2e_s=t_end - t0, tokens=n)


async def _level(url: str, c: int, n_requests: int, rate: float | None, max_tokens: int, headers: dict,
                 model: str | None, prompt: str | None, seed: int, timeout_s: float) -> LevelResult:
    import aiohttp

    rng = random.Random(seed + c)

    def body(i: int) -> dict:
        p = prompt if prompt is not None else f"Write a short story about {TOPICS[i % len(TOPICS)]}. Once,"
        b = {"prompt": p, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
             "stream_options": {"include_usage": True}, "ignore_eos": True}
        if model:
            b["model"] = model
        return b

    samples: list[Sample] = []
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(limit=max(c, 1) + 4)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        t0 = time.perf_counter()
        if rate is None:
            counter = iter(range(n_requests))

            async def worker() -> None:
                for i in counter:
                    samples.append(await _one(session, url, body(i), headers))
            await asyncio.gather(*(worker() for _ in range(c)))
        else:
            sem = asyncio.Semaphore(c)

            async def fire(i: int) -> None:
                async with sem:
                    samples.append(await _one(session, url, body(i), headers))
            tasks = []
            for i in range(n_requests):
                tasks.append(asyncio.create_task(fire(i)))
                await asyncio.sleep(rng.expovariate(rate))
            await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    good = [s for s in samples if s.ok]
    out_tokens = sum(s.tokens for s in good)
    return LevelResult(
        concurrency=c, requests=n_requests, ok=len(good), failed=len(samples) - len(good), wall_s=round(wall, 3),
        output_tokens=out_tokens, output_tokens_per_s=round(out_tokens / wall, 2) if wall > 0 else 0.0,
        requests_per_s=round(len(good) / wall, 3) if wall > 0 else 0.0,
        ttft_ms=_ms(percentiles([s.ttft_s for s in good])),
        tpot_ms=_ms(percentiles([s.tpot_s for s in good if s.tokens > 1])),
        e2e_ms=_ms(percentiles([s.e2e_s for s in good])), rate=rate,
        errors=sorted({s.error for s in samples if not s.ok})[:5])


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def format_table(levels: list[LevelResult]) -> str:
    head = (f"{'conc':>4} {'ok':>5} {'fail':>4} {'tok/s':>8} {'req/s':>6} | {'TTFT p50':>8} {'p90':>7} {'p99':>7}"
            f" | {'TPOT p50':>8} {'p90':>7} {'p99':>7} | {'e2e p50':>8} {'p90':>8} {'p99':>8}  (ms)")
    rows = [head, "-" * len(head)]
    for r in levels:
        rows.append(f"{r.concurrency:>4} {r.ok:>5} {r.failed:>4} {r.output_tokens_per_s:>8.1f} "
                    f"{r.requests_per_s:>6.2f} | {_fmt(r.ttft_ms['p50']):>8} {_fmt(r.ttft_ms['p90']):>7} "
                    f"{_fmt(r.ttft_ms['p99']):>7} | {_fmt(r.tpot_ms['p50']):>8} {_fmt(r.tpot_ms['p90']):>7} "
                    f"{_fmt(r.tpot_ms['p99']):>7} | {_fmt(r.e2e_ms['p50']):>8} {_fmt(r.e2e_ms['p90']):>8} "
                    f"{_fmt(r.e2e_ms['p99']):>8}")
    return "\n".join(rows)


def plot_levels(levels: list[LevelResult], path: str, title: str = "") -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("--plot needs matplotlib (pip install matplotlib)") from e
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = [r.output_tokens_per_s for r in levels]
    for key, label in (("e2e_ms", "e2e p50"), ("ttft_ms", "TTFT p50")):
        y = [getattr(r, key)["p50"] or 0 for r in levels]
        ax.plot(x, y, marker="o", label=label)
        for r, xi, yi in zip(levels, x, y):
            ax.annotate(f"c={r.concurrency}", (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=8)
    y90 = [r.e2e_ms["p90"] or 0 for r in levels]
    ax.plot(x, y90, marker=".", linestyle="--", label="e2e p90")
    ax.set_xlabel("throughput (output tokens/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(title or "edgeinfer serve: latency vs throughput")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_server_bench(url: str, concurrency: Sequence[int] = (1, 2, 4, 8), requests: int = 32,
                     rate: float | None = None, json: bool = False, plot: str | None = None,
                     max_tokens: int = 64, api_key: str | None = None, model: str | None = None,
                     prompt: str | None = None, seed: int = 0, warmup: int = 1, timeout_s: float = 600.0,
                     out: Callable[[str], None] | None = None) -> dict:
    """Benchmarks the server at `url` at each concurrency level; returns (and prints) the results.

    `json=True` prints one JSON document instead of the table; `plot=PATH` draws latency
    against throughput (needs matplotlib). Requests use /v1/completions with streaming,
    greedy sampling and `ignore_eos`, so each generates exactly `max_tokens` tokens."""
    out = out or (lambda s: print(s, flush=True))
    url = url.rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    levels_in = [int(c) for c in concurrency]
    if not levels_in or any(c < 1 for c in levels_in) or requests < 1 or max_tokens < 1:
        raise ValueError("concurrency levels, requests and max_tokens must be >= 1")
    if rate is not None and rate <= 0:
        raise ValueError("rate must be > 0 requests/s")
    if plot:
        try:
            import matplotlib  # noqa: F401  (checked before the run, not after)
        except ImportError as e:
            raise RuntimeError("--plot needs matplotlib (pip install matplotlib)") from e

    async def main() -> list[LevelResult]:
        if warmup:
            await _level(url, 1, warmup, None, min(max_tokens, 8), headers, model, prompt, seed, timeout_s)
        res = []
        for c in levels_in:
            r = await _level(url, c, requests, rate, max_tokens, headers, model, prompt, seed, timeout_s)
            res.append(r)
            if not json:
                out(f"concurrency {c}: {r.ok}/{r.requests} ok, {r.output_tokens_per_s:.1f} tok/s")
        return res

    levels = asyncio.run(main())
    result = {"url": url, "requests": requests, "rate": rate, "max_tokens": max_tokens,
              "levels": [asdict(r) for r in levels]}
    if levels and levels[0].output_tokens_per_s > 0:
        base = levels[0].output_tokens_per_s
        result["speedup_vs_first"] = {r.concurrency: round(r.output_tokens_per_s / base, 2) for r in levels}
    if plot:
        plot_levels(levels, plot)
        result["plot"] = plot
    if json:
        out(_json.dumps(result, indent=2))
    else:
        out(format_table(levels))
        if plot:
            out(f"plot: {plot}")
    return result


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - `python -m edgeinfer.tools.loadbench`
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--rate", type=float, default=None)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--plot", default=None)
    a = ap.parse_args(argv)
    r = run_server_bench(a.url, [int(x) for x in a.concurrency.split(",")], a.requests, a.rate, a.json, a.plot,
                         max_tokens=a.max_tokens, api_key=a.api_key)
    return 1 if any(lv["failed"] for lv in r["levels"]) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
