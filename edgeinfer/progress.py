"""Progress on stderr, all through tqdm: byte bars and one-line status notes. Both stay silent
when stderr is not a terminal (tqdm's disable=None) or when the caller asks for quiet."""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator

from tqdm import tqdm

__all__ = ["bar", "status"]


def bar(total: int | None, desc: str, quiet: bool = False, leave: bool = True) -> tqdm:
    """A bar counting bytes (total None: a counter without an end)."""
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                file=sys.stderr, disable=True if quiet else None, leave=leave, dynamic_ncols=True)


@contextmanager
def status(desc: str, quiet: bool = False, leave: bool = False) -> Iterator[Callable[[str], None]]:
    """Yields note(text), which shows 'desc: text' on one line that each note rewrites;
    the line is cleared at the end unless `leave`."""
    with tqdm(desc=desc, bar_format="{desc}", file=sys.stderr, disable=True if quiet else None,
              leave=leave, dynamic_ncols=True) as line:
        yield lambda text: line.set_description_str(f"{desc}: {text}")
