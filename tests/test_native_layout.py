"""The native model layout is one list (native/include/edgeinfer_layout.def): a role added to
it alone reaches the CPU runtime (native/src/model.c) and the CUDA runtime
(native/cuda/forward.cu, built as host C++ against eisim, tests/eisim): their weight structs,
their role -> weight mapping and the checks of a loaded model. Also: the Python side reads the
same list (the cffi enum, the architecture table's roles and shapes)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgeinfer.arch.table import ARCHS, LONGROPE_ROLES
from edgeinfer.backends.cdefs import LAYOUT_DEF, layout_roles

ROOT = Path(__file__).resolve().parent.parent
INCLUDE = ROOT / "native" / "include"
FAKE = "EI_ROLE(FAKE_NORM, 60, fake_norm, VECTOR, LAYER, n_embd, 1, ALWAYS)\n"

# A 1-layer model; every role the layout requires is set (f32, its expected shape) except the
# one under test, then the fake role at layer 0: the first check must name it missing, the
# mapping must store it in layers[0].fake_norm, and then the model must pass the checks.
CONFIG = """
    ei_model_config c = {0};
    c.n_layer = 1; c.n_embd = 8; c.n_head = 2; c.n_head_kv = 1; c.head_dim = 4; c.n_ff = 16;
    c.n_vocab = 10; c.rope_dim = 4; c.rope_theta = 10000.0f; c.rope_freq_scale = 1.0f; c.rms_eps = 1e-5f;
    static float buf[1024];
