"""LFM2 (short-conv + GQA hybrid) from checkpoint to tokens, on tiny random checkpoints of two
layouts (tests/support/tiny_checkpoints.py: GQA 2:1 and 4:1, conv and attention interleaved):

* our converter writes what llama.cpp's writes (the gguf package reads both: the same lfm2 keys
  and value types, the same tensors), also for a config.json whose feed-forward width the
  checkpoint adjusts (block_auto_adjust_ff_dim); each runtime loads the other's file;
* the float64 reference (edgeinfer/arch/reference.py) against transformers;
* F32 logits against transformers: no worse than llama.cpp's own difference on its file;
* Q8_0 and Q4_K_M against llama.cpp on the same file (KL, top-1 beyond near ties), and 32 greedy
  tokens identical to llama.cpp's on a trained tiny model;
* the recurrent state (prefix reuse, an n = 2 sibling, speculative rollback, a sliding ring, a
  skipped restore, the state's bytes): tests/test_states.py, over both hybrid families;
* bad input: an unknown layer_types entry, a conv weight that disagrees with shortconv.l_cache.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.support.strict import require

torch = require("torch")
tf = require("transformers")
llama_cpp = require("llama_cpp")
gguf = require("gguf")

import edgeinfer  # noqa: E402
from edgeinfer._native import ffi, lib  # noqa: E402
from edgeinfer.convert import convert_checkpoint  # noqa: E402
from edgeinfer.errors import ConversionError, GGUFError  # noqa: E402
from tests.support import tiny_checkpoints as tc  # noqa: E402
from tests.support.llama_cpp_convert import convert as llama_cpp_convert  # noqa: E402
from tests.support.llama_oracle import (Q8_0_TIE_GAP, greedy_differences, kl_divergence,  # noqa: E402
                                        llama_logits, top1_errors)

pytestmark = [pytest.mark.oracle]
torch.set_num_threads(1)

IDS = list(range(5, 45))
LAYOUTS = ("lfm2", "lfm2_gqa4")


@pytest.fixture(scope="module", params=LAYOUTS)
def lfm2(request, tmp_path_factory):
    """(checkpoint, {our f32 / q8_0 / q4_k_m files, llama.cpp's converter's f32 file: "lcpp"})."""
    d = tmp_path_factory.mktemp(request.param)
    src = tc.build(request.param, d / "hf")
    files = {ft: d / f"{ft}.gguf" for ft in ("f32", "q8_0", "q4_k_m")}
    for ft, path in files.items():
        convert_checkpoint(str(src), str(path), ft)
    files["lcpp"] = llama_cpp_convert(src, d / "lcpp.gguf", "f32", d / "tmp", pre="lfm2")
    return src, files


def _read(path):
    r = gguf.GGUFReader(str(path))
    kv = {k: (f.contents(), [gguf.GGUFValueType(t).name for t in f.types])
          for k, f in r.fields.items() if not k.startswith("GGUF.")}
    return kv, {t.name: (tuple(int(x) for x in t.shape), t.tensor_type.name, np.array(t.data)) for t in r.tensors}


def _assert_files_alike(ours, theirs):
    kv_a, t_a = _read(ours)
    kv_b, t_b = _read(theirs)
    assert sorted(t_a) == sorted(t_b)
    for name, (shape, ttype, data) in t_b.items():
        assert t_a[name][:2] == (shape, ttype), name
        np.testing.assert_array_equal(t_a[name][2], data, err_msg=name)
    for k in [k for k in kv_b if k.startswith("lfm2.")] + ["general.architecture", "tokenizer.ggml.pre",
                                                          "tokenizer.ggml.tokens", "tokenizer.ggml.merges"]:
        (a, ta), (b, tb) = kv_a.get(k, (None, None)), kv_b[k]
        assert ta == tb, (k, ta, tb)
        assert a == (pytest.approx(b, rel=1e-6) if isinstance(b, float) else b), k
    assert not [k for k in kv_a if k.startswith("lfm2.") and k not in kv_b]


def test_converter_writes_what_llama_cpp_writes(lfm2):
    _, files = lfm2
    _assert_files_alike(files["f32"], files["lcpp"])


def test_adjusted_feed_forward_width_as_llama_cpp_writes_it(lfm2, tmp_path):
    """block_auto_adjust_ff_dim: the blocks are 2/3 of intermediate_size, times the multiplier,
    rounded up to block_multiple_of (240 -> 160 here, the width the tensors have)."""
    src, _ = lfm2
    d = tmp_path / "adjusted"
    shutil.copytree(src, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(intermediate_size=240, block_auto_adjust_ff_dim=True, block_multiple_of=32,
               block_ffn_dim_multiplier=1.0)
    (d / "config.json").write_text(json.dumps(cfg))
    ours = convert_checkpoint(str(d), str(tmp_path / "ei.gguf"), "f32").path
    theirs = llama_cpp_convert(d, tmp_path / "lcpp.gguf", "f32", tmp_path / "tmp", pre="lfm2")
    _assert_files_alike(ours, theirs)
    assert _read(ours)[0]["lfm2.feed_forward_length"][0] == 160


def test_llama_cpp_runs_our_file_as_its_own(lfm2):
    _, files = lfm2
    np.testing.assert_array_equal(llama_logits(files["f32"], IDS), llama_logits(files["lcpp"], IDS))


def test_reference_matches_transformers(lfm2):
    from tests.support.reference_forward import ReferenceModel

    src, files = lfm2
    m = tf.AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float64).eval()
    with torch.no_grad():
        want = m(torch.tensor([IDS])).logits[0].numpy()
    got = ReferenceModel(files["f32"]).logits(IDS)
    # the file's float32 weights bound the agreement
    assert np.abs(got - want).max() < 2e-5 * max(1.0, np.abs(want).max())


def _transformers_logits(src) -> np.ndarray:
    m = tf.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    with torch.no_grad():
        return m(torch.tensor([IDS])).logits[0].numpy()


def test_f32_logits_match_transformers_as_llama_cpp_does(lfm2):
    src, files = lfm2
    ref = _transformers_logits(src)
    ours = np.abs(edgeinfer.load(str(files["lcpp"]), n_ctx=128).logits(IDS) - ref).max()
    theirs = np.abs(llama_logits(files["lcpp"], IDS) - ref).max()
    assert ours <= max(1.5 * theirs, 1e-3), (ours, theirs)


@pytest.mark.parametrize("ft", ["q8_0", "q4_k_m"])
def test_quantized_kl_and_top1_vs_llama_cpp(lfm2, ft):
    """Mean KL(llama.cpp || edgeinfer) <= 0.01 on the same file; no top token that llama.cpp
    puts beyond a near tie below its own (the tiny rows of 64 send Q4_K_M's K-quants to their
    fallbacks, as in llama.cpp)."""
    _, files = lfm2
    ids = [int(i) for i in np.random.default_rng(0).integers(3, 300, 80)]
    with edgeinfer.load(str(files[ft]), n_ctx=256, n_threads=2) as e:
        ours = e.logits(ids)
    theirs = llama_logits(files[ft], ids)
    kl = float(kl_divergence(theirs, ours).mean())
    wrong = top1_errors(theirs, ours, Q8_0_TIE_GAP)
    print(f"\nlfm2 {ft}: mean KL(llama.cpp || edgeinfer) {kl:.2e}, "
          f"top-1 {np.mean(theirs.argmax(-1) == ours.argmax(-1)):.3f}, wrong beyond a tie {wrong}")
    assert kl <= 0.01 and not wrong, (kl, wrong)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The lfm2 layout trained to continue a sequence (tiny_checkpoints.memorize), as Q8_0."""
    d = tmp_path_factory.mktemp("lfm2_trained")
    src = tc.build("lfm2", d / "hf")
    seq = tc.memorize(src)
    path = d / "q8_0.gguf"
    convert_checkpoint(str(src), str(path), "q8_0")
    return path, seq


