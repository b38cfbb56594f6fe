"""GPU throughput of the CUDA backend on SmolLM2-135M Q4_1 (used by scripts/gpu_check.sh).

Prints pp512 (prefill tokens/s), single-stream decode tokens/s and batch-8
aggregate decode tokens/s, measured on the engine's runner directly (no sampling).
"""
from __future__ import annotations

import sys
import time

import numpy as np

import edgeinfer
from edgeinfer.backends import Batch
from edgeinfer.hub import DEFAULT_MODEL, ensure_model


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else str(ensure_model(DEFAULT_MODEL, progress=False))
    eng = edgeinfer.load(path, n_ctx=1024, n_slots=8, max_batch=512, device="cuda")
    runner, caps = eng.runner, eng.runner.caps
    print(f"device: {caps.isa}; weights {caps.device_bytes / 2**20:.1f} MiB, "
          f"KV {caps.kv_bytes / 2**20:.1f} MiB, scratch {caps.scratch_bytes / 2**20:.1f} MiB")
    rng = np.random.default_rng(0)
    V = eng.config.n_vocab

    def prefill(slot: int, n: int) -> float:
        runner.clear_slot(slot)
        ids = rng.integers(0, V, n)
        t = time.perf_counter()
        runner.run(Batch.of_slot(slot, ids, np.arange(n), np.arange(n), [n - 1]))
        return time.perf_counter() - t

    prefill(0, 512)   # warm-up
    pp = [512 / prefill(0, 512) for _ in range(5)]
    print(f"pp512: {np.median(pp):,.0f} tokens/s (median of 5)")

    def decode(slots: list[int], start: int, steps: int) -> float:
        n = len(slots)
        t = time.perf_counter()
        for i in range(steps):
            p = start + i
            runner.run(Batch(rng.integers(0, V, n), slots, [p] * n, [p] * n, np.arange(n)))
        return n * steps / (time.perf_counter() - t)

    for s in range(8):
        prefill(s, 64)
    decode([0], 64, 8)    # captures the graph
    print(f"tg256 single stream: {decode([0], 72, 256):,.0f} tokens/s")
    decode(list(range(8)), 328, 4)
    print(f"batch-8 decode: {decode(list(range(8)), 332, 128):,.0f} tokens/s aggregate")
    eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
