"""Importance matrices: the weighted quantizers against ggml's own (`ggml_quantize_chunk`, the
function llama-quantize calls), the collected sums against transformers' activations, whole
files against llama.cpp's quantizer given the same matrix, llama-imatrix's two file formats,
bad files, the CLI, and on SmolLM2's real weights what the matrix buys in KL."""
from __future__ import annotations

import ctypes
import os
import struct

import numpy as np
import pytest
from tests.support.strict import require

torch = require("torch", "tiny checkpoints are built with torch")
require("transformers", "tiny checkpoints are built with transformers")
gguf = require("gguf", "gguf-py writes llama-imatrix's format independently of our writer")

from tests.support import tiny_checkpoints  # noqa: E402
from tests.support.llama_oracle import llama_quantize  # noqa: E402

from edgeinfer.convert import FILE_TYPES, Imatrix, compute_imatrix, convert_checkpoint  # noqa: E402
from edgeinfer.convert.converter import _imatrix_chunks, _open_source  # noqa: E402
from edgeinfer.convert.quantize import dequantize, quantize  # noqa: E402
from edgeinfer.errors import ConversionError, GGUFError  # noqa: E402
from edgeinfer.gguf import GGUFFile  # noqa: E402
from edgeinfer.gguf.types import GGMLType as T  # noqa: E402

torch.set_num_threads(1)

WEIGHTED = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K]
# the file types an importance matrix changes
FTYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q4_k_m", "q5_k_m", "q6_k")


def _ggml():
    llama_cpp = require("llama_cpp", "ggml's quantizers (llama-cpp-python) are the oracle")
    lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_init.argtypes = [ctypes.c_int]
    return lib


def _ggml_read_imatrix(path) -> tuple[dict, dict[str, np.ndarray]]:
    """The file as llama.cpp's common_imatrix_load reads it, through ggml's own GGUF reader:
    ({key: (gguf type, value)} for the three imatrix keys, {tensor name: float32 data})."""
    lib = _ggml()

    class Params(ctypes.Structure):
        _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.POINTER(ctypes.c_void_p))]

    for name, res, args in (
            ("gguf_init_from_file", ctypes.c_void_p, [ctypes.c_char_p, Params]),
            ("gguf_find_key", ctypes.c_int64, [ctypes.c_void_p, ctypes.c_char_p]),
            ("gguf_get_kv_type", ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64]),
            ("gguf_get_arr_type", ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64]),
            ("gguf_get_arr_n", ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_int64]),
            ("gguf_get_arr_str", ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t]),
            ("gguf_get_val_u32", ctypes.c_uint32, [ctypes.c_void_p, ctypes.c_int64]),
            ("gguf_free", None, [ctypes.c_void_p]),
            ("ggml_free", None, [ctypes.c_void_p]),
            ("ggml_get_first_tensor", ctypes.c_void_p, [ctypes.c_void_p]),
            ("ggml_get_next_tensor", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_void_p]),
            ("ggml_get_name", ctypes.c_char_p, [ctypes.c_void_p]),
            ("ggml_nelements", ctypes.c_int64, [ctypes.c_void_p]),
            ("ggml_get_data_f32", ctypes.POINTER(ctypes.c_float), [ctypes.c_void_p])):
        getattr(lib, name).restype, getattr(lib, name).argtypes = res, args
    ctx = ctypes.c_void_p()
    g = lib.gguf_init_from_file(str(path).encode(), Params(False, ctypes.pointer(ctx)))
    assert g, "ggml's GGUF reader refused the file"
    keys = {}
    for k in ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"):
        i = lib.gguf_find_key(g, k.encode())
        assert i >= 0, k
        t = lib.gguf_get_kv_type(g, i)
        if t == 9:      # GGUF_TYPE_ARRAY
            keys[k] = (t, lib.gguf_get_arr_type(g, i),
                       [lib.gguf_get_arr_str(g, i, j).decode() for j in range(lib.gguf_get_arr_n(g, i))])
        else:
            keys[k] = (t, lib.gguf_get_val_u32(g, i))
    tensors, t = {}, lib.ggml_get_first_tensor(ctx)
    while t:
        name = lib.ggml_get_name(t).decode()
        if name.endswith((".in_sum2", ".counts")):     # the loader's pairing (ggml adds a data blob)
            tensors[name] = np.ctypeslib.as_array(lib.ggml_get_data_f32(t),
                                                  shape=(lib.ggml_nelements(t),)).copy()
        t = lib.ggml_get_next_tensor(ctx, t)
    lib.gguf_free(g)
    lib.ggml_free(ctx)
    return keys, tensors


