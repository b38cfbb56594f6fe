"""Architecture registry: Hugging Face `architectures` -> GGUF architecture, hyperparameter
metadata and the tensor-name map (with llama's Q/K row permutation).

Llama and Mistral checkpoints store Q and K rows for Hugging Face's "rotate half" RoPE
layout; GGUF's llama architecture rotates adjacent pairs, so the rows of each head are
interleaved back: head rows [0..d/2) and [d/2..d) become pairs (2i, 2i+1). Qwen2 is stored
as is (llama.cpp rotates it in the NEOX layout, which is Hugging Face's).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import ConversionError, UnsupportedArchitectureError

__all__ = ["ArchSpec", "ARCHITECTURES", "SUPPORTED", "resolve_arch", "HParams", "TensorMap"]


@dataclass(frozen=True)
class ArchSpec:
    hf_name: str
    gguf_arch: str
    permute_qk: bool
    qkv_bias: bool | None   # True: always; None: per config "attention_bias"


ARCHITECTURES: dict[str, ArchSpec] = {
    "LlamaForCausalLM": ArchSpec("LlamaForCausalLM", "llama", True, None),
    "MistralForCausalLM": ArchSpec("MistralForCausalLM", "llama", True, None),
    "Qwen2ForCausalLM": ArchSpec("Qwen2ForCausalLM", "qwen2", False, True),
}
SUPPORTED = tuple(ARCHITECTURES)
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                "qwen2": "Qwen2ForCausalLM"}


def resolve_arch(config: dict) -> ArchSpec:
    archs = config.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    if not archs and config.get("model_type") in _MODEL_TYPES:
        archs = [_MODEL_TYPES[config["model_type"]]]
    for a in archs:
        if a in ARCHITECTURES:
            return ARCHITECTURES[a]
    got = ", ".join(map(str, archs)) or f"model_type {config.get('model_type')!r}"
    raise UnsupportedArchitectureError(
        f"unsupported architecture {got}; supported: {', '.join(SUPPORTED)}")


@dataclass
class HParams:
    arch: ArchSpec
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    n_ctx: int
    rms_eps: float
    rope_theta: float
    rope_scaling: dict = field(default_factory=dict)
    tied: bool = False
    qkv_bias: bool = False

    @classmethod
    def from_config(cls, config: dict) -> "HParams":
        spec = resolve_arch(config)

        def need(key: str, kind=int):
            v = config.get(key)
            if v is None:
                raise ConversionError(f"config.json: required key {key!r} is missing")
            try:
                v = kind(v)
            except (TypeError, ValueError):
                raise ConversionError(f"config.json: {key!r} = {v!r} is not a "
                                      f"{kind.__name__}") from None
            return v

        n_embd = need("hidden_size")
        n_head = need("num_attention_heads")
        n_head_kv = int(config.get("num_key_value_heads") or n_head)
        head_dim = int(config.get("head_dim") or (n_embd // n_head))
        if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
            raise ConversionError(f"config.json: num_attention_heads ({n_head}) must be a "
                                  f"positive multiple of num_key_value_heads ({n_head_kv})")
        rp = config.get("rope_parameters") or {}
        rs = config.get("rope_scaling") or {}
        if not isinstance(rp, dict) or not isinstance(rs, dict):
            raise ConversionError("config.json: rope_parameters / rope_scaling must be objects")
        theta = rp.get("rope_theta", config.get("rope_theta", 10000.0))
        scaling = dict(rs)
        rtype = rp.get("rope_type") or rp.get("type")
        if rtype and rtype != "default":
            scaling = dict(rp)
        stype = scaling.get("rope_type") or scaling.get("type") or "default"
        scaling["rope_type"] = stype
        if stype not in ("default", "linear", "llama3"):
            raise ConversionError(f"config.json: RoPE scaling {stype!r} is not supported "
                                  f"(supported: none, linear, llama3)")
        if config.get("mlp_bias"):
            raise ConversionError("config.json: mlp_bias = true is not supported")
        if spec.hf_name != "Qwen2ForCausalLM" and config.get("hidden_act", "silu") != "silu":
            raise ConversionError(f"config.json: hidden_act {config.get('hidden_act')!r} is "
                                  f"not supported (silu only)")
        qkv_bias = True if spec.qkv_bias else bool(config.get("attention_bias", False))
        return cls(
            arch=spec, n_layer=need("num_hidden_layers"), n_embd=n_embd,
            n_ff=need("intermediate_size"), n_head=n_head, n_head_kv=n_head_kv,
            head_dim=head_dim, n_vocab=need("vocab_size"),
            n_ctx=int(config.get("max_position_embeddings") or 4096),
            rms_eps=float(config.get("rms_norm_eps", 1e-6)), rope_theta=float(theta),
            rope_scaling=scaling, tied=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
        )

    def metadata(self) -> list[tuple[str, object, str | None]]:
        """(key, value, value-type name or None) for the architecture's GGUF keys."""
        a = self.arch.gguf_arch
        kv: list[tuple[str, object, str | None]] = [
            (f"{a}.block_count", self.n_layer, "UINT32"),
            (f"{a}.context_length", self.n_ctx, "UINT32"),
            (f"{a}.embedding_length", self.n_embd, "UINT32"),
            (f"{a}.feed_forward_length", self.n_ff, "UINT32"),
            (f"{a}.attention.head_count", self.n_head, "UINT32"),
            (f"{a}.attention.head_count_kv", self.n_head_kv, "UINT32"),
            (f"{a}.rope.freq_base", self.rope_theta, "FLOAT32"),
            (f"{a}.attention.layer_norm_rms_epsilon", self.rms_eps, "FLOAT32"),
            (f"{a}.vocab_size", self.n_vocab, "UINT32"),
            (f"{a}.rope.dimension_count", self.head_dim, "UINT32"),
        ]
        if self.head_dim * self.n_head != self.n_embd:
            kv += [(f"{a}.attention.key_length", self.head_dim, "UINT32"),
                   (f"{a}.attention.value_length", self.head_dim, "UINT32")]
        if self.rope_scaling["rope_type"] == "linear":
            kv += [(f"{a}.rope.scaling.type", "linear", "STRING"),
                   (f"{a}.rope.scaling.factor", float(self.rope_scaling["factor"]), "FLOAT32")]
        return kv

    def rope_freqs(self) -> np.ndarray | None:
        """Llama 3.1-style per-frequency divisors (the `rope_freqs.weight` tensor), or None."""
        s = self.rope_scaling
        if s["rope_type"] != "llama3":
            return None
        try:
            factor = float(s["factor"])
            low = float(s.get("low_freq_factor", 1.0))
            high = float(s.get("high_freq_factor", 4.0))
            old_ctx = float(s.get("original_max_position_embeddings", 8192))
        except (KeyError, TypeError, ValueError):
            raise ConversionError(f"config.json: incomplete llama3 rope scaling {s}") from None
        base, dim = self.rope_theta, self.head_dim
        freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
        low_wl, high_wl = old_ctx / low, old_ctx / high
        out = []
        for f in freqs:
            wl = 2 * math.pi / f
            if wl < high_wl:
                out.append(1.0)
            elif wl > low_wl:
                out.append(factor)
            else:
                smooth = (old_ctx / wl - low) / (high - low)
                out.append(1.0 / ((1 - smooth) / factor + smooth))
        return np.array(out, dtype=np.float32)


