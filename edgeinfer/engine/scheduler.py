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

Speculative decoding (speculative.py): a decoding sequence may feed its next token followed
by k proposed tokens and get all k + 1 rows of logits back; it samples them in order as
plain decoding would, keeps the proposals its samples confirm and rolls the ring back past
the first mismatch (_verify). The token and its drafts are one chunk the ring can take and undo
(KVRing.max_chunk): on a ring that has slid, the cells a rollback gives back held positions no
later token sees (kv.py, the slack), so a rollback never has to restore a cell.
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
from .generation import DoneEvent, ErrorEvent, SequenceState, TextStream
from .kv import KVRing
from .runner import Runner
from .sampling import SamplingParams
from .speculative import DraftModel, PromptLookup, SlotSpec, SpecPolicy, check_mode

if TYPE_CHECKING:  # pragma: no cover
    from ..text.tokenizer import Tokenizer

log = logging.getLogger("edgeinfer")

Sink = Callable[[list], None]
_DEFAULT = object()     # submit(speculative=...) not given: the scheduler's default


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
        self.spec: SlotSpec | None = None   # set when the request speculates
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
                 max_batch: int | None = None, idle_exit_s: float = 2.0, draft: DraftModel | None = None,
                 speculative: str | None = None, spec_max_slots: int = 2, spec_max_k: int = 8,
                 draft_cost_ratio: float = 1.0):
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
        self.draft = draft
        self.lookup = PromptLookup()
        self.speculative = check_mode(speculative)     # the default of submit()
        if speculative == "draft" and draft is None:
            raise ValueError("speculative='draft' needs a draft model (load(..., draft=PATH))")
        self.policy = SpecPolicy(max_k=spec_max_k, max_slots=spec_max_slots, draft_ratio=draft_cost_ratio)
        self.spec_proposed = 0      # totals over every request, for /metrics
        self.spec_accepted = 0
        self.spec_steps = 0

    # ------------------------------------------------------------------ public
    def submit(self, prompt_ids: list[int], params: SamplingParams, sink: Sink,
               n_logprobs: int | None = None, t_arrival: float | None = None,
               speculative: str | None | object = _DEFAULT) -> Request:
        """Queues a sequence; events reach `sink(list_of_events)` from the delivery thread.
        `speculative`: None, "lookup" or "draft" (default: the scheduler's `speculative`).

        Raises QueueFullError when `max_queue` requests already wait for a slot, and
        SchedulerClosedError while draining or after close."""
        mode = check_mode(self.speculative if speculative is _DEFAULT else speculative)  # type: ignore[arg-type]
        if mode == "draft" and self.draft is None:
            raise ValueError("speculative='draft' needs a draft model (load(..., draft=PATH))")
        seq = SequenceState(self.tokenizer, list(prompt_ids), params, n_logprobs, t_arrival)
        req = Request(self, seq, sink)
        req.spec = self.policy.new_slot(mode) if mode else None
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
            "kv_cells_total": ring.cells * ring.n_slots,
            "steps": self.steps,
            "spec_proposed": self.spec_proposed,
            "spec_accepted": self.spec_accepted,
            "spec_steps": self.spec_steps,
            "spec_mean_k": self.spec_proposed / self.spec_steps if self.spec_steps else 0.0,
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
                    keep = ring.truncate(slot, keep)
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

    def _proposals(self, reqs: list[Request]) -> dict[int, list[int]]:
        """Draft tokens per request id for this step ({} when none speculates): k from the
        policy, bounded by the batch, the room before the slot's first overwrite and max_tokens."""
        decoding = [r for r in reqs if not r.prefilling]
        # a grammar's mask follows the sampled tokens one at a time: constrained rows decode plainly
        spec = [r for r in decoding if r.spec is not None and not r.cancelled and r.seq.constraint is None]
        if not spec:
            return {}
        if len(decoding) > self.policy.max_slots:
            for r in spec:
                r.spec.k = 0
            return {}
        ring = self.ring
        n_batch = len(decoding)
        budget = self.max_batch - n_batch
        out: dict[int, list[int]] = {}
        for r in spec:
            seq = r.seq
            k_limit = min(budget, ring.max_chunk(r.slot) - 1)   # the token and its drafts in one chunk
            if seq.limit is not None:
                k_limit = min(k_limit, seq.limit - len(seq.tokens) - 1)
            drafted = r.spec.mode == "draft"
            lag = self.draft.lag(r.slot, seq.history) if drafted else 0
            k = self.policy.choose_k(r.spec, n_batch, len(decoding) - 1, k_limit, drafted, lag)
            r.spec.k = k
            if k <= 0:
                continue
            if drafted:
                t0 = time.perf_counter()
                try:
                    drafts = self.draft.propose(r.slot, seq.history, k)
                except Exception:   # the draft model only proposes: the request goes on without it
                    log.exception("draft model failed; request %d decodes plainly", r.id)
                    with contextlib.suppress(Exception):
                        self.draft.reset_slot(r.slot)
                    r.spec.off_steps = 1 << 30
                    continue
                self.policy.costs.observe_draft(len(drafts), time.perf_counter() - t0)
            else:
                drafts = self.lookup.propose(seq.history, k)
            if drafts:
                out[r.id] = drafts
                n_batch += len(drafts)
                budget -= len(drafts)
        return out

    def _step(self, reqs: list[Request]) -> None:
        ring = self.ring
        proposals = self._proposals(reqs)
        toks: list[int] = []
        slots: list[int] = []
        pos_parts: list[np.ndarray] = []
        cell_parts: list[np.ndarray] = []
        out_rows: list[int] = []
        owners: list[Request] = []
        drafts_of: list[list[int]] = []     # per owner: the proposals its rows verify
        prefilled: list[Request] = []       # draft-mode requests whose prompt is now in
        budget = self.max_batch
        with self.runner.lock:
            # Decode tokens first: every running sequence advances each step.
            for r in reqs:
                if not r.prefilling:
                    drafts = proposals.get(r.id, [])
                    feed = [r.next_token] + drafts
                    p, c = ring.reserve(r.slot, feed)
                    out_rows.extend(range(len(toks), len(toks) + len(feed)))
                    toks.extend(feed)
                    slots.extend([r.slot] * len(feed))
                    pos_parts.append(p)
                    cell_parts.append(c)
                    owners.append(r)
                    drafts_of.append(drafts)
                    budget -= len(feed)
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
                    drafts_of.append([])
                    if r.spec is not None and r.spec.mode == "draft":
                        prefilled.append(r)
            if not toks:
                return
            n_out = len(out_rows)
            if n_out > len(self._logits):
                self._logits = np.empty((n_out, self.n_vocab), dtype=np.float32)
            batch = Batch(toks, slots, np.concatenate(pos_parts), np.concatenate(cell_parts), out_rows)
            k = self._device_top_k(owners)
            masks = MaskJob.start(r.seq.constraint for r in owners)   # overlaps the forward
            t0 = time.perf_counter()
            try:
                out = self.runner.run(batch, self._logits[:n_out], top_k=k)
            finally:
                masks.wait()
            self.policy.costs.observe_step(len(toks), time.perf_counter() - t0)
            self.steps += 1
            self.last_batch_tokens = len(toks)
        for r in prefilled:     # the draft model's prefill goes with the model's (TTFT, not decode)
            self._draft_prefill(r)
        finished: list[Request] = []
        out_events: list[tuple[Request, list]] = []
        row = 0
        for r, drafts in zip(owners, drafts_of):
            row0, row = row, row + 1 + len(drafts)
            if r.cancelled:
                continue        # reaped (and its slot freed) at the top of the next step
            if drafts:
                events, nxt = self._verify(r, out, row0, drafts, k)
            else:
                room = ring.room(r.slot)
                events, nxt = self._sample(r, out, row0, k, room is None or room > 0)
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

    def _draft_prefill(self, r: Request) -> None:
        """Feeds the prompt to the draft model's slot if drafting may pay for this request;
        otherwise the request decodes plainly to its end (catching up later would cost a
        whole prefill)."""
        try:
            if self.policy.draft_pays(r.spec) and self.draft.catch_up(r.slot, r.seq.prompt_ids):
                return
        except Exception:   # the draft model only proposes: the request goes on without it
            log.exception("draft model failed; request %d decodes plainly", r.id)
            with contextlib.suppress(Exception):
                self.draft.reset_slot(r.slot)
        r.spec = None

    def _sample(self, r: Request, out, row: int, k: int | None, has_room: bool) -> tuple[list, int | None]:
        """One token of `r` from logits row `row` (or its device top-k candidates)."""
        if k is None:
            return r.seq.on_logits(out.logits[row], has_room)
        return r.seq.on_candidates(out.top_ids[row], out.top_vals[row], has_room)

    def _verify(self, r: Request, out, row0: int, drafts: list[int], k: int | None) -> tuple[list, int | None]:
        """Samples rows row0.. (the slot's token, then its drafts) in order while the samples
        confirm the drafts; rolls the ring back past the last confirmed draft."""
        ring, seq, spec = self.ring, r.seq, r.spec
        st = ring.slots[r.slot]
        p0 = st.n_past - len(drafts) - 1            # position of the token fed before the drafts
        events: list = []
        n_acc = 0
        nxt: int | None = None
        for i in range(len(drafts) + 1):
            room = ring.room(r.slot)
            has_room = room is None or ring.capacity - (p0 + i + 1) > 0
            n_before = len(seq.tokens)
            evs, nxt = self._sample(r, out, row0 + i, k, has_room)
            events.extend(evs)
            confirmed = i < len(drafts) and len(seq.tokens) > n_before and seq.tokens[-1] == drafts[i]
            n_acc += confirmed
            if nxt is None or not confirmed:
                break
        keep = p0 + 1 + n_acc                       # cells [0, keep) hold the sequence as sampled
        if keep < st.n_past:
            with self.runner.lock:
                kept = ring.truncate(r.slot, keep)
                assert kept == keep, (kept, keep)   # drafts never exceed the chunk a rollback can undo
                self.runner.forget_from(r.slot, keep)
        self.policy.record(spec, len(drafts), n_acc)
        self.spec_proposed += len(drafts)
        self.spec_accepted += n_acc
        self.spec_steps += 1
        self._spec_stats(seq.stats, spec)
        for ev in events:       # a DoneEvent carries a copy of the stats taken before the count
            if isinstance(ev, DoneEvent):
                self._spec_stats(ev.stats, spec)
        return events, nxt

    @staticmethod
    def _spec_stats(stats, spec: SlotSpec) -> None:
        stats.spec_proposed = spec.proposed
        stats.spec_accepted = spec.accepted
        stats.spec_k = spec.proposed / spec.steps if spec.steps else 0.0
