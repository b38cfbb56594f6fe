"""The only door into native code: the cffi module plus error translation."""
from __future__ import annotations

from .errors import NativeError

try:
    from ._native_ext import ffi, lib
except ImportError as exc:  # pragma: no cover - a broken install
    raise ImportError(
        "edgeinfer's native library is not built; reinstall with `pip install -e .` "
        f"(needs a C compiler): {exc}"
    ) from exc

__all__ = ["ffi", "lib", "check", "last_error"]


def last_error() -> str:
    return ffi.string(lib.ei_last_error()).decode("utf-8", "replace")


def check(status: int, what: str = "native call") -> None:
    """Turns a non-zero ei_status into a NativeError carrying the C message."""
    if status != lib.EI_OK:
        raise NativeError(f"{what} failed (status {status}): {last_error()}")
