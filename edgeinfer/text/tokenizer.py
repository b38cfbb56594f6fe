"""Tokenizers built from GGUF metadata, matching llama.cpp token for token.

Two tokenizer models are supported, as llama.cpp names them in ``tokenizer.ggml.model``:

* ``gpt2``  -- byte-level BPE. The text is first split by the pre-tokenizer regexes that
  llama.cpp associates with ``tokenizer.ggml.pre`` (gpt-2, smollm/starcoder, llama3, qwen2,
  default), every piece is mapped to GPT-2's byte alphabet and merged by merge rank.
* ``llama`` -- SentencePiece as llama.cpp runs it: spaces become ``▁`` (with a leading one
  when ``add_space_prefix``), characters are merged by token score, and characters that no
  token covers fall back to ``<0xXX>`` byte tokens.

In both, special tokens (CONTROL / USER_DEFINED / UNKNOWN types) are cut out of the raw
text first, longest first, like llama.cpp's ``tokenizer_st_partition``.

``StreamDecoder`` turns ids into text incrementally without ever emitting half a UTF-8
character.
"""
from __future__ import annotations

import codecs
import heapq
import logging
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import regex

from ..errors import InvalidTokenError, TokenizerError

__all__ = ["Tokenizer", "StreamDecoder", "TokenType"]

log = logging.getLogger(__name__)


