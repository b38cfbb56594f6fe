"""HF checkpoint -> GGUF: hyperparameters and tensor names from the architecture table, LoRA
merge, quantization recipe and a streaming, atomic writer. Needs only numpy (and the native
quantizers)."""
from __future__ import annotations

from .converter import ConvertResult, convert_checkpoint
from .recipe import FILE_TYPES

__all__ = ["convert_checkpoint", "ConvertResult", "FILE_TYPES"]
