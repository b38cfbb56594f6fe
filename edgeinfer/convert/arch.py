"""Hugging Face checkpoint -> GGUF, as the architecture table (edgeinfer/arch) describes it:
hyperparameters from config.json, GGUF metadata, and the tensor-name map (with the Q/K row
permutation of the normal RoPE layout).

Hugging Face stores Q and K rows for its "rotate half" RoPE (the neox layout). A family whose
GGUF rotates adjacent pairs (llama) gets the rows of each head interleaved back: head rows
[0..d/2) and [d/2..d) become pairs (2i, 2i+1). A neox family (qwen2) is stored as is.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..arch import Arch, HeadDims, arch_for_hf
from ..arch.table import LAYER_KINDS, FamilySwitches, RecurrentDims
from ..errors import ConversionError
from .pooling import bare_model_name

__all__ = ["HParams", "TensorMap", "multimodal_part"]


@dataclass
class HParams(HeadDims, RecurrentDims, FamilySwitches):
    arch: Arch
    hf_class: str           # the config.json "architectures" entry converted
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
    tied_output: bool = False
    has_qkv_bias: bool = False
    # ---- Qwen3 / Gemma 3: sliding window, local RoPE base, attention scale, softcap
    swa_window: int = 0
    rope_theta_local: float = 0.0
    attn_scale: float = 0.0        # 0: 1/sqrt(head_dim)
    final_softcap: float = 0.0
    # fam-b: partial rotary dimensions (Phi-4-mini: 0.75 of each head); LongRoPE's original
    # context (the short factors') from config.json
    partial_rotary: float = 1.0
    n_ctx_orig: int = 0
    # ---- Qwen3.5's Gated DeltaNet layers (0 / empty: none): conv kernel, head dim, key and
    # value heads, each stored layer's kind (trunk then MTP blocks), MTP blocks, M-RoPE sections
    ssm_conv_kernel: int = 0
    ssm_head_dim: int = 0
    ssm_k_heads: int = 0
    ssm_v_heads: int = 0
    layer_kinds: tuple[str, ...] = ()
    n_mtp: int = 0
    rope_sections: tuple[int, ...] = ()
    full_attention_interval: int = 4   # written as llama.cpp does; recurrent_layers decides

    # the names the table's shapes and flags use (edgeinfer.arch.table.Dims, FamilySwitches)
    @property
    def family(self) -> Arch:
        return self.arch

    @property
    def rope_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary) // 2 * 2

    @property
    def has_longrope(self) -> bool:
        return self.rope_scaling["rope_type"] in ("longrope", "su")

    @property
    def has_output(self) -> bool:
        return not self.tied_output

    @property
    def has_rope_freqs(self) -> bool:
        return self.rope_scaling["rope_type"] == "llama3"

    @classmethod
    def from_config(cls, config: dict, keep_mtp: bool = True) -> "HParams":
        arch, hf_class = arch_for_hf(config)
        keys = arch.hf_keys
        if isinstance(config.get("text_config"), dict):   # a multimodal checkpoint: its text model
            config = {**config, **config["text_config"]}

        def need(hparam: str, kind=int):
            key = keys[hparam]
            v = config.get(key)
            if v is None:
                raise ConversionError(f"config.json: required key {key!r} is missing")
            try:
                v = kind(v)
            except (TypeError, ValueError):
                raise ConversionError(f"config.json: {key!r} = {v!r} is not a "
                                      f"{kind.__name__}") from None
            return v

        n_embd = need("n_embd")
        n_head = need("n_head")
        n_head_kv = int(config.get(keys["n_head_kv"]) or n_head)
        head_dim = int(config.get(keys["head_dim"]) or (n_embd // n_head))
        if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
            raise ConversionError(f"config.json: {keys['n_head']} ({n_head}) must be a "
                                  f"positive multiple of {keys['n_head_kv']} ({n_head_kv})")
        rp = config.get("rope_parameters") or {}
        rs = config.get("rope_scaling") or {}
        if not isinstance(rp, dict) or not isinstance(rs, dict):
            raise ConversionError("config.json: rope_parameters / rope_scaling must be objects")
        rp_local = None
        if isinstance(rp.get("full_attention"), dict):   # per layer type (Gemma 3): global layers here
            rp_local, rp = rp.get("sliding_attention"), rp["full_attention"]
        theta = rp.get("rope_theta", config.get(keys["rope_theta"], 10000.0))
        scaling = dict(rs)
        rtype = rp.get("rope_type") or rp.get("type")
        if rtype and rtype != "default":
            scaling = dict(rp)
        stype = scaling.get("rope_type") or scaling.get("type") or "default"
        scaling["rope_type"] = stype
        longrope_ok = any(t.role == "rope_factors_long" for t in arch.tensors)
        if stype not in ("default", "linear", "llama3") + (("longrope", "su") if longrope_ok else ()):
            raise ConversionError(f"config.json: RoPE scaling {stype!r} is not supported "
                                  f"(supported: none, linear, llama3{', longrope' if longrope_ok else ''})")
        partial = rp.get("partial_rotary_factor", config.get("partial_rotary_factor"))
        try:
            partial = 1.0 if partial is None else float(partial)
        except (TypeError, ValueError):
            raise ConversionError(f"config.json: partial_rotary_factor {partial!r} is not a number") from None
        if not 0 < partial <= 1:
            raise ConversionError(f"config.json: partial_rotary_factor {partial} is not in (0, 1]")
        n_ctx_orig = int(scaling.get("original_max_position_embeddings")
                         or config.get("original_max_position_embeddings") or 0)
        if config.get(keys["mlp_bias"]):
            raise ConversionError(f"config.json: {keys['mlp_bias']} = true is not supported")
        act = config.get(keys["act"], arch.act)
        act = _HF_ACTS.get(act, act)
        if act != arch.act:
            raise ConversionError(f"config.json: {keys['act']} {act!r} is not supported "
                                  f"({arch.act} only)")
        qkv_bias = arch.qkv_bias
        if qkv_bias is None:
            qkv_bias = bool(config.get(keys["has_qkv_bias"], False))
        _check_no_rope_layers(config, arch, need("n_layer"))
        extra = _swa_hparams(config, arch, n_layer=need("n_layer"), head_dim=head_dim, rp_local=rp_local)
        if arch.keys.get("ssm_head_dim"):
            extra.update(_deltanet_hparams(config, need("n_layer"), rp, keep_mtp))
        return cls(
            arch=arch, hf_class=hf_class, n_layer=need("n_layer"), n_embd=n_embd,
            n_ff=need("n_ff"), n_head=n_head, n_head_kv=n_head_kv,
            head_dim=head_dim, n_vocab=need("n_vocab"),
            n_ctx=int(config.get(keys["n_ctx_train"]) or 4096),
            rms_eps=float(config.get(keys["rms_eps"], 1e-6)), rope_theta=float(theta),
            rope_scaling=scaling, tied_output=bool(config.get(keys["tied_output"], False)),
            has_qkv_bias=qkv_bias, partial_rotary=partial, n_ctx_orig=n_ctx_orig, **extra,
        )

    def metadata(self) -> list[tuple[str, object, str | None]]:
        """(key, value, value-type name or None) for the architecture's GGUF keys."""
        key = self.arch.key
        kv: list[tuple[str, object, str | None]] = [
            (key("n_layer"), self.n_layer, "UINT32"),
            (key("n_ctx_train"), self.n_ctx, "UINT32"),
            (key("n_embd"), self.n_embd, "UINT32"),
            (key("n_ff"), self.n_ff, "UINT32"),
            (key("n_head"), self.n_head, "UINT32"),
            (key("n_head_kv"), self.n_head_kv, "UINT32"),
            (key("rope_theta"), self.rope_theta, "FLOAT32"),
            (key("rms_eps"), self.rms_eps, "FLOAT32"),
            (key("n_vocab"), self.n_vocab, "UINT32"),
            (key("rope_dim"), self.rope_dim, "UINT32"),
        ]
        if self.q_dim != self.n_embd:
            kv += [(key("head_dim"), self.head_dim, "UINT32"),
                   (key("value_dim"), self.head_dim, "UINT32")]
        if self.swa_window:
            kv += [(key("swa_window"), self.swa_window, "UINT32"),
                   (key("rope_theta_local"), self.rope_theta_local, "FLOAT32")]
        if self.attn_scale:
            kv.append((key("attn_scale"), self.attn_scale, "FLOAT32"))
        if self.final_softcap:
            kv.append((key("final_softcap"), self.final_softcap, "FLOAT32"))
        if self.ssm_head_dim:       # as llama.cpp's converter writes a Qwen3.5
            kv += [(key("rope_sections"), [*self.rope_sections, 0][:4], "INT32"),
                   (key("ssm_conv_kernel"), self.ssm_conv_kernel, "UINT32"),
                   (key("ssm_head_dim"), self.ssm_head_dim, "UINT32"),
                   (key("ssm_k_heads"), self.ssm_k_heads, "UINT32"),
                   (key("ssm_v_heads"), self.ssm_v_heads, "UINT32"),
                   (key("ssm_inner"), self.ssm_inner, "UINT32"),
                   (key("recurrent_layers"), [k == "recurrent" for k in self.layer_kinds], "BOOL"),
                   (key("full_attention_interval"), self.full_attention_interval, "UINT32")]
            kv[0] = (key("n_layer"), self.n_layer + self.n_mtp, "UINT32")   # the MTP blocks are layers
            if self.n_mtp:
                kv.append((key("n_mtp"), self.n_mtp, "UINT32"))
        if self.rope_scaling["rope_type"] == "linear":
            kv += [(key("rope_scaling"), "linear", "STRING"),
                   (key("rope_scaling_factor"), float(self.rope_scaling["factor"]), "FLOAT32")]
        if self.has_longrope:       # as llama.cpp's converter writes them for Phi-3
            kv += [(key("rope_ctx_orig"), self.longrope_ctx_orig(), "UINT32"),
                   (key("rope_attn_factor"), self.longrope_attn_factor(), "FLOAT32")]
        return kv

    def longrope_ctx_orig(self) -> int:
        if self.n_ctx_orig <= 0:
            raise ConversionError("config.json: LongRoPE needs original_max_position_embeddings")
        return self.n_ctx_orig

    def longrope_attn_factor(self) -> float:
        """The scale of the rotated dimensions: config's attention_factor, else
        sqrt(1 + ln(s) / ln(original context)) for s = context / original context > 1."""
        af = self.rope_scaling.get("attention_factor")
        if af is not None:
            return float(af)
        orig = self.longrope_ctx_orig()
        scale = self.n_ctx / orig
        return math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1 else 1.0

    def computed_tensors(self) -> list[tuple[str, np.ndarray]]:
        """Tensors the converter makes from config.json: llama3's rope_freqs, LongRoPE's
        short and long factors (GGUF name, float32 data)."""
        out = []
        rf = self.rope_freqs()
        if rf is not None:
            out.append((self.arch.tensor("rope_freqs").gguf, rf))
        if self.has_longrope:
            for role, key in (("rope_factors_long", "long_factor"), ("rope_factors_short", "short_factor")):
                f = np.asarray(self.rope_scaling.get(key) or [], dtype=np.float32)
                if f.shape != (self.rope_dim // 2,) or not np.all(np.isfinite(f)) or np.any(f <= 0):
                    raise ConversionError(f"config.json: LongRoPE {key} must be {self.rope_dim // 2} "
                                          f"positive numbers (rope dimensions / 2), got {f.shape[0]}")
                out.append((self.arch.tensor(role).gguf, f))
        return out

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


#: Hugging Face activation names -> the table's.
_HF_ACTS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


def _swa_hparams(config: dict, arch: Arch, n_layer: int, head_dim: int, rp_local: dict | None) -> dict:
    """Sliding window, local RoPE base, attention scale and softcaps of a Gemma 3 style
    config.json; refuses what the native forward does not implement."""
    out: dict = {}
    if config.get("attn_logit_softcapping"):
        raise ConversionError("config.json: attn_logit_softcapping is not supported")
    if config.get("use_sliding_window") and not arch.swa_pattern:
        raise ConversionError(f"config.json: use_sliding_window = true is not supported for "
                              f"{arch.name}")
    if not arch.swa_pattern:
        return out
    cap = config.get("final_logit_softcapping")
    if cap:
        out["final_softcap"] = float(cap)
    qpas = config.get("query_pre_attn_scalar")
    if qpas and float(qpas) != float(head_dim):   # llama.cpp assumes head_dim unless told
        out["attn_scale"] = float(qpas) ** -0.5
    window = config.get("sliding_window")
    if window:
        types = config.get("layer_types")
        pattern = arch.swa_pattern
        if types is None and config.get("sliding_window_pattern") not in (None, pattern):
            raise ConversionError(f"config.json: sliding_window_pattern "
                                  f"{config.get('sliding_window_pattern')} is not supported "
                                  f"({pattern} only)")
        want = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                for i in range(n_layer)]
        if types is not None and list(types) != want:
            raise ConversionError(f"config.json: layer_types {types} is not the {pattern - 1} local : "
                                  f"1 global layout edgeinfer (and llama.cpp) implement")
        local = (rp_local or {}).get("rope_theta", config.get("rope_local_base_freq",
                                                                arch.rope_theta_local))
        out.update(swa_window=int(window), rope_theta_local=float(local))
    return out


