"""Tiny random-weight Hugging Face checkpoints (and a PEFT LoRA adapter) for converter tests.

Tokenizers are trained here on a small corpus, one per pre-tokenizer family, so every
checkpoint carries a real tokenizer of a few hundred tokens:
  llama   : byte-level BPE, Llama 3 Split regex (ignore_merges, BOS by post-processor)
  llama_tied: byte-level BPE, smollm style (Digits + ByteLevel), tied embeddings, chat template
  mistral : SentencePiece BPE tokenizer.model (byte fallback)
  qwen2   : byte-level BPE, Qwen2 Split regex, q/k/v biases
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

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _corpus():
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    from texts import TEXTS
    return CORPUS * 3 + list(TEXTS.values())


def _bpe_tokenizer(style: str, vocab_size: int, specials: list[str]):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(ignore_merges=(style == "llama3")))
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=(style in ("gpt2", "smollm")))
    if style == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), bl])
    elif style in ("llama3", "qwen2"):
        rx = LLAMA3_RX if style == "llama3" else QWEN2_RX
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


def _spm_model(path: Path, vocab_size: int = 420) -> None:
    import sentencepiece as spm

    txt = path / "corpus.txt"
    txt.write_text("\n".join(_corpus()), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(txt), model_prefix=str(path / "tokenizer"), vocab_size=vocab_size,
        model_type="bpe", byte_fallback=True, character_coverage=0.98,
        normalization_rule_name="identity", add_dummy_prefix=True, split_digits=True,
        remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    txt.unlink()
    (path / "tokenizer.vocab").unlink()


def build(kind: str, out: str | os.PathLike, seed: int = 0, dtype: str = "float32") -> Path:
    """Builds checkpoint `kind` (llama, llama_tied, mistral, qwen2, llama_256) in `out`."""
    import torch
    import transformers as tf

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
    elif kind == "qwen2":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tok = _bpe_tokenizer("qwen2", 380, specials)
        n_vocab = tok.get_vocab_size()
        cfg = tf.Qwen2Config(vocab_size=n_vocab, bos_token_id=None, eos_token_id=2,
                             tie_word_embeddings=False, use_sliding_window=False,
                             rope_theta=1000000.0, **common)
        model = tf.Qwen2ForCausalLM(cfg)
        tcfg = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                "chat_template": CHATML, "add_bos_token": False}
    else:
        raise ValueError(kind)
    with torch.no_grad():   # non-trivial norms and biases (HF initializes them to 1 / 0)
        for n, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn_like(p) if "norm" in n else 0.1 * torch.randn_like(p))
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(out, safe_serialization=True)
    if tok is not None:
        tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=1), encoding="utf-8")
    return out


def build_lora(base: str | os.PathLike, out: str | os.PathLike, seed: int = 1,
               use_rslora: bool = False) -> Path:
    """A PEFT LoRA adapter on `base` with random non-zero B (so merging changes the model)."""
    import torch
    import transformers as tf
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    cfg = LoraConfig(r=4, lora_alpha=8, use_rslora=use_rslora, lora_dropout=0.0,
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"],
                     task_type="CAUSAL_LM")
    pm = get_peft_model(model, cfg)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.copy_(0.05 * torch.randn_like(p))
    pm.save_pretrained(out, safe_serialization=True)
    return Path(out)
