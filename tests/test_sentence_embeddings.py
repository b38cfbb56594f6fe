"""Embedding models from sentence-transformers checkpoints (Qwen3-Embedding's layout: the bare
model without its LM head, last-token pooling, an appended <|endoftext|>, unit length) converted
and run as their users run them: against sentence-transformers itself, llama.cpp's converter and
llama.cpp's embeddings on both converters' files. Tiny random-weight checkpoints, with a tied
embedding table (as the 0.6B) and an untied config without a head (as the 8B)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support.strict import require

torch = require("torch", "tiny checkpoints are built with torch")
require("transformers", "tiny checkpoints are built with transformers")
st = require("sentence_transformers", "sentence-transformers is how the checkpoint's users embed")
llama_cpp = require("llama_cpp", "llama.cpp's embeddings are the oracle")

from tests.support import tiny_checkpoints  # noqa: E402
from tests.support.llama_cpp_convert import both_converters  # noqa: E402
from tests.support.llama_oracle import N_THREADS  # noqa: E402
from tests.support.texts import PROMPTS, TEXTS  # noqa: E402

import edgeinfer  # noqa: E402
from edgeinfer.gguf import GGUFFile  # noqa: E402

pytestmark = [pytest.mark.oracle]
torch.set_num_threads(1)

KINDS = ["qwen3_embedding", "qwen3_embedding_untied"]
N_CTX = 512
TEXTS_IN = [TEXTS["story"][:400], *PROMPTS[:3], "Hi"]
# f32 weights, f16 KV cells: the least cosine of our vectors to sentence-transformers' float32 ones
MIN_COSINE = 0.99999


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{kind: (checkpoint, our f32 file, llama.cpp's f32 file, our engine)}."""
    root = tmp_path_factory.mktemp("sentence")
    out = {}
    for kind in KINDS:
        d, r, ours, theirs = both_converters(kind, root)
        out[kind] = (d, ours, theirs, edgeinfer.load(ours, n_ctx=N_CTX, n_threads=N_THREADS), r)
    yield out
    for v in out.values():
        v[3].close()


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("kind", KINDS)
def test_the_file_carries_the_pooling_and_tensors_llama_cpps_converter_writes(models, kind):
    """Last-token pooling from modules.json, the appended end-of-text token (the EOS, added; the BOS not), the bare model's tensors
    under their GGUF names and no output head: what llama.cpp's converter writes."""
    _, ours, theirs, _, result = models[kind]
    a, b = GGUFFile(ours), GGUFFile(theirs)
    for key in ("qwen3.pooling_type", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.eos_token_id",
                "tokenizer.ggml.eot_token_id", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.padding_token_id"):
        assert key in a.metadata and a.metadata[key] == b.metadata[key], key
    assert a.metadata["tokenizer.ggml.add_eos_token"] and not a.metadata["tokenizer.ggml.add_bos_token"]
    assert b.metadata.get("tokenizer.ggml.add_bos_token", False) is False
    assert a.metadata["qwen3.pooling_type"] == llama_cpp.LLAMA_POOLING_TYPE_LAST
    assert sorted(a.tensors) == sorted(b.tensors) and "output.weight" not in a.tensors
    np.testing.assert_array_equal(np.frombuffer(a.tensors["token_embd.weight"].data, np.float32),
                                  np.frombuffer(b.tensors["token_embd.weight"].data, np.float32))
    assert any("no LM head" in n for n in result.notes) == (kind == "qwen3_embedding_untied")


@pytest.mark.parametrize("kind", KINDS)
def test_embeddings_are_sentence_transformers(models, kind):
    """Engine.embed with the file's pooling gives SentenceTransformer.encode's vectors, a query with
    the card's prompt as well (the prompt is the app's to prepend, as in llama.cpp)."""
    d, _, _, eng, _ = models[kind]
    model = st.SentenceTransformer(str(d), device="cpu")
    want = model.encode(TEXTS_IN, convert_to_numpy=True)
    got = eng.embed(TEXTS_IN)
    assert cosines(got, want).min() >= MIN_COSINE
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)
    query = model.encode(["What is a lighthouse?"], prompt_name="query", convert_to_numpy=True)
    ours = eng.embed([tiny_checkpoints.EMBEDDING_QUERY_PROMPT + "What is a lighthouse?"])
    assert cosines(ours, query).min() >= MIN_COSINE


