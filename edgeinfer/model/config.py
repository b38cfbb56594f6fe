"""ModelConfig: the hyperparameters and tensor names of a supported model, from GGUF metadata,
validated against the tensors actually in the file."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..arch import Arch, HeadDims, Weight, get_arch
from ..arch.gemma4 import Gemma4Dims, Gemma4Params
from ..arch.table import (NATIVE_LAYER_KINDS, QKV_BIAS_ROLES, RANK_HEAD_BIAS, RANK_HEAD_WEIGHT, FamilySwitches,
                          RecurrentDims)
from ..arch.reference import is_local_layer as _is_local
from ..errors import GGUFError, UnsupportedArchitectureError, UnsupportedTypeError
from ..gguf.reader import GGUFFile
from ..gguf.types import COMPUTE_TYPES, GGMLType, ggml_type_name

__all__ = ["ModelConfig", "VECTOR_TYPES", "local_ring_cells", "kv_layer_cells"]

#: Types accepted for 1-D tensors (norm weights, biases, rope factors); llama.cpp's converter
#: always writes these as F32.
VECTOR_TYPES = frozenset({GGMLType.F32})

# Sanity bounds on hyperparameters.
MAX_LAYERS = 512
MAX_EMBD = 65536
MAX_HEADS = 1024
MAX_HEAD_DIM = 1024
MAX_FF = 1 << 20
MAX_VOCAB = 1 << 22
MAX_CTX = 1 << 24


@dataclass
class ModelConfig(HeadDims, FamilySwitches, Gemma4Dims, RecurrentDims):
    """A model's hyperparameters; the family's own switches (rope_neox, has_qk_norm, ...) come
    from its table entry (FamilySwitches), per-layer sizes from Gemma4Dims."""
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    rope_dim: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    has_qkv_bias: bool = False
    tied_output: bool = False
    rope_freq_scale: float = 1.0
    has_rope_freqs: bool = False
    # ---- Qwen3 / Gemma 3: GeGLU, embedding scale, sliding window
    act: str = "silu"
    embd_scale: float = 0.0        # 0: none
    attn_scale: float = 0.0        # 0: 1/sqrt(head_dim)
    final_softcap: float = 0.0     # 0: none
    swa_window: int = 0            # 0: every layer attends to the whole context
    swa_pattern: int = 0           # with swa_window: layer l is global iff (l + 1) % swa_pattern == 0
    rope_theta_local: float = 0.0  # RoPE base of the local layers (0: rope_theta)
    # LongRoPE (phi3; fam-b): short/long factor tensors, the context the short ones serve, and
    # the scale of the rotated dimensions (llama.cpp's rope.scaling.attn_factor; 1 = none)
    has_longrope: bool = False
    rope_ctx_orig: int = 0
    rope_attn_factor: float = 1.0
    # hybrids (LFM2): the kind of every layer (table LAYER_KINDS; empty: all attention) and the
    # taps of the recurrent layers' causal conv (LFM2's shortconv.l_cache)
    layer_kinds: tuple[str, ...] = ()
    conv_kernel: int = 0
    # Qwen3.5's Gated DeltaNet sizes (0: none); its layer_kinds end with the n_mtp MTP blocks the
    # file keeps after the n_layer trunk layers (loaded and checked, not run by the trunk)
    ssm_head_dim: int = 0
    ssm_k_heads: int = 0
    ssm_v_heads: int = 0
    n_mtp: int = 0
    # Gemma 4: the sliding layers' head size and rotated dims (0: head_dim, rope_dim), per-layer FFN
    # widths (empty: n_ff everywhere), per-layer sliding flags (empty: swa_pattern says), the last
    # n_kv_shared layers reading an earlier layer's KV, per-layer inputs' width
    head_dim_swa: int = 0
    rope_dim_swa: int = 0
    n_ff_layers: tuple[int, ...] = ()
    swa_layers: tuple[bool, ...] = ()
    n_kv_shared: int = 0
    n_embd_per_layer: int = 0
    tensor_types: dict[str, int] = field(default_factory=dict, repr=False)
    family: Arch | None = field(default=None, repr=False, compare=False)   # the table entry of `arch`

    # ------------------------------------------------------------- names
    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv

    @property
    def has_output(self) -> bool:
        return not self.tied_output

    @property
    def is_hybrid(self) -> bool:
        """Has layers with a recurrent state beside (or instead of) attention."""
        return any(k != "attention" for k in self.layer_kinds)

    @property
    def layer_kind(self) -> list[int]:
        """The native config's ei_layer_kind of each trunk layer."""
        return [NATIVE_LAYER_KINDS[k] for k in self.layer_kinds[:self.n_layer]]

    @property
    def ssm_conv_kernel(self) -> int:
        """The table's name for the delta-net conv's taps (conv_kernel)."""
        return self.conv_kernel

    @property
    def act_gelu(self) -> bool:
        """The native config's activation flag: GeGLU (tanh GELU) rather than SwiGLU."""
        return self.act == "gelu_tanh"

    def is_local_layer(self, layer: int) -> bool:
        """Is `layer` a sliding-window layer (attends to the last swa_window positions only)?"""
        if self.swa_layers:
            return self.swa_window > 0 and self.swa_layers[layer]
        return _is_local(layer, self.swa_window, self.swa_pattern)

    @property
    def local_layers(self) -> frozenset[int]:
        return frozenset(i for i in range(self.n_layer) if self.is_local_layer(i))

    @property
    def layer_full(self) -> list[int]:
        """The native config's per-layer flag: 1 for a layer a per-layer list keeps global."""
        return [int(not f) for f in self.swa_layers]

    @property
    def n_ff_per_layer(self) -> list[int]:
        """The native config's per-layer FFN widths (empty: n_ff everywhere)."""
        return list(self.n_ff_layers)

    def kv_layer_cells(self, n_ctx: int, max_batch: int) -> list[int]:
        """KV cells per slot each layer stores, as the CPU runtime allocates them (0: a recurrent
        or KV-shared layer)."""
        cells = kv_layer_cells(self.n_layer, self.swa_window, self.swa_pattern, n_ctx, max_batch, self.swa_layers)
        return [c if self.layer_stores_kv(i) and (not self.layer_kinds or self.layer_kinds[i] == "attention") else 0
                for i, c in enumerate(cells)]

    def kv_layer_elems(self) -> list[int]:
        """K (or V) elements per cell of each layer: its KV heads times its head size."""
        return [self.n_head_kv * self.layer_head_dim(i) for i in range(self.n_layer)]

    def weights(self) -> list[Weight]:
        """Every tensor this model uses (name, table entry, layer, GGML shape), in the table's
        order: globals, then layer by layer."""
        return self.family.weights(self)

    def tensor_names(self, layer: int) -> dict[str, str | None]:
        """GGUF names of layer `layer`'s tensors by role; None for roles this model lacks
        (e.g. the q/k/v biases of a model without them)."""
        if not 0 <= layer < self.n_layer:
            raise IndexError(f"layer {layer} out of range [0, {self.n_layer})")
        names: dict[str, str | None] = {t.role: None for t in self.family.tensors if t.per_layer}
        names.update({w.tensor.role: w.name for w in self.weights() if w.layer == layer})
        return names

    def global_tensor_names(self) -> dict[str, str | None]:
        """GGUF names of the global tensors by role; `output` is None when tied (use
        token_embd), `rope_freqs` None when absent."""
        names: dict[str, str | None] = {t.role: None for t in self.family.tensors if not t.per_layer}
        names.update({w.tensor.role: w.name for w in self.weights() if w.layer < 0})
        return names

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor this config uses -> its exact GGML shape (ne0 first)."""
        return {w.name: w.shape for w in self.weights()}

    # ------------------------------------------------------------- from GGUF
    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "ModelConfig":
        f.require_model()
        a = get_arch(f.get("general.architecture", kind=str), str(f.path))
        if not a.native:
            raise UnsupportedArchitectureError(f"{f.path}: architecture {a.name!r} converts, but the native "
                                               f"runtimes cannot run it yet")
        key = a.key

        def get_int(hparam: str, default=None, lo: int = 1, hi: int = 1 << 62) -> int:
            full = key(hparam)
            v = f.get(full, kind=int) if default is None else f.get(full, default, kind=int)
            if not lo <= v <= hi:
                raise GGUFError(f"{f.path}: metadata key {full!r} = {v} is out of range "
                                f"[{lo}, {hi}]")
            return int(v)

        def get_float(hparam: str, default=None) -> float:
            full = key(hparam)
            v = f.get(full, kind=float) if default is None else f.get(full, default, kind=float)
            v = float(v)
            if not math.isfinite(v):
                raise GGUFError(f"{f.path}: metadata key {full!r} = {v} is not finite")
            return v

        expert_count = get_int("n_expert", 0, lo=0)
        if expert_count > 0:
            raise GGUFError(f"{f.path}: mixture-of-experts models ({key('n_expert')} = "
                            f"{expert_count}) are not supported")

        n_layer = get_int("n_layer", hi=MAX_LAYERS)
        deltanet = _deltanet_layers(a, f, key, n_layer) if "ssm_head_dim" in a.keys else {}
        n_layer -= deltanet.get("n_mtp", 0)
        n_embd = get_int("n_embd", hi=MAX_EMBD)
        per_layer = _gemma4_hparams(a, f, n_layer) if "n_kv_shared" in a.keys else {}
        n_ff = per_layer.pop("n_ff", None) or get_int("n_ff", hi=MAX_FF)
        n_head = get_int("n_head", hi=MAX_HEADS)
        hybrid = _hybrid_layers(a, f, key, n_layer)
        n_head_kv = hybrid.pop("n_head_kv", None) or get_int("n_head_kv", n_head, hi=MAX_HEADS)
        if n_head % n_head_kv:
            raise GGUFError(f"{f.path}: {key('n_head')} ({n_head}) is not a multiple "
                            f"of {key('n_head_kv')} ({n_head_kv})")
        if key("head_dim") in f:
            head_dim = get_int("head_dim", hi=MAX_HEAD_DIM)
        else:
            if n_embd % n_head:
                raise GGUFError(f"{f.path}: {key('n_embd')} ({n_embd}) is not a multiple of "
                                f"{key('n_head')} ({n_head}) and {key('head_dim')} is absent")
            head_dim = n_embd // n_head
            if head_dim > MAX_HEAD_DIM:
                raise GGUFError(f"{f.path}: head dimension {head_dim} exceeds {MAX_HEAD_DIM}")
        if head_dim % 2:
            raise GGUFError(f"{f.path}: head dimension {head_dim} is odd (RoPE needs it even)")
        value_length = get_int("value_dim", head_dim, hi=MAX_HEAD_DIM)
        if value_length != head_dim:
            raise GGUFError(f"{f.path}: {key('value_dim')} ({value_length}) differs from "
                            f"the key length ({head_dim}); not supported")
        rope_dim = get_int("rope_dim", head_dim, hi=head_dim)
        if rope_dim % 2:
            raise GGUFError(f"{f.path}: {key('rope_dim')} ({rope_dim}) is odd")
        rope_theta = get_float("rope_theta", 10000.0)
        if rope_theta <= 0:
            raise GGUFError(f"{f.path}: {key('rope_theta')} = {rope_theta} must be > 0")
        rms_eps = get_float("rms_eps")
        if not 0 < rms_eps < 1:
            raise GGUFError(f"{f.path}: {key('rms_eps')} = {rms_eps} is not in (0, 1)")
        n_ctx_train = get_int("n_ctx_train", hi=MAX_CTX)

        scaling = f.get(key("rope_scaling"), "none", kind=str)
        if scaling not in ("none", "linear"):
            raise GGUFError(f"{f.path}: {key('rope_scaling')} = {scaling!r} is not supported "
                            f"(supported: none, linear)")
        factor = get_float("rope_scaling_factor", 0.0)
        if factor == 0.0:
            factor = get_float("rope_scale_linear", 0.0)
        if factor < 0 or (factor != 0 and not 1e-3 <= factor <= 1e3):
            raise GGUFError(f"{f.path}: rope scaling factor {factor} is out of range")
        rope_freq_scale = 1.0 / factor if factor else 1.0

        rope_ctx_orig = get_int("rope_ctx_orig", n_ctx_train, hi=MAX_CTX)
        rope_attn_factor = get_float("rope_attn_factor", 1.0)
        if not 1e-3 <= rope_attn_factor <= 1e3:
            raise GGUFError(f"{f.path}: {key('rope_attn_factor')} = {rope_attn_factor} is out of range")

        tensors = f.tensors
        embd = a.tensor("token_embd").gguf
        if embd not in tensors:
            raise GGUFError(f"{f.path}: required tensor {embd!r} is missing")
        tokens = f.get("tokenizer.ggml.tokens", None, kind=list)
        if key("n_vocab") in f:
            n_vocab = get_int("n_vocab", hi=MAX_VOCAB)
        elif tokens is not None:
            n_vocab = len(tokens)
        else:
            emb = tensors[embd].shape
            n_vocab = emb[1] if len(emb) == 2 else 0
        if not 1 <= n_vocab <= MAX_VOCAB:
            raise GGUFError(f"{f.path}: vocabulary size {n_vocab} is out of range "
                            f"[1, {MAX_VOCAB}]")
        if tokens is not None and len(tokens) > n_vocab:
            raise GGUFError(f"{f.path}: tokenizer.ggml.tokens has {len(tokens)} tokens but the "
                            f"model's vocabulary size is {n_vocab}")

        has_bias = bool(a.qkv_bias)
        if a.qkv_bias is None:    # the file decides: biases in every layer or in none
            bias_names = [a.tensor(r).gguf.format(i=0) for r in QKV_BIAS_ROLES]
            present = [n in tensors for n in bias_names]
            if any(present) and not all(present):
                have = [n for n, ok in zip(bias_names, present) if ok]
                raise GGUFError(f"{f.path}: only some q/k/v biases are present ({', '.join(have)})")
            has_bias = all(present)

        extra = _family_hparams(a, f, get_int, get_float, key, n_embd, head_dim)
        cfg = cls(
            arch=a.name, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
            head_dim=head_dim, n_ff=n_ff, n_vocab=n_vocab, n_ctx_train=n_ctx_train,
            rope_dim=rope_dim, rope_theta=rope_theta,
            rms_eps=rms_eps, has_qkv_bias=has_bias,
            tied_output=a.tensor("output").gguf not in tensors,
            rope_freq_scale=rope_freq_scale,
            has_rope_freqs=_has(a, "rope_freqs", tensors),
            has_longrope=_has(a, "rope_factors_long", tensors) or _has(a, "rope_factors_short", tensors),
            rope_ctx_orig=rope_ctx_orig, rope_attn_factor=rope_attn_factor,
            family=a, **{**extra, **per_layer}, **hybrid, **deltanet,
        )
        cfg._check_tensors(f)
        return cfg

    def _shape_source(self, name: str) -> str:
        """' (from KEY = value, ...)': the metadata a tensor's expected shape is computed from,
        found by reading its table shape through a probe that notes the sizes it asks for."""
        tensor = next(w.tensor for w in self.weights() if w.name == name)
        asked: list[str] = []
        cfg = self

        class Probe:
            def __getattr__(self, attr):
                asked.append(attr)
                return getattr(cfg, attr)

        tensor.shape(Probe())
        keys = [f"{self.family.key(a)} = {getattr(self, a)}" for a in dict.fromkeys(asked) if a in self.family.keys]
        return f" (from {', '.join(keys)})" if keys else ""

    def _check_tensors(self, f: GGUFFile) -> None:
        expected = self.expected_shapes()
        tensors = f.tensors
        for name, shape in expected.items():
            t = tensors.get(name)
            if t is None:
                raise GGUFError(f"{f.path}: required tensor {name!r} is missing "
                                f"({self.arch}, {self.n_layer} layers)")
            if t.shape != shape:
                raise GGUFError(f"{f.path}: tensor {name!r} has shape {list(t.shape)}, "
                                f"expected {list(shape)}{self._shape_source(name)}")
            allowed = VECTOR_TYPES if len(shape) == 1 else COMPUTE_TYPES
            if t.type not in allowed:
                raise UnsupportedTypeError(
                    f"{f.path}: tensor {name!r} has type {ggml_type_name(t.type)}, which edgeinfer "
                    f"cannot compute with here (supported: "
                    f"{', '.join(GGMLType(x).name for x in sorted(allowed))})")
            self.tensor_types[name] = t.type
        # a reranker's head is any family's, outside the forward (model/rank_head.py checks it)
        extra = [n for n in tensors if n not in expected and n not in (RANK_HEAD_WEIGHT, RANK_HEAD_BIAS)]
        if extra:
            shown = ", ".join(repr(n) for n in extra[:5])
            more = f" and {len(extra) - 5} more" if len(extra) > 5 else ""
            hint = ""
            if any(_BLK_RE.match(n) and int(_BLK_RE.match(n).group(1)) >= self.n_layer
                   for n in extra):
                hint = (f" (the file has more layers than {self.family.key('n_layer')} = "
                        f"{self.n_layer})")
            raise GGUFError(f"{f.path}: unexpected tensor(s) {shown}{more} not used by the "
                            f"{self.arch} architecture as edgeinfer implements it{hint}")


def _deltanet_layers(a: Arch, f: GGUFFile, key, n_blocks: int) -> dict:
    """Qwen3.5's layer kinds (attention.recurrent_layers: one flag per block, the MTP blocks last),
    its delta-net sizes, conv taps and MTP block count, each checked against the others."""
    def get(hparam: str, lo: int, hi: int, default=None) -> int:
        v = f.get(key(hparam), kind=int) if default is None else f.get(key(hparam), default, kind=int)
        if not lo <= v <= hi:
            raise GGUFError(f"{f.path}: {key(hparam)} = {v} is out of range [{lo}, {hi}]")
        return int(v)
    n_mtp = get("n_mtp", 0, n_blocks - 1, default=0)
    dims = {h: get(h, 1, 1 << 12) for h in ("ssm_head_dim", "ssm_k_heads", "ssm_v_heads")}
    conv = get("ssm_conv_kernel", 2, 16)
    if dims["ssm_v_heads"] % dims["ssm_k_heads"]:
        raise GGUFError(f"{f.path}: {key('ssm_v_heads')} = {dims['ssm_v_heads']} is not a multiple of "
                        f"{key('ssm_k_heads')} = {dims['ssm_k_heads']}")
    inner = f.get(key("ssm_inner"), None, kind=int)
    if inner is not None and inner != dims["ssm_v_heads"] * dims["ssm_head_dim"]:
        raise GGUFError(f"{f.path}: {key('ssm_inner')} = {inner} disagrees with {key('ssm_v_heads')} x "
                        f"{key('ssm_head_dim')} = {dims['ssm_v_heads'] * dims['ssm_head_dim']}")
    flags = f.get(key("recurrent_layers"))
    flags = flags.tolist() if hasattr(flags, "tolist") else flags
    if not isinstance(flags, list) or len(flags) != n_blocks:
        raise GGUFError(f"{f.path}: {key('recurrent_layers')} must hold {n_blocks} flags (one per block)")
    kinds = tuple("recurrent" if v else "attention" for v in flags[:n_blocks - n_mtp]) + ("mtp",) * n_mtp
    return {**dims, "conv_kernel": conv, "n_mtp": n_mtp, "layer_kinds": kinds}


def _hybrid_layers(a: Arch, f: GGUFFile, key, n_layer: int) -> dict:
    """A short-conv hybrid's layer kinds (LFM2, as llama.cpp reads them: a layer with
    head_count_kv 0 is a conv layer), its attention layers' KV head count and its conv taps;
    {} for a family without short-conv layers."""
    if not any("shortconv" in t.kinds for t in a.tensors):
        return {}
    full = key("n_head_kv")
    kv = f.get(full)
    kv = kv.tolist() if hasattr(kv, "tolist") else kv
    kv = [int(v) if isinstance(v, int) else v for v in kv] if isinstance(kv, list) else [kv] * n_layer
    if len(kv) != n_layer or any(not isinstance(v, int) or not 0 <= v <= MAX_HEADS for v in kv):
        raise GGUFError(f"{f.path}: {full} = {kv} must be {n_layer} head counts (0: a conv layer)")
    heads = {v for v in kv if v}
    if len(heads) != 1:
        raise GGUFError(f"{f.path}: {full} = {kv}: the attention layers must share one nonzero KV head count")
    conv = f.get(key("conv_kernel"), kind=int)
    if not 2 <= conv <= 16:
        raise GGUFError(f"{f.path}: {key('conv_kernel')} = {conv} is out of range [2, 16]")
    return {"n_head_kv": heads.pop(), "conv_kernel": int(conv),
            "layer_kinds": tuple("attention" if v else "shortconv" for v in kv)}


def _gemma4_hparams(a: Arch, f: GGUFFile, n_layer: int) -> dict:
    """Gemma 4's per-layer sizes and layout (edgeinfer/arch/gemma4.py reads its metadata), checked
    against what the native runtimes hold."""
    try:
        p = Gemma4Params.from_metadata(f.metadata)
    except (TypeError, ValueError) as e:
        raise GGUFError(f"{f.path}: gemma4 metadata: {e}") from e
    if not 0 < p.head_dim_swa <= p.head_dim or p.head_dim_swa % 2 or p.rope_dim_swa % 2 or \
            not 0 < p.rope_dim_swa <= p.head_dim_swa:
        raise GGUFError(f"{f.path}: {a.key('head_dim_swa')} = {p.head_dim_swa} / {a.key('rope_dim_swa')} = "
                        f"{p.rope_dim_swa} must be even, rope <= head <= {a.key('head_dim')} = {p.head_dim}")
    if int(f.get(a.key("value_dim_swa"), p.head_dim_swa)) != p.head_dim_swa:
        raise GGUFError(f"{f.path}: {a.key('value_dim_swa')} differs from {a.key('head_dim_swa')}; not supported")
    if not 0 <= p.n_kv_shared < n_layer or p.n_embd_per_layer < 0 or \
            any(not 0 < w <= MAX_FF for w in p.n_ff_layers) or len(p.n_ff_layers) not in (0, n_layer):
        raise GGUFError(f"{f.path}: gemma4 layout out of range (n_kv_shared {p.n_kv_shared}, per-layer input "
                        f"{p.n_embd_per_layer}, {len(p.n_ff_layers)} FFN widths for {n_layer} layers)")
    return dict(n_ff=p.n_ff, n_ff_layers=p.n_ff_layers, head_dim_swa=p.head_dim_swa, rope_dim_swa=p.rope_dim_swa,
                swa_window=p.swa_window, swa_pattern=0, swa_layers=tuple(i in p.local_layers for i in range(n_layer)),
                rope_theta_local=p.rope_theta_local, n_kv_shared=p.n_kv_shared, n_embd_per_layer=p.n_embd_per_layer,
                attn_scale=float(f.get(a.key("attn_scale"), 1.0)))   # q and k are normed: scale 1


def _has(a: Arch, role: str, tensors) -> bool:
    """Whether the file holds the optional global tensor `role` (False: the family has none)."""
    return any(t.role == role for t in a.tensors) and a.tensor(role).gguf in tensors


_BLK_RE = re.compile(r"^blk\.(\d+)\.")


def local_ring_cells(swa_window: int, n_ctx: int, max_batch: int) -> int:
    """Cells per slot of the sliding-window layers' own ring (native/src/runtime.h): the window
    plus a batch less one, so a batch's earliest query still finds its window once the batch's
    last token is stored; 0 (they use the full ring) when that is not smaller than n_ctx."""
    r = swa_window + max_batch - 1
    return r if swa_window > 0 and r < n_ctx else 0


def kv_layer_cells(n_layer: int, swa_window: int, swa_pattern: int, n_ctx: int, max_batch: int,
                   swa_layers: tuple[bool, ...] = ()) -> list[int]:
    """KV cells per slot of each layer: n_ctx, or the local ring for a sliding-window layer (the
    per-layer flags `swa_layers` when given, else the pattern)."""
    r = local_ring_cells(swa_window, n_ctx, max_batch)
    local = [bool(f) for f in swa_layers] if swa_layers else [_is_local(i, swa_window, swa_pattern)
                                                              for i in range(n_layer)]
    return [r if r and local[i] else n_ctx for i in range(n_layer)]


def _family_hparams(a: Arch, f: GGUFFile, get_int, get_float, key, n_embd: int, head_dim: int) -> dict:
    """The Qwen3 / Gemma 3 features: what the family implies plus its optional GGUF keys
    (sliding window, local RoPE base, attention scale, final softcap), as llama.cpp reads them."""
    out: dict = {"act": a.act, "embd_scale": math.sqrt(n_embd) if a.embd_scale_sqrt else 0.0}
    if key("attn_softcap") in f and get_float("attn_softcap", 0.0) != 0.0:
        raise GGUFError(f"{f.path}: {key('attn_softcap')} (attention logit softcapping) is not supported")
    out["final_softcap"] = get_float("final_softcap", 0.0)
    out["attn_scale"] = get_float("attn_scale", 0.0)
    if out["final_softcap"] < 0 or out["attn_scale"] < 0:
        raise GGUFError(f"{f.path}: {key('final_softcap')} and {key('attn_scale')} must be >= 0")
    window = get_int("swa_window", 0, lo=0, hi=MAX_CTX) if a.swa_pattern else 0
    if window:
        full = key("swa_pattern")
        pattern = a.swa_pattern
        if full in f:
            v = f.get(full)
            if isinstance(v, list):   # one flag per layer: accepted when it is the periodic layout
                n = next((p for p in range(1, len(v) + 2)
                          if all(bool(x) == ((i + 1) % p != 0) for i, x in enumerate(v))), None)
                if n is None:
                    raise GGUFError(f"{f.path}: {full} = {v} is not a periodic local/global layout")
                pattern = 0 if n > len(v) else n
            else:
                pattern = get_int("swa_pattern", lo=0, hi=MAX_LAYERS)
        out.update(swa_window=window, swa_pattern=pattern,
                   rope_theta_local=get_float("rope_theta_local", a.rope_theta_local))
        if out["rope_theta_local"] <= 0:
            raise GGUFError(f"{f.path}: {key('rope_theta_local')} must be > 0")
    return out


def layer_state_floats(cfg) -> tuple[int, ...]:
    """Floats of each trunk layer's recurrent state per slot, as the CPU runtime lays them out
    (ei_layer_state_floats, edgeinfer_layout.h): the conv window, (conv_kernel - 1) x channels
    (n_embd for a short conv; q, k and v for a delta-net layer), then a delta-net layer's
    [value head][d_k][d_v] matrix; each layer's block rounded up to a 64-byte line (state.c)."""
    out = []
    for kind in cfg.layer_kinds[:cfg.n_layer]:
        if kind == "shortconv":
            floats = (cfg.conv_kernel - 1) * cfg.n_embd
        elif kind == "recurrent":
            floats = (cfg.conv_kernel - 1) * cfg.ssm_conv_dim + cfg.ssm_inner * cfg.ssm_head_dim
        else:
            floats = 0
        out.append((floats + 15) // 16 * 16)
    return tuple(out)
