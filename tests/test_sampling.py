"""Sampling chain, SamplingParams validation and StopMatcher."""
from __future__ import annotations

import math

import numpy as np
import pytest

from edgeinfer.engine.sampling import Sampler, SamplingParams, StopMatcher, make_sampler
from edgeinfer.errors import EdgeInferError, SamplingParamsError

N_VOCAB = 49152


def _logits(seed: int = 0, n: int = N_VOCAB, scale: float = 3.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)


# --------------------------------------------------------------------------- greedy / top-k

def test_greedy_is_argmax():
    for seed in range(5):
        x = _logits(seed)
        s = make_sampler(temperature=0.0)
        assert s(x, []) == int(np.argmax(x))
    assert make_sampler(temperature=-1.0)(_logits(9), []) == int(np.argmax(_logits(9)))


def test_greedy_ties_go_to_lowest_id():
    x = np.zeros(100, dtype=np.float32)
    x[[7, 3, 50]] = 5.0
    assert make_sampler(temperature=0)(x, []) == 3


def test_greedy_does_not_modify_input():
    x = _logits(1)
    y = x.copy()
    make_sampler(temperature=0, repeat_penalty=1.5, presence_penalty=1.0)(x, [1, 2, 3])
    make_sampler(temperature=1.0, repeat_penalty=1.5, seed=0)(x, [1, 2, 3])
    np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("temp", [0.1, 0.8, 1.0, 5.0, 100.0])
def test_top_k_1_is_greedy(temp):
    for seed in range(3):
        x = _logits(seed)
        s = make_sampler(temperature=temp, top_k=1, top_p=1.0, min_p=0.0, seed=seed)
        assert all(s(x, []) == int(np.argmax(x)) for _ in range(20))


def test_top_k_keeps_exactly_k_best():
    x = _logits(3, n=1000)
    s = make_sampler(temperature=1.0, top_k=10, top_p=1.0, min_p=0.0, seed=0)
    ids, vals = s.candidates(x)
    assert sorted(ids.tolist()) == sorted(np.argsort(-x)[:10].tolist())
    assert np.all(np.diff(vals) <= 0)  # sorted descending
    draws = {s(x, []) for _ in range(2000)}
    assert draws <= set(ids.tolist())


def test_float64_and_list_logits_accepted():
    x = _logits(2, n=50)
    s = make_sampler(temperature=0)
    assert s(x.astype(np.float64), []) == int(np.argmax(x))
    assert s(x.tolist(), []) == int(np.argmax(x))


def test_bad_logits_shape():
    with pytest.raises(SamplingParamsError):
        make_sampler()(np.zeros((2, 3), np.float32), [])
    with pytest.raises(SamplingParamsError):
        make_sampler()(np.zeros(0, np.float32), [])


def test_nan_logits_never_chosen():
    x = np.array([np.nan, 1.0, 2.0, np.nan], dtype=np.float32)
    assert make_sampler(temperature=0)(x, []) == 2
    s = make_sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0)
    assert {s(x, []) for _ in range(200)} <= {1, 2}


def test_minus_inf_masked_tokens_never_chosen():
    x = np.full(1000, -np.inf, dtype=np.float32)
    x[[10, 20]] = [0.0, 0.5]
    for kw in ({"top_k": 0, "top_p": 1.0, "min_p": 0.0}, {"top_k": 40, "top_p": 0.95, "min_p": 0.05},
               {"top_k": 0, "top_p": 0.5, "min_p": 0.0}):
        s = make_sampler(temperature=1.0, seed=0, **kw)
        assert {s(x, []) for _ in range(200)} <= {10, 20}


# --------------------------------------------------------------------------- seeds

def test_same_seed_same_draws_different_seed_differs():
    x = _logits(4, scale=1.0)
    a = make_sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=123)
    b = make_sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=123)
    c = make_sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=124)
    da = [a(x, []) for _ in range(50)]
    db = [b(x, []) for _ in range(50)]
    dc = [c(x, []) for _ in range(50)]
    assert da == db
    assert da != dc
    a.reseed(123)
    assert [a(x, []) for _ in range(50)] == da


