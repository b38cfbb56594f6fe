"""The only door into native code: the cffi module plus error translation."""
from __future__ import annotations

from typing import Callable

from .errors import (InvalidArgumentError, NativeError, NativeOutOfMemoryError, NativeUnsupportedError,
                     RangeError, StateError)

try:
    from ._native_ext import ffi, lib
except ImportError as exc:  # pragma: no cover - a broken install
    raise ImportError(
        "edgeinfer's native library is not built; reinstall with `pip install -e .` "
        f"(needs a C compiler): {exc}"
    ) from exc

__all__ = ["ffi", "lib", "check", "last_error", "error_class", "dequantize"]

# One exception per ei_status. The CUDA library returns the same enum (edgeinfer_cuda.h).
_ERRORS: dict[int, type[NativeError]] = {
    lib.EI_ERR_INVALID_ARG: InvalidArgumentError,
    lib.EI_ERR_OUT_OF_MEMORY: NativeOutOfMemoryError,
    lib.EI_ERR_UNSUPPORTED: NativeUnsupportedError,
    lib.EI_ERR_RANGE: RangeError,
    lib.EI_ERR_STATE: StateError,
}


def last_error() -> str:
    return ffi.string(lib.ei_last_error()).decode("utf-8", "replace")


def error_class(status: int) -> type[NativeError]:
    """The exception of an ei_status (plain NativeError for a code this build does not know)."""
    return _ERRORS.get(int(status), NativeError)


def check(status: int, what: str = "native call", message: Callable[[], str] = last_error) -> None:
    """Turns a non-zero ei_status into its NativeError subclass carrying the C message.

    `message` reads the failing library's thread-local error text (the CUDA backend passes its own)."""
    if status != lib.EI_OK:
        raise error_class(status)(f"{what} failed (status {status}): {message()}")


def dequantize(data, type_id: int, n_rows: int, n_cols: int):
    """Rows of a GGUF type's blocks (any buffer of their bytes) as float32 [n_rows, n_cols]:
    block types through the scalar reference (ggml's arithmetic, bit for bit), F16 and BF16,
    which widen exactly on any instruction set, through the CPU's fastest kernel."""
    import numpy as np

    out = np.empty((n_rows, n_cols), dtype=np.float32)
    if int(type_id) == lib.EI_TYPE_F32:
        out[...] = np.frombuffer(data, dtype=np.float32, count=n_rows * n_cols).reshape(n_rows, n_cols)
        return out
    isa = lib.EI_ISA_BEST if int(type_id) in (lib.EI_TYPE_F16, lib.EI_TYPE_BF16) else lib.EI_ISA_SCALAR
    check(lib.ei_kernel_dequantize(int(type_id), isa, ffi.from_buffer(data),
                                   ffi.from_buffer("float[]", out), n_rows * n_cols), "ei_kernel_dequantize")
    return out
