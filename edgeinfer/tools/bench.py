"""`edgeinfer bench`: llama-bench style measurements, optionally interleaved with peers.

Metrics (definitions: docs/architecture.md, "Metrics"):

- ``pp`` (pp512): prefill tokens/s. A fresh sequence; the prompt goes through the native
  forward in chunks of ``batch`` tokens, logits only for the last token; tokens / time.
- ``tg`` (tg128): decode tokens/s. After a short prompt (``tg_prompt`` tokens, untimed),
  ``tg`` tokens are generated one forward at a time, greedily (argmax of the logits).
- ``tg_depth``: the same with ``ctx_depth`` tokens already in the context (``--ctx-depth``);
  ``tg_depth_retention`` = tg_depth / tg (the target: >= 0.9 at 1500 tokens).
- ``ttft_s`` / ``tpot_s``: time to first token and mean time per output token after the
  first, for a ``prompt_len``-token prompt and ``output_len`` output tokens
  (edgeinfer: ``Engine.generate(...).stats``; peers: the same loop through their API).
- ``peak_rss_bytes``: peak resident memory of a fresh child process that loads the engine
  and runs one pp and one tg (VmHWM, else ``ru_maxrss``); ``peak_rss_baseline_bytes`` is that child's
  peak before loading (interpreter + imports). ``process_peak_rss_bytes`` /
  ``process_rss_bytes`` are the benchmark process's own figures after this engine's
  repetitions: process-wide, so they include every engine loaded before it.
- ``kv_bytes``: the KV arena (edgeinfer: allocated once; llama.cpp: f16 K and V for n_ctx
  cells, computed from the model's shape; None when unknown).
- ``cost_per_1m_output_tokens`` = (price_per_hour / 3600) / (tg tokens/s) * 1e6, from the
  median tg; None without ``--price-per-hour``.
- ``gb_per_s`` (in tg and tg_depth): the bandwidth a decode drew, tokens/s x
  ``bytes_per_token`` (decode_bytes.py: every matrix once, one embedding row, the KV at the
  run's mean depth). With ``--floor GB/s`` (scripts/memory_floor.py's figure) the table gives
  each decode's share of it and says loudly when a decode passes it: the floor is then wrong.
- ``profile`` (``--profile``): per forward stage of an edgeinfer decode, ms per token, bytes per
  token and GB/s (stage_profile.py), and the share of ``--floor``; at ``ctx_depth`` when given,
  so the attention's share at that depth shows. Then a prefill of ``pp`` tokens the same way:
  each stage's ms, share of the time and billions of multiply-adds a second.

Every timed metric is a :class:`Spread` (median, min, max, stdev, values) over ``reps``
repetitions. With peers, each repetition measures every engine back to back, metric by
metric (pp of each engine, then tg of each, ...), alternating the engine order from one
repetition to the next, so that the machine's noise hits all of them alike; ratios are
edgeinfer's median / the peer's median. With ``process_per_engine`` each engine runs in a
worker process of its own (``engine_process.py``), on the same schedule.

JSON (``BenchResult.to_dict()``, schema ``edgeinfer.bench/1``): every key below is always
present; a value is null only where noted.

    schema, date (start, ISO 8601 UTC), command (argv, or null when called as a library)
    model: {name, path, file_bytes, file_type}
    system: {cpu, n_cpus, isa, platform, python, edgeinfer, llama_cpp (null if absent),
             onnxruntime_genai (null if absent), loadavg_start, loadavg_end (1-minute load
             average before and after: other work on the machine makes timings noisy)}
    config: {threads [..], pp, tg, reps, batch, n_ctx, tg_prompt, prompt_len, output_len,
             ctx_depth (null = off), price_per_hour (null), compare [..], isa, seed,
             isolated_rss, process_per_engine, order, profile, floor_gb_s (null)}
    runs: [{engine, label, threads, n_ctx,
            pp: {n_tokens, tokens_per_s: Spread, seconds: Spread},
            tg: {n_tokens, depth, tokens_per_s: Spread, seconds: Spread, bytes_per_token,
                 gb_per_s: Spread},
            tg_depth: same as tg, or null without --ctx-depth,
            tg_depth_retention (null without --ctx-depth),
            ttft_s: Spread, tpot_s: Spread,
            kv_bytes (null if unknown), scratch_bytes (null for peers),
            peak_rss_bytes, peak_rss_baseline_bytes (null if isolated_rss is off),
            process_peak_rss_bytes, process_rss_bytes (null with process_per_engine),
            cost_per_1m_output_tokens (null without a price)}]
    ratios: [{threads, engine, peer, pp, tg, tg_depth (null), ttft, tpot,
              peak_rss (null)}]   # edgeinfer / peer; > 1 = edgeinfer higher
    skipped: [{engine, spec, reason}]   # peers that could not run (e.g. ort-genai absent)
    profile: null without --profile, else [{threads, prompt_len, n_tokens, mean_depth, wall_ms_per_token,
              floor_gb_s, stages: [{stage, ms_per_token, bytes_per_token, gb_per_s,
              share_of_floor}], prefill: {n_tokens, wall_ms, tokens_per_s,
              stages: [{stage, ms, share, gmac_per_s (null)}]}}]   # one per thread count; see stage_profile.py
    Spread: {median, min, max, stdev, values [..]}
"""
from __future__ import annotations

