"""`edgeinfer doctor`: what this machine offers edgeinfer, truthfully.

Reports the CPU (model, SIMD features from /proc/cpuinfo and what the native
library detected and will dispatch), physical cores, CUDA (device, compute
capability, memory, or the reason there is none), free memory (container
limits included) and, given a model, the largest --ctx x --slots that fits.
Every probe is best effort: a missing file or tool becomes a reason, never a crash.
"""
from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any, Optional

__all__ = ["cpu_report", "cuda_report", "memory_report", "doctor_report", "format_report"]

# flags worth showing, by architecture (/proc/cpuinfo names)
_X86_FLAGS = ("sse4_2", "avx", "f16c", "fma", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq",
              "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")
_ARM_FLAGS = ("asimd", "fphp", "asimdhp", "asimddp", "i8mm", "bf16", "sve", "sve2")
_ARM_PARTS = {  # (implementer, part) -> core name, for boards whose cpuinfo has no model name
    ("0x41", "0xd03"): "Cortex-A53", ("0x41", "0xd04"): "Cortex-A35", ("0x41", "0xd05"): "Cortex-A55",
    ("0x41", "0xd07"): "Cortex-A57", ("0x41", "0xd08"): "Cortex-A72", ("0x41", "0xd09"): "Cortex-A73",
    ("0x41", "0xd0a"): "Cortex-A75", ("0x41", "0xd0b"): "Cortex-A76", ("0x41", "0xd0c"): "Neoverse-N1",
    ("0x41", "0xd0d"): "Cortex-A77", ("0x41", "0xd41"): "Cortex-A78", ("0x41", "0xd42"): "Cortex-A78AE",
    ("0x41", "0xd40"): "Neoverse-V1", ("0x41", "0xd49"): "Neoverse-N2", ("0x41", "0xd4f"): "Neoverse-V2",
    ("0x41", "0xd46"): "Cortex-A510", ("0x41", "0xd47"): "Cortex-A710", ("0x4e", "0x004"): "NVIDIA Carmel",
    ("0x61", "0x022"): "Apple M1", ("0x61", "0x023"): "Apple M1",
}


def _read(path: str) -> Optional[str]:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


def _cpuinfo() -> dict[str, str]:
    """First value of each key in /proc/cpuinfo (all cores agree on what we read)."""
    out: dict[str, str] = {}
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            out.setdefault(k.strip(), v.strip())
    return out


