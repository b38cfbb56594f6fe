"""The exact-math oracle (edgeinfer/arch/reference.py, loaded from GGUF files by
tests/support/reference_forward.py) against the oracles we did not write, and the llama.cpp
harness.

(a) Every family we run, as a tiny random-weight checkpoint converted to F32: the reference in
    float64 (and float32) gives transformers' float64 (float32) logits, inside and past
    Gemma 3's sliding window, with LongRoPE's short and long factors, and with a final softcap.
(b) On tiny synthetic F32 GGUF files written with the gguf package (llama: adjacent-pair
    RoPE, tied head; qwen2: q/k/v biases, NEOX RoPE, untied head) it agrees with llama.cpp to
    KL ~1e-5 (a wrong RoPE mode gives KL ~1-6).
(c) On the real model it agrees with llama.cpp on the evaluation texts (top-1 >= 90 %, mean
    KL(exact || llama.cpp) <= 0.02).
"""
from __future__ import annotations

import time

import numpy as np
import pytest
from tests.support.strict import require

from edgeinfer.errors import UnsupportedArchitectureError
from tests.support.llama_oracle import compare_logits, first_divergence, kl_divergence, top1_agreement
from edgeinfer.arch.reference import Reference
from tests.support.reference_forward import ReferenceModel, get_reference_model, reference_logits
from tests.support.texts import PROMPTS


def _need_llama():
    return require("llama_cpp")


# ------------------------------------------------------------ metrics (pure numpy)
def test_metrics():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(5, 50))
    assert np.allclose(kl_divergence(a, a), 0.0, atol=1e-12)
    assert np.allclose(kl_divergence(a, a + 3.0), 0.0, atol=1e-12)  # shift invariant
    b = a + rng.normal(scale=0.5, size=a.shape)
    kl = kl_divergence(a, b)
    assert kl.shape == (5,) and np.all(kl > 0)
    # direct definition
    p = np.exp(a - a.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    q = np.exp(b - b.max(-1, keepdims=True)); q /= q.sum(-1, keepdims=True)
    assert np.allclose(kl, (p * np.log(p / q)).sum(-1), rtol=1e-10)
    assert top1_agreement(a, a) == 1.0
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


# ------------------------------------------------- every family vs transformers
# llama32: llama3 rope_freqs; phi3 / phi4: fused q/k/v and gate/up, LongRoPE (original context
# 32), phi4 partial rotary; qwen3: per-head Q/K norms, head_dim != width / heads; gemma3: 5 local
# : 1 global layers with a window of 16 and their own RoPE base, post-norms, GeGLU, scaled
# embeddings, norms stored as 1 + w; gemma3_softcap: the same with a final logit softcap;
# smollm3: layers 3 and 7 of 8 without RoPE.
FAMILIES = ["llama", "llama_tied", "mistral", "qwen2", "llama32", "phi3", "phi4", "qwen3", "gemma3",
            "gemma3_softcap", "smollm3"]


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """kind -> (checkpoint directory, its F32 GGUF from our converter)."""
    require("torch", "tiny checkpoints are built with torch")
    require("transformers", "tiny checkpoints are built with transformers")
    require("tokenizers")
    require("sentencepiece")
    require("gguf", "the reference reads GGUF files with the gguf package")
    import json
    import shutil

    from edgeinfer.convert import convert_checkpoint
    from tests.support import tiny_checkpoints

    root = tmp_path_factory.mktemp("reference_families")
    out = {}
    for kind in FAMILIES:
        d = root / kind
        if kind == "gemma3_softcap":
            shutil.copytree(out["gemma3"][0], d)
            cfg = json.loads((d / "config.json").read_text())
            cfg["final_logit_softcapping"] = 0.5       # below the tiny model's logits: it bites
            (d / "config.json").write_text(json.dumps(cfg))
        else:
            tiny_checkpoints.build(kind, d)
        convert_checkpoint(str(d), str(root / f"{kind}.gguf"), "f32")
        out[kind] = (d, root / f"{kind}.gguf")
    return out


def _transformers_logits(model_dir, ids, dtype) -> np.ndarray:
    import torch
    import transformers as tf

    m = tf.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, attn_implementation="eager").eval()
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].numpy()


