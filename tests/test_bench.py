"""`edgeinfer bench`: a fast smoke test on the real model (tiny sizes, one repetition).

Speed is measured by the benchmark, never asserted here: these tests only prove that every
documented field is present and sane, and that the peer paths work (or skip cleanly).
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from tests.support.strict import require

from edgeinfer.tools.bench import (SCHEMA, BenchConfig, Spread, _parse_peer, format_table, parse_threads,
                             run_bench)

SPREAD_KEYS = {"median", "min", "max", "stdev", "values"}
RUN_KEYS = {"engine", "label", "threads", "n_ctx", "pp", "tg", "tg_depth", "tg_depth_retention",
            "ttft_s", "tpot_s", "kv_bytes", "scratch_bytes", "peak_rss_bytes",
            "peak_rss_baseline_bytes", "process_peak_rss_bytes", "process_rss_bytes",
            "cost_per_1m_output_tokens"}
RATIO_KEYS = {"threads", "engine", "peer", "pp", "tg", "tg_depth", "ttft", "tpot", "peak_rss"}
CONFIG_KEYS = {"threads", "pp", "tg", "reps", "batch", "n_ctx", "tg_prompt", "prompt_len",
               "output_len", "ctx_depth", "price_per_hour", "compare", "isa", "kv", "device", "seed",
               "isolated_rss", "process_per_engine", "order", "profile", "floor_gb_s"}
SYSTEM_KEYS = {"cpu", "n_cpus", "isa", "platform", "python", "edgeinfer", "llama_cpp",
               "onnxruntime_genai", "loadavg_start", "loadavg_end"}


def _check_spread(s: dict, n: int, positive: bool = True) -> None:
    assert set(s) == SPREAD_KEYS
    assert len(s["values"]) == n
    assert s["min"] <= s["median"] <= s["max"]
    assert s["stdev"] >= 0
    if positive:
        assert s["min"] > 0


def _check_run(r: dict, cfg_pp: int, cfg_tg: int, reps: int, depth: int | None,
               priced: bool, isolated: bool, own_process: bool = False) -> None:
    assert set(r) == RUN_KEYS
    assert r["pp"]["n_tokens"] == cfg_pp
    _check_spread(r["pp"]["tokens_per_s"], reps)
    _check_spread(r["pp"]["seconds"], reps)
    assert r["tg"]["n_tokens"] == cfg_tg
    _check_spread(r["tg"]["tokens_per_s"], reps)
    _check_spread(r["ttft_s"], reps)
    _check_spread(r["tpot_s"], reps)
    if depth is None:
        assert r["tg_depth"] is None and r["tg_depth_retention"] is None
    else:
        assert r["tg_depth"]["depth"] == depth
        _check_spread(r["tg_depth"]["tokens_per_s"], reps)
        assert r["tg_depth_retention"] > 0
    assert r["kv_bytes"] > 0
    if own_process:   # the bench process holds no engine: its RSS is not reported
        assert r["process_peak_rss_bytes"] is None and r["process_rss_bytes"] is None
    else:
        assert r["process_peak_rss_bytes"] > 0 and r["process_rss_bytes"] > 0
    if isolated:
        assert r["peak_rss_bytes"] > r["peak_rss_baseline_bytes"] > 0
    if priced:
        assert r["cost_per_1m_output_tokens"] > 0
    else:
        assert r["cost_per_1m_output_tokens"] is None


@pytest.mark.slow
def test_bench_json_smoke(smollm2_path):
    """The CLI path: --pp 32 --tg 8 --reps 1 --json, every field present and sane."""
    from typer.testing import CliRunner

    from edgeinfer.cli import app

    res = CliRunner().invoke(app, [
        "bench", str(smollm2_path), "--pp", "32", "--tg", "8", "--reps", "1", "--json",
        "--threads", "1", "--prompt-len", "16", "--output-len", "4", "--ctx-depth", "24",
        "--price-per-hour", "0.5", "--quiet"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert set(d) == {"schema", "date", "command", "model", "system", "config", "runs", "ratios",
                      "skipped", "profile"}
    assert d["profile"] is None
    assert d["schema"] == SCHEMA
    assert set(d["config"]) == CONFIG_KEYS
    assert set(d["system"]) == SYSTEM_KEYS
    assert set(d["model"]) == {"name", "path", "file_bytes", "file_type"}
    assert d["model"]["file_type"] == "Q4_1" and d["model"]["file_bytes"] > 0
    assert d["config"]["n_ctx"] >= 32 and d["config"]["threads"] == [1]
    assert d["ratios"] == [] and d["skipped"] == []
    (run,) = d["runs"]
    assert run["engine"] == "edgeinfer" and run["threads"] == 1
    assert run["scratch_bytes"] > 0
    _check_run(run, 32, 8, 1, depth=24, priced=True, isolated=True)
    # cost = (price / 3600) / tg tokens/s * 1e6
    tg = run["tg"]["tokens_per_s"]["median"]
    assert run["cost_per_1m_output_tokens"] == pytest.approx(0.5 / 3600 / tg * 1e6)


@pytest.mark.oracle
@pytest.mark.slow
def test_bench_compare_llama_cpp_and_missing_ort(smollm2_path):
    """The compare path with tiny sizes: llama.cpp interleaved, ratios, an absent ORT peer skipped."""
    require("llama_cpp")
    lines: list[str] = []
    cfg = BenchConfig(model=str(smollm2_path), threads=[2], pp=16, tg=4, reps=2, prompt_len=8,
                      output_len=3, compare=["llama.cpp", "ort-genai:/nonexistent/ort-model"],
                      isolated_rss=False)
    res = run_bench(cfg, log=lines.append)
    d = res.to_dict()
    assert [r["engine"] for r in d["runs"]] == ["edgeinfer", "llama.cpp"]
    for r in d["runs"]:
        _check_run(r, 16, 4, 2, depth=None, priced=False, isolated=False)
        assert r["peak_rss_bytes"] is None
    assert d["runs"][1]["scratch_bytes"] is None
    (ratio,) = d["ratios"]
    assert set(ratio) == RATIO_KEYS
    assert ratio["peer"] == "llama.cpp" and ratio["threads"] == 2
    assert ratio["pp"] > 0 and ratio["tg"] > 0 and ratio["ttft"] > 0 and ratio["tpot"] > 0
    assert ratio["tg_depth"] is None and ratio["peak_rss"] is None
    (skip,) = d["skipped"]
    assert skip["engine"] == "ort-genai" and "genai_config.json" in skip["reason"]
    assert any("skipping ort-genai" in s for s in lines)
    table = format_table(res)
    assert "llama.cpp" in table and "ratio" in table and "skipped" in table
    json.loads(res.to_json())  # serialisable


@pytest.mark.oracle
@pytest.mark.slow
def test_bench_process_per_engine(smollm2_path):
    """--process-per-engine: the same interleaved schedule with each engine in a worker process
    of its own; a peer that cannot run is skipped through its worker, and a worker's failure
    is an error with the reason, not a hang."""
    require("llama_cpp")
    import os

    from edgeinfer.tools.engine_process import EngineProcessError, ProcessRunner

    cfg = BenchConfig(model=str(smollm2_path), threads=[2], pp=16, tg=4, reps=2, prompt_len=8,
                      output_len=3, compare=["llama.cpp", "ort-genai:/nonexistent/ort-model"],
                      isolated_rss=False, process_per_engine=True)
    res = run_bench(cfg)
    d = res.to_dict()
    assert [r["engine"] for r in d["runs"]] == ["edgeinfer", "llama.cpp"]
    assert d["runs"][0]["label"].startswith("edgeinfer (") and d["runs"][1]["label"].startswith("llama.cpp")
    for r in d["runs"]:
        _check_run(r, 16, 4, 2, depth=None, priced=False, isolated=False, own_process=True)
    (ratio,) = d["ratios"]
    assert ratio["pp"] > 0 and ratio["tg"] > 0 and ratio["ttft"] > 0 and ratio["tpot"] > 0
    (skip,) = d["skipped"]
    assert skip["engine"] == "ort-genai" and "genai_config.json" in skip["reason"]
    assert d["config"]["process_per_engine"] is True and "worker process" in d["config"]["order"]
    assert "worker process of its own" in format_table(res)

    r = ProcessRunner("edgeinfer", None, str(smollm2_path), 1, 256, 64)
    try:
        assert r._p.pid != os.getpid() and r.n_vocab == 49152 and r.kv_bytes > 0
        assert r.pp(list(range(100, 116))) > 0
        with pytest.raises(EngineProcessError, match="49152"):   # out-of-vocab id: the engine's error
            r.pp([49152])
        assert r.tg([100, 101], 2) > 0                            # and the worker still serves
    finally:
        r.close()
    assert r._p.returncode == 0
    children = _child_pids()
    with pytest.raises(EngineProcessError, match="nonexistent"):
        ProcessRunner("edgeinfer", None, "/nonexistent/model.gguf", 1, 256, 64)
    assert _child_pids() <= children   # the worker that could not load is gone


def test_bench_before_step_runs_right_before_each_timed_step(smollm2_path, monkeypatch):
    """run_bench's before_step (scripts/host_table.py reads the memory bandwidth there) runs right
    before every timed step of every rep: prefill, decode, decode at depth, TTFT/TPOT; not before
    the warm-up."""
    import edgeinfer.tools.bench as bench

    events: list[str] = []

    class Spy:
        def __init__(self, runner):
            self._r = runner

        def __getattr__(self, name):
            return getattr(self._r, name)

        def pp(self, ids):
            events.append("pp")
            return self._r.pp(ids)

        def tg(self, ids, n):
            events.append("tg")
            return self._r.tg(ids, n)

        def ttft_tpot(self, ids, n):
            events.append("ttft")
            return self._r.ttft_tpot(ids, n)

    real = bench.make_runner
    monkeypatch.setattr(bench, "make_runner", lambda *a, **k: Spy(real(*a, **k)))
    cfg = BenchConfig(model=str(smollm2_path), threads=[1], pp=8, tg=2, reps=2, prompt_len=8, output_len=2,
                      ctx_depth=16, isolated_rss=False)
    run_bench(cfg, before_step=lambda: events.append("read"))
    assert events == ["pp", "tg"] + ["read", "pp", "read", "tg", "read", "tg", "read", "ttft"] * 2


def _child_pids() -> set[int]:
    import os
    from pathlib import Path

    me = str(os.getpid())
    return {int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(p) == me}


def _ppid(proc) -> str:
    try:
        return (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        return ""


def test_bench_cli_errors():
    from typer.testing import CliRunner

    from edgeinfer.cli import app

    r = CliRunner().invoke(app, ["bench", "default", "--threads", "1,x", "--quiet"])
    assert r.exit_code == 1 and "not an integer" in r.output
    r = CliRunner().invoke(app, ["bench", "default", "--compare", "vllm", "--quiet"])
    assert r.exit_code == 1 and "unknown peer" in r.output
    r = CliRunner().invoke(app, ["bench", "default", "--pp", "600", "--ctx", "256", "--quiet"])
    assert r.exit_code == 1 and "too small" in r.output
    r = CliRunner().invoke(app, ["bench", "default", "--kv", "q4_0", "--quiet"])
    assert r.exit_code == 1 and "kv must be one of" in r.output


@pytest.mark.oracle
@pytest.mark.slow
def test_bench_q8_0_kv_on_both_engines(smollm2_path):
    """--kv q8_0 gives both engines a Q8_0 KV cache (llama.cpp through flash attention): the same
    KV bytes, 34/64 of f16's, and both decode at depth."""
    require("llama_cpp")
    cfg = BenchConfig(model=str(smollm2_path), threads=[2], pp=16, tg=4, reps=1, prompt_len=8,
                      output_len=3, ctx_depth=40, compare=["llama.cpp"], isolated_rss=False, kv="q8_0")
    res = run_bench(cfg)
    d = res.to_dict()
    ours, theirs = d["runs"]
    assert d["config"]["kv"] == "q8_0"
    n_ctx = d["config"]["n_ctx"]
    f16_bytes = 2 * 30 * 3 * 64 * n_ctx * 2          # SmolLM2: 30 layers, 3 KV heads of 64
    assert ours["kv_bytes"] == theirs["kv_bytes"] == f16_bytes * 34 // 64
    for r in (ours, theirs):
        assert r["tg_depth"]["tokens_per_s"]["median"] > 0
    assert "KV q8_0" in format_table(res)


