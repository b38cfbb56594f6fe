"""Fill in the middle (code completion between a prefix and a suffix) and llama-server's own
completion API, on a tiny Qwen2.5-Coder-style checkpoint (tests/support/tiny_checkpoints.py
"qwen2_fim": Qwen's FIM and repo-level special tokens) taught three completions, one in the
plain form and two in llama.cpp's repo-level /infill form (one of several lines):

* the FIM tokens llama.cpp finds in the file are ours; each form's prompt is the pieces as the
  checkpoint's own transformers tokenizer gives them, in the order of Qwen2.5-Coder's model card
  (plain) and of llama.cpp's format_prompt_infill (repo-level, with its budget);
* the Python API, OpenAI's `suffix` (the `openai` client), Ollama's `suffix` (the `ollama`
  client) and /infill give the taught middle, each token llama.cpp's greedy choice from the
  same prompt ids;
* /completion is /v1/completions under llama-server's sampling defaults, its reply and its
  stream's events match the document, `response_fields` picks paths;
* a model without FIM tokens, and bad /infill bodies (llama.cpp's own test cases), are 400s.
"""
from __future__ import annotations

import json
import re
import urllib.request

import pytest

from tests.support.strict import require

torch = require("torch", "the tiny checkpoint is built with torch")
require("transformers", "the tiny checkpoint's tokenizer is the prompt's oracle")
llama_cpp = require("llama_cpp", "llama.cpp is the FIM tokens' and the greedy tokens' oracle")
openai = require("openai", "the openai client is the suffix field's oracle")
ollama = require("ollama", "the ollama client is Ollama's suffix field's oracle")
jsonschema = require("jsonschema", "jsonschema checks replies against the document")

import edgeinfer
from edgeinfer.convert import convert_checkpoint
from edgeinfer.server import ServerThread
from edgeinfer.server.llamacpp import Stops
from tests.support import tiny_checkpoints
from tests.support.llama_oracle import get_llama, llama_greedy
from tests.support.serving import openai_client, smollm2_server
from tests.test_server import request

pytestmark = [pytest.mark.oracle]

PRE, SUF, MID, REPO, SEP, EOT = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>",
                                 "<|file_sep|>", "<|endoftext|>")
# the plain form: a function's body between its signature and a call
PREFIX, SUFFIX, MIDDLE = "def add(a, b):\n", "\n\nprint(add(12, 345))\n", "    return a + b"
# the repo-level form: another file of the project, and the start of the line being completed
FILES = [("util.py", "def square(x):\n    return x * x\n")]
R_PREFIX, R_PROMPT, R_SUFFIX, R_MIDDLE = "from util import square\n\n", "print(", ")\n", "square(3)"
# a middle of several lines, the last one back at the function's indentation (n_indent's case)
I_PREFIX, I_SUFFIX, I_MIDDLE = "def f(x):\n", "\n", "    y = square(x)\n    return y\nprint(f(3))"
GREEDY = {"temperature": 0.0}


def hf_ids(hf, *parts: str) -> list[int]:
    """Special-token names as their ids, text pieces as the transformers tokenizer encodes them."""
    out: list[int] = []
    for p in parts:
        out += [hf.convert_tokens_to_ids(p)] if p.startswith("<|") else hf.encode(p, add_special_tokens=False)
    return out


def plain_parts(prefix=PREFIX, suffix=SUFFIX) -> tuple[str, ...]:
    return PRE, prefix, SUF, suffix, MID          # Qwen2.5-Coder's model card


def repo_parts(files=FILES, prefix=R_PREFIX, prompt=R_PROMPT, suffix=R_SUFFIX) -> tuple[str, ...]:
    """llama.cpp's format_prompt_infill with nothing cut: <REPO> myproject, <SEP> name + text a
    file, <SEP> filename, then <PRE> prefix + prompt <SUF> suffix <MID>."""
    head = (REPO, "myproject\n") + sum(((SEP, f"{n}\n", t) for n, t in files), ()) + (SEP, "filename\n")
    return head + (PRE, prefix, prompt, SUF, suffix, MID)


