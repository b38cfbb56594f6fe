"""Tool calls in a streamed reply, through the real server and the official clients: a model
with Qwen3.5's real chat template (llama.cpp's models/templates; its <think> block and
<tool_call><function=...> calls) writes text, then calls, and the stream gives the text as
content up to the call block and each call as tool_calls deltas (OpenAI) / a tool_use block
(Anthropic), equal to the reply read whole. The reply is forced by a grammar (the
`grammar` extension, spelled in plain tokens), so each case is exactly the text it names.

Also on that model: a thinking budget that runs out inside a call opened straight from the
thoughts (Qwen3.5's <tool_call> ends the block) forces no </think> into the call. And on
the real templates: Gemma 4's stray <channel|> after its answer is dropped (llama.cpp drops
it too), whitespace around a call block is layout, not content."""
from __future__ import annotations

import json

import pytest
from tests.support import tiny_checkpoints
from tests.support.strict import require
from tests.test_family_chat import TOOLS, every_split, render, spec_for, template

import edgeinfer
from edgeinfer.engine.reasoning import ReasoningSplitter
from edgeinfer.engine.tool_calls import plan_tools
from edgeinfer.server import ServerThread

openai = require("openai", "the openai client is the chat route's oracle")
anthropic = require("anthropic", "the anthropic client is the /v1/messages oracle")
require("transformers", "the tiny checkpoint is built with transformers")

from edgeinfer.convert import convert_checkpoint  # noqa: E402

MSGS = [{"role": "user", "content": "Weather in Paris, and the time?"}]
WEATHER = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
CLOCK = "<tool_call>\n<function=get_time>\n<parameter=tz>\nCET\n</parameter>\n</function>\n</tool_call>"
W_CALL = ("get_weather", {"city": "Paris"})
C_CALL = ("get_time", {"tz": "CET"})

# (what the model writes after the generation prompt's "<think>\n", then what the reply is:
# reasoning_content, content, calls)
CASES = {
    "text_then_call": ("</think>\n\nLet me check.\n" + WEATHER, None, "Let me check.", [W_CALL]),
    "call_only": ("</think>\n\n" + WEATHER, None, None, [W_CALL]),
    "call_from_thoughts": ("Need the tool.\n" + WEATHER, "Need the tool.\n", None, [W_CALL]),
    "text_between_calls": ("</think>\n\nFirst.\n" + WEATHER + "\nThen the time.\n" + CLOCK,
                           None, "First.Then the time.", [W_CALL, C_CALL]),
    "text_only": ("</think>\n\nNo tool <tool_call> needed.", None, "No tool <tool_call> needed.", []),
}


def grammar(text: str) -> str:
    return 'start: "' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """A tiny Qwen3 checkpoint with Qwen3.5's template and its call markers as special tokens."""
    import transformers
    from tokenizers import AddedToken, Tokenizer

    root = tmp_path_factory.mktemp("tool_stream")
    d = tiny_checkpoints.build("qwen3", root / "ckpt")
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.add_special_tokens([AddedToken("<tool_call>", special=True), AddedToken("</tool_call>", special=True)])
    tok.save(str(d / "tokenizer.json"))
    model = transformers.AutoModelForCausalLM.from_pretrained(d)
    model.resize_token_embeddings(tok.get_vocab_size())
    model.save_pretrained(d, safe_serialization=True)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": template("Qwen3.5-4B")}))
    out = root / "qwen35_chat.gguf"
    convert_checkpoint(str(d), str(out), "f32")
    eng = edgeinfer.load(str(out), n_ctx=4096, n_threads=2, n_slots=2)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def server(engine):
    srv = ServerThread(engine, model_name="q").start()
    yield srv
    srv.stop(timeout_s=10)


def _calls(tool_calls) -> list[tuple]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in tool_calls or []]


