"""LoRA adapters per request, kept apart from the base weights: each adapter's logits and greedy
tokens against the file `edgeinfer convert --lora` merged (itself proven against peft in
test_convert.py), PEFT folders and GGUF adapters (ours and llama.cpp's converter's) alike,
llama.cpp applying our adapter file, requests of different adapters in one batch equal to their
solo runs, adapters for another base refused by name, load / unload at run time, and the
server's routes (`model` naming an adapter, llama.cpp's `lora` field, --lora-dir confinement,
the API key)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest
from tests.support.strict import require

torch = require("torch", "tiny checkpoints are built with torch")
require("transformers", "tiny checkpoints are built with transformers")
require("peft", "the adapters are PEFT's")

from tests.support import tiny_checkpoints  # noqa: E402

torch.set_num_threads(1)

import edgeinfer  # noqa: E402
from edgeinfer.convert import convert_checkpoint  # noqa: E402
from edgeinfer.convert.lora import convert_lora, write_adapter_gguf  # noqa: E402
from edgeinfer.engine import AdapterBusyError, AdapterError, UnknownAdapterError  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog, and then 12345 apples"
TOL = 1e-3      # the converter tests' F32 tolerance against transformers


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    p = {}
    for kind in ("llama", "qwen2", "phi3", "llama_256"):
        p[kind] = tiny_checkpoints.build(kind, root / kind)
    p["wide"] = tiny_checkpoints.build_lora(p["llama_256"], root / "wide")   # a llama of other widths
    p["a"] = tiny_checkpoints.build_lora(p["llama"], root / "a", seed=1)
    p["b"] = tiny_checkpoints.build_lora(p["llama"], root / "b", seed=2,
                                         targets=["q_proj", "gate_proj", "up_proj", "down_proj"])
    p["q_rs"] = tiny_checkpoints.build_lora(p["qwen2"], root / "q_rs", use_rslora=True)
    p["phi_fused"] = tiny_checkpoints.build_lora(p["phi3"], root / "phi_fused",
                                                 targets=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"])
    for name, kind, adapter in [("llama", "llama", None), ("qwen2", "qwen2", None), ("phi3", "phi3", None),
                                ("m_a", "llama", "a"), ("m_b", "llama", "b"), ("m_q_rs", "qwen2", "q_rs"),
                                ("m_phi_fused", "phi3", "phi_fused")]:
        p[name + ".gguf"] = root / f"{name}.f32.gguf"
        convert_checkpoint(str(p[kind]), str(p[name + ".gguf"]), "f32",
                           lora_dir=str(p[adapter]) if adapter else None)
    p["root"] = root
    return p


def _logits(path, ids, **kw):
    with edgeinfer.load(str(path), n_ctx=128, n_threads=2) as e:
        return e.logits(ids, **kw)


@pytest.mark.parametrize("base,adapter", [("llama", "a"), ("llama", "b"), ("qwen2", "q_rs"), ("phi3", "phi_fused")])
def test_peft_adapter_equals_merged_file(files, base, adapter):
    """Llama's permuted Q/K, Qwen2's biases with rsLoRA, Phi-3's fused qkv / gate_up cut by rows."""
    with edgeinfer.load(str(files[base + ".gguf"]), n_ctx=128, n_threads=2,
                        loras={adapter: str(files[adapter])}) as e:
        ids = e.tokenize(TEXT)
        ours, plain = e.logits(ids, lora=adapter), e.logits(ids)
    merged = _logits(files[f"m_{adapter}.gguf"], ids)
    assert float(np.abs(merged - plain).max()) > 1e-2      # the adapter does change the model
    assert float(np.abs(ours - merged).max()) <= TOL


@pytest.mark.parametrize("writer", ["edgeinfer", "llama.cpp"])
def test_gguf_adapter_equals_merged_file(files, tmp_path, writer):
    """A LoRA GGUF written by `edgeinfer convert-lora` or by llama.cpp's convert_lora_to_gguf.py."""
    out = tmp_path / f"a.{writer}.gguf"
    if writer == "edgeinfer":
        convert_lora(str(files["a"]), str(files["llama"]), str(out), "f32")
    else:
        from tests.support.llama_cpp_convert import convert_lora as llama_convert_lora
        llama_convert_lora(files["a"], files["llama"], out, "f32", tmp_path)
    with edgeinfer.load(str(files["llama.gguf"]), n_ctx=128, n_threads=2, loras={"a": str(out)}) as e:
        ids = e.tokenize(TEXT)
        ours = e.logits(ids, lora="a")
    assert float(np.abs(ours - _logits(files["m_a.gguf"], ids)).max()) <= TOL


