"""KVRing: bookkeeping for the fixed KV arena that the native runtime allocates once.

Each slot is a ring of `cells` cells. Cells [0, n_sink) are pinned (attention
sinks). Positions only grow; the cell of position p is p itself until the ring
is full, then (policy "slide") the oldest non-sink cell is overwritten:
    cell(p) = n_sink + (p - n_sink) % (cells - n_sink)
Keys are rotated at their true position, so relative distances stay exact
while the window slides (RoPE sees only differences). Policy "stop" never
overwrites: the sequence ends with finish_reason="length".

A sliding ring has `slack` cells beyond its context (cells = capacity + slack):
a token at position p sees the sinks and the positions (p - window, p], where
window = capacity - n_sink, and the native attention masks anything older that
a cell still holds. So a batch of up to slack + 1 tokens may be written at once
after the ring has wrapped (a prompt chunk, or a token and its speculative
drafts), and rolled back by up to slack + 1 positions: the cells it overwrote
held positions no later token sees.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import ContextOverflowError

OVERFLOW_POLICIES = ("stop", "slide")
SLIDE_SLACK = 8     # cells beyond the context of a sliding ring: speculative verify writes k <= 8 drafts


def slack_cells(overflow: str, max_batch: int) -> int:
    """Slack cells per slot (see above): a sliding ring's, bounded by the batch; none for "stop"."""
    return min(SLIDE_SLACK, max_batch - 1) if overflow == "slide" else 0


@dataclass
class SlotState:
    n_past: int = 0                                   # next position to fill
    tokens: list[int] = field(default_factory=list)   # tokens at positions [first, n_past)
    first: int = 0                                    # 0 until the slot wraps, then a short tail is kept
    wrapped: bool = False                             # some cell was overwritten: no prefix reuse
    high: int = 0                                     # the most positions held since the slot was empty


class KVRing:
    def __init__(self, n_slots: int, capacity: int, n_sink: int = 4, overflow: str = "stop",
                 swa_window: int = 0, local_cells: int = 0, slack: int = 0):
        if overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow must be one of {OVERFLOW_POLICIES}, got {overflow!r}")
        if capacity < 2 or not 0 <= n_sink < capacity - 1:
            raise ValueError(f"need capacity >= 2 and 0 <= n_sink < capacity - 1 (capacity={capacity}, n_sink={n_sink})")
        if slack < 0 or (slack and overflow != "slide"):
            raise ValueError(f"slack={slack}: only a sliding ring has slack cells")
        self.n_slots = n_slots
        self.capacity = capacity          # the context: positions a token sees (sinks included)
        self.slack = slack
        self.cells = capacity + slack     # cells per slot
        self.n_sink = n_sink
        self.overflow = overflow
        self.slots = [SlotState() for _ in range(n_slots)]
        # Sliding-window layers with their own ring of local_cells (position p in cell
        # p % local_cells): rewinding far overwrites the window the next token needs.
        self.swa_window = swa_window
        self.local_cells = local_cells

    @property
    def window(self) -> int:
        """Positions besides the sinks that a token sees once the ring has slid."""
        return self.capacity - self.n_sink

    def cell_of(self, pos: int | np.ndarray):
        ring = self.cells - self.n_sink
        if isinstance(pos, np.ndarray):
            return np.where(pos < self.cells, pos, self.n_sink + (pos - self.n_sink) % ring)
        return pos if pos < self.cells else self.n_sink + (pos - self.n_sink) % ring

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
        st.high = max(st.high, st.n_past)
        st.tokens.extend(tokens)
        if st.n_past > self.cells:
            st.wrapped = True
        if st.wrapped and len(st.tokens) > 4 * (self.slack + 2):   # the tail a rollback may reach
            cut = len(st.tokens) - (self.slack + 2)
            st.tokens, st.first = st.tokens[cut:], st.first + cut
        return pos, cells

    def max_chunk(self, slot: int) -> int:
        """Largest exact chunk of tokens for one forward: anything up to the last cell, and
        past it slack + 1 tokens (a longer chunk would overwrite cells its own earliest
        token still sees)."""
        st = self.slots[slot]
        return max(self.cells - st.n_past, self.slack + 1)

    def common_prefix(self, slot: int, tokens: list[int]) -> int:
        """How many leading tokens the slot already holds (0 once it has wrapped)."""
        st = self.slots[slot]
        if st.wrapped:
            return 0
        i = _common_len(st.tokens, tokens)
        return i if self._window_held(st, i) else 0

    def resume_point(self, slot: int, tokens: list[int]) -> int | None:
        """For the request that owns the slot (its earlier tokens are taken as held): how many
        leading tokens of `tokens` the slot can keep, rolling back what follows; None when a
        wrapped slot would have to roll back further than its slack allows (start it over)."""
        st = self.slots[slot]
        if not st.wrapped:
            return self.common_prefix(slot, tokens)
        if len(tokens) < st.first:
            return None
        i = st.first + _common_len(st.tokens, tokens[st.first:])
        if st.n_past - i > self.slack + 1 or not self._window_held(st, i):
            return None
        return i

    def _window_held(self, st: SlotState, n: int) -> bool:
        """Does the local ring still hold positions [n - swa_window, n), what a token at n may
        attend to and what a copy or a save of n positions takes (the runtime's
        ei_window_first)? Position x is gone once x + local_cells was stored since the slot was
        empty: a rollback empties the later cells, it does not bring back what they held."""
        r = self.local_cells
        return not r or n == 0 or max(0, n - self.swa_window) + r >= st.high

    def holds_window(self, slot: int, n: int) -> bool:
        return self._window_held(self.slots[slot], n)

    def truncate(self, slot: int, n_keep: int) -> int:
        """Forgets positions >= n_keep; returns what the slot keeps: n_keep, or 0 when a wrapped
        slot would roll back past its slack (the caller then forgets everything)."""
        st = self.slots[slot]
        if st.wrapped and (n_keep < st.first or st.n_past - n_keep > self.slack + 1):
            n_keep, st.wrapped, st.first, st.tokens = 0, False, 0, []
        st.tokens = st.tokens[:n_keep - st.first]
        st.n_past = n_keep
        if n_keep == 0:
            st.high = 0
        return n_keep

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Records that dst now holds src's first n positions (Runner.copy_prefix copied them)."""
        st, held = self.slots[dst], self.slots[src]
        st.tokens, st.n_past, st.wrapped, st.first, st.high = held.tokens[:n], n, False, 0, n

    def cells_used(self, slot: int) -> int:
        return min(self.slots[slot].n_past, self.cells)


def _common_len(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of a and b (compared at C speed when one extends the other)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i
