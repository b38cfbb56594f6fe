"""Structured output and tool calling (issue 15): grammar specs, the constrained sequence in
continuous batching, logit_bias, OpenAI's response_format / tools through a real server.
Oracles: jsonschema validates the outputs, the openai client parses the replies."""
from __future__ import annotations

import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from tests.support.strict import require

import edgeinfer
from edgeinfer.engine import constraint as C
from edgeinfer.engine.tool_calls import ToolError, plan_tools
from edgeinfer.server import ServerThread

jsonschema = require("jsonschema", "jsonschema validates the constrained outputs")

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "maxLength": 24},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "metric"],
                   "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                                  "metric": {"type": "boolean"}}}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "The time now in a timezone",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["tz"],
                   "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}}}}}


@pytest.fixture(scope="module")
def engine(smollm2_path):
    eng = edgeinfer.load(smollm2_path, n_ctx=512, n_threads=2, n_slots=4)
    yield eng
    eng.close()


# --------------------------------------------------------------------------- specs

def test_bad_constraints_are_typed_errors():
    cases = [dict(json_schema="{not json"), dict(json_schema=[1]), dict(regex="("),
             dict(grammar="start: undefined_rule"), dict(grammar="root ::= (\"a\""),
             dict(response_format={"type": "xml"}), dict(response_format={"type": "json_schema"}),
             dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
             dict(json_schema={"type": "objekt"}), dict(regex="a", json_schema={"type": "object"})]
    for kw in cases:
        with pytest.raises(C.ConstraintError):
            C.grammar_spec(**kw)
    assert C.grammar_spec() is None and C.grammar_spec(response_format={"type": "text"}) is None
    for bias in [{"70000": 1}, {"-1": 1}, {"x": 1}, {"5": 101}, {"5": "1"}, {"5": True}, [1]]:
        with pytest.raises(edgeinfer.errors.SamplingParamsError):
            C.check_logit_bias(bias, 49152)
    assert C.check_logit_bias({"5": -100, 7: 2.5}, 49152) == {5: -100.0, 7: 2.5}
    from edgeinfer.engine.sampling import SamplingParams
    p = SamplingParams(grammar=C.grammar_spec(regex="a+"), logit_bias={"3": 2})
    assert SamplingParams.from_dict(p.to_dict()) == p and p.logit_bias == {3: 2.0}
    with pytest.raises(edgeinfer.errors.SamplingParamsError):
        SamplingParams(grammar="a+")


def _follows_schema(schema):
    def check(text: str) -> bool:
        try:
            jsonschema.validate(json.loads(text), schema)
        except (ValueError, jsonschema.ValidationError):
            return False
        return True
    return check


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _full_match(pattern: str):
    return lambda text: re.fullmatch(pattern, text) is not None


# (constraint, the check of its output, a text the check must refuse)
GRAMMAR_CHECKS = [
    (dict(json_schema=PERSON), _follows_schema(PERSON), '{"name": "Ann", "age": 30, "city": "Lima"}'),
    (dict(response_format={"type": "json_object"}), _is_json_object, '["a JSON array"]'),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}),
     _follows_schema(PERSON), '{"name": "Ann", "age": 300, "city": "Rome"}'),
    (dict(regex=r"[0-9]{4}-[0-9]{2}-[0-9]{2}"), _full_match(r"[0-9]{4}-[0-9]{2}-[0-9]{2}"), "2024-1-05"),
    (dict(grammar='root ::= "yes" | "no"'), lambda t: t in ("yes", "no"), "maybe"),
    (dict(grammar='start: "The answer is " NUM "."\nNUM: /[0-9]+/'),
     _full_match(r"The answer is [0-9]+\."), "The answer is 42"),
]


def test_grammar_checks_refuse_what_breaks_the_grammar():
    """Each check below returns False (never None or an exception) on a text outside its
    grammar, so `assert check(text)` fails when the constraint is not applied."""
    for kw, check, bad in GRAMMAR_CHECKS:
        assert check(bad) is False, (kw, bad)


