"""POST /v1/messages and /v1/messages/count_tokens through the official `anthropic` client:
the same conversation gives the OpenAI chat route's greedy text (plain and streamed), stop
sequences, tool use with tool results, token counts, and bad input answered 4xx in Anthropic's
error shape. Greedy needs temperature 0, which the client sends in extra_body."""
from __future__ import annotations

import json

import pytest
from tests.support.strict import require

import edgeinfer
from edgeinfer.server import ServerThread
from tests.test_server import request

anthropic = require("anthropic", "the anthropic client is the /v1/messages oracle")
openai = require("openai", "the openai client is the chat route's oracle")
jsonschema = require("jsonschema", "jsonschema validates the stream events")

GREEDY = {"temperature": 0.0}
SYSTEM = "You are a helpful assistant. Be brief."
TURNS = [{"role": "user", "content": "What is the capital of France?"},
         {"role": "assistant", "content": "Paris."},
         {"role": "user", "content": "And of Italy?"}]
TOOLS = [{"name": "get_weather", "description": "The weather of a city now",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
OPENAI_TOOLS = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                  "parameters": t["input_schema"]}} for t in TOOLS]


@pytest.fixture(scope="module")
def engine(smollm2_path):
    eng = edgeinfer.load(smollm2_path, n_ctx=512, n_threads=2, n_slots=2)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def server(engine):
    srv = ServerThread(engine, model_name="smollm2").start()
    yield srv
    srv.stop(timeout_s=10)


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def openai_reply(oai, messages, max_tokens, **kw):
    return oai.chat.completions.create(model="smollm2", messages=[{"role": "system", "content": SYSTEM}] + messages,
                                       max_tokens=max_tokens, temperature=0.0, **kw)


def blocks(msg) -> list[tuple]:
    return [(b.type, b.text) if b.type == "text" else (b.type, b.name, b.input) for b in msg.content]


def openai_blocks(message) -> list[tuple]:
    """The content blocks Anthropic's reply holds for the chat route's message."""
    if message.tool_calls:
        return [("tool_use", c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]
    return [("text", message.content)]


def test_plain_and_streamed_equal_the_openai_route(client, oai):
    """System prompt and several turns: the text, token counts and stop reason of the chat route."""
    for max_tokens in (40, 5):     # ends with EOS (end_turn), then cut (max_tokens)
        want = openai_reply(oai, TURNS, max_tokens)
        kw = dict(model="smollm2", system=SYSTEM, messages=TURNS, max_tokens=max_tokens, extra_body=GREEDY)
        msg = client.messages.create(**kw)
        assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == want.choices[0].message.content
        assert (msg.usage.input_tokens, msg.usage.output_tokens) == (want.usage.prompt_tokens,
                                                                     want.usage.completion_tokens)
        assert msg.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[want.choices[0].finish_reason]
        with client.messages.stream(**kw) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert text == msg.content[0].text
        assert (final.stop_reason, final.usage.output_tokens) == (msg.stop_reason, msg.usage.output_tokens)


def test_a_prefilled_reply_is_continued(client, engine):
    """A conversation that ends with the assistant's text (Anthropic's prefill): the reply is the
    greedy continuation of the prompt transformers renders with continue_final_message, without
    the prefill itself, plain and streamed."""
    transformers = require("transformers", "apply_chat_template(continue_final_message=True) is the prompt's oracle")
    tokenizers = require("tokenizers", "a stand-in tokenizer object for transformers' template rendering")
    messages = [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "The color is"}]
    eng = engine
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer(tokenizers.models.WordLevel({"<unk>": 0}, unk_token="<unk>")))
    prompt = tok.apply_chat_template([{"role": "system", "content": SYSTEM}] + messages, tokenize=False,
                                     chat_template=eng.template.source, continue_final_message=True)
    assert prompt.endswith("assistant\nThe color is")
    want = eng.generate(eng.tokenize(prompt, add_special=False), max_tokens=8, temperature=0.0)
    kw = dict(model="smollm2", system=SYSTEM, messages=messages, max_tokens=8, extra_body=GREEDY)
    msg = client.messages.create(**kw)
    assert blocks(msg) == [("text", want.text)] and msg.usage.output_tokens == len(want.tokens)
    with client.messages.stream(**kw) as stream:
        assert "".join(stream.text_stream) == want.text


