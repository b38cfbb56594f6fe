"""The architecture table: a new family made of existing ops needs only its table entry.

`llamalike` is llama under another name. Registered in the table (and nowhere else), a llama
GGUF rewritten with general.architecture = llamalike and its keys renamed loads and gives
exactly the llama file's logits, and the converter turns a checkpoint whose `architectures`
names the fake class into such a file. Unregistered, both are refused with the name."""
from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest


import edgeinfer  # noqa: E402
from tests.support.strict import require  # noqa: E402
from edgeinfer._native import ffi, lib  # noqa: E402
from edgeinfer.arch import ARCHS  # noqa: E402
from edgeinfer.errors import UnsupportedArchitectureError  # noqa: E402
from edgeinfer.gguf import GGUFFile  # noqa: E402
from edgeinfer.gguf.writer import GGUFWriter  # noqa: E402

FAKE, FAKE_CLASS = "llamalike", "LlamalikeForCausalLM"
IDS = [0, 5, 17, 42, 99, 3, 250, 7, 64, 128, 11]


@pytest.fixture
def llamalike(monkeypatch):
    """Registers the fake family for one test: the table entry is all it takes."""
    monkeypatch.setitem(ARCHS, FAKE, dataclasses.replace(ARCHS["llama"], name=FAKE,
                                                         hf_classes={FAKE_CLASS: FAKE}))


@pytest.fixture(scope="module")
def llama_ckpt(tmp_path_factory):
    require("torch", "tiny checkpoints are built with torch")
    require("transformers", "tiny checkpoints are built with transformers")
    require("tokenizers")
    from tests.support import tiny_checkpoints

    return tiny_checkpoints.build("llama", tmp_path_factory.mktemp("ckpt") / "llama")


@pytest.fixture(scope="module")
def llama_gguf(llama_ckpt, tmp_path_factory):
    from edgeinfer.convert import convert_checkpoint

    out = tmp_path_factory.mktemp("gguf") / "llama.q8_0.gguf"
    convert_checkpoint(str(llama_ckpt), str(out), "q8_0")
    return out


def rename_arch(src, dst, new: str) -> None:
    """Copies a GGUF file with general.architecture = new and its `{arch}.` keys renamed."""
    with GGUFFile(src) as f, GGUFWriter(dst) as w:
        old = f.get("general.architecture")
        for key in f.keys():
            vtype, etype = f.field_type(key)
            value = new if key == "general.architecture" else f.get(key)
            if key.startswith(old + "."):
                key = new + key[len(old):]
            w.add_kv(key, value, vtype, etype)
        for name, t in f.tensors.items():
            w.add_tensor_info(name, t.shape, t.type)
        w.write_header()
        for name, t in f.tensors.items():
            w.write_tensor_data(name, t.data)


def logits(path) -> np.ndarray:
    with edgeinfer.load(str(path), n_ctx=64, n_threads=1) as e:
        return e.logits(IDS)


def test_renamed_llama_gguf_loads_from_the_table_entry_alone(llama_gguf, tmp_path, llamalike):
    fake = tmp_path / "llamalike.gguf"
    rename_arch(llama_gguf, fake, FAKE)
    with GGUFFile(fake) as f:
        assert f.get("general.architecture") == FAKE
        assert f.get(f"{FAKE}.block_count") == 2
        assert not [k for k in f.keys() if k.startswith("llama.")]
    with edgeinfer.load(str(fake), n_ctx=64, n_threads=1) as e:
        assert e.config.arch == FAKE
    assert np.array_equal(logits(fake), logits(llama_gguf))


