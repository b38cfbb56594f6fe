"""Runner: the one place a forward step runs. It owns the backend's runtime and the lock
that serialises every native call (runtimes are not thread-safe); the scheduler plans each
step (step.py), the runner executes it."""
from __future__ import annotations

import threading

import numpy as np

from ..backends.base import Batch, Capabilities, Runtime
from .step import StepOutput, StepPlan


class Runner:
    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.caps: Capabilities = runtime.caps
        self.lock = threading.RLock()
        self._logits = np.empty((0, self.caps.n_vocab), dtype=np.float32)   # reused by every step

    def execute(self, plan: StepPlan) -> StepOutput:
        """Runs a scheduled step; its logits rows live in a buffer the next step overwrites."""
        n_out = plan.batch.n_out
        if plan.top_k is None and n_out > len(self._logits):
            self._logits = np.empty((n_out, self.caps.n_vocab), dtype=np.float32)
        return self.run(plan.batch, self._logits[:n_out], plan.top_k)

    def run(self, batch: Batch, logits: np.ndarray | None = None, top_k: int | None = None) -> StepOutput:
        """One forward step. With top_k (1..caps.max_topk) the logits stay on the device and
        only the candidates come back; otherwise the rows, written into `logits` when given."""
        with self.lock:
            if top_k is not None:
                ids, vals = self.runtime.forward_topk(batch, top_k)
                return StepOutput(top_ids=ids, top_vals=vals)
            return StepOutput(logits=self.runtime.forward(batch, logits))

    def hidden(self, batch: Batch) -> np.ndarray:
        """(caps.embeddings) One forward step returning its output rows' final-normed hidden
        states [n_out, n_embd] instead of logits."""
        with self.lock:
            return self.runtime.forward_hidden(batch)

    def clear_slot(self, slot: int) -> None:
        with self.lock:
            self.runtime.clear_slot(slot)

    def forget_from(self, slot: int, pos: int) -> None:
        with self.lock:
            self.runtime.forget_from(slot, pos)

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """(caps.copy_prefix) Slot dst holds slot src's first n positions."""
        with self.lock:
            self.runtime.copy_prefix(src, dst, n)

    def save_slot(self, slot: int, n: int) -> bytes:
        """(caps.state_io) The slot's state for positions [0, n), as bytes."""
        with self.lock:
            return self.runtime.save_slot(slot, n)

    def load_slot(self, slot: int, n: int, data: bytes) -> None:
        with self.lock:
            self.runtime.load_slot(slot, n, data)

    def restore_state(self, slot: int, n: int) -> None:
        with self.lock:
            self.runtime.restore_state(slot, n)

    def drop_states(self, slot: int, ns: list[int]) -> None:
        with self.lock:
            self.runtime.drop_states(slot, ns)

    def close(self) -> None:
        """Drops the runtime (its native memory goes with the last reference)."""
        with self.lock:
            self.runtime = None  # type: ignore[assignment]
