"""Tool calling (OpenAI's ``tools`` / ``tool_choice``) over any chat template.

A template that takes ``tools`` renders them itself (the model was trained on that prompt);
the call format is read from the template (`CALL_FORMATS`, a table: the markers a template
writes, the call block's delimiters and the syntax of its body): ``<tool_call>{json}</tool_call>``
(Hermes / Qwen3), Qwen3.5's ``<tool_call><function=NAME><parameter=ARG>`` XML, LFM2's pythonic
``<|tool_call_start|>[f(a=1)]<|tool_call_end|>``, Gemma 4's ``<|tool_call>call:f{a:<|"|>x<|"|>}``
``<tool_call|>``; a bare ``{"name": ..., "arguments": ...}`` object otherwise. A
template without tools (SmolLM2's ChatML) gets a generic block in the system prompt that lists
the functions and asks for ``{"tool_call": {"name": ..., "arguments": {...}}}``, as llama.cpp's
server does; earlier calls and tool results are written back into the chat in that format.

With ``tool_choice`` "required" or a named function the output is constrained to one call in
the format, with each function's JSON Schema for its arguments, so it always parses (`_CallGrammar`
for the formats with markers: the markers as the vocabulary's special tokens, values written as
the family's template writes them); with "auto" the model may answer in text, and an answer that
parses as a call becomes one.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..errors import SamplingParamsError
from .constraint import JSON_STYLE, ConstraintError, GrammarSpec, grammar_spec, tight_schema

__all__ = ["ToolError", "ToolPlan", "CallStreamer", "CallScanner", "CallFormat", "CALL_FORMATS",
           "call_format", "plan_tools", "new_call_id", "call_finish"]

_NAME_RX = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


class ToolError(SamplingParamsError):
    """Bad ``tools`` / ``tool_choice`` (HTTP 400 naming `param`)."""

    def __init__(self, message: str, param: str = "tools"):
        super().__init__(message)
        self.param = param


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def call_finish(reason: str, calls: Any) -> str:
    """A reply that made calls ends with "tool_calls", unless max_tokens cut it ("length")."""
    return "tool_calls" if calls and reason == "stop" else reason


def takes_tools(template_source: str) -> bool:
    """Whether a chat template renders a ``tools`` variable."""
    return re.search(r"\btools\b", template_source) is not None


# --------------------------------------------------------------------------- validation

def check_tools(tools: Any) -> list[dict]:
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)) or not tools:
        raise ToolError("tools must be a non-empty list of {'type': 'function', 'function': {...}}")
    out, seen = [], set()
    for i, t in enumerate(tools):
        if not isinstance(t, Mapping) or t.get("type", "function") != "function" \
                or not isinstance(t.get("function"), Mapping):
            raise ToolError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}")
        f = t["function"]
        name = f.get("name")
        if not isinstance(name, str) or not _NAME_RX.match(name):
            raise ToolError(f"tools[{i}].function.name must be 1-64 letters, digits, _ . or -, got {name!r}")
        if name in seen:
            raise ToolError(f"tools[{i}]: the function name {name!r} is given twice")
        seen.add(name)
        params = f.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, Mapping):
            raise ToolError(f"tools[{i}].function.parameters must be a JSON Schema object")
        desc = f.get("description", "")
        if not isinstance(desc, str):
            raise ToolError(f"tools[{i}].function.description must be a string")
        out.append({"type": "function", "function": {"name": name, "description": desc,
                                                      "parameters": dict(params)}})
    return out


def check_choice(choice: Any, tools: list[dict]) -> tuple[str, str | None]:
    """("auto" | "none" | "required", the forced function's name or None)."""
    if choice is None:
        return "auto", None
    if choice in ("auto", "none", "required"):
        return choice, None
    if isinstance(choice, Mapping) and choice.get("type") == "function" \
            and isinstance(choice.get("function"), Mapping):
        name = choice["function"].get("name")
        if name not in {t["function"]["name"] for t in tools}:
            raise ToolError(f"tool_choice names the function {name!r}, which is not in tools", "tool_choice")
        return "required", name
    raise ToolError("tool_choice must be 'auto', 'none', 'required' or "
                    "{'type': 'function', 'function': {'name': ...}}", "tool_choice")


# --------------------------------------------------------------------------- formats

@dataclass(frozen=True)
class CallFormat:
    """A family's tool calls: a template has this format when it writes every marker of one
    of the `detect` groups; each call block runs from `open` to `close` (a block cut short
    runs to the end of the text) and its body is written in `body` syntax: "json" ({"name",
    "arguments"}), "xml" (<function=NAME><parameter=ARG>value</parameter></function>),
    "pythonic" ([f(a=1), g(b='x')]) or "gemma" (call:f{a:<|"|>x<|"|>}). `inline_history`:
    a template of the family that never reads a message's tool_calls (LFM2-8B-A1B,
    LFM2.5-Instruct) expects earlier calls written in the assistant's content."""
    name: str
    detect: tuple[tuple[str, ...], ...]
    open: str
    close: str
    body: str
    inline_history: bool = False


#: The first row whose markers a template writes wins (so Qwen3.5's XML before Hermes's JSON,
#: both in <tool_call>). Checked against the real templates (llama.cpp's models/templates:
#: Qwen3.5-4B, LFM2-8B-A1B, LFM2.5-*, google-gemma-4-31B-it) and llama.cpp's detection in
#: common/chat.cpp.
CALL_FORMATS: tuple[CallFormat, ...] = (
    CallFormat("qwen-xml", (("<tool_call>", "<function=", "<parameter="),), "<tool_call>", "</tool_call>", "xml"),
    CallFormat("hermes", (("<tool_call>",),), "<tool_call>", "</tool_call>", "json"),
    CallFormat("lfm2", (("<|tool_list_start|>",), ("<|tool_call_start|>",), ("List of tools: [",)),
               "<|tool_call_start|>", "<|tool_call_end|>", "pythonic", inline_history=True),
    CallFormat("gemma4", (("<|tool_call>call:",),), "<|tool_call>", "<tool_call|>", "gemma"),
)


def call_format(template_source: str) -> CallFormat | None:
    """The call format a template writes (None: no known markers)."""
    for f in CALL_FORMATS:
        if any(all(m in template_source for m in group) for group in f.detect):
            return f
    return None


_BY_NAME = {f.name: f for f in CALL_FORMATS}


@dataclass
class ToolPlan:
    """How one chat request with tools is prompted, constrained and read back."""
    fmt: str                                   # a CALL_FORMATS name | "json" | "generic"
    tools: list[dict]
    choice: str                                # "auto" | "none" | "required"
    messages: list[dict]                       # what the template renders
    render_extra: dict = field(default_factory=dict)   # tools=... for templates that take them
    spec: GrammarSpec | None = None            # the forced call's grammar ("required" / named)

    @property
    def active(self) -> bool:
        return self.choice != "none"

    @property
    def call_format(self) -> CallFormat | None:
        return _BY_NAME.get(self.fmt)

    def streamer(self) -> CallStreamer | None:
        """A CallStreamer when the reply is forced to be one call by a grammar (else None:
        read it at the end, or with `scanner`)."""
        return CallStreamer(self.fmt) if self.forced_json else None

    @property
    def forced_json(self) -> bool:
        """A call forced by a grammar in a JSON format: read by `streamer` / `parse`."""
        return self.choice == "required" and self.fmt in _HEADS

    def scanner(self) -> "CallScanner | None":
        """A CallScanner for a format with call markers (None: generic / bare JSON, or a call
        a grammar forces, which `streamer` reads)."""
        if self.active and self.call_format is not None and not self.forced_json:
            return CallScanner(self)
        return None

    def parts(self, text: str) -> list[tuple[str, Any]]:
        """A whole reply as the scanner streams it: ("text", str) and ("call", tool_call)
        in the order the model wrote them (a reply without markers: all text, or its calls)."""
        sc = self.scanner()
        if sc is None:
            calls = self.parse(text)
            return [("call", c) for c in calls] if calls else ([("text", text)] if text else [])
        return [(k, _strip_index(v) if k == "call" else v) for k, v in sc.feed_parts(text, final=True)]

    def split(self, text: str) -> tuple[str, list[dict] | None]:
        """(the text outside the call blocks, the calls) of a reply; (text, None) when it makes
        no call."""
        parts = self.parts(text)
        calls = [v for k, v in parts if k == "call"]
        return "".join(v for k, v in parts if k == "text"), (calls or None)

    def parse(self, text: str) -> list[dict] | None:
        """The calls in a reply (OpenAI tool_calls, ids new), or None when it is plain text. A
        forced call cut short (max_tokens) is returned with its partial arguments, as OpenAI
        returns it (finish_reason "length") and as it was streamed."""
        if not self.active:
            return None
        calls = self._parse(text)
        if calls is None and self.forced_json:
            st = CallStreamer(self.fmt)
            st.feed(text, final=True)
            calls = [st.call] if st.call is not None else None
        return calls

    def _parse(self, text: str) -> list[dict] | None:
        if self.call_format is not None and not self.forced_json:
            _, calls = self.split(text)
            return calls
        if self.call_format is not None:     # a forced Hermes call: the block as the grammar writes it
            content, calls = CallScanner(self).feed(text, final=True)
            return [_strip_index(c) for c in calls] or None
        obj = _loads(_unfence(text))
        if self.fmt == "generic":
            obj = obj.get("tool_call") if isinstance(obj, dict) else None
        return self._calls(obj if isinstance(obj, list) else [obj])

    def _calls(self, bodies: list[Any]) -> list[dict] | None:
        """OpenAI tool_calls of parsed {"name", "arguments"} bodies; None when one is not a
        call of a known function with an arguments object."""
        names = {t["function"]["name"] for t in self.tools}
        calls = []
        for b in bodies:
            if not isinstance(b, dict) or b.get("name") not in names:
                return None
            args = b.get("arguments", b.get("parameters", {}))
            if not isinstance(args, dict):
                return None
            calls.append({"id": new_call_id(), "type": "function",
                          "function": {"name": b["name"], "arguments": json.dumps(args, ensure_ascii=False)}})
        return calls or None

    def _params(self, name: str) -> dict:
        for t in self.tools:
            if t["function"]["name"] == name:
                return t["function"]["parameters"]
        return {}


# The forced call as the grammar writes it (compact JSON, name before arguments): what comes
# before the arguments object and after it.
_HEADS = {"generic": (r'\{"tool_call": \{"name": "([^"]+)", "arguments": ', "}}"),
          "json": (r'\{"name": "([^"]+)", "arguments": ', "}"),
          "hermes": (r'<tool_call>\n\{"name": "([^"]+)", "arguments": ', "}\n</tool_call>")}


class CallStreamer:
    """Streams a forced call (tool_choice "required" or named) as it is generated: `feed(text)`
    returns OpenAI's tool-call deltas -- first {index, id, type, function: {name, arguments:
    ""}}, then {index, function: {arguments: fragment}} -- holding back only what may be the
    closing text after the arguments."""

    def __init__(self, fmt: str):
        head, self._tail = _HEADS[fmt]
        self._head = re.compile(head)
        self._buf = ""
        self._args_at: int | None = None
        self._sent = 0
        self.call: dict | None = None

    def feed(self, text: str, final: bool = False) -> list[dict]:
        self._buf += text
        out = []
        if self._args_at is None:
            m = self._head.match(self._buf)
            if m is None:
                return out
            self._args_at = m.end()
            self.call = {"id": new_call_id(), "type": "function", "function": {"name": m.group(1), "arguments": ""}}
            out.append({"index": 0, "id": self.call["id"], "type": "function",
                        "function": {"name": m.group(1), "arguments": ""}})
        end = len(self._buf)
        if not final or self._buf.endswith(self._tail):
            end -= len(self._tail)
        frag = self._buf[self._args_at + self._sent:end]
        if frag:
            self._sent += len(frag)
            self.call["function"]["arguments"] += frag
            out.append({"index": 0, "function": {"arguments": frag}})
        return out


class CallScanner:
    """(consumer side) Reads a reply in a format with call markers as it comes: `feed(text)`
    returns (content, calls): the text outside the call blocks, released once it cannot be
    the start of the opening marker, and the calls of the blocks completed so far (OpenAI
    tool_calls, each with its "index" in the reply); `feed_parts` gives the same as ("text",
    str) / ("call", tool_call) in the reply's order. `final=True` ends the reply: held text is
    released, a block cut short is parsed as it stands. A block that does not parse as calls of
    the given functions is content, as the model wrote it. Whitespace around a call block is
    the format's layout, not content: it is held until text follows it."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.fmt = plan.call_format
        self._buf = ""
        self._in_block = False
        self._gap = ""                 # the whitespace before the open block
        self._after_call = False       # the whitespace that follows a call block is dropped
        self.n_calls = 0

    def feed(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        parts = self.feed_parts(text, final)
        return "".join(v for k, v in parts if k == "text"), [v for k, v in parts if k == "call"]

    def feed_parts(self, text: str, final: bool = False) -> list[tuple[str, Any]]:
        self._buf += text
        out: list[tuple[str, Any]] = []
        while True:
            if not self._in_block:
                if self._after_call:
                    self._buf = self._buf.lstrip()
                    self._after_call = not self._buf
                i = self._buf.find(self.fmt.open)
                if i < 0:
                    # hold what may start the marker, and the whitespace that may come before it
                    keep = len(self._buf) if final else \
                        len(self._buf[:len(self._buf) - _partial(self._buf, self.fmt.open)].rstrip())
                    out.append(("text", self._buf[:keep]))
                    self._buf = self._buf[keep:]
                    break
                before = self._buf[:i].rstrip()
                out.append(("text", before))
                self._gap, self._buf = self._buf[len(before):i], self._buf[i:]
                self._in_block = True
            j = self._buf.find(self.fmt.close, len(self.fmt.open))
            if j < 0 and not final:
                break
            end = len(self._buf) if j < 0 else j + len(self.fmt.close)
            block, self._buf = self._buf[:end], self._buf[end:]
            self._in_block = False
            found = self.plan._calls(_BODIES[self.fmt.body](
                self.plan, block[len(self.fmt.open):len(block) - (0 if j < 0 else len(self.fmt.close))]) or [None])
            if found is None:
                out.append(("text", self._gap + block))
            else:
                self._after_call = True
                for c in found:
                    out.append(("call", {"index": self.n_calls, **c}))
                    self.n_calls += 1
            if not self._buf:
                break
        return [p for p in out if p[0] == "call" or p[1]]


def _strip_index(call: dict) -> dict:
    return {k: v for k, v in call.items() if k != "index"}


def _partial(buf: str, marker: str) -> int:
    """Length of the longest suffix of `buf` that is a proper prefix of `marker`."""
    for k in range(min(len(marker) - 1, len(buf)), 0, -1):
        if buf.endswith(marker[:k]):
            return k
    return 0


# ---- call bodies: each returns [{"name", "arguments"}] or None when the body is malformed

def _json_body(plan: ToolPlan, body: str) -> list[Any] | None:
    obj = _loads(body.strip())
    return obj if isinstance(obj, list) else [obj]


_XML_FN = re.compile(r"\s*<function=([^>\n]+)>(.*?)(?:</function>|\Z)", re.S)
_XML_PARAM = re.compile(r"\s*<parameter=([^>\n]+)>\n?(.*?)(?:\n?</parameter>|\Z)", re.S)


def _xml_body(plan: ToolPlan, body: str) -> list[Any] | None:
    """Qwen3.5 / Qwen3-Coder: <function=NAME>, then <parameter=ARG>\nvalue\n</parameter> per
    argument. A value is typed by the function's schema: text where the parameter is a
    string, else JSON (or the template's Python-style True / False / None), else text."""
    out, pos, body = [], 0, body.rstrip()
    while pos < len(body):
        m = _XML_FN.match(body, pos)
        if m is None:
            return None
        name, inner = m.group(1).strip(), m.group(2)
        props = plan._params(name).get("properties") or {}
        args, ipos, inner = {}, 0, inner.rstrip()
        while ipos < len(inner):
            pm = _XML_PARAM.match(inner, ipos)
            if pm is None:
                return None
            key = pm.group(1).strip()
            args[key] = _xml_value(pm.group(2), props.get(key))
            ipos = pm.end()
        out.append({"name": name, "arguments": args})
        pos = m.end()
    return out or None


_PY_WORDS = {"True": True, "False": False, "None": None, "true": True, "false": False, "null": None}


def _xml_value(text: str, schema: Any) -> Any:
    types = schema.get("type") if isinstance(schema, Mapping) else None
    types = {types} if isinstance(types, str) else set(types or ())
    if types == {"string"}:
        return text
    v = _loads(text)
    if v is not None or text.strip() == "null":
        return v
    if text.strip() in _PY_WORDS:   # the template writes values with |string: True, None
        return _PY_WORDS[text.strip()]
    return text


class _Values:
    """A small recursive-descent reader of the non-JSON call bodies: Python-style literals
    (LFM2: 'x', "x", 1, 2.5, True, None, [..], {..}, and JSON's true / false / null) or Gemma
    4's (<|"|>x<|"|> strings, bare dict keys, true / false / null). Any error is ValueError."""

    GEMMA_QUOTE = '<|"|>'
    _ATOM = re.compile(r"[^,\]\})\s]+")
    # a quote closes a Python string only where a value may end: LFM2's template writes
    # strings between ' without escaping them (it's, raw newlines); a valid literal reads the same
    _CLOSES = re.compile(r"\s*(?:[,)\]}:]|\Z)")
    _ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2}|.)", re.S)
    _ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "b": "\b", "f": "\f", "\n": ""}
    _NAME = re.compile(r"[A-Za-z0-9_.\-]+")
    MAX_DEPTH = 64

    def __init__(self, text: str, gemma: bool):
        self.s, self.i, self.gemma = text, 0, gemma

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i].isspace():
            self.i += 1

    def take(self, lit: str) -> bool:
        self.ws()
        if self.s.startswith(lit, self.i):
            self.i += len(lit)
            return True
        return False

    def need(self, lit: str) -> None:
        if not self.take(lit):
            raise ValueError(f"expected {lit!r} at {self.i}")

    def name(self) -> str:
        self.ws()
        m = self._NAME.match(self.s, self.i)
        if m is None:
            raise ValueError(f"expected a name at {self.i}")
        self.i = m.end()
        return m.group()

    def items(self, close: str, item, depth: int) -> list:
        out = []
        if self.take(close):
            return out
        while True:
            out.append(item(depth))
            if self.take(close):
                return out
            self.need(",")

    def value(self, depth: int = 0) -> Any:
        if depth > self.MAX_DEPTH:
            raise ValueError("nested too deeply")
        self.ws()
        if self.gemma and self.s.startswith(self.GEMMA_QUOTE, self.i):
            return self.gemma_string()
        if self.take("{"):
            return dict(self.items("}", self.pair, depth + 1))
        if self.take("["):
            return self.items("]", self.value, depth + 1)
        if not self.gemma and self.take("("):
            return self.items(")", self.value, depth + 1)
        if not self.gemma and self.i < len(self.s) and self.s[self.i] in "'\"":
            return self.py_string()
        m = self._ATOM.match(self.s, self.i)
        if m is None:
            raise ValueError(f"expected a value at {self.i}")
        self.i = m.end()
        word = m.group()
        if word in _PY_WORDS:
            return _PY_WORDS[word]
        v = _loads(word)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return v
        raise ValueError(f"not a value: {word!r}")

    def py_string(self) -> str:
        q, j = self.s[self.i], self.i + 1
        while j < len(self.s):
            c = self.s[j]
            if c == "\\":
                j += 2
            elif c == q and self._CLOSES.match(self.s, j + 1):
                raw, self.i = self.s[self.i + 1:j], j + 1
                return self._ESCAPE.sub(self._unescape, raw)
            else:
                j += 1
        raise ValueError("an unterminated string")

    def _unescape(self, m: re.Match) -> str:
        e = m.group(1)
        return chr(int(e[1:], 16)) if len(e) > 1 else self._ESCAPES.get(e, e)

    def gemma_string(self) -> str:
        q = self.GEMMA_QUOTE
        j = self.s.find(q, self.i + len(q))
        if j < 0:
            raise ValueError("an unterminated <|\"|> string")
        v, self.i = self.s[self.i + len(q):j], j + len(q)
        return v

    def key(self) -> str:
        self.ws()
        if self.gemma:
            if self.s.startswith(self.GEMMA_QUOTE, self.i):
                return self.gemma_string()
            j = self.s.find(":", self.i)
            k = self.s[self.i:j] if j >= 0 else ""
            if not k or "}" in k:
                raise ValueError(f"expected a key at {self.i}")
            self.i = j
            return k.strip()
        v = self.value(self.MAX_DEPTH)
        if not isinstance(v, str):
            raise ValueError(f"a dict key must be a string, got {v!r}")
        return v

    def pair(self, depth: int) -> tuple[str, Any]:
        k = self.key()
        self.need(":")
        return k, self.value(depth)

    def kwarg(self, depth: int) -> tuple[str, Any]:
        k = self.name()
        self.need("=")
        return k, self.value(depth)

    def end(self) -> None:
        self.ws()
        if self.i != len(self.s):
            raise ValueError(f"unexpected text at {self.i}")


