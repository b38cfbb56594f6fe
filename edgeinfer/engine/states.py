"""SequenceStates: what a slot holds of its sequence, in one place beside the KV ring.

A sequence's *state* is its KV cells (the ring's bookkeeping, kv.py) and, on a runtime with
recurrent layers (caps.recurrent_state: Gated DeltaNet, short convolutions), a fixed-size
state per slot that sums up every position seen. Cells can be forgotten from any position;
a recurrent state cannot be rewound, only replaced by a copy kept earlier. The runtime keeps
such copies at batch rows the scheduler marks (Batch.keep_rows: a state between two tokens of
one chunk exists only inside the forward), named by the positions seen; this class remembers
which it holds, so prefix reuse, n > 1 siblings and speculative rollback resume only where
both the cells and the state are exact. For an attention-only runtime every position is such
a point and the calls below reduce to the ring's and forget_from.

Callers hold the runner's lock.
"""
from __future__ import annotations

from .kv import KVRing
from .runner import Runner


class SequenceStates:
    def __init__(self, ring: KVRing, runner: Runner):
        caps = runner.caps
        self.ring = ring
        self.runner = runner
        self.recurrent = caps.recurrent_state
        # a recurrent state that cannot be kept ties a slot to its one live position
        self.can_rewind = caps.state_snapshots or not caps.recurrent_state
        self.keeps_states = caps.recurrent_state and caps.state_snapshots   # Batch.keep_rows wanted
        self.can_copy = caps.copy_prefix
        self.can_save = caps.state_io
        self.max_kept = caps.max_snapshots   # 0: no bound
        self._kept: list[set[int]] = [set() for _ in range(ring.n_slots)]   # positions seen, per slot

    def max_drafts(self, k: int) -> int:
        """k, or fewer: the most draft tokens one step may verify. A rollback restores the copy
        kept after the last confirmed draft, so every draft's copy must still be held beside an
        older one a reuse may want (the runtime keeps the max_kept latest)."""
        if not self.keeps_states or not self.max_kept:
            return k
        return min(k, self.max_kept - 1)

    def clear(self, slot: int) -> None:
        """Forgets everything the slot holds."""
        self.ring.truncate(slot, 0)
        self._kept[slot].clear()
        self.runner.clear_slot(slot)

    def resume_point(self, slot: int, n: int) -> int:
        """The most of the slot's first n positions it can go on from (what a copy or a
        rollback to n keeps): n for attention-only, else the last kept state at or below n."""
        if not self.recurrent or n == self.ring.slots[slot].n_past:
            return n
        return max((m for m in self._kept[slot] if m <= n), default=0)

    def rollback(self, slot: int, n: int) -> int:
        """Forgets positions >= n; returns how many the slot keeps: n, or fewer where a ring that
        slid or the recurrent state cannot go back that far (0: the slot starts over)."""
        held = self.ring.slots[slot].n_past
        if n >= held:
            return held
        keep = self.ring.truncate(slot, self.resume_point(slot, n))
        self.runner.forget_from(slot, keep)
        if self.recurrent:
            if keep:
                self.runner.restore_state(slot, keep)
            else:
                self.runner.clear_slot(slot)
            self._kept[slot] = {m for m in self._kept[slot] if m <= keep}
        return keep

    def copy_prefix(self, src: int, dst: int, n: int) -> bool:
        """Makes dst hold src's first n positions (a running sibling's prompt); False, with
        nothing done, where the runtime cannot copy, src kept no state at n or its sliding ring
        has stored over the window n's successor sees."""
        if not self.can_copy or self.resume_point(src, n) != n or not self.ring.holds_window(src, n):
            return False
        self.runner.copy_prefix(src, dst, n)
        self.ring.copy_prefix(src, dst, n)
        if self.recurrent:
            self._kept[dst] = {n}
        return True

    def save(self, slot: int, n: int) -> bytes | None:
        """The slot's state for its first n positions (the prompt cache's payload); None where the
        runtime cannot save, the slot wrapped or holds no exact state at n."""
        st = self.ring.slots[slot]
        if (not self.can_save or st.wrapped or not 0 < n <= st.n_past or self.resume_point(slot, n) != n
                or not self.ring.holds_window(slot, n)):
            return None
        return self.runner.save_slot(slot, n)

    def load(self, slot: int, tokens: list[int], payload: bytes) -> None:
        """The slot holds exactly `tokens` again, from a payload save() made (here or by an
        earlier process of the same model)."""
        self.runner.load_slot(slot, len(tokens), payload)
        self.ring.truncate(slot, 0)
        self.ring.reserve(slot, list(tokens))   # positions [0, n) in cells [0, n): the layout load_slot wrote
        if self.recurrent:
            self._kept[slot] = {len(tokens)}

    def kept(self, slot: int, n: int) -> None:
        """Records that the runtime kept the slot's state after n positions (a keep row ran); past
        caps.max_snapshots the runtime keeps the latest ones, and so does this record."""
        kept = self._kept[slot]
        kept.add(n)
        while self.max_kept and len(kept) > self.max_kept:
            kept.remove(min(kept))

    def drop_above(self, slot: int, n: int) -> None:
        """Frees the slot's kept states past n positions (speculation's, once verified); the
        one a later request may reuse, at or below n, stays."""
        above = [m for m in self._kept[slot] if m > n]
        if above:
            self.runner.drop_states(slot, above)
            self._kept[slot].difference_update(above)
