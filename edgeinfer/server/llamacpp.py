"""llama-server's own completion API (POST /completion and /infill) over the completion
machinery, for the clients written against it: llama.vim's and llama.vscode's code
completion, Continue's llama.cpp provider, and scripts that call llama-server.

Its request fields and sampling defaults (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05),
its reply object (`content`, `stop_type`, `timings`, ...; `response_fields` picks from it),
and its stream: one `data:` event per piece of text, the last with `stop: true` and the
timings, no `[DONE]`. /infill builds llama.cpp's repo-level fill-in-the-middle prompt
(`edgeinfer.text.fim`); n_predict is a bound, cut to the room the prompt leaves.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, Callable

from aiohttp import web

from ..engine import DoneEvent, ErrorEvent, TokenEvent
from .event_stream import collect, relay
from .protocol import APIError, GenRequest, LlamaCppBody, bad, lora_refs, parse, parse_completion

__all__ = ["DEFAULTS", "parse_request", "reply", "stream_reply", "in_request_terms"]

# llama-server's sampling defaults (common_params_sampling)
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0,
            "penalty_last_n": 64, "presence_penalty": 0.0, "frequency_penalty": 0.0}
_STOP_TYPES = {"stop": "eos", "length": "limit"}
_NO_SLOT = -1          # llama.cpp's "any slot": requests are not pinned to one here


def in_request_terms(e: APIError, kind: str) -> None:
    """An error of the completion machinery, made to name /infill's fields."""
    if kind == "llama_infill" and e.param == "suffix":
        e.param = "input_suffix"


def parse_request(kind: str, body: Any, eng) -> GenRequest:
    """A /completion ("llama_completion") or /infill ("llama_infill") body as the completion
    request it asks for on `eng`; 400 naming the first bad field."""
    b = parse(LlamaCppBody, body)
    if kind == "llama_infill":
        for name in ("input_prefix", "input_suffix"):
            if getattr(b, name) is None:
                raise bad(f"'{name}' is required", name, "missing_required_parameter")
        if b.prompt is not None and not isinstance(b.prompt, str):
            raise bad("'prompt' must be a string (the start of the line being completed)", "prompt", "invalid_type")
        req = GenRequest("completion", b.model)
        req.fim = {"prefix": b.input_prefix, "suffix": b.input_suffix, "prompt": b.prompt or "",
                   "files": [(f.filename, f.text) for f in b.input_extra or []]}
    else:
        req = parse_completion({"prompt": b.prompt}, eng.config.n_vocab)
    n_predict = b.n_predict if b.n_predict is not None else b.max_tokens
    req.max_tokens = None if n_predict is None or n_predict < 0 else n_predict
    if req.max_tokens == 0:
        raise bad("'n_predict' must be -1 (no bound) or at least 1", "n_predict", "invalid_value")
    req.model, req.stream, req.bound_max_tokens = b.model, bool(b.stream), True
    given = {"temperature": b.temperature, "top_k": b.top_k, "top_p": b.top_p, "min_p": b.min_p,
             "repeat_penalty": b.repeat_penalty, "penalty_last_n": b.repeat_last_n,
             "presence_penalty": b.presence_penalty, "frequency_penalty": b.frequency_penalty}
    req.sampling = {k: DEFAULTS[k] if v is None else v for k, v in given.items()}
    req.sampling.update(seed=None if b.seed is None or b.seed < 0 else b.seed & 0xFFFF_FFFF_FFFF_FFFF,
                        stop=[s for s in b.stop or [] if s], ignore_eos=bool(b.ignore_eos),
                        logit_bias=_logit_bias(b.logit_bias, eng))
    req.constraint = {k: v for k, v in (("json_schema", b.json_schema), ("grammar", b.grammar)) if v is not None}
    req.n_logprobs = b.n_probs or None
    req.lora = lora_refs(b.lora)
    req.llama = {"return_tokens": bool(b.return_tokens), "response_fields": b.response_fields or [],
                 "n_predict": -1 if req.max_tokens is None else req.max_tokens, "n_probs": b.n_probs or 0}
    return req


def _logit_bias(given: dict | list | None, eng) -> dict | None:
    """llama.cpp's logit_bias as OpenAI's {id: bias}: an object of ids, or a list of [id or text,
    bias or false] pairs (a text's tokens each get the bias; false bans, as -100 does)."""
    if given is None or isinstance(given, dict):
        return given
    out: dict = {}
    for pair in given:
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], (int, str))
                and not isinstance(pair[0], bool) and isinstance(pair[1], (int, float))):
            raise bad("each 'logit_bias' entry is [token id or text, bias or false]", "logit_bias", "invalid_value")
        bias = -100.0 if pair[1] is False else float(pair[1])
        ids = [pair[0]] if isinstance(pair[0], int) else eng.tokenize(pair[0], add_special=False, parse_special=False)
        out.update({str(i): bias for i in ids})
    return out


# --------------------------------------------------------------------------- replies

