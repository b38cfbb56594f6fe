"""The `edgeinfer` command line: run, chat, info, pull, models.

Every command turns an EdgeInferError into one ``error: ...`` message on stderr and exit
code 1 (no traceback); Ctrl-C exits with 130. Generated text goes to stdout, everything
else (progress, stats, prompts) to stderr, so ``edgeinfer run ... > out.txt`` keeps only
the text.

``run`` feeds the prompt as raw text by default (like llama-cli's ``-no-cnv``); ``--chat``
wraps it as a user message in the model's chat template. ``chat`` always uses the template.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Annotated, Any, Iterable, Optional

import typer

from .errors import handle_errors
from ..errors import EdgeInferError
from ..hub import DEFAULT_MODEL

app = typer.Typer(
    name="edgeinfer",
    help="Run GGUF language models on edgeinfer's own native kernels.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
)


# --------------------------------------------------------------------------- plumbing

def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _load_engine(model: str, ctx: int, threads: Optional[int], device: str, kv: str = "f16"):
    from .. import load
    from ..hub import resolve_model

    path = resolve_model(model)  # a clear ModelNotFoundError before anything heavy
    return load(str(path), n_ctx=ctx, n_threads=threads, device=device, kv_type=kv)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _get(obj: Any, key: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, key, None)


def _sampling_kwargs(max_tokens, temp, seed, top_k, top_p, min_p, repeat_penalty, stop,
                     ignore_eos) -> dict:
    kw: dict[str, Any] = dict(max_tokens=max_tokens, temperature=temp, seed=seed, top_k=top_k,
                              top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty)
    if stop:
        kw["stop"] = list(stop)
    if ignore_eos:
        kw["ignore_eos"] = True
    return kw


class _Timed:
    """Streams pieces to stdout, timing the first piece and the rest."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.t_first: Optional[float] = None
        self.t_end: Optional[float] = None
        self.pieces = 0
        self.text: list[str] = []

    def pump(self, gen: Iterable[str]) -> str:
        try:
            for piece in gen:
                if not piece:
                    continue
                if self.t_first is None:
                    self.t_first = time.perf_counter()
                self.pieces += 1
                self.text.append(piece)
                _write(piece)
        finally:
            self.t_end = time.perf_counter()
        return "".join(self.text)


def _stats_line(gen: Any, eng: Any, timed: _Timed, prompt_tokens_guess: Optional[int]) -> str:
    """One line: prompt tokens, TTFT, completion tokens, tokens/s.

    Uses the engine's own stats when the stream exposes them (``gen.stats`` or
    ``eng.last_stats``: prompt_tokens, completion_tokens, ttft_s, tpot_s), else what the
    CLI measured (pieces counted as tokens, marked with ``~``).
    """
    stats = _get(gen, "stats") or _get(eng, "last_stats")
    pt = _get(stats, "prompt_tokens")
    ct = _get(stats, "completion_tokens")
    ttft = _get(stats, "ttft_s")
    tpot = _get(stats, "tpot_s")
    approx = ""
    if pt is None:
        pt = prompt_tokens_guess
    if ct is None:
        ct, approx = timed.pieces, "~"
    if ttft is None and timed.t_first is not None:
        ttft = timed.t_first - timed.t0
    if tpot is None and timed.t_first is not None and timed.t_end is not None and ct and ct > 1:
        tpot = (timed.t_end - timed.t_first) / (ct - 1)
    parts = [f"prompt {pt if pt is not None else '?'} tok"]
    parts.append(f"TTFT {ttft * 1e3:.1f} ms" if ttft is not None else "TTFT -")
    gen_part = f"{approx}{ct} tok"
    if tpot:
        gen_part += f", {1.0 / tpot:.1f} tok/s (TPOT {tpot * 1e3:.1f} ms)"
    parts.append("generated " + gen_part)
    finish = _get(stats, "finish_reason") or _get(gen, "finish_reason")
    if finish:
        parts.append(f"finish {finish}")
    return " | ".join(parts)


def _read_prompt(prompt: Optional[str], file: Optional[str]) -> str:
    if prompt is not None and file is not None:
        raise EdgeInferError("give either -p/--prompt or -f/--file, not both")
    if file is not None:
        try:
            if file == "-":
                return sys.stdin.read()
            with open(file, encoding="utf-8") as f:
                return f.read()
        except OSError as e:
            raise EdgeInferError(f"cannot read prompt file {file!r}: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise EdgeInferError(f"prompt file {file!r} is not UTF-8: {e}") from None
    if prompt is not None:
        return prompt
    if not sys.stdin.isatty():
        return sys.stdin.read()
    raise EdgeInferError("no prompt: give -p PROMPT, -f FILE, or pipe it on stdin")


# --------------------------------------------------------------------------- shared options

ModelArg = Annotated[str, typer.Argument(
    help="A .gguf file or a known model name (see `edgeinfer models`).", show_default=True)]
TempOpt = Annotated[float, typer.Option("--temp", "--temperature",
                                        help="Sampling temperature; 0 = greedy.")]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", "-s",
                                                help="Random seed (same seed -> same text); "
                                                     "default random.")]
