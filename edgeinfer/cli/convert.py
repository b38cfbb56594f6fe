"""`edgeinfer convert` and `edgeinfer eval` (registered on the main app by cli.py)."""
from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from .errors import handle_errors
from ..errors import EdgeInferError

__all__ = ["convert", "convert_lora_cmd", "eval_cmd", "imatrix_cmd", "quantize_cmd", "register"]

_FIXED_TYPES = "q4_k_m|q5_k_m|q4_0|q4_1|q5_0|q5_1|q8_0|q6_k|f16|bf16|f32"
_TYPES = _FIXED_TYPES + "|auto"
_KEEP_HELP = ("PATTERN=TYPE: store tensors whose GGUF name matches the glob PATTERN as TYPE "
              "(repeatable; e.g. 'blk.0.*=q8_0').")
_IMATRIX_HELP = ("Importance matrix (from `edgeinfer imatrix` or llama.cpp's llama-imatrix, GGUF "
                 "or .dat) weighting each column's rounding error by how strongly calibration "
                 "text activates it.")
_THREADS_HELP = "Quantizer threads (0 = all cores)."


def _report(r, extra: str = "") -> None:
    types = ", ".join(f"{n} {k}" for k, n in sorted(r.type_counts.items()))
    print(f"wrote {r.path}: {r.file_type}, {r.n_tensors} tensors ({types}{extra}), "
          f"{r.nbytes / 2**20:.1f} MiB, {r.bpw:.2f} bits/weight, in {r.seconds:.1f} s",
          file=sys.stderr)
    for note in r.notes:
        print(f"note: {note}", file=sys.stderr)


@handle_errors
def convert(
    checkpoint: Annotated[str, typer.Argument(help="Hugging Face checkpoint directory "
                                              "(config.json, *.safetensors, tokenizer files).")],
    output: Annotated[str, typer.Option("--output", "-o", help="Output .gguf path.")],
    type_: Annotated[str, typer.Option("--type", "-t", help=f"Output type: {_TYPES}. The default, q4_k_m, is the measured best trade of size, accuracy and speed (docs/quantization.md, 'Which type to pick').")] = "q4_k_m",
    lora: Annotated[Optional[str], typer.Option("--lora", help="PEFT LoRA adapter directory "
                                                "to merge before quantization.")] = None,
    keep: Annotated[Optional[list[str]], typer.Option("--keep", help=_KEEP_HELP)] = None,
    threads: Annotated[int, typer.Option("--threads", help=_THREADS_HELP)] = 0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    target_bpw: Annotated[Optional[float], typer.Option(
        "--target-bpw", help="--type auto: size budget in bits per weight (tensor data), "
                             "e.g. 5.5.")] = None,
    calibration: Annotated[Optional[str], typer.Option(
        "--calibration", help="--type auto: UTF-8 text to measure sensitivity on (default: "
                              "a text shipped with edgeinfer; first 512 tokens).")] = None,
    imatrix: Annotated[Optional[str], typer.Option("--imatrix", help=_IMATRIX_HELP)] = None,
) -> None:
    """Convert a Hugging Face checkpoint (optionally LoRA-merged) to a GGUF file."""
    from ..convert import convert_checkpoint

    r = convert_checkpoint(checkpoint, output, type_, lora_dir=lora, keep=keep,
                           n_threads=threads, progress=not quiet,
                           target_bpw=target_bpw, calibration=calibration, imatrix=imatrix)
    merged = f", {r.lora_merged} LoRA-merged" if lora else ""
    auto = f", predicted KL {r.predicted_kl:.4f}" if r.predicted_kl is not None else ""
    _report(r, merged + auto)


