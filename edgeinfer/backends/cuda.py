"""The CUDA backend, loaded at run time: libedgeinfer_cuda.so through cffi's ABI mode.

CPU-only installs never build or link CUDA. This module finds the library
($EDGEINFER_CUDA_LIB, else the package data edgeinfer/libedgeinfer_cuda.so, where the
install and scripts/build_cuda.sh put it), asks it for devices (`select_device`), and
implements the Backend protocol (backends/base.py) with CudaBackend / CudaRuntime.
"""
from __future__ import annotations

import importlib.resources
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._native import check as _check
from ..arch.table import NATIVE_LAYER_KINDS
from ..errors import EdgeInferError, UnsupportedArchitectureError
from ..model.lora import AdapterError, LoraWeights, check_pairs, role_pairs
from .base import Batch, Capabilities, KVPlan, require_kv_type
from .cdefs import cdef_from_header

log = logging.getLogger("edgeinfer")

LIB_NAME = "libedgeinfer_cuda.so"

# The C API as cffi declarations, parsed from the headers the library is built from: the build
# (CMakeLists.txt) copies them and the role list edgeinfer_roles.h expands (cdefs.LAYOUT_DEF)
# into backends/include/ (tests/test_cuda.py checks the copies).
HEADERS = tuple(Path(__file__).with_name("include") / h
                for h in ("edgeinfer_roles.h", "edgeinfer.h", "edgeinfer_cuda.h"))


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    integrated: bool
    total_bytes: int
    free_bytes: int
    driver_version: int
    runtime_version: int

    def describe(self) -> str:
        return (f"{self.name} (sm_{self.compute_capability[0]}{self.compute_capability[1]}, "
                f"{self.free_bytes / 2**30:.1f} of {self.total_bytes / 2**30:.1f} GiB free"
                f"{', integrated memory' if self.integrated else ''})")


@dataclass
class _Loaded:
    ffi: object = None
    lib: object = None
    path: str = ""
    reason: str = ""


_lock = threading.Lock()
_loaded: _Loaded | None = None


def library_candidates() -> list[Path]:
    env = os.environ.get("EDGEINFER_CUDA_LIB")
    if env:
        return [Path(env)]
    return [Path(str(importlib.resources.files("edgeinfer"))) / LIB_NAME]


