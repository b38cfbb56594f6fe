"""The exact-math oracle (tests/support/reference_forward.py) and the llama.cpp harness.

(a) On the real model, the float64 reference agrees with llama.cpp on the
    evaluation texts (top-1 >= 90 %, mean KL(exact || llama.cpp) <= 0.02).
(b) On tiny synthetic F32 GGUF files (llama: adjacent-pair RoPE, tied head;
    qwen2: q/k/v biases, NEOX RoPE, untied head) the vectorized reference
    equals a slow token-by-token implementation with an explicit KV cache, and
    agrees with llama.cpp to KL ~1e-5 (a wrong RoPE mode gives KL ~1-6).
"""
from __future__ import annotations

import time

import numpy as np
import pytest
from tests.support.strict import require

from tests.support.llama_oracle import compare_logits, first_divergence, kl_divergence, top1_agreement
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


# ------------------------------------------------- synthetic models vs a slow loop
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


def _slow_logits(m: ReferenceModel, ids):
    """Token-by-token forward with an explicit KV cache and scalar-loop RoPE."""
    H, Hkv, D = m.n_head, m.n_head_kv, m.head_dim
    W = m.w

    def norm(x, g):
        return x / np.sqrt((x * x).mean() + m.eps) * g

    def lin(x, name):
        y = W[name + ".weight"] @ x
        return y + W[name + ".bias"] if name + ".bias" in W else y

    def rope(v, pos):
        v = v.copy()
        for i in range(D // 2):
            th = pos * m.rope_base ** (-2.0 * i / D)
            a, b = (i, i + D // 2) if m.rope_neox else (2 * i, 2 * i + 1)
            x0, x1 = v[a], v[b]
            v[a] = x0 * np.cos(th) - x1 * np.sin(th)
            v[b] = x0 * np.sin(th) + x1 * np.cos(th)
        return v

    kc = [[] for _ in range(m.n_layer)]
    vc = [[] for _ in range(m.n_layer)]
    out = []
    for pos, tok in enumerate(ids):
        x = W["token_embd.weight"][tok].copy()
        for il in range(m.n_layer):
            p = f"blk.{il}."
            h = norm(x, W[p + "attn_norm.weight"])
            q = lin(h, p + "attn_q").reshape(H, D)
            k = lin(h, p + "attn_k").reshape(Hkv, D)
            v = lin(h, p + "attn_v").reshape(Hkv, D)
            kc[il].append(np.stack([rope(k[j], pos) for j in range(Hkv)]))
            vc[il].append(v)
            att = np.zeros((H, D))
            for hh in range(H):
                qh = rope(q[hh], pos)
                kv = hh // (H // Hkv)
                s = np.array([qh @ kk[kv] for kk in kc[il]]) / np.sqrt(D)
                pr = np.exp(s - s.max())
                pr /= pr.sum()
                att[hh] = sum(pr[j] * vc[il][j][kv] for j in range(len(pr)))
            x = x + lin(att.reshape(-1), p + "attn_output")
            h = norm(x, W[p + "ffn_norm.weight"])
            g = lin(h, p + "ffn_gate")
            x = x + lin(g / (1 + np.exp(-g)) * lin(h, p + "ffn_up"), p + "ffn_down")
        x = norm(x, W["output_norm.weight"])
        head = W.get("output.weight", W["token_embd.weight"])
        out.append(head @ x)
    return np.array(out)


@pytest.mark.parametrize("arch,tied", [("llama", True), ("qwen2", False)])
def test_reference_vs_slow_loop(tmp_path, arch, tied):
    path = tmp_path / f"tiny-{arch}.gguf"
    _write_tiny_gguf(path, arch, tied=tied)
    m = ReferenceModel(path)
    assert m.arch == arch and m.rope_neox == (arch == "qwen2") and m.tied_output == tied
    ids = [3, 17, 60, 5, 5, 42, 0, 11, 63, 7]
    fast = m.logits(ids)
    slow = _slow_logits(m, ids)
    assert fast.dtype == np.float64 and fast.shape == (len(ids), 64)
    np.testing.assert_allclose(fast, slow, rtol=1e-10, atol=1e-10)
    # causality: a prefix gives the same rows
    np.testing.assert_allclose(m.logits(ids[:4]), fast[:4], rtol=1e-12, atol=1e-12)


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
    with pytest.raises(ValueError, match="mamba"):
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
    assert (m.arch, m.n_layer, m.n_embd, m.n_vocab, m.tied_output) == ("llama", 30, 576, 49152, True)
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
