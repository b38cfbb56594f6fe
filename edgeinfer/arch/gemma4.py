"""Gemma 4 (llama.cpp's gemma4): what its table entry needs beyond Gemma 3's, and its numpy forward.

Beyond Gemma 3 (sliding-window layers, sandwich norms, GeGLU, scaled embeddings, final softcap):

* two head sizes: full-attention layers use `head_dim` (GGUF attention.key_length), sliding
  layers `head_dim_swa` (attention.key_length_swa); which layers slide is a per-layer list
  (attention.sliding_window_pattern, true = sliding);
* full layers' "proportional" RoPE: neox pairs (i, i + head_dim/2) over the whole head, base
  theta^(-2i/head_dim), only the first pairs turning: the converter writes rope_freqs with 1 for
  those and 1e30 for the rest (llama.cpp's layout), which sliding layers do not read;
* q, k and v RMS-normed per head (v without a weight); attention scale 1;
* the last `n_kv_shared` layers store no KV: each attends over the KV of the last layer that
  stores it, of its own kind (llama.cpp takes the last two such layers: the last one full, the
  one before sliding; the converter refuses other layouts);
* per-layer inputs: a second embedding (per_layer_token_embd, n_layer x n_embd_per_layer per
  token, times sqrt(n_embd_per_layer)) plus a projection of the scaled token embedding
  (per_layer_model_proj / sqrt(n_embd), RMS-normed per layer), summed and scaled by 1/sqrt(2);
  after each block, x += post_norm(proj(gelu(inp_gate(x)) * that layer's input));
* each block's output times its layer_output_scale;
* the KV-shared layers' FFN may be twice as wide (feed_forward_length is then one per layer).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import GGUFError
from .ops import ACTIVATIONS, apply_rope, rms_norm
from .table import metadata_reader

__all__ = ["Gemma4Dims", "Gemma4Params", "Gemma4Reference", "kv_source_layer"]


def kv_source_layer(layer: int, n_layer: int, n_kv_shared: int, local: bool) -> int:
    """The layer whose KV `layer` attends over: itself when it stores KV, else llama.cpp's
    choice, the last layer that stores KV (full) or the one before it (sliding)."""
    first_shared = n_layer - n_kv_shared
    if layer < first_shared:
        return layer
    return first_shared - (2 if local else 1)


class _LayerView:
    """Layer i's sizes under the names the table's shapes use (head_dim, q_dim, kv_dim, n_ff)
    and its `stores_kv` flag; everything else is the model's."""

    def __init__(self, dims: "Gemma4Dims", i: int):
        self._d, self._i = dims, i
        self.head_dim = dims.layer_head_dim(i)
        self.n_ff = dims.layer_n_ff(i)
        self.q_dim = dims.n_head * self.head_dim
        self.kv_dim = dims.n_head_kv * self.head_dim
        self.stores_kv = dims.layer_stores_kv(i)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._d, name)


class Gemma4Dims:
    """Per-layer sizes from the model's (ModelConfig, the converter's HParams, the reference); a
    model without them (head_dim_swa 0, no n_ff_layers, no KV-shared layers) has the same sizes in
    every layer."""
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int                 # full-attention layers'
    head_dim_swa: int
    n_ff_layers: tuple[int, ...]  # empty: n_ff everywhere
    local_layers: frozenset[int]
    n_kv_shared: int
    n_embd_per_layer: int

    def layer_head_dim(self, i: int) -> int:
        return self.head_dim_swa if i in self.local_layers and self.head_dim_swa else self.head_dim

    def layer_n_ff(self, i: int) -> int:
        return self.n_ff_layers[i] if self.n_ff_layers else self.n_ff

    def layer_stores_kv(self, i: int) -> bool:
        return i < self.n_layer - self.n_kv_shared

    def kv_source(self, i: int) -> int:
        return kv_source_layer(i, self.n_layer, self.n_kv_shared, i in self.local_layers)

    def layer_dims(self, i: int) -> _LayerView:
        return _LayerView(self, i)

    @property
    def stores_kv(self) -> bool:
        """Some layer stores KV (a layer's own answer: layer_dims(i).stores_kv)."""
        return self.n_kv_shared < self.n_layer



