"""Python side of quantization: float32 rows -> GGUF block bytes through the native
quantizers (native/src/quantize.c)."""
from __future__ import annotations

import numpy as np

from ..errors import EdgeInferError
from ..gguf.types import GGMLType, ggml_type_name

__all__ = ["QUANTIZABLE_TYPES", "IMPORTANCE_TYPES", "quantize", "dequantize", "row_nbytes", "can_quantize"]

#: Types the native quantizer can produce.
QUANTIZABLE_TYPES = frozenset({
    GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1,
    GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
})
#: Types whose quantizer weighs each column's error by an importance vector (the rest ignore it).
IMPORTANCE_TYPES = frozenset({GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1,
                              GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K})
_BLOCK = {GGMLType.F32: 1, GGMLType.F16: 1, GGMLType.BF16: 1, GGMLType.Q4_K: 256,
          GGMLType.Q5_K: 256, GGMLType.Q6_K: 256}


def block_elems(type_id: int) -> int:
    return _BLOCK.get(GGMLType(type_id), 32)


def can_quantize(type_id: int, n_cols: int) -> bool:
    """Whether rows of n_cols elements can be stored as type_id."""
    return int(type_id) in QUANTIZABLE_TYPES and n_cols > 0 and n_cols % block_elems(type_id) == 0


def row_nbytes(type_id: int, n_cols: int) -> int:
    from .._native import check, ffi, lib

    out = ffi.new("int64_t *")
    check(lib.ei_quantize_row_bytes(int(type_id), int(n_cols), out), "ei_quantize_row_bytes")
    return int(out[0])


def quantize(x: np.ndarray, type_id: int, n_threads: int = 0,
             importance: np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Quantizes a float array (rows = last axis) to `type_id`; returns uint8 bytes with shape
    (rows, row_bytes), written into `out` when given (a C-contiguous uint8 array of that
    shape). Values are converted to float32 first. `importance` (one finite value
    >= 0 per column, an importance matrix's mean squared activation) weights each column's
    rounding error as llama.cpp's quantizer does (every type but Q8_0 and the float types)."""
    from .._native import check, ffi, lib

    type_id = int(type_id)
    if type_id not in QUANTIZABLE_TYPES:
        raise EdgeInferError(f"cannot quantize to {ggml_type_name(type_id)}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    n_cols = int(x.shape[-1]) if x.ndim else 1
    n_rows = x.size // n_cols if n_cols else 0
    if not can_quantize(type_id, n_cols):
        raise EdgeInferError(f"rows of {n_cols} elements cannot be stored as "
                             f"{ggml_type_name(type_id)} (block size {block_elems(type_id)})")
    qw = ffi.NULL
    if importance is not None:
        importance = np.ascontiguousarray(importance, dtype=np.float32).reshape(-1)
        if importance.size != n_cols:
            raise EdgeInferError(f"an importance vector of {importance.size} values for rows of "
                                 f"{n_cols} elements")
        qw = ffi.from_buffer("float[]", importance)
    rb = row_nbytes(type_id, n_cols)
    if out is None:
        out = np.empty((n_rows, rb), dtype=np.uint8)
    elif out.dtype != np.uint8 or out.shape != (n_rows, rb) or not out.flags.c_contiguous:
        raise EdgeInferError(f"out must be a C-contiguous uint8 array of shape {(n_rows, rb)}")
    check(lib.ei_quantize_rows(type_id, ffi.from_buffer("float[]", x), ffi.from_buffer(out),
                               n_rows, n_cols, qw, int(n_threads)), "ei_quantize_rows")
    return out


def dequantize(q: np.ndarray, type_id: int, n_cols: int) -> np.ndarray:
    """The float32 values of `quantize`'s output `q` (rows of n_cols elements)."""
    from .._native import dequantize as rows

    q = np.ascontiguousarray(q, dtype=np.uint8)
    return rows(q, type_id, q.shape[0] if q.ndim > 1 else 1, n_cols)
