"""Chat on the new families (Qwen3.5, LFM2 / LFM2.5, Gemma 4): their real chat templates
(llama.cpp's models/templates, from the cached llama-cpp-python sdist) render in our sandbox
exactly as transformers renders them, and their thinking blocks and tool calls parse into
reasoning_content and tool_calls, plain and streamed (the reply cut at every split point).

Oracle: the template itself. A chat whose last assistant turn holds reasoning and tool_calls
is rendered through the real template; the text that turn adds after the generation prompt is
what the model would have written, and parsing it back must give the original calls and
reasoning. Hand-written replies cover what a template never writes (text before a call,
several calls, a call cut short, a malformed block)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.support.llama_cpp_convert import unpack_sdist
from tests.support.strict import require

from edgeinfer.engine.reasoning import ReasoningSpec, ReasoningSplitter, reasoning_format
from edgeinfer.engine.tool_calls import CALL_FORMATS, plan_tools, write_calls
from edgeinfer.text.chat_template import ChatTemplate

require("transformers", "transformers renders the templates as the oracle of our sandbox")
from transformers.utils.chat_template_utils import render_jinja_template  # noqa: E402

_DIR: dict[str, Path] = {}


def template(name: str) -> str:
    """llama.cpp's models/templates/<name>.jinja."""
    if "d" not in _DIR:
        tmp = unpack_sdist("family_chat_", lambda rel: rel.startswith("models/templates/") and rel.endswith(".jinja"))
        _DIR["d"] = tmp / "models" / "templates"
    return (_DIR["d"] / f"{name}.jinja").read_text(encoding="utf-8")


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "ratio": {"type": "number"}, "tags": {"type": "array", "items": {"type": "string"}},
        "opts": {"type": "object"}, "note": {"type": "string"}}}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a zone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}
TOOLS = [WEATHER, CLOCK]

# (template, call format, reasoning format, the assistant's reasoning field, what ends its turn)
FAMILIES = {
    "qwen35": ("Qwen3.5-4B", "qwen-xml", "think-xml-tools", "reasoning_content", "<|im_end|>"),
    "lfm25-8b": ("LFM2.5-8B-A1B", "lfm2", "think", "thinking", "<|im_end|>"),
    "lfm2-8b": ("LFM2-8B-A1B", "lfm2", None, None, "<|im_end|>"),
    "lfm25": ("LFM2.5-Instruct", "lfm2", None, None, "<|im_end|>"),
    "gemma4": ("google-gemma-4-31B-it", "gemma4", "gemma4", "reasoning_content", "<|tool_response>"),
}
# the families whose templates write an assistant's tool_calls (the round-trip oracle)
WRITES_CALLS = ["qwen35", "lfm25-8b", "gemma4"]

ARGS = [  # typed values a template must carry through: text with newlines / quotes, numbers, lists, objects
    {"city": "Rome", "days": 3, "metric": True, "ratio": 2.5, "tags": ["a", "b c"], "opts": {"x": [1, None]}},
    {"city": "New York", "note": "line one\nline \"two\", it's {x}"},
    {},
]


