"""Chat templates: HF-compatible rendering, and hostile templates stopped without side effects."""
from __future__ import annotations

import threading
import tracemalloc

import jinja2
import pytest

from edgeinfer.text.chat_template import CHATML_TEMPLATE, ChatTemplate, is_prefill, validate_messages
from edgeinfer.errors import TemplateError
from tests.support.strict import require

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)

CONVERSATION = [
    {"role": "user", "content": "Hi! What's the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "And of Italy?"},
]

EXPECTED_SMOLLM2 = (
    "<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\n"
    "Hi! What's the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n"
    "The capital of France is Paris.<|im_end|>\n"
    "<|im_start|>user\n"
    "And of Italy?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def _hf_reference(template: str, **ctx) -> str:
    """Plain jinja2 with the settings transformers' apply_chat_template uses."""
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True,
                             extensions=["jinja2.ext.loopcontrols"])
    return env.from_string(template).render(**ctx)


def test_smollm2_template_from_gguf(smollm2_path):
    from edgeinfer.gguf.reader import GGUFFile

    f = GGUFFile(smollm2_path)
    try:
        meta = dict(f.metadata)
    finally:
        if hasattr(f, "close"):
            f.close()
    assert meta["tokenizer.chat_template"] == SMOLLM2_TEMPLATE
    ct = ChatTemplate.from_metadata(meta)
    assert ct.render(CONVERSATION) == EXPECTED_SMOLLM2


def test_smollm2_template_matches_hf_semantics():
    ct = ChatTemplate(SMOLLM2_TEMPLATE, bos_token="<|im_start|>", eos_token="<|im_end|>")
    assert ct.render(CONVERSATION) == EXPECTED_SMOLLM2
    assert ct.render(CONVERSATION) == _hf_reference(
        SMOLLM2_TEMPLATE, messages=CONVERSATION, add_generation_prompt=True)
    no_prompt = ct.render(CONVERSATION, add_generation_prompt=False)
    assert no_prompt == EXPECTED_SMOLLM2[: -len("<|im_start|>assistant\n")]
    with_system = [{"role": "system", "content": "Be brief."}] + CONVERSATION
    assert ct.render(with_system).startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")


def test_hf_features():
    # trim_blocks / lstrip_blocks, loop controls, raise_exception, tojson without HTML escaping,
    # strftime_now, {% generation %}, bos/eos and extra context
    template = (
        "{{ bos_token }}\n"
        "{% for m in messages %}\n"
        "    {% if m['role'] == 'system' %}{% continue %}{% endif %}\n"
        "{{ m['role'] }}: {{ m['content'] }}\n"
        "{% endfor %}\n"
        "{% if tools %}{{ tools | tojson }}{% endif %}\n"
        "{% generation %}[{{ strftime_now('%Y') | length }}]{% endgeneration %}{{ eos_token }}"
    )
    ct = ChatTemplate(template, bos_token="<s>", eos_token="</s>")
    msgs = [{"role": "system", "content": "x"}, {"role": "user", "content": "<b>&</b>"}]
    out = ct.render(msgs, tools=[{"name": "f", "description": "é <tag>"}])
    assert out == '<s>\nuser: <b>&</b>\n[{"name": "f", "description": "é <tag>"}][4]</s>'

    guard = ChatTemplate("{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok")
    assert guard.render([{"role": "user", "content": "a"}]) == "ok"
    with pytest.raises(TemplateError, match="first must be user"):
        guard.render([{"role": "assistant", "content": "a"}])


def test_a_final_assistant_message_is_continued_as_transformers_does():
    """continue_final leaves the last (assistant) message open: transformers' apply_chat_template
    with continue_final_message=True is the oracle, trailing whitespace included; is_prefill
    says which chats end that way; a template that rewrites the message cannot be continued."""
    transformers = require("transformers", "apply_chat_template(continue_final_message=True) is the oracle")
    tokenizers = require("tokenizers", "a stand-in tokenizer object for transformers' template rendering")
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer(tokenizers.models.WordLevel({"<unk>": 0}, unk_token="<unk>")))
    ct = ChatTemplate(SMOLLM2_TEMPLATE, bos_token="<|im_start|>", eos_token="<|im_end|>")
    for prefill in ("Rome", "It is ", "  {"):
        chat = CONVERSATION + [{"role": "assistant", "content": prefill}]
        want = tok.apply_chat_template(chat, chat_template=SMOLLM2_TEMPLATE, tokenize=False,
                                       continue_final_message=True)
        assert ct.render(chat, continue_final=True) == want, prefill
        assert is_prefill(chat)
    parts = CONVERSATION + [{"role": "assistant", "content": [{"type": "text", "text": "Rome"}]}]
    assert is_prefill(parts)
    for chat in (CONVERSATION, CONVERSATION + [{"role": "assistant", "content": " "}],
                 CONVERSATION + [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]):
        assert not is_prefill(chat)
    upper = ChatTemplate("{% for m in messages %}{{ m['content'] | upper }}{% endfor %}")
    with pytest.raises(TemplateError, match="cannot continue"):
        upper.render([{"role": "assistant", "content": "abc"}], continue_final=True)


