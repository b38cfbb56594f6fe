"""Delivery: the consumer side of the stepping thread.

The stepping thread hands over token ids and goes on to the next forward; this thread
turns them into text (TextStream) and calls the request sinks. Detokenizing, stop strings
and slow sinks thus stay off the stepping thread, and run while the next step's native
forward (which releases the GIL) computes. Events of one request keep their order: one
FIFO, one thread. The thread exits when idle, so an unused engine can be collected.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

log = logging.getLogger("edgeinfer")

Job = Callable[[], None]


class Delivery:
    def __init__(self, idle_exit_s: float = 2.0, name: str = "edgeinfer-delivery"):
        self.idle_exit_s = idle_exit_s
        self.name = name
        self._q: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def put(self, job: Job) -> None:
        with self._lock:
            self._q.put(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()

    def close(self, timeout_s: float = 30) -> None:
        """Runs what was handed over, then stops the thread."""
        with self._lock:
            t = self._thread
            if t is not None:
                self._q.put(None)
        if t is not None and t is not threading.current_thread():
            t.join(timeout=timeout_s)

    def _run(self) -> None:
        while True:
            try:
                job = self._q.get(timeout=self.idle_exit_s)
            except queue.Empty:
                with self._lock:      # put() starts a new thread only once this one is gone
                    if self._q.empty():
                        self._thread = None
                        return
                continue
            if job is None:
                with self._lock:
                    self._thread = None
                    return
            try:
                job()
            except Exception:  # one broken consumer must not stop the others' delivery
                log.exception("event delivery failed")
