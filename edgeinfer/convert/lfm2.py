"""LFM2's config.json -> hyperparameters and GGUF metadata, as llama.cpp's converter writes them
(edgeinfer/arch/table.py's LFM2 entry describes the family): the layer kinds from layer_types
(written as head_count_kv per layer, 0 on a conv layer), the conv taps (shortconv.l_cache) and
the feed-forward width after the checkpoint's own adjustment (block_auto_adjust_ff_dim)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import ConversionError
from .arch import HParams

__all__ = ["Lfm2HParams", "adjusted_ff_dim"]

#: config.json's layer_types entries -> the table's layer kinds
_LAYER_TYPES = {"conv": "shortconv", "full_attention": "attention"}


def adjusted_ff_dim(ff_dim: int, auto_adjust: bool, multiplier: float | None, multiple_of: int) -> int:
    """The SwiGLU width LFM2's blocks use: with auto-adjust, 2/3 of the configured width, times
    the multiplier, rounded up to a multiple of `multiple_of` (transformers' Lfm2MLP)."""
    if not auto_adjust:
        return ff_dim
    ff = int(2 * ff_dim / 3)
    if multiplier is not None:
        ff = int(multiplier * ff)
    return multiple_of * ((ff + multiple_of - 1) // multiple_of)


@dataclass
class Lfm2HParams(HParams):
    conv_kernel: int = 0

    @classmethod
    def from_config(cls, config: dict, keep_mtp: bool = True) -> "Lfm2HParams":
        config = dict(config)
        for alias, key in (("block_ff_dim", "intermediate_size"), ("tie_embedding", "tie_word_embeddings")):
            if alias in config:        # older LFM2 config.json names (transformers reads both)
                config.setdefault(key, config[alias])
        if config.get("conv_bias"):
            raise ConversionError("config.json: conv_bias = true is not supported for lfm2 "
                                  "(llama.cpp's lfm2 has no conv bias)")
        hp = super().from_config(config)
        kinds = _layer_kinds(config, hp.n_layer)
        conv = config.get("conv_L_cache", 3)
        if not isinstance(conv, int) or isinstance(conv, bool) or not 2 <= conv <= 16:
            raise ConversionError(f"config.json: conv_L_cache = {conv!r} must be an integer in [2, 16]")
        multiple_of = config.get("block_multiple_of", 256)
        if not isinstance(multiple_of, int) or multiple_of <= 0:
            raise ConversionError(f"config.json: block_multiple_of = {multiple_of!r} must be a positive integer")
        n_ff = adjusted_ff_dim(hp.n_ff, bool(config.get("block_auto_adjust_ff_dim", True)),
                               config.get("block_ffn_dim_multiplier", 1.0), multiple_of)
        return dataclasses.replace(hp, layer_kinds=kinds, conv_kernel=conv, n_ff=n_ff)

    def metadata(self) -> list[tuple[str, object, str | None]]:
        """The common keys with head_count_kv per layer (INT32, 0 on a conv layer, as llama.cpp
        writes it), shortconv.l_cache, and no rope.dimension_count (llama.cpp writes none)."""
        key = self.arch.key
        kv_heads = [self.n_head_kv if k == "attention" else 0 for k in self.layer_kinds]
        out = []
        for k, v, vt in super().metadata():
            if k == key("rope_dim"):
                continue
            out.append((k, kv_heads, "INT32") if k == key("n_head_kv") else (k, v, vt))
        return out + [(key("conv_kernel"), self.conv_kernel, "UINT32")]


def _layer_kinds(config: dict, n_layer: int) -> tuple[str, ...]:
    """config.json's layer_types (else full_attn_idxs, as transformers derives them)."""
    types = config.get("layer_types")
    if types is None:
        idxs = config.get("full_attn_idxs")
        if idxs is None:
            idxs = range(n_layer)
        types = ["full_attention" if i in idxs else "conv" for i in range(n_layer)]
    if not isinstance(types, list) or len(types) != n_layer:
        raise ConversionError(f"config.json: layer_types must list {n_layer} layers (num_hidden_layers)")
    bad = [t for t in types if t not in _LAYER_TYPES]
    if bad:
        raise ConversionError(f"config.json: layer_types entry {bad[0]!r} is not supported "
                              f"(supported: {', '.join(_LAYER_TYPES)})")
    return tuple(_LAYER_TYPES[t] for t in types)
