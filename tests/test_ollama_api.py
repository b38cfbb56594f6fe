"""Ollama's API (/api/chat, /api/generate, /api/embed, /api/embeddings, /api/tags, /api/show,
/api/ps, /api/version) through the official `ollama` client: the same conversation gives the
OpenAI chat route's greedy text under Ollama's sampling defaults (plain and streamed, each line
as the document gives it), a raw generation the completions route's text, tool calls,
structured output, logprobs, the embeddings route's vectors, the file's own details and
metadata (read by the `gguf` package), LiteLLM's Ollama providers as an app's client, and bad
input answered 4xx in Ollama's error shape."""
from __future__ import annotations

import json

import numpy as np
import pytest
from tests.support.strict import require

import edgeinfer
from tests.support.serving import smollm2_server
from tests.test_server import request

ollama = require("ollama", "the ollama client is the /api routes' oracle")
openai = require("openai", "the openai client is the chat route's oracle")
gguf = require("gguf", "the gguf package reads the model file's metadata")
jsonschema = require("jsonschema", "jsonschema validates the stream lines")

SYSTEM = "You are a helpful assistant. Be brief."
TURNS = [{"role": "user", "content": "What is the capital of France?"},
         {"role": "assistant", "content": "Paris."},
         {"role": "user", "content": "And of Italy?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
GREEDY = {"temperature": 0.0}
OLLAMA_DEFAULTS = {"repeat_penalty": 1.1, "top_k": 40, "top_p": 0.9}   # what the chat route is told to match


@pytest.fixture(scope="module")
def server(smollm2_path):
    with smollm2_server(smollm2_path) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url, timeout=120)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def chat_reply(oai, messages, max_tokens, temperature=0.0, **kw):
    return oai.chat.completions.create(model="smollm2", messages=messages, max_tokens=max_tokens,
                                       temperature=temperature,
                                       extra_body={**{k: v for k, v in OLLAMA_DEFAULTS.items() if k not in kw},
                                                   **kw.pop("extra_body", {})}, **kw)


def test_chat_plain_and_streamed_equal_the_chat_route(client, oai):
    """Several turns, greedy under Ollama's defaults: the chat route's text and token counts; the
    streamed lines join to the same text and end with the one `done` line; `:latest` is the tag
    Ollama's clients add to a name."""
    messages = [{"role": "system", "content": SYSTEM}] + TURNS
    for n, reason in ((40, "stop"), (2, "length")):
        want = chat_reply(oai, messages, n)
        got = client.chat(model="smollm2:latest", messages=messages, options={**GREEDY, "num_predict": n})
        assert (got.message.content, got.prompt_eval_count, got.eval_count) == \
            (want.choices[0].message.content, want.usage.prompt_tokens, want.usage.completion_tokens)
        assert got.done and got.done_reason == reason == want.choices[0].finish_reason
        lines = list(client.chat(model="smollm2", messages=messages, options={**GREEDY, "num_predict": n},
                                 stream=True))
        assert [x.done for x in lines] == [False] * (len(lines) - 1) + [True]
        assert "".join(x.message.content for x in lines) == got.message.content
        assert (lines[-1].done_reason, lines[-1].eval_count) == (reason, got.eval_count)


def test_stream_lines_match_the_document(server):
    """Each line of a streamed /api/chat and /api/generate reply against the schema the document
    gives a line of application/x-ndjson."""
    _, _, doc = request(server.url + "/openapi.json")
    for path, body in (("/api/chat", {"messages": TURNS}), ("/api/generate", {"prompt": "Water boils at"})):
        line_schema = {**doc["paths"][path]["post"]["responses"]["200"]["content"]["application/x-ndjson"]["schema"],
                       "components": doc["components"]}
        st, hdrs, text = request(server.url + path, "POST", {"model": "smollm2", **body, "logprobs": True,
                                                             "options": {**GREEDY, "num_predict": 4}})
        assert st == 200 and hdrs["Content-Type"].startswith("application/x-ndjson")
        lines = [json.loads(x) for x in text.splitlines()]
        for line in lines:
            jsonschema.validate(line, line_schema)
        assert [x["done"] for x in lines] == [False] * (len(lines) - 1) + [True]
        assert len(lines) - 1 == lines[-1]["eval_count"] > 0       # a line a token: each has its logprobs


def test_generate_is_one_user_turn_and_raw_is_a_completion(client, oai):
    """A prompt and a system prompt are the chat of those two turns; with raw the prompt is
    completed as is, as /v1/completions completes it."""
    want = chat_reply(oai, [{"role": "system", "content": SYSTEM}, TURNS[0]], 30).choices[0].message.content
    got = client.generate(model="smollm2", system=SYSTEM, prompt=TURNS[0]["content"],
                          options={**GREEDY, "num_predict": 30})
    assert got.response == want
    raw = oai.completions.create(model="smollm2", prompt="Water boils at", max_tokens=12, temperature=0.0,
                                 extra_body=OLLAMA_DEFAULTS)
    got = client.generate(model="smollm2", prompt="Water boils at", raw=True, options={**GREEDY, "num_predict": 12})
    assert (got.response, got.prompt_eval_count, got.eval_count) == \
        (raw.choices[0].text, raw.usage.prompt_tokens, raw.usage.completion_tokens)
    streamed = "".join(x.response for x in client.generate(model="smollm2", prompt="Water boils at", raw=True,
                                                           options={**GREEDY, "num_predict": 12}, stream=True))
    assert streamed == got.response


def test_options_reach_the_sampler(client, oai):
    """Ollama's options as the chat route's fields: a seed draws the same tokens, stop strings
    cut, repeat_penalty 1 or repeat_last_n 0 turns the default penalty off."""
    ask = [TURNS[0]]
    opts = {"temperature": 0.9, "seed": 7, "top_k": 20, "top_p": 0.8, "min_p": 0.05, "presence_penalty": 0.5,
            "frequency_penalty": 0.25, "num_predict": 24}
    want = chat_reply(oai, ask, 24, seed=7, presence_penalty=0.5, frequency_penalty=0.25, temperature=0.9,
                      top_p=0.8, extra_body={"top_k": 20, "min_p": 0.05})
    assert client.chat(model="smollm2", messages=ask, options=opts).message.content == \
        want.choices[0].message.content
    assert client.chat(model="smollm2", messages=ask, options={**opts, "seed": 7.0, "top_k": 20.0}).message.content \
        == want.choices[0].message.content       # whole floats, as Go clients send ints
    plain = chat_reply(oai, ask, 24, extra_body={"repeat_penalty": 1.0}).choices[0].message.content
    assert plain != chat_reply(oai, ask, 24).choices[0].message.content     # the default penalty tells
    for off in ({"repeat_penalty": 1.0}, {"repeat_last_n": 0}):
        got = client.chat(model="smollm2", messages=ask, options={**GREEDY, **off, "num_predict": 24})
        assert got.message.content == plain
    word = plain.split()[2]
    cut = client.chat(model="smollm2", messages=ask, options={**GREEDY, "repeat_penalty": 1.0, "num_predict": 24,
                                                              "stop": [word]})
    assert cut.message.content == plain[:plain.index(word)] and cut.done_reason == "stop"


def test_tool_calls_round_trip(client, oai, server):
    """A forced call (tool_choice, edgeinfer's extension) as Ollama's tool_calls with an arguments
    object, plain and streamed; the call and a tool result sent back make the chat route's prompt."""
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    want = chat_reply(oai, ask, 40, tools=TOOLS, tool_choice="required").choices[0].message
    (wanted,) = want.tool_calls
    kw = dict(model="smollm2", messages=ask, tools=TOOLS, options={**GREEDY, "num_predict": 40})
    st, _, got = request(server.url + "/api/chat", "POST",     # the client sends no tool_choice
                         {**kw, "tool_choice": "required", "stream": False})
    assert st == 200, got
    (call,) = got["message"]["tool_calls"]
    assert (call["function"]["name"], call["function"]["arguments"]) == \
        (wanted.function.name, json.loads(wanted.function.arguments))
    st, _, text = request(server.url + "/api/chat", "POST", {**kw, "tool_choice": "required"})
    streamed = [c for line in text.splitlines() for c in json.loads(line)["message"].get("tool_calls", [])]
    assert streamed == [call]

    result = "Sunny, 24 degrees."
    back = ask + [{"role": "assistant", "content": "", "tool_calls": [{"function": call["function"]}]},
                  {"role": "tool", "tool_name": "get_weather", "content": result}]
    answer = client.chat(model="smollm2", messages=back, tools=TOOLS, options={**GREEDY, "num_predict": 20})
    chat_back = ask + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1_0", "type": "function",
         "function": {"name": "get_weather", "arguments": json.dumps(call["function"]["arguments"])}}]},
        {"role": "tool", "name": "get_weather", "content": result}]
    want = chat_reply(oai, chat_back, 20, tools=TOOLS)
    assert answer.prompt_eval_count == want.usage.prompt_tokens


