"""SentencePiece as llama.cpp runs it (``tokenizer.ggml.model = llama``): spaces become ``▁``
(with a leading one when ``add_space_prefix``), characters are merged by token score, and
characters no token covers fall back to ``<0xXX>`` byte tokens."""
from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Any, ClassVar

from ..errors import TokenizerError
from .vocab import SpecialTokens, Vocab, meta_bool

__all__ = ["SentencePiece"]

_SPACE = "\u2581"  # ▁


class SentencePiece:
    """SentencePiece merging by score over a vocabulary."""

    kind = "spm"
    description = "SentencePiece"
    #: BOS / EOS / UNK ids when the metadata names none (llama.cpp's)
    special_defaults: ClassVar[Mapping[str, int | None]] = {"bos": 1, "eos": 2, "unk": 0}
    add_space_prefix = True
    add_bos = True
    bos_always = False
    ignore_merges = False
    clean_spaces = False
    pre = None

    def __init__(self, vocab: Vocab, meta: Mapping[str, Any], specials: SpecialTokens, *,
                 cache_size: int):
        self._ids = vocab.ids
        self._scores = vocab.scores if vocab.scores is not None else [0.0] * vocab.n
        self._unk = specials.unk
        self.add_space_prefix = meta_bool(meta, "tokenizer.ggml.add_space_prefix", True)

    def encode(self, fragments: list[str | int], out: list[int]) -> None:
        """Appends the ids of raw-text fragments and special-token ids to ``out``; text at the
        start and after a special token gets the prefix space."""
        prev_special = True
        for frag in fragments:
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
            else:
                if self.add_space_prefix and prev_special:
                    frag = " " + frag
                self.encode_text(frag.replace(" ", _SPACE), out)
                prev_special = False

    def encode_text(self, text: str, out: list[int]) -> None:
        vocab, scores = self._ids, self._scores
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
        i = self._ids.get(f"<0x{b:02X}>")
        if i is None and b < 0x80:
            i = self._ids.get(chr(b))
        if i is None:
            if self._unk is not None:
                return self._unk
            raise TokenizerError(
                f"SentencePiece vocabulary has no byte token <0x{b:02X}> and no unknown token")
        return i

    @staticmethod
    def piece(text: str) -> bytes:
        """The bytes of a normal token: ``▁`` is a space."""
        return text.replace(_SPACE, " ").encode("utf-8", "surrogateescape")