def _probs(ctx, events: list) -> dict:
    """`completion_probabilities` of the tokens among `events` (when n_probs asked for them)."""
    if not ctx.req.n_logprobs:
        return {}
    tok = ctx.eng.tokenizer

    def entry(t: int, lp: float) -> dict:
        b = tok.token_to_bytes(t)
        return {"id": t, "token": b.decode("utf-8", errors="replace"), "bytes": list(b), "logprob": lp}
    lps = [ev.logprob for ev in events if isinstance(ev, TokenEvent) and ev.logprob is not None]
    return {"completion_probabilities": [{**entry(x.token, x.logprob), "top_logprobs": [entry(t, l) for t, l in x.top]}
                                         for x in lps]}


def _tokens(ctx, events: list) -> list[int]:
    return [ev.token for ev in events if isinstance(ev, TokenEvent)] if ctx.req.llama["return_tokens"] else []


def _timings(ctx, done: DoneEvent) -> dict:
    s = done.stats
    n_prompt = ctx.n_prompt - s.cached_tokens
    prompt_ms, predicted_ms = s.prefill_s * 1e3, s.decode_s * 1e3

    def per(ms: float, n: int) -> tuple[float, float]:
        return (ms / n, 1e3 * n / ms) if n and ms > 0 else (0.0, 0.0)
    p_tok, p_s = per(prompt_ms, n_prompt)
    g_tok, g_s = per(predicted_ms, s.completion_tokens)
    return {"cache_n": s.cached_tokens, "prompt_n": n_prompt, "prompt_ms": prompt_ms, "prompt_per_token_ms": p_tok,
            "prompt_per_second": p_s, "predicted_n": s.completion_tokens, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": g_tok, "predicted_per_second": g_s}


def _settings(ctx) -> dict:
    s = ctx.req.sampling
    return {"n_predict": ctx.req.llama["n_predict"], "seed": -1 if s["seed"] is None else s["seed"],
            "temperature": s["temperature"], "top_k": s["top_k"], "top_p": s["top_p"], "min_p": s["min_p"],
            "repeat_last_n": s["penalty_last_n"], "repeat_penalty": s["repeat_penalty"],
            "presence_penalty": s["presence_penalty"], "frequency_penalty": s["frequency_penalty"],
            "ignore_eos": s["ignore_eos"], "stop": s["stop"], "stream": ctx.req.stream,
            "n_probs": ctx.req.llama["n_probs"]}


def _final(ctx, text: str, done: DoneEvent, tokens: list[int], all_text: str) -> dict:
    """The reply object (the stream's last event, its `content` then empty), cut to
    `response_fields` ("a/b" paths, each kept under its path as the key) when they are given."""
    s = done.stats
    out = {"index": 0, "content": text, "tokens": tokens, "id_slot": _NO_SLOT, "stop": True, "model": ctx.model,
           "tokens_predicted": s.completion_tokens, "tokens_evaluated": ctx.n_prompt,
           "generation_settings": _settings(ctx), "prompt": ctx.eng.detokenize(ctx.prompt_ids),
           "has_new_line": "\n" in all_text, "truncated": False,
           "stop_type": "word" if done.stop_sequence else _STOP_TYPES.get(done.finish_reason, "none"),
           "stopping_word": done.stop_sequence or "", "tokens_cached": ctx.n_prompt + s.completion_tokens,
           "timings": _timings(ctx, done)}
    return _picked(out, ctx.req.llama["response_fields"])


def _picked(out: dict, paths: list[str]) -> dict:
    if not paths:
        return out
    picked = {}
    for path in paths:
        node: Any = out
        for key in path.split("/"):
            node = node.get(key, _MISSING) if isinstance(node, dict) else _MISSING
        if node is not _MISSING:
            picked[path] = node
    return picked


_MISSING = object()


async def reply(queue: asyncio.Queue, ctx, fail: Callable[[ErrorEvent], APIError]) -> dict:
    """The whole reply of a request that is not streamed."""
    events: list = []
    text, _, done = await collect(queue, ctx, fail, seen=events.append)
    return {**_final(ctx, text, done, _tokens(ctx, events), text), **_probs(ctx, events)}


def _event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


async def stream_reply(request: web.Request, queue: asyncio.Queue, ctx,
                       fail: Callable[[ErrorEvent], APIError]) -> web.StreamResponse:
    """A `data:` event per token that releases text (or with return_tokens or n_probs, per
    token), then the reply object with `stop: true` and empty content; an error is a last
    `data: {"error": ...}` event."""
    n_out, seen = 0, []

    def on_event(ev) -> tuple[list[bytes], bool]:
        nonlocal n_out
        if isinstance(ev, ErrorEvent):
            return [_event(fail(ev).body())], True
        seen.append(ev.text)
        out = []
        if isinstance(ev, TokenEvent):
            n_out += 1
        tokens, probs = _tokens(ctx, [ev]), _probs(ctx, [ev])
        if ev.text or tokens or probs.get("completion_probabilities"):
            out.append(_event({"index": 0, "content": ev.text, "tokens": tokens, "stop": False, "id_slot": _NO_SLOT,
                               "tokens_predicted": n_out, "tokens_evaluated": ctx.n_prompt, **probs}))
        if not isinstance(ev, DoneEvent):
            return out, False
        ctx.done(ev)
        return out + [_event(_final(ctx, "", ev, [], "".join(seen)))], True
    return await relay(request, queue, b"", on_event)
