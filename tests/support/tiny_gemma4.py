"""A tiny random-weight Gemma 4 checkpoint (Gemma4ForCausalLM) for the family's tests.

Six layers, sliding (s) and full (f) as s s s f s f; the last two share the KV of layers 2 (the
last sliding one that stores KV) and 3 (the last full one: llama.cpp takes the last two layers
that store KV, so the last of them must be full); per-layer input embeddings of width
8; full layers with head size 32 and proportional RoPE over a quarter of it, sliding layers with
head size 16; double-wide MLP in the KV-shared layers (as Gemma 4 E2B); final softcap 30;
non-trivial norms and layer scalars. The tokenizer is Gemma 4's form: tokenizer.json BPE over
"▁"-spaces with <0xXX> byte fallback (trained here with sentencepiece), Gemma 4's turn,
channel and tool tokens as specials.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from tests.support.tiny_checkpoints import _spm_model

N_LAYER = 6
LAYER_TYPES = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention",
               "sliding_attention", "full_attention"]
N_KV_SHARED = 2
SLIDING_WINDOW = 16
#: Gemma 4's chat and tool tokens (llama.cpp's converter marks the last seven always visible).
SPECIALS = ["<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>",
            "<|tool_response>", "<tool_response|>", '<|"|>']


def _tokenizer_json(out: Path) -> None:
    """tokenizer.json in Gemma 4's form from a sentencepiece BPE model: the pieces in id order,
    merges of every piece split into two pieces (ranked by the piece's score), byte fallback."""
    import sentencepiece as spm
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, AddedToken

    _spm_model(out, vocab_size=440, gemma=True)
    sp = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))
    vocab = {sp.id_to_piece(i): i for i in range(sp.vocab_size())}
    merges = []
    for piece, i in vocab.items():
        if sp.is_control(i) or sp.is_byte(i) or sp.is_unknown(i) or len(piece) < 2:
            continue
        for k in range(1, len(piece)):
            a, b = piece[:k], piece[k:]
            if a in vocab and b in vocab:
                merges.append(((i, vocab[a], vocab[b]), (a, b)))
    merges = [m for _, m in sorted(merges)]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")])
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer.model").unlink()


def build(out: str | os.PathLike, seed: int = 0, dtype: str = "float32") -> Path:
    import torch
    import transformers as tf

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _tokenizer_json(out)
    n_vocab = json.loads((out / "tokenizer.json").read_text())["added_tokens"][-1]["id"] + 1
    torch.manual_seed(seed)
    cfg = tf.Gemma4TextConfig(
        vocab_size=n_vocab, vocab_size_per_layer_input=n_vocab, hidden_size_per_layer_input=8,
        hidden_size=64, intermediate_size=160, num_hidden_layers=N_LAYER, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, global_head_dim=32, sliding_window=SLIDING_WINDOW,
        layer_types=list(LAYER_TYPES), num_kv_shared_layers=N_KV_SHARED, use_double_wide_mlp=True,
        final_logit_softcapping=30.0, rms_norm_eps=1e-6, initializer_range=0.05, max_position_embeddings=512,
        pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=True,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                            "rope_theta": 1000000.0}})
    modes = getattr(cfg, "kv_sharing_modes", None)   # no such attribute in transformers 5.17
    assert modes in (None, [None, None, "store", "store", "reuse", "reuse"]), modes
    model = tf.Gemma4ForCausalLM(cfg)
    with torch.no_grad():   # Gemma 4's norms scale by w (no 1 + w): non-trivial around 1
        for n, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
        for n, b in model.named_buffers():
            if n.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand_like(b))
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(out, safe_serialization=True)
    tcfg = {"tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "eos_token": "<eos>",
            "unk_token": "<unk>", "pad_token": "<pad>", "add_bos_token": True, "add_eos_token": False,
            "extra_special_tokens": SPECIALS[:3]}   # turns and think: control tokens, as in Gemma 4
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=1), encoding="utf-8")
    return out
