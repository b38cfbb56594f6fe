"""The aiohttp application: OpenAI routes over the engine's continuous-batching scheduler.

Handlers never run the model: they validate, tokenize (on one helper thread), submit to
`engine.scheduler` and relay its events. A client that goes away cancels its request
(aiohttp cancels the handler on disconnect), which frees the slot at the next step.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from ..engine.generation import DoneEvent, ErrorEvent, TokenEvent, TokenLogprob
from ..engine.sampling import SamplingParams
from ..engine.scheduler import QueueFullError, SchedulerClosedError
from ..errors import (ContextOverflowError, EdgeInferError, InvalidTokenError, SamplingParamsError,
                      TemplateError)
from ..hub import get_model_spec
from .metrics import Metrics
from .protocol import (APIError, DetokenizeBody, GenRequest, TokenizeBody, bad, parse, parse_chat,
                       parse_completion)

log = logging.getLogger("edgeinfer.server")

DEFAULT_MAX_BODY = 4 * 2**20


class ServerState:
    """What the handlers share: the engine (None while loading), status, metrics, options."""

    def __init__(self, engine=None, model_name: str | None = None, api_key: str | None = None,
                 max_body: int = DEFAULT_MAX_BODY):
        self.engine = engine
        self.model_name = model_name or (engine.path.stem if engine is not None else "edgeinfer")
        self.api_key = api_key
        self.max_body = max_body
        self.status = "ready" if engine is not None else "loading"
        self.error: str | None = None
        self.metrics = Metrics(gauges=self.gauges)
        self.created = int(time.time())
        self.in_flight = 0
        self.tok_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgeinfer-tok")

    def gauges(self) -> dict[str, tuple[float, str]]:
        """The gauges /metrics reports, read at each scrape."""
        g = {"edgeinfer_requests_in_flight": (self.in_flight, "HTTP generation requests being served."),
             "edgeinfer_ready": (1 if self.status == "ready" else 0, "1 when the server can serve.")}
        if self.engine is not None:
            snap = self.engine.scheduler.snapshot()
            g.update({
                "edgeinfer_slots_busy": (snap["slots_busy"], "KV slots held by running sequences."),
                "edgeinfer_slots_total": (snap["slots_total"], "KV slots in the ring."),
                "edgeinfer_queue_length": (snap["queue_length"], "Requests waiting for a slot."),
                "edgeinfer_queue_capacity": (snap["max_queue"], "Bound of the waiting queue."),
                "edgeinfer_kv_cells_used": (snap["kv_cells_used"], "KV ring cells held by running sequences."),
                "edgeinfer_kv_cells_total": (snap["kv_cells_total"], "KV ring cells in all slots."),
                "edgeinfer_engine_steps": (snap["steps"], "Batched forward steps run so far."),
            })
        return g

    def model_ids(self) -> set[str]:
        """The names a request may give for the served model: its id, and for a known model
        its canonical name and aliases."""
        spec = get_model_spec(self.model_name)
        return {self.model_name} | ({spec.name, *spec.aliases} if spec else set())

    def check_model(self, name: str | None) -> None:
        """404 model_not_found for a name this server does not serve (None: the served one)."""
        if name is not None and name not in self.model_ids():
            raise APIError(404, f"the model '{name}' does not exist here; this server serves "
                                f"'{self.model_name}' (GET /v1/models)", param="model", code="model_not_found")

    def set_engine(self, engine, model_name: str | None = None) -> None:
        self.engine = engine
        if model_name:
            self.model_name = model_name
        self.status = "ready"

    def set_failed(self, message: str) -> None:
        self.error = message
        self.status = "failed"

    def require_engine(self):
        if self.status == "draining":
            raise APIError(503, "the server is shutting down", type="server_error", code="shutting_down",
                           headers={"Retry-After": "5"})
        if self.status == "failed":
            raise APIError(503, f"the model failed to load: {self.error}", type="server_error",
                           code="model_failed")
        if self.engine is None:
            raise APIError(503, "the model is still loading", type="server_error", code="model_loading",
                           headers={"Retry-After": "2"})
        return self.engine


STATE_KEY = web.AppKey("edgeinfer_state", ServerState)


def _json(data: Any, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(text=json.dumps(data, ensure_ascii=False), status=status,
                        content_type="application/json", headers=headers)


def error_response(e: APIError) -> web.Response:
    return _json(e.body(), status=e.status, headers=e.headers)


_HTTP_ERRORS = {404: ("not found", "not_found"), 405: ("method not allowed", "method_not_allowed"),
                413: ("request body too large", "request_too_large")}


@web.middleware
async def _middleware(request: web.Request, handler):
    state: ServerState = request.app[STATE_KEY]
    info = request.match_info.route.resource
    route = info.canonical if info is not None else "other"
    status = 500
    try:
        if state.api_key is not None and request.path not in ("/health", "/ready"):
            auth = request.headers.get("Authorization", "")
            if not hmac.compare_digest(auth.encode(), f"Bearer {state.api_key}".encode()):
                raise APIError(401, "invalid or missing API key (Authorization: Bearer ...)",
                               type="authentication_error", code="invalid_api_key",
                               headers={"WWW-Authenticate": "Bearer"})
        resp = await handler(request)
        status = resp.status
        return resp
    except APIError as e:
        status = e.status
        return error_response(e)
    except web.HTTPException as e:
        status = e.status
        msg, code = _HTTP_ERRORS.get(e.status, (e.reason, None))
        headers = {k: v for k, v in e.headers.items() if k.lower() == "allow"}
        return error_response(APIError(e.status, f"{msg}: {request.method} {request.path}",
                                       code=code, headers=headers))
    except asyncio.CancelledError:
        status = 499        # client closed the connection
        raise
    except Exception as e:  # pragma: no cover - a bug: answer 500, keep serving
        log.exception("unhandled error on %s", request.path)
        status = 500
        return error_response(APIError(500, f"internal error: {type(e).__name__}: {e}", type="server_error"))
    finally:
        state.metrics.count_request(route, status)


async def _read_json(request: web.Request, state: ServerState) -> Any:
    if request.content_length is not None and request.content_length > state.max_body:
        raise APIError(413, f"request body of {request.content_length} bytes exceeds the limit of "
                            f"{state.max_body}", code="request_too_large")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise APIError(413, f"request body exceeds the limit of {state.max_body} bytes",
                       code="request_too_large") from None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"invalid JSON body: {e}", code="invalid_json") from None


# --------------------------------------------------------------------------- simple routes

def _serving_state(state: "ServerState") -> tuple[dict, int]:
    """The server's state as /health and /ready report it, and whether it can serve (200)."""
    if state.status != "ready" or state.engine is None:
        body = {"status": state.status}
        if state.error:
            body["error"] = state.error
        return body, 503
    sched = state.engine.scheduler
    if sched.failed is not None:
        return {"status": "failed", "error": str(sched.failed)}, 503
    snap = sched.snapshot()
    return {"status": "ok", "slots_busy": snap["slots_busy"], "slots_total": snap["slots_total"],
            "queue_length": snap["queue_length"]}, 200


