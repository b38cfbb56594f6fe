"""Chat templates (``tokenizer.chat_template``) rendered safely.

A GGUF file is untrusted input, and so is the Jinja template inside it. Templates are only
ever rendered in ``jinja2.sandbox.ImmutableSandboxedEnvironment`` (no attribute access to
Python internals, no mutation of lists / dicts), with the helpers Hugging Face's
``apply_chat_template`` offers (``raise_exception``, ``strftime_now``, a ``tojson`` filter that
does not HTML-escape, ``loopcontrols``, ``{% generation %}`` blocks, ``trim_blocks`` and
``lstrip_blocks``), so a template renders as it does with ``transformers``.

On top of the sandbox, rendering is bounded:

* output: the template is rendered as a stream and stopped past ``max_output_chars``;
* intermediate values: string / list growth by ``+``, ``*``, ``~``, ``%``, ``**`` and by
  padding-style methods and filters is checked before it happens;
* time: rendering runs in a worker thread that is interrupted after ``timeout_s``.

Every failure is an ``edgeinfer.TemplateError`` with a message that says what went wrong.
"""
from __future__ import annotations

import ctypes
import datetime
import json
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox

from ..errors import TemplateError

__all__ = ["ChatTemplate", "CHATML_TEMPLATE", "validate_messages"]

# used when the GGUF carries no template
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% set content = message['content'] if message['content'] is string else '' %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

MAX_TEMPLATE_CHARS = 1_000_000
_MAX_DEPTH = 32
_MAX_INT_BITS = 4096
_DIGITS = re.compile(r"\d+")
_PADDING_METHODS = frozenset({"ljust", "rjust", "center", "zfill", "expandtabs"})


class _Unsafe(TemplateError):
    """Raised inside the sandbox when a template goes past a bound."""


class _RenderTimeout(BaseException):
    """Injected into a render thread that ran past its time limit."""


