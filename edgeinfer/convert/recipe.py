"""Output types and the per-tensor type recipe (llama.cpp's rules for its file types).

Rules, for a 2-D weight that llama.cpp quantizes at all (`allows_quantization`: not 1-D
tensors -- norms, biases, rope factors --, recurrent layers' conv taps, Gemma 4's per-layer
input projection and the other small tensors llama.cpp leaves as they are; `convert` writes
those as F32, `quantize` keeps their type):
* the output head (or, with tied embeddings, token_embd and Gemma's per_layer_token_embd) is
  Q6_K for every quantized type except Q8_0 (which keeps Q8_0), or Q8_0 when its rows are not a
  multiple of 256;
* q4_k_m / q5_k_m: ffn_down is Q6_K on the first and last eighth of the layers and every
  third layer between (llama.cpp's `use_more_bits`), and so are the attention-V-like tensors
  (attn_v, a fused attn_qkv) counted among themselves in file order, as llama.cpp counts them:
  in a hybrid only some layers have one; in a 70B-class model (`is_70b_class`) the
  attention-V-like tensors left at Q4_K are Q5_K;
* q4_0 / q5_0 quantized with an importance matrix: ffn_down in the first eighth of the layers
  is Q4_1 / Q5_1 (llama.cpp guards those layers so when an imatrix is given);
* a K-quant whose row length is not a multiple of 256 falls back as llama.cpp does:
  Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0 (and to F16 if even that does not fit);
* `--keep PATTERN=TYPE` (shell-style glob on the GGUF tensor name) overrides any of this.

`--type auto` (AUTO) does not use these rules: see sensitivity.py.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from ..errors import ConversionError
from ..gguf.types import GGMLType as T
from .quantize import block_elems, can_quantize

__all__ = ["FileType", "FILE_TYPES", "AUTO", "parse_keep", "Recipe", "allows_quantization",
           "is_70b_class", "block_index", "FLOAT_TYPES"]


@dataclass(frozen=True)
class FileType:
    name: str
    base: T
    llama_ftype: int          # general.file_type (llama.cpp's LLAMA_FTYPE_*)
    more_bits: bool = False   # the _M recipes


FILE_TYPES: dict[str, FileType] = {ft.name: ft for ft in (
    FileType("f32", T.F32, 0),
    FileType("f16", T.F16, 1),
    FileType("bf16", T.BF16, 32),
    FileType("q8_0", T.Q8_0, 7),
    FileType("q4_0", T.Q4_0, 2),
    FileType("q4_1", T.Q4_1, 3),
    FileType("q5_0", T.Q5_0, 8),
    FileType("q5_1", T.Q5_1, 9),
    FileType("q4_k_m", T.Q4_K, 15, more_bits=True),
    FileType("q5_k_m", T.Q5_K, 17, more_bits=True),
    FileType("q6_k", T.Q6_K, 18),
)}
#: the unquantized types (F32, F16, BF16)
FLOAT_TYPES = frozenset({T.F32, T.F16, T.BF16})
# parts of names llama.cpp never quantizes (tensor_allows_quantization): norms, MoE routers,
# recurrent layers' conv taps (a few per channel; the runtimes read them as F32), Gemma's
# per-layer input projection and AltUp / Laurel blocks, learned positions, RWKV's small mixes
_NEVER_QUANTIZED = ("_norm.weight", "ffn_gate_inp.weight", "altup", "laurel", "per_layer_model_proj",
                    "ssm_conv1d", "shortconv.conv.weight", "attn_rel_b.weight", "time_mix_first.weight",
                    "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
                    "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
                    "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight",
                    "time_mix_g1.weight", "time_mix_g2.weight", "time_mix_decay_w1.weight",
                    "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight")
_NEVER_QUANTIZED_NAMES = ("position_embd.weight", "token_types.weight")


def allows_quantization(name: str, n_dims: int) -> bool:
    """Whether llama.cpp's quantizer changes the type of tensor `name` at all."""
    return (n_dims >= 2 and name.endswith("weight") and name not in _NEVER_QUANTIZED_NAMES
            and not any(part in name for part in _NEVER_QUANTIZED))
_FALLBACK = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}
_GUARDED = {T.Q4_0: T.Q4_1, T.Q5_0: T.Q5_1}   # imatrix files' first-eighth ffn_down
_TYPE_NAMES = {t.name.lower(): t for t in (T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0,
                                           T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K)}


#: `--type auto`: per-tensor types chosen by measured sensitivity under a size budget
#: (sensitivity.py); general.file_type is then that of the type holding the most bytes.
AUTO = FileType("auto", T.Q4_K, 15)


def parse_file_type(name: str) -> FileType:
    if name.lower() == "auto":
        return AUTO
    ft = FILE_TYPES.get(name.lower())
    if ft is None:
        raise ConversionError(f"unknown output type {name!r}; choose one of "
                              f"{', '.join(FILE_TYPES)}, auto")
    return ft


