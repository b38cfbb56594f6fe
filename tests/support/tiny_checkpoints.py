"""Tiny random-weight Hugging Face checkpoints (and a PEFT LoRA adapter) for converter tests.

Tokenizers are trained here on a small corpus, one per pre-tokenizer family, so every
checkpoint carries a real tokenizer of a few hundred tokens:
  llama   : byte-level BPE, Llama 3 Split regex (ignore_merges, BOS by post-processor)
  llama_tied: byte-level BPE, smollm style (Digits + ByteLevel), tied embeddings, chat template
  mistral : SentencePiece BPE tokenizer.model (byte fallback)
  qwen2   : byte-level BPE, Qwen2 Split regex, q/k/v biases
  qwen2_fim: qwen2 with Qwen2.5-Coder's fill-in-the-middle and repo-level special tokens
  qwen3   : byte-level BPE, Qwen2 Split regex, per-head Q/K norms, head_dim 32 with width 64 /
            4 heads, the Qwen3 chat template with its thinking switch
  gemma3  : SentencePiece (no dummy prefix, byte fallback), 7 layers (local and global),
            sliding window 16, GeGLU, post-norms, Gemma's chat template
  llama32 : Llama 3.2 layout: llama3 rope_scaling (rope_freqs), tied head, Llama 3 chat template
  phi3    : Phi-3.5 layout: fused qkv / gate_up, LongRoPE short/long factors, SentencePiece
  phi4    : Phi-4-mini layout: fused tensors, partial rotary (0.75), LongRoPE, tied head, BPE
  smollm3 : SmolLM3 layout: llama with no RoPE in every fourth layer (8 layers: 3 and 7 skip it),
            tied head, Llama 3 BPE, ChatML template
Needs torch, transformers, tokenizers, sentencepiece (and peft for the adapter).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 2024, and we've got 3 apples.",
    "Hello, world! How are you doing today? I'm fine, thanks; you'll see.",
    "def add(a, b):\n    return a + b\n\nprint(add(12, 345))\n",
    "Numbers: 0 1 2 3 4 5 6 6789 101112 3.14159 -42 1e-5 100%",
    "Ünïcödé façade naïve café — «quotes» and emoji 🙂 ok. 日本語のテキスト。",
    "    indented\tTabs\tand\nnewlines\n\n\nmultiple   spaces   here",
    "Once upon a time, in a small village, there lived an old clockmaker who loved tea.",
    "Quantization maps float weights to small integers with a scale per block of values.",
    "<html><body class=\"main\">Text &amp; more</body></html> {\"key\": [1, 2, 3]}",
    "SHOUTING WORDS and MiXeD CaSe, don't won't can't shouldn't THEY'LL I'D",
]

LLAMA3_RX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
            r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35_RX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
             r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# The Llama 3.2 Instruct template without its tool-calling branches (a system header carrying
# the dates, then one header per message, each closed by <|eot_id|>).
LLAMA3_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- if not date_string is defined %}{%- set date_string = strftime_now(\"%d %b %Y\") %}{%- endif %}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set system_message = \"\" %}\n"
    "{%- endif %}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n"
    "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
    "{{- system_message }}\n"
    "{{- \"<|eot_id|>\" }}\n"
    "{%- for message in messages %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n")

# The Phi-3.5-mini / Phi-4-mini chat template (<|role|> ... <|end|>).
PHI3_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}"
    "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
    "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


# The Qwen3 template's shape (thinking switch included), shortened: no tools.
QWEN3_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\n\n</think>\n\n' }}{%- endif %}{%- endif %}")
GEMMA_TURNS = ["<start_of_turn>", "<end_of_turn>"]
# Gemma 3's template: a system message goes before the first user turn; the assistant is "model".
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + "
    "message['content'] | trim + '<end_of_turn>\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}")


def _corpus():
    from tests.support.texts import TEXTS
    return CORPUS * 3 + list(TEXTS.values())


def _bpe_tokenizer(style: str, vocab_size: int, specials: list[str]):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(ignore_merges=(style == "llama3")))
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=(style in ("gpt2", "smollm")))
    if style == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), bl])
    elif style in ("llama3", "qwen2", "qwen35"):
        rx = {"llama3": LLAMA3_RX, "qwen2": QWEN2_RX, "qwen35": QWEN35_RX}[style]
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(rx), behavior="isolated", invert=False), bl])
    else:
        tok.pre_tokenizer = bl
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_corpus(), trainer)
    if style == "llama3":
        bos = specials[0]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, tok.token_to_id(bos))])
    return tok


def _spm_model(path: Path, vocab_size: int = 420, gemma: bool = False) -> None:
    import sentencepiece as spm

    txt = path / "corpus.txt"
    txt.write_text("\n".join(_corpus()), encoding="utf-8")
    ids = (dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3, user_defined_symbols=GEMMA_TURNS,
                pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>") if gemma
           else dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1))
    spm.SentencePieceTrainer.train(
        input=str(txt), model_prefix=str(path / "tokenizer"), vocab_size=vocab_size,
        model_type="bpe", byte_fallback=True, character_coverage=0.98,
        normalization_rule_name="identity", add_dummy_prefix=not gemma, split_digits=True,
        remove_extra_whitespaces=False, allow_whitespace_only_pieces=True, minloglevel=2, **ids)
    txt.unlink()
    (path / "tokenizer.vocab").unlink()


#: LFM2 layouts: (heads, KV heads, layer_types): conv and attention layers interleaved as LFM2's
#: (conv first), GQA 2:1 and 4:1, and a layout with attention last.
LFM2_LAYOUTS = {
    "lfm2": (4, 2, ["conv", "conv", "full_attention", "conv", "full_attention", "conv"]),
    "lfm2_gqa4": (4, 1, ["conv", "full_attention", "conv", "conv", "conv", "full_attention"]),
}


def build(kind: str, out: str | os.PathLike, seed: int = 0, dtype: str = "float32") -> Path:
    """Builds checkpoint `kind` (llama, llama_tied, mistral, qwen2, llama_256, llama32, phi3,
    phi4, smollm3, ...: the module's list) in `out`."""
    import torch
    import transformers as tf

    if kind in QWEN35_KINDS:
        return build_qwen35(kind, out, seed, dtype)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    tcfg: dict = {}
    common = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, initializer_range=0.05,
                  num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                  max_position_embeddings=512)
    if kind in ("llama", "llama_256"):
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
        tok = _bpe_tokenizer("llama3", 400, specials)
        n_vocab = tok.get_vocab_size()
        if kind == "llama_256":   # rows of 256: exercises K-quants proper
            common.update(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                          num_key_value_heads=2, num_hidden_layers=8, initializer_range=0.02)
        cfg = tf.LlamaConfig(vocab_size=n_vocab, bos_token_id=0, eos_token_id=1,
                             tie_word_embeddings=False, rope_theta=50000.0, **common)
        model = tf.LlamaForCausalLM(cfg)
        tcfg = {"bos_token": specials[0], "eos_token": specials[2]}
    elif kind == "llama_tied":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tok = _bpe_tokenizer("smollm", 360, specials)
        n_vocab = tok.get_vocab_size() + 8          # padded vocabulary, like real models
        cfg = tf.LlamaConfig(vocab_size=n_vocab, bos_token_id=1, eos_token_id=2,
                             tie_word_embeddings=True, **{**common, "num_key_value_heads": 4})
        model = tf.LlamaForCausalLM(cfg)
        tcfg = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                "chat_template": CHATML, "add_bos_token": False}
    elif kind == "mistral":
        _spm_model(out)
        tok = None
        import sentencepiece as spm
        n_vocab = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model")).vocab_size()
        cfg = tf.MistralConfig(vocab_size=n_vocab, bos_token_id=1, eos_token_id=2,
                               tie_word_embeddings=False, sliding_window=None,
                               head_dim=16, **common)
        model = tf.MistralForCausalLM(cfg)
        tcfg = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                "add_bos_token": True, "add_eos_token": False}
    elif kind in ("qwen2", "qwen2_fim"):     # qwen2_fim: Qwen2.5-Coder's FIM and repo-level tokens
        fim = ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>",
               "<|file_sep|>"] if kind == "qwen2_fim" else []
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + fim
        tok = _bpe_tokenizer("qwen2", 380, specials)
        n_vocab = tok.get_vocab_size()
        eos = 0 if fim else 2          # a code model ends its middle with <|endoftext|>
        cfg = tf.Qwen2Config(vocab_size=n_vocab, bos_token_id=None, eos_token_id=eos,
                             tie_word_embeddings=False, use_sliding_window=False,
                             rope_theta=1000000.0, **common)
        model = tf.Qwen2ForCausalLM(cfg)
        tcfg = {"eos_token": specials[eos], "add_bos_token": False,
                **({"pad_token": "<|fim_pad|>"} if fim else {"pad_token": "<|endoftext|>", "chat_template": CHATML})}
    elif kind in ("qwen3_embedding", "qwen3_embedding_untied"):
        return _build_qwen3_embedding(out, untied=kind.endswith("untied"), dtype=dtype)
    elif kind in ("qwen3", "qwen3_reranker", "qwen3_reranker_untied"):
        # a reranker: Qwen3-Reranker's card title (how converters know one) and its "yes" / "no" tokens
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
        tok = _bpe_tokenizer("qwen2", 380, specials)
        if kind != "qwen3":
            tok.add_tokens(["yes", "no"])
            (out / "README.md").write_text("# Qwen3-Reranker-tiny\n\nRandom weights at a tiny shape.\n")
        n_vocab = tok.get_vocab_size()
        cfg = tf.Qwen3Config(vocab_size=n_vocab, bos_token_id=None, eos_token_id=2,
                             tie_word_embeddings=(kind == "qwen3_reranker"), rope_theta=1000000.0, head_dim=32,
                             **common)
        model = tf.Qwen3ForCausalLM(cfg)
        tcfg = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                "chat_template": QWEN3_TEMPLATE, "add_bos_token": False}
    elif kind == "gemma3":
        _spm_model(out, vocab_size=440, gemma=True)
        tok = None
        import sentencepiece as spm
        n_vocab = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model")).vocab_size()
        cfg = tf.Gemma3TextConfig(vocab_size=n_vocab, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                                  head_dim=32, query_pre_attn_scalar=32, sliding_window=16,
                                  **{**common, "num_hidden_layers": 7, "rms_norm_eps": 1e-6})
        model = tf.Gemma3ForCausalLM(cfg)
        tcfg = {"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>",
                "add_bos_token": True, "add_eos_token": False, "chat_template": GEMMA3_TEMPLATE}
    elif kind == "llama32":
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>",
                    "<|end_header_id|>"]
        tok = _bpe_tokenizer("llama3", 400, specials)
        n_vocab = tok.get_vocab_size()
        # llama3 scaling over head_dim 16, base 500000: wavelengths on both sides of and
        # inside [old_ctx / high, old_ctx / low], so all three branches of the factors occur
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
        cfg = tf.LlamaConfig(vocab_size=n_vocab, bos_token_id=0, eos_token_id=2,
                             tie_word_embeddings=True, rope_parameters=rope, **common)
        model = tf.LlamaForCausalLM(cfg)
        tcfg = {"bos_token": specials[0], "eos_token": specials[2], "chat_template": LLAMA3_TEMPLATE}
    elif kind == "smollm3":
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
        tok = _bpe_tokenizer("llama3", 400, specials)
        n_vocab = tok.get_vocab_size()
        cfg = tf.SmolLM3Config(vocab_size=n_vocab, bos_token_id=0, eos_token_id=3, pad_token_id=None,
                               tie_word_embeddings=True, no_rope_layer_interval=4,
                               rope_parameters={"rope_type": "default", "rope_theta": 5000000.0},
                               **{**common, "num_hidden_layers": 8})
        assert cfg.no_rope_layers == [1, 1, 1, 0, 1, 1, 1, 0]
        model = tf.SmolLM3ForCausalLM(cfg)
        tcfg = {"bos_token": specials[0], "eos_token": specials[3], "chat_template": CHATML}
    elif kind in LFM2_LAYOUTS:
        specials = ["<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tok = _bpe_tokenizer("llama3", 400, specials)
        n_vocab = tok.get_vocab_size()
        heads, kv_heads, layer_types = LFM2_LAYOUTS[kind]
        cfg = tf.Lfm2Config(vocab_size=n_vocab, pad_token_id=0, bos_token_id=1, eos_token_id=4,
                            tie_word_embeddings=True, layer_types=layer_types, conv_L_cache=3,
                            block_auto_adjust_ff_dim=False, norm_eps=1e-5,
                            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                            **{**common, "num_hidden_layers": len(layer_types), "num_attention_heads": heads,
                               "num_key_value_heads": kv_heads})
        model = tf.Lfm2ForCausalLM(cfg)
        tcfg = {"bos_token": specials[1], "eos_token": specials[4], "chat_template": CHATML}
    elif kind in ("phi3", "phi4"):
        # LongRoPE: long factors once a sequence passes original_max_position_embeddings (32)
        partial = 1.0 if kind == "phi3" else 0.75
        half = int(16 * partial) // 2
        g = torch.Generator().manual_seed(seed + 7)
        rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": partial,
                "short_factor": (1.0 + 0.5 * torch.rand(half, generator=g)).tolist(),
                "long_factor": (2.0 + 6.0 * torch.rand(half, generator=g)).tolist()}
        if kind == "phi3":      # Phi-3.5-mini: SentencePiece (Llama 2) vocabulary, untied head
            _spm_model(out)
            tok = None
            import sentencepiece as spm
            n_sp = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model")).vocab_size()
            added = ["<|endoftext|>", "<|assistant|>", "<|end|>", "<|user|>", "<|system|>"]
            (out / "added_tokens.json").write_text(json.dumps({t: n_sp + k for k, t in enumerate(added)}))
            n_vocab = n_sp + len(added) + 3          # padded, as Phi-3.5's 32064
            ids = dict(bos_token_id=1, eos_token_id=n_sp + 2)
            tcfg = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "<|end|>", "unk_token": "<unk>",
                    "add_bos_token": False, "add_eos_token": False, "chat_template": PHI3_TEMPLATE}
        else:                   # Phi-4-mini: byte-level BPE, tied head
            specials = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
            tok = _bpe_tokenizer("llama3", 400, specials)
            tok.post_processor = None
            n_vocab = tok.get_vocab_size()
            ids = dict(bos_token_id=0, eos_token_id=0)
            tcfg = {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                    "add_bos_token": False,
                    "chat_template": PHI3_TEMPLATE}
        cfg = tf.Phi3Config(vocab_size=n_vocab, pad_token_id=None, tie_word_embeddings=(kind == "phi4"),
                            original_max_position_embeddings=32, rope_parameters=rope,
                            sliding_window=None, **ids, **common)
        model = tf.Phi3ForCausalLM(cfg)
    else:
        raise ValueError(kind)
    # Gemma's norms scale by (1 + w): the same effective weights as the others' w
    one = 0.0 if kind == "gemma3" else 1.0
    with torch.no_grad():   # non-trivial norms and biases (HF initializes them to 1 / 0)
        for n, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(one + 0.2 * torch.randn_like(p) if "norm" in n else 0.1 * torch.randn_like(p))
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(out, safe_serialization=True)
    if tok is not None:
        tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=1), encoding="utf-8")
    return out


