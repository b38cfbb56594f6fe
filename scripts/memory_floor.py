#!/usr/bin/env python3
"""The memory floor of decoding at depth: how much of its speed a decoded token can keep once
the context holds N tokens, if every byte must come from memory at this machine's rate.

A decoded token reads all the weights plus every K/V row of its context. This streams the
model's weight bytes, then times streaming the KV bytes at the given depth (which the weights
pushed out of the cache), with the given threads, best of a few rounds; compiled with the
system C compiler.

    python scripts/memory_floor.py [MODEL] --depth 1500 --threads 2 [--kv f16|q8_0]

Prints the bytes, both stream times, and the floor: t(weights) / (t(weights) + t(KV)) is the
largest share of its shallow decode speed any engine streaming at that rate can keep at depth.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from edgeinfer.tools.plan import kv_bytes, model_shape  # noqa: E402


def build() -> Path:
    exe = Path(tempfile.gettempdir()) / f"edgeinfer_memory_floor_{os.getuid()}"
    src = HERE / "memory_floor.c"
    if not exe.exists() or exe.stat().st_mtime < src.stat().st_mtime:
        subprocess.run([os.environ.get("CC", "cc"), "-O2", "-pthread", str(src), "-o", str(exe)], check=True)
    return exe


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="default")
    ap.add_argument("--depth", type=int, default=1500, help="context tokens a decoded token attends to")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv", default="f16", help="KV arena type: f16 or q8_0")
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args()
    m = model_shape(a.model)
    kv = kv_bytes(m, a.depth, 1, a.kv)
    out = subprocess.run([str(build()), str(m.weights_bytes), str(kv), str(a.threads), str(a.rounds)],
                         check=True, capture_output=True, text=True).stdout.split()
    tw, tk = float(out[0]), float(out[1])
    print(f"model {m.name}: weights {m.weights_bytes / 1e6:.1f} MB; KV at depth {a.depth} ({a.kv}) {kv / 1e6:.1f} MB")
    print(f"{a.threads} thread(s): weights stream in {tw * 1e3:.2f} ms ({m.weights_bytes / tw / 1e9:.1f} GB/s), "
          f"KV in {tk * 1e3:.2f} ms ({kv / tk / 1e9:.1f} GB/s)")
    print(f"floor: at most {tw / (tw + tk) * 100:.0f}% of shallow decode speed kept at depth {a.depth}; "
          f"bandwidth-bound decode ceiling {1 / tw:.0f} tok/s shallow, {1 / (tw + tk):.0f} tok/s at depth")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
