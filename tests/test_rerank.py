"""Reranking (Engine.rerank, the /rerank routes) of Qwen3-Reranker checkpoints, against the model
card's own transformers recipe, llama.cpp's converter and llama.cpp's rank pooling on the same
files, and the official Cohere client.

Tiny random-weight Qwen3 checkpoints titled "Qwen3-Reranker" (how converters know one), with a
tied head (as the 0.6B) and an untied one (as the 4B and 8B)."""
from __future__ import annotations

import numpy as np
import pytest

from tests.support.strict import require

torch = require("torch", "tiny checkpoints are built with torch")
tf = require("transformers", "the model card's transformers recipe is the oracle")
require("tokenizers")
llama_cpp = require("llama_cpp", "llama.cpp's rank pooling is the oracle")
require("gguf", "the gguf package is a test dependency")

from tests.support import tiny_checkpoints  # noqa: E402
from tests.support.llama_cpp_convert import convert as llama_convert  # noqa: E402
from tests.support.llama_oracle import N_THREADS  # noqa: E402

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
        d = tiny_checkpoints.build(kind, root / kind)
        ours = root / f"{kind}.ours.gguf"
        convert_checkpoint(str(d), str(ours), "f32")
        theirs = llama_convert(d, root / f"{kind}.llamacpp.gguf", "f32", root, pre="qwen2")
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
    for key in ("qwen3.pooling_type", "qwen3.classifier.output_labels", "tokenizer.chat_template.rerank"):
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
