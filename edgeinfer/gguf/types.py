"""GGUF value types and the GGML tensor type table (block layouts as GGUF stores them)."""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from ..errors import GGUFError

__all__ = [
    "GGMLType", "GGMLTypeInfo", "GGML_TYPES", "COMPUTE_TYPES", "ggml_type_info", "ggml_type_name",
    "GGUFValueType", "VALUE_TYPE_SIZES", "VALUE_TYPE_DTYPES",
]


class GGMLType(IntEnum):
    """GGML tensor type ids, as written in GGUF tensor infos."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    # 4, 5 (Q4_2, Q4_3) were removed from ggml
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    # 31..33 (Q4_0_4_4, Q4_0_4_8, Q4_0_8_8) were removed from ggml
    TQ1_0 = 34
    TQ2_0 = 35
    # 36..38 (IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8) were removed from ggml
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41


@dataclass(frozen=True)
class GGMLTypeInfo:
    """One GGML type: `block_size` elements are stored in `type_size` bytes."""

    id: int
    name: str
    block_size: int
    type_size: int


# (block elements, block bytes) per type.
_SIZES: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4),
    GGMLType.F16: (1, 2),
    GGMLType.Q4_0: (32, 2 + 16),
    GGMLType.Q4_1: (32, 2 + 2 + 16),
    GGMLType.Q5_0: (32, 2 + 4 + 16),
    GGMLType.Q5_1: (32, 2 + 2 + 4 + 16),
    GGMLType.Q8_0: (32, 2 + 32),
    GGMLType.Q8_1: (32, 4 + 4 + 32),
    GGMLType.Q2_K: (256, 2 + 2 + 256 // 16 + 256 // 4),
    GGMLType.Q3_K: (256, 2 + 256 // 4 + 256 // 8 + 12),
    GGMLType.Q4_K: (256, 2 + 2 + 256 // 2 + 12),
    GGMLType.Q5_K: (256, 2 + 2 + 256 // 2 + 256 // 8 + 12),
    GGMLType.Q6_K: (256, 2 + 256 // 16 + 3 * 256 // 4),
    GGMLType.Q8_K: (256, 4 + 256 + 256 // 8),
    GGMLType.IQ2_XXS: (256, 2 + 256 // 4),
    GGMLType.IQ2_XS: (256, 2 + 256 // 4 + 256 // 32),
    GGMLType.IQ3_XXS: (256, 2 + 256 // 4 + 256 // 8),
    GGMLType.IQ1_S: (256, 2 + 256 // 8 + 256 // 16),
    GGMLType.IQ4_NL: (32, 2 + 16),
    GGMLType.IQ3_S: (256, 2 + 256 // 4 + 256 // 8 + 256 // 32 + 4),
    GGMLType.IQ2_S: (256, 2 + 256 // 4 + 256 // 16),
    GGMLType.IQ4_XS: (256, 2 + 2 + 256 // 2 + 256 // 64),
    GGMLType.I8: (1, 1),
    GGMLType.I16: (1, 2),
    GGMLType.I32: (1, 4),
    GGMLType.I64: (1, 8),
    GGMLType.F64: (1, 8),
    GGMLType.IQ1_M: (256, 256 // 8 + 256 // 16 + 256 // 32),
    GGMLType.BF16: (1, 2),
    GGMLType.TQ1_0: (256, 2 + 4 * 13),
    GGMLType.TQ2_0: (256, 2 + 64),
    GGMLType.MXFP4: (32, 1 + 16),
    GGMLType.NVFP4: (64, 4 + 32),
    GGMLType.Q1_0: (128, 2 + 16),
}

#: Every GGML type id we can read (size a tensor of), keyed by id.
GGML_TYPES: dict[int, GGMLTypeInfo] = {
    int(t): GGMLTypeInfo(int(t), t.name, bs, ts) for t, (bs, ts) in _SIZES.items()
}

#: The types edgeinfer kernels compute with.
COMPUTE_TYPES: frozenset[GGMLType] = frozenset({
    GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0,
    GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1,
    GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
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


class GGUFValueType(IntEnum):
    """Metadata value types of GGUF key/value pairs."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


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
