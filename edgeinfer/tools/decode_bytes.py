"""The bytes one decoded token moves, per forward stage, from a GGUF file's tensor table.

A decoded token reads every matrix once (the output head too: a tied file reads the token
embedding in full as its head), one row of the token embedding, and every layer's K and V
for each cell of its context; it writes one K/V row per layer. These are the bytes any
engine must move, whatever its layout (edgeinfer's row-interleaved copies are a little
larger), so bytes / time is a lower bound on the bandwidth a decode used.

Stages are the CPU runtime's profile stages (backends' ``caps.profile_stages``); a tensor
this table cannot place goes to ``other``, so that the total stays honest. Works for any
architecture the GGUF reader opens, runnable or not.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..gguf.reader import GGUFFile
from .plan import KV_TYPES

__all__ = ["DecodeBytes", "decode_bytes", "stage_of"]

# the base name of a tensor (blk.N.<base>.weight / <base>.weight) -> the profile stage reading it
_STAGE_OF = {
    "attn_q": "qkv", "attn_k": "qkv", "attn_v": "qkv", "attn_qkv": "qkv",
    "attn_q_norm": "qkv", "attn_k_norm": "qkv",
    "attn_output": "attn_out", "post_attention_norm": "attn_out",
    "attn_norm": "norm", "ffn_norm": "norm",
    "ffn_gate": "ffn_up", "ffn_up": "ffn_up",
    "ffn_down": "ffn_down", "post_ffw_norm": "ffn_down",
    "output": "head", "output_norm": "head", "token_embd_norm": "head",   # LFM2's final norm
}


# a recurrent layer's (LFM2 short convolution, Qwen3.5 Gated DeltaNet) own tensors start so
_RECURRENT_PREFIXES = ("shortconv", "ssm_")
# ... and these of its tensors are not its mixer's
_OUTSIDE_THE_MIXER = ("attn_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_attention_norm")


def _base(name: str) -> str:
    parts = name.split(".")
    return parts[2] if parts[0] == "blk" and len(parts) > 2 else parts[0]


def _layer(name: str) -> str:
    """'blk.N' of a layer's tensor."""
    return ".".join(name.split(".")[:2])


def _recurrent_layers(names) -> set[str]:
    """The 'blk.N' prefixes of the layers holding a recurrent mixer."""
    return {_layer(n) for n in names
            if n.startswith("blk.") and _base(n).startswith(_RECURRENT_PREFIXES)}


def stage_of(name: str, recurrent: bool = False) -> str:
    """The profile stage that reads tensor `name` ('other' when this table does not know it);
    `recurrent`: the tensor is in a recurrent layer, whose mixer the runtime times as one stage."""
    base = _base(name)
    if recurrent and base not in _OUTSIDE_THE_MIXER:
        return "recurrent"
    return _STAGE_OF.get(base, "other")


@dataclass
class DecodeBytes:
    """What a decoded token reads, from one file."""

    name: str
    path: Path
    file_bytes: int
    tensor_bytes: int               # every tensor in the file
    weights: dict[str, int]         # weight bytes read per token, by stage
    untied_embd_bytes: int          # a separate token embedding: gathered one row per token
    kv_layers: int                  # layers that read a KV ring (a hybrid's recurrent ones do not)
    kv_row_elems: int               # K and V elements per layer and context cell
    matrix_elems: dict[str, int]    # elements of the matrices a token multiplies, by stage (a prefill's work)
    attn_row_elems: int             # query heads x (K + V length): an attention layer's multiply-adds per cell

    @property
    def weight_bytes(self) -> int:
        return sum(self.weights.values())

    def kv_read(self, depth: float, kv: str = "f16") -> int:
        """Every attention layer's K and V for `depth` cells (a sliding-window layer reads fewer: an upper bound)."""
        return int(round(self.kv_layers * self.kv_row_elems * depth * KV_TYPES[kv]))

    def per_token(self, depth: float, kv: str = "f16") -> int:
        """Bytes a token decoded with `depth` cells of context reads: weights + KV."""
        return self.weight_bytes + self.kv_read(depth, kv)

    def by_stage(self, depth: float, kv: str = "f16") -> dict[str, int]:
        """Bytes per token by profile stage at that depth: the weights, the KV read (attention)
        and the K/V row written (rope_kv)."""
        out = dict(self.weights)
        out["attention"] = out.get("attention", 0) + self.kv_read(depth, kv)
        out["rope_kv"] = out.get("rope_kv", 0) + self.kv_read(1, kv)
        return out


def decode_bytes(path: str | Path) -> DecodeBytes:
    """Reads the tensor table and the KV shape of one GGUF file."""
    path = Path(path)
    g = GGUFFile(path)
    try:
        md, tensors = g.metadata, g.tensors
        arch = str(md.get("general.architecture", ""))

        def key(k, default=None):
            v = md.get(f"{arch}.{k}", default)
            return v[0] if isinstance(v, (list, tuple)) and v else v   # per-layer arrays

        weights: dict[str, int] = {}
        matrices: dict[str, int] = {}
        untied = 0
        recurrent = _recurrent_layers(tensors)
        # block_count counts a Qwen3.5 file's MTP block(s) last: a plain decode never reads them
        n_trunk = int(key("block_count", 0) or 0) - int(key("nextn_predict_layers", 0) or 0)
        for name, t in tensors.items():
            n = int(t.nbytes)
            if name.startswith("blk.") and int(name.split(".")[1]) >= n_trunk:
                continue
            if name == "token_embd.weight":
                weights["embed"] = weights.get("embed", 0) + int(t.row_nbytes)
                if "output.weight" in tensors:
                    untied = n
                else:                                                  # tied: the head reads it all
                    weights["head"] = weights.get("head", 0) + n
                    matrices["head"] = matrices.get("head", 0) + int(t.n_elements)
                continue
            stage = stage_of(name, _layer(name) in recurrent)
            weights[stage] = weights.get(stage, 0) + n
            if t.n_dims == 2:
                matrices[stage] = matrices.get(stage, 0) + int(t.n_elements)
        n_head = int(key("attention.head_count", 0) or 0)
        n_embd = int(key("embedding_length", 0) or 0)
        k_len = int(key("attention.key_length", n_embd // max(n_head, 1)) or 0)
        v_len = int(key("attention.value_length", k_len) or 0)
        # per layer in a hybrid's file (0 on recurrent layers): an attention layer's count
        n_head_kv = int(max(np.atleast_1d(key("attention.head_count_kv", n_head)), default=0) or 0)
        return DecodeBytes(
            name=str(md.get("general.name", "") or path.stem), path=path, file_bytes=path.stat().st_size,
            tensor_bytes=sum(int(t.nbytes) for t in tensors.values()), weights=weights,
            untied_embd_bytes=untied, kv_layers=n_trunk - len(recurrent),
            kv_row_elems=n_head_kv * (k_len + v_len), matrix_elems=matrices,
            attn_row_elems=n_head * (k_len + v_len))
    finally:
        g.close()
