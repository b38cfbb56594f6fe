"""Peak resident memory of a real load, measured in a process of its own.

`python -m tests.support.peak_rss MODEL --ctx C --slots S --max-batch B --kv KV --threads T`
loads MODEL the way `edgeinfer run` does (edgeinfer.load, nothing else imported), fills every
slot with a prompt of nearly `ctx` tokens (together they walk the vocabulary), prefilled together, decodes a few tokens on each,
and prints one JSON line: the kernel's peak RSS of this process (VmHWM), the
engine's own figures (info()) and the tokens run. tests/test_doctor_plan.py compares plan's
prediction with it; a fresh process, so that nothing another test loaded counts.
"""
from __future__ import annotations

import argparse
import json
import resource
import threading

DECODE_TOKENS = 8


def peak_rss() -> int:
    """This process's peak RSS in bytes: VmHWM, the high-water mark of its own address space.
    Not getrusage's ru_maxrss, which keeps the larger mark of the image exec replaced: the
    parent's, copied (or shared) by fork, when pytest is the parent."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # KiB on Linux


def run(model: str, ctx: int, slots: int, max_batch: int, kv: str, threads: int) -> dict:
    import edgeinfer
    from edgeinfer.engine import DoneEvent, ErrorEvent, SamplingParams

    eng = edgeinfer.load(model, n_ctx=ctx, n_slots=slots, max_batch=max_batch, n_threads=threads, kv_type=kv)
    try:
        n_vocab, n_prompt = eng.config.n_vocab, ctx - DECODE_TOKENS
        params = SamplingParams.from_dict({"temperature": 0, "ignore_eos": True}, max_tokens=DECODE_TOKENS)
        done = [threading.Event() for _ in range(slots)]
        results: list = [None] * slots

        def sink_of(i: int):
            def sink(events: list) -> None:
                for ev in events:
                    if isinstance(ev, (DoneEvent, ErrorEvent)):
                        results[i] = ev
                        done[i].set()
            return sink

        # the prompts walk the whole vocabulary, as hours of varied traffic do: every row of the
        # token embeddings is read (from the file mapping); each slot starts elsewhere, so none
        # reuses another's prefix
        stride = max(1, n_vocab // (n_prompt * slots))
        for i in range(slots):
            eng.submit([(stride * (i + slots * j)) % n_vocab for j in range(n_prompt)], params, sink_of(i))
        for ev in done:
            if not ev.wait(timeout=1800):    # a bound, so a hung engine cannot hang the test
                raise TimeoutError("the load did not finish")
        errors = [str(r.error) for r in results if isinstance(r, ErrorEvent)]
        if errors:
            raise RuntimeError(errors[0])
        info = eng.info()
        return {"peak_rss": peak_rss(),
                "prompt_tokens": n_prompt, "completion_tokens": [r.stats.completion_tokens for r in results],
                "n_threads": info["n_threads"], "kv_bytes": info["kv_bytes"],
                "scratch_bytes": info["scratch_bytes"], "packed_weight_bytes": info["packed_weight_bytes"]}
    finally:
        eng.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--ctx", type=int, required=True)
    ap.add_argument("--slots", type=int, required=True)
    ap.add_argument("--max-batch", type=int, default=256)
    ap.add_argument("--kv", default="f16")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    print(json.dumps(run(a.model, a.ctx, a.slots, a.max_batch, a.kv, a.threads)))


if __name__ == "__main__":
    main()