@dataclass(frozen=True)
class Gemma4Params(Gemma4Dims):
    """A Gemma 4 file's hyperparameters as the forward reads them (GGUF metadata)."""
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    head_dim_swa: int
    n_ff_layers: tuple[int, ...]
    local_layers: frozenset[int]
    n_kv_shared: int
    n_embd_per_layer: int
    rope_theta: float
    rope_theta_local: float
    rope_dim_swa: int
    swa_window: int
    rms_eps: float
    final_softcap: float

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> "Gemma4Params":
        arch, get = metadata_reader(meta)

        n_layer = int(get("n_layer"))
        n_ff = get("n_ff")
        n_ff = n_ff.tolist() if hasattr(n_ff, "tolist") else n_ff   # a GGUF array read as numpy
        n_ff_layers = tuple(int(x) for x in n_ff) if isinstance(n_ff, (list, tuple)) else ()
        pattern = list(get("swa_pattern"))
        if len(pattern) != n_layer:
            raise GGUFError(f"{arch.key('swa_pattern')}: {len(pattern)} flags for {n_layer} layers")
        head_dim_swa = int(get("head_dim_swa"))
        return cls(
            n_layer=n_layer, n_embd=int(get("n_embd")), n_ff=max(n_ff_layers) if n_ff_layers else int(n_ff),
            n_head=int(get("n_head")), n_head_kv=int(get("n_head_kv")), head_dim=int(get("head_dim")),
            head_dim_swa=head_dim_swa, n_ff_layers=n_ff_layers,
            local_layers=frozenset(i for i, f in enumerate(pattern) if f),
            n_kv_shared=int(get("n_kv_shared", 0)), n_embd_per_layer=int(get("n_embd_per_layer", 0)),
            rope_theta=float(get("rope_theta")), rope_theta_local=float(get("rope_theta_local", 10000.0)),
            rope_dim_swa=int(get("rope_dim_swa", head_dim_swa)), swa_window=int(get("swa_window")),
            rms_eps=float(get("rms_eps")), final_softcap=float(get("final_softcap", 0.0)))