@pytest.mark.oracle
def test_llama_cpp_peer_runs_flash_attention_as_its_tools_do(smollm2_path):
    """The llama.cpp peer decodes with flash attention on (llama.cpp's tools default on a CPU;
    llama-cpp-python's is off) unless the spec says :no-fa; its label says which."""
    require("llama_cpp")
    import llama_cpp

    from edgeinfer.tools.peers import make_runner
    for arg, want in ((None, llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED), ("no-fa", llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)):
        r = make_runner("llama.cpp", arg, str(smollm2_path), 1, 256, 64)
        try:
            assert r.llm.context_params.flash_attn_type == want
            assert r.label.endswith("no-fa") == (arg == "no-fa")
        finally:
            r.close()


# llama.cpp's system info lines of two real builds of llama-cpp-python 0.3.36 on an AVX-512 host:
# scripts/install_oracles.sh's (every set but AMX) and an AVX2-only one (-DGGML_AVX2=ON alone)
_INFO_FULL = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | "
              "AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ")
_INFO_AVX2 = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | "
              "OPENMP = 1 | REPACK = 1 | ")


@pytest.mark.parametrize("info, want", [(_INFO_FULL, "avx512"), (_INFO_AVX2, "avx2"),
                                        ("CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | DOTPROD = 1 | ", "neon"),
                                        ("CPU : SSE3 = 1 | ", "")])
