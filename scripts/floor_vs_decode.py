#!/usr/bin/env python3
"""The memory floor and both engines' decode, measured back to back, round by round.

A "share of the floor" means something only if the floor is read when the decode runs: on a
shared host the bandwidth other work leaves moves from one minute to the next. Each round runs
`scripts/memory_floor.py FILE` (its floor in GB/s), then tg of edgeinfer and of llama.cpp
(bench's runners, each engine in a worker process of its own), and prints the floor, each
decode in tokens/s and in GB/s (tokens/s x the bytes a token reads) and the load average.

The floor must be an upper bound: at the end, the fastest decode any engine reached (GB/s) is
checked against the best floor of the run; --check exits 1 when a decode passed it.

    python scripts/floor_vs_decode.py FILE [--rounds 5] [--threads 2] [--tg 32] [--check]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from edgeinfer.tools.decode_bytes import decode_bytes  # noqa: E402
from edgeinfer.tools.engine_process import ProcessRunner  # noqa: E402

PROMPT = 16


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tg", type=int, default=32)
    ap.add_argument("--floor-rounds", type=int, default=5, help="memory_floor.py --rounds")
    ap.add_argument("--check", action="store_true", help="exit 1 when a decode passes the best floor")
    a = ap.parse_args()
    path = str(Path(a.model).expanduser())
    per_token = decode_bytes(path).per_token(PROMPT + (a.tg + 1) / 2)   # bytes at the tg run's mean depth
    engines = [ProcessRunner(kind, None, path, a.threads, 256, 512) for kind in ("edgeinfer", "llama.cpp")]
    floors: list[float] = []
    best = {e.engine: 0.0 for e in engines}
    try:
        prompt = [100 + (i * 37) % 5000 for i in range(PROMPT)]
        for e in engines:
            e.tg(prompt, 8)   # warm-up
        for r in range(a.rounds):
            out = subprocess.run([sys.executable, str(HERE / "memory_floor.py"), path, "--json", "--depth", str(PROMPT),
                                  "--rounds", str(a.floor_rounds)], capture_output=True, text=True, check=True).stdout
            floor = json.loads(out)["floor_gb_per_s"]
            floors.append(floor)
            speeds = {e.engine: a.tg / e.tg(prompt, a.tg) for e in engines}
            cells = []
            for name, tok_s in speeds.items():
                gbs = tok_s * per_token / 1e9
                best[name] = max(best[name], gbs)
                cells.append(f"{name} {tok_s:.1f} t/s {gbs:.1f} GB/s ({gbs / floor:.0%})")
            print(f"round {r + 1}: floor {floor:.1f} GB/s | " + " | ".join(cells)
                  + f" | ratio {speeds['edgeinfer'] / speeds['llama.cpp']:.2f}x | load {os.getloadavg()[0]:.2f}",
                  flush=True)
    finally:
        for e in engines:
            e.close()
    top = max(floors)
    fastest = max(best, key=best.__getitem__)
    print(f"best floor {top:.1f} GB/s (rounds {min(floors):.1f}-{top:.1f}); fastest decode {fastest} "
          f"{best[fastest]:.1f} GB/s ({per_token / 1e6:.1f} MB/token) = {best[fastest] / top:.0%} of the best floor")
    if best[fastest] > top:
        print(f"!! a decode ({fastest}, {best[fastest]:.1f} GB/s) passed the floor ({top:.1f} GB/s): the floor is "
              "not an upper bound", file=sys.stderr)
        return 1 if a.check else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
