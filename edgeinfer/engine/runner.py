"""Runner: the one place a forward step runs. It owns the backend's runtime and the lock
that serialises every native call (runtimes are not thread-safe); the scheduler decides
what goes in each batch, the runner executes it."""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from ..backends.base import Batch, Capabilities, Runtime


@dataclass
class StepOutput:
    """What one step returns for its output rows: the logits rows, or (device top-k)
    the k best candidates of each row."""
    logits: np.ndarray | None = None
    top_ids: np.ndarray | None = None
    top_vals: np.ndarray | None = None


class Runner:
    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.caps: Capabilities = runtime.caps
        self.lock = threading.RLock()

    def run(self, batch: Batch, logits: np.ndarray | None = None, top_k: int | None = None) -> StepOutput:
        """One forward step. With top_k (1..caps.max_topk) the logits stay on the device and
        only the candidates come back; otherwise the rows, written into `logits` when given."""
        with self.lock:
            if top_k is not None:
                ids, vals = self.runtime.forward_topk(batch, top_k)
                return StepOutput(top_ids=ids, top_vals=vals)
            return StepOutput(logits=self.runtime.forward(batch, logits))

    def clear_slot(self, slot: int) -> None:
        with self.lock:
            self.runtime.clear_slot(slot)

    def forget_from(self, slot: int, pos: int) -> None:
        with self.lock:
            self.runtime.forget_from(slot, pos)

    def copy_prefix(self, src: int, dst: int, n: int) -> bool:
        """Makes slot dst hold slot src's first n positions; False (nothing done) where the
        backend cannot copy cells (then the prompt is computed again)."""
        copy = getattr(self.runtime, "copy_prefix", None)
        if copy is None:
            return False
        with self.lock:
            copy(src, dst, n)
        return True

    def close(self) -> None:
        """Drops the runtime (its native memory goes with the last reference)."""
        with self.lock:
            self.runtime = None  # type: ignore[assignment]
