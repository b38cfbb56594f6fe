"""The token logic of one sequence and the iterator apps consume.

`SequenceState` is driven by the scheduler's stepping thread: each time the sequence gets a
row of logits it samples one token and returns the events that follow from it -- token ids
only. `TextStream` is the consumer side of the same sequence: it turns those ids into text
(never half a UTF-8 character) and applies the stop strings, off the stepping thread.
`Generation` submits a request to the engine's scheduler and iterates over the text pieces.
"""
from __future__ import annotations

import queue
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Protocol

import numpy as np

from .reasoning import ReasoningSplitter, ThinkingBudget
from .sampling import SamplingParams
from .tool_calls import call_finish
from ..text.tokenizer import StreamDecoder, Tokenizer


class Submitter(Protocol):
    """What a Generation queues its request on (the engine's scheduler)."""

    def submit(self, prompt_ids: list[int], params: SamplingParams, sink: Callable[[list], None],
               n_logprobs: int | None = None, **kw) -> "Cancellable": ...


class Cancellable(Protocol):
    def cancel(self) -> None: ...


@dataclass
class GenerationStats:
    """Timings as defined in docs/architecture.md (TTFT includes waiting for a slot)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0          # prompt tokens reused from the slot (prefix reuse)
    ttft_s: float = 0.0             # arrival -> first token out
    tpot_s: float = 0.0             # mean time between output tokens after the first
    prefill_s: float = 0.0          # slot granted -> first logits
    decode_s: float = 0.0
    queue_s: float = 0.0            # arrival -> slot granted
    e2e_s: float = 0.0              # arrival -> finished
    spec_proposed: int = 0          # speculative decoding: draft tokens verified
    spec_accepted: int = 0          # ... and confirmed by the model's own samples
    spec_k: float = 0.0             # mean drafts per verify step (the k the policy chose)

    @property
    def spec_acceptance(self) -> float:
        return self.spec_accepted / self.spec_proposed if self.spec_proposed else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return 1.0 / self.tpot_s if self.tpot_s > 0 else 0.0


@dataclass
class Completion:
    text: str
    tokens: list[int]
    finish_reason: str              # "stop" (EOS or stop string) | "length" | "tool_calls"
    stats: GenerationStats = field(default_factory=GenerationStats)
    logprobs: list["TokenLogprob"] | None = None
    tool_calls: list[dict] | None = None    # Engine.chat with tools: the calls the reply made
    reasoning_content: str | None = None    # Engine.chat on a template with thinking: the block's text


# --------------------------------------------------------------------------- events

@dataclass
class TokenLogprob:
    token: int
    logprob: float
    top: list[tuple[int, float]]    # (id, logprob), most likely first


@dataclass
class TokenEvent:
    token: int
    text: str = ""                  # text released by this token (may be "" while held back);
                                    # filled in by TextStream, on the consumer side
    logprob: TokenLogprob | None = None
    reasoning: str = ""             # thinking-block text released by this token (then not in `text`)


@dataclass
class DoneEvent:
    finish_reason: str              # "stop" | "length" | "cancelled"
    text: str                       # tail released at the end (held-back bytes / partial stop)
    stats: GenerationStats
    reasoning: str = ""             # thinking-block part of the tail
    stop_sequence: str | None = None   # the stop string that ended it, if one did
    # the end-of-generation token that ended it, with its logprob (when logprobs were asked)
    end_token: "TokenLogprob | None" = None


@dataclass
class ErrorEvent:
    error: BaseException


def token_logprob(logits: np.ndarray, token: int, n_top: int) -> TokenLogprob:
    """Log-probability of `token` under the model's distribution (raw logits, T = 1), and the
    `n_top` most likely alternatives — what OpenAI's `logprobs` report."""
    return token_logprobs(np.asarray(logits)[None], [token], n_top)[0]