@pytest.mark.parametrize("kind", FAMILIES)
def test_reference_gives_transformers_logits(families, kind):
    """The reference on our F32 file, in float64 and in float32, against transformers on the
    checkpoint in the same precision: 12 tokens (inside Gemma 3's window of 16, LongRoPE's short
    factors) and 60 (past the window, the long factors; n_ctx = the length, as transformers
    chooses)."""
    import torch

    d, path = families[kind]
    model = ReferenceModel(path)
    rng = np.random.default_rng(3)
    for n in (12, 60):
        ids = [int(i) for i in rng.integers(3, model.n_vocab, n)]
        for dtype, torch_dtype in ((np.float64, torch.float64), (np.float32, torch.float32)):
            theirs = _transformers_logits(d, ids, torch_dtype)
            ours = Reference(model.params, model.ref.weights, dtype).logits(ids, n_ctx=n)
            assert ours.dtype == dtype and ours.shape == theirs.shape
            err = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
            print(f"\n{kind} n={n} {np.dtype(dtype).name}: max |reference - transformers| / max |logit| {err:.1e}")
            # float32 roundings remain in float64: transformers' RoPE tables are float32 whatever
            # the model's dtype, and Gemma's norms are stored as float32(1 + w)
            assert err <= 1e-5, (kind, n, np.dtype(dtype).name, err)


