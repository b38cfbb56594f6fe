"""Reranking (Engine.rerank, the /rerank routes) of Qwen3-Reranker checkpoints, against the model
card's own transformers recipe, llama.cpp's converter and llama.cpp's rank pooling on the same
files, and the official Cohere client.

Tiny random-weight Qwen3 checkpoints titled "Qwen3-Reranker" (how converters know one), with a
tied head (as the 0.6B) and an untied one (as the 4B and 8B)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from tests.support.strict import require

torch = require("torch", "tiny checkpoints are built with torch")
tf = require("transformers", "the model card's transformers recipe is the oracle")
require("tokenizers")
llama_cpp = require("llama_cpp", "llama.cpp's rank pooling is the oracle")
require("gguf", "the gguf package is a test dependency")
from hypothesis import HealthCheck, settings  # noqa: E402

from tests.support import tiny_checkpoints  # noqa: E402
from tests.support.llama_cpp_convert import both_converters  # noqa: E402
from tests.support.llama_oracle import N_THREADS  # noqa: E402
from tests.test_server import request  # noqa: E402

import edgeinfer  # noqa: E402
from edgeinfer.convert import convert_checkpoint  # noqa: E402
from edgeinfer.errors import ContextOverflowError, GGUFError, RerankError  # noqa: E402
from edgeinfer.gguf import GGUFFile  # noqa: E402

pytestmark = [pytest.mark.oracle]
torch.set_num_threads(1)

KINDS = ["qwen3_reranker", "qwen3_reranker_untied"]
N_CTX = 512
QUERY = "What is the capital of France?"
DOCUMENTS = ["Paris is the capital and largest city of France.",
             "def add(a, b):\n    return a + b",
             "The quick brown fox jumps over the lazy dog, café 🙂 12345.",
             "Once upon a time, in a small village, there lived an old clockmaker who loved tea. " * 4]
# The model card's prompt pieces (Qwen/Qwen3-Reranker-0.6B, "Transformers Usage")
CARD_PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
               "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
CARD_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
CARD_TASK = "Given a web search query, retrieve relevant passages that answer the query"
# f32 weights, f16 KV cells: what the scores' difference from transformers' float32 may be
TOL = 3e-4


@pytest.fixture(scope="module")
def rerankers(tmp_path_factory):
    """{kind: (checkpoint, our f32 file, llama.cpp's f32 file)}."""
    root = tmp_path_factory.mktemp("rerank")
    out = {}
    for kind in KINDS:
        d, _, ours, theirs = both_converters(kind, root)
        out[kind] = (d, ours, theirs)
    return out


@pytest.fixture(scope="module")
def engines(rerankers):
    engs = {k: edgeinfer.load(v[1], n_ctx=N_CTX, n_threads=N_THREADS) for k, v in rerankers.items()}
    yield engs
    for e in engs.values():
        e.close()


def card_scores(model_dir, query: str, documents: list[str]) -> tuple[list[list[int]], np.ndarray]:
    """The model card's recipe: its prompt's ids and P("yes") from the yes / no logits."""
    tok = tf.AutoTokenizer.from_pretrained(str(model_dir))
    model = tf.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    prefix = tok.encode(CARD_PREFIX, add_special_tokens=False)
    suffix = tok.encode(CARD_SUFFIX, add_special_tokens=False)
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    prompts, scores = [], []
    for doc in documents:
        pair = f"<Instruct>: {CARD_TASK}\n<Query>: {query}\n<Document>: {doc}"
        ids = prefix + tok.encode(pair, add_special_tokens=False) + suffix
        with torch.no_grad():
            last = model(torch.tensor([ids])).logits[0, -1]
        pair_logits = torch.stack([last[no], last[yes]]).double()
        scores.append(torch.log_softmax(pair_logits, dim=0)[1].exp().item())
        prompts.append(ids)
    return prompts, np.array(scores)


def llama_rank(path, prompts: list[list[int]]) -> tuple[list[str], np.ndarray]:
    """llama.cpp's classifier labels and rank-pooled outputs [len(prompts), labels] on `path`."""
    llm = llama_cpp.Llama(model_path=str(path), embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_RANK,
                          n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_threads=N_THREADS,
                          n_threads_batch=N_THREADS, verbose=False)
    try:
        model = llm._model.model
        n_cls = llama_cpp.llama_model_n_cls_out(model)
        labels = [llama_cpp.llama_model_cls_label(model, i).decode() for i in range(n_cls)]
        out = []
        for ids in prompts:
            llm._ctx.kv_cache_clear()
            llm._batch.reset()
            llm._batch.add_sequence(ids, 0, True)
            llm._ctx.decode(llm._batch)
            ptr = llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, 0)
            out.append([ptr[i] for i in range(n_cls)])
        return labels, np.array(out)
    finally:
        llm.close()


@pytest.mark.parametrize("kind", KINDS)
def test_converted_head_and_keys_are_llama_cpps(rerankers, kind):
    """The classification head (the "yes" and "no" rows of the LM head, tied or not), the pooling
    type, the labels and the rerank template are what llama.cpp's converter writes."""
    _, ours, theirs = rerankers[kind]
    a, b = GGUFFile(ours), GGUFFile(theirs)
    for key in ("qwen3.pooling_type", "qwen3.classifier.output_labels", "tokenizer.chat_template.rerank",
                "tokenizer.chat_templates"):
        assert a.metadata[key] == b.metadata[key], key
    wa, wb = a.tensors["cls.output.weight"], b.tensors["cls.output.weight"]
    assert wa.shape == wb.shape and wa.type == wb.type
    np.testing.assert_array_equal(np.frombuffer(wa.data, np.float32), np.frombuffer(wb.data, np.float32))


@pytest.mark.parametrize("kind", KINDS)
def test_scores_are_the_model_cards_recipe(rerankers, engines, kind):
    """The prompt is the card's token for token, and each score its P("yes") from transformers."""
    d, _, _ = rerankers[kind]
    eng = engines[kind]
    prompts, expected = card_scores(d, QUERY, DOCUMENTS)
    assert [eng.rerank_ids(QUERY, doc) for doc in DOCUMENTS] == prompts
    got = eng.rerank(QUERY, DOCUMENTS)
    assert got.dtype == np.float32 and got.shape == (len(DOCUMENTS),)
    np.testing.assert_allclose(got, expected, atol=TOL)


@pytest.mark.parametrize("kind", KINDS)
def test_both_files_rank_alike_in_both_runtimes(rerankers, engines, kind):
    """llama.cpp reranks our file as it reranks its own (labels, scores), and edgeinfer reranks
    llama.cpp's file as its own: the file format is shared both ways."""
    _, ours, theirs = rerankers[kind]
    eng = engines[kind]
    prompts = [eng.rerank_ids(QUERY, doc) for doc in DOCUMENTS]
    want = eng.rerank(QUERY, DOCUMENTS)
    for path in (ours, theirs):
        labels, outputs = llama_rank(path, prompts)
        assert labels == ["yes", "no"]
        np.testing.assert_allclose(outputs[:, 0], want, atol=TOL, err_msg=str(path))
    with edgeinfer.load(theirs, n_ctx=N_CTX, n_threads=N_THREADS) as other:
        assert other.reranks
        np.testing.assert_allclose(other.rerank(QUERY, DOCUMENTS), want, atol=1e-6)


def with_rank_head(src, dst, seed: int = 0):
    """`src` (a GGUF of any family) with a random two-label head and a plain rerank template."""
    from edgeinfer.gguf.types import GGMLType
    from edgeinfer.gguf.writer import GGUFWriter
    from edgeinfer.text.rerank import TEMPLATE_KEY

    f = GGUFFile(src)
    n_embd = next(t.shape[0] for n, t in f.tensors.items() if n == "token_embd.weight")
    head = np.random.default_rng(seed).standard_normal((2, n_embd)).astype(np.float32)
    with GGUFWriter(str(dst)) as w:
        for key in f.keys():
            w.add_kv(key, f.metadata[key], *f.field_type(key))
        w.add_kv(TEMPLATE_KEY, "query: {query}\ndocument: {document}")
        for name, t in f.tensors.items():
            w.add_tensor_info(name, t.shape, t.type)
        w.add_tensor_info("cls.output.weight", (n_embd, 2), GGMLType.F32)
        w.write_header()
        for name, t in f.tensors.items():
            w.write_tensor_data(name, np.frombuffer(t.data, np.uint8))
        w.write_tensor_data("cls.output.weight", head)
    return dst


# a sliding window smaller than the documents (Gemma 3's local ring wraps within one), the two
# hybrid layouts (a recurrent state cannot be rewound), and plain attention
LIST_FAMILIES = ["gemma3", "lfm2", "qwen35", "qwen3"]


@pytest.mark.parametrize("family", LIST_FAMILIES)
def test_a_list_scores_as_each_prompt_alone(tmp_path, family):
    """A prompt goes on from the beginning it shares with the one before (the template and the
    query) where the slot holds it exactly: each score of a list is still its prompt's fed from an
    empty slot, on every kind of layer, with documents longer than a batch."""
    d = tiny_checkpoints.build(family, tmp_path / family)
    plain = tmp_path / "plain.gguf"
    convert_checkpoint(str(d), str(plain), "f32")
    with edgeinfer.load(with_rank_head(plain, tmp_path / "head.gguf"), n_ctx=N_CTX, n_threads=N_THREADS,
                        max_batch=8) as eng:
        assert eng.reranks
        docs = [doc[:90] for doc in DOCUMENTS] + [DOCUMENTS[0][:10]]
        prompts = [eng.rerank_ids(QUERY, doc) for doc in docs]
        shared = len(os.path.commonprefix(prompts))
        assert sum(len(p) > shared + 8 for p in prompts) >= 3     # past the shared part, more than a batch
        alone = [eng.score_prompts([p])[0] for p in prompts]
        np.testing.assert_array_equal(eng.score_prompts(prompts + prompts[:1]), alone + alone[:1])


def test_untied_head_still_generates_as_transformers(rerankers, engines):
    """Unlike llama.cpp's converter, ours keeps an untied LM head: the file still generates text
    (the greedy tokens of the checkpoint's own head)."""
    d, ours, theirs = rerankers["qwen3_reranker_untied"]
    assert "output.weight" in GGUFFile(ours).tensors
    ids = engines["qwen3_reranker_untied"].rerank_ids(QUERY, DOCUMENTS[0])
    model = tf.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    with torch.no_grad():
        want = int(model(torch.tensor([ids])).logits[0, -1].argmax())
    assert int(engines["qwen3_reranker_untied"].logits(ids)[-1].argmax()) == want


def test_rerank_bad_inputs_are_typed_errors(engines, smollm2_path):
    eng = engines["qwen3_reranker"]
    with pytest.raises(RerankError, match="at least one document"):
        eng.rerank(QUERY, [])
    with pytest.raises(ContextOverflowError, match="document 1"):
        eng.rerank(QUERY, ["short", "word " * N_CTX])
    with pytest.raises(TypeError):
        eng.rerank(QUERY, "a text, not a list")
    with edgeinfer.load(smollm2_path, n_ctx=256, n_threads=N_THREADS) as plain:
        assert not plain.reranks and not plain.info()["reranker"]
        with pytest.raises(RerankError, match="not a reranker"):
            plain.rerank(QUERY, DOCUMENTS)


def test_a_head_of_the_wrong_width_is_a_gguf_error(tmp_path):
    from edgeinfer.gguf.types import GGMLType
    from edgeinfer.gguf.writer import GGUFWriter
    from edgeinfer.model.rank_head import RankHead

    path = tmp_path / "bad_head.gguf"
    with GGUFWriter(str(path)) as w:
        w.add_kv("general.architecture", "qwen3")
        w.add_tensor_info("cls.output.weight", (32, 2), GGMLType.F32)
        w.write_header()
        w.write_tensor_data("cls.output.weight", np.zeros((2, 32), np.float32))
    with pytest.raises(GGUFError, match="cls.output.weight"):
        RankHead.from_gguf(GGUFFile(path), "qwen3", 64)


# ---------------------------------------------------------------------------- the /rerank routes

MODEL = "reranker"


@pytest.fixture(scope="module")
def server(engines):
    from edgeinfer.server import ServerThread

    srv = ServerThread(engines["qwen3_reranker"], model_name=MODEL, max_body=64 * 1024).start()
    yield srv
    srv.stop(timeout_s=30)


def ranking(scores: np.ndarray) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: -float(scores[i]))


