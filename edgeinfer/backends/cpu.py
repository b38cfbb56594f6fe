"""The CPU backend: our SIMD kernels' thread pool, scratch and KV arena for one model."""
from __future__ import annotations

import numpy as np

from .._native import check, ffi, lib
from ..model.lora import LoraWeights, NativeLora
from ..model.native_model import NativeModel
from .base import Batch, Capabilities, KVPlan, require_kv_type

KV_TYPES = {"f16": lib.EI_TYPE_F16, "q8_0": lib.EI_TYPE_Q8_0}
ISA_NAMES = {"best": lib.EI_ISA_BEST, "scalar": lib.EI_ISA_SCALAR, "avx2": lib.EI_ISA_AVX2,
             "avx512": lib.EI_ISA_AVX512, "neon": lib.EI_ISA_NEON}
PROFILE_STAGES = ("embed", "norm", "qkv", "rope_kv", "attention", "attn_out", "ffn_up", "ffn_act",
                  "ffn_down", "head", "recurrent")


def cpu_report() -> dict:
    """What the CPU kernels see here: the ISA levels this CPU can run, the one `isa="best"`
    picks, the physical cores (the default thread count) and the native library's version."""
    levels = {name: v for name, v in ISA_NAMES.items() if name != "best"}
    return {"isa_supported": [name for name, v in levels.items() if lib.ei_isa_supported(v)],
            "best_isa": ffi.string(lib.ei_isa_name(lib.ei_cpu_best_isa())).decode(),
            "physical_cores": int(lib.ei_physical_cores()),
            "version": ffi.string(lib.ei_version()).decode()}


def _i32(arr: np.ndarray):
    return ffi.from_buffer("int32_t[]", arr)


class CpuBackend:
    name = "cpu"
    kv_types = tuple(KV_TYPES)

    def __init__(self, n_threads: int | None = None, isa: str = "best"):
        if isa not in ISA_NAMES:
            raise ValueError(f"isa must be one of {sorted(ISA_NAMES)}, got {isa!r}")
        self.n_threads = n_threads
        self.isa = isa

    def describe(self) -> str:
        return f"CPU ({ffi.string(lib.ei_isa_name(lib.ei_cpu_best_isa())).decode()})"

    def create_runtime(self, gguf, cfg, plan: KVPlan) -> "NativeRuntime":
        require_kv_type(self, plan)
        return NativeRuntime(NativeModel(gguf, cfg, plan.n_ctx), plan, n_threads=self.n_threads, isa=self.isa,
                             drop_packed_source=True)   # the kernels read their packed copy


