"""Qwen3.5's multi-token-prediction (MTP) block in numpy, in the style of reference.py: the
math the native draft (edgeinfer/engine/mtp.py, ei_forward_nextn) is judged by.

Entry p of the block combines the trunk's hidden state at position p with the token at
position p + 1 and predicts the token at p + 2:

    x   = eh_proj([enorm(embed(token[p + 1])); hnorm(h[p])])
    x   = Block(x)              one full gated-attention decoder layer (the file's layer n_layer),
                                causal over the block's own entries, RoPE at position p
    g   = shared_head_norm(x)   the state a further draft feeds back in place of h
    out = head(g)               the trunk's head

h[p] is the trunk's last hidden state after its final norm, as vLLM hands it over
(vllm/model_executor/models/qwen3_next_mtp.py: Qwen3NextMultiTokenPredictor.forward takes the
target model's returned hidden_states, which qwen3_next.py returns through `self.norm`; the
block's own output goes through its `norm` before both the head and the next draft step).
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from .ops import rms_norm
from .reference import ForwardParams, Reference


class NextnReference:
    """The trunk (Reference) and its first MTP block, in `dtype`."""

    def __init__(self, meta: Mapping, weights: Mapping[str, np.ndarray], dtype=np.float64):
        params = ForwardParams.from_metadata(meta)
        # the block is layer n_layer, an attention layer after the trunk's kinds
        params = dataclasses.replace(params, layer_kinds=tuple(params.layer_kinds) + ("attention",))
        self.ref = Reference(params, weights, dtype)
        self.block = params.n_layer       # the first MTP block (trunk layers: 0..n_layer-1)
        self.n_trunk = params.n_layer

    def trunk_hidden(self, ids: Sequence[int]) -> np.ndarray:
        """The trunk's final-normed hidden states [len(ids), n_embd] (teacher forced)."""
        ref = self.ref
        ids = np.asarray(list(ids), dtype=np.int64)
        pos = ref.positions(ids.size)
        x = ref.embed(ids)
        for i in range(self.n_trunk):
            x = ref.layer(i).forward(x, pos)
        return rms_norm(x, ref.tensor("output_norm"), ref.params.rms_eps)[0]

    def forward(self, next_ids: Sequence[int], hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Entries 0..n-1 of the block, entry p from next_ids[p] (the token at p + 1) and
        hidden[p]: (logits [n, n_vocab], the block's normed output states [n, n_embd])."""
        ref, i, eps = self.ref, self.block, self.ref.params.rms_eps
        ids = np.asarray(list(next_ids), dtype=np.int64)
        e = rms_norm(ref.embed(ids), ref.tensor("nextn_enorm", i), eps)[0]
        h = rms_norm(np.asarray(hidden, dtype=ref.dtype), ref.tensor("nextn_hnorm", i), eps)[0]
        x = np.concatenate([e, h], axis=-1) @ ref.tensor("nextn_eh_proj", i).T
        x = ref.layer(i).forward(x, ref.positions(ids.size))
        g = rms_norm(x, ref.tensor("nextn_shared_head_norm", i), eps)[0]
        return g @ ref.head().T, g

    def drafts(self, history: Sequence[int], k: int) -> list[int]:
        """k greedy drafts after `history` as the block proposes them: entries 0..n-2 from the
        trunk's states, then each further entry from the block's own previous state."""
        history = list(history)
        h = self.trunk_hidden(history)
        toks, hid = history[1:], list(h[:len(history) - 1])
        out: list[int] = []
        while len(out) < k:
            logits, g = self.forward(toks, np.stack(hid))
            out.append(int(np.argmax(logits[-1])))
            toks.append(out[-1])
            hid.append(g[-1])
        return out
