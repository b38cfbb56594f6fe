"""TPOT of JSON-schema decoding against free decoding on one model, batch 1 and concurrency 4.

Each repetition runs free then constrained (order alternating between repetitions) so the
machine's noise hits both alike. Free requests ignore EOS; constrained ones write one long
JSON string; both stop at --tokens. TPOT is GenerationStats.tpot_s (mean time between output
tokens after the first), averaged over the concurrent requests of a run.

    EI_NO_HOOK=1 PYTHONPATH=$PWD python scripts/structured_bench.py [--model PATH] [--reps 5]
"""
from __future__ import annotations

import argparse
import os
import statistics

import edgeinfer

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["title", "story"],
          "properties": {"title": {"type": "string"}, "story": {"type": "string"}}}
PROMPTS = ["Write a story about a lighthouse keeper as JSON.", "Write a story about a lost cat as JSON.",
           "Write a story about a robot chef as JSON.", "Write a story about a winter market as JSON."]


def run(eng, n: int, constrained: bool, tokens: int) -> float:
    kw = dict(json_schema=SCHEMA) if constrained else dict(ignore_eos=True)
    gens = [eng.stream(eng.chat_ids([{"role": "user", "content": PROMPTS[i]}]), temperature=0,
                       max_tokens=tokens, **kw) for i in range(n)]
    outs = [g.result() for g in gens]
    return statistics.mean(o.stats.tpot_s for o in outs) * 1e3


def host_cost(eng, reps: int) -> tuple[float, float, float]:
    """Per-token host time (us, median over reps) of sampling a row free vs constrained (mask
    applied, token committed), and of computing the mask (which runs during the forward)."""
    import time

    import numpy as np

    from edgeinfer.engine.constraint import grammar_spec
    from edgeinfer.engine.generation import SequenceState
    from edgeinfer.engine.sampling import SamplingParams

    ids = eng.chat_ids([{"role": "user", "content": PROMPTS[0]}])
    out = eng.generate(ids, json_schema=SCHEMA, temperature=0, max_tokens=96)
    rows = eng.logits(ids + out.tokens)[len(ids) - 1:]
    free_p = SamplingParams(temperature=0, max_tokens=None, ignore_eos=True)
    spec = grammar_spec(json_schema=SCHEMA)
    con_p = SamplingParams(temperature=0, max_tokens=None, grammar=spec)
    res = {"free": [], "con": [], "mask": []}
    for _ in range(reps):
        free, con = SequenceState(eng.tokenizer, ids, free_p), SequenceState(eng.tokenizer, ids, con_p)
        tf = tc = tm = 0.0
        n = len(out.tokens)
        for i in range(n):
            a = time.perf_counter()
            free.on_logits(rows[i], True)
            b = time.perf_counter()
            con.constraint.fill_mask()
            c = time.perf_counter()
            _, nxt = con.on_logits(rows[i], True)
            d = time.perf_counter()
            tf, tm, tc = tf + b - a, tm + c - b, tc + d - c
            assert nxt == out.tokens[i] or nxt is None
        res["free"].append(tf / n * 1e6)
        res["con"].append(tc / n * 1e6)
        res["mask"].append(tm / n * 1e6)
    return tuple(float(np.median(res[k])) for k in ("free", "con", "mask"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/edgeinfer/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    eng = edgeinfer.load(a.model, n_ctx=1024, n_slots=4, n_threads=a.threads)
    run(eng, 4, True, 16)   # warm-up: the grammar tokenizer, the first masks
    print(f"model {os.path.basename(a.model)}, {a.tokens} tokens, {a.reps} interleaved reps, greedy")
    print("| batch | free TPOT ms (median) | JSON-schema TPOT ms (median) | overhead |")
    print("|---|---|---|---|")
    for n in (1, 4):
        free, cons = [], []
        for r in range(a.reps):
            order = (False, True) if r % 2 == 0 else (True, False)
            for c in order:
                (cons if c else free).append(run(eng, n, c, a.tokens))
        f, c = statistics.median(free), statistics.median(cons)
        print(f"| {n} | {f:.2f} (min {min(free):.2f}) | {c:.2f} (min {min(cons):.2f}) | {100 * (c / f - 1):+.1f}% |")
    f, c, m = host_cost(eng, a.reps)
    print(f"host time per token (us, median of {a.reps}): free sampling {f:.0f}, constrained sampling "
          f"{c:.0f} (+{c - f:.0f}), mask {m:.0f} (during the forward)")
    eng.close()


if __name__ == "__main__":
    main()