def test_stream_events_come_in_anthropic_order(server):
    st, hdrs, body = request(server.url + "/v1/messages", "POST",
                             {"model": "smollm2", "max_tokens": 6, "messages": TURNS, **GREEDY, "stream": True,
                              "ignore_eos": True})
    assert st == 200 and hdrs["Content-Type"].startswith("text/event-stream")
    events = [dict(line.split(": ", 1) for line in e.split("\n")) for e in body.split("\n\n") if e]
    names = [e["event"] for e in events]
    _, _, doc = request(server.url + "/openapi.json")     # each event as the document gives it
    event = doc["paths"]["/v1/messages"]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
    schema = {**event["properties"]["data"]["contentSchema"], "components": doc["components"]}
    for e in events:
        jsonschema.validate(json.loads(e["data"]), schema)
    assert all(json.loads(e["data"])["type"] == e["event"] for e in events)
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    delta = json.loads(events[-2]["data"])
    assert delta["delta"]["stop_reason"] == "max_tokens" and delta["usage"]["output_tokens"] == 6


def test_stop_sequences(client, oai):
    full = openai_reply(oai, TURNS[:1], 24).choices[0].message.content
    stop = full.split()[2]                # a word inside the greedy reply
    want = openai_reply(oai, TURNS[:1], 24, stop=[stop])
    msg = client.messages.create(model="smollm2", system=SYSTEM, messages=TURNS[:1], max_tokens=24,
                                 stop_sequences=[stop], extra_body=GREEDY)
    assert msg.content[0].text == want.choices[0].message.content == full[:full.index(stop)]
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", stop)


def test_tool_use_round_trip(client, oai):
    """tool_choice any: a tool_use block, the chat route's call; its tool_result answered as the
    chat route answers the same call and tool message."""
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    want = openai_reply(oai, ask, 40, tools=OPENAI_TOOLS, tool_choice="required").choices[0]
    msg = client.messages.create(model="smollm2", system=SYSTEM, messages=ask, max_tokens=40, tools=TOOLS,
                                 tool_choice={"type": "any"}, extra_body=GREEDY)
    assert msg.stop_reason == "tool_use" and want.finish_reason == "tool_calls"
    (use,) = msg.content
    (call,) = want.message.tool_calls
    assert (use.type, use.name, use.input) == ("tool_use", call.function.name, json.loads(call.function.arguments))
    with client.messages.stream(model="smollm2", system=SYSTEM, messages=ask, max_tokens=40, tools=TOOLS,
                                tool_choice={"type": "any"}, extra_body=GREEDY) as stream:
        streamed = stream.get_final_message()
    assert [(b.type, b.name, b.input) for b in streamed.content] == [("tool_use", use.name, use.input)]

    result = "Sunny, 24 degrees."
    answer = client.messages.create(
        model="smollm2", system=SYSTEM, max_tokens=30, tools=TOOLS, extra_body=GREEDY,
        messages=ask + [{"role": "assistant", "content": [use.model_dump(include={"type", "id", "name", "input"})]},
                        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                      "content": result}]}])
    want = openai_reply(oai, ask + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": use.id, "type": "function", "function": {"name": use.name, "arguments": json.dumps(use.input)}}]},
        {"role": "tool", "tool_call_id": use.id, "content": result}], 30, tools=OPENAI_TOOLS)
    assert answer.usage.input_tokens == want.usage.prompt_tokens      # the call and its result in the prompt
    assert blocks(answer) == openai_blocks(want.choices[0].message)    # (the model calls it again)


