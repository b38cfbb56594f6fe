"""Forced tool calls (tool_choice "required" or a named function) in the formats whose call
markers are special tokens: Qwen3.5's XML, LFM2's pythonic list, Gemma 4's call:f{...}.

The grammar of a forced call (ToolPlan.spec) writes the family's call syntax with the
markers as the vocabulary's special tokens (GrammarSpec.for_tokenizer), each function's
arguments typed by its JSON Schema. Oracles: the family's real chat template (llama.cpp's
models/templates): the call it writes for an assistant turn is a string of the grammar,
token for token; and jsonschema: through the real server and the official openai client, a
tiny random model's forced reply (plain and streamed, several seeds) is one call of the
asked function whose arguments validate against that function's schema, finish_reason
"tool_calls". The model is a tiny Qwen3 checkpoint carrying each family's template, with the
family's markers added as special tokens (what the chat side needs of a model)."""
from __future__ import annotations

import json

import pytest
from tests.support import tiny_checkpoints
from tests.support.strict import require
from tests.test_family_chat import FAMILIES, TOOLS, render, template

from edgeinfer.engine.constraint import Constraint
from edgeinfer.engine.tool_calls import ToolError, plan_tools
from edgeinfer.server import ServerThread

openai = require("openai", "the openai client is the chat route's oracle")
jsonschema = require("jsonschema", "jsonschema judges the forced calls' arguments")
require("transformers", "the tiny checkpoint is built with transformers")

from edgeinfer.convert import convert_checkpoint  # noqa: E402

# family -> (template, its call markers: special tokens in the family's vocabulary)
MODELS = {
    "qwen35": ("Qwen3.5-4B", ["<tool_call>", "</tool_call>"]),
    "lfm2": ("LFM2.5-8B-A1B", ["<|tool_call_start|>", "<|tool_call_end|>"]),
    "gemma4": ("google-gemma-4-31B-it", ["<|tool_call>", "<tool_call|>", '<|"|>']),
}
OPEN = {"qwen35": "<tool_call>", "lfm2": "<|tool_call_start|>", "gemma4": "<|tool_call>"}

# bounded, so that a random model's greedy reply ends well within max_tokens
BOOK = {"type": "function", "function": {
    "name": "book", "description": "Book a table",
    "parameters": {"type": "object", "required": ["city", "seats", "vip"], "properties": {
        "city": {"type": "string", "maxLength": 6},
        "seats": {"type": "integer", "minimum": 1, "maximum": 12},
        "vip": {"type": "boolean"},
        "slot": {"type": "string", "enum": ["lunch", "dinner", "late night"]},
        "price": {"type": "number", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "maxItems": 2, "items": {"type": "string", "enum": ["quiet", "view"]}},
        "who": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 4},
            "age": {"type": ["integer", "null"], "minimum": 0, "maximum": 120}}}}}}}
PING = {"type": "function", "function": {
    "name": "ping", "description": "Ping a host",
    "parameters": {"type": "object", "required": ["host"], "properties": {
        "host": {"type": "string", "pattern": "^[a-z]{1,5}$"}, "count": {"type": "integer", "minimum": 1, "maximum": 3}}}}}
FORCED = [BOOK, PING]
MSGS = [{"role": "user", "content": "Book a table in Paris for two."}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in FORCED}


def _build(root, family: str, markers: list[str] | None = None):
    """A tiny checkpoint with the family's template and `markers` (default: the family's) as
    special tokens, converted to GGUF."""
    import transformers
    from tokenizers import AddedToken, Tokenizer

    name, family_markers = MODELS[family]
    markers = family_markers if markers is None else markers
    d = tiny_checkpoints.build("qwen3", root / "ckpt")
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(m, special=True) for m in markers])
    tok.save(str(d / "tokenizer.json"))
    model = transformers.AutoModelForCausalLM.from_pretrained(d)
    model.resize_token_embeddings(tok.get_vocab_size())
    model.save_pretrained(d, safe_serialization=True)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": template(name)}))
    out = root / f"{family}.gguf"
    convert_checkpoint(str(d), str(out), "f32")
    return out


