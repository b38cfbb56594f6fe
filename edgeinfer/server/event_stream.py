"""The typed event streams of a chat reply (Anthropic's content blocks, the Responses API's
output items, Ollama's lines): the reply cut into thinking text, answer text and tool calls,
each given once it is final, and the streamed reply that relays them."""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Callable

from aiohttp import web

from ..engine import DoneEvent, ErrorEvent, TokenEvent

__all__ = ["StreamParts", "call_arguments", "collect", "relay"]

log = logging.getLogger("edgeinfer.server")

_CALL_START = "{<[`"      # a reply starting with one of these may be a bare JSON call: held until it ends


def call_arguments(call: dict) -> dict | None:
    """A call's arguments as an object, for the APIs that give them as one; None where they are
    not one: max_tokens cut the call (OpenAI's routes give such arguments as the text they are)."""
    try:
        args = json.loads(call["function"]["arguments"])
    except ValueError:
        return None
    return args if isinstance(args, dict) else None


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


async def relay(request: web.Request, queue: asyncio.Queue, first: bytes,
                on_event: Callable[[Any], tuple[list[bytes], bool]],
                content_type: str = "text/event-stream") -> web.StreamResponse:
    """A streamed reply (server-sent events, or Ollama's JSON lines): `first`, then the events
    `on_event` makes of each engine event of `queue`, written a batch at a time, until it says
    the reply is finished."""
    resp = web.StreamResponse(headers={"Content-Type": f"{content_type}; charset=utf-8",
                                       "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    try:
        await resp.write(first)
        finished = False
        while not finished:
            _, events = await queue.get()
            out: list[bytes] = []
            for ev in events:
                sent, finished = _guarded(on_event, ev)
                out += sent
                if finished:
                    break
            if out:
                await resp.write(b"".join(out))
        await resp.write_eof()
    except (ConnectionResetError, ConnectionError):
        log.debug("client went away during a stream")   # the caller cancels the request
    return resp


def _guarded(on_event: Callable[[Any], tuple[list[bytes], bool]], ev) -> tuple[list[bytes], bool]:
    """on_event(ev); a bug there ends the stream with the route's error event (and a bug in that,
    with none), never with a second reply written into this one's body."""
    try:
        return on_event(ev)
    except Exception as e:
        log.exception("a stream's event failed")
        return ([], True) if isinstance(ev, ErrorEvent) else _guarded(on_event, ErrorEvent(e))


async def collect(queue: asyncio.Queue, ctx, fail: Callable[[ErrorEvent], Exception],
                  seen: Callable[[TokenEvent | DoneEvent], None] | None = None) -> tuple[str, str, DoneEvent]:
    """A reply that is not streamed, whole: its answer text, its thinking text and its end;
    `seen` is shown each token and the end as they come. An engine error raises fail(error)."""
    text, thinking = [], []
    done: DoneEvent | None = None
    while done is None:
        _, events = await queue.get()
        for ev in events:
            if isinstance(ev, ErrorEvent):
                raise fail(ev)
            text.append(ev.text)
            thinking.append(ev.reasoning)
            if seen is not None:
                seen(ev)
            if isinstance(ev, DoneEvent):
                ctx.done(ev)
                done = ev
    return "".join(text), "".join(thinking), done