def _pythonic_body(plan: ToolPlan, body: str) -> list[Any] | None:
    """LFM2: [f(a=1, b='x'), g()] (the brackets optional)."""
    v = _Values(body, gemma=False)
    try:
        bracket = v.take("[")
        out = []
        while True:
            name = v.name()
            v.need("(")
            out.append({"name": name, "arguments": dict(v.items(")", v.kwarg, 1))})
            if not v.take(","):
                break
        if bracket:
            v.need("]")
        v.end()
    except (ValueError, SyntaxError, RecursionError, MemoryError):
        return None
    return out


def _gemma_body(plan: ToolPlan, body: str) -> list[Any] | None:
    """Gemma 4: call:NAME{key:value,...}."""
    v = _Values(body, gemma=True)
    try:
        v.need("call:")
        name = v.name()
        v.need("{")
        args = dict(v.items("}", v.pair, 1))
        v.end()
    except (ValueError, RecursionError, MemoryError):
        return None
    return [{"name": name, "arguments": args}]


_BODIES = {"json": _json_body, "xml": _xml_body, "pythonic": _pythonic_body, "gemma": _gemma_body}


def _loads(s: str) -> Any:
    try:
        return json.loads(s)
    except ValueError:
        return None


def _unfence(text: str) -> str:
    t = text.strip()
    m = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", t, re.S)
    return m.group(1) if m else t


