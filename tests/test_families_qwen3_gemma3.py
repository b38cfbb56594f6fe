"""Qwen3 and Gemma 3 from checkpoint to tokens, against transformers and llama.cpp (issue 14).

Tiny random-weight checkpoints (tests/support/tiny_checkpoints.py: qwen3 with head_dim != width /
heads and per-head Q/K norms; gemma3 with 7 layers of 5 local : 1 global, a sliding window of
16, GeGLU, post-norms, a SentencePiece vocabulary without a dummy prefix) converted by our
converter. One test per behaviour, looping over the families inside.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from tests.support.strict import require


torch = require("torch", "tiny checkpoints are built with torch")
tf = require("transformers", "tiny checkpoints are built with transformers")
require("tokenizers")
require("sentencepiece")
require("llama_cpp")
require("gguf", "the gguf package is a test dependency")

from tests.support import tiny_checkpoints  # noqa: E402
from tests.support.llama_oracle import (  # noqa: E402
    Q8_0_TIE_GAP, greedy_differences, kl_divergence, llama_logits, llama_tokenize, top1_agreement, top1_errors)

import edgeinfer  # noqa: E402
from edgeinfer.convert import convert_checkpoint  # noqa: E402
from edgeinfer.gguf import GGUFFile  # noqa: E402

pytestmark = [pytest.mark.oracle]
torch.set_num_threads(1)

FAMILIES = ["qwen3", "gemma3"]
# ~100 tokens: well past gemma3's window of 16
TEXT = ("The quick brown fox, 12345 apples; café 🙂 def f(x):\n    return x * 2\n\n"
        "Once upon a time, in a small village, there lived an old clockmaker who loved tea. "
        "SHOUTING words and don't won't they'll -- numbers 3.14159 and 2024.")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("fam")
    out = {}
    for fam in FAMILIES:
        d = tiny_checkpoints.build(fam, root / fam)
        files = {}
        for ft in ("f32", "q8_0"):
            files[ft] = root / f"{fam}.{ft}.gguf"
            convert_checkpoint(str(d), str(files[ft]), ft)
        out[fam] = (d, files)
    return out


def hf_logits(model_dir, ids, **overrides) -> np.ndarray:
    m = tf.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, **overrides).eval()
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].float().numpy()


def engine(path, **kw):
    return edgeinfer.load(str(path), n_ctx=256, n_threads=2, **kw)


def test_file_describes_the_family(tiny):
    """The converted files carry what llama.cpp reads: gemma3's window, head sizes, shifted norms."""
    d, files = tiny["gemma3"]
    with GGUFFile(files["f32"]) as f:
        m = f.metadata
        assert m["general.architecture"] == "gemma3"
        assert m["gemma3.attention.sliding_window"] == 16
        assert m["gemma3.attention.key_length"] == 32 and m["gemma3.embedding_length"] == 64
        assert m["tokenizer.ggml.add_space_prefix"] is False
        assert "output.weight" not in f.tensors          # tied head
        norm = np.frombuffer(bytes(f.tensors["blk.0.attn_q_norm.weight"].data), np.float32)
    hf = tf.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)
    w = hf.model.layers[0].self_attn.q_norm.weight.detach().numpy()
    np.testing.assert_array_equal(np.asarray(norm), w + 1.0)    # Gemma's (1 + w), stored shifted
    with GGUFFile(tiny["qwen3"][1]["f32"]) as f:
        m = f.metadata
        assert m["general.architecture"] == "qwen3"
        assert m["qwen3.attention.key_length"] == 32 and m["qwen3.attention.head_count"] == 4
        assert m["qwen3.embedding_length"] == 64                 # 4 heads of 32 != 64 / 4
        assert "blk.1.attn_k_norm.weight" in f.tensors and "output.weight" in f.tensors


