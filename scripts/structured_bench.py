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
    eng.close()


if __name__ == "__main__":
    main()
