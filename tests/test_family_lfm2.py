"""LFM2 (short-conv + GQA hybrid) end to end: llama.cpp's F32 file of a tiny random checkpoint
against transformers (no worse than llama.cpp itself), the conv kernel of every ISA against
numpy, and the recurrent state through prefix reuse against a fresh engine."""
from __future__ import annotations

import numpy as np
import pytest

from tests.support.strict import require

torch = require("torch")
tf = require("transformers")
llama_cpp = require("llama_cpp")

from edgeinfer._native import ffi, lib  # noqa: E402

IDS = list(range(5, 45))


@pytest.fixture(scope="module", params=["lfm2", "lfm2_gqa4"])
def lfm2(request, tmp_path_factory):
    from tests.support import tiny_checkpoints as tc
    from tests.support.llama_cpp_convert import convert

    d = tmp_path_factory.mktemp(request.param)
    src = tc.build(request.param, d / "hf")
    return src, convert(src, d / "f32.gguf", "f32", d / "tmp", pre="lfm2")


def _transformers_logits(src) -> np.ndarray:
    m = tf.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    with torch.no_grad():
        return m(torch.tensor([IDS])).logits[0].numpy()


def _llama_logits(gguf) -> np.ndarray:
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=128, logits_all=True, verbose=False, n_threads=2)
    llm.eval(IDS)
    return np.array(llm.scores[:len(IDS)], dtype=np.float32)


def test_f32_logits_match_transformers_as_llama_cpp_does(lfm2):
    import edgeinfer

    src, gguf = lfm2
    ref = _transformers_logits(src)
    ours = np.abs(edgeinfer.load(str(gguf), n_ctx=128).logits(IDS) - ref).max()
    theirs = np.abs(_llama_logits(gguf) - ref).max()
    assert ours <= max(1.5 * theirs, 1e-3), (ours, theirs)


def test_prefix_reuse_gives_a_fresh_engines_tokens(lfm2):
    """The second prompt extends the first: the engine resumes from the state kept at the
    first prompt's end, and must give a fresh engine's greedy tokens."""
    import edgeinfer

    _, gguf = lfm2
    first, second = IDS[:20], IDS[:20] + [7, 9, 11, 13]
    fresh = edgeinfer.load(str(gguf), n_ctx=128).generate(second, max_tokens=12, temperature=0).text
    eng = edgeinfer.load(str(gguf), n_ctx=128)
    eng.generate(first, max_tokens=6, temperature=0)
    assert eng.generate(second, max_tokens=12, temperature=0).text == fresh


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
