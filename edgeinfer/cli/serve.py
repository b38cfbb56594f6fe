"""`edgeinfer serve` (registered on the main app by cli.py)."""
from __future__ import annotations

import logging
import sys
from typing import Annotated, Optional

import typer

from ..errors import EdgeInferError

__all__ = ["register", "serve_cmd"]


def serve_cmd(
    model: Annotated[Optional[str], typer.Argument(
        help="A .gguf file or a known model name; default: the default model (fetched on first use).")] = None,
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
                                                       "every request: lookup, or draft (needs --draft).")]
    = None,
    draft: Annotated[Optional[str], typer.Option("--draft", help="Draft model (a smaller GGUF with the "
                                                 "same vocabulary) for --speculative draft.")] = None,
) -> None:
    """Serve the model over an OpenAI-compatible HTTP API with continuous batching."""
    from ..server import serve

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
    if speculative not in (None, "lookup", "draft") or (speculative == "draft" and not draft):
        print("error: --speculative must be lookup, or draft with --draft PATH", file=sys.stderr)
        raise typer.Exit(2)
    try:
        serve(model, host=host, port=port, n_slots=slots, n_ctx=ctx, n_threads=threads, api_key=api_key,
              max_queue=max_queue, max_body=max_body, drain_timeout_s=drain_timeout, overflow=overflow,
              max_batch=max(max_batch, slots), kv_type=kv, wait_for_model=wait_for_model,
              speculative=speculative, draft=draft)
    except OSError as e:
        print(f"error: cannot listen on {host}:{port}: {e.strerror or e}", file=sys.stderr)
        raise typer.Exit(1) from None
    except EdgeInferError as e:
        print(f"error: {e}", file=sys.stderr)
        raise typer.Exit(1) from None


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_cmd)