# ---------------------------------------------------------------------------------------------
# messages
# ---------------------------------------------------------------------------------------------
def _plain(value: Any, where: str, depth: int = 0) -> Any:
    """A deep copy of `value` made of plain data only (str, numbers, bools, None, lists, dicts)."""
    if depth > _MAX_DEPTH:
        raise TemplateError(f"{where} is nested too deeply (more than {_MAX_DEPTH} levels)")
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TemplateError(f"{where} has a non-string key {k!r}")
            out[k] = _plain(v, f"{where}[{k!r}]", depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    raise TemplateError(f"{where} holds a {type(value).__name__}; only plain data "
                        "(str, int, float, bool, None, list, dict) can be passed to a chat template")


def validate_messages(messages: Any) -> list[dict]:
    """Checks a chat (list of {'role': str, 'content': str | None | list of parts}) and returns
    a plain-data copy of it; raises TemplateError naming the first problem."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TemplateError(f"messages must be a list of dicts, got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise TemplateError(f"messages[{i}] must be a dict with 'role' and 'content', "
                                f"got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise TemplateError(f"messages[{i}]['role'] must be a non-empty string, got {role!r}")
        if "content" not in m and "tool_calls" not in m:
            raise TemplateError(f"messages[{i}] has no 'content'")
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            if isinstance(content, (list, tuple)) and all(isinstance(p, Mapping) for p in content):
                pass  # multimodal-style list of parts: [{'type': 'text', 'text': ...}, ...]
            else:
                raise TemplateError(f"messages[{i}]['content'] must be a string or None, "
                                    f"got {type(content).__name__}")
        out.append(_plain(m, f"messages[{i}]"))
    return out


def message_text(message: Mapping[str, Any]) -> str:
    """A message's text: its content string, or its text parts joined."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or () if p.get("type") == "text")


def is_prefill(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a chat ends with the start of the assistant's reply, to be continued (Anthropic's
    prefill; llama.cpp's server continues it too): an assistant message with text, no tool calls."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        return False   # validate_messages names what is wrong
    last = messages[-1]
    if not isinstance(last, Mapping):
        return False
    content = last.get("content")
    if last.get("role") != "assistant" or last.get("tool_calls"):
        return False
    if not isinstance(content, str) and not (isinstance(content, (list, tuple))
                                             and all(isinstance(p, Mapping) for p in content)):
        return False
    return bool(message_text(last).strip())


def _cut_after(text: str, final: str) -> str:
    """The rendered chat up to the end of its final message's text (what follows it closes the turn)."""
    for needle in (final, final.strip()):
        i = text.rfind(needle)
        if needle and i >= 0:
            return text[:i + len(needle)]
    raise TemplateError("the chat template does not write the last (assistant) message as given, "
                        "so the reply cannot continue it")


# ---------------------------------------------------------------------------------------------
# the sandbox
# ---------------------------------------------------------------------------------------------
class _GenerationTags(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (used by HF templates to mark assistant text):
    renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    if isinstance(indent, int) and not isinstance(indent, bool) and indent > 64:
        raise _Unsafe(f"tojson indent {indent} is too large")
    if isinstance(indent, str) and len(indent) > 64:
        raise _Unsafe("tojson indent string is too long")
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message: Any = "") -> None:
    raise TemplateError(f"the chat template refused the input: {message}")


def _strftime_now(fmt: Any) -> str:
    if not isinstance(fmt, str) or len(fmt) > 256:
        raise _Unsafe("strftime_now takes a short format string")
    return datetime.datetime.now().strftime(fmt)


def _shallow(v: Any) -> int:
    """Size of a value counting its own items and the characters of its direct strings."""
    if isinstance(v, str):
        return len(v)
    if isinstance(v, (list, tuple, set, frozenset)):
        return len(v) + sum(len(x) for x in v if isinstance(x, str))
    if isinstance(v, dict):
        return len(v) + sum(len(x) for x in v.values() if isinstance(x, str)) \
            + sum(len(k) for k in v if isinstance(k, str))
    return 0


def _deep(v: Any, cap: int) -> int:
    """Roughly the length of str(v), counted without building it; stops once past `cap`."""
    total = 0
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            total += len(x) + 2
        elif isinstance(x, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(x)
            if total <= cap:
                stack.extend(x)
        elif isinstance(x, dict):
            total += 2 + 4 * len(x)
            if total <= cap:
                stack.extend(x.keys())
                stack.extend(x.values())
        elif isinstance(x, int):
            total += x.bit_length() // 3 + 1
        else:
            total += 8
        if total > cap:
            return total
    return total


class _BoundedSandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """ImmutableSandboxedEnvironment that refuses to build values past `limit` characters."""

    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self, limit: int, **kwargs: Any):
        super().__init__(finalize=self._finalize_output, **kwargs)
        self.limit = limit

    # ---- size checks ----
    def _check_len(self, n: int, what: str) -> None:
        if n > self.limit:
            raise _Unsafe(f"the chat template tried to build {what} of about {n} characters "
                          f"(limit {self.limit})")

    def _check_deep(self, v: Any, what: str) -> None:
        self._check_len(_deep(v, self.limit), what)

    def _check_int_args(self, args: Sequence[Any], kwargs: Mapping[str, Any], what: str) -> None:
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, int) and not isinstance(a, bool) and abs(a) > self.limit:
                raise _Unsafe(f"the chat template passed {a} to {what} (limit {self.limit})")

    def _check_format_string(self, fmt: str, what: str) -> None:
        for m in _DIGITS.finditer(fmt):
            if len(m.group()) > 12 or int(m.group()) > self.limit:
                raise _Unsafe(f"the chat template used a width of {m.group()} in {what}")

    def _finalize_output(self, value: Any) -> Any:
        if not isinstance(value, str):
            self._check_deep(value, "an output value")
        return value

    def call_binop(self, context: Any, operator_: str, left: Any, right: Any) -> Any:
        if operator_ == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                    self._check_len(_shallow(seq) * max(n, 0), "a repeated value")
            if isinstance(left, int) and isinstance(right, int):
                if left.bit_length() + right.bit_length() > _MAX_INT_BITS:
                    raise _Unsafe("the chat template multiplied numbers that are too large")
        elif operator_ == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
                if right * left.bit_length() > _MAX_INT_BITS:
                    raise _Unsafe("the chat template raised a number to too large a power")
        elif operator_ == "+":
            if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
                self._check_len(_shallow(left) + _shallow(right), "a concatenation")
        elif operator_ == "%":
            if isinstance(left, str):
                self._check_format_string(left, "a %-format")
                args = right if isinstance(right, tuple) else (right,)
                self._check_int_args(args, {}, "a %-format")
                self._check_len(len(left) + _deep(right, self.limit), "a %-formatted string")
        return self.binop_table[operator_](left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        inner = getattr(__obj, "__wrapped__", __obj)
        owner = getattr(inner, "__self__", None)
        name = getattr(inner, "__name__", "")
        if isinstance(owner, str):
            if name in ("format", "format_map"):
                __self._check_format_string(owner, "str.format")
                __self._check_len(len(owner) + _deep((args, kwargs), __self.limit), "a formatted string")
            elif name in _PADDING_METHODS:
                __self._check_int_args(args, kwargs, f"str.{name}")
            elif name == "join" and args:
                __self._check_len(_deep(args[0], __self.limit)
                                  + len(owner) * max(_shallow(args[0]), 0), "a joined string")
            elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) \
                    and isinstance(args[1], str):
                grow = max(len(args[1]) - len(args[0]), 0)
                count = owner.count(args[0]) if args[0] else len(owner) + 1
                __self._check_len(len(owner) + grow * count, "a replaced string")
        result = super().call(__context, __obj, *args, **kwargs)
        __self._check_len(_shallow(result), "a value")
        return result

    def bounded_join(self, seq: Any) -> str:
        seq = list(seq)
        self._check_deep(seq, "a concatenation")
        return "".join(map(str, seq))


def _bounded_filter(env: _BoundedSandbox, name: str, func: Any) -> Any:
    passes_arg = getattr(func, "jinja_pass_arg", None) is not None

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        k = 1 if passes_arg else 0  # context / environment first for some filters
        value = args[k] if len(args) > k else None
        rest = args[k + 1:]
        env._check_int_args(rest, kwargs, f"the {name} filter")
        if name in ("join", "string", "format", "pprint", "tojson", "safe", "e", "escape",
                    "forceescape", "urlencode", "xmlattr", "indent", "center", "wordwrap"):
            env._check_deep(value, f"the input of the {name} filter")
        if name == "join" and isinstance(value, (list, tuple)) and rest:
            env._check_len(_deep(value, env.limit) + len(str(rest[0])) * len(value), "a joined string")
        if name == "replace" and len(rest) >= 2:
            s, old, new = str(value), str(rest[0]), str(rest[1])
            count = s.count(old) if old else len(s) + 1
            env._check_len(len(s) + max(len(new) - len(old), 0) * count, "a replaced string")
        if name == "format" and isinstance(value, str):
            env._check_format_string(value, "the format filter")
            env._check_len(len(value) + _deep((rest, kwargs), env.limit), "a formatted string")
        result = func(*args, **kwargs)
        env._check_len(_shallow(result), f"the result of the {name} filter")
        return result

    if passes_arg:
        wrapper.jinja_pass_arg = func.jinja_pass_arg  # type: ignore[attr-defined]
    wrapper.__name__ = getattr(func, "__name__", name)
    return wrapper


def _make_env(limit: int) -> _BoundedSandbox:
    env = _BoundedSandbox(
        limit,
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationTags],
        autoescape=False,
    )
    env.filters["tojson"] = _tojson
    env.filters = {k: _bounded_filter(env, k, f) for k, f in env.filters.items()}
    env.globals.pop("lipsum", None)  # generates unbounded text; no chat template needs it
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _async_raise(thread: threading.Thread, exc_type: type[BaseException]) -> bool:
    """Asks CPython to raise `exc_type` in `thread` at its next bytecode boundary."""
    try:
        set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    except AttributeError:  # not CPython
        return False
    if thread.ident is None:
        return False
    n = set_async_exc(ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type))
    if n > 1:  # should never happen: undo
        set_async_exc(ctypes.c_ulong(thread.ident), None)
        return False
    return n == 1