@pytest.mark.parametrize("kind", KINDS)
def test_llama_cpp_embeds_both_files_as_we_do(models, kind):
    _, ours, theirs, eng, _ = models[kind]
    want = eng.embed(TEXTS_IN)
    for path in (ours, theirs):
        llm = llama_cpp.Llama(model_path=str(path), embedding=True, n_ctx=N_CTX, n_batch=N_CTX,
                              n_threads=N_THREADS, n_threads_batch=N_THREADS, verbose=False)
        try:
            got = np.array(llm.embed(TEXTS_IN, normalize=True, truncate=False))
        finally:
            llm.close()
        assert cosines(got, want).min() >= MIN_COSINE, path
    with edgeinfer.load(theirs, n_ctx=N_CTX, n_threads=N_THREADS) as other:
        np.testing.assert_allclose(other.embed(TEXTS_IN), want, atol=1e-6)


def llama_cpp_pooling(folder) -> int | str:
    """llama.cpp's converter's own reading of a folder's sentence-transformers pooling (its
    TextModel._try_set_pooling_type): the type it writes, "none", or "error"."""
    import subprocess
    import sys

    from tests.support.llama_cpp_convert import converter_dir

    d = converter_dir(folder.parent)
    code = (f"import sys, pathlib; sys.path[:0] = [{str(d)!r}, {str(d / 'gguf-py')!r}]\n"
            "from conversion.base import TextModel\n"
            "class W:\n    def add_pooling_type(self, t): print(int(t))\n"
            "class M:\n    gguf_writer = W(); hparams = {}\n"
            f"    dir_model = pathlib.Path({str(folder)!r})\n"
            "try:\n    TextModel._try_set_pooling_type(M())\nexcept NotImplementedError:\n    print('error')\n"
            "print('none')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    first = out.stdout.split()[0]
    return first if first in ("none", "error") else int(first)


@pytest.mark.parametrize("pooling", [
    {"pooling_mode_mean_tokens": True}, {"pooling_mode_cls_token": True}, {"pooling_mode_lasttoken": True},
    {"pooling_mode_mean_tokens": True, "pooling_mode_lasttoken": True}, {"pooling_mode": "cls"},
    {"pooling_mode": "lasttoken"}, {"pooling_mode_max_tokens": True}, None])
def test_the_pooling_read_is_llama_cpps(tmp_path, pooling):
    """Each form of the Pooling module's config gives the type llama.cpp's converter writes, or
    an error where it has none (None: no modules.json, no key)."""
    from edgeinfer.convert.pooling import sentence_pooling
    from edgeinfer.errors import ConversionError

    folder = tmp_path / "st"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    if pooling is not None:
        (folder / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    want = llama_cpp_pooling(folder)
    try:
        got = sentence_pooling(str(folder))
    except ConversionError:
        got = "error"
    assert (got if got is not None else "none") == want


def test_a_projecting_dense_module_and_a_doubled_tensor_are_conversion_errors(models, tmp_path):
    """What a file cannot carry is refused by name: a Dense projection after the pooling, and a
    folder holding a tensor twice (the bare model's `norm.weight` beside `model.norm.weight`)."""
    import shutil

    from safetensors.numpy import save_file

    from edgeinfer.convert import convert_checkpoint
    from edgeinfer.errors import ConversionError

    src = models["qwen3_embedding"][0]
    dense = shutil.copytree(src, tmp_path / "dense")
    modules = json.loads((dense / "modules.json").read_text())
    (dense / "modules.json").write_text(json.dumps(modules + [
        {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(ConversionError, match="Dense"):
        convert_checkpoint(str(dense), str(tmp_path / "dense.gguf"), "f32")
    doubled = shutil.copytree(src, tmp_path / "doubled")
    save_file({"model.norm.weight": np.ones(64, np.float32)}, str(doubled / "zz-extra.safetensors"))
    with pytest.raises(ConversionError, match="model.norm.weight"):
        convert_checkpoint(str(doubled), str(tmp_path / "doubled.gguf"), "f32")
