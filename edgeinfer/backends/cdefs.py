"""cffi declarations from the C headers, and the native layout list (edgeinfer_layout.def).

cffi parses declarations, not preprocessor lines. Two users: native/build_ffi.py (the CPU
extension, at build time; it loads this file by path, so it imports nothing of edgeinfer) and
backends/cuda.py (the CUDA library, at run time, where no C compiler may exist). A header's
X-macro expansions, a `#define M(...)` then `#include "list.def"` then `#undef M`, are expanded
here as the preprocessor would, so the role enum reaches cffi from the one list.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

__all__ = ["cdef_from_header", "xmacro_rows", "Role", "layout_roles", "LAYOUT_DEF"]

#: The list of weight roles, next to the headers that expand it.
LAYOUT_DEF = "edgeinfer_layout.def"

_XMACRO = re.compile(r'^[ \t]*#define[ \t]+(\w+)\(([^)]*)\)[ \t]*(.*?)\n'
                     r'[ \t]*#include[ \t]+"([^"]+)"[ \t]*\n[ \t]*#undef[ \t]+\1\b', re.M)


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def _split_args(text: str) -> list[str]:
    """Macro arguments: split at the commas outside parentheses."""
    args, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
            continue
        depth += (ch == "(") - (ch == ")")
        cur += ch
    return args + [cur.strip()]


def xmacro_rows(path: Path, macro: str) -> list[list[str]]:
    """The arguments of every `macro(...)` line of an X-macro list file."""
    rows = []
    for line in _strip_comments(Path(path).read_text(encoding="utf-8")).splitlines():
        m = re.fullmatch(rf"\s*{macro}\((.*)\)\s*", line)
        if m:
            rows.append(_split_args(m.group(1)))
        elif line.strip():
            raise ValueError(f"{path}: not a {macro}(...) line: {line.strip()!r}")
    return rows


def _expand_xmacros(text: str, folder: Path) -> str:
    def expand(m: re.Match) -> str:
        name, params, body, listed = m.groups()
        params = [p.strip() for p in params.split(",")]
        lines = []
        for args in xmacro_rows(folder / listed, name):
            if len(args) != len(params):
                raise ValueError(f"{listed}: {name} takes {len(params)} arguments, got {args}")
            values = dict(zip(params, args))
            line = re.sub(r"\b\w+\b", lambda t: values.get(t.group(), t.group()), body)
            lines.append(re.sub(r"\s*##\s*", "", line))
        return "\n".join(lines)
    return _XMACRO.sub(expand, text)


def cdef_from_header(path: Path | str) -> str:
    """The header as cffi can parse it: X-macro lists expanded, comments, preprocessor lines
    (continued ones too) and C++ guards removed."""
    path = Path(path)
    text = path.read_text(encoding="utf-8").replace("\\\n", " ")   # continued macro lines
    text = _expand_xmacros(_strip_comments(text), path.parent)
    text = re.sub(r"#ifdef __cplusplus.*?#endif", "", text, flags=re.S)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


class Role(NamedTuple):
    """One EI_ROLE line of edgeinfer_layout.def (its comment says what each column means)."""
    name: str        # the architecture table's role: EI_T_<NAME> lower-cased
    id: int
    field: str
    vector: bool
    per_layer: bool
    ne0: str         # shape expressions over the config (n_embd, q_dim, ..., rope_half)
    ne1: str
    when: str | None  # the config flag the role is present iff; None: ALWAYS or OPTIONAL
    optional: bool
    layer_kind: str | None = None   # present only on layers of this kind (ei_layer_kind, lower case)
    stores_kv: bool = False         # present only on the layers that store KV (not Gemma 4's KV-shared ones)

    def shape(self, dims: dict[str, int]) -> tuple[int, ...]:
        """Its GGML shape for the dimensions `dims` (1-D for vectors, as the GGUF file holds them)."""
        value = {"1": 1, **dims}
        ne = (value[self.ne0],) if self.vector and self.ne1 == "1" else (value[self.ne0], value[self.ne1])
        return ne


def layout_roles(path: Path | str) -> list[Role]:
    """The roles of the native layout, in list order."""
    out = []
    for name, id_, field, kind, scope, ne0, ne1, presence in xmacro_rows(Path(path), "EI_ROLE"):
        flag = re.fullmatch(r"(?:ATTN_|KV_)?IF\((\w+)\)", presence)
        on = re.fullmatch(r"ON\((\w+)\)", presence)
        if kind not in ("VECTOR", "MATRIX") or scope not in ("GLOBAL", "LAYER") or not (
                flag or on or presence in ("ALWAYS", "OPTIONAL", "ATTN", "KV")):
            raise ValueError(f"{path}: bad EI_ROLE({name}, ...): {kind}, {scope}, {presence}")
        layer_kind = on.group(1).lower() if on else "attention" if presence.startswith(("ATTN", "KV")) else None
        out.append(Role(name.lower(), int(id_), field, kind == "VECTOR", scope == "LAYER", ne0, ne1,
                        flag.group(1) if flag else None, presence == "OPTIONAL", layer_kind,
                        presence.startswith("KV")))
    return out