def _rows_and_importance(seed: int = 0, rows: int = 48, cols: int = 512):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * rng.uniform(0.005, 1.0, (rows, 1))).astype(np.float32)
    x[:, 7] *= 25                          # an outlier column, as real activations make them
    x[3] = 0                               # an all-zero row
    qw = rng.gamma(0.4, 1.0, cols).astype(np.float32)
    qw[100:140] = 0                        # columns calibration never touched
    return x, qw


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("imatrix")
    return {k: tiny_checkpoints.build(k, root / k) for k in ("llama_256", "phi3", "gemma3", "llama")}


@pytest.fixture(scope="module")
def llama256_imatrix(ckpts, tmp_path_factory):
    path = tmp_path_factory.mktemp("im") / "imatrix.gguf"
    compute_imatrix(str(ckpts["llama_256"]), str(path), chunk_size=128)
    return path


# ------------------------------------------------------------------ the quantizers
@pytest.mark.oracle
@pytest.mark.parametrize("qtype", WEIGHTED + [T.Q8_0], ids=lambda t: t.name)
def test_weighted_quantizers_are_ggml_bit_for_bit(qtype):
    lib = _ggml()
    x, qw = _rows_and_importance()
    ours = quantize(x, qtype, 2, importance=qw)
    ref = np.zeros_like(ours)
    lib.ggml_quantize_init(int(qtype))
    assert lib.ggml_quantize_chunk(int(qtype), x.ctypes.data, ref.ctypes.data, 0, x.shape[0], x.shape[1],
                                   qw.ctypes.data) == ref.nbytes
    assert np.array_equal(ours, ref)
    # Q8_0 ignores the importance in both; every other type must have used it
    assert np.array_equal(ours, quantize(x, qtype, 2)) == (qtype == T.Q8_0)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q5_1, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_importance_lowers_the_error_where_it_weighs(qtype):
    """With a skewed importance (a few columns matter most, as in real activations) the
    importance-weighted error drops: Q4_0 0.76x, Q5_1 0.52x, Q4_K 0.63x, Q6_K 0.86x here."""
    x, _ = _rows_and_importance(seed=1)
    qw = np.exp(2.5 * np.random.default_rng(5).standard_normal(x.shape[1])).astype(np.float32)
    err = {}
    for k, imp in (("plain", None), ("weighted", qw)):
        y = dequantize(quantize(x, qtype, 2, importance=imp), qtype, x.shape[1]).reshape(x.shape)
        err[k] = float(((x - y) ** 2 * qw).sum())
    assert err["weighted"] < 0.9 * err["plain"], err


def test_bad_importance_vectors_are_refused():
    x, qw = _rows_and_importance()
    with pytest.raises(Exception, match="importance vector of 511"):
        quantize(x, T.Q4_K, importance=qw[:511])
    for bad in (np.nan, np.inf, -1.0):
        q = qw.copy()
        q[5] = bad
        with pytest.raises(Exception, match="importance"):
            quantize(x, T.Q4_0, importance=q)


# ------------------------------------------------------------------ collecting
def _transformers_sums(ck, src, windows) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Per GGUF name, the summed squared inputs (float64) and token count of every nn.Linear
    in the Hugging Face model's blocks over the token windows."""
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(ck, torch_dtype=torch.float32).eval()
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}

    def hook(name):
        def pre(_mod, args):
            x = args[0].detach().double().reshape(-1, args[0].shape[-1]).numpy()
            sums[name] = sums.get(name, 0) + (x * x).sum(0)
            counts[name] = counts.get(name, 0) + x.shape[0]
        return pre

    perms = {}
    for mname, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and ".layers." in mname:
            gname = src.tmap.gguf_name(mname + ".weight")
            mod.register_forward_pre_hook(hook(gname))
            f = src.tmap.transform(mname + ".weight")
            if f is not None:       # the converter's reordering of the weight's columns (Qwen3.5's value heads)
                out_f, in_f = mod.weight.shape
                perms[gname] = f(np.tile(np.arange(in_f, dtype=np.float32), (out_f, 1)))[0].astype(int)
    with torch.no_grad():
        for w in windows:
            model(torch.tensor([w]))
    return {n: s[perms[n]] if n in perms else s for n, s in sums.items()}, counts


