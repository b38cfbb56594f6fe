"""A Backend without a model, for testing the engine's seams (scheduler, runner, leases).

The fake runtime keeps what a real KV arena keeps: per slot, the (position, token) held in
each cell. The logits of an output row are a deterministic function of the tokens the row
attends to (every held cell at a position <= its own, and with a sliding ring's window, only
the sinks and the window's positions, as native attention masks them), so a sequence's greedy output is
`reference_greedy(prompt)` whatever the batching -- unless the scheduler mixes slots up,
reuses a prefix wrongly or forgets cells it should keep.

With `recurrent=True` each slot also has a fixed-size recurrent state, as a hybrid model's
Gated DeltaNet or short-conv layers do: a running CRC-32 of every token the slot was fed, in
order. It is the same CRC the row's attention context hashes to when the state is exact, and
any other state moves the row's logits, so a rollback that does not restore the state (or a
copy that takes a wrong one) changes the output. States are kept at Batch.keep_rows and
brought back by restore_state, as the Backend protocol says.
"""
from __future__ import annotations

import threading
import zlib

import numpy as np

from edgeinfer.backends.base import Batch, Capabilities, KVPlan
from edgeinfer.errors import StateError
from edgeinfer.text.tokenizer import Tokenizer

N_VOCAB = 64
EOS = 2


def tokenizer() -> Tokenizer:
    """A byte-level BPE vocabulary of N_VOCAB tokens: specials 0-2, letters, then "tokN"."""
    toks = ["<unk>", "<s>", "</s>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ"]
    toks += [f"tok{i}" for i in range(N_VOCAB - len(toks))]
    return Tokenizer.from_metadata({
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm", "tokenizer.ggml.tokens": toks,
        "tokenizer.ggml.token_type": [3 if i < 3 else 1 for i in range(N_VOCAB)],
        "tokenizer.ggml.merges": [], "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": EOS,
        "tokenizer.ggml.add_bos_token": False})


def _row(context: list[int]) -> np.ndarray:
    """Logits for the next token after `context`: one clear winner (never a special token) and a
    seeded spread below it, all distinct."""
    return _row_of(_crc(context))


def _crc(tokens, state: int = 0) -> int:
    """CRC-32 of the tokens as int32 bytes, continuing `state` (so crc(a + b) == crc(b, crc(a)))."""
    return zlib.crc32(np.asarray(tokens, dtype=np.int32).tobytes(), state)


def _row_of(h: int) -> np.ndarray:
    row = np.random.default_rng(h).permutation(N_VOCAB).astype(np.float32) / N_VOCAB
    row[3 + h % (N_VOCAB - 3)] = 10.0
    row[:3] = -10.0
    return row


def reference_greedy(prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(np.argmax(_row(seq))))
    return seq[len(prompt):]


