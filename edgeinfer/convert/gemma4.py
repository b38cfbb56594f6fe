"""Gemma 4's config.json -> hyperparameters and GGUF metadata, as llama.cpp's converter writes
them (edgeinfer/arch/gemma4.py describes the family); refuses what neither runtime implements."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..arch import Arch, arch_for_hf
from ..arch.gemma4 import Gemma4Dims, kv_source_layer
from ..errors import ConversionError
from .arch import HParams

__all__ = ["Gemma4HParams"]

_TYPES = {"sliding_attention": True, "full_attention": False}


@dataclass
class Gemma4HParams(HParams, Gemma4Dims):
    head_dim_swa: int = 0
    n_ff_layers: tuple[int, ...] = ()
    local_layers: frozenset[int] = frozenset()
    n_kv_shared: int = 0
    n_embd_per_layer: int = 0
    rope_dim_swa: int = 0
    rotated_pairs_full: int = 0      # proportional RoPE: pairs of the full layers that turn

    @property
    def rope_dim(self) -> int:       # full layers: the whole head (rope_freqs stops the rest)
        return self.head_dim

    @property
    def has_rope_freqs(self) -> bool:
        return True

    @classmethod
    def from_config(cls, config: dict, keep_mtp: bool = True) -> "Gemma4HParams":
        arch, hf_class = arch_for_hf(config)
        if isinstance(config.get("text_config"), dict):   # Gemma4ForConditionalGeneration: its text model
            config = {**config, **config["text_config"]}
        return cls.from_gemma4(config, arch, hf_class)

    @classmethod
    def from_gemma4(cls, config: dict, arch: Arch, hf_class: str) -> "Gemma4HParams":
        def need(key: str, kind=int):
            v = config.get(key)
            if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ConversionError(f"config.json: {key!r} = {v!r} is missing or not a number")
            return kind(v)

        for key in ("attention_k_eq_v", "enable_moe_block", "attention_bias"):
            if config.get(key):
                raise ConversionError(f"config.json: {key} = true is not supported for gemma4")
        if config.get("use_bidirectional_attention") == "all":
            raise ConversionError("config.json: use_bidirectional_attention = 'all' is not supported")
        act = config.get("hidden_activation", "gelu_pytorch_tanh")
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ConversionError(f"config.json: hidden_activation {act!r} is not supported (gelu_pytorch_tanh only)")
        n_layer = need("num_hidden_layers")
        types = config.get("layer_types")
        if not isinstance(types, list) or len(types) != n_layer or any(t not in _TYPES for t in types):
            raise ConversionError(f"config.json: layer_types must list {n_layer} sliding_attention / "
                                  f"full_attention entries")
        local = frozenset(i for i, t in enumerate(types) if _TYPES[t])
        head_swa = need("head_dim")
        head_full = config.get("global_head_dim")
        for i, lc in (config.get("per_layer_config") or {}).items():
            if head_full is None and not _TYPES[types[int(i)]] and "head_dim" in lc:
                head_full = lc["head_dim"]
            if "num_key_value_heads" in lc:
                raise ConversionError("config.json: per-layer num_key_value_heads is not supported")
        if not isinstance(head_full, int):
            raise ConversionError("config.json: global_head_dim (the full layers' head size) is missing")
        n_shared = int(config.get("num_kv_shared_layers") or 0)
        first = n_layer - n_shared
        if n_shared:
            if first < 2:
                raise ConversionError(f"config.json: num_kv_shared_layers {n_shared} leaves fewer than two "
                                      f"layers that store KV")
            for i in range(first, n_layer):   # transformers' source: the last earlier layer of the type
                want = max(j for j in range(first) if (j in local) == (i in local))
                if kv_source_layer(i, n_layer, n_shared, i in local) != want:
                    raise ConversionError(
                        f"config.json: layer {i} shares the KV of layer {want}, but the GGUF (as llama.cpp "
                        f"reads it) can only name the last two layers that store KV, full last")
        n_ff = need("intermediate_size")
        n_ff_layers = tuple(n_ff * (2 if i >= first else 1) for i in range(n_layer)) \
            if config.get("use_double_wide_mlp") else ()
        rp = config.get("rope_parameters") or {}
        full, swa = rp.get("full_attention") or {}, rp.get("sliding_attention") or {}
        if full.get("rope_type", "default") not in ("proportional", "default") or \
                swa.get("rope_type", "default") != "default":
            raise ConversionError(f"config.json: rope_parameters {rp} are not supported "
                                  f"(full: proportional or default; sliding: default)")
        partial_full = float(full.get("partial_rotary_factor", 1.0))
        partial_swa = float(swa.get("partial_rotary_factor", 1.0))
        n_pl = int(config.get("hidden_size_per_layer_input") or 0)
        n_vocab = need("vocab_size")
        if n_pl and int(config.get("vocab_size_per_layer_input") or n_vocab) != n_vocab:
            raise ConversionError("config.json: vocab_size_per_layer_input != vocab_size is not supported")
        cap = config.get("final_logit_softcapping")
        n_head = need("num_attention_heads")
        n_head_kv = int(config.get("num_key_value_heads") or n_head)
        if n_head % n_head_kv:
            raise ConversionError(f"config.json: num_attention_heads ({n_head}) is not a multiple of "
                                  f"num_key_value_heads ({n_head_kv})")
        return cls(
            arch=arch, hf_class=hf_class, n_layer=n_layer, n_embd=need("hidden_size"),
            n_ff=max(n_ff_layers) if n_ff_layers else n_ff, n_head=n_head, n_head_kv=n_head_kv,
            head_dim=head_full, n_vocab=n_vocab, n_ctx=int(config.get("max_position_embeddings") or 4096),
            rms_eps=float(config.get("rms_norm_eps", 1e-6)), rope_theta=float(full.get("rope_theta", 1e6)),
            rope_scaling={"rope_type": "default"}, tied_output=bool(config.get("tie_word_embeddings", True)),
            swa_window=need("sliding_window"), rope_theta_local=float(swa.get("rope_theta", 10000.0)),
            final_softcap=float(cap) if cap else 0.0,
            head_dim_swa=head_swa, n_ff_layers=n_ff_layers, local_layers=local, n_kv_shared=n_shared,
            n_embd_per_layer=n_pl, rope_dim_swa=int(head_swa * partial_swa),
            rotated_pairs_full=int(head_full * partial_full / 2))

    def metadata(self) -> list[tuple[str, object, str | None]]:
        key = self.arch.key
        n_ff = (key("n_ff"), list(self.n_ff_layers), "UINT32") if self.n_ff_layers else (key("n_ff"), self.n_ff, "UINT32")
        kv = [
            (key("n_layer"), self.n_layer, "UINT32"), (key("n_ctx_train"), self.n_ctx, "UINT32"),
            (key("n_embd"), self.n_embd, "UINT32"), n_ff,
            (key("n_head"), self.n_head, "UINT32"), (key("n_head_kv"), self.n_head_kv, "UINT32"),
            (key("rope_theta"), self.rope_theta, "FLOAT32"), (key("rope_theta_local"), self.rope_theta_local, "FLOAT32"),
            (key("rms_eps"), self.rms_eps, "FLOAT32"),
            (key("head_dim"), self.head_dim, "UINT32"), (key("value_dim"), self.head_dim, "UINT32"),
            (key("swa_window"), self.swa_window, "UINT32"),
            (key("n_kv_shared"), self.n_kv_shared, "UINT32"),
            (key("n_embd_per_layer"), self.n_embd_per_layer, "UINT32"),
            (key("swa_pattern"), [i in self.local_layers for i in range(self.n_layer)], "BOOL"),
            (key("head_dim_swa"), self.head_dim_swa, "UINT32"), (key("value_dim_swa"), self.head_dim_swa, "UINT32"),
            (key("rope_dim"), self.head_dim, "UINT32"), (key("rope_dim_swa"), self.rope_dim_swa, "UINT32"),
        ]
        if self.final_softcap:
            kv.append((key("final_softcap"), self.final_softcap, "FLOAT32"))
        return kv

    def computed_tensors(self) -> list[tuple[str, np.ndarray]]:
        """The full layers' rope_freqs: 1 for the pairs that turn, 1e30 (no turn) for the rest."""
        half = self.head_dim // 2
        f = np.array([1.0] * self.rotated_pairs_full + [1e30] * (half - self.rotated_pairs_full), np.float32)
        return [(self.arch.tensor("rope_freqs").gguf, f)]