@pytest.fixture(scope="module", params=list(MODELS))
def served(request, tmp_path_factory):
    import edgeinfer

    family = request.param
    path = _build(tmp_path_factory.mktemp(f"forced_{family}"), family)
    eng = edgeinfer.load(str(path), n_ctx=4096, n_threads=2, n_slots=2)
    srv = ServerThread(eng, model_name="m").start()
    yield family, eng, srv
    srv.stop(timeout_s=10)
    eng.close()


def _accepts(eng, spec, text: str) -> bool:
    """Whether the grammar takes `text` (its markers read as special tokens) token by token
    and is complete after it."""
    c = Constraint(spec, eng.tokenizer)
    for t in eng.tokenizer.encode(text, add_special=False, parse_special=True):
        if not c.allowed(eng.config.n_vocab)[t] or not c.consume(t):
            return False
    return c.accepting


# the template-written call: the family's exact syntax (LFM2's template writes strings and
# lists of them Python-style, 'x'; the grammar writes JSON's "x", which the model card shows)
TEMPLATE_ARGS = {
    "qwen35": [{"city": "Rome", "days": 3, "metric": True, "ratio": 2.5, "tags": ["a", "b c"],
                "opts": {"x": [1, None]}, "note": "line one\nline \"two\", it's {x}"}, {"city": "Oslo"}],
    "lfm2": [{"city": "Rome"}, {"city": "Rome", "days": 3, "metric": False, "ratio": 2.5, "tags": ["a", "b c"],
              "opts": {"x": [1, None]}}],
    "gemma4": [{"city": "Rome", "days": 3, "metric": True, "ratio": 2.5, "tags": ["a", "b c"],
                "opts": {"x": [1, None], "y": {"z": "w"}}, "note": "it's {x}, \"q\""}, {"city": "Oslo"}],
}


BOOK_ARGS = {"city": "Paris", "seats": 2, "vip": True, "slot": "late night", "tags": ["view"],
             "who": {"name": "Al", "age": None}}


def _template_call(family: str, args: dict, name: str = "get_weather", tools: list = TOOLS) -> str:
    src = template(MODELS[family][0])
    head = [{"role": "user", "content": "Weather?"}]
    turn = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": name, "arguments": args}}]}
    prompt, full = render(src, head, True, tools), render(src, head + [turn], False, tools)
    assert full.startswith(prompt)
    written = full[len(prompt):]
    fmt = plan_tools(src, head, TOOLS).call_format
    i, j = written.index(fmt.open), written.index(fmt.close)
    return written[i:j + len(fmt.close)]


def test_the_template_written_call_is_a_string_of_the_grammar(served):
    family, eng, _ = served
    src = template(MODELS[family][0])
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        spec = plan_tools(src, MSGS, TOOLS, choice).spec
        assert spec is not None and spec.kind == "tool_call"
        for args in TEMPLATE_ARGS[family]:
            call = _template_call(family, args)
            if family == "lfm2":    # its strings between " (they hold no quote)
                call = call.replace("'", '"')
            assert _accepts(eng, spec, call), call
            close = plan_tools(src, MSGS, TOOLS).call_format.close
            assert not _accepts(eng, spec, call[:-len(close)])     # not ended: not yet a call
    # enums, nested objects, a nullable integer, Python's True
    call = _template_call(family, BOOK_ARGS, "book", FORCED)
    call = call.replace("'", '"') if family == "lfm2" else call
    assert _accepts(eng, plan_tools(src, MSGS, FORCED, "required").spec, call), call
    assert not _accepts(eng, plan_tools(src, MSGS, FORCED, "required").spec, call.replace("late night", "brunch"))
    spec = plan_tools(src, MSGS, TOOLS, {"type": "function", "function": {"name": "get_time"}}).spec
    assert not _accepts(eng, spec, _template_call(family, {"city": "Rome"}))   # not the named function
    # the markers are the special tokens: their text spelled in plain tokens is refused
    ids = eng.tokenizer.encode(OPEN[family], add_special=False, parse_special=True)
    assert len(ids) == 1
    c = Constraint(plan_tools(src, MSGS, TOOLS, "required").spec, eng.tokenizer)
    allowed = c.allowed(eng.config.n_vocab)
    assert allowed[ids[0]] and allowed.sum() == 1