TopKOpt = Annotated[int, typer.Option("--top-k", help="Keep the k most likely tokens; 0 = off.")]
TopPOpt = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass; 1 = off.")]
MinPOpt = Annotated[float, typer.Option("--min-p", help="Drop tokens below min_p x p(best); 0 = off.")]
RepOpt = Annotated[float, typer.Option("--repeat-penalty",
                                       help="Penalty for the last 64 tokens; 1 = off.")]
StopOpt = Annotated[Optional[list[str]], typer.Option("--stop", help="Stop string (repeatable).")]
CtxOpt = Annotated[int, typer.Option("--ctx", "-c", "--n-ctx",
                                     help="Context size (KV ring cells per sequence).")]
ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", "-t",
                                                   help="CPU threads; default = physical cores.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu, cuda, or auto (CUDA when a GPU answers, else the CPU).")]
KvOpt = Annotated[str, typer.Option("--kv", help="KV arena type: f16, or q8_0 (half the memory, a little "
                                    "accuracy).")]


# --------------------------------------------------------------------------- commands

@app.command()
@handle_errors
def run(
    model: ModelArg = DEFAULT_MODEL,
    prompt: Annotated[Optional[str], typer.Option("--prompt", "-p", help="The prompt.")] = None,
    file: Annotated[Optional[str], typer.Option("--file", "-f",
                                                help="Read the prompt from a file ('-' = stdin).")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n",
                                            help="Tokens to generate at most.")] = 128,
    temp: TempOpt = 0.8,
    seed: SeedOpt = None,
    top_k: TopKOpt = 40,
    top_p: TopPOpt = 0.95,
    min_p: MinPOpt = 0.05,
    repeat_penalty: RepOpt = 1.0,
    stop: StopOpt = None,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos",
                                             help="Keep generating past end-of-sequence.")] = False,
    ctx: CtxOpt = 2048,
    threads: ThreadsOpt = None,
    device: DeviceOpt = "cpu",
    kv: KvOpt = "f16",
    chat: Annotated[bool, typer.Option("--chat/--raw",
                                       help="--chat: wrap the prompt as a user message in the "
                                            "model's chat template; --raw (default): plain "
                                            "text completion.")] = False,
    system: Annotated[Optional[str], typer.Option("--system",
                                                  help="System message (with --chat).")] = None,
    stats: Annotated[bool, typer.Option("--stats/--no-stats",
                                        help="Print a stats line to stderr.")] = True,
    suffix: Annotated[Optional[str], typer.Option("--suffix",
                                                  help="Fill in the middle: the text after the gap, the "
                                                       "prompt being the text before it (a code model's "
                                                       "FIM tokens; --raw).")] = None,
) -> None:
    """Generate text from a prompt, streaming it to stdout."""
    text = _read_prompt(prompt, file)
    kw = _sampling_kwargs(max_tokens, temp, seed, top_k, top_p, min_p, repeat_penalty, stop,
                          ignore_eos)
    eng = _load_engine(model, ctx, threads, device, kv)
    timed = _Timed()
    if chat:
        if suffix:
            raise EdgeInferError("--suffix is a raw completion's (fill in the middle): leave out --chat")
        messages = ([{"role": "system", "content": system}] if system else [])
        messages.append({"role": "user", "content": text})
        gen = eng.stream_chat(messages, **kw)
        pt_guess = None
    else:
        if system:
            raise EdgeInferError("--system needs --chat")
        gen = eng.stream(text, **({"suffix": suffix} if suffix else {}), **kw)
        pt_guess = None
    out = timed.pump(gen)
    if out and not out.endswith("\n"):
        _write("\n")
    if stats:
        if not chat and _get(gen, "stats") is None and _get(eng, "last_stats") is None:
            try:
                pt_guess = len(eng.tokenize(text, add_special=True))
            except Exception:  # stats are best effort
                pt_guess = None
        _err(_stats_line(gen, eng, timed, pt_guess))


