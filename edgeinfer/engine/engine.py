"""Engine: the one public object apps use (`edgeinfer.load(...)`)."""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import ContextOverflowError, InvalidTokenError, SamplingParamsError, UnsupportedTypeError
from ..gguf.reader import GGUFFile
from ..model.config import ModelConfig
from ..model.native_model import NativeModel
from ..backends.cpu import NativeRuntime
from ..text.chat_template import ChatTemplate
from .generation import Completion, Generation
from .kv import KVRing
from .scheduler import Scheduler
from .sampling import SamplingParams
from ..text.tokenizer import Tokenizer

log = logging.getLogger("edgeinfer")

DEVICES = ("cpu", "auto", "cuda")


class Engine:
    """A loaded model: tokenizer, chat template, native weights and a fixed KV ring.

    Thread-safe: generations from any thread go to one scheduler (engine/scheduler.py)
    that batches them: each step runs one native forward over every active slot, and
    requests beyond `n_slots` wait for a free slot. Every native call runs under one lock.
    """

    def __init__(self, path: Path, gguf: GGUFFile, cfg: ModelConfig, tokenizer: Tokenizer,
                 template: ChatTemplate, runtime: NativeRuntime, ring: KVRing, max_queue: int = 256):
        self.path = path
        self.gguf = gguf
        self.config = cfg
        self.tokenizer = tokenizer
        self.template = template
        self.runtime = runtime
        self.ring = ring
        self.n_ctx = ring.capacity
        self._step_lock = threading.RLock()
        self.scheduler = Scheduler(self, max_queue=max_queue)

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: str | Path, n_ctx: int = 2048, n_threads: int | None = None, device: str = "cpu",
             n_slots: int = 1, n_sink: int = 4, overflow: str = "stop", max_batch: int = 256,
             isa: str = "best", max_queue: int = 256, kv_type: str = "f16") -> "Engine":
        from ..hub import resolve_model

        if device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
        from ..backends.cuda import CudaRuntime, select_device
        backend, dev = select_device(device)   # device='cuda' without a usable GPU raises EdgeInferError
        if not isinstance(n_ctx, int) or n_ctx < 8:
            raise ValueError(f"n_ctx must be an int >= 8, got {n_ctx!r}")
        if not isinstance(n_slots, int) or n_slots < 1:
            raise ValueError(f"n_slots must be an int >= 1, got {n_slots!r}")
        path = Path(resolve_model(str(path)))
        gguf = GGUFFile(path)
        cfg = ModelConfig.from_gguf(gguf)
        tokenizer = Tokenizer.from_metadata(gguf.metadata)
        template = ChatTemplate.from_metadata(gguf.metadata, tokenizer)
        native = NativeModel(gguf, cfg)
        if backend == "cuda" and kv_type != "f16":
            raise UnsupportedTypeError(f"kv_type={kv_type!r}: the CUDA backend keeps an f16 KV arena")
        if backend == "cuda":   # weights go to the device; on integrated memory drop the host pages
            runtime = CudaRuntime(gguf, cfg, n_slots=n_slots, n_ctx=n_ctx, max_batch=max_batch, device=dev,
                                  drop_host_pages=dev.integrated)
        else:
            runtime = NativeRuntime(native, n_threads=n_threads, n_slots=n_slots, n_ctx=n_ctx,
                                    n_sink=min(n_sink, n_ctx // 4), max_batch=max_batch, isa=isa,
                                    drop_packed_source=True,   # the kernels read their packed copy
                                    kv_type=kv_type)
        ring = KVRing(n_slots, n_ctx, n_sink=min(n_sink, n_ctx // 4), overflow=overflow)
        log.info("loaded %s: %s, %d layers, KV arena %.1f MiB (%d slots x %d cells)", path.name, cfg.arch,
                 cfg.n_layer, runtime.kv_bytes / 2**20, n_slots, n_ctx)
        return cls(path, gguf, cfg, tokenizer, template, runtime, ring, max_queue=max_queue)

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

    def _prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        ids = self.tokenize(prompt) if isinstance(prompt, str) else self._check_ids(prompt)
        self.check_prompt(ids)
        return ids

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
    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Teacher-forced logits [len(ids), n_vocab] of a fresh sequence."""
        ids = self._check_ids(ids)
        if not ids:
            raise ValueError("logits() needs at least one token")
        if len(ids) > self.n_ctx:
            raise ContextOverflowError(f"{len(ids)} tokens exceed the context of {self.n_ctx}")
        out = np.empty((len(ids), self.config.n_vocab), dtype=np.float32)
        with self._slot_for([]) as slot:
            self._reset_slot(slot)
            for start in range(0, len(ids), self.runtime.max_batch):
                chunk = ids[start:start + self.runtime.max_batch]
                self._step(slot, chunk, out_rows=np.arange(len(chunk), dtype=np.int32),
                           logits=out[start:start + len(chunk)])
            self._reset_slot(slot)
        return out

    def generate(self, prompt: str | Sequence[int], **params: Any) -> Completion:
        """Runs to the end. `logprobs=N` (extension) also returns, per token, its log-probability
        and the N most likely alternatives in `Completion.logprobs`."""
        return self._generation(self._prompt_ids(prompt), params).result()

    def stream(self, prompt: str | Sequence[int], **params: Any) -> Generation:
        """Iterates over text pieces as they are generated (never half a UTF-8 character)."""
        return self._generation(self._prompt_ids(prompt), params)

    def chat(self, messages: list[dict], **params: Any) -> Completion:
        return self.generate(self.chat_ids(messages), **params)

    def stream_chat(self, messages: list[dict], **params: Any) -> Generation:
        return self.stream(self.chat_ids(messages), **params)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return self.template.render(messages, add_generation_prompt=add_generation_prompt)

    def chat_ids(self, messages: list[dict]) -> list[int]:
        """The prompt ids of a chat. The template writes BOS itself where the model wants it;
        special tokens are parsed."""
        return self.tokenize(self.apply_chat_template(messages), add_special=False)

    def _generation(self, ids: list[int], params: dict) -> Generation:
        params = dict(params)
        n_logprobs = params.pop("logprobs", None)
        if n_logprobs is not None and (isinstance(n_logprobs, bool) or not isinstance(n_logprobs, int)
                                       or n_logprobs < 0):
            raise SamplingParamsError(f"logprobs must be an int >= 0 (alternatives per token), got {n_logprobs!r}")
        return Generation(self.scheduler, ids, SamplingParams.from_dict(params), n_logprobs=n_logprobs)

    # ------------------------------------------------------------------ info
    def info(self) -> dict:
        cfg = self.config
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
            "kv_bytes": self.runtime.kv_bytes, "kv_type": getattr(self.runtime, "kv_type", "f16"), "scratch_bytes": self.runtime.scratch_bytes,
            "packed_weight_bytes": getattr(self.runtime, "packed_bytes", 0),
            "n_threads": self.runtime.n_threads, "isa": self.runtime.isa_name,
            "device": getattr(self.runtime, "device_kind", "cpu"),
            "tokenizer": self.gguf.metadata.get("tokenizer.ggml.model", ""),
        }

    def close(self) -> None:
        """Cancels running generations and frees native memory now rather than at garbage collection."""
        sched = getattr(self, "scheduler", None)
        if sched is not None:
            sched.close()
        self.runtime = None  # type: ignore[assignment]

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ slots and steps
    def _slot_for(self, prompt_ids: list[int]):
        """A slot taken from the scheduler for direct stepping (context manager)."""
        return self.scheduler.lease_slot()

    def _reset_slot(self, slot: int) -> None:
        with self._step_lock:
            self.ring.truncate(slot, 0)
            self.runtime.clear_slot(slot)

    def _step(self, slot: int, tokens: list[int], out_rows: np.ndarray, logits: np.ndarray | None = None) -> np.ndarray:
        with self._step_lock:
            pos, cells = self.ring.reserve(slot, tokens)
            n = len(tokens)
            return self.runtime.forward(np.asarray(tokens, dtype=np.int32), np.full(n, slot, dtype=np.int32),
                                        pos, cells, out_rows, logits)