class NativeRuntime:
    """Allocates everything once; forward() never allocates on the C side."""

    def __init__(self, model: NativeModel, plan: KVPlan, *, n_threads: int | None = None, isa: str = "best",
                 drop_packed_source: bool = False):
        self.model = model
        p = ffi.new("ei_runtime_params *")
        p.n_threads = n_threads or 0
        p.n_slots, p.n_ctx, p.n_sink, p.max_batch = plan.n_slots, plan.cells, plan.n_sink, plan.max_batch
        p.slide_window = plan.slide_window
        p.kv_type = KV_TYPES[plan.kv_type]
        p.isa = ISA_NAMES[isa]
        p.drop_packed_source = int(drop_packed_source)
        p.n_snapshots = plan.n_snapshots
        out = ffi.new("ei_runtime **")
        check(lib.ei_runtime_create(model.handle, p, out), "runtime_create")
        self.handle = ffi.gc(out[0], lib.ei_runtime_free)
        level = lib.ei_cpu_best_isa() if p.isa == lib.EI_ISA_BEST else p.isa
        self.caps = Capabilities(
            device="cpu", isa=ffi.string(lib.ei_isa_name(level)).decode(), kv_type=plan.kv_type,
            kv_types=CpuBackend.kv_types, max_batch=plan.max_batch, n_vocab=model.cfg.n_vocab,
            n_threads=p.n_threads if p.n_threads > 0 else int(lib.ei_physical_cores()),
            kv_bytes=int(lib.ei_runtime_kv_bytes(self.handle)),
            scratch_bytes=int(lib.ei_runtime_scratch_bytes(self.handle)),
            packed_bytes=int(lib.ei_runtime_packed_bytes(self.handle)), profile_stages=PROFILE_STAGES,
            copy_prefix=True, state_bytes=int(lib.ei_runtime_state_bytes(self.handle)),
            recurrent_state=model.cfg.is_hybrid, state_snapshots=model.cfg.is_hybrid,
            max_snapshots=plan.n_snapshots if model.cfg.is_hybrid else 0, state_io=True, embeddings=True, lora=True)

    def forward(self, batch: Batch, logits: np.ndarray | None = None) -> np.ndarray:
        return self._run(lib.ei_forward, batch, logits, self.caps.n_vocab, "forward")

    def forward_hidden(self, batch: Batch, out: np.ndarray | None = None) -> np.ndarray:
        return self._run(lib.ei_forward_hidden, batch, out, self.model.cfg.n_embd, "forward_hidden")

    def _run(self, entry, batch: Batch, out: np.ndarray | None, width: int, what: str) -> np.ndarray:
        """One native forward writing `width` floats per output row into `out`."""
        n_out = batch.n_out
        if out is None:
            out = np.empty((n_out, width), dtype=np.float32)
        out_ptr = ffi.from_buffer("float[]", out) if n_out else ffi.NULL
        n_keep = len(batch.keep_rows)
        check(entry(self.handle, len(batch), _i32(batch.tokens), _i32(batch.slots), _i32(batch.pos),
                    _i32(batch.cells), n_out, _i32(batch.out_rows) if n_out else ffi.NULL, out_ptr,
                    n_keep, _i32(batch.keep_rows) if n_keep else ffi.NULL),
              what)
        return out[:n_out]

    def forward_topk(self, batch: Batch, k: int) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError("the CPU backend has no device top-k (caps.max_topk = 0)")

    def last_hidden(self, rows: np.ndarray) -> np.ndarray:
        """The final-normed hidden states of rows of the latest forward (the MTP block's input)."""
        out = np.empty((len(rows), self.model.cfg.n_embd), dtype=np.float32)
        if len(rows):
            check(lib.ei_runtime_last_hidden(self.handle, len(rows), _i32(rows), ffi.from_buffer("float[]", out)),
                  "last_hidden")
        return out

    def forward_nextn(self, batch: Batch, hidden: np.ndarray, logits: np.ndarray, states: np.ndarray) -> None:
        """One step of an MTP block's runtime: row i from batch.tokens[i] and hidden[i]; the output
        rows' logits and final-normed states."""
        n_out = batch.n_out
        hidden = np.ascontiguousarray(hidden, dtype=np.float32)
        if hidden.shape != (len(batch), self.model.cfg.n_embd):
            raise ValueError(f"hidden rows of shape {hidden.shape}, want {(len(batch), self.model.cfg.n_embd)}")
        if logits.shape != (n_out, self.caps.n_vocab) or states.shape != (n_out, self.model.cfg.n_embd):
            raise ValueError("forward_nextn: output arrays of the wrong shape")
        f32 = (lambda a: ffi.from_buffer("float[]", a)) if n_out else (lambda a: ffi.NULL)
        check(lib.ei_forward_nextn(self.handle, len(batch), _i32(batch.tokens), ffi.from_buffer("float[]", hidden),
                                   _i32(batch.slots), _i32(batch.pos), _i32(batch.cells), n_out,
                                   _i32(batch.out_rows) if n_out else ffi.NULL, f32(logits), f32(states)),
              "forward_nextn")

    def clear_slot(self, slot: int) -> None:
        check(lib.ei_runtime_clear_slot(self.handle, slot), "clear_slot")

    def forget_from(self, slot: int, pos: int) -> None:
        check(lib.ei_runtime_forget_from(self.handle, slot, pos), "forget_from")

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        check(lib.ei_runtime_copy_prefix(self.handle, src, dst, n), "copy_prefix")

    def restore_state(self, slot: int, n: int) -> None:
        check(lib.ei_runtime_restore_state(self.handle, slot, n), "restore_state")

    def drop_states(self, slot: int, ns: list[int]) -> None:
        for n in ns:
            check(lib.ei_runtime_drop_state(self.handle, slot, n), "drop_state")

    def slot_state_size(self, n: int) -> int:
        return int(lib.ei_runtime_slot_state_size(self.handle, n))

    def save_slot(self, slot: int, n: int) -> bytes:
        buf = bytearray(self.slot_state_size(n))
        check(lib.ei_runtime_save_slot(self.handle, slot, n, ffi.from_buffer(buf), len(buf)), "save_slot")
        return bytes(buf)

    def load_slot(self, slot: int, n: int, data: bytes) -> None:
        check(lib.ei_runtime_load_slot(self.handle, slot, n, ffi.from_buffer(data), len(data)), "load_slot")

    def add_adapter(self, weights: LoraWeights) -> NativeLora:
        return NativeLora(self.model, weights)

    def set_slot_adapters(self, slot: int, adapters: list[tuple[NativeLora, float]]) -> None:
        handles = ffi.new("ei_lora *[]", [h.handle for h, _ in adapters] or [ffi.NULL])
        scales = ffi.new("float[]", [float(s) for _, s in adapters] or [0.0])
        check(lib.ei_runtime_set_slot_loras(self.handle, slot, len(adapters), handles, scales), "set_slot_adapters")

    def profile(self, reset: bool = False) -> dict[str, float]:
        buf = ffi.new("double[]", len(PROFILE_STAGES))
        n = lib.ei_runtime_profile(self.handle, buf, len(PROFILE_STAGES), int(reset))
        return {name: float(buf[i]) for i, name in enumerate(PROFILE_STAGES[:n])}
