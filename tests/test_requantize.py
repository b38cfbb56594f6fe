"""`edgeinfer quantize` (GGUF -> GGUF): the files llama.cpp's converter writes, quantized by us,
are byte for byte the files llama.cpp's quantizer (llama_model_quantize, what llama-quantize
runs) writes from them: every file type, every family, requantized sources (real SmolLM2
weights among them), with an importance matrix; bad input is a clear error."""
from __future__ import annotations

import numpy as np
import pytest
from tests.support.strict import require

require("torch", "tiny checkpoints are built with torch")
require("transformers", "tiny checkpoints are built with transformers")

from tests.support import tiny_checkpoints, tiny_gemma4  # noqa: E402
from tests.support.llama_cpp_convert import convert as llama_cpp_convert  # noqa: E402
from tests.support.llama_oracle import llama_quantize  # noqa: E402
from tests.support.synth_gguf import synth_llama_gguf  # noqa: E402

from edgeinfer.convert import FILE_TYPES, Imatrix, compute_imatrix, quantize_gguf  # noqa: E402
from edgeinfer.errors import ConversionError, GGUFError  # noqa: E402
from edgeinfer.errors import UnsupportedArchitectureError  # noqa: E402
from edgeinfer.gguf import GGUFFile  # noqa: E402
from edgeinfer.gguf.types import GGUFValueType  # noqa: E402
from edgeinfer.gguf.writer import GGUFWriter  # noqa: E402

pytestmark = pytest.mark.oracle
# the pre-tokenizer of each tiny tokenizer, which llama.cpp's converter cannot recognise by hash
_PRE = {"llama_256": "llama-bpe", "qwen35": "qwen2", "lfm2": "lfm2", "phi3": None, "gemma3": None,
        "gemma4": None, "smollm3": "llama-bpe"}


def _llama_cpp_f16(kind: str, root) -> tuple:
    """Tiny checkpoint `kind` and the F16 GGUF llama.cpp's converter writes from it."""
    require("llama_cpp", "llama.cpp's converter and quantizer are the oracles")
    root.mkdir(parents=True, exist_ok=True)
    ck = (tiny_gemma4.build(root / "hf") if kind == "gemma4"
          else tiny_checkpoints.build(kind, root / "hf"))
    return ck, llama_cpp_convert(ck, root / "f16.gguf", "f16", root, pre=_PRE[kind])


@pytest.fixture(scope="module")
def llama256(tmp_path_factory):
    return _llama_cpp_f16("llama_256", tmp_path_factory.mktemp("rq"))


def _same_as_llama_quantize(src, tmp_path, ftype: str, **kw) -> None:
    llama_quantize(src, tmp_path / "llama.gguf", FILE_TYPES[ftype].llama_ftype,
                   allow_requantize=kw.get("allow_requantize", False))
    quantize_gguf(str(src), str(tmp_path / "ours.gguf"), ftype, **kw)
    assert (tmp_path / "ours.gguf").read_bytes() == (tmp_path / "llama.gguf").read_bytes()


@pytest.mark.parametrize("ftype", list(FILE_TYPES))
def test_file_types_are_llama_quantize_byte_for_byte(llama256, tmp_path, ftype):
    _same_as_llama_quantize(llama256[1], tmp_path, ftype)


def test_bf16_source_is_llama_quantize_byte_for_byte(llama256, tmp_path):
    bf16 = llama_cpp_convert(llama256[0], tmp_path / "bf16.gguf", "bf16", tmp_path, pre=_PRE["llama_256"])
    _same_as_llama_quantize(bf16, tmp_path, "q4_k_m")


@pytest.mark.parametrize("kind", ["qwen35", "lfm2", "phi3", "gemma3", "gemma4", "smollm3"])
def test_every_family_is_llama_quantize_byte_for_byte(tmp_path, kind):
    """Fused QKV (Phi-3), hybrids' recurrent layers (Qwen3.5, LFM2: conv taps left alone, the
    attention-V-like tensors counted among themselves), Gemma 4's per-layer tensors."""
    _, src = _llama_cpp_f16(kind, tmp_path / "in")
    _same_as_llama_quantize(src, tmp_path, "q4_k_m")


