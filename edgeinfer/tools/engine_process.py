"""One benchmarked engine in its own worker process (``edgeinfer bench --process-per-engine``).

Two engines in one process disturb each other: their thread pools, allocators and caches
share the process, and on some hosts that costs one engine more than the other (see
docs/performance-log.md, run F). ``ProcessRunner`` keeps bench's interleaved schedule but runs
each engine in a child of its own, driven over a pipe: one JSON line per call, one JSON line
back. Timings are taken inside the child, exactly as the in-process runners take them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Optional

from .peers import PeerSkipped, Runner, make_runner

_ATTRS = ("engine", "label", "n_vocab", "kv_bytes", "scratch_bytes")


class EngineProcessError(RuntimeError):
    """The worker process failed, or died."""


class ProcessRunner(Runner):
    """A Runner whose engine lives in a child process (see the module docstring)."""

    def __init__(self, kind: str, arg: Optional[str], model_path: str, threads: int, n_ctx: int, batch: int,
                 isa: str = "best", kv: str = "f16", device: str = "cpu"):
        self.engine = kind
        code = "from edgeinfer.tools.engine_process import worker_main; worker_main()"
        self._p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True, bufsize=1)
        try:
            reply = self._call({"op": "load", "kind": kind, "arg": arg, "path": model_path, "threads": threads,
                                "n_ctx": n_ctx, "batch": batch, "isa": isa, "kv": kv, "device": device})
        except BaseException:
            self.close()   # a worker that could not load must not outlive the error
            raise
        for name in _ATTRS:
            setattr(self, name, reply[name])

    def _call(self, msg: dict) -> Any:
        if self._p.poll() is not None:
            raise EngineProcessError(f"{self.engine} worker exited with status {self._p.returncode}")
        try:
            self._p.stdin.write(json.dumps(msg) + "\n")
            self._p.stdin.flush()
            line = self._p.stdout.readline()
        except BrokenPipeError as e:
            raise EngineProcessError(f"{self.engine} worker died") from e
        if not line:
            raise EngineProcessError(f"{self.engine} worker exited with status {self._p.wait()}")
        reply = json.loads(line)
        if "skip" in reply:
            raise PeerSkipped(reply["skip"])
        if "error" in reply:
            raise EngineProcessError(f"{self.engine} worker: {reply['error']}")
        return reply["result"]

    def pp(self, ids: list[int]) -> float:
        return self._call({"op": "pp", "ids": ids})

    def tg(self, prefix: list[int], n: int) -> float:
        return self._call({"op": "tg", "prefix": prefix, "n": n})

    def ttft_tpot(self, ids: list[int], n: int) -> tuple[float, float]:
        a, b = self._call({"op": "ttft_tpot", "ids": ids, "n": n})
        return a, b

    def close(self) -> None:
        if self._p.poll() is None:
            try:
                self._p.stdin.write(json.dumps({"op": "close"}) + "\n")
                self._p.stdin.flush()
            except BrokenPipeError:
                pass
            try:
                self._p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._p.kill()
                self._p.wait()
        for f in (self._p.stdin, self._p.stdout):
            if f and not f.closed:
                f.close()


def worker_main() -> None:  # pragma: no cover - runs in the child (covered through ProcessRunner)
    """The child: builds one runner, then answers one JSON line per request until close or EOF."""
    # Replies go to a copy of fd 1; fd 1 itself then points at stderr, so nothing the engines
    # print (from Python or from C) can corrupt the reply channel.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    runner: Optional[Runner] = None

    def reply(**kw) -> None:
        out.write(json.dumps(kw) + "\n")
        out.flush()

    for line in sys.stdin:
        msg = json.loads(line)
        op = msg["op"]
        if op == "close":
            break
        try:
            if op != "load" and runner is None:
                reply(error="no engine loaded")
            elif op == "load":
                runner = make_runner(msg["kind"], msg["arg"], msg["path"], msg["threads"], msg["n_ctx"],
                                     msg["batch"], msg["isa"], msg["kv"], msg["device"])
                reply(result={name: getattr(runner, name) for name in _ATTRS})
            elif op == "pp":
                reply(result=runner.pp(msg["ids"]))
            elif op == "tg":
                reply(result=runner.tg(msg["prefix"], msg["n"]))
            elif op == "ttft_tpot":
                reply(result=list(runner.ttft_tpot(msg["ids"], msg["n"])))
            else:
                reply(error=f"unknown request {op!r}")
        except PeerSkipped as e:
            reply(skip=str(e))
        except Exception as e:  # noqa: BLE001 - every failure goes back to the parent as text
            reply(error=f"{type(e).__name__}: {e}")
    if runner is not None:
        runner.close()
