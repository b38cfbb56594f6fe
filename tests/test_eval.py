"""`edgeinfer eval`: perplexity / KL / top-1 of a model against a reference."""
from __future__ import annotations

import json

import numpy as np
import pytest
from tests.support.strict import require


from edgeinfer.errors import EdgeInferError  # noqa: E402
from edgeinfer.tools.eval import compare_logits, evaluate, format_table  # noqa: E402


def test_compare_logits_math():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((70, 50)).astype(np.float32)
    ids = list(rng.integers(0, 50, 70))
    kl, top, nr, nm = compare_logits(a, a.copy(), ids)
    assert np.allclose(kl, 0, atol=1e-12) and top.all() and np.allclose(nr, nm)
    b = a + rng.standard_normal(a.shape).astype(np.float32)
    kl, top, nr, nm = compare_logits(a, b, ids)
    la = a - np.log(np.exp(a.astype(np.float64)).sum(-1, keepdims=True))
    lb = b - np.log(np.exp(b.astype(np.float64)).sum(-1, keepdims=True))
    want = (np.exp(la) * (la - lb)).sum(-1)
    assert np.allclose(kl, want, rtol=1e-5, atol=1e-9)
    assert np.allclose(nr, [-la[i, ids[i + 1]] for i in range(69)], rtol=1e-5)
    assert top.mean() < 1


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    require("torch", "tiny checkpoints are built with torch")
    require("transformers", "tiny checkpoints are built with transformers")
    from tests.support import tiny_checkpoints
    from edgeinfer.convert import convert_checkpoint
    d = tmp_path_factory.mktemp("eval")
    src = tiny_checkpoints.build("qwen2", d / "ckpt")
    ref, q = d / "f16.gguf", d / "q4_0.gguf"
    convert_checkpoint(str(src), str(ref), "f16")
    convert_checkpoint(str(src), str(q), "q4_0")
    return ref, q


@pytest.mark.slow
def test_evaluate_figures(pair):
    from tests.support.texts import TEXTS
    ref, q = pair
    same = evaluate(str(ref), str(ref), TEXTS["story"], ctx=96)
    assert same.kl_mean < 1e-9 and same.top1 == 1.0 and same.ppl_model == same.ppl_reference
    r = evaluate(str(q), str(ref), TEXTS["story"], ctx=96)
    assert r.n_windows >= 2 and r.n_tokens > 96
    assert 0 < r.kl_mean <= r.kl_p99 <= r.kl_max and r.kl_mean < 0.05
    assert 0.5 < r.top1 <= 1 and r.ppl_model > 1
    assert r.size_model < r.size_reference
    table = format_table(r)
    assert "perplexity" in table and "top-1" in table
    json.dumps(r.to_dict())


@pytest.mark.slow
def test_evaluate_errors(pair, tmp_path):
    ref, q = pair
    with pytest.raises(EdgeInferError):
        evaluate(str(q), str(ref), "", ctx=64)
    with pytest.raises(EdgeInferError):
        evaluate(str(tmp_path / "missing.gguf"), str(ref), "some text", ctx=64)
