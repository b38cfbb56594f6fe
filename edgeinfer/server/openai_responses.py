"""OpenAI's Responses API (POST /v1/responses, GET and DELETE /v1/responses/{id}) over the
chat machinery.

A body becomes the chat request an OpenAI chat body would (`parse_chat`: the same template,
tools, sampling, structured output and thinking budget), so both routes make the same engine
calls; the engine's events become a Response object, or its stream of events
(response.created, response.in_progress; per output item output_item.added, for a message or
reasoning item content_part.added, its text deltas and .done events, for a function call its
arguments; then response.completed, or response.incomplete when max_output_tokens cut it).

Responses are kept in memory, the last `ResponseStore.capacity` of them (`store: false` keeps
none), each with the conversation it ends, so that a later request continues one by
`previous_response_id`; a client may as well send the whole conversation as input items.
Errors take OpenAI's shape.
"""
from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from aiohttp import web

from ..engine import DoneEvent, ErrorEvent, TokenEvent
from .event_stream import StreamParts, collect, relay
from .protocol import (APIError, GenRequest, ResponsesBody, ResponsesFunctionCallItem, ResponsesFunctionCallOutputItem,
                       ResponsesMessageItem, ResponsesReasoningItem, bad, parse, parse_chat)

__all__ = ["ResponseStore", "parse_request", "in_request_terms", "reply", "stream_reply"]

_TEXT_PARTS = ("input_text", "output_text", "text")
# the chat request's fields that errors name -> the Responses body's
_FIELDS = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format"}
_FIELD_WORDS = re.compile(r"\b(?:max_tokens|response_format)\b")    # in a message: words no template says


# --------------------------------------------------------------------------- requests

class ResponseStore:
    """The kept Responses, the oldest dropped past `capacity` (bounded memory): each the Response
    and the conversation it ends, its input (a previous response's included) and then its output
    as the assistant's turn, in chat messages without the instructions (OpenAI does not carry
    them over)."""

    def __init__(self, capacity: int = 256):
        self.capacity = capacity
        self._kept: OrderedDict[str, tuple[dict, list[dict]]] = OrderedDict()

    def put(self, response: dict, conversation: list[dict]) -> None:
        self._kept[response["id"]] = (response, conversation)
        while len(self._kept) > self.capacity:
            self._kept.popitem(last=False)

    def get(self, rid: str) -> tuple[dict, list[dict]] | None:
        return self._kept.get(rid)

    def delete(self, rid: str) -> bool:
        return self._kept.pop(rid, None) is not None


@dataclass
class ResponsesCall:
    """What a /v1/responses request keeps beside its chat request: the settings its Response
    repeats, and, when it is stored, the conversation up to its output."""
    echo: dict
    conversation: list[dict] | None


