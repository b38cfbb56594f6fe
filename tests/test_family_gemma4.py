"""Gemma 4 from checkpoint to logits, against transformers and llama.cpp, on a tiny random-weight
checkpoint (tests/support/tiny_gemma4.py: sliding and full layers with two head sizes, per-layer
inputs, the last two layers sharing KV, double-wide MLP there, layer scales):

* our converter writes what llama.cpp's writes (the gguf package reads both: the same gemma4
  keys and tokenizer, the same tensors byte for byte);
* the numpy reference forward (edgeinfer/arch/gemma4.py) on our file matches transformers far
  closer than llama.cpp does on the same file, over a prompt longer than the sliding window;
* layouts the GGUF cannot express are refused by name.

The native runtimes do not run gemma4 yet: loading a file is a typed refusal.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.support.strict import require

torch = require("torch", "tiny checkpoints are built with torch")
tf = require("transformers", "tiny checkpoints are built with transformers")
require("tokenizers")
require("llama_cpp")
gguf = require("gguf", "the gguf package is a test dependency")

import edgeinfer
from edgeinfer.arch.gemma4 import Gemma4Params, Gemma4Reference
from edgeinfer.convert import convert_checkpoint
from edgeinfer.errors import ConversionError, UnsupportedArchitectureError
from tests.support import tiny_gemma4
from tests.support.llama_cpp_convert import convert as llama_cpp_convert
from tests.support.llama_oracle import llama_logits

pytestmark = [pytest.mark.oracle]
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4")
    d = tiny_gemma4.build(root / "ckpt")
    files = {"f32": root / "gemma4.f32.gguf"}
    convert_checkpoint(str(d), str(files["f32"]), "f32")
    files["lcpp_f32"] = llama_cpp_convert(d, root / "gemma4.lcpp.f32.gguf", "f32", root)
    return d, files


def _ids(n: int = 48, seed: int = 0) -> list[int]:
    """Longer than the sliding window (16)."""
    return [int(i) for i in np.random.default_rng(seed).integers(5, 400, n)]


def _reference(path, ids) -> np.ndarray:
    r = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.")}
    w = {t.name: np.asarray(t.data).reshape([int(s) for s in reversed(t.shape)]) for t in r.tensors}
    return Gemma4Reference(Gemma4Params.from_metadata(meta), w).logits(ids)


def test_converter_writes_what_llama_cpps_converter_writes(tiny):
    _, files = tiny
    ours, theirs = gguf.GGUFReader(str(files["f32"])), gguf.GGUFReader(str(files["lcpp_f32"]))

    def keys(r):
        return {k: f.contents() for k, f in r.fields.items()
                if k.startswith(("gemma4.", "tokenizer.ggml.")) or k == "general.architecture"}

    assert keys(ours)["general.architecture"] == "gemma4"
    assert keys(ours) == keys(theirs)
    mine = {t.name: t for t in ours.tensors}
    assert sorted(mine) == sorted(t.name for t in theirs.tensors)
    assert "blk.4.attn_k.weight" not in mine and "blk.3.attn_k.weight" in mine   # KV-shared layers
    for t in theirs.tensors:
        m = mine[t.name]
        assert (m.tensor_type, list(m.shape)) == (t.tensor_type, list(t.shape)), t.name
        assert np.array_equal(np.asarray(m.data), np.asarray(t.data)), t.name


def test_reference_vs_transformers_closer_than_llama_cpp(tiny):
    d, files = tiny
    ids = _ids()
    hf = tf.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float64).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()
    ours = float(np.abs(_reference(files["f32"], ids) - ref).max())
    theirs = float(np.abs(llama_logits(files["f32"], ids) - ref).max())
    print(f"\ngemma4 F32: max |reference - hf| {ours:.2e}, |llama.cpp - hf| {theirs:.2e}")
    assert ours <= 1e-4 and ours <= theirs, (ours, theirs)


def test_native_load_is_a_typed_refusal(tiny):
    _, files = tiny
    with pytest.raises(UnsupportedArchitectureError, match="gemma4"):
        edgeinfer.load(str(files["f32"]), n_ctx=64)


@pytest.mark.parametrize("change, what", [
    (lambda c: c.update(attention_k_eq_v=True), "attention_k_eq_v"),
    (lambda c: c.update(global_head_dim=32, per_layer_config={},   # the last layer that stores KV slides
                        layer_types=["sliding_attention"] * 2 + ["full_attention", "sliding_attention"] * 2),
     "shares the KV"),
    (lambda c: c.update(vocab_size_per_layer_input=100), "vocab_size_per_layer_input"),
], ids=["k_eq_v", "kv_source", "ple_vocab"])
def test_layouts_the_gguf_cannot_express_are_refused(tiny, tmp_path, change, what):
    d = tmp_path / "bad"
    shutil.copytree(tiny[0], d)
    cfg = json.loads((d / "config.json").read_text())
    change(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "bad.gguf"
    with pytest.raises(ConversionError, match=what):
        convert_checkpoint(str(d), str(out), "f32")
    assert not out.exists()