def test_peer_label_names_the_widest_vector_set_ggml_was_built_with(info, want):
    from edgeinfer.tools.peers import ggml_vector_isa
    assert ggml_vector_isa(info) == want


# /proc/cpuinfo's flag -> the name in llama.cpp's system info line
_PEER_SETS = {"avx2": "AVX2", "avx512f": "AVX512", "avx512_vnni": "AVX512_VNNI", "avx512vbmi": "AVX512_VBMI",
              "avx512_bf16": "AVX512_BF16"}


@pytest.mark.oracle
def test_llama_cpp_peer_is_built_for_this_host(smollm2_path):
    """The installed peer is built with every vector set of the host that a user's build of
    llama-cpp-python takes (AVX2, AVX-512 with VNNI, VBMI and BF16) and without AMX
    (scripts/install_oracles.sh): a peer built for less would make every ratio look better than
    users see. The bench's label names its widest set."""
    require("llama_cpp")
    import llama_cpp

    from edgeinfer.tools.peers import make_runner
    flags = set(open("/proc/cpuinfo").read().split()) if os.path.exists("/proc/cpuinfo") else set()
    if "avx2" not in flags:
        pytest.skip("not an x86 host with AVX2")
    info = llama_cpp.llama_print_system_info().decode(errors="replace")
    missing = [name for flag, name in _PEER_SETS.items() if flag in flags and f"{name} = 1" not in info]
    assert not missing, f"llama.cpp built without {missing}: {info}"
    assert "AMX_INT8 = 1" not in info, info
    r = make_runner("llama.cpp", None, str(smollm2_path), 1, 256, 64)
    try:
        assert f"({'avx512' if 'avx512f' in flags else 'avx2'})" in r.label, r.label
    finally:
        r.close()


