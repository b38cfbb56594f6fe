#!/usr/bin/env python3
"""Reranking throughput: documents scored a second by edgeinfer (Engine.score_prompts) and by
llama.cpp's rank pooling (llama-cpp-python, flash attention on, one pair a decode as llama-server
runs one slot), on the same reranker GGUF and the same prompt ids, rounds interleaved. edgeinfer
computes the prompts' shared beginning (template and query) once a request; llama-server does not
(a rerank task reuses no cache), and neither does the peer here.

    python scripts/rerank_bench.py RERANKER.gguf [--docs 16] [--doc-tokens 200] [--rounds 3] [--threads 2]

A reranker at a real shape with random weights: `python scripts/make_shape_model.py
qwen3-reranker-0.6b --types Q8_0,Q4_K_M` (values do not change speed). The scores of the two
engines are compared too (their largest difference is printed), so a fast wrong head would show."""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import edgeinfer

QUERY = "Which lighthouse keepers kept a diary of the storms they saw, and where are the diaries now?"
TEXT = ("The lighthouse stood on a rock a mile from the shore, and its keepers wrote down every storm: the "
        "height of the waves, the hour the lamp was lit, the ships that passed and the ones that did not. "
        "In 1953 the station was automated and the diaries went to the county archive, where a fire in 1971 "
        "took some of them; the rest are kept in the maritime museum, box 14 to box 22. ")


def documents(eng, n: int, n_tokens: int) -> list[str]:
    """`n` distinct documents of `n_tokens` tokens each (cut from the text, a different start each)."""
    ids = eng.tokenize(TEXT * (2 + n_tokens // 40), add_special=False, parse_special=False)
    return [eng.detokenize(ids[k * 7:k * 7 + n_tokens]) for k in range(n)]


class LlamaRank:
    def __init__(self, path: str, threads: int, n_ctx: int):
        import llama_cpp
        self.lc = llama_cpp
        self.llm = llama_cpp.Llama(model_path=path, embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_RANK,
                                   n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=threads,
                                   n_threads_batch=threads, flash_attn=True, verbose=False)

    def scores(self, prompts: list[list[int]]) -> np.ndarray:
        llm, out = self.llm, []
        for ids in prompts:
            llm._ctx.kv_cache_clear()
            for start in range(0, len(ids), 512):
                llm._batch.reset()
                llm._batch.add_sequence(ids[start:start + 512], 0, True)
                for i in range(llm._batch.batch.n_tokens):          # positions continue across chunks
                    llm._batch.batch.pos[i] = start + i
                llm._ctx.decode(llm._batch)
            out.append(self.lc.llama_get_embeddings_seq(llm._ctx.ctx, 0)[0])
        return np.array(out, dtype=np.float32)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--docs", type=int, default=16)
    ap.add_argument("--doc-tokens", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    n_ctx = a.doc_tokens + 256
    eng = edgeinfer.load(a.model, n_ctx=n_ctx, n_threads=a.threads, max_batch=512)
    prompts = [eng.rerank_ids(QUERY, d) for d in documents(eng, a.docs, a.doc_tokens)]
    n_tok = sum(map(len, prompts))
    peer = LlamaRank(a.model, a.threads, n_ctx)
    runs = {"edgeinfer": lambda: eng.score_prompts(prompts), "llama.cpp": lambda: peer.scores(prompts)}
    shared = len(os.path.commonprefix(prompts))
    print(f"{a.model}: {a.docs} documents, {n_tok / a.docs:.0f} prompt tokens each ({shared} of them the shared "
          f"template and query), {a.threads} threads")
    got = {k: f() for k, f in runs.items()}             # warm-up, and the two engines' scores
    print(f"  largest score difference: {np.abs(got['edgeinfer'] - got['llama.cpp']).max():.2e}")
    rates: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(a.rounds):
        for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            t0 = time.perf_counter()
            runs[name]()
            dt = time.perf_counter() - t0
            rates[name].append(a.docs / dt)
            print(f"  round {r + 1} {name}: {a.docs / dt:.2f} documents/s ({n_tok / dt:.0f} tokens/s)")
    med = {k: statistics.median(v) for k, v in rates.items()}
    ratios = [x / y for x, y in zip(rates["edgeinfer"], rates["llama.cpp"])]
    print(f"median documents/s: edgeinfer {med['edgeinfer']:.2f}, llama.cpp {med['llama.cpp']:.2f}; "
          f"ratio {statistics.median(ratios):.2f}x (rounds {', '.join(f'{x:.2f}' for x in ratios)})")
    eng.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