import datetime as _dt
import gc
import importlib.metadata
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from ..backends import DEVICES
from .decode_bytes import DecodeBytes, decode_bytes
from .plan import KV_TYPES
from .stage_profile import prefill_entry, profile_decode, profile_entry, profile_prefill

__all__ = ["BenchConfig", "BenchResult", "Spread", "run_bench", "format_table", "format_profile",
           "parse_threads", "cpu_name", "SCHEMA"]

SCHEMA = "edgeinfer.bench/1"
_SETTLE_S = 0.05   # pause between measurements so the previous engine's workers go idle
_TOKEN_LOW = 100   # random prompt tokens avoid the first (special) ids


# --------------------------------------------------------------------------- config, stats

@dataclass
class BenchConfig:
    model: str = "default"
    threads: list[int] = field(default_factory=lambda: [2])
    pp: int = 512
    tg: int = 128
    reps: int = 3
    batch: int = 512
    n_ctx: int = 0                  # 0 = the smallest multiple of 256 that fits every test
    tg_prompt: int = 16
    prompt_len: int = 128
    output_len: int = 32
    ctx_depth: Optional[int] = None
    price_per_hour: Optional[float] = None
    compare: list[str] = field(default_factory=list)
    isa: str = "best"
    kv: str = "f16"                 # KV arena type of every engine: f16 or q8_0
    device: str = "cpu"             # edgeinfer's device: cpu, cuda or auto (peers stay on the CPU)
    seed: int = 0
    isolated_rss: bool = True
    process_per_engine: bool = False   # each engine in a worker process of its own
    warmup: bool = True
    profile: bool = False           # also profile an edgeinfer decode stage by stage
    floor_gb_s: Optional[float] = None   # the memory floor (scripts/memory_floor.py) to compare with

    def validate(self) -> None:
        for name in ("pp", "tg", "reps", "batch", "tg_prompt", "prompt_len", "output_len"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not self.threads or any((not isinstance(t, int)) or t < 1 for t in self.threads):
            raise ValueError(f"threads must be positive integers, got {self.threads!r}")
        if self.ctx_depth is not None and self.ctx_depth < 1:
            raise ValueError(f"ctx_depth must be >= 1, got {self.ctx_depth}")
        if self.kv not in KV_TYPES:
            raise ValueError(f"kv must be one of {', '.join(KV_TYPES)}, got {self.kv!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.price_per_hour is not None and self.price_per_hour < 0:
            raise ValueError("price_per_hour must be >= 0")
        if self.floor_gb_s is not None and not self.floor_gb_s > 0:
            raise ValueError(f"floor_gb_s must be > 0, got {self.floor_gb_s!r}")
        need = self.needed_ctx()
        if self.n_ctx and self.n_ctx < need:
            raise ValueError(f"n_ctx={self.n_ctx} is too small: the tests need {need} cells")

    def needed_ctx(self) -> int:
        # generate() needs one free cell past prompt + output; the raw pp/tg loops do not.
        return max(self.pp, self.tg_prompt + self.tg, self.prompt_len + self.output_len + 1,
                   (self.ctx_depth or 0) + self.tg)

    def effective_ctx(self) -> int:
        if self.n_ctx:
            return self.n_ctx
        return -(-self.needed_ctx() // 256) * 256


@dataclass
class Spread:
    median: float
    min: float
    max: float
    stdev: float
    values: list[float]

    @classmethod
    def of(cls, values: Sequence[float]) -> "Spread":
        vals = [float(v) for v in values]
        if not vals:
            raise ValueError("no values")
        return cls(median=statistics.median(vals), min=min(vals), max=max(vals),
                   stdev=statistics.stdev(vals) if len(vals) > 1 else 0.0, values=vals)


def parse_threads(spec: str | int | Sequence[int]) -> list[int]:
    """'1,2' -> [1, 2]; also accepts an int or a list."""
    if isinstance(spec, int):
        return [spec]
    if not isinstance(spec, str):
        return [int(x) for x in spec]
    out = []
    for part in spec.replace(" ", "").split(","):
        if not part:
            continue
        try:
            n = int(part)
        except ValueError:
            raise ValueError(f"--threads: {part!r} is not an integer (use e.g. 1,2)") from None
        if n < 1:
            raise ValueError(f"--threads: {n} is not a positive thread count")
        out.append(n)
    if not out:
        raise ValueError("--threads: no thread count given")
    return out


def cpu_name(cpuinfo: str | None = None) -> str:
    """The CPU's model name, with AMD's core generation from cpuid's family and model: VMs often
    show only "AMD EPYC", and Zen 4 (512-bit ops in two halves) and Zen 5 (full width) differ."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:   # the first processor's
            fields[key.strip()] = value.strip()
    name = fields.get("model name") or _lscpu_model_name() or platform.processor() or platform.machine()
    try:
        family, model = int(fields["cpu family"]), int(fields["model"])
    except (KeyError, ValueError):
        return name
    core = amd_core(family, model) if fields.get("vendor_id") == "AuthenticAMD" else None
    return f"{name} ({core}, family {family} model {model})" if core else name


def _lscpu_model_name() -> str | None:
    """lscpu's name, where /proc/cpuinfo has none (ARM cores: "Cortex-A78AE")."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10,
                             env={**os.environ, "LC_ALL": "C"}).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return None


def amd_core(family: int, model: int) -> str | None:
    """AMD's core generation from cpuid's (extended) family and model, as AMD's processor
    programming references number them; None for a family not listed."""
    if family == 0x17:
        return "Zen 2" if model >= 0x30 else "Zen/Zen+"
    if family == 0x19:
        zen4 = 0x10 <= model <= 0x1F or 0x60 <= model <= 0x7F or 0xA0 <= model <= 0xAF
        return "Zen 4" if zen4 else "Zen 3"
    if family == 0x1A:
        return "Zen 5"
    return None


def _maxrss_bytes() -> int:
    """Peak RSS of this process: VmHWM (Linux; reset by exec, unlike ru_maxrss, which a
    child started from a large parent inherits), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r) if sys.platform == "darwin" else int(r) * 1024  # Linux: KiB


def _rss_bytes() -> int:
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # psutil missing: fall back to the high-water mark
        return _maxrss_bytes()


def _random_ids(rng: np.random.Generator, n: int, n_vocab: int) -> list[int]:
    low = _TOKEN_LOW if n_vocab > 2 * _TOKEN_LOW else 0
    return [int(x) for x in rng.integers(low, n_vocab, size=n)]


from .peers import (EdgeinferRunner, LlamaCppRunner, OrtGenaiRunner, PeerSkipped, Runner,  # noqa: F401
                    _parse_peer, make_runner)


# --------------------------------------------------------------------------- isolated peak RSS

def _rss_probe(args: dict) -> dict:
    """Runs in a fresh child: load one engine, one pp and one tg, report ru_maxrss."""
    import numpy  # noqa: F401  (both engines import it: part of the baseline)

    if args["kind"] == "llama.cpp":
        import llama_cpp  # noqa: F401
    elif args["kind"] == "ort-genai":
        import onnxruntime_genai  # noqa: F401
    else:
        from ..engine import Engine  # noqa: F401
    base = _maxrss_bytes()
    r = make_runner(args["kind"], args.get("arg"), args["path"], args["threads"], args["n_ctx"],
                    args["batch"], args.get("isa", "best"), args.get("kv", "f16"), args.get("device", "cpu"))
    rng = np.random.default_rng(1)
    n_vocab = r.n_vocab or 32000
    r.pp(_random_ids(rng, args["pp"], n_vocab))
    r.tg(_random_ids(rng, args["tg_prompt"], n_vocab), args["tg"])
    return {"peak_rss_bytes": _maxrss_bytes(), "peak_rss_baseline_bytes": base}


def _rss_probe_main() -> None:  # pragma: no cover - runs in the child
    print(json.dumps(_rss_probe(json.loads(sys.argv[1]))), flush=True)


def isolated_peak_rss(kind: str, arg: Optional[str], path: str, threads: int, cfg: BenchConfig,
                      timeout: float = 600) -> tuple[Optional[int], Optional[int], Optional[str]]:
    payload = json.dumps({"kind": kind, "arg": arg, "path": path, "threads": threads,
                          "n_ctx": cfg.effective_ctx(), "batch": cfg.batch, "isa": cfg.isa, "kv": cfg.kv, "device": cfg.device,
                          "pp": cfg.pp, "tg_prompt": cfg.tg_prompt, "tg": cfg.tg})
    code = "from edgeinfer.tools.bench import _rss_probe_main; _rss_probe_main()"
    try:
        p = subprocess.run([sys.executable, "-c", code, payload], capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, None, "timed out"
    if p.returncode != 0:
        return None, None, (p.stderr.strip().splitlines() or ["failed"])[-1]
    try:
        d = json.loads(p.stdout.strip().splitlines()[-1])
        return int(d["peak_rss_bytes"]), int(d["peak_rss_baseline_bytes"]), None
    except (ValueError, KeyError, IndexError):
        return None, None, "no result"


# --------------------------------------------------------------------------- the run

@dataclass
class BenchResult:
    schema: str
    date: str
    command: Optional[list[str]]
    model: dict
    system: dict
    config: dict
    runs: list[dict]
    ratios: list[dict]
    skipped: list[dict]
    profile: Optional[list[dict]] = None

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)


def _version(mod: str) -> Optional[str]:
    try:
        m = __import__(mod)
        return str(getattr(m, "__version__", "?"))
    except Exception:
        return None


def _package_version() -> Optional[str]:
    try:
        return importlib.metadata.version("edgeinfer")
    except importlib.metadata.PackageNotFoundError:   # run from a source tree that is not installed
        return None


def _system_info() -> dict:
    isa = None
    try:
        from ..backends.cpu import cpu_report

        isa = cpu_report()["best_isa"]
    except Exception:
        pass
    return {"cpu": cpu_name(), "n_cpus": os.cpu_count() or 0, "isa": isa,
            "platform": platform.platform(), "python": platform.python_version(),
            "edgeinfer": _package_version(), "llama_cpp": _version("llama_cpp"),
            "onnxruntime_genai": _version("onnxruntime_genai"), "loadavg_start": None,
            "loadavg_end": None}


_LLAMA_FTYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
                 10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
                 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}


def _model_info(path: Path) -> dict:
    """Name, path, size and file type (general.file_type, else the commonest matrix type)."""
    file_type = None
    try:
        from ..gguf.reader import GGUFFile

        g = GGUFFile(path)
        ft = g.metadata.get("general.file_type")
        if isinstance(ft, int) and ft in _LLAMA_FTYPES:
            file_type = _LLAMA_FTYPES[ft]
        else:
            counts: dict[str, int] = {}
            for t in g.tensors.values():
                if len(t.shape) >= 2:
                    counts[t.type_name] = counts.get(t.type_name, 0) + 1
            file_type = max(counts, key=counts.__getitem__) if counts else None
        del g
    except Exception:
        pass
    return {"name": path.name, "path": str(path), "file_bytes": path.stat().st_size,
            "file_type": file_type}


def _empty_run(engine: str, label: str, threads: int, n_ctx: int) -> dict:
    return {"engine": engine, "label": label, "threads": threads, "n_ctx": n_ctx,
            "pp": None, "tg": None, "tg_depth": None, "tg_depth_retention": None,
            "ttft_s": None, "tpot_s": None, "kv_bytes": None, "scratch_bytes": None,
            "peak_rss_bytes": None, "peak_rss_baseline_bytes": None,
            "process_peak_rss_bytes": None, "process_rss_bytes": None,
            "cost_per_1m_output_tokens": None}


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or b == 0:
        return None
    return a / b


def run_bench(cfg: BenchConfig, log: Callable[[str], None] | None = None,
              command: Optional[list[str]] = None,
              before_step: Optional[Callable[[], object]] = None) -> BenchResult:
    """Runs the benchmark; `log` gets one line per step (progress), default: nothing;
    `before_step` is called right before each engine's timed step (scripts/host_table.py reads
    the memory bandwidth there, so that its floor samples the same minutes as the decodes)."""
    from ..hub import resolve_model

    cfg.validate()
    say = log or (lambda s: None)
    load_start = _loadavg()
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    path = Path(resolve_model(cfg.model))
    n_ctx = cfg.effective_ctx()
    moved = decode_bytes(path)
    profiles: Optional[list[dict]] = [] if cfg.profile else None
    peers = [(_parse_peer(s), s) for s in cfg.compare]
    rng = np.random.default_rng(cfg.seed)
    runs: list[dict] = []
    ratios: list[dict] = []
    skipped: list[dict] = []
    skipped_specs: set[str] = set()

    make = make_runner
    if cfg.process_per_engine:
        from .engine_process import ProcessRunner as make
    for threads in cfg.threads:
        runners: list[tuple[Runner, Optional[str], str]] = []
        say(f"[{threads} thread(s)] loading edgeinfer ({path.name}, n_ctx={n_ctx}, batch={cfg.batch})")
        edge = make("edgeinfer", None, str(path), threads, n_ctx, cfg.batch, cfg.isa, cfg.kv, cfg.device)
        runners.append((edge, None, "edgeinfer"))
        for (kind, arg), spec in peers:
            if spec in skipped_specs:
                continue
            say(f"[{threads} thread(s)] loading {kind}")
            try:
                runners.append((make(kind, arg, str(path), threads, n_ctx, cfg.batch, kv=cfg.kv),
                                arg, kind))
            except PeerSkipped as e:
                say(f"skipping {spec}: {e}")
                skipped.append({"engine": kind, "spec": spec, "reason": str(e)})
                skipped_specs.add(spec)
        try:
            runs_t = _measure(cfg, runners, threads, n_ctx, rng, say, moved, before_step)
            if cfg.process_per_engine:   # this process holds no engine: its RSS says nothing
                for run in runs_t:
                    run["process_peak_rss_bytes"] = run["process_rss_bytes"] = None
        finally:
            for r, _, _ in runners:
                r.close()
            runners.clear()
            gc.collect()
        if profiles is not None:
            say(f"[{threads} thread(s)] profiling an edgeinfer decode stage by stage")
            profiles.append(_profile(cfg, str(path), threads, n_ctx, moved))
        if cfg.isolated_rss:
            for run in runs_t:
                kind = run["engine"]
                arg = next((a for (k, a), _ in peers if k == kind), None)
                say(f"[{threads} thread(s)] peak RSS of {kind} in a fresh process")
                peak, base, err = isolated_peak_rss(kind, arg, str(path), threads, cfg)
                if err:
                    say(f"  peak RSS probe of {kind} failed: {err}")
                run["peak_rss_bytes"], run["peak_rss_baseline_bytes"] = peak, base
        runs.extend(runs_t)
        ei = runs_t[0]
        for peer in runs_t[1:]:
            ratios.append({
                "threads": threads, "engine": "edgeinfer", "peer": peer["engine"],
                "pp": _ratio(ei["pp"]["tokens_per_s"]["median"], peer["pp"]["tokens_per_s"]["median"]),
                "tg": _ratio(ei["tg"]["tokens_per_s"]["median"], peer["tg"]["tokens_per_s"]["median"]),
                "tg_depth": (_ratio(ei["tg_depth"]["tokens_per_s"]["median"],
                                    peer["tg_depth"]["tokens_per_s"]["median"])
                             if ei["tg_depth"] and peer["tg_depth"] else None),
                "ttft": _ratio(ei["ttft_s"]["median"], peer["ttft_s"]["median"]),
                "tpot": _ratio(ei["tpot_s"]["median"], peer["tpot_s"]["median"]),
                "peak_rss": _ratio(ei["peak_rss_bytes"], peer["peak_rss_bytes"]),
            })

    conf = asdict(cfg)
    conf["n_ctx"] = n_ctx
    conf["order"] = ("interleaved: each repetition measures every engine back to back, metric by "
                     "metric, alternating the engine order"
                     + ("; each engine in a worker process of its own" if cfg.process_per_engine else
                        "; all engines in this process"))
    conf.pop("model", None)
    conf.pop("warmup", None)
    system = _system_info()
    system["loadavg_start"], system["loadavg_end"] = load_start, _loadavg()
    return BenchResult(schema=SCHEMA, date=started,
                       command=command, model=_model_info(path), system=system, config=conf,
                       runs=runs, ratios=ratios, skipped=skipped, profile=profiles)


def _profile(cfg: BenchConfig, path: str, threads: int, n_ctx: int, moved: DecodeBytes) -> dict:
    """A stage-by-stage profile of an in-process edgeinfer decode (stage_profile.py) after a
    prompt of ctx_depth tokens, or tg_prompt without it, and of a pp-token prefill (their own
    seed: the other measurements' ids stay as without it)."""
    r = make_runner("edgeinfer", None, path, threads, n_ctx, cfg.batch, cfg.isa, cfg.kv, cfg.device)
    try:
        rng = np.random.default_rng(cfg.seed + 1)
        prompt = _random_ids(rng, cfg.ctx_depth or cfg.tg_prompt, r.n_vocab or 32000)
        if cfg.warmup:
            r.tg(prompt, min(cfg.tg, 8))
        prof = profile_decode(r, prompt, cfg.tg, cfg.reps)
        pre = profile_prefill(r, _random_ids(rng, cfg.pp, r.n_vocab or 32000), cfg.reps)
    finally:
        r.close()
    return {**profile_entry(prof, moved, cfg.kv, threads, cfg.floor_gb_s), "prefill": prefill_entry(pre, moved)}


def _loadavg() -> Optional[float]:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def _decode_record(n: int, depth: int, seconds: list[float], moved: DecodeBytes, kv: str) -> dict:
    """tg / tg_depth: tokens/s and the bandwidth drawn, bytes at the mean depth (the tokens at
    positions depth..depth+n-1 attend to depth+1..depth+n cells)."""
    per_token = moved.per_token(depth + (n + 1) / 2, kv)
    return {"n_tokens": n, "depth": depth, "tokens_per_s": asdict(Spread.of([n / s for s in seconds])),
            "seconds": asdict(Spread.of(seconds)), "bytes_per_token": per_token,
            "gb_per_s": asdict(Spread.of([n / s * per_token / 1e9 for s in seconds]))}


def _measure(cfg: BenchConfig, runners: list, threads: int, n_ctx: int, rng: np.random.Generator,
             say: Callable[[str], None], moved: DecodeBytes,
             before_step: Optional[Callable[[], object]] = None) -> list[dict]:
    n_vocab = min((r.n_vocab for r, _, _ in runners if r.n_vocab), default=32000)
    pp_ids = _random_ids(rng, cfg.pp, n_vocab)
    tg_ids = _random_ids(rng, cfg.tg_prompt, n_vocab)
    depth_ids = _random_ids(rng, cfg.ctx_depth, n_vocab) if cfg.ctx_depth else None
    if cfg.warmup:
        for r, _, _ in runners:
            say(f"[{threads} thread(s)] warm-up {r.engine}")
            r.pp(_random_ids(rng, min(cfg.pp, 64), n_vocab))
            r.tg(tg_ids, min(cfg.tg, 8))
    k = len(runners)
    pp_s = [[] for _ in range(k)]
    tg_s = [[] for _ in range(k)]
    dep_s = [[] for _ in range(k)]
    ttft = [[] for _ in range(k)]
    tpot = [[] for _ in range(k)]

    def each(rep: int):
        order = list(range(k)) if rep % 2 == 0 else list(reversed(range(k)))
        for i in order:
            time.sleep(_SETTLE_S)
            if before_step:
                before_step()
            yield i, runners[i][0]

    for rep in range(cfg.reps):
        for i, r in each(rep):
            pp_s[i].append(r.pp(pp_ids))
        for i, r in each(rep):
            tg_s[i].append(r.tg(tg_ids, cfg.tg))
        if depth_ids:
            for i, r in each(rep):
                dep_s[i].append(r.tg(depth_ids, cfg.tg))
        # A new prompt each repetition (a different first token), so no engine reuses a
        # cached prefix from the previous one.
        prompt = _random_ids(rng, cfg.prompt_len, n_vocab)
        for i, r in each(rep):
            a, b = r.ttft_tpot(prompt, cfg.output_len)
            ttft[i].append(a)
            tpot[i].append(b)
        say(f"[{threads} thread(s)] rep {rep + 1}/{cfg.reps}: " + "; ".join(
            f"{runners[i][0].engine} pp{cfg.pp} {cfg.pp / pp_s[i][-1]:.1f} t/s, "
            f"tg{cfg.tg} {cfg.tg / tg_s[i][-1]:.1f} t/s" for i in range(k)))

    out = []
    proc_peak, proc_rss = _maxrss_bytes(), _rss_bytes()
    for i, (r, _, _) in enumerate(runners):
        run = _empty_run(r.engine, r.label, threads, n_ctx)
        run["pp"] = {"n_tokens": cfg.pp, "tokens_per_s": asdict(Spread.of([cfg.pp / s for s in pp_s[i]])),
                     "seconds": asdict(Spread.of(pp_s[i]))}
        run["tg"] = _decode_record(cfg.tg, cfg.tg_prompt, tg_s[i], moved, cfg.kv)
        if depth_ids:
            run["tg_depth"] = _decode_record(cfg.tg, cfg.ctx_depth, dep_s[i], moved, cfg.kv)
            run["tg_depth_retention"] = (run["tg_depth"]["tokens_per_s"]["median"]
                                         / run["tg"]["tokens_per_s"]["median"])
        run["ttft_s"] = asdict(Spread.of(ttft[i]))
        run["tpot_s"] = asdict(Spread.of(tpot[i]))
        run["kv_bytes"] = r.kv_bytes
        run["scratch_bytes"] = r.scratch_bytes
        run["process_peak_rss_bytes"] = proc_peak
        run["process_rss_bytes"] = proc_rss
        if cfg.price_per_hour is not None:
            run["cost_per_1m_output_tokens"] = (cfg.price_per_hour / 3600.0) / \
                run["tg"]["tokens_per_s"]["median"] * 1e6
        out.append(run)
    return out


# --------------------------------------------------------------------------- table

def _fmt_spread(s: Optional[dict], scale: float = 1.0, digits: int = 1) -> str:
    if not s:
        return "-"
    med, lo, hi = s["median"] * scale, s["min"] * scale, s["max"] * scale
    if len(s["values"]) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def _mib(n: Optional[int]) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[j]) for r in rows)) if rows else len(h) for j, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    sep = "| " + " | ".join("-" * w for w in widths) + " |"
    return "\n".join([line(header), sep] + [line(r) for r in rows])