class TokenType:
    """GGUF ``tokenizer.ggml.token_type`` values."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


# token attributes (bit flags, as llama.cpp keeps them)
_A_UNKNOWN = 1 << 0
_A_UNUSED = 1 << 1
_A_NORMAL = 1 << 2
_A_CONTROL = 1 << 3
_A_USER_DEFINED = 1 << 4
_A_BYTE = 1 << 5
_A_LSTRIP = 1 << 7
_A_RSTRIP = 1 << 8

_TYPE_TO_ATTR = {
    TokenType.UNDEFINED: 0,
    TokenType.NORMAL: _A_NORMAL,
    TokenType.UNKNOWN: _A_UNKNOWN,
    TokenType.CONTROL: _A_CONTROL,
    TokenType.USER_DEFINED: _A_USER_DEFINED,
    TokenType.UNUSED: _A_UNUSED,
    TokenType.BYTE: _A_BYTE,
}

_SPECIAL_ATTRS = _A_CONTROL | _A_USER_DEFINED | _A_UNKNOWN
_SKIPPABLE_ATTRS = _A_CONTROL | _A_UNKNOWN  # what decode(skip_special=True) leaves out


# ---------------------------------------------------------------------------------------------
# GPT-2 byte alphabet: every byte gets a printable code point (printable Latin-1 bytes keep
# their own, the others are moved to U+0100 upwards in byte order).
# ---------------------------------------------------------------------------------------------
def _gpt2_byte_alphabet() -> list[str]:
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table: list[str] = [""] * 256
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


_BYTE_TO_CHAR: list[str] = _gpt2_byte_alphabet()
_CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(_BYTE_TO_CHAR)}
# str.translate table for latin-1-decoded UTF-8 bytes -> GPT-2 alphabet
_LATIN1_TO_GPT2 = {b: c for b, c in enumerate(_BYTE_TO_CHAR)}


# ---------------------------------------------------------------------------------------------
# Pre-tokenizer regexes, as llama.cpp defines them per `tokenizer.ggml.pre`. llama.cpp's
# hand-written splitters for gpt2 / llama3 / qwen2 behave exactly like these regexes
# (including the trailing `|\s+` its gpt2 splitter adds); pieces no alternative matches are
# kept as pieces of their own, like its std::regex splitter does.
# ---------------------------------------------------------------------------------------------
_WS = "\\t\\n\\x0b\\x0c\\r \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
# llama.cpp's character classes follow Unicode 15.1; the `regex` module knows newer versions.
# Letters and numbers first assigned after Unicode 15.1 are unassigned ("other") for llama.cpp,
# so they are taken out of \p{L} / \p{N} here.
_NEW_LETTERS = (
    "\\u088f\\u0c5c\\u0cdc\\u1c89\\u1c8a\\ua7cb-\\ua7cf\\ua7d2\\ua7d4\\ua7da-\\ua7f1"
    "\\U000105c0-\\U000105f3\\U00010940-\\U00010959\\U00010d4a-\\U00010d85\\U00010ec2-\\U00010ec7"
    "\\U00011380-\\U000113d3\\U00011bc0-\\U00011be0\\U00011db0-\\U00011ddb\\U00013460-\\U000143fa"
    "\\U00016100-\\U0001611d\\U00016d40-\\U00016d6c\\U00016ea0-\\U00016ed3\\U00016ff2-\\U00016ff3"
    "\\U000187f8-\\U000187ff\\U00018cff\\U00018d09-\\U00018df2\\U0001e5d0-\\U0001e6ff"
    "\\U0002b73a-\\U0002b73f\\U0002cea2-\\U0002cead\\U000323b0-\\U00033479"
)
_NEW_NUMBERS = (
    "\\U00010d40-\\U00010d49\\U000116d0-\\U000116e3\\U00011bf0-\\U00011bf9\\U00011de0-\\U00011de9"
    "\\U00016130-\\U00016139\\U00016d70-\\U00016d79\\U00016ff4-\\U00016ff6\\U0001ccf0-\\U0001ccf9"
    "\\U0001e5f1-\\U0001e5fa"
)
_NEW_PUNCT = (
    "\\u1b4e\\u1b4f\\u1b7f\\U00010d6e\\U00010ed0\\U000113d4\\U000113d5\\U000113d7\\U000113d8"
    "\\U00011be1\\U00016d6d-\\U00016d6f\\U0001e5ff"
)
_L = "[\\p{L}--[" + _NEW_LETTERS + "]]"
_N = "[\\p{N}--[" + _NEW_NUMBERS + "]]"


def _rx(pattern: str) -> "regex.Pattern[str]":
    """Compiles a pre-tokenizer regex: {S} = llama.cpp's whitespace set (its \\s), {L} / {N} =
    letters / numbers as llama.cpp classifies them (usable inside a class as nested sets),
    {NEWP} = punctuation newer than Unicode 15.1."""
    for key, val in (("{S}", _WS), ("{L}", _L), ("{N}", _N), ("{NEWP}", _NEW_PUNCT)):
        pattern = pattern.replace(key, val)
    return regex.compile(pattern, regex.V1)


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
_RX_DIGIT = _rx(r"{N}")
# llama.cpp's 'default' set (used when tokenizer.ggml.pre is missing or 'default')
_RX_DEFAULT = (
    _rx(r"[[\p{P}--[{NEWP}]]$+<=>^~|]+"),
    _RX_GPT2,
    _rx(r"{N}+"),
    _rx(r"[0-9][0-9][0-9]"),
)

# pre-tokenizer family -> (regex list, flags)
_PRE_FAMILIES: dict[str, tuple[tuple[Any, ...], dict[str, bool]]] = {
    "gpt2": ((_RX_GPT2,), {}),
    "smollm": ((_RX_DIGIT, _RX_GPT2), {}),
    "llama3": ((_RX_LLAMA3,), {"ignore_merges": True, "add_bos": True}),
    "llama3-plain": ((_RX_LLAMA3,), {}),
    "qwen2": ((_RX_QWEN2,), {}),
    "gpt4o": ((_RX_GPT4O,), {}),
    "default": (_RX_DEFAULT, {}),
}

# tokenizer.ggml.pre value -> family (the names llama.cpp maps onto these regex sets)
_PRE_NAMES: dict[str, str] = {
    "default": "default",
    # llama3 (ignore_merges, add_bos)
    "llama3": "llama3", "llama-v3": "llama3", "llama-bpe": "llama3", "falcon3": "llama3",
    "falcon-h1": "llama3", "pixtral": "llama3", "midm-2.0": "llama3", "lfm2": "llama3",
    # same regex, no extra flags
    "dbrx": "llama3-plain", "smaug-bpe": "llama3-plain",
    # gpt-2
    "gpt-2": "gpt2", "phi-2": "gpt2", "jina-es": "gpt2", "jina-de": "gpt2", "gigachat": "gpt2",
    "jina-v2-es": "gpt2", "jina-v2-de": "gpt2", "a.x-4.0": "gpt2", "mellum": "gpt2",
    "mpt": "gpt2", "olmo": "gpt2", "jais": "gpt2", "exaone4": "gpt2", "trillion": "gpt2",
    # digits split one by one, then gpt-2
    "smollm": "smollm", "starcoder": "smollm", "refact": "smollm", "command-r": "smollm",
    "codeshell": "smollm", "exaone": "smollm", "minerva-7b": "smollm",
    # qwen2
    "qwen2": "qwen2", "deepseek-r1-qwen": "qwen2", "stablelm2": "qwen2", "megrez": "qwen2",
    # gpt-4o
    "gpt-4o": "gpt4o",
}
# pre types for which llama.cpp turns clean_spaces off (recorded; decode() never cleans spaces)
_PRE_CLEAN_SPACES_FALSE = {"command-r", "deepseek-r1-qwen", "gpt-4o", "qwen2", "smollm"}

# texts llama.cpp uses to find EOT / EOM / FIM tokens and end-of-generation tokens
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
              "<end_of_utterance>")
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)
_EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
))

_SPM_SPACE = "\u2581"  # ▁
_MAX_CACHED_WORD = 256


# ---------------------------------------------------------------------------------------------
# metadata helpers
# ---------------------------------------------------------------------------------------------
def _as_list(value: Any, key: str) -> list:
    if value is None:
        return []
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TokenizerError(f"metadata '{key}' must be an array, got {type(value).__name__}")
    return list(value)


def _as_int(value: Any, key: str) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise TokenizerError(f"metadata '{key}' must be an integer, got {value!r}") from None


def _as_bool(value: Any, key: str) -> bool:
    if isinstance(value, (bool, int)) or type(value).__name__ == "bool_":
        return bool(value)
    raise TokenizerError(f"metadata '{key}' must be a bool, got {value!r}")


def _as_text(value: Any, key: str, index: int) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "surrogateescape")
    raise TokenizerError(f"metadata '{key}'[{index}] must be a string, got {type(value).__name__}")


def _clean_text(text: str) -> str:
    """Replaces lone surrogates (which UTF-8 cannot carry) with U+FFFD."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)