def test_constrained_outputs_follow_their_grammar(engine):
    msgs = [{"role": "user", "content": "Tell me about a person: name, age and city."}]
    for kw, check, _ in GRAMMAR_CHECKS:
        # free-form JSON strings may run past max_tokens when sampled: json_object greedy (on the
        # person prompt, which the scalar and AVX2 kernels both close; "Describe a cat as a JSON
        # object." loops on repeated keys past 120 tokens there)
        for t, seed in ([(0.0, 0)] if "response_format" in kw and "json_schema" not in kw["response_format"]
                        else [(0.7, 1), (0.7, 2)]):
            out = engine.chat(msgs, temperature=t, seed=seed, max_tokens=120, **kw)
            assert out.finish_reason == "stop", (kw, out.text)
            assert check(out.text), (kw, out.text)


def test_masks_are_computed_on_the_worker_thread(engine, monkeypatch):
    """The step starts every constrained sequence's mask before the forward, on the mask
    thread: the sampling side never has to compute one itself."""
    where = []
    orig = C.Constraint.fill_mask

    def spy(self):
        where.append(threading.current_thread().name)
        return orig(self)

    monkeypatch.setattr(C.Constraint, "fill_mask", spy)
    out = engine.generate("A person:", json_schema=PERSON, temperature=0, max_tokens=40)
    assert out.finish_reason == "stop" and len(where) == len(out.tokens)
    assert where and all(n.startswith("edgeinfer-mask") for n in where), set(where)


def _fake_scheduler(max_topk=0):
    from tests.support import fake_backend as fb
    from edgeinfer.backends.base import KVPlan
    from edgeinfer.engine.kv import KVRing
    from edgeinfer.engine.runner import Runner
    from edgeinfer.engine.scheduler import Scheduler
    rt = fb.FakeBackend(max_topk).create_runtime(None, None, KVPlan(2, 64, 0, 8))
    return Scheduler(Runner(rt), KVRing(2, 64, n_sink=0), fb.tokenizer()), rt


def test_mask_is_computed_while_the_forward_runs():
    """With the forward held inside the (fake) native call, the step's mask gets computed:
    it does not wait for the logits."""
    from edgeinfer.engine.generation import Generation
    from edgeinfer.engine.sampling import SamplingParams
    sched, rt = _fake_scheduler()
    filled = threading.Event()
    orig = C.Constraint.fill_mask

    def spy(self):
        orig(self)
        filled.set()

    try:
        C.Constraint.fill_mask = spy
        rt.gate.clear()
        params = SamplingParams(temperature=0.0, max_tokens=8, grammar=C.grammar_spec(regex="(ab)+c"))
        gen = Generation(sched, [5, 6, 7], params)
        assert rt.entered.acquire(timeout=30)          # the forward is in flight ...
        assert filled.wait(timeout=30)                 # ... and the mask is done meanwhile
        assert not rt.batches                          # (the forward has not returned)
        rt.gate.set()
        out = gen.result()
    finally:
        C.Constraint.fill_mask = orig
        rt.gate.set()
        sched.close()
    assert re.fullmatch(r"(ab)+c", sched.tokenizer.decode(out.tokens)) and out.finish_reason == "stop"


def test_constrained_sequences_skip_the_device_top_k():
    """The device top-k cannot see a mask or a bias: such sequences get whole rows."""
    from tests.support import fake_backend as fb
    from edgeinfer.engine.generation import Generation
    from edgeinfer.engine.sampling import SamplingParams
    sched, rt = _fake_scheduler(max_topk=8)
    try:
        free = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        assert Generation(sched, [5, 6, 7], free).result().tokens == fb.reference_greedy([5, 6, 7], 6)
        n = len(rt.topk_calls)
        assert n > 0
        spec = C.grammar_spec(regex="(ab)+c")
        out = Generation(sched, [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=8, grammar=spec)).result()
        assert re.fullmatch(r"(ab)+c", sched.tokenizer.decode(out.tokens))
        top = fb.reference_greedy([5, 6, 7], 1)[0]
        biased = Generation(sched, [5, 6, 7], free.replace(logit_bias={top: -100})).result()
        assert biased.tokens[0] != top and len(rt.topk_calls) == n
    finally:
        sched.close()


