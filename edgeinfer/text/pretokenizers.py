"""The pre-tokenizer table: every GGUF ``tokenizer.ggml.pre`` name edgeinfer knows, with the
regex split list llama.cpp runs for it and the quirks that come with it; plus the special-token
strip flags llama.cpp restores by model name.

Adding a pre-tokenizer is one entry in ``PRE_TOKENIZERS``. An entry with ``hf`` set is also the
name the converter writes for a Hugging Face ``tokenizer.json`` whose pre-tokenizer has that
form (``edgeinfer/convert/tokenizer_meta.py`` reads the table).
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import regex

from .unicode_classes import expand

__all__ = [
    "DEFAULT_PRE",
    "FALLBACK_PRE",
    "METASPACE_PRE",
    "PRE_TOKENIZERS",
    "STRIP_QUIRKS",
    "HFPreTokenizer",
    "PreTokenizer",
    "Splitter",
    "StripQuirk",
    "strip_quirk",
]

def _rx(pattern: str) -> str:
    """A pre-tokenizer regex written with llama.cpp's classes ({S} its whitespace, {L} / {N} /
    {M} / {P}: see ``unicode_classes.py``), expanded. llama.cpp's splitters for gpt2 / llama3 /
    qwen2 / qwen35 behave exactly like these regexes (including the trailing `|\\s+` its gpt2
    splitter adds)."""
    return expand(pattern)


@functools.cache
def _compiled(pattern: str) -> regex.Pattern[str]:
    """Compiled on first use: the table's regexes take ~10 ms each to compile, and a model uses one
    split list."""
    return regex.compile(pattern, regex.V1)


@dataclass(frozen=True)
class Splitter:
    """One of llama.cpp's regex split lists: each regex (its pattern) cuts every piece the
    previous left."""

    patterns: tuple[str, ...]

    def split(self, text: str) -> list[str]:
        chunks = [text]
        for rx in map(_compiled, self.patterns):
            out: list[str] = []
            for c in chunks:
                parts = rx.findall(c)
                if sum(map(len, parts)) == len(c):
                    out.extend(parts)
                    continue
                # characters no alternative matches stay pieces of their own, as llama.cpp's
                # std::regex splitter keeps the gaps
                pos = 0
                for m in rx.finditer(c):
                    s, e = m.span()
                    if s > pos:
                        out.append(c[pos:s])
                    if e > s:
                        out.append(c[s:e])
                    pos = e
                if pos < len(c):
                    out.append(c[pos:])
            chunks = out
        return chunks


_RX_GPT2 = _rx(
    r"'s|'t|'re|'ve|'m|'ll|'d| ?{L}+| ?{N}+| ?[^{S}{L}{N}]+|[{S}]+(?![^{S}])|[{S}]+"
)
_RX_LLAMA3 = _rx(
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n{L}{N}]?{L}+"
    r"|{N}{1,3}| ?[^{S}{L}{N}]+[\r\n]*|[{S}]*[\r\n]+|[{S}]+(?![^{S}])|[{S}]+"
)
_RX_QWEN2 = _rx(
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n{L}{N}]?{L}+"
    r"|{N}| ?[^{S}{L}{N}]+[\r\n]*|[{S}]*[\r\n]+|[{S}]+(?![^{S}])|[{S}]+"
)
# gpt-4o (Phi-4-mini): llama.cpp's form, where a cased letter is "a letter but not a-z" (upper)
# or "a letter but not A-Z" (lower), so any non-ASCII letter counts as both
_RX_GPT4O = _rx(
    r"[^\r\n{L}{N}]?(?:(?={L})[^a-z])*(?:(?={L})[^A-Z])+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    r"|[^\r\n{L}{N}]?(?:(?={L})[^a-z])+(?:(?={L})[^A-Z])*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    r"|{N}{1,3}| ?[^{S}{L}{N}]+[\r\n/]*|[{S}]*[\r\n]+|[{S}]+(?![^{S}])|[{S}]+"
)

GPT2 = Splitter((_RX_GPT2,))
SMOLLM = Splitter((_rx(r"{N}"), _RX_GPT2))   # digits one by one, then gpt-2
LLAMA3 = Splitter((_RX_LLAMA3,))
QWEN2 = Splitter((_RX_QWEN2,))
GPT4O = Splitter((_RX_GPT4O,))
# Qwen3.5: marks join letters, and are never "other"
_RX_QWEN35 = _rx(
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n{L}{N}]?[{L}{M}]+"
    r"|{N}| ?[^{S}{L}{M}{N}]+[\r\n]*|[{S}]*[\r\n]+|[{S}]+(?![^{S}])|[{S}]+"
)
QWEN35 = Splitter((_RX_QWEN35,))
# metaspace BPE (gemma4): only runs of newlines are cut off, the merges see whole lines
LINES = Splitter((r"[^\n]+|\n+",))
DEFAULT = Splitter((
    _rx(r"[{P}$+<=>^~|]+"), _RX_GPT2, _rx(r"{N}+"), _rx(r"[0-9][0-9][0-9]")))


# ---------------------------------------------------------------------------------------------
# How Hugging Face's tokenizer.json spells a pre-tokenizer (the regexes in its own dialect)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HFPreTokenizer:
    """A tokenizer.json ``pre_tokenizer``: its steps' types in order (a lone step or a
    ``Sequence``), and the pattern of its ``Split`` step (behavior ``Isolated``). The final
    ``ByteLevel`` runs its own gpt-2 regex exactly when no ``Split`` precedes it; a ``Digits``
    step splits individual digits."""

    steps: tuple[str, ...]
    split_regex: str | None = None
    description: str = ""
    #: config.json ``architectures`` that pick this entry among entries of the same form
    architectures: tuple[str, ...] = ()


_HF_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_HF_LLAMA3 = HFPreTokenizer(
    ("Split", "ByteLevel"),
    _HF_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+", "Llama 3 Split + ByteLevel")
_HF_QWEN2 = HFPreTokenizer(
    ("Split", "ByteLevel"),
    _HF_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+", "Qwen2 Split + ByteLevel")
_HF_QWEN35 = HFPreTokenizer(
    ("Split", "ByteLevel"),
    _HF_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
    r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+", "Qwen3.5 Split + ByteLevel")
_HF_GPT4O = HFPreTokenizer(       # tiktoken's o200k (Phi-4-mini)
    ("Split", "ByteLevel"),
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    + _HF_CONTRACTIONS + r"?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _HF_CONTRACTIONS + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+", "o200k Split + ByteLevel")


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PreTokenizer:
    """What a ``tokenizer.ggml.pre`` name means to a byte-level BPE tokenizer.

    ``ignore_merges``: a word that is a whole token is taken as is, before any merge;
    ``add_bos``: BOS is added unless the metadata says otherwise; ``clean_spaces``: llama.cpp's
    clean-up of spaces before punctuation on detokenizing (recorded; decode() never cleans);
    ``hf``: the tokenizer.json form the converter names by this entry. ``family``: the name
    of the group of entries that behave alike.
    """

    family: str
    splitter: Splitter
    ignore_merges: bool = False
    add_bos: bool = False
    clean_spaces: bool = True
    hf: HFPreTokenizer | None = field(default=None, compare=False)


_LLAMA3_PRE = PreTokenizer("llama3", LLAMA3, ignore_merges=True, add_bos=True)
_GPT2_PRE = PreTokenizer("gpt2", GPT2)
_SMOLLM_PRE = PreTokenizer("smollm", SMOLLM)

#: GGUF ``tokenizer.ggml.pre`` -> pre-tokenizer, the names llama.cpp maps onto these splitters
PRE_TOKENIZERS: Mapping[str, PreTokenizer] = {
    "default": PreTokenizer("default", DEFAULT),
    # llama3: ignore_merges, BOS
    "llama3": _LLAMA3_PRE, "llama-v3": _LLAMA3_PRE, "falcon3": _LLAMA3_PRE,
    "llama-bpe": replace(_LLAMA3_PRE, hf=_HF_LLAMA3),
    "falcon-h1": _LLAMA3_PRE, "pixtral": _LLAMA3_PRE, "midm-2.0": _LLAMA3_PRE,
    # LFM2's tokenizer.json has Llama 3's form; llama.cpp's converter names it by the model
    "lfm2": replace(_LLAMA3_PRE, hf=replace(
        _HF_LLAMA3, description="Llama 3 Split + ByteLevel, LFM2",
        architectures=("Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "Lfm2VlForConditionalGeneration"))),
    # the llama3 regex alone
    "dbrx": PreTokenizer("llama3-plain", LLAMA3), "smaug-bpe": PreTokenizer("llama3-plain", LLAMA3),
    # gpt-2
    "gpt-2": replace(_GPT2_PRE, hf=HFPreTokenizer(("ByteLevel",), None, "ByteLevel")),
    "phi-2": _GPT2_PRE, "jina-es": _GPT2_PRE, "jina-de": _GPT2_PRE, "gigachat": _GPT2_PRE,
    "jina-v2-es": _GPT2_PRE, "jina-v2-de": _GPT2_PRE, "a.x-4.0": _GPT2_PRE, "mellum": _GPT2_PRE,
    "mpt": _GPT2_PRE, "olmo": _GPT2_PRE, "jais": _GPT2_PRE, "exaone4": _GPT2_PRE,
    "trillion": _GPT2_PRE,
    # digits one by one, then gpt-2
    "smollm": replace(_SMOLLM_PRE, clean_spaces=False,
                      hf=HFPreTokenizer(("Digits", "ByteLevel"), None, "Digits + ByteLevel")),
    "starcoder": _SMOLLM_PRE, "refact": _SMOLLM_PRE, "codeshell": _SMOLLM_PRE,
    "exaone": _SMOLLM_PRE, "minerva-7b": _SMOLLM_PRE,
    "command-r": replace(_SMOLLM_PRE, clean_spaces=False),
    # qwen2
    "qwen2": PreTokenizer("qwen2", QWEN2, clean_spaces=False, hf=_HF_QWEN2),
    "deepseek-r1-qwen": PreTokenizer("qwen2", QWEN2, clean_spaces=False),
    "stablelm2": PreTokenizer("qwen2", QWEN2), "megrez": PreTokenizer("qwen2", QWEN2),
    "qwen35": PreTokenizer("qwen35", QWEN35, clean_spaces=False, hf=_HF_QWEN35),
    # gpt-4o
    "gpt-4o": PreTokenizer("gpt4o", GPT4O, clean_spaces=False, hf=_HF_GPT4O),
}
#: the pre-tokenizer of metaspace BPE (the gemma4 tokenizer model), which names no other
METASPACE_PRE = PreTokenizer("gemma4", LINES, add_bos=True)
#: what a BPE vocabulary without ``tokenizer.ggml.pre`` gets (llama.cpp's 'default')
DEFAULT_PRE = "default"
#: what an unknown ``tokenizer.ggml.pre`` falls back to
FALLBACK_PRE = "gpt-2"


# ---------------------------------------------------------------------------------------------
# Special-token strip flags. Hugging Face's added tokens carry lstrip / rstrip (the token
# swallows the whitespace on that side); GGUF does not, so llama.cpp restores them for the
# models it knows, matched by name. The first matching quirk applies, as in llama.cpp.
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StripQuirk:
    """``key``: the metadata value matched (``general.name`` is compared lower-cased), holding
    any of ``contains``; ``rstrip_specials``: every special token swallows the whitespace on
    its right; ``rstrip`` / ``no_rstrip``: tokens (by text) set / cleared after that."""

    key: str
    contains: tuple[str, ...]
    rstrip_specials: bool = False
    rstrip: tuple[str, ...] = ()
    no_rstrip: tuple[str, ...] = ()

    def matches(self, meta: Mapping[str, Any]) -> bool:
        value = meta.get(self.key)
        if not isinstance(value, str):
            return False
        value = value.lower()
        return any(s in value for s in self.contains)


STRIP_QUIRKS: tuple[StripQuirk, ...] = (
    # Phi-3's chat tokens (<|user|>, <|end|>, ...) are rstrip in its tokenizer.json;
    # <s>, <unk> and <|endoftext|> are not
    StripQuirk("general.name", ("phi-3", "phi3"), rstrip_specials=True, rstrip=("</s>",),
               no_rstrip=("<unk>", "<s>", "<|endoftext|>")),
)


def strip_quirk(meta: Mapping[str, Any]) -> StripQuirk | None:
    """The strip quirk that applies to a GGUF with this metadata, if any."""
    return next((q for q in STRIP_QUIRKS if q.matches(meta)), None)
