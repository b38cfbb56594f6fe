"""`edgeinfer convert`: tiny random-weight Hugging Face checkpoints (llama untied / tied,
mistral with a SentencePiece tokenizer, qwen2 with biases, Llama 3.2 with llama3 RoPE scaling,
Phi-3.5 / Phi-4-mini with fused tensors, partial rotary and LongRoPE, PEFT LoRA adapters) converted to
every output type and checked against transformers (+peft), llama.cpp, and the float64 numpy
forward of the same file; tokenization against the source tokenizer; bad inputs and
interrupted writes."""
from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import pytest
from tests.support.strict import require


torch = require("torch", "tiny checkpoints are built with torch")
tf = require("transformers", "tiny checkpoints are built with transformers")
require("tokenizers")
require("sentencepiece")

from tests.support import tiny_checkpoints  # noqa: E402

torch.set_num_threads(1)

from edgeinfer.convert import convert_checkpoint  # noqa: E402
from edgeinfer.errors import ConversionError, UnsupportedArchitectureError  # noqa: E402
from edgeinfer.gguf import GGUFFile  # noqa: E402

KINDS = ["llama", "llama_tied", "mistral", "qwen2", "llama32", "phi3", "phi4"]
SPM_KINDS = ("mistral", "phi3")     # SentencePiece tokenizer.model (mistral adds BOS, phi3 not)
TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k_m", "q5_k_m", "q6_k"]
TEXT = ("The quick brown fox, 12345 apples; café 🙂 def f(x):\n    return x * 2\n\n"
        "Once upon a time, in a small village, there lived an old clockmaker who loved tea. "
        "SHOUTING words and don't won't they'll -- numbers 3.14159 and 2024.")


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_ckpt")
    paths = {k: tiny_checkpoints.build(k, root / k) for k in KINDS + ["llama_256"]}
    paths["lora"] = tiny_checkpoints.build_lora(paths["llama"], root / "lora")
    paths["lora_qwen2_rs"] = tiny_checkpoints.build_lora(paths["qwen2"], root / "lora_q",
                                                        use_rslora=True)
    paths["lora_phi3"] = tiny_checkpoints.build_lora(   # the fused modules themselves adapted
        paths["phi3"], root / "lora_phi3", targets=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"])
    paths["out"] = root / "gguf"
    paths["out"].mkdir()
    return paths


_CONVERTED: dict = {}


def converted(tiny, kind: str, ftype: str, lora: str | None = None):
    key = (kind, ftype, lora)
    if key not in _CONVERTED:
        out = tiny["out"] / f"{kind}{'-' + lora if lora else ''}.{ftype}.gguf"
        convert_checkpoint(str(tiny[kind]), str(out), ftype,
                           lora_dir=str(tiny[lora]) if lora else None)
        _CONVERTED[key] = out
    return _CONVERTED[key]


def source_ids(tiny, kind: str, text: str, special: bool = True) -> list[int]:
    d = tiny[kind]
    if kind in SPM_KINDS:
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))
        return [sp.bos_id()] * (kind == "mistral") + sp.encode(text)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    return tok.encode(text).ids


def hf_logits(model_dir, ids, adapter=None) -> np.ndarray:
    m = tf.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel
        m = PeftModel.from_pretrained(m, str(adapter))
    m.eval()
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].float().numpy()


def engine_logits(path, ids) -> np.ndarray:
    import edgeinfer
    with edgeinfer.load(str(path), n_ctx=256, n_threads=2) as e:
        return e.logits(ids)


def kl(p, q):
    from tests.support.llama_oracle import kl_divergence
    return kl_divergence(p, q)


# ------------------------------------------------------------------ exactness vs transformers
@pytest.mark.parametrize("kind", KINDS + ["llama_256"])
def test_f32_logits_equal_transformers(tiny, kind):
    ids = source_ids(tiny, kind, TEXT)
    ours = engine_logits(converted(tiny, kind, "f32"), ids)
    ref = hf_logits(tiny[kind], ids)
    assert float(np.abs(ours - ref).max()) <= 1e-3


@pytest.mark.parametrize("kind,adapter", [("llama", "lora"), ("qwen2", "lora_qwen2_rs"), ("phi3", "lora_phi3")])
def test_lora_merged_equals_peft(tiny, kind, adapter):
    ids = source_ids(tiny, kind, TEXT)
    ours = engine_logits(converted(tiny, kind, "f32", adapter), ids)
    ref = hf_logits(tiny[kind], ids, tiny[adapter])
    base = hf_logits(tiny[kind], ids)
    assert float(np.abs(ref - base).max()) > 1e-2     # the adapter does change the model
    assert float(np.abs(ours - ref).max()) <= 1e-3


