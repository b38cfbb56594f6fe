"""Gemma 4 from checkpoint to logits, against transformers and llama.cpp, on a tiny random-weight
checkpoint (tests/support/tiny_gemma4.py: sliding and full layers with two head sizes, per-layer
inputs, the last two layers sharing KV, double-wide MLP there, layer scales):

* our converter writes what llama.cpp's writes (the gguf package reads both: the same gemma4
  keys and tokenizer, the same tensors byte for byte);
* the numpy reference forward (edgeinfer/arch/gemma4.py) on our file matches transformers far
  closer than llama.cpp does on the same file, over a prompt longer than the sliding window;
* layouts the GGUF cannot express are refused by name;
* the CPU runtime: F32 logits against transformers no worse than llama.cpp's on the same file, and
  the reference's (K and V rounded to f16 as the arena holds them) past the window, in one prefill,
  in chunks across the window's edge through the sliding layers' own ring, and token by token;
  Q8_0 and Q4_K_M against llama.cpp (KL; top-1 and 32 greedy tokens on the trained model); the KV
  arena holds the layers that store KV only, as `plan` predicts.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import replace

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
from edgeinfer.arch.reference import reference_for
from edgeinfer.convert import convert_checkpoint
from edgeinfer.errors import ConversionError
from tests.support import tiny_gemma4
from tests.support.llama_cpp_convert import convert as llama_cpp_convert
from tests.support.llama_oracle import (
    Q8_0_TIE_GAP, greedy_differences, kl_divergence, llama_logits, top1_agreement, top1_errors)
from tests.support.tiny_checkpoints import memorize

pytestmark = [pytest.mark.oracle]
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4")
    d = tiny_gemma4.build(root / "ckpt")
    files = {}
    for ft in ("f32", "q8_0", "q4_k_m"):
        files[ft] = root / f"gemma4.{ft}.gguf"
        convert_checkpoint(str(d), str(files[ft]), ft)
    files["lcpp_f32"] = llama_cpp_convert(d, root / "gemma4.lcpp.f32.gguf", "f32", root)
    return d, files


def _ids(n: int = 48, seed: int = 0) -> list[int]:
    """Longer than the sliding window (16)."""
    return [int(i) for i in np.random.default_rng(seed).integers(5, 400, n)]


def _reference(path, ids, kv_dtype=None, **change) -> np.ndarray:
    r = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.")}
    w = {t.name: np.asarray(t.data).reshape([int(s) for s in reversed(t.shape)]) for t in r.tensors}
    if not change:   # the one entry point the tests' oracles and the converter use
        return reference_for(meta, w, kv_dtype=kv_dtype).logits(ids)
    return Gemma4Reference(replace(Gemma4Params.from_metadata(meta), **change), w, kv_dtype=kv_dtype).logits(ids)


def _ours(path, ids, **kw) -> np.ndarray:
    with edgeinfer.load(str(path), **{"n_ctx": 128, "n_threads": 2, **kw}) as e:
        return np.asarray(e.logits(ids))


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


def test_f32_logits_vs_transformers_as_close_as_llama_cpp(tiny):
    d, files = tiny
    ids = _ids()
    hf = tf.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float64).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()
    ours = float(np.abs(_ours(files["f32"], ids) - ref).max())
    theirs = float(np.abs(llama_logits(files["f32"], ids) - ref).max())
    print(f"\ngemma4 F32 (f16 KV): max |edgeinfer - hf| {ours:.2e}, |llama.cpp - hf| {theirs:.2e}")
    assert ours <= theirs, (ours, theirs)


def test_runtime_is_the_reference_past_the_window_in_any_batching(tiny):
    """The reference with K and V rounded to f16 (as the arena stores them) is what the runtime
    computes: two head sizes, proportional RoPE, KV-shared layers reading layers 2 and 3,
    per-layer inputs, in one prefill, in chunks across the window's edge (the sliding layers'
    own ring of 16 + 7 - 1 cells) and token by token (a ring of 16). Without the window the
    reference differs far more, so the window is what the runtime did."""
    _, files = tiny
    ids = _ids()
    ref = _reference(files["f32"], ids, kv_dtype=np.float16)
    unwindowed = float(np.abs(_reference(files["f32"], ids, kv_dtype=np.float16, swa_window=1 << 20) - ref)[20:].max())
    for max_batch in (256, 7, 1):
        with edgeinfer.load(str(files["f32"]), n_ctx=128, n_threads=2, max_batch=max_batch) as e:
            assert e.info()["local_kv_cells"] == (0 if max_batch == 256 else 16 + max_batch - 1)
            err = float(np.abs(np.asarray(e.logits(ids)) - ref).max())
        print(f"\ngemma4 batches of {max_batch}: max |edgeinfer - reference (f16 KV)| {err:.2e}; "
              f"without the window {unwindowed:.2e}")
        assert err <= 1e-2 and err * 20 <= unwindowed, (max_batch, err, unwindowed)


@pytest.mark.parametrize("ft", ["q8_0", "q4_k_m"])
def test_quantized_kl_vs_llama_cpp(tiny, ft):
    """Mean KL(llama.cpp || edgeinfer) on the same file. (Top-1 on random weights is rounding's:
    both runtimes are as far from the exact float64 logits of the dequantized weights, ~1.0, as
    from each other; the trained model below judges it.)"""
    _, files = tiny
    ids = _ids()
    ours, theirs = _ours(files[ft], ids), llama_logits(files[ft], ids)
    kl = float(kl_divergence(theirs, ours).mean())
    print(f"\ngemma4 {ft}: mean KL(llama.cpp || edgeinfer) {kl:.2e}")
    assert kl <= 0.01, kl


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The tiny model trained to continue a sequence (tiny_checkpoints.memorize), as Q8_0 and Q4_K_M."""
    root = tmp_path_factory.mktemp("gemma4_trained")
    d = tiny_gemma4.build(root / "ckpt")
    seq = memorize(d)
    files = {}
    for ft in ("q8_0", "q4_k_m"):
        files[ft] = root / f"gemma4.{ft}.gguf"
        convert_checkpoint(str(d), str(files[ft]), ft)
    return files, seq