@handle_errors
def quantize_cmd(
    model: Annotated[str, typer.Argument(help="GGUF model to quantize (e.g. the F16 or BF16 file "
                                         "llama.cpp's convert_hf_to_gguf.py or `edgeinfer "
                                         "convert -t f16` wrote).")],
    output: Annotated[str, typer.Option("--output", "-o", help="Output .gguf path.")],
    type_: Annotated[str, typer.Option("--type", "-t", help=f"Output type: {_FIXED_TYPES}.")] = "q4_k_m",
    keep: Annotated[Optional[list[str]], typer.Option("--keep", help=_KEEP_HELP)] = None,
    imatrix: Annotated[Optional[str], typer.Option("--imatrix", help=_IMATRIX_HELP)] = None,
    allow_requantize: Annotated[bool, typer.Option(
        "--allow-requantize", help="Quantize tensors that are already quantized (a second "
                                   "rounding error on top of the first).")] = False,
    threads: Annotated[int, typer.Option("--threads", help=_THREADS_HELP)] = 0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Quantize a GGUF model to another type (what llama.cpp's llama-quantize does, with the same result)."""
    from ..convert import quantize_gguf

    _report(quantize_gguf(model, output, type_, keep=keep, imatrix=imatrix,
                          allow_requantize=allow_requantize, n_threads=threads,
                          progress=not quiet))


@handle_errors
def eval_cmd(
    model: Annotated[Optional[str], typer.Argument(help="GGUF model to evaluate (omit with "
                                                   "--sweep).")] = None,
    reference: Annotated[str, typer.Option("--reference", "-r", help="Reference GGUF (e.g. the "
                                           "F16 conversion).")] = ...,
    text: Annotated[str, typer.Option("--text", help="UTF-8 text file to score.")] = ...,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    ctx: Annotated[int, typer.Option("--ctx", "-c", help="Window length in tokens.")] = 512,
    threads: Annotated[Optional[int], typer.Option("--threads")] = None,
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens",
                                                      help="Score at most this many tokens.")] = None,
    sweep_ckpt: Annotated[Optional[str], typer.Option(
        "--sweep", help="Hugging Face checkpoint: convert it to each fixed type and to "
                        "--type auto at several budgets, and evaluate every file.")] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", help="--sweep: write the KL-vs-size "
                                                "plot to this PNG (needs matplotlib).")] = None,
    types: Annotated[Optional[str], typer.Option(
        "--types", help="--sweep: comma-separated fixed types (default: "
                        "q8_0,q6_k,q5_k_m,q5_1,q5_0,q4_k_m,q4_1,q4_0).")] = None,
    budgets: Annotated[Optional[str], typer.Option(
        "--budgets", help="--sweep: comma-separated bits-per-weight budgets for auto "
                          "(default: the size of each fixed type's file).")] = None,
    out_dir: Annotated[Optional[str], typer.Option(
        "--out-dir", help="--sweep: keep the converted files here (default: a temporary "
                          "directory, removed).")] = None,
    calibration: Annotated[Optional[str], typer.Option(
        "--calibration", help="--sweep: calibration text for auto.")] = None,
) -> None:
    """Perplexity, KL divergence and top-1 agreement of MODEL against a reference; with
    --sweep, the KL-vs-size curve of a checkpoint's fixed types and --type auto."""
    from ..progress import status
    from ..tools.eval import (SWEEP_TYPES, evaluate, format_sweep, format_table, plot_sweep, sweep,
                       to_json)

    try:
        with open(text, encoding="utf-8") as fh:
            body = fh.read()
    except OSError as e:
        raise EdgeInferError(f"cannot read --text {text}: {e}") from None
    if sweep_ckpt is None:
        if model is None:
            raise EdgeInferError("give a MODEL to evaluate, or --sweep CHECKPOINT")
        if plot or types or budgets or out_dir or calibration:
            raise EdgeInferError("--plot, --types, --budgets, --out-dir and --calibration go "
                                 "with --sweep")
        r = evaluate(model, reference, body, ctx=ctx, n_threads=threads, max_tokens=max_tokens)
        print(to_json(r) if as_json else format_table(r))
        return
    if model is not None:
        raise EdgeInferError("--sweep converts the checkpoint itself: give no MODEL")
    if plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise EdgeInferError("--plot needs matplotlib (pip install matplotlib)") from None
    tlist = tuple(t.strip() for t in types.split(",") if t.strip()) if types else SWEEP_TYPES
    try:
        blist = [float(b) for b in budgets.split(",") if b.strip()] if budgets else None
    except ValueError:
        raise EdgeInferError(f"--budgets {budgets!r}: expected numbers, e.g. 5.0,5.5") from None
    with status("sweep") as note:
        points = sweep(sweep_ckpt, reference, body, types=tlist, budgets=blist, out_dir=out_dir,
                       calibration=calibration, ctx=ctx, n_threads=threads, max_tokens=max_tokens,
                       progress=note)
    if plot:
        plot_sweep(points, plot)
    if as_json:
        import json
        print(json.dumps([p.to_dict() for p in points], indent=2))
    else:
        print(format_sweep(points))
        if plot:
            print(f"plot: {plot}")


