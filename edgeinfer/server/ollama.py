"""Ollama's API (/api/chat, /api/generate, /api/embed, /api/embeddings, /api/tags, /api/show,
/api/ps, /api/version, /) over the chat and completion machinery, so that Ollama's clients and
the apps built on them talk to an edgeinfer server unchanged.

A /api/chat body becomes the chat request an OpenAI body would (`parse_chat`: the same template,
tools, structured output and thinking), /api/generate a chat of one user turn (with `raw`, a
completion of the prompt as is); Ollama's sampling options and defaults stand in for OpenAI's.
A reply is one JSON object or, by default, a stream of them, one a line (application/x-ndjson),
the last with `done` and the timings in nanoseconds. As in Ollama, num_predict is a bound (cut
to the room the prompt leaves) and a conversation's oldest turns give way to fit the context.
Errors are Ollama's `{"error": message}`.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import re
from datetime import datetime, timezone
from importlib.metadata import version
from typing import Any, Callable

import numpy as np
from aiohttp import web
from gguf import LlamaFileType

from ..engine import DoneEvent, ErrorEvent, TokenEvent
from .event_stream import StreamParts, call_arguments, collect, relay
from .openapi import NDJSON
from .protocol import (APIError, GenRequest, OllamaChatBody, OllamaGenerateBody, OllamaMessage, OllamaOptions, bad,
                       parse, parse_chat, parse_completion)

__all__ = ["error_body", "in_request_terms", "parse_request", "reply", "stream_reply",
           "model_list", "show", "running", "shortened", "embed_reply", "version_reply"]

# Ollama's sampling defaults (its server's, where a model file sets none)
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.0, "repeat_penalty": 1.1,
            "penalty_last_n": 64, "presence_penalty": 0.0, "frequency_penalty": 0.0}
# options that turn on a sampler edgeinfer does not have, and their "off" values
_OFF = {"mirostat": 0, "typical_p": 1.0, "tfs_z": 1.0}
_NS = 1e9
OLLAMA_API = "0.12.11"        # the release that added logprobs, the newest of the fields served
# the chat request's fields that errors name -> the Ollama body's
_FIELDS = {"max_tokens": "options.num_predict", "response_format": "format"}
_FIELD_WORDS = re.compile(r"\b(?:max_tokens|response_format)\b")
_FAR_FUTURE = "2318-01-01T00:00:00Z"      # /api/ps: models stay loaded while the server runs
# /api/generate's fields edgeinfer does not take, and why
_REFUSED = {"template": "the GGUF's chat template is the one that renders",
            "context": "send the conversation to /api/chat", "images": "the model reads text"}
_ZERO = re.compile(r"0+(\.0*)?(ns|us|ms|s|m|h)?")   # a keep_alive of no time: 0, "0", "0s", "0m"


def error_body(e: APIError) -> dict:
    return {"error": e.message}


def in_request_terms(e: APIError) -> None:
    """An error the chat machinery raised, made to name the Ollama body's fields."""
    e.message = _FIELD_WORDS.sub(lambda m: _FIELDS[m.group(0)], e.message)
    e.param = _FIELDS.get(e.param, e.param)


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _now() -> str:
    return _iso(datetime.now(timezone.utc))


# --------------------------------------------------------------------------- requests