def test_f32_logits_as_close_to_transformers_as_llama_cpp(tiny):
    """Issue 14: our F32 logits vs transformers at most 1.5x llama.cpp's own difference on the
    same file, and within 1e-3 where llama.cpp is. The text runs past gemma3's window."""
    for fam in FAMILIES:
        d, files = tiny[fam]
        ids = llama_tokenize(files["f32"], TEXT)
        assert len(ids) > 3 * 16
        ref = hf_logits(d, ids)
        with engine(files["f32"]) as e:
            ours = e.logits(ids)
        theirs = llama_logits(files["f32"], ids)
        o, t = float(np.abs(ours - ref).max()), float(np.abs(theirs - ref).max())
        print(f"\n{fam}: max |logit - transformers|: edgeinfer {o:.2e}, llama.cpp {t:.2e}")
        assert o <= 1.5 * t, (fam, o, t)
        if t <= 1e-3:
            assert o <= 1e-3, (fam, o)


def test_sliding_window_matches_transformers_past_the_window(tiny):
    """Gemma 3's local layers see only the last 16 positions: our logits follow transformers'
    windowed model past the window, and the window changes them there (so the check bites),
    for a prompt evaluated at once and for tokens decoded one by one."""
    d, files = tiny["gemma3"]
    ids = llama_tokenize(files["f32"], TEXT)[:60]
    ref = hf_logits(d, ids)
    full = hf_logits(d, ids, sliding_window=4096)      # the same weights, no window
    assert np.abs(full[:16] - ref[:16]).max() < 1e-4    # inside the window: the same model
    assert np.abs(full[20:] - ref[20:]).max() > 1e-2    # past it: the window matters
    bound = 0.1 * float(np.abs(full[20:] - ref[20:]).max())
    for max_batch in (256, 7, 1):      # one prefill, chunks across the window's edge, one by one
        with engine(files["f32"], max_batch=max_batch) as e:
            err = float(np.abs(e.logits(ids) - ref).max())
        print(f"\ngemma3 past the window, batches of {max_batch}: max |edgeinfer - transformers| "
              f"{err:.2e}; transformers without the window differs by {np.abs(full - ref).max():.2e}")
        assert err <= bound, (max_batch, err, bound)


def test_q8_0_kl_against_llama_cpp(tiny):
    for fam in FAMILIES:
        path = tiny[fam][1]["q8_0"]
        ids = llama_tokenize(path, TEXT)
        with engine(path) as e:
            ours = e.logits(ids)
        kl = float(kl_divergence(llama_logits(path, ids), ours).mean())
        print(f"\n{fam} Q8_0: mean KL(llama.cpp || edgeinfer) {kl:.5f}")
        assert kl <= 1e-3, (fam, kl)     # measured: 1e-5 (qwen3), 6e-5 (gemma3)


