"""The server's Prometheus metrics, kept and exposed by prometheus-client in a registry of
the server's own (never the process-global one, so two servers in a process do not mix).

Definitions follow docs/architecture.md (Metrics): TTFT = arrival -> first generated token, TPOT = mean
time between output tokens after the first, e2e = arrival -> last token.
"""
from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder

__all__ = ["Metrics", "LATENCY_BUCKETS", "TPOT_BUCKETS"]

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                   10.0, 30.0, 60.0, 120.0)
TPOT_BUCKETS = (0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                0.5, 1.0, 2.5)

#: name -> (value, help) of gauges read at scrape time
Gauges = dict[str, tuple[float, str]]


class _ScrapeGauges:
    """A collector of the gauges `read()` returns when scraped (slots, queue, readiness)."""

    def __init__(self, read: Callable[[], Gauges]):
        self.read = read

    def collect(self):
        for name, (value, help_) in self.read().items():
            yield GaugeMetricFamily(name, help_, value=value)


class Metrics:
    """Counters and histograms of one server, plus the gauges `gauges()` reports per scrape.
    prometheus-client's metrics are thread-safe."""

    def __init__(self, gauges: Callable[[], Gauges] | None = None) -> None:
        self.registry = reg = CollectorRegistry()
        self.requests = Counter("edgeinfer_requests_total", "HTTP requests by route and status code.",
                                ["route", "status"], registry=reg)
        self.finish = Counter("edgeinfer_request_finish_total", "Finished generations by finish reason.",
                              ["reason"], registry=reg)
        self.prompt_tokens = Counter("edgeinfer_prompt_tokens_total", "Prompt tokens received.",
                                     registry=reg)
        self.generated_tokens = Counter("edgeinfer_generation_tokens_total", "Tokens generated.",
                                        registry=reg)
        self.cached_tokens = Counter("edgeinfer_prompt_tokens_cached_total",
                                     "Prompt tokens reused from a slot (prefix reuse).", registry=reg)
        self.ttft = Histogram("edgeinfer_time_to_first_token_seconds",
                              "Request arrival to first generated token.", buckets=LATENCY_BUCKETS,
                              registry=reg)
        self.tpot = Histogram("edgeinfer_time_per_output_token_seconds",
                              "Mean time between output tokens after the first, per request.",
                              buckets=TPOT_BUCKETS, registry=reg)
        self.e2e = Histogram("edgeinfer_e2e_request_latency_seconds", "Request arrival to last token.",
                             buckets=LATENCY_BUCKETS, registry=reg)
        self.queue = Histogram("edgeinfer_queue_time_seconds", "Request arrival to a KV slot granted.",
                               buckets=LATENCY_BUCKETS, registry=reg)
        if gauges is not None:
            reg.register(_ScrapeGauges(gauges))

    def count_request(self, route: str, status: int) -> None:
        self.requests.labels(route=route, status=str(int(status))).inc()

    def observe_generation(self, stats, finish_reason: str) -> None:
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.generated_tokens.inc(stats.completion_tokens)
        self.cached_tokens.inc(stats.cached_tokens)
        self.finish.labels(reason=finish_reason).inc()
        self.queue.observe(stats.queue_s)
        if stats.completion_tokens > 0:
            self.ttft.observe(stats.ttft_s)
            self.e2e.observe(stats.e2e_s)
        if stats.completion_tokens > 1:
            self.tpot.observe(stats.tpot_s)

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """(exposition, its content type) in the format the scraper's Accept header asks for:
        Prometheus text 0.0.4 by default, OpenMetrics when asked."""
        encode, content_type = choose_encoder(accept)
        return encode(self.registry), content_type
