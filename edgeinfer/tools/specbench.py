"""`edgeinfer bench --speculative lookup|draft:PATH`: speculative decoding against plain decoding
on two workloads, measured interleaved (plain, speculative, plain, ... in alternating order)
on one engine, one stream, greedy (so both produce the same tokens).

  copy-heavy    extract fields from a provided document (the answer copies spans of the prompt)
  free-writing  a short story (little to copy; the adaptive switch should turn speculation off)

Each row: decode tokens/s of plain and speculative decoding (median over reps), their ratio
(median of the per-rep ratios), and accepted / proposed draft tokens and the mean k chosen.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable

DOCUMENT = """\
SERVICE REPORT 2024-117
Site: Harbour Pumping Station 3, Quay Road, Port Ellis
Engineer: Marta Okonkwo (badge 4471)
Visit date: 12 September 2024, arrived 08:40, left 13:15
Equipment: Grundfos NK 150-315 centrifugal pump, serial GF-88213-B
Reported fault: high vibration and a grinding noise at start-up
Findings: the drive-end bearing was worn; the coupling was misaligned by 0.6 mm; the impeller
showed light cavitation damage on two vanes.
Work done: replaced the drive-end bearing (SKF 6312-2Z), realigned the coupling to 0.05 mm,
balanced the impeller, replaced the mechanical seal (part MS-150-22).
Parts cost: 1,284.50 EUR. Labour: 4.5 hours at 85.00 EUR per hour.
Next inspection: 12 March 2025.
Customer contact: Jonas Lindqvist, facilities manager, +45 31 22 90 17, j.lindqvist@portellis.example
"""

WORKLOADS = {
    "copy-heavy": [{"role": "user", "content": (
        "Here is a service report:\n\n" + DOCUMENT + "\nExtract these fields and give each on its own "
        "line as 'field: value', copying the values exactly: report number, site, engineer, visit date, "
        "equipment, serial number, reported fault, findings, work done, parts cost, labour, next "
        "inspection, customer contact.")}],
    "free-writing": [{"role": "user", "content": (
        "Write a short story about a lighthouse keeper who finds a message in a bottle.")}],
}


@dataclass
class SpecRow:
    workload: str
    mode: str
    tokens: int                 # generated per run
    plain_tps: float
    spec_tps: float
    ratio: float
    proposed: int
    accepted: int
    mean_k: float

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


def parse_mode(arg: str) -> tuple[str, str | None]:
    """'lookup' -> ('lookup', None); 'draft:PATH' -> ('draft', PATH)."""
    if arg == "lookup":
        return "lookup", None
    if arg.startswith("draft:") and len(arg) > len("draft:"):
        return "draft", arg[len("draft:"):]
    raise ValueError(f"--speculative must be 'lookup' or 'draft:PATH', got {arg!r}")


def run_spec_bench(model: str, speculative: str, n_threads: int = 2, reps: int = 3, max_tokens: int = 128,
                   n_ctx: int = 2048, log: Callable[[str], None] | None = None) -> list[SpecRow]:
    from ..engine.engine import Engine

    mode, draft = parse_mode(speculative)
    say = log or (lambda s: None)
    eng = Engine.load(model, n_ctx=n_ctx, n_threads=n_threads, draft=draft)
    rows = []
    try:
        for name, messages in WORKLOADS.items():
            ids = eng.chat_ids(messages)
            kw = dict(max_tokens=max_tokens, temperature=0.0)
            eng.generate(ids, **kw)                         # warm-up (caches, thread pool)
            plain_tps, spec_tps, ratios = [], [], []
            proposed = accepted = 0
            k_sum = k_n = 0
            n_tok = 0
            for rep in range(reps):
                order = (None, mode) if rep % 2 == 0 else (mode, None)
                got = {}
                for m in order:
                    eng.ring.truncate(0, 0)                 # no prefix reuse between runs
                    t0 = time.perf_counter()
                    c = eng.generate(ids, speculative=m, **kw)
                    wall = time.perf_counter() - t0
                    got[m] = (c, wall)
                pc, sc = got[None][0], got[mode][0]
                if pc.tokens != sc.tokens:
                    raise RuntimeError(f"{name}: speculative greedy output differs from plain decoding")
                n_tok = len(pc.tokens)
                p_tps, s_tps = _decode_tps(pc), _decode_tps(sc)
                plain_tps.append(p_tps)
                spec_tps.append(s_tps)
                ratios.append(s_tps / p_tps if p_tps else 0.0)
                proposed += sc.stats.spec_proposed
                accepted += sc.stats.spec_accepted
                if sc.stats.spec_k:
                    k_sum += sc.stats.spec_k
                    k_n += 1
                say(f"{name} rep {rep + 1}/{reps}: plain {p_tps:.1f} tok/s, {mode} {s_tps:.1f} tok/s "
                    f"(accepted {sc.stats.spec_accepted}/{sc.stats.spec_proposed})")
            rows.append(SpecRow(name, speculative, n_tok, statistics.median(plain_tps),
                                statistics.median(spec_tps), statistics.median(ratios), proposed, accepted,
                                k_sum / k_n if k_n else 0.0))
    finally:
        eng.close()
    return rows


def _decode_tps(c) -> float:
    """Decode tokens/s of a completion: tokens after the first over the time after the first."""
    n = c.stats.completion_tokens
    return (n - 1) / c.stats.decode_s if n > 1 and c.stats.decode_s > 0 else 0.0


def format_spec_table(rows: list[SpecRow]) -> str:
    head = ("| workload | speculative | tokens | plain tok/s | spec tok/s | ratio | accepted/proposed | mean k |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in rows:
        acc = f"{r.accepted}/{r.proposed} ({100 * r.acceptance:.0f} %)" if r.proposed else "0/0 (off)"
        lines.append(f"| {r.workload} | {r.mode} | {r.tokens} | {r.plain_tps:.1f} | {r.spec_tps:.1f} | "
                     f"{r.ratio:.2f}x | {acc} | {r.mean_k:.1f} |")
    return "\n".join(lines)


def to_json(rows: list[SpecRow]) -> list[dict]:
    return [{**asdict(r), "acceptance": r.acceptance} for r in rows]
