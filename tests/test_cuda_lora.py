"""LoRA adapters on the CUDA backend (native/cuda/forward.cu's ei_cuda_lora, backends/cuda.py):

- each adapter (PEFT folders on a tiny llama F32 base: a on Q, K, V, O, down; b on Q, gate, up,
  down, which takes gate and up apart from their fused launch; a fused-QKV / gate_up adapter on
  phi3; a pair on the untied output head) gives the CPU backend's logits with that adapter, within
  the CPU-vs-CUDA tolerance of tests/test_cuda.py's tiny families;
- one batch mixing rows of adapter a, adapter b, a + b at other scales and the base equals each
  solo, in prefill and in decode-sized steps (which otherwise replay CUDA Graphs), and so do
  concurrent engine requests;
- bad calls are typed errors.

Needs a CUDA device; tests/test_cuda_sim.py runs this file on eisim, the CPU simulator."""
from __future__ import annotations

import numpy as np
import pytest

from tests.support.cuda_bounds import assert_close, nmse
from tests.support.strict import require

torch = require("torch", "tiny checkpoints are built with torch")
require("transformers", "tiny checkpoints are built with transformers")
require("peft", "the adapters are PEFT's")

import edgeinfer
from edgeinfer.backends import Batch
from edgeinfer.backends import cuda as cb
from edgeinfer.convert import convert_checkpoint
from edgeinfer.errors import EdgeInferError, RangeError
from edgeinfer.model.lora import LoraWeights
from tests.support import tiny_checkpoints

DEVICES, NO_GPU_REASON = cb.probe()
pytestmark = pytest.mark.skipif(not DEVICES, reason=f"needs a CUDA GPU: {NO_GPU_REASON} "
                                "(tests/test_cuda_sim.py runs these on eisim)")

