"""One submitted sequence as the engine loop tracks it, and the errors of submitting one."""
from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import EdgeInferError
from .generation import SequenceState, TextStream

if TYPE_CHECKING:  # pragma: no cover
    from ..text.tokenizer import Tokenizer
    from .speculative import SlotSpec

log = logging.getLogger("edgeinfer")

Sink = Callable[[list], None]


class QueueFullError(EdgeInferError):
    """The waiting queue is at its bound: the request is refused at once (HTTP 429)."""

    def __init__(self, message: str, retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SchedulerClosedError(EdgeInferError):
    """The scheduler is draining or closed and admits no new requests (HTTP 503)."""


class Request:
    """One submitted sequence. `cancel()` is safe from any thread; `wake` tells the engine
    loop to look at it."""

    _ids = itertools.count(1)

    def __init__(self, tokenizer: Tokenizer, seq: SequenceState, sink: Sink, wake: Callable[[], None]):
        self.id = next(self._ids)
        self.seq = seq
        self.sink = sink
        self.text = TextStream(tokenizer, seq, on_stop=self.cancel)
        self.slot: int | None = None
        self.n_fed = 0                  # prompt tokens already in the slot (reused or fed)
        self.next_token: int | None = None
        self.spec: SlotSpec | None = None   # set when the request speculates
        self.adapters: tuple[tuple[str, float], ...] = ()   # LoRA adapters (name, scale); (): the base
        self.cancelled = False
        self.done = False
        self._wake = wake

    @property
    def prefilling(self) -> bool:
        return self.n_fed < len(self.seq.prompt_ids)

    def cancel(self) -> None:
        if not self.done and not self.cancelled:
            self.cancelled = True
            self._wake()

    def deliver(self, events: list) -> None:
        """(delivery thread) Detokenizes the stepping thread's events and hands them to the sink."""
        out = self.text.feed(events)
        if not out:
            return
        try:
            self.sink(out)
        except Exception:  # a consumer that went away: drop its request, keep delivering the others
            log.debug("sink of request %d failed", self.id, exc_info=True)
            self.cancel()
