"""Where a forward step runs: the CPU (our native kernels) or CUDA, behind one protocol (base.py)."""
from __future__ import annotations

from .base import Backend, Batch, Capabilities, KVPlan, Runtime

__all__ = ["Backend", "Batch", "Capabilities", "KVPlan", "Runtime", "select_backend", "backend_for_model", "DEVICES"]

DEVICES = ("cpu", "auto", "cuda")


def select_backend(device: str = "cpu", *, n_threads: int | None = None, isa: str = "best") -> Backend:
    """The backend for `device`: "cpu"; "cuda" (the first CUDA device, or EdgeInferError saying why
    there is none); "auto" (CUDA when usable, else the CPU with one log line saying why).
    n_threads and isa configure the CPU kernels."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    from .cpu import CpuBackend

    if device == "cpu":
        return CpuBackend(n_threads, isa)
    from .cuda import CudaBackend, select_device

    kind, dev = select_device(device)   # device='cuda' without a usable GPU raises EdgeInferError
    return CudaBackend(dev) if kind == "cuda" else CpuBackend(n_threads, isa)


def backend_for_model(backend: Backend, device: str, cfg, *, n_threads: int | None = None,
                      isa: str = "best") -> Backend:
    """`backend`, or for device="auto" the CPU (with one log line saying why) where the chosen
    backend cannot run the model (CUDA: a hybrid's recurrent layers)."""
    why = getattr(backend, "unsupported", lambda _cfg: None)(cfg)
    if device != "auto" or not why:
        return backend
    import logging

    from .cpu import CpuBackend

    logging.getLogger("edgeinfer").info("device='auto': using the CPU (%s)", why)
    return CpuBackend(n_threads, isa)