@pytest.mark.oracle
def test_llama_cpp_applies_our_adapter_file(files, tmp_path):
    """Our adapter file in llama.cpp (its --lora) gives the merged file's logits, as in ours."""
    llama_cpp = require("llama_cpp")
    out = tmp_path / "a.gguf"
    convert_lora(str(files["a"]), str(files["llama"]), str(out), "f16")
    with edgeinfer.load(str(files["m_a.gguf"]), n_ctx=128, n_threads=2) as e:
        ids = e.tokenize(TEXT)
        merged = e.logits(ids)
    ll = llama_cpp.Llama(str(files["llama.gguf"]), lora_path=str(out), n_ctx=128, logits_all=True, verbose=False)
    ll.eval(ids)
    theirs = np.asarray(ll.scores[:len(ids)])
    plain = _logits(files["llama.gguf"], ids)
    assert float(np.abs(theirs - plain).max()) > 1e-2
    assert float(np.abs(theirs - merged).max()) <= TOL


def _greedy(e, prompt, lora=None, n=16):
    c = e.generate(prompt, max_tokens=n, temperature=0, logprobs=0, ignore_eos=True, lora=lora)
    return c.tokens, np.array([t.logprob for t in c.logprobs])


def test_greedy_tokens_and_logprobs_equal_merged(files):
    with edgeinfer.load(str(files["llama.gguf"]), n_ctx=128, n_threads=2, loras={"a": str(files["a"])}) as e:
        ids, lp = _greedy(e, TEXT, lora="a")
    with edgeinfer.load(str(files["m_a.gguf"]), n_ctx=128, n_threads=2) as m:
        ref_ids, ref_lp = _greedy(m, TEXT)
    assert ids == ref_ids
    assert float(np.abs(lp - ref_lp).max()) <= TOL


def test_mixed_adapters_in_one_batch_equal_solo(files):
    """Requests for a, b, a at half scale, a + b, and the base, at once in one continuous batch: each
    gives exactly its solo tokens and logprobs (the base matmul once, each row its own update)."""
    specs = ["a", "b", None, {"a": 0.5}, ["a", "b"]]
    with edgeinfer.load(str(files["llama.gguf"]), n_ctx=128, n_threads=2, n_slots=len(specs),
                        loras={"a": str(files["a"]), "b": str(files["b"])}) as e:
        solo = [_greedy(e, TEXT, lora=s) for s in specs]
        assert len({tuple(t) for t, _ in solo}) >= 3        # the adapters do lead elsewhere
        gens = [e.stream(TEXT, max_tokens=16, temperature=0, logprobs=0, ignore_eos=True, lora=s) for s in specs]
        together = []
        for g in gens:
            c = g.result()
            together.append((c.tokens, np.array([t.logprob for t in c.logprobs])))
        assert e.snapshot()["steps"] > 0
    for (t1, l1), (t2, l2) in zip(solo, together):
        assert t1 == t2
        np.testing.assert_array_equal(l1, l2)


def test_prefix_reuse_never_crosses_adapters(files):
    """A slot's cells computed with adapter a are not reused for the base or b (same prompt)."""
    with edgeinfer.load(str(files["llama.gguf"]), n_ctx=128, n_threads=2, n_slots=1,
                        loras={"a": str(files["a"]), "b": str(files["b"])}) as e:
        fresh = {s: _greedy(e, TEXT, lora=s) for s in ("a", None, "b")}
        for s in ("b", "a", None, "a"):      # one slot: each request follows another adapter's
            t, lp = _greedy(e, TEXT, lora=s)
            assert t == fresh[s][0]
            np.testing.assert_array_equal(lp, fresh[s][1])


