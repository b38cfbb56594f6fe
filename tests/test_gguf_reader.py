"""The validated GGUF reader: the real model against the `gguf` package, the tiny valid file,
every malformed corpus file and every truncation (GGUFError and nothing else, with a bounded
allocation), and random mutations."""
from __future__ import annotations

import contextlib
import hashlib
import tracemalloc

import numpy as np
import pytest
from tests.support.strict import require

import edgeinfer
from edgeinfer.errors import GGUFError, ModelNotFoundError
from edgeinfer.gguf import (
    COMPUTE_TYPES,
    GGML_TYPES,
    GGMLType,
    GGUFFile,
    GGUFValueType,
    ggml_type_info,
)
from edgeinfer.gguf import reader as reader_mod
from edgeinfer.model.config import ModelConfig

from tests.support.gguf_corpus import (
    ARRAY,
    FLOAT32,
    FLOAT64,
    INT8,
    STRING,
    UINT8,
    UINT16,
    UINT64,
    malformed_corpus,
    tiny_llama,
    truncations,
)

gguf = require("gguf", "the gguf package is the reader's oracle")

MALFORMED = dict(malformed_corpus())
# A length field must be checked before it is believed: opening the tiny file (74 KB) never
# allocates more than this, whatever its header claims (a believed 2**32 count would).
TINY_OPEN_PEAK = 1 << 20


