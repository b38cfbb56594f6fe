"""Shared fixtures: the real model, SmolLM2-135M-Instruct Q4_1 (strict mode: tests/support/strict.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """Path of the cached default model, fetched (and sha256-verified) on first use."""
    from edgeinfer.hub import DEFAULT_MODEL, ensure_model

    return ensure_model(DEFAULT_MODEL, progress=False)
