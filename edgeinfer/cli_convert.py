"""`edgeinfer convert` and `edgeinfer eval` (registered on the main app by cli.py)."""
from __future__ import annotations

import functools
import sys
from typing import Annotated, Any, Callable, Optional

import typer

from .errors import EdgeInferError

__all__ = ["convert", "eval_cmd", "register"]

_TYPES = "q4_k_m|q5_k_m|q4_0|q4_1|q5_0|q5_1|q8_0|q6_k|f16|bf16|f32"


def _errors(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except EdgeInferError as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            print("\ninterrupted (no output file written)", file=sys.stderr, flush=True)
            raise typer.Exit(130) from None
    return wrapper


@_errors
def convert(
    checkpoint: Annotated[str, typer.Argument(help="Hugging Face checkpoint directory "
                                              "(config.json, *.safetensors, tokenizer files).")],
    output: Annotated[str, typer.Option("--output", "-o", help="Output .gguf path.")],
    type_: Annotated[str, typer.Option("--type", "-t", help=f"Output type: {_TYPES}.")] = "q4_k_m",
    lora: Annotated[Optional[str], typer.Option("--lora", help="PEFT LoRA adapter directory "
                                                "to merge before quantization.")] = None,
    keep: Annotated[Optional[list[str]], typer.Option(
        "--keep", help="PATTERN=TYPE: store tensors whose GGUF name matches the glob PATTERN "
                       "as TYPE (repeatable; e.g. 'blk.0.*=q8_0').")] = None,
    threads: Annotated[int, typer.Option("--threads", help="Quantizer threads (0 = all "
                                         "cores).")] = 0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Convert a Hugging Face checkpoint (optionally LoRA-merged) to a GGUF file."""
    from .convert import convert_checkpoint

    r = convert_checkpoint(checkpoint, output, type_, lora_dir=lora, keep=keep,
                           n_threads=threads, progress=not quiet and sys.stderr.isatty())
    types = ", ".join(f"{n} {k}" for k, n in sorted(r.type_counts.items()))
    merged = f", {r.lora_merged} LoRA-merged" if lora else ""
    print(f"wrote {r.path}: {r.file_type}, {r.n_tensors} tensors ({types}{merged}), "
          f"{r.nbytes / 2**20:.1f} MiB in {r.seconds:.1f} s", file=sys.stderr)


@_errors
def eval_cmd(
    model: Annotated[str, typer.Argument(help="GGUF model to evaluate.")],
    reference: Annotated[str, typer.Option("--reference", "-r", help="Reference GGUF (e.g. the "
                                           "F16 conversion).")],
    text: Annotated[str, typer.Option("--text", help="UTF-8 text file to score.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    ctx: Annotated[int, typer.Option("--ctx", "-c", help="Window length in tokens.")] = 512,
    threads: Annotated[Optional[int], typer.Option("--threads")] = None,
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens",
                                                      help="Score at most this many tokens.")] = None,
) -> None:
    """Perplexity, KL divergence and top-1 agreement of MODEL against a reference."""
    from .eval import evaluate, format_table, to_json

    try:
        with open(text, encoding="utf-8") as fh:
            body = fh.read()
    except OSError as e:
        raise EdgeInferError(f"cannot read --text {text}: {e}") from None
    r = evaluate(model, reference, body, ctx=ctx, n_threads=threads, max_tokens=max_tokens)
    print(to_json(r) if as_json else format_table(r))


def register(app: typer.Typer) -> None:
    app.command("convert")(convert)
    app.command("eval")(eval_cmd)
