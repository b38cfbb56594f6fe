"""Constrained decoding: a grammar per sequence masks the tokens it cannot take next.

The grammar engine is llguidance (docs/structured-output.md says why): a request's
``response_format`` / JSON Schema / regex / Lark or GBNF grammar becomes a `GrammarSpec`
(validated up front, so a bad schema is a 400, not a failed step); each sequence holds one
`Constraint` (an ``LLMatcher``) that computes a bitmask of allowed ids for the next token.

The masks of a step are computed while the native forward runs: `MaskJob.start` hands every
constrained sequence of the step to one worker thread before ``runner.run``; llguidance
computes them with the GIL released, so they overlap the forward (which releases it too);
`MaskJob.wait` joins before sampling.
"""
from __future__ import annotations

import json
import re
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np

from ..errors import SamplingParamsError

if TYPE_CHECKING:  # pragma: no cover
    from ..text.tokenizer import Tokenizer

__all__ = ["ConstraintError", "GrammarSpec", "Constraint", "MaskJob", "grammar_spec",
           "check_logit_bias", "ll_tokenizer", "tight_schema", "JSON_STYLE"]

_ATTR_SPECIAL_MASK = (1 << 3) | (1 << 4)   # control | user-defined (tokenizer.py's attributes)


class ConstraintError(SamplingParamsError):
    """A response_format / schema / grammar that cannot be used (HTTP 400)."""


def _ll():
    import llguidance
    return llguidance


# --------------------------------------------------------------------------- vocabulary

_VOCABS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_VOCAB_LOCK = threading.Lock()


class _Wrapper:
    """What llguidance's TokenizerWrapper reads from a tokenizer: every token's bytes (control
    tokens marked with a leading 0xFF so no text ever matches them), the EOS id, and encode."""

    def __init__(self, tok: "Tokenizer"):
        self.eos_token_id = tok.eos_id if tok.eos_id is not None else min(tok.eog_ids, default=0)
        self.bos_token_id = tok.bos_id
        attrs = tok._attrs
        self.tokens = [(b"\xff" + tok.token_to_bytes(i)) if attrs[i] & _ATTR_SPECIAL_MASK
                       else tok.token_to_bytes(i) for i in range(len(tok))]
        self.special_token_ids = [i for i in range(len(tok)) if attrs[i] & _ATTR_SPECIAL_MASK]
        self._tok = tok

    def __call__(self, s: str | bytes) -> list[int]:
        if isinstance(s, bytes):
            s = s.decode("utf-8", "replace")
        return self._tok.encode(s, add_special=False, parse_special=False)


def ll_tokenizer(tok: "Tokenizer"):
    """The llguidance tokenizer of one of ours (built once per tokenizer: ~0.1-1 s)."""
    with _VOCAB_LOCK:
        lt = _VOCABS.get(tok)
        if lt is None:
            ll = _ll()
            eog = sorted(tok.eog_ids) or [_Wrapper(tok).eos_token_id]
            lt = ll.LLTokenizer(ll.TokenizerWrapper(_Wrapper(tok)), eos_token=eog)
            _VOCABS[tok] = lt
        return lt


# --------------------------------------------------------------------------- specs

@dataclass(frozen=True)
class GrammarSpec:
    """A validated llguidance grammar (its JSON text) and what it came from ("json_object",
    "json_schema", "regex", "lark", "gbnf", "tool_call": a forced call's Lark grammar)."""
    kind: str
    grammar: str

    def for_tokenizer(self, tok: "Tokenizer") -> str:
        """The grammar for `tok`. A forced tool call's Lark grammar (kind "tool_call") spells its
        call markers as text in rules mk0, mk1, ...: each becomes the vocabulary's special token
        where it has one (a model writes the marker as that token; text cannot spell it)."""
        if self.kind != "tool_call":
            return self.grammar

        def token(m: "re.Match") -> str:
            ids = tok.encode(json.loads(m.group(2)), add_special=False, parse_special=True)
            special = len(ids) == 1 and tok._attrs[ids[0]] & _ATTR_SPECIAL_MASK
            return f"{m.group(1)}: <[{ids[0]}]>" if special else m.group(0)

        return _MARKER_RULE.sub(token, self.grammar)

    def __repr__(self) -> str:
        return f"GrammarSpec({self.kind}, {len(self.grammar)} chars)"


_MARKER_RULE = re.compile(r'^(mk[0-9]+): ("[^\n]*")$', re.M)


# JSON output as the model writes it: no indentation, ", " / ": " separators; no whitespace
# after the value, so the grammar ends with the last brace.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