def test_q8_0_top1_against_llama_cpp_on_trained_models(trained):
    """Random weights' near-flat logits leave the top token to rounding, so a KL bar alone
    passes a broken model there; the trained models' logits have real top-2 gaps: teacher-forced
    on their sequence, llama.cpp and edgeinfer pick the same top token at every position
    whose llama.cpp top-2 gap is beyond a near tie, and at >= 99 % of all of them."""
    for fam in FAMILIES:
        path, seq = trained[fam]
        with engine(path) as e:
            ours = e.logits(seq)
        theirs = llama_logits(path, seq)
        top1 = top1_agreement(theirs, ours)
        wrong = top1_errors(theirs, ours, tie_gap=Q8_0_TIE_GAP)
        print(f"\n{fam} trained Q8_0: top-1 {top1:.4f}, beyond ties wrong at {wrong}")
        assert not wrong and top1 >= 0.99, (fam, top1, wrong)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Each family's tiny model trained to continue a sequence (tiny_checkpoints.memorize),
    as a Q8_0 file, with the sequence."""
    root = tmp_path_factory.mktemp("trained")
    out = {}
    for fam in FAMILIES:
        d = tiny_checkpoints.build(fam, root / fam)
        seq = tiny_checkpoints.memorize(d)
        convert_checkpoint(str(d), str(root / f"{fam}.q8_0.gguf"), "q8_0")
        out[fam] = (root / f"{fam}.q8_0.gguf", seq)
    return out


def test_greedy_32_tokens_identical_to_llama_cpp(trained):
    """32 greedy tokens on the Q8_0 file, identical to llama.cpp's, from five pieces of the
    sequence each model was trained on. (Random weights give near-flat logits, where two
    runtimes whose Q8_0 logits differ by a few hundredths may pick either of two near-tied
    tokens; a trained model's choices are the model's, as a real model's are.)"""
    for fam in FAMILIES:
        path, seq = trained[fam]
        with engine(path) as e:
            diffs = greedy_differences(
                path, seq, lambda p, n: e.generate(p, max_tokens=n, temperature=0.0, ignore_eos=True).tokens)
        assert not diffs, (fam, diffs)


def test_tokenizer_matches_llama_cpp_on_the_hostile_corpus(tiny):
    """Qwen BPE and Gemma SPM (no dummy prefix, user-defined turn markers) against llama.cpp
    on the same files, with and without BOS and special-token parsing."""
    from tests.test_tokenizer import FULL_CORPUS, SPM_CORPUS, compare_with_oracle, oracle_vocab

    from edgeinfer.text.tokenizer import Tokenizer
    extra = ["<|im_start|>user\nhi<|im_end|>\n<think>\nx\n</think>", "<start_of_turn>user\nhi<end_of_turn>\n",
             "<bos>a<eos>b", "\n\n\n", "   ", "a  b   c    d"]
    for fam in FAMILIES:
        path = tiny[fam][1]["q8_0"]
        with GGUFFile(path) as f:
            tok = Tokenizer.from_metadata(dict(f.metadata))
        ok, n, failures = compare_with_oracle(tok, oracle_vocab(path), sorted(set(SPM_CORPUS + FULL_CORPUS))
                                              + extra)
        print(f"\n{fam}: {ok}/{n} tokenizations identical to llama.cpp")
        assert ok == n, "\n".join(failures)


def test_lora_merged_equals_peft(tiny, tmp_path):
    require("peft")
    for fam in FAMILIES:
        d = tiny[fam][0]
        adapter = tiny_checkpoints.build_lora(d, tmp_path / f"lora-{fam}")
        out = tmp_path / f"{fam}-lora.gguf"
        convert_checkpoint(str(d), str(out), "f32", lora_dir=str(adapter))
        ids = llama_tokenize(out, TEXT)
        from peft import PeftModel
        m = PeftModel.from_pretrained(
            tf.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32), str(adapter)).eval()
        with torch.no_grad():
            ref = m(torch.tensor([ids])).logits[0].numpy()
        base = hf_logits(d, ids)
        assert np.abs(ref - base).max() > 1e-2               # the adapter does change the model
        with engine(out) as e:
            ours = e.logits(ids)
        theirs = llama_logits(out, ids)
        assert np.abs(ours - ref).max() <= max(1e-3, 1.5 * np.abs(theirs - ref).max()), fam


def test_bf16_checkpoint_converts(tiny, tmp_path):
    for fam in FAMILIES:
        d = tiny_checkpoints.build(fam, tmp_path / fam, dtype="bfloat16")
        out = tmp_path / f"{fam}.gguf"
        convert_checkpoint(str(d), str(out), "f32")
        ids = llama_tokenize(out, TEXT)
        ref = hf_logits(d, ids)      # bf16 weights held in f32 by transformers
        with engine(out) as e:
            ours = e.logits(ids)
        theirs = llama_logits(out, ids)
        assert np.abs(ours - ref).max() <= max(1e-3, 1.5 * np.abs(theirs - ref).max()), fam


