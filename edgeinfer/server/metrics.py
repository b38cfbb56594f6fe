"""Prometheus text exposition (format 0.0.4) of the server's counters, gauges and histograms.

Definitions follow shared/design.md: TTFT = arrival -> first generated token, TPOT = mean
time between output tokens after the first, e2e = arrival -> last token.
"""
from __future__ import annotations

import bisect
import threading
from typing import Callable

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                   10.0, 30.0, 60.0, 120.0)
TPOT_BUCKETS = (0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                0.5, 1.0, 2.5)


def _fmt(v: float) -> str:
    v = float(v)
    if v == float("inf"):
        return "+Inf"
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)


def _labels(d: dict) -> str:
    if not d:
        return ""
    inner = ",".join(f'{k}="{str(v)}"'.replace("\n", " ") for k, v in sorted(d.items()))
    return "{" + inner + "}"


class Histogram:
    def __init__(self, name: str, help_: str, buckets: tuple[float, ...]):
        self.name, self.help, self.buckets = name, help_, buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, v)] += 1
        self.sum += v
        self.count += 1

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        cum = 0
        for b, c in zip(self.buckets + (float("inf"),), self.counts):
            cum += c
            out.append(f'{self.name}_bucket{{le="{_fmt(b)}"}} {cum}')
        out.append(f"{self.name}_sum {self.sum!r}")
        out.append(f"{self.name}_count {self.count}")
        return out


class Metrics:
    """Thread-safe registry; `render(gauges)` returns the exposition text."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.finish: dict[str, int] = {}
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.cached_tokens = 0
        self.ttft = Histogram("edgeinfer_time_to_first_token_seconds",
                              "Request arrival to first generated token.", LATENCY_BUCKETS)
        self.tpot = Histogram("edgeinfer_time_per_output_token_seconds",
                              "Mean time between output tokens after the first, per request.", TPOT_BUCKETS)
        self.e2e = Histogram("edgeinfer_e2e_request_latency_seconds",
                             "Request arrival to last token.", LATENCY_BUCKETS)
        self.queue = Histogram("edgeinfer_queue_time_seconds",
                               "Request arrival to a KV slot granted.", LATENCY_BUCKETS)

    def count_request(self, route: str, status: int) -> None:
        with self._lock:
            key = (route, int(status))
            self.requests[key] = self.requests.get(key, 0) + 1

    def observe_generation(self, stats, finish_reason: str) -> None:
        with self._lock:
            self.prompt_tokens += stats.prompt_tokens
            self.generated_tokens += stats.completion_tokens
            self.cached_tokens += stats.cached_tokens
            self.finish[finish_reason] = self.finish.get(finish_reason, 0) + 1
            self.queue.observe(stats.queue_s)
            if stats.completion_tokens > 0:
                self.ttft.observe(stats.ttft_s)
                self.e2e.observe(stats.e2e_s)
            if stats.completion_tokens > 1:
                self.tpot.observe(stats.tpot_s)

    def render(self, gauges: dict[str, tuple[float, str]] | None = None,
               extra: Callable[[], list[str]] | None = None) -> str:
        with self._lock:
            lines = ["# HELP edgeinfer_requests_total HTTP requests by route and status code.",
                     "# TYPE edgeinfer_requests_total counter"]
            for (route, status), n in sorted(self.requests.items()):
                lines.append(f"edgeinfer_requests_total{_labels({'route': route, 'status': status})} {n}")
            lines += ["# HELP edgeinfer_request_finish_total Finished generations by finish reason.",
                      "# TYPE edgeinfer_request_finish_total counter"]
            for reason, n in sorted(self.finish.items()):
                lines.append(f"edgeinfer_request_finish_total{_labels({'reason': reason})} {n}")
            for name, v, h in (("edgeinfer_prompt_tokens_total", self.prompt_tokens, "Prompt tokens received."),
                               ("edgeinfer_generation_tokens_total", self.generated_tokens, "Tokens generated."),
                               ("edgeinfer_prompt_tokens_cached_total", self.cached_tokens,
                                "Prompt tokens reused from a slot (prefix reuse).")):
                lines += [f"# HELP {name} {h}", f"# TYPE {name} counter", f"{name} {v}"]
            for hist in (self.ttft, self.tpot, self.e2e, self.queue):
                lines += hist.render()
        for name, (v, h) in (gauges or {}).items():
            lines += [f"# HELP {name} {h}", f"# TYPE {name} gauge", f"{name} {_fmt(v)}"]
        return "\n".join(lines) + "\n"
