"""scripts/soak.py: how it judges a run (on synthetic results), and one short real run."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("soak", ROOT / "scripts" / "soak.py")
soak = importlib.util.module_from_spec(_spec)
sys.modules["soak"] = soak          # dataclasses look their module up while it runs
_spec.loader.exec_module(soak)

MiB = 2**20


def _intervals(anon_medians: list[float], seconds: float = 60.0, file: float = 60.0) -> list[dict]:
    return [{"t0": i * seconds, "t1": (i + 1) * seconds, "anon_median": int(a * MiB), "file_median": int(file * MiB),
             "rss_median": int((a + file) * MiB), "rss_max": int((a + file) * MiB)}
            for i, a in enumerate(anon_medians)]


def _ok(n: int) -> list:
    return [soak.Result("chat_stream", soak.OK, float(i), 200) for i in range(n)]


IDLE = {"status": "ok", "slots_busy": 0, "queue_length": 0, "idle": True}
FLAT = _intervals([300, 300, 301, 300])


def test_a_clean_run_passes():
    v = soak.judge(_ok(10) + [soak.Result("malformed", soak.REFUSED, 3.0, 400),
                              soak.Result("complete", soak.BUSY, 4.0, 429),
                              soak.Result("disconnect", soak.DISCONNECTED, 5.0, 200)],
                   FLAT, warmup_s=60, max_growth=0.03, idle=IDLE)
    assert v.passed and v.reasons == []


def test_a_lost_request_or_a_5xx_fails_the_run():
    lost = soak.Result("chat_stream", soak.LOST, 7.5, 200, detail="the stream ended without [DONE]")
    v = soak.judge(_ok(10) + [lost], FLAT, 60, 0.03, idle=IDLE)
    assert not v.passed and v.reasons == [("1 lost request(s); first: chat_stream at 7.5 s, HTTP 200: "
                                           "the stream ended without [DONE]")]
    v = soak.judge(_ok(3) + [soak.Result("complete", soak.SERVER_ERROR, 1.0, 500, detail="boom")] * 2,
                   FLAT, 60, 0.03, idle=IDLE)
    assert not v.passed and v.reasons[0].startswith("2 5xx response(s)")


def test_status_classification():
    cases = [((200, {}, None), None),                                   # read the body
             ((500, {}, None), soak.SERVER_ERROR),
             ((503, {}, None), soak.SERVER_ERROR),                      # 503 without Retry-After
             ((503, {"Retry-After": "5"}, None), soak.BUSY),
             ((429, {"retry-after": "1"}, None), soak.BUSY),
             ((429, {}, None), soak.LOST),                              # backpressure must say when
             ((400, {}, None), soak.LOST),                              # a well-formed request refused
             ((400, {}, 400), soak.REFUSED),
             ((404, {}, 400), soak.LOST),                               # the wrong refusal
             ((200, {}, 400), soak.LOST),                               # a malformed body served
             ((500, {}, 400), soak.SERVER_ERROR)]
    got = [(args, soak.classify_status(*args)) for args, _ in cases]
    assert got == cases


def test_a_stream_needs_every_final_event_and_done():
    fin = [{"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]},
           {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
    assert soak.check_stream(fin + ["[DONE]"], 1) is None
    assert soak.check_stream(fin, 1) == "the stream ended without [DONE]"
    assert soak.check_stream(fin[:1] + ["[DONE]"], 1) == "finish_reason for choices [] of 1"
    assert soak.check_stream(fin + ["[DONE]"], 2) == "finish_reason for choices [0] of 2"
    err = {"error": {"message": "generation failed", "type": "server_error"}}
    assert soak.check_stream(fin[:1] + [err, "[DONE]"], 1).startswith("error event")


def test_a_structured_reply_must_follow_the_schema():
    def body(content, finish="stop"):
        return {"choices": [{"index": 0, "message": {"content": content}, "finish_reason": finish}]}
    assert soak.check_completion(body('{"name": "Ann", "age": 30}'), "json_schema", 1) is None
    assert soak.check_completion(body('{"name": "Ann"'), "json_schema", 1).startswith("not JSON")
    assert soak.check_completion(body('{"name": "Ann"}'), "json_schema", 1).startswith("does not follow")
    assert soak.check_completion(body('{"name": "A', "length"), "json_schema", 1) is None   # cut by max_tokens
    assert soak.check_completion(body("x"), "n_choices", 2) == "1 choices, 2 asked"


def test_rss_growth_after_warm_up_fails_the_run():
    # the warm-up interval's growth does not count; after it, under 3% passes and 4% fails
    assert soak.judge(_ok(5), _intervals([200, 300, 306, 308]), 60, 0.03, idle=IDLE).passed
    v = soak.judge(_ok(5), _intervals([300, 300, 306, 312]), 60, 0.03, idle=IDLE)
    assert not v.passed and v.reasons == ["RSS (anon) grew 4.0% after warm-up (300.0 -> 312.0 MiB), more than 3%"]
    # file-backed pages (the model's mapping) are judged only with --rss total
    grown_file = _intervals([300, 300, 301]) + _intervals([301], file=90)[:1]
    grown_file[-1].update(t0=180.0, t1=240.0)
    assert soak.judge(_ok(5), grown_file, 60, 0.03, idle=IDLE).passed
    v = soak.judge(_ok(5), grown_file, 60, 0.03, idle=IDLE, rss_kind="rss")
    assert v.reasons == ["RSS grew 8.6% after warm-up (360.0 -> 391.0 MiB), more than 3%"]
    v = soak.judge(_ok(5), _intervals([300, 300]), 60, 0.03, idle=IDLE)   # one interval after warm-up
    assert not v.passed and "RSS not judged" in v.reasons[0]


def test_a_server_that_exits_or_keeps_a_slot_fails_the_run():
    v = soak.judge(_ok(5), FLAT, 60, 0.03, server_exit=-9)
    assert v.reasons == ["the server exited with status -9 during the run"]
    busy = {"status": "ok", "slots_busy": 1, "queue_length": 0, "idle": False}
    assert "did not come back to idle" in soak.judge(_ok(5), FLAT, 60, 0.03, idle=busy).reasons[0]


def test_percentiles_match_numpy():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100):
        xs = rng.exponential(size=n).tolist()
        for p in (0.5, 0.99):
            assert soak.percentile(xs, p) == pytest.approx(np.percentile(xs, 100 * p), rel=1e-12)
    assert soak.percentile([], 0.5) is None


def test_only_a_loopback_url_is_targeted():
    assert soak.check_loopback("http://127.0.0.1:8080/") == "http://127.0.0.1:8080"
    assert soak.check_loopback("http://[::1]:9000") == "http://[::1]:9000"
    for url in ("http://10.0.0.2:8080", "http://example.com", "https://127.0.0.1:8080"):
        with pytest.raises(ValueError):
            soak.check_loopback(url)


@pytest.mark.slow
def test_a_short_soak_against_a_real_server(smollm2_path, tmp_path):
    """20 s at 1 request/s against a server the script starts: it passes, and its summary
    accounts for every request it sent."""
    out = tmp_path / "soak.json"
    # a 20-second run has no real warm-up: this checks the run and its accounting, not memory
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "soak.py"), "--model", str(smollm2_path),
                        "--duration", "20", "--rate", "1", "--interval", "10", "--warmup", "0",
                        "--max-rss-growth", "0.5", "--slots", "2", "--ctx", "512", "--json-out", str(out)],
                       capture_output=True, text=True, timeout=900, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    d = json.loads(out.read_text())
    assert d["passed"] and d["outcomes"]["5xx"] == 0 and d["outcomes"]["lost"] == 0
    assert sum(d["outcomes"].values()) == d["requests"] > 0
    assert sum(iv["requests"] for iv in d["intervals"]) == d["requests"] and len(d["intervals"]) == 2
    # VmHWM and the sampled VmRSS are separate kernel counters (RSS is summed per CPU and
    # lags by a few pages), so the high-water mark may read a few pages under a sample
    assert d["idle_after"]["idle"] and d["rss"]["peak_os"] >= d["rss"]["peak_sampled"] - (1 << 20) > 0
