"""`edgeinfer doctor` and `edgeinfer plan` (registered on the main app by cli.py)."""
from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer

from .errors import handle_errors

__all__ = ["doctor", "plan_cmd", "register"]

def _ints(text: Optional[str], what: str) -> Optional[list[int]]:
    if not text:
        return None
    try:
        vals = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise ValueError(f"{what}: expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise ValueError(f"{what}: values must be >= 1, got {text!r}")
    return vals


@handle_errors
def doctor(
    model: Annotated[Optional[str], typer.Argument(
        help="Optional model (path or known name): report the largest --ctx x --slots that fits.")] = None,
    kv: Annotated[str, typer.Option("--kv", help="KV cache type for the fit: f16 | q8_0.")] = "f16",
    max_batch: Annotated[int, typer.Option("--max-batch", help="Tokens per forward call.")] = 256,
    threads: Annotated[Optional[int], typer.Option("--threads", "-t", help="Threads (default: physical cores).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """Check this machine: CPU features and chosen kernels, CUDA, free memory, what fits."""
    from ..tools.doctor import doctor_report, format_report

    rep = doctor_report(model, kv=kv, max_batch=max_batch, n_threads=threads)
    sys.stdout.write((json.dumps(rep, indent=2) if as_json else format_report(rep)) + "\n")


@handle_errors
def plan_cmd(
    model: Annotated[str, typer.Argument(help="Model: a .gguf path or a known model name.")],
    memory: Annotated[Optional[str], typer.Option(
        "--memory", "-m", help="Memory budget: 8GB (decimal), 7.5GiB or 8G (binary), or bytes. "
        "Default: memory available now.")] = None,
    kv: Annotated[str, typer.Option("--kv", help="KV cache type: f16 | q8_0.")] = "f16",
    ctx: Annotated[Optional[str], typer.Option("--ctx", "-c", help="Contexts, comma-separated "
                                                "(default: 512 .. the trained context).")] = None,
    slots: Annotated[Optional[str], typer.Option("--slots", "-s", help="Slot counts, comma-separated "
                                                  "(default 1,2,4,8).")] = None,
    max_batch: Annotated[int, typer.Option("--max-batch", help="Tokens per forward call (engine default 256).")] = 256,
    threads: Annotated[Optional[int], typer.Option("--threads", "-t", help="Threads (default: physical cores).")] = None,
    speculative: Annotated[Optional[str], typer.Option(
        "--speculative", help="mtp: also price the file's MTP block as the draft (its own KV ring, "
        "weights, buffers), as `serve --speculative mtp` loads it.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON rows instead of a table.")] = False,
) -> None:
    """Memory plan: weights + KV arena + working buffers for a grid of contexts and slots."""
    from ..tools import plan as P

    if kv not in P.KV_TYPES:
        raise ValueError(f"--kv must be one of {', '.join(P.KV_TYPES)}, got {kv!r}")
    if max_batch < 1:
        raise ValueError("--max-batch must be >= 1")
    if memory is None:
        from ..tools.doctor import memory_report

        budget = memory_report().get("available")
        budget_src = "available now"
    else:
        budget = P.parse_size(memory)
        budget_src = memory
    if speculative is not None and speculative not in P.SPECULATIVE:
        raise ValueError(f"--speculative: plan prices {', '.join(P.SPECULATIVE)} (the file's MTP block); "
                         f"lookup needs no memory, and a draft model is planned with its own "
                         f"`edgeinfer plan DRAFT`; got {speculative!r}")
    m = P.model_shape(model)
    mtp = speculative == "mtp"
    if mtp:
        P.mtp_kv_bytes(m, 1, 1, kv)   # a file without the block: the error before any table
    ctxs = _ints(ctx, "--ctx") or P.default_ctxs(m)
    slot_list = _ints(slots, "--slots") or list(P.DEFAULT_SLOTS)
    rows = P.plan_grid(m, ctxs, slot_list, kv=kv, memory=budget, max_batch=max_batch, n_threads=threads,
                       speculative=speculative)
    fits = P.largest_fit(m, budget, slot_list, kv, max_batch, threads, speculative=speculative) if budget else {}
    if as_json:
        out = {"model": m.name, "path": m.path, "memory": budget, "kv": kv,
               "max_batch": max_batch, "speculative": speculative,
               "mtp_block_bytes": m.mtp_file_bytes, "rows": [r.as_dict() for r in rows],
               "largest_ctx_by_slots": {str(k): v for k, v in fits.items()}}
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return
    H = P.human
    w = sys.stdout.write
    w(f"model     {m.name}  ({m.path})\n")
    w(f"          {m.n_layer} layers, {m.n_head_kv} KV heads x {m.head_dim}, trained context {m.n_ctx_train}\n")
    w(f"budget    {H(budget) if budget else '?'} ({budget_src})\n")
    w(f"weights   {H(m.weights_bytes)} (tensor bytes, memory-mapped)\n")
    if m.mtp_file_bytes and not mtp:   # Qwen3.5's NextN block: in the file, never read by the trunk
        w(f"          + MTP block {H(m.mtp_file_bytes)} in the file, unused (not resident); "
          f"--speculative mtp prices it as the draft\n")
    per_tok = P.kv_bytes(m, 1, 1, kv)
    n_kv = sum(map(bool, m.layer_kv_elems)) if m.layer_kv_elems else m.n_layer   # hybrids: attention layers only
    w(f"KV        {kv}: {H(per_tok)} per token per slot "
      f"(2 x {n_kv} x {m.n_head_kv} x {m.head_dim} x {P.KV_TYPES[kv]:g} B)\n")
    if m.swa_window:   # Gemma 3: local layers keep only their window (docs/models.md)
        n_local = sum(c < 1 << 30 for c in P.kv_layer_cells(m.n_layer, m.swa_window, m.swa_pattern, 1 << 30,
                                                             max_batch))
        w(f"          {n_local} of {m.n_layer} layers are sliding-window (window {m.swa_window}): they keep "
          f"{m.swa_window + max_batch - 1} cells per slot once ctx is larger\n")
    if m.layer_state:   # hybrids: recurrent layers hold a state per slot, not cells (plan.state_bytes)
        w(f"state     {H(P.state_bytes(m, 1))} per slot (live + kept copies), whatever the context\n")
    if mtp:   # the block as serve --speculative mtp loads it: a one-layer model with its own ring
        w(f"MTP draft {H(P.mtp_kv_bytes(m, 1, 1, kv))} KV per token per slot (one attention layer), weights "
          f"{H(m.mtp.weights_bytes)} (its layer; the head is the trunk's), its own buffers\n")
    w(f"buffers   max_batch {max_batch}; overhead ~{H(P.overhead_bytes(m, 1))} (Python, tokenizer; estimate)\n\n")
    # table: one line per (ctx, slots)
    st = (lambda r: f" {H(r.state_bytes):>11}") if m.layer_state else (lambda r: "")
    # the MTP draft's KV ring apart from the model's; its weights and buffers are in the total
    dk = (lambda r: f" {H(r.mtp_kv_bytes):>11}") if mtp else (lambda r: "")
    w(f"{'ctx':>7} {'slots':>5} {'KV':>11}{' state'.rjust(12) if m.layer_state else ''}"
      f"{' MTP KV'.rjust(12) if mtp else ''} {'buffers':>11} {'total':>11}  fits\n")
    for r in rows:
        mark = "-" if r.fits is None else ("yes" if r.fits else "NO")
        extra = f"  ({'; '.join(r.notes)})" if r.notes else ""
        w(f"{r.ctx:>7} {r.slots:>5} {H(r.kv_bytes):>11}{st(r)}{dk(r)} {H(r.scratch + r.mtp_scratch):>11} "
          f"{H(r.total):>11}  {mark}{extra}\n")
    if fits:
        w("\nlargest context that fits:\n")
        for s, c in fits.items():
            w(f"  --slots {s:<3} --ctx {c if c else '(none: weights + overhead exceed the budget)'}\n")


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
    app.command("plan")(plan_cmd)