def test_constrained_and_free_batched_match_alone(engine):
    """Greedy: each request gives in a batch of constrained and free neighbours exactly
    what it gives alone."""
    reqs = [("Describe a person.", dict(json_schema=PERSON)), ("The capital of France is", {}),
            ("Pick yes or no: is water wet?", dict(grammar='root ::= "yes" | "no"')),
            ("Once upon a time,", dict(logit_bias={"11": -100, "30": 5}))]
    alone = [engine.generate(p, temperature=0, max_tokens=40, **kw) for p, kw in reqs]
    for _ in range(2):
        gens = [engine.stream(p, temperature=0, max_tokens=40, **kw) for p, kw in reqs]
        together = [g.result() for g in gens]
        for a, b in zip(alone, together):
            assert (a.tokens, a.finish_reason) == (b.tokens, b.finish_reason)


def test_logit_bias(engine):
    free = engine.generate("The capital of France is", temperature=0, max_tokens=6)
    first = free.tokens[0]
    banned = engine.generate("The capital of France is", temperature=0, max_tokens=6,
                             logit_bias={str(first): -100})
    assert banned.tokens[0] != first
    forced = engine.generate("The capital of France is", temperature=0, max_tokens=6, logit_bias={"28": 100})
    assert forced.tokens == [28] * 6
    with pytest.raises(edgeinfer.errors.SamplingParamsError):
        engine.generate("x", logit_bias={"49152": 1})


def test_logit_bias_through_the_server(client, engine):
    r = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=6,
                                  temperature=0, logit_bias={"28": 100})
    assert r.choices[0].text == engine.detokenize([28] * 6)


def test_open_schemas_end_as_llama_cpp_grammars_do(engine):
    """A schema that lists properties without `additionalProperties`, or leaves an integer
    unbounded, still ends (SmolLM2 otherwise writes extra keys / digits until max_tokens):
    objects are closed and integers get at most 16 digits; outputs validate as given."""
    open_schema = {"type": "object", "required": ["name", "country", "population"],
                   "properties": {"name": {"type": "string", "maxLength": 30},
                                  "country": {"type": "string", "maxLength": 30},
                                  "population": {"type": "integer"}}}
    msgs = [{"role": "user", "content": "Tell me about Paris"}]
    for t, seed in [(0.0, 0), (1.0, 1), (1.0, 2)]:
        out = engine.chat(msgs, json_schema=open_schema, temperature=t, seed=seed, max_tokens=80)
        assert out.finish_reason == "stop", out.text
        value = json.loads(out.text)
        jsonschema.validate(value, open_schema)
        assert set(value) == {"name", "country", "population"} and abs(value["population"]) < 10**16
    tight = C.tight_schema({"type": "object", "properties": {"a": {"type": ["integer", "null"], "minimum": 0},
                                                              "b": {"type": "object"}},
                            "$defs": {"n": {"type": "number", "exclusiveMaximum": 1}},
                            "anyOf": [{"properties": {"c": {"const": {"type": "integer"}}}}]})
    assert tight["additionalProperties"] is False and tight["properties"]["a"] == {
        "type": ["integer", "null"], "minimum": 0, "maximum": 10**16 - 1}
    assert tight["properties"]["b"] == {"type": "object"}                  # json_object stays open
    assert tight["$defs"]["n"] == {"type": "number", "exclusiveMaximum": 1, "minimum": -(10**16 - 1)}
    assert tight["anyOf"][0]["properties"]["c"] == {"const": {"type": "integer"}}   # a value, not a schema
    assert "additionalProperties" not in C.tight_schema(
        {"type": "object", "properties": {"a": {}}, "required": ["a", "b"]})   # b may only be extra


