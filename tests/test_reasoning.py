"""Reasoning output on a template with a thinking block (a tiny Qwen3 checkpoint, its
tokenizer holding <think> and </think>): the block's text comes back apart from the answer
(`reasoning_content`, plain and streamed; Anthropic's thinking blocks; the Responses API's
reasoning items; Ollama's `thinking`), and a thinking budget
closes the block after exactly that many tokens, the answer following.

Two files of one checkpoint: Qwen3's template (the prompt leaves the block closed; the model
writes it, here under a grammar) and Qwen3.5's shape (the generation prompt opens it). The
reference is the model's own text generated without the split: the block's tokens, then the
answer continued after the closing marker (or the raw text cut at the markers with
str.partition). The random model is kept from writing a marker token itself (logit_bias), so
only the budget closes the block."""
from __future__ import annotations

import json
import shutil

import pytest
from tests.support import tiny_checkpoints
from tests.support.strict import require

import edgeinfer
from edgeinfer.server import ServerThread

openai = require("openai", "the openai client is the server's oracle")
anthropic = require("anthropic", "the anthropic client is the /v1/messages oracle")
require("transformers", "the tiny checkpoint is built with transformers")

from edgeinfer.convert import convert_checkpoint  # noqa: E402

MSGS = [{"role": "user", "content": "Hello there, how are you?"}]
MAX_TOKENS = 12
GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("reasoning")
    closed = tiny_checkpoints.build("qwen3", root / "qwen3")
    opened = root / "qwen3_open"
    shutil.copytree(closed, opened)
    cfg = json.loads((opened / "tokenizer_config.json").read_text())
    template = tiny_checkpoints.QWEN3_TEMPLATE.replace("assistant\n' }}", "assistant\n<think>\n' }}")
    assert template != cfg["chat_template"]
    (opened / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": template}))
    out = {}
    for name, d in (("closed", closed), ("open", opened)):
        out[name] = root / f"{name}.gguf"
        convert_checkpoint(str(d), str(out[name]), "f32")
    return out


@pytest.fixture(scope="module")
def engines(files):
    engs = {name: edgeinfer.load(str(p), n_ctx=256, n_threads=2, n_slots=2) for name, p in files.items()}
    yield engs
    for e in engs.values():
        e.close()


def markers(eng) -> tuple[list[int], list[int], dict[str, int]]:
    """The ids of <think> and </think>, and a logit_bias that keeps the model from writing them."""
    start, end = eng.tokenize("<think>", add_special=False), eng.tokenize("</think>", add_special=False)
    assert len(start) == len(end) == 1        # special tokens of the tokenizer
    return start, end, {str(start[0]): -100, str(end[0]): -100}


def reference(eng, budget: int) -> tuple[list[int], str, str]:
    """The tokens of a greedy reply whose block the prompt opened and the budget closed after
    `budget` tokens, and its (reasoning, content): the text of the block's tokens and of the
    answer generated after the closing marker, each without the split."""
    _, end, bias = markers(eng)
    ids = eng.chat_ids(MSGS)
    first = eng.generate(ids, max_tokens=budget, logit_bias=bias, **GREEDY) if budget else None
    head = first.tokens if first else []
    rest = eng.generate(ids + head + end, max_tokens=MAX_TOKENS - budget - len(end), logit_bias=bias, **GREEDY)
    return head + end + rest.tokens, (first.text if first else "").lstrip(), rest.text.lstrip()


@pytest.fixture(scope="module")
def server(engines):
    srv = ServerThread(engines["open"], model_name="open").start()
    yield srv
    srv.stop(timeout_s=10)


def test_the_budget_closes_the_block_after_exactly_that_many_tokens(engines):
    eng = engines["open"]
    _, end, bias = markers(eng)
    for budget in (0, 1, 5):
        got = eng.chat(MSGS, max_tokens=MAX_TOKENS, logit_bias=bias, reasoning_budget=budget, **GREEDY)
        tokens, reasoning, content = reference(eng, budget)
        assert got.tokens == tokens and got.tokens.index(end[0]) == budget, budget
        assert (got.reasoning_content, got.text) == (reasoning, content), budget
    unbounded = eng.chat(MSGS, max_tokens=MAX_TOKENS, logit_bias=bias, **GREEDY)
    assert end[0] not in unbounded.tokens and unbounded.text == ""
    assert unbounded.reasoning_content == eng.detokenize(unbounded.tokens).lstrip()


def test_the_split_plain_and_streamed_on_the_openai_route(engines, server):
    eng = engines["open"]
    _, _, bias = markers(eng)
    budget = 4
    _, reasoning, content = reference(eng, budget)
    assert reasoning and content
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    kw = dict(model="open", messages=MSGS, max_tokens=MAX_TOKENS, temperature=0.0, logit_bias=bias,
              extra_body={"ignore_eos": True, "reasoning_budget": budget})
    msg = client.chat.completions.create(**kw).choices[0].message
    assert (msg.reasoning_content, msg.content) == (reasoning, content)
    kinds, parts = [], {"reasoning_content": "", "content": ""}
    for chunk in client.chat.completions.create(**kw, stream=True):
        delta = chunk.choices[0].delta.model_dump(exclude_none=True) if chunk.choices else {}
        for key in parts:
            if delta.get(key):
                parts[key] += delta[key]
                kinds.append(key)
    assert (parts["reasoning_content"], parts["content"]) == (reasoning, content)
    assert kinds == sorted(kinds, key=["reasoning_content", "content"].index)   # the block, then the answer
    # reasoning_effort sets the budget: "none" closes the block at once
    msg = client.chat.completions.create(**{**kw, "extra_body": {"ignore_eos": True}}, reasoning_effort="none"
                                         ).choices[0].message
    assert (msg.reasoning_content, msg.content) == (None, reference(eng, 0)[2])   # an empty block: null


def test_thinking_blocks_on_the_anthropic_route(engines, server):
    """thinking.budget_tokens is the budget; the block comes back as a thinking content block
    (streamed as thinking_delta events), the answer as a text block."""
    eng = engines["open"]
    _, _, bias = markers(eng)
    _, reasoning, content = reference(eng, 3)
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    kw = dict(model="open", messages=MSGS, max_tokens=MAX_TOKENS, thinking={"type": "enabled", "budget_tokens": 3},
              extra_body={"temperature": 0.0, "ignore_eos": True, "logit_bias": bias})
    msg = client.messages.create(**kw)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in msg.content] == \
        [("thinking", reasoning), ("text", content)]
    with client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert [b.model_dump(include={"type", "thinking", "text"}) for b in final.content] == \
        [b.model_dump(include={"type", "thinking", "text"}) for b in msg.content]