# What llama.cpp's grammars do with what a schema leaves open, so that a small model cannot
# run on until max_tokens (at temperature 1 it does): an object that lists its properties
# takes no others unless it says so (`additionalProperties` missing means false; OpenAI's
# strict mode requires it anyway), and a number without a bound gets at most 16 integral
# digits. Outputs still validate against the schema as given.
_MAX_INT = 10**16 - 1
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_ONE = ("items", "additionalProperties", "additionalItems", "not", "if", "then", "else",
               "contains", "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")


def tight_schema(schema: Any) -> Any:
    """A copy of a JSON Schema with closed objects and bounded numbers where it leaves them
    open (sub-schemas included; enum / const / default values untouched)."""
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    types = out.get("type")
    types = types if isinstance(types, list) else [types]
    if "integer" in types or "number" in types:
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -_MAX_INT
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = _MAX_INT
    props = out.get("properties")
    if isinstance(props, Mapping) and set(out.get("required") or ()) <= set(props) and not any(
            k in out for k in ("additionalProperties", "patternProperties", "unevaluatedProperties")):
        out["additionalProperties"] = False
    for k in _SCHEMA_MAPS:
        if isinstance(out.get(k), Mapping):
            out[k] = {name: tight_schema(v) for name, v in out[k].items()}
    for k in _SCHEMA_ONE:
        if isinstance(out.get(k), Mapping):
            out[k] = tight_schema(out[k])
    for k in _SCHEMA_LISTS:
        if isinstance(out.get(k), list):
            out[k] = [tight_schema(v) for v in out[k]]
    return out


def _validated(kind: str, grammar: str) -> GrammarSpec:
    ll = _ll()
    is_error, msgs = ll.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ConstraintError(f"invalid {kind.replace('_', ' ')}: {msgs[0] if msgs else 'rejected'}")
    return GrammarSpec(kind, grammar)


def _schema_grammar(schema: Any, what: str) -> GrammarSpec:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise ConstraintError(f"{what} is not valid JSON: {e}") from None
    if not isinstance(schema, (dict, bool)):
        raise ConstraintError(f"{what} must be a JSON object, got {type(schema).__name__}")
    try:
        g = _ll().LLMatcher.grammar_from_json_schema(tight_schema(schema), overrides=JSON_STYLE)
    except (ValueError, TypeError) as e:
        raise ConstraintError(f"invalid {what}: {e}") from None
    return _validated("json_schema", g)


def json_schema_spec(schema: Any) -> GrammarSpec:
    return _schema_grammar(schema, "JSON schema")


def grammar_spec(response_format: Any = None, json_schema: Any = None, grammar: Any = None,
                 regex: str | None = None) -> GrammarSpec | None:
    """The one constraint these arguments ask for, or None. ConstraintError names what is wrong.

    response_format: OpenAI's ``{"type": "text" | "json_object" | "json_schema",
    "json_schema": {"name":..., "schema": {...}, "strict":...}}`` (a pydantic model's
    ``model_json_schema()`` as schema works). json_schema: a schema (dict or JSON text).
    grammar: Lark text, GBNF text, or ``{"type": "lark"|"gbnf"|"regex", "grammar": text}``.
    regex: a regular expression the whole output matches.
    """
    if isinstance(grammar, GrammarSpec) and response_format is json_schema is regex is None:
        return grammar    # built already (a forced tool call's)
    given = [n for n, v in (("response_format", response_format), ("json_schema", json_schema),
                            ("grammar", grammar), ("regex", regex)) if v is not None]
    if response_format is not None and _rf_type(response_format) == "text":
        given.remove("response_format")
        response_format = None
    if len(given) > 1:
        raise ConstraintError(f"give at most one of {', '.join(given)}")
    if response_format is not None:
        t = _rf_type(response_format)
        if t == "json_object":
            return _schema_grammar({"type": "object"}, "json_object")
        if t == "json_schema":
            js = response_format.get("json_schema")
            if not isinstance(js, Mapping):
                raise ConstraintError("response_format of type json_schema needs a 'json_schema' object")
            if "schema" not in js:
                raise ConstraintError("response_format.json_schema needs a 'schema'")
            return _schema_grammar(js["schema"], "response_format.json_schema.schema")
        raise ConstraintError(f"response_format.type must be 'text', 'json_object' or 'json_schema', got {t!r}")
    if json_schema is not None:
        return _schema_grammar(json_schema, "JSON schema")
    if regex is not None:
        if not isinstance(regex, str):
            raise ConstraintError(f"regex must be a string, got {type(regex).__name__}")
        return _validated("regex", _ll().LLMatcher.grammar_from_regex(regex))
    if grammar is not None:
        kind, text = "auto", grammar
        if isinstance(grammar, Mapping):
            kind, text = grammar.get("type", "auto"), grammar.get("grammar")
        if not isinstance(text, str) or not text.strip():
            raise ConstraintError("grammar must be a non-empty string (Lark or GBNF)")
        if kind == "regex":
            return _validated("regex", _ll().LLMatcher.grammar_from_regex(text))
        if kind == "auto":   # GBNF rules are written "name ::= ..."
            kind = "gbnf" if "::=" in text else "lark"
        if kind not in ("lark", "gbnf"):
            raise ConstraintError(f"grammar type must be 'lark', 'gbnf' or 'regex', got {kind!r}")
        from llguidance import grammar_from
        try:
            g = grammar_from(kind, text)
        except ValueError as e:
            raise ConstraintError(f"invalid {kind} grammar: {e}") from None
        return _validated(kind, g)
    return None