async def health(request: web.Request) -> web.Response:
    """Liveness: 200 while the process serves HTTP (loading, ready, waiting for a model that
    failed to load, draining); 503 only when the engine itself failed and a restart is due."""
    state: ServerState = request.app[STATE_KEY]
    body, _ = _serving_state(state)
    engine_failed = state.engine is not None and state.engine.scheduler.failed is not None
    return _json(body, status=503 if engine_failed else 200)


async def ready(request: web.Request) -> web.Response:
    """Readiness: 200 only when a model is loaded and requests will be served."""
    body, status = _serving_state(request.app[STATE_KEY])
    return _json(body, status=status)


def _model_object(state: ServerState) -> dict:
    eng = state.engine
    return {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "edgeinfer",
            "meta": {"n_ctx": eng.n_ctx, "n_slots": eng.ring.n_slots, "n_vocab": eng.config.n_vocab,
                     "arch": eng.config.arch}}


async def models(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE_KEY]
    data = [_model_object(state)] if state.engine is not None else []
    return _json({"object": "list", "data": data})


async def model(request: web.Request) -> web.Response:
    """GET /v1/models/{id}: the served model under any of its names, else 404 model_not_found."""
    state: ServerState = request.app[STATE_KEY]
    state.require_engine()
    state.check_model(request.match_info["model_id"])
    return _json(_model_object(state))


async def metrics(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE_KEY]
    body, content_type = state.metrics.render(request.headers.get("Accept", ""))
    return web.Response(body=body, headers={"Content-Type": content_type, "X-Content-Type-Options": "nosniff"})