def test_chat_templates_render_as_transformers_and_qwen3_thinks_on_request(tiny):
    """Each family's template as transformers renders it (Gemma's system-in-first-turn, Qwen3's
    thinking switch), and enable_thinking passed through chat(), chat_template_kwargs and the
    server's chat endpoint (as an extra body field and inside chat_template_kwargs)."""
    openai = require("openai", "the openai client is the server's oracle")
    from edgeinfer.server import ServerThread
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Count to 3"}]
    for fam in FAMILIES:
        d, files = tiny[fam]
        from transformers.utils.chat_template_utils import render_jinja_template
        tcfg = json.loads((d / "tokenizer_config.json").read_text())
        specials = {k: tcfg[k] for k in ("bos_token", "eos_token") if k in tcfg}
        with engine(files["q8_0"]) as e:
            for kw in ({}, {"enable_thinking": False}, {"enable_thinking": True}):
                want = render_jinja_template([msgs], chat_template=tcfg["chat_template"],
                                             add_generation_prompt=True, **specials, **kw)[0][0]
                assert e.apply_chat_template(msgs, **kw) == want, (fam, kw)
            if fam != "qwen3":
                continue
            off = e.apply_chat_template(msgs, enable_thinking=False)
            assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
            assert e.apply_chat_template(msgs).endswith("<|im_start|>assistant\n")
            ids_off = e.chat_ids(msgs, enable_thinking=False)
            assert ids_off == e.tokenize(off, add_special=False) and ids_off != e.chat_ids(msgs)
            greedy = dict(max_tokens=6, temperature=0.0, ignore_eos=True)
            want = e.generate(ids_off, **greedy).tokens
            assert e.chat(msgs, enable_thinking=False, **greedy).tokens == want
            assert e.chat(msgs, chat_template_kwargs={"enable_thinking": False}, **greedy).tokens == want
            assert e.chat(msgs, **greedy).tokens == e.generate(e.chat_ids(msgs), **greedy).tokens
            srv = ServerThread(e, model_name="qwen3").start()
            try:
                client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
                for extra in ({"enable_thinking": False}, {"chat_template_kwargs": {"enable_thinking": False}}):
                    r = client.chat.completions.create(model="qwen3", messages=msgs, max_tokens=6, temperature=0.0,
                                                       extra_body=extra)
                    assert r.usage.prompt_tokens == len(ids_off), extra
                    assert r.choices[0].message.content == e.detokenize(want), extra
                r = client.chat.completions.create(model="qwen3", messages=msgs, max_tokens=6, temperature=0.0)
                assert r.usage.prompt_tokens == len(e.chat_ids(msgs))
            finally:
                srv.stop(timeout_s=5)


def test_sliding_window_layers_keep_only_their_window(tiny):
    """Gemma 3's local layers hold a ring of window + max_batch - 1 cells per slot, not the
    context: at 32K the arena is a fraction of the full one, and `plan` predicts it exactly."""
    from edgeinfer.tools import plan as P
    path = tiny["gemma3"][1]["f32"]
    m = P.model_shape(path)
    full = 2 * m.n_layer * m.n_head_kv * m.head_dim * 32768 * 2
    for max_batch in (256, 64):
        with edgeinfer.load(str(path), n_ctx=32768, n_threads=1, max_batch=max_batch) as e:
            info = e.info()
        local = 16 + max_batch - 1
        assert info["sliding_window"] == 16 and info["local_layers"] == 6 and info["local_kv_cells"] == local
        want = 2 * m.n_head_kv * m.head_dim * 2 * (1 * 32768 + 6 * local)     # 1 global + 6 local layers
        assert info["kv_bytes"] == want == P.plan_one(m, 32768, 1, max_batch=max_batch).kv_bytes
        print(f"\ngemma3 tiny at 32K, max_batch {max_batch}: KV arena {want} bytes, {want / full:.3f} of the "
              f"full cache")
        assert want < 0.2 * full


def test_prefix_reuse_with_the_local_ring(tiny):
    """With a small local ring (max_batch 4: 19 cells) a slot reuses a shared prefix only when the
    window its next token needs is still in the ring (a rewind of at most max_batch positions);
    either way the tokens equal those of an engine whose local layers keep the full ring."""
    path = tiny["gemma3"][1]["f32"]
    greedy = dict(max_tokens=8, temperature=0.0, ignore_eos=True)
    with edgeinfer.load(str(path), n_ctx=256, n_threads=1) as full:     # 16 + 256 - 1 > 256: full ring
        assert full.info()["local_kv_cells"] == 0
        base = full.tokenize(TEXT)[:60]
        first = full.generate(base, **greedy).tokens
        prompts = [base, base + first[:6] + base[3:5], base[:40] + base[5:9]]   # rewind ~1 (kept), ~27 (lost)
        want = [full.generate(p, **greedy).tokens for p in prompts]
    with edgeinfer.load(str(path), n_ctx=256, n_threads=1, max_batch=4) as e:
        assert e.info()["local_kv_cells"] == 19
        got = [e.generate(p, **greedy) for p in prompts]
    assert [c.tokens for c in got] == want
    assert got[1].stats.cached_tokens >= 60      # the window is intact: the prefix is reused
    assert got[2].stats.cached_tokens == 0       # the ring lost the window: recomputed