@pytest.mark.parametrize("kind", ["llama_256", "phi3", "gemma3"])
def test_collected_sums_are_transformers_activations(ckpts, kind, tmp_path):
    """Every block matmul's summed squared inputs, per column, equal those of the Hugging Face
    model's nn.Linear inputs on the same token windows (phi3: fused qkv / gate-up tensors)."""
    ck = ckpts[kind]
    im = compute_imatrix(str(ck), str(tmp_path / "im.gguf"), chunk_size=96, n_chunks=3)
    src = _open_source(str(ck), None)
    windows = _imatrix_chunks(src.tok_meta, None, 96, 3)
    sums, counts = _transformers_sums(ck, src, windows)
    assert sorted(im.sums) == sorted(sums) and len(sums) >= 4 * 2   # 2 layers of at least 4 matmuls
    for name, s in sums.items():
        assert im.counts[name].tolist() == [counts[name]] == [sum(map(len, windows))]
        np.testing.assert_allclose(im.sums[name][0], s, rtol=2e-4, atol=1e-6, err_msg=name)
    assert im.chunk_count == len(windows) == 3 and im.chunk_size == 96


@pytest.mark.parametrize("kind", ["llama_256", "llama_tied"])
def test_chunks_are_llama_imatrix_chunks(ckpts, kind, tmp_path):
    """llama-imatrix's cut (tools/imatrix/imatrix.cpp): the text tokenized once with the
    model's specials, full chunks only, each chunk's first token replaced by BOS when the
    model adds one; tokens from the checkpoint's own Hugging Face tokenizer."""
    import transformers as tf

    from edgeinfer.convert.sensitivity import default_calibration_text
    ck = ckpts[kind] if kind in ckpts else tiny_checkpoints.build(kind, tmp_path / kind)
    src = _open_source(str(ck), None)
    hf = tf.AutoTokenizer.from_pretrained(ck)
    tokens = hf(default_calibration_text()).input_ids
    adds_bos = tokens[0] == hf.bos_token_id
    assert adds_bos == (kind == "llama_256")
    c = 64
    expect = [tokens[i * c:(i + 1) * c] for i in range(len(tokens) // c)]
    for ch in expect:
        ch[0] = hf.bos_token_id if adds_bos else ch[0]
    assert _imatrix_chunks(src.tok_meta, None, c, None) == expect and len(expect) > 2
    assert _imatrix_chunks(src.tok_meta, None, c, 2) == expect[:2]


@pytest.mark.parametrize("kind", ["lfm2", "qwen35"])
def test_hybrids_collect_every_block_matmul(kind, tmp_path):
    """Hybrids: the recurrent mixers' projections (LFM2's short-convolution in/out, Qwen3.5's
    DeltaNet qkv / gate / beta / alpha / out) as well as attention and FFN, each equal to
    transformers' sums; the file converts with the matrix."""
    ck = tiny_checkpoints.build(kind, tmp_path / "hf")
    im = compute_imatrix(str(ck), str(tmp_path / "im.gguf"), chunk_size=64, n_chunks=2)
    src = _open_source(str(ck), None)
    sums, _ = _transformers_sums(ck, src, _imatrix_chunks(src.tok_meta, None, 64, 2))
    assert sorted(im.sums) == sorted(sums)
    assert any("shortconv" in n or "ssm_" in n for n in sums)
    for name in im.sums:
        np.testing.assert_allclose(im.sums[name][0], sums[name], rtol=2e-4, atol=1e-6, err_msg=name)
    convert_checkpoint(str(ck), str(tmp_path / "q.gguf"), "q4_k_m", imatrix=str(tmp_path / "im.gguf"))


@pytest.mark.oracle
@pytest.mark.parametrize("kind, pre", [("llama_256", "llama-bpe"), ("qwen35", "qwen2")])
def test_gguf_models_collect_transformers_activations(ckpts, kind, pre, tmp_path):
    """From a GGUF model, as llama-imatrix takes one: the F32 file llama.cpp's converter wrote,
    run by the reference forward from its tensors and cut by its own tokenizer, gives the Hugging
    Face model's sums."""
    from tests.support.llama_cpp_convert import convert as llama_cpp_convert
    require("llama_cpp", "llama.cpp's converter writes the GGUF")
    ck = ckpts[kind] if kind in ckpts else tiny_checkpoints.build(kind, tmp_path / "hf")
    gguf_path = llama_cpp_convert(ck, tmp_path / "f32.gguf", "f32", tmp_path, pre=pre)
    im = compute_imatrix(str(gguf_path), str(tmp_path / "im.gguf"), chunk_size=64, n_chunks=2)
    src = _open_source(str(ck), None)
    windows = _imatrix_chunks(src.tok_meta, None, 64, 2)
    with GGUFFile(gguf_path) as f:
        assert _imatrix_chunks(f.metadata, None, 64, 2) == windows
    sums, _ = _transformers_sums(ck, src, windows)
    assert sorted(im.sums) == sorted(sums)
    for name in im.sums:
        np.testing.assert_allclose(im.sums[name][0], sums[name], rtol=2e-4, atol=1e-6, err_msg=name)
    with pytest.raises(ConversionError, match="--lora merges into a checkpoint directory"):
        compute_imatrix(str(gguf_path), str(tmp_path / "x.gguf"), lora_dir=str(ck))
    with pytest.raises(ConversionError, match="no such checkpoint directory or GGUF file"):
        compute_imatrix(str(tmp_path / "nope"), str(tmp_path / "x.gguf"))
    with pytest.raises(GGUFError, match="is not a model"):
        compute_imatrix(str(tmp_path / "im.gguf"), str(tmp_path / "x.gguf"))
    assert not (tmp_path / "x.gguf").exists()


def test_gemma4_is_refused_clearly(tmp_path):
    from tests.support import tiny_gemma4

    ck = tiny_gemma4.build(tmp_path / "g4")
    with pytest.raises(ConversionError, match="table-driven reference forward"):
        compute_imatrix(str(ck), str(tmp_path / "im.gguf"), chunk_size=32, n_chunks=1)
    assert not (tmp_path / "im.gguf").exists()


# ------------------------------------------------------------------ whole files
def _llama_quantize(src, dst, ftype: int, im: Imatrix | None):
    require("llama_cpp", "llama.cpp's quantizer is the oracle")
    llama_quantize(src, dst, ftype, imatrix=im and {   # as llama-quantize hands it over: sums / count
        n: im.importance(n, im.sums[n].shape[1]) for n in im.sums})


@pytest.mark.oracle
@pytest.mark.parametrize("ftype", FTYPES)
def test_convert_with_imatrix_is_llama_quantize_byte_for_byte(ckpts, llama256_imatrix, tmp_path, ftype):
    ck = ckpts["llama_256"]
    convert_checkpoint(str(ck), str(tmp_path / "f32.gguf"), "f32")
    im = Imatrix.load(str(llama256_imatrix))
    _llama_quantize(tmp_path / "f32.gguf", tmp_path / "llama.gguf", FILE_TYPES[ftype].llama_ftype, im)
    convert_checkpoint(str(ck), str(tmp_path / "ours.gguf"), ftype, imatrix=str(llama256_imatrix))
    _llama_quantize(tmp_path / "f32.gguf", tmp_path / "plain.gguf", FILE_TYPES[ftype].llama_ftype, None)
    with (GGUFFile(tmp_path / "llama.gguf") as a, GGUFFile(tmp_path / "ours.gguf") as b,
          GGUFFile(tmp_path / "plain.gguf") as c):
        assert sorted(a.tensors) == sorted(b.tensors)
        for n, ta in a.tensors.items():
            assert (ta.type_name, bytes(ta.data)) == (b.tensors[n].type_name, bytes(b.tensors[n].data)), n
        assert any(bytes(ta.data) != bytes(c.tensors[n].data) for n, ta in a.tensors.items())
        if ftype in ("q4_0", "q5_0"):   # llama.cpp's guard: the first eighth's ffn_down one type up
            assert b.tensors["blk.0.ffn_down.weight"].type_name == ftype.upper().replace("_0", "_1")
            assert b.tensors["blk.1.ffn_down.weight"].type_name == ftype.upper()
        assert b.get("quantize.imatrix.entries_count") == len(im.sums)
        assert b.get("quantize.imatrix.chunks_count") == im.chunk_count
        assert b.get("quantize.imatrix.file") == str(llama256_imatrix)[:127]


@pytest.mark.oracle
def test_imatrix_files_are_llama_imatrix_format(llama256_imatrix, tmp_path):
    """Ours read by ggml's GGUF reader as llama.cpp's common_imatrix_load reads it (the three
    keys llama-quantize requires, F32 sums and counts); and the two formats llama-imatrix
    writes (GGUF with sums and counts, an entry with no tokens among them; legacy .dat with
    means times ncall), written here by gguf-py and by the layout in tools/imatrix/imatrix.cpp,
    give llama-quantize's weights."""
    im = Imatrix.load(str(llama256_imatrix))
    keys, tensors = _ggml_read_imatrix(llama256_imatrix)
    assert keys == {"imatrix.datasets": (9, 8, ["edgeinfer/convert/calibration.txt"]),   # ARRAY of STRING
                    "imatrix.chunk_count": (4, im.chunk_count), "imatrix.chunk_size": (4, 128)}  # UINT32
    assert sorted(tensors) == sorted(n + sfx for n in im.sums for sfx in (".in_sum2", ".counts"))
    for n in im.sums:
        np.testing.assert_array_equal(tensors[n + ".in_sum2"], im.sums[n][0])
        assert tensors[n + ".counts"].tolist() == im.counts[n].tolist() == [128 * im.chunk_count]

    rng = np.random.default_rng(0)
    s1, s2 = rng.uniform(0, 9, 64).astype(np.float32), rng.uniform(0, 9, 32).astype(np.float32)
    w = gguf.GGUFWriter(str(tmp_path / "theirs.gguf"), arch="llama")
    w.add_string("general.type", "imatrix")
    w.add_array("imatrix.datasets", ["wiki.train.raw"])
    w.add_uint32("imatrix.chunk_count", 7)
    w.add_uint32("imatrix.chunk_size", 512)
    w.add_tensor("blk.0.attn_q.weight.in_sum2", s1.reshape(1, 64))
    w.add_tensor("blk.0.attn_q.weight.counts", np.array([[3584.0]], np.float32))
    w.add_tensor("blk.0.ffn_down.weight.in_sum2", s2.reshape(1, 32))
    w.add_tensor("blk.0.ffn_down.weight.counts", np.array([[0.0]], np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    im = Imatrix.load(str(tmp_path / "theirs.gguf"))
    np.testing.assert_allclose(im.importance("blk.0.attn_q.weight", 64), s1 / 3584.0, rtol=1e-7)
    assert (im.importance("blk.0.ffn_down.weight", 32) == 1).all()     # no tokens: every column 1
    assert im.importance("blk.0.ffn_up.weight", 32) is None
    assert (im.datasets, im.chunk_count) == (["wiki.train.raw"], 7)
    assert im.metadata("x.gguf")[1] == ("quantize.imatrix.dataset", "wiki.train.raw", "STRING")

    dat = struct.pack("<i", 2)
    for name, vals, ncall in (("blk.0.attn_q.weight", s1, 5), ("output.weight", s2, 0)):
        dat += struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", ncall, vals.size)
        dat += vals.tobytes()
    dat += struct.pack("<i", 5) + struct.pack("<i", 8) + b"calib.tx"
    (tmp_path / "theirs.dat").write_bytes(dat)
    im = Imatrix.load(str(tmp_path / "theirs.dat"))
    np.testing.assert_allclose(im.importance("blk.0.attn_q.weight", 64), s1 / 5, rtol=1e-7)
    np.testing.assert_array_equal(im.importance("output.weight", 32), s2)     # ncall 0: as stored
    assert (im.datasets, im.chunk_count) == (["calib.tx"], 5)


def test_tensors_the_matrix_lacks_are_quantized_without(ckpts, llama256_imatrix, tmp_path):
    full = Imatrix.load(str(llama256_imatrix))
    one = "blk.0.ffn_down.weight"
    Imatrix({one: full.sums[one]}, {one: full.counts[one]}, ["x"], 1, 128).save(str(tmp_path / "one.gguf"))
    ck = str(ckpts["llama_256"])
    r = convert_checkpoint(ck, str(tmp_path / "part.gguf"), "q4_k_m", imatrix=str(tmp_path / "one.gguf"))
    assert any(n.startswith("the importance matrix weighted 1 of the 58 tensors") and "no entry for" in n
               for n in r.notes), r.notes
    convert_checkpoint(ck, str(tmp_path / "plain.gguf"), "q4_k_m")
    convert_checkpoint(ck, str(tmp_path / "full.gguf"), "q4_k_m", imatrix=str(llama256_imatrix))
    with (GGUFFile(tmp_path / "part.gguf") as a, GGUFFile(tmp_path / "plain.gguf") as b,
          GGUFFile(tmp_path / "full.gguf") as c):
        for n in a.tensors:
            assert bytes(a.tensors[n].data) == bytes((c if n == one else b).tensors[n].data), n


def _broken(tmp_path, llama256_imatrix):
    good = llama256_imatrix.read_bytes()
    cases = {
        "garbage": (b"\x07\x00\x00\x00not an imatrix", "neither GGUF nor a legacy .dat imatrix"),
        "empty": (b"", "ends inside the entry count"),
        "truncated_gguf": (good[:len(good) // 2], "not a valid GGUF"),
        "truncated_dat": (struct.pack("<ii", 1, 4) + b"blk.", "ends inside entry 0's counts"),
    }
    out = {}
    for name, (data, msg) in cases.items():
        (tmp_path / name).write_bytes(data)
        out[name] = (tmp_path / name, msg)
    for name, vals, cnt, msg in (("nan", np.array([1, np.nan], np.float32), [[4.0]], "non-finite"),
                                 ("negative", np.array([1, -2], np.float32), [[4.0]], "negative"),
                                 ("no_counts", np.array([1, 2], np.float32), None, "sums without counts")):
        w = gguf.GGUFWriter(str(tmp_path / name), arch="llama")
        w.add_string("general.type", "imatrix")
        w.add_tensor("blk.0.attn_q.weight.in_sum2", vals.reshape(1, -1))
        if cnt is not None:
            w.add_tensor("blk.0.attn_q.weight.counts", np.array(cnt, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        out[name] = (tmp_path / name, msg)
    return out


def test_bad_imatrix_files_are_clear_errors(ckpts, llama256_imatrix, tmp_path):
    for name, (path, msg) in _broken(tmp_path, llama256_imatrix).items():
        with pytest.raises(ConversionError, match=msg):
            Imatrix.load(str(path))
    with pytest.raises(ConversionError, match="cannot read the importance matrix"):
        Imatrix.load(str(tmp_path / "missing.gguf"))
    convert_checkpoint(str(ckpts["llama"]), str(tmp_path / "model.gguf"), "f32")
    with pytest.raises(ConversionError, match="not an importance matrix: its general.type is 'model'"):
        Imatrix.load(str(tmp_path / "model.gguf"))
    out = tmp_path / "out.gguf"
    with pytest.raises(ConversionError, match="made for another model"):     # rows of 64, not 256
        convert_checkpoint(str(ckpts["llama"]), str(out), "q4_k_m", imatrix=str(llama256_imatrix))
    (tmp_path / "short.txt").write_text("Too short for a chunk.")
    with pytest.raises(ConversionError, match="less than one chunk of 512"):
        compute_imatrix(str(ckpts["llama"]), str(tmp_path / "im.gguf"), str(tmp_path / "short.txt"))
    with pytest.raises(ConversionError, match="at least 16 tokens"):
        compute_imatrix(str(ckpts["llama"]), str(tmp_path / "im.gguf"), chunk_size=8)
    with pytest.raises(ConversionError, match="--chunks 0: at least 1"):
        compute_imatrix(str(ckpts["llama"]), str(tmp_path / "im.gguf"), n_chunks=0)
    # an entry of the wrong size: token_embd's skipped as llama-quantize skips it, any other refused
    odd = Imatrix({n: np.ones((1, 7), np.float32) for n in ("token_embd.weight", "blk.0.attn_q.weight")},
                  {n: np.ones(1, np.float32) for n in ("token_embd.weight", "blk.0.attn_q.weight")})
    assert odd.importance("token_embd.weight", 64) is None
    with pytest.raises(ConversionError, match="holds 7 values for 'blk.0.attn_q.weight'"):
        odd.importance("blk.0.attn_q.weight", 64)
    with pytest.raises(ConversionError, match="--imatrix goes with a fixed --type"):
        convert_checkpoint(str(ckpts["llama_256"]), str(out), "auto", target_bpw=5.0,
                           imatrix=str(llama256_imatrix))
    assert not out.exists()


@pytest.mark.oracle
def test_cli_collects_converts_and_llama_cpp_loads_it(ckpts, tmp_path):
    from typer.testing import CliRunner

    from edgeinfer.cli import app
    require("llama_cpp", "llama.cpp loads the converted file")
    ck, im, out = ckpts["llama_256"], tmp_path / "im.gguf", tmp_path / "m.gguf"
    r = CliRunner().invoke(app, ["imatrix", str(ck), "-o", str(im), "-q", "--chunk-size", "128"])
    assert r.exit_code == 0 and "56 tensors" in r.output, r.output
    r = CliRunner().invoke(app, ["convert", str(ck), "-o", str(out), "-q", "--type", "q4_k_m",
                                 "--imatrix", str(im)])
    assert r.exit_code == 0 and "the importance matrix weighted 56 of the 58 tensors" in r.output and "no entry for token_embd.weight, output.weight" in r.output, r.output
    from tests.support.llama_oracle import llama_logits, llama_tokenize
    ids = llama_tokenize(out, "hello there")
    logits = llama_logits(out, ids)
    assert logits.shape[0] == len(ids) > 1 and np.isfinite(logits).all()
    r = CliRunner().invoke(app, ["convert", str(ck), "-o", str(tmp_path / "x.gguf"), "-q",
                                 "--imatrix", str(tmp_path / "nope.gguf")])
    assert r.exit_code != 0 and "cannot read the importance matrix" in r.output, r.output


# ------------------------------------------------------------------ real weights
@pytest.mark.slow
def test_smollm2_imatrix_lowers_kl(smollm2_path, tmp_path):
    """SmolLM2-135M rebuilt from its Q4_1 GGUF, its importance matrix collected on the shipped
    calibration text: Q4_0 and Q4_K_M quantized with it lose less (KL against the F32
    conversion on a text the calibration does not contain; full figures in
    docs/quantization.md)."""
    from edgeinfer.tools.eval import evaluate
    from tests.support.texts import TEXTS
    src = tiny_checkpoints.build_from_gguf(smollm2_path, tmp_path / "smol")
    ref = tmp_path / "f32.gguf"
    convert_checkpoint(str(src), str(ref), "f32")
    compute_imatrix(str(src), str(tmp_path / "im.gguf"))
    kl = {}
    for t in ("q4_0", "q4_k_m"):
        for k, imx in (("plain", None), ("imatrix", str(tmp_path / "im.gguf"))):
            f = convert_checkpoint(str(src), str(tmp_path / f"{k}.{t}.gguf"), t, n_threads=2, imatrix=imx)
            kl[k, t] = evaluate(f.path, str(ref), TEXTS["technical"], ctx=256, max_tokens=255,
                                n_threads=2).kl_mean
    print(kl)
    for t in ("q4_0", "q4_k_m"):
        assert kl["imatrix", t] < 0.85 * kl["plain", t], kl
