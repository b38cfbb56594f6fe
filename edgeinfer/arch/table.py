"""The architecture table: what edgeinfer knows about each model family, written once.

One `Arch` per GGUF `general.architecture` (as llama.cpp's llama-arch does): its metadata
keys, its tensors (C role, GGUF name, shape, Hugging Face name, when present), the Hugging
Face names the converter maps from, and the features the native forward pass switches on.
ModelConfig reads GGUF files with it, the converter writes them with it, the native model
hands tensors to C by its roles. A family made of ops edgeinfer already has needs only an
entry in ARCHS.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType
from typing import Callable, Mapping, NamedTuple, Protocol

from ..errors import GGUFError, UnsupportedArchitectureError

__all__ = ["Arch", "Tensor", "Weight", "Dims", "HeadDims", "RecurrentDims", "FamilySwitches", "ARCHS", "GGUF_KEYS", "HF_KEYS", "QKV_BIAS_ROLES",
           "FLAGS", "LONGROPE_ROLES", "LAYER_KINDS", "NATIVE_LAYER_KINDS", "layer_kinds", "NORMS", "ACTIVATIONS", "ROPE_STYLES", "get_arch", "arch_for_hf"]

# The ops the native forward pass implements (native/src/forward.c, native/cuda/forward.cu).
# A family that needs another one needs a kernel first (docs/architecture.md).
NORMS = ("rms",)                  # RMSNorm times a weight
ACTIVATIONS = ("silu", "gelu_tanh")  # the gated FFN: down(act(gate(x)) * up(x)); gelu_tanh: GeGLU (Gemma)
ROPE_STYLES = ("normal", "neox")  # rotated pairs (2i, 2i+1) / (i, i + rope_dim/2)

#: Hyperparameter -> GGUF metadata key after the "{arch}." prefix (llama.cpp's LLM_KV names).
GGUF_KEYS: Mapping[str, str] = MappingProxyType({
    "n_layer": "block_count",
    "n_ctx_train": "context_length",
    "n_embd": "embedding_length",
    "n_ff": "feed_forward_length",
    "n_head": "attention.head_count",
    "n_head_kv": "attention.head_count_kv",
    "head_dim": "attention.key_length",
    "value_dim": "attention.value_length",
    "rope_dim": "rope.dimension_count",
    "rope_theta": "rope.freq_base",
    "rms_eps": "attention.layer_norm_rms_epsilon",
    "n_vocab": "vocab_size",
    "rope_scaling": "rope.scaling.type",
    "rope_scaling_factor": "rope.scaling.factor",
    "rope_scale_linear": "rope.scale_linear",
    "n_expert": "expert_count",
    # sliding-window attention and softcapping (Gemma 3)
    "swa_window": "attention.sliding_window",
    "swa_pattern": "attention.sliding_window_pattern",
    "rope_theta_local": "rope.freq_base_swa",
    "attn_scale": "attention.scale",
    "final_softcap": "final_logit_softcapping",
    "attn_softcap": "attn_logit_softcapping",
    # Phi-3 LongRoPE (fam-b): the context the short factors serve, and the cos/sin scale
    "rope_ctx_orig": "rope.scaling.original_context_length",
    "rope_attn_factor": "rope.scaling.attn_factor",
})

#: Hyperparameter -> key of a Hugging Face config.json.
HF_KEYS: Mapping[str, str] = MappingProxyType({
    "n_layer": "num_hidden_layers",
    "n_ctx_train": "max_position_embeddings",
    "n_embd": "hidden_size",
    "n_ff": "intermediate_size",
    "n_head": "num_attention_heads",
    "n_head_kv": "num_key_value_heads",
    "head_dim": "head_dim",
    "n_vocab": "vocab_size",
    "rms_eps": "rms_norm_eps",
    "rope_theta": "rope_theta",
    "tied_output": "tie_word_embeddings",
    "has_qkv_bias": "attention_bias",
    "act": "hidden_act",
    "mlp_bias": "mlp_bias",
})

#: The roles the `has_qkv_bias` flag of the native model config governs.
QKV_BIAS_ROLES = ("attn_q_bias", "attn_k_bias", "attn_v_bias")
#: The flags a tensor's `when` may name; each is an attribute of the hyperparameters.
FLAGS = ("has_qkv_bias", "has_output", "has_rope_freqs", "has_longrope",
         "has_qk_norm", "has_post_norms")   # per-head Q/K norms, post-norms: Qwen3, Gemma 3
FLAGS += ("n_embd_per_layer", "stores_kv")   # Gemma 4: per-layer inputs (their width); a layer's own K/V
#: LongRoPE's two sets of per-frequency divisors; the native model gets one of them as its
#: rope_freqs, chosen by the context size (llama.cpp: long when n_ctx > the original context).
LONGROPE_ROLES = ("rope_factors_short", "rope_factors_long")
#: llama.cpp's llama_pooling_type values, the GGUF key `{arch}.pooling_type` (an embedding model's
#: pooling; "rank": a reranker's classification head)
POOLING_TYPES: Mapping[str, int] = MappingProxyType({"mean": 1, "cls": 2, "last": 3, "rank": 4})
#: A reranker's classification head (llama.cpp's cls_out), any family's: applied outside the
#: forward (model/rank_head.py), written by convert/rerank.py
RANK_HEAD_WEIGHT, RANK_HEAD_BIAS = "cls.output.weight", "cls.output.bias"
#: The native runtimes' kind of each layer kind they run (ei_layer_kind of edgeinfer.h).
NATIVE_LAYER_KINDS: Mapping[str, int] = MappingProxyType({"attention": 0, "shortconv": 1, "recurrent": 2})


class HeadDims:
    """q_dim and kv_dim from the head counts: one definition for every dataclass that carries
    them (ModelConfig, the converter's HParams, the planner's ModelShape)."""
    n_head: int
    n_head_kv: int
    head_dim: int

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim


class RecurrentDims:
    """The Gated DeltaNet sizes derived from the stored ones (value and key heads share
    ssm_head_dim, as llama.cpp requires): one definition for ModelConfig, HParams and the
    reference's ForwardParams."""
    ssm_head_dim: int
    ssm_k_heads: int
    ssm_v_heads: int

    @property
    def ssm_inner(self) -> int:
        """Width of the value (and output gate) rows: value heads x head dim."""
        return self.ssm_v_heads * self.ssm_head_dim

    @property
    def ssm_conv_dim(self) -> int:
        """Channels of the convolution: q and k (key heads x head dim each), then v."""
        return 2 * self.ssm_k_heads * self.ssm_head_dim + self.ssm_inner