@pytest.mark.parametrize("choice", ["required", "ping"])
def test_forced_calls_through_the_server_validate(served, choice):
    _, _, srv = served
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    tool_choice = "required" if choice == "required" else {"type": "function", "function": {"name": choice}}
    for temperature, seed in ((0.0, 0), (1.0, 1), (1.0, 2), (1.0, 3)):
        kw = dict(model="m", messages=MSGS, tools=FORCED, tool_choice=tool_choice, max_tokens=400,
                  temperature=temperature, seed=seed)
        whole = client.chat.completions.create(**kw).choices[0]
        assert whole.finish_reason == "tool_calls", whole
        calls = whole.message.tool_calls
        assert len(calls) == 1 and calls[0].id.startswith("call_") and calls[0].type == "function"
        name, args = calls[0].function.name, json.loads(calls[0].function.arguments)
        assert choice == "required" or name == choice
        jsonschema.validate(args, SCHEMAS[name])
        assert not whole.message.content
        # streamed, as the official client accumulates it: the same call
        with client.chat.completions.stream(**kw) as stream:
            for _ in stream:
                pass
            final = stream.get_final_completion().choices[0]
        assert final.finish_reason == "tool_calls"
        got = final.message.tool_calls
        assert [(c.function.name, json.loads(c.function.arguments)) for c in got] == [(name, args)]


def test_markers_the_vocabulary_lacks_are_text(tmp_path):
    """A vocabulary without the markers' tokens: the grammar spells them as text (its rules
    mk0.. left as they are) and still writes each family's call, Gemma 4's strings included
    (their closing <|"|> lexed with the text before it); a forced reply parses and validates."""
    import edgeinfer

    eng = edgeinfer.load(str(_build(tmp_path, "gemma4", markers=[])), n_ctx=4096, n_threads=2, n_slots=1)
    try:
        for family in MODELS:
            src = template(MODELS[family][0])
            assert len(eng.tokenizer.encode(OPEN[family], add_special=False, parse_special=True)) > 1
            spec = plan_tools(src, MSGS, FORCED, "required").spec
            assert spec.for_tokenizer(eng.tokenizer) == spec.grammar
            call = _template_call(family, BOOK_ARGS, "book", FORCED)
            assert _accepts(eng, spec, call.replace("'", '"') if family == "lfm2" else call), call
        for seed in range(3):
            g = eng.chat(MSGS, tools=FORCED, tool_choice="required", max_tokens=400, temperature=1.0, seed=seed)
            assert g.finish_reason == "tool_calls" and len(g.tool_calls) == 1, g.text
            f = g.tool_calls[0]["function"]
            jsonschema.validate(json.loads(f["arguments"]), SCHEMAS[f["name"]])
    finally:
        eng.close()


def test_a_schema_the_gemma_grammar_cannot_write_is_a_clear_error():
    src = template(MODELS["gemma4"][0])
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "string", "allOf": [{"minLength": 1}]}}}}}
    with pytest.raises(ToolError, match="allOf"):
        plan_tools(src, MSGS, [bad], "required")
    # "auto" builds no grammar: the same tools are fine
    assert plan_tools(src, MSGS, [bad], "auto").spec is None


def test_every_family_format_gets_a_grammar():
    for family in FAMILIES.values():
        plan = plan_tools(template(family[0]), MSGS, FORCED, "required")
        assert plan.fmt == family[1] and plan.spec is not None and plan.spec.kind == "tool_call"