def cpu_report() -> dict[str, Any]:
    info = _cpuinfo()
    machine = platform.machine()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    wanted = _ARM_FLAGS if machine in ("aarch64", "arm64") or "asimd" in flags else _X86_FLAGS
    model = info.get("model name") or info.get("Model") or info.get("Hardware") or ""
    if not model and info.get("CPU implementer"):
        model = _ARM_PARTS.get((info.get("CPU implementer", ""), info.get("CPU part", "")),
                               f"implementer {info.get('CPU implementer')} part {info.get('CPU part')}")
    board = (_read("/proc/device-tree/model") or "").strip("\x00\n ")
    rep: dict[str, Any] = {
        "arch": machine,
        "model": model or platform.processor() or "unknown",
        "board": board or None,
        "features": [f for f in wanted if f in flags],
        "logical_cpus": os.cpu_count(),
    }
    try:
        rep["usable_cpus"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        rep["usable_cpus"] = os.cpu_count()
    rep.update(_native_report(flags))
    return rep


def _native_report(flags: set[str]) -> dict[str, Any]:
    try:
        from ..backends.cpu import cpu_report as native
    except ImportError as e:
        return {"native": f"not built ({e})"}
    info = native()
    kernels = info["best_isa"]
    if kernels == "neon":
        dp = "asimddp" in flags and os.environ.get("EDGEINFER_NEON_DOTPROD", "") != "0"
        kernels += " + dotprod (vdotq_s32)" if dp else " (no dotprod: vmull/vpadal)"
    elif kernels == "avx512":
        kernels += " (AVX-512 BW/VL/DQ + VNNI)"
    elif kernels == "avx2":
        kernels += " (AVX2 + FMA + F16C)"
    rep = {
        "isa_supported": info["isa_supported"],
        "kernels": kernels,
        "physical_cores": info["physical_cores"],
    }
    cap = os.environ.get("EDGEINFER_ISA")
    if cap:
        rep["isa_cap"] = f"EDGEINFER_ISA={cap}"
    return rep


# ------------------------------------------------------------------ CUDA

def _nvidia_smi() -> tuple[Optional[list[dict]], str]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None, "nvidia-smi not found"
    try:
        r = subprocess.run([exe, "--query-gpu=name,compute_cap,memory.total,memory.free,driver_version",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"nvidia-smi failed ({e})"
    if r.returncode != 0:
        return None, f"nvidia-smi failed: {(r.stderr or r.stdout).strip()[:200]}"
    gpus = []
    for line in r.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            continue
        def mib(x: str) -> Optional[int]:
            try:
                return int(float(x)) * 2**20
            except ValueError:  # "[N/A]" on Jetson (shared memory)
                return None
        gpus.append({"name": parts[0], "compute_capability": parts[1], "memory_total": mib(parts[2]),
                     "memory_free": mib(parts[3]), "driver": parts[4], "source": "nvidia-smi"})
    return (gpus or None), ("" if gpus else "nvidia-smi lists no GPU")


def _libcuda() -> tuple[Optional[list[dict]], str]:
    lib = None
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        return None, "libcuda.so.1 (the NVIDIA driver) is not installed"
    if lib.cuInit(0) != 0:
        return None, "libcuda present but cuInit failed (no device, or the driver is not loaded)"
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return None, "libcuda present but no CUDA device"
    gpus = []
    for i in range(count.value):
        dev = ctypes.c_int(0)
        if lib.cuDeviceGet(ctypes.byref(dev), i) != 0:
            continue
        buf = ctypes.create_string_buffer(256)
        lib.cuDeviceGetName(buf, 256, dev)
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        lib.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)   # COMPUTE_CAPABILITY_MAJOR
        lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)   # COMPUTE_CAPABILITY_MINOR
        integrated = ctypes.c_int(0)
        lib.cuDeviceGetAttribute(ctypes.byref(integrated), 18, dev)  # INTEGRATED (Jetson: shared memory)
        total = ctypes.c_size_t(0)
        fn = getattr(lib, "cuDeviceTotalMem_v2", None) or lib.cuDeviceTotalMem
        fn(ctypes.byref(total), dev)
        gpus.append({"name": buf.value.decode(errors="replace"),
                     "compute_capability": f"{major.value}.{minor.value}", "memory_total": int(total.value),
                     "memory_free": None, "integrated": bool(integrated.value), "source": "libcuda"})
    return (gpus or None), ("" if gpus else "no CUDA device answered")


def _cuda_backend() -> str:
    here = Path(__file__).resolve().parent.parent  # edgeinfer/
    for p in list(here.glob("libedgeinfer_cuda*.so")) + list(here.glob("*/libedgeinfer_cuda*.so")):
        return f"built ({p.name})"
    return "not built (EDGEINFER_CUDA=1 pip install . with nvcc present); CPU kernels are used"


def cuda_report() -> dict[str, Any]:
    gpus, why_smi = _nvidia_smi()
    why_lib = ""
    if gpus is None:
        gpus, why_lib = _libcuda()
    rep: dict[str, Any] = {"devices": gpus or [], "backend": _cuda_backend()}
    if not gpus:
        rep["why_none"] = "; ".join(w for w in (why_smi, why_lib) if w)
    return rep


# ------------------------------------------------------------------ memory

def _meminfo() -> dict[str, int]:
    out = {}
    for line in (_read("/proc/meminfo") or "").splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1]) * (1024 if len(parts) > 2 and parts[2] == "kB" else 1)
    return out


def _cgroup_limit() -> tuple[Optional[int], Optional[int]]:
    """(limit, usage) of this process's memory cgroup (v2, then v1); None when unlimited."""
    for lim_p, use_p in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        lim = (_read(lim_p) or "").strip()
        if not lim:
            continue
        if lim == "max" or not lim.isdigit() or int(lim) >= 1 << 60:
            return None, None
        use = (_read(use_p) or "").strip()
        return int(lim), (int(use) if use.isdigit() else None)
    return None, None