def _permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate-half row order -> GGUF llama interleaved pairs, per head (rows = dim 0)."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise ConversionError(f"cannot permute {rows} rows into {n_head} heads")
    return (w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


_LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL_MAP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_SKIP_RE = re.compile(r"(rotary_emb\.inv_freq|\.masked_bias|\.attn\.bias)$")


@dataclass
class TensorMap:
    """HF tensor names -> GGUF names and per-tensor transforms for one checkpoint."""

    hp: HParams

    def gguf_name(self, hf: str) -> str | None:
        """The GGUF name of an HF tensor; None for tensors to drop. Unknown -> error."""
        if _SKIP_RE.search(hf):
            return None
        if hf == "lm_head.weight" and self.hp.tied:
            return None
        if hf in _GLOBAL_MAP:
            return _GLOBAL_MAP[hf]
        m = _LAYER_RE.match(hf)
        if m and m.group(2) in _LAYER_MAP:
            i = int(m.group(1))
            if i >= self.hp.n_layer:
                raise ConversionError(f"tensor {hf!r} belongs to layer {i}, but config.json "
                                      f"has num_hidden_layers = {self.hp.n_layer}")
            if m.group(2).endswith(".bias") and not self.hp.qkv_bias:
                raise ConversionError(f"tensor {hf!r}: attention biases present but "
                                      f"config.json does not declare attention_bias")
            return f"blk.{i}.{_LAYER_MAP[m.group(2)]}"
        raise ConversionError(f"tensor {hf!r} is not part of the {self.hp.arch.hf_name} "
                              f"architecture as edgeinfer converts it")

    def expected(self) -> dict[str, tuple[int, ...]]:
        """Every HF tensor the architecture needs -> its PyTorch shape."""
        h = self.hp
        e, q, kv, ff = h.n_embd, h.n_head * h.head_dim, h.n_head_kv * h.head_dim, h.n_ff
        out = {"model.embed_tokens.weight": (h.n_vocab, e), "model.norm.weight": (e,)}
        if not h.tied:
            out["lm_head.weight"] = (h.n_vocab, e)
        for i in range(h.n_layer):
            p = f"model.layers.{i}."
            out.update({
                p + "input_layernorm.weight": (e,), p + "post_attention_layernorm.weight": (e,),
                p + "self_attn.q_proj.weight": (q, e), p + "self_attn.k_proj.weight": (kv, e),
                p + "self_attn.v_proj.weight": (kv, e), p + "self_attn.o_proj.weight": (e, q),
                p + "mlp.gate_proj.weight": (ff, e), p + "mlp.up_proj.weight": (ff, e),
                p + "mlp.down_proj.weight": (e, ff),
            })
            if h.qkv_bias:
                out.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                            p + "self_attn.v_proj.bias": (kv,)})
        return out

    def transform(self, hf: str) -> Callable[[np.ndarray], np.ndarray] | None:
        if not self.hp.arch.permute_qk:
            return None
        if hf.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
            return lambda w: _permute_rows(w, self.hp.n_head)
        if hf.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias")):
            return lambda w: _permute_rows(w, self.hp.n_head_kv)
        return None