class FamilySwitches:
    """The native config's switches a family implies, read from its table entry (`family`):
    one definition for every dataclass that fills or mirrors ei_model_config (ModelConfig,
    the converter's HParams)."""
    family: Arch

    @property
    def rope_neox(self) -> bool:
        return self.family.rope_neox

    @property
    def has_qk_norm(self) -> bool:
        return self.family.qk_norm

    @property
    def has_post_norms(self) -> bool:
        return self.family.post_norms

    @property
    def no_rope_layer_step(self) -> int:
        return self.family.no_rope_step

    @property
    def has_attn_gate(self) -> bool:
        return self.family.attn_gate

    @property
    def has_v_norm(self) -> bool:
        return self.family.v_norm


class Dims(Protocol):
    """What tensor shapes and presence depend on (ModelConfig and the converter's HParams)."""
    n_layer: int
    n_embd: int
    n_ff: int
    n_vocab: int
    head_dim: int
    q_dim: int
    kv_dim: int
    rope_dim: int
    has_qkv_bias: bool
    has_output: bool
    has_rope_freqs: bool
    has_qk_norm: bool
    has_post_norms: bool
    has_longrope: bool


@dataclass(frozen=True)
class Tensor:
    """One tensor of a family. `role` names the C role (EI_T_<ROLE> in
    native/include/edgeinfer_roles.h); "{i}" in `gguf` / `hf` is the layer index."""
    role: str
    gguf: str
    shape: Callable[[Dims], tuple[int, ...]]   # GGML order (ne0 first); HF's is the reverse
    hf: str | None = None                      # None: not in checkpoints (computed by the converter)
    when: str | None = None                    # a flag of FLAGS that must hold; None: always present
    # A fused tensor: the C roles its rows are cut into, in order, with each part's row count
    # (Phi-3's attn_qkv -> attn_q, attn_k, attn_v). Empty: the tensor is its own C role.
    split: tuple[tuple[str, Callable[[Dims], int]], ...] = ()
    # The layer kinds (LAYER_KINDS) that hold this tensor; empty: every layer (hybrids only)
    kinds: tuple[str, ...] = ()
    # The checkpoint's shape when it is not GGML's reversed (a conv kernel's [C, 1, K])
    hf_shape: Callable[[Dims], tuple[int, ...]] | None = None

    @property
    def per_layer(self) -> bool:
        return "{i}" in self.gguf

    @property
    def c_roles(self) -> tuple[str, ...]:
        """The C roles (EI_T_<ROLE>) this tensor feeds: its parts', LongRoPE factors' rope_freqs,
        else its own."""
        if self.split:
            return tuple(r for r, _ in self.split)
        return ("rope_freqs",) if self.role in LONGROPE_ROLES else (self.role,)