def memory_report() -> dict[str, Any]:
    mi = _meminfo()
    total = mi.get("MemTotal")
    avail = mi.get("MemAvailable", mi.get("MemFree"))
    rep: dict[str, Any] = {"total": total, "available": avail, "swap_free": mi.get("SwapFree")}
    lim, use = _cgroup_limit()
    if lim is not None:
        rep["cgroup_limit"] = lim
        if use is not None:
            left = max(lim - use, 0)
            rep["available"] = min(avail, left) if avail is not None else left
    return rep


# ------------------------------------------------------------------ report

def doctor_report(model: Optional[str] = None, kv: str = "f16", max_batch: int = 256,
                  n_threads: Optional[int] = None) -> dict[str, Any]:
    rep: dict[str, Any] = {"cpu": cpu_report(), "cuda": cuda_report(), "memory": memory_report()}
    try:
        from ..backends.cpu import cpu_report as native

        rep["edgeinfer"] = native()["version"]
    except ImportError:  # pragma: no cover - a broken install; cpu_report() says so
        pass
    if model:
        from . import plan

        m = plan.model_shape(model)
        free = rep["memory"].get("available") or 0
        fits = plan.largest_fit(m, free, kv=kv, max_batch=max_batch, n_threads=n_threads)
        best = max(((c * s, c, s) for s, c in fits.items() if c), default=None)
        rep["model"] = {
            "path": m.path, "name": m.name, "weights": m.weights_bytes, "n_ctx_train": m.n_ctx_train,
            "kv_per_token_per_slot": plan.kv_bytes(m, 1, 1, kv), "kv": kv,
            "largest_ctx_by_slots": {str(s): c for s, c in fits.items()},
            "largest_ctx_x_slots": None if best is None else {"ctx": best[1], "slots": best[2]},
        }
    return rep


def format_report(rep: dict[str, Any]) -> str:
    from .plan import human

    H = lambda n: "?" if n is None else human(n)  # noqa: E731
    cpu, cuda, mem = rep["cpu"], rep["cuda"], rep["memory"]
    lines = [f"edgeinfer {rep.get('edgeinfer', '')}".rstrip()]
    lines.append(f"CPU       {cpu['model']} ({cpu['arch']})" + (f", board: {cpu['board']}" if cpu.get("board") else ""))
    lines.append(f"features  {' '.join(cpu['features']) or '(none of interest)'}")
    if "kernels" in cpu:
        lines.append(f"kernels   {cpu['kernels']}; levels usable here: {', '.join(cpu['isa_supported'])}"
                     + (f" [{cpu['isa_cap']}]" if cpu.get("isa_cap") else ""))
        lines.append(f"cores     {cpu['physical_cores']} physical (default threads), {cpu['logical_cpus']} logical, "
                     f"{cpu['usable_cpus']} usable by this process")
    else:
        lines.append(f"kernels   native library {cpu.get('native')}")
    if cuda["devices"]:
        for i, g in enumerate(cuda["devices"]):
            extra = " (integrated: shares system memory)" if g.get("integrated") else ""
            lines.append(f"CUDA {i}    {g['name']}, compute capability {g['compute_capability']}, "
                         f"memory {H(g['memory_total'])} total, {H(g['memory_free'])} free{extra}")
    else:
        lines.append(f"CUDA      none: {cuda.get('why_none', 'no device')}")
    lines.append(f"          edgeinfer CUDA backend: {cuda['backend']}")
    mem_line = f"memory    {H(mem.get('available'))} available of {H(mem.get('total'))}"
    if mem.get("cgroup_limit"):
        mem_line += f" (container limit {H(mem['cgroup_limit'])})"
    lines.append(mem_line)
    m = rep.get("model")
    if m:
        lines.append(f"model     {m['name']} ({m['path']})")
        lines.append(f"          weights {H(m['weights'])}; KV ({m['kv']}) {H(m['kv_per_token_per_slot'])} per token "
                     f"per slot; trained context {m['n_ctx_train']}")
        for s, c in m["largest_ctx_by_slots"].items():
            lines.append(f"          --slots {s:<3} largest --ctx {c if c else 'none fits'}")
        b = m["largest_ctx_x_slots"]
        if b:
            lines.append(f"fits      --ctx {b['ctx']} --slots {b['slots']} (largest ctx x slots in free memory)")
        else:
            lines.append("fits      nothing: the weights alone exceed free memory")
    return "\n".join(lines)
