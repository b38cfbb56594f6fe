"""A server over SmolLM2 for the API tests: one engine, two slots, the context of 512 cells."""
from __future__ import annotations

from contextlib import contextmanager

import edgeinfer
from edgeinfer.server import ServerThread


@contextmanager
def smollm2_server(path):
    """The server, serving the model as "smollm2"; stopped and its engine closed on exit."""
    eng = edgeinfer.load(path, n_ctx=512, n_threads=2, n_slots=2)
    srv = ServerThread(eng, model_name="smollm2").start()
    try:
        yield srv
    finally:
        srv.stop(timeout_s=10)
        eng.close()


def openai_client(srv):
    """The official openai client on the server's /v1 routes."""
    import openai
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