# --------------------------------------------------------------------------- tools (engine)

def test_tool_plan_formats():
    msgs = [{"role": "user", "content": "Weather in Rome?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Rome", "metric": true}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}]
    generic = plan_tools("{{ messages }}", msgs, [WEATHER, CLOCK], "auto")
    assert generic.fmt == "generic" and generic.spec is None
    assert "get_time" in generic.messages[0]["content"] and generic.messages[0]["role"] == "system"
    assert json.loads(generic.messages[2]["content"]) == {
        "tool_call": {"name": "get_weather", "arguments": {"city": "Rome", "metric": True}}}
    assert generic.messages[3] == {"role": "user", "content": "get_weather returned: 21 C"}
    call = generic.parse('{"tool_call": {"name": "get_time", "arguments": {"tz": "UTC"}}}')
    assert call[0]["function"] == {"name": "get_time", "arguments": '{"tz": "UTC"}'}
    assert call[0]["id"].startswith("call_") and call[0]["type"] == "function"
    assert generic.parse("It is sunny.") is None and generic.parse('{"tool_call": {"name": "nope"}}') is None
    hermes = plan_tools("{% for t in tools %}<tool_call>{% endfor %}", msgs, [WEATHER], "required")
    assert hermes.fmt == "hermes" and hermes.render_extra["tools"][0]["function"]["name"] == "get_weather"
    assert hermes.messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Rome", "metric": True}
    calls = hermes.parse('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "metric": false}}\n'
                         '</tool_call>')
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo", "metric": False}
    assert hermes.spec.kind == "tool_call"   # its markers: special tokens where the vocabulary has them
    none = plan_tools("{{ tools }}", msgs, [WEATHER], "none")
    assert none.render_extra == {} and none.parse('{"name": "get_weather", "arguments": {}}') is None
    for tools, choice in [([], None), ([{"type": "function", "function": {"name": "a b"}}], None),
                          ([WEATHER, WEATHER], None), ([WEATHER], "sometimes"),
                          ([WEATHER], {"type": "function", "function": {"name": "get_time"}})]:
        with pytest.raises(ToolError):
            plan_tools("", msgs, tools, choice)


