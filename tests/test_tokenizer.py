"""Tokenizer tests: llama.cpp (llama-cpp-python) is the oracle for every tokenizer type.

The SmolLM2 GGUF gives the real byte-level BPE vocabulary (pre = smollm). The llama3 / qwen2 /
gpt-2 / default pre-tokenizers are checked by writing vocab-only GGUFs with the same vocabulary
and merges but another ``tokenizer.ggml.pre``; SentencePiece by training tiny models with the
``sentencepiece`` package and writing them as ``tokenizer.ggml.model = llama`` GGUFs. All the
GGUFs are written at test time into temporary folders.
"""
from __future__ import annotations

import json
import random
import unicodedata
from pathlib import Path

import pytest

from edgeinfer.errors import InvalidTokenError, TokenizerError
from edgeinfer.gguf.reader import GGUFFile
from edgeinfer.text.pretokenizers import PRE_TOKENIZERS
from edgeinfer.text.tokenizer import StreamDecoder, Tokenizer, TokenType
from tests.support.llama_vocabs import test_vectors, vocab_path
from tests.support.strict import require

# ---------------------------------------------------------------------------------------------
# corpus
# ---------------------------------------------------------------------------------------------
CORPUS = [
    "",
    " ",
    "  ",
    "\n",
    "Hello world",
    " Hello world",
    "hello  world  ",
    "Hello, world! How are you today?",
    # whitespace runs: spaces, tabs, newlines, \r\n, trailing spaces
    "\t\tindented\r\nnext line\n\n\n  spaced   ",
    "line1\r\nline2\rline3\n\r\n\r\n",
    "   leading and trailing   ",
    "                                                          many spaces",
    "a \n b \t c \r\n d  \n\n  e",
    "tabs\tand\u00a0nbsp\u3000ideographic\u2028line sep\u2009thin",
    # contractions
    "I'm sure you've heard they'll say it's 'quoted' and DON'T SHOUT'S we're I'd",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'Ve 'LL",
    # digits
    "12345678901234567890 3.14159 -42 1,000,000 0x1F 2024-01-01T12:34:56Z",
    "Pi is 3.141592653589793238462643383279502884197169399375105820974944",
    # CJK and other scripts
    "你好，世界！这是一个测试。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 텍스트입니다",
    "Привет, мир! Ελληνικά العربية עברית हिन्दी ไทย",
    "mixed 混合 text with ümlauts, ñ, café and naïve résumé",
    "ＦＵＬＬ width ＡＢＣ １２３",
    "x²³ ½ ① Ⅻ ٣٤ ๓",
    # emoji (with ZWJ sequences, skin tones, flags)
    "emoji 🙂😀👍🏽 👨‍👩‍👧‍👦 🇫🇷 ✨🚀",
    "🙂",
    # code
    "def f(x):\n    return x ** 2  # square\n\n\nprint(f(3))\n",
    "class A:\n\tdef __init__(self):\n\t\tself.x = {'a': [1, 2, 3]}\n",
    '{"key": [1, 2, 3], "nested": {"a": null, "b": true, "c": "str\\n"}}',
    "for (int i = 0; i < n; ++i) { a[i] += b[i] * 2; }",
    "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html>",
    "$100 + 50% = ^~|\\ `backticks` @user #tag",
    "!!!???...,,,;;; --- ___ ***",
    # special tokens inline
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat's 2+2?<|im_end|>\n",
    "text<|endoftext|>more text",
    "<|im_start|><|im_end|><|im_start|>",
    "a<|im_start b|>c <|im_end",
    "<s> </s> <unk> [INST] hello [/INST]",
    # control characters and odd code points
    "\x00\x01 control \x7f\x1b[0m",
    "\u200b zero width \u200d joiner \ufeff bom \ufffd",
    "combining e\u0301 a\u0308 \u0915\u094d\u0937",
]