# ---------------------------------------------------------------------------------------------
class Tokenizer:
    """A BPE (``gpt2``) or SentencePiece (``llama``) tokenizer read from GGUF metadata.

    Use ``Tokenizer.from_metadata(meta)`` with the GGUF key/value dict.
    """

    def __init__(self, meta: Mapping[str, Any], *, cache_size: int = 100_000):
        if not isinstance(meta, Mapping):
            raise TokenizerError(f"tokenizer metadata must be a mapping, got {type(meta).__name__}")
        self._cache_size = max(0, int(cache_size))
        self._cache: dict[str, list[int]] = {}
        self._load(meta)

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], **kwargs: Any) -> "Tokenizer":
        """Builds the tokenizer from a GGUF metadata dict (``tokenizer.ggml.*`` keys)."""
        return cls(meta, **kwargs)

    @classmethod
    def from_gguf(cls, path: Any, **kwargs: Any) -> "Tokenizer":
        """Reads the metadata of a GGUF file with edgeinfer's reader and builds the tokenizer."""
        from ..gguf.reader import GGUFFile

        f = GGUFFile(path)
        try:
            meta = dict(f.metadata)
        finally:
            close = getattr(f, "close", None)
            if close is not None:
                close()
        return cls(meta, **kwargs)

    # -----------------------------------------------------------------------------------------
    # loading (mirrors llama_vocab::impl::load)
    # -----------------------------------------------------------------------------------------
    def _load(self, meta: Mapping[str, Any]) -> None:
        model = meta.get("tokenizer.ggml.model")
        if model is None:
            raise TokenizerError("GGUF metadata has no 'tokenizer.ggml.model': cannot build a tokenizer")
        if not isinstance(model, str):
            raise TokenizerError(f"'tokenizer.ggml.model' must be a string, got {model!r}")
        if model == "gpt2":
            self.model = "bpe"
        elif model == "llama":
            self.model = "spm"
        else:
            raise TokenizerError(
                f"unknown tokenizer model {model!r} in 'tokenizer.ggml.model' "
                "(supported: 'gpt2' byte-level BPE, 'llama' SentencePiece)")
        self.tokenizer_model = model

        raw_tokens = meta.get("tokenizer.ggml.tokens")
        if raw_tokens is None:
            raise TokenizerError("GGUF metadata has no 'tokenizer.ggml.tokens': the vocabulary is missing")
        raw_tokens = _as_list(raw_tokens, "tokenizer.ggml.tokens")
        n = len(raw_tokens)
        if n == 0:
            raise TokenizerError("'tokenizer.ggml.tokens' is empty: the vocabulary is missing")
        tokens: list[str] = []
        for i, t in enumerate(raw_tokens):
            t = _as_text(t, "tokenizer.ggml.tokens", i)
            if not t:
                t = f"[EMPTY_{i}]"  # as llama.cpp does
            tokens.append(t)
        self._tokens = tokens
        self.n_vocab = n

        scores = meta.get("tokenizer.ggml.scores")
        if scores is not None:
            scores = _as_list(scores, "tokenizer.ggml.scores")
            if len(scores) < n:
                raise TokenizerError(
                    f"'tokenizer.ggml.scores' has {len(scores)} entries for {n} tokens")
            try:
                scores = [float(s) for s in scores[:n]]
            except (TypeError, ValueError):
                raise TokenizerError("'tokenizer.ggml.scores' must hold numbers") from None
        self._scores: list[float] | None = scores

        types = meta.get("tokenizer.ggml.token_type")
        attrs: list[int]
        if types is not None:
            types = _as_list(types, "tokenizer.ggml.token_type")
            if len(types) < n:
                raise TokenizerError(
                    f"'tokenizer.ggml.token_type' has {len(types)} entries for {n} tokens")
            try:
                attrs = [_TYPE_TO_ATTR.get(int(t), 0) for t in types[:n]]
            except (TypeError, ValueError):
                raise TokenizerError("'tokenizer.ggml.token_type' must hold integers") from None
        else:
            attrs = [_A_NORMAL] * n
        self._attrs = attrs

        # text -> id (the last duplicate wins, like llama.cpp's token_to_id map)
        self._vocab: dict[str, int] = dict(zip(tokens, range(n)))

        pre = meta.get("tokenizer.ggml.pre")
        if pre is not None and not isinstance(pre, str):
            raise TokenizerError(f"'tokenizer.ggml.pre' must be a string, got {pre!r}")
        self.pre = pre

        self.add_space_prefix = False
        self.add_bos = False
        self.add_eos = False
        self.ignore_merges = False
        self.clean_spaces = False
        self._pre_rx: tuple[Any, ...] = ()
        self._ranks: dict[str, int] = {}

        if self.model == "bpe":
            merges = meta.get("tokenizer.ggml.merges")
            if merges is None:
                raise TokenizerError("BPE tokenizer without 'tokenizer.ggml.merges' in the GGUF metadata")
            merges = _as_list(merges, "tokenizer.ggml.merges")
            ranks: dict[str, int] = {}
            for i, m in enumerate(merges):
                m = _as_text(m, "tokenizer.ggml.merges", i)
                pos = m.find(" ", 1)
                if pos < 0:
                    raise TokenizerError(
                        f"'tokenizer.ggml.merges'[{i}] = {m!r} is not a 'left right' pair")
                if m not in ranks:  # the first occurrence keeps its rank
                    ranks[m] = i
            self._ranks = ranks
            # a merge lookup "l r" is only the pair (l, r) if l has no space after its 1st char
            self._spaces_in_tokens = any(" " in t[1:] for t in tokens)
            bos_default, eos_default, unk_default = 11, 11, None
            self.clean_spaces = True
            if pre is None or pre == "":
                log.warning("tokenizer.ggml.pre is missing: using llama.cpp's 'default' pre-tokenizer")
                family = "default"
            elif pre in _PRE_NAMES:
                family = _PRE_NAMES[pre]
            else:
                log.warning("unknown pre-tokenizer %r: falling back to the gpt-2 regex", pre)
                family = "gpt2"
            self.pre_family = family
            rxs, flags = _PRE_FAMILIES[family]
            self._pre_rx = rxs
            self.ignore_merges = flags.get("ignore_merges", False)
            self.add_bos = flags.get("add_bos", False)
            if pre in _PRE_CLEAN_SPACES_FALSE:
                self.clean_spaces = False
        else:
            bos_default, eos_default, unk_default = 1, 2, 0
            self.pre_family = None
            self.add_space_prefix = True
            self.add_bos = True
            self.add_eos = False
            if self._scores is None:
                self._scores = [0.0] * n

        if "tokenizer.ggml.add_space_prefix" in meta:
            self.add_space_prefix = _as_bool(meta["tokenizer.ggml.add_space_prefix"],
                                             "tokenizer.ggml.add_space_prefix")

        # special token ids: model defaults, then metadata (out-of-range values are ignored
        # with a warning, as llama.cpp does)
        def special(key: str, default: int | None) -> int | None:
            if default is not None and not (0 <= default < n):
                default = None
            if key not in meta:
                return default
            v = meta[key]
            try:
                v = operator.index(v)
            except TypeError:
                raise TokenizerError(f"metadata '{key}' must be an integer token id, got {v!r}") from None
            if not (0 <= v < n):
                log.warning("metadata %s = %d is outside the vocabulary (%d tokens); using %s",
                            key, v, n, default)
                return default
            return v

        self.bos_id = special("tokenizer.ggml.bos_token_id", bos_default)
        self.eos_id = special("tokenizer.ggml.eos_token_id", eos_default)
        self.unk_id = special("tokenizer.ggml.unknown_token_id", unk_default)
        self.sep_id = special("tokenizer.ggml.seperator_token_id", None)
        self.pad_id = special("tokenizer.ggml.padding_token_id", None)
        self.eot_id = special("tokenizer.ggml.eot_token_id", None)
        self.eom_id = special("tokenizer.ggml.eom_token_id", None)
        fim_pad = special("tokenizer.ggml.fim_pad_token_id", None)
        fim_rep = special("tokenizer.ggml.fim_rep_token_id", None)
        fim_sep = special("tokenizer.ggml.fim_sep_token_id", None)

        if "tokenizer.ggml.add_bos_token" in meta:
            self.add_bos = _as_bool(meta["tokenizer.ggml.add_bos_token"], "tokenizer.ggml.add_bos_token")
        if "tokenizer.ggml.add_eos_token" in meta:
            self.add_eos = _as_bool(meta["tokenizer.ggml.add_eos_token"], "tokenizer.ggml.add_eos_token")

        # find EOT/EOM/FIM tokens by their text when the metadata does not name them; the
        # tokens found are forced to CONTROL, as llama.cpp does
        def by_text(texts: Iterable[str]) -> int | None:
            for t in texts:
                i = self._vocab.get(t)
                if i is not None:
                    self._attrs[i] |= _A_CONTROL
                    return i
            return None

        if self.eot_id is None:
            self.eot_id = by_text(_EOT_TEXTS)
        if self.eom_id is None:
            self.eom_id = by_text(_EOM_TEXTS)
        if fim_pad is None:
            fim_pad = by_text(_FIM_PAD_TEXTS)
        if fim_rep is None:
            fim_rep = by_text(_FIM_REP_TEXTS)
        if fim_sep is None:
            fim_sep = by_text(_FIM_SEP_TEXTS)

        eog: set[int] = {i for i in (fim_pad, fim_rep, fim_sep) if i is not None}
        for t in _EOG_TEXTS:
            i = self._vocab.get(t)
            if i is not None:
                eog.add(i)
                self._attrs[i] |= _A_CONTROL
        for i in (self.eos_id, self.eot_id, self.eom_id):
            if i is not None:
                eog.add(i)
        # gpt-oss / solar-open: '<|end|>' is not an end of generation there
        texts = {self._tokens[i]: i for i in eog}
        if "<|end|>" in texts and (("<|return|>" in texts and "<|call|>" in texts)
                                   or ("<|calls|>" in texts and "<|flush|>" in texts)):
            end = texts["<|end|>"]
            eog.discard(end)
            self._attrs[end] = _A_USER_DEFINED
        if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
            s = texts["</s>"]
            eog.discard(s)
            self._attrs[s] = _A_NORMAL
        self.eog_ids: frozenset[int] = frozenset(eog)

        # phi-3: special tokens swallow the whitespace on their right (llama.cpp sets RSTRIP)
        name = meta.get("general.name")
        if isinstance(name, str) and ("phi-3" in name.lower() or "phi3" in name.lower()):
            for i, a in enumerate(self._attrs):
                if a & _SPECIAL_ATTRS:
                    self._attrs[i] |= _A_RSTRIP
            for t, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
                i = self._vocab.get(t)
                if i is not None:
                    self._attrs[i] = (self._attrs[i] | _A_RSTRIP) if on else (self._attrs[i] & ~_A_RSTRIP)

        # special tokens are cut out of the raw text longest first
        specials = [i for i, a in enumerate(self._attrs) if a & _SPECIAL_ATTRS]
        specials.sort(key=lambda i: -len(self._tokens[i].encode("utf-8", "surrogateescape")))
        self._specials = specials

        self._pieces: list[bytes | None] = [None] * n

    # -----------------------------------------------------------------------------------------
    # public properties
    # -----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.n_vocab

    def __repr__(self) -> str:
        return (f"Tokenizer(model={self.tokenizer_model!r}, pre={self.pre!r}, n_vocab={self.n_vocab}, "
                f"bos={self.bos_id}, eos={self.eos_id}, eot={self.eot_id})")

    def _check_id(self, token_id: Any) -> int:
        try:
            i = operator.index(token_id)
        except TypeError:
            raise InvalidTokenError(
                f"token id must be an integer, got {token_id!r} (vocabulary of {self.n_vocab} tokens)"
            ) from None
        if not (0 <= i < self.n_vocab):
            raise InvalidTokenError(
                f"token id {i} is out of range: the vocabulary has {self.n_vocab} tokens "
                f"(valid ids 0..{self.n_vocab - 1})")
        return i

    def token_text(self, token_id: int) -> str:
        """The token's string as stored in the vocabulary (byte-level alphabet for BPE)."""
        return self._tokens[self._check_id(token_id)]

    def token_type(self, token_id: int) -> int:
        """The token's llama.cpp attribute flags mapped back to a GGUF TokenType value."""
        a = self._attrs[self._check_id(token_id)]
        for t, flag in ((TokenType.CONTROL, _A_CONTROL), (TokenType.USER_DEFINED, _A_USER_DEFINED),
                        (TokenType.UNKNOWN, _A_UNKNOWN), (TokenType.BYTE, _A_BYTE),
                        (TokenType.UNUSED, _A_UNUSED), (TokenType.NORMAL, _A_NORMAL)):
            if a & flag:
                return t
        return TokenType.UNDEFINED

    def token_id(self, text: str) -> int | None:
        """The id of the token whose vocabulary string is exactly ``text``, or None."""
        return self._vocab.get(text)

    def is_special(self, token_id: int) -> bool:
        """True for control, user-defined and unknown tokens (matched whole in raw text)."""
        return bool(self._attrs[self._check_id(token_id)] & _SPECIAL_ATTRS)

    def is_control(self, token_id: int) -> bool:
        """True for control / unknown tokens: the ones ``decode(skip_special=True)`` drops."""
        return bool(self._attrs[self._check_id(token_id)] & _SKIPPABLE_ATTRS)

    def is_eog(self, token_id: int) -> bool:
        """True when generating this token ends generation (eos, eot, <|im_end|>, ...)."""
        return operator.index(token_id) in self.eog_ids

    @property
    def special_ids(self) -> list[int]:
        return list(self._specials)

    # -----------------------------------------------------------------------------------------
    # encoding
    # -----------------------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Text -> token ids, identical to llama.cpp's ``tokenize(text, add_special, parse_special)``.

        ``add_special`` adds BOS / EOS as the model asks (``tokenizer.ggml.add_bos_token`` /
        ``add_eos_token`` and llama.cpp's defaults); ``parse_special`` lets control tokens
        written in the text (e.g. ``<|im_start|>``) become single tokens.
        """
        if not isinstance(text, str):
            raise TokenizerError(f"encode() takes a str, got {type(text).__name__}")
        text = _clean_text(text)
        out: list[int] = []
        if add_special and self.add_bos:
            if self.bos_id is None:
                raise TokenizerError("the model asks for a BOS token but its vocabulary has none")
            out.append(self.bos_id)
        fragments = self._partition(text, parse_special) if text else []
        if self.model == "bpe":
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    self._bpe_fragment(frag, out)
        else:
            prev_special = True
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                    prev_special = True
                else:
                    if self.add_space_prefix and prev_special:
                        frag = " " + frag
                    self._spm_fragment(frag.replace(" ", _SPM_SPACE), out)
                    prev_special = False
        if add_special and self.add_eos:
            if self.eos_id is None:
                raise TokenizerError("the model asks for an EOS token but its vocabulary has none")
            out.append(self.eos_id)
        return out

    def __call__(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.encode(text, add_special=add_special, parse_special=parse_special)

    def _partition(self, text: str, parse_special: bool) -> list:
        """Cuts special tokens out of the text (llama.cpp's tokenizer_st_partition)."""
        frags: list = [text]
        tokens, attrs = self._tokens, self._attrs
        for sid in self._specials:
            a = attrs[sid]
            if not parse_special and (a & (_A_CONTROL | _A_UNKNOWN)):
                continue
            t = tokens[sid]
            if not any(isinstance(f, str) and t in f for f in frags):
                continue
            new: list = []
            for f in frags:
                if isinstance(f, int) or t not in f:
                    new.append(f)
                    continue
                parts = f.split(t)
                for k, p in enumerate(parts):
                    if k > 0:
                        new.append(sid)
                    if a & _A_LSTRIP and k + 1 < len(parts):
                        p = p.rstrip(" \t\n\v\f\r")
                    if a & _A_RSTRIP and k > 0:
                        p = p.lstrip(" \t\n\v\f\r")
                    if p:
                        new.append(p)
            frags = new
        return frags

    # ---- BPE --------------------------------------------------------------------------------
    def _pretokenize(self, text: str) -> list[str]:
        chunks = [text]
        for rx in self._pre_rx:
            out: list[str] = []
            for c in chunks:
                parts = rx.findall(c)
                if sum(map(len, parts)) == len(c):
                    out.extend(parts)
                    continue
                # some characters matched nothing: keep them as their own pieces (like
                # llama.cpp's std::regex splitter keeps the gaps)
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

    def _bpe_fragment(self, text: str, out: list[int]) -> None:
        cache = self._cache
        for word in self._pretokenize(text):
            ids = cache.get(word)
            if ids is None:
                ids = self._bpe_word(word)
                if self._cache_size and len(word) <= _MAX_CACHED_WORD:
                    if len(cache) >= self._cache_size:
                        try:
                            del cache[next(iter(cache))]
                        except (StopIteration, KeyError, RuntimeError):
                            pass
                    cache[word] = ids
            out.extend(ids)

    def _bpe_word(self, word: str) -> list[int]:
        vocab = self._vocab
        enc = word.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_GPT2)
        if self.ignore_merges:
            i = vocab.get(enc)
            if i is not None:
                return [i]
        n = len(enc)
        if n == 1:
            syms = [enc]
        else:
            syms = list(enc)
            ranks = self._ranks
            check_space = self._spaces_in_tokens
            nxt = list(range(1, n + 1))
            nxt[-1] = -1
            prv = list(range(-1, n - 1))
            heap: list[tuple[int, int, int, str]] = []
            for k in range(n - 1):
                r = ranks.get(syms[k] + " " + syms[k + 1])
                if r is not None:
                    heap.append((r, k, k + 1, syms[k] + syms[k + 1]))
            heapq.heapify(heap)
            pop, push = heapq.heappop, heapq.heappush
            while heap:
                _, left, right, txt = pop(heap)
                sl = syms[left]
                sr = syms[right]
                if not sl or not sr or sl + sr != txt:
                    continue  # outdated
                syms[left] = txt
                syms[right] = ""
                nn = nxt[right]
                nxt[left] = nn
                if nn >= 0:
                    prv[nn] = left
                p = prv[left]
                if p >= 0:
                    a = syms[p]
                    if not (check_space and " " in a[1:]):
                        r = ranks.get(a + " " + txt)
                        if r is not None:
                            push(heap, (r, p, left, a + txt))
                if nn >= 0:
                    b = syms[nn]
                    if not (check_space and " " in txt[1:]):
                        r = ranks.get(txt + " " + b)
                        if r is not None:
                            push(heap, (r, left, nn, txt + b))
        ids: list[int] = []
        for s in syms:
            if not s:
                continue
            i = vocab.get(s)
            if i is not None:
                ids.append(i)
                continue
            # no token for the merged text: llama.cpp falls back to one-byte strings of it
            for ch in s:
                if ord(ch) < 0x80:
                    j = vocab.get(ch)
                    if j is not None:
                        ids.append(j)
        return ids

    # ---- SentencePiece ----------------------------------------------------------------------
    def _spm_fragment(self, text: str, out: list[int]) -> None:
        vocab, scores = self._vocab, self._scores
        assert scores is not None
        syms = list(text)
        n = len(syms)
        if n == 0:
            return
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, str]] = []
        for k in range(n - 1):
            t = syms[k] + syms[k + 1]
            i = vocab.get(t)
            if i is not None:
                heap.append((-scores[i], k, k + 1, t))
        heapq.heapify(heap)
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            _, left, right, txt = pop(heap)
            sl = syms[left]
            sr = syms[right]
            if not sl or not sr or sl + sr != txt:
                continue
            syms[left] = txt
            syms[right] = ""
            nn = nxt[right]
            nxt[left] = nn
            if nn >= 0:
                prv[nn] = left
            p = prv[left]
            if p >= 0:
                t = syms[p] + txt
                i = vocab.get(t)
                if i is not None:
                    push(heap, (-scores[i], p, left, t))
            if nn >= 0:
                t = txt + syms[nn]
                i = vocab.get(t)
                if i is not None:
                    push(heap, (-scores[i], left, nn, t))
        for s in syms:
            if not s:
                continue
            i = vocab.get(s)
            if i is not None:
                out.append(i)
                continue
            for b in s.encode("utf-8", "surrogateescape"):
                out.append(self._byte_token(b))

    def _byte_token(self, b: int) -> int:
        i = self._vocab.get(f"<0x{b:02X}>")
        if i is None and b < 0x80:
            i = self._vocab.get(chr(b))
        if i is None:
            if self.unk_id is not None:
                return self.unk_id
            raise TokenizerError(
                f"SentencePiece vocabulary has no byte token <0x{b:02X}> and no unknown token")
        return i

    # -----------------------------------------------------------------------------------------
    # decoding
    # -----------------------------------------------------------------------------------------
    def token_to_bytes(self, token_id: int) -> bytes:
        """The bytes this token stands for (control tokens give their text, like llama.cpp
        ``token_to_piece(special=True)``); may be part of a multi-byte UTF-8 character."""
        i = self._check_id(token_id)
        p = self._pieces[i]
        if p is None:
            p = self._pieces[i] = self._make_piece(i)
        return p

    def _make_piece(self, i: int) -> bytes:
        a = self._attrs[i]
        text = self._tokens[i]
        if a & (_SPECIAL_ATTRS):
            return text.encode("utf-8", "surrogateescape")
        if a & _A_NORMAL:
            if self.model == "spm":
                return text.replace(_SPM_SPACE, " ").encode("utf-8", "surrogateescape")
            out = bytearray()
            for c in text:
                b = _CHAR_TO_BYTE.get(c)
                if b is not None:
                    out.append(b)
                else:  # llama.cpp's marker for characters outside the byte alphabet
                    u = c.encode("utf-8", "surrogateescape")
                    out += b"[UNK_BYTE_0x" + u.hex().encode() + text.encode("utf-8", "surrogateescape") + b"]"
            return bytes(out)
        if a & _A_BYTE:
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                return b""
        return b""

    def decode_bytes(self, ids: Iterable[int], skip_special: bool = False) -> bytes:
        """Token ids -> raw bytes (see ``decode``)."""
        parts: list[bytes] = []
        strip = self.add_space_prefix
        attrs = self._attrs
        for t in ids:
            i = self._check_id(t)
            if skip_special and attrs[i] & _SKIPPABLE_ATTRS:
                continue
            p = self._pieces[i]
            if p is None:
                p = self._pieces[i] = self._make_piece(i)
            if strip and p:
                if p[:1] == b" ":
                    p = p[1:]
                strip = False
            parts.append(p)
        return b"".join(parts)

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Token ids -> text. ``skip_special`` drops control tokens (BOS, <|im_end|>, ...).

        With SentencePiece's ``add_space_prefix`` the space encode() put in front of the
        text is removed from the first piece. Invalid UTF-8 becomes U+FFFD.
        """
        if isinstance(ids, (str, bytes)):
            raise InvalidTokenError("decode() takes a sequence of token ids, not a string")
        return self.decode_bytes(ids, skip_special).decode("utf-8", "replace")

    def stream_decoder(self, skip_special: bool = False, at_start: bool = True) -> "StreamDecoder":
        return StreamDecoder(self, skip_special=skip_special, at_start=at_start)


class StreamDecoder:
    """Incremental detokenizer: ``push(id)`` returns the newly completed text.

    Bytes of a UTF-8 character split across tokens are held back until the character is
    complete, so no piece is ever half a character; invalid sequences become U+FFFD.
    ``at_start`` says the ids begin the text (then SentencePiece's prefix space is removed
    from the first piece, as ``Tokenizer.decode`` does); pass False when continuing after
    a prompt.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False, at_start: bool = True):
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self._strip = bool(at_start and tokenizer.add_space_prefix)
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token_id: int) -> str:
        tok = self.tokenizer
        i = tok._check_id(token_id)
        if self.skip_special and tok._attrs[i] & _SKIPPABLE_ATTRS:
            return ""
        p = tok.token_to_bytes(i)
        if self._strip and p:
            if p[:1] == b" ":
                p = p[1:]
            self._strip = False
        return self._dec.decode(p)

    def push_many(self, ids: Iterable[int]) -> str:
        return "".join(self.push(i) for i in ids)

    def flush(self) -> str:
        """Ends the stream and returns what it still holds: always "", since push() returns
        every whole character at once. Bytes still held back are the start of a character
        the stream was cut inside (max_tokens, a stop): they are dropped, so a reply never
        ends in U+FFFD."""
        self._dec.reset()
        return ""

    @property
    def pending(self) -> bytes:
        """Bytes held back, waiting for the rest of their character."""
        return self._dec.getstate()[0]