def _build_qwen3_embedding(out: Path, untied: bool, dtype: str) -> Path:
    """Qwen3-Embedding's layout: the bare Qwen3 model (tensors without `model.`, no LM head) under a
    Qwen3ForCausalLM config, a tokenizer that appends <|endoftext|>, and sentence-transformers'
    modules (last-token pooling, then unit length) with the card's query instruction."""
    import torch
    import transformers as tf
    from tokenizers import processors

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = _bpe_tokenizer("qwen2", 380, specials)
    append = processors.TemplateProcessing(single="$A <|endoftext|>", pair="$A $B <|endoftext|>",
                                           special_tokens=[("<|endoftext|>", 0)])
    # the two forms a tokenizer.json states it in; config.json's BOS is <|endoftext|>, as the real one's
    tok.post_processor = (processors.Sequence([processors.ByteLevel(trim_offsets=False), append]) if untied
                          else append)
    cfg = tf.Qwen3Config(vocab_size=tok.get_vocab_size(), bos_token_id=0, eos_token_id=0,
                         tie_word_embeddings=not untied, rope_theta=1000000.0, head_dim=32, hidden_size=64,
                         intermediate_size=160, num_hidden_layers=2, initializer_range=0.05,
                         num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                         max_position_embeddings=512)
    model = tf.Qwen3Model(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    model.to(getattr(torch, dtype)).save_pretrained(out, safe_serialization=True)
    conf = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**conf, "architectures": ["Qwen3ForCausalLM"]}, indent=1))
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "padding_side": "left",
         **({} if untied else {"add_bos_token": False})}))
    (out / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 64, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False,
         "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
         "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": True, "include_prompt": True}))
    (out / "2_Normalize").mkdir(exist_ok=True)
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512, "do_lower_case": False}))
    (out / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": EMBEDDING_QUERY_PROMPT, "document": ""}, "default_prompt_name": None,
         "similarity_fn_name": "cosine"}))
    return out


