"""llama.cpp's own Hugging Face -> GGUF converter (convert_hf_to_gguf.py from the
llama-cpp-python 0.3.36 sdist), as an oracle: files it writes must load in edgeinfer.

The sdist is kept in ~/.cache/edgeinfer/sdist by scripts/install_oracles.sh, which is run
here when it is missing (a failure, not a skip, if that cannot be done) and only the converter (convert_hf_to_gguf.py,
conversion/, gguf-py/) is unpacked, per process.

Tiny test tokenizers are not in llama.cpp's table of known pre-tokenizers (it recognises one
by hashing the tokens of a fixed text), so `pre` names the one the tiny tokenizer was built
as ("llama-bpe", "qwen2"), exactly as convert_hf_to_gguf_update.py would have added it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SDIST = (Path(os.environ.get("EDGEINFER_CACHE") or Path.home() / ".cache" / "edgeinfer")
         / "sdist" / "llama_cpp_python-0.3.36.tar.gz")
_PARTS = ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py", "conversion/", "gguf-py/")
_UNPACKED: dict[str, Path] = {}


def converter_dir(tmp: Path) -> Path:
    """The unpacked converter, the sdist fetched first when it is not cached."""
    if "dir" in _UNPACKED:
        return _UNPACKED["dir"]
    if not SDIST.is_file():   # scripts/install_oracles.sh (run by scripts/test.sh) keeps it
        r = subprocess.run(["bash", str(Path(__file__).parents[1] / "scripts" / "install_oracles.sh")],
                           env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True,
                           timeout=1800)
        if r.returncode != 0 or not SDIST.is_file():
            raise FileNotFoundError(f"could not fetch {SDIST.name} (scripts/install_oracles.sh):\n{r.stderr[-2000:]}")
    out = tmp / "llama_cpp_converter"
    with tarfile.open(SDIST) as tf:
        root = next(m.name.split("/")[0] for m in tf.getmembers()) + "/vendor/llama.cpp/"
        members = [m for m in tf.getmembers() if m.name.startswith(root)
                   and any(m.name[len(root):].startswith(p) for p in _PARTS)]
        for m in members:
            m.name = m.name[len(root):]
        tf.extractall(out, members=members, filter="data")
    _UNPACKED["dir"] = out
    return out


def unpack_sdist(prefix: str, keep) -> Path:
    """The files of llama.cpp's tree in the sdist whose path (relative to llama.cpp) `keep` accepts,
    unpacked into a new temporary folder (the sdist fetched first when it is not cached)."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    if not SDIST.is_file():
        converter_dir(tmp)                # fetches the sdist
    with tarfile.open(SDIST) as tf:
        members = []
        for m in tf.getmembers():
            rel = m.name.split("/vendor/llama.cpp/", 1)[-1]
            if keep(rel):
                m.name = rel
                members.append(m)
        tf.extractall(tmp, members=members, filter="data")
    return tmp


def _run(code: str, what: str) -> None:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{what}:\n{r.stderr[-3000:]}")


def convert(src: Path, out: Path, outtype: str, tmp: Path, pre: str | None = None) -> Path:
    """Runs llama.cpp's converter on checkpoint `src` (outtype f32, f16, bf16, q8_0); `pre` names
    the pre-tokenizer of a tokenizer its hash table does not know."""
    d = converter_dir(tmp)
    patch = (f"import conversion.base as b; b.TextModel.get_vocab_base_pre = lambda self, t: {pre!r}; "
             if pre else "")
    code = (f"import sys; sys.path[:0] = [{str(d)!r}, {str(d / 'gguf-py')!r}]; {patch}"
            f"import convert_hf_to_gguf as c; sys.argv = ['convert', {str(src)!r}, '--outfile', "
            f"{str(out)!r}, '--outtype', {outtype!r}]; c.main()")
    _run(code, f"llama.cpp's converter failed on {src}")
    return out


def convert_lora(adapter: Path, base: Path, out: Path, outtype: str, tmp: Path) -> Path:
    """Runs llama.cpp's convert_lora_to_gguf.py on a PEFT adapter of the checkpoint `base`."""
    d = converter_dir(tmp)
    code = (f"import sys; sys.path[:0] = [{str(d)!r}, {str(d / 'gguf-py')!r}]; "
            f"import runpy; sys.argv = ['convert_lora', {str(adapter)!r}, '--base', "
            f"{str(base)!r}, '--outfile', {str(out)!r}, '--outtype', {outtype!r}]; "
            f"runpy.run_path({str(d / 'convert_lora_to_gguf.py')!r}, run_name='__main__')")
    _run(code, f"llama.cpp's LoRA converter failed on {adapter}")
    return out


def both_converters(kind: str, root: Path, pre: str = "qwen2"):
    """Tiny checkpoint `kind` (tests/support/tiny_checkpoints.py) in `root` and its F32 files by our
    converter and by llama.cpp's: (checkpoint, our ConvertResult, our file, llama.cpp's file)."""
    from edgeinfer.convert import convert_checkpoint
    from tests.support import tiny_checkpoints

    d = tiny_checkpoints.build(kind, root / kind)
    ours = root / f"{kind}.ours.gguf"
    result = convert_checkpoint(str(d), str(ours), "f32")
    return d, result, ours, convert(d, root / f"{kind}.llamacpp.gguf", "f32", root, pre=pre)