def test_seed_none_is_random():
    x = _logits(5, scale=0.5)
    seqs = {tuple(make_sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)(x, [])
                  for _ in range(20)) for _ in range(3)}
    assert len(seqs) > 1


# --------------------------------------------------------------------------- distribution

def test_empirical_distribution_matches_softmax():
    n = 20
    x = np.random.default_rng(7).standard_normal(n).astype(np.float32)
    p = np.exp(x.astype(np.float64) - x.max())
    p /= p.sum()
    s = make_sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=2024)
    draws = 40000
    counts = np.bincount([s(x, []) for _ in range(draws)], minlength=n)
    expected = p * draws
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # 19 degrees of freedom: the 99.9th percentile is ~43.8
    assert chi2 < 43.8, (chi2, counts, expected)
    ids, probs = s.probs(x)
    np.testing.assert_allclose(probs[np.argsort(ids)], p, rtol=1e-6)


def test_temperature_reshapes_distribution():
    x = np.array([1.0, 0.0], dtype=np.float32)
    draws = 20000
    for temp in (0.5, 2.0):
        s = make_sampler(temperature=temp, top_k=0, top_p=1.0, min_p=0.0, seed=1)
        frac0 = sum(s(x, []) == 0 for _ in range(draws)) / draws
        want = 1.0 / (1.0 + math.exp(-1.0 / temp))
        assert abs(frac0 - want) < 0.015, (temp, frac0, want)


def test_top_k_ties_at_the_boundary_keep_the_lowest_ids():
    x = np.zeros(1000, dtype=np.float32)
    x[[900, 5]] = 2.0
    s = make_sampler(temperature=1.0, top_k=4, top_p=1.0, min_p=0.0, seed=0)
    assert s.candidates(x)[0].tolist() == [5, 900, 0, 1]


def test_top_k_needed():
    n = 1000
    assert make_sampler(temperature=0).top_k_needed(n) == 1
    assert make_sampler(temperature=0, repeat_penalty=1.1).top_k_needed(n) is None
    assert make_sampler(top_k=40).top_k_needed(n) == 40
    assert make_sampler(top_k=40, presence_penalty=0.5).top_k_needed(n) is None
    assert make_sampler(top_k=40, frequency_penalty=0.5).top_k_needed(n) is None
    assert make_sampler(top_k=40, repeat_penalty=1.3, penalty_last_n=0).top_k_needed(n) == 40
    assert make_sampler(top_k=0).top_k_needed(n) is None          # every id may be drawn
    assert make_sampler(top_k=n).top_k_needed(n) is None