def parse_request(kind: str, body: Any, eng) -> GenRequest | dict:
    """An /api/chat ("ollama_chat") or /api/generate ("ollama_generate") body as the chat or
    completion request it asks for on `eng`, or, for Ollama's load and unload requests (no
    messages, no prompt), the reply itself; 400 naming the first bad field."""
    if kind == "ollama_chat":
        b = parse(OllamaChatBody, body)
        if not b.messages:
            return _loaded(b, kind)
        chat = {"messages": [_message(m, i) for i, m in enumerate(b.messages)]}
        chat.update({k: v for k, v in (("tools", b.tools), ("tool_choice", b.tool_choice)) if v is not None})
        req = parse_chat(_with_output(chat, b, eng))
        req.trim_turns = b.truncate is not False
    else:
        b = parse(OllamaGenerateBody, body)
        refused = {**_REFUSED, **({"system": "with raw, no template renders it"} if b.raw else {}),
                   **({"system": "a fill-in-the-middle prompt has no system part"} if b.suffix else {}),
                   **({"suffix": "with raw the prompt goes to the model as it is"} if b.raw else {})}
        for field, why in refused.items():
            if getattr(b, field):
                raise bad(f"'{field}' is not supported: {why}", field, "unsupported_parameter")
        if not b.prompt:
            return _loaded(b, kind)
        if b.raw or b.suffix:      # the prompt as it is, or the gap between it and the suffix
            body = {"prompt": b.prompt, **({"suffix": b.suffix} if b.suffix else {})}
            req = parse_completion(_with_output(body, b, eng), eng.config.n_vocab)
        else:
            system = [{"role": "system", "content": b.system}] if b.system else []
            req = parse_chat(_with_output({"messages": system + [{"role": "user", "content": b.prompt}]}, b, eng))
    req.model, req.stream, req.bound_max_tokens = b.model, b.stream is not False, True
    req.sampling, req.max_tokens = _sampling(b.options or OllamaOptions())
    if b.top_logprobs and not b.logprobs:
        raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs", "invalid_value")
    req.n_logprobs = (b.top_logprobs or 0) if b.logprobs else None
    return req


def _loaded(b, kind: str) -> dict:
    """The reply to a request with nothing to generate: Ollama's "load the model" (it always is
    loaded), or with keep_alive 0 its "unload" (it stays loaded: the server's models do)."""
    out = {"model": b.model, "created_at": _now()}
    out.update({"message": {"role": "assistant", "content": ""}} if kind == "ollama_chat" else {"response": ""})
    return {**out, "done": True, "done_reason": "unload" if _ZERO.fullmatch(str(b.keep_alive)) else "load"}


def _message(m: OllamaMessage, i: int) -> dict:
    if m.images:
        raise bad("images are not taken: the model reads text", f"messages[{i}].images", "unsupported_parameter")
    out: dict = {"role": m.role, "content": m.content or ""}
    if m.tool_calls:
        out["tool_calls"] = [{"id": f"call_{i}_{j}", "type": "function",
                              "function": {"name": c.function.name, "arguments": c.function.arguments}}
                             for j, c in enumerate(m.tool_calls)]
    for field, key in (("thinking", "reasoning_content"), ("tool_name", "name"), ("tool_call_id", "tool_call_id")):
        if getattr(m, field):
            out[key] = getattr(m, field)
    return out


def _with_output(chat: dict, b, eng) -> dict:
    """The chat body's output fields of an Ollama body: `format` and `think` (a 400 on a model
    whose template has no thinking block, as Ollama answers)."""
    if b.think and not eng.thinks:
        raise bad("the model does not support thinking: its chat template has no thinking block", "think",
                  "unsupported_value")
    if b.format == "json":
        chat["response_format"] = {"type": "json_object"}
    elif isinstance(b.format, dict):
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": b.format}}
    if isinstance(b.think, bool):
        chat["enable_thinking"] = b.think          # the template's switch (Qwen3, SmolLM3)
    elif b.think is not None:
        chat["reasoning_effort"] = b.think
    return chat


def _sampling(o: OllamaOptions) -> tuple[dict, int | None]:
    """The sampling parameters and the most tokens to generate (None: no bound) of `options`."""
    for name, off in _OFF.items():
        v = getattr(o, name)
        if v is not None and v != off:
            raise bad(f"'options.{name}' other than {off} is not supported (a sampler edgeinfer does not have)",
                      f"options.{name}", "unsupported_value")
    given = {"temperature": o.temperature, "top_k": o.top_k, "top_p": o.top_p, "min_p": o.min_p,
             "repeat_penalty": o.repeat_penalty, "penalty_last_n": o.repeat_last_n,
             "presence_penalty": o.presence_penalty, "frequency_penalty": o.frequency_penalty}
    sampling = {k: DEFAULTS[k] if v is None else v for k, v in given.items()}
    sampling.update(seed=None if o.seed is None or o.seed < 0 else o.seed & 0xFFFF_FFFF_FFFF_FFFF,
                    stop=[s for s in o.stop or [] if s], ignore_eos=False, logit_bias=None)
    return sampling, o.num_predict if o.num_predict is not None and o.num_predict > 0 else None


