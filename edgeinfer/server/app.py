"""The aiohttp application: OpenAI (and Anthropic Messages) routes over the engine's
continuous-batching scheduler.

Handlers never run the model: they validate, tokenize (on one helper thread), submit to
the engine (`Engine.submit`) and relay its events. A client that goes away cancels its request
(aiohttp cancels the handler on disconnect), which frees the slot at the next step.
"""
from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import hmac
import itertools
import json
import logging
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from aiohttp import web

from ..engine import (AdapterBusyError, AdapterError, UnknownAdapterError, CacheFileError, ConstraintError, DoneEvent, ErrorEvent, QueueFullError, SamplingParams, SchedulerClosedError,
                      SlotBusyError, SlotFilesUnsupportedError, TokenEvent, TokenLogprob, ToolError, call_finish,
                      check_logit_bias, grammar_spec)
from ..errors import (ContextOverflowError, EdgeInferError, EmbeddingError, InfillError, InvalidTokenError, RerankError,
                      SamplingParamsError, TemplateError)
from . import anthropic, llamacpp, ollama, openai_responses
from .lifecycle import free_slots
from .metrics import Metrics
from .openapi import OPERATIONS, document
from .protocol import (APIError, DetokenizeBody, EmbeddingsBody, GenRequest, LoraLoadBody, OllamaEmbedBody,
                       OllamaEmbeddingsBody, OllamaShowBody, RerankBody, SlotBody, TokenizeBody, bad, parse, parse_chat,
                       parse_completion)
from .registry import Registry, ServedModel

log = logging.getLogger("edgeinfer.server")

DEFAULT_MAX_BODY = 4 * 2**20


class _WakingCount:
    """An int attribute of ServerState whose every change wakes ServerState.wait_until."""

    def __init__(self, doc: str):
        self.__doc__ = doc

    def __set_name__(self, owner, name: str) -> None:
        self.attr = "_" + name

    def __get__(self, state, owner=None):
        return self if state is None else getattr(state, self.attr)

    def __set__(self, state, n: int) -> None:
        with state._changed:
            setattr(state, self.attr, n)
            state._changed.notify_all()