@pytest.mark.parametrize("n_head_kv", [1, 4], ids=["gqa", "mha"])
def test_70b_class_is_llama_quantize_byte_for_byte(tmp_path, n_head_kv):
    """llama.cpp's one rule by model size: an 80-layer Llama with grouped-query attention (the
    70B) gets Q5_K for the attn_v that q4_k_m leaves at Q4_K; with as many K/V heads as query
    heads (the 65B) it does not."""
    synth_llama_gguf(tmp_path / "f32.gguf", n_embd=256, n_ff=256, n_layer=80, n_head_kv=n_head_kv)
    _same_as_llama_quantize(tmp_path / "f32.gguf", tmp_path, "q4_k_m")
    with GGUFFile(tmp_path / "ours.gguf") as f:
        assert f.tensors["blk.20.attn_v.weight"].type_name == ("Q5_K" if n_head_kv == 1 else "Q4_K")


def test_tied_per_layer_embeddings_quantized_as_the_head(tmp_path):
    """With tied embeddings llama.cpp quantizes Gemma's per-layer token embedding table as the
    head, like token_embd (Q6_K for rows of 256s)."""
    synth_llama_gguf(tmp_path / "f32.gguf", tied=True, extra=[("per_layer_token_embd.weight", 256, 512)])
    _same_as_llama_quantize(tmp_path / "f32.gguf", tmp_path, "q4_k_m")
    with GGUFFile(tmp_path / "ours.gguf") as f:
        assert f.tensors["per_layer_token_embd.weight"].type_name == "Q6_K"


def test_metadata_keeps_its_place_and_old_imatrix_keys_are_replaced(llama256, tmp_path):
    """general.alignment stays where the source has it; a source quantized with an importance
    matrix (its quantize.imatrix.* keys) quantized again with another gets the new keys, last,
    as llama-quantize sets them."""
    ck, src = llama256
    compute_imatrix(str(ck), str(tmp_path / "a.gguf"), chunk_size=128)
    compute_imatrix(str(ck), str(tmp_path / "b.gguf"), chunk_size=64)
    with GGUFFile(src) as f:
        keys = list(f.keys())
    with_alignment = tmp_path / "aligned.gguf"
    with GGUFWriter(with_alignment) as w, GGUFFile(src) as f:
        for k in keys:
            w.add_kv(k, f.metadata[k], *f.field_type(k))
            if k == "general.architecture":
                w.add_kv("general.alignment", 32, GGUFValueType.UINT32)
        for t in f.tensors.values():
            w.add_tensor_info(t.name, t.shape, t.type)
        w.write_header()
        for t in f.tensors.values():
            w.write_tensor_data(t.name, t.data)
    _same_as_llama_quantize(with_alignment, tmp_path, "q8_0")
    quantize_gguf(str(src), str(tmp_path / "q8.gguf"), "q8_0", imatrix=str(tmp_path / "a.gguf"))
    quantize_gguf(str(tmp_path / "q8.gguf"), str(tmp_path / "q4.gguf"), "q4_k_m",
                  imatrix=str(tmp_path / "b.gguf"), allow_requantize=True)
    with GGUFFile(tmp_path / "q4.gguf") as f:
        assert list(f.keys())[-6:] == ["general.quantization_version", "general.file_type",
                                       "quantize.imatrix.file", "quantize.imatrix.dataset",
                                       "quantize.imatrix.entries_count", "quantize.imatrix.chunks_count"]
        assert f.get("quantize.imatrix.file") == str(tmp_path / "b.gguf")
        assert f.get("quantize.imatrix.chunks_count") == Imatrix.load(str(tmp_path / "b.gguf")).chunk_count


# llama.cpp's file types of the sources: ours, and the smaller ones edgeinfer reads but does not write
_SOURCE_FTYPES = {"q4_k_m": FILE_TYPES["q4_k_m"].llama_ftype, "q5_k_m": FILE_TYPES["q5_k_m"].llama_ftype,
                  "q8_0": FILE_TYPES["q8_0"].llama_ftype, "q2_k": 10, "q3_k_m": 12, "iq4_nl": 25, "iq4_xs": 30}


@pytest.mark.parametrize("source, ftype", [("q4_k_m", "q4_0"), ("q5_k_m", "q4_0"), ("q8_0", "q4_k_m"),
                                           ("q2_k", "q4_0"), ("q3_k_m", "q4_0"), ("iq4_nl", "q4_k_m"),
                                           ("iq4_xs", "q4_k_m")])
