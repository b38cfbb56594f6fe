"""/v1/responses through the official `openai` client's Responses API: the same conversation
gives the chat route's greedy text (plain and streamed, its events in the order and shapes the
document gives), function calls and their outputs, a kept response continued by
previous_response_id, structured output, and bad input answered 400 in OpenAI's error shape,
naming the Responses body's fields. Reasoning items are in tests/test_reasoning.py."""
from __future__ import annotations

import json

import pytest
from tests.support.strict import require

from tests.support.serving import smollm2_server
from tests.test_server import request

openai = require("openai", "the openai client is the /v1/responses oracle")
jsonschema = require("jsonschema", "jsonschema validates the output and the stream events")

SYSTEM = "You are a helpful assistant. Be brief."
TURNS = [{"role": "user", "content": "What is the capital of France?"},
         {"role": "assistant", "content": "Paris."},
         {"role": "user", "content": "And of Italy?"}]
TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather of a city now",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
CHAT_TOOLS = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")}}
              for t in TOOLS]


@pytest.fixture(scope="module")
def server(smollm2_path):
    with smollm2_server(smollm2_path) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def chat_reply(client, messages, max_tokens, **kw):
    return client.chat.completions.create(model="smollm2", messages=[{"role": "system", "content": SYSTEM}] + messages,
                                          max_tokens=max_tokens, temperature=0.0, **kw)


def events_of(body: str) -> list[dict]:
    events = [dict(line.split(": ", 1) for line in e.split("\n")) for e in body.split("\n\n") if e]
    assert all(json.loads(e["data"])["type"] == e["event"] for e in events)
    return [json.loads(e["data"]) for e in events]


def streamed(client, **kw):
    """The text deltas and the last Response of a streamed request (the response.completed or
    response.incomplete event's: the client's stream helper takes only the first)."""
    deltas, final = [], None
    for ev in client.responses.create(**kw, stream=True):
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
        elif ev.type in ("response.completed", "response.incomplete"):
            final = ev.response
    return "".join(deltas), final


def test_plain_and_streamed_equal_the_chat_route(client):
    """Instructions and several turns: the chat route's text and token counts; EOS completes the
    response, max_output_tokens leaves it incomplete."""
    statuses = []
    for max_tokens in (40, 1):
        want = chat_reply(client, TURNS, max_tokens)
        kw = dict(model="smollm2", instructions=SYSTEM, input=TURNS, max_output_tokens=max_tokens, temperature=0.0)
        got = client.responses.create(**kw)
        assert [o.type for o in got.output] == ["message"] and got.output_text == want.choices[0].message.content
        assert (got.usage.input_tokens, got.usage.output_tokens) == (want.usage.prompt_tokens,
                                                                     want.usage.completion_tokens)
        assert got.status == {"stop": "completed", "length": "incomplete"}[want.choices[0].finish_reason]
        assert (got.incomplete_details and got.incomplete_details.reason) == \
            (None if got.status == "completed" else "max_output_tokens")
        text, final = streamed(client, **kw)
        assert text == final.output_text == got.output_text
        assert (final.status, final.usage.output_tokens) == (got.status, got.usage.output_tokens)
        statuses.append(got.status)
    assert statuses == ["completed", "incomplete"]


def test_a_string_input_is_one_user_message(client):
    want = chat_reply(client, TURNS[:1], 12).choices[0].message.content
    got = client.responses.create(model="smollm2", instructions=SYSTEM, input=TURNS[0]["content"],
                                  max_output_tokens=12, temperature=0.0)
    assert got.output_text == want


