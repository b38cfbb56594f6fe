#!/usr/bin/env python3
"""Matvec speed of the packed kernels, in GB/s of packed weights: one token (decode), or with
--tokens N the prefill kernels' N tokens a weight pass (16 a pass with AVX-512 VNNI).

Times ei_matmul_packed with one activation row (or N) over a streaming matrix (--big-mb, well past the
caches) and a cache-resident one (--small-mb, the kernel's compute rate), at 1 and 2 threads,
best of --reps. Several builds can run in one process, interleaved (each rep runs every build,
the order rotating), so they see the same machine load: copy a built extension aside before a
change and pass both,

    cp edgeinfer/_native_ext.abi3.so /tmp/base.so      # before the change, then rebuild
    python scripts/bench_matvec.py --lib base=/tmp/base.so --lib new=edgeinfer/_native_ext.abi3.so

Each build packs its own copy (its layout), and the builds' outputs are compared bit for bit.
Threads are Python threads, each calling the kernel on its half of the rows (cffi drops the GIL
for the call); the cache-resident matrix is run --inner times per timing so that the thread
handoffs do not count. The machine may be shared: read the load average printed beside the
figures, and believe only large differences.
"""
from __future__ import annotations

import argparse
import os
import threading
import time

import cffi
import numpy as np

CDEF = """
typedef struct ei_kernels ei_kernels;
const ei_kernels *ei_kernels_get(int isa);
int64_t ei_act_stride(int64_t n_cols);
void ei_quantize_act_rows(const ei_kernels *k, const float *x, int64_t n_tok, int64_t n_cols, void *out,
                          int half_sums);
size_t ei_packed_bytes(const ei_kernels *k, int type, int64_t n_rows, int64_t n_cols);
void ei_pack(const ei_kernels *k, int type, const void *w, int64_t n_rows, int64_t n_cols, void *dst);
void ei_matmul_packed(const ei_kernels *k, int type, const void *packed, int64_t n_cols, int64_t r0, int64_t r1,
                      const void *act, int64_t act_stride, int64_t n_tok, float *y, int64_t ldy);
"""

# name -> (edgeinfer type id, block elements, block bytes, offsets of the block's f16 scales)
TYPES = {"Q4_0": (2, 32, 18, (0,)), "Q4_1": (3, 32, 20, (0, 2)), "Q5_0": (6, 32, 22, (0,)), "Q8_0": (8, 32, 34, (0,)),
         "Q4_K": (12, 256, 144, (0, 2)), "Q5_K": (13, 256, 176, (0, 2)), "Q6_K": (14, 256, 210, (208,)),
         "Q2_K": (10, 256, 84, (80, 82)), "Q3_K": (11, 256, 110, (108,)), "IQ4_NL": (20, 32, 18, (0,)),
         "IQ4_XS": (23, 256, 136, (0,))}
ISA_AVX512, ISA_AVX2 = 2, 1


