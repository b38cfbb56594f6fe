"""Qwen3.5 (Gated DeltaNet + gated attention hybrid): the converter against llama.cpp's on
the same tiny checkpoints (names, metadata, tensor layouts and values, read with the gguf
package), and the numpy reference against transformers' logits."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from edgeinfer.convert.converter import convert_checkpoint
from edgeinfer.errors import ConversionError
from tests.support.strict import require
from tests.support.tiny_checkpoints import QWEN35_KINDS, build

gguf = require("gguf")

KINDS = tuple(QWEN35_KINDS)
IDS = [5, 77, 301, 12, 9, 250, 33, 140, 7, 64, 200, 18, 99, 3, 260, 41, 120, 8, 77, 301]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen35")
    return {k: build(k, root / k) for k in KINDS}


def _read(path):
    r = gguf.GGUFReader(str(path))
    kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    return kv, {t.name: (tuple(int(x) for x in t.shape), np.array(t.data)) for t in r.tensors}


@pytest.mark.parametrize("kind", KINDS)
def test_converter_writes_what_llama_cpp_writes(tiny, kind, tmp_path):
    from tests.support.llama_cpp_convert import convert

    ours = convert_checkpoint(str(tiny[kind]), str(tmp_path / "ei.gguf"), "f32").path
    theirs = convert(tiny[kind], tmp_path / "lcpp.gguf", "f32", tmp_path, pre="qwen35")
    kv_a, t_a = _read(ours)
    kv_b, t_b = _read(theirs)
    assert sorted(t_a) == sorted(t_b)
    for name, (shape, data) in t_b.items():
        assert t_a[name][0] == shape, name
        # A = -exp(A_log): numpy's and torch's float32 exp may differ in the last place
        np.testing.assert_allclose(t_a[name][1], data, rtol=3e-7, atol=0, err_msg=name)
    arch_keys = [k for k in kv_b if k.startswith("qwen35.")]
    for k in arch_keys + ["general.architecture", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                          "tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id"]:
        a, b = kv_a.get(k), kv_b.get(k)
        if isinstance(b, float):
            assert a == pytest.approx(b, rel=1e-6), k
        else:
            assert a == b, k


def test_without_mtp_the_block_is_left_out(tiny, tmp_path):
    kv, t = _read(convert_checkpoint(str(tiny["qwen35"]), str(tmp_path / "a.gguf"), "f32",
                                     keep_mtp=False).path)
    assert kv["qwen35.block_count"] == 4 and "qwen35.nextn_predict_layers" not in kv
    assert not [n for n in t if n.startswith("blk.4.")]
    assert kv["qwen35.attention.recurrent_layers"] == [True, True, True, False]


def test_multimodal_checkpoint_converts_its_language_model(tiny, tmp_path):
    """Qwen3_5ForConditionalGeneration: text_config, model.language_model.*, a vision tower
    that is left out; the same file as the text-only checkpoint."""
    from safetensors.numpy import load_file, save_file

    src = tiny["qwen35"]
    mm = tmp_path / "mm"
    shutil.copytree(src, mm)
    cfg = json.loads((src / "config.json").read_text())
    mm_cfg = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
              "tie_word_embeddings": cfg["tie_word_embeddings"], "text_config": cfg,
              "vision_config": {"depth": 1}}
    (mm / "config.json").write_text(json.dumps(mm_cfg))
    sd = load_file(str(src / "model.safetensors"))
    renamed = {(k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k): v
               for k, v in sd.items()}
    renamed["model.visual.patch_embed.proj.weight"] = np.ones((4, 3), np.float32)
    save_file(renamed, str(mm / "model.safetensors"))
    _, a = _read(convert_checkpoint(str(src), str(tmp_path / "a.gguf"), "f32").path)
    r = convert_checkpoint(str(mm), str(tmp_path / "b.gguf"), "f32")
    assert r.notes == ["left out the vision tower of Qwen3_5ForConditionalGeneration (1 tensors): "
                       "edgeinfer converts the text model"]
    _, b = _read(r.path)
    assert sorted(a) == sorted(b)
    for n in a:
        np.testing.assert_array_equal(a[n][1], b[n][1], err_msg=n)


def test_unknown_layer_type_is_named(tiny, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny["qwen35"], bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["layer_types"][1] = "sliding_attention"
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="layer_types entry 'sliding_attention'"):
        convert_checkpoint(str(bad), str(tmp_path / "x.gguf"), "f32")


def _hf_logits(model_dir, ids) -> np.ndarray:
    torch = require("torch")
    tf = require("transformers")
    m = tf.Qwen3_5ForCausalLM.from_pretrained(str(model_dir), dtype=torch.float64).eval()
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].numpy()


@pytest.mark.parametrize("kind", KINDS)
def test_reference_matches_transformers(tiny, kind, tmp_path):
    """The float64 reference on our F32 file (and on llama.cpp's: the layouts agree) against
    transformers in float64, whose prefill runs its own chunked delta rule."""
    from tests.support.reference_forward import ReferenceModel

    path = convert_checkpoint(str(tiny[kind]), str(tmp_path / "a.gguf"), "f32").path
    want = _hf_logits(tiny[kind], IDS)
    got = ReferenceModel(path).logits(IDS)
    # the file's float32 weights bound the agreement
    assert np.abs(got - want).max() < 2e-5 * max(1.0, np.abs(want).max())
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_chunked_delta_rule_equals_the_recurrence():
    """The UT-transform chunked form (with state carried across chunks of 5) against the
    token-by-token recurrence, float64, value heads sharing key heads."""
    from edgeinfer.arch.deltanet import chunked_gated_delta_rule, gated_delta_rule, l2norm

    rng = np.random.default_rng(0)
    n, h, d = 23, 3, 8
    q, k = l2norm(rng.normal(size=(n, h, d))), l2norm(rng.normal(size=(n, h, d)))
    v = rng.normal(size=(n, h, d))
    g = -np.abs(rng.normal(size=(n, h)))
    beta = 1 / (1 + np.exp(-rng.normal(size=(n, h))))
    s0 = rng.normal(size=(h, d, d))
    o1, s1 = gated_delta_rule(q, k, v, g, beta, s0)
    o2, s2 = chunked_gated_delta_rule(q, k, v, g, beta, s0, chunk=5)
    np.testing.assert_allclose(o2, o1, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(s2, s1, rtol=1e-10, atol=1e-10)