def test_a_call_num_predict_cuts_is_text(server, oai):
    """A forced call cut by num_predict has no arguments object: the content is the arguments
    the chat route gives, plain and streamed."""
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    (call,) = chat_reply(oai, ask, 20, tools=TOOLS, tool_choice="required").choices[0].message.tool_calls
    body = {"model": "smollm2", "messages": ask, "tools": TOOLS, "tool_choice": "required",
            "options": {**GREEDY, "num_predict": 20}}
    st, _, got = request(server.url + "/api/chat", "POST", {**body, "stream": False})
    assert st == 200 and got["done_reason"] == "length" and "tool_calls" not in got["message"], got
    assert got["message"]["content"] == call.function.arguments
    st, _, text = request(server.url + "/api/chat", "POST", body)
    lines = [json.loads(x) for x in text.splitlines()]
    assert "".join(x["message"]["content"] for x in lines) == got["message"]["content"] and lines[-1]["done"]


def test_format_json_schema_is_followed(client, oai):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    ask = [{"role": "user", "content": "Describe a person as JSON."}]
    want = chat_reply(oai, ask, 60, response_format={"type": "json_schema", "json_schema": {
        "name": "format", "schema": schema}}).choices[0].message.content
    got = client.chat(model="smollm2", messages=ask, format=schema, options={**GREEDY, "num_predict": 60})
    jsonschema.validate(json.loads(got.message.content), schema)
    assert got.message.content == want
    loose = client.generate(model="smollm2", prompt="A person as JSON:", format="json",
                            options={**GREEDY, "num_predict": 200})
    assert loose.done_reason == "stop" and isinstance(json.loads(loose.response), dict)