def parse_request(body: Any, store: ResponseStore) -> GenRequest:
    """A /v1/responses body as the chat request it asks for (its ResponsesCall in `responses`);
    400 naming the first bad field."""
    b = parse(ResponsesBody, body)
    if b.conversation is not None:
        raise bad("'conversation' is not supported: continue a response by 'previous_response_id', or send "
                  "the conversation as input items", "conversation", "unsupported_parameter")
    history: list[dict] = []
    if b.previous_response_id is not None:
        kept = store.get(b.previous_response_id)
        if kept is None:
            raise bad(f"no kept response '{b.previous_response_id}' (the server keeps the last {store.capacity} "
                      "responses made with store true, in memory)", "previous_response_id",
                      "previous_response_not_found")
        history = kept[1]
    if b.background:
        raise bad("'background' is not supported: stream the response instead", "background", "unsupported_value")
    conversation = history + _messages(b.input)
    instructions = [{"role": "system", "content": b.instructions}] if b.instructions else []
    chat: dict = {"model": b.model, "messages": instructions + conversation}
    chat.update({k: v for k, v in (("max_tokens", b.max_output_tokens), ("stream", b.stream),
                                   ("temperature", b.temperature), ("top_p", b.top_p), ("top_k", b.top_k),
                                   ("min_p", b.min_p), ("seed", b.seed), ("ignore_eos", b.ignore_eos),
                                   ("logit_bias", b.logit_bias), ("reasoning_budget", b.reasoning_budget))
                 if v is not None})
    if b.lora:
        chat["lora"] = [r.model_dump(exclude_none=True) for r in b.lora]
    tools = []     # as the Response repeats them; the chat request takes each as a function
    for i, t in enumerate(b.tools or []):
        if t.type != "function":
            raise bad(f"tools of type '{t.type}' are not served: only 'function' tools", f"tools[{i}].type",
                      "unsupported_value")
        if not t.name:
            raise bad("a function tool needs 'name'", f"tools[{i}].name", "missing_required_parameter")
        function = {"name": t.name, "description": t.description or "",
                    "parameters": t.parameters if t.parameters is not None else {"type": "object", "properties": {}}}
        tools.append({"type": "function", **function, "strict": t.strict})
        chat.setdefault("tools", []).append({"type": "function", "function": function})
    choice = b.tool_choice
    if choice is not None:
        chat["tool_choice"] = choice if isinstance(choice, str) else {"type": "function",
                                                                      "function": {"name": choice.name}}
    fmt = b.text.format if b.text is not None and b.text.format is not None else None
    if fmt is not None and fmt.type == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.schema_ is None:
            raise bad("a json_schema format needs 'schema'", "text.format.schema", "missing_required_parameter")
        chat["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt.name or "response", "schema": fmt.schema_, "strict": bool(fmt.strict)}}
    if b.reasoning is not None and b.reasoning.effort is not None:
        chat["reasoning_effort"] = b.reasoning.effort
    if "message.output_text.logprobs" in (b.include or []) or b.top_logprobs:
        chat.update(logprobs=True, top_logprobs=b.top_logprobs or 0)
    req = parse_chat(chat)
    kept = b.store is not False      # OpenAI's default: stored
    req.responses = ResponsesCall(conversation=conversation if kept else None, echo={
        "instructions": b.instructions, "max_output_tokens": b.max_output_tokens, "metadata": b.metadata or {},
        "parallel_tool_calls": True if b.parallel_tool_calls is None else b.parallel_tool_calls,
        "previous_response_id": b.previous_response_id, "store": kept,
        "reasoning": {"effort": b.reasoning.effort if b.reasoning else None,
                      "summary": b.reasoning.summary if b.reasoning else None},
        "temperature": req.sampling["temperature"], "top_p": req.sampling["top_p"],
        "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
        "tool_choice": (choice if isinstance(choice, str) else choice.model_dump()) if choice is not None else "auto",
        "tools": tools, "top_logprobs": b.top_logprobs, "truncation": "disabled", "user": b.user})
    return req


def in_request_terms(e: APIError) -> None:
    """An error the chat machinery raised, made to name the Responses body's fields (the
    field, not a place inside it: a chat message's position is not an input item's)."""
    head = re.match(r"\w*", e.param or "").group(0)
    if head in _FIELDS:
        e.param = _FIELDS[head]
    e.message = _FIELD_WORDS.sub(lambda m: _FIELDS[m.group(0)], e.message)


def _text(content: Any, where: str) -> str:
    """An item's content as text: a string, or its text parts joined; other parts are a 400."""
    if isinstance(content, str):
        return content
    out = []
    for j, p in enumerate(content):
        field = "text" if p.type in _TEXT_PARTS else "refusal" if p.type == "refusal" else None
        if field is None:
            raise bad(f"content parts of type '{p.type}' are not taken: the model reads text",
                      f"{where}.content[{j}]", "unsupported_value")
        if getattr(p, field) is None:
            raise bad(f"a {p.type} part needs '{field}'", f"{where}.content[{j}].{field}", "missing_required_parameter")
        out.append(getattr(p, field))
    return "".join(out)


def _messages(given: Any) -> list[dict]:
    """The input as chat messages: a string as a user message; of the items, a function_call
    item as a call of the assistant turn it follows (or a turn of its own), its output as a tool
    message, a reasoning item as the next assistant turn's thinking."""
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    out: list[dict] = []

    def assistant_turn(fresh: bool) -> dict:
        if fresh or not out or out[-1]["role"] != "assistant":
            out.append({"role": "assistant", "content": ""})
        return out[-1]
    for i, item in enumerate(given):
        where = f"input[{i}]"
        if isinstance(item, ResponsesMessageItem):
            text = _text(item.content, where)
            if item.role != "assistant":
                out.append({"role": item.role, "content": text})
                continue
            last = out[-1] if out else None     # after its own reasoning item: that turn's text
            turn = assistant_turn(not (last and last["role"] == "assistant" and not last["content"]
                                       and "tool_calls" not in last))
            turn["content"] = text
        elif isinstance(item, ResponsesFunctionCallItem):
            assistant_turn(False).setdefault("tool_calls", []).append(
                {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}})
        elif isinstance(item, ResponsesFunctionCallOutputItem):
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output, where)})
        elif isinstance(item, ResponsesReasoningItem):
            text = "".join(p.text for p in (item.content if item.content else item.summary))
            assistant_turn(True)["reasoning_content"] = text
        else:
            raise bad(f"input items of type '{item.type}' are not taken: the conversation comes as message, "
                      "function_call and function_call_output items, or by previous_response_id",
                      f"{where}.type", "unsupported_value")
    return out


