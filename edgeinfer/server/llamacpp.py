"""llama-server's own completion API (POST /completion and /infill) over the completion
machinery, for the clients written against it: llama.vim's and llama.vscode's code
completion, Continue's llama.cpp provider, and scripts that call llama-server.

Its request fields and sampling defaults (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05),
its lenient `logit_bias` and `stop`, its code-completion stops (`n_indent`, `t_max_predict_ms`),
its reply object (`content`, `stop_type`, `timings`, ...; `response_fields` picks from it) as
compact JSON (llama.vim matches `"content":` with no space), control tokens rendered as no
text, and its stream: one `data:` event per token, the last with `stop: true` and the timings,
no `[DONE]`. /infill builds llama.cpp's repo-level fill-in-the-middle prompt
(`edgeinfer.text.fim`); n_predict is a bound, cut to the room the prompt leaves; 0 evaluates
the prompt into the cache and generates nothing.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from typing import Any, Callable

from aiohttp import web

from ..engine import DoneEvent, ErrorEvent, TokenEvent
from .event_stream import relay
from .protocol import APIError, GenRequest, LlamaCppBody, bad, lora_refs, parse, parse_completion

__all__ = ["DEFAULTS", "parse_request", "reply", "stream_reply", "in_request_terms", "dumps", "Stops"]

# llama-server's sampling defaults (common_params_sampling)
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0,
            "penalty_last_n": 64, "presence_penalty": 0.0, "frequency_penalty": 0.0}
_STOP_TYPES = {"stop": "eos", "length": "limit"}
_NO_SLOT = -1          # llama.cpp's "any slot": requests are not pinned to one here
_BIAS = 100.0          # the bias range the sampler takes; false (llama.cpp's -inf) bans as -100 does


def dumps(obj: Any) -> bytes:
    """JSON as llama-server writes it: no spaces."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def in_request_terms(e: APIError, kind: str) -> None:
    """An error of the completion machinery, made to name these routes' fields; /infill on a
    model without FIM tokens is llama-server's 501."""
    if kind == "llama_infill" and e.param == "suffix":
        e.status, e.type, e.param = 501, "not_supported_error", "input_suffix"


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
        if isinstance(b.prompt, list) and len(b.prompt) > 1 and any(isinstance(p, (str, list)) for p in b.prompt):
            raise bad("one prompt per request here: 'prompt' is a string or token ids (/v1/completions takes a "
                      "list of prompts)", "prompt", "unsupported_value")
        req = parse_completion({"prompt": b.prompt}, eng.config.n_vocab)
    n_predict = b.n_predict if b.n_predict is not None else b.max_tokens
    n_predict = -1 if n_predict is None or n_predict < 0 else n_predict
    # 0: one token is generated so that the prompt is computed into the cache; it is not sent
    req.max_tokens = None if n_predict < 0 else max(n_predict, 1)
    req.model, req.stream, req.bound_max_tokens = b.model, bool(b.stream), True
    given = {"temperature": b.temperature, "top_k": b.top_k, "top_p": b.top_p, "min_p": b.min_p,
             "repeat_penalty": b.repeat_penalty, "penalty_last_n": b.repeat_last_n,
             "presence_penalty": b.presence_penalty, "frequency_penalty": b.frequency_penalty}
    req.sampling = {k: DEFAULTS[k] if v is None else v for k, v in given.items()}
    req.sampling["temperature"] = max(0.0, req.sampling["temperature"])     # <= 0: greedy
    req.sampling.update(seed=None if b.seed is None or b.seed < 0 else b.seed & 0xFFFF_FFFF_FFFF_FFFF,
                        stop=[s for s in b.stop or [] if s],
                        ignore_eos=bool(b.ignore_eos), logit_bias=_logit_bias(b.logit_bias, eng),
                        skip_special=True)
    req.constraint = {k: v for k, v in (("json_schema", b.json_schema), ("grammar", b.grammar)) if v is not None}
    req.n_logprobs = b.n_probs or None
    req.lora = lora_refs(b.lora)
    req.llama = {"return_tokens": bool(b.return_tokens), "response_fields": b.response_fields or [],
                 "n_predict": n_predict, "n_probs": b.n_probs or 0, "n_indent": b.n_indent or 0,
                 "t_max_predict_ms": b.t_max_predict_ms or 0}
    return req


