#!/usr/bin/env python3
"""Random-weight Hugging Face checkpoints at real model shapes, and their GGUF files from
both converters (llama.cpp's convert_hf_to_gguf.py + quantizer, and `edgeinfer convert`).

No real weights are reachable here, and the values of the weights do not change speed, so
speed is measured on these. Each checkpoint is the real model's config.json (written below
from memory of the published configs, no download), bf16 safetensors with N(0, 0.02)
matrices (norms near 1, Gemma's near 0 since Gemma adds 1), one shard per layer, written
tensor by tensor so the largest thing ever held is the embedding matrix (3B: < 1 GiB), and a
byte-level BPE tokenizer.json of exactly the real vocabulary size: the `tokenizers` trainer
on a few lines of text, padded with synthetic merges (token a + one byte), then the real
model's special tokens at their real ids.

llama.cpp's converter names the pre-tokenizer by hashing the ids a probe string encodes to
(`get_vocab_base_pre`); a synthetic vocabulary can never match a real model's hash, and the
converter has no fallback (it raises NotImplementedError). So the converter is run in a
child that wraps that one method: when the hash is unknown it returns the pre-tokenizer the
tokenizer.json really implements (the Llama 3 split regex -> "llama-bpe", Qwen2's ->
"qwen2", plain ByteLevel -> "gpt-2"), the name `edgeinfer convert` derives from the same
regex. Nothing else in the converter changes.

    python scripts/make_shape_model.py llama32-1b [--out ~/.cache/edgeinfer/shapes] [--types Q4_0,Q4_K_M,Q6_K]
        [--engines llamacpp,edgeinfer] [--hf-only] [--keep-bf16] [--llama-cpp DIR]

Files: OUT/hf/SHAPE/ (checkpoint), OUT/SHAPE.llamacpp.TYPE.gguf, OUT/SHAPE.edgeinfer.TYPE.gguf
(each written under a temporary name and renamed when complete). llama.cpp's converter comes
from the llama-cpp-python sdist (``--llama-cpp`` or $EDGEINFER_LLAMA_CPP_DIR: the vendor/llama.cpp
folder; default: unpacked from ~/.cache/edgeinfer/sdist/llama_cpp_python-0.3.36.tar.gz).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SDIST = Path(os.environ.get("EDGEINFER_CACHE") or Path.home() / ".cache" / "edgeinfer") / "sdist"
SDIST_NAME = "llama_cpp_python-0.3.36"
STD = 0.02

# ---------------------------------------------------------------------------- shapes

_LLAMA3_RX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_RX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE = {"llama3": "llama-bpe", "qwen2": "qwen2", "gpt2": "gpt-2", "gemma4": "default"}

_LLAMA3_SPECIALS = (["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                     "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
                     "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
                     "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
                    + [f"<|reserved_special_token_{i}|>" for i in range(3, 248)])
_QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                  "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                  "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                  "<|image_pad|>", "<|video_pad|>"]
_CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
           "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
_LLAMA3_CHAT = ("{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
                "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
_GEMMA_CHAT = ("{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + "
               "('model' if message['role'] == 'assistant' else message['role']) + '\n' + "
               "message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")

_LLAMA32_COMMON = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64,
    "hidden_act": "silu", "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": False, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": True,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 128256}
_LLAMA3_TOK = {"style": "llama3", "n_base": 128000, "front": [], "back": _LLAMA3_SPECIALS,
               "bos": "<|begin_of_text|>", "eos": "<|eot_id|>", "add_bos": True,
               "chat_template": _LLAMA3_CHAT}
_QWEN_TOK = {"style": "qwen2", "n_base": 151643, "front": [], "back": _QWEN_SPECIALS,
             "bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>", "add_bos": False,
             "chat_template": _CHATML}

SHAPES: dict[str, dict] = {
    "llama32-1b": {"config": {**_LLAMA32_COMMON, "hidden_size": 2048, "num_hidden_layers": 16,
                              "num_attention_heads": 32, "num_key_value_heads": 8},
                   "tokenizer": _LLAMA3_TOK, "edgeinfer": True},
    "llama32-3b": {"config": {**_LLAMA32_COMMON, "hidden_size": 3072, "num_hidden_layers": 28,
                              "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128},
                   "tokenizer": _LLAMA3_TOK, "edgeinfer": True},
    "qwen25-05b": {"config": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896,
        "initializer_range": 0.02, "intermediate_size": 4864, "max_position_embeddings": 32768,
        "max_window_layers": 21, "num_attention_heads": 14, "num_hidden_layers": 24,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "use_cache": True, "use_sliding_window": False, "vocab_size": 151936},
        "tokenizer": _QWEN_TOK, "edgeinfer": True, "qkv_bias": True},
    "qwen3-06b": {"config": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02,
        "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
        "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
        "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "use_cache": True, "use_sliding_window": False, "vocab_size": 151936},
        "tokenizer": _QWEN_TOK, "edgeinfer": False, "qk_norm": True},
    "gemma3-1b": {"config": {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "attention_bias": False, "attention_dropout": 0.0, "attn_logit_softcapping": None,
        "bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0,
        "final_logit_softcapping": None, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 1152, "initializer_range": 0.02, "intermediate_size": 6912,
        "max_position_embeddings": 32768, "num_attention_heads": 4, "num_hidden_layers": 26,
        "num_key_value_heads": 1, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
        "rope_local_base_freq": 10000.0, "rope_scaling": None, "rope_theta": 1000000.0,
        "sliding_window": 512, "sliding_window_pattern": 6, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 262144},
        # Gemma's real vocabulary is SentencePiece; a byte-level BPE of the same size has the
        # same embedding/output cost, and writing a 262K-piece .model needs protobuf.
        "tokenizer": {"style": "gpt2", "n_base": 262144 - 6,
                      "front": ["<pad>", "<eos>", "<bos>", "<unk>"],
                      "back": ["<start_of_turn>", "<end_of_turn>"], "bos": "<bos>",
                      "eos": "<end_of_turn>", "pad": "<pad>", "add_bos": True,
                      "chat_template": _GEMMA_CHAT},
        "edgeinfer": False, "qk_norm": True, "gemma": True},
    # SmolLM3-3B: llama with no RoPE in every fourth layer; the Llama 3 vocabulary
    "smollm3-3b": {"config": {
        "architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128012, "pad_token_id": 128004,
        "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 11008,
        "max_position_embeddings": 65536, "mlp_bias": False, "num_attention_heads": 16,
        "num_hidden_layers": 36, "num_key_value_heads": 4, "no_rope_layer_interval": 4,
        "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(36)], "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 5000000.0, "sliding_window": None, "use_sliding_window": False,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 128256},
        "tokenizer": _LLAMA3_TOK, "edgeinfer": True},
    # Hybrids and Gemma 4 (issues 25, 26): config.json as published (Qwen/Qwen3.5-0.8B's text part,
    # LiquidAI/LFM2-1.2B, google/gemma-4-E2B's text part), field names as transformers 5's config
    # classes read them. Their tensors come from that class's model built on the meta device
    # ("from_model"), so every name and shape is the one transformers and both converters expect.
    "qwen35-0.8b": {"config": {
        "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "attention_bias": False,
        "attention_dropout": 0.0, "attn_output_gate": True, "bos_token_id": None, "eos_token_id": 248044,
        "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu", "hidden_size": 1024,
        "initializer_range": 0.02, "intermediate_size": 3584,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 6,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
        "linear_num_value_heads": 16, "linear_value_head_dim": 128, "max_position_embeddings": 262144,
        # the real file has 1 MTP layer; the transformers class holds none of its tensors, so 0 here
        # (and llama.cpp's converter, which asserts MTP layers, runs with --no-mtp: "llamacpp_args")
        "mamba_ssm_dtype": "float32", "mtp_num_hidden_layers": 0, "num_attention_heads": 8,
        "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                            "mrope_interleaved": True, "mrope_section": [11, 11, 10]},
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 248320},
        # 248044 byte-level pieces, then the specials; the embedding has padding rows (as the real one)
        "tokenizer": {**_QWEN_TOK, "n_base": 248044}, "edgeinfer": True, "from_model": True,
        "llamacpp_args": ["--no-mtp"]},
    "lfm2-1.2b": {"config": {
        "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "block_auto_adjust_ff_dim": True,
        "block_dim": 2048, "block_ff_dim": 12288, "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 256,
        "block_norm_eps": 1e-05, "bos_token_id": 1, "eos_token_id": 7, "pad_token_id": 0, "conv_L_cache": 3,
        "conv_bias": False, "conv_dim": 2048, "conv_dim_out": 2048, "hidden_size": 2048,
        "intermediate_size": 12288,   # auto-adjusted: 2/3 x 12288 -> 8192 (a multiple of 256)
        "full_attn_idxs": [2, 5, 8, 10, 12, 14],
        "layer_types": ["full_attention" if i in (2, 5, 8, 10, 12, 14) else "conv" for i in range(16)],
        "max_position_embeddings": 128000, "norm_eps": 1e-05, "num_attention_heads": 32,
        "num_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "rope_theta": 1000000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 65536},
        "tokenizer": {"style": "llama3", "n_base": 65536 - 8,
                      "front": ["<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|fim_pre|>", "<|fim_mid|>",
                                "<|fim_suf|>", "<|im_start|>", "<|im_end|>"], "back": [],
                      "bos": "<|startoftext|>", "eos": "<|im_end|>", "pad": "<|pad|>", "add_bos": True,
                      "chat_template": _CHATML},
        "edgeinfer": True, "from_model": True},
    "gemma4-e2b": {"config": {
        "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "attention_bias": False,
        "attention_dropout": 0.0, "attention_k_eq_v": False, "bos_token_id": 2, "eos_token_id": 1,
        "pad_token_id": 0, "enable_moe_block": False, "final_logit_softcapping": 30.0, "global_head_dim": 512,
        "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1536,
        "hidden_size_per_layer_input": 256, "initializer_range": 0.02, "intermediate_size": 6144,
        "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 7,
        "max_position_embeddings": 131072, "num_attention_heads": 8, "num_global_key_value_heads": None,
        "num_hidden_layers": 35, "num_key_value_heads": 1, "num_kv_shared_layers": 20, "rms_norm_eps": 1e-06,
        "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                               "rope_type": "proportional"},
                            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
        "sliding_window": 512, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
        "use_double_wide_mlp": True, "vocab_size": 262144, "vocab_size_per_layer_input": 262144},
        # Gemma 4's form: BPE over "▁"-spaces with <0xXX> byte fallback ("gemma4" in llama.cpp)
        "tokenizer": {"style": "gemma4", "n_base": 262144 - 15,
                      "front": ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"],
                      "back": ["<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>", "<|tool_call>",
                               "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>'],
                      "bos": "<bos>", "eos": "<turn|>", "pad": "<pad>", "add_bos": True,
                      "chat_template": _GEMMA_CHAT},
        "edgeinfer": True, "from_model": True},
}
# Small shapes with the same structure, for tests (seconds to build and convert); larger
# weights than the real shapes' 0.02 so that attention is peaked and the logits spread out,
# which makes an engine that gets the model wrong visibly wrong.
SHAPES["llama-tiny"] = {**SHAPES["llama32-1b"], "std": 0.08, "config": {
    **SHAPES["llama32-1b"]["config"], "hidden_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
    "vocab_size": 2304, "bos_token_id": 2048, "eos_token_id": 2049},
    "tokenizer": {**_LLAMA3_TOK, "n_base": 2048}}
SHAPES["qwen2-tiny"] = {**SHAPES["qwen25-05b"], "std": 0.08, "config": {
    **SHAPES["qwen25-05b"]["config"], "hidden_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
    "vocab_size": 2112, "bos_token_id": 2048, "eos_token_id": 2048},
    "tokenizer": {**_QWEN_TOK, "n_base": 2048}}
del SHAPES["llama-tiny"]["config"]["head_dim"]   # derived: 256 / 4

# ---------------------------------------------------------------------------- tokenizer

_TEXT = """The quick brown fox jumps over the lazy dog. It's 2024, and we've got 3 apples.
Hello, world! How are you doing today? I'm fine, thanks; you'll see.
def add(a, b):
    return a + b
