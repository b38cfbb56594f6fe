"""An n = 2 pair whose second request copies the first's prompt (Runtime.copy_prefix): the second
is submitted from inside the first's forwards, once `after` of them have run, so the first is
running with its prompt (or the first `after` chunks of it) in its slot when the second is admitted.
Used by the CUDA tests (tests/test_cuda.py, tests/test_cuda_hybrid.py)."""
from __future__ import annotations

from edgeinfer.engine.generation import Generation
from edgeinfer.engine.sampling import SamplingParams


def run_siblings(eng, prompt: list[int], max_tokens: int, after: int = 1):
    """(first, second, copies): both greedy results and every (src, dst, n) the runner copied."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    sibling: list[Generation] = []
    copies: list[tuple[int, int, int]] = []
    runner = eng.runner
    execute, copy_prefix = runner.execute, runner.copy_prefix
    forwards = 0

    def execute_then_sibling(plan):
        nonlocal forwards
        out = execute(plan)
        forwards += 1
        if forwards == after:
            sibling.append(Generation(eng.scheduler, prompt, params, n_logprobs=0))
        return out

    def recorded_copy(src: int, dst: int, n: int) -> None:
        copies.append((src, dst, n))
        copy_prefix(src, dst, n)

    runner.execute, runner.copy_prefix = execute_then_sibling, recorded_copy
    try:
        first = Generation(eng.scheduler, prompt, params, n_logprobs=0).result()
        second = sibling[0].result()
    finally:
        runner.execute, runner.copy_prefix = execute, copy_prefix
    return first, second, copies
