#!/usr/bin/env python3
"""Make the ONNX Runtime GenAI peer model for `edgeinfer bench --compare ort-genai:DIR`.

There is no hub access here, so the Hugging Face checkpoint of SmolLM2-135M-Instruct is
rebuilt from the shipped GGUF (``tests/support/tiny_checkpoints.py: build_from_gguf``: every tensor
dequantized to f32, Q/K rows un-permuted, tokenizer from the GGUF vocabulary), then ONNX
Runtime GenAI's own model builder turns it into an int4 CPU model:

    python -m onnxruntime_genai.models.builder -i <hf_dir> -o <out> -p int4 -e cpu \\
        -c <tmp> --extra_options block_size=32

(int4, block size 32, symmetric, accuracy_level 4 on CPU = int8 activations: the builder's
defaults for ``-p int4 -e cpu``; ``block_size=32`` is spelled out.) Both models therefore
start from the same weights: the GGUF's Q4_1 values, requantized by each side.

    python scripts/make_ort_model.py            # -> <cache>/ort/smollm2-int4
    python scripts/make_ort_model.py --force    # rebuild
    python scripts/make_ort_model.py --gguf F --out DIR --hf-dir DIR

Needs onnxruntime-genai (its builder also needs onnx, onnx_ir, transformers and torch) and
gguf, safetensors, tokenizers. Prints the output directory on stdout (progress on stderr).
<cache> is ``$EDGEINFER_CACHE`` or ``~/.cache/edgeinfer``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _cache() -> Path:
    env = os.environ.get("EDGEINFER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "edgeinfer"


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _add_index_metadata(hf_dir: Path) -> None:
    """transformers' sharded loader wants index["metadata"] (build_from_gguf writes only the
    weight map): add {"total_size": bytes of all shards}."""
    import json

    idx = hf_dir / "model.safetensors.index.json"
    d = json.loads(idx.read_text())
    if "metadata" not in d:
        total = sum(f.stat().st_size for f in hf_dir.glob("model-*.safetensors"))
        d = {"metadata": {"total_size": total}, **d}
        idx.write_text(json.dumps(d))


def build_hf(gguf: Path, hf_dir: Path, force: bool) -> Path:
    if (hf_dir / "config.json").is_file() and (hf_dir / "tokenizer.json").is_file() and not force:
        _log(f"HF checkpoint already there: {hf_dir}")
        _add_index_metadata(hf_dir)
        return hf_dir
    sys.path.insert(0, str(ROOT))   # tests/ is a package at the repository root
    from tests.support.tiny_checkpoints import build_from_gguf

    if hf_dir.exists():
        shutil.rmtree(hf_dir)
    t0 = time.perf_counter()
    _log(f"rebuilding an HF checkpoint from {gguf} -> {hf_dir}")
    build_from_gguf(gguf, hf_dir)
    _add_index_metadata(hf_dir)
    _log(f"  done in {time.perf_counter() - t0:.1f} s")
    return hf_dir


def build_onnx(hf_dir: Path, out: Path, block_size: int, force: bool, verbose: bool) -> Path:
    if (out / "genai_config.json").is_file() and not force:
        _log(f"ONNX model already there: {out}")
        return out
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError as e:
        sys.exit(f"onnxruntime-genai is not installed ({e}): pip install onnxruntime-genai onnx_ir")
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ort-builder-") as tmp:
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir),
               "-o", str(out), "-p", "int4", "-e", "cpu", "-c", tmp,
               "--extra_options", f"block_size={block_size}"]
        _log("running: " + " ".join(cmd))
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=not verbose, text=True)
        if p.returncode != 0:
            if not verbose:
                sys.stderr.write((p.stdout or "")[-4000:] + (p.stderr or "")[-4000:])
            sys.exit(f"the ONNX Runtime GenAI builder failed (exit {p.returncode})")
        _log(f"  done in {time.perf_counter() - t0:.1f} s")
    if not (out / "genai_config.json").is_file():
        sys.exit(f"the builder wrote no genai_config.json in {out}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, default=_cache() / "models" / GGUF_NAME,
                    help="source GGUF (default: the shipped SmolLM2 Q4_1 in the cache)")
    ap.add_argument("--hf-dir", type=Path, default=_cache() / "hf" / "SmolLM2-135M-Instruct",
                    help="where the rebuilt HF checkpoint goes")
    ap.add_argument("--out", type=Path, default=_cache() / "ort" / "smollm2-int4",
                    help="ONNX Runtime GenAI model directory")
    ap.add_argument("--block-size", type=int, default=32, help="int4 block size (default 32)")
    ap.add_argument("--force", action="store_true", help="rebuild even if present")
    ap.add_argument("--verbose", action="store_true", help="show the builder's output")
    a = ap.parse_args(argv)
    if not a.gguf.is_file():
        sys.exit(f"{a.gguf} not found (edgeinfer pull fetches the default model)")
    hf = build_hf(a.gguf, a.hf_dir, a.force)
    out = build_onnx(hf, a.out, a.block_size, a.force, a.verbose)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
