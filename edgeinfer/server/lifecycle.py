"""How a server leaves a fleet without losing a request, and what it tells a router.

On SIGTERM (a supervisor, `docker stop`, Kubernetes after its preStop hook) the server drains:
new requests get 503 with Retry-After, /ready answers 503 while /health stays 200, and the
requests already in flight run to their end, up to the drain timeout; then it closes and the
process exits 0. A router (LiteLLM, a Kubernetes Service) moves the 503'd requests to another
server. A second signal during the drain stops waiting (an operator's second Ctrl-C); what is
still running then gets aiohttp's shutdown grace (about two seconds) and is cut.
"""
from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

log = logging.getLogger("edgeinfer.server")

__all__ = ["drain", "free_slots", "install_signals"]


def free_slots(snapshot: dict, admitting: bool) -> int:
    """The slots a new request would get at once: none while the server does not admit
    (loading, draining, failed), so a router balancing by this number leaves it alone."""
    return snapshot["slots_total"] - snapshot["slots_busy"] if admitting else 0


def install_signals(loop: asyncio.AbstractEventLoop, stop: asyncio.Event, hurry: asyncio.Event) -> None:
    """SIGTERM / SIGINT set `stop` (drain); a second one sets `hurry` (stop waiting for the drain)."""
    def on_signal() -> None:
        (hurry if stop.is_set() else stop).set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, on_signal)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - not the main thread
            pass


async def drain(state, runner: web.AppRunner, timeout_s: float, close_engine: bool,
                hurry: asyncio.Event | None = None) -> None:
    """Stops admitting (`state.draining`: 503 to new requests, /ready 503); waits until no
    request is in flight, `timeout_s` passes or `hurry` is set; then closes the server, which
    cancels what is left (closing a connection cancels its handler, which cancels its sequences)."""
    state.draining = True
    loop = asyncio.get_running_loop()
    # ServerState.wait_until wakes on each change of in_flight or admitted (a thread: it blocks on a condition)
    idle = asyncio.ensure_future(loop.run_in_executor(None, state.wait_until,
                                                      lambda s: s.in_flight == 0 and s.admitted == 0, timeout_s))
    waits = [idle] + ([asyncio.ensure_future(hurry.wait())] if hurry is not None else [])
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for w in waits[1:]:
        w.cancel()
    if state.in_flight or state.admitted:
        log.warning("drain ended: cancelling %d request(s) still in flight", max(state.in_flight, state.admitted))
    await runner.cleanup()
    await idle                  # wakes once the cancelled handlers have let go
    state.tok_pool.shutdown(wait=False)
    if close_engine:
        for eng in state.engines().values():
            await loop.run_in_executor(None, eng.close)
