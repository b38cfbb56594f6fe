"""Reasoning output: the thinking block of chat templates that have one, kept apart from the answer.

A family's markers are data (`FORMATS`): a template that writes both markers of a format
(and what else its row requires) has that format. Per request a `ReasoningSpec` says where the block stands when generation
starts (a generation prompt may open it, as Qwen3.5's does) and what it may spend.

Two sides use it, as for every sequence:
- the stepping thread (`ThinkingBudget`, token ids): counts the tokens inside the block and,
  once the budget is spent, queues the closing marker's ids, which the sequence then takes
  instead of sampling (decoding continues with the answer);
- the consumer side (`ReasoningSplitter`, text): cuts the released text into reasoning and
  content, never showing part of a marker.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

__all__ = ["ReasoningFormat", "ReasoningSpec", "FORMATS", "reasoning_format", "ThinkingBudget",
           "ReasoningSplitter", "EFFORT_BUDGETS"]


@dataclass(frozen=True)
class ReasoningFormat:
    """The markers around a family's thinking block. `label`: text the model writes right
    after `start` that belongs to the opening (Gemma 4 names its channel: "<|channel>thought");
    `also_ends`: texts that close the block when the model skips `end`, left in the answer
    (Qwen3.5 may open a tool call straight from its thoughts); `strays`: markers dropped
    where they stand outside the block (Gemma 4 may close a channel it never opened, at the
    end of its answer); `requires`: what else a template must write to have this format."""
    name: str
    start: str
    end: str
    label: str = ""
    also_ends: tuple[str, ...] = ()
    strays: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()

    def __post_init__(self):   # from_dict hands back lists
        for f in ("also_ends", "strays", "requires"):
            object.__setattr__(self, f, tuple(getattr(self, f)))

    @property
    def opening(self) -> str:
        """The opening as text: the start marker and its label."""
        return self.start + self.label


#: Known thinking blocks, the first whose markers (and requirements) the template writes wins.
#: Markers checked against the templates in llama.cpp's models/templates and its
#: common/chat.cpp (thinking_start_tag / thinking_end_tags of each family).
FORMATS: tuple[ReasoningFormat, ...] = (
    ReasoningFormat("gemma4", "<|channel>", "<channel|>", label="thought", strays=("<channel|>",)),  # Gemma 4
    ReasoningFormat("think-xml-tools", "<think>", "</think>", also_ends=("<tool_call>",),
                    requires=("<function=",)),                                 # Qwen3.5
    ReasoningFormat("think", "<think>", "</think>"),     # Qwen3, DeepSeek-R1, SmolLM3, LFM2
)

#: OpenAI's reasoning_effort as a thinking budget in tokens (None: unbounded).
EFFORT_BUDGETS: dict[str, int | None] = {"none": 0, "minimal": 64, "low": 512, "medium": 2048, "high": None}


def reasoning_format(template_source: str) -> ReasoningFormat | None:
    """The thinking block a chat template writes, or None when it has none."""
    for fmt in FORMATS:
        if all(m in template_source for m in (fmt.start, fmt.end, *fmt.requires)):
            return fmt
    return None


@dataclass(frozen=True)
class ReasoningSpec:
    """One sequence's thinking block: its markers (text and token ids; `also_end_ids`: the
    ids of each of the format's `also_ends`), whether the prompt left it open, and the most
    tokens it may hold (None: no bound)."""
    fmt: ReasoningFormat
    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]
    open_at_start: bool
    budget: int | None = None
    also_end_ids: tuple[tuple[int, ...], ...] = ()

    @classmethod
    def from_dict(cls, d: dict) -> "ReasoningSpec":
        """The inverse of dataclasses.asdict (SamplingParams.to_dict)."""
        return cls(ReasoningFormat(**d["fmt"]), tuple(d["start_ids"]), tuple(d["end_ids"]),
                   bool(d["open_at_start"]), d.get("budget"),
                   tuple(tuple(m) for m in d.get("also_end_ids", ())))

    @classmethod
    def for_prompt(cls, fmt: ReasoningFormat, start_ids: Sequence[int], end_ids: Sequence[int],
                   prompt_ids: Sequence[int], budget: int | None = None,
                   also_end_ids: Sequence[Sequence[int]] = ()) -> "ReasoningSpec":
        """The spec of a prompt: open when its last start marker comes after its last end marker."""
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
            raise ValueError(f"the thinking budget must be an int >= 0 (tokens), got {budget!r}")
        return cls(fmt, tuple(start_ids), tuple(end_ids),
                   _last(prompt_ids, start_ids) > _last(prompt_ids, end_ids), budget,
                   tuple(tuple(m) for m in also_end_ids if m))


def _last(ids: Sequence[int], marker: Sequence[int]) -> int:
    """Where the last occurrence of `marker` in `ids` starts (-1: none)."""
    n = len(marker)
    for i in range(len(ids) - n, -1, -1):
        if list(ids[i:i + n]) == list(marker):
            return i
    return -1


class ThinkingBudget:
    """(stepping thread) Follows the block over the generated ids; `forced()` gives the ids
    the sequence must take next: the closing marker once the budget is spent. One of the
    format's `also_ends` closes the block as the end marker does (Qwen3.5's <tool_call>
    straight from the thoughts): no closing marker is forced into the call."""

    def __init__(self, spec: ReasoningSpec):
        self.spec = spec
        self.inside = spec.open_at_start
        self.spent = 0                  # tokens inside the open block
        self._ends = (spec.end_ids, *spec.also_end_ids)
        self._tail: deque[int] = deque(maxlen=max(len(m) for m in (spec.start_ids, *self._ends)))
        self._forced: deque[int] = deque()
        self._check()

    def forced(self) -> int | None:
        return self._forced.popleft() if self._forced else None

    def push(self, token: int) -> None:
        self._tail.append(token)
        if not self.inside:
            if self._ends_with(self.spec.start_ids):
                self.inside, self.spent = True, 0
        elif any(self._ends_with(m) for m in self._ends):
            self.inside = False
            self._forced.clear()
        elif not self._forced:
            self.spent += 1
        self._check()

    def _ends_with(self, marker: tuple[int, ...]) -> bool:
        n = len(marker)
        return n > 0 and len(self._tail) >= n and tuple(self._tail)[-n:] == marker

    def _check(self) -> None:
        budget = self.spec.budget
        if self.inside and budget is not None and self.spent >= budget and not self._forced:
            self._forced.extend(self.spec.end_ids)


class ReasoningSplitter:
    """(consumer side) `feed(text) -> (reasoning, content)`: the text released so far, split
    at the markers; a suffix that may be the start of a marker is held until the next piece
    decides it, and `final=True` releases it. Whitespace right after a marker is dropped (the
    template's own separator), so the answer does not start with blank lines."""

    def __init__(self, spec: ReasoningSpec):
        self.fmt = spec.fmt
        self.inside = spec.open_at_start
        self._held = ""
        self._strip = spec.open_at_start

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        buf = self._held + text
        parts = {True: [], False: []}
        while True:
            i, marker, keep = self._next(buf)
            if i < 0:
                break
            self._emit(parts, buf[:i])
            buf = buf[i + (0 if keep else len(marker)):]
            if not self.inside and marker in self.fmt.strays:
                continue                  # dropped, the side stays
            self.inside = not self.inside
            self._strip = True
        hold = 0 if final else max(_partial(buf, m) for m in self._markers())
        self._held = buf[len(buf) - hold:] if hold else ""
        self._emit(parts, buf[:len(buf) - hold])
        return "".join(parts[True]), "".join(parts[False])

    def _markers(self) -> tuple[str, ...]:
        """What may change the side next: the closing markers inside, the opening outside."""
        return (self.fmt.end, *self.fmt.also_ends) if self.inside else (self.fmt.opening, *self.fmt.strays)

    def _next(self, buf: str) -> tuple[int, str, bool]:
        """The first marker in `buf`: (where, which, whether it stays in the text); -1 if none."""
        best = (-1, "", False)
        for m in self._markers():
            i = buf.find(m)
            if i >= 0 and (best[0] < 0 or i < best[0]):
                best = (i, m, self.inside and m != self.fmt.end)
        return best

    def _emit(self, parts: dict, text: str) -> None:
        if self._strip:
            text = text.lstrip()
            self._strip = not text
        if text:
            parts[self.inside].append(text)


def _partial(buf: str, marker: str) -> int:
    """Length of the longest suffix of `buf` that is a proper prefix of `marker`."""
    for k in range(min(len(marker) - 1, len(buf)), 0, -1):
        if buf.endswith(marker[:k]):
            return k
    return 0
