"""Anthropic's Messages API over the chat machinery.

A /v1/messages body becomes the chat request an OpenAI body would (`parse_chat`: the same
template, tools, sampling and thinking budget), so both routes make the same engine calls;
the engine's events become Anthropic's message, or its stream of events (message_start,
ping, content_block_start / _delta / _stop per thinking, text or tool_use block,
message_delta with the stop reason and usage, message_stop). Errors take Anthropic's shape.
"""
from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any, Callable

from aiohttp import web

from ..engine import DoneEvent, ErrorEvent, call_finish
from .event_stream import StreamParts, call_arguments, collect, relay
from .protocol import (AnthropicText, APIError, CountTokensBody, GenRequest, MessagesBody, bad, parse,
                       parse_chat)

__all__ = ["error_body", "parse_messages", "parse_count_tokens", "reply", "stream_reply"]

# HTTP status -> Anthropic's error type
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
                429: "rate_limit_error", 503: "overloaded_error"}
_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}


def error_body(e: APIError) -> dict:
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(e.status, "api_error"), "message": e.message}}


# --------------------------------------------------------------------------- requests

def parse_messages(body: Any) -> GenRequest:
    """A /v1/messages body as the chat request it asks for; 400 naming the first bad field."""
    b = parse(MessagesBody, body)
    req = parse_chat(_chat_body(b))
    req.sampling["stop"] = list(b.stop_sequences or [])   # Anthropic sets no bound of four
    return req


def parse_count_tokens(body: Any) -> GenRequest:
    return parse_chat(_chat_body(parse(CountTokensBody, body)))


