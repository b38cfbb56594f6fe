"""`edgeinfer bench --speculative lookup|draft:PATH`: speculative decoding against plain decoding
on two workloads, measured interleaved (plain, speculative, plain, ... in alternating order)
on one engine, one stream; both produce the same tokens (checked).

  copy-heavy    extract fields from a provided document (the answer copies spans of the prompt);
                greedy
  free-writing  a short story, sampled (temperature 0.8, seeded: speculative sampling draws the
                same tokens as plain sampling); little to copy, so the adaptive policy should
                turn speculation off. (Greedy, this small model soon repeats itself, which
                prompt lookup would exploit.)

Per workload, three variants are run in each rep, in rotating order: plain, speculative with the
adaptive policy, and speculative with k forced to 4 (what the proposer achieves when it is always
used). Each row: decode tokens/s of plain and speculative decoding (median over reps), their
ratio (median of the per-rep ratios), accepted / proposed draft tokens and the mean k chosen.
The policy's measurements carry over between runs of one engine, as in a server.
"""
from __future__ import annotations

import statistics
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


SAMPLING = {"copy-heavy": dict(temperature=0.0),
            "free-writing": dict(temperature=0.8, seed=1)}


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


VARIANTS = ["plain", "adaptive", "fixed"]
FIXED_K = 4


def parse_mode(arg: str) -> tuple[str, str | None]:
    """'lookup' -> ('lookup', None); 'draft:PATH' -> ('draft', PATH)."""
    if arg == "lookup":
        return "lookup", None
    if arg.startswith("draft:") and len(arg) > len("draft:"):
        return "draft", arg[len("draft:"):]
    raise ValueError(f"--speculative must be 'lookup' or 'draft:PATH', got {arg!r}")


def run_spec_bench(model: str, speculative: str, n_threads: int = 2, reps: int = 3, max_tokens: int = 128,
                   n_ctx: int = 2048, log: Callable[[str], None] | None = None) -> list[SpecRow]:
    from ..engine import Engine

    mode, draft = parse_mode(speculative)
    say = log or (lambda s: None)
    eng = Engine.load(model, n_ctx=n_ctx, n_threads=n_threads, draft=draft)
    rows = []
    try:
        for name, messages in WORKLOADS.items():
            ids = eng.chat_ids(messages)
            kw = dict(max_tokens=max_tokens, **SAMPLING[name])
            eng.generate(ids, **kw)                         # warm-up (caches, thread pool)
            tps: dict[str, list[float]] = {v: [] for v in VARIANTS}
            ratios: dict[str, list[float]] = {v: [] for v in VARIANTS if v != "plain"}
            counts = {v: [0, 0, 0.0, 0] for v in VARIANTS}     # proposed, accepted, sum of k, runs with k
            n_tok = 0
            for rep in range(reps):
                order = VARIANTS[rep % 3:] + VARIANTS[:rep % 3]      # rotate: no variant always first
                got = {}
                for v in order:
                    eng.forget_prefixes()                   # no prefix reuse between runs
                    eng.fix_speculation(FIXED_K if v == "fixed" else None)
                    got[v] = eng.generate(ids, speculative=None if v == "plain" else mode, **kw)
                eng.fix_speculation(None)
                plain = got["plain"]
                n_tok = len(plain.tokens)
                p_tps = _decode_tps(plain)
                for v in VARIANTS:
                    c = got[v]
                    if c.tokens != plain.tokens:
                        raise RuntimeError(f"{name}: speculative output differs from plain decoding")
                    tps[v].append(_decode_tps(c))
                    if v != "plain":
                        ratios[v].append(tps[v][-1] / p_tps if p_tps else 0.0)
                    cnt = counts[v]
                    cnt[0] += c.stats.spec_proposed
                    cnt[1] += c.stats.spec_accepted
                    if c.stats.spec_k:
                        cnt[2] += c.stats.spec_k
                        cnt[3] += 1
                say(f"{name} rep {rep + 1}/{reps}: " + ", ".join(
                    f"{v} {tps[v][-1]:.1f} tok/s" + (f" ({got[v].stats.spec_accepted}/{got[v].stats.spec_proposed})"
                                                     if v != "plain" else "") for v in VARIANTS))
            for v in ("adaptive", "fixed"):
                p, a, ks, kn = counts[v]
                label = speculative if v == "adaptive" else f"{speculative} (k={FIXED_K} forced)"
                rows.append(SpecRow(name, label, n_tok, statistics.median(tps["plain"]),
                                    statistics.median(tps[v]), statistics.median(ratios[v]), p, a,
                                    ks / kn if kn else 0.0))
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
