#!/usr/bin/env python3
"""What a prompt reads from the model's file once it is loaded: the major page faults and the
growth of the process's file-backed RSS (psutil's `shared`: RssFile + RssShmem) over a prompt of N random token ids, after the
file has been evicted from the page cache (as on a host that reclaims it). The packed weights
are in memory; what still comes from the file is what the runtime reads from its mapping (norms,
an untied token embedding's rows).

    python scripts/file_pages.py ~/.cache/edgeinfer/shapes/llama32-1b.llamacpp.Q4_K_M.gguf 2048
"""
from __future__ import annotations

import argparse
import os
import resource
import time

import numpy as np
import psutil

from edgeinfer.engine.engine import Engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("tokens", type=int, help="prompt length (random ids over the vocabulary)")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    eng = Engine.load(a.model, n_ctx=a.tokens + 16, n_threads=a.threads)
    fd = os.open(a.model, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)   # pages no process maps leave the cache
    finally:
        os.close(fd)
    ids = np.random.default_rng(0).integers(0, eng.config.n_vocab, a.tokens).tolist()
    proc = psutil.Process()
    rss0, flt0, t0 = proc.memory_info().shared, resource.getrusage(resource.RUSAGE_SELF).ru_majflt, time.perf_counter()
    eng.logits(ids)
    t1, flt1, rss1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_majflt, proc.memory_info().shared
    print(f"{os.path.basename(a.model)}: {a.tokens} tokens in {t1 - t0:.2f} s, {flt1 - flt0} major faults, "
          f"file-backed RSS +{(rss1 - rss0) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