@pytest.mark.parametrize("vendor, family, model, name, core", [
    ("AuthenticAMD", 26, 2, "AMD EPYC", "AMD EPYC (Zen 5, family 26 model 2)"),          # EPYC 9005 (Turin)
    ("AuthenticAMD", 25, 17, "AMD EPYC", "AMD EPYC (Zen 4, family 25 model 17)"),        # EPYC 9004 (Genoa)
    ("AuthenticAMD", 25, 1, "AMD EPYC 7763", "AMD EPYC 7763 (Zen 3, family 25 model 1)"),  # EPYC 7003 (Milan)
    ("GenuineIntel", 6, 143, "Intel(R) Xeon(R) Platinum 8480+", "Intel(R) Xeon(R) Platinum 8480+"),
])
def test_cpu_name_names_the_amd_core(vendor, family, model, name, core):
    """A VM's bare "AMD EPYC" gets its core generation from cpuid's family and model (the
    processors' published numbers), so a table cannot call a Zen 5 host Zen 4."""
    from edgeinfer.tools.bench import cpu_name
    info = (f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
            f"model name\t: {name}\n\nprocessor\t: 1\nvendor_id\t: {vendor}\ncpu family\t: 0\n")
    assert cpu_name(info) == core


def test_helpers():
    assert parse_threads("1,2") == [1, 2]
    assert parse_threads(" 4 ") == [4]
    assert parse_threads(3) == [3]
    with pytest.raises(ValueError):
        parse_threads("0")
    with pytest.raises(ValueError):
        parse_threads("")
    s = Spread.of([3.0, 1.0, 2.0])
    assert (s.median, s.min, s.max) == (2.0, 1.0, 3.0) and s.stdev == pytest.approx(1.0)
    assert Spread.of([5.0]).stdev == 0.0
    assert _parse_peer("llama.cpp") == ("llama.cpp", None)
    assert _parse_peer("llama.cpp:no-fa") == ("llama.cpp", "no-fa")
    with pytest.raises(ValueError, match=":no-fa"):
        _parse_peer("llama.cpp:fast")
    assert _parse_peer("ort-genai:/m/dir") == ("ort-genai", "/m/dir")
    with pytest.raises(ValueError):
        _parse_peer("ort-genai")
    cfg = BenchConfig(pp=512, tg=128, ctx_depth=1500)
    assert cfg.effective_ctx() == 1792 and cfg.effective_ctx() % 256 == 0
    assert BenchConfig(pp=512, tg=128).effective_ctx() == 512
    with pytest.raises(ValueError, match="device must be one of cpu, auto, cuda"):
        BenchConfig(device="gpu").validate()


