"""A streamed chat reply cut into the parts a typed stream sends (Anthropic's content blocks,
the Responses API's output items): thinking text, answer text and tool calls, each given once it
is final."""
from __future__ import annotations

from typing import Any

from ..engine import DoneEvent, TokenEvent

__all__ = ["StreamParts"]

_CALL_START = "{<[`"      # a reply starting with one of these may be a bare JSON call: held until it ends


class StreamParts:
    """With a tool plan in a format with call markers, the text goes up to each call block and
    the block's calls follow once it closes (CallScanner, as `plan.parts` splits a whole
    answer); with a bare JSON call, text that may be a call is held until the reply ends and is
    parsed."""

    def __init__(self, plan):
        self.plan = plan
        self.scanner = plan.scanner() if plan is not None else None
        self.held: list[str] | None = [] if plan is not None and self.scanner is None else None
        self.n_calls = 0

    def feed(self, ev: TokenEvent | DoneEvent) -> list[tuple[str, Any]]:
        """("thinking", str), ("text", str) and ("call", dict) parts, in order; none empty."""
        out: list[tuple[str, Any]] = [("thinking", ev.reasoning)] if ev.reasoning else []
        final = isinstance(ev, DoneEvent)
        if self.scanner is not None:
            out += [(kind, part) for kind, part in self.scanner.feed_parts(ev.text, final) if part]
            self.n_calls = self.scanner.n_calls
        elif self.held is not None:
            self.held.append(ev.text)
            start = "".join(self.held).lstrip()
            if start and start[0] not in _CALL_START:
                out.append(("text", "".join(self.held)))
                self.held = None
        elif ev.text:
            out.append(("text", ev.text))
        if final and self.held is not None:
            text, self.held = "".join(self.held), None
            calls = self.plan.parse(text)
            if calls:
                out += [("call", c) for c in calls]
                self.n_calls += len(calls)
            elif text:
                out.append(("text", text))
        return out
