"""OutputProcessor: turns one step's output rows into each sequence's events.

It samples every owner of the step (SequenceState.on_logits, or on_candidates from device
top-k), verifies speculative drafts -- sampling their rows in order as plain decoding would,
keeping the proposals the samples confirm and rolling the slot's state back past the first
mismatch -- and counts speculation for /metrics. Runs on the stepping thread; the events
(token ids) go to the delivery thread, which turns them into text and applies stop strings.
"""
from __future__ import annotations

from .generation import DoneEvent
from .request import Request
from .speculative import SlotSpec, SpecPolicy
from .states import SequenceStates
from .step import StepOutput, StepPlan


class OutputProcessor:
    def __init__(self, states: SequenceStates, policy: SpecPolicy):
        self.states = states
        self.policy = policy
        self.spec_proposed = 0      # totals over every request, for /metrics
        self.spec_accepted = 0
        self.spec_steps = 0

    def update(self, plan: StepPlan, out: StepOutput) -> tuple[list[tuple[Request, list]], list[Request]]:
        """(events per owner, owners that finished) of one executed step. A cancelled owner
        gets nothing: it is reaped (and its slot freed) at the top of the next step."""
        ring = self.states.ring
        k = plan.top_k
        events_of: list[tuple[Request, list]] = []
        finished: list[Request] = []
        row = 0
        for r, drafts in zip(plan.owners, plan.drafts):
            row0, row = row, row + 1 + len(drafts)
            if r.cancelled:
                continue
            if drafts:
                events, nxt = self._verify(r, out, row0, drafts, k)
            else:
                room = ring.room(r.slot)
                events, nxt = self._sample(r, out, row0, k, room is None or room > 0)
            r.next_token = nxt
            if nxt is None:
                r.done = True
                finished.append(r)
            events_of.append((r, events))
        return events_of, finished

    @staticmethod
    def _sample(r: Request, out: StepOutput, row: int, k: int | None, has_room: bool) -> tuple[list, int | None]:
        """One token of `r` from logits row `row` (or its device top-k candidates)."""
        if k is None:
            return r.seq.on_logits(out.logits[row], has_room)
        return r.seq.on_candidates(out.top_ids[row], out.top_vals[row], has_room)

    def _verify(self, r: Request, out: StepOutput, row0: int, drafts: list[int],
                k: int | None) -> tuple[list, int | None]:
        """Samples rows row0.. (the slot's token, then its drafts) in order while the samples
        confirm the drafts; rolls the slot's state back past the last confirmed draft."""
        states, seq, spec = self.states, r.seq, r.spec
        ring = states.ring
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
        keep = p0 + 1 + n_acc                       # positions [0, keep) hold the sequence as sampled
        with states.runner.lock:
            if keep < st.n_past:
                kept = states.rollback(r.slot, keep)
                assert kept == keep, (kept, keep)   # drafts never exceed the chunk a rollback can undo
            if states.recurrent:
                states.drop_above(r.slot, p0)       # the drafts' kept states: the live one is exact
        self.policy.record(spec, len(drafts), n_acc)
        self.spec_proposed += len(drafts)
        self.spec_accepted += n_acc
        self.spec_steps += 1
        _spec_stats(seq.stats, spec)
        for ev in events:       # a DoneEvent carries a copy of the stats taken before the count
            if isinstance(ev, DoneEvent):
                _spec_stats(ev.stats, spec)
        return events, nxt


def _spec_stats(stats, spec: SlotSpec) -> None:
    stats.spec_proposed = spec.proposed
    stats.spec_accepted = spec.accepted
    stats.spec_k = spec.proposed / spec.steps if spec.steps else 0.0