def _device_top_k(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """What ei_cuda_topk returns: the k best, value descending, ties to the lower id, NaN = -inf."""
    x = np.where(np.isnan(x), np.float32(-np.inf), x)
    ids = np.argsort(-x, kind="stable")[:k]
    return ids.astype(np.int32), x[ids]


@pytest.mark.parametrize("params", [
    dict(temperature=0.0),
    dict(temperature=0.0, top_k=1),
    dict(),                                                     # the defaults: top-k 40, top-p, min-p
    dict(temperature=1.0, top_k=5, top_p=1.0, min_p=0.0),
    dict(temperature=1.5, top_k=200, top_p=0.9, min_p=0.0),
    dict(temperature=0.3, top_k=64, top_p=1.0, min_p=0.1),
    dict(temperature=2.0, top_k=1, top_p=0.5, min_p=0.5),
    dict(temperature=1.0, top_k=256, top_p=0.99, min_p=0.01, repeat_penalty=1.4, penalty_last_n=0),
])
def test_sampling_from_candidates_equals_sampling_from_logits(params):
    n = 3000
    for seed in range(25):
        rng = np.random.default_rng(seed)
        # coarse values make ties (also at the k-th place); some NaN and -inf
        x = np.round(rng.standard_normal(n) * 3, 0 if seed % 2 else 2).astype(np.float32)
        x[rng.integers(0, n, 20)] = np.nan
        x[rng.integers(0, n, 20)] = -np.inf
        full, cand = make_sampler(seed=seed, **params), make_sampler(seed=seed, **params)
        k = cand.top_k_needed(n)
        assert k is not None
        ids, vals = _device_top_k(x, k + seed % 3)           # more than needed: a prefix is used
        for _ in range(10):
            assert cand.sample_candidates(ids, vals) == full(x, [1, 2, 3]), (params, seed)


# --------------------------------------------------------------------------- top-p / min-p

def _from_probs(p) -> np.ndarray:
    return np.log(np.asarray(p, dtype=np.float64)).astype(np.float32)


def test_top_p_excludes_the_tail():
    # probs 0.5, 0.3, 0.15, 0.05: top_p=0.75 keeps {0, 1}; 0.85 keeps {0, 1, 2}
    x = _from_probs([0.3, 0.05, 0.5, 0.15])
    s = make_sampler(temperature=1.0, top_k=0, top_p=0.75, min_p=0.0, seed=0)
    ids, _ = s.candidates(x)
    assert ids.tolist() == [2, 0]
    assert {s(x, []) for _ in range(500)} == {0, 2}
    s = make_sampler(temperature=1.0, top_k=0, top_p=0.85, min_p=0.0, seed=0)
    assert s.candidates(x)[0].tolist() == [2, 0, 3]
    # the smallest set reaching p
    s = make_sampler(temperature=1.0, top_k=0, top_p=0.45, min_p=0.0, seed=0)
    assert s.candidates(x)[0].tolist() == [2]
    # top_p=1 keeps everything
    s = make_sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0)
    assert sorted(s.candidates(x)[0].tolist()) == [0, 1, 2, 3]


def test_top_p_applied_before_temperature():
    # llama.cpp's order: top-p sees T=1 probabilities, so a hot temperature cannot widen it
    x = _from_probs([0.9, 0.05, 0.05])
    s = make_sampler(temperature=50.0, top_k=0, top_p=0.8, min_p=0.0, seed=0)
    assert {s(x, []) for _ in range(200)} == {0}


def test_top_p_after_top_k():
    x = _from_probs([0.4, 0.3, 0.2, 0.1])
    # top_k=2 renormalises to 4/7, 3/7; top_p=0.5 then keeps only id 0
    s = make_sampler(temperature=1.0, top_k=2, top_p=0.5, min_p=0.0, seed=0)
    assert s.candidates(x)[0].tolist() == [0]
    s = make_sampler(temperature=1.0, top_k=2, top_p=0.6, min_p=0.0, seed=0)
    assert s.candidates(x)[0].tolist() == [0, 1]


def test_min_p_excludes_unlikely_tokens():
    # p_max = 0.5; min_p = 0.2 -> threshold 0.1: keeps 0.5, 0.3, 0.1 (>=), drops 0.06, 0.04
    x = _from_probs([0.06, 0.5, 0.3, 0.04, 0.1])
    for top_k in (0, 3, 5):
        s = make_sampler(temperature=1.0, top_k=top_k, top_p=1.0, min_p=0.2, seed=0)
        ids, _ = s.candidates(x)
        assert sorted(ids.tolist()) == [1, 2, 4][: min(3, top_k or 3)], top_k
    s = make_sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2, seed=0)
    assert {s(x, []) for _ in range(1000)} == {1, 2, 4}
    s = make_sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.7, seed=0)
    assert s.candidates(x)[0].tolist() == [1]
    s = make_sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0)
    assert len(s.candidates(x)[0]) == 5


# --------------------------------------------------------------------------- penalties

def test_repeat_penalty_changes_exactly_the_penalized_ids():
    x = np.array([2.0, -2.0, 1.0, -1.0, 0.5, 3.0], dtype=np.float32)
    s = make_sampler(repeat_penalty=2.0, penalty_last_n=64)
    y = s.apply_penalties(x, [0, 1, 1, 4])
    np.testing.assert_allclose(y, [1.0, -4.0, 1.0, -1.0, 0.25, 3.0])


