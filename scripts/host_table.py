#!/usr/bin/env python3
"""One host's table for docs/performance.md: every file's prefill and decode against llama.cpp, the
bytes a decoded token streams per second, and that as a share of the machine's read bandwidth read
around each decode.

Per file: one interleaved `edgeinfer bench` (edgeinfer and llama.cpp, each in a worker process of
its own; the ratios), then `floor_vs_decode.py`'s paired rounds (--pair-rounds): each engine's tg
between two reads of the same bytes by the memory probe, milliseconds apart, so that the share
compares a decode with the bandwidth the host gave in that second (on the shared 2-core VMs it
switches between about 30 and 60-70 GB/s). The share is the median over the steady rounds. The
floor is the host's, not a file's: the fastest read of the whole run (every file's probe reads,
each far larger than the caches: the search's, one right before every timed step of the bench,
and two around each paired decode, so that the reads sample the minutes the decodes ran in),
and the table prints it under every file. A decode faster than
it is reported (the reads must be an upper bound) and makes the exit status 1. The host (CPU
model, ISA, load average) heads the output.

    python scripts/host_table.py FILE... [--threads 2] [--reps 3] [--pp 256] [--tg 32] [--depth N]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from floor_vs_decode import HostReads, median_share, paired_rounds  # noqa: E402

from edgeinfer.tools.bench import BenchConfig, cpu_name, run_bench  # noqa: E402
from edgeinfer.tools.decode_bytes import decode_bytes  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pp", type=int, default=256)
    ap.add_argument("--tg", type=int, default=32)
    ap.add_argument("--depth", type=int, default=None, help="also decode with this many tokens in context")
    ap.add_argument("--pair-rounds", type=int, default=7, help="floor_vs_decode.py rounds per file")
    ap.add_argument("--json", help="write every bench result here as well")
    a = ap.parse_args()
    from edgeinfer.backends.cpu import cpu_report

    print(f"host: {cpu_name()}, {os.cpu_count()} CPUs, kernels {cpu_report()['best_isa']}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load {os.getloadavg()[0]:.2f}", flush=True)
    head = ("| file | edgeinfer pp / tg (t/s) | llama.cpp pp / tg | prefill | decode | decode GB/s "
            "(ours / llama.cpp) | fastest read of the run GB/s | share of the reads around each decode (ours / llama.cpp) |")
    if a.depth:
        head += f" decode at depth {a.depth} (ours vs llama.cpp) |"
    rows, results, decodes = [head, "| " + " | ".join(["---"] * (8 + bool(a.depth))) + " |"], [], []
    for f in a.files:
        path = str(Path(f).expanduser())
        cfg = BenchConfig(model=path, threads=[a.threads], pp=a.pp, tg=a.tg, reps=a.reps, compare=["llama.cpp"],
                          isolated_rss=False, process_per_engine=True, ctx_depth=a.depth)
        with HostReads(decode_bytes(path).weight_bytes, a.threads) as host:
            d = run_bench(cfg, before_step=host.read).to_dict()
            d["bench_reads_gb_per_s"] = list(host.reads)
            pair = paired_rounds(path, host, a.pair_rounds, a.threads, a.tg,
                                 say=lambda line: print("  " + line, flush=True))
        d["paired"] = pair
        ours, peer = d["runs"][0], d["runs"][1]
        ratio = d["ratios"][0]
        gbs = [r["tg"]["gb_per_s"]["median"] for r in (ours, peer)]
        decodes.append(max([r["tg"]["gb_per_s"]["max"] for r in (ours, peer)] + list(pair["fastest"].values())))
        share = " / ".join("-" if median_share(pair, n) is None else f"{median_share(pair, n):.0%}"
                           for n in ("edgeinfer", "llama.cpp"))
        med = lambda r, k: r[k]["tokens_per_s"]["median"]   # noqa: E731
        row = (f"| {Path(path).name} | {med(ours, 'pp'):.1f} / {med(ours, 'tg'):.1f} | {med(peer, 'pp'):.1f} / "
               f"{med(peer, 'tg'):.1f} | **{ratio['pp']:.2f}x** | **{ratio['tg']:.2f}x** | {gbs[0]:.1f} / {gbs[1]:.1f} "
               f"| {{floor}} | {share} |")
        if a.depth:
            row += f" {med(ours, 'tg_depth'):.1f} vs {med(peer, 'tg_depth'):.1f} t/s, **{ratio['tg_depth']:.2f}x** |"
        rows.append(row)
        results.append(d)
        so_far = max(r["paired"]["top_read_gb_per_s"] for r in results)
        print(row.replace("{floor}", f"{so_far:.1f} so far") + f"  (load {os.getloadavg()[0]:.2f})", flush=True)
    floor = max(d["paired"]["top_read_gb_per_s"] for d in results)
    print("\n".join(row.replace("{floor}", f"{floor:.1f}") for row in rows))
    print(f"fastest read of the run {floor:.1f} GB/s; fastest decode {max(decodes):.1f} GB/s")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    if max(decodes) > floor:
        print("!! a decode passed the fastest read of the run: the reads are not an upper bound", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