def test_reasoning_items_on_the_responses_route(engines, server):
    """reasoning_budget (the chat route's extension) bounds the block; it comes back as a
    reasoning item before the message (streamed as reasoning_text deltas), and its tokens are
    counted as the usage's reasoning tokens: the budget and the closing marker."""
    eng = engines["open"]
    _, end, bias = markers(eng)
    budget = 3
    _, reasoning, content = reference(eng, budget)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    kw = dict(model="open", input=MSGS, max_output_tokens=MAX_TOKENS, temperature=0.0,
              extra_body={"ignore_eos": True, "logit_bias": bias, "reasoning_budget": budget})
    got = client.responses.create(**kw)
    assert [o.type for o in got.output] == ["reasoning", "message"]
    assert (got.output[0].content[0].text, got.output_text) == (reasoning, content)
    assert got.usage.output_tokens_details.reasoning_tokens == budget + len(end)
    kinds, final = [], None
    for ev in client.responses.create(**kw, stream=True):
        kinds += [ev.type] if ev.type.endswith("_text.delta") else []
        final = ev.response if ev.type == "response.incomplete" else final    # cut by max_output_tokens
    assert kinds == sorted(kinds, reverse=True) and set(kinds) == {"response.reasoning_text.delta",
                                                                   "response.output_text.delta"}
    assert [o.model_dump(include={"type", "content"}) for o in final.output] == \
        [o.model_dump(include={"type", "content"}) for o in got.output]


def test_thinking_on_the_ollama_route(engines, server):
    """Ollama's `think`: the chat route's split, the block as message.thinking (streamed in the
    lines before the answer's); /api/show lists the capability."""
    ollama = require("ollama", "the ollama client is the /api routes' oracle")
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    want = oai.chat.completions.create(model="open", messages=MSGS, max_tokens=MAX_TOKENS, temperature=0.0,
                                       extra_body={"repeat_penalty": 1.1, "top_k": 40, "top_p": 0.9}
                                       ).choices[0].message
    assert want.reasoning_content
    client = ollama.Client(host=server.url, timeout=60)
    kw = dict(model="open", messages=MSGS, think=True, options={"temperature": 0.0, "num_predict": MAX_TOKENS})
    got = client.chat(**kw).message
    assert (got.thinking, got.content) == (want.reasoning_content, want.content or "")
    lines = list(client.chat(**kw, stream=True))
    assert ("".join(x.message.thinking or "" for x in lines), "".join(x.message.content for x in lines)) == \
        (got.thinking, got.content)
    assert "thinking" in client.show("open").capabilities


def test_a_block_the_model_writes_is_split(engines):
    """Qwen3's template leaves the block closed: a block the model writes (here forced by a
    grammar, spelled in plain tokens) is cut from the answer at its markers."""
    eng = engines["closed"]
    grammar = 'start: "<think>" /[a-z]{2,6}/ "</think>" /[a-z ]{2,12}/'
    ids = eng.chat_ids(MSGS)
    raw = eng.generate(ids, grammar=grammar, max_tokens=MAX_TOKENS * 2, **GREEDY).text
    reasoning, sep, content = raw.removeprefix("<think>").partition("</think>")
    assert raw.startswith("<think>") and sep and reasoning and content
    srv = ServerThread(eng, model_name="closed").start()
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        kw = dict(model="closed", messages=MSGS, max_tokens=MAX_TOKENS * 2, temperature=0.0,
                  extra_body={"ignore_eos": True, "grammar": grammar})
        msg = client.chat.completions.create(**kw).choices[0].message
        assert (msg.reasoning_content, msg.content) == (reasoning.lstrip(), content.lstrip())
        parts = {"reasoning_content": "", "content": ""}
        for chunk in client.chat.completions.create(**kw, stream=True):
            delta = chunk.choices[0].delta.model_dump(exclude_none=True) if chunk.choices else {}
            for key in parts:
                parts[key] += delta.get(key) or ""
        assert (parts["reasoning_content"], parts["content"]) == (msg.reasoning_content, msg.content)
    finally:
        srv.stop(timeout_s=10)