def test_call_streamer_streams_the_arguments():
    from edgeinfer.engine.tool_calls import CallStreamer
    args = '{"city": "Rome", "metric": true}'
    for fmt, text in [("generic", '{"tool_call": {"name": "get_weather", "arguments": ' + args + '}}'),
                      ("json", '{"name": "get_weather", "arguments": ' + args + '}'),
                      ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": ' + args + '}\n</tool_call>')]:
        st = CallStreamer(fmt)
        pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
        deltas = [st.feed(p) for p in pieces[:-1]] + [st.feed(pieces[-1], final=True)]
        flat = [d for ds in deltas for d in ds]
        assert flat[0]["function"] == {"name": "get_weather", "arguments": ""} and flat[0]["id"].startswith("call_")
        assert "".join(d["function"]["arguments"] for d in flat[1:]) == args, fmt
        assert sum(1 for ds in deltas[:-1] for d in ds if "id" not in d) > 3    # fragments as they came


def test_stream_chat_with_tools(engine):
    """Engine.stream_chat takes tools as chat does: the streamed text is the call's, and once
    it ends tool_calls and finish_reason are chat's."""
    msgs = [{"role": "user", "content": "What is the weather in Oslo?"}]
    kw = dict(tools=[WEATHER, CLOCK], tool_choice="required", temperature=0, max_tokens=80)
    gen = engine.stream_chat(msgs, **kw)
    assert gen.tool_calls is None
    text = "".join(gen)
    plain = engine.chat(msgs, **kw)
    assert text == plain.text and gen.finish_reason == plain.finish_reason == "tool_calls"
    assert [c["function"] for c in gen.tool_calls] == [c["function"] for c in plain.tool_calls]


def test_a_forced_call_cut_by_max_tokens_keeps_its_partial_arguments(client):
    """As OpenAI: tool_calls with the arguments so far and finish_reason "length", plain and
    streamed alike."""
    kw = dict(model="smollm2", messages=[{"role": "user", "content": "Weather in Rome?"}],
              tools=[WEATHER], tool_choice="required", max_tokens=22, temperature=0)
    plain = client.chat.completions.create(**kw).choices[0]
    assert plain.finish_reason == "length" and plain.message.content is None
    args = plain.message.tool_calls[0].function.arguments
    assert plain.message.tool_calls[0].function.name == "get_weather" and args.startswith('{"city": ')
    chunks = [c for c in client.chat.completions.create(stream=True, **kw) if c.choices]
    streamed = "".join(d.function.arguments or "" for c in chunks for d in c.choices[0].delta.tool_calls or [])
    assert streamed == args and chunks[-1].choices[0].finish_reason == "length"


def test_engine_chat_calls_a_function_on_smollm2(engine):
    """SmolLM2's template has no tools: the generic JSON format; a forced call always parses."""
    msgs = [{"role": "user", "content": "What is the weather in Oslo?"}]
    for choice, name in [("required", None), ({"type": "function", "function": {"name": "get_time"}}, "get_time")]:
        out = engine.chat(msgs, tools=[WEATHER, CLOCK], tool_choice=choice, temperature=0.7, seed=3,
                          max_tokens=80)
        assert out.finish_reason == "tool_calls" and len(out.tool_calls) == 1, out.text
        f = out.tool_calls[0]["function"]
        tool = {"get_weather": WEATHER, "get_time": CLOCK}[f["name"]]
        jsonschema.validate(json.loads(f["arguments"]), tool["function"]["parameters"])
        assert name is None or f["name"] == name


# --------------------------------------------------------------------------- the server

@pytest.fixture(scope="module")
def client(engine):
    openai = require("openai", "the openai client is the server's oracle")
    srv = ServerThread(engine, model_name="smollm2").start()
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    srv.stop(timeout_s=5)


@pytest.mark.slow
def test_openai_parse_with_a_pydantic_model(client):
    pydantic = require("pydantic")

    class Person(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=24)
        age: int
        city: str

    subjects = ["a baker", "a pilot", "a painter", "a nurse", "a farmer"] * 10

    def ask(i):
        r = client.chat.completions.parse(
            model="smollm2", messages=[{"role": "user", "content": f"Invent {subjects[i]}: name, age, city."}],
            response_format=Person, max_tokens=60, temperature=0.8, seed=i)
        return r.choices[0].message.parsed

    with ThreadPoolExecutor(4) as ex:
        parsed = list(ex.map(ask, range(50)))
    assert all(isinstance(p, Person) for p in parsed)


@pytest.mark.slow
def test_json_schema_outputs_validate(client):
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}

    def ask(i):
        r = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "A person as JSON, please."}],
            response_format=rf, max_tokens=60, temperature=1.0, seed=i)
        return r.choices[0]

    with ThreadPoolExecutor(4) as ex:
        choices = list(ex.map(ask, range(100)))
    for c in choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.message.content), PERSON)
    assert len({c.message.content for c in choices}) > 10      # sampled, not one answer


def test_streamed_forced_call_on_smollm2(client):
    kw = dict(model="smollm2", messages=[{"role": "user", "content": "Weather in Rome, in metric?"}],
              tools=[WEATHER, CLOCK], tool_choice="required", max_tokens=80, temperature=0)
    plain = client.chat.completions.create(**kw).choices[0]
    chunks = [c for c in client.chat.completions.create(stream=True, **kw) if c.choices]
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or []]
    assert deltas[0].id.startswith("call_") and deltas[0].function.name == plain.message.tool_calls[0].function.name
    args = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(args) == json.loads(plain.message.tool_calls[0].function.arguments)
    assert len(deltas) > 2 and chunks[-1].choices[0].finish_reason == "tool_calls"
    assert all(c.choices[0].delta.content is None for c in chunks)      # no content, as OpenAI's
    assert plain.finish_reason == "tool_calls" and plain.message.content is None