class Gemma4Reference:
    """Gemma 4's forward pass in `dtype` over GGUF-layout weights (names -> arrays); `kv_dtype`
    rounds the stored K and V as a runtime's KV arena holds them (None: not at all)."""

    def __init__(self, params: Gemma4Params, weights: Mapping[str, np.ndarray], dtype=np.float64, kv_dtype=None):
        self.p, self.w, self.dtype = params, weights, np.dtype(dtype)
        self.kv_dtype = kv_dtype
        self.act = ACTIVATIONS["gelu_tanh"]

    def t(self, name: str) -> np.ndarray:
        if name not in self.w:
            raise GGUFError(f"required tensor {name!r} is missing")
        return np.asarray(self.w[name], dtype=self.dtype)

    def _rope(self, n: int, local: bool) -> tuple[np.ndarray, np.ndarray]:
        """(cos, sin) [n, head_dim] of a sliding or full layer (neox halves)."""
        p = self.p
        if local:
            d, base, div = p.rope_dim_swa, p.rope_theta_local, 1.0
        else:
            d, base = p.head_dim, p.rope_theta
            div = np.asarray(self.w["rope_freqs.weight"], np.float64) if "rope_freqs.weight" in self.w else 1.0
        inv = base ** -(np.arange(0, d, 2, dtype=np.float64) / d) / div
        ang = np.outer(np.arange(n, dtype=np.float64), inv)
        ang = np.concatenate([ang, ang], axis=-1)
        return np.cos(ang).astype(self.dtype), np.sin(ang).astype(self.dtype)

    def per_layer_inputs(self, ids: np.ndarray, x: np.ndarray) -> np.ndarray | None:
        """[n, n_layer, n_embd_per_layer]: token identity plus projected context, per layer."""
        p = self.p
        if not p.n_embd_per_layer:
            return None
        n, e = ids.size, p.n_embd_per_layer
        tok = self.t("per_layer_token_embd.weight")[ids].reshape(n, p.n_layer, e) * math.sqrt(e)
        proj = (x @ self.t("per_layer_model_proj.weight").T / math.sqrt(p.n_embd)).reshape(n, p.n_layer, e)
        proj = rms_norm(proj, self.t("per_layer_proj_norm.weight"), p.rms_eps)[0]
        return (proj + tok) / math.sqrt(2.0)

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        p = self.p
        ids = np.asarray(list(ids), dtype=np.int64)
        emb = self.t("token_embd.weight")
        if ids.ndim != 1 or ids.size == 0 or ids.min() < 0 or ids.max() >= emb.shape[0]:
            raise ValueError(f"ids must be a non-empty 1-D sequence in [0, {emb.shape[0]})")
        n = ids.size
        x = emb[ids] * self.dtype.type(math.sqrt(p.n_embd))
        ple = self.per_layer_inputs(ids, x)
        i, j = np.indices((n, n))
        hide = {False: j > i, True: (j > i) | (i - j >= p.swa_window)}
        rope = {loc: self._rope(n, loc) for loc in (False, True)}
        kv: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for layer in range(p.n_layer):
            x = self._block(layer, x, ple, rope, hide, kv)
        xf = rms_norm(x, self.t("output_norm.weight"), p.rms_eps)[0]
        head = self.t("output.weight") if "output.weight" in self.w else emb
        z = xf @ head.T
        if p.final_softcap:
            z = p.final_softcap * np.tanh(z / p.final_softcap)
        return z

    def _block(self, layer: int, x, ple, rope, hide, kv) -> np.ndarray:
        p, eps, n = self.p, self.p.rms_eps, x.shape[0]
        local = layer in p.local_layers
        hd, nh, nkv = p.layer_head_dim(layer), p.n_head, p.n_head_kv
        b = f"blk.{layer}."
        w = lambda name: self.t(b + name + ".weight")
        cos, sin = rope[local]
        a = rms_norm(x, w("attn_norm"), eps)[0]
        q = (a @ w("attn_q").T).reshape(n, nh, hd).transpose(1, 0, 2)
        q = apply_rope(rms_norm(q, w("attn_q_norm"), eps)[0], cos, sin, True)
        if p.layer_stores_kv(layer):
            k = (a @ w("attn_k").T).reshape(n, nkv, hd).transpose(1, 0, 2)
            v = (a @ w("attn_v").T).reshape(n, nkv, hd).transpose(1, 0, 2)
            k = apply_rope(rms_norm(k, w("attn_k_norm"), eps)[0], cos, sin, True)
            v = rms_norm(v, np.ones(hd, self.dtype), eps)[0]
            kv[layer] = (k, v) if self.kv_dtype is None else \
                tuple(a.astype(self.kv_dtype).astype(self.dtype) for a in (k, v))
        k, v = kv[p.kv_source(layer)]
        g = nh // nkv
        s = q @ np.repeat(k, g, axis=0).transpose(0, 2, 1)       # attention scale 1
        s[:, hide[local]] = -np.inf
        s -= s.max(-1, keepdims=True)
        pr = np.exp(s)
        pr /= pr.sum(-1, keepdims=True)
        o = (pr @ np.repeat(v, g, axis=0)).transpose(1, 0, 2).reshape(n, nh * hd)
        x = x + rms_norm(o @ w("attn_output").T, w("post_attention_norm"), eps)[0]
        f = rms_norm(x, w("ffn_norm"), eps)[0]
        f = (self.act(f @ w("ffn_gate").T) * (f @ w("ffn_up").T)) @ w("ffn_down").T
        x = x + rms_norm(f, w("post_ffw_norm"), eps)[0]
        if ple is not None:
            g_ = self.act(x @ w("inp_gate").T) * ple[:, layer]
            x = x + rms_norm(g_ @ w("proj").T, w("post_norm"), eps)[0]
        scale = b + "layer_output_scale.weight"
        return x * self.t(scale).reshape(()) if scale in self.w else x
