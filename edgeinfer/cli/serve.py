"""`edgeinfer serve` (registered on the main app by cli.py)."""
from __future__ import annotations

import logging
import os
import re
import sys
from typing import Annotated, Optional

import typer

from ..errors import EdgeInferError
from .errors import import_extra

__all__ = ["register", "serve_cmd", "parse_models"]

_NAMED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._:-]*)=(.+)$")   # NAME=PATH (a name has no '/' or '=')


def parse_models(positional: Optional[str], options: list[str]) -> list[tuple[str, str]] | None:
    """The served models as (name, source) pairs, the first the default; None: the one model
    of today's `serve [MODEL]` (named as before). `--model NAME=PATH` names it; a plain
    `--model PATH` (or known name) is served under its own id. ValueError for duplicates."""
    from ..server.runner import model_id

    given = ([positional] if positional else []) + list(options)
    if len(given) <= 1 and not any(_NAMED.match(g) for g in given):
        return None
    out: list[tuple[str, str]] = []
    for g in given:
        mt = _NAMED.match(g)
        out.append((mt.group(1), mt.group(2)) if mt else (model_id(g), g))
    names = [n for n, _ in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"two models are served under the name {dup[0]!r}: name them (--model NAME=PATH)")
    return out


def serve_cmd(
    model: Annotated[Optional[str], typer.Argument(
        help="A .gguf file or a known model name; default: the default model (fetched on first use).")] = None,
    models: Annotated[Optional[list[str]], typer.Option(
        "--model", "-m", help="A model to serve, as NAME=PATH (or a path / known name, served under its "
        "own id); repeat it to serve several at once (the first is the default). A request's 'model' "
        "picks one.")] = None,
    fallback: Annotated[Optional[str], typer.Option(
        "--fallback", help="NAME of a (smaller) served model that takes requests for the others when "
        "their queue is full, or their recent TTFT is over --fallback-ttft-ms.")] = None,
    fallback_ttft_ms: Annotated[Optional[float], typer.Option(
        "--fallback-ttft-ms", help="With --fallback: route to it while a model's median time to first "
        "token over the last 30 s exceeds this (ms).")] = None,
    memory: Annotated[Optional[str], typer.Option(
        "--memory", help="Memory budget the models must fit (plan's figures), e.g. 8GB, 7.5GiB; default "
        "with several models: the memory available now.")] = None,
    host: Annotated[str, typer.Option("--host", help="Address to bind (loopback unless told otherwise).")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="TCP port.")] = 8080,
    slots: Annotated[int, typer.Option("--slots", "-np", help="Sequences served at once (KV slots).")] = 4,
    ctx: Annotated[int, typer.Option("--ctx", "-c", "--n-ctx", help="Context per slot (KV cells).")] = 2048,
    threads: Annotated[Optional[int], typer.Option("--threads", "-t",
                                                   help="CPU threads; default = physical cores.")] = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="EDGEINFER_API_KEY",
                                                   help="Require 'Authorization: Bearer KEY' on every "
                                                        "route but /health.")] = None,
    max_queue: Annotated[int, typer.Option("--max-queue", help="Requests that may wait for a slot; "
                                           "past it: 429 with Retry-After.")] = 64,
    max_batch: Annotated[int, typer.Option("--max-batch", help="Tokens per engine step (decode + "
                                           "prefill chunks).")] = 256,
    max_body: Annotated[int, typer.Option("--max-body", help="Largest request body in bytes (413 past it).")]
    = 4 * 2**20,
    overflow: Annotated[str, typer.Option("--overflow", help="stop: refuse prompt + max_tokens beyond the "
                                          "context (400); slide: keep going in constant memory.")] = "stop",
    drain_timeout: Annotated[float, typer.Option("--drain-timeout", help="On SIGTERM, seconds to let "
                                                 "in-flight requests finish.")] = 30.0,
    kv: Annotated[str, typer.Option("--kv", help="KV arena type: f16, or q8_0 (half the memory, "
                                    "a little accuracy).")] = "f16",
    wait_for_model: Annotated[bool, typer.Option("--wait-for-model", help="Keep serving when the model "
                                                 "fails to load (/ready answers 503 with the reason) "
                                                 "instead of exiting with status 1.")] = False,
    speculative: Annotated[Optional[str], typer.Option("--speculative", help="Speculative decoding for "
                                                       "every request: lookup, draft (needs --draft), or mtp (a Qwen3.5 "
                                                       "file's own MTP block; CPU).")]
    = None,
    draft: Annotated[Optional[str], typer.Option("--draft", help="Draft model (a smaller GGUF with the "
                                                 "same vocabulary) for --speculative draft.")] = None,
    prompt_cache: Annotated[Optional[str], typer.Option("--prompt-cache", help="Directory where prompt prefixes' "
                                                 "KV cells outlive the process (the default model); the slot "
                                                 "routes' files live there.")] = None,
    lora: Annotated[Optional[list[str]], typer.Option(
        "--lora", help="A LoRA adapter of the default model, as NAME=PATH (a PEFT folder or a LoRA GGUF); "
        "repeat for several. A request runs with it when its 'model' is NAME (or its 'lora' lists it); the "
        "base weights are shared.")] = None,
    lora_dir: Annotated[Optional[str], typer.Option(
        "--lora-dir", help="Directory POST /v1/lora-adapters may load adapters from at run time (never "
        "outside it).")] = None,
    lora_budget: Annotated[str, typer.Option("--lora-budget", help="Most memory the adapters may take, "
                                             "e.g. 512MB.")] = "1GiB",
    cors_origin: Annotated[Optional[list[str]], typer.Option(
        "--cors-origin", help="A web origin whose pages may call the server from a browser (CORS), e.g. "
        "http://localhost:3000; repeat for several; '*' for any. Default: none.")] = None,
) -> None:
    """Serve the model over an OpenAI-compatible HTTP API with continuous batching."""
    serve = import_extra("edgeinfer.server", "server").serve

    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    if slots < 1 or ctx < 8 or max_queue < 0 or max_batch < 1 or max_body < 1024:
        print("error: need --slots >= 1, --ctx >= 8, --max-queue >= 0, --max-batch >= 1, "
              "--max-body >= 1024", file=sys.stderr)
        raise typer.Exit(2)
    if overflow not in ("stop", "slide"):
        print("error: --overflow must be stop or slide", file=sys.stderr)
        raise typer.Exit(2)
    if kv not in ("f16", "q8_0"):
        print("error: --kv must be f16 or q8_0", file=sys.stderr)
        raise typer.Exit(2)
    if speculative not in (None, "lookup", "draft", "mtp") or (speculative == "draft" and not draft):
        print("error: --speculative must be lookup, mtp, or draft with --draft PATH", file=sys.stderr)
        raise typer.Exit(2)
    try:
        served = parse_models(model, models or [])
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise typer.Exit(2) from None
    loras = []
    for item in lora or []:
        mt = _NAMED.match(item)
        if mt is None:
            print(f"error: --lora takes NAME=PATH, got {item!r}", file=sys.stderr)
            raise typer.Exit(2)
        loras.append((mt.group(1), mt.group(2)))
    if len({n for n, _ in loras}) != len(loras):
        print("error: two --lora adapters share a name", file=sys.stderr)
        raise typer.Exit(2)
    if lora_dir is not None and not os.path.isdir(lora_dir):
        print(f"error: --lora-dir {lora_dir} is not a directory", file=sys.stderr)
        raise typer.Exit(2)
    from ..tools.plan import parse_size
    try:
        lora_bytes = parse_size(lora_budget)
    except ValueError as e:
        print(f"error: --lora-budget: {e}", file=sys.stderr)
        raise typer.Exit(2) from None
    names = [n for n, _ in served] if served else []
    if fallback is not None and fallback not in names:
        print(f"error: --fallback {fallback!r} is not the name of a served model "
              f"({', '.join(names) or 'serve several: --model NAME=PATH ...'})", file=sys.stderr)
        raise typer.Exit(2)
    if fallback_ttft_ms is not None and (fallback is None or fallback_ttft_ms <= 0):
        print("error: --fallback-ttft-ms needs --fallback and a value > 0", file=sys.stderr)
        raise typer.Exit(2)
    if served is None and models:
        model = models[0]                  # one plain --model PATH: as the positional MODEL
    if (served and len(served) > 1) or memory is not None:
        from ..engine.kv import slack_cells   # a sliding ring allocates a few cells beyond its context

        _check_memory(served or [("", model)], memory, ctx + slack_cells(overflow, max(max_batch, slots)), slots, kv,
                      max(max_batch, slots), threads, wait_for_model,
                      adapter_bytes=lora_bytes if (loras or lora_dir) else 0, speculative=speculative)
    try:
        serve(model, models=served, fallback=fallback,
              fallback_ttft_s=None if fallback_ttft_ms is None else fallback_ttft_ms / 1000, host=host, port=port, n_slots=slots, n_ctx=ctx, n_threads=threads, api_key=api_key,
              max_queue=max_queue, max_body=max_body, drain_timeout_s=drain_timeout, overflow=overflow,
              max_batch=max(max_batch, slots), kv_type=kv, wait_for_model=wait_for_model,
              speculative=speculative, draft=draft, prompt_cache=prompt_cache, loras=loras, lora_dir=lora_dir,
              lora_bytes=lora_bytes, cors_origins=cors_origin)
    except OSError as e:
        print(f"error: cannot listen on {host}:{port}: {e.strerror or e}", file=sys.stderr)
        raise typer.Exit(1) from None
    except EdgeInferError as e:
        print(f"error: {e}", file=sys.stderr)
        raise typer.Exit(1) from None