#: Qwen3-Embedding's query prompt (its card's default task)
EMBEDDING_QUERY_PROMPT = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"


def build_lora(base: str | os.PathLike, out: str | os.PathLike, seed: int = 1,
               use_rslora: bool = False, targets: list[str] | None = None) -> Path:
    """A PEFT LoRA adapter on `base` with random non-zero B (so merging changes the model)."""
    import torch
    import transformers as tf
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    cfg = LoraConfig(r=4, lora_alpha=8, use_rslora=use_rslora, lora_dropout=0.0,
                     target_modules=targets or ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"],
                     task_type="CAUSAL_LM")
    pm = get_peft_model(model, cfg)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.copy_(0.05 * torch.randn_like(p))
    pm.save_pretrained(out, safe_serialization=True)
    return Path(out)


def build_wide_llama(out: str | os.PathLike, hidden: int = 1024, n_layers: int = 4,
                     ffn: int = 2816, n_head: int = 8, n_kv_head: int = 4, seed: int = 0) -> Path:
    """A LlamaForCausalLM checkpoint with large f32 tensors and a tiny vocabulary, written
    with numpy + safetensors only (no torch), one shard per layer so that building it never
    holds more than one layer. For measuring the converter's memory."""
    import numpy as np
    from safetensors.numpy import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    tok = _bpe_tokenizer("llama3", 400, specials)
    tok.save(str(out / "tokenizer.json"))
    n_vocab = tok.get_vocab_size()
    hd = hidden // n_head
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "vocab_size": n_vocab, "hidden_size": hidden, "intermediate_size": ffn,
           "num_hidden_layers": n_layers, "num_attention_heads": n_head,
           "num_key_value_heads": n_kv_head, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "max_position_embeddings": 512, "tie_word_embeddings": False,
           "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "float32"}
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": specials[0], "eos_token": specials[2]}))

    def w(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02)

    shards: list[dict] = [{"model.embed_tokens.weight": w(n_vocab, hidden),
                           "model.norm.weight": np.ones(hidden, np.float32),
                           "lm_head.weight": w(n_vocab, hidden)}]
    for i in range(n_layers):
        p = f"model.layers.{i}."
        shards.append({p + "input_layernorm.weight": np.ones(hidden, np.float32),
                       p + "post_attention_layernorm.weight": np.ones(hidden, np.float32)})
        for name, shape in (("self_attn.q_proj", (n_head * hd, hidden)),
                            ("self_attn.k_proj", (n_kv_head * hd, hidden)),
                            ("self_attn.v_proj", (n_kv_head * hd, hidden)),
                            ("self_attn.o_proj", (hidden, n_head * hd)),
                            ("mlp.gate_proj", (ffn, hidden)), ("mlp.up_proj", (ffn, hidden)),
                            ("mlp.down_proj", (hidden, ffn))):
            shards[-1][p + name + ".weight"] = w(*shape)
    wm = {}
    for k in range(len(shards)):
        fn = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shards[k], str(out / fn))
        wm.update({n: fn for n in shards[k]})
        shards[k] = {}
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    return out


