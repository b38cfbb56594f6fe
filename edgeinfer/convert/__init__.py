"""HF checkpoint -> GGUF (and GGUF -> quantized GGUF): hyperparameters and tensor names from the architecture table, LoRA
merge, quantization recipe and a streaming, atomic writer. Needs only numpy (and the native
quantizers)."""
from __future__ import annotations

from .converter import ConvertResult, compute_imatrix, convert_checkpoint
from .imatrix import Imatrix
from .recipe import FILE_TYPES
from .requantize import quantize_gguf

__all__ = ["convert_checkpoint", "compute_imatrix", "quantize_gguf", "ConvertResult", "FILE_TYPES",
           "Imatrix"]