def test_cohere_clients_get_the_engines_ranking(server, engines):
    """The official Cohere clients: v2 (/v2/rerank, top_n) and v1 (/v1/rerank, documents as
    objects, return_documents) read the documents by falling score, as the engine scores them."""
    cohere = require("cohere", "the official Cohere client is the reference client")
    want = engines["qwen3_reranker"].rerank(QUERY, DOCUMENTS)
    v2 = cohere.ClientV2(api_key="unused", base_url=server.url, max_retries=0, timeout=120)
    got = v2.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, top_n=3)
    assert [r.index for r in got.results] == ranking(want)[:3]
    np.testing.assert_array_equal([r.relevance_score for r in got.results], want[ranking(want)[:3]])
    v1 = cohere.Client(api_key="unused", base_url=server.url, max_retries=0, timeout=120)
    got = v1.rerank(model=MODEL, query=QUERY, documents=[{"text": d} for d in DOCUMENTS], return_documents=True)
    assert [r.index for r in got.results] == ranking(want)
    assert [r.document.text for r in got.results] == [DOCUMENTS[i] for i in ranking(want)]


def test_usage_counts_the_prompts_as_llama_cpp_tokenizes_them(server, rerankers, engines):
    from tests.support.llama_oracle import llama_tokenize
    from edgeinfer.text.rerank import QWEN3_TEMPLATE

    _, _, theirs = rerankers["qwen3_reranker"]
    st, _, out = request(server.url + "/rerank", "POST", {"query": QUERY, "documents": DOCUMENTS[:2]})
    assert st == 200, out
    n = sum(len(llama_tokenize(theirs, QWEN3_TEMPLATE.replace("{query}", QUERY).replace("{document}", d),
                               add_bos=False, special=True)) for d in DOCUMENTS[:2])
    assert out["usage"] == {"prompt_tokens": n, "total_tokens": n} and out["model"] == MODEL