def _unpermute_rows(w, n_head: int):
    """Inverse of llama.cpp's Q/K row permutation (GGUF interleaved pairs -> HF rotate-half)."""
    rows = w.shape[0]
    return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


_GGUF_TO_HF = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
               "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
               "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
               "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def build_from_gguf(gguf_path: str | os.PathLike, out: str | os.PathLike) -> Path:
    """A Hugging Face LlamaForCausalLM directory rebuilt from a llama GGUF with a byte-level BPE
    tokenizer (e.g. SmolLM2): every tensor dequantized to f32 with gguf.quants, Q/K rows
    un-permuted, one safetensors shard per layer; tokenizer.json built with `tokenizers`
    from the GGUF vocabulary and merges; config.json / tokenizer_config.json from its
    metadata. Converting it to F32 gives back the GGUF's (dequantized) weights."""
    import gguf
    import numpy as np
    from safetensors.numpy import save_file
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    r = gguf.GGUFReader(str(gguf_path))

    def meta(key, default=None):
        f = r.fields.get(key)
        return default if f is None else f.contents()

    if meta("general.architecture") != "llama" or meta("tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"{gguf_path}: only llama GGUFs with a gpt2 (BPE) tokenizer")
    if meta("tokenizer.ggml.pre") not in ("smollm", "gpt-2"):
        raise ValueError(f"{gguf_path}: pre-tokenizer {meta('tokenizer.ggml.pre')!r}")
    n_head, n_kv = meta("llama.attention.head_count"), meta("llama.attention.head_count_kv")
    names = {t.name for t in r.tensors}
    tied = "output.weight" not in names
    tokens = meta("tokenizer.ggml.tokens")
    types = meta("tokenizer.ggml.token_type")
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "vocab_size": len(tokens), "hidden_size": meta("llama.embedding_length"),
           "intermediate_size": meta("llama.feed_forward_length"),
           "num_hidden_layers": meta("llama.block_count"), "num_attention_heads": n_head,
           "num_key_value_heads": n_kv, "rms_norm_eps": meta("llama.attention.layer_norm_rms_epsilon"),
           "rope_theta": meta("llama.rope.freq_base", 10000.0),
           "max_position_embeddings": meta("llama.context_length", 2048),
           "tie_word_embeddings": tied, "bos_token_id": meta("tokenizer.ggml.bos_token_id"),
           "eos_token_id": meta("tokenizer.ggml.eos_token_id"), "torch_dtype": "float32",
           "_name_or_path": f"{meta('general.name', 'model')} (rebuilt from {Path(gguf_path).name})"}
    (out / "config.json").write_text(json.dumps(cfg, indent=1))

    shards: dict[str, dict] = {}      # shard 0: embeddings, final norm, head; n: layer n-1
    wm: dict[str, str] = {}
    for t in r.tensors:
        x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        x = x.reshape(tuple(int(d) for d in reversed(t.shape)))     # PyTorch order
        parts = t.name.split(".")
        if parts[0] == "blk":
            kind = parts[2]
            if kind == "attn_q":
                x = _unpermute_rows(x, n_head)
            elif kind == "attn_k":
                x = _unpermute_rows(x, n_kv)
            hf, shard = f"model.layers.{parts[1]}.{_GGUF_TO_HF[kind]}.weight", int(parts[1]) + 1
        else:
            hf = {"token_embd.weight": "model.embed_tokens.weight",
                  "output_norm.weight": "model.norm.weight",
                  "output.weight": "lm_head.weight"}[t.name]
            shard = 0
        fn = f"model-{shard:05d}.safetensors"
        for done in [k for k in shards if shard and k != fn and k != "model-00000.safetensors"]:
            save_file(shards.pop(done), str(out / done))     # the previous layer is complete
        shards.setdefault(fn, {})[hf] = np.ascontiguousarray(x)
        wm[hf] = fn
    for fn in list(shards):
        save_file(shards.pop(fn), str(out / fn))
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))

    vocab = {tok: i for i, tok in enumerate(tokens)}
    merges = [tuple(m.split(" ")) for m in meta("tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), bl])
                         if meta("tokenizer.ggml.pre") == "smollm" else bl)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, ty in enumerate(types) if ty == 3])
    tok.save(str(out / "tokenizer.json"))
    tcfg = {"add_bos_token": bool(meta("tokenizer.ggml.add_bos_token", False))}
    for role, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id"),
                      ("pad", "padding_token_id")):
        i = meta(f"tokenizer.ggml.{key}")
        if i is not None:
            tcfg[f"{role}_token"] = tokens[i]
    if meta("tokenizer.chat_template"):
        tcfg["chat_template"] = meta("tokenizer.chat_template")
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=1))
    return out