def test_fallback_chatml():
    ct = ChatTemplate.from_metadata({})
    assert ct.is_default and ct.source == CHATML_TEMPLATE
    assert ct.render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}],
                     add_generation_prompt=True) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.system('touch {marker}') }}",
    "{{ joiner.__init__.__globals__['os'].system('touch {marker}') }}",
    "{{ namespace.__init__.__globals__.os.popen('touch {marker}').read() }}",
    "{{ self.__init__.__globals__.__builtins__.__import__('os').system('touch {marker}') }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{% set x = messages.append({'role': 'x'}) %}{{ x }}",
    "{{ raise_exception.__globals__['__builtins__']['open']('{marker}', 'w') }}",
    "{{ (messages|attr('__class__')).__subclasses__() }}",
])
def test_unsafe_templates_are_stopped(template, tmp_path):
    marker = tmp_path / "pwned"
    ct = ChatTemplate(template.replace("{marker}", str(marker)))
    with pytest.raises(TemplateError, match="unsafe|failed"):
        ct.render([{"role": "user", "content": "hi"}])
    assert not marker.exists()


def test_documented_escape_attempts_are_reported_as_unsafe(tmp_path):
    marker = tmp_path / "x"
    for t in ("{{ ''.__class__.__mro__[1].__subclasses__() }}",
              f"{{{{ cycler.__init__.__globals__.os.system('touch {marker}') }}}}"):
        with pytest.raises(TemplateError, match="unsafe"):
            ChatTemplate(t).render([{"role": "user", "content": "hi"}])
    assert not marker.exists()


def _render_counting_iterations(template: str, **kw) -> tuple[BaseException | None, int]:
    """Renders with no timer (timeout_s=None), so only the renderer's own bounds can stop it:
    (the exception raised, the number of loop iterations the template ran)."""
    ct = ChatTemplate(template, timeout_s=None, **kw)
    real_range = ct._env.globals["range"]
    iterations = [0]

    def counted_range(*args):
        for i in real_range(*args):
            iterations[0] += 1
            yield i

    ct._env.globals["range"] = counted_range
    try:
        ct.render([{"role": "user", "content": "hi"}])
    except BaseException as e:  # noqa: BLE001 - returned to the test
        return e, iterations[0]
    return None, iterations[0]


def test_range_is_limited_and_output_is_bounded():
    err, n = _render_counting_iterations("{% for i in range(10**9) %}x{% endfor %}")
    assert isinstance(err, TemplateError) and "ange too big" in str(err) and n == 0, (err, n)
    # 10^10 iterations that do produce output: stopped at the output bound, after about
    # 100000 of them (the output is streamed in small chunks)
    err, n = _render_counting_iterations(
        "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
        max_output_chars=100_000)
    assert isinstance(err, TemplateError) and "more than 100000 characters" in str(err), err
    assert 100_000 <= n < 300_000, n


@pytest.mark.parametrize("template", [
    "{{ 'x' * 10**9 }}",
    "{{ 'x' | center(10**9) }}",
    "{{ '{:>999999999}'.format('a') }}",
    "{{ '%999999999s' % 'a' }}",
    "{{ 'x'.ljust(10**8) }}",
    "{{ 2 ** (10**8) }}",
    "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "{% set l = [['x' * 500000]] * 1000 %}{{ l }}",
    "{{ ['a' * 600000, 'b' * 600000] | join }}",
    "{{ ('a' * 1000) | replace('a', 'b' * 10000) }}",
])
def test_memory_bombs_are_refused(template):
    """Refused by the renderer's size checks (no timer: timeout_s=None) before the bomb is built:
    Python never holds more than a few times the 1 MB output limit."""
    tracemalloc.start()
    try:
        with pytest.raises(TemplateError):
            ChatTemplate(template, timeout_s=None).render([{"role": "user", "content": "hi"}])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak


def test_endless_silent_loop_times_out():
    ct = ChatTemplate(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", timeout_s=0.5)
    with pytest.raises(TemplateError, match="did not finish"):
        ct.render([{"role": "user", "content": "hi"}])
    assert not any(t.name == "edgeinfer-chat-template" and t.is_alive() for t in threading.enumerate())


def test_recursion_is_an_error():
    with pytest.raises(TemplateError, match="recursed"):
        ChatTemplate("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}").render([{"role": "user", "content": "a"}])


@pytest.mark.parametrize("messages, match", [
    ("hello", "list"),
    ([1, 2], "dict"),
    ([{"content": "x"}], "role"),
    ([{"role": "", "content": "x"}], "role"),
    ([{"role": 3, "content": "x"}], "role"),
    ([{"role": "user"}], "content"),
    ([{"role": "user", "content": 5}], "content"),
    ([{"role": "user", "content": object()}], "content"),
    ([{"role": "user", "content": "x", "meta": object()}], "plain data"),
    (None, "list"),
])
def test_bad_messages(messages, match):
    with pytest.raises(TemplateError, match=match):
        ChatTemplate(SMOLLM2_TEMPLATE).render(messages)


def test_messages_are_copied_as_plain_data():
    msgs = [{"role": "user", "content": "hi", "extra": {"a": [1, 2.5, None, True]}}]
    assert validate_messages(msgs) == msgs
    assert validate_messages(msgs)[0] is not msgs[0]


@pytest.mark.parametrize("template, match", [
    ("{% for x in %}", "syntax error"),
    ("{{ x.y.z }}", "undefined"),
    ("{{ messages[0]['content'] + 1 }}", "failed to render"),
    (42, "string"),
])
def test_bad_templates(template, match):
    with pytest.raises(TemplateError, match=match):
        ChatTemplate(template).render([{"role": "user", "content": "hi"}])