# --------------------------------------------------------------------------- replies

def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class _Tokens:
    """The reply's tokens as they come: those of the thinking block (the tokens before the
    answer's first text once thinking text has come, its closing tag included), and the
    logprobs not yet given out (where the request asks for them)."""

    def __init__(self):
        self.thinking = False
        self.answering = False
        self.reasoning_tokens = 0
        self.logprobs: list = []

    def feed(self, ev: TokenEvent | DoneEvent) -> None:
        self.thinking |= bool(ev.reasoning)
        self.answering |= bool(ev.text)
        if isinstance(ev, TokenEvent):
            self.reasoning_tokens += self.thinking and not self.answering
            if ev.logprob is not None:
                self.logprobs.append(ev.logprob)

    def take_logprobs(self, ctx) -> list[dict]:
        """The logprobs not given out yet, in OpenAI's shape (token, bytes, logprob, top_logprobs)."""
        taken, self.logprobs = self.logprobs, []
        return ctx.chat_logprobs(taken)["content"] if taken else []

    def usage(self, ctx, done: DoneEvent) -> dict:
        n_out = done.stats.completion_tokens
        return {"input_tokens": ctx.n_prompt, "input_tokens_details": {"cached_tokens": done.stats.cached_tokens},
                "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                "total_tokens": ctx.n_prompt + n_out}


def _response(ctx, rid: str, status: str, output: list[dict], usage: dict | None) -> dict:
    return {"id": rid, "object": "response", "created_at": ctx.created, "status": status,
            "completed_at": int(time.time()) if status != "in_progress" else None, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": ctx.model, "output": output, "usage": usage, **ctx.req.responses.echo}


def _keep(ctx, response: dict) -> None:
    """A finished Response into the server's store, with the conversation it ends, where the
    request keeps it."""
    conversation = ctx.req.responses.conversation
    if conversation is None:
        return
    out = response["output"]
    turn: dict = {"role": "assistant", "content": "".join(p["text"] for o in out if o["type"] == "message"
                                                          for p in o["content"])}
    calls = [{"id": o["call_id"], "type": "function", "function": {"name": o["name"], "arguments": o["arguments"]}}
             for o in out if o["type"] == "function_call"]
    if calls:
        turn["tool_calls"] = calls
    thought = "".join(p["text"] for o in out if o["type"] == "reasoning" for p in o["content"])
    if thought:
        turn["reasoning_content"] = thought
    ctx.state.responses.put(response, conversation + [turn])


def _status(done: DoneEvent) -> str:
    return "incomplete" if done.finish_reason == "length" else "completed"


def _message_item(text: str, status: str) -> dict:
    return {"id": _new_id("msg"), "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _reasoning_item(text: str, status: str) -> dict:
    return {"id": _new_id("rs"), "type": "reasoning", "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def _call_item(call: dict, status: str) -> dict:
    return {"id": _new_id("fc"), "type": "function_call", "status": status, "call_id": call["id"],
            "name": call["function"]["name"], "arguments": call["function"]["arguments"]}


async def reply(queue: asyncio.Queue, ctx, fail: Callable[[ErrorEvent], APIError]) -> dict:
    """The whole Response of a request that is not streamed."""
    tokens = _Tokens()
    answer, thought, done = await collect(queue, ctx, fail, tokens.feed)
    status = _status(done)
    parts = ctx.plan.parts(answer) if ctx.plan is not None else [("text", answer)]
    output = [_reasoning_item(thought, status)] if thought else []
    for kind, part in parts:          # messages and calls in the order the model wrote them
        if kind == "call":
            output.append(_call_item(part, "completed"))
        elif output and output[-1]["type"] == "message":
            output[-1]["content"][0]["text"] += part
        elif part:
            output.append(_message_item(part, status))
    if not any(o["type"] != "reasoning" for o in output):   # an empty reply still has its message
        output.append(_message_item("", status))
    messages = [o for o in output if o["type"] == "message"]
    if messages:          # every token's logprobs (where asked for) on the first message
        messages[0]["content"][0]["logprobs"] = tokens.take_logprobs(ctx)
    response = _response(ctx, _new_id("resp"), status, output, tokens.usage(ctx, done))
    _keep(ctx, response)
    return response


class _Items:
    """The output items of a stream and their events, each numbered in order: a message or
    reasoning item stays open while its kind of text comes; a call is one whole item."""

    def __init__(self, ctx, tokens: _Tokens):
        self.ctx, self.tokens = ctx, tokens
        self.output: list[dict] = []
        self.seq = 0
        self.open: int | None = None          # index of the open message or reasoning item

    def event(self, kind: str, **data: Any) -> bytes:
        body = json.dumps({"type": kind, "sequence_number": self.seq, **data}, ensure_ascii=False)
        self.seq += 1
        return f"event: {kind}\ndata: {body}\n\n".encode()

    def delta(self, kind: str, piece: str) -> list[bytes]:
        item_type = "reasoning" if kind == "thinking" else "message"
        out = [] if self.open is not None and self.output[self.open]["type"] == item_type else \
            self.close("completed") + self.start(item_type)
        item = self.output[self.open]
        part = item["content"][0]
        part["text"] += piece
        ids = {"item_id": item["id"], "output_index": self.open, "content_index": 0}
        if item_type == "reasoning":
            return out + [self.event("response.reasoning_text.delta", **ids, delta=piece)]
        logprobs = self.tokens.take_logprobs(self.ctx)     # the tokens' that released this text, and before
        part["logprobs"] += logprobs
        return out + [self.event("response.output_text.delta", **ids, delta=piece, logprobs=logprobs)]

    def start(self, item_type: str) -> list[bytes]:
        item = (_reasoning_item if item_type == "reasoning" else _message_item)("", "in_progress")
        part = item.pop("content")[0]
        self.open = len(self.output)
        self.output.append(item)
        out = [self.event("response.output_item.added", output_index=self.open, item={**item, "content": []})]
        item["content"] = [part]
        return out + [self.event("response.content_part.added", item_id=item["id"], output_index=self.open,
                                 content_index=0, part=part)]

    def close(self, status: str) -> list[bytes]:
        if self.open is None:
            return []
        index, self.open = self.open, None
        item = self.output[index]
        part = item["content"][0]
        item["status"] = status
        ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
        if item["type"] == "reasoning":
            done = self.event("response.reasoning_text.done", **ids, text=part["text"])
        else:
            part["logprobs"] += self.tokens.take_logprobs(self.ctx)   # tokens that released no text
            done = self.event("response.output_text.done", **ids, text=part["text"], logprobs=part["logprobs"])
        return [done, self.event("response.content_part.done", **ids, part=part),
                self.event("response.output_item.done", output_index=index, item=item)]

    def call(self, call: dict) -> list[bytes]:
        out = self.close("completed")
        item = _call_item(call, "in_progress")
        index = len(self.output)
        self.output.append(item)
        args = item["arguments"]
        out.append(self.event("response.output_item.added", output_index=index, item={**item, "arguments": ""}))
        out.append(self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                              delta=args))
        out.append(self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                              arguments=args))
        item["status"] = "completed"
        return out + [self.event("response.output_item.done", output_index=index, item=item)]


async def stream_reply(request: web.Request, queue: asyncio.Queue, ctx,
                       fail: Callable[[ErrorEvent], APIError]) -> web.StreamResponse:
    """The Response as OpenAI's server-sent events: reasoning and message items as the text
    comes, each function call an item once it is whole (StreamParts), its arguments in one delta."""
    tokens = _Tokens()
    rid, items, parts = _new_id("resp"), _Items(ctx, tokens), StreamParts(ctx.plan)

    def on_event(ev) -> tuple[list[bytes], bool]:
        if isinstance(ev, ErrorEvent):
            e = fail(ev)
            return [items.event("error", code=e.code, message=e.message, param=e.param)], True
        tokens.feed(ev)
        out: list[bytes] = []
        for kind, part in parts.feed(ev):
            out += items.call(part) if kind == "call" else items.delta(kind, part)
        if not isinstance(ev, DoneEvent):
            return out, False
        ctx.done(ev)
        status = _status(ev)
        if not any(o["type"] != "reasoning" for o in items.output):   # an empty reply: its message
            out += items.close(status) + items.start("message")
        out += items.close(status)
        final = _response(ctx, rid, status, items.output, tokens.usage(ctx, ev))
        _keep(ctx, final)
        return out + [items.event(f"response.{status}", response=final)], True
    start = _response(ctx, rid, "in_progress", [], None)
    first = items.event("response.created", response=start) + items.event("response.in_progress", response=start)
    return await relay(request, queue, first, on_event)