# an environmental skip even in strict mode: not every platform has an onnxruntime-genai wheel
ORT_OPTIONAL = "the ONNX Runtime GenAI peer is optional (pip install onnxruntime-genai)"

@pytest.fixture(scope="module")
def ort_model_dir(smollm2_path, tmp_path_factory):
    """The ORT GenAI int4 model of scripts/make_ort_model.py: the cached one if it exists,
    else built here (HF checkpoint rebuilt from the GGUF, then ORT GenAI's builder)."""
    pytest.importorskip("onnxruntime_genai", reason=ORT_OPTIONAL)
    from edgeinfer.hub import cache_dir

    cached = cache_dir() / "ort" / "smollm2-int4"
    if (cached / "genai_config.json").is_file():
        return cached
    for mod in ("onnx", "onnx_ir", "torch", "transformers", "gguf"):
        pytest.importorskip(mod, reason=f"building the ONNX Runtime GenAI peer's model needs {mod}")
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "make_ort_model", Path(__file__).resolve().parent.parent / "scripts" / "make_ort_model.py")
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    tmp = tmp_path_factory.mktemp("ort")
    assert mk.main(["--gguf", str(smollm2_path), "--hf-dir", str(tmp / "hf"),
                    "--out", str(tmp / "ort")]) == 0
    return tmp / "ort"


@pytest.mark.slow
def test_bench_compare_ort_genai(smollm2_path, ort_model_dir):
    """The ORT GenAI peer on a real int4 model directory (skips without onnxruntime-genai):
    interleaved with edgeinfer, every field present, ratios computed, nothing skipped."""
    cfg = BenchConfig(model=str(smollm2_path), threads=[1], pp=16, tg=4, reps=1, prompt_len=8,
                      output_len=3, compare=[f"ort-genai:{ort_model_dir}"], isolated_rss=False,
                      ctx_depth=24)
    d = run_bench(cfg).to_dict()
    assert d["skipped"] == []
    assert [r["engine"] for r in d["runs"]] == ["edgeinfer", "ort-genai"]
    for r in d["runs"]:
        _check_run(r, 16, 4, 1, depth=24, priced=False, isolated=False)
    ort = d["runs"][1]
    assert ort["label"].startswith("ort-genai") and ort["scratch_bytes"] is None
    # K and V, f32, for n_ctx cells: 30 layers x 3 KV heads x 64
    assert ort["kv_bytes"] == d["config"]["n_ctx"] * 30 * 2 * 3 * 64 * 4
    (ratio,) = d["ratios"]
    assert ratio["peer"] == "ort-genai" and ratio["tg"] > 0 and ratio["tpot"] > 0
    assert d["system"]["onnxruntime_genai"]