Once upon a time, in a small village, there lived an old clockmaker who loved tea.
Quantization maps float weights to small integers with a scale per block of values.
The model reads its weights from memory for every token it decodes, so bandwidth sets the pace.
"""


def _build_gemma4_tokenizer(spec: dict, out: Path) -> int:
    """Gemma 4's form (tests/support/tiny_gemma4.py at full size): BPE over "▁"-spaces with
    <0xXX> byte fallback; the front specials, the 256 byte pieces, pieces trained on a few
    lines, synthetic merges (piece + one character) up to the real size, then the back specials."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    front, back, n_base = spec["front"], spec["back"], spec["n_base"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.train_from_iterator([_TEXT] * 4, trainers.BpeTrainer(vocab_size=1000, show_progress=False,
                                                             special_tokens=list(front)))
    tj = json.loads(tok.to_str())
    trained = tj["model"]["vocab"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in tj["model"]["merges"]]
    order = [f"<0x{b:02X}>" for b in range(256)] + [t for t in sorted(trained, key=trained.get) if t not in front]
    seen = set(order) | set(front)
    chars = sorted(t for t in order if len(t) == 1)
    i = 256
    while len(order) < n_base:
        a = order[i]
        i += 1
        for c in chars:
            if a + c not in seen:
                seen.add(a + c)
                order.append(a + c)
                merges.append((a, c))
                if len(order) == n_base:
                    break
    vocab = {t: k for k, t in enumerate(list(front) + order)}
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in front])
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in back])
    tok.save(str(out / "tokenizer.json"))
    cfg = {"tokenizer_class": "GemmaTokenizer", "bos_token": spec["bos"], "eos_token": spec["eos"],
           "unk_token": "<unk>", "pad_token": spec["pad"], "add_bos_token": True, "add_eos_token": False,
           "chat_template": spec["chat_template"], "extra_special_tokens": back[:3]}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    return len(front) + n_base + len(back)