def _logit_bias(given: dict | list | None, eng) -> dict | None:
    """llama-server's logit_bias as {id: bias}: a list of [id or text, bias] pairs or an object of
    id or text keys; a text's tokens each take the bias, false bans; entries it would skip
    (malformed, an id outside the vocabulary, `true`) are skipped."""
    if given is None:
        return None
    n_vocab = eng.config.n_vocab

    def ids(key, numeric_text: bool) -> list[int]:
        """A pair's token ids: an id; a text's tokens; an object's key read as an id when it is
        one (llama.cpp's strtol), else as a text."""
        if isinstance(key, int) and not isinstance(key, bool):
            return [key] if 0 <= key < n_vocab else []
        if isinstance(key, str):
            if numeric_text and _INT.fullmatch(key):
                return [int(key)] if 0 <= int(key) < n_vocab else []
            return eng.tokenize(key, add_special=False, parse_special=False)
        return []

    keyed = isinstance(given, dict)
    pairs = given.items() if keyed else [tuple(e) for e in given if isinstance(e, list) and len(e) == 2]
    out: dict = {}
    for key, value in pairs:
        if value is False:
            bias = -_BIAS
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            bias = min(max(float(value), -_BIAS), _BIAS)
        else:
            continue
        out.update({str(i): bias for i in ids(key, keyed)})
    return out


_INT = re.compile(r"[+-]?[0-9]+")


class Stops:
    """llama-server's stops for code completion. `n_indent`: a line after the first whose first
    character past its spaces and tabs (a new line too) sits left of column n_indent ends the
    reply there, that character and what follows cut. `t_max_predict_ms`: past that many
    milliseconds since the first token, the next token with a new line ends the reply."""

    def __init__(self, n_indent: int, t_max_predict_ms: int, clock: Callable[[], float] = time.monotonic):
        self.n_indent, self.t_max_ms, self.clock = n_indent, t_max_predict_ms, clock
        self.text = ""
        self.line = 0           # where the search for the next unchecked line's new line starts
        self.t0: float | None = None

    def feed(self, piece: str) -> tuple[str, bool]:
        """The part of `piece` the reply keeps, and whether the reply ends with it."""
        now = self.clock()
        self.t0 = now if self.t0 is None else self.t0
        start = len(self.text)
        self.text += piece
        cut = self._cut() if self.n_indent > 0 else None
        if cut is not None:
            self.text = self.text[:cut]
            return piece[:max(0, cut - start)], True
        late = self.t_max_ms > 0 and (now - self.t0) * 1e3 > self.t_max_ms
        return piece, late and "\n" in piece

    def _cut(self) -> int | None:
        while True:
            nl = self.text.find("\n", self.line)
            if nl < 0:
                return None
            pos = nl + 1
            while pos < len(self.text) and self.text[pos] in " \t":
                pos += 1
            if pos == len(self.text):
                return None         # the line's indentation may go on
            if pos - (nl + 1) < self.n_indent:
                return pos
            self.line = nl + 1


# --------------------------------------------------------------------------- replies

class _Run:
    """One reply as it comes: the text kept, the stream's events, the stops; `feed` each engine
    event, `final` the reply object once the end came."""

    def __init__(self, ctx, cancel: Callable[[], None]):
        self.ctx, self.cancel = ctx, cancel
        opts = ctx.req.llama
        self.prompt_only = opts["n_predict"] == 0
        self.stops = Stops(opts["n_indent"], opts["t_max_predict_ms"])
        self.text: list[str] = []
        self.tokens: list[int] = []
        self.probs: list = []
        self.cut = False            # a stop of ours ended it: what the engine still sends is dropped
        self.done: DoneEvent | None = None

    def feed(self, ev: TokenEvent | DoneEvent) -> list[dict]:
        """The stream events `ev` gives (a partial one per token; the tail of the end)."""
        if isinstance(ev, DoneEvent):
            self.done = ev
            # a stop of ours cancelled the sequence: counted as the limit it is, not as a cancel
            self.ctx.done(dataclasses.replace(ev, finish_reason="length") if self.cut else ev)
            return [] if self.cut or self.prompt_only or not ev.text else [self._partial(self._keep(ev.text), [])]
        if self.cut or self.prompt_only:
            return []
        piece = self._keep(ev.text)
        self.tokens.append(ev.token)
        probs = [ev.logprob] if ev.logprob is not None and self.ctx.req.n_logprobs else []
        self.probs += probs
        return [self._partial(piece, [ev.token], probs)]

    def _keep(self, piece: str) -> str:
        kept, ended = self.stops.feed(piece)
        self.text.append(kept)
        if ended:
            self.cut = True
            self.cancel()
        return kept

    def _partial(self, piece: str, tokens: list[int], probs: list | None = None) -> dict:
        return {"index": 0, "content": piece, "tokens": tokens, "stop": False, "id_slot": _NO_SLOT,
                "tokens_predicted": len(self.tokens), "tokens_evaluated": self.ctx.n_prompt,
                **(_probs(self.ctx, probs) if probs else {})}

    def final(self, streamed: bool) -> dict:
        """The reply object (the stream's last event, its `content` then empty, as llama-server's),
        cut to `response_fields` ("a/b" paths, each kept under its path) when they are given."""
        ctx, done = self.ctx, self.done
        text = "".join(self.text)
        stop_type = "limit" if self.cut or self.prompt_only else \
            "word" if done.stop_sequence else _STOP_TYPES.get(done.finish_reason, "none")
        out = {"index": 0, "content": "" if streamed else text,
               "tokens": self.tokens if ctx.req.llama["return_tokens"] and not streamed else [],
               "id_slot": _NO_SLOT, "stop": True, "model": ctx.model, "tokens_predicted": len(self.tokens),
               "tokens_evaluated": ctx.n_prompt, "generation_settings": _settings(ctx),
               "prompt": ctx.eng.detokenize(ctx.prompt_ids), "has_new_line": "\n" in text, "truncated": False,
               "stop_type": stop_type, "stopping_word": done.stop_sequence or "",
               "tokens_cached": ctx.n_prompt + len(self.tokens), "timings": _timings(ctx, done, len(self.tokens))}
        if self.probs and not streamed:
            out.update(_probs(ctx, self.probs))
        return _picked(out, ctx.req.llama["response_fields"])


