"""The vocabulary from GGUF metadata: token texts, scores, types (as llama.cpp's attribute
flags) and the special tokens: BOS / EOS / EOT / ..., the end-of-generation set, and the cut
of special tokens out of raw text (llama.cpp's ``tokenizer_st_partition``)."""
from __future__ import annotations

import logging
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import InvalidTokenError, TokenizerError
from .pretokenizers import strip_quirk

__all__ = ["SpecialTokens", "TokenType", "Vocab"]

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
A_UNKNOWN = 1 << 0
A_UNUSED = 1 << 1
A_NORMAL = 1 << 2
A_CONTROL = 1 << 3
A_USER_DEFINED = 1 << 4
A_BYTE = 1 << 5
A_LSTRIP = 1 << 7
A_RSTRIP = 1 << 8

_TYPE_TO_ATTR = {
    TokenType.UNDEFINED: 0,
    TokenType.NORMAL: A_NORMAL,
    TokenType.UNKNOWN: A_UNKNOWN,
    TokenType.CONTROL: A_CONTROL,
    TokenType.USER_DEFINED: A_USER_DEFINED,
    TokenType.UNUSED: A_UNUSED,
    TokenType.BYTE: A_BYTE,
}
# attribute -> type, in the order token_type() reports them
_ATTR_TO_TYPE = ((A_CONTROL, TokenType.CONTROL), (A_USER_DEFINED, TokenType.USER_DEFINED),
                 (A_UNKNOWN, TokenType.UNKNOWN), (A_BYTE, TokenType.BYTE),
                 (A_UNUSED, TokenType.UNUSED), (A_NORMAL, TokenType.NORMAL))

SPECIAL_ATTRS = A_CONTROL | A_USER_DEFINED | A_UNKNOWN   # matched whole in raw text
SKIPPABLE_ATTRS = A_CONTROL | A_UNKNOWN                  # what decode(skip_special=True) drops

# texts llama.cpp uses to find EOT / EOM / FIM tokens and end-of-generation tokens
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
              "<end_of_utterance>")
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_PRE_TEXTS = ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                  "<|code_prefix|>", "<|prefix|>")
_FIM_SUF_TEXTS = ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                  "<|code_suffix|>", "<|suffix|>")
_FIM_MID_TEXTS = ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                  "<|code_middle|>", "<|middle|>")
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)
_EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
))
_STRIPPED = " \t\n\v\f\r"


# ---------------------------------------------------------------------------------------------
# metadata values
# ---------------------------------------------------------------------------------------------
def meta_list(value: Any, key: str) -> list:
    if value is None:
        return []
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TokenizerError(f"metadata '{key}' must be an array, got {type(value).__name__}")
    return list(value)


def meta_bool(meta: Mapping[str, Any], key: str, default: bool) -> bool:
    if key not in meta:
        return default
    value = meta[key]
    if isinstance(value, (bool, int)) or type(value).__name__ == "bool_":
        return bool(value)
    raise TokenizerError(f"metadata '{key}' must be a bool, got {value!r}")


def meta_text(value: Any, key: str, index: int) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "surrogateescape")
    raise TokenizerError(f"metadata '{key}'[{index}] must be a string, got {type(value).__name__}")