def test_swa_pattern_zero_slides_every_layer_as_the_runtime_does(families, tmp_path):
    """A Gemma 3 file whose sliding_window_pattern is 0 has no global layer (the native
    runtimes' ei_layer_is_local): the reference reads it so, the engine's logits follow the
    reference's, and the 5 : 1 layout's differ from them past the window."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    import edgeinfer

    src = families["gemma3"][1]
    path = tmp_path / "gemma3-all-local.gguf"
    reader = gguf.GGUFReader(str(src))
    copy_with_new_metadata(reader, gguf.GGUFWriter(str(path), "gemma3", endianess=reader.endianess),
                           {"gemma3.attention.sliding_window_pattern": MetadataDetails(gguf.GGUFValueType.UINT32, 0)},
                           [])
    ref = ReferenceModel(path)
    assert ref.params.local_layers == frozenset(range(ref.params.n_layer))
    ids = [int(i) for i in np.random.default_rng(4).integers(3, ref.n_vocab, 60)]
    exact = ref.logits(ids)
    with edgeinfer.load(str(path), n_ctx=256, n_threads=2) as e:
        ours = e.logits(ids)
    err = float(np.abs(ours - exact).max())
    layouts = float(np.abs(ReferenceModel(src).logits(ids) - exact).max())
    print(f"\nevery layer local: max |edgeinfer - reference| {err:.1e}; the 5 : 1 layout differs by {layouts:.1e}")
    assert err <= 0.02 * layouts, (err, layouts)


# ------------------------------------------------- synthetic models vs llama.cpp
def _write_tiny_gguf(path, arch: str, seed: int = 0, tied: bool = True):
    import gguf

    rng = np.random.default_rng(seed)
    n_embd, n_head, n_kv, n_ff, n_vocab, n_layer = 32, 4, 2, 48, 64, 2
    head_dim = n_embd // n_head
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(n_layer)
    w.add_context_length(2048)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    # a minimal byte-level BPE vocabulary, so llama.cpp can load the file too
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if arch == "qwen2" else "smollm")
    w.add_token_list([chr(ord("a") + i % 26) * (1 + i // 26) for i in range(n_vocab)])
    w.add_token_types([1] * n_vocab)
    w.add_token_merges(["a a"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def t(name, *shape, scale=0.3):
        w.add_tensor(name, (rng.normal(size=shape) * scale).astype(np.float32))

    t("token_embd.weight", n_vocab, n_embd, scale=1.0)
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", (1 + 0.1 * rng.normal(size=n_embd)).astype(np.float32))
        w.add_tensor(p + "ffn_norm.weight", (1 + 0.1 * rng.normal(size=n_embd)).astype(np.float32))
        t(p + "attn_q.weight", n_head * head_dim, n_embd)
        t(p + "attn_k.weight", n_kv * head_dim, n_embd)
        t(p + "attn_v.weight", n_kv * head_dim, n_embd)
        if arch == "qwen2":
            t(p + "attn_q.bias", n_head * head_dim)
            t(p + "attn_k.bias", n_kv * head_dim)
            t(p + "attn_v.bias", n_kv * head_dim)
        t(p + "attn_output.weight", n_embd, n_head * head_dim)
        t(p + "ffn_gate.weight", n_ff, n_embd)
        t(p + "ffn_up.weight", n_ff, n_embd)
        t(p + "ffn_down.weight", n_embd, n_ff)
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    if not tied:
        t("output.weight", n_vocab, n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.oracle
@pytest.mark.parametrize("arch,tied", [("llama", True), ("qwen2", False)])
def test_tiny_reference_agrees_with_llama_cpp(tmp_path, arch, tied):
    _need_llama()
    from tests.support.llama_oracle import llama_logits

    path = tmp_path / f"tiny-{arch}.gguf"
    _write_tiny_gguf(path, arch, seed=1, tied=tied)
    ids = [3, 17, 60, 5, 5, 42, 0, 11, 63, 7] * 3
    r = compare_logits(ReferenceModel(path).logits(ids), llama_logits(path, ids))
    print(f"\n[tiny {arch}] KL(exact||llama.cpp) mean={r['kl_mean']:.2e} top1={100 * r['top1']:.0f}%")
    assert r["top1"] == 1.0, r
    assert r["kl_mean"] <= 1e-4, r


def test_reference_rejects_unknown_arch(tmp_path):
    import gguf

    path = tmp_path / "bad.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(UnsupportedArchitectureError, match="mamba"):
        ReferenceModel(path)


# ------------------------------------------------------- real model vs llama.cpp
@pytest.mark.oracle
@pytest.mark.slow
def test_texts_are_long_enough(smollm2_path):
    _need_llama()
    from tests.support.llama_oracle import text_ids

    for name, ids in text_ids(smollm2_path).items():
        assert len(ids) >= 256, f"text {name!r} has only {len(ids)} tokens"


@pytest.mark.oracle
@pytest.mark.slow
def test_exact_math_agrees_with_llama_cpp(smollm2_path):
    _need_llama()
    from tests.support.llama_oracle import llama_logits, text_ids

    m = get_reference_model(smollm2_path)
    assert (m.arch, m.params.n_layer, m.params.n_embd, m.n_vocab, m.tied_output) == ("llama", 30, 576, 49152, True)
    all_kl, all_top = [], []
    for name, ids in text_ids(smollm2_path).items():
        t0 = time.perf_counter()
        exact = reference_logits(smollm2_path, ids)
        t_exact = time.perf_counter() - t0
        ll = llama_logits(smollm2_path, ids)
        assert exact.shape == ll.shape == (len(ids), m.n_vocab)
        assert np.isfinite(exact).all() and np.isfinite(ll).all()
        kl = kl_divergence(exact, ll)
        top = np.argmax(exact, -1) == np.argmax(ll, -1)
        r = {"n": kl.size, "kl_mean": float(kl.mean()), "kl_max": float(kl.max()), "top1": float(top.mean())}
        print(
            f"\n[{name}] n={r['n']} KL(exact||llama.cpp) mean={r['kl_mean']:.5f} "
            f"max={r['kl_max']:.4f} top1={100 * r['top1']:.1f}%  exact forward {t_exact:.1f}s"
        )
        assert r["top1"] >= 0.90, (name, r)
        assert r["kl_mean"] <= 0.02, (name, r)
        all_kl.append(kl)
        all_top.append(top)
    kl = np.concatenate(all_kl)
    top = np.concatenate(all_top)
    print(f"[all] n={kl.size} mean KL={kl.mean():.5f} top1={100 * top.mean():.1f}%")


@pytest.mark.oracle
@pytest.mark.slow
def test_llama_greedy_helper(smollm2_path):
    """The greedy helper continues its own argmax (sanity of the harness, not of edgeinfer)."""
    _need_llama()
    from tests.support.llama_oracle import llama_greedy, llama_logits, llama_tokenize

    prompt = llama_tokenize(smollm2_path, PROMPTS[0])
    gen = llama_greedy(smollm2_path, prompt, 8)
    assert len(gen) == 8
    lg = llama_logits(smollm2_path, prompt + gen[:-1])
    assert list(np.argmax(lg[len(prompt) - 1 :], -1)) == gen
