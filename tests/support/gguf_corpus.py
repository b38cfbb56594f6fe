"""A tiny byte-level GGUF builder for tests, a valid llama-shaped model, and a corpus of
malformed variants (each must make `GGUFFile` raise GGUFError, quickly).

The builder writes every field itself (independently of edgeinfer's reader) so tests can break
any of them: counts, lengths, types, dims, offsets, alignment, padding.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

# GGUF metadata value types (spelled out here, independent of the library under test).
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = (
    range(13))
_FMT = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
        FLOAT32: "<f", BOOL: "<B", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}

# GGML tensor types used here: id -> (block elements, block bytes).
F32, F16, Q4_0, Q4_1, Q8_0, Q2_K, I8, F64 = 0, 1, 2, 3, 8, 10, 24, 28
GGML_SIZES = {F32: (1, 4), F16: (1, 2), Q4_0: (32, 18), Q4_1: (32, 20), Q8_0: (32, 34),
              Q2_K: (256, 84), I8: (1, 1), F64: (1, 8)}


def u32(v: int) -> bytes:
    return struct.pack("<I", v & 0xFFFFFFFF)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)


def enc_str(s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else s
    return u64(len(b)) + b


def enc_value(vtype: int, value: Any, etype: int | None = None) -> bytes:
    """Encodes a value (without its type tag). Arrays: `value` is a list; for an array of
    arrays, each item is an (element type, list) pair."""
    if vtype == STRING:
        return enc_str(value)
    if vtype == ARRAY:
        assert etype is not None
        out = [u32(etype), u64(len(value))]
        for item in value:
            if etype == ARRAY:
                inner_type, inner = item
                out.append(enc_value(ARRAY, inner, inner_type))
            else:
                out.append(enc_value(etype, item))
        return b"".join(out)
    return struct.pack(_FMT[vtype], value)


def tensor_nbytes(shape: tuple[int, ...], ggml_type: int) -> int:
    bs, ts = GGML_SIZES.get(ggml_type, (1, 1))
    n = 1
    for d in shape:
        n *= d
    return n // bs * ts


def align(x: int, a: int) -> int:
    return x + (-x) % a


@dataclass
class Tensor:
    name: str | bytes
    shape: tuple[int, ...]
    ggml_type: int
    data: bytes | None = None     # default: deterministic bytes of the right size
    offset: int | None = None     # override of the written (relative) offset
    n_dims: int | None = None     # override of the written n_dims


@dataclass
class GGUFBuilder:
    magic: bytes = b"GGUF"
    version: int = 3
    alignment: int = 32           # used to lay out data; written only as a general.alignment kv
    tensor_count: int | None = None   # override of the written count
    kv_count: int | None = None
    kvs: list[tuple[bytes, bytes]] = field(default_factory=list)   # (encoded key, type+value)
    tensors: list[Tensor] = field(default_factory=list)
    layout: dict[str, int] = field(default_factory=dict)

    # -- metadata
    def add(self, key: str | bytes, vtype: int, value: Any, etype: int | None = None) -> "GGUFBuilder":
        self.kvs.append((enc_str(key), u32(vtype) + enc_value(vtype, value, etype)))
        return self

    def add_raw(self, key: str | bytes, raw: bytes) -> "GGUFBuilder":
        """A key followed by arbitrary bytes (type tag and value)."""
        self.kvs.append((enc_str(key), raw))
        return self

    def set(self, key: str, vtype: int, value: Any, etype: int | None = None) -> "GGUFBuilder":
        """Replaces a key's value in place (or appends it)."""
        enc = enc_str(key)
        new = u32(vtype) + enc_value(vtype, value, etype)
        for i, (k, _) in enumerate(self.kvs):
            if k == enc:
                self.kvs[i] = (k, new)
                return self
        self.kvs.append((enc, new))
        return self

    def remove(self, key: str) -> "GGUFBuilder":
        enc = enc_str(key)
        self.kvs = [(k, v) for k, v in self.kvs if k != enc]
        return self

    # -- tensors
    def tensor(self, name: str | bytes, shape: tuple[int, ...], ggml_type: int, **kw) -> "GGUFBuilder":
        self.tensors.append(Tensor(name, tuple(shape), ggml_type, **kw))
        return self

    def find(self, name: str) -> Tensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def drop(self, name: str) -> "GGUFBuilder":
        self.tensors = [t for t in self.tensors if t.name != name]
        return self

    # -- bytes
    def build(self) -> bytes:
        out = bytearray()
        out += self.magic + u32(self.version)
        out += u64(len(self.tensors) if self.tensor_count is None else self.tensor_count)
        out += u64(len(self.kvs) if self.kv_count is None else self.kv_count)
        for k, v in self.kvs:
            out += k + v
        self.layout["kv_end"] = len(out)
        # lay out data: tensors in order, each aligned, no padding after the last
        offsets, datas, cur = [], [], 0
        for i, t in enumerate(self.tensors):
            nbytes = tensor_nbytes(t.shape, t.ggml_type)
            data = t.data
            if data is None:
                data = _pattern(nbytes if 0 <= nbytes <= 1 << 24 else 0, seed=i)
            cur = align(cur, self.alignment)
            offsets.append(cur)
            datas.append(data)
            cur += len(data)
        for t, off in zip(self.tensors, offsets):
            out += enc_str(t.name)
            out += u32(len(t.shape) if t.n_dims is None else t.n_dims)
            for d in t.shape:
                out += u64(d)
            out += u32(t.ggml_type)
            out += u64(off if t.offset is None else t.offset)
        self.layout["header_end"] = len(out)
        data_start = align(len(out), self.alignment)
        self.layout["data_offset"] = data_start
        out += b"\0" * (data_start - len(out))
        for off, data in zip(offsets, datas):
            pos = data_start + off
            if len(out) < pos:
                out += b"\0" * (pos - len(out))
            out += data
        self.layout["size"] = len(out)
        return bytes(out)


