"""GGUF value types and the GGML tensor type table (block layouts as GGUF stores them),
taken from the gguf package (llama.cpp's own Python package), plus what our reader adds:
names of removed type ids and the types our kernels compute with."""
from __future__ import annotations

from dataclasses import dataclass

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from ..errors import GGUFError

__all__ = [
    "GGMLType", "GGMLTypeInfo", "GGML_TYPES", "COMPUTE_TYPES", "ggml_type_info", "ggml_type_name",
    "GGUFValueType", "VALUE_TYPE_SIZES", "VALUE_TYPE_DTYPES",
]


#: GGML tensor type ids, as written in GGUF tensor infos (the gguf package's table).
GGMLType = GGMLQuantizationType


@dataclass(frozen=True)
class GGMLTypeInfo:
    """One GGML type: `block_size` elements are stored in `type_size` bytes."""

    id: int
    name: str
    block_size: int
    type_size: int


#: Every GGML type id we can read (size a tensor of), keyed by id.
GGML_TYPES: dict[int, GGMLTypeInfo] = {
    int(t): GGMLTypeInfo(int(t), t.name, bs, ts) for t, (bs, ts) in GGML_QUANT_SIZES.items()
}

#: The types edgeinfer kernels compute with.
COMPUTE_TYPES: frozenset[GGMLType] = frozenset({
    GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0,
    GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1,
    GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
    GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.IQ4_NL, GGMLType.IQ4_XS,
})

_REMOVED = {4: "Q4_2", 5: "Q4_3", 31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8",
            36: "IQ4_NL_4_4", 37: "IQ4_NL_4_8", 38: "IQ4_NL_8_8"}


def ggml_type_name(type_id: int) -> str:
    """The name of a GGML type id ('Q4_K'), or a description of an unknown one."""
    info = GGML_TYPES.get(type_id)
    if info is not None:
        return info.name
    if type_id in _REMOVED:
        return f"{_REMOVED[type_id]} (id {type_id}, removed from ggml)"
    return f"unknown type id {type_id}"


def ggml_type_info(type_id: int) -> GGMLTypeInfo:
    """The type table entry of `type_id`; GGUFError when the id is not a known GGML type."""
    info = GGML_TYPES.get(type_id)
    if info is None:
        raise GGUFError(f"GGML type {ggml_type_name(type_id)} is not a known tensor type")
    return info


#: Byte size of each fixed-size value type.
VALUE_TYPE_SIZES: dict[GGUFValueType, int] = {
    GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.BOOL: 1,
    GGUFValueType.UINT16: 2, GGUFValueType.INT16: 2,
    GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4,
    GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8,
}

#: Little-endian numpy dtype string of each fixed-size value type.
VALUE_TYPE_DTYPES: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1", GGUFValueType.BOOL: "<u1",
    GGUFValueType.UINT16: "<u2", GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4", GGUFValueType.FLOAT32: "<f4",
    GGUFValueType.UINT64: "<u8", GGUFValueType.INT64: "<i8", GGUFValueType.FLOAT64: "<f8",
}

INT_VALUE_TYPES = frozenset({
    GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
    GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64,
})
FLOAT_VALUE_TYPES = frozenset({GGUFValueType.FLOAT32, GGUFValueType.FLOAT64})