@pytest.fixture(scope="module")
def coder(tmp_path_factory):
    """(the Q8_0 file, the checkpoint's transformers tokenizer), the checkpoint taught the two
    completions, each ended by <|endoftext|>."""
    from transformers import AutoTokenizer
    root = tmp_path_factory.mktemp("fim")
    d = tiny_checkpoints.build("qwen2_fim", root / "ckpt")
    hf = AutoTokenizer.from_pretrained(str(d))
    taught = [hf_ids(hf, *plain_parts(), MIDDLE, EOT), hf_ids(hf, *repo_parts(), R_MIDDLE, EOT),
              hf_ids(hf, *repo_parts([], I_PREFIX, "", I_SUFFIX), I_MIDDLE, EOT)]
    tiny_checkpoints.teach(d, taught)
    path = root / "coder.q8_0.gguf"
    convert_checkpoint(str(d), str(path), "q8_0")
    return path, hf


@pytest.fixture(scope="module")
def engine(coder):
    with edgeinfer.load(str(coder[0]), n_ctx=4096, n_threads=2, n_slots=2) as eng:
        yield eng


@pytest.fixture(scope="module")
def server(engine):
    srv = ServerThread(engine, model_name="coder").start()
    try:
        yield srv
    finally:
        srv.stop(timeout_s=10)


def llama_middle(path, ids: list[int], n: int = 24) -> tuple[list[int], str]:
    """llama.cpp's greedy tokens after `ids` up to its end of text, and their text."""
    toks = llama_greedy(path, ids, n, stop_at_eos=True)
    llm = get_llama(path)
    body = [t for t in toks if not llama_cpp.llama_vocab_is_eog(llama_cpp.llama_model_get_vocab(llm.model), t)]
    return toks, llm.detokenize(body).decode()


def test_fim_tokens_are_llama_cpps(coder, engine):
    """The prefix / suffix / middle / pad / repo / file-separator tokens llama.cpp finds in the file."""
    vocab = llama_cpp.llama_model_get_vocab(get_llama(coder[0]).model)
    tok = engine.tokenizer
    theirs = [getattr(llama_cpp, f"llama_vocab_fim_{k}")(vocab) for k in ("pre", "suf", "mid", "rep", "sep")]
    assert [tok.fim_pre_id, tok.fim_suf_id, tok.fim_mid_id, tok.fim_rep_id, tok.fim_sep_id] == theirs
    assert set(tok.eog_ids) == {i for i in range(tok.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)}
    assert engine.infills and engine.info()["fill_in_middle"]


def test_plain_prompt_is_the_model_cards(coder, engine):
    assert engine.infill_ids(PREFIX, SUFFIX) == hf_ids(coder[1], *plain_parts())


def test_repo_prompt_is_llama_cpps(coder, engine):
    """With files (and with none: the project's name and the file's still come first)."""
    hf = coder[1]
    assert engine.infill_ids(R_PREFIX, R_SUFFIX, prompt=R_PROMPT, files=FILES) == hf_ids(hf, *repo_parts())
    assert engine.infill_ids(R_PREFIX, R_SUFFIX, files=[]) == hf_ids(hf, *repo_parts([], prompt=""))


