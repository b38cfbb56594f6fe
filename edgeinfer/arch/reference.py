"""The forward pass of every family in the table, in numpy: the exact math the native runtimes
are judged by (the tests run it in float64) and the converter's float model for `--type auto`
(float32, with a backward pass in edgeinfer/convert/sensitivity.py over its `trace`).

It computes what native/src/forward.c computes, switched by the family's table entry (norm,
act, rope, qk_norm, post_norms, embd_scale_sqrt, swa_pattern, no_rope_step) and the file's hyperparameters,
with no quantized activations and no reduced-precision KV cache:

* weights: a mapping from GGUF tensor names to arrays in GGUF layout after the converter's
  transforms (numpy shape = GGML shape reversed, rows = outputs; llama's Q/K rows interleaved
  for its adjacent-pair RoPE; Gemma's norms stored as 1 + w); a fused tensor (Phi-3's
  attn_qkv, gate-and-up ffn_up) is cut into its table `split` roles; the head is
  token_embd when `output.weight` is absent;
* hyperparameters: GGUF metadata (`ForwardParams.from_metadata`), as the converter writes it;
* RoPE: inverse frequencies base^(-2i/rope_dim) over the first rope_dim dimensions of each
  head, divided by llama3's `rope_freqs` or LongRoPE's factors (long past the original
  context, as llama.cpp chooses by the context and transformers by the sequence length),
  positions times the linear scale, cos and sin times the attention factor; sliding-window
  layers use their own base, unscaled;
* attention: causal; a sliding-window layer sees its last swa_window positions; a KV ring
  (`ring=(capacity, n_sink)`, edgeinfer/engine/kv.py) limits a global layer to the sinks and
  the last capacity - n_sink positions, every key rotated at its true position.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import GGUFError
from .deltanet import deltanet_layer
from .ops import ACTIVATIONS, apply_rope, rms_norm, rotate
from .shortconv import shortconv_layer
from .table import Arch, HeadDims, RecurrentDims, metadata_reader

__all__ = ["ForwardParams", "Reference", "Layer", "Positions", "is_local_layer", "rms_norm", "rotate",
           "apply_rope", "ACTIVATIONS"]


def is_local_layer(layer: int, swa_window: int, swa_pattern: int) -> bool:
    """Is `layer` a sliding-window layer? With a window, every layer but each swa_pattern-th
    (swa_pattern 0: every layer), as the native runtimes decide (ei_layer_is_local)."""
    return swa_window > 0 and (swa_pattern == 0 or (layer + 1) % swa_pattern != 0)


@dataclass(frozen=True)
class ForwardParams(HeadDims, RecurrentDims):
    """The hyperparameters the forward pass reads (GGUF metadata of one model)."""
    arch: Arch
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rope_dim: int
    rope_theta: float
    rms_eps: float
    rope_freq_scale: float = 1.0      # linear RoPE scaling: 1 / factor
    rope_attn_factor: float = 1.0     # LongRoPE's scale of cos and sin
    rope_ctx_orig: int = 0            # LongRoPE: the context the short factors serve
    swa_window: int = 0
    local_layers: frozenset[int] = frozenset()
    rope_theta_local: float = 10000.0
    attn_scale: float = 0.0           # 0: 1 / sqrt(head_dim)
    final_softcap: float = 0.0        # 0: none
    # Qwen3.5: the trunk's layer kinds ("recurrent": Gated DeltaNet, edgeinfer/arch/deltanet.py)
    # and the DeltaNet sizes
    layer_kinds: tuple[str, ...] = ()
    ssm_head_dim: int = 0
    ssm_k_heads: int = 0
    ssm_v_heads: int = 0

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> "ForwardParams":
        """From GGUF key -> value (`general.architecture` and the family's keys)."""
        arch, get = metadata_reader(meta)

        n_layer, n_embd, n_head = int(get("n_layer")), int(get("n_embd")), int(get("n_head"))
        n_head_kv = get("n_head_kv", n_head)
        head_dim = int(get("head_dim", n_embd // n_head))
        if float(get("attn_softcap", 0.0)):
            raise GGUFError(f"{arch.key('attn_softcap')}: attention logit softcapping is not implemented")
        factor = float(get("rope_scaling_factor", 0.0) or get("rope_scale_linear", 0.0) or 0.0)
        window = int(get("swa_window", 0)) if arch.swa_pattern else 0
        pattern = get("swa_pattern", arch.swa_pattern)
        if isinstance(pattern, (list, tuple)):      # one flag per layer: true = sliding window
            local = {i for i, f in enumerate(pattern) if f and window}
        else:
            local = {i for i in range(n_layer) if is_local_layer(i, window, int(pattern))}
        hybrid = {}
        if "conv_kernel" in arch.keys:      # LFM2: head_count_kv per layer, 0 on a short-conv layer
            kv = [int(v) for v in (n_head_kv if isinstance(n_head_kv, (list, tuple)) else [n_head_kv] * n_layer)]
            n_head_kv = max(kv)
            hybrid = dict(layer_kinds=tuple("attention" if v else "shortconv" for v in kv))
        if "ssm_head_dim" in arch.keys:     # block_count counts the MTP blocks after the trunk
            n_layer -= int(get("n_mtp", 0))
            flags = get("recurrent_layers")
            hybrid = dict(layer_kinds=tuple("recurrent" if f else "attention" for f in flags[:n_layer]),
                          ssm_head_dim=int(get("ssm_head_dim")), ssm_k_heads=int(get("ssm_k_heads")),
                          ssm_v_heads=int(get("ssm_v_heads")))
        return cls(
            arch=arch, n_layer=n_layer, n_embd=n_embd, n_ff=int(get("n_ff")), n_head=n_head, n_head_kv=int(n_head_kv),
            head_dim=head_dim, rope_dim=int(get("rope_dim", head_dim)),
            rope_theta=float(get("rope_theta", 10000.0)), rms_eps=float(get("rms_eps")),
            rope_freq_scale=1.0 / factor if factor else 1.0,
            rope_attn_factor=float(get("rope_attn_factor", 1.0)),
            rope_ctx_orig=int(get("rope_ctx_orig", get("n_ctx_train", 0))),
            swa_window=window, local_layers=frozenset(local),
            rope_theta_local=float(get("rope_theta_local", arch.rope_theta_local)),
            attn_scale=float(get("attn_scale", 0.0)), final_softcap=float(get("final_softcap", 0.0)),
            **hybrid,
        )




@dataclass(frozen=True)
class Positions:
    """What attention needs for a sequence of positions 0..n-1, keyed by "is a sliding-window
    layer": (cos, sin) of shape [n, rope_dim] and the hidden keys [n, n] (True: masked)."""
    rope: Mapping[bool, tuple[np.ndarray, np.ndarray]]
    hide: Mapping[bool, np.ndarray]


class Reference:
    """The forward pass of one model in `dtype` (every weight and activation)."""

    def __init__(self, params: ForwardParams, weights: Mapping[str, np.ndarray], dtype=np.float64):
        self.params, self.weights, self.dtype = params, weights, np.dtype(dtype)
        a = params.arch
        self.neox = a.rope_neox
        self.act = ACTIVATIONS[a.act]
        self.attn_scale = params.attn_scale or 1.0 / math.sqrt(params.head_dim)
        self.embd_scale = self.dtype.type(math.sqrt(params.n_embd)) if a.embd_scale_sqrt else None

    # ------------------------------------------------------------- weights
    def tensor(self, role: str, layer: int = -1) -> np.ndarray:
        """The weight of a global (layer -1) or per-layer tensor of the table, in `dtype`."""
        name = self.params.arch.tensor(role).gguf.format(i=layer)
        if name not in self.weights:
            raise GGUFError(f"required tensor {name!r} is missing")
        return np.asarray(self.weights[name], dtype=self.dtype)

    def head(self) -> np.ndarray:
        """The output head: `output` when the file has it, else the tied token embedding."""
        name = self.params.arch.tensor("output").gguf
        return self.tensor("output" if name in self.weights else "token_embd")

    def layer(self, i: int) -> "Layer":
        return Layer(self, i)

    # ------------------------------------------------------------- positions
    def positions(self, n: int, n_ctx: int | None = None, ring: tuple[int, int] | None = None) -> Positions:
        """RoPE tables and masks for positions 0..n-1. n_ctx (default n) picks LongRoPE's
        factors; ring=(capacity, n_sink): attention through edgeinfer's sliding KV ring."""
        p, d = self.params, self.params.rope_dim
        pos = np.arange(n, dtype=np.float64)
        i, j = np.indices((n, n))
        hide = j > i
        exps = np.arange(0, d, 2, dtype=np.float64) / d
        inv = p.rope_theta ** -exps
        for name in self._rope_divisors(n if n_ctx is None else n_ctx):
            inv = inv / np.asarray(self.weights[name], dtype=np.float64).reshape(-1)[:d // 2]
        global_hide = hide.copy()
        if ring is not None:
            capacity, n_sink = ring
            global_hide |= (j >= n_sink) & (j <= i - (capacity - n_sink))
        rope = {False: self._rope_table(pos * p.rope_freq_scale, inv)}
        masks = {False: global_hide}
        if p.swa_window:
            rope[True] = self._rope_table(pos, p.rope_theta_local ** -exps)
            masks[True] = hide | (i - j >= p.swa_window)
        return Positions(rope, masks)

    def _rope_divisors(self, n_ctx: int) -> list[str]:
        """GGUF names of the per-frequency divisors in use: llama3's rope_freqs, LongRoPE's
        long factors past the original context, else its short ones."""
        a, w = self.params.arch, self.weights
        roles = ["rope_freqs", "rope_factors_long" if n_ctx > self.params.rope_ctx_orig else "rope_factors_short"]
        return [a.tensor(r).gguf for r in roles
                if any(t.role == r for t in a.tensors) and a.tensor(r).gguf in w]

    def _rope_table(self, pos: np.ndarray, inv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ang = np.outer(pos, inv)
        ang = np.concatenate([ang, ang], axis=-1) if self.neox else np.repeat(ang, 2, axis=-1)
        m = self.params.rope_attn_factor
        return (np.cos(ang) * m).astype(self.dtype), (np.sin(ang) * m).astype(self.dtype)

    # ------------------------------------------------------------- forward
    def embed(self, ids: np.ndarray) -> np.ndarray:
        """Token embeddings [n, n_embd] (Gemma: times sqrt(n_embd))."""
        x = self.tensor("token_embd")[ids]
        return x if self.embd_scale is None else x * self.embd_scale

    def output(self, x: np.ndarray, trace: dict | None = None) -> np.ndarray:
        """Logits from the last residual: final norm, head, softcap where the file has one."""
        xf, xn, xr = rms_norm(x, self.tensor("output_norm"), self.params.rms_eps)
        z = xf @ self.head().T
        cap = self.params.final_softcap
        th = None
        if cap:
            th = np.tanh(z / cap)
            z = cap * th
        if trace is not None:
            trace.update(xf=xf, xn=xn, xr=xr, softcap_tanh=th)
        return z

    def logits(self, ids: Sequence[int], n_ctx: int | None = None, ring: tuple[int, int] | None = None) -> np.ndarray:
        """Teacher-forced logits [len(ids), n_vocab] (n_ctx, ring: see `positions`)."""
        ids = np.asarray(list(ids), dtype=np.int64)
        n_vocab = self.weights[self.params.arch.tensor("token_embd").gguf].shape[0]
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError("ids must be a non-empty 1-D sequence")
        if ids.min() < 0 or ids.max() >= n_vocab:
            raise ValueError(f"token id out of range [0, {n_vocab})")
        pos = self.positions(ids.size, n_ctx, ring)
        x = self.embed(ids)
        for i in range(self.params.n_layer):
            x = self.layer(i).forward(x, pos)
        return self.output(x)


class Layer:
    """One block's weights by C role (fused tensors cut into their parts) and its forward.
    `parts`: GGUF name -> the roles its rows hold, in row order."""

    def __init__(self, ref: Reference, i: int):
        self.ref, self.index = ref, i
        p = ref.params
        self.local = i in p.local_layers
        self.rope = p.arch.layer_uses_rope(i)
        self.w: dict[str, np.ndarray] = {}
        self.parts: dict[str, list[str]] = {}
        for t in p.arch.tensors:
            name = t.gguf.format(i=i)
            if not t.per_layer or name not in ref.weights:
                continue
            w = np.asarray(ref.weights[name], dtype=ref.dtype)
            r0 = 0
            for role, rows in t.split or ((t.role, lambda _p, n=w.shape[0]: n),):
                n = rows(p)
                self.w[role] = w[r0:r0 + n]
                self.parts.setdefault(name, []).append(role)
                r0 += n

    def rope_tables(self, positions: Positions) -> tuple[np.ndarray, np.ndarray]:
        """This layer's (cos, sin); a layer without RoPE (SmolLM3's every fourth) turns by 0."""
        cos, sin = positions.rope[self.local]
        return (cos, sin) if self.rope else (np.ones_like(cos), np.zeros_like(sin))

    #: called as observe(role, x) with every matmul input (importance matrices), or None
    observe = None

    def linear(self, x: np.ndarray, role: str) -> np.ndarray:
        if self.observe is not None:
            self.observe(role, x)
        y = x @ self.w[role].T
        b = self.w.get(role + "_bias")
        return y if b is None else y + b

    def forward(self, x: np.ndarray, positions: Positions, trace: dict | None = None) -> np.ndarray:
        """The block on residual x [n, n_embd]; `trace` receives the intermediates a backward
        pass needs (heads first: [head, position, dim])."""
        ref, p, w = self.ref, self.ref.params, self.w
        a_ = p.arch
        eps, n = p.rms_eps, x.shape[0]
        nh, nkv, hd = p.n_head, p.n_head_kv, p.head_dim
        cos, sin = self.rope_tables(positions)
        t: dict = {}
        a, t["an"], t["ar"] = rms_norm(x, w["attn_norm"], eps)
        if p.layer_kinds and p.layer_kinds[self.index] == "recurrent":
            return self._ffn(x + deltanet_layer(a, w, p, linear=self.linear), t, trace)
        if p.layer_kinds and p.layer_kinds[self.index] == "shortconv":
            return self._ffn(x + shortconv_layer(a, w, linear=self.linear)[0], t, trace)
        q = self.linear(a, "attn_q").reshape(n, nh, -1)
        gate = q[:, :, hd:].reshape(n, nh * hd) if a_.attn_gate else None   # each head: query, then gate
        q = q[:, :, :hd].transpose(1, 0, 2)
        k = self.linear(a, "attn_k").reshape(n, nkv, hd).transpose(1, 0, 2)
        v = self.linear(a, "attn_v").reshape(n, nkv, hd).transpose(1, 0, 2)
        if a_.qk_norm:      # each head's RMSNorm before RoPE (Qwen3, Gemma 3)
            q, t["qn"], t["qnr"] = rms_norm(q, w["attn_q_norm"], eps)
            k, t["kn"], t["knr"] = rms_norm(k, w["attn_k_norm"], eps)
        qr = apply_rope(q, cos, sin, ref.neox)
        kr = apply_rope(k, cos, sin, ref.neox)
        group = nh // nkv       # query head h reads kv head h // group
        kx, vx = np.repeat(kr, group, axis=0), np.repeat(v, group, axis=0)
        s = qr @ kx.transpose(0, 2, 1) * ref.dtype.type(ref.attn_scale)
        s[:, positions.hide[self.local]] = -np.inf
        s -= s.max(-1, keepdims=True)
        pr = np.exp(s)
        pr /= pr.sum(-1, keepdims=True)
        o = (pr @ vx).transpose(1, 0, 2).reshape(n, nh * hd)
        if gate is not None:
            o = o / (1.0 + np.exp(-gate))
        ao = self.linear(o, "attn_output")
        if a_.post_norms:
            ao, t["pan"], t["panr"] = rms_norm(ao, w["attn_post_norm"], eps)
        if trace is not None:
            trace.update(a=a, qr=qr, kx=kx, vx=vx, pr=pr, o=o)
        return self._ffn(x + ao, t, trace)

    def _ffn(self, xm: np.ndarray, t: dict, trace: dict | None) -> np.ndarray:
        """The FFN half of the block on the residual after the token mixer."""
        ref, p, w = self.ref, self.ref.params, self.w
        a_, eps = p.arch, p.rms_eps
        b, t["bn"], t["br"] = rms_norm(xm, w["ffn_norm"], eps)
        gate = self.linear(b, "ffn_gate")
        up = self.linear(b, "ffn_up")
        m = ref.act(gate) * up
        fo = self.linear(m, "ffn_down")
        if a_.post_norms:
            fo, t["pfn"], t["pfnr"] = rms_norm(fo, w["ffn_post_norm"], eps)
        if trace is not None:
            trace.update(t, b=b, gate=gate, up=up, m=m)
        return xm + fo



def reference_for(meta: Mapping[str, Any], weights: Mapping[str, np.ndarray], dtype=np.float64, **kw):
    """The one entry point to a model's numpy forward, from its GGUF metadata: the family's own
    (Gemma 4: edgeinfer/arch/gemma4.py, `kw` such as kv_dtype) or the table-driven Reference."""
    if meta.get("general.architecture") == "gemma4":
        from .gemma4 import Gemma4Params, Gemma4Reference   # it builds on this module's ops
        return Gemma4Reference(Gemma4Params.from_metadata(meta), weights, dtype, **kw)
    return Reference(ForwardParams.from_metadata(meta), weights, dtype)