"""

CPU_PROBE = r"""
#include <stdarg.h>
#include <stdio.h>
#include "model.h"
/* model.c's two outside needs, stubbed so the probe links model.c alone */
static char err[512];
ei_status ei_fail(ei_status st, const char *fmt, ...) {
    va_list ap; va_start(ap, fmt); vsnprintf(err, sizeof err, fmt, ap); va_end(ap); return st;
}
int64_t ei_row_bytes(int type, int64_t n) { (void)type; return n * 4; }
int main(void) {
""" + CONFIG + r"""
    ei_model *m;
    if (ei_model_create(&c, &m) != EI_OK) { printf("create: %s\n", err); return 1; }
    for (int role = 0; role < 128; role++) {
        int64_t ne0, ne1;
        if (role == EI_T_FAKE_NORM || !ei_role_find(role) || ei_role_expect(&c, role, ei_role_find(role)->per_layer ? 0 : -1, &ne0, &ne1) != EI_REQUIRED)
            continue;
        const ei_role_desc *d = ei_role_find(role);
        if (ei_model_set_tensor(m, d->per_layer ? 0 : -1, role, buf, EI_TYPE_F32, ne0, ne1) != EI_OK) {
            printf("set %d: %s\n", role, err); return 1;
        }
    }
    printf("first: %d %s\n", (int)ei_model_finalize(m), err);
    printf("set: %d\n", (int)ei_model_set_tensor(m, 0, EI_T_FAKE_NORM, buf, EI_TYPE_F32, 8, 1));
    printf("slot: %d\n", m->layers[0].fake_norm.data == buf);
    printf("then: %d\n", (int)ei_model_finalize(m));
    return 0;
}
"""

CUDA_PROBE = r"""
#include <stdio.h>
#include <vector>
int main(void) {
""" + CONFIG + r"""
    std::vector<ei_cuda_tensor> ts;
    for (int role = 0; role < 128; role++) {
        int64_t ne0, ne1;
        if (role == EI_T_FAKE_NORM || !ei_role_find(role) || ei_role_expect(&c, role, ei_role_find(role)->per_layer ? 0 : -1, &ne0, &ne1) != EI_REQUIRED)
            continue;
        ts.push_back({ei_role_find(role)->per_layer ? 0 : -1, role, EI_TYPE_F32, ne0, ne1, buf});
    }
    ei_cuda_params p = {};
    p.n_slots = 1; p.n_ctx = 16; p.max_batch = 1;
    ei_cuda_runtime *rt = NULL;
    printf("first: %d %s\n", (int)ei_cuda_runtime_create(&c, ts.data(), (int32_t)ts.size(), &p, NULL, &rt),
           ei_cuda_last_error());
    ts.push_back({0, EI_T_FAKE_NORM, EI_TYPE_F32, 8, 1, buf});
    printf("set: %d\n", (int)ei_cuda_runtime_create(&c, ts.data(), (int32_t)ts.size(), &p, NULL, &rt));
    printf("slot: %d\n", rt && rt->layers[0].fake_norm.data != NULL);
    printf("then: 0\n");
    return 0;
}
"""


def _run(cmd: list[str], cwd: Path) -> str:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, " ".join(cmd) + "\n" + r.stdout + r.stderr
    return r.stdout


def _expect_fake_role_handled(out: str) -> None:
    lines = dict(line.split(": ", 1) for line in out.strip().splitlines())
    assert lines["first"].startswith("1 ") and "missing tensor fake_norm (layer 0)" in lines["first"], out
    assert lines == {**lines, "set": "0", "slot": "1", "then": "0"}, out


@pytest.fixture(scope="module")
def fake_include(tmp_path_factory) -> Path:
    """native/include with one role added to the list and nowhere else."""
    inc = tmp_path_factory.mktemp("layout") / "include"
    shutil.copytree(INCLUDE, inc)
    with open(inc / LAYOUT_DEF, "a", encoding="utf-8") as f:
        f.write(FAKE)
    return inc


@pytest.mark.skipif(not shutil.which("cc"), reason="needs a C compiler")
def test_a_listed_role_reaches_the_cpu_model(fake_include):
    work = fake_include.parent
    (work / "probe.c").write_text(CPU_PROBE)
    _run(["cc", "-std=gnu11", "-O0", "-Wall", "-Werror", "-Wno-unused-function", f"-I{fake_include}",
          f"-I{ROOT / 'native' / 'src'}", "probe.c", str(ROOT / "native" / "src" / "model.c"), "-o", "cpu_probe"],
         work)
    _expect_fake_role_handled(_run([str(work / "cpu_probe")], work))


@pytest.mark.skipif(not shutil.which("g++"), reason="needs g++ (eisim)")
def test_a_listed_role_reaches_the_cuda_runtime(fake_include):
    work = fake_include.parent
    sim = ROOT / "tests" / "eisim"
    for name in ("kernels", "forward"):   # the runtime as scripts/build_cuda_sim.sh builds it
        _run([sys.executable, str(sim / "translate.py"), str(ROOT / "native" / "cuda" / f"{name}.cu"),
              str(work / f"{name}.cpp")], work)
    (work / "cuda_probe.cpp").write_text('#include "forward.cpp"\n' + CUDA_PROBE)
    flags = ["-std=c++17", "-O0", "-Wall", "-Wno-unknown-pragmas", "-Wno-unused-function", '-DEI_VERSION="probe"',
             f"-I{sim / 'include'}", f"-I{fake_include}", f"-I{ROOT / 'native' / 'cuda'}"]
    flags += ["-mfma"] if os.uname().machine == "x86_64" else []
    _run(["g++", *flags, "cuda_probe.cpp", "kernels.cpp", str(sim / "eisim.cpp"), "-o", "cuda_probe", "-lpthread"],
         work)
    _expect_fake_role_handled(_run([str(work / "cuda_probe")], work))


def test_cffi_enum_is_the_list():
    from edgeinfer._native import lib

    roles = layout_roles(INCLUDE / LAYOUT_DEF)
    assert roles and {r.name: getattr(lib, "EI_T_" + r.name.upper()) for r in roles} == {r.name: r.id for r in roles}


def test_every_table_role_is_in_the_list_with_its_shape():
    """The architecture table (Python) and the layout (C) agree on each role's kind, scope,
    presence flag and shape, for every family."""
    roles = {r.name: r for r in layout_roles(INCLUDE / LAYOUT_DEF)}
    dims = dict(n_embd=64, q_dim=96, kv_dim=32, n_ff=160, n_vocab=300, head_dim=16, rope_dim=12, rope_half=6,
                conv_kernel=3, n_embd_x3=192, n_ple=8, n_ple_all=16,
                ssm_head_dim=16, ssm_v_heads=4, ssm_k_heads=2, ssm_inner=64, ssm_conv_dim=128, ssm_conv_kernel=3)

    class H:   # the table's Dims, with every flag on
        n_layer = 2
        has_qkv_bias = has_output = has_rope_freqs = has_qk_norm = has_post_norms = has_longrope = True
        n_embd_per_layer = 8
    for k, v in dims.items():
        setattr(H, k, v)
    for arch in ARCHS.values():
        dims["q_rows"] = 2 * dims["q_dim"] if arch.attn_gate else dims["q_dim"]   # gated attention's gates
        for t in arch.tensors:
            if t.split or t.role in LONGROPE_ROLES or t.kinds == ("mtp",):   # MTP blocks: not run natively
                continue
            r = roles[t.role]
            assert (r.per_layer, r.shape(dims)) == (t.per_layer, t.shape(H)), (arch.name, t.role)
            if r.when is not None:   # a role only KV-storing layers hold may say so instead (Gemma 4)
                assert t.when == r.when or (r.stores_kv and t.when == "stores_kv"), (arch.name, t.role)
