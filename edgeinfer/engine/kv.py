"""KVRing: bookkeeping for the fixed KV arena that the native runtime allocates once.

Each slot is a ring of `capacity` cells. Cells [0, n_sink) are pinned (attention
sinks). Positions only grow; the cell of position p is p itself until the ring
is full, then (policy "slide") the oldest non-sink cell is overwritten:
    cell(p) = n_sink + (p - n_sink) % (capacity - n_sink)
Keys are rotated at their true position, so relative distances stay exact
while the window slides (RoPE sees only differences). Policy "stop" never
overwrites: the sequence ends with finish_reason="length".
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import ContextOverflowError

OVERFLOW_POLICIES = ("stop", "slide")


@dataclass
class SlotState:
    n_past: int = 0                                   # next position to fill
    tokens: list[int] = field(default_factory=list)   # tokens at positions [0, n_past), until it wraps
    wrapped: bool = False                             # some cell was overwritten: no prefix reuse


class KVRing:
    def __init__(self, n_slots: int, capacity: int, n_sink: int = 4, overflow: str = "stop",
                 swa_window: int = 0, local_cells: int = 0):
        if overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow must be one of {OVERFLOW_POLICIES}, got {overflow!r}")
        if capacity < 2 or not 0 <= n_sink < capacity - 1:
            raise ValueError(f"need capacity >= 2 and 0 <= n_sink < capacity - 1 (capacity={capacity}, n_sink={n_sink})")
        self.n_slots = n_slots
        self.capacity = capacity
        self.n_sink = n_sink
        self.overflow = overflow
        self.slots = [SlotState() for _ in range(n_slots)]
        # Sliding-window layers with their own ring of local_cells (position p in cell
        # p % local_cells): rewinding far overwrites the window the next token needs.
        self.swa_window = swa_window
        self.local_cells = local_cells

    @property
    def window(self) -> int:
        """Cells that slide: the ring minus the pinned sinks."""
        return self.capacity - self.n_sink

    def cell_of(self, pos: int | np.ndarray):
        if isinstance(pos, np.ndarray):
            return np.where(pos < self.capacity, pos, self.n_sink + (pos - self.n_sink) % self.window)
        return pos if pos < self.capacity else self.n_sink + (pos - self.n_sink) % self.window

    def room(self, slot: int) -> int | None:
        """Tokens that can still be added to the slot; None when it can slide forever."""
        if self.overflow == "slide":
            return None
        return self.capacity - self.slots[slot].n_past

    def reserve(self, slot: int, tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Positions and cells for appending `tokens` to the slot; records them."""
        st = self.slots[slot]
        n = len(tokens)
        room = self.room(slot)
        if room is not None and n > room:
            raise ContextOverflowError(
                f"{st.n_past} tokens held + {n} new exceed the context of {self.capacity} cells "
                f"(overflow='stop'; use overflow='slide' to keep going in constant memory)")
        pos = np.arange(st.n_past, st.n_past + n, dtype=np.int32)
        cells = self.cell_of(pos).astype(np.int32)
        st.n_past += n
        if st.n_past > self.capacity:
            st.wrapped = True
            st.tokens = []
        else:
            st.tokens.extend(tokens)
        return pos, cells

    def max_chunk(self, slot: int) -> int | None:
        """Largest exact prefill chunk: once a slot wraps, a chunk longer than one
        token would overwrite cells its own earlier tokens still attend to."""
        st = self.slots[slot]
        if st.n_past >= self.capacity:
            return 1
        return self.capacity - st.n_past

    def common_prefix(self, slot: int, tokens: list[int]) -> int:
        """How many leading tokens the slot already holds (0 once it has wrapped)."""
        st = self.slots[slot]
        if st.wrapped:
            return 0
        n = min(len(st.tokens), len(tokens))
        held = st.tokens
        i = 0
        while i < n and held[i] == tokens[i]:
            i += 1
        return i if self._window_intact(st.n_past, i) else 0

    def _window_intact(self, n_past: int, keep: int) -> bool:
        """After positions [keep, n_past) are forgotten, does the local ring still hold the
        window (keep - swa_window, keep) the next token attends to? Position x is gone when
        a later position x + local_cells < n_past was stored over it."""
        r, w = self.local_cells, self.swa_window
        if not r or keep == 0 or n_past <= r:
            return True
        return max(0, keep - w + 1) + r >= n_past

    def truncate(self, slot: int, n_keep: int) -> None:
        st = self.slots[slot]
        if st.wrapped:
            n_keep, st.wrapped = 0, False
        st.tokens = st.tokens[:n_keep]
        st.n_past = n_keep

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Records that dst now holds src's first n positions (Runner.copy_prefix copied them)."""
        st, held = self.slots[dst], self.slots[src]
        st.tokens, st.n_past, st.wrapped = held.tokens[:n], n, False

    def cells_used(self, slot: int) -> int:
        return min(self.slots[slot].n_past, self.capacity)
