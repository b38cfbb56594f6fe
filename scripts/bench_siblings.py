"""n > 1 with and without copying the prompt's KV cells into the siblings' slots: wall time
of one /v1/completions request with n choices over a long prompt (greedy, few tokens), the
two variants interleaved. Usage: python scripts/bench_siblings.py [n] [prompt_tokens] [reps]"""
import sys
import time

import openai

import edgeinfer
from edgeinfer.hub import DEFAULT_MODEL
from edgeinfer.server import ServerThread


def main(n: int = 4, n_prompt: int = 480, reps: int = 5) -> None:
    eng = edgeinfer.load(DEFAULT_MODEL, n_ctx=n_prompt + 64, n_threads=2, n_slots=n)
    words = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex "
             "every jolly bugle ").split()
    runner = eng.runner
    copy = runner.copy_prefix
    times = {"copy": [], "recompute": []}
    with ServerThread(models={"m": eng}) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=600)
        for rep in range(reps):
            for mode in ("copy", "recompute"):
                runner.copy_prefix = copy if mode == "copy" else (lambda *a: False)
                # a fresh prompt each time, so no slot holds it from an earlier request
                prompt = f"{rep}{mode} " + " ".join(words[i % len(words)] for i in range(n_prompt))
                prompt = eng.detokenize(eng.tokenize(prompt, add_special=False)[:n_prompt])
                t = time.perf_counter()
                c.completions.create(model="m", prompt=prompt, n=n, max_tokens=4, temperature=0)
                times[mode].append(time.perf_counter() - t)
    for mode, ts in times.items():
        ts.sort()
        print(f"{mode:10s} n={n} prompt={n_prompt} tokens: median {ts[len(ts) // 2] * 1000:.0f} ms "
              f"(min {ts[0] * 1000:.0f}, max {ts[-1] * 1000:.0f}, {reps} runs)")
    eng.close()


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
