"""GGUF: the validated memory-mapped reader and the GGML type table."""
from .reader import DEFAULT_ALIGNMENT, GGUF_MAGIC, SUPPORTED_VERSIONS, GGUFFile, TensorInfo
from .types import (
    COMPUTE_TYPES,
    GGML_TYPES,
    GGMLType,
    GGMLTypeInfo,
    GGUFValueType,
    ggml_type_info,
    ggml_type_name,
)

__all__ = [
    "GGUFFile", "TensorInfo", "GGUF_MAGIC", "SUPPORTED_VERSIONS", "DEFAULT_ALIGNMENT",
    "GGMLType", "GGMLTypeInfo", "GGML_TYPES", "COMPUTE_TYPES", "GGUFValueType",
    "ggml_type_info", "ggml_type_name",
]