class ServerState:
    """What the handlers share: the served models (server/registry.py; engines are None while
    loading), status, metrics, options. `engine` and `model_name` are the default model's."""

    def __init__(self, engine=None, model_name: str | None = None, api_key: str | None = None,
                 max_body: int = DEFAULT_MAX_BODY, registry: Registry | None = None, lora_dir: str | None = None,
                 cors_origins: list[str] | None = None):
        if registry is None:
            name = model_name or (engine.path.stem if engine is not None else "edgeinfer")
            registry = Registry([ServedModel(name, engine, Registry.aliases_of(name))])
        self.registry = registry
        self.api_key = api_key
        self.cors_origins = frozenset(cors_origins or ())   # the web origins whose pages may call ("*": any)
        self.lora_dir = lora_dir        # where POST /v1/lora-adapters may load adapters from (None: nowhere)
        self.max_body = max_body
        self._changed = threading.Condition()
        self._draining = False
        self._in_flight = self._admitted = 0
        self.metrics = Metrics(gauges=self.gauges)
        for m in registry:
            self.metrics.add_model(m.name)
        self.created = int(time.time())
        self.tok_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgeinfer-tok")
        self.responses = openai_responses.ResponseStore()   # /v1/responses kept for previous_response_id

    # in_flight, admitted and draining wake wait_until: an embedding app or a test waits on them, not on a clock
    in_flight = _WakingCount("HTTP generation requests submitted to an engine and not yet answered.")
    admitted = _WakingCount("Requests past admission (tokenizing, scoring, submitted): what a drain waits for.")

    @property
    def draining(self) -> bool:
        return self._draining

    @draining.setter
    def draining(self, on: bool) -> None:
        with self._changed:
            self._draining = on
            self._changed.notify_all()

    def wait_until(self, predicate: Callable[["ServerState"], bool], timeout_s: float) -> bool:
        """Blocks until `predicate(state)` holds after a change of in_flight or draining (or
        at once); False when `timeout_s` passes first."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self), timeout_s)

    @property
    def engine(self):
        return self.registry.default.engine

    @property
    def model_name(self) -> str:
        return self.registry.default.name

    @property
    def status(self) -> str:
        """draining; failed when a model failed to load; ready when every model is loaded."""
        if self.draining:
            return "draining"
        states = [m.status for m in self.registry]
        if "failed" in states:
            return "failed"
        return "ready" if all(s == "ready" for s in states) else "loading"

    @property
    def error(self) -> str | None:
        errors = [f"{m.name}: {m.error}" if len(self.registry) > 1 else m.error
                  for m in self.registry if m.error]
        return "; ".join(errors) or None

    def engines(self) -> dict[str, Any]:
        return {m.name: m.engine for m in self.registry if m.engine is not None}

    def gauges(self) -> dict[str, tuple[Any, str]]:
        """The gauges /metrics reports, read at each scrape (per model where they are a model's)."""
        g: dict[str, tuple[Any, str]] = {
            "edgeinfer_requests_in_flight": (self.in_flight, "HTTP generation requests being served."),
            "edgeinfer_ready": (1 if self.status == "ready" else 0, "1 when the server can serve.")}
        snaps = {name: eng.snapshot() for name, eng in self.engines().items()}
        if snaps:
            for key, name, help_ in (
                    ("slots_busy", "edgeinfer_slots_busy", "KV slots held by running sequences."),
                    ("slots_total", "edgeinfer_slots_total", "KV slots in the ring."),
                    ("queue_length", "edgeinfer_queue_length", "Requests waiting for a slot."),
                    ("max_queue", "edgeinfer_queue_capacity", "Bound of the waiting queue."),
                    ("kv_cells_used", "edgeinfer_kv_cells_used", "KV ring cells held by running sequences."),
                    ("kv_cells_total", "edgeinfer_kv_cells_total", "KV ring cells in all slots."),
                    ("steps", "edgeinfer_engine_steps", "Batched forward steps run so far."),
                    ("spec_proposed", "edgeinfer_spec_proposed_tokens", "Speculative draft tokens verified."),
                    ("spec_accepted", "edgeinfer_spec_accepted_tokens", "Speculative draft tokens accepted."),
                    ("spec_steps", "edgeinfer_spec_verify_steps", "Verify steps that carried draft tokens."),
                    ("spec_mean_k", "edgeinfer_spec_mean_k", "Mean draft tokens per verify step (the k chosen).")):
                g[name] = ({m: snap[key] for m, snap in snaps.items()}, help_)
            admitting = self.status == "ready"
            g["edgeinfer_slots_free"] = ({m: free_slots(snap, admitting) for m, snap in snaps.items()},
                                         "Slots a new request gets at once; 0 while not admitting (a router's "
                                         "load signal, with edgeinfer_queue_length).")
        return g

    def lookup(self, name: str | None) -> ServedModel:
        """The served model a request names (None: the default); 404 model_not_found otherwise."""
        return self.registry.lookup(name)

    def lookup_with_adapter(self, name: str | None) -> tuple[ServedModel, str | None]:
        """The served model a request names, or the model of the LoRA adapter it names (and that
        adapter's name); 404 model_not_found when neither."""
        try:
            return self.lookup(name), None
        except APIError:
            for m in self.registry:
                if m.engine is not None and name in m.engine.adapters.names():
                    return m, name
            raise

    def set_engine(self, engine) -> None:
        """The default model is loaded (the one-model server)."""
        self.registry.default.set_engine(engine)

    def set_failed(self, message: str) -> None:
        self.registry.default.set_failed(message)

    def check_draining(self) -> None:
        if self.draining:
            raise APIError(503, "the server is shutting down", type="server_error", code="shutting_down",
                           headers={"Retry-After": "5"})

    def require_engine(self, name: str | None = None):
        """The engine of the named model (None: the default), or 503 saying why there is none."""
        self.check_draining()
        return self.lookup(name).require()


STATE_KEY = web.AppKey("edgeinfer_state", ServerState)


def _json(data: Any, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(text=json.dumps(data, ensure_ascii=False), status=status,
                        content_type="application/json", headers=headers)


def error_response(e: APIError, path: str = "") -> web.Response:
    shape = _ERROR_SHAPES.get(_DIALECTS.get(path, "ollama" if path.startswith("/api/") else "openai"))
    return _json(shape(e) if shape else e.body(), status=e.status, headers=e.headers)


PUBLIC_PATHS = frozenset(op.path for op in OPERATIONS if op.public)   # answered without the API key
_DIALECTS = {op.path: op.dialect for op in OPERATIONS}                # whose shape a route's errors take
_ERROR_SHAPES = {"anthropic": anthropic.error_body, "ollama": ollama.error_body}
_HTTP_ERRORS = {404: ("not found", "not_found"), 405: ("method not allowed", "method_not_allowed"),
                413: ("request body too large", "request_too_large")}


def _origin_allowed(state: "ServerState", request: web.Request) -> bool:
    """Whether a browser page may call: a request without an Origin (no browser's, or a
    same-origin GET), one from the server's own origin, or one --cors-origin names."""
    origin = request.headers.get("Origin")
    return (origin is None or bool({"*", origin} & state.cors_origins)
            or origin.split("://", 1)[-1] == request.host)


async def _add_cors(request: web.Request, response: web.StreamResponse) -> None:
    """The CORS headers of every reply, a stream's too, before they go out (aiohttp's
    on_response_prepare): for a page of an origin --cors-origin names."""
    state: ServerState = request.app[STATE_KEY]
    origin = request.headers.get("Origin")
    if origin is None or not state.cors_origins:
        return
    response.headers["Vary"] = "Origin"            # the reply differs by origin: caches keep them apart
    if {"*", origin} & state.cors_origins:
        response.headers.update({"Access-Control-Allow-Origin": "*" if "*" in state.cors_origins else origin,
                                 "Access-Control-Expose-Headers": "Retry-After, WWW-Authenticate"})


def _preflight(request: web.Request) -> web.Response:
    """A browser's preflight (OPTIONS with Access-Control-Request-Method) from an allowed origin:
    204 with the methods and the headers it asked for."""
    return web.Response(status=204, headers={
        "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS", "Access-Control-Max-Age": "600",
        "Access-Control-Allow-Headers": request.headers.get("Access-Control-Request-Headers", "")})


@web.middleware
async def _middleware(request: web.Request, handler):
    state: ServerState = request.app[STATE_KEY]
    info = request.match_info.route.resource
    route = info.canonical if info is not None else "other"
    status = 500
    try:
        if not _origin_allowed(state, request):    # a page elsewhere: refused before anything runs
            raise APIError(403, f"the origin {request.headers['Origin']!r} may not call this server "
                                "(--cors-origin names those that may)", type="permission_error",
                           code="origin_not_allowed")
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            resp = _preflight(request)             # no API key: a browser sends none with it
            status = resp.status
            return resp
        if state.api_key is not None and request.path not in PUBLIC_PATHS:
            auth = request.headers.get("Authorization", "")
            key = request.headers.get("x-api-key", "")      # the Anthropic client's header
            if not (hmac.compare_digest(auth.encode(), f"Bearer {state.api_key}".encode())
                    or hmac.compare_digest(key.encode(), state.api_key.encode())):
                raise APIError(401, "invalid or missing API key (Authorization: Bearer ...)",
                               type="authentication_error", code="invalid_api_key",
                               headers={"WWW-Authenticate": "Bearer"})
        resp = await handler(request)
        status = resp.status
        return resp
    except APIError as e:
        status = e.status
        return error_response(e, request.path)
    except web.HTTPException as e:
        status = e.status
        msg, code = _HTTP_ERRORS.get(e.status, (e.reason, None))
        headers = {k: v for k, v in e.headers.items() if k.lower() == "allow"}
        return error_response(APIError(e.status, f"{msg}: {request.method} {request.path}",
                                       code=code, headers=headers), request.path)
    except asyncio.CancelledError:
        status = 499        # client closed the connection
        raise
    except Exception as e:  # pragma: no cover - a bug: answer 500, keep serving
        log.exception("unhandled error on %s", request.path)
        status = 500
        return error_response(APIError(500, f"internal error: {type(e).__name__}: {e}", type="server_error"),
                              request.path)
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
    """The server's state as /health and /ready report it, and whether it can serve (200):
    every model loaded and no engine failed."""
    if state.status != "ready":
        body = {"status": state.status}
        if state.error:
            body["error"] = state.error
        return body, 503
    engines = state.engines()
    for name, eng in engines.items():
        err = eng.health()
        if err is not None:
            return {"status": "failed", "error": f"{name}: {err}" if len(engines) > 1 else err}, 503
    snaps = [eng.snapshot() for eng in engines.values()]
    body = {"status": "ok", "slots_busy": sum(s["slots_busy"] for s in snaps),
            "slots_total": sum(s["slots_total"] for s in snaps),
            "queue_length": sum(s["queue_length"] for s in snaps)}
    if len(engines) > 1:
        body["models"] = {name: {k: snap[k] for k in ("slots_busy", "slots_total", "queue_length")}
                          for name, snap in zip(engines, snaps)}
    return body, 200


async def health(request: web.Request) -> web.Response:
    """Liveness: 200 while the process serves HTTP (loading, ready, waiting for a model that
    failed to load, draining); 503 only when an engine itself failed and a restart is due."""
    state: ServerState = request.app[STATE_KEY]
    body, _ = _serving_state(state)
    engine_failed = any(eng.health() is not None for eng in state.engines().values())
    return _json(body, status=503 if engine_failed else 200)


async def ready(request: web.Request) -> web.Response:
    """Readiness: 200 only when every model is loaded and requests will be served."""
    body, status = _serving_state(request.app[STATE_KEY])
    return _json(body, status=status)


def _model_object(state: ServerState, served: ServedModel, adapter: dict | None = None) -> dict:
    eng = served.engine
    meta = {"n_ctx": eng.n_ctx, "n_slots": eng.n_slots, "n_vocab": eng.config.n_vocab, "arch": eng.config.arch}
    if adapter is not None:
        meta.update(parent=served.name, lora_id=adapter["id"])
    return {"id": adapter["name"] if adapter else served.name, "object": "model", "created": state.created,
            "owned_by": "edgeinfer", "meta": meta}


async def models(request: web.Request) -> web.Response:
    """GET /v1/models: every loaded model, the default first, each followed by its LoRA adapters."""
    state: ServerState = request.app[STATE_KEY]
    data = []
    for m in state.registry:
        if m.engine is not None:
            data.append(_model_object(state, m))
            data += [_model_object(state, m, a) for a in m.engine.lora_adapters()]
    return _json({"object": "list", "data": data})


async def model(request: web.Request) -> web.Response:
    """GET /v1/models/{id}: a served model under any of its names, or a LoRA adapter; else 404 model_not_found."""
    state: ServerState = request.app[STATE_KEY]
    state.check_draining()
    served, adapter = state.lookup_with_adapter(request.match_info["model_id"])
    eng = served.require()
    info = next((a for a in eng.lora_adapters() if a["name"] == adapter), None) if adapter else None
    return _json(_model_object(state, served, info))


# --------------------------------------------------------------------------- LoRA adapters

def _adapter_out(served: ServedModel, a: dict) -> dict:
    return {**a, "model": served.name}


async def lora_list(request: web.Request) -> web.Response:
    """GET /v1/lora-adapters: the default model's loaded adapters."""
    state: ServerState = request.app[STATE_KEY]
    eng = state.require_engine()
    served = state.registry.default
    return _json({"object": "list", "data": [_adapter_out(served, a) for a in eng.lora_adapters()]})


async def lora_llama(request: web.Request) -> web.Response:
    """GET /lora-adapters (llama.cpp's): id, path, scale; scale 0: an adapter applies only to the requests
    that name it (by `model` or `lora`), never to all."""
    state: ServerState = request.app[STATE_KEY]
    eng = state.require_engine()
    return _json([{"id": a["id"], "path": a["path"], "scale": 0.0} for a in eng.lora_adapters()])


def _inside(root: str, relative: str) -> str:
    """The path `relative` names inside `root`, or 400 when it is absolute or leaves it."""
    if os.path.isabs(relative) or "\0" in relative:
        raise bad("path must be relative to the server's --lora-dir", "path", "invalid_value")
    base = os.path.realpath(root)
    full = os.path.realpath(os.path.join(base, relative))
    if os.path.commonpath([base, full]) != base or full == base:
        raise bad("path must name an adapter inside the server's --lora-dir", "path", "invalid_value")
    return full


async def lora_load(request: web.Request) -> web.Response:
    """POST /v1/lora-adapters {"name", "path"}: loads an adapter from inside --lora-dir for the default model."""
    state: ServerState = request.app[STATE_KEY]
    eng = state.require_engine()
    body = parse(LoraLoadBody, await _read_json(request, state))
    if state.lora_dir is None:
        raise APIError(501, "this server loads no adapters at run time: start it with --lora-dir DIR",
                       type="not_supported_error", code="not_supported")
    if not eng.caps.lora:
        raise APIError(501, f"the {eng.caps.device} runtime runs no LoRA adapters", type="not_supported_error",
                       code="not_supported")
    path = _inside(state.lora_dir, body.path)
    try:
        state.lookup(body.name)
    except APIError:
        pass
    else:
        raise bad(f"{body.name!r} is the name of a served model", "name", "invalid_value")
    loop = asyncio.get_running_loop()
    try:
        info = await loop.run_in_executor(None, eng.load_lora, body.name, path)
    except AdapterError as e:
        param = "name" if str(e).startswith(("adapter name", "an adapter named")) else "path"
        raise bad(str(e).replace(path, body.path), param, "invalid_value") from None
    return _json(_adapter_out(state.registry.default, info))


async def lora_unload(request: web.Request) -> web.Response:
    """DELETE /v1/lora-adapters/{name}."""
    state: ServerState = request.app[STATE_KEY]
    eng = state.require_engine()
    name = request.match_info["name"]
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(None, eng.unload_lora, name)
    except UnknownAdapterError as e:
        raise APIError(404, str(e), code="adapter_not_found") from None
    except AdapterBusyError as e:
        raise APIError(409, str(e), code="adapter_busy") from None
    return _json({"id": name, "object": "lora_adapter", "deleted": True})


async def metrics(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE_KEY]
    body, content_type = state.metrics.render(request.headers.get("Accept", ""))
    return web.Response(body=body, headers={"Content-Type": content_type, "X-Content-Type-Options": "nosniff"})


async def tokenize(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE_KEY]
    eng = state.require_engine()
    body = parse(TokenizeBody, await _read_json(request, state))
    loop = asyncio.get_running_loop()
    ids = await loop.run_in_executor(state.tok_pool, lambda: eng.tokenize(
        body.content, add_special=body.add_special, parse_special=body.parse_special))
    tokens = [{"id": i, "piece": _piece(eng, i)} for i in ids] if body.with_pieces else ids
    return _json({"tokens": tokens, "count": len(ids), "max_model_len": eng.n_ctx})


async def detokenize(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE_KEY]
    eng = state.require_engine()
    body = parse(DetokenizeBody, await _read_json(request, state))
    try:
        text = eng.detokenize(body.tokens)
    except InvalidTokenError as e:
        raise bad(str(e), "tokens", "invalid_token") from None
    return _json({"content": text, "prompt": text})      # llama-server's key and vLLM's


async def tokenizer_info(request: web.Request) -> web.Response:
    """GET /tokenizer_info (vLLM's): the default model's special tokens and chat template, which
    lm-evaluation-harness's remote tokenizer reads beside /tokenize and /detokenize."""
    eng = request.app[STATE_KEY].require_engine()
    tok = eng.tokenizer

    def text(i: int | None) -> str | None:
        return None if i is None else _piece(eng, i)
    return _json({"tokenizer_class": f"edgeinfer {tok.model}", "bos_token": text(tok.bos_id),
                  "eos_token": text(tok.eos_id), "pad_token": text(tok.pad_id), "unk_token": text(tok.unk_id),
                  "add_bos_token": tok.add_bos, "add_eos_token": tok.add_eos, "model_max_length": eng.n_ctx,
                  "chat_template": eng.template.source})


async def slot_action(request: web.Request) -> web.Response:
    """POST /slots/{id_slot}?action=save|restore|erase (llama.cpp's routes), on the default model."""
    state: ServerState = request.app[STATE_KEY]
    eng = state.require_engine()
    action = request.query.get("action")
    if action not in ("save", "restore", "erase"):
        raise bad("action must be save, restore or erase", "action")
    try:
        slot = int(request.match_info["id_slot"])
    except ValueError:
        raise bad("id_slot must be an integer", "id_slot") from None
    body = parse(SlotBody, await _read_json(request, state)) if request.can_read_body else SlotBody()
    if action != "erase" and not body.filename:
        raise bad(f"action={action} needs a filename", "filename")
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    try:
        if action == "save":
            n, size = await loop.run_in_executor(None, eng.save_slot, slot, body.filename)
            out = {"filename": body.filename, "n_saved": n, "n_written": size}
        elif action == "restore":
            n, size = await loop.run_in_executor(None, eng.restore_slot, slot, body.filename)
            out = {"filename": body.filename, "n_restored": n, "n_read": size}
        else:
            out = {"n_erased": await loop.run_in_executor(None, eng.erase_slot, slot)}
    except CacheFileError as e:
        raise bad(str(e), "filename" if action != "erase" else "id_slot") from None
    except SlotBusyError as e:
        raise APIError(409, str(e), code="slot_busy") from None
    except SlotFilesUnsupportedError as e:
        raise APIError(501, str(e), type="not_supported_error", code="not_supported") from None
    return _json({"id_slot": slot, **out, "timings": {f"{action}_ms": (time.perf_counter() - t0) * 1000}})


async def embeddings(request: web.Request) -> web.Response:
    """POST /v1/embeddings (OpenAI's): one unit-length vector per input."""
    state: ServerState = request.app[STATE_KEY]
    state.check_draining()
    body = parse(EmbeddingsBody, await _read_json(request, state))
    served = state.lookup(body.model)
    vectors, n_tokens = await _embed(state, served, body.items(), body.dimensions)
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
             if body.encoding_format == "base64" else v.tolist()} for i, v in enumerate(vectors)]
    return _json({"object": "list", "data": data, "model": served.name,
                  "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})


async def _embed(state: "ServerState", served: ServedModel, items: list, dimensions: int | None,
                 truncate: bool = False):
    """Unit-length vectors of `items` (texts or token ids) on `served`, and their tokens in all;
    `truncate`: an input longer than the context is cut to it (else a 400)."""
    eng = served.require()
    if not eng.caps.embeddings:
        raise APIError(501, f"the {eng.caps.device} backend gives no embeddings", type="not_supported_error",
                       code="not_supported")
    n_embd = eng.config.n_embd
    if dimensions is not None and dimensions != n_embd:
        raise bad(f"dimensions must be the model's width {n_embd} (no truncation), got {dimensions}",
                  "dimensions", "invalid_value")
    loop = asyncio.get_running_loop()
    state.admitted += 1                 # a drain waits for it from here, tokenizing included
    try:
        seqs = await loop.run_in_executor(state.tok_pool, lambda: [eng.tokenize(x) if isinstance(x, str) else x
                                                                   for x in items])
        if truncate:
            seqs = [ids[:eng.n_ctx] for ids in seqs]
        state.in_flight += 1
        try:
            vectors = await loop.run_in_executor(None, eng.embed, seqs)
        except ContextOverflowError as e:
            raise bad(str(e), "input", "context_length_exceeded") from None
        except (EmbeddingError, InvalidTokenError) as e:
            raise bad(str(e), "input", "invalid_value") from None
        finally:
            state.in_flight -= 1
    finally:
        state.admitted -= 1
    return vectors, sum(map(len, seqs))


async def rerank(request: web.Request) -> web.Response:
    """POST /rerank and its aliases: the documents by falling relevance to the query (a reranker's
    scores, Engine.rerank); with TEI's `texts`, TEI's bare list."""
    state: ServerState = request.app[STATE_KEY]
    state.check_draining()
    body = parse(RerankBody, await _read_json(request, state))
    texts = body.texts_ranked()
    served = state.lookup(body.model)
    eng = served.require()
    if not eng.reranks:
        raise bad(f"model '{served.name}' is not a reranker (no classification head and rerank template: "
                  f"convert a Qwen3-Reranker checkpoint)", "model", "model_not_supported")
    if not eng.caps.embeddings:
        raise APIError(501, f"the {eng.caps.device} backend gives no hidden states to rerank with",
                       type="not_supported_error", code="not_supported")
    state.admitted += 1                 # a drain waits for it from here, tokenizing included
    try:
        scores, prompts = await _rerank_admitted(state, eng, body, texts)
    finally:
        state.admitted -= 1
    order = sorted(range(len(texts)), key=lambda i: -float(scores[i]))[:body.top_n]
    if body.texts is not None:        # TEI's reply
        return _json([{"index": i, "score": float(scores[i]), **({"text": texts[i]} if body.return_text else {})}
                      for i in order])
    n_tokens = sum(map(len, prompts))
    results = [{"index": i, "relevance_score": float(scores[i]),
                **({"document": {"text": texts[i]}} if body.return_documents else {})} for i in order]
    return _json({"id": f"rerank-{uuid.uuid4().hex}", "object": "list", "model": served.name, "results": results,
                  "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})


async def _rerank_admitted(state: "ServerState", eng, body: RerankBody, texts: list[str]):
    loop = asyncio.get_running_loop()
    prompts = await loop.run_in_executor(state.tok_pool, lambda: [
        eng.rerank_ids(body.query, t, body.max_tokens_per_doc, body.truncate) for t in texts])
    field = "texts" if body.texts is not None else "documents"
    for i, ids in enumerate(prompts):
        if len(ids) > eng.n_ctx:
            raise bad(f"document {i} makes a prompt of {len(ids)} tokens, more than the context of {eng.n_ctx}",
                      f"{field}[{i}]", "context_length_exceeded")
    state.in_flight += 1
    try:
        return await loop.run_in_executor(None, eng.score_prompts, prompts), prompts
    except RerankError as e:
        raise bad(str(e), field, "invalid_value") from None
    finally:
        state.in_flight -= 1


# --------------------------------------------------------------------------- Ollama's routes

def _lookup_ollama(state: "ServerState", name: str | None) -> tuple[ServedModel, str | None]:
    """The served model (or adapter) an Ollama request names: its clients add the default tag
    `:latest` to a name that has none."""
    try:
        return state.lookup_with_adapter(name)
    except APIError:
        if name is None or not name.endswith(":latest"):
            raise
        return state.lookup_with_adapter(name.removesuffix(":latest"))


def _embedding_model(state: "ServerState", name: str) -> ServedModel:
    """The served model an Ollama embedding request names; a LoRA adapter's name is a 400, the
    vectors coming from the base weights."""
    served, adapter = _lookup_ollama(state, name)
    if adapter is not None:
        raise bad(f"'{name}' is a LoRA adapter: embeddings come from the base model '{served.name}'", "model",
                  "unsupported_value")
    return served


async def llama_completion(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "llama_completion")


async def llama_infill(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "llama_infill")


async def ollama_chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "ollama_chat")


async def ollama_generate(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "ollama_generate")


async def ollama_embed(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE_KEY]
    state.check_draining()
    t0 = time.perf_counter()
    body = parse(OllamaEmbedBody, await _read_json(request, state))
    served = _embedding_model(state, body.model)
    items = [body.input] if isinstance(body.input, str) else body.input or []
    if not any(items):             # Ollama's load request: no vectors
        return _json(ollama.embed_reply(body.model, [], 0, time.perf_counter() - t0))
    vectors, n_tokens = await _embed(state, served, items, None, truncate=body.truncate is not False)
    return _json(ollama.embed_reply(body.model, ollama.shortened(vectors, body.dimensions), n_tokens,
                                    time.perf_counter() - t0))


async def ollama_embeddings(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE_KEY]
    state.check_draining()
    body = parse(OllamaEmbeddingsBody, await _read_json(request, state))
    served = _embedding_model(state, body.model)
    if not body.prompt:            # Ollama's load request
        return _json({"embedding": []})
    vectors, _ = await _embed(state, served, [body.prompt], None, truncate=True)
    return _json({"embedding": vectors[0].tolist()})


async def ollama_tags(request: web.Request) -> web.Response:
    return _json(ollama.model_list(request.app[STATE_KEY].engines()))


async def ollama_ps(request: web.Request) -> web.Response:
    return _json(ollama.running(request.app[STATE_KEY].engines()))


async def ollama_show(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE_KEY]
    body = parse(OllamaShowBody, await _read_json(request, state))
    served, _ = _lookup_ollama(state, body.model)
    return _json(ollama.show(served.require(), body.verbose))


async def ollama_root(request: web.Request) -> web.Response:
    return web.Response(text="Ollama is running")     # the words Ollama's front ends probe for


async def ollama_version(request: web.Request) -> web.Response:
    return _json(ollama.version_reply())


def _piece(eng, token: int) -> str:
    return eng.tokenizer.token_to_bytes(token).decode("utf-8", errors="replace")


def _by_text(eng, top: list[tuple[int, float]]) -> dict[str, float]:
    """Alternatives keyed by their text, as the completions API gives them; tokens of the same
    text (byte pieces that render alike) keep the likelier one's value."""
    out: dict[str, float] = {}
    for t, lp in top:                  # most likely first
        out.setdefault(_piece(eng, t), lp)
    return out


# --------------------------------------------------------------------------- generation

async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def messages(request: web.Request) -> web.StreamResponse:
    """Anthropic's Messages API: the chat route's engine calls, Anthropic's shapes."""
    return await _generate(request, "messages")


async def create_response(request: web.Request) -> web.StreamResponse:
    """OpenAI's Responses API: the chat route's engine calls, the Responses shapes."""
    return await _generate(request, "responses")


def _not_kept(rid: str) -> APIError:
    return APIError(404, f"no kept response '{rid}'", param="response_id", code="response_not_found")


async def get_response(request: web.Request) -> web.Response:
    """GET /v1/responses/{response_id}: a kept Response."""
    rid = request.match_info["response_id"]
    kept = request.app[STATE_KEY].responses.get(rid)
    if kept is None:
        raise _not_kept(rid)
    return _json(kept[0])


async def delete_response(request: web.Request) -> web.Response:
    """DELETE /v1/responses/{response_id}: forgets a kept Response."""
    rid = request.match_info["response_id"]
    if not request.app[STATE_KEY].responses.delete(rid):
        raise _not_kept(rid)
    return _json({"id": rid, "object": "response", "deleted": True})


async def count_tokens(request: web.Request) -> web.Response:
    """The prompt tokens /v1/messages would use for the same body (its prompt_tokens)."""
    state: ServerState = request.app[STATE_KEY]
    state.check_draining()
    body = await _read_json(request, state)
    name = body.get("model") if isinstance(body, dict) else None
    eng = state.lookup(name if isinstance(name, str) else None).require()
    req = anthropic.parse_count_tokens(body)
    ids, _ = await asyncio.get_running_loop().run_in_executor(state.tok_pool, _prompt_ids, eng, req)
    return _json({"input_tokens": len(ids)})


def _prompt(eng, req: GenRequest):
    """The prompt ids, the max_tokens to generate with, checked by the engine, and the tool
    plan (None without tools); 400 naming the field when the template fails, the prompt is
    empty or does not fit the context."""
    param = "messages" if req.kind == "chat" else "prompt"
    ids, plan = _fitted_ids(eng, req) if req.trim_turns else _prompt_ids(eng, req)
    try:
        if req.bound_max_tokens:
            room = eng.check_prompt(ids)
            return ids, room if req.max_tokens is None else min(req.max_tokens, room), plan
        return ids, eng.check_prompt(ids, req.max_tokens), plan
    except ContextOverflowError as e:      # with a bound max_tokens, only the prompt can overflow
        raise bad(str(e), param if req.max_tokens is None or req.bound_max_tokens else "max_tokens",
                  "context_length_exceeded") from None
    except ValueError as e:
        raise bad(str(e), param, "empty_prompt") from None


def _fits(eng, ids: list[int]) -> bool:
    try:
        eng.check_prompt(ids)
    except ContextOverflowError:
        return False
    except ValueError:                 # empty: _prompt's 400
        pass
    return True


def _fitted_ids(eng, req: GenRequest):
    """The prompt ids and tool plan of a chat whose oldest exchanges after the leading system
    messages give way, whole (a user turn up to the next one, with its calls and their results),
    until the prompt fits the context (Ollama's truncation); the newest exchange stays, so a
    prompt that still does not fit is check_prompt's 400. The kept suffix is searched from the
    newest end (doubling, then halving), so the renders are of suffixes about the context's size
    and a long chat costs one whole render; `req` is left as it came (a fallback model trims
    for its own context)."""
    whole = _prompt_ids(eng, req)
    msgs = req.messages
    n_sys = next((i for i, m in enumerate(msgs) if m["role"] != "system"), len(msgs))
    starts = [i for i in range(n_sys + 1, len(msgs)) if msgs[i]["role"] == "user"]
    if _fits(eng, whole[0]) or not starts:
        return whole
    renders: dict[int, tuple] = {}

    def kept(k: int) -> tuple:         # the chat from the k-th exchange start on
        if k not in renders:
            renders[k] = _prompt_ids(eng, dataclasses.replace(req, messages=msgs[:n_sys] + msgs[starts[k]:]))
        return renders[k]

    fit, fail, step = len(starts) - 1, -1, 1     # fail: the whole chat (-1) does not fit
    if not _fits(eng, kept(fit)[0]):
        return kept(fit)
    while fit - step > fail:
        if not _fits(eng, kept(fit - step)[0]):
            fail = fit - step
            break
        fit, step = fit - step, step * 2
    while fit - fail > 1:
        mid = (fit + fail) // 2
        fit, fail = (mid, fail) if _fits(eng, kept(mid)[0]) else (fit, mid)
    return kept(fit)


def _prompt_ids(eng, req: GenRequest):
    """The prompt ids and the tool plan (None without tools), unchecked against the context."""
    param = "messages" if req.kind == "chat" else "prompt"
    plan = None
    try:
        if req.kind == "chat" and req.tools:
            try:
                plan = eng.tool_plan(req.messages, req.tools, req.tool_choice)
            except ToolError as e:
                raise bad(str(e), e.param, "invalid_value") from None
            ids = eng.chat_ids(plan.messages, **{**req.template_kwargs, **plan.render_extra})
        elif req.kind == "chat":
            ids = eng.chat_ids(req.messages, **req.template_kwargs)
        elif req.fim is not None:
            ids = eng.infill_ids(**req.fim, max_tokens=req.max_tokens)
        else:
            ids = req.prompt_ids if req.prompt_ids is not None else eng.tokenize(req.prompt_text)
    except InfillError as e:
        raise bad(str(e), "suffix", "unsupported_value") from None
    except TemplateError as e:
        raise bad(f"the chat template failed: {e}", "messages", "template_error") from None
    except ContextOverflowError as e:   # messages too large for any rendered prompt
        raise bad(str(e), param, "context_length_exceeded") from None
    return ids, plan


async def _echoes(eng, req: GenRequest, prompts: list[tuple], loop) -> list[tuple]:
    """Each prompt's echo (`_echo`), a batch's 400s naming the prompt."""
    out = []
    for k, (sub, ids, _, _) in enumerate(prompts):
        try:
            out.append(await _echo(eng, sub, ids, loop))
        except APIError as e:
            if req.batch:
                e.message, e.param = f"prompt[{k}]: {e.message}", f"prompt[{k}]" if e.param == "prompt" else e.param
            raise
    return out


async def _echo(eng, req: GenRequest, ids: list[int], loop) -> tuple[str, list[TokenLogprob] | None]:
    """An echoed prompt: its text (as given, or the ids' text) and, when the request asks for
    logprobs, each of its tokens' after the first (Engine.prompt_logprobs)."""
    text = req.prompt_text if req.prompt_text is not None else eng.detokenize(ids)
    if req.n_logprobs is None:
        return text, None
    try:
        lps = await loop.run_in_executor(None, eng.prompt_logprobs, ids, req.n_logprobs, req.lora or None)
    except AdapterError as e:
        raise bad(str(e), "lora", "invalid_value") from None
    except ContextOverflowError as e:      # a sliding ring takes longer prompts; scoring does not
        raise bad(str(e), "prompt", "context_length_exceeded") from None
    return text, lps


def _sibling_seeds(seed: int | None, n: int) -> list[int | None]:
    """The seeds of n sibling choices: the request's seed for the first (so n=1 and choice 0
    of n>1 agree) and distinct seeds derived from it for the others; None stays None (each
    sibling draws fresh entropy)."""
    if seed is None:
        return [None] * n
    return [seed] + [int.from_bytes(hashlib.blake2b(f"{seed}/{i}".encode(), digest_size=8).digest(), "little")
                     for i in range(1, n)]


_OLLAMA_KINDS = ("ollama_chat", "ollama_generate")
_LLAMA_KINDS = ("llama_completion", "llama_infill")


async def _generate(request: web.Request, kind: str) -> web.StreamResponse:
    try:
        return await _generate_as(request, kind)
    except APIError as e:
        if kind == "responses":
            openai_responses.in_request_terms(e)
        elif kind in _OLLAMA_KINDS:
            ollama.in_request_terms(e)
        elif kind in _LLAMA_KINDS:
            llamacpp.in_request_terms(e, kind)
        raise


async def _generate_as(request: web.Request, kind: str) -> web.StreamResponse:
    t_arrival = time.perf_counter()
    state: ServerState = request.app[STATE_KEY]
    state.check_draining()
    body = await _read_json(request, state)
    name = body.get("model") if isinstance(body, dict) else None
    lookup = _lookup_ollama if kind in _OLLAMA_KINDS else ServerState.lookup_with_adapter
    served, adapter = lookup(state, name if isinstance(name, str) else None)  # a non-string: 400 from parse
    eng = served.require()
    if kind == "messages":
        req = anthropic.parse_messages(body)
    elif kind in _OLLAMA_KINDS:
        req = ollama.parse_request(kind, body, eng)
        if isinstance(req, dict):      # a load request: its reply
            return _json(req)
    elif kind in _LLAMA_KINDS:
        req = llamacpp.parse_request(kind, body, eng)
    elif kind == "responses":
        req = openai_responses.parse_request(body, state.responses)
    else:
        req = parse_chat(body) if kind == "chat" else parse_completion(body, eng.config.n_vocab)
    if adapter is not None:
        for r in req.batch or [req]:       # a batch's: each prompt's (req shares the first one's list)
            r.lora.insert(0, {"name": adapter, "scale": 1.0})
        req.adapter = adapter
    loop = asyncio.get_running_loop()
    route = state.registry.route(served) if not req.lora else [(served, None)]   # adapters are the model's own
    if any(r.prompt_ids is not None for r in req.batch or [req]):   # ids belong to one vocabulary: no fallback
        route = [(m, r) for m, r in route if m.engine.config.n_vocab == eng.config.n_vocab]
    handles: list = []
    try:
        return await _run(request, state, kind, req, served, route, loop, t_arrival, handles)
    finally:
        for h in handles:
            h.cancel()                     # no-op when finished; frees the slot otherwise


async def _run(request, state: ServerState, kind: str, req: GenRequest, served: ServedModel, route: list,
               loop, t_arrival: float, handles: list) -> web.StreamResponse:
    """Submits the request's sequences to the first model of `route` that takes them, then
    relays their events."""
    state.admitted += 1                    # a drain waits for it from here (in_flight: once submitted)
    try:
        return await _run_admitted(request, state, kind, req, served, route, loop, t_arrival, handles)
    finally:
        state.admitted -= 1


async def _run_admitted(request, state: ServerState, kind: str, req: GenRequest, served: ServedModel, route: list,
                        loop, t_arrival: float, handles: list) -> web.StreamResponse:
    for i, (target, reason) in enumerate(route):
        eng = target.require()
        try:
            prompts = await _prepared(state, eng, req, loop)
            # an echoed prompt is scored first (a prompt at a time): its completion reuses its cells
            echo = await _echoes(eng, req, prompts, loop) if req.echo else None
        except APIError:
            if reason is not None and i + 1 < len(route):
                continue                   # a fallback model that cannot take it: the next route
            raise
        queue: asyncio.Queue = asyncio.Queue()
        try:
            for k, (sub, ids, params, _) in enumerate(prompts):
                await _submit(eng, ids, params, sub, loop, queue, t_arrival, handles, first_index=k * req.n)
        except QueueFullError as e:
            for h in handles:              # siblings that had started (their events go to this queue)
                h.cancel()
            handles.clear()
            if i + 1 < len(route):
                continue                   # the next route: the fallback model
            raise APIError(429, f"server busy: {e}", type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(max(1, round(e.retry_after_s)))}) from None
        except SchedulerClosedError as e:
            raise APIError(503, str(e), type="server_error", code="shutting_down",
                           headers={"Retry-After": "5"}) from None
        if reason is not None:
            state.metrics.count_fallback(served.name, target.name, reason)
        break
    state.in_flight += 1
    try:
        return await _reply(request, state, kind, req, target, prompts, echo, queue, handles)
    finally:
        state.in_flight -= 1


async def _prepared(state: ServerState, eng, req: GenRequest, loop) -> list[tuple]:
    """Each prompt's request, ids and choices' parameters on `eng`: one, or a completions batch's
    (their 400s name the prompt; more choices than the model holds at once is a 400 too)."""
    subs = req.batch or [req]
    if req.batch:
        room = eng.snapshot()["max_queue"] + eng.n_slots
        if len(subs) * req.n > room:
            raise bad(f"{len(subs)} prompts of {req.n} choices each are more than this model holds at once "
                      f"({room}: its slots and --max-queue)", "prompt", "unsupported_value")
    out = []
    for k, sub in enumerate(subs):
        try:
            ids, max_tokens, plan = await loop.run_in_executor(state.tok_pool, _prompt, eng, sub)
        except APIError as e:
            if req.batch:
                e.message = f"prompt[{k}]: {e.message}"
                e.param = f"prompt[{k}]" if e.param == "prompt" else e.param
            raise
        out.append((sub, ids, _params(eng, sub, plan, max_tokens, ids), plan))
    return out


async def _reply(request, state: ServerState, kind: str, req: GenRequest, target: ServedModel,
                 prompts: list[tuple], echo: list | None, queue: asyncio.Queue, handles: list) -> web.StreamResponse:
    """The reply in the route's shape, from the events of the submitted sequences."""
    def cancel() -> None:
        for h in handles:
            h.cancel()
    plan, params = prompts[-1][3], prompts[-1][2]
    ctx = _Ctx(state, target, req, [ids for _, ids, _, _ in prompts], kind, plan,
               reasoning=params[0].reasoning is not None, echo=echo)
    if kind == "messages" and req.stream:
        return await anthropic.stream_reply(request, queue, ctx, _engine_error)
    if kind == "messages":
        return _json(await anthropic.reply(queue, ctx, _engine_error))
    if kind == "responses" and req.stream:
        return await openai_responses.stream_reply(request, queue, ctx, _engine_error)
    if kind == "responses":
        return _json(await openai_responses.reply(queue, ctx, _engine_error))
    if kind in _OLLAMA_KINDS and req.stream:
        return await ollama.stream_reply(request, queue, ctx, _engine_error)
    if kind in _OLLAMA_KINDS:
        return _json(await ollama.reply(queue, ctx, _engine_error))
    if kind in _LLAMA_KINDS:           # its stops end a reply early: they cancel the sequence
        reply = llamacpp.stream_reply(request, queue, ctx, _engine_error, cancel) if req.stream else \
            llamacpp.reply(queue, ctx, _engine_error, cancel)
        return await reply
    if req.stream:
        return await _stream(request, queue, ctx)
    return await _collect(queue, ctx)


def _params(eng, req: GenRequest, plan, max_tokens: int | None, ids: list[int]) -> list[SamplingParams]:
    """The sampling parameters of each choice on `eng`: structured output (response_format,
    a forced tool call) and logit_bias checked against this model, a chat's thinking block
    (split from the answer, its budget); 400 naming the field."""
    sampling = dict(req.sampling)
    given = next(iter(req.constraint), None)      # the field to name in a 400
    if plan is not None and plan.spec is not None:   # a forced call: its grammar, which ends it
        if given is not None:
            raise bad(f"{given} cannot be combined with a forced tool call (tool_choice 'required' or "
                      "a named function)", given, "invalid_value")
        spec = plan.spec
        sampling["stop"] = []      # a stop string must not cut the call
    else:
        try:
            spec = grammar_spec(**req.constraint)
        except ConstraintError as e:
            raise bad(str(e), given if len(req.constraint) == 1 else None, "invalid_value") from None
    try:
        sampling["logit_bias"] = check_logit_bias(sampling.get("logit_bias"), eng.config.n_vocab)
    except SamplingParamsError as e:
        raise bad(str(e), "logit_bias", "invalid_value") from None
    reasoning = eng.reasoning_spec(ids, req.reasoning_budget) if req.kind == "chat" else None
    try:
        return [SamplingParams.from_dict({**sampling, "seed": seed}, max_tokens=max_tokens, grammar=spec,
                                         reasoning=reasoning)
                for seed in _sibling_seeds(sampling.get("seed"), req.n)]
    except SamplingParamsError as e:
        raise bad(str(e), code="invalid_value") from None


async def _submit(eng, ids: list[int], params: list[SamplingParams], req: GenRequest, loop,
                  queue: asyncio.Queue, t_arrival: float, handles: list, first_index: int = 0) -> None:
    """Submits one sequence per choice, appending each to `handles` (the caller cancels them);
    their events reach `queue` as (choice index, events), the indexes from `first_index` (a
    batch's later prompts). With n > 1 the first goes alone and the others once its prompt is
    in the KV cache, so the scheduler copies the prompt's cells into their slots instead of
    computing them again (Scheduler._running_prefix)."""
    first = asyncio.Event()
    for index, p in enumerate(params):
        def sink(events: list, index: int = index) -> None:   # called on the engine's delivery thread
            loop.call_soon_threadsafe(queue.put_nowait, (first_index + index, events))
            if index == 0:
                loop.call_soon_threadsafe(first.set)

        try:
            handles.append(eng.submit(ids, p, sink, n_logprobs=req.n_logprobs, t_arrival=t_arrival,
                                      lora=req.lora or None))
        except AdapterError as e:
            raise bad(str(e), "lora", "invalid_value") from None
        if index == 0 and len(params) > 1:
            await first.wait()             # the first token: the prompt has been computed


class _Ctx:
    def __init__(self, state: ServerState, served: ServedModel, req: GenRequest, prompts: list[list[int]], kind: str,
                 plan=None, reasoning: bool = False, echo: list[tuple[str, list[TokenLogprob] | None]] | None = None):
        """`prompts`: the ids of each prompt (a completions batch has several, each with its n
        choices, choice i of prompt k at index k * n + i); `echo`: each one's echoed text and
        logprobs."""
        self.state, self.served, self.req, self.kind = state, served, req, kind
        self.prompts, self.prompt_ids = prompts, prompts[0]
        self.n_prompt = sum(map(len, prompts))      # usage counts each prompt once
        self.n_choices = len(prompts) * req.n
        self.reasoning = reasoning          # a thinking block is split from the answer
        self.plan = plan if plan is not None and plan.active else None   # tool calls to read back
        self.eng = served.engine
        self.id = ("cmpl-" if kind == "completion" else "chatcmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model = req.adapter or served.name   # the model that serves it (the fallback's, when it fell back)
        self.text_offset = [0] * self.n_choices
        self.echo = echo                    # echoed prompts: their text and their tokens' logprobs

    def usage(self, stats: list) -> dict:
        """Usage of all choices: the prompt once, the completions summed (as OpenAI counts n)."""
        completion = sum(s.completion_tokens for s in stats)
        return {"prompt_tokens": self.n_prompt, "completion_tokens": completion,
                "total_tokens": self.n_prompt + completion,
                "prompt_tokens_details": {"cached_tokens": sum(st.cached_tokens for st in stats[::self.req.n])}}

    def chat_logprobs(self, lps: list[TokenLogprob]) -> dict:
        def entry(tok: int, lp: float) -> dict:
            b = self.eng.tokenizer.token_to_bytes(tok)
            return {"token": b.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(b)}
        return {"content": [{**entry(x.token, x.logprob), "top_logprobs": [entry(t, l) for t, l in x.top]}
                            for x in lps], "refusal": None}

    def completion_logprobs(self, lps: list[TokenLogprob], index: int) -> dict:
        tokens, offsets = [], []
        for x in lps:
            t = _piece(self.eng, x.token)
            tokens.append(t)
            offsets.append(self.text_offset[index])
            self.text_offset[index] += len(t)
        return {"tokens": tokens, "token_logprobs": [x.logprob for x in lps],
                "top_logprobs": [_by_text(self.eng, x.top) for x in lps],
                "text_offset": offsets}

    def echo_part(self, index: int) -> tuple[str, dict | None]:
        """The echoed prompt of a choice: its text and, with logprobs, its tokens' (the first
        without one, as OpenAI gives it), offsets counted from the prompt's start."""
        text, lps = self.echo[index // self.req.n]
        if lps is None:
            self.text_offset[index] = len(text)
            return text, None
        tokens = [_piece(self.eng, t) for t in self.prompts[index // self.req.n]]
        offsets = [0, *itertools.accumulate(map(len, tokens))]
        self.text_offset[index] = offsets.pop()
        return text, {"tokens": tokens, "token_logprobs": [None] + [x.logprob for x in lps],
                      "top_logprobs": [None] + [_by_text(self.eng, x.top) for x in lps],
                      "text_offset": offsets}

    def logprobs(self, lps: list[TokenLogprob], index: int = 0) -> dict | None:
        if self.req.n_logprobs is None:
            return None
        return self.chat_logprobs(lps) if self.kind == "chat" else self.completion_logprobs(lps, index)

    def done(self, ev: DoneEvent) -> None:
        self.state.metrics.observe_generation(ev.stats, ev.finish_reason, model=self.served.name)
        if ev.stats.completion_tokens > 0:
            self.served.observe_ttft(ev.stats.ttft_s)


def _engine_error(ev: ErrorEvent) -> APIError:
    if isinstance(ev.error, EdgeInferError):
        return APIError(500, f"generation failed: {ev.error}", type="server_error", code="engine_error")
    return APIError(500, f"generation failed: {type(ev.error).__name__}: {ev.error}", type="server_error")


async def _collect(queue: asyncio.Queue, ctx: _Ctx) -> web.Response:
    n = ctx.n_choices
    parts: list[list[str]] = [[] for _ in range(n)]
    thoughts: list[list[str]] = [[] for _ in range(n)]
    lps: list[list[TokenLogprob]] = [[] for _ in range(n)]
    done: dict[int, DoneEvent] = {}
    while len(done) < n:
        index, events = await queue.get()
        for ev in events:
            if isinstance(ev, (TokenEvent, DoneEvent)):
                thoughts[index].append(ev.reasoning)
            if isinstance(ev, TokenEvent):
                parts[index].append(ev.text)
                if ev.logprob is not None:
                    lps[index].append(ev.logprob)
            elif isinstance(ev, DoneEvent):
                parts[index].append(ev.text)
                lps[index] += _end_token(ctx, ev)
                ctx.done(ev)
                done[index] = ev
            elif isinstance(ev, ErrorEvent):
                raise _engine_error(ev)
    choices = []
    for i in range(n):
        text = "".join(parts[i])
        if ctx.kind == "chat":
            content, calls = ctx.plan.split(text) if ctx.plan is not None else (text, None)
            # with tools, no text is null content (as the streamed reply accumulates)
            msg = {"role": "assistant", "content": content if content or ctx.plan is None else None,
                   "refusal": None}
            if calls:
                msg["tool_calls"] = calls
            if ctx.reasoning:
                msg["reasoning_content"] = "".join(thoughts[i]) or None
            choices.append({"index": i, "message": msg, "logprobs": ctx.logprobs(lps[i], i),
                            "finish_reason": call_finish(done[i].finish_reason, calls)})
        else:
            echoed, echo_lps = ctx.echo_part(i) if ctx.echo is not None else ("", None)
            choices.append({"index": i, "text": echoed + text, "logprobs": _joined(echo_lps, ctx.logprobs(lps[i], i)),
                            "finish_reason": done[i].finish_reason})
    return _json({"id": ctx.id, "object": "chat.completion" if ctx.kind == "chat" else "text_completion",
                  "created": ctx.created, "model": ctx.model, "choices": choices,
                  "usage": ctx.usage([done[i].stats for i in range(n)]), "system_fingerprint": "edgeinfer"})


def _end_token(ctx: _Ctx, done: DoneEvent) -> list[TokenLogprob]:
    """An echoed completion's end-of-text token, which its logprobs list (as vLLM's and OpenAI's
    legacy completions do), so that a scoring client's last entry is always the generated token."""
    return [done.end_token] if ctx.echo is not None and done.end_token is not None else []


def _joined(first: dict | None, then: dict | None) -> dict | None:
    """Two runs of completion logprobs as one (an echoed prompt's, then the reply's)."""
    if first is None or then is None:
        return first or then
    return {k: first[k] + then[k] for k in first}


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


async def _stream(request: web.Request, queue: asyncio.Queue, ctx: _Ctx) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                       "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    chat = ctx.kind == "chat"
    inc = ctx.req.include_usage
    n = ctx.n_choices
    base = {"id": ctx.id, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": ctx.created, "model": ctx.model, "system_fingerprint": "edgeinfer"}

    def chunk(index: int, text: str | None, finish: str | None, lps: list[TokenLogprob] | None,
              first: bool = False) -> bytes:
        if chat:
            delta: dict = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {"index": index, "delta": delta, "logprobs": ctx.logprobs(lps, index) if lps else None,
                      "finish_reason": finish}
        else:
            choice = {"index": index, "text": text or "",
                      "logprobs": ctx.logprobs(lps, index) if lps else None, "finish_reason": finish}
        c = {**base, "choices": [choice]}
        if inc:
            c["usage"] = None
        return _sse(c)

    # With tools: a forced JSON call streams its arguments as they come (CallStreamer); a format
    # with call markers streams its text up to each call block and the block's calls once it
    # closes (CallScanner, as the whole reply is split); with a bare JSON call a reply that may
    # be a call is held back until it ends and is parsed, and one that starts like text streams
    # as content from there on.
    streamers = [ctx.plan.streamer() if ctx.plan is not None else None for _ in range(n)]
    scanners = [ctx.plan.scanner() if ctx.plan is not None else None for _ in range(n)]
    held: list[list[str] | None] = [[] if ctx.plan is not None and st is None and sc is None else None
                                    for st, sc in zip(streamers, scanners)]
    pending: list[list[TokenLogprob]] = [[] for _ in range(n)]   # logprobs of tokens not out yet

    def reasoning_delta(index: int, ev) -> list[bytes]:
        if not ev.reasoning:
            return []
        return [_sse({**base, "choices": [{"index": index, "delta": {"reasoning_content": ev.reasoning},
                                           "logprobs": None, "finish_reason": None}]})]

    def call_deltas(index: int, deltas: list[dict]) -> list[bytes]:
        return [_sse({**base, "choices": [{"index": index, "delta": {"tool_calls": [d]}, "logprobs": None,
                                           "finish_reason": None}]}) for d in deltas]

    def held_call(index: int, calls: list[dict]) -> list[bytes]:
        out = []
        for i, c in enumerate(calls):
            f = c["function"]
            at = c.get("index", i)
            out += call_deltas(index, [{"index": at, "id": c["id"], "type": "function",
                                        "function": {"name": f["name"], "arguments": ""}}])
            args = f["arguments"]
            out += call_deltas(index, [{"index": at, "function": {"arguments": args[j:j + 16]}}
                                       for j in range(0, len(args), 16)])
        return out

    def scanned(index: int, text: str, final: bool) -> list[bytes]:
        """The scanner's parts of `text` as content chunks and tool_calls deltas; the tokens'
        logprobs go out with the next content chunk."""
        out = []
        for kind, part in scanners[index].feed_parts(text, final):
            if kind == "text":
                out.append(chunk(index, part, None, pending[index]))
                pending[index] = []
            else:
                out += held_call(index, [part])
        return out

    done: dict[int, DoneEvent] = {}
    try:
        if ctx.echo is not None:           # the prompt first, in a chunk of its own per choice
            echoed = [ctx.echo_part(i) for i in range(n)]
            await resp.write(b"".join(_sse({**base, "choices": [{"index": i, "text": t, "logprobs": lp,
                                                                 "finish_reason": None}],
                                            **({"usage": None} if inc else {})})
                                      for i, (t, lp) in enumerate(echoed)))
        if chat:
            # a reply with tools has no content until text comes (null in the accumulated
            # message when it only calls, as the whole reply's)
            await resp.write(b"".join(chunk(i, "" if ctx.plan is None else None, None, None, first=True)
                                      for i in range(n)))
        while len(done) < n:
            index, events = await queue.get()
            out: list[bytes] = []
            failed = False
            for ev in events:
                st, sc, hd = streamers[index], scanners[index], held[index]
                if isinstance(ev, (TokenEvent, DoneEvent)):
                    out.extend(reasoning_delta(index, ev))
                if isinstance(ev, TokenEvent) and st is not None:
                    out.extend(call_deltas(index, st.feed(ev.text)))
                elif isinstance(ev, TokenEvent) and sc is not None:
                    if ev.logprob is not None:
                        pending[index].append(ev.logprob)
                    out.extend(scanned(index, ev.text, False))
                elif isinstance(ev, TokenEvent) and hd is not None:
                    hd.append(ev.text)
                    start = "".join(hd).lstrip()
                    if start and start[0] not in "{<[`":
                        out.append(chunk(index, "".join(hd), None, None))
                        held[index] = None
                elif isinstance(ev, TokenEvent):
                    if ev.text or ev.logprob is not None:
                        out.append(chunk(index, ev.text, None, [ev.logprob] if ev.logprob is not None else None))
                elif isinstance(ev, DoneEvent):
                    ctx.done(ev)
                    done[index] = ev
                    finish = ev.finish_reason
                    if st is not None:
                        out.extend(call_deltas(index, st.feed(ev.text, final=True)))
                        finish = call_finish(finish, st.call)
                    elif sc is not None:
                        out.extend(scanned(index, ev.text, True))
                        finish = call_finish(finish, sc.n_calls)
                    elif hd is not None:
                        text = "".join(hd) + ev.text
                        calls = ctx.plan.parse(text)
                        if calls:
                            out.extend(held_call(index, calls))
                            finish = call_finish(finish, calls)
                        elif text:
                            out.append(chunk(index, text, None, None))
                    elif ev.text:
                        out.append(chunk(index, ev.text, None, None))
                    out.append(chunk(index, None if chat else "", finish, pending[index] + _end_token(ctx, ev)))
                    pending[index] = []
                elif isinstance(ev, ErrorEvent):
                    out.append(_sse(_engine_error(ev).body()))
                    failed = True
                    break
            if len(done) == n and not failed:
                if inc:
                    out.append(_sse({**base, "choices": [], "usage": ctx.usage([done[i].stats for i in range(n)])}))
                out.append(b"data: [DONE]\n\n")
            if failed:
                out.append(b"data: [DONE]\n\n")
            if out:
                await resp.write(b"".join(out))
            if failed:
                break
        await resp.write_eof()
    except (ConnectionResetError, ConnectionError):
        log.debug("client went away during a stream")   # the caller cancels the request
    return resp


async def openapi(request: web.Request) -> web.Response:
    """GET /openapi.json: the contract of every route (server/openapi.py)."""
    return _json(document(auth=request.app[STATE_KEY].api_key is not None))


def create_app(state: ServerState) -> web.Application:
    app = web.Application(middlewares=[_middleware], client_max_size=state.max_body)
    app[STATE_KEY] = state
    app.on_response_prepare.append(_add_cors)
    for op in OPERATIONS:          # the routes the document lists, and only those
        handler = globals()[op.handler]
        if op.method == "GET":
            app.router.add_get(op.path, handler)      # HEAD too, as HTTP asks of GET
        else:
            app.router.add_route(op.method, op.path, handler)
    return app
