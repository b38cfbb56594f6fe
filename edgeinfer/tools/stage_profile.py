"""`edgeinfer bench --profile`: where a decoded token's time goes, stage by stage, in GB/s.

The runtime times every stage of its forward pass (``Engine.stage_profile``); the profile
covers the ``n`` one-token forwards of a decode after a prompt, as bench's tg runs it. Each
stage's bytes per token come from the file's tensor table (``decode_bytes.py``: the matrices
it reads, the KV read at the run's mean depth for attention, the K/V row written for
rope_kv), so bytes / time is the bandwidth that stage drew, comparable with the memory floor
(``scripts/memory_floor.py``). "outside the forward" is the wall time per token the stages
do not cover: Python, the argmax, the lease.

A prefill is profiled too (``profile_prefill``): bench's pp prompt from an empty context,
each stage's share of the time and the multiply-adds it did per second (``prefill_macs``), the
rate to hold against the kernels' ceilings, since a prefill is bound by arithmetic, not reads.
"""
from __future__ import annotations

from typing import Optional

from .decode_bytes import DecodeBytes

__all__ = ["profile_decode", "profile_entry", "profile_prefill", "prefill_entry", "prefill_macs", "stage_rows"]


def _least_disturbed(runs: list[dict], stages: str) -> dict:
    """The run whose stages took the least time in all: the one other tenants slowed least."""
    return min(runs, key=lambda run: sum(run[stages].values()), default={})


def profile_decode(runner, prompt: list[int], n: int, reps: int) -> dict:
    """Decodes `n` tokens after `prompt`, `reps` times, on an in-process EdgeinferRunner; the
    repetition with the least forward time: {prompt_len, n_tokens, wall_s_per_token,
    stage_s_per_token {stage: seconds per token}}."""
    eng = runner.eng

    def one() -> dict:
        wall = runner.tg(prompt, n, on_start=lambda: eng.stage_profile(reset=True))
        stages = eng.stage_profile(reset=True)
        return {"prompt_len": len(prompt), "n_tokens": n, "wall_s_per_token": wall / n,
                "stage_s_per_token": {k: v / n for k, v in stages.items()}}

    return _least_disturbed([one() for _ in range(reps)], "stage_s_per_token")


def profile_prefill(runner, prompt: list[int], reps: int) -> dict:
    """Prefills `prompt` from an empty context (bench's pp: logits for the last token only),
    `reps` times, on an in-process EdgeinferRunner; the repetition with the least forward time:
    {n_tokens, wall_s, stage_s {stage: seconds}}."""
    eng = runner.eng

    def one() -> dict:
        eng.stage_profile(reset=True)
        wall = runner.pp(prompt)
        return {"n_tokens": len(prompt), "wall_s": wall, "stage_s": eng.stage_profile(reset=True)}

    return _least_disturbed([one() for _ in range(reps)], "stage_s")


def prefill_macs(db: DecodeBytes, n_tokens: int) -> dict[str, int]:
    """Multiply-adds of an n-token prefill from an empty context, by stage: every matrix once per
    token (the output head for the last token only, as bench's pp asks for its logits), and each
    token's query heads over the cells up to its own (layers with a sliding window do fewer: an
    upper bound there)."""
    out = {k: e * (1 if k == "head" else n_tokens) for k, e in db.matrix_elems.items()}
    out["attention"] = db.kv_layers * db.attn_row_elems * n_tokens * (n_tokens + 1) // 2
    return out


def prefill_entry(prof: dict, db: DecodeBytes) -> dict:
    """The JSON record of one profiled prefill: {n_tokens, wall_ms, tokens_per_s, stages: [{stage,
    ms, share (of the wall time), gmac_per_s (null for a stage without matrices)}]}, the timed
    stages in their order, then "outside the forward"."""
    macs, wall = prefill_macs(db, prof["n_tokens"]), prof["wall_s"]
    rows = [{"stage": k, "ms": s * 1e3, "share": s / wall, "gmac_per_s": macs[k] / s / 1e9 if macs.get(k) else None}
            for k, s in prof["stage_s"].items() if s]
    rest = max(wall - sum(prof["stage_s"].values()), 0.0)
    rows.append({"stage": "outside the forward", "ms": rest * 1e3, "share": rest / wall, "gmac_per_s": None})
    return {"n_tokens": prof["n_tokens"], "wall_ms": wall * 1e3, "tokens_per_s": prof["n_tokens"] / wall,
            "stages": rows}


def stage_rows(stage_s: dict[str, float], stage_bytes: dict[str, int], wall_s: Optional[float] = None,
               floor_gb_s: Optional[float] = None) -> list[dict]:
    """One row per stage: {stage, ms_per_token, bytes_per_token, gb_per_s, share_of_floor},
    the timed stages in their order, then bytes no stage timed ("other"), "outside the forward"
    (wall - the stages) and "total" (bytes over the wall time when given, else over the stages)."""
    def row(stage: str, s: Optional[float], b: int) -> dict:
        gbs = b / s / 1e9 if s and b else None
        return {"stage": stage, "ms_per_token": None if s is None else s * 1e3, "bytes_per_token": b,
                "gb_per_s": gbs, "share_of_floor": gbs / floor_gb_s if gbs is not None and floor_gb_s else None}

    # a stage this model has not (a dense model's "recurrent") is left out
    rows = [row(k, s, stage_bytes.get(k, 0)) for k, s in stage_s.items() if s or stage_bytes.get(k)]
    rest = sum(b for k, b in stage_bytes.items() if k not in stage_s)
    if rest:
        rows.append(row("other", None, rest))
    timed = sum(stage_s.values())
    if wall_s is not None:
        rows.append(row("outside the forward", max(wall_s - timed, 0.0), 0))
    rows.append(row("total", wall_s if wall_s is not None else timed, sum(stage_bytes.values())))
    return rows


def profile_entry(prof: dict, db: DecodeBytes, kv: str, threads: int, floor_gb_s: Optional[float]) -> dict:
    """The JSON record of one profiled decode: the bytes at the run's mean depth (the tokens
    at positions p..p+n-1 after a p-token prompt attend to p+1..p+n cells)."""
    depth = prof["prompt_len"] + (prof["n_tokens"] + 1) / 2
    rows = stage_rows(prof["stage_s_per_token"], db.by_stage(depth, kv), prof["wall_s_per_token"], floor_gb_s)
    return {"threads": threads, "prompt_len": prof["prompt_len"], "n_tokens": prof["n_tokens"], "mean_depth": depth,
            "wall_ms_per_token": prof["wall_s_per_token"] * 1e3, "floor_gb_s": floor_gb_s, "stages": rows}
