"""`edgeinfer doctor` and `edgeinfer plan`: truthful reports, and plan figures that agree
with what the engine really allocates."""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgeinfer.tools import plan as P
from edgeinfer._native import ffi, lib
from edgeinfer.cli import app
from edgeinfer.tools.doctor import cpu_report, cuda_report, doctor_report, format_report, memory_report

runner = CliRunner()


# ------------------------------------------------------------------ plan vs the engine

@pytest.mark.slow
@pytest.mark.parametrize("ctx,slots,max_batch,kv", [(512, 1, 256, "f16"), (2048, 2, 64, "f16"),
                                                    (4096, 4, 128, "f16"), (2048, 2, 64, "q8_0")])
def test_plan_matches_engine_allocation(smollm2_path, ctx, slots, max_batch, kv):
    from edgeinfer.engine.engine import Engine

    m = P.model_shape(smollm2_path)
    eng = Engine.load(smollm2_path, n_ctx=ctx, n_slots=slots, max_batch=max_batch, n_threads=2, kv_type=kv)
    try:
        info = eng.info()
        assert info["kv_type"] == kv
        row = P.plan_one(m, ctx, slots, kv=kv, max_batch=max_batch, n_threads=info["n_threads"])
        kv_b, scratch = info["kv_bytes"], info["scratch_bytes"]
        assert abs(row.kv_bytes - kv_b) <= 0.05 * kv_b, (row.kv_bytes, kv_b)
        assert abs(row.scratch - scratch) <= 0.05 * scratch, (row.scratch, scratch)
        measured = m.weights_bytes + kv_b + scratch
        planned = row.weights + row.kv_bytes + row.scratch
        assert abs(planned - measured) <= 0.05 * measured
        # weights are the file's tensor bytes: what the engine maps, a little under the file size
        assert m.weights_bytes == sum(t.nbytes for t in eng.gguf.tensors.values())
        assert 0.9 * m.file_bytes < m.weights_bytes <= m.file_bytes
    finally:
        eng.close()


@pytest.mark.slow
@pytest.mark.parametrize("ctx,slots,max_batch,kv", [(512, 1, 256, "f16"), (2048, 2, 64, "f16"),
                                                    (1024, 4, 128, "q8_0")])
def test_plan_predicts_the_peak_rss_of_a_real_load(smollm2_path, ctx, slots, max_batch, kv):
    """plan's total against the kernel's peak RSS (VmHWM) of a fresh process that loads the
    model with this config, prefills every slot to its context and decodes
    (tests/support/peak_rss.py): within 10%."""
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "tests.support.peak_rss", str(smollm2_path), "--ctx", str(ctx),
                          "--slots", str(slots), "--max-batch", str(max_batch), "--kv", kv, "--threads", "2"],
                         cwd=root, capture_output=True, text=True, timeout=1800, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["completion_tokens"] == [8] * slots and got["prompt_tokens"] >= ctx - 8
    m = P.model_shape(smollm2_path)
    # plan counts each weight byte once: the runtime's packed copy holds at most the tensor bytes
    # (a type this host's kernels do not pack is read from the file mapping)
    assert 0 < got["packed_weight_bytes"] <= 1.01 * m.weights_bytes
    row = P.plan_one(m, ctx, slots, kv=kv, max_batch=max_batch, n_threads=got["n_threads"], process="engine")
    peak = got["peak_rss"]
    assert abs(row.total - peak) <= 0.10 * peak, (P.human(row.total), P.human(peak), row)


def test_kv_formula_from_the_design():
    m = P.ModelShape(name="x", arch="llama", n_layer=30, n_embd=576, n_head=9, n_head_kv=3, head_dim=64,
                     n_ff=1536, n_vocab=49152, n_ctx_train=8192, rope_dim=64, weights_bytes=10**8)
    assert P.kv_bytes(m, 2048, 3, "f16") == 2 * 30 * 3 * 64 * 2048 * 2 * 3
    assert P.kv_bytes(m, 2048, 3, "q8_0") == int(2 * 30 * 3 * 64 * 2048 * 34 / 32 * 3)
    with pytest.raises(ValueError):
        P.kv_bytes(m, 2048, 1, "q4_0")


def test_largest_fit_is_the_boundary():
    m = P.ModelShape(name="x", arch="llama", n_layer=30, n_embd=576, n_head=9, n_head_kv=3, head_dim=64,
                     n_ff=1536, n_vocab=49152, n_ctx_train=8192, rope_dim=64, weights_bytes=10**8)
    budget = 400 * 2**20
    fits = P.largest_fit(m, budget, slots=(1, 2, 4), n_threads=2)
    for s, c in fits.items():
        assert c is not None and c % 256 == 0
        assert P.plan_one(m, c, s, memory=budget, n_threads=2).fits
        if c < m.n_ctx_train:
            assert not P.plan_one(m, c + 256, s, memory=budget, n_threads=2).fits
    assert fits[1] >= fits[2] >= fits[4]
    assert P.largest_fit(m, 10 * 2**20, slots=(1,))[1] is None   # weights alone do not fit