def test_ort_genai_runner_steps(ort_model_dir):
    """tg(prefix, n) runs exactly n one-token forwards after the prompt: the sequence ends
    n + 1 tokens past the prefix (the untimed first pick, then n forward+pick steps)."""
    pytest.importorskip("onnxruntime_genai", reason=ORT_OPTIONAL)
    from edgeinfer.tools.bench import OrtGenaiRunner

    r = OrtGenaiRunner(str(ort_model_dir), threads=1, n_ctx=256)
    assert r.n_vocab == 49152
    prefix = list(range(1000, 1016))
    g = r._generator(len(prefix) + 6)
    g.append_tokens(np.asarray(prefix, dtype=np.int32))
    for _ in range(1 + 4):
        r._step(g)
    assert g.token_count() == len(prefix) + 5
    assert r.tg(prefix, 4) > 0
    ttft, tpot = r.ttft_tpot(prefix, 3)
    assert ttft > 0 and tpot > 0
    r.close()


def test_memory_floor_script(smollm2_path):
    """scripts/memory_floor.py builds its C probe and prints the floor for the model's bytes."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "memory_floor.py"
    out = subprocess.run([sys.executable, str(script), str(smollm2_path), "--depth", "1500", "--threads", "1",
                          "--rounds", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "KV at depth 1500 (f16) 34.6 MB" in out.stdout      # 30 x 3 x 64 x 1500 x 2 B x 2
    pct = int(out.stdout.split("floor: at most ")[1].split("%")[0])
    assert 30 < pct < 100
    share = int(out.stdout.split("the same loop's median read: ")[1].split("(")[1].split("%")[0])
    assert 0 < share <= 100      # the floor is the best read; the median shows the host's spread


def test_memory_floor_any_gguf(tmp_path):
    """memory_floor.py takes any GGUF file, including an architecture edgeinfer cannot run
    (written by the gguf package): bytes from the tensor table, the KV shape from metadata,
    an untied token embedding left out of the bytes streamed per token."""
    import subprocess
    import sys
    from pathlib import Path

    gguf = require("gguf")
    path = tmp_path / "other.gguf"
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(3)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(1)
    w.add_key_length(32)
    w.add_value_length(32)
    w.add_tensor("token_embd.weight", np.zeros((1000, 64), dtype=np.float32))   # 256000 B
    w.add_tensor("output.weight", np.zeros((500, 64), dtype=np.float32))        # 128000 B
    w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), dtype=np.float16))  # 8192 B
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    script = Path(__file__).resolve().parent.parent / "scripts" / "memory_floor.py"
    out = subprocess.run([sys.executable, str(script), str(path), "--depth", "1000", "--threads", "1",
                          "--rounds", "1", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["weight_bytes"] == 128000 + 8192 + 256     # output + attn_q + one 64 x f32 embedding row
    assert res["untied_embd_bytes"] == 256000
    assert res["kv_bytes"] == 3 * 1 * (32 + 32) * 1000 * 2   # layers x KV heads x (K + V) x depth x f16
    bad = subprocess.run([sys.executable, str(script), str(path), "--kv", "q4"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "--kv" in bad.stderr


def test_memory_floor_check(smollm2_path):
    """--check exits 1 when an observed decode (tokens/s x bytes per token) passes the floor,
    0 when it stays below: a decode of 1e6 tok/s on SmolLM2 would stream ~100 TB/s."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "memory_floor.py"
    run = lambda tok_s: subprocess.run(  # noqa: E731
        [sys.executable, str(script), str(smollm2_path), "--threads", "1", "--rounds", "1", "--depth", "16",
         "--decode", str(tok_s), "--check", "--json"], capture_output=True, text=True, timeout=120)
    above, below = run(1e6), run(1e-3)
    assert above.returncode == 1 and "above the floor" in above.stderr
    assert json.loads(above.stdout)["floor_below_decode"] is True
    assert below.returncode == 0, below.stderr
    (check,) = json.loads(below.stdout)["decode_checks"]
    gguf = require("gguf")
    tensors = {t.name: t for t in gguf.GGUFReader(str(smollm2_path)).tensors}
    embd = tensors["token_embd.weight"]   # tied: read whole as the head, and one row for the token
    per_token = sum(int(t.n_bytes) for t in tensors.values()) + int(embd.n_bytes) // int(embd.shape[1]) \
        + 30 * 3 * 64 * 16 * 2 * 2           # KV at depth 16: layers x KV heads x head dim x cells x f16 x (K, V)
    assert check["gb_per_s"] == pytest.approx(1e-3 * per_token / 1e9)


