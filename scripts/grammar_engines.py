"""Measures the two grammar engines (llguidance, xgrammar) on our vocabularies.

For each vocabulary (SmolLM2's 49,152 tokens through edgeinfer's tokenizer, and a synthetic
262,144-token byte-level one built from it) and each engine: the tokenizer setup time, the
compile time of a JSON schema, and the per-token mask time over a valid document forced
token by token. Run: EI_NO_HOOK=1 PYTHONPATH=$PWD python scripts/grammar_engines.py
"""
from __future__ import annotations

import json
import os
import random
import sys
import time

import numpy as np

from edgeinfer.engine import constraint as C
from edgeinfer.text.tokenizer import Tokenizer

SCHEMA = {"type": "object", "additionalProperties": False,
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                         "email": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
                         "address": {"type": "object", "additionalProperties": False,
                                     "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                                     "required": ["city", "zip"]}},
          "required": ["name", "age", "email", "tags", "address"]}
DOC = json.dumps({"name": "Ada Lovelace", "age": 36, "email": "ada@example.org",
                  "tags": ["math", "engines", "poetry"],
                  "address": {"city": "London", "zip": "W1 2AB"}}, separators=(", ", ": "))


def vocabularies():
    tok = Tokenizer.from_gguf(os.path.expanduser("~/.cache/edgeinfer/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    w = C._Wrapper(tok)
    small = list(w.tokens)
    ids = tok.encode(DOC, add_special=False)
    yield "SmolLM2 49,152", small, sorted(tok.eog_ids), ids, w
    rng = random.Random(0)
    normal = [t for t in small if t and not t.startswith(b"\xff")]
    seen = set(small)
    big = list(small)
    while len(big) < 262_144:
        t = rng.choice(normal) + rng.choice(normal)
        if t not in seen:
            seen.add(t)
            big.append(t)
    yield "synthetic 262,144", big, sorted(tok.eog_ids), ids, None


def bench_llg(tokens, eos, ids, wrapper):
    import llguidance as ll

    class W:
        eos_token_id = eos[0]
        bos_token_id = None
        special_token_ids = [i for i, t in enumerate(tokens) if t.startswith(b"\xff")]

        def __init__(self):
            self.tokens = tokens

        def __call__(self, s):
            return wrapper(s) if wrapper else []

    t0 = time.perf_counter()
    lt = ll.LLTokenizer(ll.TokenizerWrapper(W()), eos_token=eos)
    t1 = time.perf_counter()
    g = ll.LLMatcher.grammar_from_json_schema(SCHEMA, overrides=C._JSON_OPTS)
    m = ll.LLMatcher(lt, g, log_level=0)
    mask = np.zeros((len(tokens) + 31) // 32, dtype=np.int32)
    m.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)   # the first mask builds the lexer
    t2 = time.perf_counter()
    ts = []
    for t in ids:
        m.consume_token(t)
        a = time.perf_counter()
        m.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        ts.append(time.perf_counter() - a)
    assert m.is_stopped() or m.is_accepting(), m.get_error()
    return t1 - t0, t2 - t1, ts


def bench_xgr(tokens, eos, ids, wrapper):
    import xgrammar as xg
    import torch  # noqa: F401  (xgrammar's bitmask is a torch tensor)

    t0 = time.perf_counter()
    info = xg.TokenizerInfo(tokens, vocab_type=xg.VocabType.RAW, vocab_size=len(tokens), stop_token_ids=eos)
    comp = xg.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    t1 = time.perf_counter()
    cg = comp.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False, separators=(", ", ": "))
    m = xg.GrammarMatcher(cg)
    bm = xg.allocate_token_bitmask(1, len(tokens))
    m.fill_next_token_bitmask(bm)
    t2 = time.perf_counter()
    ts = []
    for t in ids:
        assert m.accept_token(t), t
        a = time.perf_counter()
        m.fill_next_token_bitmask(bm)
        ts.append(time.perf_counter() - a)
    return t1 - t0, t2 - t1, ts


def main():
    engines = [("llguidance", bench_llg)]
    try:   # not a dependency of edgeinfer (it pulls torch and triton): measured where installed
        import xgrammar  # noqa: F401
        engines.append(("xgrammar", bench_xgr))
    except ImportError:
        print("xgrammar is not installed: measuring llguidance only")
    print("| vocabulary | engine | tokenizer setup (s) | schema compile + first mask (ms) | mask per token: median / max (us) |")
    print("|---|---|---|---|---|")
    for name, tokens, eos, ids, wrapper in vocabularies():
        for ename, fn in engines:
            setup, comp, ts = fn(tokens, eos, ids, wrapper)
            ts = np.array(ts) * 1e6
            print(f"| {name} | {ename} | {setup:.2f} | {comp * 1e3:.1f} | {np.median(ts):.0f} / {ts.max():.0f} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
