"""Tool calling (OpenAI's ``tools`` / ``tool_choice``) over any chat template.

A template that takes ``tools`` renders them itself (the model was trained on that prompt);
the call format is read from the template: ``<tool_call>{json}</tool_call>`` (Hermes / Qwen)
when it mentions that tag, a bare ``{"name": ..., "arguments": ...}`` object otherwise. A
template without tools (SmolLM2's ChatML) gets a generic block in the system prompt that lists
the functions and asks for ``{"tool_call": {"name": ..., "arguments": {...}}}``, as llama.cpp's
server does; earlier calls and tool results are written back into the chat in that format.

With ``tool_choice`` "required" or a named function the output is constrained to the call
format, with each function's JSON Schema for its arguments, so it always parses; with "auto"
the model may answer in text, and an answer that parses as a call becomes one.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..errors import SamplingParamsError
from .constraint import JSON_STYLE, ConstraintError, GrammarSpec, grammar_spec, tight_schema

__all__ = ["ToolError", "ToolPlan", "CallStreamer", "plan_tools", "new_call_id", "call_finish"]

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

@dataclass
class ToolPlan:
    """How one chat request with tools is prompted, constrained and read back."""
    fmt: str                                   # "hermes" | "json" | "generic"
    tools: list[dict]
    choice: str                                # "auto" | "none" | "required"
    messages: list[dict]                       # what the template renders
    render_extra: dict = field(default_factory=dict)   # tools=... for templates that take them
    spec: GrammarSpec | None = None            # the forced call's grammar ("required" / named)

    @property
    def active(self) -> bool:
        return self.choice != "none"

    def streamer(self) -> CallStreamer | None:
        """A CallStreamer when the reply is forced to be one call (else None: read it at the end)."""
        return CallStreamer(self.fmt) if self.choice == "required" else None

    def parse(self, text: str) -> list[dict] | None:
        """The calls in a reply (OpenAI tool_calls, ids new), or None when it is plain text. A
        forced call cut short (max_tokens) is returned with its partial arguments, as OpenAI
        returns it (finish_reason "length") and as it was streamed."""
        if not self.active:
            return None
        calls = self._parse(text)
        if calls is None and self.choice == "required":
            st = CallStreamer(self.fmt)
            st.feed(text, final=True)
            calls = [st.call] if st.call is not None else None
        return calls

    def _parse(self, text: str) -> list[dict] | None:
        bodies: list[Any] = []
        if self.fmt == "hermes":
            for m in re.finditer(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", text, re.S):
                bodies.append(_loads(m.group(1)))
        else:
            obj = _loads(_unfence(text))
            if self.fmt == "generic":
                obj = obj.get("tool_call") if isinstance(obj, dict) else None
            bodies = obj if isinstance(obj, list) else [obj]
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


def _template_messages(messages: list[dict]) -> list[dict]:
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [{**c, "function": {**c.get("function", {}),
                                        "arguments": _args(c.get("function", {}).get("arguments"))}}
                     for c in m["tool_calls"]]
            m = {**m, "tool_calls": calls, "content": m.get("content") or ""}
        out.append(m)
    return out


def plan_tools(template_source: str, messages: list[dict], tools: Any, tool_choice: Any = None) -> ToolPlan:
    """The prompt, constraint and parser of a chat with `tools` (ToolError when malformed)."""
    tools = check_tools(tools)
    choice, only = check_choice(tool_choice, tools)
    if takes_tools(template_source):
        fmt = "hermes" if "<tool_call>" in template_source else "json"
        msgs = _template_messages(messages)
        extra = {"tools": tools} if choice != "none" else {}
    else:
        fmt = "generic"
        msgs = _generic_messages(messages, _generic_block(tools, choice, only) if choice != "none" else None)
        extra = {}
    spec = None
    if choice == "required":
        schema = {**_call_schema(tools, only), "x-guidance": JSON_STYLE}
        if fmt == "hermes":
            grammar = {"grammar": {"type": "lark", "grammar":
                                   'start: "<tool_call>\\n" call "\\n</tool_call>"\ncall: %json '
                                   + json.dumps(schema)}}
        elif fmt == "json":
            grammar = {"json_schema": schema}
        else:
            grammar = {"json_schema": {"type": "object", "additionalProperties": False,
                                       "required": ["tool_call"], "properties": {"tool_call": schema}}}
        try:
            spec = grammar_spec(**grammar)
        except ConstraintError as e:   # a function's parameters the grammar engine refuses
            raise ToolError(f"tools: {e}") from None
    return ToolPlan(fmt=fmt, tools=tools, choice=choice, messages=msgs, render_extra=extra, spec=spec)