def build_tokenizer(spec: dict, out: Path) -> int:
    """Writes tokenizer.json + tokenizer_config.json; returns the number of tokens."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers, decoders, processors

    style, n_base = spec["style"], spec["n_base"]
    if style == "gemma4":
        return _build_gemma4_tokenizer(spec, out)
    tok = Tokenizer(models.BPE(ignore_merges=(style == "llama3")))
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=(style == "gpt2"))
    if style == "gpt2":
        tok.pre_tokenizer = bl
    else:
        rx = _LLAMA3_RX if style == "llama3" else _QWEN2_RX
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(rx), behavior="isolated", invert=False), bl])
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator([_TEXT] * 4 + [spec.get("extra_text", "")], trainers.BpeTrainer(
        vocab_size=min(n_base, 1000), initial_alphabet=alphabet, show_progress=False))
    tj = json.loads(tok.to_str())
    vocab: dict[str, int] = tj["model"]["vocab"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in tj["model"]["merges"]]
    # pad with synthetic merges (token + one byte char) up to the real size
    order = sorted(vocab, key=vocab.get)
    seen = set(vocab)
    chars = sorted(alphabet)
    i = 0
    while len(order) < n_base:
        a = order[i]
        i += 1
        for c in chars:
            t = a + c
            if t not in seen:
                seen.add(t)
                order.append(t)
                merges.append((a, c))
                if len(order) == n_base:
                    break
    front, back = spec["front"], spec["back"]
    ids = {t: k + len(front) for k, t in enumerate(order)}
    for k, t in enumerate(front):
        ids[t] = k
    for k, t in enumerate(back):
        ids[t] = len(front) + n_base + k
    tj["model"]["vocab"] = ids
    tj["model"]["merges"] = [list(m) for m in merges]
    tj["added_tokens"] = [{"id": ids[t], "content": t, "single_word": False, "lstrip": False,
                           "rstrip": False, "normalized": False, "special": True}
                          for t in front + back]
    tok = Tokenizer.from_str(json.dumps(tj))
    if spec.get("add_bos") and spec["bos"] and style == "llama3":
        bos = spec["bos"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, ids[bos])])
    tok.save(str(out / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 131072,
           "clean_up_tokenization_spaces": False, "chat_template": spec["chat_template"],
           "add_bos_token": bool(spec.get("add_bos")), "add_eos_token": False,
           "bos_token": spec["bos"], "eos_token": spec["eos"]}
    if spec.get("pad"):
        cfg["pad_token"] = spec["pad"]
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    return len(front) + n_base + len(back)


# ---------------------------------------------------------------------------- weights

def _tensors(shape: dict, layer: int | None):
    """(name, shape, kind) of the embedding + final norm (layer None) or of one layer."""
    c = shape["config"]
    h, ffn = c["hidden_size"], c["intermediate_size"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or h // nh
    if layer is None:
        out = [("model.embed_tokens.weight", (c["vocab_size"], h), "w"), ("model.norm.weight", (h,), "n")]
        if not c.get("tie_word_embeddings"):
            out.append(("lm_head.weight", (c["vocab_size"], h), "w"))
        return out
    p = f"model.layers.{layer}."
    out = [(p + "input_layernorm.weight", (h,), "n"), (p + "post_attention_layernorm.weight", (h,), "n"),
           (p + "self_attn.q_proj.weight", (nh * hd, h), "w"),
           (p + "self_attn.k_proj.weight", (nkv * hd, h), "w"),
           (p + "self_attn.v_proj.weight", (nkv * hd, h), "w"),
           (p + "self_attn.o_proj.weight", (h, nh * hd), "w"),
           (p + "mlp.gate_proj.weight", (ffn, h), "w"), (p + "mlp.up_proj.weight", (ffn, h), "w"),
           (p + "mlp.down_proj.weight", (h, ffn), "w")]
    if shape.get("qkv_bias"):
        out += [(p + f"self_attn.{x}_proj.bias", (n * hd,), "b") for x, n in (("q", nh), ("k", nkv), ("v", nkv))]
    if shape.get("qk_norm"):
        out += [(p + "self_attn.q_norm.weight", (hd,), "n"), (p + "self_attn.k_norm.weight", (hd,), "n")]
    if shape.get("gemma"):
        out += [(p + "pre_feedforward_layernorm.weight", (h,), "n"),
                (p + "post_feedforward_layernorm.weight", (h,), "n")]
    return out


def _model_tensors(shape: dict) -> list[tuple[int | None, str, tuple, str]]:
    """(layer or None, name, shape, kind) of every tensor the transformers class of the config
    holds (built on the meta device: no memory), tied heads left out. kind: "w" a matrix or conv,
    "n" a norm or scalar (near 1), "b" any other vector (A_log, dt_bias: small)."""
    import re

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    c = dict(shape["config"])
    cfg = AutoConfig.for_model(c.pop("model_type"), **c)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    out = []
    for tname, t in model.state_dict().items():
        if tname == "lm_head.weight" and shape["config"].get("tie_word_embeddings"):
            continue
        m = re.search(r"\.layers\.(\d+)\.", tname)
        kind = "w" if t.ndim >= 2 else "n" if ("norm" in tname or "scalar" in tname) else "b"
        out.append((int(m.group(1)) if m else None, tname, tuple(t.shape), kind))
    return out


def _save_streaming(path: Path, tensors: list[tuple[str, tuple, str]], fill, chunk: int = 1 << 24) -> int:
    """A bf16 safetensors file written in row blocks of at most `chunk` elements (the per-layer
    embedding of Gemma 4 E2B is 4.7 GB in bf16); fill(kind, shape) -> a bf16 tensor. Bytes written."""
    import numpy as np
    import torch

    header, off = {}, 0
    for tname, tshape, _ in tensors:
        n = int(np.prod(tshape)) * 2
        header[tname] = {"dtype": "BF16", "shape": list(tshape), "data_offsets": [off, off + n]}
        off += n
    header["__metadata__"] = {"format": "pt"}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        for _, tshape, kind in tensors:
            rows = tshape[0] if len(tshape) > 1 else 1
            per_row = int(np.prod(tshape)) // rows
            step = max(1, chunk // per_row)
            for r0 in range(0, rows, step):
                part = (min(step, rows - r0),) + tuple(tshape[1:]) if len(tshape) > 1 else tshape
                f.write(fill(kind, part).contiguous().view(torch.int16).numpy().tobytes())
    return off


def build_checkpoint(name: str, out: Path, seed: int = 0, log=print) -> Path:
    """config.json, one bf16 safetensors shard per layer (+ one for the embedding), the index,
    and the tokenizer. Never holds more than one shard's tensors."""
    import torch
    from safetensors.torch import save_file

    shape = SHAPES[name]
    c = shape["config"]
    out.mkdir(parents=True, exist_ok=True)
    n_tok = build_tokenizer(shape["tokenizer"], out)
    if n_tok > c["vocab_size"]:
        raise ValueError(f"{name}: tokenizer has {n_tok} tokens > vocab_size {c['vocab_size']}")
    (out / "config.json").write_text(json.dumps(c, indent=1), encoding="utf-8")
    gen = torch.Generator().manual_seed(seed)
    std = shape.get("std", STD)
    norm_center = 0.0 if shape.get("gemma") else 1.0   # Gemma 1-3's RMSNorm multiplies by (1 + w)
    groups = [None] + list(range(c["num_hidden_layers"]))
    weight_map, total = {}, 0
    if shape.get("from_model"):
        def fill(kind, tshape):
            t = torch.randn(tshape, generator=gen, dtype=torch.bfloat16)
            return t.mul_(std) if kind == "w" else t.mul_(0.1).add_(norm_center) if kind == "n" else t.mul_(0.1)

        listed = _model_tensors(shape)
        for gi, layer in enumerate(groups):
            fname = f"model-{gi + 1:05d}-of-{len(groups):05d}.safetensors"
            mine = [(n, sh, k) for lay, n, sh, k in listed if lay == layer]
            total += _save_streaming(out / fname, mine, fill)
            weight_map.update({n: fname for n, _, _ in mine})
        groups = []
    for gi, layer in enumerate(groups):
        fname = f"model-{gi + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = {}
        for tname, tshape, kind in _tensors(shape, layer):
            t = torch.randn(tshape, generator=gen, dtype=torch.bfloat16)
            if kind == "w":
                t.mul_(std)
            elif kind == "n":
                t.mul_(0.1).add_(norm_center)
            else:
                t.mul_(0.1)
            tensors[tname] = t
            weight_map[tname] = fname
            total += t.numel() * 2
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        del tensors
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1), encoding="utf-8")
    log(f"{name}: {total / 1e9:.2f} GB bf16, {n_tok} tokens -> {out}")
    return out


