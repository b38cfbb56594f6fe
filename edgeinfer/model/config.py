"""ModelConfig: the hyperparameters and tensor names of a supported model, from GGUF metadata,
validated against the tensors actually in the file."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..errors import GGUFError, UnsupportedArchitectureError, UnsupportedTypeError
from ..gguf.reader import GGUFFile
from ..gguf.types import COMPUTE_TYPES, GGMLType, ggml_type_name

__all__ = ["ModelConfig", "SUPPORTED_ARCHITECTURES", "LAYER_TENSORS", "GLOBAL_TENSORS",
           "VECTOR_TYPES"]

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")

#: Per-layer tensor roles -> GGUF name template ({i} is the layer index).
LAYER_TENSORS: dict[str, str] = {
    "attn_norm": "blk.{i}.attn_norm.weight",
    "attn_q": "blk.{i}.attn_q.weight",
    "attn_k": "blk.{i}.attn_k.weight",
    "attn_v": "blk.{i}.attn_v.weight",
    "attn_q_bias": "blk.{i}.attn_q.bias",
    "attn_k_bias": "blk.{i}.attn_k.bias",
    "attn_v_bias": "blk.{i}.attn_v.bias",
    "attn_output": "blk.{i}.attn_output.weight",
    "ffn_norm": "blk.{i}.ffn_norm.weight",
    "ffn_gate": "blk.{i}.ffn_gate.weight",
    "ffn_up": "blk.{i}.ffn_up.weight",
    "ffn_down": "blk.{i}.ffn_down.weight",
}
_BIAS_ROLES = ("attn_q_bias", "attn_k_bias", "attn_v_bias")

#: Global tensor roles -> GGUF name. `output` is absent with a tied head; `rope_freqs`
#: (Llama 3.1-style per-dimension frequency factors) is optional.
GLOBAL_TENSORS: dict[str, str] = {
    "token_embd": "token_embd.weight",
    "output_norm": "output_norm.weight",
    "output": "output.weight",
    "rope_freqs": "rope_freqs.weight",
}

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
class ModelConfig:
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
    rope_neox: bool = False
    rms_eps: float = 1e-5
    has_qkv_bias: bool = False
    tied_output: bool = False
    rope_freq_scale: float = 1.0
    has_rope_freqs: bool = False
    tensor_types: dict[str, int] = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------- names
    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim

    def tensor_names(self, layer: int) -> dict[str, str | None]:
        """GGUF names of layer `layer`'s tensors by role; bias roles are None without biases."""
        if not 0 <= layer < self.n_layer:
            raise IndexError(f"layer {layer} out of range [0, {self.n_layer})")
        names: dict[str, str | None] = {r: t.format(i=layer) for r, t in LAYER_TENSORS.items()}
        if not self.has_qkv_bias:
            for r in _BIAS_ROLES:
                names[r] = None
        return names

    def global_tensor_names(self) -> dict[str, str | None]:
        """GGUF names of the global tensors by role; `output` is None when tied (use
        token_embd), `rope_freqs` None when absent."""
        names: dict[str, str | None] = dict(GLOBAL_TENSORS)
        if self.tied_output:
            names["output"] = None
        if not self.has_rope_freqs:
            names["rope_freqs"] = None
        return names

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor this config uses -> its exact GGML shape (ne0 first)."""
        e, q, kv, ff, v = self.n_embd, self.q_dim, self.kv_dim, self.n_ff, self.n_vocab
        shapes: dict[str, tuple[int, ...]] = {
            "token_embd.weight": (e, v),
            "output_norm.weight": (e,),
        }
        if not self.tied_output:
            shapes["output.weight"] = (e, v)
        if self.has_rope_freqs:
            shapes["rope_freqs.weight"] = (self.rope_dim // 2,)
        per_role = {
            "attn_norm": (e,), "attn_q": (e, q), "attn_k": (e, kv), "attn_v": (e, kv),
            "attn_q_bias": (q,), "attn_k_bias": (kv,), "attn_v_bias": (kv,),
            "attn_output": (q, e), "ffn_norm": (e,),
            "ffn_gate": (e, ff), "ffn_up": (e, ff), "ffn_down": (ff, e),
        }
        for i in range(self.n_layer):
            for role, name in self.tensor_names(i).items():
                if name is not None:
                    shapes[name] = per_role[role]
        return shapes

    # ------------------------------------------------------------- from GGUF
    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "ModelConfig":
        arch = f.get("general.architecture", kind=str)
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedArchitectureError(
                f"{f.path}: unsupported architecture {arch!r}; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
        p = arch + "."

        def get_int(key: str, default=None, lo: int = 1, hi: int = 1 << 62) -> int:
            full = p + key
            if default is None:
                v = f.get(full, kind=int)
            else:
                v = f.get(full, default, kind=int)
            if not lo <= v <= hi:
                raise GGUFError(f"{f.path}: metadata key {full!r} = {v} is out of range "
                                f"[{lo}, {hi}]")
            return int(v)

        def get_float(key: str, default=None) -> float:
            full = p + key
            v = f.get(full, kind=float) if default is None else f.get(full, default, kind=float)
            v = float(v)
            if not math.isfinite(v):
                raise GGUFError(f"{f.path}: metadata key {full!r} = {v} is not finite")
            return v

        expert_count = get_int("expert_count", 0, lo=0)
        if expert_count > 0:
            raise GGUFError(f"{f.path}: mixture-of-experts models ({p}expert_count = "
                            f"{expert_count}) are not supported")

        n_layer = get_int("block_count", hi=MAX_LAYERS)
        n_embd = get_int("embedding_length", hi=MAX_EMBD)
        n_ff = get_int("feed_forward_length", hi=MAX_FF)
        n_head = get_int("attention.head_count", hi=MAX_HEADS)
        n_head_kv = get_int("attention.head_count_kv", n_head, hi=MAX_HEADS)
        if n_head % n_head_kv:
            raise GGUFError(f"{f.path}: {p}attention.head_count ({n_head}) is not a multiple "
                            f"of {p}attention.head_count_kv ({n_head_kv})")
        if p + "attention.key_length" in f:
            head_dim = get_int("attention.key_length", hi=MAX_HEAD_DIM)
        else:
            if n_embd % n_head:
                raise GGUFError(f"{f.path}: {p}embedding_length ({n_embd}) is not a multiple of "
                                f"{p}attention.head_count ({n_head}) and "
                                f"{p}attention.key_length is absent")
            head_dim = n_embd // n_head
            if head_dim > MAX_HEAD_DIM:
                raise GGUFError(f"{f.path}: head dimension {head_dim} exceeds {MAX_HEAD_DIM}")
        if head_dim % 2:
            raise GGUFError(f"{f.path}: head dimension {head_dim} is odd (RoPE needs it even)")
        value_length = get_int("attention.value_length", head_dim, hi=MAX_HEAD_DIM)
        if value_length != head_dim:
            raise GGUFError(f"{f.path}: {p}attention.value_length ({value_length}) differs from "
                            f"the key length ({head_dim}); not supported")
        rope_dim = get_int("rope.dimension_count", head_dim, hi=head_dim)
        if rope_dim % 2:
            raise GGUFError(f"{f.path}: {p}rope.dimension_count ({rope_dim}) is odd")
        rope_theta = get_float("rope.freq_base", 10000.0)
        if rope_theta <= 0:
            raise GGUFError(f"{f.path}: {p}rope.freq_base = {rope_theta} must be > 0")
        rms_eps = get_float("attention.layer_norm_rms_epsilon")
        if not 0 < rms_eps < 1:
            raise GGUFError(f"{f.path}: {p}attention.layer_norm_rms_epsilon = {rms_eps} "
                            f"is not in (0, 1)")
        n_ctx_train = get_int("context_length", hi=MAX_CTX)

        scaling = f.get(p + "rope.scaling.type", "none", kind=str)
        if scaling not in ("none", "linear"):
            raise GGUFError(f"{f.path}: {p}rope.scaling.type = {scaling!r} is not supported "
                            f"(supported: none, linear)")
        factor = get_float("rope.scaling.factor", 0.0)
        if factor == 0.0:
            factor = get_float("rope.scale_linear", 0.0)
        if factor < 0 or (factor != 0 and not 1e-3 <= factor <= 1e3):
            raise GGUFError(f"{f.path}: rope scaling factor {factor} is out of range")
        rope_freq_scale = 1.0 / factor if factor else 1.0

        tensors = f.tensors
        if "token_embd.weight" not in tensors:
            raise GGUFError(f"{f.path}: required tensor 'token_embd.weight' is missing")
        tokens = f.get("tokenizer.ggml.tokens", None, kind=list)
        if p + "vocab_size" in f:
            n_vocab = get_int("vocab_size", hi=MAX_VOCAB)
        elif tokens is not None:
            n_vocab = len(tokens)
        else:
            emb = tensors["token_embd.weight"].shape
            n_vocab = emb[1] if len(emb) == 2 else 0
        if not 1 <= n_vocab <= MAX_VOCAB:
            raise GGUFError(f"{f.path}: vocabulary size {n_vocab} is out of range "
                            f"[1, {MAX_VOCAB}]")
        if tokens is not None and len(tokens) > n_vocab:
            raise GGUFError(f"{f.path}: tokenizer.ggml.tokens has {len(tokens)} tokens but the "
                            f"model's vocabulary size is {n_vocab}")

        bias_names = [LAYER_TENSORS[r].format(i=0) for r in _BIAS_ROLES]
        if arch == "qwen2":
            has_bias = True
        else:
            present = [n in tensors for n in bias_names]
            if any(present) and not all(present):
                have = [n for n, ok in zip(bias_names, present) if ok]
                raise GGUFError(f"{f.path}: only some q/k/v biases are present ({', '.join(have)})")
            has_bias = all(present)

        cfg = cls(
            arch=arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
            head_dim=head_dim, n_ff=n_ff, n_vocab=n_vocab, n_ctx_train=n_ctx_train,
            rope_dim=rope_dim, rope_theta=rope_theta, rope_neox=(arch == "qwen2"),
            rms_eps=rms_eps, has_qkv_bias=has_bias,
            tied_output="output.weight" not in tensors,
            rope_freq_scale=rope_freq_scale,
            has_rope_freqs="rope_freqs.weight" in tensors,
        )
        cfg._check_tensors(f)
        return cfg

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
                                f"expected {list(shape)}")
            allowed = VECTOR_TYPES if len(shape) == 1 else COMPUTE_TYPES
            if t.type not in allowed:
                raise UnsupportedTypeError(
                    f"{f.path}: tensor {name!r} has type {ggml_type_name(t.type)}, which edgeinfer "
                    f"cannot compute with here (supported: "
                    f"{', '.join(GGMLType(x).name for x in sorted(allowed))})")
            self.tensor_types[name] = t.type
        extra = [n for n in tensors if n not in expected]
        if extra:
            shown = ", ".join(repr(n) for n in extra[:5])
            more = f" and {len(extra) - 5} more" if len(extra) > 5 else ""
            hint = ""
            if any(_BLK_RE.match(n) and int(_BLK_RE.match(n).group(1)) >= self.n_layer
                   for n in extra):
                hint = f" (the file has more layers than {self.arch}.block_count = {self.n_layer})"
            raise GGUFError(f"{f.path}: unexpected tensor(s) {shown}{more} not used by the "
                            f"{self.arch} architecture as edgeinfer implements it{hint}")


_BLK_RE = re.compile(r"^blk\.(\d+)\.")