def _train(model_dir: Path, seed: int, steps: int, batch) -> None:
    """Trains the checkpoint in `model_dir` in place: `steps` AdamW steps (lr 3e-3) on the
    (ids, labels) that `batch()` gives each step."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        ids, labels = batch()
        loss = model(ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    model.save_pretrained(model_dir, safe_serialization=True)


def memorize(model_dir: str | os.PathLike, n_tokens: int = 256, steps: int = 300, seed: int = 0) -> list[int]:
    """Trains the checkpoint in `model_dir` (in place) to continue a fixed pseudo-random
    sequence of `n_tokens` ids, and returns the sequence. Random weights give near-flat
    next-token distributions, where two correct runtimes may pick either of two tokens
    whose logits differ by less than their rounding; a trained model's are peaked, as
    real models' are, so greedy decoding from a piece of the sequence is decided by the
    model, not by the rounding."""
    import torch

    model_dir = Path(model_dir)
    n_vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    g = torch.Generator().manual_seed(seed + 11)
    # distinct ids: each token is followed by one token only, so every piece of the sequence
    # has one continuation and none is left half learned between two
    seq = torch.randperm(min(n_vocab, 300) - 3, generator=g)[:n_tokens] + 3

    def crops():   # crops, so that any piece of the sequence is continued
        # starts drawn 47 below 0 and clamped, so the first tokens are in as many crops as the
        # rest (uniform starts leave seq[:47] rarely seen and its pieces half learned)
        starts = torch.randint(-47, n_tokens - 47, (8,), generator=g).clamp(0, n_tokens - 48)
        batch = torch.stack([seq[s:s + 48] for s in starts.tolist()])
        return batch, batch
    _train(model_dir, seed, steps, crops)
    return [int(i) for i in seq]


def teach(model_dir: str | os.PathLike, sequences: list[list[int]], steps: int = 200, seed: int = 0) -> None:
    """Trains the checkpoint in `model_dir` (in place) on whole `sequences` until greedy
    decoding from any of their prefixes continues them: each step a batch of all of them,
    padded at the end and masked out of the loss."""
    import torch

    width = max(len(s) for s in sequences)
    ids = torch.tensor([s + [0] * (width - len(s)) for s in sequences])
    labels = torch.tensor([s + [-100] * (width - len(s)) for s in sequences])
    _train(Path(model_dir), seed, steps, lambda: (ids, labels))


#: Qwen3.5 checkpoints: (layer_types, tied head, linear key heads, linear value heads, key dim,
#: value dim, attention heads, kv heads, head_dim). "qwen35": 3 delta-net : 1 attention, value
#: heads grouped 2 per key head (llama.cpp reorders them), padded vocabulary, tied head;
#: "qwen35_b": another layer pattern, one value head per key head, wider keys, untied head.
QWEN35_KINDS = {
    "qwen35": (["linear_attention"] * 3 + ["full_attention"], True, 2, 4, 16, 16, 4, 2, 32),
    "qwen35_b": (["linear_attention", "full_attention", "linear_attention", "linear_attention",
                  "linear_attention", "full_attention"], False, 2, 2, 32, 32, 8, 2, 16),
}


def build_qwen35(kind: str, out: str | os.PathLike, seed: int = 0, dtype: str = "float32") -> Path:
    """A tiny Qwen3_5ForCausalLM (Gated DeltaNet + gated attention) with non-trivial norms,
    decays (A_log), dt_bias and conv kernels."""
    import torch
    import transformers as tf

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    types, tied, nk, nv, dk, dv, nh, nkv, hd = QWEN35_KINDS[kind]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    tok = _bpe_tokenizer("qwen35", 380, specials)
    n_vocab = tok.get_vocab_size() + 8          # padded vocabulary, like real models
    rope_dim = int(hd * 0.25)
    cfg = tf.Qwen3_5TextConfig(
        vocab_size=n_vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=len(types),
        num_attention_heads=nh, num_key_value_heads=nkv, head_dim=hd, layer_types=types,
        linear_num_key_heads=nk, linear_num_value_heads=nv, linear_key_head_dim=dk,
        linear_value_head_dim=dv, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
        max_position_embeddings=512, initializer_range=0.05, tie_word_embeddings=tied,
        bos_token_id=None, eos_token_id=2, pad_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [rope_dim // 2 - 2, 1, 1], "mrope_interleaved": True})
    model = tf.Qwen3_5ForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("A_log"):
                p.copy_(torch.log(torch.empty_like(p).uniform_(0.5, 4.0)))
            elif n.endswith("dt_bias"):
                p.copy_(0.5 * torch.randn_like(p))
            elif "conv1d" in n:
                p.copy_(0.3 * torch.randn_like(p))
            elif p.ndim == 1:     # zero-centred norms (1 + w) except the gated norm (w)
                base = 1.0 if n.endswith("linear_attn.norm.weight") else 0.0
                p.copy_(base + 0.2 * torch.randn_like(p))
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(out, safe_serialization=True)
    _add_qwen35_mtp(out, cfg, dtype)
    tok.save(str(out / "tokenizer.json"))
    tcfg = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": QWEN3_TEMPLATE,
            "add_bos_token": False}
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=1), encoding="utf-8")
    return out


def _add_qwen35_mtp(out: Path, cfg, dtype: str) -> None:
    """The multi-token-prediction head real Qwen3.5 checkpoints carry (transformers ignores
    `mtp.*`): fc over [embedding; hidden], its two pre-norms, a full-attention block, a norm."""
    import torch
    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    sd = load_file(str(path))
    src = next(i for i, t in enumerate(cfg.layer_types) if t == "full_attention")
    d = cfg.hidden_size
    g = torch.Generator().manual_seed(11)
    mtp = {"mtp.fc.weight": 0.05 * torch.randn(d, 2 * d, generator=g)}
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        mtp[f"mtp.{n}.weight"] = 0.2 * torch.randn(d, generator=g)
    pre = f"model.layers.{src}."
    for k, v in sd.items():
        if k.startswith(pre):
            mtp["mtp.layers.0." + k[len(pre):]] = v + 0.01 * torch.randn(v.shape, generator=g)
    sd.update({k: v.to(getattr(torch, dtype)).contiguous() for k, v in mtp.items()})
    save_file(sd, str(path), metadata={"format": "pt"})
    conf = json.loads((out / "config.json").read_text())
    conf["mtp_num_hidden_layers"] = 1
    (out / "config.json").write_text(json.dumps(conf, indent=2))