@handle_errors
def imatrix_cmd(
    checkpoint: Annotated[str, typer.Argument(help="Hugging Face checkpoint directory, or a GGUF "
                                              "model file (e.g. the F16 one you will quantize).")],
    output: Annotated[str, typer.Option("--output", "-o", help="Output imatrix .gguf path.")],
    calibration: Annotated[Optional[str], typer.Option(
        "--calibration", "-f", help="UTF-8 text to run (default: a short text shipped with "
                                    "edgeinfer; use text like what the model will see).")] = None,
    chunk_size: Annotated[int, typer.Option("--chunk-size", help="Tokens per window, BOS "
                                            "included (llama-imatrix's -c); the text must "
                                            "hold at least one.")] = 512,
    chunks: Annotated[Optional[int], typer.Option("--chunks", help="Use at most this many "
                                                  "chunks (llama-imatrix's --chunks; default: "
                                                  "every full chunk of the text).")] = None,
    lora: Annotated[Optional[str], typer.Option("--lora", help="PEFT LoRA adapter to merge "
                                                "first (as convert --lora).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress.")] = False,
) -> None:
    """Collect an importance matrix on calibration text, for `convert --imatrix` / `quantize --imatrix` (or llama.cpp's llama-quantize --imatrix)."""
    from ..convert import compute_imatrix

    im = compute_imatrix(checkpoint, output, calibration=calibration, chunk_size=chunk_size,
                         n_chunks=chunks, lora_dir=lora, progress=not quiet)
    print(f"wrote {output}: {len(im.sums)} tensors, {im.chunk_count} "
          f"chunk{'s' if im.chunk_count != 1 else ''} of {im.chunk_size} tokens", file=sys.stderr)


@handle_errors
def convert_lora_cmd(
    adapter: Annotated[str, typer.Argument(help="PEFT LoRA adapter directory (adapter_config.json, "
                                           "adapter_model.safetensors).")],
    base: Annotated[str, typer.Option("--base", help="The base model's Hugging Face directory (its "
                                      "config.json; the weights are not read).")],
    output: Annotated[str, typer.Option("--output", "-o", help="Output .gguf path.")],
    type_: Annotated[str, typer.Option("--type", "-t", help="f32, f16 or q8_0.")] = "f32",
) -> None:
    """Convert a PEFT LoRA adapter to a llama.cpp LoRA GGUF (for `serve --lora NAME=FILE`, llama.cpp's --lora)."""
    from ..convert.lora import convert_lora

    n, size = convert_lora(adapter, base, output, type_)
    print(f"wrote {output}: {n} adapted tensors, {type_}, {size / 2**20:.2f} MiB", file=sys.stderr)


def register(app: typer.Typer) -> None:
    app.command("convert")(convert)
    app.command("quantize")(quantize_cmd)
    app.command("imatrix")(imatrix_cmd)
    app.command("eval")(eval_cmd)
    app.command("convert-lora")(convert_lora_cmd)