class FakeRuntime:
    def __init__(self, plan: KVPlan, max_topk: int = 0, copy_prefix: bool = False, recurrent: bool = False):
        self.plan = plan
        self.caps = Capabilities(device="fake", isa="fake", kv_type=plan.kv_type, kv_types=("f16",),
                                 max_batch=plan.max_batch, n_vocab=N_VOCAB, max_topk=max_topk,
                                 copy_prefix=copy_prefix, recurrent_state=recurrent, state_snapshots=recurrent)
        self.cells: list[dict[int, tuple[int, int]]] = [{} for _ in range(plan.n_slots)]  # cell -> (pos, tok)
        self.state = [0] * plan.n_slots                 # recurrent: CRC of every token fed, in order
        self.kept: list[dict[int, int]] = [{} for _ in range(plan.n_slots)]   # positions seen -> state
        self.copies: list[tuple[int, int, int]] = []    # (src, dst, n) of every copy_prefix
        self.restores: list[tuple[int, int]] = []       # (slot, n) of every restore_state
        self.batches: list[Batch] = []    # every step, in order
        self.topk_calls: list[int] = []
        self.gate = threading.Event()     # forward waits for it: tests hold a step in flight
        self.gate.set()
        self.entered = threading.Semaphore(0)   # released once per forward entered
        self.fail_next: Exception | None = None

    def _rows(self, batch: Batch) -> np.ndarray:
        self.entered.release()
        self.gate.wait()
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        assert 0 < len(batch) <= self.plan.max_batch
        self.batches.append(batch)
        recurrent = self.caps.recurrent_state
        keep = set(batch.keep_rows.tolist())
        after = {}                                      # row -> the slot's recurrent state after it
        for i, (t, s, p, c) in enumerate(zip(batch.tokens, batch.slots, batch.pos, batch.cells)):
            self.cells[s][int(c)] = (int(p), int(t))
            if recurrent:
                self.state[s] = after[i] = _crc([t], self.state[s])
                if i in keep:
                    self.kept[s][int(p) + 1] = after[i]
        out = []
        window, n_sink = self.plan.slide_window, self.plan.n_sink
        for r in batch.out_rows:
            slot, pos = int(batch.slots[r]), int(batch.pos[r])
            held = sorted(v for v in self.cells[slot].values()
                          if v[0] <= pos and (not window or v[0] < n_sink or v[0] > pos - window))
            h = _crc([t for _, t in held])
            if recurrent:   # h when the state is exact; any other state moves the row
                h = (h + 0x9E3779B1 * (after[int(r)] ^ h)) & 0xFFFFFFFF
            out.append(_row_of(h))
        return np.array(out, dtype=np.float32).reshape(len(out), N_VOCAB)

    def forward(self, batch: Batch, logits: np.ndarray | None = None) -> np.ndarray:
        rows = self._rows(batch)
        if logits is None:
            return rows
        logits[:len(rows)] = rows
        return logits[:len(rows)]

    def forward_topk(self, batch: Batch, k: int) -> tuple[np.ndarray, np.ndarray]:
        assert 0 < k <= self.caps.max_topk
        self.topk_calls.append(k)
        rows = self._rows(batch)
        ids = np.argsort(-rows, axis=1, kind="stable")[:, :k].astype(np.int32)
        return ids, np.take_along_axis(rows, ids, axis=1)

    def clear_slot(self, slot: int) -> None:
        self.cells[slot].clear()
        self.state[slot] = 0
        self.kept[slot].clear()

    def forget_from(self, slot: int, pos: int) -> None:
        self.cells[slot] = {c: v for c, v in self.cells[slot].items() if v[0] < pos}
        self.kept[slot] = {n: h for n, h in self.kept[slot].items() if n <= pos}

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        assert self.caps.copy_prefix
        self.copies.append((src, dst, n))
        self.cells[dst] = {c: v for c, v in self.cells[src].items() if v[0] < n}
        self.kept[dst] = {}
        if self.caps.recurrent_state:
            self.state[dst] = self._kept_state(src, n)
            self.kept[dst] = {n: self.state[dst]}

    def restore_state(self, slot: int, n: int) -> None:
        assert self.caps.state_snapshots
        self.restores.append((slot, n))
        self.state[slot] = self._kept_state(slot, n)

    def drop_states(self, slot: int, ns: list[int]) -> None:
        for n in ns:
            self.kept[slot].pop(n, None)

    def _kept_state(self, slot: int, n: int) -> int:
        if n not in self.kept[slot]:
            raise StateError(f"slot {slot} kept no state after {n} positions")
        return self.kept[slot][n]

    def profile(self, reset: bool = False) -> dict[str, float]:
        return {}


class FakeBackend:
    name = "fake"
    kv_types = ("f16",)

    def __init__(self, max_topk: int = 0, copy_prefix: bool = False, recurrent: bool = False):
        self.max_topk = max_topk
        self.copy_prefix = copy_prefix
        self.recurrent = recurrent

    def describe(self) -> str:
        return "fake device"

    def create_runtime(self, gguf, cfg, plan: KVPlan) -> FakeRuntime:
        return FakeRuntime(plan, self.max_topk, self.copy_prefix, self.recurrent)
