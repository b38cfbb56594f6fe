"""The models one server serves, by name, and the fallback route between them.

Each served model has its own engine (its own scheduler, slots and queue); a request's
`model` picks one. `--fallback SMALL` sends a request for any other model to SMALL when
that model's queue is full or its recent time to first token is above a limit.
"""
from __future__ import annotations

import statistics
import threading
import time
from collections import deque

from ..hub import get_model_spec
from .protocol import APIError

__all__ = ["ServedModel", "Registry", "RECENT_TTFT_WINDOW_S"]

RECENT_TTFT_WINDOW_S = 30.0   # TTFTs older than this no longer count as "recent"
RECENT_TTFT_MAX = 16          # the most recent TTFTs kept per model


class ServedModel:
    """One served model: its name (the id clients send), other names it answers to, its
    engine (None while loading) and its recent TTFTs (for the fallback route)."""

    def __init__(self, name: str, engine=None, aliases: set[str] | None = None):
        self.name = name
        self.engine = engine
        self.aliases = set(aliases or ())
        self.status = "ready" if engine is not None else "loading"
        self.error: str | None = None
        self._ttft: deque[tuple[float, float]] = deque(maxlen=RECENT_TTFT_MAX)
        self._lock = threading.Lock()

    def ids(self) -> set[str]:
        return {self.name} | self.aliases

    def set_engine(self, engine) -> None:
        self.engine = engine
        self.status = "ready"

    def set_failed(self, message: str) -> None:
        self.error = message
        self.status = "failed"

    def require(self):
        """The engine, or 503 saying why there is none."""
        if self.status == "failed":
            raise APIError(503, f"the model '{self.name}' failed to load: {self.error}", type="server_error",
                           code="model_failed")
        if self.engine is None:
            raise APIError(503, f"the model '{self.name}' is still loading", type="server_error",
                           code="model_loading", headers={"Retry-After": "2"})
        return self.engine

    def observe_ttft(self, ttft_s: float) -> None:
        with self._lock:
            self._ttft.append((time.monotonic(), ttft_s))

    def recent_ttft(self, window_s: float = RECENT_TTFT_WINDOW_S) -> float | None:
        """Median TTFT of the requests finished in the last `window_s` seconds; None if none.
        Old figures expire, so a model that fell back gets tried again once it had time to
        recover."""
        cutoff = time.monotonic() - window_s
        with self._lock:
            recent = [t for at, t in self._ttft if at >= cutoff]
        return statistics.median(recent) if recent else None


class Registry:
    """The served models in the order given (the first is the default when a request names
    none), and the optional fallback route."""

    def __init__(self, models: list[ServedModel], fallback: str | None = None,
                 fallback_ttft_s: float | None = None):
        if not models:
            raise ValueError("a server needs at least one model")
        names = [m.name for m in models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}")
        if fallback is not None and fallback not in names:
            raise ValueError(f"the fallback model '{fallback}' is not one of the served models {names}")
        self.models = {m.name: m for m in models}
        self.default = models[0]
        self.fallback = self.models[fallback] if fallback is not None else None
        self.fallback_ttft_s = fallback_ttft_s

    @staticmethod
    def aliases_of(name: str) -> set[str]:
        """Other names of a known model (its canonical name and aliases)."""
        spec = get_model_spec(name)
        return {spec.name, *spec.aliases} - {name} if spec else set()

    def __iter__(self):
        return iter(self.models.values())

    def __len__(self) -> int:
        return len(self.models)

    def lookup(self, name: str | None) -> ServedModel:
        """The model a request names (None: the default); 404 model_not_found otherwise.
        An exact id wins over another model's alias."""
        if name is None:
            return self.default
        if name in self.models:
            return self.models[name]
        for m in self.models.values():
            if name in m.aliases:
                return m
        served = ", ".join(f"'{n}'" for n in self.models)
        raise APIError(404, f"the model '{name}' does not exist here; this server serves {served} "
                            f"(GET /v1/models)", param="model", code="model_not_found")

    def route(self, served: ServedModel) -> list[tuple[ServedModel, str | None]]:
        """Where a request for `served` may go, in order, each with the fallback reason (None
        for the model asked for): the model itself then, should its queue be full, the
        fallback; while the model's recent TTFT is over the limit, the fallback first."""
        fb = self.fallback
        if fb is None or fb is served or fb.engine is None:
            return [(served, None)]
        if self.fallback_ttft_s is not None:
            ttft = served.recent_ttft()
            if ttft is not None and ttft > self.fallback_ttft_s:
                return [(fb, "ttft"), (served, None)]
        return [(served, None), (fb, "queue_full")]