@app.command()
@handle_errors
def chat(
    model: ModelArg = DEFAULT_MODEL,
    system: Annotated[Optional[str], typer.Option("--system", help="System message.")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n",
                                            help="Tokens per reply at most.")] = 512,
    temp: TempOpt = 0.8,
    seed: SeedOpt = None,
    top_k: TopKOpt = 40,
    top_p: TopPOpt = 0.95,
    min_p: MinPOpt = 0.05,
    repeat_penalty: RepOpt = 1.0,
    ctx: CtxOpt = 2048,
    threads: ThreadsOpt = None,
    device: DeviceOpt = "cpu",
    kv: KvOpt = "f16",
    stats: Annotated[bool, typer.Option("--stats/--no-stats",
                                        help="Print a stats line after each reply.")] = False,
    think: Annotated[Optional[bool], typer.Option("--think/--no-think",
                                                  help="Set the chat template's enable_thinking (Qwen3's "
                                                       "thinking switch); default: the template's.")] = None,
) -> None:
    """Chat interactively: one line per message; /reset clears the history, /exit or EOF quits."""
    kw = _sampling_kwargs(max_tokens, temp, seed, top_k, top_p, min_p, repeat_penalty, None, False)
    if think is not None:
        kw["enable_thinking"] = think
    eng = _load_engine(model, ctx, threads, device, kv)
    interactive = sys.stdin.isatty()
    base = [{"role": "system", "content": system}] if system else []
    history: list[dict] = list(base)
    if interactive:
        _err("chat: type a message; /reset clears the history, /exit or Ctrl-D quits")
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        try:
            line = sys.stdin.readline()
        except KeyboardInterrupt:
            _err("")
            break
        if not line:  # EOF
            if interactive:
                _err("")
            break
        msg = line.rstrip("\r\n")
        cmd = msg.strip()
        if not cmd:
            continue
        if cmd in ("/exit", "/quit", "/bye"):
            break
        if cmd == "/reset":
            history = list(base)
            _err("(history cleared)")
            continue
        messages = history + [{"role": "user", "content": msg}]
        timed = _Timed()
        gen = None
        try:
            gen = eng.stream_chat(messages, **kw)
            reply = timed.pump(gen)
        except KeyboardInterrupt:
            reply = "".join(timed.text)
            _err("\n(interrupted)")
        except EdgeInferError as e:  # e.g. the conversation outgrew the context
            _write("\n")
            _err(f"error: {e} (type /reset to start over)")
            continue
        _write("\n")
        history = messages + [{"role": "assistant", "content": reply}]
        if stats:
            _err(_stats_line(gen, eng, timed, None))


def _human_bytes(n: int) -> str:
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{n} B"  # pragma: no cover


def _fmt_value(key: str, v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int):
        if key.endswith("bytes") or key.endswith("_size"):
            return f"{v:,} ({_human_bytes(v)})"
        if key.endswith("n_params"):
            return f"{v:,} ({v / 1e6:.1f}M)"
        return f"{v:,}" if abs(v) >= 10_000 else str(v)
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(str(x) for x in v)
    return str(v)


def _flatten(d: dict, prefix: str = "") -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            rows.extend(_flatten(v, key + "."))
        else:
            rows.append((key, _fmt_value(str(k), v)))
    return rows


def format_table(d: dict) -> str:
    rows = _flatten(d)
    w = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"{k.ljust(w)}  {v}" for k, v in rows)


@app.command()
@handle_errors
def info(
    model: ModelArg = DEFAULT_MODEL,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    ctx: CtxOpt = 2048,
    threads: ThreadsOpt = None,
    device: DeviceOpt = "cpu",
    kv: KvOpt = "f16",
) -> None:
    """Show a model's architecture, parameters, tensor types and KV arena size."""
    eng = _load_engine(model, ctx, threads, device, kv)
    d = dict(eng.info())
    if as_json:
        _write(json.dumps(d, indent=2, default=str) + "\n")
    else:
        _write(format_table(d) + "\n")


@app.command()
@handle_errors
def pull(
    name: Annotated[str, typer.Argument(help="A known model name or alias.")] = DEFAULT_MODEL,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Fetch a known model into the cache (verifying its sha256) and print its path."""
    from ..hub import ensure_model

    path = ensure_model(name, progress=not quiet)
    _write(f"{path}\n")


@app.command("models")
@handle_errors
def list_models(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List the known models (names, aliases, size, license, source, cache state)."""
    from ..hub import _spec_table

    rows = _spec_table()
    if as_json:
        _write(json.dumps(rows, indent=2) + "\n")
        return
    for r in rows:
        aliases = f" (aliases: {r['aliases']})" if r["aliases"] else ""
        _write(f"{r['name']}{aliases}\n"
               f"  size     {r['size']:,} bytes ({_human_bytes(r['size'])})\n"
               f"  license  {r['license']}\n"
               f"  source   {r['source']}\n"
               f"  cached   {r['cached'] or 'no (edgeinfer pull ' + r['name'] + ')'}\n")


def main() -> None:  # pragma: no cover - `python -m edgeinfer`
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
