"""What one engine step carries from the scheduler to the runner and on to the output
processor (the split of vLLM's v1 engine): the plan, then the forward's output rows."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..backends.base import Batch

if TYPE_CHECKING:  # pragma: no cover
    from .request import Request


@dataclass
class StepPlan:
    """Scheduler.schedule() -> Runner.execute() -> OutputProcessor.update().

    `owners` are the sequences with output rows, in row order: each has 1 + len(its drafts)
    consecutive rows (its next token, then the proposals those rows verify). `kept` names the
    states the forward keeps (batch.keep_rows), as (slot, positions seen)."""
    batch: Batch
    owners: list[Request]
    drafts: list[list[int]]
    top_k: int | None = None            # device top-k for every owner; None: logits rows
    prefilled: list[Request] = field(default_factory=list)   # draft-mode prompts now complete
    kept: list[tuple[int, int]] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return len(self.batch)


@dataclass
class StepOutput:
    """What one step returns for its output rows: the logits rows, or (device top-k)
    the k best candidates of each row."""
    logits: np.ndarray | None = None
    top_ids: np.ndarray | None = None
    top_vals: np.ndarray | None = None