def test_logprobs_are_the_chat_routes(client, oai):
    want = chat_reply(oai, TURNS, 6, logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    got = client.chat(model="smollm2", messages=TURNS, logprobs=True, top_logprobs=3,
                      options={**GREEDY, "num_predict": 6})
    assert [(lp.token, lp.logprob, [(t.token, t.logprob) for t in lp.top_logprobs]) for lp in got.logprobs] == \
        [(lp.token, lp.logprob, [(t.token, t.logprob) for t in lp.top_logprobs])
         for lp in want.choices[0].logprobs.content][:len(got.logprobs)]
    assert len(got.logprobs) == got.eval_count


def test_embeddings_are_the_embeddings_routes(client, oai, server):
    """/api/embed and /api/embeddings give /v1/embeddings' unit vectors; an input longer than the
    context is cut to it, or refused with truncate false."""
    texts = ["Hello world", "Water boils at 100 degrees."]
    want = [d.embedding for d in oai.embeddings.create(model="smollm2", input=texts).data]
    got = client.embed(model="smollm2", input=texts)
    assert got.embeddings == want and got.prompt_eval_count > 0
    assert list(client.embeddings(model="smollm2", prompt=texts[0]).embedding) == want[0]
    long = "word " * 700
    cut = client.embed(model="smollm2", input=long).embeddings[0]
    ids = request(server.url + "/tokenize", "POST", {"content": long})[2]["tokens"][:512]
    assert cut == oai.embeddings.create(model="smollm2", input=ids).data[0].embedding
    assert list(client.embeddings(model="smollm2", prompt=long).embedding) == cut   # the older route cuts too
    st, _, body = request(server.url + "/api/embed", "POST", {"model": "smollm2", "input": long, "truncate": False})
    assert st == 400 and set(body) == {"error"}
    short = client.embed(model="smollm2", input=texts[0], dimensions=64).embeddings[0]
    head = np.asarray(want[0][:64])
    assert np.allclose(short, head / np.linalg.norm(head), atol=1e-6)


def test_models_are_described_from_the_file(client, server, smollm2_path):
    """/api/tags, /api/ps and /api/show against the `gguf` package's reading of the file."""
    reader = gguf.GGUFReader(smollm2_path)
    fields = {name: f.contents() for name, f in reader.fields.items()}
    n_params = sum(int(t.n_elements) for t in reader.tensors)
    (listed,) = client.list().models
    assert (listed.model, listed.size) == ("smollm2:latest", smollm2_path.stat().st_size)   # Ollama's tag
    assert listed.details.family == fields["general.architecture"]
    assert listed.details.quantization_level == gguf.LlamaFileType(fields["general.file_type"]).name[len("MOSTLY_"):]
    assert listed.details.parameter_size == f"{n_params / 1e6:.0f}M"
    (running,) = client.ps().models
    assert running.context_length == 512 and running.digest == listed.digest
    shown = client.show("smollm2")
    assert shown.template == fields["tokenizer.chat_template"]
    assert {k: v for k, v in shown.modelinfo.items() if v is not None} == \
        {**{k: v for k, v in fields.items() if not (isinstance(v, list) and len(v) > 5) and not k.startswith("GGUF.")},
         "general.parameter_count": n_params}
    verbose = request(server.url + "/api/show", "POST", {"model": "smollm2", "verbose": True})[2]["model_info"]
    assert verbose["tokenizer.ggml.tokens"] == fields["tokenizer.ggml.tokens"]
    assert shown.capabilities == ["completion", "tools"] and shown.details == listed.details
    assert request(server.url + "/api/version")[2]["edgeinfer"] == edgeinfer.__version__
    assert request(server.url + "/")[2] == "Ollama is running"


def test_a_request_without_messages_or_prompt_loads_the_model(client, server):
    got = client.chat(model="smollm2", messages=[])
    assert (got.done, got.done_reason, got.message.content) == (True, "load", "")
    assert client.generate(model="smollm2").done_reason == "load"
    assert client.generate(model="smollm2", keep_alive=0).done_reason == "unload"
    assert client.generate(model="smollm2", keep_alive="0s").done_reason == "unload"
    assert client.embed(model="smollm2", input=[]).embeddings == []
    for path, body in (("/api/chat", {"messages": None, "stream": None}),
                       ("/api/generate", {"prompt": None, "raw": None, "stream": None})):
        st, _, got = request(server.url + path, "POST", {"model": "smollm2", **body})   # null: Ollama's default
        assert st == 200 and got["done_reason"] == "load", got


def test_num_predict_is_a_bound_and_the_oldest_turns_give_way(client, oai, server):
    """Ollama's way with the context: num_predict past the room left ends at the context's end
    (not a 400); a conversation longer than the context loses its oldest exchanges after the
    system prompt (the chat route's prompt of the longest suffix from a user turn that fits),
    unless truncate is false."""
    prompt = "word " * 500
    n = len(request(server.url + "/tokenize", "POST", {"content": prompt})[2]["tokens"])
    got = client.generate(model="smollm2", prompt=prompt, raw=True, options={**GREEDY, "num_predict": 4000})
    assert (got.prompt_eval_count, got.eval_count, got.done_reason) == (n, 512 - n, "length")

    turns = [{"role": "system", "content": SYSTEM}] + [
        {"role": r, "content": f"Message {i}: " + "the quick brown fox jumps over the lazy dog " * 3}
        for i, r in zip(range(24), ["user", "assistant"] * 12)] + [TURNS[0]]
    got = client.chat(model="smollm2", messages=turns, options={**GREEDY, "num_predict": 4})
    for k in [i for i in range(1, len(turns)) if turns[i]["role"] == "user"]:   # whole exchanges give way:
        try:                                # the chat route's longest suffix from a user turn that fits
            want = chat_reply(oai, turns[:1] + turns[k:], 4)
            break
        except openai.BadRequestError:
            continue
    assert k > 1 and got.prompt_eval_count == want.usage.prompt_tokens
    assert got.message.content == want.choices[0].message.content
    st, _, body = request(server.url + "/api/chat", "POST", {"model": "smollm2", "messages": turns,
                                                             "truncate": False, "stream": False})
    assert st == 400 and set(body) == {"error"}


@pytest.mark.parametrize("path, body, status", [
    ("/api/chat", {"model": "no-such-model", "messages": TURNS}, 404),
    ("/api/chat", {"messages": TURNS}, 400),
    ("/api/chat", {"model": "smollm2", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, 400),
    ("/api/chat", {"model": "smollm2", "messages": TURNS, "options": {"mirostat": 2}}, 400),
    ("/api/chat", {"model": "smollm2", "messages": TURNS, "options": {"seed": 1.5}}, 400),
    ("/api/chat", {"model": "smollm2", "messages": TURNS, "think": True}, 400),     # no thinking block
    ("/api/generate", {"model": "smollm2", "prompt": "x", "raw": True, "system": "y"}, 400),
    ("/api/chat", {"model": "smollm2", "messages": TURNS, "options": {"temperature": "hot"}}, 400),
    ("/api/chat", {"model": "smollm2", "messages": TURNS, "top_logprobs": 2}, 400),
    ("/api/chat", {"model": "smollm2", "messages": TURNS, "format": {"type": "bogus"}}, 400),
    ("/api/generate", {"model": "smollm2", "prompt": "x", "suffix": "y"}, 400),
    ("/api/generate", {"model": "smollm2", "prompt": "x", "template": "{{ .Prompt }}"}, 400),
    ("/api/generate", {"model": "smollm2", "prompt": "x", "context": [1, 2]}, 400),
    ("/api/generate", {"model": "smollm2", "prompt": "word " * 600}, 400),
    ("/api/show", {"model": "no-such-model"}, 404),
    ("/api/embed", {"model": "smollm2", "input": "x", "dimensions": 4096}, 400),
    ("/api/pull", {"model": "smollm2"}, 404),     # model management is not served
])
def test_bad_input_is_a_4xx_in_ollamas_error_shape(server, path, body, status):
    st, _, got = request(server.url + path, "POST", {"stream": False, **body})
    assert st == status and set(got) == {"error"} and isinstance(got["error"], str), got
    assert "max_tokens" not in got["error"] and "response_format" not in got["error"]     # Ollama's names


def test_litellms_ollama_providers_work_unchanged(server, oai):
    """An app's view: LiteLLM's `ollama_chat` provider (its own Ollama client) gets the chat
    route's greedy text, plain and streamed, and its `ollama` embeddings the embeddings route's."""
    litellm = require("litellm", "LiteLLM's Ollama providers are an app's client")
    want = chat_reply(oai, TURNS, 12)
    kw = dict(model="ollama_chat/smollm2", api_base=server.url, messages=TURNS, temperature=0, max_tokens=12)
    got = litellm.completion(**kw)
    assert (got.choices[0].message.content, got.usage.prompt_tokens, got.usage.completion_tokens) == \
        (want.choices[0].message.content, want.usage.prompt_tokens, want.usage.completion_tokens)
    assert "".join(c.choices[0].delta.content or "" for c in litellm.completion(**kw, stream=True)) == \
        want.choices[0].message.content
    vector = litellm.embedding(model="ollama/smollm2", api_base=server.url, input=["Hello world"]).data[0]["embedding"]
    assert vector == oai.embeddings.create(model="smollm2", input="Hello world").data[0].embedding


def test_a_failing_stream_event_ends_the_stream_with_an_error_line(server, monkeypatch):
    """A bug while a reply streams (here: cutting the reply into parts fails) ends the stream with
    Ollama's error line, not a second HTTP reply written into the body."""
    from edgeinfer.server import ollama as route

    def broken(*a, **kw):
        raise RuntimeError("injected")
    monkeypatch.setattr(route, "_split", broken)
    st, hdrs, body = request(server.url + "/api/generate", "POST", {"model": "smollm2", "prompt": "Hi"})
    assert st == 200 and hdrs["Content-Type"].startswith("application/x-ndjson")
    assert body == {"error": "generation failed: RuntimeError: injected"}     # the one line: the first event failed


def test_the_client_raises_its_error_with_the_reason(client):
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="smollm2", messages=TURNS, options={"mirostat": 2})
    assert e.value.status_code == 400 and "mirostat" in e.value.error