class Weight(NamedTuple):
    """A tensor of one model: its GGUF name, table entry, layer (-1: global) and shape."""
    name: str
    tensor: Tensor
    layer: int
    shape: tuple[int, ...]

    @property
    def hf(self) -> str | None:
        t = self.tensor.hf
        return None if t is None else t.format(i=self.layer)


@dataclass(frozen=True)
class Arch:
    """A model family. `qkv_bias`: True, the q/k/v biases are always there; False, never;
    None, a file or checkpoint has them in every layer or in none (config.json:
    attention_bias)."""
    name: str                                   # general.architecture
    tensors: tuple[Tensor, ...]
    hf_classes: Mapping[str, str] = field(default_factory=dict)  # config.json "architectures" -> "model_type"
    norm: str = "rms"
    act: str = "silu"
    rope: str = "normal"
    qkv_bias: bool | None = None
    keys: Mapping[str, str] = field(default_factory=lambda: GGUF_KEYS)
    hf_keys: Mapping[str, str] = field(default_factory=lambda: HF_KEYS)
    hf_ignore: str = r"(rotary_emb\.inv_freq|\.masked_bias|\.attn\.bias)$"   # HF buffers with no GGUF tensor
    # ---- Qwen3 / Gemma 3 ops
    qk_norm: bool = False          # attn_q_norm / attn_k_norm: RMSNorm of each q/k head before RoPE
    post_norms: bool = False       # attn_post_norm / ffn_post_norm on each block's output
    embd_scale_sqrt: bool = False  # token embeddings times sqrt(n_embd) (Gemma)
    norm_shift: float = 0.0        # HF norm weights w are applied as (w + norm_shift): Gemma's (1 + w),
                                   # stored shifted in GGUF as llama.cpp's converter does
    swa_pattern: int = 0           # sliding-window layers: global iff (layer + 1) % swa_pattern == 0
    rope_theta_local: float = 10000.0   # RoPE base of the local layers unless the file says
    # ---- SmolLM3: layer l skips RoPE iff (l + 1) % no_rope_step == 0 (0: every layer rotates);
    # a family constant, as llama.cpp hard-codes it (no GGUF key)
    no_rope_step: int = 0
    # ---- Qwen3.5: sigmoid output gate of attention (attn_q's second half per head); norms
    # norm_shift leaves alone (its gated RMSNorm scales by w)
    attn_gate: bool = False
    unshifted_norms: tuple[str, ...] = ()
    # ---- Gemma 4: v heads RMS-normed without a weight before they are stored
    v_norm: bool = False
    # False: the converter and the reference know the family, the native runtimes not yet
    native: bool = True

    def __post_init__(self):
        for what, value, known in (("norm", self.norm, NORMS), ("act", self.act, ACTIVATIONS),
                                   ("rope", self.rope, ROPE_STYLES)):
            if value not in known:
                raise ValueError(f"architecture {self.name!r}: {what} {value!r} has no native kernel "
                                 f"(have: {', '.join(known)})")
        for t in self.tensors:
            if t.when is not None and t.when not in FLAGS:
                raise ValueError(f"architecture {self.name!r}: tensor {t.role} depends on unknown "
                                 f"flag {t.when!r} (flags: {', '.join(FLAGS)})")

    @property
    def rope_neox(self) -> bool:
        return self.rope == "neox"

    def layer_uses_rope(self, layer: int) -> bool:
        """Does `layer` rotate q and k? (native: ei_layer_uses_rope)"""
        return self.no_rope_step == 0 or (layer + 1) % self.no_rope_step != 0

    @property
    def permute_qk(self) -> bool:
        """Hugging Face stores Q/K rows for its rotate-half (neox) RoPE; the normal layout
        rotates adjacent pairs, so the converter interleaves each head's rows."""
        return self.rope == "normal"

    def key(self, hparam: str) -> str:
        """The full GGUF metadata key of a hyperparameter, e.g. 'llama.block_count'."""
        return f"{self.name}.{self.keys[hparam]}"

    def tensor(self, role: str) -> Tensor:
        for t in self.tensors:
            if t.role == role:
                return t
        raise KeyError(f"{self.name} has no tensor role {role!r}")

    def weights(self, h: Dims) -> list[Weight]:
        """Every tensor a model with hyperparameters `h` has: globals, then layer by layer
        (a hybrid's layers by their kinds, its MTP blocks after the trunk)."""
        out = [Weight(t.gguf, t, -1, t.shape(h)) for t in self.tensors
               if not t.per_layer and _present(t, h)]
        kinds = layer_kinds(h)
        for i, kind in enumerate(kinds):
            hl = h.layer_dims(i) if hasattr(h, "layer_dims") else h   # Gemma 4: sizes per layer
            out += [Weight(t.gguf.format(i=i), t, i, t.shape(hl)) for t in self.tensors
                    if t.per_layer and _present(t, hl) and (not t.kinds or kind in t.kinds)]
        return out

    def match_hf(self, hf: str) -> tuple[Tensor, int] | None:
        """The table entry and layer (-1: global) of a Hugging Face tensor name, if any."""
        for t, rx in self._hf_patterns:
            m = rx.fullmatch(hf)
            if m:
                return t, int(m.group(1)) if t.per_layer else -1
        return None

    @cached_property
    def _hf_patterns(self) -> list[tuple[Tensor, re.Pattern]]:
        return [(t, re.compile(re.escape(t.hf).replace(r"\{i\}", r"(\d+)")))
                for t in self.tensors if t.hf is not None]