def chat(family: str, args: dict, reasoning: str | None = "Need the weather tool.") -> tuple[list, list]:
    """(the chat up to the model's turn, that chat with the model's turn: reasoning and two calls)."""
    field = FAMILIES[family][3]
    head = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Rome, and the time?"}]
    turn = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": args}},
        {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": {"tz": "CET"}}}]}
    if reasoning is not None and field is not None:
        turn[field] = reasoning
    return head, head + [turn]


def render(src: str, msgs: list, gen: bool, tools: list = TOOLS) -> str:
    ours = ChatTemplate(src, bos_token="<bos>").render(msgs, add_generation_prompt=gen, tools=tools,
                                                      enable_thinking=True)
    hf = render_jinja_template([msgs], tools=tools, chat_template=src, add_generation_prompt=gen,
                               enable_thinking=True, bos_token="<bos>")
    hf = hf[0][0] if isinstance(hf, tuple) else hf[0]
    assert ours == hf, "our sandbox renders the template as transformers does"
    return ours


def spec_for(src: str, prompt: str) -> ReasoningSpec | None:
    """The reasoning spec of a prompt, with the markers' text standing in for their ids."""
    fmt = reasoning_format(src)
    if fmt is None:
        return None
    return ReasoningSpec.for_prompt(fmt, [fmt.start], [fmt.end], _marks(prompt, fmt))


def _marks(text: str, fmt) -> list[str]:
    """The markers of `text` in order (what for_prompt reads in the prompt's ids)."""
    out, i = [], 0
    while True:
        hits = [(text.find(m, i), m) for m in (fmt.start, fmt.end) if text.find(m, i) >= 0]
        if not hits:
            return out
        j, m = min(hits)
        out.append(m)
        i = j + len(m)


def pipeline(plan, spec, pieces: list[str]) -> tuple[str, str, list[dict]]:
    """A reply fed piece by piece as the server sees it: the reasoning split off first, then
    the calls out of the answer. (reasoning, content, calls without ids)."""
    splitter = ReasoningSplitter(spec) if spec is not None else None
    scanner = plan.scanner()
    thought, content, calls = [], [], []
    for k, piece in enumerate(pieces + [""]):
        final = k == len(pieces)
        r, c = splitter.feed(piece, final) if splitter is not None else ("", piece)
        thought.append(r)
        text, found = scanner.feed(c, final)
        content.append(text)
        calls += found
    assert [c["index"] for c in calls] == list(range(len(calls)))
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    return "".join(thought), "".join(content), [
        {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])} for c in calls]


def every_split(plan, spec, text: str) -> tuple[str, str, list[dict]]:
    """The pipeline's result, checked equal for the whole text, every two-piece cut and one
    character at a time."""
    whole = pipeline(plan, spec, [text])
    for k in range(1, len(text)):
        assert pipeline(plan, spec, [text[:k], text[k:]]) == whole, f"cut at {k}: {text[:k]!r}"
    assert pipeline(plan, spec, list(text)) == whole
    return whole


# --------------------------------------------------------------------------- detection

@pytest.mark.parametrize("family", FAMILIES)
def test_formats_are_read_from_the_real_templates(family):
    name, call_fmt, think_fmt, _, _ = FAMILIES[family]
    src = template(name)
    plan = plan_tools(src, [{"role": "user", "content": "hi"}], TOOLS, "auto")
    assert plan.fmt == call_fmt and plan.render_extra["tools"][0]["function"]["name"] == "get_weather"
    fmt = reasoning_format(src)
    assert (fmt.name if fmt else None) == think_fmt
    text = render(src, plan.messages, True)
    assert "get_weather" in text and "get_time" in text      # the template listed the tools


def test_other_templates_keep_their_formats():
    """Qwen3 keeps Hermes JSON and <think>; SmolLM3 (no tools in its template) thinks in <think>."""
    src = template("Qwen-Qwen3-0.6B")
    assert plan_tools(src, [{"role": "user", "content": "hi"}], TOOLS).fmt == "hermes"
    assert reasoning_format(src).name == "think"
    src = template("HuggingFaceTB-SmolLM3-3B")
    assert plan_tools(src, [{"role": "user", "content": "hi"}], TOOLS).fmt == "generic"
    assert reasoning_format(src).name == "think"


# --------------------------------------------------------------------------- the template as oracle

@pytest.mark.parametrize("args", range(len(ARGS)))
@pytest.mark.parametrize("family", WRITES_CALLS)
def test_rendered_tool_call_turn_parses_back(family, args):
    """The template writes the model's turn (reasoning, two calls); parsing that text gives
    the reasoning and the calls back, whole and streamed at every cut."""
    name, _, _, _, turn_end = FAMILIES[family]
    src = template(name)
    head, full = chat(family, ARGS[args])
    plan = plan_tools(src, full, TOOLS, "auto")
    prompt = render(src, plan_tools(src, head, TOOLS, "auto").messages, True)
    text = render(src, plan.messages, False)
    assert text.startswith(prompt), "the prompt is a prefix of the chat with the model's turn"
    reply = text[len(prompt):]
    reply = reply[:reply.rindex(turn_end)]     # the turn's end is an end-of-generation token
    thought, content, calls = every_split(plan, spec_for(src, prompt), reply)
    assert calls == [c["function"] for c in full[-1]["tool_calls"]]
    assert thought.strip() == "Need the weather tool."
    assert content.strip() == ""