@pytest.mark.parametrize("top_n, expected", [(None, 4), (2, 2), (4, 4), (99, 4)])
@pytest.mark.parametrize("field, score", [("documents", "relevance_score"), ("texts", "score")])
def test_top_n_and_both_reply_forms_as_llama_server(server, engines, top_n, expected, field, score):
    """llama-server's own test cases (tools/server/tests/unit/test_rerank.py): `texts` gives TEI's
    bare list with `score`, `documents` the list object with `relevance_score`, top_n caps both."""
    body = {"query": QUERY, field: DOCUMENTS, **({"top_n": top_n} if top_n else {})}
    st, _, out = request(server.url + "/rerank", "POST", body)
    assert st == 200, out
    results = out if field == "texts" else out["results"]
    want = engines["qwen3_reranker"].rerank(QUERY, DOCUMENTS)
    assert [r["index"] for r in results] == ranking(want)[:expected]
    assert [r[score] for r in results] == [float(want[i]) for i in ranking(want)[:expected]]


def test_return_text_gives_tei_the_texts(server):
    st, _, out = request(server.url + "/v1/rerank", "POST", {"query": QUERY, "texts": DOCUMENTS, "return_text": True})
    assert st == 200 and [r["text"] for r in out] == [DOCUMENTS[r["index"]] for r in out]