def _present(t: Tensor, h: Dims) -> bool:
    return t.when is None or bool(getattr(h, t.when))


#: Kinds of layer a hybrid interleaves: full attention, a recurrent (Gated DeltaNet) layer,
#: and the multi-token-prediction block stored after the trunk (Qwen3.5's `mtp.*`).
LAYER_KINDS = ("attention", "recurrent", "mtp", "shortconv")   # shortconv: LFM2's gated short convolution


def layer_kinds(h) -> tuple[str, ...]:
    """The kind of every stored layer of `h`: its `layer_kinds` when it has them (hybrids:
    the trunk, then the MTP blocks), else n_layer attention layers."""
    kinds = getattr(h, "layer_kinds", None)
    return tuple(kinds) if kinds else ("attention",) * h.n_layer


# ---------------------------------------------------------------------------- the families
_L = "model.layers.{i}."

#: A llama-style decoder: RMSNorm, GQA attention (optional q/k/v biases), SwiGLU FFN.
DECODER = (
    Tensor("token_embd", "token_embd.weight", lambda h: (h.n_embd, h.n_vocab), "model.embed_tokens.weight"),
    Tensor("output_norm", "output_norm.weight", lambda h: (h.n_embd,), "model.norm.weight"),
    Tensor("output", "output.weight", lambda h: (h.n_embd, h.n_vocab), "lm_head.weight", when="has_output"),
    Tensor("rope_freqs", "rope_freqs.weight", lambda h: (h.rope_dim // 2,), when="has_rope_freqs"),
    Tensor("attn_norm", "blk.{i}.attn_norm.weight", lambda h: (h.n_embd,), _L + "input_layernorm.weight"),
    Tensor("attn_q", "blk.{i}.attn_q.weight", lambda h: (h.n_embd, h.q_dim), _L + "self_attn.q_proj.weight"),
    Tensor("attn_k", "blk.{i}.attn_k.weight", lambda h: (h.n_embd, h.kv_dim), _L + "self_attn.k_proj.weight"),
    Tensor("attn_v", "blk.{i}.attn_v.weight", lambda h: (h.n_embd, h.kv_dim), _L + "self_attn.v_proj.weight"),
    Tensor("attn_q_bias", "blk.{i}.attn_q.bias", lambda h: (h.q_dim,), _L + "self_attn.q_proj.bias",
           when="has_qkv_bias"),
    Tensor("attn_k_bias", "blk.{i}.attn_k.bias", lambda h: (h.kv_dim,), _L + "self_attn.k_proj.bias",
           when="has_qkv_bias"),
    Tensor("attn_v_bias", "blk.{i}.attn_v.bias", lambda h: (h.kv_dim,), _L + "self_attn.v_proj.bias",
           when="has_qkv_bias"),
    Tensor("attn_output", "blk.{i}.attn_output.weight", lambda h: (h.q_dim, h.n_embd), _L + "self_attn.o_proj.weight"),
    Tensor("ffn_norm", "blk.{i}.ffn_norm.weight", lambda h: (h.n_embd,), _L + "post_attention_layernorm.weight"),
    Tensor("ffn_gate", "blk.{i}.ffn_gate.weight", lambda h: (h.n_embd, h.n_ff), _L + "mlp.gate_proj.weight"),
    Tensor("ffn_up", "blk.{i}.ffn_up.weight", lambda h: (h.n_embd, h.n_ff), _L + "mlp.up_proj.weight"),
    Tensor("ffn_down", "blk.{i}.ffn_down.weight", lambda h: (h.n_ff, h.n_embd), _L + "mlp.down_proj.weight"),
)

#: Per-head RMSNorm of q and k (Qwen3, Gemma 3): head_dim weights each.
QK_NORMS = (
    Tensor("attn_q_norm", "blk.{i}.attn_q_norm.weight", lambda h: (h.head_dim,), _L + "self_attn.q_norm.weight",
           when="has_qk_norm"),
    Tensor("attn_k_norm", "blk.{i}.attn_k_norm.weight", lambda h: (h.head_dim,), _L + "self_attn.k_norm.weight",
           when="has_qk_norm"),
)


def _gemma3_tensors() -> tuple[Tensor, ...]:
    """The decoder's tensors with Gemma's four norms per layer: input -> attn_norm,
    post_attention -> attn_post_norm, pre_feedforward -> ffn_norm, post_feedforward ->
    ffn_post_norm (llama.cpp's names)."""
    out = [t for t in DECODER if t.role not in ("ffn_norm", "rope_freqs")]
    out += [
        Tensor("ffn_norm", "blk.{i}.ffn_norm.weight", lambda h: (h.n_embd,), _L + "pre_feedforward_layernorm.weight"),
        Tensor("attn_post_norm", "blk.{i}.post_attention_norm.weight", lambda h: (h.n_embd,),
               _L + "post_attention_layernorm.weight", when="has_post_norms"),
        Tensor("ffn_post_norm", "blk.{i}.post_ffw_norm.weight", lambda h: (h.n_embd,),
               _L + "post_feedforward_layernorm.weight", when="has_post_norms"),
        Tensor("rope_freqs", "rope_freqs.weight", lambda h: (h.rope_dim // 2,), when="has_rope_freqs"),
    ]
    return tuple(out) + QK_NORMS


GEMMA3 = _gemma3_tensors()

#: general.architecture -> family. SmolLM and Mistral checkpoints are llama files.
#: Phi-3 / Phi-3.5 / Phi-4-mini: the decoder with fused q/k/v and gate/up tensors (split into
#: the decoder's C roles at load), neox RoPE over rope_dim <= head_dim, LongRoPE factors.
def _decoder(*roles: str) -> tuple[Tensor, ...]:
    return tuple(next(t for t in DECODER if t.role == r) for r in roles)


PHI3 = (
    *_decoder("token_embd", "output_norm", "output"),
    Tensor("rope_factors_long", "rope_factors_long.weight", lambda h: (h.rope_dim // 2,), when="has_longrope"),
    Tensor("rope_factors_short", "rope_factors_short.weight", lambda h: (h.rope_dim // 2,), when="has_longrope"),
    *_decoder("attn_norm"),
    Tensor("attn_qkv", "blk.{i}.attn_qkv.weight", lambda h: (h.n_embd, h.q_dim + 2 * h.kv_dim),
           _L + "self_attn.qkv_proj.weight",
           split=(("attn_q", lambda h: h.q_dim), ("attn_k", lambda h: h.kv_dim), ("attn_v", lambda h: h.kv_dim))),
    *_decoder("attn_output", "ffn_norm"),
    Tensor("ffn_up", "blk.{i}.ffn_up.weight", lambda h: (h.n_embd, 2 * h.n_ff), _L + "mlp.gate_up_proj.weight",
           split=(("ffn_gate", lambda h: h.n_ff), ("ffn_up", lambda h: h.n_ff))),
    *_decoder("ffn_down"),
)

#: Qwen3.5 (llama.cpp's qwen35): Gated DeltaNet layers ("recurrent": a causal depthwise conv
#: over q|k|v, L2-normed q/k, the gated delta rule over a ssm_head_dim^2 state per value head,
#: a gated RMSNorm, ssm_out) and gated attention layers (attn_q holds each head's query then
#: its output gate, 2 * q_dim rows; per-head Q/K norms; partial neox RoPE), both followed by
#: the SwiGLU FFN; an MTP block after the trunk. Value heads are stored in llama.cpp's tiled
#: order: value head h reads key head h % ssm_k_heads.
_LA = _L + "linear_attn."
_ATTN_MTP = ("attention", "mtp")
QWEN35 = (
    *_decoder("token_embd", "output_norm", "output"),
    Tensor("attn_norm", "blk.{i}.attn_norm.weight", lambda h: (h.n_embd,), _L + "input_layernorm.weight"),
    Tensor("attn_q", "blk.{i}.attn_q.weight", lambda h: (h.n_embd, 2 * h.q_dim), _L + "self_attn.q_proj.weight",
           kinds=_ATTN_MTP),
    *(replace(t, kinds=_ATTN_MTP) for t in _decoder("attn_k", "attn_v", "attn_output") + QK_NORMS),
    Tensor("ssm_qkv", "blk.{i}.attn_qkv.weight", lambda h: (h.n_embd, h.ssm_conv_dim), _LA + "in_proj_qkv.weight",
           kinds=("recurrent",)),
    Tensor("ssm_gate", "blk.{i}.attn_gate.weight", lambda h: (h.n_embd, h.ssm_inner), _LA + "in_proj_z.weight",
           kinds=("recurrent",)),
    Tensor("ssm_conv1d", "blk.{i}.ssm_conv1d.weight", lambda h: (h.ssm_conv_kernel, h.ssm_conv_dim),
           _LA + "conv1d.weight", kinds=("recurrent",),
           hf_shape=lambda h: (h.ssm_conv_dim, 1, h.ssm_conv_kernel)),
    Tensor("ssm_dt", "blk.{i}.ssm_dt.bias", lambda h: (h.ssm_v_heads,), _LA + "dt_bias", kinds=("recurrent",)),
    Tensor("ssm_a", "blk.{i}.ssm_a", lambda h: (h.ssm_v_heads,), _LA + "A_log", kinds=("recurrent",)),
    Tensor("ssm_beta", "blk.{i}.ssm_beta.weight", lambda h: (h.n_embd, h.ssm_v_heads), _LA + "in_proj_b.weight",
           kinds=("recurrent",)),
    Tensor("ssm_alpha", "blk.{i}.ssm_alpha.weight", lambda h: (h.n_embd, h.ssm_v_heads), _LA + "in_proj_a.weight",
           kinds=("recurrent",)),
    Tensor("ssm_norm", "blk.{i}.ssm_norm.weight", lambda h: (h.ssm_head_dim,), _LA + "norm.weight",
           kinds=("recurrent",)),
    Tensor("ssm_out", "blk.{i}.ssm_out.weight", lambda h: (h.ssm_inner, h.n_embd), _LA + "out_proj.weight",
           kinds=("recurrent",)),
    Tensor("ffn_norm", "blk.{i}.post_attention_norm.weight", lambda h: (h.n_embd,),
           _L + "post_attention_layernorm.weight"),
    *_decoder("ffn_gate", "ffn_up", "ffn_down"),
    # the MTP block's own tensors (HF mtp.fc, mtp.pre_fc_norm_*, mtp.norm; the converter
    # names mtp.* as the layers after the trunk, as llama.cpp's does)
    Tensor("nextn_eh_proj", "blk.{i}.nextn.eh_proj.weight", lambda h: (2 * h.n_embd, h.n_embd),
           _L + "mtp_fc.weight", kinds=("mtp",)),
    Tensor("nextn_enorm", "blk.{i}.nextn.enorm.weight", lambda h: (h.n_embd,), _L + "mtp_pre_fc_norm_embedding.weight",
           kinds=("mtp",)),
    Tensor("nextn_hnorm", "blk.{i}.nextn.hnorm.weight", lambda h: (h.n_embd,), _L + "mtp_pre_fc_norm_hidden.weight",
           kinds=("mtp",)),
    Tensor("nextn_shared_head_norm", "blk.{i}.nextn.shared_head_norm.weight", lambda h: (h.n_embd,),
           _L + "mtp_norm.weight", kinds=("mtp",)),
)

#: GGUF keys of the hybrids' recurrent layers (llama.cpp's LLM_KV_SSM_*, recurrent_layers, nextn)
HYBRID_KEYS: Mapping[str, str] = MappingProxyType({
    **GGUF_KEYS,
    "ssm_conv_kernel": "ssm.conv_kernel",
    "ssm_head_dim": "ssm.state_size",
    "ssm_k_heads": "ssm.group_count",
    "ssm_v_heads": "ssm.time_step_rank",
    "ssm_inner": "ssm.inner_size",
    "recurrent_layers": "attention.recurrent_layers",
    "full_attention_interval": "full_attention_interval",
    "n_mtp": "nextn_predict_layers",
    "rope_sections": "rope.dimension_sections",
})


def _gemma4_tensors() -> tuple[Tensor, ...]:
    """Gemma 3's tensors (shapes per layer: edgeinfer/arch/gemma4.py's layer_dims) with K, V and
    the K norm only in layers that store KV, the full layers' proportional-RoPE rope_freqs, the
    per-layer inputs and each block's output scale (llama.cpp's names)."""
    kv_roles = ("attn_k", "attn_v", "attn_k_norm")
    out = [replace(t, when="stores_kv") if t.role in kv_roles else t
           for t in GEMMA3 if t.role != "rope_freqs"]
    return tuple(out) + (
        Tensor("rope_freqs", "rope_freqs.weight", lambda h: (h.rope_dim // 2,), when="has_rope_freqs"),
        Tensor("per_layer_token_embd", "per_layer_token_embd.weight",
               lambda h: (h.n_embd_per_layer * h.n_layer, h.n_vocab), "model.embed_tokens_per_layer.weight",
               when="n_embd_per_layer"),
        Tensor("per_layer_model_proj", "per_layer_model_proj.weight",
               lambda h: (h.n_embd, h.n_embd_per_layer * h.n_layer), "model.per_layer_model_projection.weight",
               when="n_embd_per_layer"),
        Tensor("per_layer_proj_norm", "per_layer_proj_norm.weight", lambda h: (h.n_embd_per_layer,),
               "model.per_layer_projection_norm.weight", when="n_embd_per_layer"),
        Tensor("per_layer_inp_gate", "blk.{i}.inp_gate.weight", lambda h: (h.n_embd, h.n_embd_per_layer),
               _L + "per_layer_input_gate.weight", when="n_embd_per_layer"),
        Tensor("per_layer_proj", "blk.{i}.proj.weight", lambda h: (h.n_embd_per_layer, h.n_embd),
               _L + "per_layer_projection.weight", when="n_embd_per_layer"),
        Tensor("per_layer_post_norm", "blk.{i}.post_norm.weight", lambda h: (h.n_embd,),
               _L + "post_per_layer_input_norm.weight", when="n_embd_per_layer"),
        Tensor("layer_out_scale", "blk.{i}.layer_output_scale.weight", lambda h: (1,), _L + "layer_scalar"),
    )


GEMMA4 = _gemma4_tensors()

#: LFM2 (llama.cpp's lfm2): gated short-convolution layers (in_proj -> B, C, x; C * conv(B * x)
#: with a conv_kernel-tap causal depthwise conv; out_proj) and GQA attention layers with per-head
#: Q/K norms, each followed by the SwiGLU FFN. GGUF: head_count_kv per layer, 0 on conv layers;
#: the final norm is token_embd_norm (llama.cpp's name).
_LFM_ATTN = ("attention",)
_LFM_CONV = ("shortconv",)
LFM2 = (
    *_decoder("token_embd"),
    Tensor("output_norm", "token_embd_norm.weight", lambda h: (h.n_embd,), "model.embedding_norm.weight"),
    *_decoder("output"),
    Tensor("attn_norm", "blk.{i}.attn_norm.weight", lambda h: (h.n_embd,), _L + "operator_norm.weight"),
    *(replace(t, kinds=_LFM_ATTN) for t in _decoder("attn_q", "attn_k", "attn_v")),
    Tensor("attn_output", "blk.{i}.attn_output.weight", lambda h: (h.q_dim, h.n_embd), _L + "self_attn.out_proj.weight",
           kinds=_LFM_ATTN),
    Tensor("attn_q_norm", "blk.{i}.attn_q_norm.weight", lambda h: (h.head_dim,), _L + "self_attn.q_layernorm.weight",
           when="has_qk_norm", kinds=_LFM_ATTN),
    Tensor("attn_k_norm", "blk.{i}.attn_k_norm.weight", lambda h: (h.head_dim,), _L + "self_attn.k_layernorm.weight",
           when="has_qk_norm", kinds=_LFM_ATTN),
    Tensor("shortconv_conv", "blk.{i}.shortconv.conv.weight", lambda h: (h.conv_kernel, h.n_embd),
           _L + "conv.conv.weight", kinds=_LFM_CONV, hf_shape=lambda h: (h.n_embd, 1, h.conv_kernel)),
    Tensor("shortconv_in", "blk.{i}.shortconv.in_proj.weight", lambda h: (h.n_embd, 3 * h.n_embd),
           _L + "conv.in_proj.weight", kinds=_LFM_CONV),
    Tensor("shortconv_out", "blk.{i}.shortconv.out_proj.weight", lambda h: (h.n_embd, h.n_embd),
           _L + "conv.out_proj.weight", kinds=_LFM_CONV),
    Tensor("ffn_norm", "blk.{i}.ffn_norm.weight", lambda h: (h.n_embd,), _L + "ffn_norm.weight"),
    Tensor("ffn_gate", "blk.{i}.ffn_gate.weight", lambda h: (h.n_embd, h.n_ff), _L + "feed_forward.w1.weight"),
    Tensor("ffn_up", "blk.{i}.ffn_up.weight", lambda h: (h.n_embd, h.n_ff), _L + "feed_forward.w3.weight"),
    Tensor("ffn_down", "blk.{i}.ffn_down.weight", lambda h: (h.n_ff, h.n_embd), _L + "feed_forward.w2.weight"),
)

ARCHS: dict[str, Arch] = {
    "llama": Arch("llama", DECODER,
                  hf_classes={"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral"}),
    "qwen2": Arch("qwen2", DECODER, hf_classes={"Qwen2ForCausalLM": "qwen2"},
                  rope="neox", qkv_bias=True),
    # ---- Qwen3 / Gemma 3
    "qwen3": Arch("qwen3", DECODER + QK_NORMS, hf_classes={"Qwen3ForCausalLM": "qwen3"},
                  rope="neox", qkv_bias=False, qk_norm=True),
    "gemma3": Arch("gemma3", GEMMA3, hf_classes={"Gemma3ForCausalLM": "gemma3_text"},
                   rope="neox", qkv_bias=False, act="gelu_tanh", qk_norm=True, post_norms=True,
                   embd_scale_sqrt=True, norm_shift=1.0, swa_pattern=6,
                   hf_keys={**HF_KEYS, "act": "hidden_activation"}),
    "phi3": Arch("phi3", PHI3, hf_classes={"Phi3ForCausalLM": "phi3"}, rope="neox", qkv_bias=False,
                 hf_keys={**HF_KEYS, "partial_rotary": "partial_rotary_factor",
                          "n_ctx_orig": "original_max_position_embeddings"}),
    # SmolLM3: llama with every fourth layer unrotated (config.json's no_rope_layers)
    "smollm3": Arch("smollm3", DECODER, hf_classes={"SmolLM3ForCausalLM": "smollm3"}, no_rope_step=4,
                    hf_keys={**HF_KEYS, "no_rope_layers": "no_rope_layers"}),
    # Qwen3.5: Gated DeltaNet + gated attention hybrid; (1 + w) norms but the gated one
    "qwen35": Arch("qwen35", QWEN35, hf_classes={"Qwen3_5ForCausalLM": "qwen3_5_text",
                                                 "Qwen3_5ForConditionalGeneration": "qwen3_5"},
                   rope="neox", qkv_bias=False, qk_norm=True, attn_gate=True, norm_shift=1.0,
                   unshifted_norms=("ssm_norm",), keys=HYBRID_KEYS,
                   hf_keys={**HF_KEYS, "partial_rotary": "partial_rotary_factor"}),
    # LFM2 / LFM2.5: short-conv + GQA hybrid (layer kinds from head_count_kv per layer)
    "lfm2": Arch("lfm2", LFM2, hf_classes={"Lfm2ForCausalLM": "lfm2"}, rope="neox", qkv_bias=False, qk_norm=True,
                 keys={**GGUF_KEYS, "conv_kernel": "shortconv.l_cache"},
                 hf_keys={**HF_KEYS, "rms_eps": "norm_eps", "conv_kernel": "conv_L_cache",
                          "layer_types": "layer_types"}),
    # Gemma 4 (edgeinfer/arch/gemma4.py): Gemma 3's ops plus per-layer inputs, KV-shared layers,
    # two head sizes, v norms, layer scales (the CPU runtime: native/src/per_layer.c and per-layer sizes)
    "gemma4": Arch("gemma4", GEMMA4, hf_classes={"Gemma4ForCausalLM": "gemma4_text",
                                                 "Gemma4ForConditionalGeneration": "gemma4"},
                   rope="neox", qkv_bias=False, act="gelu_tanh", qk_norm=True, post_norms=True, v_norm=True,
                   embd_scale_sqrt=True, swa_pattern=0, rope_theta_local=10000.0,
                   keys={**GGUF_KEYS, "n_embd_per_layer": "embedding_length_per_layer_input",
                         "n_kv_shared": "attention.shared_kv_layers",
                         "head_dim_swa": "attention.key_length_swa", "value_dim_swa": "attention.value_length_swa",
                         "rope_dim_swa": "rope.dimension_count_swa"},
                   hf_keys={**HF_KEYS, "act": "hidden_activation"}),
}


def get_arch(name: str, where: str = "") -> Arch:
    """The family of a GGUF `general.architecture`; UnsupportedArchitectureError naming it."""
    if name not in ARCHS:
        raise UnsupportedArchitectureError(f"{where + ': ' if where else ''}unsupported architecture "
                                           f"{name!r}; supported: {', '.join(ARCHS)}")
    return ARCHS[name]


def arch_for_hf(config: dict) -> tuple[Arch, str]:
    """The family and class name of a Hugging Face config.json (its `architectures`, else
    its `model_type`)."""
    archs = config.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    if not archs:
        archs = [c for a in ARCHS.values() for c, t in a.hf_classes.items()
                 if t == config.get("model_type")]
    for cls in archs:
        for a in ARCHS.values():
            if cls in a.hf_classes:
                return a, cls
    got = ", ".join(map(str, archs)) or f"model_type {config.get('model_type')!r}"
    supported = ", ".join(c for a in ARCHS.values() for c in a.hf_classes)
    raise UnsupportedArchitectureError(f"unsupported architecture {got}; supported: {supported}")


def metadata_reader(meta: Mapping[str, object]) -> tuple["Arch", Callable[..., object]]:
    """The family of a GGUF's metadata and a getter of its hyperparameters by table name:
    get(hparam, default=None) reads `{arch}.<key>`, a missing key without default a GGUFError."""
    arch = get_arch(str(meta.get("general.architecture")))

    def get(hparam: str, default: object = None) -> object:
        v = meta.get(arch.key(hparam), default)
        if v is None:
            raise GGUFError(f"metadata key {arch.key(hparam)!r} is missing")
        return v

    return arch, get

