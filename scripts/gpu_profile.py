"""Where the CUDA backend's time goes on SmolLM2-135M Q4_1: the host side of a decode step
(cProfile over the runner) and the device side (every kernel's time, from CUPTI through
torch.profiler, which records the kernels of any library in the process, graph replays too),
for a single-stream decode step and a 512-token prefill. Needs torch with CUDA.

    python scripts/gpu_profile.py [FILE.gguf]
"""
from __future__ import annotations

import cProfile
import pstats
import sys
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

import edgeinfer
from edgeinfer.backends import Batch
from edgeinfer.hub import DEFAULT_MODEL, ensure_model


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else str(ensure_model(DEFAULT_MODEL, progress=False))
    eng = edgeinfer.load(path, n_ctx=1024, n_slots=8, max_batch=512, device="cuda")
    runner, V = eng.runner, eng.config.n_vocab
    rng = np.random.default_rng(0)
    runner.clear_slot(0)
    runner.run(Batch.of_slot(0, rng.integers(0, V, 64), np.arange(64), np.arange(64), [63]))

    def step(p: int) -> None:
        runner.run(Batch(rng.integers(0, V, 1), [0], [p], [p], np.arange(1)))

    for p in range(64, 72):   # the graph is captured here
        step(p)
    t = time.perf_counter()
    for p in range(72, 200):
        step(p)
    print(f"decode step, wall: {(time.perf_counter() - t) / 128 * 1e3:.3f} ms (mean of 128)")

    prof = cProfile.Profile()
    prof.enable()
    for p in range(200, 328):
        step(p)
    prof.disable()
    print("host side of 128 decode steps (cProfile, by own time):")
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)

    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities) as p1:
        for p in range(328, 360):
            step(p)
        torch.cuda.synchronize()
    print("device side of 32 decode steps:")
    print(p1.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))

    runner.clear_slot(1)
    ids = rng.integers(0, V, 512)
    runner.run(Batch.of_slot(1, ids, np.arange(512), np.arange(512), [511]))
    runner.clear_slot(1)
    with profile(activities=activities) as p2:
        runner.run(Batch.of_slot(1, ids, np.arange(512), np.arange(512), [511]))
        torch.cuda.synchronize()
    print("device side of a 512-token prefill:")
    print(p2.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))
    eng.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