@pytest.mark.parametrize("family", ["lfm2-8b", "lfm25"])
def test_templates_without_tool_calls_get_them_in_the_content(family):
    """LFM2-8B-A1B and LFM2.5-Instruct never read tool_calls: the plan writes earlier calls into
    the assistant's content in the family's own format, and they parse back."""
    name = FAMILIES[family][0]
    src = template(name)
    _, full = chat(family, ARGS[0])
    plan = plan_tools(src, full + [{"role": "tool", "tool_call_id": "call_a", "content": "21 C"}], TOOLS, "auto")
    text = render(src, plan.messages, True)
    assert "<|tool_call_start|>[get_weather(" in text and "21 C" in text
    turn = text[text.index("<|tool_call_start|>"):text.index("<|tool_call_end|>") + len("<|tool_call_end|>")]
    _, content, calls = every_split(plan, None, turn)
    assert content == "" and calls == [c["function"] for c in full[-1]["tool_calls"]]


@pytest.mark.parametrize("fmt", CALL_FORMATS, ids=lambda f: f.name)
def test_written_calls_parse_back(fmt):
    """write_calls (the family's format, as the plan writes history) and the parser agree."""
    src = {"qwen-xml": "Qwen3.5-4B", "hermes": "Qwen-Qwen3-0.6B", "lfm2": "LFM2-8B-A1B",
           "gemma4": "google-gemma-4-31B-it"}[fmt.name]
    plan = plan_tools(template(src), [{"role": "user", "content": "hi"}], TOOLS, "auto")
    assert plan.fmt == fmt.name
    calls = [{"name": "get_weather", "arguments": a} for a in ARGS] + [{"name": "get_time", "arguments": {"tz": "UTC"}}]
    if fmt.body == "xml":     # the XML form carries text, not JSON null, in a string parameter
        calls[1]["arguments"] = {"city": "New York", "note": "two\nlines"}
    _, content, got = every_split(plan, None, write_calls(fmt, calls))
    assert content == "" and got == calls


# --------------------------------------------------------------------------- replies as models write them

def test_qwen35_replies():
    src = template("Qwen3.5-4B")
    plan = plan_tools(src, [{"role": "user", "content": "hi"}], TOOLS, "auto")
    prompt = render(src, [{"role": "user", "content": "hi"}], True)
    spec = spec_for(src, prompt)
    assert spec.open_at_start                      # the generation prompt opens <think>
    call = "<tool_call>\n<function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n</function>\n</tool_call>"
    # thoughts, then text before the call (the template allows it), then the call
    assert every_split(plan, spec, "Hmm.\n</think>\n\nLet me check.\n\n" + call) == (
        "Hmm.\n", "Let me check.", [{"name": "get_time", "arguments": {"tz": "UTC"}}])   # the gap is layout
    # a call straight from the thoughts, without </think> (llama.cpp accepts it too)
    assert every_split(plan, spec, "Hmm.\n" + call) == ("Hmm.\n", "", [{"name": "get_time", "arguments": {"tz": "UTC"}}])
    # two calls; a number in a string parameter stays text; JSON in an integer parameter is typed
    two = ("</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=days>\n"
           "7\n</parameter>\n</function>\n</tool_call>\n" + call)
    assert every_split(plan, spec, two)[2] == [{"name": "get_weather", "arguments": {"city": "42", "days": 7}},
                                               {"name": "get_time", "arguments": {"tz": "UTC"}}]
    # cut short by max_tokens: what is there is parsed
    assert every_split(plan, spec, "</think>\n\n" + call[:-len("\n</function>\n</tool_call>")])[2] == [
        {"name": "get_time", "arguments": {"tz": "UTC"}}]
    # an unknown function or a malformed block is the model's text
    bad = "<tool_call>\n<function=rm_rf>\n</function>\n</tool_call>"
    assert every_split(plan, spec, "</think>\n\n" + bad) == ("", bad, [])
    assert every_split(plan, spec, "</think>\n\nI would use <tool_call> tags.")[1:] == (
        "I would use <tool_call> tags.", [])