@pytest.mark.parametrize("ft", ["q8_0", "q4_k_m"])
def test_quantized_top1_vs_llama_cpp_on_the_trained_model(trained, ft):
    files, seq = trained
    ours, theirs = _ours(files[ft], seq, n_ctx=512), llama_logits(files[ft], seq)
    top1, wrong = top1_agreement(theirs, ours), top1_errors(theirs, ours, tie_gap=Q8_0_TIE_GAP)
    print(f"\ngemma4 trained {ft}: top-1 {top1:.4f}, beyond ties wrong at {wrong}")
    assert not wrong and top1 >= 0.99, (top1, wrong)


def test_greedy_32_tokens_identical_to_llama_cpp(trained):
    files, seq = trained
    with edgeinfer.load(str(files["q8_0"]), n_ctx=512, n_threads=2) as e:
        diffs = greedy_differences(
            files["q8_0"], seq, lambda p, n: e.generate(p, max_tokens=n, temperature=0.0, ignore_eos=True).tokens)
    assert not diffs, diffs


def test_kv_arena_holds_only_the_layers_that_store_kv(tiny):
    """Layers 4 and 5 read layers 2 and 3's KV and store none: the arena is the four storing
    layers' (three sliding of head size 16 in their own ring, one full of 32), as `plan` says."""
    from edgeinfer.tools import plan as P
    _, files = tiny
    m = P.model_shape(files["f32"])
    n_ctx, max_batch, kv_heads, f16 = 4096, 64, 2, 2
    ring = 16 + max_batch - 1
    want = 2 * kv_heads * f16 * (3 * 16 * ring + 32 * n_ctx)
    unshared = want + 2 * kv_heads * f16 * (16 * ring + 32 * n_ctx)   # layers 4 and 5 with their own
    with edgeinfer.load(str(files["f32"]), n_ctx=n_ctx, n_threads=1, max_batch=max_batch) as e:
        got = e.info()["kv_bytes"]
    print(f"\ngemma4 tiny at {n_ctx}: KV arena {got} bytes, {unshared} without KV sharing")
    assert got == want == P.plan_one(m, n_ctx, 1, max_batch=max_batch).kv_bytes


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


def test_auto_quantization_is_refused_by_name(tiny, tmp_path):
    """--type auto's sensitivity backward walks the table-driven reference's layers, which
    Gemma 4's are not: a typed refusal, no file."""
    out = tmp_path / "auto.gguf"
    with pytest.raises(ConversionError, match="cannot price gemma4"):
        convert_checkpoint(str(tiny[0]), str(out), "auto", target_bpw=5.0)
    assert not out.exists()


def _conditional_generation(text_dir, out):
    """The tiny text model inside a Gemma4ForConditionalGeneration (what most Gemma 4 fine-tunes
    are saved as: model.language_model.*) with small random vision and audio towers."""
    causal = tf.Gemma4ForCausalLM.from_pretrained(str(text_dir), dtype=torch.float32)
    cfg = tf.Gemma4Config(
        text_config=causal.config.to_dict(), tie_word_embeddings=True,
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=2, head_dim=16, patch_size=4, position_embedding_size=64),
        audio_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                          subsampling_conv_channels=[8, 4], output_proj_dims=32))
    torch.manual_seed(1)
    mm = tf.Gemma4ForConditionalGeneration(cfg)
    mm.model.language_model.load_state_dict(causal.model.state_dict(), strict=True)
    mm.save_pretrained(out, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(text_dir / f, out / f)
    return out


def test_conditional_generation_checkpoint_converts_its_text_model(tiny, tmp_path):
    """The towers are left out with a note; the file is the text model's (every key but the name,
    every tensor byte for byte), and its logits are transformers' for the multimodal class."""
    d, files = tiny
    mm = _conditional_generation(d, tmp_path / "mm")
    r = convert_checkpoint(str(mm), str(tmp_path / "mm.gguf"), "f32")
    assert [n.split(" (")[0] for n in r.notes] == [
        "left out the audio tower of Gemma4ForConditionalGeneration",
        "left out the vision tower of Gemma4ForConditionalGeneration"], r.notes
    a, b = gguf.GGUFReader(str(files["f32"])), gguf.GGUFReader(r.path)
    assert ({k: f.contents() for k, f in a.fields.items() if k != "general.name"}
            == {k: f.contents() for k, f in b.fields.items() if k != "general.name"})
    theirs = {t.name: t for t in b.tensors}
    assert sorted(theirs) == sorted(t.name for t in a.tensors)
    for t in a.tensors:
        assert np.array_equal(np.asarray(t.data), np.asarray(theirs[t.name].data)), t.name
    ids = _ids()
    hf = tf.Gemma4ForConditionalGeneration.from_pretrained(str(mm), dtype=torch.float64).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()
    ours = float(np.abs(_ours(r.path, ids) - ref).max())
    assert ours <= float(np.abs(llama_logits(files["f32"], ids) - ref).max()), ours
