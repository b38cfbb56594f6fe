"""Embeddings (Engine.embed, POST /v1/embeddings) against llama.cpp's embedding mode on the same
file: the hidden states after the final norm, pooled the same way."""
from __future__ import annotations

import functools

import numpy as np
import pytest

import edgeinfer
from edgeinfer.errors import ContextOverflowError, EmbeddingError
from edgeinfer.server import ServerThread
from tests.support.llama_oracle import N_THREADS
from tests.support.strict import require
from tests.support.texts import PROMPTS, TEXTS
from tests.test_server import request

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


@functools.cache
def llama_embeddings(path, texts: tuple[str, ...], pooling: str) -> np.ndarray:
    """llama.cpp's pooled embeddings (not normalized), float64 [len(texts), n_embd]."""
    llama_cpp = require("llama_cpp", "llama.cpp embeddings are the oracle")
    code = {"mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN, "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
            "last": llama_cpp.LLAMA_POOLING_TYPE_LAST}[pooling]
    llm = llama_cpp.Llama(model_path=str(path), embedding=True, pooling_type=code, n_ctx=N_CTX, n_batch=N_CTX,
                          n_threads=N_THREADS, n_threads_batch=N_THREADS, verbose=False)
    try:
        return np.array(llm.embed(list(texts), normalize=False, truncate=False), dtype=np.float64)
    finally:
        llm.close()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_embeddings_match_llama_cpp(engine, smollm2_path, pooling):
    ours = engine.embed(INPUTS, pooling=pooling, normalize=False)
    cos = cosines(ours, llama_embeddings(smollm2_path, tuple(INPUTS), pooling))
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


# ---------------------------------------------------------------------------- POST /v1/embeddings

MODEL = "smollm2"


@pytest.fixture(scope="module")
def server(engine):
    srv = ServerThread(engine, model_name=MODEL).start()
    yield srv
    srv.stop(timeout_s=30)


@pytest.fixture(scope="module")
def client(server):
    openai = require("openai", "the official OpenAI client is the reference client")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_openai_client_gets_llama_cpp_embeddings_as_float_and_base64(client, smollm2_path):
    """The client asks for base64 when it is not told (and decodes it); both encodings give the
    same vectors, llama.cpp's mean-pooled ones scaled to unit length."""
    as_float = client.embeddings.create(model=MODEL, input=INPUTS, encoding_format="float")
    as_base64 = client.embeddings.create(model=MODEL, input=INPUTS)
    vectors = np.array([d.embedding for d in as_float.data], dtype=np.float32)
    np.testing.assert_array_equal(np.array([d.embedding for d in as_base64.data], dtype=np.float32), vectors)
    assert [d.index for d in as_float.data] == list(range(len(INPUTS)))
    assert cosines(vectors, llama_embeddings(smollm2_path, tuple(INPUTS), "mean")).min() >= MIN_COSINE
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)


def test_usage_counts_the_inputs_tokens(client, smollm2_path):
    require("llama_cpp", "llama.cpp's tokenizer counts the tokens")
    from tests.support.llama_oracle import llama_tokenize

    out = client.embeddings.create(model=MODEL, input=INPUTS[1:3], encoding_format="float")
    n = sum(len(llama_tokenize(smollm2_path, t)) for t in INPUTS[1:3])
    assert out.usage.prompt_tokens == out.usage.total_tokens == n


def test_token_id_inputs_embed_as_their_text(client, engine):
    text = INPUTS[1]
    ids = engine.tokenize(text)
    by_text = client.embeddings.create(model=MODEL, input=text, encoding_format="float").data[0].embedding
    by_ids = client.embeddings.create(model=MODEL, input=ids, encoding_format="float").data[0].embedding
    batch = client.embeddings.create(model=MODEL, input=[ids, ids[:3]], encoding_format="float").data
    assert by_ids == by_text == batch[0].embedding and len(batch) == 2


def test_dimensions_of_the_models_width_is_accepted(client, engine):
    out = client.embeddings.create(model=MODEL, input="Hi", dimensions=engine.config.n_embd, encoding_format="float")
    assert len(out.data[0].embedding) == engine.config.n_embd


@pytest.mark.parametrize("body, param", [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": ["a", ""]}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": [1] * (N_CTX + 1)}, "input"),        # longer than the context
    ({"input": [10**9]}, "input"),                   # outside the vocabulary
    ({"input": "Hi", "dimensions": 64}, "dimensions"),
    ({"input": "Hi", "encoding_format": "int8"}, "encoding_format"),
])
def test_bad_requests_are_400_naming_the_field(server, body, param):
    status, _, out = request(server.url + "/v1/embeddings", "POST", {"model": MODEL, **body})
    assert status == 400, out
    assert out["error"]["param"].startswith(param), out


def test_unknown_model_is_404(server):
    status, _, out = request(server.url + "/v1/embeddings", "POST", {"model": "nope", "input": "Hi"})
    assert status == 404 and out["error"]["code"] == "model_not_found"