def test_penalty_window_last_n():
    x = np.ones(6, dtype=np.float32)
    s = make_sampler(repeat_penalty=2.0, penalty_last_n=2)
    np.testing.assert_allclose(s.apply_penalties(x, [0, 1, 2, 3]), [1, 1, 0.5, 0.5, 1, 1])
    s = make_sampler(repeat_penalty=2.0, penalty_last_n=0)
    np.testing.assert_allclose(s.apply_penalties(x, [0, 1, 2, 3]), x)
    s = make_sampler(repeat_penalty=2.0, penalty_last_n=-1)
    np.testing.assert_allclose(s.apply_penalties(x, [0, 1, 2, 3]), [0.5] * 4 + [1, 1])


def test_presence_and_frequency_penalties():
    x = np.zeros(5, dtype=np.float32)
    s = make_sampler(presence_penalty=0.5, frequency_penalty=0.25)
    y = s.apply_penalties(x, [1, 1, 1, 3])
    np.testing.assert_allclose(y, [0.0, -(0.5 + 0.75), 0.0, -(0.5 + 0.25), 0.0])


def test_penalties_ignore_out_of_range_history_ids():
    x = np.ones(4, dtype=np.float32)
    s = make_sampler(repeat_penalty=2.0)
    np.testing.assert_allclose(s.apply_penalties(x, [-1, 99, 2]), [1, 1, 0.5, 1])


def test_penalty_flips_greedy_choice():
    x = np.array([1.0, 0.9, 0.1], dtype=np.float32)
    assert make_sampler(temperature=0)(x, [0]) == 0
    assert make_sampler(temperature=0, repeat_penalty=1.5)(x, [0]) == 1
    assert make_sampler(temperature=0, presence_penalty=0.2)(x, [0]) == 1


# --------------------------------------------------------------------------- speed

def test_top_k_sorts_only_k_logits(monkeypatch):
    """With top_k on, a step costs O(n_vocab) + O(k log k): no sort ever sees more than the
    k survivors (the full vocabulary only goes through argpartition)."""
    x = _logits(11)
    sorted_sizes = []
    for name in ("sort", "argsort", "lexsort"):
        real = getattr(np, name)
        monkeypatch.setattr(np, name, lambda a, *args, _real=real, **kw:
                            sorted_sizes.append(np.shape(a)[-1]) or _real(a, *args, **kw))
    s = make_sampler(seed=0, repeat_penalty=1.1)  # defaults: top_k=40
    for _ in range(20):
        assert 0 <= s(x, list(range(200))) < N_VOCAB
    assert sorted_sizes and max(sorted_sizes) <= 40, sorted_sizes[:10]


# --------------------------------------------------------------------------- params

@pytest.mark.parametrize("kw", [
    {"temperature": -0.1},
    {"temperature": float("nan")},
    {"temperature": "hot"},
    {"top_p": 0.0},
    {"top_p": 1.5},
    {"top_p": -0.1},
    {"top_k": -1},
    {"top_k": 2.5},
    {"top_k": True},
    {"min_p": -0.01},
    {"min_p": 1.01},
    {"repeat_penalty": 0.0},
    {"repeat_penalty": -1.0},
    {"presence_penalty": float("inf")},
    {"repeat_penalty": 1e-300},      # positive, but 0 in float32, where penalties apply
    {"frequency_penalty": 1e39},     # finite, but inf in float32
    {"penalty_last_n": -2},
    {"seed": -1},
    {"seed": 1.5},
    {"max_tokens": -1},
    {"stop": [""]},
    {"stop": [1]},
    {"stop": 5},
    {"ignore_eos": "yes"},
])
def test_sampling_params_validation(kw):
    with pytest.raises(SamplingParamsError) as ei:
        SamplingParams(**kw)
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, EdgeInferError)
    name = next(iter(kw))
    assert name in str(ei.value) or name == "stop"


@pytest.mark.parametrize("kw", [{"top_k": -1}, {"top_p": 0}, {"min_p": 2}, {"repeat_penalty": 0},
                                {"seed": -5}, {"penalty_last_n": -3}])
def test_make_sampler_validation(kw):
    with pytest.raises(SamplingParamsError):
        make_sampler(**kw)


