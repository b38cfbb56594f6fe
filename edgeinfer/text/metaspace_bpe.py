"""Metaspace BPE (``tokenizer.ggml.model = gemma4``): BPE merges by rank over raw UTF-8
characters, with every space written as ``▁`` and ``<0xXX>`` byte tokens for what no token
covers. The text is cut into lines and runs of newlines only; a run of newlines that is a
token is taken whole."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from .bpe import BPE
from .pretokenizers import METASPACE_PRE, PreTokenizer
from .spm import SentencePiece
from .vocab import SpecialTokens, Vocab

__all__ = ["MetaspaceBPE"]

_SPACE = "\u2581"  # ▁


class MetaspaceBPE(BPE):
    """Gemma 4's tokenizer: BPE's merge loop over characters instead of byte-alphabet bytes."""

    kind = "bpe"
    description = "metaspace BPE with byte fallback"
    #: llama.cpp reads BOS / EOS / UNK from the metadata only
    special_defaults: ClassVar[Mapping[str, int | None]] = {"bos": None, "eos": None, "unk": None}
    #: llama.cpp adds BOS for Gemma 4 even when the metadata says not to
    bos_always = True

    def __init__(self, vocab: Vocab, meta: Mapping[str, Any], specials: SpecialTokens, *,
                 cache_size: int):
        super().__init__(vocab, meta, specials, cache_size=cache_size)
        self._byte_ids = [vocab.ids.get(f"<0x{b:02X}>") for b in range(256)]

    @staticmethod
    def pre_tokenizer(meta: Mapping[str, Any]) -> PreTokenizer:
        return METASPACE_PRE              # whatever tokenizer.ggml.pre says, as in llama.cpp

    def encode_text(self, text: str, out: list[int]) -> None:
        super().encode_text(text.replace(" ", _SPACE), out)

    def word_ids(self, word: str) -> list[int]:
        vocab = self._ids
        if word[0] == "\n":               # a run of newlines
            i = vocab.get(word)
            if i is not None:
                return [i]
        ids: list[int] = []
        for s in self.merge(word):
            i = vocab.get(s)
            if i is not None:
                ids.append(i)
                continue
            for b in s.encode("utf-8", "surrogateescape"):
                j = self._byte_ids[b]
                if j is not None:
                    ids.append(j)
        return ids

    piece = staticmethod(SentencePiece.piece)