def test_stream_events_come_in_order_and_match_the_document(server):
    st, hdrs, body = request(server.url + "/v1/responses", "POST",
                             {"model": "smollm2", "input": TURNS, "max_output_tokens": 6, "temperature": 0.0,
                              "stream": True, "ignore_eos": True})
    assert st == 200 and hdrs["Content-Type"].startswith("text/event-stream")
    events = events_of(body)
    _, _, doc = request(server.url + "/openapi.json")     # each event as the document gives it
    event = doc["paths"]["/v1/responses"]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
    schema = {**event["properties"]["data"]["contentSchema"], "components": doc["components"]}
    for e in events:
        jsonschema.validate(e, schema)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    names = [e["type"] for e in events]
    assert names[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert names[4:-4] == ["response.output_text.delta"] * 6
    assert names[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    final = events[-1]["response"]
    text = "".join(e["delta"] for e in events[4:-4])
    assert events[-4]["text"] == final["output"][0]["content"][0]["text"] == text
    assert final["usage"]["output_tokens"] == 6 and final["status"] == "incomplete"


def test_function_call_round_trip(client):
    """tool_choice required: a function_call item, the chat route's call (plain and streamed);
    its function_call_output answered as the chat route answers the call and its tool message."""
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    want = chat_reply(client, ask, 40, tools=CHAT_TOOLS, tool_choice="required").choices[0]
    (wanted,) = want.message.tool_calls
    kw = dict(model="smollm2", instructions=SYSTEM, input=ask, max_output_tokens=40, tools=TOOLS,
              tool_choice="required", temperature=0.0)
    got = client.responses.create(**kw)
    (call,) = got.output
    assert (call.type, call.name, json.loads(call.arguments)) == \
        ("function_call", wanted.function.name, json.loads(wanted.function.arguments))
    with client.responses.stream(**kw) as stream:      # the client's helper: the call ends the response
        final = stream.get_final_response()
    assert [(o.type, o.name, o.arguments) for o in final.output] == [(call.type, call.name, call.arguments)]

    result = "Sunny, 24 degrees."
    answer = client.responses.create(
        model="smollm2", instructions=SYSTEM, max_output_tokens=30, tools=TOOLS, temperature=0.0,
        input=ask + [call.model_dump(include={"type", "call_id", "name", "arguments"}),
                     {"type": "function_call_output", "call_id": call.call_id, "output": result}])
    want = chat_reply(client, ask + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": result}], 30, tools=CHAT_TOOLS)
    assert answer.usage.input_tokens == want.usage.prompt_tokens      # the call and its output in the prompt
    message = want.choices[0].message
    assert [(o.type, o.name, json.loads(o.arguments)) if o.type == "function_call" else (o.type, o.content[0].text)
            for o in answer.output] == \
        ([("function_call", c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]
         if message.tool_calls else [("message", message.content)])


def test_previous_response_id_continues_a_kept_response(client):
    """A kept response's conversation (its input and output, not its instructions) goes before the
    next request's input: the chat route's reply to the whole conversation. GET returns the kept
    response; DELETE forgets it; `store: false` keeps none."""
    first = client.responses.create(model="smollm2", instructions=SYSTEM, input=TURNS[0]["content"],
                                    max_output_tokens=20, temperature=0.0)
    then = client.responses.create(model="smollm2", instructions=SYSTEM, input=TURNS[2]["content"],
                                   previous_response_id=first.id, max_output_tokens=20, temperature=0.0)
    want = chat_reply(client, [TURNS[0], {"role": "assistant", "content": first.output_text}, TURNS[2]], 20)
    assert then.output_text == want.choices[0].message.content and then.previous_response_id == first.id
    assert then.usage.input_tokens == want.usage.prompt_tokens
    assert client.responses.retrieve(first.id).model_dump() == first.model_dump()
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="smollm2", input="x", previous_response_id=first.id)
    assert e.value.body["code"] == "previous_response_not_found"
    unkept = client.responses.create(model="smollm2", input="x", max_output_tokens=2, store=False)
    assert unkept.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)


def test_the_store_keeps_the_last_responses_only():
    from edgeinfer.server.openai_responses import ResponseStore
    store = ResponseStore(capacity=2)
    for rid in ("a", "b", "c"):
        store.put({"id": rid}, [{"role": "user", "content": rid}])
    assert store.get("a") is None and store.get("c") == ({"id": "c"}, [{"role": "user", "content": "c"}])
    assert store.delete("b") and not store.delete("b") and store.get("b") is None


def test_logprobs_are_the_chat_routes(client):
    """include message.output_text.logprobs with top_logprobs: each token's logprob and
    alternatives on the message's output_text, as the chat route gives them; streamed, the
    deltas' logprobs make up the same list."""
    want = chat_reply(client, TURNS, 8, logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    kw = dict(model="smollm2", instructions=SYSTEM, input=TURNS, max_output_tokens=8, temperature=0.0,
              include=["message.output_text.logprobs"], top_logprobs=3, extra_body={"ignore_eos": True})
    got = client.responses.create(**kw).output[0].content[0].logprobs
    assert [lp.model_dump() for lp in got] == [lp.model_dump() for lp in want.choices[0].logprobs.content]
    assert len(got) == 8 and all(len(lp.top_logprobs) == 3 for lp in got)
    streamed = [lp for ev in client.responses.create(**kw, stream=True) if ev.type == "response.output_text.delta"
                for lp in ev.logprobs]
    assert [(lp.token, lp.logprob) for lp in streamed] == [(lp.token, lp.logprob) for lp in got]


def test_text_format_json_schema_is_followed(client):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    ask = [{"role": "user", "content": "Describe a person as JSON."}]
    want = chat_reply(client, ask, 60, response_format={"type": "json_schema", "json_schema": {
        "name": "person", "schema": schema, "strict": True}}).choices[0].message.content
    got = client.responses.create(model="smollm2", instructions=SYSTEM, input=ask, max_output_tokens=60,
                                  temperature=0.0, text={"format": {"type": "json_schema", "name": "person",
                                                                    "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(got.output_text), schema)
    assert got.output_text == want


@pytest.mark.parametrize("body, param, code", [
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "previous_response_not_found"),
    ({"input": "x", "conversation": "conv_1"}, "conversation", "unsupported_parameter"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "unsupported_value"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type", "unsupported_value"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
     "input[0].content[0]", "unsupported_value"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0].text",
     "missing_required_parameter"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "invalid_value"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id",
     "missing_required_parameter"),
    ({"input": []}, "input", "invalid_value"),
    ({"input": "x", "temperature": 2.5}, "temperature", "invalid_value"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "p"}}}, "text.format.schema",
     "missing_required_parameter"),
    ({"input": "x", "max_output_tokens": 4000}, "max_output_tokens", "context_length_exceeded"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "p", "schema": {"type": "bogus"}}}},
     "text.format", "invalid_value"),
])
def test_bad_input_is_a_400_naming_the_field(server, body, param, code):
    st, _, got = request(server.url + "/v1/responses", "POST", {"model": "smollm2", **body})
    assert st == 400 and got["error"]["type"] == "invalid_request_error", got
    assert (got["error"]["param"], got["error"]["code"]) == (param, code), got
    assert "max_tokens" not in got["error"]["message"] and "response_format" not in got["error"]["message"]


def test_the_client_raises_typed_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="x")
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="smollm2", input="x", max_output_tokens=0)
    assert e.value.body["param"] == "max_output_tokens"
