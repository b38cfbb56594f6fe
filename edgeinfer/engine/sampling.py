"""Token sampling: penalties, top-k, top-p, min-p, temperature, seeded draws; stop strings.

The chain follows llama.cpp's default order::

    penalties -> top-k -> top-p -> min-p -> temperature -> draw

so top-p and min-p look at the distribution at temperature 1 and the temperature only
reshapes what survives. ``temperature <= 0`` is greedy: argmax after penalties, ties going
to the lowest token id.

Everything is vectorised with numpy; with ``top_k`` set only the k best logits are ever
sorted (``np.argpartition``), so a step costs O(n_vocab) plus O(k log k). Without penalties,
greedy and top-k sampling only ever look at the k best logits: ``Sampler.top_k_needed`` says
how many, and ``Sampler.sample_candidates`` draws from them (computed elsewhere, e.g. on a
GPU) exactly as ``Sampler.__call__`` would from the whole vector.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..errors import SamplingParamsError

__all__ = [
    "Sampler",
    "SamplingParams",
    "StopMatcher",
    "make_sampler",
]


# --------------------------------------------------------------------------- validation

def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _check_real(name: str, x: Any, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False) -> float:
    if not _is_real(x) or not math.isfinite(float(x)):
        raise SamplingParamsError(f"{name} must be a finite number, got {x!r}")
    v = float(x)
    if lo is not None and (v < lo or (lo_open and v == lo)):
        bound = f"> {lo:g}" if lo_open else f">= {lo:g}"
        raise SamplingParamsError(f"{name} must be {bound}, got {x!r}")
    if hi is not None and v > hi:
        raise SamplingParamsError(f"{name} must be <= {hi:g}, got {x!r}")
    return v


def _check_f32(name: str, v: float) -> float:
    """A value the penalties apply in float32 must keep its meaning there: finite, and not
    a nonzero that rounds to 0 (a repeat_penalty of 1e-300 would divide by zero)."""
    with np.errstate(over="ignore", under="ignore"):   # judged below: no warning to the caller
        f = np.float32(v)
    if not np.isfinite(f) or (v != 0.0 and f == 0.0):
        raise SamplingParamsError(f"{name}={v!r} is outside float32's range")
    return v


def _check_int(name: str, x: Any, lo: int | None = None) -> int:
    if not _is_int(x):
        raise SamplingParamsError(f"{name} must be an integer, got {x!r}")
    v = int(x)
    if lo is not None and v < lo:
        raise SamplingParamsError(f"{name} must be >= {lo}, got {x!r}")
    return v


def _check_seed(seed: Any) -> int | None:
    if seed is None:
        return None
    return _check_int("seed", seed, lo=0)


def _check_chain(temperature, top_k, top_p, min_p, repeat_penalty, presence_penalty,
                 frequency_penalty, penalty_last_n, seed) -> dict:
    """Validates the sampler's parameters; returns them normalised to plain Python types.

    ``temperature`` may be any finite number here (<= 0 means greedy, as in llama.cpp);
    ``SamplingParams`` is stricter and rejects negative temperatures.
    """
    return dict(
        temperature=_check_real("temperature", temperature),
        top_k=_check_int("top_k", top_k, lo=0),
        top_p=_check_real("top_p", top_p, lo=0.0, hi=1.0, lo_open=True),
        min_p=_check_real("min_p", min_p, lo=0.0, hi=1.0),
        repeat_penalty=_check_f32("repeat_penalty",
                                  _check_real("repeat_penalty", repeat_penalty, lo=0.0, lo_open=True)),
        presence_penalty=_check_f32("presence_penalty", _check_real("presence_penalty", presence_penalty)),
        frequency_penalty=_check_f32("frequency_penalty", _check_real("frequency_penalty", frequency_penalty)),
        penalty_last_n=_check_int("penalty_last_n", penalty_last_n, lo=-1),
        seed=_check_seed(seed),
    )


# --------------------------------------------------------------------------- sampler

class Sampler:
    """A sampling chain with its own random generator: ``sampler(logits, history) -> id``.

    ``logits``: float array ``[n_vocab]`` (not modified). ``history``: the ids seen so far
    (prompt + generated), used only by the penalties. Not thread-safe (the generator has
    state); make one per sequence.
    """

    __slots__ = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty",
                 "presence_penalty", "frequency_penalty", "penalty_last_n", "seed", "_rng")

    def __init__(self, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0,
                 presence_penalty=0.0, frequency_penalty=0.0, penalty_last_n=64, seed=None):
        p = _check_chain(temperature, top_k, top_p, min_p, repeat_penalty, presence_penalty,
                         frequency_penalty, penalty_last_n, seed)
        self.temperature: float = p["temperature"]
        self.top_k: int = p["top_k"]
        self.top_p: float = p["top_p"]
        self.min_p: float = p["min_p"]
        self.repeat_penalty: float = p["repeat_penalty"]
        self.presence_penalty: float = p["presence_penalty"]
        self.frequency_penalty: float = p["frequency_penalty"]
        self.penalty_last_n: int = p["penalty_last_n"]
        self.seed: int | None = p["seed"]
        self._rng = np.random.default_rng(self.seed)

    def __repr__(self) -> str:
        return (f"Sampler(temperature={self.temperature}, top_k={self.top_k}, top_p={self.top_p}, "
                f"min_p={self.min_p}, repeat_penalty={self.repeat_penalty}, "
                f"presence_penalty={self.presence_penalty}, "
                f"frequency_penalty={self.frequency_penalty}, "
                f"penalty_last_n={self.penalty_last_n}, seed={self.seed})")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def reseed(self, seed: int | None) -> None:
        """Restarts the random stream (same seed -> same draws from here on)."""
        self.seed = _check_seed(seed)
        self._rng = np.random.default_rng(self.seed)

    # -- stages ----------------------------------------------------------------------

    @property
    def penalized(self) -> bool:
        """Whether a repeat / presence / frequency penalty can change the logits."""
        return self.penalty_last_n != 0 and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0)

    def top_k_needed(self, n_vocab: int) -> int | None:
        """k such that ``sample_candidates`` on the k best logits (of n_vocab) draws exactly what
        ``__call__`` draws on all of them: 1 when greedy, top_k with top-k on; None when the
        whole vector is needed (penalties change logits anywhere; no top-k keeps every id)."""
        if self.penalized:
            return None
        if self.greedy:
            return 1
        return self.top_k if 0 < self.top_k < n_vocab else None

    def apply_penalties(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        """Returns logits with the repeat / presence / frequency penalties applied.

        Returns the input array itself when no penalty is active (callers never modify it).
        """
        rp, pres, freq = self.repeat_penalty, self.presence_penalty, self.frequency_penalty
        if not self.penalized:
            return logits
        if history is None or len(history) == 0:
            return logits
        n = self.penalty_last_n
        hist = np.asarray(history if n < 0 else history[-n:], dtype=np.int64).ravel()
        hist = hist[(hist >= 0) & (hist < logits.shape[0])]
        if hist.size == 0:
            return logits
        ids, counts = np.unique(hist, return_counts=True)
        out = np.array(logits, dtype=np.float32, copy=True)
        v = out[ids]
        if rp != 1.0:
            v = np.where(v > 0, v / np.float32(rp), v * np.float32(rp))
        if pres != 0.0 or freq != 0.0:
            v = v - (np.float32(freq) * counts.astype(np.float32) + np.float32(pres))
        out[ids] = v.astype(np.float32)
        return out

    def candidates(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """top-k -> top-p -> min-p. Returns (ids, logits) of the surviving tokens (at T=1).

        When top-k or top-p is active the survivors come sorted by descending logit (ties:
        lower id first); otherwise they are in id order.
        """
        n = logits.shape[0]
        if 0 < self.top_k < n:
            ids = _top_k_ids(logits, self.top_k)
            return self._filter(ids, logits[ids], sorted_=True)
        if self.top_p < 1.0:
            ids = np.argsort(-logits, kind="stable")
            return self._filter(ids, logits[ids], sorted_=True)
        return self._filter(np.arange(n), logits, sorted_=False)

    def _filter(self, ids: np.ndarray, vals: np.ndarray, sorted_: bool) -> tuple[np.ndarray, np.ndarray]:
        """top-p -> min-p on the survivors of top-k (sorted_: in descending order)."""
        if self.top_p < 1.0 and vals.shape[0] > 1 and math.isfinite(float(vals[0])):
            # sorted descending: keep the smallest prefix whose mass reaches top_p
            p = np.exp(vals.astype(np.float64) - float(vals[0]))
            cum = np.cumsum(p)
            keep = int(np.searchsorted(cum, self.top_p * cum[-1], side="left")) + 1
            keep = max(1, min(keep, vals.shape[0]))
            ids, vals = ids[:keep], vals[:keep]

        if self.min_p > 0.0 and vals.shape[0] > 1:
            # p_i >= min_p * p_max  <=>  logit_i >= max_logit + log(min_p)
            top = float(vals[0]) if sorted_ else float(np.max(vals))
            if not math.isfinite(top):
                return ids, vals
            mask = vals >= top + math.log(self.min_p)
            if not mask.all():
                ids, vals = ids[mask], vals[mask]
        return ids, vals

    def probs(self, logits: np.ndarray, history: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """The final distribution: (ids, probabilities float64) that the draw uses."""
        x = self._prepare(logits, history)
        if self.greedy:
            return np.array([_argmax(x)]), np.array([1.0])
        ids, vals = self.candidates(x)
        v = vals.astype(np.float64) / self.temperature
        p = np.exp(v - v.max())
        return ids, p / p.sum()

    # -- the draw --------------------------------------------------------------------

    def _prepare(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        x = np.asarray(logits)
        if x.ndim != 1 or x.shape[0] == 0:
            raise SamplingParamsError(f"logits must be a non-empty 1-D array, got shape {x.shape}")
        if x.dtype != np.float32:
            x = x.astype(np.float32)
        x = self.apply_penalties(x, history)
        if np.isnan(x).any():
            x = np.where(np.isnan(x), np.float32(-np.inf), x)
        return x

    def __call__(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        x = self._prepare(logits, history)
        if self.greedy:
            return _argmax(x)
        return self._draw(*self.candidates(x))

    def sample_candidates(self, ids: np.ndarray, vals: np.ndarray) -> int:
        """The draw of ``__call__`` from the k >= ``top_k_needed(n_vocab)`` best logits alone.

        ids, vals: the k largest logits of the vector (NaN counted as -inf, so none left),
        sorted by value descending, ties to the lower id, as np.argsort(-x, kind="stable")
        orders them (ei_cuda_topk's output). Only valid when ``top_k_needed`` is not None:
        no penalty is applied (there is no history)."""
        if self.greedy:
            return int(ids[0])
        k = self.top_k
        return self._draw(*self._filter(np.asarray(ids[:k]), np.asarray(vals[:k], dtype=np.float32), sorted_=True))

    def _draw(self, ids: np.ndarray, vals: np.ndarray) -> int:
        """temperature -> the seeded draw among the candidates."""
        if ids.shape[0] == 1:
            return int(ids[0])
        v = vals.astype(np.float64)
        top = v.max()
        if not math.isfinite(top):  # everything masked (-inf) or +inf present
            return int(ids[int(np.argmax(v))])
        p = np.exp((v - top) / self.temperature)
        cum = np.cumsum(p)
        r = self._rng.random() * cum[-1]
        j = int(np.searchsorted(cum, r, side="right"))
        return int(ids[min(j, ids.shape[0] - 1)])


def _top_k_ids(x: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest of x (no NaN; 0 < k < len(x)), value descending, ties to the lower id.

    argpartition alone leaves which of the ids tied with the k-th value survive to chance;
    here they are the lowest ones, as a stable sort (and the CUDA top-k) picks them.
    """
    t = x[np.argpartition(x, x.shape[0] - k)[x.shape[0] - k]]   # the k-th largest value
    above = np.flatnonzero(x > t)
    ids = np.concatenate([above, np.flatnonzero(x == t)[:k - above.shape[0]]])
    return ids[np.lexsort((ids, -x[ids]))]


def _argmax(x: np.ndarray) -> int:
    # np.argmax returns the first maximum: ties go to the lowest id, as in llama.cpp
    return int(np.argmax(x))


def make_sampler(temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, repeat_penalty: float = 1.0, presence_penalty: float = 0.0,
                 frequency_penalty: float = 0.0, penalty_last_n: int = 64,
                 seed: int | None = None) -> Sampler:
    """Builds a sampler ``fn(logits, history) -> token id``.

    - ``temperature <= 0``: greedy (argmax after penalties, ties -> lowest id).
    - ``top_k = 0``: no top-k; ``top_p = 1``: no top-p; ``min_p = 0``: no min-p.
    - ``repeat_penalty``: for ids in the last ``penalty_last_n`` of history, positive logits
      are divided by it and negative ones multiplied (1.0 = off).
    - ``presence_penalty`` / ``frequency_penalty``: ``logit -= presence*(count>0) +
      frequency*count`` over the same window (OpenAI's definition).
    - ``penalty_last_n``: window size; 0 disables penalties, -1 uses the whole history.
    - ``seed``: seeds a numpy Generator; same seed -> same draws; None -> fresh entropy.

    Raises SamplingParamsError for out-of-range values (top_k < 0, top_p not in (0, 1],
    min_p not in [0, 1], repeat_penalty <= 0, negative seed, non-numbers).
    """
    return Sampler(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                   repeat_penalty=repeat_penalty, presence_penalty=presence_penalty,
                   frequency_penalty=frequency_penalty, penalty_last_n=penalty_last_n, seed=seed)


# --------------------------------------------------------------------------- params

@dataclass(frozen=True)
class SamplingParams:
    """Everything one request asks of generation; validated on construction.

    ``max_tokens=None`` means "until end of sequence or the context runs out".
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64
    seed: int | None = None
    max_tokens: int | None = 64
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    # token id -> bias added to its logit (OpenAI's logit_bias; ids checked against the
    # vocabulary where it is known: SequenceState)
    logit_bias: Mapping[int, float] | None = None
    # a constraint.GrammarSpec: the output follows a JSON Schema / regex / grammar
    grammar: Any = None
    # a reasoning.ReasoningSpec: the thinking block to split from the answer, and its budget
    reasoning: Any = None
    # control tokens give no text (llama-server's rendering; a FIM model's stray markers in code)
    skip_special: bool = False

    def __post_init__(self) -> None:
        p = _check_chain(self.temperature, self.top_k, self.top_p, self.min_p,
                         self.repeat_penalty, self.presence_penalty, self.frequency_penalty,
                         self.penalty_last_n, self.seed)
        if p["temperature"] < 0:
            raise SamplingParamsError(
                f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        for k, v in p.items():
            object.__setattr__(self, k, v)
        if self.max_tokens is not None:
            object.__setattr__(self, "max_tokens", _check_int("max_tokens", self.max_tokens, lo=0))
        object.__setattr__(self, "stop", _check_stop(self.stop))
        if not isinstance(self.ignore_eos, bool):
            raise SamplingParamsError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        if self.logit_bias is not None:
            from .constraint import check_logit_bias
            object.__setattr__(self, "logit_bias", check_logit_bias(self.logit_bias, 2**31 - 1) or None)
        if self.grammar is not None:
            from .constraint import GrammarSpec
            if isinstance(self.grammar, Mapping) and set(self.grammar) == {"kind", "grammar"}:
                object.__setattr__(self, "grammar", GrammarSpec(**self.grammar))   # from to_dict()
            if not isinstance(self.grammar, GrammarSpec):
                raise SamplingParamsError("grammar must be a GrammarSpec (constraint.grammar_spec builds one)")
        if self.reasoning is not None:
            from .reasoning import ReasoningSpec
            if isinstance(self.reasoning, Mapping):    # from to_dict()
                object.__setattr__(self, "reasoning", ReasoningSpec.from_dict(self.reasoning))
            if not isinstance(self.reasoning, ReasoningSpec):
                raise SamplingParamsError("reasoning must be a ReasoningSpec (Engine.reasoning_spec builds one)")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def make_sampler(self) -> Sampler:
        return make_sampler(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                            min_p=self.min_p, repeat_penalty=self.repeat_penalty,
                            presence_penalty=self.presence_penalty,
                            frequency_penalty=self.frequency_penalty,
                            penalty_last_n=self.penalty_last_n, seed=self.seed)

    def stop_matcher(self) -> "StopMatcher":
        return StopMatcher(self.stop)

    def replace(self, **changes: Any) -> "SamplingParams":
        """A copy with some fields changed (validated; unknown names -> SamplingParamsError)."""
        _check_names(changes)
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None = None, **kwargs: Any) -> "SamplingParams":
        """Builds from a mapping and/or keywords; ``None`` values mean "use the default";
        unknown names raise SamplingParamsError."""
        merged = {**(dict(d) if d else {}), **kwargs}
        _check_names(merged)
        return cls(**{k: v for k, v in merged.items() if v is not None})


_FIELD_NAMES = frozenset(f.name for f in fields(SamplingParams))


def _check_names(d: Mapping[str, Any]) -> None:
    unknown = sorted(set(d) - _FIELD_NAMES)
    if unknown:
        raise SamplingParamsError(
            f"unknown sampling parameter(s): {', '.join(unknown)} "
            f"(known: {', '.join(sorted(_FIELD_NAMES))})")


def _check_stop(stop: Any) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)):
        raise SamplingParamsError(f"stop must be a string or a list of strings, got {stop!r}")
    out = []
    for s in stop:
        if not isinstance(s, str):
            raise SamplingParamsError(f"stop strings must be strings, got {s!r}")
        if s == "":
            raise SamplingParamsError("stop strings must not be empty")
        out.append(s)
    return out


# --------------------------------------------------------------------------- stop strings

class StopMatcher:
    """Cuts streamed text at the first stop string, never emitting any part of it.

    ``feed(piece) -> (text_to_emit, stopped)``: text safe to show now. A suffix that could
    be the beginning of a stop string is held back until the next pieces decide it. Once
    stopped, the text before the stop string has been emitted, ``stop_string`` names the
    one that matched, and later feeds return ``("", True)``. At the end of a stream that
    did not stop, ``flush()`` returns what is still held back.
    """

    def __init__(self, stops: Iterable[str] | str | None = None):
        if stops is not None and not isinstance(stops, str):
            stops = list(stops)
        self.stops: list[str] = _check_stop(stops)
        self._held = ""
        self.stopped = False
        self.stop_string: str | None = None

    def feed(self, piece: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        if not self.stops:
            return piece, False
        buf = self._held + piece
        # earliest stop occurrence; among those starting at the same place, the longest
        best: tuple[int, int, str] | None = None
        for s in self.stops:
            i = buf.find(s)
            if i >= 0 and (best is None or (i, -len(s)) < (best[0], best[1])):
                best = (i, -len(s), s)
        if best is not None:
            self.stopped = True
            self.stop_string = best[2]
            self._held = ""
            return buf[:best[0]], True
        hold = self._partial_len(buf)
        if hold:
            self._held = buf[-hold:]
            return buf[:-hold], False
        self._held = ""
        return buf, False

    def _partial_len(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of some stop string."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:k]):
                    best = k
                    break
        return best

    def flush(self) -> str:
        """The held-back text, at the end of a stream that did not stop."""
        if self.stopped:
            return ""
        out, self._held = self._held, ""
        return out

    @property
    def pending(self) -> str:
        return self._held
