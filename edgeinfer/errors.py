"""Typed exceptions: every bad input a user can give ends in one of these."""


class EdgeInferError(Exception):
    """Base class of every error edgeinfer raises on purpose."""


class GGUFError(EdgeInferError, ValueError):
    """A GGUF file is malformed, truncated, hostile or uses something we do not support."""


class UnsupportedArchitectureError(GGUFError):
    """The file's `general.architecture` (or a checkpoint's) is not one we can run."""


class UnsupportedTypeError(GGUFError):
    """A tensor uses a GGML type we cannot compute with."""


class TokenizerError(EdgeInferError, ValueError):
    """Tokenizer metadata is missing or inconsistent, or a token id is out of range."""


class InvalidTokenError(TokenizerError):
    """A token id outside [0, n_vocab)."""


class ContextOverflowError(EdgeInferError, ValueError):
    """The prompt (plus requested tokens) does not fit the context."""


class TemplateError(EdgeInferError, ValueError):
    """A chat template failed to render, tried something unsafe, or produced too much."""


class NativeError(EdgeInferError, RuntimeError):
    """The native library returned an error code."""


class ModelNotFoundError(EdgeInferError, FileNotFoundError):
    """A model path or known-model name that does not resolve to a file."""


class SamplingParamsError(EdgeInferError, ValueError):
    """A sampling parameter is out of range or of the wrong type (temperature, top_p, ...)."""


class ConversionError(EdgeInferError, ValueError):
    """A checkpoint, adapter or conversion option that `edgeinfer convert` cannot use."""