def _check_memory(models: list[tuple[str, Optional[str]]], memory: Optional[str], ctx: int, slots: int,
                  kv: str, max_batch: int, threads: Optional[int], wait_for_model: bool,
                  adapter_bytes: int = 0, speculative: Optional[str] = None) -> None:
    """Before anything loads: do all the models fit the budget? Exit 1 naming the figures if
    not, or if a model cannot be read (the error says which; with --wait-for-model such a model
    is left out of the plan and fails at load, where the server reports it). With
    --speculative mtp the default model (the first, which drafts) counts its MTP block's ring,
    weights and buffers; a file without the block is left to fail at load with its own error."""
    from ..hub import DEFAULT_MODEL
    from ..tools import plan as P
    from ..tools.doctor import memory_report

    try:
        budget = P.parse_size(memory) if memory is not None else memory_report().get("available")
    except ValueError as e:
        print(f"error: --memory: {e}", file=sys.stderr)
        raise typer.Exit(2) from None
    if budget is None:
        return      # no budget given and none readable here: nothing to check against
    source = f"--memory {memory}" if memory is not None else "memory available now"
    shapes = []
    for name, src in models:
        try:
            shapes.append((name, P.model_shape(src or DEFAULT_MODEL)))
        except EdgeInferError as e:
            if wait_for_model:
                continue
            print(f"error: the model {src or DEFAULT_MODEL} failed to load: {type(e).__name__}: {e}",
                  file=sys.stderr)
            raise typer.Exit(1) from None
    if not shapes:
        return
    default = models[0][0]
    spec = {name: "mtp" for name, m in shapes
            if name == default and speculative == "mtp" and m.mtp is not None}
    try:
        p = P.check_serve(shapes, ctx, slots, kv, budget, max_batch, threads, budget_source=source,
                          adapter_bytes=adapter_bytes, speculative=spec)
    except EdgeInferError as e:
        print(f"error: {e}", file=sys.stderr)
        raise typer.Exit(1) from None
    logging.getLogger("edgeinfer.server").warning(
        "memory plan: %s of %s (%s): %s", P.human(p.total), P.human(budget), source, p.describe())


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_cmd)
