"""NativeRuntime: the thread pool, scratch and KV arena of one model, and its forward call."""
from __future__ import annotations

import numpy as np

from .._native import check, ffi, lib
from ..model.native_model import NativeModel

KV_TYPES = {"f16": lib.EI_TYPE_F16, "q8_0": lib.EI_TYPE_Q8_0}
ISA_NAMES = {"best": lib.EI_ISA_BEST, "scalar": lib.EI_ISA_SCALAR, "avx2": lib.EI_ISA_AVX2,
             "avx512": lib.EI_ISA_AVX512, "neon": lib.EI_ISA_NEON}


def _i32(arr: np.ndarray):
    return ffi.from_buffer("int32_t[]", arr)


class NativeRuntime:
    """Allocates everything once; forward() never allocates on the C side.

    Not thread-safe: the engine serialises calls.
    """

    def __init__(self, model: NativeModel, *, n_threads: int | None, n_slots: int, n_ctx: int,
                 n_sink: int, max_batch: int, isa: str = "best", drop_packed_source: bool = False,
                 kv_type: str = "f16"):
        if isa not in ISA_NAMES:
            raise ValueError(f"isa must be one of {sorted(ISA_NAMES)}, got {isa!r}")
        if kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {sorted(KV_TYPES)}, got {kv_type!r}")
        self.kv_type = kv_type
        self.model = model
        self.n_vocab = model.cfg.n_vocab
        self.max_batch = max_batch
        p = ffi.new("ei_runtime_params *")
        p.n_threads = n_threads or 0
        p.n_slots, p.n_ctx, p.n_sink, p.max_batch = n_slots, n_ctx, n_sink, max_batch
        p.kv_type = KV_TYPES[kv_type]
        p.isa = ISA_NAMES[isa]
        p.drop_packed_source = int(drop_packed_source)
        out = ffi.new("ei_runtime **")
        check(lib.ei_runtime_create(model.handle, p, out), "runtime_create")
        self.handle = ffi.gc(out[0], lib.ei_runtime_free)
        self.kv_bytes = int(lib.ei_runtime_kv_bytes(self.handle))
        self.scratch_bytes = int(lib.ei_runtime_scratch_bytes(self.handle))
        self.packed_bytes = int(lib.ei_runtime_packed_bytes(self.handle))
        self.n_threads = p.n_threads if p.n_threads > 0 else int(lib.ei_physical_cores())
        level = lib.ei_cpu_best_isa() if p.isa == lib.EI_ISA_BEST else p.isa
        self.isa_name = ffi.string(lib.ei_isa_name(level)).decode()

    def forward(self, tokens: np.ndarray, slots: np.ndarray, pos: np.ndarray, cells: np.ndarray,
                out_rows: np.ndarray, logits: np.ndarray | None = None) -> np.ndarray:
        """Runs one step; returns logits [len(out_rows), n_vocab] (written into `logits` if given)."""
        n, n_out = len(tokens), len(out_rows)
        if logits is None:
            logits = np.empty((n_out, self.n_vocab), dtype=np.float32)
        out_ptr = ffi.from_buffer("float[]", logits) if n_out else ffi.NULL
        check(lib.ei_forward(self.handle, n, _i32(tokens), _i32(slots), _i32(pos), _i32(cells), n_out,
                             _i32(out_rows) if n_out else ffi.NULL, out_ptr), "forward")
        return logits[:n_out]

    def clear_slot(self, slot: int) -> None:
        check(lib.ei_runtime_clear_slot(self.handle, slot), "clear_slot")

    def forget_from(self, slot: int, pos: int) -> None:
        check(lib.ei_runtime_forget_from(self.handle, slot, pos), "forget_from")

    PROFILE_STAGES = ("embed", "norm", "qkv", "rope_kv", "attention", "attn_out", "ffn_up", "ffn_act",
                      "ffn_down", "head")

    def profile(self, reset: bool = False) -> dict[str, float]:
        """Seconds spent in each stage of the forward pass so far."""
        buf = ffi.new("double[]", len(self.PROFILE_STAGES))
        n = lib.ei_runtime_profile(self.handle, buf, len(self.PROFILE_STAGES), int(reset))
        return {name: float(buf[i]) for i, name in enumerate(self.PROFILE_STAGES[:n])}