_HF_LAYER_TYPES = {"linear_attention": "recurrent", "full_attention": "attention"}


def _deltanet_hparams(config: dict, n_layer: int, rope: dict, keep_mtp: bool) -> dict:
    """Qwen3.5's Gated DeltaNet sizes, layer kinds (config.json's layer_types, else every
    full_attention_interval-th layer attends), MTP blocks and M-RoPE sections."""
    def need(key: str) -> int:
        v = config.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ConversionError(f"config.json: {key!r} = {v!r} must be a positive integer")
        return v

    dk, dv = need("linear_key_head_dim"), need("linear_value_head_dim")
    if dk != dv:
        raise ConversionError(f"config.json: linear_key_head_dim ({dk}) != linear_value_head_dim ({dv}) "
                              f"is not supported (llama.cpp's qwen35 stores one state size)")
    nk, nv = need("linear_num_key_heads"), need("linear_num_value_heads")
    if nv % nk:
        raise ConversionError(f"config.json: linear_num_value_heads ({nv}) is not a multiple of "
                              f"linear_num_key_heads ({nk})")
    types = config.get("layer_types")
    if types is None:
        every = config.get("full_attention_interval", 4)
        types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n_layer)]
    if not isinstance(types, list) or len(types) != n_layer:
        raise ConversionError(f"config.json: layer_types must list {n_layer} layers (num_hidden_layers)")
    bad = [t for t in types if t not in _HF_LAYER_TYPES]
    if bad:
        raise ConversionError(f"config.json: layer_types entry {bad[0]!r} is not supported "
                              f"(supported: {', '.join(_HF_LAYER_TYPES)})")
    n_mtp = int(config.get("mtp_num_hidden_layers") or 0) if keep_mtp else 0
    sections = rope.get("mrope_section", config.get("mrope_section")) or [11, 11, 10]
    kinds = tuple(_HF_LAYER_TYPES[t] for t in types) + ("mtp",) * n_mtp
    assert set(kinds) <= set(LAYER_KINDS)
    return dict(ssm_conv_kernel=need("linear_conv_kernel_dim"), ssm_head_dim=dk, ssm_k_heads=nk,
                ssm_v_heads=nv, layer_kinds=kinds, n_mtp=n_mtp,
                full_attention_interval=int(config.get("full_attention_interval", 4)),
                rope_sections=tuple(int(x) for x in sections))