# ---------------------------------------------------------------------------------------------
class Vocab:
    """Token texts, scores (None when the file has none) and attribute flags, and text -> id."""

    def __init__(self, tokens: list[str], scores: list[float] | None, attrs: list[int]):
        self.tokens = tokens
        self.scores = scores
        self.attrs = attrs
        self.n = len(tokens)
        # the last duplicate wins, like llama.cpp's token_to_id map
        self.ids: dict[str, int] = dict(zip(tokens, range(self.n)))

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> Vocab:
        raw = meta.get("tokenizer.ggml.tokens")
        if raw is None:
            raise TokenizerError("GGUF metadata has no 'tokenizer.ggml.tokens': the vocabulary is missing")
        raw = meta_list(raw, "tokenizer.ggml.tokens")
        n = len(raw)
        if n == 0:
            raise TokenizerError("'tokenizer.ggml.tokens' is empty: the vocabulary is missing")
        tokens = [meta_text(t, "tokenizer.ggml.tokens", i) or f"[EMPTY_{i}]"  # as llama.cpp
                  for i, t in enumerate(raw)]

        scores = meta.get("tokenizer.ggml.scores")
        if scores is not None:
            scores = meta_list(scores, "tokenizer.ggml.scores")
            if len(scores) < n:
                raise TokenizerError(f"'tokenizer.ggml.scores' has {len(scores)} entries for {n} tokens")
            try:
                scores = [float(s) for s in scores[:n]]
            except (TypeError, ValueError):
                raise TokenizerError("'tokenizer.ggml.scores' must hold numbers") from None

        types = meta.get("tokenizer.ggml.token_type")
        if types is None:
            attrs = [A_NORMAL] * n
        else:
            types = meta_list(types, "tokenizer.ggml.token_type")
            if len(types) < n:
                raise TokenizerError(
                    f"'tokenizer.ggml.token_type' has {len(types)} entries for {n} tokens")
            try:
                attrs = [_TYPE_TO_ATTR.get(int(t), 0) for t in types[:n]]
            except (TypeError, ValueError):
                raise TokenizerError("'tokenizer.ggml.token_type' must hold integers") from None
        return cls(tokens, scores, attrs)

    def check_id(self, token_id: Any) -> int:
        try:
            i = operator.index(token_id)
        except TypeError:
            raise InvalidTokenError(
                f"token id must be an integer, got {token_id!r} (vocabulary of {self.n} tokens)"
            ) from None
        if not (0 <= i < self.n):
            raise InvalidTokenError(
                f"token id {i} is out of range: the vocabulary has {self.n} tokens "
                f"(valid ids 0..{self.n - 1})")
        return i

    def token_type(self, i: int) -> int:
        a = self.attrs[i]
        return next((t for flag, t in _ATTR_TO_TYPE if a & flag), TokenType.UNDEFINED)


