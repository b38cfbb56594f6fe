"""Speculative decoding: proposers of draft tokens and the policy that decides when to use them.

A step that speculates feeds a slot's next token followed by k proposed tokens, all in one
forward, and asks for the logits of all k + 1 rows (scheduler.py plans it, output.py verifies it). The sequence then samples
row by row exactly as plain decoding would (same sampler, same processed distribution, same
random draws) and keeps going while its sample equals the proposal; the first mismatch is the
next token and the cells after it are rolled back. Both proposers here are deterministic (a
point-mass draft distribution q), for which the standard rejection rule -- accept d with
probability min(1, p(d) / q(d)) = p(d), else resample from norm(max(0, p - q)) = p without d --
gives the same distribution as "sample from p, accept if it equals d". So greedy output equals
plain decoding token for token, and sampled output has the target model's distribution.

Proposers:
  PromptLookup  n-gram match of the last tokens against the prompt and the text so far.
  DraftModel    (draft.py) a second, smaller model sharing the vocabulary, with its own KV ring; greedy.
  MtpDraft      (mtp.py) Qwen3.5's multi-token-prediction block, fed the model's own hidden states,
                with its own KV ring; greedy. Scheduled as a draft model is.

SpecPolicy chooses k per slot from the measured acceptance rate and the measured costs of
verify steps (by batch size) and draft steps, and chooses 0 (plain decoding) whenever
speculating would be slower.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


MODES = ("lookup", "draft", "mtp")
#: the modes whose proposer is a model of its own (DraftModel's interface; scheduler.draft)
MODEL_MODES = ("draft", "mtp")


def check_mode(mode: str | None) -> str | None:
    if mode is not None and mode not in MODES:
        raise ValueError(f"speculative must be None, 'lookup', 'draft' or 'mtp', got {mode!r}")
    return mode


def check_proposer(mode: str | None, proposer) -> None:
    """A model-drafted mode needs its proposer loaded: 'draft' a draft model, 'mtp' the MTP block."""
    if mode in MODEL_MODES and getattr(proposer, "mode", None) != mode:
        if mode == "draft":
            raise ValueError("speculative='draft' needs a draft model (load(..., draft=PATH))")
        raise ValueError("speculative='mtp' needs the model's MTP block loaded (load(..., speculative='mtp'))")


class PromptLookup:
    """Proposes the tokens that followed the latest earlier occurrence of the sequence's last
    n tokens (n from `max_ngram` down to `min_ngram`)."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def propose(self, history: list[int], k: int) -> list[int]:
        if k <= 0 or len(history) < 2:
            return []
        h = np.asarray(history, dtype=np.int64)
        n_hist = len(h)
        for n in range(min(self.max_ngram, n_hist - 1), self.min_ngram - 1, -1):
            suffix = h[n_hist - n:]
            # candidate starts i with h[i:i+n] == suffix and i + n < n_hist (something follows)
            m = n_hist - n
            hits = h[:m] == suffix[0]
            for j in range(1, n):
                hits &= h[j:m + j] == suffix[j]
            idx = np.flatnonzero(hits)
            if len(idx):
                start = int(idx[-1]) + n          # the most recent occurrence
                return [int(t) for t in h[start:start + k]]
        return []


@dataclass
class SlotSpec:
    """One request's speculation state: its acceptance record and counters."""
    mode: str
    accepted_w: float = 0.0         # decayed count of accepted draft tokens
    rejected_w: float = 0.0         # decayed count of verify steps that rejected a draft token
    proposed: int = 0
    accepted: int = 0
    k: int = 0                      # the k chosen at the latest step (0: not speculating)
    off_steps: int = 0              # plain steps left before probing again
    steps: int = 0                  # verify steps that carried drafts

    def acceptance(self) -> float:
        """Per-token acceptance probability (a geometric model), with a weak prior of 1/2."""
        return (self.accepted_w + 1.0) / (self.accepted_w + self.rejected_w + 2.0)

    def record(self, k: int, n_acc: int) -> None:
        self.accepted_w = 0.9 * self.accepted_w + n_acc
        self.rejected_w = 0.9 * self.rejected_w + (1.0 if n_acc < k else 0.0)
        self.proposed += k
        self.steps += 1
        self.accepted += n_acc