def _check_no_rope_layers(config: dict, arch: Arch, n_layer: int) -> None:
    """config.json's per-layer RoPE switches (1: rotate) must be the family's fixed step, the
    only layout the GGUF (which has no key for it) and the runtimes can express."""
    key = arch.hf_keys.get("no_rope_layers")
    if key is None:
        return
    layers = config.get(key)
    interval = config.get("no_rope_layer_interval")
    if layers is None and isinstance(interval, int) and interval > 0:   # transformers' default from it
        layers = [int((i + 1) % interval != 0) for i in range(n_layer)]
    if layers is None:
        return
    want = [int(arch.layer_uses_rope(i)) for i in range(n_layer)]
    if not isinstance(layers, list) or [x if isinstance(x, int) else None for x in layers] != want:
        step = f"every {arch.no_rope_step}th layer" if arch.no_rope_step else "no layer"
        raise ConversionError(f"config.json: {key} = {layers} is not supported: {arch.name} skips RoPE in "
                              f"{step} only ({key} = {want})")


#: The non-text parts of multimodal checkpoints (transformers 5's Qwen3_5 and
#: Gemma4ForConditionalGeneration, Gemma 3n's names): towers and their projections into the text
#: model. edgeinfer converts the text model only.
_MULTIMODAL = re.compile(r"^(?:model\.)?(?:(visual|vision_tower|embed_vision|multi_modal_projector)"
                         r"|(audio_tower|embed_audio))\.")


