"""`edgeinfer quantize` against llama.cpp's quantizer (llama_model_quantize, what llama-quantize
runs, from llama-cpp-python) on the same GGUF: wall time and peak RSS, each engine in a process
of its own, interleaved (the order swapped every repetition), and whether the two files are the
same bytes.

    python scripts/quantize_bench.py model-f16.gguf --type q4_k_m --reps 3 --threads 2
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

_OURS = """
from edgeinfer.convert import quantize_gguf
quantize_gguf({src!r}, {dst!r}, {ftype!r}, n_threads={threads})
"""
_LLAMA = """
import ctypes, llama_cpp
from edgeinfer.convert import FILE_TYPES
p = llama_cpp.llama_model_quantize_default_params()
p.ftype, p.nthread = FILE_TYPES[{ftype!r}].llama_ftype, {threads}
assert llama_cpp.llama_model_quantize({src!r}.encode(), {dst!r}.encode(), ctypes.byref(p)) == 0
"""


def _run(code: str) -> tuple[float, float]:
    """(seconds, peak RSS MiB) of `code` in a fresh Python process."""
    probe = ("import resource, sys; exec(sys.argv[1]); "
             "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", probe, code], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"quantizer failed:\n{r.stderr[-3000:]}")
    return seconds, int(r.stderr.strip().splitlines()[-1]) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--type", default="q4_k_m")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    src = os.path.abspath(a.model)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(src)) as tmp:
        out = {"edgeinfer": os.path.join(tmp, "edgeinfer.gguf"), "llama.cpp": os.path.join(tmp, "llama.gguf")}
        code = {name: tpl.format(src=src, dst=out[name], ftype=a.type, threads=a.threads)
                for name, tpl in (("edgeinfer", _OURS), ("llama.cpp", _LLAMA))}
        runs: dict[str, list[tuple[float, float]]] = {"edgeinfer": [], "llama.cpp": []}
        for rep in range(a.reps):
            order = ("edgeinfer", "llama.cpp") if rep % 2 == 0 else ("llama.cpp", "edgeinfer")
            for name in order:
                runs[name].append(_run(code[name]))
                print(f"{name:10s} rep {rep}: {runs[name][-1][0]:.2f} s, peak RSS {runs[name][-1][1]:.0f} MiB",
                      flush=True)
        with open(out["edgeinfer"], "rb") as f1, open(out["llama.cpp"], "rb") as f2:
            identical = f1.read() == f2.read()
    med = {n: statistics.median(s for s, _ in r) for n, r in runs.items()}
    rss = {n: max(m for _, m in r) for n, r in runs.items()}
    result = {"model": src, "type": a.type, "threads": a.threads, "runs": runs, "median_s": med,
              "peak_rss_mib": rss, "identical": identical, "loadavg": os.getloadavg()}
    print(f"{a.type}, {a.threads} threads: edgeinfer {med['edgeinfer']:.2f} s / {rss['edgeinfer']:.0f} MiB, "
          f"llama.cpp {med['llama.cpp']:.2f} s / {rss['llama.cpp']:.0f} MiB; time ratio "
          f"{med['llama.cpp'] / med['edgeinfer']:.2f}x (above 1: edgeinfer faster); files "
          f"{'identical' if identical else 'DIFFERENT'}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
