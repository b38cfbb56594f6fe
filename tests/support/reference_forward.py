"""The exact math: a float64 numpy forward pass of a GGUF transformer.

This is the oracle for the whole model.  Weights are dequantized with the
``gguf`` package (``gguf.quants.dequantize``) and every operation after that
runs in float64, with no activation quantization and no reduced-precision KV
cache.  Anything else (llama.cpp, edgeinfer) is judged by its distance from
these logits.

Supported architectures: ``llama`` (RoPE "normal" mode: adjacent pairs
(2i, 2i+1), because the GGUF converter permutes the Q/K rows for it) and
``qwen2`` (q/k/v biases, RoPE "neox" mode: pairs (i, i + d/2)) and ``phi3`` (fused
attn_qkv and gate/up ffn_up, neox RoPE over rope.dimension_count <= head_dim, LongRoPE:
the short or long factors by the context ``n_ctx`` as llama.cpp picks them, cos and sin
times rope.scaling.attn_factor).  The output head is tied to ``token_embd.weight`` when
``output.weight`` is absent.

    ref = ReferenceModel(path)
    lg = ref.logits(ids)          # np.float64 [len(ids), n_vocab]
    lg = ref.logits(ids, ring=(64, 4))   # as through a KV ring of 64 cells, 4 of them sinks

``ring=(capacity, n_sink)`` is the attention of edgeinfer's sliding KV ring
(edgeinfer/engine/kv.py): position i attends to positions 0..n_sink-1 and to
the last ``capacity - n_sink`` positions up to i, all rotated at their true
positions.

``reference_logits(path, ids)`` caches models and results per process so
several tests can share one forward pass.
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

SUPPORTED_ARCHS = ("llama", "qwen2", "phi3")


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


class ReferenceModel:
    """Float64 forward pass of a llama/qwen2 GGUF model (teacher-forced)."""

    def __init__(self, path: str | Path, n_ctx: int = 4096):
        import gguf
        from gguf.quants import dequantize

        self.path = str(path)
        reader = gguf.GGUFReader(self.path)
        arch = _field(reader, "general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise ValueError(f"reference forward: unsupported architecture {arch!r}")
        self.arch = arch
        a = arch
        self.n_layer = int(_field(reader, f"{a}.block_count"))
        self.n_embd = int(_field(reader, f"{a}.embedding_length"))
        self.n_head = int(_field(reader, f"{a}.attention.head_count"))
        self.n_head_kv = int(_field(reader, f"{a}.attention.head_count_kv", self.n_head))
        self.head_dim = int(_field(reader, f"{a}.attention.key_length", self.n_embd // self.n_head))
        self.rope_dim = int(_field(reader, f"{a}.rope.dimension_count", self.head_dim))
        self.rope_base = float(_field(reader, f"{a}.rope.freq_base", 10000.0))
        self.eps = float(_field(reader, f"{a}.attention.layer_norm_rms_epsilon", 1e-5))
        scaling_type = _field(reader, f"{a}.rope.scaling.type", "none")
        factor = float(_field(reader, f"{a}.rope.scaling.factor", 1.0) or 1.0)
        # linear RoPE scaling divides positions by the factor (llama.cpp freq_scale = 1/factor)
        self.rope_freq_scale = 1.0 / factor if scaling_type == "linear" and factor > 0 else 1.0
        self.rope_neox = arch in ("qwen2", "phi3")
        self.attn_factor = float(_field(reader, f"{a}.rope.scaling.attn_factor", 1.0))
        n_ctx_orig = int(_field(reader, f"{a}.rope.scaling.original_context_length",
                                _field(reader, f"{a}.context_length", 0)))
        if self.n_head % self.n_head_kv:
            raise ValueError("n_head must be a multiple of n_head_kv")

        w: dict[str, np.ndarray] = {}
        for t in reader.tensors:
            arr = dequantize(t.data, t.tensor_type)
            # numpy shape is reversed GGUF ne: (rows=out, cols=in) for matrices
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            w[t.name] = np.ascontiguousarray(np.asarray(arr, dtype=np.float64).reshape(shape))
        if arch == "phi3":   # fused tensors: rows [q | k | v] and [gate | up]
            qd, kvd = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
            for il in range(self.n_layer):
                p = f"blk.{il}."
                qkv = w.pop(p + "attn_qkv.weight")
                w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"] = (
                    qkv[:qd], qkv[qd:qd + kvd], qkv[qd + kvd:])
                gu = w[p + "ffn_up.weight"]
                w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"] = gu[:gu.shape[0] // 2], gu[gu.shape[0] // 2:]
            longrope = "rope_factors_long.weight" if n_ctx > n_ctx_orig else "rope_factors_short.weight"
            if longrope in w:
                w["rope_freqs.weight"] = w[longrope]
        self.w = w
        self.tok_embd = w["token_embd.weight"]
        self.output = w.get("output.weight", self.tok_embd)
        self.n_vocab = self.tok_embd.shape[0]
        self.tied_output = "output.weight" not in w

        # RoPE inverse frequencies: theta_i = base^(-2i/rope_dim), optional per-dim factors
        half = self.rope_dim // 2
        inv = self.rope_base ** (-2.0 * np.arange(half, dtype=np.float64) / self.rope_dim)
        ff = w.get("rope_freqs.weight")
        if ff is not None:
            inv = inv / ff.reshape(-1)[:half]
        self.inv_freq = inv

    # ------------------------------------------------------------------ ops
    def _rmsnorm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight

    def _rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """x: [T, H, head_dim]; rotates the first rope_dim dims of each head."""
        ang = (pos.astype(np.float64) * self.rope_freq_scale)[:, None] * self.inv_freq[None, :]
        cos = np.cos(ang)[:, None, :] * self.attn_factor  # [T, 1, half]
        sin = np.sin(ang)[:, None, :] * self.attn_factor
        out = x.copy()
        d = self.rope_dim
        if self.rope_neox:
            half = d // 2
            x0 = x[..., :half]
            x1 = x[..., half:d]
            out[..., :half] = x0 * cos - x1 * sin
            out[..., half:d] = x0 * sin + x1 * cos
        else:
            x0 = x[..., 0:d:2]
            x1 = x[..., 1:d:2]
            out[..., 0:d:2] = x0 * cos - x1 * sin
            out[..., 1:d:2] = x0 * sin + x1 * cos
        return out

    def _lin(self, x: np.ndarray, name: str) -> np.ndarray:
        y = x @ self.w[name + ".weight"].T
        b = self.w.get(name + ".bias")
        if b is not None:
            y = y + b
        return y

    # -------------------------------------------------------------- forward
    def hidden(self, ids, ring: tuple[int, int] | None = None) -> np.ndarray:
        """Final-normed hidden states, float64 [T, n_embd] (ring: see the module docstring)."""
        ids = np.asarray(list(ids), dtype=np.int64)
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError("ids must be a non-empty 1-D sequence")
        if ids.min() < 0 or ids.max() >= self.n_vocab:
            raise ValueError("token id out of range")
        T = ids.size
        H, Hkv, D = self.n_head, self.n_head_kv, self.head_dim
        group = H // Hkv
        pos = np.arange(T)
        causal = np.triu(np.ones((T, T), dtype=bool), k=1)  # True = masked
        if ring is not None:   # slid out: past the sinks and older than the window
            capacity, n_sink = ring
            i, j = np.indices((T, T))
            causal |= (j >= n_sink) & (j <= i - (capacity - n_sink))
        scale = 1.0 / np.sqrt(D)

        x = self.tok_embd[ids]  # [T, E]
        for il in range(self.n_layer):
            p = f"blk.{il}."
            h = self._rmsnorm(x, self.w[p + "attn_norm.weight"])
            q = self._lin(h, p + "attn_q").reshape(T, H, D)
            k = self._lin(h, p + "attn_k").reshape(T, Hkv, D)
            v = self._lin(h, p + "attn_v").reshape(T, Hkv, D)
            q = self._rope(q, pos)
            k = self._rope(k, pos)
            # GQA: query head h uses kv head h // group
            k = np.repeat(k, group, axis=1)  # [T, H, D]
            v = np.repeat(v, group, axis=1)
            qh = q.transpose(1, 0, 2)  # [H, T, D]
            kh = k.transpose(1, 2, 0)  # [H, D, T]
            vh = v.transpose(1, 0, 2)  # [H, T, D]
            s = (qh @ kh) * scale  # [H, T, T]
            s[:, causal] = -np.inf
            s = s - s.max(axis=-1, keepdims=True)
            pr = np.exp(s)
            pr /= pr.sum(axis=-1, keepdims=True)
            att = (pr @ vh).transpose(1, 0, 2).reshape(T, H * D)
            x = x + self._lin(att, p + "attn_output")

            h = self._rmsnorm(x, self.w[p + "ffn_norm.weight"])
            g = self._lin(h, p + "ffn_gate")
            u = self._lin(h, p + "ffn_up")
            act = g / (1.0 + np.exp(-g)) * u  # silu(gate) * up
            x = x + self._lin(act, p + "ffn_down")

        return self._rmsnorm(x, self.w["output_norm.weight"])

    def logits(self, ids, ring: tuple[int, int] | None = None) -> np.ndarray:
        """Teacher-forced logits, float64 [len(ids), n_vocab] (ring: see the module docstring)."""
        h = self.hidden(ids, ring)
        out = h @ self.output.T
        b = self.w.get("output.bias")
        if b is not None:
            out = out + b
        return out


_MODELS: dict[str, ReferenceModel] = {}
_LOGITS: dict[tuple[str, tuple[int, ...]], np.ndarray] = {}
_LOCK = threading.Lock()


def get_reference_model(path: str | Path) -> ReferenceModel:
    """Load (once per process) the float64 reference model for ``path``."""
    key = str(Path(path).resolve())
    with _LOCK:
        m = _MODELS.get(key)
        if m is None:
            m = ReferenceModel(key)
            _MODELS[key] = m
        return m


def reference_logits(path: str | Path, ids) -> np.ndarray:
    """Exact float64 logits [len(ids), n_vocab], cached per (path, ids). Do not mutate."""
    key = (str(Path(path).resolve()), tuple(int(i) for i in ids))
    hit = _LOGITS.get(key)
    if hit is not None:
        return hit
    lg = get_reference_model(path).logits(key[1])
    lg.setflags(write=False)
    _LOGITS[key] = lg
    return lg
