"""`edgeinfer bench` (registered on the main app by cli.py); the measuring is in bench.py."""
from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from .errors import handle_errors, import_extra

__all__ = ["bench", "register"]


@handle_errors
def bench(
    model: Annotated[str, typer.Argument(help="A .gguf file or a known model name "
                                         "('default' = the shipped SmolLM2 Q4_1).")] = "default",
    threads: Annotated[str, typer.Option("--threads", "-t",
                                         help="Thread counts, comma-separated: each is run.")] = "2",
    pp: Annotated[int, typer.Option("--pp", "-p", help="Prompt tokens for prefill (ppN).")] = 512,
    tg: Annotated[int, typer.Option("--tg", "-n", help="Tokens to decode (tgN).")] = 128,
    reps: Annotated[int, typer.Option("--reps", "-r", help="Repetitions (median and spread).")] = 3,
    batch: Annotated[int, typer.Option("--batch", "-b", help="Prefill chunk (max_batch / "
                                       "llama.cpp n_batch and n_ubatch).")] = 512,
    ctx: Annotated[int, typer.Option("--ctx", "-c", help="Context cells for every engine; "
                                     "0 = the smallest multiple of 256 that fits.")] = 0,
    tg_prompt: Annotated[int, typer.Option("--tg-prompt", help="Short prompt (untimed) "
                                           "before tg.")] = 16,
    prompt_len: Annotated[int, typer.Option("--prompt-len", help="Prompt tokens for "
                                            "TTFT/TPOT.")] = 128,
    output_len: Annotated[int, typer.Option("--output-len", help="Output tokens for "
                                            "TTFT/TPOT.")] = 32,
    ctx_depth: Annotated[Optional[int], typer.Option("--ctx-depth", help="Also measure tg with "
                                                     "this many tokens already in context.")] = None,
    price_per_hour: Annotated[Optional[float], typer.Option(
        "--price-per-hour", help="Machine price per hour: adds cost per 1M output tokens.")] = None,
    compare: Annotated[Optional[list[str]], typer.Option(
        "--compare", help="Peer to measure interleaved in the same run: llama.cpp (flash attention on, "
                          "as its own tools run; llama.cpp:no-fa without) or "
                          "ort-genai:DIR (repeatable).")] = None,
    isa: Annotated[str, typer.Option("--isa", help="edgeinfer kernels: best, avx512, avx2, "
                                     "neon, scalar.")] = "best",
    kv: Annotated[str, typer.Option("--kv", help="KV arena type of every engine: f16, or q8_0 "
                                    "(llama.cpp: -fa -ctk q8_0 -ctv q8_0).")] = "f16",
    device: Annotated[str, typer.Option("--device", help="edgeinfer's device: cpu, cuda or auto "
                                        "(peers run on the CPU).")] = "cpu",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random prompt tokens.")] = 0,
    isolated_rss: Annotated[bool, typer.Option(
        "--isolated-rss/--no-isolated-rss",
        help="Measure each engine's peak RSS in a fresh child process (else process-wide).")] = True,
    process_per_engine: Annotated[bool, typer.Option(
        "--process-per-engine",
        help="Run each engine in a worker process of its own (same interleaved schedule), so that "
             "engines sharing one process cannot slow each other.")] = False,
    profile: Annotated[bool, typer.Option("--profile", help="Also profile an edgeinfer decode: ms, bytes "
                                          "and GB/s per forward stage (at --ctx-depth when given); then a "
                                          "pp-token prefill: ms, share and multiply-adds/s per stage.")] = False,
    floor: Annotated[Optional[float], typer.Option("--floor", help="The memory floor in GB/s "
                                                   "(scripts/memory_floor.py): each decode's share of it.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (every field; see "
                                          "edgeinfer/tools/bench.py) instead of a table.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr.")] = False,
    server: Annotated[Optional[str], typer.Option(
        "--server", help="Load-test a running server at this URL instead of a local model.")] = None,
    concurrency: Annotated[str, typer.Option("--concurrency", help="With --server: concurrency "
                                             "levels, comma-separated.")] = "1,2,4,8",
    requests: Annotated[int, typer.Option("--requests", help="With --server: requests per "
                                          "level.")] = 32,
    rate: Annotated[Optional[float], typer.Option("--rate", help="With --server: Poisson "
                                                  "arrivals at this many requests/s.")] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", help="With --server: draw latency "
                                                "against throughput to this PNG.")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="With --server: tokens per "
                                            "request.")] = 64,
    api_key: Annotated[Optional[str], typer.Option("--api-key", help="With --server: bearer "
                                                   "token.")] = None,
    speculative: Annotated[Optional[str], typer.Option(
        "--speculative", help="Speculative decoding against plain decoding (lookup or draft:PATH) on "
                              "a copy-heavy and a free-writing workload, interleaved; uses --threads "
                              "(first), --reps, --tg (tokens per run).")] = None,
) -> None:
    """Measure prefill/decode tokens/s, TTFT/TPOT, peak RSS and KV bytes (llama-bench style),
    or with --server the throughput and latency percentiles of a running server under load."""
    if server:
        import_extra("aiohttp", "server")   # the load generator's HTTP client
        from ..tools.loadbench import run_server_bench

        levels = [int(c) for c in concurrency.split(",") if c.strip()]
        run_server_bench(server, concurrency=levels, requests=requests, rate=rate, json=as_json,
                         plot=plot, max_tokens=max_tokens, api_key=api_key)
        return
    if speculative:
        _spec_bench(model, speculative, threads, reps, tg, as_json, quiet)
        return
    from ..tools.bench import BenchConfig, format_table, parse_threads, run_bench

    cfg = BenchConfig(model=model, threads=parse_threads(threads), pp=pp, tg=tg, reps=reps,
                      batch=batch, n_ctx=ctx, tg_prompt=tg_prompt, prompt_len=prompt_len,
                      output_len=output_len, ctx_depth=ctx_depth, price_per_hour=price_per_hour,
                      compare=list(compare or []), isa=isa, kv=kv, device=device, seed=seed,
                      isolated_rss=isolated_rss, process_per_engine=process_per_engine, profile=profile,
                      floor_gb_s=floor)
    log = None if quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    res = run_bench(cfg, log=log, command=["edgeinfer", "bench", *sys.argv[2:]]
                    if len(sys.argv) > 1 and sys.argv[1] == "bench" else None)
    out = res.to_json() if as_json else format_table(res)
    sys.stdout.write(out + "\n")
    sys.stdout.flush()


def _spec_bench(model: str, speculative: str, threads: str, reps: int, tg: int, as_json: bool,
                quiet: bool) -> None:
    import json

    from ..tools.bench import parse_threads
    from ..tools.specbench import format_spec_table, parse_mode, run_spec_bench, to_json

    try:
        parse_mode(speculative)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise typer.Exit(2) from None
    log = None if quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    rows = run_spec_bench(model, speculative, n_threads=parse_threads(threads)[0], reps=reps,
                          max_tokens=tg, log=log)
    sys.stdout.write((json.dumps(to_json(rows), indent=1) if as_json else format_spec_table(rows)) + "\n")
    sys.stdout.flush()


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
