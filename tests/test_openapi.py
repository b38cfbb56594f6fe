"""GET /openapi.json against the live server: schemathesis generates requests from the
document (valid and invalid bodies) and holds every answer to it with all of its checks: no
5xx, statuses, content types, headers and bodies as documented (errors in OpenAI's shape,
streams as text/event-stream events), invalid data refused, valid data accepted.

The CI profile is short (EDGEINFER_SCHEMATHESIS_EXAMPLES per operation, default 15); the long
one is in docs/testing.md. Generated bodies keep generation short: max_tokens and n that the
document allows are capped (a valid value stays valid), and the context is small."""
from __future__ import annotations

import json
import os

import pytest
from tests.support.strict import require

import edgeinfer
from edgeinfer.server import ServerThread, create_app
from edgeinfer.server.app import ServerState
from edgeinfer.server.openapi import OPERATIONS

schemathesis = require("schemathesis", "schemathesis checks the server against its OpenAPI document")
jsonschema = require("jsonschema", "jsonschema validates the stream events")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.config import SchemathesisConfig  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import positive_data_acceptance  # noqa: E402

from tests.test_server import request  # noqa: E402

N_CTX = 128
EXAMPLES = int(os.environ.get("EDGEINFER_SCHEMATHESIS_EXAMPLES", "15"))
MAX_TOKENS_CAP = 3      # generation stays a few steps per example
N_CAP = 2


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    """With a prompt cache and an adapter directory, so that the slot and adapter routes do their work
    (not a 501 for a missing directory)."""
    root = tmp_path_factory.mktemp("openapi")
    eng = edgeinfer.load(smollm2_path, n_ctx=N_CTX, n_threads=2, n_slots=4, prompt_cache=str(root / "cache"))
    srv = ServerThread(eng, max_body=64 * 1024, model_name="smollm2", lora_dir=str(root)).start()
    yield srv
    srv.stop(timeout_s=30)
    eng.close()


def _config() -> SchemathesisConfig:
    """All checks. Valid data may still get a 400: what JSON Schema cannot say (a prompt and
    max_tokens that must fit the model's context, token ids inside its vocabulary, a grammar
    that parses, a chat template that accepts the roles) is checked by the server, which
    answers a documented 400 naming the field."""
    return SchemathesisConfig.from_dict({
        "checks": {"enabled": True,
                   "positive_data_acceptance": {"expected-statuses": ["2xx", "400", "404", "429"]},
                   # invalid data may also be a body past the server's limit (a long list): 413
                   "negative_data_rejection": {"expected-statuses": [
                       "400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]}},
        "generation": {"mode": "all"},
    })


def cap_generation(body, default: str | None = "max_tokens") -> None:
    """Caps generation lengths the document allows, so that a valid value stays valid and an
    invalid one (below the minimum, of the wrong type) stays invalid; every phase's bodies
    (examples, coverage, fuzzing) pass here. `default`: the field an omitted length is capped by
    (None where the route requires it: /v1/messages)."""
    if isinstance(body, dict):
        for key, cap in (("max_tokens", MAX_TOKENS_CAP), ("max_completion_tokens", MAX_TOKENS_CAP),
                         ("max_output_tokens", MAX_TOKENS_CAP), ("n", N_CAP)):
            v = body.get(key)
            if type(v) is int and cap < v <= (16 if key == "n" else 2**63):
                body[key] = cap
        lengths = ("max_tokens", "max_completion_tokens", "max_output_tokens")
        if default and all(body.get(k) is None for k in lengths):   # to the end
            body[default] = MAX_TOKENS_CAP


def cap_ollama(body) -> None:
    """An Ollama body's `options.num_predict` capped as cap_generation caps max_tokens; omitted
    or without a bound (-1, -2), it is set to the cap."""
    if isinstance(body, dict):
        opts = body.setdefault("options", {})
        v = opts.get("num_predict") if isinstance(opts, dict) else 0
        if v is None or (type(v) is int and (v > MAX_TOKENS_CAP or v in (-1, -2))):
            opts["num_predict"] = MAX_TOKENS_CAP


@pytest.fixture(scope="module")
def api(server):
    return schemathesis.openapi.from_url(server.url + "/openapi.json", config=_config())


schema = schemathesis.pytest.from_fixture("api")


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_answer_matches_the_document(case):
    length = {"/v1/chat/completions": "max_tokens", "/v1/completions": "max_tokens", "/v1/messages": None,
              "/v1/responses": "max_output_tokens"}
    if case.operation.path in length:
        cap_generation(case.body, default=length[case.operation.path])
    if case.operation.path in ("/api/chat", "/api/generate"):
        cap_ollama(case.body)
    if case.operation.path == "/infill":
        response = case.call(timeout=120)
        if response.status_code == 501:
            # SmolLM2 has no fill-in-the-middle tokens: a request valid in every other way gets
            # llama-server's 501 naming them (documented), not a server fault
            assert "fill-in-the-middle tokens" in response.json()["error"]["message"], response.text
            case.validate_response(response, excluded_checks=[not_a_server_error, positive_data_acceptance])
        else:
            case.validate_response(response)
        return
    case.call_and_validate(timeout=120)


def test_the_document_covers_every_route_and_is_valid_openapi(server):
    validator = require("openapi_spec_validator", "the OpenAPI 3.1 meta-schema")
    st, hdrs, doc = request(server.url + "/openapi.json")
    assert st == 200 and hdrs["Content-Type"].startswith("application/json")
    validator.validate(doc)
    assert doc["openapi"] == "3.1.0"
    app = create_app(ServerState(registry=server.state.registry))
    routes = {(r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert routes == documented == {(op.method, op.path) for op in OPERATIONS}


def test_streamed_events_match_the_document(server):
    """The events of a stream, chat and completions, each against the schema the document
    gives a text/event-stream event (schemathesis reads streams too; here every kind of event
    is sure to occur: the role chunk, content, finish, usage, [DONE])."""
    st, _, doc = request(server.url + "/openapi.json")
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
                       ("/v1/completions", {"prompt": "Water boils at"})):
        event_schema = doc["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
        data_schemas = event_schema["properties"]["data"]["anyOf"]
        chunk_schema = {**data_schemas[1]["contentSchema"], "components": doc["components"]}
        st, hdrs, text = request(server.url + path, "POST", {**body, "max_tokens": 4, "stream": True,
                                                             "stream_options": {"include_usage": True},
                                                             "logprobs": True if "chat" in path else 2})
        assert st == 200 and hdrs["Content-Type"].startswith("text/event-stream")
        events = [e.removeprefix("data: ") for e in text.split("\n\n") if e]
        assert events[-1] == "[DONE]"
        for data in events[:-1]:
            jsonschema.validate(json.loads(data), chunk_schema)
        assert json.loads(events[-2])["usage"]["completion_tokens"] == 4