# --------------------------------------------------------------------------- replies

def _final(ctx, done: DoneEvent) -> dict:
    s = done.stats
    return {"done": True, "done_reason": "length" if done.finish_reason == "length" else "stop",
            "total_duration": round(s.e2e_s * _NS), "load_duration": 0,
            "prompt_eval_count": ctx.n_prompt, "prompt_eval_duration": round(s.prefill_s * _NS),
            "eval_count": s.completion_tokens, "eval_duration": round(s.decode_s * _NS)}


def _split(parts: list[tuple[str, Any]], first: int = 0) -> tuple[str, str, list[dict]]:
    """The answer text, thinking text and tool calls of reply parts, each call as Ollama gives
    it (its arguments an object); a call max_tokens cut goes with the text, its arguments as the
    model wrote them. `first`: the index of the first call (the calls a stream has sent)."""
    text, thinking, calls = [], [], []
    for kind, part in parts:
        if kind == "thinking":
            thinking.append(part)
        elif kind == "text":
            text.append(part)
        elif (args := call_arguments(part)) is not None:
            calls.append({"function": {"index": first + len(calls), "name": part["function"]["name"],
                                       "arguments": args}})
        else:
            text.append(part["function"]["arguments"])
    return "".join(text), "".join(thinking), calls


def _chunk(ctx, text: str, thinking: str = "", calls: list[dict] | None = None) -> dict:
    """One object of a reply: the chat's message, or the generation's response, so far."""
    out: dict = {"model": ctx.req.model, "created_at": _now()}     # the name asked for, as Ollama echoes it
    if ctx.kind == "ollama_chat":
        out["message"] = {"role": "assistant", "content": text, **({"thinking": thinking} if thinking else {}),
                          **({"tool_calls": calls} if calls else {})}
    else:
        out.update({"response": text, **({"thinking": thinking} if thinking else {})})
    return out


def _logprobs(ctx, events: list) -> dict:
    lps = [ev.logprob for ev in events if isinstance(ev, TokenEvent) and ev.logprob is not None]
    return {"logprobs": ctx.chat_logprobs(lps)["content"]} if ctx.req.n_logprobs is not None else {}


async def reply(queue: asyncio.Queue, ctx, fail: Callable[[ErrorEvent], APIError]) -> dict:
    """The whole reply of a request that is not streamed."""
    events: list = []
    answer, thought, done = await collect(queue, ctx, fail, seen=events.append)
    text, _, calls = _split(ctx.plan.parts(answer) if ctx.plan is not None else [("text", answer)])
    return {**_chunk(ctx, text, thought, calls), **_final(ctx, done), **_logprobs(ctx, events)}


def _line(obj: dict) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode() + b"\n"


async def stream_reply(request: web.Request, queue: asyncio.Queue, ctx,
                       fail: Callable[[ErrorEvent], APIError]) -> web.StreamResponse:
    """The reply as a line per engine event with text (its thinking and answer text, or the
    tool calls once whole: StreamParts), then the last line with `done` and the timings."""
    parts = StreamParts(ctx.plan)

    def on_event(ev) -> tuple[list[bytes], bool]:
        if isinstance(ev, ErrorEvent):
            return [_line(error_body(fail(ev)))], True
        sent = parts.n_calls
        text, thinking, calls = _split(parts.feed(ev), sent)
        lps = _logprobs(ctx, [ev])
        out = [_line({**_chunk(ctx, text, thinking, calls), "done": False, **lps})] \
            if text or thinking or calls or lps.get("logprobs") else []
        if not isinstance(ev, DoneEvent):
            return out, False
        ctx.done(ev)
        return out + [_line({**_chunk(ctx, ""), **_final(ctx, ev)})], True
    return await relay(request, queue, b"", on_event, content_type=NDJSON)


# --------------------------------------------------------------------------- models and embeddings

