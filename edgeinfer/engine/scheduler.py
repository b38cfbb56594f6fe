"""Continuous batching over the fixed slots: one engine loop, one native forward per step.

Each step is planned, executed and processed in three parts (vLLM v1's split):
  Scheduler.schedule()      -> StepPlan (step.py): the next token of every decoding sequence
                               (and its speculative drafts), then prefill chunks of admitted
                               prompts, at most `max_batch` tokens in all;
  Runner.execute(plan)      -> StepOutput (runner.py): one forward, logits rows or device top-k;
  OutputProcessor.update()  -> events (output.py): sampling, constraints, speculative
                               verification and rollback.
The token ids go to the delivery thread (delivery.py), which detokenizes them and calls each
request's sink. A finished or cancelled sequence frees its slot at once; the oldest waiting
request takes a free slot at the start of the next step, choosing the slot that already holds
the longest prefix of its prompt (prefix reuse), or copying a running sibling's prompt.

The scheduler owns each slot's sequence state (states.py: the KV ring's bookkeeping, kv.py,
and any recurrent state): which slot holds which tokens, the positions and cells of every
token it puts in a batch, and which states the forward keeps for a later rollback or copy.

The kernels compute every token row the same way whatever else is in the batch, so a
sequence's output does not depend on its neighbours or on how its prompt was chunked.

Speculative decoding (speculative.py): the token and its drafts are one chunk the ring can take
and undo (KVRing.max_chunk): on a ring that has slid, the cells a rollback gives back held
positions no later token sees (kv.py, the slack), so a rollback never has to restore a cell.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from ..backends.base import NO_ROWS, Batch
from ..errors import EdgeInferError
from .adapters import AdapterBusyError, AdapterKey, Adapters
from .constraint import MaskJob
from .delivery import Delivery
from .draft import DraftModel
from .generation import ErrorEvent, SequenceState
from .kv import KVRing
from .output import OutputProcessor
from .prompt_cache import CacheFileError, PromptCache
from .request import QueueFullError, Request, SchedulerClosedError, Sink
from .runner import Runner
from .sampling import SamplingParams
from .speculative import MODEL_MODES, PromptLookup, SpecPolicy, check_mode, check_proposer
from .states import SequenceStates
from .step import StepPlan

__all__ = ["Lease", "QueueFullError", "Request", "Scheduler", "SchedulerClosedError", "SlotBusyError",
           "SlotFilesUnsupportedError"]

if TYPE_CHECKING:  # pragma: no cover
    from ..text.tokenizer import Tokenizer

log = logging.getLogger("edgeinfer")

class SlotBusyError(EdgeInferError):
    """A slot file action on a slot a request or a lease holds (HTTP 409)."""


class SlotFilesUnsupportedError(EdgeInferError):
    """Slot files without a prompt cache directory, or on a runtime that cannot save (HTTP 501)."""


_DEFAULT = object()     # submit(speculative=...) not given: the scheduler's default


class Lease:
    """A slot taken away from the scheduler (Scheduler.lease_slot) for direct teacher-forced
    stepping: Engine.logits, Engine.prompt_logprobs and tools/bench.py. The slot starts empty,
    and ends empty unless the lease keeps what it fed."""

    def __init__(self, states: SequenceStates, slot: int):
        self.slot = slot
        self._states = states
        self._ring = states.ring
        self._runner = states.runner

    def reset(self) -> None:
        with self._runner.lock:
            self._states.clear(self.slot)

    def resume(self, tokens: Sequence[int]) -> int:
        """Keeps the longest beginning of `tokens` the slot holds exactly and forgets the rest: the
        cells, the sliding window they need (the ring's check) and, on a hybrid, a recurrent state
        kept at that point; at most all but the last token, so that one is fed. How many it kept
        (0: feed `tokens` from the start)."""
        with self._runner.lock:
            n = min(self._ring.common_prefix(self.slot, list(tokens)), len(tokens) - 1)
            return self._states.rollback(self.slot, self._states.resume_point(self.slot, max(n, 0)))

    def feed(self, tokens: Sequence[int], out_rows: np.ndarray, logits: np.ndarray | None = None) -> np.ndarray:
        """Appends `tokens` (at most caps.max_batch) to the slot; the logits of `out_rows`."""
        with self._runner.lock:
            pos, cells = self._ring.reserve(self.slot, tokens)
            return self._runner.run(Batch.of_slot(self.slot, tokens, pos, cells, out_rows), logits).logits

    def feed_hidden(self, tokens: Sequence[int]) -> np.ndarray:
        """Appends `tokens` (at most caps.max_batch) to the slot; every row's final-normed hidden
        state [len(tokens), n_embd] (caps.embeddings)."""
        with self._runner.lock:
            pos, cells = self._ring.reserve(self.slot, tokens)
            rows = np.arange(len(tokens), dtype=np.int32)
            return self._runner.hidden(Batch.of_slot(self.slot, tokens, pos, cells, rows))


class Scheduler:
    """The engine loop of one Engine. Started lazily; the thread exits after `idle_exit_s`
    without work (and restarts on the next submit), so unused engines can be collected."""

    def __init__(self, runner: Runner, ring: KVRing, tokenizer: "Tokenizer", max_queue: int = 256,
                 max_batch: int | None = None, idle_exit_s: float = 2.0, draft: DraftModel | None = None,
                 speculative: str | None = None, spec_max_slots: int = 2, spec_max_k: int = 8,
                 draft_cost_ratio: float = 1.0, prompt_cache: PromptCache | None = None):
        self.runner = runner
        self.ring = ring
        self.states = SequenceStates(ring, runner)
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
        self.draft = draft
        self.lookup = PromptLookup()
        self.speculative = check_mode(speculative)     # the default of submit()
        check_proposer(speculative, draft)
        self.policy = SpecPolicy(max_k=spec_max_k, max_slots=spec_max_slots, draft_ratio=draft_cost_ratio)
        self.output = OutputProcessor(self.states, self.policy)
        self.adapters: Adapters | None = None        # the engine's LoRA adapters (engine.py sets them)
        self._slot_adapters: list[AdapterKey] = [()] * self.n_slots   # what each slot's cells were computed with
        self.prompt_cache = prompt_cache if self.states.can_save else None
        if prompt_cache is not None and self.prompt_cache is None:
            log.warning("prompt cache off: the %s runtime cannot save a slot's state", runner.caps.device)

    # ------------------------------------------------------------------ public
    def submit(self, prompt_ids: list[int], params: SamplingParams, sink: Sink,
               n_logprobs: int | None = None, t_arrival: float | None = None,
               speculative: str | None | object = _DEFAULT, adapters: AdapterKey = ()) -> Request:
        """Queues a sequence; events reach `sink(list_of_events)` from the delivery thread.
        `speculative`: None, "lookup", "draft" or "mtp" (default: the scheduler's `speculative`).
        `adapters`: the LoRA adapters it runs with (Adapters.resolve).

        Raises QueueFullError when `max_queue` requests already wait for a slot, and
        SchedulerClosedError while draining or after close."""
        mode = check_mode(self.speculative if speculative is _DEFAULT else speculative)  # type: ignore[arg-type]
        check_proposer(mode, self.draft)
        seq = SequenceState(self.tokenizer, list(prompt_ids), params, n_logprobs, t_arrival)
        req = Request(self.tokenizer, seq, sink, self._wake)
        req.spec = self.policy.new_slot(mode) if mode else None
        req.adapters = adapters
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
    def lease_slot(self, adapters: AdapterKey = (), keep: bool = False) -> Iterator[Lease]:
        """Takes a free slot away from the scheduler for direct use (Engine.logits, bench),
        emptied on the way in, running with `adapters`, and on the way out emptied too, or with
        `keep` given back holding what was fed: a free slot's prefix, which the next request of
        the same tokens and adapters reuses (a scored prompt, then its completion)."""
        with self._cv:
            self._lease_waiters += 1
            try:
                while not self._free:
                    self._cv.wait()
            finally:
                self._lease_waiters -= 1
            slot = self._free.pop(0)
            self._leased.add(slot)
            with self.runner.lock:
                self._attach(slot, adapters)
        lease = Lease(self.states, slot)
        try:
            lease.reset()
            yield lease
            kept = keep
        except BaseException:
            kept = False                           # a failed feed may have left the slot half written
            raise
        finally:
            if not kept:
                with contextlib.suppress(Exception):   # a failed native call must still return the slot
                    lease.reset()
            with self._cv:
                self._leased.discard(slot)
                self._free.append(slot)
                self._cv.notify_all()

    def forget_free_slots(self) -> None:
        """Empties every free slot: no later request reuses what they held."""
        with self._cv, self.runner.lock:
            for slot in self._free:
                self.states.clear(slot)

    def snapshot(self) -> dict:
        """Gauges for /metrics and health."""
        with self._cv:
            active = list(self._active)
            waiting = len(self._waiting)
        ring, out = self.ring, self.output
        return {
            "slots_total": self.n_slots,
            "slots_busy": len(active) + len(self._leased),
            "queue_length": waiting,
            "max_queue": self.max_queue,
            "kv_cells_used": sum(ring.cells_used(r.slot) for r in active if r.slot is not None),
            "kv_cells_total": ring.cells * ring.n_slots,
            "steps": self.steps,
            "spec_proposed": out.spec_proposed,
            "spec_accepted": out.spec_accepted,
            "spec_steps": out.spec_steps,
            "spec_mean_k": out.spec_proposed / out.spec_steps if out.spec_steps else 0.0,
        }

    # llama.cpp's slot save / restore / erase: a free slot's state to a named file of the prompt cache
    def save_slot(self, slot: int, name: str) -> tuple[int, int]:
        """Writes what the free slot holds to the file `name`; (positions saved, bytes written)."""
        cache = self._slot_files()
        with self._cv, self.runner.lock:
            self._check_free(slot)
            st = self.ring.slots[slot]
            payload = self.states.save(slot, st.n_past) if st.n_past else None
            if payload is None:
                raise CacheFileError(f"slot {slot} holds nothing that can be saved (empty or wrapped)")
            return st.n_past, cache.save_file(name, st.tokens, payload)

    def restore_slot(self, slot: int, name: str) -> tuple[int, int]:
        """The free slot holds what the file `name` saved; (positions restored, payload bytes read)."""
        entry = self._slot_files().load_file(name)
        if len(entry.tokens) >= self.ring.capacity:
            raise CacheFileError(f"slot file {name!r} holds {len(entry.tokens)} positions; the context is "
                                 f"{self.ring.capacity}")
        with self._cv, self.runner.lock:
            self._check_free(slot)
            self.states.load(slot, list(entry.tokens), entry.payload)
        return len(entry.tokens), len(entry.payload)

    def erase_slot(self, slot: int) -> int:
        """Empties the free slot; the positions it held."""
        with self._cv, self.runner.lock:
            self._check_free(slot)
            n = self.ring.slots[slot].n_past
            self.states.clear(slot)
        return n

    def _slot_files(self) -> PromptCache:
        if self.prompt_cache is None:
            raise SlotFilesUnsupportedError("slot files need a prompt cache directory (serve --prompt-cache DIR) "
                                            "on a runtime that can save a slot's state")
        return self.prompt_cache

    def _check_free(self, slot: int) -> None:
        """(under the lock) The slot exists and no request or lease holds it."""
        if not isinstance(slot, int) or not 0 <= slot < self.n_slots:
            raise CacheFileError(f"slot id {slot!r} is outside [0, {self.n_slots})")
        if slot not in self._free:
            raise SlotBusyError(f"slot {slot} is busy")

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
        while self._waiting and self._free and not self._closed:
            if self._lease_waiters and len(self._free) <= self._lease_waiters:
                break   # let a leaseholder (Engine.logits) have a slot
            req = self._waiting.popleft()
            try:
                self._admit_one(req)
            except Exception as exc:   # that request fails; the loop serves the others
                log.exception("admitting a request failed")
                if req.slot is not None:
                    with contextlib.suppress(Exception):
                        self.states.clear(req.slot)
                    self._release(req)
                req.done = True
                self._emit(req, [ErrorEvent(exc)])

    def _admit_one(self, req: Request) -> None:
        """(under lock) Gives the request the free slot holding the longest prefix of its prompt."""
        ring, states = self.ring, self.states
        ids = req.seq.prompt_ids
        best, best_n = 0, -1
        key = req.adapters
        for i, s in enumerate(self._free):
            if self._slot_adapters[s] != key:   # cells computed with other adapters: nothing to reuse
                n = 0
            else:
                n = ring.common_prefix(s, ids[:-1])   # the last prompt token is fed again
                if states.recurrent:    # only where a state was kept
                    n = states.resume_point(s, n)
            if n > best_n:
                best, best_n = i, n
        slot = req.slot = self._free.pop(best)
        keep = best_n
        src, shared = self._running_prefix(ids, key)
        with self.runner.lock:
            self._spill(slot, max(keep, shared))
            self._attach(slot, key)
            if shared > keep and states.copy_prefix(src, slot, shared):
                keep = shared       # a sibling's prompt: copied, not recomputed
            elif not key and (loaded := self._load_cached(slot, ids, keep)) is not None:
                keep = loaded       # a prefix from the prompt cache (RAM or disk)
            else:
                keep = states.rollback(slot, keep)
        req.n_fed = keep
        req.seq.admitted(keep)
        self._active.append(req)

    def _load_cached(self, slot: int, ids: list[int], keep: int) -> int | None:
        """(under both locks) Loads the prompt cache's longest prefix of the prompt into the slot
        when it is longer than the `keep` the slot or a sibling offers; how many positions the
        slot then holds, or None (the slot is untouched)."""
        cache = self.prompt_cache
        if cache is None:
            return None
        entry = cache.lookup(ids, len(ids) - 1)   # the last prompt token's logits are needed
        if entry is None or len(entry.tokens) <= keep:
            return None
        try:
            self.states.load(slot, list(entry.tokens), entry.payload)
        except EdgeInferError:
            log.warning("prompt cache: a prefix of %d tokens did not load; computing it", len(entry.tokens),
                        exc_info=True)
            self.states.clear(slot)
            return 0
        return len(entry.tokens)

    def _spill(self, slot: int, keep: int) -> None:
        """(under both locks) Before the slot forgets what it holds past `keep`, the prompt
        cache's RAM tier keeps it (a conversation that comes back later resumes from there)."""
        cache, st = self.prompt_cache, self.ring.slots[slot]
        if cache is None or self._slot_adapters[slot] or st.n_past <= keep or st.n_past < cache.min_tokens or st.wrapped:
            return
        if cache.holds(st.tokens):
            return
        payload = self.states.save(slot, st.n_past)
        if payload is not None:
            cache.remember(st.tokens, payload)

    def _store_prompts(self, reqs: list[Request]) -> None:
        """(under the runner's lock) Each prompt that has just been prefilled goes to the prompt
        cache, but for its last token (whose logits a later request needs computed)."""
        cache = self.prompt_cache
        for r in reqs:
            ids = r.seq.prompt_ids
            n = len(ids) - 1
            if n < cache.min_tokens or r.slot is None or r.adapters or cache.holds(ids[:n]):
                continue
            payload = self.states.save(r.slot, n)
            if payload is not None:
                cache.store(ids[:n], payload)

    def _running_prefix(self, ids: list[int], key: AdapterKey) -> tuple[int, int]:
        """(under lock) The running slot holding the longest prefix of `ids` already computed
        with the adapters `key` (n > 1 siblings: the first one's prompt), and how many of its
        cells a new slot may copy (never the last prompt token, whose logits are needed)."""
        best, best_n = -1, 0
        for r in self._active:
            if r.slot is not None and r.adapters == key:
                n = min(self.ring.common_prefix(r.slot, ids), r.n_fed, len(ids) - 1)
                if self.states.recurrent:
                    n = self.states.resume_point(r.slot, n)
                if n > best_n:
                    best, best_n = r.slot, n
        return best, best_n

    def _attach(self, slot: int, key: AdapterKey) -> None:
        """(under the runner's lock) The slot runs with adapters `key` from now on; what it holds was
        computed with others, so it is forgotten."""
        if self._slot_adapters[slot] == key:
            return
        self.states.clear(slot)
        self.runner.runtime.set_slot_adapters(slot, self.adapters.handles(key) if key else [])
        self._slot_adapters[slot] = key

    def unload_adapter(self, name: str) -> None:
        """Detaches the adapter from every slot and forgets it; AdapterBusyError while a running or
        waiting request, or a leased slot (a prompt being scored), uses it."""
        with self._cv:
            users = [r for r in list(self._active) + list(self._waiting)
                     if not r.done and any(n == name for n, _ in r.adapters)]
            users += [s for s in self._leased if any(n == name for n, _ in self._slot_adapters[s])]
            if users:
                raise AdapterBusyError(f"adapter {name!r} is in use by {len(users)} request(s); "
                                       f"unload it when they finish")
            with self.runner.lock:
                for slot, key in enumerate(self._slot_adapters):
                    if any(n == name for n, _ in key):
                        self._attach(slot, ())
                self.adapters.remove(name)

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
                        with contextlib.suppress(Exception):
                            self.states.clear(r.slot)
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
        if not spec or not self.states.can_rewind:
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
            # the token and its drafts in one chunk, each draft's recurrent state kept
            k_limit = self.states.max_drafts(min(budget, ring.max_chunk(r.slot) - 1))
            if seq.limit is not None:
                k_limit = min(k_limit, seq.limit - len(seq.tokens) - 1)
            drafted = r.spec.mode in MODEL_MODES
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
        """Plans, executes and processes one step over the active requests."""
        prefilling = [r for r in reqs if r.prefilling] if self.prompt_cache is not None else []
        plan = self.schedule(reqs)
        if plan is None:
            return
        with self.runner.lock:
            masks = MaskJob.start(r.seq.constraint for r in plan.owners)   # overlaps the forward
            t0 = time.perf_counter()
            try:
                out = self.runner.execute(plan)
                if self.draft is not None:     # the MTP block's input: the model's hidden states
                    self.draft.observe(plan.batch, {r.slot for r in reqs if r.spec is not None and r.spec.mode == "mtp"})
            finally:
                masks.wait()
            self.policy.costs.observe_step(plan.n_tokens, time.perf_counter() - t0)
            for slot, n in plan.kept:
                self.states.kept(slot, n)
            if prefilling:
                self._store_prompts([r for r in prefilling if not r.prefilling])
            self.steps += 1
            self.last_batch_tokens = plan.n_tokens
        for r in plan.prefilled:     # the draft model's prefill goes with the model's (TTFT, not decode)
            self._draft_prefill(r)
        out_events, finished = self.output.update(plan, out)
        if out_events:   # one hand-over per step
            self._delivery.put(lambda: [r.deliver(evs) for r, evs in out_events])
        if finished:
            with self._cv:
                for r in finished:
                    if r in self._active:
                        self._active.remove(r)
                        self._release(r)

    def schedule(self, reqs: list[Request]) -> StepPlan | None:
        """The next step's plan, its tokens reserved in the ring:
        decode tokens (and drafts) first, every running sequence advances each step; then
        prefill chunks with what is left of the budget. None when there is nothing to run."""
        proposals = self._proposals(reqs)    # the draft model runs outside the lock
        with self.runner.lock:
            return self._plan(reqs, proposals)

    def _plan(self, reqs: list[Request], proposals: dict[int, list[int]]) -> StepPlan | None:
        ring = self.ring
        keep_states = self.states.keeps_states
        toks: list[int] = []
        slots: list[int] = []
        pos_parts: list[np.ndarray] = []
        cell_parts: list[np.ndarray] = []
        out_rows: list[int] = []
        owners: list[Request] = []
        drafts_of: list[list[int]] = []     # per owner: the proposals its rows verify
        prefilled: list[Request] = []       # draft-mode requests whose prompt is now in
        keep_rows: list[int] = []
        kept: list[tuple[int, int]] = []
        budget = self.max_batch
        for r in reqs:
            if not r.prefilling:
                drafts = proposals.get(r.id, [])
                feed = [r.next_token] + drafts
                p, c = ring.reserve(r.slot, feed)
                if keep_states and drafts:      # a rollback resumes after any confirmed draft
                    keep_rows.extend(range(len(toks), len(toks) + len(drafts)))
                    kept.extend((r.slot, int(x) + 1) for x in p[:len(drafts)])
                out_rows.extend(range(len(toks), len(toks) + len(feed)))
                toks.extend(feed)
                slots.extend([r.slot] * len(feed))
                pos_parts.append(p)
                cell_parts.append(c)
                owners.append(r)
                drafts_of.append(drafts)
                budget -= len(feed)
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
            shareable = len(ids) - 1        # the prompt a sibling or a later request may reuse
            if keep_states and r.n_fed < shareable <= r.n_fed + n:
                keep_rows.append(len(toks) + shareable - 1 - r.n_fed)
                kept.append((r.slot, shareable))
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
                if r.spec is not None and r.spec.mode in MODEL_MODES:
                    prefilled.append(r)
        if not toks:
            return None
        batch = Batch(toks, slots, np.concatenate(pos_parts), np.concatenate(cell_parts), out_rows,
                      keep_rows or NO_ROWS)
        return StepPlan(batch, owners, drafts_of, self._device_top_k(owners), prefilled, kept)

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
