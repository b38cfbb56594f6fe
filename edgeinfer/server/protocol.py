"""OpenAI request validation and the error object: every bad field gives a 400 naming it.

Sampling defaults are OpenAI's (temperature 1, top_p 1, no top-k, no min-p); the
extensions `top_k`, `min_p`, `repeat_penalty` and `ignore_eos` are accepted as well.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

ROLES = {"system", "developer", "user", "assistant", "tool"}


class APIError(Exception):
    """An error answered as OpenAI's `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


# --------------------------------------------------------------------------- field checks

def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(float(v)))


def _int(body: dict, name: str, lo: int | None = None, hi: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if not _is_int(v):
        raise bad(f"'{name}' must be an integer, got {type(v).__name__}", name, "invalid_type")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise bad(f"'{name}' must be {rng}, got {v}", name, "invalid_value")
    return v


def _num(body: dict, name: str, lo: float | None = None, hi: float | None = None,
         lo_open: bool = False) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if not _is_num(v):
        raise bad(f"'{name}' must be a number, got {type(v).__name__}", name, "invalid_type")
    v = float(v)
    if (lo is not None and (v < lo or (lo_open and v == lo))) or (hi is not None and v > hi):
        lo_s = f"> {lo}" if lo_open else f">= {lo}"
        rng = lo_s if hi is None else f"{lo_s} and <= {hi}"
        raise bad(f"'{name}' must be {rng}, got {v}", name, "invalid_value")
    return v


def _bool(body: dict, name: str) -> bool | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, bool):
        raise bad(f"'{name}' must be a boolean, got {type(v).__name__}", name, "invalid_type")
    return v


def _str(body: dict, name: str) -> str | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, str):
        raise bad(f"'{name}' must be a string, got {type(v).__name__}", name, "invalid_type")
    return v


def _obj(body: dict, name: str) -> dict | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, dict):
        raise bad(f"'{name}' must be an object, got {type(v).__name__}", name, "invalid_type")
    return v


