"""The prompt cache that outlives the process: prefixes' slot states on disk, and in host RAM.

An entry is a prompt prefix (its token ids) and the runtime's state of a slot that holds exactly
those positions (Runtime.save_slot: the KV cells as the arena keeps them and, for a hybrid model,
the recurrent state after them). On disk each entry is one file:

    header (HEADER: magic, format version, model identity, KV type, n tokens, payload bytes,
            CRC-32 of the tokens and the payload)
    n int32 token ids
    payload

A file is loaded only when its magic, version, identity (a digest of the GGUF's header and a
sample of its tensor data) and KV type match this engine and its CRC is right; anything else is
skipped with a warning, never loaded. Writes go to a temporary file renamed into place, on a
writer thread, so a crash leaves either the old file or the new one. The directory is bounded
by `max_bytes`, least recently used first out. Prefixes that the scheduler evicts from a slot
(a new request overwrites the slot) go to a host-RAM tier of `ram_bytes`, also LRU.
"""
from __future__ import annotations

import hashlib
import logging
import os
import queue
import re
import struct
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import EdgeInferError

log = logging.getLogger("edgeinfer")

MAGIC = b"EIPCACHE"
FORMAT_VERSION = 1
HEADER = struct.Struct("<8sI32s8sIQI")   # magic, version, identity, kv type, n tokens, payload bytes, crc32
SUFFIX = ".eipc"
_SAMPLES, _SAMPLE_BYTES = 16, 1 << 16   # tensor data read for the identity: 1 MiB spread over the file
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class CacheFileError(EdgeInferError):
    """A slot file name that is not a plain name inside the cache directory, or a file that is
    missing, corrupt, truncated or from another model."""


@dataclass(frozen=True)
class Entry:
    tokens: tuple[int, ...]
    payload: bytes