def _parameter_size(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _details(info: dict, metadata: dict) -> dict:
    try:
        quant = LlamaFileType(int(metadata["general.file_type"])).name.removeprefix("MOSTLY_")
    except (KeyError, ValueError, TypeError):
        quant = max(info["tensor_types"], key=info["tensor_types"].get)   # the most common tensor type
    return {"parent_model": "", "format": "gguf", "family": info["arch"], "families": [info["arch"]],
            "parameter_size": _parameter_size(info["n_params"]), "quantization_level": quant}


def _tagged(name: str) -> str:
    return name if ":" in name else name + ":latest"      # Ollama lists every name with its tag


def _entry(name: str, eng) -> dict:
    """A model as /api/tags lists it: its file's size and time, and a digest that identifies the
    file by path, size and time (not a hash of its bytes, which would read the whole file)."""
    info, stat = eng.info(), eng.path.stat()
    ident = f"{eng.path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()
    name = _tagged(name)
    return {"name": name, "model": name,
            "modified_at": _iso(datetime.fromtimestamp(stat.st_mtime, timezone.utc)),
            "size": stat.st_size, "digest": hashlib.sha256(ident).hexdigest(),
            "details": _details(info, eng.gguf.metadata)}


def model_list(engines: dict) -> dict:
    """GET /api/tags: the served models (loaded ones; a model still loading is left out), each
    followed by its LoRA adapters, which Ollama lists as models of their own: `parent_model`
    names the base, `size` is the adapter's."""
    out = []
    for name, eng in engines.items():
        base = _entry(name, eng)
        out.append(base)
        for a in eng.lora_adapters():
            tagged = _tagged(a["name"])
            digest = hashlib.sha256(f"{base['digest']}\0{a['path']}".encode()).hexdigest()
            out.append({**base, "name": tagged, "model": tagged, "size": a["bytes"], "digest": digest,
                        "details": {**base["details"], "parent_model": base["name"]}})
    return {"models": out}


def running(engines: dict) -> dict:
    """GET /api/ps: the loaded models, each with the memory it holds (weights, KV ring, states)."""
    out = []
    for name, eng in engines.items():
        info = eng.info()
        weights = info["packed_weight_bytes"] or info["file_bytes"]
        out.append({**_entry(name, eng), "expires_at": _FAR_FUTURE, "context_length": info["n_ctx"],
                    "size": weights + info["kv_bytes"] + info["state_bytes"] + info["scratch_bytes"],
                    "size_vram": info["device_weight_bytes"]})
    return {"models": out}


def show(eng, verbose: bool) -> dict:
    """POST /api/show: the model's details, its file's metadata (lists of more than 5 values, such
    as the vocabulary, only when `verbose`), its chat template and what it can do."""
    entry = _entry("", eng)
    meta = {}
    for k, v in eng.gguf.metadata.items():
        long = not isinstance(v, (str, int, float)) and len(v) > 5
        meta[k] = None if long and not verbose else v if isinstance(v, (str, int, float)) else \
            (v.tolist() if hasattr(v, "tolist") else list(v))
    meta["general.parameter_count"] = eng.info()["n_params"]
    caps = ["completion", "tools"] + (["thinking"] if eng.thinks else []) + (["insert"] if eng.infills else [])
    return {"license": "", "modelfile": "", "parameters": "", "template": eng.template.source,
            "details": entry["details"], "model_info": meta, "capabilities": caps,
            "modified_at": entry["modified_at"]}


def shortened(vectors, dimensions: int | None):
    """Each vector's first `dimensions` values made unit length again (Ollama's `dimensions`,
    for models trained to be cut so); 400 past the model's width."""
    if dimensions is None:
        return vectors
    if dimensions > vectors.shape[1]:
        raise bad(f"dimensions must be at most the model's width {vectors.shape[1]}, got {dimensions}",
                  "dimensions", "invalid_value")
    cut = vectors[:, :dimensions]
    return cut / np.maximum(np.linalg.norm(cut, axis=1, keepdims=True), np.finfo(np.float32).tiny)


def embed_reply(name: str, vectors, n_tokens: int, seconds: float) -> dict:
    return {"model": name, "embeddings": [v.tolist() for v in vectors], "total_duration": round(seconds * _NS),
            "load_duration": 0, "prompt_eval_count": n_tokens}


def version_reply() -> dict:
    """GET /api/version: the Ollama release whose API the routes follow (clients compare it to
    enable features), and edgeinfer's own version."""
    return {"version": OLLAMA_API, "edgeinfer": version("edgeinfer")}
