#!/usr/bin/env python3
"""Mixed-adapter batch cost: TPOT of N concurrent requests over K LoRA adapters against N base requests.

    python scripts/lora_bench.py MODEL.gguf [--rank 16] [--adapters 2] [--requests 4] [--rounds 5]

Random adapters of the given rank on every matmul weight of the blocks (q, k, v, o, gate, up, down: PEFT's
"all-linear" without the head) are written as LoRA GGUFs and loaded by name; values do not change speed.
Rounds alternate base and mixed (each request its adapter, round robin), so both see the same machine;
the figure is the ratio of the medians of the rounds' mean TPOT. Also: one adapter for all (the ratio
of that shows the update's own cost apart from mixing)."""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

import edgeinfer
from edgeinfer.convert.lora import write_adapter_gguf
from edgeinfer.gguf.reader import GGUFFile
from edgeinfer.model.config import ModelConfig

ROLES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
PROMPT = "Write a long story about a lighthouse keeper who finds a map in an old bottle. " * 4


def random_adapter(cfg: ModelConfig, rank: int, seed: int, out: Path) -> Path:
    rng = np.random.default_rng(seed)
    pairs = {}
    for w in cfg.weights():
        if w.layer >= 0 and w.layer < cfg.n_layer and w.tensor.role in ROLES and len(w.shape) == 2:
            n_in, n_out = w.shape
            a = rng.standard_normal((rank, n_in), dtype=np.float32) / np.float32(np.sqrt(n_in))
            b = rng.standard_normal((n_out, rank), dtype=np.float32) * np.float32(0.01)
            pairs[w.name] = (a, b)
    write_adapter_gguf(pairs, cfg.arch, str(out))
    return out


def round_tpot(eng, loras: list, max_tokens: int) -> float:
    """Mean TPOT (s) of len(loras) requests started together."""
    gens = [eng.stream(PROMPT, max_tokens=max_tokens, temperature=0, ignore_eos=True, lora=lo) for lo in loras]
    results = [None] * len(gens)

    def run(i):
        results[i] = gens[i].result()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(gens))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statistics.mean(r.stats.tpot_s for r in results)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--adapters", type=int, default=2)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    with GGUFFile(args.model) as f:
        cfg = ModelConfig.from_gguf(f)
    with tempfile.TemporaryDirectory() as tmp:
        names = [f"a{i}" for i in range(args.adapters)]
        files = {n: str(random_adapter(cfg, args.rank, i, Path(tmp) / f"{n}.gguf")) for i, n in enumerate(names)}
        with edgeinfer.load(args.model, n_ctx=512, n_slots=args.requests, n_threads=args.threads,
                            loras=files) as eng:
            info = eng.lora_adapters()
            print(f"{Path(args.model).name}: {args.requests} requests, {args.adapters} adapters of rank "
                  f"{args.rank} ({info[0]['tensors']} tensors, {info[0]['bytes'] / 2**20:.1f} MiB each), "
                  f"{eng.caps.n_threads} threads, {eng.caps.isa}", flush=True)
            kinds = {"base": [None] * args.requests,
                     "mixed": [names[i % len(names)] for i in range(args.requests)],
                     "one adapter": [names[0]] * args.requests}
            round_tpot(eng, kinds["base"], 8)            # warm up
            tpot: dict[str, list[float]] = {k: [] for k in kinds}
            for r in range(args.rounds):
                for k, loras in kinds.items():
                    tpot[k].append(round_tpot(eng, loras, args.max_tokens))
                print(f"round {r}: " + ", ".join(f"{k} {v[-1] * 1e3:.1f} ms" for k, v in tpot.items()), flush=True)
    med = {k: statistics.median(v) for k, v in tpot.items()}
    print(f"TPOT medians: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in med.items()))
    print(f"mixed / base = {med['mixed'] / med['base']:.3f}x; one adapter / base = "
          f"{med['one adapter'] / med['base']:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
