"""Native quantizers (native/src/quantize.c): legacy types bit-exact with gguf.quants,
K-quants as accurate as llama.cpp's quantizer on the same tensors, and the q4_k_m / q*_0
recipes choosing the same per-tensor types as llama.cpp's llama_model_quantize."""
from __future__ import annotations


import numpy as np
import pytest
from tests.support.llama_oracle import llama_quantize
from tests.support.synth_gguf import synth_llama_gguf
from tests.support.strict import require

from edgeinfer.convert.quantize import can_quantize, quantize, row_nbytes
from edgeinfer.convert.recipe import FILE_TYPES, Recipe, parse_keep, use_more_bits
from edgeinfer.errors import ConversionError, EdgeInferError, NativeError
from edgeinfer.gguf import GGUFFile
from edgeinfer.gguf.types import GGMLType as T

gguf = require("gguf", "the gguf package is the quantization oracle")
GQ = gguf.GGMLQuantizationType


def _samples():
    rng = np.random.default_rng(1234)
    out = {
        "normal": rng.standard_normal((48, 512)).astype(np.float32),
        "weights": (rng.standard_normal((32, 256)) * 0.02).astype(np.float32),
        "heavy_tail": (rng.standard_t(2, (32, 512)) * 0.05).astype(np.float32),
        "positive": np.abs(rng.standard_normal((16, 256))).astype(np.float32),
        "negative": -np.abs(rng.standard_normal((16, 256))).astype(np.float32),
        "tiny": (rng.standard_normal((8, 256)) * 1e-6).astype(np.float32),
        "huge": (rng.standard_normal((8, 256)) * 1e4).astype(np.float32),
        "grid": (rng.integers(-8, 8, (16, 256)) * 0.25).astype(np.float32),
        "zeros": np.zeros((4, 256), np.float32),
    }
    s = out["grid"].copy()
    s[:, 7] = -s[:, 3]            # equal magnitudes of both signs in one block
    out["ties"] = s
    c = np.zeros((4, 256), np.float32)
    c[0] = 0.5
    c[1, 17] = -3.0
    c[2, ::2] = 1.0
    out["sparse_const"] = c
    return out


SAMPLES = _samples()
EXACT = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.F16, T.BF16]


@pytest.mark.parametrize("qtype", EXACT, ids=lambda t: t.name)
def test_bit_exact_with_gguf_quants(qtype):
    bad = {}
    for sample, x in sorted(SAMPLES.items()):
        ours = quantize(x, qtype)
        ref = gguf.quants.quantize(x, GQ(int(qtype))).view(np.uint8).reshape(ours.shape)
        mismatch = np.argwhere(ours != ref)
        if mismatch.size:
            bad[sample] = mismatch[0].tolist()
    assert not bad, f"samples with differing bytes, first (row, col) of each: {bad}"


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_0, T.Q4_0], ids=lambda t: t.name)
def test_roundtrip_error_is_small(qtype):
    x = SAMPLES["normal"]
    y = gguf.quants.dequantize(quantize(x, qtype), GQ(int(qtype)))
    nmse = float(np.mean((y - x) ** 2) / np.mean(x ** 2))
    limit = {T.Q4_K: 0.01, T.Q5_K: 0.003, T.Q6_K: 0.001, T.Q8_0: 1e-4, T.Q4_0: 0.015}[qtype]
    assert nmse < limit
    z = gguf.quants.dequantize(quantize(SAMPLES["zeros"], qtype), GQ(int(qtype)))
    assert np.all(z == 0)


def test_threads_do_not_change_bytes():
    x = np.random.default_rng(5).standard_normal((300, 512)).astype(np.float32)
    for qt in (T.Q4_K, T.Q6_K, T.Q4_0):
        assert np.array_equal(quantize(x, qt, n_threads=1), quantize(x, qt, n_threads=4))


def test_bad_arguments():
    assert row_nbytes(T.Q4_K, 512) == 2 * 144
    assert not can_quantize(T.Q4_K, 96) and can_quantize(T.Q8_0, 96)
    with pytest.raises(EdgeInferError):
        quantize(np.zeros((2, 96), np.float32), T.Q4_K)     # rows not a multiple of 256
    with pytest.raises(EdgeInferError):
        quantize(np.zeros((2, 64), np.float32), T.IQ2_XXS)  # unsupported type
    with pytest.raises(EdgeInferError, match="C-contiguous uint8 array of shape"):
        quantize(np.zeros((2, 64), np.float32), T.Q8_0, out=np.empty((2, 64), np.uint8))
    from edgeinfer._native import check, ffi, lib
    out = ffi.new("int64_t *")
    with pytest.raises(NativeError):
        check(lib.ei_quantize_row_bytes(int(T.Q4_K), 100, out))
    with pytest.raises(NativeError):
        check(lib.ei_quantize_rows(int(T.Q8_0), ffi.NULL, ffi.NULL, 1, 32, ffi.NULL, 1))


# ------------------------------------------------------------------ llama.cpp comparisons
def _llama_quantize(src, dst, ftype: int, pure: bool):
    require("llama_cpp", "llama.cpp is the K-quant oracle")
    llama_quantize(src, dst, ftype, pure)


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    d = tmp_path_factory.mktemp("synth")
    return d, synth_llama_gguf(d / "f32.gguf")


@pytest.mark.oracle
@pytest.mark.parametrize("qtype,ftype", [(T.Q4_K, 15), (T.Q5_K, 17), (T.Q6_K, 18)],
                         ids=["Q4_K", "Q5_K", "Q6_K"])