def _pattern(n: int, seed: int) -> bytes:
    rng = np.random.default_rng(1000 + seed)
    # keep f16/f32 patterns finite-ish: random bytes but a small exponent in every other byte
    b = rng.integers(0, 256, n, dtype=np.uint8)
    b[1::2] &= 0x3B
    return b.tobytes()


# ------------------------------------------------------------------ the valid tiny model

TINY = dict(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=96, n_vocab=40,
            n_ctx=256, rope_theta=10000.0, rms_eps=1e-5)


def tiny_tokens(n: int) -> list[str]:
    base = ["<unk>", "<s>", "</s>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    base += ["Ġ", "é", "日本", "🙂", "th", "the", "Ġthe", "er", "in", "on", "an", "at", "en"]
    return (base + [f"tok{i}" for i in range(n)])[:n]


def tiny_llama(arch: str = "llama", tied: bool = False, bias: bool | None = None,
               version: int = 3, alignment: int | None = None) -> GGUFBuilder:
    """A small valid llama-shaped (or qwen2-shaped) model with a gpt2-style tokenizer."""
    h = TINY
    b = GGUFBuilder(version=version, alignment=alignment or 32)
    e, nh, nkv, hd, ff, nv, nl = (h["n_embd"], h["n_head"], h["n_head_kv"], h["head_dim"],
                                  h["n_ff"], h["n_vocab"], h["n_layer"])
    b.add("general.architecture", STRING, arch)
    b.add("general.name", STRING, "tiny-test")
    if alignment is not None:
        b.add("general.alignment", UINT32, alignment)
    b.add(f"{arch}.block_count", UINT32, nl)
    b.add(f"{arch}.context_length", UINT32, h["n_ctx"])
    b.add(f"{arch}.embedding_length", UINT32, e)
    b.add(f"{arch}.feed_forward_length", UINT32, ff)
    b.add(f"{arch}.attention.head_count", UINT32, nh)
    b.add(f"{arch}.attention.head_count_kv", UINT32, nkv)
    b.add(f"{arch}.rope.freq_base", FLOAT32, h["rope_theta"])
    b.add(f"{arch}.attention.layer_norm_rms_epsilon", FLOAT32, h["rms_eps"])
    b.add(f"{arch}.rope.dimension_count", UINT32, hd)
    b.add("general.file_type", UINT32, 7)
    b.add("general.tags", ARRAY, ["a", "b"], STRING)
    b.add("tokenizer.ggml.model", STRING, "gpt2")
    b.add("tokenizer.ggml.pre", STRING, "smollm")
    toks = tiny_tokens(nv)
    b.add("tokenizer.ggml.tokens", ARRAY, toks, STRING)
    b.add("tokenizer.ggml.scores", ARRAY, [float(-i) for i in range(nv)], FLOAT32)
    b.add("tokenizer.ggml.token_type", ARRAY, [3 if i < 3 else 1 for i in range(nv)], INT32)
    b.add("tokenizer.ggml.merges", ARRAY, ["t h", "th e", "Ġ the", "e r"], STRING)
    b.add("tokenizer.ggml.bos_token_id", UINT32, 1)
    b.add("tokenizer.ggml.eos_token_id", UINT32, 2)
    b.add("tokenizer.ggml.unknown_token_id", UINT32, 0)
    b.add("tokenizer.ggml.add_bos_token", BOOL, 1)
    b.add("tokenizer.chat_template", STRING, "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    b.tensor("token_embd.weight", (e, nv), Q8_0)
    if bias is None:
        bias = arch == "qwen2"
    for i in range(nl):
        p = f"blk.{i}."
        b.tensor(p + "attn_norm.weight", (e,), F32)
        b.tensor(p + "attn_q.weight", (e, nh * hd), F16)
        b.tensor(p + "attn_k.weight", (e, nkv * hd), Q8_0)
        b.tensor(p + "attn_v.weight", (e, nkv * hd), Q4_1)
        if bias:
            b.tensor(p + "attn_q.bias", (nh * hd,), F32)
            b.tensor(p + "attn_k.bias", (nkv * hd,), F32)
            b.tensor(p + "attn_v.bias", (nkv * hd,), F32)
        b.tensor(p + "attn_output.weight", (nh * hd, e), Q4_0)
        b.tensor(p + "ffn_norm.weight", (e,), F32)
        b.tensor(p + "ffn_gate.weight", (e, ff), Q8_0)
        b.tensor(p + "ffn_up.weight", (e, ff), Q4_1)
        b.tensor(p + "ffn_down.weight", (ff, e), Q8_0)
    b.tensor("output_norm.weight", (e,), F32)
    if not tied:
        b.tensor("output.weight", (e, nv), F16)
    return b


# ------------------------------------------------------------------ malformed corpus

def _patched(data: bytes, offset: int, new: bytes) -> bytes:
    return data[:offset] + new + data[offset + len(new):]


def _with(fn: Callable[[GGUFBuilder], Any], **kw) -> bytes:
    b = tiny_llama(**kw)
    fn(b)
    return b.build()


def _kv_value_offset(b: GGUFBuilder, key: str) -> int:
    """Byte offset of `key`'s type tag in the built file."""
    pos = 24
    enc = enc_str(key)
    for k, v in b.kvs:
        if k == enc:
            return pos + len(k)
        pos += len(k) + len(v)
    raise KeyError(key)


def _tensor_info_offset(b: GGUFBuilder, name: str) -> int:
    """Byte offset of tensor `name`'s info record in the built file."""
    pos = b.layout["kv_end"]
    for t in b.tensors:
        if t.name == name:
            return pos
        pos += len(enc_str(t.name)) + 4 + 8 * len(t.shape) + 4 + 8
    raise KeyError(name)


def truncations() -> Iterator[tuple[int, bytes]]:
    """(length, the tiny file cut to it): every length inside the header, a few inside the data."""
    b = tiny_llama()
    base = b.build()
    data_offset, size = b.layout["data_offset"], len(base)
    for n in range(0, data_offset):
        yield n, base[:n]
    for n in sorted({data_offset, data_offset + 1, (data_offset + size) // 2, size - 64, size - 2, size - 1}):
        yield n, base[:n]


def malformed_corpus() -> Iterator[tuple[str, bytes]]:
    """(case name, file bytes) for every malformed variant; each must raise GGUFError."""
    base_b = tiny_llama()
    base = base_b.build()
    size = len(base)

    # -- magic / version / tiny files
    yield "empty_file", b""
    yield "three_bytes", b"GGU"
    yield "magic_only", b"GGUF"
    yield "bad_magic", b"GGUX" + base[4:]
    yield "legacy_ggjt_magic", b"tjgg" + base[4:]
    yield "zero_magic", b"\0\0\0\0" + base[4:]
    for v in (0, 1, 4, 0xFFFFFFFF, 0x03000000):
        yield f"version_{v:#x}", _patched(base, 4, u32(v))

    # -- counts
    for name, off in (("tensor_count", 8), ("kv_count", 16)):
        for v in (2**63 - 1, 2**64 - 1, 2**32, 1 << 20, (1 << 16) + 1):
            yield f"{name}_{v:#x}", _patched(base, off, u64(v))
    yield "kv_count_plus_one", _patched(base, 16, u64(len(base_b.kvs) + 1))
    yield "tensor_count_plus_one", _patched(base, 8, u64(len(base_b.tensors) + 1))
    yield "kv_count_minus_one", _patched(base, 16, u64(len(base_b.kvs) - 1))

    # -- string lengths
    yield "key_length_huge", _patched(base, 24, u64(2**64 - 1))
    yield "key_length_2_63", _patched(base, 24, u64(2**63))
    yield "key_length_past_end", _patched(base, 24, u64(len(base)))
    arch_at = _kv_value_offset(base_b, "general.architecture")
    yield "string_value_length_huge", _patched(base, arch_at + 4, u64(2**64 - 2))
    yield "string_value_length_past_end", _patched(base, arch_at + 4, u64(len(base) - arch_at))
    tok_at = _kv_value_offset(base_b, "tokenizer.ggml.tokens")
    yield "string_array_length_huge", _patched(base, tok_at + 8, u64(2**61))
    yield "string_array_length_2_64_minus_1", _patched(base, tok_at + 8, u64(2**64 - 1))
    yield "string_array_item_length_huge", _patched(base, tok_at + 16, u64(2**63 + 5))
    sc_at = _kv_value_offset(base_b, "tokenizer.ggml.scores")
    yield "f32_array_length_huge", _patched(base, sc_at + 8, u64(2**62))
    yield "f32_array_length_past_end", _patched(base, sc_at + 8, u64(len(base) // 4))
    t0 = _tensor_info_offset(base_b, "token_embd.weight")
    yield "tensor_name_length_huge", _patched(base, t0, u64(2**64 - 1))

    # -- value types
    yield "unknown_value_type_13", _with(lambda b: b.add_raw("x.bad", u32(13) + b"\0" * 8))
    yield "unknown_value_type_max", _with(lambda b: b.add_raw("x.bad", u32(0xFFFFFFFF) + b"\0" * 8))
    yield "unknown_array_element_type", _with(
        lambda b: b.add_raw("x.bad", u32(ARRAY) + u32(99) + u64(1) + b"\0" * 8))
    yield "nested_array", _with(lambda b: b.add("x.nested", ARRAY, [(UINT8, [1, 2]), (UINT8, [3])], ARRAY))
    yield "nested_array_deep_huge", _with(
        lambda b: b.add_raw("x.nested", u32(ARRAY) + (u32(ARRAY) + u64(1)) * 1000 + u32(UINT8) + u64(0)))

    # -- tensor types / dims / shapes
    def tensor_case(fn: Callable[[Tensor], None], name: str = "blk.0.attn_q.weight") -> bytes:
        b = tiny_llama()
        fn(b.find(name))
        return b.build()

    for tid in (4, 5, 31, 99, 0xFFFFFFFF):
        yield f"tensor_type_{tid:#x}", tensor_case(lambda t, tid=tid: setattr(t, "ggml_type", tid))
    yield "n_dims_0", tensor_case(lambda t: (setattr(t, "n_dims", 0), setattr(t, "shape", ())))
    yield "n_dims_5", tensor_case(lambda t: setattr(t, "shape", (64, 64, 1, 1, 1)))
    yield "n_dims_huge", tensor_case(lambda t: setattr(t, "n_dims", 0xFFFFFFFF))
    yield "n_dims_says_3_has_2", tensor_case(lambda t: setattr(t, "n_dims", 3))
    yield "dim0_zero", tensor_case(lambda t: setattr(t, "shape", (0, 64)))
    yield "dim1_zero", tensor_case(lambda t: setattr(t, "shape", (64, 0)))
    yield "shape_overflow_2_32_sq", tensor_case(lambda t: setattr(t, "shape", (2**32, 2**32)))
    yield "shape_overflow_dim_2_64_minus_1", tensor_case(lambda t: setattr(t, "shape", (64, 2**64 - 1)))
    yield "shape_overflow_4d", tensor_case(lambda t: setattr(t, "shape", (2**16, 2**16, 2**16, 2**16)))
    yield "nbytes_overflow", tensor_case(lambda t: (setattr(t, "shape", (2**62,)), setattr(t, "ggml_type", F32)))
    yield "shape_huge_fits_int64", tensor_case(lambda t: setattr(t, "shape", (2**31, 2**31)))
    yield "ne0_not_multiple_of_block", tensor_case(
        lambda t: setattr(t, "shape", (48, 64)), name="blk.0.attn_k.weight")

    # -- offsets
    last = base_b.tensors[-1].name
    yield "offset_past_end", tensor_case(lambda t: setattr(t, "offset", align(size, 32)), name=last)
    yield "offset_huge", tensor_case(lambda t: setattr(t, "offset", 2**64 - 32), name=last)
    yield "offset_2_63", tensor_case(lambda t: setattr(t, "offset", 2**63))
    yield "misaligned_offset_1", tensor_case(lambda t: setattr(t, "offset", 1))
    yield "misaligned_offset_16", tensor_case(lambda t: setattr(t, "offset", 16))
    yield "data_one_byte_short", base[:-1]
    yield "overlapping_tensors", tensor_case(lambda t: setattr(t, "offset", 0))
    yield "overlapping_tensors_partial", tensor_case(lambda t: setattr(t, "offset", 3200))

    # -- alignment
    for a in (0, 3, 48, 0xFFFFFFFF):
        yield f"alignment_{a:#x}", _with(lambda b, a=a: b.add("general.alignment", UINT32, a))
    yield "alignment_2_31", _with(lambda b: b.add("general.alignment", UINT32, 2**31))
    yield "alignment_as_u64", _with(lambda b: b.add("general.alignment", UINT64, 32))
    yield "alignment_as_i32", _with(lambda b: b.add("general.alignment", INT32, 32))
    yield "alignment_as_string", _with(lambda b: b.add("general.alignment", STRING, "32"))
    yield "alignment_64_data_laid_at_32", _with(lambda b: b.add("general.alignment", UINT32, 64))

    # -- duplicates
    yield "duplicate_key", _with(lambda b: b.add("general.name", STRING, "again"))
    yield "duplicate_key_other_type", _with(lambda b: b.add("llama.block_count", UINT64, 2))
    yield "duplicate_tensor_name", tensor_case(lambda t: setattr(t, "name", "token_embd.weight"))

    # -- wrong metadata types
    wrong = [
        ("general.architecture", UINT32, 7, None),
        ("general.architecture", ARRAY, ["llama"], STRING),
        ("general.name", INT32, 3, None),
        ("general.file_type", STRING, "q4", None),
        ("tokenizer.ggml.model", BOOL, 1, None),
        ("tokenizer.ggml.tokens", ARRAY, list(range(40)), INT32),
        ("tokenizer.ggml.tokens", STRING, "abc", None),
        ("tokenizer.ggml.scores", ARRAY, ["x"] * 40, STRING),
        ("tokenizer.ggml.scores", ARRAY, list(range(40)), INT32),
        ("tokenizer.ggml.token_type", ARRAY, [1.0] * 40, FLOAT32),
        ("tokenizer.ggml.merges", ARRAY, [1, 2], UINT8),
        ("tokenizer.ggml.bos_token_id", STRING, "1", None),
        ("tokenizer.ggml.eos_token_id", FLOAT32, 2.0, None),
        ("tokenizer.ggml.add_bos_token", UINT8, 1, None),
        ("tokenizer.chat_template", UINT32, 0, None),
        ("llama.block_count", STRING, "2", None),
        ("llama.embedding_length", FLOAT32, 64.0, None),
        ("llama.attention.head_count", STRING, "4", None),
        ("llama.rope.freq_base", STRING, "1e4", None),
        ("llama.rope.freq_base", UINT32, 10000, None),
        ("llama.attention.layer_norm_rms_epsilon", ARRAY, [1e-5], FLOAT32),
        ("llama.context_length", BOOL, 1, None),
    ]
    for key, vt, val, et in wrong:
        tag = f"{vt}" if et is None else f"{vt}_{et}"
        yield f"wrong_type_{key}_{tag}", _with(lambda b, a=(key, vt, val, et): b.set(*a))

    # -- tokenizer consistency
    for key, v, vt in (("tokenizer.ggml.bos_token_id", 40, UINT32),
                       ("tokenizer.ggml.eos_token_id", 2**32 - 1, UINT32),
                       ("tokenizer.ggml.padding_token_id", -1, INT32),
                       ("tokenizer.ggml.unknown_token_id", 2**63, UINT64),
                       ("tokenizer.ggml.eot_token_id", 1000, UINT32),
                       ("tokenizer.ggml.mask_token_id", -5, INT64)):
        yield f"special_token_out_of_range_{key.split('.')[-1]}_{v}", _with(
            lambda b, a=(key, vt, v): b.set(a[0], a[1], a[2]))
    yield "scores_length_mismatch", _with(
        lambda b: b.set("tokenizer.ggml.scores", ARRAY, [0.0] * 39, FLOAT32))
    yield "token_type_length_mismatch", _with(
        lambda b: b.set("tokenizer.ggml.token_type", ARRAY, [1] * 41, INT32))

    # -- invalid UTF-8
    bad_utf8 = {"lone_continuation": b"\x80", "truncated_seq": b"ab\xe6\x97", "overlong": b"\xc0\xaf",
                "surrogate": b"\xed\xa0\x80", "ff": b"\xff"}
    for tag, raw in bad_utf8.items():
        yield f"utf8_key_{tag}", _with(lambda b, raw=raw: b.add(b"x." + raw, UINT8, 1))
        yield f"utf8_value_{tag}", _with(lambda b, raw=raw: b.set("general.name", STRING, raw))
    yield "utf8_token", _with(
        lambda b: b.set("tokenizer.ggml.tokens", ARRAY, tiny_tokens(39) + [b"\xff\xfe"], STRING))
    yield "utf8_tensor_name", tensor_case(lambda t: setattr(t, "name", b"blk.0.attn_q\xff"))