def test_lfm2_replies():
    src = template("LFM2.5-8B-A1B")
    plan = plan_tools(src, [{"role": "user", "content": "hi"}], TOOLS, "auto")
    spec = spec_for(src, render(src, [{"role": "user", "content": "hi"}], True))
    assert not spec.open_at_start
    text = ("<think>Two calls.</think>Sure.<|tool_call_start|>[get_weather(city=\"Paris\", tags=['x', \"y\"], "
            "opts={'k': (1, 2)}, metric=false), get_time()]<|tool_call_end|>")
    assert every_split(plan, spec, text) == ("Two calls.", "Sure.", [
        {"name": "get_weather", "arguments": {"city": "Paris", "tags": ["x", "y"], "opts": {"k": [1, 2]}, "metric": False}},
        {"name": "get_time", "arguments": {}}])
    for bad in ["<|tool_call_start|>[get_weather(city=Paris)]<|tool_call_end|>",        # not a literal
                "<|tool_call_start|>[get_weather(city='x'); os.system('x')]<|tool_call_end|>",
                "<|tool_call_start|>[" + "[" * 200 + "]<|tool_call_end|>"]:            # too deep
        assert every_split(plan, spec, bad) == ("", bad, [])


def test_gemma4_replies():
    src = template("google-gemma-4-31B-it")
    plan = plan_tools(src, [{"role": "user", "content": "hi"}], TOOLS, "auto")
    on = render(src, [{"role": "user", "content": "hi"}], True)
    spec = spec_for(src, on)
    assert not spec.open_at_start and on.endswith("<|turn>model\n")
    text = ("<|channel>thought\nCheck the tool.<channel|>On it.<|tool_call>call:get_weather{city:<|\"|>Rome, \"IT\"<|\"|>,"
            "opts:{deep:{list:[1,-2.5e3,null,<|\"|>a:b}<|\"|>]}},metric:false}<tool_call|>"
            "<|tool_call>call:get_time{}<tool_call|>")
    assert every_split(plan, spec, text) == ("Check the tool.", "On it.", [
        {"name": "get_weather", "arguments": {"city": 'Rome, "IT"', "opts": {"deep": {"list": [1, -2500.0, None, "a:b}"]}},
                                              "metric": False}},
        {"name": "get_time", "arguments": {}}])
    # thinking off: the generation prompt holds the closed empty channel
    ChatTemplate(src).render([{"role": "user", "content": "hi"}])
    off = ChatTemplate(src).render([{"role": "user", "content": "hi"}], enable_thinking=False)
    assert off.endswith("<|channel>thought\n<channel|>") and not spec_for(src, off).open_at_start
    bad = "<|tool_call>call:get_weather{city:<|\"|>Rome}<tool_call|>"      # an unterminated string
    assert every_split(plan, spec, bad) == ("", bad, [])


def test_plan_split_matches_parse():
    """ToolPlan.parse (the non-streamed routes) gives the scanner's calls; split keeps the text."""
    src = template("google-gemma-4-31B-it")
    plan = plan_tools(src, [{"role": "user", "content": "hi"}], TOOLS, "auto")
    text = "Sure.<|tool_call>call:get_time{tz:<|\"|>UTC<|\"|>}<tool_call|>"
    calls = plan.parse(text)
    assert [c["function"] for c in calls] == [{"name": "get_time", "arguments": '{"tz": "UTC"}'}]
    content, split_calls = plan.split(text)
    assert content == "Sure." and [c["function"] for c in split_calls] == [c["function"] for c in calls]
    assert plan.parse("No call here.") is None and plan.split("No call here.") == ("No call here.", None)
    none = plan_tools(src, [{"role": "user", "content": "hi"}], TOOLS, "none")
    assert none.parse(text) is None and none.scanner() is None
    # a forced call has a grammar (tests/test_forced_calls.py) and is read back by the scanner,
    # as in "auto": its markers are special tokens, not JSON the CallStreamer reads
    req = plan_tools(src, [{"role": "user", "content": "hi"}], TOOLS, "required")
    assert req.spec is not None and req.streamer() is None and req.parse(text) is not None