TEXT = "The quick brown fox jumps over the lazy dog, and then 12345 apples"
EFFECT_MIN = 1e-3                 # an adapter moves the logits by far more than the bound


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("cuda_lora")
    p = {"llama": tiny_checkpoints.build("llama", root / "llama"),
         "phi3": tiny_checkpoints.build("phi3", root / "phi3")}
    p["a"] = tiny_checkpoints.build_lora(p["llama"], root / "a", seed=1)
    p["b"] = tiny_checkpoints.build_lora(p["llama"], root / "b", seed=2,
                                         targets=["q_proj", "gate_proj", "up_proj", "down_proj"])
    p["phi_fused"] = tiny_checkpoints.build_lora(p["phi3"], root / "phi_fused",
                                                 targets=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"])
    for kind in ("llama", "phi3"):
        p[kind + ".gguf"] = root / f"{kind}.f32.gguf"
        convert_checkpoint(str(p[kind]), str(p[kind + ".gguf"]), "f32")
    return p


def _engines(files):
    loras = {"a": str(files["a"]), "b": str(files["b"])}
    cpu = edgeinfer.load(str(files["llama.gguf"]), n_ctx=64, device="cpu", n_threads=1, n_slots=4, loras=loras)
    gpu = edgeinfer.load(str(files["llama.gguf"]), n_ctx=64, device="cuda", n_slots=4, max_batch=64, loras=loras)
    assert gpu.info()["device"] == "cuda" and gpu.runner.caps.lora
    yield cpu, gpu
    gpu.close()
    cpu.close()


@pytest.fixture(scope="module")
def llama(files):
    """(cpu, gpu) engines with adapters a and b, for requests."""
    yield from _engines(files)


@pytest.fixture(scope="module")
def raw(files):
    """The same, for tests that drive the runtimes themselves (their slots' adapters are not the
    schedulers' business, so these engines serve no requests)."""
    yield from _engines(files)


@pytest.mark.parametrize("spec", ["a", "b", {"a": 0.5, "b": -1.5}, None])
def test_adapter_logits_match_cpu(llama, spec):
    cpu, gpu = llama
    ids = cpu.tokenize(TEXT)
    ref, got = cpu.logits(ids, lora=spec), gpu.logits(ids, lora=spec)
    assert_close(ref, got, spec)
    if spec is not None:   # the adapter did change the model, on both devices
        assert nmse(cpu.logits(ids), ref) >= EFFECT_MIN and nmse(gpu.logits(ids), got) >= EFFECT_MIN


def test_fused_tensor_adapter_matches_cpu(files):
    """phi3's fused qkv and gate_up: B's rows go to the Q, K, V (gate, up) roles the runtimes hold."""
    loras = {"f": str(files["phi_fused"])}
    with edgeinfer.load(str(files["phi3.gguf"]), n_ctx=64, device="cpu", n_threads=1, loras=loras) as cpu:
        ids = cpu.tokenize(TEXT)
        ref, base = cpu.logits(ids, lora="f"), cpu.logits(ids)
    with edgeinfer.load(str(files["phi3.gguf"]), n_ctx=64, device="cuda", n_slots=2, max_batch=64, loras=loras) as gpu:
        got = gpu.logits(ids, lora="f")
    assert nmse(base, ref) >= EFFECT_MIN
    assert_close(ref, got, "phi_fused")


def _prefill(rt, slot, ids):
    rt.clear_slot(slot)
    n = len(ids)
    return rt.forward(Batch.of_slot(slot, ids, np.arange(n), np.arange(n), np.arange(n))).copy()


def test_output_head_adapter_matches_cpu(raw):
    """A pair on the untied head: its rows are the output rows, mapped to their slots."""
    cpu, gpu = raw
    cfg = gpu.runner.runtime.cfg
    rng = np.random.default_rng(3)
    w = LoraWeights("head", {"output.weight": (rng.standard_normal((3, cfg.n_embd)).astype(np.float32),
                                               0.1 * rng.standard_normal((cfg.n_vocab, 3)).astype(np.float32))})
    ids = cpu.tokenize(TEXT)[:12]
    out = {}
    for name, eng in (("cpu", cpu), ("gpu", gpu)):
        rt = eng.runner.runtime
        with eng.runner.lock:
            h = rt.add_adapter(w)
            base = _prefill(rt, 3, ids)
            rt.set_slot_adapters(3, [(h, 2.0)])
            out[name] = _prefill(rt, 3, ids)
            rt.set_slot_adapters(3, [])
            assert np.array_equal(_prefill(rt, 3, ids), base)   # detached: the base again
            rt.clear_slot(3)
        assert nmse(base, out[name]) >= EFFECT_MIN
    assert_close(out["cpu"], out["gpu"], "head")


def test_mixed_batch_equals_each_solo(raw):
    """Slots with a, b, the base and a + b at other scales in one forward (prefill, then decode steps
    of 4 tokens, the size CUDA Graphs would replay) give each slot's solo logits."""
    cpu, gpu = raw
    rt = gpu.runner.runtime
    ad = gpu.adapters
    keys = [ad.resolve("a"), ad.resolve("b"), (), ad.resolve({"a": 0.5, "b": -1.5})]
    prompts = [cpu.tokenize(t)[:n] for t, n in [(TEXT, 9), ("Once upon a time there was", 6),
                                                (TEXT[10:], 7), ("Hello, world! 42", 5)]]
    steps = 5
    nxt = [[7 + 3 * s + i for i in range(steps)] for s in range(4)]   # the decode tokens, fixed
    with gpu.runner.lock:
        solo = []
        for s in range(4):
            rt.set_slot_adapters(s, ad.handles(keys[s]))
            lg = [_prefill(rt, s, prompts[s])[-1]]
            for i, tok in enumerate(nxt[s]):
                p = len(prompts[s]) + i
                lg.append(rt.forward(Batch([tok], [s], [p], [p], [0]))[0].copy())
            solo.append(np.array(lg))
        for s in range(4):
            rt.clear_slot(s)
        tokens = np.concatenate(prompts)
        slots = np.concatenate([np.full(len(p), s) for s, p in enumerate(prompts)])
        pos = np.concatenate([np.arange(len(p)) for p in prompts])
        last = np.cumsum([len(p) for p in prompts]) - 1
        mixed = [[row] for row in rt.forward(Batch(tokens, slots, pos, pos, last)).copy()]
        for i in range(steps):
            p = [len(prompts[s]) + i for s in range(4)]
            lg = rt.forward(Batch([nxt[s][i] for s in range(4)], range(4), p, p, range(4))).copy()
            for s in range(4):
                mixed[s].append(lg[s])
        for s in range(4):
            rt.set_slot_adapters(s, [])
            rt.clear_slot(s)
    for s in range(4):
        np.testing.assert_allclose(np.array(mixed[s]), solo[s], rtol=0, atol=1e-5, err_msg=f"slot {s}")
    assert nmse(solo[2], solo[0]) >= EFFECT_MIN and nmse(solo[2], solo[1]) >= EFFECT_MIN


def _greedy(e, lora=None, n=12):
    c = e.generate(TEXT, max_tokens=n, temperature=0, logprobs=0, ignore_eos=True, lora=lora)
    return c.tokens, np.array([t.logprob for t in c.logprobs])


def test_concurrent_requests_equal_solo_and_cpu(llama):
    """Requests for a, b and the base at once on the CUDA engine: each its solo tokens and logprobs,
    and the CPU backend's tokens."""
    cpu, gpu = llama
    specs = ["a", "b", None]
    solo = [_greedy(gpu, s) for s in specs]
    assert len({tuple(t) for t, _ in solo}) == 3
    gens = [gpu.stream(TEXT, max_tokens=12, temperature=0, logprobs=0, ignore_eos=True, lora=s) for s in specs]
    for (t1, l1), g, s in zip(solo, gens, specs):
        c = g.result()
        assert c.tokens == t1, s
        np.testing.assert_allclose(np.array([t.logprob for t in c.logprobs]), l1, rtol=0, atol=1e-4)
        t_cpu, l_cpu = _greedy(cpu, s)
        assert t_cpu == t1, s
        np.testing.assert_allclose(l1, l_cpu, rtol=0, atol=1e-3)


def test_bad_calls_are_typed_errors(raw):
    cpu, gpu = raw
    rt = gpu.runner.runtime
    h = gpu.adapters.handles(gpu.adapters.resolve("a"))[0][0]
    with pytest.raises(RangeError, match="at most 8"):
        rt.set_slot_adapters(0, [(h, 1.0)] * 9)
    with pytest.raises(RangeError, match="slot 4 outside"):
        rt.set_slot_adapters(4, [(h, 1.0)])
    with pytest.raises(EdgeInferError, match="another runtime"):
        rt.set_slot_adapters(0, cpu.adapters.handles(cpu.adapters.resolve("a")))
    ffi, lib = rt.ffi, rt.lib
    one = ffi.new("float[]", 64 * 64)
    assert lib.ei_cuda_lora_set(h.handle, 0, lib.EI_T_ATTN_NORM, 1, one, one) == lib.EI_ERR_UNSUPPORTED
    assert "adapts Q, K, V, O" in cb.last_error(lib, ffi)
    assert lib.ei_cuda_lora_set(h.handle, 0, lib.EI_T_ATTN_Q, 1, one, one) == lib.EI_ERR_INVALID_ARG   # set twice
    assert lib.ei_cuda_lora_set(h.handle, 99, lib.EI_T_ATTN_Q, 1, one, one) == lib.EI_ERR_INVALID_ARG
    assert lib.ei_cuda_lora_bytes(h.handle) == h.nbytes > 0
