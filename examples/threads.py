"""One model shared by several threads: each request holds one of the engine's
KV slots; the engine batches or serialises their steps, never mixes them."""
from concurrent.futures import ThreadPoolExecutor

import edgeinfer

eng = edgeinfer.load("default", n_ctx=512, n_slots=4)
prompts = ["Water boils at", "The largest planet is", "def add(a, b):", "Paris is the capital of"]
with ThreadPoolExecutor(max_workers=4) as pool:
    for prompt, out in zip(prompts, pool.map(lambda p: eng.generate(p, max_tokens=16, temperature=0), prompts)):
        print(f"{prompt!r} -> {out.text!r} ({out.finish_reason})")
