"""Shared fixtures: the real model (SmolLM2-135M-Instruct Q4_1) and the llama.cpp oracle."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """Path of the cached default model, fetched on first use."""
    cache = Path(os.environ.get("EDGEINFER_CACHE", Path.home() / ".cache" / "edgeinfer")) / "models"
    path = cache / DEFAULT_MODEL_FILE
    if not path.exists():
        try:
            from edgeinfer.models import ensure_model
        except ImportError:
            pytest.skip("default model not cached and edgeinfer.models not available")
        path = Path(ensure_model("smollm2-135m-instruct-q4_1"))
    return path
