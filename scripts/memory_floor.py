#!/usr/bin/env python3
"""The memory floor of decoding: the fastest this machine can read the bytes a decoded token
reads, an upper bound no engine's decode may pass.

    python scripts/memory_floor.py [MODEL] [--depth 1500] [--threads N] [--kv f16|q8_0]
                                   [--decode TOK_S ...] [--decode-depth D] [--check] [--json]

MODEL is any GGUF file (or a known model name), of any architecture: the bytes come from its
tensor table, the KV shape from its metadata (edgeinfer/tools/decode_bytes.py: every matrix
once, the tied output head included, one row of the token embedding; the K/V of the context).

The probe (memory_floor.c, built with the system C compiler: no -march, the ISA picked at
run time) reads the weight bytes with every configuration of 1, 2, 4, ... and N threads, 1/4/8
independent streams per thread and software prefetch on/off, round-robin, best of --rounds
each, then the KV bytes at --depth after them. The floor is the fastest configuration's
weight read rate. Prints the bytes, the floor in GB/s, the bandwidth-bound decode ceiling
(tokens/s), the share of shallow decode speed a decode at --depth can keep, and the 1-minute
load average before and after: on a shared machine other jobs' traffic slows every read, so
a loaded run understates the machine (repeat it; the best counts).

--decode TOK_S (repeatable) checks observed decode speeds (at --decode-depth cells of
context, default 16) against the floor: tokens/s x bytes per token must not exceed it. A
decode above the floor means the floor is wrong (not an upper bound); --check then exits 1.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from edgeinfer.tools.decode_bytes import decode_bytes  # noqa: E402
from edgeinfer.tools.plan import KV_TYPES  # noqa: E402


def build() -> Path:
    exe = Path(tempfile.gettempdir()) / f"edgeinfer_memory_floor_{os.getuid()}"
    src = HERE / "memory_floor.c"
    if not exe.exists() or exe.stat().st_mtime < src.stat().st_mtime:
        subprocess.run([os.environ.get("CC", "cc"), "-O2", "-pthread", str(src), "-o", str(exe)], check=True)
    return exe


def probe(weight_bytes: int, kv_bytes: int, threads: int, rounds: int) -> dict:
    """Runs the C probe: {isa, hugepages, configs: [{threads, streams, prefetch, weights_s, kv_s,
    median_weights_s}]}."""
    out = subprocess.run([str(build()), str(weight_bytes), str(kv_bytes), str(threads), str(rounds)],
                         check=True, capture_output=True, text=True).stdout
    res: dict = {"configs": []}
    for line in out.splitlines():
        f = line.split()
        if f[0] == "isa":
            res["isa"] = f[1]
        elif f[0] == "hugepages":
            res["hugepages"] = float(f[1])
        elif f[0] == "config":
            res["configs"].append({"threads": int(f[1]), "streams": int(f[2]), "prefetch": bool(int(f[3])),
                                   "weights_s": float(f[4]), "kv_s": float(f[5]), "median_weights_s": float(f[6])})
    return res


class FloorReader:
    """The probe kept running over one buffer of `weight_bytes` (its serve mode): `gb_s(...)` times
    one read of them with a given configuration, so a caller can read the machine's bandwidth
    right before and after each of its own measurements."""

    def __init__(self, weight_bytes: int, threads: int):
        self.weight_bytes = weight_bytes
        self.proc = subprocess.Popen([str(build()), str(weight_bytes), "0", str(threads), "1", "serve"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(2):   # the probe's "isa" and "hugepages" lines
            self.proc.stdout.readline()

    def gb_s(self, threads: int, streams: int, prefetch: bool) -> float:
        self.proc.stdin.write(f"{threads} {streams} {int(prefetch)}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().strip()
        if not line or line == "error":
            raise RuntimeError(f"memory_floor probe: no read for {threads} thread(s), {streams} stream(s)")
        return self.weight_bytes / float(line) / 1e9

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()

    def __enter__(self) -> "FloorReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="default")
    ap.add_argument("--depth", type=int, default=1500, help="context cells a decoded token attends to")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="the most threads tried (1, 2, 4, ... and N are tried)")
    ap.add_argument("--kv", default="f16", help="KV arena type: f16 or q8_0")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--decode", type=float, action="append", default=[], metavar="TOK_S",
                    help="an observed decode speed to check against the floor (repeatable)")
    ap.add_argument("--decode-depth", type=int, default=16, help="context cells of the --decode runs")
    ap.add_argument("--check", action="store_true", help="exit 1 when a --decode passes the floor")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    a = ap.parse_args()
    if a.kv not in KV_TYPES:
        ap.error(f"--kv must be one of {', '.join(KV_TYPES)}")
    if a.depth < 1 or a.threads < 1 or a.rounds < 1 or a.decode_depth < 0 or any(d <= 0 for d in a.decode):
        ap.error("--depth, --threads, --rounds and --decode must be positive")
    from edgeinfer.hub import resolve_model

    m = decode_bytes(resolve_model(a.model))
    w, kv = m.weight_bytes, m.kv_read(a.depth, a.kv)
    load0 = os.getloadavg()[0]
    p = probe(w, kv, a.threads, a.rounds)
    load1 = os.getloadavg()[0]
    best = min(p["configs"], key=lambda c: c["weights_s"])
    tw = best["weights_s"]
    tk = min((c["kv_s"] for c in p["configs"] if c["threads"] == best["threads"]), default=0.0)
    floor = w / tw / 1e9
    median = w / best["median_weights_s"] / 1e9   # the same loop's median read: the host's spread
    per_token = m.per_token(a.decode_depth, a.kv)
    checks = [{"tokens_per_s": t, "gb_per_s": t * per_token / 1e9, "share_of_floor": t * per_token / 1e9 / floor}
              for t in a.decode]
    over = [c for c in checks if c["gb_per_s"] > floor]
    res = {"model": m.name, "path": str(m.path), "file_bytes": m.file_bytes, "weight_bytes": w,
           "untied_embd_bytes": m.untied_embd_bytes, "depth": a.depth, "kv": a.kv, "kv_bytes": kv,
           "isa": p.get("isa"), "hugepages": p.get("hugepages"), "rounds": a.rounds,
           "floor_gb_per_s": floor, "median_gb_per_s": median, "best": best, "kv_gb_per_s": kv / tk / 1e9 if tk else None,
           "ceiling_tokens_per_s": 1 / tw, "ceiling_at_depth_tokens_per_s": 1 / (tw + tk),
           "kept_at_depth": tw / (tw + tk), "loadavg_before": load0, "loadavg_after": load1,
           "n_cpus": os.cpu_count(), "decode_depth": a.decode_depth, "decode_bytes_per_token": per_token,
           "decode_checks": checks, "floor_below_decode": bool(over)}
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        untied = (f" (file tensors {m.tensor_bytes / 1e6:.1f} MB less the untied token embedding "
                  f"{m.untied_embd_bytes / 1e6:.1f} MB, plus one of its rows)" if m.untied_embd_bytes else "")
        print(f"model {m.name} ({m.path.name}, {m.file_bytes / 1e6:.1f} MB): weights streamed per token "
              f"{w / 1e6:.1f} MB{untied}; KV at depth {a.depth} ({a.kv}) {kv / 1e6:.1f} MB")
        print(f"read loop: {p.get('isa')}, huge pages {p.get('hugepages', 0):.0%} granted; best of {a.rounds} "
              f"rounds: {best['threads']} thread(s), {best['streams']} stream(s) each, prefetch "
              f"{'on' if best['prefetch'] else 'off'}")
        for t in sorted({c["threads"] for c in p["configs"]}):
            bt = min(c["weights_s"] for c in p["configs"] if c["threads"] == t)
            print(f"  {t} thread(s): weights at {w / bt / 1e9:.1f} GB/s")
        print(f"floor {floor:.1f} GB/s: weights stream in {tw * 1e3:.2f} ms, KV in {tk * 1e3:.2f} ms "
              f"({res['kv_gb_per_s'] or 0:.1f} GB/s)")
        print(f"the same loop's median read: {median:.1f} GB/s ({median / floor:.0%} of its best)")
        print(f"floor: at most {tw / (tw + tk) * 100:.0f}% of shallow decode speed kept at depth {a.depth}; "
              f"bandwidth-bound decode ceiling {1 / tw:.1f} tok/s shallow, {1 / (tw + tk):.1f} tok/s at depth")
        print(f"load average (1 min) {load0:.2f} before, {load1:.2f} after, on {os.cpu_count()} CPUs")
        for c in checks:
            verdict = ("ABOVE THE FLOOR: the floor is not an upper bound (a bug in the floor, or the "
                       "bytes per token)" if c in over else "below the floor")
            print(f"decode {c['tokens_per_s']:.1f} tok/s x {per_token / 1e6:.1f} MB/token (depth "
                  f"{a.decode_depth}) = {c['gb_per_s']:.1f} GB/s = {c['share_of_floor']:.0%} of the floor: {verdict}")
    if over:
        print(f"memory_floor: {len(over)} observed decode(s) above the floor {floor:.1f} GB/s", file=sys.stderr)
        return 1 if a.check else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
