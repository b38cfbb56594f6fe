"""Model families: one table entry per architecture (see table.py and docs/architecture.md)."""
from .table import ARCHS, Arch, HeadDims, Tensor, Weight, arch_for_hf, get_arch

__all__ = ["ARCHS", "Arch", "HeadDims", "Tensor", "Weight", "arch_for_hf", "get_arch"]