def test_stage_rows_arithmetic():
    """GB/s = bytes / seconds; the share of the floor; bytes no stage timed go to "other";
    the wall time the stages leave is "outside the forward"; the total is bytes / wall."""
    from edgeinfer.tools.stage_profile import stage_rows

    rows = {r["stage"]: r for r in stage_rows({"qkv": 0.002, "ffn_act": 0.001}, {"qkv": 60_000_000, "norm": 4_000_000},
                                              wall_s=0.004, floor_gb_s=40.0)}
    assert list(rows) == ["qkv", "ffn_act", "other", "outside the forward", "total"]
    assert rows["qkv"]["gb_per_s"] == pytest.approx(30.0) and rows["qkv"]["share_of_floor"] == pytest.approx(0.75)
    assert rows["qkv"]["ms_per_token"] == pytest.approx(2.0)
    assert rows["ffn_act"]["gb_per_s"] is None                     # no bytes: no bandwidth
    assert rows["other"]["bytes_per_token"] == 4_000_000 and rows["other"]["ms_per_token"] is None
    assert rows["outside the forward"]["ms_per_token"] == pytest.approx(1.0)
    assert rows["total"]["bytes_per_token"] == 64_000_000 and rows["total"]["gb_per_s"] == pytest.approx(16.0)
    assert stage_rows({"qkv": 0.002}, {"qkv": 1})[-1]["share_of_floor"] is None   # no floor given


