"""The gated delta rule's two forms per ISA, one thread: token by token (decode) against the
chunked form (prefill, chunks of 64 as native/src/recurrent.c runs them), at Qwen3.5's head shape
(dk = dv = 128). Forms and ISAs interleaved in each round; the best round is reported, in this
thread's CPU time (a shared host's other load does not count).

    python scripts/bench_deltanet.py [--tokens 512] [--heads 16] [--rounds 7] [--chunk 64]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from edgeinfer._native_ext import ffi, lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--chunk", type=int, default=64)
    a = ap.parse_args()
    T, H, D = a.tokens, a.heads, a.dim
    rng = np.random.default_rng(0)
    unit = lambda x: (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)  # noqa: E731
    q = unit(rng.standard_normal((T, H, D))) / np.float32(np.sqrt(D))
    k = unit(rng.standard_normal((T, H, D)))
    v = rng.standard_normal((T, H, D)).astype(np.float32)
    g = (-np.abs(rng.standard_normal((T, H))) * 0.1).astype(np.float32)
    beta = rng.uniform(0, 1, (T, H)).astype(np.float32)
    f = lambda x: ffi.from_buffer("float[]", x)  # noqa: E731
    isas = [n for n in ("scalar", "avx2", "avx512", "neon") if lib.ei_isa_supported(getattr(lib, "EI_ISA_" + n.upper()))]
    best: dict[tuple[str, int], float] = {}
    for _ in range(a.rounds):
        for isa in isas:
            for chunk in (0, a.chunk):
                st = np.zeros((H, D, D), np.float32)
                o = np.zeros((T, H, D), np.float32)
                t0 = time.thread_time()
                rc = lib.ei_kernel_delta_rule(getattr(lib, "EI_ISA_" + isa.upper()), chunk, f(q), f(k), f(v), f(g),
                                              f(beta), T, H, H, D, D, f(st), f(o))
                dt = time.thread_time() - t0
                assert rc == lib.EI_OK
                best[isa, chunk] = min(best.get((isa, chunk), 1e9), dt)
    print(f"{T} tokens x {H} heads, dk = dv = {D}, best of {a.rounds}: us per token-head")
    print(f"{'isa':8} {'step':>8} {'chunk ' + str(a.chunk):>9} {'speedup':>8}")
    for isa in isas:
        s, c = best[isa, 0] / T / H * 1e6, best[isa, a.chunk] / T / H * 1e6
        print(f"{isa:8} {s:8.2f} {c:9.2f} {s / c:7.2f}x")


if __name__ == "__main__":
    main()