def test_requantizing_is_refused_unless_allowed_then_llama_quantize_byte_for_byte(llama256, tmp_path,
                                                                                 source, ftype):
    quantized = tmp_path / f"{source}.gguf"
    llama_quantize(llama256[1], quantized, _SOURCE_FTYPES[source])
    with pytest.raises(ConversionError, match="already quantized.*--allow-requantize"):
        quantize_gguf(str(quantized), str(tmp_path / "x.gguf"), ftype)
    assert not (tmp_path / "x.gguf").exists()
    _same_as_llama_quantize(quantized, tmp_path, ftype, allow_requantize=True)


@pytest.mark.parametrize("ftype", ["q4_k_m", "q4_0"])
def test_smollm2_real_weights_requantized_as_llama_quantize(smollm2_path, tmp_path, ftype):
    """The real Q4_1 file (rows of 576: the K-quants' fallback types) to another type."""
    require("llama_cpp", "llama.cpp's quantizer is the oracle")
    _same_as_llama_quantize(smollm2_path, tmp_path, ftype, allow_requantize=True)


def test_imatrix_weights_the_tensors_as_in_llama_quantize(llama256, tmp_path):
    ck, src = llama256
    im_path = tmp_path / "imatrix.gguf"
    compute_imatrix(str(ck), str(im_path), chunk_size=128)
    im = Imatrix.load(str(im_path))
    llama_quantize(src, tmp_path / "llama.gguf", FILE_TYPES["q4_k_m"].llama_ftype,
                   imatrix={n: im.importance(n, im.sums[n].shape[1]) for n in im.sums})
    r = quantize_gguf(str(src), str(tmp_path / "ours.gguf"), "q4_k_m", imatrix=str(im_path))
    assert r.notes == ["the importance matrix weighted 56 of the 58 tensors whose type uses one; "
                       "it has no entry for output.weight, token_embd.weight"]
    quantize_gguf(str(src), str(tmp_path / "plain.gguf"), "q4_k_m")
    with (GGUFFile(tmp_path / "llama.gguf") as a, GGUFFile(tmp_path / "ours.gguf") as b,
          GGUFFile(tmp_path / "plain.gguf") as c):
        assert list(a.tensors) == list(b.tensors)
        for n, ta in a.tensors.items():
            assert (ta.type, bytes(ta.data)) == (b.tensors[n].type, bytes(b.tensors[n].data)), n
        assert bytes(b.tensors["blk.0.ffn_up.weight"].data) != bytes(c.tensors["blk.0.ffn_up.weight"].data)
        # llama-quantize's own keys on top of what llama_model_quantize copies
        imatrix_keys = {k: b.get(k) for k in b.keys() if k.startswith("quantize.imatrix.")}
        assert imatrix_keys == {"quantize.imatrix.file": str(im_path)[:127],
                                "quantize.imatrix.dataset": im.datasets[0][:127],
                                "quantize.imatrix.entries_count": len(im.sums),
                                "quantize.imatrix.chunks_count": im.chunk_count}
        assert [k for k in b.keys() if k not in imatrix_keys] == list(a.keys())


def _tiny_gguf(path, **kv) -> None:
    with GGUFWriter(path) as w:
        for k, v in kv.items():
            w.add_kv(k.replace("__", "."), v, GGUFValueType.UINT16 if k == "split__count" else None)
        w.add_tensor_info("token_embd.weight", (32, 4), 1)
        w.write_header()
        w.write_tensor_data("token_embd.weight", np.zeros(128, np.float16))