async def tokenize(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE_KEY]
    eng = state.require_engine()
    body = parse(TokenizeBody, await _read_json(request, state))
    loop = asyncio.get_running_loop()
    ids = await loop.run_in_executor(state.tok_pool,
                                     lambda: eng.tokenize(body.content, add_special=body.add_special))
    if body.with_pieces:
        return _json({"tokens": [{"id": i, "piece": _piece(eng, i)} for i in ids]})
    return _json({"tokens": ids})


async def detokenize(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE_KEY]
    eng = state.require_engine()
    body = parse(DetokenizeBody, await _read_json(request, state))
    try:
        text = eng.detokenize(body.tokens)
    except InvalidTokenError as e:
        raise bad(str(e), "tokens", "invalid_token") from None
    return _json({"content": text})


def _piece(eng, token: int) -> str:
    return eng.tokenizer.token_to_bytes(token).decode("utf-8", errors="replace")


# --------------------------------------------------------------------------- generation

async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


def _prompt(eng, req: GenRequest) -> tuple[list[int], int]:
    """The prompt ids and the max_tokens to generate with, checked by the engine; 400 naming
    the field when the template fails, the prompt is empty or does not fit the context."""
    param = "messages" if req.kind == "chat" else "prompt"
    try:
        if req.kind == "chat":
            ids = eng.chat_ids(req.messages, **req.template_kwargs)
        else:
            ids = req.prompt_ids if req.prompt_ids is not None else eng.tokenize(req.prompt_text)
    except TemplateError as e:
        raise bad(f"the chat template failed: {e}", "messages", "template_error") from None
    except ContextOverflowError as e:   # messages too large for any rendered prompt
        raise bad(str(e), param, "context_length_exceeded") from None
    try:
        return ids, eng.check_prompt(ids, req.max_tokens)
    except ContextOverflowError as e:
        raise bad(str(e), param if req.max_tokens is None else "max_tokens",
                  "context_length_exceeded") from None
    except ValueError as e:
        raise bad(str(e), param, "empty_prompt") from None


async def _generate(request: web.Request, kind: str) -> web.StreamResponse:
    t_arrival = time.perf_counter()
    state: ServerState = request.app[STATE_KEY]
    eng = state.require_engine()
    body = await _read_json(request, state)
    req = parse_chat(body) if kind == "chat" else parse_completion(body, eng.config.n_vocab)
    state.check_model(req.model)
    loop = asyncio.get_running_loop()
    ids, max_tokens = await loop.run_in_executor(state.tok_pool, _prompt, eng, req)
    try:
        params = SamplingParams.from_dict(req.sampling, max_tokens=max_tokens)
    except SamplingParamsError as e:
        raise bad(str(e), code="invalid_value") from None
    queue: asyncio.Queue = asyncio.Queue()

    def sink(events: list) -> None:       # called on the engine loop thread
        loop.call_soon_threadsafe(queue.put_nowait, events)

    state.require_engine()                 # draining may have started while tokenizing
    try:
        handle = eng.scheduler.submit(ids, params, sink, n_logprobs=req.n_logprobs, t_arrival=t_arrival)
    except QueueFullError as e:
        raise APIError(429, f"server busy: {e}", type="rate_limit_error", code="queue_full",
                       headers={"Retry-After": str(max(1, round(e.retry_after_s)))}) from None
    except SchedulerClosedError as e:
        raise APIError(503, str(e), type="server_error", code="shutting_down",
                       headers={"Retry-After": "5"}) from None
    state.in_flight += 1
    try:
        ctx = _Ctx(state, eng, req, len(ids), kind)
        if req.stream:
            return await _stream(request, queue, ctx)
        return await _collect(queue, ctx)
    finally:
        state.in_flight -= 1
        handle.cancel()                    # no-op when finished; frees the slot otherwise


