"""Byte-level BPE (``tokenizer.ggml.model = gpt2``): the text is split by the pre-tokenizer of
``tokenizer.ggml.pre`` (see ``pretokenizers.py``), every piece is mapped to GPT-2's byte
alphabet and merged by merge rank."""
from __future__ import annotations

import heapq
import logging
from collections.abc import Mapping
from typing import Any, ClassVar

from ..errors import TokenizerError
from .pretokenizers import DEFAULT_PRE, FALLBACK_PRE, PRE_TOKENIZERS, PreTokenizer
from .vocab import SpecialTokens, Vocab, meta_bool, meta_list, meta_text

__all__ = ["BPE", "BYTE_TO_CHAR"]

log = logging.getLogger(__name__)


def _gpt2_byte_alphabet() -> list[str]:
    """Every byte gets a printable code point: printable Latin-1 bytes keep their own, the
    others are moved to U+0100 upwards in byte order."""
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


BYTE_TO_CHAR: list[str] = _gpt2_byte_alphabet()
_CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
# str.translate table for latin-1-decoded UTF-8 bytes -> GPT-2 alphabet
_LATIN1_TO_GPT2 = {b: c for b, c in enumerate(BYTE_TO_CHAR)}

_MAX_CACHED_WORD = 256


def pre_tokenizer(pre: str | None) -> PreTokenizer:
    """The table entry for ``tokenizer.ggml.pre`` (llama.cpp's fallbacks when it is missing
    or unknown)."""
    if not pre:
        log.warning("tokenizer.ggml.pre is missing: using llama.cpp's 'default' pre-tokenizer")
        return PRE_TOKENIZERS[DEFAULT_PRE]
    entry = PRE_TOKENIZERS.get(pre)
    if entry is None:
        log.warning("unknown pre-tokenizer %r: falling back to the gpt-2 regex", pre)
        return PRE_TOKENIZERS[FALLBACK_PRE]
    return entry


class BPE:
    """Byte-level BPE over a vocabulary, with a bounded cache of the ids of each word."""

    kind = "bpe"
    description = "byte-level BPE"
    bos_always = False
    #: BOS / EOS / UNK ids when the metadata names none (llama.cpp's)
    special_defaults: ClassVar[Mapping[str, int | None]] = {"bos": 11, "eos": 11, "unk": None}

    def __init__(self, vocab: Vocab, meta: Mapping[str, Any], specials: SpecialTokens, *,
                 cache_size: int):
        merges = meta.get("tokenizer.ggml.merges")
        if merges is None:
            raise TokenizerError("BPE tokenizer without 'tokenizer.ggml.merges' in the GGUF metadata")
        merges = meta_list(merges, "tokenizer.ggml.merges")
        ranks: dict[str, int] = {}
        for i, m in enumerate(merges):
            m = meta_text(m, "tokenizer.ggml.merges", i)
            if m.find(" ", 1) < 0:
                raise TokenizerError(f"'tokenizer.ggml.merges'[{i}] = {m!r} is not a 'left right' pair")
            if m not in ranks:  # the first occurrence keeps its rank
                ranks[m] = i
        self._ranks = ranks
        self._ids = vocab.ids
        # a merge lookup "l r" is only the pair (l, r) if l has no space after its 1st char
        self._spaces_in_tokens = any(" " in t[1:] for t in vocab.tokens)

        self.pre = self.pre_tokenizer(meta)
        self._split = self.pre.splitter.split
        self.ignore_merges = self.pre.ignore_merges
        self.add_bos = self.pre.add_bos
        self.clean_spaces = self.pre.clean_spaces
        self.add_space_prefix = meta_bool(meta, "tokenizer.ggml.add_space_prefix", False)

        self._cache_size = max(0, int(cache_size))
        self._cache: dict[str, list[int]] = {}

    @staticmethod
    def pre_tokenizer(meta: Mapping[str, Any]) -> PreTokenizer:
        return pre_tokenizer(meta.get("tokenizer.ggml.pre"))

    def encode(self, fragments: list[str | int], out: list[int]) -> None:
        """Appends the ids of raw-text fragments and special-token ids to ``out``."""
        for frag in fragments:
            if isinstance(frag, int):
                out.append(frag)
            else:
                self.encode_text(frag, out)

    def encode_text(self, text: str, out: list[int]) -> None:
        cache = self._cache
        for word in self._split(text):
            ids = cache.get(word)
            if ids is None:
                ids = self.word_ids(word)
                if self._cache_size and len(word) <= _MAX_CACHED_WORD:
                    if len(cache) >= self._cache_size:
                        try:
                            del cache[next(iter(cache))]
                        except (StopIteration, KeyError, RuntimeError):
                            pass
                    cache[word] = ids
            out.extend(ids)

    def word_ids(self, word: str) -> list[int]:
        """The ids of one pre-tokenized word: its bytes in the byte alphabet, merged."""
        vocab = self._ids
        enc = word.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_GPT2)
        if self.ignore_merges:
            i = vocab.get(enc)
            if i is not None:
                return [i]
        ids: list[int] = []
        for s in self.merge(enc):
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

    def merge(self, enc: str) -> list[str]:
        """The merge loop: the characters of ``enc`` merged by rank, lowest first; the merged
        symbols in order."""
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
        return [s for s in syms if s]

    @staticmethod
    def piece(text: str) -> bytes:
        """The bytes of a normal token, written in the byte alphabet."""
        out = bytearray()
        for c in text:
            b = _CHAR_TO_BYTE.get(c)
            if b is not None:
                out.append(b)
            else:  # llama.cpp's marker for characters outside the byte alphabet
                u = c.encode("utf-8", "surrogateescape")
                out += b"[UNK_BYTE_0x" + u.hex().encode() + text.encode("utf-8", "surrogateescape") + b"]"
        return bytes(out)
