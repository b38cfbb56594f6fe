"""The prompt cache that outlives the process (engine/prompt_cache.py, native/src/slot_io.c):
reuse after a restart with the same greedy text as a cold run, files that must never load
(corrupt, truncated, another model's), the LRU bound, llama.cpp's slot routes and cached_tokens.
The oracle for text is a cold run of an engine without a cache."""
from __future__ import annotations

import json
import logging
import os
import shutil
import urllib.request
from pathlib import Path

import pytest

import edgeinfer
from edgeinfer.engine.prompt_cache import HEADER, SUFFIX, PromptCache
from edgeinfer.server import ServerThread
from tests.support.strict import require

N_CTX = 1024
SYSTEM = "You are a careful assistant. " + " ".join(f"Rule {i}: answer briefly and kindly." for i in range(50))
PROMPT = SYSTEM + "\nQuestion: What is the capital of France?\nAnswer:"


def _load(path, cache_dir=None, **kw):
    return edgeinfer.load(path, n_ctx=N_CTX, n_threads=2, prompt_cache=cache_dir, **kw)


def _run(eng):
    out = eng.generate(PROMPT, max_tokens=12, temperature=0)
    return out.text, out.stats


def _fill(path, cache_dir) -> Path:
    """One engine's cold run stores the prompt; the cache file it wrote."""
    eng = _load(path, cache_dir)
    _run(eng)
    eng.scheduler.prompt_cache.flush()
    eng.close()
    files = list(Path(cache_dir).glob(f"*{SUFFIX}"))
    assert len(files) == 1
    return files[0]


@pytest.fixture(scope="module")
def cold(smollm2_path):
    eng = _load(smollm2_path)
    text, stats = _run(eng)
    eng.close()
    return text, stats


def test_after_a_restart_the_prompt_is_reused_and_the_text_is_the_cold_run(smollm2_path, tmp_path, cold):
    _fill(smollm2_path, tmp_path)
    eng = _load(smollm2_path, tmp_path)     # a new process's engine: nothing in its slots
    text, stats = _run(eng)
    eng.close()
    assert stats.cached_tokens >= 0.9 * stats.prompt_tokens
    assert text == cold[0]


def _corrupt(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0xFF       # one bit pattern inside the KV payload
    path.write_bytes(bytes(raw))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-4096])


@pytest.mark.parametrize("damage", [_corrupt, _truncate], ids=["corrupt", "truncated"])
def test_a_damaged_file_is_skipped_with_a_warning(smollm2_path, tmp_path, cold, damage, caplog):
    damage(_fill(smollm2_path, tmp_path))
    eng = _load(smollm2_path, tmp_path)
    with caplog.at_level(logging.WARNING, logger="edgeinfer"):
        text, stats = _run(eng)
    eng.close()
    assert stats.cached_tokens == 0 and text == cold[0]
    assert any("prompt cache: skipping" in r.message for r in caplog.records)


def test_another_models_file_is_skipped_with_a_warning(smollm2_path, tmp_path, caplog):
    # another model of the same tokenizer and KV shape: the default file with one weight bit flipped
    other = tmp_path / "other.gguf"
    shutil.copyfile(smollm2_path, other)
    first_weight = require("gguf").GGUFReader(str(smollm2_path)).data_offset
    with open(other, "r+b") as fh:
        fh.seek(first_weight)
        byte = fh.read(1)[0]
        fh.seek(first_weight)
        fh.write(bytes([byte ^ 1]))
    cache = tmp_path / "cache"
    _fill(other, cache)
    with caplog.at_level(logging.WARNING, logger="edgeinfer"):
        eng = _load(smollm2_path, cache)
        _, stats = _run(eng)
    eng.close()
    assert stats.cached_tokens == 0
    assert any("made by another model" in r.message for r in caplog.records)


def test_the_size_bound_evicts_the_least_recently_used(tmp_path):
    payload = bytes(1000)
    entry = HEADER.size + 4 * 3 + len(payload)
    cache = PromptCache(tmp_path, b"\1" * 32, "f16", max_bytes=2 * entry, min_tokens=1)
    for first in (1, 2):
        cache.store([first, 0, 0], payload)
        cache.flush()
    assert cache.lookup([1, 0, 0, 9], limit=3) is not None     # 1 is now more recent than 2
    cache.store([3, 0, 0], payload)
    cache.flush()
    fresh = PromptCache(tmp_path, b"\1" * 32, "f16", max_bytes=2 * entry, ram_bytes=0)   # disk only
    assert fresh.lookup([2, 0, 0, 9], limit=3) is None
    assert fresh.lookup([1, 0, 0, 9], limit=3) is not None and fresh.lookup([3, 0, 0, 9], limit=3) is not None