def test_bf16_checkpoint(tiny, tmp_path):
    for kind in ("qwen2", "llama32", "phi4"):
        d = tiny_checkpoints.build(kind, tmp_path / f"bf16_{kind}", dtype="bfloat16")
        st = json.loads((d / "model.safetensors").read_bytes()[8:8 + int.from_bytes(
            (d / "model.safetensors").read_bytes()[:8], "little")])
        assert {v["dtype"] for k, v in st.items() if k != "__metadata__"} == {"BF16"}
        out = tmp_path / f"bf16_{kind}.f32.gguf"
        convert_checkpoint(str(d), str(out), "f32")
        ids = source_ids(tiny, kind, TEXT)
        assert float(np.abs(engine_logits(out, ids) - hf_logits(d, ids)).max()) <= 1e-3, kind


# ------------------------------------------------------------------ llama.cpp on every type
@pytest.mark.slow
@pytest.mark.oracle
@pytest.mark.parametrize("ftype", TYPES)
@pytest.mark.parametrize("kind", KINDS + ["llama_256"])
def test_llama_cpp_agrees_on_every_type(tiny, kind, ftype):
    require("llama_cpp")
    from tests.support.llama_oracle import llama_logits
    from tests.support.reference_forward import reference_logits

    path = converted(tiny, kind, ftype)
    ids = source_ids(tiny, kind, TEXT)
    ours = engine_logits(path, ids)
    theirs = llama_logits(path, ids)
    exact = reference_logits(path, ids)
    top1 = float(np.mean(ours.argmax(-1) == theirs.argmax(-1)))
    assert top1 >= 0.9
    assert float(kl(theirs, ours).mean()) <= 0.02
    # edgeinfer is no further than llama.cpp from the float64 forward of the same file
    ours_kl, theirs_kl = float(kl(exact, ours).mean()), float(kl(exact, theirs).mean())
    assert ours_kl <= 1.25 * theirs_kl + 1e-6, (ours_kl, theirs_kl)


def test_q4_k_m_recipe_in_file(tiny):
    with GGUFFile(converted(tiny, "llama_256", "q4_k_m")) as f:
        types = {n: t.type_name for n, t in f.tensors.items()}
        assert f.get("general.file_type") == 15
        assert f.get("general.quantization_version") == 2
    assert types["output.weight"] == "Q6_K"
    assert types["token_embd.weight"] == "Q4_K"
    assert types["blk.0.attn_norm.weight"] == "F32"
    # 8 layers: use_more_bits -> layers 0, 3, 6, 7
    more = [i for i in range(8) if types[f"blk.{i}.attn_v.weight"] == "Q6_K"]
    assert more == [0, 3, 6, 7]
    assert [i for i in range(8) if types[f"blk.{i}.ffn_down.weight"] == "Q6_K"] == more
    assert types["blk.1.attn_q.weight"] == "Q4_K"
    with GGUFFile(converted(tiny, "llama_tied", "q4_k_m")) as f:
        # tied head (token_embd) with rows of 64: Q6_K falls back to Q8_0; Q4_K to Q5_0
        assert f.tensors["token_embd.weight"].type_name == "Q8_0"
        assert "output.weight" not in f.tensors
        assert f.tensors["blk.0.attn_q.weight"].type_name == "Q5_0"


def test_keep_override(tiny, tmp_path):
    out = tmp_path / "keep.gguf"
    r = convert_checkpoint(str(tiny["llama_256"]), str(out), "q4_k_m",
                           keep=["blk.0.*=q8_0", "blk.7.*=q8_0", "output.weight=f16"])
    assert r.tensor_types["blk.0.ffn_up.weight"] == "Q8_0"
    assert r.tensor_types["blk.7.attn_v.weight"] == "Q8_0"
    assert r.tensor_types["blk.0.attn_norm.weight"] == "F32"     # 1-D stays F32
    assert r.tensor_types["output.weight"] == "F16"
    assert r.tensor_types["blk.3.ffn_up.weight"] == "Q4_K"
    with pytest.raises(ConversionError, match="match no tensor"):
        convert_checkpoint(str(tiny["llama"]), str(tmp_path / "x.gguf"), "q8_0",
                           keep=["blk.99.*=q8_0"])
    assert not (tmp_path / "x.gguf").exists()


