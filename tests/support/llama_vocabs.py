"""llama.cpp's own tokenizer test data from the llama-cpp-python 0.3.36 sdist: the vocabulary
files ``models/ggml-vocab-<name>.gguf`` with their test vectors (``.inp`` texts, ``.out`` ids,
as llama.cpp's tests/test-tokenizer-0 reads them), and its Unicode table
``src/unicode-data.cpp``. Unpacked from the cached sdist (tests/support/llama_cpp_convert.py
fetches it) into a temporary folder, once per process."""
from __future__ import annotations

import re
from itertools import pairwise
from pathlib import Path

from .llama_cpp_convert import unpack_sdist

_SEP = "\n__ggml_vocab_test__\n"
_UNPACKED: dict[str, Path] = {}


def _root() -> Path:
    if "root" not in _UNPACKED:
        _UNPACKED["root"] = unpack_sdist(
            "llama_vocabs_", lambda rel: rel.startswith("models/ggml-vocab-") or rel == "src/unicode-data.cpp")
    return _UNPACKED["root"]


def vocab_path(name: str) -> Path:
    """``models/ggml-vocab-<name>.gguf``."""
    return _root() / "models" / f"ggml-vocab-{name}.gguf"


def test_vectors(name: str) -> dict[str, list[int]]:
    """text -> ids (tokenized without BOS/EOS and without parsing special tokens), read like
    test-tokenizer-0: texts separated by the marker line, one line of ids per text, a text
    that appears twice tested once."""
    path = vocab_path(name)
    raw = Path(f"{path}.inp").read_bytes().decode("utf-8")
    texts = raw.split(_SEP)
    if raw.endswith(_SEP):
        texts.pop()
    lines = Path(f"{path}.out").read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(texts) != len(lines):
        raise ValueError(f"{path}: {len(texts)} texts but {len(lines)} lines of ids")
    return {t: [int(x) for x in line.split()] for t, line in zip(texts, lines)}


test_vectors.__test__ = False  # a helper, not a test


def unicode_flags() -> list[int]:
    """llama.cpp's flags of every code point (its unicode_cpt_flags bits: 0x1 undefined,
    0x2 number, 0x4 letter, 0x8 separator, 0x10 mark, 0x20 punctuation, 0x40 symbol,
    0x80 control, 0x100 whitespace), from its range table and whitespace set."""
    text = (_root() / "src" / "unicode-data.cpp").read_text(encoding="utf-8")
    ranges_src = text[text.index("unicode_ranges_flags"):text.index("unicode_set_whitespace")]
    ranges = [(int(a, 16), int(b, 16))
              for a, b in re.findall(r"\{0x([0-9A-Fa-f]+), 0x([0-9A-Fa-f]+)\}", ranges_src)]
    flags = [0x1] * 0x110000
    for (start, f), (end, _) in pairwise(ranges):
        flags[start:end] = [f] * (min(end, 0x110000) - start)
    ws_src = text[text.index("unicode_set_whitespace"):text.index("unicode_map_lowercase")]
    for cp in re.findall(r"0x([0-9A-Fa-f]+)", ws_src):
        flags[int(cp, 16)] |= 0x100
    return flags
