"""Strict mode.

Strict mode (EDGEINFER_STRICT=1, set by scripts/test.sh and so by CI; EDGEINFER_STRICT=0 opts
out): a missing oracle or an edgeinfer module that fails to import is a failure, not a skip,
so a green run means every oracle really ran. Tests reach optional modules only through
`require`, and report anything else that is missing through `missing`.
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import FrameType, ModuleType
from typing import NoReturn

import pytest

# where an oracle comes from, for the modules whose install is not just `pip install .[test]`
_WHERE = {"llama_cpp": "the llama.cpp oracle (llama-cpp-python) is installed by scripts/install_oracles.sh"}


def strict() -> bool:
    return os.environ.get("EDGEINFER_STRICT", "0") not in ("", "0")


def missing(reason: str) -> NoReturn:
    """Skips the test (or module) with `reason`; in strict mode fails it instead."""
    caller = _caller()
    if caller.f_code.co_name == "<module>":   # pytest would report this file's line, not the module's
        reason = f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno}: {reason}"
    if strict():
        pytest.fail(f"{reason} (EDGEINFER_STRICT=1 makes this a failure; "
                    "EDGEINFER_STRICT=0 skips it)", pytrace=False)
    # reported at the test's line rather than here
    raise pytest.skip.Exception(reason, allow_module_level=True, _use_item_location=True)


def _caller() -> FrameType:
    """The innermost frame outside this file."""
    f = sys._getframe(1)
    while f.f_code.co_filename == __file__:
        f = f.f_back
    return f


def require(module: str, reason: str | None = None) -> ModuleType:
    """The imported module, or `missing` with why it could not be imported.

    Any exception counts (a native library that fails to load raises OSError, not ImportError)."""
    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - reported, not swallowed
        why = f"{type(exc).__name__}: {exc}"
    missing(f"{reason or _WHERE.get(module) or f'needs {module}'}: {why}")
