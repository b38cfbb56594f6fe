"""Running the server: `serve()` for the CLI (signals, background model load, graceful drain)
and `ServerThread` to embed it in an app or a test (own event loop, free loopback port)."""
from __future__ import annotations

import asyncio
import logging
import socket
import threading
from pathlib import Path
from typing import Callable

from aiohttp import web

from ..errors import EdgeInferError
from .app import DEFAULT_MAX_BODY, ServerState, create_app
from .lifecycle import drain, install_signals
from .registry import Registry, ServedModel

log = logging.getLogger("edgeinfer.server")


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(512)
    sock.setblocking(False)
    return sock


async def _start(state: ServerState, sock: socket.socket) -> web.AppRunner:
    runner = web.AppRunner(create_app(state), handler_cancellation=True, access_log=None,
                           shutdown_timeout=1.0)
    await runner.setup()
    site = web.SockSite(runner, sock)
    await site.start()
    return runner


class ServerThread:
    """The server on its own thread and event loop: `with ServerThread(engine) as srv: srv.url`.
    Several models: `ServerThread(models={"big": eng1, "small": eng2}, fallback="small")`
    (the first is the default model)."""

    def __init__(self, engine=None, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
                 max_body: int = DEFAULT_MAX_BODY, model_name: str | None = None,
                 drain_timeout_s: float = 10.0, models: dict | None = None, fallback: str | None = None,
                 fallback_ttft_s: float | None = None, lora_dir: str | None = None,
                 cors_origins: list[str] | None = None):
        registry = None
        if models is not None:
            if engine is not None:
                raise ValueError("give either engine or models, not both")
            registry = Registry([ServedModel(name, eng) for name, eng in models.items()], fallback=fallback,
                                fallback_ttft_s=fallback_ttft_s)
        elif fallback is not None:
            raise ValueError("a fallback needs several models (models={...})")
        self.state = ServerState(engine, model_name=model_name, api_key=api_key, max_body=max_body,
                                 registry=registry, lora_dir=lora_dir, cors_origins=cors_origins)
        self._sock = _bind(host, port)
        self.host, self.port = self._sock.getsockname()[:2]
        self.url = f"http://{host}:{self.port}"
        self.drain_timeout_s = drain_timeout_s
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._run, name="edgeinfer-server", daemon=True)
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._runner = self._loop.run_until_complete(_start(self.state, self._sock))
        except BaseException as e:  # pragma: no cover - reported by start()
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    def start(self) -> "ServerThread":
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        return self

    def stop(self, timeout_s: float | None = None) -> None:
        """Graceful: finish in-flight requests (up to the drain timeout), then stop."""
        if not self._thread.is_alive():
            return
        t = self.drain_timeout_s if timeout_s is None else timeout_s
        fut = asyncio.run_coroutine_threadsafe(drain(self.state, self._runner, t, close_engine=False),
                                               self._loop)
        try:
            fut.result(timeout=t + 30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def model_id(source: str) -> str:
    """The id a model is served under when not named: the known-model name, or the file's stem."""
    if "/" in source or source.endswith(".gguf"):
        return Path(source).stem
    return source


def serve(model: str | None = None, host: str = "127.0.0.1", port: int = 8080, n_slots: int = 4,
          n_ctx: int = 2048, n_threads: int | None = None, api_key: str | None = None,
          max_queue: int = 64, max_body: int = DEFAULT_MAX_BODY, drain_timeout_s: float = 30.0,
          overflow: str = "stop", max_batch: int = 256, kv_type: str = "f16", wait_for_model: bool = False,
          on_ready: Callable[[str], None] | None = None, models: list[tuple[str, str]] | None = None,
          fallback: str | None = None, fallback_ttft_s: float | None = None, speculative: str | None = None,
          draft: str | None = None, prompt_cache: str | None = None, loras: list[tuple[str, str]] | None = None,
          lora_dir: str | None = None, lora_bytes: int = 1 << 30, cors_origins: list[str] | None = None) -> None:
    """Blocks serving until SIGTERM / SIGINT. Listens at once; the models load in the
    background, one after the other (/ready answers 503 until all are ready). A model that
    fails to load stops the server with an EdgeInferError saying why, so a supervisor sees a
    non-zero exit; with `wait_for_model` the server keeps running instead, /ready answering
    503 with the error. `models`: (name, path or known name) pairs, the first the default;
    without it, the one `model` (None: the default model) under its own name. `speculative`
    and `draft` (docs/speculative.md) apply to the default model, and so does `prompt_cache` (a
    directory where prompt prefixes outlive the process; the slot routes' files), and so do the LoRA
    adapters `loras` ((name, path) pairs, at most `lora_bytes`) and `lora_dir` (where POST
    /v1/lora-adapters may load more from). `cors_origins`: the web origins whose pages may call
    the server ("*": any)."""
    from ..engine import Engine
    from ..hub import DEFAULT_MODEL

    if models is None:
        source = model or DEFAULT_MODEL
        models = [(model_id(source), source)]
        aliases = {models[0][0]: Registry.aliases_of(source)}
    else:
        aliases = {}
    registry = Registry([ServedModel(name, aliases=aliases.get(name)) for name, _ in models], fallback=fallback,
                        fallback_ttft_s=fallback_ttft_s)
    state = ServerState(api_key=api_key, max_body=max_body, registry=registry, lora_dir=lora_dir,
                        cors_origins=cors_origins)
    sock = _bind(host, port)
    listing = ", ".join(name if name == src else f"{name}={src}" for name, src in models)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        runner = await _start(state, sock)
        url = f"http://{host}:{sock.getsockname()[1]}"
        log.warning("edgeinfer serve: listening on %s (loading %s)", url, listing)
        stop, hurry = asyncio.Event(), asyncio.Event()
        install_signals(loop, stop, hurry)

        def _load(source: str):
            spec = (dict(speculative=speculative, draft=draft, prompt_cache=prompt_cache, loras=dict(loras or []),
                         lora_bytes=lora_bytes)
                    if source == models[0][1] else {})
            return Engine.load(source, n_ctx=n_ctx, n_threads=n_threads, n_slots=n_slots, overflow=overflow,
                               kv_type=kv_type, max_batch=max_batch, max_queue=max_queue, **spec)

        async def loader() -> None:
            for name, source in models:
                served = registry.models[name]
                try:
                    eng = await loop.run_in_executor(None, _load, source)
                except Exception as e:
                    log.error("loading %s failed: %s", source, e)
                    served.set_failed(f"{type(e).__name__}: {e}")
                    if not wait_for_model:
                        load_error.append((source, e))
                        stop.set()
                        return
                    continue
                if state.draining:
                    eng.close()
                    return
                served.set_engine(eng)
                info = eng.info()
                log.warning("ready: %s, %d slots x %d cells, KV arena %.1f MiB, %d threads (%s)",
                            name, info["n_slots"], info["n_ctx"], info["kv_bytes"] / 2**20,
                            info["n_threads"], info["isa"])
            if on_ready and state.status == "ready":
                on_ready(url)

        load_error: list[tuple[str, Exception]] = []
        load_task = asyncio.create_task(loader())
        await stop.wait()
        log.warning("shutting down: finishing in-flight requests (up to %.0f s)", drain_timeout_s)
        load_task.cancel()
        await drain(state, runner, drain_timeout_s, close_engine=True, hurry=hurry)
        log.warning("stopped")
        if load_error:
            source, e = load_error[0]
            raise EdgeInferError(f"the model {source} failed to load: {type(e).__name__}: {e}") from e

    asyncio.run(main())
