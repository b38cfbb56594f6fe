"""SmolLM3 (llama with no RoPE in every fourth layer) from checkpoint to tokens, against
transformers and llama.cpp, on a tiny random-weight checkpoint (tests/support/tiny_checkpoints.py:
8 layers, so layers 3 and 7 skip RoPE; tied head):

* our converter writes what llama.cpp's writes (the gguf package reads both: the same smollm3
  keys, the same tensors byte for byte), and each runtime loads the other's file;
* F32 logits against transformers: at most 1.5x llama.cpp's own difference on the same file
  (the checkpoint's no-RoPE layers move transformers' logits far more than that);
* Q8_0 and Q4_K_M against llama.cpp on the same file: mean KL and top-1;
* 32 greedy tokens identical to llama.cpp's on the model trained to continue a sequence;
* a config.json whose no_rope_layers is not the every-fourth layout is refused by name.
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
from edgeinfer.convert import convert_checkpoint
from edgeinfer.errors import ConversionError
from tests.support import tiny_checkpoints
from tests.support.llama_cpp_convert import convert as llama_cpp_convert
from tests.support.llama_oracle import greedy_differences, kl_divergence, llama_logits

pytestmark = [pytest.mark.oracle]
torch.set_num_threads(1)

N_LAYER = 8


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The checkpoint, our F32 / Q8_0 / Q4_K_M files and llama.cpp's converter's F32 file."""
    root = tmp_path_factory.mktemp("smollm3")
    d = tiny_checkpoints.build("smollm3", root / "ckpt")
    files = {}
    for ft in ("f32", "q8_0", "q4_k_m"):
        files[ft] = root / f"smollm3.{ft}.gguf"
        convert_checkpoint(str(d), str(files[ft]), ft)
    # the tiny tokenizer is the Llama 3 pre-tokenizer's, which llama.cpp's hash table cannot know
    files["lcpp_f32"] = llama_cpp_convert(d, root / "smollm3.lcpp.f32.gguf", "f32", root, pre="llama-bpe")
    return d, files


def _ids(n: int = 80, seed: int = 0) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(3, 300, n)]


def _hf(d, ids, **overrides) -> np.ndarray:
    m = tf.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32, **overrides).eval()
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].float().numpy()


def _ours(path, ids) -> np.ndarray:
    with edgeinfer.load(str(path), n_ctx=256, n_threads=2) as e:
        return e.logits(ids)


def test_converter_writes_what_llama_cpps_converter_writes(tiny):
    """Architecture, every smollm3.* key and every tensor (name, type, shape, bytes) as
    llama.cpp's convert_hf_to_gguf.py writes them, read back with the gguf package."""
    _, files = tiny
    ours, theirs = gguf.GGUFReader(str(files["f32"])), gguf.GGUFReader(str(files["lcpp_f32"]))

    def arch_keys(r):
        return {k: f.contents() for k, f in r.fields.items()
                if k.startswith("smollm3.") or k == "general.architecture"}

    assert arch_keys(ours)["general.architecture"] == "smollm3"
    assert arch_keys(ours) == arch_keys(theirs)
    mine = {t.name: t for t in ours.tensors}
    assert sorted(mine) == sorted(t.name for t in theirs.tensors)
    assert "output.weight" not in mine                 # tied head
    for t in theirs.tensors:
        m = mine[t.name]
        assert (m.tensor_type, list(m.shape)) == (t.tensor_type, list(t.shape)), t.name
        assert np.array_equal(np.asarray(m.data), np.asarray(t.data)), t.name   # Q/K permuted alike


def test_f32_logits_vs_transformers_as_close_as_llama_cpp(tiny):
    d, files = tiny
    ids = _ids()
    ref = _hf(d, ids)
    ours = float(np.abs(_ours(files["f32"], ids) - ref).max())
    theirs = float(np.abs(llama_logits(files["f32"], ids) - ref).max())
    rotated_everywhere = float(np.abs(_hf(d, ids, no_rope_layers=[1] * N_LAYER) - ref).max())
    print(f"\nsmollm3 F32: max |edgeinfer - hf| {ours:.2e}, |llama.cpp - hf| {theirs:.2e}; "
          f"RoPE in every layer moves hf by {rotated_everywhere:.2e}")
    assert rotated_everywhere > 10 * max(ours, theirs)    # the no-RoPE layers matter here
    assert ours <= 1.5 * theirs, (ours, theirs)
    if theirs <= 1e-3:
        assert ours <= 1e-3, ours


def test_llama_cpp_converter_output_gives_llama_cpps_logits(tiny):
    _, files = tiny
    ids = _ids()
    err = float(np.abs(_ours(files["lcpp_f32"], ids) - llama_logits(files["lcpp_f32"], ids)).max())
    print(f"\nsmollm3 llama.cpp's F32 file: max |edgeinfer - llama.cpp| {err:.2e}")
    assert err <= 1e-3, err


@pytest.mark.parametrize("ft", ["q8_0", "q4_k_m"])
def test_quantized_kl_and_top1_vs_llama_cpp(tiny, ft):
    """Mean KL(llama.cpp || edgeinfer) <= 0.01 and top-1 >= 90 % on the same file (the tiny
    rows of 64 / 160 send Q4_K_M's K-quants to their fallbacks, as in llama.cpp)."""
    _, files = tiny
    ids = _ids()
    ours, theirs = _ours(files[ft], ids), llama_logits(files[ft], ids)
    kl = float(kl_divergence(theirs, ours).mean())
    top1 = float(np.mean(theirs.argmax(-1) == ours.argmax(-1)))
    print(f"\nsmollm3 {ft}: mean KL(llama.cpp || edgeinfer) {kl:.2e}, top-1 {top1:.3f}")
    assert kl <= 0.01 and top1 >= 0.9, (kl, top1)


def test_greedy_32_tokens_identical_to_llama_cpp(tmp_path):
    """32 greedy tokens on the Q8_0 file from five pieces of the sequence the tiny model was
    trained on (tiny_checkpoints.memorize: a trained model's peaked logits leave no near ties)."""
    d = tiny_checkpoints.build("smollm3", tmp_path / "ckpt")
    seq = tiny_checkpoints.memorize(d)
    path = tmp_path / "smollm3.q8_0.gguf"
    convert_checkpoint(str(d), str(path), "q8_0")
    with edgeinfer.load(str(path), n_ctx=1024, n_threads=2) as e:
        diffs = greedy_differences(
            path, seq, lambda p, n: e.generate(p, max_tokens=n, temperature=0.0, ignore_eos=True).tokens)
    assert not diffs, diffs


@pytest.mark.parametrize("change", [
    lambda c: c.update(no_rope_layers=[1, 1, 0, 1, 1, 1, 0, 1]),        # another step
    lambda c: c.update(no_rope_layers=[1] * N_LAYER),                     # RoPE everywhere
    lambda c: (c.pop("no_rope_layers"), c.update(no_rope_layer_interval=3)),
], ids=["step_3", "all_rope", "interval_3"])
def test_other_no_rope_layouts_are_conversion_errors(tiny, tmp_path, change):
    """llama.cpp hard-codes the step of 4 (no GGUF key), so nothing else can be written."""
    d = tmp_path / "bad"
    shutil.copytree(tiny[0], d)
    cfg = json.loads((d / "config.json").read_text())
    change(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "bad.gguf"
    with pytest.raises(ConversionError, match="no_rope_layers"):
        convert_checkpoint(str(d), str(out), "q8_0")
    assert not out.exists()