def random_rows(name: str, n_rows: int, n_cols: int, rng: np.random.Generator) -> np.ndarray:
    _, be, bb, scales = TYPES[name]
    raw = rng.integers(0, 256, size=(n_rows, n_cols // be, bb), dtype=np.uint8)
    for off in scales:   # sane f16 scales (random bytes make NaN / inf)
        raw[:, :, off:off + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    return raw.reshape(n_rows, -1)


class Build:
    def __init__(self, label: str, path: str, isa: int):
        self.label, self.ffi = label, cffi.FFI()
        self.ffi.cdef(CDEF)
        self.lib = self.ffi.dlopen(os.path.abspath(path))
        self.k = self.lib.ei_kernels_get(isa)
        if self.k == self.ffi.NULL:
            raise SystemExit(f"{label}: ISA {isa} not available")
        self.packed: dict = {}

    def act_stride(self, n_cols: int) -> int:
        """Bytes between activation rows, as this build lays them out."""
        try:
            return self.lib.ei_act_stride(n_cols)
        except AttributeError:   # a build from before the rows were padded (ei_act_row_bytes)
            return n_cols // 32 * 48

    def pack(self, key, tid: int, raw: np.ndarray, n_cols: int) -> None:
        n = self.lib.ei_packed_bytes(self.k, tid, raw.shape[0], n_cols)
        if not n:
            raise SystemExit(f"{self.label}: type {tid} not packed at {raw.shape}")
        buf = aligned_empty(n)
        self.lib.ei_pack(self.k, tid, self.ffi.from_buffer(raw), raw.shape[0], n_cols, self.ffi.from_buffer(buf))
        self.packed[key] = buf

    def act(self, x: np.ndarray) -> np.ndarray:
        """x: [tokens, n_cols] -> activation rows, act_stride(n_cols) bytes apart."""
        out = aligned_empty(x.shape[0] * self.act_stride(x.shape[1]))
        out[:] = 0
        self.lib.ei_quantize_act_rows(self.k, self.ffi.cast("float *", self.ffi.from_buffer(x)), x.shape[0],
                                      x.shape[1], self.ffi.from_buffer(out), 1)
        return out


def aligned_empty(n: int, align: int = 64) -> np.ndarray:
    """n bytes starting on a cache line, as the runtime lays out its packed weights and
    activation rows (a 64-byte load at an odd 32 bytes reads two lines: the Q4_K one-token
    kernel ran 1.04x faster cache-resident on aligned rows, AMD Zen 4)."""
    raw = np.empty(n + align, np.uint8)
    start = -raw.ctypes.data % align
    return raw[start:start + n]


class Team:
    """n persistent threads; run(fn_per_thread) times one parallel pass."""

    def __init__(self, n: int):
        self.n, self.work = n, [None] * n
        self.start, self.done = threading.Barrier(n), threading.Barrier(n)
        for i in range(1, n):
            threading.Thread(target=self._loop, args=(i,), daemon=True).start()

    def _loop(self, i: int) -> None:
        while True:
            self.start.wait()
            self.work[i]()
            self.done.wait()

    def run(self, work: list) -> float:
        self.work = work
        if self.n == 1:
            t0 = time.perf_counter()
            work[0]()
            return time.perf_counter() - t0
        t0 = time.perf_counter()
        self.start.wait()
        work[0]()
        self.done.wait()
        return time.perf_counter() - t0


def split(n_rows: int, n: int) -> list[tuple[int, int]]:
    groups = n_rows // 16   # 16-row units: the AVX-512 two-group kernels stay whole
    cuts = [16 * (groups * i // n) for i in range(n)] + [n_rows]
    return list(zip(cuts[:-1], cuts[1:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", action="append", default=[], metavar="LABEL=PATH",
                    help="a built extension (default: the installed edgeinfer._native_ext)")
    ap.add_argument("--types", default="Q4_K,Q6_K")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--isa", type=int, default=ISA_AVX512, help="kernel table (2 avx512, 1 avx2)")
    ap.add_argument("--n-cols", type=int, default=2048)
    ap.add_argument("--big-mb", type=float, default=256)
    ap.add_argument("--small-mb", type=float, default=2)
    ap.add_argument("--inner", type=int, default=40, help="passes per timing, cache-resident matrix")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--sizes", default="big,small")
    ap.add_argument("--tokens", type=int, default=1, help="activation rows a pass (prefill kernels from 16)")
    args = ap.parse_args()

    if not args.lib:
        import edgeinfer._native_ext as ext
        args.lib = [f"installed={ext.__file__}"]
    builds = [Build(*spec.split("=", 1), args.isa) for spec in args.lib]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.tokens, args.n_cols)).astype(np.float32)
    acts = [b.act(x) for b in builds]
    teams = {n: Team(n) for n in map(int, args.threads.split(","))}
    print(f"load average before: {os.getloadavg()}")
    for name in args.types.split(","):
        tid, be, bb, _ = TYPES[name]
        row_bytes = args.n_cols // be * bb
        for size in args.sizes.split(","):
            mb = args.big_mb if size == "big" else args.small_mb
            n_rows = max(32, int(mb * 2**20 / row_bytes) // 32 * 32)
            raw = random_rows(name, n_rows, args.n_cols, rng)
            for b in builds:
                b.pack((name, size), tid, raw, args.n_cols)
            del raw
            inner = 1 if size == "big" else args.inner
            nbytes = builds[0].packed[(name, size)].size
            for nthr, team in teams.items():
                ys = [np.zeros(args.tokens * n_rows, np.float32) for _ in builds]
                best = [float("inf")] * len(builds)
                times: list[list[float]] = [[] for _ in builds]

                def work(bi: int, r0: int, r1: int):
                    b, y = builds[bi], ys[bi]
                    pk, act = b.ffi.from_buffer(b.packed[(name, size)]), b.ffi.from_buffer(acts[bi])
                    yp = b.ffi.cast("float *", b.ffi.from_buffer(y))
                    f, k, stride = b.lib.ei_matmul_packed, b.k, b.act_stride(args.n_cols)

                    def go():
                        for _ in range(inner):
                            f(k, tid, pk, args.n_cols, r0, r1, act, stride, args.tokens, yp, n_rows)
                    return go

                jobs = [[work(bi, r0, r1) for r0, r1 in split(n_rows, nthr)] for bi in range(len(builds))]
                for bi in range(len(builds)):   # warm up (page faults, caches)
                    team.run(jobs[bi])
                for rep in range(args.reps):
                    for j in range(len(builds)):
                        bi = (rep + j) % len(builds)
                        dt = team.run(jobs[bi]) / inner
                        times[bi].append(dt)
                        best[bi] = min(best[bi], dt)
                same = all(np.array_equal(ys[0], y) for y in ys[1:])
                cells = []
                for bi, b in enumerate(builds):
                    med = float(np.median(times[bi]))
                    cells.append(f"{b.label} {nbytes / best[bi] / 1e9:7.3f} (med {nbytes / med / 1e9:6.3f})")
                # the medians' ratio too: one lucky (or mistimed) rep moves a best
                ratio = (f"  {builds[-1].label}/{builds[0].label} best {best[0] / best[-1]:.3f}"
                         f" med {np.median(times[0]) / np.median(times[-1]):.3f}") if len(builds) > 1 else ""
                print(f"{name} {size:5s} {nbytes / 2**20:7.1f} MiB  {args.tokens} tok  {nthr} thr  GB/s best: "
                      + " | ".join(cells)
                      + ratio + ("" if same else "  OUTPUTS DIFFER"), flush=True)
            for b in builds:
                del b.packed[(name, size)]
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