def test_llama_cpp_converter_output_loads(tiny, tmp_path):
    """Gemma 3 and Qwen3 files written by llama.cpp's own convert_hf_to_gguf.py load in edgeinfer
    and give the logits of ours. (The tiny Qwen3 tokenizer matches no pre-tokenizer hash in
    llama.cpp's table, so it is named, "qwen2", as convert_hf_to_gguf_update.py would add it.)"""
    from tests.support.llama_cpp_convert import convert
    for fam, pre, window in (("gemma3", None, 16), ("qwen3", "qwen2", 0)):
        d, files = tiny[fam]
        out = convert(d, tmp_path / f"{fam}.lcpp.gguf", "f32", tmp_path, pre=pre)
        with engine(out) as theirs_file, engine(files["f32"]) as ours_file:
            ids = theirs_file.tokenize(TEXT)
            assert ids == ours_file.tokenize(TEXT), fam
            assert theirs_file.info().get("sliding_window", 0) == window, fam
            np.testing.assert_allclose(theirs_file.logits(ids), ours_file.logits(ids), rtol=0, atol=1e-5,
                                       err_msg=fam)


def test_gemma_sized_spm_vocabulary_matches_llama_cpp(tiny, tmp_path):
    """Gemma's vocabulary size: the tiny gemma3 SentencePiece vocabulary (no dummy prefix, byte
    fallback, user-defined turn markers) grown to 262,144 entries with synthetic pieces of 2-4
    letters (with and without the word-start mark) and a few user-defined tags, as a vocab-only
    GGUF; our tokenizer against llama.cpp's on the hostile corpus."""
    import itertools
    from tests.test_tokenizer import FULL_CORPUS, SPM_CORPUS, compare_with_oracle, oracle_vocab, write_vocab_gguf

    from edgeinfer.text.tokenizer import Tokenizer
    with GGUFFile(tiny["gemma3"][1]["q8_0"]) as f:
        meta = {k: v for k, v in f.metadata.items() if k.startswith("tokenizer.ggml.")}
    tokens, scores = list(meta["tokenizer.ggml.tokens"]), [float(s) for s in meta["tokenizer.ggml.scores"]]
    tiny_tokens = list(tokens)
    types = [int(t) for t in meta["tokenizer.ggml.token_type"]]
    have = set(tokens)
    for tag in ("<h1>", "</h1>", "<start_of_image>", "<table>"):    # user-defined, as Gemma's tags
        tokens.append(tag), scores.append(0.0), types.append(4), have.add(tag)
    rng = np.random.default_rng(0)
    low = min(scores) - 1.0
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    for n in (2, 3, 4):
        for combo in itertools.product(letters, repeat=n):
            for piece in ("\u2581" + "".join(combo), "".join(combo)):
                if len(tokens) == 262144:
                    break
                if piece not in have:
                    tokens.append(piece), scores.append(low - n - float(rng.random())), types.append(1)
    assert len(tokens) == 262144
    meta.update({"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
                 "tokenizer.ggml.token_type": types})
    path = write_vocab_gguf(tmp_path / "gemma-262k.gguf", meta)
    tok = Tokenizer.from_metadata(meta)
    n_tiny = len(tiny_tokens)
    assert any(i >= n_tiny for i in tok.encode("the then them theme thesis", add_special=False))   # pieces used
    corpus = sorted(set(SPM_CORPUS + FULL_CORPUS)) + ["<h1>Title</h1> <table>", "the then them theme thesis"]
    ok, n, failures = compare_with_oracle(tok, oracle_vocab(path), corpus)
    print(f"\ngemma-sized SPM vocabulary (262,144 entries): {ok}/{n} tokenizations identical to llama.cpp")
    assert ok == n, "\n".join(failures)


