"""ModelConfig.from_gguf: SmolLM2's values, the tiny llama/qwen2 files, and clear errors."""
from __future__ import annotations

import pytest

from edgeinfer.errors import GGUFError, UnsupportedArchitectureError, UnsupportedTypeError
from edgeinfer.gguf import GGMLType, GGUFFile
from edgeinfer.arch import ARCHS
from edgeinfer.model.config import ModelConfig

from tests.support.gguf_corpus import F64, FLOAT32, INT32, Q8_0, STRING, UINT32, GGUFBuilder, tiny_llama


def _config(tmp_path, b: GGUFBuilder, name: str = "m") -> ModelConfig:
    p = tmp_path / f"{name}.gguf"
    p.write_bytes(b.build())
    with GGUFFile(p) as f:
        return ModelConfig.from_gguf(f)


# ----------------------------------------------------------------- real model

def test_smollm2_config(smollm2_path):
    with GGUFFile(smollm2_path) as f:
        c = ModelConfig.from_gguf(f)
    assert c.arch == "llama"
    assert (c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim) == (30, 576, 9, 3, 64)
    assert (c.n_ff, c.n_vocab, c.n_ctx_train, c.rope_dim) == (1536, 49152, 8192, 64)
    assert c.rope_theta == 100000.0
    assert c.rms_eps == pytest.approx(1e-5)
    assert c.rope_neox is False and c.has_qkv_bias is False
    assert c.tied_output is True and c.rope_freq_scale == 1.0 and not c.has_rope_freqs
    assert c.n_gqa == 3 and c.q_dim == 576 and c.kv_dim == 192
    names = c.tensor_names(29)
    assert names["attn_q"] == "blk.29.attn_q.weight"
    assert names["ffn_down"] == "blk.29.ffn_down.weight"
    assert names["attn_q_bias"] is None
    g = c.global_tensor_names()
    assert g == {"token_embd": "token_embd.weight", "output_norm": "output_norm.weight",
                 "output": None, "rope_freqs": None}
    assert c.tensor_types["token_embd.weight"] == GGMLType.Q8_0
    assert c.tensor_types["blk.0.attn_q.weight"] == GGMLType.Q4_1
    assert len(c.tensor_types) == 272
    with pytest.raises(IndexError):
        c.tensor_names(30)


# ----------------------------------------------------------------- tiny files

def test_tiny_llama(tmp_path):
    c = _config(tmp_path, tiny_llama())
    assert (c.arch, c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff) == (
        "llama", 2, 64, 4, 2, 16, 96)
    assert c.n_vocab == 40          # from tokenizer.ggml.tokens (no vocab_size key)
    assert c.tied_output is False and c.rope_neox is False and not c.has_qkv_bias
    assert c.global_tensor_names()["output"] == "output.weight"


def test_tiny_qwen2(tmp_path):
    c = _config(tmp_path, tiny_llama(arch="qwen2"))
    assert c.arch == "qwen2" and c.rope_neox is True and c.has_qkv_bias is True
    n = c.tensor_names(1)
    assert (n["attn_q_bias"], n["attn_k_bias"], n["attn_v_bias"]) == (
        "blk.1.attn_q.bias", "blk.1.attn_k.bias", "blk.1.attn_v.bias")


def test_llama_with_qkv_bias_and_tied(tmp_path):
    c = _config(tmp_path, tiny_llama(bias=True, tied=True))
    assert c.has_qkv_bias and c.tied_output


def test_defaults_and_fallbacks(tmp_path):
    b = tiny_llama()
    for k in ("llama.rope.freq_base", "llama.rope.dimension_count", "llama.attention.head_count_kv",
              "tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
              "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
              "tokenizer.ggml.unknown_token_id"):
        b.remove(k)
    # head_count_kv defaults to head_count -> k/v become (64, 64)
    b.find("blk.0.attn_k.weight").shape = (64, 64)
    b.find("blk.1.attn_k.weight").shape = (64, 64)
    b.find("blk.0.attn_v.weight").shape = (64, 64)
    b.find("blk.1.attn_v.weight").shape = (64, 64)
    c = _config(tmp_path, b)
    assert c.rope_theta == 10000.0 and c.rope_dim == c.head_dim == 16 and c.n_head_kv == 4
    assert c.n_vocab == 40          # from token_embd's shape


def test_vocab_size_key_and_key_length(tmp_path):
    b = tiny_llama()
    b.add("llama.vocab_size", UINT32, 48)
    b.find("token_embd.weight").shape = (64, 48)
    b.find("output.weight").shape = (64, 48)
    b.add("llama.attention.key_length", UINT32, 16)
    c = _config(tmp_path, b)
    assert c.n_vocab == 48 and c.head_dim == 16


def test_linear_rope_scaling(tmp_path):
    b = tiny_llama()
    b.add("llama.rope.scaling.type", STRING, "linear").add("llama.rope.scaling.factor", FLOAT32, 4.0)
    assert _config(tmp_path, b).rope_freq_scale == 0.25


def test_rope_freqs_tensor_is_exposed(tmp_path):
    b = tiny_llama()
    b.tensor("rope_freqs.weight", (8,), 0)
    c = _config(tmp_path, b)
    assert c.has_rope_freqs and c.global_tensor_names()["rope_freqs"] == "rope_freqs.weight"


# ----------------------------------------------------------------- errors