@pytest.mark.slow
def test_bench_profile_and_floor(smollm2_path):
    """--profile: one profiled decode per thread count, every CPU stage timed, each stage's bytes
    the file's tensors as the gguf package sizes them; --floor: a decode above it is announced.
    Then a prefill of pp tokens: its stages' shares add up to its time, and their multiply-adds
    are the file's matrix elements per token (the output head for the last token only) and each
    token's query heads over the cells up to its own, as the gguf package's shapes give them."""
    gguf = require("gguf")
    cfg = BenchConfig(model=str(smollm2_path), threads=[1], pp=8, tg=4, reps=1, prompt_len=8, output_len=2,
                      isolated_rss=False, profile=True, floor_gb_s=1e-6)
    d = run_bench(cfg).to_dict()
    (prof,) = d["profile"]
    stages = {r["stage"]: r for r in prof["stages"]}
    assert {"embed", "norm", "qkv", "rope_kv", "attention", "attn_out", "ffn_up", "ffn_act", "ffn_down",
            "head", "outside the forward", "total"} <= set(stages)
    assert all(stages[k]["ms_per_token"] > 0 for k in ("qkv", "attention", "ffn_up", "ffn_down", "head"))
    timed = sum(r["ms_per_token"] for r in prof["stages"][:10])   # the runtime's stages run inside the timed steps
    assert timed <= prof["wall_ms_per_token"] and prof["mean_depth"] == cfg.tg_prompt + (4 + 1) / 2
    sizes: dict[str, int] = {}
    elems: dict[str, int] = {}
    tensors = gguf.GGUFReader(str(smollm2_path)).tensors
    for t in tensors:
        base = t.name.split(".")[2] if t.name.startswith("blk.") else t.name.split(".")[0]
        sizes[base] = sizes.get(base, 0) + int(t.n_bytes)
        elems[base] = elems.get(base, 0) + int(t.n_elements)
    assert stages["ffn_up"]["bytes_per_token"] == sizes["ffn_gate"] + sizes["ffn_up"]
    assert stages["qkv"]["bytes_per_token"] == sizes["attn_q"] + sizes["attn_k"] + sizes["attn_v"]
    assert stages["head"]["bytes_per_token"] == sizes["token_embd"] + sizes["output_norm"]   # tied head
    tg = d["runs"][0]["tg"]
    assert tg["gb_per_s"]["median"] == pytest.approx(tg["tokens_per_s"]["median"] * tg["bytes_per_token"] / 1e9)
    table = format_table(d)
    assert "decode profile, 1 thread(s)" in table and "ABOVE THE MEMORY FLOOR" in table
    pre = {r["stage"]: r for r in prof["prefill"]["stages"]}
    assert prof["prefill"]["n_tokens"] == 8 and sum(r["share"] for r in pre.values()) == pytest.approx(1.0)
    rate = lambda stage, macs: macs / (pre[stage]["ms"] / 1e3) / 1e9   # noqa: E731
    assert pre["ffn_up"]["gmac_per_s"] == pytest.approx(rate("ffn_up", 8 * (elems["ffn_gate"] + elems["ffn_up"])))
    assert pre["head"]["gmac_per_s"] == pytest.approx(rate("head", elems["token_embd"]))   # tied head, one token
    q = [t for t in tensors if t.name.endswith("attn_q.weight")]   # K and V as long as a query head here
    assert pre["attention"]["gmac_per_s"] == pytest.approx(rate("attention", len(q) * 2 * int(q[0].shape[1]) * 8 * 9 // 2))
    assert pre["norm"]["gmac_per_s"] is None and "prefill profile, 1 thread(s)" in table


def test_bench_profile_at_depth(smollm2_path):
    """--profile with --ctx-depth profiles the decode after ctx_depth tokens: the attention stage
    reads the KV of that depth (2 x layers x kv heads x head size x f16 per cell)."""
    cfg = BenchConfig(model=str(smollm2_path), threads=[1], pp=8, tg=4, reps=1, prompt_len=8, output_len=2,
                      ctx_depth=200, isolated_rss=False, profile=True)
    (prof,) = run_bench(cfg).to_dict()["profile"]
    assert prof["prompt_len"] == 200 and prof["mean_depth"] == 200 + (4 + 1) / 2
    attention = {r["stage"]: r for r in prof["stages"]}["attention"]
    assert attention["bytes_per_token"] == 2 * 30 * 3 * 64 * 2 * prof["mean_depth"]   # SmolLM2-135M's KV


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lfm2", "qwen35"])
def test_bench_profile_of_a_hybrid(kind, tmp_path):
    """A hybrid's recurrent layers: their mixer is timed as one "recurrent" stage holding exactly
    those layers' mixer tensors (none left as "other"), and only attention layers read KV."""
    gguf = require("gguf")
    require("transformers")
    from edgeinfer.convert import convert_checkpoint
    from tests.support import tiny_checkpoints as tc

    path = tmp_path / "f32.gguf"
    convert_checkpoint(str(tc.build(kind, tmp_path / "hf")), str(path), "f32")
    cfg = BenchConfig(model=str(path), threads=[1], pp=8, tg=4, reps=1, prompt_len=8, output_len=2,
                      isolated_rss=False, profile=True)
    (prof,) = run_bench(cfg).to_dict()["profile"]
    stages = {r["stage"]: r for r in prof["stages"]}
    assert "other" not in stages and stages["recurrent"]["ms_per_token"] > 0
    layers: dict[str, dict[str, int]] = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        if t.name.startswith("blk."):
            blk, base = t.name.split(".")[1], t.name.split(".")[2]
            layers.setdefault(blk, {})[base] = layers.setdefault(blk, {}).get(base, 0) + int(t.n_bytes)
    mtp = {blk for blk, b in layers.items() if "nextn" in b}   # Qwen3.5's MTP block: no plain decode reads it
    layers = {blk: b for blk, b in layers.items() if blk not in mtp}
    ffn_side = {"attn_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_attention_norm"}
    rec = [b for b in layers.values() if any(k.startswith(("ssm_", "shortconv")) for k in b)]
    assert 0 < len(rec) < len(layers)
    assert stages["recurrent"]["bytes_per_token"] == sum(n for b in rec for k, n in b.items() if k not in ffn_side)
    kv_rows = [int(t.shape[1]) for t in gguf.GGUFReader(str(path)).tensors
               if t.name.endswith("attn_k.weight") and t.name.split(".")[1] not in mtp]
    assert len(kv_rows) == len(layers) - len(rec)
    # the K and V rows (f16) one token writes: in each attention layer, none in a recurrent one
    assert stages["rope_kv"]["bytes_per_token"] == sum(2 * 2 * r for r in kv_rows)


def test_memory_floor_reader_serves_reads(monkeypatch):
    """The probe's serve mode (floor_vs_decode.py reads the bandwidth around each decode with it):
    each request times one read of the bytes; a request outside its limits is an error, not a
    crash, and the probe keeps serving."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "scripts"))
    from memory_floor import FloorReader

    with FloorReader(64 << 20, 1) as reader:
        assert 0.1 < reader.gb_s(1, 4, True) < 10_000
        with pytest.raises(RuntimeError, match="2 thread"):
            reader.gb_s(2, 4, True)   # more threads than the probe was started with
        assert reader.gb_s(1, 1, False) > 0.1
    assert reader.proc.returncode == 0