def _probs(ctx, lps: list) -> dict:
    tok = ctx.eng.tokenizer

    def entry(t: int, lp: float) -> dict:
        b = tok.token_to_bytes(t)
        return {"id": t, "token": b.decode("utf-8", errors="replace"), "bytes": list(b), "logprob": lp}
    return {"completion_probabilities": [{**entry(x.token, x.logprob), "top_logprobs": [entry(t, l) for t, l in x.top]}
                                         for x in lps]}


def _timings(ctx, done: DoneEvent, n_out: int) -> dict:
    s = done.stats
    n_prompt = ctx.n_prompt - s.cached_tokens
    prompt_ms, predicted_ms = s.prefill_s * 1e3, s.decode_s * 1e3

    def per(ms: float, n: int) -> tuple[float, float]:
        return (ms / n, 1e3 * n / ms) if n and ms > 0 else (0.0, 0.0)
    p_tok, p_s = per(prompt_ms, n_prompt)
    g_tok, g_s = per(predicted_ms, n_out)
    return {"cache_n": s.cached_tokens, "prompt_n": n_prompt, "prompt_ms": prompt_ms, "prompt_per_token_ms": p_tok,
            "prompt_per_second": p_s, "predicted_n": n_out, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": g_tok, "predicted_per_second": g_s}


def _settings(ctx) -> dict:
    s, opts = ctx.req.sampling, ctx.req.llama
    return {"n_predict": opts["n_predict"], "seed": -1 if s["seed"] is None else s["seed"],
            "temperature": s["temperature"], "top_k": s["top_k"], "top_p": s["top_p"], "min_p": s["min_p"],
            "repeat_last_n": s["penalty_last_n"], "repeat_penalty": s["repeat_penalty"],
            "presence_penalty": s["presence_penalty"], "frequency_penalty": s["frequency_penalty"],
            "ignore_eos": s["ignore_eos"], "stop": s["stop"], "stream": ctx.req.stream, "n_probs": opts["n_probs"],
            "n_indent": opts["n_indent"], "t_max_predict_ms": opts["t_max_predict_ms"]}


_MISSING = object()


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


async def reply(queue: asyncio.Queue, ctx, fail: Callable[[ErrorEvent], APIError],
                cancel: Callable[[], None]) -> web.Response:
    """The whole reply of a request that is not streamed."""
    run = _Run(ctx, cancel)
    while run.done is None:
        _, events = await queue.get()
        for ev in events:
            if isinstance(ev, ErrorEvent):
                raise fail(ev)
            run.feed(ev)
    return web.Response(body=dumps(run.final(streamed=False)), content_type="application/json")


def _event(obj: dict) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


async def stream_reply(request: web.Request, queue: asyncio.Queue, ctx, fail: Callable[[ErrorEvent], APIError],
                       cancel: Callable[[], None]) -> web.StreamResponse:
    """A `data:` event per token, then the reply object with `stop: true` and empty content;
    an error is a last `data: {"error": ...}` event."""
    run = _Run(ctx, cancel)

    def on_event(ev) -> tuple[list[bytes], bool]:
        if isinstance(ev, ErrorEvent):
            return [_event(fail(ev).body())], True
        out = [_event(e) for e in run.feed(ev)]
        if run.done is None:
            return out, False
        return out + [_event(run.final(streamed=True))], True
    return await relay(request, queue, b"", on_event)
