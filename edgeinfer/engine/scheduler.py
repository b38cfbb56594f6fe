"""Continuous batching over the fixed KV ring: one engine loop, one native forward per step.

Each step builds ONE batch: the next token of every decoding sequence plus prefill chunks of
admitted prompts (at most `max_batch` tokens in all), hands it to the Runner (runner.py),
samples every sequence that got a row of logits and hands the resulting token ids to the
delivery thread (delivery.py), which detokenizes them and calls each request's sink. A
finished or cancelled sequence frees its slot at once; the oldest waiting request takes a
free slot at the start of the next step, choosing the slot that already holds the longest
prefix of its prompt (prefix reuse).

The scheduler owns the KV ring's bookkeeping (kv.py): which slot holds which tokens, and
the positions and cells of every token it puts in a batch.

The kernels compute every token row the same way whatever else is in the batch, so a
sequence's output does not depend on its neighbours or on how its prompt was chunked.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np

from ..backends.base import Batch
from ..errors import EdgeInferError
from .constraint import MaskJob
from .delivery import Delivery
from .generation import ErrorEvent, SequenceState, TextStream
from .kv import KVRing
from .runner import Runner
from .sampling import SamplingParams

if TYPE_CHECKING:  # pragma: no cover
    from ..text.tokenizer import Tokenizer

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
    """One submitted sequence. `cancel()` is safe from any thread."""

    _ids = itertools.count(1)

    def __init__(self, scheduler: "Scheduler", seq: SequenceState, sink: Sink):
        self.id = next(self._ids)
        self.seq = seq
        self.sink = sink
        self.text = TextStream(scheduler.tokenizer, seq, on_stop=self.cancel)
        self.slot: int | None = None
        self.n_fed = 0                  # prompt tokens already in the slot (reused or fed)
        self.next_token: int | None = None
        self.cancelled = False
        self.done = False
        self._scheduler = scheduler

    @property
    def prefilling(self) -> bool:
        return self.n_fed < len(self.seq.prompt_ids)

    def cancel(self) -> None:
        if not self.done and not self.cancelled:
            self.cancelled = True
            self._scheduler._wake()

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


class Lease:
    """A slot taken away from the scheduler (Scheduler.lease_slot) for direct teacher-forced
    stepping: Engine.logits and tools/bench.py. The slot starts and ends empty."""

    def __init__(self, scheduler: "Scheduler", slot: int):
        self.slot = slot
        self._ring = scheduler.ring
        self._runner = scheduler.runner

    def reset(self) -> None:
        with self._runner.lock:
            self._ring.truncate(self.slot, 0)
            self._runner.clear_slot(self.slot)

    def feed(self, tokens: Sequence[int], out_rows: np.ndarray, logits: np.ndarray | None = None) -> np.ndarray:
        """Appends `tokens` (at most caps.max_batch) to the slot; the logits of `out_rows`."""
        with self._runner.lock:
            pos, cells = self._ring.reserve(self.slot, tokens)
            return self._runner.run(Batch.of_slot(self.slot, tokens, pos, cells, out_rows), logits).logits


class Scheduler:
    """The engine loop of one Engine. Started lazily; the thread exits after `idle_exit_s`
    without work (and restarts on the next submit), so unused engines can be collected."""

    def __init__(self, runner: Runner, ring: KVRing, tokenizer: "Tokenizer", max_queue: int = 256,
                 max_batch: int | None = None, idle_exit_s: float = 2.0):
        self.runner = runner
        self.ring = ring
        self.tokenizer = tokenizer
        self.n_vocab = runner.caps.n_vocab
        self.n_slots = ring.n_slots
        self.max_queue = max_queue
        limit = runner.caps.max_batch
        self.max_batch = max(self.n_slots, min(max_batch or limit, limit))
        self.idle_exit_s = idle_exit_s
        self._delivery = Delivery(idle_exit_s)
        self._cv = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._active: list[Request] = []
        self._free: list[int] = list(range(self.n_slots))     # least recently used first
        self._leased: set[int] = set()
        self._lease_waiters = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        self._draining = False
        self.failed: BaseException | None = None
        self.steps = 0
        self.last_batch_tokens = 0
        self._logits = np.empty((self.n_slots, self.n_vocab), dtype=np.float32)

    # ------------------------------------------------------------------ public
    def submit(self, prompt_ids: list[int], params: SamplingParams, sink: Sink,
               n_logprobs: int | None = None, t_arrival: float | None = None) -> Request:
        """Queues a sequence; events reach `sink(list_of_events)` from the delivery thread.

        Raises QueueFullError when `max_queue` requests already wait for a slot, and
        SchedulerClosedError while draining or after close."""
        seq = SequenceState(self.tokenizer, list(prompt_ids), params, n_logprobs, t_arrival)
        req = Request(self, seq, sink)
        with self._cv:
            if self._closed or self._draining:
                raise SchedulerClosedError("the engine is shutting down and admits no new requests")
            if self.failed is not None:
                raise SchedulerClosedError(f"the engine has failed: {self.failed}")
            if seq.wants_no_tokens():
                req.done = True
                sink([seq.finish("length")])
                return req
            # Requests about to take a free slot (at the next step), or cancelled, are not "waiting".
            n_waiting = sum(not r.cancelled for r in self._waiting)
            if n_waiting - len(self._free) >= self.max_queue:
                raise QueueFullError(f"the queue is full ({n_waiting} requests waiting for "
                                     f"{self.n_slots} slots)", retry_after_s=self._retry_after())
            self._waiting.append(req)
            self._ensure_thread()
            self._cv.notify_all()
        return req

    @contextlib.contextmanager
    def lease_slot(self) -> Iterator[Lease]:
        """Takes a free slot away from the scheduler for direct use (Engine.logits, bench),
        emptied on the way in and out."""
        with self._cv:
            self._lease_waiters += 1
            try:
                while not self._free:
                    self._cv.wait()
            finally:
                self._lease_waiters -= 1
            slot = self._free.pop(0)
            self._leased.add(slot)
        lease = Lease(self, slot)
        try:
            lease.reset()
            yield lease
        finally:
            with contextlib.suppress(Exception):   # a failed native call must still return the slot
                lease.reset()
            with self._cv:
                self._leased.discard(slot)
                self._free.append(slot)
                self._cv.notify_all()

    def snapshot(self) -> dict:
        """Gauges for /metrics and health."""
        with self._cv:
            active = list(self._active)
            waiting = len(self._waiting)
        ring = self.ring
        return {
            "slots_total": self.n_slots,
            "slots_busy": len(active) + len(self._leased),
            "queue_length": waiting,
            "max_queue": self.max_queue,
            "kv_cells_used": sum(ring.cells_used(r.slot) for r in active if r.slot is not None),
            "kv_cells_total": ring.capacity * ring.n_slots,
            "steps": self.steps,
        }

    def in_flight(self) -> int:
        with self._cv:
            return len(self._active) + len(self._waiting)

    def drain(self, timeout_s: float | None = None) -> bool:
        """Stops admitting; waits for in-flight requests (up to timeout). True if all finished."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cv:
            self._draining = True
            while self._active or self._waiting:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(timeout=left if left is None else min(left, 0.1))
        return True

    def close(self) -> None:
        """Cancels everything, stops the loop thread."""
        with self._cv:
            self._closed = True
            for r in list(self._waiting) + list(self._active):
                r.cancelled = True
            self._cv.notify_all()
            t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=30)
        # Anything the loop did not get to (thread never started) is finished here.
        with self._cv:
            left = list(self._waiting) + list(self._active)
            self._waiting.clear()
            self._active.clear()
        for r in left:
            self._finish(r, "cancelled")
        self._delivery.close()

    # ------------------------------------------------------------------ loop
    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def _retry_after(self) -> float:
        return 1.0

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="edgeinfer-engine", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cv:
                idle_since = time.monotonic()
                while not (self._active or self._waiting):
                    if self._closed:
                        self._thread = None
                        return
                    left = self.idle_exit_s - (time.monotonic() - idle_since)
                    if left <= 0:
                        self._thread = None
                        return
                    self._cv.wait(timeout=left)
                finished = self._reap_cancelled()
                self._admit()
                batch_reqs = list(self._active)
            for r in finished:
                self._finish(r, "cancelled")
            if batch_reqs:
                try:
                    self._step(batch_reqs)
                except BaseException as exc:  # a native failure ends the sequences in the batch
                    log.exception("engine step failed")
                    self._fail(batch_reqs, exc)
            with self._cv:
                self._cv.notify_all()   # drain() and lease_slot() waiters

    def _reap_cancelled(self) -> list[Request]:
        """(under lock) Removes cancelled requests, frees their slots."""
        out = []
        if any(r.cancelled for r in self._waiting):
            keep = deque()
            for r in self._waiting:
                (out if r.cancelled else keep).append(r)
            self._waiting = keep
        for r in [r for r in self._active if r.cancelled]:
            self._active.remove(r)
            self._release(r)
            out.append(r)
        return out

    def _admit(self) -> None:
        """(under lock) Gives free slots to waiting requests, oldest first, longest prefix."""
        ring = self.ring
        while self._waiting and self._free and not self._closed:
            if self._lease_waiters and len(self._free) <= self._lease_waiters:
                break   # let a leaseholder (Engine.logits) have a slot
            req = self._waiting.popleft()
            ids = req.seq.prompt_ids
            best, best_n = 0, -1
            for i, s in enumerate(self._free):
                n = ring.common_prefix(s, ids)
                if n > best_n:
                    best, best_n = i, n
            slot = self._free.pop(best)
            keep = min(best_n, len(ids) - 1)
            src, shared = self._running_prefix(ids)
            with self.runner.lock:
                if shared > keep and self.runner.copy_prefix(src, slot, shared):
                    ring.copy_prefix(src, slot, shared)   # a sibling's prompt: copied, not recomputed
                    keep = shared
                else:
                    ring.truncate(slot, keep)
                    self.runner.forget_from(slot, keep)
            req.slot = slot
            req.n_fed = keep
            req.seq.admitted(keep)
            self._active.append(req)

    def _running_prefix(self, ids: list[int]) -> tuple[int, int]:
        """(under lock) The running slot holding the longest prefix of `ids` already computed
        (n > 1 siblings: the first one's prompt), and how many of its cells a new slot may
        copy (never the last prompt token, whose logits are needed)."""
        best, best_n = -1, 0
        for r in self._active:
            if r.slot is not None:
                n = min(self.ring.common_prefix(r.slot, ids), r.n_fed, len(ids) - 1)
                if n > best_n:
                    best, best_n = r.slot, n
        return best, best_n

    def _release(self, req: Request) -> None:
        """(under lock) Returns the request's slot to the free list (its cells stay for reuse)."""
        if req.slot is not None:
            self._free.append(req.slot)
            req.slot = None

    def _finish(self, req: Request, reason: str) -> None:
        if req.done:
            return
        req.done = True
        self._emit(req, [req.seq.finish(reason)])

    def _emit(self, req: Request, events: list) -> None:
        self._delivery.put(lambda: req.deliver(events))

    def _fail(self, reqs: list[Request], exc: BaseException) -> None:
        with self._cv:
            for r in reqs:
                if r in self._active:
                    self._active.remove(r)
                    if r.slot is not None:
                        self.ring.truncate(r.slot, 0)
                        with contextlib.suppress(Exception):
                            self.runner.clear_slot(r.slot)
                    self._release(r)
        for r in reqs:
            if not r.done:
                r.done = True
                self._emit(r, [ErrorEvent(exc)])

    def _device_top_k(self, owners: list[Request]) -> int | None:
        """The k of one device top-k from which every owner of the step samples exactly
        (SequenceState.on_candidates), or None: download the logits rows (on_logits)."""
        limit = self.runner.caps.max_topk   # 0: the logits always come to the host (CPU)
        if not owners or not limit:
            return None
        ks = [r.seq.top_k_needed(self.n_vocab) for r in owners]
        if None in ks or max(ks) > limit:
            return None
        return max(ks)

    def _step(self, reqs: list[Request]) -> None:
        ring = self.ring
        toks: list[int] = []
        slots: list[int] = []
        pos_parts: list[np.ndarray] = []
        cell_parts: list[np.ndarray] = []
        out_rows: list[int] = []
        owners: list[Request] = []
        budget = self.max_batch
        with self.runner.lock:
            # Decode tokens first: every running sequence advances each step.
            for r in reqs:
                if not r.prefilling:
                    p, c = ring.reserve(r.slot, [r.next_token])
                    out_rows.append(len(toks))
                    toks.append(r.next_token)
                    slots.append(r.slot)
                    pos_parts.append(p)
                    cell_parts.append(c)
                    owners.append(r)
                    budget -= 1
            # Then prefill chunks with what is left of the budget.
            for r in reqs:
                if budget <= 0:
                    break
                if not r.prefilling:
                    continue
                ids = r.seq.prompt_ids
                rest = len(ids) - r.n_fed
                limit = ring.max_chunk(r.slot) or rest
                n = min(rest, budget, max(1, limit))
                chunk = ids[r.n_fed:r.n_fed + n]
                p, c = ring.reserve(r.slot, chunk)
                toks.extend(chunk)
                slots.extend([r.slot] * n)
                pos_parts.append(p)
                cell_parts.append(c)
                r.n_fed += n
                budget -= n
                if not r.prefilling:
                    out_rows.append(len(toks) - 1)
                    owners.append(r)
            if not toks:
                return
            n_out = len(out_rows)
            batch = Batch(toks, slots, np.concatenate(pos_parts), np.concatenate(cell_parts), out_rows)
            k = self._device_top_k(owners)
            masks = MaskJob.start(r.seq.constraint for r in owners)   # overlaps the forward
            try:
                out = self.runner.run(batch, self._logits[:n_out], top_k=k)
            finally:
                masks.wait()
            self.steps += 1
            self.last_batch_tokens = len(toks)
        finished: list[Request] = []
        out_events: list[tuple[Request, list]] = []
        for i, r in enumerate(owners):
            if r.cancelled:
                continue        # reaped (and its slot freed) at the top of the next step
            room = ring.room(r.slot)
            has_room = room is None or room > 0
            if k is None:
                events, nxt = r.seq.on_logits(out.logits[i], has_room)
            else:
                events, nxt = r.seq.on_candidates(out.top_ids[i], out.top_vals[i], has_room)
            r.next_token = nxt
            if nxt is None:
                r.done = True
                finished.append(r)
            out_events.append((r, events))
        if out_events:   # one hand-over per step
            self._delivery.put(lambda: [r.deliver(evs) for r, evs in out_events])
        if finished:
            with self._cv:
                for r in finished:
                    if r in self._active:
                        self._active.remove(r)
                        self._release(r)
