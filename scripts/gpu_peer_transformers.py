"""The GPU peer for scripts/gpu_bench.py: Hugging Face transformers running the same GGUF file
(dequantized by transformers' GGUF loader) in bf16 on the GPU, with the same shapes:
pp512 (one forward over 512 tokens), single-stream decode and batch-8 aggregate decode.
transformers is what a user without a dedicated runtime would run; llama.cpp's CUDA build is
not measured (its nvcc build takes longer than a device session allows).

    python scripts/gpu_peer_transformers.py [FILE.gguf]     # default: the default model's file
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM

from edgeinfer.hub import DEFAULT_MODEL, ensure_model


def main() -> int:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else ensure_model(DEFAULT_MODEL, progress=False))
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.bfloat16).to(dev).eval()
    V = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}, bf16")

    def sync() -> None:
        if dev == "cuda":
            torch.cuda.synchronize()

    @torch.inference_mode()
    def prefill(n: int) -> float:
        ids = torch.randint(0, V, (1, n), generator=gen).to(dev)
        sync()
        t = time.perf_counter()
        model(ids, use_cache=False)
        sync()
        return time.perf_counter() - t

    @torch.inference_mode()
    def decode(batch: int, steps: int) -> float:
        ids = torch.randint(0, V, (batch, 16), generator=gen).to(dev)
        out = model(ids, use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        sync()
        t = time.perf_counter()
        for _ in range(steps):
            out = model(nxt, past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        sync()
        return time.perf_counter() - t

    prefill(512)
    pp = sorted(512 / prefill(512) for _ in range(5))
    print(f"pp512: {pp[2]:,.0f} tokens/s (median of 5)")
    decode(1, 8)
    tg = sorted(256 / decode(1, 256) for _ in range(3))
    print(f"tg256 single stream: {tg[1]:,.0f} tokens/s (median of 3)")
    b8 = sorted(8 * 128 / decode(8, 128) for _ in range(3))
    print(f"batch-8 decode: {b8[1]:,.0f} tokens/s aggregate (median of 3, 128 steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
