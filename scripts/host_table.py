#!/usr/bin/env python3
"""One host's table for docs/performance.md: every file's prefill and decode against llama.cpp, the
bytes a decoded token streams per second, and that as a share of the memory floor read in the same run.

Per file: `scripts/memory_floor.py FILE` (best of its rounds), then one interleaved `edgeinfer bench`
(edgeinfer and llama.cpp, each in a worker process of its own), then the floor again; the row's floor is
the better of the two readings. A decode faster than that floor is reported (the floor must be an upper
bound) and makes the exit status 1. The host (CPU model, ISA, load average) heads the output.

    python scripts/host_table.py FILE... [--threads 2] [--reps 3] [--pp 256] [--tg 32] [--depth N]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from edgeinfer.tools.bench import BenchConfig, cpu_name, run_bench  # noqa: E402


def floor_gb_s(path: str, threads: int, depth: int) -> float:
    out = subprocess.run([sys.executable, str(HERE / "memory_floor.py"), path, "--json", "--depth", str(depth),
                          "--threads", str(threads), "--rounds", "3"], capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout)["floor_gb_per_s"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pp", type=int, default=256)
    ap.add_argument("--tg", type=int, default=32)
    ap.add_argument("--depth", type=int, default=None, help="also decode with this many tokens in context")
    ap.add_argument("--json", help="write every bench result here as well")
    a = ap.parse_args()
    from edgeinfer.backends.cpu import cpu_report

    print(f"host: {cpu_name()}, {os.cpu_count()} CPUs, kernels {cpu_report()['best_isa']}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load {os.getloadavg()[0]:.2f}", flush=True)
    head = ("| file | edgeinfer pp / tg (t/s) | llama.cpp pp / tg | prefill | decode | decode GB/s "
            "(ours / llama.cpp) | floor GB/s | share of floor (ours) |")
    if a.depth:
        head += f" decode at depth {a.depth} (ours vs llama.cpp) |"
    rows, results, passed = [head, "| " + " | ".join(["---"] * (8 + bool(a.depth))) + " |"], [], False
    for f in a.files:
        path = str(Path(f).expanduser())
        before = floor_gb_s(path, a.threads, 16)
        cfg = BenchConfig(model=path, threads=[a.threads], pp=a.pp, tg=a.tg, reps=a.reps, compare=["llama.cpp"],
                          isolated_rss=False, process_per_engine=True, ctx_depth=a.depth)
        d = run_bench(cfg).to_dict()
        floor = max(before, floor_gb_s(path, a.threads, 16))
        ours, peer = d["runs"][0], d["runs"][1]
        ratio = d["ratios"][0]
        gbs = [r["tg"]["gb_per_s"]["median"] for r in (ours, peer)]
        fastest = max(r["tg"]["gb_per_s"]["max"] for r in (ours, peer))
        passed |= fastest > floor
        med = lambda r, k: r[k]["tokens_per_s"]["median"]   # noqa: E731
        row = (f"| {Path(path).name} | {med(ours, 'pp'):.1f} / {med(ours, 'tg'):.1f} | {med(peer, 'pp'):.1f} / "
               f"{med(peer, 'tg'):.1f} | **{ratio['pp']:.2f}x** | **{ratio['tg']:.2f}x** | {gbs[0]:.1f} / {gbs[1]:.1f} "
               f"| {floor:.1f} | {gbs[0] / floor:.0%} |")
        if a.depth:
            row += f" {med(ours, 'tg_depth'):.1f} vs {med(peer, 'tg_depth'):.1f} t/s, **{ratio['tg_depth']:.2f}x** |"
        rows.append(row)
        results.append(d)
        print(row + f"  (load {os.getloadavg()[0]:.2f})", flush=True)
    print("\n".join(rows))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    if passed:
        print("!! a decode passed the floor read in the same run: the floor is not an upper bound", file=sys.stderr)
    return 1 if passed else 0


if __name__ == "__main__":
    raise SystemExit(main())
