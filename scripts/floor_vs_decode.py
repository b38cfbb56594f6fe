#!/usr/bin/env python3
"""The memory floor and both engines' decode, each decode between two reads of the same bytes.

A "share of the floor" means something only if the floor is read when the decode runs: on a
shared host the bandwidth other work leaves moves from one second to the next (on the 2-core
AMD EPYC VMs a 2-thread read switches between about 40 and 60-70 GB/s for seconds at a time).
The probe (memory_floor.c) first picks its best configuration over --floor-rounds rounds (the
run's floor, as `memory_floor.py FILE`), then stays up over a buffer of the file's weight bytes
and reads it with that configuration right before and right after every engine's tg, the best
of READS reads each time: one pair of reads per decode, milliseconds apart. Each read waits
SETTLE_S first, so that no engine's idle workers still spin on the CPUs it reads with. A decode
whose two reads agree within 15% ran while the host held steady, and its share is its GB/s
(tokens/s x the bytes a token reads) over the larger of the two. Each round runs tg of
edgeinfer and of llama.cpp (bench's runners, each engine in a worker process of its own), the
order alternating from round to round.

At the end: each engine's median share over its steady decodes, the median of the rounds'
edgeinfer / llama.cpp ratios, and the check: the fastest decode (GB/s) against the fastest
read of the run (the search's included); --check exits 1 when a decode passed it.

    python scripts/floor_vs_decode.py FILE [--rounds 9] [--threads 2] [--tg 32] [--check]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from memory_floor import FloorReader, probe  # noqa: E402

from edgeinfer.tools.decode_bytes import decode_bytes  # noqa: E402
from edgeinfer.tools.engine_process import ProcessRunner  # noqa: E402

PROMPT = 16
STEADY = 0.15   # the two reads around a decode agree within this share: the host did not switch
READS = 3       # a read is the best of this many back-to-back reads (one read alone is noisier than a decode)
SETTLE_S = 0.2   # before each read: the engines' worker threads stop spinning and leave the CPUs to it


class HostReads:
    """The probe over a file's weight bytes: its configuration search (`memory_floor.py FILE`'s,
    best of `floor_rounds` rounds), then `read()`: the best of READS back-to-back reads with the
    best configuration, after SETTLE_S. Every read is kept; `top` is the fastest, the search's
    included, so a caller that reads around all its decodes gets a floor from the same minutes."""

    def __init__(self, weight_bytes: int, threads: int, floor_rounds: int = 5):
        best = min(probe(weight_bytes, 0, threads, floor_rounds)["configs"], key=lambda c: c["weights_s"])
        self.cfg = (best["threads"], best["streams"], best["prefetch"])
        self.searched = weight_bytes / best["weights_s"] / 1e9
        self.summary = (f"probe's best configuration {self.cfg[0]} thread(s), {self.cfg[1]} stream(s), prefetch "
                        f"{'on' if self.cfg[2] else 'off'}: {self.searched:.1f} GB/s (best of {floor_rounds} rounds)")
        self.reads: list[float] = []
        self._reader = FloorReader(weight_bytes, self.cfg[0])

    def read(self) -> float:
        time.sleep(SETTLE_S)
        gb_s = max(self._reader.gb_s(*self.cfg) for _ in range(READS))
        self.reads.append(gb_s)
        return gb_s

    @property
    def top(self) -> float:
        return max([self.searched, *self.reads])

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> "HostReads":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def paired_rounds(path: str, host: HostReads, rounds: int = 9, threads: int = 2, tg: int = 32,
                  say=print) -> dict:
    """The rounds described above, reading with `host` (a HostReads over the file's weight bytes);
    `say` gets one line per round. {per_token_bytes, searched_gb_per_s, shares {engine: [steady
    shares]}, fastest {engine: GB/s}, reads [GB/s, the rounds'], ratios [per round],
    top_read_gb_per_s (the fastest of all host's reads, the search's included)}."""
    per_token = decode_bytes(path).per_token(PROMPT + (tg + 1) / 2)   # bytes at the tg run's mean depth
    say(f"{Path(path).name}: {per_token / 1e6:.1f} MB a token; {host.summary}")
    engines = [ProcessRunner(kind, None, path, threads, 256, 512) for kind in ("edgeinfer", "llama.cpp")]
    shares: dict[str, list[float]] = {e.engine: [] for e in engines}
    fastest = {e.engine: 0.0 for e in engines}
    reads: list[float] = []
    ratios: list[float] = []
    try:
        prompt = [100 + (i * 37) % 5000 for i in range(PROMPT)]
        for e in engines:
            e.tg(prompt, 8)   # warm-up
        for r in range(rounds):
            cells, tok_s = [], {}
            for e in (engines if r % 2 == 0 else engines[::-1]):
                before = host.read()
                tok_s[e.engine] = tg / e.tg(prompt, tg)
                after = host.read()
                reads += [before, after]
                gbs = tok_s[e.engine] * per_token / 1e9
                fastest[e.engine] = max(fastest[e.engine], gbs)
                steady = abs(before - after) <= STEADY * max(before, after)
                if steady:
                    shares[e.engine].append(gbs / max(before, after))
                cells.append(f"{e.engine} {tok_s[e.engine]:.1f} t/s {gbs:.1f} GB/s between reads of {before:.1f} "
                             f"/ {after:.1f} ({gbs / max(before, after):.0%}{'' if steady else ', unsteady'})")
            ratios.append(tok_s["edgeinfer"] / tok_s["llama.cpp"])
            say(f"round {r + 1}: " + " | ".join(cells) + f" | ratio {ratios[-1]:.2f}x | "
                f"load {os.getloadavg()[0]:.2f}")
    finally:
        for e in engines:
            e.close()
    return {"per_token_bytes": per_token, "searched_gb_per_s": host.searched, "shares": shares, "fastest": fastest,
            "reads": reads, "ratios": ratios, "top_read_gb_per_s": host.top}


def median_share(res: dict, engine: str) -> Optional[float]:
    v = res["shares"][engine]
    return statistics.median(v) if v else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tg", type=int, default=32)
    ap.add_argument("--floor-rounds", type=int, default=5, help="rounds of the probe's configuration search")
    ap.add_argument("--check", action="store_true", help="exit 1 when a decode passes the fastest read")
    a = ap.parse_args()
    path = str(Path(a.model).expanduser())
    with HostReads(decode_bytes(path).weight_bytes, a.threads, a.floor_rounds) as host:
        res = paired_rounds(path, host, a.rounds, a.threads, a.tg, say=lambda line: print(line, flush=True))
    print("median share of the reads around each steady decode: " + ", ".join(
        f"{n} {median_share(res, n):.0%} ({len(v)} of {a.rounds})" if v else f"{n} - (no steady decode)"
        for n, v in res["shares"].items()) + f"; median edgeinfer / llama.cpp {statistics.median(res['ratios']):.2f}x")
    top, fastest = res["top_read_gb_per_s"], res["fastest"]
    quickest = max(fastest, key=fastest.__getitem__)
    print(f"fastest read {top:.1f} GB/s (the search's {res['searched_gb_per_s']:.1f}, reads {min(res['reads']):.1f}-"
          f"{max(res['reads']):.1f}); fastest decode {quickest} {fastest[quickest]:.1f} GB/s = "
          f"{fastest[quickest] / top:.0%} of it")
    if fastest[quickest] > top:
        print(f"!! a decode ({quickest}, {fastest[quickest]:.1f} GB/s) passed the fastest read ({top:.1f} GB/s): "
              "the floor is not an upper bound", file=sys.stderr)
        return 1 if a.check else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