def test_bad_inputs_are_clear_errors(llama256, tmp_path):
    ck, src = llama256
    out, before = tmp_path / "out.gguf", src.read_bytes()
    compute_imatrix(str(ck), str(tmp_path / "im.gguf"), chunk_size=128)
    with pytest.raises(GGUFError, match="is not a model: its general.type is 'imatrix'"):
        quantize_gguf(str(tmp_path / "im.gguf"), str(out))
    _tiny_gguf(tmp_path / "split.gguf", general__architecture="llama", split__count=3)
    with pytest.raises(ConversionError, match="one part of a split model"):
        quantize_gguf(str(tmp_path / "split.gguf"), str(out))
    _tiny_gguf(tmp_path / "mamba.gguf", general__architecture="mamba")
    with pytest.raises(UnsupportedArchitectureError, match="'mamba'"):
        quantize_gguf(str(tmp_path / "mamba.gguf"), str(out))
    with pytest.raises(ConversionError, match="is the input file"):
        quantize_gguf(str(src), str(src))
    with pytest.raises(ConversionError, match="convert --type auto"):
        quantize_gguf(str(src), str(out), "auto")
    with pytest.raises(ConversionError, match="unknown output type 'q3_k'"):
        quantize_gguf(str(src), str(out), "q3_k")
    with pytest.raises(ConversionError, match=r"--keep pattern\(s\) blk.99.\* match no tensor"):
        quantize_gguf(str(src), str(out), keep=["blk.99.*=q8_0"])
    llama_quantize(src, tmp_path / "iq3_s.gguf", 26)      # LLAMA_FTYPE_MOSTLY_IQ3_S
    with pytest.raises(ConversionError, match="is IQ3_S, which edgeinfer cannot read"):
        quantize_gguf(str(tmp_path / "iq3_s.gguf"), str(out), "q4_0", allow_requantize=True)
    with GGUFFile(src) as f:
        t = f.tensors["blk.3.ffn_up.weight"]
        offset = t.offset
    broken = bytearray(src.read_bytes())
    broken[offset + 2:offset + 4] = np.array([np.nan], np.float16).tobytes()
    (tmp_path / "nan.gguf").write_bytes(bytes(broken))
    with pytest.raises(ConversionError, match="'blk.3.ffn_up.weight' holds NaN"):
        quantize_gguf(str(tmp_path / "nan.gguf"), str(out))
    with GGUFFile(src) as f:
        norm = f.tensors["blk.0.attn_norm.weight"].offset      # F32, copied unchanged
    broken = bytearray(src.read_bytes())
    broken[norm:norm + 4] = np.array([np.inf], np.float32).tobytes()
    (tmp_path / "inf.gguf").write_bytes(bytes(broken))
    with pytest.raises(ConversionError, match="'blk.0.attn_norm.weight' holds NaN or infinite"):
        quantize_gguf(str(tmp_path / "inf.gguf"), str(out))
    (tmp_path / "cut.gguf").write_bytes(src.read_bytes()[:5000])
    with pytest.raises(GGUFError):
        quantize_gguf(str(tmp_path / "cut.gguf"), str(out))
    assert not out.exists() and src.read_bytes() == before


def test_cli_quantizes_and_reports(llama256, tmp_path):
    from typer.testing import CliRunner

    from edgeinfer.cli import app
    _, src = llama256
    out = tmp_path / "m.gguf"
    r = CliRunner().invoke(app, ["quantize", str(src), "-o", str(out), "-t", "q4_0", "-q"])
    assert r.exit_code == 0, r.output
    assert f"wrote {out}: q4_0, 75 tensors (17 F32, 57 Q4_0, 1 Q6_K)" in r.output, r.output
    quantize_gguf(str(src), str(tmp_path / "api.gguf"), "q4_0")
    assert out.read_bytes() == (tmp_path / "api.gguf").read_bytes()
    r = CliRunner().invoke(app, ["quantize", str(out), "-o", str(tmp_path / "again.gguf"), "-q"])
    assert r.exit_code == 1 and "already quantized" in r.output and "Traceback" not in r.output, r.output


def test_cli_gguf_only_workflow_matches_llama_quantize(llama256, tmp_path):
    """llama.cpp's workflow without the checkpoint: an importance matrix collected from the F16
    GGUF (`edgeinfer imatrix`, as llama-imatrix -m), then `edgeinfer quantize --imatrix`; the
    tensors are llama.cpp's quantizer's given the same matrix."""
    from typer.testing import CliRunner

    from edgeinfer.cli import app
    _, src = llama256
    im_path, out = tmp_path / "im.gguf", tmp_path / "m.gguf"
    r = CliRunner().invoke(app, ["imatrix", str(src), "-o", str(im_path), "-q", "--chunk-size", "128"])
    assert r.exit_code == 0 and "56 tensors" in r.output, r.output
    r = CliRunner().invoke(app, ["quantize", str(src), "-o", str(out), "-q", "--imatrix", str(im_path)])
    assert r.exit_code == 0 and "the importance matrix weighted 56 of the 58 tensors" in r.output, r.output
    im = Imatrix.load(str(im_path))
    llama_quantize(src, tmp_path / "llama.gguf", FILE_TYPES["q4_k_m"].llama_ftype,
                   imatrix={n: im.importance(n, im.sums[n].shape[1]) for n in im.sums})
    with GGUFFile(tmp_path / "llama.gguf") as a, GGUFFile(out) as b:
        assert all(bytes(t.data) == bytes(b.tensors[n].data) for n, t in a.tensors.items())
