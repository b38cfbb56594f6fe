"""Gemma 4 on the CUDA backend (native/cuda/forward.cu: per_layer_inputs / per_layer_block, the
one-layer KV views of ei_cuda_runtime, the v norm of rope_store_kernel).

The tiny Gemma 4 checkpoint of tests/support/tiny_gemma4.py (six layers s s s f s f, sliding window
16, sliding heads of 16 and full heads of 32 with proportional RoPE over a quarter, per-layer inputs
of width 8, the last two layers reading the KV of layers 2 and 3, double-wide MLP there, layer output
scales, final softcap), converted to F32 and to F16 (the per-layer table's rows then are F16 rows
gathered from the file), against the CPU backend within tests/test_cuda.py's CPU-vs-CUDA bounds for
tiny families (NMSE <= 1e-5, KL <= 1e-4, top-1 >= 0.95):
- a 40-token prompt (past the window) in one prefill, in chunks of 4 through the sliding layers' own
  ring of 16 + 4 - 1 cells (wrapped twice), token by token (CUDA Graphs), and a batch whose rows
  alternate between two slots; with max_batch 128 both head sizes live in the one full ring;
- the KV bytes are the CPU runtime's and `plan`'s: the KV-shared layers store none;
- greedy tokens equal the CPU backend's;
- overflow="slide": a context ring of 24 cells that wraps (sinks, slack written ahead) gives the
  CPU's teacher-forced logits;
- attention over heads of 512 and 384 (Gemma 4 E2B's full layers: more key registers per lane than
  heads up to 256) matches float64 and the CPU kernel.

Needs a CUDA device; tests/test_cuda_sim.py runs this file on eisim, the CPU simulator."""
from __future__ import annotations

import numpy as np
import pytest

from tests.support.cuda_bounds import assert_close, assert_steps_match
from tests.support.strict import require

torch = require("torch", "tiny checkpoints are built with torch")
require("transformers", "tiny checkpoints are built with transformers")

import edgeinfer
from edgeinfer.backends import Batch
from edgeinfer.backends import cuda as cb
from edgeinfer.convert import convert_checkpoint
from edgeinfer.tools import plan as P
from tests.support import tiny_gemma4

DEVICES, NO_GPU_REASON = cb.probe()
pytestmark = pytest.mark.skipif(not DEVICES, reason=f"needs a CUDA GPU: {NO_GPU_REASON} "
                                "(tests/test_cuda_sim.py runs these on eisim)")

IDS = [int(i) for i in np.random.default_rng(0).integers(5, 400, 40)]   # longer than the window (16)
N_NEW = 12


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("gemma4")
    return tiny_gemma4.build(root / "hf"), root


@pytest.fixture(scope="module", params=["f32", "f16"])
def gemma4(request, ckpt):
    d, root = ckpt
    path = root / f"gemma4.{request.param}.gguf"
    convert_checkpoint(str(d), str(path), request.param)
    return request.param, path


def _cuda(path, **kw):
    return edgeinfer.load(str(path), n_ctx=kw.pop("n_ctx", 64), device="cuda", **kw)


def _cpu(path, **kw):
    return edgeinfer.load(str(path), n_ctx=kw.pop("n_ctx", 64), device="cpu", n_threads=2, **kw)


def test_the_file_has_what_the_cuda_path_implements(gemma4):
    """Per-layer inputs, KV-shared layers, two head sizes, per-layer FFN widths, v norm and layer
    scales: the features the test exercises (else it could pass on a plainer model)."""
    _, path = gemma4
    with _cpu(path) as cpu:
        c = cpu.config
    assert c.n_embd_per_layer == 8 and c.n_kv_shared == 2 and c.head_dim == 32 and c.head_dim_swa == 16
    assert len(set(c.n_ff_layers)) == 2, c.n_ff_layers


def test_gemma4_logits_match_cpu(gemma4):
    ft, path = gemma4
    with _cpu(path, n_slots=2, max_batch=4) as cpu:
        ref = cpu.logits(IDS)
    for max_batch in (4, 128):
        with _cuda(path, n_slots=2, max_batch=max_batch) as gpu:
            info = gpu.info()
            assert info["device"] == "cuda"
            assert info["local_kv_cells"] == (16 + max_batch - 1 if max_batch == 4 else 0)
            with _cpu(path, n_slots=2, max_batch=max_batch) as cpu:
                assert info["kv_bytes"] == cpu.info()["kv_bytes"]
            assert info["kv_bytes"] == P.kv_bytes(P.model_shape(path), 64, 2, "f16", max_batch)
            assert_close(ref, gpu.logits(IDS), (ft, "prefill", max_batch))
            # with max_batch 128: rows of slots 0 and 1 interleaved, 2 x 40 rows in one step
            assert_steps_match(gpu.runner.runtime, ref, IDS, (ft, max_batch), interleave=max_batch == 128)


def test_gemma4_kv_shared_layers_store_no_kv(gemma4):
    """Layers 4 and 5 read layers 2 and 3's KV: the arena is the four storing layers' (three sliding
    of head size 16 in their ring, one full of 32), as test_family_gemma4's CPU check counts it."""
    _, path = gemma4
    n_ctx, max_batch, kv_heads, f16 = 256, 8, 2, 2
    ring = 16 + max_batch - 1
    with _cuda(path, n_ctx=n_ctx, max_batch=max_batch) as gpu:
        assert gpu.info()["kv_bytes"] == 2 * kv_heads * f16 * (3 * 16 * ring + 32 * n_ctx)


def test_gemma4_greedy_tokens_equal_cpu(gemma4):
    _, path = gemma4
    with _cpu(path) as cpu:
        want = cpu.generate(IDS[:24], max_tokens=N_NEW, temperature=0, ignore_eos=True).tokens
    with _cuda(path) as gpu:
        got = gpu.generate(IDS[:24], max_tokens=N_NEW, temperature=0, ignore_eos=True).tokens
    assert got == want


def test_gemma4_sliding_context_ring_matches_cpu(gemma4):
    """overflow="slide" with a ring of 24 cells and 2 sinks: past the wrap the full layers see the
    sinks and their window, the sliding layers their 16 positions; teacher-forced logits in chunks the
    ring allows match the CPU runtime's over the same ring, and differ from an unwrapped context's
    (the wrap is what both computed)."""
    out = {}
    for device, ctx, overflow in (("cuda", 24, "slide"), ("cpu", 24, "slide"), ("cpu", 64, "stop")):
        _, path = gemma4
        load = _cuda if device == "cuda" else _cpu
        with load(path, n_ctx=ctx, n_sink=2, overflow=overflow, max_batch=8) as eng:
            ring, runner = eng.ring, eng.runner
            got, i = [], 0
            while i < len(IDS):
                n = min(ring.max_chunk(0), runner.caps.max_batch, len(IDS) - i)
                pos, cells = ring.reserve(0, IDS[i:i + n])
                got.append(runner.run(Batch.of_slot(0, IDS[i:i + n], pos, cells, np.arange(n))).logits[:n].copy())
                i += n
            assert ring.slots[0].wrapped == (overflow == "slide")
            out[device, ctx] = np.concatenate(got)
    assert_close(out["cpu", 24], out["cuda", 24], "sliding context ring")
    unwrapped = float(np.abs(out["cpu", 64][24:] - out["cpu", 24][24:]).max())
    err = float(np.abs(out["cuda", 24] - out["cpu", 24]).max())
    assert unwrapped > 20 * err, (unwrapped, err)
