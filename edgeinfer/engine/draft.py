"""The draft model of speculative decoding (speculative="draft"): a smaller model sharing the
vocabulary, with a runtime and a KV ring of its own, that proposes the tokens the model verifies."""
from __future__ import annotations

import numpy as np

from ..backends.base import Batch
from .kv import KVRing
from .runner import Runner


class DraftModel:
    """A second model's runtime and KV ring (one slot per target slot). Each proposal first
    brings the draft slot up to the sequence's history (reusing the common prefix, so after
    the first step only the few new tokens are fed), then decodes k tokens greedily."""

    mode = "draft"      # the speculative mode it serves (speculative.check_proposer)

    def __init__(self, runner: Runner, ring: KVRing):
        self.runner = runner
        self.ring = ring
        self.n_vocab = runner.caps.n_vocab
        self._row = np.empty((1, self.n_vocab), dtype=np.float32)

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one draft token reads (the policy's prior for its cost)."""
        return self.runner.caps.packed_bytes

    def observe(self, batch: Batch, slots: set[int]) -> None:
        """After each model step (MtpDraft keeps the model's hidden states); a draft model needs none."""

    def lag(self, slot: int, history: list[int]) -> int:
        """Tokens of `history` the draft slot would have to be fed before drafting."""
        keep = self.ring.resume_point(slot, history)
        return len(history) - (0 if keep is None else min(keep, len(history) - 1))

    def catch_up(self, slot: int, history: list[int]) -> bool:
        """Brings the draft slot up to a new request's prompt, reusing whatever prefix the slot
        holds from earlier requests; False when it does not fit."""
        if len(history) > self.ring.cells:
            return False
        with self.runner.lock:
            self._sync(slot, history, self.ring.common_prefix(slot, history), out=False)
        return True

    def _sync(self, slot: int, history: list[int], keep: int, out: bool) -> None:
        """Makes the slot hold `history`, keeping its first `keep` tokens; with `out`, refeeds at
        least its last token so that self._row is the next token's logits."""
        ring = self.ring
        if out:
            keep = min(keep, len(history) - 1)
        keep = ring.truncate(slot, keep)
        self.runner.forget_from(slot, keep)
        todo = history[keep:]
        while todo:
            step = min(self.runner.caps.max_batch, ring.max_chunk(slot))
            chunk, todo = todo[:step], todo[step:]
            self._feed(slot, chunk, out=out and not todo)

    def propose(self, slot: int, history: list[int], k: int) -> list[int]:
        """k greedy draft tokens after the request's `history` (the slot's owner: what it fed
        before is taken as held, so a slot whose ring has slid drafts on)."""
        ring = self.ring
        if k <= 0 or (ring.overflow == "stop" and len(history) + k > ring.capacity):
            return []
        keep = ring.resume_point(slot, history)
        if keep is None:        # slid too far from what it holds: catching up would cost a prefill
            return []
        with self.runner.lock:
            self._sync(slot, history, keep, out=True)
            out = [int(np.argmax(self._row[0]))]
            while len(out) < k:
                self._feed(slot, [out[-1]], out=True)
                out.append(int(np.argmax(self._row[0])))
        return out

    def _feed(self, slot: int, tokens: list[int], out: bool) -> None:
        pos, cells = self.ring.reserve(slot, tokens)
        rows = np.array([len(tokens) - 1] if out else [], dtype=np.int32)
        self.runner.run(Batch.of_slot(slot, tokens, pos, cells, rows), self._row[:len(rows)])

    def reset_slot(self, slot: int) -> None:
        with self.runner.lock:
            self.ring.truncate(slot, 0)
            self.runner.clear_slot(slot)

    def close(self) -> None:
        self.runner.close()