def multimodal_part(hf: str) -> str | None:
    """'vision' or 'audio' for a tensor of a multimodal checkpoint's non-text part, else None."""
    m = _MULTIMODAL.match(hf)
    return None if m is None else ("vision" if m.group(1) else "audio")


def _permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate-half row order -> GGUF llama interleaved pairs, per head (rows = dim 0)."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise ConversionError(f"cannot permute {rows} rows into {n_head} heads")
    return (w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


@dataclass
class TensorMap:
    """HF tensor names -> GGUF names and per-tensor transforms for one checkpoint."""

    hp: HParams

    def gguf_name(self, hf: str) -> str | None:
        """The GGUF name of an HF tensor; None for tensors to drop. Unknown -> error."""
        arch = self.hp.arch
        if re.search(arch.hf_ignore, hf):
            return None
        found = arch.match_hf(hf)
        if found is None:
            raise ConversionError(f"tensor {hf!r} is not part of the {self.hp.hf_class} "
                                  f"architecture as edgeinfer converts it")
        t, i = found
        if i >= self.hp.n_layer + self.hp.n_mtp:
            raise ConversionError(f"tensor {hf!r} belongs to layer {i}, but config.json "
                                  f"has {arch.hf_keys['n_layer']} = {self.hp.n_layer}")
        if t.when is not None and not getattr(self.hp, t.when):
            if t.when == "has_output":    # a tied head saved anyway: the embedding is the head
                return None
            raise ConversionError(f"tensor {hf!r} is present but config.json does not declare "
                                  f"{arch.hf_keys[t.when]}")
        return t.gguf.format(i=i) if t.per_layer else t.gguf

    def canonical_name(self, hf: str) -> str | None:
        """The table's name of a checkpoint tensor; None for one the GGUF does not hold.
        A multimodal checkpoint (Qwen3_5 / Gemma4ForConditionalGeneration) nests the decoder
        under model.language_model (its vision / audio towers are left out: multimodal_part);
        Qwen3.5's MTP block's tensors (mtp.*) are the layers after the trunk; a bare model's
        (an embedding model's: `layers.*`) are the causal LM's."""
        if multimodal_part(hf) is not None:
            return None
        hf = bare_model_name(re.sub(r"^model\.language_model\.", "model.", hf))
        if not self.hp.layer_kinds:
            return hf
        m = re.fullmatch(r"(?:model\.)?mtp\.(?:layers\.(\d+)\.(.+)|(\w+)\.weight)", hf)
        if m is None:
            return hf
        if not self.hp.n_mtp:
            return None
        if m.group(1) is not None:
            return f"model.layers.{self.hp.n_layer + int(m.group(1))}.{m.group(2)}"
        return f"model.layers.{self.hp.n_layer}.mtp_{m.group(3)}.weight"

    def expected(self) -> dict[str, tuple[int, ...]]:
        """Every HF tensor the architecture needs -> its PyTorch shape (GGML's reversed,
        unless the table gives the checkpoint's)."""
        return {w.hf: (w.tensor.hf_shape(self.hp) if w.tensor.hf_shape else tuple(reversed(w.shape)))
                for w in self.hp.arch.weights(self.hp) if w.hf is not None}

    def ggml_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every HF tensor the architecture needs -> its GGUF (GGML order) shape."""
        return {w.hf: w.shape for w in self.hp.arch.weights(self.hp) if w.hf is not None}

    def transform(self, hf: str) -> Callable[[np.ndarray], np.ndarray] | None:
        if self.hp.ssm_head_dim:
            return self._deltanet_transform(hf)
        shift = self.hp.arch.norm_shift
        if shift:   # Gemma's norms scale by (1 + w): stored shifted, as llama.cpp's converter does
            found = self.hp.arch.match_hf(hf)
            if found and found[0].role.endswith("norm"):
                return lambda w: (w.astype(np.float32) + np.float32(shift))
        if not self.hp.arch.permute_qk:
            return None
        found = self.hp.arch.match_hf(hf)
        role = found[0].role if found else None
        if role in ("attn_q", "attn_q_bias"):
            return lambda w: _permute_rows(w, self.hp.n_head)
        if role in ("attn_k", "attn_k_bias"):
            return lambda w: _permute_rows(w, self.hp.n_head_kv)
        return None

    def _deltanet_transform(self, hf: str) -> Callable[[np.ndarray], np.ndarray] | None:
        """Qwen3.5 as llama.cpp's converter stores it: (1 + w) norms but the gated one,
        A = -exp(A_log), the conv kernel [C, K], and value heads (their rows of q|k|v's v part,
        the gate, beta, alpha, A, dt and the conv's v channels; out_proj's columns) from HF's
        grouped order (head g * r + j of key head g) to the tiled order (j * n_k + g)."""
        hp, arch = self.hp, self.hp.arch
        found = arch.match_hf(hf)
        if found is None:
            return None
        role = found[0].role
        shift = role.endswith("norm") and role not in arch.unshifted_norms
        kd = hp.ssm_k_heads * hp.ssm_head_dim

        def tiled(w: np.ndarray, axis: int, unit: int) -> np.ndarray:
            w = np.moveaxis(w, axis, 0)
            nk, per = hp.ssm_k_heads, hp.ssm_v_heads // hp.ssm_k_heads
            w = w.reshape(nk, per, unit, *w.shape[1:]).swapaxes(0, 1).reshape(w.shape)
            return np.moveaxis(w, 0, axis)

        def f(w: np.ndarray) -> np.ndarray:
            w = np.asarray(w, dtype=np.float32) if (shift or role in ("ssm_a", "ssm_conv1d")) else w
            if role == "ssm_conv1d":
                w = w.reshape(w.shape[0], w.shape[-1])
            if hp.ssm_v_heads != hp.ssm_k_heads:
                if role in ("ssm_qkv", "ssm_conv1d"):
                    w = np.concatenate([w[:2 * kd], tiled(w[2 * kd:], 0, hp.ssm_head_dim)])
                elif role == "ssm_gate":
                    w = tiled(w, 0, hp.ssm_head_dim)
                elif role in ("ssm_beta", "ssm_alpha", "ssm_a", "ssm_dt"):
                    w = tiled(w, 0, 1)
                elif role == "ssm_out":
                    w = tiled(w, 1, hp.ssm_head_dim)
            if role == "ssm_a":
                w = -np.exp(w)
            if shift:
                w = w + np.float32(arch.norm_shift)
            return w
        return f