def _rf_type(rf: Any) -> Any:
    if not isinstance(rf, Mapping):
        raise ConstraintError(f"response_format must be an object with a 'type', got {rf!r}")
    return rf.get("type")


def check_logit_bias(bias: Any, n_vocab: int) -> dict[int, float] | None:
    """OpenAI's logit_bias: token id (int or its decimal string) -> bias in [-100, 100]."""
    if bias is None:
        return None
    if not isinstance(bias, Mapping):
        raise SamplingParamsError(f"logit_bias must map token ids to numbers, got {bias!r}")
    out: dict[int, float] = {}
    for k, v in bias.items():
        try:
            i = int(k)
        except (TypeError, ValueError):
            raise SamplingParamsError(f"logit_bias key {k!r} is not a token id") from None
        if isinstance(k, bool) or not 0 <= i < n_vocab:
            raise SamplingParamsError(f"logit_bias token id {k!r} is outside the vocabulary [0, {n_vocab})")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise SamplingParamsError(f"logit_bias value for {k!r} must be a number in [-100, 100], got {v!r}")
        out[i] = float(v)
    return out


# --------------------------------------------------------------------------- per sequence

class Constraint:
    """One sequence's grammar state: `fill_mask()` (any thread, GIL released), `allowed(n)`,
    `consume(tok)`; `done` once the grammar cannot go on (the output is complete)."""

    def __init__(self, spec: GrammarSpec, tokenizer: "Tokenizer"):
        ll = _ll()
        self.spec = spec
        self.lltok = ll_tokenizer(tokenizer)
        self.matcher = ll.LLMatcher(self.lltok, spec.for_tokenizer(tokenizer), log_level=0)
        if self.matcher.is_error():
            raise ConstraintError(f"invalid {spec.kind}: {self.matcher.get_error()}")
        self.n_words = self.lltok.vocab_size
        self.mask = np.zeros((self.n_words + 31) // 32, dtype=np.int32)
        self.fresh = False      # the mask matches the matcher's state

    def fill_mask(self) -> None:
        m = self.mask
        self.matcher.unsafe_compute_mask_ptr(m.ctypes.data, m.nbytes)
        self.fresh = True

    def allowed(self, n: int) -> np.ndarray:
        """Bool [n]: the ids allowed next (ids past the tokenizer's vocabulary never are)."""
        if not self.fresh:
            self.fill_mask()
        bits = np.unpackbits(self.mask.view(np.uint8), bitorder="little").view(bool)
        if bits.shape[0] >= n:
            return bits[:n]
        return np.concatenate([bits, np.zeros(n - bits.shape[0], dtype=bool)])

    def consume(self, tok: int) -> bool:
        self.fresh = False
        return self.matcher.consume_token(tok)

    @property
    def done(self) -> bool:
        """The grammar is complete and admits nothing more (only the end of sequence)."""
        return self.matcher.is_stopped()

    @property
    def accepting(self) -> bool:
        return self.matcher.is_accepting()

    @property
    def error(self) -> str:
        return self.matcher.get_error()


# --------------------------------------------------------------------------- overlap

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgeinfer-mask")
        return _POOL


def _fill_all(cs: list[Constraint]) -> None:
    for c in cs:
        c.fill_mask()


class MaskJob:
    """The masks of one step, computed on a worker thread while the forward runs."""

    __slots__ = ("_future",)

    def __init__(self, future: Future | None):
        self._future = future

    @classmethod
    def start(cls, constraints: Iterable[Constraint | None]) -> "MaskJob":
        cs = [c for c in constraints if c is not None and not c.fresh]
        if not cs:
            return cls(None)
        return cls(_pool().submit(_fill_all, cs))

    def wait(self) -> None:
        if self._future is not None:
            self._future.result()
            self._future = None