def test_every_choice_follows_the_schema_and_calls(client):
    """n > 1: each sibling sequence holds its own grammar state."""
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    msgs = [{"role": "user", "content": "A person as JSON."}]
    r = client.chat.completions.create(model="smollm2", messages=msgs, response_format=rf, n=3,
                                       max_tokens=60, temperature=1.0, seed=5)
    assert len(r.choices) == 3
    for c in r.choices:
        jsonschema.validate(json.loads(c.message.content), PERSON)
    r = client.chat.completions.create(model="smollm2", messages=msgs, tools=[WEATHER], tool_choice="required",
                                       n=2, max_tokens=60, temperature=1.0, seed=5)
    for c in r.choices:
        assert c.finish_reason == "tool_calls"
        jsonschema.validate(json.loads(c.message.tool_calls[0].function.arguments), WEATHER["function"]["parameters"])


def test_server_rejects_bad_structured_requests(client):
    import openai
    msgs = [{"role": "user", "content": "hi"}]
    cases = [(dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}),
              "response_format"),
             (dict(response_format={"type": "xml"}), "response_format.type"),
             (dict(logit_bias={"49152": 1}), "logit_bias"), (dict(logit_bias={"1": 500}), "logit_bias"),
             (dict(tools=[{"type": "function", "function": {"name": "a b"}}]), "tools"),
             (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
             (dict(tools=[WEATHER], tool_choice={"type": "function"}), "tool_choice"),
             (dict(tool_choice="required"), "tool_choice"),
             (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}],
                   tool_choice="required"), "tools"),
             (dict(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"}),
              "response_format"),
             (dict(tools=[WEATHER], messages=msgs + [{"role": "assistant", "tool_calls": [
                 {"id": "1", "type": "function", "function": "get_weather"}]}]), "messages[1].tool_calls[0].function")]
    for kw, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(**{"model": "smollm2", "messages": msgs, "max_tokens": 4, **kw})
        assert e.value.body["param"] == param, (kw, e.value.body)
    # a stop string does not cut a forced call: the grammar ends it
    r = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Weather in Rome?"}],
                                       tools=[WEATHER], tool_choice="required", stop=["e", '"'], max_tokens=60,
                                       temperature=0)
    assert r.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(r.choices[0].message.tool_calls[0].function.arguments),
                        WEATHER["function"]["parameters"])
    r = client.completions.create(model="smollm2", prompt="Answer yes or no:", max_tokens=20, temperature=0,
                                  extra_body={"response_format": {"type": "json_schema", "json_schema": {
                                      "name": "a", "schema": {"type": "object", "required": ["a"],
                                                              "additionalProperties": False,
                                                              "properties": {"a": {"type": "boolean"}}}}}})
    assert json.loads(r.choices[0].text)["a"] in (True, False) and r.choices[0].finish_reason == "stop"


def test_llama_cpp_grammar_fields(client):
    """llama.cpp's server extensions `json_schema` and `grammar` (GBNF or Lark), on chat and
    completions; one constraint per request (400 otherwise, as for a bad grammar)."""
    import openai
    msgs = [{"role": "user", "content": "Is water wet?"}]
    r = client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=40, temperature=0,
                                       extra_body={"json_schema": PERSON})
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    for g in ['root ::= "yes" | "no"', 'start: "yes" | "no"']:
        r = client.completions.create(model="smollm2", prompt="Is water wet? Answer:", max_tokens=5,
                                      temperature=0.8, seed=1, extra_body={"grammar": g})
        assert r.choices[0].text in ("yes", "no") and r.choices[0].finish_reason == "stop"
    for extra, param in [({"grammar": "root ::= ("}, "grammar"),
                         ({"json_schema": {"type": "object"}, "grammar": 'root ::= "a"'}, None),
                         ({"json_schema": PERSON, "tools": [WEATHER], "tool_choice": "required"}, "json_schema")]:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=4, extra_body=extra)
        assert e.value.body["param"] == param, (extra, e.value.body)