class StepCosts:
    """Decayed averages of measured seconds: forward steps by batch size (tokens), and one
    draft-model token."""

    def __init__(self, draft_ratio: float = 1.0) -> None:
        self.step: dict[int, float] = {}
        self.draft_token: float | None = None
        self.draft_ratio = draft_ratio  # prior: a draft token costs this share of a one-token step

    @staticmethod
    def _ema(old: float | None, new: float, a: float = 0.2) -> float:
        return new if old is None else (1 - a) * old + a * new

    def observe_step(self, n_tokens: int, seconds: float) -> None:
        self.step[n_tokens] = self._ema(self.step.get(n_tokens), seconds)

    def observe_draft(self, n_tokens: int, seconds: float) -> None:
        if n_tokens > 0:
            self.draft_token = self._ema(self.draft_token, seconds / n_tokens)

    def draft_estimate(self) -> float:
        """Seconds of one draft-model token: measured, else the prior from the file sizes."""
        if self.draft_token is not None:
            return self.draft_token
        return self.draft_ratio * (self.estimate(1) or 0.0)

    def estimate(self, n_tokens: int) -> float | None:
        """Seconds of a step of n tokens: measured, else interpolated (linearly) between the
        nearest measured sizes, else extrapolated from the nearest one, a step of n tokens
        costing at least as much as a smaller one."""
        if n_tokens in self.step:
            return self.step[n_tokens]
        if not self.step:
            return None
        sizes = sorted(self.step)
        lo = [s for s in sizes if s < n_tokens]
        hi = [s for s in sizes if s > n_tokens]
        if lo and hi:
            a, b = lo[-1], hi[0]
            ta, tb = self.step[a], self.step[b]
            return ta + (tb - ta) * (n_tokens - a) / (b - a)
        if lo:  # beyond the largest measured size: the slope of the two largest, at least 10 % a token
            a = lo[-1]
            ta = self.step[a]
            slope = 0.1 * self.step[sizes[0]] / sizes[0]
            if len(lo) >= 2:
                slope = max(slope, (ta - self.step[lo[-2]]) / (a - lo[-2]))
            return ta + slope * (n_tokens - a)
        b = hi[0]
        return self.step[b] * n_tokens / b


class SpecPolicy:
    """Chooses k per slot and step: the k (0..max_k) that maximises the expected tokens per
    second of the whole step, given the slot's acceptance rate a (expected tokens of k drafts:
    (1 - a^(k+1)) / (1 - a)), the measured step cost of the batch grown by k tokens and the
    draft cost. 0 means plain decoding; a slot that chose 0 probes again after `probe_every`
    plain steps (acceptance changes along a text)."""

    def __init__(self, max_k: int = 8, max_slots: int = 2, probe_every: int = 16, min_gain: float = 1.02,
                 draft_ratio: float = 1.0):
        self.max_k = max_k
        self.max_slots = max_slots
        self.probe_every = probe_every
        self.min_gain = min_gain
        self.fixed_k: int | None = None     # tests and benchmarks: always this k (no adaptation)
        self.costs = StepCosts(draft_ratio)
        self.seen = {m: SlotSpec(m) for m in MODES}   # every request's record

    def new_slot(self, mode: str) -> SlotSpec:
        """A request's record, starting from what earlier requests of the mode saw (weight 2);
        the first request of a mode starts optimistic (acceptance 0.8), so that it is tried."""
        seen = self.seen[mode]
        total = seen.accepted_w + seen.rejected_w
        if total == 0:
            return SlotSpec(mode, accepted_w=7.0, rejected_w=1.0)
        w = 2.0 / total if total > 2.0 else 1.0
        return SlotSpec(mode, accepted_w=seen.accepted_w * w, rejected_w=seen.rejected_w * w)

    def record(self, spec: SlotSpec, k: int, n_acc: int) -> None:
        spec.record(k, n_acc)
        self.seen[spec.mode].record(k, n_acc)

    def draft_pays(self, spec: SlotSpec) -> bool:
        """Whether a one-stream step of this request would draft (before paying the draft
        model's prefill of the prompt)."""
        if self.fixed_k is not None or self.costs.estimate(1) is None:
            return True
        return self._best_k(spec, 1, 0, self.max_k, True) > 0

    def choose_k(self, spec: SlotSpec, n_batch: int, n_others: int, k_limit: int, drafted: bool,
                 lag: int = 0) -> int:
        """n_batch: tokens the step holds without this slot's drafts (its own token included);
        n_others: other sequences that get a token from the step; lag: tokens the draft model
        must catch up on first."""
        k_limit = min(k_limit, self.max_k)
        if k_limit <= 0:
            return 0
        if self.fixed_k is not None:
            return min(self.fixed_k, k_limit)
        if spec.off_steps > 0:
            spec.off_steps -= 1
            if spec.off_steps == 0 and lag <= 2:
                return min(2, k_limit)  # a probe: fresh acceptance and cost figures
            return 0
        if self.costs.estimate(n_batch) is None:
            return min(4, k_limit)      # nothing measured yet: a moderate first try
        best_k = self._best_k(spec, n_batch, n_others, k_limit, drafted, lag)
        if best_k == 0:
            spec.off_steps = self.probe_every
        return best_k

    def _best_k(self, spec: SlotSpec, n_batch: int, n_others: int, k_limit: int, drafted: bool,
                lag: int = 0) -> int:
        base = self.costs.estimate(n_batch)
        a = min(spec.acceptance(), 0.999)
        d = self.costs.draft_estimate() if drafted else 0.0
        extra = d * max(0, lag - 1)     # catching up beyond the usual one token
        plain_rate = (n_others + 1) / base
        best_k, best_rate = 0, plain_rate * self.min_gain
        for k in range(1, k_limit + 1):
            t = self.costs.estimate(n_batch + k)
            if t is None:
                continue
            expected = (1 - a ** (k + 1)) / (1 - a)
            rate = (n_others + expected) / (t + d * k + extra)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k


class Timer:
    """Seconds since construction (perf_counter), for the cost measurements."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.t0
