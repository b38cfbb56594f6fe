"""Importance matrices (llama.cpp's "imatrix"): for each weight tensor, the sum over
calibration tokens of every input column's squared activation, and how many tokens made it.

The quantizer weights each column's rounding error by the mean (sum / count), so the columns
the model leans on keep more precision. Matrices are read from llama.cpp's files (the GGUF
format `llama-imatrix` writes and its legacy `.dat` format), collected here by the reference
forward (edgeinfer/arch/reference.py) on calibration text, and written in the GGUF format, so
llama.cpp's `llama-quantize --imatrix` takes ours and `edgeinfer convert --imatrix` takes
theirs. Entry names are GGUF tensor names ("blk.0.attn_q.weight"); a tensor without an
entry is quantized without one, as llama.cpp does.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from ..errors import ConversionError, GGUFError
from ..gguf import GGUFFile
from ..gguf.types import GGMLType, GGUFValueType
from ..gguf.writer import GGUFWriter
from .quantize import IMPORTANCE_TYPES

__all__ = ["Imatrix", "collect"]

_SUMS, _COUNTS = ".in_sum2", ".counts"


@dataclass
class Imatrix:
    """sums[name]: float32 [n_mat, n_cols] (n_mat > 1 only for a stack of experts);
    counts[name]: float32 [n_mat], the tokens each row of sums adds up. A legacy file holds
    per-column means times `ncall` and counts [ncall] instead (`legacy`)."""
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, np.ndarray] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 0
    legacy: bool = False

    def importance(self, name: str, n_cols: int) -> np.ndarray | None:
        """The per-column weights for tensor `name` with rows of n_cols, as llama-quantize
        derives them (sums / count; a row with no tokens weighs every column 1), or None
        when the matrix has no entry for it (or, as there, one of the wrong size for
        token_embd)."""
        if name not in self.sums:
            return None
        s = self.sums[name].astype(np.float32)
        c = self.counts[name].astype(np.float32).reshape(-1)
        if s.shape != (1, n_cols):
            if name == "token_embd.weight":    # llama-quantize quantizes it without, too
                return None
            raise ConversionError(
                f"the importance matrix holds {s.size} values for {name!r}, whose rows have "
                f"{n_cols} (a matrix made for another model?)")
        s, c = s[0], c[0]
        if self.legacy:
            return s / c if c > 0 else s
        return s / c if c > 0 else np.ones_like(s)

    # ------------------------------------------------------------------ files
    @classmethod
    def load(cls, path: str) -> "Imatrix":
        """Reads llama.cpp's GGUF imatrix or its legacy .dat file; ConversionError if it is
        neither, is truncated, or holds values that are not finite."""
        try:
            with open(path, "rb") as fh:
                magic = fh.read(4)
        except OSError as e:
            raise ConversionError(f"cannot read the importance matrix {path}: {e}") from None
        im = cls._load_gguf(path) if magic == b"GGUF" else cls._load_legacy(path)
        if not im.sums:
            raise ConversionError(f"the importance matrix {path} holds no entries")
        for name, s in im.sums.items():
            if not (np.isfinite(s).all() and np.isfinite(im.counts[name]).all()):
                raise ConversionError(f"the importance matrix {path} holds non-finite values "
                                      f"for {name!r}")
            if (s < 0).any():
                raise ConversionError(f"the importance matrix {path} holds negative sums of "
                                      f"squares for {name!r}")
        return im

    @classmethod
    def _load_gguf(cls, path: str) -> "Imatrix":
        im = cls()
        try:
            with GGUFFile(path) as f:
                kind = f.get("general.type", "imatrix")
                if kind != "imatrix":
                    raise ConversionError(f"{path} is not an importance matrix: its general.type "
                                          f"is {kind!r}")
                ds = f.get("imatrix.datasets", [])
                im.datasets = [str(d) for d in (ds if isinstance(ds, list) else [ds])]
                im.chunk_count = int(f.get("imatrix.chunk_count", 0))
                im.chunk_size = int(f.get("imatrix.chunk_size", 0))
                pairs: dict[str, dict[str, np.ndarray]] = {}
                for name, ti in f.tensors.items():
                    for suffix in (_SUMS, _COUNTS):
                        if name.endswith(suffix):
                            if ti.ggml_type != GGMLType.F32:
                                raise ConversionError(f"{path}: {name} is {ti.type_name}, not F32")
                            pairs.setdefault(name[:-len(suffix)], {})[suffix] = (
                                np.array(ti.data).view("<f4").reshape(ti.shape[::-1]))
        except GGUFError as e:
            raise ConversionError(f"the importance matrix {path} is not a valid GGUF file: {e}") from None
        for name, p in sorted(pairs.items()):
            if len(p) != 2:
                raise ConversionError(f"{path}: {name} has sums without counts or counts without sums")
            sums, counts = p[_SUMS], p[_COUNTS].reshape(-1)
            if sums.size % max(counts.size, 1) or counts.size == 0:
                raise ConversionError(f"{path}: {name} has {sums.size} sums for {counts.size} counts")
            im.sums[name] = sums.reshape(counts.size, -1)
            im.counts[name] = np.floor(counts + 0.5).astype(np.float32)   # lround, as llama.cpp reads them
        return im

    @classmethod
    def _load_legacy(cls, path: str) -> "Imatrix":
        with open(path, "rb") as fh:
            data = fh.read()
        im, off = cls(legacy=True), 0

        def bad(detail: str) -> ConversionError:
            return ConversionError(f"the importance matrix {path} is neither GGUF nor a legacy "
                                   f".dat imatrix ({detail})")

        def take(fmt: str, what: str):
            nonlocal off
            n = struct.calcsize(fmt)
            if off + n > len(data):
                raise bad(f"it ends inside {what}")
            v = struct.unpack_from(fmt, data, off)
            off += n
            return v

        (n_entries,) = take("<i", "the entry count")
        if n_entries < 1:
            raise bad(f"{n_entries} entries")
        for i in range(n_entries):
            (n,) = take("<i", f"entry {i}'s name length")
            if not 0 < n <= 4096:
                raise bad(f"entry {i} has a name of {n} bytes")
            name = take(f"<{n}s", f"entry {i}'s name")[0].decode("utf-8", "replace")
            ncall, nval = take("<ii", f"entry {i}'s counts")
            if not 0 < nval <= (len(data) - off) // 4:
                raise bad(f"{name} has {nval} values")
            im.sums[name] = np.array(take(f"<{nval}f", name), dtype=np.float32).reshape(1, -1)
            im.counts[name] = np.array([ncall], dtype=np.float32)
        if off + 4 <= len(data):        # optional: the chunk count and the dataset's name
            (im.chunk_count,) = take("<i", "the chunk count")
            if off + 4 <= len(data):
                (n,) = take("<i", "the dataset name's length")
                if 0 < n <= len(data) - off:
                    im.datasets = [take(f"<{n}s", "the dataset name")[0].decode("utf-8", "replace")]
        return im

    def save(self, path: str) -> None:
        """Writes the GGUF format llama-imatrix writes (atomically): general.type "imatrix",
        imatrix.datasets / chunk_count / chunk_size, and per entry NAME.in_sum2 (F32,
        [n_cols, n_mat]) and NAME.counts (F32, [1, n_mat]), names sorted."""
        if self.legacy:
            raise ConversionError("a legacy importance matrix holds means, not sums; it is not "
                                  "written back as GGUF")
        with GGUFWriter(path) as w:
            w.add_kv("general.type", "imatrix")
            w.add_kv("imatrix.datasets", list(self.datasets), GGUFValueType.ARRAY, GGUFValueType.STRING)
            w.add_kv("imatrix.chunk_count", int(self.chunk_count), GGUFValueType.UINT32)
            w.add_kv("imatrix.chunk_size", int(self.chunk_size), GGUFValueType.UINT32)
            names = sorted(self.sums)
            for n in names:
                n_mat, n_cols = self.sums[n].shape
                w.add_tensor_info(n + _SUMS, (n_cols, n_mat), GGMLType.F32)
                w.add_tensor_info(n + _COUNTS, (1, n_mat), GGMLType.F32)
            w.write_header()
            for n in names:
                w.write_tensor_data(n + _SUMS, np.ascontiguousarray(self.sums[n], dtype=np.float32))
                w.write_tensor_data(n + _COUNTS, np.ascontiguousarray(self.counts[n], dtype=np.float32))

    def metadata(self, path: str) -> list[tuple[str, object, str]]:
        """The quantize.imatrix.* keys llama-quantize writes into a file it quantized with
        this matrix (strings cut to 127 bytes as there)."""
        kv: list[tuple[str, object, str]] = [("quantize.imatrix.file", _cut(os.fspath(path)), "STRING")]
        if self.datasets:
            kv.append(("quantize.imatrix.dataset", _cut(self.datasets[0]), "STRING"))
        kv.append(("quantize.imatrix.entries_count", len(self.sums), "UINT32"))
        if self.chunk_count > 0:
            kv.append(("quantize.imatrix.chunks_count", int(self.chunk_count), "UINT32"))
        return kv


def _cut(text: str, limit: int = 127) -> str:
    """`text` cut to `limit` UTF-8 bytes (llama-quantize's strncpy), a split character dropped."""
    return text.encode()[:limit].decode(errors="ignore")


class ImportanceUse:
    """An importance matrix as one conversion uses it: each tensor's per-column weights, and
    which of the tensors whose type takes weights it had an entry for."""

    def __init__(self, matrix: Imatrix | None):
        self.matrix = matrix
        self.weighted: list[str] = []
        self.unweighted: list[str] = []

    def weights(self, name: str, n_cols: int, type_id: int) -> np.ndarray | None:
        if self.matrix is None:
            return None
        qw = self.matrix.importance(name, n_cols)
        if type_id in IMPORTANCE_TYPES:
            (self.weighted if qw is not None else self.unweighted).append(name)
        return qw

    def notes(self) -> list[str]:
        """What the matrix covered, for the user (nothing without a matrix)."""
        if self.matrix is None:
            return []
        missing = (f"; it has no entry for {', '.join(self.unweighted[:3])}"
                   f"{' ...' if len(self.unweighted) > 3 else ''}" if self.unweighted else "")
        return [f"the importance matrix weighted {len(self.weighted)} of the "
                f"{len(self.weighted) + len(self.unweighted)} tensors whose type uses one{missing}"]


# ------------------------------------------------------------------ collection
def collect(ref, windows: list[list[int]], dataset: str,
            progress: Callable[[str], None] | None = None) -> Imatrix:
    """Runs the reference forward `ref` (a table-driven arch.reference.Reference) over the
    token windows and sums every block matmul's squared inputs per column, as llama-imatrix
    sums them (the recurrent mixers' projections included); like llama-imatrix by default,
    it leaves out the output head."""
    from ..arch.reference import Reference

    if not isinstance(ref, Reference):
        raise ConversionError("importance matrices are collected by the table-driven reference "
                              "forward, which this family does not use")
    note = progress or (lambda s: None)
    ids = [np.asarray(w, dtype=np.int64) for w in windows if len(w)]
    if not ids:
        raise ConversionError("the calibration text gave no tokens")
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    pos = {len(w): ref.positions(len(w)) for w in ids}
    # one embedding lookup for every chunk: the table is read from the checkpoint once
    xs = np.split(ref.embed(np.concatenate(ids)), np.cumsum([len(w) for w in ids])[:-1])
    for i in range(ref.params.n_layer):    # the main layers: a multi-token-prediction block is not run
        note(f"layer {i}")
        layer = ref.layer(i)
        first_role = {roles[0]: name for name, roles in layer.parts.items()}

        def observe(role: str, x: np.ndarray, names: Mapping[str, str] = first_role) -> None:
            name = names.get(role)     # a fused tensor's parts share one input: count it once
            if name is None:
                return
            sq = np.einsum("ij,ij->j", x, x, dtype=np.float64)
            sums[name] = sums[name] + sq if name in sums else sq
            counts[name] = counts.get(name, 0) + x.shape[0]

        layer.observe = observe
        xs = [layer.forward(x, pos[len(x)]) for x in xs]
        del layer
    chunk = max(len(w) for w in ids)
    return Imatrix({n: s.astype(np.float32)[None, :] for n, s in sums.items()},
                   {n: np.array([c], dtype=np.float32) for n, c in counts.items()},
                   [dataset], len(ids), chunk)