@pytest.mark.slow
def test_every_quantization_type_agrees_with_llama_cpp(tiny, tmp_path):
    """Each output type of our converter, read by llama.cpp and by us: mean KL <= 0.01 and
    top-1 >= 90% on the same file (near-flat random logits make top-1 the looser figure).
    The tiny models' rows of 64 / 160 send the K-quants to their fallbacks (Q5_0, Q8_0 ...)."""
    for fam in FAMILIES:
        d = tiny[fam][0]
        for ft in ("f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k_m", "q5_k_m", "q6_k"):
            path = tmp_path / f"{fam}.{ft}.gguf"
            convert_checkpoint(str(d), str(path), ft)
            ids = llama_tokenize(path, TEXT)
            with engine(path) as e:
                ours = e.logits(ids)
            theirs = llama_logits(path, ids)
            kl = float(kl_divergence(theirs, ours).mean())
            top1 = float(np.mean(theirs.argmax(-1) == ours.argmax(-1)))
            print(f"\n{fam} {ft}: KL(llama.cpp || edgeinfer) {kl:.6f}, top-1 {top1:.3f}")
            assert kl <= 0.01 and top1 >= 0.9, (fam, ft, kl, top1)


def test_sharded_checkpoint_converts_to_the_same_file(tiny, tmp_path):
    """A checkpoint saved in several safetensors shards converts to the tensors of the single-file one."""
    import shutil
    for fam in FAMILIES:
        d, files = tiny[fam]
        sharded = tmp_path / fam
        m = tf.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)
        m.save_pretrained(sharded, max_shard_size="100KB")
        assert len(list(sharded.glob("*.safetensors"))) > 2 and (sharded / "model.safetensors.index.json").exists()
        for f in d.iterdir():
            if f.name.startswith("tokenizer"):
                shutil.copy(f, sharded / f.name)
        out = tmp_path / f"{fam}.sharded.gguf"
        convert_checkpoint(str(sharded), str(out), "f32")
        with GGUFFile(out) as a, GGUFFile(files["f32"]) as b:
            assert set(a.tensors) == set(b.tensors)
            for name, t in a.tensors.items():
                assert bytes(t.data) == bytes(b.tensors[name].data), (fam, name)


def test_gemma3_linear_rope_scaling_scales_the_global_layers_only(tiny, tmp_path):
    """Gemma 3 4B and up scale RoPE linearly (factor 8) on the global layers; the local layers keep
    base 10,000 unscaled (transformers' rope_parameters per layer type, llama.cpp's *_swa)."""
    import shutil
    d0 = tiny["gemma3"][0]
    cfg = tf.AutoConfig.from_pretrained(str(d0))
    cfg.rope_parameters = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                           "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    torch.manual_seed(3)
    m = tf.Gemma3ForCausalLM(cfg)
    d = tmp_path / "gemma3-linear"
    m.save_pretrained(d)
    for f in d0.iterdir():
        if f.name.startswith("tokenizer"):
            shutil.copy(f, d / f.name)
    out = tmp_path / "gemma3-linear.gguf"
    convert_checkpoint(str(d), str(out), "f32")
    with GGUFFile(out) as f:
        assert f.metadata["gemma3.rope.scaling.type"] == "linear"
    ids = llama_tokenize(out, TEXT)
    ref = hf_logits(d, ids)
    with engine(out) as e:
        ours = e.logits(ids)
    theirs = llama_logits(out, ids)
    o, t = float(np.abs(ours - ref).max()), float(np.abs(theirs - ref).max())
    print(f"\ngemma3 with linear RoPE scaling: max |logit - transformers|: edgeinfer {o:.2e}, llama.cpp {t:.2e}")
    assert o <= max(1e-3, 1.5 * t)