def test_greedy_32_tokens_identical_to_llama_cpp(trained):
    path, seq = trained
    with edgeinfer.load(str(path), n_ctx=1024, n_threads=2) as e:
        diffs = greedy_differences(
            path, seq, lambda p, n: e.generate(p, max_tokens=n, temperature=0.0, ignore_eos=True).tokens)
    assert not diffs, diffs


N_NEW = 16


def _fresh(path, prompt, n_ctx: int = 128, **load) -> list[int]:
    with edgeinfer.load(str(path), n_ctx=n_ctx, n_threads=2, **load) as e:
        return e.generate(prompt, max_tokens=N_NEW, temperature=0, ignore_eos=True).tokens


# ----------------------------------------------------------------- bad input
def test_unknown_layer_type_is_named(lfm2, tmp_path):
    src, _ = lfm2
    d = tmp_path / "bad"
    shutil.copytree(src, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["layer_types"][1] = "sliding_attention"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match=r"layer_types entry 'sliding_attention'"):
        convert_checkpoint(str(d), str(tmp_path / "x.gguf"), "f32")


def test_conv_taps_disagreeing_with_l_cache_are_named(lfm2, tmp_path):
    """A file whose shortconv.l_cache says 4 taps while its conv weights hold 3."""
    _, files = lfm2
    r = gguf.GGUFReader(str(files["f32"]))
    w = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "lfm2")
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        val = 4 if k == "lfm2.shortconv.l_cache" else f.contents()
        vt = gguf.GGUFValueType(f.types[0])
        sub = gguf.GGUFValueType(f.types[-1]) if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(k, val, vt, sub_type=sub)
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match=r"lfm2\.shortconv\.l_cache"):
        edgeinfer.load(str(tmp_path / "bad.gguf"), n_ctx=64)


# ----------------------------------------------------------------- kernels
@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512", "neon"])
def test_conv1d_kernel_matches_numpy(isa):
    level = getattr(lib, "EI_ISA_" + isa.upper())
    if not lib.ei_isa_supported(level):
        pytest.skip(f"{isa} not on this CPU")
    rng = np.random.default_rng(0)
    K, ch, n = 3, 37, 5
    w = rng.standard_normal((K, ch)).astype(np.float32)
    state = rng.standard_normal((K - 1, ch)).astype(np.float32)
    x = rng.standard_normal((n, ch)).astype(np.float32)
    full = np.concatenate([state, x]).astype(np.float64)
    want = np.stack([(w * full[t:t + K]).sum(0) for t in range(n)])
    y = np.zeros((n, ch), np.float32)
    st = state.copy()
    f = lambda a: ffi.from_buffer("float[]", a)  # noqa: E731
    assert lib.ei_kernel_conv1d(level, f(w), K, ch, f(st), f(x), n, f(y)) == lib.EI_OK
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(st, full[-(K - 1):].astype(np.float32))
