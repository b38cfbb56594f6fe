"""Qwen3.5's multi-token-prediction block as the draft of speculative decoding (speculative="mtp").

The block (the file's layers after the trunk; edgeinfer/arch/nextn.py has its math) runs natively
as a one-layer model: its decoder layer is an ordinary gated-attention layer of forward.c, its
input eh_proj([enorm(embed(token)); hnorm(h)]) comes from ei_forward_nextn, its head is the
trunk's (the trunk runtime's packed copy, shared). It has its own runtime and KV ring of n_slots x
n_ctx cells (one attention layer's worth: its kv_bytes), kept like a draft model's.

Entry p of a slot (block position p) holds token p + 1 with the trunk's hidden state h[p], so
the block's ring holds the history shifted by one: history[1:]. The trunk hands out h for the
rows of every step (MtpDraft.observe, right after the forward, from ei_runtime_last_hidden);
a proposal first feeds the entries up to the sequence's end from those states (the last one's
output is the first draft), then drafts on from the block's own output state, and finally forgets
those further entries: an entry made from the block's own state is never kept, so whatever the
verification accepts or rejects, the ring holds only entries made from the trunk's states.
Drafts only propose: a wrong draft costs speed, never output (speculative.py).
"""
from __future__ import annotations

import numpy as np

from ..backends.base import Batch, KVPlan
from ..gguf.reader import GGUFFile
from ..model.config import ModelConfig, local_ring_cells
from ..model.mtp_block import MtpBlockModel, block_config
from .draft import DraftModel
from .kv import KVRing
from .runner import Runner

def trunk_hidden(runtime, rows: np.ndarray) -> np.ndarray:
    """The final-normed hidden states [len(rows), n_embd] of rows of the trunk's latest forward."""
    return runtime.last_hidden(np.ascontiguousarray(rows, dtype=np.int32))