def test_a_call_max_tokens_cuts_is_a_text_block(client, oai):
    """A forced call cut by max_tokens has no input object: a text block of the arguments the
    chat route gives, plain and streamed."""
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    (call,) = openai_reply(oai, ask, 20, tools=OPENAI_TOOLS, tool_choice="required").choices[0].message.tool_calls
    kw = dict(model="smollm2", system=SYSTEM, messages=ask, max_tokens=20, tools=TOOLS, tool_choice={"type": "any"},
              extra_body=GREEDY)
    msg = client.messages.create(**kw)
    assert (msg.stop_reason, blocks(msg)) == ("max_tokens", [("text", call.function.arguments)])
    with client.messages.stream(**kw) as stream:
        assert blocks(stream.get_final_message()) == blocks(msg)


def test_count_tokens_equals_the_openai_routes_prompt_tokens(client, oai):
    for kw, okw in (({}, {}), ({"tools": TOOLS}, {"tools": OPENAI_TOOLS})):
        want = openai_reply(oai, TURNS, 1, **okw).usage.prompt_tokens
        got = client.messages.count_tokens(model="smollm2", system=SYSTEM, messages=TURNS, **kw).input_tokens
        assert got == want, kw


@pytest.mark.parametrize("body, status, kind, param", [
    ({"model": "smollm2", "messages": TURNS}, 400, "invalid_request_error", "max_tokens"),
    ({"model": "smollm2", "max_tokens": 4, "messages": []}, 400, "invalid_request_error", "messages"),
    ({"model": "smollm2", "max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}, 400,
     "invalid_request_error", "role"),
    ({"model": "smollm2", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]}, 400,
     "invalid_request_error", "content"),
    ({"model": "smollm2", "max_tokens": 4, "messages": [{"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "x", "content": "y"}]}]}, 400, "invalid_request_error", "tool_result"),
    ({"model": "smollm2", "max_tokens": 4, "temperature": 1.5, "messages": TURNS}, 400,
     "invalid_request_error", "temperature"),
    ({"model": "smollm2", "max_tokens": 4, "messages": TURNS, "tool_choice": {"type": "tool"}, "tools": TOOLS},
     400, "invalid_request_error", "tool_choice"),
    ({"model": "no-such-model", "max_tokens": 4, "messages": TURNS}, 404, "not_found_error", "no-such-model"),
    ({"model": "smollm2", "max_tokens": 4000, "messages": TURNS}, 400, "invalid_request_error", "max_tokens"),
])
def test_bad_input_is_a_4xx_in_anthropics_error_shape(server, body, status, kind, param):
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        if path.endswith("count_tokens") and status == 400 and param in ("max_tokens", "temperature"):
            continue     # not fields of a count
        st, _, got = request(server.url + path, "POST", body)
        assert st == status and got["type"] == "error" and got["error"]["type"] == kind, (path, got)
        assert param in got["error"]["message"], got


def test_the_client_raises_typed_errors_and_other_failures_keep_the_shape(server, client):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="smollm2", max_tokens=0, messages=TURNS)
    assert e.value.body["error"]["type"] == "invalid_request_error"
    for method, raw, status in (("GET", None, 405), ("POST", b"{not json", 400)):
        st, _, got = request(server.url + "/v1/messages", method, raw=raw)
        assert st == status and got["type"] == "error", got


def test_the_api_key_in_anthropics_header(smollm2_path):
    with edgeinfer.load(smollm2_path, n_ctx=128, n_threads=2) as eng:
        srv = ServerThread(eng, model_name="smollm2", api_key="sekret").start()
        try:
            ok = anthropic.Anthropic(base_url=srv.url, api_key="sekret", max_retries=0, timeout=60)
            assert ok.messages.count_tokens(model="smollm2", messages=TURNS).input_tokens > 0
            wrong = anthropic.Anthropic(base_url=srv.url, api_key="nope", max_retries=0, timeout=60)
            with pytest.raises(anthropic.AuthenticationError) as e:
                wrong.messages.count_tokens(model="smollm2", messages=TURNS)
            assert e.value.body["error"]["type"] == "authentication_error"
        finally:
            srv.stop(timeout_s=10)