def _random_corpus(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    atoms = ["a", "B", "xyz", " ", "  ", "\n", "\t", "\r\n", "1", "23", "456", "'s", "'T", "é",
             "中文", "🙂", "👍🏽", ".", ",", "!?", "<|im_end|>", "<|im_start|>", "\u00a0", "\u2028",
             "ـ", "𝓐", "ß", "ǅ", "\u0301", "ー", "()", "{}", "_", "-", "  \n", " \t "]
    return ["".join(rng.choice(atoms) for _ in range(rng.randint(1, 25))) for _ in range(n)]


FULL_CORPUS = CORPUS + _random_corpus(40, seed=1234)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def load_metadata(path: Path) -> dict:
    """GGUF metadata as a plain dict."""
    with GGUFFile(path) as f:
        return dict(f.metadata)


def write_vocab_gguf(path: Path, tok_meta: dict) -> Path:
    """Writes a vocab-only GGUF (arch llama, no tensors) holding `tok_meta` (tokenizer.* keys)."""
    gguf = require("gguf", "the gguf package writes the vocab fixtures")
    w = gguf.GGUFWriter(str(path), arch="llama")
    # the hyper-parameters llama.cpp reads before the vocabulary, even with vocab_only
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_rope_dimension_count(16)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tok_meta["tokenizer.ggml.tokens"]))
    if "general.name" in tok_meta:
        w.add_name(tok_meta["general.name"])
    w.add_tokenizer_model(tok_meta["tokenizer.ggml.model"])
    if "tokenizer.ggml.pre" in tok_meta:
        w.add_tokenizer_pre(tok_meta["tokenizer.ggml.pre"])
    w.add_token_list(list(tok_meta["tokenizer.ggml.tokens"]))
    if "tokenizer.ggml.token_type" in tok_meta:
        w.add_token_types([int(t) for t in tok_meta["tokenizer.ggml.token_type"]])
    if "tokenizer.ggml.scores" in tok_meta:
        w.add_token_scores([float(s) for s in tok_meta["tokenizer.ggml.scores"]])
    if "tokenizer.ggml.merges" in tok_meta:
        w.add_token_merges(list(tok_meta["tokenizer.ggml.merges"]))
    for key, adder in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id),
                       ("unknown_token_id", w.add_unk_token_id),
                       ("padding_token_id", w.add_pad_token_id)):
        if f"tokenizer.ggml.{key}" in tok_meta:
            adder(int(tok_meta[f"tokenizer.ggml.{key}"]))
    for key, adder in (("add_bos_token", w.add_add_bos_token), ("add_eos_token", w.add_add_eos_token),
                       ("add_space_prefix", w.add_add_space_prefix)):
        if f"tokenizer.ggml.{key}" in tok_meta:
            adder(bool(tok_meta[f"tokenizer.ggml.{key}"]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _oracle_module():
    return require("llama_cpp")


def oracle_vocab(path: Path):
    llama_cpp = _oracle_module()
    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


def compare_with_oracle(tok: Tokenizer, llm, corpus: list[str]) -> tuple[int, int, list[str]]:
    n = ok = 0
    failures: list[str] = []
    for text in corpus:
        for add_special in (True, False):
            for parse_special in (True, False):
                n += 1
                ref = llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special)
                ours = tok.encode(text, add_special=add_special, parse_special=parse_special)
                if ref == ours:
                    ok += 1
                elif len(failures) < 5:
                    failures.append(f"{text!r} add_special={add_special} parse_special={parse_special}"
                                    f"\n  llama.cpp: {ref}\n  ours:      {ours}")
    return ok, n, failures


# ---------------------------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def smollm2_meta(smollm2_path) -> dict:
    return load_metadata(smollm2_path)


@pytest.fixture(scope="session")
def smollm2_tok(smollm2_meta) -> Tokenizer:
    return Tokenizer.from_metadata(smollm2_meta)


def _tokenizer_keys(meta: dict) -> dict:
    return {k: v for k, v in meta.items() if k.startswith("tokenizer.ggml.")}


@pytest.fixture(scope="session")
def bpe_variant(smollm2_meta, tmp_path_factory):
    """pre name -> (gguf path, metadata) with SmolLM2's vocab and merges."""
    made: dict[str, tuple[Path, dict]] = {}

    def make(pre: str | None) -> tuple[Path, dict]:
        if pre not in made:
            meta = _tokenizer_keys(smollm2_meta)
            meta.pop("tokenizer.ggml.add_bos_token", None)  # let the pre type's default apply
            if pre is None:
                meta.pop("tokenizer.ggml.pre", None)
            else:
                meta["tokenizer.ggml.pre"] = pre
            d = tmp_path_factory.mktemp("bpe")
            made[pre] = (write_vocab_gguf(d / f"vocab-{pre}.gguf", meta), meta)
        return made[pre]

    return make


SPM_TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog. A tokenizer splits text into pieces.
SentencePiece treats the input as a raw stream of Unicode characters, spaces included.
Byte fallback turns characters outside the vocabulary into byte tokens like <0xE4>.
Numbers such as 2024, 3.14 and 1,000,000 appear in text; so do e-mail addresses.
def main():
    print("hello world")
    return 0
Le renard brun rapide saute par-dessus le chien paresseux. Größe, Straße, café.
東京は日本の首都です。 中文的句子也在这里。
"""


@pytest.fixture(scope="session", params=["bpe", "unigram"])
def spm_variant(request, tmp_path_factory):
    """A tiny SentencePiece model (trained now) written as a tokenizer.ggml.model=llama GGUF."""
    spm = require("sentencepiece", "sentencepiece trains the SPM fixture")
    d = tmp_path_factory.mktemp(f"spm-{request.param}")
    corpus_file = d / "train.txt"
    corpus_file.write_text(SPM_TRAINING_TEXT * 20, encoding="utf-8")
    prefix = d / "m"
    spm.SentencePieceTrainer.train(
        input=str(corpus_file), model_prefix=str(prefix), vocab_size=400,
        model_type=request.param, byte_fallback=True, character_coverage=0.98, hard_vocab_limit=False,
        user_defined_symbols=["<|user|>"], control_symbols=["<ctrl>"],
        minloglevel=2, num_threads=1)
    sp = spm.SentencePieceProcessor(model_file=str(prefix) + ".model")
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(float(sp.get_score(i)))
        if sp.is_unknown(i):
            types.append(TokenType.UNKNOWN)
        elif sp.is_control(i):
            types.append(TokenType.CONTROL)
        elif sp.is_unused(i):
            types.append(TokenType.UNUSED)
        elif sp.is_byte(i):
            types.append(TokenType.BYTE)
        elif tokens[-1] == "<|user|>":
            types.append(TokenType.USER_DEFINED)
        else:
            types.append(TokenType.NORMAL)
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": sp.bos_id(),
        "tokenizer.ggml.eos_token_id": sp.eos_id(),
        "tokenizer.ggml.unknown_token_id": sp.unk_id(),
    }
    return write_vocab_gguf(d / "spm.gguf", meta), meta


SPM_CORPUS = FULL_CORPUS + [
    "The quick brown fox", "  two leading spaces", "trailing  ", "<s>Hello</s>", "<|user|>hi<|user|>",
    "unseen chars: ЖЯ ∑∫ 🙂", "<ctrl>x", "▁already▁escaped",
]


# ---------------------------------------------------------------------------------------------
# llama.cpp comparisons
# ---------------------------------------------------------------------------------------------
@pytest.mark.oracle
def test_smollm2_matches_llama_cpp(smollm2_path, smollm2_tok):
    llm = oracle_vocab(smollm2_path)
    ok, n, failures = compare_with_oracle(smollm2_tok, llm, FULL_CORPUS)
    print(f"\nSmolLM2 (gpt2/smollm): {ok}/{n} cases identical to llama.cpp")
    assert ok == n, "\n".join(failures)


@pytest.mark.oracle
@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "qwen35", "lfm2", "gpt-2", "gpt-4o", "default"])
def test_bpe_pre_tokenizers_match_llama_cpp(pre, bpe_variant):
    path, meta = bpe_variant(None if pre == "default" else pre)
    tok = Tokenizer.from_metadata(meta)
    llm = oracle_vocab(path)
    ok, n, failures = compare_with_oracle(tok, llm, FULL_CORPUS)
    print(f"\nBPE pre={pre}: {ok}/{n} cases identical to llama.cpp")
    assert ok == n, "\n".join(failures)


@pytest.mark.oracle
def test_gpt4o_pieces_match_llama_cpp(smollm2_meta, tmp_path):
    """Phi-4-mini's gpt-4o pre-tokenizer draws boundaries llama3's does not: between a lower and
    an upper case letter ("aB"), and it keeps a contraction on its word ("D's"). Two merges
    appended to SmolLM2's vocabulary cross exactly those boundaries, so the ids show the
    pieces (with llama3's regex they would differ: "aB" one token, "D's" two)."""
    meta = _tokenizer_keys(smollm2_meta)
    meta.pop("tokenizer.ggml.add_bos_token", None)
    meta["tokenizer.ggml.pre"] = "gpt-4o"
    meta["tokenizer.ggml.tokens"] = list(meta["tokenizer.ggml.tokens"]) + ["aB", "D's"]
    meta["tokenizer.ggml.token_type"] = list(meta["tokenizer.ggml.token_type"]) + [1, 1]
    meta["tokenizer.ggml.merges"] = list(meta["tokenizer.ggml.merges"]) + ["a B", "D 's"]
    path = write_vocab_gguf(tmp_path / "gpt4o.gguf", meta)
    tok = Tokenizer.from_metadata(meta)
    a_b, d_s = tok.token_id("aB"), tok.token_id("D's")
    assert d_s in tok.encode("D's", add_special=False) and a_b not in tok.encode("aB", add_special=False)
    corpus = ["aB", "xaBy", "D's", "AND's and's", "camelCase aBc DON'T", "HTTPServer's URLs/\npath",
              "ÉtéÉTÉ d'été 12345"] + FULL_CORPUS
    ok, n, failures = compare_with_oracle(tok, oracle_vocab(path), corpus)
    print(f"\nBPE pre=gpt-4o with boundary-crossing merges: {ok}/{n} cases identical to llama.cpp")
    assert ok == n, "\n".join(failures)
    # the converter names Phi-4-mini's tokenizer.json pre-tokenizer (tiktoken's o200k Split) gpt-4o
    from edgeinfer.convert.tokenizer_meta import _pre_name

    o200k = ("[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
             "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
             "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*"
             "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
    tj = {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": o200k}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}}
    assert _pre_name(tj) == "gpt-4o"


@pytest.mark.oracle
def test_qwen35_pieces_match_llama_cpp(smollm2_meta, tmp_path):
    """Qwen3.5's pre-tokenizer keeps combining marks on their letters, where qwen2's cuts them
    off. A merge appended to SmolLM2's vocabulary joins "e" and U+0301 (the bytes CC 81), so
    the ids show the pieces: one token for "e\u0301" with qwen35, two with qwen2."""
    from edgeinfer.text.bpe import BYTE_TO_CHAR

    mark = BYTE_TO_CHAR[0xCC] + BYTE_TO_CHAR[0x81]
    meta = _tokenizer_keys(smollm2_meta)
    meta.pop("tokenizer.ggml.add_bos_token", None)
    meta["tokenizer.ggml.pre"] = "qwen35"
    meta["tokenizer.ggml.tokens"] = list(meta["tokenizer.ggml.tokens"]) + [mark, "e" + mark]
    meta["tokenizer.ggml.token_type"] = list(meta["tokenizer.ggml.token_type"]) + [1, 1]
    meta["tokenizer.ggml.merges"] = list(meta["tokenizer.ggml.merges"]) + [
        f"{BYTE_TO_CHAR[0xCC]} {BYTE_TO_CHAR[0x81]}", f"e {mark}"]
    tok = Tokenizer.from_metadata(meta)
    e_mark = tok.token_id("e" + mark)
    assert e_mark in tok.encode("e\u0301", add_special=False)
    assert e_mark not in Tokenizer.from_metadata({**meta, "tokenizer.ggml.pre": "qwen2"}).encode(
        "e\u0301", add_special=False)
    corpus = ["cafe\u0301", "e\u0301e\u0301 !e\u0301 1e\u0301", " \u0301e\u0301\u0301x",
              "\u0915\u094d\u0937e\u0301"] + FULL_CORPUS
    path = write_vocab_gguf(tmp_path / "qwen35.gguf", meta)
    ok, n, failures = compare_with_oracle(tok, oracle_vocab(path), corpus)
    print(f"\nBPE pre=qwen35 with a letter+mark merge: {ok}/{n} cases identical to llama.cpp")
    assert ok == n, "\n".join(failures)


@pytest.mark.oracle
def test_phi3_strip_quirk_matches_llama_cpp(smollm2_meta, tmp_path):
    """A model named like Phi-3 gets its special tokens' rstrip (the whitespace after
    <|im_start|> is swallowed, not after <|endoftext|> or <s>), as llama.cpp sets it by name.
    llama.cpp requires Phi-3's <s>, </s> and <unk>: they are added to SmolLM2's vocabulary."""
    meta = {**_tokenizer_keys(smollm2_meta), "general.name": "Phi-3-mini-4k-instruct"}
    meta["tokenizer.ggml.tokens"] = list(meta["tokenizer.ggml.tokens"]) + ["<s>", "</s>", "<unk>"]
    meta["tokenizer.ggml.token_type"] = list(meta["tokenizer.ggml.token_type"]) + [3, 3, 3]
    tok = Tokenizer.from_metadata(meta)
    text = "<|im_start|> \n user<|endoftext|>  x</s> y<s> z"
    assert tok.encode(text) != Tokenizer.from_metadata({**meta, "general.name": "SmolLM2"}).encode(text)
    ok, n, failures = compare_with_oracle(tok, oracle_vocab(write_vocab_gguf(tmp_path / "phi3.gguf", meta)),
                                          [text] + FULL_CORPUS)
    assert ok == n, "\n".join(failures)


@pytest.mark.oracle
def test_spm_matches_llama_cpp(spm_variant):
    path, meta = spm_variant
    tok = Tokenizer.from_metadata(meta)
    llm = oracle_vocab(path)
    ok, n, failures = compare_with_oracle(tok, llm, SPM_CORPUS)
    print(f"\nSPM: {ok}/{n} cases identical to llama.cpp")
    assert ok == n, "\n".join(failures)


@pytest.mark.oracle
def test_special_ids_and_eog_match_llama_cpp(smollm2_path, smollm2_tok):
    llama_cpp = _oracle_module()
    llm = oracle_vocab(smollm2_path)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    tok = smollm2_tok
    assert tok.n_vocab == llama_cpp.llama_vocab_n_tokens(vocab)
    assert tok.bos_id == llama_cpp.llama_vocab_bos(vocab)
    assert tok.eos_id == llama_cpp.llama_vocab_eos(vocab)
    eog = {i for i in range(tok.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)}
    assert set(tok.eog_ids) == eog
    # llama.cpp picks the EOT among candidates in hash-map order; we prefer <|im_end|>
    assert tok.eot_id == tok.token_id("<|im_end|>")
    assert tok.eot_id in eog


@pytest.mark.oracle
def test_pieces_match_llama_cpp(smollm2_path, smollm2_tok, spm_variant):
    cases = [(smollm2_path, smollm2_tok), (spm_variant[0], Tokenizer.from_metadata(spm_variant[1]))]
    for path, tok in cases:
        llm = oracle_vocab(path)
        step = max(1, tok.n_vocab // 3000)
        for i in range(0, tok.n_vocab, step):
            assert tok.token_to_bytes(i) == _oracle_piece(llm, i), i
        for text in FULL_CORPUS:
            if len(text) > 60:
                continue  # llama-cpp-python's detokenize() cannot take pieces over 32 bytes
            ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
            # llama-cpp-python drops control tokens (special=False) and a leading space after BOS
            assert tok.decode_bytes(ids, skip_special=True) == llm.detokenize(ids, special=False)


def _oracle_piece(llm, token_id: int) -> bytes:
    """llama_token_to_piece(special=True) with a buffer large enough for any token
    (llama-cpp-python's detokenize() uses 32 bytes, too few for long whitespace tokens)."""
    import ctypes

    llama_cpp = _oracle_module()
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    buf = (ctypes.c_char * 1024)()
    n = llama_cpp.llama_token_to_piece(vocab, token_id, buf, 1024, 0, True)
    assert n >= 0
    return bytes(buf[:n])


# ---------------------------------------------------------------------------------------------
# llama.cpp's own vocabulary files and test vectors (the llama-cpp-python sdist)
# ---------------------------------------------------------------------------------------------
#: the vocabulary files of the sdist whose tokenizers edgeinfer supports
VOCAB_FILES = ["llama-bpe", "qwen2", "qwen35", "phi-3", "llama-spm", "gpt-2", "command-r", "gemma-4"]
_VOCAB_TOKENIZERS: dict[str, Tokenizer] = {}


def vocab_file_tokenizer(name: str) -> Tokenizer:
    """Our tokenizer of ``models/ggml-vocab-<name>.gguf``, built once per process."""
    if name not in _VOCAB_TOKENIZERS:
        _VOCAB_TOKENIZERS[name] = Tokenizer.from_gguf(vocab_path(name))
    return _VOCAB_TOKENIZERS[name]


@pytest.mark.parametrize("name", VOCAB_FILES)
def test_llama_cpp_test_vectors(name):
    """Every test vector llama.cpp ships with the vocabulary file gives its ids."""
    tok = vocab_file_tokenizer(name)
    vectors = test_vectors(name)
    bad = [(text, ids, tok.encode(text, add_special=False, parse_special=False))
           for text, ids in vectors.items()
           if tok.encode(text, add_special=False, parse_special=False) != ids]
    print(f"\n{name}: {len(vectors) - len(bad)}/{len(vectors)} of llama.cpp's test vectors match")
    assert not bad, f"{len(bad)} of {len(vectors)} differ; the first (text, llama.cpp, ours): {bad[:2]}"


@pytest.mark.oracle
@pytest.mark.parametrize("name", ["qwen35", "gemma-4"])
def test_vocab_files_match_llama_cpp(name):
    tok = vocab_file_tokenizer(name)
    extra = ["a\u0301b \u0915\u094d\u0937 e\u0301\u0301", "\n\n\n \n\n", "\n", "  a  b  ", "\u2581x \u2581"]
    ok, n, failures = compare_with_oracle(tok, oracle_vocab(vocab_path(name)), FULL_CORPUS + extra)
    print(f"\n{name}: {ok}/{n} cases identical to llama.cpp")
    assert ok == n, "\n".join(failures)


@pytest.mark.oracle
@pytest.mark.parametrize("name", ["deepseek-coder", "refact", "starcoder", "command-r", "qwen2"])
def test_fim_tokens_and_eog_match_llama_cpp(name):
    """The fill-in-the-middle tokens llama.cpp finds (DeepSeek's <｜fim▁begin｜>, StarCoder's
    <fim_prefix>, ...), and the end-of-generation set they join, on its vocabulary files."""
    llama_cpp = _oracle_module()
    tok = Tokenizer.from_gguf(vocab_path(name))
    llm = oracle_vocab(vocab_path(name))        # held: the vocabulary lives as long as it
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    ours = [tok.fim_pre_id, tok.fim_suf_id, tok.fim_mid_id, tok.fim_rep_id, tok.fim_sep_id]
    theirs = [getattr(llama_cpp, f"llama_vocab_fim_{k}")(vocab) for k in ("pre", "suf", "mid", "rep", "sep")]
    assert [-1 if i is None else i for i in ours] == theirs
    assert set(tok.eog_ids) == {i for i in range(tok.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)}


@pytest.mark.oracle
def test_gemma4_pieces_and_bos_match_llama_cpp(tmp_path):
    """Gemma 4's pieces (spaces written as U+2581, <0xXX> byte tokens) are llama.cpp's, and BOS
    is added even where the metadata says not to, as llama.cpp does for Gemma 4."""
    tok = vocab_file_tokenizer("gemma-4")
    llm = oracle_vocab(vocab_path("gemma-4"))
    for i in list(range(0, tok.n_vocab, tok.n_vocab // 2000)) + list(range(300)):
        assert tok.token_to_bytes(i) == _oracle_piece(llm, i), i
    meta = {**load_metadata(vocab_path("gemma-4")), "tokenizer.ggml.add_bos_token": False}
    no_bos = Tokenizer.from_metadata(meta)
    ok, n, failures = compare_with_oracle(no_bos, oracle_vocab(write_vocab_gguf(tmp_path / "g4.gguf", meta)),
                                          ["Hello world", " x", ""])
    assert ok == n, "\n".join(failures)
    assert no_bos.encode("x")[0] == no_bos.bos_id


# ---------------------------------------------------------------------------------------------
# properties that need no oracle
# ---------------------------------------------------------------------------------------------
def test_smollm2_basics(smollm2_tok):
    tok = smollm2_tok
    assert tok.n_vocab == 49152 and len(tok) == 49152
    assert tok.bos_id == 1 and tok.eos_id == 2
    assert tok.add_bos is False
    assert tok.is_special(tok.token_id("<|im_start|>"))
    assert not tok.is_special(tok.encode("hello", add_special=False)[0])
    assert {0, 2} <= set(tok.eog_ids) and tok.is_eog(2) and not tok.is_eog(1)
    # special tokens are single ids only when parse_special
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert 1 not in tok.encode("<|im_start|>", parse_special=False)


def test_roundtrip_bpe(smollm2_tok):
    bad = [(text, parse_special) for text in FULL_CORPUS for parse_special in (True, False)
           if smollm2_tok.decode(smollm2_tok.encode(text, parse_special=parse_special)) != text]
    assert not bad, f"{len(bad)} texts do not round-trip (text, parse_special); the first: {bad[:3]}"


def test_roundtrip_spm(spm_variant):
    tok = Tokenizer.from_metadata(spm_variant[1])
    assert tok.add_bos and tok.add_space_prefix
    for text in SPM_CORPUS:
        if not text.strip(" ") or "<|user|>" in text or "\u2581" in text:
            # encode(' ') and encode('') differ only by the prefix space; like llama.cpp, encode
            # also puts a prefix space after every special token (here the user-defined one);
            # a literal U+2581 in the text decodes as a space
            continue
        ids = tok.encode(text, parse_special=False)
        assert ids[0] == tok.bos_id
        assert tok.decode(ids, skip_special=True) == text, text


def test_stream_decoder_never_splits_characters(smollm2_tok):
    tok = smollm2_tok
    text = "emoji 🙂😀👍🏽👨‍👩‍👧‍👦 🇫🇷 中文字符 テスト 한국어 ✨ done"
    ids = tok.encode(text)
    # the tokenizer really does split characters across tokens here
    assert any(_is_partial(tok.token_to_bytes(i)) for i in ids)
    dec = StreamDecoder(tok)
    pieces = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(pieces) == text
    for p in pieces:
        assert "\ufffd" not in p
        p.encode("utf-8", "strict")  # each piece is whole characters
        assert not any(0xD800 <= ord(c) <= 0xDFFF for c in p)
    assert dec.pending == b""


def _is_partial(b: bytes) -> bool:
    try:
        b.decode("utf-8", "strict")
        return False
    except UnicodeDecodeError:
        return True


def test_stream_decoder_spm_leading_space(spm_variant):
    tok = Tokenizer.from_metadata(spm_variant[1])
    ids = tok.encode("hello world")
    dec = tok.stream_decoder(skip_special=True)
    assert "".join(dec.push(i) for i in ids) + dec.flush() == "hello world"
    # continuing after a prompt keeps the space
    cont = tok.stream_decoder(skip_special=True, at_start=False)
    out = "".join(cont.push(i) for i in tok.encode(" world", add_special=False)[1:])
    assert out.startswith(" ")


def test_stream_decoder_invalid_bytes_become_replacement(smollm2_tok):
    tok = smollm2_tok
    lone = tok.encode("🙂", add_special=False)
    assert len(lone) > 1
    dec = StreamDecoder(tok)
    out = dec.push(lone[0])
    assert out == ""  # held back
    out += dec.push(tok.encode("a", add_special=False)[0])
    assert out == "\ufffda"
    assert dec.flush() == ""


def test_stream_cut_inside_a_character_ends_without_replacement(smollm2_tok):
    """A reply cut by max_tokens between the bytes of one character drops the partial
    character instead of ending in U+FFFD."""
    tok = smollm2_tok
    ids = tok.encode("ok😀", add_special=False)
    cut = next(n for n in range(1, len(ids)) if _is_partial(b"".join(tok.token_to_bytes(i) for i in ids[:n])))
    dec = StreamDecoder(tok)
    text = "".join(dec.push(i) for i in ids[:cut])
    assert dec.pending                     # the cut really is inside the emoji
    text += dec.flush()
    assert text == "ok" and dec.pending == b""


def test_decode_skip_special(smollm2_tok):
    tok = smollm2_tok
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|>"
    assert tok.decode(ids, skip_special=True) == "user\nhi"


def test_out_of_range_ids(smollm2_tok):
    tok = smollm2_tok
    for bad in (-1, 49152, 10**12):
        with pytest.raises(InvalidTokenError, match=f"{bad}.*49152"):
            tok.decode([5, bad])
        with pytest.raises(InvalidTokenError):
            tok.token_to_bytes(bad)
        with pytest.raises(InvalidTokenError):
            StreamDecoder(tok).push(bad)
    with pytest.raises(InvalidTokenError):
        tok.decode(["a"])
    with pytest.raises(InvalidTokenError):
        tok.decode([1.5])


def test_bad_metadata():
    base = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "ab"],
            "tokenizer.ggml.merges": ["a b"]}
    assert Tokenizer.from_metadata(base).encode("abab", add_special=False) == [2, 2]
    cases = [
        ({}, "tokenizer.ggml.model"),
        ({**base, "tokenizer.ggml.model": "wordpiece-xyz"}, "unknown tokenizer model"),
        ({k: v for k, v in base.items() if k != "tokenizer.ggml.tokens"}, "tokens"),
        ({**base, "tokenizer.ggml.tokens": []}, "empty"),
        ({k: v for k, v in base.items() if k != "tokenizer.ggml.merges"}, "merges"),
        ({**base, "tokenizer.ggml.merges": ["ab"]}, "merges"),
        ({**base, "tokenizer.ggml.merges": [3]}, "merges"),
        ({**base, "tokenizer.ggml.tokens": "abc"}, "array"),
        ({**base, "tokenizer.ggml.token_type": [1]}, "token_type"),
        ({**base, "tokenizer.ggml.model": "llama", "tokenizer.ggml.scores": [0.0]}, "scores"),
        ({**base, "tokenizer.ggml.bos_token_id": "x"}, "bos_token_id"),
    ]
    for meta, msg in cases:
        with pytest.raises(TokenizerError, match=msg):
            Tokenizer.from_metadata(meta)
    with pytest.raises(TokenizerError):
        Tokenizer.from_metadata("not a dict")  # type: ignore[arg-type]
    with pytest.raises(TokenizerError):
        Tokenizer.from_metadata(base).encode(b"bytes")  # type: ignore[arg-type]


def test_unknown_pre_falls_back_to_gpt2(smollm2_meta, caplog):
    meta = {**_tokenizer_keys(smollm2_meta), "tokenizer.ggml.pre": "no-such-pre"}
    with caplog.at_level("WARNING"):
        tok = Tokenizer.from_metadata(meta)
    assert tok.pre_family == "gpt2"
    assert "no-such-pre" in caplog.text
    assert tok.decode(tok.encode("Hello 123 world")) == "Hello 123 world"


def test_lone_surrogates_do_not_crash(smollm2_tok):
    ids = smollm2_tok.encode("a\ud800b")
    assert smollm2_tok.decode(ids) == "a\ufffdb"


def test_word_cache_bounds_the_bpe_work(smollm2_meta, monkeypatch):
    """The BPE merge loop (the costly part of encode) runs once per distinct word: fewer runs
    than words on a first pass over 10 KB of code, none on a second pass."""
    tok = Tokenizer.from_metadata(smollm2_meta)
    runs = []
    word_ids = tok.algorithm.word_ids
    monkeypatch.setattr(tok.algorithm, "word_ids", lambda word: runs.append(word) or word_ids(word))
    text = (Path(__file__).read_text(encoding="utf-8") * 2)[:10_000]
    first = tok.encode(text)
    assert len(runs) == len(set(runs)) and len(runs) < len(first) / 2, (len(runs), len(first))
    runs.clear()
    assert tok.encode(text) == first and runs == []


# ---------------------------------------------------------------------------------------------
# the pre-tokenizer table against Hugging Face tokenizers
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pre", [name for name, p in PRE_TOKENIZERS.items() if p.hf is not None])
def test_converter_names_hf_pre_tokenizers_that_split_alike(pre):
    """Every table entry the converter writes: Hugging Face's pre-tokenizer of that form, as a
    tokenizer.json holds it, is named by this entry, and cuts the corpus into the same pieces
    as the entry's llama.cpp regexes. (llama.cpp's form of o200k takes every non-ASCII letter
    as both upper and lower case and has no combining marks in its letter classes, so for it
    only texts without those are compared.)"""
    tokenizers = require("tokenizers", "Hugging Face tokenizers is the pre-tokenizer oracle")
    from edgeinfer.convert.tokenizer_meta import _pre_name
    from edgeinfer.text.bpe import BYTE_TO_CHAR

    pt = tokenizers.pre_tokenizers
    hf = PRE_TOKENIZERS[pre].hf
    steps = {"ByteLevel": lambda: pt.ByteLevel(add_prefix_space=False, use_regex="Split" not in hf.steps),
             "Digits": lambda: pt.Digits(individual_digits=True),
             "Split": lambda: pt.Split(tokenizers.Regex(hf.split_regex), behavior="isolated", invert=False)}
    made = [steps[s]() for s in hf.steps]
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = made[0] if len(made) == 1 else pt.Sequence(made)
    tj = json.loads(tok.to_str())
    assert _pre_name(tj, list(hf.architectures)) == pre

    splitter = PRE_TOKENIZERS[pre].splitter
    cased = "\\p{Lu}" in (hf.split_regex or "")
    bad = []
    for text in FULL_CORPUS + ["camelCase aBc DON'T", "HTTPServer's URLs/\npath", "iOS 17's"]:
        if cased and any(ord(c) > 0x7F and unicodedata.category(c)[0] in "LM" for c in text):
            continue
        theirs = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(text)]
        ours = ["".join(BYTE_TO_CHAR[b] for b in p.encode("utf-8")) for p in splitter.split(text)]
        if ours != theirs:
            bad.append((text, ours, theirs))
    assert not bad, f"{len(bad)} texts split differently; the first: {bad[:2]}"


def test_converter_rejects_unknown_hf_pre_tokenizers():
    from edgeinfer.convert.tokenizer_meta import _pre_name
    from edgeinfer.errors import ConversionError

    split = {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Isolated", "invert": False}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}
    for pre in ({"type": "Sequence", "pretokenizers": [split, byte_level]},      # unknown regex
                {**byte_level},                                                 # no regex at all
                {"type": "Sequence", "pretokenizers": ["ByteLevel"]}, None):
        with pytest.raises(ConversionError, match="no llama.cpp equivalent"):
            _pre_name({"pre_tokenizer": pre})