# ---------------------------------------------------------------------------- converters

def llama_cpp_dir(arg: str | None = None) -> Path:
    d = Path(arg or os.environ.get("EDGEINFER_LLAMA_CPP_DIR") or SDIST / SDIST_NAME / "vendor" / "llama.cpp")
    if not (d / "convert_hf_to_gguf.py").exists():
        tgz = SDIST / f"{SDIST_NAME}.tar.gz"
        if arg or not tgz.exists():
            raise SystemExit(f"no convert_hf_to_gguf.py in {d}; bash scripts/install_oracles.sh "
                             f"fetches the llama-cpp-python sdist into {SDIST}")
        prefix = f"{SDIST_NAME}/vendor/llama.cpp/"
        keep = (prefix + "convert_hf_to_gguf.py", prefix + "conversion/", prefix + "gguf-py/")
        with tarfile.open(tgz) as tf:
            tf.extractall(SDIST, members=[m for m in tf.getmembers() if m.name.startswith(keep)],
                          filter="data")
    return d


# Run in a child: wrap get_vocab_base_pre (unknown hash -> the declared pre-tokenizer), then
# run the converter as its own __main__ with the shipped gguf-py first on the path.
_CONVERT_CHILD = r"""
import sys, runpy
lcpp, pre = sys.argv[1], sys.argv[2]
sys.path[:0] = [lcpp, lcpp + "/gguf-py"]
import conversion.base as base
cls = next(c for c in vars(base).values() if isinstance(c, type) and "get_vocab_base_pre" in vars(c))
orig = cls.get_vocab_base_pre
def get_vocab_base_pre(self, tokenizer):
    try:
        return orig(self, tokenizer)
    except NotImplementedError:
        print(f"make_shape_model: unknown pre-tokenizer hash; using the declared {pre!r}", file=sys.stderr)
        return pre
cls.get_vocab_base_pre = get_vocab_base_pre
sys.argv = [lcpp + "/convert_hf_to_gguf.py"] + sys.argv[3:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _atomic(dst: Path):
    return dst.with_name(dst.name + ".part")


def convert_llamacpp(hf: Path, dst: Path, outtype: str, pre: str, lcpp: Path, extra: list[str] = ()) -> Path:
    tmp = _atomic(dst)
    subprocess.run([sys.executable, "-c", _CONVERT_CHILD, str(lcpp), pre, str(hf), "--outfile", str(tmp),
                    "--outtype", outtype, *extra], check=True)
    tmp.rename(dst)
    return dst


def quantize_llamacpp(src: Path, dst: Path, qtype: str, threads: int = 2) -> Path:
    import ctypes
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{qtype.upper()}")
    params.nthread = threads
    tmp = _atomic(dst)
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {qtype}) returned {rc}")
    tmp.rename(dst)
    return dst


def convert_edgeinfer(hf: Path, dst: Path, qtype: str, threads: int = 2) -> Path:
    tmp = _atomic(dst)
    env = {**os.environ}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    subprocess.run([sys.executable, "-m", "edgeinfer", "convert", str(hf), "-o", str(tmp), "--type",
                    qtype.lower(), "--threads", str(threads), "--quiet"], check=True, env=env)
    tmp.rename(dst)
    return dst


def make(name: str, out: Path, types: list[str], engines: list[str], hf_only: bool = False,
         keep_bf16: bool = False, lcpp_arg: str | None = None, threads: int = 2, log=print) -> list[Path]:
    shape = SHAPES[name]
    hf = out / "hf" / name
    made = []
    if not (hf / "model.safetensors.index.json").exists():
        t0 = time.time()
        build_checkpoint(name, hf, log=log)
        log(f"  checkpoint in {time.time() - t0:.0f} s")
    if hf_only:
        return made
    if "llamacpp" in engines:
        lcpp = llama_cpp_dir(lcpp_arg)
        bf16 = out / f"{name}.llamacpp.BF16.gguf"
        todo = [t for t in types if not (out / f"{name}.llamacpp.{t}.gguf").exists()]
        if todo and not bf16.exists():
            t0 = time.time()
            convert_llamacpp(hf, bf16, "bf16", _PRE[shape["tokenizer"]["style"]], lcpp, shape.get("llamacpp_args", []))
            log(f"  llama.cpp convert -> {bf16.name} in {time.time() - t0:.0f} s")
        for t in todo:
            t0 = time.time()
            made.append(quantize_llamacpp(bf16, out / f"{name}.llamacpp.{t}.gguf", t, threads))
            log(f"  llama.cpp quantize -> {made[-1].name} in {time.time() - t0:.0f} s")
        if bf16.exists() and not keep_bf16:
            bf16.unlink()
    if "edgeinfer" in engines and shape["edgeinfer"]:
        for t in types:
            dst = out / f"{name}.edgeinfer.{t}.gguf"
            if dst.exists():
                continue
            t0 = time.time()
            made.append(convert_edgeinfer(hf, dst, t, threads))
            log(f"  edgeinfer convert -> {dst.name} in {time.time() - t0:.0f} s")
    return made


# Qwen3-Reranker-0.6B: Qwen3-0.6B with the "yes" / "no" tokens its head is cut from; both
# converters know a reranker by the folder's name
SHAPES["qwen3-reranker-0.6b"] = {**SHAPES["qwen3-06b"], "tokenizer": {**_QWEN_TOK, "extra_text": "yes\nno\n" * 64},
                                 "edgeinfer": True}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shapes", nargs="+", choices=sorted(SHAPES))
    ap.add_argument("--out", default=str(Path.home() / ".cache" / "edgeinfer" / "shapes"))
    ap.add_argument("--types", default="Q4_0,Q4_K_M,Q6_K", help="comma-separated GGUF types")
    ap.add_argument("--engines", default="llamacpp,edgeinfer")
    ap.add_argument("--hf-only", action="store_true", help="only the Hugging Face checkpoint")
    ap.add_argument("--keep-bf16", action="store_true", help="keep llama.cpp's BF16 GGUF")
    ap.add_argument("--llama-cpp", help="llama.cpp source folder (with convert_hf_to_gguf.py)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    types = [t.strip().upper() for t in a.types.split(",") if t.strip()]
    engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    for name in a.shapes:
        make(name, Path(a.out), types, engines, a.hf_only, a.keep_bf16, a.llama_cpp, a.threads,
             log=lambda s: print(s, flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