def test_adapter_for_another_base_is_refused_by_tensor(files, tmp_path):
    with edgeinfer.load(str(files["llama.gguf"]), n_ctx=128, n_threads=2) as e:
        with pytest.raises(AdapterError, match=r"does not fit the base model: tensor 'model\.layers\.2\."):
            e.load_lora("w", str(files["wide"]))            # a deeper llama's
        wide = tmp_path / "wide.gguf"
        write_adapter_gguf({"blk.0.attn_k.weight": (np.ones((4, 256), np.float32), np.ones((64, 4), np.float32))},
                           "llama", str(wide))
        with pytest.raises(AdapterError, match=r"'blk\.0\.attn_k\.weight' is \[64, 32\] .* A is \[4, 256\]"):
            e.load_lora("w", str(wide))                     # a wider llama's
        out = tmp_path / "phi.gguf"
        convert_lora(str(files["phi_fused"]), str(files["phi3"]), str(out))
        with pytest.raises(AdapterError, match="architecture 'phi3'"):
            e.load_lora("p", str(out))
        with pytest.raises(AdapterError, match="not found"):
            e.load_lora("x", str(tmp_path / "missing"))
        bad = tmp_path / "bad.gguf"
        bad.write_bytes(b"GGUF\x03\x00\x00\x00garbage")
        with pytest.raises(AdapterError):
            e.load_lora("x", str(bad))
        assert e.lora_adapters() == []
        assert e.generate(TEXT, max_tokens=2).text is not None   # still serving


def test_load_unload_at_run_time(files):
    with edgeinfer.load(str(files["llama.gguf"]), n_ctx=128, n_threads=2, n_slots=1) as e:
        base = _greedy(e, TEXT)
        with pytest.raises(UnknownAdapterError):
            e.generate(TEXT, max_tokens=2, lora="a")
        e.load_lora("a", str(files["a"]))
        with pytest.raises(AdapterError, match="already loaded"):
            e.load_lora("a", str(files["b"]))
        with_a = _greedy(e, TEXT, lora="a")
        with e.lease():                           # the one slot taken: the request waits
            gen = e.stream(TEXT, max_tokens=4, temperature=0, ignore_eos=True, lora="a")
            with pytest.raises(AdapterBusyError):
                e.unload_lora("a")
        assert gen.result().tokens == with_a[0][:4]   # to its end: then the adapter may go
        with e.scheduler.lease_slot(e.adapters.resolve("a")), pytest.raises(AdapterBusyError):
            e.unload_lora("a")                    # a leased slot (a prompt being scored) uses it too
        e.unload_lora("a")
        assert e.lora_adapters() == []
        with pytest.raises(UnknownAdapterError):
            e.generate(TEXT, max_tokens=2, lora="a")
        t, lp = _greedy(e, TEXT)
        assert t == base[0]
        np.testing.assert_array_equal(lp, base[1])
        e.load_lora("a", str(files["a"]))          # again, under the same name
        assert _greedy(e, TEXT, lora="a")[0] == with_a[0]


def test_adapter_budget(files):
    with edgeinfer.load(str(files["llama.gguf"]), n_ctx=128, n_threads=2, lora_bytes=30_000) as e:
        e.load_lora("a", str(files["a"]))          # 21,504 bytes
        with pytest.raises(AdapterError, match="budget"):
            e.load_lora("b", str(files["b"]))      # 25,600 more


# --------------------------------------------------------------------------- the server