def format_table(res: BenchResult | dict) -> str:
    """A Markdown table for people: medians with (min-max) over the repetitions."""
    d = res.to_dict() if isinstance(res, BenchResult) else res
    c = d["config"]
    pp, tg = c["pp"], c["tg"]
    header = ["engine", "threads", f"pp{pp} t/s", f"tg{tg} t/s"]
    if c["ctx_depth"]:
        header += [f"tg{tg}@{c['ctx_depth']} t/s", "retained"]
    header += [f"TTFT ms (p{c['prompt_len']})", f"TPOT ms (n{c['output_len']})", "peak RSS MiB",
               "KV MiB"]
    if c["price_per_hour"] is not None:
        header.append("$/1M out")
    rows = []
    for r in d["runs"]:
        row = [r["label"], str(r["threads"]), _fmt_spread(r["pp"]["tokens_per_s"]),
               _fmt_spread(r["tg"]["tokens_per_s"])]
        if c["ctx_depth"]:
            row += [_fmt_spread(r["tg_depth"]["tokens_per_s"]) if r["tg_depth"] else "-",
                    f"{r['tg_depth_retention']:.0%}" if r["tg_depth_retention"] else "-"]
        row += [_fmt_spread(r["ttft_s"], 1e3), _fmt_spread(r["tpot_s"], 1e3, 2),
                _mib(r["peak_rss_bytes"] if r["peak_rss_bytes"] is not None else r["process_peak_rss_bytes"]),
                _mib(r["kv_bytes"])]
        if c["price_per_hour"] is not None:
            row.append(f"{r['cost_per_1m_output_tokens']:.4f}")
        rows.append(row)
    out = [f"model {d['model']['name']} ({d['model']['file_type']}), n_ctx {c['n_ctx']}, "
           f"batch {c['batch']}, KV {c.get('kv', 'f16')}, {c['reps']} rep(s), CPU {d['system']['cpu']}", "",
           _md_table(header, rows)]
    if d["ratios"]:
        rh = ["threads", "vs", f"pp{pp} ratio", f"tg{tg} ratio"]
        if c["ctx_depth"]:
            rh.append(f"tg@{c['ctx_depth']} ratio")
        rh += ["peak RSS ratio"]
        rr = []
        for q in d["ratios"]:
            row = [str(q["threads"]), q["peer"], _x(q["pp"]), _x(q["tg"])]
            if c["ctx_depth"]:
                row.append(_x(q["tg_depth"]))
            row.append(_x(q["peak_rss"]))
            rr.append(row)
        out += ["", "edgeinfer / peer (median / median; > 1.00x = edgeinfer faster or larger):", "",
                _md_table(rh, rr)]
    out += _bandwidth_lines(d)
    for p in d.get("profile") or []:
        out += ["", format_profile(p)]
    for s in d["skipped"]:
        out.append(f"\nskipped {s['spec']}: {s['reason']}")
    if d["runs"] and d["runs"][0]["peak_rss_bytes"] is None and d["runs"][0]["process_peak_rss_bytes"] is not None:
        out.append("\npeak RSS: process-wide ru_maxrss (includes every engine loaded before)")
    if c.get("process_per_engine"):
        out.append("\neach engine ran in a worker process of its own")
    return "\n".join(out)