def test_repo_prompt_keeps_what_llama_cpps_budget_keeps(coder, engine):
    """A context of 4,096, where the batch is llama.cpp's 2,048: format_prompt_infill keeps the
    prefix's last 3*(2048/4) = 1536 tokens, the suffix's first 2048/4 - (2 + the prompt's), and
    of the files the last 4096 - 2048 - 2*n_predict."""
    hf = coder[1]
    prefix = "".join(f"x{i} = {i}\n" for i in range(600))
    suffix = "".join(f"y{i} = {i}\n" for i in range(200))
    files = [(f"m{i}.py", f"z{i} = {i}\n" * 40) for i in range(12)]
    got = engine.infill_ids(prefix, suffix, prompt=R_PROMPT, files=files, max_tokens=64)
    pre, mid, suf = hf_ids(hf, prefix), hf_ids(hf, R_PROMPT), hf_ids(hf, suffix)
    head = hf_ids(hf, *repo_parts(files)[:-6])
    assert len(pre) > 1536 and len(suf) > 510 and len(head) > 1920       # each one is cut
    assert got == (head[-(4096 - 2048 - 2 * 64):] + hf_ids(hf, PRE) + pre[-1536:] + mid + hf_ids(hf, SUF)
                   + suf[:2048 // 4 - (2 + len(mid))] + hf_ids(hf, MID))


@pytest.mark.parametrize("n_predict", [None, 20])
def test_repo_prompt_fits_a_small_context(coder, n_predict):
    """At 512 cells (a batch of 256 here: llama.cpp's 2,048 would leave the files nothing) the
    prompt leaves n_predict cells free (one without it) and keeps the newest of the files."""
    files = [(f"m{i}.py", f"z{i} = {i}\n" * 8) for i in range(12)]
    with edgeinfer.load(str(coder[0]), n_ctx=512, n_threads=1) as small:
        got = small.infill_ids("".join(f"x{i} = {i}\n" for i in range(200)), "y = 1\n" * 100, prompt=R_PROMPT,
                               files=files, max_tokens=n_predict)
        head = small.infill_ids("", "", files=files)[:-3]                 # the files, as much as fits
    fim = got.index(small.tokenizer.fim_pre_id)
    assert len(got) + (n_predict or 1) <= 512 and 0 < fim < len(head) and got[:fim] == head[-fim:]


def test_python_api_fills_the_middle_as_llama_cpp_does(coder, engine):
    out = engine.generate(PREFIX, suffix=SUFFIX, max_tokens=24, **GREEDY)
    toks, text = llama_middle(coder[0], engine.infill_ids(PREFIX, SUFFIX))
    assert (out.text, out.finish_reason) == (MIDDLE, "stop")
    assert out.tokens == toks[:len(out.tokens)] and text == MIDDLE
    with pytest.raises(TypeError, match="must be text"):      # the prefix as token ids
        engine.generate(engine.tokenize(PREFIX), suffix=SUFFIX)


def test_control_tokens_give_no_text(coder, engine, server):
    """A generated control token (<|fim_prefix|>, forced here) is no text in a middle, as
    llama-server renders it, from Python and on /completion."""
    pre = engine.tokenizer.fim_pre_id
    out = engine.generate(PREFIX, suffix=SUFFIX, max_tokens=3, logit_bias={pre: 100}, **GREEDY)
    assert out.tokens == [pre] * 3 and out.text == ""
    st, _, got = request(server.url + "/completion", "POST", {"prompt": "x = 1", "n_predict": 3, "top_k": 1,
                                                              "logit_bias": [[pre, 100]], "return_tokens": True})
    assert st == 200 and got["tokens"] == [pre] * 3 and got["content"] == ""


def test_cli_run_with_a_suffix_fills_the_middle(coder, smollm2_path):
    """`edgeinfer run MODEL -p PREFIX --suffix SUFFIX` prints the middle; on a model without FIM
    tokens it exits 1 with the reason."""
    from typer.testing import CliRunner

    from edgeinfer.cli import app
    r = CliRunner().invoke(app, ["run", str(coder[0]), "-p", PREFIX, "--suffix", SUFFIX, "--temp", "0", "-n", "24",
                                 "--no-stats"])
    assert r.exit_code == 0 and r.stdout == MIDDLE + "\n", r.output
    r = CliRunner().invoke(app, ["run", str(smollm2_path), "-p", "a", "--suffix", "b", "--no-stats"])
    assert r.exit_code == 1 and "fill-in-the-middle" in r.stderr, r.output


def test_openai_suffix_fills_the_middle(server):
    oai = openai_client(server)
    r = oai.completions.create(model="coder", prompt=PREFIX, suffix=SUFFIX, max_tokens=24, temperature=0)
    assert (r.choices[0].text, r.choices[0].finish_reason) == (MIDDLE, "stop")
    streamed = oai.completions.create(model="coder", prompt=PREFIX, suffix=SUFFIX, max_tokens=24, temperature=0,
                                      stream=True)
    assert "".join(c.choices[0].text for c in streamed) == MIDDLE


def test_ollama_suffix_fills_the_middle(server):
    client = ollama.Client(host=server.url, timeout=120)
    got = client.generate(model="coder", prompt=PREFIX, suffix=SUFFIX, options={**GREEDY, "num_predict": 24})
    assert (got.response, got.done_reason) == (MIDDLE, "stop")
    assert "insert" in client.show("coder").capabilities


def test_infill_route_gives_llama_cpps_middle(coder, engine, server):
    """/infill with a file of the project and the line's start: the taught middle, llama.cpp's
    greedy tokens from the repo-level prompt, its reply fields; streamed, the same text in
    `data:` events that end with `stop: true` and no [DONE]; each event and the reply match
    the document."""
    body = {"input_extra": [{"filename": n, "text": t} for n, t in FILES], "input_prefix": R_PREFIX,
            "prompt": R_PROMPT, "input_suffix": R_SUFFIX, "n_predict": 24, "top_k": 1, "return_tokens": True}
    st, _, got = request(server.url + "/infill", "POST", body)
    assert st == 200, got
    ids = engine.infill_ids(R_PREFIX, R_SUFFIX, prompt=R_PROMPT, files=FILES, max_tokens=24)
    toks, text = llama_middle(coder[0], ids)
    assert (got["content"], got["stop_type"], got["stop"]) == (R_MIDDLE, "eos", True) and text == R_MIDDLE
    assert got["tokens"] == toks[:len(got["tokens"])] and got["tokens_evaluated"] == len(ids)
    assert got["timings"]["predicted_n"] == got["tokens_predicted"]

    _, _, doc = request(server.url + "/openapi.json")
    ok = doc["paths"]["/infill"]["post"]["responses"]["200"]["content"]
    schema = {**ok["application/json"]["schema"], "components": doc["components"]}
    jsonschema.validate(got, schema)
    raw = urllib.request.urlopen(urllib.request.Request(server.url + "/infill", json.dumps(body).encode(),
                                                        {"Content-Type": "application/json"})).read()
    assert re.search(rb'"content"\s*:"', raw), raw[:80]     # llama.vim's test of a reply: no space
    st, hdrs, raw = request(server.url + "/infill", "POST", {**body, "stream": True})
    assert st == 200 and hdrs["Content-Type"].startswith("text/event-stream")
    events = [json.loads(e.removeprefix("data: ")) for e in raw.split("\n\n") if e.strip()]
    for ev in events:
        jsonschema.validate(ev, schema)
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    assert "".join(e["content"] for e in events) == R_MIDDLE and events[-1]["stop_type"] == "eos"
    assert [e["tokens"] for e in events[:-1]] == [[t] for t in got["tokens"]]     # an event a token


def test_response_fields_pick_paths(server):
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 4, "top_k": 1, "n_probs": 2,
            "response_fields": ["content", "timings/predicted_n", "timings/absent"]}
    st, _, got = request(server.url + "/infill", "POST", body)
    assert st == 200 and set(got) == {"content", "timings/predicted_n"} and got["timings/predicted_n"] == 4


@pytest.mark.parametrize("extra", [{}, {"filename": "ok"}, {"filename": 123}, {"filename": 123, "text": "abc"},
                                   {"filename": 123, "text": 456}])
def test_bad_input_extra_is_a_400(server, extra):
    """llama.cpp's own test cases of a bad `input_extra` chunk (tools/server/tests/unit/test_infill.py)."""
    st, _, got = request(server.url + "/infill", "POST", {"input_extra": [extra], "input_prefix": PREFIX,
                                                          "input_suffix": SUFFIX})
    assert st == 400 and got["error"]["param"].startswith("input_extra"), got


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    with smollm2_server(smollm2_path) as srv:
        yield srv


def test_completion_route_is_v1_completions_under_llama_cpps_defaults(smollm2):
    """/completion with a seed and nothing else samples as /v1/completions told llama-server's
    defaults (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05); its stream has that text."""
    prompt, seed = "Once upon a time", 7
    st, _, got = request(smollm2.url + "/completion", "POST", {"prompt": prompt, "n_predict": 24, "seed": seed})
    assert st == 200, got
    _, _, want = request(smollm2.url + "/v1/completions", "POST", {
        "prompt": prompt, "max_tokens": 24, "seed": seed, "temperature": 0.8, "top_k": 40, "top_p": 0.95,
        "min_p": 0.05})
    assert got["content"] == want["choices"][0]["text"]
    assert got["stop_type"] == {"length": "limit", "stop": "eos"}[want["choices"][0]["finish_reason"]]
    assert got["generation_settings"]["top_k"] == 40 and got["prompt"].endswith(prompt)
    st, _, raw = request(smollm2.url + "/completion", "POST",
                         {"prompt": prompt, "n_predict": 24, "seed": seed, "stream": True})
    events = [json.loads(e.removeprefix("data: ")) for e in raw.split("\n\n") if e.strip()]
    assert "".join(e["content"] for e in events) == got["content"] and events[-1]["stop"]


def test_no_fim_tokens_is_a_400_on_every_route(smollm2_path, smollm2):
    """SmolLM2's vocabulary has no FIM tokens: the Python API's InfillError, 400s naming the
    suffix field on /v1/completions and /api/generate, llama-server's 501 on /infill; Ollama's
    capabilities leave out "insert"."""
    with edgeinfer.load(smollm2_path, n_ctx=256, n_threads=1) as eng:
        assert not eng.infills and not eng.info()["fill_in_middle"]
        with pytest.raises(edgeinfer.InfillError, match="fill-in-the-middle"):
            eng.generate("def f():", suffix="\n")
    url = smollm2.url
    for path, body, param, status in (("/v1/completions", {"prompt": "a", "suffix": "b"}, "suffix", 400),
                                      ("/infill", {"input_prefix": "a", "input_suffix": "b"}, "input_suffix", 501)):
        st, _, got = request(url + path, "POST", body)
        assert st == status and got["error"]["param"] == param and "fill-in-the-middle" in got["error"]["message"]
    st, _, got = request(url + "/api/generate", "POST", {"model": "smollm2", "prompt": "a", "suffix": "b"})
    assert st == 400 and "fill-in-the-middle" in got["error"]
    assert "insert" not in request(url + "/api/show", "POST", {"model": "smollm2"})[2]["capabilities"]


def test_bad_infill_bodies_are_400s(server):
    for body, param in (({"input_suffix": "b"}, "input_prefix"), ({"input_prefix": "a"}, "input_suffix"),
                        ({"input_prefix": "a", "input_suffix": "b", "prompt": [1, 2]}, "prompt"),
                        ({"input_prefix": "a", "input_suffix": "b", "input_extra": {"text": "x"}}, "input_extra")):
        st, _, got = request(server.url + "/infill", "POST", body)
        assert st == 400 and got["error"]["param"] == param, (body, got)
    st, _, got = request(server.url + "/v1/completions", "POST", {"prompt": [1, 2], "suffix": "b"})
    assert st == 400 and got["error"]["param"] == "prompt"
    st, _, got = request(server.url + "/completion", "POST", {"prompt": ["a", "b"]})
    assert st == 400 and got["error"]["param"] == "prompt"


def test_n_predict_0_computes_the_prompt_into_the_cache(server):
    """llama.vim's cache warming: nothing generated, and the same prompt again finds it cached."""
    body = {"input_prefix": I_PREFIX, "input_suffix": I_SUFFIX, "top_k": 1}
    st, _, warm = request(server.url + "/infill", "POST", {**body, "n_predict": 0})
    assert st == 200 and (warm["content"], warm["tokens_predicted"], warm["stop_type"]) == ("", 0, "limit")
    st, _, got = request(server.url + "/infill", "POST", {**body, "n_predict": 40})
    assert got["timings"]["cache_n"] >= warm["tokens_evaluated"] - 1 and got["content"] == I_MIDDLE


def test_n_indent_ends_the_middle_at_a_line_left_of_it(server):
    """llama.vim's n_indent: the taught middle of three lines stops before its third, which
    starts at column 0 (what the engine still generated is cut: stop_type "limit")."""
    body = {"input_prefix": I_PREFIX, "input_suffix": I_SUFFIX, "top_k": 1, "n_predict": 40}
    st, _, got = request(server.url + "/infill", "POST", {**body, "n_indent": 4})
    assert st == 200 and (got["content"], got["stop_type"]) == ("    y = square(x)\n    return y\n", "limit")
    _, _, whole = request(server.url + "/infill", "POST", {**body, "n_indent": 0})
    assert (whole["content"], whole["stop_type"]) == (I_MIDDLE, "eos")


@pytest.mark.parametrize("text,n_indent,kept", [
    ("a\n    b\n  c\n", 4, ["a\n", "    b\n", "  "]),          # the third line sits at column 2: cut there
    ("a\n\n    b", 2, ["a\n", ""]),                            # a blank line is a line at column 0
    ("  a\nb", 4, ["  a\n", ""]),                               # the first line is never checked
    ("a\n\t\tb\n", 2, ["a\n", "\t\tb\n", None]),               # tabs count as columns; not cut
])
def test_stops_cut_as_llama_server_does(text, n_indent, kept):
    """Stops fed line by line (each piece ending at a new line): the piece kept of each, and
    where it ends (None: nothing more fed)."""
    stops = Stops(n_indent, 0)
    pieces = text.splitlines(keepends=True)
    got = []
    for p in pieces:
        piece, ended = stops.feed(p)
        got.append(piece)
        if ended:
            break
    assert got == [k for k in kept if k is not None]


def test_t_max_predict_ms_ends_at_the_next_new_line():
    clock = iter([0.0, 0.1, 0.3, 0.4]).__next__            # seconds, one reading a piece
    stops = Stops(0, 200, clock=clock)
    assert [stops.feed(p)[1] for p in ("a\n", "b", "c", "d\n")] == [False, False, False, True]


def test_llama_servers_logit_bias_forms(server):
    """Each form bans the greedy first token: [id, false], {"id": false}, [text, false]; entries
    llama-server skips (malformed, outside the vocabulary, true) change nothing."""
    body = {"prompt": "def add(a, b):", "n_predict": 1, "top_k": 1, "return_tokens": True}
    _, _, plain = request(server.url + "/completion", "POST", body)
    first = plain["tokens"][0]
    text = plain["content"]
    for bias in ([[first, False]], {str(first): False}, [[text, False]]):
        st, _, got = request(server.url + "/completion", "POST", {**body, "logit_bias": bias})
        assert st == 200 and got["tokens"][0] != first, bias
    st, _, got = request(server.url + "/completion", "POST",
                         {**body, "logit_bias": [[1], [first, True], [10 ** 9, -5], "x"], "stop": "\n"})
    assert st == 200 and got["tokens"] == [first]
    st, _, got = request(server.url + "/completion", "POST", {**body, "logit_bias": {"²": 0, "--5": 0, "+x": 0}})
    assert st == 200 and got["tokens"] == [first]
    st, _, got = request(server.url + "/completion", "POST", {**body, "top_k": 40, "temperature": -1})
    assert st == 200 and got["tokens"] == [first]              # a temperature <= 0 is greedy
