"""edgeinfer: run GGUF language models on our own native kernels."""
from .errors import (
    ContextOverflowError,
    EdgeInferError,
    GGUFError,
    InfillError,
    RerankError,
    InvalidArgumentError,
    InvalidTokenError,
    ModelNotFoundError,
    NativeError,
    NativeOutOfMemoryError,
    NativeUnsupportedError,
    RangeError,
    StateError,
    TemplateError,
    TokenizerError,
    UnsupportedArchitectureError,
    UnsupportedTypeError,
)

from ._version import __version__

__all__ = [
    "load", "Engine", "__version__",
    "EdgeInferError", "GGUFError", "UnsupportedArchitectureError", "UnsupportedTypeError",
    "TokenizerError", "InvalidTokenError", "ContextOverflowError", "TemplateError",
    "NativeError", "InvalidArgumentError", "NativeOutOfMemoryError", "NativeUnsupportedError", "RangeError",
    "StateError", "ModelNotFoundError", "InfillError", "RerankError",
]


def load(path, **kwargs):
    """Loads a GGUF model (a path or a known model name) and returns an Engine."""
    from .engine.engine import Engine

    return Engine.load(path, **kwargs)


def __getattr__(name):
    if name == "Engine":
        from .engine.engine import Engine

        return Engine
    raise AttributeError(name)