def test_kquant_rmse_within_5pct_of_llama_cpp(synth, qtype, ftype):
    d, tensors = synth
    out = d / f"{qtype.name}.gguf"
    _llama_quantize(d / "f32.gguf", out, ftype, pure=True)
    with GGUFFile(out) as f:
        for name, x in tensors.items():
            if x.ndim < 2:
                continue
            ti = f.tensors[name]
            assert ti.type == qtype
            ref = gguf.quants.dequantize(np.array(ti.data).reshape(x.shape[0], -1), GQ(int(qtype)))
            ours = gguf.quants.dequantize(quantize(x, qtype), GQ(int(qtype)))
            rmse_ref = float(np.sqrt(np.mean((ref - x) ** 2)))
            rmse_ours = float(np.sqrt(np.mean((ours - x) ** 2)))
            assert rmse_ours <= 1.05 * rmse_ref, (name, rmse_ours, rmse_ref)


# llama.cpp's LLAMA_FTYPE ids for the file types we share
_FTYPES = {n: FILE_TYPES[n].llama_ftype for n in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k_m",
                                                 "q5_k_m", "q6_k")}


@pytest.mark.slow
@pytest.mark.oracle
@pytest.mark.parametrize("shape", [(256, 512, 8, False), (192, 320, 10, True)],
                         ids=["rows256_untied", "rows192_tied"])
def test_recipe_matches_llama_cpp(tmp_path, shape):
    n_embd, n_ff, n_layer, tied = shape
    tensors = synth_llama_gguf(tmp_path / "f32.gguf", n_embd=n_embd, n_ff=n_ff, n_layer=n_layer,
                           n_vocab=256, tied=tied)
    for name, ftype in _FTYPES.items():
        out = tmp_path / f"{name}.gguf"
        _llama_quantize(tmp_path / "f32.gguf", out, ftype, pure=False)
        recipe = Recipe(FILE_TYPES[name], n_layer, has_output=not tied)
        with GGUFFile(out) as f:
            assert f.get("general.file_type") == FILE_TYPES[name].llama_ftype
            for tname, x in tensors.items():
                want = f.tensors[tname].type
                got = recipe.choose(tname, x.shape[::-1])
                assert got == want, f"{name} {tname}: ours {got.name}, llama.cpp {T(want).name}"
        out.unlink()


@pytest.mark.oracle
@pytest.mark.parametrize("kind", ["phi3", "qwen35", "lfm2", "gemma4"])
def test_recipe_matches_llama_cpp_on_fused_and_hybrid_models(tmp_path, kind):
    """Every tensor's type as llama.cpp's quantizer picks it: the _M recipes' attention-V-like
    tensors (Phi-3's fused attn_qkv among them; in hybrids, Qwen3.5's DeltaNet attn_qkv and
    LFM2's attention layers between short convolutions, counted among themselves, not by
    block index), ffn_down over every block including Qwen3.5's MTP block, and Gemma 4's
    per-layer input projection left unquantized."""
    require("torch", "tiny checkpoints are built with torch")
    require("transformers", "tiny checkpoints are built with transformers")
    from edgeinfer.convert import convert_checkpoint
    from tests.support import tiny_checkpoints, tiny_gemma4

    ck = (tiny_gemma4.build(tmp_path / "hf") if kind == "gemma4"
          else tiny_checkpoints.build(kind, tmp_path / "hf"))
    convert_checkpoint(str(ck), str(tmp_path / "f32.gguf"), "f32")
    for name in ("q4_k_m", "q5_k_m", "q4_0"):
        _llama_quantize(tmp_path / "f32.gguf", tmp_path / "llama.gguf", _FTYPES[name], pure=False)
        r = convert_checkpoint(str(ck), str(tmp_path / "ours.gguf"), name)
        with GGUFFile(tmp_path / "llama.gguf") as f:
            want = {n: T(t.type).name for n, t in f.tensors.items()}
        assert r.tensor_types == want, {n: (r.tensor_types[n], w) for n, w in want.items()
                                        if r.tensor_types.get(n) != w}


def test_use_more_bits_and_keep():
    n = 32
    more = [i for i in range(n) if use_more_bits(i, n)]
    assert more[:4] == [0, 1, 2, 3] and more[-4:] == [28, 29, 30, 31] and 6 in more and 5 not in more
    r = Recipe(FILE_TYPES["q4_k_m"], n, True, parse_keep(["blk.0.*=q8_0", "output.weight=f16"]))
    assert r.choose("blk.0.ffn_up.weight", (256, 512)) == T.Q8_0
    assert r.choose("output.weight", (256, 1000)) == T.F16
    assert r.choose("blk.5.attn_v.weight", (256, 256)) == T.Q4_K
    assert r.choose("blk.6.attn_v.weight", (256, 256)) == T.Q6_K
    assert r.choose("blk.6.attn_q.weight", (576, 576)) == T.Q5_0     # fallback
    assert r.choose("blk.6.attn_norm.weight", (256,)) == T.F32
    assert not r.unused_keeps()
    for bad in (["nonsense"], ["x=q3_k"], ["=q8_0"]):
        with pytest.raises(ConversionError):
            parse_keep(bad)
    with pytest.raises(ConversionError):
        Recipe(FILE_TYPES["q4_0"], 2, True, parse_keep(["blk.*=q4_k"])).choose(
            "blk.0.attn_q.weight", (64, 64))
