"""The LoRA adapters of one engine: named, loaded and unloaded at run time, within a byte budget.

A request names the adapters it runs with (`lora="a"`, `{"a": 0.5}`, or llama.cpp's
`[{"id": 0, "scale": 0.5}]`); the scheduler attaches them to the request's slot, and requests
with different adapters share one batch (native/src/lora.c applies each row's own)."""
from __future__ import annotations

import itertools
import os
import re
import threading
from dataclasses import dataclass
from typing import Any

from ..errors import EdgeInferError
from ..model.lora import AdapterError, LoraWeights, read_gguf_adapter
from .runner import Runner

__all__ = ["Adapters", "AdapterError", "AdapterKey", "UnknownAdapterError", "AdapterBusyError"]

# A request's adapters: ((name, scale), ...) sorted by name, no zero scales; () is the base model.
AdapterKey = tuple[tuple[str, float], ...]
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class UnknownAdapterError(AdapterError):
    """A request named an adapter that is not loaded (HTTP 400 / 404 on the routes)."""


class AdapterBusyError(EdgeInferError):
    """An adapter that running or waiting requests use cannot be unloaded now (HTTP 409)."""


@dataclass
class LoadedAdapter:
    id: int
    name: str
    path: str
    weights: LoraWeights
    handle: object

    def describe(self) -> dict:
        return {"id": self.id, "name": self.name, "path": self.path, "ranks": self.weights.ranks,
                "tensors": len(self.weights.pairs), "bytes": self.weights.nbytes}


def read_adapter(path: str, cfg) -> LoraWeights:
    """A llama.cpp LoRA GGUF, or a PEFT adapter folder (mapped to the base's GGUF names)."""
    if os.path.isdir(path):
        from ..convert.lora import LoraAdapter, adapter_pairs, hparams_from_model
        from ..errors import ConversionError
        try:
            return LoraWeights(path, adapter_pairs(LoraAdapter(path), hparams_from_model(cfg)))
        except ConversionError as e:
            raise AdapterError(str(e)) from None
    if not os.path.isfile(path):
        raise AdapterError(f"adapter not found: {path} (a PEFT folder or a LoRA GGUF file)")
    return read_gguf_adapter(path, cfg)


class Adapters:
    def __init__(self, runner: Runner, cfg, max_bytes: int = 1 << 30):
        self.runner = runner
        self.cfg = cfg
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._by_name: dict[str, LoadedAdapter] = {}
        self._ids = itertools.count()

    @property
    def supported(self) -> bool:
        return self.runner.caps.lora

    def names(self) -> list[str]:
        with self._lock:
            return list(self._by_name)

    def describe(self) -> list[dict]:
        with self._lock:
            return [a.describe() for a in self._by_name.values()]

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(a.weights.nbytes for a in self._by_name.values())

    def load(self, name: str, path: str | os.PathLike) -> dict:
        """Reads, checks and attaches-ready an adapter under `name`; AdapterError says why not."""
        if not self.supported:
            raise AdapterError(f"the {self.runner.caps.device} runtime does not run LoRA adapters apart from "
                               f"the weights; merge the adapter (`edgeinfer convert --lora`) or use the CPU")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise AdapterError(f"adapter name {name!r}: use 1-64 letters, digits, '.', '_' or '-'")
        path = os.fspath(path)
        with self._lock:
            if name in self._by_name:
                raise AdapterError(f"an adapter named {name!r} is already loaded")
        weights = read_adapter(path, self.cfg)
        with self._lock:
            used = sum(a.weights.nbytes for a in self._by_name.values())
            if used + weights.nbytes > self.max_bytes:
                raise AdapterError(f"adapter {name!r} needs {weights.nbytes / 2**20:.1f} MiB; with the "
                                   f"{used / 2**20:.1f} MiB loaded that exceeds the adapters' budget of "
                                   f"{self.max_bytes / 2**20:.0f} MiB")
            with self.runner.lock:
                handle = self.runner.runtime.add_adapter(weights)
            if name in self._by_name:
                raise AdapterError(f"an adapter named {name!r} is already loaded")
            loaded = LoadedAdapter(next(self._ids), name, path, weights, handle)
            self._by_name[name] = loaded
            return loaded.describe()

    def remove(self, name: str) -> None:
        """(the scheduler, once no slot uses it) Forgets the adapter."""
        with self._lock:
            if name not in self._by_name:
                raise UnknownAdapterError(f"no adapter named {name!r} is loaded")
            del self._by_name[name]

    def resolve(self, spec: Any) -> AdapterKey:
        """A request's adapters: None / "" / [] (the base), "name", ["a", "b"], {"a": 0.5}, or a list of
        {"id": N or "name": "a", "scale": s} (llama.cpp's `lora` field)."""
        if spec is None or spec == "" or spec == [] or spec == {}:
            return ()
        if isinstance(spec, str):
            items = [(spec, 1.0)]
        elif isinstance(spec, dict):
            items = list(spec.items())
        elif isinstance(spec, (list, tuple)):
            items = []
            for e in spec:
                if isinstance(e, str):
                    items.append((e, 1.0))
                elif isinstance(e, dict) and ("id" in e or "name" in e):
                    items.append((self._name_of(e), e.get("scale", 1.0)))
                else:
                    raise AdapterError(f"lora entries are names or {{\"id\" or \"name\", \"scale\"}}, got {e!r}")
        else:
            raise AdapterError(f"lora must be a name, a list or a {{name: scale}} object, got {spec!r}")
        key: dict[str, float] = {}
        with self._lock:
            for name, scale in items:
                if name not in self._by_name:
                    raise UnknownAdapterError(f"no adapter named {name!r} is loaded "
                                              f"(loaded: {sorted(self._by_name) or 'none'})")
                if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not -100 <= scale <= 100:
                    raise AdapterError(f"adapter scale must be a number in [-100, 100], got {scale!r}")
                key[name] = key.get(name, 0.0) + float(scale)
        if len(key) > 8:
            raise AdapterError(f"a request may use at most 8 adapters, got {len(key)}")
        return tuple(sorted((n, s) for n, s in key.items() if s != 0.0))

    def _name_of(self, entry: dict) -> str:
        if "name" in entry:
            return str(entry["name"])
        i = entry["id"]
        with self._lock:
            for a in self._by_name.values():
                if a.id == i:
                    return a.name
        raise UnknownAdapterError(f"no adapter with id {i!r} is loaded")

    def handles(self, key: AdapterKey) -> list[tuple[object, float]]:
        with self._lock:
            return [(self._by_name[name].handle, scale) for name, scale in key]
