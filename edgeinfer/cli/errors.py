"""The one way CLI commands fail: a user error becomes one line on stderr and exit 1."""
from __future__ import annotations

import functools
import importlib
import os
import sys
from typing import Any, Callable

import typer

from ..errors import EdgeInferError

# Errors a user can cause with arguments or files; anything else is a bug and keeps its traceback.
USER_ERRORS = (EdgeInferError, ValueError, OSError)


def import_extra(module: str, extra: str) -> Any:
    """The module, or exit 1 naming the pip extra that provides what it is missing (the server
    stack is not part of the core install)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if not e.name or e.name.partition(".")[0] == "edgeinfer":
            raise   # a module of ours missing is a bug, not a missing extra
        print(f"error: this command needs {e.name}, which the core install leaves out: "
              f"pip install 'edgeinfer[{extra}]'", file=sys.stderr, flush=True)
        raise typer.Exit(1) from None


def handle_errors(fn: Callable) -> Callable:
    """Decorator for commands: USER_ERRORS -> `error: ...` on stderr + exit 1; Ctrl-C -> 130;
    a closed pipe (`edgeinfer run ... | head`) -> a quiet exit 0."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BrokenPipeError:
            try:  # point stdout at /dev/null so the flush at exit does not complain again
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            except (OSError, ValueError, AttributeError):
                pass
            raise typer.Exit(0) from None
        except USER_ERRORS as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            print("", file=sys.stderr, flush=True)
            raise typer.Exit(130) from None

    return wrapper
