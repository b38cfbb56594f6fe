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

#: name -> (value, help) of gauges read at scrape time; a value {model: v} is one gauge
#: labelled by model
Gauges = dict[str, tuple[float | dict[str, float], str]]


class _ScrapeGauges:
    """A collector of the gauges `read()` returns when scraped (slots, queue, readiness)."""

    def __init__(self, read: Callable[[], Gauges]):
        self.read = read

    def collect(self):
        for name, (value, help_) in self.read().items():
            if isinstance(value, dict):
                fam = GaugeMetricFamily(name, help_, labels=["model"])
                for model, v in value.items():
                    fam.add_metric([model], v)
                yield fam
            else:
                yield GaugeMetricFamily(name, help_, value=value)


class Metrics:
    """Counters and histograms of one server, plus the gauges `gauges()` reports per scrape.
    Generation metrics carry the served model's name as the label `model`.
    prometheus-client's metrics are thread-safe."""

    def __init__(self, gauges: Callable[[], Gauges] | None = None) -> None:
        self.registry = reg = CollectorRegistry()
        self.requests = Counter("edgeinfer_requests_total", "HTTP requests by route and status code.",
                                ["route", "status"], registry=reg)
        self.finish = Counter("edgeinfer_request_finish_total", "Finished generations by finish reason.",
                              ["model", "reason"], registry=reg)
        self.prompt_tokens = Counter("edgeinfer_prompt_tokens_total", "Prompt tokens received.",
                                     ["model"], registry=reg)
        self.generated_tokens = Counter("edgeinfer_generation_tokens_total", "Tokens generated.",
                                        ["model"], registry=reg)
        self.cached_tokens = Counter("edgeinfer_prompt_tokens_cached_total",
                                     "Prompt tokens reused from a slot (prefix reuse).", ["model"], registry=reg)
        self.ttft = Histogram("edgeinfer_time_to_first_token_seconds",
                              "Request arrival to first generated token.", ["model"],
                              buckets=LATENCY_BUCKETS, registry=reg)
        self.tpot = Histogram("edgeinfer_time_per_output_token_seconds",
                              "Mean time between output tokens after the first, per request.",
                              ["model"], buckets=TPOT_BUCKETS, registry=reg)
        self.e2e = Histogram("edgeinfer_e2e_request_latency_seconds", "Request arrival to last token.", ["model"],
                             buckets=LATENCY_BUCKETS, registry=reg)
        self.queue = Histogram("edgeinfer_queue_time_seconds", "Request arrival to a KV slot granted.", ["model"],
                               buckets=LATENCY_BUCKETS, registry=reg)
        self.fallbacks = Counter("edgeinfer_fallbacks_total", "Requests for a model served by the "
                                 "fallback model instead (--fallback), by reason: queue_full or ttft.",
                                 ["model", "to", "reason"], registry=reg)
        if gauges is not None:
            reg.register(_ScrapeGauges(gauges))

    def count_request(self, route: str, status: int) -> None:
        self.requests.labels(route=route, status=str(int(status))).inc()

    def observe_generation(self, stats, finish_reason: str, model: str = "") -> None:
        self.prompt_tokens.labels(model=model).inc(stats.prompt_tokens)
        self.generated_tokens.labels(model=model).inc(stats.completion_tokens)
        self.cached_tokens.labels(model=model).inc(stats.cached_tokens)
        self.finish.labels(model=model, reason=finish_reason).inc()
        self.queue.labels(model=model).observe(stats.queue_s)
        if stats.completion_tokens > 0:
            self.ttft.labels(model=model).observe(stats.ttft_s)
            self.e2e.labels(model=model).observe(stats.e2e_s)
        if stats.completion_tokens > 1:
            self.tpot.labels(model=model).observe(stats.tpot_s)

    def add_model(self, model: str) -> None:
        """Creates the model's series at zero, so a scrape shows them before its first request."""
        for m in (self.prompt_tokens, self.generated_tokens, self.cached_tokens, self.queue, self.ttft,
                  self.e2e, self.tpot):
            m.labels(model=model)

    def count_fallback(self, model: str, to: str, reason: str) -> None:
        self.fallbacks.labels(model=model, to=to, reason=reason).inc()

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """(exposition, its content type) in the format the scraper's Accept header asks for:
        Prometheus text 0.0.4 by default, OpenMetrics when asked."""
        encode, content_type = choose_encoder(accept)
        return encode(self.registry), content_type