# ------------------------------------------------------------------ tokenizer
def _corpus(kind: str) -> list[str]:
    from tests.support.texts import TEXTS
    texts = list(TEXTS.values()) + tiny_checkpoints.CORPUS + [
        "", " ", "   leading spaces", "trailing spaces   ", "\n\nnewlines\n", "a\r\nb\tc",
        "1234567890 12 345 6789", "ÀÉÎõü ß ﬁ ℃ Ω", "中文字符和日本語のテキスト", "emoji 🙂🚀👍🏽",
        "it's 'quoted' \"double\" (paren) [bracket] {brace}", "x=1;y=2;print(x+y)",
        "Hello World HELLO world hello", "  \t mixed \n\t whitespace  ",
    ]
    if kind not in SPM_KINDS:
        texts += ["<|im_start|>user\nhi<|im_end|>\n", "text<|endoftext|>more"]
    return texts


@pytest.mark.oracle
@pytest.mark.parametrize("kind", KINDS)
def test_llama_cpp_tokenizes_like_source(tiny, kind):
    require("llama_cpp")
    from tests.support.llama_oracle import llama_tokenize
    path = converted(tiny, kind, "q8_0")
    for text in _corpus(kind):
        want = source_ids(tiny, kind, text)
        got = llama_tokenize(path, text, add_bos=True, special=kind not in SPM_KINDS)
        assert got == want, f"{text!r}: llama.cpp {got} != source {want}"


@pytest.mark.parametrize("kind", KINDS)
def test_engine_tokenizes_like_source(tiny, kind):
    import edgeinfer
    with edgeinfer.load(str(converted(tiny, kind, "q8_0")), n_ctx=64, n_threads=1) as e:
        for text in _corpus(kind):
            want = source_ids(tiny, kind, text)
            assert e.tokenize(text, add_special=True) == want, text


