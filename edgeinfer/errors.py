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
    """The native library returned an error code (the subclasses below name which)."""


class InvalidArgumentError(NativeError, ValueError):
    """EI_ERR_INVALID_ARG: a null pointer, a bad size or a bad parameter reached the C API."""


class NativeOutOfMemoryError(NativeError, MemoryError):
    """EI_ERR_OUT_OF_MEMORY: host or device memory could not be allocated."""


class NativeUnsupportedError(NativeError, UnsupportedTypeError):
    """EI_ERR_UNSUPPORTED: a type, ISA, architecture or KV layout the kernels cannot compute with."""


class RangeError(NativeError, IndexError):
    """EI_ERR_RANGE: a token id, slot, cell, position or batch size outside its bounds."""


class StateError(NativeError):
    """EI_ERR_STATE: a call out of order (e.g. a runtime on a model that is not finalized)."""


class ModelNotFoundError(EdgeInferError, FileNotFoundError):
    """A model path or known-model name that does not resolve to a file."""


class SamplingParamsError(EdgeInferError, ValueError):
    """A sampling parameter is out of range or of the wrong type (temperature, top_p, ...)."""


class ConversionError(EdgeInferError, ValueError):
    """A checkpoint, adapter or conversion option that `edgeinfer convert` cannot use."""


class EmbeddingError(EdgeInferError, ValueError):
    """An embedding request the engine cannot serve: no input, an empty one, or an unknown pooling."""


class RerankError(EdgeInferError, ValueError):
    """A reranking request the engine cannot serve: a model without a classification head, or no documents."""


class InfillError(EdgeInferError, ValueError):
    """A fill-in-the-middle request on a model whose vocabulary has no prefix / suffix / middle tokens."""