def _post(url: str, body: dict | None = None):
    req = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _chat_usage(url: str) -> dict:
    return _post(url + "/v1/completions", {"model": "m", "prompt": PROMPT, "max_tokens": 2, "temperature": 0})[1]["usage"]


def test_slot_routes_save_erase_restore_and_refuse_paths(smollm2_path, tmp_path):
    eng = _load(smollm2_path, tmp_path / "cache", n_slots=1)
    with ServerThread(eng, model_name="m") as srv:
        slot = srv.url + "/slots/0"
        assert _chat_usage(srv.url)["prompt_tokens_details"]["cached_tokens"] == 0
        st, out = _post(slot + "?action=save", {"filename": "sys.bin"})
        assert st == 200 and out["n_saved"] > 0 and (tmp_path / "cache" / "sys.bin").stat().st_size == out["n_written"]
        st, out = _post(slot + "?action=erase")
        assert st == 200 and out["n_erased"] > 0
        st, out = _post(slot + "?action=restore", {"filename": "sys.bin"})
        assert st == 200 and out["n_restored"] > 0
        usage = _chat_usage(srv.url)
        assert usage["prompt_tokens_details"]["cached_tokens"] >= 0.9 * usage["prompt_tokens"]
        (tmp_path / "outside.bin").write_bytes((tmp_path / "cache" / "sys.bin").read_bytes())
        for name in ("../outside.bin", str(tmp_path / "outside.bin"), "a/b.bin", "..", ".hidden"):
            for action in ("save", "restore"):
                st, out = _post(slot + f"?action={action}", {"filename": name})
                assert st == 400 and out["error"]["param"] == "filename", (name, action)
        assert sorted(os.listdir(tmp_path)) == ["cache", "outside.bin"]
        assert _post(slot + "?action=restore", {"filename": "missing.bin"})[0] == 400
        assert _post(srv.url + "/slots/7?action=save", {"filename": "x.bin"})[0] == 400
        assert _post(slot + "?action=load", {"filename": "x.bin"})[0] == 400
    eng.close()


def test_slot_routes_need_a_cache_directory(smollm2_path):
    eng = _load(smollm2_path, n_slots=1)
    with ServerThread(eng, model_name="m") as srv:
        assert _post(srv.url + "/slots/0?action=save", {"filename": "x.bin"})[0] == 501
    eng.close()


@pytest.mark.parametrize("kind", ["lfm2", "qwen35", "gemma3"])
def test_after_a_restart_hybrids_and_sliding_windows_reuse_the_prompt(kind, tmp_path):
    """The file holds a hybrid's recurrent state beside its attention layers' cells (LFM2's short
    convolutions, Qwen3.5's delta-rule matrices), and a sliding-window model's local ring (Gemma 3's
    window of 16 positions, far shorter than the prompt): after a restart the prompt is reused and the
    greedy tokens and log-probabilities are a cold run's."""
    import numpy as np

    from edgeinfer.convert import convert_checkpoint
    from tests.support import tiny_checkpoints as tc
    from tests.support.strict import require

    require("torch")
    require("transformers")
    path = tmp_path / "f32.gguf"
    convert_checkpoint(str(tc.build(kind, tmp_path / "hf")), str(path), "f32")
    prompt = [5 + (i * 7) % 60 for i in range(80)]

    def run(cache_dir=None):
        with edgeinfer.load(str(path), n_ctx=256, n_threads=2, prompt_cache=cache_dir) as e:
            out = e.generate(prompt, max_tokens=8, temperature=0, ignore_eos=True, logprobs=0)
            if cache_dir is not None:
                e.scheduler.prompt_cache.flush()
        return out.tokens, np.array([t.logprob for t in out.logprobs]), out.stats.cached_tokens

    cold = run()
    cache = tmp_path / "cache"
    first = run(cache)
    assert first[2] == 0
    tokens, lps, cached = run(cache)                   # a new process's engine: only the files remain
    assert cached >= 0.9 * len(prompt)
    assert tokens == cold[0]
    np.testing.assert_allclose(lps, cold[1], atol=1e-4)
