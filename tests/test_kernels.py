"""CPU quantization kernels: every type, every ISA this CPU has.

Oracles:
- dequantization: `gguf.quants.dequantize`, bit-exact, for every ISA;
- dot products: the scalar reference against float64 math of the same
  quantized numbers (tight), each SIMD kernel against the scalar one
  (NMSE <= 1e-6, no NaN), and float64 with the raw activations (loose: the
  8-bit activation error, documented);
- activation quantization: a numpy model of the format, bit-exact, and every
  SIMD version identical to the scalar one.
Internal symbols (the per-ISA kernel tables with ei_quantize_act_rows and
ei_matmul_rows, fp16 helpers) are reached by dlopen-ing the built extension
with a private cdef.
"""
from __future__ import annotations

import os
import subprocess
import sys
import zlib

import cffi
import numpy as np
import pytest
from tests.support.isa import each_level, on_cpu
from tests.support.strict import missing, require

gguf = require("gguf", "gguf.quants is the kernels' oracle")
import gguf.quants as gq  # noqa: E402
from gguf import GGMLQuantizationType as GT  # noqa: E402

from edgeinfer._native import ffi, lib  # noqa: E402

SCALAR, AVX2, AVX512 = 0, 1, 2
ISAS = on_cpu()   # every level this CPU has, scalar first
SIMD_ISAS = [i for i in ISAS if i != SCALAR]

# name -> (edgeinfer type id, gguf type)
TYPES = {
    "F32": (lib.EI_TYPE_F32, GT.F32),
    "F16": (lib.EI_TYPE_F16, GT.F16),
    "BF16": (lib.EI_TYPE_BF16, GT.BF16),
    "Q8_0": (lib.EI_TYPE_Q8_0, GT.Q8_0),
    "Q4_0": (lib.EI_TYPE_Q4_0, GT.Q4_0),
    "Q4_1": (lib.EI_TYPE_Q4_1, GT.Q4_1),
    "Q5_0": (lib.EI_TYPE_Q5_0, GT.Q5_0),
    "Q5_1": (lib.EI_TYPE_Q5_1, GT.Q5_1),
    "Q4_K": (lib.EI_TYPE_Q4_K, GT.Q4_K),
    "Q5_K": (lib.EI_TYPE_Q5_K, GT.Q5_K),
    "Q6_K": (lib.EI_TYPE_Q6_K, GT.Q6_K),
    "Q2_K": (lib.EI_TYPE_Q2_K, GT.Q2_K),
    "Q3_K": (lib.EI_TYPE_Q3_K, GT.Q3_K),
    "IQ4_NL": (lib.EI_TYPE_IQ4_NL, GT.IQ4_NL),
    "IQ4_XS": (lib.EI_TYPE_IQ4_XS, GT.IQ4_XS),
}
FLOAT_TYPES = {"F32", "F16", "BF16"}
K_TYPES = {"Q4_K", "Q5_K", "Q6_K"}
# types gguf.quants cannot write: random bytes with sane fp16 scales at these offsets
RANDOM_TYPES = {"Q2_K": (80, 82), "Q3_K": (108,), "IQ4_NL": (0,), "IQ4_XS": (0,)}
# byte offsets of the fp16 scale fields of a K block (set to sane values)
K_SCALE_FIELDS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}

ROW_SCALES = (1e-3, 1.0, 40.0)  # small, unit and large magnitude rows


def sizes(name: str) -> list[int]:
    if name in K_TYPES or block(name)[0] == 256:
        return [256, 1536, 2048 + 256]
    base = [32, 64, 96, 256, 576, 1536, 2048 + 256]
    return base + ([1, 7, 33, 100] if name in FLOAT_TYPES else [])


def block(name: str) -> tuple[int, int]:
    be, bb = ffi.new("int32_t *"), ffi.new("int32_t *")
    assert lib.ei_type_block(TYPES[name][0], be, bb) == 0
    return be[0], bb[0]