def token_logprobs(rows: np.ndarray, tokens, n_top: int, block: int = 64) -> list[TokenLogprob]:
    """token_logprob of each row of logits [n, n_vocab] (float32, as the kernels give them) and
    its token, `block` rows at a time: the exponentials in float32 summed in float64 (1e-8 from
    an all-float64 sum, 7x faster), the top one by argmax, more by a partition."""
    out: list[TokenLogprob] = []
    for start in range(0, len(rows), block):
        x = np.asarray(rows[start:start + block], dtype=np.float32)
        m = x.max(axis=1, keepdims=True)
        lse = m[:, 0].astype(np.float64) + np.log(np.exp(x - m).sum(axis=1, dtype=np.float64))
        k = max(0, min(n_top, x.shape[1]))
        part = x.argmax(axis=1)[:, None] if k == 1 else np.argpartition(-x, k - 1, axis=1)[:, :k] if k else None
        for r, tok in enumerate(tokens[start:start + block]):
            top: list[tuple[int, float]] = []
            if part is not None:
                p = part[r]
                order = p[np.lexsort((p, -x[r, p]))]
                top = [(int(i), float(x[r, i]) - lse[r]) for i in order]
            out.append(TokenLogprob(token=int(tok), logprob=float(x[r, tok]) - float(lse[r]), top=top))
    return out