def test_metadata(tiny):
    with GGUFFile(converted(tiny, "llama_tied", "q8_0")) as f:
        m = f.metadata
        assert m["general.architecture"] == "llama"
        assert m["tokenizer.ggml.model"] == "gpt2" and m["tokenizer.ggml.pre"] == "smollm"
        assert m["tokenizer.chat_template"] == tiny_checkpoints.CHATML
        toks = list(m["tokenizer.ggml.tokens"])
        assert toks[m["tokenizer.ggml.eos_token_id"]] == "<|im_end|>"
        assert toks[m["tokenizer.ggml.bos_token_id"]] == "<|im_start|>"
        assert m["tokenizer.ggml.add_bos_token"] is False
        assert len(toks) == m["llama.vocab_size"] and toks[-1].startswith("[PAD")
    with GGUFFile(converted(tiny, "llama", "q8_0")) as f:
        assert f.metadata["tokenizer.ggml.pre"] == "llama-bpe"
        assert f.metadata["tokenizer.ggml.add_bos_token"] is True
        assert f.metadata["llama.rope.freq_base"] == 50000.0
    with GGUFFile(converted(tiny, "mistral", "q8_0")) as f:
        assert f.metadata["tokenizer.ggml.model"] == "llama"
        assert f.metadata["tokenizer.ggml.add_space_prefix"] is True
        assert "tokenizer.ggml.scores" in f.metadata
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=str(tiny["mistral"] / "tokenizer.model"))
        types = list(f.metadata["tokenizer.ggml.token_type"])
        toks = list(f.metadata["tokenizer.ggml.tokens"])
        scores = list(f.metadata["tokenizer.ggml.scores"])
        assert toks[:sp.get_piece_size()] == [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
        assert scores[100] == pytest.approx(sp.get_score(100))
        assert types[0] == 2 and types[1] == types[2] == 3                # unk, <s>, </s>
        assert types[3] == 6 and toks[3] == "<0x00>"                      # byte fallback
        assert types[sp.piece_to_id("▁the")] == 1
        assert f.metadata["tokenizer.ggml.unknown_token_id"] == 0
    with GGUFFile(converted(tiny, "qwen2", "q8_0")) as f:
        assert f.metadata["general.architecture"] == "qwen2"
        assert f.metadata["tokenizer.ggml.pre"] == "qwen2"
        assert "blk.1.attn_k.bias" in f.tensors


# ------------------------------------------------------------------ shards, streaming
def test_sharded_checkpoint_gives_identical_file(tiny, tmp_path):
    for kind in ("llama", "phi3"):
        _sharded_gives_identical_file(tiny[kind], tmp_path / kind)


def _sharded_gives_identical_file(src, tmp_path):
    from safetensors.numpy import load_file, save_file
    tmp_path.mkdir()
    d = tmp_path / "sharded"
    shutil.copytree(src, d)
    (d / "model.safetensors").unlink()
    tensors = load_file(str(src / "model.safetensors"))
    names = sorted(tensors)
    halves = [names[: len(names) // 2], names[len(names) // 2:]]
    wm = {}
    for i, part in enumerate(halves):
        fn = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, str(d / fn))
        wm.update({n: fn for n in part})
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    convert_checkpoint(str(src), str(a), "q4_0", name="x")
    convert_checkpoint(str(d), str(b), "q4_0", name="x")
    assert a.read_bytes() == b.read_bytes()


def test_streams_one_tensor_at_a_time(tiny, tmp_path, monkeypatch):
    from edgeinfer.convert import checkpoint, converter
    events = []
    real_load, real_quant = checkpoint.Checkpoint.load, converter.quantize
    monkeypatch.setattr(checkpoint.Checkpoint, "load",
                        lambda self, n: (events.append("L"), real_load(self, n))[1])
    monkeypatch.setattr(converter, "quantize",
                        lambda x, t, n=0, **kw: (events.append("Q"), real_quant(x, t, n, **kw))[1])
    convert_checkpoint(str(tiny["llama"]), str(tmp_path / "s.gguf"), "q4_k_m")
    assert "".join(events) == "LQ" * (len(events) // 2)


# The peak is VmHWM from /proc (the high-water mark of this process's own address space,
# reset just before converting). Not ru_maxrss: on Linux that keeps the high-water mark of
# the forked pytest process (torch and all) across exec.
_RSS_SCRIPT = """
import json, sys
import numpy as np
from edgeinfer.convert import convert_checkpoint
from edgeinfer.convert.quantize import quantize

def status(key):
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) * 1024 for l in fh if l.startswith(key + ":"))

quantize(np.zeros((1, 256), np.float32), 12)      # load the native library before measuring
with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")                                 # reset VmHWM to the current RSS
base = status("VmRSS")
convert_checkpoint(sys.argv[1], sys.argv[2], "q4_k_m", n_threads=2)
print(json.dumps({"base": base, "peak": status("VmHWM")}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_peak_rss_is_a_small_multiple_of_the_largest_tensor(tmp_path):
    """hidden 1024, 4 layers, ffn 2816, f32 in 5 shards (~184 MB): converting to q4_k_m must
    add a few times the largest tensor (11.5 MB) to the process's peak RSS, not the model."""
    import subprocess
    from safetensors import safe_open
    src = tiny_checkpoints.build_wide_llama(tmp_path / "wide")
    sizes = []
    for f in sorted(src.glob("*.safetensors")):
        with safe_open(str(f), framework="numpy") as st:
            for n in st.keys():
                sizes.append(int(np.prod(st.get_slice(n).get_shape())) * 4)
    whole, largest = sum(sizes), max(sizes)
    res = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(src), str(tmp_path / "w.gguf")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    m = json.loads(res.stdout.strip().splitlines()[-1])
    delta = m["peak"] - m["base"]
    print(f"peak RSS delta {delta / 2**20:.1f} MiB; largest tensor {largest / 2**20:.1f} MiB; "
          f"model {whole / 2**20:.1f} MiB")
    assert delta < whole / 2
    assert delta < 6 * largest


@pytest.mark.slow
def test_smollm2_rebuilt_checkpoint_round_trips(smollm2_path, tmp_path):
    """Real weights: SmolLM2-135M-Instruct's Q4_1 GGUF rebuilt as a Hugging Face checkpoint
    (dequantized to f32, Q/K un-permuted, tokenizer.json from its vocabulary) and converted
    back to q4_1 gives every tensor of the original file byte for byte, and the same
    tokenizer metadata; the rebuilt tokenizers' ids equal edgeinfer's on the converted file."""
    require("gguf")
    import edgeinfer
    from tests.support.texts import TEXTS
    from tokenizers import Tokenizer
    src = tiny_checkpoints.build_from_gguf(smollm2_path, tmp_path / "smol")
    out = tmp_path / "smol.q4_1.gguf"
    convert_checkpoint(str(src), str(out), "q4_1")
    with GGUFFile(smollm2_path) as a, GGUFFile(out) as b:
        assert sorted(a.tensors) == sorted(b.tensors)
        for n, t in a.tensors.items():
            u = b.tensors[n]
            assert (t.type_name, t.shape) == (u.type_name, u.shape), n
            assert np.asarray(t.data).tobytes() == np.asarray(u.data).tobytes(), n
        for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                  "tokenizer.ggml.pre", "tokenizer.ggml.bos_token_id",
                  "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_bos_token",
                  "tokenizer.chat_template", "llama.rope.freq_base", "llama.block_count"):
            assert list(np.atleast_1d(a.get(k))) == list(np.atleast_1d(b.get(k))), k
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    with edgeinfer.load(str(out), n_ctx=64, n_threads=1) as e:
        for text in list(TEXTS.values()) + _corpus("llama_tied"):
            assert e.tokenize(text, add_special=True) == tok.encode(text).ids, text


# ------------------------------------------------------------------ failures
def _no_output(d, name="out.gguf"):
    leftovers = [p for p in os.listdir(d) if p.startswith(("out.gguf", ".out.gguf"))]
    return not leftovers


def test_interrupted_write_leaves_no_file(tiny, tmp_path, monkeypatch):
    from edgeinfer.convert import converter
    calls = {"n": 0}
    real = converter.quantize

    def boom(x, t, n=0, **kw):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(x, t, n, **kw)

    monkeypatch.setattr(converter, "quantize", boom)
    out = tmp_path / "out.gguf"
    with pytest.raises(KeyboardInterrupt):
        convert_checkpoint(str(tiny["llama"]), str(out), "q8_0")
    assert _no_output(tmp_path)
    # an existing file is left untouched by a failed conversion
    out.write_bytes(b"previous")
    calls["n"] = 0
    with pytest.raises(KeyboardInterrupt):
        convert_checkpoint(str(tiny["llama"]), str(out), "q8_0")
    assert out.read_bytes() == b"previous"
    assert [p for p in os.listdir(tmp_path) if p.endswith(".partial")] == []


def _copy(tiny, kind, tmp_path):
    i = 0
    while (tmp_path / f"bad_{kind}_{i}").exists():
        i += 1
    d = tmp_path / f"bad_{kind}_{i}"
    shutil.copytree(tiny[kind], d)
    return d


def _expect_error(src, tmp_path, exc=ConversionError, match=None, **kw):
    out = tmp_path / "out.gguf"
    with pytest.raises(exc, match=match):
        convert_checkpoint(str(src), str(out), kw.pop("ftype", "q8_0"), **kw)
    assert _no_output(tmp_path)


def test_bad_inputs(tiny, tmp_path):
    _expect_error(tmp_path / "missing", tmp_path, match="not found")
    d = _copy(tiny, "llama", tmp_path)
    (d / "config.json").unlink()
    _expect_error(d, tmp_path, match="config.json")

    d = _copy(tiny, "qwen2", tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (d / "config.json").write_text(json.dumps(cfg))
    _expect_error(d, tmp_path, UnsupportedArchitectureError,
                  match="LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM")

    d = _copy(tiny, "llama", tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 192
    (d / "config.json").write_text(json.dumps(cfg))
    _expect_error(d, tmp_path, match="shape")

    d = _copy(tiny, "llama", tmp_path)
    raw = bytearray((d / "model.safetensors").read_bytes())
    raw[8:20] = b"{corrupt!!!!"
    (d / "model.safetensors").write_bytes(bytes(raw))
    _expect_error(d, tmp_path, match="corrupt safetensors header")

    d = _copy(tiny, "llama", tmp_path)
    (d / "model.safetensors").unlink()
    _expect_error(d, tmp_path, match="safetensors")

    d = _copy(tiny, "llama", tmp_path)
    (d / "tokenizer.json").unlink()
    _expect_error(d, tmp_path, match="tokenizer")

    _expect_error(tiny["llama"], tmp_path, match="unknown output type", ftype="q3_k_xl")
    # an adapter built for another model (different k_proj shape)
    _expect_error(tiny["llama_tied"], tmp_path, match="does not match the base model",
                  lora_dir=str(tiny["lora"]))
    _expect_error(tiny["llama"], tmp_path, match="not found", lora_dir=str(tmp_path / "nolora"))


def test_cli_convert_and_eval(tiny, tmp_path):
    from typer.testing import CliRunner
    from edgeinfer.cli import app
    runner = CliRunner()
    q = tmp_path / "q.gguf"
    r = runner.invoke(app, ["convert", str(tiny["qwen2"]), "-o", str(q), "--type", "q4_0"])
    assert r.exit_code == 0, r.output
    ref = converted(tiny, "qwen2", "f16")
    text = tmp_path / "t.txt"
    text.write_text(TEXT * 3)
    r = runner.invoke(app, ["eval", str(q), "--reference", str(ref), "--text", str(text),
                            "--json", "--ctx", "64"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout[r.stdout.index("{"):])
    # measured on this tiny random model: KL 0.0033, top-1 0.73 (its distributions are near flat)
    assert 0 <= res["kl_mean"] < 0.01 and res["top1"] > 0.65 and res["n_tokens"] > 64
    r = runner.invoke(app, ["convert", str(tmp_path / "nope"), "-o", str(tmp_path / "n.gguf")])
    assert r.exit_code == 1 and "error:" in r.output