def _stop(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise bad("'stop' must be a string or a list of strings", "stop", "invalid_type")
    if len(v) > 16:
        raise bad(f"'stop' allows at most 16 sequences, got {len(v)}", "stop", "invalid_value")
    return [s for s in v if s]


# --------------------------------------------------------------------------- requests

@dataclass
class GenRequest:
    kind: str                               # "chat" | "completion"
    model: str | None
    messages: list[dict] | None = None      # chat
    prompt_text: str | None = None          # completion, text
    prompt_ids: list[int] | None = None     # completion, token ids
    max_tokens: int | None = None           # None: until EOS or the context is full
    sampling: dict = field(default_factory=dict)
    stream: bool = False
    include_usage: bool = False
    n_logprobs: int | None = None           # None: no logprobs; else alternatives per token


def _common(body: dict, req: GenRequest) -> None:
    req.model = _str(body, "model")
    n = _int(body, "n")
    if n is not None and n != 1:
        raise bad(f"'n' must be 1 (one choice per request), got {n}", "n", "unsupported_value")
    temperature = _num(body, "temperature", 0.0, 2.0)
    top_p = _num(body, "top_p", 0.0, 1.0, lo_open=True)
    top_k = _int(body, "top_k", 0)
    min_p = _num(body, "min_p", 0.0, 1.0)
    repeat_penalty = _num(body, "repeat_penalty", 0.0, lo_open=True)
    presence = _num(body, "presence_penalty", -2.0, 2.0)
    frequency = _num(body, "frequency_penalty", -2.0, 2.0)
    seed = body.get("seed")
    if seed is not None:
        if not _is_int(seed):
            raise bad(f"'seed' must be an integer, got {type(seed).__name__}", "seed", "invalid_type")
        seed &= 0xFFFF_FFFF_FFFF_FFFF   # OpenAI allows negative seeds; numpy wants >= 0
    ignore_eos = _bool(body, "ignore_eos")
    req.sampling = {
        "temperature": 1.0 if temperature is None else temperature,
        "top_p": 1.0 if top_p is None else top_p,
        "top_k": 0 if top_k is None else top_k,
        "min_p": 0.0 if min_p is None else min_p,
        "repeat_penalty": 1.0 if repeat_penalty is None else repeat_penalty,
        "presence_penalty": presence or 0.0,
        "frequency_penalty": frequency or 0.0,
        "seed": seed,
        "stop": _stop(body),
        "ignore_eos": bool(ignore_eos),
    }
    req.stream = bool(_bool(body, "stream"))
    so = _obj(body, "stream_options")
    if so is not None:
        inc = _bool(so, "include_usage")
        req.include_usage = bool(inc)
    # Known OpenAI fields that we accept but do not act on: checked for type only.
    _str(body, "user")
    _obj(body, "metadata")
    _bool(body, "store")
    _bool(body, "parallel_tool_calls")
    lb = _obj(body, "logit_bias")
    if lb:
        raise bad("'logit_bias' is not supported", "logit_bias", "unsupported_parameter")


def _max_tokens(body: dict, *names: str) -> int | None:
    for name in names:
        v = _int(body, name, 1)
        if v is not None:
            return v
    return None


def parse_chat(body: Any) -> GenRequest:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    req = GenRequest(kind="chat", model=None)
    _common(body, req)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("'messages' must be a non-empty list", "messages", "invalid_type")
    out = []
    for i, m in enumerate(msgs):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"'{p}' must be an object", p, "invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise bad(f"'{p}.role' must be one of {sorted(ROLES)}, got {role!r}", f"{p}.role", "invalid_value")
        content = m.get("content")
        if content is None:
            content = ""
        elif isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise bad(f"'{p}.content[{j}]' must be a text part {{\"type\": \"text\", \"text\": ...}}",
                              f"{p}.content", "invalid_type")
                parts.append(part["text"])
            content = "".join(parts)
        elif not isinstance(content, str):
            raise bad(f"'{p}.content' must be a string or a list of text parts", f"{p}.content", "invalid_type")
        out.append({"role": "system" if role == "developer" else role, "content": content})
    req.messages = out
    req.max_tokens = _max_tokens(body, "max_completion_tokens", "max_tokens")
    lp = _bool(body, "logprobs")
    top = _int(body, "top_logprobs", 0, 20)
    if top is not None and not lp:
        raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs", "invalid_value")
    if lp:
        req.n_logprobs = top or 0
    for name in ("tools", "functions"):
        if body.get(name):
            raise bad(f"'{name}' is not supported by this server", name, "unsupported_parameter")
    rf = _obj(body, "response_format")
    if rf is not None and rf.get("type", "text") != "text":
        raise bad("only response_format {'type': 'text'} is supported", "response_format", "unsupported_value")
    return req


def parse_completion(body: Any, n_vocab: int) -> GenRequest:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    req = GenRequest(kind="completion", model=None)
    _common(body, req)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]          # a batch of one prompt
    if isinstance(prompt, str):
        req.prompt_text = prompt
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        bad_ids = [t for t in prompt if not 0 <= t < n_vocab]
        if bad_ids:
            raise bad(f"token id {bad_ids[0]} in 'prompt' is outside the vocabulary [0, {n_vocab})",
                      "prompt", "invalid_token")
        req.prompt_ids = list(prompt)
    elif isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise bad("one prompt per request: 'prompt' must be a string or a list of token ids",
                  "prompt", "unsupported_value")
    else:
        raise bad("'prompt' must be a string or a non-empty list of token ids", "prompt", "invalid_type")
    mt = _max_tokens(body, "max_tokens")
    req.max_tokens = 16 if mt is None and body.get("max_tokens", 0) is not None else mt
    lp = _int(body, "logprobs", 0, 20)
    if lp is not None:
        req.n_logprobs = lp
    if _bool(body, "echo"):
        raise bad("'echo' is not supported", "echo", "unsupported_parameter")
    if _str(body, "suffix"):
        raise bad("'suffix' is not supported", "suffix", "unsupported_parameter")
    best_of = _int(body, "best_of", 1)
    if best_of not in (None, 1):
        raise bad("'best_of' must be 1", "best_of", "unsupported_value")
    return req