class _Ctx:
    def __init__(self, state: ServerState, eng, req: GenRequest, n_prompt: int, kind: str):
        self.state, self.eng, self.req, self.n_prompt, self.kind = state, eng, req, n_prompt, kind
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model = state.model_name
        self.text_offset = 0

    def usage(self, stats) -> dict:
        return {"prompt_tokens": self.n_prompt, "completion_tokens": stats.completion_tokens,
                "total_tokens": self.n_prompt + stats.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": stats.cached_tokens}}

    def chat_logprobs(self, lps: list[TokenLogprob]) -> dict:
        def entry(tok: int, lp: float) -> dict:
            b = self.eng.tokenizer.token_to_bytes(tok)
            return {"token": b.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(b)}
        return {"content": [{**entry(x.token, x.logprob), "top_logprobs": [entry(t, l) for t, l in x.top]}
                            for x in lps], "refusal": None}

    def completion_logprobs(self, lps: list[TokenLogprob]) -> dict:
        tokens, offsets = [], []
        for x in lps:
            t = _piece(self.eng, x.token)
            tokens.append(t)
            offsets.append(self.text_offset)
            self.text_offset += len(t)
        return {"tokens": tokens, "token_logprobs": [x.logprob for x in lps],
                "top_logprobs": [{_piece(self.eng, t): l for t, l in x.top} for x in lps],
                "text_offset": offsets}

    def logprobs(self, lps: list[TokenLogprob]) -> dict | None:
        if self.req.n_logprobs is None:
            return None
        return self.chat_logprobs(lps) if self.kind == "chat" else self.completion_logprobs(lps)

    def done(self, ev: DoneEvent) -> None:
        self.state.metrics.observe_generation(ev.stats, ev.finish_reason)


def _engine_error(ev: ErrorEvent) -> APIError:
    if isinstance(ev.error, EdgeInferError):
        return APIError(500, f"generation failed: {ev.error}", type="server_error", code="engine_error")
    return APIError(500, f"generation failed: {type(ev.error).__name__}: {ev.error}", type="server_error")


async def _collect(queue: asyncio.Queue, ctx: _Ctx) -> web.Response:
    parts: list[str] = []
    lps: list[TokenLogprob] = []
    while True:
        events = await queue.get()
        for ev in events:
            if isinstance(ev, TokenEvent):
                parts.append(ev.text)
                if ev.logprob is not None:
                    lps.append(ev.logprob)
            elif isinstance(ev, DoneEvent):
                parts.append(ev.text)
                ctx.done(ev)
                text = "".join(parts)
                if ctx.kind == "chat":
                    choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                              "logprobs": ctx.logprobs(lps), "finish_reason": ev.finish_reason}
                    obj = "chat.completion"
                else:
                    choice = {"index": 0, "text": text, "logprobs": ctx.logprobs(lps),
                              "finish_reason": ev.finish_reason}
                    obj = "text_completion"
                return _json({"id": ctx.id, "object": obj, "created": ctx.created, "model": ctx.model,
                              "choices": [choice], "usage": ctx.usage(ev.stats),
                              "system_fingerprint": "edgeinfer"})
            elif isinstance(ev, ErrorEvent):
                raise _engine_error(ev)


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


async def _stream(request: web.Request, queue: asyncio.Queue, ctx: _Ctx) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                       "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    chat = ctx.kind == "chat"
    inc = ctx.req.include_usage
    base = {"id": ctx.id, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": ctx.created, "model": ctx.model, "system_fingerprint": "edgeinfer"}

    def chunk(text: str | None, finish: str | None, lps: list[TokenLogprob] | None, first: bool = False) -> bytes:
        if chat:
            delta: dict = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": ctx.logprobs(lps) if lps else None,
                      "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": ctx.logprobs(lps) if lps else None,
                      "finish_reason": finish}
        c = {**base, "choices": [choice]}
        if inc:
            c["usage"] = None
        return _sse(c)

    try:
        if chat:
            await resp.write(chunk("", None, None, first=True))
        while True:
            events = await queue.get()
            out: list[bytes] = []
            finished = False
            for ev in events:
                if isinstance(ev, TokenEvent):
                    if ev.text or ev.logprob is not None:
                        out.append(chunk(ev.text, None, [ev.logprob] if ev.logprob is not None else None))
                elif isinstance(ev, DoneEvent):
                    ctx.done(ev)
                    if ev.text:
                        out.append(chunk(ev.text, None, None))
                    out.append(chunk(None if chat else "", ev.finish_reason, None))
                    if inc:
                        out.append(_sse({**base, "choices": [], "usage": ctx.usage(ev.stats)}))
                    out.append(b"data: [DONE]\n\n")
                    finished = True
                elif isinstance(ev, ErrorEvent):
                    out.append(_sse(_engine_error(ev).body()))
                    out.append(b"data: [DONE]\n\n")
                    finished = True
            if out:
                await resp.write(b"".join(out))
            if finished:
                break
        await resp.write_eof()
    except (ConnectionResetError, ConnectionError):
        log.debug("client went away during a stream")   # the caller cancels the request
    return resp


def create_app(state: ServerState) -> web.Application:
    app = web.Application(middlewares=[_middleware], client_max_size=state.max_body)
    app[STATE_KEY] = state
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{model_id}", model)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    return app
