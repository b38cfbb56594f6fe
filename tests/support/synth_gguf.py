"""A synthetic F32 Llama GGUF written directly (no checkpoint, no torch): the quantizer
comparisons' input where a shape matters more than a model (80 layers, odd row lengths)."""
from __future__ import annotations

import numpy as np

from edgeinfer.gguf.types import GGMLType as T
from edgeinfer.gguf.types import GGUFValueType as V
from edgeinfer.gguf.writer import GGUFWriter


def synth_llama_gguf(path, n_embd=256, n_ff=512, n_layer=2, n_vocab=256, tied=False, seed=0,
                     n_head_kv=4, extra=()):
    """An F32 llama GGUF (4 heads, `n_head_kv` of them for K and V) with weight-like random
    tensors (per-row scales, outliers); `extra`: (name, rows, cols) of more such tensors.
    Returns {name: array}."""
    from edgeinfer.text.tokenizer import _BYTE_TO_CHAR

    rng = np.random.default_rng(seed)

    def w(rows, cols):
        x = rng.standard_normal((rows, cols)).astype(np.float32) * 0.02
        x *= np.exp(rng.standard_normal((rows, 1)) * 0.5).astype(np.float32)
        x[rng.random((rows, cols)) < 0.002] *= 20
        return x

    t = {"token_embd.weight": w(n_vocab, n_embd)}
    for i in range(n_layer):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = np.ones(n_embd, np.float32)
        for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t[p + n + ".weight"] = w(n_embd * n_head_kv // 4 if n in ("attn_k", "attn_v") else n_embd, n_embd)
        t[p + "ffn_norm.weight"] = np.ones(n_embd, np.float32)
        t[p + "ffn_gate.weight"] = w(n_ff, n_embd)
        t[p + "ffn_up.weight"] = w(n_ff, n_embd)
        t[p + "ffn_down.weight"] = w(n_embd, n_ff)
    t["output_norm.weight"] = np.ones(n_embd, np.float32)
    if not tied:
        t["output.weight"] = w(n_vocab, n_embd)
    for name, rows, cols in extra:
        t[name] = w(rows, cols)
    with GGUFWriter(path) as wr:
        wr.add_kv("general.architecture", "llama")
        wr.add_kv("general.file_type", 0)
        for k, v in (("block_count", n_layer), ("context_length", 256),
                     ("embedding_length", n_embd), ("feed_forward_length", n_ff),
                     ("attention.head_count", 4), ("attention.head_count_kv", n_head_kv),
                     ("rope.dimension_count", n_embd // 4), ("vocab_size", n_vocab)):
            wr.add_kv("llama." + k, v)
        wr.add_kv("llama.attention.layer_norm_rms_epsilon", 1e-5)
        wr.add_kv("tokenizer.ggml.model", "gpt2")
        wr.add_kv("tokenizer.ggml.pre", "gpt-2")
        wr.add_kv("tokenizer.ggml.tokens", [_BYTE_TO_CHAR[b] for b in range(256)],
                  V.ARRAY, V.STRING)
        wr.add_kv("tokenizer.ggml.token_type", np.ones(256, np.int32))
        wr.add_kv("tokenizer.ggml.merges", ["a b"], V.ARRAY, V.STRING)
        for n, x in t.items():
            wr.add_tensor_info(n, x.shape[::-1], T.F32)
        wr.write_header()
        for n, x in t.items():
            wr.write_tensor_data(n, x)
    return t