@pytest.mark.parametrize("body, param", [
    ({"documents": []}, "documents"),
    ({"documents": None}, "documents"),
    ({"documents": 123}, "documents"),
    ({"documents": [1, 2, 3]}, "documents"),
    ({}, "documents"),
    ({"documents": ["a"], "texts": ["a"]}, "documents"),
    ({"documents": ["word " * N_CTX]}, "documents[0]"),
    ({"documents": ["a"], "top_n": 0}, "top_n"),
    ({"query": 7, "documents": ["a"]}, "query"),
    ({"texts": ["a"], "raw_scores": True}, "raw_scores"),
    ({"texts": ["a", "word " * N_CTX]}, "texts[1]"),
])
def test_bad_requests_are_400_naming_the_field(server, body, param):
    st, _, out = request(server.url + "/rerank", "POST", {"query": QUERY, **body})
    assert st == 400, out
    assert out["error"]["param"].startswith(param), out


def test_a_model_that_is_not_a_reranker_is_a_400(smollm2_path):
    from tests.support.serving import smollm2_server

    with smollm2_server(smollm2_path) as srv:
        st, _, out = request(srv.url + "/v2/rerank", "POST", {"query": QUERY, "documents": DOCUMENTS})
    assert st == 400 and out["error"]["param"] == "model", out
    assert "not a reranker" in out["error"]["message"]


