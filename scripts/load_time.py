#!/usr/bin/env python3
"""Time to load a model, edgeinfer against llama.cpp, each load in a fresh process (what a CLI
run or a server start pays), the engines' order rotating every round. Only the load is timed:
from the call that opens the file to the engine ready to take a prompt (edgeinfer packs its
weights then; llama.cpp maps the file). Prints each engine's median and range.

    python scripts/load_time.py ~/.cache/edgeinfer/shapes/llama32-1b.llamacpp.Q4_K_M.gguf --rounds 8
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

LOADERS = {
    "edgeinfer": "from edgeinfer.engine.engine import Engine as E\n"
                 "t = time.perf_counter(); e = E.load(path, n_ctx=ctx, n_threads=threads)\n",
    "llama.cpp": "import llama_cpp\n"
                 "t = time.perf_counter(); e = llama_cpp.Llama(path, n_ctx=ctx, n_threads=threads, verbose=False)\n",
}


def load_once(engine: str, path: str, ctx: int, threads: int) -> float:
    code = (f"import time\npath, ctx, threads = {path!r}, {ctx}, {threads}\n" + LOADERS[engine]
            + "print(time.perf_counter() - t)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    engines = list(LOADERS)
    times: dict[str, list[float]] = {e: [] for e in engines}
    for r in range(a.rounds):
        for e in engines[r % 2:] + engines[:r % 2]:
            times[e].append(load_once(e, a.model, a.ctx, a.threads))
    for e, ts in times.items():
        print(f"{e:10s} load {statistics.median(ts):.2f} s median ({min(ts):.2f}-{max(ts):.2f}, {len(ts)} fresh processes)")


if __name__ == "__main__":
    main()