def model_identity(path: str | os.PathLike, data_offset: int) -> bytes:
    """A digest of the GGUF's metadata and tensor table (its first data_offset bytes), its size
    and 16 samples of its tensor data: two files share it only when they hold the same model."""
    h = hashlib.sha256()
    size = os.path.getsize(path)
    h.update(struct.pack("<Q", size))
    with open(path, "rb") as fh:
        h.update(fh.read(data_offset))
        span = max(0, size - data_offset - _SAMPLE_BYTES)
        for i in range(_SAMPLES):
            fh.seek(data_offset + span * i // max(1, _SAMPLES - 1))
            h.update(fh.read(_SAMPLE_BYTES))
    return h.digest()


def check_name(name: str) -> str:
    """A slot file's name: letters, digits, '.', '_', '-', never a path (no '/', no '..')."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise CacheFileError(f"filename must be a plain name of letters, digits, '.', '_' or '-' "
                             f"(no path, no '..'), got {name!r}")
    return name


def _crc(tokens: np.ndarray, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(tokens.tobytes()))


class PromptCache:
    def __init__(self, directory: str | os.PathLike, identity: bytes, kv_type: str,
                 max_bytes: int = 4 << 30, ram_bytes: int = 512 << 20, min_tokens: int = 16):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.identity = identity
        self.kv_type = kv_type.encode()[:8].ljust(8, b"\0")
        self.max_bytes = max_bytes
        self.ram_bytes = ram_bytes
        self.min_tokens = min_tokens
        self._lock = threading.Lock()
        self._disk: OrderedDict[str, tuple[tuple[int, ...], int]] = OrderedDict()   # name -> (tokens, bytes), LRU first
        self._ram: OrderedDict[tuple[int, ...], bytes] = OrderedDict()
        self._ram_used = 0
        self._writes: queue.Queue = queue.Queue()
        self._writer: threading.Thread | None = None
        self._scan()

    # ------------------------------------------------------------------ files
    def encode(self, tokens, payload: bytes) -> bytes:
        toks = np.asarray(tokens, dtype=np.int32)
        head = HEADER.pack(MAGIC, FORMAT_VERSION, self.identity, self.kv_type, len(toks), len(payload),
                           _crc(toks, payload))
        return head + toks.tobytes() + payload

    def _read_header(self, path: Path) -> tuple[tuple[int, ...], int] | None:
        """(tokens, payload bytes) of a file this engine may load, or None with a warning why not."""
        try:
            with open(path, "rb") as fh:
                head = fh.read(HEADER.size)
                if len(head) < HEADER.size:
                    raise CacheFileError("truncated header")
                magic, version, identity, kv_type, n, nbytes, _ = HEADER.unpack(head)
                if magic != MAGIC or version != FORMAT_VERSION:
                    raise CacheFileError(f"not a prompt cache file of format {FORMAT_VERSION}")
                if identity != self.identity:
                    raise CacheFileError("made by another model")
                if kv_type != self.kv_type:
                    raise CacheFileError(f"KV type {kv_type.rstrip(bytes(1)).decode(errors='replace')}, "
                                         f"not {self.kv_type.rstrip(bytes(1)).decode()}")
                if os.fstat(fh.fileno()).st_size != HEADER.size + 4 * n + nbytes:
                    raise CacheFileError("truncated or padded")
                tokens = tuple(np.frombuffer(fh.read(4 * n), dtype=np.int32).tolist())
        except (OSError, CacheFileError, struct.error) as exc:
            log.warning("prompt cache: skipping %s: %s", path.name, exc)
            return None
        return tokens, nbytes

    def read(self, path: Path) -> Entry | None:
        """The file's entry, or None (with a warning) unless it is whole, ours and intact."""
        head = self._read_header(path)
        if head is None:
            return None
        tokens, nbytes = head
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            log.warning("prompt cache: skipping %s: %s", path.name, exc)
            return None
        crc = HEADER.unpack(raw[:HEADER.size])[-1]
        toks = np.frombuffer(raw, dtype=np.int32, count=len(tokens), offset=HEADER.size)
        payload = raw[HEADER.size + 4 * len(tokens):]
        if len(payload) != nbytes or _crc(toks, payload) != crc:
            log.warning("prompt cache: skipping %s: corrupt (checksum mismatch)", path.name)
            return None
        return Entry(tokens, payload)

    def write(self, path: Path, tokens, payload: bytes) -> None:
        """Atomically: a temporary file in the same directory, renamed into place."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(self.encode(tokens, payload))
        os.replace(tmp, path)

    def _scan(self) -> None:
        found = []
        for path in self.dir.glob(f"*{SUFFIX}"):
            head = self._read_header(path)
            if head is not None:
                found.append((path.stat().st_mtime, path.name, head[0], path.stat().st_size))
        for _, name, tokens, size in sorted(found):
            self._disk[name] = (tokens, size)

    # ------------------------------------------------------------------ lookup / store
    def lookup(self, ids: list[int], limit: int) -> Entry | None:
        """The longest stored prefix of ids[:limit] (RAM first, then disk), or None."""
        best_ram = self._best(self._ram.keys(), ids, limit)
        with self._lock:
            disk = [(name, toks) for name, (toks, _) in self._disk.items()]
        best_disk = max(((len(t), name) for name, t in disk if _is_prefix(t, ids, limit)), default=None)
        if best_ram is not None and (best_disk is None or len(best_ram) >= best_disk[0]):
            with self._lock:
                payload = self._ram.get(best_ram)
                if payload is not None:
                    self._ram.move_to_end(best_ram)
            if payload is not None:
                self._touch(_file_name(best_ram))
                return Entry(best_ram, payload)
        if best_disk is None:
            return None
        name = best_disk[1]
        entry = self.read(self.dir / name)
        if entry is None:
            with self._lock:
                self._disk.pop(name, None)
        else:
            self._touch(name)
        return entry

    def _touch(self, name: str) -> None:
        """Marks a file most recently used, here and (its mtime) for the next process."""
        with self._lock:
            if name not in self._disk:
                return
            self._disk.move_to_end(name)
        try:
            os.utime(self.dir / name)
        except FileNotFoundError:
            pass

    @staticmethod
    def _best(keys, ids: list[int], limit: int) -> tuple[int, ...] | None:
        return max((k for k in list(keys) if _is_prefix(k, ids, limit)), key=len, default=None)

    def holds(self, tokens) -> bool:
        key = tuple(tokens)
        with self._lock:
            return key in self._ram or any(t == key for t, _ in self._disk.values())

    def store(self, tokens, payload: bytes) -> None:
        """Keeps the prefix in RAM and writes it to disk on the writer thread."""
        key = tuple(int(t) for t in tokens)
        self.remember(key, payload)
        self._writes.put((key, payload))
        with self._lock:
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(target=self._write_loop, name="edgeinfer-prompt-cache", daemon=True)
                self._writer.start()

    def remember(self, tokens, payload: bytes) -> None:
        """The host-RAM tier: keeps the prefix in memory, least recently used out past ram_bytes."""
        key = tuple(int(t) for t in tokens)
        if len(payload) > self.ram_bytes:
            return
        with self._lock:
            old = self._ram.pop(key, None)
            self._ram_used -= len(old) if old is not None else 0
            self._ram[key] = payload
            self._ram_used += len(payload)
            while self._ram_used > self.ram_bytes:
                _, dropped = self._ram.popitem(last=False)
                self._ram_used -= len(dropped)

    def flush(self) -> None:
        """Waits until every stored prefix is on disk."""
        self._writes.join()

    def _write_loop(self) -> None:
        while True:
            try:
                key, payload = self._writes.get(timeout=2.0)
            except queue.Empty:
                return
            try:
                name = _file_name(key)
                self.write(self.dir / name, key, payload)
                with self._lock:
                    self._disk[name] = (key, HEADER.size + 4 * len(key) + len(payload))
                    self._disk.move_to_end(name)
                self._evict()
            except OSError:
                log.exception("prompt cache: could not write a prefix of %d tokens", len(key))
            finally:
                self._writes.task_done()

    def _evict(self) -> None:
        """Deletes the least recently used files until the directory fits max_bytes."""
        with self._lock:
            victims = []
            used = sum(size for _, size in self._disk.values())
            while used > self.max_bytes and len(self._disk) > 1:
                name, (_, size) = self._disk.popitem(last=False)
                victims.append(name)
                used -= size
        for name in victims:
            try:
                (self.dir / name).unlink()
            except FileNotFoundError:
                pass

    # ------------------------------------------------------------------ named slot files
    def save_file(self, name: str, tokens, payload: bytes) -> int:
        """llama.cpp's slot save: the file `name` inside the directory; its size in bytes."""
        path = self.dir / check_name(name)
        self.write(path, tokens, payload)
        return path.stat().st_size

    def load_file(self, name: str) -> Entry:
        path = self.dir / check_name(name)
        if not path.is_file():
            raise CacheFileError(f"no slot file {name!r} in the prompt cache directory")
        entry = self.read(path)
        if entry is None:
            raise CacheFileError(f"slot file {name!r} is corrupt, truncated or from another model or KV type")
        return entry

    def erase_file(self, name: str) -> None:
        path = self.dir / check_name(name)
        if not path.is_file():
            raise CacheFileError(f"no slot file {name!r} in the prompt cache directory")
        path.unlink()


def _file_name(tokens: tuple[int, ...]) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype=np.int32).tobytes()).hexdigest()[:32] + SUFFIX


def _is_prefix(tokens: tuple[int, ...], ids: list[int], limit: int) -> bool:
    n = len(tokens)
    return 0 < n <= limit and tuple(ids[:n]) == tokens