HERMES = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}You may call functions:
<tools>
{% for t in tools %}{{ t.function | tojson }}
{% endfor %}</tools>
Call one as <tool_call>
{"name": <name>, "arguments": <args>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'system' %}{% elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{% for c in m.tool_calls %}<tool_call>
{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}
</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


@pytest.fixture(scope="module")
def tools_model(tmp_path_factory):
    """A tiny random-weight Qwen2 converted with a template that takes tools (Hermes calls)."""
    require("torch", "the tiny checkpoint is built with torch")
    from tests.support import tiny_checkpoints
    from edgeinfer.convert.converter import convert_checkpoint
    root = tmp_path_factory.mktemp("tools_ckpt")
    d = tiny_checkpoints.build("qwen2", root / "qwen2")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": HERMES}))
    out = root / "tools.f16.gguf"
    convert_checkpoint(str(d), str(out), "f16")
    return out


def test_tool_calls_round_trip_on_a_tools_template(tools_model):
    openai = require("openai", "the openai client is the server's oracle")
    eng = edgeinfer.load(tools_model, n_ctx=1024, n_threads=2, n_slots=2)
    assert "<tool_call>" in eng.apply_chat_template([{"role": "user", "content": "x"}], tools=[WEATHER])
    srv = ServerThread(eng, model_name="tiny").start()
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        tools = [WEATHER, CLOCK]
        for stream in (False, True):
            msgs = [{"role": "user", "content": "Weather in Paris, then the time?"}]
            for turn, choice in enumerate(["required", {"type": "function", "function": {"name": "get_time"}}]):
                kw = dict(model="tiny", messages=msgs, tools=tools, tool_choice=choice, max_tokens=120,
                          temperature=0.9, seed=turn)
                if stream:
                    calls: dict[int, dict] = {}
                    finish = None
                    for ch in client.chat.completions.create(stream=True, **kw):
                        if not ch.choices:
                            continue
                        finish = ch.choices[0].finish_reason or finish
                        for d in ch.choices[0].delta.tool_calls or []:
                            c = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                            c["id"] = d.id or c["id"]
                            c["name"] = (d.function.name if d.function else None) or c["name"]
                            c["arguments"] += (d.function.arguments or "") if d.function else ""
                    assert finish == "tool_calls" and len(calls) == 1
                    call = {"id": calls[0]["id"], "type": "function",
                            "function": {"name": calls[0]["name"], "arguments": calls[0]["arguments"]}}
                else:
                    r = client.chat.completions.create(**kw)
                    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
                    assert len(r.choices[0].message.tool_calls) == 1
                    call = r.choices[0].message.tool_calls[0].model_dump()
                f = call["function"]
                assert call["id"].startswith("call_")
                assert turn == 0 or f["name"] == "get_time"
                params = {"get_weather": WEATHER, "get_time": CLOCK}[f["name"]]["function"]["parameters"]
                jsonschema.validate(json.loads(f["arguments"]), params)
                msgs = msgs + [{"role": "assistant", "content": None, "tool_calls": [call]},
                               {"role": "tool", "tool_call_id": call["id"], "content": "ok: 21 C"}]
            # the conversation so far renders through the template, calls and results included
            text = eng.apply_chat_template(
                eng.tool_plan(msgs, tools, "auto").messages, tools=tools)
            assert text.count("<tool_call>") >= 3 and text.count("<tool_response>") == 2
    finally:
        srv.stop(timeout_s=5)
        eng.close()