def _bandwidth_lines(d: dict) -> list[str]:
    """Each decode's bandwidth (median, best) and, with a floor, its share of it; a decode
    above the floor is announced: the floor is then not the upper bound it claims to be."""
    floor = d["config"].get("floor_gb_s")
    lines, over = [], []
    for r in d["runs"]:
        for key in ("tg", "tg_depth"):
            m = r[key]
            if not m or "gb_per_s" not in m:
                continue
            g = m["gb_per_s"]
            share = f", best {g['max'] / floor:.0%} of the floor {floor:.1f} GB/s" if floor else ""
            lines.append(f"  {r['label']}, {r['threads']} thread(s), {key} at depth {m['depth']}: "
                         f"{m['bytes_per_token'] / 1e6:.1f} MB/token, {g['median']:.1f} GB/s "
                         f"(best {g['max']:.1f}){share}")
            if floor and g["max"] > floor:
                over.append(f"{r['label']} {key} {g['max']:.1f} GB/s")
    if not lines:
        return []
    out = ["", "decode bandwidth (tokens/s x bytes per token):"] + lines
    if over:
        out.append(f"\n!! ABOVE THE MEMORY FLOOR ({floor:.1f} GB/s): {'; '.join(over)}. The floor is not an "
                   "upper bound: measure it again (scripts/memory_floor.py) or check the bytes per token.")
    return out


