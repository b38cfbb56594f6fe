#!/usr/bin/env python3
"""Make Q4_0 / Q8_0 / Q4_K_M variants of the default model for the benchmark table.

Uses llama.cpp's own quantizer through llama-cpp-python (``llama_model_quantize`` with
``allow_requantize``: the shipped file is Q4_1, so its weights are dequantized and
quantized again). Until edgeinfer's converter produces these from the original
checkpoint, this is how docs/performance.md gets its Q4_0 / Q8_0 / Q4_K_M files.

    python scripts/make_quants.py                 # all three, into the model cache
    python scripts/make_quants.py q8_0 --force    # one type, overwrite
    python scripts/make_quants.py --out-dir /tmp  # elsewhere

Prints the path of every file it made (or found already made), one a line, on stdout.
Output names: ``<cache>/models/SmolLM2-135M-Instruct.<TYPE>.gguf``.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

TYPES = {"q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
         "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}


def output_path(src: Path, type_: str, out_dir: Path) -> Path:
    stem = src.name
    for suffix in (".gguf",):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    base = stem.rsplit(".", 1)[0] if "." in stem else stem  # drop the source's ".Q4_1"
    return out_dir / f"{base}.{type_.upper()}.gguf"


@contextlib.contextmanager
def _quiet_stderr(enabled: bool):
    """llama.cpp logs every tensor on fd 2: hide it unless --verbose (errors still raise)."""
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def quantize(src: Path, dst: Path, type_: str, n_threads: int = 0, quiet: bool = True) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, TYPES[type_])
    params.allow_requantize = True
    params.nthread = n_threads
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    try:
        with _quiet_stderr(quiet):
            rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
        if rc != 0:
            raise RuntimeError(f"llama_model_quantize({type_}) failed with code {rc}")
        os.replace(tmp, dst)  # never leave a torn file under the final name
    finally:
        if tmp.exists():
            tmp.unlink()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("types", nargs="*", default=list(TYPES), help=f"any of {', '.join(TYPES)}")
    ap.add_argument("--src", default="default", help="source GGUF file or model name")
    ap.add_argument("--out-dir", default=None, help="default: the edgeinfer model cache")
    ap.add_argument("--force", action="store_true", help="remake files that exist")
    ap.add_argument("--threads", type=int, default=0, help="quantizer threads (0 = all)")
    ap.add_argument("--verbose", action="store_true", help="show llama.cpp's quantizer log")
    args = ap.parse_args(argv)

    from edgeinfer.hub import models_dir, resolve_model

    bad = [t for t in args.types if t.lower() not in TYPES]
    if bad:
        ap.error(f"unknown type(s) {bad}; choose from {list(TYPES)}")
    src = Path(resolve_model(args.src))
    out_dir = Path(args.out_dir) if args.out_dir else models_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    for t in (t.lower() for t in args.types):
        dst = output_path(src, t, out_dir)
        if dst.exists() and not args.force:
            print(f"{t}: exists, kept ({dst})", file=sys.stderr)
        else:
            t0 = time.perf_counter()
            quantize(src, dst, t, args.threads, quiet=not args.verbose)
            print(f"{t}: wrote {dst.stat().st_size / 2**20:.1f} MiB in "
                  f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
        print(dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
