#!/usr/bin/env python3
"""The memory floor of decoding at depth: how much of its speed a decoded token can keep once
the context holds N tokens, if every byte must come from memory at this machine's rate.

A decoded token reads all the weights plus every K/V row of its context. This streams the
model's weight bytes, then times streaming the KV bytes at the given depth (which the weights
pushed out of the cache), with the given threads, best of a few rounds; compiled with the
system C compiler.

    python scripts/memory_floor.py [MODEL] --depth 1500 --threads 2 [--kv f16|q8_0]

MODEL is any GGUF file (or a known model name), of any architecture: the bytes come from its
tensor table, the KV shape from its metadata. The weight bytes a decoded token streams are
every tensor's bytes, less the token embedding when the file has a separate output matrix
(then the embedding is read one row per token; tied files read it all as the output).

Prints the bytes, both stream times, and the floor: t(weights) / (t(weights) + t(KV)) is the
largest share of its shallow decode speed any engine streaming at that rate can keep at depth;
1 / t(weights) is the bandwidth-bound decode ceiling in tokens/s (the "DRAM floor" the
benchmarks compare engines with). Also prints the 1-minute load average before and after:
on a shared machine, other jobs' traffic slows the stream, so a loaded run understates the
machine.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from edgeinfer.tools.plan import KV_TYPES  # noqa: E402


class Shape:
    """What the floor needs from a GGUF file: tensor bytes and the KV cache's shape."""

    def __init__(self, model: str):
        from edgeinfer.gguf.reader import GGUFFile
        from edgeinfer.hub import resolve_model

        self.path = Path(resolve_model(model))
        g = GGUFFile(self.path)
        try:
            md, tensors = g.metadata, g.tensors
            arch = str(md.get("general.architecture", ""))
            self.name = str(md.get("general.name", "") or self.path.stem)
            self.file_bytes = self.path.stat().st_size
            self.tensor_bytes = sum(int(t.nbytes) for t in tensors.values())
            emb = tensors.get("token_embd.weight")
            # untied: the embedding is gathered one row per token, not streamed
            self.untied_embd_bytes = int(emb.nbytes) if emb is not None and "output.weight" in tensors else 0
            self.weights_bytes = self.tensor_bytes - self.untied_embd_bytes

            def key(k, default=None):
                v = md.get(f"{arch}.{k}", default)
                return v[0] if isinstance(v, (list, tuple)) and v else v   # per-layer arrays

            self.n_layer = int(key("block_count", 0) or 0)
            n_head = int(key("attention.head_count", 0) or 0)
            n_head_kv = int(key("attention.head_count_kv", n_head) or 0)
            n_embd = int(key("embedding_length", 0) or 0)
            k_len = int(key("attention.key_length", n_embd // max(n_head, 1)) or 0)
            v_len = int(key("attention.value_length", k_len) or 0)
            self.kv_row_elems = n_head_kv * (k_len + v_len)   # K and V elements per layer and token
        finally:
            g.close()

    def kv_bytes(self, depth: int, kv: str) -> int:
        """Every layer's K and V for `depth` tokens (a sliding-window layer reads fewer: an upper bound)."""
        return int(round(self.n_layer * self.kv_row_elems * depth * KV_TYPES[kv]))


def build() -> Path:
    exe = Path(tempfile.gettempdir()) / f"edgeinfer_memory_floor_{os.getuid()}"
    src = HERE / "memory_floor.c"
    if not exe.exists() or exe.stat().st_mtime < src.stat().st_mtime:
        subprocess.run([os.environ.get("CC", "cc"), "-O2", "-pthread", str(src), "-o", str(exe)], check=True)
    return exe


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="default")
    ap.add_argument("--depth", type=int, default=1500, help="context tokens a decoded token attends to")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv", default="f16", help="KV arena type: f16 or q8_0")
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args()
    if a.kv not in KV_TYPES:
        ap.error(f"--kv must be one of {', '.join(KV_TYPES)}")
    if a.depth < 1 or a.threads < 1 or a.rounds < 1:
        ap.error("--depth, --threads and --rounds must be positive")
    m = Shape(a.model)
    kv = m.kv_bytes(a.depth, a.kv)
    load0 = os.getloadavg()[0]
    out = subprocess.run([str(build()), str(m.weights_bytes), str(kv), str(a.threads), str(a.rounds)],
                         check=True, capture_output=True, text=True).stdout.split()
    tw, tk = float(out[0]), float(out[1])
    untied = (f" (file tensors {m.tensor_bytes / 1e6:.1f} MB less the untied token embedding "
              f"{m.untied_embd_bytes / 1e6:.1f} MB)" if m.untied_embd_bytes else "")
    print(f"model {m.name} ({m.path.name}, {m.file_bytes / 1e6:.1f} MB): weights streamed per token "
          f"{m.weights_bytes / 1e6:.1f} MB{untied}; KV at depth {a.depth} ({a.kv}) {kv / 1e6:.1f} MB")
    print(f"{a.threads} thread(s): weights stream in {tw * 1e3:.2f} ms ({m.weights_bytes / tw / 1e9:.1f} GB/s), "
          f"KV in {tk * 1e3:.2f} ms ({kv / tk / 1e9:.1f} GB/s)")
    print(f"floor: at most {tw / (tw + tk) * 100:.0f}% of shallow decode speed kept at depth {a.depth}; "
          f"bandwidth-bound decode ceiling {1 / tw:.1f} tok/s shallow, {1 / (tw + tk):.1f} tok/s at depth")
    print(f"load average (1 min) {load0:.2f} before, {os.getloadavg()[0]:.2f} after, on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