def test_unknown_architecture(tmp_path):
    with pytest.raises(UnsupportedArchitectureError) as ei:
        _config(tmp_path, tiny_llama(arch="mamba"))
    msg = str(ei.value)
    assert "'mamba'" in msg
    for a in ARCHS:
        assert a in msg


@pytest.mark.parametrize("kind,hint", [("adapter", "--lora"), ("imatrix", "convert --imatrix")])
def test_a_gguf_that_is_not_a_model_says_what_it_is(tmp_path, kind, hint):
    with pytest.raises(GGUFError, match=f"is not a model: its general.type is '{kind}'.*{hint}"):
        _config(tmp_path, tiny_llama().set("general.type", STRING, kind))


def test_missing_tensor_named(tmp_path):
    b = tiny_llama().drop("blk.1.ffn_up.weight")
    with pytest.raises(GGUFError, match=r"'blk\.1\.ffn_up\.weight' is missing"):
        _config(tmp_path, b)


def test_missing_qwen2_bias_named(tmp_path):
    b = tiny_llama(arch="qwen2").drop("blk.0.attn_v.bias")
    with pytest.raises(GGUFError, match=r"'blk\.0\.attn_v\.bias' is missing"):
        _config(tmp_path, b)


def test_partial_llama_bias(tmp_path):
    b = tiny_llama(bias=True).drop("blk.0.attn_k.bias").drop("blk.1.attn_k.bias")
    with pytest.raises(GGUFError, match="only some q/k/v biases"):
        _config(tmp_path, b)


@pytest.mark.parametrize("name,shape", [
    ("blk.0.attn_k.weight", (64, 64)),
    ("blk.1.attn_q.weight", (64, 32)),
    ("blk.0.ffn_down.weight", (64, 96)),
    ("blk.1.attn_norm.weight", (32,)),
    ("token_embd.weight", (64, 32)),
    ("output.weight", (64, 40, 1)),
])
def test_wrong_shape_named(tmp_path, name, shape):
    b = tiny_llama()
    b.find(name).shape = shape
    with pytest.raises(GGUFError, match=rf"'{name}' has shape"):
        _config(tmp_path, b)


@pytest.mark.parametrize("name,ggml_type,type_name", [
    ("blk.0.ffn_up.weight", F64, "F64"),
    ("blk.1.attn_norm.weight", Q8_0, "Q8_0"),
])
def test_unsupported_type_named(tmp_path, name, ggml_type, type_name):
    b = tiny_llama()
    b.find(name).ggml_type = ggml_type
    with pytest.raises(UnsupportedTypeError) as ei:
        _config(tmp_path, b)
    assert name in str(ei.value) and type_name in str(ei.value)


def test_unexpected_tensor_named(tmp_path):
    b = tiny_llama()
    b.tensor("blk.0.attn_output.bias", (64,), 0)
    with pytest.raises(GGUFError, match=r"unexpected tensor.*'blk\.0\.attn_output\.bias'"):
        _config(tmp_path, b)


def test_extra_layer_hint(tmp_path):
    b = tiny_llama()
    b.set("llama.block_count", UINT32, 1)
    with pytest.raises(GGUFError, match="more layers than"):
        _config(tmp_path, b)


@pytest.mark.parametrize("key,vtype,value,match", [
    ("llama.attention.head_count_kv", UINT32, 3, "not a multiple"),
    ("llama.block_count", UINT32, 0, "out of range"),
    ("llama.block_count", UINT32, 100000, "out of range"),
    ("llama.embedding_length", UINT32, 1 << 20, "out of range"),
    ("llama.attention.key_length", UINT32, 15, "odd"),
    ("llama.rope.dimension_count", UINT32, 32, "out of range"),
    ("llama.rope.freq_base", FLOAT32, float("inf"), "not finite"),
    ("llama.rope.freq_base", FLOAT32, -1.0, "must be > 0"),
    ("llama.attention.layer_norm_rms_epsilon", FLOAT32, 0.0, r"not in \(0, 1\)"),
    ("llama.rope.scaling.type", STRING, "yarn", "'yarn' is not supported"),
    ("llama.expert_count", UINT32, 8, "mixture-of-experts"),
    ("llama.attention.value_length", UINT32, 32, "value_length"),
    ("llama.attention.head_count", INT32, -4, "out of range"),
    ("llama.vocab_size", UINT32, 30, "tokenizer.ggml.tokens has 40"),
])
def test_bad_hparams(tmp_path, key, vtype, value, match):
    b = tiny_llama()
    b.set(key, vtype, value)
    with pytest.raises(GGUFError, match=match):
        _config(tmp_path, b)


@pytest.mark.parametrize("key", ["llama.block_count", "llama.embedding_length",
                                 "llama.feed_forward_length", "llama.attention.head_count",
                                 "llama.attention.layer_norm_rms_epsilon", "llama.context_length"])
def test_missing_required_key_named(tmp_path, key):
    b = tiny_llama().remove(key)
    with pytest.raises(GGUFError, match=rf"'{key}' is missing"):
        _config(tmp_path, b)


def test_head_count_array_rejected_cleanly(tmp_path):
    b = tiny_llama()
    b.set("llama.attention.head_count", 9, [4, 4], UINT32)
    with pytest.raises(GGUFError, match=r"head_count' has type ARRAY\[UINT32\], expected int"):
        _config(tmp_path, b)