def load_library() -> tuple[object, object] | tuple[None, str]:
    """(ffi, lib) of the CUDA library, or (None, reason) when it is absent or will not load. Cached."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _load()
        if _loaded.lib is None:
            return None, _loaded.reason
        return _loaded.ffi, _loaded.lib


def _load() -> _Loaded:
    try:
        import cffi
    except ImportError as exc:  # pragma: no cover - cffi is a dependency
        return _Loaded(reason=f"cffi is missing: {exc}")
    paths = library_candidates()
    found = [p for p in paths if p.is_file()]
    if not found:
        where = ", ".join(str(p) for p in paths)
        return _Loaded(reason=f"the CUDA backend is not built ({LIB_NAME} not found at {where}; "
                              "EDGEINFER_CUDA=1 pip install . or scripts/build_cuda.sh builds it; needs nvcc)")
    ffi = cffi.FFI()
    for header in HEADERS:
        ffi.cdef(cdef_from_header(header))
    try:
        lib = ffi.dlopen(str(found[0]))
    except OSError as exc:
        return _Loaded(reason=f"cannot load {found[0]}: {exc}")
    return _Loaded(ffi=ffi, lib=lib, path=str(found[0]))


def last_error(lib, ffi) -> str:
    return ffi.string(lib.ei_cuda_last_error()).decode("utf-8", "replace")


def check(status: int, what: str) -> None:
    """A non-zero ei_status of the CUDA library as the same NativeError subclass the CPU one raises."""
    if status != 0:
        ffi, lib = load_library()
        _check(status, f"CUDA {what}", lambda: last_error(lib, ffi))


def probe() -> tuple[list[DeviceInfo], str]:
    """(devices, reason): the CUDA devices usable here, or [] and why there are none."""
    ffi, lib = load_library()
    if ffi is None:
        return [], lib  # lib holds the reason
    n = lib.ei_cuda_device_count()
    if n < 0:
        return [], last_error(lib, ffi)
    devices = []
    for i in range(n):
        info = ffi.new("ei_cuda_device_info *")
        if lib.ei_cuda_get_device_info(i, info) != 0:
            return [], f"device {i}: {last_error(lib, ffi)}"
        devices.append(DeviceInfo(
            index=i, name=ffi.string(info.name).decode("utf-8", "replace"),
            compute_capability=(int(info.cc_major), int(info.cc_minor)), sm_count=int(info.sm_count),
            integrated=bool(info.integrated), total_bytes=int(info.total_bytes), free_bytes=int(info.free_bytes),
            driver_version=int(info.driver_version), runtime_version=int(info.runtime_version)))
    return devices, ""


def select_device(device: str) -> tuple[str, DeviceInfo | str]:
    """The engine's one decision: ("cuda", DeviceInfo) or ("cpu", reason).

    device="cpu": CPU. device="cuda": the first CUDA device, or EdgeInferError naming why
    there is none. device="auto": CUDA when usable, else CPU with one log line saying why.
    """
    if device == "cpu":
        return "cpu", "device='cpu' requested"
    if device not in ("auto", "cuda"):
        raise ValueError(f"device must be one of ('cpu', 'auto', 'cuda'), got {device!r}")
    devices, reason = probe()
    if devices:
        return "cuda", devices[0]
    if device == "cuda":
        raise EdgeInferError(f"device='cuda' but CUDA is not available: {reason}")
    log.info("device='auto': using the CPU (%s)", reason)
    return "cpu", reason


# ---------------------------------------------------------------------------- the backend
class CudaBackend:
    name = "cuda"
    kv_types = ("f16",)

    def __init__(self, device: DeviceInfo):
        self.device = device

    def describe(self) -> str:
        return self.device.describe()

    @staticmethod
    def unsupported(cfg) -> str | None:
        """Why the CUDA forward cannot run `cfg`, or None: it runs every native layer kind of the
        trunk (attention, LFM2's short convolutions, Qwen3.5's Gated DeltaNet; an MTP head after
        the trunk is the proposer's, not the forward's)."""
        trunk = (getattr(cfg, "layer_kinds", ()) or ())[:cfg.n_layer]
        kinds = sorted(set(trunk) - set(NATIVE_LAYER_KINDS))
        if kinds:
            return (f"the CUDA forward has no {' / '.join(kinds)} layers yet ({cfg.arch}); "
                    f"run it with device='cpu'")
        return None

    def create_runtime(self, gguf, cfg, plan: KVPlan) -> "CudaRuntime":
        why = self.unsupported(cfg)
        if why:
            raise UnsupportedArchitectureError(why)
        require_kv_type(self, plan)
        # Weights go to the device; on integrated memory the host pages are dropped.
        return CudaRuntime(gguf, cfg, plan, device=self.device, drop_host_pages=self.device.integrated)


class CudaRuntime:
    """The Runtime protocol on a CUDA device: weights copied once, the KV ring in device memory."""

    MAX_TOPK = 256          # the largest k of topk() (EIC_TOPK_MAX)

    def __init__(self, gguf, cfg, plan: KVPlan, *, device: DeviceInfo | None = None, use_graphs: bool = True,
                 drop_host_pages: bool = False):
        from ..model.native_model import c_role, fill_config, model_tensors

        ffi, lib = load_library()
        if ffi is None:
            raise EdgeInferError(f"CUDA backend unavailable: {lib}")
        self.ffi, self.lib = ffi, lib
        self.device = device
        self.cfg = cfg
        c = ffi.new("ei_model_config *")
        fill_config(c, cfg)
        items = []
        keep = []
        ple_role = c_role("per_layer_token_embd")
        for layer, role, info in model_tensors(gguf, cfg, plan.n_ctx):
            buf = ffi.from_buffer(info.data)
            keep.append(buf)
            if int(role) == ple_role:
                # Gemma 4's per-layer table is not uploaded: each step reads its tokens' rows from the
                # file mapping (ei_cuda_runtime's ple_host), which must outlive the runtime.
                self._host_tables = (gguf, buf)
            items.append((layer, int(role), int(info.type), int(info.shape[0]),
                          int(info.shape[1]) if len(info.shape) > 1 else 1, buf))
        tensors = ffi.new("ei_cuda_tensor[]", max(1, len(items)))
        for i, (layer, role, typ, ne0, ne1, buf) in enumerate(items):
            t = tensors[i]
            t.layer, t.role, t.type, t.ne0, t.ne1 = layer, role, typ, ne0, ne1
            t.data = ffi.cast("const void *", buf)
        p = ffi.new("ei_cuda_params *")
        p.device = device.index if device else 0
        p.n_slots, p.n_ctx, p.max_batch = plan.n_slots, plan.cells, plan.max_batch
        p.n_sink, p.slide_window = plan.n_sink, plan.slide_window
        p.use_graphs, p.drop_host_pages = int(use_graphs), int(drop_host_pages)
        p.n_snapshots = plan.n_snapshots
        sizes = ffi.new("ei_cuda_sizes *")
        out = ffi.new("ei_cuda_runtime **")
        check(lib.ei_cuda_runtime_create(c, tensors, len(items), p, sizes, out), "runtime_create")
        self.handle = ffi.gc(out[0], lib.ei_cuda_runtime_free)
        cc = device.compute_capability if device else (0, 0)
        hybrid = bool(cfg.is_hybrid)
        self.caps = Capabilities(
            device="cuda", isa=f"cuda sm_{cc[0]}{cc[1]}", kv_type=plan.kv_type, kv_types=CudaBackend.kv_types,
            max_batch=plan.max_batch, n_vocab=cfg.n_vocab, max_topk=self.MAX_TOPK, kv_bytes=int(sizes.kv),
            state_bytes=int(sizes.state), scratch_bytes=int(sizes.scratch), device_bytes=int(sizes.weights),
            copy_prefix=True,
            recurrent_state=hybrid, state_snapshots=hybrid, max_snapshots=plan.n_snapshots if hybrid else 0,
            lora=True)

    def _i32(self, arr: np.ndarray):
        return self.ffi.from_buffer("int32_t[]", arr)

    def _run(self, batch: Batch, logits: np.ndarray | None) -> None:
        n_out, n_keep = batch.n_out, len(batch.keep_rows)
        out_ptr = self.ffi.from_buffer("float[]", logits) if n_out and logits is not None else self.ffi.NULL
        check(self.lib.ei_cuda_forward(self.handle, len(batch), self._i32(batch.tokens), self._i32(batch.slots),
                                       self._i32(batch.pos), self._i32(batch.cells), n_out,
                                       self._i32(batch.out_rows) if n_out else self.ffi.NULL, out_ptr,
                                       n_keep, self._i32(batch.keep_rows) if n_keep else self.ffi.NULL), "forward")

    def forward(self, batch: Batch, logits: np.ndarray | None = None) -> np.ndarray:
        if logits is None:
            logits = np.empty((batch.n_out, self.caps.n_vocab), dtype=np.float32)
        self._run(batch, logits)
        return logits[:batch.n_out]

    def forward_topk(self, batch: Batch, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The logits stay on the device: only n_out x k candidates come back."""
        self._run(batch, None)
        return self.topk(batch.n_out, k)

    def argmax(self, n_out: int) -> np.ndarray:
        """Argmax of each logits row of the last forward, computed on the device."""
        out = np.empty(n_out, dtype=np.int32)
        check(self.lib.ei_cuda_argmax(self.handle, n_out, self._i32(out)), "argmax")
        return out

    def topk(self, n_out: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids int32 [n_out, k], vals float32 [n_out, k]): the k largest logits of each row of the
        last forward, computed on the device; value descending, ties to the lower id, NaN as -inf."""
        ids = np.empty((n_out, k), dtype=np.int32)
        vals = np.empty((n_out, k), dtype=np.float32)
        check(self.lib.ei_cuda_topk(self.handle, n_out, k, self._i32(ids), self.ffi.from_buffer("float[]", vals)),
              "topk")
        return ids, vals

    def clear_slot(self, slot: int) -> None:
        check(self.lib.ei_cuda_clear_slot(self.handle, slot), "clear_slot")

    def forget_from(self, slot: int, pos: int) -> None:
        check(self.lib.ei_cuda_forget_from(self.handle, slot, pos), "forget_from")

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        check(self.lib.ei_cuda_copy_prefix(self.handle, src, dst, n), "copy_prefix")

    def restore_state(self, slot: int, n: int) -> None:
        check(self.lib.ei_cuda_restore_state(self.handle, slot, n), "restore_state")

    def drop_states(self, slot: int, ns: list[int]) -> None:
        for n in ns:
            check(self.lib.ei_cuda_drop_state(self.handle, slot, n), "drop_state")

    def add_adapter(self, weights: LoraWeights) -> CudaLora:
        return CudaLora(self, weights)

    def set_slot_adapters(self, slot: int, adapters: list[tuple[CudaLora, float]]) -> None:
        ffi = self.ffi
        for h, _ in adapters:
            if not isinstance(h, CudaLora) or h.runtime is not self:
                raise EdgeInferError("set_slot_adapters: an adapter handle of another runtime")
        handles = ffi.new("ei_cuda_lora *[]", [h.handle for h, _ in adapters] or [ffi.NULL])
        scales = ffi.new("float[]", [float(s) for _, s in adapters] or [0.0])
        check(self.lib.ei_cuda_runtime_set_slot_loras(self.handle, slot, len(adapters), handles, scales),
              "set_slot_adapters")

    def profile(self, reset: bool = False) -> dict[str, float]:
        return {}


class CudaLora:
    """An adapter's pairs copied to the device of one CudaRuntime (the host arrays are not kept)."""

    def __init__(self, runtime: CudaRuntime, weights: LoraWeights):
        check_pairs(weights, runtime.cfg)
        self.weights = weights
        self.runtime = runtime   # set_slot_adapters takes handles of this runtime only
        ffi, lib = runtime.ffi, runtime.lib
        out = ffi.new("ei_cuda_lora **")
        check(lib.ei_cuda_lora_create(runtime.handle, out), "lora_create")
        self.handle = ffi.gc(out[0], lib.ei_cuda_lora_free)
        for name, layer, role, a, b in role_pairs(weights, runtime.cfg):
            st = lib.ei_cuda_lora_set(self.handle, layer, role, a.shape[0], ffi.from_buffer("float[]", a),
                                      ffi.from_buffer("float[]", b))
            if st == lib.EI_ERR_UNSUPPORTED:   # a tensor the CUDA forward does not adapt: the adapter's fault
                raise AdapterError(f"adapter {weights.path}: {name!r}: {last_error(lib, ffi)}")
            check(st, f"adapter tensor {name}")

    @property
    def nbytes(self) -> int:
        return int(self.runtime.lib.ei_cuda_lora_bytes(self.handle))
