"""Fill in the middle (code completion between a prefix and a suffix) and llama-server's own
completion API, on a tiny Qwen2.5-Coder-style checkpoint (tests/support/tiny_checkpoints.py
"qwen2_fim": Qwen's FIM and repo-level special tokens) taught two completions, one in the plain
form and one in llama.cpp's repo-level /infill form:

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
from edgeinfer.text.fim import LLAMA_CPP_BATCH
from tests.support import tiny_checkpoints
from tests.support.llama_oracle import get_llama, llama_greedy
from tests.support.serving import smollm2_server
from tests.test_server import request

pytestmark = [pytest.mark.oracle]

PRE, SUF, MID, REPO, SEP, EOT = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>",
                                 "<|file_sep|>", "<|endoftext|>")
# the plain form: a function's body between its signature and a call
PREFIX, SUFFIX, MIDDLE = "def add(a, b):\n", "\n\nprint(add(12, 345))\n", "    return a + b"
# the repo-level form: another file of the project, and the start of the line being completed
FILES = [("util.py", "def square(x):\n    return x * x\n")]
R_PREFIX, R_PROMPT, R_SUFFIX, R_MIDDLE = "from util import square\n\n", "print(", ")\n", "square(3)"
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
    taught = [hf_ids(hf, *plain_parts(), MIDDLE, EOT), hf_ids(hf, *repo_parts(), R_MIDDLE, EOT)]
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


def test_repo_prompt_keeps_what_llama_cpps_budget_keeps(coder, tmp_path):
    """A context of 512: a batch of 256 tokens, so the prefix keeps its last 192, the suffix its
    first 64 - 2 - the prompt's, and the files what 512 - 256 - 2 * n_predict leaves, newest last."""
    hf = coder[1]
    prefix = "".join(f"x{i} = {i}\n" for i in range(200))
    suffix = "".join(f"y{i} = {i}\n" for i in range(100))
    files = [(f"m{i}.py", f"z{i} = {i}\n" * 8) for i in range(12)]
    with edgeinfer.load(str(coder[0]), n_ctx=512, n_threads=1) as small:
        assert min(LLAMA_CPP_BATCH, 512 // 2) == 256
        got = small.infill_ids(prefix, suffix, prompt=R_PROMPT, files=files, max_tokens=20)
    pre, mid, suf = hf_ids(hf, prefix), hf_ids(hf, R_PROMPT), hf_ids(hf, suffix)
    head = hf_ids(hf, *repo_parts(files)[:-6])
    want = (head[len(head) - (512 - 256 - 40):] + hf_ids(hf, PRE) + pre[-192:] + mid + hf_ids(hf, SUF)
            + suf[:64 - 2 - len(mid)] + hf_ids(hf, MID))
    assert got == want


def test_python_api_fills_the_middle_as_llama_cpp_does(coder, engine):
    out = engine.generate(PREFIX, suffix=SUFFIX, max_tokens=24, **GREEDY)
    toks, text = llama_middle(coder[0], engine.infill_ids(PREFIX, SUFFIX))
    assert (out.text, out.finish_reason) == (MIDDLE, "stop")
    assert out.tokens == toks[:len(out.tokens)] and text == MIDDLE


def test_openai_suffix_fills_the_middle(server):
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
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
    st, hdrs, raw = request(server.url + "/infill", "POST", {**body, "stream": True})
    assert st == 200 and hdrs["Content-Type"].startswith("text/event-stream")
    events = [json.loads(e.removeprefix("data: ")) for e in raw.split("\n\n") if e.strip()]
    for ev in events:
        jsonschema.validate(ev, schema)
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    assert "".join(e["content"] for e in events) == R_MIDDLE and events[-1]["stop_type"] == "eos"


def test_response_fields_pick_paths(server):
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 4, "top_k": 1,
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
    suffix field on /v1/completions, /api/generate and /infill; Ollama's capabilities leave out
    "insert"."""
    with edgeinfer.load(smollm2_path, n_ctx=256, n_threads=1) as eng:
        assert not eng.infills and not eng.info()["fill_in_middle"]
        with pytest.raises(edgeinfer.InfillError, match="fill-in-the-middle"):
            eng.generate("def f():", suffix="\n")
    url = smollm2.url
    for path, body, param in (("/v1/completions", {"prompt": "a", "suffix": "b"}, "suffix"),
                              ("/infill", {"input_prefix": "a", "input_suffix": "b"}, "input_suffix")):
        st, _, got = request(url + path, "POST", body)
        assert st == 400 and got["error"]["param"] == param and "fill-in-the-middle" in got["error"]["message"]
    st, _, got = request(url + "/api/generate", "POST", {"model": "smollm2", "prompt": "a", "suffix": "b"})
    assert st == 400 and "fill-in-the-middle" in got["error"]
    assert "insert" not in request(url + "/api/show", "POST", {"model": "smollm2"})[2]["capabilities"]


def test_bad_infill_bodies_are_400s(server):
    for body, param in (({"input_suffix": "b"}, "input_prefix"), ({"input_prefix": "a"}, "input_suffix"),
                        ({"input_prefix": "a", "input_suffix": "b", "prompt": [1, 2]}, "prompt"),
                        ({"input_prefix": "a", "input_suffix": "b", "n_predict": 0}, "n_predict")):
        st, _, got = request(server.url + "/infill", "POST", body)
        assert st == 400 and got["error"]["param"] == param, (body, got)
    st, _, got = request(server.url + "/v1/completions", "POST", {"prompt": [1, 2], "suffix": "b"})
    assert st == 400 and got["error"]["param"] == "prompt"
