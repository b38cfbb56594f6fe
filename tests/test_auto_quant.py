"""`edgeinfer convert --type auto`: the sensitivity measurement (its forward/backward against
torch autograd on tiny Hugging Face models), the budgeted allocation, files that respect the
budget and that llama.cpp loads, `edgeinfer eval --sweep`, and on SmolLM2's real weights the
issue's target: auto beats llama.cpp's Q4_K_M and Q4_0 at their file sizes."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from tests.support.strict import require


from edgeinfer.convert import convert_checkpoint  # noqa: E402
from edgeinfer.convert.sensitivity import (CANDIDATES, Sensitivity, TensorCost,  # noqa: E402
                                           _hull, allocate, default_calibration_text)
from edgeinfer.errors import ConversionError  # noqa: E402
from edgeinfer.gguf import GGUFFile  # noqa: E402
from edgeinfer.gguf.types import GGMLType as T  # noqa: E402


# ------------------------------------------------------------------ allocation (no model)
def _sens(table: dict[str, dict[int, tuple[int, float]]]) -> Sensitivity:
    return Sensitivity({n: TensorCost(n, 1, dict(c)) for n, c in table.items()}, 1, 0.0)


def test_hull_drops_dominated_and_concave_points():
    opts = [(10, 1.0, 0), (12, 1.2, 1), (14, 0.5, 2), (15, 0.45, 3), (20, 0.0, 4), (20, 0.1, 5)]
    h = _hull(opts)
    assert [o[2] for o in h] == [0, 2, 4]   # 1: dominated, 3: above the chord 2-4, 5: same size


def test_allocate_respects_budget_and_is_near_optimal():
    rng = np.random.default_rng(0)
    sizes = {0: 45, 1: 50, 2: 55, 3: 85}
    for trial in range(40):
        table = {}
        for k in range(5):
            scale = float(rng.uniform(0.1, 10))
            errs = np.sort(rng.uniform(0, 1, 4))[::-1] * scale
            errs[3] = errs[3] * rng.uniform(0, 1)
            table[f"t{k}"] = {t: (sizes[t] * (k + 1), float(errs[t])) for t in range(4)}
        sens = _sens(table)
        least = sum(sizes[0] * (k + 1) for k in range(5))
        for budget in (least, least + 20, least + 60, least + 150, 10**6):
            types = allocate(sens, budget)
            used = sum(table[n][t][0] for n, t in types.items())
            assert used <= budget
            got = sens.predicted_kl(types)
            best = min(sum(table[n][t][1] for n, t in zip(table, combo))
                       for combo in itertools.product(range(4), repeat=5)
                       if sum(table[n][t][0] for n, t in zip(table, combo)) <= budget)
            assert got <= best * 1.35 + 1e-12, (trial, budget, got, best)
        with pytest.raises(ConversionError, match="below the smallest"):
            allocate(sens, least - 1)


def test_allocate_takes_no_useless_upgrade():
    # "a" is already exact at its cheapest type: extra bytes go to "b" only
    sens = _sens({"a": {int(T.Q4_1): (50, 0.0), int(T.Q8_0): (85, 0.0), int(T.Q4_0): (45, 0.1)},
                  "b": {int(T.Q4_0): (45, 0.3), int(T.Q5_0): (55, 0.1), int(T.F16): (160, 0.0)}})
    types = allocate(sens, 10**6)
    assert types == {"a": int(T.Q4_1), "b": int(T.F16)}


def test_default_calibration_text_ships():
    text = default_calibration_text()
    assert len(text.split()) > 300


# ------------------------------------------------------------------ tiny checkpoints
torch = require("torch", "tiny checkpoints are built with torch")
tf = require("transformers", "tiny checkpoints are built with transformers")
require("tokenizers")
require("sentencepiece")

from tests.support import tiny_checkpoints  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("auto_ckpt")
    return {k: tiny_checkpoints.build(k, root / k)
            for k in ("llama", "llama_tied", "mistral", "qwen2", "llama_256", "llama32", "phi3", "phi4", "qwen3",
                      "gemma3", "smollm3")}


# llama32: llama3 RoPE factors; phi3/phi4: fused qkv / gate_up, LongRoPE (the 37-token window
# past the original context of 32 takes the long factors, the 20-token one the short), and
# phi4 partial rotary; smollm3: layers without RoPE
@pytest.mark.parametrize("kind", ["llama", "llama_tied", "mistral", "qwen2", "llama32", "phi3", "phi4", "qwen3", "gemma3",
                                  "smollm3"])
def test_sensitivity_matrices_equal_torch_autograd(tiny, kind):
    """The numpy forward/backward behind the sensitivities: for every linear weight,
    S = sum_t g_t^2 x_t^2 (g: the gradient at its output of the same logit-space Fisher
    sample, x: its input) equals what torch autograd gives on the Hugging Face model."""
    from edgeinfer.convert.arch import HParams, TensorMap
    from edgeinfer.convert.checkpoint import Checkpoint
    from edgeinfer.convert.sensitivity import analyze

    ckpt = Checkpoint(str(tiny[kind]))
    hp = HParams.from_config(ckpt.config)
    rng = np.random.default_rng(1)
    windows = [list(rng.integers(0, hp.n_vocab, 37)), list(rng.integers(0, hp.n_vocab, 20))]
    rec: dict = {}
    analyze(hp, TensorMap(hp), ckpt.load, windows, record=rec)

    model = tf.AutoModelForCausalLM.from_pretrained(str(tiny[kind]), dtype=torch.float32,
                                                    attn_implementation="eager")
    got: dict[str, np.ndarray] = {}
    io: dict[str, list] = {}

    def hook(name):
        def fwd(mod, inp, out):
            x = inp[0].detach()[0].numpy()
            out.register_hook(lambda g: io.setdefault(name, []).append(
                (g.detach()[0].numpy(), x)) and None)
        return fwd

    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            mod.register_forward_hook(hook(name + ".weight"))
    emb_grads = []

    def emb_hook(mod, inp, out):
        out.register_hook(lambda g: emb_grads.append(g.detach()[0].numpy()))

    model.model.embed_tokens.register_forward_hook(emb_hook)
    for w, dz in zip(windows, rec["dz"]):
        logits = model(torch.tensor([w])).logits[0]
        logits.backward(torch.from_numpy(dz))
    tmap = TensorMap(hp)
    for name, pairs in io.items():      # in GGUF names and row order (the Q/K permutation)
        s = sum((g * g).T @ (x * x) for g, x in pairs)
        f = tmap.transform(name)
        got[tmap.gguf_name(name) or "token_embd.weight"] = s if f is None else f(s)
    assert set(got) == set(rec["S"])
    for name, s in rec["S"].items():
        err = float(np.abs(s - got[name]).max() / np.abs(got[name]).max())
        assert err < 2e-3, (name, err)
    ids = np.concatenate(windows)
    d = np.concatenate(emb_grads)
    want = np.zeros((hp.n_vocab, hp.n_embd), np.float32)
    np.add.at(want, ids, d * d * getattr(model.model.embed_tokens, "scalar_embed_scale", 1.0) ** 2)
    uniq, s_rows = rec["emb_rows"]
    assert float(np.abs(s_rows - want[uniq]).max() / np.abs(want).max()) < 2e-3


@pytest.fixture(scope="module")
def auto256(tiny, tmp_path_factory):
    d = tmp_path_factory.mktemp("auto256")
    ref = d / "f32.gguf"
    convert_checkpoint(str(tiny["llama_256"]), str(ref), "f32")
    out = {"ref": ref}
    for t in ("q4_0", "q4_k_m", "q8_0"):
        out[t] = convert_checkpoint(str(tiny["llama_256"]), str(d / f"{t}.gguf"), t)
    sens = None
    for b in (4.9, 5.6, out["q4_k_m"].bpw, 7.0):
        r = convert_checkpoint(str(tiny["llama_256"]), str(d / f"auto-{b:.3f}.gguf"), "auto",
                               target_bpw=b, sensitivity=sens)
        sens = r.sensitivity
        out[b] = r
    return out


@pytest.mark.slow
def test_auto_respects_budget(auto256):
    """File bits per weight (tensor data) <= target; more budget never predicts more KL;
    every 2-D weight is one of the candidates, 1-D tensors stay F32."""
    prev = None
    for b in sorted((4.9, 5.6, auto256["q4_k_m"].bpw, 7.0)):
        r = auto256[b]
        assert r.file_type == "auto" and r.bpw <= b + 1e-9, (b, r.bpw)
        with GGUFFile(r.path) as f:
            data = sum(t.nbytes for t in f.tensors.values())
            n = sum(int(np.prod(t.shape)) for t in f.tensors.values())
            assert 8 * data / n <= b + 1e-9
            for name, t in f.tensors.items():
                if len(t.shape) == 1:
                    assert t.type_name == "F32"
                else:
                    assert T[t.type_name] in CANDIDATES, name
        if prev is not None:
            assert r.predicted_kl <= prev + 1e-12
        prev = r.predicted_kl
    # at q4_k_m's size the file is no larger than q4_k_m's
    assert auto256[auto256["q4_k_m"].bpw].nbytes <= auto256["q4_k_m"].nbytes


@pytest.mark.slow
def test_auto_beats_fixed_types_on_tiny_model(auto256):
    from edgeinfer.tools.eval import evaluate
    from tests.support.texts import TEXTS
    text = TEXTS["story"]
    kl = {k: evaluate(str(auto256[k].path), str(auto256["ref"]), text, ctx=128,
                      n_threads=2).kl_mean for k in ("q4_k_m", auto256["q4_k_m"].bpw)}
    assert kl[auto256["q4_k_m"].bpw] < kl["q4_k_m"], kl


@pytest.mark.slow
@pytest.mark.oracle
def test_llama_cpp_loads_auto_file(auto256):
    require("llama_cpp")
    from tests.support.llama_oracle import kl_divergence, llama_logits
    import edgeinfer
    path = auto256[5.6].path
    with GGUFFile(path) as f:
        assert len({t.type_name for t in f.tensors.values()}) >= 3      # really mixed
    ids = list(range(1, 60))
    theirs = llama_logits(path, ids)
    with edgeinfer.load(str(path), n_ctx=128, n_threads=2) as e:
        ours = e.logits(ids)
    assert np.isfinite(theirs).all()
    assert float(kl_divergence(theirs, ours).mean()) < 0.02


@pytest.mark.oracle
def test_auto_files_of_qwen3_and_gemma3_load_in_llama_cpp(tiny, tmp_path):
    """--type auto on the families with per-head norms, post-norms, GeGLU and sliding windows
    (their sensitivities are checked against autograd above): a mixed file within the budget
    that llama.cpp loads and agrees with."""
    require("llama_cpp")
    from tests.support.llama_oracle import kl_divergence, llama_logits
    import edgeinfer
    for kind in ("qwen3", "gemma3"):
        r = convert_checkpoint(str(tiny[kind]), str(tmp_path / f"{kind}.auto.gguf"), "auto", target_bpw=6.0)
        assert r.bpw <= 6.0 + 1e-9, (kind, r.bpw)
        with GGUFFile(r.path) as f:
            assert len({t.type_name for t in f.tensors.values() if t.n_dims == 2}) >= 2, kind   # mixed
        ids = list(range(5, 60))
        with edgeinfer.load(str(r.path), n_ctx=128, n_threads=2) as e:
            ours = e.logits(ids)
        assert float(kl_divergence(llama_logits(r.path, ids), ours).mean()) < 0.02, kind


def test_auto_bad_inputs(tiny, tmp_path):
    src = str(tiny["llama"])
    out = tmp_path / "a.gguf"
    with pytest.raises(ConversionError, match="--target-bpw"):
        convert_checkpoint(src, str(out), "auto")
    with pytest.raises(ConversionError, match="below the smallest"):
        convert_checkpoint(src, str(out), "auto", target_bpw=3.0)
    with pytest.raises(ConversionError, match="calibration"):
        convert_checkpoint(src, str(out), "auto", target_bpw=6, calibration=str(tmp_path / "x"))
    with pytest.raises(ConversionError, match="go with --type auto"):
        convert_checkpoint(src, str(out), "q4_0", target_bpw=6)
    for kind in ("lfm2", "qwen35"):     # hybrids: no backward through the recurrent layers
        hybrid = tiny_checkpoints.build(kind, tmp_path / kind)
        with pytest.raises(ConversionError, match="its recurrent layers have no backward"):
            convert_checkpoint(str(hybrid), str(out), "auto", target_bpw=6)
    assert not out.exists()
    # --keep still wins under auto, and its bytes count against the budget
    r = convert_checkpoint(src, str(out), "auto", target_bpw=9.5, keep=["output.weight=f16"])
    assert r.tensor_types["output.weight"] == "F16" and r.bpw <= 9.5


@pytest.mark.slow
def test_cli_auto_and_sweep(tiny, tmp_path):
    from typer.testing import CliRunner
    from edgeinfer.cli import app
    from tests.support.texts import TEXTS
    runner = CliRunner()
    src = str(tiny["qwen2"])
    ref = tmp_path / "f16.gguf"
    cal = tmp_path / "cal.txt"
    cal.write_text(TEXTS["technical"])
    r = runner.invoke(app, ["convert", src, "-o", str(tmp_path / "a.gguf"), "--type", "auto",
                            "--target-bpw", "6", "--calibration", str(cal), "-q"])
    assert r.exit_code == 0, r.output
    assert "predicted KL" in r.output
    assert runner.invoke(app, ["convert", src, "-o", str(ref), "-t", "f16", "-q"]).exit_code == 0
    text = tmp_path / "t.txt"
    text.write_text(TEXTS["story"])
    r = runner.invoke(app, ["eval", "--sweep", src, "--reference", str(ref), "--text", str(text),
                            "--types", "q8_0,q4_0", "--json", "--ctx", "96"])
    assert r.exit_code == 0, r.output
    pts = json.loads(r.stdout[r.stdout.index("["):])
    assert [p["label"] for p in pts if p["kind"] == "fixed"] == ["q8_0", "q4_0"]
    auto = [p for p in pts if p["kind"] == "auto"]
    assert len(auto) == 2
    fixed = {p["label"]: p for p in pts if p["kind"] == "fixed"}
    for p in auto:
        match = min(fixed.values(), key=lambda f: abs(f["bpw"] - p["target_bpw"]))
        assert p["size_model"] <= match["size_model"] and p["bpw"] <= p["target_bpw"] + 1e-9
    r = runner.invoke(app, ["eval", "--reference", str(ref), "--text", str(text)])
    assert r.exit_code == 1 and "--sweep" in r.output


def test_sweep_plot_is_a_png(tmp_path):
    """eval --sweep --plot's figure: matplotlib (optional for users, needed here) writes a PNG."""
    require("matplotlib", "eval --sweep --plot needs matplotlib")
    from edgeinfer.tools.eval import EvalResult, SweepPoint, plot_sweep

    def point(label: str, kind: str, size: int, kl: float) -> SweepPoint:
        r = EvalResult(model=label, reference="f16", n_tokens=64, n_windows=1, ctx=96, ppl_model=2.0,
                       ppl_reference=2.0, kl_mean=kl, kl_p99=kl, kl_max=kl, top1=0.9, size_model=size,
                       size_reference=4 << 20)
        return SweepPoint(label, kind, label, 8.0 * size / 2**20, None, None, r)

    png = tmp_path / "sweep.png"
    plot_sweep([point("q8_0", "fixed", 2 << 20, 1e-3), point("q4_0", "fixed", 1 << 20, 1e-2),
                point("auto@6", "auto", 3 << 19, 3e-3), point("auto@5", "auto", 5 << 18, 0.0)], str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ real weights
@pytest.mark.slow
def test_smollm2_auto_beats_q4_k_m_and_q4_0(smollm2_path, tmp_path):
    """SmolLM2-135M rebuilt from its Q4_1 GGUF: auto at the size of the Q4_K_M file has a lower
    KL than Q4_K_M, and at the size of Q4_0 a far lower KL than Q4_0 (the full figures, on
    1186 tokens with the default 512-token calibration, are in docs/quantization.md; this
    uses 160 calibration tokens and 256 scored tokens)."""
    require("gguf")
    from edgeinfer.tools.eval import evaluate
    from tests.support.texts import TEXTS
    src = tiny_checkpoints.build_from_gguf(smollm2_path, tmp_path / "smol")
    ref = tmp_path / "f32.gguf"
    convert_checkpoint(str(src), str(ref), "f32")
    fixed = {t: convert_checkpoint(str(src), str(tmp_path / f"{t}.gguf"), t, n_threads=2)
             for t in ("q4_k_m", "q4_0")}
    sens = None
    kl = {}
    for t, f in fixed.items():
        a = convert_checkpoint(str(src), str(tmp_path / f"auto-{t}.gguf"), "auto",
                               target_bpw=f.bpw, n_threads=2, sensitivity=sens,
                               calibration_tokens=160)
        sens = a.sensitivity
        assert a.nbytes <= f.nbytes
        for k, path in ((t, f.path), ("auto-" + t, a.path)):
            kl[k] = evaluate(str(path), str(ref), TEXTS["technical"], ctx=256,
                             max_tokens=255, n_threads=2).kl_mean
    print(kl)
    assert kl["auto-q4_k_m"] < kl["q4_k_m"]
    assert kl["auto-q4_0"] < kl["q4_0"] / 3