# ---------------------------------------------------------------------------------------------
class ChatTemplate:
    """A chat template compiled in the bounded sandbox.

    ``render(messages, add_generation_prompt=True, **extra)`` returns the prompt text.
    ``extra`` (e.g. ``tools=[...]``, ``documents=[...]``) goes into the template's context.
    """

    def __init__(self, template_str: str | None = None, *, bos_token: str = "", eos_token: str = "",
                 max_output_chars: int = 1_000_000, timeout_s: float | None = 5.0,
                 special_tokens: Mapping[str, str] | None = None):
        if template_str is None:
            template_str = CHATML_TEMPLATE
        if not isinstance(template_str, str):
            raise TemplateError(f"a chat template must be a string, got {type(template_str).__name__}")
        if len(template_str) > MAX_TEMPLATE_CHARS:
            raise TemplateError(f"the chat template is {len(template_str)} characters long "
                                f"(limit {MAX_TEMPLATE_CHARS})")
        if not isinstance(max_output_chars, int) or max_output_chars <= 0:
            raise ValueError("max_output_chars must be a positive int")
        self.source = template_str
        self.max_output_chars = max_output_chars
        self.timeout_s = timeout_s
        self.special_tokens = {"bos_token": bos_token or "", "eos_token": eos_token or ""}
        if special_tokens:
            self.special_tokens.update({k: str(v) for k, v in special_tokens.items()})
        self._env = _make_env(max_output_chars)
        try:
            self._template = self._env.from_string(template_str)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(f"the chat template has a syntax error at line {e.lineno}: {e.message}") from None
        except (RecursionError, MemoryError):
            raise TemplateError("the chat template is nested too deeply to compile") from None
        except Exception as e:  # noqa: BLE001 - anything the compiler throws is a bad template
            raise TemplateError(f"the chat template could not be compiled: {type(e).__name__}: {e}") from None
        # `~` concatenations call these module-level helpers of the compiled template
        ns = self._template.root_render_func.__globals__
        ns["str_join"] = self._env.bounded_join
        ns["markup_join"] = self._env.bounded_join

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], tokenizer: Any = None, **kwargs: Any) -> "ChatTemplate":
        """The GGUF's ``tokenizer.chat_template`` (ChatML when absent), with BOS / EOS texts
        taken from `tokenizer` when given."""
        src = meta.get("tokenizer.chat_template")
        if src is not None and not isinstance(src, str):
            raise TemplateError("'tokenizer.chat_template' must be a string")
        if tokenizer is not None:
            for key, attr in (("bos_token", "bos_id"), ("eos_token", "eos_id")):
                tid = getattr(tokenizer, attr, None)
                if tid is not None and key not in kwargs:
                    kwargs[key] = tokenizer.token_text(tid)
        return cls(src or None, **kwargs)

    @property
    def is_default(self) -> bool:
        return self.source == CHATML_TEMPLATE

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               continue_final: bool = False, **extra: Any) -> str:
        """The prompt text. continue_final: the last message (the assistant's) is left open, its
        end-of-turn cut, so that generation continues it (transformers' continue_final_message)."""
        msgs = validate_messages(messages)
        ctx: dict[str, Any] = dict(self.special_tokens)
        for k, v in extra.items():
            ctx[k] = _plain(v, k)
        ctx["messages"] = msgs
        ctx["add_generation_prompt"] = bool(add_generation_prompt) and not continue_final
        out = self._render(ctx) if self.timeout_s is None else self._render_in_thread(ctx, self.timeout_s)
        return _cut_after(out, message_text(msgs[-1])) if continue_final and msgs else out

    __call__ = render

    def _render(self, ctx: dict[str, Any]) -> str:
        limit = self.max_output_chars
        parts: list[str] = []
        total = 0
        try:
            for chunk in self._template.generate(**ctx):
                total += len(chunk)
                if total > limit:
                    raise TemplateError(f"the chat template produced more than {limit} characters; "
                                        "rendering was stopped")
                parts.append(chunk)
        except TemplateError:
            raise
        except jinja2.sandbox.SecurityError as e:
            raise TemplateError(f"the chat template tried something unsafe and was stopped: {e}") from None
        except jinja2.TemplateError as e:
            raise TemplateError(f"the chat template failed to render: {e}") from None
        except OverflowError as e:
            raise TemplateError(f"the chat template failed to render: {e}") from None
        except RecursionError:
            raise TemplateError("the chat template recursed too deeply") from None
        except MemoryError:
            raise TemplateError("the chat template ran out of memory") from None
        except Exception as e:  # noqa: BLE001 - TypeError, KeyError, ... from template code
            raise TemplateError(f"the chat template failed to render: {type(e).__name__}: {e}") from None
        return "".join(parts)

    def _render_in_thread(self, ctx: dict[str, Any], timeout: float) -> str:
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["text"] = self._render(ctx)
            except _RenderTimeout:
                box["error"] = TemplateError(
                    f"the chat template did not finish within {timeout:g} s and was stopped")
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                box["error"] = e

        t = threading.Thread(target=work, name="edgeinfer-chat-template", daemon=True)
        t.start()
        t.join(timeout)
        if t.is_alive():
            _async_raise(t, _RenderTimeout)
            t.join(1.0)
            raise TemplateError(
                f"the chat template did not finish within {timeout:g} s and was stopped")
        if "error" in box:
            raise box["error"]
        return box["text"]
