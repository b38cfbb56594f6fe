"""What the engine needs from a device: the Backend protocol and the values it trades in.

A Backend makes a Runtime for one model and one KV plan. A Runtime runs one batched
forward step over the fixed KV arena it allocated (any mix of slots, prefill chunks and
decode tokens), and either returns logits rows or keeps them on the device and returns
their top-k candidates. Everything the engine may ask about a runtime is in
`Capabilities`; nothing above this layer probes attributes or branches on the device.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from ..gguf.reader import GGUFFile
    from ..model.config import ModelConfig
    from ..model.lora import LoraWeights


@dataclass(frozen=True)
class KVPlan:
    """The KV arena a runtime allocates once: n_slots rings of n_ctx + slack cells.

    A ring that slides (engine/kv.py) keeps `slack` cells beyond its context: a token sees the
    n_sink sinks and the last n_ctx - n_sink positions, so a batch of up to slack + 1 tokens can
    be written ahead, and rolled back, without overwriting what the window still needs."""
    n_slots: int
    n_ctx: int
    n_sink: int
    max_batch: int              # most tokens in one forward step
    kv_type: str = "f16"
    slack: int = 0
    # recurrent models: copies of a slot's recurrent state kept at once (prompt ends, drafts);
    # when full the runtime lets the one after the fewest positions go (SequenceStates mirrors it,
    # and lets a step draft at most n_snapshots - 1 tokens). Engine.load sets snapshots_for().
    n_snapshots: int = 9
    # a prompt end plus spec_max_k (8) drafts; a copy is the whole state (Qwen3.5-0.8B: ~19 MiB)
    SNAPSHOTS_MAX: ClassVar[int] = 9
    SNAPSHOT_BUDGET: ClassVar[int] = 64 << 20   # bytes of kept copies per slot
    SNAPSHOTS_MIN: ClassVar[int] = 2             # a prompt end and one draft

    @classmethod
    def snapshots_for(cls, copy_bytes: int) -> int:
        """Kept copies per slot for a recurrent state of `copy_bytes`: SNAPSHOTS_MAX, or as many
        as SNAPSHOT_BUDGET holds when fewer, never under SNAPSHOTS_MIN."""
        if copy_bytes <= 0:
            return cls.SNAPSHOTS_MAX
        return max(cls.SNAPSHOTS_MIN, min(cls.SNAPSHOTS_MAX, cls.SNAPSHOT_BUDGET // copy_bytes))

    @property
    def cells(self) -> int:
        """KV cells per slot."""
        return self.n_ctx + self.slack

    @property
    def slide_window(self) -> int:
        """Positions besides the sinks that a token sees; 0: every held cell (no slack)."""
        return self.n_ctx - self.n_sink if self.slack else 0


@dataclass(frozen=True)
class Capabilities:
    device: str                 # "cpu" | "cuda"
    isa: str                    # kernel level, e.g. "avx2" or "cuda sm_90"
    kv_type: str                # the arena's element type
    kv_types: tuple[str, ...]   # every KV type this backend can allocate
    max_batch: int
    n_vocab: int
    max_topk: int = 0           # largest k of forward_topk; 0: logits always come back to the host
    n_threads: int = 0          # CPU worker threads (0 on a GPU)
    kv_bytes: int = 0
    state_bytes: int = 0        # recurrent layers' per-slot states and their kept copies
    scratch_bytes: int = 0
    packed_bytes: int = 0       # repacked weight copies (CPU)
    device_bytes: int = 0       # weights held in device memory (GPU)
    profile_stages: tuple[str, ...] = field(default=())
    # Sequence state beyond the KV cells (engine/states.py speaks of a slot's *state*):
    copy_prefix: bool = False       # Runtime.copy_prefix: a slot takes another's first n positions
    recurrent_state: bool = False   # fixed-size per-slot states of recurrent layers beside the cells
    state_snapshots: bool = False   # Batch.keep_rows + Runtime.restore_state / drop_states
    max_snapshots: int = 0          # kept states per slot; past it the one after the fewest positions goes
    embeddings: bool = False        # Runtime.forward_hidden: final-normed hidden rows (what embeddings pool)
    state_io: bool = False          # Runtime.slot_state_size / save_slot / load_slot (the prompt cache)
    lora: bool = False              # Runtime.add_adapter / set_slot_adapters: LoRA adapters per slot


NO_ROWS = np.empty(0, dtype=np.int32)


@dataclass(frozen=True)
class Batch:
    """One forward step: token i goes to (slots[i], pos[i]) and is written to KV cell cells[i];
    out_rows are the batch indices whose logits (or candidates) the step returns.

    keep_rows (caps.state_snapshots only): rows after which the runtime keeps a copy of the row's
    slot's recurrent state, named by the positions it has then seen (pos + 1), for
    Runtime.restore_state. A state between two tokens of one chunk exists only inside the
    forward, so the step itself has to keep it."""
    tokens: np.ndarray
    slots: np.ndarray
    pos: np.ndarray
    cells: np.ndarray
    out_rows: np.ndarray
    keep_rows: np.ndarray = field(default_factory=lambda: NO_ROWS)

    def __post_init__(self) -> None:
        for name in ("tokens", "slots", "pos", "cells", "out_rows", "keep_rows"):
            object.__setattr__(self, name, np.ascontiguousarray(getattr(self, name), dtype=np.int32))

    @classmethod
    def of_slot(cls, slot: int, tokens, pos, cells, out_rows) -> "Batch":
        return cls(tokens, np.full(len(tokens), slot, dtype=np.int32), pos, cells, out_rows)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_out(self) -> int:
        return len(self.out_rows)


class Runtime(Protocol):
    """One model's forward over a fixed KV arena. Not thread-safe: engine/runner.py serialises calls."""

    caps: Capabilities

    def forward(self, batch: Batch, logits: np.ndarray | None = None) -> np.ndarray:
        """Logits [batch.n_out, n_vocab] float32 (written into `logits` when given)."""

    def forward_topk(self, batch: Batch, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids int32, vals float32) [batch.n_out, k]: each output row's k largest logits, value
        descending, ties to the lower id. Only when 0 < k <= caps.max_topk."""

    def forward_hidden(self, batch: Batch, out: np.ndarray | None = None) -> np.ndarray:
        """(caps.embeddings) As forward, but each output row's hidden state after the final norm,
        [batch.n_out, n_embd] float32, in place of its logits."""

    def clear_slot(self, slot: int) -> None:
        """Forgets every cell of the slot."""

    def forget_from(self, slot: int, pos: int) -> None:
        """Forgets the slot's cells of positions >= pos (prefix reuse keeps the rest), and the
        states it kept at more than pos positions."""

    # The calls below exist where caps say so (engine/states.py is their only caller).

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """(caps.copy_prefix) Slot dst holds slot src's positions [0, n): their cells, and with
        caps.recurrent_state the state src kept at n (n > 1 siblings share the prompt)."""

    def restore_state(self, slot: int, n: int) -> None:
        """(caps.state_snapshots) The slot's recurrent state becomes the one it kept after n
        positions (a Batch.keep_rows row); the cells are forget_from's. StateError when none
        was kept there."""

    def drop_states(self, slot: int, ns: list[int]) -> None:
        """(caps.state_snapshots) Frees the states the slot kept after each of `ns` positions."""

    def slot_state_size(self, n: int) -> int:
        """(caps.state_io) Bytes of save_slot's buffer for n positions; its layout depends only on
        the model, the KV type and n."""

    def save_slot(self, slot: int, n: int) -> bytes:
        """(caps.state_io) The slot's positions [0, n): their KV cells as the arena holds them and,
        with caps.recurrent_state, the state after n positions. StateError where the slot does
        not hold them unwrapped (or kept no state at n)."""

    def load_slot(self, slot: int, n: int, data: bytes) -> None:
        """(caps.state_io) The slot holds exactly save_slot's positions [0, n) again."""

    def add_adapter(self, weights: "LoraWeights") -> object:
        """(caps.lora) The adapter's handle on this runtime (checked against the model: AdapterError)."""

    def set_slot_adapters(self, slot: int, adapters: list[tuple[object, float]]) -> None:
        """(caps.lora) The slot's rows get W x + sum scale * B (A x) for each (handle, scale) from
        now on; [] detaches. A handle stays valid while a slot uses it."""

    def profile(self, reset: bool = False) -> dict[str, float]:
        """Seconds per forward stage (caps.profile_stages) so far; {} where not measured."""


class Backend(Protocol):
    name: str                   # "cpu" | "cuda"
    kv_types: tuple[str, ...]

    def describe(self) -> str:
        """One line naming the device, for logs."""

    def create_runtime(self, gguf: "GGUFFile", cfg: "ModelConfig", plan: KVPlan) -> Runtime:
        """Allocates weights, KV arena and scratch once; raises UnsupportedTypeError for a
        plan.kv_type outside kv_types."""


def require_kv_type(backend: Backend, plan: KVPlan) -> None:
    from ..errors import UnsupportedTypeError

    if plan.kv_type not in backend.kv_types:
        raise UnsupportedTypeError(f"kv_type must be one of {list(backend.kv_types)} on the {backend.name} "
                                   f"backend, got {plan.kv_type!r}")
