"""TTFT of a ~2,000-token system prompt: cold, then after a restart with --prompt-cache
(docs/performance.md). Each run is its own process, as a restart is.

    python3 scripts/bench_prompt_cache.py MODEL.gguf [--threads 2] [--tokens 2000]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile


def one_run(model: str, cache: str | None, threads: int, tokens: int) -> dict:
    import edgeinfer

    eng = edgeinfer.load(model, n_ctx=4096, n_threads=threads, prompt_cache=cache)
    rule = " Rule: keep answers short, cite sources, and stay polite to every user."
    n_rule = len(eng.tokenize(rule, add_special=False))
    system = "You are the support assistant of a hardware shop." + rule * max(1, tokens // n_rule)
    prompt = system + "\nUser: Which board should I buy for a robot?\nAssistant:"
    out = eng.generate(prompt, max_tokens=8, temperature=0)
    if eng.scheduler.prompt_cache is not None:
        eng.scheduler.prompt_cache.flush()
    return {"prompt_tokens": out.stats.prompt_tokens, "cached_tokens": out.stats.cached_tokens,
            "ttft_s": out.stats.ttft_s, "text": out.text}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(one_run(a.model, a.child or None, a.threads, a.tokens)))
        return
    cache = tempfile.mkdtemp(prefix="eipc-")

    def run(cache_dir: str) -> dict:
        out = subprocess.run([sys.executable, __file__, a.model, "--threads", str(a.threads), "--tokens",
                              str(a.tokens), "--child", cache_dir], capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    cold = run("")                  # no cache at all
    fill = run(cache)               # computes the prompt and writes it
    warm = run(cache)               # a fresh process: the prompt comes from disk
    print(json.dumps({"cold": cold, "fill": fill, "after_restart": warm,
                      "ratio": warm["ttft_s"] / cold["ttft_s"], "same_text": warm["text"] == cold["text"]}, indent=1))


if __name__ == "__main__":
    main()
