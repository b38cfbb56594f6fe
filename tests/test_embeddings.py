"""Embeddings (Engine.embed, POST /v1/embeddings) against llama.cpp's embedding mode on the same
file: the hidden states after the final norm, pooled the same way."""
from __future__ import annotations

import numpy as np
import pytest

import edgeinfer
from edgeinfer.errors import ContextOverflowError, EmbeddingError
from tests.support.llama_oracle import N_THREADS
from tests.support.strict import require
from tests.support.texts import PROMPTS, TEXTS

N_CTX = 1024
# a long text (256+ tokens) runs in several forward chunks of MAX_BATCH rows
MAX_BATCH = 128
INPUTS = [TEXTS["story"], *PROMPTS[:3], "Hi"]
MIN_COSINE = 0.999


@pytest.fixture(scope="module")
def engine(smollm2_path):
    eng = edgeinfer.load(smollm2_path, n_ctx=N_CTX, n_threads=N_THREADS, max_batch=MAX_BATCH)
    yield eng
    eng.close()


def llama_embeddings(path, texts: list[str], pooling: str) -> np.ndarray:
    """llama.cpp's pooled embeddings (not normalized), float64 [len(texts), n_embd]."""
    llama_cpp = require("llama_cpp", "llama.cpp embeddings are the oracle")
    code = {"mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN, "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
            "last": llama_cpp.LLAMA_POOLING_TYPE_LAST}[pooling]
    llm = llama_cpp.Llama(model_path=str(path), embedding=True, pooling_type=code, n_ctx=N_CTX, n_batch=N_CTX,
                          n_threads=N_THREADS, n_threads_batch=N_THREADS, verbose=False)
    try:
        return np.array(llm.embed(texts, normalize=False, truncate=False), dtype=np.float64)
    finally:
        llm.close()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_embeddings_match_llama_cpp(engine, smollm2_path, pooling):
    ours = engine.embed(INPUTS, pooling=pooling, normalize=False)
    cos = cosines(ours, llama_embeddings(smollm2_path, INPUTS, pooling))
    assert cos.min() >= MIN_COSINE, f"{pooling}: cosines {np.round(cos, 5)}"


def test_normalized_embeddings_have_unit_length(engine):
    raw = engine.embed(INPUTS[:2], pooling="mean", normalize=False).astype(np.float64)
    unit = engine.embed(INPUTS[:2], pooling="mean")
    np.testing.assert_allclose(unit, raw / np.linalg.norm(raw, axis=1, keepdims=True), rtol=1e-6, atol=1e-7)


def test_pooling_defaults_to_the_files_or_mean(engine):
    """SmolLM2's file names no pooling_type: mean, as the issue asks (llama.cpp would give
    per-token rows, which have no one vector per input)."""
    assert "llama.pooling_type" not in engine.gguf.metadata
    np.testing.assert_array_equal(engine.embed(INPUTS[:2]), engine.embed(INPUTS[:2], pooling="mean"))


def test_file_pooling_follows_llama_cpp_enum():
    llama_cpp = require("llama_cpp", "llama.cpp's pooling enum is the oracle")
    from edgeinfer.engine.embedding import file_pooling

    for name in ("mean", "cls", "last"):
        code = getattr(llama_cpp, f"LLAMA_POOLING_TYPE_{name.upper()}")
        assert file_pooling({"qwen3.pooling_type": code}, "qwen3") == name


def test_token_ids_embed_as_their_text(engine):
    text = INPUTS[1]
    np.testing.assert_array_equal(engine.embed([engine.tokenize(text)]), engine.embed(text))


@pytest.mark.parametrize("bad, error", [
    ([], EmbeddingError),
    ([""], EmbeddingError),
    ([[1] * (N_CTX + 1)], ContextOverflowError),
])
def test_bad_inputs_are_typed_errors(engine, bad, error):
    with pytest.raises(error):
        engine.embed(bad)


def test_unknown_pooling_is_a_typed_error(engine):
    with pytest.raises(EmbeddingError, match="pooling"):
        engine.embed("hello", pooling="max")