def test_a_backend_without_hidden_states_is_a_501(server, engines, monkeypatch):
    import dataclasses

    runner = engines["qwen3_reranker"].runner
    monkeypatch.setattr(runner, "caps", dataclasses.replace(runner.caps, embeddings=False))
    st, _, out = request(server.url + "/v1/rerank", "POST", {"query": QUERY, "documents": DOCUMENTS})
    assert st == 501 and out["error"]["type"] == "not_supported_error", out


def test_truncate_cuts_a_long_document_to_the_context_as_tei(server, rerankers):
    """TEI's `truncate`: a document whose prompt passes the context is cut to the tokens that fit
    (by the checkpoint's own tokenizer), and scored as the card's recipe scores that cut."""
    d, _, _ = rerankers["qwen3_reranker"]
    tok = tf.AutoTokenizer.from_pretrained(str(d))
    long_doc = DOCUMENTS[3] * 3
    doc_ids = tok.encode(long_doc, add_special_tokens=False)
    (full,), _ = card_scores(d, QUERY, [long_doc])
    cut = tok.decode(doc_ids[:len(doc_ids) - (len(full) - N_CTX)])
    (prompt,), want = card_scores(d, QUERY, [cut])
    assert len(full) > N_CTX >= len(prompt) > N_CTX - 4
    body = {"query": QUERY, "texts": [long_doc, DOCUMENTS[0]]}
    assert request(server.url + "/rerank", "POST", body)[0] == 400
    st, _, out = request(server.url + "/rerank", "POST", {**body, "truncate": True})
    assert st == 200, out
    np.testing.assert_allclose(next(r["score"] for r in out if r["index"] == 0), want[0], atol=TOL)


def test_max_tokens_per_doc_cuts_documents_as_their_tokenizer_does(server, rerankers):
    """Cohere v2's max_tokens_per_doc: the score of the document's first n tokens (cut and decoded
    by the checkpoint's own tokenizer) under the card's recipe."""
    d, _, _ = rerankers["qwen3_reranker"]
    tok = tf.AutoTokenizer.from_pretrained(str(d))
    docs = [DOCUMENTS[3], "Paris"]         # cut, and shorter than the cut
    assert len(tok.encode(docs[1], add_special_tokens=False)) < 9
    _, want = card_scores(d, QUERY, [tok.decode(tok.encode(x, add_special_tokens=False)[:9]) for x in docs])
    st, _, out = request(server.url + "/v2/rerank", "POST", {"query": QUERY, "documents": docs, "max_tokens_per_doc": 9})
    assert st == 200, out
    got = {r["index"]: r["relevance_score"] for r in out["results"]}
    np.testing.assert_allclose([got[0], got[1]], want, atol=TOL)


@pytest.fixture(scope="module")
def rerank_api(server):
    from tests.test_openapi import _config
    return schemathesis.openapi.from_url(server.url + "/openapi.json", config=_config())


schemathesis = require("schemathesis", "schemathesis checks the routes against the OpenAPI document")


@schemathesis.pytest.from_fixture("rerank_api").include(path_regex="rerank").parametrize()
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_answer_matches_the_document(case):
    """schemathesis on the rerank routes of a server whose model is a reranker (the API test's
    server is not one: there the routes answer 400s only): every reply, 200s included, as the
    OpenAPI document says."""
    case.call_and_validate(timeout=120)