def parse_keep(specs: list[str] | None) -> list[tuple[str, T]]:
    out = []
    for s in specs or []:
        pat, sep, typ = s.rpartition("=")
        if not sep or not pat:
            raise ConversionError(f"--keep {s!r}: expected PATTERN=TYPE, e.g. 'blk.0.*=q8_0'")
        t = _TYPE_NAMES.get(typ.strip().lower())
        if t is None:
            raise ConversionError(f"--keep {s!r}: unknown type {typ!r}; choose one of "
                                  f"{', '.join(_TYPE_NAMES)}")
        out.append((pat.strip(), t))
    return out


def is_70b_class(arch: str, n_layer: int, n_head: int, n_head_kv: int) -> bool:
    """llama.cpp's LLM_TYPE_70B, the one model size its recipe treats apart (eight query heads
    share each attn_v, so attn_v gets more bits): Llama with 80 layers and grouped-query
    attention (80 without it is the 65B), Qwen2 with 80 layers (Qwen2 72B)."""
    return n_layer == 80 and (arch == "qwen2" or (arch == "llama" and n_head != n_head_kv))


def use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


_BLK = re.compile(r"^blk\.(\d+)\.")


def block_index(name: str) -> int | None:
    """The block of tensor `name` ("blk.N. ..."), or None for a tensor outside the blocks."""
    m = _BLK.match(name)
    return int(m.group(1)) if m else None

# llama.cpp's attention-V-like category (category_is_attn_v): attn_v, attn_qkv, attn_kv_b
# llama.cpp's token-embedding category: quantized as the head when the embeddings are tied
_EMBEDDINGS = ("token_embd.weight", "per_layer_token_embd.weight")
_ATTN_V_LIKE = re.compile(r"\.(attn_v|attn_qkv|attn_kv_b)\.weight$")


class Recipe:
    def __init__(self, ftype: FileType, n_layer: int, has_output: bool,
                 keep: list[tuple[str, T]] | None = None, imatrix: bool = False,
                 names: list[str] | tuple[str, ...] = (), type_70b: bool = False):
        """`names`: the file's tensor names in file order (the attention-V-like tensors are
        counted among themselves, the layer rules span every block the file holds, a
        multi-token-prediction block included, as llama.cpp's n_layer_all; without names, by
        block index over n_layer)."""
        self.ftype = ftype
        blocks = [b for b in map(block_index, names) if b is not None]
        self.n_blocks = max(blocks) + 1 if blocks else n_layer
        wv = [n for n in names if _ATTN_V_LIKE.search(n)]
        self._wv_index = {n: i for i, n in enumerate(wv)}
        self._n_wv = len(wv)
        self.imatrix = imatrix
        self.type_70b = type_70b
        self.n_layer = n_layer
        self.has_output = has_output
        self.keep = keep or []
        self.keep_hits: dict[str, int] = {p: 0 for p, _ in self.keep}

    def choose(self, name: str, shape: tuple[int, ...]) -> T:
        """The GGML type of GGUF tensor `name` with GGML shape `shape` (ne0 first)."""
        if not allows_quantization(name, len(shape)):
            return T.F32
        nx = shape[0]
        kept = self.override(name, shape)
        if kept is not None:
            return kept
        base = self.ftype.base
        if base in FLOAT_TYPES:
            return base
        t = base
        is_head = name == "output.weight" or (not self.has_output and name in _EMBEDDINGS)
        if is_head:
            if nx % 256:
                t = T.Q8_0
            elif base != T.Q8_0:
                t = T.Q6_K
        elif _ATTN_V_LIKE.search(name):
            i, n = ((self._wv_index[name], self._n_wv) if name in self._wv_index
                    else (block_index(name), self.n_layer))
            if self.ftype.more_bits and i is not None and use_more_bits(i, n):
                t = T.Q6_K
            if self.type_70b and t == T.Q4_K:
                t = T.Q5_K
        elif self.ftype.more_bits and ".ffn_down." in name:
            i = block_index(name)
            if i is not None and use_more_bits(i, self.n_blocks):
                t = T.Q6_K
        elif self.imatrix and base in _GUARDED and ".ffn_down." in name:
            i = block_index(name)
            if i is not None and i < self.n_blocks // 8:
                t = _GUARDED[base]
        if t in _FALLBACK and nx % 256:
            t = _FALLBACK[t]
        if not can_quantize(t, nx):
            t = T.F16
        return t

    def override(self, name: str, shape: tuple[int, ...]) -> T | None:
        """The type the last `--keep` matching `name` asks for (checked), or None."""
        nx = shape[0]
        for pat, t in reversed(self.keep):   # the last matching --keep wins
            if fnmatch.fnmatchcase(name, pat):
                self.keep_hits[pat] += 1
                if not can_quantize(t, nx):
                    raise ConversionError(f"--keep {pat}={t.name.lower()}: tensor {name!r} has "
                                          f"rows of {nx}, not a multiple of the "
                                          f"{t.name} block size {block_elems(t)}")
                return t
        return None

    def unused_keeps(self) -> list[str]:
        return [p for p, n in self.keep_hits.items() if n == 0]
