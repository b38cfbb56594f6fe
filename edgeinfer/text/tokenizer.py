"""Tokenizers built from GGUF metadata, matching llama.cpp token for token.

A ``Tokenizer`` is a vocabulary (``vocab.py``: tokens, scores, types and the special tokens)
and the algorithm ``tokenizer.ggml.model`` names, one module each:

* ``gpt2``  -- byte-level BPE (``bpe.py``), after the pre-tokenizer ``tokenizer.ggml.pre``
  names in the table of ``pretokenizers.py``;
* ``llama`` -- SentencePiece as llama.cpp runs it (``spm.py``);
* ``gemma4`` -- BPE over raw UTF-8 with spaces as ``▁`` and ``<0xXX>`` byte fallback
  (``metaspace_bpe.py``).

In all, special tokens (CONTROL / USER_DEFINED / UNKNOWN types) are cut out of the raw
text first, longest first, like llama.cpp's ``tokenizer_st_partition``.

``StreamDecoder`` turns ids into text incrementally without ever emitting half a UTF-8
character.
"""
from __future__ import annotations

import codecs
import operator
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Protocol

from ..errors import InvalidTokenError, TokenizerError
from .bpe import BPE
from .bpe import BYTE_TO_CHAR as _BYTE_TO_CHAR  # noqa: F401  (tests build byte-level vocabularies)
from .metaspace_bpe import MetaspaceBPE
from .pretokenizers import PreTokenizer
from .spm import SentencePiece
from .vocab import (
    A_BYTE,
    A_NORMAL,
    SKIPPABLE_ATTRS,
    SPECIAL_ATTRS,
    SpecialTokens,
    TokenType,
    Vocab,
    meta_bool,
)

__all__ = ["ALGORITHMS", "Algorithm", "StreamDecoder", "TokenType", "Tokenizer"]



class Algorithm(Protocol):
    """What a tokenizer model module provides (``bpe.BPE``, ``spm.SentencePiece``, ...): built from
    the vocabulary, the metadata and the special tokens, it appends the ids of partitioned
    text (raw-text fragments and special-token ids) and gives a normal token's bytes."""

    kind: ClassVar[str]                    # Tokenizer.model: "bpe", "spm"
    description: ClassVar[str]
    special_defaults: ClassVar[Mapping[str, int | None]]   # bos / eos / unk without metadata
    pre: PreTokenizer | None
    add_bos: bool                          # before tokenizer.ggml.add_bos_token
    bos_always: ClassVar[bool]             # BOS even when tokenizer.ggml.add_bos_token is false
    add_space_prefix: bool
    ignore_merges: bool
    clean_spaces: bool

    def encode(self, fragments: list[str | int], out: list[int]) -> None: ...

    def piece(self, text: str) -> bytes: ...


#: ``tokenizer.ggml.model`` -> the algorithm that turns text into ids
ALGORITHMS: Mapping[str, type[Algorithm]] = {
    "gpt2": BPE, "llama": SentencePiece, "gemma4": MetaspaceBPE}


