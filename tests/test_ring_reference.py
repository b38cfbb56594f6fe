"""The KV ring's slide (overflow="slide") against the float64 exact math.

A sequence three times longer than the ring is teacher-forced through the engine the way the
scheduler feeds a long prompt (chunks up to the ring's last cell, then slack + 1 tokens per
step once it wraps, written ahead into the slack cells). Past the wrap, each token attends to
the n_sink pinned cells and the last (capacity - n_sink) positions, every key rotated at its
true position, older cells masked (edgeinfer/engine/kv.py, native ei_forward). The reference (tests/support/reference_forward.py, ring=...) computes exactly that
attention in float64; it must agree with the engine as closely as the full-context reference
agrees with it inside the ring (test_engine_accuracy.py: top-1 >= 90%, mean KL <= 0.02).
"""
from __future__ import annotations

import numpy as np
import pytest
from tests.support.strict import require

import edgeinfer
from edgeinfer.backends import Batch
from tests.support.llama_oracle import compare_logits
from tests.support.reference_forward import get_reference_model
from tests.support.texts import TEXTS

pytestmark = pytest.mark.slow

CAPACITY = 64
N_SINK = 4
N_TOKENS = 3 * CAPACITY


def _teacher_forced_through_ring(eng, ids: list[int]) -> np.ndarray:
    """Logits of every position of `ids`, fed to slot 0 as the scheduler feeds a long prompt."""
    ring, runner = eng.ring, eng.runner
    out = np.empty((len(ids), eng.config.n_vocab), dtype=np.float32)
    i = 0
    while i < len(ids):
        n = min(ring.max_chunk(0), runner.caps.max_batch, len(ids) - i)
        chunk = ids[i:i + n]
        pos, cells = ring.reserve(0, chunk)
        runner.run(Batch.of_slot(0, chunk, pos, cells, np.arange(n)), out[i:i + n])
        i += n
    return out


def test_slide_matches_float64_reference_with_sinks_and_window(smollm2_path):
    require("gguf", "the float64 reference dequantizes with the gguf package")
    eng = edgeinfer.load(smollm2_path, n_ctx=CAPACITY, n_threads=2, n_sink=N_SINK, overflow="slide")
    try:
        assert (eng.ring.capacity, eng.ring.n_sink) == (CAPACITY, N_SINK)
        ids = eng.tokenize(TEXTS["story"] + TEXTS["technical"])[:N_TOKENS]
        assert len(ids) == N_TOKENS
        ours = _teacher_forced_through_ring(eng, ids)
        assert eng.ring.slots[0].wrapped and eng.ring.cells_used(0) == CAPACITY + eng.ring.slack
        assert eng.ring.slack > 0 and eng.ring.max_chunk(0) == eng.ring.slack + 1
    finally:
        eng.close()
    assert np.isfinite(ours).all()

    ref = get_reference_model(smollm2_path)
    windowed = ref.logits(ids, ring=(CAPACITY, N_SINK))
    full = ref.logits(ids)
    inside = compare_logits(windowed[:CAPACITY], ours[:CAPACITY])
    slid = compare_logits(windowed[CAPACITY:], ours[CAPACITY:])
    # what attending to every past token would have given: the window must be what the engine did
    unslid = compare_logits(full[CAPACITY:], ours[CAPACITY:])
    print(f"\ninside the ring: {inside}\nafter the slide: {slid}\nvs full context: {unslid}")
    assert np.array_equal(windowed[:CAPACITY], full[:CAPACITY])   # the ring changes nothing before it fills
    for r in (inside, slid):
        assert r["top1"] >= 0.90 and r["kl_mean"] <= 0.02, r
    assert unslid["kl_mean"] > 4 * slid["kl_mean"], (unslid, slid)