@pytest.mark.parametrize("case", CASES)
def test_openai_stream_equals_the_whole_reply(server, case):
    written, reasoning, content, calls = CASES[case]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    kw = dict(model="q", messages=MSGS, tools=TOOLS, max_tokens=300, temperature=0.0,
              extra_body={"grammar": grammar(written)})
    whole = client.chat.completions.create(**kw).choices[0]
    msg = whole.message
    assert (msg.reasoning_content, msg.content, _calls(msg.tool_calls)) == (reasoning, content, calls)
    assert whole.finish_reason == ("tool_calls" if calls else "stop")
    assert all(c.id.startswith("call_") and c.type == "function" for c in msg.tool_calls or [])

    # the stream, as the official client accumulates it
    with client.chat.completions.stream(**kw) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion().choices[0]
    got = final.message
    assert (got.content, _calls(got.tool_calls), final.finish_reason) == (content, calls, whole.finish_reason)
    assert getattr(got, "reasoning_content", None) == reasoning

    # the raw deltas: content only before each call's block, each call whole once its block closes
    kinds, order = [], []
    for chunk in client.chat.completions.create(**kw, stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is None:
            continue
        if delta.content:
            kinds.append("text")
            order.append(("text", delta.content))
        for tc in delta.tool_calls or []:
            kinds.append("call")
            if tc.id is not None:
                order.append(("call", tc.index, tc.function.name))
    want = {"text_then_call": [("text", "Let me check."), ("call", 0, "get_weather")],
            "call_only": [("call", 0, "get_weather")],
            "call_from_thoughts": [("call", 0, "get_weather")],
            "text_between_calls": [("text", "First."), ("call", 0, "get_weather"), ("text", "Then the time."),
                                   ("call", 1, "get_time")],
            "text_only": None}[case]
    if want is not None:
        merged: list = []
        for o in order:               # the text of adjacent content chunks, joined
            if o[0] == "text" and merged and merged[-1][0] == "text":
                merged[-1] = ("text", merged[-1][1] + o[1])
            else:
                merged.append(o)
        assert merged == want


def _blocks(msg) -> list[tuple]:
    out = []
    for b in msg.content:
        if b.type == "text":
            out.append(("text", b.text))
        elif b.type == "thinking":
            out.append(("thinking", b.thinking))
        else:
            out.append(("tool_use", b.name, b.input))
    return out


@pytest.mark.parametrize("case", CASES)
def test_anthropic_stream_equals_the_whole_reply(server, case):
    written, reasoning, content, calls = CASES[case]
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    kw = dict(model="q", messages=MSGS, max_tokens=300,
              tools=[{"name": t["function"]["name"], "description": t["function"]["description"],
                      "input_schema": t["function"]["parameters"]} for t in TOOLS],
              extra_body={"temperature": 0.0, "grammar": grammar(written)})
    msg = client.messages.create(**kw)
    want = {"text_then_call": [("text", "Let me check."), ("tool_use", *W_CALL)],
            "call_only": [("tool_use", *W_CALL)],
            "call_from_thoughts": [("thinking", "Need the tool.\n"), ("tool_use", *W_CALL)],
            "text_between_calls": [("text", "First."), ("tool_use", *W_CALL), ("text", "Then the time."),
                                   ("tool_use", *C_CALL)],
            "text_only": [("text", content)]}[case]
    assert _blocks(msg) == want
    assert msg.stop_reason == ("tool_use" if calls else "end_turn")
    with client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert _blocks(final) == want and final.stop_reason == msg.stop_reason
    assert all(b.id for b in final.content if b.type == "tool_use")


def test_the_budget_stops_at_a_call_opened_from_the_thoughts(engine):
    """The generation prompt opens <think>; the model (biased to it) writes <tool_call> at once:
    that ends the block, so a budget of 2 forces no </think> into the call (it did before:
    </think> at index 2). Without the call the budget still closes the block."""
    tc = engine.tokenize("<tool_call>", add_special=False)
    end = engine.tokenize("</think>", add_special=False)
    assert len(tc) == len(end) == 1
    ids = engine.chat_ids(MSGS)
    spec = engine.reasoning_spec(ids, 2)
    assert spec.open_at_start and spec.also_end_ids == (tuple(tc),)
    kw = dict(max_tokens=6, temperature=0.0, ignore_eos=True, reasoning_budget=2)
    got = engine.chat(MSGS, logit_bias={tc[0]: 100.0, end[0]: -100.0}, **kw)
    assert got.tokens == tc * 6
    # the same bias without the call: the budget forces </think> after 2 tokens
    other = engine.chat(MSGS, logit_bias={end[0]: -100.0, tc[0]: -100.0}, **kw)
    assert other.tokens.index(end[0]) == 2 and tc[0] not in other.tokens


# --------------------------------------------------------------------------- text-level

def test_gemma4_stray_channel_end_is_dropped():
    """Gemma 4 may close a channel it never opened after its answer: llama.cpp drops it, and
    so does the splitter (whole and at every cut), inside the block it still ends it."""
    src = template("google-gemma-4-31B-it")
    plan = plan_tools(src, [{"role": "user", "content": "hi"}], TOOLS, "auto")
    spec = spec_for(src, render(src, [{"role": "user", "content": "hi"}], True))
    assert every_split(plan, spec, "The answer.<channel|>") == ("", "The answer.", [])
    assert every_split(plan, spec, "<|channel>thought\nHmm.<channel|>Yes.<channel|>") == ("Hmm.", "Yes.", [])
    assert every_split(plan, spec, "A<channel|>B") == ("", "AB", [])
    # a splitter held at a partial stray releases it when the reply ends there
    sp = ReasoningSplitter(spec)
    assert sp.feed("Done.<chan") == ("", "Done.") and sp.feed("", final=True) == ("", "<chan")


def test_whitespace_around_calls_is_layout():
    src = template("Qwen3.5-4B")
    plan = plan_tools(src, [{"role": "user", "content": "hi"}], TOOLS, "auto")
    call = "<tool_call>\n<function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n</function>\n</tool_call>"
    got = [{"name": "get_time", "arguments": {"tz": "UTC"}}]
    assert every_split(plan, None, "Text.\n\n" + call + "\n\n" + call + "\n") == ("", "Text.", got * 2)
    assert every_split(plan, None, call + "\n  More.  \n") == ("", "More.  \n", got)
    # a block that is not a call keeps its whitespace: the text is the model's
    assert every_split(plan, None, "Use\n<tool_call> tags.\n") == ("", "Use\n<tool_call> tags.\n", [])
    assert every_split(plan, None, "Answer.\n\n") == ("", "Answer.\n\n", [])
    content, calls = plan.split("Hi.\n" + call)
    assert content == "Hi." and [c["function"]["name"] for c in calls] == ["get_time"]