def _clean_text(text: str) -> str:
    """Replaces lone surrogates (which UTF-8 cannot carry) with U+FFFD."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)


class Tokenizer:
    """A tokenizer read from GGUF metadata, of one of the models in ``ALGORITHMS``.

    Use ``Tokenizer.from_metadata(meta)`` with the GGUF key/value dict.
    """

    def __init__(self, meta: Mapping[str, Any], *, cache_size: int = 100_000):
        if not isinstance(meta, Mapping):
            raise TokenizerError(f"tokenizer metadata must be a mapping, got {type(meta).__name__}")
        model = meta.get("tokenizer.ggml.model")
        if model is None:
            raise TokenizerError("GGUF metadata has no 'tokenizer.ggml.model': cannot build a tokenizer")
        if not isinstance(model, str):
            raise TokenizerError(f"'tokenizer.ggml.model' must be a string, got {model!r}")
        algorithm_cls = ALGORITHMS.get(model)
        if algorithm_cls is None:
            raise TokenizerError(
                f"unknown tokenizer model {model!r} in 'tokenizer.ggml.model' (supported: "
                + ", ".join(f"{k!r} {cls.description}" for k, cls in ALGORITHMS.items()) + ")")
        self.tokenizer_model = model
        self.model = algorithm_cls.kind

        self._vocab = vocab = Vocab.from_metadata(meta)
        self.n_vocab = vocab.n
        pre = meta.get("tokenizer.ggml.pre")
        if pre is not None and not isinstance(pre, str):
            raise TokenizerError(f"'tokenizer.ggml.pre' must be a string, got {pre!r}")
        self.pre = pre

        self._special = special = SpecialTokens(vocab, meta, **algorithm_cls.special_defaults)
        self.algorithm: Algorithm = algorithm_cls(vocab, meta, special,
                                                   cache_size=max(0, int(cache_size)))
        algorithm = self.algorithm
        self.pre_family = algorithm.pre.family if algorithm.pre is not None else None
        self.ignore_merges = algorithm.ignore_merges
        self.clean_spaces = algorithm.clean_spaces
        self.add_space_prefix = algorithm.add_space_prefix
        self.add_bos = (algorithm.bos_always
                        or meta_bool(meta, "tokenizer.ggml.add_bos_token", algorithm.add_bos))
        self.add_eos = meta_bool(meta, "tokenizer.ggml.add_eos_token", False)

        self.bos_id = special.bos
        self.eos_id = special.eos
        self.unk_id = special.unk
        self.sep_id = special.sep
        self.pad_id = special.pad
        self.eot_id = special.eot
        self.eom_id = special.eom
        self.eog_ids: frozenset[int] = special.eog
        # fill-in-the-middle markers (None where the vocabulary has none)
        self.fim_pre_id, self.fim_suf_id, self.fim_mid_id = special.fim_pre, special.fim_suf, special.fim_mid
        self.fim_rep_id, self.fim_sep_id = special.fim_rep, special.fim_sep
        self._attrs = vocab.attrs     # llama.cpp's attribute flags (the constraint reads them)
        self._pieces: list[bytes | None] = [None] * vocab.n

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], **kwargs: Any) -> Tokenizer:
        """Builds the tokenizer from a GGUF metadata dict (``tokenizer.ggml.*`` keys)."""
        return cls(meta, **kwargs)

    @classmethod
    def from_gguf(cls, path: Any, **kwargs: Any) -> Tokenizer:
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
    # public properties
    # -----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.n_vocab

    def __repr__(self) -> str:
        return (f"Tokenizer(model={self.tokenizer_model!r}, pre={self.pre!r}, n_vocab={self.n_vocab}, "
                f"bos={self.bos_id}, eos={self.eos_id}, eot={self.eot_id})")

    def _check_id(self, token_id: Any) -> int:
        return self._vocab.check_id(token_id)

    def token_text(self, token_id: int) -> str:
        """The token's string as stored in the vocabulary (byte-level alphabet for BPE)."""
        return self._vocab.tokens[self._check_id(token_id)]

    def token_type(self, token_id: int) -> int:
        """The token's llama.cpp attribute flags mapped back to a GGUF TokenType value."""
        return self._vocab.token_type(self._check_id(token_id))

    def token_id(self, text: str) -> int | None:
        """The id of the token whose vocabulary string is exactly ``text``, or None."""
        return self._vocab.ids.get(text)

    def is_special(self, token_id: int) -> bool:
        """True for control, user-defined and unknown tokens (matched whole in raw text)."""
        return bool(self._attrs[self._check_id(token_id)] & SPECIAL_ATTRS)

    def is_control(self, token_id: int) -> bool:
        """True for control / unknown tokens: the ones ``decode(skip_special=True)`` drops."""
        return bool(self._attrs[self._check_id(token_id)] & SKIPPABLE_ATTRS)

    def is_eog(self, token_id: int) -> bool:
        """True when generating this token ends generation (eos, eot, <|im_end|>, ...)."""
        return operator.index(token_id) in self.eog_ids

    @property
    def special_ids(self) -> list[int]:
        return list(self._special.ids)

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
        if text:
            self.algorithm.encode(self._special.partition(text, parse_special), out)
        if add_special and self.add_eos:
            if self.eos_id is None:
                raise TokenizerError("the model asks for an EOS token but its vocabulary has none")
            out.append(self.eos_id)
        return out

    def __call__(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.encode(text, add_special=add_special, parse_special=parse_special)

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
        text = self._vocab.tokens[i]
        if a & SPECIAL_ATTRS:
            return text.encode("utf-8", "surrogateescape")
        if a & A_NORMAL:
            return self.algorithm.piece(text)
        if a & A_BYTE:
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
            if skip_special and attrs[i] & SKIPPABLE_ATTRS:
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

    def stream_decoder(self, skip_special: bool = False, at_start: bool = True) -> StreamDecoder:
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
        if self.skip_special and tok._attrs[i] & SKIPPABLE_ATTRS:
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
