"""Our tokenizer against llama.cpp on random text, and llama.cpp's Unicode classes.

The fuzz draws texts (hypothesis, derandomized: the same examples every run) that mix the
characters tokenizers disagree on -- unassigned and recently assigned code points, marks,
whitespace of every kind, contractions, digits, special-token texts -- with any other code
point, and tokenizes them with llama.cpp (llama-cpp-python) and with ours on the vocabulary
files llama.cpp ships. EDGEINFER_FUZZ_EXAMPLES sets the examples per vocabulary (default
150, a few seconds each); e.g. EDGEINFER_FUZZ_EXAMPLES=5000 for a long run.
"""
from __future__ import annotations

import os

import pytest

from edgeinfer.text.unicode_classes import CLASSES
from tests.support.llama_vocabs import unicode_flags, vocab_path
from tests.support.strict import require
from tests.test_tokenizer import VOCAB_FILES, oracle_vocab, vocab_file_tokenizer

hypothesis = require("hypothesis", "hypothesis draws the fuzz texts")
st = hypothesis.strategies

FUZZ_EXAMPLES = int(os.environ.get("EDGEINFER_FUZZ_EXAMPLES", "150"))

# characters near the class boundaries: unassigned in Unicode 15.1 (U+209E, U+0378, U+E0080,
# U+10FFFF), assigned after it (U+0897 a mark, U+1C89 a letter, U+1B4E punctuation, U+16D70 a
# digit), marks, private use, format characters and every kind of whitespace
_HOSTILE = list("\\ab Z1'\"\n\r\t!.,:;?sStTdDmM_-~$+<=>^|`#@%&*()[]{}/0123456789") + [
    "\u209e", "\u0378", "\U000e0080", "\U0010ffff", "\u0897", "\u1c89", "\u1b4e", "\U00016d70",
    "\u0301", "\u0915\u094d", "\u0e33", "\ue000", "\u00ad", "\u200b", "\u200d", "\ufeff",
    "\u00a0", "\u2028", "\u3000", "\u0085", "\u000b", "\u000c", "\u1680", "\u202f", "\u205f",
    "\u2581", "é", "ß", "ǅ", "İ", "ſ", "中", "日本", "🙂", "👍🏽", "½", "²", "٣", "Ⅻ", "ـ",
    "'s", "'LL", "  ", "\n\n", " \n", "\r\n", "<|im_start|>", "<|im_end|>", "<s>", "</s>",
    "<|endoftext|>", "<|turn>", "<eos>", "<0x41>",
]
_TEXTS = st.lists(
    st.one_of(st.sampled_from(_HOSTILE), st.characters(exclude_categories=("Cs",))),
    max_size=24).map("".join)


@pytest.mark.oracle
@pytest.mark.parametrize("name", VOCAB_FILES)
def test_fuzz_against_llama_cpp(name):
    tok = vocab_file_tokenizer(name)
    llm = oracle_vocab(vocab_path(name))
    seen: list[str] = []

    @hypothesis.settings(max_examples=FUZZ_EXAMPLES, derandomize=True, deadline=None,
                         database=None, suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(text=_TEXTS, add_special=st.booleans(), parse_special=st.booleans())
    def same_ids(text, add_special, parse_special):
        seen.append(text)
        ref = llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special)
        assert tok.encode(text, add_special=add_special, parse_special=parse_special) == ref

    same_ids()
    print(f"\n{name}: {len(seen)} fuzz examples identical to llama.cpp")


@pytest.mark.oracle
@pytest.mark.parametrize("name", ["llama-bpe", "qwen2", "qwen35", "gpt-2", "command-r"])
def test_unassigned_code_point_before_a_backslash(name):
    """U+209E is unassigned in Unicode 15.1, so llama.cpp's splitters take it as "other", like
    the backslash after it; a letter class that took it in would cut the text elsewhere."""
    tok = vocab_file_tokenizer(name)
    llm = oracle_vocab(vocab_path(name))
    for text in ("\u209e\\a", "\u209e\\alpha", "x\u209e\\n", " \u209e\\\\b c", "\u209e\u209e\\a1"):
        assert tok.encode(text, add_special=False) == llm.tokenize(text.encode(), add_bos=False), text


def test_unicode_classes_follow_llama_cpp():
    """Every code point (unassigned ones included) is in our letter / number / mark /
    punctuation / whitespace class exactly when llama.cpp's table gives it that flag."""
    regex = require("regex")
    flags = unicode_flags()
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    for key, bit in (("{L}", 0x4), ("{N}", 0x2), ("{M}", 0x10), ("{P}", 0x20), ("{S}", 0x100)):
        ours = {ord(c) for c in regex.findall("[" + CLASSES[key] + "]", every, flags=regex.V1)}
        theirs = {c for c in map(ord, every) if flags[c] & bit}
        assert ours == theirs, (key, sorted(ours ^ theirs)[:10])