def test_sampling_params_defaults_and_helpers():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty) == (0.8, 40, 0.95, 0.05, 1.0)
    assert p.stop == [] and p.ignore_eos is False and p.seed is None
    assert not p.greedy and SamplingParams(temperature=0).greedy
    q = SamplingParams.from_dict({"temperature": 0.0, "stop": "###", "seed": None}, max_tokens=5)
    assert q.stop == ["###"] and q.max_tokens == 5 and q.seed is None and q.temperature == 0.0
    with pytest.raises(SamplingParamsError, match="unknown"):
        SamplingParams.from_dict({"temprature": 1.0})
    with pytest.raises(SamplingParamsError):
        p.replace(top_p=2.0)
    assert p.replace(top_k=0).top_k == 0
    s = SamplingParams(temperature=0.7, top_k=5, seed=3).make_sampler()
    assert isinstance(s, Sampler) and (s.temperature, s.top_k, s.seed) == (0.7, 5, 3)
    assert SamplingParams(max_tokens=None).max_tokens is None
    assert p.to_dict()["top_p"] == 0.95


# --------------------------------------------------------------------------- stop strings

def _run(m: StopMatcher, pieces) -> tuple[str, bool]:
    out = []
    stopped = False
    for piece in pieces:
        text, stopped = m.feed(piece)
        out.append(text)
        if stopped:
            break
    if not stopped:
        out.append(m.flush())
    return "".join(out), stopped


@pytest.mark.parametrize("stop", ["</s>", "###", "\n\nUser:", "x", "ab"])
def test_stop_matcher_every_split(stop):
    text = "Hello world, " + stop + " and the rest"
    want = "Hello world, "
    # split the text into two pieces at every position, and into single characters
    for cut in range(len(text) + 1):
        m = StopMatcher([stop, "NEVER"])
        emitted, stopped = _run(m, [text[:cut], text[cut:]])
        assert (emitted, stopped) == (want, True), cut
        assert m.stop_string == stop
    m = StopMatcher([stop])
    emitted = []
    for ch in text:
        piece, stopped = m.feed(ch)
        assert stop not in "".join(emitted) + piece
        emitted.append(piece)
        if stopped:
            break
    assert "".join(emitted) == want and stopped
    # three-way splits around the stop string
    i = text.index(stop)
    for a in range(i, i + len(stop) + 1):
        for b in range(a, i + len(stop) + 1):
            assert _run(StopMatcher([stop]), [text[:a], text[a:b], text[b:]]) == (want, True)


def test_stop_matcher_holds_only_possible_prefixes():
    m = StopMatcher(["###"])
    assert m.feed("abc#") == ("abc", False)
    assert m.pending == "#"
    assert m.feed("#x") == ("##x", False)  # "##x" cannot start "###"
    assert m.feed("##") == ("", False)
    assert m.feed("#tail") == ("", True)
    assert m.feed("more") == ("", True)
    assert m.flush() == ""


def test_stop_matcher_false_start_then_real_stop():
    # "aab" with stop "ab": the held "a" is released, then the real stop cuts
    assert _run(StopMatcher(["ab"]), ["a", "a", "b", "c"]) == ("a", True)
    assert _run(StopMatcher(["abc"]), ["ab", "ab", "c"]) == ("ab", True)


def test_stop_matcher_no_stop_flushes_everything():
    m = StopMatcher(["STOP"])
    assert _run(m, ["hello ", "S", "T", "O"]) == ("hello STO", False)
    assert _run(StopMatcher([]), ["a", "b"]) == ("ab", False)
    assert _run(StopMatcher(None), ["a", "b"]) == ("ab", False)


def test_stop_matcher_earliest_of_several():
    m = StopMatcher(["world", "lo w"])
    assert _run(m, ["hello world"]) == ("hel", True)
    assert m.stop_string == "lo w"
    m = StopMatcher(["abc", "ab"])
    assert _run(m, ["xxabcd"]) == ("xx", True)
    assert m.stop_string == "abc"
    with pytest.raises(SamplingParamsError):
        StopMatcher([""])
    assert StopMatcher("##").stops == ["##"]