def _chat_body(b: CountTokensBody) -> dict:
    chat: dict = {"model": b.model, "messages": _messages(b)}
    if isinstance(b, MessagesBody):
        chat.update({k: v for k, v in (("max_tokens", b.max_tokens), ("stream", b.stream),
                                       ("temperature", b.temperature), ("top_p", b.top_p),
                                       ("top_k", b.top_k), ("seed", b.seed), ("ignore_eos", b.ignore_eos),
                                       ("logit_bias", b.logit_bias), ("grammar", b.grammar)) if v is not None})
        if b.lora:
            chat["lora"] = [r.model_dump(exclude_none=True) for r in b.lora]
    if b.tools:
        chat["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                                           "parameters": t.input_schema}} for t in b.tools]
    if b.tool_choice is not None:
        c = b.tool_choice
        if c.type == "tool":
            if not c.name:
                raise bad("tool_choice of type 'tool' needs 'name'", "tool_choice.name", "missing_required_parameter")
            chat["tool_choice"] = {"type": "function", "function": {"name": c.name}}
        else:
            chat["tool_choice"] = _TOOL_CHOICE[c.type]
    if b.thinking is not None:
        if b.thinking.type == "disabled":
            chat["enable_thinking"] = False          # the template's switch (Qwen3)
        elif b.thinking.budget_tokens is not None:
            chat["reasoning_budget"] = b.thinking.budget_tokens
    return chat


def _text(content: str | list[AnthropicText] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(t.text for t in content)


def _messages(b: CountTokensBody) -> list[dict]:
    """Anthropic's turns as chat messages: the system prompt first, tool_result blocks as tool
    messages, an assistant's tool_use blocks as its tool_calls and thinking as its reasoning."""
    out: list[dict] = [{"role": "system", "content": _text(b.system)}] if b.system else []
    for i, m in enumerate(b.messages):
        blocks = m.content if isinstance(m.content, list) else [AnthropicText(type="text", text=m.content)]
        texts, calls, thinking, results = [], [], [], 0
        for j, blk in enumerate(blocks):
            if blk.type == "text":
                texts.append(blk.text)
            elif blk.type == "tool_result" and m.role == "user":
                out.append({"role": "tool", "tool_call_id": blk.tool_use_id, "content": _text(blk.content)})
                results += 1
            elif blk.type == "tool_use" and m.role == "assistant":
                calls.append({"id": blk.id, "type": "function", "function": {"name": blk.name, "arguments": blk.input}})
            elif blk.type == "thinking" and m.role == "assistant":
                thinking.append(blk.thinking)
            else:
                raise bad(f"a {blk.type} block cannot be in a {m.role} message", f"messages[{i}].content[{j}].type",
                          "invalid_value")
        if m.role == "user":
            if texts or not results:
                out.append({"role": "user", "content": "".join(texts)})
        else:
            msg: dict = {"role": "assistant", "content": "".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            if thinking:
                msg["reasoning_content"] = "".join(thinking)
            out.append(msg)
    return out


# --------------------------------------------------------------------------- replies

def _stop(done: DoneEvent, calls: Any) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished reply."""
    reason = call_finish(done.finish_reason, calls)
    if reason == "tool_calls":
        return "tool_use", None
    if reason == "length":
        return "max_tokens", None
    if done.stop_sequence is not None:
        return "stop_sequence", done.stop_sequence
    return "end_turn", None


def _call_block(call: dict) -> dict:
    """A call's tool_use block; a call max_tokens cut (its input not an object) is a text block
    of the arguments the model wrote."""
    args = call_arguments(call)
    if args is None:
        return {"type": "text", "text": call["function"]["arguments"]}
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": args}


def _message(ctx, content: list[dict], stop: tuple[str | None, str | None], output_tokens: int) -> dict:
    return {"id": "msg_" + uuid.uuid4().hex[:24], "type": "message", "role": "assistant", "model": ctx.model,
            "content": content, "stop_reason": stop[0], "stop_sequence": stop[1],
            "usage": {"input_tokens": ctx.n_prompt, "output_tokens": output_tokens}}


async def reply(queue: asyncio.Queue, ctx, fail: Callable[[ErrorEvent], APIError]) -> dict:
    """The whole message of a request that is not streamed."""
    answer, thought, done = await collect(queue, ctx, fail)
    parts = ctx.plan.parts(answer) if ctx.plan is not None else ([("text", answer)] if answer else [])
    calls = [c for kind, c in parts if kind == "call"]
    content = [{"type": "thinking", "thinking": thought, "signature": ""}] if thought else []
    for kind, part in parts:          # text and tool_use blocks in the order the model wrote them
        block = _call_block(part) if kind == "call" else {"type": "text", "text": part}
        if block["type"] == "text" and content and content[-1]["type"] == "text":
            content[-1]["text"] += block["text"]
        else:
            content.append(block)
    if not content:
        content.append({"type": "text", "text": ""})
    return _message(ctx, content, _stop(done, calls), done.stats.completion_tokens)


def _event(kind: str, **data: Any) -> bytes:
    return (f"event: {kind}\ndata: ".encode() + json.dumps({"type": kind, **data}, ensure_ascii=False).encode()
            + b"\n\n")


class _Blocks:
    """The content blocks of a stream: a new block starts when the kind of text changes."""

    def __init__(self):
        self.index = -1
        self.kind: str | None = None

    def start(self, block: dict) -> list[bytes]:
        out = self.stop()
        self.index += 1
        self.kind = block["type"]
        return out + [_event("content_block_start", index=self.index, content_block=block)]

    def stop(self) -> list[bytes]:
        if self.kind is None:
            return []
        self.kind = None
        return [_event("content_block_stop", index=self.index)]

    def delta(self, kind: str, piece: str) -> list[bytes]:
        if not piece:
            return []
        out = [] if self.kind == kind else self.start({"type": kind, kind: "", **({"signature": ""}
                                                                                  if kind == "thinking" else {})})
        return out + [_event("content_block_delta", index=self.index,
                             delta={"type": f"{kind}_delta", kind: piece})]


async def stream_reply(request: web.Request, queue: asyncio.Queue, ctx,
                       fail: Callable[[ErrorEvent], APIError]) -> web.StreamResponse:
    """The reply as Anthropic's server-sent events: thinking and text blocks as the text comes,
    each tool call a tool_use block once it is whole (StreamParts), its input in one delta."""
    blocks = _Blocks()
    parts = StreamParts(ctx.plan)

    def tool_use(call: dict) -> list[bytes]:
        block = _call_block(call)
        if block["type"] == "text":
            return blocks.delta("text", block["text"])
        return blocks.start({**block, "input": {}}) + [_event(
            "content_block_delta", index=blocks.index,
            delta={"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)})]

    def on_event(ev) -> tuple[list[bytes], bool]:
        if isinstance(ev, ErrorEvent):
            return [b"event: error\ndata: " + json.dumps(error_body(fail(ev))).encode() + b"\n\n"], True
        out: list[bytes] = []
        for kind, part in parts.feed(ev):
            out += tool_use(part) if kind == "call" else blocks.delta(kind, part)
        if not isinstance(ev, DoneEvent):
            return out, False
        ctx.done(ev)
        if blocks.index < 0:       # an empty reply still has its text block
            out += blocks.start({"type": "text", "text": ""})
        reason, sequence = _stop(ev, parts.n_calls)
        return out + blocks.stop() + [
            _event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence},
                   usage={"output_tokens": ev.stats.completion_tokens}),
            _event("message_stop")], True
    first = _event("message_start", message=_message(ctx, [], (None, None), 0)) + _event("ping")
    return await relay(request, queue, first, on_event)