@contextlib.contextmanager
def _peak():
    """{"bytes": the peak Python allocation inside the block}, filled in when the block exits."""
    box: dict = {}
    tracemalloc.start()
    try:
        yield box
    finally:
        box["bytes"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("gguf_corpus")


def _write(directory, name: str, data: bytes):
    p = directory / (name.replace("/", "_")[:120] + ".gguf")
    p.write_bytes(data)
    return p


# ----------------------------------------------------------------- type table

def test_type_table_matches_gguf_package():
    from gguf.constants import GGML_QUANT_SIZES

    for t, (bs, ts) in GGML_QUANT_SIZES.items():
        info = GGML_TYPES[int(t)]
        assert (info.name, info.block_size, info.type_size) == (t.name, bs, ts)
    assert set(GGML_TYPES) == {int(t) for t in GGML_QUANT_SIZES}
    # the types the reader lets through to the kernels are the native type table's, no more
    from edgeinfer._native import ffi, lib
    be, bb = ffi.new("int32_t *"), ffi.new("int32_t *")
    native = {t for t in GGML_TYPES if lib.ei_type_block(t, be, bb) == 0}
    assert {int(t) for t in COMPUTE_TYPES} == native
    assert {"Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"} <= {t.name for t in COMPUTE_TYPES}
    assert GGMLType.Q4_K == 12 and GGMLType.BF16 == 30
    with pytest.raises(GGUFError, match="removed"):
        ggml_type_info(4)


# ----------------------------------------------------------------- the real model

@pytest.fixture(scope="module")
def real(smollm2_path):
    f = GGUFFile(smollm2_path)
    yield f
    f.close()


@pytest.fixture(scope="module")
def oracle(smollm2_path):
    return gguf.GGUFReader(str(smollm2_path))


@pytest.mark.slow
def test_real_model_opens_without_reading_the_data(smollm2_path):
    """Opening parses the header only: the tensor data stays in the map, so what Python
    allocates (the metadata: 49152 tokens, the merges) is a fraction of the file."""
    with _peak() as mem, GGUFFile(smollm2_path) as f:
        assert len(f.metadata["tokenizer.ggml.tokens"]) == 49152
    assert mem["bytes"] < smollm2_path.stat().st_size // 4, mem


@pytest.mark.slow
def test_real_model_tensors_match_gguf_package(real, oracle):
    assert real.version == 3 and real.alignment == oracle.alignment == 32
    assert real.data_offset == oracle.data_offset
    assert list(real.tensors) == [t.name for t in oracle.tensors]
    for rt in oracle.tensors:
        t = real.tensors[rt.name]
        assert t.type == int(rt.tensor_type), rt.name
        assert t.type_name == rt.tensor_type.name
        assert t.shape == tuple(int(x) for x in rt.shape), rt.name
        assert t.n_elements == int(rt.n_elements)
        assert t.nbytes == int(rt.n_bytes)
        assert t.offset == int(rt.data_offset)
        assert t.data.dtype == np.uint8 and t.data.shape == (t.nbytes,)
    # bytes equal for a sample of tensors of every type
    seen = set()
    for rt in oracle.tensors:
        if rt.tensor_type in seen:
            continue
        seen.add(rt.tensor_type)
        t = real.tensors[rt.name]
        assert hashlib.sha256(t.data).digest() == hashlib.sha256(rt.data.tobytes()).digest()


@pytest.mark.slow
def test_real_model_metadata_matches_gguf_package(real, oracle):
    keys = [k for k in oracle.fields if not k.startswith("GGUF.")]
    assert list(real.metadata) == keys
    for k in keys:
        expected = oracle.fields[k].contents()
        got = real.metadata[k]
        if isinstance(got, np.ndarray):
            got = got.tolist()
        assert got == expected, k
    assert real.get("general.architecture", kind=str) == "llama"
    assert real.get("llama.block_count", kind=int) == 30
    assert real.field_type("llama.block_count") == (GGUFValueType.UINT32, None)
    assert real.field_type("tokenizer.ggml.token_type") == (GGUFValueType.ARRAY, GGUFValueType.INT32)
    tt = real.get("tokenizer.ggml.token_type", kind=np.ndarray)
    assert tt.dtype == np.dtype("<i4") and tt.shape == (49152,)
    assert not tt.flags.writeable and not tt.flags.owndata   # a view of the map


def test_real_model_data_is_zero_copy(real):
    t = real.tensors["token_embd.weight"]
    d = t.data
    assert not d.flags.owndata and not d.flags.writeable
    base = real._buf
    assert d.ctypes.data - base.ctypes.data == t.offset
    assert np.shares_memory(d, base)


def _resident_kib(address: int) -> int:
    """Resident KiB of the mapping that holds `address` in this process (Linux
    /proc/self/smaps): the file's other mappings (another open of it) are not counted."""
    inside = False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:
                lo, hi = (int(v, 16) for v in head[0].split("-"))
                inside = lo <= address < hi
            elif inside and head[0] == "Rss:":
                return int(head[1])
    raise AssertionError(f"no mapping holds {address:#x}")


def test_release_drops_read_pages_and_data_reads_the_same(smollm2_path):
    with GGUFFile(smollm2_path) as f:
        digests = {n: hashlib.sha256(t.data).hexdigest() for n, t in f.tensors.items()}
        address = f._buf.ctypes.data
        touched = _resident_kib(address)
        for t in f.tensors.values():
            f.release(t)
        assert touched > 0.9 * f.size / 1024 > 50 * _resident_kib(address)
        assert {n: hashlib.sha256(t.data).hexdigest() for n, t in f.tensors.items()} == digests


# ----------------------------------------------------------------- the tiny valid files

TINY_VARIANTS = {
    "llama": dict(),
    "llama_tied": dict(tied=True),
    "llama_v2": dict(version=2),
    "llama_align64": dict(alignment=64),
    "llama_align1": dict(alignment=1),
    "qwen2": dict(arch="qwen2"),
}


@pytest.mark.parametrize("variant", list(TINY_VARIANTS))
def test_tiny_valid_opens_and_matches_gguf_package(tmp_path, variant):
    b = tiny_llama(**TINY_VARIANTS[variant])
    data = b.build()
    p = _write(tmp_path, variant, data)
    with GGUFFile(p) as f:
        oracle = gguf.GGUFReader(str(p))
        assert f.alignment == (TINY_VARIANTS[variant].get("alignment") or 32)
        assert f.data_offset == b.layout["data_offset"] == oracle.data_offset
        assert f.version == TINY_VARIANTS[variant].get("version", 3)
        assert [t.name for t in oracle.tensors] == list(f.tensors)
        for rt in oracle.tensors:
            t = f.tensors[rt.name]
            assert (t.type, t.shape, t.offset, t.nbytes) == (
                int(rt.tensor_type), tuple(int(x) for x in rt.shape), int(rt.data_offset),
                int(rt.n_bytes))
            assert bytes(t.data) == rt.data.tobytes()
        for k, field in oracle.fields.items():
            if k.startswith("GGUF."):
                continue
            got = f.metadata[k]
            got = got.tolist() if isinstance(got, np.ndarray) else got
            exp = field.contents()
            if isinstance(exp, float):
                assert got == pytest.approx(exp)
            else:
                assert got == exp, k
        assert f.metadata["tokenizer.ggml.tokens"][31:34] == ["日本", "🙂", "th"]
        assert f.metadata["tokenizer.ggml.add_bos_token"] is True
        ModelConfig.from_gguf(f)


def test_typed_getter(tmp_path):
    p = _write(tmp_path, "tiny", tiny_llama().build())
    with GGUFFile(p) as f:
        assert f.get("llama.block_count", kind=int) == 2
        assert isinstance(f.get("llama.rope.freq_base", kind=float), float)
        assert f.get("tokenizer.ggml.add_bos_token", kind=bool) is True
        assert f.get("general.tags", kind=list) == ["a", "b"]
        assert f.get("tokenizer.ggml.token_type", kind=list)[:4] == [3, 3, 3, 1]
        assert f.get("nope", 5, kind=int) == 5
        assert f.get("nope", None) is None
        assert "llama.block_count" in f and "nope" not in f
        with pytest.raises(GGUFError, match=r"'nope'.*missing"):
            f.get("nope", kind=int)
        with pytest.raises(GGUFError, match=r"'llama.block_count' has type UINT32, expected str"):
            f.get("llama.block_count", kind=str)
        with pytest.raises(GGUFError, match=r"'general.architecture' has type STRING, expected int"):
            f.get("general.architecture", kind=int)
        with pytest.raises(GGUFError, match=r"has type BOOL, expected int"):
            f.get("tokenizer.ggml.add_bos_token", kind=int)
        with pytest.raises(GGUFError, match=r"ARRAY\[STRING\], expected ndarray"):
            f.get("tokenizer.ggml.tokens", kind=np.ndarray)
        with pytest.raises(GGUFError, match=r"UINT32, expected float"):
            f.get("llama.block_count", kind=float)


def test_metadata_scalar_types_roundtrip(tmp_path):
    b = tiny_llama()
    b.add("x.u8", UINT8, 255).add("x.i8", INT8, -128).add("x.u16", UINT16, 65535)
    b.add("x.u64", UINT64, 2**64 - 1).add("x.f64", FLOAT64, 1.5).add("x.empty", ARRAY, [], STRING)
    b.add("x.emptynum", ARRAY, [], FLOAT32).add("x.str", STRING, "")
    b.add("x.bools", ARRAY, [1, 0, 2], 7)
    p = _write(tmp_path, "types", b.build())
    with GGUFFile(p) as f:
        md = f.metadata
        assert (md["x.u8"], md["x.i8"], md["x.u16"], md["x.u64"], md["x.f64"]) == (
            255, -128, 65535, 2**64 - 1, 1.5)
        assert md["x.empty"] == [] and md["x.str"] == ""
        assert md["x.emptynum"].shape == (0,)
        assert md["x.bools"].tolist() == [True, False, True]


def test_close_and_context_manager(tmp_path):
    p = _write(tmp_path, "tiny", tiny_llama().build())
    f = GGUFFile(p)
    t = f.tensors["token_embd.weight"]
    held = t.data  # a view kept past close stays valid (the map lives while it does)
    f.close()
    assert f.closed
    with pytest.raises(GGUFError, match="closed"):
        _ = t.data
    assert held.sum() >= 0
    f.close()  # idempotent
    with GGUFFile(p) as g:
        assert not g.closed
    assert g.closed


def test_missing_file(tmp_path):
    with pytest.raises(ModelNotFoundError):
        GGUFFile(tmp_path / "nope.gguf")
    with pytest.raises(GGUFError):
        GGUFFile(tmp_path)  # a directory


def test_string_limits_are_enforced(tmp_path, monkeypatch):
    p = _write(tmp_path, "tiny", tiny_llama().build())
    monkeypatch.setattr(reader_mod, "MAX_STRING_COUNT", 30)
    with pytest.raises(GGUFError, match="more than 30 strings"):
        GGUFFile(p)
    monkeypatch.setattr(reader_mod, "MAX_STRING_COUNT", 1 << 22)
    monkeypatch.setattr(reader_mod, "MAX_STRING_BYTES", 100)
    with pytest.raises(GGUFError, match="bytes of strings"):
        GGUFFile(p)


def test_errors_are_exported():
    assert issubclass(edgeinfer.GGUFError, ValueError)


# ----------------------------------------------------------------- the malformed corpus

@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_raises_gguf_error(corpus_dir, case):
    p = _write(corpus_dir, case, MALFORMED[case])
    with _peak() as mem, pytest.raises(GGUFError) as ei:
        GGUFFile(p)
    assert mem["bytes"] < TINY_OPEN_PEAK, mem
    assert str(p) in str(ei.value)   # the message names the file


@pytest.mark.slow
def test_every_truncation_raises_gguf_error(tmp_path):
    """The tiny file cut after every byte of its header (and at a few points in the data):
    each cut is a GGUFError naming the file, with a bounded allocation."""
    p = tmp_path / "cut.gguf"
    bad = []
    for n, data in truncations():
        p.write_bytes(data)
        try:
            with _peak() as mem:
                GGUFFile(p).close()
            bad.append((n, "opened"))
        except GGUFError as e:
            if str(p) not in str(e):
                bad.append((n, f"message does not name the file: {e}"))
            elif mem["bytes"] >= TINY_OPEN_PEAK:
                bad.append((n, f"allocated {mem['bytes']} bytes"))
        except Exception as e:  # noqa: BLE001 - anything but GGUFError is the failure reported
            bad.append((n, repr(e)))
    assert not bad, f"{len(bad)} truncations misbehaved; the first: {bad[:5]}"


def test_malformed_corpus_is_broad():
    names = set(MALFORMED)
    for prefix in ("bad_magic", "version_", "tensor_count_", "kv_count_", "key_length",
                   "string_array_length", "unknown_value_type", "tensor_type_", "n_dims_", "dim0_zero",
                   "shape_overflow", "offset_past_end", "misaligned_offset", "alignment_",
                   "overlapping", "duplicate_key", "duplicate_tensor_name", "wrong_type_",
                   "special_token_out_of_range", "utf8_", "nested_array"):
        assert any(n.startswith(prefix) for n in names), prefix


# ----------------------------------------------------------------- fuzz

_BIG = [2**64 - 1, 2**63, 2**63 - 1, 2**32, 0, 5]


def _mutations(data: bytes, header_end: int, n: int, seed: int = 1234):
    rng = np.random.default_rng(seed)
    for i in range(n):
        buf = bytearray(data)
        kind = i % 5
        if kind == 0:       # flip 1..4 random bits in the header
            for _ in range(rng.integers(1, 5)):
                pos = int(rng.integers(0, header_end))
                buf[pos] ^= 1 << int(rng.integers(0, 8))
        elif kind == 1:     # random byte anywhere
            pos = int(rng.integers(0, len(buf)))
            buf[pos] = int(rng.integers(0, 256))
        elif kind == 2:     # overwrite 8 header bytes with a big value
            pos = int(rng.integers(0, header_end - 8))
            buf[pos:pos + 8] = _BIG[int(rng.integers(0, len(_BIG)))].to_bytes(8, "little")
        elif kind == 3:     # truncate
            buf = buf[: int(rng.integers(0, len(buf)))]
        else:               # truncate and flip
            cut = int(rng.integers(header_end // 2, len(buf)))
            buf = buf[:cut]
            pos = int(rng.integers(0, min(cut, header_end)))
            buf[pos] ^= 0xFF
        yield bytes(buf)


@pytest.mark.slow
def test_fuzz_mutations_open_or_gguf_error(tmp_path):
    b = tiny_llama()
    data = b.build()
    header_end = b.layout["header_end"]
    p = tmp_path / "fuzz.gguf"
    outcomes = {"ok": 0, "error": 0}
    for i, mutated in enumerate(_mutations(data, header_end, 300)):
        p.write_bytes(mutated)
        with _peak() as mem:
            try:
                with GGUFFile(p) as f:
                    try:
                        ModelConfig.from_gguf(f)
                    except GGUFError:
                        pass
                    for t in f.tensors.values():
                        assert t.data.shape == (t.nbytes,)
                outcomes["ok"] += 1
            except GGUFError:
                outcomes["error"] += 1
        assert mem["bytes"] < TINY_OPEN_PEAK, f"mutation {i} allocated {mem['bytes']} bytes"
    assert outcomes["ok"] > 0 and outcomes["error"] > 0, outcomes
