"""Engine: the one public object apps use (`edgeinfer.load(...)`)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

import numpy as np

from ..backends import Capabilities, KVPlan, backend_for_model, select_backend
from ..errors import ContextOverflowError, EmbeddingError, InvalidTokenError, RerankError, SamplingParamsError
from ..gguf.reader import GGUFFile
from ..model.config import ModelConfig, layer_state_floats, local_ring_cells
from ..model.rank_head import RankHead
from ..text.chat_template import ChatTemplate, is_prefill
from ..text.fim import fim_ids, supports_fim
from ..text.rerank import rerank_ids, rerank_template
from ..text.tokenizer import Tokenizer
from .adapters import Adapters, UnknownAdapterError
from .constraint import check_logit_bias, grammar_spec
from .embedding import Pooler, check_pooling, file_pooling
from .generation import Completion, Generation, TokenLogprob, token_logprobs
from .kv import KVRing, slack_cells
from .reasoning import ReasoningSpec, reasoning_format
from .prompt_cache import PromptCache, model_identity
from .runner import Runner
from .sampling import SamplingParams
from .tool_calls import ToolPlan, plan_tools
from .draft import DraftModel
from .request import Request
from .scheduler import _DEFAULT, Lease, Scheduler
from .speculative import check_mode

log = logging.getLogger("edgeinfer")


class Engine:
    """A loaded model: tokenizer, chat template, native weights and a fixed KV ring.

    Thread-safe: generations from any thread go to one scheduler (engine/scheduler.py)
    that batches them: each step runs one forward over every active slot, and requests
    beyond `n_slots` wait for a free slot. The runner (engine/runner.py) runs every native
    call, under one lock.
    """

    def __init__(self, path: Path, gguf: GGUFFile, cfg: ModelConfig, tokenizer: Tokenizer,
                 template: ChatTemplate, runner: Runner, ring: KVRing, max_queue: int = 256,
                 draft: DraftModel | None = None, speculative: str | None = None, spec_max_slots: int = 2,
                 prompt_cache: PromptCache | None = None, lora_bytes: int = 1 << 30):
        self.path = path
        self.gguf = gguf
        self.config = cfg
        self.tokenizer = tokenizer
        self.template = template
        self.runner = runner
        self.n_ctx = ring.capacity
        self.draft = draft
        # prior for the policy until a draft token is measured: its share of a step's weight reads
        ratio = draft.weight_bytes / max(1, runner.caps.packed_bytes) if draft else 1.0
        self.scheduler = Scheduler(runner, ring, tokenizer, max_queue=max_queue, draft=draft,
                                   speculative=speculative, spec_max_slots=spec_max_slots,
                                   draft_cost_ratio=ratio if ratio > 0 else 1.0, prompt_cache=prompt_cache)
        self.adapters = Adapters(runner, cfg, max_bytes=lora_bytes)
        self.scheduler.adapters = self.adapters
        self.rank_head = RankHead.from_gguf(gguf, cfg.arch, cfg.n_embd)   # None: not a reranker

    @property
    def ring(self) -> KVRing:
        """The KV ring's bookkeeping (owned by the scheduler)."""
        return self.scheduler.ring

    @property
    def caps(self) -> Capabilities:
        """What the runtime can do and what it allocated (device, ISA, KV type and bytes, ...)."""
        return self.runner.caps

    @property
    def thinks(self) -> bool:
        """Whether the chat template has a thinking block (its replies carry `reasoning`)."""
        return reasoning_format(self.template.source) is not None

    @property
    def infills(self) -> bool:
        """Whether the vocabulary has fill-in-the-middle tokens (`generate(..., suffix=...)`)."""
        return supports_fim(self.tokenizer)

    @property
    def reranks(self) -> bool:
        """Whether the file is a reranker: a classification head and a rerank template (`rerank`)."""
        return self.rank_head is not None and rerank_template(self.gguf.metadata) is not None

    @property
    def n_slots(self) -> int:
        """Sequences that run at once (each has a slot of the KV ring)."""
        return self.scheduler.n_slots

    # ------------------------------------------------------------------ serving
    def submit(self, prompt_ids: list[int], params: SamplingParams, sink: Callable[[list], None],
               n_logprobs: int | None = None, t_arrival: float | None = None,
               speculative: str | None | object = _DEFAULT, lora: Any = None) -> Request:
        """Queues a sequence of checked prompt ids; its events (TokenEvent, DoneEvent, ErrorEvent)
        reach `sink(list_of_events)` from the delivery thread; `.cancel()` on the result stops
        it. QueueFullError when the queue is at its bound, SchedulerClosedError while draining,
        closed or failed. `lora`: the LoRA adapters to run with (load_lora; Adapters.resolve's forms)."""
        return self.scheduler.submit(prompt_ids, params, sink, n_logprobs=n_logprobs, t_arrival=t_arrival,
                                     speculative=speculative, adapters=self.adapters.resolve(lora))

    # ------------------------------------------------------------------ adapters
    def load_lora(self, name: str, path: str | Path) -> dict:
        """Loads a LoRA adapter (a PEFT folder or a llama.cpp LoRA GGUF) under `name`, for requests
        that ask for it (`generate(..., lora=name)`); the base weights are shared. AdapterError
        when it does not fit this model (the message names the tensor) or the budget."""
        return self.adapters.load(name, path)

    def unload_lora(self, name: str) -> None:
        """Frees an adapter; AdapterBusyError while requests use it."""
        if name not in self.adapters.names():
            raise UnknownAdapterError(f"no adapter named {name!r} is loaded")
        self.scheduler.unload_adapter(name)

    def lora_adapters(self) -> list[dict]:
        """The loaded adapters: id, name, path, ranks, tensors, bytes."""
        return self.adapters.describe()

    def lease(self) -> ContextManager[Lease]:
        """A slot of its own for teacher-forced stepping (`lease.feed(tokens, out_rows, logits)`),
        empty on the way in and out; waits for a free slot."""
        return self.scheduler.lease_slot()

    def snapshot(self) -> dict:
        """Gauges for /metrics: slots, queue, KV cells in use, steps, speculation counts."""
        return self.scheduler.snapshot()

    def health(self) -> str | None:
        """None while the engine serves; else why it cannot (the error that stopped its loop)."""
        failed = self.scheduler.failed
        return None if failed is None else str(failed)

    def forget_prefixes(self) -> None:
        """Empties the free slots, so that the next request computes its whole prompt (a
        measurement without prefix reuse)."""
        self.scheduler.forget_free_slots()

    def save_slot(self, slot: int, filename: str) -> tuple[int, int]:
        """llama.cpp's slot save: what the free slot holds to `filename`, a plain name inside the
        prompt cache directory; (positions saved, bytes written). CacheFileError for a bad name or
        an empty slot, SlotBusyError for a busy one, SlotFilesUnsupportedError without a cache."""
        return self.scheduler.save_slot(slot, filename)

    def restore_slot(self, slot: int, filename: str) -> tuple[int, int]:
        """The free slot holds what `filename` saved (same model and KV type, intact, else
        CacheFileError); (positions restored, bytes read). A request whose prompt starts with
        them reuses them."""
        return self.scheduler.restore_slot(slot, filename)

    def erase_slot(self, slot: int) -> int:
        """Empties the free slot; the positions it held."""
        return self.scheduler.erase_slot(slot)

    def fix_speculation(self, k: int | None) -> None:
        """Speculating requests propose exactly k tokens every step (a measurement knob), or
        (None) as many as the adaptive policy finds worth it."""
        self.scheduler.policy.fixed_k = k

    def stage_profile(self, reset: bool = False) -> dict[str, float]:
        """Seconds per forward stage (caps.profile_stages) since load or the last reset (a
        measurement knob); {} where the backend does not time its stages."""
        with self.runner.lock:
            return self.runner.runtime.profile(reset)

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: str | Path, n_ctx: int = 2048, n_threads: int | None = None, device: str = "cpu",
             n_slots: int = 1, n_sink: int = 4, overflow: str = "stop", max_batch: int = 256,
             isa: str = "best", max_queue: int = 256, kv_type: str = "f16", draft: str | Path | None = None,
             speculative: str | None = None, spec_max_slots: int = 2,
             prompt_cache: str | Path | None = None, prompt_cache_bytes: int = 4 << 30,
             loras: dict[str, str | Path] | None = None, lora_bytes: int = 1 << 30) -> "Engine":
        """`draft`: a smaller GGUF sharing the vocabulary, for speculative="draft" (its own KV
        ring of n_slots x n_ctx cells). `speculative`: the default of generate/stream/chat
        (None, "lookup", "draft" or "mtp": a Qwen3.5 file's own multi-token-prediction block drafts, CPU
        only; engine/mtp.py); `spec_max_slots`: no speculation while more sequences decode.
        `prompt_cache`: a directory where prompt prefixes' slot states outlive the process (at most
        `prompt_cache_bytes` there, least recently used out; engine/prompt_cache.py).
        `loras`: {name: PEFT folder or LoRA GGUF} adapters to load now (more with load_lora), at most
        `lora_bytes` of them; a request picks them with `lora=`."""
        from ..hub import resolve_model

        check_mode(speculative)
        if speculative == "draft" and draft is None:
            raise ValueError("speculative='draft' needs a draft model (load(..., draft=PATH))")
        if speculative == "mtp" and draft is not None:
            raise ValueError("speculative='mtp' drafts with the model's own MTP block: give no draft=PATH")
        backend = select_backend(device, n_threads=n_threads, isa=isa)   # 'cuda' without a GPU raises
        if not isinstance(n_ctx, int) or n_ctx < 8:
            raise ValueError(f"n_ctx must be an int >= 8, got {n_ctx!r}")
        if not isinstance(n_slots, int) or n_slots < 1:
            raise ValueError(f"n_slots must be an int >= 1, got {n_slots!r}")
        path = Path(resolve_model(str(path)))
        gguf = GGUFFile(path)
        cfg = ModelConfig.from_gguf(gguf)
        backend = backend_for_model(backend, device, cfg, n_threads=n_threads, isa=isa)
        tokenizer = Tokenizer.from_metadata(gguf.metadata)
        template = ChatTemplate.from_metadata(gguf.metadata, tokenizer)
        n_sink = min(n_sink, n_ctx // 4)
        plan = KVPlan(n_slots, n_ctx, n_sink, max_batch, kv_type, slack=slack_cells(overflow, max_batch),
                      n_snapshots=KVPlan.snapshots_for(sum(layer_state_floats(cfg)) * 4))
        ring = KVRing(n_slots, n_ctx, n_sink=n_sink, overflow=overflow, swa_window=cfg.swa_window,
                      local_cells=local_ring_cells(cfg.swa_window, plan.cells, max_batch), slack=plan.slack)
        runtime = backend.create_runtime(gguf, cfg, plan)
        log.info("loaded %s on %s: %s, %d layers, KV arena %.1f MiB (%d slots x %d cells)", path.name,
                 backend.describe(), cfg.arch, cfg.n_layer, runtime.caps.kv_bytes / 2**20, n_slots, n_ctx)
        drafter = None
        if draft is not None:
            drafter = _load_draft(backend, Path(resolve_model(str(draft))), gguf, plan)
        runner = Runner(runtime)
        if speculative == "mtp":
            from .mtp import load_mtp
            drafter = load_mtp(backend, gguf, cfg, plan, runner)
        cache = None
        if prompt_cache is not None:
            cache = PromptCache(prompt_cache, model_identity(path, gguf.data_offset), kv_type,
                                max_bytes=prompt_cache_bytes)
        engine = cls(path, gguf, cfg, tokenizer, template, runner, ring, max_queue=max_queue,
                     draft=drafter, speculative=speculative, spec_max_slots=spec_max_slots, prompt_cache=cache,
                     lora_bytes=lora_bytes)
        try:
            for name, adapter_path in (loras or {}).items():
                engine.load_lora(name, adapter_path)
        except BaseException:
            engine.close()
            raise
        return engine

    # ------------------------------------------------------------------ tokens
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int], skip_special: bool = False) -> str:
        return self.tokenizer.decode(self._check_ids(ids), skip_special=skip_special)

    def _check_ids(self, ids: Sequence[int]) -> list[int]:
        n = self.config.n_vocab
        out = []
        for i in ids:
            if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)) or not 0 <= i < n:
                raise InvalidTokenError(f"token id {i!r} is outside the vocabulary [0, {n})")
            out.append(int(i))
        return out

    def _prompt_ids(self, prompt: str | Sequence[int], suffix: str | None = None) -> list[int]:
        if suffix:
            if not isinstance(prompt, str):
                raise TypeError("a prompt with a suffix must be text (the prefix), not token ids")
            ids = self.infill_ids(prompt, suffix)
        else:
            ids = self.tokenize(prompt) if isinstance(prompt, str) else self._check_ids(prompt)
        self.check_prompt(ids)
        return ids

    def infill_ids(self, prefix: str, suffix: str, *, prompt: str = "",
                   files: Sequence[tuple[str, str]] | None = None, max_tokens: int | None = None) -> list[int]:
        """The prompt ids asking for the text between `prefix` and `suffix` (fill in the middle),
        from the vocabulary's FIM tokens; InfillError when the model has none. With `files`
        ((name, text) pairs, even none), llama.cpp's /infill form: the project's files first,
        `prompt` after the prefix, each part cut to its share of the context, leaving room for
        `max_tokens` (`edgeinfer.text.fim` gives the budget)."""
        return fim_ids(self.tokenizer, prefix, suffix, prompt=prompt, files=files, n_ctx=self.n_ctx,
                       n_predict=max_tokens or 0)

    def check_prompt(self, ids: Sequence[int], max_tokens: int | None = None) -> int:
        """Checks that a prompt of `ids` fits with room to generate, and returns the max_tokens
        to generate with: `max_tokens` when it fits too, else all the room left (n_ctx on a
        sliding ring, which never runs out). ValueError for an empty prompt; ContextOverflowError
        naming both numbers when a ring that stops cannot hold them."""
        n = len(ids)
        if n == 0:
            raise ValueError("the prompt is empty (no tokens)")
        if self.ring.overflow != "stop":
            return self.n_ctx if max_tokens is None else max_tokens
        if max_tokens is None:
            if n >= self.n_ctx:
                raise ContextOverflowError(
                    f"prompt of {n} tokens does not fit the context of {self.n_ctx} "
                    f"(at least one cell must stay free for generation)")
            return self.n_ctx - n
        if n + max_tokens > self.n_ctx:
            raise ContextOverflowError(
                f"this model's context is {self.n_ctx} tokens, but the request needs {n + max_tokens}: "
                f"{n} in the prompt + {max_tokens} to generate (max_tokens)")
        return max_tokens

    # ------------------------------------------------------------------ model calls
    def logits(self, ids: Sequence[int], lora: Any = None) -> np.ndarray:
        """Teacher-forced logits [len(ids), n_vocab] of a fresh sequence (with the LoRA adapters `lora`)."""
        ids = self._check_ids(ids)
        if not ids:
            raise ValueError("logits() needs at least one token")
        if len(ids) > self.n_ctx:
            raise ContextOverflowError(f"{len(ids)} tokens exceed the context of {self.n_ctx}")
        out = np.empty((len(ids), self.config.n_vocab), dtype=np.float32)
        step = self.runner.caps.max_batch
        with self.scheduler.lease_slot(self.adapters.resolve(lora)) as lease:
            for start in range(0, len(ids), step):
                chunk = ids[start:start + step]
                lease.feed(chunk, np.arange(len(chunk), dtype=np.int32), out[start:start + len(chunk)])
        return out

    def prompt_logprobs(self, ids: Sequence[int], n_top: int = 0, lora: Any = None) -> list[TokenLogprob]:
        """Each token of `ids` after the first under the model's distribution given the tokens
        before it (teacher-forced, raw logits at T = 1, as a generation's `logprobs`), with its
        `n_top` most likely alternatives: what an echoed prompt's logprobs report (scoring a text,
        as lm-evaluation-harness does). The logits are kept a chunk at a time, not whole; the
        prompt's cells stay in the slot, so a completion of the same prompt next reuses them."""
        ids = self._check_ids(ids)
        if len(ids) > self.n_ctx:
            raise ContextOverflowError(f"{len(ids)} tokens exceed the context of {self.n_ctx}")
        # rows of logits a chunk: a batch, or fewer where the vocabulary is large (64 MiB at most)
        step = max(1, min(self.runner.caps.max_batch, (64 << 20) // (4 * self.config.n_vocab)))
        rows = np.empty((step, self.config.n_vocab), dtype=np.float32)
        out: list[TokenLogprob] = []
        # all but the last token are fed: its row is not needed, and the slot then holds what a
        # completion of the prompt reuses (it feeds the last token itself)
        with self.scheduler.lease_slot(self.adapters.resolve(lora), keep=True) as lease:
            for start in range(0, len(ids) - 1, step):
                chunk = ids[start:min(start + step, len(ids) - 1)]
                lease.feed(chunk, np.arange(len(chunk), dtype=np.int32), rows[:len(chunk)])
                out += token_logprobs(rows[:len(chunk)], ids[start + 1:start + 1 + len(chunk)], n_top)
        return out

    def embed(self, texts: str | Sequence[str | Sequence[int]], pooling: str | None = None,
              normalize: bool = True) -> np.ndarray:
        """Embeddings [len(texts), n_embd] float32 of a text, or of each item of a list (a text or
        its token ids), as llama.cpp's embedding mode makes them: the hidden states after the
        final norm pooled by `pooling` ("mean", "cls": the first token, "last"; None: the file's
        `{arch}.pooling_type`, else mean), with unit Euclidean length when `normalize`.
        EmbeddingError for no input, an empty one or an unknown pooling; ContextOverflowError
        for one longer than the context."""
        if not self.caps.embeddings:
            raise EmbeddingError(f"the {self.caps.device} backend gives no embeddings")
        pooling = file_pooling(self.gguf.metadata, self.config.arch) if pooling is None else check_pooling(pooling)
        items = [texts] if isinstance(texts, str) else list(texts)
        if not items:
            raise EmbeddingError("embed() needs at least one input")
        seqs = [self.tokenize(t) if isinstance(t, str) else self._check_ids(t) for t in items]
        for i, ids in enumerate(seqs):
            if not ids:
                raise EmbeddingError(f"input {i} is empty (no tokens)")
            if len(ids) > self.n_ctx:
                raise ContextOverflowError(f"input {i} has {len(ids)} tokens, more than the context of {self.n_ctx}")
        out = np.empty((len(seqs), self.config.n_embd), dtype=np.float32)
        step = self.caps.max_batch
        with self.scheduler.lease_slot() as lease:
            for i, ids in enumerate(seqs):
                lease.reset()
                pooler = Pooler(pooling, self.config.n_embd)
                for start in range(0, len(ids), step):
                    pooler.add(lease.feed_hidden(ids[start:start + step]))
                out[i] = pooler.result(normalize)
        return out

    def rerank_ids(self, query: str, document: str, max_doc_tokens: int | None = None,
                   truncate: bool = False) -> list[int]:
        """The prompt ids a reranker scores for one (query, document) pair: the file's rerank
        template with both filled in (edgeinfer.text.rerank), the document cut to its first
        `max_doc_tokens` tokens when given, and with `truncate` to as many as let the prompt fit
        the context; RerankError for a file without a template."""
        template = rerank_template(self.gguf.metadata)
        if max_doc_tokens is None and not truncate:
            return rerank_ids(self.tokenizer, template, query, document)
        doc_ids = self.tokenize(document, add_special=False, parse_special=False)
        keep = len(doc_ids) if max_doc_tokens is None else min(max_doc_tokens, len(doc_ids))
        while True:
            text = document if keep == len(doc_ids) else self.tokenizer.decode(doc_ids[:keep])
            ids = rerank_ids(self.tokenizer, template, query, text)
            if not truncate or len(ids) <= self.n_ctx or keep == 0:
                return ids
            keep = max(0, keep - (len(ids) - self.n_ctx))      # the text's edges may merge: check again

    def rerank(self, query: str, documents: Sequence[str], max_doc_tokens: int | None = None,
               truncate: bool = False) -> np.ndarray:
        """Relevance scores [len(documents)] float32 of each document to `query`, in the documents'
        order, higher meaning more relevant (Qwen3-Reranker's: the probability of "yes", in
        [0, 1]), as llama.cpp's reranking computes them: the classification head on the last token
        of each pair's prompt (`rerank_ids`, with its `max_doc_tokens` and `truncate`). RerankError
        for a model that is not a reranker or no documents; ContextOverflowError for a pair longer
        than the context."""
        if not isinstance(query, str) or isinstance(documents, str):
            raise TypeError("rerank(query, documents) takes a text and a list of texts")
        docs = list(documents)
        if not docs:
            raise RerankError("rerank() needs at least one document")
        self._check_reranker()
        return self.score_prompts([self.rerank_ids(query, d, max_doc_tokens, truncate) for d in docs])

    def score_prompts(self, prompts: Sequence[Sequence[int]]) -> np.ndarray:
        """The classification head's first value [len(prompts)] float32 on the last token of each
        prompt (token ids: `rerank_ids`'); RerankError for a model without a head, an empty
        prompt; ContextOverflowError naming the prompt longer than the context."""
        self._check_reranker()
        seqs = [self._check_ids(p) for p in prompts]
        for i, ids in enumerate(seqs):
            if not ids:
                raise RerankError(f"prompt {i} is empty (no tokens)")
            if len(ids) > self.n_ctx:
                raise ContextOverflowError(f"document {i} makes a prompt of {len(ids)} tokens, more than "
                                           f"the context of {self.n_ctx}")
        out = np.empty(len(seqs), dtype=np.float32)
        step = self.caps.max_batch
        with self.scheduler.lease_slot() as lease:
            for i, ids in enumerate(seqs):
                # the beginning a prompt shares with the one before (the template and the query) is
                # not computed again, where the slot holds it exactly
                for start in range(lease.resume(ids), len(ids), step):
                    hidden = lease.feed_hidden(ids[start:start + step])
                out[i] = self.rank_head.scores(hidden[-1])[0]
        return out

    def _check_reranker(self) -> None:
        if self.rank_head is None:
            raise RerankError(f"{self.path.name} is not a reranker (it has no classification head "
                              f"'cls.output.weight')")
        if not self.caps.embeddings:
            raise RerankError(f"the {self.caps.device} backend gives no hidden states to rerank with")

    def generate(self, prompt: str | Sequence[int], *, suffix: str | None = None, **params: Any) -> Completion:
        """Runs to the end. `logprobs=N` (extension) also returns, per token, its log-probability
        and the N most likely alternatives in `Completion.logprobs`. Structured output (at most
        one): `response_format={"type": "json_object"}` or `{"type": "json_schema", "json_schema":
        {"schema": {...}}}`, `json_schema={...}`, `regex="..."`, `grammar="<Lark or GBNF>"`;
        the output follows it and ends (finish_reason "stop") where it is complete.
        `logit_bias={token_id: bias in [-100, 100]}` as OpenAI's. With `suffix`, a code model
        fills in the text between the prompt and the suffix (`infill_ids`), control tokens giving
        no text."""
        return self._generation(self._prompt_ids(prompt, suffix), _infill_params(suffix, params)).result()

    def stream(self, prompt: str | Sequence[int], *, suffix: str | None = None, **params: Any) -> Generation:
        """Iterates over text pieces as they are generated (never half a UTF-8 character)."""
        return self._generation(self._prompt_ids(prompt, suffix), _infill_params(suffix, params))

    def chat(self, messages: list[dict], tools: list[dict] | None = None, tool_choice: Any = None, *,
             chat_template_kwargs: dict | None = None, enable_thinking: bool | None = None,
             **params: Any) -> Completion:
        """A chat reply. On a template with a thinking block (Qwen3's <think>), the block's text is
        in `Completion.reasoning_content`, apart from `text`; `reasoning_budget=N` closes the
        block after N tokens (the engine writes its closing marker) and the answer follows.
        With `tools` (OpenAI's function list) and `tool_choice` ("auto", "none",
        "required", {"type": "function", "function": {"name": ...}}), a reply that calls
        functions has them in `Completion.tool_calls` and finish_reason "tool_calls".
        chat_template_kwargs are extra variables of the chat template; enable_thinking (Qwen3's
        switch) is one of them."""
        return self.stream_chat(messages, tools=tools, tool_choice=tool_choice,
                                chat_template_kwargs=chat_template_kwargs, enable_thinking=enable_thinking,
                                **params).result()

    def stream_chat(self, messages: list[dict], tools: list[dict] | None = None, tool_choice: Any = None, *,
                    chat_template_kwargs: dict | None = None, enable_thinking: bool | None = None,
                    **params: Any) -> Generation:
        """As `chat`, streamed: iterates over the reply's text (with tools, a call's raw text);
        once it ends, `Generation.tool_calls` holds the calls it made (None: none)."""
        kw = _template_kwargs(chat_template_kwargs, enable_thinking)
        params = dict(params)
        budget = params.pop("reasoning_budget", None)
        if tools is None:
            ids = self._prompt_ids(self.chat_ids(messages, **kw))
            return self._generation(ids, {**params, "reasoning": self.reasoning_spec(ids, budget)})
        plan = self.tool_plan(messages, tools, tool_choice)
        ids = self._prompt_ids(self.chat_ids(plan.messages, **{**kw, **plan.render_extra}))
        if plan.spec is not None:   # the grammar ends a forced call; a stop string must not cut it
            params = {**params, "grammar": plan.spec, "stop": []}
        return self._generation(ids, {**params, "reasoning": self.reasoning_spec(ids, budget)},
                                parse_calls=plan.parse)

    def reasoning_spec(self, prompt_ids: Sequence[int], budget: int | None = None) -> ReasoningSpec | None:
        """The thinking block of a reply to the chat prompt `prompt_ids` (SamplingParams'
        `reasoning`): None when the template has none; `budget`: the most tokens it may hold."""
        fmt = reasoning_format(self.template.source)
        if fmt is None:
            return None
        try:
            return ReasoningSpec.for_prompt(fmt, self.tokenize(fmt.start, add_special=False),
                                            self.tokenize(fmt.end, add_special=False), prompt_ids, budget,
                                            [self.tokenize(m, add_special=False) for m in fmt.also_ends])
        except ValueError as e:
            raise SamplingParamsError(str(e)) from None

    def tool_plan(self, messages: list[dict], tools: Any, tool_choice: Any = None) -> ToolPlan:
        """How a chat with `tools` is prompted (`plan.messages`, `plan.render_extra` for
        chat_ids), constrained (`plan.spec`: generate's `grammar=`) and read back (`plan.parse`)."""
        return plan_tools(self.template.source, messages, tools, tool_choice)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            continue_final: bool = False, **extra: Any) -> str:
        """The chat's prompt text; `extra` are more template variables (e.g. enable_thinking).
        continue_final: the last (assistant) message is left open for the reply to continue."""
        return self.template.render(messages, add_generation_prompt=add_generation_prompt,
                                    continue_final=continue_final, **extra)

    def chat_ids(self, messages: list[dict], **extra: Any) -> list[int]:
        """The prompt ids of a chat. The template writes BOS itself where the model wants it;
        special tokens are parsed. A chat that ends with an assistant message with text is a
        prefill: the prompt stops at the end of that text, and the reply continues it. Messages
        longer than any prompt may render to are a ContextOverflowError, not a template failure."""
        size = _content_chars(messages)
        limit = self.template.max_output_chars
        if size > limit:
            raise ContextOverflowError(
                f"the messages hold {size:,} characters, more than a chat prompt may render to "
                f"({limit:,}) and far more than the context of {self.n_ctx} tokens")
        return self.tokenize(self.apply_chat_template(messages, continue_final=is_prefill(messages), **extra),
                             add_special=False)

    def _generation(self, ids: list[int], params: dict, parse_calls=None) -> Generation:
        params = dict(params)
        submit_kw = {"speculative": check_mode(params.pop("speculative"))} if "speculative" in params else {}
        submit_kw["adapters"] = self.adapters.resolve(params.pop("lora", None))
        n_logprobs = params.pop("logprobs", None)
        if n_logprobs is not None and (isinstance(n_logprobs, bool) or not isinstance(n_logprobs, int)
                                       or n_logprobs < 0):
            raise SamplingParamsError(f"logprobs must be an int >= 0 (alternatives per token), got {n_logprobs!r}")
        spec = grammar_spec(response_format=params.pop("response_format", None),
                            json_schema=params.pop("json_schema", None),
                            grammar=params.pop("grammar", None), regex=params.pop("regex", None))
        if spec is not None:
            params["grammar"] = spec
        if params.get("logit_bias") is not None:
            params["logit_bias"] = check_logit_bias(params["logit_bias"], self.config.n_vocab)
        return Generation(self.scheduler, ids, SamplingParams.from_dict(params), n_logprobs=n_logprobs,
                          parse_calls=parse_calls, **submit_kw)

    # ------------------------------------------------------------------ info
    def info(self) -> dict:
        cfg = self.config
        caps = self.runner.caps
        types: dict[str, int] = {}
        n_params = 0
        for t in self.gguf.tensors.values():
            types[t.type_name] = types.get(t.type_name, 0) + 1
            n_params += t.n_elements
        return {
            "path": str(self.path), "arch": cfg.arch, "name": self.gguf.metadata.get("general.name", ""),
            "n_params": n_params, "file_bytes": self.path.stat().st_size, "tensor_types": types,
            "n_layer": cfg.n_layer, "n_embd": cfg.n_embd, "n_head": cfg.n_head, "n_head_kv": cfg.n_head_kv,
            "n_ff": cfg.n_ff, "n_vocab": cfg.n_vocab, "n_ctx_train": cfg.n_ctx_train, "n_ctx": self.n_ctx,
            "n_slots": self.ring.n_slots, "n_sink": self.ring.n_sink, "overflow": self.ring.overflow,
            "kv_bytes": caps.kv_bytes, "kv_type": caps.kv_type, "scratch_bytes": caps.scratch_bytes,
            # hybrids: the recurrent layers' states, apart from the ring (live + kept copies per slot)
            "state_bytes": caps.state_bytes, "state_snapshots": caps.max_snapshots,
            "packed_weight_bytes": caps.packed_bytes, "device_weight_bytes": caps.device_bytes,
            "n_threads": caps.n_threads, "isa": caps.isa, "device": caps.device,
            "tokenizer": self.gguf.metadata.get("tokenizer.ggml.model", ""),
            "fill_in_middle": self.infills,
            "reranker": self.reranks,
            # sliding-window layers: the window, and the cells per slot of their own KV ring (0: full ring)
            **({"sliding_window": cfg.swa_window, "local_layers": sum(map(cfg.is_local_layer, range(cfg.n_layer))),
                "local_kv_cells": self.ring.local_cells}
               if cfg.swa_window else {}),
            # a draft model or the MTP block (speculative "draft" / "mtp"): its own KV ring and weights
            **({"draft": self.draft.mode, "draft_kv_bytes": self.draft.runner.caps.kv_bytes,
                "draft_packed_weight_bytes": self.draft.runner.caps.packed_bytes}
               if self.draft is not None else {}),
        }

    def close(self) -> None:
        """Cancels running generations and frees native memory now rather than at garbage collection."""
        self.scheduler.close()
        self.runner.close()
        if self.draft is not None:
            self.draft.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _infill_params(suffix: str | None, params: dict) -> dict:
    """A fill in the middle's parameters: the code comes without control tokens' text."""
    return {"skip_special": True, **params} if suffix else params


def _content_chars(messages: Any) -> int:
    """Characters of text content in a chat (malformed messages count 0: the template's
    validation names them)."""
    if not isinstance(messages, list):
        return 0
    return sum(len(m["content"]) for m in messages if isinstance(m, dict) and isinstance(m.get("content"), str))


def _template_kwargs(kwargs: dict | None, enable_thinking: bool | None) -> dict:
    """The extra chat-template variables of a chat call: chat_template_kwargs plus the
    enable_thinking switch (which wins when both name it)."""
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"chat_template_kwargs must be a dict, got {type(kwargs).__name__}")
    out = dict(kwargs or {})
    if enable_thinking is not None:
        out["enable_thinking"] = bool(enable_thinking)
    return out


def _load_draft(backend, path: Path, target: GGUFFile, plan: KVPlan) -> DraftModel:
    """The draft model of speculative decoding: its own runtime and a KV ring like the model's
    (one that slides when the model's does). Its vocabulary must be the target's, token for token."""
    gguf = GGUFFile(path)
    cfg = ModelConfig.from_gguf(gguf)
    if list(gguf.metadata.get("tokenizer.ggml.tokens") or []) != list(target.metadata.get("tokenizer.ggml.tokens") or []):
        raise ValueError(f"the draft model {path.name} does not share the model's vocabulary")
    runtime = backend.create_runtime(gguf, cfg, plan)
    log.info("draft model %s: %s, %d layers", path.name, cfg.arch, cfg.n_layer)
    return DraftModel(Runner(runtime), KVRing(plan.n_slots, plan.n_ctx, n_sink=plan.n_sink,
                                              overflow="slide" if plan.slack else "stop", swa_window=cfg.swa_window,
                                              local_cells=local_ring_cells(cfg.swa_window, plan.cells, plan.max_batch),
                                              slack=plan.slack))

