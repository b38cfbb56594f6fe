"""The token loop of one sequence: prefill, sample, decode, stream, stop."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

import numpy as np

from .sampling import SamplingParams
from .tokenizer import StreamDecoder

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Engine


@dataclass
class GenerationStats:
    """Timings as defined in shared/design.md (TTFT includes waiting for a slot)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0          # prompt tokens reused from the slot (prefix reuse)
    ttft_s: float = 0.0             # call -> first token out
    tpot_s: float = 0.0             # mean time between output tokens after the first
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return 1.0 / self.tpot_s if self.tpot_s > 0 else 0.0


@dataclass
class Completion:
    text: str
    tokens: list[int]
    finish_reason: str              # "stop" (EOS or stop string) | "length"
    stats: GenerationStats = field(default_factory=GenerationStats)


class Generation:
    """Iterates over text pieces; `tokens`, `finish_reason` and `stats` fill in as it goes.

    Holds one KV slot from creation until exhausted or closed.
    """

    def __init__(self, engine: "Engine", prompt_ids: list[int], params: SamplingParams):
        self._engine = engine
        self.prompt_ids = prompt_ids
        self.params = params
        self.tokens: list[int] = []
        self.finish_reason: str | None = None
        self.stats = GenerationStats(prompt_tokens=len(prompt_ids))
        self._t0 = time.perf_counter()
        self._iter = self._run()

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        return next(self._iter)

    def close(self) -> None:
        self._iter.close()

    def result(self) -> Completion:
        """Runs to the end and returns the whole completion."""
        text = "".join(self)
        return Completion(text=text, tokens=list(self.tokens), finish_reason=self.finish_reason or "stop",
                          stats=self.stats)

    def _run(self) -> Iterator[str]:
        eng, p = self._engine, self.params
        sampler = p.make_sampler()
        stops = p.stop_matcher()
        decoder = StreamDecoder(eng.tokenizer)
        eog = set() if p.ignore_eos else eng.tokenizer.eog_ids
        history = list(self.prompt_ids)
        limit = p.max_tokens
        with eng._slot_for(self.prompt_ids) as slot:
            t_prefill = time.perf_counter()
            logits, cached = eng._prefill(slot, self.prompt_ids)
            self.stats.cached_tokens = cached
            t_last = time.perf_counter()
            self.stats.prefill_s = t_last - t_prefill
            t_first = None
            while True:
                if limit is not None and len(self.tokens) >= limit:
                    self.finish_reason = "length"
                    break
                tok = sampler(logits, history)
                if tok in eog:
                    self.finish_reason = "stop"
                    break
                self.tokens.append(tok)
                history.append(tok)
                now = time.perf_counter()
                if t_first is None:
                    t_first = now
                    self.stats.ttft_s = now - self._t0
                self.stats.completion_tokens = len(self.tokens)
                piece, stopped = stops.feed(decoder.push(tok))
                if piece:
                    yield piece
                if stopped:
                    self.finish_reason = "stop"
                    break
                if limit is not None and len(self.tokens) >= limit:
                    self.finish_reason = "length"
                    break
                if not eng._has_room(slot):
                    self.finish_reason = "length"
                    break
                logits = eng._decode(slot, tok)
            if not stops.stopped:
                tail, _ = stops.feed(decoder.flush())
                tail += stops.flush()
                if tail:
                    yield tail
            t_end = time.perf_counter()
            n = len(self.tokens)
            if t_first is not None:
                self.stats.decode_s = t_end - t_first
                self.stats.tpot_s = (t_end - t_first) / (n - 1) if n > 1 else 0.0
            else:
                self.stats.ttft_s = t_end - self._t0