def make_rows(name: str, n: int, rng: np.random.Generator, scales=ROW_SCALES) -> np.ndarray:
    """Rows of `name` with n elements each, as raw bytes [rows, row_bytes]."""
    gt = TYPES[name][1]
    rows = len(scales)
    if name in K_TYPES or name in RANDOM_TYPES:
        be, bb = block(name)
        raw = rng.integers(0, 256, size=(rows, n // be, bb), dtype=np.uint8)
        for r, s in enumerate(scales):
            for off in {**K_SCALE_FIELDS, **RANDOM_TYPES}[name]:
                d = (rng.uniform(0.2, 1.0, size=n // be) * s / 32).astype(np.float16)
                raw[r, :, off:off + 2] = d.view(np.uint8).reshape(-1, 2)
        return raw.reshape(rows, -1)
    x = rng.standard_normal((rows, n)).astype(np.float32) * np.array(scales, np.float32)[:, None]
    if name == "F32":
        return x.view(np.uint8)
    if name == "F16":
        return x.astype(np.float16).view(np.uint8)
    return np.ascontiguousarray(gq.quantize(x, gt)).view(np.uint8)


def dequant_ref(name: str, raw_row: np.ndarray) -> np.ndarray:
    return np.asarray(gq.dequantize(raw_row, TYPES[name][1]), dtype=np.float32).reshape(-1)


def fptr(a: np.ndarray):
    return ffi.cast("float *", ffi.from_buffer(a))


def kdot(name: str, isa: int, row: np.ndarray, x: np.ndarray) -> float:
    out = ffi.new("float *")
    st = lib.ei_kernel_dot(TYPES[name][0], isa, x.size, ffi.from_buffer(row), fptr(x), out)
    assert st == 0, ffi.string(lib.ei_last_error())
    return out[0]


def q8a_ref(x: np.ndarray):
    """numpy model of the activation quantizer: f32 d = amax/127, q = rint(x * (1/d))."""
    b = x.astype(np.float32).reshape(-1, 32)
    amax = np.abs(b).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(b * inv[:, None]), -127, 127).astype(np.int8)
    s = (d * q.astype(np.int32).sum(axis=1).astype(np.float32)).astype(np.float32)
    return d, s, q


def act_dequant(x: np.ndarray) -> np.ndarray:
    d, _, q = q8a_ref(x)
    return (d.astype(np.float64)[:, None] * q.astype(np.float64)).reshape(-1)


def activations(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    xs = [rng.standard_normal(n).astype(np.float32),
          (rng.standard_normal(n) * 1e3).astype(np.float32),
          (rng.standard_normal(n) * 1e-4).astype(np.float32)]
    spiky = rng.standard_normal(n).astype(np.float32)
    spiky[:: max(1, n // 5)] *= 50  # outliers, as in real activations
    xs.append(spiky)
    if n >= 64:
        part = rng.standard_normal(n).astype(np.float32)
        part[:32] = 0  # an all-zero block between non-zero ones
        xs.append(part)
    xs.append(np.zeros(n, np.float32))
    return xs


# --------------------------------------------------------------------------- internals

INTERNAL_CDEF = """
typedef struct { float d; float s; int8_t q[32]; } ei_q8a;
typedef struct ei_kernels ei_kernels;
const ei_kernels *ei_kernels_get(int isa);
void ei_quantize_act_rows(const ei_kernels *k, const float *x, int64_t n_tok, int64_t n_cols, void *out,
                          int half_sums);
void ei_matmul_rows(const ei_kernels *k, int type, const void *w, int64_t n_cols, int64_t r0, int64_t r1,
                    const void *act, int64_t act_stride, int64_t n_tok, float *y, int64_t ldy);
int64_t ei_row_bytes(int type, int64_t n);
size_t ei_packed_bytes(const ei_kernels *k, int type, int64_t n_rows, int64_t n_cols);
void ei_pack(const ei_kernels *k, int type, const void *w, int64_t n_rows, int64_t n_cols, void *dst);
void ei_unpack_row(const ei_kernels *k, int type, const void *packed, int64_t n_rows, int64_t n_cols, int64_t row,
                   void *dst);
float ei_fp16_to_fp32(uint16_t h);
uint16_t ei_fp32_to_fp16(float f);
float ei_bf16_to_fp32(uint16_t h);
void ei_kernel_to_f16(const ei_kernels *k, const float *x, int64_t n, uint16_t *out);
"""


@pytest.fixture(scope="module")
def internal():
    import edgeinfer._native_ext as ext

    iffi = cffi.FFI()
    iffi.cdef(INTERNAL_CDEF)
    try:
        ilib = iffi.dlopen(ext.__file__)
        ilib.ei_quantize_act_rows  # noqa: B018 - resolve now
    except (OSError, AttributeError) as exc:  # symbols hidden by a different build
        missing(f"internal kernel symbols not visible in this build: {exc}")
    return iffi, ilib


Q8A = np.dtype([("d", "<f4"), ("s", "<f4"), ("q", "i1", 32)])


def quantize_act_row(internal, isa: int, x: np.ndarray):
    """One activation row as the matmuls take it: (d, s, q) per block, then each block's
    two half sums times -32 (int32 [nb, 2])."""
    iffi, ilib = internal
    nb = x.size // 32
    out = np.zeros(nb * (Q8A.itemsize + 8), np.uint8)
    ilib.ei_quantize_act_rows(ilib.ei_kernels_get(isa), iffi.cast("float *", iffi.from_buffer(x)), 1, x.size,
                              iffi.from_buffer(out), 1)
    blocks = out[:nb * Q8A.itemsize].view(Q8A)
    return blocks["d"].copy(), blocks["s"].copy(), blocks["q"].copy(), out[nb * Q8A.itemsize:].view("<i4").reshape(nb, 2)


def quantize_act(internal, isa: int, x: np.ndarray):
    return quantize_act_row(internal, isa, x)[:3]


# --------------------------------------------------------------------------- geometry / errors

def test_block_geometry_matches_gguf():
    for name, (tid, gt) in TYPES.items():
        be, bb = block(name)
        assert (be, bb) == gguf.constants.GGML_QUANT_SIZES[gt], name


def test_isa_reporting():
    assert lib.ei_isa_supported(SCALAR) == 1
    assert lib.ei_cpu_best_isa() in ISAS
    for i, nm in ((0, b"scalar"), (1, b"avx2"), (2, b"avx512")):
        assert ffi.string(lib.ei_isa_name(i)) == nm
    assert lib.ei_isa_supported(99) == 0


def test_isa_env_cap():
    code = "from edgeinfer._native import lib; print(lib.ei_cpu_best_isa())"
    env = dict(os.environ, EDGEINFER_ISA="scalar")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"


def _err() -> str:
    return ffi.string(lib.ei_last_error()).decode()


def test_error_paths():
    src = np.zeros(64, np.uint8)
    dst = np.zeros(64, np.float32)
    x = np.ones(64, np.float32)
    out = ffi.new("float *")
    be, bb = ffi.new("int32_t *"), ffi.new("int32_t *")

    assert lib.ei_type_block(99, be, bb) == lib.EI_ERR_UNSUPPORTED and "99" in _err()
    assert lib.ei_kernel_dequantize(99, 0, ffi.from_buffer(src), fptr(dst), 32) != 0 and _err()
    st = lib.ei_kernel_dequantize(lib.EI_TYPE_Q4_0, 0, ffi.from_buffer(src), fptr(dst), 33)
    assert st == lib.EI_ERR_INVALID_ARG and "33" in _err()
    assert lib.ei_kernel_dequantize(lib.EI_TYPE_Q4_K, 0, ffi.from_buffer(src), fptr(dst), 32) != 0 and _err()
    assert lib.ei_kernel_dequantize(lib.EI_TYPE_Q4_0, 0, ffi.NULL, fptr(dst), 32) != 0 and _err()
    assert lib.ei_kernel_dequantize(lib.EI_TYPE_Q4_0, 0, ffi.from_buffer(src), ffi.NULL, 32) != 0 and _err()
    assert lib.ei_kernel_dequantize(lib.EI_TYPE_Q4_0, 42, ffi.from_buffer(src), fptr(dst), 32) != 0 and _err()
    assert lib.ei_kernel_dot(99, 0, 32, ffi.from_buffer(src), fptr(x), out) != 0 and _err()
    assert lib.ei_kernel_dot(lib.EI_TYPE_Q8_0, 0, 48, ffi.from_buffer(src), fptr(x), out) != 0 and _err()
    assert lib.ei_kernel_dot(lib.EI_TYPE_Q8_0, 0, -32, ffi.from_buffer(src), fptr(x), out) != 0 and _err()
    assert lib.ei_kernel_dot(lib.EI_TYPE_Q8_0, 0, 32, ffi.from_buffer(src), fptr(x), ffi.NULL) != 0 and _err()
    if not lib.ei_isa_supported(lib.EI_ISA_NEON):
        st = lib.ei_kernel_dot(lib.EI_TYPE_Q8_0, lib.EI_ISA_NEON, 32, ffi.from_buffer(src), fptr(x), out)
        assert st == lib.EI_ERR_UNSUPPORTED and _err()


# --------------------------------------------------------------------------- fp16 helpers

def test_fp16_helpers(internal):
    iffi, ilib = internal
    rng = np.random.default_rng(5)
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    ref = h.view(np.float16).astype(np.float32)
    ours = np.array([ilib.ei_fp16_to_fp32(int(v)) for v in h], np.float32)
    fin = ~np.isnan(ref)
    assert np.array_equal(ours[fin].view(np.uint32), ref[fin].view(np.uint32))
    assert np.isnan(ours[~fin]).all()

    finite = np.isfinite(ref) & (np.arange(65536) < 0x7c00)  # positive finite halves, ascending
    f = np.concatenate([
        rng.standard_normal(3000).astype(np.float32) * np.float32(10) ** rng.integers(-9, 6, 3000).astype(np.float32),
        ref[fin],  # exact halves
        (ref[finite][:-1] + np.diff(ref[finite]) / 2).astype(np.float32),  # ties and near-ties
        np.array([65504, 65519.99, 65520, 1e6, -1e6, np.inf, -np.inf, 0.0, -0.0, 2**-25, 2**-26, 3 * 2**-26,
                  1e-45], np.float32),
    ]).astype(np.float32)
    with np.errstate(over="ignore"):
        ref16 = f.astype(np.float16).view(np.uint16)
    ours16 = np.array([ilib.ei_fp32_to_fp16(float(v)) for v in f], np.uint16)
    bad = np.nonzero(ours16 != ref16)[0]
    assert bad.size == 0, [(f[i], hex(ours16[i]), hex(ref16[i])) for i in bad[:5]]
    assert np.isnan(np.array([ilib.ei_fp32_to_fp16(float("nan"))], np.uint16).view(np.float16)).all()
    # the KV cache's row converters (F16C, NEON) give the scalar's bits, NaN payloads included
    nans = (np.uint32(0x7f800000) | rng.integers(1, 1 << 23, 64).astype(np.uint32)).view(np.float32)
    row = np.concatenate([f, nans, -nans, f[:5]]).astype(np.float32)    # length leaves a SIMD tail
    want = np.array([ilib.ei_fp32_to_fp16(float(v)) for v in row], np.uint16)
    for isa in each_level(ISAS):
        got = np.zeros(row.size, np.uint16)
        ilib.ei_kernel_to_f16(ilib.ei_kernels_get(isa), iffi.cast("float *", iffi.from_buffer(row)), row.size,
                              iffi.cast("uint16_t *", iffi.from_buffer(got)))
        assert np.array_equal(got, want), (isa, np.nonzero(got != want)[0][:5])

    b = rng.integers(0, 65536, 2000).astype(np.uint16)
    refb = (b.astype(np.uint32) << 16).view(np.float32)
    oursb = np.array([ilib.ei_bf16_to_fp32(int(v)) for v in b], np.float32)
    fin = ~np.isnan(refb)
    assert np.array_equal(oursb[fin], refb[fin])


# --------------------------------------------------------------------------- dequantization

@pytest.mark.parametrize("name", list(TYPES))
def test_dequantize_bit_exact(name):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    tid = TYPES[name][0]
    for n in sizes(name):
        raw = make_rows(name, n, rng)
        for r in range(raw.shape[0]):
            row = np.ascontiguousarray(raw[r])
            ref = dequant_ref(name, row)
            for isa in each_level(ISAS):
                out = np.full(n, np.nan, np.float32)
                assert lib.ei_kernel_dequantize(tid, isa, ffi.from_buffer(row), fptr(out), n) == 0, _err()
                assert np.array_equal(out.view(np.uint32), ref.view(np.uint32)), \
                    f"{name} n={n} isa={isa}: {np.nonzero(out != ref)[0][:8]}"


# --------------------------------------------------------------------------- activations

def test_quantize_act_exact(internal):
    rng = np.random.default_rng(11)
    xs = [x for n in (32, 96, 2304) for x in activations(n, rng)]
    ties = (np.arange(32, dtype=np.float32) - 15.5) * np.float32(127 / 15.5)  # d = 1: x*id hits .5 ties
    ties[-1] = 127.0
    xs.append(np.concatenate([ties, np.arange(-16, 16, dtype=np.float32) + np.float32(0.5)]))
    for x in xs:
        d0, s0, q0 = quantize_act(internal, SCALAR, x)
        dr, sr, qr = q8a_ref(x)
        assert np.array_equal(q0, qr) and np.array_equal(d0, dr) and np.array_equal(s0, sr)
        assert not np.isnan(d0).any() and not np.isnan(s0).any()
        for isa in each_level(SIMD_ISAS):
            d, s, q = quantize_act(internal, isa, x)
            assert np.array_equal(q, q0) and np.array_equal(d.view(np.uint32), d0.view(np.uint32))
            assert np.array_equal(s.view(np.uint32), s0.view(np.uint32))
            halves = quantize_act_row(internal, isa, x)[3]
            want = -32 * qr.astype(np.int32).reshape(-1, 2, 16).sum(axis=2)
            assert np.array_equal(halves, want), isa


# --------------------------------------------------------------------------- dot products

def nmse(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    den = float(np.sum(b * b))
    return float(np.sum((a - b) ** 2)) / den if den > 0 else float(np.sum((a - b) ** 2))


@pytest.mark.parametrize("name", list(TYPES))
def test_dot(name):
    rng = np.random.default_rng(1 + zlib.crc32(name.encode()))
    scalar, raw_ref = [], []
    simd = {isa: [] for isa in SIMD_ISAS}
    for n in sizes(name):
        raw = make_rows(name, n, rng)
        for x in activations(n, rng):
            xa = x.astype(np.float64) if name in FLOAT_TYPES else act_dequant(x)
            for r in range(raw.shape[0]):
                row = np.ascontiguousarray(raw[r])
                w = dequant_ref(name, row).astype(np.float64)
                exact = float(w @ xa)  # the exact math of the quantized numbers
                mag = float(np.abs(w) @ np.abs(xa))
                v0 = kdot(name, SCALAR, row, x)
                assert np.isfinite(v0)
                tol = (2e-6 if name not in FLOAT_TYPES else 1e-6 * np.sqrt(n)) * mag + 1e-37
                assert abs(v0 - exact) <= tol, f"{name} n={n} row={r}: {v0} vs {exact} (mag {mag})"
                if not np.any(x):
                    assert v0 == 0.0
                scalar.append(v0)
                raw_ref.append(float(w @ x.astype(np.float64)))
                for isa in each_level(SIMD_ISAS):
                    v = kdot(name, isa, row, x)
                    assert np.isfinite(v)
                    assert abs(v - v0) <= 4 * tol, f"{name} n={n} row={r} isa={isa}: {v} vs {v0}"
                    simd[isa].append(v)
    for isa in each_level(SIMD_ISAS):
        e = nmse(simd[isa], scalar)
        assert e <= 1e-6, f"{name} isa={isa}: NMSE {e:.3g}"
    # 8-bit activations cost a little accuracy against the raw x; document the bound.
    e_raw = nmse(scalar, raw_ref)
    assert e_raw <= (1e-10 if name in FLOAT_TYPES else 2e-3), f"{name}: NMSE vs raw activations {e_raw:.3g}"


# --------------------------------------------------------------------------- matmul

MM_TYPES = ["F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"]


@pytest.mark.parametrize("name", MM_TYPES)
def test_matmul_rows_batch_invariant(internal, name):
    """ei_matmul_rows over [r0, r1) x n_tok equals, bit for bit, the single dot."""
    iffi, ilib = internal
    rng = np.random.default_rng(21)
    tid = TYPES[name][0]
    n = 512
    n_rows, n_tok = 11, 5
    raw = make_rows(name, n, rng, scales=[1.0] * n_rows)
    x = rng.standard_normal((n_tok, n)).astype(np.float32)
    for isa in each_level(ISAS):
        if name in FLOAT_TYPES:
            act, stride = x, n * 4
        else:
            acts = [quantize_act(internal, isa, x[t]) for t in range(n_tok)]
            act = np.zeros((n_tok, n // 32), Q8A)
            for t, (d, s, q) in enumerate(acts):
                act[t]["d"], act[t]["s"], act[t]["q"] = d, s, q
            stride = (n // 32) * Q8A.itemsize
        ldy = n_rows + 3
        y = np.full((n_tok, ldy), -7.0, np.float32)
        r0, r1 = 2, 9
        ilib.ei_matmul_rows(ilib.ei_kernels_get(isa), tid, iffi.from_buffer(raw), n, r0, r1, iffi.from_buffer(act), stride, n_tok,
                            iffi.cast("float *", iffi.from_buffer(y)), ldy)
        assert (y[:, :r0] == -7).all() and (y[:, r1:] == -7).all()  # outside the range untouched
        for t in range(n_tok):
            for r in range(r0, r1):
                assert y[t, r] == np.float32(kdot(name, isa, np.ascontiguousarray(raw[r]), x[t])), (isa, t, r)


MATMUL_SMOKE = """
import numpy as np
from edgeinfer._native import ffi, lib
w = np.zeros(8 * 64 * 4, np.uint8); x = np.ones((2, 64), np.float32); y = np.zeros((2, 8), np.float32)
for thr in (1, 2, 3):
    for _ in range(20):
        lib.ei_kernel_matmul(lib.EI_TYPE_F32, -1, ffi.from_buffer(w), 8, 64,
                             ffi.cast("float *", ffi.from_buffer(x)), 2, ffi.cast("float *", ffi.from_buffer(y)), thr)
"""


@pytest.fixture(scope="module")
def matmul_terminates():
    """A threaded matmul that deadlocks must fail the test, not hang the suite."""
    try:
        subprocess.run([sys.executable, "-c", MATMUL_SMOKE], timeout=30, check=True, capture_output=True)
    except subprocess.TimeoutExpired:
        pytest.fail("ei_kernel_matmul did not return within 30 s (thread pool deadlock?)")


@pytest.mark.parametrize("name", ["Q4_1", "Q8_0", "Q6_K", "F16", "Q2_K", "IQ4_XS"])
def test_kernel_matmul(matmul_terminates, name):
    rng = np.random.default_rng(3)
    n, n_rows = 512, 37
    raw = make_rows(name, n, rng, scales=[1.0] * n_rows)
    tid = TYPES[name][0]
    for isa in each_level(ISAS):
        for n_tok in (1, 4, 7):
            x = rng.standard_normal((n_tok, n)).astype(np.float32)
            for thr in (1, 2, 3):
                y = np.zeros((n_tok, n_rows), np.float32)
                st = lib.ei_kernel_matmul(tid, isa, ffi.from_buffer(raw), n_rows, n, fptr(x), n_tok, fptr(y), thr)
                assert st == 0, _err()
                ref = np.array([[kdot(name, isa, np.ascontiguousarray(raw[r]), x[t]) for r in range(n_rows)]
                                for t in range(n_tok)], np.float32)
                assert np.array_equal(y, ref), (name, isa, n_tok, thr)


def test_k_quants_take_the_packed_path(internal):
    """Every SIMD level packs Q4_K, Q5_K and Q6_K matrices of 8k rows, the x86 ones Q2_K, Q3_K
    and IQ4_XS too (so the kernels that test_kernel_matmul_packed_rows checks are the ones the
    runtime uses); the scalar reference packs nothing, and shapes the layout cannot hold stay
    unpacked."""
    _, ilib = internal
    for name in sorted(K_TYPES | {"Q2_K", "Q3_K", "IQ4_XS"}):
        tid = TYPES[name][0]
        for isa in each_level(ISAS):
            k = ilib.ei_kernels_get(isa)
            got = ilib.ei_packed_bytes(k, tid, 40, 768)
            packs = isa != SCALAR and (name in K_TYPES or isa in (AVX2, AVX512))
            assert (got > 0) == packs, (name, isa, got)
            assert ilib.ei_packed_bytes(k, tid, 44, 768) == 0, (name, isa)   # rows not a multiple of 8
            assert ilib.ei_packed_bytes(k, tid, 40, 800) == 0, (name, isa)   # not whole super-blocks


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL",
                                  "IQ4_XS", "Q3_K", "Q2_K"])
def test_kernel_matmul_packed_rows(name):
    """Row counts that are multiples of 8 go through the row-interleaved kernels:
    close to the per-row dot (a different float order) at 1-4 threads, and a
    token's result is identical whatever else is in the batch (21 tokens: the
    wide (8 or 16), 4- and 1-token kernels all run; at one thread AVX-512 runs the row
    pairs on its 16-row kernels and a last, unpaired group on the 8-row ones)."""
    rng = np.random.default_rng(5)
    n, n_rows = (768, 40) if block(name)[0] == 256 else (576, 56)   # K: 3 super-blocks; 5 or 7 row groups
    raw = make_rows(name, n, rng, scales=[1.0] * n_rows)
    tid = TYPES[name][0]
    n_tok = 21
    x = rng.standard_normal((n_tok, n)).astype(np.float32)
    for isa in each_level(ISAS):
        ref = np.array([[kdot(name, isa, np.ascontiguousarray(raw[r]), x[t]) for r in range(n_rows)]
                        for t in range(n_tok)], np.float64)
        for thr in (1, 2, 3, 4):
            y = np.zeros((n_tok, n_rows), np.float32)
            st = lib.ei_kernel_matmul(tid, isa, ffi.from_buffer(raw), n_rows, n, fptr(x), n_tok, fptr(y), thr)
            assert st == 0, _err()
            assert np.sum((y - ref) ** 2) / np.sum(ref ** 2) <= 1e-10, (name, isa, thr)
        for t in range(n_tok):
            y1 = np.zeros((1, n_rows), np.float32)
            xt = np.ascontiguousarray(x[t:t + 1])
            assert lib.ei_kernel_matmul(tid, isa, ffi.from_buffer(raw), n_rows, n, fptr(xt), 1, fptr(y1), 1) == 0
            assert np.array_equal(y1[0], y[t]), (name, isa, t)


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL",
                                  "IQ4_XS", "Q3_K", "Q2_K"])
def test_packed_kernels_give_the_same_bits_with_avx2_and_avx512(name):
    """A packed type's integer sums are exact and its float steps the same on both x86 levels, so a
    model's logits do not depend on whether the host has AVX-512 (one token and 21: every kernel
    width; with VNNI, Q8_0's and IQ4_NL's values + 128 carry their offset in the integer chain)."""
    if not {AVX2, AVX512} <= set(ISAS):
        pytest.skip("needs a CPU with both AVX2 and AVX-512 VNNI")
    rng = np.random.default_rng(9)
    n, n_rows = (768, 40) if block(name)[0] == 256 else (576, 56)
    raw = make_rows(name, n, rng, scales=[1.0] * n_rows)
    tid = TYPES[name][0]
    for n_tok in (1, 21):
        x = rng.standard_normal((n_tok, n)).astype(np.float32)
        ys = []
        for isa in each_level([AVX2, AVX512]):
            y = np.zeros((n_tok, n_rows), np.float32)
            assert lib.ei_kernel_matmul(tid, isa, ffi.from_buffer(raw), n_rows, n, fptr(x), n_tok, fptr(y), 2) == 0, _err()
            ys.append(y)
        assert np.array_equal(ys[0], ys[1]), (name, n_tok, float(np.abs(ys[0] - ys[1]).max()))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL",
                                  "IQ4_XS", "Q3_K", "Q2_K"])
def test_unpack_row_gives_back_the_gguf_row(internal, name):
    """ei_unpack_row reads each row's GGUF bytes back out of its packed copy (a tied embedding's
    lookup does): every byte of random rows, through each SIMD level's layout (AVX-512's row pairs
    and a last, unpaired group of 8 rows: 7 groups)."""
    iffi, ilib = internal
    rng = np.random.default_rng(17)
    tid = TYPES[name][0]
    n_rows, n = 56, 768
    raw = rng.integers(0, 256, size=(n_rows, ilib.ei_row_bytes(tid, n)), dtype=np.uint8)
    levels = [isa for isa in each_level(SIMD_ISAS) if ilib.ei_packed_bytes(ilib.ei_kernels_get(isa), tid, n_rows, n)]
    if not levels:
        pytest.skip(f"no kernel level of this CPU packs {name}")
    for isa in levels:
        k = ilib.ei_kernels_get(isa)
        size = ilib.ei_packed_bytes(k, tid, n_rows, n)
        packed = np.zeros(size, np.uint8)
        ilib.ei_pack(k, tid, iffi.from_buffer(raw), n_rows, n, iffi.from_buffer(packed))
        row = np.zeros(raw.shape[1], np.uint8)
        for r in range(n_rows):
            ilib.ei_unpack_row(k, tid, iffi.from_buffer(packed), n_rows, n, r, iffi.from_buffer(row))
            assert np.array_equal(row, raw[r]), (name, isa, r)


# byte offsets of the fp16 fields of each packed type's block (all other bytes are quants or scales)
F16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "IQ4_NL": (0,),
              "IQ4_XS": (0,), "Q3_K": (108,), "Q2_K": (80, 82),
              **K_SCALE_FIELDS}


@pytest.mark.parametrize("name", list(F16_FIELDS))
def test_kernel_matmul_packed_at_the_largest_quants(name):
    """Every quant and scale byte 0xff (quants 15, 31 or 63; Q8_0's 0x80, a quant of -128) times
    activations whose 32-blocks are each one value, all positive or all negative in a token
    (quantized to all +127 or -127): the packed kernels' integer sums at their largest (AVX2 adds
    maddubs products as int16 before widening, and moves Q8_0's sign onto the activation,
    packed_dot.h) still match the scalar per-row dot."""
    rng = np.random.default_rng(11)
    n, n_rows = (768, 40) if block(name)[0] == 256 else (576, 56)
    raw = make_rows(name, n, rng, scales=[1.0] * n_rows)
    be, bb = block(name)
    blocks = raw.reshape(n_rows, n // be, bb)
    keep = np.zeros(bb, bool)
    for off in F16_FIELDS[name]:
        keep[off:off + 2] = True
    blocks[:, :, ~keep] = 0x80 if name == "Q8_0" else 0xFF
    n_tok = 21
    sign = np.where(np.arange(n_tok) % 2, -1.0, 1.0)[:, None]
    x = np.ascontiguousarray(sign * np.repeat(rng.uniform(0.5, 2.0, size=(n_tok, n // 32)), 32, axis=1), np.float32)
    ref = np.array([[kdot(name, SCALAR, np.ascontiguousarray(raw[r]), x[t]) for r in range(n_rows)]
                    for t in range(n_tok)], np.float64)
    for isa in each_level(SIMD_ISAS):
        y = np.zeros((n_tok, n_rows), np.float32)
        st = lib.ei_kernel_matmul(TYPES[name][0], isa, ffi.from_buffer(raw), n_rows, n, fptr(x), n_tok, fptr(y), 1)
        assert st == 0, _err()
        assert np.sum((y - ref) ** 2) / np.sum(ref ** 2) <= 1e-10, (name, isa)


def test_native_kernel_test_on_this_cpu(tmp_path):
    """native/tests/kernel_test.c built for this machine (scripts/test_aarch64.sh runs it for
    NEON under qemu): every SIMD kernel the CPU runs against its scalar reference, the packed
    K-quant kernels fed activation rows as the runtime makes them, and a tiny forward against
    native/tests/forward_ref.txt."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build = ["cmake", "--preset", "cuda-sim", "-S", root, "-B", str(tmp_path), f"-DPython_EXECUTABLE={sys.executable}"]
    for cmd in (build, ["cmake", "--build", str(tmp_path), "-j", str(os.cpu_count() or 1), "--target", "kernel_test"]):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=root)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = subprocess.run([str(tmp_path / "kernel_test"), "--ref", os.path.join(root, "native/tests/forward_ref.txt")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.rstrip().endswith(" 0 failed"), r.stdout[-4000:] + r.stderr[-2000:]
