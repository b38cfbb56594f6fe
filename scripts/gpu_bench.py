"""GPU throughput of the CUDA backend on SmolLM2-135M Q4_1 (used by scripts/gpu_check.sh).

Prints pp512 (prefill tokens/s), single-stream decode tokens/s and batch-8
aggregate decode tokens/s, measured on Engine.runtime directly (no sampling).
"""
from __future__ import annotations

import sys
import time

import numpy as np

import edgeinfer
from edgeinfer.hub import DEFAULT_MODEL, ensure_model


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else str(ensure_model(DEFAULT_MODEL, progress=False))
    eng = edgeinfer.load(path, n_ctx=1024, n_slots=8, max_batch=512, device="cuda")
    rt = eng.runtime
    print(f"device: {rt.device.describe() if rt.device else '?'}; weights {rt.weight_bytes / 2**20:.1f} MiB, "
          f"KV {rt.kv_bytes / 2**20:.1f} MiB, scratch {rt.scratch_bytes / 2**20:.1f} MiB")
    rng = np.random.default_rng(0)
    V = eng.config.n_vocab
    i32 = lambda a: np.asarray(a, dtype=np.int32)  # noqa: E731

    def prefill(slot: int, n: int) -> float:
        rt.clear_slot(slot)
        ids = rng.integers(0, V, n)
        t = time.perf_counter()
        rt.forward(i32(ids), i32(np.full(n, slot)), i32(np.arange(n)), i32(np.arange(n)), i32([n - 1]))
        return time.perf_counter() - t

    prefill(0, 512)   # warm-up
    pp = [512 / prefill(0, 512) for _ in range(5)]
    print(f"pp512: {np.median(pp):,.0f} tokens/s (median of 5)")

    def decode(slots: list[int], start: int, steps: int) -> float:
        n = len(slots)
        t = time.perf_counter()
        for i in range(steps):
            p = start + i
            rt.forward(i32(rng.integers(0, V, n)), i32(slots), i32([p] * n), i32([p] * n), i32(np.arange(n)))
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