def format_profile(entry: dict) -> str:
    """A Markdown table of one profiled decode (stage_profile.profile_entry)."""
    floor = entry["floor_gb_s"]
    header = ["stage", "ms/token", "MB/token", "GB/s"] + (["of floor"] if floor else [])
    body = []
    for r in entry["stages"]:
        cells = [r["stage"], "-" if r["ms_per_token"] is None else f"{r['ms_per_token']:.3f}",
                 f"{r['bytes_per_token'] / 1e6:.2f}", "-" if r["gb_per_s"] is None else f"{r['gb_per_s']:.1f}"]
        if floor:
            cells.append("-" if r["share_of_floor"] is None else f"{r['share_of_floor']:.0%}")
        body.append(cells)
    title = (f"decode profile, {entry['threads']} thread(s): {entry['n_tokens']} tokens after a "
             f"{entry['prompt_len']}-token prompt "
             f"(mean depth {entry['mean_depth']:.0f}), {entry['wall_ms_per_token']:.2f} ms/token"
             + (f"; floor {floor:.1f} GB/s" if floor else ""))
    pre = entry["prefill"]
    pre_body = [[r["stage"], f"{r['ms']:.1f}", f"{r['share']:.1%}",
                 "-" if r["gmac_per_s"] is None else f"{r['gmac_per_s']:.1f}"] for r in pre["stages"]]
    pre_title = (f"prefill profile, {entry['threads']} thread(s): {pre['n_tokens']} tokens from an empty context, "
                 f"{pre['wall_ms']:.1f} ms ({pre['tokens_per_s']:.1f} t/s)")
    return (title + "\n\n" + _md_table(header, body) + "\n\n" + pre_title + "\n\n"
            + _md_table(["stage", "ms", "share", "billion multiply-adds/s"], pre_body))


def _x(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}x"