def _post(url, body, key=None, method="POST"):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_server_routes_adapters(files, tmp_path):
    openai = require("openai")
    from edgeinfer.server import ServerThread

    lora_dir = tmp_path / "adapters"
    lora_dir.mkdir()
    convert_lora(str(files["b"]), str(files["llama"]), str(lora_dir / "b.gguf"))
    key = "k3y"
    with edgeinfer.load(str(files["llama.gguf"]), n_ctx=128, n_threads=2, n_slots=3,
                        loras={"a": str(files["a"])}) as e, \
            ServerThread(e, api_key=key, model_name="base", lora_dir=str(lora_dir)) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=key)
        ids = [m.id for m in client.models.list().data]
        assert ids == ["base", "a"]

        def complete(**kw):
            r = client.completions.create(prompt=TEXT, max_tokens=8, temperature=0, **kw)
            assert r.model == kw["model"]           # the adapter's name when `model` named one
            return r.choices[0].text

        with_a = complete(model="a")
        # Ollama's routes list the adapter as a model of its own, and run it by that name
        status, tags = _post(srv.url + "/api/tags", None, key, method="GET")
        assert [(m["name"], m["details"]["parent_model"]) for m in tags["models"]] == \
            [("base:latest", ""), ("a:latest", "base:latest")]
        status, got = _post(srv.url + "/api/generate", {"model": "a:latest", "prompt": TEXT, "raw": True,
                                                        "stream": False, "options": {
                                                            "temperature": 0, "num_predict": 8, "repeat_penalty": 1,
                                                            "top_k": 0, "top_p": 1}}, key)
        assert status == 200 and got["response"] == with_a
        assert _post(srv.url + "/api/embed", {"model": "a:latest", "input": TEXT}, key)[0] == 400   # base weights only
        assert with_a == complete(model="base", extra_body={"lora": [{"id": 0, "scale": 1.0}]})
        assert with_a == complete(model="base", extra_body={"lora": [{"name": "a"}]})
        assert with_a != complete(model="base")
        assert with_a == e.generate(TEXT, max_tokens=8, temperature=0, lora="a").text
        batch = client.completions.create(model="a", prompt=[TEXT, TEXT], max_tokens=8, temperature=0)
        assert [c.text for c in batch.choices] == [with_a, with_a]     # every prompt of a list on the adapter
        with pytest.raises(openai.BadRequestError, match="no adapter"):
            complete(model="base", extra_body={"lora": [{"id": 7}]})
        with pytest.raises(openai.NotFoundError):
            complete(model="c")
        # run-time loading: only inside --lora-dir, behind the key
        assert _post(srv.url + "/v1/lora-adapters", {"name": "b", "path": "b.gguf"})[0] == 401
        for path in ("/etc/passwd", "../" + files["a"].name, str(lora_dir / "b.gguf"), "."):
            status, body = _post(srv.url + "/v1/lora-adapters", {"name": "x", "path": path}, key)
            assert status == 400 and body["error"]["param"] == "path", (path, body)
        status, body = _post(srv.url + "/v1/lora-adapters", {"name": "b", "path": "b.gguf"}, key)
        assert status == 200 and body["name"] == "b" and body["model"] == "base"
        assert complete(model="b") == e.generate(TEXT, max_tokens=8, temperature=0, lora="b").text
        status, listing = _post(srv.url + "/lora-adapters", None, key, method="GET")
        assert [a["id"] for a in listing] == [0, 1]
        assert _post(srv.url + "/v1/lora-adapters/b", None, key, method="DELETE")[0] == 200
        assert _post(srv.url + "/v1/lora-adapters/b", None, key, method="DELETE")[0] == 404
        with pytest.raises(openai.NotFoundError):
            complete(model="b")


def test_server_without_lora_dir_loads_nothing(files):
    from edgeinfer.server import ServerThread

    with edgeinfer.load(str(files["llama.gguf"]), n_ctx=128, n_threads=2) as e, ServerThread(e) as srv:
        status, body = _post(srv.url + "/v1/lora-adapters", {"name": "a", "path": "a"})
        assert status == 501


def test_speculative_lookup_with_an_adapter_gives_the_plain_tokens(files):
    """Drafts are verified by the adapted model: an adapter request speculating gives its plain greedy run."""
    prompt = TEXT + " " + TEXT          # repeats, so prompt lookup proposes drafts
    with edgeinfer.load(str(files["llama.gguf"]), n_ctx=256, n_threads=2, loras={"a": str(files["a"])}) as e:
        plain = e.generate(prompt, max_tokens=24, temperature=0, ignore_eos=True, lora="a")
        spec = e.generate(prompt, max_tokens=24, temperature=0, ignore_eos=True, lora="a", speculative="lookup")
    assert spec.stats.spec_proposed > 0
    assert spec.tokens == plain.tokens


@pytest.mark.parametrize("kind,targets", [
    ("qwen35", ["q_proj", "k_proj", "o_proj", "in_proj_qkv", "in_proj_z", "out_proj", "down_proj"]),
    ("lfm2", ["q_proj", "out_proj", "in_proj", "w1", "w2", "w3"])])
def test_hybrid_adapter_equals_merged_file(tmp_path, kind, targets):
    """Adapters on the hybrids' own matmuls: Qwen3.5's delta-net projections (the converter tiles their value
    heads: a row reorder of in_proj_qkv / in_proj_z, a column reorder of out_proj) and gated q, LFM2's short-conv
    in/out projections."""
    src = tiny_checkpoints.build(kind, tmp_path / "hf")
    adapter = tiny_checkpoints.build_lora(src, tmp_path / "adapter", targets=targets)
    base, merged = tmp_path / "base.gguf", tmp_path / "merged.gguf"
    convert_checkpoint(str(src), str(base), "f32")
    convert_checkpoint(str(src), str(merged), "f32", lora_dir=str(adapter))
    ids = list(range(5, 45))
    with edgeinfer.load(str(base), n_ctx=128, n_threads=2, loras={"a": str(adapter)}) as e:
        ours, plain = e.logits(ids, lora="a"), e.logits(ids)
    want = _logits(merged, ids)
    assert float(np.abs(want - plain).max()) > 1e-2
    assert float(np.abs(ours - want).max()) <= TOL