# ---------------------------------------------------------------------------------------------
class SpecialTokens:
    """The vocabulary's special tokens, resolved as llama.cpp's ``llama_vocab::load`` does.

    Resolving sets attributes on the vocabulary the way llama.cpp does: tokens found by text as
    EOT / EOM / FIM / end-of-generation become CONTROL, and the strip quirks of the
    pre-tokenizer table apply.
    """

    def __init__(self, vocab: Vocab, meta: Mapping[str, Any], *, bos: int | None,
                 eos: int | None, unk: int | None):
        """``bos`` / ``eos`` / ``unk``: the tokenizer model's defaults, used when the metadata
        names none."""
        self.vocab = vocab
        n = vocab.n

        # out-of-range values are ignored with a warning, as llama.cpp does
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

        self.bos = special("tokenizer.ggml.bos_token_id", bos)
        self.eos = special("tokenizer.ggml.eos_token_id", eos)
        self.unk = special("tokenizer.ggml.unknown_token_id", unk)
        self.sep = special("tokenizer.ggml.seperator_token_id", None)
        self.pad = special("tokenizer.ggml.padding_token_id", None)
        eot = special("tokenizer.ggml.eot_token_id", None)
        eom = special("tokenizer.ggml.eom_token_id", None)
        # the older prefix / suffix / middle keys win where both are present, as in llama.cpp
        fim_pre = special("tokenizer.ggml.prefix_token_id", special("tokenizer.ggml.fim_pre_token_id", None))
        fim_suf = special("tokenizer.ggml.suffix_token_id", special("tokenizer.ggml.fim_suf_token_id", None))
        fim_mid = special("tokenizer.ggml.middle_token_id", special("tokenizer.ggml.fim_mid_token_id", None))
        fim_pad = special("tokenizer.ggml.fim_pad_token_id", None)
        fim_rep = special("tokenizer.ggml.fim_rep_token_id", None)
        fim_sep = special("tokenizer.ggml.fim_sep_token_id", None)

        attrs, ids = vocab.attrs, vocab.ids

        def by_text(given: int | None, texts: Iterable[str]) -> int | None:
            if given is not None:
                return given
            for t in texts:
                i = ids.get(t)
                if i is not None:
                    attrs[i] |= A_CONTROL
                    return i
            return None

        self.eot = by_text(eot, _EOT_TEXTS)
        self.eom = by_text(eom, _EOM_TEXTS)
        # fill-in-the-middle: prefix, suffix and middle markers, and the repo-level ones
        self.fim_pre = by_text(fim_pre, _FIM_PRE_TEXTS)
        self.fim_suf = by_text(fim_suf, _FIM_SUF_TEXTS)
        self.fim_mid = by_text(fim_mid, _FIM_MID_TEXTS)
        self.fim_pad = by_text(fim_pad, _FIM_PAD_TEXTS)
        self.fim_rep = by_text(fim_rep, _FIM_REP_TEXTS)
        self.fim_sep = by_text(fim_sep, _FIM_SEP_TEXTS)

        eog: set[int] = {i for i in (self.fim_pad, self.fim_rep, self.fim_sep) if i is not None}
        for t in _EOG_TEXTS:
            i = ids.get(t)
            if i is not None:
                eog.add(i)
                attrs[i] |= A_CONTROL
        eog.update(i for i in (self.eos, self.eot, self.eom) if i is not None)
        # gpt-oss / solar-open: '<|end|>' is not an end of generation there
        texts = {vocab.tokens[i]: i for i in eog}
        if "<|end|>" in texts and (("<|return|>" in texts and "<|call|>" in texts)
                                   or ("<|calls|>" in texts and "<|flush|>" in texts)):
            end = texts["<|end|>"]
            eog.discard(end)
            attrs[end] = A_USER_DEFINED
        if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
            s = texts["</s>"]
            eog.discard(s)
            attrs[s] = A_NORMAL
        self.eog: frozenset[int] = frozenset(eog)

        quirk = strip_quirk(meta)
        if quirk is not None:
            if quirk.rstrip_specials:
                for i, a in enumerate(attrs):
                    if a & SPECIAL_ATTRS:
                        attrs[i] = a | A_RSTRIP
            for texts_, on in ((quirk.rstrip, True), (quirk.no_rstrip, False)):
                for t in texts_:
                    i = ids.get(t)
                    if i is not None:
                        attrs[i] = (attrs[i] | A_RSTRIP) if on else (attrs[i] & ~A_RSTRIP)

        # special tokens are cut out of the raw text longest first
        order = [i for i, a in enumerate(attrs) if a & SPECIAL_ATTRS]
        order.sort(key=lambda i: -len(vocab.tokens[i].encode("utf-8", "surrogateescape")))
        self.ids: list[int] = order

    def partition(self, text: str, parse_special: bool) -> list[str | int]:
        """The text as pieces of raw text and special-token ids (llama.cpp's
        tokenizer_st_partition); without ``parse_special`` only user-defined tokens are cut."""
        frags: list[str | int] = [text]
        tokens, attrs = self.vocab.tokens, self.vocab.attrs
        for sid in self.ids:
            a = attrs[sid]
            if not parse_special and (a & SKIPPABLE_ATTRS):
                continue
            t = tokens[sid]
            if not any(isinstance(f, str) and t in f for f in frags):
                continue
            new: list[str | int] = []
            for f in frags:
                if isinstance(f, int) or t not in f:
                    new.append(f)
                    continue
                parts = f.split(t)
                for k, p in enumerate(parts):
                    if k > 0:
                        new.append(sid)
                    if a & A_LSTRIP and k + 1 < len(parts):
                        p = p.rstrip(_STRIPPED)
                    if a & A_RSTRIP and k > 0:
                        p = p.lstrip(_STRIPPED)
                    if p:
                        new.append(p)
            frags = new
        return frags