class SequenceState:
    """Per-sequence token loop state; not thread-safe (only the stepping thread touches it)."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int], params: SamplingParams,
                 n_logprobs: int | None = None, t_arrival: float | None = None):
        self.prompt_ids = prompt_ids
        self.params = params
        self.n_logprobs = n_logprobs
        self.sampler = params.make_sampler()
        self.eog = set() if params.ignore_eos else tokenizer.eog_ids
        self.history = list(prompt_ids)
        self.tokens: list[int] = []
        self.limit = params.max_tokens
        self.stats = GenerationStats(prompt_tokens=len(prompt_ids))
        self.t_arrival = time.perf_counter() if t_arrival is None else t_arrival
        self.t_admit: float | None = None
        self.t_first: float | None = None
        self.finish_reason: str | None = None
        self.constraint = None
        if params.grammar is not None:
            from .constraint import Constraint
            self.constraint = Constraint(params.grammar, tokenizer)
        # a thinking block with a budget: the closing marker's ids are forced once it is spent
        self.thinking = ThinkingBudget(params.reasoning) if params.reasoning is not None else None
        self.bias_ids = self.bias_vals = None
        if params.logit_bias:
            self.bias_ids = np.fromiter(params.logit_bias.keys(), dtype=np.int64)
            self.bias_vals = np.fromiter(params.logit_bias.values(), dtype=np.float32)

    def admitted(self, cached: int) -> None:
        self.t_admit = time.perf_counter()
        self.stats.cached_tokens = cached
        self.stats.queue_s = self.t_admit - self.t_arrival

    def wants_no_tokens(self) -> bool:
        return self.limit is not None and self.limit <= 0

    def top_k_needed(self, n_vocab: int) -> int | None:
        """How many of the best logits `on_candidates` needs; None: give it the whole row
        (`on_logits`), as penalties and logprobs do."""
        if self.n_logprobs is not None or self.constraint is not None or self.bias_ids is not None:
            return None     # a mask or a bias can change any logit
        return self.sampler.top_k_needed(n_vocab)

    def on_logits(self, logits: np.ndarray, has_room: bool) -> tuple[list, int | None]:
        """Samples one token. Returns (events, token to feed next or None when finished)."""
        t = time.perf_counter()
        forced = self.thinking.forced() if self.thinking is not None else None
        if forced is not None:
            return self._advance(forced, t, has_room, logits)
        x = logits
        if self.bias_ids is not None or self.constraint is not None:
            x = np.array(logits, dtype=np.float32, copy=True)
            if self.bias_ids is not None:
                ok = self.bias_ids < x.shape[0]
                x[self.bias_ids[ok]] += self.bias_vals[ok]
            if self.constraint is not None:
                allowed = self.constraint.allowed(x.shape[0])
                if not allowed.any():   # the grammar is in error: nothing may follow
                    return [self.finish("stop")], None
                np.copyto(x, np.float32(-np.inf), where=~allowed)
        return self._advance(self.sampler(x, self.history), t, has_room, logits)

    def on_candidates(self, ids: np.ndarray, vals: np.ndarray, has_room: bool) -> tuple[list, int | None]:
        """As on_logits, from the best logits of the row only (ids, vals: at least
        `top_k_needed` of them, sorted as Sampler.sample_candidates wants). Only when
        `top_k_needed` is not None: there are no logprobs without the whole row."""
        t = time.perf_counter()
        forced = self.thinking.forced() if self.thinking is not None else None
        if forced is not None:
            return self._advance(forced, t, has_room, None)
        return self._advance(self.sampler.sample_candidates(ids, vals), t, has_room, None)

    def _advance(self, tok: int, t_logits: float, has_room: bool,
                 logits: np.ndarray | None) -> tuple[list, int | None]:
        """Everything after the draw of `tok` from logits that arrived at t_logits."""
        events: list = []
        if self.t_first is None and self.t_admit is not None:
            self.stats.prefill_s = t_logits - self.t_admit
        if tok in self.eog:
            end = token_logprob(logits, tok, self.n_logprobs) \
                if self.n_logprobs is not None and logits is not None else None
            events.append(self.finish("stop", end))
            return events, None
        lp = token_logprob(logits, tok, self.n_logprobs) if self.n_logprobs is not None else None
        self.tokens.append(tok)
        self.history.append(tok)
        if self.thinking is not None:
            self.thinking.push(tok)
        now = time.perf_counter()
        if self.t_first is None:
            self.t_first = now
            self.stats.ttft_s = now - self.t_arrival
        self.stats.completion_tokens = len(self.tokens)
        events.append(TokenEvent(tok, logprob=lp))
        if self.constraint is not None and (not self.constraint.consume(tok) or self.constraint.done):
            events.append(self.finish("stop"))     # the grammar is complete
        elif self.limit is not None and len(self.tokens) >= self.limit:
            events.append(self.finish("length"))
        elif not has_room:
            events.append(self.finish("length"))
        return events, (None if self.finish_reason else tok)

    def finish(self, reason: str, end_token: TokenLogprob | None = None) -> DoneEvent:
        self.finish_reason = reason
        return DoneEvent(reason, "", self.final_stats(len(self.tokens)), end_token=end_token)

    def final_stats(self, n_tokens: int) -> GenerationStats:
        """The stats of the sequence ended now after n_tokens. Reads only what is fixed once the
        first token is out, so the consumer side may call it too (a stop string)."""
        t_end = time.perf_counter()
        st = replace(self.stats, completion_tokens=n_tokens)
        if self.t_first is not None:
            st.decode_s = t_end - self.t_first
            st.tpot_s = st.decode_s / (n_tokens - 1) if n_tokens > 1 else 0.0
        else:
            st.ttft_s = t_end - self.t_arrival
        st.e2e_s = t_end - self.t_arrival
        return st


class TextStream:
    """The consumer side of one sequence: the stepping thread's token ids become text here.

    `feed(events)` fills in each TokenEvent's text and the DoneEvent's tail (bytes held back,
    a partial stop string), exactly as one StreamDecoder + StopMatcher over the ids would. A
    stop string ends the sequence here: `on_stop` tells the scheduler to drop it, and what
    the stepping thread still sends for it is ignored."""

    def __init__(self, tokenizer: Tokenizer, seq: SequenceState, on_stop: Callable[[], None]):
        self.seq = seq
        self.decoder = StreamDecoder(tokenizer, skip_special=seq.params.skip_special)
        self.stops = seq.params.stop_matcher()
        reasoning = seq.params.reasoning
        self.splitter = ReasoningSplitter(reasoning) if reasoning is not None else None
        self.on_stop = on_stop
        self.n_tokens = 0
        self.done = False

    def feed(self, events: list) -> list:
        out: list = []
        for ev in events:
            if self.done:
                break
            if isinstance(ev, TokenEvent):
                self.n_tokens += 1
                text, stopped = self.stops.feed(self.decoder.push(ev.token))
                ev.reasoning, ev.text = self._split(text, final=stopped)
                out.append(ev)
                if stopped:
                    self.done = True
                    out.append(DoneEvent("stop", "", self.seq.final_stats(self.n_tokens),
                                         stop_sequence=self.stops.stop_string))
                    self.on_stop()
            else:
                self.done = True
                if isinstance(ev, DoneEvent) and ev.finish_reason != "cancelled":
                    tail, _ = self.stops.feed(self.decoder.flush())
                    ev.reasoning, ev.text = self._split(tail + self.stops.flush(), final=True)
                out.append(ev)
        return out

    def _split(self, text: str, final: bool) -> tuple[str, str]:
        """(reasoning, content) of released text; all content without a thinking block."""
        if self.splitter is None:
            return "", text
        return self.splitter.feed(text, final=final)


# --------------------------------------------------------------------------- consumer

class Generation:
    """Iterates over text pieces; `tokens`, `finish_reason` and `stats` fill in as it goes.

    The request is queued on the engine's scheduler at creation and holds one KV slot
    while it runs; `close()` (or garbage collection) cancels it and frees the slot.
    """

    def __init__(self, scheduler: Submitter, prompt_ids: list[int], params: SamplingParams,
                 n_logprobs: int | None = None, parse_calls: Callable[[str], list | None] | None = None,
                 **submit_kw):
        self.prompt_ids = prompt_ids
        self.params = params
        # a chat with tools: the reply's text is read back into tool_calls once it ends
        self._parse_calls = parse_calls
        self._text: list[str] = []
        self._reasoning: list[str] | None = [] if params.reasoning is not None else None
        self.tool_calls: list[dict] | None = None
        self.tokens: list[int] = []
        self.logprobs: list[TokenLogprob] | None = [] if n_logprobs is not None else None
        self.finish_reason: str | None = None
        self.stats = GenerationStats(prompt_tokens=len(prompt_ids))
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: deque = deque()
        self._done = False
        self._req: Cancellable | None = None
        self._req = scheduler.submit(prompt_ids, params, self._events.put, n_logprobs=n_logprobs, **submit_kw)

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        piece = self._next()
        if self._parse_calls is not None:
            self._text.append(piece)
        return piece

    def _next(self) -> str:
        while True:
            if not self._pending:
                if self._done:
                    raise StopIteration
                self._pending.extend(self._events.get())
            ev = self._pending.popleft()
            if self._reasoning is not None and isinstance(ev, (TokenEvent, DoneEvent)) and ev.reasoning:
                self._reasoning.append(ev.reasoning)
            if isinstance(ev, TokenEvent):
                self.tokens.append(ev.token)
                self.stats.completion_tokens = len(self.tokens)
                if ev.logprob is not None and self.logprobs is not None:
                    self.logprobs.append(ev.logprob)
                if ev.text:
                    return ev.text
            elif isinstance(ev, DoneEvent):
                self._done = True
                self.finish_reason = ev.finish_reason
                self.stats = ev.stats
                if self._parse_calls is not None:
                    self.tool_calls = self._parse_calls("".join(self._text) + ev.text)
                    self.finish_reason = call_finish(self.finish_reason, self.tool_calls)
                if ev.text:
                    return ev.text
            elif isinstance(ev, ErrorEvent):
                self._done = True
                raise ev.error

    @property
    def reasoning_content(self) -> str | None:
        """The thinking block's text so far (None: the prompt's template has no thinking);
        iterating gives the answer only."""
        return None if self._reasoning is None else "".join(self._reasoning)

    def close(self) -> None:
        if not self._done and self._req is not None:
            self._req.cancel()
            self._done = True

    def __del__(self) -> None:  # an abandoned stream must not hold its slot
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def result(self) -> Completion:
        """Runs to the end and returns the whole completion."""
        text = "".join(self)
        return Completion(text=text, tokens=list(self.tokens), finish_reason=self.finish_reason or "stop",
                          stats=self.stats, logprobs=self.logprobs, tool_calls=self.tool_calls,
                          reasoning_content=self.reasoning_content)