@pytest.mark.parametrize("text,value", [("8GB", 8 * 10**9), ("8GiB", 8 * 2**30), ("8G", 8 * 2**30),
                                        ("512MiB", 512 * 2**20), ("1.5GB", 1.5e9), ("123456", 123456),
                                        ("2 TB", 2 * 10**12), ("64k", 64 * 1024)])
def test_parse_size(text, value):
    assert P.parse_size(text) == int(value)


@pytest.mark.parametrize("bad", ["", "lots", "8XB", "-1GB"])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError):
        P.parse_size(bad)


def test_plan_cli(smollm2_path):
    r = runner.invoke(app, ["plan", str(smollm2_path), "--memory", "8GB", "--ctx", "512,2048", "--slots", "1,2"])
    assert r.exit_code == 0, r.output
    assert "weights" in r.output and "largest context that fits" in r.output
    assert r.output.count(" yes") == 4
    r = runner.invoke(app, ["plan", str(smollm2_path), "--memory", "8GB", "--kv", "q8_0", "--json",
                            "--ctx", "1024", "--slots", "1"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["kv"] == "q8_0" and d["rows"][0]["kv_bytes"] == 2 * 30 * 3 * 64 * 1024 * 34 // 32
    r = runner.invoke(app, ["plan", str(smollm2_path), "--kv", "q8_0"])
    assert r.exit_code == 0 and "1.0625 B" in r.output
    # a budget too small for anything: plan still answers, and says so
    r = runner.invoke(app, ["plan", str(smollm2_path), "--memory", "50MB", "--ctx", "512", "--slots", "1"])
    assert r.exit_code == 0 and " NO" in r.output and "none" in r.output


def test_plan_cli_errors(smollm2_path, tmp_path):
    r = runner.invoke(app, ["plan", str(smollm2_path), "--memory", "lots"])
    assert r.exit_code == 1 and "memory size" in r.output
    r = runner.invoke(app, ["plan", str(smollm2_path), "--kv", "q4_0"])
    assert r.exit_code == 1 and "--kv" in r.output
    r = runner.invoke(app, ["plan", str(smollm2_path), "--ctx", "0"])
    assert r.exit_code == 1
    r = runner.invoke(app, ["plan", str(tmp_path / "missing.gguf")])
    assert r.exit_code == 1 and "error:" in r.output


# ------------------------------------------------------------------ doctor

def test_doctor_cpu_is_truthful():
    rep = cpu_report()
    assert rep["arch"] == platform.machine()
    best = int(lib.ei_cpu_best_isa())
    assert rep["kernels"].startswith(ffi.string(lib.ei_isa_name(best)).decode())
    assert rep["physical_cores"] == int(lib.ei_physical_cores()) >= 1
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith(("flags", "Features")):
                flags = set(line.split(":", 1)[1].split())
                break
    assert set(rep["features"]) <= flags
    if rep["arch"] == "x86_64":
        assert ("avx2" in rep["isa_supported"]) == ("avx2" in flags and "fma" in flags and "f16c" in flags)
        assert "neon" not in rep["isa_supported"]
    if rep["arch"] == "aarch64":
        assert "neon" in rep["isa_supported"]


def test_doctor_cuda_says_why_not():
    rep = cuda_report()
    if not rep["devices"]:
        assert rep["why_none"]
        if shutil.which("nvidia-smi") is None:
            assert "nvidia-smi not found" in rep["why_none"]
    else:  # a machine with a GPU: the report carries what a user needs
        for g in rep["devices"]:
            assert g["name"] and g["compute_capability"]


def test_doctor_memory():
    rep = memory_report()
    assert rep["total"] and rep["total"] > 0
    assert 0 < rep["available"] <= (rep.get("cgroup_limit") or rep["total"])


def test_doctor_with_model(smollm2_path):
    rep = doctor_report(str(smollm2_path), n_threads=2)
    m = rep["model"]
    free = rep["memory"]["available"]
    best = m["largest_ctx_x_slots"]
    assert best is not None
    shape = P.model_shape(smollm2_path)
    assert P.plan_one(shape, best["ctx"], best["slots"], memory=free, n_threads=2).fits
    text = format_report(rep)
    assert "fits" in text and "--ctx" in text


def test_doctor_cli(smollm2_path):
    r = runner.invoke(app, ["doctor"])
    assert r.exit_code == 0, r.output
    assert "CPU" in r.output and "kernels" in r.output and "CUDA" in r.output and "memory" in r.output
    if not shutil.which("nvidia-smi") and not os.path.exists("/usr/lib/x86_64-linux-gnu/libcuda.so.1"):
        assert "CUDA      none:" in r.output
    r = runner.invoke(app, ["doctor", str(smollm2_path), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["model"]["largest_ctx_x_slots"]["ctx"] >= 256
