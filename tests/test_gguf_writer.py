"""edgeinfer.gguf.writer (over the gguf package's GGUFWriter): the layout read back by the
gguf package's reader and by ours, and typed errors for what cannot be written."""
from __future__ import annotations

import os

import numpy as np
import pytest

from tests.support.strict import require
from edgeinfer.errors import GGUFError
from edgeinfer.gguf import GGUFFile
from edgeinfer.gguf.types import GGMLType as T
from edgeinfer.gguf.types import GGUFValueType as V
from edgeinfer.gguf.writer import GGUFWriter

gguf = require("gguf", "the gguf package is the writer's oracle")


@pytest.mark.parametrize("alignment", [32, 64])
def test_layout_order_types_and_offsets(tmp_path, alignment):
    p = tmp_path / "w.gguf"
    rng = np.random.default_rng(0)
    tensors = {"t.f32": (rng.standard_normal(5).astype(np.float32), (5,), T.F32),
               "t.q8": (rng.integers(0, 255, 2 * 34, dtype=np.uint8), (32, 2), T.Q8_0),
               "t.f16": (rng.standard_normal((3, 7)).astype(np.float16), (7, 3), T.F16)}
    keys = [("general.architecture", "llama", V.STRING), ("z.u32", 7, V.UINT32),
            ("a.i64", -5, V.INT64), ("m.f32", 0.5, V.FLOAT32), ("b.bool", True, V.BOOL)]
    with GGUFWriter(p, alignment=alignment) as w:
        for k, v, _ in keys:
            w.add_kv(k, v)
        for name, (_, shape, t) in tensors.items():
            w.add_tensor_info(name, shape, t)
        w.write_header()
        for name, (data, _, _) in tensors.items():
            w.write_tensor_data(name, data)
    r = gguf.GGUFReader(str(p))
    fields = [f for f in r.fields.values() if not f.name.startswith("GGUF.")]
    want = ([("general.alignment", V.UINT32)] if alignment != 32 else []) + [(k, t) for k, _, t in keys]
    assert [(f.name, f.types[0]) for f in fields] == want          # in the order added, typed
    assert r.alignment == alignment
    starts = [t.data_offset for t in r.tensors]
    assert [t.name for t in r.tensors] == list(tensors)
    assert all(s % alignment == 0 for s in starts)
    assert starts == sorted(starts)
    for t, (name, (data, shape, typ)) in zip(r.tensors, tensors.items()):
        assert t.tensor_type == typ and list(t.shape) == list(shape)
        assert bytes(np.asarray(t.data).tobytes()) == data.tobytes(), name
    # the last tensor ends inside the file, padded to the alignment (as ggml writes it)
    assert os.path.getsize(p) == starts[-1] + -(-tensors["t.f16"][0].nbytes // alignment) * alignment
    with GGUFFile(p) as f:                              # our hardened reader agrees
        assert f.alignment == alignment and f.get("a.i64") == -5
        assert [f.tensors[n].offset for n in tensors] == starts


def test_values_that_do_not_fit_raise_at_the_call(tmp_path):
    w = GGUFWriter(tmp_path / "w.gguf")
    for args in (("k", 300, V.UINT8), ("k", -1, V.UINT32), ("k", 1.5, V.INT32),
                 ("k", "x", V.FLOAT32), ("k", 3, V.STRING), ("k", [], V.ARRAY),
                 ("k", [1, 2**40], V.ARRAY, V.INT32), ("k", [[1]], V.ARRAY),
                 ("k", np.zeros(2, np.complex64))):
        with pytest.raises(GGUFError):
            w.add_kv(*args)
    with pytest.raises(GGUFError):
        GGUFWriter(tmp_path / "w.gguf", alignment=48)
    with pytest.raises(GGUFError):
        w.add_tensor_info("x" * 64, (32,), T.F32)
    with pytest.raises(GGUFError):
        GGUFWriter(tmp_path / "missing" / "w.gguf").write_header()
    w.abort()
    assert os.listdir(tmp_path) == []


def test_writer_roundtrip(tmp_path):
    p = tmp_path / "w.gguf"
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 64)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    with GGUFWriter(p) as w:
        w.add_kv("general.architecture", "llama")
        w.add_kv("u32", 7)
        w.add_kv("i64", -5)
        w.add_kv("f32", 0.5)
        w.add_kv("flag", True)
        w.add_kv("f64", 1.25, V.FLOAT64)
        w.add_kv("strs", ["a", "bé", ""], V.ARRAY, V.STRING)
        w.add_kv("ints", np.arange(4, dtype=np.int32))
        w.add_tensor_info("a", (64, 3), T.F32)
        w.add_tensor_info("b", (5,), T.F32)
        w.write_header()
        w.write_tensor_data("a", a)
        w.write_tensor_data("b", b)
    with GGUFFile(p) as f:
        assert f.get("u32") == 7 and f.get("i64") == -5 and f.get("flag") is True
        assert f.get("f32") == 0.5 and f.get("f64") == 1.25
        assert list(f.get("strs")) == ["a", "bé", ""]
        assert list(f.get("ints")) == [0, 1, 2, 3]
        assert np.array_equal(np.array(f.tensors["a"].data).view(np.float32).reshape(3, 64), a)
        assert f.tensors["b"].offset % 32 == 0
    r = gguf.GGUFReader(str(p))
    assert np.array_equal(r.get_tensor(1).data, b)


def test_writer_failures_leave_nothing(tmp_path):
    p = tmp_path / "w.gguf"
    with pytest.raises(GGUFError):
        with GGUFWriter(p) as w:
            w.add_tensor_info("a", (32, 2), T.Q8_0)
            w.add_tensor_info("b", (32,), T.F32)
            w.write_header()
            w.write_tensor_data("b", np.zeros(32, np.float32))     # out of order
    with pytest.raises(GGUFError):
        with GGUFWriter(p) as w:
            w.add_tensor_info("a", (32, 2), T.Q8_0)
            w.write_header()
            w.write_tensor_data("a", np.zeros(10, np.uint8))        # wrong size
    with pytest.raises(GGUFError):
        with GGUFWriter(p) as w:
            w.add_tensor_info("a", (32,), T.F32)
            w.write_header()                                        # never written
    with pytest.raises(GGUFError):
        GGUFWriter(p).add_tensor_info("a", (30, 2), T.Q8_0)          # not a block multiple
    with pytest.raises(GGUFError):
        w = GGUFWriter(p)
        w.add_kv("k", 1)
        w.add_kv("k", 2)
    assert os.listdir(tmp_path) == []


def test_written_file_follows_the_umask(tmp_path):
    """A converted model must be readable by a service user: 0666 less the umask, as open() does
    (the temporary file it is written through starts at 0600)."""
    for mask, want in ((0o022, 0o644), (0o077, 0o600), (0o002, 0o664)):
        old = os.umask(mask)
        try:
            p = tmp_path / f"m{mask:o}.gguf"
            with GGUFWriter(p) as w:
                w.add_kv("general.architecture", "llama")
                w.add_tensor_info("a", (32,), T.F32)
                w.write_header()
                w.write_tensor_data("a", np.zeros(32, dtype=np.float32))
        finally:
            os.umask(old)
        assert p.stat().st_mode & 0o777 == want, (oct(mask), oct(p.stat().st_mode))