class MtpDraft(DraftModel):
    """The MTP block as a proposer with DraftModel's interface (lag, catch_up, propose,
    reset_slot), over the shifted history; plus observe(), which keeps the trunk's hidden
    states of the slots that speculate with it until the block has taken them in."""

    mode = "mtp"

    def __init__(self, runner: Runner, ring: KVRing, trunk: Runner, head_bytes: int = 0):
        super().__init__(runner, ring)
        self.trunk = trunk
        self.head_bytes = head_bytes    # the trunk's head, which each draft token also reads
        self.n_embd = runner.runtime.model.cfg.n_embd
        self.hidden: dict[int, dict[int, np.ndarray]] = {}   # slot -> position -> trunk state
        self.first: dict[int, int] = {}                        # slot -> the token at position 0 its entries follow
        self._state = np.empty((1, self.n_embd), dtype=np.float32)   # the block's output state of its latest row
        self.last_logits: np.ndarray | None = None             # tests: the latest first draft's logits

    @property
    def weight_bytes(self) -> int:
        return self.runner.caps.packed_bytes + self.head_bytes

    # ---------------------------------------------------------- the trunk's states
    def observe(self, batch: Batch, slots: set[int]) -> None:
        """After a trunk forward (under the runner's lock, before anything else runs on it):
        keeps the hidden states of the batch's rows of `slots`; forgets the other slots'."""
        for s in [s for s in self.hidden if s not in slots]:
            del self.hidden[s]
        if not slots:
            return
        rows = np.flatnonzero(np.isin(batch.slots, list(slots)))
        if not len(rows):
            return
        h = trunk_hidden(self.trunk.runtime, rows)
        for i, r in enumerate(rows):
            self.hidden.setdefault(int(batch.slots[r]), {})[int(batch.pos[r])] = h[i]
        for held in self.hidden.values():   # a slot that stopped drafting: at most a ring's worth
            if len(held) > self.ring.cells + 64:
                for p in sorted(held)[:len(held) - self.ring.cells]:
                    del held[p]

    def _have(self, slot: int, lo: int, hi: int) -> bool:
        held = self.hidden.get(slot, {})
        return all(p in held for p in range(lo, hi))

    # ---------------------------------------------------------- DraftModel's interface
    def lag(self, slot: int, history: list[int]) -> int:
        return super().lag(slot, history[1:]) if len(history) > 1 else 0

    def catch_up(self, slot: int, history: list[int]) -> bool:
        if len(history) - 1 > self.ring.cells:
            return False
        if len(history) < 2:
            return True
        with self.runner.lock:
            self._own(slot, history[0])
            keep = self.ring.common_prefix(slot, history[1:])
            if not self._have(slot, keep, len(history) - 1):
                return False
            self._sync(slot, history[1:], keep, out=False)
            self._drop_fed(slot, len(history) - 1)
        return True

    def propose(self, slot: int, history: list[int], k: int) -> list[int]:
        ring, shifted = self.ring, history[1:]
        n = len(shifted)    # entries 0..n-1; the last one's output is the first draft
        if k <= 0 or n < 1 or (ring.overflow == "stop" and n + k > ring.capacity):
            return []
        with self.runner.lock:
            self._own(slot, history[0])
            keep = ring.resume_point(slot, shifted)
            if keep is None or not self._have(slot, min(keep, n - 1), n):
                return []
            self._sync(slot, shifted, keep, out=True)
            self.last_logits = self._row[0].copy()
            out = [int(np.argmax(self._row[0]))]
            while len(out) < k:     # entries from the block's own state: forgotten below
                self._feed(slot, [out[-1]], out=True, own_state=True)
                out.append(int(np.argmax(self._row[0])))
            if len(out) > 1:
                self.runner.forget_from(slot, ring.truncate(slot, n))
            self._drop_fed(slot, n)
        return out

    def reset_slot(self, slot: int) -> None:
        super().reset_slot(slot)
        self.first.pop(slot, None)

    # ---------------------------------------------------------- internals
    def _own(self, slot: int, first: int) -> None:
        """Entries depend on the whole history, its first token too (the shifted history lacks it)."""
        if self.first.get(slot) != first:
            self.ring.truncate(slot, 0)
            self.runner.clear_slot(slot)
            self.first[slot] = first

    def _drop_fed(self, slot: int, n: int) -> None:
        """Forgets the states of entries below n - 1 (fed, and never refed unless the sequence
        is rewound past them, when the block's ring is rewound too and the proposal skips)."""
        held = self.hidden.get(slot)
        if held:
            for p in [p for p in held if p < n - 1]:
                del held[p]

    def _feed(self, slot: int, tokens: list[int], out: bool, own_state: bool = False) -> None:
        pos, cells = self.ring.reserve(slot, tokens)
        if own_state:
            hid = self._state.copy()     # forward_block writes the next one into self._state
        else:
            held = self.hidden[slot]
            hid = np.stack([held[int(p)] for p in pos]).astype(np.float32, copy=False)
        rows = np.array([len(tokens) - 1] if out else [], dtype=np.int32)
        with self.runner.lock:
            forward_block(self.runner.runtime, Batch.of_slot(slot, tokens, pos, cells, rows), hid,
                          self._row[:len(rows)], self._state[:len(rows)])


def forward_block(runtime, batch: Batch, hidden: np.ndarray, logits: np.ndarray, states: np.ndarray) -> None:
    """One native step of the block: row i from batch.tokens[i] and hidden[i] (the trunk's state one
    position earlier, or the block's own); the output rows' logits and final-normed states."""
    runtime.forward_nextn(batch, hidden, logits, states)


def load_mtp(backend, gguf: GGUFFile, cfg: ModelConfig, plan: KVPlan, trunk: Runner) -> MtpDraft:
    """The MTP proposer of a model: its block's runtime (the trunk's plan, its own KV cells) and ring."""
    from ..backends.cpu import NativeRuntime
    block_config(cfg)   # a file without the block: a clear error first
    if getattr(backend, "name", None) != "cpu" or not hasattr(trunk.runtime, "handle"):
        raise ValueError(f"speculative='mtp' runs on the CPU backend only (this engine runs on "
                         f"{getattr(backend, 'name', backend)!r}); use 'lookup' or 'draft' there")
    model = MtpBlockModel(gguf, cfg, trunk.runtime)
    runtime = NativeRuntime(model, plan, n_threads=backend.n_threads, isa=backend.isa, drop_packed_source=True)
    ring = KVRing(plan.n_slots, plan.n_ctx, n_sink=plan.n_sink, overflow="slide" if plan.slack else "stop",
                  swa_window=0, local_cells=local_ring_cells(0, plan.cells, plan.max_batch), slack=plan.slack)
    head = gguf.tensors.get("output.weight") or gguf.tensors["token_embd.weight"]
    return MtpDraft(Runner(runtime), ring, trunk, head_bytes=len(head.data))


__all__ = ["MtpDraft", "MtpBlockModel", "block_config", "load_mtp", "trunk_hidden", "forward_block"]