def _call_schema(tools: list[dict], only: str | None) -> dict:
    opts = []
    for t in tools:
        f = t["function"]
        if only is not None and f["name"] != only:
            continue
        opts.append({"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                     "properties": {"name": {"const": f["name"]}, "arguments": tight_schema(f["parameters"])}})
    return opts[0] if len(opts) == 1 else {"anyOf": opts}


def _generic_block(tools: list[dict], choice: str, only: str | None) -> str:
    lines = ["You can call these functions (JSON Schema of each one's arguments):"]
    for t in tools:
        f = t["function"]
        lines.append(json.dumps({"name": f["name"], "description": f["description"],
                                 "parameters": f["parameters"]}, ensure_ascii=False))
    how = ('To call a function, reply with JSON only: {"tool_call": {"name": "<function name>", '
           '"arguments": {<the arguments>}}}.')
    if only is not None:
        how += f" Call the function {only} now."
    elif choice == "required":
        how += " Call one of the functions now."
    else:
        how += " Otherwise answer normally."
    lines.append(how)
    return "\n".join(lines)


def _generic_messages(messages: list[dict], block: str | None) -> list[dict]:
    """The chat for a template without tools: the block in the system prompt; earlier calls
    as the assistant's JSON; tool results as user turns naming the call."""
    out: list[dict] = []
    names: dict[str, str] = {}
    for m in messages:
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            parts = [m["content"]] if m.get("content") else []
            for c in m["tool_calls"]:
                f = c.get("function", {})
                names[c.get("id", "")] = f.get("name", "")
                parts.append(json.dumps({"tool_call": {"name": f.get("name"),
                                                       "arguments": _args(f.get("arguments"))}},
                                        ensure_ascii=False))
            out.append({"role": "assistant", "content": "\n".join(parts)})
        elif role == "tool":
            cid = m.get("tool_call_id", "")
            name = names.get(cid, m.get("name") or "the function")
            out.append({"role": "user", "content": f"{name} returned: {m.get('content') or ''}"})
        else:
            out.append(dict(m))
    if block is None:
        pass
    elif out and out[0].get("role") == "system":
        out[0] = {**out[0], "content": (out[0].get("content") or "") + "\n\n" + block}
    else:
        out.insert(0, {"role": "system", "content": block})
    return out


def _args(a: Any) -> Any:
    """OpenAI sends a call's arguments as JSON text; templates want the object."""
    if isinstance(a, str):
        v = _loads(a)
        return v if v is not None else a
    return a


def _template_messages(messages: list[dict], inline: CallFormat | None = None) -> list[dict]:
    """The chat for a template that takes tools: earlier calls' arguments as objects; with
    `inline` (a template that never reads tool_calls, as LFM2's), the calls written into the
    assistant's content in the family's format, as the model wrote them."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [{**c, "function": {**c.get("function", {}),
                                        "arguments": _args(c.get("function", {}).get("arguments"))}}
                     for c in m["tool_calls"]]
            m = {**m, "tool_calls": calls, "content": m.get("content") or ""}
            if inline is not None:
                m = {k: v for k, v in m.items() if k != "tool_calls"}
                m["content"] += write_calls(inline, [c["function"] for c in calls])
        out.append(m)
    return out


def write_calls(fmt: CallFormat, calls: list[dict]) -> str:
    """Calls ({"name", "arguments": object}) as a model of format `fmt` writes them."""
    if fmt.body == "pythonic":
        return fmt.open + "[" + ", ".join(
            f"{c['name']}(" + ", ".join(f"{k}={_py(v)}" for k, v in (c.get("arguments") or {}).items()) + ")"
            for c in calls) + "]" + fmt.close
    return "".join(fmt.open + _WRITERS[fmt.body](c["name"], c.get("arguments") or {}) + fmt.close
                   for c in calls)


def _py(v: Any) -> str:
    """A value as a Python literal (JSON's own for objects, as LFM2's template writes them)."""
    if isinstance(v, dict):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(_py(x) for x in v) + "]"
    return repr(v)


def _gemma(v: Any) -> str:
    if isinstance(v, str):
        return _Values.GEMMA_QUOTE + v + _Values.GEMMA_QUOTE
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_gemma(x)}" for k, x in sorted(v.items())) + "}"
    if isinstance(v, list):
        return "[" + ",".join(_gemma(x) for x in v) + "]"
    return json.dumps(v)


_WRITERS = {
    "json": lambda name, args: "\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + "\n",
    "xml": lambda name, args: f"\n<function={name}>\n" + "".join(
        f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}\n</parameter>\n"
        for k, v in args.items()) + "</function>\n",
    "gemma": lambda name, args: f"call:{name}" + _gemma(args),
}


# --------------------------------------------------------------------------- forced calls

def _forced_spec(fmt: str, tools: list[dict], only: str | None) -> GrammarSpec:
    """The grammar of one call (tool_choice "required": of any function; named: of that one)
    as the family's template writes it, each function's arguments typed by its JSON Schema."""
    if fmt in ("json", "generic"):
        schema = {**_call_schema(tools, only), "x-guidance": JSON_STYLE}
        if fmt == "generic":
            schema = {"type": "object", "additionalProperties": False, "required": ["tool_call"],
                      "properties": {"tool_call": schema}}
        return grammar_spec(json_schema=schema)
    return _CallGrammar(_BY_NAME[fmt]).spec([t["function"] for t in tools if only in (None, t["function"]["name"])])


_BARE_KEY = re.compile(r"[A-Za-z0-9_.\-]+")
_ANNOTATIONS = {"type", "description", "title", "default", "examples", "format", "nullable", "deprecated",
                "readOnly", "writeOnly", "$comment", "$schema", "$id", "$defs", "definitions"}
# what each Gemma value kind can say beyond its type (other keywords: ConstraintError)
_GEMMA_KEYS = {"string": {"minLength", "maxLength", "pattern"}, "array": {"items", "minItems", "maxItems"},
               "object": {"properties", "required", "additionalProperties"},
               "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}}
_GEMMA_KEYS["number"] = _GEMMA_KEYS["integer"]
_TYPED_KEYS = set().union(*_GEMMA_KEYS.values())


class _CallGrammar:
    """A Lark grammar (llguidance) of one forced call in a format with call markers. The
    markers are rules mk0, mk1, ... spelled as text here; GrammarSpec.for_tokenizer makes each
    the vocabulary's special token where it has one (the grammar's text literals cannot). Values
    are written as the family's template writes them, so that they parse back typed:
      hermes   <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
      xml      <tool_call>\n<function=f>\n<parameter=k>\nvalue\n</parameter>\n</function>\n</tool_call>
               (a string as its text; True / False / None; anything else JSON)
      pythonic <|tool_call_start|>[f(k="x", n=1, b=True)]<|tool_call_end|>  (JSON values, Python's
               True / False / None)
      gemma    <|tool_call>call:f{k:<|"|>x<|"|>,n:1}<tool_call|>  (keys in the template's
               dictsort order, bare; strings between <|"|>; true / false / None)"""

    def __init__(self, fmt: CallFormat):
        self.fmt = fmt
        self.rules: list[str] = []
        self.markers: list[str] = []
        self.n = 0
        self.any: str | None = None

    # ---- building blocks

    def mark(self, text: str) -> str:
        if text not in self.markers:
            self.markers.append(text)
        return f"mk{self.markers.index(text)}"

    def rule(self, body: str, terminal: bool = False) -> str:
        name = f"{'T' if terminal else 'r'}{self.n}"
        self.n += 1
        self.rules.append(f"{name}: {body}")
        return name

    @staticmethod
    def lit(text: str) -> str:
        return json.dumps(text, ensure_ascii=False)

    def json(self, schema: Any, root: Mapping) -> str:
        return self.rule("%json " + json.dumps({**_with_defs(schema, root), "x-guidance": JSON_STYLE}))

    def text(self, schema: Mapping, forbid: str, lo_min: int = 0) -> str | None:
        """A terminal of the text of a string (its length and pattern), never holding `forbid`;
        None when it can only be empty."""
        lo = max(int(schema.get("minLength", 0)), lo_min)
        hi = schema.get("maxLength")
        if hi is not None and int(hi) < lo:
            return None
        body = f"/(?s:.){{{lo},{'' if hi is None else int(hi)}}}/ & ~/(?s:.*){_rx(forbid)}(?s:.*)/"
        if isinstance(schema.get("pattern"), str):
            body += " & /" + _anchored(schema["pattern"]) + "/"
        return self.rule(body, terminal=True)

    def seq(self, items: list[tuple[str, bool]], sep: str) -> str | None:
        """The items in order, each (rule, required), `sep` between those written; None: empty."""
        memo: dict[tuple[int, bool], str | None] = {}

        def tail(i: int, first: bool) -> str | None:
            if i == len(items):
                return None
            if (i, first) not in memo:
                r, required = items[i]
                head = r if first or not sep else f"{self.lit(sep)} {r}"
                rest = tail(i + 1, False)
                take = head if rest is None else f"{head} {rest}"
                skip = None if required else tail(i + 1, first)
                body = take if required else (f"({take})?" if skip is None else f"{take} | {skip}")
                memo[(i, first)] = self.rule(body)
            return memo[(i, first)]

        return tail(0, True)

    # ---- the call

    def spec(self, funcs: list[dict]) -> GrammarSpec:
        fmt = self.fmt
        if fmt.body == "json":
            schema = {**_call_schema([{"function": f} for f in funcs], None), "x-guidance": JSON_STYLE}
            start = f'{self.mark(fmt.open)} "\\n" {self.rule("%json " + json.dumps(schema))} "\\n" {self.mark(fmt.close)}'
        else:
            calls = " | ".join(self.function(f) for f in funcs)
            start = f"{self.mark(fmt.open)} {self.rule(calls)} {self.mark(fmt.close)}"
        lines = [f"start: {start}", *self.rules, *(f"mk{i}: {self.lit(m)}" for i, m in enumerate(self.markers))]
        spec = grammar_spec(grammar={"type": "lark", "grammar": "\n".join(lines) + "\n"})
        return GrammarSpec("tool_call", spec.grammar)

    def function(self, f: dict) -> str:
        root = tight_schema(f["parameters"])
        params = _resolve(root, root)
        props = dict(params.get("properties") or {})
        required = [k for k in params.get("required") or () if isinstance(k, str)]
        for k in required:
            props.setdefault(k, {})
        name, body = f["name"], self.fmt.body
        keys = sorted(props, key=lambda k: (k.lower(), k)) if body == "gemma" else list(props)
        items = [(self.arg(k, _resolve(props[k], root), root), k in required) for k in keys]
        if body == "xml":
            args = self.seq(items, "")
            return f'{self.lit(chr(10) + "<function=" + name + ">" + chr(10))} {args or ""} "</function>\\n"'
        args = self.seq(items, ", " if body == "pythonic" else ",")
        if body == "pythonic":
            return f'"[" {self.lit(name + "(")} {args or ""} ")]"'
        return f'{self.lit("call:" + name + "{")} {args or ""} "}}"'

    def arg(self, key: str, s: Mapping, root: Mapping) -> str:
        body = self.fmt.body
        if body == "xml":
            head = self.lit(f"<parameter={key}>\n")
            close = "\n</parameter>\n"
            types = _types(s)
            if "enum" in s or "const" in s:
                vals = s["enum"] if "enum" in s else [s["const"]]
                value = "(" + " | ".join(self.lit(_xml_text(v, types == {"string"}) + close) for v in vals) + ")"
            elif types == {"string"}:     # its text, then the closing tag (one lexeme: no text holds it)
                t = self.text(s, "</parameter>")
                value = self.rule(f"{t} {self.lit(close)}", terminal=True) if t else self.lit(close)
            elif types and types <= {"boolean", "null"}:
                value = f'({" | ".join(_PY_LITS[t] for t in sorted(types))}) {self.lit(close)}'
            else:
                value = f"{self.json(s, root)} {self.lit(close)}"
            return self.rule(f"{head} {value}")
        if body == "pythonic":
            types = _types(s)
            if types and types <= {"boolean", "null"} and "enum" not in s and "const" not in s:
                value = f'({" | ".join(_PY_LITS[t] for t in sorted(types))})'
            else:
                value = self.json(s, root)
            return self.rule(f"{self.lit(key + '=')} {value}")
        k = key if _BARE_KEY.fullmatch(key) else None
        key_rule = self.lit(k + ":") if k else f'{self.quote()} {self.lit(key)} {self.quote()} ":"'
        return self.rule(f"{key_rule} {self.gemma(s, root, 0)}")

    # ---- Gemma 4's values

    def quote(self) -> str:
        return self.mark(_Values.GEMMA_QUOTE)

    def gemma(self, s: Any, root: Mapping, depth: int) -> str:
        if depth > 32:
            raise ConstraintError("a tool's parameters nest too deeply for the gemma4 call grammar")
        s = _resolve(s, root)
        if s is True or s == {} or not isinstance(s, Mapping):
            return self.gemma_any()
        if "enum" in s or "const" in s:
            vals = s["enum"] if "enum" in s else [s["const"]]
            return self.rule(" | ".join(self.gemma_lit(v) for v in vals))
        for k in ("anyOf", "oneOf"):
            if k in s:
                rest = {x: y for x, y in s.items() if x != k}
                return self.rule(" | ".join(self.gemma({**rest, **_resolve(a, root)}, root, depth + 1)
                                            for a in s[k]))
        types = sorted(_types(s)) or ["any"]
        if len(types) > 1:
            # each type with the keywords that apply to it (JSON Schema's: `minimum` says nothing of null)
            return self.rule(" | ".join(self.gemma({**{k: v for k, v in s.items() if k not in _TYPED_KEYS
                                                       or k in _GEMMA_KEYS.get(t, ())}, "type": t},
                                                   root, depth + 1) for t in types))
        t = types[0]
        extra = set(s) - _ANNOTATIONS - _GEMMA_KEYS.get(t, set())
        if t == "any" or extra:
            if extra or set(s) - _ANNOTATIONS:
                raise ConstraintError(f"the gemma4 call grammar cannot express {sorted(extra or set(s) - _ANNOTATIONS)} "
                                      "in a tool's parameters")
            return self.gemma_any()
        if t == "string":
            return self.gemma_string(s)
        if t in ("integer", "number"):
            return self.json(s, root)
        if t in ("boolean", "null"):
            return self.rule('"true" | "false"' if t == "boolean" else '"None"')
        if t == "array":
            item = self.gemma(s.get("items", {}), root, depth + 1)
            lo, hi = int(s.get("minItems", 0)), s.get("maxItems")
            if hi is not None and int(hi) == 0:
                return self.rule('"[" "]"')
            more = f'("," {item}){{{max(lo - 1, 0)},{"" if hi is None else int(hi) - 1}}}'
            return self.rule(f'"[" {item} {more} "]"' if lo > 0 else f'"[" ({item} {more})? "]"')
        props = dict(s.get("properties") or {})
        required = [k for k in s.get("required") or () if isinstance(k, str)]
        for k in required:
            props.setdefault(k, {})
        if not props and s.get("additionalProperties", True) is not False:
            return self.gemma_obj()
        items = []
        for k in sorted(props, key=lambda k: (k.lower(), k)):
            key_rule = self.lit(k + ":") if _BARE_KEY.fullmatch(k) else \
                f'{self.quote()} {self.lit(k)} {self.quote()} ":"'
            items.append((self.rule(f"{key_rule} {self.gemma(props[k], root, depth + 1)}"), k in required))
        inner = self.seq(items, ",")
        return self.rule(f'"{{" {inner or ""} "}}"')

    def gemma_string(self, s: Mapping) -> str:
        """<|"|>text<|"|>. Where the vocabulary has no <|"|> token (GrammarSpec.for_tokenizer
        leaves it text) the closing quote is one lexeme with the text before it, as the text
        would otherwise lex greedily into the quote; where it has one, that text alternative
        writes the same string."""
        q, quote = self.quote(), _Values.GEMMA_QUOTE
        body = self.text(s, quote, 1)
        inner = "" if body is None else (f"{body}?" if s.get("minLength", 0) == 0 else body)
        whole = self.text(s, quote)
        closed = self.lit(quote) if whole is None else self.rule(f"{whole} {self.lit(quote)}", terminal=True)
        return self.rule(f"{q} {inner} {q} | {q} {closed}")

    def gemma_lit(self, v: Any) -> str:
        if isinstance(v, str):
            return f"{self.quote()} {self.lit(v)} {self.quote()}" if v else f"{self.quote()} {self.quote()}"
        if isinstance(v, bool) or v is None:
            return self.lit("true" if v is True else "false" if v is False else "None")
        if isinstance(v, (int, float)):
            return self.lit(json.dumps(v))
        if isinstance(v, list):
            return '"[" ' + ' "," '.join(self.gemma_lit(x) for x in v) + ' "]"'
        if isinstance(v, Mapping):
            return '"{" ' + ' "," '.join(self.lit(f"{k}:") + " " + self.gemma_lit(v[k])
                                         for k in sorted(v, key=lambda k: (k.lower(), k))) + ' "}"'
        raise ConstraintError(f"a tool's enum holds {v!r}, which is not JSON")

    def gemma_any(self) -> str:
        if self.any is None:
            self.any = "gany"
            self.rules += [
                f'gany: {self.gemma_string({})} | GNUM | "true" | "false" | "None" | garr | gobj',
                'garr: "[" (gany ("," gany)*)? "]"',
                'gobj: "{" (GKEY ":" gany ("," GKEY ":" gany)*)? "}"',
                r"GKEY: /[A-Za-z0-9_.\-]+/",
                r"GNUM: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/"]
        return self.any

    def gemma_obj(self) -> str:
        self.gemma_any()
        return "gobj"


_PY_LITS = {"boolean": '"True" | "False"', "null": '"None"'}


def _types(s: Any) -> set[str]:
    t = s.get("type") if isinstance(s, Mapping) else None
    return {t} if isinstance(t, str) else {x for x in t or () if isinstance(x, str)}


def _xml_text(v: Any, string_typed: bool) -> str:
    """A value as Qwen3.5's template writes a parameter (a string as its text where the schema
    says string, else JSON, so that it reads back as it was)."""
    if isinstance(v, str) and string_typed:
        return v
    if isinstance(v, bool) or v is None:
        return "True" if v is True else "False" if v is False else "None"
    return json.dumps(v, ensure_ascii=False)


def _rx(text: str) -> str:
    """`text` as a Lark /regex/ matching it literally."""
    return re.escape(text).replace("/", "\\/")


def _anchored(pattern: str) -> str:
    """A JSON Schema pattern (found anywhere in the string) as a regex of the whole string."""
    p = pattern.replace("/", "\\/")
    start = p.startswith("^")
    p = p[1:] if start else p
    end = p.endswith("$") and not p.endswith("\\$")
    p = p[:-1] if end else p
    return ("" if start else "(?s:.*)") + f"(?:{p})" + ("" if end else "(?s:.*)")


def _resolve(s: Any, root: Mapping, depth: int = 0) -> Any:
    """A schema with its local $ref ("#/$defs/X") replaced by what it names."""
    if not isinstance(s, Mapping) or "$ref" not in s:
        return s
    ref = s["$ref"]
    if not isinstance(ref, str) or not ref.startswith("#") or depth > 32:
        raise ConstraintError(f"a tool's parameters hold a $ref the call grammar cannot follow: {ref!r}")
    node: Any = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, Mapping) or part not in node:
            raise ConstraintError(f"a tool's parameters hold a $ref to nothing: {ref!r}")
        node = node[part]
    rest = {k: v for k, v in s.items() if k != "$ref"}
    return _resolve({**node, **rest} if isinstance(node, Mapping) else node, root, depth + 1)


def _with_defs(s: Any, root: Mapping) -> Any:
    """A sub-schema with the root's definitions, so that its $ref resolve where it stands alone."""
    if not isinstance(s, Mapping):
        return s
    return {**{k: root[k] for k in ("$defs", "definitions") if k in root and k not in s}, **s}


def plan_tools(template_source: str, messages: list[dict], tools: Any, tool_choice: Any = None) -> ToolPlan:
    """The prompt, constraint and parser of a chat with `tools` (ToolError when malformed)."""
    tools = check_tools(tools)
    choice, only = check_choice(tool_choice, tools)
    if takes_tools(template_source):
        known = call_format(template_source)
        fmt = known.name if known is not None else "json"
        inline = known is not None and known.inline_history and "tool_calls" not in template_source
        msgs = _template_messages(messages, known if inline else None)
        extra = {"tools": tools} if choice != "none" else {}
    else:
        fmt = "generic"
        msgs = _generic_messages(messages, _generic_block(tools, choice, only) if choice != "none" else None)
        extra = {}
    spec = None
    if choice == "required":
        try:
            spec = _forced_spec(fmt, tools, only)
        except ConstraintError as e:   # a function's parameters the grammar engine refuses
            raise ToolError(f"tools: {e}") from None
    return ToolPlan(fmt=fmt, tools=tools, choice=choice, messages=msgs, render_extra=extra, spec=spec)