def test_converter_maps_the_fake_hf_class(llama_ckpt, llama_gguf, tmp_path, llamalike):
    from edgeinfer.convert import convert_checkpoint

    src = tmp_path / "ckpt"
    shutil.copytree(llama_ckpt, src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["architectures"], cfg["model_type"] = [FAKE_CLASS], FAKE
    (src / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "llamalike.q8_0.gguf"
    convert_checkpoint(str(src), str(out), "q8_0")
    with GGUFFile(out) as f, GGUFFile(llama_gguf) as ref:
        assert f.get("general.architecture") == FAKE
        assert {k.replace(FAKE + ".", "llama.", 1) for k in f.keys()} == set(ref.keys())
        assert list(f.tensors) == list(ref.tensors)
    assert np.array_equal(logits(out), logits(llama_gguf))


def test_unknown_architecture_is_named(llama_ckpt, llama_gguf, tmp_path):
    from edgeinfer.convert import convert_checkpoint

    fake = tmp_path / "llamalike.gguf"
    rename_arch(llama_gguf, fake, FAKE)
    with pytest.raises(UnsupportedArchitectureError, match=f"unsupported architecture '{FAKE}'"):
        edgeinfer.load(str(fake), n_ctx=64)
    src = tmp_path / "ckpt"
    shutil.copytree(llama_ckpt, src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["architectures"] = [FAKE_CLASS]
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitectureError, match=FAKE_CLASS):
        convert_checkpoint(str(src), str(tmp_path / "out.gguf"), "q8_0")


def test_an_entry_needing_a_missing_op_is_refused():
    with pytest.raises(ValueError, match="'layer' has no native kernel"):
        dataclasses.replace(ARCHS["llama"], name="bert", norm="layer")
    with pytest.raises(ValueError, match="unknown flag 'has_alibi'"):
        dataclasses.replace(ARCHS["llama"], name="x", tensors=(
            dataclasses.replace(ARCHS["llama"].tensor("attn_q"), when="has_alibi"),))


def test_every_role_has_its_c_enum():
    ids = {}
    for arch in ARCHS.values():
        if not arch.native:          # converted and referenced only: C does not see it yet
            continue
        for t in arch.tensors:
            if "mtp" in t.kinds:     # the MTP head is kept in the file, not run: no C role
                continue
            for r in t.c_roles:      # fused tensors feed their parts' roles
                ids[r] = getattr(lib, "EI_T_" + r.upper())
    assert len(set(ids.values())) == len(ids)


def _c_model(has_qkv_bias: int):
    c = ffi.new("ei_model_config *")
    c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim = 1, 8, 2, 1, 4
    c.n_ff, c.n_vocab, c.rope_dim, c.rope_neox, c.has_qkv_bias = 16, 10, 4, 0, has_qkv_bias
    c.rope_theta, c.rope_freq_scale, c.rms_eps = 10000.0, 1.0, 1e-5
    out = ffi.new("ei_model **")
    assert lib.ei_model_create(c, out) == lib.EI_OK
    return ffi.gc(out[0], lib.ei_model_free)


def _set_all(m, keep, bias: bool):
    """Sets every tensor of a 1-layer model (F32 zeros), the q/k/v biases only if `bias`."""
    def put(layer, role, ne0, ne1=1):
        buf = np.zeros(ne0 * ne1, np.float32)
        keep.append(buf)
        return lib.ei_model_set_tensor(m, layer, getattr(lib, "EI_T_" + role), ffi.from_buffer(buf),
                                       lib.EI_TYPE_F32, ne0, ne1)
    st = [put(-1, "TOKEN_EMBD", 8, 10), put(-1, "OUTPUT_NORM", 8)]
    st += [put(0, r, *s) for r, s in (("ATTN_NORM", (8,)), ("ATTN_Q", (8, 8)), ("ATTN_K", (8, 4)),
                                      ("ATTN_V", (8, 4)), ("ATTN_OUTPUT", (8, 8)), ("FFN_NORM", (8,)),
                                      ("FFN_GATE", (8, 16)), ("FFN_UP", (8, 16)), ("FFN_DOWN", (16, 8)))]
    if bias:
        st += [put(0, "ATTN_Q_BIAS", 8), put(0, "ATTN_K_BIAS", 4), put(0, "ATTN_V_BIAS", 4)]
    return st


def _err() -> str:
    return ffi.string(lib.ei_last_error()).decode()


def test_c_model_follows_the_qkv_bias_flag():
    keep: list = []
    m = _c_model(1)
    assert set(_set_all(m, keep, bias=False)) == {lib.EI_OK}
    assert lib.ei_model_finalize(m) == lib.EI_ERR_INVALID_ARG and "missing tensor attn_q_bias" in _err()
    m = _c_model(1)
    assert set(_set_all(m, keep, bias=True)) == {lib.EI_OK}
    assert lib.ei_model_finalize(m) == lib.EI_OK
    m = _c_model(0)
    st = _set_all(m, keep, bias=True)
    assert st[-3:] == [lib.EI_ERR_INVALID_ARG] * 3 and "configured without it" in _err()
    assert lib.ei_model_finalize(m) == lib.EI_OK
    c = ffi.new("ei_model_config *", {"n_layer": 1, "n_embd": 8, "n_head": 2, "n_head_kv": 1,
                                      "head_dim": 4, "n_ff": 16, "n_vocab": 10, "rope_dim": 4,
                                      "has_qkv_bias": 2, "rope_theta": 1e4, "rope_freq_scale": 1.0,
                                      "rms_eps": 1e-5})
    out = ffi.new("ei_model **")
    assert lib.ei_model_create(c, out) == lib.EI_ERR_INVALID_ARG and "has_qkv_bias=2" in _err()


def test_rope_attn_factor_is_checked():
    """0 (a zeroed struct) and positive factors are accepted; negative or NaN ones are errors."""
    base = {"n_layer": 1, "n_embd": 8, "n_head": 2, "n_head_kv": 1, "head_dim": 4, "n_ff": 16,
            "n_vocab": 10, "rope_dim": 4, "rope_theta": 1e4, "rope_freq_scale": 1.0, "rms_eps": 1e-5}
    out = ffi.new("ei_model **")
    for af, ok in ((0.0, True), (1.22, True), (-1.0, False), (float("nan"), False), (1e9, False)):
        st = lib.ei_model_create(ffi.new("ei_model_config *", {**base, "rope_attn_factor": af}), out)
        if ok:
            assert st == lib.EI_OK, af
            lib.ei_model_free(out[0])
        else:
            assert st == lib.EI_ERR_INVALID_ARG and "rope_attn_factor" in _err(), af
