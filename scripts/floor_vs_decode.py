#!/usr/bin/env python3
"""The DRAM floor and both engines' decode, measured back to back, round by round.

A "share of the floor" means something only if the floor is read when the decode runs: on a
shared host the bandwidth other work leaves moves from one minute to the next. Each round runs
`scripts/memory_floor.py FILE` (its decode ceiling), then tg32 of edgeinfer and of llama.cpp
(bench's runners, each engine in a worker process of its own), and prints the three.

    python scripts/floor_vs_decode.py FILE [--rounds 5] [--threads 2] [--tg 32]
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from edgeinfer.tools.engine_process import ProcessRunner  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tg", type=int, default=32)
    a = ap.parse_args()
    path = str(Path(a.model).expanduser())
    engines = [ProcessRunner(kind, None, path, a.threads, 256, 512) for kind in ("edgeinfer", "llama.cpp")]
    try:
        prompt = [100 + (i * 37) % 5000 for i in range(16)]
        for e in engines:
            e.tg(prompt, 8)   # warm-up
        for r in range(a.rounds):
            out = subprocess.run([sys.executable, str(HERE / "memory_floor.py"), path, "--threads", str(a.threads)],
                                 capture_output=True, text=True, check=True).stdout
            ceiling = float(re.search(r"ceiling ([\d.]+) tok/s", out).group(1))
            ours, peer = (a.tg / e.tg(prompt, a.tg) for e in engines)
            print(f"round {r + 1}: ceiling {ceiling:.1f} t/s | edgeinfer {ours:.1f} ({ours / ceiling:.0%}) | "
                  f"llama.cpp {peer:.1f} ({peer / ceiling:.0%}) | ratio {ours / peer:.2f}x", flush=True)
    finally:
        for e in engines:
            e.close()


if __name__ == "__main__":
    main()
